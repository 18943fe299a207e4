#include "master/server.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <condition_variable>
#include <functional>
#include <set>
#include <thread>

#include "common/keys.h"
#include "common/metrics.h"
#include "common/net.h"
#include "master/fetch_ahead.h"
#include "common/thread_annotations.h"
#include "common/thread_pool.h"
#include "ufs/ufs.h"
#include "master/cache_admin.h"
#include "master/cluster.h"
#include "master/jobs.h"
#include "master/namespace.h"
#include "proto/granary.grpc.pb.h"
#include "rpc/rpc.h"

namespace granary::master {
namespace {

using grpc::ServerContext;

// Each handler checks the token, calls the namespace or cluster, and maps the Status once.
// Lookup, GetAttr, GetFile and ReadDir use gRPC's callback API (see Serve); the other calls are
// rare or slow, and stay on the sync server's threads.
using MetadataCallbacks = rpc::Master::WithCallbackMethod_Lookup<rpc::Master::WithCallbackMethod_GetAttr<
    rpc::Master::WithCallbackMethod_GetFile<rpc::Master::WithCallbackMethod_ReadDir<rpc::Master::Service>>>>;

// Threads for metadata calls that wait for the under-storage (listings, file checks): a few kept,
// more started while every one is busy (callers queued behind one slow listing must not hold up
// the others), as the sync server did.
constexpr size_t kSlowCallThreadsKept = 4;
constexpr size_t kSlowCallThreadsMax = 512;

class MasterService final : public MetadataCallbacks {
 public:
  // `unmounted` is told of every mount unmounted (its blocks are freed in the background).
  MasterService(Namespace* ns, Cluster* cluster, JobManager* jobs, std::shared_ptr<RpcSecurity> sec,
                const WorkerCalls& workers, std::function<void(const rpc::MountInfo&)> unmounted,
                FetchAhead* ahead = nullptr)
      : ns_(ns), cluster_(cluster), jobs_(jobs), ahead_(ahead), sec_(std::move(sec)), admin_(ns, cluster, workers),
        unmounted_(std::move(unmounted)) {}

#define GRANARY_AUTH()                                   \
  do {                                                   \
    grpc::Status _auth = sec_->CheckToken(ctx);          \
    if (!_auth.ok()) return _auth;                       \
  } while (0)

