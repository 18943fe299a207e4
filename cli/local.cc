#include "cli/local.h"

#include <spdlog/spdlog.h>
#include <unistd.h>

#include <cstdio>

#include "cli/cli.h"
#include "common/fs.h"
#include "common/logging.h"
#include "common/shutdown.h"
#include "common/tiers.h"
#include "common/ufs/ufs.h"
#include "fuse/mount.h"
#include "master/server.h"
#include "proto/granary.grpc.pb.h"
#include "proto/rpc.h"
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

Status EnsureMounted(const Config& cfg, const std::string& name, const std::string& uri,
                     const std::map<std::string, std::string>& options) {
  ASSIGN_OR_RETURN(auto sec, RpcSecurity::FromConfig(cfg.rpc));
  auto stub = rpc::Master::NewStub(sec->MakeChannel(cfg.master.address));
  rpc::ListMountsResponse mounts;
  {
    grpc::ClientContext ctx;
    sec->Prepare(&ctx, cfg.rpc.timeout);
    RETURN_IF_ERROR(FromGrpc(stub->ListMounts(&ctx, {}, &mounts), "the master"));
  }
  for (const auto& m : mounts.mounts()) {
    if (m.path() != name) continue;
    if (m.uri() == uri) return Status::OK();  // kept from an earlier run with the same --dir
    return AlreadyExistsError(name + " is already mounted from " + RedactUri(m.uri()) +
                              " in this state directory; use --name or another --dir");
  }
  rpc::MountRequest req;
  req.set_path(name);
  req.set_uri(uri);
  req.mutable_options()->insert(options.begin(), options.end());
  rpc::MountResponse resp;
  grpc::ClientContext ctx;
  sec->Prepare(&ctx, cfg.rpc.timeout);
  return FromGrpc(stub->Mount(&ctx, req, &resp), "the master");
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
  {
    // Fail before starting anything when the under-storage is not there.
    std::map<std::string, std::string> ufs_options;
    MountCacheOptions cache_options;
    Status split = SplitMountOptions(opts.options, &ufs_options, &cache_options);
    if (!split.ok()) return fail(split);
    auto ufs = OpenUnderFileSystem(opts.uri, ufs_options);
    if (!ufs.ok()) return fail(ufs.status());
  }
  if (!IsDirectory(opts.mountpoint)) {
    return fail(NotFoundError("mount point " + opts.mountpoint + " does not exist (create it with mkdir -p " +
                              opts.mountpoint + ")"));
  }
  Status st = MakeDirs(dir, 0700);
  if (!st.ok()) return fail(st.WithContext("--dir"));

  SetDefault(&cfg, "master.listen", "127.0.0.1:0");
  SetDefault(&cfg, "worker.listen", "127.0.0.1:0");
  SetDefault(&cfg, "master.data_dir", dir + "/master");
  if (cfg.worker.tieredstore.levels.empty()) SetDefault(&cfg, "worker.cache_dir", dir + "/cache");
  SetDefault(&cfg, "fuse.root", name);
  SetDefault(&cfg, "worker.heartbeat_interval", "1s");
  Status set = cfg.Set("fuse.mountpoint", opts.mountpoint, "MOUNTPOINT");
  if (!set.ok()) return fail(set);
  InitLogging("granary", cfg.log.level);

  auto master = master::MasterServer::Start(cfg);
  if (!master.ok()) return fail(master.status());
  cfg.master.address = (*master)->address();
  auto worker = worker::WorkerServer::Start(cfg);
  if (!worker.ok()) return fail(worker.status());
  cfg.fuse.worker = (*worker)->address();
  st = EnsureMounted(cfg, name, opts.uri, opts.options);
  if (!st.ok()) return fail(st);
  auto fuse = fuse::FuseMount::Start(cfg);
  if (!fuse.ok()) return fail(fuse.status());

  std::string discovery = LocalDiscoveryFile();
  std::string yaml = "master:\n  address: \"" + cfg.master.address + "\"\n";
  if (!cfg.rpc.token_file.empty()) yaml += "rpc:\n  token_file: \"" + cfg.rpc.token_file + "\"\n";
  if (!cfg.rpc.tls_ca.empty()) yaml += (cfg.rpc.token_file.empty() ? "rpc:\n" : "") + std::string("  tls_ca: \"") + cfg.rpc.tls_ca + "\"\n";
  Status ds = MakeDirs(GranaryHome(), 0700);
  if (ds.ok()) ds = WriteFileAtomic(discovery, yaml);
  if (!ds.ok()) spdlog::warn("cannot write {}: {}", discovery, ds.message());

  std::printf("granary local: serving %s at %s (namespace %s, master %s, state in %s). Ctrl-C stops.\n",
              RedactUri(opts.uri).c_str(), opts.mountpoint.c_str(), name.c_str(), cfg.master.address.c_str(),
              dir.c_str());
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
