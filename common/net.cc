#include "common/net.h"

#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "common/units.h"

namespace granary {

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

}  // namespace granary
