// granary::python::Client: the C++ side of the Python package `granary` (granary:// for fsspec;
// docs/python.md). It talks to the node's worker only, through the worker's local socket — the
// same socket and the same LocalChannel granary-fuse reads cached blocks through — so a training
// process needs neither a FUSE mount nor the master's token:
//   - the namespace: MetaCall ROOT / LOOKUP / READDIR / GETFILE, walked from the root with the
//     grants the worker hands out (worker/meta_proxy.h), cached here as granary-fuse has the
//     kernel cache it: entries and listings for `metadata_ttl` (fuse.entry_timeout and
//     fuse.attr_timeout's default, 60 s), nothing below a writable mount (close-to-open);
//   - the bytes: a cached block arrives as a leased descriptor and is read with pread straight
//     into the caller's buffer; a miss is fetched by the worker as for FUSE and comes inline or
//     through the connection's pipe.
// An open file (File) is one version: its reads name that version, and the worker answers
// FAILED_PRECONDITION (VersionChangedError) once the under-storage has another — never a mix.
// A restarted worker voids the grants (UNAUTHENTICATED): the client walks again and goes on when
// the file is the same version; a worker that is away is waited for up to `worker_wait`.
// Opens served from cached information are noted to the master (fuse/open_notes.h), so its
// fetch-ahead warms what a cold epoch reads next, as for the mount.
// Thread-safe; blocking (the Python binding releases the GIL around every call). Not across
// fork(): a child makes a Client of its own (the Python package does) and never destroys the one
// it inherited (its thread did not come along).
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "common/status.h"
#include "common/thread_annotations.h"
#include "fuse/local_channel.h"
#include "fuse/open_notes.h"
#include "proto/granary.pb.h"

namespace granary::python {

// What a Status does not say for a Python errno, said within this client only (beyond
// common/status.h's Reason values; never sent anywhere).
inline constexpr Reason kIsDirectory = static_cast<Reason>(101);   // INVALID_ARGUMENT: EISDIR
inline constexpr Reason kNotDirectory = static_cast<Reason>(102);  // FAILED_PRECONDITION: ENOTDIR
inline constexpr Reason kNameTooLong = static_cast<Reason>(103);   // INVALID_ARGUMENT: ENAMETOOLONG
inline constexpr Reason kOtherProcess = static_cast<Reason>(104);  // FAILED_PRECONDITION: EBADF

// Paths longer than this are refused (ENAMETOOLONG), as the kernel refuses them.
inline constexpr size_t kMaxPath = 4096;

struct ClientOptions {
  std::string socket;  // the worker's local socket (worker.local_socket)
  std::chrono::milliseconds metadata_ttl{60000};
  std::chrono::milliseconds worker_wait{60000};
  size_t max_entries = 262144;  // entries cached (all are dropped when it is reached)
};

// One entry of the namespace, as the worker answered it for this process's user.
struct Entry {
  rpc::Attr attr;
  std::shared_ptr<const rpc::FileInfo> file;  // a regular file's open information, when it came
  std::string grant, data_grant;              // worker/meta_proxy.h (empty for root)
};

// An open regular file: one version. Its reads may run on several threads at once.
struct File {
  std::string path;
  rpc::FileInfo info;
  uint64_t size() const { return info.attr().size(); }
  std::string grant() {
    MutexLock lock(&mu);
    return data_grant;
  }
  void set_grant(std::string g) {
    MutexLock lock(&mu);
    data_grant = std::move(g);
  }

 private:
  Mutex mu;
  std::string data_grant GUARDED_BY(mu);  // renewed after a worker's restart (Client::Regrant)
};

class Client {
 public:
  static StatusOr<std::shared_ptr<Client>> Create(ClientOptions o);
  ~Client();

  // True in a process forked after this client was made: it must not be used there (its
  // connections are the parent's; every call fails with kOtherProcess), and it is never really
  // destroyed there (its thread stayed in the parent): its memory is left, its descriptors closed
  // with the process.
  bool Forked() const;

