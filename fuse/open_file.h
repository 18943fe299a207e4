// OpenFile: one file as granary-fuse reads it — an open (daemon and passthrough modes: fi->fh), or
// a file read by inode (kernel mode, fuse/kernel_reads.h) — with its info (the version it reads)
// and the per-reader state of the read path (readahead hints, read leases; fuse/ops_read.cc).
#pragma once

#include <chrono>
#include <cstdint>

#include "common/thread_annotations.h"
#include "proto/granary.pb.h"

namespace granary::fuse {

struct OpenFile {
  rpc::FileInfo info;
  bool passthrough = false;    // opened on a backing file: the kernel reads it, not us
  bool counted_cached = false; // counted in InodeOpens::cached (passthrough mode's bookkeeping); PassthroughOpens::mu
  // Readahead state: where the next sequential read would start, and the last block hinted.
  Mutex mu;
  uint64_t next_offset GUARDED_BY(mu) = 0;
  uint64_t hinted_through GUARDED_BY(mu) = 0;  // blocks up to this one were hinted (block 0 never is)
  // Daemon and kernel modes: non-sequential READs served from the local cache since the last that
  // was not, and when this open last asked for a read lease (fuse/read_leases.h).
  uint32_t local_reads GUARDED_BY(mu) = 0;
  uint64_t lease_next GUARDED_BY(mu) = 0;  // where a sequential read would start next
  std::chrono::steady_clock::time_point lease_asked GUARDED_BY(mu){};
};

}  // namespace granary::fuse
