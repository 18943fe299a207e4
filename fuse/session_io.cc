#include "fuse/session_io.h"

#include <fcntl.h>
#include <sys/uio.h>
#include <unistd.h>

#include <cerrno>
#include <mutex>

#include "fuse/kernel_abi.h"

namespace granary::fuse {
namespace {

// What this thread last read from /dev/fuse, and the backing id its open handler asked for.
thread_local uint32_t t_opcode = 0;
thread_local uint64_t t_unique = 0;
thread_local int t_backing = 0;

// The hooks learn their SessionIo from the session's descriptor (their only argument that names
// the session; userdata is the filesystem's).
constexpr int kMaxFd = 65536;
std::atomic<SessionIo*> g_by_fd[kMaxFd];

SessionIo* Of(int fd) { return fd >= 0 && fd < kMaxFd ? g_by_fd[fd].load(std::memory_order_acquire) : nullptr; }

}  // namespace

StatusOr<std::unique_ptr<SessionIo>> SessionIo::Install(fuse_session* se, bool want_passthrough) {
  int fd = fuse_session_fd(se);
  if (fd < 0 || fd >= kMaxFd) return InternalError("the FUSE session has no usable descriptor");
  std::unique_ptr<SessionIo> io(new SessionIo(fd, want_passthrough));
  g_by_fd[fd].store(io.get(), std::memory_order_release);
  fuse_custom_io hooks{};
  hooks.read = &SessionIo::Read;
  hooks.writev = &SessionIo::Writev;
  hooks.splice_send = &SessionIo::SpliceSend;
  if (int rc = fuse_session_custom_io(se, &hooks, fd); rc != 0) {
    g_by_fd[fd].store(nullptr);
    return ErrnoError(-rc, "fuse_session_custom_io");
  }
  return io;
}

SessionIo::~SessionIo() {
  if (Of(fd_) == this) g_by_fd[fd_].store(nullptr);
}

ssize_t SessionIo::Read(int fd, void* buf, size_t len, void*) {
  // libfuse 3.14 reads a hook's result as a syscall's: -1 with errno set.
  ssize_t n = read(fd, buf, len);
  if (n < 0) return n;
  t_opcode = 0;
  if (static_cast<size_t>(n) < sizeof(fuse_in_header)) return n;
  const auto* h = static_cast<const fuse_in_header*>(buf);
  t_opcode = h->opcode;
  t_unique = h->unique;
  if (h->opcode == FUSE_INIT && static_cast<size_t>(n) >= sizeof(fuse_in_header) + 16) {
    const auto* in = reinterpret_cast<const fuse_init_in*>(h + 1);
    uint64_t flags = in->flags;
    if ((flags & FUSE_INIT_EXT) && static_cast<size_t>(n) >= sizeof(fuse_in_header) + sizeof(fuse_init_in)) {
      flags |= static_cast<uint64_t>(in->flags2) << 32;
    }
    if (SessionIo* io = Of(fd)) io->offered_ = (flags & kabi::kInitPassthrough) != 0;
  }
  return n;
}

ssize_t SessionIo::Writev(int fd, struct iovec* iov, int count, void*) {
  if (count >= 2 && iov[0].iov_len == sizeof(fuse_out_header)) {
    const auto* out = static_cast<const fuse_out_header*>(iov[0].iov_base);
    if (out->unique == t_unique && out->unique != 0 && out->error == 0) {
      if (t_opcode == FUSE_INIT && iov[1].iov_len >= offsetof(fuse_init_out, unused) + 4) {
        SessionIo* io = Of(fd);
        auto* init = static_cast<fuse_init_out*>(iov[1].iov_base);
        if (io != nullptr && io->want_ && io->offered_ && (init->flags & FUSE_INIT_EXT) &&
            !(init->flags & FUSE_WRITEBACK_CACHE)) {
          init->flags2 |= static_cast<uint32_t>(kabi::kInitPassthrough >> 32);
          init->unused[0] = kabi::kMaxStackDepth;
          io->negotiated_ = true;
        }
      } else if (t_opcode == FUSE_OPEN && t_backing > 0 && iov[1].iov_len == sizeof(fuse_open_out)) {
        auto* open = static_cast<fuse_open_out*>(iov[1].iov_base);
        open->open_flags |= kabi::kOpenPassthrough;
        open->padding = static_cast<uint32_t>(t_backing);
      }
    }
  }
  t_backing = 0;
  return writev(fd, iov, count);
}

ssize_t SessionIo::SpliceSend(int fdin, off_t* offin, int fdout, off_t* offout, size_t len, unsigned flags, void*) {
  return splice(fdin, offin, fdout, offout, len, flags);
}

void SessionIo::MarkOpenReply(int backing_id) { t_backing = backing_id; }

StatusOr<int> SessionIo::OpenBacking(int fd) {
  if (!negotiated_) return FailedPreconditionError("the FUSE connection did not negotiate passthrough");
  kabi::BackingMap map{};
  map.fd = fd;
  int id = ioctl(fd_, kabi::kIocBackingOpen, &map);
  if (id < 0) {
    int err = errno;
    if (err == EPERM) {
      return PermissionDeniedError("FUSE passthrough needs CAP_SYS_ADMIN (FUSE_DEV_IOC_BACKING_OPEN: EPERM)");
    }
    return ErrnoError(err, "FUSE_DEV_IOC_BACKING_OPEN");
  }
  if (id == 0) return InternalError("FUSE_DEV_IOC_BACKING_OPEN returned backing id 0");
  return id;
}

void SessionIo::CloseBacking(int id) {
  uint32_t v = static_cast<uint32_t>(id);
  ioctl(fd_, kabi::kIocBackingClose, &v);
}

}  // namespace granary::fuse
