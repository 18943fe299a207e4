#include "common/fs.h"

#include <cstdlib>

#include "common/hash.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>

namespace granary {

Status MakeDirs(const std::string& path, unsigned mode) {
  if (path.empty()) return InvalidArgumentError("empty directory path");
  std::string cur;
  size_t pos = 0;
  while (pos != std::string::npos) {
    pos = path.find('/', pos + 1);
    cur = path.substr(0, pos);
    if (cur.empty()) continue;
    if (mkdir(cur.c_str(), mode) != 0 && errno != EEXIST) return ErrnoError(errno, "mkdir " + cur);
  }
  if (!IsDirectory(path)) return FailedPreconditionError(path + " exists and is not a directory");
  return Status::OK();
}

Status WriteFileAtomic(const std::string& path, const std::string& data) {
  std::string tmp = path + ".tmp";
  int fd = open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) return ErrnoError(errno, "create " + tmp);
  size_t done = 0;
  while (done < data.size()) {
    ssize_t n = write(fd, data.data() + done, data.size() - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      int err = errno;
      close(fd);
      return ErrnoError(err, "write " + tmp);
    }
    done += static_cast<size_t>(n);
  }
  fsync(fd);
  close(fd);
  if (rename(tmp.c_str(), path.c_str()) != 0) return ErrnoError(errno, "rename " + tmp);
  return Status::OK();
}

StatusOr<std::string> ReadFileToString(const std::string& path) {
  int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return ErrnoError(errno, "open " + path);
  std::string out;
  char buf[65536];
  for (;;) {
    ssize_t n = read(fd, buf, sizeof buf);
    if (n < 0) {
      if (errno == EINTR) continue;
      int err = errno;
      close(fd);
      return ErrnoError(err, "read " + path);
    }
    if (n == 0) break;
    out.append(buf, static_cast<size_t>(n));
  }
  close(fd);
  return out;
}

bool IsDirectory(const std::string& path) {
  struct stat st;
  return stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

Status MakePrivateDir(const std::string& dir) {
  RETURN_IF_ERROR(MakeDirs(dir, 0700));
  struct stat st;
  if (lstat(dir.c_str(), &st) != 0) return ErrnoError(errno, "stat " + dir);
  if (!S_ISDIR(st.st_mode)) {
    return PermissionDeniedError(dir + " is a link or not a directory: refusing it as a private runtime directory "
                                 "(remove it, or set GRANARY_RUN_DIR to a directory of your own)");
  }
  if (st.st_uid != geteuid()) {
    return PermissionDeniedError(dir + " belongs to uid " + std::to_string(st.st_uid) + ", not to this user (uid " +
                                 std::to_string(geteuid()) + "): another user made it, so nothing in it can be "
                                 "trusted. Remove it (as root), or set GRANARY_RUN_DIR to a directory of your own");
  }
  // Ours: only ours. (Nobody else can swap it meanwhile: it is ours, in a directory they cannot
  // rename in — /tmp is sticky.)
  if ((st.st_mode & 077) != 0 && chmod(dir.c_str(), 0700) != 0) return ErrnoError(errno, "chmod 0700 " + dir);
  return Status::OK();
}

StatusOr<std::string> RuntimeDir() {
  if (const char* d = std::getenv("GRANARY_RUN_DIR"); d && *d) {
    RETURN_IF_ERROR(MakePrivateDir(d).WithContext("GRANARY_RUN_DIR"));
    return std::string(d);
  }
  // Root's (or, in a container, whoever may write /run): made 0700 here when missing.
  if (access("/run", W_OK) == 0 && MakePrivateDir("/run/granary").ok()) return std::string("/run/granary");
  const char* xdg = std::getenv("XDG_RUNTIME_DIR");
  if (xdg != nullptr && *xdg == '/') {
    std::string mine = std::string(xdg) + "/granary";
    if (MakePrivateDir(mine).ok()) return mine;  // else: not this user's (a stale variable), /tmp then
  }
  std::string tmp = "/tmp/granary-" + std::to_string(geteuid());
  RETURN_IF_ERROR(MakePrivateDir(tmp));
  return tmp;
}

std::string MountRunFileName(const std::string& mountpoint, const std::string& suffix) {
  char hex[17];
  std::snprintf(hex, sizeof hex, "%016llx",
                static_cast<unsigned long long>(Checksum64(mountpoint.data(), mountpoint.size())));
  return std::string("fuse-") + hex + suffix;
}

StatusOr<std::string> MountRunFile(const std::string& mountpoint, const std::string& suffix) {
  ASSIGN_OR_RETURN(std::string dir, RuntimeDir());
  return dir + "/" + MountRunFileName(mountpoint, suffix);
}

StatusOr<std::string> MountEndpointsFile(const std::string& mountpoint) { return MountRunFile(mountpoint, ".json"); }

std::string ParentDir(const std::string& path) {
  auto slash = path.rfind('/');
  return slash == std::string::npos || slash == 0 ? "/" : path.substr(0, slash);
}

std::string Ext4WithoutJournal(const std::string& path) {
  struct statfs fs {};
  struct stat st {};
  constexpr long kExt4Magic = 0xEF53;
  if (statfs(path.c_str(), &fs) != 0 || fs.f_type != kExt4Magic || stat(path.c_str(), &st) != 0) return "";
  const std::string dev = std::to_string(major(st.st_dev)) + ":" + std::to_string(minor(st.st_dev));
  DIR* d = opendir("/sys/fs/ext4");
  if (d == nullptr) return "";
  std::string found;
  while (dirent* e = readdir(d)) {
    const std::string name = e->d_name;
    if (name.empty() || name[0] == '.') continue;
    auto number = ReadFileToString("/sys/class/block/" + name + "/dev");
    if (!number.ok() || number->substr(0, number->find('\n')) != dev) continue;
    // The journal's kernel thread: "<none>" without a journal.
    auto journal = ReadFileToString("/sys/fs/ext4/" + name + "/journal_task");
    if (journal.ok() && journal->rfind("<none>", 0) == 0) found = name;
    break;
  }
  closedir(d);
  return found;
}

}  // namespace granary
