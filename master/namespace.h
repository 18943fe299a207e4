// Namespace: the master's tree of mounted datasets, kept in RocksDB.
//
// Design
// ------
// Inode 1 is the root. `granary mount /a/b URI` creates virtual directories for /a (if needed) and a
// mount-root inode for /a/b bound to URI. Below a mount root, directories are discovered lazily: the
// first lookup or readdir of a directory lists it in the under-storage and records every child
// (size, mtime, permission bits, version) as an inode.
//
// Metadata sync: each mount has a sync interval (mount option metadata.sync_interval, default
// master.metadata_sync_interval): never, always, or a duration. A directory whose last complete
// listing is older than the interval is listed again on its next lookup or readdir: every child
// seen is stamped with the listing's generation (in its E value); a file whose version changed is
// updated in place (same inode, so readdir cookies stay valid; new version, so its old blocks are
// never served to new opens); new children get new inodes; children the listing did not stamp are
// deleted with their subtrees. A file whose record is older than the interval is checked with one
// Stat when it is opened (GetFile) or its attributes are asked for. The FileKeys of replaced and
// deleted versions go to the reclaim listener, which frees their cached blocks on the workers.
//
// RocksDB keys (be64 = 8-byte big-endian, so keys sort numerically):
//   I be64(ino)                 -> InodeRecord
//   E be64(parent) name         -> be64(child) be64(generation of the listing that saw it)
//   C be64(parent) be64(child)  -> ""               readdir order; the child inode is the cookie
//   M be64(mount id)            -> MountRecord       (proto/meta.proto; master/records.h converts)
//   S next_ino / S next_mount   -> be64             allocators
//   S/free_stamps               -> be64             free stamps reserved up to here (NextFreeStamp)
//   P path                      -> 16-byte FileKeys  a pinned path and the files it pinned (MetaStore)
//   J ...                       -> load jobs (layout in master/jobs.h; MetaStore)
//   L be64(mount) be64(ino)     -> LoadCursorRecord  where an unfinished LoadTree of ino stands
//   W/members                   -> MembersRecord    the live workers (for a standby taking over; MetaStore)
//   R be64(ino)                 -> be64(mount) old path: a directory rename whose subtree is still
//                                  being rewritten (see "Directory renames")
//   Z/pos                       -> be64(term) be64(index): the journal's position (master/journal.h)
// Every write goes through the journal (Commit), so standby masters can apply the same entries
// (ApplyEntry) and hold the same inodes; a standby only reads (the metadata calls with
// `ufs_needed`, which never write) and applies.
// Readdir cookies are child inode numbers: children discovered together get consecutive numbers,
// and a cookie stays valid however the directory grows.
//
// Directory renames. Every record keeps its full path in the under-storage (ufs_path), so moving
// a directory changes the path of everything below it. A rename does not rewrite that subtree in
// one batch under `mu_` (a million files would stall every call for seconds and make one huge
// journal entry): its first batch moves the directory itself and records `R ino -> old path`; then
// the subtree is rewritten in batches of kRenameBatch records, `mu_` released between them; the
// last batch deletes the R key. Meanwhile GetRecord corrects on the fly the path of any record
// below the moved directory that still carries the old prefix (FixMovedPath: the old prefix and
// a walk up the parents to the moved directory, so a new directory made at the old name is left
// alone), on the leader and on a standby alike (ApplyEntry learns of an R key before applying the
// entry that writes it). Directory renames are serialised (`rename_mu_`), and a rename left
// halfway by a crash or a failover is finished by the next leader (FinishRenames) or by the next
// directory rename, whichever comes first; the rewrite is idempotent.
//
// Concurrency: reads go straight to RocksDB. Listing a directory takes that directory's stripe
// lock (so two lookups do not both list it) and then `mu_` only to allocate inodes and write one
// batch per page. Mount/unmount hold `mu_` throughout. All methods are thread-safe.
//
// Where the code is, by concern (the key layout and helpers they share: namespace_internal.h):
//   namespace.cc         opening the data directory, the state in memory, applying the leader's
//                        entries, reading one record
//   namespace_sync.cc    listing a directory on first access, listing ahead, sync, SyncFile
//   namespace_load.cc    LoadTree: a whole subtree in flat pages, resumable
//   namespace_mounts.cc  Mount, Unmount, ListMounts, GetMount
//   namespace_read.cc    Lookup, GetAttr, Resolve, GetFile, ReadDir, walks of a subtree
//   namespace_write.cc   writes below writable mounts, renames
//   meta_store.cc        the jobs', pins' and members' records (MetaStore, meta())
#pragma once

