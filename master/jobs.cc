#include "master/jobs.h"

#include <fnmatch.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <future>

#include "common/keys.h"
#include "common/path.h"
#include "common/tiers.h"
#include "common/units.h"
#include "master/records.h"

namespace granary::master {
namespace {

int64_t NowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}


bool Finished(rpc::JobState s) {
  return s == rpc::JOB_SUCCEEDED || s == rpc::JOB_FAILED || s == rpc::JOB_CANCELLED;
}

// A glob with a '/' matches the whole namespace path; one without, the file name.
bool GlobMatches(const std::string& glob, const std::string& path) {
  if (glob.find('/') != std::string::npos) return fnmatch(glob.c_str(), path.c_str(), 0) == 0;
  std::string name = path.substr(path.rfind('/') + 1);
  return fnmatch(glob.c_str(), name.c_str(), FNM_PERIOD) == 0;
}

bool Selected(const rpc::LoadJobSpec& spec, const std::string& path) {
  if (!spec.include().empty() &&
      std::none_of(spec.include().begin(), spec.include().end(), [&](const auto& g) { return GlobMatches(g, path); })) {
    return false;
  }
  return std::none_of(spec.exclude().begin(), spec.exclude().end(), [&](const auto& g) { return GlobMatches(g, path); });
}

}  // namespace

// One batch of files, in walk order, and what the workers said about it.
struct JobManager::Batch {
  explicit Batch(uint64_t stamp) : free_stamp(stamp) {}
  // The free stamp before any of its files was read (Namespace::FreeStamp): a free since covers them.
  const uint64_t free_stamp;
  uint64_t end = 0;  // walk index just past its last file
  uint64_t bytes = 0;  // the size of its files
  std::vector<rpc::LoadFile> files;
  std::map<std::string, std::string> failed;  // namespace path -> reason
  uint64_t blocks_fetched = 0, bytes_fetched = 0, blocks_cached = 0, blocks_no_room = 0;
};

JobManager::JobManager(Namespace* ns, Cluster* cluster, std::shared_ptr<StubPool<rpc::Worker>> workers)
    : ns_(ns), records_(&ns->meta()), cluster_(cluster), workers_(std::move(workers)) {}

JobManager::~JobManager() { Stop(); }

Status JobManager::Start() {
  std::vector<std::pair<uint64_t, rpc::LoadJob>> loaded;
  Status parse;
  RETURN_IF_ERROR(records_->ForEachJobRecord("j", [&](const std::string& key, const std::string& value) {
    LoadJobRecord r;
    if (!r.ParseFromString(value)) {
      parse = DataLossError("job record " + std::to_string(GetBe64(key, 1)) + " does not parse");
      return;
    }
    loaded.emplace_back(GetBe64(key, 1), FromRecord(r));
  }));
  RETURN_IF_ERROR(parse);
  {
    MutexLock lock(&mu_);
    for (auto& [id, j] : loaded) {
      next_id_ = std::max(next_id_, id + 1);
      if (!Finished(j.state()) && j.spec().fetch_ahead()) {
        // A fetch-ahead follows readers that are gone now; their next reads start a new one.
        j.set_state(rpc::JOB_CANCELLED);
        j.set_note("the master restarted");
        j.set_finished_ns(NowNs());
      } else if (!Finished(j.state())) {
        if (j.state() != rpc::JOB_PENDING) j.set_resumed(j.resumed() + 1);
        queue_.push_back(id);
        spdlog::info("load job {}: resuming ({} of {} files done)", id, j.files_done(), j.files_total());
      }
      jobs_[id] = std::move(j);
    }
    stop_ = false;
  }
  for (auto& [id, j] : loaded) {
    if (j.spec().fetch_ahead() && j.state() == rpc::JOB_CANCELLED) (void)Persist(id);
  }
  runner_ = std::thread([this] { RunLoop(false); });
  ahead_runner_ = std::thread([this] { RunLoop(true); });
  return Status::OK();
}

void JobManager::Stop() {
  {
    MutexLock lock(&mu_);
    if (stop_ && !runner_.joinable()) return;
    stop_ = true;
    for (auto& [c, id] : calls_) c->TryCancel();
  }
  cv_.notify_all();
  if (runner_.joinable()) runner_.join();
  if (ahead_runner_.joinable()) ahead_runner_.join();
}

void JobManager::SetAheadHooks(AheadGate gate, AheadEnded ended) {
  MutexLock lock(&mu_);
  ahead_gate_ = std::move(gate);
  ahead_ended_ = std::move(ended);
}

