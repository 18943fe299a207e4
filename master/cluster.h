// Cluster: the master's view of workers and of which worker holds which block.
//
// Held in memory only and rebuilt from the workers themselves: a worker registers with a full
// block report, then sends incremental reports and heartbeats. A restarted master answers the
// first heartbeat of an unknown worker with "re-register", so locations come back by themselves.
// A worker silent for `worker_timeout` is marked dead and its block locations are dropped.
//
// Thread-safe: one mutex guards everything; every method is short.
#pragma once

#include <chrono>
#include <functional>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "common/thread_annotations.h"
#include "proto/granary.pb.h"

namespace granary::master {

class Cluster {
 public:
  using Clock = std::function<std::chrono::steady_clock::time_point()>;
  explicit Cluster(std::chrono::milliseconds worker_timeout, Clock clock = std::chrono::steady_clock::now);

  uint64_t RegisterWorker(const rpc::RegisterWorkerRequest& req);
  // False when the worker is unknown (it must register again).
  bool Heartbeat(uint64_t worker_id, const rpc::WorkerStats& stats);
  bool ReportBlocks(const rpc::ReportBlocksRequest& req);
  // Marks workers without a recent heartbeat dead and forgets their blocks.
  void ExpireWorkers();
  // Forgets every block of a mount (after unmount).
  void DropMount(uint64_t mount_id);

  // Workers and per-mount cached bytes; `mounts` gets cached_bytes/cached_blocks filled in.
  void FillReport(rpc::Report* report, std::vector<rpc::MountReport*> mounts);
  // Live workers: id and address.
  std::vector<std::pair<uint64_t, std::string>> AliveWorkers();
  // Worker ids holding a block as one of its replicas (for tests), and as an elastic copy.
  std::vector<uint64_t> Holders(const std::string& file_key, uint64_t index);
  std::vector<uint64_t> ElasticHolders(const std::string& file_key, uint64_t index);
  // What live workers hold of a file's blocks, added to the totals.
  struct Cached {
    uint64_t distinct = 0;  // bytes of blocks held somewhere, each block once
    uint64_t replica = 0;   // bytes held as replicas, every replica copy counted
    uint64_t elastic = 0;   // bytes held as elastic copies, every copy counted
  };
  void CachedOf(const std::string& file_key, uint64_t size, uint64_t block_size, Cached* out);

 private:
  struct BlockKey {
    std::string file_key;
    uint64_t index;
    bool operator==(const BlockKey& o) const { return index == o.index && file_key == o.file_key; }
  };
  struct BlockKeyHash {
    size_t operator()(const BlockKey& k) const { return std::hash<std::string>()(k.file_key) ^ (k.index * 0x9e3779b97f4a7c15ull); }
  };
  struct BlockLoc {
    uint64_t mount_id = 0;
    uint64_t length = 0;
    std::vector<uint64_t> workers;  // replica holders
    std::vector<uint64_t> elastic;  // elastic copies
    bool empty() const { return workers.empty() && elastic.empty(); }
  };
  struct Worker {
    std::string address;
    rpc::WorkerStats stats;
    std::chrono::steady_clock::time_point last_heartbeat;
    int64_t last_heartbeat_wall_ns = 0;
    bool alive = true;
  };
  struct MountUsage {
    uint64_t bytes = 0;  // distinct blocks
    uint64_t blocks = 0;
    uint64_t replica_bytes = 0;
    uint64_t elastic_bytes = 0;
  };

  void AddLocked(uint64_t worker, const rpc::BlockRef& b) REQUIRES(mu_);
  void RemoveLocked(uint64_t worker, const rpc::BlockRef& b) REQUIRES(mu_);
  void ForgetWorkerBlocksLocked(uint64_t worker) REQUIRES(mu_);
  // Takes `worker` out of the block's holders (either kind); true when it was one.
  bool DropHolderLocked(BlockLoc& loc, uint64_t worker) REQUIRES(mu_);
  void ReleaseIfEmptyLocked(const BlockLoc& loc) REQUIRES(mu_);

  const std::chrono::milliseconds timeout_;
  Clock clock_;
  Mutex mu_;
  uint64_t next_worker_ GUARDED_BY(mu_) = 1;
  std::unordered_map<uint64_t, Worker> workers_ GUARDED_BY(mu_);
  std::unordered_map<BlockKey, BlockLoc, BlockKeyHash> blocks_ GUARDED_BY(mu_);
  std::unordered_map<uint64_t, MountUsage> usage_ GUARDED_BY(mu_);
};

}  // namespace granary::master
