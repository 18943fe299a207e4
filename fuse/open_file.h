// OpenFile: one file as granary-fuse reads it — an open (daemon and passthrough modes: fi->fh), or
// a file read by inode (kernel mode, fuse/kernel_reads.h) — with its info (the version it reads)
// and the per-reader state of the read path (readahead hints, read leases; fuse/ops_read.cc).
#pragma once

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdint>

#include "common/thread_annotations.h"
#include "fuse/read_leases.h"
#include "proto/granary.pb.h"

namespace granary::fuse {

// The ends of the recent sequential streams through one OpenFile (kernel mode shares one OpenFile
// among every process reading a file; daemon mode among the threads of an open): a READ that
// continues none of them, by more than the kernel's readahead reorders its requests, is a random
// one (ReadBlockRequest.random: its piece at a block's start is read range first, not fetched
// whole as a sequential reader's block start is). With no READ seen yet nothing is random, so an
// OpenFile made for one READ (fuse.file_cache_entries 0) never marks one.
class ReadStreams {
 public:
  static constexpr size_t kStreams = 4;
  // Notes a READ of `size` bytes at `off`; true when it is a random one. Near a stream: within
  // ReadLeases::kSequentialSlack (or 4 READs' length) of its end.
  bool Note(uint64_t off, uint64_t size) {
    const uint64_t slack = std::max<uint64_t>(ReadLeases::kSequentialSlack, 4 * size);
    for (size_t i = 0; i < used_; ++i) {
      if (off + slack >= ends_[i] && off <= ends_[i] + slack) {
        ends_[i] = off + size;
        return false;
      }
    }
    const bool random = used_ > 0 && off != 0;
    ends_[next_] = off + size;
    next_ = (next_ + 1) % kStreams;
    used_ = std::min(used_ + 1, kStreams);
    return random;
  }

 private:
  std::array<uint64_t, kStreams> ends_{};
  size_t used_ = 0;
  size_t next_ = 0;  // the slot a new stream takes (round robin)
};

struct OpenFile {
  rpc::FileInfo info;
  bool passthrough = false;    // opened on a backing file: the kernel reads it, not us
  bool counted_cached = false; // counted in InodeOpens::cached (passthrough mode's bookkeeping); PassthroughOpens::mu
  // Readahead state: where the next sequential read would start, and the last block hinted.
  Mutex mu;
  uint64_t next_offset GUARDED_BY(mu) = 0;
  uint64_t hinted_through GUARDED_BY(mu) = 0;  // blocks up to this one were hinted (block 0 never is)
  ReadStreams streams GUARDED_BY(mu);           // which READs are random ones
  // Daemon and kernel modes: non-sequential READs served from the local cache since the last that
  // was not, and when this open last asked for a read lease (fuse/read_leases.h).
  uint32_t local_reads GUARDED_BY(mu) = 0;
  uint64_t lease_next GUARDED_BY(mu) = 0;  // where a sequential read would start next
  std::chrono::steady_clock::time_point lease_asked GUARDED_BY(mu){};
};

}  // namespace granary::fuse
