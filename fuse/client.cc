#include "fuse/client.h"

#include <unistd.h>

#include <algorithm>
#include <cstdint>

#include "common/backoff.h"

namespace granary::fuse {

StatusOr<std::unique_ptr<Client>> Client::Create(const Config& cfg) {
  ASSIGN_OR_RETURN(auto sec, RpcSecurity::FromConfig(cfg.rpc));
  return std::unique_ptr<Client>(new NodeClient(cfg, std::move(sec)));
}

NodeClient::NodeClient(const Config& cfg, std::shared_ptr<RpcSecurity> sec)
    : cfg_(cfg),
      sec_(std::move(sec)),
      master_(sec_, cfg_.master.address),
      worker_(sec_, cfg_.fuse.worker),
      other_stubs_(sec_) {}

grpc::Status NodeClient::CallMaster(const std::function<grpc::Status(rpc::Master::Stub&, grpc::ClientContext&)>& call) {
  // Metadata calls are idempotent: after UNAVAILABLE (the master restarting, or standby masters
  // electing a leader) they are made again — on the leader, once a standby names it — for up to
  // rpc.master_wait, so a failover costs a reader a pause, never an error.
  auto start = std::chrono::steady_clock::now();
  grpc::Status st = CallWithFailover(master_, *sec_, cfg_.rpc.timeout, cfg_.rpc.master_wait, call);
  master_latency_.Observe(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  return st;
}

StatusOr<rpc::Attr> NodeClient::Lookup(uint64_t parent, const std::string& name, rpc::FileInfo* file) {
  rpc::LookupRequest req;
  req.set_parent(parent);
  req.set_name(name);
  req.set_file(file != nullptr);
  rpc::AttrResponse resp;
  RETURN_IF_ERROR(FromGrpc(CallMaster([&](rpc::Master::Stub& m, grpc::ClientContext& ctx) { return m.Lookup(&ctx, req, &resp); }), "the master"));
  if (file != nullptr) *file = std::move(*resp.mutable_file());
  return resp.attr();
}

StatusOr<rpc::WriteTarget> NodeClient::PrepareCreate(const rpc::PrepareCreateRequest& req) {
  rpc::WriteTarget resp;
  RETURN_IF_ERROR(FromGrpc(
      CallMaster([&](rpc::Master::Stub& m, grpc::ClientContext& ctx) { return m.PrepareCreate(&ctx, req, &resp); }),
      "the master"));
  return resp;
}

StatusOr<rpc::WriteTarget> NodeClient::PrepareWrite(uint64_t ino) {
  rpc::PrepareWriteRequest req;
  req.set_ino(ino);
  rpc::WriteTarget resp;
  RETURN_IF_ERROR(FromGrpc(
      CallMaster([&](rpc::Master::Stub& m, grpc::ClientContext& ctx) { return m.PrepareWrite(&ctx, req, &resp); }),
      "the master"));
  return resp;
}

StatusOr<rpc::Attr> NodeClient::MakeDir(const rpc::MakeDirRequest& req) {
  rpc::AttrResponse resp;
  RETURN_IF_ERROR(FromGrpc(
      CallMaster([&](rpc::Master::Stub& m, grpc::ClientContext& ctx) { return m.MakeDir(&ctx, req, &resp); }),
      "the master"));
  return resp.attr();
}

Status NodeClient::Remove(const rpc::RemoveRequest& req) {
  rpc::RemoveResponse resp;
  return FromGrpc(CallMaster([&](rpc::Master::Stub& m, grpc::ClientContext& ctx) { return m.Remove(&ctx, req, &resp); }),
                  "the master");
}

Status NodeClient::Rename(const rpc::RenameRequest& req) {
  rpc::RenameResponse resp;
  return FromGrpc(CallMaster([&](rpc::Master::Stub& m, grpc::ClientContext& ctx) { return m.Rename(&ctx, req, &resp); }),
                  "the master");
}

StatusOr<rpc::Attr> NodeClient::SetAttr(const rpc::SetAttrRequest& req) {
  rpc::AttrResponse resp;
  RETURN_IF_ERROR(FromGrpc(
      CallMaster([&](rpc::Master::Stub& m, grpc::ClientContext& ctx) { return m.SetAttr(&ctx, req, &resp); }),
      "the master"));
  return resp.attr();
}

StatusOr<std::string> NodeClient::LocalSocketPath() {
  auto ch = Probe(/*now_anyway=*/true);
  if (!ch) return UnavailableError("the worker on this node has no local socket (worker.local_socket), which writes need");
  return ch->path();
}

StatusOr<rpc::Attr> NodeClient::GetAttr(uint64_t ino) {
  rpc::GetAttrRequest req;
  req.set_ino(ino);
  rpc::AttrResponse resp;
  RETURN_IF_ERROR(FromGrpc(CallMaster([&](rpc::Master::Stub& m, grpc::ClientContext& ctx) { return m.GetAttr(&ctx, req, &resp); }), "the master"));
  return resp.attr();
}

Status NodeClient::MasterAnswers() {
  rpc::ResolvePathRequest req;
  req.set_path("/");
  rpc::AttrResponse resp;
  auto timeout = std::min<std::chrono::milliseconds>(cfg_.rpc.timeout, std::chrono::seconds(2));
  return FromGrpc(CallWithFailover(master_, *sec_, timeout, std::chrono::milliseconds(0),
                                   [&](rpc::Master::Stub& m, grpc::ClientContext& ctx) {
                                     return m.ResolvePath(&ctx, req, &resp);
                                   }),
                  "the master at " + master_.address());
}

StatusOr<rpc::Attr> NodeClient::Resolve(const std::string& path) {
  rpc::ResolvePathRequest req;
  req.set_path(path);
  rpc::AttrResponse resp;
  RETURN_IF_ERROR(FromGrpc(CallMaster([&](rpc::Master::Stub& m, grpc::ClientContext& ctx) { return m.ResolvePath(&ctx, req, &resp); }), "the master at " + master_.address()));
  return resp.attr();
}

Status NodeClient::NoteOpens(const std::vector<uint64_t>& inos) {
  rpc::NoteOpensRequest req;
  req.mutable_inos()->Add(inos.begin(), inos.end());
  rpc::NoteOpensResponse resp;
  // One call to the master granary-fuse uses, and its answer not noted: a standby's "not the
  // leader" (during an election, or always when reads go to a standby) must not move the metadata
  // calls to another master.
  grpc::ClientContext ctx;
  sec_->Prepare(&ctx, std::min<std::chrono::milliseconds>(cfg_.rpc.timeout, std::chrono::seconds(2)));
  return FromGrpc(master_.Get()->NoteOpens(&ctx, req, &resp), "the master");
}

Status NodeClient::ReadDir(uint64_t ino, uint64_t after, uint32_t limit, rpc::ReadDirResponse* out, bool files) {
  rpc::ReadDirRequest req;
  req.set_ino(ino);
  req.set_after(after);
  req.set_limit(limit);
  req.set_files(files);
  return FromGrpc(CallMaster([&](rpc::Master::Stub& m, grpc::ClientContext& ctx) { return m.ReadDir(&ctx, req, out); }), "the master");
}

StatusOr<rpc::FileInfo> NodeClient::GetFile(uint64_t ino) {
  rpc::GetFileRequest req;
  req.set_ino(ino);
  rpc::FileInfo resp;
  RETURN_IF_ERROR(FromGrpc(CallMaster([&](rpc::Master::Stub& m, grpc::ClientContext& ctx) { return m.GetFile(&ctx, req, &resp); }), "the master"));
  return resp;
}

StatusOr<rpc::WorkerStats> NodeClient::WorkerStats() {
  rpc::GetStatsRequest req;
  rpc::WorkerStats resp;
  grpc::ClientContext ctx;
  sec_->Prepare(&ctx, cfg_.rpc.timeout);
  RETURN_IF_ERROR(FromGrpc(worker_.Note(worker_.Get()->GetStats(&ctx, req, &resp)), "the worker at " + cfg_.fuse.worker));
  return resp;
}

StatusOr<rpc::Report> NodeClient::GetReport() {
  rpc::Report report;
  RETURN_IF_ERROR(FromGrpc(CallMaster([&](rpc::Master::Stub& m, grpc::ClientContext& c) {
                             return m.GetReport(&c, rpc::GetReportRequest(), &report);
                           }),
                           "the master"));
  return report;
}

ReadResult::~ReadResult() {
  for (auto& p : pieces) {
    if (channel_) channel_->Release(&p);
  }
}

uint64_t ReadResult::size() const {
  uint64_t n = 0;
  for (const auto& p : pieces) n += p.length;
  return n;
}

std::string ReadResult::Flatten() const {
  std::string out;
  for (const auto& p : pieces) {
    if (p.fd < 0) {
      out.append(p.bytes(), p.length);
      continue;
    }
    std::string buf(p.length, '\0');
    if (!LocalChannel::ReadInto(p, buf.data()).ok()) buf.clear();
    out += buf;
  }
  return out;
}

NodeClient::~NodeClient() {
  {
    MutexLock lock(&prefetch_mu_);
    prefetch_stop_ = true;
  }
  prefetch_cv_.notify_all();
  if (prefetcher_.joinable()) prefetcher_.join();
}

void NodeClient::Prefetch(const rpc::FileInfo& file, uint64_t first, uint64_t count) {
  uint64_t bs = file.block_size();
  uint64_t blocks = bs == 0 ? 0 : (file.attr().size() + bs - 1) / bs;
  rpc::PrefetchRequest pr;
  for (uint64_t i = first; i < std::min(blocks, first + count); ++i) {
    rpc::ReadBlockRequest* r = pr.add_blocks();
    r->set_mount_id(file.mount_id());
    r->set_ufs_path(file.ufs_path());
    r->set_version(file.version());
    r->set_file_size(file.attr().size());
    r->set_block_size(bs);
    r->set_index(i);
  }
  if (pr.blocks_size() == 0) return;
  MutexLock lock(&prefetch_mu_);
  if (prefetch_stop_ || prefetch_queue_.size() >= 64) return;
  prefetch_queue_.emplace_back(std::chrono::steady_clock::now(), std::move(pr));
  counters_.prefetch_hints++;
  if (!prefetcher_.joinable()) prefetcher_ = std::thread([this] { PrefetchLoop(); });
  prefetch_cv_.notify_one();
}

void NodeClient::Touched(const rpc::ReadBlockRequest& req, uint64_t length) {
  MutexLock lock(&prefetch_mu_);
  if (prefetch_stop_ || touches_.blocks_size() >= kMaxTouches) return;  // a lost touch costs a fill at most
  if (touches_.blocks_size() == 0) touches_since_ = std::chrono::steady_clock::now();
  rpc::ReadBlockRequest* r = touches_.add_blocks();
  *r = req;
  r->set_length(length);
  touches_.set_touched(true);
  if (!prefetcher_.joinable()) prefetcher_ = std::thread([this] { PrefetchLoop(); });
  prefetch_cv_.notify_one();
}

void NodeClient::PrefetchLoop() {
  for (;;) {
    rpc::PrefetchRequest pr;
    std::chrono::steady_clock::time_point asked;
    {
      MutexLock lock(&prefetch_mu_);
      while (!prefetch_stop_ && prefetch_queue_.empty() && touches_.blocks_size() == 0) lock.Wait(&prefetch_cv_);
      if (prefetch_stop_) return;
      // Every touch reported so far in one request, and readahead hints, by turns: neither waits
      // behind the other.
      touch_turn_ = !touch_turn_;
      if (touches_.blocks_size() > 0 && (touch_turn_ || prefetch_queue_.empty())) {
        pr.Swap(&touches_);
        asked = touches_since_;
      } else {
        asked = prefetch_queue_.front().first;
        pr = std::move(prefetch_queue_.front().second);
        prefetch_queue_.pop_front();
      }
    }
    const auto waited = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - asked);
    pr.set_age_ms(static_cast<uint32_t>(std::clamp<int64_t>(waited.count(), 0, UINT32_MAX)));
    rpc::PrefetchResponse resp;
    grpc::ClientContext ctx;
    sec_->Prepare(&ctx, std::chrono::seconds(5));
    worker_.Note(worker_.Get()->Prefetch(&ctx, pr, &resp));  // best effort: a lost hint costs a miss
  }
}

std::shared_ptr<LocalChannel> NodeClient::Local() {
  if (!cfg_.fuse.zero_copy) return nullptr;
  return Probe(/*now=*/false);
}

std::shared_ptr<LocalChannel> NodeClient::Probe(bool now_anyway) {
  {
    MutexLock lock(&mu_);
    // Callers during a probe wait for its answer: a burst of first opens must not all miss the
    // socket (in passthrough mode a miss serves the open without a backing file).
    while (probing_) lock.Wait(&probed_);
    if (local_) return local_;
    auto now = std::chrono::steady_clock::now();
    if (!now_anyway && last_probe_ != std::chrono::steady_clock::time_point{} &&
        now - last_probe_ < std::chrono::seconds(5)) {
      return nullptr;
    }
    last_probe_ = now;
    probing_ = true;
  }
  auto stats = WorkerStats();  // outside the lock (bounded by rpc.timeout)
  MutexLock lock(&mu_);
  probing_ = false;
  probed_.notify_all();
  if (stats.ok() && !stats->local_socket().empty()) local_ = std::make_shared<LocalChannel>(stats->local_socket());
  return local_;
}

void NodeClient::DropLocal(const std::shared_ptr<LocalChannel>& ch) {
  MutexLock lock(&mu_);
  if (local_ == ch) local_.reset();
}

Status NodeClient::ReadOverGrpc(const rpc::ReadBlockRequest& req, uint64_t want, std::string* out, NodeSource* source) {
  grpc::ClientContext ctx;
  sec_->Prepare(&ctx, cfg_.rpc.timeout);
  uint32_t src = 0;  // as the worker saw it: its cache, a peer, the under-storage
  Status st = ReadBlockStream(*worker_.Get(), ctx, req, want, out, "the worker at " + cfg_.fuse.worker, nullptr, &src);
  if (st.ok() || st.code() != Code::kUnavailable || st.IsUnderStorageDown()) {
    if (st.ok()) {
      counters_.local_grpc_pieces++;
      *source = NodeSourceOf(rpc::ReadSourceFromWire(src), /*this_node=*/true);
    }
    return st;
  }
  worker_.Note(grpc::Status(grpc::StatusCode::UNAVAILABLE, ""));
  // The local worker is unreachable: any other live worker serves the block (it asks the block's
  // home, or fetches it), so the reader sees no error.
  std::vector<std::shared_ptr<StubHolder<rpc::Worker>>> others;
  auto now = std::chrono::steady_clock::now();
  bool stale;
  {
    MutexLock lock(&mu_);
    stale = others_.empty() || now - others_fetched_ > std::chrono::seconds(10);
  }
  if (stale) {  // asked outside the lock
    rpc::Report report;
    Status rs = FromGrpc(CallMaster([&](rpc::Master::Stub& m, grpc::ClientContext& c) {
                           return m.GetReport(&c, rpc::GetReportRequest(), &report);
                         }),
                         "the master");
    if (rs.ok()) {
      std::set<std::string> fresh;
      for (const auto& w : report.workers()) {
        if (w.alive() && w.address() != cfg_.fuse.worker) fresh.insert(w.address());
      }
      MutexLock lock(&mu_);
      other_stubs_.Retain(fresh);
      others_.swap(fresh);
      others_fetched_ = now;
    }
  }
  {
    MutexLock lock(&mu_);
    for (const auto& addr : others_) others.push_back(other_stubs_.Get(addr));
  }
  for (const auto& h : others) {
    grpc::ClientContext c;
    sec_->Prepare(&c, cfg_.rpc.timeout);
    out->clear();
    Status os = ReadBlockStream(*h->Get(), c, req, want, out, "the worker at " + h->address(), nullptr, &src);
    if (os.ok()) {
      counters_.failover_pieces++;
      *source = NodeSourceOf(rpc::ReadSourceFromWire(src), /*this_node=*/false);  // another node's worker
      return os;
    }
    if (os.code() != Code::kUnavailable || os.IsUnderStorageDown()) return os;
    h->Note(grpc::Status(grpc::StatusCode::UNAVAILABLE, ""));
  }
  return st;
}

Status NodeClient::Read(const rpc::FileInfo& file, uint64_t offset, uint64_t length, ReadResult* out, bool random,
                    char* scratch, bool continues) {
  const uint64_t start = offset;
  uint64_t size = file.attr().size();
  uint64_t bs = file.block_size();
  if (bs == 0) return InternalError("file has no block size");
  uint64_t end = std::min(size, offset + length);
  while (offset < end) {
    uint64_t index = offset / bs;
    uint64_t in_block = offset - index * bs;
    uint64_t want = std::min(end - offset, bs - in_block);
    rpc::ReadBlockRequest req;
    req.set_mount_id(file.mount_id());
    req.set_ufs_path(file.ufs_path());
    req.set_version(file.version());
    req.set_file_size(size);
    req.set_block_size(bs);
    req.set_index(index);
    req.set_offset(in_block);
    req.set_length(want);
    req.set_random(random);
    req.set_continues(continues && !random);
    LocalChannel::Piece piece;
    // No worker can serve it (this node's restarting, no live peer has it): wait for one, up to
    // fuse.worker_wait, instead of failing the read.
    auto deadline = std::chrono::steady_clock::now() + cfg_.fuse.worker_wait;
    Backoff pause(kWorkerWait);
    for (bool waited = false;; waited = true) {
      Status st = ReadPiece(req, want, &piece, out, scratch != nullptr ? scratch + (offset - start) : nullptr);
      if (st.ok()) {
        if (waited) counters_.worker_waits_ended++;
        break;
      }
      // A worker that answered that the under-storage is down has retried it within its own
      // bounds (retry_deadline): the reader gets the error now.
      if (st.code() != Code::kUnavailable || st.IsUnderStorageDown()) return st;
      if (std::chrono::steady_clock::now() >= deadline) {
        return st.WithContext("no worker could serve the read within fuse.worker_wait");
      }
      if (!waited) counters_.worker_waits++;
      std::this_thread::sleep_for(std::min<std::chrono::nanoseconds>(
          pause.Next(), std::max<std::chrono::nanoseconds>(deadline - std::chrono::steady_clock::now(),
                                                           std::chrono::nanoseconds(0))));
    }
    out->pieces.push_back(std::move(piece));
    offset += want;
  }
  return Status::OK();
}

Status NodeClient::ReadPiece(const rpc::ReadBlockRequest& req, uint64_t want, LocalChannel::Piece* piece, ReadResult* out,
                         char* dst) {
  if (auto ch = Local()) {
    const bool sourced = cfg_.fuse.source_reads;
    std::string key;
    if (sourced) {
      key = std::to_string(req.mount_id()) + ":" + req.version() + ":" + req.ufs_path();
      const uint64_t block_start = req.index() * req.block_size();
      const uint64_t block_length = std::min<uint64_t>(req.block_size(), req.file_size() - std::min(req.file_size(), block_start));
      const bool range_first =
          SourceReads::IsRangeFirst(req.block_size(), block_length, req.offset(), want, req.random(), req.continues());
      if (SourceReads::Grant g = source_reads_.Direct(key, req.index(), range_first); g.file) {
        *piece = LocalChannel::Piece{};
        char* to = dst;
        if (to == nullptr) {
          piece->data.resize(want);
          to = piece->data.data();
        }
        Status st = g.file->Read(block_start + req.offset(), want, to);
        if (st.ok()) {
          if (piece->data.empty()) piece->mem = to;
          piece->length = want;
          piece->source = NodeSource::kUnderStorage;
          counters_.source_reads++;
          if (g.touch) Touched(req, want);
          return Status::OK();
        }
        // Changed, renamed, deleted or failing: the worker answers, from its cache if it holds the
        // listed version's block, else with its own error (ESTALE, ENOENT), as without source reads.
        source_reads_.Forget(key);
      }
    }
    std::shared_ptr<const SourceFile> file;
    const bool ask = sourced && source_reads_.Wants(key);
    Status st = ch->Read(req, piece, ask, sourced ? &file : nullptr, dst);
    if (!st.ok() && sourced && (st.IsVersionChanged() || st.code() == Code::kNotFound)) source_reads_.Forget(key);
    if (st.ok() && sourced) {
      if ((piece->fd < 0 || piece->pipe) && piece->source == NodeSource::kUnderStorage) {
        source_reads_.FromSource(key, req.index(), std::move(file), ask);
      } else {
        source_reads_.FromWorker(key, req.index());
      }
    }
    if (st.ok()) {
      if (piece->pipe) {
        counters_.piped_pieces++;
      } else if (piece->fd >= 0) {
        counters_.zero_copy_pieces++;
      }
      if (!out->channel_) out->channel_ = ch;
      if (piece->length != want) {
        ch->Release(piece);
        return DataLossError("the worker returned " + std::to_string(piece->length) + " bytes, wanted " +
                             std::to_string(want));
      }
      return Status::OK();
    }
    if (st.code() != Code::kUnavailable || st.IsUnderStorageDown()) return st;
    DropLocal(ch);  // the worker restarted or went away: gRPC until it names its socket again
  }
  *piece = LocalChannel::Piece{};
  NodeSource source = NodeSource::kLocal;
  RETURN_IF_ERROR(ReadOverGrpc(req, want, &piece->data, &source));
  piece->length = want;
  piece->source = source;
  return Status::OK();
}

StatusOr<std::unique_ptr<FileLease>> NodeClient::LeaseFile(const rpc::FileInfo& file, bool verify) {
  uint64_t size = file.attr().size();
  if (size == 0 || file.block_size() == 0) return InvalidArgumentError("an empty file has no data file");
  auto ch = Local();
  if (!ch) return UnavailableError("no local worker socket");
  rpc::ReadBlockRequest req;
  req.set_mount_id(file.mount_id());
  req.set_ufs_path(file.ufs_path());
  req.set_version(file.version());
  req.set_file_size(size);
  req.set_block_size(file.block_size());
  req.set_index(0);
  req.set_offset(0);
  req.set_length(std::min(size, file.block_size()));
  LocalChannel::Piece piece;
  Status st = ch->LeaseFile(req, &piece, verify);
  if (st.code() == Code::kUnavailable && !st.IsUnderStorageDown()) DropLocal(ch);
  RETURN_IF_ERROR(st);
  auto lease = std::make_unique<FileLease>(ch, std::move(piece));
  if (lease->length() != size || lease->fd() < 0) return DataLossError("the worker leased a data file of the wrong size");
  return lease;
}

}  // namespace granary::fuse
