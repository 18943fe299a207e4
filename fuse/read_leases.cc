#include "fuse/read_leases.h"

#include <algorithm>

#include "fuse/client.h"

namespace granary::fuse {

uint64_t ReadLeases::LimitLocked() const {
  return capacity_ == 0 ? kMaxBytes : std::min<uint64_t>(kMaxBytes, capacity_ / 2);
}

std::shared_ptr<FileLease> ReadLeases::Find(uint64_t ino, const std::string& version) {
  MutexLock lock(&mu_);
  auto it = by_ino_.find(ino);
  if (it == by_ino_.end() || it->second->version != version) return nullptr;
  if (clock_() - it->second->granted > life_) return nullptr;  // Trim lets it go
  lru_.splice(lru_.begin(), lru_, it->second);
  return it->second->lease;
}

bool ReadLeases::Fits(uint64_t bytes) {
  MutexLock lock(&mu_);
  return bytes <= LimitLocked();
}

void ReadLeases::SetCapacity(uint64_t bytes) {
  MutexLock lock(&mu_);
  capacity_ = bytes;
}

bool ReadLeases::Add(uint64_t ino, const std::string& version, uint64_t bytes, std::unique_ptr<FileLease> lease) {
  std::vector<std::shared_ptr<FileLease>> gone;
  bool kept = false;
  {
    MutexLock lock(&mu_);
    if (bytes <= LimitLocked()) {
      if (auto it = by_ino_.find(ino); it != by_ino_.end()) {  // another version, or a race: replace
        bytes_ -= it->second->bytes;
        gone.push_back(std::move(it->second->lease));
        lru_.erase(it->second);
        by_ino_.erase(it);
      }
      lru_.push_front(Entry{ino, version, bytes, std::shared_ptr<FileLease>(std::move(lease)),
                            clock_()});
      by_ino_[ino] = lru_.begin();
      bytes_ += bytes;
      kept = true;
      while (!lru_.empty() && (lru_.size() > kMaxFiles || bytes_ > LimitLocked())) {
        bytes_ -= lru_.back().bytes;
        gone.push_back(std::move(lru_.back().lease));
        by_ino_.erase(lru_.back().ino);
        lru_.pop_back();
      }
    } else {
      gone.push_back(std::shared_ptr<FileLease>(std::move(lease)));
    }
  }
  return kept;  // the leases in `gone` end here, outside the lock
}

void ReadLeases::Trim() {
  std::vector<std::shared_ptr<FileLease>> gone;
  {
    MutexLock lock(&mu_);
    const auto now = clock_();
    for (auto it = lru_.begin(); it != lru_.end();) {
      if (now - it->granted <= life_) {
        ++it;
        continue;
      }
      bytes_ -= it->bytes;
      gone.push_back(std::move(it->lease));
      by_ino_.erase(it->ino);
      it = lru_.erase(it);
    }
  }
}  // the leases in `gone` end here, outside the lock

void ReadLeases::Clear() {
  std::vector<std::shared_ptr<FileLease>> gone;
  {
    MutexLock lock(&mu_);
    for (auto& e : lru_) gone.push_back(std::move(e.lease));
    lru_.clear();
    by_ino_.clear();
    bytes_ = 0;
  }
}  // the leases in `gone` end here, outside the lock

size_t ReadLeases::files() {
  MutexLock lock(&mu_);
  return lru_.size();
}

uint64_t ReadLeases::bytes() {
  MutexLock lock(&mu_);
  return bytes_;
}

}  // namespace granary::fuse
