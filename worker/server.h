// WorkerServer: granary-worker's gRPC server (the Worker service): a BlockStore, a BlockSource
// over it, and a MasterLink. Start() opens the cache, binds, registers with the master. Shutdown()
// is safe from any thread.
#pragma once

#include <memory>
#include <string>

#include "common/config.h"
#include "common/status.h"

namespace granary::worker {

class WorkerServer {
 public:
  static StatusOr<std::unique_ptr<WorkerServer>> Start(const Config& cfg);
  virtual ~WorkerServer() = default;
  virtual std::string address() const = 0;
  // host:port of /metrics, /healthz and /readyz ("" when off).
  virtual std::string metrics_address() const { return ""; }
  virtual void Shutdown() = 0;
};

}  // namespace granary::worker
