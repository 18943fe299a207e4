// The FUSE operations on names and attributes: INIT, where the connection's read mode is chosen
// (ChooseMode, PassthroughSuits), lookup, getattr, opendir / readdir / readdirplus and statfs;
// the refusals of links, special files and extended attributes (EROFS, ENOSYS; the write calls
// are in fuse/ops_write.cc); and the namespace paths the access trace shows (TracePaths). Answers come from the
// master (fuse/client.h) or from what it said lately (EntryCache, Fs::dir_gens).
#include "fuse/ops.h"

#include <linux/capability.h>
#include <spdlog/spdlog.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <limits>
#include <map>
#include <memory>
#include <string>

#include "common/path.h"
#include "fuse/errno.h"
#include "fuse/fs_state.h"
#include "fuse/read_mode.h"

namespace granary::fuse::internal {
namespace {

constexpr uint64_t kDotCookie = 1;     // readdir offset after "."
constexpr uint64_t kDotDotCookie = 2;  // readdir offset after ".."; children use cookie + 2

// MemTotal from /proc/meminfo, in bytes; 0 when unknown.
uint64_t NodeMemoryBytes() {
  std::ifstream in("/proc/meminfo");
  std::string key;
  uint64_t kb = 0;
  while (in >> key >> kb) {
    if (key == "MemTotal:") return kb * 1024;
    in.ignore(std::numeric_limits<std::streamsize>::max(), '\n');
  }
  return 0;
}

// auto: AutoChoosesPassthrough (fuse/read_mode.h) for the datasets this mount shows, as far as the
// master knows them now (a dataset not listed yet counts as small).
bool PassthroughSuits(Fs* fs, std::string* why) {
  auto report = fs->client->GetReport();
  if (!report.ok()) {
    *why = "the master's report: " + report.status().message();
    return false;
  }
  uint64_t files = 0, bytes = 0;
  const std::string& root = fs->cfg.fuse.root;
  for (const auto& m : report->mounts()) {
    const std::string& p = m.mount().path();
    bool shown = PathWithin(p, root) || PathWithin(root, p);
    if (!shown) continue;
    files += m.mount().known_files();
    bytes += m.mount().known_bytes();
  }
  uint64_t memory = NodeMemoryBytes();
  *why = std::to_string(files) + " files known, " + std::to_string(files ? bytes / files : 0) +
         " bytes each on average, " + std::to_string(bytes >> 20) + " MiB in all against " + std::to_string(memory >> 20) +
         " MiB of memory";
  return AutoChoosesPassthrough(files, bytes, memory);
}

// Decides the connection's read mode once the kernel has said what it offers (INIT).
void ChooseMode(Fs* fs) {
  OpenMode mode = fs->wanted;
  if (mode == OpenMode::kPassthrough && !fs->wanted_explicitly) {
    std::string figures;
    if (!PassthroughSuits(fs, &figures)) {
      mode = OpenMode::kKernel;
      spdlog::info("fuse.open=auto: kernel mode, for small files that fit in the page cache ({})", figures);
    } else {
      spdlog::info("fuse.open=auto: passthrough where it can work, for large files or a dataset larger than half "
                   "the memory ({})", figures);
    }
  }
  if (mode == OpenMode::kPassthrough) {
    std::string why;
    if (SessionIo* io = fs->io.load(); io == nullptr || !io->offered()) {
      why = "the kernel does not offer FUSE passthrough (it needs Linux 6.9 or later with CONFIG_FUSE_PASSTHROUGH)";
    } else if (!HasCapSysAdmin()) {
      why = "granary-fuse lacks CAP_SYS_ADMIN, which the kernel requires to open backing files";
    }
    if (!why.empty()) {
      mode = OpenMode::kKernel;
      fs->fallback_reason = why;
      if (fs->wanted_explicitly) {
        spdlog::warn("fuse.open=passthrough: {}; serving in kernel mode instead", why);
      } else {
        spdlog::info("fuse.open=auto: {}; kernel mode", why);
      }
    }
  }
  if (SessionIo* io = fs->io.load()) io->SetWantPassthrough(mode == OpenMode::kPassthrough);
  fs->mode = mode;
  // auto's choice is not a fallback: "wanted" is what auto chose.
  if (!fs->wanted_explicitly && fs->wanted == OpenMode::kPassthrough && fs->fallback_reason.empty()) fs->wanted = mode;
  spdlog::info("granary-fuse read mode: {}", ModeName(mode));
}

}  // namespace

bool HasCapSysAdmin() {
  __user_cap_header_struct hdr{_LINUX_CAPABILITY_VERSION_3, 0};
  __user_cap_data_struct data[2]{};
  if (syscall(SYS_capget, &hdr, data) != 0) return false;
  return (data[0].effective & (1u << CAP_SYS_ADMIN)) != 0;
}

void OpInit(void* userdata, fuse_conn_info* conn) {
  const Connection* c = static_cast<Connection*>(userdata);
  Fs* fs = c->fs;
  // A connection taken over keeps the mode its predecessor told the kernel about (this INIT is a
  // replay, and its reply is not sent); a replacement connection keeps the mount's.
  const bool first = !fs->taken_over && !c->replacement;
  if (first) ChooseMode(fs);
  if (fs->cfg.fuse.transport == "uring" && first && fs->io.load() != nullptr && !fs->io.load()->uring_offered()) {
    spdlog::warn("fuse.transport=uring: the kernel does not offer FUSE over io_uring (it needs Linux >= 6.14 and "
                 "the fuse module's enable_uring=Y: echo Y > /sys/module/fuse/parameters/enable_uring); serving "
                 "through /dev/fuse");
  }
  // The kernel drops a file's cached pages when its attributes show a new size or mtime.
  if (conn->capable & FUSE_CAP_AUTO_INVAL_DATA) conn->want |= FUSE_CAP_AUTO_INVAL_DATA;
  if (conn->capable & FUSE_CAP_READDIRPLUS) conn->want |= FUSE_CAP_READDIRPLUS;
  if (conn->capable & FUSE_CAP_ASYNC_READ) conn->want |= FUSE_CAP_ASYNC_READ;
  conn->want &= ~FUSE_CAP_WRITEBACK_CACHE;
  // Let the kernel ask for up to 1 MiB at once: a ~110 KB image is then one request, not one per
  // 128 KiB, and sequential reads of large files need a quarter of the round trips. (libfuse sizes
  // the kernel's max_pages from max_write, read-only as this mount is.)
  conn->max_readahead = kMaxReadahead;
  conn->max_write = kMaxReadahead;
  // Cached blocks are handed to the kernel from their files (fuse_reply_data with an fd): splice
  // moves the pages instead of copying them through this process.
  if (conn->capable & FUSE_CAP_SPLICE_WRITE) conn->want |= FUSE_CAP_SPLICE_WRITE;
  if (conn->capable & FUSE_CAP_SPLICE_MOVE) conn->want |= FUSE_CAP_SPLICE_MOVE;
}

namespace {
// A lookup's entry for `a`; ESTALE instead, for a writable entry on an open-free connection that
// is not the mount point's any more (ToEntry may have just replaced it: SuperblockMode::
// NoteWritable), when this lookup began while it still was (it caused the swap, or waited for it),
// or once per process and name within Connection::kRedirectWindow of the swap (a walk that was
// under way, or a second LOOKUP after the kernel dropped a dentry the first one's ESTALE made
// invalid). The kernel then walks the path again from its start (once, LOOKUP_REVAL), which
// reaches the new connection: the write that follows finds a connection that takes it. Other
// lookups on a draining connection are answered: a process working in a directory of it reads
// on, and its writes get EROFS (its superblock is read-only).
void ReplyEntry(Fs* fs, Reply& r, Connection* conn, bool was_current, const rpc::Attr& a, double age_s,
                fuse_ino_t parent, const char* name) {
  fuse_entry_param e = ToEntry(fs, a);
  if (conn != nullptr && a.writable() && conn->open_free && fs->current.load() != conn &&
      (was_current || conn->RedirectOnce(r.pid(), parent, name))) {
    ReplyErrno(r, ESTALE);
    return;
  }
  e.attr_timeout = std::max(0.0, e.attr_timeout - age_s);
  e.entry_timeout = std::max(0.0, e.entry_timeout - age_s);
  r.Entry(e);
}
}  // namespace

void Lookup(Fs* fs, Reply& r, fuse_ino_t parent, const char* name) {
  OpScope scope(fs, r, "lookup", fs->lat_lookup, parent);
  if (scope.tracing()) scope.record().name = name;
  Connection* conn = fs->ConnOf(r);
  const bool was_current = conn != nullptr && conn == fs->current.load();
  // A lookup the master answered lately (the kernel may have dropped its dentry since) is answered
  // from memory, with the kernel's timeouts shortened by the answer's age: never staler than the
  // kernel's own caching would be.
  std::string key = EntryKey(fs->ToMaster(parent), name);
  std::chrono::milliseconds age{};
  if (auto cached = fs->entries->Get(key, &age); cached && FreshEnough(*cached, age)) {
    if (scope.tracing()) scope.record().child = cached->ino();
    ReplyEntry(fs, r, conn, was_current, *cached, Seconds(age), parent, name);
    return;
  }
  if (fs->known_dirs.Missing(fs->ToMaster(parent), name)) {
    // A directory this node made within the second, and a name it did not put there (the writer
    // making a new file): no master round trip (fuse/known_dirs.h).
    fuse_entry_param e{};
    if (scope.tracing()) scope.record().err = ENOENT;
    r.Entry(e);
    return;
  }
  if (WriteFiles* w = fs->WritesIfAny()) {
    // A file this node is writing, or wrote and has not uploaded yet, answers for itself.
    if (auto own = w->LookupWritten(fs->ToMaster(parent), name)) {
      fuse_entry_param e = ToEntry(fs, *own);
      if (scope.tracing()) scope.record().child = own->ino();
      r.Entry(e);
      return;
    }
  }
  rpc::FileInfo file;
  const auto asked = std::chrono::steady_clock::now();
  auto a = fs->client->Lookup(fs->ToMaster(parent), name, fs->open_notes ? &file : nullptr);
  if (a.ok()) fs->entries->Put(key, *a);
  if (a.ok()) fs->attrs->Put(a->ino(), *a);
  if (a.ok()) KeepListedFile(fs, file, asked);  // the open to come asks the master nothing
  if (!a.ok()) {
    if (a.status().IsNotFound()) {
      // Negative entry: the kernel remembers the miss for negative_timeout.
      fuse_entry_param e{};
      e.ino = 0;
      e.entry_timeout = fs->IsWritableDir(fs->ToMaster(parent)) ? 0 : Seconds(fs->cfg.fuse.negative_timeout);
      if (scope.tracing()) scope.record().err = ENOENT;
      r.Entry(e);
      return;
    }
    return ReplyError(r, a.status(), "lookup");
  }
  if (scope.tracing()) scope.record().child = a->ino();
  ReplyEntry(fs, r, conn, was_current, *a, 0, parent, name);
}

void OpForget(fuse_req_t req, fuse_ino_t, uint64_t) { fuse_reply_none(req); }
void OpForgetMulti(fuse_req_t req, size_t, fuse_forget_data*) { fuse_reply_none(req); }

void Getattr(Fs* fs, Reply& r, fuse_ino_t ino) {
  OpScope scope(fs, r, "getattr", fs->lat_getattr, ino);
  // Attributes the master gave lately (by getattr, a lookup or a listing) are answered from memory
  // with the kernel's timeout shortened by their age: never staler than the kernel's own caching.
  const uint64_t mino = fs->ToMaster(ino);
  std::chrono::milliseconds age{};
  if (auto cached = fs->attrs->Get(mino, &age); cached && FreshEnough(*cached, age)) {
    struct stat st = ToStat(fs, *cached);
    r.Attr(st, std::max(0.0, WritableAttrTimeout(fs, *cached) - Seconds(age)));
    return;
  }
  // A file being written here (or staged, write=back) is this node's own: its attributes are the
  // master's answer to the write's open with the size written, without asking again (a writer's
  // fstat and the kernel's checks around each close would cost a master round trip each).
  if (WriteFiles* w = fs->WritesIfAny(); w != nullptr && w->Has(ino)) {
    if (auto own = w->AttrOf(ino)) {
      struct stat st = ToStat(fs, *own);
      r.Attr(st, 0);
      return;
    }
  }
  auto a = fs->client->GetAttr(mino);
  if (!a.ok()) return ReplyError(r, a.status(), "getattr");
  fs->attrs->Put(mino, *a);
  if (a->type() != rpc::DIRECTORY) fs->NoteVersion(ino, a->version_hash());
  if (a->type() == rpc::DIRECTORY && a->writable()) fs->NoteWritableDir(mino);
  struct stat st = ToStat(fs, *a);
  if (a->writable() && a->type() != rpc::DIRECTORY) {
    if (WriteFiles* w = fs->WritesIfAny()) {
      if (auto size = w->SizeOf(ino)) {  // being written here: the size written so far
        st.st_size = static_cast<off_t>(*size);
        st.st_blocks = static_cast<blkcnt_t>((*size + 511) / 512);
      }
    }
  }
  r.Attr(st, WritableAttrTimeout(fs, *a));
}

// The kernel may cache a directory's listing (cache_readdir); it keeps the cached listing across
// opens (keep_cache) only while the master reports the same generation for the directory, which
// changes whenever its entries change (a sync, a mount). The generation is asked for at most once
// per fuse.attr_timeout per directory (the same staleness the kernel's attribute cache has); asking
// also lets the master run a sync that is due.
void Opendir(Fs* fs, Reply& r, fuse_ino_t ino, fuse_file_info* fi) {
  OpScope scope(fs, r, "opendir", nullptr, ino);
  uint64_t master_ino = fs->ToMaster(ino);
  auto now = std::chrono::steady_clock::now();
  fi->cache_readdir = 1;
  fi->keep_cache = 0;
  {
    MutexLock lock(&fs->dir_gens_mu);
    const Fs::DirGen* known = fs->dir_gens.Find(master_ino);
    if (known != nullptr && !known->writable && now - known->checked < fs->cfg.fuse.attr_timeout) {
      fi->keep_cache = 1;
      r.Open(*fi);
      return;
    }
  }
  // The directory's generation from its lookup or its parent's listing when that is younger than
  // fuse.attr_timeout (as fresh as the kernel's own attributes of it), else from the master: a
  // directory found by a listing and opened right after costs no GetAttr. Below a writable mount
  // every opendir asks (close-to-open).
  std::chrono::milliseconds age{};
  auto cached = fs->attrs->Get(master_ino, &age);
  const bool from_cache = cached && !cached->writable() && cached->type() == rpc::DIRECTORY;
  StatusOr<rpc::Attr> a = from_cache ? StatusOr<rpc::Attr>(*cached) : fs->client->GetAttr(master_ino);
  if (!a.ok()) {
    fi->cache_readdir = 0;
    r.Open(*fi);  // the error shows on readdir
    return;
  }
  const auto confirmed = from_cache ? now - age : now;  // when the master said it
  {
    MutexLock lock(&fs->dir_gens_mu);
    auto [gen, fresh] = fs->dir_gens.TryEmplace(master_ino, Fs::DirGen{a->generation(), confirmed, a->writable()});
    if (!fresh && gen->generation == a->generation()) fi->keep_cache = 1;
    *gen = Fs::DirGen{a->generation(), confirmed, a->writable()};
  }
  r.Open(*fi);
}

namespace {

// Whether the master said, less than fuse.attr_timeout ago, that directory `dir`'s listing ends
// after cookie `after`. A listing that fits one reply is followed by the kernel's readdir at its
// last offset, which must come back empty: answered from this, a directory listed costs the master
// one call instead of two. (A name added in between shows at the next listing, as with the
// kernel's own cached listings.) Below a writable mount every listing asks.
bool KnownEnd(Fs* fs, uint64_t dir, uint64_t after) {
  MutexLock lock(&fs->dir_gens_mu);
  const Fs::DirGen* g = fs->dir_gens.Find(dir);
  return g != nullptr && !g->writable && g->end_after == after &&
         std::chrono::steady_clock::now() - g->end_at < fs->cfg.fuse.attr_timeout;
}

void NoteEnd(Fs* fs, uint64_t dir, uint64_t after, std::chrono::steady_clock::time_point asked) {
  MutexLock lock(&fs->dir_gens_mu);
  if (Fs::DirGen* g = fs->dir_gens.Find(dir)) {
    g->end_after = after;
    g->end_at = asked;
  }
}

void ReadDirCommon(Fs* fs, Reply& r, fuse_ino_t ino, size_t size, off_t off, bool plus) {
  std::string buf(size, '\0');
  size_t used = 0;
  auto add = [&](const char* name, const rpc::Attr& a, uint64_t next_off, bool is_dot) -> bool {
    size_t n;
    if (plus) {
      fuse_entry_param e{};
      if (is_dot) {
        e.attr.st_ino = fs->ToKernel(a.ino());
        e.attr.st_mode = S_IFDIR;
      } else {
        e = ToEntry(fs, a);
      }
      n = r.AddDirentPlus(buf.data() + used, size - used, name, e, static_cast<off_t>(next_off));
    } else {
      struct stat st = ToStat(fs, a);
      n = r.AddDirent(buf.data() + used, size - used, name, st, static_cast<off_t>(next_off));
    }
    if (n > size - used) return false;
    used += n;
    return true;
  };
  const uint64_t mdir = fs->ToMaster(ino);
  uint64_t pos = static_cast<uint64_t>(off);
  if (pos < kDotCookie) {
    rpc::Attr self;
    self.set_ino(mdir);
    self.set_type(rpc::DIRECTORY);
    if (!add(".", self, kDotCookie, true)) return (void)r.Buf(buf.data(), used);
    pos = kDotCookie;
  }
  if (pos < kDotDotCookie) {
    rpc::Attr parent;
    parent.set_ino(fs->root_ino);
    if (ino != FUSE_ROOT_ID) {
      // The directory's attributes from its lookup or its parent's listing, when fresh enough for a
      // getattr: a master round trip per directory listed saved.
      std::chrono::milliseconds age{};
      if (auto cached = fs->attrs->Get(mdir, &age); cached && cached->parent() != 0 && FreshEnough(*cached, age)) {
        parent.set_ino(cached->parent());
      } else {
        auto self = fs->client->GetAttr(mdir);
        if (!self.ok()) return ReplyError(r, self.status(), "readdir");
        fs->attrs->Put(mdir, *self);
        parent.set_ino(self->parent());
      }
    }
    parent.set_type(rpc::DIRECTORY);
    if (!add("..", parent, kDotDotCookie, true)) return (void)r.Buf(buf.data(), used);
    pos = kDotDotCookie;
  }
  uint64_t after = pos - kDotDotCookie;
  if (KnownEnd(fs, mdir, after)) return (void)r.Buf(buf.data(), used);
  // Ask for about as many entries as fit; a name costs ~24 bytes plain, ~150 with attributes.
  uint32_t limit = static_cast<uint32_t>(std::clamp<size_t>(size / (plus ? 150 : 32), 16, 4096));
  for (;;) {
    rpc::ReadDirResponse page;
    const auto asked = std::chrono::steady_clock::now();
    Status st = fs->client->ReadDir(mdir, after, limit, &page, fs->open_notes != nullptr);
    if (!st.ok()) {
      if (used > 0) break;  // return what we have; the error shows on the next call
      return ReplyError(r, st, plus ? "readdirplus" : "readdir");
    }
    for (const auto& e : page.entries()) {
      fs->entries->Put(EntryKey(mdir, e.name().c_str()), e.attr());  // the scan's lookups to come
      fs->attrs->Put(e.attr().ino(), e.attr());
      KeepListedFile(fs, e.file(), asked);  // the scan's opens to come ask the master nothing
      if (!add(e.name().c_str(), e.attr(), e.cookie() + kDotDotCookie, false)) {
        return (void)r.Buf(buf.data(), used);
      }
      after = e.cookie();
    }
    if (page.end() || page.entries_size() == 0) {
      NoteEnd(fs, mdir, after, asked);
      break;
    }
  }
  r.Buf(buf.data(), used);
}

}  // namespace

void Readdir(Fs* fs, Reply& r, fuse_ino_t ino, size_t size, off_t off) {
  OpScope scope(fs, r, "readdir", fs->lat_readdir, ino);
  ReadDirCommon(fs, r, ino, size, off, false);
}
void Readdirplus(Fs* fs, Reply& r, fuse_ino_t ino, size_t size, off_t off) {
  OpScope scope(fs, r, "readdirplus", fs->lat_readdir, ino);
  ReadDirCommon(fs, r, ino, size, off, true);
}


void Statfs(Fs* fs, Reply& r) {
  OpScope scope(fs, r, "statfs", fs->lat_statfs, FUSE_ROOT_ID);
  auto s = fs->client->WorkerStats();
  if (!s.ok()) return ReplyError(r, s.status(), "statfs");
  struct statvfs v {};
  v.f_bsize = 4096;
  v.f_frsize = 4096;
  v.f_blocks = s->capacity_bytes() / 4096;
  uint64_t free_bytes = s->capacity_bytes() > s->used_bytes() ? s->capacity_bytes() - s->used_bytes() : 0;
  v.f_bfree = free_bytes / 4096;
  v.f_bavail = v.f_bfree;
  v.f_namemax = 255;
  r.Statfs(v);
}

// ---- The adapters to libfuse ----

void OpLookup(fuse_req_t req, fuse_ino_t parent, const char* name) {
  FuseReply r(req);
  Lookup(FsOf(req), r, parent, name);
}
void OpGetattr(fuse_req_t req, fuse_ino_t ino, fuse_file_info*) {
  FuseReply r(req);
  Getattr(FsOf(req), r, ino);
}
void OpOpendir(fuse_req_t req, fuse_ino_t ino, fuse_file_info* fi) {
  FuseReply r(req);
  Opendir(FsOf(req), r, ino, fi);
}
void OpReaddir(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off, fuse_file_info*) {
  FuseReply r(req);
  Readdir(FsOf(req), r, ino, size, off);
}
void OpReaddirplus(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off, fuse_file_info*) {
  FuseReply r(req);
  Readdirplus(FsOf(req), r, ino, size, off);
}
void OpReleasedir(fuse_req_t req, fuse_ino_t, fuse_file_info*) { fuse_reply_err(req, 0); }
void OpStatfs(fuse_req_t req, fuse_ino_t) {
  FuseReply r(req);
  Statfs(FsOf(req), r);
}

// No extended attributes. ENOSYS makes the kernel remember that and answer EOPNOTSUPP itself, so
// `ls -l` (which asks for ACLs and security labels of every file) costs no request per file.
void OpGetxattr(fuse_req_t req, fuse_ino_t, const char*, size_t) { ReplyUnsupported(req); }
void OpListxattr(fuse_req_t req, fuse_ino_t, size_t) { ReplyUnsupported(req); }
void OpReadlink(fuse_req_t req, fuse_ino_t) { ReplyErrno(req, EINVAL); }

// Links, special files and extended attributes are not kept by any under-storage Granary writes
// to: EROFS below a read-only mount, EOPNOTSUPP below a writable one is left to the kernel (these
// reach granary-fuse only on the first try). The write calls are in fuse/ops_write.cc.
void OpMknod(fuse_req_t req, fuse_ino_t, const char*, mode_t, dev_t) { ReplyErrno(req, EROFS); }
void OpSymlink(fuse_req_t req, const char*, fuse_ino_t, const char*) { ReplyErrno(req, EROFS); }
void OpLink(fuse_req_t req, fuse_ino_t, fuse_ino_t, const char*) { ReplyErrno(req, EROFS); }
void OpSetxattr(fuse_req_t req, fuse_ino_t, const char*, const char*, size_t, int) { ReplyErrno(req, EROFS); }
void OpRemovexattr(fuse_req_t req, fuse_ino_t, const char*) { ReplyErrno(req, EROFS); }
void OpFallocate(fuse_req_t req, fuse_ino_t, int, off_t, off_t, fuse_file_info*) { ReplyErrno(req, EROFS); }

namespace {

// A directory's namespace path: its parent's, and its name found in the parent's listing (asked
// of the master; only the access trace needs it, once per directory per listener). "" when unknown.
std::string DirPath(Fs* fs, uint64_t ino, int depth = 0) {
  if (ino == fs->root_ino) return fs->cfg.fuse.root.empty() ? "/" : fs->cfg.fuse.root;
  if (depth > 256) return "";
  auto a = fs->client->GetAttr(ino);
  if (!a.ok() || a->parent() == 0) return "";
  if (a->parent() == ino) return "/";  // the namespace's root
  std::string parent = DirPath(fs, a->parent(), depth + 1);
  if (parent.empty()) return "";
  uint64_t after = 0;
  for (int pages = 0; pages < 10000; ++pages) {
    rpc::ReadDirResponse r;
    if (!fs->client->ReadDir(a->parent(), after, 1000, &r).ok()) return "";
    for (const auto& e : r.entries()) {
      after = e.cookie();
      if (e.attr().ino() == ino) return parent == "/" ? "/" + e.name() : parent + "/" + e.name();
    }
    if (r.end() || r.entries_size() == 0) break;
  }
  return "";
}

}  // namespace

// Namespace paths for the access trace: the root, files (their mount's path joined with their
// under-storage path) and directories (DirPath). The tracer caches them per listener.
Tracer::PathFn TracePaths(Fs* fs) {
  struct Mounts {
    Mutex mu;
    std::map<uint64_t, std::string> paths GUARDED_BY(mu);  // mount id -> namespace path
  };
  auto mounts = std::make_shared<Mounts>();
  return [fs, mounts](uint64_t ino) -> std::string {
    if (ino == fs->root_ino) return fs->cfg.fuse.root.empty() ? "/" : fs->cfg.fuse.root;
    auto info = FileInfoOf(fs, ino);
    if (!info.ok()) return DirPath(fs, ino);
    MutexLock lock(&mounts->mu);
    auto it = mounts->paths.find(info->mount_id());
    if (it == mounts->paths.end()) {
      auto report = fs->client->GetReport();  // a new mount: learn the mounts' paths again
      if (report.ok()) {
        for (const auto& mr : report->mounts()) mounts->paths[mr.mount().id()] = mr.mount().path();
      }
      it = mounts->paths.find(info->mount_id());
      if (it == mounts->paths.end()) return "";
    }
    return info->ufs_path().empty() ? it->second : it->second + "/" + info->ufs_path();
  };
}

}  // namespace granary::fuse::internal