StatusOr<rpc::LoadJob> JobManager::Submit(const rpc::LoadJobSpec& in) {
  rpc::LoadJobSpec spec = in;
  if (spec.paths().empty()) return InvalidArgumentError("load: name at least one path (or --from-file LIST)");
  for (auto& p : *spec.mutable_paths()) {
    auto canon = Namespace::CanonicalPath(p);
    if (!canon.ok()) return InvalidArgumentError("load: " + canon.status().message());
    auto attr = ns_->Resolve(*canon);
    if (!attr.ok()) {
      if (attr.status().code() == Code::kNotFound) {
        return NotFoundError("load: " + *canon + " does not exist in the namespace (see `granary mounts` and "
                             "`granary ls`)");
      }
      return attr.status().WithContext("load: " + *canon);
    }
    p = *canon;
  }
  for (const auto* globs : {&spec.include(), &spec.exclude()}) {
    for (const auto& g : *globs) {
      if (g.empty()) return InvalidArgumentError("load: an empty --include/--exclude glob matches nothing; drop it");
    }
  }
  const uint32_t max_parallel = spec.fetch_ahead() ? kMaxFetchAheadInflight : 64;
  if (spec.parallel() > max_parallel) {
    return InvalidArgumentError("load: --parallel " + std::to_string(spec.parallel()) + " is more than " +
                                std::to_string(max_parallel));
  }
  if (spec.fetch_ahead() && spec.metadata_only()) {
    return InvalidArgumentError("load: a fetch-ahead loads data");
  }
  if (!spec.metadata_only()) {
    size_t alive = cluster_->AliveWorkers().size();
    if (alive == 0) return UnavailableError("load: no live worker to load into (start granary-worker)");
    if (spec.replicas() > alive) {
      return InvalidArgumentError("load: --replicas " + std::to_string(spec.replicas()) + " but only " +
                                  std::to_string(alive) + " worker" + (alive == 1 ? " is" : "s are") +
                                  " alive; use --replicas " + std::to_string(alive) + " or fewer, or add workers");
    }
  }
  rpc::LoadJob job;
  uint64_t id;
  {
    MutexLock lock(&mu_);
    id = next_id_++;
  }
  job.set_id(id);
  job.set_state(rpc::JOB_PENDING);
  job.set_created_ns(NowNs());
  job.set_paths_total(spec.paths_size());
  *job.mutable_spec() = spec;
  if (spec.paths_size() > static_cast<int>(kListedPaths)) {
    job.mutable_spec()->mutable_paths()->DeleteSubrange(kListedPaths, spec.paths_size() - kListedPaths);
  }
  RETURN_IF_ERROR(records_->PutJobRecord("s" + Be64(id), ToRecord(spec).SerializeAsString()));
  {
    MutexLock lock(&mu_);
    jobs_[id] = job;
    (spec.fetch_ahead() ? ahead_queue_ : queue_).push_back(id);
  }
  RETURN_IF_ERROR(Persist(id));
  cv_.notify_all();
  return job;
}

StatusOr<rpc::LoadJob> JobManager::Get(uint64_t id) {
  MutexLock lock(&mu_);
  auto it = jobs_.find(id);
  if (it == jobs_.end()) return NotFoundError("no load job " + std::to_string(id) + " (granary jobs lists them)");
  return WithQueueLocked(it->second);
}

std::vector<rpc::LoadJob> JobManager::List() {
  MutexLock lock(&mu_);
  std::vector<rpc::LoadJob> out;
  for (auto it = jobs_.rbegin(); it != jobs_.rend(); ++it) out.push_back(WithQueueLocked(it->second));
  return out;
}

rpc::LoadJob JobManager::WithQueueLocked(const rpc::LoadJob& job) const {
  rpc::LoadJob j = job;
  if (j.state() != rpc::JOB_PENDING) return j;
  // Its queue's front runs (RunLoop); the ones between wait too.
  const std::deque<uint64_t>& queue = j.spec().fetch_ahead() ? ahead_queue_ : queue_;
  auto at = std::find(queue.begin(), queue.end(), j.id());
  if (at == queue.end() || at == queue.begin()) return j;
  j.set_waiting_behind(queue.front());
  j.set_jobs_ahead(static_cast<uint32_t>(at - queue.begin()));
  return j;
}

