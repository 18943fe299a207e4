// A Granary cluster on this machine for integration tests: granary-master, granary-worker and
// granary-fuse as real processes on OS-chosen loopback ports, in one temporary directory, with a
// real FUSE mount. Everything is stopped and unmounted by the destructor, also when a test fails.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "tests/testutil/testutil.h"

namespace granary::testing {

// GET http://address/path: (status, body); status -1 when nothing answered.
std::pair<int, std::string> HttpGet(const std::string& address, const std::string& path);

struct ClusterOptions {
  std::string block_size = "64Ki";
  std::string cache_quota = "1Gi";
  std::string worker_timeout = "30s";  // master.worker_timeout
  std::vector<std::string> extra_args;   // appended to every daemon's command line
  std::vector<std::string> worker_args;  // appended to the worker's (a tieredstore there replaces cache_dir)
  std::vector<std::string> fuse_args;    // appended to granary-fuse's
  // Put before granary-fuse's command (e.g. unshare to run it in its own namespaces, which must
  // exec it in place); the mount is then looked for in granary-fuse's own mount namespace.
  std::vector<std::string> fuse_wrapper;
  // Off by default: most tests count the worker's hits, which the kernel's page cache would take.
  // Off also runs granary-fuse in the daemon read mode (every read the page cache cannot serve
  // reaches the worker, and no page is kept across opens) unless fuse_args name a --fuse.open.
  bool keep_cache = false;
  // Masters started by the test (standby masters: comma-separated addresses): StartDaemons then
  // starts only the worker, and every daemon and the CLI are given this list.
  std::string masters;
};

class LocalCluster {
 public:
  explicit LocalCluster(const TempDir& dir, ClusterOptions opts = {});
  ~LocalCluster();

  // Starts master and worker; false (with logs in *why) on failure.
  bool StartDaemons(std::string* why);
  // Starts granary-fuse at dir/mnt.
  bool StartFuse(std::string* why);
  // Starts another granary-fuse with the same command while one serves: it takes the mount over
  // (fuse/handover.h); waits until it is ready and the old one has exited with 0.
  bool UpgradeFuse(std::string* why);
  // kill -9 granary-fuse (its keeper holds the connection), then starts it again with the same
  // command: it takes the mount over from the keeper.
  bool CrashAndRestartFuse(std::string* why);
  // Runs the CLI against this cluster's master.
  RunResult Cli(std::vector<std::string> args);
  // The worker's block-read counters, from its own /metrics (current, unlike the report's copy).
  bool WorkerCounters(uint64_t* hits, uint64_t* misses, uint64_t* ufs_bytes);

  // host:port of a daemon's /metrics endpoint ("master", "worker" or "fuse"); "" when unknown.
  std::string MetricsAddress(const std::string& daemon) const;

  // One sample of a daemon's /metrics, named exactly as exposed (`name{label="v",...}` with the
  // labels in the daemon's order); -1 when absent or the endpoint does not answer.
  double Metric(const std::string& daemon, const std::string& sample);
  // `granary report --json`, parsed (null on failure).
  nlohmann::json Report();
  // kill -9 the worker, then start it again on the same address and cache.
  void KillWorker();
  bool RestartWorker(std::string* why);
  // kill -9 the master, then start it again on the same address and data directory.
  void KillMaster();
  bool RestartMaster(std::string* why);
  pid_t master_pid() const { return master_ ? master_->pid() : -1; }
  pid_t fuse_pid() const { return fuse_ ? fuse_->pid() : -1; }
  pid_t worker_pid() const { return worker_ ? worker_->pid() : -1; }
  std::string worker_address() const { return worker_addr_; }

  // Stops FUSE, worker and master with SIGTERM; returns false if one did not exit with 0.
  bool StopAll(std::string* why);

  std::string mountpoint() const { return dir_ / "mnt"; }
  std::string master_address() const { return master_addr_; }
  std::string Logs() const;

 private:
  const TempDir& dir_;
  ClusterOptions opts_;
  std::unique_ptr<Process> master_, worker_, fuse_;
  std::vector<std::string> fuse_argv_;
  int fuse_starts_ = 0;
  bool WaitForFuse(Process* p, const std::string& ready, std::string* why);
  bool StartWorker(const std::string& listen, std::string* why);
  bool StartMaster(const std::string& listen, std::string* why);
  std::string master_addr_, worker_addr_;
};

}  // namespace granary::testing
