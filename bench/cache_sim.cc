// granary-cache-bench: the cache policies and the eviction path, measured on the real BlockStore.
//
//   granary-cache-bench policy   [--blocks N] [--epochs E] [--levels 1|2] [--dir D]
//                                hit ratio per shuffled epoch (2 levels: MEM a quarter, SSD the rest)
//   granary-cache-bench eviction [--seconds S] [--write-mbps R] [--dir D]  eviction cost under readers
//   granary-cache-bench put      [--blocks N] [--bytes B] [--threads T] [--dir D]
//                                CPU per Put of a cold block into a fresh store (the worker's tier write)
//
// policy: a trace of E shuffled epochs over N blocks is replayed against a store whose quota holds
// 25%, 50% and 75% of the dataset, with lru and with shuffle. A miss is fetched and Put, as the
// worker does. Prints a Markdown table: the hit ratio of every epoch and, from epoch 2 on, its ratio
// to cache/dataset (the best any policy can do; the target is >= 0.95 for shuffle).
//
// eviction: a full store on disk (4 MiB blocks), two reader threads reading 1 MiB ranges of cached
// blocks; first readers alone, then readers while a writer puts new blocks at R MB/s (default 400,
// a fast under-storage link; 0 = unpaced), each forcing an eviction. Prints the readers' MB/s in both phases (their ratio is the cost of eviction) and the
// blocks evicted per second.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <random>
#include <string>
#include <sys/resource.h>
#include <thread>
#include <vector>

#include "common/hash.h"
#include "worker/block_store.h"

using namespace granary;
using namespace granary::worker;
using Clock = std::chrono::steady_clock;

