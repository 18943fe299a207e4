// UringQueues: FUSE requests through io_uring (fuse.transport: uring; Linux >= 6.14 with the fuse
// module's enable_uring=Y), beside the /dev/fuse loop that libfuse 3.14 runs.
//
// Design
// ------
// When INIT asks for FUSE_OVER_IO_URING (SessionIo patches the reply, fuse/session_io.h), the
// kernel holds every request until each CPU's queue has an entry registered, then queues each
// request on the queue of the CPU its caller runs on. Each entry here is a header buffer (288
// bytes: the request's fuse_in_header, its first argument, the payload length) and a payload
// buffer, registered with FUSE_IO_URING_CMD_REGISTER and served by a thread of its own with an
// io_uring of its own: a request is answered and the next one awaited in one submission
// (FUSE_IO_URING_CMD_COMMIT_AND_FETCH). An entry blocks while its request waits for a worker, so
// each queue has fuse.uring_depth of them. Each thread runs on its queue's CPU (where the callers
// of its requests run), where the process may.
//
// libfuse 3.14 knows nothing of this: a ring thread lays the request out as /dev/fuse would have
// (header, first argument, payload) and hands it to fuse_session_process_buf. The operation replies
// as always, on the same thread; SessionIo's write and splice hooks give the reply to TakeReply /
// TakeSplicedReply, which copy it into the entry (the out header into the header buffer, the rest
// into the payload). A reply that is not this thread's request (a notification, unique 0) goes to
// /dev/fuse as before. FORGET and INTERRUPT always come through /dev/fuse: libfuse's loop stays.
//
// Falling back: a ring is only asked for after a probe showed io_uring works here (Probe). If
// registering fails anyway before every queue has an entry, Start turns io_uring off for the
// connection (a registration the kernel refuses does that) and the kernel serves it through
// /dev/fuse; Start's error says why. Once every queue has one, the ring serves with what
// registered. Once registered, the queues live as long as the connection: Stop ends the threads,
// and the kernel cancels their idle entries. A reply the kernel refuses (its request aborted
// meanwhile) is counted and its entry registered again.
//
// The entries' memory: one memfd (the "ring memory"), mapped at a fixed address (uring_internal.h: kRingBase, or
// one the kernel chose when that is taken), holding a pool of 2 x queues x depth slots. A slot is
// an entry's header buffer, a small state word of ours (SlotState: the generation of the process
// that registered it, whether it holds a request not yet answered or an answer not yet committed,
// and that request's unique) and its payload buffer. The kernel keeps the entries' addresses, and
// a commit names its request by unique and reads the reply from those addresses in the committing
// process, with no check of who registered the entry. So a process that maps the same memfd at the
// same address can answer what another process's entries hold. An answer is marked whole as soon
// as it is written (TakeReply), so only the copy itself leaves a request neither answered nor
// answerable (its successor answers EIO).
//
// The hand-over (fuse/handover.h) carries the ring memory beside the descriptor, and the keeper
// holds a copy:
//   - upgrade: the predecessor parks its entries (Park): each keeps the next request it gets
//     unanswered, and idle entries are given one of our own (a GETATTR of the mount point from a
//     thread on their CPU), so that no entry of it is left idle — an idle entry cannot be
//     withdrawn, and a request the kernel gives it as it is cancelled is never delivered. It then
//     sends its state, taken after parking (no request changes it meanwhile). The successor maps
//     the memory, answers and commits each held request itself (Start with `adopt`: the entry is
//     its own from then on), registers the rest of its entries on free slots, and says
//     RINGS_READY; the predecessor's threads then leave without committing.
//   - crash: the successor gets the memory from the keeper and adopts what the dead process's
//     entries held: a request it had not answered is answered again, an answer it had written and
//     maybe not committed is committed (a commit of an answered request is refused: harmless).
// Slots of the previous generation that held nothing stay untouched (their entries are the
// predecessor's until its ring closes, then cancelled); free slots are those of older
// generations. What is still lost: a request the kernel assigns to an entry in the instant its
// process dies (the kernel then cancels it without writing it to the entry), and requests in a
// queue whose CPU no thread of granary-fuse may run on (it cannot park those entries). A successor
// that cannot map the memory at the same address registers entries of its own and refuses
// RINGS_READY: the predecessor serves on (fuse/mount_handover.cc).
// A successor makes one request on each CPU's queue after starting (GetattrFromEachCpu,
// fuse/mount.cc): requests that came while no entry was registered wait in their queue, and only a
// commit there fetches them.
//
// Thread-safety: Start and Stop from one thread; the hooks are called by ring threads.
#pragma once

