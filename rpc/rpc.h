// RPC plumbing shared by every server and client.
//
// - Status <-> grpc::Status, code for code; a status's Reason travels in the error details
//   ("granary-reason=N"), so a VersionChangedError stays one across servers.
// - Credentials: TLS when rpc.tls_* are set, and a shared token (rpc.token_file) that clients send
//   as "authorization: Bearer ..." metadata and servers check with CheckToken.
// - MakeChannel: a channel to host:port with Granary's message-size limits; StubHolder (a stub that
//   reconnects after UNAVAILABLE, and with several addresses — standby masters — follows the
//   leader) and StubPool (one StubHolder per address for a whole process).
// Thread-safe.
#pragma once

#include <grpcpp/grpcpp.h>

#include <chrono>
#include <iterator>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "common/backoff.h"
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

// A standby master's UNAVAILABLE carries the leader's address in its details, after this prefix
// (master/server.cc); LeaderHint reads it back ("" when there is none).
inline constexpr char kLeaderHint[] = "granary-leader=";
std::string LeaderHint(const grpc::Status& s);
// A master that does not lead answered (UNAVAILABLE with the hint prefix, the leader's address
// after it when known): the call was not made, and is made again on the leader.
bool IsNotLeader(const grpc::Status& s);
// UNAVAILABLE from gRPC itself (the server never answered: down, unreachable, connection lost),
// as opposed to an UNAVAILABLE a server answered (ToGrpc gives those details).
bool ServerUnreachable(const grpc::Status& s);
// "a:1, b:2,c:3" -> {"a:1", "b:2", "c:3"} (spaces and empty items dropped).
std::vector<std::string> SplitAddressList(const std::string& list);

// Largest message either side accepts (a 1 MiB chunk plus framing, or a large listing page).
constexpr int kMaxMessageBytes = 16 * 1024 * 1024;
// The largest ReadBlock chunk (ReadBlockRequest.max_chunk_bytes): one message with room for its
// other fields.
constexpr size_t kMaxReadChunkBytes = kMaxMessageBytes - (64 << 10);

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
  bool has_token() const { return !token_.empty(); }
  // HMAC-SHA256 of `message` keyed by the token: a proof that the sender holds it, which does not
  // give the token away ("" when there is no token).
  std::string Mac(const std::string& message) const;

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
// server die can sit in gRPC's reconnect backoff for several seconds.
//
// `address` may list several servers, comma-separated (the masters of a cluster with standbys):
// the holder talks to one at a time; an UNAVAILABLE that names the leader (LeaderHint) moves it
// there, any other UNAVAILABLE to the next address (at most once per 200 ms). Thread-safe.
template <typename Service>
class StubHolder {
 public:
  using Stub = typename Service::Stub;
  StubHolder(std::shared_ptr<RpcSecurity> sec, std::string address)
      : sec_(std::move(sec)), addresses_(SplitAddressList(address)) {
    if (addresses_.empty()) addresses_.push_back(address);
    current_ = addresses_.front();
    channel_ = sec_->MakeChannel(current_);
    stub_ = Service::NewStub(channel_);
  }

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
    // Only a server not reached or not leading moves the holder (an UNAVAILABLE the leader
    // answered — its under-storage failed — does not).
    if (!ServerUnreachable(st) && !IsNotLeader(st)) return st;
    std::string hint = LeaderHint(st);
    MutexLock lock(&mu_);
    auto now = std::chrono::steady_clock::now();
    size_t at = 0;
    while (at < addresses_.size() && addresses_[at] != current_) ++at;
    if (!hint.empty() && hint != current_) {
      MoveLocked(hint, now);
    } else if (now - last_reset_ <= std::chrono::milliseconds(200)) {
      // moved a moment ago (another call's failure): stay
    } else if (at == addresses_.size()) {
      MoveLocked(addresses_.front(), now);  // a leader named earlier stopped answering: back to the list
    } else if (addresses_.size() > 1) {
      MoveLocked(addresses_[(at + 1) % addresses_.size()], now);
    } else if (now - last_reset_ > std::chrono::milliseconds(500)) {
      MoveLocked(current_, now);
    }
    return st;
  }
  // The server calls go to now.
  std::string address() const {
    MutexLock lock(&mu_);
    return current_;
  }
  size_t address_count() const { return addresses_.size(); }

 private:
  void MoveLocked(const std::string& to, std::chrono::steady_clock::time_point now) REQUIRES(mu_) {
    current_ = to;
    channel_ = sec_->MakeChannel(current_);
    stub_ = Service::NewStub(channel_);
    last_reset_ = now;
  }

  std::shared_ptr<RpcSecurity> sec_;
  std::vector<std::string> addresses_;
  mutable Mutex mu_;
  std::string current_ GUARDED_BY(mu_);
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

// Calls `call(stub, ctx)` (ctx prepared with the token and `timeout`) through `holder`; while no
// master was reached (one restarting) or the one reached does not lead (standbys electing a
// leader), tries again — the holder having moved to the leader or the next address — until `wait`
// has passed, backing off from 20 ms to 500 ms. An UNAVAILABLE the leader answered (its
// under-storage failed) is returned at once. A not-leader answer means the call was not made; a
// server not reached may have made it: for calls that may be repeated.
template <typename Service, typename Fn>
grpc::Status CallWithFailover(StubHolder<Service>& holder, const RpcSecurity& sec, std::chrono::milliseconds timeout,
                              std::chrono::milliseconds wait, Fn call) {
  auto deadline = std::chrono::steady_clock::now() + wait;
  Backoff backoff(kMasterFailover);
  for (bool hinted = false;;) {
    grpc::ClientContext ctx;
    sec.Prepare(&ctx, timeout);
    grpc::Status st = holder.Note(call(*holder.Get(), ctx));
    if (!ServerUnreachable(st) && !IsNotLeader(st)) return st;
    // A hint names the leader: ask it at once, once (two standbys naming each other while an
    // election settles must not make this a busy loop); otherwise wait a little.
    const bool hint = !LeaderHint(st).empty();
    if (hint && !hinted) {
      hinted = true;
      if (std::chrono::steady_clock::now() >= deadline) return st;
      backoff.Reset();
      continue;
    }
    hinted = false;
    if (!backoff.SleepBefore(deadline)) return st;
  }
}

// Runs one Worker.ReadBlock call on `stub` (ctx already prepared) and appends the streamed bytes
// to `out`. DATA_LOSS when the stream ends short of `want` bytes; `who` names the worker in errors.
// The call asks for chunks as large as a channel of MakeChannel takes (max_chunk_bytes), so a block
// of up to ~16 MiB comes as one message and becomes `out` (when empty) without a copy; `stub` must
// be on such a channel.
Status ReadBlockStream(rpc::Worker::Stub& stub, grpc::ClientContext& ctx, const rpc::ReadBlockRequest& req,
                       uint64_t want, std::string* out, const std::string& who, bool* cache_hit = nullptr,
                       uint32_t* source = nullptr);

}  // namespace granary
