// granary-fuse: mounts the Granary namespace on this node. See fuse/mount.h.
#include "common/daemon_main.h"
#include "fuse/mount.h"

int main(int argc, char** argv) {
  return granary::DaemonMain(argc, argv, "granary-fuse", [](const granary::Config& cfg) {
    return granary::fuse::FuseMount::Start(cfg);
  });
}
