// UnderFileSystem: the one interface Granary uses to reach the storage a dataset lives in.
//
// Paths are relative to the URI a dataset was mounted from, '/'-separated, with no leading slash;
// "" is the root. Every file has a `version` (local files: size, mtime and inode; S3: the ETag)
// that changes whenever its bytes may have changed. Reads name the version they expect and fail
// with FAILED_PRECONDITION when the file no longer has it, so the bytes of two versions are never
// mixed in one block.
//
// Implementations are thread-safe: the master lists and the worker reads from many threads.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/backoff.h"
#include "common/status.h"
#include "common/thread_annotations.h"

namespace granary {

struct UfsEntry {
  std::string name;  // last path component ("" for the root)
  bool is_dir = false;
  uint64_t size = 0;
  int64_t mtime_ns = 0;
  uint32_t mode = 0;  // permission bits only
  uint32_t uid = 0;
  uint32_t gid = 0;
  std::string version;  // empty for directories
};

// A file of this machine open for reading (UnderFileSystem::OpenLocal), and what its stat said
// when it was found to have the version asked for. A reader checks the stat again after each read:
// another size, modification time or inode means the file changed under it (its bytes may mix two
// versions), and the read must fail as a version change does.
struct LocalFile {
  int fd = -1;
  uint64_t size = 0;
  int64_t mtime_ns = 0;
  uint64_t ino = 0;
};

// A file being written to the under-storage (UnderFileSystem::Create): its bytes in order with
// Append, then Commit, which makes the whole file appear at its path at once — replacing what was
// there — or Abort (also what destroying an uncommitted writer does). Never a partial or mixed
// file at the path: local and NFS stores write a hidden temporary file beside it (named with
// kWritingPrefix, skipped by listings) and rename it; object stores upload parts of a multipart
// upload and complete it. Not thread-safe (one writer, one thread at a time).
// What a setattr changes (chmod, chown, utimes): each field that is set.
struct UfsAttrChange {
  std::optional<uint32_t> mode;  // permission bits (07777)
  std::optional<uint32_t> uid, gid;
  std::optional<int64_t> atime_ns, mtime_ns;
};

class UfsWriter {
 public:
  virtual ~UfsWriter() = default;
  virtual Status Append(std::string_view data) = 0;
  // Durable at its path when this returns OK; the file's entry as the store now has it (its new
  // version). After Commit or Abort the writer takes no more calls.
  virtual StatusOr<UfsEntry> Commit() = 0;
  virtual void Abort() = 0;
  // The mode, owner and times the file has when Commit puts it at its path (a chmod, chown or
  // utimes its writer made while writing). Called after the last Append, before Commit. Stores
  // that keep attributes apply them as the writer (an error names what was refused: the file can
  // still be committed without them); object stores keep none and return OK.
  virtual Status SetAttrs(const UfsAttrChange& change);
};

// Who a write call acts for: the ids of the process that asked through the mount (the FUSE
// request's uid, gid and supplementary groups). Stores that keep owners make files and directories
// as this user and let their own permission checks apply (local directories: the call runs with
// these ids as the thread's filesystem ids when the daemon is root; NFS: the new entry is given
// this owner); object stores keep no owner and ignore it. The default is the daemon itself.
struct WriteCaller {
  uint32_t uid = 0, gid = 0;
  std::vector<uint32_t> groups;  // supplementary groups
};

// Names of the temporary files writers make beside their targets; listings skip them.
inline constexpr std::string_view kWritingPrefix = ".granary-writing-";
bool IsWritingName(std::string_view name);

// The front of a Read's buffer as it fills, for readers that want the first bytes of a block
// before the rest has come (worker/block_source.h, "Streaming"). The reading store calls Landed(n)
// once the first n bytes of the buffer hold their final bytes: never less than before, and nothing
// below it is written again (a retried request skips what landed: the version it reads is pinned,
// so the bytes are the same). Finish() says the Read returned, either way: waiters stop waiting.
// Thread-safe.
class ReadProgress {
 public:
  void Landed(uint64_t n) EXCLUDES(mu_);
  void Finish() EXCLUDES(mu_);
  uint64_t landed() const { return landed_.load(std::memory_order_acquire); }
  // Waits until at least n bytes landed or the Read finished; returns the bytes landed.
  uint64_t WaitFor(uint64_t n) EXCLUDES(mu_);

