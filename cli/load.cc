#include "cli/load.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <thread>

#include "cli/cli.h"
#include "common/units.h"

namespace granary::cli {
namespace {

constexpr auto kFollowRetry = std::chrono::minutes(5);
constexpr auto kTtyEvery = std::chrono::milliseconds(200);
constexpr auto kLineEvery = std::chrono::seconds(5);

std::string StateName(rpc::JobState s) {
  std::string n = rpc::JobState_Name(s).substr(4);  // JOB_LOADING -> loading
  for (auto& c : n) c = static_cast<char>(std::tolower(c));
  return n;
}

bool Ended(rpc::JobState s) { return s == rpc::JOB_SUCCEEDED || s == rpc::JOB_FAILED || s == rpc::JOB_CANCELLED; }

std::string Pct(uint64_t part, uint64_t whole) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%5.1f%%", whole ? 100.0 * static_cast<double>(part) / static_cast<double>(whole) : 0.0);
  return buf;
}

std::string Clock(double seconds) {
  if (seconds < 0 || seconds > 359999) return "--:--";
  auto s = static_cast<uint64_t>(seconds);
  char buf[32];
  if (s >= 3600) {
    std::snprintf(buf, sizeof buf, "%llu:%02llu:%02llu", static_cast<unsigned long long>(s / 3600),
                  static_cast<unsigned long long>(s / 60 % 60), static_cast<unsigned long long>(s % 60));
  } else {
    std::snprintf(buf, sizeof buf, "%llu:%02llu", static_cast<unsigned long long>(s / 60),
                  static_cast<unsigned long long>(s % 60));
  }
  return buf;
}

nlohmann::json JobJson(const rpc::LoadJob& j) {
  nlohmann::json f = nlohmann::json::array();
  for (const auto& x : j.failures()) f.push_back({{"path", x.path()}, {"reason", x.reason()}});
  double secs = j.started_ns() ? static_cast<double>((j.finished_ns() ? j.finished_ns() : 0) - j.started_ns()) / 1e9 : 0;
  return {{"id", j.id()},
          {"state", StateName(j.state())},
          {"paths", std::vector<std::string>(j.spec().paths().begin(), j.spec().paths().end())},
          {"paths_total", j.paths_total()},
          {"replicas", j.spec().replicas()},
          {"metadata_only", j.spec().metadata_only()},
          {"fetch_ahead", j.spec().fetch_ahead()},
          {"note", j.note()},
          {"waiting_behind", j.waiting_behind()},
          {"jobs_ahead", j.jobs_ahead()},
          {"files_total", j.files_total()},
          {"bytes_total", j.bytes_total()},
          {"files_done", j.files_done()},
          {"bytes_done", j.bytes_done()},
          {"files_failed", j.files_failed()},
          {"blocks_fetched", j.blocks_fetched()},
          {"bytes_fetched", j.bytes_fetched()},
          {"blocks_cached", j.blocks_cached()},
          {"resumed", j.resumed()},
          {"error", j.error()},
          {"failures", f},
          {"seconds", j.finished_ns() ? secs : 0.0}};
}

// Rate over the last samples, for the bar and the ETA.
class RateMeter {
 public:
  void Add(uint64_t bytes) {
    auto now = std::chrono::steady_clock::now();
    samples_.push_back({now, bytes});
    while (samples_.size() > 2 && now - samples_.front().first > std::chrono::seconds(10)) samples_.erase(samples_.begin());
  }
  double BytesPerSecond() const {
    if (samples_.size() < 2) return 0;
    double dt = std::chrono::duration<double>(samples_.back().first - samples_.front().first).count();
    return dt > 0 ? static_cast<double>(samples_.back().second - samples_.front().second) / dt : 0;
  }

