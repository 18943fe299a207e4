// LocalServer: the worker's Unix domain socket for the FUSE client on the same node (zero-copy
// reads; protocol in granary.proto, LocalRequest).
//
// A read of a cached block is answered with the block file's descriptor (SCM_RIGHTS) and where the
// bytes are in it; the FUSE client splices them into its reply to the kernel, so cached bytes are
// never copied through this process or a socket. Each descriptor is a lease on the block
// (BlockStore::Lease): the block is neither evicted nor moved until the client releases it, or its
// connection closes (a FUSE process that dies releases everything it held). Misses are served by
// BlockSource as usual and sent inline, or — a range of a fetch's buffer of at least
// StreamPipe::kMinBytes, on a connection that gave the worker a pipe (LocalRequest.stream_pipe) —
// put into that pipe with vmsplice, so the bytes cross to granary-fuse without a copy and it
// splices them on into its FUSE reply.
//
// Access: the socket file is 0600 in a directory the worker owns, and a connecting process must
// run as root or as the worker's own user (SO_PEERCRED); the gRPC token is not asked for here.
// With worker.local_socket_group the socket is 0660 to that group (the file's mode is then what
// lets a process connect) and its members' connections are readers (worker/meta_proxy.h): the
// namespace through LocalRequest.meta with grants, reads only with a file's data grant, no write
// sessions, no under-storage files handed over (want_source).
//
// One thread accepts; each connection gets a thread of its own (a FUSE client opens about one per
// reader thread) that ends with its connection (common/unix_server.h). Thread-safe; Stop() shuts every connection down and
// waits for their threads.
#pragma once

#include <atomic>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "common/metrics.h"
#include "common/unix_server.h"
#include "common/status.h"
#include "common/thread_annotations.h"
#include "worker/block_source.h"
#include "worker/block_store.h"

namespace granary::worker {

class WriteSessions;
class MetaProxy;

class LocalServer {
 public:
  // The blocks of a source file (want_source) whose cached state is sent with it (source_cached):
  // granary-fuse's SourceReads::kMaxBlocks.
  static constexpr uint64_t kSourceCachedBlocks = 4096;
  // Listens on `path` (a stale socket file there is replaced).
  // `writes` (may be null: writes are refused) serves the write sessions (LocalRequest.write).
  // `meta` (may be null: metadata calls are refused) answers LocalRequest.meta. `group_readers`:
  // processes that are neither root nor this user may connect (the caller made the socket's file
  // mode decide who can), as readers.
  static StatusOr<std::unique_ptr<LocalServer>> Start(const std::string& path, BlockSource* source,
                                                      WriteSessions* writes = nullptr, MetaProxy* meta = nullptr,
                                                      bool group_readers = false);
  ~LocalServer();
  void Stop();
  const std::string& path() const { return path_; }

  // Time to answer one read request (a lease or the bytes).
  const metrics::Histogram& read_latency() const { return read_latency_; }

  // Connections at most (granary-fuse opens about one per reader thread), and per user for
  // readers of worker.local_socket_group (past it, a reader's connection is answered
  // RESOURCE_EXHAUSTED and closed).
  static constexpr size_t kMaxConnections = 4096;
  static constexpr uint32_t kMaxReaderConnections = 256;

 private:
  LocalServer(std::string path, BlockSource* source, WriteSessions* writes, MetaProxy* meta)
      : path_(std::move(path)), source_(source), writes_(writes), meta_(meta) {}
  // One connection, on its own thread (UnixServer closes it when this returns).
  void Serve(int conn);

  // A connection's pipe for the bytes of fetch buffers (LocalRequest.stream_pipe): a range put
  // there with vmsplice references the buffer's pages instead of copying them through the socket,
  // so the buffer is held (`held`) until the client's next frame, which it sends only after
  // draining the pipe, or until an idle connection's pipe is seen empty (every kHeldCheckMs).
  struct StreamPipe {
    static constexpr size_t kMinBytes = 64 * 1024;  // smaller ranges go inline: a copy costs less
    static constexpr int kHeldCheckMs = 20;  // an idle connection's pipe is looked at this often while held
    int fd = -1;
    size_t capacity = 0;
    SharedBytes held;
    ~StreamPipe();
    bool Empty() const;  // nothing left in the pipe (false without one)
    // Takes `pipe_fd` (closes it when it is not a pipe's write end).
    Status Adopt(int pipe_fd);
    // Puts b's bytes into the pipe when they fit in it and it is empty (kPiped), else nothing
    // (kInline: send them after the answer); kBroken: only part went in (the client closed its
    // end), the connection must end.
    enum class Put { kInline, kPiped, kBroken };
    Put TryPut(const SharedBytes& b);
  };

  const std::string path_;
  BlockSource* source_;
  metrics::Histogram read_latency_;
  WriteSessions* writes_;
  MetaProxy* meta_;
  std::atomic<uint64_t> next_conn_{1};  // numbers connections for the write sessions
  Mutex readers_mu_;
  std::unordered_map<uint32_t, uint32_t> reader_conns_ GUARDED_BY(readers_mu_);  // readers' connections by uid
  std::unique_ptr<UnixServer> server_;  // accepts, checks the peer, a thread per connection
};

}  // namespace granary::worker
