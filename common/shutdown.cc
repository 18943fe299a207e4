#include "common/shutdown.h"

#include <pthread.h>
#include <signal.h>

#include <condition_variable>
#include <cstring>
#include <thread>

#include "common/thread_annotations.h"

namespace granary {
namespace {

Mutex g_mu;
std::condition_variable g_cv;
bool g_requested GUARDED_BY(g_mu) = false;
std::string g_reason GUARDED_BY(g_mu);

}  // namespace

void Shutdown::InstallSignalHandling() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  signal(SIGPIPE, SIG_IGN);
  std::thread([set] {
    for (;;) {
      int sig = 0;
      if (sigwait(&set, &sig) == 0) Request(std::string("signal ") + strsignal(sig));
    }
  }).detach();
}

void Shutdown::Request(const std::string& reason) {
  MutexLock lock(&g_mu);
  if (!g_requested) {
    g_requested = true;
    g_reason = reason;
  }
  g_cv.notify_all();
}

bool Shutdown::Requested() {
  MutexLock lock(&g_mu);
  return g_requested;
}

std::string Shutdown::Wait() {
  MutexLock lock(&g_mu);
  while (!g_requested) lock.Wait(&g_cv);
  return g_reason;
}

bool Shutdown::WaitFor(std::chrono::milliseconds d) {
  MutexLock lock(&g_mu);
  const auto until = std::chrono::steady_clock::now() + d;
  while (!g_requested && lock.WaitUntil(&g_cv, until)) {
  }
  return g_requested;
}

}  // namespace granary
