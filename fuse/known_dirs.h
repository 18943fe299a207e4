// KnownDirs: directories below writable mounts whose every name this node knows, for a short
// while: those it made itself (mkdir) and the names it put in them since (create, mkdir, rename).
//
// Why: a writer making many files (tar x, cp -r, shutil.copytree) makes each new name after a
// LOOKUP that finds nothing; below a writable mount the kernel remembers no such miss (another node
// may make the name), so every one would cost a master round trip. In a directory this node made
// less than kFresh ago, a name it did not put there is answered "no such entry" here.
//
// What it may miss: a name another node (or the store itself) put in such a directory during that
// window is unseen on this node until the window ends — the same bound as a writable directory's
// cached attributes and entries (docs/semantics.md, "Writes"). A name this node removed stays in
// the set: its lookup goes to the master, which answers. Never answers "missing" for a directory it
// was not told about, nor after kFresh.
//
// Bounded: at most kMaxDirs directories (all forgotten when full) of at most kMaxNames names each
// (a larger one is forgotten). Thread-safe.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <unordered_map>
#include <unordered_set>

#include "common/thread_annotations.h"

namespace granary::fuse {

class KnownDirs {
 public:
  using Clock = std::chrono::steady_clock;
  static constexpr std::chrono::milliseconds kFresh{1000};
  static constexpr size_t kMaxDirs = 4096;
  static constexpr size_t kMaxNames = 65536;

  // `dir` (a master inode) was made here just now: empty.
  void Made(uint64_t dir, Clock::time_point now = Clock::now()) EXCLUDES(mu_) {
    MutexLock lock(&mu_);
    if (dirs_.size() >= kMaxDirs) dirs_.clear();
    dirs_[dir] = Dir{now, {}};
  }
  // This node put `name` in `dir` (create, mkdir, rename).
  void Added(uint64_t dir, const std::string& name) EXCLUDES(mu_) {
    MutexLock lock(&mu_);
    auto it = dirs_.find(dir);
    if (it == dirs_.end()) return;
    if (it->second.names.size() >= kMaxNames) {
      dirs_.erase(it);
      return;
    }
    it->second.names.insert(name);
  }
  // `dir` is known and fresh, and `name` is not in it: no such entry, without asking the master.
  bool Missing(uint64_t dir, const std::string& name, Clock::time_point now = Clock::now()) EXCLUDES(mu_) {
    MutexLock lock(&mu_);
    auto it = dirs_.find(dir);
    if (it == dirs_.end()) return false;
    if (now - it->second.made >= kFresh) {
      dirs_.erase(it);
      return false;
    }
    return it->second.names.count(name) == 0;
  }
  // Nothing known of `dir` any more (removed, or renamed away).
  void Forget(uint64_t dir) EXCLUDES(mu_) {
    MutexLock lock(&mu_);
    dirs_.erase(dir);
  }

 private:
  struct Dir {
    Clock::time_point made;
    std::unordered_set<std::string> names;
  };
  Mutex mu_;
  std::unordered_map<uint64_t, Dir> dirs_ GUARDED_BY(mu_);
};

}  // namespace granary::fuse
