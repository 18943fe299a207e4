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
// each queue has fuse.uring_depth of them.
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
// The hand-over (fuse/handover.h) carries the ring: the successor registers its own entries (the
// kernel queues to the ring from INIT on, whatever the successor's fuse.transport says), tells the
// predecessor (RINGS_READY), and the predecessor's threads then commit their last reply and leave.
// Linux 6.18 leaves two gaps, and the hand-over one of its own, which is why fuse.transport
// defaults to dev and upgrades over io_uring belong between epochs:
//   - an entry cannot be withdrawn, only cancelled with its ring, and a request the kernel assigns
//     to it in the microseconds before the cancel is never delivered: an upgrade under load can
//     leave one caller waiting until the mount is aborted;
//   - a request in an entry of a granary-fuse that dies is not sent again (FUSE_NOTIFY_RESEND
//     covers /dev/fuse only), so a crash leaves the callers of the requests it held waiting;
//   - between the predecessor's snapshot and RINGS_READY its ring threads still serve, on its own
//     state: an open or a release there is not in the successor's (a handle the successor then
//     serves by its inode; a passthrough backing id it does not know of).
// If the successor cannot register, it says so and the predecessor keeps serving the ring (and does
// not exit) until stopped.
// The first two can be closed, as bench/fuse_uring_adopt.sh shows (5 of 5 runs): entries in a
// memfd (the keeper holds a copy) that a successor maps at the same address and adopts by answering
// the request each holds and committing it itself: a commit names the request by its unique, and
// the kernel reads the reply from the entry's addresses in the committing task's memory, checking
// no owner. Not built into granary-fuse yet; the third closes with it (the predecessor parks its
// entries instead of serving on, and the successor adopts them). A successor does already make one request on each CPU's queue after
// registering (KickUringQueues, fuse/mount.cc): requests that came while no entry was registered
// wait in their queue, and only a commit there fetches them.
//
// Thread-safety: Start and Stop from one thread; the hooks are called by ring threads.
#pragma once

#define FUSE_USE_VERSION 312
#include <fuse_lowlevel.h>
#include <sys/uio.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <thread>
#include <vector>

#include "common/status.h"

namespace granary::fuse {

class UringQueues {
 public:
  // Whether io_uring with 128-byte submission entries works in this process (kernel support, not
  // disabled by kernel.io_uring_disabled or a seccomp profile). OK before an INIT asks for a ring.
  static Status Probe();
  // The number of queues the kernel expects: one per possible CPU.
  static int QueueCount();

  // Registers `depth` entries on every queue of the connection `fd` of session `se` (its INIT
  // answered with FUSE_OVER_IO_URING), each with a payload buffer of `payload` bytes (at least the
  // kernel's max_write and max_pages * 4 KiB), and serves them.
  static StatusOr<std::unique_ptr<UringQueues>> Start(fuse_session* se, int fd, size_t payload, int depth);
  ~UringQueues();  // Stop()
  UringQueues(const UringQueues&) = delete;
  UringQueues& operator=(const UringQueues&) = delete;

  // Ends the threads, each after the request it is serving; their idle entries are cancelled.
  void Stop();
  uint64_t requests() const { return requests_.load(std::memory_order_relaxed); }
  // Replies the kernel refused (their requests aborted meanwhile); each entry registered again.
  uint64_t commit_failures() const { return commit_failures_.load(std::memory_order_relaxed); }
  int entries() const { return static_cast<int>(threads_.size()); }

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
  UringQueues(fuse_session* se, int fd);
  void Serve(Entry* e, std::atomic<int>* registered, std::atomic<int>* failed);
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
};

}  // namespace granary::fuse
