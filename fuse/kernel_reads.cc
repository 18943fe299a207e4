// KernelReads (fuse/kernel_reads.h, whose design note says what it keeps and why).
#include "fuse/kernel_reads.h"

#include <algorithm>

#include <utility>

namespace granary::fuse {

KernelReads::KernelReads(size_t capacity, std::chrono::milliseconds confirm_every, Clock now)
    : confirm_every_(confirm_every),
      now_(now ? std::move(now) : Clock([] { return std::chrono::steady_clock::now(); })),
      newest_(capacity),
      readers_(capacity) {}

StatusOr<KernelReads::Read> KernelReads::FileFor(uint64_t kino, uint64_t off, pid_t pid, const AskMaster& ask) {
  const auto now = now_();
  Read r;
  std::shared_ptr<OpenFile> newest;
  {
    MutexLock lock(&mu_);
    Known* known = newest_.Find(kino);
    if (known != nullptr && now - known->confirmed < confirm_every_) newest = known->file;
  }
  if (!newest) {
    std::chrono::milliseconds age{0};
    ASSIGN_OR_RETURN(rpc::FileInfo info, ask(kino, &age));
    const auto confirmed = now - std::max(age, std::chrono::milliseconds(0));
    MutexLock lock(&mu_);
    Known* known = newest_.Find(kino);
    // The same version at the same path (a rename through a writable mount keeps the version of
    // a local file but not its path).
    if (known != nullptr && known->file->info.version() == info.version() &&
        known->file->info.ufs_path() == info.ufs_path()) {
      known->confirmed = std::max(known->confirmed, confirmed);
      newest = known->file;
    } else {
      r.new_version = known != nullptr;  // the kernel's pages are the old version's
      newest = std::make_shared<OpenFile>();
      newest->info = std::move(info);
      newest_.Put(kino, Known{newest, confirmed});
    }
  }
  MutexLock lock(&mu_);
  auto [mine, fresh] = readers_.TryEmplace(PidKey{kino, pid}, newest);
  if (mine == nullptr) {  // capacity 0: nothing remembered
    r.file = std::move(newest);
    return r;
  }
  if (!fresh && off == 0) *mine = newest;
  r.file = *mine;
  return r;
}

void KernelReads::Unconfirm(uint64_t kino) {
  MutexLock lock(&mu_);
  if (Known* known = newest_.Find(kino)) known->confirmed = {};
}

void KernelReads::SetCapacity(size_t capacity) {
  MutexLock lock(&mu_);
  newest_.SetCapacity(capacity);
  readers_.SetCapacity(capacity);
}

}  // namespace granary::fuse
