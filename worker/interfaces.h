// The worker's seams: what BlockSource needs from the outside, so tests can substitute fakes.
//
//   MountResolver  turns a mount id into the mount's URI and an opened under-storage client.
//   BlockReporter  is told about every block the cache gains, loses or that changes kind, so the
//                  master gets the worker's per-mount cached counters soon (it keeps no block map).
//   Placement      ranks the cluster's workers for a block and reads from peers (PeerSet).
//
// MasterLink implements the first two against a real master. Implementations must be thread-safe.
#pragma once

#include <chrono>
#include <cstddef>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/status.h"
#include "common/tiers.h"
#include "ufs/ufs.h"
#include "worker/block_store.h"

namespace granary::worker {

// A request for a range of one block of one file version.
struct BlockRequest {
  uint64_t mount_id = 0;
  std::string ufs_path;
  std::string version;
  uint64_t file_size = 0;
  uint64_t block_size = 0;
  uint64_t index = 0;
  uint64_t offset = 0;  // within the block
  uint64_t length = 0;
  bool from_peer = false;  // asked by another worker: serve from here, never forward
  bool cached_only = false;  // with from_peer: from this worker's cache only (NOT_FOUND on a miss)
  bool random = false;  // not a sequential reader's: range first also at a block's start
  bool continues = false;  // continues a sequential stream: not range first inside a block either
  uint64_t free_stamp = 0;  // a load batch's, or a queued hint's (ReadBlockRequest.free_stamp): see BlockStore::FreeTicketAt
  // A granary-fuse hint's or touch's: when it was asked there (PrefetchRequest.age_ms, less a
  // slack); a free since then keeps its block out (BlockStore::FreeTicketAsOf). Unset: on arrival.
  std::optional<std::chrono::steady_clock::time_point> asked_at{};
};

struct MountHandle {
  std::string uri;
  std::shared_ptr<UnderFileSystem> ufs;
  std::optional<CachePolicy> policy;  // the mount's cache.policy, when it sets one
  uint32_t replicas = 1;              // the mount's cache.replicas
  bool elastic = true;                // the mount's cache.elastic: keep elastic copies of what this node reads
  uint64_t block_size = 0;            // the mount's block size (0: a mount made before it was kept)
  WriteMode write = WriteMode::kOff;  // the mount's `write` option: whether writes may reach its store
};

struct PeerRef {
  uint64_t id = 0;
  std::string address;
  bool operator==(const PeerRef& o) const { return id == o.id && address == o.address; }
  bool operator!=(const PeerRef& o) const { return !(*this == o); }
};

inline constexpr size_t kNotRanked = static_cast<size_t>(-1);

class Placement {
 public:
  virtual ~Placement() = default;
  // The live workers, best holder of `id` first (the first is its home). `*self` is this worker's
  // position, or kNotRanked when it is not in the list (not registered yet). An empty list means
  // the membership is unknown: the worker acts alone.
  virtual std::vector<PeerRef> Rank(const BlockId& id, size_t* self) = 0;
  // The membership as the master last listed it (peers marked down included: a short outage must
  // not re-sort the cache), and this worker's id in it. Empty when unknown.
  virtual std::vector<PeerRef> Members(uint64_t* self) = 0;
  // Reads req.offset..+req.length (within one block) from `peer`, which serves it from its cache or
  // its own under-storage fetch. Retryable errors mean the peer is unusable, not the data.
  virtual Status ReadFromPeer(const PeerRef& peer, const BlockRequest& req, std::string* out) = 0;
  // `peer` failed a call: leave it out of rankings for a while.
  virtual void PeerFailed(const PeerRef& peer) = 0;
  // Asks `peer` (the block's home) to warm the block into its cache; best effort.
  virtual Status PrefetchOnPeer(const PeerRef& peer, const BlockRequest& req) = 0;
  // The block's home before the membership last changed, when that was recently (a join moved the
  // block's home here; the previous home still holds what it cached), it is still a member and it
  // is not this worker; nullopt otherwise.
  virtual std::optional<PeerRef> PreviousHome(const BlockId& id) {
    (void)id;
    return std::nullopt;
  }
};

class MountResolver {
 public:
  virtual ~MountResolver() = default;
  virtual StatusOr<MountHandle> GetMount(uint64_t mount_id) = 0;
};

class BlockReporter {
 public:
  virtual ~BlockReporter() = default;
  virtual void BlockAdded(const BlockMeta& m) = 0;
  virtual void BlockRemoved(const BlockMeta& m) = 0;
};

}  // namespace granary::worker
