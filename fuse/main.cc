// granary-fuse: mounts the Granary namespace on this node. See fuse/mount.h.
// `granary-fuse --keeper PATH` runs the keeper that holds a FUSE connection across a crash of
// granary-fuse (fuse/handover.h).
#include <cstdio>
#include <cstring>

#include "common/allocator.h"
#include "common/daemon_main.h"
#include "fuse/handover.h"
#include "fuse/mount.h"

int main(int argc, char** argv) {
  granary::TuneAllocator();  // block buffers (common/allocator.h)
  if (argc >= 2 && std::strcmp(argv[1], "--keeper") == 0) {
    if (argc < 3 || argv[2][0] != '/') {
      std::fprintf(stderr, "granary-fuse: error: --keeper needs the absolute path of the socket to listen on\n");
      return 2;
    }
    bool exit_when_empty = argc >= 4 && std::strcmp(argv[3], "--exit-when-empty") == 0;
    return granary::fuse::RunKeeper(argv[2], exit_when_empty);
  }
  return granary::DaemonMain(argc, argv, "granary-fuse", [](const granary::Config& cfg) {
    return granary::fuse::FuseMount::Start(cfg);
  });
}