 private:
  std::vector<std::pair<std::chrono::steady_clock::time_point, uint64_t>> samples_;
};

std::string ProgressText(const rpc::LoadJob& j, double rate, bool bar) {
  std::string out;
  uint64_t done = j.files_done() + j.files_failed();
  if (bar) {
    const int width = 30;
    double frac = j.files_total() ? static_cast<double>(done) / static_cast<double>(j.files_total()) : 0.0;
    if (j.state() == rpc::JOB_SUCCEEDED) frac = 1.0;
    int fill = static_cast<int>(frac * width + 0.5);
    out = "[" + std::string(fill, '#') + std::string(width - fill, '.') + "] ";
  }
  if (j.state() == rpc::JOB_PENDING && j.waiting_behind() != 0) {
    // What it waits for (issue 54: a load behind a throttled one said "pending: 0 files" for 23 s).
    return out + "pending: waiting for job " + std::to_string(j.waiting_behind()) + " to end (" +
           std::to_string(j.jobs_ahead()) + (j.jobs_ahead() == 1 ? " job" : " jobs") +
           " ahead; loads run one at a time: granary jobs lists them, granary load --cancel " +
           std::to_string(j.waiting_behind()) + " stops that one)";
  }
  if (j.state() == rpc::JOB_SCANNING || j.state() == rpc::JOB_PENDING) {
    return out + StateName(j.state()) + ": " + std::to_string(j.files_total()) + " files, " +
           FormatBytes(j.bytes_total()) + " so far";
  }
  if (j.spec().metadata_only()) {
    // Nothing is fetched: no byte rate, no ETA in bytes (it printed "8.0Mi/s" of listing).
    return out + std::to_string(done) + "/" + std::to_string(j.files_total()) + " files listed  failed " +
           std::to_string(j.files_failed());
  }
  uint64_t total_files = j.files_total();
  uint64_t pct_whole = j.bytes_total() ? j.bytes_total() : total_files;
  uint64_t pct_part = j.bytes_total() ? j.bytes_done() : done;
  if (j.state() == rpc::JOB_SUCCEEDED) pct_part = pct_whole;
  double eta = rate > 0 ? static_cast<double>(j.bytes_total() - std::min(j.bytes_total(), j.bytes_done())) / rate : -1;
  out += Pct(pct_part, pct_whole) + "  " + std::to_string(done) + "/" + std::to_string(total_files) + " files  " +
         FormatBytes(j.bytes_done()) + "/" + FormatBytes(j.bytes_total()) + "  " + FormatBytes(static_cast<uint64_t>(rate)) +
         "/s  ETA " + Clock(eta) + "  failed " + std::to_string(j.files_failed());
  return out;
}

void PrintSummary(const rpc::LoadJob& j) {
  // Its own running time; a wait behind other jobs is said apart.
  const int64_t started = j.started_ns() != 0 ? j.started_ns() : j.finished_ns();
  const double secs = std::max(0.0, static_cast<double>(j.finished_ns() - started) / 1e9);
  const double waited = j.created_ns() != 0 ? std::max(0.0, static_cast<double>(started - j.created_ns()) / 1e9) : 0;
  char timing[96];
  if (waited >= 1) {
    std::snprintf(timing, sizeof timing, "ran %.1fs after waiting %.1fs for other jobs", secs, waited);
  } else {
    std::snprintf(timing, sizeof timing, "%.1fs", secs);
  }
  if (j.spec().metadata_only()) {
    std::printf("load %llu %s: %s listed (%s in the under-storage), metadata only, %llu failed, %s\n",
                static_cast<unsigned long long>(j.id()), StateName(j.state()).c_str(),
                Count(j.files_done(), "file").c_str(), FormatBytes(j.bytes_total()).c_str(),
                static_cast<unsigned long long>(j.files_failed()), timing);
  } else {
    std::printf("load %llu %s: %llu of %s (%s of %s), %s fetched, %s already cached, %llu failed, %s\n",
                static_cast<unsigned long long>(j.id()), StateName(j.state()).c_str(),
                static_cast<unsigned long long>(j.files_done()), Count(j.files_total(), "file").c_str(),
                FormatBytes(j.bytes_done()).c_str(), FormatBytes(j.bytes_total()).c_str(),
                FormatBytes(j.bytes_fetched()).c_str(), Count(j.blocks_cached(), "block").c_str(),
                static_cast<unsigned long long>(j.files_failed()), timing);
  }
  if (!j.error().empty()) std::printf("  error: %s\n", j.error().c_str());
  for (const auto& f : j.failures()) std::printf("  failed: %s: %s\n", f.path().c_str(), f.reason().c_str());
  if (j.files_failed() > static_cast<uint64_t>(j.failures_size())) {
    std::printf("  ... and %llu more failures (the first %d are kept)\n",
                static_cast<unsigned long long>(j.files_failed() - j.failures_size()), j.failures_size());
  }
}

StatusOr<std::vector<std::string>> ReadList(const std::string& file) {
  std::ifstream f;
  std::istream* in = &std::cin;
  if (file != "-") {
    f.open(file);
    if (!f) return NotFoundError("--from-file " + file + ": cannot open it (one namespace path per line)");
    in = &f;
  }
  std::vector<std::string> out;
  std::string line;
  while (std::getline(*in, line)) {
    while (!line.empty() && (line.back() == '\r' || line.back() == ' ' || line.back() == '\t')) line.pop_back();
    size_t start = line.find_first_not_of(" \t");
    if (start == std::string::npos || line[start] == '#') continue;
    out.push_back(line.substr(start));
  }
  if (out.empty()) return InvalidArgumentError("--from-file " + file + " names no path (one namespace path per line)");
  return out;
}

// Follows a job until it ends; returns the exit code.
int Follow(MasterConn& m, uint64_t id, bool json) {
  const bool tty = !json && isatty(STDOUT_FILENO);
  RateMeter meter;
  auto last_line = std::chrono::steady_clock::now() - kLineEvery;
  auto unreachable_since = std::chrono::steady_clock::time_point{};
  bool warned = false;
  rpc::LoadJob j;
  for (;;) {
    rpc::GetJobRequest req;
    req.set_id(id);
    Status st = m.Call(&rpc::Master::Stub::GetJob, req, &j);
    auto now = std::chrono::steady_clock::now();
    if (!st.ok()) {
      if (!st.IsRetryable()) return Fail(st);
      if (unreachable_since == std::chrono::steady_clock::time_point{}) unreachable_since = now;
      if (now - unreachable_since > kFollowRetry) return Fail(st);
      if (!warned && !json) {
        std::fprintf(stderr, "%sgranary: the master is unreachable; the job resumes when it is back. Waiting...\n",
                     tty ? "\n" : "");
        warned = true;
      }
      std::this_thread::sleep_for(std::chrono::seconds(1));
      continue;
    }
    unreachable_since = {};
    warned = false;
    meter.Add(j.bytes_done());
    bool ended = Ended(j.state());
    if (tty) {
      std::printf("\r\033[2K%s", ProgressText(j, meter.BytesPerSecond(), true).c_str());
      if (ended) std::printf("\n");
      std::fflush(stdout);
    } else if (!json && (ended || now - last_line >= kLineEvery)) {
      // A pending or scanning job's text names its state itself ("pending pending: ..." before).
      const bool named = j.state() == rpc::JOB_PENDING || j.state() == rpc::JOB_SCANNING;
      std::printf("load %llu: %s%s\n", static_cast<unsigned long long>(id),
                  named ? "" : (StateName(j.state()) + " ").c_str(), ProgressText(j, meter.BytesPerSecond(), false).c_str());
      std::fflush(stdout);
      last_line = now;
    }
    if (ended) break;
    std::this_thread::sleep_for(tty ? kTtyEvery : std::chrono::milliseconds(500));
  }
  if (json) {
    std::printf("%s\n", JobJson(j).dump(2).c_str());
  } else {
    PrintSummary(j);
  }
  return j.state() == rpc::JOB_SUCCEEDED ? 0 : 1;
}

}  // namespace

