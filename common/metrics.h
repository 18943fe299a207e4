// Metrics: Prometheus text exposition for the daemons, and the small HTTP endpoint that serves it.
//
// Naming follows Prometheus practice: every name starts with granary_, values are in base units
// (seconds, bytes), counters end in _total. Most values already live in the daemons' own counters
// (WorkerStats, the Cluster, the JobManager), so a scrape renders them fresh (a `render` callback
// fills an Exposition); only latencies need state of their own, kept in Histogram (lock-free).
//
// MetricsServer answers, on its own port (cpp-httplib, a few threads):
//   /metrics  the exposition (text/plain; version=0.0.4)
//   /healthz  200 "ok" while the process serves (liveness)
//   /readyz   200 "ready" when `ready` returns OK, else 503 with the reason (readiness)
// Thread-safe.
#pragma once

#include <atomic>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "common/status.h"
#include "common/thread_annotations.h"

namespace granary::metrics {

using Labels = std::vector<std::pair<std::string, std::string>>;

// Builds one exposition. Declare a family once (HELP and TYPE), then add its samples.
class Exposition {
 public:
  void Family(const std::string& name, const std::string& type, const std::string& help);
  void Sample(const std::string& name, const Labels& labels, double value);
  void Sample(const std::string& name, double value) { Sample(name, {}, value); }
  // Shorthands: a family with a single unlabelled sample.
  void Counter(const std::string& name, const std::string& help, double value);
  void Gauge(const std::string& name, const std::string& help, double value);
  const std::string& text() const { return out_; }

 private:
  std::string out_;
};

// A latency histogram in seconds with fixed buckets (Observe is lock-free).
class Histogram {
 public:
  // Buckets from 50 µs to 10 s, roughly x2.5 apart: FUSE ops, block reads and under-storage calls.
  static const std::vector<double>& LatencyBuckets();
  explicit Histogram(const std::vector<double>& bounds = LatencyBuckets());
  void Observe(double seconds);
  // Writes the _bucket, _sum and _count samples (the family is declared by the caller).
  void Write(Exposition* e, const std::string& name, const Labels& labels) const;

 private:
  std::vector<double> bounds_;
  std::unique_ptr<std::atomic<uint64_t>[]> counts_;  // one per bound, then +Inf
  std::atomic<uint64_t> count_{0};
  std::atomic<uint64_t> sum_ns_{0};
};

// Histograms by one label value (e.g. FUSE operation), made on first use.
class HistogramSet {
 public:
  explicit HistogramSet(std::string label) : label_(std::move(label)) {}
  Histogram& Get(const std::string& value) EXCLUDES(mu_);
  void Write(Exposition* e, const std::string& name, const std::string& help) const EXCLUDES(mu_);

 private:
  const std::string label_;
  mutable Mutex mu_;
  std::map<std::string, std::unique_ptr<Histogram>> by_value_ GUARDED_BY(mu_);  // entries never removed
};

// The process's memory: resident bytes (/proc/self/status) and its cgroup's limit (v2 memory.max,
// else v1 memory.limit_in_bytes; 0 when there is none).
struct ProcessMemory {
  uint64_t rss_bytes = 0;
  uint64_t limit_bytes = 0;
};
ProcessMemory ReadProcessMemory();
// Resident bytes (VmRSS) of process `pid`; 0 when it cannot be read (no such process).
uint64_t ResidentBytesOf(int pid);
// Writes process_resident_memory_bytes (the name Prometheus clients use),
// granary_process_memory_limit_bytes and granary_bad_requests_total (common/bad_request.h).
void WriteProcessMetrics(Exposition* e);


class MetricsServer {
 public:
  // Listens on `listen` (host:port; port 0 picks one). `render` fills the exposition per scrape.
  // Nothing it serves names a file, a process or a user: what shows those (the access trace) is
  // served on a root-only unix socket instead (common/stream_socket.h).
  static StatusOr<std::unique_ptr<MetricsServer>> Start(const std::string& listen,
                                                        std::function<void(Exposition*)> render,
                                                        std::function<Status()> ready);
  ~MetricsServer();
  std::string address() const { return address_; }  // host:port bound

 private:
  MetricsServer() = default;
  struct Impl;
  std::unique_ptr<Impl> impl_;
  std::thread thread_;
  std::string address_;
};

// "off" or "" disables an endpoint; anything else is a host:port to listen on. A busy default port
// must not stop a daemon, so a failure to listen is logged and the endpoint left off.
std::unique_ptr<MetricsServer> StartOrWarn(const std::string& setting_key, const std::string& listen,
                                           std::function<void(Exposition*)> render, std::function<Status()> ready);

}  // namespace granary::metrics
