#include "common/metrics.h"

#include "common/bad_request.h"

#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <thread>

#include <httplib.h>
#include <spdlog/spdlog.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "common/net.h"

namespace granary::metrics {
namespace {

std::string Escape(const std::string& v) {
  std::string out;
  for (char c : v) {
    if (c == '\\' || c == '"') {
      out += '\\';
      out += c;
    } else if (c == '\n') {
      out += "\\n";
    } else {
      out += c;
    }
  }
  return out;
}

std::string Number(double v) {
  if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
  if (std::isnan(v)) return "NaN";
  char buf[64];
  if (v == std::floor(v) && std::fabs(v) < 1e15) {
    std::snprintf(buf, sizeof buf, "%.0f", v);
  } else {
    std::snprintf(buf, sizeof buf, "%.9g", v);
  }
  return buf;
}

}  // namespace

void Exposition::Family(const std::string& name, const std::string& type, const std::string& help) {
  out_ += "# HELP " + name + " " + help + "\n# TYPE " + name + " " + type + "\n";
}

void Exposition::Sample(const std::string& name, const Labels& labels, double value) {
  out_ += name;
  if (!labels.empty()) {
    out_ += '{';
    for (size_t i = 0; i < labels.size(); ++i) {
      if (i) out_ += ',';
      out_ += labels[i].first + "=\"" + Escape(labels[i].second) + "\"";
    }
    out_ += '}';
  }
  out_ += ' ' + Number(value) + '\n';
}

void Exposition::Counter(const std::string& name, const std::string& help, double value) {
  Family(name, "counter", help);
  Sample(name, value);
}

void Exposition::Gauge(const std::string& name, const std::string& help, double value) {
  Family(name, "gauge", help);
  Sample(name, value);
}

const std::vector<double>& Histogram::LatencyBuckets() {
  static const std::vector<double> b{0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01,
                                     0.025,   0.05,   0.1,     0.25,   0.5,   1,      2.5,   5,     10};
  return b;
}

Histogram::Histogram(const std::vector<double>& bounds)
    : bounds_(bounds), counts_(new std::atomic<uint64_t>[bounds.size() + 1]) {
  for (size_t i = 0; i <= bounds_.size(); ++i) counts_[i] = 0;
}

void Histogram::Observe(double seconds) {
  size_t i = 0;
  while (i < bounds_.size() && seconds > bounds_[i]) ++i;
  counts_[i].fetch_add(1, std::memory_order_relaxed);
  count_.fetch_add(1, std::memory_order_relaxed);
  sum_ns_.fetch_add(static_cast<uint64_t>(std::max(0.0, seconds) * 1e9), std::memory_order_relaxed);
}

void Histogram::Write(Exposition* e, const std::string& name, const Labels& labels) const {
  uint64_t cumulative = 0;
  for (size_t i = 0; i <= bounds_.size(); ++i) {
    cumulative += counts_[i].load(std::memory_order_relaxed);
    Labels l = labels;
    l.emplace_back("le", i < bounds_.size() ? Number(bounds_[i]) : "+Inf");
    e->Sample(name + "_bucket", l, static_cast<double>(cumulative));
  }
  e->Sample(name + "_sum", labels, static_cast<double>(sum_ns_.load(std::memory_order_relaxed)) / 1e9);
  // The count is the +Inf bucket, so the two always agree within one scrape.
  e->Sample(name + "_count", labels, static_cast<double>(cumulative));
}

Histogram& HistogramSet::Get(const std::string& value) {
  MutexLock lock(&mu_);
  auto& h = by_value_[value];
  if (!h) h = std::make_unique<Histogram>();
  return *h;
}

void HistogramSet::Write(Exposition* e, const std::string& name, const std::string& help) const {
  e->Family(name, "histogram", help);
  MutexLock lock(&mu_);
  for (const auto& [v, h] : by_value_) h->Write(e, name, {{label_, v}});
}

namespace {

uint64_t ReadNumberFile(const char* path, bool* present) {
  *present = false;
  std::FILE* f = std::fopen(path, "r");
  if (f == nullptr) return 0;
  char buf[64] = {0};
  bool got = std::fgets(buf, sizeof buf, f) != nullptr;
  std::fclose(f);
  if (!got) return 0;
  *present = true;
  if (std::strncmp(buf, "max", 3) == 0) return 0;
  return std::strtoull(buf, nullptr, 10);
}

}  // namespace

uint64_t ResidentBytesOf(int pid) {
  uint64_t bytes = 0;
  std::string path = "/proc/" + std::to_string(pid) + "/status";
  if (std::FILE* f = std::fopen(path.c_str(), "r")) {
    char line[256];
    while (std::fgets(line, sizeof line, f)) {
      if (std::strncmp(line, "VmRSS:", 6) == 0) {
        bytes = std::strtoull(line + 6, nullptr, 10) * 1024;  // in kB
        break;
      }
    }
    std::fclose(f);
  }
  return bytes;
}

ProcessMemory ReadProcessMemory() {
  ProcessMemory m;
  m.rss_bytes = ResidentBytesOf(getpid());
  bool present = false;
  uint64_t limit = ReadNumberFile("/sys/fs/cgroup/memory.max", &present);
  if (!present) {
    limit = ReadNumberFile("/sys/fs/cgroup/memory/memory.limit_in_bytes", &present);
    if (limit >= (uint64_t{1} << 60)) limit = 0;  // v1's "no limit" is a huge number
  }
  m.limit_bytes = limit;
  return m;
}

void WriteProcessMetrics(Exposition* e) {
  ProcessMemory m = ReadProcessMemory();
  e->Gauge("process_resident_memory_bytes", "Resident memory size in bytes.", static_cast<double>(m.rss_bytes));
  e->Gauge("granary_process_memory_limit_bytes", "Memory limit of the process's cgroup in bytes; 0: none.",
           static_cast<double>(m.limit_bytes));
  e->Counter("granary_bad_requests_total",
             "Requests refused as malformed or oversized (frames, block sizes, ranges); each is logged, at most once "
             "per 10 s per place.",
             static_cast<double>(BadRequests()));
}

struct MetricsServer::Impl {
  httplib::Server http;
  std::atomic<bool> ended{false};  // the listening thread returned
};

StatusOr<std::unique_ptr<MetricsServer>> MetricsServer::Start(const std::string& listen,
                                                              std::function<void(Exposition*)> render,
                                                              std::function<Status()> ready) {
  ASSIGN_OR_RETURN(HostPort hp, ParseHostPort(listen));
  std::unique_ptr<MetricsServer> s(new MetricsServer());
  s->impl_ = std::make_unique<Impl>();
  auto& http = s->impl_->http;
  http.new_task_queue = [] { return new httplib::ThreadPool(2); };
  // SO_REUSEADDR only: httplib's default also sets SO_REUSEPORT, with which a second daemon on
  // the same port shared it silently (issue 54: two `granary local`, each scrape answered by
  // either at random). Now the second one's bind fails and says so.
  http.set_socket_options([](socket_t sock) {
    int yes = 1;
    setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof yes);
  });
  http.Get("/metrics", [render](const httplib::Request&, httplib::Response& res) {
    Exposition e;
    render(&e);
    res.set_content(e.text(), "text/plain; version=0.0.4; charset=utf-8");
  });
  http.Get("/healthz", [](const httplib::Request&, httplib::Response& res) { res.set_content("ok\n", "text/plain"); });
  http.Get("/readyz", [ready](const httplib::Request&, httplib::Response& res) {
    Status st = ready();
    res.status = st.ok() ? 200 : 503;
    res.set_content(st.ok() ? "ready\n" : "not ready: " + st.message() + "\n", "text/plain");
  });
  int port = hp.port;
  if (port == 0) {
    port = http.bind_to_any_port(hp.host);
    if (port <= 0) return UnavailableError("cannot listen on " + listen);
  } else if (!http.bind_to_port(hp.host, port)) {
    return UnavailableError("cannot listen on " + listen + " (is the port in use?)");
  }
  s->address_ = hp.host + ":" + std::to_string(port);
  s->thread_ = std::thread([impl = s->impl_.get()] {
    impl->http.listen_after_bind();
    impl->ended = true;
  });
  // httplib's stop() does nothing until the server runs, and a stop() that came first would leave
  // the thread listening for ever (seen: a `granary local` failing right after start hung in this
  // destructor). Return only once it runs, so the destructor's stop() always takes.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (!s->impl_->http.is_running() && !s->impl_->ended && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  if (!s->impl_->http.is_running()) return UnavailableError("the metrics endpoint on " + listen + " did not start");
  return s;
}

MetricsServer::~MetricsServer() {
  if (impl_ && thread_.joinable()) {
    // stop() takes only once the server runs (see Start), and must be called once: wait for the
    // server to run (or its thread to have returned), then stop it.
    while (!impl_->ended) {
      if (impl_->http.is_running()) {
        impl_->http.stop();
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  }
  if (thread_.joinable()) thread_.join();
}

std::unique_ptr<MetricsServer> StartOrWarn(const std::string& setting_key, const std::string& listen,
                                           std::function<void(Exposition*)> render, std::function<Status()> ready) {
  if (listen.empty() || listen == "off") return nullptr;
  auto s = MetricsServer::Start(listen, std::move(render), std::move(ready));
  if (!s.ok()) {
    spdlog::warn("metrics endpoint off: {} ({}: set another host:port, or off)", s.status().message(), setting_key);
    return nullptr;
  }
  spdlog::info("metrics on http://{}/metrics (probes: /healthz, /readyz)", (*s)->address());
  return std::move(s).value();
}

}  // namespace granary::metrics
