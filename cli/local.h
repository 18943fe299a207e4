// `granary local URI MOUNTPOINT`: master, worker and FUSE in this one process, for a single
// machine. State (RocksDB) and cache live under one directory (--dir, default ~/.granary/local),
// daemons listen on loopback ports the OS picks, the dataset is mounted in the namespace as /NAME
// and shown directly at MOUNTPOINT. Runs in the foreground; SIGINT/SIGTERM unmount and stop
// everything. Settings the user gave (--config or flags) are honoured; the rest get local defaults.
#pragma once

#include <map>
#include <string>

#include "common/config.h"

namespace granary::cli {

struct LocalOptions {
  std::string uri;
  std::string mountpoint;
  std::string dir;   // state directory; empty: GranaryHome()/local
  std::string name;  // namespace path; empty: "/" + last segment of the URI
  std::map<std::string, std::string> options;  // under-storage options (endpoint, ..._file)
};

int RunLocal(const LocalOptions& opts, Config cfg);

}  // namespace granary::cli
