// WriteSessions (worker/writes.h, whose design note gives the rules).
#include "worker/writes.h"

#include <dirent.h>
#include <fcntl.h>
#include <spdlog/spdlog.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <cerrno>
#include <cstring>
#include <nlohmann/json.hpp>
#include <vector>

#include "common/fs.h"
#include "common/tiers.h"
#include "ufs/ufs.h"

namespace granary::worker {
namespace {

// Writes `text` to `path` (0600), and with `sync` fsyncs it.
Status WriteManifestFile(const std::string& path, const std::string& text, bool sync) {
  int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) return ErrnoError(errno, "write " + path);
  size_t done = 0;
  while (done < text.size()) {
    ssize_t n = write(fd, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      Status s = ErrnoError(errno, "write " + path);
      close(fd);
      return s;
    }
    done += static_cast<size_t>(n);
  }
  int rc = sync ? fsync(fd) : 0;
  int err = errno;
  close(fd);
  return rc == 0 ? Status::OK() : ErrnoError(err, "fsync " + path);
}

// fsync of the file at `path`; a file gone meanwhile (uploaded and removed) needs none.
Status SyncFile(const std::string& path) {
  int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return errno == ENOENT ? Status::OK() : ErrnoError(errno, "open " + path);
  int rc = fsync(fd);
  int err = errno;
  close(fd);
  return rc == 0 ? Status::OK() : ErrnoError(err, "fsync " + path);
}

Status SyncDir(const std::string& dir) {
  int fd = open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return ErrnoError(errno, "open " + dir);
  int rc = fsync(fd);
  int err = errno;
  close(fd);
  return rc == 0 ? Status::OK() : ErrnoError(err, "fsync " + dir);
}

// The writer a target's store calls act for.
WriteCaller CallerOf(const WriteTarget& t) { return WriteCaller{t.uid, t.gid, t.groups}; }

// The mount of a write, only while it is mounted writable: a worker writes nothing into a store
// its operator mounted read-only, whoever asks.
StatusOr<MountHandle> WritableMount(MountResolver* mounts, uint64_t mount_id) {
  ASSIGN_OR_RETURN(MountHandle m, mounts->GetMount(mount_id));
  if (m.write == WriteMode::kOff) {
    return ReadOnlyError("the dataset is mounted read-only (write=off): nothing is written to " + RedactUri(m.uri));
  }
  return m;
}

// The chmod, chown and utimes made while writing, given to the store before the commit. One it
// refuses (a chown the store does not allow) is logged: the bytes are committed without it, as the
// writer's close was told they would be.
void ApplyAttrs(const WriteTarget& t, UfsWriter* w) {
  const UfsAttrChange& a = t.attrs;
  if (!a.mode && !a.uid && !a.gid && !a.atime_ns && !a.mtime_ns) return;
  Status st = w->SetAttrs(a);
  if (!st.ok()) {
    spdlog::warn("{}: the mode, owner or times set while it was written were not kept: {}", t.ufs_path, st.ToString());
  }
}

}  // namespace

UfsAttrChange AttrChangeOf(const rpc::AttrChange& a) {
  UfsAttrChange c;
  if (a.has_mode()) c.mode = a.mode();
  if (a.has_uid()) c.uid = a.uid();
  if (a.has_gid()) c.gid = a.gid();
  if (a.has_atime_ns()) c.atime_ns = a.atime_ns();
  if (a.has_mtime_ns()) c.mtime_ns = a.mtime_ns();
  return c;
}

