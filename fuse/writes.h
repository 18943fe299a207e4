// WriteFiles: the files this granary-fuse process is writing (mounts with write=through or back;
// docs/semantics.md, "Writes"; the worker's side is worker/writes.h).
//
// Design
// ------
// An open for writing (CREATE, or OPEN with O_TRUNC) gets a write handle: a file handle with
// kWriteHandleBit set, so FLUSH, FSYNC, RELEASE and READ know it from a read handle (read-only
// opens are noflush: a reader's close never commits anything). All write handles of one kernel
// inode share one File: its bytes go into a staging file the local worker made (a write session
// on a connection of its own to the worker's local socket, whose descriptor this process writes
// into with pwrite: any order, any offset, at local-disk speed). The file's size is the largest
// end written (or what ftruncate set).
//
// close() (FLUSH) commits a File written since its last commit: the worker uploads it (through:
// before answering; meanwhile it has streamed the part written in order, as PROGRESS told it) or
// seals it (back: the upload follows). fsync() commits and, for back, waits
// for the upload. After a back-mode commit the worker owns the sealed staging file, so the next
// write starts a new session from a copy of it. The last RELEASE of the inode's write handles
// commits what was written since (its error can only be logged) and ends the session; a session
// whose connection ends uncommitted (this process died) is dropped by the worker: the file was
// never acknowledged, and the store keeps its previous version. After any commit the worker owns
// that staging file (it uploads or caches it), so more writes start a new session from a copy. A
// write that failed (ENOSPC, a lost session) marks the File failed: it is never committed, and
// close() answers EIO.
//
// Reads through a write handle (O_RDWR) read the staging file. Locks: WriteFiles::mu_ guards the
// tables; File::mu serializes one file's writes and commits (a commit never sees a write half
// done). Thread-safe.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>

#include "common/status.h"
#include "common/thread_annotations.h"
#include "proto/granary.pb.h"

namespace granary::fuse {

inline constexpr uint64_t kWriteHandleBit = 1ull << 63;
inline bool IsWriteHandle(uint64_t fh) { return (fh & kWriteHandleBit) != 0; }

class WriteFiles {
 public:
  // Where the file goes: the master's answer and the name in its directory.
  struct Target {
    rpc::WriteTarget target;
    uint64_t parent = 0;  // master inodes
    std::string name;
    uint32_t mode = 0644, uid = 0, gid = 0;
  };

  explicit WriteFiles(std::string socket_path) : socket_(std::move(socket_path)) {}
  ~WriteFiles();

  // Opens kernel inode `kino` for writing from empty (CREATE, O_TRUNC): a new session, or the
  // inode's File emptied when another handle writes it already. Returns the write handle.
  StatusOr<uint64_t> Open(uint64_t kino, const Target& t);
  // Another write handle on a File being written here (an open without O_TRUNC joins it).
  // NOT_FOUND when `kino` is not being written here.
  StatusOr<uint64_t> Join(uint64_t kino);

  Status Write(uint64_t fh, const char* buf, size_t size, off_t off);
  StatusOr<size_t> Read(uint64_t fh, char* buf, size_t size, off_t off);
  Status Truncate(uint64_t fh, uint64_t size);
  // FLUSH (wait_upload false) and FSYNC (true): commits what was written since the last commit.
  Status Commit(uint64_t fh, bool wait_upload);
  // RELEASE: the handle ends; the inode's last one commits what is uncommitted and ends the session.
  Status Release(uint64_t fh);
  // A handle whose open was never acknowledged (the reply was interrupted): ends it committing
  // nothing.
  Status Abort(uint64_t fh);

  // The size of `kino` while it is written here (getattr answers it).
  std::optional<uint64_t> SizeOf(uint64_t kino);
  // The File of a handle's inode is being written here (write handles of this process).
  bool Known(uint64_t fh);
  size_t open_files();

 private:
  struct File {
    Mutex mu;
    Target target GUARDED_BY(mu);
    int conn GUARDED_BY(mu) = -1;  // the write session's connection to the worker
    uint64_t session GUARDED_BY(mu) = 0;
    int fd GUARDED_BY(mu) = -1;    // the staging file
    uint64_t size GUARDED_BY(mu) = 0;
    std::atomic<uint64_t> size_seen{0};  // `size`, for getattr without waiting out a commit
    bool failed GUARDED_BY(mu) = false;  // a write failed: never committed (close answers EIO)
    Status failure GUARDED_BY(mu);       // that write's error, answered to every later write
    bool dirty GUARDED_BY(mu) = false;   // written (or emptied) since the last commit
    bool sealed GUARDED_BY(mu) = false;  // write=back: the worker took the staging file
    // write=through: the bytes [0, contiguous) were all written, and [0, reported) were told to the
    // worker as final (PROGRESS), which streams them to the store meanwhile. A write or truncate
    // below `reported` drops that upload (a PROGRESS of 0): close() then uploads the whole file.
    uint64_t contiguous GUARDED_BY(mu) = 0;
    uint64_t reported GUARDED_BY(mu) = 0;
    bool stream_dropped GUARDED_BY(mu) = false;
    uint64_t unsynced GUARDED_BY(mu) = 0;  // bytes written since the last writeback was started
    int handles = 0;  // under WriteFiles::mu_
  };
  // A new session for `f` (the previous one, if any, ended); with `copy`, the first f.size bytes
  // of the previous staging file are copied into the new one.
  Status BeginLocked(File& f, bool copy) REQUIRES(f.mu);
  void EndLocked(File& f) REQUIRES(f.mu);
  Status CommitLocked(File& f, bool wait_upload) REQUIRES(f.mu);
  // Marks `f` failed (a write the writer was told failed) and returns `why`.
  static Status Failed(File& f, Status why) REQUIRES(f.mu);
  // write=through: tells the worker what is final now (or that the stream must be dropped).
  Status ProgressLocked(File& f, uint64_t off, uint64_t end) REQUIRES(f.mu);
  // Bytes kept back from the end of the contiguous prefix (a writer that seeks back a little, as
  // a zip writer patching a header, stays streamed), and how far it moves before the next PROGRESS.
  static constexpr uint64_t kProgressSlack = 8 << 20;
  static constexpr uint64_t kProgressStep = 32 << 20;
  // Staged bytes after which their writeback to disk is started (sync_file_range, not waited for).
  static constexpr uint64_t kStartWriteback = 16 << 20;
  std::shared_ptr<File> Of(uint64_t fh);
  // Forgets handle `fh`; the inode's File when it was its last handle (else null).
  std::shared_ptr<File> DropHandle(uint64_t fh) EXCLUDES(mu_);

  const std::string socket_;
  Mutex mu_;
  uint64_t next_ GUARDED_BY(mu_) = 1;
  std::unordered_map<uint64_t, std::shared_ptr<File>> by_handle_ GUARDED_BY(mu_);
  std::unordered_map<uint64_t, std::shared_ptr<File>> by_inode_ GUARDED_BY(mu_);  // kernel inode
  std::unordered_map<uint64_t, uint64_t> inode_of_ GUARDED_BY(mu_);               // handle -> kernel inode
};

}  // namespace granary::fuse
