// SuperblockMode: a passthrough mount's superblock stays read-only until the mount shows a
// writable dataset.
//
// Why: the kernel ends every passthrough read by invalidating the FUSE inode's atime (unless the
// superblock is read-only), so the next fstat of that file — CPython's open() makes one — is a
// GETATTR round trip to granary-fuse: one per file per epoch, the row passthrough lost in
// bench/warm_read.sh (docs/benchmarks.md, session 43). fuse.writes=false mounts read-only from the
// start; with writes on (the default) the mount must take writes once a dataset is mounted
// writable, which most never are.
//
// How: only the superblock's flag changes (fspick + fsconfig reconfigure), never the mount point's,
// so copies of the mount made by propagation (a Kubernetes host path the training containers see)
// follow it: they share the superblock. The first passthrough OPEN makes the superblock read-only,
// before its reply (a read of that file on a writable superblock would leave its atime invalid),
// unless a writable attribute was seen; the first writable attribute seen (any LOOKUP, GETATTR or
// READDIRPLUS answer below a writable mount, ToStat) makes it writable again before that answer is
// sent, so the write that follows the path walk finds it writable. A dataset made writable while a
// node's kernel still holds its directories' entries becomes writable there at the next lookup of
// one (fuse.entry_timeout). Never read-only again once writable. A superblock that cannot be
// changed (a kernel without fspick, Linux < 5.2; files open for writing) stays as it is.
//
// Kernel mode (fuse.open kernel, writes on) uses the same switch for open-free connections
// (fuse/fs_state.h, Connection): its first read-only OPEN makes the superblock read-only and the
// connection answers OPEN ENOSYS from then on (GoOpenFree), unless a writable attribute was seen or
// no replacer was set. Such a connection can never take a write safely, so the first writable
// attribute seen then does not make the superblock writable: the replacer puts a fresh connection,
// whose superblock is writable, at the mount point instead (before that answer is sent).
//
// A successor of a hand-over reads the state from /proc/self/mountinfo (Adopt).
//
// Thread-safe. The replacer runs under this object's lock.
#pragma once

#include <atomic>
#include <functional>
#include <string>

#include "common/status.h"
#include "common/thread_annotations.h"

namespace granary::fuse {

class SuperblockMode {
 public:
  // Unarmed (Arm not called): does nothing.
  SuperblockMode() = default;
  // From now on the superblock of the FUSE mount at `mountpoint` may be made read-only.
  void Arm(const std::string& mountpoint) EXCLUDES(mu_);
  // A hand-over successor: armed, with the state the kernel has now; `open_free`: the predecessor
  // said its connection is open-free (FuseConnectionState.open_free), which is never made writable.
  void Adopt(const std::string& mountpoint, bool open_free = false) EXCLUDES(mu_);
  // Kernel mode: how to put a fresh connection at the mount point (FuseMountImpl::ReplaceConnection).
  // Without one no connection goes open-free. Set before the loop starts. UNAVAILABLE from it
  // (a hand-over or stop under way) is tried again at the next writable attribute; any other
  // failure leaves writes failing EROFS until a restart.
  void SetReplacer(std::function<Status()> replace) EXCLUDES(mu_);
  // Kernel mode, a read-only OPEN on the current connection: true when the connection is open-free
  // (from now on, or already): the superblock is read-only, and `*conn_flag` (the Connection's
  // open_free) is set before the lock is let go. False when a writable attribute was seen, the
  // superblock cannot be made read-only (files open for writing), or there is no replacer;
  // decided once per connection.
  bool GoOpenFree(std::atomic<bool>* conn_flag) EXCLUDES(mu_);
  // Read-only, unless a writable attribute was seen (or this was done already). Called before the
  // OPEN's reply.
  void OnPassthroughOpen() EXCLUDES(mu_);
  // A writable attribute is about to be answered: writable first.
  void NoteWritable() EXCLUDES(mu_);
  bool read_only() const { return read_only_.load(std::memory_order_relaxed); }

  // Whether the superblock of the mount at `mountpoint` is read-only, from /proc/self/mountinfo.
  static StatusOr<bool> ReadOnlyNow(const std::string& mountpoint);
  // Sets the superblock's read-only flag of the mount at `mountpoint` (fspick, fsconfig).
  static Status SetReadOnly(const std::string& mountpoint, bool read_only);

 private:
  Mutex mu_;
  std::string mountpoint_ GUARDED_BY(mu_);  // empty: unarmed
  bool tried_read_only_ GUARDED_BY(mu_) = false;
  std::function<Status()> replace_ GUARDED_BY(mu_);
  bool open_free_ GUARDED_BY(mu_) = false;        // the current connection is open-free
  bool replace_failed_ GUARDED_BY(mu_) = false;   // tried once: writes get EROFS until a restart
  std::atomic<bool> read_only_{false};
  // A writable attribute was seen and dealt with (the superblock writable, or the connection
  // replaced): set under mu_ once that is done, so that a concurrent caller waits for it; read
  // without the lock on the fast paths.
  std::atomic<bool> writable_seen_{false};
};

}  // namespace granary::fuse
