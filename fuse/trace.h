// Tracer: the access trace of one granary-fuse, streamed to `granary trace` (over granary-fuse's
// root-only trace socket, common/stream_socket.h; never a network port) and summarised by
// `granary profile`.
//
// Cost: an operation asks Listening() — one relaxed atomic load — and builds a record only when a
// listener is connected; with none, nothing else happens (records() stays 0, which the tests
// check). Records go to each listener's own bounded queue (kQueue; beyond it they are dropped and
// counted, so a slow listener never slows the mount); the listener's thread filters them (pid,
// path prefix, operations), resolves inode numbers to namespace paths (PathFn, with a cache per
// listener) and writes one JSON object per line:
//
//   {"time":"2026-11-25T03:40:01.123456Z","pid":123,"uid":0,"op":"read","path":"/imagenet/a.jpg",
//    "ino":42,"offset":0,"size":131072,"result":"ok","latency_us":87,"source":"local"}
//
// `result` is "ok" or the errno name replied; `source` (reads only) is where the bytes came from:
// local (this node's worker cache), peer, under_storage, or mixed. Reads the kernel serves itself
// (page cache, passthrough, kernel-served opens) never reach granary-fuse and are not traced.
// Thread-safe.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "common/stream_socket.h"
#include "common/thread_annotations.h"

namespace granary::fuse {

// Every operation name a record may carry (OpScope's names in fuse/ops_*.cc): `granary trace --op`
// accepts these and refuses anything else.
inline const std::vector<std::string> kTracedOps = {
    "lookup", "getattr", "opendir", "readdir", "readdirplus", "statfs", "open",  "read",   "release",
    "create", "write",   "flush",   "fsync",   "setattr",     "mkdir",  "rmdir", "unlink", "rename"};

struct TraceRecord {
  int64_t time_ns = 0;  // wall clock at the operation's start
  uint32_t pid = 0, uid = 0;
  const char* op = "";  // a static string: lookup, getattr, open, read, ...
  uint64_t ino = 0;     // master inode (lookup: the parent)
  std::string name;     // lookup, create, mkdir, unlink, rmdir, rename: the child's name in `ino`
  uint64_t to_parent = 0;  // rename: the new directory (master inode) and name
  std::string to_name;
  uint64_t child = 0;   // lookup: the child's master inode (0: not found)
  uint64_t offset = 0, size = 0;
  int err = 0;          // 0: success
  double latency = 0;   // seconds
  const char* source = "";  // reads: local, peer, under_storage or mixed
};

class Tracer {
 public:
  // Master inode -> namespace path ("" when unknown). Called on listeners' threads only.
  using PathFn = std::function<std::string(uint64_t ino)>;
  static constexpr size_t kQueue = 65536;  // records a listener may fall behind by

  explicit Tracer(PathFn path) : path_(std::move(path)) {}
  ~Tracer() { Close(); }

  bool Listening() const { return listeners_.load(std::memory_order_relaxed) > 0; }
  void Emit(TraceRecord r);
  // Streams records to one listener until it goes away or Close(). `params`: pid (a number),
  // prefix (a namespace path), op (comma-separated operation names); all optional.
  void Serve(const std::map<std::string, std::string>& params, StreamSink* sink);
  // Ends every listener's stream and refuses new ones (shutdown); Reopen accepts them again.
  void Close();
  void Reopen();

  uint64_t records() const { return records_.load(); }  // records built (with a listener) so far
  uint64_t dropped() const { return dropped_.load(); }  // records a slow listener missed

 private:
  const PathFn path_;
  std::atomic<int> listeners_{0};
  std::atomic<uint64_t> records_{0}, dropped_{0};
  Mutex mu_;
  std::condition_variable cv_;
  // Each listener's records not yet written, by the number its Serve call took (kept here, not in
  // a struct of the listener's, so that the analysis sees them guarded by mu_).
  std::map<uint64_t, std::deque<TraceRecord>> live_ GUARDED_BY(mu_);
  uint64_t next_listener_ GUARDED_BY(mu_) = 0;
  bool closed_ GUARDED_BY(mu_) = false;
};

// One record as the JSON line described above (without the newline).
std::string TraceLine(const TraceRecord& r, const std::string& path, const std::string& to = "");

}  // namespace granary::fuse
