#include "worker/block_store.h"

#include <dirent.h>
#include <fcntl.h>
#include <spdlog/spdlog.h>
#include <sys/stat.h>
#include <unistd.h>

#include <sys/statfs.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>
#include <tuple>

#include "common/fs.h"
#include "common/units.h"
#include "worker/store/block_file.h"

namespace granary::worker {

uint64_t BlockFileBytes(uint64_t data_len) { return store::BlockFileBytes(data_len); }

BlockLease& BlockLease::operator=(BlockLease&& o) noexcept {
  if (this != &o) {
    Reset();
    fd = o.fd;
    data_offset = o.data_offset;
    length = o.length;
    store_ = o.store_;
    ids_ = std::move(o.ids_);
    o.fd = -1;
    o.store_ = nullptr;
    o.ids_.clear();
  }
  return *this;
}

void BlockLease::Reset() {
  CloseFd();
  if (store_ != nullptr) {
    for (const auto& id : ids_) store_->Release(id);
  }
  store_ = nullptr;
  ids_.clear();
}

void BlockLease::CloseFd() {
  if (fd >= 0) close(fd);
  fd = -1;
}

size_t FileKeyHash::operator()(const FileKey& k) const {
  uint64_t a;
  std::memcpy(&a, k.data(), 8);
  return static_cast<size_t>(a);
}

size_t BlockIdHash::operator()(const BlockId& id) const {
  uint64_t a;
  std::memcpy(&a, id.key.data(), 8);
  return static_cast<size_t>(a ^ (id.index * 0x9e3779b97f4a7c15ull));
}

namespace {
constexpr long kTmpfsMagic = 0x01021994;
constexpr long kRamfsMagic = 0x858458f6;
}  // namespace

uint64_t BlockStore::Tier::Quota() const {
  uint64_t q = 0;
  for (const auto& d : dirs) q += d.quota;
  return q;
}
uint64_t BlockStore::Tier::Used() const {
  uint64_t u = 0;
  for (const auto& d : dirs) u += d.used + d.reserved;
  return u;
}
uint64_t BlockStore::Tier::Occupied() const {
  uint64_t u = 0;
  for (const auto& d : dirs) u += d.used;
  return u;
}

StatusOr<std::unique_ptr<BlockStore>> BlockStore::Open(const StoreOptions& options) {
  if (options.levels.empty()) return InvalidArgumentError("the block store needs at least one level");
  std::unique_ptr<BlockStore> store(new BlockStore(options));
  RETURN_IF_ERROR(store->Init());
  if (options.background) store->thread_ = std::thread([s = store.get()] { s->Loop(); });
  return store;
}

StatusOr<std::unique_ptr<BlockStore>> BlockStore::Open(const std::string& dir, uint64_t quota) {
  StoreOptions o;
  TierLevel l;
  l.medium = "SSD";
  l.paths = {dir};
  l.quotas = {quota};
  l.high = 1.0;
  l.low = 1.0;
  o.levels = {l};
  o.background = false;
  return Open(o);
}

BlockStore::~BlockStore() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void BlockStore::SetRemovedListener(RemovedFn fn) {
  std::lock_guard<std::mutex> lock(mu_);
  on_removed_ = std::move(fn);
}

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
    std::lock_guard<std::mutex> lock(mu_);
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
    std::lock_guard<std::mutex> lock(mu_);
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
  std::lock_guard<std::mutex> lock(mu_);
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

std::string BlockStore::PathLocked(const BlockId& id, int tier, int dir) const {
  return store::DataPath(tiers_[tier].dirs[dir].path, id.key);
}

std::string BlockStore::SidecarLocked(const BlockId& id, int tier, int dir) const {
  return store::SidecarPath(tiers_[tier].dirs[dir].path, id.key, id.index);
}

void BlockStore::HoldFileLocked(const std::string& path) { ++file_users_[path]; }

void BlockStore::DropFileLocked(const std::string& path) {
  auto it = file_users_.find(path);
  if (it == file_users_.end() || --it->second > 0) return;
  file_users_.erase(it);
  unlink(path.c_str());  // under the lock: a writer about to use the path holds it first
}

int BlockStore::FitFileLocked(int tier, const FileKey& key, uint64_t bytes, double fraction) const {
  const auto& dirs = tiers_[tier].dirs;
  for (size_t d = 0; d < dirs.size() && dirs.size() > 1; ++d) {
    if (!file_users_.count(store::DataPath(dirs[d].path, key))) continue;
    uint64_t limit = static_cast<uint64_t>(static_cast<double>(dirs[d].quota) * fraction);
    if (dirs[d].used + dirs[d].reserved + bytes <= limit) return static_cast<int>(d);
  }
  return FitLocked(tier, bytes, fraction);
}

std::string BlockStore::TmpPath(int tier, int dir) {
  std::string base;
  {
    std::lock_guard<std::mutex> lock(mu_);
    base = tiers_[tier].dirs[dir].path;
  }
  return base + "/tmp/" + std::to_string(getpid()) + "-" + std::to_string(tmp_seq_++);
}

std::string BlockStore::PathOf(const BlockId& id) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = index_.find(id);
  if (it == index_.end()) return "";
  return PathLocked(id, it->second.tier, it->second.dir);
}

