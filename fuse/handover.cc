#include "fuse/handover.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <spdlog/spdlog.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <map>
#include <set>
#include <vector>

#include "common/bad_request.h"
#include "common/fs.h"
#include "common/hash.h"
#include "common/net.h"
#include "rpc/local_wire.h"

extern char** environ;

namespace granary::fuse {
namespace {

constexpr uint32_t kMaxMessage = 64u << 20;

std::string Dir(const std::string& path) {
  auto slash = path.rfind('/');
  return slash == std::string::npos || slash == 0 ? "/" : path.substr(0, slash);
}

sockaddr_un AddressOf(const std::string& path, Status* st) {
  sockaddr_un a{};
  a.sun_family = AF_UNIX;
  if (path.size() >= sizeof(a.sun_path)) {
    *st = InvalidArgumentError("socket path " + path + " is longer than " + std::to_string(sizeof(a.sun_path) - 1) +
                               " bytes; set fuse.handover_socket to a shorter path");
    return a;
  }
  std::memcpy(a.sun_path, path.c_str(), path.size() + 1);
  return a;
}

// Reads exactly n bytes (the first recvmsg may carry a descriptor) before `deadline`.
Status ReadFully(int sock, char* buf, size_t n, int* fd, std::chrono::steady_clock::time_point deadline) {
  size_t got = 0;
  while (got < n) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) return DeadlineExceededError("no answer on the hand-over socket in time");
    pollfd p{sock, POLLIN, 0};
    int rc = poll(&p, 1, static_cast<int>(std::min<int64_t>(left.count(), 1000)));
    if (rc < 0 && errno != EINTR) return ErrnoError(errno, "poll");
    if (rc <= 0) continue;
    iovec iov{buf + got, n - got};
    alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))];
    msghdr m{};
    m.msg_iov = &iov;
    m.msg_iovlen = 1;
    if (fd != nullptr && *fd < 0) {
      m.msg_control = control;
      m.msg_controllen = sizeof control;
    }
    ssize_t r = recvmsg(sock, &m, MSG_CMSG_CLOEXEC);
    if (r < 0) {
      if (errno == EINTR || errno == EAGAIN) continue;
      return ErrnoError(errno, "recvmsg");
    }
    if (r == 0) return UnavailableError("the other side closed the hand-over socket");
    if (m.msg_controllen > 0) {
      for (cmsghdr* c = CMSG_FIRSTHDR(&m); c != nullptr; c = CMSG_NXTHDR(&m, c)) {
        if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS) std::memcpy(fd, CMSG_DATA(c), sizeof(int));
      }
    }
    got += static_cast<size_t>(r);
  }
  return Status::OK();
}

}  // namespace

std::string Fingerprint(const Config& cfg) {
  // Not master.address: a restarted `granary local` gets a new port for the same namespace.
  return "mountpoint=" + cfg.fuse.mountpoint + ";root=" + cfg.fuse.root + ";open=" + cfg.fuse.open +
         ";allow_other=" + (cfg.fuse.allow_other ? "1" : "0");
}

std::string HandoverSocketPath(const Config& cfg) {
  if (!cfg.fuse.handover_socket.empty()) return cfg.fuse.handover_socket;
  return MountRunFile(cfg.fuse.mountpoint, ".sock");
}

std::string KeeperSocketPath(const Config& cfg) {
  if (cfg.fuse.keeper == "off") return "";
  if (cfg.fuse.keeper == "spawn") return HandoverSocketPath(cfg) + ".keeper";
  return cfg.fuse.keeper;
}

Status CheckKeeperSetting(const Config& cfg) {
  const std::string& k = cfg.fuse.keeper;
  if (k == "spawn" || k == "off" || (!k.empty() && k[0] == '/')) return Status::OK();
  return InvalidArgumentError("fuse.keeper '" + k + "' is not spawn, off or the absolute path of a keeper's socket");
}

