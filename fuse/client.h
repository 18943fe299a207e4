// Client: what the FUSE process asks of the master (metadata) and of the worker on its node
// (block bytes). Every call has the rpc.timeout deadline and the shared token. Thread-safe.
//
// Block bytes come, in order of preference:
//   0. a range of a block the worker last answered from a local under-storage: read from that
//      file here (fuse.source_reads, fuse/source_reads.h);
//   1. through the local worker's Unix socket (fuse.zero_copy; the socket's path is learnt from the
//      worker): a cached block arrives as a leased file descriptor, spliced into the reply;
//   2. over gRPC from the local worker (a stream of chunks), when the socket is off or unusable;
//   3. over gRPC from another live worker (from the master's report), when the local worker is
//      unreachable: a restarting or dead worker costs readers a retry, not an error;
//   4. when none answers, the read waits for one (up to fuse.worker_wait), so a worker's restart
//      is a stall for readers, not EIO.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "common/config.h"
#include "common/metrics.h"
#include "common/status.h"
#include "common/thread_annotations.h"
#include "fuse/local_channel.h"
#include "fuse/source_reads.h"
#include "proto/granary.grpc.pb.h"
#include "rpc/rpc.h"

namespace granary::fuse {

// The bytes of one read, in order: leased block files and bytes in memory. The leases end when it
// is destroyed, so destroy it only after the reply to the kernel went out.
class ReadResult {
 public:
  ReadResult() = default;
  ReadResult(const ReadResult&) = delete;
  ReadResult& operator=(const ReadResult&) = delete;
  ~ReadResult();
  std::vector<LocalChannel::Piece> pieces;  // Piece::source is a NodeSource
  uint64_t size() const;
  std::string Flatten() const;  // the bytes, copied (tests, tools)

 private:
  friend class NodeClient;
  std::shared_ptr<LocalChannel> channel_;  // holds the leases
};

// The data file of a whole file, leased from the local worker for a passthrough open:
// `fd` holds the file's bytes at their own offsets. The worker keeps the block (no eviction, no
// move) until the lease is destroyed.
class FileLease {
 public:
  FileLease(std::shared_ptr<LocalChannel> ch, LocalChannel::Piece p) : channel_(std::move(ch)), piece_(std::move(p)) {}
  FileLease(const FileLease&) = delete;
  FileLease& operator=(const FileLease&) = delete;
  ~FileLease() { channel_->Release(&piece_); }
  int fd() const { return piece_.fd; }
  uint64_t length() const { return piece_.length; }

 private:
  std::shared_ptr<LocalChannel> channel_;
  LocalChannel::Piece piece_;
};


struct ClientCounters {
  std::atomic<uint64_t> zero_copy_pieces{0}, local_grpc_pieces{0}, failover_pieces{0}, prefetch_hints{0};
  std::atomic<uint64_t> piped_pieces{0};  // bytes of a fetch's buffer through the connection's pipe
  // Ranges read from a local under-storage's file by granary-fuse itself (fuse.source_reads).
  std::atomic<uint64_t> source_reads{0};
  // Reads that found no worker and waited for one (fuse.worker_wait), and those whose wait ended
  // with the bytes.
  std::atomic<uint64_t> worker_waits{0}, worker_waits_ended{0};
};

// Client: what granary-fuse asks of the master and of the workers — an interface, so the FUSE
// operations can be driven by a fake in tests; NodeClient (below) is the real one.
class Client {
 public:
  // The real client (NodeClient) for `cfg`.
  static StatusOr<std::unique_ptr<Client>> Create(const Config& cfg);
  virtual ~Client() = default;

