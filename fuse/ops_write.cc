// The FUSE write calls (mounts with write=through or back; docs/semantics.md, "Writes"): create,
// an open for writing, write, flush and fsync of a written file, setattr, mkdir, unlink, rmdir and
// rename. The master decides what may be written (EROFS below a read-only mount) and makes the
// directory changes in the under-storage; a file's bytes go to a staging file of the local worker
// (fuse/writes.h), which uploads them. What granary-fuse remembers of the names involved is
// dropped at once (and nothing below a writable mount is cached: fuse/file_cache.h), so the next
// lookup here and on every other node asks the master.
#include <fcntl.h>
#include <spdlog/spdlog.h>
#include <sys/stat.h>

#include <cerrno>
#include <string>

#include "fuse/ops.h"

namespace granary::fuse::internal {
namespace {

// What granary-fuse remembers of `name` in `parent` and of inode `ino` (master inodes; 0: none).
void Forget(Fs* fs, uint64_t parent, const std::string& name, uint64_t ino) {
  fs->entries->Erase(EntryKey(parent, name.c_str()));
  fs->attrs->Erase(parent);
  if (ino != 0) {
    fs->attrs->Erase(ino);
    fs->files->Erase(ino);
    // Its path (a rename) or its version (a commit) changed: the next open or read by inode asks
    // the master instead of using the path and version remembered for it.
    fs->pages.Forget(ino);
    fs->kernel_reads->Unconfirm(fs->ToKernel(ino));
  }
}

// A write call's refusal when writes are off here (fuse.writes=false).
bool WritesOff(fuse_req_t req, Fs* fs) {
  if (fs->cfg.fuse.writes) return false;
  ReplyErrno(req, EROFS);
  return true;
}

// The entry of a file being written: the master's attributes with the size written so far.
fuse_entry_param WrittenEntry(Fs* fs, const rpc::Attr& a, uint64_t size) {
  fuse_entry_param e = ToEntry(fs, a);
  e.attr.st_size = static_cast<off_t>(size);
  e.attr.st_blocks = static_cast<blkcnt_t>((size + 511) / 512);
  return e;
}

// Starts a write of kernel inode `kino` whose target the master gave; its write handle in fi->fh.
Status BeginWrite(Fs* fs, fuse_req_t req, fuse_ino_t kino, const rpc::WriteTarget& t, uint64_t parent,
                  const std::string& name, uint32_t mode, fuse_file_info* fi) {
  ASSIGN_OR_RETURN(WriteFiles* writes, fs->Writes());
  WriteFiles::Target target;
  target.target = t;
  target.parent = parent;
  target.name = name;
  target.mode = mode & 07777;
  const fuse_ctx* ctx = fuse_req_ctx(req);
  target.uid = ctx ? ctx->uid : 0;
  target.gid = ctx ? ctx->gid : 0;
  ASSIGN_OR_RETURN(uint64_t fh, writes->Open(kino, target));
  fi->fh = fh;
  fi->keep_cache = 0;
  // The writer's bytes go from its buffer into the request, not through the page cache first: one
  // copy fewer on the way to the staging file (a checkpoint is not read back through this open).
  fi->direct_io = 1;
  fi->noflush = 0;  // close() commits
  return Status::OK();
}

}  // namespace

void OpCreate(fuse_req_t req, fuse_ino_t parent, const char* name, mode_t mode, fuse_file_info* fi) {
  OpScope scope(req, "create", FsOf(req)->lat_create, parent);
  if (scope.tracing()) scope.record().name = name;
  Fs* fs = FsOf(req);
  if (WritesOff(req, fs)) return;
  const uint64_t mparent = fs->ToMaster(parent);
  rpc::PrepareCreateRequest pc;
  pc.set_parent(mparent);
  pc.set_name(name);
  pc.set_mode(mode & 07777);
  const fuse_ctx* ctx = fuse_req_ctx(req);
  pc.set_uid(ctx ? ctx->uid : 0);
  pc.set_gid(ctx ? ctx->gid : 0);
  auto t = fs->client->PrepareCreate(pc);
  if (!t.ok()) return ReplyError(req, t.status(), "create");
  if (!t->created() && (fi->flags & O_EXCL)) return ReplyErrno(req, EEXIST);
  Forget(fs, mparent, name, t->file().attr().ino());
  const fuse_ino_t kino = fs->ToKernel(t->file().attr().ino());
  Status st = BeginWrite(fs, req, kino, *t, mparent, name, mode, fi);
  if (!st.ok()) return ReplyError(req, st, "create");
  fuse_entry_param e = WrittenEntry(fs, t->file().attr(), 0);
  if (fuse_reply_create(req, &e, fi) != 0) {  // interrupted: no RELEASE will come, nothing to commit
    if (auto w = fs->WritesIfAny()) w->Abort(fi->fh).IgnoreError();
  }
}

void OpenForWrite(fuse_req_t req, fuse_ino_t ino, fuse_file_info* fi) {
  Fs* fs = FsOf(req);
  if (WritesOff(req, fs)) return;
  const uint64_t mino = fs->ToMaster(ino);
  if (!(fi->flags & O_TRUNC)) {
    // Another handle of this node writes the file from empty: this one joins it. Anything else
    // would change part of an object the store holds whole.
    if (auto w = fs->WritesIfAny()) {
      auto fh = w->Join(ino);
      if (fh.ok()) {
        fi->fh = *fh;
        fi->keep_cache = 0;
        fuse_reply_open(req, fi);
        return;
      }
    }
    auto t = fs->client->PrepareWrite(mino);  // EROFS below a read-only mount, as before
    if (!t.ok()) return ReplyError(req, t.status(), "open");
    spdlog::warn("open for writing without O_TRUNC refused (inode {}): Granary writes whole files; appending to or "
                 "changing part of an existing file is not supported. Write a new file (or open with O_TRUNC) and "
                 "rename it over the old one.", mino);
    return ReplyErrno(req, EOPNOTSUPP);
  }
  if ((fi->flags & O_ACCMODE) == O_RDONLY) return ReplyErrno(req, EINVAL);  // O_TRUNC without write access
  auto t = fs->client->PrepareWrite(mino);
  if (!t.ok()) return ReplyError(req, t.status(), "open");
  Forget(fs, t->file().attr().parent(), "", mino);
  // The name in its directory: the master's record of the file knows its parent; its name is the
  // last component of its path in the under-storage.
  const std::string& path = t->file().ufs_path();
  const std::string name = path.substr(path.rfind('/') == std::string::npos ? 0 : path.rfind('/') + 1);
  Status st = BeginWrite(fs, req, ino, *t, t->file().attr().parent(), name, t->file().attr().mode(), fi);
  if (!st.ok()) return ReplyError(req, st, "open");
  if (fuse_reply_open(req, fi) != 0) {  // interrupted: nothing to commit
    if (auto w = fs->WritesIfAny()) w->Abort(fi->fh).IgnoreError();
  }
}

void OpWrite(fuse_req_t req, fuse_ino_t ino, const char* buf, size_t size, off_t off, fuse_file_info* fi) {
  OpScope scope(req, "write", FsOf(req)->lat_write, ino);
  Fs* fs = FsOf(req);
  WriteFiles* w = fs->WritesIfAny();
  if (!IsWriteHandle(fi->fh) || w == nullptr || !w->Known(fi->fh)) {
    return ReplyError(req, FailedPreconditionError("write through a handle granary-fuse did not open for writing "
                                                   "(it was restarted since the open)"), "write");
  }
  Status st = w->Write(fi->fh, buf, size, off);
  if (!st.ok()) return ReplyError(req, st, "write");
  fs->written_bytes += size;
  fuse_reply_write(req, size);
}

void ReadWriteHandle(fuse_req_t req, uint64_t fh, size_t size, off_t off) {
  Fs* fs = FsOf(req);
  WriteFiles* w = fs->WritesIfAny();
  if (w == nullptr) return ReplyErrno(req, EBADF);
  std::string buf(size, '\0');
  auto n = w->Read(fh, buf.data(), size, off);
  if (!n.ok()) return ReplyError(req, n.status(), "read");
  fuse_reply_buf(req, buf.data(), *n);
}

void CommitWriteHandle(fuse_req_t req, fuse_ino_t ino, uint64_t fh, bool wait_upload) {
  OpScope scope(req, wait_upload ? "fsync" : "flush", wait_upload ? FsOf(req)->lat_fsync : FsOf(req)->lat_flush, ino);
  Fs* fs = FsOf(req);
  WriteFiles* w = fs->WritesIfAny();
  Status st = w != nullptr ? w->Commit(fh, wait_upload)
                           : InternalError("the file was opened for writing before granary-fuse restarted; it was "
                                           "not committed (write it again)");
  Forget(fs, 0, "", fs->ToMaster(ino));
  if (!st.ok()) {
    // The writer learns the file is not safe (EIO; ENOSPC for a full disk); the cause is logged.
    if (ToErrno(st) != ENOSPC && ToErrno(st) != EIO) st = InternalError(st.message());
    spdlog::error("{} of inode {} failed, the file is not committed: {}", wait_upload ? "fsync" : "close",
                  fs->ToMaster(ino), st.message());
    return ReplyError(req, st, wait_upload ? "fsync" : "close");
  }
  fs->files_committed++;
  fuse_reply_err(req, 0);
}

void ReleaseWriteHandle(fuse_req_t req, fuse_ino_t ino, uint64_t fh) {
  Fs* fs = FsOf(req);
  if (WriteFiles* w = fs->WritesIfAny()) {
    Status st = w->Release(fh);
    if (!st.ok()) {
      spdlog::error("the last close of inode {} could not commit what was written after its last flush: {}",
                    fs->ToMaster(ino), st.ToString());
    }
  }
  fuse_reply_err(req, 0);
}

void OpSetattr(fuse_req_t req, fuse_ino_t ino, struct stat* attr, int to_set, fuse_file_info* fi) {
  Fs* fs = FsOf(req);
  const uint64_t mino = fs->ToMaster(ino);
  auto a = fs->client->GetAttr(mino);
  if (!a.ok()) return ReplyError(req, a.status(), "setattr");
  if (!a->writable()) return ReplyErrno(req, EROFS);
  WriteFiles* w = fs->WritesIfAny();
  std::optional<uint64_t> written = w != nullptr ? w->SizeOf(ino) : std::nullopt;
  if (to_set & FUSE_SET_ATTR_SIZE) {
    const uint64_t size = static_cast<uint64_t>(attr->st_size);
    if (fi != nullptr && IsWriteHandle(fi->fh) && w != nullptr && w->Known(fi->fh)) {
      Status st = w->Truncate(fi->fh, size);
      if (!st.ok()) return ReplyError(req, st, "truncate");
      written = size;
    } else if (size != written.value_or(a->size())) {  // a truncate to the size it has changes nothing
      spdlog::warn("truncate of inode {} to {} bytes refused: Granary writes whole files; open the file with O_TRUNC "
                   "and write it again", mino, size);
      return ReplyErrno(req, EOPNOTSUPP);
    }
  }
  // Permission bits, owners and times are not kept by the stores Granary writes to: accepted
  // (tools such as cp -p and shutil.copy set them after writing) and left as they are.
  struct stat st = ToStat(fs, *a);
  if (written) {
    st.st_size = static_cast<off_t>(*written);
    st.st_blocks = static_cast<blkcnt_t>((*written + 511) / 512);
  }
  fuse_reply_attr(req, &st, 0);
}

void OpMkdir(fuse_req_t req, fuse_ino_t parent, const char* name, mode_t mode) {
  Fs* fs = FsOf(req);
  if (WritesOff(req, fs)) return;
  rpc::MakeDirRequest m;
  m.set_parent(fs->ToMaster(parent));
  m.set_name(name);
  m.set_mode(mode & 07777);
  const fuse_ctx* ctx = fuse_req_ctx(req);
  m.set_uid(ctx ? ctx->uid : 0);
  m.set_gid(ctx ? ctx->gid : 0);
  auto a = fs->client->MakeDir(m);
  Forget(fs, m.parent(), name, 0);
  if (!a.ok()) return ReplyError(req, a.status(), "mkdir");
  fuse_entry_param e = ToEntry(fs, *a);
  fuse_reply_entry(req, &e);
}

namespace {
void RemoveCommon(fuse_req_t req, fuse_ino_t parent, const char* name, bool dir) {
  Fs* fs = FsOf(req);
  if (WritesOff(req, fs)) return;
  const uint64_t mparent = fs->ToMaster(parent);
  auto child = fs->client->Lookup(mparent, name);
  Status st = fs->client->Remove(mparent, name, dir);
  Forget(fs, mparent, name, child.ok() ? child->ino() : 0);
  if (!st.ok()) return ReplyError(req, st, dir ? "rmdir" : "unlink");
  fuse_reply_err(req, 0);
}
}  // namespace

void OpUnlink(fuse_req_t req, fuse_ino_t parent, const char* name) { RemoveCommon(req, parent, name, false); }
void OpRmdir(fuse_req_t req, fuse_ino_t parent, const char* name) { RemoveCommon(req, parent, name, true); }

void OpRename(fuse_req_t req, fuse_ino_t parent, const char* name, fuse_ino_t new_parent, const char* new_name,
              unsigned flags) {
  Fs* fs = FsOf(req);
  if (WritesOff(req, fs)) return;
  if (flags & RENAME_EXCHANGE) {
    spdlog::warn("rename with RENAME_EXCHANGE refused: no under-storage swaps two names at once");
    return ReplyErrno(req, EOPNOTSUPP);
  }
  rpc::RenameRequest r;
  r.set_parent(fs->ToMaster(parent));
  r.set_name(name);
  r.set_new_parent(fs->ToMaster(new_parent));
  r.set_new_name(new_name);
  r.set_noreplace((flags & RENAME_NOREPLACE) != 0);
  auto moved = fs->client->Lookup(r.parent(), name);
  auto replaced = fs->client->Lookup(r.new_parent(), new_name);
  Status st = fs->client->Rename(r);
  Forget(fs, r.parent(), name, moved.ok() ? moved->ino() : 0);
  Forget(fs, r.new_parent(), new_name, replaced.ok() ? replaced->ino() : 0);
  if (!st.ok()) return ReplyError(req, st, "rename");
  fuse_reply_err(req, 0);
}

}  // namespace granary::fuse::internal
