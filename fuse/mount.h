// FuseMount: granary-fuse's mount of the namespace (libfuse3 low-level API, multi-threaded).
//
// The filesystem is read-only: lookups, attributes and directory listings come from the master,
// file bytes from the worker on this node (fuse.worker). Every write-like operation answers EROFS.
// The kernel checks permissions itself (default_permissions) against the owner and mode the
// under-storage reports, with write bits cleared. See docs/semantics.md for each operation.
//
// Read modes (fuse.open): `kernel` answers the first OPEN with ENOSYS, so the kernel opens files
// itself and reads arrive by inode with no file handle; `passthrough` opens a wholly cached file on
// its cache data file (fuse/session_io.h does the /dev/fuse I/O libfuse 3.14 cannot), so the kernel
// reads it without us; `daemon` serves every open and read. `auto` chooses at INIT from what the
// kernel offers, the process's privileges and the datasets' size (fuse/read_mode.h). A mode that cannot
// work falls back to `kernel` (logged once; granary_fuse_open_mode{fallback="1"}).
//
// Start() refuses a mount point that does not exist, clears a stale mount left by a crashed
// predecessor ("Transport endpoint is not connected"), mounts, and serves on a background
// thread. If the mount disappears from outside (fusermount3 -u), the loop ends and
// Shutdown::Request is called so the process stops. Shutdown() unmounts (lazily if the mount is
// busy) and waits for the loop; it is safe from any thread and idempotent.
#pragma once

#include <memory>
#include <string>

#include "common/config.h"
#include "common/status.h"

namespace granary::fuse {

class FuseMount {
 public:
  static StatusOr<std::unique_ptr<FuseMount>> Start(const Config& cfg);
  virtual ~FuseMount() = default;
  // The mount point.
  virtual std::string address() const = 0;
  // host:port of /metrics, /healthz and /readyz ("" when off).
  virtual std::string metrics_address() const { return ""; }
  virtual void Shutdown() = 0;
};

}  // namespace granary::fuse
