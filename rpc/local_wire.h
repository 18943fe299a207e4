// Framing for the worker's local socket (see LocalRequest in granary.proto): one message per frame,
// a 4-byte little-endian length and the serialized message, optionally with one file descriptor
// attached (SCM_RIGHTS). Blocking I/O on a connected AF_UNIX stream socket; a connection is used by
// one thread at a time.
#pragma once

#include <google/protobuf/message_lite.h>

#include <string>

#include "common/status.h"

namespace granary {

// Largest frame either side accepts: a whole block sent inline, plus framing.
constexpr uint32_t kMaxLocalFrame = 257u * 1024 * 1024;

// Sends `m`, with `fd` attached when >= 0 (the caller keeps its own copy of fd and closes it).
Status SendFrame(int sock, const google::protobuf::MessageLite& m, int fd = -1);
// Receives one frame into `m`; *fd gets an attached descriptor or -1 (the caller closes it).
// UNAVAILABLE when the peer closed the connection or it broke.
Status RecvFrame(int sock, google::protobuf::MessageLite* m, int* fd);

// A connected AF_UNIX stream socket to `path` (close-on-exec). UNAVAILABLE when nobody listens.
StatusOr<int> ConnectUnix(const std::string& path);

}  // namespace granary
