#include "worker/block_source.h"

#include "worker/peers.h"

#include "common/bad_request.h"
#include "common/config.h"

#include <spdlog/spdlog.h>
#include <unistd.h>

#include <algorithm>
#include <optional>

namespace granary::worker {

BlockSource::BlockSource(BlockStore* store, MountResolver* mounts, BlockReporter* reporter, Placement* placement)
    : store_(store), mounts_(mounts), reporter_(reporter), placement_(placement) {
  store_->SetRemovedListener([reporter](const BlockMeta& m) { reporter->BlockRemoved(m); });
}

StatusOr<BlockSource::Target> BlockSource::Resolve(const BlockRequest& req) {
  // Every size a request names is checked before anything is allocated for it: the block size is
  // the mount's, the block lies within the file, the range within the block. So no request makes
  // this worker allocate more than one of the mount's blocks.
  if (req.block_size == 0) return InvalidArgumentError("block_size must be positive");
  if (req.ufs_path.size() > kMaxUfsPath) {
    return InvalidArgumentError("a path of " + std::to_string(req.ufs_path.size()) + " bytes (at most " +
                                std::to_string(kMaxUfsPath) + ")");
  }
  ASSIGN_OR_RETURN(MountHandle mount, mounts_->GetMount(req.mount_id));
  if (mount.block_size != 0 && req.block_size != mount.block_size) {
    return InvalidArgumentError("block_size " + std::to_string(req.block_size) + " is not mount " +
                                std::to_string(req.mount_id) + "'s (" + std::to_string(mount.block_size) + ")");
  }
  if (mount.block_size == 0 && (req.block_size < kMinBlockSize || req.block_size > kMaxBlockSize)) {
    return InvalidArgumentError("block_size " + std::to_string(req.block_size) + " is out of range (" +
                                std::to_string(kMinBlockSize) + " to " + std::to_string(kMaxBlockSize) + ")");
  }
  if (req.file_size == 0 || req.index > (req.file_size - 1) / req.block_size) {
    return InvalidArgumentError("block " + std::to_string(req.index) + " is past the end of the file");
  }
  uint64_t block_start = req.index * req.block_size;
  uint64_t block_len = std::min(req.block_size, req.file_size - block_start);
  Target t;
  t.mount = std::move(mount);
  t.meta = BlockMeta{BlockId{MakeFileKey(t.mount.uri, req.ufs_path, req.version), req.index}, req.mount_id, block_len,
                     block_start};
  if (req.offset >= block_len) return t;  // nothing to read
  t.len = std::min(req.length, block_len - req.offset);
  return t;
}

const char* ReadSourceName(ReadSource s) {
  switch (s) {
    case ReadSource::kCache: return "cache";
    case ReadSource::kPeer: return "peer";
    case ReadSource::kUnderStorage: return "under_storage";
  }
  return "cache";
}

Status BlockSource::Read(const BlockRequest& req, std::string* out, bool* hit, ReadSource* source) {
  ASSIGN_OR_RETURN(Target t, Resolve(req));
  out->resize(t.len);
  *hit = true;
  if (source) *source = ReadSource::kCache;
  if (t.len == 0) return Status::OK();
  auto cached = store_->Read(t.meta.id, req.offset, t.len, out->data());
  if (cached.ok() && *cached == t.len) {
    counters_.hits++;
    CountAccess(req.mount_id, true);
    counters_.bytes_served += t.len;
    return Status::OK();
  }
  return Miss(req, t, out, hit, source);
}

Status BlockSource::ReadOrLease(const BlockRequest& req, std::string* out, BlockLease* lease, bool* hit,
                                ReadSource* source, SharedBytes* shared) {
  lease->Reset();
  out->clear();
  if (shared != nullptr) *shared = SharedBytes{};
  ASSIGN_OR_RETURN(Target t, Resolve(req));
  *hit = true;
  if (source) *source = ReadSource::kCache;
  if (t.len == 0) return Status::OK();
  auto l = store_->Lease(t.meta.id, req.offset, t.len);
  if (l.ok() && l->fd >= 0 && l->length == t.len) {
    counters_.hits++;
    CountAccess(req.mount_id, true);
    counters_.leased++;
    counters_.bytes_served += t.len;
    *lease = std::move(*l);
    return Status::OK();
  }
  // Not cached, or shorter than the block should be (never served; the lease ends here).
  return Miss(req, t, out, hit, source, lease, shared);
}

StatusOr<LocalFile> BlockSource::OpenSource(const BlockRequest& req) {
  ASSIGN_OR_RETURN(Target t, Resolve(req));
  return t.mount.ufs->OpenLocal(req.ufs_path, req.version);
}

StatusOr<BlockLease> BlockSource::LeaseFile(const BlockRequest& req, bool* hit, ReadSource* source, bool verify) {
  if (req.index != 0 || req.offset != 0 || req.file_size == 0 || req.block_size == 0) {
    return InvalidArgumentError("a file lease names block 0 of a non-empty file");
  }
  ASSIGN_OR_RETURN(Target t, Resolve(req));
  const uint64_t blocks = (req.file_size + req.block_size - 1) / req.block_size;
  *hit = true;
  if (source) *source = ReadSource::kCache;
  auto l = store_->LeaseFile(t.meta.id.key, blocks, req.file_size, verify);
  if (!l.ok() && l.status().IsNotFound() && blocks == 1) {
    // A one-block file not here yet: fetch it as a read would (from the home, or the
    // under-storage). Only a holder keeps it; then it can be leased. (A larger file is left to
    // reads, which cache it block by block; a later open finds it whole.)
    std::string bytes(t.len, '\0');
    BlockRequest whole = req;
    whole.length = t.len;
    RETURN_IF_ERROR(Miss(whole, t, &bytes, hit, source));
    l = store_->LeaseFile(t.meta.id.key, 1, req.file_size, verify);
  } else if (l.ok()) {
    counters_.hits += blocks;
    CountAccess(req.mount_id, true);
  }
  if (!l.ok()) return l.status();
  counters_.passthrough_leases++;
  return l;
}

Status BlockSource::Miss(const BlockRequest& req, const Target& t, std::string* out, bool* hit, ReadSource* source,
                         BlockLease* lease, SharedBytes* shared) {
  // A new home asking its previous home: only what is cached here, nothing fetched.
  if (req.cached_only) return NotFoundError("block " + std::to_string(req.index) + " of the file is not cached here");
  const MountHandle& mount = t.mount;
  const BlockMeta& meta = t.meta;
  const uint64_t len = t.len;
  *hit = false;
  counters_.misses++;
  CountAccess(req.mount_id, false);
  if (req.from_peer) counters_.peer_served++;
  Route route = RouteFor(req, t, nullptr);
  // A load batch's copy asked of this home: the batch's stamp counts here too.
  if (req.free_stamp != 0) route.ticket = store_->FreeTicketAt(req.free_stamp);
  if (route.ask_peers && !route.keep) {
    // Not a holder: only this range, streamed from the holders.
    BlockRequest range = req;
    range.length = len;
    out->clear();
    bool became_home = false;
    Status st = FromPeers(range, meta.id, out, &became_home);
    if (st.ok()) {
      counters_.bytes_served += len;
      CountSource(req.mount_id, ReadSource::kPeer);
      if (source) *source = ReadSource::kPeer;
      return Status::OK();
    }
    // A peer that answered that the under-storage is down has spent the storage's retries: the
    // reader gets that now, not after every other worker has tried the storage too.
    if (!st.IsRetryable() || st.IsUnderStorageDown()) return st;
    // No peer could serve: fetch it here, and keep it if this worker is the block's home now.
    route.ask_peers = false;
    route.keep = became_home;
  }
  if (!route.ask_peers && rpc::IsRangeFirst(req.block_size, meta.length, req.offset, len, req.random, req.continues) &&
      !JoinRatherThanRange(meta.id)) {
    return RangeFirst(req, t, route, out, source);
  }
  std::optional<Fetched> fetched;
  if (Streams(route, meta) && len < meta.length &&
      Stream(req, t, route, out, source, &fetched, shared)) {
    return Status::OK();
  }
  ASSIGN_OR_RETURN(std::shared_ptr<const FetchedBlock> block,
                   fetched ? std::move(*fetched) : Fetch(req, mount, meta, route));
  if (block->bytes().size() != meta.length) {
    // Joined a fetch (or found a buffered block) for a request that claimed another file size.
    return AbortedError("block " + std::to_string(req.index) + " of " + req.ufs_path + " was fetched as " +
                        std::to_string(block->bytes().size()) + " bytes, not " + std::to_string(meta.length) +
                        "; read it again");
  }
  counters_.bytes_served += len;
  // A block fetched and kept is served as a hit is, from the cache file (the page cache has it):
  // no copy of it through the local socket.
  bool leased = false;
  if (lease != nullptr) {
    // Unverified: its checksums were computed from these very bytes when they were written.
    StatusOr<BlockLease> kept = store_->Lease(meta.id, req.offset, len, /*verify=*/false);
    leased = kept.ok() && kept->fd >= 0 && kept->length == len;
    if (leased) *lease = std::move(*kept);
  }
  if (leased) {
    out->clear();
  } else if (shared != nullptr) {
    *shared = SharedBytes{block, block->bytes().substr(req.offset, len)};
  } else {
    out->assign(block->bytes().data() + req.offset, len);
  }
  CountSource(req.mount_id, block->source);
  if (source) *source = block->source;
  return Status::OK();
}

bool BlockSource::IsCached(const BlockRequest& req) {
  auto t = Resolve(req);
  return t.ok() && store_->Contains(t->meta.id);
}

std::string BlockSource::CachedBlocks(const BlockRequest& req, uint64_t max_blocks) {
  BlockRequest first = req;
  first.index = first.offset = first.length = 0;
  auto t = Resolve(first);  // the file's key, once
  if (!t.ok()) return {};
  const uint64_t blocks = std::min((req.file_size + req.block_size - 1) / req.block_size, max_blocks);
  std::string bits((blocks + 7) / 8, '\0');
  BlockId id = t->meta.id;
  for (uint64_t i = 0; i < blocks; ++i) {
    id.index = i;
    if (store_->Contains(id)) bits[i / 8] = static_cast<char>(bits[i / 8] | (1 << (i % 8)));
  }
  return bits;
}

bool BlockSource::Touched(const BlockRequest& req) {
  auto t = Resolve(req);
  if (!t.ok() || t->len == 0 || store_->Contains(t->meta.id)) return false;
  const Route route = RouteFor(req, *t, nullptr);
  if (route.ask_peers || !route.keep) return false;  // another worker fetches this block
  if (!SecondTouch(t->meta.id) || !store_->HasFreeRoom(t->meta.length)) return false;
  Fill(req, t->meta.id);
  return true;
}

bool BlockSource::SecondTouch(const BlockId& id) {
  MutexLock lock(&mu_);
  BlockId& slot = touched_[BlockIdHash()(id) % kTouched];
  if (slot == id) {
    slot = BlockId{};
    return true;
  }
  slot = id;
  return false;
}

bool BlockSource::JoinRatherThanRange(const BlockId& id) {
  MutexLock lock(&mu_);
  if (std::any_of(uncached_.begin(), uncached_.end(), [&](const auto& u) { return u.first == id; })) return true;
  return inflight_.count(id) > 0 && fills_.count(id) == 0;
}

void BlockSource::Fill(const BlockRequest& req, const BlockId& id) {
  {
    MutexLock lock(&mu_);
    if (!fills_.insert(id).second) return;  // queued already
  }
  if (!Enqueue(Queued{req, id})) {
    MutexLock lock(&mu_);
    fills_.erase(id);
  }
}

Status BlockSource::RangeFirst(const BlockRequest& req, const Target& t, const Route& route, std::string* out,
                               ReadSource* source) {
  // The reader waits for its own bytes only: one ranged read, not the whole block. Whether the
  // rest of the block follows is the access pattern's call (measured: docs/benchmarks.md, "Range
  // first"): a sequential reader starts each block at its offset 0 (never range-first) and hints
  // the blocks ahead; a random reader's block follows whole only when it is touched a second time
  // (SecondTouch: it is hot, the next touches will hit) and the cache has free room for it
  // (HasFreeRoom: no eviction for a guess), then in the background like a readahead hint. A
  // memmap corpus read once at random offsets thus reads each window once, not a block per window.
  const uint64_t start = req.index * req.block_size + req.offset;
  out->assign(t.len, '\0');
  counters_.ufs_reads++;
  counters_.range_reads++;
  StatusOr<uint64_t> n = [&] {
    DemandFetch demand(&pacer_);
    auto begin = std::chrono::steady_clock::now();
    auto r = t.mount.ufs->Read(req.ufs_path, req.version, start, t.len, out->data());
    ufs_latency_.Observe(std::chrono::duration<double>(std::chrono::steady_clock::now() - begin).count());
    return r;
  }();
  if (!n.ok()) {
    counters_.ufs_errors++;
    return n.status();
  }
  counters_.ufs_bytes += *n;
  if (*n != t.len) return VersionChangedError(req.ufs_path + " is shorter in the under-storage than when it was listed");
  counters_.bytes_served += t.len;
  CountSource(req.mount_id, ReadSource::kUnderStorage);
  if (source) *source = ReadSource::kUnderStorage;
  if (route.keep && SecondTouch(t.meta.id) && store_->HasFreeRoom(t.meta.length)) Fill(req, t.meta.id);
  return Status::OK();
}

Status BlockSource::KeepWritten(uint64_t mount_id, const std::string& ufs_path, const std::string& version,
                                uint64_t size, uint64_t block_size, int fd) {
  if (size == 0 || block_size == 0) return Status::OK();
  std::string data;
  for (uint64_t index = 0; index * block_size < size; ++index) {
    BlockRequest req;
    req.mount_id = mount_id;
    req.ufs_path = ufs_path;
    req.version = version;
    req.file_size = size;
    req.block_size = block_size;
    req.index = index;
    req.length = block_size;
    ASSIGN_OR_RETURN(Target t, Resolve(req));
    const Route route = RouteFor(req, t, nullptr);
    if (!route.keep) continue;
    data.resize(t.meta.length);
    size_t done = 0;
    while (done < data.size()) {
      ssize_t n = pread(fd, data.data() + done, data.size() - done, static_cast<off_t>(t.meta.offset + done));
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) return n < 0 ? ErrnoError(errno, "read a written file's staging file") : DataLossError("a staging file is short");
      done += static_cast<size_t>(n);
    }
    BlockMeta kept = t.meta;
    kept.elastic = route.elastic;
    kept.home = route.home;
    if (t.mount.policy) store_->SetMountPolicy(mount_id, *t.mount.policy);
    Status put = store_->Put(kept, data);
    if (put.code() == Code::kAborted) continue;  // freed meanwhile: the free wins
    RETURN_IF_ERROR(put);
    ClassifyAgainIfMissed(route.gen);
  }
  return Status::OK();
}

