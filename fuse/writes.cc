// WriteFiles (fuse/writes.h, whose design note gives the rules).
#include "fuse/writes.h"

#include <fcntl.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <map>

#include "rpc/local_wire.h"
#include "common/tiers.h"
#include "rpc/wire.h"

namespace granary::fuse {
namespace {

// One call on a write session's connection; the descriptor that came back in *fd (BEGIN).
// *transport (optional) tells an error of the connection itself (the worker went away: its
// session is gone) from the worker's answer.
StatusOr<rpc::LocalResponse> Call(int conn, const rpc::WriteCall& call, int* fd, bool* transport = nullptr) {
  rpc::LocalRequest req;
  *req.mutable_write() = call;
  if (transport != nullptr) *transport = true;
  RETURN_IF_ERROR(SendFrame(conn, req).WithContext("the worker's local socket"));
  rpc::LocalResponse resp;
  int got = -1;
  RETURN_IF_ERROR(RecvFrame(conn, &resp, &got).WithContext("the worker's local socket"));
  if (transport != nullptr) *transport = false;
  if (fd != nullptr) {
    *fd = got;
  } else if (got >= 0) {
    close(got);
  }
  Status st = rpc::StatusOf(resp);
  if (!st.ok()) {
    if (fd != nullptr && *fd >= 0) close(*fd);
    return st;
  }
  return resp;
}

}  // namespace

WriteFiles::~WriteFiles() {
  {
    MutexLock s(&spare_mu_);
    for (const Spare& sp : spares_) {
      close(sp.fd);
      close(sp.conn);  // the worker drops the spare session and its staging file
    }
    spares_.clear();
  }
  {
    MutexLock q(&query_mu_);
    if (query_conn_ >= 0) close(query_conn_);
  }
  MutexLock lock(&mu_);
  for (auto& [kino, f] : by_inode_) {
    MutexLock fl(&f->mu);
    EndLocked(*f);
  }
}

Status WriteFiles::BeginLocked(File& f, bool copy) {
  rpc::WriteCall c;
  const rpc::FileInfo& file = f.target.target.file();
  c.set_mount_id(file.mount_id());
  c.set_ufs_path(file.ufs_path());
  c.set_ino(file.attr().ino());
  c.set_parent(f.target.parent);
  c.set_name(f.target.name);
  c.set_mode(f.target.mode);
  c.set_uid(f.target.uid);
  c.set_gid(f.target.gid);
  c.set_write_mode(f.target.target.write_mode());
  c.set_block_size(file.block_size());
  for (uint32_t g : f.target.groups) c.add_groups(g);
  int conn = -1, fd = -1;
  uint64_t session = 0;
  // A spare session, aimed at this file: its staging file was made before the open came.
  while (auto spare = TakeSpare()) {
    c.set_op(rpc::WriteCall::AIM);
    c.set_session(spare->session);
    bool transport = false;
    auto aimed = Call(spare->conn, c, nullptr, &transport);
    if (aimed.ok()) {
      conn = spare->conn;
      fd = spare->fd;
      session = spare->session;
      break;
    }
    close(spare->conn);
    close(spare->fd);
    if (!transport) return aimed.status();  // the worker's answer (a read-only mount): as BEGIN's
  }
  if (conn < 0) {
    ASSIGN_OR_RETURN(conn, ConnectUnix(socket_));
    c.set_op(rpc::WriteCall::BEGIN);
    c.clear_session();
    auto resp = Call(conn, c, &fd);
    if (!resp.ok()) {
      close(conn);
      return resp.status();
    }
    if (fd < 0) {
      close(conn);
      return InternalError("the worker began a write session without a staging file");
    }
    session = resp->session();
  }
  if (copy && f.fd >= 0 && f.size > 0) {
    loff_t in = 0, out = 0;
    uint64_t left = f.size;
    while (left > 0) {
      ssize_t n = copy_file_range(f.fd, &in, fd, &out, left, 0);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) {
        Status e = n < 0 ? ErrnoError(errno, "copy a sealed file into a new staging file")
                         : DataLossError("a sealed staging file is shorter than the file");
        close(fd);
        close(conn);
        return e;
      }
      left -= static_cast<uint64_t>(n);
    }
  }
  EndLocked(f);
  f.conn = conn;
  f.fd = fd;
  f.session = session;
  f.sealed = false;
  f.contiguous = copy ? f.size : 0;
  f.reported = 0;
  f.stream_dropped = false;
  return Status::OK();
}

