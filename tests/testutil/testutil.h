// Test helpers shared by every Granary test: temporary directories, child processes that are
// always stopped, polling with a deadline (never a bare sleep), file hashing, and mount clean-up.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <functional>
#include <map>
#include <string>
#include <vector>

namespace granary::testing {

// A fresh directory under $TMPDIR, removed (after unmounting anything below it) on destruction.
// True in a build under a sanitizer (scripts/sanitize.sh): memory figures (RSS) are then the
// sanitizer's (shadow memory, quarantine, redzones), so tests do not check bounds on them.
// (GRANARY_SANITIZER_BUILD comes from CMakeLists.txt: a TSan build hides __SANITIZE_THREAD__ from
// the headers, so they agree with Debian's uninstrumented libraries.)
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__) || defined(GRANARY_SANITIZER_BUILD)
inline constexpr bool kSanitizerBuild = true;
#else
inline constexpr bool kSanitizerBuild = false;
#endif

class TempDir {
 public:
  TempDir();
  // A temporary directory under `base` (e.g. /dev/shm for a MEM cache level).
  explicit TempDir(const std::string& base);
  ~TempDir();
  const std::string& path() const { return path_; }
  std::string operator/(const std::string& rel) const { return path_ + "/" + rel; }

 private:
  std::string path_;
};

// Polls `pred` every few milliseconds until it is true or `timeout` passes.
bool WaitFor(const std::function<bool()>& pred, std::chrono::milliseconds timeout = std::chrono::seconds(30));

// A child process whose stdout and stderr go to `log`. The destructor kills it (SIGKILL) if it is
// still running.
class Process {
 public:
  Process(const std::vector<std::string>& argv, const std::string& log,
          const std::map<std::string, std::string>& env = {});
  ~Process();
  Process(const Process&) = delete;
  Process& operator=(const Process&) = delete;

  pid_t pid() const { return pid_; }
  bool Running();
  // Sends `sig` and waits (up to `timeout`) for the exit; returns the exit code, or -1 when it had
  // to be killed or died from a signal.
  int Stop(int sig, std::chrono::milliseconds timeout = std::chrono::seconds(20));
  // Waits for it to exit by itself; returns the exit code (-1 on timeout or signal).
  int Wait(std::chrono::milliseconds timeout = std::chrono::seconds(60));
  std::string Log() const;
  // The last `lines` lines of the log (for a failure message).
  std::string LogTail(size_t lines = 40) const;

 private:
  pid_t pid_ = -1;
  int status_ = 0;
  bool exited_ = false;
  std::string log_;
};

// The address a daemon wrote to its --ready-file `path` ("" when `p` exited first or 30 s passed).
// Remove the file before starting the process.
std::string WaitForReadyFile(const std::string& path, Process* p);

struct RunResult {
  int code = -1;
  std::string out;  // stdout and stderr together
};
// Runs a command to completion (at most `timeout`).
RunResult RunCommand(const std::vector<std::string>& argv, const std::map<std::string, std::string>& env = {},
              std::chrono::milliseconds timeout = std::chrono::seconds(60));

// Path of a built binary (granary, granary-master, ...), from $GRANARY_BIN_DIR.
std::string Bin(const std::string& name);
std::string SourceDir();

std::string ReadFile(const std::string& path);
// Reads a whole file with open/read; false on any error (ReadFile hides errors).
bool ReadFileChecked(const std::string& path, std::string* out);
void WriteFile(const std::string& path, const std::string& data);
std::string Sha256File(const std::string& path);
std::string RandomBytes(size_t n, uint64_t seed);
// Damages a file as a failing disk does: the byte at `offset` XOR `mask`, written and flushed to
// the disk, so the page cache holds it in a clean page, as if read back from the medium (a page
// still dirty from the worker's own write is trusted: worker/store/block_file.h, FileAsWritten).
// Returns the byte that was there.
char DamageOnDisk(const std::string& path, uint64_t offset, unsigned char mask = 0x01);

bool IsMounted(const std::string& mountpoint);
// Unmounts (lazily) every mount at or below `dir`.
void UnmountAllBelow(const std::string& dir);

}  // namespace granary::testing
