// SessionIo: granary-fuse's own reads and writes of /dev/fuse (libfuse's fuse_custom_io hooks),
// which is how FUSE passthrough works with Debian 12's libfuse 3.14, a library that predates it.
//
// Design
// ------
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

#include <atomic>
#include <memory>

#include "common/status.h"

namespace granary::fuse {

class SessionIo {
 public:
  // Takes over the I/O of a mounted session. With `want_passthrough`, the INIT reply asks for
  // passthrough when the kernel offers it.
  static StatusOr<std::unique_ptr<SessionIo>> Install(fuse_session* se, bool want_passthrough);
  ~SessionIo();

  // Whether the INIT reply asks for passthrough (when offered). Set before INIT is answered (the
  // init handler runs between the two hooks).
  void SetWantPassthrough(bool want) { want_ = want; }
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
  const int fd_;
  std::atomic<bool> want_;
  std::atomic<bool> offered_{false};
  std::atomic<bool> negotiated_{false};
};

}  // namespace granary::fuse
