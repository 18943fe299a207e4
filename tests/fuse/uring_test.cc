// The io_uring rings of granary-fuse (fuse/uring.h): set up and torn down through InitRing and
// ExitRing, one thread's ring may take the address another thread's ring had. Under
// ThreadSanitizer (scripts/sanitize.sh tsan) this is where a false race was reported: liburing maps
// and unmaps ring memory with raw system calls TSan does not see.
#include "fuse/uring.h"

#include <gtest/gtest.h>
#include <liburing.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <thread>

#include "fuse/kernel_abi.h"
#include "fuse/uring_cmd.h"

namespace granary::fuse {
namespace {

// One SQE128 ring's life on a thread: set up, a command written into its submission slot (never
// submitted: fd -1), torn down. Returns the slot's address (null: no io_uring here).
void* OneRing(int* err) {
  io_uring ring;
  const int rc = InitRing(&ring, IORING_SETUP_SQE128);
  if (rc < 0) {
    *err = -rc;
    return nullptr;
  }
  void* slot = ring.sq.sqes;
  iovec iov[2] = {};
  PrepFuseUringCmd(&ring, -1, nullptr, iov, kabi::kUringCmdRegister, 0, 0);
  ExitRing(&ring);
  return slot;
}

// The second thread starts its ring only once the first thread's is gone, and the two threads share
// nothing ThreadSanitizer counts as an order (a relaxed flag): only the kernel orders the unmap
// before the map. Without ExitRing's and InitRing's word to TSan, a TSan build reports the second
// thread's writes into the reused slot as a race with the first's, and sanitize.sh fails.
TEST(UringRings, ARingAtAnAddressAnotherThreadsRingHadIsNoRace) {
  std::atomic<bool> first_gone{false};
  int err1 = 0, err2 = 0;
  void* first = nullptr;
  void* second = nullptr;
  std::thread a([&] {
    first = OneRing(&err1);
    first_gone.store(true, std::memory_order_relaxed);
  });
  std::thread b([&] {
    while (!first_gone.load(std::memory_order_relaxed)) std::this_thread::yield();
    second = OneRing(&err2);
  });
  a.join();
  b.join();
  if (first == nullptr && (err1 == ENOSYS || err1 == EPERM || err1 == EINVAL)) {
    GTEST_SKIP() << "no io_uring with 128-byte entries here: " << std::strerror(err1);
  }
  ASSERT_NE(first, nullptr) << std::strerror(err1);
  ASSERT_NE(second, nullptr) << std::strerror(err2);
  // The case this is about (the kernel reuses the address; it usually does): say when it did not.
  if (first != second) std::printf("note: the second ring did not take the first's address\n");
}

}  // namespace
}  // namespace granary::fuse