#include <rocksdb/db.h>
#include <rocksdb/write_batch.h>

#include <sys/types.h>

#include <array>
#include <atomic>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "common/hash.h"
#include "common/status.h"
#include "common/thread_annotations.h"
#include "common/tiers.h"
#include "master/journal.h"
#include "master/meta_store.h"
#include "ufs/mount_table.h"
#include "ufs/ufs.h"
#include "proto/granary.pb.h"
#include "proto/meta.pb.h"

namespace granary::master {

constexpr uint64_t kRootIno = 1;
// The largest file a commit may name (1 PiB): beyond any store's (S3: 5 TiB), and far from where an
// off_t or a block count overflows.
constexpr uint64_t kMaxFileSize = uint64_t{1} << 50;

struct LoadStats {
  // What this call listed (a resumed load counts only what it listed after its checkpoint).
  uint64_t files = 0, bytes = 0, dirs = 0, skipped = 0;
  uint64_t added = 0, changed = 0, removed = 0;
  std::string resumed_after;  // the checkpoint a resumed load started after; empty: from the start
  bool complete = true;       // false: stopped by LoadTreeOptions::max_entries
};

struct LoadTreeOptions {
  size_t page_size = 1000;  // entries per page of the under-storage's listing (and per write)
  // Asked between pages: true stops the load with CANCELLED. What was written stays, and the next
  // load of the same directory resumes from there.
  std::function<bool()> stop;
  // More than this many entries below the directory (0: no limit): the load stops before passing
  // the next page, returns OK with LoadStats::complete false and keeps no cursor. The directories
  // it passed completely are listed; the others (`path` among them) are as a plain listing left
  // them. EnsureListed's list-ahead uses it to list a small subtree in a few flat pages.
  uint64_t max_entries = 0;
};

// The pid of another process holding the RocksDB lock of the master data directory `data_dir`
// (RocksDB takes it with fcntl), or 0 when none does (or the directory has no database yet).
pid_t DataDirLockHolder(const std::string& data_dir);

class Namespace {
 public:
  // Opens (creating if needed) the RocksDB database in `data_dir`. `block_size` applies to files
  // discovered from now on; files keep the block size they were discovered with.
  // `default_sync_ms` applies to mounts without metadata.sync_interval (kSyncNever, 0 = always, or
  // milliseconds); `cache_bytes` sizes RocksDB's block cache. `env` replaces RocksDB's default
  // environment (tests inject I/O faults with it; it must outlive the Namespace).
  // FAILED_PRECONDITION when another granary-master (or this process) has `data_dir` open.
  //
  // RocksDB errors keep their meaning: NotFound -> NOT_FOUND, Corruption -> DATA_LOSS, NoSpace ->
  // RESOURCE_EXHAUSTED, Busy / TimedOut / TryAgain / IOError -> UNAVAILABLE (retryable), anything
  // else -> INTERNAL. Every iterator's status is checked: an I/O error in the middle of a listing
  // fails the call, never reads as the end of the directory.
  // Mounts are opened under `access` (ufs/access.h: which file:// paths and credential files a
  // mount may name).
  static StatusOr<std::unique_ptr<Namespace>> Open(const std::string& data_dir, uint64_t block_size,
                                                    const UfsAccess& access, int64_t default_sync_ms = kSyncNever,
                                                    uint64_t cache_bytes = 64 << 20, rocksdb::Env* env = nullptr);
  ~Namespace();

  // Called, outside the namespace's locks, with the FileKeys of file versions that a sync replaced
  // or deleted (their cached blocks can be freed). Set before serving.
  using ReclaimFn = std::function<void(std::vector<FileKey>)>;
  void SetReclaimListener(ReclaimFn fn) { on_reclaim_ = std::move(fn); }

