// `granary deploy worker-tiers`: the Kubernetes side of the worker's cache tiers, generated from
// the same worker.tieredstore.levels the worker reads, so the DaemonSet's volumes can never
// disagree with the config. Prints a strategic-merge patch for the granary-worker DaemonSet:
//   - a volume and a mount per tier directory at the same path: MEM levels as emptyDir
//     (medium: Memory, sizeLimit = the quota), SSD/HDD levels as hostPath (DirectoryOrCreate) so the
//     cache survives pod restarts;
//   - memory requests and limits of kWorkerMemory{Request,Limit} plus every MEM quota, because
//     a memory-backed emptyDir is charged to the pod.
#pragma once

#include <string>

#include "common/config.h"
#include "common/status.h"

namespace granary::cli {

inline constexpr uint64_t kWorkerMemoryRequest = 1ull << 30;  // the worker's own, without MEM tiers
inline constexpr uint64_t kWorkerMemoryLimit = 2ull << 30;

StatusOr<std::string> WorkerTiersPatch(const Config& cfg, const std::string& config_name);

}  // namespace granary::cli