std::string BlockStore::SidecarPathOf(const BlockId& id) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = index_.find(id);
  if (it == index_.end()) return "";
  return SidecarLocked(id, it->second.tier, it->second.dir);
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
      if (st.code() == Code::kAlreadyExists) {
        spdlog::info("dropping a second copy of a block (a move was interrupted): {}", sidecar);
        auto sc = store::ReadSidecar(sidecar);
        if (sc.ok()) store::PunchData(data, sc->offset, sc->data_len);
      } else {
        spdlog::warn("discarding cached block: {}", st.message());
        std::lock_guard<std::mutex> lock(mu_);
        ++corrupt_;
      }
      unlink(sidecar.c_str());
    }
    // Data files no block was found in: debris of interrupted writes and removals.
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& data : data_files) {
      if (!file_users_.count(data)) {
        unlink(data.c_str());
        ++debris;
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
  std::lock_guard<std::mutex> lock(mu_);
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
  index_.emplace(id, e);
  return Status::OK();
}

Status BlockStore::LoadPins() {
  std::string path = options_.levels.back().paths[0] + "/pins";
  std::ifstream in(path);
  if (!in) return Status::OK();
  std::string line;
  std::lock_guard<std::mutex> lock(mu_);
  while (std::getline(in, line)) {
    FileKey k;
    if (ParseFileKeyHex(line, &k)) pins_.insert(k);
  }
  return Status::OK();
}

Status BlockStore::SavePins() {
  std::string body;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& k : pins_) body += FileKeyHex(k) + "\n";
  }
  std::string path = options_.levels.back().paths[0] + "/pins";
  Status st = WriteFileAtomic(path, body);
  if (st.ok()) chmod(path.c_str(), 0600);
  return st;
}

CachePolicy BlockStore::PolicyLocked(uint64_t mount_id) const {
  auto it = mount_policy_.find(mount_id);
  return it == mount_policy_.end() ? options_.policy : it->second;
}

void BlockStore::SetMountPolicy(uint64_t mount_id, CachePolicy policy) {
  std::lock_guard<std::mutex> lock(mu_);
  mount_policy_[mount_id] = policy;
}

void BlockStore::ListLocked(const BlockId& id, Entry& e) {
  if (e.pinned || e.doomed) return;
  tiers_[e.tier].lru[e.meta.mount_id].emplace(e.seq, id);
}

void BlockStore::UnlistLocked(Entry& e) {
  auto& lists = tiers_[e.tier].lru;
  auto it = lists.find(e.meta.mount_id);
  if (it == lists.end()) return;
  it->second.erase(e.seq);
  if (it->second.empty()) lists.erase(it);
}