BlockSource::Route BlockSource::RouteFor(const BlockRequest& req, const Target& t, PeerRef* home) {
  Route route;
  if (placement_ == nullptr) return route;  // alone
  // The kind of what is kept follows the master's membership, not the ranking with peers marked
  // down: a block fetched while standing in for a failed holder is an elastic copy (evicted first),
  // so a short outage leaves no replica beyond the count.
  uint64_t self_id = 0;
  route.gen = classify_gen_.load();  // before the membership: a pass after this sees the block or reruns
  std::vector<PeerRef> members = placement_->Members(&self_id);
  const size_t rank = members.empty() ? 0 : RankOf(t.meta.id, members, self_id);
  route.elastic = !(rank != kNotRanked && rank < t.mount.replicas);
  route.home = rank == 0;
  if (route.home) route.previous = placement_->PreviousHome(t.meta.id);
  if (req.from_peer) return route;  // asked as the home: fetch (if need be) and keep
  size_t self = kNotRanked;
  std::vector<PeerRef> ranked = placement_->Rank(t.meta.id, &self);
  if (!ranked.empty() && self != 0) {
    route.ask_peers = true;
    route.keep = !route.elastic || t.mount.elastic;
    if (route.keep && route.elastic) {
      // No room an elastic copy may take: fetching the whole block would be wasted; stream the range.
      BlockMeta copy = t.meta;
      copy.elastic = true;
      route.keep = store_->CanAdmit(copy);
    }
    if (home != nullptr) *home = ranked[0];
  }
  return route;
}

