// What the files of UringQueues share (fuse/uring*.cc): the ring memory's layout, an entry, and
// the ring helpers. Internal to fuse/; the design is in fuse/uring.h.
#pragma once

#include <liburing.h>
#include <sys/uio.h>

#include <cstddef>
#include <cstdint>

#include "fuse/kernel_abi.h"
#include "fuse/uring.h"

namespace granary::fuse {

namespace uring_detail {

// The ring memory's first page, then the slots (fuse/uring.h).
inline constexpr uint64_t kMagic = 0x31474e4952524e47ULL;  // "GNRRING1"
inline constexpr size_t kPage = 4096;
inline constexpr size_t kStateOffset = 512;   // a slot's SlotState, after the kernel's 288-byte header
inline constexpr size_t kPayloadOffset = kPage;
// Where a fresh ring memory is mapped when it can be (an address a process rarely uses), then
// kRingBase - kRingStep and so on, kRingTries addresses in all; else where the kernel chooses.
#ifdef GRANARY_TSAN_BUILD
// ThreadSanitizer keeps its shadow below 0x7e80'0000'0000 (gcc 12's layout) and kills a process
// that maps there; its application range above that holds the libraries at its top end.
inline constexpr uint64_t kRingBase = 0x7ee000000000ULL;
inline constexpr uint64_t kRingStep = 1ULL << 37;
#else
inline constexpr uint64_t kRingBase = 0x6f0000000000ULL;
inline constexpr uint64_t kRingStep = 1ULL << 40;
#endif
inline constexpr int kRingTries = 4;

struct PoolHeader {
  uint64_t magic;
  uint32_t slots;
  uint32_t queues;
  uint64_t slot_bytes;
  uint64_t payload;     // each slot's payload buffer
  uint64_t generation;  // of the process serving the ring now
  uint32_t depth;       // entries per queue
};

// What a slot's entry is doing, as its thread last wrote it (read by a successor).
enum SlotStep : uint64_t {
  kFree = 0,        // no entry here (or one of an older generation, cancelled)
  kRegistered = 1,  // registered or committed: the kernel may write a request here at any time
  kHeld = 2,        // holds request `unique`, not answered
  kReplied = 3,     // holds the answer to `unique`; its commit may or may not have been made
  kReplying = 4,    // the answer to `unique` is being written over the request (a copy's time): neither is whole
};

struct SlotState {
  uint64_t generation;
  uint64_t step;
  uint64_t unique;
  uint64_t qid;
};

inline uint64_t Load(const uint64_t* p) { return __atomic_load_n(p, __ATOMIC_ACQUIRE); }
inline void Store(uint64_t* p, uint64_t v) { __atomic_store_n(p, v, __ATOMIC_RELEASE); }


}  // namespace uring_detail

struct UringQueues::Slot {
  kabi::UringReqHeader* header = nullptr;
  uring_detail::SlotState* state = nullptr;
  char* payload = nullptr;
};

struct UringQueues::Entry {
  uint32_t slot = 0;
  kabi::UringReqHeader* header = nullptr;  // in the ring memory (fuse/uring.h)
  uring_detail::SlotState* state = nullptr;
  char* payload = nullptr;
  size_t payload_size = 0;
  uint16_t qid = 0;
  iovec iov[2];
  uint64_t unique = 0;   // the request being served
  bool replied = false;  // its reply is in the entry
  // Its first step: register, or (adopting a predecessor's entry) answer what it holds, or commit
  // the answer it holds.
  enum First { kRegister, kProcess, kCommit, kFail } first = kRegister;

  void SetSlot(uint32_t i, const Slot& s, size_t payload_bytes) {
    slot = i;
    header = s.header;
    state = s.state;
    payload = s.payload;
    payload_size = payload_bytes;
    iov[0] = {header, sizeof *header};
    iov[1] = {payload, payload_bytes};
  }
};

// The entry this thread serves (null: not a ring thread).
extern thread_local void* t_entry;

// io_uring_queue_init / exit, told to ThreadSanitizer (uring.cc).
int InitRing(io_uring* ring, unsigned flags);
void ExitRing(io_uring* ring);

}  // namespace granary::fuse
