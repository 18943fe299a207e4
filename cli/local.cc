#include "cli/local.h"

#include <spdlog/spdlog.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include <climits>
#include <cstdio>
#include <cstdlib>
#include <set>

#include "cli/cli.h"
#include "common/fs.h"
#include "common/logging.h"
#include "common/net.h"
#include "common/shutdown.h"
#include "ufs/access.h"
#include "ufs/mount_table.h"
#include "ufs/ufs.h"
#include "fuse/mount.h"
#include "master/namespace.h"
#include "master/server.h"
#include "proto/granary.grpc.pb.h"
#include "rpc/rpc.h"
#include "worker/server.h"

namespace granary::cli {
namespace {

void SetDefault(Config* cfg, const std::string& key, const std::string& value) {
  if (!cfg->IsExplicit(key)) {
    Status st = cfg->Set(key, value, "granary local");
    st.IgnoreError();  // values below are well-formed by construction
  }
}

std::string DefaultName(const std::string& uri) {
  auto p = ParseUri(uri);
  std::string path = p.ok() ? p->path : uri;
  while (!path.empty() && path.back() == '/') path.pop_back();
  std::string name = path.substr(path.rfind('/') + 1);
  if (name.empty() && p.ok()) name = p->authority;
  return "/" + (IsValidName(name) ? name : std::string("data"));
}

// Whether a mount's under-storage is gone (its root answers NOT_FOUND). Anything else, such as an
// unreachable server, is not proof: the mount is kept.
bool SourceGone(const rpc::MountInfo& m) {
  // What this state directory's own user mounted before: only whether it is still there matters.
  auto opened = OpenMount(m.uri(), {m.options().begin(), m.options().end()}, UfsAccess::Unrestricted());
  if (!opened.ok()) return opened.status().IsNotFound();
  auto root = opened->ufs->Stat("");
  return !root.ok() && root.status().IsNotFound();
}

// Mounts `uri` in this state directory's namespace and returns the path it is served under.
// `name` was given with --name (`named`) or derived from the URI's last segment. A path already
// mounted from the same URI is reused (an earlier run with the same --dir). A derived name taken by
// another source is replaced when that source is gone, else the next free "<name>-2", "<name>-3"...
// is used, so serving another dataset with the same folder name just works. A --name taken by
// another source is a real conflict: ALREADY_EXISTS.
StatusOr<std::string> EnsureMounted(const Config& cfg, const std::string& name, bool named, const std::string& uri,
                                    const std::map<std::string, std::string>& options) {
  ASSIGN_OR_RETURN(auto sec, RpcSecurity::FromConfig(cfg.rpc));
  auto stub = rpc::Master::NewStub(sec->MakeChannel(cfg.master.address));
  rpc::ListMountsResponse mounts;
  {
    grpc::ClientContext ctx;
    sec->Prepare(&ctx, cfg.rpc.timeout);
    RETURN_IF_ERROR(FromGrpc(stub->ListMounts(&ctx, {}, &mounts), "the master"));
  }
  std::map<std::string, const rpc::MountInfo*> by_path;
  for (const auto& m : mounts.mounts()) {
    if (m.uri() == uri && (named ? m.path() == name : m.path().rfind(name, 0) == 0)) return m.path();
    by_path[m.path()] = &m;
  }
  std::string path = name;
  for (int n = 2; by_path.count(path); ++n) {
    const rpc::MountInfo& taken = *by_path[path];
    if (named) {
      return AlreadyExistsError(name + " is already mounted from " + RedactUri(taken.uri()) +
                                " in this state directory; choose another --name or another --dir");
    }
    if (SourceGone(taken)) {
      spdlog::info("{} was mounted from {}, which is gone; serving {} there instead", path, RedactUri(taken.uri()),
                   RedactUri(uri));
      rpc::UnmountRequest ur;
      ur.set_path(path);
      rpc::UnmountResponse uresp;
      grpc::ClientContext ctx;
      sec->Prepare(&ctx, cfg.rpc.timeout);
      RETURN_IF_ERROR(FromGrpc(stub->Unmount(&ctx, ur, &uresp), "the master"));
      break;
    }
    path = name + "-" + std::to_string(n);
  }
  rpc::MountRequest req;
  req.set_path(path);
  req.set_uri(uri);
  req.mutable_options()->insert(options.begin(), options.end());
  rpc::MountResponse resp;
  grpc::ClientContext ctx;
  sec->Prepare(&ctx, cfg.rpc.timeout);
  RETURN_IF_ERROR(FromGrpc(stub->Mount(&ctx, req, &resp), "the master"));
  return path;
}

// A fresh token for this run's daemons, in `dir` (0700, this user's): <dir>/token, 0600. Only this
// user can read it, so only this user's CLI reaches the loopback master and worker: `granary local`
// run as root does not make every local user root through them (docs/security.md).
StatusOr<std::string> MakeInstanceToken(const std::string& dir) {
  unsigned char raw[32];
  size_t got = 0;
  while (got < sizeof raw) {
    ssize_t n = getrandom(raw + got, sizeof raw - got, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return ErrnoError(errno, "getrandom for the instance token");
    got += static_cast<size_t>(n);
  }
  static const char kHex[] = "0123456789abcdef";
  std::string token;
  for (unsigned char c : raw) {
    token += kHex[c >> 4];
    token += kHex[c & 15];
  }
  const std::string path = dir + "/token";
  RETURN_IF_ERROR(WriteFileAtomic(path, token + "\n"));
  return path;
}

// The metrics endpoint of a `granary local` daemon: the usual port when it is free, else one the
// kernel picks (a second instance on this machine; the banner and the discovery file say which).
std::string LocalMetricsListen(int usual) {
  const std::string address = "127.0.0.1:" + std::to_string(usual);
  return CheckCanListen(address).ok() ? address : "127.0.0.1:0";
}

// The pid a running `granary local` wrote in this GRANARY_HOME's discovery file ("# pid N"), for
// messages; 0 when none is written.
pid_t DiscoveryPid(const std::string& discovery) {
  auto text = ReadFileToString(discovery);
  if (!text.ok()) return 0;
  size_t at = text->find("# pid ");
  return at == std::string::npos ? 0 : static_cast<pid_t>(std::strtol(text->c_str() + at + 6, nullptr, 10));
}

// One `granary local` per GRANARY_HOME (the CLI finds it through the home's discovery file): an
// exclusive lock on <home>/local.lock, held by the returned descriptor for the life of the
// process (the kernel lets it go when the process ends, however it ends: no stale pid to trust).
StatusOr<int> LockHome() {
  RETURN_IF_ERROR(MakeDirs(GranaryHome(), 0700));
  const std::string path = GranaryHome() + "/local.lock";
  int fd = open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
  if (fd < 0) return ErrnoError(errno, "open " + path);
  if (flock(fd, LOCK_EX | LOCK_NB) == 0) return fd;
  const int err = errno;
  close(fd);
  if (err != EWOULDBLOCK) return ErrnoError(err, "lock " + path);
  const pid_t other = DiscoveryPid(LocalDiscoveryFile());
  return FailedPreconditionError("another granary local" + (other > 0 ? " (pid " + std::to_string(other) + ")" : std::string()) +
                                 " is serving from " + GranaryHome() + " (granary commands find it through " +
                                 LocalDiscoveryFile() + "); stop it, or give this one its own GRANARY_HOME");
}

}  // namespace

int RunLocal(const LocalOptions& opts, Config cfg) {
  auto fail = [](const Status& st) {
    std::fprintf(stderr, "granary: error: %s\n", st.message().c_str());
    return 1;
  };
  std::string dir = opts.dir.empty() ? GranaryHome() + "/local" : opts.dir;
  std::string name = opts.name.empty() ? DefaultName(opts.uri) : opts.name;
  if (name.empty() || name[0] != '/') name = "/" + name;
  auto parsed = ParseUri(opts.uri);
  if (!parsed.ok()) return fail(parsed.status());
  // `granary local` serves what its own user names: its source is allowed (ufs.local_roots), and so
  // is the directory of its credential files when they share one (ufs.secrets_dir). Another user of
  // this machine reaching the loopback master can mount nothing else.
  if (parsed->scheme == "file") SetDefault(&cfg, "ufs.local_roots", parsed->path);
  std::set<std::string> secret_dirs;
  for (const auto& [key, file] : CredentialFiles(opts.options)) {
    char real[PATH_MAX];
    std::string r = realpath(file.c_str(), real) ? real : file;
    secret_dirs.insert(r.substr(0, r.rfind('/')));
  }
  if (secret_dirs.size() == 1) SetDefault(&cfg, "ufs.secrets_dir", *secret_dirs.begin());
  auto access = UfsAccess::FromConfig(cfg);
  if (!access.ok()) return fail(access.status());
  {
    // Fail before starting anything when the under-storage is not there.
    auto opened = OpenMount(opts.uri, opts.options, *access);
    if (!opened.ok()) return fail(opened.status());
  }
  if (!IsDirectory(opts.mountpoint)) {
    return fail(NotFoundError("mount point " + opts.mountpoint + " does not exist (create it with mkdir -p " +
                              opts.mountpoint + ")"));
  }
  Status st = MakeDirs(dir, 0700);
  if (!st.ok()) return fail(st.WithContext("--dir"));
  // It holds the instance token and the namespace: this user's alone, even when it existed wider.
  {
    struct stat ds;
    if (stat(dir.c_str(), &ds) == 0 && ds.st_uid == geteuid() && (ds.st_mode & 077) != 0 && chmod(dir.c_str(), 0700) != 0) {
      return fail(ErrnoError(errno, "--dir: chmod 0700 " + dir));
    }
    if (stat(dir.c_str(), &ds) == 0 && (ds.st_uid != geteuid() || (ds.st_mode & 022) != 0)) {
      char mode[8];
      std::snprintf(mode, sizeof mode, "%04o", static_cast<unsigned>(ds.st_mode & 07777));
      return fail(PermissionDeniedError("--dir " + dir + " is not this user's alone (owner uid " + std::to_string(ds.st_uid) +
                                        ", mode " + mode + "); give it to this user with mode 0700, or choose another --dir"));
    }
  }
  if (!cfg.IsExplicit("rpc.token_file")) {
    auto token = MakeInstanceToken(dir);
    if (!token.ok()) return fail(token.status().WithContext("--dir"));
    SetDefault(&cfg, "rpc.token_file", *token);
  }

  SetDefault(&cfg, "master.listen", "127.0.0.1:0");
  SetDefault(&cfg, "worker.listen", "127.0.0.1:0");
  SetDefault(&cfg, "master.data_dir", dir + "/master");
  if (cfg.worker.tieredstore.levels.empty()) SetDefault(&cfg, "worker.cache_dir", dir + "/cache");
  SetDefault(&cfg, "worker.heartbeat_interval", "1s");
  // `granary stats` and `granary trace` find the FUSE endpoint through RuntimeDir(); a fixed port
  // would clash with a second `granary local` or a cluster's granary-fuse on this machine.
  SetDefault(&cfg, "fuse.metrics_listen", "127.0.0.1:0");
  // One user's cache on one machine: its metrics on loopback too, on the usual ports unless another
  // process (another `granary local`, a cluster's daemons) has them.
  SetDefault(&cfg, "master.metrics_listen", LocalMetricsListen(19996));
  SetDefault(&cfg, "worker.metrics_listen", LocalMetricsListen(29996));
  Status set = cfg.Set("fuse.mountpoint", opts.mountpoint, "MOUNTPOINT");
  if (!set.ok()) return fail(set);
  InitLogging("granary", cfg.log.level);

  if (pid_t holder = master::DataDirLockHolder(cfg.master.data_dir); holder != 0) {
    return fail(FailedPreconditionError("another granary (pid " + std::to_string(holder) +
                                        ") is using the state directory " + dir +
                                        "; stop it, or give this one its own with --dir"));
  }
  // The CLI finds an instance through its GRANARY_HOME's discovery file: one instance per home.
  auto home_lock = LockHome();  // held until this process ends
  if (!home_lock.ok()) return fail(home_lock.status());
  auto master = master::MasterServer::Start(cfg);
  if (!master.ok()) return fail(master.status());
  cfg.master.address = (*master)->address();
  auto worker = worker::WorkerServer::Start(cfg);
  if (!worker.ok()) return fail(worker.status());
  cfg.fuse.worker = (*worker)->address();
  auto served = EnsureMounted(cfg, name, !opts.name.empty(), opts.uri, opts.options);
  if (!served.ok()) return fail(served.status());
  name = *served;
  SetDefault(&cfg, "fuse.root", name);
  auto fuse = fuse::FuseMount::Start(cfg);
  if (!fuse.ok()) return fail(fuse.status());

  std::string discovery = LocalDiscoveryFile();
  auto url = [](const std::string& address) { return address.empty() ? std::string() : "http://" + address + "/metrics"; };
  const std::string master_metrics = url((*master)->metrics_address()), worker_metrics = url((*worker)->metrics_address());
  // Who wrote it (named when another instance is refused) and where its metrics are, as comments:
  // the file is a config file.
  std::string yaml = "# pid " + std::to_string(getpid()) + "\n";
  yaml += "# metrics: master " + (master_metrics.empty() ? std::string("off") : master_metrics) + ", worker " +
          (worker_metrics.empty() ? std::string("off") : worker_metrics) + "\n";
  yaml += "master:\n  address: \"" + cfg.master.address + "\"\n";
  // `granary stats`, `trace` and `profile` with no path look at this mount.
  yaml += "fuse:\n  mountpoint: \"" + cfg.fuse.mountpoint + "\"\n";
  if (!cfg.rpc.token_file.empty()) yaml += "rpc:\n  token_file: \"" + cfg.rpc.token_file + "\"\n";
  if (!cfg.rpc.tls_ca.empty()) yaml += (cfg.rpc.token_file.empty() ? "rpc:\n" : "") + std::string("  tls_ca: \"") + cfg.rpc.tls_ca + "\"\n";
  Status ds = MakeDirs(GranaryHome(), 0700);
  if (ds.ok()) ds = WriteFileAtomic(discovery, yaml);
  if (!ds.ok()) spdlog::warn("cannot write {}: {}", discovery, ds.message());

  std::printf("granary local: serving %s at %s (namespace %s, master %s, state in %s). Ctrl-C stops.\n",
              RedactUri(opts.uri).c_str(), opts.mountpoint.c_str(), name.c_str(), cfg.master.address.c_str(),
              dir.c_str());
  if (!master_metrics.empty() || !worker_metrics.empty()) {
    std::printf("granary local: metrics at %s%s%s%s%s\n", master_metrics.c_str(),
                master_metrics.empty() ? "" : " (master)", master_metrics.empty() || worker_metrics.empty() ? "" : " and ",
                worker_metrics.c_str(), worker_metrics.empty() ? "" : " (worker)");
  }
  std::fflush(stdout);

  std::string reason = Shutdown::Wait();
  spdlog::info("granary local: stopping ({})", reason);
  (*fuse)->Shutdown();
  (*worker)->Shutdown();
  (*master)->Shutdown();
  unlink(discovery.c_str());
  std::printf("granary local: stopped\n");
  return 0;
}

}  // namespace granary::cli