BlockSource::~BlockSource() {
  {
    MutexLock lock(&prefetch_mu_);
    prefetch_stop_ = true;
  }
  prefetch_cv_.notify_all();
  fill_cv_.notify_all();
  for (auto& t : prefetchers_) t.join();
  for (auto& t : fillers_) t.join();
  std::thread classifier;
  {
    MutexLock lock(&classify_mu_);
    classify_stop_ = true;
    classifier.swap(classifier_);
  }
  classify_cv_.notify_all();
  if (classifier.joinable()) classifier.join();
}

void BlockSource::MembershipChanged() {
  if (placement_ == nullptr) return;
  MutexLock lock(&classify_mu_);
  if (classify_stop_) return;
  classify_wanted_ = true;
  if (!classifier_.joinable()) classifier_ = std::thread([this] { ClassifyLoop(); });
  classify_cv_.notify_one();
}

void BlockSource::ClassifyLoop() {
  for (;;) {
    {
      MutexLock lock(&classify_mu_);
      while (!classify_stop_ && !classify_wanted_) lock.Wait(&classify_cv_);
      if (classify_stop_) return;
      classify_wanted_ = false;
    }
    size_t n = ClassifyNow();
    if (n > 0) spdlog::info("membership changed: {} cached blocks changed kind (replica / elastic copy)", n);
  }
}