void BlockStore::TouchLocked(const BlockId& id, Entry& e) {
  UnlistLocked(e);
  e.seq = ++seq_;
  ListLocked(id, e);
}

void BlockStore::RemoveLocked(const BlockId& id, Removal* r) {
  auto it = index_.find(id);
  if (it == index_.end()) return;
  Entry& e = it->second;
  UnlistLocked(e);
  tiers_[e.tier].dirs[e.dir].used -= e.file_bytes;
  tiers_[e.tier].nblocks--;
  // Under the lock: a later Put of the same block may write the same sidecar and range.
  unlink(SidecarLocked(id, e.tier, e.dir).c_str());
  std::string data = PathLocked(id, e.tier, e.dir);
  store::PunchData(data, e.meta.offset, e.meta.length);
  DropFileLocked(data);
  r->removed.push_back(e.meta);
  index_.erase(it);
}

void BlockStore::Finish(Removal& r) {
  if (r.removed.empty()) return;
  RemovedFn fn;
  {
    std::lock_guard<std::mutex> lock(mu_);
    fn = on_removed_;
  }
  if (fn) {
    for (const auto& m : r.removed) fn(m);
  }
}

int BlockStore::FitLocked(int tier, uint64_t bytes, double fraction) const {
  int best = -1;
  uint64_t best_free = 0;
  const auto& dirs = tiers_[tier].dirs;
  for (size_t d = 0; d < dirs.size(); ++d) {
    uint64_t limit = static_cast<uint64_t>(static_cast<double>(dirs[d].quota) * fraction);
    uint64_t taken = dirs[d].used + dirs[d].reserved;
    if (taken + bytes > limit) continue;
    uint64_t free = limit - taken;
    if (best < 0 || free > best_free) {
      best = static_cast<int>(d);
      best_free = free;
    }
  }
  return best;
}

bool BlockStore::PickVictimLocked(int tier, Purpose purpose, uint64_t for_mount, BlockId* out) const {
  store::VictimQuery q;
  q.purpose = purpose;
  q.for_mount = for_mount;
  q.policy = [this](uint64_t mount) { return PolicyLocked(mount); };
  q.busy = [this](const BlockId& id) {
    const Entry& e = index_.at(id);
    return e.readers > 0 || e.moving;
  };
  auto victim = store::PickVictim(tiers_[tier].lru, q);
  if (victim) *out = *victim;
  return victim.has_value();
}

bool BlockStore::EvictOneLocked(int tier, Purpose purpose, uint64_t for_mount, Removal* r) {
  BlockId victim;
  if (!PickVictimLocked(tier, purpose, for_mount, &victim)) return false;
  RemoveLocked(victim, r);
  tiers_[tier].evictions++;
  return true;
}

StatusOr<size_t> BlockStore::Read(const BlockId& id, uint64_t offset, size_t length, char* out) {
  return ReadInternal(id, offset, length, out, true);
}

