#include "common/local_frames.h"

#include <fcntl.h>

#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

namespace granary::frames {
namespace {

// Waits until `sock` is ready for `events` or the deadline passes (OK: go on and try).
Status WaitReady(int sock, short events, const char* what, Deadline d) {
  for (;;) {
    int timeout = -1;
    if (d != kNoDeadline) {
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(d - std::chrono::steady_clock::now());
      if (left.count() <= 0) return DeadlineExceededError(std::string("no answer on ") + what + " in time");
      timeout = static_cast<int>(std::min<int64_t>(left.count(), 1000));
    }
    pollfd p{sock, events, 0};
    int rc = poll(&p, 1, timeout);
    if (rc > 0) return Status::OK();
    if (rc < 0 && errno != EINTR) return ErrnoError(errno, std::string("poll on ") + what);
  }
}

// EAGAIN from a blocking call on a blocking socket: its SO_RCVTIMEO / SO_SNDTIMEO ran out (a
// non-blocking socket's EAGAIN only means: wait).
bool TimedOut(int sock, Deadline d) {
  if (d != kNoDeadline) return false;
  const int flags = fcntl(sock, F_GETFL);
  return flags >= 0 && (flags & O_NONBLOCK) == 0;
}

}  // namespace

void EncodeLength(uint32_t len, char out[4]) {
  for (int i = 0; i < 4; ++i) out[i] = static_cast<char>((len >> (8 * i)) & 0xff);
}

void CloseAll(std::span<int> fds) {
  for (int& f : fds) {
    if (f >= 0) close(f);
    f = -1;
  }
}

Status SendV(int sock, iovec* iov, size_t n, std::span<const int> fds, const char* what, Deadline d) {
  if (fds.size() > kMaxFds) return InternalError("more descriptors than a frame carries");
  bool fds_sent = fds.empty();
  while (n > 0 && iov[0].iov_len == 0) ++iov, --n;
  while (n > 0) {
    if (d != kNoDeadline) RETURN_IF_ERROR(WaitReady(sock, POLLOUT, what, d));
    msghdr msg{};
    msg.msg_iov = iov;
    msg.msg_iovlen = n;
    alignas(cmsghdr) char control[CMSG_SPACE(kMaxFds * sizeof(int))] = {};
    if (!fds_sent) {
      msg.msg_control = control;
      msg.msg_controllen = CMSG_SPACE(fds.size() * sizeof(int));
      cmsghdr* c = CMSG_FIRSTHDR(&msg);
      c->cmsg_level = SOL_SOCKET;
      c->cmsg_type = SCM_RIGHTS;
      c->cmsg_len = CMSG_LEN(fds.size() * sizeof(int));
      std::memcpy(CMSG_DATA(c), fds.data(), fds.size() * sizeof(int));
    }
    ssize_t w = sendmsg(sock, &msg, MSG_NOSIGNAL | (d != kNoDeadline ? MSG_DONTWAIT : 0));
    if (w < 0) {
      if (errno == EINTR) continue;
      // A non-blocking socket that is full (or a readiness poll raced): wait for room, not spin.
      if (errno == EAGAIN) {
        if (TimedOut(sock, d)) return UnavailableError(std::string("send on ") + what + ": timed out (SO_SNDTIMEO)");
        RETURN_IF_ERROR(WaitReady(sock, POLLOUT, what, d));
        continue;
      }
      return UnavailableError(std::string("send on ") + what + ": " + strerror(errno));
    }
    fds_sent = true;
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

Status RecvExactly(int sock, char* p, size_t n, std::span<int> fds, const char* what, Deadline d) {
  while (n > 0) {
    if (d != kNoDeadline) RETURN_IF_ERROR(WaitReady(sock, POLLIN, what, d));
    iovec iov{p, n};
    msghdr msg{};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    alignas(cmsghdr) char control[CMSG_SPACE(kMaxFds * sizeof(int))];
    msg.msg_control = control;
    msg.msg_controllen = sizeof(control);
    ssize_t r = recvmsg(sock, &msg, MSG_CMSG_CLOEXEC | (d != kNoDeadline ? MSG_DONTWAIT : 0));
    if (r < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN) {
        if (TimedOut(sock, d)) return UnavailableError(std::string("receive on ") + what + ": timed out (SO_RCVTIMEO)");
        RETURN_IF_ERROR(WaitReady(sock, POLLIN, what, d));
        continue;
      }
      return UnavailableError(std::string("receive on ") + what + ": " + strerror(errno));
    }
    // Descriptors first: even with no bytes, what came is ours to place or close.
    for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c != nullptr; c = CMSG_NXTHDR(&msg, c)) {
      if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
      const size_t count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
      for (size_t i = 0; i < count; ++i) {
        int got = -1;
        std::memcpy(&got, CMSG_DATA(c) + i * sizeof(int), sizeof(int));
        auto slot = std::find(fds.begin(), fds.end(), -1);
        if (slot != fds.end()) {
          *slot = got;
        } else {
          close(got);  // more than this receiver takes: not ours to keep
        }
      }
    }
    if (r == 0) return UnavailableError(std::string("the other side closed ") + what);
    p += r;
    n -= static_cast<size_t>(r);
  }
  return Status::OK();
}

Status RecvLength(int sock, std::span<int> fds, uint32_t max_len, uint32_t* len, const char* what, Deadline d) {
  unsigned char hdr[4];
  RETURN_IF_ERROR(RecvExactly(sock, reinterpret_cast<char*>(hdr), 4, fds, what, d));
  *len = hdr[0] | (hdr[1] << 8) | (hdr[2] << 16) | (uint32_t{hdr[3]} << 24);
  if (*len > max_len) {
    return InvalidArgumentError(std::string("a frame of ") + std::to_string(*len) + " bytes on " + what +
                                " (at most " + std::to_string(max_len) + ")");
  }
  return Status::OK();
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

}  // namespace granary::frames
