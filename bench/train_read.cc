// granary-train-read: the training-read pattern, for the benchmark rig.
//
// P processes x T threads read a dataset for E epochs. Each epoch visits every file once in a new
// shuffled order (seed + epoch), shared by all workers through a counter in shared memory:
//   --mode files   each file is read whole (ImageFolder-style loaders);
//   --mode shards  the shard order is shuffled and each shard is read sequentially (TFRecord style).
// Reads are --read-size bytes (1 MiB). With --verify DIR, a sample of files per epoch is hashed as
// it is read and compared with the same file under DIR (sha256), so wrong bytes are caught.
// Prints one JSON line per epoch: files, bytes, seconds, files/s, MB/s, p50/p99 per-file latency,
// errors, verified, mismatches. Exit status 1 on any error or mismatch.
#include <fcntl.h>
#include <openssl/evp.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <random>
#include <string>
#include <thread>
#include <vector>

namespace {

struct Shared {  // lives in MAP_SHARED memory, one per epoch
  std::atomic<uint64_t> next;
  std::atomic<uint64_t> bytes;
  std::atomic<uint32_t> errors;
};

// Per file: latency (ms) and, for sampled files, the sha256 of what was read.
struct FileResult {
  double ms;
  unsigned char sha[32];
  uint8_t hashed;
};

bool HashFile(const std::string& path, unsigned char out[32]) {
  int fd = open(path.c_str(), O_RDONLY);
  if (fd < 0) return false;
  EVP_MD_CTX* ctx = EVP_MD_CTX_new();
  EVP_DigestInit_ex(ctx, EVP_sha256(), nullptr);
  std::vector<char> buf(1 << 20);
  ssize_t n;
  while ((n = read(fd, buf.data(), buf.size())) > 0) EVP_DigestUpdate(ctx, buf.data(), static_cast<size_t>(n));
  unsigned int len = 0;
  EVP_DigestFinal_ex(ctx, out, &len);
  EVP_MD_CTX_free(ctx);
  close(fd);
  return n == 0;
}

template <typename T>
T* SharedArray(size_t n) {
  void* p = mmap(nullptr, sizeof(T) * std::max<size_t>(n, 1), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) {
    std::perror("mmap");
    std::exit(2);
  }
  return static_cast<T*>(p);
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"granary-train-read: epochs of shuffled reads by P processes x T threads"};
  std::string root, mode = "files", verify, label = "run";
  int processes = 1, threads = 4, epochs = 1, sample = 0;
  uint64_t seed = 1;
  size_t read_size = 1 << 20;
  app.add_option("--root", root, "Dataset directory (a mount or the source)")->required();
  app.add_option("--mode", mode, "files or shards")->check(CLI::IsMember({"files", "shards"}));
  app.add_option("--processes", processes, "Reader processes")->check(CLI::Range(1, 256));
  app.add_option("--threads", threads, "Threads per process")->check(CLI::Range(1, 256));
  app.add_option("--epochs", epochs, "Epochs")->check(CLI::Range(1, 1000));
  app.add_option("--seed", seed, "Shuffle seed; epoch e uses seed + e");
  app.add_option("--read-size", read_size, "Bytes per read() call");
  app.add_option("--verify", verify, "Source directory to compare sampled files against");
  app.add_option("--verify-sample", sample, "Files per epoch to verify (with --verify)");
  app.add_option("--label", label, "Name printed in each result");
  CLI11_PARSE(app, argc, argv);

  std::vector<std::string> files;
  for (auto& e : std::filesystem::recursive_directory_iterator(root)) {
    if (e.is_regular_file()) files.push_back(std::filesystem::relative(e.path(), root).string());
  }
  std::sort(files.begin(), files.end());
  const size_t n = files.size();
  bool all_ok = true;

