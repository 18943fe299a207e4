// granary-fuse-floor: the floor of a FUSE request on this kernel, and a probe that measures it.
//
//   granary-fuse-floor serve MOUNTPOINT [--single] [--file-mb N] [--backing FILE]
//       A minimal low-level libfuse server that answers from memory: a root directory holding
//       `small` (4 KiB) and `big` (N MiB, default 64) whose bytes are a pattern computed on the
//       fly. Mounted with default_permissions, as granary-fuse is. No ioctl handler (libfuse
//       answers ENOSYS, as for granary-fuse). Multi-threaded session loop unless --single. Runs
//       until unmounted or SIGTERM; prints "READY" once mounted. With --backing FILE, `big` is
//       that file's size and every READ of it is one pread of FILE: the floor of a FUSE server
//       that reads a local under-storage itself, nothing cached (bench/cold_random.sh --floor).
//
//   granary-fuse-floor probe --file PATH --op OP [--threads T] [--seconds S]
//       T threads each issue one kind of request in a loop for S seconds, each on its own file
//       descriptor, and print one JSON line: ops, ops/s and the latency (mean, p50, p99 in µs)
//       of the round trips. OP is one of:
//         ioctl     TCGETS on the open file (what CPython's open() does through isatty()): FUSE_IOCTL
//         getattr   statx(AT_STATX_FORCE_SYNC): a GETATTR that the kernel's attribute cache cannot answer
//         read4k    a 4 KiB pread at a random aligned offset, O_DIRECT: a READ the page cache cannot answer
//         read128k  the same with 128 KiB
//
// bench/fuse_floor.sh runs both against this server and granary-fuse and prints the ratios.
#define FUSE_USE_VERSION 312
#include <fcntl.h>
#include <fuse3/fuse_lowlevel.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <termios.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

