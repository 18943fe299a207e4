#include "rpc/local_wire.h"

#include <errno.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <google/protobuf/io/coded_stream.h>
#include <google/protobuf/io/zero_copy_stream_impl_lite.h>
#include <google/protobuf/wire_format_lite.h>

#include <algorithm>
#include <cstring>

namespace granary {
namespace {

// Sends every byte of iov[0..n) (advanced in place), the descriptor with the first bytes.
Status SendAllV(int sock, iovec* iov, size_t n, int fd) {
  bool fd_sent = fd < 0;
  while (n > 0 && iov[0].iov_len == 0) ++iov, --n;
  while (n > 0) {
    msghdr msg{};
    msg.msg_iov = iov;
    msg.msg_iovlen = n;
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
    for (size_t left = static_cast<size_t>(w); n > 0 && (left > 0 || iov[0].iov_len == 0);) {
      size_t k = std::min(left, iov[0].iov_len);
      iov[0].iov_base = static_cast<char*>(iov[0].iov_base) + k;
      iov[0].iov_len -= k;
      left -= k;
      if (iov[0].iov_len == 0) ++iov, --n;
    }
  }
  return Status::OK();
}

Status SendAll(int sock, const char* p, size_t n, int fd) {
  iovec iov{const_cast<char*>(p), n};
  return SendAllV(sock, &iov, 1, fd);
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

// A frame's 4-byte little-endian length; INVALID_ARGUMENT past `max_len` (its body unread).
Status RecvLength(int sock, int* fd, uint32_t max_len, uint32_t* len) {
  unsigned char hdr[4];
  RETURN_IF_ERROR(RecvAll(sock, reinterpret_cast<char*>(hdr), 4, fd));
  *len = hdr[0] | (hdr[1] << 8) | (hdr[2] << 16) | (uint32_t{hdr[3]} << 24);
  if (*len > max_len) {
    return InvalidArgumentError("a local socket frame of " + std::to_string(*len) + " bytes (at most " +
                                std::to_string(max_len) + ")");
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

Status SendFrameWithBytes(int sock, const google::protobuf::MessageLite& m, int field, std::string_view bytes, int fd) {
  std::string head(4, '\0');
  if (!m.AppendToString(&head)) return InternalError("cannot serialize a local socket message");
  {
    google::protobuf::io::StringOutputStream raw(&head);
    google::protobuf::io::CodedOutputStream out(&raw);
    out.WriteTag(google::protobuf::internal::WireFormatLite::MakeTag(
        field, google::protobuf::internal::WireFormatLite::WIRETYPE_LENGTH_DELIMITED));
    out.WriteVarint64(bytes.size());
  }
  const uint64_t len = head.size() - 4 + bytes.size();
  if (len > kMaxLocalFrame) return InternalError("a local socket frame of " + std::to_string(len) + " bytes");
  for (int i = 0; i < 4; ++i) head[i] = static_cast<char>((len >> (8 * i)) & 0xff);
  iovec iov[2] = {{head.data(), head.size()}, {const_cast<char*>(bytes.data()), bytes.size()}};
  return SendAllV(sock, iov, 2, fd);
}

Status RecvFrameInto(int sock, google::protobuf::MessageLite* m, int* fd, int field, char* into, size_t into_len,
                     bool* landed, uint32_t max_len) {
  *fd = -1;
  *landed = false;
  uint32_t len = 0;
  Status st = RecvLength(sock, fd, max_len, &len);
  // The fields before the bytes are a few dozen bytes: the frame's head is read first and looked
  // through for the bytes field; found last and of the expected length, the rest lands in `into`.
  constexpr uint32_t kHead = 512;
  std::string body;
  if (st.ok()) {
    body.resize(std::min(len, kHead));
    st = RecvAll(sock, body.data(), body.size(), fd);
  }
  size_t tag_at = 0, bytes_at = 0;
  bool found = false;
  if (st.ok()) {
    google::protobuf::io::CodedInputStream in(reinterpret_cast<const uint8_t*>(body.data()), static_cast<int>(body.size()));
    for (;;) {
      tag_at = static_cast<size_t>(in.CurrentPosition());
      if (tag_at >= body.size()) break;
      uint32_t tag = in.ReadTag();
      if (tag == 0) break;  // malformed or cut at the head's end
      if (google::protobuf::internal::WireFormatLite::GetTagFieldNumber(tag) == field &&
          google::protobuf::internal::WireFormatLite::GetTagWireType(tag) ==
              google::protobuf::internal::WireFormatLite::WIRETYPE_LENGTH_DELIMITED) {
        uint64_t n = 0;
        if (!in.ReadVarint64(&n)) break;
        bytes_at = static_cast<size_t>(in.CurrentPosition());
        found = n == into_len && bytes_at + n == len;
        break;
      }
      if (!google::protobuf::internal::WireFormatLite::SkipField(&in, tag)) break;
    }
  }
  if (st.ok() && found) {
    const size_t already = body.size() - bytes_at;  // bytes of the field read with the head
    std::memcpy(into, body.data() + bytes_at, already);
    st = RecvAll(sock, into + already, into_len - already, fd);
    if (st.ok() && !m->ParseFromArray(body.data(), static_cast<int>(tag_at))) {
      st = InvalidArgumentError("a malformed local socket message");
    }
    if (st.ok()) *landed = true;
  } else if (st.ok()) {
    std::string rest;
    st = ReadGrowing(len - static_cast<uint32_t>(body.size()), &rest,
                     [&](char* p, size_t n) { return RecvAll(sock, p, n, fd); });
    body += rest;
    if (st.ok() && !m->ParseFromString(body)) st = InvalidArgumentError("a malformed local socket message");
  }
  if (!st.ok() && *fd >= 0) {
    close(*fd);
    *fd = -1;
  }
  return st;
}

Status RecvFrame(int sock, google::protobuf::MessageLite* m, int* fd, uint32_t max_len) {
  *fd = -1;
  uint32_t len = 0;
  Status st = RecvLength(sock, fd, max_len, &len);
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
