// Namespace, mounts: mounting a dataset (checking its under-storage and options), unmounting it
// (deleting its subtree in bounded batches and handing its blocks to be freed), and listing them.
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

}  // namespace granary::master
