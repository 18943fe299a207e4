// TuneAllocator: glibc malloc settings for processes that move blocks of data.
//
// The daemons allocate and free buffers of 1–4 MiB all the time (a block fetched from the
// under-storage, a range for the local socket, an HTTP body). With glibc's defaults such a buffer
// is an mmap of fresh pages, or heap memory handed back to the kernel as soon as it is freed
// (trimmed), so the next one is faulted in again, page by page, and zero-filled by the kernel. On a
// cold read of 256 MB through `granary local` over RGW, that churn was a third of the daemons' CPU
// (docs/benchmarks.md, "Cold shards": 4.2 -> 2.2 CPU-s with this and splicing).
//
// So: buffers below kMmapThreshold come from the heap, and up to kTrimThreshold of free heap is kept
// for the next ones. A process thus keeps its peak of block buffers resident (tens to a few hundred
// MB for a worker under load) instead of faulting them in again. An operator's own GLIBC_TUNABLES
// for malloc wins: nothing is changed when it names one.
//
// Called first thing in the mains of granary-worker and granary-fuse and by `granary local` (whose
// process runs them), not by granary-master, which moves no blocks and whose memory is budgeted.
#pragma once

#include <cstddef>

namespace granary {

inline constexpr size_t kMmapThreshold = 32u << 20;   // glibc's largest (HEAP_MAX_SIZE / 2 on 64-bit)
inline constexpr size_t kTrimThreshold = 256u << 20;

// Returns false when the settings were left alone (GLIBC_TUNABLES sets malloc's) or refused.
bool TuneAllocator();

}  // namespace granary
