// OpenNotes: fetch-ahead's evidence from opens that made no GetFile call.
//
// Design
// ------
// The master starts fetch-ahead from the files readers open (master/fetch_ahead.h), and it used to
// learn of each from the open's GetFile call: one gRPC round trip per cold file, about a third of
// granary-fuse's CPU and most of the master's in a cold epoch of small files (docs/benchmarks.md,
// session 34). A listing (ReadDirRequest.files) and a lookup (LookupRequest.file) now carry each
// file's open information, which the FileCache keeps as it keeps GetFile's answers, so the open
// that follows a listing asks the master nothing. What the master still needs is the evidence, and
// it needs it in bulk, not per file: the opens served from listed information are noted here and
// sent in one NoteOpens call per flush interval (or per kBatch files, whichever comes first). The
// interval is kFlushEvery until kStartNotes opens went out after a quiet spell (fetch-ahead starts
// from the first 16 opens: that is not delayed) and then doubles with each call while opens keep
// coming, up to kFlushMost. At a fixed 50 ms a cold 3 s epoch's opens went out in ~60 calls, each
// a gRPC round trip for granary-fuse and the master, though once started fetch-ahead needs them
// only to widen its allowance (8x the bytes opened) and its scope, which a few hundred ms do not
// hurry. A note that finds nothing sent for kFlushMost starts again at kFlushEvery.
//
//   Listed(ino)  the FileCache got ino's information from a listing or a lookup;
//   Forget(ino)  ... from a GetFile call (which the master counted itself);
//   Opened(ino)  an open (or kernel mode's first read) used the FileCache's information: sent once,
//                if it came from a listing.
//
// Only a file's first open after its listing is sent (later epochs find the data cached; the master
// counted GetFile's opens only once a file's cached information expired, and so does this). At most
// `capacity` listed files are remembered (the oldest half is dropped past that: their opens are not
// noted, which only makes fetch-ahead start later). Sending is best effort: a failed call (no
// leader, a standby that cannot count) is dropped, as fetch-ahead is an optimisation; the files it
// names are not sent again; and at most kMaxPending opens wait (more are dropped) while a call is
// slow.
//
// Thread-safe. One thread of its own sends; the destructor stops it (pending notes are dropped).
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <thread>
#include <vector>

#include "common/bounded_map.h"
#include "common/status.h"
#include "common/thread_annotations.h"

namespace granary::fuse {

class OpenNotes {
 public:
  using Send = std::function<Status(const std::vector<uint64_t>& inos)>;
  static constexpr size_t kBatch = 1024;  // files per NoteOpens call (the master takes up to 4096)
  static constexpr std::chrono::milliseconds kFlushEvery{50};
  static constexpr std::chrono::milliseconds kFlushMost{400};
  static constexpr uint64_t kStartNotes = 16;  // master/fetch_ahead.h's start_files
  // The interval of the next call, given the last one's (`now`), the notes sent since the last
  // quiet spell (that call's included), and how long after that call the next note came (`quiet`):
  // kFlushEvery after a quiet spell of kFlushMost or before kStartNotes were sent, else doubled up
  // to kFlushMost.
  static std::chrono::milliseconds NextInterval(std::chrono::milliseconds now, uint64_t sent_since_quiet,
                                                std::chrono::steady_clock::duration quiet);
  // Opens waiting to be sent, at most: past it (the master slow or away) new ones are dropped and
  // counted, so a master that does not answer never makes granary-fuse grow.
  static constexpr size_t kMaxPending = 4 * kBatch;

  OpenNotes(size_t capacity, Send send);
  ~OpenNotes();
  OpenNotes(const OpenNotes&) = delete;
  OpenNotes& operator=(const OpenNotes&) = delete;

  void Listed(uint64_t ino);
  void Forget(uint64_t ino);
  // True when ino's information came from a listing (and this is its first open since): noted.
  bool Opened(uint64_t ino);

  // Files sent so far, and calls that failed (for tests and the mount's metrics).
  uint64_t sent() const;
  uint64_t failed_calls() const;
  uint64_t dropped() const;  // opens not sent: kMaxPending were waiting

 private:
  void Loop();

  const Send send_;
  mutable Mutex mu_;
  std::condition_variable cv_;
  BoundedMap<uint64_t, bool> listed_ GUARDED_BY(mu_);
  std::vector<uint64_t> pending_ GUARDED_BY(mu_);
  bool stop_ GUARDED_BY(mu_) = false;
  uint64_t sent_ GUARDED_BY(mu_) = 0;
  uint64_t failed_ GUARDED_BY(mu_) = 0;
  uint64_t dropped_ GUARDED_BY(mu_) = 0;
  std::thread thread_;
};

}  // namespace granary::fuse