  grpc::Status Mount(ServerContext* ctx, const rpc::MountRequest* req, rpc::MountResponse* resp) override {
    GRANARY_AUTH();
    std::map<std::string, std::string> opts(req->options().begin(), req->options().end());
    auto m = ns_->Mount(req->path(), req->uri(), opts);
    if (!m.ok()) return ToGrpc(m.status());
    *resp->mutable_mount() = *m;
    resp->mutable_mount()->clear_options();
    return grpc::Status::OK;
  }
  grpc::Status Unmount(ServerContext* ctx, const rpc::UnmountRequest* req, rpc::UnmountResponse*) override {
    GRANARY_AUTH();
    auto m = ns_->Unmount(req->path());
    if (!m.ok()) return ToGrpc(m.status());
    unmounted_(*m);
    return grpc::Status::OK;
  }
  grpc::Status ListMounts(ServerContext* ctx, const rpc::ListMountsRequest*, rpc::ListMountsResponse* resp) override {
    GRANARY_AUTH();
    for (auto& m : ns_->ListMounts()) *resp->add_mounts() = std::move(m);
    return grpc::Status::OK;
  }
  grpc::Status GetMount(ServerContext* ctx, const rpc::GetMountRequest* req, rpc::MountInfo* resp) override {
    GRANARY_AUTH();
    auto m = ns_->GetMount(req->id());
    if (!m.ok()) return ToGrpc(m.status());
    *resp = *m;
    return grpc::Status::OK;
  }
  // The metadata calls FUSE makes on every lookup and open run on gRPC's callback threads and
  // answer from RocksDB inline (no hand-off to a sync-server thread: at 100 clients that hand-off
  // was most of the master's cycles). One that needs the under-storage (a directory to list or
  // sync, a file to check) is made again on `slow_`, so a slow listing never holds a callback
  // thread. `fn(ufs_needed)` answers into the response; it runs at most twice.
  template <typename Fn>
  grpc::ServerUnaryReactor* Serve(grpc::CallbackServerContext* ctx, Fn fn) {
    grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
    grpc::Status auth = sec_->CheckToken(ctx);
    if (!auth.ok()) {
      reactor->Finish(auth);
      return reactor;
    }
    bool ufs_needed = false;
    grpc::Status st = fn(&ufs_needed);
    if (!ufs_needed) {
      reactor->Finish(st);
      return reactor;
    }
    slow_.Post([reactor, ctx, fn]() mutable {
      // A call cancelled while it waited (its caller gone, or the server shutting down past its
      // deadline) is not made.
      if (ctx->IsCancelled()) return reactor->Finish(grpc::Status(grpc::StatusCode::CANCELLED, "cancelled"));
      reactor->Finish(fn(nullptr));
    });
    return reactor;
  }
  grpc::ServerUnaryReactor* Lookup(grpc::CallbackServerContext* ctx, const rpc::LookupRequest* req,
                                   rpc::AttrResponse* resp) override {
    return Serve(ctx, [this, req, resp](bool* ufs) { return Reply(ns_->Lookup(req->parent(), req->name(), ufs), resp); });
  }
  grpc::ServerUnaryReactor* GetAttr(grpc::CallbackServerContext* ctx, const rpc::GetAttrRequest* req,
                                    rpc::AttrResponse* resp) override {
    return Serve(ctx, [this, req, resp](bool* ufs) { return Reply(ns_->GetAttr(req->ino(), ufs), resp); });
  }
  grpc::Status ResolvePath(ServerContext* ctx, const rpc::ResolvePathRequest* req, rpc::AttrResponse* resp) override {
    GRANARY_AUTH();
    return Reply(ns_->Resolve(req->path()), resp);
  }
  grpc::ServerUnaryReactor* GetFile(grpc::CallbackServerContext* ctx, const rpc::GetFileRequest* req,
                                    rpc::FileInfo* resp) override {
    return Serve(ctx, [this, req, resp](bool* ufs) {
      auto f = ns_->GetFile(req->ino(), ufs);
      if (!f.ok()) return ToGrpc(f.status());
      if (ahead_) ahead_->Opened(*f);  // the evidence of an epoch (master/fetch_ahead.h)
      *resp = std::move(f).value();
      return grpc::Status::OK;
    });
  }
  grpc::ServerUnaryReactor* ReadDir(grpc::CallbackServerContext* ctx, const rpc::ReadDirRequest* req,
                                    rpc::ReadDirResponse* resp) override {
    return Serve(ctx, [this, req, resp](bool* ufs) {
      resp->Clear();
      return ToGrpc(ns_->ReadDir(req->ino(), req->after(), req->limit(), resp, ufs));
    });
  }
  grpc::Status RegisterWorker(ServerContext* ctx, const rpc::RegisterWorkerRequest* req,
                              rpc::RegisterWorkerResponse* resp) override {
    GRANARY_AUTH();
    resp->set_worker_id(cluster_->RegisterWorker(*req));
    resp->set_members_epoch(cluster_->Members(0, resp->mutable_workers()));
    auto pins = ns_->Pins();
    if (!pins.ok()) return ToGrpc(pins.status());
    std::set<FileKey> pinned;
    for (const auto& [path, keys] : *pins) pinned.insert(keys.begin(), keys.end());
    for (const auto& k : pinned) resp->add_pinned_keys(FileKeyBytes(k));
    return grpc::Status::OK;
  }
  grpc::Status Heartbeat(ServerContext* ctx, const rpc::HeartbeatRequest* req, rpc::HeartbeatResponse* resp) override {
    GRANARY_AUTH();
    resp->set_reregister(!cluster_->Heartbeat(req->worker_id(), req->stats(), req->address()));
    if (!resp->reregister()) resp->set_members_epoch(cluster_->Members(req->members_epoch(), resp->mutable_workers()));
    return grpc::Status::OK;
  }
  grpc::Status ReportBlocks(ServerContext* ctx, const rpc::ReportBlocksRequest* req,
                            rpc::ReportBlocksResponse* resp) override {
    GRANARY_AUTH();
    // An older worker's block changes: its stats are kept, its block lists ignored (master/cluster.h).
    if (req->has_stats()) resp->set_reregister(!cluster_->UpdateStats(req->worker_id(), req->stats()));
    return grpc::Status::OK;
  }
  grpc::Status GetReport(ServerContext* ctx, const rpc::GetReportRequest*, rpc::Report* resp) override {
    GRANARY_AUTH();
    std::vector<rpc::MountReport*> mounts;
    for (auto& m : ns_->ListMounts()) {
      auto* mr = resp->add_mounts();
      *mr->mutable_mount() = std::move(m);
      mounts.push_back(mr);
    }
    cluster_->FillReport(resp, mounts);
    resp->set_block_size(ns_->block_size());
    return grpc::Status::OK;
  }
  grpc::Status Pin(ServerContext* ctx, const rpc::PinRequest* req, rpc::PinResponse* resp) override {
    GRANARY_AUTH();
    return ToGrpc(admin_.Pin(*req, resp));
  }
  grpc::Status LoadMetadata(ServerContext* ctx, const rpc::LoadMetadataRequest* req,
                            rpc::LoadMetadataResponse* resp) override {
    GRANARY_AUTH();
    LoadTreeOptions opts;  // a caller that went away stops the load; the next one resumes it
    opts.stop = [ctx] { return ctx->IsCancelled(); };
    auto st = ns_->LoadTree(req->path(), opts);
    if (!st.ok()) return ToGrpc(st.status());
    resp->set_files(st->files);
    resp->set_bytes(st->bytes);
    resp->set_directories(st->dirs);
    resp->set_added(st->added);
    resp->set_changed(st->changed);
    resp->set_removed(st->removed);
    resp->set_skipped(st->skipped);
    resp->set_resumed_after(st->resumed_after);
    return grpc::Status::OK;
  }
  grpc::Status Free(ServerContext* ctx, const rpc::FreeRequest* req, rpc::FreeResponse* resp) override {
    GRANARY_AUTH();
    return ToGrpc(admin_.Free(*req, resp));
  }
  grpc::Status SubmitLoad(ServerContext* ctx, const rpc::LoadJobSpec* req, rpc::LoadJob* resp) override {
    GRANARY_AUTH();
    return Reply(jobs_->Submit(*req), resp);
  }
  grpc::Status GetJob(ServerContext* ctx, const rpc::GetJobRequest* req, rpc::LoadJob* resp) override {
    GRANARY_AUTH();
    return Reply(jobs_->Get(req->id()), resp);
  }
  grpc::Status CancelJob(ServerContext* ctx, const rpc::CancelJobRequest* req, rpc::LoadJob* resp) override {
    GRANARY_AUTH();
    return Reply(jobs_->Cancel(req->id()), resp);
  }
  grpc::Status ListJobs(ServerContext* ctx, const rpc::ListJobsRequest*, rpc::ListJobsResponse* resp) override {
    GRANARY_AUTH();
    for (auto& j : jobs_->List()) *resp->add_jobs() = std::move(j);
    return grpc::Status::OK;
  }
  grpc::Status Du(ServerContext* ctx, const rpc::DuRequest* req, rpc::DuResponse* resp) override {
    GRANARY_AUTH();
    return ToGrpc(admin_.Du(*req, resp));
  }
  grpc::Status GetFileResidency(ServerContext* ctx, const rpc::FileResidencyRequest* req,
                                rpc::FileResidencyResponse* resp) override {
    GRANARY_AUTH();
    return ToGrpc(admin_.FileResidency(*req, resp));
  }
#undef GRANARY_AUTH

