// granary-cluster-sim: a real granary-master under a simulated cluster. N workers register, then
// heartbeat at the configured interval and cache blocks at a steady rate (each cache change is an
// early heartbeat whose per-mount counters grow, as worker/master_link.h sends them), while M
// clients (FUSE mounts) do Lookup / GetAttr / ReadDir / GetFile on a directory of the namespace.
// Measures what the master spends on it (CPU cores, RSS) and what callers see (p50/p99 per call,
// the heartbeat round trip). Workers are simulated by a few threads, each driving many workers'
// schedules, so 1000 workers cost the simulator little; their addresses are never dialled (no job
// runs during the simulation).
//
//   granary-cluster-sim --master HOST:PORT --path /ds/dir [--workers 1000] [--clients 100]
//       [--seconds 10] [--heartbeat 3s] [--blocks-per-s 20] [--report-every 1s] [--master-pid P]
//       [--client-rate R] [--read-masters A,B,C] [--warmup 1]
//
// --warmup S: the clients call for S seconds before anything is counted (the first half second
// after the clients start is the master's and the channels' warm-up: thread pools growing,
// connections made; it showed as a 120–270 ms p99 for every master, alone or with standbys).
//
// --read-masters: the clients' metadata calls go to these masters, client i to the (i mod n)-th
// (standby masters answer namespace reads); workers still talk to --master (the leader).
//
// Clients run closed-loop by default (a new call as soon as the last returns: throughput, and
// latency at saturation). With --client-rate R each client starts a call every 1/R s on a fixed
// schedule (open loop), and a call's latency is counted from when it was due, not when it was
// sent, so a master that falls behind shows it (no coordinated omission).
//
// Prints one JSON object. bench/cluster_sim.sh runs it for several sizes against a fresh master
// and prints the table (docs/benchmarks.md).
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <map>
#include <mutex>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/config.h"
#include "common/metrics.h"
#include "common/units.h"
#include "proto/granary.grpc.pb.h"
#include "rpc/rpc.h"

using namespace granary;
using Clock = std::chrono::steady_clock;

namespace {

double Seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

// Latencies of one kind of call, merged from every thread at the end.
struct Samples {
  std::mutex mu;
  std::vector<double> ms;
  uint64_t errors = 0;
  void Add(const std::vector<double>& v, uint64_t err) {
    std::lock_guard<std::mutex> lock(mu);
    ms.insert(ms.end(), v.begin(), v.end());
    errors += err;
  }
  nlohmann::json Summary(double secs) {
    std::lock_guard<std::mutex> lock(mu);
    std::sort(ms.begin(), ms.end());
    auto q = [&](double p) { return ms.empty() ? 0.0 : ms[std::min(ms.size() - 1, static_cast<size_t>(p * ms.size()))]; };
    return {{"calls", ms.size()}, {"per_s", ms.size() / secs}, {"p50_ms", q(0.5)}, {"p99_ms", q(0.99)},
            {"max_ms", ms.empty() ? 0.0 : ms.back()}, {"errors", errors}};
  }
};

// The master's CPU time (user + system, seconds), from /proc.
double CpuSeconds(int pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  if (!std::getline(in, line)) return 0;
  std::istringstream rest(line.substr(line.rfind(')') + 2));  // fields from the 3rd on
  std::string f;
  unsigned long long utime = 0, stime = 0;
  for (int i = 3; rest >> f; ++i) {
    if (i == 14) utime = std::stoull(f);
    if (i == 15) {
      stime = std::stoull(f);
      break;
    }
  }
  return static_cast<double>(utime + stime) / static_cast<double>(sysconf(_SC_CLK_TCK));
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"granary-cluster-sim"};
  std::string master, path, heartbeat_s, report_s, read_masters_list;
  int workers = 1000, clients = 100, master_pid = 0;
  double seconds = 10, blocks_per_s = 20, client_rate = 0, warmup = 1;
  Config cfg = Config::Defaults();
  app.add_option("--master", master)->required();
  app.add_option("--path", path, "a namespace directory the clients work in")->required();
  app.add_option("--workers", workers);
  app.add_option("--clients", clients);
  app.add_option("--seconds", seconds, "how long the calls are counted (after --warmup)");
  app.add_option("--warmup", warmup, "seconds of calls before counting starts (default 1)");
  app.add_option("--heartbeat", heartbeat_s, "heartbeat interval (default: worker.heartbeat_interval's default)");
  app.add_option("--blocks-per-s", blocks_per_s, "blocks each worker caches (and reports) per second");
  app.add_option("--report-every", report_s, "how often a worker sends an early heartbeat for its new blocks (default 1s)");
  app.add_option("--read-masters", read_masters_list, "masters the clients' calls go to, comma-separated (default: --master)");
  app.add_option("--master-pid", master_pid, "the master's pid, for its CPU and RSS");
  app.add_option("--client-rate", client_rate, "calls per second per client, open loop (default 0: closed loop)");
  CLI11_PARSE(app, argc, argv);
  auto interval = cfg.worker.heartbeat_interval;
  auto report_every = std::chrono::milliseconds(1000);
  for (auto [text, out] : {std::pair{&heartbeat_s, &interval}, std::pair{&report_s, &report_every}}) {
    if (text->empty()) continue;
    auto d = ParseDuration(*text);
    if (!d.ok()) {
      std::fprintf(stderr, "granary-cluster-sim: error: %s\n", d.status().message().c_str());
      return 2;
    }
    *out = *d;
  }
  auto sec = RpcSecurity::FromConfig(cfg.rpc);
  if (!sec.ok()) return 1;
  auto stub = rpc::Master::NewStub((*sec)->MakeChannel(master));

