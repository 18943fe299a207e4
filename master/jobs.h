// JobManager: `granary load` as one job per request, run by the master, kept in RocksDB.
//
// Design
// ------
// A job walks its paths in the namespace (Namespace::ForEachFile: depth first, in listing order,
// the same order on every walk of an unchanged tree) in two phases:
//   SCANNING  directories are listed in bulk from the under-storage (Namespace::LoadTree), then
//             walked once to count the files and bytes that pass the globs (the progress totals).
//             --metadata-only jobs end here. The listing stops at its next page when the job is
//             cancelled or the master stops, and a resumed job continues it after the namespace's
//             load cursor.
//   LOADING   the walk again, cut into batches of at most kBatchFiles files / kBatchBytes bytes.
//             Every batch goes to every live worker at once (Worker.LoadBlocks) with the list of
//             those workers; each worker ranks every block over that list (rendezvous, as PeerSet
//             does) and loads the blocks it is among the first `replicas` of: the home from the
//             under-storage, other holders from the home. So a block is fetched from the
//             under-storage once and kept on exactly `replicas` workers, and no job ever becomes one
//             task per file (Alluxio's warm-up did, and fell over at millions of files).
// kInFlight batches run at once; their results are applied in walk order, and after each the
// job's record — counters and `checkpoint`, the number of files in walk order whose batches are
// done — is written to RocksDB. A restarted master resumes unfinished jobs: LOADING jobs walk
// again and skip the first `checkpoint` files, so the counters are exactly those of completed
// batches. Loading is idempotent: blocks already cached are skipped by the workers (blocks_cached).
//
// A worker that fails a batch (retryable error: it died) is left out of that batch's worker list
// and the batch is sent again to the others (up to kBatchAttempts), whose
// rankings then give them the dead worker's share. Files that still fail are recorded with their
// reasons (the first kMaxFailures), and the job ends FAILED; otherwise SUCCEEDED.
//
// With no live worker (a master just restarted, before the workers' next heartbeat) a batch waits
// up to kWaitForWorkers. Jobs run one at a time, in submission order. Cancel() ends a pending job at once and a running
// one at its next step (its in-flight worker calls are cancelled).
//
// RocksDB records (under the namespace's J prefix; be64 ids sort numerically):
//   J s be64(id)  -> LoadJobSpecRecord  the request, whole (a --from-file list can be long)
//   J j be64(id)  -> LoadJobRecord      state and counters, with spec.paths cut to kListedPaths
//
// Thread-safe: `mu_` guards the in-memory jobs and the queue; one runner thread does the work.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "common/status.h"
#include "common/thread_annotations.h"
#include "master/cluster.h"
#include "master/namespace.h"
#include "proto/granary.grpc.pb.h"
#include "rpc/rpc.h"

namespace grpc {
class ClientContext;
}

namespace granary::master {

class JobManager {
 public:
  static constexpr size_t kBatchFiles = 512;
  static constexpr uint64_t kBatchBytes = 256ull << 20;
  static constexpr size_t kInFlight = 2;
  static constexpr int kBatchAttempts = 4;
  static constexpr std::chrono::seconds kWaitForWorkers{120};
  static constexpr size_t kMaxFailures = 100;
  static constexpr size_t kListedPaths = 8;
  static constexpr uint32_t kDefaultParallel = 8;
  // Fetch-ahead jobs (spec.fetch_ahead, started by FetchAhead): smaller batches, so the evidence
  // gate is fine-grained and the first blocks land soon, and more of them in flight, so a batch's
  // slowest block never leaves the link idle.
  static constexpr size_t kAheadBatchFiles = 128;
  static constexpr uint64_t kAheadBatchBytes = 32ull << 20;
  static constexpr size_t kAheadInFlight = 4;

