#include "worker/store/eviction.h"

namespace granary::worker::store {

std::optional<BlockId> PickVictim(const LruLists& lists, const VictimQuery& q) {
  std::optional<BlockId> victim;
  uint64_t best = UINT64_MAX;
  const bool shuffle_admit = q.purpose == Purpose::kAdmit && q.policy(q.for_mount) == CachePolicy::kShuffle;
  for (const auto& [mount, list] : lists) {
    if (shuffle_admit && mount == q.for_mount) continue;  // never replace a shuffle dataset's blocks with its own
    if (q.purpose == Purpose::kWatermark && q.policy(mount) == CachePolicy::kShuffle) continue;
    int scanned = 0;
    for (const auto& [seq, id] : list) {
      if (seq >= best || ++scanned > kScanLimit) break;
      if (q.busy(id)) continue;
      best = seq;
      victim = id;
      break;
    }
  }
  return victim;
}

}  // namespace granary::worker::store