#define FUSE_USE_VERSION 312
#include <fuse_lowlevel.h>
#include <sys/uio.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "common/status.h"
#include "common/thread_annotations.h"

struct io_uring;

namespace granary::fuse {

class UringQueues {
 public:
  // The ring memory of a running ring (a predecessor's, to adopt): a memfd mapped at `base`.
  struct Memory {
    int fd = -1;
    uint64_t base = 0;
    uint64_t bytes = 0;
  };

  // Whether io_uring with 128-byte submission entries works in this process (kernel support, not
  // disabled by kernel.io_uring_disabled or a seccomp profile). OK before an INIT asks for a ring.
  static Status Probe();
  // The number of queues the kernel expects: one per possible CPU.
  static int QueueCount();

  // Registers `depth` entries on every queue of the connection `fd` of session `se` (its INIT
  // answered with FUSE_OVER_IO_URING), each with a payload buffer of `payload` bytes (at least the
  // kernel's max_write and max_pages * 4 KiB), and serves them.
  // With `adopt` (a predecessor's ring memory; its fd is taken over either way), the memory is
  // mapped at the same address and what its entries hold is answered first (the design note); when
  // that mapping fails, the queues start on memory of their own and adopted() is false. The depth
  // is then the predecessor's.
  static StatusOr<std::unique_ptr<UringQueues>> Start(fuse_session* se, int fd, size_t payload, int depth,
                                                      const Memory* adopt = nullptr);
  ~UringQueues();  // Stop()
  UringQueues(const UringQueues&) = delete;
  UringQueues& operator=(const UringQueues&) = delete;

  // Ends the threads, each after the request it is serving (a parked one leaves its request for
  // the successor); their idle entries are cancelled.
  void Stop();
  // For a hand-over: every entry keeps the next request it gets unanswered, and entries left idle
  // are given a GETATTR of `mountpoint` from a thread on their CPU. Returns how many entries are
  // parked when all are, or `timeout` passed (threads that cannot run on a CPU leave its entries idle).
  int Park(const std::string& mountpoint, std::chrono::milliseconds timeout) EXCLUDES(park_mu_);
  // A hand-over that failed: the parked entries answer their requests and serve on.
  void Unpark() EXCLUDES(park_mu_);
  // The ring memory, for a successor (Memory::fd stays this object's).
  Memory memory() const { return memory_; }
  // Whether Start's `adopt` memory was mapped (false: the predecessor's held requests are not ours).
  bool adopted() const { return adopted_; }
  // Requests a predecessor's entries held that this process answered (or committed) for it.
  uint64_t adopted_requests() const { return adopted_requests_.load(std::memory_order_relaxed); }
  uint64_t requests() const { return requests_.load(std::memory_order_relaxed); }
  // Replies the kernel refused (their requests aborted meanwhile); each entry registered again.
  uint64_t commit_failures() const { return commit_failures_.load(std::memory_order_relaxed); }
  int entries() const { return static_cast<int>(threads_.size()); }
  // Entries the kernel took (registered or adopted) whose threads still serve.
  int serving() const { return serving_.load(); }
  // `per_cpu` GETATTRs of `mountpoint` from threads on each CPU (each request goes to its CPU's
  // queue), one after the other when `wait`, else left running until answered.
  static void GetattrFromEachCpu(const std::string& mountpoint, int per_cpu, bool wait);