  // With `file`: a regular file's open information is set in it too (LookupRequest.file; left empty
  // when the master checks the file with the under-storage first: GetFile then does).
  virtual StatusOr<rpc::Attr> Lookup(uint64_t parent, const std::string& name, rpc::FileInfo* file = nullptr) = 0;
  virtual StatusOr<rpc::Attr> GetAttr(uint64_t ino) = 0;
  virtual StatusOr<rpc::Attr> Resolve(const std::string& path) = 0;
  // For /readyz: one quick call to the master (no waiting out a failover): OK when it answers.
  virtual Status MasterAnswers() = 0;
  // `files`: with each regular file's open information (DirEntry.file).
  virtual Status ReadDir(uint64_t ino, uint64_t after, uint32_t limit, rpc::ReadDirResponse* out, bool files = false) = 0;
  virtual StatusOr<rpc::FileInfo> GetFile(uint64_t ino) = 0;
  // Opens made from listed information (fuse/open_notes.h): one quick call, no waiting out a failover.
  virtual Status NoteOpens(const std::vector<uint64_t>& inos) = 0;
  virtual StatusOr<rpc::WorkerStats> WorkerStats() = 0;
  // The write calls to the master (mounts with write=through or back; fuse/writes.h).
  virtual StatusOr<rpc::WriteTarget> PrepareCreate(const rpc::PrepareCreateRequest& req) = 0;
  virtual StatusOr<rpc::WriteTarget> PrepareWrite(uint64_t ino) = 0;
  virtual StatusOr<rpc::Attr> MakeDir(const rpc::MakeDirRequest& req) = 0;
  virtual Status Remove(const rpc::RemoveRequest& req) = 0;
  virtual Status Rename(const rpc::RenameRequest& req) = 0;
  virtual StatusOr<rpc::Attr> SetAttr(const rpc::SetAttrRequest& req) = 0;
  // The path of the local worker's socket; UNAVAILABLE when it has none (writes need it). Asks the
  // worker now when its socket is not known: a read's probe that failed a moment ago (the worker
  // was restarting) or fuse.zero_copy=false never makes a write fail.
  virtual StatusOr<std::string> LocalSocketPath() = 0;
  // The master's report (workers, mounts with the files and bytes known of each).
  virtual StatusOr<rpc::Report> GetReport() = 0;
  // Up to `length` bytes at `offset` of `file` (fewer only at end of file), into `out`. `random`:
  // not a sequential reader's read (ReadBlockRequest.random: range first also at a block's start).
  // `scratch` (optional, `length` bytes): where pieces granary-fuse reads itself (source reads)
  // land, at their place in the read (Piece::mem), so the reply needs no copy of them.
  // `continues`: the read continues a sequential stream (ReadBlockRequest.continues).
  virtual Status Read(const rpc::FileInfo& file, uint64_t offset, uint64_t length, ReadResult* out,
                      bool random = false, char* scratch = nullptr, bool continues = false) = 0;
  // For a passthrough open: leases the local worker's data file of `file` (every block of it
  // cached in one directory there). NOT_FOUND when the local worker does not have it whole;
  // UNAVAILABLE when there is no local socket.
  // With `verify`, every chunk is checked by the worker first (a read lease: fuse/read_leases.h).
  virtual StatusOr<std::unique_ptr<FileLease>> LeaseFile(const rpc::FileInfo& file, bool verify = false) = 0;
  // Asks the local worker, in the background, to warm blocks [first, first+count) of `file`
  // (readahead). Hints beyond a small queue are dropped.
  virtual void Prefetch(const rpc::FileInfo& file, uint64_t first, uint64_t count) = 0;
  // Lets go of local under-storage files not read lately (SourceReads::Trim); called once a second.
  virtual void TrimSourceReads() = 0;
  virtual const ClientCounters& counters() const = 0;
  // Round trips to the master (every metadata call), for /metrics and `granary stats`.
  virtual const metrics::Histogram& master_latency() const = 0;
};

// The real Client: the master over gRPC (following the leader), the local worker over its local
// socket (descriptors, pieces, the stream pipe) or gRPC, other workers over gRPC.
class NodeClient final : public Client {
 public:
  ~NodeClient() override;

  StatusOr<rpc::Attr> Lookup(uint64_t parent, const std::string& name, rpc::FileInfo* file) override;
  StatusOr<rpc::Attr> GetAttr(uint64_t ino) override;
  StatusOr<rpc::Attr> Resolve(const std::string& path) override;
  Status MasterAnswers() override;
  Status ReadDir(uint64_t ino, uint64_t after, uint32_t limit, rpc::ReadDirResponse* out, bool files) override;
  StatusOr<rpc::FileInfo> GetFile(uint64_t ino) override;
  Status NoteOpens(const std::vector<uint64_t>& inos) override;
  StatusOr<rpc::WorkerStats> WorkerStats() override;
  StatusOr<rpc::WriteTarget> PrepareCreate(const rpc::PrepareCreateRequest& req) override;
  StatusOr<rpc::WriteTarget> PrepareWrite(uint64_t ino) override;
  StatusOr<rpc::Attr> MakeDir(const rpc::MakeDirRequest& req) override;
  Status Remove(const rpc::RemoveRequest& req) override;
  Status Rename(const rpc::RenameRequest& req) override;
  StatusOr<rpc::Attr> SetAttr(const rpc::SetAttrRequest& req) override;
  StatusOr<std::string> LocalSocketPath() override;
  StatusOr<rpc::Report> GetReport() override;
  Status Read(const rpc::FileInfo& file, uint64_t offset, uint64_t length, ReadResult* out, bool random,
              char* scratch, bool continues) override;
  StatusOr<std::unique_ptr<FileLease>> LeaseFile(const rpc::FileInfo& file, bool verify) override;
  void Prefetch(const rpc::FileInfo& file, uint64_t first, uint64_t count) override;
  void TrimSourceReads() override { source_reads_.Trim(); }
  const ClientCounters& counters() const override { return counters_; }
  const metrics::Histogram& master_latency() const override { return master_latency_; }

