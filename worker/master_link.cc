#include "worker/master_link.h"

#include <spdlog/spdlog.h>

#include <set>

#include "common/keys.h"

namespace granary::worker {

MasterLink::MasterLink(const Config& cfg, std::shared_ptr<RpcSecurity> sec, BlockStore* store, StatsFn stats,
                       UfsAccess access, MembersFn members)
    : cfg_(cfg), sec_(std::move(sec)), store_(store), stats_(std::move(stats)), members_(std::move(members)),
      mounts_([this](uint64_t id) { return MountSource(id); }, std::move(access), &ufs_counters_) {
  stub_ = std::make_unique<StubHolder<rpc::Master>>(sec_, cfg_.master.address);
}

MasterLink::~MasterLink() { Stop(); }

void MasterLink::Start(const std::string& advertise) {
  advertise_ = advertise;
  Status st = Register();
  if (!st.ok()) spdlog::warn("cannot register with the master yet ({}); will retry", st.message());
  thread_ = std::thread([this] { Loop(); });
}

void MasterLink::Stop() {
  {
    MutexLock lock(&mu_);
    if (stop_) return;
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void MasterLink::BlockAdded(const BlockMeta&) { CacheChanged(); }

void MasterLink::BlockRemoved(const BlockMeta&) { CacheChanged(); }

void MasterLink::CacheChanged() {
  MutexLock lock(&mu_);
  // Only the first change since the last beat wakes the loop: it then waits for `earliest` with
  // changed_ set, and a wake-up per cached block (a futex call and a context switch each) was ~7%
  // of a cold worker's CPU.
  if (changed_) return;
  changed_ = true;
  cv_.notify_all();
}

Status MasterLink::Register() {
  rpc::RegisterWorkerRequest req;
  req.set_address(advertise_);
  {
    MutexLock lock(&mu_);
    changed_ = false;  // the stats below cover every change so far
  }
  *req.mutable_stats() = stats_();
  rpc::RegisterWorkerResponse resp;
  grpc::ClientContext ctx;
  sec_->Prepare(&ctx, cfg_.rpc.timeout);
  RETURN_IF_ERROR(FromGrpc(stub_->Note(stub_->Get()->RegisterWorker(&ctx, req, &resp)), "the master at " + stub_->address()));
  std::vector<FileKey> pins;
  for (const auto& k : resp.pinned_keys()) {
    FileKey f;
    if (FileKeyFromBytes(k, &f)) pins.push_back(f);
  }
  // Frees sent before this process ran are unknown to it: older load batches cache nothing here.
  store_->SetFreeFloor(resp.free_stamp());
  Status ps = store_->SetPins(pins);
  if (!ps.ok()) spdlog::warn("cannot record pins: {}", ps.message());
  // Mounts of cached blocks: learn their cache policy before the reserver needs it.
  // Mounts the master no longer has (unmounted while this worker was away): their blocks go.
  for (const auto& [id, counters] : req.stats().mount_counters()) {
    if (counters.held_blocks() == 0) continue;
    // The master's own answer, not the under-storage's (a source missing for a while is no unmount).
    Status known = MountSource(id).status();
    if (known.code() == Code::kNotFound) {
      ForgetMount(id);
      size_t n = store_->FreeMount(id);
      spdlog::info("mount {} is no longer mounted: freed its {} cached blocks", id, n);
    } else if (known.ok()) {
      GetMount(id).status().IgnoreError();
    }
  }
  Members(resp.worker_id(), resp.workers());
  MutexLock lock(&mu_);
  worker_id_ = resp.worker_id();
  members_epoch_ = resp.members_epoch();
  spdlog::info("registered with the master at {} as worker {}", stub_->address(), worker_id_);
  return Status::OK();
}

void MasterLink::Members(uint64_t self, const google::protobuf::RepeatedPtrField<rpc::PeerInfo>& workers) {
  if (!members_) return;
  std::vector<PeerRef> live;
  live.reserve(workers.size());
  for (const auto& w : workers) live.push_back(PeerRef{w.id(), w.address()});
  members_(self, live);
}

Status MasterLink::Beat() {
  rpc::HeartbeatRequest req;
  uint64_t self;
  {
    MutexLock lock(&mu_);
    self = worker_id_;
    req.set_worker_id(self);
    req.set_members_epoch(members_epoch_);
    req.set_address(advertise_);
    changed_ = false;  // the stats below cover every change so far
  }
  *req.mutable_stats() = stats_();
  rpc::HeartbeatResponse resp;
  // A failed beat is tried again only within the interval (a standby naming the leader, or the next
  // of several masters): the next beat carries the stats as they are then.
  RETURN_IF_ERROR(FromGrpc(CallWithFailover(*stub_, *sec_, cfg_.rpc.timeout, cfg_.worker.heartbeat_interval,
                                            [&](rpc::Master::Stub& m, grpc::ClientContext& ctx) {
                                              return m.Heartbeat(&ctx, req, &resp);
                                            }),
                           "the master"));
  if (resp.reregister()) {
    MutexLock lock(&mu_);
    worker_id_ = 0;
    return Status::OK();
  }
  // A master without epochs (an older version) sends the list every time, with epoch 0.
  if (resp.members_epoch() != req.members_epoch() || resp.members_epoch() == 0) {
    Members(self, resp.workers());
    MutexLock lock(&mu_);
    members_epoch_ = resp.members_epoch();
  }
  return Status::OK();
}

void MasterLink::Loop() {
  using Clock = std::chrono::steady_clock;
  auto next_beat = Clock::now();
  auto earliest = Clock::now();  // the soonest an early beat (for a cache change) may go
  for (;;) {
    bool registered;
    {
      MutexLock lock(&mu_);
      for (;;) {
        if (stop_) return;
        auto now = Clock::now();
        if (now >= next_beat) break;
        if (worker_id_ != 0 && changed_ && now >= earliest) break;
        auto until = worker_id_ != 0 && changed_ ? std::min(next_beat, earliest) : next_beat;
        lock.WaitUntil(&cv_, until);
      }
      registered = worker_id_ != 0;
    }
    if (!registered) {
      Status st = Register();
      if (!st.ok()) spdlog::debug("register: {}", st.message());
      next_beat = Clock::now() + std::min<std::chrono::milliseconds>(cfg_.worker.heartbeat_interval, std::chrono::seconds(1));
      continue;
    }
    Status st = Beat();
    if (!st.ok()) spdlog::warn("heartbeat: {}", st.message());
    earliest = Clock::now() + std::min<std::chrono::milliseconds>(kEarlyBeat, cfg_.worker.heartbeat_interval);
    next_beat = Clock::now() + cfg_.worker.heartbeat_interval;
  }
}

StatusOr<MountTable::Source> MasterLink::MountSource(uint64_t mount_id) {
  rpc::GetMountRequest req;
  req.set_id(mount_id);
  rpc::MountInfo info;
  RETURN_IF_ERROR(FromGrpc(CallWithFailover(*stub_, *sec_, cfg_.rpc.timeout, cfg_.rpc.master_wait,
                                            [&](rpc::Master::Stub& m, grpc::ClientContext& ctx) {
                                              return m.GetMount(&ctx, req, &info);
                                            }),
                           "the master at " + stub_->address()));
  return MountTable::Source{info.uri(), {info.options().begin(), info.options().end()}, info.block_size()};
}

Status MasterLink::CommitWrite(const rpc::CommitWriteRequest& req) {
  rpc::AttrResponse resp;
  return FromGrpc(CallWithFailover(*stub_, *sec_, cfg_.rpc.timeout, cfg_.rpc.master_wait,
                                   [&](rpc::Master::Stub& m, grpc::ClientContext& ctx) {
                                     return m.CommitWrite(&ctx, req, &resp);
                                   }),
                  "the master at " + stub_->address());
}

StatusOr<MountHandle> MasterLink::GetMount(uint64_t mount_id) {
  bool opened_now = false;
  ASSIGN_OR_RETURN(OpenedMount m, mounts_.Get(mount_id, &opened_now));
  if (opened_now && m.cache.policy) store_->SetMountPolicy(mount_id, *m.cache.policy);
  return MountHandle{m.uri, m.ufs, m.cache.policy, m.cache.replicas, m.cache.elastic, m.block_size, m.cache.write};
}

uint64_t MasterLink::worker_id() {
  MutexLock lock(&mu_);
  return worker_id_;
}

}  // namespace granary::worker
