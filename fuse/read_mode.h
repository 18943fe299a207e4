// The automatic read mode (fuse.open: auto), as a pure function of what the master knows about the
// datasets a mount shows and of the node's memory, so it can be tested without a kernel.
//
// Passthrough suits large files (sequential, random and mmap reads at the cache medium's speed, one
// copy in the page cache). Kernel mode suits small files while their pages stay in the page cache:
// an epoch then sends no request at all. A dataset larger than half the node's memory cannot stay
// there between epochs, so every epoch reads the medium: there passthrough reads small files at
// least as fast as kernel mode (docs/benchmarks.md, "page cache dropped") and keeps one copy of
// each page in memory instead of two (the cache file's and the FUSE file's), which leaves the
// training job the memory kernel mode would spend twice.
//
// Whether passthrough can work at all (kernel support, CAP_SYS_ADMIN) is decided apart from this.
#pragma once

#include <cstdint>

namespace granary::fuse {

inline constexpr uint64_t kAutoPassthroughMeanFileSize = 8ull << 20;
inline constexpr uint64_t kAutoPassthroughMemoryShare = 2;  // a dataset above MemTotal / this

// `files` and `bytes` are the datasets' totals (no files known: kernel mode); `memory` the node's
// MemTotal in bytes (0 when unknown: the memory rule is not applied).
inline bool AutoChoosesPassthrough(uint64_t files, uint64_t bytes, uint64_t memory) {
  if (files == 0) return false;
  if (bytes / files >= kAutoPassthroughMeanFileSize) return true;
  return memory > 0 && bytes > memory / kAutoPassthroughMemoryShare;
}

}  // namespace granary::fuse