std::optional<WriteFiles::Spare> WriteFiles::TakeSpare() {
  MutexLock lock(&spare_mu_);
  if (spares_.empty()) return std::nullopt;
  Spare s = spares_.front();
  spares_.pop_front();
  return s;
}

void WriteFiles::Refill(int conn) {
  {
    MutexLock lock(&spare_mu_);
    if (spares_.size() >= kSpares) {
      if (conn >= 0) close(conn);
      return;
    }
  }
  if (conn < 0) {
    auto c = ConnectUnix(socket_);
    if (!c.ok()) return;  // the next open begins its own session (and says why, if it cannot)
    conn = *c;
  }
  rpc::WriteCall c;
  c.set_op(rpc::WriteCall::BEGIN);
  int fd = -1;
  auto resp = Call(conn, c, &fd);
  if (!resp.ok() || fd < 0) {
    if (fd >= 0) close(fd);
    close(conn);
    return;
  }
  MutexLock lock(&spare_mu_);
  spares_.push_back(Spare{conn, fd, resp->session()});
}

void WriteFiles::EndLocked(File& f) {
  if (f.fd >= 0) close(f.fd);
  if (f.conn >= 0) close(f.conn);  // an unsealed session is dropped by the worker
  f.fd = f.conn = -1;
  f.session = 0;
}

StatusOr<uint64_t> WriteFiles::Open(uint64_t kino, const Target& t) {
  std::shared_ptr<File> f;
  {
    MutexLock lock(&mu_);
    auto it = by_inode_.find(kino);
    f = it != by_inode_.end() ? it->second : std::make_shared<File>();
    Indexed(*f).handles++;
    Indexed(*f).staged = false;  // a new version begins: the staged one's file is replaced below
    Indexed(*f).attr = t.target.file().attr();
    Indexed(*f).name_parent = t.parent;
    Indexed(*f).name_now = t.name;
    by_inode_[kino] = f;
  }
  Status st;
  {
    MutexLock fl(&f->mu);
    if (f->conn < 0 || f->sealed || f->failed) {
      f->target = t;
      st = BeginLocked(*f, false);
    }
    if (st.ok() && ftruncate(f->fd, 0) != 0) st = ErrnoError(errno, "empty a staging file");
    if (st.ok()) {
      if (f->reported > 0 && !ProgressLocked(*f, 0, 0).ok()) f->stream_dropped = true;  // emptied below what was streamed
      f->size = 0;
      f->size_seen = 0;
      f->contiguous = 0;
      f->failed = false;  // a new version from empty
      f->dirty = true;  // emptied: even with no write, close() makes the file empty in the store
    }
  }
  MutexLock lock(&mu_);
  if (!st.ok()) {
    if (--Indexed(*f).handles == 0) {
      by_inode_.erase(kino);
      MutexLock fl(&f->mu);  // lock order: mu_, then the File's
      EndLocked(*f);
    }
    return st;
  }
  uint64_t fh = NewHandle();
  by_handle_[fh] = f;
  inode_of_[fh] = kino;
  return fh;
}

StatusOr<uint64_t> WriteFiles::Join(uint64_t kino) {
  MutexLock lock(&mu_);
  auto it = by_inode_.find(kino);
  if (it == by_inode_.end() || Indexed(*it->second).staged) return NotFoundError("not being written here");
  Indexed(*it->second).handles++;
  uint64_t fh = NewHandle();
  by_handle_[fh] = it->second;
  inode_of_[fh] = kino;
  return fh;
}

std::shared_ptr<WriteFiles::File> WriteFiles::Of(uint64_t fh, uint64_t kino) {
  MutexLock lock(&mu_);
  auto it = by_handle_.find(fh);
  if (it == by_handle_.end()) return nullptr;
  auto ino = inode_of_.find(fh);
  if (ino == inode_of_.end() || ino->second != kino) return nullptr;  // another inode's handle: not ours
  return it->second;
}

bool WriteFiles::Known(uint64_t fh, uint64_t kino) { return Of(fh, kino) != nullptr; }

