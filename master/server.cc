#include "master/server.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <condition_variable>
#include <functional>
#include <set>
#include <thread>

#include "common/bad_request.h"
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
#include "master/election.h"
#include "master/etcd.h"
#include "master/namespace.h"
#include "master/replication.h"
#include "proto/granary.grpc.pb.h"
#include "rpc/call_counts.h"
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
// What a new leader moves the counters ahead by (Namespace::SkipAhead).
constexpr uint64_t kInodeGapOnFailover = 1ull << 24;
constexpr uint64_t kMountGapOnFailover = 1024;
constexpr size_t kSlowCallThreadsMax = 512;
// Files per NoteOpens call (granary-fuse sends at most fuse/open_notes.h's batch).
constexpr int kMaxNotedOpens = 4096;

// What only the leader runs, made when it starts leading and dropped when it stops: the workers'
// membership, load jobs, fetch-ahead, and the cache admin calls. A single master (no etcd) makes
// one at start and keeps it.
struct Leading {
  Leading(Namespace* ns, std::chrono::milliseconds worker_timeout, const WorkerCalls& workers, uint64_t term_)
      : term(term_), cluster(worker_timeout), jobs(ns, &cluster, workers.pool), ahead(ns, &jobs),
        admin(ns, &cluster, workers) {}
  ~Leading() { Stop(); }
  // Stops load jobs and fetch-ahead (a master that stops leading; handlers may still hold this).
  void Stop() {
    ahead.Stop();
    jobs.Stop();
  }
  const uint64_t term;  // 0: a single master
  Cluster cluster;
  JobManager jobs;
  FetchAhead ahead;
  CacheAdmin admin;
  uint64_t members_written = 0;  // the membership epoch last written to the journal
};

// The service's view of this master's role (MasterServerImpl).
class Roles {
 public:
  virtual ~Roles() = default;
  // The leader's parts while this master leads; null on a standby.
  virtual std::shared_ptr<Leading> leading() = 0;
  // A standby whose copy of the namespace can answer reads, and the copy's generation (it changes
  // when a snapshot starts replacing it).
  virtual bool ServesReads() = 0;
  virtual uint64_t CopyGeneration() = 0;
  // The answer of a standby to what only the leader does: UNAVAILABLE, naming the leader in the
  // message and in the status details (granary-leader=host:port), which clients follow.
  virtual grpc::Status NotLeader() = 0;
  virtual rpc::MasterRole Role() = 0;
  virtual bool IsLeader() = 0;
  // Told of every registration (the membership is written to the journal soon after).
  virtual void MembersChanged() = 0;
};

class MasterService final : public MetadataCallbacks {
 public:
  // `unmounted` is told of every mount unmounted (its blocks are freed in the background).
  MasterService(Namespace* ns, Roles* roles, std::shared_ptr<RpcSecurity> sec,
                std::function<void(const rpc::MountInfo&)> unmounted)
      : ns_(ns), roles_(roles), sec_(std::move(sec)), unmounted_(std::move(unmounted)) {}

// Every call, before its answer leaves: the entries it committed are on a standby in sync
// (Journal::WaitReplicated, master/journal.h "Group commit"), waited for here, after the namespace
// lock is released. A leader that lost its lease meanwhile cannot vouch for them: the call is
// cancelled (the client sees CANCELLED) rather than acknowledged.
class ReplicatedBeforeAnswer {
 public:
  ReplicatedBeforeAnswer(Journal* journal, grpc::ServerContext* ctx) : journal_(journal), ctx_(ctx) {}
  ~ReplicatedBeforeAnswer() {
    Status st = journal_->WaitReplicated();
    if (!st.ok()) {
      spdlog::warn("a call's write may not be on any standby ({}): the call is cancelled, not acknowledged",
                   st.message());
      ctx_->TryCancel();
    }
  }
  ReplicatedBeforeAnswer(const ReplicatedBeforeAnswer&) = delete;
  ReplicatedBeforeAnswer& operator=(const ReplicatedBeforeAnswer&) = delete;

 private:
  Journal* const journal_;
  grpc::ServerContext* const ctx_;
};

#define GRANARY_AUTH()                                   \
  ReplicatedBeforeAnswer _replicated(&ns_->journal(), ctx); \
  do {                                                   \
    grpc::Status _auth = sec_->CheckToken(ctx);          \
    if (!_auth.ok()) return _auth;                       \
  } while (0)
// Checks the token and that this master leads; `L` is then the leader's parts.
#define GRANARY_LEADER(L)                                \
  GRANARY_AUTH();                                        \
  std::shared_ptr<Leading> L = roles_->leading();        \
  if (!L) return roles_->NotLeader()

