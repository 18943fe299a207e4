#include "worker/server.h"

#include <spdlog/spdlog.h>

#include <grp.h>
#include <sys/stat.h>

#include <cerrno>
#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstring>
#include <map>
#include <mutex>
#include <thread>
#include <tuple>

#include "common/bad_request.h"
#include "common/keys.h"
#include "common/metrics.h"
#include "common/net.h"
#include "common/rate_limiter.h"
#include "common/thread_pool.h"
#include "proto/granary.grpc.pb.h"
#include "rpc/call_counts.h"
#include "rpc/rpc.h"
#include "worker/block_source.h"
#include "worker/block_store.h"
#include "worker/master_link.h"
#include "worker/meta_proxy.h"
#include "worker/local_server.h"
#include "worker/peers.h"
#include "common/fs.h"
#include "worker/stat_metrics.h"
#include "worker/writes.h"

namespace granary::worker {
namespace {

constexpr size_t kChunkBytes = 1 << 20;  // ReadBlock's chunks for a caller that names no size
// Blocks of one LoadBlocks batch: a 64 TiB file of 4 MiB blocks (the master's batches hold at most
// kBatchFiles files and kBatchBytes bytes beyond their last file).
constexpr uint64_t kMaxLoadBlocks = 16u << 20;

StatusOr<std::vector<FileKey>> ParseFileKeys(const google::protobuf::RepeatedPtrField<std::string>& raw) {
  std::vector<FileKey> keys;
  keys.reserve(raw.size());
  for (const auto& k : raw) {
    FileKey f;
    if (!FileKeyFromBytes(k, &f)) return InvalidArgumentError("a file key must be 16 bytes");
    keys.push_back(f);
  }
  return keys;
}

// ReadBlock's buffers, kept from one call to the next. A block-sized std::string made per call is
// zero-filled and page-faulted anew every time: nearly half of a peer read's CPU on the serving
// worker (docs/benchmarks.md, session 36). A buffer keeps its size when it comes back, so
// the next read of a block no larger resizes it without writing it. At most kKeep buffers of at most
// kKeepBytes each are kept (32 MiB); a larger one is let go.
class ReadBuffers {
 public:
  std::string Take() {
    MutexLock lock(&mu_);
    if (free_.empty()) return {};
    std::string b = std::move(free_.back());
    free_.pop_back();
    return b;
  }
  void Give(std::string b) {
    if (b.capacity() > kKeepBytes) return;
    MutexLock lock(&mu_);
    if (free_.size() < kKeep) free_.push_back(std::move(b));
  }

 private:
  static constexpr size_t kKeep = 4;
  static constexpr size_t kKeepBytes = 8u << 20;
  Mutex mu_;
  std::vector<std::string> free_ GUARDED_BY(mu_);
};

// Whether a LoadBlocks call was cancelled, asked of gRPC at most once per kEvery. On a sync call
// ServerContext::IsCancelled polls the call's completion queue (an epoll round and its locks): asked
// per block and per pacer slot, that was 7% of a cold worker's CPU (docs/benchmarks.md, session
// 37). In between the last answer stands, so a cancelled batch stops at most kEvery later.
// Thread-safe: a batch's threads share one.
class CancelWatch {
 public:
  explicit CancelWatch(grpc::ServerContext* ctx) : ctx_(ctx) {}
  bool operator()() {
    if (cancelled_.load(std::memory_order_relaxed)) return true;
    const int64_t now = std::chrono::steady_clock::now().time_since_epoch().count();
    int64_t last = asked_ns_.load(std::memory_order_relaxed);
    if (last != 0 && now - last < std::chrono::nanoseconds(kEvery).count()) return false;
    if (!asked_ns_.compare_exchange_strong(last, now)) return cancelled_.load();  // another thread asks
    if (!ctx_->IsCancelled()) return false;
    cancelled_ = true;
    return true;
  }

 private:
  static constexpr std::chrono::milliseconds kEvery{50};
  grpc::ServerContext* const ctx_;
  std::atomic<int64_t> asked_ns_{0};
  std::atomic<bool> cancelled_{false};
};

class WorkerService final : public rpc::Worker::Service {
 public:
  // `forget_mount` drops an unmounted dataset's opened mount (MasterLink::ForgetMount).
  WorkerService(BlockSource* source, BlockStore* store, std::shared_ptr<RpcSecurity> sec,
                std::function<rpc::WorkerStats()> stats, std::function<void(uint64_t)> forget_mount)
      : source_(source), store_(store), sec_(std::move(sec)), stats_(std::move(stats)),
        forget_mount_(std::move(forget_mount)) {}

  grpc::Status SetPins(grpc::ServerContext* ctx, const rpc::SetPinsRequest* req, rpc::SetPinsResponse*) override {
    if (auto a = sec_->CheckToken(ctx); !a.ok()) return a;
    auto keys = ParseFileKeys(req->file_keys());
    if (!keys.ok()) return ToGrpc(keys.status());
    return ToGrpc(req->replace() ? store_->SetPins(*keys) : store_->Pin(*keys, req->pin()));
  }

