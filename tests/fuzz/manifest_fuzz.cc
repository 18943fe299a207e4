// Fuzzes the write=back staging manifest parser (worker/writes.h ParseWriteManifest): any bytes give
// a manifest or an error, never an exception or a crash; a sealed manifest it accepts names a valid
// path and file name; and whatever it accepts survives a round trip through EncodeWriteManifest.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "ufs/ufs.h"
#include "worker/writes.h"

using namespace granary;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view text(reinterpret_cast<const char*>(data), size);
  auto m = worker::ParseWriteManifest(text);
  if (!m.ok()) return 0;
  if (m->sealed && (!CheckRelativePath(m->target.ufs_path).ok() || !IsValidName(m->target.name))) std::abort();
  if (m->target.mode > 07777) std::abort();
  auto again = worker::ParseWriteManifest(worker::EncodeWriteManifest(*m));
  if (!again.ok()) std::abort();
  const worker::WriteTarget &a = m->target, &b = again->target;
  if (a.mount_id != b.mount_id || a.ino != b.ino || a.parent != b.parent || a.ufs_path != b.ufs_path ||
      a.name != b.name || a.mode != b.mode || a.uid != b.uid || a.gid != b.gid || a.write_mode != b.write_mode ||
      a.block_size != b.block_size || m->sealed != again->sealed || m->size != again->size) {
    std::abort();
  }
  return 0;
}
