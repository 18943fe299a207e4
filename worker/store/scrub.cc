// BlockStore, the background thread: the start-up scrub (every chunk of every block), then the
// reserver every reserve_interval and the continuous scrub at scrub_bandwidth between its passes.
#include "worker/block_store.h"

#include <fcntl.h>
#include <spdlog/spdlog.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <memory>


namespace granary::worker {

StatusOr<bool> BlockStore::VerifyOne(const BlockId& id) {
  uint64_t len;
  {
    MutexLock lock(&mu_);
    auto it = index_.find(id);
    if (it == index_.end()) return false;
    len = it->second.meta.length;
  }
  // Reading verifies every chunk and removes the block when one fails; unaccounted, so the scrub
  // changes neither the LRU order nor the hit counters. A block whose pages are all still as this
  // worker wrote them (store::FileAsWritten) is not read: its bytes never reached the medium, whose
  // damage the scrub is there to find, so checking them would find nothing (a fresh cache filled by
  // a cold epoch is nearly all such blocks). A later pass checks it once written back.
  bool checked = false;
  auto n = ReadInternal(id, 0, len, nullptr, false, nullptr, store::Check::kChunksUnlessAsWritten, &checked);
  if (n.ok() && checked) scrubbed_++;
  if (!n.ok() && n.status().IsDataLoss()) return true;
  return false;
}

size_t BlockStore::Scrub() {
  size_t bad = 0;
  for (const auto& m : List()) {
    auto r = VerifyOne(m.id);
    if (r.ok() && *r) ++bad;
  }
  return bad;
}

void BlockStore::Loop() {
  // The start-up scrub, interleaved with reserver passes so a large cache does not hold them off.
  size_t bad = 0;
  auto last_pass = std::chrono::steady_clock::now();
  for (const auto& m : List()) {
    {
      MutexLock lock(&mu_);
      if (stop_) return;
    }
    auto r = VerifyOne(m.id);
    if (r.ok() && *r) ++bad;
    if (std::chrono::steady_clock::now() - last_pass > options_.reserve_interval) {
      Reserve();
      last_pass = std::chrono::steady_clock::now();
    }
  }
  if (bad > 0) spdlog::warn("start-up scrub discarded {} corrupt cached blocks", bad);
  // Then the reserver every interval (or when woken), and between passes the continuous scrub:
  // blocks in turn, as many bytes as scrub_bandwidth allows for the time that went by.
  std::vector<BlockMeta> todo;
  double budget = 0;
  auto last = std::chrono::steady_clock::now();
  for (;;) {
    {
      MutexLock lock(&mu_);
      auto until = std::chrono::steady_clock::now() + options_.reserve_interval;
      while (!stop_ && !wake_ && lock.WaitUntil(&cv_, until)) {
      }
      if (stop_) return;
    }
    Reserve();
    if (options_.scrub_bandwidth == 0) continue;
    auto now = std::chrono::steady_clock::now();
    budget = std::min(budget + std::chrono::duration<double>(now - last).count() * static_cast<double>(options_.scrub_bandwidth),
                      static_cast<double>(options_.scrub_bandwidth));  // at most a second's worth saved up
    last = now;
    // At most one pass begins per wake: a cache smaller than a second's budget would otherwise be
    // verified over and over, and the loop would not see stop_ for as long.
    if (todo.empty()) todo = List();  // the next full pass
    while (budget > 0 && !todo.empty()) {
      BlockMeta m = todo.back();
      todo.pop_back();
      budget -= static_cast<double>(m.length);
      auto r = VerifyOne(m.id);
      if (r.ok() && *r) spdlog::warn("the scrub discarded a corrupt cached block");
    }
  }
}

}  // namespace granary::worker