void BlockSource::ClassifyAgainIfMissed(uint64_t gen) {
  if (classify_gen_.load() != gen) MembershipChanged();
}

size_t BlockSource::ClassifyNow() {
  if (placement_ == nullptr) return 0;
  uint64_t self = 0;
  std::vector<PeerRef> members = placement_->Members(&self);
  if (members.empty()) return 0;  // membership unknown: leave everything as it is
  {
    MutexLock lock(&classified_mu_);
    if (members != classified_) {
      classified_ = members;
      classify_gen_++;
    }
  }
  std::map<uint64_t, std::optional<uint32_t>> replicas;  // per mount; nullopt: unknown mount
  auto changed = store_->Classify([&](const BlockMeta& m) -> BlockStore::Kind {
    auto it = replicas.find(m.mount_id);
    if (it == replicas.end()) {
      auto mount = mounts_->GetMount(m.mount_id);
      it = replicas.emplace(m.mount_id, mount.ok() ? std::optional<uint32_t>(mount->replicas) : std::nullopt).first;
    }
    if (!it->second) return {m.elastic, m.home};  // cannot tell: keep its kind
    size_t rank = RankOf(m.id, members, self);
    return {!(rank != kNotRanked && rank < *it->second), rank == 0};
  });
  for (const auto& m : changed) reporter_->BlockAdded(m);  // the master's figures follow the new kind
  counters_.classified += changed.size();
  return changed.size();
}

bool BlockSource::Prefetch(const BlockRequest& req) { return Enqueue(Queued{req, std::nullopt}); }

bool BlockSource::Enqueue(Queued q) {
  if (q.ticket == BlockStore::kNoTicket) {
    q.ticket = q.req.free_stamp != 0 ? store_->FreeTicketAt(q.req.free_stamp)
               : q.req.asked_at      ? store_->FreeTicketAsOf(*q.req.asked_at)
                                     : store_->FreeTicket();
  }
  if (q.req.free_stamp == 0) q.req.free_stamp = store_->KnownStamp();
  MutexLock lock(&prefetch_mu_);
  const bool fill = q.fill.has_value();
  std::deque<Queued>& queue = fill ? fill_queue_ : prefetch_queue_;
  if (prefetch_stop_ || queue.size() >= kPrefetchQueue) return false;
  queue.push_back(std::move(q));
  if (fill) {
    if (fillers_.size() < kFillThreads) fillers_.emplace_back([this] { PrefetchLoop(true); });
    fill_cv_.notify_one();
  } else {
    if (prefetchers_.size() < kPrefetchThreads) prefetchers_.emplace_back([this] { PrefetchLoop(false); });
    prefetch_cv_.notify_one();
  }
  return true;
}

