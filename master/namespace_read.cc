// Namespace, reads: lookups, attributes, files, directory pages and walks of a subtree — what
// granary-fuse, the CLI and the job manager ask, answered from RocksDB (listing as needed).
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

}  // namespace granary::master