StatusOr<rpc::LoadJob> JobManager::Cancel(uint64_t id) {
  {
    MutexLock lock(&mu_);
    auto it = jobs_.find(id);
    if (it == jobs_.end()) return NotFoundError("no load job " + std::to_string(id) + " (granary jobs lists them)");
    if (Finished(it->second.state())) {
      return FailedPreconditionError("load job " + std::to_string(id) + " has already ended (" +
                                     rpc::JobState_Name(it->second.state()).substr(4) + ")");
    }
    cancelled_.insert(id);
    if (it->second.state() == rpc::JOB_PENDING) {
      it->second.set_state(rpc::JOB_CANCELLED);
      it->second.set_finished_ns(NowNs());
      queue_.erase(std::remove(queue_.begin(), queue_.end(), id), queue_.end());
      ahead_queue_.erase(std::remove(ahead_queue_.begin(), ahead_queue_.end(), id), ahead_queue_.end());
    }
    for (auto& [c, job] : calls_) {
      if (job == id) c->TryCancel();
    }
  }
  cv_.notify_all();
  RETURN_IF_ERROR(Persist(id));
  return Get(id);
}

size_t JobManager::CancelWithin(const std::string& path) {
  std::vector<uint64_t> ids;
  {
    MutexLock lock(&mu_);
    for (const auto& [id, j] : jobs_) {
      if (Finished(j.state())) continue;
      if (std::any_of(j.spec().paths().begin(), j.spec().paths().end(),
                      [&](const std::string& p) { return PathWithin(p, path); })) {
        ids.push_back(id);
      }
    }
  }
  size_t n = 0;
  for (uint64_t id : ids) n += Cancel(id).ok();
  return n;
}

JobManager::Totals JobManager::GetTotals() {
  MutexLock lock(&mu_);
  Totals t;
  for (const auto& [id, j] : jobs_) {
    t.by_state[j.state()]++;
    t.files_done += j.files_done();
    t.bytes_done += j.bytes_done();
    t.bytes_fetched += j.bytes_fetched();
    t.files_failed += j.files_failed();
  }
  return t;
}

bool JobManager::Cancelled(uint64_t id) {
  MutexLock lock(&mu_);
  return stop_ || cancelled_.count(id) > 0;
}

template <typename Fn>
void JobManager::Update(uint64_t id, Fn fn) {
  MutexLock lock(&mu_);
  fn(jobs_[id]);
}

Status JobManager::Persist(uint64_t id) {
  std::string value;
  {
    MutexLock lock(&mu_);
    value = ToRecord(jobs_[id]).SerializeAsString();
  }
  return records_->PutJobRecord("j" + Be64(id), value);
}

void JobManager::RunLoop(bool ahead) {
  for (;;) {
    uint64_t id;
    {
      MutexLock lock(&mu_);
      auto& queue = ahead ? ahead_queue_ : queue_;
      while (!stop_ && queue.empty()) lock.Wait(&cv_);
      if (stop_) return;
      id = queue.front();
    }
    Run(id);
    AheadEnded ended;
    rpc::LoadJob job;
    {
      MutexLock lock(&mu_);
      if (stop_) return;  // the job stays queued in RocksDB and resumes on the next start
      auto& queue = ahead ? ahead_queue_ : queue_;
      queue.erase(std::remove(queue.begin(), queue.end(), id), queue.end());
      if (ahead) {
        ended = ahead_ended_;
        job = jobs_[id];
      }
    }
    if (ended) ended(job);
  }
}

