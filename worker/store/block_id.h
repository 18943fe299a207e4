// BlockId and BlockMeta: what names a cached block, and what the store keeps of it.
#pragma once

#include <cstddef>
#include <cstdint>

#include "common/hash.h"

namespace granary::worker {

// One fixed-size piece of one version of one file: the FileKey hashes the under-storage URI,
// path and version, so a new version can never be served from an old version's blocks.
struct BlockId {
  FileKey key{};
  uint64_t index = 0;
  bool operator==(const BlockId& o) const { return index == o.index && key == o.key; }
};
struct BlockIdHash {
  size_t operator()(const BlockId& id) const;
};
struct FileKeyHash {
  size_t operator()(const FileKey& k) const;
};

struct BlockMeta {
  BlockId id;
  uint64_t mount_id = 0;
  uint64_t length = 0;  // data bytes
  uint64_t offset = 0;  // where the block starts in its file (index x block size)
  // An elastic copy: kept by a node that is not one of the block's `cache.replicas` holders, while
  // it has room; evicted before any replica and never counted as one (worker/block_source.h).
  // Not stored on disk: a restarted worker's blocks are replicas until its first classification.
  bool elastic = false;
  // This worker is the block's home: first in its rendezvous ranking over the live workers, the
  // one copy the cluster's cached_bytes counts (master/cluster.h). Not stored on disk either: a
  // restarted (or lone) worker's blocks are home until its first classification says otherwise.
  bool home = true;
};

}  // namespace granary::worker
