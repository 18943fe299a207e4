#include "fuse/file_cache.h"

namespace granary::fuse {

FileCache::FileCache(size_t capacity, std::chrono::milliseconds ttl, Clock clock)
    : capacity_(capacity), ttl_(ttl), clock_(std::move(clock)) {}

std::optional<rpc::FileInfo> FileCache::Get(uint64_t ino) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = entries_.find(ino);
  if (it == entries_.end()) return std::nullopt;
  if (clock_() - it->second.added > ttl_) {
    by_age_.erase(it->second.seq);
    entries_.erase(it);
    return std::nullopt;
  }
  return it->second.info;
}

void FileCache::Put(uint64_t ino, const rpc::FileInfo& info) {
  if (capacity_ == 0) return;
  std::lock_guard<std::mutex> lock(mu_);
  auto it = entries_.find(ino);
  if (it != entries_.end()) by_age_.erase(it->second.seq);
  uint64_t seq = seq_++;
  entries_[ino] = Entry{info, clock_(), seq};
  by_age_[seq] = ino;
  if (entries_.size() > capacity_) {
    // Drop the oldest half: amortised O(1) per insert, and no per-read bookkeeping.
    size_t drop = entries_.size() - capacity_ / 2;
    for (auto a = by_age_.begin(); drop > 0 && a != by_age_.end(); --drop) {
      entries_.erase(a->second);
      a = by_age_.erase(a);
    }
  }
}

size_t FileCache::size() {
  std::lock_guard<std::mutex> lock(mu_);
  return entries_.size();
}

void FileCache::Erase(uint64_t ino) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = entries_.find(ino);
  if (it == entries_.end()) return;
  by_age_.erase(it->second.seq);
  entries_.erase(it);
}

}  // namespace granary::fuse
