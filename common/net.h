// Network addresses: "host:port" parsing and a bind check that turns "port in use" into a clear
// error before a gRPC server would fail with a vague one. Thread-safe.
#pragma once

#include <sys/un.h>

#include <cstdint>
#include <string>

#include "common/status.h"

namespace granary {

struct HostPort {
  std::string host;
  uint16_t port = 0;
};

// "127.0.0.1:80", "[::1]:80", "node-1:29999".
StatusOr<HostPort> ParseHostPort(const std::string& text);

// Tries to bind a TCP socket to `address` (then closes it). Fails with ALREADY_EXISTS naming the
// address when it is in use, INVALID_ARGUMENT when it cannot be resolved.
Status CheckCanListen(const std::string& address);

// This machine's host name.
std::string HostName();

// A unix stream socket listening on `path` (close-on-exec), its file 0600 before it listens;
// `what` names it in errors ("worker.local_socket: ..."). The caller has removed a stale file.
StatusOr<int> ListenUnix(const std::string& path, int backlog, const std::string& what);
// Whether the process at the other end of unix socket `fd` runs as root or as this process's own
// user (SO_PEERCRED); *uid gets its uid.
bool PeerIsRootOrSelf(int fd, uint32_t* uid);
// The address of unix socket `path`; INVALID_ARGUMENT naming `what` when the path is too long.
StatusOr<sockaddr_un> UnixAddress(const std::string& path, const std::string& what);
// A unix stream socket connected to `path` (close-on-exec); `what` names it in errors. UNAVAILABLE
// when nobody listens there (no socket file, or refused), PERMISSION_DENIED when this user may
// not connect to it, INVALID_ARGUMENT for a path too long. The one connect of every local socket.
StatusOr<int> ConnectUnix(const std::string& path, const std::string& what);
// The next connection on the unix socket `listen_fd`, checked: only a process of root or of this
// process's user is let in (`fd`; with `any_peer`, every process that could connect: the socket
// file's mode decided); any other is closed at once (`refused`, with its `uid`, for the
// caller to say). `fd` -1 and not refused: accept failed (`error`; EINTR and ECONNABORTED are
// retried), the listening socket was shut down or broke. The one accept of every local socket.
struct AcceptedPeer {
  int fd = -1;
  bool refused = false;
  uint32_t uid = 0;
  int error = 0;
};
AcceptedPeer AcceptPeer(int listen_fd, bool any_peer = false);

}  // namespace granary