  // The directory the clients use: its entries, and the mount id blocks are reported under.
  rpc::ResolvePathRequest rr;
  rr.set_path(path);
  rpc::AttrResponse dir;
  {
    grpc::ClientContext ctx;
    auto st = stub->ResolvePath(&ctx, rr, &dir);
    if (!st.ok()) {
      std::fprintf(stderr, "granary-cluster-sim: error: %s: %s\n", path.c_str(), st.error_message().c_str());
      return 1;
    }
  }
  std::vector<std::pair<std::string, uint64_t>> entries;
  {
    rpc::ReadDirRequest req;
    req.set_ino(dir.attr().ino());
    req.set_limit(4096);
    rpc::ReadDirResponse page;
    grpc::ClientContext ctx;
    if (!stub->ReadDir(&ctx, req, &page).ok()) return 1;
    for (const auto& e : page.entries()) {
      if (e.attr().type() != rpc::DIRECTORY) entries.emplace_back(e.name(), e.attr().ino());
    }
  }
  if (entries.empty()) {
    std::fprintf(stderr, "granary-cluster-sim: error: %s has no files\n", path.c_str());
    return 1;
  }
  uint64_t mount_id = 0;
  {
    rpc::GetFileRequest gf;
    gf.set_ino(entries[0].second);
    rpc::FileInfo fi;
    grpc::ClientContext ctx;
    if (stub->GetFile(&ctx, gf, &fi).ok()) mount_id = fi.mount_id();
  }

  Samples lookup, getattr, readdir, getfile, heartbeat, report, reg;
  std::atomic<bool> stop{false};
  std::atomic<uint64_t> blocks_reported{0};