namespace {

BlockMeta Meta(uint64_t i, uint64_t len) {
  return BlockMeta{BlockId{MakeFileKey("file:///bench", "f" + std::to_string(i), "v1"), 0}, 1, len};
}

std::string Flag(int argc, char** argv, const std::string& name, const std::string& def) {
  for (int i = 2; i + 1 < argc; ++i) {
    if (argv[i] == "--" + name) return argv[i + 1];
  }
  return def;
}

int Fail(const std::string& what) {
  std::fprintf(stderr, "granary-cache-bench: %s\n", what.c_str());
  return 1;
}

int Policy(int argc, char** argv) {
  const uint64_t n = std::stoull(Flag(argc, argv, "blocks", "4000"));
  const int epochs = std::stoi(Flag(argc, argv, "epochs", "5"));
  const std::string base = Flag(argc, argv, "dir", "/dev/shm");
  // 1: one SSD level holding the whole cache. 2: a MEM level (a quarter of the cache) above an SSD
  // level (the rest), the way a node with a tmpfs and a disk is set up.
  const int levels = std::stoi(Flag(argc, argv, "levels", "1"));
  if (levels != 1 && levels != 2) return Fail("--levels is 1 or 2");
  const uint64_t data = 4096;
  const uint64_t file = BlockFileBytes(data);
  const std::string payload(data, 'x');
  std::printf("| policy | cache/dataset |");
  for (int e = 1; e <= epochs; ++e) std::printf(" epoch %d |", e);
  std::printf(" epochs 2-%d | vs cache/dataset |\n|---|---:|", epochs);
  for (int e = 0; e <= epochs + 1; ++e) std::printf("---:|");
  std::printf("\n");
  for (double frac : {0.25, 0.5, 0.75}) {
    for (CachePolicy policy : {CachePolicy::kLru, CachePolicy::kShuffle}) {
      std::string dir = base + "/granary-cache-bench-" + std::to_string(getpid());
      std::filesystem::remove_all(dir);
      StoreOptions o;
      const uint64_t cache = static_cast<uint64_t>(frac * static_cast<double>(n)) * file;
      TierLevel l;  // default watermarks 0.95 / 0.7
      l.medium = "SSD";
      l.paths = {dir + "/ssd"};
      l.quotas = {levels == 1 ? cache : cache - cache / 4};
      if (levels == 2) {
        TierLevel mem;
        mem.medium = "MEM";
        mem.paths = {dir + "/mem"};
        mem.quotas = {cache / 4};
        o.levels = {mem, l};
        o.require_tmpfs_for_mem = false;
      } else {
        o.levels = {l};
      }
      o.policy = policy;
      o.background = false;
      auto store = BlockStore::Open(o);
      if (!store.ok()) return Fail(store.status().message());
      std::vector<uint64_t> order(n);
      for (uint64_t i = 0; i < n; ++i) order[i] = i;
      std::mt19937_64 rng(42);
      std::string buf(data, '\0');
      uint64_t later_hits = 0, later_reads = 0;
      std::printf("| %s | %.2f |", CachePolicyName(policy), frac);
      for (int e = 0; e < epochs; ++e) {
        std::shuffle(order.begin(), order.end(), rng);
        uint64_t hits = 0;
        for (uint64_t k = 0; k < n; ++k) {
          BlockMeta m = Meta(order[k], data);
          if ((*store)->Read(m.id, 0, data, buf.data()).ok()) {
            ++hits;
          } else {
            (void)(*store)->Put(m, payload);
          }
          if (k % 64 == 0) (*store)->Reserve();  // the worker's reserver runs about this often
        }
        if (e > 0) {
          later_hits += hits;
          later_reads += n;
        }
        std::printf(" %.3f |", static_cast<double>(hits) / static_cast<double>(n));
      }
      double later = static_cast<double>(later_hits) / static_cast<double>(later_reads);
      std::printf(" %.3f | %.2f |\n", later, later / frac);
      std::fflush(stdout);
      store->reset();
      std::filesystem::remove_all(dir);
    }
  }
  return 0;
}

int Eviction(int argc, char** argv) {
  const double seconds = std::stod(Flag(argc, argv, "seconds", "4"));
  const std::string base = Flag(argc, argv, "dir", "/tmp");
  const double write_mbps = std::stod(Flag(argc, argv, "write-mbps", "400"));  // 0: as fast as it can
  const uint64_t data = 4 << 20;
  const uint64_t blocks = 64;  // 256 MiB cache
  std::string dir = base + "/granary-cache-bench-" + std::to_string(getpid());
  std::filesystem::remove_all(dir);
  StoreOptions o;
  TierLevel l;
  l.medium = "SSD";
  l.paths = {dir};
  l.quotas = {blocks * (BlockFileBytes(data))};
  l.high = 1.0;
  l.low = 1.0;
  o.levels = {l};
  o.background = false;
  auto opened = BlockStore::Open(o);
  if (!opened.ok()) return Fail(opened.status().message());
  BlockStore& store = **opened;
  std::string payload(data, '\0');
  std::mt19937_64 fill(1);
  for (auto& c : payload) c = static_cast<char>(fill());
  for (uint64_t i = 0; i < blocks; ++i) {
    if (!store.Put(Meta(i, data), payload).ok()) return Fail("cannot fill the store");
  }
  std::atomic<uint64_t> next{blocks};
  auto phase = [&](bool writer) {
    std::atomic<bool> stop{false};
    std::atomic<uint64_t> bytes{0}, errors{0};
    std::vector<std::thread> ts;
    for (int t = 0; t < 2; ++t) {
      ts.emplace_back([&, t] {
        std::mt19937_64 rng(static_cast<uint64_t>(t) + 7);
        std::string buf(1 << 20, '\0');
        while (!stop) {
          // The most recent blocks are the ones still cached.
          uint64_t hi = next.load();
          uint64_t id = hi - 1 - rng() % (blocks / 2);
          auto r = store.Read(Meta(id, data).id, (rng() % 4) << 20, 1 << 20, buf.data());
          if (r.ok()) {
            bytes += *r;
          } else if (!r.status().IsNotFound()) {
            errors++;
          }
        }
      });
    }
    uint64_t ev0 = store.Stats().evictions;
    auto start = Clock::now();
    std::thread w;
    if (writer) {
      w = std::thread([&] {
        uint64_t written = 0;
        while (!stop) {
          if (!store.Put(Meta(next.load(), data), payload).ok()) errors++;
          next++;
          written += data;
          if (write_mbps > 0) {  // pace new blocks like misses arriving from the under-storage
            auto due = start + std::chrono::duration_cast<Clock::duration>(
                                   std::chrono::duration<double>(static_cast<double>(written) / 1e6 / write_mbps));
            while (!stop && Clock::now() < due) std::this_thread::sleep_for(std::chrono::milliseconds(1));
          }
        }
      });
    }
    while (std::chrono::duration<double>(Clock::now() - start).count() < seconds) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    stop = true;
    for (auto& t : ts) t.join();
    if (w.joinable()) w.join();
    double secs = std::chrono::duration<double>(Clock::now() - start).count();
    struct R {
      double mbps, evictions_per_s;
      uint64_t errors;
    };
    return R{static_cast<double>(bytes) / 1e6 / secs, static_cast<double>(store.Stats().evictions - ev0) / secs,
             errors.load()};
  };
  auto quiet = phase(false);
  auto busy = phase(true);
  std::printf("| phase | readers MB/s | blocks evicted/s | errors |\n|---|---:|---:|---:|\n");
  std::printf("| readers alone | %.0f | 0 | %llu |\n", quiet.mbps, static_cast<unsigned long long>(quiet.errors));
  std::printf("| readers while a writer forces evictions | %.0f | %.1f | %llu |\n", busy.mbps, busy.evictions_per_s,
              static_cast<unsigned long long>(busy.errors));
  std::printf("\nreaders' throughput during eviction: %.2f x alone (4 MiB blocks, %.0f MB/s of new blocks written)\n",
              busy.mbps / quiet.mbps, busy.evictions_per_s * static_cast<double>(data) / 1e6);
  opened->reset();
  std::filesystem::remove_all(dir);
  return quiet.errors + busy.errors == 0 ? 0 : 1;
}

}  // namespace

