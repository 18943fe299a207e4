#include "master/cluster.h"

#include <spdlog/spdlog.h>

#include <map>

namespace granary::master {
namespace {
int64_t WallNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}
}  // namespace

Cluster::Cluster(std::chrono::milliseconds worker_timeout, Clock clock)
    : timeout_(worker_timeout), clock_(std::move(clock)) {
  // Epochs of a restarted master never repeat those its workers saw from the previous one.
  MutexLock lock(&mu_);
  epoch_ = static_cast<uint64_t>(WallNs());
}


uint64_t Cluster::RegisterWorker(const rpc::RegisterWorkerRequest& req) {
  MutexLock lock(&mu_);
  // A worker re-registering from the same address replaces its old entry.
  for (auto it = workers_.begin(); it != workers_.end();) {
    it = it->second.address == req.address() ? workers_.erase(it) : std::next(it);
  }
  uint64_t id = next_worker_++;
  Worker& w = workers_[id];
  w.address = req.address();
  w.stats = req.stats();
  w.last_heartbeat = clock_();
  w.last_heartbeat_wall_ns = WallNs();
  ++epoch_;
  spdlog::info("worker {} registered from {} holding {} blocks", id, req.address(), req.stats().blocks());
  return id;
}

bool Cluster::UpdateStats(uint64_t worker_id, const rpc::WorkerStats& stats) {
  MutexLock lock(&mu_);
  auto it = workers_.find(worker_id);
  if (it == workers_.end() || !it->second.alive) return false;
  it->second.stats = stats;
  return true;
}

bool Cluster::Heartbeat(uint64_t worker_id, const rpc::WorkerStats& stats, const std::string& address) {
  MutexLock lock(&mu_);
  auto it = workers_.find(worker_id);
  if (it == workers_.end() || !it->second.alive) return false;
  if (!address.empty() && address != it->second.address) return false;
  it->second.stats = stats;
  it->second.last_heartbeat = clock_();
  it->second.last_heartbeat_wall_ns = WallNs();
  return true;
}

void Cluster::ExpireWorkers() {
  MutexLock lock(&mu_);
  auto now = clock_();
  for (auto& [id, w] : workers_) {
    if (w.alive && now - w.last_heartbeat > timeout_) {
      spdlog::warn("worker {} at {} missed heartbeats for {} ms; it no longer counts as holding its blocks", id,
                   w.address, timeout_.count());
      w.alive = false;
      ++epoch_;
    }
  }
}

void Cluster::FillReport(rpc::Report* report, const std::vector<rpc::MountReport*>& mounts) {
  MutexLock lock(&mu_);
  std::map<uint64_t, rpc::MountCounters> sums;  // by mount id, over the live workers
  for (const auto& [id, w] : workers_) {
    auto* wr = report->add_workers();
    wr->set_id(id);
    wr->set_address(w.address);
    wr->set_alive(w.alive);
    wr->set_last_heartbeat_ns(w.last_heartbeat_wall_ns);
    *wr->mutable_stats() = w.stats;
    if (!w.alive) continue;
    for (const auto& [mount, c] : w.stats.mount_counters()) {
      rpc::MountCounters& s = sums[mount];
      s.set_home_bytes(s.home_bytes() + c.home_bytes());
      s.set_home_blocks(s.home_blocks() + c.home_blocks());
      s.set_held_bytes(s.held_bytes() + c.held_bytes());
      s.set_elastic_bytes(s.elastic_bytes() + c.elastic_bytes());
    }
  }
  for (auto* m : mounts) {
    auto it = sums.find(m->mount().id());
    if (it == sums.end()) continue;
    const rpc::MountCounters& s = it->second;
    m->set_cached_bytes(s.home_bytes());
    m->set_cached_blocks(s.home_blocks());
    m->set_replica_bytes(s.held_bytes() - std::min(s.held_bytes(), s.elastic_bytes()));
    m->set_elastic_bytes(s.elastic_bytes());
  }
}

std::vector<std::pair<uint64_t, std::string>> Cluster::AliveWorkers() {
  MutexLock lock(&mu_);
  std::vector<std::pair<uint64_t, std::string>> out;
  for (const auto& [id, w] : workers_) {
    if (w.alive) out.emplace_back(id, w.address);
  }
  return out;
}

uint64_t Cluster::Members(uint64_t known, google::protobuf::RepeatedPtrField<rpc::PeerInfo>* out) {
  MutexLock lock(&mu_);
  if (known == epoch_) return epoch_;
  for (const auto& [id, w] : workers_) {
    if (!w.alive) continue;
    rpc::PeerInfo* p = out->Add();
    p->set_id(id);
    p->set_address(w.address);
  }
  return epoch_;
}

MembersRecord Cluster::Record(uint64_t* epoch) {
  MutexLock lock(&mu_);
  MembersRecord r;
  for (const auto& [id, w] : workers_) {
    if (!w.alive) continue;
    MemberRecord* m = r.add_members();
    m->set_id(id);
    m->set_address(w.address);
  }
  r.set_next_id(next_worker_);
  if (epoch) *epoch = epoch_;
  return r;
}

void Cluster::Restore(const MembersRecord& r) {
  MutexLock lock(&mu_);
  workers_.clear();
  auto now = clock_();
  for (const auto& m : r.members()) {
    Worker& w = workers_[m.id()];
    w.address = m.address();
    w.last_heartbeat = now;
    w.last_heartbeat_wall_ns = WallNs();
    next_worker_ = std::max(next_worker_, m.id() + 1);
  }
  next_worker_ = std::max<uint64_t>(next_worker_, r.next_id());
  epoch_ = std::max(epoch_ + 1, static_cast<uint64_t>(WallNs()));
  spdlog::info("took over {} workers from the previous leader", workers_.size());
}

}  // namespace granary::master
