// OpenHandles: the file handles (fi->fh) granary-fuse gives the kernel for the opens it serves
// itself — every open in daemon mode, and passthrough mode's opens, passed through or not — each an
// OpenFile (fuse/open_file.h). Kernel mode has none: its reads come by inode (fuse/kernel_reads.h).
//
// Rules (tests/fuse/open_handles_test.cc checks them, a model test among them):
//   - Numbers carry an epoch: the first is ((seed & 0x3fffff) + 1) << 40, then one more per open.
//     The kernel keeps sending a crashed predecessor's handles, and with another epoch they never
//     name one of ours (2^22 epochs of 2^40 opens). Numbers stay below 2^62: bit 63 marks a write
//     handle (fuse/writes.h), whose number is drawn from this same numbering (Number), so a read
//     and a write handle, or a predecessor's and ours, never share one.
//   - A handle is found (Find) or ended (Take) only together with the inode it was opened on; a
//     number with another inode is not ours: null.
//   - A number the kernel sends that this process never gave (a dead predecessor's) is rebuilt by
//     the read path and kept (Adopt) until its RELEASE takes it; the table then holds at most
//     kMaxAdopted entries, so a flood of foreign numbers cannot grow it without bound.
//   - A hand-over carries every handle and the next number (ForEach); the successor puts them back
//     (Restore) and goes on with the predecessor's numbering. A keeper's handles (a dead
//     predecessor's, fuse/handover.h) are put back without it: this process keeps its own epoch.
//
// Thread-safety: every method takes mu; ForEach calls its function under it. Lock order: mu before
// PassthroughOpens::mu (fuse/fs_state.h).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <unordered_map>

#include "common/thread_annotations.h"
#include "fuse/open_file.h"

namespace granary::fuse {

class OpenHandles {
 public:
  // `to_kernel` maps an OpenFile's master inode to the kernel's number (the mount's root differs).
  OpenHandles(uint64_t seed, std::function<uint64_t(uint64_t)> to_kernel);
  OpenHandles(const OpenHandles&) = delete;
  OpenHandles& operator=(const OpenHandles&) = delete;

  static constexpr size_t kMaxAdopted = 1'000'000;

  // A new handle for `of`.
  uint64_t Add(std::shared_ptr<OpenFile> of) EXCLUDES(mu_);
  // A number of this numbering for a handle kept elsewhere (a write handle: WriteFiles).
  uint64_t Number() EXCLUDES(mu_);
  // The handle `fh` when it was opened on kernel inode `kino`; else null.
  std::shared_ptr<OpenFile> Find(uint64_t fh, uint64_t kino) EXCLUDES(mu_);
  // The same, and the handle ends (RELEASE, or an open whose reply failed).
  std::shared_ptr<OpenFile> Take(uint64_t fh, uint64_t kino) EXCLUDES(mu_);
  // A foreign number the kernel sent, served from now on by `of` (kept only below kMaxAdopted).
  void Adopt(uint64_t fh, std::shared_ptr<OpenFile> of) EXCLUDES(mu_);
  // A predecessor's handle. `continue_numbering` (a hand-over): later numbers follow it.
  void Restore(uint64_t fh, std::shared_ptr<OpenFile> of, bool continue_numbering) EXCLUDES(mu_);
  // A hand-over's next number: this process numbers on from it.
  void ContinueFrom(uint64_t next) EXCLUDES(mu_);
  // Calls fn(fh, of) for each handle under the table's lock; returns the next number.
  uint64_t ForEach(const std::function<void(uint64_t, const OpenFile&)>& fn) EXCLUDES(mu_);
  size_t size() const EXCLUDES(mu_);

 private:
  const std::function<uint64_t(uint64_t)> to_kernel_;
  mutable Mutex mu_;
  std::unordered_map<uint64_t, std::shared_ptr<OpenFile>> table_ GUARDED_BY(mu_);
  uint64_t next_ GUARDED_BY(mu_);
};

}  // namespace granary::fuse