void BlockSource::PrefetchLoop(bool fills) {
  for (;;) {
    Queued q;
    {
      MutexLock lock(&prefetch_mu_);
      std::deque<Queued>& queue = fills ? fill_queue_ : prefetch_queue_;
      while (!prefetch_stop_ && queue.empty()) lock.Wait(fills ? &fill_cv_ : &prefetch_cv_);
      if (prefetch_stop_) return;
      q = std::move(queue.front());
      queue.pop_front();
    }
    const BlockRequest& req = q.req;
    Status st = Warm(q.req, q.fill, q.ticket);
    if (st.code() == Code::kInvalidArgument) NoteBadRequest("worker's prefetch queue", st);
    if (!st.ok()) spdlog::debug("prefetch of {} block {}: {}", req.ufs_path, req.index, st.message());
  }
}

Status BlockSource::Warm(BlockRequest req, const std::optional<BlockId>& fill_id, uint64_t ticket) {
  // A random reader's fill holds a fetch-ahead's pacer slot while it fetches: it waits while
  // demand misses fill the store's share, so the readers' own ranges go first. Whatever ends it,
  // its block leaves fills_.
  struct FillSlot {
    BlockSource* self = nullptr;
    BlockId id;
    bool slot = false;
    ~FillSlot() {
      if (self == nullptr) return;
      if (slot) self->pacer_.ReleaseAhead();
      MutexLock lock(&self->mu_);
      self->fills_.erase(id);
    }
  } fill;
  if (fill_id) {
    fill.self = this;
    fill.id = *fill_id;
  }
  req.offset = 0;
  req.length = req.block_size;
  ASSIGN_OR_RETURN(Target t, Resolve(req));
  if (t.len == 0 || store_->Contains(t.meta.id)) return Status::OK();
  PeerRef home;
  Route route = RouteFor(req, t, &home);
  route.ticket = ticket;
  // Freed since the hint was asked: nothing to fetch (its Put would cache nothing), nor to pass on
  // (the home may have had the free already).
  if (ticket != BlockStore::kNoTicket && store_->FreedSince(ticket, t.meta)) {
    counters_.hints_freed++;
    return Status::OK();
  }
  // Not a holder and no elastic copy: the block's home warms it (a copy here would be dropped).
  if (route.ask_peers && !route.keep) return placement_->PrefetchOnPeer(home, req);
  if (fill.self != nullptr) {
    fill.slot = pacer_.AcquireAhead(FetchPacer::kMaxCap, [this] {
      MutexLock lock(&prefetch_mu_);
      return prefetch_stop_;
    });
    if (!fill.slot) return CancelledError("the worker is stopping");
    route.ahead = true;
    if (store_->Contains(t.meta.id) || !store_->HasFreeRoom(t.meta.length)) return Status::OK();
  }
  ASSIGN_OR_RETURN(auto block, Fetch(req, t.mount, t.meta, route));
  counters_.prefetched++;
  return Status::OK();
}

