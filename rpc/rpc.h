// RPC plumbing shared by every server and client.
//
// - Status <-> grpc::Status, code for code; a status's Reason travels in the error details
//   ("granary-reason=N"), so a VersionChangedError stays one across servers.
// - Credentials: TLS when rpc.tls_* are set, and a shared token (rpc.token_file) that clients send
//   as "authorization: Bearer ..." metadata and servers check with CheckToken.
// - MakeChannel: a channel to host:port with Granary's message-size limits; StubHolder (a stub that
//   reconnects after UNAVAILABLE) and StubPool (one StubHolder per address for a whole process).
// Thread-safe.
#pragma once

#include <grpcpp/grpcpp.h>

#include <chrono>
#include <iterator>
#include <map>
#include <memory>
#include <set>
#include <string>

#include "common/config.h"
#include "common/status.h"
#include "common/thread_annotations.h"
#include "proto/granary.grpc.pb.h"

namespace granary {

grpc::Status ToGrpc(const Status& s);
Status FromGrpc(const grpc::Status& s, const std::string& context);

// Client keepalive: while a call is open, a ping every kKeepalive; no answer within
// kKeepaliveTimeout closes the connection and fails its calls (UNAVAILABLE), so a peer whose host
// vanished costs seconds, not a call deadline. Servers must accept those pings (AllowKeepalivePings).
constexpr std::chrono::seconds kKeepalive{5};
constexpr std::chrono::seconds kKeepaliveTimeout{5};
void AllowKeepalivePings(grpc::ServerBuilder* builder);

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
  grpc::Status CheckToken(const grpc::ServerContextBase* ctx) const;

 private:
  std::string token_;
  std::string cert_, key_, ca_;
};

// Whether a daemon may serve gRPC on `listen` (the value of `setting_key`) with `cfg`: without a
// token, only on loopback (127.0.0.0/8, ::1, localhost) or a unix socket, unless
// rpc.allow_unauthenticated says it is meant; otherwise INVALID_ARGUMENT naming the three ways out.
Status CheckServingPolicy(const std::string& setting_key, const std::string& listen, const RpcConfig& cfg);
// Once serving on `listen` without a token: a warning saying who can reach the daemon (loud when
// that is the network).
void WarnIfServingWithoutToken(const std::string& listen, const RpcConfig& cfg);
// True for a host that only this machine reaches: 127.0.0.0/8, ::1, localhost.
bool IsLoopbackHost(const std::string& host);

// A client stub whose channel is replaced when a call fails with UNAVAILABLE (at most once per
// 500 ms). A fresh channel connects as soon as the server is back, where a channel that saw the
// server die can sit in gRPC's reconnect backoff for several seconds. Thread-safe.
template <typename Service>
class StubHolder {
 public:
  using Stub = typename Service::Stub;
  StubHolder(std::shared_ptr<RpcSecurity> sec, std::string address)
      : sec_(std::move(sec)), address_(std::move(address)), channel_(sec_->MakeChannel(address_)),
        stub_(Service::NewStub(channel_)) {}

  std::shared_ptr<Stub> Get() {
    MutexLock lock(&mu_);
    return stub_;
  }
  std::shared_ptr<grpc::Channel> Channel() {
    MutexLock lock(&mu_);
    return channel_;
  }
  // Call with every finished call's status; returns it unchanged.
  const grpc::Status& Note(const grpc::Status& st) {
    if (st.error_code() != grpc::StatusCode::UNAVAILABLE) return st;
    MutexLock lock(&mu_);
    auto now = std::chrono::steady_clock::now();
    if (now - last_reset_ > std::chrono::milliseconds(500)) {
      channel_ = sec_->MakeChannel(address_);
      stub_ = Service::NewStub(channel_);
      last_reset_ = now;
    }
    return st;
  }
  const std::string& address() const { return address_; }

 private:
  std::shared_ptr<RpcSecurity> sec_;
  const std::string address_;
  Mutex mu_;
  std::shared_ptr<grpc::Channel> channel_ GUARDED_BY(mu_);
  std::shared_ptr<Stub> stub_ GUARDED_BY(mu_);
  std::chrono::steady_clock::time_point last_reset_ GUARDED_BY(mu_){};
};

// One StubHolder per address, shared by every caller in a process (peers, load jobs, the master's
// calls to workers, granary-fuse's fallback reads), so a process keeps one channel per server.
// Retain() forgets the channels of servers that left. Thread-safe.
template <typename Service>
class StubPool {
 public:
  explicit StubPool(std::shared_ptr<RpcSecurity> sec) : sec_(std::move(sec)) {}

  std::shared_ptr<StubHolder<Service>> Get(const std::string& address) {
    MutexLock lock(&mu_);
    auto& h = holders_[address];
    if (!h) h = std::make_shared<StubHolder<Service>>(sec_, address);
    return h;
  }
  // Drops every address not in `keep` (callers holding a stub keep it alive until they finish).
  void Retain(const std::set<std::string>& keep) {
    MutexLock lock(&mu_);
    for (auto it = holders_.begin(); it != holders_.end();) {
      it = keep.count(it->first) ? std::next(it) : holders_.erase(it);
    }
  }
  const RpcSecurity& security() const { return *sec_; }

 private:
  const std::shared_ptr<RpcSecurity> sec_;
  Mutex mu_;
  std::map<std::string, std::shared_ptr<StubHolder<Service>>> holders_ GUARDED_BY(mu_);
};

// Runs one Worker.ReadBlock call on `stub` (ctx already prepared) and appends the streamed bytes
// to `out`. DATA_LOSS when the stream ends short of `want` bytes; `who` names the worker in errors.
Status ReadBlockStream(rpc::Worker::Stub& stub, grpc::ClientContext& ctx, const rpc::ReadBlockRequest& req,
                       uint64_t want, std::string* out, const std::string& who, bool* cache_hit = nullptr,
                       uint32_t* source = nullptr);

}  // namespace granary
