#include "worker/store/eviction.h"

namespace granary::worker::store {
namespace {

// The least recently used block of `lists` that is not busy and whose mount `skip` allows.
template <typename Skip>
std::optional<BlockId> Oldest(const LruLists& lists, const VictimQuery& q, Skip skip) {
  std::optional<BlockId> victim;
  uint64_t best = UINT64_MAX;
  for (const auto& [mount, list] : lists) {
    if (skip(mount)) continue;
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

}  // namespace

std::optional<BlockId> PickVictim(const LruLists& elastic, const LruLists& replicas, const VictimQuery& q) {
  const bool admit = q.purpose == Purpose::kAdmit;
  const bool shuffle_admit = admit && q.policy(q.for_mount) == CachePolicy::kShuffle;
  auto watermark_skips = [&](uint64_t mount) {
    return q.purpose == Purpose::kWatermark && q.policy(mount) == CachePolicy::kShuffle;
  };
  // Elastic copies first. A shuffle mount's new elastic copy leaves its own elastic copies alone.
  auto victim = Oldest(elastic, q, [&](uint64_t mount) {
    return (shuffle_admit && q.for_elastic && mount == q.for_mount) || watermark_skips(mount);
  });
  // An elastic copy never replaces a replica.
  if (victim || (admit && q.for_elastic) || q.elastic_only) return victim;
  return Oldest(replicas, q, [&](uint64_t mount) {
    return (shuffle_admit && mount == q.for_mount) || watermark_skips(mount);
  });
}

}  // namespace granary::worker::store
