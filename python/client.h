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
// Thread-safe; blocking (the Python binding releases the GIL around every call).
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "common/status.h"
#include "common/thread_annotations.h"
#include "fuse/local_channel.h"
#include "proto/granary.pb.h"

namespace granary::python {

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

  // `path`: absolute in the namespace ("/imagenet/train/x.JPEG"); "." and ".." are resolved by
  // name; NOT_FOUND, PERMISSION_DENIED (the entry's mode), FAILED_PRECONDITION (a path component
  // that is not a directory).
  StatusOr<Entry> Stat(std::string_view path);
  // Every entry of a directory, in the master's order.
  StatusOr<std::vector<std::pair<std::string, Entry>>> List(std::string_view path);
  // INVALID_ARGUMENT for a directory.
  StatusOr<std::shared_ptr<File>> Open(std::string_view path);
  // Up to `length` bytes at `offset` of `f` into `dst` (fewer only at the end of the file).
  StatusOr<uint64_t> Read(File& f, uint64_t offset, uint64_t length, char* dst);

  // The path, made absolute and clean ("a//b/../c" -> "/a/c").
  static std::string Clean(std::string_view path);

 private:
  explicit Client(ClientOptions o) : o_(std::move(o)), ch_(o_.socket) {}
  using Clock = std::chrono::steady_clock;
  struct Cached {
    Entry entry;
    Clock::time_point expires;
  };
  // A metadata call, waiting out a worker that is away (UNAVAILABLE) for up to worker_wait.
  Status Call(const rpc::MetaCall& call, rpc::MetaAnswer* out);
  StatusOr<Entry> Lookup(const std::string& clean);  // cached
  void Remember(const std::string& clean, const Entry& e);
  void Forget();  // every cached entry (grants void: the worker restarted)
  Status ReadBlockRange(File& f, uint64_t index, uint64_t in_block, uint64_t length, char* dst);
  // The grant of `f`'s version again, after the worker restarted; FAILED_PRECONDITION when the
  // path now names another version.
  Status Regrant(File& f);

  const ClientOptions o_;
  fuse::LocalChannel ch_;
  Mutex mu_;
  std::unordered_map<std::string, Cached> entries_ GUARDED_BY(mu_);
};

}  // namespace granary::python
