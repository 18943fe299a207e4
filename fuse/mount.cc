// FuseMount::Start and the mount's lifecycle (FuseMountImpl): a fresh mount or a connection taken
// over, the FUSE loop and the invalidation thread, hand-over, metrics, unmounting; and the table of
// operations the session runs (MakeOps; the operations are in fuse/ops_meta.cc and
// fuse/ops_read.cc).
#include "fuse/mount.h"

#include <dirent.h>
#include <poll.h>
#include <signal.h>
#include <spdlog/spdlog.h>
#include <sys/mount.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <climits>
#include <cstdlib>
#include <fstream>
#include <optional>
#include <random>
#include <sstream>
#include <string>
#include <thread>

#include <nlohmann/json.hpp>

#include "common/fs.h"
#include "common/metrics.h"
#include "common/shutdown.h"
#include "common/stream_socket.h"
#include "fuse/client.h"
#include "fuse/errno.h"
#include "fuse/file_cache.h"
#include "fuse/fs_state.h"
#include "fuse/handover.h"
#include "fuse/ops.h"
#include "fuse/session_io.h"
#include "fuse/trace.h"

namespace granary::fuse {
namespace internal {
namespace {

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

// ---- mount lifecycle ------------------------------------------------------------------------

// The minor device number of the FUSE mount at `mp` (its /sys/fs/fuse/connections entry), read
// from /proc/self/mountinfo: stat() on the mount itself would be a request to this very process,
// which hangs once its loop has stopped serving.
std::optional<unsigned> FuseConnection(const std::string& mp);

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

std::optional<unsigned> FuseConnection(const std::string& mp) {
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
      return static_cast<unsigned>(std::stoul(dev.substr(colon + 1)));
    }
  }
  return std::nullopt;
}

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

class FuseMountImpl final : public FuseMount {
 public:
  ~FuseMountImpl() override { Shutdown(); }

