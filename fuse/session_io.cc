#include "fuse/session_io.h"

#include <fcntl.h>
#include <pthread.h>
#include <poll.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "fuse/kernel_abi.h"
#include "fuse/uring.h"

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

// Each SessionIo's number, so that a thread's epoll instance is never reused for another session
// (a new one may get the same address).
std::atomic<uint64_t> g_next_generation{1};

// This thread's epoll instance for waiting on a session (WaitReadable): the session's descriptor
// registered exclusive, its wake eventfd not.
struct ThreadEpoll {
  uint64_t generation = 0;
  int fd = -1;
  ~ThreadEpoll() {
    if (fd >= 0) close(fd);
  }
};
thread_local ThreadEpoll t_epoll;

}  // namespace

// The request this thread read and has not yet come back for. libfuse's loop ends a worker
// thread once it has answered and more than the idle limit are waiting, so a thread may never
// read again: its request counts as answered when it reads again or when it exits.
struct SessionIo::Holding {
  SessionIo* io = nullptr;
  void Take(SessionIo* s) {
    io = s;
    s->busy_.fetch_add(1);
  }
  void Return() {
    SessionIo* s = io;
    if (s == nullptr) return;
    io = nullptr;
    s->busy_.fetch_sub(1);
    if (s->stopping_) {
      { MutexLock lock(&s->mu_); }
      s->cv_.notify_all();
    }
  }
  ~Holding() { Return(); }
};
thread_local SessionIo::Holding SessionIo::t_holding;

StatusOr<std::unique_ptr<SessionIo>> SessionIo::Install(fuse_session* se, int fd, bool want_passthrough,
                                                        std::string replay_init) {
  if (fd < 0 || fd >= kMaxFd) return InternalError("the FUSE session has no usable descriptor");
  std::unique_ptr<SessionIo> io(new SessionIo(fd, want_passthrough));
  io->se_ = se;
  io->wake_fd_ = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (io->wake_fd_ < 0) return ErrnoError(errno, "eventfd");
  // Non-blocking: a reader that finds nothing goes back to poll(), where Drain can wake it.
  int flags = fcntl(fd, F_GETFL);
  if (flags < 0 || fcntl(fd, F_SETFL, flags | O_NONBLOCK) != 0) return ErrnoError(errno, "fcntl O_NONBLOCK on /dev/fuse");
  if (!replay_init.empty()) {
    if (replay_init.size() < sizeof(fuse_in_header)) return InvalidArgumentError("the handed-over INIT is truncated");
    const auto* h = reinterpret_cast<const fuse_in_header*>(replay_init.data());
    if (h->opcode != FUSE_INIT) return InvalidArgumentError("the handed-over INIT is not an INIT request");
    MutexLock lock(&io->mu_);  // not shared yet; taken for the analysis, at no cost
    io->replay_unique_ = h->unique;
    io->init_pending_ = true;
    io->replay_ = std::move(replay_init);
  }
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
  if (wake_fd_ >= 0) close(wake_fd_);
}

std::string SessionIo::init_request() const {
  MutexLock lock(&mu_);
  return init_answered_ ? init_ : "";
}

void SessionIo::NoteInit(const void* buf, size_t n) {
  const auto* h = static_cast<const fuse_in_header*>(buf);
  if (n >= sizeof(fuse_in_header) + 16) {
    const auto* in = reinterpret_cast<const fuse_init_in*>(h + 1);
    uint64_t flags = in->flags;
    if ((flags & FUSE_INIT_EXT) && n >= sizeof(fuse_in_header) + sizeof(fuse_init_in)) {
      flags |= static_cast<uint64_t>(in->flags2) << 32;
    }
    offered_ = (flags & kabi::kInitPassthrough) != 0;
    uring_offered_ = (flags & kabi::kInitOverIoUring) != 0;
  }
  MutexLock lock(&mu_);
  init_.assign(static_cast<const char*>(buf), n);
}

