// SessionIo: granary-fuse's own reads and writes of /dev/fuse (libfuse's fuse_custom_io hooks),
// which is how FUSE passthrough and the hand-over of a live connection (fuse/handover.h) work with
// Debian 12's libfuse 3.14, a library that predates both.
//
// Design
// ------
// Hand-over needs three things libfuse 3.14 cannot do:
//   - keep the kernel's INIT request (init_request()), which a successor needs: the kernel sends
//     INIT once per connection, and a libfuse session answers every other request with an error
//     until it has seen one. A successor's read hook returns the saved INIT first (ReplayInit) and
//     its write hook swallows the reply; other threads' reads wait until that reply is "written",
//     so nothing reaches libfuse before it has processed INIT;
//   - stop reading without losing a request (Drain): the descriptor is non-blocking and the read
//     hook polls it beside an eventfd. Drain sets `stopping`, wakes the pollers, and waits until no
//     thread is inside read(2) and every request read has come back to the hook or its thread
//     has ended (its reply is written: every operation answers before it returns; libfuse ends
//     surplus idle threads after they answer, and a thread's exit returns its request). Then it ends libfuse's loop, whose
//     threads are parked in the hook and never read again. libfuse's own fuse_session_exit would
//     drop a request a thread had just read;
//   - ask the kernel to re-send requests a dead predecessor had read and not answered
//     (NotifyResend: FUSE_NOTIFY_RESEND, Linux >= 6.9).
// Passthrough needs three things libfuse 3.14 cannot say: the FUSE_PASSTHROUGH flag and a
// max_stack_depth in the INIT reply, and FOPEN_PASSTHROUGH with a backing id in an open reply. Both
// replies are written by libfuse from the thread that read the request, so:
//   - the read hook notes, per thread, the opcode and unique id of the request just read, and
//     whether the kernel offered passthrough in its INIT;
//   - the write hook patches the INIT reply (when passthrough is wanted and offered), and patches
//     an open reply when the open handler, on the same thread, has just called MarkOpenReply();
//   - the splice hook is plain splice(2), so replies from leased block files are still spliced.
// A backing id is registered with FUSE_DEV_IOC_BACKING_OPEN (kernel_abi.h) and dropped with
// CloseBacking once no open file uses it; the kernel keeps its own reference for each open file.
//
// Thread-safety: Install once per session before its loop runs; the rest is thread-safe.
#pragma once

#define FUSE_USE_VERSION 312
#include <fuse_lowlevel.h>
#include <linux/fuse.h>

#include <atomic>
#include <condition_variable>
#include <functional>
#include <memory>
#include <string>

#include "common/status.h"
#include "common/thread_annotations.h"

namespace granary::fuse {

class SessionIo {
 public:
  // Takes over the I/O of a session on `fd` (a fresh mount's, or one handed over). With
  // `want_passthrough`, the INIT reply asks for passthrough when the kernel offers it. With a
  // non-empty `replay_init` (a handed-over connection), that INIT request is the first thing read
  // and its reply is not written: the kernel had it long ago.
  static StatusOr<std::unique_ptr<SessionIo>> Install(fuse_session* se, int fd, bool want_passthrough,
                                                     std::string replay_init = "");
  ~SessionIo();

  // The kernel's INIT request as read on this connection ("" until its reply is written: only then
  // is what the connection negotiated known).
  std::string init_request() const;
  // Stops reading, waits until every request read has been answered, and ends the session's loop
  // (fuse_session_loop_mt returns). Reading never resumes unless Resume() is called.
  void Drain(fuse_session* se);
  // After a Drain whose hand-over failed: reads again (call fuse_session_reset and loop anew).
  void Resume();
  // Asks the kernel to send again the requests read and not answered on this connection.
  // UNIMPLEMENTED on kernels before 6.9.
  Status NotifyResend();
  // A handed-over connection: whether the predecessor negotiated passthrough.
  void SetNegotiated(bool v) { negotiated_ = v; }
  int fd() const { return fd_; }

