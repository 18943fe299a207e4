// BlockStore's facade: reads, leases, writes, pins and frees (the design note is in the header).
// The rest of the class lives beside it, one job per file (as RocksDB splits DBImpl):
//   store/recovery.cc  opening the levels, rebuilding the index from the sidecars, the pins file
//   store/tiers.cc     watermarks: the reserver's passes, demotion and promotion (MoveBlock)
//   store/scrub.cc     the background thread: start-up scrub, continuous scrub, reserver ticks
//   store/block_file   the on-disk format;  store/eviction  the victim choice (pure)
#include "worker/block_store.h"

#include <fcntl.h>
#include <spdlog/spdlog.h>
#include <sys/stat.h>
#include <unistd.h>


#include <algorithm>
#include <cerrno>
#include <cstring>

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
    MutexLock lock(&mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void BlockStore::SetRemovedListener(RemovedFn fn) {
  MutexLock lock(&mu_);
  on_removed_ = std::move(fn);
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
  whole_leased_.erase(path);
  unlink(path.c_str());  // under the lock: a writer about to use the path holds it first
}

void BlockStore::LetGoRangeLocked(const std::string& path, uint64_t offset, uint64_t len, bool doomed) {
  auto users = file_users_.find(path);
  const int others = users == file_users_.end() ? 0 : users->second - 1;
  int others_doomed = 0;
  if (auto d = file_doomed_.find(path); d != file_doomed_.end()) {
    others_doomed = d->second - (doomed ? 1 : 0);
    if (doomed && --d->second <= 0) file_doomed_.erase(d);
  }
  if (others > others_doomed) PunchLocked(path, offset, len);
  DropFileLocked(path);
}

void BlockStore::PunchLocked(const std::string& path, uint64_t offset, uint64_t len) {
  if (!whole_leased_.count(path)) store::PunchData(path, offset, len);
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
    MutexLock lock(&mu_);
    base = tiers_[tier].dirs[dir].path;
  }
  return base + "/tmp/" + std::to_string(getpid()) + "-" + std::to_string(tmp_seq_++);
}

std::string BlockStore::PathOf(const BlockId& id) const {
  MutexLock lock(&mu_);
  auto it = index_.find(id);
  if (it == index_.end()) return "";
  return PathLocked(id, it->second.tier, it->second.dir);
}

std::string BlockStore::SidecarPathOf(const BlockId& id) const {
  MutexLock lock(&mu_);
  auto it = index_.find(id);
  if (it == index_.end()) return "";
  return SidecarLocked(id, it->second.tier, it->second.dir);
}

CachePolicy BlockStore::PolicyLocked(uint64_t mount_id) const {
  auto it = mount_policy_.find(mount_id);
  return it == mount_policy_.end() ? options_.policy : it->second;
}

void BlockStore::SetMountPolicy(uint64_t mount_id, CachePolicy policy) {
  MutexLock lock(&mu_);
  mount_policy_[mount_id] = policy;
}

void BlockStore::ListLocked(const BlockId& id, Entry& e) {
  if (e.pinned || e.doomed) return;
  (e.meta.elastic ? tiers_[e.tier].elastic : tiers_[e.tier].lru)[e.meta.mount_id].emplace(e.seq, id);
}

void BlockStore::UnlistLocked(Entry& e) {
  auto& lists = e.meta.elastic ? tiers_[e.tier].elastic : tiers_[e.tier].lru;
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
  LetGoRangeLocked(PathLocked(id, e.tier, e.dir), e.meta.offset, e.meta.length, e.doomed);
  r->removed.push_back(e.meta);
  AccountLocked(e.meta, -1);
  if (e.pinned) --pinned_blocks_;
  index_.erase(it);
}