ssize_t SessionIo::DoRead(void* buf, size_t len) {
  // Cancellation off in here: libfuse cancels its threads when its loop ends, and a thread
  // cancelled inside a C++ wait is not safe. Instead every wait here wakes at least once a second
  // and leaves when the session has exited.
  struct NoCancel {
    int old = 0;
    NoCancel() { pthread_setcancelstate(PTHREAD_CANCEL_DISABLE, &old); }
    ~NoCancel() { pthread_setcancelstate(old, nullptr); }
  } no_cancel;
  auto poke = [this] {
    { MutexLock lock(&mu_); }
    cv_.notify_all();
  };
  // A request this thread read before has been answered: it is back.
  t_holding.Return();
  bool replayed = false;
  size_t replay_n = 0;
  {
    MutexLock lock(&mu_);
    if (!replay_.empty()) {  // a handed-over connection: its INIT first
      replayed = true;
      replay_n = std::min(len, replay_.size());
      std::memcpy(buf, replay_.data(), replay_n);
      replay_.clear();
    } else {
      // Nothing reaches libfuse before it has processed the replayed INIT.
      while (init_pending_ && !stopping_ && !fuse_session_exited(se_)) lock.WaitFor(&cv_, std::chrono::seconds(1));
    }
  }
  if (replayed) {
    t_holding.Take(this);
    return static_cast<ssize_t>(replay_n);
  }
  for (;;) {
    in_read_.fetch_add(1);
    if (stopping_ || fuse_session_exited(se_)) {
      in_read_.fetch_sub(1);
      MutexLock lock(&mu_);
      cv_.notify_all();
      while (!released_ && !fuse_session_exited(se_)) lock.WaitFor(&cv_, std::chrono::seconds(1));
      errno = EINTR;  // libfuse sees its session exited and ends this thread's loop
      return -1;
    }
    ssize_t n = read(fd_, buf, len);
    int err = errno;
    if (n > 0) t_holding.Take(this);
    in_read_.fetch_sub(1);
    if (n >= 0) return n;
    if (err == EAGAIN || err == EINTR) {
      if (stopping_) poke();
      WaitReadable();
      continue;
    }
    errno = err;
    return -1;
  }
}

uint64_t SessionIo::NextGeneration() { return g_next_generation.fetch_add(1); }

void SessionIo::WaitReadable() {
  // A request wakes one waiting thread, not all: the session's descriptor is in each thread's own
  // epoll instance with EPOLLEXCLUSIVE. With poll(2) on the shared descriptor every idle thread of
  // libfuse's loop woke for every request and all but one found nothing to read — on 2 cores, a
  // context switch per idle thread per request. The wake eventfd is not exclusive: Drain wakes all.
  if (t_epoll.generation != generation_) {
    if (t_epoll.fd >= 0) close(t_epoll.fd);
    t_epoll.fd = epoll_create1(EPOLL_CLOEXEC);
    t_epoll.generation = generation_;
    epoll_event dev{};
    dev.events = EPOLLIN | EPOLLEXCLUSIVE;
    dev.data.fd = fd_;
    epoll_event wake{};
    wake.events = EPOLLIN;
    wake.data.fd = wake_fd_;
    if (t_epoll.fd >= 0 && (epoll_ctl(t_epoll.fd, EPOLL_CTL_ADD, fd_, &dev) != 0 ||
                            epoll_ctl(t_epoll.fd, EPOLL_CTL_ADD, wake_fd_, &wake) != 0)) {
      close(t_epoll.fd);
      t_epoll.fd = -1;
    }
  }
  if (t_epoll.fd >= 0) {
    epoll_event ev[2];
    epoll_wait(t_epoll.fd, ev, 2, 1000);
    return;
  }
  pollfd p[2] = {{fd_, POLLIN, 0}, {wake_fd_, POLLIN, 0}};  // no epoll instance: every thread wakes
  poll(p, 2, 1000);
}

void SessionIo::Drain(fuse_session* se) {
  MutexLock lock(&mu_);
  stopping_ = true;
  uint64_t one = 1;
  (void)!write(wake_fd_, &one, sizeof one);
  cv_.notify_all();
  while (in_read_.load() != 0 || busy_.load() != 0) lock.Wait(&cv_);
  fuse_session_exit(se);
  released_ = true;
  cv_.notify_all();
}

void SessionIo::Resume() {
  MutexLock lock(&mu_);
  uint64_t v;
  (void)!read(wake_fd_, &v, sizeof v);
  stopping_ = false;
  released_ = false;
}

Status SessionIo::NotifyResend() {
  fuse_out_header h{};
  h.len = sizeof h;
  h.error = kabi::kNotifyResend;
  h.unique = 0;
  if (write(fd_, &h, sizeof h) != static_cast<ssize_t>(sizeof h)) {
    if (errno == EINVAL) return UnimplementedError("the kernel does not know FUSE_NOTIFY_RESEND (Linux < 6.9)");
    return ErrnoError(errno, "FUSE_NOTIFY_RESEND");
  }
  return Status::OK();
}

ssize_t SessionIo::Read(int fd, void* buf, size_t len, void*) {
  // libfuse 3.14 reads a hook's result as a syscall's: -1 with errno set.
  SessionIo* io = Of(fd);
  ssize_t n = io != nullptr ? io->DoRead(buf, len) : read(fd, buf, len);
  if (n < 0) return n;
  t_opcode = 0;
  if (static_cast<size_t>(n) < sizeof(fuse_in_header)) return n;
  const auto* h = static_cast<const fuse_in_header*>(buf);
  t_opcode = h->opcode;
  t_unique = h->unique;
  if (h->opcode == FUSE_INIT && io != nullptr) io->NoteInit(buf, static_cast<size_t>(n));
  return n;
}