void JobManager::Run(uint64_t id) {
  rpc::LoadJobSpec spec;
  auto raw = records_->GetJobRecord("s" + Be64(id));
  Status st = raw.status();
  LoadJobSpecRecord spec_record;
  if (st.ok() && !spec_record.ParseFromString(*raw)) st = DataLossError("the job's request record does not parse");
  if (st.ok()) spec = FromRecord(spec_record);
  rpc::JobState state;
  {
    MutexLock lock(&mu_);
    auto& j = jobs_[id];
    if (j.started_ns() == 0) j.set_started_ns(NowNs());
    state = j.state();
  }
  if (st.ok() && (state == rpc::JOB_PENDING || state == rpc::JOB_SCANNING)) {
    Update(id, [](rpc::LoadJob& j) { j.set_state(rpc::JOB_SCANNING); });
    (void)Persist(id);
    st = Scan(id, spec);
    if (st.ok() && !Cancelled(id)) {
      Update(id, [&](rpc::LoadJob& j) { j.set_state(spec.metadata_only() ? rpc::JOB_SUCCEEDED : rpc::JOB_LOADING); });
      (void)Persist(id);
    }
  }
  bool loading;
  {
    MutexLock lock(&mu_);
    loading = jobs_[id].state() == rpc::JOB_LOADING;
  }
  if (st.ok() && loading && !Cancelled(id)) st = Load(id, spec);
  {
    MutexLock lock(&mu_);
    if (stop_) return;  // shutting down: leave the record as it is, to resume
    auto& j = jobs_[id];
    if (cancelled_.count(id)) {
      j.set_state(rpc::JOB_CANCELLED);
    } else if (!st.ok()) {
      j.set_state(rpc::JOB_FAILED);
      j.set_error(st.message());
    } else if (j.state() == rpc::JOB_LOADING) {
      j.set_state(j.files_failed() > 0 ? rpc::JOB_FAILED : rpc::JOB_SUCCEEDED);
    }
    j.set_finished_ns(NowNs());
    spdlog::info("{} {}: {} ({} files, {} fetched, {} failed){}{}", spec.fetch_ahead() ? "fetch-ahead" : "load job", id,
                 rpc::JobState_Name(j.state()), j.files_done(), FormatBytes(j.bytes_fetched()), j.files_failed(),
                 j.note().empty() ? "" : ": ", j.note());
  }
  (void)Persist(id);
}

Status JobManager::Scan(uint64_t id, const rpc::LoadJobSpec& spec) {
  // Bulk listing: directories inside a mount in one flat listing each; a directory above mounts
  // (the root, or a parent of mounts) covers the mounts below it.
  // A cancelled or stopping job stops its listing at the next page; a restarted master resumes it
  // from the namespace's load cursor.
  std::vector<rpc::MountInfo> mounts = ns_->ListMounts();
  LoadTreeOptions opts;
  opts.stop = [this, id] { return Cancelled(id); };
  for (const auto& p : spec.paths()) {
    if (Cancelled(id)) return Status::OK();
    ASSIGN_OR_RETURN(rpc::Attr a, ns_->Resolve(p));
    if (a.type() != rpc::DIRECTORY) continue;
    // Fetch-ahead follows readers, who have mostly listed what they read: a tree listed within
    // the sync interval is not listed again (ForEachFile below lists any directory that is not).
    if (spec.fetch_ahead()) {
      ASSIGN_OR_RETURN(bool listed, ns_->TreeListed(p));
      if (listed) continue;
    }
    auto st = ns_->LoadTree(p, opts);
    if (st.ok()) continue;
    if (st.status().code() != Code::kInvalidArgument) return st.status().WithContext("listing " + p);
    for (const auto& m : mounts) {
      bool below = m.path() != p && PathWithin(m.path(), p);
      if (below) RETURN_IF_ERROR(ns_->LoadTree(m.path(), opts).status().WithContext("listing " + m.path()));
    }
  }
  uint64_t files = 0, bytes = 0;
  for (const auto& p : spec.paths()) {
    RETURN_IF_ERROR(ns_->ForEachFile(p, [&](const std::string& path, const rpc::FileInfo& f) -> Status {
      if (Cancelled(id)) return CancelledError("cancelled");
      if (!Selected(spec, path)) return Status::OK();
      ++files;
      bytes += f.attr().size();
      if (files % 10000 == 0) Update(id, [&](rpc::LoadJob& j) { j.set_files_total(files); j.set_bytes_total(bytes); });
      return Status::OK();
    }).WithContext("walking " + p));
  }
  Update(id, [&](rpc::LoadJob& j) {
    j.set_files_total(files);
    j.set_bytes_total(bytes);
    if (spec.metadata_only()) {
      j.set_files_done(files);
      j.set_bytes_done(bytes);
    }
  });
  return Status::OK();
}

