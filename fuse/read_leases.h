// ReadLeases: files granary-fuse reads itself, from the local worker's cache data file, instead of
// asking the worker for every READ (daemon and kernel modes).
//
// Design
// ------
// A READ the page cache cannot answer costs a round trip to the local worker over its Unix socket
// (two thread hand-offs each way, a descriptor passed, a chunk checksummed) — ~100 µs on this
// machine where a minimal FUSE server answers in ~25 µs (bench/fuse_floor.sh). For a file read
// many times at random while it stays whole in the local cache (LMDB's random keys, memmap
// windows), granary-fuse leases the file's data file once (Client::LeaseFile, the lease
// passthrough opens use: the worker keeps every block of it, no eviction or move, while leased)
// and answers the file's READs from it (copied below 64 KiB, spliced above): byte N of a data file is byte N of that
// version of the file (worker/block_store.h), so a read of the lease is a read of the cache. The
// worker checks every chunk of the file when it grants the lease (LocalRequest.verify; a damaged
// block fails the lease and is fetched again), instead of the chunks each READ touches. A lease
// lives fuse.attr_timeout from its grant, used or not, so the bytes read are at most that long
// past their last check (the scrub keeps checking meanwhile), and a hot file is leased — checked —
// again after it.
//
// When: a file's fourth non-sequential READ from the local cache through one open (or, in kernel
// mode, one reading process) asks for the lease: a file read once (an image) or front to back (a
// shard) costs no lease and holds nothing. Non-sequential: more than kSequentialSlack (or 4 READs'
// length) away from where the last READ ended, since readahead keeps several READs in flight and
// they are answered in any order. So a file under 4 MiB is never leased. An open asks at most once per fuse.attr_timeout (a
// failed ask: not whole here, spread over directories).
//
// Bounds: a lease holds the file's blocks in the worker's cache, so leases are few and short:
// at most kMaxFiles files and kMaxBytes bytes, and no more than half the local worker's cache
// capacity (a small cache is not pinned full; half lets a 512 MB file be leased in a cache twice
// the dataset, bench/warm_read.sh); a lease is let go after its life (Trim, once a
// second from the invalidation thread), and the least recently used goes first past the bounds.
// A lease is per (master inode, version): a new version never reads an old lease.
//
// Thread-safe.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <list>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "common/thread_annotations.h"

namespace granary::fuse {

class FileLease;

class ReadLeases {
 public:
  static constexpr size_t kMaxFiles = 1024;
  static constexpr uint64_t kMaxBytes = 1ull << 30;
  static constexpr uint32_t kReadsBeforeLease = 3;  // the 4th non-sequential READ of an open asks
  // A READ within this (or 4 READs' length) of where the open's last one ended is sequential.
  static constexpr uint64_t kSequentialSlack = 4 << 20;

  using Clock = std::function<std::chrono::steady_clock::time_point()>;
  // `life`: how long a lease is used after its grant (fuse.attr_timeout).
  explicit ReadLeases(std::chrono::milliseconds life, Clock clock = std::chrono::steady_clock::now)
      : life_(life), clock_(std::move(clock)) {}

  // The lease of (ino, version), when held and within its life; marks it the most recently used.
  std::shared_ptr<FileLease> Find(uint64_t ino, const std::string& version);
  // Keeps `lease` (of a file of `bytes` bytes) when the bounds allow; false (dropped) otherwise.
  bool Add(uint64_t ino, const std::string& version, uint64_t bytes, std::unique_ptr<FileLease> lease);
  // Whether a file of `bytes` bytes may be leased now (the bounds, before asking the worker).
  bool Fits(uint64_t bytes);
  // The local worker's cache capacity (0: unknown): at most half of it is leased.
  void SetCapacity(uint64_t bytes);
  // Lets go of leases past their life.
  void Trim();
  // Lets go of every lease (shutdown, hand-over).
  void Clear();
  size_t files();
  uint64_t bytes();

 private:
  struct Entry {
    uint64_t ino;
    std::string version;
    uint64_t bytes;
    std::shared_ptr<FileLease> lease;
    std::chrono::steady_clock::time_point granted;
  };
  uint64_t LimitLocked() const REQUIRES(mu_);

  const std::chrono::milliseconds life_;
  const Clock clock_;
  Mutex mu_;
  std::list<Entry> lru_ GUARDED_BY(mu_);  // most recently used first
  std::unordered_map<uint64_t, std::list<Entry>::iterator> by_ino_ GUARDED_BY(mu_);
  uint64_t bytes_ GUARDED_BY(mu_) = 0;
  uint64_t capacity_ GUARDED_BY(mu_) = 0;
};

}  // namespace granary::fuse