StatusOr<size_t> BlockStore::ReadInternal(const BlockId& id, uint64_t offset, size_t length, char* out, bool account,
                                          BlockLease* lease) {
  uint64_t data_len, block_offset;
  std::string path;
  std::shared_ptr<const std::vector<uint64_t>> sums;
  int tier;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = index_.find(id);
    if (it == index_.end() || it->second.doomed) {
      if (account) {
        for (auto& t : tiers_) t.misses++;
      }
      return NotFoundError("block not cached");
    }
    Entry& e = it->second;
    ++e.readers;
    data_len = e.meta.length;
    block_offset = e.meta.offset;
    sums = e.sums;
    tier = e.tier;
    path = PathLocked(id, e.tier, e.dir);
    if (account) {
      TouchLocked(id, e);
      for (int t = 0; t < tier; ++t) tiers_[t].misses++;
      tiers_[tier].hits++;
    }
  }
  auto release = [&](bool corrupt) {
    Removal r;
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = index_.find(id);
      if (it != index_.end()) {
        --it->second.readers;
        if (corrupt) ++corrupt_;
        if (corrupt || (it->second.doomed && it->second.readers == 0)) RemoveLocked(id, &r);
      }
      if (account && !corrupt && tier > 0 && options_.promote && promote_queue_.size() < 4096) {
        promote_queue_.push_back(id);
        wake_ = true;
      }
    }
    Finish(r);
  };
  if (offset >= data_len) {
    release(false);
    return size_t{0};
  }
  length = std::min<uint64_t>(length, data_len - offset);
  std::string span;
  int fd = -1;
  Status st = store::ReadRange(path, *sums, block_offset, data_len, offset, length, &span, lease ? &fd : nullptr);
  if (!st.ok()) {
    if (!st.IsDataLoss()) {
      release(false);
      return st;
    }
    spdlog::warn("cached block is corrupt, discarding it: {}", st.message());
    release(true);
    return st;
  }
  if (lease != nullptr) {
    // The verified range goes out through this descriptor; the reader count taken above is the
    // lease, given back when it ends.
    lease->fd = fd;
    lease->data_offset = block_offset + offset;
    lease->length = length;
    lease->store_ = this;
    lease->ids_ = {id};
    std::lock_guard<std::mutex> lock(mu_);
    ++leases_;
    return length;
  }
  std::memcpy(out, span.data(), length);
  release(false);
  return length;
}

StatusOr<BlockLease> BlockStore::Lease(const BlockId& id, uint64_t offset, size_t length) {
  BlockLease lease;
  ASSIGN_OR_RETURN(size_t n, ReadInternal(id, offset, length, nullptr, true, &lease));
  if (lease.fd < 0) lease.length = n;  // nothing at that offset: no lease was taken
  return lease;
}

StatusOr<BlockLease> BlockStore::LeaseFile(const FileKey& key, uint64_t blocks, uint64_t file_size) {
  if (blocks == 0) return InvalidArgumentError("a file lease needs at least one block");
  BlockLease lease;
  std::string path;
  {
    std::lock_guard<std::mutex> lock(mu_);
    int tier = -1, dir = -1;
    for (uint64_t i = 0; i < blocks; ++i) {
      auto it = index_.find(BlockId{key, i});
      if (it == index_.end() || it->second.doomed) return NotFoundError("block " + std::to_string(i) + " not cached");
      if (i == 0) tier = it->second.tier, dir = it->second.dir;
      if (it->second.tier != tier || it->second.dir != dir) {
        return NotFoundError("the file's blocks are in more than one cache directory");
      }
    }
    for (uint64_t i = 0; i < blocks; ++i) {
      BlockId id{key, i};
      Entry& e = index_.at(id);
      ++e.readers;
      TouchLocked(id, e);
      for (int t = 0; t < tier; ++t) tiers_[t].misses++;
      tiers_[tier].hits++;
      lease.ids_.push_back(id);
    }
    ++leases_;
    lease.store_ = this;
    path = PathLocked(BlockId{key, 0}, tier, dir);
  }
  lease.length = file_size;
  lease.fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (lease.fd < 0) return ErrnoError(errno, "open " + path);  // the lease ends with `lease`
  struct stat st {};
  if (fstat(lease.fd, &st) != 0 || static_cast<uint64_t>(st.st_size) != file_size) {
    return NotFoundError("the data file is not the file's length");
  }
  return lease;
}

void BlockStore::Release(const BlockId& id) {
  Removal r;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = index_.find(id);
    if (it != index_.end() && it->second.readers > 0) {
      Entry& e = it->second;
      --e.readers;
      if (e.doomed && e.readers == 0) {
        RemoveLocked(id, &r);
      } else if (e.tier > 0 && options_.promote && promote_queue_.size() < 4096) {
        promote_queue_.push_back(id);  // read from a lower level: a candidate to move up
        wake_ = true;
      }
    }
  }
  Finish(r);
}