Status WriteFiles::Write(uint64_t fh, uint64_t kino, const char* buf, size_t size, off_t off) {
  auto f = Of(fh, kino);
  if (!f) return FailedPreconditionError("write through an unknown write handle (granary-fuse restarted?)");
  MutexLock fl(&f->mu);
  if (f->failed) return f->failure;  // the same answer as the write that failed (ENOSPC stays ENOSPC)
  if (f->sealed) {  // after a commit the worker owns that staging file: a new version starts
    Status begun = BeginLocked(*f, true);
    if (!begun.ok()) return Failed(*f, begun);
  }
  if (f->fd < 0) return Failed(*f, FailedPreconditionError("the file's write session ended"));
  size_t done = 0;
  while (done < size) {
    ssize_t n = pwrite(f->fd, buf + done, size - done, off + static_cast<off_t>(done));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return Failed(*f, ErrnoError(errno, "write the staging file"));  // ENOSPC: the staging disk is full
    done += static_cast<size_t>(n);
  }
  f->size = std::max<uint64_t>(f->size, static_cast<uint64_t>(off) + size);
  f->size_seen = f->size;
  f->dirty = true;
  f->attrs.clear_mtime_ns();  // a write after utimes makes the mtime the write's (the store's at commit)
  // Start writing the staged bytes to disk as they come, so the fsync of a commit (the worker's,
  // before it acknowledges a write=back close) finds little left to do.
  f->unsynced += size;
  if (f->unsynced >= kStartWriteback) {
    sync_file_range(f->fd, 0, 0, SYNC_FILE_RANGE_WRITE);
    f->unsynced = 0;
  }
  // The streamed upload is an optimisation: if telling the worker fails, the file is uploaded whole.
  if (!ProgressLocked(*f, static_cast<uint64_t>(off), static_cast<uint64_t>(off) + size).ok()) f->stream_dropped = true;
  return Status::OK();
}

Status WriteFiles::Failed(File& f, Status why) {
  // A write the writer was told failed: committing what is staged would store a file it did not
  // write. close() answers EIO and the file keeps its previous version.
  f.failed = true;
  f.failure = why;
  return why;
}

Status WriteFiles::ProgressLocked(File& f, uint64_t off, uint64_t end) {
  if (static_cast<WriteMode>(f.target.target.write_mode()) != WriteMode::kThrough || f.stream_dropped) {
    return Status::OK();
  }
  rpc::WriteCall c;
  c.set_op(rpc::WriteCall::PROGRESS);
  c.set_session(f.session);
  if (off < f.reported) {  // behind what the worker may have uploaded: it drops that upload
    f.stream_dropped = true;
    c.set_size(0);
    return Call(f.conn, c, nullptr).status();
  }
  if (off <= f.contiguous) f.contiguous = std::max(f.contiguous, end);
  if (f.contiguous < kProgressSlack || f.contiguous - kProgressSlack < f.reported + kProgressStep) return Status::OK();
  f.reported = f.contiguous - kProgressSlack;
  c.set_size(f.reported);
  return Call(f.conn, c, nullptr).status();
}

StatusOr<size_t> WriteFiles::Read(uint64_t fh, uint64_t kino, char* buf, size_t size, off_t off) {
  auto f = Of(fh, kino);
  if (!f) return FailedPreconditionError("read through an unknown write handle");
  MutexLock fl(&f->mu);
  if (f->fd < 0) return FailedPreconditionError("the file's write session ended");
  if (static_cast<uint64_t>(off) >= f->size) return size_t{0};
  size = static_cast<size_t>(std::min<uint64_t>(size, f->size - static_cast<uint64_t>(off)));
  size_t done = 0;
  while (done < size) {
    ssize_t n = pread(f->fd, buf + done, size - done, off + static_cast<off_t>(done));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return ErrnoError(errno, "read the staging file");
    if (n == 0) break;
    done += static_cast<size_t>(n);
  }
  std::fill(buf + done, buf + size, '\0');  // a hole past what the staging file holds
  return size;
}

