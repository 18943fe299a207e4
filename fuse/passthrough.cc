// PassthroughOpens (fuse/passthrough.h, whose design note says what the rules are and why).
#include "fuse/passthrough.h"

#include <utility>

namespace granary::fuse {

PassthroughOpens::PassthroughOpens(BackingHost* host, std::chrono::milliseconds keep_for, Clock now)
    : host_(host), keep_for_(keep_for), now_(now ? std::move(now) : Clock([] { return std::chrono::steady_clock::now(); })) {}

bool PassthroughOpens::refused() const { return refused_.load(); }

// Lets go of kept backing files: the oldest while over the bounds, and any kept longer than keep_for.
void PassthroughOpens::TrimLocked(Leases* done) {
  const auto now = now_();
  while (!idle_.empty()) {
    auto oldest = idle_.begin();
    auto it = opens_.find(oldest->second);
    const bool over = idle_.size() > kIdleBackingFiles || idle_bytes_ > kIdleBackingBytes;
    if (it != opens_.end() && !over && now - it->second.idle_since < keep_for_) break;
    idle_.erase(oldest);
    if (it == opens_.end()) continue;
    idle_bytes_ -= it->second.bytes;
    host_->Drop(it->first, it->second.backing_id);
    done->push_back(std::move(it->second.lease));
    opens_.erase(it);
  }
}

// Takes a kept (closed) entry out of the idle list.
void PassthroughOpens::UnidleLocked(InodeOpens& st) {
  if (st.idle_seq == 0) return;
  idle_.erase(st.idle_seq);
  idle_bytes_ -= st.bytes;
  st.idle_seq = 0;
}

// Keeps a closed entry's backing file for a reopen.
void PassthroughOpens::IdleLocked(uint64_t kino, InodeOpens& st) {
  st.idle_seq = idle_next_++;
  st.idle_since = now_();
  idle_.emplace(st.idle_seq, kino);
  idle_bytes_ += st.bytes;
}

PassthroughOpens::Choice PassthroughOpens::JoinLocked(InodeOpens& st, const rpc::FileInfo& info) {
  if (st.passthrough > 0 && st.version == info.version()) {
    st.passthrough++;
    return {st.backing_id, false, false};
  }
  if (st.passthrough > 0) return {0, true, false};  // the inode is in passthrough io mode on another version
  st.cached++;
  return {0, false, true};
}

PassthroughOpens::Choice PassthroughOpens::Open(uint64_t kino, const rpc::FileInfo& info) {
  Leases done;
  {
    MutexLock lock(&mu);
    TrimLocked(&done);
    auto it = opens_.find(kino);
    if (it != opens_.end() && it->second.idle_seq != 0) {
      UnidleLocked(it->second);
      if (it->second.version == info.version()) {  // reopened: the kept backing file serves it
        it->second.passthrough = 1;
        return {it->second.backing_id, false, false};
      }
      host_->Drop(kino, it->second.backing_id);  // a new version: let the old one go
      done.push_back(std::move(it->second.lease));
      opens_.erase(it);
      it = opens_.end();
    }
    if (it != opens_.end() && (it->second.passthrough > 0 || it->second.cached > 0)) return JoinLocked(it->second, info);
  }
  if (refused_) return {};
  auto lease = info.attr().size() == 0 ? UnavailableError("empty") : host_->Lease(info);
  if (!lease.ok()) {  // empty, not on this node's worker (a peer holds it), or no local socket
    MutexLock lock(&mu);
    auto it = opens_.find(kino);
    if (it == opens_.end() || it->second.idle_seq == 0) return JoinLocked(opens_[kino], info);
    // Kept since the look above, after another open's close: an inode in no io mode.
    UnidleLocked(it->second);
    if (it->second.version == info.version()) {
      it->second.passthrough = 1;
      return {it->second.backing_id, false, false};
    }
    host_->Drop(kino, it->second.backing_id);
    done.push_back(std::move(it->second.lease));
    it->second = InodeOpens{};
    return JoinLocked(it->second, info);
  }
  auto id = host_->Register(**lease);
  if (!id.ok()) {
    refused_ = true;
    return {};
  }
  MutexLock lock(&mu);
  InodeOpens& st = opens_[kino];
  if (st.idle_seq != 0) {
    // Another open got there first and has been closed since: its backing id is still the
    // inode's in the kernel until trimmed. Use it (same version) or let it go properly; writing
    // ours over it would leave it in the idle list, to be closed later under our open files.
    UnidleLocked(st);
    if (st.version == info.version()) {
      host_->Unregister(*id);
      st.passthrough = 1;
      return {st.backing_id, false, false};
    }
    host_->Drop(kino, st.backing_id);
    done.push_back(std::move(st.lease));
    st = InodeOpens{};
  }
  if (st.passthrough > 0 || st.cached > 0) {  // another open got there first
    host_->Unregister(*id);
    return JoinLocked(st, info);
  }
  st.passthrough = 1;
  st.version = info.version();
  st.backing_id = *id;
  st.info = info;
  st.lease = std::move(*lease);
  st.bytes = info.attr().size();
  host_->Announce(kino, st);
  return {*id, false, false};
}

void PassthroughOpens::AddCached(uint64_t kino, const std::function<void()>& tell) {
  MutexLock lock(&mu);
  opens_[kino].cached++;
  if (tell) tell();
}

void PassthroughOpens::End(uint64_t kino, bool passthrough, bool cached, const std::function<void()>& tell) {
  if (!passthrough && !cached) return;
  Leases done;
  MutexLock lock(&mu);
  if (tell) tell();
  auto it = opens_.find(kino);
  if (it == opens_.end()) return;
  InodeOpens& st = it->second;
  if (cached) --st.cached;
  if (passthrough && --st.passthrough == 0 && st.cached == 0) {
    if (st.lease) {
      IdleLocked(kino, st);  // kept for a reopen (the next epoch, another loader worker)
    } else {  // adopted without a lease (Adopt): nothing keeps the worker off its data file
      host_->Drop(kino, st.backing_id);
      opens_.erase(it);
    }
  } else if (st.passthrough == 0 && st.cached == 0) {
    opens_.erase(it);
  }
  TrimLocked(&done);
}

void PassthroughOpens::Trim() {
  Leases done;
  MutexLock lock(&mu);
  TrimLocked(&done);
}

void PassthroughOpens::Adopt(uint64_t kino, InodeOpens o, bool idle) {
  MutexLock lock(&mu);
  if (idle && o.passthrough == 0) IdleLocked(kino, o);
  opens_[kino] = std::move(o);
}

void PassthroughOpens::LetGoUnleased() {
  Leases done;
  MutexLock lock(&mu);
  for (auto it = opens_.begin(); it != opens_.end();) {
    InodeOpens& st = it->second;
    if (st.lease || st.passthrough > 0 || st.cached > 0 || st.backing_id <= 0) {
      ++it;
      continue;
    }
    UnidleLocked(st);
    host_->Drop(it->first, st.backing_id);
    it = opens_.erase(it);
  }
}

void PassthroughOpens::Clear() {
  std::unordered_map<uint64_t, InodeOpens> gone;  // the leases end after mu is released
  MutexLock lock(&mu);
  gone.swap(opens_);
  idle_.clear();
  idle_bytes_ = 0;
}

PassthroughOpens::View PassthroughOpens::Inspect(uint64_t kino) const {
  MutexLock lock(&mu);
  View v;
  auto it = opens_.find(kino);
  if (it == opens_.end()) return v;
  v.present = true;
  v.passthrough = it->second.passthrough;
  v.cached = it->second.cached;
  v.backing_id = it->second.backing_id;
  v.idle = it->second.idle_seq != 0;
  v.version = it->second.version;
  return v;
}

size_t PassthroughOpens::idle_files() const {
  MutexLock lock(&mu);
  return idle_.size();
}

}  // namespace granary::fuse
