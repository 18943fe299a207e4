#include "worker/placement.h"

#include <xxhash.h>

#include <algorithm>
#include <cstring>
#include <utility>

namespace granary::worker {
namespace {

// Whether `a` (weight wa) ranks before `b` (weight wb).
bool Before(uint64_t wa, const PeerRef& a, uint64_t wb, const PeerRef& b) {
  return wa != wb ? wa > wb : a.address < b.address;
}

}  // namespace

uint64_t PlacementWeight(const BlockId& id, const std::string& worker_address) {
  char buf[24];
  std::memcpy(buf, id.key.data(), 16);
  std::memcpy(buf + 16, &id.index, 8);
  return XXH3_64bits_withSeed(buf, sizeof(buf), XXH3_64bits(worker_address.data(), worker_address.size()));
}

std::vector<PeerRef> RankForBlock(const BlockId& id, std::vector<PeerRef> members) {
  std::vector<std::pair<uint64_t, PeerRef>> weighted;
  weighted.reserve(members.size());
  for (auto& m : members) {
    uint64_t w = PlacementWeight(id, m.address);
    weighted.emplace_back(w, std::move(m));
  }
  std::sort(weighted.begin(), weighted.end(),
            [](const auto& a, const auto& b) { return Before(a.first, a.second, b.first, b.second); });
  std::vector<PeerRef> ranked;
  ranked.reserve(weighted.size());
  for (auto& [w, p] : weighted) ranked.push_back(std::move(p));
  return ranked;
}

size_t RankOf(const BlockId& id, const std::vector<PeerRef>& members, uint64_t self_id) {
  const PeerRef* self = nullptr;
  for (const auto& m : members) {
    if (m.id == self_id) self = &m;
  }
  if (self == nullptr) return kNotRanked;
  const uint64_t mine = PlacementWeight(id, self->address);
  size_t above = 0;
  for (const auto& m : members) {
    if (m.id != self_id && Before(PlacementWeight(id, m.address), m, mine, *self)) ++above;
  }
  return above;
}

}  // namespace granary::worker
