// Frames on a local socket (AF_UNIX, SOCK_STREAM): the one codec under the worker's local socket
// (rpc/local_wire.h), the FUSE hand-over and the keeper (fuse/handover.h).
//
// A frame is a 4-byte little-endian length, then that many bytes. Descriptors (SCM_RIGHTS) travel
// with a frame's first bytes, as many as the sender attaches (at most kMaxFds). A receiver says how
// many it takes (the -1 slots of `fds`): descriptors beyond that are closed at once, so a peer can
// never make a process hold descriptors it did not ask for. Every call takes a deadline
// (kNoDeadline: block until done or the peer goes); past it, DEADLINE_EXCEEDED. A peer that closes
// or breaks the connection: UNAVAILABLE. `what` names the socket in errors ("the worker's local
// socket", "the hand-over socket").
//
// Not thread-safe per socket: one sender and one receiver at a time.
#pragma once

#include <sys/uio.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <span>
#include <string>

#include "common/status.h"

namespace granary::frames {

using Deadline = std::chrono::steady_clock::time_point;
inline constexpr Deadline kNoDeadline = Deadline::max();
inline constexpr size_t kMaxFds = 8;  // per frame, sent or taken

// The frame header for a body of `len` bytes.
void EncodeLength(uint32_t len, char out[4]);

// Sends every byte of iov[0..n) (advanced in place), `fds` with the first of them.
Status SendV(int sock, iovec* iov, size_t n, std::span<const int> fds, const char* what, Deadline d = kNoDeadline);

// Receives exactly n bytes into p. Descriptors that come with them fill the slots of `fds` that
// are -1, in order; any more are closed.
Status RecvExactly(int sock, char* p, size_t n, std::span<int> fds, const char* what, Deadline d = kNoDeadline);

// The length of the next frame; INVALID_ARGUMENT past `max_len` (its body left unread).
Status RecvLength(int sock, std::span<int> fds, uint32_t max_len, uint32_t* len, const char* what,
                  Deadline d = kNoDeadline);

// Reads a frame body of `len` bytes into *body through `read_exactly` (which fills n bytes or
// fails), a chunk at a time: memory follows the bytes that arrive, never what a length prefix
// claims.
Status ReadGrowing(uint32_t len, std::string* body, const std::function<Status(char*, size_t)>& read_exactly);

// Closes the descriptors of `fds` that are >= 0 and sets them to -1.
void CloseAll(std::span<int> fds);

}  // namespace granary::frames
