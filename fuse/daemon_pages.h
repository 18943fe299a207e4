// DaemonPages: daemon mode's page-cache rule (fuse.open=daemon, and passthrough opens granary-fuse
// serves through the page cache). The kernel drops a file's cached pages at each open unless the
// open reply says keep_cache; granary-fuse says it only when the pages can be of the version being
// opened: the one the file was last opened at. An open of another version drops them, and a read
// that finds the under-storage changed (ESTALE) forgets the file, so its next open drops them too.
//
// At most `capacity` files are remembered (the oldest half forgotten when full): a forgotten file's
// next open re-reads its pages, never keeps wrong ones. Thread-safe.
#pragma once

#include <cstdint>
#include <string>

#include "common/bounded_map.h"
#include "common/thread_annotations.h"

namespace granary::fuse {

class DaemonPages {
 public:
  explicit DaemonPages(size_t capacity) : versions_(capacity) {}

  // An open of master inode `ino` at `version`: whether the kernel may keep the file's pages (only
  // when `allowed`, fuse.keep_cache). The file is remembered at `version` either way.
  bool Open(uint64_t ino, const std::string& version, bool allowed) EXCLUDES(mu_) {
    MutexLock lock(&mu_);
    std::string* seen = versions_.TryEmplace(ino, "").first;
    if (seen == nullptr) return false;  // capacity 0: nothing is known of the pages
    const bool keep = allowed && *seen == version;
    *seen = version;
    return keep;
  }
  // The file changed under its readers: its next open drops its pages.
  void Forget(uint64_t ino) EXCLUDES(mu_) {
    MutexLock lock(&mu_);
    versions_.Erase(ino);
  }

 private:
  Mutex mu_;
  BoundedMap<uint64_t, std::string> versions_ GUARDED_BY(mu_);  // master ino -> version last opened
};

}  // namespace granary::fuse