namespace {

constexpr fuse_ino_t kSmall = 2, kBig = 3;
constexpr size_t kSmallSize = 4096;
size_t big_size = 64ull << 20;
// The bytes every read is served from: 1 MiB of a pattern, repeated.
std::vector<char> pattern;
// --backing: `big`'s bytes come from this descriptor (-1: the pattern).
int backing_fd = -1;

size_t SizeOf(fuse_ino_t ino) { return ino == kSmall ? kSmallSize : big_size; }

struct stat Stat(fuse_ino_t ino) {
  struct stat st {};
  st.st_ino = ino;
  if (ino == FUSE_ROOT_ID) {
    st.st_mode = S_IFDIR | 0755;
    st.st_nlink = 2;
  } else {
    st.st_mode = S_IFREG | 0644;
    st.st_nlink = 1;
    st.st_size = static_cast<off_t>(SizeOf(ino));
  }
  return st;
}

void Lookup(fuse_req_t req, fuse_ino_t parent, const char* name) {
  fuse_ino_t ino = 0;
  if (parent == FUSE_ROOT_ID && std::strcmp(name, "small") == 0) ino = kSmall;
  if (parent == FUSE_ROOT_ID && std::strcmp(name, "big") == 0) ino = kBig;
  if (ino == 0) {
    fuse_reply_err(req, ENOENT);
    return;
  }
  fuse_entry_param e{};
  e.ino = ino;
  e.attr = Stat(ino);
  e.attr_timeout = 1.0;
  e.entry_timeout = 1.0;
  fuse_reply_entry(req, &e);
}

void Getattr(fuse_req_t req, fuse_ino_t ino, fuse_file_info*) {
  if (ino != FUSE_ROOT_ID && ino != kSmall && ino != kBig) {
    fuse_reply_err(req, ENOENT);
    return;
  }
  struct stat st = Stat(ino);
  fuse_reply_attr(req, &st, 1.0);
}

void Open(fuse_req_t req, fuse_ino_t ino, fuse_file_info* fi) {
  if (ino != kSmall && ino != kBig) {
    fuse_reply_err(req, EISDIR);
    return;
  }
  fi->keep_cache = 1;
  fuse_reply_open(req, fi);
}

void Read(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off, fuse_file_info*) {
  const size_t len = SizeOf(ino);
  if (static_cast<size_t>(off) >= len) {
    fuse_reply_buf(req, nullptr, 0);
    return;
  }
  size = std::min(size, len - static_cast<size_t>(off));
  if (ino == kBig && backing_fd >= 0) {
    thread_local std::vector<char> buf;
    buf.resize(std::max(buf.size(), size));
    ssize_t n = pread(backing_fd, buf.data(), size, off);
    if (n < 0) {
      fuse_reply_err(req, errno);
      return;
    }
    fuse_reply_buf(req, buf.data(), static_cast<size_t>(n));
    return;
  }
  // A read of at most 1 MiB (the kernel asks for at most max_pages) starting inside the pattern's first copy: one buffer.
  const size_t start = static_cast<size_t>(off) % (pattern.size() / 2);
  fuse_reply_buf(req, pattern.data() + start, size);
}

void Readdir(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off, fuse_file_info*) {
  if (ino != FUSE_ROOT_ID) {
    fuse_reply_err(req, ENOTDIR);
    return;
  }
  std::vector<char> buf(size);
  size_t used = 0;
  const char* names[] = {".", "..", "small", "big"};
  const fuse_ino_t inos[] = {FUSE_ROOT_ID, FUSE_ROOT_ID, kSmall, kBig};
  for (off_t i = off; i < 4; ++i) {
    struct stat st = Stat(inos[i]);
    size_t n = fuse_add_direntry(req, buf.data() + used, size - used, names[i], &st, i + 1);
    if (n > size - used) break;
    used += n;
  }
  fuse_reply_buf(req, buf.data(), used);
}

int Serve(const std::string& mountpoint, bool single) {
  pattern.resize(2 << 20);
  std::mt19937_64 rng(42);
  for (size_t i = 0; i < pattern.size() / 2; i += 8) {
    uint64_t v = rng();
    std::memcpy(pattern.data() + i, &v, 8);
  }
  std::memcpy(pattern.data() + pattern.size() / 2, pattern.data(), pattern.size() / 2);

  fuse_lowlevel_ops ops{};
  ops.lookup = Lookup;
  ops.getattr = Getattr;
  ops.open = Open;
  ops.read = Read;
  ops.readdir = Readdir;
  const char* argv[] = {"granary-fuse-floor", "-o", "default_permissions,fsname=floor"};
  fuse_args args = FUSE_ARGS_INIT(3, const_cast<char**>(argv));
  fuse_session* se = fuse_session_new(&args, &ops, sizeof ops, nullptr);
  if (se == nullptr) return 1;
  if (fuse_set_signal_handlers(se) != 0 || fuse_session_mount(se, mountpoint.c_str()) != 0) {
    fuse_session_destroy(se);
    return 1;
  }
  std::printf("READY\n");
  std::fflush(stdout);
  int rc;
  if (single) {
    rc = fuse_session_loop(se);
  } else {
    fuse_loop_config* cfg = fuse_loop_cfg_create();
    fuse_loop_cfg_set_max_threads(cfg, 16);
    rc = fuse_session_loop_mt(se, cfg);
    fuse_loop_cfg_destroy(cfg);
  }
  fuse_session_unmount(se);
  fuse_remove_signal_handlers(se);
  fuse_session_destroy(se);
  return rc < 0 ? 1 : 0;
}

int Probe(const std::string& file, const std::string& op, int threads, double seconds) {
  const bool read = op == "read4k" || op == "read128k";
  if (!read && op != "ioctl" && op != "getattr") {
    std::fprintf(stderr, "unknown --op %s: one of ioctl, getattr, read4k, read128k\n", op.c_str());
    return 2;
  }
  const size_t size = op == "read128k" ? 131072 : 4096;
  struct stat st {};
  if (stat(file.c_str(), &st) != 0) {
    std::fprintf(stderr, "%s: %s\n", file.c_str(), std::strerror(errno));
    return 1;
  }
  const uint64_t slots = std::max<uint64_t>(1, static_cast<uint64_t>(st.st_size) / size);
  std::vector<std::vector<double>> lat(threads);
  std::atomic<int> errors{0};
  std::atomic<bool> go{false};
  const auto stop_after = std::chrono::duration<double>(seconds);
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&, t] {
      int fd = open(file.c_str(), O_RDONLY | (read ? O_DIRECT : 0));
      if (fd < 0) {
        errors++;
        return;
      }
      void* buf = nullptr;
      if (posix_memalign(&buf, 4096, size) != 0) {
        close(fd);
        errors++;
        return;
      }
      std::mt19937_64 rng(t + 1);
      auto& mine = lat[t];
      mine.reserve(1 << 20);
      while (!go) std::this_thread::yield();
      const auto begin = std::chrono::steady_clock::now();
      for (;;) {
        const auto s = std::chrono::steady_clock::now();
        if (s - begin > stop_after) break;
        if (op == "ioctl") {
          termios tio;
          if (ioctl(fd, TCGETS, &tio) == 0) errors++;  // a regular file is no terminal
        } else if (op == "getattr") {
          struct statx sx;
          if (statx(AT_FDCWD, file.c_str(), AT_STATX_FORCE_SYNC, STATX_BASIC_STATS, &sx) != 0) errors++;
        } else {
          off_t off = static_cast<off_t>((rng() % slots) * size);
          if (pread(fd, buf, size, off) != static_cast<ssize_t>(size)) errors++;
        }
        mine.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - s).count());
      }
      free(buf);
      close(fd);
    });
  }
  const auto t0 = std::chrono::steady_clock::now();
  go = true;
  for (auto& th : pool) th.join();
  const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::vector<double> all;
  for (auto& v : lat) all.insert(all.end(), v.begin(), v.end());
  if (all.empty()) {
    std::fprintf(stderr, "no request completed (%d errors)\n", errors.load());
    return 1;
  }
  std::sort(all.begin(), all.end());
  double sum = 0;
  for (double v : all) sum += v;
  auto pct = [&](double p) { return all[std::min(all.size() - 1, static_cast<size_t>(p * all.size()))]; };
  std::printf("{\"op\": \"%s\", \"threads\": %d, \"ops\": %zu, \"ops_per_s\": %.0f, \"mean_us\": %.2f, "
              "\"p50_us\": %.2f, \"p99_us\": %.2f, \"errors\": %d}\n",
              op.c_str(), threads, all.size(), all.size() / wall, sum / all.size(), pct(0.5), pct(0.99),
              errors.load());
  return errors.load() == 0 ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"The floor of a FUSE request: a minimal server, and a probe of round trips."};
  app.require_subcommand(1);
  std::string mountpoint, file, op;
  bool single = false;
  int threads = 1;
  double seconds = 3;
  size_t file_mb = 64;
  auto* serve = app.add_subcommand("serve", "mount the minimal server");
  serve->add_option("mountpoint", mountpoint)->required();
  serve->add_flag("--single", single, "single-threaded session loop");
  serve->add_option("--file-mb", file_mb, "size of `big` in MiB");
  std::string backing;
  serve->add_option("--backing", backing, "serve `big` by a pread of this file per READ");
  auto* probe = app.add_subcommand("probe", "measure round trips");
  probe->add_option("--file", file)->required();
  probe->add_option("--op", op)->required();
  probe->add_option("--threads", threads)->check(CLI::Range(1, 256));
  probe->add_option("--seconds", seconds)->check(CLI::Range(0.1, 600.0));
  CLI11_PARSE(app, argc, argv);
  if (serve->parsed()) {
    big_size = file_mb << 20;
    if (!backing.empty()) {
      backing_fd = open(backing.c_str(), O_RDONLY | O_CLOEXEC);
      struct stat st {};
      if (backing_fd < 0 || fstat(backing_fd, &st) != 0) {
        std::fprintf(stderr, "--backing %s: %s\n", backing.c_str(), std::strerror(errno));
        return 1;
      }
      big_size = static_cast<size_t>(st.st_size);
    }
    return Serve(mountpoint, single);
  }
  return Probe(file, op, threads, seconds);
}
