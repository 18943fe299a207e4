#include "common/shutdown.h"

#include <pthread.h>
#include <signal.h>

#include <condition_variable>
#include <cstring>
#include <mutex>
#include <thread>

namespace granary {
namespace {

std::mutex g_mu;
std::condition_variable g_cv;
bool g_requested = false;
std::string g_reason;

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
  std::lock_guard<std::mutex> lock(g_mu);
  if (!g_requested) {
    g_requested = true;
    g_reason = reason;
  }
  g_cv.notify_all();
}

bool Shutdown::Requested() {
  std::lock_guard<std::mutex> lock(g_mu);
  return g_requested;
}

std::string Shutdown::Wait() {
  std::unique_lock<std::mutex> lock(g_mu);
  g_cv.wait(lock, [] { return g_requested; });
  return g_reason;
}

bool Shutdown::WaitFor(std::chrono::milliseconds d) {
  std::unique_lock<std::mutex> lock(g_mu);
  return g_cv.wait_for(lock, d, [] { return g_requested; });
}

}  // namespace granary
