#include "rpc/local_wire.h"

#include <errno.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>

namespace granary {
namespace {

Status SendAll(int sock, const char* p, size_t n, int fd) {
  bool fd_sent = fd < 0;
  while (n > 0) {
    iovec iov{const_cast<char*>(p), n};
    msghdr msg{};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))];
    if (!fd_sent) {
      msg.msg_control = control;
      msg.msg_controllen = sizeof(control);
      cmsghdr* c = CMSG_FIRSTHDR(&msg);
      c->cmsg_level = SOL_SOCKET;
      c->cmsg_type = SCM_RIGHTS;
      c->cmsg_len = CMSG_LEN(sizeof(int));
      memcpy(CMSG_DATA(c), &fd, sizeof(int));
    }
    ssize_t w = sendmsg(sock, &msg, MSG_NOSIGNAL);
    if (w < 0) {
      if (errno == EINTR) continue;
      return UnavailableError(std::string("local socket send: ") + strerror(errno));
    }
    fd_sent = true;
    p += w;
    n -= static_cast<size_t>(w);
  }
  return Status::OK();
}

// Reads exactly n bytes; picks up a descriptor from any part of them.
Status RecvAll(int sock, char* p, size_t n, int* fd) {
  while (n > 0) {
    iovec iov{p, n};
    msghdr msg{};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))];
    msg.msg_control = control;
    msg.msg_controllen = sizeof(control);
    ssize_t r = recvmsg(sock, &msg, MSG_CMSG_CLOEXEC);
    if (r < 0) {
      if (errno == EINTR) continue;
      return UnavailableError(std::string("local socket receive: ") + strerror(errno));
    }
    if (r == 0) return UnavailableError("the worker closed the local socket");
    for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c != nullptr; c = CMSG_NXTHDR(&msg, c)) {
      if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS) {
        int got;
        memcpy(&got, CMSG_DATA(c), sizeof(int));
        if (*fd >= 0) close(*fd);
        *fd = got;
      }
    }
    p += r;
    n -= static_cast<size_t>(r);
  }
  return Status::OK();
}

}  // namespace

Status SendFrame(int sock, const google::protobuf::MessageLite& m, int fd) {
  std::string buf(4, '\0');
  if (!m.AppendToString(&buf)) return InternalError("cannot serialize a local socket message");
  uint32_t len = static_cast<uint32_t>(buf.size() - 4);
  for (int i = 0; i < 4; ++i) buf[i] = static_cast<char>((len >> (8 * i)) & 0xff);
  return SendAll(sock, buf.data(), buf.size(), fd);
}

Status RecvFrame(int sock, google::protobuf::MessageLite* m, int* fd, uint32_t max_len) {
  *fd = -1;
  unsigned char hdr[4];
  Status st = RecvAll(sock, reinterpret_cast<char*>(hdr), 4, fd);
  uint32_t len = hdr[0] | (hdr[1] << 8) | (hdr[2] << 16) | (uint32_t{hdr[3]} << 24);
  if (st.ok() && len > max_len) {
    st = InvalidArgumentError("a local socket frame of " + std::to_string(len) + " bytes (at most " +
                              std::to_string(max_len) + ")");
  }
  std::string body;
  if (st.ok()) st = ReadGrowing(len, &body, [&](char* p, size_t n) { return RecvAll(sock, p, n, fd); });
  if (st.ok() && !m->ParseFromString(body)) st = InvalidArgumentError("a malformed local socket message");
  if (!st.ok() && *fd >= 0) {
    close(*fd);
    *fd = -1;
  }
  return st;
}

Status ReadGrowing(uint32_t len, std::string* body, const std::function<Status(char*, size_t)>& read_exactly) {
  constexpr size_t kChunk = 1 << 20;
  body->clear();
  while (body->size() < len) {
    size_t had = body->size();
    size_t n = std::min<size_t>(kChunk, len - had);
    body->resize(had + n);
    RETURN_IF_ERROR(read_exactly(body->data() + had, n));
  }
  return Status::OK();
}

StatusOr<int> ConnectUnix(const std::string& path) {
  sockaddr_un addr{};
  if (path.size() >= sizeof(addr.sun_path)) return InvalidArgumentError("socket path too long: " + path);
  addr.sun_family = AF_UNIX;
  memcpy(addr.sun_path, path.c_str(), path.size() + 1);
  int s = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (s < 0) return UnavailableError(std::string("socket: ") + strerror(errno));
  if (connect(s, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    int err = errno;
    close(s);
    return UnavailableError("cannot connect to the worker's local socket " + path + ": " + strerror(err));
  }
  return s;
}

}  // namespace granary
