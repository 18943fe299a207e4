// Block buffers: large ones come back for reuse (their pages stay mapped), within a budget; small
// ones go back to the allocator.
#include "worker/block_buffers.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
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

}  // namespace
}  // namespace granary::worker::block_buffers