  grpc::Status FreeBlocks(grpc::ServerContext* ctx, const rpc::FreeBlocksRequest* req,
                          rpc::FreeBlocksResponse* resp) override {
    if (auto a = sec_->CheckToken(ctx); !a.ok()) return a;
    auto keys = ParseFileKeys(req->file_keys());
    if (!keys.ok()) return ToGrpc(keys.status());
    constexpr int kMaxMounts = 1024;
    if (req->mount_ids_size() > kMaxMounts) {
      Status bad = InvalidArgumentError("at most " + std::to_string(kMaxMounts) + " mounts per FreeBlocks");
      NoteBadRequest("worker's FreeBlocks", bad);
      return ToGrpc(bad);
    }
    uint64_t blocks = keys->empty() ? 0 : store_->Free(*keys, req->stamp());
    for (uint64_t id : req->mount_ids()) {
      forget_mount_(id);  // reads of it ask the master again, and hear it is gone
      size_t n = store_->FreeMount(id, req->stamp());
      if (n > 0) spdlog::info("freed {} cached blocks of unmounted mount {}", n, id);
      blocks += n;
    }
    resp->set_blocks(blocks);
    return grpc::Status::OK;
  }

  grpc::Status ReadBlock(grpc::ServerContext* ctx, const rpc::ReadBlockRequest* req,
                         grpc::ServerWriter<rpc::ReadBlockChunk>* writer) override {
    if (auto a = sec_->CheckToken(ctx); !a.ok()) return a;
    BlockRequest br{req->mount_id(), req->ufs_path(), req->version(), req->file_size(), req->block_size(),
                    req->index(),      req->offset(),   req->length(),  req->from_peer(),
                    req->from_peer() && req->cached_only()};
    br.random = req->random();
    br.continues = req->continues();
    br.free_stamp = req->free_stamp();
    std::string data = buffers_.Take();
    struct GiveBack {
      ReadBuffers* pool;
      std::string* b;
      ~GiveBack() { pool->Give(std::move(*b)); }
    } give_back{&buffers_, &data};
    bool hit = false;
    ReadSource source = ReadSource::kCache;
    auto start = std::chrono::steady_clock::now();
    Status st = source_->Read(br, &data, &hit, &source);
    read_latency_.Observe(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
    if (st.code() == Code::kInvalidArgument) NoteBadRequest("worker's ReadBlock", st);
    if (!st.ok()) return ToGrpc(st);
    // As large chunks as the caller takes (ReadBlockRequest.max_chunk_bytes): a whole block in one
    // message goes out of `data` itself (swapped in and back), not copied into the message.
    const size_t chunk_bytes =
        req->max_chunk_bytes() == 0 ? kChunkBytes : std::clamp<uint64_t>(req->max_chunk_bytes(), kChunkBytes, kMaxReadChunkBytes);
    size_t off = 0;
    do {
      rpc::ReadBlockChunk chunk;
      size_t n = std::min(chunk_bytes, data.size() - off);
      const bool whole = off == 0 && n == data.size();
      if (whole) {
        chunk.mutable_data()->swap(data);
      } else {
        chunk.set_data(data.data() + off, n);
      }
      if (off == 0) {
        chunk.set_cache_hit(hit);
        chunk.set_source(rpc::ToWire(source));
      }
      const bool sent = writer->Write(chunk);
      if (whole) data.swap(*chunk.mutable_data());  // back to the pool
      if (!sent) return grpc::Status(grpc::StatusCode::CANCELLED, "reader went away");
      off += n;
    } while (off < data.size());
    return grpc::Status::OK;
  }

  grpc::Status Prefetch(grpc::ServerContext* ctx, const rpc::PrefetchRequest* req, rpc::PrefetchResponse* resp) override {
    if (auto a = sec_->CheckToken(ctx); !a.ok()) return a;
    uint32_t queued = 0;
    // granary-fuse's hints and touches waited in its queue: a free since they were asked wins
    // (issue 53: a readahead of the last epoch came back after a free).
    const auto asked = std::chrono::steady_clock::now() - std::chrono::milliseconds(req->age_ms()) -
                       BlockSource::kHintTransit;
    for (const auto& r : req->blocks()) {
      if (req->touched()) {
        BlockRequest br{r.mount_id(), r.ufs_path(), r.version(), r.file_size(), r.block_size(),
                        r.index(),    r.offset(),   r.length(),  false};
        br.asked_at = asked;
        queued += source_->Touched(br);
        continue;
      }
      BlockRequest br{r.mount_id(), r.ufs_path(), r.version(), r.file_size(), r.block_size(),
                      r.index(),    0,            0,           r.from_peer()};
      br.free_stamp = r.free_stamp();  // a peer's hint: the frees seen here since it was queued win
      if (br.free_stamp == 0) br.asked_at = asked;
      queued += source_->Prefetch(br);
    }
    resp->set_queued(queued);
    return grpc::Status::OK;
  }

  // A batch of a load job: this worker's share of its blocks, `parallel` at a time, paced by the
  // job's limiter here (one per job, shared by the job's concurrent batches).
  grpc::Status LoadBlocks(grpc::ServerContext* ctx, const rpc::LoadBlocksRequest* req,
                          rpc::LoadBlocksResponse* resp) override {
    if (auto a = sec_->CheckToken(ctx); !a.ok()) return a;
    // The batch's blocks, numbered across its files: file i has blocks ends[i-1] .. ends[i]-1. No
    // per-block list is made, so a batch costs memory by its files, whatever sizes they claim.
    std::vector<uint64_t> ends;
    ends.reserve(req->files_size());
    uint64_t total = 0;
    for (int i = 0; i < req->files_size(); ++i) {
      const rpc::LoadFile& f = req->files(i);
      if (f.block_size() < kMinBlockSize || f.block_size() > kMaxBlockSize) {
        Status bad = InvalidArgumentError(f.path() + ": block_size " + std::to_string(f.block_size()) +
                                          " is out of range");
        NoteBadRequest("worker's LoadBlocks", bad);
        return ToGrpc(bad);
      }
      total += f.size() / f.block_size() + (f.size() % f.block_size() != 0);  // < 2^48 per file: no wrap
      if (total > kMaxLoadBlocks) {
        Status bad = InvalidArgumentError("at most " + std::to_string(kMaxLoadBlocks) + " blocks per load batch");
        NoteBadRequest("worker's LoadBlocks", bad);
        return ToGrpc(bad);
      }
      ends.push_back(total);
    }
    auto block = [&](uint64_t k, int* file) {
      *file = static_cast<int>(std::upper_bound(ends.begin(), ends.end(), k) - ends.begin());
      const rpc::LoadFile& f = req->files(*file);
      uint64_t b = k - (*file == 0 ? 0 : ends[*file - 1]);
      return BlockRequest{f.mount_id(), f.ufs_path(), f.version(), f.size(), f.block_size(), b, 0, f.block_size(),
                          false};
    };
    std::shared_ptr<RateLimiter> pace = Pace(req->job_id(), req->bandwidth());
    std::vector<PeerRef> members;
    for (const auto& w : req->workers()) members.push_back(PeerRef{w.id(), w.address()});
    std::atomic<uint64_t> next{0};
    std::atomic<uint64_t> fetched{0}, fetched_bytes{0}, cached{0}, no_room{0};
    std::atomic<bool> full{false};  // fetch-ahead: a block found no free room; the rest is skipped
    BlockSource::AheadOptions ahead;
    ahead.cap = std::clamp<uint32_t>(req->parallel() ? req->parallel() : FetchPacer::kMaxCap, 1, FetchPacer::kMaxCap);
    CancelWatch cancelled(ctx);  // outlives the helpers (they are waited for below)
    ahead.stop = [&cancelled] { return cancelled(); };
    const BlockSource::AheadOptions* ahead_opts = req->fetch_ahead() ? &ahead : nullptr;
    Mutex fail_mu;
    std::map<int, std::string> failed;  // GUARDED_BY(fail_mu): file index -> first reason
    auto work = [&] {
      // A fetch-ahead thread keeps its pacer slot from block to block (AheadOptions::held).
      bool held = false;
      BlockSource::AheadOptions mine = ahead;
      mine.held = &held;
      const BlockSource::AheadOptions* my_opts = ahead_opts != nullptr ? &mine : nullptr;
      struct GiveBack {
        BlockSource* source;
        bool* held;
        ~GiveBack() {
          if (*held) source->ReleaseAheadSlot();
        }
      } give_back{source_, &held};
      for (uint64_t k; (k = next++) < total;) {
        if (cancelled()) return;
        int file;
        BlockRequest br = block(k, &file);
        {
          MutexLock lock(&fail_mu);
          if (failed.count(file)) continue;  // one failure fails the file: its other blocks are not tried
        }
        if (full) {
          no_room++;
          continue;
        }
        auto outcome =
            source_->Load(br, req->replicas(), pace.get(), members, req->worker_id(), my_opts, req->free_stamp());
        if (outcome.ok() && *outcome == BlockSource::LoadOutcome::kNoRoom) {
          full = true;
          no_room++;
        } else if (!outcome.ok()) {
          if (outcome.status().code() == Code::kInvalidArgument) NoteBadRequest("worker's LoadBlocks", outcome.status());
          MutexLock lock(&fail_mu);
          failed.emplace(file, outcome.status().message());
        } else if (*outcome == BlockSource::LoadOutcome::kFetched) {
          fetched++;
          fetched_bytes += std::min(br.block_size, br.file_size - br.index * br.block_size);
        } else if (*outcome == BlockSource::LoadOutcome::kCached) {
          cached++;
        }
      }
    };
    // A fetch-ahead batch gets as many threads as its cap (at most kAheadBatchThreads), at most one
    // per block not cached yet (a batch of an epoch already cached costs a look per block, not 64
    // threads): the pacer decides how many fetch at once, and the threads beyond its target wait
    // in its queue (cheaply: each on its own condition variable). Sizing a batch by the pacer's
    // target when it arrived held a cold epoch below the target: the master's first batches come
    // while the target is still ramping (4-16), and kept that few threads to their end, so a
    // growing target found nobody to fill it (a cold epoch 9% slower; docs/benchmarks.md, session 44).
    size_t threads = std::clamp<size_t>(req->parallel() ? req->parallel() : 8, 1, 64);
    if (req->fetch_ahead()) {
      uint64_t uncached = 0;
      int file = 0;
      for (uint64_t k = 0; k < total && uncached < ahead.cap; ++k) uncached += !source_->IsCached(block(k, &file));
      threads = static_cast<size_t>(std::clamp<uint64_t>(uncached, 1, kAheadBatchThreads));
    }
    threads = static_cast<size_t>(std::min<uint64_t>(threads, std::max<uint64_t>(total, 1)));
    // The helpers come from the service's pool (threads that stay between batches: a cold epoch's
    // batches made and ended a thousand threads, each a clone, a stack and its unmapping). Once
    // this call's own work() is done, every block is taken: it waits for the helpers that started
    // (they use its stack), and one that starts later (queued behind other batches in a full pool)
    // does nothing.
    struct Helpers {
      Mutex mu;
      std::condition_variable cv;
      bool closed = false;  // GUARDED_BY(mu)
      size_t running = 0;   // GUARDED_BY(mu)
    };
    auto helpers = std::make_shared<Helpers>();
    for (size_t i = 1; i < threads; ++i) {
      load_pool_.Post([helpers, &work] {
        {
          MutexLock lock(&helpers->mu);
          if (helpers->closed) return;
          ++helpers->running;
        }
        work();
        MutexLock lock(&helpers->mu);
        if (--helpers->running == 0) helpers->cv.notify_all();
      });
    }
    work();
    {
      MutexLock lock(&helpers->mu);
      helpers->closed = true;
      while (helpers->running > 0) lock.Wait(&helpers->cv);
    }
    if (ctx->IsCancelled()) return grpc::Status(grpc::StatusCode::CANCELLED, "the load batch was cancelled");
    resp->set_blocks_fetched(fetched);
    resp->set_bytes_fetched(fetched_bytes);
    resp->set_blocks_cached(cached);
    resp->set_blocks_no_room(no_room);
    for (const auto& [i, reason] : failed) {
      rpc::LoadFailure* f = resp->add_failures();
      f->set_path(req->files(i).path());
      f->set_reason(reason);
    }
    return grpc::Status::OK;
  }

  grpc::Status GetStats(grpc::ServerContext* ctx, const rpc::GetStatsRequest*, rpc::WorkerStats* resp) override {
    if (auto a = sec_->CheckToken(ctx); !a.ok()) return a;
    *resp = stats_();
    return grpc::Status::OK;
  }

  grpc::Status GetResidency(grpc::ServerContext* ctx, const rpc::ResidencyRequest* req,
                            rpc::ResidencyResponse* resp) override {
    if (auto a = sec_->CheckToken(ctx); !a.ok()) return a;
    constexpr uint64_t kMaxBlocks = 1'000'000;  // per request: the answer must fit a message
    uint64_t asked = 0;
    for (const auto& q : req->files()) {
      asked += std::min<uint64_t>(q.blocks(), kMaxBlocks + 1);  // no sum that wraps around
      if (asked > kMaxBlocks || q.first() > ~uint64_t{0} - q.blocks()) {
        Status bad = InvalidArgumentError("at most " + std::to_string(kMaxBlocks) +
                                          " blocks per residency request, within the index range");
        NoteBadRequest("worker's GetResidency", bad);
        return ToGrpc(bad);
      }
    }
    const std::vector<std::string> media = store_->Media();
    for (const auto& q : req->files()) {
      FileKey key;
      if (!FileKeyFromBytes(q.file_key(), &key)) return ToGrpc(InvalidArgumentError("a file key must be 16 bytes"));
      rpc::FileResidency* f = resp->add_files();
      f->set_file_key(q.file_key());
      for (uint64_t i = q.first(); i < q.first() + q.blocks(); ++i) {
        auto place = store_->Locate(BlockId{key, i});
        if (!place) continue;
        rpc::BlockResidency* b = f->add_blocks();
        b->set_index(i);
        b->set_level(static_cast<uint32_t>(place->level));
        if (place->level >= 0 && static_cast<size_t>(place->level) < media.size()) b->set_medium(media[place->level]);
        b->set_elastic(place->elastic);
        b->set_length(place->length);
      }
    }
    return grpc::Status::OK;
  }

  const metrics::Histogram& read_latency() const { return read_latency_; }

 private:
  metrics::Histogram read_latency_;
  // The job's limiter, made on its first batch (a new rate replaces it); the last few jobs' are kept.
  std::shared_ptr<RateLimiter> Pace(uint64_t job, uint64_t rate) {
    if (rate == 0) return nullptr;
    MutexLock lock(&pace_mu_);
    auto& p = paces_[job];
    if (!p || p->rate() != rate) p = std::make_shared<RateLimiter>(rate);
    while (paces_.size() > 16 && paces_.begin()->first != job) paces_.erase(paces_.begin());
    return paces_[job];
  }

  Mutex pace_mu_;
  std::map<uint64_t, std::shared_ptr<RateLimiter>> paces_ GUARDED_BY(pace_mu_);  // by job id
  BlockSource* source_;
  ReadBuffers buffers_;  // ReadBlock's
  BlockStore* store_;
  std::shared_ptr<RpcSecurity> sec_;
  std::function<rpc::WorkerStats()> stats_;
  std::function<void(uint64_t)> forget_mount_;
  // Threads of one fetch-ahead batch at most: the master keeps 4 in flight, so together they can
  // fill the pacer's largest target (FetchPacer::kMaxCap).
  static constexpr uint64_t kAheadBatchThreads = FetchPacer::kMaxCap / 4;
  // Load batches' helper threads (LoadBlocks): fetch-ahead batches of up to kAheadBatchThreads and
  // a few loads run at once; idle threads end after 30 s.
  ThreadPool load_pool_{0, 4 * FetchPacer::kMaxCap + 64, std::chrono::seconds(30)};
};

class WorkerServerImpl final : public WorkerServer {
 public:
  ~WorkerServerImpl() override { Shutdown(); }

