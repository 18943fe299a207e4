// What the cache is doing: `granary stats` (a live view), `granary trace` (the access trace of a
// node's FUSE mount), `granary profile` (a summary of a live or saved trace) and `granary info`
// (where a file's blocks are cached).
//
// A node is found through the FUSE mount on it: granary-fuse names its endpoints (metrics and
// trace address, worker, master) in RuntimeDir()/fuse-<hash>.json (common/fs.h), found from any
// path inside the mount. stats reads the FUSE process's /metrics and the node's worker (GetStats);
// with no mount to look at, it shows every live worker of the cluster (--master). Every figure
// comes from the counters /metrics serves, so the views and Prometheus never disagree.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/config.h"

namespace granary::cli {

class MasterConn;

struct StatsOptions {
  std::string path;  // a path in a granary mount; "" for fuse.mountpoint
  std::string interval = "1s";
  int count = 0;  // lines to print; 0: until interrupted
  bool json = false;
};
int CmdStats(const Config& cfg, MasterConn& master, const StatsOptions& opts);

struct TraceOptions {
  std::string path;  // a path in a granary mount; "" for fuse.mountpoint
  int64_t pid = -1;
  std::string prefix;           // namespace path prefix
  std::vector<std::string> ops;  // operation names
  bool json = false;
  int64_t count = 0;  // records to print; 0: until interrupted
};
int CmdTrace(const Config& cfg, const TraceOptions& opts);

struct ProfileOptions {
  std::string path;      // live: a path in a granary mount
  std::string file;      // a trace saved with `granary trace --json` ("-": standard input)
  std::string duration = "10s";  // how long a live trace runs
  int64_t pid = -1;
  int top = 10;
  bool json = false;
};
int CmdProfile(const Config& cfg, const ProfileOptions& opts);

struct InfoOptions {
  std::string path;  // a namespace path, or a path in a granary mount
  bool json = false;
};
int CmdInfo(const Config& cfg, MasterConn& master, const InfoOptions& opts);

}  // namespace granary::cli
