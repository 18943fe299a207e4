#include "master/fetch_ahead.h"

#include <spdlog/spdlog.h>

#include <algorithm>

#include "common/path.h"
#include "common/tiers.h"
#include "common/units.h"

namespace granary::master {
namespace {

std::vector<std::string> DirComponents(const std::string& ufs_path) {
  std::vector<std::string> out;
  size_t start = 0;
  for (;;) {
    size_t slash = ufs_path.find('/', start);
    if (slash == std::string::npos) break;  // the last component is the file's name
    if (slash > start) out.push_back(ufs_path.substr(start, slash - start));
    start = slash + 1;
  }
  return out;
}

}  // namespace

FetchAhead::FetchAhead(Namespace* ns, JobManager* jobs, Options opts, Clock clock)
    : ns_(ns), jobs_(jobs), opts_(opts), clock_(std::move(clock)) {
  if (!clock_) clock_ = [] { return std::chrono::steady_clock::now(); };
}

FetchAhead::~FetchAhead() { Stop(); }

void FetchAhead::Start() {
  jobs_->SetAheadHooks([this](uint64_t id, uint64_t sent, std::string* why) { return Admit(id, sent, why); },
                       [this](const rpc::LoadJob& j) { Ended(j); });
  MutexLock lock(&mu_);
  stop_ = false;
  if (!thread_.joinable()) thread_ = std::thread([this] { Loop(); });
}

void FetchAhead::Stop() {
  {
    MutexLock lock(&mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void FetchAhead::Opened(const rpc::FileInfo& f) {
  const uint64_t id = f.mount_id();
  if (id == 0) return;
  bool known;
  {
    MutexLock lock(&mu_);
    known = MountLocked(id).known;
  }
  if (!known) {
    // Once per mount: its options (fixed when it was mounted).
    auto m = ns_->GetMount(id);
    if (!m.ok()) return;
    std::map<std::string, std::string> opts(m->options().begin(), m->options().end()), ufs;
    MountCacheOptions cache;
    bool parsed = SplitMountOptions(opts, &ufs, &cache).ok();
    MutexLock lock(&mu_);
    Mount& st = MountLocked(id);
    st.known = true;
    st.path = m->path();
    st.enabled = parsed && cache.fetch_ahead;
    st.bandwidth = cache.fetch_ahead_bandwidth;
    st.inflight = cache.fetch_ahead_inflight;
  }
  const auto now = clock_();
  bool notify = false;
  {
    MutexLock lock(&mu_);
    Mount& m = MountLocked(id);
    if (!m.enabled) return;
    if (m.evidence.files() > 0 && now - m.last_new > opts_.idle) {
      // The readers paused: what they read next is new evidence (a new epoch, another job).
      m.evidence.Reset();
      m.prior_fetched = 0;
      m.finished_scope.clear();
    }
    if (!m.evidence.Opened(f.attr().ino(), f.attr().size(), f.ufs_path())) return;
    m.last_new = now;
    notify = m.evidence.Ready();
  }
  if (notify) cv_.notify_all();
}

FetchAhead::Mount& FetchAhead::MountLocked(uint64_t id) {
  auto it = mounts_.find(id);
  if (it == mounts_.end()) it = mounts_.emplace(id, Mount(opts_)).first;
  return it->second;
}

bool ReadEvidence::Opened(uint64_t ino, uint64_t size, const std::string& ufs_path) {
  if (seen_.count(ino)) return false;
  if (seen_.size() < opts_.max_tracked) seen_.insert(ino);
  files_++;
  bytes_ += size;
  size_t slash = ufs_path.rfind('/');
  std::string parent = slash == std::string::npos ? "" : ufs_path.substr(0, slash);
  uint32_t in_dir = 0;
  if (dir_opened_.size() < opts_.max_tracked || dir_opened_.count(parent)) in_dir = ++dir_opened_[parent];
  if (in_dir == opts_.dir_files) {  // this directory counts now: the scope covers it
    std::vector<std::string> dir = DirComponents(ufs_path);
    if (!have_dir_) {
      dir_ = std::move(dir);
      have_dir_ = true;
    } else {
      size_t common = 0;
      while (common < dir_.size() && common < dir.size() && dir_[common] == dir[common]) ++common;
      dir_.resize(common);
    }
  }
  return true;
}

void ReadEvidence::Reset() {
  seen_.clear();
  dir_opened_.clear();
  files_ = bytes_ = 0;
  have_dir_ = false;
  dir_.clear();
}

std::string FetchAhead::ScopeLocked(const Mount& m) const {
  std::string scope = m.path;
  for (const auto& c : m.evidence.scope()) scope += (scope.empty() || scope.back() != '/' ? "/" : "") + c;
  return scope;
}

JobManager::AheadVerdict FetchAhead::Admit(uint64_t job, uint64_t sent, std::string* why) {
  using V = JobManager::AheadVerdict;
  MutexLock lock(&mu_);
  for (int round = 0;; ++round) {
    if (stop_ || jobs_->Cancelled(job)) {
      *why = "stopped";
      return V::kStop;
    }
    auto it = std::find_if(mounts_.begin(), mounts_.end(), [&](const auto& kv) { return kv.second.job == job; });
    if (it == mounts_.end()) {
      bool submitting = std::any_of(mounts_.begin(), mounts_.end(), [](const auto& kv) { return kv.second.job == kSubmitting; });
      if (!submitting) {
        *why = "superseded by a wider scope";
        return V::kStop;
      }
    } else {
      const Mount& m = it->second;
      const double allowed = opts_.growth * static_cast<double>(m.evidence.bytes());
      if (static_cast<double>(sent + m.prior_fetched) < allowed) return V::kGo;
      if (clock_() - m.last_new > opts_.idle) {
        *why = "the readers stopped";
        return V::kStop;
      }
    }
    if (round >= 5) return V::kWait;  // the job looks at its finished batches, then asks again
    lock.WaitFor(&cv_, std::chrono::milliseconds(20));
  }
}

void FetchAhead::Ended(const rpc::LoadJob& j) {
  MutexLock lock(&mu_);
  if (auto r = retired_.find(j.id()); r != retired_.end()) {
    // Replaced by a wider scope's job: what it fetched still counts against the allowance.
    auto m = mounts_.find(r->second);
    if (m != mounts_.end()) m->second.prior_fetched += j.bytes_fetched();
    retired_.erase(r);
  }
  for (auto& [id, m] : mounts_) {
    if (m.job != j.id()) continue;
    m.job = 0;
    m.prior_fetched += j.bytes_fetched();
    if (j.note().find("no free room") != std::string::npos || j.state() == rpc::JOB_FAILED) {
      m.paused_until = clock_() + opts_.no_room_pause;
    } else if (j.state() == rpc::JOB_SUCCEEDED && j.note().empty()) {
      m.finished_scope = m.job_scope;  // walked to its end
    }
  }
  cv_.notify_all();
}

void FetchAhead::Loop() {
  for (;;) {
    {
      MutexLock lock(&mu_);
      if (!stop_) lock.WaitFor(&cv_, std::chrono::milliseconds(500));
      if (stop_) return;
    }
    Step();
  }
}

void FetchAhead::Step() {
  struct Action {
    uint64_t mount = 0;
    uint64_t cancel = 0;
    rpc::LoadJobSpec spec;
  };
  std::vector<Action> actions;
  const auto now = clock_();
  {
    MutexLock lock(&mu_);
    for (auto& [id, m] : mounts_) {
      if (!m.enabled || !m.evidence.Ready() || now - m.last_new > opts_.idle) continue;
      std::string scope = ScopeLocked(m);
      Action a;
      a.mount = id;
      if (m.job != 0) {
        if (scope == m.job_scope) continue;
        a.cancel = m.job;  // the scope widened: one job for the wider scope replaces it
        retired_[m.job] = id;
        m.job = 0;
      }
      if (scope == m.finished_scope || now < m.paused_until) {
        if (a.cancel) actions.push_back(std::move(a));
        continue;
      }
      a.spec.add_paths(scope);
      a.spec.set_fetch_ahead(true);
      a.spec.set_bandwidth(m.bandwidth);
      a.spec.set_parallel(m.inflight);
      m.job_scope = scope;
      m.job = kSubmitting;
      actions.push_back(std::move(a));
    }
  }
  for (auto& a : actions) {
    if (a.cancel) (void)jobs_->Cancel(a.cancel);
    if (a.spec.paths().empty()) continue;
    auto job = jobs_->Submit(a.spec);
    MutexLock lock(&mu_);
    Mount& m = MountLocked(a.mount);
    if (!job.ok()) {
      spdlog::warn("fetch-ahead of {}: {}", a.spec.paths(0), job.status().message());
      m.job = 0;
      m.paused_until = now + opts_.no_room_pause;
      continue;
    }
    m.job = job->id();
    spdlog::info("fetch-ahead {}: {} ({} files opened there, {}; fetching up to {}x what readers open)", job->id(),
                 a.spec.paths(0), m.evidence.files(), FormatBytes(m.evidence.bytes()), opts_.growth);
  }
}

std::vector<FetchAhead::MountStatus> FetchAhead::Mounts() const {
  MutexLock lock(&mu_);
  std::vector<MountStatus> out;
  for (const auto& [id, m] : mounts_) {
    if (!m.known) continue;
    MountStatus s;
    s.mount_id = id;
    s.path = m.path;
    s.enabled = m.enabled;
    s.files_opened = m.evidence.files();
    s.bytes_opened = m.evidence.bytes();
    s.job = m.job == kSubmitting ? 0 : m.job;
    if (s.job != 0) s.scope = m.job_scope;
    out.push_back(std::move(s));
  }
  return out;
}

}  // namespace granary::master
