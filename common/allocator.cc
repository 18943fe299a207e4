#include "common/allocator.h"

#include <malloc.h>

#include <cstdlib>
#include <cstring>

namespace granary {

bool TuneAllocator() {
  const char* tunables = std::getenv("GLIBC_TUNABLES");
  if (tunables != nullptr && std::strstr(tunables, "glibc.malloc.") != nullptr) return false;
  // Setting either threshold turns glibc's dynamic adjustment off; both are set together.
  bool ok = mallopt(M_MMAP_THRESHOLD, static_cast<int>(kMmapThreshold)) == 1;
  ok = mallopt(M_TRIM_THRESHOLD, static_cast<int>(kTrimThreshold)) == 1 && ok;
  return ok;
}

}  // namespace granary