  Status Init(const Config& cfg) {
    mountpoint_ = cfg.fuse.mountpoint;
    RETURN_IF_ERROR(CheckKeeperSetting(cfg));
    handover_path_ = HandoverSocketPath(cfg);
    keeper_path_ = KeeperSocketPath(cfg);
    // A running granary-fuse hands its connection over (an upgrade); else a keeper holds the
    // connection of one that died (a crash). Asked before anything touches the mount point: a
    // connection nobody serves would stall our own stat() of it.
    ASSIGN_OR_RETURN(std::optional<HandoverReceived> got,
                     RequestTakeover(handover_path_, Fingerprint(cfg), std::chrono::minutes(2)));
    bool from_keeper = false;
    if (!got) {
      auto kept = WithdrawFromKeeper(keeper_path_, cfg.fuse.mountpoint);
      if (!kept.ok()) {
        spdlog::warn("the FUSE keeper: {}; mounting anew", kept.status().message());
      } else if (*kept) {
        got = std::move(*kept);
        from_keeper = true;
      }
    }
    if (got && got->msg.state().format() != kHandoverFormat) {
      close(got->fd);
      return FailedPreconditionError("the kept FUSE connection of " + cfg.fuse.mountpoint + " is in hand-over format " +
                                     std::to_string(got->msg.state().format()) + ", this granary-fuse speaks " +
                                     std::to_string(kHandoverFormat) + "; unmount it (fusermount3 -u) and start again");
    }
    if (got && got->msg.state().fingerprint() != Fingerprint(cfg)) {
      close(got->fd);
      return FailedPreconditionError("the kept FUSE connection of " + cfg.fuse.mountpoint + " was made with other " +
                                     "settings (" + got->msg.state().fingerprint() + "); start granary-fuse with the same " +
                                     "fuse.mountpoint, fuse.root, fuse.open and fuse.allow_other, or " +
                                     "unmount it first");
    }
    if (!got) RETURN_IF_ERROR(CheckMountPoint());

    fs_ = std::make_unique<Fs>();
    fs_->cfg = cfg;
    if (cfg.fuse.open == "daemon") {
      fs_->wanted = OpenMode::kDaemon;
    } else if (cfg.fuse.open == "kernel") {
      fs_->wanted = OpenMode::kKernel;
    } else {
      fs_->wanted = OpenMode::kPassthrough;  // auto: passthrough where it can work, else kernel
      fs_->wanted_explicitly = cfg.fuse.open == "passthrough";
    }
    fs_->mode = fs_->wanted.load();
    {
      std::random_device rd;
      fs_->next_fh = ((static_cast<uint64_t>(rd()) & 0x7fffff) + 1) << 40;
    }
    ASSIGN_OR_RETURN(fs_->client, Client::Create(cfg));
    fs_->files = std::make_unique<FileCache>(cfg.fuse.file_cache_entries, cfg.fuse.attr_timeout);
    fs_->entries = std::make_unique<EntryCache>(cfg.fuse.file_cache_entries,
                                                std::min(cfg.fuse.entry_timeout, cfg.fuse.attr_timeout));
    fs_->tracer = std::make_unique<Tracer>(TracePaths(fs_.get()));
    if (got) {
      fs_->root_ino = got->msg.state().root_ino();
    } else if (cfg.fuse.root != "/") {
      auto root = fs_->client->Resolve(cfg.fuse.root);
      if (!root.ok()) return root.status().WithContext("fuse.root " + cfg.fuse.root);
      if (root->type() != rpc::DIRECTORY) return InvalidArgumentError("fuse.root " + cfg.fuse.root + " is not a directory");
      fs_->root_ino = root->ino();
    }

    std::string opts = "default_permissions,ro,fsname=granary,subtype=granary";
    if (cfg.fuse.allow_other) opts += ",allow_other";
    const char* argv[] = {"granary-fuse", "-o", opts.c_str()};
    fuse_args args = FUSE_ARGS_INIT(3, const_cast<char**>(argv));
    fuse_lowlevel_ops ops = MakeOps();
    se_ = fuse_session_new(&args, &ops, sizeof ops, fs_.get());
    fuse_opt_free_args(&args);
    if (se_ == nullptr) {
      if (got) close(got->fd);
      return InternalError("cannot create the FUSE session (see the message above)");
    }
    fs_->se = se_;
    int fd = -1;
    std::string replay;
    if (got) {
      const rpc::FuseConnectionState& st = got->msg.state();
      mountpoint_ = st.mountpoint();
      fd = got->fd;
      replay = st.init_request();
      fs_->taken_over = true;
      fs_->mode = static_cast<OpenMode>(st.mode());
      if (fs_->mode != fs_->wanted && !(fs_->wanted == OpenMode::kPassthrough && !fs_->wanted_explicitly)) {
        fs_->fallback_reason = "the predecessor's";
      }
      if (!fs_->wanted_explicitly && fs_->wanted == OpenMode::kPassthrough) fs_->wanted = fs_->mode.load();
      fs_->passthrough_refused = st.passthrough_refused();
    } else {
      if (fuse_session_mount(se_, mountpoint_.c_str()) != 0) {
        fuse_session_destroy(se_);
        se_ = nullptr;
        return UnavailableError("cannot mount FUSE at " + mountpoint_ +
                                " (is /dev/fuse available, and for allow_other are you root or is user_allow_other "
                                "set in /etc/fuse.conf?)");
      }
      mounted_ = true;
      fd = fuse_session_fd(se_);
    }
    // Our own /dev/fuse I/O (session_io.h): passthrough, INIT kept and replayed, hand-over.
    auto io = SessionIo::Install(se_, fd, fs_->mode == OpenMode::kPassthrough, replay);
    if (!io.ok()) {
      if (!mounted_) close(fd);
      fuse_session_destroy(se_);
      se_ = nullptr;
      return io.status().WithContext("granary-fuse's /dev/fuse I/O");
    }
    io_ = std::move(*io);
    fs_->io = io_.get();
    if (got) {
      io_->SetNegotiated(got->msg.state().passthrough_negotiated());
      ApplyState(got->msg.state());
    }
    fs_->trim_idle = [fs = fs_.get()] {
      std::vector<std::unique_ptr<FileLease>> done;  // ended after the lock is released
      std::lock_guard<std::mutex> lock(fs->opens_mu);
      TrimIdleLocked(fs, &done);
    };
    if (!keeper_path_.empty()) {  // deposits once INIT is known
      fs_->keeper = std::make_unique<KeeperLink>(keeper_path_, cfg.fuse.keeper == "spawn", io_->fd(),
                                                 [this] { return Snapshot(false); },
                                                 [io = io_.get()](int id) { io->CloseBacking(id); }, got.has_value());
    }
    StartInvalidator();
    if (!got) RaiseReadaheadOf(mountpoint_);
    StartLoop();
    if (got) {
      spdlog::info("took over the FUSE connection of {} from {} ({} mode, {} open files, {} backing files)", mountpoint_,
                   from_keeper ? "the keeper (the previous granary-fuse died)" : got->msg.state().sender(),
                   ModeName(fs_->mode), got->msg.state().handles_size(), got->msg.state().backings_size());
      // Requests a dead predecessor had read and not answered: the kernel sends them again.
      if (from_keeper) {
        Status rs = io_->NotifyResend();
        if (!rs.ok()) {
          spdlog::warn("{}: requests the previous granary-fuse had read and not answered fail with EIO", rs.message());
        }
      }
    }
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
    StartMetrics();
    return Status::OK();
  }

