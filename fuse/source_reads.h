// SourceReads: uncached ranges of a local under-storage file, read by granary-fuse itself.
//
// Design note. A cold random read (an LMDB page, a numpy.memmap window) into a block that is not
// cached is answered by the worker range first (worker/block_source.h): one ranged read of the
// under-storage, the bytes sent back through the local socket. With a local under-storage (a
// directory, an NFS volume mounted in the pod) the worker's hop costs about 4x the FUSE round trip
// itself on a 2-core VM (docs/benchmarks.md, "Session 20"). So when the worker answers a range
// from the under-storage and the file is one of this machine, it attaches that file's descriptor,
// checked to have the version granary-fuse asked for, with what its stat said (LocalResponse
// source_file). From the worker's second such answer for a block on, granary-fuse reads the next
// kDirectReads ranges of that block itself, for at most kDirectFor, and asks the worker again for
// the one after:
//   - the worker sees a block's first two touches as before, so its policy fills it on its second
//     touch (SecondTouch) as it did without source reads, and a filled block is read from the cache
//     within kDirectReads reads or kDirectFor (a later epoch over the same blocks finds them cached,
//     and the read leases of fuse/read_leases.h, which need the whole file cached, take over);
//   - a block never answered from the under-storage (cached, or read sequentially: fetched whole
//     and kept) is never read from the source here.
// Correct bytes: after each read the descriptor's stat is taken again (statx with
// AT_STATX_FORCE_SYNC: on NFS the server is asked, not the attribute cache); another size,
// modification time or inode, or no link left (renamed over, deleted), means the file changed under
// the read. The file is then forgotten and the read goes to the worker, which answers as it would
// have without source reads (its cached block of the listed version, or ESTALE / ENOENT).
//
// Bounded: at most kMaxFiles files (least recently used dropped, their descriptors closed once no
// read holds them) and kMaxBlocks block counts per file. A file not read for kIdle is let go (Trim,
// once a second): a held descriptor keeps a deleted file's space, an NFS client's .nfsXXXX name and
// the under-storage's file system busy. A worker that had no file to give is asked again after
// kAskAgain (its error may have passed). Thread-safe.
#pragma once

#include <chrono>
#include <functional>
#include <list>
#include <memory>
#include <string>
#include <unordered_map>

#include "common/status.h"
#include "common/thread_annotations.h"

namespace granary::fuse {

// A file of the under-storage open here, and its stat when the worker found it had the version.
class SourceFile {
 public:
  SourceFile(int fd, uint64_t size, int64_t mtime_ns, uint64_t ino) : fd_(fd), size_(size), mtime_ns_(mtime_ns), ino_(ino) {}
  SourceFile(const SourceFile&) = delete;
  SourceFile& operator=(const SourceFile&) = delete;
  ~SourceFile();

  // Reads exactly `length` bytes at `offset` into `out`. FAILED_PRECONDITION (VersionChangedError)
  // when the file is shorter or its stat changed; the errno's Status for an I/O error.
  Status Read(uint64_t offset, uint64_t length, char* out) const;

 private:
  const int fd_;
  const uint64_t size_;
  const int64_t mtime_ns_;
  const uint64_t ino_;
};

class SourceReads {
 public:
  using Clock = std::chrono::steady_clock;
  static constexpr uint32_t kDirectReads = 8;   // reads of a block served here between worker asks
  static constexpr std::chrono::milliseconds kDirectFor{1000};  // ... within this long
  static constexpr size_t kMaxFiles = 256;
  static constexpr size_t kMaxBlocks = 4096;    // block counts kept per file
  static constexpr std::chrono::seconds kIdle{10};      // a file unread this long is let go (Trim)
  static constexpr std::chrono::seconds kAskAgain{30};  // a worker that sent no file is asked again

  // `now`: the clock (tests pass their own).
  explicit SourceReads(std::function<Clock::time_point()> now = Clock::now) : now_(std::move(now)) {}

  // `key` names one version of one file (mount, path and version). The descriptor to read block
  // `index` of it with here, counting one read; nullptr: ask the worker.
  std::shared_ptr<const SourceFile> Direct(const std::string& key, uint64_t index);
  // True when nothing is known of `key`: a read sent to the worker asks for its file. False once
  // the file is held, or once the worker was asked and sent none (an object store, NFS through
  // libnfs, or an error opening it): it is asked again only after kAskAgain.
  bool Wants(const std::string& key);
  // The worker answered a read of block `index` from the under-storage (range first), the request
  // having asked for the file (`asked`) or not; `file` when it came. From the block's second such
  // answer on, each grants the block's next kDirectReads reads here (within kDirectFor), with the
  // file held.
  void FromSource(const std::string& key, uint64_t index, std::shared_ptr<const SourceFile> file, bool asked);
  // The worker answered a read of block `index` otherwise (cached, or fetched and kept).
  void FromWorker(const std::string& key, uint64_t index);
  // The file changed, or a read of it failed: nothing of `key` is read here any more.
  void Forget(const std::string& key);

  // Lets go of the files not read for kIdle (granary-fuse calls it once a second).
  void Trim();

  size_t files() const;

 private:
  struct Entry {
    std::shared_ptr<const SourceFile> file;  // null: asked, and none came
    Clock::time_point used{};                // the last read or answer of it
    Clock::time_point asked{};               // when it was first asked for and none came
    struct Left {
      uint32_t answers = 0;     // answers from the under-storage the worker gave for the block
      uint32_t reads = 0;       // direct reads left
      Clock::time_point end{};  // and until when
    };
    std::unordered_map<uint64_t, Left> left;  // by block
    std::list<std::string>::iterator lru;
  };
  Entry* Touch(const std::string& key) REQUIRES(mu_);

  const std::function<Clock::time_point()> now_;
  mutable Mutex mu_;
  std::unordered_map<std::string, Entry> files_ GUARDED_BY(mu_);
  std::list<std::string> lru_ GUARDED_BY(mu_);  // most recent first
};

}  // namespace granary::fuse
