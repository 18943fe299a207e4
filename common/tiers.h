// Cache tiers and cache policies: the shapes of `worker.tieredstore` and of a mount's `cache.*`
// options, with their parsers.
//
// A tier level is written the way Fluid users write it:
//
//   worker:
//     tieredstore:
//       policy: lru            # or: shuffle
//       levels:
//         - {mediumtype: MEM, path: /dev/shm/granary, quota: 2Gi, high: "0.95", low: "0.7"}
//         - {mediumtype: SSD, path: "/mnt/nvme0/granary,/mnt/nvme1/granary", quota: 150Gi}
//
// `path` may list several directories separated by commas; `quota` is then split evenly among
// them, or `quotaList` gives one quota per path. `high`/`low` are fractions of the quota (defaults
// 0.95 and 0.7). Fluid's `volumeType`/`volumeSource` are accepted and ignored (they describe the
// Kubernetes volume, not the cache). Levels are ordered MEM, SSD, HDD whatever order they are
// written in; a medium may appear once.
//
// Mount options whose keys start with "cache." or "metadata." belong to Granary
// (SplitMountOptions); every other option goes to the under-storage client.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"

namespace granary {

enum class CachePolicy { kLru, kShuffle };

// "lru" or "shuffle".
StatusOr<CachePolicy> ParseCachePolicy(std::string_view text);
const char* CachePolicyName(CachePolicy p);

struct TierLevel {
  std::string medium;               // MEM, SSD or HDD
  std::vector<std::string> paths;   // one or more directories
  std::vector<uint64_t> quotas;     // bytes, one per path
  double high = 0.95;               // start freeing above high x quota
  double low = 0.7;                 // ... down to low x quota
  uint64_t quota() const;           // sum of quotas
};

// Parses the YAML (flow or block) list of levels; "" or "[]" is an empty list. Errors name the
// level and field at fault.
StatusOr<std::vector<TierLevel>> ParseTierLevels(std::string_view yaml);
// The canonical flow-YAML form, which ParseTierLevels reads back.
std::string FormatTierLevels(const std::vector<TierLevel>& levels);

// How often the master re-checks a mount's metadata against the under-storage, in milliseconds:
// kSyncNever, 0 (always: on every access), or an interval.
constexpr int64_t kSyncNever = -1;
// "never", "always" (or "0"), or a duration ("30s", "5m").
StatusOr<int64_t> ParseSyncInterval(std::string_view text);
std::string FormatSyncInterval(int64_t ms);

inline constexpr uint32_t kMaxReplicas = 16;
inline constexpr uint32_t kMaxFetchAheadInflight = 256;

// Mount option `write`: whether and how granary-fuse writes through a mount (docs/semantics.md,
// "Writes"). off: read-only (EROFS); through: close() and fsync() return once the file is whole in
// the under-storage and the namespace; back: close() returns once the bytes are staged on the
// node's disk, the worker uploads them after (fsync() waits for the upload).
enum class WriteMode { kOff, kThrough, kBack };
StatusOr<WriteMode> ParseWriteMode(std::string_view text);  // "off", "through", "back"
const char* WriteModeName(WriteMode m);

struct MountCacheOptions {
  WriteMode write = WriteMode::kOff;  // write: off (default), through or back
  std::optional<CachePolicy> policy;          // cache.policy: overrides the worker's policy
  std::optional<int64_t> metadata_sync_ms;    // metadata.sync_interval: overrides the master's
  // cache.replicas: how many workers keep a copy of each block (the first N of its rendezvous
  // ranking); 1 (the default) keeps only the home worker's. 1..16.
  uint32_t replicas = 1;
  // cache.elastic: a worker that is not one of a block's replica holders keeps a copy of what its
  // node reads while it has room (evicted first, never a replica). true/false; default true.
  bool elastic = true;
  // cache.fetch_ahead: when readers read the mount like an epoch (many distinct files under one
  // tree), the workers fetch the rest of that tree ahead of them (master/fetch_ahead.h).
  // true/false; default true.
  bool fetch_ahead = true;
  // cache.fetch_ahead.bandwidth: bytes/s the mount's fetch-ahead may take, the whole cluster
  // together (split over the workers); 0 (the default): as much as the link gives.
  uint64_t fetch_ahead_bandwidth = 0;
  // cache.fetch_ahead.inflight: under-storage requests a worker's fetch-ahead keeps in flight at
  // most (1..256, default 64); within it, the worker sizes them from measured bandwidth and latency.
  uint32_t fetch_ahead_inflight = 64;
};

// The secret policy of mount options, enforced wherever options are parsed (the CLI, the master's
// Mount RPC, the worker, every under-storage client): a credential never travels or rests inline
// (it would sit in process arguments, the master's database and `granary mounts`). `access_key`,
// `secret_key` and `session_token` are refused (use `<key>_file=PATH`); `fs.oss.accessKeySecret`
// and `fs.oss.securityToken` must be absolute paths of files holding them. INVALID_ARGUMENT names
// the option (never its value) and the option to use instead.
Status RefuseInlineSecrets(const std::map<std::string, std::string>& options);

// Splits a mount's options into the under-storage's and Granary's own ("cache.*"); unknown
// "cache.*" keys, bad values and inline secrets (RefuseInlineSecrets) are INVALID_ARGUMENT.
Status SplitMountOptions(const std::map<std::string, std::string>& all, std::map<std::string, std::string>* ufs,
                         MountCacheOptions* cache);

// KEY=VALUE pairs as given to `granary mount -o` (and `granary local -o`): the first '=' splits; a
// later pair of the same key wins. INVALID_ARGUMENT for a pair without '=' or with an empty key,
// and for inline secrets (RefuseInlineSecrets), before the options go anywhere.
StatusOr<std::map<std::string, std::string>> ParseMountOptions(const std::vector<std::string>& raw);

}  // namespace granary