StatusOr<BlockSource::LoadOutcome> BlockSource::Load(BlockRequest req, uint32_t replicas, RateLimiter* pace,
                                                     const std::vector<PeerRef>& members, uint64_t self_id,
                                                     const AheadOptions* ahead, uint64_t free_stamp) {
  req.free_stamp = free_stamp;  // every copy asked of a peer for this batch carries its stamp
  req.offset = 0;
  req.length = req.block_size;
  req.from_peer = false;
  ASSIGN_OR_RETURN(Target t, Resolve(req));
  if (t.len == 0) return LoadOutcome::kNotMine;
  if (replicas == 0) replicas = t.mount.replicas;
  Route route;  // alone: fetch from the under-storage and keep
  route.gen = classify_gen_.load();
  std::optional<PeerRef> home;  // a holder copies from the home of the batch's ranking
  if (!members.empty()) {
    size_t self = RankOf(t.meta.id, members, self_id);
    if (self >= replicas) return LoadOutcome::kNotMine;
    route.home = self == 0;
    route.ask_peers = self != 0 && placement_ != nullptr;
    if (route.ask_peers) {
      for (const auto& m : members) {
        if (RankOf(t.meta.id, members, m.id) == 0) home = m;
      }
    }
  } else if (placement_ != nullptr) {
    size_t self = kNotRanked;
    std::vector<PeerRef> ranked = placement_->Rank(t.meta.id, &self);
    if (!ranked.empty()) {
      if (self == kNotRanked || self >= replicas) return LoadOutcome::kNotMine;
      route.home = self == 0;
      route.ask_peers = self != 0;  // a holder other than the home copies the home's block
    }
  }
  t.meta.home = route.home;
  if (route.home && placement_ != nullptr) route.previous = placement_->PreviousHome(t.meta.id);
  if (store_->Contains(t.meta.id)) {
    // Held already; an elastic copy becomes one of the replicas the load asks for.
    if (store_->MakeReplica(t.meta.id, route.home)) reporter_->BlockAdded(t.meta);
    return LoadOutcome::kCached;
  }
  // A fetch-ahead takes free room only (below a level's low watermark, counting what its fetches in
  // flight will take) and a slot.
  struct Slot {
    FetchPacer* pacer = nullptr;
    ~Slot() {
      if (pacer) pacer->ReleaseAhead();
    }
  } slot;
  if (ahead != nullptr) {
    uint64_t inflight = pacer_.Get().ahead_inflight;
    if (!store_->HasFreeRoom(t.meta.length * (1 + inflight))) {
      counters_.ahead_no_room++;
      return LoadOutcome::kNoRoom;
    }
    bool have = ahead->held != nullptr && *ahead->held;
    if (have && !pacer_.WithinTarget(ahead->cap)) {  // a demand miss came, or the target shrank: yield
      pacer_.ReleaseAhead();
      *ahead->held = have = false;
    }
    if (!have && !pacer_.AcquireAhead(ahead->cap, ahead->stop)) return CancelledError("the fetch-ahead was stopped");
    if (ahead->held != nullptr) {
      *ahead->held = true;  // the caller's now, for its next block
    } else {
      slot.pacer = &pacer_;
    }
    route.ahead = true;
    if (store_->Contains(t.meta.id)) return LoadOutcome::kCached;  // a reader fetched it meanwhile
    // Again with the slot held: the room may have gone to the fetches that got theirs first.
    if (!store_->HasFreeRoom(t.meta.length * pacer_.Get().ahead_inflight)) {
      counters_.ahead_no_room++;
      return LoadOutcome::kNoRoom;
    }
  }
  if (pace != nullptr && !pace->Acquire(t.meta.length)) return CancelledError("the load job was cancelled");
  // A free of the block while its bytes are on their way wins (BlockStore::Put): the load counts
  // the block fetched, and nothing is cached. So does a free the master stamped after the batch's
  // files were read, even one that came here before the batch (BlockStore::FreeTicketAt).
  const uint64_t ticket = store_->FreeTicketAt(free_stamp);
  route.ticket = ticket;
  if (home) {
    // Ask the home the master's list names, not this worker's own view of the membership, which
    // may lag or still hold a peer marked down: the block is then fetched from the under-storage
    // once, by that home, and the copy lands here.
    std::string data;
    BlockRequest whole = req;
    whole.length = t.meta.length;  // the block's real length (the file's last block is shorter)
    Status st = placement_->ReadFromPeer(*home, whole, &data);
    if (st.ok() && data.size() == t.meta.length) {
      counters_.peer_reads++;
      counters_.peer_bytes += data.size();
      if (t.mount.policy) store_->SetMountPolicy(req.mount_id, *t.mount.policy);
      Status put = store_->Put(t.meta, data, ticket);
      if (put.code() == Code::kAborted) return LoadOutcome::kFetched;
      if (put.ok()) {
        ClassifyAgainIfMissed(route.gen);
        reporter_->BlockAdded(t.meta);
        (ahead ? counters_.ahead_blocks : counters_.loaded_blocks)++;
        (ahead ? counters_.ahead_bytes : counters_.loaded_bytes) += data.size();
        return LoadOutcome::kFetched;
      }
      if (store_->Contains(t.meta.id)) return LoadOutcome::kCached;  // a reader cached it meanwhile
      return ResourceExhaustedError("fetched but not kept (" + put.message() + "): raise the tier quotas, free "
                                    "other datasets, or check the cache policy");
    }
    if (!st.ok() && (!st.IsRetryable() || st.IsUnderStorageDown())) return st;
    if (st.ok()) return DataLossError("the home worker sent " + std::to_string(data.size()) + " bytes of a " +
                                      std::to_string(t.meta.length) + "-byte block");
    spdlog::warn("load: home {} failed ({}); fetching the usual way", home->address, st.message());
    placement_->PeerFailed(*home);
  }
  ASSIGN_OR_RETURN(auto block, Fetch(req, t.mount, t.meta, route));
  if (!store_->Contains(t.meta.id) && !store_->FreedSince(ticket, t.meta)) {
    // The bytes came from another fetch of the block (joined in flight, or kept aside uncached)
    // whose Put found no room or was refused by a free older than this load (issue 54: a load
    // right after a free failed so): this load's own Put decides.
    Status put = store_->Put(t.meta, block->bytes(), ticket);
    if (put.ok()) {
      ClassifyAgainIfMissed(route.gen);
      reporter_->BlockAdded(t.meta);
    } else if (put.code() != Code::kAborted && !store_->Contains(t.meta.id)) {
      return ResourceExhaustedError("fetched but not kept (" + put.message() + "): raise the tier quotas, free "
                                    "other datasets, or check the cache policy");
    }
  }
  (ahead ? counters_.ahead_blocks : counters_.loaded_blocks)++;
  (ahead ? counters_.ahead_bytes : counters_.loaded_bytes) += block->bytes().size();
  return LoadOutcome::kFetched;
}