  Status Init(const Config& cfg) {
    ASSIGN_OR_RETURN(sec_, RpcSecurity::FromConfig(cfg.rpc));
    RETURN_IF_ERROR(CheckServingPolicy("worker.listen", cfg.worker.listen, cfg.rpc));
    RETURN_IF_ERROR(CheckCanListen(cfg.worker.listen).WithContext("worker.listen"));
    ASSIGN_OR_RETURN(UfsAccess access, UfsAccess::FromConfig(cfg));
    StoreOptions so;
    so.levels = cfg.worker.EffectiveLevels();
    so.policy = cfg.worker.tieredstore.policy;
    so.promote = cfg.worker.tieredstore.promote;
    so.scrub_bandwidth = cfg.worker.scrub_bandwidth;
    so.trust_own_writes = cfg.worker.trust_own_writes;
    policy_ = so.policy;
    ASSIGN_OR_RETURN(store_, BlockStore::Open(so));
    grpc::ServerBuilder builder;
    int port = 0;
    builder.AddListeningPort(cfg.worker.listen, sec_->ServerCredentials(), &port);
    builder.SetMaxReceiveMessageSize(kMaxMessageBytes);
    AllowKeepalivePings(&builder);
    builder.SetMaxSendMessageSize(kMaxMessageBytes);
    auto stats = [this] { return Stats(); };
    peers_ = std::make_unique<PeerSet>(sec_, cfg.rpc.timeout);
    link_ = std::make_unique<MasterLink>(cfg, sec_, store_.get(), stats, access,
                                         [this](uint64_t self, const std::vector<PeerRef>& live) {
                                           // The cache re-sorts replicas and elastic copies when
                                           // the membership changes.
                                           if (peers_->Update(self, live) && source_) source_->MembershipChanged();
                                         });
    source_ = std::make_unique<BlockSource>(store_.get(), link_.get(), link_.get(), peers_.get());
    service_ = std::make_unique<WorkerService>(source_.get(), store_.get(), sec_, stats,
                                               [this](uint64_t id) { link_->ForgetMount(id); });
    builder.RegisterService(service_.get());
    calls_.Attach(&builder, "granary.rpc.Worker");
    server_ = builder.BuildAndStart();
    if (!server_ || port == 0) return UnavailableError("cannot listen on " + cfg.worker.listen);
    auto hp = ParseHostPort(cfg.worker.listen);
    address_ = hp->host + ":" + std::to_string(port);
    std::string advertise = cfg.worker.advertise;
    if (advertise.empty()) {
      advertise = (hp->host == "0.0.0.0" || hp->host == "::" ? HostName() : hp->host) + ":" + std::to_string(port);
    }
    RETURN_IF_ERROR(StartWrites(cfg, so));
    RETURN_IF_ERROR(StartLocalSocket(cfg, port));
    link_->Start(advertise);
    spdlog::info("granary-worker listening on {} ({} cache levels, policy {}, master {})", address_,
                 so.levels.size(), CachePolicyName(so.policy), cfg.master.address);
    WarnIfServingWithoutToken(cfg.worker.listen, cfg.rpc);
    metrics_ = metrics::StartOrWarn(
        "worker.metrics_listen", cfg.worker.metrics_listen, [this](metrics::Exposition* e) { Render(e); },
        [this]() -> Status {
          if (link_->worker_id() == 0) return UnavailableError("not registered with the master yet");
          return Status::OK();
        });
    return Status::OK();
  }

