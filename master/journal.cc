#include "master/journal.h"

#include <spdlog/spdlog.h>

#include <memory>

#include "common/keys.h"

namespace granary::master {

Status FromRocks(const rocksdb::Status& s, const std::string& what) {
  if (s.ok()) return Status::OK();
  if (s.IsNotFound()) return NotFoundError(what + ": not found");
  std::string m = what + ": RocksDB: " + s.ToString();
  if (s.IsCorruption()) return DataLossError(m + " (the master's database is damaged; restore master.data_dir from a backup)");
  if (s.IsNoSpace()) return ResourceExhaustedError(m + " (free space on master.data_dir's disk)");
  if (s.IsBusy() || s.IsTimedOut() || s.IsTryAgain() || s.IsIOError() || s.IsShutdownInProgress()) {
    return UnavailableError(m);
  }
  return InternalError(m);
}

namespace {

constexpr uint64_t kRejoinLag = 16;

std::string EncodePosition(const LogPosition& p) { return Be64(p.term) + Be64(p.index); }

// The first bytes of every key a batch touches, and whether it sets Z/pos (and to what).
class BatchKeys : public rocksdb::WriteBatch::Handler {
 public:
  std::string prefixes;
  std::string pos;
  void Note(const rocksdb::Slice& key) {
    if (key.size() > 0 && prefixes.find(key[0]) == std::string::npos) prefixes.push_back(key[0]);
  }
  rocksdb::Status PutCF(uint32_t, const rocksdb::Slice& key, const rocksdb::Slice& value) override {
    Note(key);
    if (key == rocksdb::Slice(kJournalPositionKey)) pos = value.ToString();
    return rocksdb::Status::OK();
  }
  rocksdb::Status DeleteCF(uint32_t, const rocksdb::Slice& key) override {
    Note(key);
    return rocksdb::Status::OK();
  }
  rocksdb::Status SingleDeleteCF(uint32_t, const rocksdb::Slice& key) override {
    Note(key);
    return rocksdb::Status::OK();
  }
  rocksdb::Status DeleteRangeCF(uint32_t, const rocksdb::Slice& begin, const rocksdb::Slice&) override {
    Note(begin);
    prefixes.push_back('*');  // a range may span prefixes
    return rocksdb::Status::OK();
  }
  rocksdb::Status MergeCF(uint32_t, const rocksdb::Slice& key, const rocksdb::Slice&) override {
    Note(key);
    return rocksdb::Status::OK();
  }
};

}  // namespace

Journal::Journal(rocksdb::DB* db, size_t keep_bytes, std::chrono::milliseconds sync_timeout)
    : db_(db), keep_bytes_(keep_bytes), sync_timeout_(sync_timeout) {}

void Journal::Configure(size_t keep_bytes, std::chrono::milliseconds sync_timeout) {
  MutexLock lock(&mu_);
  keep_bytes_ = keep_bytes;
  sync_timeout_ = sync_timeout;
}

Status Journal::Load() {
  std::string v;
  rocksdb::Status inst = db_->Get({}, kJournalInstallingKey, &v);
  if (!inst.IsNotFound()) RETURN_IF_ERROR(FromRocks(inst, "read the journal's install marker"));
  const bool whole = inst.IsNotFound();
  rocksdb::Status s = db_->Get({}, kJournalPositionKey, &v);
  LogPosition pos;
  if (!s.IsNotFound()) {
    RETURN_IF_ERROR(FromRocks(s, "read the journal position"));
    if (v.size() != 16) return DataLossError("the master's database holds a malformed journal position");
    pos = {GetBe64(v.data()), GetBe64(v.data() + 8)};
  }
  MutexLock lock(&mu_);
  whole_ = whole;
  pos_ = pos;
  base_ = pos;
  kept_.clear();
  kept_bytes_ = 0;
  term_ = std::max(term_, pos.term);
  changed_.notify_all();
  return Status::OK();
}

LogPosition Journal::position() const {
  MutexLock lock(&mu_);
  return pos_;
}

void Journal::SetFence(std::function<Status()> fence) {
  MutexLock lock(&mu_);
  fence_ = std::move(fence);
}

Status Journal::BeginTerm(uint64_t term) {
  {
    MutexLock lock(&mu_);
    if (term < pos_.term) {
      return FailedPreconditionError("term " + std::to_string(term) + " is older than the journal's " +
                                     std::to_string(pos_.term));
    }
    if (!whole_) return FailedPreconditionError("this master's copy of the namespace is partial (a snapshot was left halfway)");
    term_ = term;
    in_term_ = true;
  }
  rocksdb::WriteBatch empty;
  return Commit(&empty, /*sync=*/true);
}

void Journal::EndTerm() {
  MutexLock lock(&mu_);
  in_term_ = false;
}

bool Journal::Whole() const {
  MutexLock lock(&mu_);
  return whole_;
}

void Journal::Hold(uint64_t index) {
  MutexLock lock(&mu_);
  held_.insert(index);
}

void Journal::Unhold(uint64_t index) {
  MutexLock lock(&mu_);
  auto it = held_.find(index);
  if (it != held_.end()) held_.erase(it);
}

Status Journal::WriteLocked(rocksdb::WriteBatch* batch, const LogPosition& pos, bool sync) {
  rocksdb::WriteOptions wo;
  wo.sync = sync;
  RETURN_IF_ERROR(FromRocks(db_->Write(wo, batch), "write"));
  pos_ = pos;
  return Status::OK();
}

void Journal::KeepLocked(JournalEntry e) {
  if (keep_bytes_ == 0) {
    base_ = e.pos;
    return;
  }
  kept_bytes_ += e.data.size();
  kept_.push_back(std::move(e));
  while (kept_bytes_ > keep_bytes_ && kept_.size() > 1 && (held_.empty() || kept_.front().pos.index <= *held_.begin())) {
    kept_bytes_ -= kept_.front().data.size();
    base_ = kept_.front().pos;
    kept_.pop_front();
  }
}

namespace {
// The entry the calling thread committed last and has not waited for (one journal per thread at a
// time: a master's; 0: none owed).
thread_local const Journal* t_owed_journal = nullptr;
thread_local uint64_t t_owed_index = 0;
}  // namespace

Status Journal::Commit(rocksdb::WriteBatch* batch, bool sync) {
  LogPosition pos;
  bool wait = false;
  {
    MutexLock lock(&mu_);
    if (fence_) {
      if (!in_term_) return UnavailableError("this master does not lead (yet): the write was not made");
      RETURN_IF_ERROR(fence_());
    }
    pos = {term_, pos_.index + 1};
    batch->Put(kJournalPositionKey, EncodePosition(pos));
    RETURN_IF_ERROR(WriteLocked(batch, pos, sync));
    KeepLocked({pos, batch->Data()});
    changed_.notify_all();
    for (const auto& [id, f] : followers_) wait |= f.in_sync;
  }
  if (wait) {
    t_owed_index = std::max(t_owed_journal == this ? t_owed_index : 0, pos.index);
    t_owed_journal = this;
  }
  return Status::OK();
}

void Journal::Owe(uint64_t index) {
  bool wait = false;
  {
    MutexLock lock(&mu_);
    for (const auto& [id, f] : followers_) wait |= f.in_sync && f.acked < index;
  }
  if (!wait) return;
  t_owed_index = std::max(t_owed_journal == this ? t_owed_index : 0, index);
  t_owed_journal = this;
}

Status Journal::WaitReplicated() {
  if (t_owed_journal != this || t_owed_index == 0) return Status::OK();
  const uint64_t index = t_owed_index;
  t_owed_journal = nullptr;
  t_owed_index = 0;
  // Semi-synchronous: one follower in sync has it, or none is in sync any more.
  MutexLock lock(&mu_);
  auto deadline = std::chrono::steady_clock::now() + sync_timeout_;
  for (;;) {
    bool any_in_sync = false;
    for (const auto& [id, f] : followers_) {
      if (!f.in_sync) continue;
      if (f.acked >= index) return Status::OK();
      any_in_sync = true;
    }
    if (!any_in_sync) return Status::OK();
    if (!lock.WaitUntil(&changed_, deadline)) {
      for (auto& [id, f] : followers_) {
        if (!f.in_sync || f.acked >= index) continue;
        f.in_sync = false;
        spdlog::warn("standby master {} did not acknowledge entry {} within {} ms: writes no longer wait for it "
                     "until it catches up",
                     id, index, sync_timeout_.count());
      }
      if (fence_) return fence_();  // a leader that lost its lease meanwhile cannot vouch for the write
      return Status::OK();
    }
  }
}

Status Journal::Apply(const JournalEntry& e, std::string* prefixes) {
  rocksdb::WriteBatch batch(e.data);
  BatchKeys keys;
  rocksdb::Status it = batch.Iterate(&keys);
  if (!it.ok()) return DataLossError("entry " + e.pos.ToString() + " from the leader is malformed: " + it.ToString());
  if (keys.pos != EncodePosition(e.pos)) {
    return DataLossError("entry " + e.pos.ToString() + " from the leader does not carry its own position");
  }
  MutexLock lock(&mu_);
  in_term_ = false;  // following another leader
  if (e.pos.index != pos_.index + 1 || e.pos.term < pos_.term) {
    return FailedPreconditionError("entry " + e.pos.ToString() + " does not follow this master's position " +
                                   pos_.ToString());
  }
  RETURN_IF_ERROR(WriteLocked(&batch, e.pos, false));
  term_ = std::max(term_, e.pos.term);
  KeepLocked(e);
  changed_.notify_all();
  if (prefixes) *prefixes = keys.prefixes;
  return Status::OK();
}

FollowerNeeds Journal::Read(const LogPosition& from, size_t max_bytes, std::vector<JournalEntry>* out) const {
  MutexLock lock(&mu_);
  // Term 0 is a single master's (no election): two such journals share nothing, whatever their
  // indexes say.
  if (from.index == 0 || from.term == 0 || from.index > pos_.index) return FollowerNeeds::kSnapshot;
  if (from.index == pos_.index) return from.term == pos_.term ? FollowerNeeds::kNothing : FollowerNeeds::kSnapshot;
  size_t at;  // the first kept entry to send
  if (from.index == base_.index) {
    if (from.term != base_.term) return FollowerNeeds::kSnapshot;
    at = 0;
  } else if (from.index > base_.index && !kept_.empty()) {
    const JournalEntry& same = kept_[from.index - base_.index - 1];
    if (same.pos.term != from.term) return FollowerNeeds::kSnapshot;
    at = from.index - base_.index;
  } else {
    return FollowerNeeds::kSnapshot;  // older than what is kept
  }
  size_t bytes = 0;
  for (; at < kept_.size() && (bytes == 0 || bytes < max_bytes); ++at) {
    bytes += kept_[at].data.size();
    out->push_back(kept_[at]);
  }
  return FollowerNeeds::kEntries;
}

bool Journal::WaitBeyond(uint64_t index, std::chrono::milliseconds timeout) const {
  MutexLock lock(&mu_);
  auto deadline = std::chrono::steady_clock::now() + timeout;
  while (pos_.index <= index) {
    if (!lock.WaitUntil(&changed_, deadline)) break;
  }
  return pos_.index > index;
}

Status Journal::Snapshot(size_t page_bytes,
                         const std::function<Status(const std::vector<std::string>&, const std::vector<std::string>&)>& fn,
                         LogPosition* at) {
  const rocksdb::Snapshot* snap;
  {
    MutexLock lock(&mu_);  // no commit halfway: the snapshot is at one position
    snap = db_->GetSnapshot();
    if (at) {
      *at = pos_;
      held_.insert(pos_.index);
    }
  }
  std::shared_ptr<const rocksdb::Snapshot> release(snap, [this](const rocksdb::Snapshot* s) { db_->ReleaseSnapshot(s); });
  rocksdb::ReadOptions ro;
  ro.snapshot = snap;
  ro.fill_cache = false;
  std::unique_ptr<rocksdb::Iterator> it(db_->NewIterator(ro));
  std::vector<std::string> keys, values;
  size_t bytes = 0;
  for (it->SeekToFirst(); it->Valid(); it->Next()) {
    if (it->key() == rocksdb::Slice(kJournalInstallingKey)) continue;
    keys.push_back(it->key().ToString());
    values.push_back(it->value().ToString());
    bytes += keys.back().size() + values.back().size();
    if (bytes >= page_bytes) {
      RETURN_IF_ERROR(fn(keys, values));
      keys.clear();
      values.clear();
      bytes = 0;
    }
  }
  RETURN_IF_ERROR(FromRocks(it->status(), "read the database for a snapshot"));
  if (!keys.empty()) RETURN_IF_ERROR(fn(keys, values));
  return Status::OK();
}

Status Journal::InstallBegin() {
  rocksdb::WriteBatch batch;
  // Every key the master writes starts with an upper-case letter; the range covers them all.
  batch.DeleteRange(rocksdb::Slice("", 0), rocksdb::Slice("\xff\xff\xff\xff", 4));
  batch.Put(kJournalPositionKey, EncodePosition({}));
  batch.Put(kJournalInstallingKey, "1");  // a partial copy until InstallEnd, across restarts too
  MutexLock lock(&mu_);
  in_term_ = false;
  whole_ = false;
  RETURN_IF_ERROR(WriteLocked(&batch, {}, true));
  kept_.clear();
  kept_bytes_ = 0;
  base_ = {};
  return Status::OK();
}

Status Journal::InstallPage(const std::vector<std::string>& keys, const std::vector<std::string>& values) {
  if (keys.size() != values.size()) return InvalidArgumentError("a snapshot page with more keys than values");
  rocksdb::WriteBatch batch;
  for (size_t i = 0; i < keys.size(); ++i) batch.Put(keys[i], values[i]);
  return FromRocks(db_->Write({}, &batch), "write a snapshot page");
}

Status Journal::InstallEnd() {
  rocksdb::WriteOptions wo;
  wo.sync = true;
  RETURN_IF_ERROR(FromRocks(db_->Delete(wo, kJournalInstallingKey), "finish the installed snapshot"));
  return Load();
}

void Journal::Acked(const std::string& follower, uint64_t index) {
  MutexLock lock(&mu_);
  FollowerState& f = followers_[follower];
  f.id = follower;
  f.acked = std::max(f.acked, index);
  // Within a few entries of the leader counts: under steady writes a follower that keeps up is
  // always an entry or two behind the moment it acknowledges.
  if (!f.in_sync && f.acked + kRejoinLag >= pos_.index) {
    f.in_sync = true;
    spdlog::info("standby master {} is in sync at entry {}", follower, f.acked);
  }
  changed_.notify_all();
}

void Journal::Forget(const std::string& follower) {
  MutexLock lock(&mu_);
  followers_.erase(follower);
  changed_.notify_all();
}

std::vector<FollowerState> Journal::Followers() const {
  MutexLock lock(&mu_);
  std::vector<FollowerState> out;
  for (const auto& [id, f] : followers_) out.push_back(f);
  return out;
}

}  // namespace granary::master
