#include "tests/testutil/proxy.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <string>

namespace granary::testing {
namespace {

void Reset(int fd) {
  linger l{1, 0};  // close with RST
  setsockopt(fd, SOL_SOCKET, SO_LINGER, &l, sizeof l);
  close(fd);
}

}  // namespace

FaultProxy::FaultProxy(int upstream_port) : upstream_port_(upstream_port) {
  listen_fd_ = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  bind(listen_fd_, reinterpret_cast<sockaddr*>(&addr), sizeof addr);
  listen(listen_fd_, 64);
  socklen_t len = sizeof addr;
  getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&addr), &len);
  port_ = ntohs(addr.sin_port);
  acceptor_ = std::thread([this] { AcceptLoop(); });
}

FaultProxy::~FaultProxy() {
  stop_ = true;
  shutdown(listen_fd_, SHUT_RDWR);
  close(listen_fd_);
  acceptor_.join();
  for (auto& t : relays_) t.join();
}

void FaultProxy::AcceptLoop() {
  for (;;) {
    pollfd p{listen_fd_, POLLIN, 0};
    if (poll(&p, 1, 100) <= 0) {
      if (stop_) return;
      continue;
    }
    int c = accept(listen_fd_, nullptr, nullptr);
    if (c < 0) {
      if (stop_) return;
      continue;
    }
    ++connections_;
    if (mode_ == kReset) {
      Reset(c);
      continue;
    }
    if (mode_ == kSlowDown) {
      relays_.emplace_back([this, c] { SlowDown(c); });
      continue;
    }
    relays_.emplace_back([this, c] { Relay(c); });
  }
}

void FaultProxy::Relay(int client) {
  int up = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(static_cast<uint16_t>(upstream_port_));
  if (connect(up, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    Reset(client);
    close(up);
    return;
  }
  char buf[65536];
  pollfd p[2] = {{client, POLLIN, 0}, {up, POLLIN, 0}};
  while (!stop_) {
    if (poll(p, 2, 100) < 0) break;
    if (mode_ != kPass) break;  // cut live connections too, mid-response if need be
    bool done = false;
    for (int i = 0; i < 2 && !done; ++i) {
      if (!(p[i].revents & (POLLIN | POLLHUP | POLLERR))) continue;
      ssize_t n = read(p[i].fd, buf, sizeof buf);
      if (n <= 0) {
        done = true;
        break;
      }
      int to = p[1 - i].fd;
      for (ssize_t off = 0; off < n;) {
        ssize_t w = write(to, buf + off, static_cast<size_t>(n - off));
        if (w <= 0) {
          done = true;
          break;
        }
        off += w;
      }
    }
    if (done) break;
  }
  Reset(client);
  close(up);
}

void FaultProxy::SlowDown(int client) {
  // Read the request's head (a GET or HEAD has no body), then answer 503 and close.
  std::string head;
  char buf[4096];
  while (!stop_ && head.find("\r\n\r\n") == std::string::npos && head.size() < (1 << 16)) {
    pollfd p{client, POLLIN, 0};
    if (poll(&p, 1, 100) < 0) break;
    if (!(p.revents & (POLLIN | POLLHUP | POLLERR))) continue;
    ssize_t n = read(client, buf, sizeof buf);
    if (n <= 0) break;
    head.append(buf, static_cast<size_t>(n));
  }
  if (head.find("\r\n\r\n") != std::string::npos) {
    const std::string body =
        "<?xml version=\"1.0\" encoding=\"UTF-8\"?><Error><Code>SlowDown</Code>"
        "<Message>Please reduce your request rate.</Message></Error>";
    const std::string resp = "HTTP/1.1 503 Slow Down\r\nContent-Type: application/xml\r\nContent-Length: " +
                             std::to_string(body.size()) + "\r\nConnection: close\r\n\r\n" + body;
    if (write(client, resp.data(), resp.size()) == static_cast<ssize_t>(resp.size())) ++slowdowns_;
  }
  close(client);
}

}  // namespace granary::testing