  grpc::Status Mount(ServerContext* ctx, const rpc::MountRequest* req, rpc::MountResponse* resp) override {
    GRANARY_LEADER(L);
    std::map<std::string, std::string> opts(req->options().begin(), req->options().end());
    auto m = ns_->Mount(req->path(), req->uri(), opts);
    if (!m.ok()) return ToGrpc(m.status());
    *resp->mutable_mount() = *m;
    resp->mutable_mount()->clear_options();
    return grpc::Status::OK;
  }
  grpc::Status Unmount(ServerContext* ctx, const rpc::UnmountRequest* req, rpc::UnmountResponse*) override {
    GRANARY_LEADER(L);
    auto m = ns_->Unmount(req->path());
    if (!m.ok()) return ToGrpc(m.status());
    unmounted_(*m);
    return grpc::Status::OK;
  }
  grpc::Status ListMounts(ServerContext* ctx, const rpc::ListMountsRequest*, rpc::ListMountsResponse* resp) override {
    GRANARY_LEADER(L);
    for (auto& m : ns_->ListMounts()) *resp->add_mounts() = std::move(m);
    return grpc::Status::OK;
  }
  grpc::Status GetMount(ServerContext* ctx, const rpc::GetMountRequest* req, rpc::MountInfo* resp) override {
    GRANARY_LEADER(L);
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
    std::shared_ptr<Leading> leading = roles_->leading();
    if (!leading && !roles_->ServesReads()) {
      reactor->Finish(roles_->NotLeader());
      return reactor;
    }
    const uint64_t copy = leading ? 0 : roles_->CopyGeneration();
    bool ufs_needed = false;
    grpc::Status st = fn(&ufs_needed, leading.get());
    if (!leading && (roles_->CopyGeneration() != copy || !roles_->ServesReads())) {
      // A snapshot began replacing this standby's copy while it was read: the answer may be wrong.
      reactor->Finish(roles_->NotLeader());
      return reactor;
    }
    if (!ufs_needed) {
      reactor->Finish(st);
      return reactor;
    }
    if (!leading) {  // a standby never lists or checks the under-storage: that writes
      reactor->Finish(roles_->NotLeader());
      return reactor;
    }
    slow_.Post([this, reactor, ctx, fn, leading]() mutable {
      // A call cancelled while it waited (its caller gone, or the server shutting down past its
      // deadline) is not made.
      if (ctx->IsCancelled()) return reactor->Finish(grpc::Status(grpc::StatusCode::CANCELLED, "cancelled"));
      grpc::Status st = fn(nullptr, leading.get());
      // What the listing or sync wrote is on a standby before the answer names its inodes (as
      // ReplicatedBeforeAnswer does for the other calls).
      Status replicated = ns_->journal().WaitReplicated();
      reactor->Finish(replicated.ok() ? st : ToGrpc(replicated));
    });
    return reactor;
  }
  grpc::ServerUnaryReactor* Lookup(grpc::CallbackServerContext* ctx, const rpc::LookupRequest* req,
                                   rpc::AttrResponse* resp) override {
    return Serve(ctx, [this, req, resp](bool* ufs, Leading*) {
      resp->Clear();
      rpc::FileInfo file;
      grpc::Status st = Reply(ns_->Lookup(req->parent(), req->name(), ufs, req->file() ? &file : nullptr), resp);
      if (st.ok() && file.has_attr()) *resp->mutable_file() = std::move(file);  // unset when not filled
      return st;
    });
  }
  grpc::ServerUnaryReactor* GetAttr(grpc::CallbackServerContext* ctx, const rpc::GetAttrRequest* req,
                                    rpc::AttrResponse* resp) override {
    return Serve(ctx, [this, req, resp](bool* ufs, Leading*) { return Reply(ns_->GetAttr(req->ino(), ufs), resp); });
  }
  // A standby answers what its copy holds (issue 51: `granary ls` and `stat` failed during an etcd
  // outage, this call being the leader's only); a path that needs a listing goes to the leader.
  grpc::Status ResolvePath(ServerContext* ctx, const rpc::ResolvePathRequest* req, rpc::AttrResponse* resp) override {
    GRANARY_AUTH();
    if (roles_->leading()) return Reply(ns_->Resolve(req->path()), resp);
    if (!roles_->ServesReads()) return roles_->NotLeader();
    const uint64_t copy = roles_->CopyGeneration();
    bool ufs_needed = false;
    auto a = ns_->Resolve(req->path(), &ufs_needed);
    if (ufs_needed || roles_->CopyGeneration() != copy || !roles_->ServesReads()) return roles_->NotLeader();
    return Reply(a, resp);
  }
  grpc::ServerUnaryReactor* GetFile(grpc::CallbackServerContext* ctx, const rpc::GetFileRequest* req,
                                    rpc::FileInfo* resp) override {
    return Serve(ctx, [this, req, resp](bool* ufs, Leading* leading) {
      auto f = ns_->GetFile(req->ino(), ufs);
      if (!f.ok()) return ToGrpc(f.status());
      if (leading) leading->ahead.Opened(*f);  // the evidence of an epoch (master/fetch_ahead.h)
      *resp = std::move(f).value();
      return grpc::Status::OK;
    });
  }
  grpc::ServerUnaryReactor* ReadDir(grpc::CallbackServerContext* ctx, const rpc::ReadDirRequest* req,
                                    rpc::ReadDirResponse* resp) override {
    return Serve(ctx, [this, req, resp](bool* ufs, Leading*) {
      resp->Clear();
      return ToGrpc(ns_->ReadDir(req->ino(), req->after(), req->limit(), resp, ufs, req->files()));
    });
  }
  // Opens made from listed information (no GetFile): fetch-ahead's evidence, as GetFile's calls are.
  grpc::Status NoteOpens(ServerContext* ctx, const rpc::NoteOpensRequest* req, rpc::NoteOpensResponse*) override {
    GRANARY_LEADER(L);
    if (req->inos_size() > kMaxNotedOpens) {
      Status bad = InvalidArgumentError("at most " + std::to_string(kMaxNotedOpens) + " files per NoteOpens");
      NoteBadRequest("master's NoteOpens", bad);
      return ToGrpc(bad);
    }
    for (uint64_t ino : req->inos()) {
      auto f = ns_->StoredFile(ino);
      if (f.ok()) L->ahead.Opened(*f);  // a file removed since is no evidence
    }
    return grpc::Status::OK;
  }
  // ---- writes (Namespace's write calls; the leader only) ----
  static void FillTarget(const Namespace::WriteTarget& t, rpc::WriteTarget* resp) {
    *resp->mutable_file() = t.file;
    resp->set_write_mode(static_cast<uint32_t>(t.mode));
    resp->set_created(t.created);
  }
  grpc::Status PrepareCreate(ServerContext* ctx, const rpc::PrepareCreateRequest* req, rpc::WriteTarget* resp) override {
    GRANARY_LEADER(L);
    auto t = ns_->PrepareCreate(req->parent(), req->name(), req->mode(), req->uid(), req->gid());
    if (!t.ok()) return ToGrpc(t.status());
    FillTarget(*t, resp);
    return grpc::Status::OK;
  }
  grpc::Status PrepareWrite(ServerContext* ctx, const rpc::PrepareWriteRequest* req, rpc::WriteTarget* resp) override {
    GRANARY_LEADER(L);
    auto t = ns_->PrepareWrite(req->ino());
    if (!t.ok()) return ToGrpc(t.status());
    FillTarget(*t, resp);
    return grpc::Status::OK;
  }
  grpc::Status CommitWrite(ServerContext* ctx, const rpc::CommitWriteRequest* req, rpc::AttrResponse* resp) override {
    GRANARY_LEADER(L);
    UfsEntry e;
    e.name = req->name();
    e.size = req->size();
    e.mtime_ns = req->mtime_ns();
    e.mode = req->mode();
    e.uid = req->uid();
    e.gid = req->gid();
    e.version = req->version();
    return Reply(ns_->CommitWrite(req->ino(), req->parent(), req->name(), req->ufs_path(), e), resp);
  }
  // Who a write call acts for (granary-fuse sends the FUSE request's ids).
  static WriteCaller CallerOf(const rpc::Caller& c) { return WriteCaller{c.uid(), c.gid(), {c.groups().begin(), c.groups().end()}}; }
  grpc::Status Remove(ServerContext* ctx, const rpc::RemoveRequest* req, rpc::RemoveResponse*) override {
    GRANARY_LEADER(L);
    return ToGrpc(ns_->Remove(req->parent(), req->name(), req->directory(), CallerOf(req->caller()), req->pending_ino()));
  }
  grpc::Status MakeDir(ServerContext* ctx, const rpc::MakeDirRequest* req, rpc::AttrResponse* resp) override {
    GRANARY_LEADER(L);
    WriteCaller as = CallerOf(req->caller());
    as.uid = req->uid();
    as.gid = req->gid();
    return Reply(ns_->MakeDir(req->parent(), req->name(), req->mode(), as), resp);
  }
  grpc::Status Rename(ServerContext* ctx, const rpc::RenameRequest* req, rpc::RenameResponse*) override {
    GRANARY_LEADER(L);
    return ToGrpc(ns_->Rename(req->parent(), req->name(), req->new_parent(), req->new_name(), req->noreplace(),
                              CallerOf(req->caller())));
  }
  grpc::Status SetAttr(ServerContext* ctx, const rpc::SetAttrRequest* req, rpc::AttrResponse* resp) override {
    GRANARY_LEADER(L);
    UfsAttrChange c;
    if (req->has_mode()) c.mode = req->mode();
    if (req->has_uid()) c.uid = req->uid();
    if (req->has_gid()) c.gid = req->gid();
    if (req->has_atime_ns()) c.atime_ns = req->atime_ns();
    if (req->has_mtime_ns()) c.mtime_ns = req->mtime_ns();
    return Reply(ns_->SetAttr(req->ino(), c, CallerOf(req->caller())), resp);
  }
  grpc::Status RegisterWorker(ServerContext* ctx, const rpc::RegisterWorkerRequest* req,
                              rpc::RegisterWorkerResponse* resp) override {
    GRANARY_LEADER(L);
    resp->set_worker_id(L->cluster.RegisterWorker(*req));
    roles_->MembersChanged();
    resp->set_members_epoch(L->cluster.Members(0, resp->mutable_workers()));
    resp->set_free_stamp(ns_->FreeStamp());
    auto pins = ns_->meta().Pins();
    if (!pins.ok()) return ToGrpc(pins.status());
    std::set<FileKey> pinned;
    for (const auto& [path, keys] : *pins) pinned.insert(keys.begin(), keys.end());
    for (const auto& k : pinned) resp->add_pinned_keys(FileKeyBytes(k));
    return grpc::Status::OK;
  }
  grpc::Status Heartbeat(ServerContext* ctx, const rpc::HeartbeatRequest* req, rpc::HeartbeatResponse* resp) override {
    GRANARY_LEADER(L);
    resp->set_reregister(!L->cluster.Heartbeat(req->worker_id(), req->stats(), req->address()));
    if (!resp->reregister()) resp->set_members_epoch(L->cluster.Members(req->members_epoch(), resp->mutable_workers()));
    return grpc::Status::OK;
  }
  grpc::Status ReportBlocks(ServerContext* ctx, const rpc::ReportBlocksRequest* req,
                            rpc::ReportBlocksResponse* resp) override {
    GRANARY_LEADER(L);
    // An older worker's block changes: its stats are kept, its block lists ignored (master/cluster.h).
    if (req->has_stats()) resp->set_reregister(!L->cluster.UpdateStats(req->worker_id(), req->stats()));
    return grpc::Status::OK;
  }
  grpc::Status GetReport(ServerContext* ctx, const rpc::GetReportRequest*, rpc::Report* resp) override {
    GRANARY_LEADER(L);
    std::vector<rpc::MountReport*> mounts;
    for (auto& m : ns_->ListMounts()) {
      auto* mr = resp->add_mounts();
      *mr->mutable_mount() = std::move(m);
      mounts.push_back(mr);
    }
    L->cluster.FillReport(resp, mounts);
    resp->set_block_size(ns_->block_size());
    *resp->mutable_master() = roles_->Role();
    return grpc::Status::OK;
  }
  grpc::Status Pin(ServerContext* ctx, const rpc::PinRequest* req, rpc::PinResponse* resp) override {
    GRANARY_LEADER(L);
    return ToGrpc(L->admin.Pin(*req, resp));
  }
  grpc::Status LoadMetadata(ServerContext* ctx, const rpc::LoadMetadataRequest* req,
                            rpc::LoadMetadataResponse* resp) override {
    GRANARY_LEADER(L);
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
    GRANARY_LEADER(L);
    return ToGrpc(L->admin.Free(*req, resp));
  }
  grpc::Status SubmitLoad(ServerContext* ctx, const rpc::LoadJobSpec* req, rpc::LoadJob* resp) override {
    GRANARY_LEADER(L);
    return Reply(L->jobs.Submit(*req), resp);
  }
  grpc::Status GetJob(ServerContext* ctx, const rpc::GetJobRequest* req, rpc::LoadJob* resp) override {
    GRANARY_LEADER(L);
    return Reply(L->jobs.Get(req->id()), resp);
  }
  grpc::Status CancelJob(ServerContext* ctx, const rpc::CancelJobRequest* req, rpc::LoadJob* resp) override {
    GRANARY_LEADER(L);
    return Reply(L->jobs.Cancel(req->id()), resp);
  }
  grpc::Status ListJobs(ServerContext* ctx, const rpc::ListJobsRequest*, rpc::ListJobsResponse* resp) override {
    GRANARY_LEADER(L);
    for (auto& j : L->jobs.List()) *resp->add_jobs() = std::move(j);
    return grpc::Status::OK;
  }
  grpc::Status Du(ServerContext* ctx, const rpc::DuRequest* req, rpc::DuResponse* resp) override {
    GRANARY_LEADER(L);
    return ToGrpc(L->admin.Du(*req, resp));
  }
  grpc::Status GetFileResidency(ServerContext* ctx, const rpc::FileResidencyRequest* req,
                                rpc::FileResidencyResponse* resp) override {
    GRANARY_LEADER(L);
    return ToGrpc(L->admin.FileResidency(*req, resp));
  }
  grpc::Status Replicate(ServerContext* ctx,
                         grpc::ServerReaderWriter<rpc::ReplicaBatch, rpc::ReplicaAck>* stream) override {
    GRANARY_LEADER(L);
    return ServeStandby(ns_, L->term, [this] { return roles_->IsLeader(); }, ctx, stream);
  }
  // No token asked: this master proves it holds it (master/replication.h, "The leader's proof").
  grpc::Status ProveMaster(ServerContext*, const rpc::MasterChallenge* req, rpc::MasterProof* resp) override {
    return master::ProveMaster(*sec_, roles_->Role().id(), *req, resp);
  }
  grpc::Status GetRole(ServerContext* ctx, const rpc::GetRoleRequest*, rpc::MasterRole* resp) override {
    GRANARY_AUTH();
    *resp = roles_->Role();
    return grpc::Status::OK;
  }
#undef GRANARY_LEADER
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
  Roles* roles_;
  std::shared_ptr<RpcSecurity> sec_;
  std::function<void(const rpc::MountInfo&)> unmounted_;
  ThreadPool slow_{kSlowCallThreadsKept, kSlowCallThreadsMax};  // drained before the server's Shutdown returns
};