  // Workers: every one registers (the start of the run is the registration storm a restarted
  // master sees), then each thread runs its workers' heartbeat and report schedules.
  int sim_threads = std::max(1, std::min(workers, 16));
  std::vector<std::thread> ts;
  std::atomic<int> registered{0};
  auto start = Clock::now();
  for (int t = 0; t < sim_threads; ++t) {
    ts.emplace_back([&, t] {
      auto s = rpc::Master::NewStub((*sec)->MakeChannel(master));
      std::mt19937_64 rng(1000 + t);
      struct Sim {
        uint64_t id = 0;
        uint64_t epoch = 0;  // of the membership last received
        uint64_t held = 0;   // blocks cached so far
        Clock::time_point next_hb, next_report;
      };
      // A heartbeat as a worker sends it: its stats with the per-mount counters of what it holds.
      auto beat = [&](Sim& sim, rpc::HeartbeatResponse* resp, grpc::ClientContext* ctx) {
        rpc::HeartbeatRequest req;
        req.set_worker_id(sim.id);
        req.set_members_epoch(sim.epoch);
        rpc::MountCounters& mc = (*req.mutable_stats()->mutable_mount_counters())[mount_id];
        mc.set_held_blocks(sim.held);
        mc.set_held_bytes(sim.held << 22);
        mc.set_home_blocks(sim.held);
        mc.set_home_bytes(sim.held << 22);
        req.mutable_stats()->set_blocks(sim.held);
        auto st = s->Heartbeat(ctx, req, resp);
        if (st.ok()) sim.epoch = resp->members_epoch();
        return st;
      };
      std::vector<Sim> mine;
      std::vector<double> hb_ms, rep_ms, reg_ms;
      uint64_t hb_err = 0, rep_err = 0, reg_err = 0;
      for (int w = t; w < workers; w += sim_threads) {
        rpc::RegisterWorkerRequest req;
        req.set_address("10." + std::to_string(w / 65536) + "." + std::to_string((w / 256) % 256) + "." +
                        std::to_string(w % 256) + ":29999");
        rpc::RegisterWorkerResponse resp;
        grpc::ClientContext ctx;
        auto t0 = Clock::now();
        auto st = s->RegisterWorker(&ctx, req, &resp);
        reg_ms.push_back(Seconds(Clock::now() - t0) * 1000);
        if (!st.ok()) {
          reg_err++;
          continue;
        }
        Sim sim;
        sim.id = resp.worker_id();
        sim.epoch = resp.members_epoch();
        auto now = Clock::now();
        sim.next_hb = now + std::chrono::milliseconds(rng() % std::max<int64_t>(1, interval.count()));
        sim.next_report = now + std::chrono::milliseconds(rng() % std::max<int64_t>(1, report_every.count()));
        mine.push_back(sim);
      }
      registered += static_cast<int>(mine.size());
      const int per_report = std::max(0, static_cast<int>(blocks_per_s * report_every.count() / 1000.0 + 0.5));
      while (!stop && !mine.empty()) {
        auto due = std::min_element(mine.begin(), mine.end(), [](const Sim& a, const Sim& b) {
          return std::min(a.next_hb, a.next_report) < std::min(b.next_hb, b.next_report);
        });
        auto when = std::min(due->next_hb, due->next_report);
        if (when > Clock::now()) {
          std::this_thread::sleep_until(std::min(when, Clock::now() + std::chrono::milliseconds(50)));
          continue;
        }
        grpc::ClientContext ctx;
        auto t0 = Clock::now();
        if (due->next_hb <= due->next_report) {
          rpc::HeartbeatResponse resp;
          auto st = beat(*due, &resp, &ctx);
          hb_ms.push_back(Seconds(Clock::now() - t0) * 1000);
          if (!st.ok()) hb_err++;
          due->next_hb += interval;
        } else {
          due->held += per_report;
          rpc::HeartbeatResponse resp;
          auto st = beat(*due, &resp, &ctx);
          rep_ms.push_back(Seconds(Clock::now() - t0) * 1000);
          if (!st.ok()) rep_err++;
          else blocks_reported += per_report;
          due->next_report += report_every;
        }
      }
      heartbeat.Add(hb_ms, hb_err);
      report.Add(rep_ms, rep_err);
      reg.Add(reg_ms, reg_err);
    });
  }
  // Measurement starts once every worker is registered.
  while (registered.load() < workers && Seconds(Clock::now() - start) < 600) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    if (reg.errors > 0) break;
  }
  double register_all_s = Seconds(Clock::now() - start);
  const auto t_start = Clock::now();
  // Calls due before this are made but not counted (--warmup).
  const auto t_begin = t_start + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(warmup));

  std::vector<std::thread> cs;
  for (int c = 0; c < clients; ++c) {
    cs.emplace_back([&, c] {
      const std::vector<std::string> readers = SplitAddressList(read_masters_list);
      const std::string& target = readers.empty() ? master : readers[c % readers.size()];
      auto s = rpc::Master::NewStub((*sec)->MakeChannel(target));  // each client its own channel
      std::mt19937_64 rng(c + 1);
      std::vector<double> l, g, r, f;
      uint64_t le = 0, ge = 0, re = 0, fe = 0;
      const auto period = client_rate > 0 ? std::chrono::duration_cast<Clock::duration>(
                                                std::chrono::duration<double>(1.0 / client_rate))
                                          : Clock::duration::zero();
      // Open loop: clients start at spread-out phases, then keep to their schedules.
      auto due = Clock::now() + (client_rate > 0 ? period * static_cast<int64_t>(rng() % 1000) / 1000 : Clock::duration::zero());
      for (uint64_t n = 0; !stop; ++n) {
        const auto& e = entries[rng() % entries.size()];
        grpc::ClientContext ctx;
        auto t0 = Clock::now();
        if (client_rate > 0) {
          std::this_thread::sleep_until(due);
          t0 = due;  // the latency a caller that wanted the answer then sees
          due += period;
        }
        switch (n % 4) {
          case 0: {
            rpc::LookupRequest q;
            q.set_parent(dir.attr().ino());
            q.set_name(e.first);
            rpc::AttrResponse a;
            if (!s->Lookup(&ctx, q, &a).ok()) le++;
            if (t0 >= t_begin) l.push_back(Seconds(Clock::now() - t0) * 1000);
            break;
          }
          case 1: {
            rpc::GetAttrRequest q;
            q.set_ino(e.second);
            rpc::AttrResponse a;
            if (!s->GetAttr(&ctx, q, &a).ok()) ge++;
            if (t0 >= t_begin) g.push_back(Seconds(Clock::now() - t0) * 1000);
            break;
          }
          case 2: {
            rpc::ReadDirRequest q;
            q.set_ino(dir.attr().ino());
            q.set_limit(128);
            rpc::ReadDirResponse a;
            if (!s->ReadDir(&ctx, q, &a).ok()) re++;
            if (t0 >= t_begin) r.push_back(Seconds(Clock::now() - t0) * 1000);
            break;
          }
          default: {
            rpc::GetFileRequest q;
            q.set_ino(e.second);
            rpc::FileInfo a;
            if (!s->GetFile(&ctx, q, &a).ok()) fe++;
            if (t0 >= t_begin) f.push_back(Seconds(Clock::now() - t0) * 1000);
          }
        }
      }
      lookup.Add(l, le);
      getattr.Add(g, ge);
      readdir.Add(r, re);
      getfile.Add(f, fe);
    });
  }
  std::this_thread::sleep_until(t_begin);
  double cpu0 = master_pid ? CpuSeconds(master_pid) : 0;
  while (Seconds(Clock::now() - t_begin) < seconds) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  double cpu1 = master_pid ? CpuSeconds(master_pid) : 0;
  double secs = Seconds(Clock::now() - t_begin);
  uint64_t rss = master_pid ? metrics::ResidentBytesOf(master_pid) : 0;
  stop = true;
  for (auto& t : cs) t.join();
  for (auto& t : ts) t.join();

  nlohmann::json out = {{"workers", workers},
                        {"clients", clients},
                        {"client_rate", client_rate},
                        {"read_masters", std::max<size_t>(1, SplitAddressList(read_masters_list).size())},
                        {"seconds", secs},
                        {"heartbeat_interval_ms", interval.count()},
                        {"blocks_per_s_per_worker", blocks_per_s},
                        {"register_all_s", register_all_s},
                        {"blocks_reported", blocks_reported.load()},
                        {"register", reg.Summary(register_all_s)},
                        {"heartbeat", heartbeat.Summary(secs)},
                        {"report_blocks", report.Summary(secs)},
                        {"lookup", lookup.Summary(secs)},
                        {"getattr", getattr.Summary(secs)},
                        {"readdir", readdir.Summary(secs)},
                        {"getfile", getfile.Summary(secs)}};
  if (master_pid) {
    out["master_cpu_cores"] = (cpu1 - cpu0) / secs;
    out["master_rss_bytes"] = rss;
  }
  std::printf("%s\n", out.dump().c_str());
  uint64_t errors = reg.errors + heartbeat.errors + report.errors + lookup.errors + getattr.errors + readdir.errors +
                    getfile.errors;
  return errors == 0 ? 0 : 1;
}