 private:
  static grpc::Status Reply(const StatusOr<rpc::Attr>& a, rpc::AttrResponse* resp) {
    if (!a.ok()) return ToGrpc(a.status());
    *resp->mutable_attr() = *a;
    return grpc::Status::OK;
  }
  static grpc::Status Reply(StatusOr<rpc::LoadJob> j, rpc::LoadJob* resp) {
    if (!j.ok()) return ToGrpc(j.status());
    *resp = std::move(*j);
    return grpc::Status::OK;
  }

  Namespace* ns_;
  Cluster* cluster_;
  JobManager* jobs_;
  FetchAhead* ahead_ = nullptr;
  std::shared_ptr<RpcSecurity> sec_;
  CacheAdmin admin_;
  std::function<void(const rpc::MountInfo&)> unmounted_;
  ThreadPool slow_{kSlowCallThreadsKept, kSlowCallThreadsMax};  // drained before the server's Shutdown returns
};

class MasterServerImpl final : public MasterServer {
 public:
  ~MasterServerImpl() override { Shutdown(); }

  Status Init(const Config& cfg) {
    ASSIGN_OR_RETURN(sec_, RpcSecurity::FromConfig(cfg.rpc));
    RETURN_IF_ERROR(CheckServingPolicy("master.listen", cfg.master.listen, cfg.rpc));
    RETURN_IF_ERROR(CheckCanListen(cfg.master.listen).WithContext("master.listen"));
    ASSIGN_OR_RETURN(UfsAccess access, UfsAccess::FromConfig(cfg));
    ASSIGN_OR_RETURN(ns_, Namespace::Open(cfg.master.data_dir, cfg.master.block_size, access, cfg.master.metadata_sync_ms,
                                          cfg.master.rocksdb_cache));
    // Mounts made before ufs.local_roots / ufs.secrets_dir, or under wider ones: said at start,
    // not first at a reader's EACCES.
    for (const auto& listed : ns_->ListMounts()) {
      auto m = ns_->GetMount(listed.id());
      if (!m.ok()) continue;
      Status allowed = CheckMountAccess(m->uri(), {m->options().begin(), m->options().end()}, access);
      if (!allowed.ok()) spdlog::warn("mount {} cannot be served here: {}", m->path(), allowed.message());
    }
    cluster_ = std::make_unique<Cluster>(cfg.master.worker_timeout);
    // Versions replaced or deleted by a metadata sync: free their blocks in the background.
    ns_->SetReclaimListener([this](std::vector<FileKey> keys) {
      MutexLock lock(&mu_);
      if (reclaim_.size() < 1'000'000) reclaim_.insert(reclaim_.end(), keys.begin(), keys.end());
      cv_.notify_all();
    });
    workers_ = WorkerCalls{std::make_shared<StubPool<rpc::Worker>>(sec_), cfg.rpc.timeout};
    jobs_ = std::make_unique<JobManager>(ns_.get(), cluster_.get(), workers_.pool);
    ahead_ = std::make_unique<FetchAhead>(ns_.get(), jobs_.get());
    service_ = std::make_unique<MasterService>(ns_.get(), cluster_.get(), jobs_.get(), sec_, workers_,
                                               [this](const rpc::MountInfo& m) { Unmounted(m); }, ahead_.get());
    grpc::ServerBuilder builder;
    int port = 0;
    builder.AddListeningPort(cfg.master.listen, sec_->ServerCredentials(), &port);
    builder.SetMaxReceiveMessageSize(kMaxMessageBytes);
    AllowKeepalivePings(&builder);
    builder.SetMaxSendMessageSize(kMaxMessageBytes);
    builder.RegisterService(service_.get());
    server_ = builder.BuildAndStart();
    if (!server_ || port == 0) return UnavailableError("cannot listen on " + cfg.master.listen);
    auto hp = ParseHostPort(cfg.master.listen);
    address_ = hp->host + ":" + std::to_string(port);
    auto interval = std::max<std::chrono::milliseconds>(cfg.master.worker_timeout / 4, std::chrono::milliseconds(100));
    expirer_ = std::thread([this, interval] {
      for (;;) {
        // mu_ guards only the queue and the stop flag; the work (the cluster's lock, RPCs to
        // workers) happens without it, so the reclaim listener never waits behind an expiry.
        std::vector<FileKey> keys;
        std::vector<uint64_t> mounts;
        {
          MutexLock lock(&mu_);
          if (!stop_ && reclaim_.empty() && reclaim_mounts_.empty()) lock.WaitFor(&cv_, interval);
          if (stop_) return;
          keys.swap(reclaim_);
          mounts.swap(reclaim_mounts_);
        }
        cluster_->ExpireWorkers();
        for (uint64_t id : mounts) {
          uint64_t blocks = 0;
          uint32_t told = 0;
          Status st = FreeMountOnWorkers(*cluster_, workers_, id, &blocks, &told);
          if (!st.ok()) {
            spdlog::warn("freeing the blocks of unmounted mount {}: {} (a worker that missed it frees them when it "
                         "registers again)",
                         id, st.message());
          }
          spdlog::info("freed {} cached blocks of unmounted mount {} on {} workers", blocks, id, told);
        }
        if (keys.empty()) continue;
        uint64_t blocks = 0;
        uint32_t told = 0;
        Status st = FreeOnWorkers(*cluster_, workers_, keys, &blocks, &told);
        if (!st.ok()) spdlog::warn("reclaiming the blocks of {} replaced file versions: {}", keys.size(), st.message());
        spdlog::info("reclaimed {} cached blocks of {} replaced or deleted file versions", blocks, keys.size());
      }
    });
    ahead_->Start();
    RETURN_IF_ERROR(jobs_->Start());
    spdlog::info("granary-master listening on {} (data in {})", address_, cfg.master.data_dir);
    WarnIfServingWithoutToken(cfg.master.listen, cfg.rpc);
    metrics_ = metrics::StartOrWarn("master.metrics_listen", cfg.master.metrics_listen,
                                    [this](metrics::Exposition* e) { Render(e); }, [] { return Status::OK(); });
    return Status::OK();
  }