class MasterServerImpl final : public MasterServer, public Roles {
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
    worker_timeout_ = cfg.master.worker_timeout;
    ttl_ = cfg.master.election_ttl;
    ha_ = !cfg.master.etcd_endpoints.empty();
    // Versions replaced or deleted by a metadata sync: free their blocks in the background.
    ns_->SetReclaimListener([this](std::vector<FileKey> keys) {
      MutexLock lock(&mu_);
      if (reclaim_.size() < 1'000'000) reclaim_.insert(reclaim_.end(), keys.begin(), keys.end());
      cv_.notify_all();
    });
    workers_ = WorkerCalls{std::make_shared<StubPool<rpc::Worker>>(sec_), cfg.rpc.timeout};
    std::unique_ptr<EtcdClient> etcd;
    if (ha_) {
      EtcdTls tls{cfg.master.etcd_tls_ca, cfg.master.etcd_tls_cert, cfg.master.etcd_tls_key,
                  cfg.master.etcd_allow_plaintext};
      auto created = EtcdClient::Create(SplitAddressList(cfg.master.etcd_endpoints), std::chrono::milliseconds(1000), tls);
      if (!created.ok()) return created.status().WithContext("master.etcd_endpoints");
      if (cfg.master.etcd_endpoints.find("http://") != std::string::npos) {
        spdlog::warn("ETCD OVER PLAIN HTTP (master.etcd_allow_plaintext): whoever reaches {} can name the leader the "
                     "standby masters follow; serve etcd over TLS with client certificates (docs/deploy.md)",
                     cfg.master.etcd_endpoints);
      }
      etcd = std::move(created).value();
      ns_->journal().Configure(cfg.master.replication_log,
                               std::max<std::chrono::milliseconds>(std::chrono::milliseconds(500), ttl_ / 4));
    }
    if (!ha_) {  // a single master leads from the start, before it serves
      auto L = std::make_shared<Leading>(ns_.get(), worker_timeout_, workers_, 0);
      L->ahead.Start();
      RETURN_IF_ERROR(L->jobs.Start());
      {
        MutexLock lock(&role_mu_);
        leading_ = std::move(L);
      }
      // A directory rename a crash left halfway (Namespace, "Directory renames").
      if (Status fin = ns_->FinishRenames(); !fin.ok()) {
        spdlog::error("finishing a directory rename left halfway: {} (the next directory rename tries again)",
                      fin.message());
      }
    }
    service_ = std::make_unique<MasterService>(ns_.get(), this, sec_, [this](const rpc::MountInfo& m) { Unmounted(m); });
    grpc::ServerBuilder builder;
    int port = 0;
    builder.AddListeningPort(cfg.master.listen, sec_->ServerCredentials(), &port);
    builder.SetMaxReceiveMessageSize(kMaxMessageBytes);
    AllowKeepalivePings(&builder);
    builder.SetMaxSendMessageSize(kMaxMessageBytes);
    builder.RegisterService(service_.get());
    calls_.Attach(&builder, "granary.rpc.Master");
    server_ = builder.BuildAndStart();
    if (!server_ || port == 0) return UnavailableError("cannot listen on " + cfg.master.listen);
    auto hp = ParseHostPort(cfg.master.listen);
    address_ = hp->host + ":" + std::to_string(port);
    advertise_ = cfg.master.advertise;
    if (advertise_.empty()) {
      advertise_ = (hp->host == "0.0.0.0" || hp->host == "::" ? HostName() : hp->host) + ":" + std::to_string(port);
    }
    {
      MutexLock lock(&role_mu_);
      since_ = std::chrono::system_clock::now();
    }
    if (ha_) {
      etcd_ = std::move(etcd);
      ElectionOptions eo;
      eo.key = cfg.master.etcd_prefix + "/master/leader";
      eo.id = advertise_;
      eo.ttl = std::chrono::duration_cast<std::chrono::seconds>(ttl_);
      eo.margin = std::min<std::chrono::milliseconds>(std::chrono::milliseconds(1000), ttl_ / 4);
      eo.may_campaign = [this] { return MayCampaign(); };
      eo.standing = [this] {
        const LogPosition p = ns_->journal().position();
        return Standing{p.term, p.index};
      };
      election_ = std::make_unique<LeaderElection>(etcd_.get(), eo,
                                                   [this](bool leading, int64_t term) { RoleChanged(leading, term); });
      ns_->journal().SetFence([this]() -> Status {
        if (election_->IsLeader()) return Status::OK();
        return UnavailableError("this master no longer leads (its lease in etcd lapsed): the write was not made; "
                                "the new leader takes it");
      });
      follower_ = std::make_unique<Follower>(ns_.get(), sec_, advertise_, [this] { return election_->leader(); });
      follower_->Start();
      role_thread_ = std::thread([this] { RoleLoop(); });
      election_->Start();
      spdlog::info("granary-master {} is a standby until elected (etcd {}, leader key {})", advertise_,
                   cfg.master.etcd_endpoints, eo.key);
    }
    auto interval = std::max<std::chrono::milliseconds>(cfg.master.worker_timeout / 4, std::chrono::milliseconds(100));
    expirer_ = std::thread([this, interval] { ExpireLoop(interval); });
    spdlog::info("granary-master listening on {} (data in {})", address_, cfg.master.data_dir);
    WarnIfServingWithoutToken(cfg.master.listen, cfg.rpc);
    metrics_ = metrics::StartOrWarn("master.metrics_listen", cfg.master.metrics_listen,
                                    [this](metrics::Exposition* e) { Render(e); }, [this] { return Ready(); });
    return Status::OK();
  }

  // /readyz: a single master is ready once serving; with standbys, while this master leads or
  // knows the leader (issue 51: a master with no leader known said "ready"). A leader last read
  // from etcd more than a lease ago is known no more (its fence has ended its lead since). Not
  // ready, a master still answers reads from its copy: the HA overlay publishes the masters'
  // names whether ready or not (publishNotReadyAddresses), so clients keep reaching them.
  Status Ready() {
    if (!ha_ || IsLeader()) return Status::OK();
    const std::string leader = election_->leader();
    if (!leader.empty() && leader != advertise_ && election_->etcd_failing_for() <= ttl_) return Status::OK();
    return UnavailableError(NoLeaderWhy());
  }

  std::string address() const override { return address_; }
  std::string metrics_address() const override { return metrics_ ? metrics_->address() : ""; }

  // Roles.
  std::shared_ptr<Leading> leading() override {
    if (ha_ && !election_->IsLeader()) return nullptr;  // fenced, even before RoleLoop hears of it
    MutexLock lock(&role_mu_);
    return leading_;
  }
  bool IsLeader() override { return leading() != nullptr; }
  uint64_t CopyGeneration() override { return follower_ ? follower_->CopyGeneration() : 0; }
  bool ServesReads() override {
    if (!follower_) return false;
    if (follower_->ServingReads()) return true;
    // No master leads (etcd out of reach, or an election under way): every master answers reads
    // from its copy, which is as fresh as any — nothing can be written without a leader.
    // So is etcd out of reach for longer than a lease: no leader can still be writing (its fence
    // ends its leadership within the ttl), though the key last read may still name one.
    return follower_->Whole() && (election_->leader().empty() || election_->etcd_failing_for() > ttl_);
  }
  // Why no master leads, as far as this one can tell: etcd out of reach (named, with its error),
  // or an election under way.
  std::string NoLeaderWhy() const {
    const std::string etcd = election_ ? election_->etcd_error() : "";
    if (!etcd.empty()) {
      return "no granary-master leads right now: this master cannot reach etcd (" +
             std::to_string(std::chrono::duration_cast<std::chrono::seconds>(election_->etcd_failing_for()).count()) +
             " s; " + etcd + "), and no master can be elected without it; check master.etcd_endpoints and etcd";
    }
    return "no granary-master leads right now (an election is under way); try again in a few seconds";
  }
  grpc::Status NotLeader() override {
    std::string leader = election_ ? election_->leader() : "";
    if (leader.empty() || leader == advertise_) {
      return grpc::Status(grpc::StatusCode::UNAVAILABLE, NoLeaderWhy(), kLeaderHint);
    }
    std::string msg = "granary-master " + advertise_ + " is a standby; the leader is " + leader;
    const std::string etcd = election_ ? election_->etcd_error() : "";
    if (!etcd.empty()) {  // what it last read, which may be stale: say so, and why
      msg += " as etcd last said; this master cannot reach etcd (" + etcd + ")";
    }
    return grpc::Status(grpc::StatusCode::UNAVAILABLE, msg, std::string(kLeaderHint) + leader);
  }
  rpc::MasterRole Role() override {
    rpc::MasterRole r;
    r.set_id(advertise_);
    r.set_ha(ha_);
    std::shared_ptr<Leading> L = leading();
    r.set_leader(L != nullptr);
    r.set_leader_id(L ? advertise_ : (election_ ? election_->leader() : ""));
    {
      MutexLock lock(&role_mu_);
      r.set_since_unix_ns(std::chrono::duration_cast<std::chrono::nanoseconds>(since_.time_since_epoch()).count());
      // A standby: the term of the leader it follows (issue 51: standbys exported 0).
      r.set_term(L ? L->term : (follower_ && follower_->term() > 0 ? follower_->term() : leader_term_));
    }
    LogPosition pos = ns_->journal().position();
    r.mutable_position()->set_term(pos.term);
    r.mutable_position()->set_index(pos.index);
    if (L) {
      for (const auto& f : ns_->journal().Followers()) {
        auto* sb = r.add_standbys();
        sb->set_id(f.id);
        sb->set_acked_index(f.acked);
        sb->set_in_sync(f.in_sync);
        sb->set_lag(pos.index > f.acked ? pos.index - f.acked : 0);
      }
    } else if (follower_) {
      r.set_lag(follower_->lag());
      r.set_serving_reads(follower_->ServingReads());
    }
    return r;
  }
  void MembersChanged() override {
    if (!ha_) return;
    MutexLock lock(&mu_);
    members_dirty_ = true;
    cv_.notify_all();
  }

  // Workers, mounts and cache totals as GetReport sees them, and load jobs.
  void Render(metrics::Exposition* e) {
    RenderRole(e);
    metrics::WriteProcessMetrics(e);
    e->Family("granary_master_rpc_calls_total", "counter", "gRPC calls the master received, by method.");
    for (const auto& [method, n] : calls_.Snapshot()) {
      e->Sample("granary_master_rpc_calls_total", {{"method", method}}, static_cast<double>(n));
    }
    std::shared_ptr<Leading> L = leading();
    if (!L) return;  // a standby: the rest is the leader's
    rpc::Report r;
    std::vector<rpc::MountReport*> mounts;
    for (auto& m : ns_->ListMounts()) {
      auto* mr = r.add_mounts();
      *mr->mutable_mount() = std::move(m);
      mounts.push_back(mr);
    }
    L->cluster.FillReport(&r, mounts);
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
    const UfsCounters& u = ns_->ufs_counters();
    e->Counter("granary_master_ufs_calls_total", "Under-storage calls of the master (listings, stats).",
               d(u.stats + u.lists + u.reads + u.writes));
    e->Counter("granary_master_ufs_retries_total", "Under-storage attempts of the master beyond the first of a call.",
               d(u.retries));
    e->Counter("granary_master_ufs_errors_total", "Under-storage calls of the master that failed.", d(u.errors));
    e->Family("granary_mount_ufs_files", "gauge", "Files of a mount listed so far.");
    for (const auto& mr : r.mounts()) e->Sample("granary_mount_ufs_files", {{"mount", mr.mount().path()}}, d(mr.mount().known_files()));
    e->Family("granary_mount_ufs_bytes", "gauge", "Under-storage bytes of a mount's files listed so far.");
    for (const auto& mr : r.mounts()) e->Sample("granary_mount_ufs_bytes", {{"mount", mr.mount().path()}}, d(mr.mount().known_bytes()));
    e->Family("granary_mount_cached_bytes", "gauge", "Bytes of a mount's blocks held by live workers (each once).");
    for (const auto& mr : r.mounts()) e->Sample("granary_mount_cached_bytes", {{"mount", mr.mount().path()}}, d(mr.cached_bytes()));
    JobManager::Totals t = L->jobs.GetTotals();
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
    for (const auto& j : L->jobs.List()) {
      if (j.state() != rpc::JOB_SCANNING && j.state() != rpc::JOB_LOADING) continue;
      double ratio = j.bytes_total() ? static_cast<double>(j.bytes_done()) / static_cast<double>(j.bytes_total()) : 0;
      e->Sample("granary_load_job_progress_ratio", {{"job", std::to_string(j.id())}}, ratio);
    }
    auto ahead = L->ahead.Mounts();
    e->Family("granary_fetch_ahead_active", "gauge",
              "1 while a mount is being fetched ahead of its readers (master/fetch_ahead.h), else 0.");
    for (const auto& m : ahead) e->Sample("granary_fetch_ahead_active", {{"mount", m.path}}, m.job ? 1 : 0);
    e->Family("granary_fetch_ahead_opened_files", "gauge",
              "Distinct files readers opened in a mount since they last paused: fetch-ahead's evidence.");
    for (const auto& m : ahead) e->Sample("granary_fetch_ahead_opened_files", {{"mount", m.path}}, d(m.files_opened));
  }

  // Who leads, since when, the journal, the standbys' lag.
  void RenderRole(metrics::Exposition* e) {
    rpc::MasterRole r = Role();
    auto d = [](uint64_t v) { return static_cast<double>(v); };
    e->Gauge("granary_master_leader", "1 while this master leads (a single master always does), 0 on a standby.",
             r.leader() ? 1 : 0);
    e->Gauge("granary_master_term", "The leader's term (etcd revision of its election; 0: a single master).",
             d(r.term()));
    e->Gauge("granary_master_role_since_seconds", "Unix time at which this master became leader or standby.",
             static_cast<double>(r.since_unix_ns()) / 1e9);
    e->Gauge("granary_master_journal_index", "Entries in this master's journal (its namespace's position).",
             d(r.position().index()));
    if (r.leader()) {
      e->Family("granary_master_standby_lag_entries", "gauge", "Journal entries a standby master is behind the leader.");
      for (const auto& sb : r.standbys()) e->Sample("granary_master_standby_lag_entries", {{"standby", sb.id()}}, d(sb.lag()));
      uint64_t in_sync = 0;
      for (const auto& sb : r.standbys()) in_sync += sb.in_sync() ? 1 : 0;
      e->Gauge("granary_master_standbys_in_sync", "Standby masters the leader's writes wait for.", d(in_sync));
    } else if (r.ha()) {
      e->Gauge("granary_master_lag_entries", "Journal entries this standby is behind the leader.", d(r.lag()));
    }
  }

  void Shutdown() override {
    {
      MutexLock lock(&mu_);
      if (stop_) return;
      stop_ = true;
    }
    cv_.notify_all();
    metrics_.reset();
    if (election_) election_->Stop();  // a leader resigns: a standby takes over at once
    {
      MutexLock lock(&role_mu_);
      role_stop_ = true;
      role_cv_.notify_all();
    }
    if (role_thread_.joinable()) role_thread_.join();
    if (follower_) follower_->Stop();
    std::shared_ptr<Leading> L;
    {
      MutexLock lock(&role_mu_);
      L = leading_;
    }
    if (L) L->Stop();  // its jobs and fetch-ahead; calls in flight still see it
    if (server_) server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
    {
      MutexLock lock(&role_mu_);
      leading_.reset();
    }
    L.reset();
    if (expirer_.joinable()) expirer_.join();
    server_.reset();
    service_.reset();
    follower_.reset();
    election_.reset();
    etcd_.reset();
    ns_.reset();
  }

 private:
  // Expires workers, writes the membership for the standbys, and sends reclaims.
  void ExpireLoop(std::chrono::milliseconds interval) {
    for (;;) {
      // mu_ guards only the queue and the stop flag; the work (the cluster's lock, RPCs to
      // workers) happens without it, so the reclaim listener never waits behind an expiry.
      std::vector<FileKey> keys;
      std::vector<uint64_t> mounts;
      {
        MutexLock lock(&mu_);
        if (!stop_ && reclaim_.empty() && reclaim_mounts_.empty() && !members_dirty_) lock.WaitFor(&cv_, interval);
        if (stop_) return;
        keys.swap(reclaim_);
        mounts.swap(reclaim_mounts_);
        members_dirty_ = false;
      }
      std::shared_ptr<Leading> L = leading();
      if (!L) continue;  // a standby: the leader does this
      L->cluster.ExpireWorkers();
      if (ha_) {
        uint64_t epoch = 0;
        MembersRecord rec = L->cluster.Record(&epoch);
        if (epoch != L->members_written && ns_->meta().PutMembers(rec).ok()) L->members_written = epoch;
      }
      for (uint64_t id : mounts) {
        uint64_t blocks = 0;
        uint32_t told = 0;
        StatusOr<uint64_t> stamp = ns_->NextFreeStamp();
        Status st = stamp.ok() ? FreeMountOnWorkers(L->cluster, workers_, id, *stamp, &blocks, &told) : stamp.status();
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
      StatusOr<uint64_t> stamp = ns_->NextFreeStamp();
      Status st = stamp.ok() ? FreeOnWorkers(L->cluster, workers_, keys, *stamp, &blocks, &told) : stamp.status();
      if (!st.ok()) spdlog::warn("reclaiming the blocks of {} replaced file versions: {}", keys.size(), st.message());
      spdlog::info("reclaimed {} cached blocks of {} replaced or deleted file versions", blocks, keys.size());
    }
  }

  // Called by the election's thread: hands the change to RoleLoop (promotion takes time; the
  // election must go on keeping the lease meanwhile).
  void RoleChanged(bool leading, int64_t term) {
    MutexLock lock(&role_mu_);
    role_want_ = leading;
    role_term_ = static_cast<uint64_t>(term);
    role_pending_ = true;
    role_cv_.notify_all();
  }

  void RoleLoop() {
    for (;;) {
      bool want;
      uint64_t term;
      {
        MutexLock lock(&role_mu_);
        while (!role_stop_ && !role_pending_) lock.Wait(&role_cv_);
        if (role_stop_) return;
        role_pending_ = false;
        want = role_want_;
        term = role_term_;
      }
      if (want) {
        Promote(term);
      } else {
        Demote();
      }
    }
  }

  // This master was elected: it stops following, reads its copy's state, starts a term in the
  // journal (the standbys see it), and starts the leader's parts with the previous leader's
  // workers, jobs and pins (all in the replicated namespace).
  void Promote(uint64_t elected_term) {
    auto started = std::chrono::steady_clock::now();
    StopLeading();  // a role change that came while this one was pending
    follower_->Stop();
    // Terms must grow in the journal: etcd's revision does, unless etcd was recreated.
    const uint64_t term = std::max(elected_term, ns_->journal().position().term + 1);
    Status st = ns_->ReloadState();
    if (st.ok()) st = ns_->journal().BeginTerm(term);
    // Numbers the previous leader may have handed out in writes this copy never got.
    if (st.ok()) st = ns_->SkipAhead(kInodeGapOnFailover, kMountGapOnFailover);
    if (!st.ok()) {
      spdlog::error("elected (term {}) but cannot lead: {}; resigning", term, st.message());
      ns_->journal().EndTerm();
      election_->Resign(3 * ttl_);
      follower_->Start();
      return;
    }
    auto L = std::make_shared<Leading>(ns_.get(), worker_timeout_, workers_, term);
    auto members = ns_->meta().GetMembers();
    if (members.ok() && members->members_size() > 0) L->cluster.Restore(*members);
    L->ahead.Start();
    st = L->jobs.Start();
    if (!st.ok()) spdlog::error("load jobs could not be resumed: {}", st.message());
    {
      MutexLock lock(&role_mu_);
      leading_ = std::move(L);
      leader_term_ = term;
      since_ = std::chrono::system_clock::now();
      empty_since_ = {};
    }
    spdlog::info("granary-master {} leads (term {}) from journal position {}, ready in {} ms", advertise_, term,
                 ns_->journal().position().ToString(),
                 std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - started).count());
    // A directory rename the previous leader left halfway (Namespace, "Directory renames").
    if (Status fin = ns_->FinishRenames(); !fin.ok()) {
      spdlog::error("finishing a directory rename left halfway: {} (the next directory rename tries again)",
                    fin.message());
    }
  }

  void Demote() {
    ns_->journal().EndTerm();
    StopLeading();
    follower_->Start();
  }

  // Drops the leader's parts, stopping their jobs and fetch-ahead now (a call in flight may hold
  // them a while longer; the journal refuses its writes).
  void StopLeading() {
    std::shared_ptr<Leading> L;
    {
      MutexLock lock(&role_mu_);
      L.swap(leading_);
      since_ = std::chrono::system_clock::now();
    }
    if (!L) return;
    spdlog::warn("granary-master {} no longer leads (term {}); it follows the next leader", advertise_, L->term);
    L->Stop();
  }

  // Whether this master may stand in an election now. Which of those that stand leads is the
  // election's choice: the copy furthest along (master/election.h, "Which master"). A partial copy
  // never stands. An empty one that heard no leader since it started waits three leases first, so
  // turning a single master into three never elects an empty copy while the old one starts.
  bool MayCampaign() {
    if (!ns_->journal().Whole()) return false;  // a partial copy never leads
    MutexLock lock(&role_mu_);
    auto now = std::chrono::steady_clock::now();
    // Asked only while the key is free: a gap since the last question means a leader held it
    // meanwhile, and this is another election.
    if (now - last_campaign_question_ > std::chrono::seconds(2)) empty_since_ = {};
    last_campaign_question_ = now;
    if (follower_->HeardALeader() || ns_->journal().position().index > 0) return true;
    if (empty_since_ == std::chrono::steady_clock::time_point{}) empty_since_ = now;
    if (now - empty_since_ < 3 * ttl_) return false;
    spdlog::info("campaigning for leader with an empty namespace: no master with a copy took over within {} ms",
                 (3 * ttl_).count());
    return true;
  }

  // An unmounted dataset: its blocks are freed on the workers in the background, unless another
  // mount serves the same URI (blocks are named by URI, path and version, so they are its too).
  void Unmounted(const rpc::MountInfo& gone) {
    // Its load and fetch-ahead jobs stop first: no batch of it is sent from now on (and one already
    // on its way caches nothing: its free stamp is older than the free below, docs/semantics.md).
    if (std::shared_ptr<Leading> L = leading()) {
      if (size_t n = L->jobs.CancelWithin(gone.path()); n > 0) {
        spdlog::info("unmounted {}: {} of its load or fetch-ahead jobs cancelled", gone.path(), n);
      }
    }
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
  WorkerCalls workers_;
  std::chrono::milliseconds worker_timeout_{};
  std::chrono::milliseconds ttl_{};
  bool ha_ = false;
  std::unique_ptr<EtcdClient> etcd_;
  std::unique_ptr<LeaderElection> election_;
  std::unique_ptr<Follower> follower_;
  std::unique_ptr<MasterService> service_;
  rpc::CallCounts calls_;  // before server_: outlives it
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<metrics::MetricsServer> metrics_;
  std::string address_;
  std::string advertise_;
  // Lock order in the master (docs/architecture.md, "Locks"): MasterService::pin_mu_ is the only
  // lock held across calls into other objects (the namespace, the cluster, RPCs to workers).
  // Namespace::mu_, the Cluster's mutex, JobManager::mu_ and this mu_ are leaves, each held only
  // inside its own object's methods. mu_ guards reclaim_ and stop_; the namespace calls the
  // reclaim listener outside its own lock. role_mu_ is a leaf too (the journal's fence takes the
  // election's lock, never role_mu_).
  Mutex mu_;
  std::condition_variable cv_;
  bool stop_ GUARDED_BY(mu_) = false;
  bool members_dirty_ GUARDED_BY(mu_) = false;
  std::vector<FileKey> reclaim_ GUARDED_BY(mu_);
  std::vector<uint64_t> reclaim_mounts_ GUARDED_BY(mu_);  // unmounted: their blocks to free
  std::thread expirer_;           // expires workers and sends reclaims

  Mutex role_mu_;
  std::condition_variable role_cv_;
  std::shared_ptr<Leading> leading_ GUARDED_BY(role_mu_);
  uint64_t leader_term_ GUARDED_BY(role_mu_) = 0;
  std::chrono::system_clock::time_point since_ GUARDED_BY(role_mu_){};
  std::chrono::steady_clock::time_point empty_since_ GUARDED_BY(role_mu_){};
  std::chrono::steady_clock::time_point last_campaign_question_ GUARDED_BY(role_mu_){};
  bool role_pending_ GUARDED_BY(role_mu_) = false;
  bool role_want_ GUARDED_BY(role_mu_) = false;
  uint64_t role_term_ GUARDED_BY(role_mu_) = 0;
  bool role_stop_ GUARDED_BY(role_mu_) = false;
  std::thread role_thread_;
};

}  // namespace

StatusOr<std::unique_ptr<MasterServer>> MasterServer::Start(const Config& cfg) {
  auto s = std::make_unique<MasterServerImpl>();
  RETURN_IF_ERROR(s->Init(cfg));
  return std::unique_ptr<MasterServer>(std::move(s));
}

}  // namespace granary::master