  // The metrics endpoint, the access trace's root-only socket (never a network port: the trace
  // shows every reader's paths, pids and uids), and the file naming both for the CLI on this machine.
  void StartMetrics() {
    metrics_ = metrics::StartOrWarn(
        "fuse.metrics_listen", fs_->cfg.fuse.metrics_listen, [this](metrics::Exposition* e) { Render(e); },
        [this] { return Ready(); });
    char real[PATH_MAX];
    if (!trace_ && realpath(mountpoint_.c_str(), real) != nullptr) {
      // Named by pid too: a predecessor still serving its trace never removes its successor's socket.
      RemoveDeadTraceSockets(real);
      auto t = StreamSocket::Start(MountRunFile(real, "-" + std::to_string(getpid()) + ".trace.sock"),
                                   [this](const std::map<std::string, std::string>& params,
                                          StreamSink* sink) { fs_->tracer->Serve(params, sink); });
      if (t.ok()) {
        trace_ = std::move(t).value();
      } else {
        spdlog::warn("access trace off: {}", t.status().message());
      }
    }
    WriteEndpoints();
  }
  // Trace sockets of this mount point left by processes that died without stopping (kill -9).
  static void RemoveDeadTraceSockets(const std::string& mountpoint) {
    const std::string prefix = MountRunFile(mountpoint, "-");
    const std::string dir = prefix.substr(0, prefix.rfind('/'));
    const std::string stem = prefix.substr(prefix.rfind('/') + 1);
    const std::string suffix = ".trace.sock";
    DIR* d = opendir(dir.c_str());
    if (d == nullptr) return;
    while (dirent* e = readdir(d)) {
      std::string name = e->d_name;
      if (name.size() <= stem.size() + suffix.size() || name.compare(0, stem.size(), stem) != 0 ||
          name.compare(name.size() - suffix.size(), suffix.size(), suffix) != 0) {
        continue;
      }
      std::string pid = name.substr(stem.size(), name.size() - stem.size() - suffix.size());
      char* end = nullptr;
      long p = std::strtol(pid.c_str(), &end, 10);
      if (end == nullptr || *end != '\0' || p <= 0) continue;
      if (kill(static_cast<pid_t>(p), 0) != 0 && errno == ESRCH) unlink((dir + "/" + name).c_str());
    }
    closedir(d);
  }
  void StopMetrics() {
    fs_->tracer->Close();  // trace streams end, so their threads can be joined
    metrics_.reset();
    trace_.reset();
    fs_->tracer->Reopen();
  }
  // RuntimeDir()/fuse-<hash>.json: where `granary stats` and `granary trace` find this mount's
  // endpoints. A successor rewrites it; the last process to serve the mount removes it.
  void WriteEndpoints() {
    char real[PATH_MAX];
    if (realpath(mountpoint_.c_str(), real) == nullptr) return;
    endpoints_file_ = MountEndpointsFile(real);
    std::string metrics = metrics_ ? metrics_->address() : "";
    if (metrics.rfind("0.0.0.0:", 0) == 0) metrics = "127.0.0.1:" + metrics.substr(8);
    std::string worker = fs_->cfg.fuse.worker;
    nlohmann::json j = {{"mountpoint", real},          {"root", fs_->cfg.fuse.root}, {"pid", getpid()},
                        {"metrics", metrics},        {"worker", fs_->cfg.fuse.worker},
                        {"master", fs_->cfg.master.address}, {"trace", trace_ ? trace_->path() : ""}};
    Status st = WriteFileAtomic(endpoints_file_, j.dump() + "\n");  // RuntimeDir() exists once named
    if (!st.ok()) spdlog::warn("cannot write {} (granary stats will not find this mount): {}", endpoints_file_, st.message());
  }
  void RemoveEndpoints() {
    if (endpoints_file_.empty()) return;
    auto text = ReadFileToString(endpoints_file_);
    if (!text.ok()) return;
    auto j = nlohmann::json::parse(*text, nullptr, false);
    if (j.is_object() && j.value("pid", 0) == getpid()) unlink(endpoints_file_.c_str());
  }

