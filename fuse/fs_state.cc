// The helpers every FUSE operation shares (fuse/fs_state.h): a master Attr as the kernel sees it
// (ToStat, ToEntry), a file's open information (FileInfoOf), and passthrough mode's BackingHost.
#include "fuse/fs_state.h"

#include <spdlog/spdlog.h>
#include <sys/stat.h>

#include <algorithm>
#include <memory>
#include <random>
#include <utility>
#include <vector>

#include "fuse/ops.h"

namespace granary::fuse::internal {

void InitFs(Fs* fs, const Config& cfg) {
  fs->cfg = cfg;
  fs->kernel_reads = std::make_unique<KernelReads>(cfg.fuse.file_cache_entries, cfg.fuse.attr_timeout);
  if (cfg.fuse.open == "daemon") {
    fs->wanted = OpenMode::kDaemon;
  } else if (cfg.fuse.open == "kernel") {
    fs->wanted = OpenMode::kKernel;
  } else {
    fs->wanted = OpenMode::kPassthrough;  // auto: passthrough where it can work, else kernel
    fs->wanted_explicitly = cfg.fuse.open == "passthrough";
  }
  fs->mode = fs->wanted.load();
  {
    std::random_device rd;
    fs->handles = std::make_unique<OpenHandles>(rd(), [fs](uint64_t ino) { return fs->ToKernel(ino); });
  }
  fs->files = std::make_unique<FileCache>(cfg.fuse.file_cache_entries, cfg.fuse.attr_timeout);
  if (cfg.fuse.file_cache_entries > 0 && cfg.fuse.attr_timeout.count() > 0) {
    Client* client = fs->client.get();
    fs->open_notes = std::make_unique<OpenNotes>(
        cfg.fuse.file_cache_entries, [client](const std::vector<uint64_t>& inos) { return client->NoteOpens(inos); });
  }
  fs->read_leases = std::make_unique<ReadLeases>(cfg.fuse.attr_timeout);
  fs->attrs = std::make_unique<AttrCache>(cfg.fuse.file_cache_entries, cfg.fuse.attr_timeout);
  fs->entries = std::make_unique<EntryCache>(cfg.fuse.file_cache_entries,
                                             std::min(cfg.fuse.entry_timeout, cfg.fuse.attr_timeout));
  fs->tracer = std::make_unique<Tracer>(TracePaths(fs));
}

struct stat ToStat(Fs* fs, const rpc::Attr& a) {
  if (a.writable()) fs->sb_mode.NoteWritable();  // before the kernel can try to write there
  struct stat st {};
  st.st_ino = fs->ToKernel(a.ino());
  st.st_mode = (a.type() == rpc::DIRECTORY ? S_IFDIR : S_IFREG) | (a.mode() & 07777);
  st.st_nlink = a.nlink();
  st.st_uid = a.uid();
  st.st_gid = a.gid();
  st.st_size = static_cast<off_t>(a.size());
  st.st_blksize = 128 * 1024;
  st.st_blocks = static_cast<blkcnt_t>((a.size() + 511) / 512);
  st.st_mtim.tv_sec = a.mtime_ns() / 1'000'000'000;
  st.st_mtim.tv_nsec = a.mtime_ns() % 1'000'000'000;
  st.st_atim = st.st_mtim;
  st.st_ctim = st.st_mtim;
  return st;
}

double WritableAttrTimeout(const Fs* fs, const rpc::Attr& a) {
  const double configured = Seconds(fs->cfg.fuse.attr_timeout);
  if (!a.writable()) return configured;
  // A file's size and version must be asked for at every stat (close-to-open). A directory's own
  // attributes (its owner and mode, which the kernel checks at every create in it) may be a second
  // old; its files' names are asked for at every lookup (but in a directory this node made within
  // the second: fuse/known_dirs.h).
  return a.type() == rpc::DIRECTORY ? std::min(configured, 1.0) : 0;
}

fuse_entry_param ToEntry(Fs* fs, const rpc::Attr& a) {
  if (a.type() != rpc::DIRECTORY) fs->NoteVersion(fs->ToKernel(a.ino()), a.version_hash());
  if (a.type() == rpc::DIRECTORY && a.writable()) fs->NoteWritableDir(a.ino());
  fuse_entry_param e{};
  e.ino = fs->ToKernel(a.ino());
  e.generation = 1;
  e.attr = ToStat(fs, a);
  if (a.writable() && a.type() != rpc::DIRECTORY) {
    if (WriteFiles* w = fs->WritesIfAny()) {
      if (auto size = w->SizeOf(e.ino)) {  // written or staged here: that size
        e.attr.st_size = static_cast<off_t>(*size);
        e.attr.st_blocks = static_cast<blkcnt_t>((*size + 511) / 512);
      }
    }
  }
  e.attr_timeout = WritableAttrTimeout(fs, a);  // close-to-open (file_cache.h)
  // Below a writable mount a file's name is asked for at every open (close-to-open: another node may
  // have put a new file there); a directory's may be a second old, as its attributes (a directory
  // another node renamed away is seen gone within that second), or every path walk through it would
  // cost a master round trip.
  e.entry_timeout = !a.writable() ? Seconds(fs->cfg.fuse.entry_timeout)
                    : a.type() == rpc::DIRECTORY ? std::min(Seconds(fs->cfg.fuse.entry_timeout), 1.0)
                                                 : 0;
  return e;
}

// The file's open information: from the FileCache (an open of listed information is noted for
// fetch-ahead), else from the master.
StatusOr<rpc::FileInfo> FileInfoOf(Fs* fs, uint64_t master_ino) {
  if (auto cached = fs->files->Get(master_ino)) {
    if (fs->open_notes) fs->open_notes->Opened(master_ino);
    return std::move(*cached);
  }
  auto f = fs->client->GetFile(master_ino);
  if (!f.ok()) return f.status();
  fs->files->Put(master_ino, *f);
  if (fs->open_notes) fs->open_notes->Forget(master_ino);  // the master counted this open itself
  return f;
}

void KeepListedFile(Fs* fs, const rpc::FileInfo& f, std::chrono::steady_clock::time_point asked) {
  if (!fs->open_notes || !f.has_attr() || !Cacheable(f)) return;
  const uint64_t ino = f.attr().ino();
  std::chrono::milliseconds age{};
  if (fs->files->Get(ino, &age) && std::chrono::steady_clock::now() - age > asked) {
    return;  // an answer the master gave after this one was asked for (an open's GetFile) stays
  }
  fs->open_notes->Listed(ino);  // before the Put: an open that finds it is noted
  fs->files->Put(ino, f);
}

namespace {

class FsBackingHost : public BackingHost {
 public:
  explicit FsBackingHost(Fs* fs) : fs_(fs) {}
  StatusOr<std::unique_ptr<FileLease>> Lease(const rpc::FileInfo& info) override {
    return fs_->client->LeaseFile(info);
  }
  StatusOr<int> Register(const FileLease& lease) override {
    auto id = fs_->io.load()->OpenBacking(lease.fd());
    if (!id.ok() && !warned_.exchange(true)) {
      // Refused for good (no CAP_SYS_ADMIN in the initial user namespace): kernel mode from now on.
      spdlog::warn("fuse.open={}: the kernel refused a backing file ({}); serving in kernel mode instead",
                   fs_->cfg.fuse.open, id.status().message());
      fs_->mode = OpenMode::kKernel;
    }
    return id;
  }
  void Unregister(int id) override { fs_->io.load()->CloseBacking(id); }
  void Announce(uint64_t kino, const InodeOpens& st) override { fs_->KeeperPut(kino, st); }
  void Drop(uint64_t kino, int id) override { fs_->DropBacking(kino, id); }

 private:
  Fs* const fs_;
  std::atomic<bool> warned_{false};
};

}  // namespace

std::unique_ptr<BackingHost> MakeBackingHost(Fs* fs) { return std::make_unique<FsBackingHost>(fs); }

}  // namespace granary::fuse::internal
