// PassthroughOpens: passthrough mode's backing files (fuse.open=passthrough) — which backing id an
// open gets, which inodes the kernel holds in which io mode, and which backing files are kept
// after their last close. The rules live here, apart from the kernel: what it needs from the rest
// of granary-fuse (a lease, the kernel's backing-id ioctl, the keeper) comes through BackingHost,
// so tests/fuse/passthrough_test.cc drives it with a fake host and clock.
//
// Design
// ------
// A file wholly cached on this node's worker is opened on its cache data file: the worker leases
// the file (no eviction or move while leased; fuse/client.h) and the kernel gets a backing id for
// it, one per inode, shared by the inode's opens (InodeOpens). The kernel keeps an inode in one io
// mode — every open passthrough on the same backing file, or every open cached — and fails an open
// that asks for the other one (ETXTBSY), so an open follows the mode its inode is in: a new version
// while the old one is open in passthrough is served by granary-fuse with direct_io, and an inode
// with a daemon-served open ("cached") stays daemon-served until those opens close.
//
// When the last open of an inode closes, its backing id and lease are kept (idle), so the next
// epoch's reopen costs one OPEN round trip instead of a lease and an ioctl. Kept files are let go
// past kIdleBackingFiles or kIdleBackingBytes, and once idle longer than `keep_for`
// (fuse.attr_timeout): at opens and releases, and from Trim (once a second, fuse/fs_state.h).
//
// The bookkeeping is done under `mu`. The lease and the ioctl are made between two locked
// sections, so Open looks again afterwards (another open may have got there first). Leases end
// after the lock is released. The keeper hears of a backing id before the kernel sees it and before
// it is closed (BackingHost::Announce, BackingHost::Drop; fuse/handover.h says why).
//
// Thread-safety: every method is thread-safe. `mu` is public for the hand-over's Snapshot, which
// reads the table beside the open handles (lock order: OpenHandles::mu -> mu -> the host's own locks).
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "common/status.h"
#include "common/thread_annotations.h"
#include "fuse/client.h"
#include "proto/granary.pb.h"

namespace granary::fuse {

// Closed files whose backing file is kept, at most this many and this many bytes of files.
inline constexpr size_t kIdleBackingFiles = 4096;
inline constexpr uint64_t kIdleBackingBytes = 1ull << 30;

// What is open on one inode (by kernel inode number).
struct InodeOpens {
  int passthrough = 0;  // open files reading from `lease` through the kernel
  int cached = 0;       // open files served by granary-fuse through the page cache
  std::string version;  // the version `lease` holds
  int backing_id = 0;
  rpc::FileInfo info;   // the file `lease` holds (for a successor, fuse/handover.h)
  std::unique_ptr<FileLease> lease;  // null after a hand-over whose re-lease failed
  uint64_t bytes = 0;   // the file's size
  // Closed, but its backing file kept for a reopen (in the idle list at this sequence number; 0: not).
  uint64_t idle_seq = 0;
  std::chrono::steady_clock::time_point idle_since{};
};

// What PassthroughOpens needs from granary-fuse. Called with PassthroughOpens::mu held, except
// Lease and Register, which are called without it.
class BackingHost {
 public:
  virtual ~BackingHost() = default;
  // A lease of `info`'s whole cache data file on this node's worker (fails when not wholly here).
  virtual StatusOr<std::unique_ptr<FileLease>> Lease(const rpc::FileInfo& info) = 0;
  // Registers a leased file with the kernel: its backing id (> 0). An error is taken as final:
  // passthrough is refused from then on.
  virtual StatusOr<int> Register(const FileLease& lease) = 0;
  // Closes a backing id no open file uses and nobody was told of (an open that lost a race).
  virtual void Unregister(int id) = 0;
  // A backing id of `kino` is about to be used (the keeper hears of it first).
  virtual void Announce(uint64_t kino, const InodeOpens& st) = 0;
  // A backing id of `kino` is let go (the keeper hears of it first, then it is closed).
  virtual void Drop(uint64_t kino, int id) = 0;
};

class PassthroughOpens {
 public:
  using Clock = std::function<std::chrono::steady_clock::time_point()>;
  // `keep_for`: how long a closed file's backing file is kept (fuse.attr_timeout). `now` may be a
  // fake clock (tests).
  PassthroughOpens(BackingHost* host, std::chrono::milliseconds keep_for, Clock now = nullptr);
  PassthroughOpens(const PassthroughOpens&) = delete;
  PassthroughOpens& operator=(const PassthroughOpens&) = delete;

