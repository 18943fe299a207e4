// granary-master: the namespace and block-location service. See master/server.h.
#include "common/daemon_main.h"
#include "master/server.h"

int main(int argc, char** argv) {
  return granary::DaemonMain(argc, argv, "granary-master", [](const granary::Config& cfg) {
    return granary::master::MasterServer::Start(cfg);
  });
}
