// Replication of the master's journal (master/journal.h) from the leader to its standbys, over the
// Master service's Replicate stream (proto/granary.proto).
//
// Design note. The standby opens the stream to whoever the election names leader and says where
// its journal stands (ReplicaAck). The leader answers with what the standby needs (Journal::Read):
// the entries after that position, or — when it cannot vouch for that position — a snapshot of its
// whole database followed by the entries after the snapshot's position. Every batch carries the
// leader's term and position; a standby refuses a batch whose term is smaller than one it has seen
// (a deposed leader's late stream) and acknowledges each position it has applied, which is what the
// leader's semi-synchronous commits wait for. When idle, the leader sends an empty batch every
// 250 ms, so a standby always knows how far behind it is.
//
// The leader's proof. The election's record in etcd is only an address: before a standby sends the
// cluster's token there or takes a single entry from it, the master at that address proves it holds
// the token (ProveMaster): the standby sends 32 fresh random bytes, the master answers with the
// address it stands for and HMAC-SHA256(token, "granary-master-proof" 0 address 0 nonce). A forged
// record (anyone who could write to etcd) names a process that has no token, or one that relays
// the challenge to a real master, whose proof then names that master's own address, not the one
// dialled: either way the standby refuses to follow it and says so. Without a token (a single
// host's masters on loopback) there is nothing to prove, and nothing the masters keep from its
// other users (docs/security.md).
//
// Bounded: a standby's id (its address) is at most 256 characters of a host:port, and an
// acknowledgement beyond what the leader has sent ends the stream.
//
// A standby answers namespace reads only while its copy is whole (not halfway through a snapshot)
// and has heard from the leader within the last few seconds (ServingReads); otherwise the reads go
// to the leader. Either way it never writes except through ApplyEntry.
#pragma once

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "common/status.h"
#include "common/thread_annotations.h"
#include "master/namespace.h"
#include "proto/granary.grpc.pb.h"
#include "rpc/rpc.h"

namespace granary::master {

// The leader's side of one standby's Replicate stream: runs until the standby goes, the stream is
// cancelled, or `leading()` turns false (then UNAVAILABLE). `term`: the leader's term.
grpc::Status ServeStandby(Namespace* ns, uint64_t term, const std::function<bool()>& leading,
                          grpc::ServerContext* ctx, grpc::ServerReaderWriter<rpc::ReplicaBatch, rpc::ReplicaAck>* stream);

// A master's answer to ProveMaster: `self` is the address it stands for. INVALID_ARGUMENT for a
// nonce that is not 32 bytes; FAILED_PRECONDITION without a token.
grpc::Status ProveMaster(const RpcSecurity& sec, const std::string& self, const rpc::MasterChallenge& req,
                         rpc::MasterProof* resp);
// Asks the master at `address` for its proof and checks it: OK when it holds the token and stands
// for `address`; PERMISSION_DENIED naming what failed otherwise (UNAVAILABLE when unreachable).
Status VerifyMaster(const RpcSecurity& sec, rpc::Master::StubInterface* stub, const std::string& address);

// The standby's side: a thread that follows the leader the election names.
class Follower {
 public:
  // `leader()`: the leader's address as last known ("" none; this master's own: do not follow).
  Follower(Namespace* ns, std::shared_ptr<RpcSecurity> sec, std::string self, std::function<std::string()> leader);
  ~Follower();  // Stop()s
  void Start();
  // Ends the stream and the thread (promotion: before this master leads).
  void Stop();

  // Entries behind the leader's position as last heard; 0 when in step or unknown.
  uint64_t lag() const;
  // The largest leader's term this follower has had a batch from (0: none yet).
  uint64_t term() const;
  // True while a whole copy is here and the leader was heard from recently.
  bool ServingReads() const;
  // True once a leader's batch reached this follower since it started.
  bool HeardALeader() const;
  // True when this copy is whole (it was copied or followed once, and no snapshot is halfway).
  bool Whole() const;
  // Changes whenever a snapshot starts replacing this copy: a read that saw it change (or the copy
  // not whole) after reading may have seen a copy halfway replaced.
  uint64_t CopyGeneration() const;

 private:
  void Run();
  // One stream to `leader`, until it ends.
  Status FollowOnce(const std::string& leader);

  Namespace* const ns_;
  const std::shared_ptr<RpcSecurity> sec_;
  const std::string self_;
  const std::function<std::string()> leader_;

  mutable Mutex mu_;
  std::condition_variable wake_;
  bool stop_ GUARDED_BY(mu_) = false;
  grpc::ClientContext* ctx_ GUARDED_BY(mu_) = nullptr;  // the stream in progress, to cancel
  uint64_t max_term_ GUARDED_BY(mu_) = 0;
  bool installing_ GUARDED_BY(mu_) = false;
  uint64_t generation_ GUARDED_BY(mu_) = 0;
  uint64_t leader_index_ GUARDED_BY(mu_) = 0;
  std::string refused_ GUARDED_BY(mu_);  // the leader address whose proof failed last (logged once)
  std::chrono::steady_clock::time_point heard_ GUARDED_BY(mu_){};
  std::thread thread_;
};

}  // namespace granary::master