  // What an open of a file is given.
  struct Choice {
    int backing_id = 0;      // > 0: opened on this backing id, counted as a passthrough open
    bool direct_io = false;  // served by granary-fuse without the page cache (not counted)
    bool cached = false;     // served by granary-fuse through the page cache, counted as cached
  };
  // An open of `info` on kernel inode `kino`, decided and counted in one step, so no other open
  // can put the inode in the other io mode in between. All three false: passthrough was refused
  // (refused()); the caller serves the open some other way (AddCached, if through the page cache).
  Choice Open(uint64_t kino, const rpc::FileInfo& info) EXCLUDES(mu);
  // Counts a daemon-served open of `kino` (the kernel's cached io mode); `tell` runs under `mu`
  // (the keeper hears of the handle in order).
  void AddCached(uint64_t kino, const std::function<void()>& tell = nullptr) EXCLUDES(mu);
  // Ends one open of `kino`: its RELEASE, or an open whose reply was interrupted. `passthrough`
  // and `cached` say how it was counted; `tell` runs under `mu`.
  void End(uint64_t kino, bool passthrough, bool cached, const std::function<void()>& tell = nullptr) EXCLUDES(mu);
  // Lets go of kept backing files past the bounds or older than keep_for.
  void Trim() EXCLUDES(mu);
  // Whether the kernel refused a backing file: from then on no open is passed through.
  bool refused() const;
  void SetRefused() { refused_ = true; }  // a successor whose predecessor was refused

  // The hand-over (fuse/mount_handover.cc). A successor adopts the predecessor's entries; a
  // predecessor that handed over, or a mount that ends, forgets them all (the backing ids are the
  // successor's, or gone with the connection).
  // An adopted entry without a lease (InodeOpens::lease null: the successor could not lease the
  // file again — freed, evicted or moved since) has nothing keeping the worker off its data file:
  // LetGoUnleased drops those no file is open on (their backing ids closed), and one with open
  // files serves them (and reopens beside them) and is dropped at its last close, never kept idle.
  void Adopt(uint64_t kino, InodeOpens o, bool idle) EXCLUDES(mu);
  void LetGoUnleased() EXCLUDES(mu);
  void Clear() EXCLUDES(mu);
  // The entries, for a snapshot: call with `mu` held.
  const std::unordered_map<uint64_t, InodeOpens>& entries() const REQUIRES(mu) { return opens_; }

  // For tests and metrics: the entry of `kino` (passthrough, cached, backing id, idle) and the
  // number of kept files.
  struct View {
    bool present = false;
    int passthrough = 0, cached = 0, backing_id = 0;
    bool idle = false;
    std::string version;
  };
  View Inspect(uint64_t kino) const EXCLUDES(mu);
  size_t idle_files() const EXCLUDES(mu);

  mutable Mutex mu;

 private:
  using Leases = std::vector<std::unique_ptr<FileLease>>;  // ended after `mu` is released
  void TrimLocked(Leases* done) REQUIRES(mu);
  void UnidleLocked(InodeOpens& st) REQUIRES(mu);
  void IdleLocked(uint64_t kino, InodeOpens& st) REQUIRES(mu);
  // An open that gets no backing file of its own: beside the passthrough opens of its version,
  // direct beside another version's, else counted as cached.
  static Choice JoinLocked(InodeOpens& st, const rpc::FileInfo& info);

  BackingHost* const host_;
  const std::chrono::milliseconds keep_for_;
  const Clock now_;
  std::atomic<bool> refused_{false};
  std::unordered_map<uint64_t, InodeOpens> opens_ GUARDED_BY(mu);  // kernel ino -> opens
  std::map<uint64_t, uint64_t> idle_ GUARDED_BY(mu);  // idle_seq -> kernel ino, oldest first
  uint64_t idle_bytes_ GUARDED_BY(mu) = 0;
  uint64_t idle_next_ GUARDED_BY(mu) = 1;
};

}  // namespace granary::fuse
