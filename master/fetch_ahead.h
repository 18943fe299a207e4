// FetchAhead: when readers read a mount like an epoch, the workers fetch the rest of it ahead of
// them, so a cold epoch runs at the link's speed instead of one store round trip per file.
//
// Design
// ------
// The evidence is the opens granary-fuse reports: its GetFile calls (it asks for a file's info
// when a reader first opens it; its FileCache then answers for fuse.attr_timeout), and its
// NoteOpens batches, the first open of each file whose info came with a listing or a lookup
// (fuse/open_notes.h). So each is a reader opening a file cold or after a while. Lookups, listings
// (`ls`) and attributes themselves are no evidence.
// Per mount, FetchAhead remembers the distinct files opened (by inode), their bytes, how many in
// each directory, and the scope: the deepest directory holding every directory in which readers
// opened at least `dir_files` (2) files — a single file opened elsewhere (a README, one shard
// read beside an image epoch) does not widen it. Nothing starts before `start_files` (16)
// distinct files were opened: one file read, or an `ls`, starts nothing.
//
// Then it submits a load job of the scope with spec.fetch_ahead set (master/jobs.h) — the same
// walk, batches and per-block placement as `granary load`, so each block is fetched once, by its
// home worker; a load is a fetch-ahead that was asked for. What a fetch-ahead job differs in:
//   - its own runner: it never waits behind a user's load, nor a load behind it;
//   - a gate before every batch (Admit): the bytes it fetched, plus those in flight, stay within
//     `growth` (8) × the bytes readers opened in the scope. The allowance widens as the evidence grows,
//     so a 10 TB mount is never pulled because someone opened its README and a few files; an epoch
//     reading at full speed grows it faster than the link can fill it;
//   - when the scope widens (readers open files in a sibling directory), the job is cancelled and
//     one for the wider scope starts (what the first fetched is found cached and skipped);
//   - it stops when the readers stop (no new file for `idle`, 10 s), when a worker finds no free room
//     (fetch-ahead never evicts: not what the policy protects, not the shuffle policy's fixed
//     subset), and when it walked the whole scope; a stopped-for-room mount waits `no_room_pause` (60 s)
//     before it tries again;
//   - the workers fetch its blocks at the pace their FetchPacer allows (measured bandwidth and
//     latency; demand misses first; worker/fetch_pacer.h), within the mount's
//     cache.fetch_ahead.inflight and cache.fetch_ahead.bandwidth;
//   - it is not resumed after a master restart (the readers' next opens start a new one).
// A mount with cache.fetch_ahead=false is never fetched ahead.
//
// Thread-safe. Opened() is on the GetFile and NoteOpens paths: a lock, a hash-set insert, no I/O (the first call
// for a mount reads its options once). Jobs are submitted from FetchAhead's own thread.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <thread>
#include <unordered_set>
#include <vector>

#include "common/thread_annotations.h"
#include "master/jobs.h"
#include "master/namespace.h"
#include "proto/granary.pb.h"

namespace granary::master {

struct FetchAheadOptions {
  size_t start_files = 16;  // distinct files opened in a mount before anything is fetched
  double growth = 8;        // bytes fetched ahead per byte opened in the scope
  std::chrono::milliseconds idle{10000};           // no new file opened: the readers stopped
  std::chrono::milliseconds no_room_pause{60000};  // after a job stopped for want of room
  size_t max_tracked = 4u << 20;  // distinct files remembered per mount (beyond: counted once more)
  size_t dir_files = 2;           // files opened in a directory before it widens the scope
};


// What readers opened in one mount since they last paused: the evidence fetch-ahead acts on. Pure
// bookkeeping (no clock, no I/O), so its rules are unit-tested (tests/master/fetch_ahead_test.cc).
class ReadEvidence {
 public:
  explicit ReadEvidence(const FetchAheadOptions& opts) : opts_(opts) {}
  // A reader opened file `ino` (`size` bytes at `ufs_path`, relative to the mount); false when it
  // had been opened already (no new evidence).
  bool Opened(uint64_t ino, uint64_t size, const std::string& ufs_path);
  void Reset();
  uint64_t files() const { return files_; }
  uint64_t bytes() const { return bytes_; }
  // Enough to act on: `start_files` distinct files, and a directory with `dir_files` of them.
  bool Ready() const { return have_dir_ && files_ >= opts_.start_files; }
  // The scope, in components below the mount: the deepest directory holding every directory in
  // which `dir_files` files were opened ({} is the mount itself). Meaningful once Ready().
  const std::vector<std::string>& scope() const { return dir_; }

 private:
  FetchAheadOptions opts_;
  std::unordered_set<uint64_t> seen_;
  std::map<std::string, uint32_t> dir_opened_;  // files opened per directory (ufs path)
  uint64_t files_ = 0, bytes_ = 0;
  bool have_dir_ = false;
  std::vector<std::string> dir_;
};

class FetchAhead {
 public:
  using Clock = std::function<std::chrono::steady_clock::time_point()>;
  using Options = FetchAheadOptions;

  FetchAhead(Namespace* ns, JobManager* jobs, Options opts = Options(), Clock clock = nullptr);
  ~FetchAhead();
  // Installs the job manager's hooks and starts the thread; Stop() ends it.
  void Start();
  void Stop();

  // A reader opened `f` (the master answered GetFile for it).
  void Opened(const rpc::FileInfo& f);

  struct MountStatus {
    uint64_t mount_id = 0;
    std::string path;   // the mount's namespace path
    std::string scope;  // the namespace directory being fetched ahead ("" while none)
    uint64_t files_opened = 0, bytes_opened = 0;  // the evidence since the readers last paused
    uint64_t job = 0;                             // the running fetch-ahead job (0: none)
    bool enabled = true;                          // cache.fetch_ahead
  };
  std::vector<MountStatus> Mounts() const;

 private:
  static constexpr uint64_t kSubmitting = ~uint64_t{0};  // Mount::job while Step() submits it
  struct Mount {
    bool known = false;
    bool enabled = true;
    uint64_t bandwidth = 0;
    uint32_t inflight = 0;
    std::string path;
    explicit Mount(const FetchAheadOptions& o) : evidence(o) {}
    ReadEvidence evidence;
    std::chrono::steady_clock::time_point last_new{};
    uint64_t job = 0;
    std::string job_scope;
    uint64_t prior_fetched = 0;  // bytes earlier jobs of this evidence fetched
    std::string finished_scope;  // a scope walked to its end (not started again until the evidence resets)
    std::chrono::steady_clock::time_point paused_until{};
  };
  std::string ScopeLocked(const Mount& m) const REQUIRES(mu_);
  JobManager::AheadVerdict Admit(uint64_t job, uint64_t sent, std::string* why);
  void Ended(const rpc::LoadJob& job);
  void Loop();
  void Step();

  Namespace* ns_;
  JobManager* jobs_;
  Options opts_;
  Clock clock_;
  mutable Mutex mu_;
  std::condition_variable cv_;
  std::map<uint64_t, Mount> mounts_ GUARDED_BY(mu_);
  Mount& MountLocked(uint64_t id) REQUIRES(mu_);
  std::map<uint64_t, uint64_t> retired_ GUARDED_BY(mu_);  // job replaced by a wider one -> its mount
  bool stop_ GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace granary::master
