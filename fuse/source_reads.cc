#include "fuse/source_reads.h"

#include <errno.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>

namespace granary::fuse {

SourceFile::~SourceFile() {
  if (fd_ >= 0) close(fd_);
}

Status SourceFile::Read(uint64_t offset, uint64_t length, char* out) const {
  uint64_t done = 0;
  while (done < length) {
    ssize_t n = pread(fd_, out + done, length - done, static_cast<off_t>(offset + done));
    if (n < 0) {
      if (errno == EINTR) continue;
      return ErrnoError(errno, "read of the under-storage's file");
    }
    if (n == 0) break;
    done += static_cast<uint64_t>(n);
  }
  // A writer that raced with this read shows up as a new size or modification time, a rename or
  // unlink as no link left. AT_STATX_FORCE_SYNC: on NFS the client asks the server, not its
  // attribute cache (which could hide another client's rewrite for up to a minute).
  struct statx st;
  if (statx(fd_, "", AT_EMPTY_PATH | AT_STATX_FORCE_SYNC, STATX_SIZE | STATX_MTIME | STATX_NLINK | STATX_INO, &st) != 0) {
    return ErrnoError(errno, "stat of the under-storage's file");
  }
  const int64_t mtime_ns = static_cast<int64_t>(st.stx_mtime.tv_sec) * 1'000'000'000 + st.stx_mtime.tv_nsec;
  if (st.stx_size != size_ || mtime_ns != mtime_ns_ || st.stx_ino != ino_ || st.stx_nlink == 0 || done != length) {
    return VersionChangedError("the file changed in the under-storage since it was listed");
  }
  return Status::OK();
}

SourceReads::Entry* SourceReads::Touch(const std::string& key) {
  auto it = files_.find(key);
  if (it == files_.end()) return nullptr;
  lru_.splice(lru_.begin(), lru_, it->second.lru);
  it->second.used = now_();
  return &it->second;
}

SourceReads::Grant SourceReads::Direct(const std::string& key, uint64_t index, bool range_first) {
  MutexLock lock(&mu_);
  Entry* e = Touch(key);
  if (e == nullptr || !e->file) return {};
  // Only what the worker would read range first: a sequential reader's block start is its to fetch
  // whole and keep.
  if (!range_first) return {};
  const Clock::time_point now = now_();
  auto b = e->left.find(index);
  if (b == e->left.end()) {
    // A block the worker has not answered since the file came: read here unless it is known to be
    // cached.
    if (index >= e->cached.size() || e->cached[index] || e->left.size() >= kMaxBlocks) return {};
    b = e->left.emplace(index, Entry::Left{kDirectReads, 0, now + kDirectFor}).first;
  }
  Entry::Left& l = b->second;
  if (l.reads == 0) return {};
  if (now >= l.end) {  // the worker may have filled it since: ask
    l.reads = 0;
    return {};
  }
  --l.reads;  // at 0, the next read of the block asks the worker
  // A worker that sent no bitmap predates touch reports (it would take one for a readahead hint
  // and fetch the block whole): it is told nothing.
  Grant g{e->file, l.touches < 2 && !e->file->cached().empty()};
  if (g.touch) ++l.touches;  // the worker fills a block on its second touch
  return g;
}

bool SourceReads::Wants(const std::string& key) {
  MutexLock lock(&mu_);
  auto it = files_.find(key);
  if (it == files_.end()) return true;
  if (it->second.file || now_() - it->second.asked < kAskAgain) return false;
  lru_.erase(it->second.lru);  // asked in vain long ago: ask again
  files_.erase(it);
  return true;
}

void SourceReads::FromSource(const std::string& key, uint64_t index, std::shared_ptr<const SourceFile> file,
                             bool asked) {
  MutexLock lock(&mu_);
  Entry* e = Touch(key);
  if (e == nullptr) {
    if (!file && !asked) return;  // nothing to read it with, and nothing learnt
    if (files_.size() >= kMaxFiles) {
      files_.erase(lru_.back());  // a read holding its descriptor keeps it open until it ends
      lru_.pop_back();
    }
    lru_.push_front(key);
    e = &files_[key];
    e->lru = lru_.begin();
    e->used = e->asked = now_();
  }
  if (file) {
    // What the worker had cached when it opened the file; blocks past the bitmap are asked of it.
    const std::string& bits = file->cached();
    e->cached.assign(std::min(bits.size() * 8, kMaxBlocks), false);
    for (size_t i = 0; i < e->cached.size(); ++i) e->cached[i] = (static_cast<uint8_t>(bits[i / 8]) >> (i % 8)) & 1;
    e->file = std::move(file);
  }
  if (!e->file) return;  // the worker has no file to give: every read asks it
  if (index < e->cached.size()) e->cached[index] = false;
  if (e->left.size() >= kMaxBlocks && e->left.count(index) == 0) return;  // this block keeps asking the worker
  // The worker's answer was itself a touch (it fills the block on the second).
  e->left[index] = Entry::Left{kDirectReads, 1, now_() + kDirectFor};
}

void SourceReads::FromWorker(const std::string& key, uint64_t index) {
  MutexLock lock(&mu_);
  auto it = files_.find(key);
  if (it == files_.end()) return;
  it->second.left.erase(index);
  if (index < it->second.cached.size()) it->second.cached[index] = true;
}

void SourceReads::Forget(const std::string& key) {
  MutexLock lock(&mu_);
  auto it = files_.find(key);
  if (it == files_.end()) return;
  lru_.erase(it->second.lru);
  files_.erase(it);
}

void SourceReads::Trim() {
  MutexLock lock(&mu_);
  const Clock::time_point now = now_();
  // lru_ is ordered by last use, so the idle ones are at its back.
  while (!lru_.empty()) {
    auto it = files_.find(lru_.back());
    if (now - it->second.used < kIdle) break;
    files_.erase(it);  // a read holding the descriptor keeps it open until it ends
    lru_.pop_back();
  }
}

size_t SourceReads::files() const {
  MutexLock lock(&mu_);
  return files_.size();
}

}  // namespace granary::fuse