  for (int epoch = 1; epoch <= epochs; ++epoch) {
    std::vector<uint32_t> order(n);
    for (size_t i = 0; i < n; ++i) order[i] = static_cast<uint32_t>(i);
    std::shuffle(order.begin(), order.end(), std::mt19937_64(seed + static_cast<uint64_t>(epoch)));
    std::vector<uint8_t> sampled(n, 0);
    if (!verify.empty()) {
      std::mt19937_64 rng(seed * 7919 + static_cast<uint64_t>(epoch));
      for (int s = 0; s < sample && n > 0; ++s) sampled[rng() % n] = 1;
    }
    auto* shared = SharedArray<Shared>(1);
    new (shared) Shared{};
    auto* results = SharedArray<FileResult>(n);

    auto work = [&] {
      std::vector<char> buf(read_size);
      for (uint64_t k; (k = shared->next.fetch_add(1)) < n;) {
        uint32_t idx = order[k];
        auto t0 = std::chrono::steady_clock::now();
        int fd = open((root + "/" + files[idx]).c_str(), O_RDONLY);
        if (fd < 0) {
          shared->errors++;
          continue;
        }
        EVP_MD_CTX* ctx = nullptr;
        if (sampled[idx]) {
          ctx = EVP_MD_CTX_new();
          EVP_DigestInit_ex(ctx, EVP_sha256(), nullptr);
        }
        ssize_t r;
        while ((r = read(fd, buf.data(), buf.size())) > 0) {
          shared->bytes += static_cast<uint64_t>(r);
          if (ctx) EVP_DigestUpdate(ctx, buf.data(), static_cast<size_t>(r));
        }
        if (r < 0) shared->errors++;
        close(fd);
        if (ctx) {
          unsigned int len = 0;
          EVP_DigestFinal_ex(ctx, results[idx].sha, &len);
          EVP_MD_CTX_free(ctx);
          results[idx].hashed = 1;
        }
        results[idx].ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
      }
    };
    auto start = std::chrono::steady_clock::now();
    std::vector<pid_t> children;
    for (int p = 0; p < processes; ++p) {
      pid_t pid = fork();
      if (pid == 0) {
        std::vector<std::thread> ts;
        for (int t = 0; t < threads; ++t) ts.emplace_back(work);
        for (auto& t : ts) t.join();
        _exit(0);
      }
      children.push_back(pid);
    }
    for (pid_t c : children) waitpid(c, nullptr, 0);
    double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();

    std::vector<double> lat;
    int verified = 0, mismatches = 0;
    for (size_t i = 0; i < n; ++i) {
      lat.push_back(results[i].ms);
      if (results[i].hashed) {
        unsigned char want[32];
        ++verified;
        if (!HashFile(verify + "/" + files[i], want) || std::memcmp(want, results[i].sha, 32) != 0) {
          ++mismatches;
          std::fprintf(stderr, "MISMATCH %s\n", files[i].c_str());
        }
      }
    }
    std::sort(lat.begin(), lat.end());
    auto pct = [&](double q) { return lat.empty() ? 0.0 : lat[std::min(lat.size() - 1, static_cast<size_t>(q * lat.size()))]; };
    uint64_t bytes = shared->bytes.load();
    uint32_t errors = shared->errors.load();
    std::printf(
        "{\"label\": \"%s\", \"mode\": \"%s\", \"epoch\": %d, \"processes\": %d, \"threads\": %d, \"files\": %zu, "
        "\"bytes\": %llu, \"seconds\": %.3f, \"files_per_s\": %.1f, \"mb_per_s\": %.1f, \"p50_ms\": %.3f, "
        "\"p99_ms\": %.3f, \"errors\": %u, \"verified\": %d, \"mismatches\": %d}\n",
        label.c_str(), mode.c_str(), epoch, processes, threads, n, static_cast<unsigned long long>(bytes), secs,
        n / secs, bytes / secs / 1e6, pct(0.5), pct(0.99), errors, verified, mismatches);
    std::fflush(stdout);
    all_ok = all_ok && errors == 0 && mismatches == 0;
    munmap(shared, sizeof(Shared));
    munmap(results, sizeof(FileResult) * std::max<size_t>(n, 1));
  }
  return all_ok ? 0 : 1;
}
