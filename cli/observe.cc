#include "cli/observe.h"

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <fstream>
#include <iostream>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <thread>

#include <nlohmann/json.hpp>

#include "cli/cli.h"
#include "cli/master_conn.h"
#include "common/fs.h"
#include "common/hash.h"
#include "common/keys.h"
#include "common/net.h"
#include "common/shutdown.h"
#include "common/stream_socket.h"
#include "common/units.h"
#include "proto/granary.grpc.pb.h"
#include "rpc/rpc.h"
#include "ufs/http.h"

namespace granary::cli {
namespace {

using nlohmann::json;

// ---- Finding the node: the granary-fuse serving a path -------------------------------------

struct MountEndpoints {
  std::string mountpoint;
  std::string root = "/";  // the namespace path shown at the mount point
  pid_t pid = 0;
  std::string metrics;  // host:port of granary-fuse's /metrics ("" when off)
  std::string trace;    // the access trace's unix socket (root and granary-fuse's user only)
  std::string worker;   // the node's worker
  std::string master;
};

bool ProcessAlive(pid_t pid) { return pid > 0 && (kill(pid, 0) == 0 || errno == EPERM); }

// The mount holding `path` (or fuse.mountpoint when empty): the closest directory at or above it
// for which a live granary-fuse left its endpoints file. nullopt when there is none.
StatusOr<std::optional<MountEndpoints>> FindMount(const Config& cfg, const std::string& path, bool required) {
  std::string p = path.empty() ? cfg.fuse.mountpoint : path;
  char real[PATH_MAX];
  if (p.empty() || realpath(p.c_str(), real) == nullptr) {
    if (!required) return std::optional<MountEndpoints>();
    return NotFoundError("no such directory on this machine: " + (p.empty() ? std::string("(none)") : p) +
                         " (give a path inside a granary mount, e.g. /data)");
  }
  // Only from this user's private runtime directory (RuntimeDir refuses one another user made):
  // the file names the worker and master that get this user's token.
  ASSIGN_OR_RETURN(std::string run_dir, RuntimeDir());
  std::string dir = real;
  for (;;) {
    auto text = ReadFileToString(run_dir + "/" + MountRunFileName(dir, ".json"));
    if (text.ok()) {
      json j = json::parse(*text, nullptr, false);
      if (j.is_object() && ProcessAlive(j.value("pid", 0))) {
        MountEndpoints m;
        m.mountpoint = j.value("mountpoint", dir);
        m.root = j.value("root", "/");
        m.pid = j.value("pid", 0);
        m.metrics = j.value("metrics", "");
        m.trace = j.value("trace", "");
        m.worker = j.value("worker", "");
        m.master = j.value("master", "");
        return std::optional<MountEndpoints>(m);
      }
    }
    if (dir == "/") break;
    size_t slash = dir.rfind('/');
    dir = slash == 0 ? "/" : dir.substr(0, slash);
  }
  if (!required) return std::optional<MountEndpoints>();
  return NotFoundError(std::string(real) + " is not in a granary mount served on this machine (no granary-fuse named "
                       "it in " + run_dir + "; is granary-fuse or `granary local` running?)");
}

// The daemons' metrics endpoint at `address` (a wildcard listen address is asked on loopback).
std::string MetricsUrl(const std::string& address) {
  auto hp = ParseHostPort(address);
  std::string host = hp.ok() ? hp->host : "127.0.0.1";
  if (host == "0.0.0.0" || host == "::") host = "127.0.0.1";
  if (host.find(':') != std::string::npos) host = "[" + host + "]";
  return "http://" + host + ":" + std::to_string(hp.ok() ? hp->port : 0) + "/metrics";
}

// ---- Prometheus text, as the daemons serve it ------------------------------------------------

struct Sample {
  std::string name;
  std::map<std::string, std::string> labels;
  double value = 0;
};
using Samples = std::vector<Sample>;

Samples ParseExposition(const std::string& text) {
  Samples out;
  size_t pos = 0;
  while (pos < text.size()) {
    size_t eol = text.find('\n', pos);
    if (eol == std::string::npos) eol = text.size();
    std::string line = text.substr(pos, eol - pos);
    pos = eol + 1;
    if (line.empty() || line[0] == '#') continue;
    Sample s;
    size_t i = line.find_first_of("{ ");
    if (i == std::string::npos) continue;
    s.name = line.substr(0, i);
    if (line[i] == '{') {
      ++i;
      while (i < line.size() && line[i] != '}') {
        size_t eq = line.find('=', i);
        if (eq == std::string::npos || eq + 1 >= line.size() || line[eq + 1] != '"') break;
        std::string key = line.substr(i, eq - i);
        std::string val;
        size_t j = eq + 2;
        for (; j < line.size() && line[j] != '"'; ++j) {
          if (line[j] == '\\' && j + 1 < line.size()) ++j;
          val += line[j];
        }
        s.labels[key] = val;
        i = j + 1;
        if (i < line.size() && line[i] == ',') ++i;
      }
      i = line.find(' ', i);
      if (i == std::string::npos) continue;
    }
    s.value = std::strtod(line.c_str() + i + 1, nullptr);
    out.push_back(std::move(s));
  }
  return out;
}

StatusOr<Samples> Scrape(const std::string& address) {
  // The same HTTP client as the under-storage's (ufs/http.h): one HTTP client in the product.
  CurlOptions opts;
  opts.request_timeout = std::chrono::seconds(10);
  opts.receive_buffer = 0;
  CurlHttpClient http(opts);
  HttpRequest req;
  req.method = "GET";
  req.url = MetricsUrl(address);
  auto res = http.Send(req);
  if (!res.ok()) return UnavailableError("cannot read http://" + address + "/metrics: " + res.status().message());
  if (res->status != 200) return UnavailableError("http://" + address + "/metrics answered " + std::to_string(res->status));
  return ParseExposition(res->body);
}

// Sum of the samples named `name` whose labels include every pair of `match`.
double Sum(const Samples& s, const std::string& name, const std::map<std::string, std::string>& match = {}) {
  double total = 0;
  for (const auto& x : s) {
    if (x.name != name) continue;
    bool ok = true;
    for (const auto& [k, v] : match) {
      auto it = x.labels.find(k);
      if (it == x.labels.end() || it->second != v) ok = false;
    }
    if (ok) total += x.value;
  }
  return total;
}

// Cumulative bucket counts of histogram `name` (every series together), by upper bound.
std::map<double, double> Buckets(const Samples& s, const std::string& name,
                                 const std::map<std::string, std::string>& match = {}) {
  std::map<double, double> b;
  for (const auto& x : s) {
    if (x.name != name + "_bucket") continue;
    auto le = x.labels.find("le");
    if (le == x.labels.end()) continue;
    bool ok = true;
    for (const auto& [k, v] : match) {
      auto it = x.labels.find(k);
      if (it == x.labels.end() || it->second != v) ok = false;
    }
    if (!ok) continue;
    double bound = le->second == "+Inf" ? INFINITY : std::strtod(le->second.c_str(), nullptr);
    b[bound] += x.value;
  }
  return b;
}

// The q-quantile of the observations between two scrapes (linear within a bucket, as Prometheus'
// histogram_quantile). NaN when there were none.
double Quantile(const std::map<double, double>& before, const std::map<double, double>& after, double q) {
  std::vector<std::pair<double, double>> d;
  for (const auto& [bound, n] : after) {
    auto it = before.find(bound);
    d.emplace_back(bound, n - (it == before.end() ? 0 : it->second));
  }
  if (d.empty() || d.back().second <= 0) return NAN;
  double rank = q * d.back().second;
  double lower = 0, below = 0;
  for (const auto& [bound, cum] : d) {
    if (cum >= rank) {
      if (std::isinf(bound)) return lower;
      double in = cum - below;
      return in <= 0 ? bound : lower + (bound - lower) * (rank - below) / in;
    }
    lower = bound;
    below = cum;
  }
  return lower;
}

// ---- granary stats ---------------------------------------------------------------------------

struct Snapshot {
  std::chrono::steady_clock::time_point at;
  std::optional<Samples> fuse;
  std::vector<rpc::WorkerStats> workers;
};

StatusOr<std::vector<rpc::WorkerStats>> WorkerStatsOf(const std::shared_ptr<RpcSecurity>& sec,
                                                      const std::vector<std::string>& addresses,
                                                      std::chrono::milliseconds timeout) {
  std::vector<rpc::WorkerStats> out;
  for (const auto& a : addresses) {
    auto stub = rpc::Worker::NewStub(sec->MakeChannel(a));
    grpc::ClientContext ctx;
    sec->Prepare(&ctx, timeout);
    rpc::WorkerStats s;
    Status st = FromGrpc(stub->GetStats(&ctx, rpc::GetStatsRequest(), &s), "the worker at " + a);
    if (!st.ok()) return st;
    out.push_back(std::move(s));
  }
  return out;
}

struct Figures {
  double secs = 0;
  // FUSE
  bool fuse = false;
  double ops = 0, p50 = NAN, p99 = NAN, read_bytes = 0, files = 0;
  double local = 0, peer = 0, ufs = 0;  // bytes by source
  double opens_passthrough = 0, opens_kernel = 0, opens_daemon = 0;
  double meta_ops = 0, master_rtt = NAN;
  double fuse_rss = 0, fuse_limit = 0;
  // workers
  size_t workers = 0;
  double used = 0, capacity = 0, high = 0, evictions = 0, elastic = 0;
  double ufs_requests = 0, ufs_bytes = 0, ufs_errors = 0, ufs_retries = 0;
  double ahead_bytes = 0, ahead_inflight = 0, ahead_target = 0, range_reads = 0;  // fetch-ahead, range first
  // Writes: the write=back backlog now (gauges), and this interval's uploads and failed uploads.
  double writeback_files = 0, writeback_bytes = 0, uploaded_files = 0, uploaded_bytes = 0, upload_failures = 0;
  double worker_rss = 0, worker_limit = 0;
  std::vector<rpc::TierStats> tiers;
};

Figures Compare(const Snapshot& a, const Snapshot& b) {
  Figures f;
  f.secs = std::chrono::duration<double>(b.at - a.at).count();
  if (a.fuse && b.fuse) {
    const Samples &x = *a.fuse, &y = *b.fuse;
    f.fuse = true;
    auto delta = [&](const std::string& n, const std::map<std::string, std::string>& m = {}) {
      return std::max(0.0, Sum(y, n, m) - Sum(x, n, m));
    };
    const std::string op = "granary_fuse_operation_duration_seconds";
    f.ops = delta(op + "_count");
    f.p50 = Quantile(Buckets(x, op), Buckets(y, op), 0.5);
    f.p99 = Quantile(Buckets(x, op), Buckets(y, op), 0.99);
    f.read_bytes = delta("granary_fuse_read_bytes_total");
    f.files = delta("granary_fuse_files_read_total");
    f.local = delta("granary_fuse_mount_read_bytes_total", {{"source", "local"}});
    f.peer = delta("granary_fuse_mount_read_bytes_total", {{"source", "peer"}});
    f.ufs = delta("granary_fuse_mount_read_bytes_total", {{"source", "under_storage"}});
    f.opens_passthrough = delta("granary_fuse_opens_total", {{"mode", "passthrough"}});
    f.opens_kernel = delta("granary_fuse_opens_total", {{"mode", "kernel"}});
    f.opens_daemon = delta("granary_fuse_opens_total", {{"mode", "daemon"}});
    for (const char* m : {"lookup", "getattr", "readdir", "statfs"}) f.meta_ops += delta(op + "_count", {{"op", m}});
    const std::string rtt = "granary_fuse_master_call_duration_seconds";
    double calls = delta(rtt + "_count");
    if (calls > 0) f.master_rtt = delta(rtt + "_sum") / calls;
    f.fuse_rss = Sum(y, "process_resident_memory_bytes");
    f.fuse_limit = Sum(y, "granary_process_memory_limit_bytes");
  }
  f.workers = b.workers.size();
  for (size_t i = 0; i < b.workers.size(); ++i) {
    const rpc::WorkerStats& w = b.workers[i];
    const rpc::WorkerStats* p = i < a.workers.size() ? &a.workers[i] : nullptr;
    auto d = [&](uint64_t (rpc::WorkerStats::*get)() const) {
      uint64_t now = (w.*get)(), then = p ? (p->*get)() : now;
      return static_cast<double>(now >= then ? now - then : 0);
    };
    f.used += static_cast<double>(w.used_bytes());
    f.elastic += static_cast<double>(w.elastic_bytes());
    f.capacity += static_cast<double>(w.capacity_bytes());
    for (const auto& t : w.tiers()) f.high += t.high() * static_cast<double>(t.capacity_bytes());
    f.evictions += d(&rpc::WorkerStats::evictions);
    f.ufs_requests += d(&rpc::WorkerStats::ufs_calls);
    f.writeback_files += static_cast<double>(w.writeback_files());
    f.writeback_bytes += static_cast<double>(w.writeback_bytes());
    f.uploaded_files += d(&rpc::WorkerStats::uploaded_files);
    f.uploaded_bytes += d(&rpc::WorkerStats::uploaded_bytes);
    f.upload_failures += d(&rpc::WorkerStats::upload_failures);
    f.ufs_bytes += d(&rpc::WorkerStats::ufs_bytes);
    f.ufs_errors += d(&rpc::WorkerStats::ufs_errors);
    f.ufs_retries += d(&rpc::WorkerStats::ufs_retries);
    f.ahead_bytes += d(&rpc::WorkerStats::ahead_bytes);
    f.range_reads += d(&rpc::WorkerStats::range_reads);
    f.ahead_inflight += static_cast<double>(w.ahead_inflight());
    f.ahead_target += static_cast<double>(w.ahead_target());
    f.worker_rss += static_cast<double>(w.rss_bytes());
    f.worker_limit += static_cast<double>(w.memory_limit_bytes());
    for (const auto& t : w.tiers()) f.tiers.push_back(t);
  }
  if (f.capacity > 0) f.high /= f.capacity;  // the capacity-weighted high watermark
  return f;
}

// Compact numbers for a 4-character column: `step` 1000 with k, M, G, T; 1024 with K, M, G, T
// after a B for bytes.
std::string Scaled(double v, double step, const char* const units[5]) {
  if (std::isnan(v)) return "-";
  int u = 0;
  while (v >= 999.5 && u < 4) {
    v /= step;
    ++u;
  }
  char buf[16];
  std::snprintf(buf, sizeof buf, v < 9.95 && u > 0 ? "%.1f%s" : "%.0f%s", v, units[u]);
  return buf;
}
std::string Compact(double v) {
  static const char* const units[] = {"", "k", "M", "G", "T"};
  return Scaled(v, 1000, units);
}
std::string CompactBytes(double v) {
  static const char* const units[] = {"B", "K", "M", "G", "T"};
  return Scaled(v, 1024, units);
}
std::string Latency(double secs) {
  if (std::isnan(secs)) return "-";
  char buf[16];
  if (secs < 1e-3) {
    std::snprintf(buf, sizeof buf, "%.0fu", secs * 1e6);
  } else if (secs < 1) {
    std::snprintf(buf, sizeof buf, secs < 9.95e-3 ? "%.1fm" : "%.0fm", secs * 1e3);
  } else {
    std::snprintf(buf, sizeof buf, "%.1fs", secs);
  }
  return buf;
}
std::string Pct(double part, double whole) {
  if (whole <= 0) return "-";
  char buf[16];
  std::snprintf(buf, sizeof buf, "%.0f", 100.0 * part / whole);
  return buf;
}

struct Column {
  const char* group;
  const char* name;
  int width;
};
// Seventeen columns of at most 4 characters: 80 characters with the spaces between them. `ahd`
// is the share of the under-storage bytes that fetch-ahead brought (master/fetch_ahead.h).
const Column kColumns[] = {
    {"fuse", "ops", 4},  {"fuse", "p50", 4},   {"fuse", "p99", 4},   {"fuse", "MB/s", 4},
    {"read", "hit", 3},  {"read", "peer", 4},  {"read", "ufs%", 4},  {"meta", "ops", 4},
    {"meta", "rtt", 4},  {"cache", "use%", 4}, {"cache", "ev/s", 4}, {"ufs", "req", 4},
    {"ufs", "MB/s", 4},  {"ufs", "ahd", 3},    {"ufs", "err", 3},    {"ufs", "rty", 3},
    {"mem", "mem", 4},
};

std::string Row(const std::vector<std::string>& cells) {
  std::string out;
  for (size_t i = 0; i < cells.size(); ++i) {
    std::string c = cells[i];
    int w = kColumns[i].width;
    if (static_cast<int>(c.size()) > w) c = c.substr(0, w);
    if (i) out += ' ';
    out += std::string(w - c.size(), ' ') + c;
  }
  return out;
}

std::string GroupHeader() {
  std::string out;
  size_t i = 0, n = std::size(kColumns);
  while (i < n) {
    size_t j = i;
    int width = 0;
    while (j < n && std::string(kColumns[j].group) == kColumns[i].group) {
      width += kColumns[j].width + (j > i ? 1 : 0);  // the space between two columns of the group
      ++j;
    }
    std::string g = kColumns[i].group;
    int dashes = width - static_cast<int>(g.size());
    std::string cell = std::string(dashes / 2, '-') + g + std::string(dashes - dashes / 2, '-');
    if (i) out += ' ';
    out += cell;
    i = j;
  }
  return out;
}

std::vector<std::string> Cells(const Figures& f) {
  double s = f.secs > 0 ? f.secs : 1;
  double served = f.local + f.peer + f.ufs;
  std::string use = "-";
  if (f.capacity > 0) {
    use = Pct(f.used, f.capacity);
    if (f.high > 0 && f.used >= f.high * f.capacity) use += "!";  // over the high watermark: evicting
  }
  std::string mem = "-";
  double rss = f.fuse ? f.fuse_rss : f.worker_rss, limit = f.fuse ? f.fuse_limit : f.worker_limit;
  if (rss > 0) mem = limit > 0 ? Pct(rss, limit) + "%" : CompactBytes(rss);
  auto fuse = [&](const std::string& v) { return f.fuse ? v : std::string("-"); };
  return {fuse(Compact(f.ops / s)),
          fuse(Latency(f.p50)),
          fuse(Latency(f.p99)),
          fuse(Compact(f.read_bytes / s / 1e6)),
          fuse(Pct(f.local, served)),
          fuse(Pct(f.peer, served)),
          fuse(Pct(f.ufs, served)),
          fuse(Compact(f.meta_ops / s)),
          fuse(Latency(f.master_rtt)),
          use,
          f.workers ? Compact(f.evictions / s) : "-",
          f.workers ? Compact(f.ufs_requests / s) : "-",
          f.workers ? Compact(f.ufs_bytes / s / 1e6) : "-",
          f.workers && f.ufs_bytes > 0 ? Pct(f.ahead_bytes, f.ufs_bytes) : "-",
          f.workers ? Compact(f.ufs_errors) : "-",
          f.workers ? Compact(f.ufs_retries) : "-",
          mem};
}

json FiguresJson(const Figures& f) {
  auto num = [](double v) { return std::isnan(v) ? json(nullptr) : json(v); };
  json j;
  j["time"] = static_cast<int64_t>(std::time(nullptr));
  j["interval_s"] = f.secs;
  if (f.fuse) {
    double served = f.local + f.peer + f.ufs;
    j["fuse"] = {{"ops", f.ops}, {"p50_s", num(f.p50)}, {"p99_s", num(f.p99)}, {"read_bytes", f.read_bytes},
                 {"files", f.files}};
    j["read"] = {{"local_bytes", f.local},
                 {"peer_bytes", f.peer},
                 {"under_storage_bytes", f.ufs},
                 {"hit_ratio", served > 0 ? json(f.local / served) : json(nullptr)},
                 {"opens_passthrough", f.opens_passthrough},
                 {"opens_kernel", f.opens_kernel},
                 {"opens_daemon", f.opens_daemon}};
    j["meta"] = {{"ops", f.meta_ops}, {"master_rtt_s", num(f.master_rtt)}};
  }
  json tiers = json::array();
  for (const auto& t : f.tiers) {
    tiers.push_back({{"medium", t.medium()},
                     {"used_bytes", t.used_bytes()},
                     {"capacity_bytes", t.capacity_bytes()},
                     {"high", t.high()},
                     {"low", t.low()}});
  }
  j["cache"] = {{"workers", f.workers},
                {"used_bytes", f.used},
                {"elastic_bytes", f.elastic},  // of used_bytes, elastic copies (the rest: replicas)
                {"capacity_bytes", f.capacity},
                {"high", f.high},
                {"evictions", f.evictions},
                {"tiers", tiers}};
  j["writes"] = {{"writeback_files", f.writeback_files},
                 {"writeback_bytes", f.writeback_bytes},
                 {"uploaded_files", f.uploaded_files},
                 {"uploaded_bytes", f.uploaded_bytes},
                 {"upload_failures", f.upload_failures}};
  j["ufs"] = {{"requests", f.ufs_requests}, {"bytes", f.ufs_bytes}, {"errors", f.ufs_errors}, {"retries", f.ufs_retries},
              {"range_reads", f.range_reads}};
  // Of ufs.bytes, what fetch-ahead brought; its fetches in flight now and the pacer's allowance.
  j["fetch_ahead"] = {{"bytes", f.ahead_bytes}, {"inflight", f.ahead_inflight}, {"target", f.ahead_target}};
  j["memory"] = {{"fuse_rss_bytes", f.fuse_rss},
                 {"fuse_limit_bytes", f.fuse_limit},
                 {"worker_rss_bytes", f.worker_rss},
                 {"worker_limit_bytes", f.worker_limit}};
  return j;
}

// The live workers' addresses, from the master.
StatusOr<std::vector<std::string>> LiveWorkers(MasterConn& master) {
  rpc::Report r;
  RETURN_IF_ERROR(master.Call(&rpc::Master::Stub::GetReport, rpc::GetReportRequest(), &r));
  std::vector<std::string> out;
  for (const auto& w : r.workers()) {
    if (w.alive()) out.push_back(w.address());
  }
  return out;
}

}  // namespace

int CmdStats(const Config& cfg, MasterConn& master, const StatsOptions& opts) {
  auto interval = ParseDuration(opts.interval);
  if (!interval.ok() || interval->count() < 100) {
    return Fail(InvalidArgumentError("--interval '" + opts.interval + "' must be a duration of at least 100ms, e.g. 1s"));
  }
  auto found = FindMount(cfg, opts.path, !opts.path.empty());
  if (!found.ok()) return Fail(found.status());
  auto sec = RpcSecurity::FromConfig(cfg.rpc);
  if (!sec.ok()) return Fail(sec.status());
  std::optional<MountEndpoints> node = *found;
  std::vector<std::string> workers;
  if (node) {
    if (node->metrics.empty()) {
      return Fail(FailedPreconditionError("the granary-fuse at " + node->mountpoint +
                                          " has no metrics endpoint (fuse.metrics_listen is off); turn it on"));
    }
    if (!node->worker.empty()) workers.push_back(node->worker);
  } else {
    auto live = LiveWorkers(master);
    if (!live.ok()) return Fail(live.status());
    workers = *live;
  }
  auto take = [&]() -> StatusOr<Snapshot> {
    Snapshot s;
    s.at = std::chrono::steady_clock::now();
    if (node) {
      ASSIGN_OR_RETURN(Samples m, Scrape(node->metrics));
      s.fuse = std::move(m);
    }
    auto w = WorkerStatsOf(*sec, workers, cfg.rpc.timeout);
    if (w.ok()) s.workers = std::move(*w);  // a worker restarting: FUSE figures alone meanwhile
    return s;
  };
  auto prev = take();
  if (!prev.ok()) return Fail(prev.status());
  const bool tty = isatty(STDOUT_FILENO) && !opts.json;
  if (!opts.json) {
    std::string where = node ? "node of " + node->mountpoint : std::to_string(workers.size()) + " workers of the cluster";
    if (tty) {
      std::printf("%s\n%s\n", GroupHeader().c_str(), Row([] {
                    std::vector<std::string> names;
                    for (const auto& c : kColumns) names.push_back(c.name);
                    return names;
                  }()).c_str());
    } else {
      std::string h;
      for (const auto& c : kColumns) h += std::string(h.empty() ? "" : " ") + c.group + "." + c.name;
      std::printf("# %s\n%s\n", where.c_str(), h.c_str());
    }
    std::fflush(stdout);
  }
  for (int n = 0; opts.count == 0 || n < opts.count; ++n) {
    if (Shutdown::WaitFor(*interval)) break;
    auto cur = take();
    if (!cur.ok()) return Fail(cur.status());
    Figures f = Compare(*prev, *cur);
    if (opts.json) {
      std::printf("%s\n", FiguresJson(f).dump().c_str());
    } else if (tty) {
      std::printf("%s\n", Row(Cells(f)).c_str());
      // Writes, under the row (the table's columns are full at 80 characters): the files uploaded in
      // this interval (write=through and write=back) and the write-back backlog now.
      if (f.writeback_files > 0 || f.uploaded_files > 0) {
        std::printf("  writes: %.0f uploaded (%s), backlog %.0f files (%s)%s\n", f.uploaded_files,
                    CompactBytes(f.uploaded_bytes).c_str(), f.writeback_files, CompactBytes(f.writeback_bytes).c_str(),
                    f.upload_failures > 0 ? ", uploads failing" : "");
      }
    } else {
      std::string line;
      for (const auto& c : Cells(f)) line += (line.empty() ? "" : " ") + c;
      std::printf("%s\n", line.c_str());
    }
    std::fflush(stdout);
    prev = std::move(cur);
  }
  return 0;
}

// ---- granary trace ---------------------------------------------------------------------------

namespace {

std::string PlainTraceLine(const json& r) {
  std::string t = r.value("time", "");
  if (t.size() > 11) t = t.substr(11, 15);  // HH:MM:SS.uuuuuu
  char buf[256];
  std::snprintf(buf, sizeof buf, "%-15s %7lld %5lld %-11s %-7s %8lldus", t.c_str(),
                static_cast<long long>(r.value("pid", 0LL)), static_cast<long long>(r.value("uid", 0LL)),
                r.value("op", "").c_str(), r.value("result", "").c_str(),
                static_cast<long long>(r.value("latency_us", 0LL)));
  std::string out = buf;
  if (r.contains("size")) {
    std::snprintf(buf, sizeof buf, " %-13s %llu+%llu", r.value("source", "").c_str(),
                  static_cast<unsigned long long>(r.value("offset", 0ULL)),
                  static_cast<unsigned long long>(r.value("size", 0ULL)));
    out += buf;
  }
  out += " " + r.value("path", "");
  if (r.contains("to")) out += " -> " + r.value("to", "");  // rename
  return out;
}

// Streams the trace of the mount at `path` to `on_record` (false: stop). Ends at Ctrl-C too.
Status StreamTrace(const Config& cfg, const std::string& path, int64_t pid, const std::string& prefix,
                   const std::vector<std::string>& ops, const std::function<bool(const json&)>& on_record,
                   const std::function<void()>& on_started) {
  ASSIGN_OR_RETURN(std::optional<MountEndpoints> node, FindMount(cfg, path, true));
  if (node->trace.empty()) {
    return FailedPreconditionError("the granary-fuse at " + node->mountpoint +
                                   " serves no access trace (its trace socket could not be opened; see its log)");
  }
  std::map<std::string, std::string> params;
  if (pid >= 0) params.emplace("pid", std::to_string(pid));
  if (!prefix.empty()) params.emplace("prefix", prefix);
  if (!ops.empty()) {
    std::string o;
    for (const auto& x : ops) o += (o.empty() ? "" : ",") + x;
    params.emplace("op", o);
  }
  Status bad = Status::OK();
  bool started = false;
  Status st = ReadStream(
      node->trace, params,
      [&](const std::string& line) {
        json j = json::parse(line, nullptr, false);
        if (!j.is_object()) return true;  // the stream's keep-alive empty lines
        if (j.contains("error")) {
          bad = InvalidArgumentError(j.value("error", ""));
          return false;
        }
        if (j.contains("trace")) {
          started = true;
          if (on_started) on_started();
          return true;
        }
        return on_record(j);
      },
      [] { return Shutdown::Requested(); });
  if (!bad.ok()) {
    if (bad.message().find("streams at once") != std::string::npos) return UnavailableError(bad.message());
    return bad;
  }
  if (!st.ok()) return st.WithContext("the access trace of " + node->mountpoint);
  if (!started && !Shutdown::Requested()) {
    return PermissionDeniedError("the access trace of " + node->mountpoint + " (" + node->trace +
                                 ") ended before it started: only root or granary-fuse's own user may read it");
  }
  return Status::OK();
}

}  // namespace

int CmdTrace(const Config& cfg, const TraceOptions& opts) {
  int64_t n = 0;
  if (!opts.json) {
    std::printf("%-15s %7s %5s %-11s %-7s %10s %s\n", "time", "pid", "uid", "op", "result", "latency",
                "[source offset+size] path");
  }
  std::fflush(stdout);
  Status st = StreamTrace(
      cfg, opts.path, opts.pid, opts.prefix, opts.ops,
      [&](const json& r) {
        std::printf("%s\n", opts.json ? r.dump().c_str() : PlainTraceLine(r).c_str());
        std::fflush(stdout);
        return opts.count == 0 || ++n < opts.count;
      },
      [] {
        std::fprintf(stderr, "granary trace: tracing (Ctrl-C stops)\n");
        std::fflush(stderr);
      });
  if (!st.ok()) return Fail(st);
  return 0;
}

// ---- granary profile -------------------------------------------------------------------------

namespace {

struct OpStats {
  uint64_t count = 0, errors = 0, bytes = 0;
  double total = 0, max = 0;
  std::vector<double> latencies;
};

class Profile {
 public:
  void Add(const json& r) {
    std::string op = r.value("op", "?");
    double lat = static_cast<double>(r.value("latency_us", 0LL)) / 1e6;
    uint64_t bytes = r.value("size", 0ULL);
    bool err = r.value("result", "ok") != "ok";
    auto& o = ops_[op];
    o.count++;
    o.errors += err;
    o.bytes += bytes;
    o.total += lat;
    o.max = std::max(o.max, lat);
    if (o.latencies.size() < 1'000'000) o.latencies.push_back(lat);
    auto& f = files_[r.value("path", "")];
    f.count++;
    f.bytes += bytes;
    f.total += lat;
    slowest_.push_back(r);
    std::sort(slowest_.begin(), slowest_.end(), [](const json& a, const json& b) {
      return a.value("latency_us", 0LL) > b.value("latency_us", 0LL);
    });
    if (slowest_.size() > 100) slowest_.pop_back();
    ++records_;
  }
  uint64_t records() const { return records_; }

