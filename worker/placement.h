// Rendezvous placement: the one ranking of workers for a block, used by reads (PeerSet::Rank over
// this worker's view of the membership) and by load jobs (over the master's list for a batch).
//
// A block's ranking is the workers ordered by a per-(block, worker address) hash, highest first;
// ties (never seen in practice) by address. Weights are by address, not id, so every worker ranks
// the same way whatever ids the master handed out. The first is the block's home (it fetches from
// the under-storage); the first `cache.replicas` keep a copy. See worker/peers.h for the design.
//
// Pure functions; thread-safe.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "worker/interfaces.h"

namespace granary::worker {

// The rendezvous weight of `worker_address` for block `id`; higher ranks first.
uint64_t PlacementWeight(const BlockId& id, const std::string& worker_address);

// `members` in ranking order for `id`.
std::vector<PeerRef> RankForBlock(const BlockId& id, std::vector<PeerRef> members);

// Where `self_id` ranks for `id` among `members` (0: the home); kNotRanked when it is not one.
size_t RankOf(const BlockId& id, const std::vector<PeerRef>& members, uint64_t self_id);

}  // namespace granary::worker