  // A fresh mount: the mount point exists and is a directory; a stale mount left by a crashed
  // predecessor with no keeper ("Transport endpoint is not connected") is cleared.
  Status CheckMountPoint() {
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

  void StartLoop() {
    loop_cfg_ = fuse_loop_cfg_create();
    fuse_loop_cfg_set_max_threads(loop_cfg_, static_cast<unsigned>(fs_->cfg.fuse.max_threads));
    // A few idle threads only: the kernel hands requests to waiting threads in turn, so more idle
    // threads means colder ones (keeping all 16 cut warm passthrough opens from 66 k to 40-51 k/s).
    fuse_loop_cfg_set_idle_threads(loop_cfg_, std::min<unsigned>(static_cast<unsigned>(fs_->cfg.fuse.max_threads), 4));
    loop_done_ = false;
    loop_ = std::thread([this] {
      int rc = fuse_session_loop_mt(se_, loop_cfg_);
      loop_done_ = true;
      if (!stopping_ && !handing_over_) {
        spdlog::warn("the FUSE mount at {} went away (rc {}); stopping", mountpoint_, rc);
        Shutdown::Request("FUSE mount removed");
      }
    });
  }

  void StartInvalidator() {
    {
      std::lock_guard<std::mutex> lock(fs_->inval_mu);
      fs_->inval_stop = false;
    }
    fs_->inval_thread = std::thread([fs = fs_.get()] { fs->InvalidateLoop(); });
  }
  void StopInvalidator() {
    {
      std::lock_guard<std::mutex> lock(fs_->inval_mu);
      fs_->inval_stop = true;
    }
    fs_->inval_cv.notify_all();
    if (fs_->inval_thread.joinable()) fs_->inval_thread.join();
  }

  // What a successor needs (with_handles: a hand-over; without: a deposit with the keeper, which
  // learns backing ids and passthrough mode's daemon-served handles as they change).
  rpc::FuseConnectionState Snapshot(bool with_handles) {
    rpc::FuseConnectionState st;
    st.set_format(kHandoverFormat);
    st.set_mountpoint(mountpoint_);
    st.set_init_request(io_->init_request());
    st.set_mode(static_cast<uint32_t>(fs_->mode.load()));
    st.set_passthrough_negotiated(io_->negotiated());
    st.set_root_ino(fs_->root_ino);
    st.set_fingerprint(Fingerprint(fs_->cfg));
    st.set_sender("granary-fuse pid " + std::to_string(getpid()));
    st.set_passthrough_refused(fs_->passthrough_refused);
    {
      // handles_mu before opens_mu (as ApplyState): counted_cached is written under opens_mu.
      std::lock_guard<std::mutex> hlock(fs_->handles_mu);
      std::lock_guard<std::mutex> lock(fs_->opens_mu);
      for (const auto& [kino, o] : fs_->opens) {
        if (o.backing_id <= 0) continue;
        rpc::FuseBacking* b = st.add_backings();
        b->set_kino(kino);
        b->set_backing_id(o.backing_id);
        *b->mutable_info() = o.info;
        b->set_passthrough(o.passthrough);
        b->set_idle(o.idle_seq != 0);
      }
      // A hand-over carries every handle; a deposit only the daemon-served opens of passthrough
      // mode (the keeper learns the rest of them as they change, fuse/handover.h).
      if (with_handles) st.set_next_fh(fs_->next_fh);
      for (const auto& [fh, of] : fs_->handles) {
        if (!with_handles && !of->counted_cached) continue;
        *st.add_handles() = fs_->HandleOf(fh, *of);
      }
    }
    return st;
  }

  // A successor's side of Snapshot: the handles and backing ids of the connection it took over.
  void ApplyState(const rpc::FuseConnectionState& st) {
    // After a crash the keeper does not know how many files are open on a backing id: it stays
    // registered (and reused by reopens of that version) until the mount ends.
    constexpr int kUnknownOpens = 1 << 30;
    for (const rpc::FuseBacking& b : st.backings()) {
      InodeOpens o;
      o.backing_id = b.backing_id();
      o.info = b.info();
      o.version = b.info().version();
      o.bytes = b.info().attr().size();
      o.passthrough = b.passthrough() < 0 ? kUnknownOpens : b.passthrough();
      // Our own lease keeps the worker from evicting the data file under the kernel's reads (the
      // kernel holds the file it opened either way, so bytes stay right without one).
      auto lease = fs_->client->LeaseFile(b.info());
      if (lease.ok()) o.lease = std::move(*lease);
      std::lock_guard<std::mutex> lock(fs_->opens_mu);
      if (b.idle() && o.passthrough == 0) {
        o.idle_seq = fs_->idle_next++;
        o.idle_since = std::chrono::steady_clock::now();
        fs_->idle.emplace(o.idle_seq, b.kino());
        fs_->idle_bytes += o.bytes;
      }
      fs_->opens[b.kino()] = std::move(o);
    }
    std::lock_guard<std::mutex> lock(fs_->handles_mu);
    if (st.next_fh() > 0) fs_->next_fh = st.next_fh();
    for (const rpc::FuseHandle& h : st.handles()) {
      auto of = std::make_shared<OpenFile>();
      of->info = h.info();
      of->passthrough = h.passthrough();
      of->counted_cached = h.counted_cached();
      if (of->counted_cached) {
        std::lock_guard<std::mutex> l2(fs_->opens_mu);
        fs_->opens[h.kino()].cached++;
      }
      fs_->handles.emplace(h.fh(), std::move(of));
      // A hand-over's numbering goes on; a keeper's handles are a dead predecessor's, whose
      // other numbers (not listed) may still be open: this process keeps its own epoch.
      if (st.next_fh() > 0) fs_->next_fh = std::max(fs_->next_fh, h.fh() + 1);
    }
  }

  // Serves the hand-over socket: a successor's TAKEOVER.
  void RespondLoop() {
    while (!stopping_ && !handed_over_) {
      pollfd p{listen_fd_, POLLIN, 0};
      if (poll(&p, 1, 500) <= 0) continue;
      int c = accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
      if (c < 0) continue;
      auto m = ReceiveHandover(c, std::chrono::seconds(5));
      if (m.ok() && m->msg.kind() == rpc::HandoverMessage::TAKEOVER) HandOver(c, m->msg);
      if (m.ok() && m->fd >= 0) close(m->fd);
      close(c);
    }
  }

  void HandOver(int c, const rpc::HandoverMessage& m) {
    auto refuse = [&](const std::string& why) {
      rpc::HandoverMessage r;
      r.set_kind(rpc::HandoverMessage::REFUSED);
      r.set_text(why);
      (void)SendHandover(c, r);
      spdlog::warn("refused to hand {} over: {}", mountpoint_, why);
    };
    if (m.format() != kHandoverFormat) {
      return refuse("the successor speaks hand-over format " + std::to_string(m.format()) + " and this granary-fuse " +
                    std::to_string(kHandoverFormat) + "; stop this one (SIGTERM unmounts) and start the new one");
    }
    std::string mine = Fingerprint(fs_->cfg);
    if (m.fingerprint() != mine) {
      return refuse("the successor's settings (" + m.fingerprint() + ") differ from this mount's (" + mine +
                    "); start it with the same fuse.mountpoint, fuse.root, fuse.open and fuse.allow_other");
    }
    std::lock_guard<std::mutex> lock(stop_mu_);
    if (stopping_ || loop_done_) return refuse("this granary-fuse is stopping");
    auto start = std::chrono::steady_clock::now();
    handing_over_ = true;
    // Its port is the successor's when both share a network namespace. A process that stays idle
    // (Kubernetes, each pod its own network) keeps answering probes: /readyz says "handed over".
    if (fs_->cfg.fuse.exit_after_handover) StopMetrics();
    io_->Drain(se_);   // every request read is answered; nothing more is read
    if (loop_.joinable()) loop_.join();
    StopInvalidator();
    rpc::HandoverMessage out;
    out.set_kind(rpc::HandoverMessage::STATE);
    *out.mutable_state() = Snapshot(true);
    close(listen_fd_);  // the successor listens on the same path
    listen_fd_ = -1;
    Status st = SendHandover(c, out, io_->fd());
    if (!st.ok()) {
      spdlog::warn("handing {} over failed ({}); serving on", mountpoint_, st.message());
      io_->Resume();
      fuse_session_reset(se_);
      handing_over_ = false;
      StartInvalidator();
      StartLoop();
      auto listener = ListenLocal(handover_path_);
      if (listener.ok()) listen_fd_ = *listener;
      if (!metrics_) StartMetrics();
      return;
    }
    handed_over_ = true;
    if (fs_->keeper) fs_->keeper->Stop();  // the successor deposits with the keeper; it keeps ours meanwhile
    {
      // The successor registered its own leases; ours end. The backing ids are the successor's now.
      std::lock_guard<std::mutex> l2(fs_->opens_mu);
      fs_->opens.clear();
      fs_->idle.clear();
    }
    spdlog::info("handed {} over ({} open files, {} backing files) in {} ms", mountpoint_, out.state().handles_size(),
                 out.state().backings_size(),
                 std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - start).count());
    if (fs_->cfg.fuse.exit_after_handover) {
      Shutdown::Request("handed the mount over to a successor");
    } else {
      spdlog::info("fuse.exit_after_handover is false: idle until stopped (SIGTERM leaves the mount to the successor)");
    }
  }

