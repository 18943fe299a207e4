#include "master/cache_admin.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <set>

#include "common/keys.h"
#include "common/path.h"

namespace granary::master {
namespace {

// The pinned path at, above or below `path`, or "".
std::string PinOverlapping(const std::map<std::string, std::vector<FileKey>>& pins, const std::string& path) {
  for (const auto& [p, keys] : pins) {
    if (PathWithin(path, p) || PathWithin(p, path)) return p;
  }
  return "";
}

}  // namespace

// Calls `call` on every live worker; counts the successes in *told; returns the first failure.
Status ForEachWorker(Cluster& cluster, const WorkerCalls& workers,
                     const std::function<Status(rpc::Worker::Stub&, grpc::ClientContext&)>& call, uint32_t* told) {
  Status first;
  for (const auto& [id, address] : cluster.AliveWorkers()) {
    auto holder = workers.pool->Get(address);
    grpc::ClientContext ctx;
    workers.pool->security().Prepare(&ctx, workers.timeout);
    auto stub = holder->Get();
    Status st = call(*stub, ctx);
    if (st.code() == Code::kUnavailable) holder->Note(grpc::Status(grpc::StatusCode::UNAVAILABLE, ""));
    if (st.ok()) {
      ++*told;
    } else if (first.ok()) {
      first = st.WithContext("worker " + std::to_string(id) + " at " + address);
    }
  }
  return first;
}

namespace {

// Sends one FreeBlocks to every live worker; *blocks gets the blocks they freed.
Status SendFree(Cluster& cluster, const WorkerCalls& workers, const rpc::FreeBlocksRequest& fb, uint64_t* blocks,
                uint32_t* told) {
  return ForEachWorker(
      cluster, workers,
      [&](rpc::Worker::Stub& w, grpc::ClientContext& ctx) {
        rpc::FreeBlocksResponse r;
        Status s = FromGrpc(w.FreeBlocks(&ctx, fb, &r), "FreeBlocks");
        *blocks += r.blocks();
        return s;
      },
      told);
}

}  // namespace

// Frees the cached blocks of these file versions on every live worker.
Status FreeOnWorkers(Cluster& cluster, const WorkerCalls& workers, const std::vector<FileKey>& keys, uint64_t stamp,
                     uint64_t* blocks, uint32_t* told) {
  rpc::FreeBlocksRequest fb;
  for (const auto& k : keys) fb.add_file_keys(FileKeyBytes(k));
  fb.set_stamp(stamp);
  return SendFree(cluster, workers, fb, blocks, told);
}

Status FreeMountOnWorkers(Cluster& cluster, const WorkerCalls& workers, uint64_t mount_id, uint64_t stamp,
                          uint64_t* blocks, uint32_t* told) {
  rpc::FreeBlocksRequest fb;
  fb.add_mount_ids(mount_id);
  fb.set_stamp(stamp);
  return SendFree(cluster, workers, fb, blocks, told);
}

Status CacheAdmin::Pin(const rpc::PinRequest& req, rpc::PinResponse* resp) {
  ASSIGN_OR_RETURN(std::string path, Namespace::CanonicalPath(req.path()));
  MutexLock lock(&pin_mu_);
  ASSIGN_OR_RETURN(auto pins, ns_->meta().Pins());
  rpc::SetPinsRequest sp;
  if (req.pin()) {
    std::vector<FileKey> keys;
    RETURN_IF_ERROR(ns_->ForEachFileKey(path, [&](const FileKey& k, uint64_t) { keys.push_back(k); }));
    RETURN_IF_ERROR(ns_->meta().PutPin(path, keys));
    for (const auto& k : keys) sp.add_file_keys(FileKeyBytes(k));
    resp->set_files(keys.size());
  } else {
    // Unpin removes pins recorded at or below the path; a pin above it must be removed itself.
    std::vector<std::string> gone;
    for (const auto& [p, keys] : pins) {
      if (PathWithin(p, path)) gone.push_back(p);
    }
    if (gone.empty()) {
      std::string above = PinOverlapping(pins, path);
      if (!above.empty()) {
        return FailedPreconditionError(path + " is pinned through " + above + "; unpin " + above + " instead");
      }
      return NotFoundError(path + " is not pinned (granary report lists pinned blocks per worker)");
    }
    std::set<FileKey> still;
    for (const auto& [p, keys] : pins) {
      if (std::find(gone.begin(), gone.end(), p) == gone.end()) still.insert(keys.begin(), keys.end());
    }
    uint64_t files = 0;
    for (const auto& p : gone) {
      RETURN_IF_ERROR(ns_->meta().DeletePin(p));
      for (const auto& k : pins[p]) {
        ++files;
        if (!still.count(k)) sp.add_file_keys(FileKeyBytes(k));
      }
    }
    resp->set_files(files);
  }
  sp.set_pin(req.pin());
  uint32_t told = 0;
  Status st = ForEachWorker(
      *cluster_, workers_,
      [&](rpc::Worker::Stub& w, grpc::ClientContext& ctx) {
        rpc::SetPinsResponse r;
        return FromGrpc(w.SetPins(&ctx, sp, &r), "SetPins");
      },
      &told);
  resp->set_workers(told);
  // The record is durable; a worker that missed the call gets the whole set when it registers again.
  if (!st.ok()) spdlog::warn("pin {}: {}", path, st.message());
  return Status::OK();
}

Status CacheAdmin::Free(const rpc::FreeRequest& req, rpc::FreeResponse* resp) {
  ASSIGN_OR_RETURN(std::string path, Namespace::CanonicalPath(req.path()));
  ASSIGN_OR_RETURN(auto pins, ns_->meta().Pins());
  std::string pinned = PinOverlapping(pins, path);
  if (!pinned.empty()) {
    return FailedPreconditionError(path + " overlaps the pinned path " + pinned + "; unpin it first (granary unpin " +
                                   pinned + ")");
  }
  std::vector<FileKey> keys;
  RETURN_IF_ERROR(ns_->ForEachFileKey(path, [&](const FileKey& k, uint64_t) { keys.push_back(k); }));
  resp->set_files(keys.size());
  uint64_t blocks = 0;
  uint32_t told = 0;
  ASSIGN_OR_RETURN(uint64_t stamp, ns_->NextFreeStamp());
  Status st = FreeOnWorkers(*cluster_, workers_, keys, stamp, &blocks, &told);
  resp->set_blocks(blocks);
  resp->set_workers(told);
  return st;
}

namespace {

uint64_t BlockCount(uint64_t size, uint64_t block_size) {
  return block_size == 0 ? 0 : (size + block_size - 1) / block_size;
}

// A range of one file's blocks in a residency question.
struct BlockRange {
  FileKey key;
  uint64_t first = 0;  // block indexes first .. first+count-1 of the file
  uint64_t count = 0;
};

rpc::ResidencyRequest ResidencyQuestion(const std::vector<const BlockRange*>& ranges) {
  rpc::ResidencyRequest req;
  for (const BlockRange* r : ranges) {
    rpc::ResidencyQuery* q = req.add_files();
    q->set_file_key(FileKeyBytes(r->key));
    q->set_first(r->first);
    q->set_blocks(r->count);
  }
  return req;
}

// Asks one worker `req` (made by ResidencyQuestion from `ranges`) and calls held(i, block) for
// each block it holds within range i. One answer per query, in the order asked; an answer that
// does not line up (another file, a block outside the range) is dropped.
Status AskResidency(rpc::Worker::Stub& w, grpc::ClientContext& ctx, const rpc::ResidencyRequest& req,
                    const std::vector<const BlockRange*>& ranges,
                    const std::function<void(size_t, const rpc::BlockResidency&)>& held) {
  rpc::ResidencyResponse resp;
  RETURN_IF_ERROR(FromGrpc(w.GetResidency(&ctx, req, &resp), "GetResidency"));
  for (int i = 0; i < resp.files_size(); ++i) {
    const rpc::FileResidency& fr = resp.files(i);
    size_t at = static_cast<size_t>(i);
    if (at >= ranges.size() || FileKeyBytes(ranges[at]->key) != fr.file_key()) continue;
    for (const auto& b : fr.blocks()) {
      if (b.index() < ranges[at]->first || b.index() - ranges[at]->first >= ranges[at]->count) continue;
      held(at, b);
    }
  }
  return Status::OK();
}

// A range of one file's blocks in a du walk, waiting for the workers' answer, and the entries its
// figures go to.
struct DuRange {
  BlockRange range;
  rpc::DuEntry* entries[2] = {nullptr, nullptr};
};

// Asks every live worker which blocks of `batch` it holds and adds what they hold to each range's
// entries: cached_bytes counts every block held anywhere once, replica_bytes and elastic_bytes
// every copy. A worker that cannot answer is left out (its blocks do not count), logged and
// counted in *failed (the most any batch saw); *asked gets how many were asked.
void AccountBatch(Cluster& cluster, const WorkerCalls& workers, std::vector<DuRange>* ranges, uint32_t* asked,
                  uint32_t* failed) {
  std::vector<DuRange>& batch = *ranges;
  if (batch.empty()) return;
  std::vector<const BlockRange*> asked_ranges;
  for (const auto& r : batch) asked_ranges.push_back(&r.range);
  const rpc::ResidencyRequest req = ResidencyQuestion(asked_ranges);
  // Per range: the length of each block held somewhere (0: nowhere), and the copies' bytes.
  std::vector<std::vector<uint64_t>> held(batch.size());
  for (size_t i = 0; i < batch.size(); ++i) held[i].assign(batch[i].range.count, 0);
  std::vector<uint64_t> replica(batch.size()), elastic(batch.size());
  uint32_t told = 0;
  const uint32_t alive = static_cast<uint32_t>(cluster.AliveWorkers().size());
  Status st = ForEachWorker(
      cluster, workers,
      [&](rpc::Worker::Stub& w, grpc::ClientContext& ctx) {
        return AskResidency(w, ctx, req, asked_ranges, [&](size_t at, const rpc::BlockResidency& b) {
          held[at][b.index() - batch[at].range.first] = b.length();
          (b.elastic() ? elastic[at] : replica[at]) += b.length();
        });
      },
      &told);
  if (!st.ok()) spdlog::warn("du: {} (its blocks are not counted)", st.message());
  *asked = std::max(*asked, alive);
  *failed = std::max(*failed, alive > told ? alive - told : 0);
  for (size_t i = 0; i < batch.size(); ++i) {
    uint64_t distinct = 0;
    for (uint64_t length : held[i]) distinct += length;
    for (rpc::DuEntry* e : batch[i].entries) {
      if (e == nullptr) continue;
      e->set_cached_bytes(e->cached_bytes() + distinct);
      e->set_replica_bytes(e->replica_bytes() + replica[i]);
      e->set_elastic_bytes(e->elastic_bytes() + elastic[i]);
    }
  }
  batch.clear();
}

}  // namespace

Status CacheAdmin::Du(const rpc::DuRequest& req, rpc::DuResponse* resp) {
  ASSIGN_OR_RETURN(std::string path, Namespace::CanonicalPath(req.path()));
  ASSIGN_OR_RETURN(rpc::Attr top, ns_->Resolve(path));
  ASSIGN_OR_RETURN(auto pins, ns_->meta().Pins());
  auto pinned = [&](const std::string& p) {
    for (const auto& [pin, keys] : pins) {
      if (PathWithin(p, pin)) return true;
    }
    return false;
  };
  std::map<uint64_t, std::string> uris;
  rpc::DuEntry* total = resp->mutable_total();
  total->set_path(path);
  total->set_pinned(pinned(path));
  // First path component below `path` -> totals. std::map: the entries' addresses stay put.
  std::map<std::string, rpc::DuEntry> children;
  const std::string prefix = path == "/" ? "/" : path + "/";
  // The walk asks the workers in batches of at most kBatchFiles ranges and kBatchBlocks blocks (a
  // large file in several ranges), so memory and each answer stay bounded whatever the path holds.
  constexpr size_t kBatchFiles = 4096;
  constexpr uint64_t kBatchBlocks = 100'000;
  std::vector<DuRange> batch;
  uint64_t batch_blocks = 0;
  uint32_t asked = 0, failed = 0;
  RETURN_IF_ERROR(ns_->ForEachFile(path, [&](const std::string& p, const rpc::FileInfo& f) -> Status {
    auto u = uris.find(f.mount_id());
    if (u == uris.end()) {
      ASSIGN_OR_RETURN(rpc::MountInfo m, ns_->GetMount(f.mount_id()));
      u = uris.emplace(f.mount_id(), m.uri()).first;
    }
    DuRange range;
    range.range.key = MakeFileKey(u->second, f.ufs_path(), f.version());
    range.entries[0] = total;
    if (top.type() == rpc::DIRECTORY) {
      std::string rest = p.substr(prefix.size());
      size_t slash = rest.find('/');
      std::string child = slash == std::string::npos ? "" : prefix + rest.substr(0, slash);
      rpc::DuEntry& e = children[child];
      if (e.path().empty()) {
        e.set_path(child.empty() ? prefix + "(files)" : child);
        e.set_pinned(pinned(child.empty() ? path : child));
      }
      range.entries[1] = &e;
    }
    for (rpc::DuEntry* e : range.entries) {
      if (e == nullptr) continue;
      e->set_files(e->files() + 1);
      e->set_bytes(e->bytes() + f.attr().size());
    }
    const uint64_t blocks = BlockCount(f.attr().size(), f.block_size());
    for (uint64_t first = 0; first < blocks;) {
      if (batch.size() >= kBatchFiles || batch_blocks >= kBatchBlocks) {
        AccountBatch(*cluster_, workers_, &batch, &asked, &failed);
        batch_blocks = 0;
      }
      range.range.first = first;
      range.range.count = std::min(blocks - first, kBatchBlocks - batch_blocks);
      batch.push_back(range);
      batch_blocks += range.range.count;
      first += range.range.count;
    }
    return Status::OK();
  }));
  AccountBatch(*cluster_, workers_, &batch, &asked, &failed);
  resp->set_workers(asked);
  resp->set_workers_failed(failed);
  for (auto& [k, e] : children) *resp->add_entries() = std::move(e);
  return Status::OK();
}

Status CacheAdmin::FileResidency(const rpc::FileResidencyRequest& req, rpc::FileResidencyResponse* resp) {
  if (static_cast<size_t>(req.inos_size()) > kResidencyFiles) {
    return InvalidArgumentError("asked about " + std::to_string(req.inos_size()) + " files at once; ask about at most " +
                                std::to_string(kResidencyFiles));
  }
  resp->Clear();
  // The workers asked; each may hold a copy of every block, so the answer's size is its blocks
  // times them: the budget is shared out so that the answer stays within kResidencyBlocks copies.
  std::vector<std::pair<uint64_t, std::string>> asked_workers;
  for (const auto& [id, address] : cluster_->AliveWorkers()) {
    if (req.worker().empty() || address == req.worker()) asked_workers.emplace_back(id, address);
  }
  std::map<uint64_t, std::string> uris;
  std::vector<BlockRange> ranges;
  ranges.reserve(static_cast<size_t>(req.inos_size()));
  uint64_t budget = std::max<uint64_t>(1, kResidencyBlocks / std::max<size_t>(1, asked_workers.size()));
  for (int i = 0; i < req.inos_size() && budget > 0; ++i) {
    // Not GetFile's RPC path: a question about residency is no evidence of an epoch (fetch-ahead).
    ASSIGN_OR_RETURN(rpc::FileInfo f, ns_->GetFile(req.inos(i)));
    if (f.attr().type() == rpc::DIRECTORY) {
      return InvalidArgumentError("inode " + std::to_string(req.inos(i)) + " is a directory; ask about its files");
    }
    auto u = uris.find(f.mount_id());
    if (u == uris.end()) {
      ASSIGN_OR_RETURN(rpc::MountInfo m, ns_->GetMount(f.mount_id()));
      u = uris.emplace(f.mount_id(), m.uri()).first;
    }
    const uint64_t blocks = BlockCount(f.attr().size(), f.block_size());
    BlockRange r;
    r.key = MakeFileKey(u->second, f.ufs_path(), f.version());
    r.first = i == 0 ? std::min(req.first_block(), blocks) : 0;
    r.count = std::min(blocks - r.first, budget);
    budget -= r.count;
    rpc::FileHolders* fh = resp->add_files();
    *fh->mutable_file() = std::move(f);
    fh->set_blocks(blocks);
    fh->set_first(r.first);
    fh->set_count(r.count);
    ranges.push_back(std::move(r));
  }
  std::vector<const BlockRange*> asked;
  for (const auto& r : ranges) asked.push_back(&r);
  const rpc::ResidencyRequest question = ResidencyQuestion(asked);
  // Per file: (block index, worker id) -> the copy, so the answer lists copies by block.
  std::vector<std::map<std::pair<uint64_t, uint64_t>, rpc::HeldBlock>> held(ranges.size());
  uint32_t workers = 0, failed = 0;
  for (const auto& [id, address] : asked_workers) {
    ++workers;
    auto holder = workers_.pool->Get(address);
    grpc::ClientContext ctx;
    workers_.pool->security().Prepare(&ctx, workers_.timeout);
    const uint64_t worker_id = id;
    const std::string& worker = address;
    Status st = AskResidency(*holder->Get(), ctx, question, asked, [&](size_t at, const rpc::BlockResidency& b) {
      rpc::HeldBlock h;
      h.set_worker_id(worker_id);
      h.set_worker(worker);
      *h.mutable_block() = b;
      held[at][{b.index(), worker_id}] = std::move(h);
    });
    if (!st.ok()) {
      if (st.code() == Code::kUnavailable) holder->Note(grpc::Status(grpc::StatusCode::UNAVAILABLE, ""));
      spdlog::warn("residency: worker {} at {}: {} (its blocks are not listed)", id, address, st.message());
      ++failed;
    }
  }
  for (size_t i = 0; i < held.size(); ++i) {
    for (auto& [_, h] : held[i]) *resp->mutable_files(static_cast<int>(i))->add_held() = std::move(h);
  }
  resp->set_workers(workers);
  resp->set_workers_failed(failed);
  return Status::OK();
}

}  // namespace granary::master