  // How many entries below a directory listed for the first time are listed ahead with it, from a
  // store that lists trees flat (EnsureListed); 0: none, every directory is listed on its own. Set
  // before serving.
  static constexpr uint64_t kListAheadEntries = 4000;
  void SetListAheadEntries(uint64_t n) { list_ahead_entries_ = n; }

  StatusOr<rpc::MountInfo> Mount(const std::string& path, const std::string& uri,
                                 const std::map<std::string, std::string>& options);
  // Removes the mount and everything discovered below it. Returns the removed mount.
  StatusOr<rpc::MountInfo> Unmount(const std::string& path);
  std::vector<rpc::MountInfo> ListMounts() const;  // options stripped
  StatusOr<rpc::MountInfo> GetMount(uint64_t id) const;  // with options

  // The metadata calls. `ufs_needed`, when not null, makes the call one that never waits for the
  // under-storage: if answering needs it (a directory to list or sync, a file to check), the call
  // sets *ufs_needed, changes nothing and returns UNAVAILABLE at once; the caller then makes the
  // call again without it where waiting is fine (the master's RPC threads answer from RocksDB
  // inline and hand such calls to a pool).
  // With `file`, a regular file's open information is set in it too, as GetFile would answer, unless
  // its metadata is due for a check with the under-storage (then `file` is left empty: the caller's
  // GetFile makes the check).
  StatusOr<rpc::Attr> Lookup(uint64_t parent, const std::string& name, bool* ufs_needed = nullptr,
                             rpc::FileInfo* file = nullptr);
  StatusOr<rpc::Attr> GetAttr(uint64_t ino, bool* ufs_needed = nullptr);
  // `ufs_needed` as for Lookup: set (and the call made nothing) when a directory on the way must
  // be listed or synced first — a standby answers only what needs no under-storage.
  StatusOr<rpc::Attr> Resolve(const std::string& path, bool* ufs_needed = nullptr);
  StatusOr<rpc::FileInfo> GetFile(uint64_t ino, bool* ufs_needed = nullptr);
  // A file's open information as stored, never checked with the under-storage (fetch-ahead's
  // evidence of opens made from listed information: NoteOpens).
  StatusOr<rpc::FileInfo> StoredFile(uint64_t ino);
  // Children of `ino` after cookie `after`, at most `limit` of them (appended to `out`); with
  // `files`, each regular file's open information (DirEntry.file) unless its metadata is due for a
  // check with the under-storage, as for Lookup, and then a page ends after kMaxDirPageBytes (not
  // `end`: the caller goes on after its last cookie).
  static constexpr size_t kMaxDirPageBytes = 4u << 20;
  Status ReadDir(uint64_t ino, uint64_t after, uint32_t limit, rpc::ReadDirResponse* out, bool* ufs_needed = nullptr,
                 bool files = false);