  json ToJson(int top) {
    json j;
    j["records"] = records_;
    j["operations"] = json::array();
    for (auto& [op, o] : SortedOps()) {
      j["operations"].push_back({{"op", op},
                                 {"count", o->count},
                                 {"errors", o->errors},
                                 {"bytes", o->bytes},
                                 {"total_s", o->total},
                                 {"avg_s", o->total / static_cast<double>(o->count)},
                                 {"p99_s", P99(o)},
                                 {"max_s", o->max}});
    }
    j["files"] = json::array();
    for (auto& [path, f] : TopFiles(top)) {
      j["files"].push_back({{"path", path}, {"ops", f->count}, {"bytes", f->bytes}, {"total_s", f->total}});
    }
    j["slowest"] = json::array();
    for (int i = 0; i < top && i < static_cast<int>(slowest_.size()); ++i) j["slowest"].push_back(slowest_[i]);
    return j;
  }

  void Print(int top) {
    std::printf("%llu operations traced\n\n", static_cast<unsigned long long>(records_));
    std::printf("%-12s %9s %7s %10s %9s %9s %9s %9s\n", "operation", "count", "errors", "bytes", "total", "avg",
                "p99", "max");
    for (auto& [op, o] : SortedOps()) {
      std::printf("%-12s %9llu %7llu %10s %9s %9s %9s %9s\n", op.c_str(), static_cast<unsigned long long>(o->count),
                  static_cast<unsigned long long>(o->errors), FormatBytes(o->bytes).c_str(), Secs(o->total).c_str(),
                  Secs(o->total / static_cast<double>(o->count)).c_str(), Secs(P99(o)).c_str(), Secs(o->max).c_str());
    }
    std::printf("\ntop files by time\n%9s %10s %9s  %s\n", "ops", "bytes", "total", "path");
    for (auto& [path, f] : TopFiles(top)) {
      std::printf("%9llu %10s %9s  %s\n", static_cast<unsigned long long>(f->count), FormatBytes(f->bytes).c_str(),
                  Secs(f->total).c_str(), path.c_str());
    }
    std::printf("\nslowest calls\n");
    for (int i = 0; i < top && i < static_cast<int>(slowest_.size()); ++i) {
      std::printf("%s\n", PlainTraceLine(slowest_[i]).c_str());
    }
  }

