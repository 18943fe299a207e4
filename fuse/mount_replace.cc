// An open-free connection replaced by one that takes writes (FuseMountImpl, fuse/mount_impl.h;
// why: fuse/fs_state.h, Connection).
//
// Design
// ------
// The kernel decides per connection, and for good, that it opens files by itself (the first OPEN
// answered ENOSYS). A read-only mount wants that (a warm epoch then sends no request at all); a
// write needs its OPEN. So a kernel-mode connection that shows no writable dataset goes open-free,
// its superblock read-only, and when a dataset is shown writable (the first writable attribute,
// SuperblockMode::NoteWritable, before that answer is sent) ReplaceConnection swaps connections:
//
//   1. a new /dev/fuse descriptor and a libfuse session over it, with its own loop, sharing the
//      mount's state (the same Fs: caches, client, handles);
//   2. a FUSE superblock on it made detached (fsopen "fuse", fsconfig with the options libfuse
//      mounts with, fsmount): its INIT goes to the new session's loop;
//   3. move_mount(MOVE_MOUNT_BENEATH) puts it under the current mount at the mount point (Linux >=
//      6.5), then umount2(MNT_DETACH) takes the current one off: path walks from then on reach the
//      new connection. Mount propagation carries both steps to the mount's peers (the copies a
//      Kubernetes host path gives training containers).
//   4. the old connection drains: files, mmaps and working directories opened through it go on
//      there (reads by inode, as in kernel mode; its superblock stays read-only, so a write there
//      gets EROFS), until the kernel lets its superblock go after the last user; then its
//      /dev/fuse reads fail ENODEV, its loop ends, and LoopEnded lets it go.
//
// Whatever fails before step 3 ends with nothing changed (the new session's loop ended, its
// superblock gone with its descriptors); a failed detach in step 3 takes the new mount off again.
// The mount is named by its connection's minor device number, recorded when it was made (or told
// by the predecessor): the swap opens the mount point with no link followed and acts on it only if
// it is that connection, then moves and detaches through that descriptor, never a path walked
// again.
//
// The keeper holds each draining connection under its own name (<mount point>#replaced-N, listed
// in the current connection's deposit) and is given the new connection before the swap returns (a
// crash after it must hand a successor the connection at the mount point). A hand-over sends the
// draining connections after the current one (DRAINING messages); a successor of a crash withdraws
// them from the keeper by name. A successor that does not know them is refused while a connection
// is open-free or draining (HandoverMessage.knows_open_free).
//
// Threads: ReplaceConnection runs on a request's thread of the old connection, under
// SuperblockMode's lock, with cancellation off; it takes stop_mu_ only if free (a hand-over holds
// it while it waits for the requests in flight, this one among them: it then gives up and the
// next writable attribute tries again, or the successor replaces). replace_mu_ guards draining_
// and is taken only for moments: LoopEnded takes it from a draining connection's loop thread, so
// nothing joins a loop while holding it.
#include <fcntl.h>
#include <spdlog/spdlog.h>
#include <linux/openat2.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/utsname.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>

#include "fuse/fs_state.h"
#include "fuse/mount_impl.h"
#include "fuse/ops.h"

#ifndef MOVE_MOUNT_BENEATH
#define MOVE_MOUNT_BENEATH 0x00000200  // Linux 6.5, include/uapi/linux/mount.h
#endif

