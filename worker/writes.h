// WriteSessions: the worker's side of writes through a granary-fuse mount (mount option `write`;
// docs/semantics.md, "Writes"). granary-fuse asks over the local socket (LocalRequest.write).
//
// Design
// ------
// A session is one file being written on this node. BEGIN makes a staging file in
// worker.staging_dir (0600 in a 0700 directory, named by the session number, never by the path)
// and a manifest beside it saying where the file goes (mount, path, inode, parent and name,
// permission bits); granary-fuse gets the staging file's descriptor and writes the bytes into it
// itself, at local-disk speed. COMMIT makes the file's first `size` bytes the new version:
//   write=through  the worker uploads them (UnderFileSystem::Create: a multipart upload, or a
//                  temporary file renamed over the target), tells the master (CommitWrite), and
//                  only then answers: close() and fsync() return once the file is whole in the
//                  store and the namespace.
//   write=back     the staging file is sealed (renamed <n>.sealed with its manifest marked
//                  sealed) and the answer goes at once, with no fsync on the writer's path: a kill
//                  of any process loses nothing (the bytes are in the page cache), and the syncer
//                  thread fsyncs what was sealed within kSyncDelay, one pass for many files (a
//                  power loss in that moment can lose them, as a local disk's unsynced files; the
//                  writer's fsync() waits for the upload instead). The uploader thread uploads
//                  it in the background, retrying with backoff (1 s doubling to 1 min) and keeping
//                  the staged bytes until the store takes them. With wait_upload (fsync) the
//                  answer waits for that upload; one that keeps failing answers its last error
//                  after kSyncWait (the upload goes on trying).
// UPLOADED tells granary-fuse whether a sealed version still waits (it serves that version's reads
// on its node until then: fuse/writes.h, "Read-your-writes"). A sealed file belongs to the uploader: granary-fuse starts a new session for writes after a
// back-mode commit. Sessions a connection did not seal are dropped when it closes (granary-fuse
// died: the file was never acknowledged). At start, sealed files are queued again (a kill -9 or a
// reboot loses no acknowledged write); unsealed staging files are deleted.
//
// Who writes: the writer's uid, gid and groups (the FUSE request's) come with BEGIN, are kept in the
// manifest, and every call to the store for the file acts for them (WriteCaller), also an upload
// after a restart. The mount decides whether a file may be written at all: BEGIN and every upload
// check the mount's own `write` option (a mount not writable is EROFS, whatever the caller says),
// and the write mode is the mount's, not the caller's.
//
// Never a partial or mixed file in the store: the store's writer makes the whole file appear at
// once, and two sessions for one path commit one after the other (last commit wins, whole).
//
// Thread-safe.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "common/backoff.h"
#include "common/status.h"
#include "common/thread_annotations.h"
#include "proto/granary.pb.h"
#include "worker/interfaces.h"

namespace granary::worker {

// Where a written file goes: what BEGIN names and a manifest keeps.
struct WriteTarget {
  uint64_t mount_id = 0, ino = 0, parent = 0;
  std::string ufs_path, name;
  uint32_t mode = 0644, uid = 0, gid = 0, write_mode = 0;
  uint64_t block_size = 0;
  std::vector<uint32_t> groups;  // the writer's supplementary groups (uid, gid above): WriteCaller
  // A chmod, chown or utimes the writer made while writing (COMMIT's attrs): the store gets them
  // with the file (UfsWriter::SetAttrs), before it appears at its path.
  UfsAttrChange attrs;
};
// COMMIT's attrs as the store takes them.
UfsAttrChange AttrChangeOf(const rpc::AttrChange& a);

// A staging file's manifest (<n>.json in worker.staging_dir): its target, whether it is sealed
// (write=back: acknowledged, the uploader's) and the committed size.
struct WriteManifest {
  WriteTarget target;
  bool sealed = false;
  uint64_t size = 0;
};
std::string EncodeWriteManifest(const WriteManifest& m);
// Contract: any bytes (a manifest torn by a crash, or damaged on disk) give a WriteManifest or
// DATA_LOSS naming what is wrong, never an exception or a crash. A sealed manifest must name a
// valid relative path, a file name and a write mode (through or back); a field of the wrong type
// or out of range is an error, not a default. Fuzzed (tests/fuzz/manifest_fuzz.cc).
StatusOr<WriteManifest> ParseWriteManifest(std::string_view text);

class WriteSessions {
 public:
  // Tells the master a file is committed (MasterLink::CommitWrite).
  using CommitFn = std::function<Status(const rpc::CommitWriteRequest&)>;
  // Keeps a committed file's blocks in this worker's cache (BlockSource::KeepWritten): mount,
  // path, version, size, block size, the staging file.
  using KeepFn = std::function<Status(uint64_t, const std::string&, const std::string&, uint64_t, uint64_t, int)>;
  // How long fsync on a write=back file waits for its upload before answering the last error.
  static constexpr std::chrono::seconds kSyncWait{60};
  // How long a sealed file waits for the syncer's pass (files sealed meanwhile share it).
  static constexpr std::chrono::milliseconds kSyncDelay{500};
  // How long a write=back file closed without fsync waits before its upload may begin.
  static constexpr std::chrono::milliseconds kSettle{100};

  // Opens (creating) `dir`, deletes unsealed staging files and queues the sealed ones.
  static StatusOr<std::unique_ptr<WriteSessions>> Open(const std::string& dir, MountResolver* mounts, CommitFn commit,
                                                       KeepFn keep = nullptr);
  ~WriteSessions();