  // ---- Writes (mounts with write=through or back; docs/semantics.md, "Writes") ----
  // Every one is refused with ReadOnlyError (EROFS) below a mount not mounted writable, and outside
  // mounts. The master makes the directory calls in the under-storage itself (Remove, MakeDir,
  // Rename); a file's bytes are written by the node's worker, which then calls CommitWrite.
  struct WriteTarget {
    rpc::FileInfo file;
    WriteMode mode = WriteMode::kOff;
    bool created = false;  // the name was absent: an empty entry was made for it (pending its commit)
  };
  // A file to write: `name` in directory `parent`, made as an empty entry (version "", so reads
  // see no bytes) when absent — an inode the kernel can hold while the bytes are written. An
  // existing file is returned as it is (its bytes stay until the new version commits); a
  // directory there is INVALID_ARGUMENT.
  StatusOr<WriteTarget> PrepareCreate(uint64_t parent, const std::string& name, uint32_t mode, uint32_t uid,
                                      uint32_t gid);
  // An existing file to write whole again (an open with O_TRUNC).
  StatusOr<WriteTarget> PrepareWrite(uint64_t ino);
  // The file `ino` (named `name` in `parent` when its write began) is now `e` in the under-storage
  // (INVALID_ARGUMENT for attributes no store gives: a size over kMaxFileSize, a mode beyond 07777,
  // no version):
  // its record takes the new size, version and times (the old version's blocks are reclaimed).
  // Syncs leave a created file alone until its first commit (for a day).
  // `written_path` is where the bytes went (the file's path when its write began): a file renamed
  // meanwhile is moved to its new path in the store; one removed meanwhile is removed from the
  // store again (and an empty Attr returned).
  StatusOr<rpc::Attr> CommitWrite(uint64_t ino, uint64_t parent, const std::string& name,
                                  const std::string& written_path, const UfsEntry& e);
  // unlink (dir false) or rmdir (dir true) of `name` in `parent`, in the under-storage (acting for
  // `as`), then here. A file made by PrepareCreate that the store does not have yet goes by its
  // name only. `pending_ino` nonzero: only that never-committed file's name goes, and the store is
  // not touched (a write whose commit failed takes its entry back); NOT_FOUND when the name is
  // another's or the file was committed meanwhile.
  Status Remove(uint64_t parent, const std::string& name, bool dir, const WriteCaller& as = {},
                uint64_t pending_ino = 0);
  // The new directory is made acting for `as` (its owner where the store keeps owners).
  StatusOr<rpc::Attr> MakeDir(uint64_t parent, const std::string& name, uint32_t mode, const WriteCaller& as);
  // rename(2) within one mount; `noreplace`: ALREADY_EXISTS when `new_name` exists.
  Status Rename(uint64_t parent, const std::string& name, uint64_t new_parent, const std::string& new_name,
                bool noreplace, const WriteCaller& as = {});
  // chmod, chown, utimes of `ino`: in the store, acting for `as`, where it keeps them (local, NFS;
  // object stores: NotSupportedError), then in the record. A file not in the store yet (being
  // written) keeps the change in its record, and its commit applies it (CommitWrite).
  StatusOr<rpc::Attr> SetAttr(uint64_t ino, const UfsAttrChange& change, const WriteCaller& as);
  // The write mode of `mount_id` (kOff for 0 and unknown mounts).
  WriteMode WriteModeOf(uint64_t mount_id) const;

  // Bulk metadata load: one flat, paged listing of everything below the directory `path` (the
  // under-storage's ListTree), written as it streams; every directory fully covered is marked
  // listed, so later lookups and listings need no call to the under-storage. A repeated load only
  // updates what changed.
  //
  // Resumable: each page is written with a cursor (the listing's checkpoint and the directories
  // still open, with their stamp generations). A load of the same directory that finds a cursor
  // takes its open directories back and continues the listing after its checkpoint (if one of
  // them is gone it starts over, which is always correct). The directories the earlier load
  // completed are not listed again; a load that completes deletes the cursor. What changed in the
  // under-storage in the part already listed is seen by the next sync.
  StatusOr<LoadStats> LoadTree(const std::string& path, const LoadTreeOptions& opts = {});
  // Whether every directory at or below the directory `path` is listed and not due for a sync
  // (the mount's sync interval): then a LoadTree would list the under-storage again for nothing
  // new to this namespace's rules. Reads only (never the under-storage); stops at the first
  // directory that is not; false for a file.
  StatusOr<bool> TreeListed(const std::string& path);

  // Every file at or below `path` (a file or a directory; directories are listed as needed), as
  // the FileKeys its cached blocks carry. Calls `fn` for each file; stops at the first error.
  Status ForEachFileKey(const std::string& path, const std::function<void(const FileKey&, uint64_t size)>& fn);
  // Every file at or below `path`, with its namespace path, depth first and in listing order (the
  // same order on every walk of an unchanged tree). Stops at the first error, `fn`'s included.
  Status ForEachFile(const std::string& path,
                     const std::function<Status(const std::string& path, const rpc::FileInfo&)>& fn);
  // The records beside the namespace (jobs, pins, members): master/meta_store.h.
  MetaStore& meta() { return meta_; }
  // The canonical form of a namespace path (/a//b/ -> /a/b).
  static StatusOr<std::string> CanonicalPath(const std::string& path);