  // Before each batch of fetch-ahead job `id` is sent, with `sent` bytes so far (fetched by its
  // finished batches, plus the size of those in flight; what was cached already does not count):
  // kGo sends it; kWait means the evidence does not allow it yet (the gate waited a little; the
  // job applies its finished batches and asks again); kStop ends the job, with *why.
  enum class AheadVerdict { kGo, kWait, kStop };
  using AheadGate = std::function<AheadVerdict(uint64_t id, uint64_t sent, std::string* why)>;
  // A fetch-ahead job ended (its final record).
  using AheadEnded = std::function<void(const rpc::LoadJob& job)>;
  void SetAheadHooks(AheadGate gate, AheadEnded ended);

  // `workers` is the master's pool of worker stubs (shared with its other calls to workers).
  JobManager(Namespace* ns, Cluster* cluster, std::shared_ptr<StubPool<rpc::Worker>> workers);
  ~JobManager();

  // Reads the jobs from RocksDB, queues the unfinished ones (resumed) and starts the runner.
  Status Start();
  // Stops the runner; a running job stays as it is in RocksDB and resumes on the next Start().
  void Stop();

  // Checks the request (paths exist, replicas within the live workers, globs) and queues the job.
  // Fetch-ahead jobs (spec.fetch_ahead) have a runner of their own, one at a time, so neither a
  // user's load nor an epoch's fetch-ahead waits behind the other.
  StatusOr<rpc::LoadJob> Submit(const rpc::LoadJobSpec& spec);
  StatusOr<rpc::LoadJob> Get(uint64_t id);
  std::vector<rpc::LoadJob> List();  // newest first
  // Cancels a pending or running job; a finished one is returned unchanged (FAILED_PRECONDITION).
  StatusOr<rpc::LoadJob> Cancel(uint64_t id);
  // Cancels every unfinished job (loads and fetch-aheads) with a path at or below `path`: a
  // dataset unmounted there (its batches in flight are cancelled too). How many were.
  size_t CancelWithin(const std::string& path);

  // For /metrics: jobs by state, and the totals of every job's counters.
  struct Totals {
    std::map<rpc::JobState, uint64_t> by_state;
    uint64_t files_done = 0, bytes_done = 0, bytes_fetched = 0, files_failed = 0;
  };
  Totals GetTotals();

  // True once job `id` was cancelled, or the manager is stopping.
  bool Cancelled(uint64_t id);

 private:
  struct Batch;
  void RunLoop(bool ahead);
  // `job` as Get and List answer it: a pending one says which job it waits behind.
  rpc::LoadJob WithQueueLocked(const rpc::LoadJob& job) const REQUIRES(mu_);
  void Run(uint64_t id);
  Status Scan(uint64_t id, const rpc::LoadJobSpec& spec);
  Status Load(uint64_t id, const rpc::LoadJobSpec& spec);
  // Sends `b` to the live workers (again after failures); fills its results.
  void RunBatch(uint64_t id, const rpc::LoadJobSpec& spec, Batch* b);
  void Apply(uint64_t id, const Batch& b);
  // Writes the job's record from memory.
  Status Persist(uint64_t id);
  template <typename Fn>
  void Update(uint64_t id, Fn fn);

  Namespace* ns_;
  MetaStore* records_;  // the jobs' records (ns_->meta())
  Cluster* cluster_;
  std::shared_ptr<StubPool<rpc::Worker>> workers_;

  Mutex mu_;
  std::condition_variable cv_;
  std::map<uint64_t, rpc::LoadJob> jobs_ GUARDED_BY(mu_);
  std::deque<uint64_t> queue_ GUARDED_BY(mu_);  // pending and resumed jobs, in order
  std::deque<uint64_t> ahead_queue_ GUARDED_BY(mu_);  // fetch-ahead jobs, in order
  std::set<uint64_t> cancelled_ GUARDED_BY(mu_);
  std::map<grpc::ClientContext*, uint64_t> calls_ GUARDED_BY(mu_);  // in-flight worker calls, by job
  AheadGate ahead_gate_ GUARDED_BY(mu_);
  AheadEnded ahead_ended_ GUARDED_BY(mu_);
  uint64_t next_id_ GUARDED_BY(mu_) = 1;
  bool stop_ GUARDED_BY(mu_) = false;
  std::thread runner_;
  std::thread ahead_runner_;
};

}  // namespace granary::master