  // The write hooks (fuse/session_io.cc). On a ring thread, a reply to the request it serves is
  // copied into the entry: true, with *n the bytes "written". Otherwise false: write it to /dev/fuse.
  static bool TakeReply(const struct iovec* iov, int count, ssize_t* n);
  // The same for a spliced reply: `len` bytes in the pipe `pipe_fd`, read out of it here.
  static bool TakeSplicedReply(int pipe_fd, int dev_fd, size_t len, ssize_t* n);
  // Whether this thread serves ring requests (so a reply from a file is better copied than spliced).
  static bool OnRingThread();
  // On a ring thread: where a reply's `n` bytes of data may be written in place (the entry's
  // payload), so that fuse_reply_buf of that pointer copies nothing; null elsewhere or when too big.
  static char* ReplyBuffer(size_t n);

 private:
  struct Entry;
  struct Slot;
  UringQueues(fuse_session* se, int fd);
  // Maps `adopt` (or a fresh memfd), and gives every entry its slot and first step.
  Status MapMemory(const Memory* adopt, size_t payload, int depth);
  Slot SlotAt(uint32_t i) const;
  // Pins the calling thread to `cpu`; false where this process may not run there.
  static bool RunOnCpu(int cpu);
  // Points `e` at a free slot (none left: false). Thread-safe.
  bool TakeFreeSlot(Entry* e) EXCLUDES(slots_mu_);
  void Serve(Entry* e, std::atomic<int>* registered, std::atomic<int>* failed);
  // Lays out the request in `e` as /dev/fuse would and hands it to libfuse; the answer ends up in
  // the entry (EIO when the operation did not answer on this thread).
  void Process(Entry* e, std::vector<char>* scratch);
  // Parked: waits while parking, true when Stop came first (leave the request for the successor).
  bool HoldWhileParked() EXCLUDES(park_mu_);
  bool Parking() EXCLUDES(park_mu_);
  // Writes an error answer to e's request into the entry.
  static void FailInEntry(Entry* e, int err);
  // Turns io_uring off on the connection (a registration the kernel refuses does), so that a ring
  // that never became ready does not hold every request.
  void DisableOnConnection();

  fuse_session* const se_;
  const int fd_;
  std::vector<std::unique_ptr<Entry>> entries_;
  std::vector<std::thread> threads_;
  std::atomic<bool> stopping_{false};
  std::atomic<uint64_t> requests_{0};
  std::atomic<uint64_t> commit_failures_{0};
  std::atomic<uint64_t> adopted_requests_{0};
  std::atomic<int> serving_{0};  // threads whose entry the kernel took
  Memory memory_;          // the mapped ring memory (fd owned, unmapped at destruction)
  bool adopted_ = false;
  uint64_t generation_ = 1;  // this process's, in every slot it registers
  uint64_t previous_generation_ = 0;  // the predecessor's
  int depth_ = 0;
  Mutex slots_mu_;
  std::vector<uint32_t> free_slots_ GUARDED_BY(slots_mu_);
  Mutex park_mu_;
  std::condition_variable park_cv_;
  bool parking_ GUARDED_BY(park_mu_) = false;
  int parked_ GUARDED_BY(park_mu_) = 0;
};

// Every io_uring ring of granary-fuse is set up (2 entries, `flags`; io_uring_queue_init's result)
// and torn down through these. Under ThreadSanitizer they tell it what it cannot see: liburing maps
// ring memory with raw system calls, and the kernel orders one ring's unmap before a later ring's
// map at the same address (uring.cc).
int InitRing(io_uring* ring, unsigned flags);
void ExitRing(io_uring* ring);

}  // namespace granary::fuse
