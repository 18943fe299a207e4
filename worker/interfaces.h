// The worker's seams: what BlockSource needs from the outside, so tests can substitute fakes.
//
//   MountResolver  turns a mount id into the mount's URI and an opened under-storage client.
//   BlockReporter  is told about every block the cache gains or loses (the master's block map).
//
// MasterLink implements both against a real master. Implementations must be thread-safe.
#pragma once

#include <memory>
#include <optional>
#include <string>

#include "common/status.h"
#include "common/tiers.h"
#include "common/ufs/ufs.h"
#include "worker/block_store.h"

namespace granary::worker {

struct MountHandle {
  std::string uri;
  std::shared_ptr<UnderFileSystem> ufs;
  std::optional<CachePolicy> policy;  // the mount's cache.policy, when it sets one
};

class MountResolver {
 public:
  virtual ~MountResolver() = default;
  virtual StatusOr<MountHandle> GetMount(uint64_t mount_id) = 0;
};

class BlockReporter {
 public:
  virtual ~BlockReporter() = default;
  virtual void BlockAdded(const BlockMeta& m) = 0;
  virtual void BlockRemoved(const BlockMeta& m) = 0;
};

}  // namespace granary::worker