std::string EncodeWriteManifest(const WriteManifest& m) {
  const WriteTarget& t = m.target;
  nlohmann::json j = {{"mount_id", t.mount_id}, {"ino", t.ino},     {"parent", t.parent}, {"ufs_path", t.ufs_path},
                      {"name", t.name},         {"mode", t.mode},   {"uid", t.uid},       {"gid", t.gid},
                      {"write_mode", t.write_mode}, {"sealed", m.sealed}, {"size", m.size}, {"block_size", t.block_size},
                      {"groups", t.groups}};
  const UfsAttrChange& a = t.attrs;
  if (a.mode) j["set_mode"] = *a.mode;
  if (a.uid) j["set_uid"] = *a.uid;
  if (a.gid) j["set_gid"] = *a.gid;
  if (a.atime_ns) j["set_atime_ns"] = *a.atime_ns;
  if (a.mtime_ns) j["set_mtime_ns"] = *a.mtime_ns;
  // Paths arrive as protobuf strings (UTF-8, checked when the frame parses); `replace` only keeps
  // dump() from ever throwing.
  return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

StatusOr<WriteManifest> ParseWriteManifest(std::string_view text) {
  auto j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object()) return DataLossError("the manifest is not a JSON object");
  std::string bad;
  // A field, when present, of the right type and range; absent: the default.
  auto num = [&](const char* key, uint64_t max, auto* out) {
    auto it = j.find(key);
    if (it == j.end()) return;
    if (!it->is_number_unsigned() || it->template get<uint64_t>() > max) {
      if (bad.empty()) bad = key;
      return;
    }
    *out = static_cast<std::remove_reference_t<decltype(*out)>>(it->template get<uint64_t>());
  };
  auto str = [&](const char* key, std::string* out) {
    auto it = j.find(key);
    if (it == j.end()) return;
    if (!it->is_string()) {
      if (bad.empty()) bad = key;
      return;
    }
    *out = it->template get<std::string>();
  };
  WriteManifest m;
  WriteTarget& t = m.target;
  num("mount_id", UINT64_MAX, &t.mount_id);
  num("ino", UINT64_MAX, &t.ino);
  num("parent", UINT64_MAX, &t.parent);
  str("ufs_path", &t.ufs_path);
  str("name", &t.name);
  num("mode", 07777, &t.mode);
  num("uid", UINT32_MAX, &t.uid);
  num("gid", UINT32_MAX, &t.gid);
  num("write_mode", UINT32_MAX, &t.write_mode);
  num("block_size", uint64_t{1} << 40, &t.block_size);
  num("size", UINT64_MAX, &m.size);
  // The attributes set while writing: each optional, in range when present.
  auto opt32 = [&](const char* key, uint64_t max, std::optional<uint32_t>* out) {
    if (!j.contains(key)) return;
    uint32_t v = 0;
    num(key, max, &v);
    *out = v;
  };
  auto time = [&](const char* key, std::optional<int64_t>* out) {
    auto it = j.find(key);
    if (it == j.end()) return;
    if (!it->is_number_integer()) {
      if (bad.empty()) bad = key;
      return;
    }
    *out = it->template get<int64_t>();
  };
  opt32("set_mode", 07777, &t.attrs.mode);
  opt32("set_uid", UINT32_MAX - 1, &t.attrs.uid);
  opt32("set_gid", UINT32_MAX - 1, &t.attrs.gid);
  time("set_atime_ns", &t.attrs.atime_ns);
  time("set_mtime_ns", &t.attrs.mtime_ns);
  if (auto it = j.find("groups"); it != j.end()) {
    if (!it->is_array() || it->size() > 65536) {
      if (bad.empty()) bad = "groups";
    } else {
      for (const auto& g : *it) {
        if (!g.is_number_unsigned() || g.get<uint64_t>() > UINT32_MAX) {
          if (bad.empty()) bad = "groups";
          break;
        }
        t.groups.push_back(static_cast<uint32_t>(g.get<uint64_t>()));
      }
    }
  }
  if (auto it = j.find("sealed"); it != j.end()) {
    if (it->is_boolean()) m.sealed = it->get<bool>();
    else if (bad.empty()) bad = "sealed";
  }
  if (!bad.empty()) return DataLossError("the manifest's field '" + bad + "' has the wrong type or is out of range");
  if (!m.sealed) return m;  // unsealed manifests are only ever deleted
  if (t.ufs_path.empty() || !CheckRelativePath(t.ufs_path).ok()) {
    return DataLossError("the manifest names no valid path below its mount");
  }
  if (!IsValidName(t.name)) return DataLossError("the manifest names no valid file name");
  if (static_cast<WriteMode>(t.write_mode) != WriteMode::kBack && static_cast<WriteMode>(t.write_mode) != WriteMode::kThrough) {
    return DataLossError("the manifest's write mode " + std::to_string(t.write_mode) + " is not through or back");
  }
  return m;
}

WriteSessions::WriteSessions(std::string dir, MountResolver* mounts, CommitFn commit, KeepFn keep)
    : dir_(std::move(dir)), mounts_(mounts), commit_(std::move(commit)), keep_(std::move(keep)) {}

StatusOr<std::unique_ptr<WriteSessions>> WriteSessions::Open(const std::string& dir, MountResolver* mounts,
                                                            CommitFn commit, KeepFn keep) {
  if (mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST) return ErrnoError(errno, "worker.staging_dir " + dir);
  if (chmod(dir.c_str(), 0700) != 0) return ErrnoError(errno, "worker.staging_dir " + dir);
  std::unique_ptr<WriteSessions> w(new WriteSessions(dir, mounts, std::move(commit), std::move(keep)));
  RETURN_IF_ERROR(w->Recover());
  w->uploader_ = std::thread([p = w.get()] { p->UploadLoop(); });
  w->keeper_ = std::thread([p = w.get()] { p->KeepLoop(); });
  w->syncer_ = std::thread([p = w.get()] { p->SyncLoop(); });
  return w;
}

