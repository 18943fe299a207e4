// LeaderElection: which of the granary-masters leads, through etcd (master/etcd.h), and when a
// leader must stop acting as one.
//
// Design note. Each master campaigns for one key (ElectionOptions::key): it grants itself a lease
// of `ttl` and, in one transaction, creates the key with its id bound to that lease if the key
// does not exist. The master whose transaction created the key leads; its *term* is the key's
// create_revision, which grows with every new leader (a later creation has a later revision), so
// whatever a leader stamps with its term can be told apart from an older leader's. A leader keeps
// its lease alive every ttl/3; a standby reads the key every 500 ms (ttl/3 if shorter: who leads)
// and campaigns when it is gone (the leader resigned, or its lease expired).
//
// Fencing. A leader cut off from etcd must stop acting as leader before anyone else can start. etcd
// ends a lease no earlier than `ttl` after the keep-alive that last renewed it reached it, which is
// after the leader sent it. So the leader counts its leadership as valid until
//     (when it sent its last keep-alive that succeeded) + ttl - margin
// (IsLeader) and steps down at that instant by its own clock, whatever etcd says or does not say;
// another master can create the key only once etcd has ended the lease, which is later. `margin`
// covers the two clocks' rates differing over one ttl and the time an action checked against
// IsLeader takes to land (a write must be checked against IsLeader and finish within the margin).
// A leader whose keep-alive is answered "expired" steps down at once. A leader whose key no longer
// holds its lease (overwritten in etcd) steps down at its next keep-alive. A key without a lease is
// no master's: the masters remove it once it has stood a whole ttl (removed sooner, a leader it
// displaced could still count itself leader beside the next one).
//
// Which master. A master that leads again must hold every write the last leader acknowledged, and
// the copy that holds them is the one furthest along (master/journal.h: a write is acknowledged once
// a standby has it). "In step with the leader" cannot be judged alone: a standby cut off from the
// leader a few seconds before it died still holds every entry it last heard of. So the candidates
// compare (ElectionOptions::standing, this master's journal position): while the key is free, each
// master that may campaign writes its standing to <key>/candidates/<id> every round (kRetry), reads
// everyone's, and campaigns only
//   - once it has watched the reports, round after round, for a poll and a second (every live
//     standby notices the free key within a poll and reports at once, give or take a slow call), and
//   - when no live candidate stands further along (ties: both campaign; etcd's transaction picks
//     one, and equal positions are the same copy).
// A report is live while its mod_revision keeps changing (a candidate rewrites it every round), or
// when it was written after this master's own first report (so in this election); one that stopped
// changing for max(3 s, ttl/3) is a master gone. A master that wins the key lists the reports once
// more before it leads: a candidate further along that reported meanwhile (it noticed late) makes
// it give the key back (once per election). Once it has led for max(3 s, ttl/3) (every candidate
// has seen the key held by then), the leader deletes the election's reports in one call. If a
// candidate further along keeps reporting yet takes no key for two ttls after the key went free,
// this master campaigns all the same (availability; logged). What this rests on: a live candidate
// reaches etcd within about a second; one cut off from etcd, or stalled longer, counts as gone.
//
// Step() does one round (campaign, keep-alive or read) and says when the next is due: tests drive it
// on a fake clock with a fake Coordinator (tests/master/election_test.cc); Start() runs it on a
// thread. Thread-safe.
#pragma once

#include <chrono>
#include <compare>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "common/status.h"
#include "common/thread_annotations.h"
#include "master/etcd.h"

namespace granary::master {

// A candidate's standing: its journal position, compared term first (master/journal.h).
struct Standing {
  uint64_t term = 0, index = 0;
  auto operator<=>(const Standing&) const = default;
  std::string ToString() const { return std::to_string(term) + "/" + std::to_string(index); }
};

struct ElectionOptions {
  std::string key = "/granary/leader";  // the key campaigned for
  std::string id;                       // this master (its address): the key's value while it leads
  std::chrono::seconds ttl{5};          // the lease: failover takes at most about this long
  std::chrono::milliseconds margin{1000};  // fencing margin (see the design note); < ttl / 3
  // Asked before campaigning for a free key: false lets this round pass (a standby whose copy is
  // behind another's leaves the election to the one ahead; master/server.cc). Empty: always.
  std::function<bool()> may_campaign;
  // This master's standing (see "Which master"), asked each round while the key is free and
  // may_campaign allows. Empty: no candidates' comparison (the first to campaign leads).
  std::function<Standing()> standing;
};

class LeaderElection {
 public:
  using Clock = std::chrono::steady_clock;
  // Called on every change of leadership of this master: leading (with its term) or not. It runs on
  // the thread that made the change, with the round's lock (step_mu_) held, so changes reach it one
  // at a time and in order; it must return quickly and must not call Step, Resign or Stop (that
  // would deadlock): master/server.cc only queues the change for its own thread.
  using OnChange = std::function<void(bool leading, int64_t term)>;

  // `coord` outlives this object. `now`: the clock (tests pass their own).
  LeaderElection(Coordinator* coord, ElectionOptions opts, OnChange on_change = nullptr,
                 std::function<Clock::time_point()> now = Clock::now);
  ~LeaderElection();  // Stop()s; a leader resigns
  LeaderElection(const LeaderElection&) = delete;
  LeaderElection& operator=(const LeaderElection&) = delete;

