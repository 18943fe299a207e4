// Eviction: which cached block a cache level gives up, as a pure function of the level's lists,
// the mounts' policies and which blocks are busy — no disk, no lock, no clock, so every rule is
// tested on its own (tests/worker/eviction_test.cc). BlockStore calls it under its lock.
//
// Rules
// -----
// A level keeps, per mount, its evictable blocks in last-access order (seq -> id; pinned blocks are
// never listed). The victim is the least recently used block over all mounts that the purpose
// allows and that is not busy (being read, leased or moved):
//   kAdmit      making room for a new block of `for_mount`. A mount under the shuffle policy never
//               evicts its own blocks for its own new ones (the cached fraction stays put, so every
//               shuffled epoch hits on it); any other mount's blocks may go.
//   kWatermark  the reserver bringing a level under its high watermark by eviction: shuffle mounts'
//               blocks are left alone.
//   kDemote     the reserver picking a block to move down a level: any mount's.
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
  std::function<CachePolicy(uint64_t)> policy;       // a mount's policy
  std::function<bool(const BlockId&)> busy;          // read, leased or moving: not evictable now
};

// The block to give up, or nothing when the rules leave none.
std::optional<BlockId> PickVictim(const LruLists& lists, const VictimQuery& q);

}  // namespace granary::worker::store
