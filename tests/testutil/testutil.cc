#include "tests/testutil/testutil.h"

#include <fcntl.h>
#include <openssl/evp.h>
#include <signal.h>
#include <spawn.h>
#include <sys/mount.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <stdexcept>
#include <thread>

extern char** environ;

namespace granary::testing {

namespace fs = std::filesystem;

TempDir::TempDir() : TempDir([] {
  const char* base = std::getenv("TMPDIR");
  return std::string(base && *base ? base : "/tmp");
}()) {}

TempDir::TempDir(const std::string& base) {
  std::string tmpl = base + "/granary-test-XXXXXX";
  std::vector<char> buf(tmpl.begin(), tmpl.end());
  buf.push_back('\0');
  if (mkdtemp(buf.data()) == nullptr) throw std::runtime_error("mkdtemp failed");
  path_ = buf.data();
}

TempDir::~TempDir() {
  // A mount being torn down (EBUSY) or a process still writing its last log line can make one
  // pass fail part-way: try again until the directory is gone, within a deadline.
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  for (;;) {
    UnmountAllBelow(path_);
    std::error_code ec;
    fs::remove_all(path_, ec);
    if (!fs::exists(path_, ec) || std::chrono::steady_clock::now() > deadline) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
}

bool WaitFor(const std::function<bool()>& pred, std::chrono::milliseconds timeout) {
  auto deadline = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    if (pred()) return true;
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

namespace {

std::vector<std::string> MakeEnv(const std::map<std::string, std::string>& extra) {
  std::map<std::string, std::string> env;
  for (char** e = environ; *e; ++e) {
    std::string kv = *e;
    size_t eq = kv.find('=');
    if (eq != std::string::npos) env[kv.substr(0, eq)] = kv.substr(eq + 1);
  }
  for (const auto& [k, v] : extra) env[k] = v;
  std::vector<std::string> out;
  for (const auto& [k, v] : env) out.push_back(k + "=" + v);
  return out;
}

pid_t Spawn(const std::vector<std::string>& argv, const std::string& log, const std::map<std::string, std::string>& env) {
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_addopen(&fa, 1, log.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0600);
  posix_spawn_file_actions_adddup2(&fa, 1, 2);
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  // Children start with default signal handling and an empty mask.
  sigset_t none, all;
  sigemptyset(&none);
  sigfillset(&all);
  posix_spawnattr_setsigmask(&attr, &none);
  posix_spawnattr_setsigdefault(&attr, &all);
  posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF);
  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  std::vector<std::string> envs = MakeEnv(env);
  std::vector<char*> envp;
  for (auto& e : envs) envp.push_back(e.data());
  envp.push_back(nullptr);
  pid_t pid = -1;
  int rc = posix_spawnp(&pid, args[0], &fa, &attr, args.data(), envp.data());
  posix_spawn_file_actions_destroy(&fa);
  posix_spawnattr_destroy(&attr);
  if (rc != 0) throw std::runtime_error("cannot start " + argv[0]);
  return pid;
}

}  // namespace

Process::Process(const std::vector<std::string>& argv, const std::string& log,
                 const std::map<std::string, std::string>& env)
    : log_(log) {
  pid_ = Spawn(argv, log, env);
}

Process::~Process() {
  if (Running()) Stop(SIGKILL, std::chrono::seconds(10));
}

bool Process::Running() {
  if (exited_ || pid_ <= 0) return false;
  int st = 0;
  pid_t r = waitpid(pid_, &st, WNOHANG);
  if (r == pid_) {
    exited_ = true;
    status_ = st;
    return false;
  }
  return r == 0;
}

int Process::Wait(std::chrono::milliseconds timeout) {
  if (!WaitFor([&] { return !Running(); }, timeout)) return -1;
  return WIFEXITED(status_) ? WEXITSTATUS(status_) : -1;
}

int Process::Stop(int sig, std::chrono::milliseconds timeout) {
  if (Running()) kill(pid_, sig);
  int code = Wait(timeout);
  if (Running()) {
    kill(pid_, SIGKILL);
    Wait(std::chrono::seconds(10));
    return -1;
  }
  return code;
}

std::string Process::Log() const { return ReadFile(log_); }

std::string Process::LogTail(size_t lines) const {
  std::string log = ReadFile(log_);
  size_t pos = log.size();
  if (pos > 0 && log[pos - 1] == '\n') --pos;
  for (size_t n = 0; n < lines && pos > 0; ++n) {
    size_t nl = log.rfind('\n', pos - 1);
    pos = nl == std::string::npos ? 0 : nl;
  }
  return "--- " + log_ + " (last " + std::to_string(lines) + " lines)\n" + log.substr(pos);
}

RunResult RunCommand(const std::vector<std::string>& argv, const std::map<std::string, std::string>& env,
              std::chrono::milliseconds timeout) {
  char tmpl[] = "/tmp/granary-run-XXXXXX";
  int fd = mkstemp(tmpl);
  close(fd);
  RunResult r;
  {
    Process p(argv, tmpl, env);
    r.code = p.Wait(timeout);
  }
  r.out = ReadFile(tmpl);
  unlink(tmpl);
  return r;
}

std::string Bin(const std::string& name) {
  const char* dir = std::getenv("GRANARY_BIN_DIR");
  return std::string(dir ? dir : ".") + "/" + name;
}

std::string WaitForReadyFile(const std::string& path, Process* p) {
  std::string addr;
  WaitFor([&] {
    addr = ReadFile(path);
    return !addr.empty() || !p->Running();
  });
  while (!addr.empty() && addr.back() == '\n') addr.pop_back();
  return addr;
}

std::string SourceDir() {
  const char* dir = std::getenv("GRANARY_SOURCE_DIR");
  return dir ? dir : ".";
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

bool ReadFileChecked(const std::string& path, std::string* out) {
  out->clear();
  int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  char buf[65536];
  for (;;) {
    ssize_t n = read(fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      close(fd);
      return false;
    }
    if (n == 0) break;
    out->append(buf, static_cast<size_t>(n));
  }
  close(fd);
  return true;
}

void WriteFile(const std::string& path, const std::string& data) {
  fs::create_directories(fs::path(path).parent_path());
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(data.data(), static_cast<std::streamsize>(data.size()));
}

std::string Sha256File(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return "<unreadable>";
  EVP_MD_CTX* ctx = EVP_MD_CTX_new();
  EVP_DigestInit_ex(ctx, EVP_sha256(), nullptr);
  char buf[1 << 16];
  while (in) {
    in.read(buf, sizeof buf);
    EVP_DigestUpdate(ctx, buf, static_cast<size_t>(in.gcount()));
  }
  if (in.bad()) {
    EVP_MD_CTX_free(ctx);
    return "<read error>";
  }
  unsigned char md[32];
  unsigned int len = 0;
  EVP_DigestFinal_ex(ctx, md, &len);
  EVP_MD_CTX_free(ctx);
  static const char kHex[] = "0123456789abcdef";
  std::string s;
  for (unsigned i = 0; i < len; ++i) {
    s += kHex[md[i] >> 4];
    s += kHex[md[i] & 15];
  }
  return s;
}

std::string RandomBytes(size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::string s(n, '\0');
  for (size_t i = 0; i < n; i += 8) {
    uint64_t v = rng();
    for (size_t j = 0; j < 8 && i + j < n; ++j) s[i + j] = static_cast<char>(v >> (8 * j));
  }
  return s;
}

char DamageOnDisk(const std::string& path, uint64_t offset, unsigned char mask) {
  int fd = open(path.c_str(), O_RDWR | O_CLOEXEC);
  if (fd < 0) throw std::runtime_error("DamageOnDisk: open " + path + ": " + strerror(errno));
  char c = 0;
  bool ok = pread(fd, &c, 1, static_cast<off_t>(offset)) == 1;
  char bad = static_cast<char>(c ^ mask);
  ok = ok && pwrite(fd, &bad, 1, static_cast<off_t>(offset)) == 1 && fdatasync(fd) == 0;
  close(fd);
  if (!ok) throw std::runtime_error("DamageOnDisk: " + path + " at " + std::to_string(offset) + " failed");
  return c;
}

namespace {
std::vector<std::string> MountsBelow(const std::string& dir) {
  std::vector<std::string> out;
  std::ifstream in("/proc/self/mounts");
  std::string dev, mp, rest;
  while (in >> dev >> mp) {
    std::getline(in, rest);
    // /proc/mounts escapes spaces as \040; test paths have none.
    if (mp == dir || mp.rfind(dir + "/", 0) == 0) out.push_back(mp);
  }
  return out;
}
}  // namespace

bool IsMounted(const std::string& mountpoint) {
  std::error_code ec;
  std::string real = fs::weakly_canonical(mountpoint, ec).string();
  if (ec) real = mountpoint;
  for (const auto& m : MountsBelow(real)) {
    if (m == real) return true;
  }
  return false;
}

void UnmountAllBelow(const std::string& dir) {
  for (const auto& m : MountsBelow(dir)) {
    if (umount2(m.c_str(), MNT_DETACH) != 0) RunCommand({"fusermount3", "-u", "-z", "-q", m});
  }
}

}  // namespace granary::testing
