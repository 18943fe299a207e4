#include "master/cluster.h"

#include <spdlog/spdlog.h>

#include <algorithm>

namespace granary::master {
namespace {
int64_t WallNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}
}  // namespace

Cluster::Cluster(std::chrono::milliseconds worker_timeout, Clock clock)
    : timeout_(worker_timeout), clock_(std::move(clock)) {}

bool Cluster::DropHolderLocked(BlockLoc& loc, uint64_t worker) {
  for (auto* list : {&loc.workers, &loc.elastic}) {
    auto it = std::find(list->begin(), list->end(), worker);
    if (it == list->end()) continue;
    list->erase(it);
    MountUsage& u = usage_[loc.mount_id];
    uint64_t& kind = list == &loc.workers ? u.replica_bytes : u.elastic_bytes;
    kind -= std::min(kind, loc.length);
    return true;
  }
  return false;
}

void Cluster::ReleaseIfEmptyLocked(const BlockLoc& loc) {
  MountUsage& u = usage_[loc.mount_id];
  u.bytes -= std::min(u.bytes, loc.length);
  u.blocks -= std::min<uint64_t>(u.blocks, 1);
}

void Cluster::AddLocked(uint64_t worker, const rpc::BlockRef& b) {
  BlockLoc& loc = blocks_[BlockKey{b.file_key(), b.index()}];
  auto& mine = b.elastic() ? loc.elastic : loc.workers;
  if (std::find(mine.begin(), mine.end(), worker) != mine.end()) return;
  if (loc.empty()) {
    loc.mount_id = b.mount_id();
    loc.length = b.length();
    usage_[loc.mount_id].bytes += loc.length;
    usage_[loc.mount_id].blocks += 1;
  }
  DropHolderLocked(loc, worker);  // the same worker, the other kind: the block changed kind
  mine.push_back(worker);
  MountUsage& u = usage_[loc.mount_id];
  (b.elastic() ? u.elastic_bytes : u.replica_bytes) += loc.length;
}

void Cluster::RemoveLocked(uint64_t worker, const rpc::BlockRef& b) {
  auto it = blocks_.find(BlockKey{b.file_key(), b.index()});
  if (it == blocks_.end()) return;
  DropHolderLocked(it->second, worker);
  if (it->second.empty()) {
    ReleaseIfEmptyLocked(it->second);
    blocks_.erase(it);
  }
}

void Cluster::ForgetWorkerBlocksLocked(uint64_t worker) {
  for (auto it = blocks_.begin(); it != blocks_.end();) {
    DropHolderLocked(it->second, worker);
    if (it->second.empty()) {
      ReleaseIfEmptyLocked(it->second);
      it = blocks_.erase(it);
    } else {
      ++it;
    }
  }
}

uint64_t Cluster::RegisterWorker(const rpc::RegisterWorkerRequest& req) {
  MutexLock lock(&mu_);
  // A worker re-registering from the same address replaces its old entry.
  for (auto it = workers_.begin(); it != workers_.end();) {
    if (it->second.address == req.address()) {
      ForgetWorkerBlocksLocked(it->first);
      it = workers_.erase(it);
    } else {
      ++it;
    }
  }
  uint64_t id = next_worker_++;
  Worker& w = workers_[id];
  w.address = req.address();
  w.stats = req.stats();
  w.last_heartbeat = clock_();
  w.last_heartbeat_wall_ns = WallNs();
  for (const auto& b : req.blocks()) AddLocked(id, b);
  spdlog::info("worker {} registered from {} with {} blocks", id, req.address(), req.blocks_size());
  return id;
}

bool Cluster::Heartbeat(uint64_t worker_id, const rpc::WorkerStats& stats) {
  MutexLock lock(&mu_);
  auto it = workers_.find(worker_id);
  if (it == workers_.end() || !it->second.alive) return false;
  it->second.stats = stats;
  it->second.last_heartbeat = clock_();
  it->second.last_heartbeat_wall_ns = WallNs();
  return true;
}

bool Cluster::ReportBlocks(const rpc::ReportBlocksRequest& req) {
  MutexLock lock(&mu_);
  auto it = workers_.find(req.worker_id());
  if (it == workers_.end() || !it->second.alive) return false;
  if (req.has_stats()) it->second.stats = req.stats();
  for (const auto& b : req.added()) AddLocked(req.worker_id(), b);
  for (const auto& b : req.removed()) RemoveLocked(req.worker_id(), b);
  return true;
}

void Cluster::ExpireWorkers() {
  MutexLock lock(&mu_);
  auto now = clock_();
  for (auto& [id, w] : workers_) {
    if (w.alive && now - w.last_heartbeat > timeout_) {
      spdlog::warn("worker {} at {} missed heartbeats for {} ms; dropping its block locations", id, w.address,
                   timeout_.count());
      w.alive = false;
      ForgetWorkerBlocksLocked(id);
    }
  }
}

void Cluster::DropMount(uint64_t mount_id) {
  MutexLock lock(&mu_);
  for (auto it = blocks_.begin(); it != blocks_.end();) {
    it = it->second.mount_id == mount_id ? blocks_.erase(it) : std::next(it);
  }
  usage_.erase(mount_id);
}

void Cluster::FillReport(rpc::Report* report, std::vector<rpc::MountReport*> mounts) {
  MutexLock lock(&mu_);
  for (const auto& [id, w] : workers_) {
    auto* wr = report->add_workers();
    wr->set_id(id);
    wr->set_address(w.address);
    wr->set_alive(w.alive);
    wr->set_last_heartbeat_ns(w.last_heartbeat_wall_ns);
    *wr->mutable_stats() = w.stats;
  }
  for (auto* m : mounts) {
    auto it = usage_.find(m->mount().id());
    if (it == usage_.end()) continue;
    m->set_cached_bytes(it->second.bytes);
    m->set_cached_blocks(it->second.blocks);
    m->set_replica_bytes(it->second.replica_bytes);
    m->set_elastic_bytes(it->second.elastic_bytes);
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

std::vector<uint64_t> Cluster::Holders(const std::string& file_key, uint64_t index) {
  MutexLock lock(&mu_);
  auto it = blocks_.find(BlockKey{file_key, index});
  return it == blocks_.end() ? std::vector<uint64_t>{} : it->second.workers;
}

std::vector<uint64_t> Cluster::ElasticHolders(const std::string& file_key, uint64_t index) {
  MutexLock lock(&mu_);
  auto it = blocks_.find(BlockKey{file_key, index});
  return it == blocks_.end() ? std::vector<uint64_t>{} : it->second.elastic;
}

void Cluster::CachedOf(const std::string& file_key, uint64_t size, uint64_t block_size, Cached* out) {
  if (block_size == 0) return;
  MutexLock lock(&mu_);
  for (uint64_t i = 0; i * block_size < size; ++i) {
    auto it = blocks_.find(BlockKey{file_key, i});
    if (it == blocks_.end() || it->second.empty()) continue;
    out->distinct += it->second.length;
    out->replica += it->second.length * it->second.workers.size();
    out->elastic += it->second.length * it->second.elastic.size();
  }
}

}  // namespace granary::master
