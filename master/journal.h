// Journal: every write to the master's RocksDB as a numbered log entry, so standby masters keep an
// exact copy of the namespace (same inode numbers, mounts, jobs, cursors, pins) and one of them can
// lead without a reader noticing.
//
// Design note. A log position is (term, index): `index` counts the entries ever committed, `term`
// is the leader's term (master/election.h) when the entry was committed. Each entry is one RocksDB
// WriteBatch; Commit adds the key `Z/pos` = be64(term) be64(index) to the batch before writing it,
// so the database and its position change in one atomic write, on the leader as on every standby
// that applies the same bytes (Apply). A standby's database is therefore, at every instant, exactly
// the leader's database as of some index.
//
// Which standby is a prefix of which leader: a leader writes one empty entry when its term begins
// (BeginTerm), and entries are applied strictly in order from one leader at a time. So two
// databases whose entries at index i carry the same term hold the same entries up to i (the log
// matching property of Raft, here without Raft: terms come from etcd and only one leader commits
// at a time, see the fence in election.h). Read(from) checks the follower's (term, index) against
// its own entry at that index; anything it cannot vouch for — a follower ahead of it (a deposed
// leader's writes nobody got), an entry of another term, or an index older than the entries it
// keeps — makes the follower take a snapshot (the whole database at one position) instead.
//
// Entries are kept in memory, up to `keep_bytes` (master.replication_log): a standby that falls
// further behind, or a master that restarted, copies a snapshot. A standby keeps the entries it
// applies too, so once it leads, the other standbys follow it without a snapshot.
//
// Semi-synchronous commits. While at least one follower is in sync, a write is acknowledged to its
// client only once one of them has acknowledged the entry (Acked), or after `sync_timeout`, when
// the followers that did not acknowledge drop out of sync (and join again when they catch up).
// Group commit: Commit only appends (under the caller's locks, the namespace's among them) and
// notes the entry as owed by the calling thread; WaitReplicated, called once those locks are
// released (MasterService, before every answer), waits for the follower. So calls that do not
// depend on a write never queue behind its acknowledgement, and writers waiting at once are
// acknowledged together. So a write acknowledged to a
// client is on a standby's disk unless every standby was behind or gone; the candidates compare
// their positions before one campaigns (master/election.h, "Which master"), so the copy furthest
// along wins the election. The bound is in docs/semantics.md.
//
// Thread-safe. Commit serialises writers (index order is write order).
#pragma once

#include <rocksdb/db.h>
#include <rocksdb/write_batch.h>

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "common/status.h"
#include "common/thread_annotations.h"

namespace granary::master {

// A RocksDB status as ours, by its code (never its text): NotFound -> NOT_FOUND, Corruption ->
// DATA_LOSS, NoSpace -> RESOURCE_EXHAUSTED, Busy / TimedOut / TryAgain / IOError -> UNAVAILABLE,
// anything else -> INTERNAL; `what` says what was being done.
Status FromRocks(const rocksdb::Status& s, const std::string& what);

// The key of the position in every master's database.
inline constexpr char kJournalPositionKey[] = "Z/pos";
// Present while a standby installs a snapshot (a partial copy): such a copy never leads. Never in
// a snapshot (a leader's copy is whole).
inline constexpr char kJournalInstallingKey[] = "Z/installing";

struct LogPosition {
  uint64_t term = 0;
  uint64_t index = 0;
  bool operator==(const LogPosition& o) const { return term == o.term && index == o.index; }
  std::string ToString() const { return std::to_string(term) + "/" + std::to_string(index); }
};

struct JournalEntry {
  LogPosition pos;
  std::string data;  // the RocksDB WriteBatch's representation (Z/pos included)
};

// What a follower at some position needs next (Journal::Read).
enum class FollowerNeeds { kEntries, kNothing, kSnapshot };

struct FollowerState {
  std::string id;
  uint64_t acked = 0;  // the last index it acknowledged
  bool in_sync = false;
};

class Journal {
 public:
  // `db` outlives the journal. `keep_bytes`: entries kept in memory for followers (0: none, a
  // single master). `sync_timeout`: how long Commit waits for a follower in sync.
  Journal(rocksdb::DB* db, size_t keep_bytes = 0, std::chrono::milliseconds sync_timeout = std::chrono::seconds(2));
  // Replication settings (before serving followers).
  void Configure(size_t keep_bytes, std::chrono::milliseconds sync_timeout);

  // Reads the position from the database (0/0 when it has none: never journaled).
  Status Load();
  LogPosition position() const;

