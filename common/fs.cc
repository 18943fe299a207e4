#include "common/fs.h"

#include <cstdlib>

#include "common/hash.h"

#include <fcntl.h>
#include <sys/stat.h>
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

namespace {

bool WritableDir(const std::string& dir) { return MakeDirs(dir, 0700).ok() && access(dir.c_str(), W_OK) == 0; }

}  // namespace

std::string RuntimeDir() {
  if (const char* d = std::getenv("GRANARY_RUN_DIR"); d && *d) return d;
  if (WritableDir("/run/granary")) return "/run/granary";
  const char* xdg = std::getenv("XDG_RUNTIME_DIR");
  if (xdg != nullptr && *xdg == '/' && WritableDir(std::string(xdg) + "/granary")) return std::string(xdg) + "/granary";
  std::string tmp = "/tmp/granary-" + std::to_string(getuid());
  // Best effort: whoever writes a file there reports a directory it cannot have.
  static_cast<void>(MakeDirs(tmp, 0700));
  return tmp;
}

std::string MountRunFile(const std::string& mountpoint, const std::string& suffix) {
  char hex[17];
  std::snprintf(hex, sizeof hex, "%016llx",
                static_cast<unsigned long long>(Checksum64(mountpoint.data(), mountpoint.size())));
  return RuntimeDir() + "/fuse-" + hex + suffix;
}

std::string MountEndpointsFile(const std::string& mountpoint) { return MountRunFile(mountpoint, ".json"); }

std::string ParentDir(const std::string& path) {
  auto slash = path.rfind('/');
  return slash == std::string::npos || slash == 0 ? "/" : path.substr(0, slash);
}

}  // namespace granary
