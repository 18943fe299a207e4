// LocalUfs: a directory of this machine as under-storage (a local disk, or an NFS volume already
// mounted into the pod). Versions are "<size>-<mtime ns>-<inode>", so an in-place rewrite or an
// atomic replace both produce a new version. Reads follow symbolic links; other special files are
// skipped, as are writers' temporary files (kWritingPrefix). With `confine` (ufs.local_roots), a
// read whose file resolves outside every one of those directories is PERMISSION_DENIED: a link a
// dataset's writer planted (x -> /etc/shadow) reads nothing the roots do not hold.
//
// Writes never follow a link: every write call walks from the root one component at a time
// (O_PATH | O_NOFOLLOW, each checked to be a directory) and changes the last component through
// that directory's descriptor (openat, renameat, unlinkat, mkdirat), so a directory swapped for a
// link to /etc by a user who owns it leads nowhere (PERMISSION_DENIED naming the link). A write
// call acts for its caller (WriteCaller): with the daemon root, the thread's filesystem ids and
// groups are the caller's for the call, so the kernel checks the caller's own permissions and new
// files and directories are the caller's, with the mode asked for. Thread-safe (no mutable state;
// the ids are per thread and restored when the call ends).
#pragma once

#include <sys/stat.h>

#include <memory>
#include <string>
#include <vector>

#include "ufs/ufs.h"

namespace granary {

class LocalUfs : public UnderFileSystem {
 public:
  // `root` is an absolute directory path; NOT_FOUND when it does not exist. `confine`: the
  // directories reads must stay within (empty: anywhere).
  static StatusOr<std::shared_ptr<UnderFileSystem>> Open(const std::string& root,
                                                         const std::vector<std::string>& confine = {});

  const std::string& uri() const override { return uri_; }
  StatusOr<UfsEntry> Stat(const std::string& path) override;
  Status List(const std::string& dir, size_t page_size, const PageFn& on_page) override;
  StatusOr<size_t> Read(const std::string& path, const std::string& version, uint64_t offset, size_t length,
                        char* out) override;
  StatusOr<LocalFile> OpenLocal(const std::string& path, const std::string& version) override;
  // Writes: a hidden temporary file beside the target (kWritingPrefix), fsynced, renamed over it,
  // the directory fsynced. Owner: the caller (see above). Directories are renamed with rename(2).
  StatusOr<std::unique_ptr<UfsWriter>> Create(const std::string& path, uint32_t mode, const WriteCaller& as) override;
  // On the root's filesystem: the staging file is given to the writer (owner, and the directory's
  // group below a setgid directory), then hard-linked in as the writer (its permission to write
  // the directory is the kernel's to check; protected_hardlinks holds: the writer owns the file),
  // then renamed into place as Create's writer does.
  bool CanAdopt(uint64_t dev) const override;
  StatusOr<UfsEntry> Adopt(const std::string& path, int fd, uint64_t size, uint32_t mode, const UfsAttrChange& attrs,
                           const WriteCaller& as) override;
  Status Remove(const std::string& path, const WriteCaller& as) override;
  Status MakeDir(const std::string& path, uint32_t mode, const WriteCaller& as) override;
  Status RemoveDir(const std::string& path, const WriteCaller& as) override;
  Status Rename(const std::string& from, const std::string& to, const WriteCaller& as) override;
  Status SetAttr(const std::string& path, const UfsAttrChange& change, const WriteCaller& as) override;

 private:
  LocalUfs(std::string root, std::vector<std::string> confine)
      : root_(std::move(root)), uri_("file://" + root_), confine_(std::move(confine)) {}
  StatusOr<std::string> FullPath(const std::string& path) const;
  // OK when open file `fd` (named `full`) lies within confine_.
  Status CheckConfined(int fd, const std::string& full) const;
  // `full` open for reading (non-blocking open, close-on-exec), confined, a regular file, at
  // `version`; its stat in *st. FAILED_PRECONDITION (VersionChangedError) when it is another
  // version or no longer a regular file.
  StatusOr<int> OpenAtVersion(const std::string& full, const std::string& version, struct stat* st) const;

  std::string root_;
  std::string uri_;
  std::vector<std::string> confine_;  // resolved (realpath) directories
};

}  // namespace granary