  std::string address() const override { return address_; }
  std::string metrics_address() const override { return metrics_ ? metrics_->address() : ""; }

  // Workers, mounts and cache totals as GetReport sees them, and load jobs.
  void Render(metrics::Exposition* e) {
    rpc::Report r;
    std::vector<rpc::MountReport*> mounts;
    for (auto& m : ns_->ListMounts()) {
      auto* mr = r.add_mounts();
      *mr->mutable_mount() = std::move(m);
      mounts.push_back(mr);
    }
    cluster_->FillReport(&r, mounts);
    auto d = [](uint64_t v) { return static_cast<double>(v); };
    uint64_t alive = 0, lost = 0, capacity = 0, used = 0;
    for (const auto& w : r.workers()) {
      (w.alive() ? alive : lost)++;
      if (!w.alive()) continue;
      capacity += w.stats().capacity_bytes();
      used += w.stats().used_bytes();
    }
    e->Family("granary_master_workers", "gauge", "Workers known to the master, by state.");
    e->Sample("granary_master_workers", {{"state", "alive"}}, d(alive));
    e->Sample("granary_master_workers", {{"state", "lost"}}, d(lost));
    e->Gauge("granary_cluster_cache_capacity_bytes", "Cache quota of every live worker together.", d(capacity));
    e->Gauge("granary_cluster_cache_used_bytes", "Bytes cached on every live worker together.", d(used));
    e->Gauge("granary_master_mounts", "Mounted datasets.", d(r.mounts_size()));
    metrics::WriteProcessMetrics(e);
    const UfsCounters& u = ns_->ufs_counters();
    e->Counter("granary_master_ufs_calls_total", "Under-storage calls of the master (listings, stats).",
               d(u.stats + u.lists + u.reads));
    e->Counter("granary_master_ufs_retries_total", "Under-storage attempts of the master beyond the first of a call.",
               d(u.retries));
    e->Counter("granary_master_ufs_errors_total", "Under-storage calls of the master that failed.", d(u.errors));
    e->Family("granary_mount_ufs_files", "gauge", "Files of a mount listed so far.");
    for (const auto& mr : r.mounts()) e->Sample("granary_mount_ufs_files", {{"mount", mr.mount().path()}}, d(mr.mount().known_files()));
    e->Family("granary_mount_ufs_bytes", "gauge", "Under-storage bytes of a mount's files listed so far.");
    for (const auto& mr : r.mounts()) e->Sample("granary_mount_ufs_bytes", {{"mount", mr.mount().path()}}, d(mr.mount().known_bytes()));
    e->Family("granary_mount_cached_bytes", "gauge", "Bytes of a mount's blocks held by live workers (each once).");
    for (const auto& mr : r.mounts()) e->Sample("granary_mount_cached_bytes", {{"mount", mr.mount().path()}}, d(mr.cached_bytes()));
    JobManager::Totals t = jobs_->GetTotals();
    e->Family("granary_load_jobs", "gauge", "Load jobs by state.");
    for (int s = rpc::JobState_MIN; s <= rpc::JobState_MAX; ++s) {
      std::string name = rpc::JobState_Name(static_cast<rpc::JobState>(s)).substr(4);
      for (auto& c : name) c = static_cast<char>(std::tolower(c));
      e->Sample("granary_load_jobs", {{"state", name}}, d(t.by_state[static_cast<rpc::JobState>(s)]));
    }
    e->Counter("granary_load_files_total", "Files loaded (or found cached) by load jobs.", d(t.files_done));
    e->Counter("granary_load_bytes_total", "Bytes of the files loaded (or found cached) by load jobs.", d(t.bytes_done));
    e->Counter("granary_load_fetched_bytes_total", "Bytes load jobs brought into the cache.", d(t.bytes_fetched));
    e->Counter("granary_load_failed_files_total", "Files load jobs could not load.", d(t.files_failed));
    e->Family("granary_load_job_progress_ratio", "gauge", "Share of a running load job's bytes done (0 to 1).");
    for (const auto& j : jobs_->List()) {
      if (j.state() != rpc::JOB_SCANNING && j.state() != rpc::JOB_LOADING) continue;
      double ratio = j.bytes_total() ? static_cast<double>(j.bytes_done()) / static_cast<double>(j.bytes_total()) : 0;
      e->Sample("granary_load_job_progress_ratio", {{"job", std::to_string(j.id())}}, ratio);
    }
    auto ahead = ahead_->Mounts();
    e->Family("granary_fetch_ahead_active", "gauge",
              "1 while a mount is being fetched ahead of its readers (master/fetch_ahead.h), else 0.");
    for (const auto& m : ahead) e->Sample("granary_fetch_ahead_active", {{"mount", m.path}}, m.job ? 1 : 0);
    e->Family("granary_fetch_ahead_opened_files", "gauge",
              "Distinct files readers opened in a mount since they last paused: fetch-ahead's evidence.");
    for (const auto& m : ahead) e->Sample("granary_fetch_ahead_opened_files", {{"mount", m.path}}, d(m.files_opened));
  }

