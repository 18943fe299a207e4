// PrepFuseUringCmd: one FUSE-over-io_uring command (fuse/kernel_abi.h) in the next submission slot
// of an SQE128 ring, for granary-fuse's queues (fuse/uring.h) and the bench's minimal servers
// (bench/fuse_uring_floor.cc, bench/fuse_uring_adopt.cc). Header-only: the benches link no module.
#pragma once

#include <liburing.h>
#include <sys/uio.h>

#include <cstdint>
#include <cstring>

#include "fuse/kernel_abi.h"

namespace granary::fuse {

// `op` is kabi::kUringCmdRegister (with `iov`: the entry's header and payload buffers) or
// kabi::kUringCmdCommitAndFetch (with `commit_id`: the unique of the request answered). The ring
// must have a free slot (each caller keeps at most one command in flight per entry).
inline void PrepFuseUringCmd(io_uring* ring, int fuse_fd, void* user_data, const iovec* iov, uint32_t op,
                             uint16_t qid, uint64_t commit_id) {
  io_uring_sqe* sqe = io_uring_get_sqe(ring);
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Warray-bounds"
#ifndef __clang__  // gcc's alone
#pragma GCC diagnostic ignored "-Wstringop-overflow"
#endif
  std::memset(sqe, 0, 128);  // an SQE128 slot: the struct's 64 bytes and the command area after them
#pragma GCC diagnostic pop
  sqe->opcode = IORING_OP_URING_CMD;
  sqe->fd = fuse_fd;
  sqe->cmd_op = op;
  if (op == kabi::kUringCmdRegister) {
    sqe->addr = reinterpret_cast<uint64_t>(iov);
    sqe->len = 2;
  }
  sqe->user_data = reinterpret_cast<uint64_t>(user_data);
  auto* req = reinterpret_cast<kabi::UringCmdReq*>(sqe->cmd);
  req->qid = qid;
  req->commit_id = commit_id;
}

}  // namespace granary::fuse
