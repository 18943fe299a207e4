// UringQueues, the hand-over's parking: entries held while a successor takes over, and the one
// request per CPU that fetches what waited on a queue (fuse/uring.h).
#include "fuse/uring.h"

#include <fcntl.h>
#include <liburing.h>
#include <linux/fuse.h>
#include <sched.h>
#include <spdlog/spdlog.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <fstream>
#include <string>

#include "fuse/kernel_abi.h"
#include "fuse/session_io.h"
#include "fuse/uring_cmd.h"
#include "fuse/uring_internal.h"

#ifdef GRANARY_TSAN_BUILD
#include <sanitizer/tsan_interface.h>
#endif

namespace granary::fuse {

using namespace uring_detail;  // NOLINT: this class's own layout

bool UringQueues::RunOnCpu(int cpu) {
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  return sched_setaffinity(0, sizeof set, &set) == 0;
}

void UringQueues::GetattrFromEachCpu(const std::string& mountpoint, int per_cpu, bool wait) {
  std::vector<std::thread> threads;
  for (int cpu = 0; cpu < QueueCount(); ++cpu) {
    for (int i = 0; i < per_cpu; ++i) {
      std::thread t([cpu, mountpoint] {
        if (!RunOnCpu(cpu)) return;  // offline, or not ours to run on: its queue gets none
        struct statx st {};
        statx(AT_FDCWD, mountpoint.c_str(), AT_STATX_FORCE_SYNC, STATX_BASIC_STATS, &st);
      });
      if (wait) {
        t.join();
      } else {
        t.detach();
      }
    }
  }
}

int UringQueues::Park(const std::string& mountpoint, std::chrono::milliseconds timeout) {
  {
    MutexLock lock(&park_mu_);
    parking_ = true;
  }
  // An idle entry gets a request of our own: one GETATTR per entry from a thread on each CPU (a
  // request goes to its caller's CPU's queue). Each waits until someone answers it: the successor
  // after adopting, or this process if the hand-over fails (Unpark).
  GetattrFromEachCpu(mountpoint, depth_, /*wait=*/false);
  MutexLock lock(&park_mu_);
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (parked_ < serving_.load() && lock.WaitUntil(&park_cv_, deadline)) {
  }
  return parked_;
}

void UringQueues::Unpark() {
  {
    MutexLock lock(&park_mu_);
    parking_ = false;
  }
  park_cv_.notify_all();
}

bool UringQueues::HoldWhileParked() {
  MutexLock lock(&park_mu_);
  if (!parking_) return false;
  ++parked_;
  park_cv_.notify_all();
  while (parking_ && !stopping_) lock.Wait(&park_cv_);
  --parked_;
  return stopping_;
}

bool UringQueues::Parking() {
  MutexLock lock(&park_mu_);
  return parking_;
}

}  // namespace granary::fuse
