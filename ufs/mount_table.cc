#include "ufs/mount_table.h"

namespace granary {

StatusOr<OpenedMount> OpenMount(const std::string& uri, const std::map<std::string, std::string>& options,
                                const UfsAccess& access, UfsCounters* counters) {
  OpenedMount m;
  m.uri = uri;
  std::map<std::string, std::string> ufs_options;
  RETURN_IF_ERROR(SplitMountOptions(options, &ufs_options, &m.cache));
  RETURN_IF_ERROR(CheckMountAccess(uri, ufs_options, access));
  // Opening asks the storage (S3: the prefix); a file:// mount's reads stay below the roots.
  static const std::vector<std::string> kAnywhere;
  auto ufs = OpenUnderFileSystem(uri, ufs_options, access.unrestricted ? kAnywhere : access.local_roots);
  if (!ufs.ok()) return MarkUnderStorage(ufs.status());
  m.ufs = std::move(ufs).value();
  m.ufs = CountedUfs(std::move(m.ufs), counters);
  return m;
}

StatusOr<OpenedMount> MountTable::Get(uint64_t id, bool* opened_now) {
  if (opened_now) *opened_now = false;
  {
    MutexLock lock(&mu_);
    auto it = open_.find(id);
    if (it != open_.end()) return it->second;
  }
  ASSIGN_OR_RETURN(Source src, load_(id));
  ASSIGN_OR_RETURN(OpenedMount m, OpenMount(src.uri, src.options, access_, counters_));
  m.block_size = src.block_size;
  MutexLock lock(&mu_);
  auto [it, inserted] = open_.emplace(id, std::move(m));  // a concurrent first use may have won
  if (opened_now) *opened_now = inserted;
  return it->second;
}

void MountTable::Put(uint64_t id, OpenedMount m) {
  MutexLock lock(&mu_);
  open_[id] = std::move(m);
}

void MountTable::Erase(uint64_t id) {
  MutexLock lock(&mu_);
  open_.erase(id);
}

}  // namespace granary
