// The errno funnel: the only place where a Status becomes an errno and where fuse/ replies with
// an error. Every FUSE operation that fails ends in ReplyError (or ReplyErrno for answers that are
// not a Status, such as EROFS for writes).
//
//   NOT_FOUND -> ENOENT          PERMISSION_DENIED, UNAUTHENTICATED -> EACCES
//   INVALID_ARGUMENT -> EINVAL   version changed (Status::IsVersionChanged) -> ESTALE
//   ALREADY_EXISTS -> EEXIST     RESOURCE_EXHAUSTED -> ENOSPC
//   UNIMPLEMENTED -> ENOSYS      CANCELLED -> EINTR
//   FAILED_PRECONDITION with Reason::kNotEmpty -> ENOTEMPTY, kReadOnly -> EROFS,
//   kNotSupported -> EOPNOTSUPP (the write calls' refusals, common/status.h)
//   everything else (UNAVAILABLE, DEADLINE_EXCEEDED, DATA_LOSS, INTERNAL, any other
//   FAILED_PRECONDITION, ...) -> EIO
#pragma once

#define FUSE_USE_VERSION 312
#include <fuse_lowlevel.h>

#include <cstdint>
#include <map>
#include <string>
#include <utility>

#include "common/status.h"
#include "fuse/reply.h"

namespace granary::fuse {

int ToErrno(const Status& s);
// Each answers through a Reply (fuse/reply.h) or, for the operations still written against
// libfuse, its request.
void ReplyError(Reply& r, const Status& s, const char* op);
void ReplyError(fuse_req_t req, const Status& s, const char* op);
void ReplyErrno(Reply& r, int err);
void ReplyErrno(fuse_req_t req, int err);
// ENOSYS as a protocol answer, not an error: "the kernel does this itself from now on" (OPEN and
// FLUSH in the kernel read mode, extended attributes). Not counted in ErrorCounts().
void ReplyUnsupported(Reply& r);
void ReplyUnsupported(fuse_req_t req);
// The errno the last of the functions above replied on this thread since the previous call (0:
// none), for the access trace.
int TakeReplyErrno();
// Error replies so far, by (operation, errno name), for /metrics.
std::map<std::pair<std::string, std::string>, uint64_t> ErrorCounts();

}  // namespace granary::fuse
