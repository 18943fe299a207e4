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
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "fuse/ops.h"

namespace granary::fuse::internal {
namespace {

// What granary-fuse remembers of `name` in `parent` and of inode `ino` (master inodes; 0: none).
// With `parent_changed` false the parent's attributes are kept (a new file: the directory's mtime
// may then be up to a second old here, as its attributes may be; its link count did not change).
void Forget(Fs* fs, uint64_t parent, const std::string& name, uint64_t ino, bool parent_changed = true) {
  fs->entries->Erase(EntryKey(parent, name.c_str()));
  if (parent_changed) fs->attrs->Erase(parent);
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
bool WritesOff(Reply& r, Fs* fs) {
  if (fs->cfg.fuse.writes) return false;
  ReplyErrno(r, EROFS);
  return true;
}

// Who asks: the request's uid, gid and supplementary groups (libfuse reads the groups from
// /proc/<pid>/task/<tid>/status; a process in a pid namespace this one cannot see gives its gid only).
rpc::Caller CallerOf(const Reply& r) {
  rpc::Caller c;
  c.set_uid(r.uid());
  c.set_gid(r.gid());
  gid_t groups[64];
  int n = r.groups(64, groups);
  if (n > 64) {
    std::vector<gid_t> more(static_cast<size_t>(n));
    n = r.groups(n, more.data());
    for (int i = 0; i >= 0 && i < n && i < static_cast<int>(more.size()); ++i) c.add_groups(more[static_cast<size_t>(i)]);
  } else {
    for (int i = 0; i < n; ++i) c.add_groups(groups[i]);
  }
  return c;
}

// Whether the thread `pid` that sent a FLUSH is ending because a signal killed it (kill -9, a
// crash): the kernel flushes a dying process's open files too, and a file its writer never closed
// is not a file it finished. /proc/<pid>/stat: the flags (field 9) carry PF_EXITING once the thread
// exits, and its exit code (field 52) the signal that ended it. A normal exit (exit(0) without
// close) is no kill: that file commits. Unknown (another pid namespace: pid 0): no kill.
bool KilledBySignal(pid_t pid) {
  if (pid <= 0) return false;
  char path[64];
  std::snprintf(path, sizeof path, "/proc/%d/stat", static_cast<int>(pid));
  FILE* f = std::fopen(path, "re");
  if (f == nullptr) return false;
  char buf[2048];
  size_t n = std::fread(buf, 1, sizeof buf - 1, f);
  std::fclose(f);
  buf[n] = '\0';
  const char* p = std::strrchr(buf, ')');  // the command name may hold spaces and parentheses
  if (p == nullptr) return false;
  // Fields from 3 (state) on, space separated.
  std::vector<unsigned long long> fields;
  for (const char* q = p + 2; *q != '\0';) {
    char* end = nullptr;
    if (fields.empty()) {  // the state letter
      fields.push_back(0);
      q += 1;
    } else {
      unsigned long long v = std::strtoull(q, &end, 10);
      if (end == q) {  // a negative number: not a field we read
        v = 0;
        while (*q != ' ' && *q != '\0') ++q;
      } else {
        q = end;
      }
      fields.push_back(v);
    }
    while (*q == ' ') ++q;
  }
  constexpr unsigned long long kPfExiting = 0x4;
  if (fields.size() < 50) return false;  // field 52 is the 50th from field 3
  const unsigned long long flags = fields[6], exit_code = fields[49];
  return (flags & kPfExiting) != 0 && (exit_code & 0x7f) != 0;
}

// The entry of a file being written: the master's attributes with the size written so far.
fuse_entry_param WrittenEntry(Fs* fs, const rpc::Attr& a, uint64_t size) {
  fuse_entry_param e = ToEntry(fs, a);
  e.attr.st_size = static_cast<off_t>(size);
  e.attr.st_blocks = static_cast<blkcnt_t>((size + 511) / 512);
  return e;
}

// Starts a write of kernel inode `kino` whose target the master gave; its write handle in fi->fh.
Status BeginWrite(Fs* fs, const Reply& r, fuse_ino_t kino, const rpc::WriteTarget& t, uint64_t parent,
                  const std::string& name, uint32_t mode, fuse_file_info* fi) {
  ASSIGN_OR_RETURN(WriteFiles* writes, fs->Writes());
  WriteFiles::Target target;
  target.target = t;
  target.parent = parent;
  target.name = name;
  target.mode = mode & 07777;
  const rpc::Caller caller = CallerOf(r);
  target.uid = caller.uid();
  target.gid = caller.gid();
  target.groups.assign(caller.groups().begin(), caller.groups().end());
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

void Create(Fs* fs, Reply& r, fuse_ino_t parent, const char* name, mode_t mode, fuse_file_info* fi) {
  OpScope scope(fs, r, "create", fs->lat_create, parent);
  if (scope.tracing()) scope.record().name = name;
  if (WritesOff(r, fs)) return;
  const uint64_t mparent = fs->ToMaster(parent);
  rpc::PrepareCreateRequest pc;
  pc.set_parent(mparent);
  pc.set_name(name);
  pc.set_mode(mode & 07777);
  pc.set_uid(r.uid());
  pc.set_gid(r.gid());
  fs->known_dirs.Added(mparent, name);  // before the master has it: never answered missing after
  auto t = fs->client->PrepareCreate(pc);
  if (!t.ok()) return ReplyError(r, t.status(), "create");
  if (!t->created() && (fi->flags & O_EXCL)) return ReplyErrno(r, EEXIST);
  Forget(fs, mparent, name, t->file().attr().ino(), /*parent_changed=*/false);
  const fuse_ino_t kino = fs->ToKernel(t->file().attr().ino());
  Status st = BeginWrite(fs, r, kino, *t, mparent, name, mode, fi);
  if (!st.ok()) return ReplyError(r, st, "create");
  fuse_entry_param e = WrittenEntry(fs, t->file().attr(), 0);
  if (r.Create(e, *fi) != 0) {  // interrupted: no RELEASE will come, nothing to commit
    if (auto w = fs->WritesIfAny()) w->Abort(fi->fh, kino).IgnoreError();
  }
}

void OpenForWrite(Fs* fs, Reply& r, fuse_ino_t ino, fuse_file_info* fi) {
  if (WritesOff(r, fs)) return;
  const uint64_t mino = fs->ToMaster(ino);
  if (!(fi->flags & O_TRUNC)) {
    // Another handle of this node writes the file from empty: this one joins it. Anything else
    // would change part of an object the store holds whole.
    if (auto w = fs->WritesIfAny()) {
      auto fh = w->Join(ino);
      if (fh.ok()) {
        fi->fh = *fh;
        fi->keep_cache = 0;
        r.Open(*fi);
        return;
      }
    }
    auto t = fs->client->PrepareWrite(mino);  // EROFS below a read-only mount, as before
    if (!t.ok()) return ReplyError(r, t.status(), "open");
    spdlog::warn("open for writing without O_TRUNC refused (inode {}): Granary writes whole files; appending to or "
                 "changing part of an existing file is not supported. Write a new file (or open with O_TRUNC) and "
                 "rename it over the old one.", mino);
    return ReplyErrno(r, EOPNOTSUPP);
  }
  if ((fi->flags & O_ACCMODE) == O_RDONLY) return ReplyErrno(r, EINVAL);  // O_TRUNC without write access
  auto t = fs->client->PrepareWrite(mino);
  if (!t.ok()) return ReplyError(r, t.status(), "open");
  Forget(fs, t->file().attr().parent(), "", mino);
  // The name in its directory: the master's record of the file knows its parent; its name is the
  // last component of its path in the under-storage.
  const std::string& path = t->file().ufs_path();
  const std::string name = path.substr(path.rfind('/') == std::string::npos ? 0 : path.rfind('/') + 1);
  Status st = BeginWrite(fs, r, ino, *t, t->file().attr().parent(), name, t->file().attr().mode(), fi);
  if (!st.ok()) return ReplyError(r, st, "open");
  if (r.Open(*fi) != 0) {  // interrupted: nothing to commit
    if (auto w = fs->WritesIfAny()) w->Abort(fi->fh, ino).IgnoreError();
  }
}

void Write(Fs* fs, Reply& r, fuse_ino_t ino, const char* buf, size_t size, off_t off, fuse_file_info* fi) {
  OpScope scope(fs, r, "write", fs->lat_write, ino);
  if (scope.tracing()) {
    scope.record().offset = static_cast<uint64_t>(off);
    scope.record().size = size;
  }
  WriteFiles* w = fs->WritesIfAny();
  if (!IsWriteHandle(fi->fh) || w == nullptr || !w->Known(fi->fh, ino)) {
    return ReplyError(r, FailedPreconditionError("write through a handle granary-fuse did not open for writing on "
                                                   "this file (it was restarted since the open)"), "write");
  }
  Status st = w->Write(fi->fh, ino, buf, size, off);
  if (!st.ok()) return ReplyError(r, st, "write");
  fs->written_bytes += size;
  r.Write(size);
}

void ReadWriteHandle(Fs* fs, Reply& r, fuse_ino_t ino, uint64_t fh, size_t size, off_t off) {
  WriteFiles* w = fs->WritesIfAny();
  if (w == nullptr) return ReplyErrno(r, EBADF);
  std::string buf(size, '\0');
  auto n = w->Read(fh, ino, buf.data(), size, off);
  if (!n.ok()) return ReplyError(r, n.status(), "read");
  r.Buf(buf.data(), *n);
}

void CommitWriteHandle(Fs* fs, Reply& r, fuse_ino_t ino, uint64_t fh, bool wait_upload) {
  OpScope scope(fs, r, wait_upload ? "fsync" : "flush", wait_upload ? fs->lat_fsync : fs->lat_flush, ino);
  WriteFiles* w = fs->WritesIfAny();
  if (!wait_upload && w != nullptr && KilledBySignal(r.pid())) {
    // Its writer was killed with the file open: what it wrote is not a file it finished. Nothing is
    // committed (by any handle of the file); the store keeps the previous version.
    if (w->Discard(fh, ino).ok()) {
      spdlog::warn("inode {}: its writer (pid {}) was killed before closing it; what it wrote is not committed and "
                   "the file keeps its previous version", fs->ToMaster(ino), r.pid());
    }
    return ReplyErrno(r, EIO);
  }
  Status st = w != nullptr ? w->Commit(fh, ino, wait_upload)
                           : InternalError("the file was opened for writing before granary-fuse restarted; it was "
                                           "not committed (write it again)");
  Forget(fs, 0, "", fs->ToMaster(ino));
  if (!st.ok()) {
    // The writer learns the file is not safe (EIO; ENOSPC for a full disk); the cause is logged.
    if (ToErrno(st) != ENOSPC && ToErrno(st) != EIO) st = InternalError(st.message());
    spdlog::error("{} of inode {} failed, the file is not committed: {}", wait_upload ? "fsync" : "close",
                  fs->ToMaster(ino), st.message());
    return ReplyError(r, st, wait_upload ? "fsync" : "close");
  }
  fs->files_committed++;
  r.Err(0);
}

void ReleaseWriteHandle(Fs* fs, Reply& reply, fuse_ino_t ino, uint64_t fh) {
  if (WriteFiles* w = fs->WritesIfAny()) {
    WriteFiles::Released r = w->Release(fh, ino);
    if (!r.status.ok()) {
      spdlog::error("the last close of inode {} could not commit what was written after its last flush: {}",
                    fs->ToMaster(ino), r.status.ToString());
    }
    if (r.abandoned.has_value()) {
      // Made for this write and never committed (the commit failed, or the writer was killed): its
      // empty entry goes, so no 0-byte file is left listed that the store never had.
      rpc::RemoveRequest rm;
      rm.set_parent(r.abandoned->parent);
      rm.set_name(r.abandoned->name);
      rm.set_pending_ino(r.abandoned->ino);
      Status gone = fs->client->Remove(rm);
      Forget(fs, rm.parent(), rm.name(), rm.pending_ino());
      if (!gone.ok() && !gone.IsNotFound()) {
        spdlog::warn("the entry of inode {}, whose write was never committed, stays listed: {}", rm.pending_ino(),
                     gone.ToString());
      }
    }
  }
  reply.Err(0);
}

namespace {

// A setattr's chmod, chown and utimes as the master and the worker take them.
rpc::SetAttrRequest ChangeOf(const struct stat* attr, int to_set) {
  rpc::SetAttrRequest sa;
  if (to_set & FUSE_SET_ATTR_MODE) sa.set_mode(attr->st_mode & 07777);
  if (to_set & FUSE_SET_ATTR_UID) sa.set_uid(attr->st_uid);
  if (to_set & FUSE_SET_ATTR_GID) sa.set_gid(attr->st_gid);
  const int64_t now = std::chrono::duration_cast<std::chrono::nanoseconds>(
                          std::chrono::system_clock::now().time_since_epoch()).count();
  if (to_set & FUSE_SET_ATTR_MTIME) {
    sa.set_mtime_ns((to_set & FUSE_SET_ATTR_MTIME_NOW)
                        ? now
                        : static_cast<int64_t>(attr->st_mtim.tv_sec) * 1'000'000'000 + attr->st_mtim.tv_nsec);
  }
  if (to_set & FUSE_SET_ATTR_ATIME) {
    sa.set_atime_ns((to_set & FUSE_SET_ATTR_ATIME_NOW)
                        ? now
                        : static_cast<int64_t>(attr->st_atim.tv_sec) * 1'000'000'000 + attr->st_atim.tv_nsec);
  }
  return sa;
}

}  // namespace

void Setattr(Fs* fs, Reply& r, fuse_ino_t ino, struct stat* attr, int to_set, fuse_file_info* fi) {
  OpScope scope(fs, r, "setattr", nullptr, ino);
  const uint64_t mino = fs->ToMaster(ino);
  rpc::SetAttrRequest sa = ChangeOf(attr, to_set);
  sa.set_ino(mino);
  WriteFiles* w = fs->WritesIfAny();
  const bool own_handle = fi != nullptr && IsWriteHandle(fi->fh) && w != nullptr && w->Known(fi->fh, ino);
  if (w != nullptr && w->Has(ino) && (!(to_set & FUSE_SET_ATTR_SIZE) || own_handle)) {
    // A file being written here, not committed yet (tar, cp -p and shutil set mode, owner and times
    // on each file before closing it): kept for its commit and answered here. The kernel has
    // checked that the caller may (default_permissions, against the attributes answered here).
    rpc::AttrChange change;
    if (sa.has_mode()) change.set_mode(sa.mode());
    if (sa.has_uid()) change.set_uid(sa.uid());
    if (sa.has_gid()) change.set_gid(sa.gid());
    if (sa.has_atime_ns()) change.set_atime_ns(sa.atime_ns());
    if (sa.has_mtime_ns()) change.set_mtime_ns(sa.mtime_ns());
    if (auto local = w->SetAttrWhileWriting(ino, change)) {
      uint64_t size = local->size();
      if (to_set & FUSE_SET_ATTR_SIZE) {
        size = static_cast<uint64_t>(attr->st_size);
        Status st = w->Truncate(fi->fh, ino, size);
        if (!st.ok()) return ReplyError(r, st, "truncate");
      }
      struct stat st = ToStat(fs, *local);
      st.st_size = static_cast<off_t>(size);
      st.st_blocks = static_cast<blkcnt_t>((size + 511) / 512);
      return (void)r.Attr(st, 0);
    }
  }
  auto a = fs->client->GetAttr(mino);
  if (!a.ok()) return ReplyError(r, a.status(), "setattr");
  if (!a->writable()) return ReplyErrno(r, EROFS);
  // The size written so far by this node's writer of the file, when there is one.
  bool have_written = false;
  uint64_t written = 0;
  if (std::optional<uint64_t> n = w != nullptr ? w->SizeOf(ino) : std::nullopt; n.has_value()) {
    have_written = true;
    written = *n;
  }
  if (to_set & FUSE_SET_ATTR_SIZE) {
    const uint64_t size = static_cast<uint64_t>(attr->st_size);
    if (own_handle) {
      Status st = w->Truncate(fi->fh, ino, size);
      if (!st.ok()) return ReplyError(r, st, "truncate");
      written = size;
      have_written = true;
    } else if (size != (have_written ? written : a->size())) {  // a truncate to the size it has changes nothing
      spdlog::warn("truncate of inode {} to {} bytes refused: Granary writes whole files; open the file with O_TRUNC "
                   "and write it again", mino, size);
      return ReplyErrno(r, EOPNOTSUPP);
    }
  }
  // chmod, chown and utimes go to the store where it keeps them (the kernel has checked that the
  // caller may: default_permissions). A store that keeps none (object stores: EOPNOTSUPP) accepts
  // them and keeps nothing, as docs/semantics.md says: tools set them after every copy (cp -p,
  // shutil.copy, tar), and failing those would fail the copy.
  rpc::Attr result = *a;
  if (sa.has_mode() || sa.has_uid() || sa.has_gid() || sa.has_mtime_ns() || sa.has_atime_ns()) {
    if (WritesOff(r, fs)) return;
    *sa.mutable_caller() = CallerOf(r);  // its groups cost a read of /proc: only when asked for
    auto changed = fs->client->SetAttr(sa);
    Forget(fs, 0, "", mino);
    if (!changed.ok()) {
      if (ToErrno(changed.status()) != EOPNOTSUPP) return ReplyError(r, changed.status(), "setattr");
    } else {
      result = *changed;
      if (w != nullptr) w->NoteAttr(ino, result);
    }
  }
  struct stat st = ToStat(fs, result);
  if (have_written) {
    st.st_size = static_cast<off_t>(written);
    st.st_blocks = static_cast<blkcnt_t>((written + 511) / 512);
  }
  r.Attr(st, 0);
}

void Mkdir(Fs* fs, Reply& r, fuse_ino_t parent, const char* name, mode_t mode) {
  OpScope scope(fs, r, "mkdir", nullptr, parent);
  if (scope.tracing()) scope.record().name = name;
  if (WritesOff(r, fs)) return;
  rpc::MakeDirRequest m;
  m.set_parent(fs->ToMaster(parent));
  m.set_name(name);
  m.set_mode(mode & 07777);
  *m.mutable_caller() = CallerOf(r);
  m.set_uid(m.caller().uid());
  m.set_gid(m.caller().gid());
  fs->known_dirs.Added(m.parent(), name);  // before the master has it: never answered missing after
  auto a = fs->client->MakeDir(m);
  Forget(fs, m.parent(), name, 0);
  if (!a.ok()) return ReplyError(r, a.status(), "mkdir");
  fs->known_dirs.Made(a->ino());
  if (scope.tracing()) scope.record().child = a->ino();
  fuse_entry_param e = ToEntry(fs, *a);
  r.Entry(e);
}

namespace {
void RemoveCommon(Fs* fs, Reply& r, fuse_ino_t parent, const char* name, bool dir) {
  OpScope scope(fs, r, dir ? "rmdir" : "unlink", nullptr, parent);
  if (scope.tracing()) scope.record().name = name;
  if (WritesOff(r, fs)) return;
  const uint64_t mparent = fs->ToMaster(parent);
  auto child = fs->client->Lookup(mparent, name);
  rpc::RemoveRequest rm;
  rm.set_parent(mparent);
  rm.set_name(name);
  rm.set_directory(dir);
  *rm.mutable_caller() = CallerOf(r);
  Status st = fs->client->Remove(rm);
  Forget(fs, mparent, name, child.ok() ? child->ino() : 0);
  if (!st.ok()) return ReplyError(r, st, dir ? "rmdir" : "unlink");
  if (WriteFiles* w = fs->WritesIfAny()) w->Unlinked(mparent, name);
  r.Err(0);
}
}  // namespace

void Unlink(Fs* fs, Reply& r, fuse_ino_t parent, const char* name) { RemoveCommon(fs, r, parent, name, false); }
void Rmdir(Fs* fs, Reply& r, fuse_ino_t parent, const char* name) { RemoveCommon(fs, r, parent, name, true); }

void Rename(Fs* fs, Reply& r, fuse_ino_t parent, const char* name, fuse_ino_t new_parent, const char* new_name,
              unsigned flags) {
  OpScope scope(fs, r, "rename", nullptr, parent);
  if (scope.tracing()) {
    scope.record().name = name;
    scope.record().to_parent = fs->ToMaster(new_parent);
    scope.record().to_name = new_name;
  }
  if (WritesOff(r, fs)) return;
  if (flags & RENAME_EXCHANGE) {
    spdlog::warn("rename with RENAME_EXCHANGE refused: no under-storage swaps two names at once");
    return ReplyErrno(r, EOPNOTSUPP);
  }
  rpc::RenameRequest rn;
  rn.set_parent(fs->ToMaster(parent));
  rn.set_name(name);
  rn.set_new_parent(fs->ToMaster(new_parent));
  rn.set_new_name(new_name);
  rn.set_noreplace((flags & RENAME_NOREPLACE) != 0);
  *rn.mutable_caller() = CallerOf(r);
  auto moved = fs->client->Lookup(rn.parent(), name);
  auto replaced = fs->client->Lookup(rn.new_parent(), new_name);
  fs->known_dirs.Added(rn.new_parent(), new_name);  // before the master has it
  if (moved.ok() && moved->type() == rpc::DIRECTORY) fs->known_dirs.Forget(moved->ino());
  Status st = fs->client->Rename(rn);
  Forget(fs, rn.parent(), name, moved.ok() ? moved->ino() : 0);
  Forget(fs, rn.new_parent(), new_name, replaced.ok() ? replaced->ino() : 0);
  if (!st.ok()) return ReplyError(r, st, "rename");
  if (WriteFiles* w = fs->WritesIfAny()) w->Renamed(rn.parent(), name, rn.new_parent(), new_name);
  r.Err(0);
}

// ---- The adapters to libfuse ----

void OpCreate(fuse_req_t req, fuse_ino_t parent, const char* name, mode_t mode, fuse_file_info* fi) {
  FuseReply r(req);
  Create(FsOf(req), r, parent, name, mode, fi);
}
void OpWrite(fuse_req_t req, fuse_ino_t ino, const char* buf, size_t size, off_t off, fuse_file_info* fi) {
  FuseReply r(req);
  Write(FsOf(req), r, ino, buf, size, off, fi);
}
void OpSetattr(fuse_req_t req, fuse_ino_t ino, struct stat* attr, int to_set, fuse_file_info* fi) {
  FuseReply r(req);
  Setattr(FsOf(req), r, ino, attr, to_set, fi);
}
void OpMkdir(fuse_req_t req, fuse_ino_t parent, const char* name, mode_t mode) {
  FuseReply r(req);
  Mkdir(FsOf(req), r, parent, name, mode);
}
void OpUnlink(fuse_req_t req, fuse_ino_t parent, const char* name) {
  FuseReply r(req);
  Unlink(FsOf(req), r, parent, name);
}
void OpRmdir(fuse_req_t req, fuse_ino_t parent, const char* name) {
  FuseReply r(req);
  Rmdir(FsOf(req), r, parent, name);
}
void OpRename(fuse_req_t req, fuse_ino_t parent, const char* name, fuse_ino_t new_parent, const char* new_name,
              unsigned flags) {
  FuseReply r(req);
  Rename(FsOf(req), r, parent, name, new_parent, new_name, flags);
}

}  // namespace granary::fuse::internal
