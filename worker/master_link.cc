#include "worker/master_link.h"

#include <spdlog/spdlog.h>

#include <set>

#include "common/keys.h"

namespace granary::worker {

rpc::BlockRef ToBlockRef(const BlockMeta& m) {
  rpc::BlockRef r;
  r.set_file_key(std::string(reinterpret_cast<const char*>(m.id.key.data()), m.id.key.size()));
  r.set_index(m.id.index);
  r.set_mount_id(m.mount_id);
  r.set_length(m.length);
  r.set_elastic(m.elastic);
  return r;
}

MasterLink::MasterLink(const Config& cfg, std::shared_ptr<RpcSecurity> sec, BlockStore* store, StatsFn stats,
                       MembersFn members)
    : cfg_(cfg), sec_(std::move(sec)), store_(store), stats_(std::move(stats)), members_(std::move(members)) {
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

void MasterLink::NoteLocked(const BlockMeta& m, bool added) {
  rpc::BlockRef ref = ToBlockRef(m);
  std::string key = ref.file_key();
  key.append(reinterpret_cast<const char*>(&m.id.index), sizeof(m.id.index));
  pending_[key] = Pending{std::move(ref), added};
  cv_.notify_all();
}

void MasterLink::BlockAdded(const BlockMeta& m) {
  MutexLock lock(&mu_);
  NoteLocked(m, true);
}

void MasterLink::BlockRemoved(const BlockMeta& m) {
  MutexLock lock(&mu_);
  NoteLocked(m, false);
}

Status MasterLink::Register() {
  rpc::RegisterWorkerRequest req;
  req.set_address(advertise_);
  *req.mutable_stats() = stats_();
  {
    // Reports queued before registration are covered by the full list.
    MutexLock lock(&mu_);
    pending_.clear();
  }
  for (const auto& b : store_->List()) *req.add_blocks() = ToBlockRef(b);
  rpc::RegisterWorkerResponse resp;
  grpc::ClientContext ctx;
  sec_->Prepare(&ctx, cfg_.rpc.timeout);
  RETURN_IF_ERROR(FromGrpc(stub_->Note(stub_->Get()->RegisterWorker(&ctx, req, &resp)), "the master at " + cfg_.master.address));
  std::vector<FileKey> pins;
  for (const auto& k : resp.pinned_keys()) {
    FileKey f;
    if (FileKeyFromBytes(k, &f)) pins.push_back(f);
  }
  Status ps = store_->SetPins(pins);
  if (!ps.ok()) spdlog::warn("cannot record pins: {}", ps.message());
  // Mounts of cached blocks: learn their cache policy before the reserver needs it.
  std::set<uint64_t> mount_ids;
  for (const auto& b : req.blocks()) mount_ids.insert(b.mount_id());
  for (uint64_t id : mount_ids) GetMount(id).status().IgnoreError();
  Members(resp.worker_id(), resp.workers());
  MutexLock lock(&mu_);
  worker_id_ = resp.worker_id();
  spdlog::info("registered with the master at {} as worker {}", cfg_.master.address, worker_id_);
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
  }
  *req.mutable_stats() = stats_();
  rpc::HeartbeatResponse resp;
  grpc::ClientContext ctx;
  sec_->Prepare(&ctx, cfg_.rpc.timeout);
  RETURN_IF_ERROR(FromGrpc(stub_->Note(stub_->Get()->Heartbeat(&ctx, req, &resp)), "the master"));
  if (resp.reregister()) {
    MutexLock lock(&mu_);
    worker_id_ = 0;
    return Status::OK();
  }
  Members(self, resp.workers());
  return Status::OK();
}

Status MasterLink::Flush() {
  rpc::ReportBlocksRequest req;
  {
    MutexLock lock(&mu_);
    if (pending_.empty()) return Status::OK();
    req.set_worker_id(worker_id_);
    for (auto& [key, p] : pending_) *(p.added ? req.add_added() : req.add_removed()) = std::move(p.ref);
    pending_.clear();
  }
  *req.mutable_stats() = stats_();
  rpc::ReportBlocksResponse resp;
  grpc::ClientContext ctx;
  sec_->Prepare(&ctx, cfg_.rpc.timeout);
  Status st = FromGrpc(stub_->Note(stub_->Get()->ReportBlocks(&ctx, req, &resp)), "the master");
  if (!st.ok() || resp.reregister()) {
    // The next registration sends the full list, which includes these blocks.
    MutexLock lock(&mu_);
    worker_id_ = 0;
  }
  return st;
}

void MasterLink::Loop() {
  auto next_beat = std::chrono::steady_clock::now();
  for (;;) {
    bool registered;
    {
      MutexLock lock(&mu_);
      while (!stop_ && !(worker_id_ != 0 && !pending_.empty()) &&
             lock.WaitUntil(&cv_, next_beat)) {
      }
      if (stop_) return;
      registered = worker_id_ != 0;
    }
    if (!registered) {
      Status st = Register();
      if (!st.ok()) spdlog::debug("register: {}", st.message());
      next_beat = std::chrono::steady_clock::now() + std::min<std::chrono::milliseconds>(cfg_.worker.heartbeat_interval, std::chrono::seconds(1));
      continue;
    }
    Status st = Flush();
    if (!st.ok()) spdlog::debug("block report: {}", st.message());
    if (std::chrono::steady_clock::now() >= next_beat) {
      st = Beat();
      if (!st.ok()) spdlog::warn("heartbeat: {}", st.message());
      next_beat = std::chrono::steady_clock::now() + cfg_.worker.heartbeat_interval;
    }
  }
}

StatusOr<MountTable::Source> MasterLink::MountSource(uint64_t mount_id) {
  rpc::GetMountRequest req;
  req.set_id(mount_id);
  rpc::MountInfo info;
  grpc::ClientContext ctx;
  sec_->Prepare(&ctx, cfg_.rpc.timeout);
  RETURN_IF_ERROR(FromGrpc(stub_->Note(stub_->Get()->GetMount(&ctx, req, &info)), "the master at " + cfg_.master.address));
  return MountTable::Source{info.uri(), {info.options().begin(), info.options().end()}};
}

StatusOr<MountHandle> MasterLink::GetMount(uint64_t mount_id) {
  bool opened_now = false;
  ASSIGN_OR_RETURN(OpenedMount m, mounts_.Get(mount_id, &opened_now));
  if (opened_now && m.cache.policy) store_->SetMountPolicy(mount_id, *m.cache.policy);
  return MountHandle{m.uri, m.ufs, m.cache.policy, m.cache.replicas, m.cache.elastic};
}

uint64_t MasterLink::worker_id() {
  MutexLock lock(&mu_);
  return worker_id_;
}

}  // namespace granary::worker
