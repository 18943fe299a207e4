#include "fuse/superblock_mode.h"

#include <fcntl.h>
#include <sys/mount.h>
#include <unistd.h>

#include <cerrno>
#include <fstream>
#include <optional>
#include <sstream>

#include <spdlog/spdlog.h>

namespace granary::fuse {

StatusOr<bool> SuperblockMode::ReadOnlyNow(const std::string& mountpoint) {
  // mountinfo: ID PARENT MAJ:MIN ROOT MOUNTPOINT MOUNT-OPTIONS [OPTIONAL...] - TYPE SOURCE SUPER-OPTIONS
  // (a mount point with spaces is escaped as \040; granary's never has one it needs to match here).
  std::ifstream in("/proc/self/mountinfo");
  std::string line;
  std::optional<bool> found;
  while (std::getline(in, line)) {
    std::istringstream f(line);
    std::string id, parent, dev, root, mp;
    if (!(f >> id >> parent >> dev >> root >> mp) || mp != mountpoint) continue;
    size_t dash = line.find(" - ");
    if (dash == std::string::npos) continue;
    std::istringstream tail(line.substr(dash + 3));
    std::string type, source, super;
    if (!(tail >> type >> source >> super)) continue;
    found = super == "ro" || super.rfind("ro,", 0) == 0;  // the last mount there wins
  }
  if (!found) return NotFoundError("no mount at " + mountpoint + " in /proc/self/mountinfo");
  return *found;
}

Status SuperblockMode::SetReadOnly(const std::string& mountpoint, bool read_only) {
  int fd = fspick(AT_FDCWD, mountpoint.c_str(), FSPICK_CLOEXEC | FSPICK_NO_AUTOMOUNT);
  if (fd < 0) return ErrnoError(errno, "fspick " + mountpoint);
  Status st;
  if (fsconfig(fd, FSCONFIG_SET_FLAG, read_only ? "ro" : "rw", nullptr, 0) != 0) {
    st = ErrnoError(errno, std::string("fsconfig ") + (read_only ? "ro " : "rw ") + mountpoint);
  } else if (fsconfig(fd, FSCONFIG_CMD_RECONFIGURE, nullptr, nullptr, 0) != 0) {
    st = ErrnoError(errno, "reconfigure the superblock of " + mountpoint);
  }
  close(fd);
  return st;
}

void SuperblockMode::Arm(const std::string& mountpoint) {
  MutexLock lock(&mu_);
  mountpoint_ = mountpoint;
}

void SuperblockMode::Adopt(const std::string& mountpoint, bool open_free) {
  MutexLock lock(&mu_);
  mountpoint_ = mountpoint;
  open_free_ = open_free;
  tried_read_only_ = true;  // the predecessor decided; only a writable dataset changes it now
  auto ro = ReadOnlyNow(mountpoint);
  if (!ro.ok()) {
    // Taken as read-only: the first writable attribute then asks for writable, which is harmless
    // if it already is; taken as writable, a read-only superblock would never be made writable.
    spdlog::warn("the mount's read-only state is unknown ({}); it is made writable when a writable dataset is shown",
                 ro.status().message());
    read_only_ = true;
    return;
  }
  read_only_ = *ro || open_free;
}

void SuperblockMode::SetReplacer(std::function<Status()> replace) {
  MutexLock lock(&mu_);
  replace_ = std::move(replace);
}

bool SuperblockMode::GoOpenFree(std::atomic<bool>* conn_flag) {
  if (writable_seen_.load(std::memory_order_relaxed)) return false;
  MutexLock lock(&mu_);
  if (open_free_) {
    *conn_flag = true;
    return true;
  }
  if (mountpoint_.empty() || !replace_ || writable_seen_ || tried_read_only_) return false;
  tried_read_only_ = true;
  if (!read_only_) {
    Status st = SetReadOnly(mountpoint_, true);
    if (!st.ok()) {
      spdlog::info("the mount keeps asking granary-fuse at every open: {}", st.message());
      return false;
    }
  }
  read_only_ = true;
  open_free_ = true;
  *conn_flag = true;  // before a writable attribute can replace the connection (it takes mu_)
  spdlog::info("no dataset this mount shows is writable: the kernel opens files by itself (no OPEN request) "
               "until one is");
  return true;
}

void SuperblockMode::OnPassthroughOpen() {
  if (read_only_.load(std::memory_order_relaxed) || writable_seen_.load(std::memory_order_relaxed)) return;
  MutexLock lock(&mu_);
  if (mountpoint_.empty() || tried_read_only_ || writable_seen_) return;
  tried_read_only_ = true;
  Status st = SetReadOnly(mountpoint_, true);
  if (!st.ok()) {
    spdlog::info("the mount stays writable: {}", st.message());
    return;
  }
  read_only_ = true;
  spdlog::info("no dataset this mount shows is writable: its superblock is read-only until one is "
               "(passthrough reads then cost no attribute requests)");
}

void SuperblockMode::NoteWritable() {
  if (writable_seen_.load(std::memory_order_relaxed)) return;
  MutexLock lock(&mu_);  // a caller beside one replacing the connection waits here until it is done
  if (writable_seen_) return;
  if (!read_only_) {
    writable_seen_ = true;
    return;
  }
  if (open_free_) {
    // An open-free connection cannot take writes: a fresh one takes the mount point.
    if (replace_failed_) return;
    if (!replace_) {
      replace_failed_ = true;
      spdlog::error("a writable dataset is shown, but this connection opens files without asking granary-fuse and "
                    "cannot be replaced here (it needs root, Linux >= 6.5 and fuse.transport dev); writes get EROFS "
                    "until granary-fuse is restarted");
      return;
    }
    Status st = replace_();
    if (!st.ok() && st.code() == Code::kUnavailable) {
      // A hand-over or a stop under way: the next writable attribute tries again (a successor
      // adopts this connection as it is, open-free, and replaces it itself).
      spdlog::warn("a writable dataset is shown, but the FUSE connection cannot be replaced now ({}); the next "
                   "lookup there tries again",
                   st.message());
      return;
    }
    if (!st.ok()) {
      replace_failed_ = true;  // once: a later attribute does not try again
      spdlog::error("a writable dataset is shown but no new FUSE connection could take the mount point: {}; writes "
                    "get EROFS until granary-fuse is restarted",
                    st.message());
      return;
    }
    open_free_ = false;
    read_only_ = false;
    writable_seen_ = true;
    spdlog::info("a writable dataset is shown: a new FUSE connection, which asks granary-fuse at every open, serves "
                 "the mount point");
    return;
  }
  Status st = SetReadOnly(mountpoint_, false);
  writable_seen_ = true;
  if (!st.ok()) {
    spdlog::error("a writable dataset is shown but the mount cannot be made writable: {}; writes get EROFS until "
                  "granary-fuse is restarted",
                  st.message());
    return;
  }
  read_only_ = false;
  spdlog::info("a writable dataset is shown: the mount's superblock is writable again");
}

}  // namespace granary::fuse