  // The journal of every write (master/journal.h): the leader's fence and term, followers' reads.
  Journal& journal() { return journal_; }
  // A standby: applies one entry of the leader's journal and refreshes what this object keeps in
  // memory (mounts, counters) when the entry touched it.
  Status ApplyEntry(const JournalEntry& e);
  // A standby: a snapshot of the leader's database replaces this one (Journal::InstallBegin,
  // InstallPage, then InstallSnapshotEnd, which also reloads what is kept in memory).
  Status InstallSnapshotEnd();
  // Reads the counters and mounts again from the database (a standby about to lead).
  Status ReloadState();
  // A leader: finishes directory renames a previous leader (or this master before a crash) left
  // halfway (see "Directory renames"). Cheap when there is none.
  Status FinishRenames();
  // Free stamps (docs/semantics.md, "A free is final across the cluster"): every free or unmount
  // the leader sends the workers takes a new one, larger than any handed out before by this master
  // or any earlier leader (they are reserved in blocks through the journal, and a master starts
  // above the last reservation it holds); every load batch carries the one current when its files
  // were read (FreeStamp). A worker caches nothing of a batch that a free stamped later covers.
  // NextFreeStamp: non-OK when a reservation cannot be written (no longer leading).
  StatusOr<uint64_t> NextFreeStamp();
  uint64_t FreeStamp() const { return free_stamp_.load(); }
  // Directory renames whose subtree is still being written out (0 almost always).
  size_t renames_in_progress() const { return PendingRenames().size(); }
  // Tests: called between the batches of a directory rename (no lock of the namespace's held);
  // a non-OK answer stops the rename there, as a crash would (the rest is left for FinishRenames).
  void SetRenameBatchHookForTest(std::function<Status()> hook, size_t batch);
  // A new leader: moves the inode and mount counters `inodes` and `mounts` ahead (a journal entry),
  // so numbers the previous leader handed out in writes this copy never got are not handed out
  // again for other files (a kernel holding one gets ESTALE, never another file's bytes). The free
  // stamps move past one more reservation, for the same reason.
  Status SkipAhead(uint64_t inodes, uint64_t mounts);

  // master.block_size: the block size of mounts made from now on.
  uint64_t block_size() const { return block_size_; }
  // The block size of `mount`'s new files: its own, or master.block_size for a mount recorded
  // before mounts kept one.
  uint64_t BlockSizeOf(const rpc::MountInfo& mount) const {
    return mount.block_size() != 0 ? mount.block_size() : block_size_;
  }

 // Calls to the under-storage of every mount (listings, stats), for /metrics.
  const UfsCounters& ufs_counters() const { return ufs_counters_; }