Status BlockStore::Put(const BlockMeta& meta, std::string_view data) {
  if (data.size() != meta.length) return InvalidArgumentError("block length does not match its data");
  if (meta.id.index == 0 && meta.offset != 0) return InvalidArgumentError("block 0 must start at offset 0");
  if (meta.id.index > 0 && meta.offset == 0) return InvalidArgumentError("a block after the first needs its offset");
  uint64_t file_bytes = store::BlockFileBytes(data.size());
  Removal r;
  int tier = -1, dir = -1;
  std::string path, sidecar;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (index_.count(meta.id) || putting_.count(meta.id)) return Status::OK();
    for (size_t t = 0; t < tiers_.size() && tier < 0; ++t) {
      int d = FitFileLocked(static_cast<int>(t), meta.id.key, file_bytes, 1.0);
      if (d >= 0) tier = static_cast<int>(t), dir = d;
    }
    // Full everywhere: evict what the policy allows, bottom level first.
    for (int t = static_cast<int>(tiers_.size()) - 1; t >= 0 && tier < 0; --t) {
      int d;
      while ((d = FitLocked(t, file_bytes, 1.0)) < 0) {
        if (!EvictOneLocked(t, Purpose::kAdmit, meta.mount_id, &r)) break;
      }
      if (d >= 0) tier = t, dir = d;
    }
    if (tier < 0) {
      ++rejected_;
    } else {
      tiers_[tier].dirs[dir].reserved += file_bytes;
      path = PathLocked(meta.id, tier, dir);
      sidecar = SidecarLocked(meta.id, tier, dir);
      HoldFileLocked(path);  // not unlinked while this block is written into it
      putting_.insert(meta.id);
      const Tier& tr = tiers_[tier];
      if (static_cast<double>(tr.Used()) > tr.level.high * static_cast<double>(tr.Quota())) {
        wake_ = true;
        cv_.notify_all();
      }
    }
  }
  Finish(r);
  if (tier < 0) {
    return ResourceExhaustedError("no room in the cache for a block of " + std::to_string(file_bytes) +
                                  " bytes (everything cached is pinned, being read, or kept by the shuffle policy)");
  }
  auto abandon = [&] {  // needs mu_: the range written so far is nobody's
    tiers_[tier].dirs[dir].reserved -= file_bytes;
    store::PunchData(path, meta.offset, meta.length);
    DropFileLocked(path);
  };
  std::string tmp = TmpPath(tier, dir);
  auto sums = std::make_shared<const std::vector<uint64_t>>(store::ChunkSums(data));
  Status st = store::WriteData(path, meta.offset, data);
  if (st.ok()) {
    st = store::WriteSidecarTmp(tmp, store::EncodeSidecar(meta.id.key, meta.id.index, meta.mount_id, meta.offset, data));
  }
  // Committed under the lock, so no removal of an older copy can unlink the new sidecar.
  std::lock_guard<std::mutex> lock(mu_);
  putting_.erase(meta.id);
  if (!st.ok()) {
    abandon();
    return st;
  }
  if (auto won = index_.find(meta.id); won != index_.end()) {  // a concurrent Put of the same block won
    unlink(tmp.c_str());
    if (won->second.tier != tier || won->second.dir != dir) {
      abandon();  // its bytes are elsewhere
    } else {
      tiers_[tier].dirs[dir].reserved -= file_bytes;  // the same range, the same bytes
      DropFileLocked(path);
    }
    return Status::OK();
  }
  if (Status cs = store::CommitSidecar(tmp, sidecar); !cs.ok()) {
    unlink(tmp.c_str());
    abandon();
    return cs;
  }
  tiers_[tier].dirs[dir].reserved -= file_bytes;
  Entry e;
  e.meta = meta;
  e.file_bytes = file_bytes;
  e.sums = std::move(sums);
  e.tier = tier;
  e.dir = dir;
  e.seq = ++seq_;
  e.pinned = pins_.count(meta.id.key) > 0;
  tiers_[tier].dirs[dir].used += file_bytes;
  tiers_[tier].nblocks++;
  auto [it, _] = index_.emplace(meta.id, e);
  ListLocked(meta.id, it->second);
  return Status::OK();
}

