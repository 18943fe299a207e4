#include "fuse/handover.h"

#include <poll.h>
#include <spdlog/spdlog.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <vector>

#include "common/fs.h"
#include "common/local_frames.h"
#include "common/net.h"
#include "rpc/local_wire.h"

namespace granary::fuse {
namespace {

constexpr uint32_t kMaxMessage = 64u << 20;

constexpr const char* kWhat = "the hand-over socket";

}  // namespace

std::string Fingerprint(const Config& cfg) {
  // Not master.address: a restarted `granary local` gets a new port for the same namespace.
  return "mountpoint=" + cfg.fuse.mountpoint + ";root=" + cfg.fuse.root + ";open=" + cfg.fuse.open +
         ";allow_other=" + (cfg.fuse.allow_other ? "1" : "0");
}

StatusOr<std::string> HandoverSocketPath(const Config& cfg) {
  if (!cfg.fuse.handover_socket.empty()) return cfg.fuse.handover_socket;
  return MountRunFile(cfg.fuse.mountpoint, ".sock");
}

StatusOr<std::string> KeeperSocketPath(const Config& cfg) {
  if (cfg.fuse.keeper == "off") return std::string();
  if (cfg.fuse.keeper == "spawn") {
    ASSIGN_OR_RETURN(std::string handover, HandoverSocketPath(cfg));
    return handover + ".keeper";
  }
  return cfg.fuse.keeper;
}

Status CheckKeeperSetting(const Config& cfg) {
  const std::string& k = cfg.fuse.keeper;
  if (k == "spawn" || k == "off" || (!k.empty() && k[0] == '/')) return Status::OK();
  return InvalidArgumentError("fuse.keeper '" + k + "' is not spawn, off or the absolute path of a keeper's socket");
}

Status SendHandover(int sock, const rpc::HandoverMessage& m, int fd, int fd2) {
  std::string frame(4, '\0');
  if (!m.AppendToString(&frame)) return InternalError("cannot serialize a hand-over message");
  frames::EncodeLength(static_cast<uint32_t>(frame.size() - 4), frame.data());
  const int fds[2] = {fd, fd2};
  const size_t count = fd < 0 ? 0 : fd2 >= 0 ? 2 : 1;
  iovec iov{frame.data(), frame.size()};
  return frames::SendV(sock, &iov, 1, std::span<const int>(fds, count), kWhat);
}

void HandoverReceived::CloseAll() {
  for (int* f : {&fd, &ring_fd, &peer}) {
    if (*f >= 0) close(*f);
    *f = -1;
  }
  for (WriteFile& w : write_files) {
    if (w.fd >= 0) close(w.fd);
    if (w.conn >= 0) close(w.conn);
  }
  write_files.clear();
  for (DrainingConnection& d : draining) {
    if (d.fd >= 0) close(d.fd);
  }
  draining.clear();
}

StatusOr<HandoverReceived> ReceiveHandover(int sock, std::chrono::milliseconds timeout) {
  auto deadline = std::chrono::steady_clock::now() + timeout;
  HandoverReceived r;
  uint32_t len = 0;
  int fds[2] = {-1, -1};  // a message carries at most two descriptors; any more are closed
  Status st = frames::RecvLength(sock, fds, kMaxMessage, &len, kWhat, deadline);
  r.fd = fds[0];
  r.ring_fd = fds[1];
  std::string body;
  if (st.ok()) {
    st = frames::ReadGrowing(len, &body, [&](char* p, size_t n) {
      int none[1] = {-1};  // descriptors come with a message's first bytes only
      Status got = frames::RecvExactly(sock, p, n, none, kWhat, deadline);
      frames::CloseAll(none);
      return got;
    });
  }
  if (st.ok() && !r.msg.ParseFromString(body)) st = DataLossError("a hand-over message that does not parse");
  if (!st.ok()) {
    r.CloseAll();
    return st;
  }
  return r;
}

StatusOr<int> ConnectLocal(const std::string& path) {
  ASSIGN_OR_RETURN(int s, ConnectUnix(path, "the hand-over socket (fuse.handover_socket)"));
  // What answers gets a FUSE connection or hands one over: only a process of this user (or root).
  uint32_t uid;
  if (!PeerIsRootOrSelf(s, &uid)) {
    close(s);
    return PermissionDeniedError("the process listening on " + path + " runs as uid " + std::to_string(uid) +
                                 ", neither root nor this user (uid " + std::to_string(geteuid()) +
                                 "): refusing to hand a FUSE connection to it or take one from it");
  }
  return s;
}

StatusOr<int> ListenLocal(const std::string& path) {
  RETURN_IF_ERROR(MakeDirs(ParentDir(path), 0700));
  if (auto s = ConnectLocal(path); s.ok()) {
    close(*s);
    return AlreadyExistsError("another process listens on " + path);
  }
  unlink(path.c_str());  // a stale socket file: its process is gone
  return ListenUnix(path, 16, "the hand-over socket (fuse.handover_socket)");
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
  m.set_knows_open_free(true);
  Status st = SendHandover(*s, m);
  StatusOr<HandoverReceived> r = st.ok() ? ReceiveHandover(*s, timeout) : StatusOr<HandoverReceived>(st);
  if (r.ok() && r->msg.kind() == rpc::HandoverMessage::STATE) {
    // The files open for writing come next, each with its staging file and session.
    for (uint32_t i = 0; i < r->msg.state().write_files(); ++i) {
      auto w = ReceiveHandover(*s, std::chrono::seconds(10));
      if (!w.ok() || w->msg.kind() != rpc::HandoverMessage::WRITE_FILE || w->fd < 0) {
        spdlog::error("the predecessor's files open for writing did not all come ({} of {}): {}; their writers get EIO",
                      i, r->msg.state().write_files(), w.ok() ? "an unexpected message" : w.status().message());
        if (w.ok()) w->CloseAll();
        break;
      }
      r->write_files.push_back({w->msg.write_file(), w->fd, w->ring_fd});
      w->fd = w->ring_fd = -1;
    }
    // Then the replaced connections still draining, each with its descriptor.
    for (uint32_t i = 0; i < r->msg.state().draining(); ++i) {
      auto d = ReceiveHandover(*s, std::chrono::seconds(10));
      if (!d.ok() || d->msg.kind() != rpc::HandoverMessage::DRAINING || d->fd < 0) {
        spdlog::error("the predecessor's replaced FUSE connections did not all come ({} of {}): {}; what was opened "
                      "through the others fails with ENOTCONN",
                      i, r->msg.state().draining(), d.ok() ? "an unexpected message" : d.status().message());
        if (d.ok()) d->CloseAll();
        break;
      }
      r->draining.push_back({d->msg.state(), d->fd});
      d->fd = -1;
    }
  }
  if (r.ok() && r->msg.kind() == rpc::HandoverMessage::STATE &&
      (r->msg.state().uring_payload() > 0 || r->msg.state().backings_size() > 0)) {
    // The predecessor serves its rings until ours are registered (RINGS_READY), and holds its
    // backing files' leases until we hold ours (LEASED).
    r->peer = *s;
  } else {
    close(*s);
  }
  if (!r.ok()) return r.status().WithContext("taking over from the granary-fuse on " + socket_path);
  if (r->msg.kind() == rpc::HandoverMessage::REFUSED) {
    return FailedPreconditionError("the running granary-fuse refused the hand-over and keeps serving: " +
                                   r->msg.text());
  }
  if (r->msg.kind() != rpc::HandoverMessage::STATE || r->fd < 0) {
    r->CloseAll();
    return DataLossError("the running granary-fuse answered the hand-over without a connection");
  }
  return std::optional<HandoverReceived>(std::move(*r));
}

void ReleaseFromKeeper(const std::string& keeper_path, const std::string& mountpoint) {
  if (keeper_path.empty()) return;
  auto s = ConnectLocal(keeper_path);
  if (!s.ok()) return;  // no keeper: nothing held
  rpc::HandoverMessage m;
  m.set_kind(rpc::HandoverMessage::RELEASE);
  m.set_mountpoint(mountpoint);
  (void)SendHandover(*s, m);
  close(*s);
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
    r->CloseAll();
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

void KeeperLink::SetRingMemory(int fd) {
  ring_fd_ = fd;
  MutexLock lock(&mu_);
  ++ring_changes_;
  if (!stop_) DisconnectLocked();  // the link's thread deposits again, with it
}

void KeeperLink::SetConnection(int fd) {
  fd_ = fd;
  MutexLock lock(&mu_);
  ++ring_changes_;
  if (!stop_) DisconnectLocked();  // the link's thread deposits again, with it
}

bool KeeperLink::WaitDeposited(std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  MutexLock lock(&mu_);
  while (sock_ < 0 && !stop_ && std::chrono::steady_clock::now() < deadline) {
    lock.WaitFor(&cv_, std::chrono::milliseconds(10));
  }
  return sock_ >= 0;
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
  if (!SendHandover(*s, m, fd_, ring_fd_.load()).ok()) {
    close(*s);
    return -1;
  }
  return *s;
}

void KeeperLink::Loop() {
  bool warned = false;
  uint64_t seen_ring = 0;
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
      seen_ring = ring_changes_;
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
      if (s >= 0 && seen_ring != ring_changes_) {  // the ring memory came after the snapshot: again
        close(s);
        continue;
      }
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

}  // namespace granary::fuse
