// granary-meta-bench: metadata operations per second against a granary-master, from many threads,
// beside the same operations on a local directory (stat/lstat of the files) in the same run.
//
//   granary-meta-bench --master HOST:PORT --path /ds/dir --local /srv/ds/dir [--threads 16] [--seconds 5]
//   granary-meta-bench --master HOST:PORT --load /ds      bulk-load a mount's metadata, print the time
//
// It lists PATH once through the master (ReadDir pages), then each thread loops for S seconds over
// random entries doing Lookup(dir, name) and GetAttr(ino) through the master, and stat() of the same
// names under --local. Prints JSON: master ops/s, local ops/s, and their ratio.
#include <sys/stat.h>

#include <CLI/CLI.hpp>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "common/config.h"
#include "proto/granary.grpc.pb.h"
#include "rpc/rpc.h"

using namespace granary;
using Clock = std::chrono::steady_clock;

int main(int argc, char** argv) {
  CLI::App app{"granary-meta-bench"};
  std::string master, path, local;
  int threads = 16;
  double seconds = 5;
  app.add_option("--master", master)->required();
  std::string load;
  app.add_option("--path", path, "namespace directory");
  app.add_option("--local", local, "the same directory on local disk (baseline)");
  app.add_option("--load", load, "bulk-load the metadata below this namespace directory and exit");
  app.add_option("--threads", threads);
  app.add_option("--seconds", seconds);
  CLI11_PARSE(app, argc, argv);

  Config cfg = Config::Defaults();
  auto sec = RpcSecurity::FromConfig(cfg.rpc);
  if (!sec.ok()) return 1;
  auto channel = (*sec)->MakeChannel(master);
  auto stub = rpc::Master::NewStub(channel);
  if (!load.empty()) {
    rpc::LoadMetadataRequest req;
    req.set_path(load);
    rpc::LoadMetadataResponse resp;
    grpc::ClientContext ctx;
    auto start = Clock::now();
    auto st = stub->LoadMetadata(&ctx, req, &resp);
    double secs = std::chrono::duration<double>(Clock::now() - start).count();
    if (!st.ok()) {
      std::fprintf(stderr, "load %s: %s\n", load.c_str(), st.error_message().c_str());
      return 1;
    }
    std::printf("{\"files\": %llu, \"directories\": %llu, \"seconds\": %.3f, \"files_per_s\": %.0f, \"resumed\": %s}\n",
                static_cast<unsigned long long>(resp.files()), static_cast<unsigned long long>(resp.directories()),
                secs, static_cast<double>(resp.files()) / secs, resp.resumed_after().empty() ? "false" : "true");
    return 0;
  }
  if (path.empty() || local.empty()) {
    std::fprintf(stderr, "--path and --local are required (or --load)\n");
    return 2;
  }
  rpc::ResolvePathRequest rr;
  rr.set_path(path);
  rpc::AttrResponse dir;
  {
    grpc::ClientContext ctx;
    auto st = stub->ResolvePath(&ctx, rr, &dir);
    if (!st.ok()) {
      std::fprintf(stderr, "resolve %s: %s\n", path.c_str(), st.error_message().c_str());
      return 1;
    }
  }
  std::vector<std::pair<std::string, uint64_t>> entries;
  uint64_t after = 0;
  for (;;) {
    rpc::ReadDirRequest req;
    req.set_ino(dir.attr().ino());
    req.set_after(after);
    req.set_limit(4096);
    rpc::ReadDirResponse page;
    grpc::ClientContext ctx;
    if (!stub->ReadDir(&ctx, req, &page).ok()) return 1;
    for (const auto& e : page.entries()) {
      entries.emplace_back(e.name(), e.attr().ino());
      after = e.cookie();
    }
    if (page.end() || page.entries().empty()) break;
  }
  if (entries.empty()) return 1;

  auto run = [&](bool remote) {
    std::atomic<bool> stop{false};
    std::atomic<uint64_t> ops{0}, errors{0};
    std::vector<std::thread> ts;
    for (int t = 0; t < threads; ++t) {
      ts.emplace_back([&, t] {
        std::mt19937_64 rng(static_cast<uint64_t>(t) + 1);
        // Each thread its own channel, as separate FUSE clients would have.
        auto s = remote ? rpc::Master::NewStub((*sec)->MakeChannel(master)) : nullptr;
        uint64_t n = 0;
        while (!stop) {
          const auto& e = entries[rng() % entries.size()];
          if (remote) {
            rpc::LookupRequest lr;
            lr.set_parent(dir.attr().ino());
            lr.set_name(e.first);
            rpc::AttrResponse a;
            grpc::ClientContext c1;
            if (!s->Lookup(&c1, lr, &a).ok()) errors++;
            rpc::GetAttrRequest gr;
            gr.set_ino(e.second);
            grpc::ClientContext c2;
            if (!s->GetAttr(&c2, gr, &a).ok()) errors++;
            n += 2;
          } else {
            struct stat st;
            std::string p = local + "/" + e.first;
            if (lstat(p.c_str(), &st) != 0) errors++;
            if (stat(p.c_str(), &st) != 0) errors++;
            n += 2;
          }
        }
        ops += n;
      });
    }
    auto start = Clock::now();
    while (std::chrono::duration<double>(Clock::now() - start).count() < seconds) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    stop = true;
    for (auto& t : ts) t.join();
    double secs = std::chrono::duration<double>(Clock::now() - start).count();
    return std::make_pair(static_cast<double>(ops) / secs, errors.load());
  };
  auto [remote_ops, remote_err] = run(true);
  auto [local_ops, local_err] = run(false);
  std::printf("{\"entries\": %zu, \"threads\": %d, \"master_ops_per_s\": %.0f, \"local_stat_ops_per_s\": %.0f, "
              "\"ratio\": %.3f, \"errors\": %llu}\n",
              entries.size(), threads, remote_ops, local_ops, remote_ops / local_ops,
              static_cast<unsigned long long>(remote_err + local_err));
  return remote_err + local_err == 0 ? 0 : 1;
}
