// DaemonMain: the whole body of a daemon's main(), shared by granary-master, -worker and -fuse.
//
// Parses --config, the per-setting flags and --ready-file; sets up logging and signal handling;
// calls `start(config)`; writes the bound address to the ready file (so tests and `granary local`
// learn OS-chosen ports without sleeping; the metrics endpoint's address goes to <ready-file>.metrics); waits for SIGINT/SIGTERM or an internal shutdown
// request; calls Shutdown(). Errors print one line "NAME: error: ..." and exit 1.
#pragma once

#include <spdlog/spdlog.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <functional>
#include <memory>
#include <string>

#include "common/config.h"
#include "common/fs.h"
#include "common/logging.h"
#include "common/shutdown.h"
#include "common/status.h"

namespace granary {

template <typename StartFn>
int DaemonMain(int argc, char** argv, const std::string& name, StartFn start) {
  Shutdown::InstallSignalHandling();
  CLI::App app{name};
  ConfigFlags flags;
  std::string ready_file;
  AddConfigFlags(app, &flags);
  app.add_option("--ready-file", ready_file, "Write the bound address to this file once serving");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  auto cfg = BuildConfig(flags);
  if (!cfg.ok()) {
    std::fprintf(stderr, "%s: error: %s\n", name.c_str(), cfg.status().message().c_str());
    return 1;
  }
  InitLogging(name, cfg->log.level);
  auto server = start(*cfg);
  if (!server.ok()) {
    std::fprintf(stderr, "%s: error: %s\n", name.c_str(), server.status().message().c_str());
    return 1;
  }
  if (!ready_file.empty()) {
    // The metrics endpoint's address first (beside it, OS-chosen ports again), so it is there once
    // the ready file is.
    std::string metrics = (*server)->metrics_address();
    if (!metrics.empty()) (void)WriteFileAtomic(ready_file + ".metrics", metrics + "\n");
    Status st = WriteFileAtomic(ready_file, (*server)->address() + "\n");
    if (!st.ok()) {
      std::fprintf(stderr, "%s: error: --ready-file: %s\n", name.c_str(), st.message().c_str());
      (*server)->Shutdown();
      return 1;
    }
  }
  std::string reason = Shutdown::Wait();
  spdlog::info("{}: stopping ({})", name, reason);
  (*server)->Shutdown();
  spdlog::info("{}: stopped", name);
  return 0;
}

}  // namespace granary