Status WriteFiles::Truncate(uint64_t fh, uint64_t kino, uint64_t size) {
  auto f = Of(fh, kino);
  if (!f) return FailedPreconditionError("truncate through an unknown write handle");
  MutexLock fl(&f->mu);
  if (f->failed) return f->failure;
  if (f->sealed) {
    Status begun = BeginLocked(*f, true);
    if (!begun.ok()) return Failed(*f, begun);
  }
  if (ftruncate(f->fd, static_cast<off_t>(size)) != 0) return Failed(*f, ErrnoError(errno, "truncate the staging file"));
  f->size = size;
  f->size_seen = size;
  f->dirty = true;
  f->contiguous = std::min(f->contiguous, size);
  if (size < f->reported && !ProgressLocked(*f, size, size).ok()) f->stream_dropped = true;
  return Status::OK();
}

Status WriteFiles::CommitLocked(File& f, bool wait_upload) {
  if (f.failed) {
    return InternalError("a write to this file failed earlier, so it was not committed (the file keeps its previous "
                         "version; write it again)");
  }
  if (!f.dirty && !wait_upload) return Status::OK();
  const bool back_mode = static_cast<WriteMode>(f.target.target.write_mode()) == WriteMode::kBack;
  if (!f.dirty && !back_mode) return Status::OK();  // through: committed already
  if (!f.dirty && f.sealed) {
    // fsync after close: the sealed version's upload is what it waits for; a new session from a
    // copy of it commits the same bytes again and waits.
    RETURN_IF_ERROR(BeginLocked(f, true));
  } else if (!f.dirty) {
    return Status::OK();  // through: committed already
  }
  if (f.conn < 0) return FailedPreconditionError("the file's write session ended");
  rpc::WriteCall c;
  c.set_op(rpc::WriteCall::COMMIT);
  c.set_session(f.session);
  c.set_size(f.size);
  c.set_wait_upload(wait_upload);
  if (f.attrs.ByteSizeLong() > 0) *c.mutable_attrs() = f.attrs;
  bool transport = false;
  auto resp = Call(f.conn, c, nullptr, &transport);
  if (!resp.ok() && transport && f.fd >= 0) {
    // The connection broke (the worker restarted) and took the session with it: a new one from
    // the bytes staged here (this process's descriptor outlives the worker's session).
    Status again = BeginLocked(f, true);
    if (again.ok()) {
      c.set_session(f.session);
      resp = Call(f.conn, c, nullptr, &transport);
    }
  }
  const bool back = static_cast<WriteMode>(f.target.target.write_mode()) == WriteMode::kBack;
  if (!resp.ok()) {
    // write=back's fsync that ran out of time: the file is sealed (the upload goes on), so this
    // version is the worker's now.
    if (back && !transport && resp.status().code() == Code::kDeadlineExceeded) {
      f.dirty = false;
      f.sealed = true;
    }
    return resp.status();
  }
  f.dirty = false;
  f.committed_once = true;
  f.attrs.Clear();  // the store has them with this version
  if (back) f.last_sealed = resp->sealed();
  // The committed staging file is not written again (write=back: the uploader owns it;
  // write=through: the worker caches the committed version's blocks from it): more writes start a
  // new session from a copy.
  f.sealed = true;
  f.reported = 0;  // the streamed upload was this commit's; more writes start another
  f.stream_dropped = false;
  return Status::OK();
}

Status WriteFiles::Commit(uint64_t fh, uint64_t kino, bool wait_upload) {
  {
    MutexLock lock(&mu_);
    if (read_only_.count(fh) != 0) return Status::OK();  // a reader's: nothing of its to commit
  }
  auto f = Of(fh, kino);
  if (!f) {
    // Opened by a granary-fuse that was restarted since: what it wrote was dropped with it.
    return InternalError("the file was opened for writing before granary-fuse restarted; what was written through "
                         "that open was not committed (write it again)");
  }
  MutexLock fl(&f->mu);
  return CommitLocked(*f, wait_upload);
}

std::shared_ptr<WriteFiles::File> WriteFiles::DropHandle(uint64_t fh, uint64_t kino) {
  MutexLock lock(&mu_);
  auto it = by_handle_.find(fh);
  if (it == by_handle_.end()) return nullptr;
  if (inode_of_[fh] != kino) return nullptr;  // another inode's handle: not ours to end
  std::shared_ptr<File> f = it->second;
  by_handle_.erase(it);
  inode_of_.erase(fh);
  if (--Indexed(*f).handles != 0) return nullptr;
  by_inode_.erase(kino);
  return f;
}

