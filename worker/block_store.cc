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

namespace granary::worker {
namespace {

constexpr char kMagic[8] = {'G', 'R', 'N', 'B', 'L', 'K', '0', '1'};
constexpr size_t kFixedHeader = 8 + 4 + 4 + 16 + 8 + 8 + 8 + 4 + 4;  // 64 bytes

template <typename T>
void Put(std::string* s, T v) {
  s->append(reinterpret_cast<const char*>(&v), sizeof v);
}
template <typename T>
T Get(const char* p) {
  T v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

Status PreadFull(int fd, char* buf, size_t len, uint64_t off, const std::string& path) {
  size_t done = 0;
  while (done < len) {
    ssize_t n = pread(fd, buf + done, len - done, static_cast<off_t>(off + done));
    if (n < 0) {
      if (errno == EINTR) continue;
      return ErrnoError(errno, "read " + path);
    }
    if (n == 0) return DataLossError(path + " is shorter than its header says");
    done += static_cast<size_t>(n);
  }
  return Status::OK();
}

Status WriteFull(int fd, const char* buf, size_t len, const std::string& path) {
  size_t done = 0;
  while (done < len) {
    ssize_t n = write(fd, buf + done, len - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      return ErrnoError(errno, "write " + path);
    }
    done += static_cast<size_t>(n);
  }
  return Status::OK();
}

struct Header {
  uint32_t header_len = 0;
  uint32_t chunk_size = 0;
  FileKey key{};
  uint64_t index = 0;
  uint64_t mount_id = 0;
  uint64_t data_len = 0;
  std::vector<uint64_t> sums;
};

std::string EncodeHeader(const BlockMeta& meta, std::string_view data) {
  uint32_t header_len = BlockHeaderLen(data.size());
  uint32_t nchunks = static_cast<uint32_t>((data.size() + BlockStore::kChunkSize - 1) / BlockStore::kChunkSize);
  std::string h;
  h.reserve(header_len);
  h.append(kMagic, sizeof kMagic);
  Put<uint32_t>(&h, header_len);
  Put<uint32_t>(&h, BlockStore::kChunkSize);
  h.append(reinterpret_cast<const char*>(meta.id.key.data()), meta.id.key.size());
  Put<uint64_t>(&h, meta.id.index);
  Put<uint64_t>(&h, meta.mount_id);
  Put<uint64_t>(&h, data.size());
  Put<uint32_t>(&h, nchunks);
  Put<uint32_t>(&h, 0);
  for (uint32_t c = 0; c < nchunks; ++c) {
    size_t off = static_cast<size_t>(c) * BlockStore::kChunkSize;
    Put<uint64_t>(&h, Checksum64(data.data() + off, std::min<size_t>(BlockStore::kChunkSize, data.size() - off)));
  }
  Put<uint64_t>(&h, Checksum64(h.data(), h.size()));
  h.resize(header_len, '\0');
  return h;
}

Status DecodeHeader(const std::string& buf, const std::string& path, Header* h) {
  if (buf.size() < kFixedHeader || std::memcmp(buf.data(), kMagic, sizeof kMagic) != 0) {
    return DataLossError(path + ": not a block file");
  }
  const char* p = buf.data() + 8;
  h->header_len = Get<uint32_t>(p);
  h->chunk_size = Get<uint32_t>(p + 4);
  std::memcpy(h->key.data(), p + 8, 16);
  h->index = Get<uint64_t>(p + 24);
  h->mount_id = Get<uint64_t>(p + 32);
  h->data_len = Get<uint64_t>(p + 40);
  uint32_t nchunks = Get<uint32_t>(p + 48);
  if (h->chunk_size != BlockStore::kChunkSize || h->header_len != BlockHeaderLen(h->data_len) ||
      nchunks != (h->data_len + h->chunk_size - 1) / h->chunk_size || buf.size() < h->header_len) {
    return DataLossError(path + ": inconsistent block header");
  }
  size_t sums_at = kFixedHeader;
  size_t end = sums_at + 8ull * nchunks;
  if (Get<uint64_t>(buf.data() + end) != Checksum64(buf.data(), end)) {
    return DataLossError(path + ": block header checksum mismatch");
  }
  h->sums.resize(nchunks);
  for (uint32_t c = 0; c < nchunks; ++c) h->sums[c] = Get<uint64_t>(buf.data() + sums_at + 8ull * c);
  return Status::OK();
}

}  // namespace

uint32_t BlockHeaderLen(uint64_t data_len) {
  uint64_t nchunks = (data_len + BlockStore::kChunkSize - 1) / BlockStore::kChunkSize;
  uint64_t raw = kFixedHeader + 8 * nchunks + 8;
  return static_cast<uint32_t>((raw + 4095) / 4096 * 4096);
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
  std::string hex = FileKeyHex(id.key);
  return tiers_[tier].dirs[dir].path + "/blocks/" + hex.substr(0, 2) + "/" + hex + "-" + std::to_string(id.index);
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

Status BlockStore::ScanDir(int tier, int dir) {
  std::string root = tiers_[tier].dirs[dir].path;
  // Half-written blocks from a crash.
  if (DIR* d = opendir((root + "/tmp").c_str())) {
    while (dirent* de = readdir(d)) {
      if (de->d_name[0] != '.') unlink((root + "/tmp/" + de->d_name).c_str());
    }
    closedir(d);
  }
  DIR* top = opendir((root + "/blocks").c_str());
  if (top == nullptr) return ErrnoError(errno, "open " + root + "/blocks");
  std::vector<std::pair<int64_t, BlockId>> loaded;
  while (dirent* sub = readdir(top)) {
    if (sub->d_name[0] == '.') continue;
    std::string subdir = root + "/blocks/" + sub->d_name;
    DIR* d = opendir(subdir.c_str());
    if (d == nullptr) continue;
    while (dirent* de = readdir(d)) {
      if (de->d_name[0] == '.') continue;
      std::string path = subdir + "/" + de->d_name;
      int64_t mtime = 0;
      Status st = LoadOne(tier, dir, path, de->d_name, &mtime);
      if (!st.ok()) {
        if (st.code() == Code::kAlreadyExists) {
          spdlog::info("dropping a second copy of a block (a move was interrupted): {}", path);
        } else {
          spdlog::warn("discarding cached block: {}", st.message());
          std::lock_guard<std::mutex> lock(mu_);
          ++corrupt_;
        }
        unlink(path.c_str());
      }
    }
    closedir(d);
  }
  closedir(top);
  return Status::OK();
}

Status BlockStore::LoadOne(int tier, int dir, const std::string& path, const std::string& name, int64_t* mtime) {
  size_t dash = name.find('-');
  BlockId id;
  if (dash != 32 || !ParseFileKeyHex(name.substr(0, 32), &id.key)) return DataLossError(path + ": unexpected name");
  id.index = std::strtoull(name.c_str() + 33, nullptr, 10);
  int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return ErrnoError(errno, "open " + path);
  struct stat st;
  fstat(fd, &st);
  *mtime = st.st_mtim.tv_sec * 1000000000ll + st.st_mtim.tv_nsec;
  std::string buf(std::min<uint64_t>(static_cast<uint64_t>(st.st_size), 64 * 1024), '\0');
  Status rs = PreadFull(fd, buf.data(), buf.size(), 0, path);
  close(fd);
  RETURN_IF_ERROR(rs);
  Header h;
  RETURN_IF_ERROR(DecodeHeader(buf, path, &h));
  if (h.key != id.key || h.index != id.index) return DataLossError(path + ": header names another block");
  if (static_cast<uint64_t>(st.st_size) != h.header_len + h.data_len) return DataLossError(path + ": wrong size");
  std::lock_guard<std::mutex> lock(mu_);
  if (index_.count(id)) return AlreadyExistsError(path);
  Entry e;
  e.meta = BlockMeta{id, h.mount_id, h.data_len};
  e.file_bytes = static_cast<uint64_t>(st.st_size);
  e.header_len = h.header_len;
  e.tier = tier;
  e.dir = dir;
  e.pinned = pins_.count(id.key) > 0;
  // The mtime (when the block was written or moved) orders blocks until Init gives them unique
  // sequence numbers and lists them.
  e.seq = static_cast<uint64_t>(std::max<int64_t>(*mtime, 0));
  tiers_[tier].dirs[dir].used += e.file_bytes;
  tiers_[tier].nblocks++;
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
  // Unlinked under the lock: a later Put of the same block may write the same path.
  unlink(PathLocked(id, e.tier, e.dir).c_str());
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
  bool found = false;
  uint64_t best = UINT64_MAX;
  bool shuffle_admit = purpose == Purpose::kAdmit && PolicyLocked(for_mount) == CachePolicy::kShuffle;
  for (const auto& [mount, list] : tiers_[tier].lru) {
    if (shuffle_admit && mount == for_mount) continue;  // never replace a shuffle dataset's blocks with its own
    if (purpose == Purpose::kWatermark && PolicyLocked(mount) == CachePolicy::kShuffle) continue;
    int scanned = 0;
    for (const auto& [seq, id] : list) {
      if (seq >= best || ++scanned > 64) break;
      const Entry& e = index_.at(id);
      if (e.readers > 0 || e.moving) continue;
      best = seq;
      *out = id;
      found = true;
      break;
    }
  }
  return found;
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
  uint64_t data_len;
  uint32_t header_len;
  std::string path;
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
    header_len = e.header_len;
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
  int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    int err = errno;
    release(err == ENOENT);
    return err == ENOENT ? DataLossError(path + " vanished from the cache") : ErrnoError(err, "open " + path);
  }
  // Read the header and whole chunks covering the range, verify, then copy out the range.
  std::string header(header_len, '\0');
  Status st = PreadFull(fd, header.data(), header_len, 0, path);
  Header h;
  if (st.ok()) st = DecodeHeader(header, path, &h);
  if (st.ok() && (h.key != id.key || h.index != id.index || h.data_len != data_len)) {
    st = DataLossError(path + ": header names another block");
  }
  uint64_t first = offset / kChunkSize;
  uint64_t last = (offset + length - 1) / kChunkSize;
  uint64_t span_start = first * kChunkSize;
  uint64_t span_end = std::min<uint64_t>((last + 1) * kChunkSize, data_len);
  std::string span;
  if (st.ok()) {
    span.resize(span_end - span_start);
    st = PreadFull(fd, span.data(), span.size(), header_len + span_start, path);
  }
  if (lease == nullptr) close(fd);
  for (uint64_t c = first; st.ok() && c <= last; ++c) {
    uint64_t off = c * kChunkSize - span_start;
    uint64_t len = std::min<uint64_t>(kChunkSize, data_len - c * kChunkSize);
    if (Checksum64(span.data() + off, len) != h.sums[c]) {
      st = DataLossError(path + ": chunk " + std::to_string(c) + " failed its checksum");
    }
  }
  if (!st.ok()) {
    if (lease != nullptr) close(fd);
    spdlog::warn("cached block is corrupt, discarding it: {}", st.message());
    release(true);
    return st.IsDataLoss() ? st : DataLossError(st.message());
  }
  if (lease != nullptr) {
    // The verified range goes out through this descriptor; the reader count taken above is the
    // lease, given back by Release().
    lease->fd = fd;
    lease->data_offset = header_len + offset;
    lease->length = length;
    std::lock_guard<std::mutex> lock(mu_);
    ++leases_;
    return length;
  }
  std::memcpy(out, span.data() + (offset - span_start), length);
  release(false);
  return length;
}

StatusOr<BlockLease> BlockStore::Lease(const BlockId& id, uint64_t offset, size_t length) {
  BlockLease lease;
  ASSIGN_OR_RETURN(size_t n, ReadInternal(id, offset, length, nullptr, true, &lease));
  if (lease.fd < 0) lease.length = n;  // nothing at that offset: no lease was taken
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
  uint64_t file_bytes = BlockHeaderLen(data.size()) + data.size();
  Removal r;
  int tier = -1, dir = -1;
  std::string path;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (index_.count(meta.id)) return Status::OK();
    for (size_t t = 0; t < tiers_.size() && tier < 0; ++t) {
      int d = FitLocked(static_cast<int>(t), file_bytes, 1.0);
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
  auto unreserve = [&] {
    std::lock_guard<std::mutex> lock(mu_);
    tiers_[tier].dirs[dir].reserved -= file_bytes;
  };
  std::string tmp = TmpPath(tier, dir);
  std::string header = EncodeHeader(meta, data);
  int fd = open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0) {
    unreserve();
    return ErrnoError(errno, "create " + tmp);
  }
  Status st = WriteFull(fd, header.data(), header.size(), tmp);
  if (st.ok()) st = WriteFull(fd, data.data(), data.size(), tmp);
  if (close(fd) != 0 && st.ok()) st = ErrnoError(errno, "close " + tmp);
  if (st.ok()) {
    std::string sub = path.substr(0, path.rfind('/'));
    if (mkdir(sub.c_str(), 0700) != 0 && errno != EEXIST) st = ErrnoError(errno, "mkdir " + sub);
  }
  if (!st.ok()) {
    unlink(tmp.c_str());
    unreserve();
    return st;
  }
  // Renamed under the lock, so no removal of an older copy can unlink the new file.
  std::lock_guard<std::mutex> lock(mu_);
  tiers_[tier].dirs[dir].reserved -= file_bytes;
  if (index_.count(meta.id)) {  // a concurrent Put of the same block won
    unlink(tmp.c_str());
    return Status::OK();
  }
  if (rename(tmp.c_str(), path.c_str()) != 0) {
    Status rs = ErrnoError(errno, "rename to " + path);
    unlink(tmp.c_str());
    return rs;
  }
  Entry e;
  e.meta = meta;
  e.file_bytes = file_bytes;
  e.header_len = static_cast<uint32_t>(header.size());
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
  std::string src, dst;
  uint64_t bytes;
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
    tiers_[to_tier].dirs[to_dir].reserved += bytes;
    src = PathLocked(id, e.tier, e.dir);
    dst = PathLocked(id, to_tier, to_dir);
  }
  std::string tmp = TmpPath(to_tier, to_dir);
  Status st;
  {
    std::ifstream in(src, std::ios::binary);
    std::string buf;
    if (in) {
      std::ostringstream ss;
      ss << in.rdbuf();
      buf = ss.str();
    }
    if (!in || buf.size() != bytes) {
      st = DataLossError(src + ": cannot be read for moving");
    } else {
      int fd = open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
      if (fd < 0) {
        st = ErrnoError(errno, "create " + tmp);
      } else {
        st = WriteFull(fd, buf.data(), buf.size(), tmp);
        if (close(fd) != 0 && st.ok()) st = ErrnoError(errno, "close " + tmp);
      }
    }
  }
  if (st.ok()) {
    std::string sub = dst.substr(0, dst.rfind('/'));
    if (mkdir(sub.c_str(), 0700) != 0 && errno != EEXIST) st = ErrnoError(errno, "mkdir " + sub);
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
        // Commit under the lock: the new file appears and the old one goes in one step.
        if (rename(tmp.c_str(), dst.c_str()) != 0) st = ErrnoError(errno, "rename to " + dst);
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
        unlink(src.c_str());
      } else if (e.doomed && e.readers == 0) {
        RemoveLocked(id, &r);  // freed while moving
      }
    }
  }
  if (!moved) unlink(tmp.c_str());  // aborted: a reader arrived, or it was freed or pinned meanwhile
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
  for (;;) {
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait_for(lock, options_.reserve_interval, [&] { return stop_ || wake_; });
      if (stop_) return;
    }
    Reserve();
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
  s.rejected = rejected_;
  s.leases = leases_;
  return s;
}

}  // namespace granary::worker