 private:
  Mutex mu_;
  std::condition_variable cv_;
  std::atomic<uint64_t> landed_{0};
  bool finished_ GUARDED_BY(mu_) = false;
  // The fewest bytes a waiter needs (none waits: the maximum). Landed wakes the waiters only when
  // it reaches this, not on every piece curl hands over: each woke every streaming reader to find
  // its range not there yet (a fifth of a worker's CPU on cold shards, docs/benchmarks.md session
  // 40). Woken waiters that still need more set it again.
  uint64_t wake_at_ GUARDED_BY(mu_) = UINT64_MAX;
};

class UnderFileSystem {
 public:
  virtual ~UnderFileSystem() = default;

  // The URI this was opened with, without credentials; part of every block's identity.
  virtual const std::string& uri() const = 0;

  // NOT_FOUND when the path does not exist.
  virtual StatusOr<UfsEntry> Stat(const std::string& path) = 0;

  // Calls `on_page` with batches of at most `page_size` children of `dir` (files and directories
  // only; entries whose names cannot be file names are skipped with a warning). Order is
  // unspecified. Stops with the first error on_page returns.
  using PageFn = std::function<Status(std::vector<UfsEntry>& page)>;
  virtual Status List(const std::string& dir, size_t page_size, const PageFn& on_page) = 0;

  // Every entry below `dir`, for a bulk metadata load: pages of entries whose `name` is the path
  // relative to `dir` ("a/b/c.jpg"). What is below a directory comes together and right after the
  // directory's own entry if it has one (directories may be implied by their entries only, as in
  // object storage). The default walks the tree with List, depth first (a directory's files, then
  // each subdirectory in name order: its entry, then what is below it); object stores override it
  // with one flat, paged listing in key order.
  //
  // Resuming: `after`, when not empty, is the checkpoint of an earlier ListTree of the same `dir`:
  // the `name` of the last entry of a page it passed to on_page, followed by '/' if that entry is a
  // directory. The listing then continues where that one stopped, passing nothing again except,
  // where the order within a directory is not fixed (the walk) and the checkpoint is a file, the
  // other files of its directory. A checkpoint the tree no longer holds resumes at the place it
  // would have had.
  virtual Status ListTree(const std::string& dir, size_t page_size, const PageFn& on_page, const std::string& after);
  // Whether ListTree is one flat, paged listing (object stores) rather than a walk with List: then
  // a small subtree is listed in fewer requests by ListTree than directory by directory.
  virtual bool ListsTreeFlat() const { return false; }

  // Reads up to `length` bytes at `offset` of `path`, which must still have `version`, into `out`.
  // Returns the bytes read (fewer only at end of file). FAILED_PRECONDITION when the version differs.
  virtual StatusOr<size_t> Read(const std::string& path, const std::string& version, uint64_t offset,
                                size_t length, char* out) = 0;
  // Read, reporting to `progress` (may be null) the front of `out` as it lands. The default reads
  // with Read and reports nothing until it returns (the caller then has all of it); stores that
  // receive a body front to back (S3, OSS) report as it comes. Does not call progress->Finish().
  virtual StatusOr<size_t> ReadStreaming(const std::string& path, const std::string& version, uint64_t offset,
                                         size_t length, char* out, ReadProgress* progress);
  // ReadStreaming(path, version, 0, size, out, progress) for a caller that reads the whole file,
  // `size` bytes as listed: a store that serves a whole object more cheaply than a range of it
  // asks for it whole (S3 and OSS: a GET without a Range, which RGW answers with ~25% less CPU;
  // docs/benchmarks.md, session 44). The default is that ReadStreaming.
  virtual StatusOr<size_t> ReadWhole(const std::string& path, const std::string& version, size_t size, char* out,
                                     ReadProgress* progress);

