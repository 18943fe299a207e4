// granary-worker: the block cache of one node. See worker/server.h.
#include "common/allocator.h"
#include "common/daemon_main.h"
#include "worker/server.h"

int main(int argc, char** argv) {
  granary::TuneAllocator();  // block buffers (common/allocator.h)
  return granary::DaemonMain(argc, argv, "granary-worker", [](const granary::Config& cfg) {
    return granary::worker::WorkerServer::Start(cfg);
  });
}
