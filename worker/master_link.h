// MasterLink: the worker's side of its conversation with the master.
//
// One background thread registers the worker, then sends a heartbeat every
// worker.heartbeat_interval, and sooner (at most every kEarlyBeat) when the cache gained, lost or
// re-classified blocks. Registration and heartbeats carry the worker's stats, whose per-mount
// counters (held, elastic and home bytes) are all the master knows of the cache: no block list ever
// travels (master/cluster.h). The master's answers carry the live workers when the membership
// changed since the epoch the worker last got, handed to MembersFn (the PeerSet's membership). When the master answers "re-register" (it restarted and forgot this
// worker) or cannot be reached, the thread keeps trying; the worker keeps serving cached blocks
// meanwhile. GetMount() opens each mount once (MountTable, ufs/mount_table.h).
//
// Thread-safe.
#pragma once

#include <condition_variable>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "common/config.h"
#include "common/thread_annotations.h"
#include "ufs/mount_table.h"
#include "ufs/ufs.h"
#include "proto/granary.grpc.pb.h"
#include "rpc/rpc.h"
#include "worker/block_store.h"
#include "worker/interfaces.h"

namespace granary::worker {

class MasterLink final : public MountResolver, public BlockReporter {
 public:
  using StatsFn = std::function<rpc::WorkerStats()>;
  // Called with this worker's id and the live workers after every registration and heartbeat.
  using MembersFn = std::function<void(uint64_t self, const std::vector<PeerRef>& live)>;
  // Mounts are opened under `access` (ufs/access.h), this worker's own configuration.
  MasterLink(const Config& cfg, std::shared_ptr<RpcSecurity> sec, BlockStore* store, StatsFn stats,
             UfsAccess access, MembersFn members = nullptr);
  ~MasterLink() override;

  // Registers as `advertise` (the address others dial) and starts the background thread.
  void Start(const std::string& advertise);
  // The id the master gave this worker; 0 until registered (and again while re-registering).
  uint64_t worker_id();
  void Stop();

  void BlockAdded(const BlockMeta& m) override;
  void BlockRemoved(const BlockMeta& m) override;
  StatusOr<MountHandle> GetMount(uint64_t mount_id) override;
  // An unmounted dataset: its opened mount (and credentials) are dropped; a later use asks the master.
  void ForgetMount(uint64_t mount_id) { mounts_.Erase(mount_id); }
  // A file this worker wrote to the under-storage is now `req` there: the master's namespace takes
  // it (Master.CommitWrite), waiting out a failover for rpc.master_wait.
  Status CommitWrite(const rpc::CommitWriteRequest& req);
  // Calls to the under-storage of every mount this worker opened.
  const UfsCounters& ufs_counters() const { return ufs_counters_; }

 private:
  void Loop();
  Status Register();
  Status Beat();
  // What the worker holds changed: an early heartbeat is due.
  void CacheChanged();
  void Members(uint64_t self, const google::protobuf::RepeatedPtrField<rpc::PeerInfo>& workers);
  // The soonest a heartbeat goes after the last one when only the cache changed.
  static constexpr std::chrono::milliseconds kEarlyBeat{200};
  // A mount's URI and options, from the master.
  StatusOr<MountTable::Source> MountSource(uint64_t mount_id);

  const Config cfg_;
  std::shared_ptr<RpcSecurity> sec_;
  std::string advertise_;  // set once by Start
  BlockStore* store_;
  StatsFn stats_;
  MembersFn members_;
  std::unique_ptr<StubHolder<rpc::Master>> stub_;

  Mutex mu_;
  std::condition_variable cv_;
  bool stop_ GUARDED_BY(mu_) = false;
  uint64_t worker_id_ GUARDED_BY(mu_) = 0;  // 0: not registered
  uint64_t members_epoch_ GUARDED_BY(mu_) = 0;  // of the membership last handed to MembersFn
  bool changed_ GUARDED_BY(mu_) = false;  // the cache changed since the last stats sent
  UfsCounters ufs_counters_;
  MountTable mounts_;  // thread-safe on its own
  std::thread thread_;
};

}  // namespace granary::worker