  std::string address() const override { return mountpoint_; }
  std::string metrics_address() const override { return metrics_ ? metrics_->address() : ""; }

  void Render(metrics::Exposition* e) {
    fs_->op_latency.Write(e, "granary_fuse_operation_duration_seconds",
                          "Time granary-fuse took to answer a kernel request, by operation.");
    e->Family("granary_fuse_errors_total", "counter", "Error replies to the kernel, by operation and errno.");
    for (const auto& [k, n] : ErrorCounts()) {
      e->Sample("granary_fuse_errors_total", {{"op", k.first}, {"errno", k.second}}, static_cast<double>(n));
    }
    e->Counter("granary_fuse_read_bytes_total", "Bytes returned to readers.", static_cast<double>(fs_->read_bytes));
    const ClientCounters& c = fs_->client->counters();
    e->Family("granary_fuse_read_pieces_total", "counter",
              "Pieces of reads by how they came: zero_copy (a leased block file from the local worker), "
              "local (the local worker over gRPC), failover (another worker, the local one being down).");
    e->Sample("granary_fuse_read_pieces_total", {{"source", "zero_copy"}}, static_cast<double>(c.zero_copy_pieces));
    e->Sample("granary_fuse_read_pieces_total", {{"source", "local"}}, static_cast<double>(c.local_grpc_pieces));
    e->Sample("granary_fuse_read_pieces_total", {{"source", "failover"}}, static_cast<double>(c.failover_pieces));
    e->Counter("granary_fuse_prefetch_hints_total", "Readahead hints sent to workers.",
               static_cast<double>(c.prefetch_hints));
    e->Counter("granary_fuse_worker_waits_total",
               "Reads that found no worker able to serve them and waited for one (fuse.worker_wait).",
               static_cast<double>(c.worker_waits));
    e->Counter("granary_fuse_worker_waits_ended_total", "Of those, the reads whose wait ended with their bytes.",
               static_cast<double>(c.worker_waits_ended));
    e->Gauge("granary_fuse_keeper_holds", "1 while a keeper holds a copy of the FUSE connection (fuse.keeper).",
             fs_->keeper && fs_->keeper->deposited() ? 1 : 0);
    e->Gauge("granary_fuse_mounted", "1 while the mount is served.", loop_done_ ? 0 : 1);
    e->Family("granary_fuse_open_mode", "gauge",
              "The connection's read mode (fuse.open): 1 for the mode in force. fallback=\"1\" when it is not the "
              "mode asked for (the log says why).");
    bool fallback = fs_->mode != fs_->wanted || fs_->passthrough_refused;
    for (OpenMode m : {OpenMode::kDaemon, OpenMode::kKernel, OpenMode::kPassthrough}) {
      e->Sample("granary_fuse_open_mode", {{"mode", ModeName(m)}, {"fallback", fallback ? "1" : "0"}},
                fs_->mode == m ? 1 : 0);
    }
    e->Family("granary_fuse_opens_total", "counter",
              "Opens by how they were served: passthrough (the kernel reads the cache data file), daemon "
              "(granary-fuse serves the reads), kernel (answered once with ENOSYS; later opens never reach "
              "granary-fuse).");
    e->Sample("granary_fuse_opens_total", {{"mode", "passthrough"}}, static_cast<double>(fs_->opens_passthrough));
    e->Sample("granary_fuse_opens_total", {{"mode", "daemon"}}, static_cast<double>(fs_->opens_daemon));
    e->Sample("granary_fuse_opens_total", {{"mode", "kernel"}}, static_cast<double>(fs_->opens_kernel));
    e->Counter("granary_fuse_passthrough_misses_total",
               "Opens in passthrough mode served by granary-fuse instead: the file is empty, not wholly cached "
               "on this node's worker in one cache directory, or its inode is open in the other io mode.",
               static_cast<double>(fs_->passthrough_misses));
    e->Counter("granary_fuse_reads_by_inode_total", "Reads that came with no open file (kernel mode).",
               static_cast<double>(fs_->reads_by_inode));
    e->Counter("granary_fuse_invalidations_total", "Files whose cached pages were dropped for a new version.",
               static_cast<double>(fs_->invalidations));
    e->Family("granary_fuse_mount_read_bytes_total", "counter",
              "Bytes granary-fuse returned to readers per mount id, by where they came from: local (this node's "
              "worker cache), peer (another worker), under_storage. Reads the kernel serves itself (page cache, "
              "passthrough) are not seen here.");
    {
      std::lock_guard<std::mutex> lock(fs_->mount_bytes_mu);
      for (const auto& [mount, b] : fs_->mount_bytes) {
        for (size_t i = 0; i < 3; ++i) {
          e->Sample("granary_fuse_mount_read_bytes_total",
                    {{"mount", std::to_string(mount)}, {"source", NodeSourceName(static_cast<NodeSource>(i))}},
                    static_cast<double>(b[i]));
        }
      }
    }
    e->Family("granary_fuse_master_call_duration_seconds", "histogram",
              "Round trip of granary-fuse's metadata calls to the master.");
    fs_->client->master_latency().Write(e, "granary_fuse_master_call_duration_seconds", {});
    e->Counter("granary_fuse_files_read_total", "Reads at offset 0 granary-fuse served: files readers started on.",
               static_cast<double>(fs_->files_read));
    e->Counter("granary_fuse_trace_records_total",
               "Access-trace records made (only while a `granary trace` listens; 0 means tracing cost nothing).",
               static_cast<double>(fs_->tracer->records()));
    e->Counter("granary_fuse_trace_dropped_total", "Access-trace records a slow listener missed.",
               static_cast<double>(fs_->tracer->dropped()));
    metrics::WriteProcessMetrics(e);
  }