WriteFiles::Released WriteFiles::Release(uint64_t fh, uint64_t kino) {
  Released r;
  {
    MutexLock lock(&mu_);
    read_only_.erase(fh);
  }
  std::shared_ptr<File> f = DropHandle(fh, kino);
  if (!f) return r;
  bool stage = false;
  uint64_t sealed_id = 0;
  int idle = -1;  // the sealed session's connection, free for a spare
  {
    MutexLock fl(&f->mu);
    r.status = f->failed ? Status::OK() : CommitLocked(*f, false);
    if ((f->failed || !r.status.ok()) && f->target.target.created() && !f->committed_once) {
      r.abandoned = Abandoned{f->target.target.file().attr().ino(), f->target.parent, f->target.name};
    }
    const bool back = static_cast<WriteMode>(f->target.target.write_mode()) == WriteMode::kBack;
    if (r.status.ok() && !f->failed && back && f->sealed && f->committed_once && f->fd >= 0) {
      // Staged: the session's connection goes (the sealed file is the uploader's), the descriptor
      // stays for this node's reads until the master has the upload.
      idle = f->conn;  // the worker ended its session at the seal
      f->conn = -1;
      f->session = 0;
      sealed_id = f->last_sealed;
      stage = true;
    } else {
      EndLocked(*f);
    }
  }
  if (!stage) {
    Refill(-1);
    return r;
  }
  std::vector<std::shared_ptr<File>> dropped;
  {
    MutexLock lock(&mu_);
    if (by_inode_.count(kino) == 0) {  // no new open of the inode came meanwhile
      Indexed(*f).staged = true;
      Indexed(*f).sealed_id = sealed_id;
      by_inode_[kino] = f;
      staged_order_.push_back(kino);
      f = nullptr;
      // Every staged inode is in staged_order_ (an inode staged again is in it twice: its older
      // place counts): at most kMaxStaged stay staged, the oldest go first.
      while (staged_order_.size() > kMaxStaged) {
        const uint64_t oldest = staged_order_.front();
        staged_order_.pop_front();
        if (auto gone = UnstageLocked(oldest)) dropped.push_back(std::move(gone));
      }
    }
  }
  if (f) dropped.push_back(std::move(f));  // another File took the inode: this one's bytes are not its
  for (auto& d : dropped) {
    MutexLock fl(&d->mu);
    EndLocked(*d);
  }
  // A spare session for the next open, once the staged File answers for the inode again (this
  // RELEASE is on no writer's path: the kernel sends it after close() returned).
  Refill(idle);
  return r;
}

std::shared_ptr<WriteFiles::File> WriteFiles::UnstageLocked(uint64_t kino) {
  auto it = by_inode_.find(kino);
  if (it == by_inode_.end() || !Indexed(*it->second).staged || Indexed(*it->second).handles != 0) return nullptr;
  std::shared_ptr<File> f = std::move(it->second);
  by_inode_.erase(it);
  return f;
}

StatusOr<rpc::LocalResponse> WriteFiles::Query(const rpc::WriteCall& c) {
  MutexLock lock(&query_mu_);
  Status last = UnavailableError("the worker's local socket");
  for (int attempt = 0; attempt < 2; ++attempt) {
    if (query_conn_ < 0) {
      auto conn = ConnectUnix(socket_);
      if (!conn.ok()) return conn.status();
      query_conn_ = *conn;
    }
    bool transport = false;
    auto resp = Call(query_conn_, c, nullptr, &transport);
    if (resp.ok() || !transport) return resp;
    last = resp.status();
    close(query_conn_);  // a worker restarted since, or an answer we cannot read: ask anew once
    query_conn_ = -1;
  }
  return last;
}

bool WriteFiles::UploadPending(uint64_t id) {
  rpc::WriteCall c;
  c.set_op(rpc::WriteCall::UPLOADED);
  c.set_session(id);
  auto resp = Query(c);
  return !resp.ok() || resp->upload_pending();  // an error counts as waiting
}

