// One way to turn a mount (URI and options) into what reads and listings need, and one table of
// them by mount id, shared by the master (listing), the worker (reading) and `granary local`.
//
// OpenMount splits the options (SplitMountOptions: the secret policy, and Granary's own cache.* and
// metadata.* options, typed) and opens the under-storage with the rest. MountTable caches opened
// mounts by id, opening one on first use from what its loader returns, outside the table's lock
// (and outside any lock of the caller's that the loader does not take): an NFS connect never
// blocks other mounts. Thread-safe.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>

#include "common/status.h"
#include "common/thread_annotations.h"
#include "common/tiers.h"
#include "ufs/access.h"
#include "ufs/ufs.h"

namespace granary {

struct OpenedMount {
  std::string uri;
  uint64_t block_size = 0;  // the mount's (MountInfo.block_size); 0: unknown
  MountCacheOptions cache;
  std::shared_ptr<UnderFileSystem> ufs;
};

// INVALID_ARGUMENT for a bad option (an inline secret included); PERMISSION_DENIED for a path
// `access` does not allow (ufs/access.h); the under-storage's own errors. With `counters`, every
// call to the under-storage is counted there (CountedUfs).
StatusOr<OpenedMount> OpenMount(const std::string& uri, const std::map<std::string, std::string>& options,
                                const UfsAccess& access, UfsCounters* counters = nullptr);

class MountTable {
 public:
  struct Source {
    std::string uri;
    std::map<std::string, std::string> options;
    uint64_t block_size = 0;  // the mount's block size; 0: unknown
  };
  // Where a mount's URI and options come from (the master's namespace; the master, for a worker).
  using Loader = std::function<StatusOr<Source>(uint64_t id)>;
  // Mounts are opened under `access`; they count their under-storage calls into `counters` (may be
  // null).
  MountTable(Loader load, UfsAccess access, UfsCounters* counters = nullptr)
      : load_(std::move(load)), access_(std::move(access)), counters_(counters) {}

  // The mount, opened on first use. *opened_now (optional) tells whether this call opened it.
  StatusOr<OpenedMount> Get(uint64_t id, bool* opened_now = nullptr);
  void Put(uint64_t id, OpenedMount m);
  void Erase(uint64_t id);

 private:
  const Loader load_;
  const UfsAccess access_;
  UfsCounters* const counters_;
  Mutex mu_;
  std::map<uint64_t, OpenedMount> open_ GUARDED_BY(mu_);
};

}  // namespace granary
