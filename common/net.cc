#include "common/net.h"

#include <netdb.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "common/units.h"

namespace granary {

StatusOr<int> ListenUnix(const std::string& path, int backlog, const std::string& what) {
  ASSIGN_OR_RETURN(sockaddr_un addr, UnixAddress(path, what));
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return ErrnoError(errno, what + ": socket");
  // 0600 before listen(): until then nobody can connect (the umask is left alone: it is the whole
  // process's, and other threads may be making directories).
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 || chmod(path.c_str(), 0600) != 0 ||
      listen(fd, backlog) != 0) {
    int err = errno;
    close(fd);
    return ErrnoError(err, what + ": cannot listen on " + path);
  }
  return fd;
}

bool PeerIsRootOrSelf(int fd, uint32_t* uid) {
  ucred cred{};
  socklen_t len = sizeof(cred);
  if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0) {
    *uid = static_cast<uint32_t>(-1);
    return false;
  }
  *uid = cred.uid;
  return cred.uid == 0 || cred.uid == geteuid();
}

StatusOr<HostPort> ParseHostPort(const std::string& text) {
  auto bad = [&](const std::string& why) {
    return InvalidArgumentError("'" + text + "' is not a host:port address (" + why + ")");
  };
  size_t colon = text.rfind(':');
  if (colon == std::string::npos) return bad("no port");
  HostPort hp;
  hp.host = text.substr(0, colon);
  if (hp.host.size() >= 2 && hp.host.front() == '[' && hp.host.back() == ']') {
    hp.host = hp.host.substr(1, hp.host.size() - 2);
  }
  if (hp.host.empty()) return bad("no host");
  auto port = ParseUint(text.substr(colon + 1));
  if (!port.ok() || *port > 65535) return bad("port must be 0 to 65535");
  hp.port = static_cast<uint16_t>(*port);
  return hp;
}

Status CheckCanListen(const std::string& address) {
  auto hp = ParseHostPort(address);
  if (!hp.ok()) return hp.status();
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE;
  addrinfo* res = nullptr;
  std::string port = std::to_string(hp->port);
  int rc = getaddrinfo(hp->host.c_str(), port.c_str(), &hints, &res);
  if (rc != 0) return InvalidArgumentError("cannot resolve " + address + ": " + gai_strerror(rc));
  Status result = Status::OK();
  int fd = socket(res->ai_family, res->ai_socktype | SOCK_CLOEXEC, res->ai_protocol);
  if (fd < 0) {
    result = ErrnoError(errno, "socket for " + address);
  } else {
    int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (bind(fd, res->ai_addr, res->ai_addrlen) != 0) {
      int err = errno;
      if (err == EADDRINUSE) {
        result = AlreadyExistsError("cannot listen on " + address +
                                    ": address already in use (stop the other process or pick another port)");
      } else {
        result = ErrnoError(err, "cannot listen on " + address);
      }
    }
    close(fd);
  }
  freeaddrinfo(res);
  return result;
}

std::string HostName() {
  char buf[256] = {};
  if (gethostname(buf, sizeof buf - 1) != 0) return "localhost";
  return buf;
}

StatusOr<sockaddr_un> UnixAddress(const std::string& path, const std::string& what) {
  sockaddr_un a{};
  if (path.size() >= sizeof(a.sun_path)) {
    return InvalidArgumentError(what + ": socket path " + path + " is longer than " +
                                std::to_string(sizeof(a.sun_path) - 1) + " bytes; use a shorter path");
  }
  a.sun_family = AF_UNIX;
  memcpy(a.sun_path, path.c_str(), path.size() + 1);
  return a;
}

StatusOr<int> ConnectUnix(const std::string& path, const std::string& what) {
  ASSIGN_OR_RETURN(sockaddr_un addr, UnixAddress(path, what));
  int s = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (s < 0) return ErrnoError(errno, what + ": socket");
  if (connect(s, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    int err = errno;
    close(s);
    if (err == ENOENT || err == ECONNREFUSED) {
      return UnavailableError("nobody listens on " + what + " " + path + " (" + strerror(err) + ")");
    }
    if (err == EACCES || err == EPERM) {
      return PermissionDeniedError("cannot connect to " + what + " " + path +
                                   ": only root, the user of the process serving it, or (the worker's socket) a member of "
                                   "worker.local_socket_group may");
    }
    return UnavailableError("cannot connect to " + what + " " + path + ": " + strerror(err));
  }
  return s;
}

AcceptedPeer AcceptPeer(int listen_fd, bool any_peer) {
  AcceptedPeer a;
  for (;;) {
    int c = accept4(listen_fd, nullptr, nullptr, SOCK_CLOEXEC);
    if (c < 0) {
      if (errno == EINTR || errno == ECONNABORTED) continue;
      a.error = errno;
      return a;
    }
    if (PeerIsRootOrSelf(c, &a.uid) || any_peer) {
      a.fd = c;
    } else {
      a.refused = true;
      close(c);
    }
    return a;
  }
}

}  // namespace granary
