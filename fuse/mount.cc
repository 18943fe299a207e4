// FuseMount::Start and the mount's lifecycle (FuseMountImpl, fuse/mount_impl.h): a fresh mount or
// a connection taken over, the FUSE loop and the invalidation thread, unmounting; and the table of
// operations the session runs (MakeOps; the operations are in fuse/ops_meta.cc and
// fuse/ops_read.cc).
#include "fuse/mount.h"

#include <fcntl.h>
#include <sched.h>
#include <spdlog/spdlog.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstdlib>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>
#include <thread>

#include "common/shutdown.h"
#include "fuse/client.h"
#include "fuse/file_cache.h"
#include "fuse/fs_state.h"
#include "fuse/handover.h"
#include "fuse/mount_impl.h"
#include "fuse/ops.h"
#include "fuse/session_io.h"
#include "fuse/trace.h"

namespace granary::fuse {
namespace internal {

fuse_lowlevel_ops MakeOps() {
  fuse_lowlevel_ops ops{};
  ops.init = OpInit;
  ops.lookup = OpLookup;
  ops.forget = OpForget;
  ops.forget_multi = OpForgetMulti;
  ops.getattr = OpGetattr;
  ops.opendir = OpOpendir;
  ops.readdir = OpReaddir;
  ops.readdirplus = OpReaddirplus;
  ops.releasedir = OpReleasedir;
  ops.open = OpOpen;
  ops.read = OpRead;
  ops.release = OpRelease;
  ops.flush = OpFlush;
  ops.fsync = OpFsync;
  ops.statfs = OpStatfs;
  ops.getxattr = OpGetxattr;
  ops.listxattr = OpListxattr;
  ops.readlink = OpReadlink;
  ops.setattr = OpSetattr;
  ops.mknod = OpMknod;
  ops.mkdir = OpMkdir;
  ops.unlink = OpUnlink;
  ops.rmdir = OpRmdir;
  ops.symlink = OpSymlink;
  ops.rename = OpRename;
  ops.link = OpLink;
  ops.write = OpWrite;
  ops.create = OpCreate;
  ops.setxattr = OpSetxattr;
  ops.removexattr = OpRemovexattr;
  ops.fallocate = OpFallocate;
  return ops;
}

// The kernel caps a FUSE mount's readahead at the default read_ahead_kb (128 KiB) whatever the
// filesystem negotiates, so sequential reads would arrive as 128 KiB requests, each a round trip
// to the worker. Raising the mount's own bdi setting lets them arrive as 1 MiB requests (the
// max_readahead asked for in OpInit). Needs root; without it reads still work, in smaller pieces.
void RaiseReadaheadOf(const std::string& mountpoint) {
  auto minor = FuseConnection(mountpoint);
  if (!minor) return;
  std::string path = "/sys/class/bdi/0:" + std::to_string(*minor) + "/read_ahead_kb";
  std::ofstream out(path);
  out << (kMaxReadahead / 1024) << "\n";
  out.flush();
  if (!out) spdlog::info("cannot raise {} (not root?); sequential reads go in 128 KiB requests", path);
}

// Read from /proc/self/mountinfo: stat() on the mount itself would be a request to this very
// process, which hangs once its loop has stopped serving.
std::optional<unsigned> FuseConnection(const std::string& mp) {
  std::optional<unsigned> found;
  std::ifstream in("/proc/self/mountinfo");
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream f(line);
    std::string id, parent, dev, root, point;
    f >> id >> parent >> dev >> root >> point;
    std::string decoded;  // mountinfo escapes space, tab, newline and backslash as \ooo
    for (size_t i = 0; i < point.size(); ++i) {
      if (point[i] == '\\' && i + 3 < point.size()) {
        decoded += static_cast<char>(std::stoi(point.substr(i + 1, 3), nullptr, 8));
        i += 3;
      } else {
        decoded += point[i];
      }
    }
    auto colon = dev.find(':');
    if (decoded == mp && colon != std::string::npos && line.find(" - fuse") != std::string::npos) {
      found = static_cast<unsigned>(std::stoul(dev.substr(colon + 1)));  // the last listed is on top
    }
  }
  return found;
}

namespace {

// Unmounts `mp`: plainly, or lazily when busy (then aborts the connection so the loop ends).
void Unmount(const std::string& mp) {
  std::optional<unsigned> conn = FuseConnection(mp);
  if (geteuid() == 0) {
    if (umount2(mp.c_str(), 0) == 0) return;
    if (errno == EINVAL || errno == ENOENT) return;  // not mounted any more
    umount2(mp.c_str(), MNT_DETACH);
    if (conn) {
      // The abort file lives in fusectl, which some hosts do not mount by default.
      std::string abort_path = "/sys/fs/fuse/connections/" + std::to_string(*conn) + "/abort";
      if (access(abort_path.c_str(), W_OK) != 0) {
        mount("none", "/sys/fs/fuse/connections", "fusectl", 0, nullptr);  // EBUSY: already mounted
      }
      std::ofstream abort(abort_path);
      if (abort) abort << "1";
    }
    return;
  }
  pid_t pid = fork();
  if (pid == 0) {
    execlp("fusermount3", "fusermount3", "-u", "-z", "-q", mp.c_str(), static_cast<char*>(nullptr));
    _exit(127);
  }
  if (pid > 0) waitpid(pid, nullptr, 0);
}

}  // namespace

// Init, in steps: find a predecessor to take the connection from (a running granary-fuse, else
// the keeper of one that died), build the filesystem's state (MakeFs), create the libfuse session,
// then either mount afresh (StartFresh) or adopt the predecessor's connection (Adopt); last, the
// metrics endpoint and the hand-over socket, the same for both.
Status FuseMountImpl::Init(const Config& cfg) {
  mountpoint_ = cfg.fuse.mountpoint;
  RETURN_IF_ERROR(CheckKeeperSetting(cfg));
  ASSIGN_OR_RETURN(handover_path_, HandoverSocketPath(cfg));
  ASSIGN_OR_RETURN(keeper_path_, KeeperSocketPath(cfg));
  bool from_keeper = false;
  ASSIGN_OR_RETURN(std::optional<HandoverReceived> got, FindPredecessor(cfg, &from_keeper));
  // The predecessor's socket and ring memory, on every return that does not use them.
  struct CloseExtras {
    std::optional<HandoverReceived>* got;
    ~CloseExtras() {
      if (!*got) return;
      for (int* f : {&(*got)->ring_fd, &(*got)->peer}) {
        if (*f >= 0) close(*f);
        *f = -1;
      }
      for (HandoverReceived::WriteFile& w : (*got)->write_files) {  // those not taken over
        if (w.fd >= 0) close(w.fd);
        if (w.conn >= 0) close(w.conn);
      }
      (*got)->write_files.clear();
      for (HandoverReceived::DrainingConnection& d : (*got)->draining) {  // those not taken over
        if (d.fd >= 0) close(d.fd);
      }
      (*got)->draining.clear();
    }
  } close_extras{&got};
  // The keeper's connection is not the one at the mount point: the previous granary-fuse died
  // right after it replaced a connection, before the keeper had the new one (whose descriptors
  // died with it: the mount point is dead). Mount afresh; the kept one drains (mount_replace.cc).
  std::optional<HandoverReceived> orphan;
  if (got && from_keeper && got->msg.state().minor() != 0) {
    const std::optional<unsigned> at = FuseConnection(got->msg.state().mountpoint());
    if (at && *at != got->msg.state().minor()) {
      spdlog::warn("the keeper's FUSE connection of {} (0:{}) is not the one at the mount point (0:{}): the previous "
                   "granary-fuse died while replacing it; mounting afresh, the kept one serves what was opened "
                   "through it",
                   got->msg.state().mountpoint(), got->msg.state().minor(), *at);
      orphan = std::move(got);
      got.reset();
      from_keeper = false;
    }
  }
  struct CloseOrphan {
    std::optional<HandoverReceived>* orphan;
    ~CloseOrphan() {
      if (*orphan) (*orphan)->CloseAll();
    }
  } close_orphan{&orphan};
  if (!got) RETURN_IF_ERROR(CheckMountPoint());
  Status made = MakeFs(cfg, got ? std::optional<uint64_t>(got->msg.state().root_ino()) : std::nullopt);
  if (!made.ok()) {
    if (got) got->CloseAll();
    return made;
  }
  conn_ = std::make_unique<Connection>();
  conn_->fs = fs_.get();
  se_ = NewSession(conn_.get());
  if (se_ == nullptr) {
    if (got) got->CloseAll();
    return InternalError("cannot create the FUSE session (see the message above)");
  }
  current_se_ = se_;
  fs_->current = conn_.get();
  {
    MutexLock conns(&fs_->conns_mu);
    fs_->conns.push_back(conn_.get());
  }
  RETURN_IF_ERROR(got ? Adopt(cfg, &*got, from_keeper) : StartFresh(cfg));
  if (got) AdoptAllDraining(&*got, from_keeper);
  if (orphan) {
    rpc::FuseConnectionState st = orphan->msg.state();
    st.set_mountpoint(mountpoint_ + "#replaced-0");
    const int fd = orphan->fd;
    orphan->fd = -1;
    AdoptDraining(st, fd, /*from_keeper=*/true);
    AdoptAllDraining(&*orphan, /*from_keeper=*/true);
  }
  // The keeper's deposit of the current connection names the draining ones adopted just now (before
  // this process says it is ready: a crash right after must find them).
  if (fs_->keeper && draining_live_ > 0) {
    fs_->keeper->SetConnection(io_->fd());
    (void)fs_->keeper->WaitDeposited(std::chrono::seconds(2));
  }
  // The metrics endpoint and trace socket first: once the responder runs, a successor's hand-over
  // stops them on the responder's thread (StopMetrics), so they must exist by then.
  StartMetrics();
  auto listener = ListenLocal(handover_path_);
  if (listener.ok()) {
    listen_fd_ = *listener;
    responder_ = std::thread([this] { RespondLoop(); });
  } else {
    spdlog::warn("no hand-over socket ({}): an upgrade of granary-fuse will remount instead",
                 listener.status().message());
  }
  if (!got) {
    spdlog::info("granary-fuse mounted at {} (master {}, worker {})", mountpoint_, cfg.master.address, cfg.fuse.worker);
  }
  return Status::OK();
}

// A running granary-fuse hands its connection over (an upgrade); else a keeper holds the
// connection of one that died (a crash: *from_keeper). Asked before anything touches the mount
// point: a connection nobody serves would stall our own stat() of it. nullopt: mount afresh. A
// connection this process cannot serve (another hand-over format, other settings) is an error.
StatusOr<std::optional<HandoverReceived>> FuseMountImpl::FindPredecessor(const Config& cfg, bool* from_keeper) {
  ASSIGN_OR_RETURN(std::optional<HandoverReceived> got,
                   RequestTakeover(handover_path_, Fingerprint(cfg), std::chrono::minutes(2)));
  if (!got) {
    auto kept = WithdrawFromKeeper(keeper_path_, cfg.fuse.mountpoint);
    if (!kept.ok()) {
      spdlog::warn("the FUSE keeper: {}; mounting anew", kept.status().message());
    } else if (*kept) {
      got = std::move(*kept);
      *from_keeper = true;
    }
  }
  if (got && got->msg.state().format() != kHandoverFormat) {
    const uint32_t format = got->msg.state().format();
    got->CloseAll();
    return FailedPreconditionError("the kept FUSE connection of " + cfg.fuse.mountpoint + " is in hand-over format " +
                                   std::to_string(format) + ", this granary-fuse speaks " +
                                   std::to_string(kHandoverFormat) + "; unmount it (fusermount3 -u) and start again");
  }
  if (got && got->msg.state().fingerprint() != Fingerprint(cfg)) {
    const std::string theirs = got->msg.state().fingerprint();
    got->CloseAll();
    return FailedPreconditionError("the kept FUSE connection of " + cfg.fuse.mountpoint + " was made with other " +
                                   "settings (" + theirs + "); start granary-fuse with the same " +
                                   "fuse.mountpoint, fuse.root, fuse.open and fuse.allow_other, or " +
                                   "unmount it first");
  }
  return got;
}

// The filesystem's state (fs_): the read mode wanted, the client, the caches, passthrough's
// tables. `adopted_root`: a predecessor's root inode; else fuse.root is resolved.
Status FuseMountImpl::MakeFs(const Config& cfg, std::optional<uint64_t> adopted_root) {
  fs_ = std::make_unique<Fs>();
  ASSIGN_OR_RETURN(fs_->client, Client::Create(cfg));
  InitFs(fs_.get(), cfg);
  fs_->backing_host = MakeBackingHost(fs_.get());
  fs_->passthrough = std::make_unique<PassthroughOpens>(fs_->backing_host.get(), cfg.fuse.attr_timeout);
  if (adopted_root) {
    fs_->root_ino = *adopted_root;
  } else if (cfg.fuse.root != "/") {
    auto root = fs_->client->Resolve(cfg.fuse.root);
    if (!root.ok()) return root.status().WithContext("fuse.root " + cfg.fuse.root);
    if (root->type() != rpc::DIRECTORY) return InvalidArgumentError("fuse.root " + cfg.fuse.root + " is not a directory");
    fs_->root_ino = root->ino();
  }
  return Status::OK();
}

// Our own /dev/fuse I/O (session_io.h) on `fd`: passthrough, INIT kept (and `replay`ed for an
// adopted connection), hand-over.
Status FuseMountImpl::InstallIo(int fd, const std::string& replay) {
  auto io = SessionIo::Install(se_, fd, fs_->mode == OpenMode::kPassthrough, replay);
  if (!io.ok()) {
    if (!mounted_) close(fd);
    fuse_session_destroy(se_);
    se_ = nullptr;
    return io.status().WithContext("granary-fuse's /dev/fuse I/O");
  }
  io_ = std::move(*io);
  fs_->io = io_.get();
  return Status::OK();
}

void FuseMountImpl::StartKeeperLink(const Config& cfg, bool adopted) {
  if (keeper_path_.empty()) return;
  // It deposits once INIT is known.
  fs_->keeper = std::make_unique<KeeperLink>(keeper_path_, cfg.fuse.keeper == "spawn", io_->fd(),
                                             [this] { return Snapshot(false); },
                                             [io = io_.get()](int id) { io->CloseBacking(id); }, adopted);
}

// A fresh mount: fuse_session_mount, then serving.
Status FuseMountImpl::StartFresh(const Config& cfg) {
  if (fuse_session_mount(se_, mountpoint_.c_str()) != 0) {
    fuse_session_destroy(se_);
    se_ = nullptr;
    return UnavailableError("cannot mount FUSE at " + mountpoint_ +
                            " (is /dev/fuse available, and for allow_other are you root or is user_allow_other "
                            "set in /etc/fuse.conf?)");
  }
  mounted_ = true;
  if (cfg.fuse.writes) fs_->sb_mode.Arm(mountpoint_);  // fuse.writes=false mounted ro already
  // Kernel mode: open-free until a writable dataset is shown (fuse/mount_replace.cc).
  if (CanReplaceConnection(cfg)) fs_->sb_mode.SetReplacer([this] { return ReplaceConnection(); });
  RETURN_IF_ERROR(InstallIo(fuse_session_fd(se_), ""));
  if (cfg.fuse.transport == "uring") {
    if (Status probe = UringQueues::Probe(); probe.ok()) {
      io_->WantUring([this](size_t payload) { StartUring(payload); });
    } else {
      spdlog::warn("fuse.transport=uring: io_uring does not work here ({}); serving through /dev/fuse",
                   probe.message());
    }
  }
  StartKeeperLink(cfg, false);
  StartInvalidator();
  RaiseReadaheadOf(mountpoint_);
  conn_minor_ = FuseConnection(mountpoint_).value_or(0);  // just mounted here: this connection
  StartLoop();
  return Status::OK();
}

// A predecessor's connection (`got`; from the keeper when it died): its state applied, its files
// open for writing and io_uring entries adopted, then serving; the predecessor is told when it may
// let go.
Status FuseMountImpl::Adopt(const Config& cfg, HandoverReceived* got, bool from_keeper) {
  const rpc::FuseConnectionState& st = got->msg.state();
  mountpoint_ = st.mountpoint();
  fs_->taken_over = true;
  fs_->mode = static_cast<OpenMode>(st.mode());
  if (fs_->mode != fs_->wanted && !(fs_->wanted == OpenMode::kPassthrough && !fs_->wanted_explicitly)) {
    fs_->fallback_reason = "the predecessor's";
  }
  if (!fs_->wanted_explicitly && fs_->wanted == OpenMode::kPassthrough) fs_->wanted = fs_->mode.load();
  if (st.passthrough_refused()) fs_->passthrough->SetRefused();
  conn_minor_ = st.minor() != 0 ? st.minor() : FuseConnection(mountpoint_).value_or(0);
  // Open-free: never writable without a replacement (fuse/mount_replace.cc). The keeper's copy of
  // the state may predate the connection going open-free (its deposit is refreshed from a thread),
  // and in the kernel mode only an open-free connection has a read-only superblock (or one that fell
  // back from passthrough, which is safe to treat as one: it answers ENOSYS from now on), so a
  // read-only superblock counts too. Taking an open-free connection for one that is not would let
  // writes through a connection that sends no OPEN; the other way round costs nothing.
  bool open_free = st.open_free();
  if (!open_free && cfg.fuse.writes && fs_->mode == OpenMode::kKernel) {
    auto ro = SuperblockMode::ReadOnlyNow(mountpoint_);
    open_free = ro.ok() && *ro;
  }
  conn_->open_free = open_free;
  if (cfg.fuse.writes) {
    const bool replaceable =
        CanReplaceConnection(cfg) && fs_->mode == OpenMode::kKernel && st.uring_payload() == 0;
    fs_->sb_mode.Adopt(mountpoint_, open_free);
    if (replaceable) fs_->sb_mode.SetReplacer([this] { return ReplaceConnection(); });
  }
  RETURN_IF_ERROR(InstallIo(got->fd, st.init_request()));
  io_->SetNegotiated(st.passthrough_negotiated());
  ApplyState(st);
  AdoptWriteFiles(got);
  io_->SetUring(st.uring_payload());
  StartKeeperLink(cfg, true);
  // Adopted backing files this process could not lease again are let go before any open can
  // reuse one (the keeper link queues their closes until it has deposited: fuse/handover.h).
  fs_->passthrough->LetGoUnleased();
  StartInvalidator();
  StartLoop();
  const bool adopting = AdoptUring(got);
  TellPredecessor(got, adopting);
  if (got->ring_fd >= 0) {  // ring memory of a connection this process does not serve through io_uring
    close(got->ring_fd);
    got->ring_fd = -1;
  }
  spdlog::info("took over the FUSE connection of {} from {} ({} mode, {} open files, {} backing files)", mountpoint_,
               from_keeper ? "the keeper (the previous granary-fuse died)" : st.sender(), ModeName(fs_->mode),
               st.handles_size(), st.backings_size());
  // Requests a dead predecessor had read and not answered: the kernel sends them again.
  if (from_keeper) {
    Status rs = io_->NotifyResend();
    if (!rs.ok()) {
      spdlog::warn("{}: requests the previous granary-fuse had read and not answered fail with EIO", rs.message());
    }
  }
  return Status::OK();
}

// The predecessor's files open for writing go on here.
void FuseMountImpl::AdoptWriteFiles(HandoverReceived* got) {
  if (got->write_files.empty()) return;
  auto writes = fs_->Writes();
  if (!writes.ok()) {
    spdlog::error("the {} file(s) open for writing that came with the hand-over cannot go on ({}); their writers "
                  "get EIO", got->write_files.size(), writes.status().message());
    return;
  }
  for (HandoverReceived::WriteFile& w : got->write_files) {
    (*writes)->Restore(w.file, w.fd, w.conn);
    w.fd = w.conn = -1;
  }
  spdlog::info("took over {} file(s) open for writing", got->write_files.size());
}

// A connection the kernel queues to io_uring: entries must be registered, whatever this process's
// fuse.transport says, once libfuse has the replayed INIT (it answers EIO to anything before). The
// predecessor's entries, with what they hold, are adopted when their memory came along (true).
bool FuseMountImpl::AdoptUring(HandoverReceived* got) {
  if (io_->uring_payload() == 0) return false;
  if (!io_->WaitInitReplayed(std::chrono::seconds(10))) spdlog::warn("the replayed INIT was not processed in 10 s");
  const rpc::FuseConnectionState& st = got->msg.state();
  UringQueues::Memory theirs{got->ring_fd, st.uring_memory_base(), st.uring_memory_bytes()};
  got->ring_fd = -1;
  if (theirs.fd >= 0 && theirs.base == 0) {
    close(theirs.fd);
    theirs.fd = -1;
  }
  const bool adopting = theirs.fd >= 0;
  StartUring(io_->uring_payload(), adopting ? &theirs : nullptr);
  // Requests that came while no entry was registered (a predecessor that died) wait in their
  // CPU's queue, and only a commit on that queue fetches them, not a registration: one request
  // of our own on each CPU's queue makes that commit (bench/fuse_uring_adopt.sh found it).
  if (uring()) UringQueues::GetattrFromEachCpu(mountpoint_, 1, /*wait=*/true);
  return adopting;
}

// The predecessor (still connected: got->peer) waits to let go: of its backing files' leases until
// we hold ours (ApplyState took them), or of its parked io_uring entries until we serve.
void FuseMountImpl::TellPredecessor(HandoverReceived* got, bool adopting) {
  if (got->peer < 0) return;
  rpc::HandoverMessage m;
  if (got->msg.state().uring_payload() == 0) {
    m.set_kind(rpc::HandoverMessage::LEASED);
  } else {
    std::shared_ptr<UringQueues> ring = uring();
    if (ring && (!adopting || ring->adopted())) {
      m.set_kind(rpc::HandoverMessage::RINGS_READY);
      if (adopting) spdlog::info("adopted {} requests held in the predecessor's io_uring entries", ring->adopted_requests());
    } else {  // it keeps serving the ring: without entries every request would wait
      m.set_kind(rpc::HandoverMessage::REFUSED);
      m.set_text(ring ? "the successor could not map the io_uring entries' memory at the same address"
                      : "the successor could not register io_uring entries");
    }
  }
  (void)SendHandover(got->peer, m);
  close(got->peer);
  got->peer = -1;
}

// A fresh mount: the mount point exists and is a directory; a stale mount left by a crashed
// predecessor with no keeper ("Transport endpoint is not connected") is cleared.
Status FuseMountImpl::CheckMountPoint() {
  char real[PATH_MAX];
  struct stat st {};
  // A dead FUSE mount (its daemon killed) may still answer stat() from the kernel's attribute
  // cache; statfs() always asks the daemon, so it is what tells a dead mount apart.
  struct statvfs probe {};
  bool dead = statvfs(mountpoint_.c_str(), &probe) != 0 && (errno == ENOTCONN || errno == ECONNABORTED);
  if (dead || stat(mountpoint_.c_str(), &st) != 0) {
    if (dead || errno == ENOTCONN || errno == ECONNABORTED) {
      spdlog::warn("clearing a stale mount at {} (Transport endpoint is not connected)", mountpoint_);
      Unmount(mountpoint_);
      umount2(mountpoint_.c_str(), MNT_DETACH);
    }
    if (stat(mountpoint_.c_str(), &st) != 0) {
      if (errno == ENOENT) {
        return NotFoundError("mount point " + mountpoint_ + " does not exist (create it with mkdir -p " +
                             mountpoint_ + ")");
      }
      return ErrnoError(errno, "mount point " + mountpoint_);
    }
  }
  if (!S_ISDIR(st.st_mode)) return InvalidArgumentError("mount point " + mountpoint_ + " is not a directory");
  if (realpath(mountpoint_.c_str(), real) != nullptr) mountpoint_ = real;
  return Status::OK();
}

void FuseMountImpl::StartLoop() {
  loop_cfg_ = fuse_loop_cfg_create();
  fuse_loop_cfg_set_max_threads(loop_cfg_, static_cast<unsigned>(fs_->cfg.fuse.max_threads));
  // A few idle threads only: the kernel hands requests to waiting threads in turn, so more idle
  // threads means colder ones (keeping all 16 cut warm passthrough opens from 66 k to 40-51 k/s).
  fuse_loop_cfg_set_idle_threads(loop_cfg_, std::min<unsigned>(static_cast<unsigned>(fs_->cfg.fuse.max_threads), 4));
  loop_done_ = false;
  loop_ = std::thread([this, se = se_, cfg = loop_cfg_] { RunLoop(se, cfg); });
}

void FuseMountImpl::RunLoop(fuse_session* se, fuse_loop_config* cfg) {
  int rc = fuse_session_loop_mt(se, cfg);
  if (LoopEnded(se) || se != current_se_.load()) return;  // a replaced connection, or one never used
  loop_done_ = true;
  if (!stopping_ && !handing_over_) {
    spdlog::warn("the FUSE mount at {} went away (rc {}); stopping", mountpoint_, rc);
    Shutdown::Request("FUSE mount removed");
  }
}

void FuseMountImpl::StartInvalidator() {
  {
    MutexLock lock(&fs_->inval_mu);
    fs_->inval_stop = false;
  }
  fs_->inval_thread = std::thread([fs = fs_.get()] { fs->InvalidateLoop(); });
}
void FuseMountImpl::StopInvalidator() {
  {
    MutexLock lock(&fs_->inval_mu);
    fs_->inval_stop = true;
  }
  fs_->inval_cv.notify_all();
  if (fs_->inval_thread.joinable()) fs_->inval_thread.join();
}

void FuseMountImpl::Shutdown() {
  stopping_ = true;
  if (responder_.joinable()) responder_.join();
  MutexLock lock(&stop_mu_);
  if (fs_) {
    StopMetrics();
    if (!handed_over_) RemoveEndpoints();
  }
  if (se_ == nullptr) return;
  if (listen_fd_ >= 0) {
    close(listen_fd_);
    listen_fd_ = -1;
    unlink(handover_path_.c_str());
  }
  // Replaced connections still draining: those handed over are the successor's (our copies go);
  // the others end with this process (their users get ENOTCONN rather than wait on nobody).
  EndDraining();
  if (handed_over_) {
    // The successor serves the mount: leave it, and close only our copy of the connection (after
    // our io_uring threads, which use the session, if the successor could not take the ring).
    if (auto q = uring()) q->Stop();
    fuse_session_destroy(se_);
    se_ = nullptr;
    if (loop_cfg_) fuse_loop_cfg_destroy(loop_cfg_);
    loop_cfg_ = nullptr;
    spdlog::info("left {} to its successor", mountpoint_);
    return;
  }
  // Stopped for good: the keeper lets the connection go, and the mount goes.
  if (fs_->keeper) fs_->keeper->Release(mountpoint_);
  if (!loop_done_) {
    fuse_session_exit(se_);
    Unmount(mountpoint_);
  }
  if (loop_.joinable()) loop_.join();
  if (auto q = uring()) q->Stop();  // the unmount ended their entries
  StopInvalidator();
  fs_->keeper.reset();
  fs_->passthrough->Clear();  // the connection is gone with its backing ids
  // libfuse unmounts again unless the connection already reports an error; after our own Unmount
  // (or an umount from outside) the mount point is not a FUSE mount any more, and its umount2 only
  // printed "fuse: failed to unmount ...: Invalid argument" before "unmounted" (issue 54). The
  // descriptor is closed by fuse_session_destroy either way.
  if (mounted_ && FuseConnection(mountpoint_)) fuse_session_unmount(se_);
  fuse_session_destroy(se_);
  se_ = nullptr;
  if (loop_cfg_) fuse_loop_cfg_destroy(loop_cfg_);
  loop_cfg_ = nullptr;
  spdlog::info("unmounted {}", mountpoint_);
}

void FuseMountImpl::StartUring(size_t payload, const UringQueues::Memory* adopt) {
  auto q = UringQueues::Start(se_, io_->fd(), payload, static_cast<int>(fs_->cfg.fuse.uring_depth), adopt);
  if (!q.ok()) {
    spdlog::warn("fuse.transport=uring: {}", q.status().message());
    return;
  }
  std::shared_ptr<UringQueues> started = std::move(*q);
  spdlog::info("{}: requests come through io_uring ({} queues, {} entries)", mountpoint_, UringQueues::QueueCount(),
               started->entries());
  const int memory_fd = started->memory().fd;
  std::atomic_store(&uring_, std::move(started));
  if (fs_->keeper) fs_->keeper->SetRingMemory(memory_fd);  // a crash leaves the entries to adopt
}

}  // namespace internal

StatusOr<std::unique_ptr<FuseMount>> FuseMount::Start(const Config& cfg) {
  auto m = std::make_unique<internal::FuseMountImpl>();
  RETURN_IF_ERROR(m->Init(cfg));
  return std::unique_ptr<FuseMount>(std::move(m));
}

}  // namespace granary::fuse