int CmdLoad(MasterConn& m, const LoadOptions& o) {
  if (o.cancel != 0) {
    rpc::CancelJobRequest req;
    req.set_id(o.cancel);
    rpc::LoadJob j;
    Status st = m.Call(&rpc::Master::Stub::CancelJob, req, &j);
    if (!st.ok()) return Fail(st);
    if (o.json) {
      std::printf("%s\n", JobJson(j).dump(2).c_str());
    } else {
      std::printf("load %llu: %s\n", static_cast<unsigned long long>(j.id()),
                  Ended(j.state()) ? StateName(j.state()).c_str() : "cancelling");
    }
    return 0;
  }
  rpc::LoadJobSpec spec;
  for (const auto& p : o.paths) spec.add_paths(p);
  if (!o.from_file.empty()) {
    auto list = ReadList(o.from_file);
    if (!list.ok()) return Fail(list.status());
    for (auto& p : *list) spec.add_paths(std::move(p));
  }
  if (spec.paths().empty()) return Fail(InvalidArgumentError("load: name a PATH, or --from-file LIST"));
  for (const auto& g : o.include) spec.add_include(g);
  for (const auto& g : o.exclude) spec.add_exclude(g);
  spec.set_replicas(o.replicas);
  spec.set_parallel(o.parallel);
  spec.set_metadata_only(o.metadata_only);
  if (!o.bandwidth.empty()) {
    std::string rate = o.bandwidth;
    if (rate.size() > 2 && rate.compare(rate.size() - 2, 2, "/s") == 0) rate.resize(rate.size() - 2);
    auto b = ParseBytes(rate);
    if (!b.ok() || *b == 0) {
      return Fail(InvalidArgumentError("--bandwidth " + o.bandwidth +
                                       ": give bytes per second, e.g. 100Mi or 50M/s (a positive size)"));
    }
    spec.set_bandwidth(*b);
  }
  rpc::LoadJob j;
  Status st = m.Call(&rpc::Master::Stub::SubmitLoad, spec, &j);
  if (!st.ok()) return Fail(st);
  if (o.background) {
    if (o.json) {
      std::printf("%s\n", JobJson(j).dump(2).c_str());
    } else {
      std::printf("load %llu submitted; follow it with `granary jobs`, stop it with `granary load --cancel %llu`\n",
                  static_cast<unsigned long long>(j.id()), static_cast<unsigned long long>(j.id()));
    }
    return 0;
  }
  if (!o.json && !isatty(STDOUT_FILENO)) {
    std::printf("load %llu submitted\n", static_cast<unsigned long long>(j.id()));
  }
  return Follow(m, j.id(), o.json);
}

