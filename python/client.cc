#include "python/client.h"

#include <pthread.h>
#include <sys/stat.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <limits>
#include <mutex>

#include "common/backoff.h"

namespace granary::python {
namespace {

// Forks of this process since the first Client was made (pthread_atfork).
std::atomic<uint64_t> fork_count{0};

uint64_t ForkCount() {
  static std::once_flag once;
  std::call_once(once, [] { pthread_atfork(nullptr, nullptr, [] { fork_count.fetch_add(1, std::memory_order_relaxed); }); });
  return fork_count.load(std::memory_order_relaxed);
}

Entry FromAnswer(const rpc::AttrResponse& r, const std::string& grant, const std::string& data_grant) {
  Entry e;
  e.attr = r.attr();
  if (r.has_file() && !r.file().ufs_path().empty()) e.file = std::make_shared<const rpc::FileInfo>(r.file());
  e.grant = grant;
  e.data_grant = data_grant;
  return e;
}

// A grant's first byte is the entry's permission bits for this user (worker/meta_proxy.h); no
// grant: root or the worker's user, which may do anything.
bool MayRead(const Entry& e) { return e.grant.empty() || (static_cast<unsigned char>(e.grant[0]) & 4u) != 0; }

std::string Child(const std::string& dir, const std::string& name) { return dir == "/" ? "/" + name : dir + "/" + name; }

}  // namespace

Client::Client(ClientOptions o)
    : o_(std::move(o)),
      forks_(ForkCount()),
      // A call that hears nothing for worker_wait (a worker that accepts but never answers) is
      // UNAVAILABLE, not a hang.
      ch_(std::make_unique<fuse::LocalChannel>(o_.socket, o_.worker_wait)) {}

Client::~Client() {
  if (Forked()) {
    // The parent's: its thread is not here, and a lock may have been held at the fork.
    (void)notes_.release();
    (void)ch_.release();
  }
}

bool Client::Forked() const { return ForkCount() != forks_; }

Status Client::CheckProcess() const {
  if (!Forked()) return Status::OK();
  return Status(Code::kFailedPrecondition,
                "this granary client was made before a fork: make a new one in this process", kOtherProcess);
}

std::chrono::milliseconds Client::KeepFor(uint64_t grant_ttl_ms) const {
  if (grant_ttl_ms == 0) return o_.metadata_ttl;
  // Kept a little less long than the grant lives: the calls made with it reach the worker in time.
  return std::min(o_.metadata_ttl, std::chrono::milliseconds(grant_ttl_ms * 3 / 4));
}

StatusOr<std::shared_ptr<Client>> Client::Create(ClientOptions o) {
  if (o.socket.empty()) return InvalidArgumentError("no worker socket given (worker.local_socket)");
  struct stat sb {};
  if (stat(o.socket.c_str(), &sb) != 0 && errno == ENOENT) {
    return NotFoundError("no granary-worker socket at " + o.socket +
                         " (is granary-worker running on this node with worker.local_socket there?)");
  }
  std::shared_ptr<Client> c(new Client(std::move(o)));
  c->notes_ = std::make_unique<fuse::OpenNotes>(c->o_.max_entries, [p = c.get()](const std::vector<uint64_t>& inos) {
    rpc::MetaCall call;
    call.set_op(rpc::MetaCall::NOTE_OPENS);
    {
      MutexLock lock(&p->mu_);
      for (uint64_t ino : inos) {
        auto it = p->note_grants_.find(ino);
        call.add_inos(ino);
        call.add_grants(it != p->note_grants_.end() ? it->second : std::string());
        if (it != p->note_grants_.end()) p->note_grants_.erase(it);
      }
    }
    rpc::MetaAnswer a;
    return p->ch_->Meta(call, &a);
  });
  rpc::MetaCall root;
  root.set_op(rpc::MetaCall::ROOT);
  rpc::MetaAnswer a;
  // One call at once: a wrong path or a socket this user may not use is said here, not at the
  // first read.
  Status st = c->ch_->Meta(root, &a);
  if (!st.ok()) return Status(st.code(), "the worker's socket " + c->o_.socket + ": " + st.message());
  c->Remember("/", FromAnswer(a.entry(), a.grant(), a.data_grant()), a.grant_ttl_ms());
  return c;
}

std::string Client::Clean(std::string_view path) {
  std::vector<std::string_view> parts;
  size_t i = 0;
  while (i <= path.size()) {
    size_t j = path.find('/', i);
    if (j == std::string_view::npos) j = path.size();
    std::string_view part = path.substr(i, j - i);
    if (part == "..") {
      if (!parts.empty()) parts.pop_back();
    } else if (!part.empty() && part != ".") {
      parts.push_back(part);
    }
    i = j + 1;
  }
  std::string out;
  for (std::string_view p : parts) {
    out += '/';
    out += p;
  }
  return out.empty() ? "/" : out;
}

Status Client::Call(const rpc::MetaCall& call, rpc::MetaAnswer* out) {
  const auto deadline = Clock::now() + o_.worker_wait;
  Backoff backoff(kWorkerWait);
  for (;;) {
    Status st = ch_->Meta(call, out);
    if (st.code() != Code::kUnavailable || !backoff.SleepBefore(deadline)) return st;
  }
}

void Client::Remember(const std::string& clean, const Entry& e, uint64_t grant_ttl_ms) {
  // Nothing below a writable mount is kept: every stat and open asks (close-to-open), as
  // granary-fuse does.
  if (e.attr.writable() && clean != "/") return;
  if (e.file != nullptr && notes_ != nullptr) {
    if (!e.grant.empty()) {
      MutexLock lock(&mu_);
      if (note_grants_.size() >= o_.max_entries) note_grants_.clear();
      note_grants_[e.attr.ino()] = e.grant;
    }
    notes_->Listed(e.attr.ino());  // before an open can find it
  }
  MutexLock lock(&mu_);
  if (entries_.size() >= o_.max_entries) {
    entries_.clear();
    dirs_.clear();
  }
  entries_[clean] = Cached{e, Clock::now() + KeepFor(grant_ttl_ms)};
}

void Client::Forget() {
  MutexLock lock(&mu_);
  entries_.clear();
  dirs_.clear();
}

void Client::ForgetChanged(const std::string& clean, uint64_t ino) {
  MutexLock lock(&mu_);
  entries_.erase(clean);
  if (changed_.size() >= o_.max_entries) changed_.clear();
  changed_.insert(ino);
}

StatusOr<Entry> Client::LookupIn(const std::string& parent_path, const Entry& parent, const std::string& clean,
                                 const std::string& name) {
  if (parent.attr.type() != rpc::DIRECTORY) {
    return Status(Code::kFailedPrecondition, parent_path + " is not a directory", kNotDirectory);
  }
  if (!parent.attr.writable() && ShouldList(parent.attr.ino())) {
    // A reader going through this directory: all of it in a few calls, not a LOOKUP per file.
    Status listed = ListInto(parent_path, parent, nullptr, o_.max_entries / 4);
    if (listed.ok() || listed.code() == Code::kOutOfRange) Listed(parent.attr.ino(), listed.ok());
    MutexLock lock(&mu_);
    auto it = entries_.find(clean);
    if (it != entries_.end() && it->second.expires > Clock::now()) return it->second.entry;
  }
  rpc::MetaCall call;
  call.set_op(rpc::MetaCall::LOOKUP);
  call.set_ino(parent.attr.ino());
  call.set_grant(parent.grant);
  call.set_name(name);
  rpc::MetaAnswer a;
  Status st = Call(call, &a);
  if (!st.ok()) {
    if (st.code() == Code::kNotFound) return NotFoundError(clean + ": no such file or directory");
    return Status(st.code(), clean + ": " + st.message(), st.reason());
  }
  Entry e = FromAnswer(a.entry(), a.grant(), a.data_grant());
  Remember(clean, e, a.grant_ttl_ms());
  return e;
}

StatusOr<Entry> Client::Lookup(const std::string& clean) {
  if (clean.size() > kMaxPath) {
    return Status(Code::kInvalidArgument, "a path of " + std::to_string(clean.size()) + " bytes: the most is " +
                                              std::to_string(kMaxPath), kNameTooLong);
  }
  // The deepest prefix cached (the path itself, as a rule), then one component at a time: no
  // recursion, however deep the path.
  std::vector<size_t> slashes;  // where each component after the root starts, minus one
  for (size_t i = 0; i < clean.size(); ++i) {
    if (clean[i] == '/' && i + 1 < clean.size()) slashes.push_back(i);
  }
  size_t known = 0;  // components walked
  Entry at;
  {
    MutexLock lock(&mu_);
    const auto now = Clock::now();
    for (size_t k = slashes.size(); k > 0; --k) {
      const std::string prefix = k == slashes.size() ? clean : clean.substr(0, slashes[k]);
      auto it = entries_.find(prefix);
      if (it != entries_.end() && it->second.expires > now) {
        at = it->second.entry;
        known = k;
        break;
      }
    }
    if (known == 0) {
      auto it = entries_.find("/");
      if (it != entries_.end() && it->second.expires > now) {
        at = it->second.entry;
        known = SIZE_MAX;  // the root
      }
    }
  }
  if (known == slashes.size() && known != 0) return at;
  if (known == SIZE_MAX) {
    known = 0;
  } else if (known == 0) {
    rpc::MetaCall call;
    call.set_op(rpc::MetaCall::ROOT);
    rpc::MetaAnswer a;
    RETURN_IF_ERROR(Call(call, &a));
    at = FromAnswer(a.entry(), a.grant(), a.data_grant());
    Remember("/", at, a.grant_ttl_ms());
  }
  if (clean == "/") return at;
  for (size_t k = known; k < slashes.size(); ++k) {
    const std::string parent_path = k == 0 ? "/" : clean.substr(0, slashes[k]);
    const size_t end = k + 1 < slashes.size() ? slashes[k + 1] : clean.size();
    const std::string path = clean.substr(0, end);
    ASSIGN_OR_RETURN(at, LookupIn(parent_path, at, path, clean.substr(slashes[k] + 1, end - slashes[k] - 1)));
  }
  return at;
}

StatusOr<Entry> Client::Stat(std::string_view path) {
  RETURN_IF_ERROR(CheckProcess());
  const std::string clean = Clean(path);
  auto e = Lookup(clean);
  if (e.status().code() == Code::kUnauthenticated) {
    Forget();  // the worker restarted (its grants are void) or one expired: walk again
    e = Lookup(clean);
  }
  return e;
}

Status Client::ListInto(const std::string& clean, const Entry& dir, std::vector<std::pair<std::string, Entry>>* out,
                        size_t cap) {
  rpc::MetaCall call;
  call.set_op(rpc::MetaCall::READDIR);
  call.set_ino(dir.attr.ino());
  call.set_grant(dir.grant);
  call.set_limit(4096);
  size_t n = 0;
  for (;;) {
    rpc::MetaAnswer a;
    RETURN_IF_ERROR(Call(call, &a));
    const rpc::ReadDirResponse& d = a.dir();
    for (int i = 0; i < d.entries_size(); ++i) {
      const rpc::DirEntry& de = d.entries(i);
      Entry e;
      e.attr = de.attr();
      if (de.has_file() && !de.file().ufs_path().empty()) e.file = std::make_shared<const rpc::FileInfo>(de.file());
      if (i < a.grants_size()) e.grant = a.grants(i);
      if (i < a.data_grants_size()) e.data_grant = a.data_grants(i);
      Remember(Child(clean, de.name()), e, a.grant_ttl_ms());
      if (out != nullptr) out->emplace_back(de.name(), std::move(e));
    }
    n += static_cast<size_t>(d.entries_size());
    if (d.end() || d.entries().empty()) return Status::OK();
    if (n >= cap) return OutOfRangeError(clean + " has more than " + std::to_string(cap) + " entries");
    call.set_after(d.entries(d.entries_size() - 1).cookie());
  }
}

bool Client::ShouldList(uint64_t ino) {
  MutexLock lock(&mu_);
  if (dirs_.size() >= kMaxDirs) dirs_.clear();
  DirState& d = dirs_[ino];
  if (d.too_big || Clock::now() < d.listed + KeepFor(0)) return false;  // listed: a miss is a name not there
  return ++d.misses >= 2;
}

void Client::Listed(uint64_t ino, bool whole) {
  MutexLock lock(&mu_);
  DirState& d = dirs_[ino];
  d.misses = 0;
  if (whole) {
    d.listed = Clock::now();
  } else {
    d.too_big = true;
  }
}

StatusOr<std::vector<std::pair<std::string, Entry>>> Client::List(std::string_view path) {
  RETURN_IF_ERROR(CheckProcess());
  const std::string clean = Clean(path);
  std::vector<std::pair<std::string, Entry>> out;
  for (int attempt = 0;; ++attempt) {
    ASSIGN_OR_RETURN(Entry dir, Stat(clean));
    if (dir.attr.type() != rpc::DIRECTORY) {
      return Status(Code::kFailedPrecondition, clean + " is not a directory", kNotDirectory);
    }
    out.clear();
    Status st = ListInto(clean, dir, &out, std::numeric_limits<size_t>::max());
    if (st.code() == Code::kUnauthenticated && attempt == 0) {
      Forget();
      continue;
    }
    if (!st.ok()) return Status(st.code(), clean + ": " + st.message(), st.reason());
    if (!dir.attr.writable()) Listed(dir.attr.ino(), out.size() <= o_.max_entries / 4);
    return out;
  }
}

std::shared_ptr<File> Client::OpenCached(std::string_view path) {
  if (Forked()) return nullptr;  // Open says why
  const std::string clean = Clean(path);
  Entry e;
  {
    MutexLock lock(&mu_);
    auto it = entries_.find(clean);
    if (it == entries_.end() || it->second.expires <= Clock::now()) return nullptr;
    e = it->second.entry;
    if (changed_.count(e.attr.ino()) != 0) return nullptr;
  }
  if (e.attr.type() != rpc::REGULAR || e.file == nullptr || e.attr.writable() || !MayRead(e)) return nullptr;
  auto f = std::make_shared<File>();
  f->path = clean;
  f->info = *e.file;
  f->set_grant(e.data_grant);
  notes_->Opened(e.attr.ino());
  return f;
}

StatusOr<std::shared_ptr<File>> Client::Open(std::string_view path) {
  RETURN_IF_ERROR(CheckProcess());
  const std::string clean = Clean(path);
  for (int attempt = 0;; ++attempt) {
    ASSIGN_OR_RETURN(Entry e, Stat(clean));
    if (e.attr.type() == rpc::DIRECTORY) return Status(Code::kInvalidArgument, clean + " is a directory", kIsDirectory);
    // The worker refuses the read anyway: said here, plainly.
    if (!MayRead(e)) return PermissionDeniedError(clean + ": permission denied (the file's mode does not let this user read it)");
    bool changed = false;
    {
      MutexLock lock(&mu_);
      changed = changed_.erase(e.attr.ino()) != 0;
    }
    auto f = std::make_shared<File>();
    f->path = clean;
    if (e.file != nullptr && !e.attr.writable() && !changed) {
      f->info = *e.file;
      f->set_grant(e.data_grant);
      notes_->Opened(e.attr.ino());
      return f;
    }
    // No information with the entry (due for a check with the under-storage), a writable mount
    // (close-to-open), or a file that changed under a read: the master says now.
    rpc::MetaCall call;
    call.set_op(rpc::MetaCall::GETFILE);
    call.set_ino(e.attr.ino());
    call.set_grant(e.grant);
    rpc::MetaAnswer a;
    Status st = Call(call, &a);
    if (st.code() == Code::kUnauthenticated && attempt == 0) {
      Forget();
      continue;
    }
    if (!st.ok()) return Status(st.code(), clean + ": " + st.message(), st.reason());
    f->info = a.entry().file();
    f->set_grant(a.data_grant());
    notes_->Forget(e.attr.ino());  // the master counted this open itself
    Remember(clean, FromAnswer(a.entry(), a.grant(), a.data_grant()), a.grant_ttl_ms());
    return f;
  }
}

Status Client::Regrant(File& f) {
  {
    MutexLock lock(&mu_);
    entries_.erase(f.path);  // its grant expired or is void: ask again (the walk above is checked too)
  }
  ASSIGN_OR_RETURN(std::shared_ptr<File> again, Open(f.path));
  const rpc::FileInfo& a = again->info;
  const rpc::FileInfo& b = f.info;
  if (a.mount_id() != b.mount_id() || a.ufs_path() != b.ufs_path() || a.version() != b.version() ||
      a.attr().size() != b.attr().size() || a.block_size() != b.block_size()) {
    return VersionChangedError(f.path + " changed in the under-storage since it was opened: open it again");
  }
  f.set_grant(again->grant());
  return Status::OK();
}

Status Client::ReadBlockRange(File& f, uint64_t index, uint64_t in_block, uint64_t length, char* dst) {
  rpc::ReadBlockRequest req;
  req.set_mount_id(f.info.mount_id());
  req.set_ufs_path(f.info.ufs_path());
  req.set_version(f.info.version());
  req.set_file_size(f.size());
  req.set_block_size(f.info.block_size());
  req.set_index(index);
  req.set_offset(in_block);
  req.set_length(length);
  const auto deadline = Clock::now() + o_.worker_wait;
  Backoff backoff(kWorkerWait);
  bool regranted = false;
  for (;;) {
    fuse::LocalChannel::Piece p;
    Status st = ch_->Read(req, &p, false, nullptr, dst, f.grant());
    if (st.ok()) {
      if (p.length != length) {
        st = DataLossError("the worker answered " + std::to_string(p.length) + " bytes for " + std::to_string(length));
      } else if (p.fd >= 0) {
        st = fuse::LocalChannel::ReadInto(p, dst);  // a leased block file (pread) or the pipe
      } else if (p.mem == nullptr) {
        std::memcpy(dst, p.data.data(), length);
      }  // else: received straight into dst
      ch_->Release(&p);
      return st;
    }
    if (st.code() == Code::kUnauthenticated && !regranted) {
      regranted = true;  // the worker restarted, or the grant expired: a new one for the same version
      RETURN_IF_ERROR(Regrant(f));
      continue;
    }
    if (st.IsVersionChanged()) ForgetChanged(f.path, f.info.attr().ino());  // the next open asks the master
    if (st.code() != Code::kUnavailable || !backoff.SleepBefore(deadline)) {
      return Status(st.code(), f.path + ": " + st.message(), st.reason());
    }
  }
}

StatusOr<uint64_t> Client::Read(File& f, uint64_t offset, uint64_t length, char* dst) {
  RETURN_IF_ERROR(CheckProcess());
  const uint64_t size = f.size();
  if (offset >= size || length == 0) return uint64_t{0};
  length = std::min(length, size - offset);
  const uint64_t bs = f.info.block_size() == 0 ? size : f.info.block_size();
  uint64_t done = 0;
  while (done < length) {
    const uint64_t at = offset + done;
    const uint64_t index = at / bs;
    const uint64_t in_block = at % bs;
    const uint64_t n = std::min(length - done, bs - in_block);
    RETURN_IF_ERROR(ReadBlockRange(f, index, in_block, n, dst + done));
    done += n;
  }
  return done;
}

}  // namespace granary::python