std::shared_ptr<WriteFiles::File> WriteFiles::Current(uint64_t kino) {
  uint64_t sealed_id = 0;
  std::shared_ptr<File> f;
  {
    MutexLock lock(&mu_);
    auto it = by_inode_.find(kino);
    if (it == by_inode_.end()) return nullptr;
    f = it->second;
    if (!Indexed(*f).staged || Indexed(*f).handles > 0) return f;
    sealed_id = Indexed(*f).sealed_id;
  }
  if (UploadPending(sealed_id)) return f;
  std::shared_ptr<File> dropped;
  {
    MutexLock lock(&mu_);
    auto it = by_inode_.find(kino);
    if (it != by_inode_.end() && it->second == f) dropped = UnstageLocked(kino);  // the master has it now
    if (it != by_inode_.end() && it->second == f && !dropped) return f;  // opened meanwhile: it answers
  }
  if (dropped) {
    MutexLock fl(&dropped->mu);
    EndLocked(*dropped);
  }
  return nullptr;
}

std::optional<rpc::Attr> WriteFiles::LookupWritten(uint64_t parent, const std::string& name) {
  uint64_t kino = 0;
  {
    MutexLock lock(&mu_);
    for (const auto& [k, f] : by_inode_) {
      if (Indexed(*f).name_parent == parent && Indexed(*f).name_now == name) {
        kino = k;
        break;
      }
    }
  }
  if (kino == 0) return std::nullopt;
  std::shared_ptr<File> f = Current(kino);  // a staged one whose upload ended: the master's answer
  if (!f) return std::nullopt;
  MutexLock lock(&mu_);
  if (Indexed(*f).name_parent != parent || Indexed(*f).name_now != name) return std::nullopt;  // renamed meanwhile
  MutexLock fl(&f->mu);  // lock order: mu_, then the File's
  // Committed and not staged (write=through after its close, before the RELEASE): the master has
  // the new version; this File's attributes are the open's, without it.
  if (f->sealed && !Indexed(*f).staged) return std::nullopt;
  rpc::Attr a = Indexed(*f).attr;
  a.set_size(f->size_seen.load());
  return a;
}

void WriteFiles::Renamed(uint64_t parent, const std::string& name, uint64_t new_parent, const std::string& new_name) {
  MutexLock lock(&mu_);
  for (auto& [k, f] : by_inode_) {
    if (Indexed(*f).name_parent == new_parent && Indexed(*f).name_now == new_name) Indexed(*f).name_parent = 0, Indexed(*f).name_now.clear();  // replaced
  }
  for (auto& [k, f] : by_inode_) {
    if (Indexed(*f).name_parent == parent && Indexed(*f).name_now == name) Indexed(*f).name_parent = new_parent, Indexed(*f).name_now = new_name;
  }
}

void WriteFiles::Unlinked(uint64_t parent, const std::string& name) {
  MutexLock lock(&mu_);
  for (auto& [k, f] : by_inode_) {
    if (Indexed(*f).name_parent == parent && Indexed(*f).name_now == name) Indexed(*f).name_parent = 0, Indexed(*f).name_now.clear();
  }
}

bool WriteFiles::Has(uint64_t kino) {
  MutexLock lock(&mu_);
  return by_inode_.count(kino) != 0;
}

StatusOr<uint64_t> WriteFiles::OpenStaged(uint64_t kino) {
  std::shared_ptr<File> f = Current(kino);
  if (!f) return NotFoundError("not written or staged here");
  MutexLock lock(&mu_);
  auto it = by_inode_.find(kino);
  if (it == by_inode_.end() || it->second != f) return NotFoundError("not written or staged here");
  Indexed(*f).handles++;
  const uint64_t fh = NewHandle();
  by_handle_[fh] = f;
  inode_of_[fh] = kino;
  read_only_.insert(fh);
  return fh;
}

std::optional<rpc::Attr> WriteFiles::AttrOf(uint64_t kino) {
  std::shared_ptr<File> f = Current(kino);
  if (!f) return std::nullopt;
  rpc::Attr a;
  {
    MutexLock lock(&mu_);  // not the File's lock: a commit holds it for as long as an upload takes
    a = Indexed(*f).attr;
  }
  const uint64_t size = f->size_seen.load();
  a.set_size(size);
  return a;
}

