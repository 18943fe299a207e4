#include "common/bad_request.h"

#include <spdlog/spdlog.h>

#include <atomic>
#include <map>
#include <string>

#include "common/thread_annotations.h"

namespace granary {
namespace {

std::atomic<uint64_t> g_bad{0};

struct Place {
  std::chrono::steady_clock::time_point last{};
  uint64_t unlogged = 0;
};

}  // namespace

void NoteBadRequest(const char* where, const Status& why) {
  g_bad++;
  static Mutex mu;
  static std::map<std::string, Place>* places = new std::map<std::string, Place>();  // never freed: used at exit
  auto now = std::chrono::steady_clock::now();
  uint64_t unlogged = 0;
  {
    MutexLock lock(&mu);
    Place& p = (*places)[where];
    if (p.last != std::chrono::steady_clock::time_point{} && now - p.last < kBadRequestLogEvery) {
      p.unlogged++;
      return;
    }
    p.last = now;
    unlogged = p.unlogged;
    p.unlogged = 0;
  }
  if (unlogged > 0) {
    spdlog::warn("refused a bad request on the {}: {} ({} more refused there in the last {} s, not logged)", where,
                 why.message(), unlogged, kBadRequestLogEvery.count());
  } else {
    spdlog::warn("refused a bad request on the {}: {}", where, why.message());
  }
}

uint64_t BadRequests() { return g_bad.load(); }

}  // namespace granary