  void Shutdown() override {
    {
      MutexLock lock(&mu_);
      if (stop_) return;
      stop_ = true;
    }
    cv_.notify_all();
    metrics_.reset();
    if (ahead_) ahead_->Stop();
    if (jobs_) jobs_->Stop();
    if (server_) server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
    if (expirer_.joinable()) expirer_.join();
    server_.reset();
    service_.reset();
    ahead_.reset();
    jobs_.reset();
    ns_.reset();
  }

 private:
  // An unmounted dataset: its blocks are freed on the workers in the background, unless another
  // mount serves the same URI (blocks are named by URI, path and version, so they are its too).
  void Unmounted(const rpc::MountInfo& gone) {
    for (const auto& m : ns_->ListMounts()) {
      if (m.uri() == gone.uri()) {
        spdlog::info("unmounted {}; its cached blocks stay: {} serves the same under-storage", gone.path(), m.path());
        return;
      }
    }
    MutexLock lock(&mu_);
    reclaim_mounts_.push_back(gone.id());
    cv_.notify_all();
  }

  std::shared_ptr<RpcSecurity> sec_;
  std::unique_ptr<Namespace> ns_;
  std::unique_ptr<Cluster> cluster_;
  WorkerCalls workers_;
  std::unique_ptr<JobManager> jobs_;
  std::unique_ptr<FetchAhead> ahead_;
  std::unique_ptr<MasterService> service_;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<metrics::MetricsServer> metrics_;
  std::string address_;
  // Lock order in the master (docs/architecture.md, "Locks"): MasterService::pin_mu_ is the only
  // lock held across calls into other objects (the namespace, the cluster, RPCs to workers).
  // Namespace::mu_, the Cluster's mutex, JobManager::mu_ and this mu_ are leaves, each held only
  // inside its own object's methods. mu_ guards reclaim_ and stop_; the namespace calls the
  // reclaim listener outside its own lock.
  Mutex mu_;
  std::condition_variable cv_;
  bool stop_ GUARDED_BY(mu_) = false;
  std::vector<FileKey> reclaim_ GUARDED_BY(mu_);
  std::vector<uint64_t> reclaim_mounts_ GUARDED_BY(mu_);  // unmounted: their blocks to free
  std::thread expirer_;           // expires workers and sends reclaims
};

}  // namespace

StatusOr<std::unique_ptr<MasterServer>> MasterServer::Start(const Config& cfg) {
  auto s = std::make_unique<MasterServerImpl>();
  RETURN_IF_ERROR(s->Init(cfg));
  return std::unique_ptr<MasterServer>(std::move(s));
}

}  // namespace granary::master