Status SendHandover(int sock, const rpc::HandoverMessage& m, int fd) {
  std::string body;
  if (!m.SerializeToString(&body)) return InternalError("cannot serialize a hand-over message");
  uint32_t len = static_cast<uint32_t>(body.size());
  std::string frame(reinterpret_cast<const char*>(&len), 4);
  frame += body;
  size_t sent = 0;
  while (sent < frame.size()) {
    iovec iov{frame.data() + sent, frame.size() - sent};
    msghdr msg{};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
    if (sent == 0 && fd >= 0) {
      msg.msg_control = control;
      msg.msg_controllen = sizeof control;
      cmsghdr* c = CMSG_FIRSTHDR(&msg);
      c->cmsg_level = SOL_SOCKET;
      c->cmsg_type = SCM_RIGHTS;
      c->cmsg_len = CMSG_LEN(sizeof(int));
      std::memcpy(CMSG_DATA(c), &fd, sizeof(int));
    }
    ssize_t n = sendmsg(sock, &msg, MSG_NOSIGNAL);
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN) {
        pollfd p{sock, POLLOUT, 0};
        poll(&p, 1, 1000);
        continue;
      }
      return ErrnoError(errno, "sendmsg on the hand-over socket");
    }
    sent += static_cast<size_t>(n);
  }
  return Status::OK();
}

StatusOr<HandoverReceived> ReceiveHandover(int sock, std::chrono::milliseconds timeout) {
  auto deadline = std::chrono::steady_clock::now() + timeout;
  HandoverReceived r;
  uint32_t len = 0;
  Status st = ReadFully(sock, reinterpret_cast<char*>(&len), 4, &r.fd, deadline);
  if (st.ok() && len > kMaxMessage) {
    st = InvalidArgumentError("a hand-over message of " + std::to_string(len) + " bytes (at most " +
                              std::to_string(kMaxMessage) + ")");
  }
  std::string body;
  if (st.ok()) {
    st = ReadGrowing(len, &body, [&](char* p, size_t n) { return ReadFully(sock, p, n, nullptr, deadline); });
  }
  if (st.ok() && !r.msg.ParseFromString(body)) st = DataLossError("a hand-over message that does not parse");
  if (!st.ok()) {
    if (r.fd >= 0) close(r.fd);
    return st;
  }
  return r;
}