 private:
  friend class Client;  // Create
  void PrefetchLoop();
  // Reports to the local worker, in the background, that `length` bytes of req's block were read
  // from the under-storage's file here (source reads): its fill policy counts the touch.
  void Touched(const rpc::ReadBlockRequest& req, uint64_t length);
  static constexpr int kMaxTouches = 1024;  // touches waiting to be reported (more are dropped)
  NodeClient(const Config& cfg, std::shared_ptr<RpcSecurity> sec);
  grpc::Status CallMaster(const std::function<grpc::Status(rpc::Master::Stub&, grpc::ClientContext&)>& call);
  // The local socket channel for reads, once the worker has named its socket (asked at most every
  // 5 s); none with fuse.zero_copy=false.
  std::shared_ptr<LocalChannel> Local();
  // The channel, asking the worker for its socket unless it was asked less than 5 s ago (`now_anyway`:
  // ask anyway).
  std::shared_ptr<LocalChannel> Probe(bool now_anyway);
  void DropLocal(const std::shared_ptr<LocalChannel>& ch);
  // One block range: the local socket, else gRPC from the local worker, else another live worker.
  // UNAVAILABLE when none of them answers.
  // `dst` (optional): where a piece read from the source here goes (Piece::mem).
  Status ReadPiece(const rpc::ReadBlockRequest& req, uint64_t want, LocalChannel::Piece* piece, ReadResult* out,
                   char* dst = nullptr);
  // One block range over gRPC: the local worker, else another live worker.
  Status ReadOverGrpc(const rpc::ReadBlockRequest& req, uint64_t want, std::string* out, NodeSource* source);

  const Config cfg_;
  std::shared_ptr<RpcSecurity> sec_;
  StubHolder<rpc::Master> master_;
  StubHolder<rpc::Worker> worker_;
  ClientCounters counters_;
  metrics::Histogram master_latency_;
  SourceReads source_reads_;  // thread-safe on its own

  Mutex mu_;
  std::shared_ptr<LocalChannel> local_ GUARDED_BY(mu_);
  bool probing_ GUARDED_BY(mu_) = false;
  std::condition_variable probed_;  // a probe of the local socket ended
  std::chrono::steady_clock::time_point last_probe_ GUARDED_BY(mu_){};
  std::set<std::string> others_ GUARDED_BY(mu_);  // live workers but ours
  StubPool<rpc::Worker> other_stubs_;             // thread-safe on its own
  std::chrono::steady_clock::time_point others_fetched_ GUARDED_BY(mu_){};

  Mutex prefetch_mu_;
  std::condition_variable prefetch_cv_;
  // Hints with when each was queued, sent as their age (PrefetchRequest.age_ms: a free on the
  // worker since then keeps their blocks out).
  std::deque<std::pair<std::chrono::steady_clock::time_point, rpc::PrefetchRequest>> prefetch_queue_
      GUARDED_BY(prefetch_mu_);
  rpc::PrefetchRequest touches_ GUARDED_BY(prefetch_mu_);  // touched: reports not yet sent
  std::chrono::steady_clock::time_point touches_since_ GUARDED_BY(prefetch_mu_);  // the oldest's
  bool touch_turn_ GUARDED_BY(prefetch_mu_) = false;       // PrefetchLoop: touches' turn next
  bool prefetch_stop_ GUARDED_BY(prefetch_mu_) = false;
  std::thread prefetcher_ GUARDED_BY(prefetch_mu_);  // started with the first hint
};

}  // namespace granary::fuse