  // Ready while serving the mount and the master answers.
  Status Ready() {
    if (handed_over_) return UnavailableError("handed the mount at " + mountpoint_ + " over to a successor");
    if (loop_done_) return UnavailableError("the mount at " + mountpoint_ + " is gone");
    auto root = fs_->client->Resolve("/");
    if (!root.ok()) return root.status().WithContext("the master");
    return Status::OK();
  }

  void Shutdown() override {
    stopping_ = true;
    if (responder_.joinable()) responder_.join();
    std::lock_guard<std::mutex> lock(stop_mu_);
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
    if (handed_over_) {
      // The successor serves the mount: leave it, and close only our copy of the connection.
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
    StopInvalidator();
    fs_->keeper.reset();
    fs_->opens.clear();  // the leases end; the connection is gone with its backing ids
    fs_->idle.clear();
    if (mounted_) fuse_session_unmount(se_);
    fuse_session_destroy(se_);
    se_ = nullptr;
    if (loop_cfg_) fuse_loop_cfg_destroy(loop_cfg_);
    loop_cfg_ = nullptr;
    spdlog::info("unmounted {}", mountpoint_);
  }

 private:
  std::string mountpoint_;
  std::string endpoints_file_;
  std::string handover_path_, keeper_path_;
  int listen_fd_ = -1;
  std::thread responder_;
  std::atomic<bool> handing_over_{false};
  std::atomic<bool> handed_over_{false};
  std::unique_ptr<Fs> fs_;
  std::unique_ptr<SessionIo> io_;
  fuse_session* se_ = nullptr;
  fuse_loop_config* loop_cfg_ = nullptr;
  bool mounted_ = false;
  std::thread loop_;
  std::atomic<bool> loop_done_{false};
  std::atomic<bool> stopping_{false};
  std::mutex stop_mu_;
  std::unique_ptr<metrics::MetricsServer> metrics_;
  std::unique_ptr<StreamSocket> trace_;  // the access trace, for root and this user only
};

}  // namespace
}  // namespace internal

StatusOr<std::unique_ptr<FuseMount>> FuseMount::Start(const Config& cfg) {
  auto m = std::make_unique<internal::FuseMountImpl>();
  RETURN_IF_ERROR(m->Init(cfg));
  return std::unique_ptr<FuseMount>(std::move(m));
}

}  // namespace granary::fuse
