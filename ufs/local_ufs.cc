#include "ufs/local_ufs.h"

#include <dirent.h>
#include <fcntl.h>
#include <spdlog/spdlog.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <climits>
#include <cerrno>
#include <cstdio>

#include <random>

#include "common/fs.h"
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

// A descriptor closed when it goes.
class Fd {
 public:
  explicit Fd(int fd = -1) : fd_(fd) {}
  Fd(Fd&& o) noexcept : fd_(o.fd_) { o.fd_ = -1; }
  Fd& operator=(Fd&& o) noexcept {
    if (this != &o) {
      reset();
      fd_ = o.fd_;
      o.fd_ = -1;
    }
    return *this;
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  ~Fd() { reset(); }
  int get() const { return fd_; }
  void reset() {
    if (fd_ >= 0) close(fd_);
    fd_ = -1;
  }

 private:
  int fd_;
};

// Syncs the directory open (O_PATH) as `dir`.
Status SyncDirFd(const Fd& dir, const std::string& name) {
  // fsync needs a descriptor opened for reading; O_PATH ones are reopened through /proc.
  std::string proc = "/proc/self/fd/" + std::to_string(dir.get());
  int fd = open(proc.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return ErrnoError(errno, "open directory " + name);
  int rc = fsync(fd);
  int err = errno;
  close(fd);
  return rc == 0 ? Status::OK() : ErrnoError(err, "fsync directory " + name);
}

// While it lives, this thread's filesystem ids (and supplementary groups) are the caller's, so the
// kernel checks the caller's permissions and makes new entries the caller's. Only when the daemon is
// root and the caller is not (otherwise it acts as itself: a daemon of one user cannot act as
// another, and a root caller is the daemon's own kind). Raw syscalls: glibc's setgroups would change
// every thread of the process.
class ActAs {
 public:
  explicit ActAs(const WriteCaller& as) {
    if (as.uid == 0 || geteuid() != 0) return;
    int n = static_cast<int>(syscall(SYS_getgroups, 0, nullptr));
    if (n > 0) {
      saved_groups_.resize(static_cast<size_t>(n));
      n = static_cast<int>(syscall(SYS_getgroups, n, saved_groups_.data()));
      saved_groups_.resize(n > 0 ? static_cast<size_t>(n) : 0);
    }
    std::vector<gid_t> groups(as.groups.begin(), as.groups.end());
    if (groups.size() > 65536) groups.resize(65536);
    syscall(SYS_setgroups, groups.size(), groups.data());
    syscall(SYS_setfsgid, as.gid);
    syscall(SYS_setfsuid, as.uid);
    active_ = true;
  }
  ~ActAs() {
    if (!active_) return;
    syscall(SYS_setfsuid, 0);
    syscall(SYS_setfsgid, getegid());
    syscall(SYS_setgroups, saved_groups_.size(), saved_groups_.data());
  }
  ActAs(const ActAs&) = delete;
  ActAs& operator=(const ActAs&) = delete;

 private:
  bool active_ = false;
  std::vector<gid_t> saved_groups_;
};

// A new file written beside its target and renamed over it at Commit, both in the directory `dir`
// (found without following links when the writer was made), acting for the writer.
// A utimensat time: nanoseconds since the epoch, or UTIME_OMIT when not set.
timespec TimespecOf(const std::optional<int64_t>& ns) {
  timespec t{};
  if (!ns) {
    t.tv_nsec = UTIME_OMIT;
    return t;
  }
  t.tv_sec = static_cast<time_t>(*ns / 1'000'000'000);
  t.tv_nsec = static_cast<long>(*ns % 1'000'000'000);
  if (t.tv_nsec < 0) {
    t.tv_nsec += 1'000'000'000;
    t.tv_sec -= 1;
  }
  return t;
}

class LocalWriter : public UfsWriter {
 public:
  LocalWriter(std::string full, Fd dir, std::string temp, int fd, std::string name, WriteCaller as)
      : full_(std::move(full)), dir_(std::move(dir)), temp_(std::move(temp)), fd_(fd), name_(std::move(name)),
        as_(std::move(as)) {}
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
    int rc, err;
    {
      ActAs acting(as_);
      rc = renameat(dir_.get(), temp_.c_str(), dir_.get(), name_.c_str());
      err = errno;
    }
    if (rc != 0) {
      Status s = ErrnoError(err, "rename into " + full_);
      Abort();
      return s;
    }
    close(fd_);
    fd_ = -1;
    RETURN_IF_ERROR(SyncDirFd(dir_, full_.substr(0, full_.rfind('/'))));
    return EntryOf(name_, st);  // the stat of the file now at full_: rename keeps inode and mtime
  }

  void Abort() override {
    if (fd_ < 0) return;
    close(fd_);
    fd_ = -1;
    ActAs acting(as_);
    unlinkat(dir_.get(), temp_.c_str(), 0);
  }

  // On the temporary file, as the writer: the kernel's own checks (chown to another owner needs
  // the writer to be root) decide what it may set, as for a chmod/chown/utimes of its own file.
  Status SetAttrs(const UfsAttrChange& change) override {
    if (fd_ < 0) return FailedPreconditionError("setattr of " + full_ + " after it was committed or aborted");
    ActAs acting(as_);
    if (change.uid || change.gid) {
      uid_t u = change.uid ? static_cast<uid_t>(*change.uid) : static_cast<uid_t>(-1);
      gid_t g = change.gid ? static_cast<gid_t>(*change.gid) : static_cast<gid_t>(-1);
      if (fchown(fd_, u, g) != 0) return ErrnoError(errno, "chown " + full_);
    }
    if (change.mode && fchmod(fd_, static_cast<mode_t>(*change.mode & 07777)) != 0) {
      return ErrnoError(errno, "chmod " + full_);
    }
    if (change.atime_ns || change.mtime_ns) {
      timespec times[2] = {TimespecOf(change.atime_ns), TimespecOf(change.mtime_ns)};
      if (futimens(fd_, times) != 0) return ErrnoError(errno, "set the times of " + full_);
    }
    return Status::OK();
  }

 private:
  const std::string full_;
  const Fd dir_;
  const std::string temp_;
  int fd_;
  const std::string name_;
  const WriteCaller as_;
};

// The directory that holds `path`'s last component, found by a walk from `root` that follows no
// symbolic link (each component opened O_PATH | O_NOFOLLOW and checked to be a directory), and
// that component. Acting for the caller (ActAs): the walk needs the caller's search permission.
StatusOr<std::pair<Fd, std::string>> OpenParent(const std::string& root, const std::string& path) {
  RETURN_IF_ERROR(CheckRelativePath(path));
  if (path.empty()) return InvalidArgumentError("the mount's root directory cannot be written as an entry");
  Fd dir(open(root.c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC));
  if (dir.get() < 0) return ErrnoError(errno, "open the under-storage directory " + root);
  size_t start = 0;
  for (;;) {
    size_t slash = path.find('/', start);
    if (slash == std::string::npos) return std::make_pair(std::move(dir), path.substr(start));
    const std::string part = path.substr(start, slash - start);
    const std::string so_far = root + "/" + path.substr(0, slash);
    Fd next(openat(dir.get(), part.c_str(), O_PATH | O_NOFOLLOW | O_CLOEXEC));
    if (next.get() < 0) return ErrnoError(errno, "open directory " + so_far);
    struct stat st;
    if (fstat(next.get(), &st) != 0) return ErrnoError(errno, "stat " + so_far);
    if (S_ISLNK(st.st_mode)) {
      return PermissionDeniedError(so_far + " is a symbolic link in the under-storage: writes through Granary never "
                                   "follow links (replace the link by a directory to write below it)");
    }
    if (!S_ISDIR(st.st_mode)) return Status(Code::kFailedPrecondition, so_far + " is not a directory");
    dir = std::move(next);
    start = slash + 1;
  }
}

}  // namespace

StatusOr<std::unique_ptr<UfsWriter>> LocalUfs::Create(const std::string& path, uint32_t mode, const WriteCaller& as) {
  ASSIGN_OR_RETURN(std::string full, FullPath(path));
  if (path.empty()) return InvalidArgumentError("cannot write the mount's root directory as a file");
  ActAs acting(as);
  ASSIGN_OR_RETURN(auto parent, OpenParent(root_, path));
  thread_local std::mt19937_64 rng(std::random_device{}());
  char suffix[17];
  std::snprintf(suffix, sizeof suffix, "%016llx", static_cast<unsigned long long>(rng()));
  std::string temp = std::string(kWritingPrefix) + suffix;
  int fd = openat(parent.first.get(), temp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC,
                  static_cast<mode_t>(mode & 07777));
  if (fd < 0) return ErrnoError(errno, "create " + full);
  if (fchmod(fd, static_cast<mode_t>(mode & 07777)) != 0) {  // not narrowed by the daemon's umask
    Status s = ErrnoError(errno, "chmod " + full);
    close(fd);
    unlinkat(parent.first.get(), temp.c_str(), 0);
    return s;
  }
  return std::unique_ptr<UfsWriter>(
      new LocalWriter(full, std::move(parent.first), temp, fd, parent.second, as));
}

bool LocalUfs::CanAdopt(uint64_t dev) const {
  struct stat st;
  return ::stat(root_.c_str(), &st) == 0 && static_cast<uint64_t>(st.st_dev) == dev;
}

StatusOr<UfsEntry> LocalUfs::Adopt(const std::string& path, int fd, uint64_t size, uint32_t mode,
                                   const UfsAttrChange& attrs, const WriteCaller& as) {
  ASSIGN_OR_RETURN(std::string full, FullPath(path));
  if (path.empty()) return InvalidArgumentError("cannot write the mount's root directory as a file");
  struct stat st;
  if (fstat(fd, &st) != 0) return ErrnoError(errno, "stat the staging file of " + full);
  if (!CanAdopt(static_cast<uint64_t>(st.st_dev)) || static_cast<uint64_t>(st.st_size) != size || st.st_nlink != 1) {
    return UnimplementedError("the staging file of " + full + " cannot be linked in");
  }
  std::pair<Fd, std::string> parent;
  {
    ActAs acting(as);
    ASSIGN_OR_RETURN(parent, OpenParent(root_, path));
  }
  struct stat dir;
  if (fstat(parent.first.get(), &dir) != 0) return ErrnoError(errno, "stat the directory of " + full);
  // The writer's file, as Create would make it: its owner, the directory's group below a setgid
  // one (a daemon that is not root acts as itself, as ActAs does: the file stays its own).
  if (geteuid() == 0 && as.uid != 0) {
    const gid_t group = (dir.st_mode & S_ISGID) ? dir.st_gid : static_cast<gid_t>(as.gid);
    if (fchown(fd, static_cast<uid_t>(as.uid), group) != 0) return ErrnoError(errno, "chown the staging file of " + full);
  } else if ((dir.st_mode & S_ISGID) && fchown(fd, static_cast<uid_t>(-1), dir.st_gid) != 0) {
    return UnimplementedError("the staging file of " + full + " cannot take its directory's group: copied instead");
  }
  if (fchmod(fd, static_cast<mode_t>(mode & 07777)) != 0) return ErrnoError(errno, "chmod the staging file of " + full);
  thread_local std::mt19937_64 rng(std::random_device{}());
  char suffix[17];
  std::snprintf(suffix, sizeof suffix, "%016llx", static_cast<unsigned long long>(rng()));
  const std::string temp = std::string(kWritingPrefix) + suffix;
  const std::string self = "/proc/self/fd/" + std::to_string(fd);
  {
    ActAs acting(as);
    if (linkat(AT_FDCWD, self.c_str(), parent.first.get(), temp.c_str(), AT_SYMLINK_FOLLOW) != 0) {
      return ErrnoError(errno, "create " + full);
    }
  }
  auto undo = [&](Status s) {
    ActAs acting(as);
    unlinkat(parent.first.get(), temp.c_str(), 0);
    return s;
  };
  if (attrs.mode || attrs.uid || attrs.gid || attrs.atime_ns || attrs.mtime_ns) {
    ActAs acting(as);
    Status set;
    if (attrs.uid || attrs.gid) {
      if (fchown(fd, attrs.uid ? static_cast<uid_t>(*attrs.uid) : static_cast<uid_t>(-1),
                 attrs.gid ? static_cast<gid_t>(*attrs.gid) : static_cast<gid_t>(-1)) != 0) {
        set = ErrnoError(errno, "chown " + full);
      }
    }
    if (attrs.mode && fchmod(fd, static_cast<mode_t>(*attrs.mode & 07777)) != 0) set = ErrnoError(errno, "chmod " + full);
    if (attrs.atime_ns || attrs.mtime_ns) {
      timespec times[2] = {TimespecOf(attrs.atime_ns), TimespecOf(attrs.mtime_ns)};
      if (futimens(fd, times) != 0) set = ErrnoError(errno, "set the times of " + full);
    }
    if (!set.ok()) spdlog::warn("{}: the mode, owner or times set while it was written were not kept: {}", full, set.ToString());
  }
  if (fsync(fd) != 0) return undo(ErrnoError(errno, "fsync " + full));
  if (fstat(fd, &st) != 0) return undo(ErrnoError(errno, "stat " + full));
  {
    ActAs acting(as);
    if (renameat(parent.first.get(), temp.c_str(), parent.first.get(), parent.second.c_str()) != 0) {
      Status s = ErrnoError(errno, "rename into " + full);
      unlinkat(parent.first.get(), temp.c_str(), 0);
      return s;
    }
    // The same file was already there (a staged upload made again after a restart): rename then
    // does nothing and leaves the temporary name.
    unlinkat(parent.first.get(), temp.c_str(), 0);
  }
  RETURN_IF_ERROR(SyncDirFd(parent.first, ParentDir(full)));
  return EntryOf(parent.second, st);
}

// Each call below acts for the caller (ActAs) while it resolves and changes names; the directory's
// fsync after it is the daemon's own.
Status LocalUfs::Remove(const std::string& path, const WriteCaller& as) {
  ASSIGN_OR_RETURN(std::string full, FullPath(path));
  Fd dir;
  {
    ActAs acting(as);
    ASSIGN_OR_RETURN(auto parent, OpenParent(root_, path));
    struct stat st;
    if (fstatat(parent.first.get(), parent.second.c_str(), &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISDIR(st.st_mode)) {
      return InvalidArgumentError(full + " is a directory");
    }
    if (unlinkat(parent.first.get(), parent.second.c_str(), 0) != 0) return ErrnoError(errno, "remove " + full);
    dir = std::move(parent.first);
  }
  return SyncDirFd(dir, ParentDir(full));
}

Status LocalUfs::MakeDir(const std::string& path, uint32_t mode, const WriteCaller& as) {
  ASSIGN_OR_RETURN(std::string full, FullPath(path));
  Fd dir;
  {
    ActAs acting(as);
    ASSIGN_OR_RETURN(auto parent, OpenParent(root_, path));
    const char* name = parent.second.c_str();
    if (mkdirat(parent.first.get(), name, static_cast<mode_t>(mode & 07777)) != 0) {
      return ErrnoError(errno, "make directory " + full);
    }
    // The mode asked for, not narrowed by the daemon's umask: on the directory just made, found
    // again without following a link (it may have been swapped meanwhile).
    Fd made(openat(parent.first.get(), name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
    if (made.get() >= 0) static_cast<void>(fchmod(made.get(), static_cast<mode_t>(mode & 07777)));
    dir = std::move(parent.first);
  }
  return SyncDirFd(dir, ParentDir(full));
}

Status LocalUfs::RemoveDir(const std::string& path, const WriteCaller& as) {
  ASSIGN_OR_RETURN(std::string full, FullPath(path));
  if (path.empty()) return InvalidArgumentError("cannot remove the mount's root directory");
  Fd dir;
  {
    ActAs acting(as);
    ASSIGN_OR_RETURN(auto parent, OpenParent(root_, path));
    if (unlinkat(parent.first.get(), parent.second.c_str(), AT_REMOVEDIR) != 0) {
      return ErrnoError(errno, "remove directory " + full);
    }
    dir = std::move(parent.first);
  }
  return SyncDirFd(dir, ParentDir(full));
}

Status LocalUfs::Rename(const std::string& from, const std::string& to, const WriteCaller& as) {
  ASSIGN_OR_RETURN(std::string a, FullPath(from));
  ASSIGN_OR_RETURN(std::string b, FullPath(to));
  if (from.empty() || to.empty()) return InvalidArgumentError("cannot rename the mount's root directory");
  Fd da, db;
  {
    ActAs acting(as);
    ASSIGN_OR_RETURN(auto pa, OpenParent(root_, from));
    ASSIGN_OR_RETURN(auto pb, OpenParent(root_, to));
    if (renameat(pa.first.get(), pa.second.c_str(), pb.first.get(), pb.second.c_str()) != 0) {
      return ErrnoError(errno, "rename " + a + " to " + b);
    }
    da = std::move(pa.first);
    db = std::move(pb.first);
  }
  RETURN_IF_ERROR(SyncDirFd(db, ParentDir(b)));
  return ParentDir(a) == ParentDir(b) ? Status::OK() : SyncDirFd(da, ParentDir(a));
}

Status LocalUfs::SetAttr(const std::string& path, const UfsAttrChange& change, const WriteCaller& as) {
  ASSIGN_OR_RETURN(std::string full, FullPath(path));
  ActAs acting(as);
  Fd target;
  if (path.empty()) {
    target = Fd(open(root_.c_str(), O_PATH | O_CLOEXEC));
  } else {
    ASSIGN_OR_RETURN(auto parent, OpenParent(root_, path));
    target = Fd(openat(parent.first.get(), parent.second.c_str(), O_PATH | O_NOFOLLOW | O_CLOEXEC));
  }
  if (target.get() < 0) return ErrnoError(errno, "open " + full);
  struct stat st;
  if (fstat(target.get(), &st) != 0) return ErrnoError(errno, "stat " + full);
  if (S_ISLNK(st.st_mode)) return PermissionDeniedError(full + " is a symbolic link: Granary changes no link");
  // The calls below take a path; /proc/self/fd/N names the inode found above, not a path to walk.
  const std::string self = "/proc/self/fd/" + std::to_string(target.get());
  if (change.uid || change.gid) {
    uid_t u = change.uid ? static_cast<uid_t>(*change.uid) : static_cast<uid_t>(-1);
    gid_t g = change.gid ? static_cast<gid_t>(*change.gid) : static_cast<gid_t>(-1);
    if (fchownat(target.get(), "", u, g, AT_EMPTY_PATH) != 0) return ErrnoError(errno, "chown " + full);
  }
  if (change.mode && chmod(self.c_str(), static_cast<mode_t>(*change.mode & 07777)) != 0) {
    return ErrnoError(errno, "chmod " + full);
  }
  if (change.atime_ns || change.mtime_ns) {
    timespec times[2] = {TimespecOf(change.atime_ns), TimespecOf(change.mtime_ns)};
    if (utimensat(AT_FDCWD, self.c_str(), times, 0) != 0) return ErrnoError(errno, "set the times of " + full);
  }
  return Status::OK();
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
