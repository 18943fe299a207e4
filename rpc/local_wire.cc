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

#include "common/local_frames.h"
#include "common/net.h"

namespace granary {
namespace {

constexpr const char* kWhat = "the worker's local socket";

// A frame of this socket carries at most one descriptor: `fd` (-1: none).
Status SendAllV(int sock, iovec* iov, size_t n, int fd) {
  return frames::SendV(sock, iov, n, fd >= 0 ? std::span<const int>(&fd, 1) : std::span<const int>(), kWhat);
}

Status SendAll(int sock, const char* p, size_t n, int fd) {
  iovec iov{const_cast<char*>(p), n};
  return SendAllV(sock, &iov, 1, fd);
}

// Reads exactly n bytes; a descriptor that comes with them lands in *fd (when it is -1; any other
// is closed).
Status RecvAll(int sock, char* p, size_t n, int* fd) { return frames::RecvExactly(sock, p, n, {fd, 1}, kWhat); }

Status RecvLength(int sock, int* fd, uint32_t max_len, uint32_t* len) {
  return frames::RecvLength(sock, {fd, 1}, max_len, len, kWhat);
}

}  // namespace

Status SendFrame(int sock, const google::protobuf::MessageLite& m, int fd) {
  std::string buf(4, '\0');
  if (!m.AppendToString(&buf)) return InternalError("cannot serialize a local socket message");
  frames::EncodeLength(static_cast<uint32_t>(buf.size() - 4), buf.data());
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
  frames::EncodeLength(static_cast<uint32_t>(len), head.data());
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
    st = frames::ReadGrowing(len - static_cast<uint32_t>(body.size()), &rest,
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
  if (st.ok()) st = frames::ReadGrowing(len, &body, [&](char* p, size_t n) { return RecvAll(sock, p, n, fd); });
  if (st.ok() && !m->ParseFromString(body)) st = InvalidArgumentError("a malformed local socket message");
  if (!st.ok() && *fd >= 0) {
    close(*fd);
    *fd = -1;
  }
  return st;
}

StatusOr<int> ConnectUnix(const std::string& path) { return ConnectUnix(path, kWhat); }

}  // namespace granary