std::optional<rpc::Attr> WriteFiles::SetAttrWhileWriting(uint64_t kino, const rpc::AttrChange& change) {
  {
    std::shared_ptr<File> staged;
    uint64_t sealed_id = 0;
    {
      MutexLock lock(&mu_);
      auto it = by_inode_.find(kino);
      if (it == by_inode_.end()) return std::nullopt;
      if (Indexed(*it->second).staged && Indexed(*it->second).handles == 0) {
        staged = it->second;
        sealed_id = Indexed(*staged).sealed_id;
      }
    }
    if (staged) {
      // Closed, its upload not begun: the worker gives the change to the store with the upload.
      rpc::WriteCall c;
      c.set_op(rpc::WriteCall::SEALED_ATTRS);
      c.set_session(sealed_id);
      *c.mutable_attrs() = change;
      if (!Query(c).ok()) return std::nullopt;  // uploading or uploaded: the master's
      MutexLock lock(&mu_);
      rpc::Attr& a = Indexed(*staged).attr;
      if (change.has_mode()) a.set_mode(change.mode());
      if (change.has_uid()) a.set_uid(change.uid());
      if (change.has_gid()) a.set_gid(change.gid());
      if (change.has_mtime_ns()) a.set_mtime_ns(change.mtime_ns());
      rpc::Attr out = a;
      out.set_size(staged->size_seen.load());
      return out;
    }
  }
  MutexLock lock(&mu_);
  auto it = by_inode_.find(kino);
  if (it == by_inode_.end() || Indexed(*it->second).staged || Indexed(*it->second).handles == 0) return std::nullopt;
  File& f = *it->second;
  MutexLock fl(&f.mu);  // lock order: mu_, then the File's
  if (f.failed || f.sealed || f.fd < 0) return std::nullopt;  // committed (or failing): the master's
  rpc::Attr& a = Indexed(f).attr;
  if (change.has_mode()) f.attrs.set_mode(change.mode()), a.set_mode(change.mode());
  if (change.has_uid()) f.attrs.set_uid(change.uid()), a.set_uid(change.uid());
  if (change.has_gid()) f.attrs.set_gid(change.gid()), a.set_gid(change.gid());
  if (change.has_atime_ns()) f.attrs.set_atime_ns(change.atime_ns());
  if (change.has_mtime_ns()) f.attrs.set_mtime_ns(change.mtime_ns()), a.set_mtime_ns(change.mtime_ns());
  f.dirty = true;  // the commit carries them, even with no byte written since the last
  rpc::Attr out = a;
  out.set_size(f.size);
  return out;
}

void WriteFiles::NoteAttr(uint64_t kino, const rpc::Attr& a) {
  MutexLock lock(&mu_);
  auto it = by_inode_.find(kino);
  if (it != by_inode_.end()) Indexed(*it->second).attr = a;
}

std::optional<uint64_t> WriteFiles::SizeOf(uint64_t kino) {
  // Not the File's lock: a commit holds it for as long as an upload takes.
  std::shared_ptr<File> f = Current(kino);
  if (!f) return std::nullopt;
  return f->size_seen.load();
}

Status WriteFiles::Abort(uint64_t fh, uint64_t kino) {
  bool reader;
  {
    MutexLock lock(&mu_);
    reader = read_only_.count(fh) != 0;
  }
  if (reader) return Release(fh, kino).status;  // a reader's handle: the staged File stays
  std::shared_ptr<File> f = DropHandle(fh, kino);
  if (!f) return Status::OK();
  MutexLock fl(&f->mu);
  EndLocked(*f);  // the worker drops the session: nothing is committed
  return Status::OK();
}

Status WriteFiles::Discard(uint64_t fh, uint64_t kino) {
  {
    MutexLock lock(&mu_);
    if (read_only_.count(fh) != 0) return Status::OK();  // a reader killed: the writer's file stands
  }
  std::shared_ptr<File> f = Of(fh, kino);
  if (!f) return FailedPreconditionError("discard through an unknown write handle");
  MutexLock fl(&f->mu);
  // Never committed, by this handle or another of the inode: what a killed writer wrote is not a
  // file it finished. Its RELEASE ends the session and the store keeps the previous version.
  if (!f->failed) Failed(*f, AbortedError("the writer was killed before it closed the file; nothing was committed")).IgnoreError();
  return Status::OK();
}

