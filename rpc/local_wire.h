// Framing for the worker's local socket (see LocalRequest in granary.proto): one message per frame
// of common/local_frames.h (a 4-byte little-endian length, then the serialized message),
// optionally with one file descriptor attached (SCM_RIGHTS; more are closed on arrival). Blocking I/O on a connected AF_UNIX stream socket; a connection is used by
// one thread at a time.
#pragma once

#include <google/protobuf/message_lite.h>

#include <functional>
#include <string>
#include <string_view>

#include "common/status.h"

namespace granary {

// Largest answer a client accepts: a whole block (at most 256 MiB) sent inline, plus framing.
constexpr uint32_t kMaxLocalFrame = 257u * 1024 * 1024;
// Largest request the worker accepts: a read names a path (at most 4 KiB) and a few numbers.
constexpr uint32_t kMaxLocalRequest = 64u * 1024;

// Sends `m`, with `fd` attached when >= 0 (the caller keeps its own copy of fd and closes it).
Status SendFrame(int sock, const google::protobuf::MessageLite& m, int fd = -1);
// Sends `m` and then `bytes` as its bytes field number `field`, last: the frame parses as `m` with
// that field set (a field may come in any order on the wire), while the bytes go from where they are
// to the kernel, never copied into a serialized message. `m` must leave the field unset.
Status SendFrameWithBytes(int sock, const google::protobuf::MessageLite& m, int field, std::string_view bytes,
                          int fd = -1);
// Receives one frame into `m`; *fd gets an attached descriptor or -1 (the caller closes it).
// UNAVAILABLE when the peer closed the connection or it broke; INVALID_ARGUMENT for a frame longer
// than `max_len` (refused before its body is read) or a body that does not parse. Memory grows
// with the bytes that actually arrive, never with what the length prefix claims.
Status RecvFrame(int sock, google::protobuf::MessageLite* m, int* fd, uint32_t max_len = kMaxLocalFrame);

// As RecvFrame, except that when the frame ends with `m`'s bytes field number `field` holding
// exactly `into_len` bytes (as SendFrameWithBytes sends it), those bytes are received straight into
// `into` — no buffer in between, no copy out of a parsed message — and the field stays empty in `m`:
// *landed is true. Any other frame (the field elsewhere, absent or of another length) is parsed
// whole as RecvFrame parses it, and *landed is false.
Status RecvFrameInto(int sock, google::protobuf::MessageLite* m, int* fd, int field, char* into, size_t into_len,
                     bool* landed, uint32_t max_len = kMaxLocalFrame);

// A connected AF_UNIX stream socket to the worker's local socket at `path` (common/net.h's
// ConnectUnix, naming it so). UNAVAILABLE when nobody listens.
StatusOr<int> ConnectUnix(const std::string& path);

}  // namespace granary
