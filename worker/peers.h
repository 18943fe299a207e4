// PeerSet: the other workers of the cluster, and where each block lives among them.
//
// Design. The ranking itself is worker/placement.h (one function for reads and loads). Every worker learns the live workers (id, address) from the master's answers to its
// heartbeats. A block's *ranking* is that list ordered by a per-(block, worker) hash, highest first
// (rendezvous, or highest-random-weight, hashing). The first worker is the block's *home*: it is
// the one that fetches the block from the under-storage. The first `cache.replicas` workers are
// the only ones that keep a copy. Every worker computes the same ranking from the same list, so
// when all nodes read the same cold block at once they all ask its home, whose single-flight
// (BlockSource) turns them into one under-storage fetch for the whole cluster — the property that
// takes a shared storage link out of the critical path. A worker joining or leaving moves only the
// blocks it ranks first for (1/N of them); nothing is coordinated.
//
// Failure handling. A peer that fails a call with a retryable error is marked down for kDownFor
// and left out of every ranking meanwhile, so the next-ranked worker becomes the home at once —
// readers do not wait for the master to time the worker out (master.worker_timeout). The master's
// next list brings it back when it is alive again. A peer whose host vanished without closing its
// connections is noticed by the connect timeout (kConnectTimeout) or, for calls already open, by
// gRPC keepalive (kKeepalive + kKeepaliveTimeout in rpc/rpc.h), not at the call's deadline.
//
// Thread-safe: one mutex guards the membership; peer calls run outside it.
#pragma once

#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "common/thread_annotations.h"
#include "rpc/rpc.h"
#include "worker/interfaces.h"
#include "worker/placement.h"

namespace granary::worker {

class PeerSet final : public Placement {
 public:
  using Clock = std::function<std::chrono::steady_clock::time_point()>;
  static constexpr std::chrono::seconds kDownFor{10};
  // How long a read waits for a connection to a peer that has none (then: the next worker).
  static constexpr std::chrono::seconds kConnectTimeout{2};

  PeerSet(std::shared_ptr<RpcSecurity> sec, std::chrono::milliseconds timeout,
          Clock clock = std::chrono::steady_clock::now);

  // How long after a membership change a block's new home asks its previous home first
  // (PreviousHome): long enough for the epochs that follow a join to find the moved blocks, short
  // enough that a cold dataset read long after does not pay a peer round trip per moved block.
  static constexpr std::chrono::minutes kPreviousWindow{30};

  // Replaces the membership with the master's list of live workers; `self` is this worker's id.
  // True when the membership changed (another set of workers, or another self); the membership
  // before it is kept for PreviousHome (before a worker's first list: the list without it, as the
  // others had it before it joined).
  bool Update(uint64_t self, const std::vector<PeerRef>& live);

  std::vector<PeerRef> Rank(const BlockId& id, size_t* self) override;
  std::vector<PeerRef> Members(uint64_t* self) override;
  Status ReadFromPeer(const PeerRef& peer, const BlockRequest& req, std::string* out) override;
  void PeerFailed(const PeerRef& peer) override;
  Status PrefetchOnPeer(const PeerRef& peer, const BlockRequest& req) override;
  std::optional<PeerRef> PreviousHome(const BlockId& id) override;

  // Live workers known (this one included).
  size_t Size();


 private:
  std::shared_ptr<StubHolder<rpc::Worker>> Stub(const std::string& address);
  static rpc::ReadBlockRequest ToProto(const BlockRequest& req);

  const std::shared_ptr<RpcSecurity> sec_;
  const std::chrono::milliseconds timeout_;
  Clock clock_;
  Mutex mu_;
  uint64_t self_ GUARDED_BY(mu_) = 0;
  std::vector<PeerRef> live_ GUARDED_BY(mu_);
  std::vector<PeerRef> previous_ GUARDED_BY(mu_);  // the membership before the last change
  std::chrono::steady_clock::time_point changed_at_ GUARDED_BY(mu_);
  std::map<uint64_t, std::chrono::steady_clock::time_point> down_until_ GUARDED_BY(mu_);
  StubPool<rpc::Worker> stubs_;  // thread-safe on its own
};

}  // namespace granary::worker
