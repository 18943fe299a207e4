#include "master/election.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <charconv>
#include <optional>

namespace granary::master {
namespace {

// A failed call to etcd is tried again after this long (bounded by the fence while leading).
constexpr std::chrono::milliseconds kRetry{250};
// How often a standby reads the leader key (ttl/3 when that is shorter): how soon it notices that
// the key is free.
constexpr std::chrono::milliseconds kStandbyPoll{500};
// A candidate's report that has not moved for this long (or ttl/3 if longer) is a master gone: a
// live one rewrites it every round, and a round's three calls to etcd may each wait out a slow
// endpoint (about 1 s) and still succeed.
constexpr std::chrono::milliseconds kReportLife{3000};
// How long a candidate watches the reports before it may campaign, beyond a poll: a live standby
// notices the free key within a poll and reports at once, give or take a slow call to etcd.
constexpr std::chrono::milliseconds kSettle{1000};

// "term/index" as Standing::ToString writes it; nullopt for anything else.
std::optional<Standing> ParseStanding(const std::string& v) {
  Standing s;
  const char* end = v.data() + v.size();
  auto [p, ec] = std::from_chars(v.data(), end, s.term);
  if (ec != std::errc() || p == end || *p != '/') return std::nullopt;
  auto [q, ec2] = std::from_chars(p + 1, end, s.index);
  if (ec2 != std::errc() || q != end) return std::nullopt;
  return s;
}

}  // namespace

LeaderElection::LeaderElection(Coordinator* coord, ElectionOptions opts, OnChange on_change,
                               std::function<Clock::time_point()> now)
    : coord_(coord), opts_(std::move(opts)), on_change_(std::move(on_change)), now_(std::move(now)) {
  MutexLock lock(&mu_);
  since_ = now_();
}

LeaderElection::~LeaderElection() { Stop(); }

bool LeaderElection::IsLeader() const {
  MutexLock lock(&mu_);
  return leading_ && now_() < valid_until_;
}

int64_t LeaderElection::term() const {
  MutexLock lock(&mu_);
  return leading_ ? term_ : 0;
}

std::string LeaderElection::leader() const {
  MutexLock lock(&mu_);
  return leader_;
}

std::string LeaderElection::etcd_error() const {
  MutexLock lock(&mu_);
  return etcd_error_;
}

LeaderElection::Clock::duration LeaderElection::etcd_failing_for() const {
  MutexLock lock(&mu_);
  return etcd_error_.empty() ? Clock::duration::zero() : now_() - etcd_failing_since_;
}

void LeaderElection::EtcdFailed(const std::string& what, const Status& st) {
  const Clock::time_point now = now_();
  const std::string words = what + ": " + st.message();
  {
    MutexLock lock(&mu_);
    if (etcd_error_.empty()) etcd_failing_since_ = now;
    etcd_error_ = words;
  }
  // The same step failing the same way is said again only every 30 s (curl's words carry timings).
  const std::string key = what + "/" + std::to_string(static_cast<int>(st.code()));
  if (key != etcd_warned_what_ || now - etcd_warned_ >= std::chrono::seconds(30)) {
    etcd_warned_ = now;
    etcd_warned_what_ = key;
    spdlog::warn("leader election: {}", words);
  } else {
    spdlog::debug("leader election: {}", words);
  }
}

void LeaderElection::EtcdAnswered() {
  Clock::duration failed;
  {
    MutexLock lock(&mu_);
    if (etcd_error_.empty()) return;
    failed = now_() - etcd_failing_since_;
    etcd_error_.clear();
  }
  etcd_warned_ = {};
  etcd_warned_what_.clear();
  spdlog::info("leader election: etcd answers again (after {:.1f} s without)",
               std::chrono::duration<double>(failed).count());
}

LeaderElection::Clock::time_point LeaderElection::since() const {
  MutexLock lock(&mu_);
  return since_;
}

void LeaderElection::Notify(bool leading, int64_t term) {
  if (on_change_) on_change_(leading, term);
}

LeaderElection::Clock::time_point LeaderElection::Step() {
  MutexLock step(&step_mu_);
  const Clock::time_point now = now_();
  bool leading;
  {
    MutexLock lock(&mu_);
    leading = leading_;
  }
  return leading ? KeepLeading(now) : Campaign(now);
}

LeaderElection::Clock::duration LeaderElection::Poll() const {
  return std::min<Clock::duration>(std::chrono::duration_cast<Clock::duration>(opts_.ttl) / 3, kStandbyPoll);
}

LeaderElection::Clock::duration LeaderElection::ReportLife() const {
  return std::max<Clock::duration>(std::chrono::duration_cast<Clock::duration>(opts_.ttl) / 3, kReportLife);
}

LeaderElection::Clock::time_point LeaderElection::Campaign(Clock::time_point now) {
  const Clock::duration poll = Poll();
  StatusOr<std::optional<EtcdKv>> held = coord_->Get(opts_.key);
  if (!held.ok()) {
    EtcdFailed("cannot read " + opts_.key + " from etcd", held.status());
    return now + kRetry;
  }
  EtcdAnswered();
  if (held->has_value() && (*held)->lease == 0) {
    // No master's: a master's key always carries its lease (so that etcd ends it with the master).
    // One without would stop every election for good; whoever wrote it can write to etcd, which
    // only the masters should (docs/security.md). It is removed (unless it changed meanwhile) once
    // it has stood a whole lease: a leader whose key it overwrote has by then seen that and stepped
    // down, or its fence has run out (removed at once, another master could lead beside it).
    if ((*held)->mod_revision != leaseless_revision_) {
      leaseless_revision_ = (*held)->mod_revision;
      leaseless_since_ = now;
      spdlog::warn("leader election: {} holds '{}' with no lease: no master wrote it; it is removed if it is "
                   "still there in {} ms",
                   opts_.key, (*held)->value.substr(0, 256), opts_.ttl.count() * 1000);
    }
    {
      MutexLock lock(&mu_);
      leader_.clear();
    }
    if (now - leaseless_since_ < std::chrono::duration_cast<Clock::duration>(opts_.ttl)) {
      return std::min(leaseless_since_ + std::chrono::duration_cast<Clock::duration>(opts_.ttl), now + poll);
    }
    Status st = coord_->DeleteIfUnchanged(opts_.key, (*held)->mod_revision);
    if (!st.ok()) {
      EtcdFailed("cannot remove the lease-less " + opts_.key, st);
    } else {
      spdlog::warn("leader election: {} removed the lease-less '{}' from {}", opts_.id, (*held)->value.substr(0, 256),
                   opts_.key);
    }
    return now + kRetry;
  }
  if (held->has_value()) {  // someone leads (or a lease not yet expired still holds the key)
    watching_ = false;  // the next free key is another election
    election_since_ = {};
    gave_back_ = false;
    MutexLock lock(&mu_);
    leader_ = (*held)->value;
    return now + poll;
  }
  {
    MutexLock lock(&mu_);
    leader_.clear();  // the key is gone: nobody leads
  }
  if (election_since_ == Clock::time_point{}) election_since_ = now;
  if (now < sit_out_until_) {
    watching_ = false;
    return std::min(sit_out_until_, now + poll);
  }
  if (opts_.may_campaign && !opts_.may_campaign()) {
    watching_ = false;
    return now + kRetry;
  }
  if (opts_.standing && !StandsFirst(now)) return now + kRetry;
  // The lease's ttl runs from when etcd granted it, which is after this instant: the fence counts
  // from here.
  const Clock::time_point sent = now_();
  StatusOr<int64_t> lease = coord_->Grant(opts_.ttl);
  if (!lease.ok()) {
    EtcdFailed("cannot get a lease from etcd", lease.status());
    return now + kRetry;
  }
  StatusOr<EtcdKv> kv = coord_->CreateIfAbsent(opts_.key, opts_.id, *lease);
  if (!kv.ok() || kv->lease != *lease) {
    coord_->Revoke(*lease).IgnoreError();  // unused; it would expire by itself anyway
    if (!kv.ok()) {
      EtcdFailed("campaign for " + opts_.key + " failed", kv.status());
      return now + kRetry;
    }
    MutexLock lock(&mu_);
    leader_ = kv->value;
    return now + poll;
  }
  if (opts_.standing && !passing_over_ && !gave_back_) {
    // A candidate further along that reported after this one decided (it noticed the free key
    // late): it leads instead. Checked before anything is written in this term.
    StatusOr<std::vector<EtcdKv>> all = coord_->List(opts_.key + "/candidates/");
    Standing best;
    const std::string ahead = all.ok() ? AheadOf(*all, now_(), &best) : std::string();
    if (!ahead.empty()) {
      // Once per election: if the lead comes back to this master, it keeps it (a candidate that
      // reports but does not lead must not make the key go round forever).
      gave_back_ = true;
      coord_->Revoke(*lease).IgnoreError();
      sit_out_until_ = now_() + ReportLife();
      spdlog::info("leader election: {} gives the lead it just took to {}, whose journal is further along ({}, this "
                   "one's at {})",
                   opts_.id, ahead, best.ToString(), opts_.standing().ToString());
      return now_() + kRetry;
    }
  }
  lease_ = *lease;
  if (opts_.standing) tidy_at_ = now + ReportLife();
  {
    MutexLock lock(&mu_);
    leading_ = true;
    term_ = kv->create_revision;
    valid_until_ = sent + std::chrono::duration_cast<Clock::duration>(opts_.ttl) - opts_.margin;
    leader_ = opts_.id;
    since_ = now;
  }
  spdlog::info("leader election: {} leads (term {})", opts_.id, kv->create_revision);
  Notify(true, kv->create_revision);
  return sent + std::chrono::duration_cast<Clock::duration>(opts_.ttl) / 3;  // the first keep-alive
}

std::string LeaderElection::AheadOf(const std::vector<EtcdKv>& all, Clock::time_point now, Standing* best) {
  const std::string prefix = opts_.key + "/candidates/";
  const Clock::duration life = ReportLife();
  const Standing mine = opts_.standing();
  *best = mine;
  if (watch_revision_ == 0) {
    for (const EtcdKv& kv : all) {
      if (kv.key == prefix + opts_.id) watch_revision_ = kv.mod_revision;
    }
  }
  std::string ahead;
  for (const EtcdKv& kv : all) {
    const std::string id = kv.key.substr(std::min(prefix.size(), kv.key.size()));
    if (id == opts_.id) continue;
    std::optional<Standing> st = ParseStanding(kv.value);
    if (!st) continue;  // not a report (nothing of ours writes other values here)
    auto [it, first] = reports_.try_emplace(id);
    Report& r = it->second;
    if (first) {
      r.mod_revision = kv.mod_revision;
      r.changed = now;
      // Written after this master's first report, so after the key was free: this election's.
      r.moved = watch_revision_ != 0 && kv.mod_revision > watch_revision_;
    } else if (kv.mod_revision != r.mod_revision) {
      r.mod_revision = kv.mod_revision;
      r.changed = now;
      r.moved = true;
    }
    r.standing = *st;
    const bool live = r.moved && now - r.changed <= life;
    if (live && r.standing > *best) {
      *best = r.standing;
      ahead = id;
    }
  }
  return ahead;
}

bool LeaderElection::StandsFirst(Clock::time_point now) {
  const Clock::duration poll = Poll();
  // A round that could not stand (not allowed to campaign, sitting out) or found the key held ends
  // the watch: the others' reports must be seen moving anew. A failed call to etcd does not: what
  // was seen stays true, and a slow etcd must not restart every watch.
  if (!watching_) {
    watch_since_ = now;
    watch_revision_ = 0;
    reports_.clear();
    deferred_to_.clear();
  }
  const Standing mine = opts_.standing();
  const std::string prefix = opts_.key + "/candidates/";
  Status put = coord_->Put(prefix + opts_.id, mine.ToString());
  if (!put.ok()) {
    EtcdFailed("cannot report this master's journal position to etcd", put);
    return false;
  }
  watching_ = true;
  StatusOr<std::vector<EtcdKv>> all = coord_->List(prefix);
  if (!all.ok()) {
    EtcdFailed("cannot read the candidates' journal positions from etcd", all.status());
    return false;
  }
  Standing best;
  const std::string ahead = AheadOf(*all, now, &best);
  passing_over_ = false;
  if (!ahead.empty()) {
    if (now - election_since_ >= 2 * std::chrono::duration_cast<Clock::duration>(opts_.ttl)) {
      passing_over_ = true;  // the check after winning must not give the key back to it
      spdlog::warn("leader election: {} campaigns although {} is further along (journal at {}, this one's at {}): "
                   "it has not taken the lead in two leases",
                   opts_.id, ahead, best.ToString(), mine.ToString());
      return true;
    }
    if (deferred_to_ != ahead) {
      spdlog::info("leader election: {} leaves the lead to {}, whose journal is further along ({}, this one's at {})",
                   opts_.id, ahead, best.ToString(), mine.ToString());
      deferred_to_ = ahead;
    }
    return false;
  }
  return now - watch_since_ >= poll + kSettle;
}

LeaderElection::Clock::time_point LeaderElection::KeepLeading(Clock::time_point now) {
  Clock::time_point valid_until;
  {
    MutexLock lock(&mu_);
    valid_until = valid_until_;
  }
  if (now >= valid_until) {
    StepDown(now, "its lease could not be kept alive in time");
    return now;
  }
  const Clock::time_point sent = now;
  StatusOr<int64_t> ttl = coord_->KeepAlive(lease_);
  if (ttl.ok() || ttl.status().code() == Code::kNotFound) EtcdAnswered();
  if (ttl.ok()) {
    // The key must still be this lease's: one overwritten or deleted under a live lease (by hand, or
    // by whoever can write to etcd) names another leader to the standbys, and two masters must never
    // both count themselves leader. The fence moves only once the key is read back as this lease's:
    // a lease kept alive under a key that cannot be read would otherwise keep a displaced leader
    // leading past the ttl after which the others remove a lease-less key and elect.
    StatusOr<std::optional<EtcdKv>> held = coord_->Get(opts_.key);
    if (held.ok() && (!held->has_value() || (*held)->lease != lease_ || (*held)->value != opts_.id)) {
      const std::string other = held->has_value() ? (*held)->value : std::string("nobody");
      StepDown(now_(), "the leader key in etcd no longer holds this master's lease (it names " +
                           other.substr(0, 256) + ")");
      return now_() + kRetry;
    }
    if (held.ok()) {
      MutexLock lock(&mu_);
      valid_until_ = sent + std::chrono::duration_cast<Clock::duration>(opts_.ttl) - opts_.margin;
    }
    if (tidy_at_ != Clock::time_point{} && now >= tidy_at_) {
      // The election's reports have done their work (every candidate has seen the key held); one
      // call, just after a keep-alive, so the fence has all its time left. A failure: next round.
      Status st = coord_->DeletePrefix(opts_.key + "/candidates/");
      if (st.ok()) {
        tidy_at_ = {};
      } else {
        spdlog::debug("leader election: cannot delete the candidates' reports yet: {}", st.ToString());
      }
    }
    return sent + std::chrono::duration_cast<Clock::duration>(opts_.ttl) / 3;
  }
  if (ttl.status().code() == Code::kNotFound) {
    StepDown(now_(), "its lease expired in etcd");
    return now_();
  }
  EtcdFailed("cannot keep the lease alive", ttl.status());
  return std::min(now_() + kRetry, valid_until);
}

void LeaderElection::StepDown(Clock::time_point now, const std::string& why) {
  lease_ = 0;  // not kept alive any more; etcd ends it
  tidy_at_ = {};  // another election may be under way: its reports are not this master's to delete
  {
    MutexLock lock(&mu_);
    if (!leading_) return;
    leading_ = false;
    term_ = 0;
    leader_.clear();
    since_ = now;
  }
  spdlog::warn("leader election: {} steps down: {}", opts_.id, why);
  Notify(false, 0);
}

void LeaderElection::Resign(std::chrono::milliseconds pause) {
  MutexLock step(&step_mu_);
  if (lease_ == 0) return;
  coord_->Revoke(lease_).IgnoreError();
  sit_out_until_ = now_() + pause;
  StepDown(now_(), "it resigned");
}

void LeaderElection::Start() {
  MutexLock lock(&thread_mu_);
  if (thread_.joinable()) return;
  stop_ = false;
  thread_ = std::thread([this] {
    for (;;) {
      const Clock::time_point next = Step();
      MutexLock l(&thread_mu_);
      while (!stop_ && Clock::now() < next && l.WaitUntil(&wake_, next)) {
      }
      if (stop_) return;
    }
  });
}

void LeaderElection::Stop() {
  std::thread t;
  {
    MutexLock lock(&thread_mu_);
    stop_ = true;
    t = std::move(thread_);
  }
  wake_.notify_all();
  if (t.joinable()) t.join();
  MutexLock step(&step_mu_);
  if (lease_ != 0) {
    // Resign: the key goes with the lease, and a standby leads at its next round.
    coord_->Revoke(lease_).IgnoreError();
    StepDown(now_(), "it is stopping");
  }
}

}  // namespace granary::master