void BlockSource::CountAccess(uint64_t mount_id, bool hit) {
  MutexLock lock(&access_mu_);
  auto& a = access_[mount_id];
  (hit ? a.hits : a.misses)++;
}

void BlockSource::CountSource(uint64_t mount_id, ReadSource source) {
  MutexLock lock(&access_mu_);
  auto& a = access_[mount_id];
  (source == ReadSource::kPeer ? a.peer : a.under_storage)++;
}

std::map<uint64_t, MountAccess> BlockSource::AccessByMount() const {
  MutexLock lock(&access_mu_);
  return {access_.begin(), access_.end()};
}

Status BlockSource::FromPeers(const BlockRequest& req, const BlockId& id, std::string* out, bool* became_home) {
  Status last = UnavailableError("no peer holds this block");
  for (int attempt = 0; attempt < kMaxPeerAttempts; ++attempt) {
    size_t self = kNotRanked;
    std::vector<PeerRef> ranked = placement_->Rank(id, &self);
    if (ranked.empty() || self == 0) {
      *became_home = true;
      break;
    }
    const PeerRef& home = ranked[0];
    out->clear();
    Status st = placement_->ReadFromPeer(home, req, out);
    if (st.ok()) {
      counters_.peer_reads++;
      counters_.peer_bytes += out->size();
      return st;
    }
    if (!st.IsRetryable() || st.IsUnderStorageDown()) return st;  // the peer is up; the storage is not
    spdlog::warn("peer {} failed ({}); asking the next worker", home.address, st.message());
    counters_.peer_failovers++;
    placement_->PeerFailed(home);
    last = st;
  }
  return last;
}

BlockSource::Fetched BlockSource::Fetch(const BlockRequest& req, const MountHandle& mount, const BlockMeta& meta,
                                        Route route) {
  std::shared_ptr<Flight> f;
  bool leader = false;
  {
    MutexLock lock(&mu_);
    for (auto u = uncached_.begin(); u != uncached_.end(); ++u) {
      if (u->first == meta.id) {
        counters_.buffered++;
        uncached_.splice(uncached_.begin(), uncached_, u);
        return u->second;
      }
    }
    auto it = inflight_.find(meta.id);
    if (it != inflight_.end()) {
      f = it->second;
      counters_.coalesced++;
    } else {
      // Every under-storage fetch of a large block streams, so a reader that joins it (a readahead
      // hint or a fetch-ahead got there first) reads its range as it lands.
      f = NewFlightLocked(meta, Streams(route, meta));
      leader = true;
    }
  }
  if (!leader) return f->result.get();
  return Lead(req, mount, meta, route, f);
}

bool BlockSource::Streams(const Route& route, const BlockMeta& meta) {
  return !route.ask_peers && !route.previous && meta.length >= kStreamMinBlock;
}

std::shared_ptr<BlockSource::Flight> BlockSource::NewFlightLocked(const BlockMeta& meta, bool streams) {
  auto f = std::make_shared<Flight>();
  f->result = f->promise.get_future().share();
  if (streams) {
    f->block = std::make_shared<FetchedBlock>();
    f->block->Allocate(meta.length);
    f->block->source = ReadSource::kUnderStorage;
  }
  inflight_.emplace(meta.id, f);
  return f;
}

BlockSource::Fetched BlockSource::Lead(const BlockRequest& req, const MountHandle& mount, const BlockMeta& meta,
                                       const Route& route, const std::shared_ptr<Flight>& f) {
  // A fetch of this block may have finished between this request's miss in the store and its
  // arrival here (the leader had already left inflight_): look again before fetching.
  Fetched result = [&]() -> Fetched {
    std::shared_ptr<FetchedBlock> data = f->block;
    if (!data) {
      data = std::make_shared<FetchedBlock>();
      data->Allocate(meta.length);
      data->source = ReadSource::kUnderStorage;  // it was fetched an instant ago; as that fetch did
    }
    auto cached = store_->Read(meta.id, 0, meta.length, data->raw.get());
    if (cached.ok() && *cached == meta.length) {
      f->progress.Landed(meta.length);
      return std::shared_ptr<const FetchedBlock>(std::move(data));
    }
    return FetchOnce(req, mount, meta, route, f->block ? f.get() : nullptr);
  }();
  // Out of inflight_ before the result is told: a request that sees the result (a failure, say)
  // and asks again must start a fetch of its own, not join this one, which has ended.
  {
    MutexLock lock(&mu_);
    auto it = inflight_.find(meta.id);
    if (it != inflight_.end() && it->second == f) inflight_.erase(it);
  }
  f->promise.set_value(result);
  f->progress.Finish();
  return result;
}

