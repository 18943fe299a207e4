// Block buffers: 4 KiB-aligned memory for fetched blocks, kept for reuse once let go.
//
// Why: malloc keeps freed heap (common/allocator.h), but per thread arena: a fetch on one thread
// did not reuse the buffer another thread's fetch let go, so each arena grew its own and a cold
// shard's buffers were fresh pages for most of an epoch. Its bytes then took a page fault (and the
// kernel's zeroing) for every 4 KiB as libcurl's callback copied them in: ~0.45 CPU-s per GB, a
// sixth of a worker's CPU on cold shards (docs/benchmarks.md, session 40). Buffers of at least kMinPooled
// bytes go back to a free list of their size when let go, up to kKeepBytes in all (beyond that they
// are freed); smaller ones come and go through the allocator, whose arenas keep them mapped.
//
// A buffer of kHugePage bytes or more is made of whole transparent huge pages where the kernel
// allows them (madvise(MADV_HUGEPAGE); THP "madvise" or "always"): a cold shard's 4 MiB buffer,
// fresh, then costs libcurl's copy 2 page faults instead of 1024. Fresh buffers are the rule, not
// the exception, on a cold read of large files: readahead hints, fetch-ahead and demand misses keep
// 30-45 blocks in flight or streaming at once (180 MB of buffers, more than kKeepBytes), and those
// faults were a fifth of a worker's CPU on cold shards (docs/benchmarks.md, sessions 45 and 46: in
// a profile of a cold 512 MB, libcurl's callback 0.03 CPU-s per GB with them, 0.11 without).
//
// A buffer's bytes are not cleared between uses: whoever takes one writes it before anyone reads
// it (a fetch fills the block, or fails and the buffer is let go unread). Thread-safe.
#pragma once

#include <cstddef>

namespace granary::worker::block_buffers {

constexpr size_t kMinPooled = size_t{1} << 20;
constexpr size_t kKeepBytes = size_t{64} << 20;
constexpr size_t kHugePage = size_t{2} << 20;

// A buffer of at least `capacity` bytes: whole 4 KiB pages, 4 KiB-aligned, or from kHugePage bytes
// up whole huge pages, kHugePage-aligned (buffers are pooled by that size); never null
// (std::bad_alloc when memory is out, as new would).
char* Take(size_t capacity);
// Gives back a buffer Take returned for the same `capacity`.
void Give(char* p, size_t capacity);
// Bytes held in the free lists now (for tests and metrics).
size_t Kept();
// Frees every buffer the free lists hold (tests start from an empty pool).
void Clear();

}  // namespace granary::worker::block_buffers