std::vector<WriteFiles::Exported> WriteFiles::Export() {
  MutexLock lock(&mu_);
  std::map<const File*, Exported> by_file;
  for (const auto& [kino, f] : by_inode_) {
    MutexLock fl(&f->mu);  // lock order: mu_, then the File's
    Exported& e = by_file[f.get()];
    rpc::FuseWriteFile& w = e.file;
    w.set_kino(kino);
    *w.mutable_target() = f->target.target;
    w.set_parent(f->target.parent);
    w.set_name(f->target.name);
    w.set_mode(f->target.mode);
    w.set_uid(f->target.uid);
    w.set_gid(f->target.gid);
    for (uint32_t g : f->target.groups) w.add_groups(g);
    w.set_session(f->session);
    w.set_size(f->size);
    w.set_failed(f->failed);
    w.set_failure_code(static_cast<int32_t>(f->failure.code()));
    w.set_failure(f->failure.message());
    w.set_dirty(f->dirty);
    w.set_sealed(f->sealed);
    w.set_committed_once(f->committed_once);
    if (f->attrs.ByteSizeLong() > 0) *w.mutable_attrs() = f->attrs;
    w.set_last_sealed(f->last_sealed);
    w.set_contiguous(f->contiguous);
    w.set_reported(f->reported);
    w.set_stream_dropped(f->stream_dropped);
    w.set_staged(Indexed(*f).staged);
    w.set_sealed_id(Indexed(*f).sealed_id);
    w.set_has_conn(f->conn >= 0);
    e.fd = f->fd;
    e.conn = f->conn;
  }
  for (const auto& [fh, f] : by_handle_) {
    auto it = by_file.find(f.get());
    if (it == by_file.end()) continue;
    it->second.file.add_handles(fh);
    if (read_only_.count(fh) != 0) it->second.file.add_read_only(fh);
  }
  std::vector<Exported> out;
  for (auto& [p, e] : by_file) {
    if (e.fd >= 0) out.push_back(std::move(e));  // a File without its staging file has nothing to go on with
  }
  return out;
}

void WriteFiles::Restore(const rpc::FuseWriteFile& w, int fd, int conn) {
  auto f = std::make_shared<File>();
  {
    MutexLock fl(&f->mu);
    f->target.target = w.target();
    f->target.parent = w.parent();
    f->target.name = w.name();
    f->target.mode = w.mode();
    f->target.uid = w.uid();
    f->target.gid = w.gid();
    f->target.groups.assign(w.groups().begin(), w.groups().end());
    f->fd = fd;
    f->conn = conn;
    f->session = conn >= 0 ? w.session() : 0;
    f->size = w.size();
    f->size_seen = w.size();
    f->failed = w.failed();
    if (w.failed()) f->failure = Status(static_cast<Code>(w.failure_code()), w.failure());
    f->dirty = w.dirty();
    f->sealed = w.sealed();
    f->committed_once = w.committed_once();
    f->attrs = w.attrs();
    f->last_sealed = w.last_sealed();
    f->contiguous = w.contiguous();
    f->reported = w.reported();
    f->stream_dropped = w.stream_dropped();
    if (conn < 0 && !w.staged() && !w.sealed() && !w.failed()) {
      // Its session's connection did not come: what it wrote cannot be committed any more.
      Failed(*f, UnavailableError("the write session was lost in a hand-over; the file keeps its previous version")).IgnoreError();
    }
  }
  MutexLock lock(&mu_);
  Indexed(*f).staged = w.staged();
  Indexed(*f).sealed_id = w.sealed_id();
  Indexed(*f).attr = w.target().file().attr();
  Indexed(*f).handles = w.handles_size();
  for (uint64_t fh : w.handles()) {
    by_handle_[fh] = f;
    inode_of_[fh] = w.kino();
  }
  for (uint64_t fh : w.read_only()) read_only_.insert(fh);
  if (Indexed(*f).staged && Indexed(*f).handles == 0) staged_order_.push_back(w.kino());
  by_inode_[w.kino()] = f;
}

size_t WriteFiles::open_files() {
  MutexLock lock(&mu_);
  size_t n = 0;
  for (const auto& [kino, f] : by_inode_) n += Indexed(*f).staged && Indexed(*f).handles == 0 ? 0 : 1;
  return n;
}

}  // namespace granary::fuse
