// granary-access-read: the access patterns of bench/warm_read.sh, one per run, against any tree
// (a Granary mount or the same files on local disk), so both sides run the same code.
//
//   --pattern files   every file under --root read whole (open, read, close) in a shuffled order by
//                     --threads threads, --epochs times (ImageFolder-style loaders, compiled);
//   --pattern seq     --file read sequentially in --read-size pieces (1 MiB), one thread;
//   --pattern pread   --ops random --read-size preads (4 KiB) in --file by --threads threads;
//   --pattern mmap    --file mapped once; --ops random --read-size windows (2 KiB) copied out by
//                     --threads threads (numpy.memmap token windows, LMDB pages).
// With --verify DIR, every byte read is compared with the same file under DIR (files, seq) or
// the same range of DIR's file (pread, mmap). Prints one JSON line: ops, bytes, seconds, ops/s,
// MB/s, errors, mismatches. Exit status 1 on any error or mismatch.
#include <fcntl.h>
#include <sys/mman.h>
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

struct Result {
  std::atomic<uint64_t> ops{0}, bytes{0}, errors{0}, mismatches{0};
};

std::string Slurp(const std::string& path) {
  std::string out;
  int fd = open(path.c_str(), O_RDONLY);
  if (fd < 0) return out;
  char buf[1 << 16];
  ssize_t n;
  while ((n = read(fd, buf, sizeof buf)) > 0) out.append(buf, static_cast<size_t>(n));
  close(fd);
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Granary access-pattern reader (bench/warm_read.sh)"};
  std::string pattern = "files", root, file, verify, label;
  int threads = 8, epochs = 1;
  uint64_t ops = 20000, read_size = 0, seed = 1;
  app.add_option("--pattern", pattern, "files, seq, pread or mmap")->check(CLI::IsMember({"files", "seq", "pread", "mmap"}));
  app.add_option("--root", root, "tree of files (files)");
  app.add_option("--file", file, "one large file (seq, pread, mmap)");
  app.add_option("--threads", threads);
  app.add_option("--epochs", epochs, "files: passes over the tree (all are counted)");
  app.add_option("--ops", ops, "pread, mmap: random reads in all");
  app.add_option("--read-size", read_size, "bytes per read (files, seq: 1 MiB; pread: 4 KiB; mmap: 2 KiB)");
  app.add_option("--seed", seed);
  app.add_option("--verify", verify, "the same files elsewhere, to compare every byte with");
  app.add_option("--label", label);
  CLI11_PARSE(app, argc, argv);
  if (read_size == 0) read_size = pattern == "pread" ? 4096 : pattern == "mmap" ? 2048 : 1 << 20;
  if ((pattern == "files") == root.empty() || (pattern != "files") == file.empty()) {
    std::fprintf(stderr, "error: --pattern files needs --root; seq, pread and mmap need --file\n");
    return 2;
  }

  Result r;
  std::string ref;  // the reference copy of --file, for --verify
  if (!verify.empty() && pattern != "files") ref = Slurp(verify);
  double seconds = 0;

  if (pattern == "files") {
    std::vector<std::string> files;
    for (const auto& e : std::filesystem::recursive_directory_iterator(root)) {
      if (e.is_regular_file()) files.push_back(std::filesystem::relative(e.path(), root).string());
    }
    std::sort(files.begin(), files.end());
    for (int epoch = 0; epoch < epochs; ++epoch) {
      std::vector<std::string> order = files;
      std::shuffle(order.begin(), order.end(), std::mt19937_64(seed + static_cast<uint64_t>(epoch)));
      std::atomic<size_t> next{0};
      auto start = std::chrono::steady_clock::now();
      std::vector<std::thread> ts;
      for (int t = 0; t < threads; ++t) {
        ts.emplace_back([&] {
          std::vector<char> buf(read_size);
          for (size_t i; (i = next++) < order.size();) {
            std::string path = root + "/" + order[i], got;
            int fd = open(path.c_str(), O_RDONLY);
            if (fd < 0) {
              r.errors++;
              continue;
            }
            ssize_t n;
            uint64_t total = 0;
            while ((n = read(fd, buf.data(), buf.size())) > 0) {
              total += static_cast<uint64_t>(n);
              if (!verify.empty()) got.append(buf.data(), static_cast<size_t>(n));
            }
            if (n < 0) r.errors++;
            close(fd);
            if (!verify.empty() && got != Slurp(verify + "/" + order[i])) r.mismatches++;
            r.ops++;
            r.bytes += total;
          }
        });
      }
      for (auto& t : ts) t.join();
      seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    }
  } else {
    int fd = open(file.c_str(), O_RDONLY);
    if (fd < 0) {
      std::perror(file.c_str());
      return 1;
    }
    uint64_t size = static_cast<uint64_t>(lseek(fd, 0, SEEK_END));
    if (size < read_size) {
      std::fprintf(stderr, "error: %s is smaller than one read\n", file.c_str());
      return 1;
    }
    const char* map = nullptr;
    if (pattern == "mmap") {
      void* m = mmap(nullptr, size, PROT_READ, MAP_SHARED, fd, 0);
      if (m == MAP_FAILED) {
        std::perror("mmap");
        return 1;
      }
      map = static_cast<const char*>(m);
    }
    auto start = std::chrono::steady_clock::now();
    if (pattern == "seq") {
      std::vector<char> buf(read_size);
      uint64_t off = 0;
      ssize_t n;
      while ((n = pread(fd, buf.data(), buf.size(), static_cast<off_t>(off))) > 0) {
        if (!ref.empty() && std::memcmp(buf.data(), ref.data() + off, static_cast<size_t>(n)) != 0) r.mismatches++;
        off += static_cast<uint64_t>(n);
        r.ops++;
      }
      if (n < 0 || off != size) r.errors++;
      r.bytes = off;
    } else {
      std::vector<std::thread> ts;
      for (int t = 0; t < threads; ++t) {
        ts.emplace_back([&, t] {
          std::mt19937_64 rng(seed * 1000 + static_cast<uint64_t>(t));
          std::vector<char> buf(read_size);
          uint64_t mine = ops / static_cast<uint64_t>(threads);
          for (uint64_t i = 0; i < mine; ++i) {
            uint64_t off = rng() % (size - read_size + 1);
            if (map != nullptr) {
              std::memcpy(buf.data(), map + off, read_size);
            } else if (pread(fd, buf.data(), read_size, static_cast<off_t>(off)) != static_cast<ssize_t>(read_size)) {
              r.errors++;
              continue;
            }
            if (!ref.empty() && std::memcmp(buf.data(), ref.data() + off, read_size) != 0) r.mismatches++;
            r.ops++;
            r.bytes += read_size;
          }
        });
      }
      for (auto& t : ts) t.join();
    }
    seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (map != nullptr) munmap(const_cast<char*>(map), size);
    close(fd);
  }
  std::printf(
      "{\"label\":\"%s\",\"pattern\":\"%s\",\"ops\":%llu,\"bytes\":%llu,\"seconds\":%.4f,\"ops_per_s\":%.1f,"
      "\"mb_per_s\":%.1f,\"errors\":%llu,\"mismatches\":%llu}\n",
      label.c_str(), pattern.c_str(), static_cast<unsigned long long>(r.ops.load()),
      static_cast<unsigned long long>(r.bytes.load()), seconds, seconds > 0 ? static_cast<double>(r.ops) / seconds : 0,
      seconds > 0 ? static_cast<double>(r.bytes) / seconds / 1e6 : 0, static_cast<unsigned long long>(r.errors.load()),
      static_cast<unsigned long long>(r.mismatches.load()));
  return r.errors == 0 && r.mismatches == 0 ? 0 : 1;
}
