// OpenHandles (fuse/open_handles.h, whose note gives the rules).
#include "fuse/open_handles.h"

#include <algorithm>

namespace granary::fuse {

OpenHandles::OpenHandles(uint64_t seed, std::function<uint64_t(uint64_t)> to_kernel)
    : to_kernel_(std::move(to_kernel)), next_(((seed & 0x3fffff) + 1) << 40) {}

uint64_t OpenHandles::Number() {
  MutexLock lock(&mu_);
  return next_++;
}

uint64_t OpenHandles::Add(std::shared_ptr<OpenFile> of) {
  MutexLock lock(&mu_);
  const uint64_t fh = next_++;
  table_[fh] = std::move(of);
  return fh;
}

std::shared_ptr<OpenFile> OpenHandles::Find(uint64_t fh, uint64_t kino) {
  MutexLock lock(&mu_);
  auto it = table_.find(fh);
  if (it == table_.end() || to_kernel_(it->second->info.attr().ino()) != kino) return nullptr;
  return it->second;
}

std::shared_ptr<OpenFile> OpenHandles::Take(uint64_t fh, uint64_t kino) {
  MutexLock lock(&mu_);
  auto it = table_.find(fh);
  if (it == table_.end() || to_kernel_(it->second->info.attr().ino()) != kino) return nullptr;
  auto of = std::move(it->second);
  table_.erase(it);
  return of;
}

void OpenHandles::Adopt(uint64_t fh, std::shared_ptr<OpenFile> of) {
  MutexLock lock(&mu_);
  if (table_.size() < kMaxAdopted) table_.emplace(fh, std::move(of));
}

void OpenHandles::Restore(uint64_t fh, std::shared_ptr<OpenFile> of, bool continue_numbering) {
  MutexLock lock(&mu_);
  table_.emplace(fh, std::move(of));
  if (continue_numbering) next_ = std::max(next_, fh + 1);
}

void OpenHandles::ContinueFrom(uint64_t next) {
  MutexLock lock(&mu_);
  next_ = next;
}

uint64_t OpenHandles::ForEach(const std::function<void(uint64_t, const OpenFile&)>& fn) {
  MutexLock lock(&mu_);
  for (const auto& [fh, of] : table_) fn(fh, *of);
  return next_;
}

size_t OpenHandles::size() const {
  MutexLock lock(&mu_);
  return table_.size();
}

}  // namespace granary::fuse
