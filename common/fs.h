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

}  // namespace granary
