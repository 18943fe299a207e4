// BlockStore: the worker's on-disk block cache (one directory, one byte quota).
//
// Design
// ------
// A block is one fixed-size piece of one version of one file, identified by (FileKey, index); the
// FileKey already hashes the under-storage URI, path and version, so a new version can never be
// served from an old version's blocks.
//
// On disk: <dir>/blocks/<first 2 hex of key>/<32 hex key>-<index>, directories 0700, files 0600;
// names are hashes, never object keys. Each file is a header followed by the data:
//
//   magic "GRNBLK01" | header_len u32 | chunk_size u32 | file_key[16] | index u64 | mount_id u64 |
//   data_len u64 | nchunks u32 | 0 u32 | nchunks x XXH3-64 of each 64 KiB chunk | XXH3-64 of all
//   the header bytes before it | zero padding to header_len (a multiple of 4096, so data is
//   page-aligned)
//
// Writes go to <dir>/tmp and are renamed into place, so a crash never leaves a half-written block
// under a block name; leftovers in tmp are removed at start. Open() rebuilds the index by reading
// every header and dropping files whose header, name or size disagree. Reads verify the checksum
// of every chunk they touch; a mismatch deletes the block and returns DATA_LOSS, so corrupt bytes
// are never served (the caller refetches).
//
// Space: Put() reserves room before writing, evicting least-recently-used blocks that no reader
// holds; used + reserved never exceeds the quota. When nothing more can be evicted, Put() returns
// RESOURCE_EXHAUSTED and the caller serves the block without caching it.
//
// Thread-safety: all methods are thread-safe; `mu_` guards the index, the LRU list and the byte
// counts. File I/O happens outside the lock; a reader's reference keeps eviction off its block.
#pragma once

#include <atomic>
#include <cstdint>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "common/hash.h"
#include "common/status.h"

namespace granary::worker {

struct BlockId {
  FileKey key{};
  uint64_t index = 0;
  bool operator==(const BlockId& o) const { return index == o.index && key == o.key; }
};
struct BlockIdHash {
  size_t operator()(const BlockId& id) const;
};

struct BlockMeta {
  BlockId id;
  uint64_t mount_id = 0;
  uint64_t length = 0;  // data bytes
};

struct BlockStoreStats {
  uint64_t capacity = 0;
  uint64_t used = 0;  // bytes of block files (headers included)
  uint64_t blocks = 0;
  uint64_t evictions = 0;
  uint64_t corrupt = 0;
};

class BlockStore {
 public:
  static constexpr uint32_t kChunkSize = 64 * 1024;

  // Opens or creates the cache in `dir` and rebuilds the index from the files there.
  static StatusOr<std::unique_ptr<BlockStore>> Open(const std::string& dir, uint64_t quota);

  // Copies [offset, offset+length) of a cached block into `out` (clipped at the block's end) and
  // returns the bytes copied. NOT_FOUND when not cached; DATA_LOSS when the bytes failed their
  // checksum (the block is removed).
  StatusOr<size_t> Read(const BlockId& id, uint64_t offset, size_t length, char* out);

  // Caches a whole block. Blocks evicted to make room are appended to `evicted`.
  // RESOURCE_EXHAUSTED when it cannot fit; ALREADY_EXISTS is not an error (returns OK).
  Status Put(const BlockMeta& meta, std::string_view data, std::vector<BlockMeta>* evicted);

  bool Contains(const BlockId& id) const;
  std::vector<BlockMeta> List() const;
  BlockStoreStats Stats() const;

  // The file a block lives in (for tests that corrupt it).
  std::string PathOf(const BlockId& id) const;

 private:
  struct Entry {
    BlockMeta meta;
    uint64_t file_bytes = 0;
    uint32_t header_len = 0;
    int readers = 0;
    std::list<BlockId>::iterator lru;  // front = most recent
  };

  BlockStore(std::string dir, uint64_t quota) : dir_(std::move(dir)), quota_(quota) {}
  Status Scan();
  Status LoadOne(const std::string& path, const std::string& name);
  // Evicts until `bytes` more fit; false when impossible. Needs mu_.
  bool MakeRoomLocked(uint64_t bytes, std::vector<BlockMeta>* evicted, std::vector<std::string>* unlink);
  void RemoveLocked(const BlockId& id, std::vector<std::string>* unlink);

  const std::string dir_;
  const uint64_t quota_;
  std::atomic<uint64_t> tmp_seq_{0};

  mutable std::mutex mu_;
  std::unordered_map<BlockId, Entry, BlockIdHash> index_;  // GUARDED_BY(mu_)
  std::list<BlockId> lru_;                                 // GUARDED_BY(mu_)
  uint64_t used_ = 0;                                      // GUARDED_BY(mu_)
  uint64_t reserved_ = 0;                                  // GUARDED_BY(mu_)
  uint64_t evictions_ = 0;                                 // GUARDED_BY(mu_)
  uint64_t corrupt_ = 0;                                   // GUARDED_BY(mu_)
};

// Header size for a block of `data_len` bytes.
uint32_t BlockHeaderLen(uint64_t data_len);

}  // namespace granary::worker
