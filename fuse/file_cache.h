// TtlCache: what the FUSE process remembers of the master's answers, so a repeated question costs
// no call. Two instances (fuse/mount.cc):
//   FileCache   inode -> rpc::FileInfo, what `open` (and a kernel-mode read) needs for a file, so a
//               file reopened in a later epoch costs no call to the master;
//   EntryCache  "<parent inode>/<name>" -> rpc::Attr, lookups, so a path walk after the kernel
//               dropped its dentries (memory pressure, drop_caches) costs no call either;
//   AttrCache   inode -> rpc::Attr, what getattr answers (filled by getattr, lookups and listings),
//               so a GETATTR the kernel sends for attributes granary-fuse learnt lately (a forced
//               statx, an inode the kernel dropped) costs no call.
//
// Entries live for `ttl` (no longer than the kernel may cache the same answer itself:
// fuse.attr_timeout, fuse.entry_timeout) and at most `capacity` are kept; past that, the oldest
// half is dropped (common/bounded_map.h). Inode numbers are never reused by the master, so an entry can only be stale by
// being old, never by naming another file. Thread-safe.
#pragma once

#include <chrono>
#include <functional>
#include <optional>
#include <string>
#include <unordered_map>

#include "common/bounded_map.h"
#include "common/thread_annotations.h"
#include "proto/granary.pb.h"

namespace granary::fuse {

// What a TtlCache may keep: below a writable mount (rpc::Attr::writable) nothing but directories,
// which their users take for at most kWritableDirAge (FreshEnough): a file's attributes are asked
// for at every stat and open (close-to-open).
inline bool Cacheable(const rpc::Attr& a) { return !a.writable() || a.type() == rpc::DIRECTORY; }
inline constexpr std::chrono::milliseconds kWritableDirAge{1000};
inline bool FreshEnough(const rpc::Attr& a, std::chrono::milliseconds age) {
  return !a.writable() || age < kWritableDirAge;
}
inline bool Cacheable(const rpc::FileInfo& f) { return !f.attr().writable(); }
template <typename V>
bool Cacheable(const V&) {
  return true;
}

template <typename K, typename V>
class TtlCache {
 public:
  using Clock = std::function<std::chrono::steady_clock::time_point()>;
  TtlCache(size_t capacity, std::chrono::milliseconds ttl, Clock clock = std::chrono::steady_clock::now)
      : ttl_(ttl), clock_(std::move(clock)), entries_(ttl.count() > 0 ? capacity : 0) {}

  // The value, if present and younger than ttl; *age (optional) says how old it is.
  std::optional<V> Get(const K& key, std::chrono::milliseconds* age = nullptr) {
    MutexLock lock(&mu_);
    Entry* e = entries_.Find(key);
    if (e == nullptr) return std::nullopt;
    auto old = clock_() - e->added;
    if (old > ttl_) {
      entries_.Erase(key);
      return std::nullopt;
    }
    if (age) *age = std::chrono::duration_cast<std::chrono::milliseconds>(old);
    return e->value;
  }

  void Put(const K& key, const V& value) {
    if (!Cacheable(value)) return;  // a file below a writable mount: always asked again (close-to-open)
    MutexLock lock(&mu_);
    entries_.Put(key, Entry{value, clock_()});
  }

  // Forgets an entry (it turned out stale), so the next question goes to the master.
  void Erase(const K& key) {
    MutexLock lock(&mu_);
    entries_.Erase(key);
  }

  size_t size() {
    MutexLock lock(&mu_);
    return entries_.size();
  }

 private:
  struct Entry {
    V value;
    std::chrono::steady_clock::time_point added;
  };
  const std::chrono::milliseconds ttl_;
  Clock clock_;
  Mutex mu_;
  BoundedMap<K, Entry> entries_ GUARDED_BY(mu_);  // the oldest half goes when full
};

using FileCache = TtlCache<uint64_t, rpc::FileInfo>;
using EntryCache = TtlCache<std::string, rpc::Attr>;
using AttrCache = TtlCache<uint64_t, rpc::Attr>;  // master inode -> its attributes (getattr)
inline std::string EntryKey(uint64_t parent, const char* name) { return std::to_string(parent) + "/" + name; }

}  // namespace granary::fuse