bool SessionIo::WaitInitReplayed(std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  MutexLock lock(&mu_);
  while (init_pending_ && std::chrono::steady_clock::now() < deadline) lock.WaitFor(&cv_, std::chrono::milliseconds(100));
  return !init_pending_;
}

bool SessionIo::WaitInitAnswered(std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  MutexLock lock(&mu_);
  while (!init_answered_ && std::chrono::steady_clock::now() < deadline) lock.WaitFor(&cv_, std::chrono::milliseconds(100));
  return init_answered_;
}

void SessionIo::NoteRequest(const fuse_in_header* h) {
  t_opcode = h->opcode;
  t_unique = h->unique;
}

ssize_t SessionIo::Writev(int fd, struct iovec* iov, int count, void*) {
  SessionIo* io = Of(fd);
  size_t uring_payload = 0;  // the INIT reply asks for io_uring: start the queues once it is written
  if (count >= 1 && iov[0].iov_len == sizeof(fuse_out_header) && io != nullptr && t_opcode == FUSE_INIT) {
    const auto* out = static_cast<const fuse_out_header*>(iov[0].iov_base);
    bool swallow = false;
    {
      MutexLock lock(&io->mu_);
      if (io->init_pending_ && out->unique == io->replay_unique_) {
        // The replayed INIT's reply: the kernel answered INIT with the predecessor's long ago.
        io->init_pending_ = false;
        io->init_answered_ = true;
        io->cv_.notify_all();
        swallow = true;
      }
    }
    if (swallow) {
      t_backing = 0;
      ssize_t total = 0;
      for (int i = 0; i < count; ++i) total += static_cast<ssize_t>(iov[i].iov_len);
      return total;
    }
  }
  if (count >= 2 && iov[0].iov_len == sizeof(fuse_out_header)) {
    const auto* out = static_cast<const fuse_out_header*>(iov[0].iov_base);
    if (out->unique == t_unique && out->unique != 0 && out->error == 0) {
      if (t_opcode == FUSE_INIT && iov[1].iov_len >= offsetof(fuse_init_out, unused) + 4) {
        auto* init = static_cast<fuse_init_out*>(iov[1].iov_base);
        if (io != nullptr && io->want_ && io->offered_ && (init->flags & FUSE_INIT_EXT) &&
            !(init->flags & FUSE_WRITEBACK_CACHE)) {
          init->flags2 |= static_cast<uint32_t>(kabi::kInitPassthrough >> 32);
          init->unused[0] = kabi::kMaxStackDepth;
          io->negotiated_ = true;
        }
        if (io != nullptr && io->uring_start_ && io->uring_offered_ && (init->flags & FUSE_INIT_EXT)) {
          init->flags2 |= static_cast<uint32_t>(kabi::kInitOverIoUring >> 32);
          // The kernel's entries carry max(8 KiB, max_write, max_pages pages).
          const size_t pages = (init->flags & FUSE_MAX_PAGES) ? init->max_pages : 32;
          const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
          uring_payload = std::max<size_t>({8192, init->max_write, pages * page});
        }
      } else if (t_opcode == FUSE_OPEN && t_backing > 0 && iov[1].iov_len == sizeof(fuse_open_out)) {
        auto* open = static_cast<fuse_open_out*>(iov[1].iov_base);
        open->open_flags |= kabi::kOpenPassthrough;
        open->padding = static_cast<uint32_t>(t_backing);
      }
    }
  }
  t_backing = 0;
  ssize_t n = 0;
  if (UringQueues::TakeReply(iov, count, &n)) return n;
  if (uring_payload > 0) io->uring_payload_ = uring_payload;
  n = writev(fd, iov, count);
  if (uring_payload > 0 && n > 0) {
    io->uring_start_(uring_payload);  // the kernel holds every request until the queues are registered
  } else if (uring_payload > 0) {
    io->uring_payload_ = 0;
  }
  if (io != nullptr && t_opcode == FUSE_INIT && count >= 1 && iov[0].iov_len == sizeof(fuse_out_header) &&
      static_cast<const fuse_out_header*>(iov[0].iov_base)->unique == t_unique) {
    // What the connection negotiated is known now, and its io_uring entries (if any) are started:
    // a snapshot may carry both (fuse/handover.h).
    MutexLock lock(&io->mu_);
    io->init_answered_ = true;
    io->cv_.notify_all();
  }
  return n;
}

ssize_t SessionIo::SpliceSend(int fdin, off_t* offin, int fdout, off_t* offout, size_t len, unsigned flags, void*) {
  ssize_t n = 0;
  if (UringQueues::TakeSplicedReply(fdin, fdout, len, &n)) return n;
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
