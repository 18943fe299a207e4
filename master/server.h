// MasterServer: granary-master's gRPC server (the Master service of proto/granary.proto) over a
// Namespace and a Cluster. Start() binds, serves on gRPC's threads, and runs one background thread
// that expires silent workers. Shutdown() stops everything; it is safe to call from any thread.
#pragma once

#include <memory>
#include <string>

#include "common/config.h"
#include "common/status.h"

namespace granary::master {

class MasterServer {
 public:
  static StatusOr<std::unique_ptr<MasterServer>> Start(const Config& cfg);
  virtual ~MasterServer() = default;
  // The address bound (the OS-chosen port when master.listen had port 0).
  virtual std::string address() const = 0;
  // host:port of /metrics, /healthz and /readyz ("" when off).
  virtual std::string metrics_address() const { return ""; }
  virtual void Shutdown() = 0;
};

}  // namespace granary::master
