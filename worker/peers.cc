#include "worker/peers.h"

#include <algorithm>
#include <cstring>
#include <set>

namespace granary::worker {

PeerSet::PeerSet(std::shared_ptr<RpcSecurity> sec, std::chrono::milliseconds timeout, Clock clock)
    : sec_(sec), timeout_(timeout), clock_(std::move(clock)), stubs_(std::move(sec)) {}

bool PeerSet::Update(uint64_t self, const std::vector<PeerRef>& live) {
  MutexLock lock(&mu_);
  auto key = [](const std::vector<PeerRef>& v) {
    std::set<std::pair<uint64_t, std::string>> k;
    for (const auto& p : v) k.emplace(p.id, p.address);
    return k;
  };
  const bool changed = self != self_ || key(live) != key(live_);
  if (changed) {
    // A worker's first list is its own join: the others' membership before it was the list
    // without it.
    previous_ = live_;
    if (live_.empty()) {
      for (const auto& p : live) {
        if (p.id != self) previous_.push_back(p);
      }
    }
    changed_at_ = clock_();
  }
  self_ = self;
  live_ = live;
  std::set<std::string> addresses;
  for (const auto& p : live_) addresses.insert(p.address);
  stubs_.Retain(addresses);  // forget the channels of workers that left
  return changed;
}

std::vector<PeerRef> PeerSet::Members(uint64_t* self) {
  MutexLock lock(&mu_);
  *self = self_;
  return live_;
}

std::vector<PeerRef> PeerSet::Rank(const BlockId& id, size_t* self) {
  std::vector<PeerRef> members;
  uint64_t self_id;
  {
    MutexLock lock(&mu_);
    self_id = self_;
    auto now = clock_();
    for (const auto& p : live_) {
      auto d = down_until_.find(p.id);
      if (d != down_until_.end() && d->second > now && p.id != self_) continue;
      members.push_back(p);
    }
  }
  std::vector<PeerRef> ranked = RankForBlock(id, std::move(members));
  *self = kNotRanked;
  for (size_t i = 0; i < ranked.size(); ++i) {
    if (ranked[i].id == self_id) *self = i;
  }
  return ranked;
}

std::optional<PeerRef> PeerSet::PreviousHome(const BlockId& id) {
  MutexLock lock(&mu_);
  const auto now = clock_();
  if (previous_.empty() || now - changed_at_ > kPreviousWindow) return std::nullopt;
  const PeerRef home = RankForBlock(id, previous_).front();
  // Not this worker, still a member, and not marked down.
  if (home.id == self_) return std::nullopt;
  if (std::none_of(live_.begin(), live_.end(), [&](const PeerRef& p) { return p == home; })) return std::nullopt;
  auto d = down_until_.find(home.id);
  if (d != down_until_.end() && d->second > now) return std::nullopt;
  return home;
}

size_t PeerSet::Size() {
  MutexLock lock(&mu_);
  return live_.size();
}

void PeerSet::PeerFailed(const PeerRef& peer) {
  MutexLock lock(&mu_);
  down_until_[peer.id] = clock_() + kDownFor;
}

std::shared_ptr<StubHolder<rpc::Worker>> PeerSet::Stub(const std::string& address) { return stubs_.Get(address); }

rpc::ReadBlockRequest PeerSet::ToProto(const BlockRequest& req) {
  rpc::ReadBlockRequest r;
  r.set_mount_id(req.mount_id);
  r.set_ufs_path(req.ufs_path);
  r.set_version(req.version);
  r.set_file_size(req.file_size);
  r.set_block_size(req.block_size);
  r.set_index(req.index);
  r.set_offset(req.offset);
  r.set_length(req.length);
  r.set_from_peer(true);
  r.set_cached_only(req.cached_only);
  r.set_random(req.random);  // the home reads a random reader's block start range first too
  r.set_continues(req.continues);
  r.set_free_stamp(req.free_stamp);
  return r;
}

Status PeerSet::ReadFromPeer(const PeerRef& peer, const BlockRequest& req, std::string* out) {
  auto holder = Stub(peer.address);
  // Not connected yet (or reconnecting): give it kConnectTimeout, not the call's whole deadline —
  // a host that vanished never answers a connect.
  auto channel = holder->Channel();
  if (channel->GetState(true) != GRPC_CHANNEL_READY &&
      !channel->WaitForConnected(std::chrono::system_clock::now() + kConnectTimeout)) {
    holder->Note(grpc::Status(grpc::StatusCode::UNAVAILABLE, ""));
    return UnavailableError("worker " + std::to_string(peer.id) + " at " + peer.address + ": no connection within " +
                            std::to_string(kConnectTimeout.count()) + " s");
  }
  grpc::ClientContext ctx;
  sec_->Prepare(&ctx, timeout_);
  Status st = ReadBlockStream(*holder->Get(), ctx, ToProto(req), req.length, out,
                              "worker " + std::to_string(peer.id) + " at " + peer.address);
  // (A peer that answered that the under-storage is down is up.)
  if (st.code() == Code::kUnavailable && !st.IsUnderStorageDown()) {
    holder->Note(grpc::Status(grpc::StatusCode::UNAVAILABLE, ""));
  }
  return st;
}

Status PeerSet::PrefetchOnPeer(const PeerRef& peer, const BlockRequest& req) {
  auto holder = Stub(peer.address);
  rpc::PrefetchRequest pr;
  *pr.add_blocks() = ToProto(req);
  rpc::PrefetchResponse resp;
  grpc::ClientContext ctx;
  sec_->Prepare(&ctx, timeout_);
  return FromGrpc(holder->Note(holder->Get()->Prefetch(&ctx, pr, &resp)), "worker at " + peer.address);
}

}  // namespace granary::worker
