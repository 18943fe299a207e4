// FileCache: the FUSE process's memory of what `open` needs for each file (rpc::FileInfo), so a
// file reopened in a later epoch costs no call to the master.
//
// Entries live for `ttl` (fuse.attr_timeout: no longer than the kernel may cache the same
// attributes) and at most `capacity` are kept; past that, the oldest half is dropped. Inode numbers
// are never reused by the master, so an entry can only be stale by being old, never by naming
// another file. Thread-safe.
#pragma once

#include <chrono>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <unordered_map>

#include "proto/granary.pb.h"

namespace granary::fuse {

class FileCache {
 public:
  using Clock = std::function<std::chrono::steady_clock::time_point()>;
  FileCache(size_t capacity, std::chrono::milliseconds ttl, Clock clock = std::chrono::steady_clock::now);

  std::optional<rpc::FileInfo> Get(uint64_t ino);
  void Put(uint64_t ino, const rpc::FileInfo& info);
  // Forgets a file (its version turned out stale), so the next open asks the master.
  void Erase(uint64_t ino);
  size_t size();

 private:
  struct Entry {
    rpc::FileInfo info;
    std::chrono::steady_clock::time_point added;
    uint64_t seq;
  };
  const size_t capacity_;
  const std::chrono::milliseconds ttl_;
  Clock clock_;
  std::mutex mu_;
  uint64_t seq_ = 0;                                // GUARDED_BY(mu_)
  std::unordered_map<uint64_t, Entry> entries_;     // GUARDED_BY(mu_)
  std::map<uint64_t, uint64_t> by_age_;             // seq -> ino; GUARDED_BY(mu_)
};

}  // namespace granary::fuse