  std::string metrics_address() const override { return metrics_ ? metrics_->address() : ""; }

  // Everything from Stats(), fresh, plus the latency histograms.
  void Render(metrics::Exposition* e) {
    rpc::WorkerStats s = Stats();
    auto d = [](uint64_t v) { return static_cast<double>(v); };
    e->Family("granary_worker_rpc_calls_total", "counter", "gRPC calls the worker received, by method.");
    for (const auto& [method, n] : calls_.Snapshot()) e->Sample("granary_worker_rpc_calls_total", {{"method", method}}, d(n));
    e->Family("granary_worker_block_reads_total", "counter",
              "Block reads by where the bytes came from: cache (this worker's tiers, copied), zero_copy (a leased "
              "block file handed to the local FUSE client), peer (another worker), under_storage.");
    e->Sample("granary_worker_block_reads_total", {{"source", "cache"}}, d(s.hits() - std::min(s.hits(), s.leases())));
    e->Sample("granary_worker_block_reads_total", {{"source", "zero_copy"}}, d(s.leases()));
    e->Sample("granary_worker_block_reads_total", {{"source", "peer"}}, d(s.peer_reads()));
    e->Sample("granary_worker_block_reads_total", {{"source", "under_storage"}}, d(s.ufs_reads()));
    for (const StatMetric& m : kStatMetrics) {
      if (m.gauge) {
        e->Gauge(m.metric, m.help, StatValue(s, m.field));
      } else {
        e->Counter(m.metric, m.help, StatValue(s, m.field));
      }
    }
    e->Gauge("granary_worker_ufs_latency_estimate_seconds",
             "The fetch pacer's estimate of the under-storage round trip (the shortest fetch of the last 10 s).",
             static_cast<double>(s.ufs_latency_estimate_us()) / 1e6);
    e->Gauge("granary_worker_registered", "1 once the master has registered this worker.", link_->worker_id() ? 1 : 0);
    struct TierMetric {
      const char* name;
      const char* type;
      const char* help;
      uint64_t (rpc::TierStats::*get)() const;
    };
    const TierMetric tier_metrics[] = {
        {"granary_worker_cache_capacity_bytes", "gauge", "Quota of a cache tier.", &rpc::TierStats::capacity_bytes},
        {"granary_worker_cache_used_bytes", "gauge", "Bytes cached in a tier.", &rpc::TierStats::used_bytes},
        {"granary_worker_cache_blocks", "gauge", "Blocks cached in a tier.", &rpc::TierStats::blocks},
        {"granary_worker_cache_hits_total", "counter", "Reads served from a tier.", &rpc::TierStats::hits},
        {"granary_worker_evictions_total", "counter", "Blocks evicted from a tier.", &rpc::TierStats::evictions},
        {"granary_worker_demotions_total", "counter", "Blocks moved down from a tier.", &rpc::TierStats::demotions},
        {"granary_worker_promotions_total", "counter", "Blocks moved up into a tier.", &rpc::TierStats::promotions},
    };
    for (const auto& m : tier_metrics) {
      e->Family(m.name, m.type, m.help);
      for (int i = 0; i < s.tiers_size(); ++i) {
        const auto& t = s.tiers(i);
        e->Sample(m.name, {{"tier", t.medium()}, {"level", std::to_string(i)}}, d((t.*m.get)()));
      }
    }
    for (const auto& [name, help, low] :
         {std::tuple{"granary_worker_cache_high_watermark_ratio", "A tier's high watermark (eviction starts above it).", false},
          std::tuple{"granary_worker_cache_low_watermark_ratio", "A tier's low watermark (eviction stops below it).", true}}) {
      e->Family(name, "gauge", help);
      for (int i = 0; i < s.tiers_size(); ++i) {
        const auto& t = s.tiers(i);
        e->Sample(name, {{"tier", t.medium()}, {"level", std::to_string(i)}}, low ? t.low() : t.high());
      }
    }
    e->Family("granary_worker_mount_reads_total", "counter", "Block reads per mount id, by result.");
    for (const auto& [mount, c] : s.mount_counters()) {
      e->Sample("granary_worker_mount_reads_total", {{"mount", std::to_string(mount)}, {"result", "hit"}}, d(c.hits()));
      e->Sample("granary_worker_mount_reads_total", {{"mount", std::to_string(mount)}, {"result", "miss"}},
                d(c.misses()));
    }
    e->Family("granary_worker_mount_read_sources_total", "counter",
              "Block reads per mount id by where the bytes came from: cache (this worker), peer (another worker), "
              "under_storage.");
    for (const auto& [mount, c] : s.mount_counters()) {
      const std::string m = std::to_string(mount);
      e->Sample("granary_worker_mount_read_sources_total", {{"mount", m}, {"source", "cache"}}, d(c.hits()));
      e->Sample("granary_worker_mount_read_sources_total", {{"mount", m}, {"source", "peer"}}, d(c.peer()));
      e->Sample("granary_worker_mount_read_sources_total", {{"mount", m}, {"source", "under_storage"}},
                d(c.under_storage()));
    }
    metrics::WriteProcessMetrics(e);
    e->Family("granary_worker_read_duration_seconds", "histogram",
              "Time to serve one block read (cache hit or fetch), by path: grpc (FUSE clients and peers) or local.");
    service_->read_latency().Write(e, "granary_worker_read_duration_seconds", {{"path", "grpc"}});
    if (local_) local_->read_latency().Write(e, "granary_worker_read_duration_seconds", {{"path", "local"}});
    e->Family("granary_worker_ufs_fetch_duration_seconds", "histogram",
              "Time to fetch one block from the under-storage.");
    source_->ufs_latency().Write(e, "granary_worker_ufs_fetch_duration_seconds", {});
  }

