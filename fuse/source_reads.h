// SourceReads: uncached ranges of a local under-storage file, read by granary-fuse itself.
//
// Design note. A cold random read (an LMDB page, a numpy.memmap window) into a block that is not
// cached is answered by the worker range first (worker/block_source.h): one ranged read of the
// under-storage, the bytes sent back through the local socket. With a local under-storage (a
// directory, an NFS volume mounted in the pod) the worker's hop costs about 4x the FUSE round trip
// itself on a 2-core VM (docs/benchmarks.md, "Session 20"). So when the worker answers a range
// from the under-storage and the file is one of this machine, it attaches that file's descriptor,
// checked to have the version granary-fuse asked for, with what its stat said and which blocks of
// the file it has cached (LocalResponse source_file, source_cached). From then on, a read of that
// file which the worker would answer range first (IsRangeFirst: inside a block of at least 1 MiB,
// not at its start unless the read is a random one, at most 1 MiB and half the block), into a
// block not known to be cached, is
// read here from the file; a block's direct reads are granted kDirectReads at a time, for at most
// kDirectFor, and the read after asks the worker again:
//   - the worker still sees the touches: a block's first direct reads are reported to it
//     (Grant::touch, sent in the background as a touched PrefetchRequest), so its policy fills a
//     block touched twice as it would without source reads; and a block it has filled is learnt
//     within kDirectReads reads or kDirectFor, and read from the cache from then on (the read
//     leases of fuse/read_leases.h, which need the whole file cached, take over in a later epoch);
//   - a block known to be cached, or read at its start or by a read continuing a sequential stream
//     (a sequential reader: the worker fetches it whole and keeps it), is asked of the worker,
//     never read from the source here.
// Correct bytes: after each read the descriptor's stat is taken again (statx with
// AT_STATX_FORCE_SYNC: on NFS the server is asked, not the attribute cache); another size,
// modification time or inode, or no link left (renamed over, deleted), means the file changed under
// the read. The file is then forgotten and the read goes to the worker, which answers as it would
// have without source reads (its cached block of the listed version, or ESTALE / ENOENT).
//
// Bounded: at most kMaxFiles files (least recently used dropped, their descriptors closed once no
// read holds them) and kMaxBlocks blocks per file. A file not read for kIdle is let go (Trim,
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
#include <vector>

#include "common/status.h"
#include "common/thread_annotations.h"
#include "rpc/wire.h"

namespace granary::fuse {

// A file of the under-storage open here, its stat when the worker found it had the version, and
// which of its blocks the worker had cached then (bit i of byte i / 8; blocks past it: unknown).
class SourceFile {
 public:
  SourceFile(int fd, uint64_t size, int64_t mtime_ns, uint64_t ino, std::string cached = {})
      : fd_(fd), size_(size), mtime_ns_(mtime_ns), ino_(ino), cached_(std::move(cached)) {}
  SourceFile(const SourceFile&) = delete;
  SourceFile& operator=(const SourceFile&) = delete;
  ~SourceFile();

  // Reads exactly `length` bytes at `offset` into `out`. FAILED_PRECONDITION (VersionChangedError)
  // when the file is shorter or its stat changed; the errno's Status for an I/O error.
  Status Read(uint64_t offset, uint64_t length, char* out) const;
  const std::string& cached() const { return cached_; }

 private:
  const int fd_;
  const uint64_t size_;
  const int64_t mtime_ns_;
  const uint64_t ino_;
  const std::string cached_;
};

class SourceReads {
 public:
  using Clock = std::chrono::steady_clock;
  static constexpr uint32_t kDirectReads = 8;   // reads of a block served here between worker asks
  static constexpr std::chrono::milliseconds kDirectFor{1000};  // ... within this long
  static constexpr size_t kMaxFiles = 256;
  static constexpr size_t kMaxBlocks = 4096;    // blocks of a file read here (the rest: the worker)
  static constexpr std::chrono::seconds kIdle{10};      // a file unread this long is let go (Trim)
  static constexpr std::chrono::seconds kAskAgain{30};  // a worker that sent no file is asked again
  // Whether the worker would answer a read of `length` bytes at `offset` within a block of
  // `block_length` bytes (of a mount whose block size is `block_size`) range first: the worker's
  // own rule, rpc::IsRangeFirst (rpc/wire.h).
  static bool IsRangeFirst(uint64_t block_size, uint64_t block_length, uint64_t offset, uint64_t length,
                           bool random = false, bool continues = false) {
    return rpc::IsRangeFirst(block_size, block_length, offset, length, random, continues);
  }

  // `now`: the clock (tests pass their own).
  explicit SourceReads(std::function<Clock::time_point()> now = Clock::now) : now_(std::move(now)) {}

  // What a read may do here: `file` to read it with (nullptr: ask the worker), and whether to tell
  // the worker of the touch (Client::Touched).
  struct Grant {
    std::shared_ptr<const SourceFile> file;
    bool touch = false;
  };
  // `key` names one version of one file (mount, path and version). A read of block `index`,
  // `range_first` when IsRangeFirst holds for it: counted when granted.
  Grant Direct(const std::string& key, uint64_t index, bool range_first);
  // True when nothing is known of `key`: a read sent to the worker asks for its file. False once
  // the file is held, or once the worker was asked and sent none (an object store, NFS through
  // libnfs, or an error opening it): it is asked again only after kAskAgain.
  bool Wants(const std::string& key);
  // The worker answered a read of block `index` from the under-storage (range first), the request
  // having asked for the file (`asked`) or not; `file` when it came. Each such answer grants the
  // block's next kDirectReads reads here (within kDirectFor), once the file is held.
  void FromSource(const std::string& key, uint64_t index, std::shared_ptr<const SourceFile> file, bool asked);
  // The worker answered a read of block `index` otherwise (cached, or fetched and kept): the block
  // is asked of the worker from now on.
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
    std::vector<bool> cached;                // blocks the worker has (as far as known here)
    struct Left {
      uint32_t reads = 0;       // direct reads left
      uint32_t touches = 0;     // touches the worker saw since the grant (its answer, reports)
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
