// Small filesystem helpers over POSIX calls, returning Status. Thread-safe.
#pragma once

#include <string>

#include "common/status.h"

namespace granary {

// mkdir -p with `mode` for every directory it creates; an existing directory is fine.
Status MakeDirs(const std::string& path, unsigned mode);
// Writes `data` to path.tmp, fsyncs, renames over `path` (mode 0600).
Status WriteFileAtomic(const std::string& path, const std::string& data);
StatusOr<std::string> ReadFileToString(const std::string& path);
bool IsDirectory(const std::string& path);

// Where daemons leave small files for the CLI on this machine: $GRANARY_RUN_DIR, else /run/granary
// for root, else /tmp/granary-<uid>/run.
std::string RuntimeDir();
// The file in which the granary-fuse serving `mountpoint` (an absolute, canonical path) names its
// endpoints (JSON: mountpoint, pid, metrics, worker, master), for `granary stats` and `granary trace`.
// Named by a hash of the path.
std::string MountEndpointsFile(const std::string& mountpoint);

}  // namespace granary