namespace granary::fuse::internal {
namespace {

// Linux's release from uname, as major * 1000 + minor (0 when unreadable).
int KernelRelease() {
  utsname u{};
  if (uname(&u) != 0) return 0;
  int major = 0, minor = 0;
  if (std::sscanf(u.release, "%d.%d", &major, &minor) != 2) return 0;
  return major * 1000 + minor;
}

// A closed-on-scope-exit descriptor.
struct Fd {
  int fd = -1;
  ~Fd() {
    if (fd >= 0) close(fd);
  }
  int release() {
    int f = fd;
    fd = -1;
    return f;
  }
};

// The minor device number of the file system `fd` is on (0:N for a FUSE connection N), from the
// kernel's attributes: no request to the connection.
StatusOr<unsigned> MinorOf(int fd) {
  struct statx stx {};
  if (statx(fd, "", AT_EMPTY_PATH | AT_STATX_DONT_SYNC, STATX_TYPE, &stx) != 0) return ErrnoError(errno, "statx");
  if (stx.stx_dev_major != 0) return FailedPreconditionError("not a FUSE mount (device " + std::to_string(stx.stx_dev_major) + ":" + std::to_string(stx.stx_dev_minor) + ")");
  return stx.stx_dev_minor;
}

// No cancellation point cancels this thread in its scope (libfuse cancels its workers when a loop
// ends; the swap must not stop half-way).
struct NoCancel {
  int old = 0;
  NoCancel() { pthread_setcancelstate(PTHREAD_CANCEL_DISABLE, &old); }
  ~NoCancel() { pthread_setcancelstate(old, nullptr); }
};

// A detached FUSE mount on /dev/fuse descriptor `dev_fd`, with the options libfuse's mount gives
// the first connection (fuse/mount.cc, Init): its mount descriptor.
StatusOr<int> MountDetached(int dev_fd, const Config& cfg) {
  Fd fs{fsopen("fuse", FSOPEN_CLOEXEC)};
  if (fs.fd < 0) return ErrnoError(errno, "fsopen fuse");
  auto set = [&](const char* key, const std::string& value) -> Status {
    if (fsconfig(fs.fd, FSCONFIG_SET_STRING, key, value.c_str(), 0) != 0) {
      return ErrnoError(errno, std::string("fsconfig ") + key);
    }
    return Status::OK();
  };
  RETURN_IF_ERROR(set("source", "granary"));
  RETURN_IF_ERROR(set("subtype", "granary"));
  RETURN_IF_ERROR(set("fd", std::to_string(dev_fd)));
  RETURN_IF_ERROR(set("rootmode", "40000"));
  RETURN_IF_ERROR(set("user_id", std::to_string(geteuid())));
  RETURN_IF_ERROR(set("group_id", std::to_string(getegid())));
  std::vector<const char*> flags{"default_permissions"};
  if (cfg.fuse.allow_other) flags.push_back("allow_other");
  for (const char* f : flags) {
    if (fsconfig(fs.fd, FSCONFIG_SET_FLAG, f, nullptr, 0) != 0) return ErrnoError(errno, std::string("fsconfig ") + f);
  }
  if (fsconfig(fs.fd, FSCONFIG_CMD_CREATE, nullptr, nullptr, 0) != 0) return ErrnoError(errno, "create the superblock");
  int mnt = fsmount(fs.fd, FSMOUNT_CLOEXEC, MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV);
  if (mnt < 0) return ErrnoError(errno, "fsmount");
  return mnt;
}

// The root of the FUSE mount at `mountpoint` as an O_PATH descriptor, resolved without following
// any link, and refused unless its connection is the one with minor number `minor` (this mount's).
StatusOr<int> OpenMountRoot(const std::string& mountpoint, unsigned minor) {
  if (minor == 0) return FailedPreconditionError("this mount's FUSE connection is not known");
  open_how how{};
  how.flags = O_PATH | O_DIRECTORY | O_CLOEXEC;
  how.resolve = RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS;
  Fd fd{static_cast<int>(syscall(SYS_openat2, AT_FDCWD, mountpoint.c_str(), &how, sizeof how))};
  if (fd.fd < 0) return ErrnoError(errno, "open " + mountpoint + " (no links followed)");
  auto at = MinorOf(fd.fd);
  if (!at.ok()) return at.status().WithContext(mountpoint);
  if (*at != minor) {
    return FailedPreconditionError(mountpoint + " is not this granary-fuse's mount any more (its connection is 0:" +
                                   std::to_string(*at) + ", this mount's 0:" + std::to_string(minor) + ")");
  }
  return fd.release();
}

// Aborts the FUSE connection with this minor number (fusectl): its users get ENOTCONN, its
// /dev/fuse reads ENODEV.
void AbortConnection(unsigned minor) {
  std::string path = "/sys/fs/fuse/connections/" + std::to_string(minor) + "/abort";
  if (access(path.c_str(), W_OK) != 0) mount("none", "/sys/fs/fuse/connections", "fusectl", 0, nullptr);
  std::ofstream abort(path);
  if (abort) abort << "1";
}

}  // namespace

bool FuseMountImpl::CanReplaceConnection(const Config& cfg) const {
  return cfg.fuse.writes && cfg.fuse.transport == "dev" && HasCapSysAdmin() && KernelRelease() >= 6005;
}

fuse_session* FuseMountImpl::NewSession(Connection* conn) {
  // Writable where a dataset is mounted writable (the master refuses writes elsewhere: EROFS);
  // fuse.writes=false mounts read-only.
  const Config& cfg = fs_->cfg;
  std::string opts = std::string("default_permissions,") + (cfg.fuse.writes ? "" : "ro,") + "fsname=granary,subtype=granary";
  if (cfg.fuse.allow_other) opts += ",allow_other";
  const char* argv[] = {"granary-fuse", "-o", opts.c_str()};
  fuse_args args = FUSE_ARGS_INIT(3, const_cast<char**>(argv));
  fuse_lowlevel_ops ops = MakeOps();
  fuse_session* se = fuse_session_new(&args, &ops, sizeof ops, conn);
  fuse_opt_free_args(&args);
  conn->se = se;
  return se;
}

Status FuseMountImpl::ReplaceConnection() {
  NoCancel no_cancel;
  if (!stop_mu_.TryLock()) return UnavailableError("a hand-over or a stop is under way");
  Status st = ReplaceConnectionLocked();
  stop_mu_.Unlock();
  return st;
}

Status FuseMountImpl::ReplaceConnectionLocked() {
  if (stopping_ || handing_over_ || handed_over_ || loop_done_) return UnavailableError("the mount is stopping");
  const auto start = std::chrono::steady_clock::now();

  // 1. The new connection's session, served by a loop of its own.
  auto conn = std::make_unique<Connection>();
  conn->fs = fs_.get();
  conn->replacement = true;
  Fd dev{open("/dev/fuse", O_RDWR | O_CLOEXEC)};
  if (dev.fd < 0) return ErrnoError(errno, "open /dev/fuse");
  fuse_session* se = NewSession(conn.get());
  if (se == nullptr) return InternalError("cannot create a FUSE session");
  auto io = SessionIo::Install(se, dev.fd, false);
  if (!io.ok()) {
    fuse_session_destroy(se);
    return io.status().WithContext("the new connection's /dev/fuse I/O");
  }
  const int fd = dev.release();  // the session owns it now (fuse_session_destroy closes it)
  // 2. Its superblock (INIT is sent now, read by the loop below), detached.
  auto mnt = MountDetached(fd, fs_->cfg);
  Fd mnt_fd{mnt.ok() ? *mnt : -1};
  fuse_loop_config* loop_cfg = fuse_loop_cfg_create();
  fuse_loop_cfg_set_max_threads(loop_cfg, static_cast<unsigned>(fs_->cfg.fuse.max_threads));
  fuse_loop_cfg_set_idle_threads(loop_cfg, std::min<unsigned>(static_cast<unsigned>(fs_->cfg.fuse.max_threads), 4));
  std::thread loop([this, se, loop_cfg] { RunLoop(se, loop_cfg); });
  auto give_up = [&](Status why) {
    // Nothing reaches the new connection but its INIT: ending its loop loses nothing. (Its loop
    // ends in RunLoop as a session never current; no lock of ours is held here.)
    (*io)->Drain(se);
    if (loop.joinable()) loop.join();
    fuse_session_destroy(se);
    fuse_loop_cfg_destroy(loop_cfg);
    return why;
  };
  if (!mnt.ok()) return give_up(mnt.status());
  // What a successor would need of it (its INIT) is known before it serves the mount point.
  if (!(*io)->WaitInitAnswered(std::chrono::seconds(10))) {
    return give_up(DeadlineExceededError("the new connection's INIT was not answered in 10 s"));
  }
  auto new_minor = MinorOf(mnt_fd.fd);
  if (!new_minor.ok()) return give_up(new_minor.status().WithContext("the new connection's mount"));
  // 3. Under the current mount at the mount point; then the current one off it, through a
  // descriptor of the current mount's root checked to be this connection's.
  const unsigned old_minor = conn_minor_;
  auto top = OpenMountRoot(mountpoint_, old_minor);
  if (!top.ok()) return give_up(top.status());
  Fd top_fd{*top};
  if (move_mount(mnt_fd.fd, "", top_fd.fd, "", MOVE_MOUNT_F_EMPTY_PATH | MOVE_MOUNT_T_EMPTY_PATH | MOVE_MOUNT_BENEATH) != 0) {
    return give_up(ErrnoError(errno, "move_mount beneath " + mountpoint_));
  }
  const std::string top_path = "/proc/self/fd/" + std::to_string(top_fd.fd);  // the old mount, whatever its path
  if (umount2(top_path.c_str(), MNT_DETACH) != 0) {
    const int err = errno;
    // The old one stays on top: take the new one off again (it is beneath, still ours).
    const std::string new_path = "/proc/self/fd/" + std::to_string(mnt_fd.fd);
    if (umount2(new_path.c_str(), MNT_DETACH) != 0) {
      spdlog::error("{}: the new connection could not be taken off again ({}); it stays beneath, unused",
                    mountpoint_, std::strerror(errno));
    }
    return give_up(ErrnoError(err, "detach the open-free connection from " + mountpoint_));
  }
  close(top_fd.release());  // a descriptor of the old mount would keep it from ever draining
  close(mnt_fd.release());
  // 4. The old connection drains from now on; its loop thread finds it in draining_ when it ends.
  auto old = std::make_unique<Draining>();
  Draining* drained = old.get();
  {
    MutexLock lock(&replace_mu_);
    old->conn = std::move(conn_);
    old->conn->replaced_at_ns = std::chrono::steady_clock::now().time_since_epoch().count();
    old->se = se_;
    old->io = std::move(io_);
    old->loop_cfg = loop_cfg_;
    old->loop = std::move(loop_);
    if (old_minor != 0) old->minor = old_minor;
    old->key = mountpoint_ + "#replaced-" + std::to_string(++replaced_seq_);
    draining_.push_back(std::move(old));
    draining_live_++;
    conn_ = std::move(conn);
    se_ = se;
    io_ = std::move(*io);
    loop_cfg_ = loop_cfg;
    loop_ = std::move(loop);
    conn_minor_ = *new_minor;
    fs_->io = io_.get();
    {
      MutexLock conns(&fs_->conns_mu);
      fs_->conns.push_back(conn_.get());
    }
    fs_->current = conn_.get();
    current_se_ = se_;
  }
  RaiseReadaheadOf(mountpoint_);
  // A crash from now on must hand a successor the connection at the mount point, and the draining
  // one beside it: the draining one is deposited under its own name first, then the current one
  // (whose state names it) in place of the old. (The draining one lives until EndDraining, which
  // needs stop_mu_, held here.)
  DepositDraining(drained);
  if (fs_->keeper) {
    fs_->keeper->SetConnection(io_->fd());
    if (!fs_->keeper->WaitDeposited(std::chrono::seconds(2))) {
      spdlog::warn("{}: the keeper did not take the new connection within 2 s (it is given it when it answers)",
                   mountpoint_);
    }
  }
  replaced_++;
  spdlog::info("{}: a new FUSE connection took the mount point in {} ms (the previous one, open-free, serves what "
               "was opened through it until its last user goes)",
               mountpoint_,
               std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - start).count());
  return Status::OK();
}

