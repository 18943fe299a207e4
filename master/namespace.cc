// Namespace, opening and applying: the data directory and its RocksDB, the state kept in memory
// (mounts, counters, free stamps), a standby's entries from the leader's journal, and reading one
// record. The other concerns are in namespace_{sync,load,mounts,read,write}.cc (master/namespace.h).
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
#include "master/namespace_internal.h"

namespace granary::master {

using namespace nsdetail;  // NOLINT: this module's own helpers

namespace {

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

}  // namespace granary::master
