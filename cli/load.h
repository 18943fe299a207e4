// `granary load`, `granary jobs` and `granary du`: the CLI side of load jobs (master/jobs.h) and of
// cached-versus-total accounting.
//
// load PATH... submits one job and, unless --background, follows it until it ends: on a terminal a
// live bar (files, bytes, rate, ETA, failures) redrawn in place; otherwise a plain line every few
// seconds; with --json nothing until the end, then the job as JSON. Failures are listed with their
// reasons. Exit code 0 only when every file loaded. Following survives a master restart (it retries
// for kFollowRetry while the master is unreachable); interrupting it leaves the job running.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "cli/master_conn.h"

namespace granary::cli {

struct LoadOptions {
  std::vector<std::string> paths;
  std::vector<std::string> include, exclude;
  std::string from_file;  // one namespace path per line; "-" reads standard input
  uint32_t replicas = 0;
  uint32_t parallel = 0;
  std::string bandwidth;  // e.g. 100Mi or 100Mi/s (bytes per second)
  bool metadata_only = false;
  bool background = false;
  bool json = false;
  uint64_t cancel = 0;  // --cancel ID
};

int CmdLoad(MasterConn& m, const LoadOptions& o);
int CmdJobs(MasterConn& m, bool json);
int CmdDu(MasterConn& m, const std::string& path, bool json);

}  // namespace granary::cli
