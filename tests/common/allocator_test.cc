#include "common/allocator.h"

#include <gtest/gtest.h>
#include <malloc.h>

#include <cstdlib>
#include <memory>

namespace granary {
namespace {

// Once tuned, a block-sized buffer comes from the heap (no mmap of fresh pages for each), and an
// operator's own malloc tunables are left alone.
TEST(Allocator, BlockBuffersComeFromTheHeapAndTunablesWin) {
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__) || defined(GRANARY_SANITIZER_BUILD)  // testutil's kSanitizerBuild
  GTEST_SKIP() << "built with a sanitizer (scripts/sanitize.sh): its allocator replaces glibc's malloc, whose "
                  "thresholds this test checks";
#endif
  setenv("GLIBC_TUNABLES", "glibc.malloc.arena_max=2", 1);
  EXPECT_FALSE(TuneAllocator());
  unsetenv("GLIBC_TUNABLES");
  ASSERT_TRUE(TuneAllocator());
  const size_t mapped_before = mallinfo2().hblks;
  auto a = std::make_unique<char[]>(4u << 20);
  EXPECT_EQ(mallinfo2().hblks, mapped_before) << "a 4 MiB buffer was mmapped";
  a.reset();
  auto b = std::make_unique<char[]>(4u << 20);
  EXPECT_EQ(mallinfo2().hblks, mapped_before);
}

}  // namespace
}  // namespace granary