Status JobManager::Load(uint64_t id, const rpc::LoadJobSpec& spec) {
  uint64_t checkpoint;
  {
    MutexLock lock(&mu_);
    checkpoint = jobs_[id].checkpoint();
  }
  const bool ahead = spec.fetch_ahead();
  const size_t max_inflight = ahead ? kAheadInFlight : kInFlight;
  const size_t batch_files = ahead ? kAheadBatchFiles : kBatchFiles;
  const uint64_t batch_limit = ahead ? kAheadBatchBytes : kBatchBytes;
  AheadGate gate;
  {
    MutexLock lock(&mu_);
    gate = ahead_gate_;
  }
  uint64_t pending = 0, fetched = 0;  // bytes of the batches in flight; bytes fetched by those done
  std::string stop_why;  // a fetch-ahead's reason to stop ("" while it goes on)
  std::deque<std::pair<std::unique_ptr<Batch>, std::future<void>>> inflight;
  auto finish_front = [&] {
    inflight.front().second.wait();
    if (!Cancelled(id)) {
      Apply(id, *inflight.front().first);
      (void)Persist(id);
    }
    pending -= inflight.front().first->bytes;
    fetched += inflight.front().first->bytes_fetched;
    if (ahead && inflight.front().first->blocks_no_room > 0 && stop_why.empty()) {
      stop_why = "the cache has no free room (fetch-ahead never evicts)";
    }
    inflight.pop_front();
  };
  auto launch = [&](std::unique_ptr<Batch> b, uint64_t bytes) {
    while (inflight.size() >= max_inflight) finish_front();
    while (ahead && gate && stop_why.empty() && !Cancelled(id)) {
      // Batches that finished meanwhile count first (what they fetched, whether the cache is full).
      while (!inflight.empty() && stop_why.empty() &&
             inflight.front().second.wait_for(std::chrono::seconds(0)) == std::future_status::ready) {
        finish_front();
      }
      if (!stop_why.empty()) break;
      AheadVerdict v = gate(id, fetched + pending, &stop_why);
      if (v == AheadVerdict::kGo) break;
      if (v == AheadVerdict::kStop && stop_why.empty()) stop_why = "stopped";
    }
    if (!stop_why.empty() || Cancelled(id)) return false;
    b->bytes = bytes;
    pending += bytes;
    Batch* raw = b.get();
    inflight.emplace_back(std::move(b), std::async(std::launch::async, [this, id, &spec, raw] {
                            RunBatch(id, spec, raw);
                          }));
    return true;
  };
  auto batch = std::make_unique<Batch>(ns_->FreeStamp());
  uint64_t batch_bytes = 0, index = 0;
  for (const auto& p : spec.paths()) {
    if (!stop_why.empty()) break;
    Status st = ns_->ForEachFile(p, [&](const std::string& path, const rpc::FileInfo& f) -> Status {
      if (Cancelled(id)) return CancelledError("cancelled");
      if (!stop_why.empty()) return CancelledError(stop_why);
      if (!Selected(spec, path)) return Status::OK();
      if (index++ < checkpoint) return Status::OK();  // done before a restart
      rpc::LoadFile lf;
      lf.set_mount_id(f.mount_id());
      lf.set_ufs_path(f.ufs_path());
      lf.set_version(f.version());
      lf.set_size(f.attr().size());
      lf.set_block_size(f.block_size());
      lf.set_path(path);
      batch_bytes += f.attr().size();
      batch->files.push_back(std::move(lf));
      batch->end = index;
      if (batch->files.size() >= batch_files || batch_bytes >= batch_limit) {
        if (!launch(std::move(batch), batch_bytes)) return CancelledError(stop_why);
        batch = std::make_unique<Batch>(ns_->FreeStamp());
        batch_bytes = 0;
      }
      return Status::OK();
    });
    if (!st.ok()) {
      while (!inflight.empty()) finish_front();
      if (Cancelled(id) || !stop_why.empty()) break;
      return st.WithContext("walking " + p);
    }
  }
  if (batch && !batch->files.empty() && stop_why.empty() && !Cancelled(id)) launch(std::move(batch), batch_bytes);
  while (!inflight.empty()) finish_front();
  if (!stop_why.empty()) Update(id, [&](rpc::LoadJob& j) { j.set_note(stop_why); });
  return Status::OK();
}

