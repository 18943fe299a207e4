// UringQueues, the ring memory: its slots, and mapping it afresh or a predecessor's (fuse/uring.h).
#include "fuse/uring.h"

#include <fcntl.h>
#include <liburing.h>
#include <linux/fuse.h>
#include <sched.h>
#include <spdlog/spdlog.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <fstream>
#include <string>

#include "fuse/kernel_abi.h"
#include "fuse/session_io.h"
#include "fuse/uring_cmd.h"
#include "fuse/uring_internal.h"

#ifdef GRANARY_TSAN_BUILD
#include <sanitizer/tsan_interface.h>
#endif

namespace granary::fuse {

using namespace uring_detail;  // NOLINT: this class's own layout

UringQueues::Slot UringQueues::SlotAt(uint32_t i) const {
  const auto* pool = reinterpret_cast<const PoolHeader*>(memory_.base);
  char* at = reinterpret_cast<char*>(memory_.base) + kPage + static_cast<size_t>(i) * pool->slot_bytes;
  Slot s;
  s.header = reinterpret_cast<kabi::UringReqHeader*>(at);
  s.state = reinterpret_cast<SlotState*>(at + kStateOffset);
  s.payload = at + kPayloadOffset;
  return s;
}

bool UringQueues::TakeFreeSlot(Entry* e) {
  uint32_t i = 0;
  {
    MutexLock lock(&slots_mu_);
    if (free_slots_.empty()) return false;
    i = free_slots_.back();
    free_slots_.pop_back();
  }
  e->SetSlot(i, SlotAt(i), reinterpret_cast<const PoolHeader*>(memory_.base)->payload);
  return true;
}

Status UringQueues::MapMemory(const Memory* adopt, size_t payload, int depth) {
  const uint32_t queues = static_cast<uint32_t>(QueueCount());
  if (adopt != nullptr && adopt->fd >= 0) {
    // At the predecessor's address, or not at all: the kernel knows its entries by those addresses.
    void* at = mmap(reinterpret_cast<void*>(adopt->base), adopt->bytes, PROT_READ | PROT_WRITE,
                    MAP_SHARED | MAP_FIXED_NOREPLACE, adopt->fd, 0);
    std::string why;
    if (at == MAP_FAILED) {
      why = std::string("mmap: ") + std::strerror(errno);
    } else if (reinterpret_cast<uint64_t>(at) != adopt->base) {
      why = "the kernel mapped it elsewhere";
    } else {
      const auto* h = static_cast<const PoolHeader*>(at);
      if (adopt->bytes < kPage || h->magic != kMagic || h->queues != queues || h->depth == 0 || h->slots == 0 ||
          kPage + static_cast<uint64_t>(h->slots) * h->slot_bytes != adopt->bytes || h->payload < payload ||
          h->slot_bytes < kPayloadOffset + h->payload) {
        why = "its layout is not this granary-fuse's";
      }
    }
    if (why.empty()) {
      memory_ = *adopt;
      adopted_ = true;
    } else {
      if (at != MAP_FAILED) munmap(at, adopt->bytes);
      close(adopt->fd);
      spdlog::warn("fuse.transport=uring: cannot map the predecessor's io_uring entries at {:#x} ({}); requests "
                   "they hold are not answered by this process",
                   adopt->base, why);
    }
  }
  if (!adopted_) {
    const uint64_t payload_bytes = (payload + kPage - 1) / kPage * kPage;
    const uint64_t slot_bytes = kPayloadOffset + payload_bytes;
    const uint32_t slots = 2 * queues * static_cast<uint32_t>(depth);
    const uint64_t bytes = kPage + slots * slot_bytes;
    int mfd = memfd_create("granary-fuse-ring", MFD_CLOEXEC);
    if (mfd < 0) return ErrnoError(errno, "memfd_create for the io_uring entries");
    if (ftruncate(mfd, static_cast<off_t>(bytes)) != 0) {
      int err = errno;
      close(mfd);
      return ErrnoError(err, "sizing the io_uring entries' memory");
    }
    void* at = MAP_FAILED;
    for (int t = 0; at == MAP_FAILED && t < kRingTries; ++t) {
      const uint64_t base = kRingBase - t * kRingStep;
      at = mmap(reinterpret_cast<void*>(base), bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED_NOREPLACE, mfd, 0);
      if (at != MAP_FAILED && reinterpret_cast<uint64_t>(at) != base) {
        munmap(at, bytes);
        at = MAP_FAILED;
      }
    }
    if (at == MAP_FAILED) at = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, mfd, 0);
    if (at == MAP_FAILED) {
      int err = errno;
      close(mfd);
      return ErrnoError(err, "mapping the io_uring entries' memory");
    }
    auto* h = static_cast<PoolHeader*>(at);
    h->magic = kMagic;
    h->slots = slots;
    h->queues = queues;
    h->slot_bytes = slot_bytes;
    h->payload = payload_bytes;
    h->generation = 0;
    h->depth = static_cast<uint32_t>(depth);
    memory_ = {mfd, reinterpret_cast<uint64_t>(at), bytes};
  }
  auto* pool = reinterpret_cast<PoolHeader*>(memory_.base);
  const uint64_t previous = pool->generation;
  generation_ = previous + 1;
  depth_ = static_cast<int>(pool->depth);
  if (adopted_ && depth_ != depth) {
    spdlog::info("fuse.transport=uring: keeping the predecessor's {} io_uring entries per queue (fuse.uring_depth {})",
                 depth_, depth);
  }
  // Slots that hold a request or its answer are adopted by an entry of their queue, whatever their
  // generation (an older one's, when a successor died before adopting them: its owner is dead, so
  // its entry is the kernel's to give): a commit of a request answered already is refused, harmless.
  // The predecessor's other slots are left alone (its idle entries live until its ring closes). The
  // rest of the pool is free.
  std::vector<int> per_queue(queues, 0);
  std::vector<bool> taken(pool->slots, false);
  for (uint32_t i = 0; adopted_ && i < pool->slots; ++i) {
    Slot sl = SlotAt(i);
    const bool predecessors = Load(&sl.state->generation) == previous;
    const uint64_t id = Load(&sl.header->ring_ent_in_out.commit_id);
    const uint64_t qid = Load(&sl.state->qid);
    const uint64_t step = Load(&sl.state->step);
    taken[i] = predecessors;
    // A request written since the slot's last step (its thread had not seen it) counts as held.
    if (id == 0 || qid >= queues || (!predecessors && step == kRegistered && Load(&sl.state->unique) == id)) continue;
    if (!predecessors && step == kFree) continue;
    taken[i] = true;
    auto e = std::make_unique<Entry>();
    e->SetSlot(i, sl, pool->payload);
    e->qid = static_cast<uint16_t>(qid);
    const bool same = Load(&sl.state->unique) == id;
    e->first = step == kReplied && same ? Entry::kCommit : step == kReplying && same ? Entry::kFail : Entry::kProcess;
    per_queue[qid]++;
    entries_.push_back(std::move(e));
  }
  {
    MutexLock lock(&slots_mu_);
    for (uint32_t i = pool->slots; i-- > 0;) {
      if (!taken[i]) free_slots_.push_back(i);
    }
  }
  for (uint32_t qid = 0; qid < queues; ++qid) {  // an entry whose adoption is refused takes a free slot then
    for (; per_queue[qid] < depth_; per_queue[qid]++) {
      auto e = std::make_unique<Entry>();
      e->qid = static_cast<uint16_t>(qid);
      if (!TakeFreeSlot(e.get())) return InternalError("the io_uring entries' memory has no free slot");
      entries_.push_back(std::move(e));
    }
  }
  previous_generation_ = previous;
  return Status::OK();
}

}  // namespace granary::fuse
