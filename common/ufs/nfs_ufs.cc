#include "common/ufs/nfs_ufs.h"

#include <fcntl.h>
#include <nfsc/libnfs.h>
#include <spdlog/spdlog.h>
#include <sys/stat.h>

#include <unistd.h>

#include <atomic>
#include <cstring>

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
  if (err == EACCES || err == EPERM) return PermissionDeniedError(what + ": permission denied by the NFS server");
  return UnavailableError(what + ": " + (detail.empty() ? std::string(strerror(err)) : detail));
}

std::string Abs(const std::string& path) { return "/" + path; }

}  // namespace

StatusOr<std::shared_ptr<UnderFileSystem>> NfsUfs::Open(const std::string& uri,
                                                        const std::map<std::string, std::string>& options) {
  size_t connections = 4;
  for (const auto& [k, v] : options) {
    if (k != "connections") return InvalidArgumentError("unknown nfs mount option '" + k + "'");
    ASSIGN_OR_RETURN(uint64_t n, ParseUint(v));
    connections = std::clamp<uint64_t>(n, 1, 64);
  }
  std::shared_ptr<NfsUfs> ufs(new NfsUfs(uri));
  ASSIGN_OR_RETURN(nfs_context * first, ufs->Connect());
  {
    std::lock_guard<std::mutex> lock(ufs->mu_);
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

StatusOr<nfs_context*> NfsUfs::Connect() {
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
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return !idle_.empty() || missing_ > 0; });
    if (!idle_.empty()) {
      nfs_context* c = idle_.back();
      idle_.pop_back();
      return c;
    }
    --missing_;
  }
  auto c = Connect();
  if (!c.ok()) {
    std::lock_guard<std::mutex> lock(mu_);
    ++missing_;
    cv_.notify_one();
  }
  return c;
}

void NfsUfs::Release(nfs_context* c, bool broken) {
  if (broken) nfs_destroy_context(c);
  std::lock_guard<std::mutex> lock(mu_);
  if (broken) {
    ++missing_;
  } else {
    idle_.push_back(c);
  }
  cv_.notify_one();
}

StatusOr<UfsEntry> NfsUfs::Stat(const std::string& path) {
  RETURN_IF_ERROR(CheckRelativePath(path));
  ASSIGN_OR_RETURN(nfs_context * c, Acquire());
  nfs_stat_64 st{};
  int rc = nfs_stat64(c, Abs(path).c_str(), &st);
  Status err = rc == 0 ? Status::OK() : NfsError(rc, c, uri_ + "/" + path);
  Release(c, err.IsRetryable());
  RETURN_IF_ERROR(err);
  if (!S_ISDIR(st.nfs_mode) && !S_ISREG(st.nfs_mode)) return NotFoundError(path + " is not a file or directory");
  return EntryOf(path.substr(path.rfind('/') + 1), st);
}

Status NfsUfs::List(const std::string& dir, size_t page_size, const PageFn& on_page) {
  RETURN_IF_ERROR(CheckRelativePath(dir));
  // Read the names with one context, then stat them: the listing is short-lived on the server.
  std::vector<std::string> names;
  {
    ASSIGN_OR_RETURN(nfs_context * c, Acquire());
    nfsdir* d = nullptr;
    int rc = nfs_opendir(c, Abs(dir).c_str(), &d);
    if (rc != 0) {
      Status st = NfsError(rc, c, uri_ + "/" + dir);
      Release(c, st.IsRetryable());
      return st;
    }
    while (nfsdirent* e = nfs_readdir(c, d)) {
      std::string name = e->name;
      if (name == "." || name == "..") continue;
      if (!IsValidName(name)) {
        spdlog::warn("skipping an entry of {}/{} whose name cannot be a file name", uri_, dir);
        continue;
      }
      names.push_back(std::move(name));
    }
    nfs_closedir(c, d);
    Release(c, false);
  }
  std::vector<UfsEntry> page;
  for (const auto& name : names) {
    auto e = Stat(JoinPath(dir, name));
    if (!e.ok()) {
      if (!e.status().IsNotFound()) return e.status();
      continue;  // removed meanwhile, or a special file
    }
    page.push_back(std::move(e).value());
    if (page.size() >= page_size) {
      RETURN_IF_ERROR(on_page(page));
      page.clear();
    }
  }
  if (!page.empty()) RETURN_IF_ERROR(on_page(page));
  return Status::OK();
}

StatusOr<size_t> NfsUfs::Read(const std::string& path, const std::string& version, uint64_t offset, size_t length,
                              char* out) {
  RETURN_IF_ERROR(CheckRelativePath(path));
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
  if (changed) return FailedPreconditionError(uri_ + "/" + path + " changed in the under-storage since it was listed");
  return done;
}

}  // namespace granary
