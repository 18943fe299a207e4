// Namespace, listing and sync: a directory listed from the under-storage on first access (or
// listed ahead with its subtree), listed again when its sync interval is due, and a file's
// metadata checked against the store (SyncFile).
#include "master/namespace.h"

#include <rocksdb/write_batch.h>
#include <spdlog/spdlog.h>

#include <chrono>
#include <set>
#include <unordered_set>

#include "common/hash.h"
#include "common/keys.h"
#include "common/path.h"
#include "master/records.h"
#include "master/namespace_internal.h"

namespace granary::master {

using namespace nsdetail;  // NOLINT: this module's own helpers

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

}  // namespace granary::master
