#include "python/client.h"

#include <sys/stat.h>

#include <cerrno>
#include <cstring>
#include <limits>

#include "common/backoff.h"

namespace granary::python {
namespace {

Entry FromAnswer(const rpc::AttrResponse& r, const std::string& grant, const std::string& data_grant) {
  Entry e;
  e.attr = r.attr();
  if (r.has_file() && !r.file().ufs_path().empty()) e.file = std::make_shared<const rpc::FileInfo>(r.file());
  e.grant = grant;
  e.data_grant = data_grant;
  return e;
}

}  // namespace

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
    call.mutable_inos()->Add(inos.begin(), inos.end());
    rpc::MetaAnswer a;
    return p->ch_.Meta(call, &a);
  });
  rpc::MetaCall root;
  root.set_op(rpc::MetaCall::ROOT);
  rpc::MetaAnswer a;
  // One call at once: a wrong path or a socket this user may not use is said here, not at the
  // first read.
  Status st = c->ch_.Meta(root, &a);
  if (!st.ok()) return Status(st.code(), "the worker's socket " + c->o_.socket + ": " + st.message());
  c->Remember("/", FromAnswer(a.entry(), a.grant(), a.data_grant()));
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
    Status st = ch_.Meta(call, out);
    if (st.code() != Code::kUnavailable || !backoff.SleepBefore(deadline)) return st;
  }
}

void Client::Remember(const std::string& clean, const Entry& e) {
  // Nothing below a writable mount is kept: every stat and open asks (close-to-open), as
  // granary-fuse does.
  if (e.attr.writable() && clean != "/") return;
  if (e.file != nullptr && notes_ != nullptr) notes_->Listed(e.attr.ino());  // before an open can find it
  MutexLock lock(&mu_);
  if (entries_.size() >= o_.max_entries) {
    entries_.clear();
    dirs_.clear();
  }
  entries_[clean] = Cached{e, Clock::now() + o_.metadata_ttl};
}

void Client::Forget() {
  MutexLock lock(&mu_);
  entries_.clear();
  dirs_.clear();
}

StatusOr<Entry> Client::Lookup(const std::string& clean) {
  {
    MutexLock lock(&mu_);
    auto it = entries_.find(clean);
    if (it != entries_.end() && (clean == "/" || it->second.expires > Clock::now())) return it->second.entry;
  }
  rpc::MetaCall call;
  rpc::MetaAnswer a;
  if (clean == "/") {
    call.set_op(rpc::MetaCall::ROOT);
    RETURN_IF_ERROR(Call(call, &a));
    Entry e = FromAnswer(a.entry(), a.grant(), a.data_grant());
    Remember(clean, e);
    return e;
  }
  const size_t slash = clean.rfind('/');
  const std::string parent_path = slash == 0 ? "/" : clean.substr(0, slash);
  ASSIGN_OR_RETURN(Entry parent, Lookup(parent_path));
  if (parent.attr.type() != rpc::DIRECTORY) {
    return FailedPreconditionError(parent_path + " is not a directory");
  }
  if (!parent.attr.writable() && ShouldList(parent.attr.ino())) {
    // A reader going through this directory: all of it in a few calls, not a LOOKUP per file.
    Status listed = ListInto(parent_path, parent, nullptr, o_.max_entries / 4);
    if (listed.ok() || listed.code() == Code::kOutOfRange) Listed(parent.attr.ino(), listed.ok());
    MutexLock lock(&mu_);
    auto it = entries_.find(clean);
    if (it != entries_.end() && it->second.expires > Clock::now()) return it->second.entry;
  }
  call.set_op(rpc::MetaCall::LOOKUP);
  call.set_ino(parent.attr.ino());
  call.set_grant(parent.grant);
  call.set_name(clean.substr(slash + 1));
  Status st = Call(call, &a);
  if (!st.ok()) {
    if (st.code() == Code::kNotFound) return NotFoundError(clean + ": no such file or directory");
    return Status(st.code(), clean + ": " + st.message(), st.reason());
  }
  Entry e = FromAnswer(a.entry(), a.grant(), a.data_grant());
  Remember(clean, e);
  return e;
}