  std::string address() const override { return address_; }

  void Shutdown() override {
    if (stopped_.exchange(true)) return;
    if (writes_) {
      // Nothing is lost, but someone stopping this process should know what is still waiting.
      WriteSessions::Backlog b = writes_->backlog();
      if (b.files > 0) {
        spdlog::warn("stopping with {} file(s) ({} bytes) written with write=back not yet uploaded: they stay staged "
                     "in {} and are uploaded when a worker with this worker.staging_dir starts again",
                     b.files, b.bytes, writes_->dir());
      }
    }
    metrics_.reset();
    if (local_) local_->Stop();
    if (server_) server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
    if (link_) link_->Stop();
    server_.reset();
  }

 private:
  // worker.staging_dir: "auto" is <dir>.staging beside the first cache directory on a disk (not
  // MEM: staged files must survive a reboot), the same across restarts so they are found again.
  Status StartWrites(const Config& cfg, const StoreOptions& so) {
    std::string dir = cfg.worker.staging_dir;
    if (dir.empty() || dir == "auto") {
      std::string first;
      for (const TierLevel& l : so.levels) {
        if (l.paths.empty()) continue;
        if (first.empty()) first = l.paths[0];
        if (l.medium != "MEM") {
          first = l.paths[0];
          break;
        }
      }
      if (first.empty()) first = "/var/lib/granary/cache";
      while (first.size() > 1 && first.back() == '/') first.pop_back();
      dir = first + ".staging";
    }
    auto w = WriteSessions::Open(
        dir, link_.get(), [this](const rpc::CommitWriteRequest& c) { return link_->CommitWrite(c); },
        [this](uint64_t mount, const std::string& path, const std::string& version, uint64_t size, uint64_t block_size,
               int fd) { return source_->KeepWritten(mount, path, version, size, block_size, fd); });
    if (!w.ok()) return w.status().WithContext("worker.staging_dir");
    writes_ = std::move(w).value();
    spdlog::info("files written through writable mounts are staged in {}", writes_->dir());
    return Status::OK();
  }

