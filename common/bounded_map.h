// BoundedMap: a hash map that keeps at most `capacity` entries, for what a process remembers only
// to save a call or a re-read (forgetting an entry costs that call, never a wrong answer). When an
// insert finds it full, the oldest inserted half goes: amortised O(1) per insert, and no
// bookkeeping per lookup. Before it, each such map was cleared whole when full (a burst of calls
// for every entry at once) or grew without a bound.
//
// Used by TtlCache (fuse/file_cache.h) and by granary-fuse's per-inode state (fuse/fs_state.h).
// Not thread-safe: the owner's lock guards it (GUARDED_BY on the member).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <unordered_map>
#include <utility>

namespace granary {

template <typename K, typename V, typename Hash = std::hash<K>>
class BoundedMap {
 public:
  // capacity 0 keeps nothing: every Find misses and inserts are dropped.
  explicit BoundedMap(size_t capacity) : capacity_(capacity) {}

  // The entry of `key`, or null. The pointer stays valid until the entry is erased or evicted.
  V* Find(const K& key) {
    auto it = entries_.find(key);
    return it == entries_.end() ? nullptr : &it->second.value;
  }

  // The entry of `key`, inserted (as the newest) with `value` when absent; second: whether it was
  // inserted. {nullptr, false} when the capacity is 0.
  std::pair<V*, bool> TryEmplace(const K& key, V value) {
    if (capacity_ == 0) return {nullptr, false};
    auto it = entries_.find(key);
    if (it != entries_.end()) return {&it->second.value, false};
    MakeRoom();
    const uint64_t seq = seq_++;
    it = entries_.emplace(key, Slot{std::move(value), seq}).first;
    by_age_.emplace(seq, key);
    return {&it->second.value, true};
  }

  // Sets `key` to `value`, as the newest entry (an existing one is replaced and counts as new).
  void Put(const K& key, V value) {
    Erase(key);
    TryEmplace(key, std::move(value));
  }

  void Erase(const K& key) {
    auto it = entries_.find(key);
    if (it == entries_.end()) return;
    by_age_.erase(it->second.seq);
    entries_.erase(it);
  }

  void clear() {
    entries_.clear();
    by_age_.clear();
  }
  size_t size() const { return entries_.size(); }
  size_t capacity() const { return capacity_; }
  // A new bound, applied from the next insert.
  void SetCapacity(size_t capacity) { capacity_ = capacity; }

 private:
  struct Slot {
    V value;
    uint64_t seq;
  };
  // Full: drops the oldest entries down to half the capacity.
  void MakeRoom() {
    if (entries_.size() < capacity_) return;
    size_t drop = entries_.size() - capacity_ / 2;
    for (auto a = by_age_.begin(); drop > 0 && a != by_age_.end(); --drop) {
      entries_.erase(a->second);
      a = by_age_.erase(a);
    }
  }

  size_t capacity_;
  uint64_t seq_ = 0;
  std::unordered_map<K, Slot, Hash> entries_;
  std::map<uint64_t, K> by_age_;  // seq -> key, oldest first
};

}  // namespace granary