// put: N blocks of B bytes (default 2000 x 110 KB, the rig's images) Put by T threads into a fresh
// store under D, as a worker puts what it fetched: the data, its sidecar, the index. Prints the
// process's CPU (user + system) and wall time per Put; run it on the file system the cache uses.
int PutCost(int argc, char** argv) {
  const uint64_t n = std::stoull(Flag(argc, argv, "blocks", "2000"));
  const uint64_t bytes = std::stoull(Flag(argc, argv, "bytes", "112640"));
  const int threads = std::stoi(Flag(argc, argv, "threads", "8"));
  const std::string dir = Flag(argc, argv, "dir", "/var/tmp") + "/granary-cache-bench-" + std::to_string(getpid());
  std::filesystem::remove_all(dir);
  auto store = BlockStore::Open(dir, (n + 16) * BlockFileBytes(bytes));
  if (!store.ok()) return Fail(store.status().message());
  std::string payload(bytes, '\0');
  std::mt19937_64 rng(7);
  for (auto& c : payload) c = static_cast<char>(rng());
  auto cpu = [] {
    rusage u{};
    getrusage(RUSAGE_SELF, &u);
    return static_cast<double>(u.ru_utime.tv_sec + u.ru_stime.tv_sec) +
           static_cast<double>(u.ru_utime.tv_usec + u.ru_stime.tv_usec) / 1e6;
  };
  std::atomic<uint64_t> next{0}, errors{0};
  const double cpu0 = cpu();
  const auto t0 = Clock::now();
  std::vector<std::thread> ts;
  for (int t = 0; t < threads; ++t) {
    ts.emplace_back([&] {
      for (uint64_t i; (i = next++) < n;) {
        if (!(*store)->Put(Meta(i, bytes), payload).ok()) errors++;
      }
    });
  }
  for (auto& t : ts) t.join();
  const double wall = std::chrono::duration<double>(Clock::now() - t0).count();
  const double used = cpu() - cpu0;
  store->reset();
  std::filesystem::remove_all(dir);
  if (errors > 0) return Fail(std::to_string(errors.load()) + " Puts failed");
  std::printf("| blocks | bytes | threads | CPU us per Put | wall us per Put | CPU s per GB |\n|---:|---:|---:|---:|---:|---:|\n");
  std::printf("| %llu | %llu | %d | %.1f | %.1f | %.2f |\n", static_cast<unsigned long long>(n),
              static_cast<unsigned long long>(bytes), threads, used / static_cast<double>(n) * 1e6,
              wall / static_cast<double>(n) * 1e6, used / (static_cast<double>(n * bytes) / 1e9));
  return 0;
}

int main(int argc, char** argv) {
  std::string cmd = argc > 1 ? argv[1] : "";
  if (cmd == "policy") return Policy(argc, argv);
  if (cmd == "eviction") return Eviction(argc, argv);
  if (cmd == "put") return PutCost(argc, argv);
  std::fprintf(stderr,
               "usage: granary-cache-bench policy [--blocks N] [--epochs E] [--levels 1|2] [--dir D]\n"
               "       granary-cache-bench eviction [--seconds S] [--write-mbps R] [--dir D]\n"
               "       granary-cache-bench put [--blocks N] [--bytes B] [--threads T] [--dir D]\n");
  return 2;
}
