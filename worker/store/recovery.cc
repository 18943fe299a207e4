// BlockStore, opening: the levels' directories, the index rebuilt from the sidecars (dropping
// what a crash or a damaged disk left), the lowered-quota trim, and the pins file.
#include "worker/block_store.h"

#include <dirent.h>
#include <fcntl.h>
#include <spdlog/spdlog.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <fstream>
#include <tuple>

#include "common/fs.h"
#include "common/units.h"
#include "worker/store/block_file.h"

namespace granary::worker {

namespace {
constexpr long kTmpfsMagic = 0x01021994;
constexpr long kRamfsMagic = 0x858458f6;
}  // namespace

Status BlockStore::Init() {
  for (size_t t = 0; t < options_.levels.size(); ++t) {
    const TierLevel& l = options_.levels[t];
    Tier tier;
    tier.level = l;
    for (size_t d = 0; d < l.paths.size(); ++d) {
      const std::string& path = l.paths[d];
      std::string what = "worker.tieredstore " + l.medium + " path " + path;
      RETURN_IF_ERROR(MakeDirs(path, 0700).WithContext(what));
      chmod(path.c_str(), 0700);
      RETURN_IF_ERROR(MakeDirs(path + "/blocks", 0700).WithContext(what));
      RETURN_IF_ERROR(MakeDirs(path + "/tmp", 0700).WithContext(what));
      struct statfs fs;
      if (statfs(path.c_str(), &fs) != 0) return ErrnoError(errno, what);
      if (l.medium == "MEM" && options_.require_tmpfs_for_mem && fs.f_type != kTmpfsMagic &&
          fs.f_type != kRamfsMagic) {
        return InvalidArgumentError(what + " is not on tmpfs: a MEM level must live in memory (use /dev/shm/... "
                                    "or a tmpfs mount), or declare the level as SSD or HDD");
      }
      if (std::string dev = Ext4WithoutJournal(path); !dev.empty()) {
        spdlog::warn("{} is on ext4 without a journal ({}): it scans past every recently deleted inode when it "
                     "creates a file: after deletions (evictions, frees) each new block file costs far more CPU than on a "
                     "journaled ext4, XFS or tmpfs (docs/configuration.md, \"Sizing the cache\")",
                     what, dev);
      }
      uint64_t size = static_cast<uint64_t>(fs.f_blocks) * fs.f_bsize;
      if (l.quotas[d] > size) {
        spdlog::warn("{}: quota {} is larger than the file system ({}); writes may fail with ENOSPC", what,
                     FormatBytes(l.quotas[d]), FormatBytes(size));
      }
      tier.dirs.push_back(Dir{path, l.quotas[d], 0, 0});
    }
    tiers_.push_back(std::move(tier));
  }
  RETURN_IF_ERROR(LoadPins());
  for (size_t t = 0; t < tiers_.size(); ++t) {
    for (size_t d = 0; d < tiers_[t].dirs.size(); ++d) RETURN_IF_ERROR(ScanDir(static_cast<int>(t), static_cast<int>(d)));
  }
  {
    // Older files first in LRU order; sequence numbers must be unique (they key the policy lists).
    MutexLock lock(&mu_);
    std::vector<std::pair<uint64_t, BlockId>> order;
    order.reserve(index_.size());
    for (const auto& [id, e] : index_) order.emplace_back(e.seq, id);
    std::sort(order.begin(), order.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
    for (const auto& [mtime, id] : order) {
      Entry& e = index_.at(id);
      e.seq = ++seq_;
      ListLocked(id, e);
    }
  }
  // A lowered quota: bring every directory within it, oldest unpinned blocks first (then pinned
  // ones: the quota wins).
  Removal r;
  {
    MutexLock lock(&mu_);
    for (size_t t = 0; t < tiers_.size(); ++t) {
      for (size_t d = 0; d < tiers_[t].dirs.size(); ++d) {
        Dir& dir = tiers_[t].dirs[d];
        if (dir.used <= dir.quota) continue;
        std::vector<std::tuple<bool, uint64_t, BlockId>> order;
        for (const auto& [id, e] : index_) {
          if (e.tier == static_cast<int>(t) && e.dir == static_cast<int>(d)) order.emplace_back(e.pinned, e.seq, id);
        }
        std::sort(order.begin(), order.end(), [](const auto& a, const auto& b) {
          return std::tie(std::get<0>(a), std::get<1>(a)) < std::tie(std::get<0>(b), std::get<1>(b));
        });
        for (size_t i = 0; i < order.size() && dir.used > dir.quota; ++i) {
          RemoveLocked(std::get<2>(order[i]), &r);
          tiers_[t].evictions++;
        }
      }
    }
  }
  Finish(r);
  MutexLock lock(&mu_);
  for (const auto& t : tiers_) {
    spdlog::info("cache level {}: {} blocks, {} of {} ({})", t.level.medium, t.nblocks, FormatBytes(t.Occupied()),
                 FormatBytes(t.Quota()), [&] {
                   std::string p;
                   for (const auto& d : t.dirs) p += (p.empty() ? "" : ",") + d.path;
                   return p;
                 }());
  }
  return Status::OK();
}

Status BlockStore::ScanDir(int tier, int dir) {
  std::string root = tiers_[tier].dirs[dir].path;
  // Half-written sidecars from a crash.
  if (DIR* d = opendir((root + "/tmp").c_str())) {
    while (dirent* de = readdir(d)) {
      if (de->d_name[0] != '.') unlink((root + "/tmp/" + de->d_name).c_str());
    }
    closedir(d);
  }
  DIR* top = opendir((root + "/blocks").c_str());
  if (top == nullptr) return ErrnoError(errno, "open " + root + "/blocks");
  size_t debris = 0;
  while (dirent* sub = readdir(top)) {
    if (sub->d_name[0] == '.') continue;
    std::string subdir = root + "/blocks/" + sub->d_name;
    DIR* d = opendir(subdir.c_str());
    if (d == nullptr) continue;
    std::vector<std::string> names;
    while (dirent* de = readdir(d)) {
      if (de->d_name[0] != '.') names.push_back(de->d_name);
    }
    closedir(d);
    std::unordered_set<std::string> data_files;
    std::vector<std::tuple<FileKey, uint64_t, std::string>> sidecars;
    for (const std::string& name : names) {
      FileKey key;
      uint64_t index = 0;
      bool sidecar = false;
      if (!store::ParseName(name, &key, &index, &sidecar)) {
        unlink((subdir + "/" + name).c_str());  // not ours, or a cache of an older format
        ++debris;
      } else if (sidecar) {
        sidecars.emplace_back(key, index, subdir + "/" + name);
      } else {
        data_files.insert(subdir + "/" + name);
      }
    }
    for (const auto& [key, index, sidecar] : sidecars) {
      std::string data = subdir + "/" + FileKeyHex(key);
      Status st = data_files.count(data) ? LoadOne(tier, dir, key, index, data, sidecar)
                                         : DataLossError(sidecar + ": its data file is missing");
      if (st.ok()) continue;
      struct stat sst {};  // looked at only for a sidecar that did not load: no stat per good block
      if (stat(sidecar.c_str(), &sst) == 0 && store::IsTornSidecar(static_cast<uint64_t>(sst.st_size))) {
        ++debris;  // a Put's sidecar write that a crash cut short: its block never was
      } else if (st.code() == Code::kAlreadyExists) {
        spdlog::info("dropping a second copy of a block (a move was interrupted): {}", sidecar);
        auto sc = store::ReadSidecar(sidecar);
        if (sc.ok()) store::PunchData(data, sc->offset, sc->data_len);
      } else {
        spdlog::warn("discarding cached block: {}", st.message());
        MutexLock lock(&mu_);
        ++corrupt_;
      }
      unlink(sidecar.c_str());
    }
    // Data files no block was found in: debris of interrupted writes and removals. One that holds
    // several blocks may be a passthrough backing file the kernel kept open across this worker's
    // restart (no lease says so): none of its ranges is punched, as if it were leased whole.
    MutexLock lock(&mu_);
    for (const auto& data : data_files) {
      auto users = file_users_.find(data);
      if (users == file_users_.end()) {
        unlink(data.c_str());
        ++debris;
      } else if (users->second > 1) {
        whole_leased_.insert(data);
      }
    }
  }
  closedir(top);
  if (debris > 0) spdlog::info("{}: removed {} files of interrupted writes or an older cache format", root, debris);
  return Status::OK();
}

Status BlockStore::LoadOne(int tier, int dir, const FileKey& key, uint64_t index, const std::string& data,
                           const std::string& sidecar) {
  ASSIGN_OR_RETURN(store::Sidecar sc, store::ReadSidecar(sidecar));
  if (sc.key != key || sc.index != index) return DataLossError(sidecar + ": sidecar names another block");
  struct stat st {};
  if (stat(data.c_str(), &st) != 0) return ErrnoError(errno, "stat " + data);
  if (static_cast<uint64_t>(st.st_size) < sc.offset + sc.data_len) {
    return DataLossError(data + ": block " + std::to_string(index) + " lies past the end of its data file");
  }
  struct stat mst {};
  stat(sidecar.c_str(), &mst);
  int64_t mtime = mst.st_mtim.tv_sec * 1000000000ll + mst.st_mtim.tv_nsec;
  BlockId id{key, index};
  MutexLock lock(&mu_);
  if (index_.count(id)) return AlreadyExistsError(sidecar);
  Entry e;
  e.meta = BlockMeta{id, sc.mount_id, sc.data_len, sc.offset};
  e.file_bytes = store::BlockFileBytes(sc.data_len);
  e.sums = std::make_shared<const std::vector<uint64_t>>(std::move(sc.sums));
  e.tier = tier;
  e.dir = dir;
  e.pinned = pins_.count(id.key) > 0;
  // The sidecar's mtime (when the block was written or moved) orders blocks until Init gives them
  // unique sequence numbers and lists them.
  e.seq = static_cast<uint64_t>(std::max<int64_t>(mtime, 0));
  tiers_[tier].dirs[dir].used += e.file_bytes;
  tiers_[tier].nblocks++;
  HoldFileLocked(data);
  if (index_.emplace(id, e).second && e.pinned) ++pinned_blocks_;
  AccountLocked(e.meta, +1);
  return Status::OK();
}

Status BlockStore::LoadPins() {
  std::string path = options_.levels.back().paths[0] + "/pins";
  std::ifstream in(path);
  if (!in) return Status::OK();
  std::string line;
  MutexLock lock(&mu_);
  while (std::getline(in, line)) {
    FileKey k;
    if (ParseFileKeyHex(line, &k)) pins_.insert(k);
  }
  return Status::OK();
}

Status BlockStore::SavePins() {
  std::string body;
  {
    MutexLock lock(&mu_);
    for (const auto& k : pins_) body += FileKeyHex(k) + "\n";
  }
  std::string path = options_.levels.back().paths[0] + "/pins";
  Status st = WriteFileAtomic(path, body);
  if (st.ok()) chmod(path.c_str(), 0600);
  return st;
}

}  // namespace granary::worker