  // worker.local_socket: "off", "auto" (/run/granary/worker-<port>.sock, skipped with a warning when
  // that directory cannot be made) or a path (a failure is fatal: it was asked for).
  // worker.local_socket_group: the socket 0660 to that group (and /run/granary 0750 with "auto"); an
  // unknown group is fatal (the operator asked for readers who would find no socket).
  Status StartLocalSocket(const Config& cfg, int port) {
    const std::string& setting = cfg.worker.local_socket;
    if (setting == "off" || setting.empty()) return Status::OK();
    gid_t group = static_cast<gid_t>(-1);
    const std::string& group_name = cfg.worker.local_socket_group;
    if (!group_name.empty()) {
      // A number is a gid as it is (a container's /etc/group may not know the nodes' groups).
      if (group_name.find_first_not_of("0123456789") == std::string::npos && group_name.size() <= 9) {
        group = static_cast<gid_t>(std::stoul(group_name));
      } else if (struct group* g = getgrnam(group_name.c_str()); g != nullptr) {
        group = g->gr_gid;
      } else {
        return InvalidArgumentError("worker.local_socket_group: there is no group named '" + group_name +
                                    "' here (create it: groupadd " + group_name + "; or give its gid as a number)");
      }
    }
    std::string path = setting;
    if (setting == "auto") {
      path = "/run/granary/worker-" + std::to_string(port) + ".sock";
      if (mkdir("/run/granary", 0700) != 0 && errno != EEXIST) {
        spdlog::warn("zero-copy local reads are off: cannot create /run/granary ({})", strerror(errno));
        return Status::OK();
      }
      if (group != static_cast<gid_t>(-1) &&
          (chown("/run/granary", static_cast<uid_t>(-1), group) != 0 || chmod("/run/granary", 0750) != 0)) {
        return ErrnoError(errno, "worker.local_socket_group: /run/granary");
      }
    }
    meta_ = std::make_unique<MetaProxy>(cfg, sec_);
    auto local = LocalServer::Start(path, source_.get(), writes_.get(), meta_.get(), group != static_cast<gid_t>(-1));
    if (!local.ok()) {
      if (setting != "auto") return local.status();
      spdlog::warn("zero-copy local reads are off: {}", local.status().message());
      return Status::OK();
    }
    local_ = std::move(local).value();
    if (group != static_cast<gid_t>(-1)) {
      // Bound 0600 and listening already: widened only now, to the group alone.
      if (chown(path.c_str(), static_cast<uid_t>(-1), group) != 0 || chmod(path.c_str(), 0660) != 0) {
        return ErrnoError(errno, "worker.local_socket_group: " + path);
      }
      spdlog::info("local socket {} open to the readers of group {} (gid {})", path, group_name, group);
    }
    spdlog::info("local socket for zero-copy reads: {}", local_->path());
    return Status::OK();
  }