bool BlockSource::Stream(const BlockRequest& req, const Target& t, const Route& route, std::string* out,
                         ReadSource* source, std::optional<Fetched>* fetched, SharedBytes* shared) {
  const BlockMeta& meta = t.meta;
  std::shared_ptr<Flight> f;
  bool leader = false;
  {
    MutexLock lock(&mu_);
    for (const auto& u : uncached_) {
      if (u.first == meta.id) return false;  // served from the buffer, as Fetch does
    }
    auto it = inflight_.find(meta.id);
    if (it != inflight_.end()) {
      if (!it->second->block) return false;  // not streamed: join it as Fetch does
      f = it->second;
      counters_.coalesced++;
    } else {
      f = NewFlightLocked(meta, true);
      leader = true;
    }
  }
  // The leader's fetch runs on a thread of its own, so this request, too, is answered as its range
  // lands.
  if (leader) {
    stream_pool_.Post([this, req, mount = t.mount, meta, route, f] { (void)Lead(req, mount, meta, route, f); });
  }
  const uint64_t end = req.offset + t.len;
  if (f->progress.WaitFor(end) >= end) {
    if (shared != nullptr) {
      *shared = SharedBytes{f->block, std::string_view(f->block->raw.get() + req.offset, t.len)};
    } else {
      out->assign(f->block->raw.get() + req.offset, t.len);
    }
    counters_.bytes_served += t.len;
    counters_.streamed++;
    CountSource(req.mount_id, ReadSource::kUnderStorage);
    if (source) *source = ReadSource::kUnderStorage;
    return true;
  }
  *fetched = f->result.get();
  return false;
}

BlockSource::Fetched BlockSource::FetchOnce(const BlockRequest& req, const MountHandle& mount, const BlockMeta& meta,
                                            Route route, Flight* into) {
  // Taken before the bytes set out: a free of the block meanwhile keeps them out of the cache (a
  // load batch's, older, was taken for it: BlockStore::FreeTicketAt).
  const uint64_t ticket = std::min(route.ticket, store_->FreeTicket());
  std::shared_ptr<FetchedBlock> fb = into != nullptr ? into->block : std::make_shared<FetchedBlock>();
  fb->source = ReadSource::kUnderStorage;
  std::string* data = &fb->str;
  bool fetched = false;
  if (route.ask_peers) {
    BlockRequest whole = req;
    whole.offset = 0;
    whole.length = meta.length;
    bool became_home = false;
    Status st = FromPeers(whole, meta.id, data, &became_home);
    if (!st.ok() && !st.IsRetryable()) return st;
    fetched = st.ok() && data->size() == meta.length;  // a peer's short answer is no block
    if (fetched) fb->source = ReadSource::kPeer;
    if (fetched && route.elastic) counters_.elastic_peer_bytes += data->size();
  }
  if (!fetched && route.previous) {
    // A join made this worker the block's home; its previous home likely still holds it.
    BlockRequest whole = req;
    whole.offset = 0;
    whole.length = meta.length;
    whole.cached_only = true;
    Status st = placement_->ReadFromPeer(*route.previous, whole, data);
    fetched = st.ok() && data->size() == meta.length;
    if (fetched) {
      fb->source = ReadSource::kPeer;
      counters_.peer_reads++;
      counters_.peer_bytes += data->size();
      counters_.previous_home_blocks++;
    } else if (!st.ok() && !st.IsNotFound()) {
      spdlog::debug("previous home {} of a block: {}; reading the under-storage", route.previous->address,
                    st.message());
    }
  }
  if (!fetched) {
    data->clear();
    char* buf = into != nullptr ? fb->raw.get() : fb->Allocate(meta.length);
    counters_.ufs_reads++;
    std::optional<DemandFetch> demand;  // a reader waits on this fetch: fetch-ahead yields to it
    if (!route.ahead) demand.emplace(&pacer_);
    auto start = std::chrono::steady_clock::now();
    ReadProgress* progress = into != nullptr ? &into->progress : nullptr;
    // A block that is the whole file is asked for whole (for S3, a GET without a Range: cheaper for
    // the store); any other, as the range it is.
    auto n = req.index == 0 && meta.length == req.file_size
                 ? mount.ufs->ReadWhole(req.ufs_path, req.version, meta.length, buf, progress)
                 : mount.ufs->ReadStreaming(req.ufs_path, req.version, req.index * req.block_size, meta.length, buf,
                                            progress);
    double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    ufs_latency_.Observe(took);
    if (!n.ok()) {
      counters_.ufs_errors++;
      return n.status();
    }
    pacer_.Record(*n, took);
    counters_.ufs_bytes += *n;
    if (*n != meta.length) {
      return VersionChangedError(req.ufs_path + " is shorter in the under-storage than when it was listed");
    }
  }
  if (mount.policy) store_->SetMountPolicy(req.mount_id, *mount.policy);
  BlockMeta kept = meta;
  kept.elastic = route.elastic;
  kept.home = route.home;
  Status st = route.keep ? store_->Put(kept, fb->bytes(), ticket) : FailedPreconditionError("not a holder of this block");
  std::shared_ptr<const FetchedBlock> block(std::move(fb));
  if (st.ok()) {
    ClassifyAgainIfMissed(route.gen);
    reporter_->BlockAdded(kept);
  } else {
    spdlog::debug("serving block uncached: {}", st.message());
    MutexLock lock(&mu_);
    uncached_.emplace_front(meta.id, block);
    if (uncached_.size() > kUncachedBlocks) uncached_.pop_back();
  }
  return block;
}

}  // namespace granary::worker
