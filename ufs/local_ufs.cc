#include "ufs/local_ufs.h"

#include <dirent.h>
#include <fcntl.h>
#include <spdlog/spdlog.h>
#include <sys/stat.h>
#include <unistd.h>

#include <climits>
#include <cerrno>
#include <cstdio>

#include <random>

#include "common/path.h"

namespace granary {
namespace {

std::string VersionOf(const struct stat& st) {
  return std::to_string(st.st_size) + "-" +
         std::to_string(static_cast<int64_t>(st.st_mtim.tv_sec) * 1'000'000'000 + st.st_mtim.tv_nsec) + "-" +
         std::to_string(st.st_ino);
}

UfsEntry EntryOf(const std::string& name, const struct stat& st) {
  UfsEntry e;
  e.name = name;
  e.is_dir = S_ISDIR(st.st_mode);
  e.size = e.is_dir ? 0 : static_cast<uint64_t>(st.st_size);
  e.mtime_ns = static_cast<int64_t>(st.st_mtim.tv_sec) * 1'000'000'000 + st.st_mtim.tv_nsec;
  e.mode = st.st_mode & 07777;
  e.uid = st.st_uid;
  e.gid = st.st_gid;
  if (!e.is_dir) e.version = VersionOf(st);
  return e;
}

std::string Parent(const std::string& full) { return full.substr(0, full.rfind('/')); }

Status SyncDir(const std::string& dir) {
  int fd = open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return ErrnoError(errno, "open directory " + dir);
  int rc = fsync(fd);
  int err = errno;
  close(fd);
  return rc == 0 ? Status::OK() : ErrnoError(err, "fsync directory " + dir);
}

// A new file written beside its target and renamed over it at Commit.
class LocalWriter : public UfsWriter {
 public:
  LocalWriter(std::string full, std::string temp, int fd, std::string name)
      : full_(std::move(full)), temp_(std::move(temp)), fd_(fd), name_(std::move(name)) {}
  ~LocalWriter() override { Abort(); }

  Status Append(std::string_view data) override {
    if (fd_ < 0) return FailedPreconditionError("write to " + full_ + " after it was committed or aborted");
    while (!data.empty()) {
      ssize_t n = write(fd_, data.data(), data.size());
      if (n < 0) {
        if (errno == EINTR) continue;
        return ErrnoError(errno, "write " + full_);
      }
      data.remove_prefix(static_cast<size_t>(n));
    }
    return Status::OK();
  }

  StatusOr<UfsEntry> Commit() override {
    if (fd_ < 0) return FailedPreconditionError("commit of " + full_ + " after it was committed or aborted");
    if (fsync(fd_) != 0) return ErrnoError(errno, "fsync " + full_);
    struct stat st;
    if (fstat(fd_, &st) != 0) return ErrnoError(errno, "stat " + full_);
    if (rename(temp_.c_str(), full_.c_str()) != 0) {
      Status s = ErrnoError(errno, "rename into " + full_);
      Abort();
      return s;
    }
    close(fd_);
    fd_ = -1;
    RETURN_IF_ERROR(SyncDir(Parent(full_)));
    return EntryOf(name_, st);  // the stat of the file now at full_: rename keeps inode and mtime
  }

  void Abort() override {
    if (fd_ < 0) return;
    close(fd_);
    fd_ = -1;
    unlink(temp_.c_str());
  }

 private:
  const std::string full_, temp_;
  int fd_;
  const std::string name_;
};

}  // namespace

StatusOr<std::unique_ptr<UfsWriter>> LocalUfs::Create(const std::string& path, uint32_t mode) {
  ASSIGN_OR_RETURN(std::string full, FullPath(path));
  if (path.empty()) return InvalidArgumentError("cannot write the mount's root directory as a file");
  thread_local std::mt19937_64 rng(std::random_device{}());
  char suffix[17];
  std::snprintf(suffix, sizeof suffix, "%016llx", static_cast<unsigned long long>(rng()));
  size_t slash = full.rfind('/');
  std::string name = full.substr(slash + 1);
  std::string temp = full.substr(0, slash + 1) + std::string(kWritingPrefix) + suffix;
  int fd = open(temp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, static_cast<mode_t>(mode & 0777));
  if (fd < 0) return ErrnoError(errno, "create " + full);
  if (fchmod(fd, static_cast<mode_t>(mode & 0777)) != 0) {  // not narrowed by the umask
    Status s = ErrnoError(errno, "chmod " + full);
    close(fd);
    unlink(temp.c_str());
    return s;
  }
  return std::unique_ptr<UfsWriter>(new LocalWriter(full, temp, fd, name));
}

Status LocalUfs::Remove(const std::string& path) {
  ASSIGN_OR_RETURN(std::string full, FullPath(path));
  struct stat st;
  if (lstat(full.c_str(), &st) == 0 && S_ISDIR(st.st_mode)) return InvalidArgumentError(full + " is a directory");
  if (unlink(full.c_str()) != 0) return ErrnoError(errno, "remove " + full);
  return SyncDir(Parent(full));
}

Status LocalUfs::MakeDir(const std::string& path, uint32_t mode) {
  ASSIGN_OR_RETURN(std::string full, FullPath(path));
  if (mkdir(full.c_str(), static_cast<mode_t>(mode & 07777)) != 0) return ErrnoError(errno, "make directory " + full);
  chmod(full.c_str(), static_cast<mode_t>(mode & 07777));  // not narrowed by the umask; best effort
  return SyncDir(Parent(full));
}

Status LocalUfs::RemoveDir(const std::string& path) {
  ASSIGN_OR_RETURN(std::string full, FullPath(path));
  if (path.empty()) return InvalidArgumentError("cannot remove the mount's root directory");
  if (rmdir(full.c_str()) != 0) return ErrnoError(errno, "remove directory " + full);
  return SyncDir(Parent(full));
}

Status LocalUfs::Rename(const std::string& from, const std::string& to) {
  ASSIGN_OR_RETURN(std::string a, FullPath(from));
  ASSIGN_OR_RETURN(std::string b, FullPath(to));
  if (from.empty() || to.empty()) return InvalidArgumentError("cannot rename the mount's root directory");
  if (rename(a.c_str(), b.c_str()) != 0) return ErrnoError(errno, "rename " + a + " to " + b);
  RETURN_IF_ERROR(SyncDir(Parent(b)));
  return Parent(a) == Parent(b) ? Status::OK() : SyncDir(Parent(a));
}

StatusOr<std::shared_ptr<UnderFileSystem>> LocalUfs::Open(const std::string& root,
                                                         const std::vector<std::string>& confine) {
  std::string r = root;
  while (r.size() > 1 && r.back() == '/') r.pop_back();
  if (r.empty() || r[0] != '/') return InvalidArgumentError("'" + root + "' is not an absolute path");
  struct stat st;
  if (stat(r.c_str(), &st) != 0) {
    if (errno == ENOENT) return NotFoundError("under-storage directory " + r + " does not exist");
    return ErrnoError(errno, "under-storage directory " + r);
  }
  if (!S_ISDIR(st.st_mode)) return InvalidArgumentError("under-storage " + r + " is not a directory");
  std::vector<std::string> resolved;
  for (const auto& dir : confine) {
    char real[PATH_MAX];
    if (realpath(dir.c_str(), real) != nullptr) resolved.push_back(real);
  }
  if (!confine.empty() && resolved.empty()) {
    return PermissionDeniedError("none of ufs.local_roots exists, so nothing below them can be read");
  }
  return std::shared_ptr<UnderFileSystem>(new LocalUfs(r, std::move(resolved)));
}

Status LocalUfs::CheckConfined(int fd, const std::string& full) const {
  if (confine_.empty()) return Status::OK();
  char link[64], real[PATH_MAX];
  std::snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
  ssize_t n = readlink(link, real, sizeof real - 1);
  if (n > 0) {
    std::string at(real, static_cast<size_t>(n));
    for (const auto& dir : confine_) {
      if (PathWithin(at, dir)) return Status::OK();
    }
  }
  return PermissionDeniedError(full + " leads out of ufs.local_roots (a symbolic link to " +
                               (n > 0 ? std::string(real, static_cast<size_t>(n)) : std::string("?")) +
                               "); add its target's directory to ufs.local_roots to serve it");
}

StatusOr<std::string> LocalUfs::FullPath(const std::string& path) const {
  RETURN_IF_ERROR(CheckRelativePath(path));
  return path.empty() ? root_ : root_ + "/" + path;
}

StatusOr<UfsEntry> LocalUfs::Stat(const std::string& path) {
  ASSIGN_OR_RETURN(std::string full, FullPath(path));
  struct stat st;
  if (stat(full.c_str(), &st) != 0) return ErrnoError(errno, "stat " + full);
  if (!S_ISDIR(st.st_mode) && !S_ISREG(st.st_mode)) return NotFoundError(full + " is not a file or directory");
  size_t slash = path.rfind('/');
  return EntryOf(slash == std::string::npos ? path : path.substr(slash + 1), st);
}

Status LocalUfs::List(const std::string& dir, size_t page_size, const PageFn& on_page) {
  ASSIGN_OR_RETURN(std::string full, FullPath(dir));
  int dfd = open(full.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd < 0) return ErrnoError(errno, "open directory " + full);
  DIR* d = fdopendir(dfd);
  if (d == nullptr) {
    int err = errno;
    close(dfd);
    return ErrnoError(err, "open directory " + full);
  }
  std::vector<UfsEntry> page;
  Status result = Status::OK();
  for (;;) {
    errno = 0;
    dirent* de = readdir(d);
    if (de == nullptr) {
      if (errno != 0) result = ErrnoError(errno, "read directory " + full);
      break;
    }
    std::string name = de->d_name;
    if (name == "." || name == ".." || IsWritingName(name)) continue;
    if (!IsValidName(name)) {
      spdlog::warn("skipping an entry of {} whose name cannot be a file name", full);
      continue;
    }
    struct stat st;
    if (fstatat(dfd, name.c_str(), &st, 0) != 0) {
      spdlog::warn("skipping {}/{}: {}", full, name, strerror(errno));
      continue;
    }
    if (!S_ISDIR(st.st_mode) && !S_ISREG(st.st_mode)) continue;
    page.push_back(EntryOf(name, st));
    if (page.size() >= page_size) {
      result = on_page(page);
      page.clear();
      if (!result.ok()) break;
    }
  }
  if (result.ok() && !page.empty()) result = on_page(page);
  closedir(d);
  return result;
}

StatusOr<int> LocalUfs::OpenAtVersion(const std::string& full, const std::string& version, struct stat* st) const {
  // O_NONBLOCK: a FIFO put where a listed file was must not hold the worker in open(2) until a
  // writer comes; it is then refused below. (Reads of a regular file ignore the flag.)
  int fd = open(full.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) return ErrnoError(errno, "open " + full);
  Status ok = CheckConfined(fd, full);
  if (ok.ok() && fstat(fd, st) != 0) ok = ErrnoError(errno, "stat " + full);
  if (ok.ok() && !S_ISREG(st->st_mode)) {
    ok = VersionChangedError(full + " is no longer a regular file in the under-storage");
  }
  if (ok.ok() && VersionOf(*st) != version) ok = VersionChangedError(full + " changed in the under-storage since it was listed");
  // Reads block as usual from here (a file system that honours O_NONBLOCK would answer EAGAIN).
  if (ok.ok() && fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK) != 0) ok = ErrnoError(errno, "fcntl " + full);
  if (!ok.ok()) {
    close(fd);
    return ok;
  }
  return fd;
}

StatusOr<size_t> LocalUfs::Read(const std::string& path, const std::string& version, uint64_t offset,
                                size_t length, char* out) {
  ASSIGN_OR_RETURN(std::string full, FullPath(path));
  struct stat st;
  ASSIGN_OR_RETURN(int fd, OpenAtVersion(full, version, &st));
  size_t done = 0;
  while (done < length) {
    ssize_t n = pread(fd, out + done, length - done, static_cast<off_t>(offset + done));
    if (n < 0) {
      if (errno == EINTR) continue;
      int err = errno;
      close(fd);
      return ErrnoError(err, "read " + full);
    }
    if (n == 0) break;
    done += static_cast<size_t>(n);
  }
  // A writer that raced with this read shows up as a new size or mtime.
  bool same = fstat(fd, &st) == 0 && VersionOf(st) == version;
  close(fd);
  if (!same) return VersionChangedError(full + " changed in the under-storage since it was listed");
  return done;
}

StatusOr<LocalFile> LocalUfs::OpenLocal(const std::string& path, const std::string& version) {
  ASSIGN_OR_RETURN(std::string full, FullPath(path));
  struct stat st;
  ASSIGN_OR_RETURN(int fd, OpenAtVersion(full, version, &st));
  LocalFile f;
  f.fd = fd;
  f.size = static_cast<uint64_t>(st.st_size);
  f.mtime_ns = static_cast<int64_t>(st.st_mtim.tv_sec) * 1'000'000'000 + st.st_mtim.tv_nsec;
  f.ino = static_cast<uint64_t>(st.st_ino);
  return f;
}

}  // namespace granary