  rpc::WorkerStats Stats() {
    rpc::WorkerStats s;
    BlockStoreStats b = store_->Stats();
    const SourceCounters& c = source_->counters();
    s.set_capacity_bytes(b.capacity);
    s.set_used_bytes(b.used);
    s.set_blocks(b.blocks);
    s.set_evictions(b.evictions);
    s.set_corrupt_blocks(b.corrupt);
    s.set_hits(c.hits);
    s.set_misses(c.misses);
    s.set_ufs_reads(c.ufs_reads);
    s.set_ufs_bytes(c.ufs_bytes);
    s.set_bytes_served(c.bytes_served);
    s.set_pinned_blocks(b.pinned_blocks);
    s.set_elastic_blocks(b.elastic_blocks);
    s.set_elastic_bytes(b.elastic_bytes);
    s.set_rejected(b.rejected);
    s.set_policy(CachePolicyName(policy_));
    s.set_peer_reads(c.peer_reads);
    s.set_peer_bytes(c.peer_bytes);
    s.set_peer_served(c.peer_served);
    s.set_peer_failovers(c.peer_failovers);
    s.set_coalesced(c.coalesced);
    s.set_peers(static_cast<uint32_t>(peers_->Size()));
    s.set_leases(b.leases);
    s.set_prefetched(c.prefetched);
    s.set_hints_freed(c.hints_freed);
    s.set_loaded_blocks(c.loaded_blocks);
    s.set_loaded_bytes(c.loaded_bytes);
    s.set_ufs_errors(c.ufs_errors);
    s.set_passthrough_leases(c.passthrough_leases);
    s.set_scrubbed_blocks(b.scrubbed);
    s.set_reads_as_written(b.reads_as_written);
    s.set_elastic_peer_bytes(c.elastic_peer_bytes);
    s.set_ahead_blocks(c.ahead_blocks);
    s.set_ahead_bytes(c.ahead_bytes);
    s.set_ahead_no_room(c.ahead_no_room);
    s.set_range_reads(c.range_reads);
    s.set_streamed(c.streamed);
    s.set_previous_home_blocks(c.previous_home_blocks);
    FetchPacer::Snapshot pace = source_->pacer().Get();
    s.set_ahead_target(pace.target);
    s.set_ahead_inflight(pace.ahead_inflight);
    s.set_demand_inflight(pace.demand_inflight);
    s.set_ufs_bandwidth_estimate(static_cast<uint64_t>(pace.bandwidth));
    s.set_ufs_latency_estimate_us(static_cast<uint64_t>(pace.latency * 1e6));
    const UfsCounters& u = link_->ufs_counters();
    s.set_ufs_retries(u.retries);
    s.set_ufs_calls(u.stats + u.lists + u.reads + u.writes);
    if (writes_) {
      WriteSessions::Backlog b = writes_->backlog();
      s.set_writeback_files(b.files);
      s.set_writeback_bytes(b.bytes);
      s.set_uploaded_files(b.uploaded);
      s.set_uploaded_bytes(b.uploaded_bytes);
      s.set_upload_failures(b.failures);
      s.set_write_sessions(static_cast<uint32_t>(b.open_sessions));
    }
    metrics::ProcessMemory mem = metrics::ReadProcessMemory();
    s.set_rss_bytes(mem.rss_bytes);
    s.set_memory_limit_bytes(mem.limit_bytes);
    for (const auto& [mount, a] : source_->AccessByMount()) {
      rpc::MountCounters& mc = (*s.mutable_mount_counters())[mount];
      mc.set_hits(a.hits);
      mc.set_misses(a.misses);
      mc.set_peer(a.peer);
      mc.set_under_storage(a.under_storage);
    }
    for (const auto& [mount, u] : b.mounts) {
      rpc::MountCounters& mc = (*s.mutable_mount_counters())[mount];
      mc.set_held_blocks(u.blocks);
      mc.set_held_bytes(u.bytes);
      mc.set_elastic_bytes(u.elastic_bytes);
      mc.set_home_blocks(u.home_blocks);
      mc.set_home_bytes(u.home_bytes);
    }
    if (local_) s.set_local_socket(local_->path());
    for (const auto& t : b.tiers) {
      rpc::TierStats* ts = s.add_tiers();
      ts->set_medium(t.medium);
      for (const auto& p : t.paths) ts->add_paths(p);
      ts->set_capacity_bytes(t.capacity);
      ts->set_used_bytes(t.used);
      ts->set_blocks(t.blocks);
      ts->set_hits(t.hits);
      ts->set_misses(t.misses);
      ts->set_evictions(t.evictions);
      ts->set_demotions(t.demotions);
      ts->set_promotions(t.promotions);
      ts->set_high(t.high);
      ts->set_low(t.low);
    }
    return s;
  }

  CachePolicy policy_ = CachePolicy::kLru;
  std::atomic<bool> stopped_{false};
  std::shared_ptr<RpcSecurity> sec_;
  std::unique_ptr<BlockStore> store_;
  std::unique_ptr<PeerSet> peers_;
  std::unique_ptr<MasterLink> link_;
  std::unique_ptr<BlockSource> source_;
  std::unique_ptr<WorkerService> service_;
  rpc::CallCounts calls_;  // before server_: outlives it
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<WriteSessions> writes_;  // before local_: its connections call it until they end
  std::unique_ptr<MetaProxy> meta_;        // likewise
  std::unique_ptr<LocalServer> local_;
  std::unique_ptr<metrics::MetricsServer> metrics_;
  std::string address_;
};

}  // namespace

StatusOr<std::unique_ptr<WorkerServer>> WorkerServer::Start(const Config& cfg) {
  auto s = std::make_unique<WorkerServerImpl>();
  RETURN_IF_ERROR(s->Init(cfg));
  return std::unique_ptr<WorkerServer>(std::move(s));
}

}  // namespace granary::worker