StatusOr<int> ConnectLocal(const std::string& path) {
  Status st;
  sockaddr_un a = AddressOf(path, &st);
  RETURN_IF_ERROR(st);
  int s = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (s < 0) return ErrnoError(errno, "socket");
  if (connect(s, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
    int err = errno;
    close(s);
    if (err == ENOENT || err == ECONNREFUSED) return UnavailableError("nobody listens on " + path);
    return ErrnoError(err, "connect " + path);
  }
  return s;
}

StatusOr<int> ListenLocal(const std::string& path) {
  RETURN_IF_ERROR(MakeDirs(Dir(path), 0700));
  if (auto s = ConnectLocal(path); s.ok()) {
    close(*s);
    return AlreadyExistsError("another process listens on " + path);
  }
  unlink(path.c_str());  // a stale socket file: its process is gone
  Status st;
  AddressOf(path, &st);  // its own message for a path too long
  RETURN_IF_ERROR(st);
  return ListenUnix(path, 16, "the hand-over socket");
}

StatusOr<std::optional<HandoverReceived>> RequestTakeover(const std::string& socket_path,
                                                          const std::string& fingerprint,
                                                          std::chrono::milliseconds timeout) {
  auto s = ConnectLocal(socket_path);
  if (!s.ok()) {
    if (s.status().code() == Code::kUnavailable) return std::optional<HandoverReceived>();
    return s.status();
  }
  rpc::HandoverMessage m;
  m.set_kind(rpc::HandoverMessage::TAKEOVER);
  m.set_format(kHandoverFormat);
  m.set_fingerprint(fingerprint);
  Status st = SendHandover(*s, m);
  StatusOr<HandoverReceived> r = st.ok() ? ReceiveHandover(*s, timeout) : StatusOr<HandoverReceived>(st);
  if (r.ok() && r->msg.kind() == rpc::HandoverMessage::STATE && r->msg.state().uring_payload() > 0) {
    r->peer = *s;  // the predecessor serves its rings until ours are registered
  } else {
    close(*s);
  }
  if (!r.ok()) return r.status().WithContext("taking over from the granary-fuse on " + socket_path);
  if (r->msg.kind() == rpc::HandoverMessage::REFUSED) {
    return FailedPreconditionError("the running granary-fuse refused the hand-over and keeps serving: " +
                                   r->msg.text());
  }
  if (r->msg.kind() != rpc::HandoverMessage::STATE || r->fd < 0) {
    if (r->fd >= 0) close(r->fd);
    if (r->peer >= 0) close(r->peer);
    return DataLossError("the running granary-fuse answered the hand-over without a connection");
  }
  return std::optional<HandoverReceived>(std::move(*r));
}

StatusOr<std::optional<HandoverReceived>> WithdrawFromKeeper(const std::string& keeper_path,
                                                             const std::string& mountpoint) {
  if (keeper_path.empty()) return std::optional<HandoverReceived>();
  auto s = ConnectLocal(keeper_path);
  if (!s.ok()) {
    if (s.status().code() == Code::kUnavailable) return std::optional<HandoverReceived>();
    return s.status();
  }
  rpc::HandoverMessage m;
  m.set_kind(rpc::HandoverMessage::WITHDRAW);
  m.set_mountpoint(mountpoint);
  Status st = SendHandover(*s, m);
  StatusOr<HandoverReceived> r = st.ok() ? ReceiveHandover(*s, std::chrono::seconds(10)) : StatusOr<HandoverReceived>(st);
  close(*s);
  if (!r.ok()) return r.status().WithContext("the keeper on " + keeper_path);
  if (r->msg.kind() != rpc::HandoverMessage::STATE || r->fd < 0) {
    if (r->fd >= 0) close(r->fd);
    return std::optional<HandoverReceived>();
  }
  return std::optional<HandoverReceived>(std::move(*r));
}

// ---- KeeperLink -------------------------------------------------------------------------------

KeeperLink::KeeperLink(std::string path, bool spawn, int fd, std::function<rpc::FuseConnectionState()> snapshot,
                       std::function<void(int)> close_backing, bool deposit_now)
    : path_(std::move(path)),
      spawn_(spawn),
      fd_(fd),
      snapshot_(std::move(snapshot)),
      close_backing_(std::move(close_backing)) {
  if (deposit_now) {
    rpc::FuseConnectionState snap = snapshot_();
    if (!snap.init_request().empty()) {
      int s = Connect(snap);
      MutexLock lock(&mu_);
      sock_ = s;
    }
  }
  thread_ = std::thread([this] { Loop(); });
}

KeeperLink::~KeeperLink() { Stop(); }

void KeeperLink::Stop() {
  {
    MutexLock lock(&mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
  MutexLock lock(&mu_);
  if (sock_ >= 0) close(sock_);
  sock_ = -1;
}

void KeeperLink::DisconnectLocked() {
  if (sock_ >= 0) close(sock_);
  sock_ = -1;
  cv_.notify_all();  // the link's thread deposits again
}

void KeeperLink::SendLocked(rpc::HandoverMessage m) {
  if (sock_ >= 0) {
    if (SendHandover(sock_, m).ok()) return;
    DisconnectLocked();
  }
  // A change after the snapshot now being taken (or the next one) is replayed after its deposit;
  // the list is cleared when a snapshot begins, so it holds at most the changes of one attempt.
  if (pending_.size() < 1'000'000) pending_.push_back(std::move(m));
}

void KeeperLink::Send(rpc::HandoverMessage m) {
  MutexLock lock(&mu_);
  if (stop_) return;
  SendLocked(std::move(m));
}

void KeeperLink::PutBacking(const rpc::FuseBacking& b) {
  rpc::HandoverMessage m;
  m.set_kind(rpc::HandoverMessage::BACKING_PUT);
  *m.mutable_backing() = b;
  Send(std::move(m));
}

bool KeeperLink::DropBacking(uint64_t kino, int backing_id) {
  rpc::HandoverMessage m;
  m.set_kind(rpc::HandoverMessage::BACKING_DROP);
  m.mutable_backing()->set_kino(kino);
  m.mutable_backing()->set_backing_id(backing_id);
  MutexLock lock(&mu_);
  if (stop_) return false;  // handed over: the id is the successor's to close
  SendLocked(std::move(m));
  if (sock_ >= 0) return true;
  to_close_.push_back(backing_id);
  return false;
}

void KeeperLink::PutHandle(const rpc::FuseHandle& h) {
  rpc::HandoverMessage m;
  m.set_kind(rpc::HandoverMessage::HANDLE_PUT);
  *m.mutable_handle() = h;
  Send(std::move(m));
}

void KeeperLink::DropHandle(uint64_t fh) {
  rpc::HandoverMessage m;
  m.set_kind(rpc::HandoverMessage::HANDLE_DROP);
  m.mutable_handle()->set_fh(fh);
  Send(std::move(m));
}

void KeeperLink::Release(const std::string& mountpoint) {
  rpc::HandoverMessage m;
  m.set_kind(rpc::HandoverMessage::RELEASE);
  m.set_mountpoint(mountpoint);
  MutexLock lock(&mu_);
  if (sock_ < 0) return;
  (void)SendHandover(sock_, m);
  pending_.clear();
  DisconnectLocked();
  stop_ = true;  // nothing more to deposit
}

bool KeeperLink::deposited() const {
  MutexLock lock(&mu_);
  return sock_ >= 0;
}

int KeeperLink::Connect(const rpc::FuseConnectionState& snap) {
  auto s = ConnectLocal(path_);
  auto now = std::chrono::steady_clock::now();
  if (!s.ok() && spawn_ && (last_spawn_ == std::chrono::steady_clock::time_point{} ||
                            now - last_spawn_ > std::chrono::seconds(30))) {
    last_spawn_ = now;
    Status sp = SpawnKeeper(path_);
    if (!sp.ok()) spdlog::warn("cannot start the FUSE keeper at {}: {}", path_, sp.message());
    s = ConnectLocal(path_);
  }
  if (!s.ok()) return -1;
  rpc::HandoverMessage m;
  m.set_kind(rpc::HandoverMessage::DEPOSIT);
  *m.mutable_state() = snap;
  if (!SendHandover(*s, m, fd_).ok()) {
    close(*s);
    return -1;
  }
  return *s;
}

void KeeperLink::Loop() {
  bool warned = false;
  for (;;) {
    {
      MutexLock lock(&mu_);
      if (stop_) return;
      if (sock_ >= 0) {
        // Connected: wakes every second to notice a keeper that went away (the keeper never
        // writes to us: readable means closed).
        auto until = std::chrono::steady_clock::now() + std::chrono::seconds(1);
        while (!stop_ && sock_ >= 0 && lock.WaitUntil(&cv_, until)) {
        }
        if (stop_) return;
        if (sock_ >= 0) {
          pollfd p{sock_, POLLIN, 0};
          if (poll(&p, 1, 0) > 0) DisconnectLocked();
        }
        continue;
      }
      pending_.clear();  // the snapshot below carries every change made before it
    }
    rpc::FuseConnectionState snap = snapshot_();  // takes the mount's locks: none of ours held
    if (snap.init_request().empty()) {            // the kernel's INIT not read yet
      MutexLock lock(&mu_);
      auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(20);
      while (!stop_ && lock.WaitUntil(&cv_, until)) {
      }
      continue;
    }
    int s = Connect(snap);
    std::vector<int> closable;
    {
      MutexLock lock(&mu_);
      bool ok = s >= 0;
      // The changes made since the snapshot, in order, before anyone else writes.
      while (ok && !pending_.empty()) {
        ok = SendHandover(s, pending_.front()).ok();
        pending_.pop_front();
      }
      if (!ok) {
        if (s >= 0) close(s);
        if (!warned) spdlog::warn("no FUSE keeper on {}: a crash of granary-fuse would end the mount; retrying", path_);
        warned = true;
        auto until = std::chrono::steady_clock::now() + std::chrono::seconds(1);
        while (!stop_ && lock.WaitUntil(&cv_, until)) {
        }
        continue;
      }
      sock_ = s;
      closable.swap(to_close_);
      if (warned) spdlog::info("the FUSE keeper on {} holds the connection again", path_);
      warned = false;
    }
    for (int id : closable) close_backing_(id);
  }
}

// ---- the keeper process -------------------------------------------------------------------------

Status SpawnKeeper(const std::string& path) {
  RETURN_IF_ERROR(MakeDirs(Dir(path), 0700));
  std::string log = path + ".log";
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_addopen(&fa, 1, log.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0600);
  posix_spawn_file_actions_adddup2(&fa, 1, 2);
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  // Its own session: not in granary-fuse's process group, so a signal to that group spares it.
  posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSID | POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF);
  sigset_t none, defaults;
  sigemptyset(&none);
  sigfillset(&defaults);
  posix_spawnattr_setsigmask(&attr, &none);
  posix_spawnattr_setsigdefault(&attr, &defaults);
  // The keeper is granary-fuse's own binary: this one, or the one beside it (granary local).
  std::string self;
  char exe[4096];
  ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
  if (n > 0) {
    exe[n] = '\0';
    self = exe;
  }
  if (self.size() < 12 || self.compare(self.size() - 12, 12, "granary-fuse") != 0) {
    std::string beside = Dir(self) + "/granary-fuse";
    if (self.empty() || access(beside.c_str(), X_OK) != 0) {
      return NotFoundError("granary-fuse, which runs the keeper, is not beside " + self +
                           " (install it there, or set fuse.keeper off)");
    }
    self = beside;
  }
  std::vector<std::string> args{self, "--keeper", path, "--exit-when-empty"};
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  pid_t pid = -1;
  int rc = posix_spawn(&pid, self.c_str(), &fa, &attr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&fa);
  posix_spawnattr_destroy(&attr);
  if (rc != 0) return ErrnoError(rc, "starting the FUSE keeper " + self);
  spdlog::info("started the FUSE keeper (pid {}) on {}", pid, path);
  // Reaped by nobody on purpose: it must outlive this process. Wait until it listens.
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (std::chrono::steady_clock::now() < deadline) {
    if (auto s = ConnectLocal(path); s.ok()) {
      close(*s);
      return Status::OK();
    }
    if (waitpid(pid, nullptr, WNOHANG) == pid) break;  // it exited (its log says why)
    usleep(10000);
  }
  return UnavailableError("the FUSE keeper did not listen on " + path + " (see " + log + ")");
}

namespace {

volatile sig_atomic_t g_keeper_stop = 0;
void OnKeeperSignal(int) { g_keeper_stop = 1; }

struct Held {
  int fd = -1;
  int depositor = -1;  // the socket of the process whose state this is: only its changes apply
  rpc::FuseConnectionState state;               // its handles are kept in `handles`
  std::map<uint64_t, rpc::FuseHandle> handles;  // fh -> a daemon-served open of passthrough mode
};

}  // namespace

int RunKeeper(const std::string& path, bool exit_when_empty) {
  struct sigaction sa {};
  sa.sa_handler = OnKeeperSignal;
  sigaction(SIGTERM, &sa, nullptr);
  sigaction(SIGINT, &sa, nullptr);
  signal(SIGPIPE, SIG_IGN);
  signal(SIGHUP, SIG_IGN);
  auto listener = ListenLocal(path);
  if (!listener.ok()) {
    std::fprintf(stderr, "granary-fuse keeper: error: %s\n", listener.status().message().c_str());
    return 1;
  }
  (void)WriteFileAtomic(path + ".pid", std::to_string(getpid()) + "\n");
  std::fprintf(stderr, "granary-fuse keeper: pid %d listening on %s\n", getpid(), path.c_str());
  std::map<std::string, Held> held;  // mount point -> connection
  std::vector<int> clients;
  std::map<int, std::string> client_mount;  // a depositor's socket -> the mount point it deposited
  bool had = false;
  bool failed = false;  // stopped on an error: its log says why, and stays
  auto start = std::chrono::steady_clock::now();
  auto drop = [&](const std::string& mp, const char* why) {
    auto it = held.find(mp);
    if (it == held.end()) return;
    close(it->second.fd);
    held.erase(it);
    std::fprintf(stderr, "granary-fuse keeper: let go of the connection of %s (%s)\n", mp.c_str(), why);
  };
  // A change told by depositor `c`. Only the current depositor's changes apply: a message its
  // predecessor wrote just before dying must not edit its successor's state.
  auto apply_change = [&](int c, const rpc::HandoverMessage& m) {
    auto cm = client_mount.find(c);
    auto it = cm == client_mount.end() ? held.end() : held.find(cm->second);
    if (it == held.end() || it->second.depositor != c) return;
    if (m.kind() == rpc::HandoverMessage::HANDLE_PUT) {
      it->second.handles[m.handle().fh()] = m.handle();
      return;
    }
    if (m.kind() == rpc::HandoverMessage::HANDLE_DROP) {
      it->second.handles.erase(m.handle().fh());
      return;
    }
    auto* bs = it->second.state.mutable_backings();
    for (int k = 0; k < bs->size(); ++k) {
      if (bs->Get(k).kino() == m.backing().kino()) {
        bs->SwapElements(k, bs->size() - 1);
        bs->RemoveLast();
        break;
      }
    }
    if (m.kind() == rpc::HandoverMessage::BACKING_PUT) *bs->Add() = m.backing();
  };
  std::set<int> gone;  // client sockets closed this round
  // Before a successor gets a connection: every change its depositor wrote before dying, read.
  auto drain_depositors = [&](const std::string& mp) {
    for (auto& [d, dmp] : client_mount) {
      if (dmp != mp || gone.count(d)) continue;
      for (;;) {
        pollfd p{d, POLLIN, 0};
        if (poll(&p, 1, 0) <= 0) break;
        auto r = ReceiveHandover(d, std::chrono::milliseconds(500));
        if (!r.ok()) {
          gone.insert(d);
          break;
        }
        if (r->fd >= 0) close(r->fd);
        apply_change(d, r->msg);
      }
    }
  };
  while (!g_keeper_stop) {
    gone.clear();
    std::vector<pollfd> fds;
    fds.push_back({*listener, POLLIN, 0});
    for (int c : clients) fds.push_back({c, POLLIN, 0});
    int rc = poll(fds.data(), fds.size(), 1000);
    if (rc < 0 && errno != EINTR) {
      std::fprintf(stderr, "granary-fuse keeper: poll: %s\n", std::strerror(errno));
      failed = true;
      break;
    }
    // The connections held: ended (aborted or unmounted) when a poll that does not wait reports
    // POLLERR (events 0). Never in the waiting poll above: a process sleeping in poll on
    // /dev/fuse is on the queue every request wakes, so the keeper woke for every FUSE request of
    // the mount and contended for its queue's lock (bench/fuse_floor.sh, 8 threads).
    std::vector<std::string> ended;
    for (auto& [mp, h] : held) {
      pollfd p{h.fd, 0, 0};
      if (poll(&p, 1, 0) > 0 && (p.revents & (POLLERR | POLLHUP | POLLNVAL))) ended.push_back(mp);
    }
    for (const auto& mp : ended) drop(mp, "the connection ended");
    if (exit_when_empty && held.empty() && clients.empty() &&
        (had || std::chrono::steady_clock::now() - start > std::chrono::seconds(60))) {
      break;
    }
    if (rc <= 0) continue;
    std::vector<int> still;
    for (size_t i = 0; i < clients.size(); ++i) {
      int c = clients[i];
      if (gone.count(c)) continue;
      if (!(fds[1 + i].revents & (POLLIN | POLLHUP | POLLERR))) {
        still.push_back(c);
        continue;
      }
      auto r = ReceiveHandover(c, std::chrono::seconds(5));
      if (r.status().code() == Code::kInvalidArgument) NoteBadRequest("keeper's socket", r.status());
      if (!r.ok()) {  // the depositor went away (it may have crashed: keep what it deposited)
        close(c);
        client_mount.erase(c);
        continue;
      }
      still.push_back(c);
      const rpc::HandoverMessage& m = r->msg;
      switch (m.kind()) {
        case rpc::HandoverMessage::DEPOSIT: {
          const std::string& mp = m.state().mountpoint();
          if (r->fd < 0) break;
          auto it = held.find(mp);
          if (it != held.end()) close(it->second.fd);
          Held h{r->fd, c, m.state(), {}};
          for (const rpc::FuseHandle& fh : h.state.handles()) h.handles[fh.fh()] = fh;
          h.state.clear_handles();
          held[mp] = std::move(h);
          client_mount[c] = mp;
          r->fd = -1;
          had = true;
          std::fprintf(stderr, "granary-fuse keeper: holding the connection of %s for %s\n", mp.c_str(),
                       m.state().sender().c_str());
          break;
        }
        case rpc::HandoverMessage::BACKING_PUT:
        case rpc::HandoverMessage::BACKING_DROP:
        case rpc::HandoverMessage::HANDLE_PUT:
        case rpc::HandoverMessage::HANDLE_DROP:
          apply_change(c, m);
          break;
        case rpc::HandoverMessage::RELEASE:
          drop(m.mountpoint(), "released");
          break;
        case rpc::HandoverMessage::WITHDRAW: {
          drain_depositors(m.mountpoint());
          rpc::HandoverMessage out;
          auto it = held.find(m.mountpoint());
          if (it == held.end()) {
            out.set_kind(rpc::HandoverMessage::EMPTY);
            (void)SendHandover(c, out);
            break;
          }
          out.set_kind(rpc::HandoverMessage::STATE);
          *out.mutable_state() = it->second.state;
          for (auto& b : *out.mutable_state()->mutable_backings()) b.set_passthrough(-1);  // counts unknown
          for (const auto& [fh, h] : it->second.handles) *out.mutable_state()->add_handles() = h;
          (void)SendHandover(c, out, it->second.fd);
          std::fprintf(stderr, "granary-fuse keeper: handed the connection of %s to a successor\n",
                       m.mountpoint().c_str());
          break;
        }
        default:
          break;
      }
      if (r->fd >= 0) close(r->fd);
    }
    for (int d : gone) {
      close(d);
      client_mount.erase(d);
    }
    still.erase(std::remove_if(still.begin(), still.end(), [&](int c) { return gone.count(c) > 0; }), still.end());
    clients.swap(still);
    if (fds[0].revents & POLLIN) {
      int c = accept4(*listener, nullptr, nullptr, SOCK_CLOEXEC);
      if (c >= 0) clients.push_back(c);
    }
  }
  // A spawned keeper that let go of every connection before stopping leaves nothing to look into:
  // its log (SpawnKeeper's path.log) goes with its socket, or every mount point ever used would
  // leave one behind. One stopped while holding a connection keeps it.
  const bool clean = held.empty() && !failed;
  for (auto& [mp, h] : held) close(h.fd);
  for (int c : clients) close(c);
  close(*listener);
  std::fprintf(stderr, "granary-fuse keeper: stopped%s\n", clean ? "" : " while holding a connection");
  // Only its own log: a keeper started for the same path meanwhile writes a new file of that name.
  struct stat mine {}, named {};
  if (exit_when_empty && clean && fstat(STDERR_FILENO, &mine) == 0 && stat((path + ".log").c_str(), &named) == 0 &&
      mine.st_dev == named.st_dev && mine.st_ino == named.st_ino) {
    unlink((path + ".log").c_str());
  }
  unlink(path.c_str());
  unlink((path + ".pid").c_str());
  return 0;
}

}  // namespace granary::fuse
