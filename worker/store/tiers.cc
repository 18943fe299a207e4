// BlockStore, watermarks: the reserver's passes over the levels (demote or evict down to the
// low mark, bottom level first) and the block moves between levels (demotion, promotion).
#include "worker/block_store.h"

#include <fcntl.h>
#include <spdlog/spdlog.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>

#include "worker/store/block_file.h"

namespace granary::worker {

bool BlockStore::MoveBlock(const BlockId& id, int from_tier, int to_tier, int to_dir, double fraction) {
  std::string src, src_sidecar, dst, dst_sidecar;
  uint64_t bytes, data_len, offset;
  {
    MutexLock lock(&mu_);
    auto it = index_.find(id);
    if (it == index_.end()) return false;
    Entry& e = it->second;
    if (e.tier != from_tier || e.readers > 0 || e.moving || e.doomed || e.pinned) return false;
    // Room was found before the lock was dropped; a Put may have taken it since.
    const Dir& d = tiers_[to_tier].dirs[to_dir];
    if (static_cast<double>(d.used + d.reserved + e.file_bytes) > static_cast<double>(d.quota) * fraction) return false;
    e.moving = true;
    bytes = e.file_bytes;
    data_len = e.meta.length;
    offset = e.meta.offset;
    tiers_[to_tier].dirs[to_dir].reserved += bytes;
    src = PathLocked(id, e.tier, e.dir);
    src_sidecar = SidecarLocked(id, e.tier, e.dir);
    dst = PathLocked(id, to_tier, to_dir);
    dst_sidecar = SidecarLocked(id, to_tier, to_dir);
    HoldFileLocked(dst);
  }
  // The block's range into the other level's data file of its file, and its sidecar as it is.
  std::string tmp = TmpPath(to_tier, to_dir);
  Status st = store::CopyData(src, dst, offset, data_len);
  if (st.ok()) {
    auto sidecar = store::ReadSidecarBytes(src_sidecar, data_len);
    st = sidecar.ok() ? store::WriteSidecarTmp(tmp, *sidecar) : sidecar.status();
  }
  Removal r;
  bool moved = false;
  {
    MutexLock lock(&mu_);
    tiers_[to_tier].dirs[to_dir].reserved -= bytes;
    auto it = index_.find(id);
    if (it != index_.end()) {
      Entry& e = it->second;
      e.moving = false;
      if (st.ok() && e.readers == 0 && !e.doomed && !e.pinned) {
        // Commit under the lock: the new sidecar appears and the old one goes in one step.
        st = store::CommitSidecar(tmp, dst_sidecar);
      }
      if (st.ok() && e.readers == 0 && !e.doomed && !e.pinned) {
        UnlistLocked(e);
        tiers_[e.tier].dirs[e.dir].used -= bytes;
        tiers_[e.tier].nblocks--;
        e.tier = to_tier;
        e.dir = to_dir;
        e.own_write = false;  // copied by the kernel: the sums were not computed from these writes
        tiers_[to_tier].dirs[to_dir].used += bytes;
        tiers_[to_tier].nblocks++;
        ListLocked(id, e);
        if (to_tier > from_tier) {
          tiers_[from_tier].demotions++;
        } else {
          tiers_[to_tier].promotions++;
        }
        moved = true;
        unlink(src_sidecar.c_str());
        LetGoRangeLocked(src, offset, data_len, /*doomed=*/false);
      } else if (e.doomed && e.readers == 0) {
        RemoveLocked(id, &r);  // freed while moving
      }
    }
    if (!moved) {  // aborted: a reader arrived, or it was freed or pinned meanwhile
      unlink(tmp.c_str());
      PunchLocked(dst, offset, data_len);
      DropFileLocked(dst);
    }
  }
  Finish(r);
  if (!st.ok()) spdlog::warn("moving a cached block: {}", st.message());
  return moved;
}

void BlockStore::ReserveTier(int t) {
  const bool last = t + 1 == static_cast<int>(TierCount());
  for (int guard = 0; guard < 1 << 20; ++guard) {
    Removal r;
    BlockId victim;
    int to_dir = -1;
    bool stuck = false;
    {
      MutexLock lock(&mu_);
      const Tier& tier = tiers_[t];
      double target = tier.level.low * static_cast<double>(tier.Quota());
      if (static_cast<double>(tier.Used()) <= target) return;
      if (last) {
        if (!EvictOneLocked(t, Purpose::kWatermark, 0, false, &r)) return;
      } else {
        if (!PickVictimLocked(t, Purpose::kDemote, 0, false, &victim)) return;
        const Entry& e = index_.at(victim);
        to_dir = FitLocked(t + 1, e.file_bytes, 1.0);
        // The level below is full: make room there as an admission of this block would.
        while (to_dir < 0 && EvictOneLocked(t + 1, Purpose::kAdmit, e.meta.mount_id, e.meta.elastic, &r)) {
          to_dir = FitLocked(t + 1, e.file_bytes, 1.0);
        }
        if (to_dir < 0) {
          // No room below. An lru block is evicted; a shuffle block stays where it is.
          if (PolicyLocked(e.meta.mount_id) == CachePolicy::kShuffle || !EvictOneLocked(t, Purpose::kWatermark, 0, false, &r)) {
            stuck = true;
          }
        }
      }
    }
    Finish(r);
    if (stuck) return;
    if (to_dir >= 0 && !MoveBlock(victim, t, t + 1, to_dir, 1.0)) {
      return;  // raced with a reader; the next pass retries
    }
  }
}

void BlockStore::Reserve() {
  MutexLock guard(&move_mu_);
  std::vector<BlockId> promote;
  {
    MutexLock lock(&mu_);
    promote.swap(promote_queue_);
    wake_ = false;
  }
  for (const auto& id : promote) {
    int from, to_dir = -1;
    double promote_fraction = 1.0;
    {
      MutexLock lock(&mu_);
      auto it = index_.find(id);
      if (it == index_.end() || it->second.tier == 0) continue;
      from = it->second.tier;
      const Tier& up = tiers_[from - 1];
      // Only into room below the high watermark, so promotion never causes a demotion.
      promote_fraction = up.level.high;
      to_dir = FitLocked(from - 1, it->second.file_bytes, promote_fraction);
    }
    if (to_dir >= 0) MoveBlock(id, from, from - 1, to_dir, promote_fraction);
  }
  // Bottom level first, so a demotion finds room below; a demotion can push the level below over
  // its high mark again, hence a few passes.
  for (size_t pass = 0; pass <= TierCount(); ++pass) {
    bool any = false;
    for (int t = static_cast<int>(TierCount()) - 1; t >= 0; --t) {
      bool over;
      {
        MutexLock lock(&mu_);
        const Tier& tier = tiers_[t];
        over = static_cast<double>(tier.Used()) > tier.level.high * static_cast<double>(tier.Quota());
      }
      if (over) {
        any = true;
        ReserveTier(t);
      }
    }
    if (!any) break;
  }
}

}  // namespace granary::worker
