#include "worker/block_buffers.h"

#include <algorithm>
#include <sys/mman.h>

#include <cstdlib>
#include <new>
#include <unordered_map>
#include <vector>

#include "common/thread_annotations.h"

namespace granary::worker::block_buffers {
namespace {

// The bytes a buffer of `n` really takes: whole 4 KiB pages, or whole huge pages from kHugePage up.
// Buffers are pooled by it, so a shorter last block of a file reuses a whole block's buffer.
size_t Allocated(size_t n) {
  const size_t page = n >= kHugePage ? kHugePage : 4096;
  return (std::max<size_t>(n, 1) + page - 1) / page * page;
}

struct Pool {
  Mutex mu;
  std::unordered_map<size_t, std::vector<char*>> free GUARDED_BY(mu);
  size_t kept GUARDED_BY(mu) = 0;
};

Pool& ThePool() {
  static Pool* pool = new Pool;  // never destroyed: buffers may be let go while the process exits
  return *pool;
}

}  // namespace

char* Take(size_t capacity) {
  const size_t cap = Allocated(capacity);
  if (cap >= kMinPooled) {
    Pool& p = ThePool();
    MutexLock lock(&p.mu);
    auto it = p.free.find(cap);
    if (it != p.free.end() && !it->second.empty()) {
      char* b = it->second.back();
      it->second.pop_back();
      p.kept -= cap;
      return b;
    }
  }
  const bool huge = cap >= kHugePage;
  char* b = static_cast<char*>(std::aligned_alloc(huge ? kHugePage : 4096, cap));
  if (b == nullptr) throw std::bad_alloc();
  // Whole huge pages: a 4 MiB block's bytes then cost their first copy 2 page faults, not 1024. A
  // hint: where the kernel allows no THP the buffer works with small pages.
  if (huge) (void)madvise(b, cap, MADV_HUGEPAGE);
  return b;
}

void Give(char* b, size_t capacity) {
  if (b == nullptr) return;
  const size_t cap = Allocated(capacity);
  if (cap >= kMinPooled) {
    Pool& p = ThePool();
    MutexLock lock(&p.mu);
    if (p.kept + cap <= kKeepBytes) {
      p.free[cap].push_back(b);
      p.kept += cap;
      return;
    }
  }
  std::free(b);
}

size_t Kept() {
  Pool& p = ThePool();
  MutexLock lock(&p.mu);
  return p.kept;
}

void Clear() {
  Pool& p = ThePool();
  MutexLock lock(&p.mu);
  for (auto& [cap, list] : p.free) {
    for (char* b : list) std::free(b);
  }
  p.free.clear();
  p.kept = 0;
}

}  // namespace granary::worker::block_buffers