  // `path`: absolute in the namespace ("/imagenet/train/x.JPEG"); "." and ".." are resolved by
  // name; NOT_FOUND, PERMISSION_DENIED (the entry's mode), FAILED_PRECONDITION (a path component
  // that is not a directory).
  StatusOr<Entry> Stat(std::string_view path);
  // Every entry of a directory, in the master's order.
  StatusOr<std::vector<std::pair<std::string, Entry>>> List(std::string_view path);
  // INVALID_ARGUMENT for a directory.
  StatusOr<std::shared_ptr<File>> Open(std::string_view path);
  // Open, when it needs no call to the worker (the entry is cached with its information); null
  // otherwise (call Open). Never blocks on I/O: the binding calls it holding the GIL.
  std::shared_ptr<File> OpenCached(std::string_view path);
  // Up to `length` bytes at `offset` of `f` into `dst` (fewer only at the end of the file).
  StatusOr<uint64_t> Read(File& f, uint64_t offset, uint64_t length, char* dst);

  // The path, made absolute and clean ("a//b/../c" -> "/a/c").
  static std::string Clean(std::string_view path);

 private:
  explicit Client(ClientOptions o);
  using Clock = std::chrono::steady_clock;
  struct Cached {
    Entry entry;
    Clock::time_point expires;
  };
  // kOtherProcess after a fork (see Forked).
  Status CheckProcess() const;
  // How long an entry answered now may be kept: metadata_ttl, and less than its grants live.
  std::chrono::milliseconds KeepFor(uint64_t grant_ttl_ms) const;
  // A metadata call, waiting out a worker that is away (UNAVAILABLE) for up to worker_wait.
  Status Call(const rpc::MetaCall& call, rpc::MetaAnswer* out);
  StatusOr<Entry> Lookup(const std::string& clean);  // cached; walks from the deepest cached parent
  // One LOOKUP of `name` in `parent` (at parent_path), remembered as `clean`.
  StatusOr<Entry> LookupIn(const std::string& parent_path, const Entry& parent, const std::string& clean,
                           const std::string& name);
  void Remember(const std::string& clean, const Entry& e, uint64_t grant_ttl_ms);
  void Forget();  // every cached entry (grants void: the worker restarted)
  // The entry at `clean`: a file that changed under a read is asked for with GETFILE at its next
  // open (the master checks it with the under-storage then), as granary-fuse does.
  void ForgetChanged(const std::string& clean, uint64_t ino);
  Status ReadBlockRange(File& f, uint64_t index, uint64_t in_block, uint64_t length, char* dst);
  // Lists directory `dir` (at `clean`) into the cache, and into *out when given; at most `cap`
  // entries (OUT_OF_RANGE past it: what was listed stays cached).
  Status ListInto(const std::string& clean, const Entry& dir, std::vector<std::pair<std::string, Entry>>* out,
                  size_t cap);
  // Whether a lookup that missed in directory `ino` should list it whole instead (its second miss
  // there since it was last listed), as a reader going through a directory's files would
  // otherwise make one LOOKUP round trip per file (an epoch with the caches dropped).
  bool ShouldList(uint64_t ino);
  void Listed(uint64_t ino, bool whole);
  // The grant of `f`'s version again, after the worker restarted; FAILED_PRECONDITION when the
  // path now names another version.
  Status Regrant(File& f);

  const ClientOptions o_;
  const uint64_t forks_;  // ForkCount() when it was made
  // Pointers, so that a forked child can leave them undestroyed (see Forked).
  std::unique_ptr<fuse::LocalChannel> ch_;
  // Opens served from listed or looked-up information, sent to the master through the worker
  // (MetaCall NOTE_OPENS): fetch-ahead's evidence, as granary-fuse sends it.
  std::unique_ptr<fuse::OpenNotes> notes_;

  Mutex mu_;
  std::unordered_map<std::string, Cached> entries_ GUARDED_BY(mu_);
  struct DirState {
    uint32_t misses = 0;          // lookups that missed since it was last listed
    Clock::time_point listed{};   // when it was last listed (its entries are cached until + ttl)
    bool too_big = false;         // more than max_entries / 4: looked up name by name
  };
  std::unordered_map<uint64_t, DirState> dirs_ GUARDED_BY(mu_);
  std::unordered_set<uint64_t> changed_ GUARDED_BY(mu_);  // files whose next open asks GETFILE
  // The grants NOTE_OPENS names files with (a reader's), by ino, until sent.
  std::unordered_map<uint64_t, std::string> note_grants_ GUARDED_BY(mu_);
  static constexpr size_t kMaxDirs = 65536;  // directories remembered (all dropped past it)
};

}  // namespace granary::python
