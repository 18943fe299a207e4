#include "master/namespace.h"

#include <rocksdb/table.h>
#include <rocksdb/write_batch.h>
#include <spdlog/spdlog.h>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <set>
#include <unordered_set>

#include "common/fs.h"
#include "common/hash.h"
#include "common/keys.h"
#include "common/path.h"
#include "common/tiers.h"
#include "master/records.h"

namespace granary::master {
namespace {

std::string InodeKey(uint64_t ino) { return "I" + Be64(ino); }
std::string EntryKey(uint64_t parent, const std::string& name) { return "E" + Be64(parent) + name; }
std::string ChildKey(uint64_t parent, uint64_t child) { return "C" + Be64(parent) + Be64(child); }
std::string MountKey(uint64_t id) { return "M" + Be64(id); }
std::string CursorKey(uint64_t mount_id, uint64_t ino) { return "L" + Be64(mount_id) + Be64(ino); }
std::string RenameKey(uint64_t ino) { return "R" + Be64(ino); }
const char kNextIno[] = "S/next_ino";
const char kNextMount[] = "S/next_mount";
const char kFreeStamps[] = "S/free_stamps";
constexpr uint64_t kFreeStampBlock = 1 << 20;  // reserved at once

// Data directories this process has open: RocksDB's own lock cannot tell us apart from another
// process, and a second Namespace on one directory must fail with the same clear error.
Mutex open_dirs_mu;
std::set<std::string> open_dirs GUARDED_BY(open_dirs_mu);

}  // namespace

pid_t DataDirLockHolder(const std::string& data_dir) {
  int fd = open((data_dir + "/LOCK").c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return 0;
  struct flock fl{};
  fl.l_type = F_WRLCK;
  fl.l_whence = SEEK_SET;
  pid_t holder = 0;
  if (fcntl(fd, F_GETLK, &fl) == 0 && fl.l_type != F_UNLCK) holder = fl.l_pid;
  close(fd);
  return holder;
}

namespace {

int64_t NowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// A file made by PrepareCreate whose first commit has not come (no version yet), made less than a
// day ago: syncs leave it alone (the store has nothing of it yet).
bool IsPendingWrite(const InodeRecord& r, int64_t now_ns) {
  constexpr int64_t kPendingNs = 24LL * 3600 * 1'000'000'000;
  return r.type() == rpc::REGULAR && r.version().empty() && now_ns - r.synced_ns() < kPendingNs;
}

// Splits "/a/b" into {"a", "b"}; fails on anything that is not a clean absolute path.
StatusOr<std::vector<std::string>> SplitPath(const std::string& path) {
  if (path.empty() || path[0] != '/') return InvalidArgumentError("'" + path + "' is not an absolute path");
  std::vector<std::string> parts;
  size_t start = 1;
  while (start < path.size()) {
    size_t end = path.find('/', start);
    if (end == std::string::npos) end = path.size();
    std::string part = path.substr(start, end - start);
    if (!part.empty() || end != path.size()) {
      if (!IsValidName(part)) return InvalidArgumentError("'" + path + "' is not a valid path");
      parts.push_back(std::move(part));
    }
    start = end + 1;
  }
  return parts;
}

}  // namespace

Namespace::Namespace(std::unique_ptr<rocksdb::DB> db, uint64_t block_size, const UfsAccess& access,
                     int64_t default_sync_ms)
    : db_(std::move(db)), block_size_(block_size), default_sync_ms_(default_sync_ms), access_(access) {}

Namespace::~Namespace() {
  db_.reset();  // RocksDB's lock is released before another Namespace may take the directory
  if (!open_dir_.empty()) {
    MutexLock lock(&open_dirs_mu);
    open_dirs.erase(open_dir_);
  }
}

StatusOr<std::unique_ptr<Namespace>> Namespace::Open(const std::string& data_dir, uint64_t block_size,
                                                     const UfsAccess& access, int64_t default_sync_ms,
                                                     uint64_t cache_bytes, rocksdb::Env* env) {
  RETURN_IF_ERROR(MakeDirs(data_dir, 0700));
  // It holds every dataset's file names: 0700 even when it existed before with a wider mode. A
  // directory this user does not own (a Kubernetes volume's root, owned by root with the pod's
  // fsGroup) cannot be changed: that is said, and the volume's own access applies.
  if (chmod(data_dir.c_str(), 0700) != 0) {
    if (errno != EPERM) return ErrnoError(errno, "master.data_dir: chmod 0700 " + data_dir);
    spdlog::warn("master.data_dir {} is not this user's, so its mode stays as it is; it holds every dataset's file "
                 "names: give it to this user with mode 0700, or keep its volume private to the master",
                 data_dir);
  }
  std::error_code ec;
  std::string canonical = std::filesystem::canonical(data_dir, ec).string();
  if (ec) canonical = data_dir;
  {
    MutexLock lock(&open_dirs_mu);
    if (!open_dirs.insert(canonical).second) {
      return FailedPreconditionError("master.data_dir " + data_dir + " is already open in this process");
    }
  }
  auto ns = OpenDb(data_dir, block_size, access, default_sync_ms, cache_bytes, env);
  if (!ns.ok()) {
    MutexLock lock(&open_dirs_mu);
    open_dirs.erase(canonical);
    return ns.status();
  }
  (*ns)->open_dir_ = canonical;
  return ns;
}

StatusOr<std::unique_ptr<Namespace>> Namespace::OpenDb(const std::string& data_dir, uint64_t block_size,
                                                       const UfsAccess& access, int64_t default_sync_ms,
                                                       uint64_t cache_bytes, rocksdb::Env* env) {
  rocksdb::Options opts;
  if (env != nullptr) opts.env = env;
  opts.create_if_missing = true;
  opts.max_open_files = 512;
  rocksdb::BlockBasedTableOptions table;
  table.block_cache = rocksdb::NewLRUCache(cache_bytes);
  // Index and filter blocks live in the block cache too, so memory stays bounded by it.
  table.cache_index_and_filter_blocks = true;
  opts.write_buffer_size = 32 << 20;
  opts.max_write_buffer_number = 2;
  opts.table_factory.reset(rocksdb::NewBlockBasedTableFactory(table));
  rocksdb::DB* raw = nullptr;
  rocksdb::Status s = rocksdb::DB::Open(opts, data_dir, &raw);
  if (!s.ok()) {
    if (pid_t holder = DataDirLockHolder(data_dir); holder != 0) {
      return FailedPreconditionError("master.data_dir " + data_dir + " is in use by another granary-master (pid " +
                                     std::to_string(holder) + " holds its lock); stop it or choose another directory");
    }
    return FromRocks(s, "cannot open RocksDB in " + data_dir);
  }
  std::unique_ptr<Namespace> ns(new Namespace(std::unique_ptr<rocksdb::DB>(raw), block_size, access, default_sync_ms));
  RETURN_IF_ERROR(ns->Init());
  return ns;
}

Status Namespace::Init() {
  RETURN_IF_ERROR(journal_.Load());
  MutexLock lock(&mu_);
  std::string v;
  rocksdb::Status root_s = db_->Get({}, InodeKey(kRootIno), &v);
  if (!root_s.IsNotFound()) RETURN_IF_ERROR(FromRocks(root_s, "read the root inode"));
  if (root_s.IsNotFound()) {
    // Written outside the journal, by every master on an empty database: a standby's copy is
    // replaced by the leader's snapshot before it serves (its journal position is 0/0).
    InodeRecord root;
    root.set_ino(kRootIno);
    root.set_parent(kRootIno);
    root.set_type(rpc::DIRECTORY);
    root.set_mode(0755);
    root.set_mtime_ns(NowNs());
    root.set_listed(true);
    RETURN_IF_ERROR(FromRocks(db_->Put({}, InodeKey(kRootIno), root.SerializeAsString()), "create root"));
  }
  RETURN_IF_ERROR(LoadStateLocked());
  if (journal_.position().index == 0 && journal_.Whole() && (!mounts_.empty() || next_ino_ > 2)) {
    // A database written before the journal (an older granary-master): it holds a namespace, so
    // its position must rank above an empty copy's when standby masters first elect a leader.
    rocksdb::WriteOptions wo;
    wo.sync = true;
    RETURN_IF_ERROR(FromRocks(db_->Put(wo, kJournalPositionKey, Be64(0) + Be64(1)), "start the journal"));
    RETURN_IF_ERROR(journal_.Load());
  }
  spdlog::info("namespace opened: {} mounts, next inode {}, journal at {}", mounts_.size(), next_ino_,
               journal_.position().ToString());
  return Status::OK();
}

Status Namespace::LoadStateLocked() {
  std::string v;
  // A counter that cannot be read must stop the start: guessing it would reuse inode numbers.
  auto counter = [&](const char* key, uint64_t* out) -> Status {
    rocksdb::Status s = db_->Get({}, key, &v);
    if (s.IsNotFound()) return Status::OK();
    RETURN_IF_ERROR(FromRocks(s, std::string("read ") + key));
    if (v.size() != 8) return DataLossError(std::string("the master's database holds a malformed ") + key);
    *out = GetBe64(v.data());
    return Status::OK();
  };
  uint64_t next_ino = 2, next_mount = 1, free_stamps = 0;
  RETURN_IF_ERROR(counter(kNextIno, &next_ino));
  RETURN_IF_ERROR(counter(kNextMount, &next_mount));
  RETURN_IF_ERROR(counter(kFreeStamps, &free_stamps));
  std::map<uint64_t, rpc::MountInfo> mounts;
  std::unique_ptr<rocksdb::Iterator> it(db_->NewIterator({}));
  for (it->Seek("M"); it->Valid() && it->key().starts_with("M"); it->Next()) {
    MountRecord r;
    if (!r.ParseFromArray(it->value().data(), static_cast<int>(it->value().size()))) {
      return DataLossError("corrupt mount record in RocksDB");
    }
    rpc::MountInfo m = FromRecord(r);
    mounts[m.id()] = m;
  }
  RETURN_IF_ERROR(FromRocks(it->status(), "read mount records"));
  // Under-storages opened for mounts that are gone or changed are let go (a snapshot from a new
  // leader may reuse a mount id for another dataset).
  for (const auto& [id, m] : mounts_) {
    auto now = mounts.find(id);
    auto options = [](const rpc::MountInfo& x) {
      return std::map<std::string, std::string>(x.options().begin(), x.options().end());
    };
    if (now == mounts.end() || now->second.uri() != m.uri() || options(now->second) != options(m)) {
      open_mounts_.Erase(id);
    }
  }
  std::vector<PendingRename> renames;
  std::unique_ptr<rocksdb::Iterator> rit(db_->NewIterator({}));
  for (rit->Seek("R"); rit->Valid() && rit->key().starts_with("R"); rit->Next()) {
    if (rit->key().size() != 9 || rit->value().size() < 8) return DataLossError("corrupt rename record in RocksDB");
    renames.push_back({GetBe64(rit->key().data() + 1), GetBe64(rit->value().data()), rit->value().ToString().substr(8)});
  }
  RETURN_IF_ERROR(FromRocks(rit->status(), "read rename records"));
  SetPendingRenames(std::move(renames));
  next_ino_ = next_ino;
  next_mount_ = next_mount;
  // Stamps up to the reservation may have been handed out (by this master before a restart, or by
  // the leader this copy followed): the next ones start above it.
  free_stamps_reserved_ = free_stamps;
  free_stamps_reserved_at_ = 0;  // the next stamp reserves a block of its own (free_stamp_ is at the limit)
  free_stamp_.store(free_stamps);
  mounts_ = std::move(mounts);
  MutexLock sync_lock(&sync_mu_);
  sync_ms_.clear();
  write_modes_.clear();
  for (const auto& [id, m] : mounts_) {
    sync_ms_[id] = ParsedSyncMs(m);
    write_modes_[id] = ParsedWriteMode(m);
  }
  return Status::OK();
}

Status Namespace::ReloadState() {
  MutexLock lock(&mu_);
  return LoadStateLocked();
}

Status Namespace::SkipAhead(uint64_t inodes, uint64_t mounts) {
  MutexLock lock(&mu_);
  rocksdb::WriteBatch batch;
  batch.Put(kNextIno, Be64(next_ino_ + inodes));
  batch.Put(kNextMount, Be64(next_mount_ + mounts));
  // The free stamps past one more reservation: the previous leader may have reserved (and handed
  // out) one block that no standby got when none was in sync. Stamps must never go back: a worker
  // counts every batch stamped below a free it has seen as older than that free.
  const uint64_t stamps = free_stamps_reserved_ + kFreeStampBlock;
  batch.Put(kFreeStamps, Be64(stamps));
  RETURN_IF_ERROR(journal_.Commit(&batch, /*sync=*/true).WithContext("move the counters ahead"));
  next_ino_ += inodes;
  next_mount_ += mounts;
  free_stamps_reserved_ = stamps;
  free_stamp_.store(stamps);  // the next stamp reserves a block of its own
  return Status::OK();
}

Status Namespace::ApplyEntry(const JournalEntry& e) {
  // A directory rename's first entry (an R key put): its correction must be in force before the
  // moved directory's new path is visible, or a read in between would see children at old paths.
  struct RenamePuts : rocksdb::WriteBatch::Handler {
    std::vector<PendingRename> put;
    rocksdb::Status PutCF(uint32_t, const rocksdb::Slice& key, const rocksdb::Slice& value) override {
      if (key.size() == 9 && key[0] == 'R' && value.size() >= 8) {
        put.push_back({GetBe64(key.data() + 1), GetBe64(value.data()), value.ToString().substr(8)});
      }
      return rocksdb::Status::OK();
    }
  } puts;
  if (rocksdb::WriteBatch(e.data).Iterate(&puts).ok() && !puts.put.empty()) {
    std::vector<PendingRename> now = PendingRenames();
    for (auto& p : puts.put) now.push_back(std::move(p));
    SetPendingRenames(std::move(now));
  }
  std::string touched;
  RETURN_IF_ERROR(journal_.Apply(e, &touched));
  if (touched.find_first_of("MSR*") == std::string::npos) return Status::OK();
  return ReloadState();
}

StatusOr<uint64_t> Namespace::NextFreeStamp() {
  uint64_t stamp;
  {
    MutexLock lock(&mu_);
    stamp = free_stamp_.load() + 1;
    if (stamp > free_stamps_reserved_) {
      rocksdb::WriteBatch batch;
      batch.Put(kFreeStamps, Be64(stamp + kFreeStampBlock));
      RETURN_IF_ERROR(journal_.Commit(&batch, /*sync=*/true).WithContext("reserve free stamps"));
      free_stamps_reserved_ = stamp + kFreeStampBlock;
      free_stamps_reserved_at_ = journal_.position().index;  // this entry's, or a later one's
    }
    free_stamp_.store(stamp);
    // Whoever reserved the block, the reservation must be on a standby before the stamp is used.
    journal_.Owe(free_stamps_reserved_at_);
  }
  // On a standby before the stamp is used: a new leader then starts above it.
  RETURN_IF_ERROR(journal_.WaitReplicated());
  return stamp;
}

std::vector<Namespace::PendingRename> Namespace::PendingRenames() const {
  MutexLock lock(&pending_mu_);
  return pending_renames_;
}

void Namespace::SetPendingRenames(std::vector<PendingRename> p) {
  MutexLock lock(&pending_mu_);
  renames_pending_.store(!p.empty(), std::memory_order_release);
  pending_renames_ = std::move(p);
}

void Namespace::SetRenameBatchHookForTest(std::function<Status()> hook, size_t batch) {
  rename_hook_ = std::move(hook);
  rename_batch_ = std::max<size_t>(batch, 1);
}

Status Namespace::InstallSnapshotEnd() {
  RETURN_IF_ERROR(journal_.InstallEnd());
  return ReloadState();
}

StatusOr<InodeRecord> Namespace::GetRecord(uint64_t ino) const {
  ASSIGN_OR_RETURN(InodeRecord r, GetStoredRecord(ino));
  if (renames_pending_.load(std::memory_order_acquire)) RETURN_IF_ERROR(FixMovedPath(&r));
  return r;
}

Status Namespace::FixMovedPath(InodeRecord* r) const {
  for (const PendingRename& p : PendingRenames()) {
    const std::string& path = r->ufs_path();
    if (r->ino() == p.ino || r->mount_id() != p.mount_id || path.size() <= p.old_path.size() ||
        path.compare(0, p.old_path.size(), p.old_path) != 0 || path[p.old_path.size()] != '/') {
      continue;
    }
    // Below the moved directory, or a new entry made at its old name since? Up the parents.
    uint64_t at = r->parent();
    for (int depth = 0; depth < 100000 && at != 0 && at != kRootIno && at != p.mount_id; ++depth) {
      if (at == p.ino) {
        auto top = GetStoredRecord(p.ino);
        if (!top.ok()) return top.status().IsNotFound() ? Status::OK() : top.status();
        r->set_ufs_path(top->ufs_path() + path.substr(p.old_path.size()));
        return Status::OK();
      }
      auto up = GetStoredRecord(at);
      if (!up.ok()) return up.status().IsNotFound() ? Status::OK() : up.status();
      at = up->parent();
    }
  }
  return Status::OK();
}

StatusOr<InodeRecord> Namespace::GetStoredRecord(uint64_t ino) const {
  std::string v;
  rocksdb::Status s = db_->Get({}, InodeKey(ino), &v);
  if (s.IsNotFound()) return NotFoundError("no inode " + std::to_string(ino));
  RETURN_IF_ERROR(FromRocks(s, "read inode"));
  InodeRecord r;
  if (!r.ParseFromString(v)) return DataLossError("corrupt inode record " + std::to_string(ino));
  return r;
}

StatusOr<uint64_t> Namespace::GetChild(uint64_t parent, const std::string& name) const {
  std::string v;
  rocksdb::Status s = db_->Get({}, EntryKey(parent, name), &v);
  if (s.IsNotFound()) return NotFoundError("'" + name + "' does not exist");
  RETURN_IF_ERROR(FromRocks(s, "read entry"));
  if (v.size() != 8 && v.size() != 16) return DataLossError("corrupt directory entry");
  return GetBe64(v.data());
}

rpc::Attr Namespace::AttrOf(const InodeRecord& r) const {
  rpc::Attr a;
  a.set_ino(r.ino());
  a.set_type(r.type());
  a.set_size(r.size());
  a.set_mtime_ns(r.mtime_ns());
  // Read-only unless the mount is writable; then its owner may write (an object store's 0444 files
  // show as 0644), and default_permissions decides who else may.
  const bool writable = WriteModeOf(r.mount_id()) != WriteMode::kOff;
  a.set_mode(writable ? r.mode() | 0200u : r.mode() & ~0222u);
  a.set_writable(writable);
  a.set_uid(r.uid());
  a.set_gid(r.gid());
  a.set_nlink(r.type() == rpc::DIRECTORY ? 2 : 1);
  a.set_parent(r.parent());
  a.set_generation(r.content_gen());
  if (r.type() != rpc::DIRECTORY) a.set_version_hash(Checksum64(r.version().data(), r.version().size()));
  return a;
}

StatusOr<std::shared_ptr<UnderFileSystem>> Namespace::UfsFor(uint64_t mount_id) {
  // Opened outside mu_ (an NFS connect must not hold up the namespace); the loader takes mu_.
  ASSIGN_OR_RETURN(OpenedMount m, open_mounts_.Get(mount_id));
  return m.ufs;
}

StatusOr<MountTable::Source> Namespace::MountSource(uint64_t mount_id) {
  MutexLock lock(&mu_);
  auto m = mounts_.find(mount_id);
  if (m == mounts_.end()) return NotFoundError("mount " + std::to_string(mount_id) + " is gone");
  return MountTable::Source{m->second.uri(), {m->second.options().begin(), m->second.options().end()},
                            m->second.block_size()};
}

Status Namespace::PutMountLocked(const rpc::MountInfo& m, rocksdb::WriteBatch* batch) {
  mounts_[m.id()] = m;
  {
    MutexLock sync_lock(&sync_mu_);
    sync_ms_[m.id()] = ParsedSyncMs(m);
    write_modes_[m.id()] = ParsedWriteMode(m);
  }
  return FromRocks(batch->Put(MountKey(m.id()), ToRecord(m).SerializeAsString()), "write mount");
}

int64_t Namespace::SyncIntervalMs(uint64_t mount_id) const {
  MutexLock lock(&sync_mu_);  // not mu_: an unmount or a load's page holds it for long
  auto it = sync_ms_.find(mount_id);
  if (it == sync_ms_.end()) return kSyncNever;
  return it->second.value_or(default_sync_ms_);
}

std::optional<int64_t> Namespace::ParsedSyncMs(const rpc::MountInfo& m) {
  std::map<std::string, std::string> ufs_options;
  MountCacheOptions cache;
  std::map<std::string, std::string> opts(m.options().begin(), m.options().end());
  // Options were checked when the mount was made; a record that no longer parses (written by an
  // older release) syncs at the master's default.
  if (!SplitMountOptions(opts, &ufs_options, &cache).ok()) return std::nullopt;
  return cache.metadata_sync_ms;
}

WriteMode Namespace::ParsedWriteMode(const rpc::MountInfo& m) {
  std::map<std::string, std::string> ufs_options;
  MountCacheOptions cache;
  std::map<std::string, std::string> opts(m.options().begin(), m.options().end());
  if (!SplitMountOptions(opts, &ufs_options, &cache).ok()) return WriteMode::kOff;
  return cache.write;
}

WriteMode Namespace::WriteModeOf(uint64_t mount_id) const {
  if (mount_id == 0) return WriteMode::kOff;
  MutexLock lock(&sync_mu_);
  auto it = write_modes_.find(mount_id);
  return it == write_modes_.end() ? WriteMode::kOff : it->second;
}

bool Namespace::SyncDue(const InodeRecord& r) const {
  if (r.mount_id() == 0) return false;  // virtual directories have nothing to sync with
  int64_t interval = SyncIntervalMs(r.mount_id());
  if (interval < 0) return false;
  return NowNs() - r.synced_ns() >= interval * 1'000'000;
}

void Namespace::Reclaim(std::vector<FileKey> keys) {
  if (!keys.empty() && on_reclaim_) on_reclaim_(std::move(keys));
}

Status Namespace::NeedsUfs(bool* ufs_needed) {
  *ufs_needed = true;
  return UnavailableError("the answer needs the under-storage");
}

Status Namespace::EnsureListed(const InodeRecord& dir, bool* ufs_needed) {
  if (dir.type() != rpc::DIRECTORY) return Status::OK();
  if (dir.listed() && !SyncDue(dir)) return Status::OK();
  if (ufs_needed) return NeedsUfs(ufs_needed);
  MutexLock list_lock(&list_locks_[dir.ino() % list_locks_.size()]);
  ASSIGN_OR_RETURN(InodeRecord fresh, GetRecord(dir.ino()));
  if (fresh.listed() && !SyncDue(fresh)) return Status::OK();  // another caller just listed it
  bool was_listed = fresh.listed();
  std::string path = fresh.ufs_path();
  if (!was_listed) {
    ASSIGN_OR_RETURN(auto ufs, UfsFor(fresh.mount_id()));
    if (list_ahead_entries_ != 0 && ufs->ListsTreeFlat()) {
      LoadTreeOptions ahead;
      ahead.max_entries = list_ahead_entries_;
      auto loaded = LoadTreeOf(fresh, RedactUri(ufs->uri()) + "/" + path, ahead);
      if (loaded.ok() && loaded->complete) return Status::OK();
      // The store unreachable (its retries spent): the listing below would wait as long again.
      // Any other failure of the listing ahead is left to the plain listing to say or to get past.
      if (!loaded.ok() && loaded.status().IsUnderStorageDown()) return loaded.status();
      ASSIGN_OR_RETURN(fresh, GetRecord(dir.ino()));
      if (fresh.listed()) return Status::OK();
    }
  }
  Status st = ListDir(std::move(fresh));
  if (!st.ok() && was_listed && GetMount(dir.mount_id()).ok()) {
    // A re-sync failed (the under-storage is unreachable, or the directory is gone and its parent's
    // sync will remove it): keep serving what is known.
    spdlog::warn("metadata sync of '{}' failed, serving the last listing: {}", path, st.message());
    return Status::OK();
  }
  return st;
}

StatusOr<uint64_t> Namespace::UpsertChildLocked(const InodeRecord& dir, uint64_t gen, const UfsEntry& e,
                                                  SyncBatch* b) {
  std::string existing;
  if (db_->Get({}, EntryKey(dir.ino(), e.name), &existing).ok() && existing.size() >= 8) {
    uint64_t ino = GetBe64(existing.data());
    auto old = GetRecord(ino);
    if (old.ok() && (old->type() == rpc::DIRECTORY) == e.is_dir) {
      InodeRecord r = *old;
      bool update = r.mode() != e.mode || r.uid() != e.uid || r.gid() != e.gid;
      if (!e.is_dir && r.version() != e.version) {
        // A new version: same inode, new identity for its blocks; the old blocks are reclaimed.
        b->reclaim.push_back(MakeFileKey(b->uri, r.ufs_path(), r.version()));
        b->mount.set_known_bytes(b->mount.known_bytes() + e.size - std::min(b->mount.known_bytes() + e.size, r.size()));
        r.set_size(e.size);
        r.set_version(e.version);
        r.set_block_size(BlockSizeOf(b->mount));
        ++b->changed;
        update = true;
      }
      if (e.is_dir && r.mtime_ns() != e.mtime_ns) update = true;
      if (update) {
        r.set_mtime_ns(e.mtime_ns);
        r.set_mode(e.mode);
        r.set_uid(e.uid);
        r.set_gid(e.gid);
        r.set_synced_ns(b->now);
        b->batch.Put(InodeKey(ino), r.SerializeAsString());
      }
      b->batch.Put(EntryKey(dir.ino(), e.name), Be64(ino) + Be64(gen));
      return ino;
    }
    // A file became a directory or the other way round: drop the old one entirely.
    uint64_t files = 0, bytes = 0;
    RETURN_IF_ERROR(DeleteSubtreeLocked(ino, &b->uri, &b->reclaim, &files, &bytes));
    b->batch.Delete(ChildKey(dir.ino(), ino));
    b->mount.set_known_files(b->mount.known_files() - std::min(b->mount.known_files(), files));
    b->mount.set_known_bytes(b->mount.known_bytes() - std::min(b->mount.known_bytes(), bytes));
    ++b->removed;
  }
  InodeRecord r;
  r.set_ino(next_ino_++);
  r.set_parent(dir.ino());
  r.set_name(e.name);
  r.set_type(e.is_dir ? rpc::DIRECTORY : rpc::REGULAR);
  r.set_size(e.size);
  r.set_mtime_ns(e.mtime_ns);
  r.set_mode(e.mode);
  r.set_uid(e.uid);
  r.set_gid(e.gid);
  r.set_mount_id(dir.mount_id());
  r.set_ufs_path(JoinPath(dir.ufs_path(), e.name));
  r.set_version(e.version);
  r.set_block_size(BlockSizeOf(b->mount));
  r.set_synced_ns(b->now);
  b->batch.Put(InodeKey(r.ino()), r.SerializeAsString());
  b->batch.Put(EntryKey(dir.ino(), e.name), Be64(r.ino()) + Be64(gen));
  b->batch.Put(ChildKey(dir.ino(), r.ino()), "");
  if (!e.is_dir) {
    b->mount.set_known_files(b->mount.known_files() + 1);
    b->mount.set_known_bytes(b->mount.known_bytes() + e.size);
  }
  ++b->added;
  return r.ino();
}

Status Namespace::FinishListingLocked(InodeRecord dir, uint64_t gen, bool sweep, SyncBatch* b) {
  if (sweep) {
    // Children the listing did not stamp are gone from the under-storage.
    std::string prefix = EntryKey(dir.ino(), "");
    std::unique_ptr<rocksdb::Iterator> it(db_->NewIterator({}));
    std::vector<std::pair<std::string, uint64_t>> stale;
    for (it->Seek(prefix); it->Valid() && it->key().starts_with(prefix); it->Next()) {
      rocksdb::Slice v = it->value();
      uint64_t seen = v.size() == 16 ? GetBe64(v.data() + 8) : 0;
      if (seen < gen) stale.emplace_back(it->key().ToString(), GetBe64(v.data()));
    }
    RETURN_IF_ERROR(FromRocks(it->status(), "list entries to sweep"));
    for (const auto& [key, ino] : stale) {
      // A file being written (created empty, not committed yet) is not in the store until its
      // commit: kept (for a day: a writer that died never commits).
      auto rec = GetRecord(ino);
      if (rec.ok() && IsPendingWrite(*rec, b->now)) continue;
      uint64_t files = 0, bytes = 0;
      RETURN_IF_ERROR(DeleteSubtreeLocked(ino, &b->uri, &b->reclaim, &files, &bytes));
      b->batch.Delete(key);
      b->batch.Delete(ChildKey(dir.ino(), ino));
      b->mount.set_known_files(b->mount.known_files() - std::min(b->mount.known_files(), files));
      b->mount.set_known_bytes(b->mount.known_bytes() - std::min(b->mount.known_bytes(), bytes));
      ++b->removed;
    }
  }
  if (!dir.listed() || b->added || b->changed || b->removed) dir.set_content_gen(dir.content_gen() + 1);
  dir.set_listed(true);
  dir.set_synced_ns(b->now);
  dir.set_sync_gen(std::max(dir.sync_gen(), gen));  // a listing that ran meanwhile may be newer
  b->batch.Put(InodeKey(dir.ino()), dir.SerializeAsString());
  return Status::OK();
}

Status Namespace::WriteLocked(SyncBatch* b) {
  auto mit = mounts_.find(b->mount.id());
  if (mit == mounts_.end()) return NotFoundError("the mount was removed while listing");
  b->batch.Put(kNextIno, Be64(next_ino_));
  RETURN_IF_ERROR(PutMountLocked(b->mount, &b->batch));
  RETURN_IF_ERROR(journal_.Commit(&b->batch).WithContext("write listing"));
  b->batch.Clear();
  return Status::OK();
}

Status Namespace::ListDir(InodeRecord dir) {
  ASSIGN_OR_RETURN(auto ufs, UfsFor(dir.mount_id()));
  SyncBatch b;
  {
    ASSIGN_OR_RETURN(rpc::MountInfo m, GetMount(dir.mount_id()));
    b.uri = m.uri();
  }
  b.now = NowNs();
  const uint64_t gen = dir.sync_gen() + 1;
  const bool resync = dir.listed();
  Status st = ufs->List(dir.ufs_path(), 1000, [&](std::vector<UfsEntry>& page) -> Status {
    MutexLock lock(&mu_);
    auto mit = mounts_.find(dir.mount_id());
    if (mit == mounts_.end()) return NotFoundError("the mount was removed while listing");
    b.mount = mit->second;  // the latest counts
    for (const UfsEntry& e : page) RETURN_IF_ERROR(UpsertChildLocked(dir, gen, e, &b).status());
    return WriteLocked(&b);
  });
  if (!st.ok()) {
    Reclaim(std::move(b.reclaim));
    return st.WithContext("listing " + RedactUri(ufs->uri()) + "/" + dir.ufs_path());
  }
  {
    MutexLock lock(&mu_);
    // An unmount may have removed this directory while it was being listed; do not bring it back.
    auto mit = mounts_.find(dir.mount_id());
    if (mit == mounts_.end()) return NotFoundError("the mount was removed while listing");
    b.mount = mit->second;
    RETURN_IF_ERROR(FinishListingLocked(dir, gen, resync, &b));
    RETURN_IF_ERROR(WriteLocked(&b));
  }
  if (resync && (b.added || b.changed || b.removed)) {
    spdlog::info("synced '{}' of mount {}: {} new, {} changed, {} removed", dir.ufs_path(), dir.mount_id(), b.added,
                 b.changed, b.removed);
  } else {
    spdlog::debug("listed '{}' of mount {}: {} entries", dir.ufs_path(), dir.mount_id(), b.added);
  }
  Reclaim(std::move(b.reclaim));
  return Status::OK();
}

StatusOr<LoadStats> Namespace::LoadTree(const std::string& path, const LoadTreeOptions& opts) {
  ASSIGN_OR_RETURN(rpc::Attr top_attr, Resolve(path));
  ASSIGN_OR_RETURN(InodeRecord top, GetRecord(top_attr.ino()));
  if (top.type() != rpc::DIRECTORY) return InvalidArgumentError(path + " is a file; load a directory");
  if (top.mount_id() == 0) return InvalidArgumentError(path + " is not inside a mounted dataset (see `granary mounts`)");
  return LoadTreeOf(std::move(top), path, opts);
}

StatusOr<LoadStats> Namespace::LoadTreeOf(InodeRecord top, const std::string& path, const LoadTreeOptions& opts) {
  ASSIGN_OR_RETURN(auto ufs, UfsFor(top.mount_id()));
  SyncBatch b;
  {
    ASSIGN_OR_RETURN(rpc::MountInfo m, GetMount(top.mount_id()));
    b.uri = m.uri();
  }
  b.now = NowNs();
  // The chain of directories from `top` to the one entries are being added to. A directory leaves
  // the chain when the listing has moved past everything below it: then it is complete, and is
  // marked listed (and swept of children the listing did not see). Each directory stamps the
  // entries it holds with its `gen`.
  struct Open {
    std::string rel;  // relative to top, "" for top itself
    InodeRecord rec;
    uint64_t gen;
  };
  std::vector<Open> chain{{"", top, top.sync_gen() + 1}};
  // The last directory passed as an entry, while nothing below it has come: what is below a
  // directory comes right after its entry, so if the next entry is not below it, it is empty.
  std::optional<Open> fresh_dir;
  LoadStats stats;

  // An earlier load of this directory that stopped: take its chain back, stamping with the
  // generations it recorded, so what it wrote counts as seen by this load, and continue after its
  // checkpoint. That stays safe whatever happened to those directories since: one finished by that
  // load after its last cursor (a crash in the middle of a page) or listed since (a lookup) has
  // every present child stamped at or above the recorded generation, and a sweep deletes only
  // children stamped below it. A directory gone since, or a cursor that does not parse, starts
  // the load over.
  const std::string cursor_key = CursorKey(top.mount_id(), top.ino());
  std::string after;
  {
    std::string raw;
    rocksdb::Status got = db_->Get({}, cursor_key, &raw);
    if (!got.ok() && !got.IsNotFound()) RETURN_IF_ERROR(FromRocks(got, "read the load cursor of " + path));
    LoadCursorRecord cursor;
    if (got.ok() && cursor.ParseFromString(raw)) {
      std::vector<Open> kept;
      bool same = !cursor.after().empty() && cursor.open_ino_size() > 0 &&
                  cursor.open_ino_size() == cursor.open_gen_size() && cursor.open_ino_size() == cursor.open_rel_size() &&
                  cursor.open_ino(0) == top.ino() && cursor.open_rel(0).empty();
      for (int i = 0; same && i < cursor.open_ino_size(); ++i) {
        auto r = GetRecord(cursor.open_ino(i));
        same = r.ok() && r->type() == rpc::DIRECTORY && r->sync_gen() + 1 >= cursor.open_gen(i);
        if (same) kept.push_back(Open{cursor.open_rel(i), *r, cursor.open_gen(i)});
      }
      if (same && cursor.fresh_dir_ino() != 0) {
        auto r = GetRecord(cursor.fresh_dir_ino());
        same = r.ok() && r->type() == rpc::DIRECTORY;
        if (same) fresh_dir = Open{cursor.fresh_dir_rel(), *r, 0};
      }
      if (same) {
        chain = std::move(kept);
        after = cursor.after();
        stats.resumed_after = after;
        spdlog::info("loading the metadata of {}: resuming after '{}'", path, after);
      } else {
        fresh_dir.reset();
        spdlog::info("loading the metadata of {}: the interrupted load's directories are gone; starting over", path);
      }
    }
  }

  // Both called only from the listing callback below or after it, with mu_ held (the analysis does
  // not follow a lambda's caller, hence the opt-outs).
  auto finish = [&](const Open& o) NO_THREAD_SAFETY_ANALYSIS -> Status {
    RETURN_IF_ERROR(WriteLocked(&b));  // the sweep reads the stamps from RocksDB
    ASSIGN_OR_RETURN(InodeRecord rec, GetRecord(o.rec.ino()));  // content_gen may have moved
    RETURN_IF_ERROR(FinishListingLocked(rec, o.gen != 0 ? o.gen : rec.sync_gen() + 1, true, &b));
    ++stats.dirs;
    return Status::OK();
  };
  auto close_one = [&]() NO_THREAD_SAFETY_ANALYSIS -> Status {
    Open o = std::move(chain.back());
    chain.pop_back();
    return finish(o);
  };
  // The entry at `rel` has come: a fresh directory it is not below is empty.
  auto settle_fresh = [&](const std::string& rel) NO_THREAD_SAFETY_ANALYSIS -> Status {
    if (!fresh_dir) return Status::OK();
    bool below = rel != fresh_dir->rel && PathWithin(rel, fresh_dir->rel);
    Open o = std::move(*fresh_dir);
    fresh_dir.reset();
    return below ? Status::OK() : finish(o);
  };
  uint64_t passed = 0;      // entries passed to this load
  bool out_of_budget = false;  // opts.max_entries reached
  Status st = ufs->ListTree(top.ufs_path(), opts.page_size, [&](std::vector<UfsEntry>& page) -> Status {
    if (opts.stop && opts.stop()) return CancelledError("the load was stopped; loading again resumes it");
    if (opts.max_entries != 0 && passed >= opts.max_entries) {
      out_of_budget = true;
      return CancelledError("more entries than the load may list");
    }
    passed += page.size();
    if (page.empty()) return Status::OK();
    const std::string checkpoint = page.back().name + (page.back().is_dir ? "/" : "");
    MutexLock lock(&mu_);
    auto mit = mounts_.find(top.mount_id());
    if (mit == mounts_.end()) return NotFoundError("the mount was removed while loading");
    b.mount = mit->second;
    for (UfsEntry& e : page) {
      std::vector<std::string> parts;
      bool valid = !e.name.empty();
      for (size_t start = 0; valid;) {
        size_t slash = e.name.find('/', start);
        parts.push_back(e.name.substr(start, slash == std::string::npos ? std::string::npos : slash - start));
        valid = IsValidName(parts.back());
        if (slash == std::string::npos) break;
        start = slash + 1;
      }
      // A name that cannot be a file name is skipped, as a per-directory listing skips it; the
      // directories above it still exist (they would show in that listing too), and the entry is
      // below all of them.
      if (!valid) {
        ++stats.skipped;
        parts.pop_back();
        if (parts.empty()) continue;
      }
      const size_t depth = valid ? parts.size() - 1 : parts.size();  // directories above the entry, below top
      std::string rel;
      for (const auto& p : parts) rel += (rel.empty() ? "" : "/") + p;
      RETURN_IF_ERROR(settle_fresh(valid ? rel : rel + "/"));
      // The directories holding the entry: leave those it is not below, enter the missing ones.
      std::string want;
      size_t keep = 1;
      for (size_t i = 0; i < depth; ++i) {
        want += (i ? "/" : "") + parts[i];
        if (keep == i + 1 && chain.size() > i + 1 && chain[i + 1].rel == want) keep = i + 2;
      }
      while (chain.size() > keep) RETURN_IF_ERROR(close_one());
      for (size_t i = chain.size() - 1; i < depth; ++i) {
        // Entering a directory may replace a file of the same name: write what is pending first so
        // the replacement sees it.
        RETURN_IF_ERROR(WriteLocked(&b));
        UfsEntry d;
        d.name = parts[i];
        d.is_dir = true;
        d.mode = 0555;
        d.mtime_ns = b.now;
        if (auto known = GetChild(chain.back().rec.ino(), d.name); known.ok()) {
          if (auto r = GetRecord(*known); r.ok() && r->type() == rpc::DIRECTORY) {
            d.mode = r->mode();
            d.mtime_ns = r->mtime_ns();
            d.uid = r->uid();
            d.gid = r->gid();
          }
        }
        ASSIGN_OR_RETURN(uint64_t ino, UpsertChildLocked(chain.back().rec, chain.back().gen, d, &b));
        RETURN_IF_ERROR(WriteLocked(&b));
        ASSIGN_OR_RETURN(InodeRecord rec, GetRecord(ino));
        chain.push_back(Open{chain.back().rel.empty() ? parts[i] : chain.back().rel + "/" + parts[i], rec,
                             rec.sync_gen() + 1});
      }
      if (!valid) continue;
      e.name = parts.back();
      if (e.is_dir) {
        // Written in its parent; entered when something below it comes, else complete (empty).
        if (auto known = GetChild(chain.back().rec.ino(), e.name); known.ok()) {
          if (auto r = GetRecord(*known); r.ok() && r->type() == rpc::DIRECTORY) e.mtime_ns = r->mtime_ns();
        }
        ASSIGN_OR_RETURN(uint64_t ino, UpsertChildLocked(chain.back().rec, chain.back().gen, e, &b));
        InodeRecord placeholder;
        placeholder.set_ino(ino);
        fresh_dir = Open{rel, placeholder, 0};
        continue;
      }
      ++stats.files;
      stats.bytes += e.size;
      RETURN_IF_ERROR(UpsertChildLocked(chain.back().rec, chain.back().gen, e, &b).status());
    }
    LoadCursorRecord cursor;
    cursor.set_after(checkpoint);
    for (const Open& o : chain) {
      cursor.add_open_ino(o.rec.ino());
      cursor.add_open_gen(o.gen);
      cursor.add_open_rel(o.rel);
    }
    if (fresh_dir) {
      cursor.set_fresh_dir_ino(fresh_dir->rec.ino());
      cursor.set_fresh_dir_rel(fresh_dir->rel);
    }
    b.batch.Put(cursor_key, cursor.SerializeAsString());
    return WriteLocked(&b);
  }, after);
  if (out_of_budget) {
    // Not an interruption to resume: what was written stays, the cursor goes.
    MutexLock lock(&mu_);
    if (mounts_.count(top.mount_id()) == 0) {
      st = NotFoundError("the mount was removed while loading");
    } else {
      b.batch.Delete(cursor_key);
      st = journal_.Commit(&b.batch).WithContext("drop a load's cursor");
      b.batch.Clear();
    }
    Reclaim(std::move(b.reclaim));
    if (!st.ok()) return st.WithContext("loading the metadata of " + path);
    stats.complete = false;
    stats.added = b.added;
    stats.changed = b.changed;
    stats.removed = b.removed;
    return stats;
  }
  if (st.ok()) {
    MutexLock lock(&mu_);
    auto mit = mounts_.find(top.mount_id());
    if (mit == mounts_.end()) {
      st = NotFoundError("the mount was removed while loading");
    } else {
      b.mount = mit->second;
      if (fresh_dir) {
        Open o = std::move(*fresh_dir);
        fresh_dir.reset();
        st = finish(o);
      }
      while (!chain.empty() && st.ok()) st = close_one();
      b.batch.Delete(cursor_key);
      if (st.ok()) st = WriteLocked(&b);
    }
  }
  Reclaim(std::move(b.reclaim));
  if (!st.ok()) return st.WithContext("loading the metadata of " + path);
  stats.added = b.added;
  stats.changed = b.changed;
  stats.removed = b.removed;
  spdlog::log(opts.max_entries != 0 ? spdlog::level::debug : spdlog::level::info,
              "loaded the metadata of {}: {} files ({} bytes) in {} directories; {} new, {} changed, {} removed", path,
              stats.files, stats.bytes, stats.dirs, b.added, b.changed, b.removed);
  return stats;
}

Status Namespace::SyncFile(InodeRecord* r) {
  if (IsPendingWrite(*r, NowNs())) return Status::OK();  // not in the store before its commit
  ASSIGN_OR_RETURN(auto ufs, UfsFor(r->mount_id()));
  auto e = ufs->Stat(r->ufs_path());
  if (!e.ok()) {
    if (e.status().IsNotFound()) return NotFoundError(r->ufs_path() + " was deleted from the under-storage");
    // The under-storage cannot be asked: keep serving what is known.
    spdlog::warn("metadata sync of {}: {}", r->ufs_path(), e.status().message());
    return Status::OK();
  }
  if (e->is_dir) return NotFoundError(r->ufs_path() + " is now a directory in the under-storage");
  std::vector<FileKey> reclaim;
  {
    MutexLock lock(&mu_);
    auto mit = mounts_.find(r->mount_id());
    if (mit == mounts_.end()) return NotFoundError("the mount was removed");
    rocksdb::WriteBatch batch;
    if (e->version != r->version()) {
      reclaim.push_back(MakeFileKey(mit->second.uri(), r->ufs_path(), r->version()));
      rpc::MountInfo mount = mit->second;
      mount.set_known_bytes(mount.known_bytes() + e->size - std::min(mount.known_bytes() + e->size, r->size()));
      RETURN_IF_ERROR(PutMountLocked(mount, &batch));
      r->set_size(e->size);
      r->set_version(e->version);
      r->set_block_size(BlockSizeOf(mit->second));
      spdlog::info("{} of mount {} has a new version", r->ufs_path(), r->mount_id());
    }
    r->set_mtime_ns(e->mtime_ns);
    r->set_mode(e->mode);
    r->set_uid(e->uid);
    r->set_gid(e->gid);
    r->set_synced_ns(NowNs());
    batch.Put(InodeKey(r->ino()), r->SerializeAsString());
    RETURN_IF_ERROR(journal_.Commit(&batch).WithContext("update file"));
  }
  Reclaim(std::move(reclaim));
  return Status::OK();
}

StatusOr<rpc::MountInfo> Namespace::Mount(const std::string& path, const std::string& uri,
                                          const std::map<std::string, std::string>& options) {
  ASSIGN_OR_RETURN(std::vector<std::string> parts, SplitPath(path));
  if (parts.empty()) return InvalidArgumentError("cannot mount over / (mount at a path like /imagenet)");
  ASSIGN_OR_RETURN(OpenedMount opened, OpenMount(uri, options, access_, &ufs_counters_));
  auto root_stat = opened.ufs->Stat("");
  if (!root_stat.ok() && root_stat.status().IsNotFound() && opened.cache.write != WriteMode::kOff) {
    // An object store's prefix with nothing below it yet is an empty directory to write into
    // (checkpoints under a new prefix); a missing bucket or local directory is still an error.
    auto parsed = ParseUri(uri);
    if (parsed.ok() && (parsed->scheme == "s3" || parsed->scheme == "oss") && !parsed->path.empty()) {
      UfsEntry empty;
      empty.is_dir = true;
      empty.mode = 0755;
      empty.mtime_ns = NowNs();
      root_stat = empty;
    }
  }
  ASSIGN_OR_RETURN(UfsEntry root_entry, std::move(root_stat));
  if (!root_entry.is_dir) return InvalidArgumentError(RedactUri(uri) + " is not a directory");

  MutexLock lock(&mu_);
  rocksdb::WriteBatch batch;
  int64_t now = NowNs();
  uint64_t parent = kRootIno;
  std::string canonical;
  bool bumped = false;
  for (size_t i = 0; i < parts.size(); ++i) {
    canonical += "/" + parts[i];
    auto child = GetChild(parent, parts[i]);
    bool last = i + 1 == parts.size();
    if (child.ok()) {
      ASSIGN_OR_RETURN(InodeRecord r, GetRecord(*child));
      if (last) return AlreadyExistsError(canonical + " is already mounted or in use");
      if (r.mount_id() != 0) return InvalidArgumentError(canonical + " is a mounted dataset; mounts cannot nest");
      parent = r.ino();
      continue;
    }
    InodeRecord r;
    r.set_ino(next_ino_++);
    r.set_parent(parent);
    r.set_name(parts[i]);
    r.set_type(rpc::DIRECTORY);
    if (last) {
      rpc::MountInfo m;
      m.set_id(next_mount_++);
      m.set_path(canonical);
      m.set_uri(uri);
      m.mutable_options()->insert(options.begin(), options.end());
      m.set_root_ino(r.ino());
      m.set_created_ns(now);
      m.set_block_size(block_size_);  // the mount's files keep it, whatever master.block_size becomes
      r.set_mount_id(m.id());
      r.set_mode(root_entry.mode);
      r.set_uid(root_entry.uid);
      r.set_gid(root_entry.gid);
      r.set_mtime_ns(root_entry.mtime_ns);
      r.set_listed(false);
      RETURN_IF_ERROR(PutMountLocked(m, &batch));
      open_mounts_.Put(m.id(), opened);
    } else {
      r.set_mode(0755);
      r.set_mtime_ns(now);
      r.set_listed(true);
    }
    if (!bumped) {
      // The first new entry lands in an existing directory: its listing changed.
      ASSIGN_OR_RETURN(InodeRecord pr, GetRecord(parent));
      pr.set_content_gen(pr.content_gen() + 1);
      batch.Put(InodeKey(parent), pr.SerializeAsString());
      bumped = true;
    }
    batch.Put(InodeKey(r.ino()), r.SerializeAsString());
    batch.Put(EntryKey(parent, r.name()), Be64(r.ino()));
    batch.Put(ChildKey(parent, r.ino()), "");
    parent = r.ino();
  }
  batch.Put(kNextIno, Be64(next_ino_));
  batch.Put(kNextMount, Be64(next_mount_));
  RETURN_IF_ERROR(journal_.Commit(&batch, /*sync=*/true).WithContext("write mount"));
  for (auto& [id, m] : mounts_) {
    if (m.path() == canonical) {
      spdlog::info("mounted {} at {}", RedactUri(uri), canonical);
      return m;
    }
  }
  return InternalError("mount record vanished");
}

Status Namespace::DeleteSubtreeLocked(uint64_t ino, const std::string* uri, std::vector<FileKey>* reclaim,
                                      uint64_t* files, uint64_t* bytes) {
  // Iterative depth-first walk; deletes are written in batches of bounded size.
  std::vector<uint64_t> stack{ino};
  rocksdb::WriteBatch batch;
  while (!stack.empty()) {
    uint64_t cur = stack.back();
    stack.pop_back();
    std::string prefix = "C" + Be64(cur);
    std::unique_ptr<rocksdb::Iterator> it(db_->NewIterator({}));
    for (it->Seek(prefix); it->Valid() && it->key().starts_with(prefix); it->Next()) {
      uint64_t child = GetBe64(it->key().data() + 9);
      stack.push_back(child);
      batch.Delete(it->key());
    }
    RETURN_IF_ERROR(FromRocks(it->status(), "list a subtree to delete"));
    auto rec = GetRecord(cur);
    if (rec.ok()) {
      batch.Delete(EntryKey(rec->parent(), rec->name()));
      if (uri != nullptr && rec->type() == rpc::REGULAR) {
        reclaim->push_back(MakeFileKey(*uri, rec->ufs_path(), rec->version()));
        ++*files;
        *bytes += rec->size();
      }
    }
    batch.Delete(InodeKey(cur));
    if (batch.Count() > 10000) {
      RETURN_IF_ERROR(journal_.Commit(&batch).WithContext("delete subtree"));
      batch.Clear();
    }
  }
  return journal_.Commit(&batch).WithContext("delete subtree");
}

StatusOr<rpc::MountInfo> Namespace::Unmount(const std::string& path) {
  ASSIGN_OR_RETURN(std::vector<std::string> parts, SplitPath(path));
  MutexLock lock(&mu_);
  std::string canonical;
  for (const auto& p : parts) canonical += "/" + p;
  rpc::MountInfo found;
  bool ok = false;
  for (const auto& [id, m] : mounts_) {
    if (m.path() == canonical) {
      found = m;
      ok = true;
    }
  }
  if (!ok) return NotFoundError(canonical + " is not a mounted dataset (see `granary mounts`)");
  ASSIGN_OR_RETURN(InodeRecord root, GetRecord(found.root_ino()));
  uint64_t parent = root.parent();
  {
    rocksdb::WriteBatch unlink;
    unlink.Delete(ChildKey(parent, root.ino()));
    if (auto pr = GetRecord(parent); pr.ok()) {
      pr->set_content_gen(pr->content_gen() + 1);  // its listing changed
      unlink.Put(InodeKey(parent), pr->SerializeAsString());
    }
    RETURN_IF_ERROR(journal_.Commit(&unlink).WithContext("unlink mount"));
  }
  RETURN_IF_ERROR(DeleteSubtreeLocked(root.ino()));
  {
    // And the cursors of its unfinished loads.
    rocksdb::WriteBatch cursors;
    cursors.DeleteRange(CursorKey(found.id(), 0), CursorKey(found.id() + 1, 0));
    RETURN_IF_ERROR(journal_.Commit(&cursors).WithContext("delete load cursors"));
  }
  // Remove virtual parents left empty.
  while (parent != kRootIno) {
    std::string prefix = "C" + Be64(parent);
    std::unique_ptr<rocksdb::Iterator> it(db_->NewIterator({}));
    it->Seek(prefix);
    RETURN_IF_ERROR(FromRocks(it->status(), "look for children of an emptied parent"));
    if (it->Valid() && it->key().starts_with(prefix)) break;
    ASSIGN_OR_RETURN(InodeRecord pr, GetRecord(parent));
    rocksdb::WriteBatch unlink;
    unlink.Delete(ChildKey(pr.parent(), pr.ino()));
    RETURN_IF_ERROR(journal_.Commit(&unlink).WithContext("unlink parent"));
    RETURN_IF_ERROR(DeleteSubtreeLocked(pr.ino()));
    parent = pr.parent();
  }
  rocksdb::WriteBatch gone;
  gone.Delete(MountKey(found.id()));
  RETURN_IF_ERROR(journal_.Commit(&gone, /*sync=*/true).WithContext("delete mount"));
  mounts_.erase(found.id());
  {
    MutexLock sync_lock(&sync_mu_);
    sync_ms_.erase(found.id());
    write_modes_.erase(found.id());
  }
  open_mounts_.Erase(found.id());
  spdlog::info("unmounted {}", canonical);
  found.clear_options();
  return found;
}

std::vector<rpc::MountInfo> Namespace::ListMounts() const {
  MutexLock lock(&mu_);
  std::vector<rpc::MountInfo> out;
  for (const auto& [id, m] : mounts_) {
    out.push_back(m);
    out.back().clear_options();
  }
  return out;
}

StatusOr<rpc::MountInfo> Namespace::GetMount(uint64_t id) const {
  MutexLock lock(&mu_);
  auto it = mounts_.find(id);
  if (it == mounts_.end()) return NotFoundError("mount " + std::to_string(id) + " does not exist");
  return it->second;
}

namespace {

rpc::FileInfo FileInfoOf(const InodeRecord& r, rpc::Attr attr) {
  rpc::FileInfo f;
  *f.mutable_attr() = std::move(attr);
  f.set_mount_id(r.mount_id());
  f.set_ufs_path(r.ufs_path());
  f.set_version(r.version());
  f.set_block_size(r.block_size());
  return f;
}

}  // namespace

StatusOr<rpc::Attr> Namespace::Lookup(uint64_t parent, const std::string& name, bool* ufs_needed,
                                      rpc::FileInfo* file) {
  ASSIGN_OR_RETURN(InodeRecord dir, GetRecord(parent));
  if (dir.type() != rpc::DIRECTORY) return InvalidArgumentError("not a directory");
  if (!IsValidName(name)) return NotFoundError("'" + name + "' does not exist");
  RETURN_IF_ERROR(EnsureListed(dir, ufs_needed));
  ASSIGN_OR_RETURN(uint64_t child, GetChild(parent, name));
  ASSIGN_OR_RETURN(InodeRecord r, GetRecord(child));
  rpc::Attr a = AttrOf(r);
  if (file != nullptr && r.type() == rpc::REGULAR && !SyncDue(r)) *file = FileInfoOf(r, a);
  return a;
}

StatusOr<rpc::FileInfo> Namespace::StoredFile(uint64_t ino) {
  ASSIGN_OR_RETURN(InodeRecord r, GetRecord(ino));
  if (r.type() != rpc::REGULAR) return InvalidArgumentError("inode " + std::to_string(ino) + " is not a file");
  return FileInfoOf(r, AttrOf(r));
}

StatusOr<rpc::Attr> Namespace::GetAttr(uint64_t ino, bool* ufs_needed) {
  ASSIGN_OR_RETURN(InodeRecord r, GetRecord(ino));
  if (r.type() == rpc::REGULAR && SyncDue(r)) {
    if (ufs_needed) return NeedsUfs(ufs_needed);
    RETURN_IF_ERROR(SyncFile(&r));
  }
  if (r.type() == rpc::DIRECTORY && r.listed() && SyncDue(r)) {
    if (ufs_needed) return NeedsUfs(ufs_needed);
    // A listed directory due for a sync is synced here too: granary-fuse asks for its attributes
    // (generation) when it is opened, and serves the kernel's cached listing when it is unchanged.
    RETURN_IF_ERROR(EnsureListed(r));
    ASSIGN_OR_RETURN(r, GetRecord(ino));
  }
  return AttrOf(r);
}

StatusOr<rpc::Attr> Namespace::Resolve(const std::string& path, bool* ufs_needed) {
  ASSIGN_OR_RETURN(std::vector<std::string> parts, SplitPath(path));
  uint64_t ino = kRootIno;
  std::string walked;
  for (const auto& p : parts) {
    walked += "/" + p;
    auto a = Lookup(ino, p, ufs_needed);
    if (ufs_needed != nullptr && *ufs_needed) return a.status();
    if (!a.ok()) {
      if (a.status().IsNotFound()) return NotFoundError(walked + " does not exist");
      if (a.status().code() == Code::kInvalidArgument) return NotFoundError(walked + " is not a directory");
      return a.status();
    }
    ino = a->ino();
  }
  return GetAttr(ino, ufs_needed);
}

StatusOr<rpc::FileInfo> Namespace::GetFile(uint64_t ino, bool* ufs_needed) {
  ASSIGN_OR_RETURN(InodeRecord r, GetRecord(ino));
  if (r.type() != rpc::REGULAR) return InvalidArgumentError("inode " + std::to_string(ino) + " is not a file");
  if (SyncDue(r)) {
    if (ufs_needed) return NeedsUfs(ufs_needed);
    RETURN_IF_ERROR(SyncFile(&r));
  }
  return FileInfoOf(r, AttrOf(r));
}

Status Namespace::ReadDir(uint64_t ino, uint64_t after, uint32_t limit, rpc::ReadDirResponse* out,
                          bool* ufs_needed, bool files) {
  ASSIGN_OR_RETURN(InodeRecord dir, GetRecord(ino));
  if (dir.type() != rpc::DIRECTORY) return InvalidArgumentError("not a directory");
  RETURN_IF_ERROR(EnsureListed(dir, ufs_needed));
  if (limit == 0 || limit > 4096) limit = 4096;
  std::string prefix = "C" + Be64(ino);
  std::unique_ptr<rocksdb::Iterator> it(db_->NewIterator({}));
  std::vector<uint64_t> children;
  for (it->Seek(prefix + Be64(after + 1)); it->Valid() && it->key().starts_with(prefix); it->Next()) {
    if (children.size() == limit) break;
    children.push_back(GetBe64(it->key().data() + 9));
  }
  RETURN_IF_ERROR(FromRocks(it->status(), "list a directory"));
  out->set_end(!(it->Valid() && it->key().starts_with(prefix)));
  // The children's records in one batched read: children listed together have consecutive
  // inode numbers, so their records share table blocks (a page is several times cheaper than one
  // Get per child).
  std::vector<std::string> keys;
  keys.reserve(children.size());
  for (uint64_t child : children) keys.push_back(InodeKey(child));
  std::vector<rocksdb::Slice> slices(keys.begin(), keys.end());
  std::vector<rocksdb::PinnableSlice> values(keys.size());
  std::vector<rocksdb::Status> statuses(keys.size());
  db_->MultiGet({}, db_->DefaultColumnFamily(), keys.size(), slices.data(), values.data(), statuses.data(),
                /*sorted_input=*/true);
  InodeRecord r;
  size_t bytes = 0;
  for (size_t i = 0; i < children.size(); ++i) {
    if (statuses[i].IsNotFound()) continue;  // removed concurrently by an unmount
    RETURN_IF_ERROR(FromRocks(statuses[i], "read inode"));
    if (!r.ParseFromArray(values[i].data(), static_cast<int>(values[i].size()))) {
      return DataLossError("corrupt inode record " + std::to_string(children[i]));
    }
    auto* e = out->add_entries();
    e->set_name(r.name());
    *e->mutable_attr() = AttrOf(r);
    e->set_cookie(children[i]);
    if (files && r.type() == rpc::REGULAR && !SyncDue(r)) *e->mutable_file() = FileInfoOf(r, e->attr());
    if (files && (bytes += e->ByteSizeLong()) >= kMaxDirPageBytes && i + 1 < children.size()) {
      // Paths of up to 4 KiB each: a page of 4096 would pass gRPC's 16 MiB. The rest comes after
      // this entry's cookie.
      out->set_end(false);
      break;
    }
  }
  return Status::OK();
}

StatusOr<std::string> Namespace::CanonicalPath(const std::string& path) {
  ASSIGN_OR_RETURN(std::vector<std::string> parts, SplitPath(path));
  std::string out;
  for (const auto& p : parts) out += "/" + p;
  return out.empty() ? "/" : out;
}

Status Namespace::ForEachFile(const std::string& path,
                              const std::function<Status(const std::string&, const rpc::FileInfo&)>& fn) {
  ASSIGN_OR_RETURN(std::string top_path, CanonicalPath(path));
  ASSIGN_OR_RETURN(rpc::Attr top, Resolve(top_path));
  if (top.type() == rpc::REGULAR) {
    ASSIGN_OR_RETURN(rpc::FileInfo f, GetFile(top.ino()));
    return fn(top_path, f);
  }
  std::vector<std::pair<uint64_t, std::string>> dirs{{top.ino(), top_path == "/" ? "" : top_path}};
  while (!dirs.empty()) {
    auto [d, dpath] = std::move(dirs.back());
    dirs.pop_back();
    std::vector<std::pair<uint64_t, std::string>> subdirs;
    uint64_t after = 0;
    for (;;) {
      rpc::ReadDirResponse page;
      RETURN_IF_ERROR(ReadDir(d, after, 1000, &page));
      for (const auto& e : page.entries()) {
        if (e.attr().type() == rpc::DIRECTORY) {
          subdirs.push_back({e.attr().ino(), dpath + "/" + e.name()});
        } else {
          ASSIGN_OR_RETURN(rpc::FileInfo f, GetFile(e.attr().ino()));
          RETURN_IF_ERROR(fn(dpath + "/" + e.name(), f));
        }
        after = e.cookie();
      }
      if (page.end() || page.entries().empty()) break;
    }
    // Visit subdirectories in listing order (the stack pops the last first).
    dirs.insert(dirs.end(), std::make_move_iterator(subdirs.rbegin()), std::make_move_iterator(subdirs.rend()));
  }
  return Status::OK();
}

StatusOr<bool> Namespace::TreeListed(const std::string& path) {
  ASSIGN_OR_RETURN(rpc::Attr top, Resolve(path));
  if (top.type() != rpc::DIRECTORY) return false;
  std::vector<uint64_t> dirs{top.ino()};
  while (!dirs.empty()) {
    const uint64_t d = dirs.back();
    dirs.pop_back();
    uint64_t after = 0;
    for (;;) {
      rpc::ReadDirResponse page;
      bool ufs_needed = false;
      Status st = ReadDir(d, after, 4096, &page, &ufs_needed, false);
      if (ufs_needed) return false;  // not listed, or due for a sync
      RETURN_IF_ERROR(st);
      for (const auto& e : page.entries()) {
        if (e.attr().type() == rpc::DIRECTORY) dirs.push_back(e.attr().ino());
        after = e.cookie();
      }
      if (page.end() || page.entries().empty()) break;
    }
  }
  return true;
}

Status Namespace::ForEachFileKey(const std::string& path,
                                 const std::function<void(const FileKey&, uint64_t size)>& fn) {
  std::map<uint64_t, std::string> uris;
  return ForEachFile(path, [&](const std::string&, const rpc::FileInfo& f) -> Status {
    auto u = uris.find(f.mount_id());
    if (u == uris.end()) {
      ASSIGN_OR_RETURN(rpc::MountInfo m, GetMount(f.mount_id()));
      u = uris.emplace(f.mount_id(), m.uri()).first;
    }
    fn(MakeFileKey(u->second, f.ufs_path(), f.version()), f.attr().size());
    return Status::OK();
  });
}

Status Namespace::PutJobRecord(const std::string& key, const std::string& value) {
  rocksdb::WriteBatch batch;
  batch.Put("J" + key, value);
  return journal_.Commit(&batch).WithContext("record job");
}

StatusOr<std::string> Namespace::GetJobRecord(const std::string& key) const {
  std::string v;
  rocksdb::Status s = db_->Get({}, "J" + key, &v);
  if (s.IsNotFound()) return NotFoundError("no job record " + key);
  RETURN_IF_ERROR(FromRocks(s, "read job"));
  return v;
}

Status Namespace::ForEachJobRecord(const std::string& prefix,
                                   const std::function<void(const std::string&, const std::string&)>& fn) const {
  std::unique_ptr<rocksdb::Iterator> it(db_->NewIterator({}));
  const std::string p = "J" + prefix;
  for (it->Seek(p); it->Valid() && it->key().starts_with(p); it->Next()) {
    fn(it->key().ToString().substr(1), it->value().ToString());
  }
  return FromRocks(it->status(), "list jobs");
}

Status Namespace::PutMembers(const MembersRecord& r) {
  rocksdb::WriteBatch batch;
  batch.Put("W/members", r.SerializeAsString());
  return journal_.Commit(&batch).WithContext("record the workers");
}

StatusOr<MembersRecord> Namespace::GetMembers() const {
  std::string v;
  MembersRecord r;
  rocksdb::Status s = db_->Get({}, "W/members", &v);
  if (s.IsNotFound()) return r;
  RETURN_IF_ERROR(FromRocks(s, "read the workers"));
  if (!r.ParseFromString(v)) return DataLossError("the master's database holds a malformed worker list");
  return r;
}

Status Namespace::PutPin(const std::string& path, const std::vector<FileKey>& keys) {
  std::string v;
  v.reserve(keys.size() * 16);
  for (const auto& k : keys) v += FileKeyBytes(k);
  rocksdb::WriteBatch batch;
  batch.Put("P" + path, v);
  return journal_.Commit(&batch).WithContext("record pin");
}

Status Namespace::DeletePin(const std::string& path) {
  rocksdb::WriteBatch batch;
  batch.Delete("P" + path);
  return journal_.Commit(&batch).WithContext("remove pin");
}

StatusOr<std::map<std::string, std::vector<FileKey>>> Namespace::Pins() const {
  std::map<std::string, std::vector<FileKey>> out;
  std::unique_ptr<rocksdb::Iterator> it(db_->NewIterator({}));
  for (it->Seek("P"); it->Valid() && it->key().starts_with("P"); it->Next()) {
    auto& keys = out[it->key().ToString().substr(1)];
    for (size_t off = 0; off + 16 <= it->value().size(); off += 16) {
      FileKey k;
      if (FileKeyFromBytes(std::string_view(it->value().data() + off, 16), &k)) keys.push_back(k);
    }
  }
  RETURN_IF_ERROR(FromRocks(it->status(), "list pins"));
  return out;
}

// ---- Writes ----

StatusOr<InodeRecord> Namespace::WritableDir(uint64_t parent, const std::string& what) {
  ASSIGN_OR_RETURN(InodeRecord dir, GetRecord(parent));
  if (dir.type() != rpc::DIRECTORY) return InvalidArgumentError(what + ": inode " + std::to_string(parent) + " is not a directory");
  if (WriteModeOf(dir.mount_id()) == WriteMode::kOff) {
    return ReadOnlyError(what + ": " + (dir.mount_id() == 0 ? std::string("outside every mounted dataset")
                                                              : "the dataset is mounted read-only; mount it with -o write=through "
                                                                "or -o write=back to write to it"));
  }
  return dir;
}

Status Namespace::CommitChangeLocked(InodeRecord dir, const rpc::MountInfo& mount, rocksdb::WriteBatch* batch) {
  dir.set_content_gen(dir.content_gen() + 1);
  dir.set_mtime_ns(NowNs());
  batch->Put(InodeKey(dir.ino()), dir.SerializeAsString());
  batch->Put(kNextIno, Be64(next_ino_));
  RETURN_IF_ERROR(PutMountLocked(mount, batch));
  return journal_.Commit(batch);
}

StatusOr<Namespace::WriteTarget> Namespace::PrepareCreate(uint64_t parent, const std::string& name, uint32_t mode,
                                                          uint32_t uid, uint32_t gid) {
  if (!IsValidName(name) || IsWritingName(name)) return InvalidArgumentError("'" + name + "' cannot be a file name here");
  ASSIGN_OR_RETURN(InodeRecord dir, WritableDir(parent, "create " + name));
  RETURN_IF_ERROR(EnsureListed(dir));
  WriteTarget t;
  t.mode = WriteModeOf(dir.mount_id());
  MutexLock lock(&mu_);
  auto child = GetChild(parent, name);
  if (child.ok()) {
    ASSIGN_OR_RETURN(InodeRecord r, GetRecord(*child));
    if (r.type() != rpc::REGULAR) return InvalidArgumentError("create " + name + ": a directory of that name exists");
    *t.file.mutable_attr() = AttrOf(r);
    t.file.set_mount_id(r.mount_id());
    t.file.set_ufs_path(r.ufs_path());
    t.file.set_version(r.version());
    t.file.set_block_size(r.block_size());
    return t;
  }
  if (child.status().code() != Code::kNotFound) return child.status();
  auto mit = mounts_.find(dir.mount_id());
  if (mit == mounts_.end()) return NotFoundError("the dataset was unmounted");
  ASSIGN_OR_RETURN(InodeRecord fresh, GetRecord(parent));  // content_gen may have moved
  InodeRecord r;
  r.set_ino(next_ino_++);
  r.set_parent(parent);
  r.set_name(name);
  r.set_type(rpc::REGULAR);
  r.set_mtime_ns(NowNs());
  r.set_mode(mode & 07777);
  r.set_uid(uid);
  r.set_gid(gid);
  r.set_mount_id(dir.mount_id());
  r.set_ufs_path(JoinPath(dir.ufs_path(), name));
  r.set_block_size(BlockSizeOf(mit->second));
  r.set_synced_ns(NowNs());
  rocksdb::WriteBatch batch;
  batch.Put(InodeKey(r.ino()), r.SerializeAsString());
  batch.Put(EntryKey(parent, name), Be64(r.ino()) + Be64(fresh.sync_gen()));
  batch.Put(ChildKey(parent, r.ino()), "");
  rpc::MountInfo m = mit->second;
  m.set_known_files(m.known_files() + 1);
  RETURN_IF_ERROR(CommitChangeLocked(fresh, m, &batch).WithContext("create " + name));
  *t.file.mutable_attr() = AttrOf(r);
  t.file.set_mount_id(r.mount_id());
  t.file.set_ufs_path(r.ufs_path());
  t.file.set_block_size(r.block_size());
  t.created = true;
  return t;
}

StatusOr<Namespace::WriteTarget> Namespace::PrepareWrite(uint64_t ino) {
  ASSIGN_OR_RETURN(InodeRecord r, GetRecord(ino));
  if (r.type() != rpc::REGULAR) return InvalidArgumentError("inode " + std::to_string(ino) + " is not a file");
  RETURN_IF_ERROR(WritableDir(r.parent(), "write " + r.name()).status());
  WriteTarget t;
  t.mode = WriteModeOf(r.mount_id());
  *t.file.mutable_attr() = AttrOf(r);
  t.file.set_mount_id(r.mount_id());
  t.file.set_ufs_path(r.ufs_path());
  t.file.set_version(r.version());
  t.file.set_block_size(r.block_size());
  return t;
}

StatusOr<rpc::Attr> Namespace::CommitWrite(uint64_t ino, uint64_t parent, const std::string& name,
                                           const std::string& written_path, const UfsEntry& written) {
  if (written.is_dir) return InvalidArgumentError("commit of " + name + ": the under-storage has a directory there");
  // Attributes no store gives are a caller's mistake or worse, never recorded (a size of 2^64-1
  // would make the file answer EIO to every stat).
  if (written.size > kMaxFileSize) {
    return InvalidArgumentError("commit of " + name + ": a size of " + std::to_string(written.size) +
                                " bytes is beyond any store's (at most " + std::to_string(kMaxFileSize) + ")");
  }
  if (written.mode > 07777) return InvalidArgumentError("commit of " + name + ": mode " + std::to_string(written.mode) + " is not permission bits");
  if (written.version.empty() || written.version.size() > 1024) {
    return InvalidArgumentError("commit of " + name + ": the store's version must be 1 to 1024 bytes");
  }
  if (written.uid == UINT32_MAX || written.gid == UINT32_MAX) {
    return InvalidArgumentError("commit of " + name + ": owner -1 is no owner");
  }
  UfsEntry e = written;
  // The file by its inode: it may have been renamed (or removed) while its bytes were uploaded.
  auto rec = GetRecord(ino);
  if (rec.ok() && rec->type() == rpc::REGULAR) {
    parent = rec->parent();
    if (!written_path.empty() && rec->ufs_path() != written_path) {
      // Renamed while the write was pending: the bytes landed at the old path; moved to the new.
      ASSIGN_OR_RETURN(auto ufs, UfsFor(rec->mount_id()));
      RETURN_IF_ERROR(ufs->Rename(written_path, rec->ufs_path()).WithContext("move a file renamed while written"));
      auto moved = ufs->Stat(rec->ufs_path());
      if (moved.ok() && !moved->is_dir) e = *moved;
    }
  } else if (rec.ok() || rec.status().IsNotFound()) {
    if (!rec.ok() && !GetChild(parent, name).ok()) {
      // Removed while it was written (unlink of an open file): what was uploaded goes too.
      auto gone = GetRecord(parent);
      if (gone.ok() && !written_path.empty()) {
        auto ufs = UfsFor(gone->mount_id());
        if (ufs.ok()) (*ufs)->Remove(written_path).IgnoreError();
      }
      spdlog::info("a file removed while it was written was committed: {} removed from the store again", written_path);
      return rpc::Attr();
    }
  } else {
    return rec.status();
  }
  ASSIGN_OR_RETURN(InodeRecord dir, WritableDir(parent, "commit " + name));
  // A chmod, chown or utimes made while the store had no copy of the file (a write=back file
  // closed, its upload not done): applied to the store now, as the daemon (the caller was checked
  // when it asked).
  UfsAttrChange pending_attrs;
  if (rec.ok() && rec->type() == rpc::REGULAR && rec->set_while_pending() != 0) {
    const uint32_t bits = rec->set_while_pending();
    if (bits & 1) pending_attrs.mode = rec->mode();
    if (bits & 2) pending_attrs.uid = rec->uid();
    if (bits & 4) pending_attrs.gid = rec->gid();
    if (bits & 8) pending_attrs.mtime_ns = rec->mtime_ns();
    auto ufs = UfsFor(rec->mount_id());
    Status applied = ufs.ok() ? (*ufs)->SetAttr(rec->ufs_path(), pending_attrs) : ufs.status();
    if (!applied.ok()) {
      spdlog::warn("commit of inode {}: the mode, owner or times set while it was written could not be kept: {}", ino,
                   applied.ToString());
      pending_attrs = {};
    }
  }
  std::vector<FileKey> reclaim;
  rpc::Attr attr;
  {
    MutexLock lock(&mu_);
    auto mit = mounts_.find(dir.mount_id());
    if (mit == mounts_.end()) return NotFoundError("the dataset was unmounted");
    rpc::MountInfo m = mit->second;
    ASSIGN_OR_RETURN(InodeRecord fresh, GetRecord(parent));
    auto current = GetRecord(ino);
    InodeRecord r;
    if (current.ok() && current->type() == rpc::REGULAR) {
      r = *current;
    } else {
      // Its record is gone but the name is taken (made again by another writer or a listing):
      // that file is what the store now has at the path.
      ASSIGN_OR_RETURN(uint64_t other, GetChild(parent, name));
      ASSIGN_OR_RETURN(r, GetRecord(other));
      if (r.type() != rpc::REGULAR) return InvalidArgumentError("commit of " + name + ": a directory took its name");
    }
    if (!r.version().empty()) reclaim.push_back(MakeFileKey(m.uri(), r.ufs_path(), r.version()));
    m.set_known_bytes(m.known_bytes() - std::min(m.known_bytes(), r.size()));
    r.set_size(e.size);
    r.set_version(e.version);
    r.set_mtime_ns(e.mtime_ns);
    if (e.mode != 0) r.set_mode(e.mode);
    r.set_uid(e.uid);  // as the store has it, so a later sync changes nothing
    r.set_gid(e.gid);
    if (pending_attrs.mode) r.set_mode(*pending_attrs.mode);
    if (pending_attrs.uid) r.set_uid(*pending_attrs.uid);
    if (pending_attrs.gid) r.set_gid(*pending_attrs.gid);
    if (pending_attrs.mtime_ns) r.set_mtime_ns(*pending_attrs.mtime_ns);
    r.set_set_while_pending(0);
    r.set_synced_ns(NowNs());
    m.set_known_bytes(m.known_bytes() + e.size);
    rocksdb::WriteBatch batch;
    batch.Put(InodeKey(r.ino()), r.SerializeAsString());
    RETURN_IF_ERROR(CommitChangeLocked(fresh, m, &batch).WithContext("commit " + name));
    attr = AttrOf(r);
  }
  Reclaim(std::move(reclaim));
  return attr;
}

Status Namespace::Remove(uint64_t parent, const std::string& name, bool dir_wanted, const WriteCaller& as,
                         uint64_t pending_ino) {
  ASSIGN_OR_RETURN(InodeRecord dir, WritableDir(parent, (dir_wanted ? "rmdir " : "unlink ") + name));
  RETURN_IF_ERROR(EnsureListed(dir));
  ASSIGN_OR_RETURN(uint64_t ino, GetChild(parent, name));
  ASSIGN_OR_RETURN(InodeRecord r, GetRecord(ino));
  const bool is_dir = r.type() == rpc::DIRECTORY;
  if (is_dir != dir_wanted) {
    return InvalidArgumentError(name + (is_dir ? " is a directory (use rmdir)" : " is not a directory"));
  }
  if (r.ino() == r.mount_id() || (is_dir && r.ufs_path().empty())) {
    return InvalidArgumentError("cannot remove the root of a mounted dataset (use granary umount)");
  }
  const bool never_committed = !is_dir && r.version().empty();
  if (pending_ino != 0 && (ino != pending_ino || !never_committed)) {
    return NotFoundError("unlink " + name + ": no longer the file whose write failed");
  }
  if (pending_ino == 0) {
    ASSIGN_OR_RETURN(auto ufs, UfsFor(r.mount_id()));
    // A file written but never committed is not in the store (unless another writer put one
    // there): only its name goes, whatever the store would say to a remove (a read-only source
    // answers EROFS even for a name it does not have).
    const bool in_store = !never_committed || !ufs->Stat(r.ufs_path()).status().IsNotFound();
    Status st = !in_store ? Status::OK() : is_dir ? ufs->RemoveDir(r.ufs_path(), as) : ufs->Remove(r.ufs_path(), as);
    // Removed by someone else meanwhile: the name goes all the same.
    if (!st.ok() && st.code() != Code::kNotFound) return st;
  }
  std::vector<FileKey> reclaim;
  {
    MutexLock lock(&mu_);
    auto mit = mounts_.find(r.mount_id());
    if (mit == mounts_.end()) return NotFoundError("the dataset was unmounted");
    rpc::MountInfo m = mit->second;
    uint64_t files = 0, bytes = 0;
    RETURN_IF_ERROR(DeleteSubtreeLocked(ino, &m.uri(), &reclaim, &files, &bytes));
    if (!is_dir && r.version().empty()) files = std::max<uint64_t>(files, 1);  // a pending file was counted
    m.set_known_files(m.known_files() - std::min(m.known_files(), files));
    m.set_known_bytes(m.known_bytes() - std::min(m.known_bytes(), bytes));
    ASSIGN_OR_RETURN(InodeRecord fresh, GetRecord(parent));
    rocksdb::WriteBatch batch;
    batch.Delete(ChildKey(parent, ino));
    RETURN_IF_ERROR(CommitChangeLocked(fresh, m, &batch).WithContext("remove " + name));
  }
  Reclaim(std::move(reclaim));
  return Status::OK();
}

StatusOr<rpc::Attr> Namespace::MakeDir(uint64_t parent, const std::string& name, uint32_t mode,
                                       const WriteCaller& as) {
  uint32_t uid = as.uid, gid = as.gid;
  if (!IsValidName(name) || IsWritingName(name)) return InvalidArgumentError("'" + name + "' cannot be a directory name here");
  ASSIGN_OR_RETURN(InodeRecord dir, WritableDir(parent, "mkdir " + name));
  RETURN_IF_ERROR(EnsureListed(dir));
  if (GetChild(parent, name).ok()) return AlreadyExistsError("mkdir " + name + ": it exists");
  ASSIGN_OR_RETURN(auto ufs, UfsFor(dir.mount_id()));
  std::string path = JoinPath(dir.ufs_path(), name);
  RETURN_IF_ERROR(ufs->MakeDir(path, mode, as));
  // The owner and mode as the store made them (the caller where the store keeps owners; an object
  // store's marker has none: the caller's), so a later sync changes nothing.
  auto made = ufs->Stat(path);
  if (made.ok() && made->is_dir) {
    uid = made->uid;
    gid = made->gid;
    if (made->mode != 0555) mode = made->mode;  // 0555: an object store's stand-in, not a real mode
  }
  MutexLock lock(&mu_);
  auto mit = mounts_.find(dir.mount_id());
  if (mit == mounts_.end()) return NotFoundError("the dataset was unmounted");
  ASSIGN_OR_RETURN(InodeRecord fresh, GetRecord(parent));
  InodeRecord r;
  r.set_ino(next_ino_++);
  r.set_parent(parent);
  r.set_name(name);
  r.set_type(rpc::DIRECTORY);
  r.set_mtime_ns(NowNs());
  r.set_mode(mode & 07777);
  r.set_uid(uid);
  r.set_gid(gid);
  r.set_mount_id(dir.mount_id());
  r.set_ufs_path(path);
  r.set_listed(true);  // made empty just now: nothing to list
  r.set_synced_ns(NowNs());
  r.set_sync_gen(1);
  rocksdb::WriteBatch batch;
  batch.Put(InodeKey(r.ino()), r.SerializeAsString());
  batch.Put(EntryKey(parent, name), Be64(r.ino()) + Be64(fresh.sync_gen()));
  batch.Put(ChildKey(parent, r.ino()), "");
  RETURN_IF_ERROR(CommitChangeLocked(fresh, mit->second, &batch).WithContext("mkdir " + name));
  return AttrOf(r);
}

Status Namespace::Rename(uint64_t parent, const std::string& name, uint64_t new_parent, const std::string& new_name,
                         bool noreplace, const WriteCaller& as) {
  // A directory's rename holds rename_mu_ until its contents are written out (one at a time; one a
  // crash left halfway is finished first).
  ASSIGN_OR_RETURN(InodeRecord from_dir, WritableDir(parent, "rename " + name));
  RETURN_IF_ERROR(EnsureListed(from_dir));
  for (int attempt = 0; attempt < 3; ++attempt) {
    auto ino = GetChild(parent, name);
    auto rec = ino.ok() ? GetRecord(*ino) : StatusOr<InodeRecord>(ino.status());
    uint64_t moved = 0;
    if (!rec.ok() || rec->type() != rpc::DIRECTORY) {
      Status st = RenameEntry(parent, name, new_parent, new_name, noreplace, as, /*dir_allowed=*/false, &moved);
      if (st.code() == Code::kAborted) continue;  // a directory now: once more, as one
      return st;
    }
    MutexLock one_rename(&rename_mu_);
    RETURN_IF_ERROR(FinishRenamesLocked());
    // The blocks below it were cached under the old paths: their keys, read before anything moves
    // (a writer may rewrite a record with its new path before the batches reach it).
    std::vector<FileKey> old_keys;
    if (auto m = GetMount(rec->mount_id()); m.ok()) {
      std::vector<uint64_t> stack{*ino};
      while (!stack.empty()) {
        uint64_t cur = stack.back();
        stack.pop_back();
        auto c = GetRecord(cur);
        if (!c.ok()) continue;
        if (c->type() == rpc::REGULAR && !c->version().empty()) {
          old_keys.push_back(MakeFileKey(m->uri(), c->ufs_path(), c->version()));
        }
        const std::string prefix = "C" + Be64(cur);
        std::unique_ptr<rocksdb::Iterator> it(db_->NewIterator({}));
        for (it->Seek(prefix); it->Valid() && it->key().starts_with(prefix); it->Next()) {
          stack.push_back(GetBe64(it->key().data() + 9));
        }
      }
    }
    RETURN_IF_ERROR(RenameEntry(parent, name, new_parent, new_name, noreplace, as, /*dir_allowed=*/true, &moved));
    if (moved == 0) return Status::OK();
    Reclaim(std::move(old_keys));
    // The rename has happened (in the store and the namespace); what is left of writing it out is
    // the next leader's or the next directory rename's if this fails (the reads are right meanwhile).
    if (Status fin = FinishRename(moved); !fin.ok()) {
      spdlog::warn("rename {}: the paths below it are rewritten later ({})", name, fin.message());
    }
    return Status::OK();
  }
  return AbortedError("rename " + name + ": it keeps changing between a file and a directory; try again");
}

Status Namespace::RenameEntry(uint64_t parent, const std::string& name, uint64_t new_parent,
                              const std::string& new_name, bool noreplace, const WriteCaller& as, bool dir_allowed,
                              uint64_t* moved_dir) {
  *moved_dir = 0;
  if (!IsValidName(new_name) || IsWritingName(new_name)) return InvalidArgumentError("'" + new_name + "' cannot be a name here");
  ASSIGN_OR_RETURN(InodeRecord from_dir, WritableDir(parent, "rename " + name));
  ASSIGN_OR_RETURN(InodeRecord to_dir, WritableDir(new_parent, "rename to " + new_name));
  if (from_dir.mount_id() != to_dir.mount_id()) {
    return Status(Code::kInvalidArgument, "rename " + name + ": across two mounted datasets (copy it instead)");
  }
  RETURN_IF_ERROR(EnsureListed(from_dir));
  RETURN_IF_ERROR(EnsureListed(to_dir));
  ASSIGN_OR_RETURN(uint64_t ino, GetChild(parent, name));
  ASSIGN_OR_RETURN(InodeRecord r, GetRecord(ino));
  if (r.type() == rpc::DIRECTORY && !dir_allowed) return AbortedError("rename " + name + ": a directory now");
  if (r.type() == rpc::DIRECTORY) {
    // Not into itself or below it.
    for (uint64_t at = new_parent; at != kRootIno && at != 0;) {
      if (at == ino) return InvalidArgumentError("rename " + name + ": a directory cannot move below itself");
      ASSIGN_OR_RETURN(InodeRecord up, GetRecord(at));
      if (up.ufs_path().empty()) break;
      at = up.parent();
    }
  }
  auto existing = GetChild(new_parent, new_name);
  if (existing.ok()) {
    if (*existing == ino) return Status::OK();
    if (noreplace) return AlreadyExistsError("rename to " + new_name + ": it exists");
    ASSIGN_OR_RETURN(InodeRecord target, GetRecord(*existing));
    if (target.type() == rpc::DIRECTORY && r.type() != rpc::DIRECTORY) {
      return InvalidArgumentError("rename " + name + ": " + new_name + " is a directory");
    }
  }
  const std::string new_path = JoinPath(to_dir.ufs_path(), new_name);
  ASSIGN_OR_RETURN(auto ufs, UfsFor(r.mount_id()));
  Status renamed = ufs->Rename(r.ufs_path(), new_path, as);
  // A file whose first commit has not come yet is not in the store: only its name moves (its
  // commit moves the bytes there, CommitWrite).
  const bool pending = renamed.IsNotFound() && IsPendingWrite(r, NowNs());
  if (!renamed.ok() && !pending) return renamed;
  std::optional<UfsEntry> moved;
  if (r.type() == rpc::REGULAR && !pending) {
    auto st = ufs->Stat(new_path);  // an object store's copy may carry another ETag
    if (st.ok()) moved = *st;
  }
  std::vector<FileKey> reclaim;
  {
    MutexLock lock(&mu_);
    auto mit = mounts_.find(r.mount_id());
    if (mit == mounts_.end()) return NotFoundError("the dataset was unmounted");
    rpc::MountInfo m = mit->second;
    auto target = GetChild(new_parent, new_name);
    if (target.ok() && *target != ino) {
      uint64_t files = 0, bytes = 0;
      RETURN_IF_ERROR(DeleteSubtreeLocked(*target, &m.uri(), &reclaim, &files, &bytes));
      m.set_known_files(m.known_files() - std::min(m.known_files(), files));
      m.set_known_bytes(m.known_bytes() - std::min(m.known_bytes(), bytes));
    }
    rocksdb::WriteBatch batch;
    if (target.ok() && *target != ino) batch.Delete(ChildKey(new_parent, *target));
    // The moved entry itself here; for a directory, the paths of everything below it follow in
    // batches (FinishRename; their blocks were cached under the old paths: reclaimed there).
    ASSIGN_OR_RETURN(InodeRecord c, GetRecord(ino));
    if (c.type() == rpc::REGULAR && !c.version().empty()) reclaim.push_back(MakeFileKey(m.uri(), c.ufs_path(), c.version()));
    const std::string old_path = c.ufs_path();
    c.set_ufs_path(new_path);
    c.set_parent(new_parent);
    c.set_name(new_name);
    if (moved) {
      m.set_known_bytes(m.known_bytes() - std::min(m.known_bytes(), c.size()) + moved->size);
      c.set_size(moved->size);
      c.set_version(moved->version);
      c.set_mtime_ns(moved->mtime_ns);
    }
    batch.Put(InodeKey(ino), c.SerializeAsString());
    const bool subtree = c.type() == rpc::DIRECTORY && old_path != new_path;
    if (subtree) {
      // In force before the new path is visible (GetRecord corrects the children's paths).
      batch.Put(RenameKey(ino), Be64(c.mount_id()) + old_path);
      std::vector<PendingRename> now = PendingRenames();
      now.push_back({ino, c.mount_id(), old_path});
      SetPendingRenames(std::move(now));
    }
    batch.Delete(EntryKey(parent, name));
    batch.Delete(ChildKey(parent, ino));
    ASSIGN_OR_RETURN(InodeRecord to_fresh, GetRecord(new_parent));
    batch.Put(EntryKey(new_parent, new_name), Be64(ino) + Be64(to_fresh.sync_gen()));
    batch.Put(ChildKey(new_parent, ino), "");
    if (parent != new_parent) {
      ASSIGN_OR_RETURN(InodeRecord from_fresh, GetRecord(parent));
      from_fresh.set_content_gen(from_fresh.content_gen() + 1);
      from_fresh.set_mtime_ns(NowNs());
      batch.Put(InodeKey(parent), from_fresh.SerializeAsString());
    }
    Status committed = CommitChangeLocked(to_fresh, m, &batch).WithContext("rename " + name);
    if (!committed.ok()) {
      if (subtree) {
        std::vector<PendingRename> now = PendingRenames();
        std::erase_if(now, [&](const PendingRename& p) { return p.ino == ino; });
        SetPendingRenames(std::move(now));
      }
      return committed;
    }
    if (subtree) *moved_dir = ino;
  }
  Reclaim(std::move(reclaim));
  return Status::OK();
}

Status Namespace::FinishRenames() {
  if (!renames_pending_.load(std::memory_order_acquire)) return Status::OK();
  MutexLock one_rename(&rename_mu_);
  return FinishRenamesLocked();
}

Status Namespace::FinishRenamesLocked() {
  for (const PendingRename& p : PendingRenames()) {
    spdlog::info("finishing the rename of directory {} (from '{}') left halfway", p.ino, p.old_path);
    RETURN_IF_ERROR(FinishRename(p.ino));
  }
  return Status::OK();
}

Status Namespace::FinishRename(uint64_t ino) {
  // Depth first from the moved directory; each record's true path comes from GetRecord (the R
  // key's correction), so the order does not matter and a repeat changes nothing.
  std::vector<uint64_t> stack{ino};
  bool first = true;
  while (!stack.empty() || first) {
    std::vector<FileKey> reclaim;
    {
      MutexLock lock(&mu_);
      // The mount's URI (the old FileKeys); gone with the directory or the mount: nothing to do.
      StatusOr<std::string> m = NotFoundError("the directory or its dataset is gone");
      if (auto top = GetStoredRecord(ino); top.ok()) {
        if (auto mit = mounts_.find(top->mount_id()); mit != mounts_.end()) m = mit->second.uri();
      }
      rocksdb::WriteBatch batch;
      size_t done = 0;
      while (!stack.empty() && done < rename_batch_ && m.ok()) {
        uint64_t cur = stack.back();
        stack.pop_back();
        ++done;
        auto stored = GetStoredRecord(cur);
        if (stored.status().IsNotFound()) continue;  // removed meanwhile
        RETURN_IF_ERROR(stored.status());
        InodeRecord fixed = *stored;
        RETURN_IF_ERROR(FixMovedPath(&fixed));
        if (fixed.ufs_path() != stored->ufs_path()) {
          if (fixed.type() == rpc::REGULAR && !fixed.version().empty()) {
            reclaim.push_back(MakeFileKey(*m, stored->ufs_path(), stored->version()));
          }
          batch.Put(InodeKey(cur), fixed.SerializeAsString());
        }
        if (fixed.type() != rpc::DIRECTORY) continue;
        std::string prefix = "C" + Be64(cur);
        std::unique_ptr<rocksdb::Iterator> it(db_->NewIterator({}));
        for (it->Seek(prefix); it->Valid() && it->key().starts_with(prefix); it->Next()) {
          stack.push_back(GetBe64(it->key().data() + 9));
        }
        RETURN_IF_ERROR(FromRocks(it->status(), "list a directory to rename"));
      }
      first = false;
      const bool last = stack.empty() || !m.ok();
      if (last) {
        stack.clear();  // the dataset or the directory gone: what is left is gone with it
        batch.Delete(RenameKey(ino));
      }
      if (batch.Count() > 0) RETURN_IF_ERROR(journal_.Commit(&batch).WithContext("rename a directory's contents"));
      if (last) {
        std::vector<PendingRename> now = PendingRenames();
        std::erase_if(now, [&](const PendingRename& p) { return p.ino == ino; });
        SetPendingRenames(std::move(now));
      }
    }
    Reclaim(std::move(reclaim));
    if (!stack.empty() && rename_hook_) RETURN_IF_ERROR(rename_hook_());
  }
  return Status::OK();
}

StatusOr<rpc::Attr> Namespace::SetAttr(uint64_t ino, const UfsAttrChange& change, const WriteCaller& as) {
  ASSIGN_OR_RETURN(InodeRecord r, GetRecord(ino));
  if (r.mount_id() == 0 || r.ino() == r.mount_id()) {
    return ReadOnlyError("chmod/chown/utimes: " + std::string(r.mount_id() == 0 ? "outside every mounted dataset"
                                                                                  : "the root of a mounted dataset keeps its mode"));
  }
  RETURN_IF_ERROR(WritableDir(r.parent(), "chmod/chown/utimes of " + r.name()).status());
  if (change.mode && *change.mode > 07777) return InvalidArgumentError("chmod: " + std::to_string(*change.mode) + " is not permission bits");
  if ((change.uid && *change.uid == UINT32_MAX) || (change.gid && *change.gid == UINT32_MAX)) {
    return InvalidArgumentError("chown: owner -1 is no owner");
  }
  ASSIGN_OR_RETURN(auto ufs, UfsFor(r.mount_id()));
  const bool pending = r.type() == rpc::REGULAR && r.version().empty();
  std::optional<UfsEntry> now;
  if (!pending) {
    RETURN_IF_ERROR(ufs->SetAttr(r.ufs_path(), change, as));
    auto st = ufs->Stat(r.ufs_path());
    if (st.ok()) now = *st;
  }
  MutexLock lock(&mu_);
  ASSIGN_OR_RETURN(InodeRecord fresh, GetRecord(ino));  // a commit may have come meanwhile
  uint32_t bits = 0;
  if (change.mode) fresh.set_mode(*change.mode), bits |= 1;
  if (change.uid) fresh.set_uid(*change.uid), bits |= 2;
  if (change.gid) fresh.set_gid(*change.gid), bits |= 4;
  if (change.mtime_ns) fresh.set_mtime_ns(*change.mtime_ns), bits |= 8;
  if (now && fresh.version() == now->version) {
    // The store's own answer wins where it rounds or refuses part of the change silently.
    fresh.set_mode(now->mode);
    fresh.set_uid(now->uid);
    fresh.set_gid(now->gid);
    if (!now->is_dir) fresh.set_mtime_ns(now->mtime_ns);
  }
  if (pending && fresh.version().empty()) fresh.set_set_while_pending(fresh.set_while_pending() | bits);
  if (!now && !pending) {
    // Changed in the store, which then could not be read back: recorded as asked.
  } else if (now && !now->is_dir && fresh.version() != now->version && !fresh.version().empty()) {
    // The store gave the file a new version (some stores count a chmod as a change): the record
    // follows it, so reads do not fail on a version that no longer exists.
    fresh.set_version(now->version);
    fresh.set_size(now->size);
    fresh.set_mtime_ns(now->mtime_ns);
  }
  rocksdb::WriteBatch batch;
  batch.Put(InodeKey(ino), fresh.SerializeAsString());
  RETURN_IF_ERROR(journal_.Commit(&batch).WithContext("chmod/chown/utimes"));
  return AttrOf(fresh);
}

}  // namespace granary::master
