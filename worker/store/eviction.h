// Eviction: which cached block a cache level gives up, as a pure function of the level's lists,
// the mounts' policies and which blocks are busy — no disk, no lock, no clock, so every rule is
// tested on its own (tests/worker/eviction_test.cc). BlockStore calls it under its lock.
//
// Rules
// -----
// A level keeps, per mount, its evictable blocks in last-access order (seq -> id; pinned blocks are
// never listed), in two sets of lists: elastic copies (blocks this node keeps beyond their
// `cache.replicas` holders, see worker/block_source.h) and replicas. Elastic copies go first,
// whatever the policy: the victim is the least recently used elastic copy the purpose allows, and
// only when there is none, the least recently used replica the purpose allows. Busy blocks (being
// read, leased or moved) are never picked.
//   kAdmit      making room for a new block of `for_mount` (an elastic copy when `for_elastic`).
//               A mount under the shuffle policy never evicts its own blocks for its own new ones
//               of the same kind (the cached fraction stays put, so every shuffled epoch hits on
//               it); a replica may replace the mount's own elastic copies. An elastic copy never
//               replaces a replica.
//   kWatermark  the reserver bringing a level under its high watermark by eviction: shuffle
//               mounts' blocks, elastic or not, are left alone.
//   kDemote     the reserver picking a block to move down a level: any mount's, elastic first.
// With `elastic_only`, only elastic copies are candidates: BlockStore::Put makes a first pass over
// every level with it, so a replica is evicted from no level while any level has an elastic copy
// that may go.
// Each mount's list is scanned from its oldest entry for at most kScanLimit busy blocks, so a pick
// costs O(mounts) however large the level.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <unordered_map>

#include "common/tiers.h"
#include "worker/store/block_id.h"

namespace granary::worker::store {

enum class Purpose { kAdmit, kWatermark, kDemote };

// Per mount, the evictable blocks of one level, oldest access first.
using LruLists = std::unordered_map<uint64_t, std::map<uint64_t, BlockId>>;

constexpr int kScanLimit = 64;

struct VictimQuery {
  Purpose purpose = Purpose::kAdmit;
  uint64_t for_mount = 0;                            // kAdmit: the mount of the block to admit
  bool for_elastic = false;                          // kAdmit: the block to admit is an elastic copy
  bool elastic_only = false;                         // only an elastic copy may go (a first pass)
  std::function<CachePolicy(uint64_t)> policy;       // a mount's policy
  std::function<bool(const BlockId&)> busy;          // read, leased or moving: not evictable now
};

// The block to give up, or nothing when the rules leave none. `elastic` and `replicas` are the
// level's two sets of lists.
std::optional<BlockId> PickVictim(const LruLists& elastic, const LruLists& replicas, const VictimQuery& q);

}  // namespace granary::worker::store