void JobManager::RunBatch(uint64_t id, const rpc::LoadJobSpec& spec, Batch* b) {
  std::set<uint64_t> excluded;  // workers that failed this batch
  std::set<std::string> pending_paths;
  for (const auto& f : b->files) pending_paths.insert(f.path());
  Status last = UnavailableError("no live worker");
  for (int attempt = 0; attempt < kBatchAttempts && !Cancelled(id); ++attempt) {
    std::vector<std::pair<uint64_t, std::string>> workers;
    for (auto& w : cluster_->AliveWorkers()) {
      if (!excluded.count(w.first)) workers.push_back(w);
    }
    // After a master restart the workers come back with their next heartbeat: wait for them.
    for (auto deadline = std::chrono::steady_clock::now() + kWaitForWorkers;
         workers.empty() && std::chrono::steady_clock::now() < deadline && !Cancelled(id);) {
      {
        MutexLock lock(&mu_);
        if (!stop_ && cancelled_.count(id) == 0) lock.WaitFor(&cv_, std::chrono::milliseconds(250));
      }
      for (auto& w : cluster_->AliveWorkers()) {
        if (!excluded.count(w.first)) workers.push_back(w);
      }
    }
    if (workers.empty()) {
      last = UnavailableError("no live worker to load into for " + std::to_string(kWaitForWorkers.count()) + " s");
      break;
    }
    rpc::LoadBlocksRequest req;
    req.set_job_id(id);
    req.set_replicas(spec.replicas());
    req.set_parallel(spec.parallel() ? spec.parallel() : (spec.fetch_ahead() ? 0 : kDefaultParallel));
    req.set_fetch_ahead(spec.fetch_ahead());
    req.set_free_stamp(b->free_stamp);
    req.set_bandwidth(spec.bandwidth() / workers.size());
    if (spec.bandwidth() > 0 && req.bandwidth() == 0) req.set_bandwidth(1);
    for (const auto& [wid, addr] : workers) {
      auto* pi = req.add_workers();
      pi->set_id(wid);
      pi->set_address(addr);
    }
    for (const auto& f : b->files) *req.add_files() = f;
    struct Call {
      grpc::ClientContext ctx;
      rpc::LoadBlocksResponse resp;
      grpc::Status status;
    };
    std::vector<std::unique_ptr<Call>> calls;
    std::vector<std::thread> threads;
    for (const auto& [wid, addr] : workers) {
      auto c = std::make_unique<Call>();
      workers_->security().Prepare(&c->ctx, std::chrono::milliseconds(0));
      {
        MutexLock lock(&mu_);
        calls_.emplace(&c->ctx, id);
        if (stop_ || cancelled_.count(id)) c->ctx.TryCancel();
      }
      rpc::LoadBlocksRequest mine = req;
      mine.set_worker_id(wid);
      auto stub = workers_->Get(addr);
      Call* raw = c.get();
      threads.emplace_back([stub, raw, mine = std::move(mine)] {
        raw->status = stub->Note(stub->Get()->LoadBlocks(&raw->ctx, mine, &raw->resp));
      });
      calls.push_back(std::move(c));
    }
    for (auto& t : threads) t.join();
    {
      MutexLock lock(&mu_);
      for (auto& c : calls) calls_.erase(&c->ctx);
    }
    bool retry = false;
    std::map<std::string, std::string> failed;
    for (size_t i = 0; i < calls.size(); ++i) {
      const Call& c = *calls[i];
      if (!c.status.ok()) {
        Status s = FromGrpc(c.status, "worker " + workers[i].second);
        if (s.IsRetryable() || c.status.error_code() == grpc::StatusCode::CANCELLED) {
          spdlog::warn("load job {}: {}; the batch goes to the other workers", id, s.message());
          excluded.insert(workers[i].first);
          retry = true;
          last = s;
        } else {
          for (const auto& f : b->files) failed.emplace(f.path(), s.message());
        }
        continue;
      }
      b->blocks_fetched += c.resp.blocks_fetched();
      b->bytes_fetched += c.resp.bytes_fetched();
      b->blocks_cached += c.resp.blocks_cached();
      b->blocks_no_room += c.resp.blocks_no_room();
      for (const auto& f : c.resp.failures()) failed.emplace(f.path(), f.reason());
    }
    if (!retry || Cancelled(id)) {
      b->failed = std::move(failed);
      return;
    }
    // Idempotent: the next attempt skips what this one cached.
  }
  for (const auto& p : pending_paths) b->failed.emplace(p, last.message());
}

void JobManager::Apply(uint64_t id, const Batch& b) {
  Update(id, [&](rpc::LoadJob& j) {
    for (const auto& f : b.files) {
      auto it = b.failed.find(f.path());
      if (it == b.failed.end()) {
        j.set_files_done(j.files_done() + 1);
        j.set_bytes_done(j.bytes_done() + f.size());
        continue;
      }
      j.set_files_failed(j.files_failed() + 1);
      if (static_cast<size_t>(j.failures_size()) < kMaxFailures) {
        auto* lf = j.add_failures();
        lf->set_path(it->first);
        lf->set_reason(it->second);
      }
    }
    j.set_blocks_fetched(j.blocks_fetched() + b.blocks_fetched);
    j.set_bytes_fetched(j.bytes_fetched() + b.bytes_fetched);
    j.set_blocks_cached(j.blocks_cached() + b.blocks_cached);
    j.set_checkpoint(b.end);
  });
}

}  // namespace granary::master