Status BlockStore::Pin(const std::vector<FileKey>& keys, bool pin) {
  std::lock_guard<std::mutex> plock(pins_mu_);
  {
    std::lock_guard<std::mutex> lock(mu_);
    std::unordered_set<FileKey, FileKeyHash> set(keys.begin(), keys.end());
    for (const auto& k : keys) {
      if (pin) {
        pins_.insert(k);
      } else {
        pins_.erase(k);
      }
    }
    for (auto& [id, e] : index_) {
      if (!set.count(id.key) || e.pinned == pin) continue;
      UnlistLocked(e);
      e.pinned = pin;
      ListLocked(id, e);
    }
  }
  return SavePins();
}

Status BlockStore::SetPins(const std::vector<FileKey>& keys) {
  std::lock_guard<std::mutex> plock(pins_mu_);
  {
    std::lock_guard<std::mutex> lock(mu_);
    pins_ = std::unordered_set<FileKey, FileKeyHash>(keys.begin(), keys.end());
    for (auto& [id, e] : index_) {
      bool pin = pins_.count(id.key) > 0;
      if (e.pinned == pin) continue;
      UnlistLocked(e);
      e.pinned = pin;
      ListLocked(id, e);
    }
  }
  return SavePins();
}

size_t BlockStore::Free(const std::vector<FileKey>& keys) {
  std::unordered_set<FileKey, FileKeyHash> set(keys.begin(), keys.end());
  Removal r;
  size_t n = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    std::vector<BlockId> now;
    for (auto& [id, e] : index_) {
      if (!set.count(id.key) || e.doomed) continue;
      ++n;
      if (e.readers > 0 || e.moving) {
        UnlistLocked(e);
        e.doomed = true;  // removed by the last reader, or by the move's commit
      } else {
        now.push_back(id);
      }
    }
    for (const auto& id : now) RemoveLocked(id, &r);
  }
  Finish(r);
  return n;
}

bool BlockStore::MoveBlock(const BlockId& id, int from_tier, int to_tier, int to_dir, double fraction) {
  std::string src, src_sidecar, dst, dst_sidecar;
  uint64_t bytes, data_len, offset;
  {
    std::lock_guard<std::mutex> lock(mu_);
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
    std::lock_guard<std::mutex> lock(mu_);
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
        store::PunchData(src, offset, data_len);
        DropFileLocked(src);
      } else if (e.doomed && e.readers == 0) {
        RemoveLocked(id, &r);  // freed while moving
      }
    }
    if (!moved) {  // aborted: a reader arrived, or it was freed or pinned meanwhile
      unlink(tmp.c_str());
      store::PunchData(dst, offset, data_len);
      DropFileLocked(dst);
    }
  }
  Finish(r);
  if (!st.ok()) spdlog::warn("moving a cached block: {}", st.message());
  return moved;
}

