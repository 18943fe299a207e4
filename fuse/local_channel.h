// LocalChannel: granary-fuse's end of the worker's local socket (worker/local_server.h), for
// zero-copy reads of cached blocks on this node.
//
// Read() returns a Piece: either a leased block file (fd >= 0; the requested bytes are `length` at
// `offset` of it), which the caller splices into its FUSE reply and then hands back with Release()
// — the lease keeps the worker from evicting or moving the block meanwhile — or the bytes inline (a
// miss the worker served the usual way), or in the connection's pipe (a range of a block the
// worker is fetching: it put the pages of its buffer there with vmsplice, and the caller splices
// them on into the reply, so they are copied once, into the FUSE reply, not through the socket).
// Connections are pooled, one per concurrent reader; a connection that fails is closed and the
// error returned, so the caller can fall back to gRPC.
// Thread-safe.
#pragma once

#include <atomic>
#include <chrono>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "common/status.h"
#include "common/thread_annotations.h"
#include "fuse/source_reads.h"
#include "proto/granary.pb.h"
#include "rpc/wire.h"

namespace granary::fuse {

// Where the bytes of a read came from, seen from this node: this node's worker's cache, another
// worker (its cache, or a fetch it made as the block's home), or the under-storage.
enum class NodeSource : uint32_t { kLocal = 0, kPeer = 1, kUnderStorage = 2 };
const char* NodeSourceName(NodeSource s);  // "local", "peer", "under_storage"
// The source a worker reported (rpc/wire.h), seen from this node: `this_node` when that worker is
// this node's own.
inline NodeSource NodeSourceOf(rpc::ReadSource s, bool this_node) {
  switch (s) {
    case rpc::ReadSource::kCache: return this_node ? NodeSource::kLocal : NodeSource::kPeer;
    case rpc::ReadSource::kPeer: return NodeSource::kPeer;
    case rpc::ReadSource::kUnderStorage: return NodeSource::kUnderStorage;
  }
  return NodeSource::kUnderStorage;
}

class LocalChannel {
 public:
  struct Piece {
    int fd = -1;          // a leased block file, or -1
    uint64_t offset = 0;  // where the bytes start in fd
    uint64_t length = 0;
    std::string data;     // the bytes, when fd < 0 and mem is null
    // The bytes, when fd < 0 and they were read straight into the caller's buffer (Client::Read's
    // `scratch`): not owned.
    const char* mem = nullptr;
    const char* bytes() const { return mem != nullptr ? mem : data.data(); }
    uint64_t lease = 0;
    // fd is the connection's pipe (LocalRequest.stream_pipe), not owned: its next `length` bytes
    // are the piece's, to be consumed once (splice it without FUSE_BUF_FD_SEEK, or ReadInto); the
    // connection is held until Release.
    bool pipe = false;
    int conn = -1;        // the connection holding the lease or the pipe (-1: none, or a lease line)
    uint64_t shared_gen = 0;  // nonzero: the lease lives on lease line `line`, of this generation
    unsigned line = 0;
    NodeSource source = NodeSource::kLocal;  // where the bytes came from
  };

  // `io_timeout` (0: none, granary-fuse's): a send or receive that waits longer fails (the
  // connection is closed, the call UNAVAILABLE), for a client that must not hang on a worker that
  // accepts but never answers (the Python client).
  explicit LocalChannel(std::string path, std::chrono::milliseconds io_timeout = std::chrono::milliseconds(0))
      : path_(std::move(path)), io_timeout_(io_timeout) {}
  ~LocalChannel();
  const std::string& path() const { return path_; }

  // UNAVAILABLE when the socket cannot be used (the worker went away); other errors are the
  // worker's answer about the data (FAILED_PRECONDITION: the file changed, ...).
  // With `want_source` and `source_file`: should the worker answer from the under-storage a file
  // of this machine, *source_file gets that file (fuse/source_reads.h).
  // With `into` (room for req.length() bytes), bytes the worker sends inline are received straight
  // there (out->mem = into): no copy between the socket and the reply.
  // `grant`: the file's data grant (LocalRequest.read_grant), for a client that is not root
  // (worker/meta_proxy.h).
  Status Read(const rpc::ReadBlockRequest& req, Piece* out, bool want_source = false,
              std::shared_ptr<const SourceFile>* source_file = nullptr, char* into = nullptr,
              const std::string& grant = {});
  // A metadata call through the worker (LocalRequest.meta; worker/meta_proxy.h). UNAVAILABLE when
  // the socket cannot be used; the worker's answer otherwise.
  Status Meta(const rpc::MetaCall& call, rpc::MetaAnswer* out);
  // Leases the whole data file of a file for a passthrough open (LocalRequest.whole_file):
  // out->fd is the data file, out->length the file's size. Such leases are long (as long as the
  // file is open), so they live on a few shared connections (lease lines, kLeaseLines) instead of
  // holding one each; concurrent opens take the lines in turn (one open at a time per line).
  // NOT_FOUND when the local worker does not keep the block.
  // With `verify`, the worker checks every chunk of the file first (DATA_LOSS when one fails).
  Status LeaseFile(const rpc::ReadBlockRequest& req, Piece* out, bool verify = false);
  // Ends a Piece's lease (if any) and closes its descriptor. Safe on any Piece, once. A pipe
  // piece's connection is used again only when its bytes were consumed.
  void Release(Piece* p);
  // A piece's bytes that are in a descriptor (a leased file, or the pipe), copied to `dst`.
  static Status ReadInto(const Piece& p, char* dst);

  // The pipe each connection gives the worker (LocalRequest.stream_pipe): a READ is at most
  // ~1 MiB, and a range takes a pipe slot per page it touches.
  static constexpr int kPipeBytes = 2 << 20;

 private:
  StatusOr<int> Take();
  void Give(int conn);
  // A new connection, with its pipe when the worker takes one.
  StatusOr<int> Connect();
  void CloseConn(int conn);  // and its pipe
  int PipeOf(int conn);      // -1: none

  // ConnectUnix, with io_timeout_ set on the connection.
  StatusOr<int> Dial();

  const std::string path_;
  const std::chrono::milliseconds io_timeout_;
  Mutex mu_;
  std::vector<int> idle_ GUARDED_BY(mu_);
  std::unordered_map<int, int> pipes_ GUARDED_BY(mu_);  // connection -> its pipe's read end (-1: none)
  // The shared connections for whole-file leases. One line carried them all until it was measured
  // to serialise every passthrough open behind the worker's wake-ups: a cold epoch of small files
  // in passthrough mode took 5.3-5.6 s against 3.3-3.5 s in kernel mode (docs/benchmarks.md,
  // session 42). A line's connection gets a new generation after it broke (the worker ended the
  // old one's leases when it closed).
  static constexpr unsigned kLeaseLines = 8;
  struct LeaseLine {
    Mutex mu;  // held for a lease's round trip, and to send a release
    int conn GUARDED_BY(mu) = -1;
    uint64_t gen GUARDED_BY(mu) = 0;
  };
  LeaseLine lines_[kLeaseLines];
  std::atomic<unsigned> next_line_{0};
};

}  // namespace granary::fuse