  // Whether the INIT reply asks for passthrough (when offered). Set before INIT is answered (the
  // init handler runs between the two hooks).
  void SetWantPassthrough(bool want) { want_ = want; }
  // fuse.transport uring: the INIT reply asks for FUSE_OVER_IO_URING when the kernel offers it, and
  // once that reply is written, `start` is called with the payload size an entry needs (the
  // caller starts UringQueues; fuse/uring.h). Set before the loop starts.
  void WantUring(std::function<void(size_t payload)> start) { uring_start_ = std::move(start); }
  // After INIT: whether the kernel offered io_uring, and the payload size when this connection
  // uses it (0: it does not). A successor is told by its predecessor (SetUring).
  bool uring_offered() const { return uring_offered_.load(); }
  size_t uring_payload() const { return uring_payload_.load(); }
  void SetUring(size_t payload) { uring_payload_ = payload; }
  // A handed-over connection: waits until libfuse has processed the replayed INIT (it answers EIO to
  // anything before), at most `timeout`; whether it has.
  bool WaitInitReplayed(std::chrono::milliseconds timeout);
  // A fresh connection: waits until its INIT has been answered (init_request() is known), at most
  // `timeout`; whether it has.
  bool WaitInitAnswered(std::chrono::milliseconds timeout);
  // A ring thread's request (fuse/uring.h): noted as the read hook notes what it reads.
  static void NoteRequest(const fuse_in_header* h);
  // After INIT: whether the kernel offered passthrough, and whether this connection has it.
  bool offered() const { return offered_.load(); }
  bool negotiated() const { return negotiated_.load(); }

  // Registers `fd` as a backing file: its id (> 0). PERMISSION_DENIED without CAP_SYS_ADMIN;
  // FAILED_PRECONDITION when the connection has no passthrough.
  StatusOr<int> OpenBacking(int fd);
  void CloseBacking(int id);

  // The next open reply written by this thread names `backing_id` (0: a plain open).
  static void MarkOpenReply(int backing_id);

  // The hooks (libfuse calls them; public for the C callback table).
  static ssize_t Read(int fd, void* buf, size_t len, void* userdata);
  static ssize_t Writev(int fd, struct iovec* iov, int count, void* userdata);
  static ssize_t SpliceSend(int fdin, off_t* offin, int fdout, off_t* offout, size_t len, unsigned flags,
                            void* userdata);

 private:
  SessionIo(int fd, bool want) : fd_(fd), want_(want) {}
  static uint64_t NextGeneration();
  ssize_t DoRead(void* buf, size_t len);
  // Waits (at most a second) until a request may be readable or Drain wakes the readers.
  void WaitReadable();
  struct Holding;
  static thread_local Holding t_holding;
  void NoteInit(const void* buf, size_t n);

  const int fd_;
  const uint64_t generation_ = NextGeneration();  // tells this session's thread epolls from others'
  fuse_session* se_ = nullptr;
  int wake_fd_ = -1;  // eventfd: readable once Drain starts
  std::atomic<bool> want_;
  std::atomic<bool> offered_{false};
  std::function<void(size_t)> uring_start_;  // set before the loop: fuse.transport uring
  std::atomic<bool> uring_offered_{false};
  std::atomic<size_t> uring_payload_{0};
  std::atomic<bool> negotiated_{false};

  mutable Mutex mu_;
  std::condition_variable cv_;
  std::string init_ GUARDED_BY(mu_);               // the INIT request read (or replayed)
  bool init_answered_ GUARDED_BY(mu_) = false;     // its reply written (or swallowed)
  std::string replay_ GUARDED_BY(mu_);             // to be returned by the first read
  uint64_t replay_unique_ GUARDED_BY(mu_) = 0;     // its unique, whose reply is swallowed
  bool init_pending_ GUARDED_BY(mu_) = false;      // replayed INIT not yet answered
  std::atomic<bool> stopping_{false};
  bool released_ GUARDED_BY(mu_) = false;          // parked readers may leave
  std::atomic<int> in_read_{0};          // threads inside read(2)
  std::atomic<int> busy_{0};             // requests read and not yet back in the hook
};

}  // namespace granary::fuse
