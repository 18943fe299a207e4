// Block buffers: large ones come back for reuse (their pages stay mapped), within a budget; small
// ones go back to the allocator.
#include "worker/block_buffers.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

namespace granary::worker::block_buffers {
namespace {

TEST(BlockBuffers, ALargeBufferLetGoIsTheNextOneTakenOfItsSize) {
  Clear();  // the pool is the process's: other tests' fetches left buffers in it
  const size_t kept = Kept();
  ASSERT_EQ(kept, 0u);
  char* a = Take(4 << 20);
  ASSERT_NE(a, nullptr);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(a) % 4096, 0u);
  std::memset(a, 1, 4 << 20);  // every byte is ours
  Give(a, 4 << 20);
  EXPECT_EQ(Kept(), kept + (4 << 20));
  EXPECT_EQ(Take((4 << 20) - 100), a) << "the same rounded size reuses it";
  EXPECT_EQ(Kept(), kept);
  char* other = Take(2 << 20);  // another size: fresh memory
  EXPECT_NE(other, a);
  Give(other, 2 << 20);
  Give(a, 4 << 20);
}

TEST(BlockBuffers, SmallBuffersAreNotKeptAndTheBudgetHolds) {
  Clear();
  const size_t kept = Kept();
  char* small = Take(110000);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(small) % 4096, 0u);
  Give(small, 110000);
  EXPECT_EQ(Kept(), kept) << "below kMinPooled: back to the allocator";
  std::vector<char*> many;
  for (size_t i = 0; i < kKeepBytes / (4 << 20) + 4; ++i) many.push_back(Take(4 << 20));
  for (char* b : many) Give(b, 4 << 20);
  EXPECT_LE(Kept(), kKeepBytes) << "more than the budget is freed, not kept";
  EXPECT_GE(Kept(), kKeepBytes - (4 << 20));
}

// The kernel's THP mode, the bracketed word of /sys/kernel/mm/transparent_hugepage/enabled ("" if
// the kernel has none).
std::string ThpMode() {
  std::ifstream f("/sys/kernel/mm/transparent_hugepage/enabled");
  std::string line;
  std::getline(f, line);
  auto a = line.find('['), b = line.find(']');
  return a == std::string::npos || b == std::string::npos ? "" : line.substr(a + 1, b - a - 1);
}

// The VmFlags of the mapping holding `p` (/proc/self/smaps), "" when none holds it.
std::string VmFlagsOf(const void* p) {
  std::ifstream f("/proc/self/smaps");
  std::string line;
  bool inside = false;
  const auto at = reinterpret_cast<uintptr_t>(p);
  while (std::getline(f, line)) {
    unsigned long lo = 0, hi = 0;
    if (std::sscanf(line.c_str(), "%lx-%lx ", &lo, &hi) == 2 && line.find(':') > line.find(' ')) {
      inside = at >= lo && at < hi;
    } else if (inside && line.rfind("VmFlags:", 0) == 0) {
      return line.substr(8) + " ";
    }
  }
  return "";
}

// Asked, not granted: whether the kernel backs the buffer with huge pages depends on its THP mode
// and on free contiguous memory, so the test checks what the worker asks for (the mapping's "hg"
// flag, which madvise(MADV_HUGEPAGE) sets on exactly the range given) and the alignment that lets
// whole huge pages back it.
TEST(BlockBuffers, ALargeBufferAsksForHugePages) {
  Clear();
  char* b = Take(4 << 20);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(b) % kHugePage, 0u) << "whole huge pages need their alignment";
  if (!ThpMode().empty()) {
    EXPECT_NE(VmFlagsOf(b).find(" hg "), std::string::npos) << "flags:" << VmFlagsOf(b);
    EXPECT_NE(VmFlagsOf(b + (4 << 20) - 1).find(" hg "), std::string::npos) << "its last byte too";
  }
  Give(b, 4 << 20);
  EXPECT_EQ(Take(3 << 20), b) << "a file's shorter last block reuses a whole block's huge pages";
  Give(b, 3 << 20);
  EXPECT_EQ(Kept(), size_t{4} << 20) << "counted as the memory it takes";
}

}  // namespace
}  // namespace granary::worker::block_buffers