 private:
  Namespace(std::unique_ptr<rocksdb::DB> db, uint64_t block_size, const UfsAccess& access, int64_t default_sync_ms);
  static StatusOr<std::unique_ptr<Namespace>> OpenDb(const std::string& data_dir, uint64_t block_size,
                                                     const UfsAccess& access, int64_t default_sync_ms,
                                                     uint64_t cache_bytes, rocksdb::Env* env);
  int64_t SyncIntervalMs(uint64_t mount_id) const;
  static std::optional<int64_t> ParsedSyncMs(const rpc::MountInfo& m);
  static WriteMode ParsedWriteMode(const rpc::MountInfo& m);
  // The directory `parent` below a writable mount, for a write call named `what`.
  InodeRecord NewChildLocked(const InodeRecord& dir, uint64_t parent, const std::string& name, rpc::FileType type,
                             uint32_t mode, uint32_t uid, uint32_t gid) REQUIRES(mu_);
  StatusOr<InodeRecord> WritableDir(uint64_t parent, const std::string& what);
  // Writes `batch` with parent `dir`'s listing marked changed (content_gen) and `mount`'s counts.
  Status CommitChangeLocked(InodeRecord dir, const rpc::MountInfo& mount, rocksdb::WriteBatch* batch) REQUIRES(mu_);
  bool SyncDue(const InodeRecord& r) const;
  // Lists `dir` (first time or again), under its stripe lock.
  Status ListDir(InodeRecord dir);
  // What a listing writes, one batch at a time.
  struct SyncBatch {
    std::string uri;
    int64_t now = 0;
    rocksdb::WriteBatch batch;
    rpc::MountInfo mount;  // counts updated as entries come and go
    std::vector<FileKey> reclaim;
    uint64_t added = 0, changed = 0, removed = 0;
  };
  // Adds or updates one child of `dir`, stamped with `gen`; returns its inode. Needs mu_.
  StatusOr<uint64_t> UpsertChildLocked(const InodeRecord& dir, uint64_t gen, const UfsEntry& e, SyncBatch* b) REQUIRES(mu_);
  // Marks `dir` listed at `gen`; with `sweep`, deletes children not stamped with `gen`. Needs mu_.
  Status FinishListingLocked(InodeRecord dir, uint64_t gen, bool sweep, SyncBatch* b) REQUIRES(mu_);
  // Writes the batch with the allocator and the mount's counts. Needs mu_.
  Status WriteLocked(SyncBatch* b) REQUIRES(mu_);
  // A file record due for a check: Stat it and update it (new version, or NOT_FOUND when gone).
  Status SyncFile(InodeRecord* r);
  void Reclaim(std::vector<FileKey> keys);
  Status Init();
  Status LoadStateLocked() REQUIRES(mu_);
  // The record as stored, and as it is: its path corrected while a directory rename above it is
  // still being written out (FixMovedPath).
  StatusOr<InodeRecord> GetStoredRecord(uint64_t ino) const;
  StatusOr<InodeRecord> GetRecord(uint64_t ino) const;
  struct PendingRename {
    uint64_t ino = 0;
    uint64_t mount_id = 0;
    std::string old_path;
  };
  std::vector<PendingRename> PendingRenames() const EXCLUDES(pending_mu_);
  Status FixMovedPath(InodeRecord* r) const;
  // Rewrites the subtree of the renamed directory `ino` in bounded batches (needs rename_mu_, not mu_).
  Status FinishRename(uint64_t ino) REQUIRES(rename_mu_) EXCLUDES(mu_);
  Status FinishRenamesLocked() REQUIRES(rename_mu_) EXCLUDES(mu_);
  // Rename's move of the entry itself (in the store, then one batch); a directory's subtree is
  // left to FinishRename: its inode in *moved_dir (0 for a file). ABORTED for a directory unless
  // `dir_allowed` (the caller holds rename_mu_).
  Status RenameEntry(uint64_t parent, const std::string& name, uint64_t new_parent, const std::string& new_name,
                     bool noreplace, const WriteCaller& as, bool dir_allowed, uint64_t* moved_dir);
  StatusOr<uint64_t> GetChild(uint64_t parent, const std::string& name) const;
  // Lists `dir` if it never was, or its sync is due. A directory never listed, of a store that lists
  // a whole tree in flat pages (UnderFileSystem::ListsTreeFlat: object stores), is first listed
  // ahead: its subtree in at most list_ahead_entries_ entries (LoadTreeOf), which lists every
  // directory below it that those pages hold completely, and it too if the subtree fits. A dataset
  // of many small directories is then listed in a few requests instead of one per directory (the
  // store's delimiter listings cost it more CPU, docs/benchmarks.md, session 43); a larger subtree
  // costs list_ahead_entries_ / 1000 + 1 requests more, once.
  Status EnsureListed(const InodeRecord& dir, bool* ufs_needed = nullptr);
  StatusOr<LoadStats> LoadTreeOf(InodeRecord top, const std::string& path, const LoadTreeOptions& opts);
  // LoadTreeOf's steps (master/namespace_load.cc): the load's state, resuming an interrupted load
  // from its cursor, one page of the flat listing and one entry of it, the directories an entry
  // is below, and the end.
  struct TreeLoad;
  Status ResumeLoad(TreeLoad* load);
  Status LoadPage(TreeLoad* load, std::vector<UfsEntry>& page) EXCLUDES(mu_);
  Status LoadEntryLocked(TreeLoad* load, UfsEntry& e) REQUIRES(mu_);
  Status EnterLoadDirsLocked(TreeLoad* load, const std::vector<std::string>& parts, size_t depth) REQUIRES(mu_);
  Status SettleFreshDirLocked(TreeLoad* load, const std::string& rel) REQUIRES(mu_);
  Status CloseLoadDirLocked(TreeLoad* load) REQUIRES(mu_);
  Status FinishLoadDirLocked(TreeLoad* load, uint64_t ino, uint64_t gen) REQUIRES(mu_);
  StatusOr<LoadStats> EndLoad(TreeLoad* load, Status st) EXCLUDES(mu_);
  // The answer to a call made with `ufs_needed` that would have to wait for the under-storage.
  static Status NeedsUfs(bool* ufs_needed);
  StatusOr<std::shared_ptr<UnderFileSystem>> UfsFor(uint64_t mount_id) EXCLUDES(mu_);
  StatusOr<MountTable::Source> MountSource(uint64_t mount_id) EXCLUDES(mu_);
  rpc::Attr AttrOf(const InodeRecord& r) const;
  Status PutMountLocked(const rpc::MountInfo& m, rocksdb::WriteBatch* batch) REQUIRES(mu_);
  // Deletes an inode and everything below it. With `uri`, the deleted files' FileKeys are appended
  // to `reclaim` and their count and bytes to *files / *bytes.
  Status DeleteSubtreeLocked(uint64_t ino, const std::string* uri = nullptr, std::vector<FileKey>* reclaim = nullptr,
                             uint64_t* files = nullptr, uint64_t* bytes = nullptr) REQUIRES(mu_);

