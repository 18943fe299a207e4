// Calls a gRPC server received, by method: the daemons' `granary_*_rpc_calls_total{method}`
// counters, and the per-file call counts of a cold epoch in docs/benchmarks.md (how many master
// calls a file costs is a number, not a sample of a profile).
//
// Counting costs one lookup per call under a lock: the factory counts when gRPC asks it for an
// interceptor and returns none, so no interceptor runs on any of the call's steps.
// Thread-safe.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <unordered_map>

#include <grpcpp/server_builder.h>

#include "common/thread_annotations.h"

namespace granary::rpc {

class CallCounts {
 public:
  // Counts every call `builder`'s server receives for the methods of `service` (a full name, e.g.
  // "granary.rpc.Master"); calls of any other name (none the server serves: gRPC answers them
  // UNIMPLEMENTED) count as "other", so callers cannot grow the table with names of their own.
  // Call before BuildAndStart; this object must outlive the server.
  void Attach(grpc::ServerBuilder* builder, const std::string& service);
  // Calls so far by method ("Lookup" for "/granary.rpc.Master/Lookup"; "other").
  std::map<std::string, uint64_t> Snapshot();
  void Count(const char* method);

 private:
  Mutex mu_;
  std::set<std::string> known_ GUARDED_BY(mu_);  // "/granary.rpc.Master/Lookup", ...
  // By the method's name as gRPC registered it: one pointer per method for the server's life.
  std::unordered_map<const char*, uint64_t> by_method_ GUARDED_BY(mu_);
  uint64_t other_ GUARDED_BY(mu_) = 0;
};

}  // namespace granary::rpc
