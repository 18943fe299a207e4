// Parts of the FUSE kernel protocol that Debian 12's headers (Linux 6.1 UAPI, libfuse 3.14) do not
// name yet. Each value is the kernel's own, from include/uapi/linux/fuse.h of Linux 6.9 (protocol
// 7.40), where FUSE passthrough was merged, and of Linux 6.14 (7.42, FUSE over io_uring); the
// kernel this runs on decides whether it offers them.
#pragma once

#include <linux/fuse.h>
#include <sys/ioctl.h>

#include <cstdint>

namespace granary::fuse::kabi {

// INIT flag (bit 37: flags2 bit 5, with FUSE_INIT_EXT): the connection may open files in
// passthrough mode. The daemon must also set max_stack_depth (see below) in its INIT reply.
constexpr uint64_t kInitPassthrough = 1ULL << 37;
// Open reply flag: reads, mmap and splice of this open go straight to the backing file named by
// fuse_open_out.backing_id (the field libfuse 3.14 calls `padding`).
constexpr uint32_t kOpenPassthrough = 1u << 7;
// fuse_init_out.max_stack_depth is the first word of what the 7.38 header calls unused[7]: how many
// stacked filesystems may lie below (1: a backing file on ext4, xfs or tmpfs).
constexpr uint32_t kMaxStackDepth = 1;

// Notification (fuse_out_header.error with unique 0): move every request read and not answered
// back to the queue, to be read again (their unique gets bit 63, FUSE_UNIQUE_RESEND). Linux >= 6.9.
constexpr int32_t kNotifyResend = 7;

// FUSE_DEV_IOC_BACKING_OPEN / _CLOSE on the /dev/fuse descriptor: register an open file as a
// backing file (returns its id, > 0) and drop the registration. Both need CAP_SYS_ADMIN in the
// initial user namespace.
struct BackingMap {
  int32_t fd;
  uint32_t flags;  // 0
  uint64_t padding;
};
constexpr unsigned long kIocBackingOpen = _IOW(229, 1, BackingMap);
constexpr unsigned long kIocBackingClose = _IOW(229, 2, uint32_t);

// ---- FUSE over io_uring (Linux >= 6.14, protocol 7.42; fs/fuse/dev_uring.c) ----
// INIT flag (bit 41: flags2 bit 9): the server will take requests through io_uring. The kernel
// offers it only while the fuse module's enable_uring parameter is Y.
constexpr uint64_t kInitOverIoUring = 1ULL << 41;
// IORING_OP_URING_CMD commands on the /dev/fuse descriptor.
constexpr uint32_t kUringCmdRegister = 1;        // an entry (header + payload buffers) joins queue qid
constexpr uint32_t kUringCmdCommitAndFetch = 2;  // the reply in the entry is committed; wait for the next
constexpr size_t kUringInOutHeader = 128;
constexpr size_t kUringOpInOut = 128;
struct UringEntInOut {
  uint64_t flags;
  uint64_t commit_id;  // the request's unique: what the commit names
  uint32_t payload_sz;
  uint32_t padding;
  uint64_t reserved;
};
// An entry's header buffer: the request's fuse_in_header (then the reply's fuse_out_header) in
// in_out, the request's first argument in op_in, the payload's length in ring_ent_in_out. The other
// arguments (and the reply's) are in the entry's payload buffer.
struct UringReqHeader {
  char in_out[kUringInOutHeader];
  char op_in[kUringOpInOut];
  UringEntInOut ring_ent_in_out;
};
// In the SQE's command area (an SQE128 ring).
struct UringCmdReq {
  uint64_t flags;
  uint64_t commit_id;
  uint16_t qid;
  uint8_t padding[6];
};
static_assert(sizeof(UringReqHeader) == 288, "the kernel's struct fuse_uring_req_header");
static_assert(sizeof(UringCmdReq) == 24, "the kernel's struct fuse_uring_cmd_req");

}  // namespace granary::fuse::kabi