bool FuseMountImpl::LoopEnded(fuse_session* se) {
  MutexLock lock(&replace_mu_);
  for (auto& d : draining_) {
    if (d->se != se || d->ended) continue;
    {
      MutexLock conns(&fs_->conns_mu);
      std::erase(fs_->conns, d->conn.get());
    }
    {
      MutexLock keys(&keys_mu_);
      std::erase(draining_keys_, d->key);
    }
    if (d->keeper) {
      // Handed over: the successor's deposit replaces ours. Else it is gone: the keeper lets it go.
      if (!d->handed) d->keeper->Release(d->key);
      d->keeper->Stop();
    }
    // Its session and I/O (and descriptor: a handed one's was sent from it) stay until the mount
    // ends (EndDraining): whoever still holds a pointer to them may use them. The connection is
    // gone already (its reads failed ENODEV), or it is the successor's.
    if (!d->handed) spdlog::info("{}: a replaced FUSE connection ended (its last user went)", mountpoint_);
    d->ended = true;
    draining_live_--;
    return true;
  }
  return false;
}

void FuseMountImpl::EndDraining() {
  std::vector<std::thread> loops;
  {
    MutexLock lock(&replace_mu_);
    for (auto& d : draining_) {
      if (!d->ended && !d->handed) {
        if (d->keeper) d->keeper->Release(d->key);
        if (d->minor) {
          AbortConnection(*d->minor);
        } else if (d->io) {
          d->io->Drain(d->se);  // and closing the last descriptor (below) aborts it
        }
      }
      if (d->loop.joinable()) loops.push_back(std::move(d->loop));
    }
  }
  for (std::thread& t : loops) t.join();  // each lets its connection go (LoopEnded)
  MutexLock lock(&replace_mu_);
  for (auto& d : draining_) {
    d->keeper.reset();
    if (d->se != nullptr) fuse_session_destroy(d->se);  // closes its descriptor
    d->se = nullptr;
    d->io.reset();
    if (d->loop_cfg) fuse_loop_cfg_destroy(d->loop_cfg);
    d->loop_cfg = nullptr;
  }
  draining_.clear();
}

