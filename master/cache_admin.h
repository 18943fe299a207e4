// CacheAdmin: what `granary pin`, `unpin`, `free` and `du` do on the master, apart from the gRPC
// handlers (which only translate). Also the master's calls to every live worker (WorkerCalls,
// ForEachWorker, FreeOnWorkers), which the background reclaimer uses too.
//
// Pins are durable records in the namespace (RocksDB) and are pushed to the workers; a worker that
// missed a push gets the whole set when it registers again. Free drops the cached blocks of every
// file below a path on every live worker, refused when a pin overlaps the path. Du walks the files
// below a path and asks every live worker which of their blocks it holds (GetResidency, in batches
// of files): the master keeps no block map (master/cluster.h). FileResidency asks the same question
// about some files and answers it block by block (`granary info`), so no client asks workers itself.
//
// Thread-safe. Lock order: pin_mu_ (one pin or unpin at a time) is held across calls into the
// namespace, the cluster and workers; nothing else is held while taking it.
#pragma once

#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "common/hash.h"
#include "common/status.h"
#include "common/thread_annotations.h"
#include "master/cluster.h"
#include "master/namespace.h"
#include "proto/granary.grpc.pb.h"
#include "rpc/rpc.h"

namespace granary::master {

// The master's calls to its workers: one stub per worker for the whole process (shared with load
// jobs), each call with rpc.timeout as its deadline.
struct WorkerCalls {
  std::shared_ptr<StubPool<rpc::Worker>> pool;
  std::chrono::milliseconds timeout{};
};

// Calls `call` on every live worker; counts the successes in *told; returns the first failure.
Status ForEachWorker(Cluster& cluster, const WorkerCalls& workers,
                     const std::function<Status(rpc::Worker::Stub&, grpc::ClientContext&)>& call, uint32_t* told);

// Frees the cached blocks of these file versions on every live worker. `stamp`: the free's stamp
// (Namespace::NextFreeStamp): load batches read before it cache none of these blocks.
Status FreeOnWorkers(Cluster& cluster, const WorkerCalls& workers, const std::vector<FileKey>& keys, uint64_t stamp,
                     uint64_t* blocks, uint32_t* told);

// Frees every cached block of an unmounted mount on every live worker. A worker that misses it
// (down, unreachable) frees them when it registers again: it asks the master for the mounts its
// blocks belong to.
Status FreeMountOnWorkers(Cluster& cluster, const WorkerCalls& workers, uint64_t mount_id, uint64_t stamp,
                          uint64_t* blocks, uint32_t* told);

class CacheAdmin {
 public:
  CacheAdmin(Namespace* ns, Cluster* cluster, WorkerCalls workers)
      : ns_(ns), cluster_(cluster), workers_(std::move(workers)) {}

  // Pins (req.pin) or unpins a path. Unpin removes pins at or below it; a pin above it is
  // FAILED_PRECONDITION (unpin that one), no pin at all NOT_FOUND.
  Status Pin(const rpc::PinRequest& req, rpc::PinResponse* resp) EXCLUDES(pin_mu_);
  // Frees the cached blocks below a path; FAILED_PRECONDITION when a pin overlaps it.
  Status Free(const rpc::FreeRequest& req, rpc::FreeResponse* resp);
  // The path's totals, and one entry per child directory plus one for the files directly in it.
  // cached_bytes counts each block held by some live worker once; replica_bytes and elastic_bytes
  // every copy. A worker that does not answer is left out of the figures (and logged).
  Status Du(const rpc::DuRequest& req, rpc::DuResponse* resp);
  // Which live workers (or the one named) hold which blocks of some files: at most kResidencyFiles
  // files (INVALID_ARGUMENT beyond) and kResidencyBlocks / (workers asked) blocks per answer, so at
  // most kResidencyBlocks copies (the blocks stop the answer short). NOT_FOUND for an unknown inode, INVALID_ARGUMENT for a directory. Not
  // an open: fetch-ahead does not see it. A worker that does not answer is left out (counted).
  Status FileResidency(const rpc::FileResidencyRequest& req, rpc::FileResidencyResponse* resp);

  static constexpr size_t kResidencyFiles = 4096;
  static constexpr uint64_t kResidencyBlocks = 100'000;

 private:
  Namespace* ns_;
  Cluster* cluster_;
  WorkerCalls workers_;
  Mutex pin_mu_;  // one pin/unpin at a time
};

}  // namespace granary::master