  // `path` open for reading, for a reader on this machine that reads it itself (granary-fuse's
  // source reads, fuse/source_reads.h), found to have `version`. The caller owns the descriptor.
  // FAILED_PRECONDITION (VersionChangedError) when the version differs; UNIMPLEMENTED where the
  // under-storage is not a file of this machine (object stores, NFS through libnfs).
  virtual StatusOr<LocalFile> OpenLocal(const std::string& path, const std::string& version);

  // The write calls (mounts with write=through or back; docs/semantics.md, "Writes"). Where a
  // store cannot make one whole, it answers NotSupportedError (EOPNOTSUPP) saying so; the defaults
  // do, for every call. Every name is resolved beneath the mount's root without following a
  // symbolic link (a link on the way is refused, PERMISSION_DENIED naming it), and each call acts
  // for `as` (WriteCaller). The default arguments are given here only: call through this class.
  //
  // A new file (or a whole new version of one) at `path`, with permission bits `mode` where the
  // store keeps them.
  virtual StatusOr<std::unique_ptr<UfsWriter>> Create(const std::string& path, uint32_t mode,
                                                      const WriteCaller& as = {});
  // Whether a file on filesystem `dev` (a staging file of this machine) can be taken whole by
  // Adopt, with no copy of its bytes. Default: no.
  virtual bool CanAdopt(uint64_t dev) const;
  // Create's whole job for a file complete in `fd` (its first `size` bytes are the file, and
  // nothing writes `fd` again): the store takes that file itself — a local directory on the same
  // filesystem links it in, one copy of the bytes fewer — given to `as`, with `mode` and `attrs`,
  // durable and at `path` when this returns. UNIMPLEMENTED when it cannot (another filesystem, a
  // file longer than `size`, an object store): the caller writes a copy through Create.
  virtual StatusOr<UfsEntry> Adopt(const std::string& path, int fd, uint64_t size, uint32_t mode,
                                   const UfsAttrChange& attrs, const WriteCaller& as = {});
  // Removes the file `path` (NOT_FOUND when absent).
  virtual Status Remove(const std::string& path, const WriteCaller& as = {});
  // Makes the directory `path` (ALREADY_EXISTS when something is there).
  virtual Status MakeDir(const std::string& path, uint32_t mode, const WriteCaller& as = {});
  // Removes the empty directory `path` (NotEmptyError when it has entries).
  virtual Status RemoveDir(const std::string& path, const WriteCaller& as = {});
  // Renames the file or directory `from` to `to`, replacing a file at `to` (directories: where the
  // store can rename them at once).
  virtual Status Rename(const std::string& from, const std::string& to, const WriteCaller& as = {});
  // chmod, chown and utimes of `path` where the store keeps them (local, NFS); the default answers
  // NotSupportedError.
  virtual Status SetAttr(const std::string& path, const UfsAttrChange& change, const WriteCaller& as = {});
};

struct ParsedUri {
  std::string scheme;     // "file", "s3", ...
  std::string authority;  // bucket or server; empty for file://
  std::string path;       // absolute for file://, else without leading '/'; no query string
  std::string query;      // after '?', e.g. "version=4&nfsport=2049"
};

// "file:///srv/x", "/srv/x" (taken as file://), "s3://bucket/prefix".
StatusOr<ParsedUri> ParseUri(const std::string& uri);

// A URI safe to print: user-info and query string removed.
std::string RedactUri(const std::string& uri);

// True when `name` can be one path component: not empty, not "." or "..", no '/', no NUL, at most
// 255 bytes.
bool IsValidName(const std::string& name);

// OK when `path` is "" or valid names joined by single '/': no leading '/', no empty, "." or ".."
// segment — so it can never resolve outside the mount. INVALID_ARGUMENT otherwise.
Status CheckRelativePath(const std::string& path);

// Joins a relative directory and a child name ("" + "a" = "a", "a" + "b" = "a/b").
std::string JoinPath(const std::string& dir, const std::string& name);

// Requests to the under-storage, counted by whoever opened it (the worker's reads, the master's
// listings): one count per call of the interface, however many attempts it took. `retries` counts
// the attempts beyond the first (an implementation that retries calls NoteUfsRetry() on the thread
// making the call), `errors` the calls that failed in the end (NOT_FOUND and a changed version
// included: the caller decides what they mean). Shared by /metrics, `granary stats` and GetStats.
struct UfsCounters {
  std::atomic<uint64_t> stats{0}, lists{0}, reads{0};  // calls by operation
  std::atomic<uint64_t> writes{0};  // Create, Remove, MakeDir, RemoveDir, Rename (not each Append)
  std::atomic<uint64_t> read_bytes{0};
  std::atomic<uint64_t> retries{0};
  std::atomic<uint64_t> errors{0};
};

// Called by an implementation before each attempt beyond the first of one call.
void NoteUfsRetry();

// The retry contract every remote under-storage keeps (s3://, oss://, nfs://), from the mount
// options `max_attempts` (tries per call, 1-100) and `retry_deadline` (no retry starts after it):
// a call that fails with a retryable status (Status::IsRetryable: the store unreachable, a
// connection reset, a timeout, a 5xx) is tried again after a pause (common/backoff.h,
// kUnderStorageRetry); any other failure is returned at once.
struct UfsRetry {
  int max_attempts = 5;
  std::chrono::milliseconds deadline{20000};
  // Takes `max_attempts` and `retry_deadline` out of `options` (the rest stay for the caller).
  static StatusOr<UfsRetry> FromOptions(std::map<std::string, std::string>* options);
};

inline Status StatusOfResult(const Status& s) { return s; }
template <typename T>
Status StatusOfResult(const StatusOr<T>& s) {
  return s.status();
}

// Runs `attempt` (returning Status or StatusOr<T>) under `retry`'s contract; `may_retry()`, asked
// after a retryable failure, can refuse a retry (a listing that already handed pages on).
template <typename Fn, typename MayRetry>
auto RetryUfsCall(const UfsRetry& retry, Fn attempt, MayRetry may_retry) -> decltype(attempt()) {
  const auto deadline = std::chrono::steady_clock::now() + retry.deadline;
  Backoff backoff(kUnderStorageRetry);
  for (int n = 1;; ++n) {
    auto result = attempt();
    const Status st = StatusOfResult(result);
    if (st.ok() || !st.IsRetryable() || n >= retry.max_attempts || !may_retry()) return result;
    if (!backoff.SleepBefore(deadline)) return result;
    NoteUfsRetry();
  }
}
template <typename Fn>
auto RetryUfsCall(const UfsRetry& retry, Fn attempt) -> decltype(attempt()) {
  return RetryUfsCall(retry, std::move(attempt), [] { return true; });
}

// `s`, with an UNAVAILABLE that carries no reason marked Reason::kUnderStorage: the storage failed
// (after its retries), not the daemon that passes the error on (common/status.h).
Status MarkUnderStorage(const Status& s);

// `ufs`, with every call counted into `counters` (which must outlive the result), and its
// UNAVAILABLE errors marked (MarkUnderStorage).
std::shared_ptr<UnderFileSystem> CountedUfs(std::shared_ptr<UnderFileSystem> ufs, UfsCounters* counters);

// Opens the under-storage named by `uri`. `options` are per-mount settings (credentials, endpoint).
// A file:// mount's reads stay within `local_roots` when it is not empty (LocalUfs).
StatusOr<std::shared_ptr<UnderFileSystem>> OpenUnderFileSystem(const std::string& uri,
                                                                const std::map<std::string, std::string>& options,
                                                                const std::vector<std::string>& local_roots = {});

}  // namespace granary