void BlockStore::ReserveTier(int t) {
  const bool last = t + 1 == static_cast<int>(tiers_.size());
  for (int guard = 0; guard < 1 << 20; ++guard) {
    Removal r;
    BlockId victim;
    int to_dir = -1;
    bool stuck = false;
    {
      std::lock_guard<std::mutex> lock(mu_);
      const Tier& tier = tiers_[t];
      double target = tier.level.low * static_cast<double>(tier.Quota());
      if (static_cast<double>(tier.Used()) <= target) return;
      if (last) {
        if (!EvictOneLocked(t, Purpose::kWatermark, 0, &r)) return;
      } else {
        if (!PickVictimLocked(t, Purpose::kDemote, 0, &victim)) return;
        const Entry& e = index_.at(victim);
        to_dir = FitLocked(t + 1, e.file_bytes, 1.0);
        // The level below is full: make room there as an admission of this block would.
        while (to_dir < 0 && EvictOneLocked(t + 1, Purpose::kAdmit, e.meta.mount_id, &r)) {
          to_dir = FitLocked(t + 1, e.file_bytes, 1.0);
        }
        if (to_dir < 0) {
          // No room below. An lru block is evicted; a shuffle block stays where it is.
          if (PolicyLocked(e.meta.mount_id) == CachePolicy::kShuffle || !EvictOneLocked(t, Purpose::kWatermark, 0, &r)) {
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
  std::lock_guard<std::mutex> guard(move_mu_);
  std::vector<BlockId> promote;
  {
    std::lock_guard<std::mutex> lock(mu_);
    promote.swap(promote_queue_);
    wake_ = false;
  }
  for (const auto& id : promote) {
    int from, to_dir = -1;
    double promote_fraction = 1.0;
    {
      std::lock_guard<std::mutex> lock(mu_);
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
  for (size_t pass = 0; pass <= tiers_.size(); ++pass) {
    bool any = false;
    for (int t = static_cast<int>(tiers_.size()) - 1; t >= 0; --t) {
      bool over;
      {
        std::lock_guard<std::mutex> lock(mu_);
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

StatusOr<bool> BlockStore::VerifyOne(const BlockId& id) {
  uint64_t len;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = index_.find(id);
    if (it == index_.end()) return false;
    len = it->second.meta.length;
  }
  // Reading verifies every chunk and removes the block when one fails; unaccounted, so the scrub
  // changes neither the LRU order nor the hit counters.
  std::string buf(len, '\0');
  auto n = ReadInternal(id, 0, len, buf.data(), false);
  if (n.ok()) scrubbed_++;
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
      std::lock_guard<std::mutex> lock(mu_);
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
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait_for(lock, options_.reserve_interval, [&] { return stop_ || wake_; });
      if (stop_) return;
    }
    Reserve();
    if (options_.scrub_bandwidth == 0) continue;
    auto now = std::chrono::steady_clock::now();
    budget = std::min(budget + std::chrono::duration<double>(now - last).count() * static_cast<double>(options_.scrub_bandwidth),
                      static_cast<double>(options_.scrub_bandwidth));  // at most a second's worth saved up
    last = now;
    while (budget > 0) {
      if (todo.empty()) {
        todo = List();  // the next full pass
        if (todo.empty()) break;
      }
      BlockMeta m = todo.back();
      todo.pop_back();
      budget -= static_cast<double>(m.length);
      auto r = VerifyOne(m.id);
      if (r.ok() && *r) spdlog::warn("the scrub discarded a corrupt cached block");
    }
  }
}

bool BlockStore::Contains(const BlockId& id) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = index_.find(id);
  return it != index_.end() && !it->second.doomed;
}

int BlockStore::LevelOf(const BlockId& id) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = index_.find(id);
  return it == index_.end() || it->second.doomed ? -1 : it->second.tier;
}

std::vector<BlockMeta> BlockStore::List() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<BlockMeta> out;
  out.reserve(index_.size());
  for (const auto& [id, e] : index_) {
    if (!e.doomed) out.push_back(e.meta);
  }
  return out;
}

BlockStoreStats BlockStore::Stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  BlockStoreStats s;
  for (const auto& t : tiers_) {
    TierStats ts;
    ts.medium = t.level.medium;
    for (const auto& d : t.dirs) ts.paths.push_back(d.path);
    ts.high = t.level.high;
    ts.low = t.level.low;
    ts.capacity = t.Quota();
    ts.used = t.Occupied();
    ts.blocks = t.nblocks;
    ts.hits = t.hits;
    ts.misses = t.misses;
    ts.evictions = t.evictions;
    ts.demotions = t.demotions;
    ts.promotions = t.promotions;
    s.capacity += ts.capacity;
    s.used += ts.used;
    s.blocks += ts.blocks;
    s.evictions += ts.evictions;
    s.tiers.push_back(std::move(ts));
  }
  for (const auto& [id, e] : index_) s.pinned_blocks += e.pinned ? 1 : 0;
  s.corrupt = corrupt_;
  s.scrubbed = scrubbed_;
  s.rejected = rejected_;
  s.leases = leases_;
  return s;
}

}  // namespace granary::worker
