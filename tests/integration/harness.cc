#include "tests/integration/harness.h"

#include <signal.h>

#include <algorithm>
#include <sys/stat.h>
#include <unistd.h>

#include <httplib.h>
#include <nlohmann/json.hpp>

#include <sstream>

namespace granary::testing {

std::pair<int, std::string> HttpGet(const std::string& address, const std::string& path) {
  size_t colon = address.rfind(':');
  if (colon == std::string::npos) return {-1, ""};
  httplib::Client cli(address.substr(0, colon), std::stoi(address.substr(colon + 1)));
  cli.set_connection_timeout(5);
  cli.set_read_timeout(10);
  auto res = cli.Get(path.c_str());
  if (!res) return {-1, ""};
  return {res->status, res->body};
}
namespace {

std::vector<std::string> With(std::vector<std::string> argv, const std::vector<std::string>& extra) {
  argv.insert(argv.end(), extra.begin(), extra.end());
  return argv;
}

// What a daemon may open below the test's directory (ufs.local_roots, ufs.secrets_dir), unless the
// test's own arguments say otherwise.
std::vector<std::string> UfsAccessArgs(const std::string& dir, const std::vector<std::string>& extra) {
  std::vector<std::string> args;
  for (const char* key : {"--ufs.local_roots", "--ufs.secrets_dir"}) {
    if (std::find(extra.begin(), extra.end(), key) == extra.end()) args.insert(args.end(), {key, dir});
  }
  return args;
}


}  // namespace

LocalCluster::LocalCluster(const TempDir& dir, ClusterOptions opts) : dir_(dir), opts_(std::move(opts)) {
  mkdir((dir_ / "mnt").c_str(), 0755);
}

LocalCluster::~LocalCluster() {
  std::string why;
  if (fuse_) fuse_->Stop(SIGTERM, std::chrono::seconds(10));
  UnmountAllBelow(dir_.path());
  // granary-fuse's keeper (fuse.keeper spawn) is its own process: it exits when the connection
  // ends, and is stopped here in any case.
  std::string keeper = ReadFile(dir_ / "fuse.sock.keeper.pid");
  if (!keeper.empty()) {
    pid_t pid = static_cast<pid_t>(std::stol(keeper));
    kill(pid, SIGTERM);
    // Not our child: gone when /proc has no live entry for it (a zombie waits for its reaper).
    WaitFor([&] {
      std::string stat = ReadFile("/proc/" + std::to_string(pid) + "/stat");
      size_t paren = stat.rfind(')');
      return stat.empty() || (paren != std::string::npos && paren + 2 < stat.size() && stat[paren + 2] == 'Z');
    }, std::chrono::seconds(10));
  }
  fuse_.reset();
  worker_.reset();
  master_.reset();
}

bool LocalCluster::StartDaemons(std::string* why) {
  if (!opts_.masters.empty()) {
    master_addr_ = opts_.masters;
  } else if (!StartMaster("127.0.0.1:0", why)) {
    return false;
  }
  return StartWorker("127.0.0.1:0", why);
}

bool LocalCluster::StartMaster(const std::string& listen, std::string* why) {
  unlink((dir_ / "master.addr").c_str());
  master_ = std::make_unique<Process>(
      With(std::vector<std::string>{Bin("granary-master"), "--master.listen", listen, "--master.data_dir",
                                    dir_ / "master", "--master.block_size", opts_.block_size,
                                    "--master.worker_timeout", opts_.worker_timeout, "--master.metrics_listen", "127.0.0.1:0",
                                    "--ready-file", dir_ / "master.addr"},
           With(UfsAccessArgs(dir_.path(), opts_.extra_args), opts_.extra_args)),
      dir_ / "master.log");
  master_addr_ = WaitForReadyFile(dir_ / "master.addr", master_.get());
  if (master_addr_.empty()) {
    *why = "master did not start:\n" + master_->Log();
    return false;
  }
  return true;
}

void LocalCluster::KillMaster() {
  if (master_) master_->Stop(SIGKILL);
}

bool LocalCluster::RestartMaster(std::string* why) {
  KillMaster();
  return StartMaster(master_addr_, why);
}

bool LocalCluster::StartWorker(const std::string& listen, std::string* why) {
  unlink((dir_ / "worker.addr").c_str());
  std::vector<std::string> argv{Bin("granary-worker"), "--master.address", master_addr_, "--worker.listen", listen,
                                "--worker.heartbeat_interval", "200ms", "--worker.metrics_listen", "127.0.0.1:0",
                                "--ready-file", dir_ / "worker.addr"};
  argv = With(argv, UfsAccessArgs(dir_.path(), opts_.extra_args));
  bool tiered = false;
  for (const auto& a : opts_.worker_args) tiered |= a == "--worker.tieredstore.levels";
  if (!tiered) argv = With(argv, {"--worker.cache_dir", dir_ / "cache", "--worker.cache_quota", opts_.cache_quota});
  argv = With(With(argv, opts_.extra_args), opts_.worker_args);
  worker_ = std::make_unique<Process>(argv, dir_ / "worker.log");  // appends
  worker_addr_ = WaitForReadyFile(dir_ / "worker.addr", worker_.get());
  if (worker_addr_.empty()) {
    *why = "worker did not start:\n" + worker_->Log();
    return false;
  }
  return true;
}

void LocalCluster::KillWorker() {
  if (worker_) worker_->Stop(SIGKILL);
}

bool LocalCluster::RestartWorker(std::string* why) {
  KillWorker();
  return StartWorker(worker_addr_, why);
}

std::string LocalCluster::MetricsAddress(const std::string& daemon) const {
  std::string a = ReadFile(dir_ / (daemon + ".addr.metrics"));
  while (!a.empty() && (a.back() == '\n' || a.back() == ' ')) a.pop_back();
  return a;
}

double LocalCluster::Metric(const std::string& daemon, const std::string& sample) {
  std::string address = MetricsAddress(daemon);
  size_t colon = address.rfind(':');
  if (colon == std::string::npos) return -1;
  httplib::Client cli(address.substr(0, colon), std::stoi(address.substr(colon + 1)));
  cli.set_connection_timeout(5);
  auto res = cli.Get("/metrics");
  if (!res || res->status != 200) return -1;
  std::istringstream in(res->body);
  std::string line;
  while (std::getline(in, line)) {
    if (line.size() > sample.size() && line.compare(0, sample.size(), sample) == 0 && line[sample.size()] == ' ') {
      return std::stod(line.substr(sample.size() + 1));
    }
  }
  return -1;
}

nlohmann::json LocalCluster::Report() {
  RunResult r = Cli({"report", "--json"});
  if (r.code != 0) return nullptr;
  auto j = nlohmann::json::parse(r.out, nullptr, false);
  return j.is_discarded() ? nlohmann::json() : j;
}

bool LocalCluster::StartFuse(std::string* why) {
  unlink((dir_ / "fuse.addr").c_str());
  std::vector<std::string> argv =
      With(opts_.fuse_wrapper, {Bin("granary-fuse"), "--master.address", master_addr_, "--fuse.worker", worker_addr_,
                                "--fuse.mountpoint", mountpoint(), "--fuse.metrics_listen", "127.0.0.1:0",
                                "--fuse.handover_socket", dir_ / "fuse.sock", "--fuse.keep_cache",
                                opts_.keep_cache ? "true" : "false"});
  if (!opts_.keep_cache &&
      std::find(opts_.fuse_args.begin(), opts_.fuse_args.end(), "--fuse.open") == opts_.fuse_args.end()) {
    argv = With(argv, {"--fuse.open", "daemon"});
  }
  fuse_argv_ = With(With(argv, opts_.extra_args), opts_.fuse_args);
  fuse_ = std::make_unique<Process>(With(fuse_argv_, {"--ready-file", dir_ / "fuse.addr"}), dir_ / "fuse.log");
  return WaitForFuse(fuse_.get(), dir_ / "fuse.addr", why);
}

bool LocalCluster::WaitForFuse(Process* p, const std::string& ready, std::string* why) {
  bool mounted = !WaitForReadyFile(ready, p).empty();
  if (mounted && opts_.fuse_wrapper.empty()) mounted = IsMounted(mountpoint());
  if (mounted && !opts_.fuse_wrapper.empty()) {
    mounted = ReadFile("/proc/" + std::to_string(p->pid()) + "/mountinfo").find(" " + mountpoint() + " ") !=
              std::string::npos;
  }
  if (!mounted) {
    *why = "fuse did not mount:\n" + p->Log();
    return false;
  }
  return true;
}

bool LocalCluster::UpgradeFuse(std::string* why) {
  std::string n = std::to_string(++fuse_starts_);
  std::string ready = dir_ / ("fuse" + n + ".addr");
  unlink(ready.c_str());
  auto next = std::make_unique<Process>(With(fuse_argv_, {"--ready-file", ready}), dir_ / ("fuse" + n + ".log"));
  if (!WaitForFuse(next.get(), ready, why)) return false;
  if (next->Log().find("took over the FUSE connection") == std::string::npos) {
    *why = "the new granary-fuse did not take the connection over:\n" + next->Log();
    return false;
  }
  int code = fuse_->Wait(std::chrono::seconds(60));
  if (code != 0) {
    *why = "the old granary-fuse exited with " + std::to_string(code) + " after the hand-over:\n" + fuse_->Log();
    return false;
  }
  // The metrics address of the serving process, where tests look for it.
  (void)WriteFile(dir_ / "fuse.addr.metrics", ReadFile(ready + ".metrics"));
  fuse_ = std::move(next);
  return true;
}

bool LocalCluster::CrashAndRestartFuse(std::string* why) {
  fuse_->Stop(SIGKILL);
  std::string n = std::to_string(++fuse_starts_);
  std::string ready = dir_ / ("fuse" + n + ".addr");
  unlink(ready.c_str());
  fuse_ = std::make_unique<Process>(With(fuse_argv_, {"--ready-file", ready}), dir_ / ("fuse" + n + ".log"));
  if (!WaitForFuse(fuse_.get(), ready, why)) return false;
  if (fuse_->Log().find("took over the FUSE connection of " + mountpoint() + " from the keeper") == std::string::npos) {
    *why = "the restarted granary-fuse did not take the connection over from the keeper:\n" + fuse_->Log();
    return false;
  }
  (void)WriteFile(dir_ / "fuse.addr.metrics", ReadFile(ready + ".metrics"));
  return true;
}

RunResult LocalCluster::Cli(std::vector<std::string> args) {
  args.insert(args.begin(), {Bin("granary"), "--master", master_addr_});
  return RunCommand(args, {{"GRANARY_HOME", dir_ / "home"}});
}

bool LocalCluster::WorkerCounters(uint64_t* hits, uint64_t* misses, uint64_t* ufs_bytes) {
  // From the worker's own /metrics, which are read at scrape time: `granary report` has them only
  // as of the worker's last heartbeat.
  double cache = Metric("worker", "granary_worker_block_reads_total{source=\"cache\"}");
  double zero_copy = Metric("worker", "granary_worker_block_reads_total{source=\"zero_copy\"}");
  double miss = Metric("worker", "granary_worker_cache_misses_total");
  double ufs = Metric("worker", "granary_worker_ufs_read_bytes_total");
  if (cache < 0 || zero_copy < 0 || miss < 0 || ufs < 0) return false;
  *hits = static_cast<uint64_t>(cache + zero_copy);
  *misses = static_cast<uint64_t>(miss);
  *ufs_bytes = static_cast<uint64_t>(ufs);
  return true;
}

bool LocalCluster::StopAll(std::string* why) {
  bool ok = true;
  for (auto* p : {&fuse_, &worker_, &master_}) {
    if (!*p) continue;
    int code = (*p)->Stop(SIGTERM);
    if (code != 0) {
      ok = false;
      *why += "a daemon exited with " + std::to_string(code) + "\n";
    }
  }
  if (IsMounted(mountpoint())) {
    ok = false;
    *why += "mount still present after stop\n";
  }
  if (!ok) *why += Logs();
  return ok;
}

std::string LocalCluster::Logs() const {
  std::string logs = "--- master\n" + ReadFile(dir_ / "master.log") + "--- worker\n" + ReadFile(dir_ / "worker.log") +
                     "--- fuse\n" + ReadFile(dir_ / "fuse.log");
  // Successors of hand-overs and restarts after crashes (UpgradeFuse, CrashAndRestartFuse).
  for (int n = 1; n <= fuse_starts_; ++n) {
    logs += "--- fuse" + std::to_string(n) + "\n" + ReadFile(dir_ / ("fuse" + std::to_string(n) + ".log"));
  }
  return logs;
}

}  // namespace granary::testing
