// Client: what the FUSE process asks of the master (metadata) and of the worker on its node
// (block bytes). Every call has the rpc.timeout deadline and the shared token. Thread-safe.
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "common/config.h"
#include "common/status.h"
#include "proto/granary.grpc.pb.h"
#include "proto/rpc.h"

namespace granary::fuse {

class Client {
 public:
  static StatusOr<std::unique_ptr<Client>> Create(const Config& cfg);

  StatusOr<rpc::Attr> Lookup(uint64_t parent, const std::string& name);
  StatusOr<rpc::Attr> GetAttr(uint64_t ino);
  StatusOr<rpc::Attr> Resolve(const std::string& path);
  Status ReadDir(uint64_t ino, uint64_t after, uint32_t limit, rpc::ReadDirResponse* out);
  StatusOr<rpc::FileInfo> GetFile(uint64_t ino);
  StatusOr<rpc::WorkerStats> WorkerStats();
  // Appends up to `length` bytes at `offset` of `file` to `out` (fewer only at end of file).
  Status Read(const rpc::FileInfo& file, uint64_t offset, uint64_t length, std::string* out);

 private:
  Client(const Config& cfg, std::shared_ptr<RpcSecurity> sec);
  const Config cfg_;
  std::shared_ptr<RpcSecurity> sec_;
  grpc::Status CallMaster(const std::function<grpc::Status(rpc::Master::Stub&, grpc::ClientContext&)>& call);
  StubHolder<rpc::Master> master_;
  StubHolder<rpc::Worker> worker_;
};

}  // namespace granary::fuse
