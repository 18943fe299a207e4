// Cluster: the master's view of its workers — who is alive, at which address, and what each one
// reports about itself (WorkerStats, including per-mount counters of what it caches).
//
// Design note. The master keeps no map of cached blocks. Placement is rendezvous hashing over the
// live workers (worker/peers.h), so where a block should be is computed, not looked up; each worker
// indexes its own blocks and keeps, per mount, how many bytes it holds, how many of them are
// elastic copies and of how many blocks it is the home (the first of the ranking). The master sums
// those counters over the live workers for `granary report` and the metrics, and asks the workers
// (GetResidency) when it needs a per-file answer (`granary du`, master/cache_admin.h). Its memory
// is then independent of how much is cached, and a restarted master knows the cached figures as
// soon as each worker registers again (registration carries the counters, never a block list).
// The price: `cached_bytes` counts a block at its home only, so a block held only away from its
// home (for a moment after the membership changed, or when its home evicted it) shows in
// replica_bytes / elastic_bytes but not in cached_bytes. docs/architecture.md has the trade-off.
//
// A restarted master answers the first heartbeat of an unknown worker with "re-register". A worker
// silent for `worker_timeout` is marked dead and stops counting. Membership has an epoch, bumped at
// every change, so a heartbeat carries the worker list only when the worker's copy is stale.
//
// Thread-safe: one mutex guards everything; every method is short (FillReport is O(workers x
// mounts of each)).
#pragma once

#include <atomic>
#include <chrono>
#include <functional>
#include <string>
#include <unordered_map>
#include <vector>

#include "common/thread_annotations.h"
#include "proto/granary.pb.h"
#include "proto/meta.pb.h"

namespace granary::master {

class Cluster {
 public:
  using Clock = std::function<std::chrono::steady_clock::time_point()>;
  explicit Cluster(std::chrono::milliseconds worker_timeout, Clock clock = std::chrono::steady_clock::now);

  // Registers a worker (one at the same address is replaced) and returns its id.
  uint64_t RegisterWorker(const rpc::RegisterWorkerRequest& req);
  // False when the worker is unknown, was declared dead, or (with a non-empty `address`) the id
  // belongs to another address — a restarted master handed it out again: it must register again.
  bool Heartbeat(uint64_t worker_id, const rpc::WorkerStats& stats, const std::string& address = "");
  // Stats only (an older worker's ReportBlocks); false as Heartbeat.
  bool UpdateStats(uint64_t worker_id, const rpc::WorkerStats& stats);
  // Marks workers without a recent heartbeat dead: they leave the membership and the figures.
  void ExpireWorkers();

  // Workers (stats included) and, for each of `mounts`, the cached figures summed over the live
  // workers: cached_bytes/cached_blocks (each block once, at its home), replica_bytes and
  // elastic_bytes (every copy).
  void FillReport(rpc::Report* report, const std::vector<rpc::MountReport*>& mounts);
  // Live workers: id and address.
  std::vector<std::pair<uint64_t, std::string>> AliveWorkers();
  // The membership's epoch (changes whenever a worker joins, is replaced or dies) and, when
  // `known` differs from it, the live workers into *out.
  uint64_t Members(uint64_t known, google::protobuf::RepeatedPtrField<rpc::PeerInfo>* out);

  // Standby masters: the live workers as a record (the leader writes it whenever the epoch
  // changes), and a new leader taking them back (alive, as if each had just sent a heartbeat; one
  // that does not heartbeat within worker_timeout is expired as usual). Restore starts a new epoch.
  MembersRecord Record(uint64_t* epoch = nullptr);

  void Restore(const MembersRecord& r);

 private:
  struct Worker {
    std::string address;
    rpc::WorkerStats stats;
    std::chrono::steady_clock::time_point last_heartbeat;
    int64_t last_heartbeat_wall_ns = 0;
    bool alive = true;
  };

  const std::chrono::milliseconds timeout_;
  Clock clock_;
  Mutex mu_;
  uint64_t next_worker_ GUARDED_BY(mu_) = 1;
  uint64_t epoch_ GUARDED_BY(mu_) = 1;
  std::unordered_map<uint64_t, Worker> workers_ GUARDED_BY(mu_);
};

}  // namespace granary::master