rpc::FuseConnectionState FuseMountImpl::DrainingState(const Draining& d) const {
  rpc::FuseConnectionState st;
  st.set_format(kHandoverFormat);
  st.set_mountpoint(d.key);
  st.set_init_request(d.io->init_request());
  st.set_mode(static_cast<uint32_t>(OpenMode::kKernel));
  st.set_open_free(true);
  st.set_minor(d.minor.value_or(0));
  st.set_root_ino(fs_->root_ino);
  st.set_fingerprint(Fingerprint(fs_->cfg));
  st.set_sender("granary-fuse pid " + std::to_string(getpid()));
  return st;
}

void FuseMountImpl::DepositDraining(Draining* d) {
  {
    MutexLock keys(&keys_mu_);
    draining_keys_.push_back(d->key);
  }
  if (keeper_path_.empty()) return;
  // Deposited before this returns: the current connection's deposit names it next.
  d->keeper = std::make_unique<KeeperLink>(
      keeper_path_, fs_->cfg.fuse.keeper == "spawn", d->io->fd(), [this, d] { return DrainingState(*d); },
      [](int) {}, /*deposit_now=*/true);
}

void FuseMountImpl::AdoptDraining(const rpc::FuseConnectionState& st, int fd, bool from_keeper) {
  // Cannot be served here: it ends (its users get ENOTCONN rather than waiting on nobody), and the
  // keeper lets its copy go.
  auto drop = [&](const std::string& why) {
    spdlog::error("{}: cannot serve the replaced connection {} the predecessor left ({}); what was opened through it "
                  "fails with ENOTCONN",
                  mountpoint_, st.mountpoint(), why);
    if (st.minor() != 0) AbortConnection(st.minor());
    if (fd >= 0) close(fd);
    ReleaseFromKeeper(keeper_path_, st.mountpoint());
  };
  if (st.format() != kHandoverFormat || st.fingerprint() != Fingerprint(fs_->cfg) || st.init_request().empty()) {
    return drop("another format, other settings, or no INIT");
  }
  auto d = std::make_unique<Draining>();
  d->conn = std::make_unique<Connection>();
  d->conn->fs = fs_.get();
  d->conn->replacement = true;
  d->conn->open_free = true;
  d->key = st.mountpoint();
  if (st.minor() != 0) d->minor = st.minor();
  d->se = NewSession(d->conn.get());
  if (d->se == nullptr) return drop("no session");
  auto io = SessionIo::Install(d->se, fd, false, st.init_request());
  if (!io.ok()) {
    fuse_session_destroy(d->se);  // closes fd
    fd = -1;
    return drop(io.status().message());
  }
  d->io = std::move(*io);
  d->loop_cfg = fuse_loop_cfg_create();
  fuse_loop_cfg_set_max_threads(d->loop_cfg, static_cast<unsigned>(fs_->cfg.fuse.max_threads));
  fuse_loop_cfg_set_idle_threads(d->loop_cfg, 1);
  {
    MutexLock conns(&fs_->conns_mu);
    fs_->conns.push_back(d->conn.get());
  }
  Draining* raw = d.get();
  SessionIo* served = raw->io.get();
  {
    MutexLock lock(&replace_mu_);
    draining_.push_back(std::move(d));
    draining_live_++;
    raw->loop = std::thread([this, se = raw->se, cfg = raw->loop_cfg] { RunLoop(se, cfg); });
  }
  // Its io lives until the mount ends (EndDraining).
  const bool replayed = served->WaitInitReplayed(std::chrono::seconds(10));
  if (!replayed) spdlog::warn("{}: the replaced connection's replayed INIT was not processed in 10 s", mountpoint_);
  // Requests the dead predecessor had read and not answered on it: the kernel sends them again.
  if (from_keeper) {
    if (Status rs = served->NotifyResend(); !rs.ok()) {
      spdlog::warn("{}: requests the previous granary-fuse had read on {} and not answered fail with EIO", rs.message(),
                   raw->key);
    }
  }
  DepositDraining(raw);  // it lives until EndDraining (after this, under stop_mu_ or at Init)
  spdlog::info("{}: serving a replaced connection the predecessor left ({})", mountpoint_, raw->key);
}

