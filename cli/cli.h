// The `granary` command line. Main() parses arguments and runs one subcommand:
//   mount /NAME URI, unmount /NAME, mounts, ls PATH, stat PATH, report [--json], config, and
//   local URI MOUNTPOINT (every daemon in this process; see local.h).
// Errors print one line "granary: error: ..." and return a non-zero exit code.
//
// The master is found, in order, from --master, $GRANARY_MASTER, the --config file, the file a
// running `granary local` writes (LocalDiscoveryFile()), and finally master.address's default.
#pragma once

#include <cstdint>
#include <string>

#include "common/status.h"

namespace granary::cli {

int Main(int argc, char** argv);

// Prints "granary: error: <message>" to stderr; the exit code of a failed command (1).
int Fail(const Status& st);

// "1 worker", "2 workers": `n` and `noun`, plural with an s unless n is 1.
std::string Count(uint64_t n, const std::string& noun);

// Where `granary local` records how to reach it: $GRANARY_HOME/local.yaml, by default
// ~/.granary/local.yaml.
std::string GranaryHome();
std::string LocalDiscoveryFile();

}  // namespace granary::cli
