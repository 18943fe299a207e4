#include "fuse/errno.h"

#include <spdlog/spdlog.h>

#include <cerrno>
#include <map>

#include "common/thread_annotations.h"
#include "fuse/session_io.h"

namespace granary::fuse {
namespace {

thread_local int t_replied = 0;  // the last errno replied on this thread (TakeReplyErrno)

Mutex errors_mu;
std::map<std::pair<std::string, std::string>, uint64_t> errors GUARDED_BY(errors_mu);

void CountError(const char* op, int err) {
  const char* name = strerrorname_np(err);
  MutexLock lock(&errors_mu);
  errors[{op, name ? name : std::to_string(err)}]++;
}

}  // namespace

std::map<std::pair<std::string, std::string>, uint64_t> ErrorCounts() {
  MutexLock lock(&errors_mu);
  return errors;
}

int ToErrno(const Status& s) {
  if (s.IsVersionChanged()) return ESTALE;
  if (s.code() == Code::kFailedPrecondition) {
    switch (s.reason()) {
      case Reason::kNotEmpty: return ENOTEMPTY;
      case Reason::kReadOnly: return EROFS;
      case Reason::kNotSupported: return EOPNOTSUPP;
      default: break;
    }
  }
  switch (s.code()) {
    case Code::kOk: return 0;
    case Code::kNotFound: return ENOENT;
    case Code::kPermissionDenied:
    case Code::kUnauthenticated: return EACCES;
    case Code::kInvalidArgument: return EINVAL;
    case Code::kAlreadyExists: return EEXIST;
    case Code::kResourceExhausted: return ENOSPC;
    case Code::kUnimplemented: return ENOSYS;
    case Code::kCancelled: return EINTR;
    default: return EIO;
  }
}

void ReplyError(Reply& r, const Status& s, const char* op) {
  int err = ToErrno(s);
  if (err == EIO || err == ESTALE || err == EACCES || err == EOPNOTSUPP || err == ENOSPC) {
    spdlog::warn("{}: {} -> {}", op, s.ToString(), strerrorname_np(err));
  } else {
    spdlog::debug("{}: {} -> {}", op, s.ToString(), strerrorname_np(err));
  }
  CountError(op, err);
  t_replied = err;
  r.Err(err);
}

void ReplyUnsupported(Reply& r) {
  t_replied = ENOSYS;
  r.Err(ENOSYS);
}

void ReplyErrno(Reply& r, int err) {
  CountError(err == EROFS ? "write" : "other", err);
  t_replied = err;
  r.Err(err);
}

void ReplyError(fuse_req_t req, const Status& s, const char* op) {
  FuseReply r(req);
  ReplyError(r, s, op);
}
void ReplyUnsupported(fuse_req_t req) {
  FuseReply r(req);
  ReplyUnsupported(r);
}
void ReplyErrno(fuse_req_t req, int err) {
  FuseReply r(req);
  ReplyErrno(r, err);
}

// ---- FuseReply (fuse/reply.h) ----

internal::Connection* FuseReply::connection() const {
  return static_cast<internal::Connection*>(fuse_req_userdata(req_));
}
pid_t FuseReply::pid() const {
  const fuse_ctx* c = fuse_req_ctx(req_);
  return c ? c->pid : 0;
}
uid_t FuseReply::uid() const {
  const fuse_ctx* c = fuse_req_ctx(req_);
  return c ? c->uid : 0;
}
gid_t FuseReply::gid() const {
  const fuse_ctx* c = fuse_req_ctx(req_);
  return c ? c->gid : 0;
}
int FuseReply::groups(int size, gid_t* list) const { return fuse_req_getgroups(req_, size, list); }
int FuseReply::Err(int err) { return fuse_reply_err(req_, err); }
int FuseReply::Open(const fuse_file_info& fi, int backing_id) {
  if (backing_id > 0) SessionIo::MarkOpenReply(backing_id);
  const int rc = fuse_reply_open(req_, &fi);
  if (rc != 0 && backing_id > 0) SessionIo::MarkOpenReply(0);
  return rc;
}
int FuseReply::Buf(const char* data, size_t n) { return fuse_reply_buf(req_, data, n); }
int FuseReply::Iov(const iovec* iov, int count) { return fuse_reply_iov(req_, iov, count); }
int FuseReply::Data(fuse_bufvec* bv, fuse_buf_copy_flags flags) { return fuse_reply_data(req_, bv, flags); }
int FuseReply::Entry(const fuse_entry_param& e) { return fuse_reply_entry(req_, &e); }
int FuseReply::Attr(const struct stat& st, double timeout) { return fuse_reply_attr(req_, &st, timeout); }
int FuseReply::Create(const fuse_entry_param& e, const fuse_file_info& fi) { return fuse_reply_create(req_, &e, &fi); }
int FuseReply::Write(size_t written) { return fuse_reply_write(req_, written); }
int FuseReply::Statfs(const struct statvfs& v) { return fuse_reply_statfs(req_, &v); }
size_t FuseReply::AddDirent(char* buf, size_t size, const char* name, const struct stat& st, off_t next) {
  return fuse_add_direntry(req_, buf, size, name, &st, next);
}
size_t FuseReply::AddDirentPlus(char* buf, size_t size, const char* name, const fuse_entry_param& e, off_t next) {
  return fuse_add_direntry_plus(req_, buf, size, name, &e, next);
}

int TakeReplyErrno() {
  int e = t_replied;
  t_replied = 0;
  return e;
}

}  // namespace granary::fuse