 private:
  static std::string Secs(double s) {
    char buf[32];
    if (s < 1e-3) {
      std::snprintf(buf, sizeof buf, "%.0fus", s * 1e6);
    } else if (s < 1) {
      std::snprintf(buf, sizeof buf, "%.2fms", s * 1e3);
    } else {
      std::snprintf(buf, sizeof buf, "%.2fs", s);
    }
    return buf;
  }
  // Nearest rank: the smallest latency at or above 99% of them (ceil(0.99 n), 1-based), so it is
  // never below the average; with fewer than 100 calls it is the slowest.
  static double P99(OpStats* o) {
    if (o->latencies.empty()) return 0;
    const size_t n = o->latencies.size();
    size_t k = (99 * n + 99) / 100 - 1;
    std::nth_element(o->latencies.begin(), o->latencies.begin() + k, o->latencies.end());
    return o->latencies[k];
  }
  std::vector<std::pair<std::string, OpStats*>> SortedOps() {
    std::vector<std::pair<std::string, OpStats*>> v;
    for (auto& [op, o] : ops_) v.emplace_back(op, &o);
    std::sort(v.begin(), v.end(), [](const auto& a, const auto& b) { return a.second->total > b.second->total; });
    return v;
  }
  std::vector<std::pair<std::string, OpStats*>> TopFiles(int top) {
    std::vector<std::pair<std::string, OpStats*>> v;
    for (auto& [p, f] : files_) v.emplace_back(p, &f);
    std::sort(v.begin(), v.end(), [](const auto& a, const auto& b) { return a.second->total > b.second->total; });
    if (static_cast<int>(v.size()) > top) v.resize(top);
    return v;
  }
  std::map<std::string, OpStats> ops_;
  std::map<std::string, OpStats> files_;
  std::vector<json> slowest_;
  uint64_t records_ = 0;
};

}  // namespace

int CmdProfile(const Config& cfg, const ProfileOptions& opts) {
  if (opts.top < 1) return Fail(InvalidArgumentError("--top must be at least 1"));
  Profile p;
  if (!opts.file.empty()) {
    std::ifstream file;
    std::istream* in = &std::cin;
    if (opts.file != "-") {
      file.open(opts.file);
      if (!file) return Fail(NotFoundError("cannot read the trace " + opts.file));
      in = &file;
    }
    std::string line;
    for (uint64_t n = 1; std::getline(*in, line); ++n) {
      if (line.empty()) continue;
      json j = json::parse(line, nullptr, false);
      if (!j.is_object()) {
        return Fail(InvalidArgumentError(opts.file + " line " + std::to_string(n) +
                                         " is not a trace record (save traces with `granary trace --json`)"));
      }
      if (j.contains("op") && (opts.pid < 0 || j.value("pid", -1LL) == opts.pid)) p.Add(j);
    }
  } else {
    auto d = ParseDuration(opts.duration);
    if (!d.ok()) return Fail(InvalidArgumentError("--duration '" + opts.duration + "' must be a duration, e.g. 30s"));
    const auto until = std::chrono::steady_clock::now() + *d;
    // The trace is read until the duration passed (checked when records come, and by a timer that
    // ends the stream when none do).
    std::thread timer([&] {
      if (!Shutdown::WaitFor(*d)) Shutdown::Request("profile duration passed");
    });
    Status st = StreamTrace(
        cfg, opts.path, opts.pid, "", {},
        [&](const json& r) {
          p.Add(r);
          return std::chrono::steady_clock::now() < until;
        },
        [&] {
          std::fprintf(stderr, "granary profile: tracing for %s (Ctrl-C ends it sooner)\n", opts.duration.c_str());
        });
    Shutdown::Request("profile done");
    timer.join();
    if (!st.ok()) return Fail(st);
  }
  if (opts.json) {
    std::printf("%s\n", p.ToJson(opts.top).dump(2).c_str());
  } else {
    p.Print(opts.top);
  }
  return 0;
}

// ---- granary info ----------------------------------------------------------------------------

namespace {

// The namespace path of `path`: itself when it names no local file, else its place under the
// granary mount holding it.
std::string NamespacePath(const Config& cfg, const std::string& path, std::optional<MountEndpoints>* node) {
  char real[PATH_MAX];
  if (path.empty() || realpath(path.c_str(), real) == nullptr) return path;  // not local: as given
  auto found = FindMount(cfg, real, false);
  if (!found.ok() || !*found) return path;
  *node = *found;
  std::string rel = std::string(real).substr((*found)->mountpoint.size());
  std::string root = (*found)->root;
  if (root == "/") root.clear();
  std::string ns = root + rel;
  return ns.empty() ? "/" : ns;
}

// Which workers hold which blocks of `inos` (files), asked of the master (GetFileResidency) in as
// many calls as its answer limit needs; done(i, blocks, file, held) once per file, in order, with
// every copy it holds (one entry per worker and block). `worker` non-empty: only that worker.
// A warning on stderr when workers did not answer: what they hold is missing from the figures.
void WarnUnanswered(uint32_t failed) {
  if (failed == 0) return;
  std::fprintf(stderr, "warning: %u worker%s did not answer the master; the blocks %s hold%s are not shown "
               "(granary report lists the workers)\n", failed, failed == 1 ? "" : "s", failed == 1 ? "it" : "they",
               failed == 1 ? "s" : "");
}

// *failed (optional) gets the most workers any answer said did not answer.
Status FileResidency(MasterConn& m, const std::vector<uint64_t>& inos, const std::string& worker,
                     const std::function<void(size_t, const rpc::FileInfo&, uint64_t,
                                              const std::vector<rpc::HeldBlock>&)>& done,
                     uint32_t* failed = nullptr) {
  size_t next = 0;
  uint64_t first = 0;
  std::vector<rpc::HeldBlock> held;  // of inos[next], gathered over partial answers
  while (next < inos.size()) {
    rpc::FileResidencyRequest req;
    req.set_worker(worker);
    req.set_first_block(first);
    for (size_t i = next; i < inos.size() && i - next < 1000; ++i) req.add_inos(inos[i]);
    rpc::FileResidencyResponse resp;
    RETURN_IF_ERROR(m.Call(&rpc::Master::Stub::GetFileResidency, req, &resp));
    if (failed) *failed = std::max(*failed, resp.workers_failed());
    if (resp.files_size() == 0) return InternalError("the master answered no file of a residency question");
    for (const auto& f : resp.files()) {
      held.insert(held.end(), f.held().begin(), f.held().end());
      if (f.first() + f.count() < f.blocks()) {
        if (f.count() == 0) return InternalError("the master answered no block of a residency question");
        first = f.first() + f.count();  // the rest of this file in the next call
        break;
      }
      done(next, f.file(), f.blocks(), held);
      held.clear();
      first = 0;
      ++next;
    }
  }
  return Status::OK();
}

}  // namespace

int CmdInfo(const Config& cfg, MasterConn& master, const InfoOptions& opts) {
  std::optional<MountEndpoints> node;
  std::string ns = NamespacePath(cfg, opts.path, &node);
  if (ns.empty() || ns[0] != '/') {
    return Fail(InvalidArgumentError("'" + opts.path + "' is neither a namespace path (/dataset/...) nor a path in a "
                                     "granary mount on this machine"));
  }
  rpc::ResolvePathRequest rr;
  rr.set_path(ns);
  rpc::AttrResponse attr;
  Status st = master.Call(&rpc::Master::Stub::ResolvePath, rr, &attr);
  if (!st.ok()) return Fail(st);
  // This node's worker: the one its granary-fuse reads from — the mount the path is in, else the
  // mount of fuse.mountpoint (`granary local` names it in its discovery file) when it serves this
  // master — else fuse.worker of the configuration (issue 54: a namespace path under `granary
  // local` named the default 127.0.0.1:29999, holding none of the blocks).
  if (!node) {
    auto here = FindMount(cfg, "", false);
    if (here.ok() && *here && (*here)->master == cfg.master.address) node = **here;
  }
  std::string local = node ? node->worker : cfg.fuse.worker;
  uint32_t failed = 0;  // workers that did not answer the master: their blocks are not shown

  if (attr.attr().type() != rpc::DIRECTORY) {
    rpc::FileInfo info;
    uint64_t nblocks = 0;
    std::vector<rpc::HeldBlock> held;
    st = FileResidency(master, {attr.attr().ino()}, "",
                       [&](size_t, const rpc::FileInfo& fi, uint64_t n, const std::vector<rpc::HeldBlock>& h) {
                         info = fi;
                         nblocks = n;
                         held = h;
                       },
                       &failed);
    if (!st.ok()) return Fail(st);
    WarnUnanswered(failed);
    std::multimap<uint64_t, const rpc::HeldBlock*> by_index;
    for (const auto& h : held) by_index.emplace(h.block().index(), &h);
    uint64_t bs = info.block_size();
    uint64_t cached = 0, local_blocks = 0, cached_bytes = 0;
    json blocks = json::array();
    for (uint64_t i = 0; i < nblocks; ++i) {
      auto [lo, hi] = by_index.equal_range(i);
      json holders_j = json::array();
      bool any = false, here = false;
      for (auto it = lo; it != hi; ++it) {
        const rpc::HeldBlock& hb = *it->second;
        const bool is_local = !local.empty() && hb.worker() == local;
        any = true;
        here |= is_local;
        holders_j.push_back({{"worker", hb.worker()},
                             {"worker_id", hb.worker_id()},
                             {"tier", hb.block().medium()},
                             {"level", hb.block().level()},
                             {"kind", hb.block().elastic() ? "elastic" : "replica"},
                             {"local", is_local}});
      }
      uint64_t len = std::min(bs, info.attr().size() - i * bs);
      cached += any;
      local_blocks += here;
      if (any) cached_bytes += len;
      blocks.push_back({{"index", i}, {"length", len}, {"cached", any}, {"local", here}, {"holders", holders_j}});
    }
    if (opts.json) {
      json j = {{"path", ns},
                {"type", "file"},
                {"size", info.attr().size()},
                {"version", info.version()},
                {"block_size", bs},
                {"blocks", nblocks},
                {"cached_blocks", cached},
                {"cached_bytes", cached_bytes},
                {"local_blocks", local_blocks},
                {"local_worker", local},
                {"workers_failed", failed},
                {"block_list", blocks}};
      std::printf("%s\n", j.dump(2).c_str());
      return 0;
    }
    std::printf("%s\n  size %s, version %s, block size %s, %s\n", ns.c_str(),
                FormatBytes(info.attr().size()).c_str(), info.version().c_str(), FormatBytes(bs).c_str(),
                Count(nblocks, "block").c_str());
    std::printf("  cached %llu of %s (%s), %llu on this node's worker (%s)\n",
                static_cast<unsigned long long>(cached), Count(nblocks, "block").c_str(),
                FormatBytes(cached_bytes).c_str(), static_cast<unsigned long long>(local_blocks),
                local.empty() ? "unknown" : local.c_str());
    std::printf("  %6s %10s  %s\n", "block", "length", "where (worker tier kind)");
    for (const auto& b : blocks) {
      std::string where;
      for (const auto& x : b["holders"]) {
        where += (where.empty() ? "" : ", ") + x["worker"].get<std::string>() + " " + x["tier"].get<std::string>() + " " +
                 x["kind"].get<std::string>() + (x["local"].get<bool>() ? " (local)" : "");
      }
      std::printf("  %6llu %10s  %s\n", static_cast<unsigned long long>(b["index"].get<uint64_t>()),
                  FormatBytes(b["length"].get<uint64_t>()).c_str(), where.empty() ? "not cached" : where.c_str());
    }
    return 0;
  }

  // A directory: the cached share as du gives it, and how many files are wholly on this node.
  rpc::DuRequest dr;
  dr.set_path(ns);
  rpc::DuResponse du;
  st = master.Call(&rpc::Master::Stub::Du, dr, &du);
  if (!st.ok()) return Fail(st);
  uint64_t files = 0, whole_local = 0;
  std::vector<uint64_t> batch;  // files whose residency on this node's worker is asked next
  auto flush = [&]() -> Status {
    if (local.empty()) {
      batch.clear();  // no worker on this node: no file is on it
      return Status::OK();
    }
    RETURN_IF_ERROR(FileResidency(master, batch, local,
                                  [&](size_t, const rpc::FileInfo&, uint64_t n, const std::vector<rpc::HeldBlock>& h) {
                                    std::set<uint64_t> on_node;
                                    for (const auto& b : h) on_node.insert(b.block().index());
                                    if (on_node.size() == n) whole_local++;
                                  },
                                  &failed));
    batch.clear();
    return Status::OK();
  };
  std::vector<std::pair<std::string, uint64_t>> dirs = {{ns, attr.attr().ino()}};
  while (!dirs.empty()) {
    auto [dpath, dino] = dirs.back();
    dirs.pop_back();
    uint64_t after = 0;
    for (;;) {
      rpc::ReadDirRequest rq;
      rq.set_ino(dino);
      rq.set_after(after);
      rq.set_limit(1000);
      rpc::ReadDirResponse resp;
      st = master.Call(&rpc::Master::Stub::ReadDir, rq, &resp);
      if (!st.ok()) return Fail(st);
      for (const auto& e : resp.entries()) {
        after = e.cookie();
        std::string child = (dpath == "/" ? "" : dpath) + "/" + e.name();
        if (e.attr().type() == rpc::DIRECTORY) {
          dirs.emplace_back(child, e.attr().ino());
          continue;
        }
        ++files;
        if (e.attr().size() == 0) {
          whole_local++;  // nothing to cache
          continue;
        }
        batch.push_back(e.attr().ino());
        if (batch.size() >= 1000) {
          st = flush();
          if (!st.ok()) return Fail(st);
        }
      }
      if (resp.end() || resp.entries_size() == 0) break;
    }
  }
  if (!batch.empty() && !(st = flush()).ok()) return Fail(st);
  WarnUnanswered(failed);
  const rpc::DuEntry& t = du.total();
  if (opts.json) {
    json j = {{"path", ns},
              {"type", "directory"},
              {"files", files},
              {"bytes", t.bytes()},
              {"cached_bytes", t.cached_bytes()},
              {"replica_bytes", t.replica_bytes()},
              {"elastic_bytes", t.elastic_bytes()},
              {"local_worker", local},
              {"files_wholly_local", whole_local},
              {"workers_failed", failed}};
    std::printf("%s\n", j.dump(2).c_str());
    return 0;
  }
  std::printf("%s\n  %s, %s; cached %s (%.1f%%), replicas %s, elastic copies %s\n", ns.c_str(),
              Count(files, "file").c_str(), FormatBytes(t.bytes()).c_str(),
              FormatBytes(t.cached_bytes()).c_str(),
              t.bytes() ? 100.0 * static_cast<double>(t.cached_bytes()) / static_cast<double>(t.bytes()) : 0.0,
              FormatBytes(t.replica_bytes()).c_str(), FormatBytes(t.elastic_bytes()).c_str());
  std::printf("  %llu of %s wholly on this node's worker (%s)\n", static_cast<unsigned long long>(whole_local),
              Count(files, "file").c_str(), local.empty() ? "unknown" : local.c_str());
  return 0;
}

}  // namespace granary::cli
