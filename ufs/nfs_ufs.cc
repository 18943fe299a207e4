#include "ufs/nfs_ufs.h"

#include <fcntl.h>
#include <nfsc/libnfs.h>
#include <nfsc/libnfs-raw.h>
#include <nfsc/libnfs-raw-nfs4.h>
#include <poll.h>
#include <spdlog/spdlog.h>
#include <sys/stat.h>

#include <unistd.h>

#include <atomic>
#include <random>
#include <cstring>
#include <optional>

#include "common/net.h"
#include "common/units.h"

namespace granary {
namespace {

std::string VersionOf(const nfs_stat_64& st) {
  return std::to_string(st.nfs_size) + "-" + std::to_string(st.nfs_mtime * 1'000'000'000 + st.nfs_mtime_nsec) + "-" +
         std::to_string(st.nfs_ino);
}

UfsEntry EntryOf(const std::string& name, const nfs_stat_64& st) {
  UfsEntry e;
  e.name = name;
  e.is_dir = S_ISDIR(st.nfs_mode);
  e.size = e.is_dir ? 0 : st.nfs_size;
  e.mtime_ns = static_cast<int64_t>(st.nfs_mtime * 1'000'000'000 + st.nfs_mtime_nsec);
  e.mode = st.nfs_mode & 07777;
  e.uid = static_cast<uint32_t>(st.nfs_uid);
  e.gid = static_cast<uint32_t>(st.nfs_gid);
  if (!e.is_dir) e.version = VersionOf(st);
  return e;
}

Status NfsError(int rc, nfs_context* c, const std::string& what) {
  std::string detail = c ? nfs_get_error(c) : "";
  int err = -rc;
  if (err == ENOENT || err == ENOTDIR) return NotFoundError(what + " does not exist");
  if (err == EEXIST || err == ENOTEMPTY || err == ENOSPC || err == EDQUOT || err == EISDIR || err == EROFS) {
    return ErrnoError(err, what);
  }
  if (err == EACCES || err == EPERM) return PermissionDeniedError(what + ": permission denied by the NFS server");
  return UnavailableError(what + ": " + (detail.empty() ? std::string(strerror(err)) : detail));
}

std::string Abs(const std::string& path) { return "/" + path; }

// "/a/b" or "a/b" -> {..., "a", "b"}.
void AppendComponents(const std::string& path, std::vector<std::string>& out) {
  for (size_t start = 0; start < path.size();) {
    size_t slash = std::min(path.find('/', start), path.size());
    if (slash > start) out.push_back(path.substr(start, slash - start));
    start = slash + 1;
  }
}

Status Nfs4Error(int status, const std::string& what) {
  switch (status) {
    case NFS4ERR_NOENT:
    case NFS4ERR_NOTDIR:
      return NotFoundError(what + " does not exist or is not a directory");
    case NFS4ERR_ACCESS:
    case NFS4ERR_PERM:
      return PermissionDeniedError(what + ": permission denied by the NFS server");
    default:
      return UnavailableError(what + ": NFS server answered READDIR with NFSv4 status " + std::to_string(status));
  }
}

// Reads the XDR encoding of the attributes NfsUfs::ReaddirPage asks for, in attribute order.
class XdrReader {
 public:
  XdrReader(const char* p, size_t n) : p_(reinterpret_cast<const unsigned char*>(p)), n_(n) {}
  bool U32(uint32_t& v) {
    if (n_ - at_ < 4) return false;
    v = (uint32_t{p_[at_]} << 24) | (uint32_t{p_[at_ + 1]} << 16) | (uint32_t{p_[at_ + 2]} << 8) | p_[at_ + 3];
    at_ += 4;
    return true;
  }
  bool U64(uint64_t& v) {
    uint32_t hi, lo;
    if (!U32(hi) || !U32(lo)) return false;
    v = (uint64_t{hi} << 32) | lo;
    return true;
  }
  bool String(std::string& s) {
    uint32_t len;
    if (!U32(len) || len > n_ - at_) return false;
    s.assign(reinterpret_cast<const char*>(p_ + at_), len);
    at_ += (len + 3) & ~3u;
    if (at_ > n_) at_ = n_;
    return true;
  }

 private:
  const unsigned char* p_;
  size_t n_, at_ = 0;
};

bool HasAttr(const bitmap4& mask, int attr) {
  size_t word = static_cast<size_t>(attr) / 32;
  return word < mask.bitmap4_len && (mask.bitmap4_val[word] >> (attr % 32)) & 1u;
}

uint32_t NumericOwner(const std::string& s) {
  uint32_t v = 0;
  for (char ch : s) {
    if (ch < '0' || ch > '9') break;
    v = v * 10 + static_cast<uint32_t>(ch - '0');
  }
  return v;
}

// The entry for one READDIR result; nullopt for what is not a file or directory (`*is_link` says
// whether it is a symbolic link, which the caller resolves). Versions are built exactly as
// nfs_stat64 results are (VersionOf), so listing and Stat agree.
StatusOr<std::optional<UfsEntry>> DecodeEntry(const std::string& name, const fattr4& attrs, bool* is_link) {
  for (int a : {FATTR4_TYPE, FATTR4_SIZE, FATTR4_FILEID, FATTR4_MODE, FATTR4_TIME_MODIFY}) {
    if (!HasAttr(attrs.attrmask, a)) {
      return UnavailableError("the NFS server returned no attribute " + std::to_string(a) + " for '" + name + "'");
    }
  }
  for (u_int w = 0; w < attrs.attrmask.bitmap4_len; ++w) {
    uint32_t known = w == 0 ? (1u << FATTR4_TYPE) | (1u << FATTR4_SIZE) | (1u << FATTR4_FILEID)
                     : w == 1 ? (1u << (FATTR4_MODE - 32)) | (1u << (FATTR4_OWNER - 32)) |
                                    (1u << (FATTR4_OWNER_GROUP - 32)) | (1u << (FATTR4_TIME_MODIFY - 32))
                              : 0;
    if (attrs.attrmask.bitmap4_val[w] & ~known) return UnavailableError("the NFS server returned attributes it was not asked for");
  }
  XdrReader x(attrs.attr_vals.attrlist4_val, attrs.attr_vals.attrlist4_len);
  uint32_t type = 0, mode = 0, nsec = 0;
  uint64_t size = 0, fileid = 0, sec = 0;
  std::string owner = "0", group = "0";
  bool ok = x.U32(type) && x.U64(size) && x.U64(fileid) && x.U32(mode) &&
            (!HasAttr(attrs.attrmask, FATTR4_OWNER) || x.String(owner)) &&
            (!HasAttr(attrs.attrmask, FATTR4_OWNER_GROUP) || x.String(group)) && x.U64(sec) && x.U32(nsec);
  if (!ok) return UnavailableError("the NFS server sent truncated attributes for '" + name + "'");
  *is_link = type == NF4LNK;
  if (type != NF4REG && type != NF4DIR) return std::optional<UfsEntry>();
  nfs_stat_64 st{};
  st.nfs_mode = (type == NF4DIR ? S_IFDIR : S_IFREG) | (mode & 07777);
  st.nfs_size = size;
  st.nfs_ino = fileid;
  st.nfs_mtime = sec;
  st.nfs_mtime_nsec = nsec;
  st.nfs_uid = NumericOwner(owner);
  st.nfs_gid = NumericOwner(group);
  return std::optional<UfsEntry>(EntryOf(name, st));
}

}  // namespace

StatusOr<std::shared_ptr<UnderFileSystem>> NfsUfs::Open(const std::string& uri,
                                                        const std::map<std::string, std::string>& options) {
  size_t connections = 4;
  auto rest = options;
  ASSIGN_OR_RETURN(UfsRetry retry, UfsRetry::FromOptions(&rest));
  for (const auto& [k, v] : rest) {
    if (k != "connections") {
      return InvalidArgumentError("unknown nfs mount option '" + k +
                                  "' (nfs:// takes connections, max_attempts and retry_deadline)");
    }
    ASSIGN_OR_RETURN(uint64_t n, ParseUint(v));
    connections = std::clamp<uint64_t>(n, 1, 64);
  }
  std::shared_ptr<NfsUfs> ufs(new NfsUfs(uri));
  ufs->retry_ = retry;
  std::string export_path;
  ASSIGN_OR_RETURN(nfs_context * first, ufs->Connect(&export_path));
  AppendComponents(export_path, ufs->export_components_);
  {
    MutexLock lock(&ufs->mu_);
    ufs->idle_.push_back(first);
    ufs->missing_ = connections - 1;  // connected when first needed
  }
  ASSIGN_OR_RETURN(UfsEntry root, ufs->Stat(""));
  if (!root.is_dir) return InvalidArgumentError(uri + " is not a directory");
  return std::shared_ptr<UnderFileSystem>(ufs);
}

NfsUfs::~NfsUfs() {
  for (nfs_context* c : idle_) nfs_destroy_context(c);
}

StatusOr<nfs_context*> NfsUfs::Connect(std::string* export_path) {
  nfs_context* c = nfs_init_context();
  if (c == nullptr) return InternalError("cannot create an NFS context");
  nfs_set_timeout(c, 30000);
  // Every NFSv4 connection needs its own client identity: contexts sharing one would each expire
  // the others' open state on the server.
  static std::atomic<uint64_t> seq{0};
  std::string id = "granary-" + HostName() + "-" + std::to_string(getpid()) + "-" + std::to_string(seq++);
  nfs4_set_client_name(c, id.c_str());
  std::string url = uri_;
  if (url.find("version=") == std::string::npos) url += (url.find('?') == std::string::npos ? "?" : "&") + std::string("version=4");
  nfs_url* u = nfs_parse_url_dir(c, url.c_str());
  if (u == nullptr) {
    std::string err = nfs_get_error(c);
    nfs_destroy_context(c);
    return InvalidArgumentError("'" + uri_ + "' is not an NFS URL (nfs://server/export/path): " + err);
  }
  int rc = nfs_mount(c, u->server, u->path);
  std::string where = std::string(u->server) + ":" + u->path;
  if (export_path != nullptr) *export_path = u->path;
  nfs_destroy_url(u);
  if (rc != 0) {
    Status st = NfsError(rc, c, "NFS export " + where);
    nfs_destroy_context(c);
    return st;
  }
  return c;
}

StatusOr<nfs_context*> NfsUfs::Acquire() {
  {
    MutexLock lock(&mu_);
    while (idle_.empty() && missing_ == 0) lock.Wait(&cv_);
    if (!idle_.empty()) {
      nfs_context* c = idle_.back();
      idle_.pop_back();
      return c;
    }
    --missing_;
  }
  auto c = Connect();
  if (!c.ok()) {
    MutexLock lock(&mu_);
    ++missing_;
    cv_.notify_one();
  }
  return c;
}

void NfsUfs::Release(nfs_context* c, bool broken) {
  if (broken) nfs_destroy_context(c);
  MutexLock lock(&mu_);
  if (broken) {
    ++missing_;
  } else {
    idle_.push_back(c);
  }
  cv_.notify_one();
}

StatusOr<UfsEntry> NfsUfs::Stat(const std::string& path) {
  RETURN_IF_ERROR(CheckRelativePath(path));
  return RetryUfsCall(retry_, [&]() -> StatusOr<UfsEntry> {
    ASSIGN_OR_RETURN(nfs_context * c, Acquire());
    auto e = StatOn(c, path);
    Release(c, e.status().IsRetryable());  // a broken connection is replaced for the next try
    return e;
  });
}

StatusOr<UfsEntry> NfsUfs::StatOn(nfs_context* c, const std::string& path) {
  nfs_stat_64 st{};
  int rc = nfs_stat64(c, Abs(path).c_str(), &st);
  if (rc != 0) return NfsError(rc, c, uri_ + "/" + path);
  if (!S_ISDIR(st.nfs_mode) && !S_ISREG(st.nfs_mode)) return NotFoundError(path + " is not a file or directory");
  return EntryOf(path.substr(path.rfind('/') + 1), st);
}

Status NfsUfs::List(const std::string& dir, size_t page_size, const PageFn& on_page) {
  RETURN_IF_ERROR(CheckRelativePath(dir));
  std::vector<std::string> path = export_components_;
  AppendComponents(dir, path);
  // A listing is tried again only while it has handed no page on: the caller has no way to take
  // back what it was given.
  bool handed_on = false;
  return RetryUfsCall(
      retry_, [&] { return ListOnce(path, dir, page_size, on_page, &handed_on); }, [&] { return !handed_on; });
}

Status NfsUfs::ListOnce(const std::vector<std::string>& path, const std::string& dir, size_t page_size,
                        const PageFn& on_page, bool* handed_on) {
  // One context for the whole listing: the cookies are only good against the same server state.
  ASSIGN_OR_RETURN(nfs_context * c, Acquire());
  ReaddirCursor cursor;
  std::vector<UfsEntry> page;
  Status rpc = Status::OK(), caller = Status::OK();
  while (rpc.ok() && caller.ok() && !cursor.eof) {
    std::vector<UfsEntry> got;  // one server reply: kReaddirBytes of entries
    rpc = ReaddirPage(c, path, dir, cursor, got);
    for (size_t i = 0; rpc.ok() && caller.ok() && i < got.size(); ++i) {
      page.push_back(std::move(got[i]));
      if (page.size() >= page_size) {
        *handed_on = true;
        caller = on_page(page);
        page.clear();
      }
    }
  }
  Release(c, rpc.IsRetryable());
  RETURN_IF_ERROR(rpc);
  RETURN_IF_ERROR(caller);
  if (!page.empty()) {
    *handed_on = true;
    RETURN_IF_ERROR(on_page(page));
  }
  return Status::OK();
}

Status NfsUfs::ReaddirPage(nfs_context* c, const std::vector<std::string>& path, const std::string& dir,
                           ReaddirCursor& cursor, std::vector<UfsEntry>& out) {
  // COMPOUND { PUTROOTFH, LOOKUP component..., READDIR(cookie, verifier, attributes) }.
  std::vector<nfs_argop4> ops(path.size() + 2);
  ops[0].argop = OP_PUTROOTFH;
  for (size_t i = 0; i < path.size(); ++i) {
    ops[i + 1].argop = OP_LOOKUP;
    ops[i + 1].nfs_argop4_u.oplookup.objname.utf8string_len = static_cast<u_int>(path[i].size());
    ops[i + 1].nfs_argop4_u.oplookup.objname.utf8string_val = const_cast<char*>(path[i].data());
  }
  uint32_t mask[2] = {(1u << FATTR4_TYPE) | (1u << FATTR4_SIZE) | (1u << FATTR4_FILEID),
                      (1u << (FATTR4_MODE - 32)) | (1u << (FATTR4_OWNER - 32)) |
                          (1u << (FATTR4_OWNER_GROUP - 32)) | (1u << (FATTR4_TIME_MODIFY - 32))};
  READDIR4args& rd = ops.back().nfs_argop4_u.opreaddir;
  ops.back().argop = OP_READDIR;
  rd.cookie = cursor.cookie;
  std::memcpy(rd.cookieverf, cursor.verifier, NFS4_VERIFIER_SIZE);
  rd.dircount = kReaddirBytes / 4;
  rd.maxcount = kReaddirBytes;
  rd.attr_request.bitmap4_len = 2;
  rd.attr_request.bitmap4_val = mask;
  COMPOUND4args args{};
  args.argarray.argarray_len = static_cast<u_int>(ops.size());
  args.argarray.argarray_val = ops.data();

  const std::string what = uri_ + "/" + dir;
  struct Reply {
    bool done = false;
    Status status = Status::OK();
    ReaddirCursor* cursor;
    std::vector<UfsEntry>* out;
    const std::string* what;
    std::vector<std::string> links;
  } reply{false, Status::OK(), &cursor, &out, &what, {}};
  // libnfs frees the reply after this callback returns: everything is decoded here.
  rpc_cb cb = [](rpc_context*, int status, void* data, void* priv) {
    auto* r = static_cast<Reply*>(priv);
    r->done = true;
    if (status != RPC_STATUS_SUCCESS) {
      r->status = UnavailableError(*r->what + ": NFS READDIR failed: " +
                                   (status == RPC_STATUS_ERROR && data ? static_cast<const char*>(data)
                                    : status == RPC_STATUS_TIMEOUT     ? "timed out"
                                                                       : "cancelled"));
      return;
    }
    auto* res = static_cast<COMPOUND4res*>(data);
    if (res->status != NFS4_OK || res->resarray.resarray_len == 0) {
      r->status = Nfs4Error(res->status, *r->what);
      return;
    }
    const READDIR4res& rr = res->resarray.resarray_val[res->resarray.resarray_len - 1].nfs_resop4_u.opreaddir;
    const READDIR4resok& ok = rr.READDIR4res_u.resok4;
    std::memcpy(r->cursor->verifier, ok.cookieverf, NFS4_VERIFIER_SIZE);
    for (const entry4* e = ok.reply.entries; e != nullptr; e = e->nextentry) {
      r->cursor->cookie = e->cookie;
      std::string name(e->name.utf8string_val, e->name.utf8string_len);
      if (name == "." || name == ".." || IsWritingName(name)) continue;  // writers' temporary files too
      if (!IsValidName(name)) {
        spdlog::warn("skipping an entry of {} whose name cannot be a file name", *r->what);
        continue;
      }
      bool is_link = false;
      auto entry = DecodeEntry(name, e->attrs, &is_link);
      if (!entry.ok()) {
        r->status = entry.status();
        return;
      }
      if (entry->has_value()) r->out->push_back(std::move(**entry));
      if (is_link) r->links.push_back(std::move(name));
    }
    r->cursor->eof = ok.reply.eof != 0;
  };
  if (rpc_nfs4_compound_async(nfs_get_rpc_context(c), cb, &args, &reply) != 0) {
    return UnavailableError(what + ": cannot send an NFS READDIR: " + nfs_get_error(c));
  }
  // Drive the context until the reply (or libnfs's own timeout, nfs_set_timeout) arrives.
  while (!reply.done) {
    pollfd pfd{nfs_get_fd(c), static_cast<short>(nfs_which_events(c)), 0};
    int n = poll(&pfd, 1, 100);
    if (n < 0 && errno != EINTR) return UnavailableError(what + ": poll: " + strerror(errno));
    if (nfs_service(c, n > 0 ? pfd.revents : 0) < 0 && !reply.done) {
      return UnavailableError(what + ": NFS connection failed: " + nfs_get_error(c));
    }
  }
  RETURN_IF_ERROR(reply.status);
  // A symbolic link is listed as what it points to, as file:// does; dangling links are skipped.
  for (const std::string& name : reply.links) {
    auto target = StatOn(c, JoinPath(dir, name));
    if (target.ok()) {
      out.push_back(std::move(target).value());
    } else if (!target.status().IsNotFound()) {
      return target.status();
    }
  }
  return Status::OK();
}

StatusOr<size_t> NfsUfs::Read(const std::string& path, const std::string& version, uint64_t offset, size_t length,
                              char* out) {
  RETURN_IF_ERROR(CheckRelativePath(path));
  // A read writes only `out`, and a retry writes the same bytes of the same version (or fails
  // with the version changed): safe to try again.
  return RetryUfsCall(retry_, [&] { return ReadOnce(path, version, offset, length, out); });
}

StatusOr<size_t> NfsUfs::ReadOnce(const std::string& path, const std::string& version, uint64_t offset,
                                  size_t length, char* out) {
  ASSIGN_OR_RETURN(nfs_context * c, Acquire());
  Status st = Status::OK();
  size_t done = 0;
  bool changed = false;
  nfsfh* fh = nullptr;
  int rc = nfs_open(c, Abs(path).c_str(), O_RDONLY, &fh);
  if (rc != 0) st = NfsError(rc, c, uri_ + "/" + path);
  nfs_stat_64 attr{};
  if (st.ok()) {
    rc = nfs_fstat64(c, fh, &attr);
    if (rc != 0) st = NfsError(rc, c, uri_ + "/" + path);
    changed = rc == 0 && VersionOf(attr) != version;
  }
  constexpr size_t kMaxRead = 1 << 20;
  while (st.ok() && !changed && done < length) {
    rc = nfs_pread(c, fh, offset + done, std::min(kMaxRead, length - done), out + done);
    if (rc < 0) st = NfsError(rc, c, uri_ + "/" + path);
    if (rc <= 0) break;
    done += static_cast<size_t>(rc);
  }
  if (st.ok() && !changed) {
    // A writer that raced with this read shows up as a new size or mtime.
    rc = nfs_fstat64(c, fh, &attr);
    if (rc != 0) st = NfsError(rc, c, uri_ + "/" + path);
    changed = rc == 0 && VersionOf(attr) != version;
  }
  if (fh != nullptr) nfs_close(c, fh);
  Release(c, st.IsRetryable());
  RETURN_IF_ERROR(st);
  if (changed) return VersionChangedError(uri_ + "/" + path + " changed in the under-storage since it was listed");
  return done;
}

// ---- writes ----

// A new file written to a hidden temporary name on one context held for the writer's life, then
// renamed over the target.
class NfsWriter : public UfsWriter {
 public:
  NfsWriter(NfsUfs* fs, nfs_context* c, nfsfh* fh, std::string path, std::string temp)
      : fs_(fs), c_(c), fh_(fh), path_(std::move(path)), temp_(std::move(temp)) {}
  ~NfsWriter() override { Abort(); }

  // Debian 12's libnfs (4.0) encodes an NFSv4 WRITE in a 4 KiB buffer: at most kWriteChunk bytes
  // each. So the bytes go as many small WRITEs kept in flight together (kWritesInFlight), driven
  // on this writer's context until all are answered.
  static constexpr size_t kWriteChunk = 3584;
  static constexpr int kWritesInFlight = 256;

  Status Append(std::string_view data) override {
    if (fh_ == nullptr) return FailedPreconditionError("write to " + path_ + " after it was committed or aborted");
    struct Pending {
      int outstanding = 0;
      Status failed;
    } p;
    // Called from nfs_service (or from the context's end, with an error) while `p` lives: Append
    // does not return before every WRITE it sent is answered or the context is gone.
    auto cb = [](int err, nfs_context* c, void*, void* priv) {
      auto* pending = static_cast<Pending*>(priv);
      pending->outstanding--;
      if (err < 0 && pending->failed.ok()) pending->failed = NfsError(err, c, "WRITE");
    };
    size_t sent = 0;
    while ((sent < data.size() && p.failed.ok()) || p.outstanding > 0) {
      while (sent < data.size() && p.outstanding < kWritesInFlight && p.failed.ok()) {
        size_t n = std::min(kWriteChunk, data.size() - sent);
        if (nfs_pwrite_async(c_, fh_, offset_ + sent, n, data.data() + sent, cb, &p) != 0) {
          p.failed = UnavailableError(fs_->uri_ + "/" + path_ + ": cannot send an NFS WRITE: " + nfs_get_error(c_));
          break;
        }
        p.outstanding++;
        sent += n;
      }
      if (p.outstanding == 0) break;
      pollfd pfd{nfs_get_fd(c_), static_cast<short>(nfs_which_events(c_)), 0};
      int n = poll(&pfd, 1, 100);
      if (n < 0 && errno != EINTR) return Fail(UnavailableError(fs_->uri_ + "/" + path_ + ": poll: " + strerror(errno)));
      if (nfs_service(c_, n > 0 ? pfd.revents : 0) < 0) {
        // The connection broke with writes outstanding: their callbacks may never come.
        broken_ = true;
        return Fail(UnavailableError(fs_->uri_ + "/" + path_ + ": NFS connection failed: " + nfs_get_error(c_)));
      }
    }
    if (!p.failed.ok()) return Fail(Status(p.failed.code(), fs_->uri_ + "/" + path_ + ": " + p.failed.message()));
    offset_ += data.size();
    return Status::OK();
  }

  StatusOr<UfsEntry> Commit() override {
    if (fh_ == nullptr) return FailedPreconditionError("commit of " + path_ + " after it was committed or aborted");
    int rc = nfs_fsync(c_, fh_);
    if (rc != 0) return Fail(NfsError(rc, c_, fs_->uri_ + "/" + path_));
    // The entry of this writer's own file (size, mtime, inode: a rename keeps them), not of what a
    // later stat of the path might find another writer put there.
    nfs_stat_64 attr{};
    rc = nfs_fstat64(c_, fh_, &attr);
    if (rc != 0) return Fail(NfsError(rc, c_, fs_->uri_ + "/" + path_));
    nfs_close(c_, fh_);
    fh_ = nullptr;
    rc = nfs_rename(c_, Abs(temp_).c_str(), Abs(path_).c_str());
    if (rc != 0) return Fail(NfsError(rc, c_, "rename into " + fs_->uri_ + "/" + path_));
    fs_->Release(c_, false);
    c_ = nullptr;
    return EntryOf(path_.substr(path_.rfind('/') + 1), attr);
  }

  // On the temporary file (SETATTR: the server checks what this client's credentials may set).
  Status SetAttrs(const UfsAttrChange& change) override {
    if (fh_ == nullptr) return FailedPreconditionError("setattr of " + path_ + " after it was committed or aborted");
    int rc = 0;
    if (change.uid || change.gid) {
      rc = nfs_fchown(c_, fh_, change.uid ? static_cast<int>(*change.uid) : -1,
                      change.gid ? static_cast<int>(*change.gid) : -1);
      if (rc != 0) return NfsError(rc, c_, "chown " + fs_->uri_ + "/" + path_);
    }
    if (change.mode) {
      rc = nfs_fchmod(c_, fh_, static_cast<int>(*change.mode & 07777));
      if (rc != 0) return NfsError(rc, c_, "chmod " + fs_->uri_ + "/" + path_);
    }
    if (change.atime_ns || change.mtime_ns) {
      // libnfs sets both times (microseconds): one not asked for keeps what the file has.
      nfs_stat_64 attr{};
      rc = nfs_fstat64(c_, fh_, &attr);
      if (rc != 0) return NfsError(rc, c_, "stat " + fs_->uri_ + "/" + path_);
      auto tv = [](std::optional<int64_t> ns, uint64_t sec, uint64_t nsec) {
        const int64_t v = ns ? *ns : static_cast<int64_t>(sec * 1'000'000'000 + nsec);
        timeval t{};
        t.tv_sec = static_cast<time_t>(v / 1'000'000'000);
        t.tv_usec = static_cast<suseconds_t>((v % 1'000'000'000) / 1000);
        if (t.tv_usec < 0) {
          t.tv_usec += 1'000'000;
          t.tv_sec -= 1;
        }
        return t;
      };
      timeval times[2] = {tv(change.atime_ns, attr.nfs_atime, attr.nfs_atime_nsec),
                          tv(change.mtime_ns, attr.nfs_mtime, attr.nfs_mtime_nsec)};
      rc = nfs_utimes(c_, Abs(temp_).c_str(), times);
      if (rc != 0) return NfsError(rc, c_, "set the times of " + fs_->uri_ + "/" + path_);
    }
    return Status::OK();
  }

  void Abort() override {
    if (c_ == nullptr) return;
    if (fh_ != nullptr) nfs_close(c_, fh_);
    fh_ = nullptr;
    nfs_unlink(c_, Abs(temp_).c_str());
    fs_->Release(c_, broken_);
    c_ = nullptr;
  }

 private:
  Status Fail(Status st) {
    broken_ = broken_ || st.IsRetryable();
    Abort();
    return st;
  }
  NfsUfs* const fs_;
  nfs_context* c_;
  nfsfh* fh_;
  const std::string path_, temp_;
  uint64_t offset_ = 0;
  bool broken_ = false;
};

// No write through a symbolic link: every directory on the way to `path`'s last component is looked
// at with LSTAT first (libnfs resolves paths itself and would follow one). PERMISSION_DENIED names a
// link; a link swapped in between the look and the call is the server's to stop (docs/security.md).
Status NfsUfs::CheckNoLinks(nfs_context* c, const std::string& path) {
  for (size_t slash = path.find('/'); slash != std::string::npos; slash = path.find('/', slash + 1)) {
    const std::string dir = path.substr(0, slash);
    nfs_stat_64 st{};
    int rc = nfs_lstat64(c, Abs(dir).c_str(), &st);
    if (rc != 0) return NfsError(rc, c, "look up " + uri_ + "/" + dir);
    if ((st.nfs_mode & S_IFMT) == S_IFLNK) {
      return PermissionDeniedError(uri_ + "/" + dir + " is a symbolic link: writes through Granary never follow links");
    }
    if ((st.nfs_mode & S_IFMT) != S_IFDIR) return Status(Code::kFailedPrecondition, uri_ + "/" + dir + " is not a directory");
  }
  return Status::OK();
}

StatusOr<std::unique_ptr<UfsWriter>> NfsUfs::Create(const std::string& path, uint32_t mode, const WriteCaller& as) {
  RETURN_IF_ERROR(CheckRelativePath(path));
  if (path.empty()) return InvalidArgumentError("cannot write the mount's root directory as a file");
  thread_local std::mt19937_64 rng(std::random_device{}());
  char suffix[17];
  std::snprintf(suffix, sizeof suffix, "%016llx", static_cast<unsigned long long>(rng()));
  size_t slash = path.rfind('/');
  std::string temp = (slash == std::string::npos ? std::string() : path.substr(0, slash + 1)) +
                     std::string(kWritingPrefix) + suffix;
  ASSIGN_OR_RETURN(nfs_context * c, Acquire());
  if (Status links = CheckNoLinks(c, path); !links.ok()) {
    Release(c, links.IsRetryable());
    return links;
  }
  nfsfh* fh = nullptr;
  // Not O_EXCL: an exclusive NFSv4 create sets the mode only afterwards, and the server then refuses
  // the writes (the random name is what keeps writers apart).
  int rc = nfs_create(c, Abs(temp).c_str(), O_WRONLY | O_CREAT | O_TRUNC, static_cast<int>(mode & 0777), &fh);
  if (rc != 0) {
    Status st = NfsError(rc, c, "create " + uri_ + "/" + path);
    Release(c, st.IsRetryable());
    return st;
  }
  // The writer's, where the server lets this client give files away (no root squashing); else the
  // server's choice stays (docs/semantics.md).
  if (as.uid != 0 || as.gid != 0) {
    rc = nfs_fchown(c, fh, static_cast<int>(as.uid), static_cast<int>(as.gid));
    if (rc != 0) spdlog::debug("NFS: the new file {} keeps the server's owner: {}", path, nfs_get_error(c));
  }
  return std::unique_ptr<UfsWriter>(new NfsWriter(this, c, fh, path, temp));
}

Status NfsUfs::Remove(const std::string& path, const WriteCaller&) {
  RETURN_IF_ERROR(CheckRelativePath(path));
  ASSIGN_OR_RETURN(nfs_context * c, Acquire());
  Status links = CheckNoLinks(c, path);
  int rc = links.ok() ? nfs_unlink(c, Abs(path).c_str()) : 0;
  if (!links.ok()) {
    Release(c, links.IsRetryable());
    return links;
  }
  Status st = rc == 0 ? Status::OK() : NfsError(rc, c, "remove " + uri_ + "/" + path);
  Release(c, st.IsRetryable());
  return st;
}

Status NfsUfs::MakeDir(const std::string& path, uint32_t mode, const WriteCaller& as) {
  RETURN_IF_ERROR(CheckRelativePath(path));
  ASSIGN_OR_RETURN(nfs_context * c, Acquire());
  Status st = CheckNoLinks(c, path);
  if (st.ok()) {
    int rc = nfs_mkdir2(c, Abs(path).c_str(), static_cast<int>(mode & 07777));
    st = rc == 0 ? Status::OK() : NfsError(rc, c, "make directory " + uri_ + "/" + path);
  }
  if (st.ok() && (as.uid != 0 || as.gid != 0)) {
    static_cast<void>(nfs_lchown(c, Abs(path).c_str(), static_cast<int>(as.uid), static_cast<int>(as.gid)));
  }
  Release(c, st.IsRetryable());
  return st;
}

Status NfsUfs::RemoveDir(const std::string& path, const WriteCaller&) {
  RETURN_IF_ERROR(CheckRelativePath(path));
  if (path.empty()) return InvalidArgumentError("cannot remove the mount's root directory");
  ASSIGN_OR_RETURN(nfs_context * c, Acquire());
  Status st = CheckNoLinks(c, path);
  if (st.ok()) {
    int rc = nfs_rmdir(c, Abs(path).c_str());
    st = rc == 0 ? Status::OK() : NfsError(rc, c, "remove directory " + uri_ + "/" + path);
  }
  Release(c, st.IsRetryable());
  return st;
}

Status NfsUfs::Rename(const std::string& from, const std::string& to, const WriteCaller&) {
  RETURN_IF_ERROR(CheckRelativePath(from));
  RETURN_IF_ERROR(CheckRelativePath(to));
  if (from.empty() || to.empty()) return InvalidArgumentError("cannot rename the mount's root directory");
  ASSIGN_OR_RETURN(nfs_context * c, Acquire());
  Status st = CheckNoLinks(c, from);
  if (st.ok()) st = CheckNoLinks(c, to);
  if (st.ok()) {
    int rc = nfs_rename(c, Abs(from).c_str(), Abs(to).c_str());
    st = rc == 0 ? Status::OK() : NfsError(rc, c, "rename " + uri_ + "/" + from + " to " + to);
  }
  Release(c, st.IsRetryable());
  return st;
}

Status NfsUfs::SetAttr(const std::string& path, const UfsAttrChange& change, const WriteCaller&) {
  RETURN_IF_ERROR(CheckRelativePath(path));
  ASSIGN_OR_RETURN(nfs_context * c, Acquire());
  Status st = CheckNoLinks(c, path);
  const std::string abs = Abs(path);
  auto call = [&](int rc, const char* what) {
    if (st.ok() && rc != 0) st = NfsError(rc, c, std::string(what) + " " + uri_ + "/" + path);
  };
  if (st.ok() && (change.uid || change.gid)) {
    // The server's rule for an id left as it is: the current one, read first.
    nfs_stat_64 cur{};
    call(nfs_lstat64(c, abs.c_str(), &cur), "stat");
    if (st.ok()) {
      call(nfs_lchown(c, abs.c_str(), static_cast<int>(change.uid.value_or(static_cast<uint32_t>(cur.nfs_uid))),
                      static_cast<int>(change.gid.value_or(static_cast<uint32_t>(cur.nfs_gid)))),
           "chown");
    }
  }
  if (st.ok() && change.mode) call(nfs_lchmod(c, abs.c_str(), static_cast<int>(*change.mode & 07777)), "chmod");
  if (st.ok() && (change.atime_ns || change.mtime_ns)) {
    nfs_stat_64 cur{};
    call(nfs_lstat64(c, abs.c_str(), &cur), "stat");
    auto tv = [](std::optional<int64_t> ns, uint64_t sec, uint64_t nsec) {
      timeval t{};
      int64_t v = ns ? *ns : static_cast<int64_t>(sec) * 1'000'000'000 + static_cast<int64_t>(nsec);
      t.tv_sec = static_cast<time_t>(v / 1'000'000'000);
      t.tv_usec = static_cast<suseconds_t>((v % 1'000'000'000) / 1000);
      return t;
    };
    timeval times[2] = {tv(change.atime_ns, cur.nfs_atime, cur.nfs_atime_nsec),
                        tv(change.mtime_ns, cur.nfs_mtime, cur.nfs_mtime_nsec)};
    if (st.ok()) call(nfs_lutimes(c, abs.c_str(), times), "set the times of");
  }
  Release(c, st.IsRetryable());
  return st;
}

}  // namespace granary