  std::unique_ptr<rocksdb::DB> db_;
  Journal journal_{db_.get()};
  MetaStore meta_{db_.get(), &journal_};
  std::string open_dir_;  // canonical data_dir, in open_dirs while this is open
  const uint64_t block_size_;
  const int64_t default_sync_ms_;
  ReclaimFn on_reclaim_;

  // Serialises directory renames, held across all the batches of one (taken before mu_).
  mutable Mutex rename_mu_ ACQUIRED_BEFORE(mu_);
  std::atomic<uint64_t> free_stamp_{0};  // the last free stamp handed out (or the reserved limit at start)
  mutable Mutex mu_;                     // guards the fields below and all writes
  uint64_t next_ino_ GUARDED_BY(mu_) = 2;
  uint64_t next_mount_ GUARDED_BY(mu_) = 1;
  uint64_t free_stamps_reserved_ GUARDED_BY(mu_) = 0;  // S/free_stamps
  uint64_t free_stamps_reserved_at_ GUARDED_BY(mu_) = 0;  // the journal index of that reservation
  std::map<uint64_t, rpc::MountInfo> mounts_ GUARDED_BY(mu_);
  // Each mount's metadata.sync_interval, parsed once (SplitMountOptions); nullopt: the default.
  // Read on every metadata call (SyncDue), so under a lock of its own, taken after mu_.
  mutable Mutex sync_mu_ ACQUIRED_AFTER(mu_);
  std::map<uint64_t, std::optional<int64_t>> sync_ms_ GUARDED_BY(sync_mu_);
  std::map<uint64_t, WriteMode> write_modes_ GUARDED_BY(sync_mu_);  // each mount's `write` option
  // Opened under-storages by mount id (thread-safe on its own; loads from mounts_ via MountSource).
  UfsCounters ufs_counters_;
  uint64_t list_ahead_entries_ = kListAheadEntries;
  const UfsAccess access_;
  MountTable open_mounts_{[this](uint64_t id) { return MountSource(id); }, access_, &ufs_counters_};

  std::array<Mutex, 64> list_locks_;  // stripe by directory inode

  // The R keys (directory renames being written out), mirrored for GetRecord; `renames_pending_`
  // spares every read the lock while there is none. A leaf lock.
  mutable Mutex pending_mu_ ACQUIRED_AFTER(mu_);
  std::vector<PendingRename> pending_renames_ GUARDED_BY(pending_mu_);
  std::atomic<bool> renames_pending_{false};
  void SetPendingRenames(std::vector<PendingRename> p) EXCLUDES(pending_mu_);
  std::function<Status()> rename_hook_;  // tests (set before use)
  size_t rename_batch_ = 1024;           // records per batch of a directory rename
};

}  // namespace granary::master
