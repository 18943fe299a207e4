// Process-wide shutdown: SIGINT/SIGTERM and internal requests (a FUSE mount removed from outside)
// funnel into one Wait() in main.
//
// Call InstallSignalHandling() first thing in main, before any thread exists: it blocks the two
// signals in every thread created afterwards and starts one thread that waits for them with
// sigwait. Request() and Wait() are thread-safe.
#pragma once

#include <chrono>
#include <string>

namespace granary {

class Shutdown {
 public:
  static void InstallSignalHandling();
  // Asks the process to stop; the first reason wins.
  static void Request(const std::string& reason);
  static bool Requested();
  // Blocks until Request() (or a signal); returns the reason.
  static std::string Wait();
  // Blocks for `d` or until Request(), whichever comes first; true when a stop was requested.
  static bool WaitFor(std::chrono::milliseconds d);
};

}  // namespace granary
