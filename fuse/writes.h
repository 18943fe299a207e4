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
// A session's staging file is usually made before its open comes: each RELEASE tops up a few spare
// sessions (BEGIN without a path), and an open aims one at its file (AIM) instead of making one.
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
// Read-your-writes (write=back): after a back-mode commit the worker uploads in the background, and
// until the master has the new version every open and stat on this node would see the previous
// one. So the File stays here after its last RELEASE, "staged": it keeps the sealed staging file
// open (this process's own descriptor: a worker restart or the upload's unlink does not take it),
// answers the size (SizeOf) and serves read-only opens of the inode (OpenStaged: a handle that reads
// the staging file). Each time it is asked, it asks the worker whether that sealed version is still
// waiting (WriteCall UPLOADED, on a connection of its own); once the worker says it is uploaded —
// the master has it then — the File goes and the master's answer stands. It also goes when a new
// write of the inode begins, and past kMaxStaged staged files (the oldest first: its readers then
// see the master's version until the upload ends).
//
// Handles: a write handle's number is kWriteHandleBit with a number of the mount's one numbering
// (OpenHandles::Number: a random epoch, carried across a hand-over), and a handle is found only
// together with the kernel inode it was opened on. A handle of a predecessor process (the kernel
// keeps sending those after a restart) or one sent with another inode names no File here: the call
// fails (EIO), it never writes or reads another writer's file.
//
// Reads through a write handle (O_RDWR) read the staging file. Locks: WriteFiles::mu_ guards the
// tables; File::mu serializes one file's writes and commits (a commit never sees a write half
// done). Thread-safe.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <deque>
#include <unordered_map>
#include <unordered_set>
#include <vector>

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
    std::vector<uint32_t> groups;  // the writer's supplementary groups
  };
  // What a RELEASE did: the commit's status (an error can only be logged) and, when the inode's last
  // handle ended a file whose name was made for this write (WriteTarget.created) and never
  // committed (its commit failed, or its writer was killed), that name, for the caller to take
  // back (Client::Remove with pending_ino).
  struct Abandoned {
    uint64_t ino = 0, parent = 0;  // master inodes
    std::string name;
  };
  struct Released {
    Status status;
    std::optional<Abandoned> abandoned;
  };

  // `number` gives each new handle its number (OpenHandles::Number; below 2^62).
  WriteFiles(std::string socket_path, std::function<uint64_t()> number)
      : socket_(std::move(socket_path)), number_(std::move(number)) {}
  ~WriteFiles();

  // Opens kernel inode `kino` for writing from empty (CREATE, O_TRUNC): a new session, or the
  // inode's File emptied when another handle writes it already. Returns the write handle.
  StatusOr<uint64_t> Open(uint64_t kino, const Target& t);
  // Another write handle on a File being written here (an open without O_TRUNC joins it).
  // NOT_FOUND when `kino` is not being written here.
  StatusOr<uint64_t> Join(uint64_t kino);

  // Every call names the handle and the kernel inode the kernel sent with it; a pair that was not
  // opened here is FAILED_PRECONDITION.
  Status Write(uint64_t fh, uint64_t kino, const char* buf, size_t size, off_t off);
  StatusOr<size_t> Read(uint64_t fh, uint64_t kino, char* buf, size_t size, off_t off);
  Status Truncate(uint64_t fh, uint64_t kino, uint64_t size);
  // FLUSH (wait_upload false) and FSYNC (true): commits what was written since the last commit.
  Status Commit(uint64_t fh, uint64_t kino, bool wait_upload);
  // RELEASE: the handle ends; the inode's last one commits what is uncommitted and ends the session.
  Released Release(uint64_t fh, uint64_t kino);
  // A handle whose open was never acknowledged (the reply was interrupted): ends it committing
  // nothing.
  Status Abort(uint64_t fh, uint64_t kino);
  // The writer of this handle was killed (its FLUSH came from a process ended by a signal): the
  // File is never committed (by any handle of the inode); the RELEASEs end it, and the store keeps
  // the previous version.
  Status Discard(uint64_t fh, uint64_t kino);

  // The size of `kino` while it is written here, or staged (write=back: closed, its upload not in
  // the master yet): getattr and lookup answer it. nullopt: neither (the master's answer stands).
  std::optional<uint64_t> SizeOf(uint64_t kino);
  // The attributes of `kino` while it is written here or staged: the master's answer when the write
  // began (or a later setattr's: NoteAttr) with the size written. nullopt: neither.
  std::optional<rpc::Attr> AttrOf(uint64_t kino);
  // A setattr's answer for `kino`, kept while it is written here or staged.
  void NoteAttr(uint64_t kino, const rpc::Attr& a);
  // chmod, chown or utimes of `kino` while a write of it is open here and not committed yet: kept
  // for the commit (the worker gives them to the store with the file, before it appears at its
  // path) and answered at once, with no master round trip (tar and cp -p set them on every file
  // before closing it). Of a staged file (write=back, closed) whose upload has not begun: given to
  // the worker for that upload (WriteCall.SEALED_ATTRS: Python's tarfile and shutil.copystat set
  // them by path after the close). The file's attributes as they are now; nullopt when the inode
  // has neither (committed, uploading, failed, or not written here): the master is asked.
  std::optional<rpc::Attr> SetAttrWhileWriting(uint64_t kino, const rpc::AttrChange& change);
  // A read-only handle on `kino` while it is written here or staged: reads read the staging file.
  // NOT_FOUND when there is none.
  StatusOr<uint64_t> OpenStaged(uint64_t kino);
  // Hand-over (fuse/handover.h): every File with its handles, staging file and session connection,
  // for a successor to go on with (Restore). The descriptors stay this object's (the successor gets
  // its own over SCM_RIGHTS); this process serves no request after it.
  struct Exported {
    rpc::FuseWriteFile file;
    int fd = -1, conn = -1;
  };
  std::vector<Exported> Export() EXCLUDES(mu_);
  // A predecessor's File, its descriptors now this object's. Its handles keep their numbers (the
  // mount's numbering goes on from the predecessor's: OpenHandles::ContinueFrom).
  void Restore(const rpc::FuseWriteFile& file, int fd, int conn) EXCLUDES(mu_);
  // The file being written or staged here under `name` in `parent` (master inodes), by the name it
  // has on this node (its open's, then this node's renames: Renamed, Unlinked): its attributes with
  // the size written, for a lookup answered without the master (a writer's chmod or utime by path
  // after close, as Python's tarfile does). nullopt: none (or its upload ended: the master's).
  std::optional<rpc::Attr> LookupWritten(uint64_t parent, const std::string& name);
  void Renamed(uint64_t parent, const std::string& name, uint64_t new_parent, const std::string& new_name);
  void Unlinked(uint64_t parent, const std::string& name);
  // Whether `kino` has a File here (being written or staged): a cheap test before asking the master.
  bool Has(uint64_t kino);
  static constexpr size_t kMaxStaged = 1024;
  // The handle was opened here on kernel inode `kino`.
  bool Known(uint64_t fh, uint64_t kino);
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
    bool committed_once GUARDED_BY(mu) = false;  // some commit of this File succeeded
    uint64_t last_sealed GUARDED_BY(mu) = 0;     // write=back: the worker's number of the last sealed version
    // write=through: the bytes [0, contiguous) were all written, and [0, reported) were told to the
    // worker as final (PROGRESS), which streams them to the store meanwhile. A write or truncate
    // below `reported` drops that upload (a PROGRESS of 0): close() then uploads the whole file.
    uint64_t contiguous GUARDED_BY(mu) = 0;
    uint64_t reported GUARDED_BY(mu) = 0;
    bool stream_dropped GUARDED_BY(mu) = false;
    uint64_t unsynced GUARDED_BY(mu) = 0;  // bytes written since the last writeback was started
    rpc::AttrChange attrs GUARDED_BY(mu);  // chmod/chown/utimes for the next commit (SetAttrWhileWriting)
    // Guarded by WriteFiles::mu_, which clang cannot name from here: reached only through
    // WriteFiles::Indexed(f), which requires it.
    struct Indexed {
      // write=back: no handle left, the sealed staging file kept for reads until the worker says
      // the sealed version `sealed_id` is uploaded.
      bool staged = false;
      uint64_t sealed_id = 0;
      rpc::Attr attr;  // the master's, when the write began or at a later setattr (AttrOf)
      uint64_t name_parent = 0;  // its name on this node (LookupWritten; 0: none)
      std::string name_now;
      int handles = 0;
    };

   private:
    friend class WriteFiles;
    Indexed indexed_;
  };
  // The part of `f` that WriteFiles::mu_ guards.
  File::Indexed& Indexed(File& f) REQUIRES(mu_) { return f.indexed_; }
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
  // The File of handle `fh` when it was opened on `kino`; else null.
  std::shared_ptr<File> Of(uint64_t fh, uint64_t kino);
  // Forgets handle `fh` (opened on `kino`); the inode's File when it was its last handle (else null).
  std::shared_ptr<File> DropHandle(uint64_t fh, uint64_t kino) EXCLUDES(mu_);
  uint64_t NewHandle() { return kWriteHandleBit | number_(); }

  // Spare sessions (WriteCall BEGIN without a path): a staging file the worker made ahead of the
  // open that takes it (AIM gives it its target), so a new file's open makes no file on its way.
  // Refilled up to kSpares by each RELEASE (after close() returned), over the released session's
  // connection when the worker ended that session (a write=back seal), else a new one. A spare
  // whose connection broke (the worker restarted) is dropped when taken; the worker drops the
  // spares of a connection that closes.
  struct Spare {
    int conn = -1, fd = -1;
    uint64_t session = 0;
  };
  static constexpr size_t kSpares = 4;
  std::optional<Spare> TakeSpare() EXCLUDES(spare_mu_);
  // `conn`: a connection with no session on it (taken over, closed when not needed), or -1.
  void Refill(int conn) EXCLUDES(spare_mu_);
  Mutex spare_mu_;
  std::deque<Spare> spares_ GUARDED_BY(spare_mu_);

  const std::string socket_;
  const std::function<uint64_t()> number_;
  Mutex mu_;
  std::unordered_map<uint64_t, std::shared_ptr<File>> by_handle_ GUARDED_BY(mu_);
  std::unordered_map<uint64_t, std::shared_ptr<File>> by_inode_ GUARDED_BY(mu_);  // kernel inode
  std::unordered_map<uint64_t, uint64_t> inode_of_ GUARDED_BY(mu_);               // handle -> kernel inode
  std::unordered_set<uint64_t> read_only_ GUARDED_BY(mu_);  // OpenStaged's handles: no commit, ever
  std::deque<uint64_t> staged_order_ GUARDED_BY(mu_);       // staged kernel inodes, oldest first
  // Drops the staged File of `kino` when it is staged only (no handle). Its descriptor is closed
  // by the caller outside the lock (returned).
  std::shared_ptr<File> UnstageLocked(uint64_t kino) REQUIRES(mu_);
  // The File of `kino` when it still answers for the inode: being written here, or staged with its
  // upload still waiting (asked of the worker, outside mu_); a staged one whose upload is done is
  // dropped. Null: the master's answer stands.
  std::shared_ptr<File> Current(uint64_t kino) EXCLUDES(mu_);
  // Whether the worker still waits to upload sealed version `id` (an error counts as waiting: the
  // staged bytes are what this node wrote last).
  bool UploadPending(uint64_t id) EXCLUDES(query_mu_);
  // One call on the query connection (UPLOADED, SEALED_ATTRS), made again once on a new connection
  // when the old one broke.
  StatusOr<rpc::LocalResponse> Query(const rpc::WriteCall& c) EXCLUDES(query_mu_);
  Mutex query_mu_;
  int query_conn_ GUARDED_BY(query_mu_) = -1;  // UPLOADED calls, on a connection of their own
};

}  // namespace granary::fuse