  // One round; returns when the next is due.
  Clock::time_point Step();
  // Runs Step on a thread until Stop.
  void Start();
  // Stops the thread; a leader resigns (its lease revoked: a standby takes over at its next round).
  void Stop();
  // A leader that cannot lead gives the key up (its lease revoked) and sits out campaigns for
  // `pause`; the thread goes on.
  void Resign(std::chrono::milliseconds pause);

  // True while this master leads and its leadership is fenced valid (see the design note).
  bool IsLeader() const;
  // This master's term while it leads (the leader key's create_revision), else 0.
  int64_t term() const;
  // The leader's id as last read (empty: none known), and whether it is this master.
  std::string leader() const;
  // When this master last became leader or a standby (for `granary report`).
  Clock::time_point since() const;
  // While etcd does not answer this master: the last error (in full, endpoint and cause) and since
  // when it has failed; "" once a call succeeds again.
  std::string etcd_error() const;
  Clock::duration etcd_failing_for() const;

 private:
  // How often a standby reads the key; how long an unmoved report stays live (election.cc).
  Clock::duration Poll() const;
  Clock::duration ReportLife() const;
  // The rounds (Step): etcd is asked with mu_ released, so IsLeader never waits for it.
  Clock::time_point Campaign(Clock::time_point now) REQUIRES(step_mu_);
  Clock::time_point KeepLeading(Clock::time_point now) REQUIRES(step_mu_);
  void StepDown(Clock::time_point now, const std::string& why) REQUIRES(step_mu_);
  // Reports this master's standing and reads the others' (see "Which master"): true when this
  // master may campaign now.
  bool StandsFirst(Clock::time_point now) REQUIRES(step_mu_);
  // Notes the reports `all` (reports_) and returns the live candidate furthest ahead of this master,
  // with its standing in *best ("" and this master's own when none is ahead).
  std::string AheadOf(const std::vector<EtcdKv>& all, Clock::time_point now, Standing* best) REQUIRES(step_mu_);
  // A failed call to etcd: noted (etcd_error) and logged as a warning when its words change, or
  // every 30 s while they do not (debug meanwhile: a dead etcd is asked four times a second).
  void EtcdFailed(const std::string& what, const Status& st) REQUIRES(step_mu_);
  // A call to etcd answered: a failure noted before is over (said once).
  void EtcdAnswered() REQUIRES(step_mu_);
  // Tells on_change_ of a change (with step_mu_ held, outside mu_: see OnChange).
  void Notify(bool leading, int64_t term) REQUIRES(step_mu_);

  Coordinator* const coord_;
  const ElectionOptions opts_;
  const OnChange on_change_;
  const std::function<Clock::time_point()> now_;

  Mutex step_mu_;  // one round at a time
  int64_t lease_ GUARDED_BY(step_mu_) = 0;  // held while leading
  Clock::time_point sit_out_until_ GUARDED_BY(step_mu_){};  // no campaign before (Resign)
  // A lease-less leader key (no master's) seen since when, by its revision (see Campaign).
  int64_t leaseless_revision_ GUARDED_BY(step_mu_) = 0;
  Clock::time_point leaseless_since_ GUARDED_BY(step_mu_){};
  // The election under way (the key free), as this master watches it: since when, when it last
  // reported, and the other candidates' reports (last mod_revision seen, when it last changed, whether it ever did).
  struct Report {
    int64_t mod_revision = 0;
    Clock::time_point changed{};
    bool moved = false;
    Standing standing;
  };
  bool watching_ GUARDED_BY(step_mu_) = false;  // watching the reports (see StandsFirst)
  Clock::time_point election_since_ GUARDED_BY(step_mu_){};  // the key first seen free (zero: held)
  bool gave_back_ GUARDED_BY(step_mu_) = false;  // this election, this master gave a won key back
  bool passing_over_ GUARDED_BY(step_mu_) = false;  // campaigning past a candidate ahead (two leases)
  Clock::time_point watch_since_ GUARDED_BY(step_mu_){};
  int64_t watch_revision_ GUARDED_BY(step_mu_) = 0;  // this master's first report's mod_revision
  std::map<std::string, Report> reports_ GUARDED_BY(step_mu_);
  std::string deferred_to_ GUARDED_BY(step_mu_);  // logged once per candidate ahead
  // While leading: when the leader deletes the election's reports (zero: done, or no reports).
  Clock::time_point tidy_at_ GUARDED_BY(step_mu_){};

  mutable Mutex mu_;
  bool leading_ GUARDED_BY(mu_) = false;
  int64_t term_ GUARDED_BY(mu_) = 0;
  Clock::time_point valid_until_ GUARDED_BY(mu_){};  // fence: leadership is void from here
  std::string leader_ GUARDED_BY(mu_);
  Clock::time_point since_ GUARDED_BY(mu_){};
  std::string etcd_error_ GUARDED_BY(mu_);
  Clock::time_point etcd_failing_since_ GUARDED_BY(mu_){};
  Clock::time_point etcd_warned_ GUARDED_BY(step_mu_){};
  std::string etcd_warned_what_ GUARDED_BY(step_mu_);  // what failed when last warned (not curl's timings)

  Mutex thread_mu_;
  std::condition_variable wake_;
  bool stop_ GUARDED_BY(thread_mu_) = false;
  std::thread thread_ GUARDED_BY(thread_mu_);
};

}  // namespace granary::master
