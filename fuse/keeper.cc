// The keeper process (fuse/handover.h): SpawnKeeper starts it, RunKeeper is its main. It holds
// each mount's /dev/fuse descriptor (and the memory of its io_uring entries) with the state the
// serving granary-fuse deposited, and hands both to the next granary-fuse after a crash.
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <spdlog/spdlog.h>
#include <sys/socket.h>
#include <sys/stat.h>
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
#include "common/net.h"
#include "fuse/handover.h"

extern char** environ;

namespace granary::fuse {

Status SpawnKeeper(const std::string& path) {
  RETURN_IF_ERROR(MakeDirs(ParentDir(path), 0700));
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
    std::string beside = ParentDir(self) + "/granary-fuse";
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
  int ring_fd = -1;    // the memory of its io_uring entries (-1: none), for a successor to adopt
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
    if (it->second.ring_fd >= 0) close(it->second.ring_fd);
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
        r->CloseAll();
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
          Held h{r->fd, r->ring_fd, c, m.state(), {}};
          if (it != held.end()) {
            close(it->second.fd);
            // A successor deposits before it has adopted the io_uring entries' memory: keep the
            // copy held, which is the same connection's, so a crash meanwhile leaves it to adopt.
            if (h.ring_fd < 0 && it->second.ring_fd >= 0 && h.state.uring_payload() > 0) {
              h.ring_fd = it->second.ring_fd;
              h.state.set_uring_memory_base(it->second.state.uring_memory_base());
              h.state.set_uring_memory_bytes(it->second.state.uring_memory_bytes());
            } else if (it->second.ring_fd >= 0) {
              close(it->second.ring_fd);
            }
          }
          for (const rpc::FuseHandle& fh : h.state.handles()) h.handles[fh.fh()] = fh;
          h.state.clear_handles();
          held[mp] = std::move(h);
          client_mount[c] = mp;
          r->fd = -1;
          r->ring_fd = -1;
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
          (void)SendHandover(c, out, it->second.fd, it->second.ring_fd);
          std::fprintf(stderr, "granary-fuse keeper: handed the connection of %s to a successor\n",
                       m.mountpoint().c_str());
          break;
        }
        default:
          break;
      }
      r->CloseAll();
    }
    for (int d : gone) {
      close(d);
      client_mount.erase(d);
    }
    still.erase(std::remove_if(still.begin(), still.end(), [&](int c) { return gone.count(c) > 0; }), still.end());
    clients.swap(still);
    if (fds[0].revents & POLLIN) {
      AcceptedPeer a = AcceptPeer(*listener);
      if (a.refused) {  // it would hand over or deposit a FUSE connection
        std::fprintf(stderr, "granary-fuse keeper: refusing a process of uid %u on %s\n", a.uid, path.c_str());
      }
      if (a.fd >= 0) clients.push_back(a.fd);
    }
  }
  // A spawned keeper that let go of every connection before stopping leaves nothing to look into:
  // its log (SpawnKeeper's path.log) goes with its socket, or every mount point ever used would
  // leave one behind. One stopped while holding a connection keeps it.
  const bool clean = held.empty() && !failed;
  for (auto& [mp, h] : held) {
    close(h.fd);
    if (h.ring_fd >= 0) close(h.ring_fd);
  }
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
