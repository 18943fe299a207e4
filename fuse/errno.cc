#include "fuse/errno.h"

#include <spdlog/spdlog.h>

#include <cerrno>
#include <map>

#include "common/thread_annotations.h"

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

void ReplyError(fuse_req_t req, const Status& s, const char* op) {
  int err = ToErrno(s);
  if (err == EIO || err == ESTALE || err == EACCES || err == EOPNOTSUPP || err == ENOSPC) {
    spdlog::warn("{}: {} -> {}", op, s.ToString(), strerrorname_np(err));
  } else {
    spdlog::debug("{}: {} -> {}", op, s.ToString(), strerrorname_np(err));
  }
  CountError(op, err);
  t_replied = err;
  fuse_reply_err(req, err);
}

void ReplyUnsupported(fuse_req_t req) {
  t_replied = ENOSYS;
  fuse_reply_err(req, ENOSYS);
}

void ReplyErrno(fuse_req_t req, int err) {
  CountError(err == EROFS ? "write" : "other", err);
  t_replied = err;
  fuse_reply_err(req, err);
}

int TakeReplyErrno() {
  int e = t_replied;
  t_replied = 0;
  return e;
}

}  // namespace granary::fuse