void FuseMountImpl::AdoptAllDraining(HandoverReceived* got, bool from_keeper) {
  for (HandoverReceived::DrainingConnection& dc : got->draining) {
    AdoptDraining(dc.state, dc.fd, false);
    dc.fd = -1;
  }
  got->draining.clear();
  if (!from_keeper) return;
  for (const std::string& key : got->msg.state().draining_keys()) {
    auto kept = WithdrawFromKeeper(keeper_path_, key);
    if (!kept.ok()) {
      spdlog::warn("{}: the keeper's copy of replaced connection {}: {}", mountpoint_, key, kept.status().message());
      continue;
    }
    if (!*kept) continue;  // it ended meanwhile
    const int fd = (*kept)->fd;
    (*kept)->fd = -1;
    AdoptDraining((*kept)->msg.state(), fd, true);
    (*kept)->CloseAll();
  }
}

std::vector<FuseMountImpl::Draining*> FuseMountImpl::TakeDrainingForHandOver() {
  std::vector<Draining*> out;
  MutexLock lock(&replace_mu_);
  for (auto& d : draining_) {
    if (d->ended || d->handed) continue;
    d->handed = true;
    out.push_back(d.get());
  }
  return out;
}

void FuseMountImpl::KeepDraining(const std::vector<Draining*>& drains) {
  MutexLock lock(&replace_mu_);
  for (Draining* d : drains) d->handed = false;
}

