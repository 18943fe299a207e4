#include "common/status.h"

#include <cerrno>
#include <cstring>

namespace granary {

std::string_view CodeName(Code code) {
  switch (code) {
    case Code::kOk: return "OK";
    case Code::kCancelled: return "CANCELLED";
    case Code::kUnknown: return "UNKNOWN";
    case Code::kInvalidArgument: return "INVALID_ARGUMENT";
    case Code::kDeadlineExceeded: return "DEADLINE_EXCEEDED";
    case Code::kNotFound: return "NOT_FOUND";
    case Code::kAlreadyExists: return "ALREADY_EXISTS";
    case Code::kPermissionDenied: return "PERMISSION_DENIED";
    case Code::kResourceExhausted: return "RESOURCE_EXHAUSTED";
    case Code::kFailedPrecondition: return "FAILED_PRECONDITION";
    case Code::kAborted: return "ABORTED";
    case Code::kOutOfRange: return "OUT_OF_RANGE";
    case Code::kUnimplemented: return "UNIMPLEMENTED";
    case Code::kInternal: return "INTERNAL";
    case Code::kUnavailable: return "UNAVAILABLE";
    case Code::kDataLoss: return "DATA_LOSS";
    case Code::kUnauthenticated: return "UNAUTHENTICATED";
  }
  return "UNKNOWN";
}

std::string Status::ToString() const {
  if (ok()) return "OK";
  std::string s(CodeName(code_));
  s += ": ";
  s += message_;
  return s;
}

Status Status::WithContext(std::string_view context) const {
  if (ok()) return *this;
  std::string m(context);
  m += ": ";
  m += message_;
  return Status(code_, std::move(m), reason_);
}

Status ErrnoError(int err, std::string_view what) {
  Code code;
  switch (err) {
    case ENOTEMPTY: return NotEmptyError(std::string(what) + ": " + std::strerror(err));
    case EROFS: return ReadOnlyError(std::string(what) + ": " + std::strerror(err));
    case EOPNOTSUPP: return NotSupportedError(std::string(what) + ": " + std::strerror(err));
    case ENOENT:
    case ENOTDIR: code = Code::kNotFound; break;
    case EACCES:
    case EPERM: code = Code::kPermissionDenied; break;
    case EEXIST: code = Code::kAlreadyExists; break;
    case ENOSPC:
    case EDQUOT:
    case ENOMEM: code = Code::kResourceExhausted; break;
    case EINVAL:
    case ENAMETOOLONG: code = Code::kInvalidArgument; break;
    case EAGAIN:
    case EINTR:
    case ECONNREFUSED:
    case ECONNRESET: code = Code::kUnavailable; break;
    case ETIMEDOUT: code = Code::kDeadlineExceeded; break;
    case EADDRINUSE: code = Code::kAlreadyExists; break;
    default: code = Code::kInternal; break;
  }
  std::string m(what);
  m += ": ";
  m += std::strerror(err);
  return Status(code, std::move(m));
}

}  // namespace granary
