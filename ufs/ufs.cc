#include "ufs/ufs.h"

#include <type_traits>

#include <algorithm>
#include <optional>

#include "common/tiers.h"
#include "common/units.h"
#include "ufs/local_ufs.h"
#include "ufs/nfs_ufs.h"
#include "ufs/s3_ufs.h"

namespace granary {

StatusOr<ParsedUri> ParseUri(const std::string& uri) {
  ParsedUri p;
  if (!uri.empty() && uri[0] == '/') {
    p.scheme = "file";
    p.path = uri;
    return p;
  }
  size_t sep = uri.find("://");
  if (sep == std::string::npos || sep == 0) {
    return InvalidArgumentError("'" + RedactUri(uri) +
                                "' is not an under-storage URI (use file:///path, or an absolute path)");
  }
  p.scheme = uri.substr(0, sep);
  std::string rest = uri.substr(sep + 3);
  if (size_t q = rest.find('?'); q != std::string::npos) {
    p.query = rest.substr(q + 1);
    rest.resize(q);
  }
  size_t slash = rest.find('/');
  p.authority = rest.substr(0, slash);
  p.path = slash == std::string::npos ? "" : rest.substr(slash);
  if (p.scheme != "file") {
    while (!p.path.empty() && p.path.front() == '/') p.path.erase(0, 1);
  }
  return p;
}

std::string RedactUri(const std::string& uri) {
  std::string out = uri;
  size_t q = out.find('?');
  if (q != std::string::npos) out.resize(q);
  size_t sep = out.find("://");
  if (sep != std::string::npos) {
    size_t start = sep + 3;
    size_t slash = out.find('/', start);
    size_t at = out.rfind('@', slash == std::string::npos ? out.size() : slash);
    if (at != std::string::npos && at >= start) out.erase(start, at - start + 1);
  }
  return out;
}

bool IsValidName(const std::string& name) {
  if (name.empty() || name == "." || name == ".." || name.size() > 255) return false;
  return name.find('/') == std::string::npos && name.find('\0') == std::string::npos;
}

Status CheckRelativePath(const std::string& path) {
  if (path.empty()) return Status::OK();
  size_t start = 0;
  while (start <= path.size()) {
    size_t end = path.find('/', start);
    if (end == std::string::npos) end = path.size();
    if (!IsValidName(path.substr(start, end - start))) {
      return InvalidArgumentError("'" + path + "' is not a valid path below the mount");
    }
    start = end + 1;
  }
  return Status::OK();
}

std::string JoinPath(const std::string& dir, const std::string& name) {
  return dir.empty() ? name : dir + "/" + name;
}

StatusOr<std::shared_ptr<UnderFileSystem>> OpenUnderFileSystem(const std::string& uri,
                                                                const std::map<std::string, std::string>& options,
                                                                const std::vector<std::string>& local_roots) {
  RETURN_IF_ERROR(RefuseInlineSecrets(options));
  ASSIGN_OR_RETURN(ParsedUri p, ParseUri(uri));
  if (p.scheme == "file") {
    if (!options.empty()) {
      return InvalidArgumentError("file:// mounts take no options (got '" + options.begin()->first + "')");
    }
    if (!p.authority.empty()) {
      return InvalidArgumentError("'" + RedactUri(uri) + "': file:// URIs have no host; write file:///path");
    }
    return LocalUfs::Open(p.path, local_roots);
  }
  if (p.scheme == "s3") {
    ASSIGN_OR_RETURN(S3Settings s, ResolveS3Settings(p.authority, p.path, options));
    return S3Ufs::Open(uri, std::move(s));
  }
  if (p.scheme == "oss") {
    ASSIGN_OR_RETURN(S3Settings s, ResolveOssSettings(p.authority, p.path, options));
    return S3Ufs::Open(uri, std::move(s));
  }
  if (p.scheme == "nfs") return NfsUfs::Open(uri, options);
  return UnimplementedError("under-storage scheme '" + p.scheme +
                            "://' is not supported (use file:///path, s3://bucket/prefix, oss://bucket/prefix or nfs://server/export)");
}

void ReadProgress::Landed(uint64_t n) {
  MutexLock lock(&mu_);
  if (n <= landed_.load(std::memory_order_relaxed)) return;
  landed_.store(n, std::memory_order_release);
  if (n >= wake_at_) {
    wake_at_ = UINT64_MAX;
    cv_.notify_all();
  }
}

void ReadProgress::Finish() {
  MutexLock lock(&mu_);
  finished_ = true;
  cv_.notify_all();
}

uint64_t ReadProgress::WaitFor(uint64_t n) {
  MutexLock lock(&mu_);
  while (landed_.load(std::memory_order_relaxed) < n && !finished_) {
    wake_at_ = std::min(wake_at_, n);
    lock.Wait(&cv_);
  }
  return landed_.load(std::memory_order_relaxed);
}

StatusOr<size_t> UnderFileSystem::ReadStreaming(const std::string& path, const std::string& version, uint64_t offset,
                                                size_t length, char* out, ReadProgress*) {
  return Read(path, version, offset, length, out);
}

StatusOr<size_t> UnderFileSystem::ReadWhole(const std::string& path, const std::string& version, size_t size,
                                            char* out, ReadProgress* progress) {
  return ReadStreaming(path, version, 0, size, out, progress);
}

StatusOr<LocalFile> UnderFileSystem::OpenLocal(const std::string&, const std::string&) {
  return UnimplementedError("the under-storage " + uri() + " is not a file of this machine");
}

Status UnderFileSystem::ListTree(const std::string& dir, size_t page_size, const PageFn& on_page,
                                 const std::string& after) {
  std::vector<UfsEntry> out;
  auto emit = [&](UfsEntry&& e) -> Status {
    out.push_back(std::move(e));
    if (out.size() < page_size) return Status::OK();
    RETURN_IF_ERROR(on_page(out));
    out.clear();
    return Status::OK();
  };
  // Lists `rel` (relative to `dir`): passes its files on when `files`, and returns its
  // subdirectories in name order.
  auto list = [&](const std::string& rel, bool files, std::vector<UfsEntry>* subdirs) -> Status {
    RETURN_IF_ERROR(List(rel.empty() ? dir : JoinPath(dir, rel), page_size, [&](std::vector<UfsEntry>& page) -> Status {
      for (auto& e : page) {
        e.name = rel.empty() ? e.name : rel + "/" + e.name;
        if (e.is_dir) {
          subdirs->push_back(std::move(e));
        } else if (files) {
          RETURN_IF_ERROR(emit(std::move(e)));
        }
      }
      return Status::OK();
    }));
    std::sort(subdirs->begin(), subdirs->end(), [](const UfsEntry& a, const UfsEntry& b) { return a.name < b.name; });
    return Status::OK();
  };
  // Directories still to walk, the next one last; each passes its own entry first when it has one.
  struct Next {
    std::string rel;
    std::optional<UfsEntry> entry;
  };
  std::vector<Next> stack;
  auto push_from = [&](std::vector<UfsEntry>& subdirs, size_t first) {
    for (size_t i = subdirs.size(); i-- > first;) {
      std::string rel = subdirs[i].name;
      stack.push_back(Next{std::move(rel), std::move(subdirs[i])});
    }
  };
  if (after.empty()) {
    stack.push_back(Next{"", std::nullopt});
  } else {
    // Back to where the earlier walk stopped. The directories above the checkpoint are listed
    // again only to find their subdirectories after the checkpoint's branch (walked later, in
    // order); the checkpoint's own directory was passing its files if the checkpoint is a file
    // (they are passed again, then every subdirectory is walked), and had passed them all if the
    // checkpoint is a subdirectory (walked next, its entry already passed).
    const bool at_dir = after.back() == '/';
    const std::string name = at_dir ? after.substr(0, after.size() - 1) : after;
    std::vector<std::string> parts;
    for (size_t start = 0;;) {
      size_t slash = name.find('/', start);
      parts.push_back(name.substr(start, slash == std::string::npos ? std::string::npos : slash - start));
      if (slash == std::string::npos) break;
      start = slash + 1;
    }
    std::string rel;
    for (size_t i = 0; i < parts.size(); ++i) {
      const bool last = i + 1 == parts.size();
      const std::string branch = rel.empty() ? parts[i] : rel + "/" + parts[i];
      std::vector<UfsEntry> subdirs;
      Status st = list(rel, false, &subdirs);
      if (st.IsNotFound() && i > 0) break;  // gone since: what comes after it is on the stack
      RETURN_IF_ERROR(st);
      auto later = std::upper_bound(subdirs.begin(), subdirs.end(), branch,
                                    [](const std::string& n, const UfsEntry& e) { return n < e.name; });
      const bool found = later != subdirs.begin() && std::prev(later)->name == branch;
      if (last && !at_dir) {
        // A file of `rel`: its files again, then all its subdirectories.
        subdirs.clear();
        st = list(rel, true, &subdirs);
        if (st.IsNotFound() && i > 0) break;
        RETURN_IF_ERROR(st);
        push_from(subdirs, 0);
        break;
      }
      push_from(subdirs, static_cast<size_t>(later - subdirs.begin()));
      if (!found) break;
      if (last) {
        stack.push_back(Next{branch, std::nullopt});
        break;
      }
      rel = branch;
    }
  }
  while (!stack.empty()) {
    Next next = std::move(stack.back());
    stack.pop_back();
    if (next.entry) RETURN_IF_ERROR(emit(std::move(*next.entry)));
    std::vector<UfsEntry> subdirs;
    Status st = list(next.rel, true, &subdirs);
    if (st.IsNotFound() && !next.rel.empty()) continue;  // removed while walking
    RETURN_IF_ERROR(st);
    push_from(subdirs, 0);
  }
  if (!out.empty()) RETURN_IF_ERROR(on_page(out));
  return Status::OK();
}

namespace {

thread_local uint64_t t_retries = 0;  // retries noted on this thread, ever

// Counts around every call; retries are what the wrapped call noted on this thread meanwhile.
class CountingUfs final : public UnderFileSystem {
 public:
  CountingUfs(std::shared_ptr<UnderFileSystem> inner, UfsCounters* c) : inner_(std::move(inner)), c_(c) {}
  const std::string& uri() const override { return inner_->uri(); }
  StatusOr<UfsEntry> Stat(const std::string& path) override {
    return Counted(&c_->stats, [&] { return inner_->Stat(path); });
  }
  // A listing's own callback may fail (the master's RocksDB): that error is passed on as it is,
  // not marked as the under-storage's.
  Status List(const std::string& dir, size_t page_size, const PageFn& on_page) override {
    Status from_caller;
    Status st = Counted(&c_->lists, [&] { return inner_->List(dir, page_size, Watch(on_page, &from_caller)); });
    return from_caller.ok() ? st : from_caller;
  }
  bool ListsTreeFlat() const override { return inner_->ListsTreeFlat(); }
  Status ListTree(const std::string& dir, size_t page_size, const PageFn& on_page, const std::string& after) override {
    Status from_caller;
    Status st = Counted(&c_->lists,
                        [&] { return inner_->ListTree(dir, page_size, Watch(on_page, &from_caller), after); });
    return from_caller.ok() ? st : from_caller;
  }
  StatusOr<size_t> Read(const std::string& path, const std::string& version, uint64_t offset, size_t length,
                        char* out) override {
    auto r = Counted(&c_->reads, [&] { return inner_->Read(path, version, offset, length, out); });
    if (r.ok()) c_->read_bytes += *r;
    return r;
  }
  StatusOr<size_t> ReadStreaming(const std::string& path, const std::string& version, uint64_t offset,
                                 size_t length, char* out, ReadProgress* progress) override {
    auto r = Counted(&c_->reads, [&] { return inner_->ReadStreaming(path, version, offset, length, out, progress); });
    if (r.ok()) c_->read_bytes += *r;
    return r;
  }
  StatusOr<size_t> ReadWhole(const std::string& path, const std::string& version, size_t size, char* out,
                             ReadProgress* progress) override {
    auto r = Counted(&c_->reads, [&] { return inner_->ReadWhole(path, version, size, out, progress); });
    if (r.ok()) c_->read_bytes += *r;
    return r;
  }
  StatusOr<LocalFile> OpenLocal(const std::string& path, const std::string& version) override {
    return inner_->OpenLocal(path, version);
  }
  StatusOr<std::unique_ptr<UfsWriter>> Create(const std::string& path, uint32_t mode, const WriteCaller& as) override {
    return Counted(&c_->writes, [&] { return inner_->Create(path, mode, as); });
  }
  bool CanAdopt(uint64_t dev) const override { return inner_->CanAdopt(dev); }
  StatusOr<UfsEntry> Adopt(const std::string& path, int fd, uint64_t size, uint32_t mode, const UfsAttrChange& attrs,
                           const WriteCaller& as) override {
    return Counted(&c_->writes, [&] { return inner_->Adopt(path, fd, size, mode, attrs, as); });
  }
  Status Remove(const std::string& path, const WriteCaller& as) override {
    return Counted(&c_->writes, [&] { return inner_->Remove(path, as); });
  }
  Status MakeDir(const std::string& path, uint32_t mode, const WriteCaller& as) override {
    return Counted(&c_->writes, [&] { return inner_->MakeDir(path, mode, as); });
  }
  Status RemoveDir(const std::string& path, const WriteCaller& as) override {
    return Counted(&c_->writes, [&] { return inner_->RemoveDir(path, as); });
  }
  Status Rename(const std::string& from, const std::string& to, const WriteCaller& as) override {
    return Counted(&c_->writes, [&] { return inner_->Rename(from, to, as); });
  }
  Status SetAttr(const std::string& path, const UfsAttrChange& change, const WriteCaller& as) override {
    return Counted(&c_->writes, [&] { return inner_->SetAttr(path, change, as); });
  }