void FuseMountImpl::HandOverDraining(int c, const std::vector<Draining*>& drains) {
  size_t sent = 0;
  for (Draining* d : drains) {
    // Every request it read is answered, nothing more is read; its loop ends.
    d->io->Drain(d->se);
    rpc::HandoverMessage m;
    m.set_kind(rpc::HandoverMessage::DRAINING);
    *m.mutable_state() = DrainingState(*d);
    Status st = SendHandover(c, m, d->io->fd());
    if (!st.ok()) {
      spdlog::error("handing over replaced FUSE connections failed after {} of {} ({}); what was opened through the "
                    "others fails with ENOTCONN",
                    sent, drains.size(), st.message());
      break;
    }
    ++sent;
    // The successor's now: our copy of its descriptor goes (an idle predecessor holding it would
    // keep it alive after the successor ended). Its loop ended with the Drain (LoopEnded).
    if (d->loop.joinable()) d->loop.join();
    MutexLock lock(&replace_mu_);
    fuse_session_destroy(d->se);
    d->se = nullptr;
    d->io.reset();
  }
  // Those not sent are nobody's: they end rather than wait on nobody. The one whose send failed
  // is drained already (its loop ended): aborted here; the others EndDraining aborts.
  if (sent < drains.size()) {
    Draining* failed = drains[sent];
    if (failed->minor) AbortConnection(*failed->minor);
    ReleaseFromKeeper(keeper_path_, failed->key);
    MutexLock lock(&replace_mu_);
    for (size_t i = sent + 1; i < drains.size(); ++i) drains[i]->handed = false;
  }
  if (!drains.empty()) spdlog::info("handed over {} of {} replaced connection(s) still draining", sent, drains.size());
}

}  // namespace granary::fuse::internal