void BlockStore::Finish(Removal& r) {
  if (r.removed.empty()) return;
  RemovedFn fn;
  {
    MutexLock lock(&mu_);
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

bool BlockStore::PickVictimLocked(int tier, Purpose purpose, uint64_t for_mount, bool for_elastic, BlockId* out,
                                  bool elastic_only) const {
  store::VictimQuery q;
  q.purpose = purpose;
  q.for_mount = for_mount;
  q.for_elastic = for_elastic;
  q.elastic_only = elastic_only;
  // The query's callbacks run inside store::PickVictim, called below with mu_ held.
  q.policy = [this](uint64_t mount) NO_THREAD_SAFETY_ANALYSIS { return PolicyLocked(mount); };
  q.busy = [this](const BlockId& id) NO_THREAD_SAFETY_ANALYSIS {
    const Entry& e = index_.at(id);
    return e.readers > 0 || e.moving;
  };
  auto victim = store::PickVictim(tiers_[tier].elastic, tiers_[tier].lru, q);
  if (victim) *out = *victim;
  return victim.has_value();
}

bool BlockStore::EvictOneLocked(int tier, Purpose purpose, uint64_t for_mount, bool for_elastic, Removal* r,
                                bool elastic_only) {
  BlockId victim;
  if (!PickVictimLocked(tier, purpose, for_mount, for_elastic, &victim, elastic_only)) return false;
  RemoveLocked(victim, r);
  tiers_[tier].evictions++;
  return true;
}

StatusOr<size_t> BlockStore::Read(const BlockId& id, uint64_t offset, size_t length, char* out) {
  return ReadInternal(id, offset, length, out, true, nullptr, store::Check::kChunksUnlessAsWritten);
}

StatusOr<size_t> BlockStore::ReadInternal(const BlockId& id, uint64_t offset, size_t length, char* out, bool account,
                                          BlockLease* lease, store::Check check, bool* checked_out) {
  if (checked_out != nullptr) *checked_out = false;
  uint64_t data_len, block_offset;
  std::string path;
  std::shared_ptr<const std::vector<uint64_t>> sums;
  int tier;
  bool own_write;
  std::chrono::steady_clock::time_point written;
  {
    MutexLock lock(&mu_);
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
    own_write = e.own_write;
    written = e.written;
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
      MutexLock lock(&mu_);
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
  int fd = -1;
  if (check == store::Check::kChunksUnlessAsWritten && !own_write) check = store::Check::kChunks;
  // Put by this process moments ago (trust_own_writes): a lease of it, spliced into a reader's
  // reply, reads nothing. Never a copy (a peer, a re-put or a replica stores what a copy returns,
  // with sums of its own: unchecked bytes would be trusted there for good), nor a whole-file check
  // (LeaseFile, the scrub).
  const bool trusted = check == store::Check::kChunksUnlessAsWritten && lease != nullptr &&
                       std::chrono::steady_clock::now() - written < options_.trust_own_writes;
  if (trusted) check = store::Check::kNothing;
  bool checked = false;
  Status st = store::ReadRange(path, *sums, block_offset, data_len, offset, length, lease ? nullptr : out,
                               lease ? &fd : nullptr, check, &checked);
  if (st.ok() && !checked && account && (check == store::Check::kChunksUnlessAsWritten || trusted)) {
    reads_as_written_.fetch_add(1, std::memory_order_relaxed);  // not a read that failed before any check
  }
  if (checked_out != nullptr) *checked_out = checked;
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
    MutexLock lock(&mu_);
    ++leases_;
    return length;
  }
  release(false);
  return length;
}

StatusOr<BlockLease> BlockStore::Lease(const BlockId& id, uint64_t offset, size_t length, bool verify) {
  BlockLease lease;
  ASSIGN_OR_RETURN(size_t n, ReadInternal(id, offset, length, nullptr, true, &lease,
                                          verify ? store::Check::kChunksUnlessAsWritten : store::Check::kNothing));
  if (lease.fd < 0) lease.length = n;  // nothing at that offset: no lease was taken
  return lease;
}

StatusOr<BlockLease> BlockStore::LeaseFile(const FileKey& key, uint64_t blocks, uint64_t file_size, bool verify) {
  if (blocks == 0) return InvalidArgumentError("a file lease needs at least one block");
  BlockLease lease;
  std::string path;
  {
    MutexLock lock(&mu_);
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
    whole_leased_.insert(path);
  }
  lease.length = file_size;
  lease.fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (lease.fd < 0) return ErrnoError(errno, "open " + path);  // the lease ends with `lease`
  struct stat st {};
  if (fstat(lease.fd, &st) != 0 || static_cast<uint64_t>(st.st_size) != file_size) {
    return NotFoundError("the data file is not the file's length");
  }
  for (uint64_t i = 0; verify && i < blocks; ++i) {
    auto damaged = VerifyOne(BlockId{key, i});
    if (!damaged.ok()) return damaged.status();
    if (*damaged) return DataLossError("block " + std::to_string(i) + " of the file failed its checksum");
  }
  return lease;
}

void BlockStore::Release(const BlockId& id) {
  Removal r;
  {
    MutexLock lock(&mu_);
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

Status BlockStore::Put(const BlockMeta& meta, std::string_view data, uint64_t ticket) {
  if (data.size() != meta.length) return InvalidArgumentError("block length does not match its data");
  if (meta.id.index == 0 && meta.offset != 0) return InvalidArgumentError("block 0 must start at offset 0");
  if (meta.id.index > 0 && meta.offset == 0) return InvalidArgumentError("a block after the first needs its offset");
  uint64_t file_bytes = store::BlockFileBytes(data.size());
  Removal r;
  int tier = -1, dir = -1;
  std::string path, sidecar;
  // A free that covers the block after its bytes set out (or while they are written) wins.
  auto freed = [&] { return AbortedError("freed while its bytes were on their way: not cached"); };
  {
    MutexLock lock(&mu_);
    if (ticket == kNoTicket) ticket = frees_;
    if (FreedSinceLocked(ticket, meta)) return freed();
    if (auto have = index_.find(meta.id); have != index_.end()) {
      Entry& e = have->second;
      // A shorter copy, cached for a request that claimed a smaller file, gives way to this one
      // (read whole from the under-storage) once no reader holds it.
      if (e.meta.length < meta.length && e.meta.offset == meta.offset && !e.doomed && e.readers == 0 && !e.moving) {
        RemoveLocked(meta.id, &r);
      } else {
        // Cached already. An elastic copy that is now wanted as a replica becomes one.
        if (e.meta.elastic && !meta.elastic) SetKindLocked(meta.id, e, Kind{false, meta.home});
        return Status::OK();
      }
    }
    if (putting_.count(meta.id)) return Status::OK();
    for (size_t t = 0; t < tiers_.size() && tier < 0; ++t) {
      int d = FitFileLocked(static_cast<int>(t), meta.id.key, file_bytes, 1.0);
      if (d >= 0) tier = static_cast<int>(t), dir = d;
    }
    // Full everywhere: evict what the policy allows, bottom level first — elastic copies on every
    // level before any replica on any level.
    for (bool elastic_only : {true, false}) {
      for (int t = static_cast<int>(tiers_.size()) - 1; t >= 0 && tier < 0; --t) {
        int d;
        while ((d = FitLocked(t, file_bytes, 1.0)) < 0) {
          if (!EvictOneLocked(t, Purpose::kAdmit, meta.mount_id, meta.elastic, &r, elastic_only)) break;
        }
        if (d >= 0) tier = t, dir = d;
      }
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
    return ResourceExhaustedError(
        "no room in the cache for " + std::string(meta.elastic ? "an elastic copy" : "a block") + " of " +
        std::to_string(file_bytes) + " bytes (everything cached is pinned, being read, kept by the shuffle policy" +
        (meta.elastic ? ", or a replica, which an elastic copy never replaces)" : ")"));
  }
  auto abandon = [&]() NO_THREAD_SAFETY_ANALYSIS {  // called with mu_ held: the range written so far is nobody's
    tiers_[tier].dirs[dir].reserved -= file_bytes;
    PunchLocked(path, meta.offset, meta.length);
    DropFileLocked(path);
  };
  // The data, then the sidecar at its own name, both outside the lock: the sidecar is the commit
  // record on disk (a crash after it leaves a block recovery finds whole), and the index entry made
  // below under the lock is the commit for readers. The name is this Put's alone meanwhile: the
  // block is in no index entry (so no removal or move touches its sidecar) and `putting_` keeps a
  // second Put of it out. A temporary file renamed into place under the lock cost a create and a
  // rename per block, the rename with every other Put waiting on mu_ (docs/benchmarks.md, session
  // 40).
  auto sums = std::make_shared<const std::vector<uint64_t>>(store::ChunkSums(data));
  Status st = store::WriteData(path, meta.offset, data, data.size() >= store::kDirectMinBytes);
  if (st.ok()) {
    st = store::WriteSidecar(
        sidecar, store::EncodeSidecar(meta.id.key, meta.id.index, meta.mount_id, meta.offset, data.size(), *sums));
  }
  MutexLock lock(&mu_);
  putting_.erase(meta.id);
  if (!st.ok()) {
    abandon();
    return st;
  }
  // Entered meanwhile by another way into the index (there is none at run time but Put, which
  // putting_ keeps single; kept safe for when there is).
  if (auto won = index_.find(meta.id); won != index_.end()) {
    if (won->second.tier != tier || won->second.dir != dir) {
      unlink(sidecar.c_str());
      abandon();  // its bytes are elsewhere
    } else {
      // The same range and sidecar name: the bytes and sums are the same; the sidecar stays.
      tiers_[tier].dirs[dir].reserved -= file_bytes;
      DropFileLocked(path);
    }
    return Status::OK();
  }
  if (FreedSinceLocked(ticket, meta)) {
    unlink(sidecar.c_str());
    abandon();
    return freed();
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
  e.own_write = true;
  e.written = std::chrono::steady_clock::now();
  tiers_[tier].dirs[dir].used += file_bytes;
  tiers_[tier].nblocks++;
  auto [it, inserted] = index_.emplace(meta.id, e);
  if (inserted && e.pinned) ++pinned_blocks_;
  AccountLocked(meta, +1);
  ListLocked(meta.id, it->second);
  return Status::OK();
}

Status BlockStore::Pin(const std::vector<FileKey>& keys, bool pin) {
  MutexLock plock(&pins_mu_);
  {
    MutexLock lock(&mu_);
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
      pin ? ++pinned_blocks_ : --pinned_blocks_;
      ListLocked(id, e);
    }
  }
  return SavePins();
}

Status BlockStore::SetPins(const std::vector<FileKey>& keys) {
  MutexLock plock(&pins_mu_);
  {
    MutexLock lock(&mu_);
    pins_ = std::unordered_set<FileKey, FileKeyHash>(keys.begin(), keys.end());
    for (auto& [id, e] : index_) {
      bool pin = pins_.count(id.key) > 0;
      if (e.pinned == pin) continue;
      UnlistLocked(e);
      e.pinned = pin;
      pin ? ++pinned_blocks_ : --pinned_blocks_;
      ListLocked(id, e);
    }
  }
  return SavePins();
}

size_t BlockStore::Free(const std::vector<FileKey>& keys, uint64_t stamp) {
  auto set = std::make_shared<const std::unordered_set<FileKey, FileKeyHash>>(keys.begin(), keys.end());
  return FreeIf([set](const BlockId& id, const BlockMeta&) { return set->count(id.key) > 0; }, stamp);
}

size_t BlockStore::FreeMount(uint64_t mount_id, uint64_t stamp) {
  return FreeIf([mount_id](const BlockId&, const BlockMeta& m) { return m.mount_id == mount_id; }, stamp);
}

namespace {
// How long, and how many, frees are remembered for the Puts of bytes fetched before them.
constexpr std::chrono::minutes kFreeMemory{10};
constexpr size_t kRecentFrees = 256;
}  // namespace

uint64_t BlockStore::FreeTicket() const {
  MutexLock lock(&mu_);
  return frees_;
}

uint64_t BlockStore::KnownStamp() const {
  MutexLock lock(&mu_);
  return known_stamp_;
}

void BlockStore::SetFreeFloor(uint64_t stamp) {
  MutexLock lock(&mu_);
  if (floor_set_) {
    if (stamp >= known_stamp_) {
      known_stamp_ = stamp;
      return;
    }
    spdlog::warn("the master's free stamps went back ({} after {}: a master on a new database?); batches under "
                 "way count as freed, new ones cache again",
                 stamp, known_stamp_);
    recent_frees_.clear();
    forgotten_frees_ = ++frees_;  // every ticket taken before now counts as freed
    forgotten_at_ = std::chrono::steady_clock::now();
    forgotten_stamp_ = 0;
    known_stamp_ = stamp;
    return;
  }
  floor_set_ = true;
  known_stamp_ = std::max(known_stamp_, stamp);
  if (stamp == 0) return;
  // As if a free stamped `stamp` had been forgotten before any this process remembers.
  forgotten_stamp_ = std::max(forgotten_stamp_, stamp);
  if (forgotten_frees_ == 0) {
    // Tickets count from 1 from now on, so that "before the forgotten free" (0) exists.
    for (RecentFree& f : recent_frees_) ++f.number;
    ++frees_;
    forgotten_frees_ = 1;
    forgotten_at_ = std::chrono::steady_clock::now();
  }
}

uint64_t BlockStore::FreeTicketAt(uint64_t stamp) const {
  MutexLock lock(&mu_);
  if (stamp == 0) return frees_;
  // A free forgotten since may have been stamped later: every Put of the batch counts as freed.
  if (forgotten_stamp_ > stamp) return forgotten_frees_ > 0 ? forgotten_frees_ - 1 : 0;
  for (const RecentFree& f : recent_frees_) {
    if (f.stamp > stamp) return f.number - 1;
  }
  return frees_;
}

uint64_t BlockStore::FreeTicketAsOf(std::chrono::steady_clock::time_point asked) const {
  MutexLock lock(&mu_);
  if (forgotten_frees_ > 0 && asked <= forgotten_at_) return forgotten_frees_ - 1;
  for (const RecentFree& f : recent_frees_) {
    if (f.at > asked) return f.number - 1;
  }
  return frees_;
}

bool BlockStore::FreedSince(uint64_t ticket, const BlockMeta& meta) const {
  MutexLock lock(&mu_);
  return FreedSinceLocked(ticket, meta);
}

bool BlockStore::FreedSinceLocked(uint64_t ticket, const BlockMeta& meta) const {
  if (ticket >= frees_) return false;
  if (ticket < forgotten_frees_) return true;  // a free it would be checked against is forgotten
  for (auto it = recent_frees_.rbegin(); it != recent_frees_.rend() && it->number > ticket; ++it) {
    if (it->covers(meta.id, meta)) return true;
  }
  return false;
}

size_t BlockStore::FreeIf(Doomed doomed, uint64_t stamp) {
  Removal r;
  size_t n = 0;
  {
    MutexLock lock(&mu_);
    const auto at = std::chrono::steady_clock::now();
    while (!recent_frees_.empty() &&
           (recent_frees_.size() >= kRecentFrees || at - recent_frees_.front().at > kFreeMemory)) {
      forgotten_frees_ = recent_frees_.front().number;
      forgotten_at_ = std::max(forgotten_at_, recent_frees_.front().at);  // never back before the floor
      forgotten_stamp_ = std::max(forgotten_stamp_, recent_frees_.front().stamp);
      recent_frees_.pop_front();
    }
    recent_frees_.push_back(RecentFree{++frees_, at, doomed, stamp});
    known_stamp_ = std::max(known_stamp_, stamp);
    std::vector<BlockId> now;
    for (auto& [id, e] : index_) {
      if (e.doomed || !doomed(id, e.meta)) continue;
      ++n;
      if (e.readers > 0 || e.moving) {
        UnlistLocked(e);
        e.doomed = true;  // removed by the last reader, or by the move's commit
        ++file_doomed_[PathLocked(id, e.tier, e.dir)];
      } else {
        now.push_back(id);
      }
    }
    for (const auto& id : now) RemoveLocked(id, &r);
  }
  Finish(r);
  return n;
}

bool BlockStore::Contains(const BlockId& id) const {
  MutexLock lock(&mu_);
  auto it = index_.find(id);
  return it != index_.end() && !it->second.doomed;
}

int BlockStore::LevelOf(const BlockId& id) const {
  MutexLock lock(&mu_);
  auto it = index_.find(id);
  return it == index_.end() || it->second.doomed ? -1 : it->second.tier;
}

std::optional<BlockStore::Place> BlockStore::Locate(const BlockId& id) const {
  MutexLock lock(&mu_);
  auto it = index_.find(id);
  if (it == index_.end() || it->second.doomed) return std::nullopt;
  return Place{it->second.tier, it->second.meta.elastic, it->second.meta.length};
}

std::vector<BlockMeta> BlockStore::List() const {
  MutexLock lock(&mu_);
  std::vector<BlockMeta> out;
  out.reserve(index_.size());
  for (const auto& [id, e] : index_) {
    if (!e.doomed) out.push_back(e.meta);
  }
  return out;
}

void BlockStore::AccountLocked(const BlockMeta& m, int sign) {
  MountUsage& u = usage_[m.mount_id];
  auto add = [sign](uint64_t& v, uint64_t d) { v = sign > 0 ? v + d : v - std::min(v, d); };
  add(u.blocks, 1);
  add(u.bytes, m.length);
  if (m.elastic) {
    add(u.elastic_blocks, 1);
    add(u.elastic_bytes, m.length);
  }
  if (m.home && !m.elastic) {
    add(u.home_blocks, 1);
    add(u.home_bytes, m.length);
  }
  if (u.empty()) usage_.erase(m.mount_id);
}

void BlockStore::SetKindLocked(const BlockId& id, Entry& e, Kind kind) {
  if (e.meta.elastic == kind.elastic && e.meta.home == kind.home) return;
  AccountLocked(e.meta, -1);
  if (e.meta.elastic != kind.elastic) {
    UnlistLocked(e);
    e.meta.elastic = kind.elastic;
    ListLocked(id, e);
  }
  e.meta.home = kind.home;
  AccountLocked(e.meta, +1);
}

std::vector<BlockMeta> BlockStore::Classify(const std::function<Kind(const BlockMeta&)>& kind) {
  // The classifier (a rendezvous ranking per block) runs outside the lock, on a snapshot; changes
  // are applied in batches so readers never wait long behind a large cache.
  std::vector<BlockMeta> all = List();
  std::vector<BlockMeta> changed;
  constexpr size_t kBatch = 4096;
  for (size_t start = 0; start < all.size(); start += kBatch) {
    std::vector<BlockMeta> batch;
    for (size_t i = start; i < std::min(all.size(), start + kBatch); ++i) {
      Kind want = kind(all[i]);
      if (want.elastic != all[i].elastic || want.home != all[i].home) {
        all[i].elastic = want.elastic;
        all[i].home = want.home;
        batch.push_back(all[i]);
      }
    }
    MutexLock lock(&mu_);
    for (const auto& m : batch) {
      auto it = index_.find(m.id);
      if (it == index_.end()) continue;  // gone meanwhile
      const BlockMeta& now = it->second.meta;
      if (now.elastic == m.elastic && now.home == m.home) continue;  // changed meanwhile
      SetKindLocked(m.id, it->second, Kind{m.elastic, m.home});
      changed.push_back(it->second.meta);
    }
  }
  return changed;
}

bool BlockStore::MakeReplica(const BlockId& id, bool home) {
  MutexLock lock(&mu_);
  auto it = index_.find(id);
  if (it == index_.end() || !it->second.meta.elastic) return false;
  SetKindLocked(id, it->second, Kind{false, home});
  return true;
}

bool BlockStore::CanAdmit(const BlockMeta& meta) const {
  const uint64_t file_bytes = store::BlockFileBytes(meta.length);
  MutexLock lock(&mu_);
  BlockId victim;
  for (size_t t = 0; t < tiers_.size(); ++t) {
    if (FitLocked(static_cast<int>(t), file_bytes, 1.0) >= 0) return true;
    if (PickVictimLocked(static_cast<int>(t), Purpose::kAdmit, meta.mount_id, meta.elastic, &victim)) return true;
  }
  return false;
}

bool BlockStore::HasFreeRoom(uint64_t bytes) const {
  const uint64_t file_bytes = store::BlockFileBytes(bytes);
  MutexLock lock(&mu_);
  for (size_t t = 0; t < tiers_.size(); ++t) {
    if (FitLocked(static_cast<int>(t), file_bytes, tiers_[t].level.low) >= 0) return true;
  }
  return false;
}

std::vector<std::string> BlockStore::Media() const {
  MutexLock lock(&mu_);
  std::vector<std::string> out;
  for (const auto& t : tiers_) out.push_back(t.level.medium);
  return out;
}

BlockStoreStats BlockStore::Stats() const {
  MutexLock lock(&mu_);
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
  s.pinned_blocks = pinned_blocks_;
  s.mounts = usage_;
  for (const auto& [mount, u] : usage_) {
    s.elastic_blocks += u.elastic_blocks;
    s.elastic_bytes += u.elastic_bytes;
  }
  s.corrupt = corrupt_;
  s.scrubbed = scrubbed_;
  s.reads_as_written = reads_as_written_;
  s.rejected = rejected_;
  s.leases = leases_;
  return s;
}

}  // namespace granary::worker
