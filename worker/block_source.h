// BlockSource: where the worker gets the bytes of a block.
//
// Read path: the BlockStore first (a hit); on a miss, one fetch of the whole block from the
// under-storage, shared by every concurrent request for the same block (single-flight), then the
// block is written to the store and reported to the master. A cached block that fails its checksum
// is dropped by the store and fetched again, so corrupt bytes are never returned. When the block
// cannot be cached (no room, or the shuffle policy keeps the cache as it is) it is still served from
// the fetched copy, which is kept in a small in-memory buffer (the last kUncachedBlocks such
// blocks) so the next requests for the rest of the block, from the same reader, do not fetch it
// again. The buffer is deliberately tiny: it is not a cache.
//
// Thread-safe.
#pragma once

#include <atomic>
#include <future>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>

#include "common/status.h"
#include "worker/block_store.h"
#include "worker/interfaces.h"

namespace granary::worker {

struct BlockRequest {
  uint64_t mount_id = 0;
  std::string ufs_path;
  std::string version;
  uint64_t file_size = 0;
  uint64_t block_size = 0;
  uint64_t index = 0;
  uint64_t offset = 0;  // within the block
  uint64_t length = 0;
};

struct SourceCounters {
  std::atomic<uint64_t> hits{0}, misses{0}, ufs_reads{0}, ufs_bytes{0}, bytes_served{0};
  std::atomic<uint64_t> coalesced{0};  // misses that joined another request's in-flight fetch
  std::atomic<uint64_t> buffered{0};   // misses served from the uncached-block buffer
};

class BlockSource {
 public:
  // Routes the store's removals (evictions, frees, corrupt blocks) to `reporter`.
  BlockSource(BlockStore* store, MountResolver* mounts, BlockReporter* reporter);

  // Fills `out` with the requested range (clipped at the block's end); `hit` tells whether it came
  // from the cache. INVALID_ARGUMENT for a range outside the file; FAILED_PRECONDITION when the file
  // changed in the under-storage.
  Status Read(const BlockRequest& req, std::string* out, bool* hit);

  const SourceCounters& counters() const { return counters_; }

  static constexpr size_t kUncachedBlocks = 16;

 private:
  using Fetched = StatusOr<std::shared_ptr<const std::string>>;
  Fetched Fetch(const BlockRequest& req, const MountHandle& mount, const BlockMeta& meta);
  Fetched FetchOnce(const BlockRequest& req, const MountHandle& mount, const BlockMeta& meta);

  BlockStore* store_;
  MountResolver* mounts_;
  BlockReporter* reporter_;
  SourceCounters counters_;
  std::mutex mu_;
  std::unordered_map<BlockId, std::shared_future<Fetched>, BlockIdHash> inflight_;  // GUARDED_BY(mu_)
  // Blocks served but not admitted to the store, most recent first (at most kUncachedBlocks).
  std::list<std::pair<BlockId, std::shared_ptr<const std::string>>> uncached_;  // GUARDED_BY(mu_)
};

}  // namespace granary::worker
