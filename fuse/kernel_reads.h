// KernelReads: kernel mode's files (fuse.open=kernel, and reads whose handle this process does not
// know). In kernel mode the kernel opens files itself and sends READs with no file handle, so
// nothing pins the version a reader reads; KernelReads keeps it, apart from the kernel, so that
// tests/fuse/kernel_reads_test.cc drives it with a fake master and clock.
//
// Design
// ------
// Per inode, the newest file info known and when the master last confirmed it: a read asks the
// master again at most once per `confirm_every` (fuse.attr_timeout), and a new version tells the
// caller to drop the kernel's pages of the old one. Per (inode, process), the file that process
// reads: a read at offset 0 — a reader starting on the file — moves the process to the newest
// version; a read further in stays on the version the process has been reading, whose blocks are
// served while cached and fail with ESTALE once they must be fetched again, as an open file does in
// daemon mode. So a process reading a file through never gets bytes of two versions.
//
// Both maps hold at most `capacity` entries (fuse.file_cache_entries) and forget the oldest half
// when full (common/bounded_map.h): forgetting costs a call to the master, or moves a process that
// was mid-file to the newest version's blocks (ESTALE if it changed, never mixed bytes: each block
// read checks its version). Capacity 0 remembers nothing: every read asks the master.
//
// Thread-safety: thread-safe. The master is asked without the lock held.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>

#include "common/bounded_map.h"
#include "common/status.h"
#include "common/thread_annotations.h"
#include "fuse/open_file.h"
#include "proto/granary.pb.h"

namespace granary::fuse {

class KernelReads {
 public:
  using Clock = std::function<std::chrono::steady_clock::time_point()>;
  // The newest info of kernel inode `kino`, from the master; *age (0 when the master was asked just
  // now) is how old the answer is: a listing's information, younger than confirm_every, is as good
  // as the master's confirmation when it was listed (fuse/open_notes.h), and counts from then.
  using AskMaster = std::function<StatusOr<rpc::FileInfo>(uint64_t kino, std::chrono::milliseconds* age)>;

  KernelReads(size_t capacity, std::chrono::milliseconds confirm_every, Clock now = nullptr);

  struct Read {
    std::shared_ptr<OpenFile> file;  // what this read reads
    bool new_version = false;        // the master showed a new version: drop the kernel's pages
  };
  // The file a READ of `kino` at `off` by process `pid` reads.
  StatusOr<Read> FileFor(uint64_t kino, uint64_t off, pid_t pid, const AskMaster& ask) EXCLUDES(mu_);
  // The under-storage changed under a read of `kino`: the next read asks the master.
  void Unconfirm(uint64_t kino) EXCLUDES(mu_);
  void SetCapacity(size_t capacity) EXCLUDES(mu_);

 private:
  struct Known {
    std::shared_ptr<OpenFile> file;
    std::chrono::steady_clock::time_point confirmed;  // when the master last confirmed it
  };
  struct PidKey {
    uint64_t ino;
    pid_t pid;
    bool operator==(const PidKey& o) const { return ino == o.ino && pid == o.pid; }
  };
  struct PidKeyHash {
    size_t operator()(const PidKey& k) const {
      return std::hash<uint64_t>()(k.ino * 0x9e3779b97f4a7c15ull ^ static_cast<uint64_t>(k.pid));
    }
  };

  const std::chrono::milliseconds confirm_every_;
  const Clock now_;
  Mutex mu_;
  BoundedMap<uint64_t, Known> newest_ GUARDED_BY(mu_);                      // kernel ino -> newest known
  BoundedMap<PidKey, std::shared_ptr<OpenFile>, PidKeyHash> readers_ GUARDED_BY(mu_);  // what each process reads
};

}  // namespace granary::fuse