 private:
  static PageFn Watch(const PageFn& on_page, Status* failed) {
    return [&on_page, failed](std::vector<UfsEntry>& page) {
      Status st = on_page(page);
      if (!st.ok()) *failed = st;
      return st;
    };
  }
  // One call: counted, its retries (noted on this thread meanwhile) added, a failure counted and
  // an UNAVAILABLE marked as the under-storage's (MarkUnderStorage).
  template <typename Fn>
  std::invoke_result_t<Fn> Counted(std::atomic<uint64_t>* calls, Fn call) {
    (*calls)++;
    uint64_t before = t_retries;
    auto result = call();
    c_->retries += t_retries - before;
    if (result.ok()) return result;
    c_->errors++;
    if constexpr (std::is_same_v<decltype(result), Status>) {
      return MarkUnderStorage(result);
    } else {
      return MarkUnderStorage(result.status());
    }
  }
  std::shared_ptr<UnderFileSystem> inner_;
  UfsCounters* c_;
};

}  // namespace

void NoteUfsRetry() { ++t_retries; }

StatusOr<UfsRetry> UfsRetry::FromOptions(std::map<std::string, std::string>* options) {
  UfsRetry r;
  if (auto it = options->find("max_attempts"); it != options->end()) {
    auto n = ParseUint(it->second);
    if (!n.ok()) return InvalidArgumentError("max_attempts: " + n.status().message());
    r.max_attempts = static_cast<int>(std::clamp<uint64_t>(*n, 1, 100));
    options->erase(it);
  }
  if (auto it = options->find("retry_deadline"); it != options->end()) {
    auto d = ParseDuration(it->second);
    if (!d.ok()) return InvalidArgumentError("retry_deadline: " + d.status().message());
    r.deadline = *d;
    options->erase(it);
  }
  return r;
}

Status MarkUnderStorage(const Status& s) {
  if (s.code() != Code::kUnavailable || s.reason() != Reason::kNone) return s;
  return Status(Code::kUnavailable, s.message(), Reason::kUnderStorage);
}

std::shared_ptr<UnderFileSystem> CountedUfs(std::shared_ptr<UnderFileSystem> ufs, UfsCounters* counters) {
  if (counters == nullptr) return ufs;
  return std::make_shared<CountingUfs>(std::move(ufs), counters);
}

Status UfsWriter::SetAttrs(const UfsAttrChange&) { return Status::OK(); }

bool UnderFileSystem::CanAdopt(uint64_t) const { return false; }

StatusOr<UfsEntry> UnderFileSystem::Adopt(const std::string&, int, uint64_t, uint32_t, const UfsAttrChange&,
                                          const WriteCaller&) {
  return UnimplementedError("this store takes no file whole");
}

bool IsWritingName(std::string_view name) { return name.substr(0, kWritingPrefix.size()) == kWritingPrefix; }

StatusOr<std::unique_ptr<UfsWriter>> UnderFileSystem::Create(const std::string& path, uint32_t, const WriteCaller&) {
  return NotSupportedError("cannot write " + path + ": " + RedactUri(uri()) + " takes no writes");
}
Status UnderFileSystem::Remove(const std::string& path, const WriteCaller&) {
  return NotSupportedError("cannot remove " + path + ": " + RedactUri(uri()) + " takes no writes");
}
Status UnderFileSystem::MakeDir(const std::string& path, uint32_t, const WriteCaller&) {
  return NotSupportedError("cannot make directory " + path + ": " + RedactUri(uri()) + " takes no writes");
}
Status UnderFileSystem::RemoveDir(const std::string& path, const WriteCaller&) {
  return NotSupportedError("cannot remove directory " + path + ": " + RedactUri(uri()) + " takes no writes");
}
Status UnderFileSystem::Rename(const std::string& from, const std::string&, const WriteCaller&) {
  return NotSupportedError("cannot rename " + from + ": " + RedactUri(uri()) + " takes no writes");
}
Status UnderFileSystem::SetAttr(const std::string& path, const UfsAttrChange&, const WriteCaller&) {
  return NotSupportedError("cannot change the mode, owner or times of " + path + ": " + RedactUri(uri()) +
                           " keeps none");
}

}  // namespace granary