StatusOr<Entry> Client::Stat(std::string_view path) {
  const std::string clean = Clean(path);
  auto e = Lookup(clean);
  if (e.status().code() == Code::kUnauthenticated) {
    Forget();  // the worker restarted: its grants are void; walk again
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
      Remember(clean == "/" ? "/" + de.name() : clean + "/" + de.name(), e);
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
  if (d.too_big || Clock::now() < d.listed + o_.metadata_ttl) return false;  // listed: a miss is a name not there
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
  const std::string clean = Clean(path);
  std::vector<std::pair<std::string, Entry>> out;
  for (int attempt = 0;; ++attempt) {
    ASSIGN_OR_RETURN(Entry dir, Stat(clean));
    if (dir.attr.type() != rpc::DIRECTORY) return FailedPreconditionError(clean + " is not a directory");
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
  const std::string clean = Clean(path);
  Entry e;
  {
    MutexLock lock(&mu_);
    auto it = entries_.find(clean);
    if (it == entries_.end() || it->second.expires <= Clock::now()) return nullptr;
    e = it->second.entry;
  }
  if (e.attr.type() != rpc::REGULAR || e.file == nullptr || e.attr.writable()) return nullptr;
  if (!e.grant.empty() && (static_cast<unsigned char>(e.grant[0]) & 4u) == 0) return nullptr;  // Open says why
  auto f = std::make_shared<File>();
  f->path = clean;
  f->info = *e.file;
  f->set_grant(e.data_grant);
  notes_->Opened(e.attr.ino());
  return f;
}

StatusOr<std::shared_ptr<File>> Client::Open(std::string_view path) {
  const std::string clean = Clean(path);
  for (int attempt = 0;; ++attempt) {
    ASSIGN_OR_RETURN(Entry e, Stat(clean));
    if (e.attr.type() == rpc::DIRECTORY) return InvalidArgumentError(clean + " is a directory");
    // A grant's first byte is the entry's permission bits for this user (worker/meta_proxy.h);
    // the worker refuses the read anyway: said here, plainly.
    if (!e.grant.empty() && (static_cast<unsigned char>(e.grant[0]) & 4u) == 0) {
      return PermissionDeniedError(clean + ": permission denied (the file's mode does not let this user read it)");
    }
    auto f = std::make_shared<File>();
    f->path = clean;
    if (e.file != nullptr && !e.attr.writable()) {
      f->info = *e.file;
      f->set_grant(e.data_grant);
      notes_->Opened(e.attr.ino());
      return f;
    }
    // No information with the entry (due for a check with the under-storage) or a writable mount
    // (close-to-open): the master says now.
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
    Remember(clean, FromAnswer(a.entry(), a.grant(), a.data_grant()));
    return f;
  }
}

Status Client::Regrant(File& f) {
  Forget();
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
    Status st = ch_.Read(req, &p, false, nullptr, dst, f.grant());
    if (st.ok()) {
      if (p.length != length) {
        st = DataLossError("the worker answered " + std::to_string(p.length) + " bytes for " + std::to_string(length));
      } else if (p.fd >= 0) {
        st = fuse::LocalChannel::ReadInto(p, dst);  // a leased block file (pread) or the pipe
      } else if (p.mem == nullptr) {
        std::memcpy(dst, p.data.data(), length);
      }  // else: received straight into dst
      ch_.Release(&p);
      return st;
    }
    if (st.code() == Code::kUnauthenticated && !regranted) {
      regranted = true;  // the worker restarted: a new grant for the same version, or the file changed
      RETURN_IF_ERROR(Regrant(f));
      continue;
    }
    if (st.code() != Code::kUnavailable || !backoff.SleepBefore(deadline)) {
      return Status(st.code(), f.path + ": " + st.message(), st.reason());
    }
  }
}

StatusOr<uint64_t> Client::Read(File& f, uint64_t offset, uint64_t length, char* dst) {
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