  // The fence: asked before every commit (under the commit lock); a non-OK answer is returned and
  // nothing is written. Default: always OK (a single master). With a fence, commits are also
  // refused outside a term this journal began (BeginTerm .. EndTerm): a master elected but not yet
  // promoted writes nothing under the previous leader's term.
  void SetFence(std::function<Status()> fence);
  // Starts a term: later commits carry it; writes an empty entry (the term's first). The term must
  // be larger than the journal's (Promote passes max(etcd's, journal's + 1)).
  Status BeginTerm(uint64_t term);
  // Ends this master's term (it no longer leads): commits are refused until the next BeginTerm.
  void EndTerm();
  // False while a snapshot is being installed, or one was left halfway (see kJournalInstallingKey).
  bool Whole() const;

  // Writes `batch` as the next entry, in this master's database when it returns; `sync`: fsync the
  // write-ahead log. It does not wait for a follower: the calling thread owes a WaitReplicated()
  // before it acknowledges the write to anyone (see the design note).
  Status Commit(rocksdb::WriteBatch* batch, bool sync = false);
  // Waits until a follower in sync has acknowledged the last entry this thread committed, or none
  // is in sync, or sync_timeout passes (the followers that did not acknowledge then drop out of
  // sync). OK at once when this thread owes nothing. Non-OK when the fence fails meanwhile: this
  // master lost its lease and cannot vouch for the write. Call it holding no lock of the caller's.
  Status WaitReplicated();
  // Makes the calling thread owe entry `index` (one another thread committed) as if it had
  // committed it: its next WaitReplicated waits for it too. For a value reserved by one entry and
  // handed out by many calls (the free stamps).
  void Owe(uint64_t index);
  // A standby: applies the leader's entry, which must be the one after position(). Returns which
  // key prefixes it touched (first bytes of its keys) in *prefixes when not null.
  Status Apply(const JournalEntry& e, std::string* prefixes = nullptr);

  // A leader: what a follower at `from` needs. kEntries: entries after `from` (at most about
  // `max_bytes`) appended to *out.
  FollowerNeeds Read(const LogPosition& from, size_t max_bytes, std::vector<JournalEntry>* out) const;
  // Waits until the position's index passes `index` or `timeout` passes; true when it passed.
  bool WaitBeyond(uint64_t index, std::chrono::milliseconds timeout) const;
  // Keeps every entry after `index` (however many bytes) until Unhold: a snapshot in flight must
  // be followed by the entries after its position, or the standby would need another.
  void Hold(uint64_t index);
  void Unhold(uint64_t index);

  // A consistent copy of the whole database, in pages of about `page_bytes`: `fn(keys, values)`;
  // the Z/pos key is among them, so the copy carries its own position. Stops at fn's first error.
  // `*at` (when not null): the snapshot's position, held (Hold) until the caller Unholds it.
  Status Snapshot(size_t page_bytes,
                  const std::function<Status(const std::vector<std::string>& keys,
                                             const std::vector<std::string>& values)>& fn,
                  LogPosition* at = nullptr);
  // A standby installing a snapshot: Begin deletes everything (position 0/0, so a crash halfway
  // takes a snapshot again), Page writes, End reads the position the copy carried.
  Status InstallBegin();
  Status InstallPage(const std::vector<std::string>& keys, const std::vector<std::string>& values);
  Status InstallEnd();

  // Followers' acknowledgements (a leader).
  void Acked(const std::string& follower, uint64_t index);
  void Forget(const std::string& follower);
  std::vector<FollowerState> Followers() const;

 private:
  void KeepLocked(JournalEntry e) REQUIRES(mu_);
  Status WriteLocked(rocksdb::WriteBatch* batch, const LogPosition& pos, bool sync) REQUIRES(mu_);

  rocksdb::DB* const db_;

  mutable Mutex mu_;
  size_t keep_bytes_ GUARDED_BY(mu_);
  std::chrono::milliseconds sync_timeout_ GUARDED_BY(mu_);
  mutable std::condition_variable changed_;  // the position moved, or a follower acknowledged
  std::function<Status()> fence_ GUARDED_BY(mu_);
  uint64_t term_ GUARDED_BY(mu_) = 0;  // the term new entries carry
  bool in_term_ GUARDED_BY(mu_) = false;  // between BeginTerm and EndTerm (only matters with a fence)
  bool whole_ GUARDED_BY(mu_) = true;
  std::multiset<uint64_t> held_ GUARDED_BY(mu_);
  LogPosition pos_ GUARDED_BY(mu_);
  // Kept entries: consecutive, the last one at pos_; base_ is the position just before the first.
  std::deque<JournalEntry> kept_ GUARDED_BY(mu_);
  size_t kept_bytes_ GUARDED_BY(mu_) = 0;
  LogPosition base_ GUARDED_BY(mu_);
  std::map<std::string, FollowerState> followers_ GUARDED_BY(mu_);
};

}  // namespace granary::master
