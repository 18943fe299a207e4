// RPC plumbing shared by every server and client.
//
// - Status <-> grpc::Status, code for code.
// - Credentials: TLS when rpc.tls_* are set, and a shared token (rpc.token_file) that clients send
//   as "authorization: Bearer ..." metadata and servers check with CheckToken.
// - MakeChannel: a channel to host:port with Granary's message-size limits.
// Thread-safe.
#pragma once

#include <grpcpp/grpcpp.h>

#include <chrono>
#include <memory>
#include <string>

#include "common/config.h"
#include "common/status.h"

namespace granary {

grpc::Status ToGrpc(const Status& s);
Status FromGrpc(const grpc::Status& s, const std::string& context);

// Largest message either side accepts (a 1 MiB chunk plus framing, or a large listing page).
constexpr int kMaxMessageBytes = 16 * 1024 * 1024;

// Credentials and the token, read once from the files the config names.
class RpcSecurity {
 public:
  static StatusOr<std::shared_ptr<RpcSecurity>> FromConfig(const RpcConfig& cfg);

  std::shared_ptr<grpc::ServerCredentials> ServerCredentials() const;
  std::shared_ptr<grpc::Channel> MakeChannel(const std::string& address) const;
  // Adds the token and a deadline of `timeout` (0: none) to a client call.
  void Prepare(grpc::ClientContext* ctx, std::chrono::milliseconds timeout) const;
  // UNAUTHENTICATED unless the call carries the token (always OK when no token is configured).
  grpc::Status CheckToken(const grpc::ServerContext* ctx) const;

 private:
  std::string token_;
  std::string cert_, key_, ca_;
};

}  // namespace granary