WriteSessions::~WriteSessions() {
  {
    MutexLock lock(&mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (uploader_.joinable()) uploader_.join();
  if (keeper_.joinable()) keeper_.join();
  if (syncer_.joinable()) syncer_.join();
  MutexLock lock(&mu_);
  for (Keep& k : keeps_) close(k.fd);
}

void WriteSessions::SyncLoop() {
  for (;;) {
    std::vector<Unsynced> batch;
    {
      MutexLock lock(&mu_);
      while (!stop_ && unsynced_.empty()) lock.Wait(&cv_);
      if (stop_) return;
      // Sealed files gather for a moment: one pass makes many durable, and most are uploaded
      // (and gone) before it.
      const auto due = unsynced_.front().sealed_at + kSyncDelay;
      while (!stop_ && std::chrono::steady_clock::now() < due) lock.WaitUntil(&cv_, due);
      if (stop_) return;
      batch.assign(unsynced_.begin(), unsynced_.end());
      unsynced_.clear();
    }
    Status st;
    for (const Unsynced& u : batch) {
      Status a = SyncFile(u.data_path);
      Status b = SyncFile(u.manifest_path);
      if (st.ok()) st = !a.ok() ? a : b;
    }
    if (st.ok()) st = SyncDir(dir_);
    if (!st.ok()) spdlog::warn("write=back: making staged files durable failed: {}", st.ToString());
  }
}

void WriteSessions::KeepLoop() {
  for (;;) {
    Keep k;
    {
      MutexLock lock(&mu_);
      while (!stop_ && keeps_.empty()) lock.Wait(&cv_);
      if (stop_) return;
      k = std::move(keeps_.front());
      keeps_.pop_front();
    }
    Status kept = keep_(k.mount_id, k.ufs_path, k.version, k.size, k.block_size, k.fd);
    close(k.fd);
    if (!kept.ok()) spdlog::info("a written file was not kept in the cache ({}): {}", k.ufs_path, kept.ToString());
  }
}

// Sealed files are uploaded again; unsealed ones were never acknowledged and go.
Status WriteSessions::Recover() {
  DIR* d = opendir(dir_.c_str());
  if (d == nullptr) return ErrnoError(errno, "read worker.staging_dir " + dir_);
  std::vector<std::string> names;
  while (dirent* de = readdir(d)) names.emplace_back(de->d_name);
  closedir(d);
  MutexLock lock(&mu_);
  std::vector<Sealed> found;
  for (const std::string& name : names) {
    if (name.size() < 6 || name.substr(name.size() - 5) != ".json") continue;
    const std::string stem = name.substr(0, name.size() - 5);
    // Our names are decimal session numbers; anything else here is not ours to touch.
    uint64_t id = 0;
    auto [end, ec] = std::from_chars(stem.data(), stem.data() + stem.size(), id);
    if (ec != std::errc() || end != stem.data() + stem.size() || id == UINT64_MAX) {
      spdlog::warn("worker.staging_dir {}: ignoring {}, which is not a staging manifest", dir_, name);
      continue;
    }
    next_id_ = std::max(next_id_, id + 1);
    std::string manifest = dir_ + "/" + name;
    auto text = ReadFileToString(manifest);
    auto parsed = text.ok() ? ParseWriteManifest(*text) : StatusOr<WriteManifest>(text.status());
    struct stat sealed_st;
    const bool has_sealed = ::stat((dir_ + "/" + stem + ".sealed").c_str(), &sealed_st) == 0;
    if (!parsed.ok() && has_sealed) {
      // The manifest was fsynced before its file was sealed: unreadable now means damage. Left in
      // place for a person to look at, never uploaded as something it may not be.
      spdlog::error("write=back: staging manifest {} is unreadable ({}); it and {}.sealed are left in place, "
                    "not uploaded", manifest, parsed.status().ToString(), stem);
      continue;
    }
    if (!parsed.ok() || !parsed->sealed) {
      // Unsealed, or torn by a crash before its file was sealed: never acknowledged.
      unlink((dir_ + "/" + stem + ".data").c_str());
      unlink(manifest.c_str());
      continue;
    }
    Sealed s;
    s.id = id;
    s.target = parsed->target;
    s.size = parsed->size;
    s.data_path = dir_ + "/" + stem + ".sealed";
    s.manifest_path = manifest;
    struct stat st;
    if (::stat(s.data_path.c_str(), &st) != 0) {  // uploaded, then stopped before its manifest went
      unlink(manifest.c_str());
      continue;
    }
    found.push_back(std::move(s));
  }
  // In the order they were sealed; of several versions of one file, the last.
  std::sort(found.begin(), found.end(), [](const Sealed& a, const Sealed& b) { return a.id < b.id; });
  for (Sealed& s : found) {
    DropOlderLocked(s);
    spdlog::info("write=back: uploading {} ({} bytes), staged before the last stop", s.target.ufs_path, s.size);
    queue_.push_back(std::move(s));
  }
  for (const std::string& name : names) {  // staging files without a manifest
    if (name.size() > 5 && name.substr(name.size() - 5) == ".data") unlink((dir_ + "/" + name).c_str());
  }
  return Status::OK();
}

Status WriteSessions::Handle(uint64_t conn, const rpc::WriteCall& call, rpc::LocalResponse* resp, int* fd) {
  *fd = -1;
  switch (call.op()) {
    case rpc::WriteCall::BEGIN: {
      // Without a path: a spare, aimed later (AIM). No manifest for an unsealed session: its
      // staging file is only ever deleted after a crash (Recover deletes every .data file).
      const bool spare = call.ufs_path().empty() && call.name().empty();
      Session s;
      s.conn = conn;
      if (!spare) {
        ASSIGN_OR_RETURN(s.target, TargetOf(call));
        s.aimed = true;
      }
      uint64_t id;
      {
        MutexLock lock(&mu_);
        id = next_id_++;
      }
      s.data_path = dir_ + "/" + std::to_string(id) + ".data";
      int f = open(s.data_path.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
      if (f < 0) return ErrnoError(errno, "create a staging file in worker.staging_dir " + dir_);
      *fd = f;
      resp->set_session(id);
      MutexLock lock(&mu_);
      open_[id] = std::move(s);
      return Status::OK();
    }
    case rpc::WriteCall::AIM: {
      ASSIGN_OR_RETURN(Target t, TargetOf(call));
      MutexLock lock(&mu_);
      auto it = open_.find(call.session());
      if (it == open_.end() || it->second.conn != conn) {
        return FailedPreconditionError("write session " + std::to_string(call.session()) + " is not open");
      }
      if (it->second.aimed) return FailedPreconditionError("write session " + std::to_string(call.session()) + " has its target");
      it->second.target = std::move(t);
      it->second.aimed = true;
      return Status::OK();
    }
    case rpc::WriteCall::ABORT: {
      std::shared_ptr<Stream> dropped;  // its upload is aborted outside the lock
      MutexLock lock(&mu_);
      auto it = open_.find(call.session());
      if (it == open_.end() || it->second.conn != conn) return Status::OK();
      unlink(it->second.data_path.c_str());
      dropped = std::move(it->second.stream);
      open_.erase(it);
      return Status::OK();
    }
    case rpc::WriteCall::COMMIT: {
      Session s;
      {
        MutexLock lock(&mu_);
        auto it = open_.find(call.session());
        if (it == open_.end() || it->second.conn != conn || !it->second.aimed) {
          return FailedPreconditionError("write session " + std::to_string(call.session()) + " is not open");
        }
        s = it->second;
      }
      if (call.has_attrs()) {
        const rpc::AttrChange& a = call.attrs();
        if ((a.has_mode() && a.mode() > 07777) || (a.has_uid() && a.uid() == UINT32_MAX) ||
            (a.has_gid() && a.gid() == UINT32_MAX)) {
          return InvalidArgumentError("write session: the mode or owner set while writing is out of range");
        }
        s.target.attrs = AttrChangeOf(a);
        if (a.has_mode()) s.target.mode = a.mode();  // the file is made with it
      }
      if (static_cast<WriteMode>(s.target.write_mode) == WriteMode::kThrough) {
        // The streamed upload is this commit's: a later one (more writes, then close) starts anew.
        {
          MutexLock lock(&mu_);
          auto it = open_.find(call.session());
          if (it != open_.end()) {
            it->second.stream.reset();
            it->second.no_stream = false;
          }
        }
        if (s.stream && s.stream->writer) {
          Status streamed = FinishStream(s, call.size(), resp);
          if (streamed.ok()) return streamed;
          spdlog::info("write=through: the streamed upload of {} failed ({}); uploading it whole", s.target.ufs_path,
                       streamed.ToString());
          s.stream.reset();  // aborts it
        }
        return Upload(s.target, s.data_path, call.size(), resp);
      }
      // write=back: sealed on this node, then acknowledged; the uploader owns it from here. No fsync
      // on the writer's path: the syncer makes it durable within kSyncDelay (or the upload, sooner).
      Sealed sealed;
      sealed.target = s.target;
      sealed.size = call.size();
      {
        MutexLock lock(&mu_);
        sealed.id = next_id_++;  // a session may seal several versions (fsync, then more writes)
      }
      sealed.data_path = dir_ + "/" + std::to_string(sealed.id) + ".sealed";
      sealed.manifest_path = dir_ + "/" + std::to_string(sealed.id) + ".json";
      RETURN_IF_ERROR(WriteManifestFile(sealed.manifest_path, ManifestOf(s.target, true, call.size()), /*sync=*/false));
      if (rename(s.data_path.c_str(), sealed.data_path.c_str()) != 0) {
        Status e = ErrnoError(errno, "seal staging file " + s.data_path);
        unlink(sealed.manifest_path.c_str());
        return e;
      }
      resp->set_committed_size(call.size());
      resp->set_sealed(sealed.id);
      const uint64_t id = sealed.id;
      MutexLock lock(&mu_);
      open_.erase(call.session());
      DropOlderLocked(sealed);
      unsynced_.push_back({sealed.data_path, sealed.manifest_path, std::chrono::steady_clock::now()});
      // A close is often followed by chmod, chown and utimes of the file by path (Python's tarfile,
      // shutil.copy2) or by another version of it: the upload waits a moment for them
      // (SEALED_ATTRS, DropOlderLocked); an fsync's does not.
      if (!call.wait_upload()) sealed.not_before = std::chrono::steady_clock::now() + kSettle;
      queue_.push_back(std::move(sealed));
      cv_.notify_all();
      if (!call.wait_upload()) return Status::OK();
      // Until uploaded, or kSyncWait: then the last failure (the upload goes on trying).
      auto deadline = std::chrono::steady_clock::now() + kSyncWait;
      while (!stop_) {
        auto d = done_.find(id);
        if (d != done_.end() && d->second.ok()) break;
        if (!lock.WaitUntil(&cv_, deadline)) break;
      }
      auto d = done_.find(id);
      if (d == done_.end() || !d->second.ok()) {
        std::string why = d == done_.end() ? std::string("not done yet") : d->second.ToString();
        // DEADLINE_EXCEEDED (not UNAVAILABLE): granary-fuse must not take it for a lost session;
        // the file is sealed and stays the uploader's.
        return DeadlineExceededError("fsync: the upload of " + s.target.ufs_path + " has not succeeded (" + why +
                                     "); it goes on retrying and its bytes stay staged on this node");
      }
      done_.erase(d);
      return Status::OK();
    }
    case rpc::WriteCall::PROGRESS: {
      std::shared_ptr<Stream> stream;
      Target target;
      std::string data_path;
      {
        MutexLock lock(&mu_);
        auto it = open_.find(call.session());
        if (it == open_.end() || it->second.conn != conn) {
          return FailedPreconditionError("write session " + std::to_string(call.session()) + " is not open");
        }
        Session& s = it->second;
        if (!s.aimed) return FailedPreconditionError("write session " + std::to_string(call.session()) + " has no target");
        if (static_cast<WriteMode>(s.target.write_mode) != WriteMode::kThrough || s.no_stream) return Status::OK();
        if (s.stream) {
          {
            MutexLock sl(&s.stream->mu);
            if (call.size() >= s.stream->target) {
              s.stream->target = call.size();
              s.stream->cv.notify_all();
              return Status::OK();
            }
          }
          // Behind what was sealed (a write there): the upload is dropped (aborted below, outside
          // the lock) and COMMIT uploads the whole file.
          spdlog::info("write=through: a write behind what was streamed of {}; the streamed upload is dropped and "
                       "the file will be uploaded whole at close", s.target.ufs_path);
          stream = std::move(s.stream);
          s.no_stream = true;
        } else if (call.size() == 0) {
          return Status::OK();
        } else {
          target = s.target;
          data_path = s.data_path;
        }
      }
      if (stream) return Status::OK();
      // The first PROGRESS: the upload begins — unless the store takes the staging file whole at
      // COMMIT (Adopt), which a stream would only slow down.
      ASSIGN_OR_RETURN(MountHandle m, WritableMount(mounts_, target.mount_id));
      struct stat staged;
      if (::stat(data_path.c_str(), &staged) == 0 && m.ufs->CanAdopt(static_cast<uint64_t>(staged.st_dev))) {
        MutexLock lock(&mu_);
        auto it = open_.find(call.session());
        if (it != open_.end()) it->second.no_stream = true;
        return Status::OK();
      }
      auto fresh = std::make_shared<Stream>();
      ASSIGN_OR_RETURN(fresh->writer, m.ufs->Create(target.ufs_path, target.mode, CallerOf(target)));
      {
        MutexLock sl(&fresh->mu);
        fresh->target = call.size();
      }
      fresh->thread = std::thread(StreamLoop, fresh.get(), data_path);
      MutexLock lock(&mu_);
      auto it = open_.find(call.session());
      if (it == open_.end()) return Status::OK();  // ended meanwhile: `fresh` aborts
      it->second.stream = std::move(fresh);
      return Status::OK();
    }
    case rpc::WriteCall::SEALED_ATTRS: {
      const rpc::AttrChange& a = call.attrs();
      if ((a.has_mode() && a.mode() > 07777) || (a.has_uid() && a.uid() == UINT32_MAX) ||
          (a.has_gid() && a.gid() == UINT32_MAX)) {
        return InvalidArgumentError("write session: the mode or owner set is out of range");
      }
      MutexLock lock(&mu_);
      auto it = std::find_if(queue_.begin(), queue_.end(), [&](const Sealed& q) { return q.id == call.session(); });
      if (it == queue_.end()) {
        return FailedPreconditionError("sealed version " + std::to_string(call.session()) + " is uploading or uploaded");
      }
      const UfsAttrChange change = AttrChangeOf(a);
      UfsAttrChange& kept = it->target.attrs;
      if (change.mode) kept.mode = change.mode, it->target.mode = *change.mode;
      if (change.uid) kept.uid = change.uid;
      if (change.gid) kept.gid = change.gid;
      if (change.atime_ns) kept.atime_ns = change.atime_ns;
      if (change.mtime_ns) kept.mtime_ns = change.mtime_ns;
      // The manifest says so too (for an upload after a restart). Its fsync is the syncer's: a crash
      // before it loses the change, never the file.
      return WriteManifestFile(it->manifest_path, ManifestOf(it->target, true, it->size), /*sync=*/false);
    }
    case rpc::WriteCall::UPLOADED: {
      MutexLock lock(&mu_);
      bool pending = uploading_ && uploading_id_ == call.session();
      for (const Sealed& q : queue_) pending = pending || q.id == call.session();
      resp->set_upload_pending(pending);
      return Status::OK();
    }
    default:
      return InvalidArgumentError("write session: unknown call " + std::to_string(call.op()));
  }
}

StatusOr<WriteSessions::Target> WriteSessions::TargetOf(const rpc::WriteCall& call) {
  if (call.ufs_path().empty() || call.name().empty()) return InvalidArgumentError("write session: no path");
  if (!CheckRelativePath(call.ufs_path()).ok() || !IsValidName(call.name())) {
    return InvalidArgumentError("write session: the path or name is not a valid path below the mount");
  }
  if (call.mode() > 07777) return InvalidArgumentError("write session: mode " + std::to_string(call.mode()) + " is not permission bits");
  // The mount's write mode, not the caller's word.
  ASSIGN_OR_RETURN(MountHandle mount, WritableMount(mounts_, call.mount_id()));
  return Target{call.mount_id(), call.ino(), call.parent(), call.ufs_path(), call.name(),
                call.mode(),     call.uid(), call.gid(),    static_cast<uint32_t>(mount.write), call.block_size(),
                {call.groups().begin(), call.groups().end()}, {}};
}

void WriteSessions::ConnectionClosed(uint64_t conn) {
  std::vector<std::shared_ptr<Stream>> dropped;  // their uploads are aborted outside the lock
  MutexLock lock(&mu_);
  for (auto it = open_.begin(); it != open_.end();) {
    if (it->second.conn != conn) {
      ++it;
      continue;
    }
    unlink(it->second.data_path.c_str());
    if (it->second.stream) dropped.push_back(std::move(it->second.stream));
    it = open_.erase(it);
  }
}

Status WriteSessions::Upload(const Target& t, const std::string& data_path, uint64_t size, rpc::LocalResponse* resp) {
  ASSIGN_OR_RETURN(MountHandle m, WritableMount(mounts_, t.mount_id));
  int f = open(data_path.c_str(), O_RDONLY | O_CLOEXEC);
  if (f < 0) return ErrnoError(errno, "open staging file " + data_path);
  // A store on the staging file's filesystem takes that file itself: no second copy of the bytes.
  // (Nothing writes a committed staging file again: more writes start a new session from a copy.)
  auto adopted = m.ufs->Adopt(t.ufs_path, f, size, t.mode, t.attrs, CallerOf(t));
  if (adopted.ok() || adopted.status().code() != Code::kUnimplemented) {
    close(f);
    if (!adopted.ok()) return adopted.status();
    return Committed(t, data_path, *adopted, m.block_size, resp);
  }
  auto w = m.ufs->Create(t.ufs_path, t.mode, CallerOf(t));
  if (!w.ok()) {
    close(f);
    return w.status();
  }
  std::string buf(4 << 20, '\0');
  uint64_t off = 0;
  Status st;
  while (st.ok() && off < size) {
    ssize_t n = pread(f, buf.data(), std::min<uint64_t>(buf.size(), size - off), static_cast<off_t>(off));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      st = ErrnoError(errno, "read staging file " + data_path);
    } else if (n == 0) {
      st = DataLossError("staging file " + data_path + " is shorter than the file written (" + std::to_string(off) +
                         " of " + std::to_string(size) + " bytes)");
    } else {
      st = (*w)->Append(std::string_view(buf.data(), static_cast<size_t>(n)));
      off += static_cast<uint64_t>(n);
    }
  }
  close(f);
  if (!st.ok()) {
    (*w)->Abort();
    return st;
  }
  ApplyAttrs(t, w->get());
  ASSIGN_OR_RETURN(UfsEntry e, (*w)->Commit());
  return Committed(t, data_path, e, m.block_size, resp);
}

Status WriteSessions::Committed(const Target& t, const std::string& data_path, const UfsEntry& e,
                                uint64_t mount_block_size, rpc::LocalResponse* resp) {
  rpc::CommitWriteRequest c;
  c.set_ino(t.ino);
  c.set_parent(t.parent);
  c.set_name(t.name);
  c.set_size(e.size);
  c.set_mtime_ns(e.mtime_ns);
  c.set_mode(e.mode != 0 && e.mode != 0444 ? e.mode : t.mode);
  c.set_ufs_path(t.ufs_path);  // where it was written (the name may have moved meanwhile)
  c.set_uid(e.uid);  // the owner the store gave the file (the worker's user; object stores: root)
  c.set_gid(e.gid);
  c.set_version(e.version);
  RETURN_IF_ERROR(commit_(c));
  if (keep_) {  // reading it back is warm; a failure to cache costs a cold read, not the write
    Keep k;
    k.mount_id = t.mount_id;
    k.size = e.size;
    k.block_size = t.block_size != 0 ? t.block_size : mount_block_size;
    k.ufs_path = t.ufs_path;
    k.version = e.version;
    k.fd = open(data_path.c_str(), O_RDONLY | O_CLOEXEC);
    if (k.fd >= 0) {
      MutexLock lock(&mu_);
      if (keeps_.size() < 64) {
        keeps_.push_back(std::move(k));
        k.fd = -1;
      }
    }
    if (k.fd >= 0) close(k.fd);  // too many waiting: this one is read cold
    cv_.notify_all();
  }
  if (resp != nullptr) {  // write=through (write=back's uploads are counted by the uploader)
    resp->set_committed_size(e.size);
    resp->set_committed_version(e.version);
    MutexLock lock(&mu_);
    ++uploaded_;
    uploaded_bytes_ += e.size;
  }
  return Status::OK();
}

WriteSessions::Stream::~Stream() {
  {
    MutexLock lock(&mu);
    stop = true;
  }
  cv.notify_all();
  if (thread.joinable()) thread.join();
  if (writer) writer->Abort();
}

void WriteSessions::StreamLoop(Stream* st, std::string data_path) {
  int f = open(data_path.c_str(), O_RDONLY | O_CLOEXEC);
  std::string buf(4 << 20, '\0');
  for (;;) {
    uint64_t from, to;
    {
      MutexLock lock(&st->mu);
      if (f < 0 && st->failed.ok()) st->failed = ErrnoError(errno, "open staging file " + data_path);
      while (!st->stop && st->failed.ok() && st->streamed >= st->target) lock.Wait(&st->cv);
      if (st->stop || !st->failed.ok()) break;
      from = st->streamed;
      to = std::min<uint64_t>(st->target, from + buf.size());
    }
    Status s;
    ssize_t n = pread(f, buf.data(), to - from, static_cast<off_t>(from));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      s = n < 0 ? ErrnoError(errno, "read staging file " + data_path) : DataLossError("staging file " + data_path + " is short");
    } else {
      s = st->writer->Append(std::string_view(buf.data(), static_cast<size_t>(n)));
    }
    {
      MutexLock lock(&st->mu);
      if (!s.ok()) {
        st->failed = s;
      } else {
        st->streamed += static_cast<uint64_t>(n);
      }
    }
    st->cv.notify_all();
  }
  if (f >= 0) close(f);
  st->cv.notify_all();
}

Status WriteSessions::FinishStream(const Session& s, uint64_t size, rpc::LocalResponse* resp) {
  Stream* st = s.stream.get();
  {
    MutexLock lock(&st->mu);
    st->target = size;
    st->cv.notify_all();
    if (st->streamed > size) return FailedPreconditionError("the file was cut below what was streamed");
    while (st->failed.ok() && st->streamed < size) lock.Wait(&st->cv);
    if (!st->failed.ok()) return st->failed;
    st->stop = true;
  }
  st->cv.notify_all();
  if (st->thread.joinable()) st->thread.join();
  ASSIGN_OR_RETURN(MountHandle m, mounts_->GetMount(s.target.mount_id));
  ApplyAttrs(s.target, st->writer.get());
  ASSIGN_OR_RETURN(UfsEntry e, st->writer->Commit());
  st->writer.reset();
  return Committed(s.target, s.data_path, e, m.block_size, resp);
}

void WriteSessions::DropOlderLocked(const Sealed& newer) {
  // The last close wins: an older version of the same file still queued (a failed upload waiting
  // for its retry) must not be uploaded after this one. (One being uploaded now finishes first:
  // there is one uploader.)
  for (auto it = queue_.begin(); it != queue_.end();) {
    if (it->id < newer.id && it->target.mount_id == newer.target.mount_id && it->target.ufs_path == newer.target.ufs_path) {
      spdlog::info("write=back: {} was closed again before its upload; only the newer version is uploaded",
                   it->target.ufs_path);
      unlink(it->manifest_path.c_str());
      unlink(it->data_path.c_str());
      done_[it->id] = Status::OK();  // superseded: an fsync waiting for it has the newer version coming
      it = queue_.erase(it);
    } else {
      ++it;
    }
  }
}

void WriteSessions::UploadLoop() {
  for (;;) {
    Sealed s;
    {
      MutexLock lock(&mu_);
      for (;;) {
        if (stop_) return;
        auto now = std::chrono::steady_clock::now();
        auto next = std::find_if(queue_.begin(), queue_.end(), [&](const Sealed& q) { return q.not_before <= now; });
        if (next != queue_.end()) {
          s = std::move(*next);
          queue_.erase(next);
          break;
        }
        auto soonest = now + std::chrono::seconds(60);
        for (const Sealed& q : queue_) soonest = std::min(soonest, q.not_before);
        lock.WaitUntil(&cv_, soonest);
      }
      uploading_ = true;
      uploading_id_ = s.id;
      uploading_bytes_ = s.size;
    }
    Status st = Upload(s.target, s.data_path, s.size, nullptr);
    {
      MutexLock lock(&mu_);
      uploading_ = false;
      uploading_bytes_ = 0;
      if (st.ok()) {
        unlink(s.manifest_path.c_str());  // first: a manifest without its file would be queued forever
        unlink(s.data_path.c_str());
        ++uploaded_;
        uploaded_bytes_ += s.size;
        done_[s.id] = Status::OK();
      } else if (st.code() == Code::kDataLoss) {
        // The staged bytes are not what was acknowledged (the node lost power before the syncer's
        // pass, or the disk damaged them): uploading them would store a file nobody wrote.
        ++failures_;
        spdlog::error("write=back: {} cannot be uploaded, its staged bytes are damaged or gone ({}); the store keeps "
                      "its previous version", s.target.ufs_path, st.ToString());
        unlink(s.manifest_path.c_str());
        unlink(s.data_path.c_str());
        done_[s.id] = st;
      } else {
        ++failures_;
        auto wait = s.retry.Next();
        spdlog::warn("write=back: the upload of {} failed (attempt {}; again in {} s, its bytes stay staged in {}): {}",
                     s.target.ufs_path, s.retry.retries(), wait.count() / 1000, s.data_path, st.ToString());
        s.not_before = std::chrono::steady_clock::now() + wait;
        done_[s.id] = st;  // an fsync waiting for it answers this error; the upload goes on
        queue_.push_back(std::move(s));
      }
      while (done_.size() > 4096) done_.erase(done_.begin());
    }
    cv_.notify_all();
  }
}

WriteSessions::Backlog WriteSessions::backlog() const {
  MutexLock lock(&mu_);
  Backlog b;
  for (const Sealed& s : queue_) {
    ++b.files;
    b.bytes += s.size;
  }
  if (uploading_) {
    ++b.files;
    b.bytes += uploading_bytes_;
  }
  b.uploaded = uploaded_;
  b.uploaded_bytes = uploaded_bytes_;
  b.failures = failures_;
  for (const auto& [id, session] : open_) b.open_sessions += session.aimed ? 1 : 0;  // spares write nothing yet
  return b;
}

}  // namespace granary::worker