  // One call of a connection (`conn` numbers the connection). BEGIN sets *fd to the staging
  // file's descriptor (the caller sends and then closes it).
  Status Handle(uint64_t conn, const rpc::WriteCall& call, rpc::LocalResponse* resp, int* fd);
  // The connection closed: its unsealed sessions are dropped.
  void ConnectionClosed(uint64_t conn);

  struct Backlog {
    uint64_t files = 0, bytes = 0;  // sealed, not uploaded yet
    uint64_t uploaded = 0, uploaded_bytes = 0, failures = 0;  // since start (through and back)
    uint64_t open_sessions = 0;  // with a target (spares, made ahead of any write, are not counted)
  };
  Backlog backlog() const;
  const std::string& dir() const { return dir_; }

 private:
  using Target = WriteTarget;
  // write=through: the upload that follows the writer (PROGRESS), on a thread of its own.
  struct Stream {
    Mutex mu;
    std::condition_variable cv;
    std::unique_ptr<UfsWriter> writer;
    uint64_t target GUARDED_BY(mu) = 0;    // bytes granary-fuse sealed
    uint64_t streamed GUARDED_BY(mu) = 0;  // appended to the writer
    Status failed GUARDED_BY(mu);
    bool stop GUARDED_BY(mu) = false;
    std::thread thread;
    ~Stream();  // stops the thread; an uncommitted writer aborts
  };
  struct Session {
    uint64_t conn = 0;
    Target target;
    std::string data_path;
    std::shared_ptr<Stream> stream;  // write=through, after a PROGRESS
    bool no_stream = false;          // the stream was dropped: COMMIT uploads the whole file
    bool aimed = false;              // has its target (a spare has none until AIM)
  };
  // BEGIN's and AIM's target, checked: a valid path and name below a writable mount.
  StatusOr<Target> TargetOf(const rpc::WriteCall& call);
  struct Sealed {
    uint64_t id = 0;
    Target target;
    std::string data_path, manifest_path;
    uint64_t size = 0;
    Backoff retry{kUploadRetry};  // the pause after each failed upload
    std::chrono::steady_clock::time_point not_before{};
  };

  WriteSessions(std::string dir, MountResolver* mounts, CommitFn commit, KeepFn keep);
  Status Recover();
  // Uploads the first `size` bytes of `data_path` to `t` and tells the master.
  Status Upload(const Target& t, const std::string& data_path, uint64_t size, rpc::LocalResponse* resp);
  static std::string ManifestOf(const Target& t, bool sealed, uint64_t size) {
    return EncodeWriteManifest({t, sealed, size});
  }
  void UploadLoop();
  // The syncer: fsyncs sealed files (and their manifests, then the directory) kSyncDelay after.
  void SyncLoop();
  struct Unsynced {
    std::string data_path, manifest_path;
    std::chrono::steady_clock::time_point sealed_at;
  };
  // Removes queued versions of `newer`'s file sealed before it (the last close wins).
  void DropOlderLocked(const Sealed& newer) REQUIRES(mu_);
  // A stream's thread: appends [streamed, target) of the staging file to its writer.
  static void StreamLoop(Stream* st, std::string data_path);
  // COMMIT of a streamed file: the rest appended, the upload completed, the master told.
  Status FinishStream(const Session& s, uint64_t size, rpc::LocalResponse* resp);
  // After the store has the file `e`: the master is told, the blocks kept (through and back).
  Status Committed(const Target& t, const std::string& data_path, const UfsEntry& e, uint64_t block_size,
                   rpc::LocalResponse* resp);
  // Keeps committed files' blocks (KeepFn) off the caller's path: close() does not wait for it.
  void KeepLoop();
  struct Keep {
    uint64_t mount_id = 0, size = 0, block_size = 0;
    std::string ufs_path, version;
    int fd = -1;  // the staging file, open (it may be unlinked meanwhile)
  };

  const std::string dir_;
  MountResolver* const mounts_;
  const CommitFn commit_;
  const KeepFn keep_;

  mutable Mutex mu_;
  std::condition_variable cv_;  // the queue changed, an upload ended, or stop
  std::map<uint64_t, Session> open_ GUARDED_BY(mu_);
  std::deque<Sealed> queue_ GUARDED_BY(mu_);
  std::map<uint64_t, Status> done_ GUARDED_BY(mu_);  // sealed id -> its upload's end (for fsync), bounded
  uint64_t next_id_ GUARDED_BY(mu_) = 1;
  uint64_t uploading_bytes_ GUARDED_BY(mu_) = 0;
  bool uploading_ GUARDED_BY(mu_) = false;
  uint64_t uploading_id_ GUARDED_BY(mu_) = 0;  // the sealed version being uploaded (uploading_)
  bool stop_ GUARDED_BY(mu_) = false;
  uint64_t uploaded_ GUARDED_BY(mu_) = 0, uploaded_bytes_ GUARDED_BY(mu_) = 0, failures_ GUARDED_BY(mu_) = 0;
  std::thread uploader_;
  std::deque<Keep> keeps_ GUARDED_BY(mu_);
  std::thread keeper_;
  std::deque<Unsynced> unsynced_ GUARDED_BY(mu_);
  std::thread syncer_;
};

}  // namespace granary::worker