int CmdJobs(MasterConn& m, bool json) {
  rpc::ListJobsResponse resp;
  Status st = m.Call(&rpc::Master::Stub::ListJobs, rpc::ListJobsRequest(), &resp);
  if (!st.ok()) return Fail(st);
  if (json) {
    nlohmann::json out = nlohmann::json::array();
    for (const auto& j : resp.jobs()) out.push_back(JobJson(j));
    std::printf("%s\n", out.dump(2).c_str());
    return 0;
  }
  std::printf("%-6s %-10s %8s %17s %21s %8s  %s\n", "ID", "STATE", "DONE", "FILES", "BYTES", "FAILED", "PATHS");
  for (const auto& j : resp.jobs()) {
    std::string paths;
    for (const auto& p : j.spec().paths()) paths += (paths.empty() ? "" : " ") + p;
    if (j.paths_total() > static_cast<uint64_t>(j.spec().paths_size())) {
      paths += " (+" + std::to_string(j.paths_total() - j.spec().paths_size()) + " more)";
    }
    if (j.spec().metadata_only()) paths += " [metadata only]";
    if (j.spec().fetch_ahead()) paths += " [fetch-ahead" + (j.note().empty() ? "" : ": " + j.note()) + "]";
    std::string files = std::to_string(j.files_done()) + "/" + std::to_string(j.files_total());
    std::string bytes = FormatBytes(j.bytes_done()) + "/" + FormatBytes(j.bytes_total());
    std::printf("%-6llu %-10s %8s %17s %21s %8llu  %s\n", static_cast<unsigned long long>(j.id()),
                StateName(j.state()).c_str(), Pct(j.bytes_done(), j.bytes_total()).c_str(), files.c_str(), bytes.c_str(),
                static_cast<unsigned long long>(j.files_failed()), paths.c_str());
  }
  return 0;
}

int CmdDu(MasterConn& m, const std::string& path, bool json) {
  rpc::DuRequest req;
  req.set_path(path);
  rpc::DuResponse resp;
  Status st = m.Call(&rpc::Master::Stub::Du, req, &resp);
  if (!st.ok()) return Fail(st);
  if (resp.workers_failed() > 0) {
    std::fprintf(stderr,
                 "warning: %u of %u live workers did not answer; the blocks they hold are not counted (the "
                 "master's log names them; try again once they are back)\n",
                 resp.workers_failed(), resp.workers());
  }
  auto entry_json = [](const rpc::DuEntry& e) {
    return nlohmann::json{{"path", e.path()},           {"files", e.files()},
                          {"bytes", e.bytes()},         {"cached_bytes", e.cached_bytes()},
                          {"replica_bytes", e.replica_bytes()}, {"elastic_bytes", e.elastic_bytes()},
                          {"pinned", e.pinned()}};
  };
  if (json) {
    nlohmann::json out{{"total", entry_json(resp.total())},
                       {"entries", nlohmann::json::array()},
                       {"workers", resp.workers()},
                       {"workers_failed", resp.workers_failed()}};
    for (const auto& e : resp.entries()) out["entries"].push_back(entry_json(e));
    std::printf("%s\n", out.dump(2).c_str());
    return 0;
  }
  // CACHED counts each block once; REPLICAS every replica copy; ELASTIC the nodes' extra local
  // copies (evicted first, see cache.elastic).
  std::printf("%12s %12s %8s %10s %12s %12s  %s\n", "UFS SIZE", "CACHED", "CACHED%", "FILES", "REPLICAS", "ELASTIC",
              "PATH");
  auto line = [](const rpc::DuEntry& e) {
    std::printf("%12s %12s %8s %10llu %12s %12s  %s%s\n", FormatBytes(e.bytes()).c_str(),
                FormatBytes(e.cached_bytes()).c_str(), Pct(e.cached_bytes(), e.bytes()).c_str(),
                static_cast<unsigned long long>(e.files()), FormatBytes(e.replica_bytes()).c_str(),
                FormatBytes(e.elastic_bytes()).c_str(), e.path().c_str(), e.pinned() ? "  (pinned)" : "");
  };
  for (const auto& e : resp.entries()) line(e);
  line(resp.total());
  return 0;
}

}  // namespace granary::cli
