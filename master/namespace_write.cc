// Namespace, writes: creating, committing, removing, renaming and changing files and directories
// below a writable mount (docs/semantics.md, "Writes"), each as one journal entry.
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

// ---- Writes ----

// A new inode below `dir` (inode `parent`), made by a write: its number, name, type, owner and mode.
InodeRecord Namespace::NewChildLocked(const InodeRecord& dir, uint64_t parent, const std::string& name,
                                      rpc::FileType type, uint32_t mode, uint32_t uid, uint32_t gid) {
  InodeRecord r;
  r.set_ino(next_ino_++);
  r.set_parent(parent);
  r.set_name(name);
  r.set_type(type);
  r.set_mtime_ns(NowNs());
  r.set_mode(mode & 07777);
  r.set_uid(uid);
  r.set_gid(gid);
  r.set_mount_id(dir.mount_id());
  return r;
}

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
  InodeRecord r = NewChildLocked(dir, parent, name, rpc::REGULAR, mode, uid, gid);
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
  InodeRecord r = NewChildLocked(dir, parent, name, rpc::DIRECTORY, mode, uid, gid);
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
