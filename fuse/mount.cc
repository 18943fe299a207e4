#include "fuse/mount.h"

#include <spdlog/spdlog.h>
#include <linux/capability.h>
#include <dirent.h>
#include <poll.h>
#include <signal.h>
#include <sys/mount.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/sysmacros.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <cerrno>
#include <climits>
#include <cstring>
#include <fstream>
#include <limits>
#include <optional>
#include <random>
#include <sstream>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <thread>
#include <unordered_map>

#include "common/fs.h"
#include "common/metrics.h"
#include "common/path.h"
#include "common/shutdown.h"
#include "common/stream_socket.h"
#include "fuse/client.h"
#include "fuse/errno.h"
#include "fuse/file_cache.h"
#include "fuse/handover.h"
#include "fuse/read_mode.h"
#include "fuse/session_io.h"
#include "fuse/trace.h"

#include <nlohmann/json.hpp>

namespace granary::fuse {
namespace {

constexpr uint64_t kDotCookie = 1;     // readdir offset after "."
constexpr uint64_t kDotDotCookie = 2;  // readdir offset after ".."; children use cookie + 2

double Seconds(std::chrono::milliseconds ms) { return static_cast<double>(ms.count()) / 1000.0; }

// How opens and reads are served on this connection (fuse.open; see docs/configuration.md).
enum class OpenMode { kDaemon = 0, kKernel = 1, kPassthrough = 2 };
const char* ModeName(OpenMode m) {
  switch (m) {
    case OpenMode::kDaemon: return "daemon";
    case OpenMode::kKernel: return "kernel";
    case OpenMode::kPassthrough: return "passthrough";
  }
  return "?";
}

struct OpenFile {
  rpc::FileInfo info;
  bool passthrough = false;    // opened on a backing file: the kernel reads it, not us
  bool counted_cached = false; // counted in InodeOpens::cached (passthrough mode's bookkeeping)
  std::chrono::steady_clock::time_point confirmed{};  // kernel mode: when the master last confirmed info
  // Readahead state: where the next sequential read would start, and the last block hinted.
  std::mutex mu;
  uint64_t next_offset = 0;
  uint64_t hinted_through = 0;  // blocks up to this one were hinted (block 0 never is)
};

// Passthrough mode: what is open on each inode. The kernel puts an inode either in passthrough io
// mode (every open on one backing file) or in cached io mode, and fails an open that asks for the
// other one (ETXTBSY) — so new opens follow the mode the inode is in.
struct InodeOpens {
  int passthrough = 0;  // open files reading from `lease` through the kernel
  int cached = 0;       // open files served by granary-fuse through the page cache
  std::string version;  // the version `lease` holds
  int backing_id = 0;
  rpc::FileInfo info;   // the file `lease` holds (for a successor, fuse/handover.h)
  std::unique_ptr<FileLease> lease;  // null after a hand-over whose re-lease failed
  uint64_t bytes = 0;   // the file's size
  // Closed, but its backing file kept for a reopen (in Fs::idle, at this sequence number; 0: not).
  uint64_t idle_seq = 0;
  std::chrono::steady_clock::time_point idle_since{};
};

// Passthrough: how many closed files keep their backing file (and their blocks held on the
// worker) so that reopening them costs one OPEN round trip instead of a lease and an ioctl, and
// for how many bytes of files at most. A kept file is let go after fuse.attr_timeout.
constexpr size_t kIdleBackingFiles = 4096;
constexpr uint64_t kIdleBackingBytes = 1ull << 30;

// Everything the operations need; the session's userdata.
struct Fs {
  Config cfg;
  std::unique_ptr<Client> client;
  std::unique_ptr<FileCache> files;
  std::unique_ptr<EntryCache> entries;  // lookups, for min(entry_timeout, attr_timeout)
  fuse_session* se = nullptr;
  SessionIo* io = nullptr;  // set when granary-fuse does the session's I/O (passthrough wanted)
  std::atomic<OpenMode> wanted{OpenMode::kKernel};  // from fuse.open (auto: its choice at INIT)
  bool wanted_explicitly = false;       // fuse.open named the mode: a fallback is a warning
  std::atomic<OpenMode> mode{OpenMode::kKernel};  // decided at INIT
  std::atomic<bool> passthrough_refused{false};    // the kernel refused a backing file (no CAP_SYS_ADMIN)
  std::string fallback_reason;                     // why the wanted mode is not the mode (set at INIT)

  struct DirGen {
    uint64_t generation;                           // whose listing the kernel may hold
    std::chrono::steady_clock::time_point checked;  // when the master last confirmed it
  };
  std::mutex dir_gens_mu;
  std::unordered_map<uint64_t, DirGen> dir_gens;  // master ino -> DirGen
  // Daemon mode: the version whose bytes the kernel's page cache may hold for a file: the one it
  // was last opened at. An open of the same version keeps those pages (keep_cache); another
  // version drops them.
  std::mutex page_versions_mu;
  std::unordered_map<uint64_t, std::string> page_versions;  // master ino -> version
  // Every mode: the version hash each file's attributes last carried. A change that the kernel
  // cannot see in size or mtime (a new ETag) drops its cached pages through the invalidator.
  std::mutex attr_versions_mu;
  std::unordered_map<uint64_t, uint64_t> attr_versions;  // kernel ino -> Attr.version_hash
  // Kernel mode: each file read since its info was last confirmed (no open carries it).
  std::mutex inode_files_mu;
  std::unordered_map<uint64_t, std::shared_ptr<OpenFile>> inode_files;  // kernel ino -> newest known file
  // Kernel mode: the version each reading process is on, per file (no open pins it). A read at
  // offset 0 moves the process to the newest version; a read further in stays on its version.
  struct PidKey {
    uint64_t ino;
    pid_t pid;
    bool operator==(const PidKey& o) const { return ino == o.ino && pid == o.pid; }
  };
  struct PidKeyHash {
    size_t operator()(const PidKey& k) const { return std::hash<uint64_t>()(k.ino * 0x9e3779b97f4a7c15ull ^ k.pid); }
  };
  std::unordered_map<PidKey, std::shared_ptr<OpenFile>, PidKeyHash> reader_files;  // GUARDED_BY(inode_files_mu)
  // Passthrough mode.
  std::mutex opens_mu;
  std::unordered_map<uint64_t, InodeOpens> opens;  // kernel ino -> opens; GUARDED_BY(opens_mu)
  std::map<uint64_t, uint64_t> idle;               // idle_seq -> kernel ino, oldest first; GUARDED_BY(opens_mu)
  uint64_t idle_bytes = 0, idle_next = 1;          // GUARDED_BY(opens_mu)

  // Open file handles (fi->fh) of daemon-served opens and passthrough opens. The numbers carry a
  // random epoch in their top bits, so a handle of a crashed predecessor (which the kernel still
  // sends) never names one of ours; such a handle is rebuilt from its inode (OpRead).
  std::mutex handles_mu;
  std::unordered_map<uint64_t, std::shared_ptr<OpenFile>> handles;  // GUARDED_BY(handles_mu)
  uint64_t next_fh = 0;                                             // GUARDED_BY(handles_mu)
  uint64_t AddHandle(std::shared_ptr<OpenFile> of) {
    std::lock_guard<std::mutex> lock(handles_mu);
    uint64_t fh = next_fh++;
    handles.emplace(fh, std::move(of));
    return fh;
  }
  // The handle `fh` when it is of inode `kino` (a stale or foreign number: null).
  std::shared_ptr<OpenFile> FindHandle(uint64_t fh, uint64_t kino) {
    std::lock_guard<std::mutex> lock(handles_mu);
    auto it = handles.find(fh);
    if (it == handles.end() || ToKernel(it->second->info.attr().ino()) != kino) return nullptr;
    return it->second;
  }
  std::shared_ptr<OpenFile> TakeHandle(uint64_t fh, uint64_t kino) {
    std::lock_guard<std::mutex> lock(handles_mu);
    auto it = handles.find(fh);
    if (it == handles.end() || ToKernel(it->second->info.attr().ino()) != kino) return nullptr;
    auto of = std::move(it->second);
    handles.erase(it);
    return of;
  }
  void AdoptHandle(uint64_t fh, std::shared_ptr<OpenFile> of) {
    std::lock_guard<std::mutex> lock(handles_mu);
    if (handles.size() < 1'000'000) handles.emplace(fh, std::move(of));
  }

  // Hand-over (fuse/handover.h). The keeper is told about backing ids as they change.
  std::unique_ptr<KeeperLink> keeper;
  bool taken_over = false;        // this process took the connection over: the mode is the predecessor's
  void KeeperPut(uint64_t kino, const InodeOpens& st) {
    if (!keeper) return;
    rpc::FuseBacking b;
    b.set_kino(kino);
    b.set_backing_id(st.backing_id);
    *b.mutable_info() = st.info;
    keeper->PutBacking(b);
  }
  // An open file handle as a successor gets it (a hand-over, or the keeper).
  rpc::FuseHandle HandleOf(uint64_t fh, const OpenFile& of) const {
    rpc::FuseHandle h;
    h.set_fh(fh);
    h.set_kino(ToKernel(of.info.attr().ino()));
    *h.mutable_info() = of.info;
    h.set_passthrough(of.passthrough);
    h.set_counted_cached(of.counted_cached);
    return h;
  }
  // Lets a backing id go: the keeper hears of it first (fuse/handover.h says why).
  void DropBacking(uint64_t kino, int backing_id) {
    if (!keeper || keeper->DropBacking(kino, backing_id)) io->CloseBacking(backing_id);
  }

  // Invalidations of cached pages, sent from their own thread: a notification from inside a
  // request for the same inode could deadlock on the pages that request holds.
  std::mutex inval_mu;
  std::condition_variable inval_cv;
  std::deque<uint64_t> inval_queue;  // kernel inos
  bool inval_stop = false;
  std::thread inval_thread;

  uint64_t root_ino = FUSE_ROOT_ID;  // master inode shown as the kernel's root (fuse.root)
  // Latency of each operation, for /metrics (histograms made up front: no lock on the hot path).
  metrics::HistogramSet op_latency{"op"};
  metrics::Histogram* lat_lookup = &op_latency.Get("lookup");
  metrics::Histogram* lat_getattr = &op_latency.Get("getattr");
  metrics::Histogram* lat_readdir = &op_latency.Get("readdir");
  metrics::Histogram* lat_open = &op_latency.Get("open");
  metrics::Histogram* lat_read = &op_latency.Get("read");
  metrics::Histogram* lat_release = &op_latency.Get("release");
  metrics::Histogram* lat_statfs = &op_latency.Get("statfs");
  std::atomic<uint64_t> read_bytes{0};
  std::atomic<uint64_t> opens_passthrough{0}, opens_daemon{0}, opens_kernel{0};
  std::atomic<uint64_t> reads_by_inode{0};  // kernel mode: reads with no open file handle
  std::atomic<uint64_t> passthrough_misses{0};  // passthrough mode: opens served by granary-fuse instead
  std::atomic<uint64_t> invalidations{0};
  std::atomic<uint64_t> files_read{0};  // reads at offset 0: files readers started on
  // Bytes returned to readers per mount id, by where they came from (NodeSource).
  std::mutex mount_bytes_mu;
  std::map<uint64_t, std::array<uint64_t, 3>> mount_bytes;  // GUARDED_BY(mount_bytes_mu)
  std::unique_ptr<Tracer> tracer;  // the access trace (fuse/trace.h)

  // The kernel's root inode is always 1; fuse.root may name another master inode.
  uint64_t ToMaster(fuse_ino_t ino) const { return ino == FUSE_ROOT_ID ? root_ino : ino; }
  uint64_t ToKernel(uint64_t ino) const { return ino == root_ino ? FUSE_ROOT_ID : ino; }

  void Invalidate(uint64_t kino) {
    std::lock_guard<std::mutex> lock(inval_mu);
    if (inval_queue.size() < 100000) inval_queue.push_back(kino);
    inval_cv.notify_one();
  }
  // Runs the invalidations; once a second also lets go of kept passthrough backing files that
  // outlived attr_timeout (trim_idle).
  std::function<void()> trim_idle;
  void InvalidateLoop() {
    auto last_trim = std::chrono::steady_clock::now();
    for (;;) {
      uint64_t kino;
      {
        std::unique_lock<std::mutex> lock(inval_mu);
        inval_cv.wait_for(lock, std::chrono::seconds(1), [&] { return inval_stop || !inval_queue.empty(); });
        if (inval_stop) return;
        if (inval_queue.empty() || std::chrono::steady_clock::now() - last_trim > std::chrono::seconds(1)) {
          lock.unlock();
          if (trim_idle) trim_idle();
          last_trim = std::chrono::steady_clock::now();
          continue;
        }
        kino = inval_queue.front();
        inval_queue.pop_front();
      }
      // -ENOENT: the kernel holds nothing of that inode. Fine.
      fuse_lowlevel_notify_inval_inode(se, kino, 0, 0);
      invalidations++;
    }
  }
  // Records the version a file's attributes carry; a change drops the kernel's pages of it.
  void NoteVersion(uint64_t kino, uint64_t version_hash) {
    if (version_hash == 0) return;
    {
      std::lock_guard<std::mutex> lock(attr_versions_mu);
      if (attr_versions.size() > std::max<uint64_t>(cfg.fuse.file_cache_entries, 1024)) attr_versions.clear();
      auto [it, fresh] = attr_versions.try_emplace(kino, version_hash);
      if (fresh || it->second == version_hash) return;
      it->second = version_hash;
    }
    Invalidate(kino);
  }
};

constexpr unsigned kMaxReadahead = 1 << 20;  // bytes the kernel may ask for in one read

Fs* FsOf(fuse_req_t req) { return static_cast<Fs*>(fuse_req_userdata(req)); }

// Times one operation into its histogram (may be null) and, while someone listens to the access
// trace, records it (fuse/trace.h): with no listener it costs one atomic load. Construct it before
// replying (the request's context is gone after the reply).
class OpScope {
 public:
  OpScope(fuse_req_t req, const char* op, metrics::Histogram* h, fuse_ino_t ino)
      : fs_(FsOf(req)), h_(h), start_(std::chrono::steady_clock::now()),
        tracing_(fs_->tracer && fs_->tracer->Listening()) {
    if (!tracing_) return;
    TakeReplyErrno();
    rec_.time_ns = std::chrono::duration_cast<std::chrono::nanoseconds>(
                       std::chrono::system_clock::now().time_since_epoch()).count();
    if (const fuse_ctx* ctx = fuse_req_ctx(req)) {
      rec_.pid = static_cast<uint32_t>(ctx->pid);
      rec_.uid = ctx->uid;
    }
    rec_.op = op;
    rec_.ino = fs_->ToMaster(ino);
  }
  ~OpScope() {
    double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
    if (h_) h_->Observe(secs);
    if (!tracing_) return;
    int replied = TakeReplyErrno();
    if (rec_.err == 0) rec_.err = replied;
    rec_.latency = secs;
    fs_->tracer->Emit(std::move(rec_));
  }
  OpScope(const OpScope&) = delete;
  OpScope& operator=(const OpScope&) = delete;
  bool tracing() const { return tracing_; }
  TraceRecord& record() { return rec_; }

 private:
  Fs* fs_;
  metrics::Histogram* h_;
  std::chrono::steady_clock::time_point start_;
  const bool tracing_;
  TraceRecord rec_;
};

struct stat ToStat(const Fs* fs, const rpc::Attr& a) {
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

fuse_entry_param ToEntry(Fs* fs, const rpc::Attr& a) {
  if (a.type() != rpc::DIRECTORY) fs->NoteVersion(fs->ToKernel(a.ino()), a.version_hash());
  fuse_entry_param e{};
  e.ino = fs->ToKernel(a.ino());
  e.generation = 1;
  e.attr = ToStat(fs, a);
  e.attr_timeout = Seconds(fs->cfg.fuse.attr_timeout);
  e.entry_timeout = Seconds(fs->cfg.fuse.entry_timeout);
  return e;
}

// ---- operations -----------------------------------------------------------------------------

bool HasCapSysAdmin() {
  __user_cap_header_struct hdr{_LINUX_CAPABILITY_VERSION_3, 0};
  __user_cap_data_struct data[2]{};
  if (syscall(SYS_capget, &hdr, data) != 0) return false;
  return (data[0].effective & (1u << CAP_SYS_ADMIN)) != 0;
}

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
    if (fs->io == nullptr || !fs->io->offered()) {
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
  if (fs->io != nullptr) fs->io->SetWantPassthrough(mode == OpenMode::kPassthrough);
  fs->mode = mode;
  // auto's choice is not a fallback: "wanted" is what auto chose.
  if (!fs->wanted_explicitly && fs->wanted == OpenMode::kPassthrough && fs->fallback_reason.empty()) fs->wanted = mode;
  spdlog::info("granary-fuse read mode: {}", ModeName(mode));
}

void OpInit(void* userdata, fuse_conn_info* conn) {
  Fs* fs = static_cast<Fs*>(userdata);
  // A connection taken over keeps the mode its predecessor told the kernel about (this INIT is a
  // replay, and its reply is not sent).
  if (!fs->taken_over) ChooseMode(fs);
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

void OpLookup(fuse_req_t req, fuse_ino_t parent, const char* name) {
  OpScope scope(req, "lookup", FsOf(req)->lat_lookup, parent);
  if (scope.tracing()) scope.record().name = name;
  Fs* fs = FsOf(req);
  // A lookup the master answered lately (the kernel may have dropped its dentry since) is answered
  // from memory, with the kernel's timeouts shortened by the answer's age: never staler than the
  // kernel's own caching would be.
  std::string key = EntryKey(fs->ToMaster(parent), name);
  std::chrono::milliseconds age{};
  if (auto cached = fs->entries->Get(key, &age)) {
    fuse_entry_param e = ToEntry(fs, *cached);
    if (scope.tracing()) scope.record().child = cached->ino();
    e.attr_timeout = std::max(0.0, e.attr_timeout - Seconds(age));
    e.entry_timeout = std::max(0.0, e.entry_timeout - Seconds(age));
    fuse_reply_entry(req, &e);
    return;
  }
  auto a = fs->client->Lookup(fs->ToMaster(parent), name);
  if (a.ok()) fs->entries->Put(key, *a);
  if (!a.ok()) {
    if (a.status().IsNotFound()) {
      // Negative entry: the kernel remembers the miss for negative_timeout.
      fuse_entry_param e{};
      e.ino = 0;
      e.entry_timeout = Seconds(fs->cfg.fuse.negative_timeout);
      if (scope.tracing()) scope.record().err = ENOENT;
      fuse_reply_entry(req, &e);
      return;
    }
    return ReplyError(req, a.status(), "lookup");
  }
  fuse_entry_param e = ToEntry(fs, *a);
  if (scope.tracing()) scope.record().child = a->ino();
  fuse_reply_entry(req, &e);
}

void OpForget(fuse_req_t req, fuse_ino_t, uint64_t) { fuse_reply_none(req); }
void OpForgetMulti(fuse_req_t req, size_t, fuse_forget_data*) { fuse_reply_none(req); }

void OpGetattr(fuse_req_t req, fuse_ino_t ino, fuse_file_info*) {
  OpScope scope(req, "getattr", FsOf(req)->lat_getattr, ino);
  Fs* fs = FsOf(req);
  auto a = fs->client->GetAttr(fs->ToMaster(ino));
  if (!a.ok()) return ReplyError(req, a.status(), "getattr");
  if (a->type() != rpc::DIRECTORY) fs->NoteVersion(ino, a->version_hash());
  struct stat st = ToStat(fs, *a);
  fuse_reply_attr(req, &st, Seconds(fs->cfg.fuse.attr_timeout));
}

// The kernel may cache a directory's listing (cache_readdir); it keeps the cached listing across
// opens (keep_cache) only while the master reports the same generation for the directory, which
// changes whenever its entries change (a sync, a mount). The generation is asked for at most once
// per fuse.attr_timeout per directory (the same staleness the kernel's attribute cache has); asking
// also lets the master run a sync that is due.
void OpOpendir(fuse_req_t req, fuse_ino_t ino, fuse_file_info* fi) {
  OpScope scope(req, "opendir", nullptr, ino);
  Fs* fs = FsOf(req);
  uint64_t master_ino = fs->ToMaster(ino);
  auto now = std::chrono::steady_clock::now();
  fi->cache_readdir = 1;
  fi->keep_cache = 0;
  {
    std::lock_guard<std::mutex> lock(fs->dir_gens_mu);
    auto it = fs->dir_gens.find(master_ino);
    if (it != fs->dir_gens.end() && now - it->second.checked < fs->cfg.fuse.attr_timeout) {
      fi->keep_cache = 1;
      fuse_reply_open(req, fi);
      return;
    }
  }
  auto a = fs->client->GetAttr(master_ino);
  if (!a.ok()) {
    fi->cache_readdir = 0;
    fuse_reply_open(req, fi);  // the error shows on readdir
    return;
  }
  {
    std::lock_guard<std::mutex> lock(fs->dir_gens_mu);
    if (fs->dir_gens.size() > 1'000'000) fs->dir_gens.clear();  // bounded; forgetting costs a re-read
    auto [it, fresh] = fs->dir_gens.try_emplace(master_ino, Fs::DirGen{a->generation(), now});
    if (!fresh && it->second.generation == a->generation()) fi->keep_cache = 1;
    it->second = Fs::DirGen{a->generation(), now};
  }
  fuse_reply_open(req, fi);
}

void ReadDirCommon(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off, bool plus) {
  Fs* fs = FsOf(req);
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
      n = fuse_add_direntry_plus(req, buf.data() + used, size - used, name, &e, static_cast<off_t>(next_off));
    } else {
      struct stat st = ToStat(fs, a);
      n = fuse_add_direntry(req, buf.data() + used, size - used, name, &st, static_cast<off_t>(next_off));
    }
    if (n > size - used) return false;
    used += n;
    return true;
  };
  uint64_t pos = static_cast<uint64_t>(off);
  if (pos < kDotCookie) {
    rpc::Attr self;
    self.set_ino(fs->ToMaster(ino));
    self.set_type(rpc::DIRECTORY);
    if (!add(".", self, kDotCookie, true)) return (void)fuse_reply_buf(req, buf.data(), used);
    pos = kDotCookie;
  }
  if (pos < kDotDotCookie) {
    rpc::Attr parent;
    parent.set_ino(fs->root_ino);
    if (ino != FUSE_ROOT_ID) {
      auto self = fs->client->GetAttr(fs->ToMaster(ino));
      if (!self.ok()) return ReplyError(req, self.status(), "readdir");
      parent.set_ino(self->parent());
    }
    parent.set_type(rpc::DIRECTORY);
    if (!add("..", parent, kDotDotCookie, true)) return (void)fuse_reply_buf(req, buf.data(), used);
    pos = kDotDotCookie;
  }
  uint64_t after = pos - kDotDotCookie;
  // Ask for about as many entries as fit; a name costs ~24 bytes plain, ~150 with attributes.
  uint32_t limit = static_cast<uint32_t>(std::clamp<size_t>(size / (plus ? 150 : 32), 16, 4096));
  for (;;) {
    rpc::ReadDirResponse page;
    Status st = fs->client->ReadDir(fs->ToMaster(ino), after, limit, &page);
    if (!st.ok()) {
      if (used > 0) break;  // return what we have; the error shows on the next call
      return ReplyError(req, st, plus ? "readdirplus" : "readdir");
    }
    for (const auto& e : page.entries()) {
      fs->entries->Put(EntryKey(fs->ToMaster(ino), e.name().c_str()), e.attr());  // the scan's lookups to come
      if (!add(e.name().c_str(), e.attr(), e.cookie() + kDotDotCookie, false)) {
        return (void)fuse_reply_buf(req, buf.data(), used);
      }
      after = e.cookie();
    }
    if (page.end() || page.entries_size() == 0) break;
  }
  fuse_reply_buf(req, buf.data(), used);
}

void OpReaddir(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off, fuse_file_info*) {
  OpScope scope(req, "readdir", FsOf(req)->lat_readdir, ino);
  ReadDirCommon(req, ino, size, off, false);
}
void OpReaddirplus(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off, fuse_file_info*) {
  OpScope scope(req, "readdirplus", FsOf(req)->lat_readdir, ino);
  ReadDirCommon(req, ino, size, off, true);
}
void OpReleasedir(fuse_req_t req, fuse_ino_t, fuse_file_info*) { fuse_reply_err(req, 0); }

// A read that starts where the previous one ended (or at 0) is sequential: hint the blocks after
// the last one it touches (fuse.readahead_blocks), so the workers fetch them while the reader is
// still busy. Each block is hinted once per open.
void MaybeReadahead(Fs* fs, OpenFile* of, uint64_t off, uint64_t size) {
  uint64_t ahead = fs->cfg.fuse.readahead_blocks, bs = of->info.block_size();
  if (ahead == 0 || bs == 0 || size == 0) return;
  uint64_t first = 0, count = 0;
  {
    std::lock_guard<std::mutex> lock(of->mu);
    bool sequential = off == of->next_offset;
    of->next_offset = off + size;
    if (!sequential) return;
    uint64_t end_block = (off + size - 1) / bs;
    uint64_t last = end_block + ahead;
    first = std::max(of->hinted_through + 1, end_block + 1);
    if (last < first) return;
    count = last - first + 1;
    of->hinted_through = last;
  }
  fs->client->Prefetch(of->info, first, count);
}

// The file's open information: from the FileCache, else from the master.
StatusOr<rpc::FileInfo> FileInfoOf(Fs* fs, uint64_t master_ino) {
  if (auto cached = fs->files->Get(master_ino)) return std::move(*cached);
  auto f = fs->client->GetFile(master_ino);
  if (!f.ok()) return f.status();
  fs->files->Put(master_ino, *f);
  return f;
}

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

// Namespace paths for the access trace: the root, files (their mount's path joined with their
// under-storage path) and directories (DirPath). The tracer caches them per listener.
Tracer::PathFn TracePaths(Fs* fs) {
  struct Mounts {
    std::mutex mu;
    std::map<uint64_t, std::string> paths;  // GUARDED_BY(mu): mount id -> namespace path
  };
  auto mounts = std::make_shared<Mounts>();
  return [fs, mounts](uint64_t ino) -> std::string {
    if (ino == fs->root_ino) return fs->cfg.fuse.root.empty() ? "/" : fs->cfg.fuse.root;
    auto info = FileInfoOf(fs, ino);
    if (!info.ok()) return DirPath(fs, ino);
    std::lock_guard<std::mutex> lock(mounts->mu);
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

// Lets go of kept backing files: the oldest while over the bounds, and any older than attr_timeout.
// Leases to end go to *done (ended by the caller after the lock is released).
void TrimIdleLocked(Fs* fs, std::vector<std::unique_ptr<FileLease>>* done) {
  auto now = std::chrono::steady_clock::now();
  while (!fs->idle.empty()) {
    auto oldest = fs->idle.begin();
    auto it = fs->opens.find(oldest->second);
    bool over = fs->idle.size() > kIdleBackingFiles || fs->idle_bytes > kIdleBackingBytes;
    if (it != fs->opens.end() && !over && now - it->second.idle_since < fs->cfg.fuse.attr_timeout) break;
    fs->idle.erase(oldest);
    if (it == fs->opens.end()) continue;
    fs->idle_bytes -= it->second.bytes;
    fs->DropBacking(it->first, it->second.backing_id);
    done->push_back(std::move(it->second.lease));
    fs->opens.erase(it);
  }
}

// Takes a kept (closed) entry out of the idle list.
void UnidleLocked(Fs* fs, InodeOpens& st) {
  if (st.idle_seq == 0) return;
  fs->idle.erase(st.idle_seq);
  fs->idle_bytes -= st.bytes;
  st.idle_seq = 0;
}

// Passthrough mode: the backing id to open `info` on (its cache data file), counted as one more
// passthrough open of the inode; 0 leaves the open to granary-fuse (with fi->direct_io set when it
// must not use the page cache, as while other opens of the inode read another version through the
// kernel).
int PassthroughBacking(Fs* fs, uint64_t kino, const rpc::FileInfo& info, fuse_file_info* fi) {
  std::vector<std::unique_ptr<FileLease>> done;  // ended after the lock is released
  {
    std::lock_guard<std::mutex> lock(fs->opens_mu);
    TrimIdleLocked(fs, &done);
    auto it = fs->opens.find(kino);
    if (it != fs->opens.end() && it->second.idle_seq != 0) {
      UnidleLocked(fs, it->second);
      if (it->second.version == info.version()) {  // reopened: the kept backing file serves it
        it->second.passthrough = 1;
        return it->second.backing_id;
      }
      fs->DropBacking(kino, it->second.backing_id);  // a new version: let the old one go
      done.push_back(std::move(it->second.lease));
      fs->opens.erase(it);
      it = fs->opens.end();
    }
    if (it != fs->opens.end() && it->second.passthrough > 0) {
      if (it->second.version == info.version()) {
        it->second.passthrough++;
        return it->second.backing_id;
      }
      fi->direct_io = 1;  // a new version while the old one is open in passthrough
      return 0;
    }
    if (it != fs->opens.end() && it->second.cached > 0) return 0;
  }
  if (fs->passthrough_refused || info.attr().size() == 0) return 0;
  auto lease = fs->client->LeaseFile(info);
  if (!lease.ok()) return 0;  // not on this node's worker (a peer holds it), or no local socket
  auto id = fs->io->OpenBacking((*lease)->fd());
  if (!id.ok()) {
    if (!fs->passthrough_refused.exchange(true)) {
      // Refused for good (no CAP_SYS_ADMIN in the initial user namespace): kernel mode from now on.
      spdlog::warn("fuse.open={}: the kernel refused a backing file ({}); serving in kernel mode instead",
                   fs->cfg.fuse.open, id.status().message());
      fs->mode = OpenMode::kKernel;
    }
    return 0;
  }
  std::lock_guard<std::mutex> lock(fs->opens_mu);
  InodeOpens& st = fs->opens[kino];
  if (st.idle_seq != 0) {
    // Another open got there first and has been closed since: its backing id is still the
    // inode's in the kernel until trimmed. Use it (same version) or let it go properly; writing
    // ours over it would leave it in the idle list, to be closed later under our open files.
    UnidleLocked(fs, st);
    if (st.version == info.version()) {
      fs->io->CloseBacking(*id);
      st.passthrough = 1;
      return st.backing_id;
    }
    fs->DropBacking(kino, st.backing_id);
    done.push_back(std::move(st.lease));
    st = InodeOpens{};
  }
  if (st.passthrough > 0 || st.cached > 0) {  // another open got there first
    fs->io->CloseBacking(*id);
    if (st.passthrough > 0 && st.version == info.version()) {
      st.passthrough++;
      return st.backing_id;
    }
    if (st.passthrough > 0) fi->direct_io = 1;
    return 0;
  }
  st.passthrough = 1;
  st.version = info.version();
  st.backing_id = *id;
  st.info = info;
  st.lease = std::move(*lease);
  st.bytes = info.attr().size();
  fs->KeeperPut(kino, st);
  return *id;
}

// Ends one open of an inode in passthrough mode's bookkeeping (its RELEASE, or an interrupted open).
void EndOpen(Fs* fs, uint64_t kino, uint64_t fh, const OpenFile& of) {
  if (!of.passthrough && !of.counted_cached) return;
  std::vector<std::unique_ptr<FileLease>> done;  // ended after the lock is released
  std::lock_guard<std::mutex> lock(fs->opens_mu);
  if (of.counted_cached && fs->keeper) fs->keeper->DropHandle(fh);
  auto it = fs->opens.find(kino);
  if (it == fs->opens.end()) return;
  InodeOpens& st = it->second;
  if (of.counted_cached) --st.cached;
  if (of.passthrough && --st.passthrough == 0 && st.cached == 0) {
    // Kept for a reopen (the next epoch, another loader worker); TrimIdleLocked lets it go.
    st.idle_seq = fs->idle_next++;
    st.idle_since = std::chrono::steady_clock::now();
    fs->idle.emplace(st.idle_seq, kino);
    fs->idle_bytes += st.bytes;
  } else if (st.passthrough == 0 && st.cached == 0) {
    fs->opens.erase(it);
  }
  TrimIdleLocked(fs, &done);
}

void OpOpen(fuse_req_t req, fuse_ino_t ino, fuse_file_info* fi) {
  OpScope scope(req, "open", FsOf(req)->lat_open, ino);
  if ((fi->flags & O_ACCMODE) != O_RDONLY || (fi->flags & O_TRUNC)) return ReplyErrno(req, EROFS);
  Fs* fs = FsOf(req);
  OpenMode mode = fs->mode;
  if (mode == OpenMode::kKernel) {
    // The kernel answers every later open itself (no OPEN, no RELEASE), keeps the page cache
    // across opens, and sends reads with no file handle (OpRead serves them by inode).
    fs->opens_kernel++;
    return ReplyUnsupported(req);
  }
  uint64_t master_ino = fs->ToMaster(ino);
  auto info = FileInfoOf(fs, master_ino);
  if (!info.ok()) return ReplyError(req, info.status(), "open");
  fs->NoteVersion(ino, info->attr().version_hash());
  auto of = std::make_shared<OpenFile>();
  of->info = std::move(*info);
  if (mode == OpenMode::kPassthrough) {
    if (int backing = PassthroughBacking(fs, ino, of->info, fi); backing > 0) {
      of->passthrough = true;
      fi->fh = fs->AddHandle(of);
      fi->keep_cache = 0;  // the kernel allows only direct_io and noflush beside passthrough
      fi->direct_io = 0;
      fi->noflush = 1;
      fs->opens_passthrough++;
      SessionIo::MarkOpenReply(backing);
      if (fuse_reply_open(req, fi) != 0) {  // interrupted: no RELEASE will come
        SessionIo::MarkOpenReply(0);
        EndOpen(fs, ino, fi->fh, *of);
        fs->TakeHandle(fi->fh, ino);
      }
      return;
    }
    if (fs->mode == OpenMode::kKernel) {  // passthrough was refused just now: as in kernel mode
      fs->opens_kernel++;
      return ReplyUnsupported(req);
    }
    fs->passthrough_misses++;
  }
  fs->opens_daemon++;
  fi->fh = fs->AddHandle(of);
  fi->noflush = 1;  // nothing to flush on a read-only mount: close() costs no FLUSH request
  if (!fi->direct_io) {
    {
      std::lock_guard<std::mutex> lock(fs->page_versions_mu);
      if (fs->page_versions.size() > 1'000'000) fs->page_versions.clear();  // bounded; forgetting costs a re-read
      std::string& seen = fs->page_versions[master_ino];
      fi->keep_cache = fs->cfg.fuse.keep_cache && seen == of->info.version();
      seen = of->info.version();
    }
    if (mode == OpenMode::kPassthrough) {
      std::lock_guard<std::mutex> lock(fs->opens_mu);
      fs->opens[ino].cached++;
      of->counted_cached = true;
      // It holds the inode in the kernel's cached io mode: the keeper must know (fuse/handover.h).
      if (fs->keeper) fs->keeper->PutHandle(fs->HandleOf(fi->fh, *of));
    }
  }
  if (fuse_reply_open(req, fi) != 0) {  // the open was interrupted: no RELEASE will come
    EndOpen(fs, ino, fi->fh, *of);
    fs->TakeHandle(fi->fh, ino);
  }
}

// Kernel mode: the file behind a read that came with no open file handle, by its inode alone. Its
// newest info is confirmed with the master at most once per fuse.attr_timeout; when that shows a
// new version, the kernel's pages of the old one are dropped. Without opens, the version a reader
// is on is kept per process (the request's pid): a read at offset 0 — a reader starting on the
// file — moves the process to the newest version; a read further in stays on the version the
// process has been reading, whose blocks are served while cached and fail with ESTALE once they
// must be fetched again, as an open file does in daemon mode. So a process reading a file through
// never gets bytes of two versions.
StatusOr<std::shared_ptr<OpenFile>> InodeFile(Fs* fs, fuse_ino_t ino, uint64_t off, pid_t pid) {
  auto now = std::chrono::steady_clock::now();
  std::shared_ptr<OpenFile> newest;
  {
    std::lock_guard<std::mutex> lock(fs->inode_files_mu);
    auto it = fs->inode_files.find(ino);
    if (it != fs->inode_files.end() && now - it->second->confirmed < fs->cfg.fuse.attr_timeout) newest = it->second;
  }
  if (!newest) {
    fs->files->Erase(fs->ToMaster(ino));  // as old as the kernel's attributes may be: ask the master
    ASSIGN_OR_RETURN(rpc::FileInfo info, FileInfoOf(fs, fs->ToMaster(ino)));
    fs->NoteVersion(ino, info.attr().version_hash());
    std::lock_guard<std::mutex> lock(fs->inode_files_mu);
    auto it = fs->inode_files.find(ino);
    std::shared_ptr<OpenFile> slot = it == fs->inode_files.end() ? nullptr : it->second;
    if (slot && slot->info.version() == info.version()) {
      slot->confirmed = now;
      newest = slot;
    } else {
      if (slot) fs->Invalidate(ino);  // a new version: the kernel's pages are the old one's
      newest = std::make_shared<OpenFile>();
      newest->info = std::move(info);
      newest->confirmed = now;
      if (fs->inode_files.size() >= fs->cfg.fuse.file_cache_entries) {
        fs->inode_files.clear();  // bounded by fuse.file_cache_entries; forgetting costs a call to the master
      } else {
        fs->inode_files[ino] = newest;
      }
    }
  }
  std::lock_guard<std::mutex> lock(fs->inode_files_mu);
  if (fs->cfg.fuse.file_cache_entries == 0) return newest;
  auto [it, fresh] = fs->reader_files.try_emplace(Fs::PidKey{ino, pid}, newest);
  if (!fresh && off == 0) it->second = newest;
  std::shared_ptr<OpenFile> mine = it->second;
  if (fs->reader_files.size() > fs->cfg.fuse.file_cache_entries) fs->reader_files.clear();  // bounded
  return mine;
}

// Counts a read's bytes by where they came from, per mount; tells the trace record (if any).
void CountReadSources(Fs* fs, uint64_t mount_id, const ReadResult& data, TraceRecord* rec) {
  std::array<uint64_t, 3> add{};
  for (const auto& p : data.pieces) add[std::min<uint32_t>(p.source, 2)] += p.length;
  {
    std::lock_guard<std::mutex> lock(fs->mount_bytes_mu);
    auto& m = fs->mount_bytes[mount_id];
    for (size_t i = 0; i < 3; ++i) m[i] += add[i];
  }
  if (rec) {
    int kinds = 0;
    for (size_t i = 0; i < 3; ++i) {
      if (add[i] == 0) continue;
      ++kinds;
      rec->source = NodeSourceName(static_cast<NodeSource>(i));
    }
    if (kinds > 1) rec->source = "mixed";
  }
}

void OpRead(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off, fuse_file_info* fi) {
  OpScope scope(req, "read", FsOf(req)->lat_read, ino);
  if (scope.tracing()) {
    scope.record().offset = static_cast<uint64_t>(off);
    scope.record().size = size;
  }
  Fs* fs = FsOf(req);
  std::shared_ptr<OpenFile> held = fi->fh != 0 ? fs->FindHandle(fi->fh, ino) : nullptr;
  if (!held) {
    // Kernel mode (no open), or a handle of a predecessor that died before handing it over:
    // served by inode, and such a handle keeps the version it is given now.
    fs->reads_by_inode++;
    const fuse_ctx* ctx = fuse_req_ctx(req);
    auto f = InodeFile(fs, ino, static_cast<uint64_t>(off), ctx ? ctx->pid : 0);
    if (!f.ok()) return ReplyError(req, f.status(), "read");
    held = std::move(*f);
    if (fi->fh != 0) fs->AdoptHandle(fi->fh, held);
  }
  OpenFile* of = held.get();
  if (off == 0) fs->files_read++;
  MaybeReadahead(fs, of, static_cast<uint64_t>(off), size);
  ReadResult data;
  Status st = fs->client->Read(of->info, static_cast<uint64_t>(off), size, &data);
  if (!st.ok()) {
    // The file changed in the under-storage since this open: this open fails (ESTALE), the next
    // open asks the master for the new version.
    if (st.IsVersionChanged()) {
      fs->files->Erase(of->info.attr().ino());
      {
        std::lock_guard<std::mutex> lock(fs->page_versions_mu);
        fs->page_versions.erase(of->info.attr().ino());
      }
      std::lock_guard<std::mutex> lock(fs->inode_files_mu);
      auto it = fs->inode_files.find(ino);
      if (it != fs->inode_files.end()) it->second->confirmed = {};  // the next read asks the master
    }
    return ReplyError(req, st, "read");
  }
  if (data.pieces.empty()) {
    fuse_reply_buf(req, nullptr, 0);
    return;
  }
  // One buffer per piece: a leased block file (libfuse splices its pages into /dev/fuse) or bytes
  // in memory. The leases end when `data` goes, after the reply is written.
  size_t n = data.pieces.size();
  std::vector<char> storage(sizeof(fuse_bufvec) + (n - 1) * sizeof(fuse_buf));
  auto* bv = reinterpret_cast<fuse_bufvec*>(storage.data());
  bv->count = n;
  bv->idx = 0;
  bv->off = 0;
  for (size_t i = 0; i < n; ++i) {
    const LocalChannel::Piece& p = data.pieces[i];
    fuse_buf& b = bv->buf[i];
    b = fuse_buf{};
    b.size = p.length;
    if (p.fd >= 0) {
      b.flags = static_cast<fuse_buf_flags>(FUSE_BUF_IS_FD | FUSE_BUF_FD_SEEK);
      b.fd = p.fd;
      b.pos = static_cast<off_t>(p.offset);
    } else {
      b.mem = const_cast<char*>(p.data.data());
    }
  }
  fs->read_bytes += fuse_buf_size(bv);
  CountReadSources(fs, of->info.mount_id(), data, scope.tracing() ? &scope.record() : nullptr);
  fuse_reply_data(req, bv, FUSE_BUF_SPLICE_MOVE);
}

void OpRelease(fuse_req_t req, fuse_ino_t ino, fuse_file_info* fi) {
  OpScope scope(req, "release", FsOf(req)->lat_release, ino);
  // A handle this process does not know (a crashed predecessor's) has nothing to end.
  if (auto of = FsOf(req)->TakeHandle(fi->fh, ino)) EndOpen(FsOf(req), ino, fi->fh, *of);
  fuse_reply_err(req, 0);
}

// Nothing to flush on a read-only mount; ENOSYS makes the kernel stop sending FLUSH at all.
void OpFlush(fuse_req_t req, fuse_ino_t, fuse_file_info*) { ReplyUnsupported(req); }
void OpFsync(fuse_req_t req, fuse_ino_t, int, fuse_file_info*) { fuse_reply_err(req, 0); }

void OpStatfs(fuse_req_t req, fuse_ino_t) {
  OpScope scope(req, "statfs", FsOf(req)->lat_statfs, FUSE_ROOT_ID);
  auto s = FsOf(req)->client->WorkerStats();
  if (!s.ok()) return ReplyError(req, s.status(), "statfs");
  struct statvfs v {};
  v.f_bsize = 4096;
  v.f_frsize = 4096;
  v.f_blocks = s->capacity_bytes() / 4096;
  uint64_t free_bytes = s->capacity_bytes() > s->used_bytes() ? s->capacity_bytes() - s->used_bytes() : 0;
  v.f_bfree = free_bytes / 4096;
  v.f_bavail = v.f_bfree;
  v.f_namemax = 255;
  fuse_reply_statfs(req, &v);
}

// No extended attributes. ENOSYS makes the kernel remember that and answer EOPNOTSUPP itself, so
// `ls -l` (which asks for ACLs and security labels of every file) costs no request per file.
void OpGetxattr(fuse_req_t req, fuse_ino_t, const char*, size_t) { ReplyUnsupported(req); }
void OpListxattr(fuse_req_t req, fuse_ino_t, size_t) { ReplyUnsupported(req); }
void OpReadlink(fuse_req_t req, fuse_ino_t) { ReplyErrno(req, EINVAL); }

// Write-like operations: the namespace is read-only.
void OpSetattr(fuse_req_t req, fuse_ino_t, struct stat*, int, fuse_file_info*) { ReplyErrno(req, EROFS); }
void OpMknod(fuse_req_t req, fuse_ino_t, const char*, mode_t, dev_t) { ReplyErrno(req, EROFS); }
void OpMkdir(fuse_req_t req, fuse_ino_t, const char*, mode_t) { ReplyErrno(req, EROFS); }
void OpUnlink(fuse_req_t req, fuse_ino_t, const char*) { ReplyErrno(req, EROFS); }
void OpRmdir(fuse_req_t req, fuse_ino_t, const char*) { ReplyErrno(req, EROFS); }
void OpSymlink(fuse_req_t req, const char*, fuse_ino_t, const char*) { ReplyErrno(req, EROFS); }
void OpRename(fuse_req_t req, fuse_ino_t, const char*, fuse_ino_t, const char*, unsigned) { ReplyErrno(req, EROFS); }
void OpLink(fuse_req_t req, fuse_ino_t, fuse_ino_t, const char*) { ReplyErrno(req, EROFS); }
void OpWrite(fuse_req_t req, fuse_ino_t, const char*, size_t, off_t, fuse_file_info*) { ReplyErrno(req, EROFS); }
void OpCreate(fuse_req_t req, fuse_ino_t, const char*, mode_t, fuse_file_info*) { ReplyErrno(req, EROFS); }
void OpSetxattr(fuse_req_t req, fuse_ino_t, const char*, const char*, size_t, int) { ReplyErrno(req, EROFS); }
void OpRemovexattr(fuse_req_t req, fuse_ino_t, const char*) { ReplyErrno(req, EROFS); }
void OpFallocate(fuse_req_t req, fuse_ino_t, int, off_t, off_t, fuse_file_info*) { ReplyErrno(req, EROFS); }

fuse_lowlevel_ops MakeOps() {
  fuse_lowlevel_ops ops{};
  ops.init = OpInit;
  ops.lookup = OpLookup;
  ops.forget = OpForget;
  ops.forget_multi = OpForgetMulti;
  ops.getattr = OpGetattr;
  ops.opendir = OpOpendir;
  ops.readdir = OpReaddir;
  ops.readdirplus = OpReaddirplus;
  ops.releasedir = OpReleasedir;
  ops.open = OpOpen;
  ops.read = OpRead;
  ops.release = OpRelease;
  ops.flush = OpFlush;
  ops.fsync = OpFsync;
  ops.statfs = OpStatfs;
  ops.getxattr = OpGetxattr;
  ops.listxattr = OpListxattr;
  ops.readlink = OpReadlink;
  ops.setattr = OpSetattr;
  ops.mknod = OpMknod;
  ops.mkdir = OpMkdir;
  ops.unlink = OpUnlink;
  ops.rmdir = OpRmdir;
  ops.symlink = OpSymlink;
  ops.rename = OpRename;
  ops.link = OpLink;
  ops.write = OpWrite;
  ops.create = OpCreate;
  ops.setxattr = OpSetxattr;
  ops.removexattr = OpRemovexattr;
  ops.fallocate = OpFallocate;
  return ops;
}

// ---- mount lifecycle ------------------------------------------------------------------------

// The minor device number of the FUSE mount at `mp` (its /sys/fs/fuse/connections entry), read
// from /proc/self/mountinfo: stat() on the mount itself would be a request to this very process,
// which hangs once its loop has stopped serving.
std::optional<unsigned> FuseConnection(const std::string& mp);

// The kernel caps a FUSE mount's readahead at the default read_ahead_kb (128 KiB) whatever the
// filesystem negotiates, so sequential reads would arrive as 128 KiB requests, each a round trip
// to the worker. Raising the mount's own bdi setting lets them arrive as 1 MiB requests (the
// max_readahead asked for in OpInit). Needs root; without it reads still work, in smaller pieces.
void RaiseReadaheadOf(const std::string& mountpoint) {
  auto minor = FuseConnection(mountpoint);
  if (!minor) return;
  std::string path = "/sys/class/bdi/0:" + std::to_string(*minor) + "/read_ahead_kb";
  std::ofstream out(path);
  out << (kMaxReadahead / 1024) << "\n";
  out.flush();
  if (!out) spdlog::info("cannot raise {} (not root?); sequential reads go in 128 KiB requests", path);
}

std::optional<unsigned> FuseConnection(const std::string& mp) {
  std::ifstream in("/proc/self/mountinfo");
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream f(line);
    std::string id, parent, dev, root, point;
    f >> id >> parent >> dev >> root >> point;
    std::string decoded;  // mountinfo escapes space, tab, newline and backslash as \ooo
    for (size_t i = 0; i < point.size(); ++i) {
      if (point[i] == '\\' && i + 3 < point.size()) {
        decoded += static_cast<char>(std::stoi(point.substr(i + 1, 3), nullptr, 8));
        i += 3;
      } else {
        decoded += point[i];
      }
    }
    auto colon = dev.find(':');
    if (decoded == mp && colon != std::string::npos && line.find(" - fuse") != std::string::npos) {
      return static_cast<unsigned>(std::stoul(dev.substr(colon + 1)));
    }
  }
  return std::nullopt;
}

// Unmounts `mp`: plainly, or lazily when busy (then aborts the connection so the loop ends).
void Unmount(const std::string& mp) {
  std::optional<unsigned> conn = FuseConnection(mp);
  if (geteuid() == 0) {
    if (umount2(mp.c_str(), 0) == 0) return;
    if (errno == EINVAL || errno == ENOENT) return;  // not mounted any more
    umount2(mp.c_str(), MNT_DETACH);
    if (conn) {
      // The abort file lives in fusectl, which some hosts do not mount by default.
      std::string abort_path = "/sys/fs/fuse/connections/" + std::to_string(*conn) + "/abort";
      if (access(abort_path.c_str(), W_OK) != 0) {
        mount("none", "/sys/fs/fuse/connections", "fusectl", 0, nullptr);  // EBUSY: already mounted
      }
      std::ofstream abort(abort_path);
      if (abort) abort << "1";
    }
    return;
  }
  pid_t pid = fork();
  if (pid == 0) {
    execlp("fusermount3", "fusermount3", "-u", "-z", "-q", mp.c_str(), static_cast<char*>(nullptr));
    _exit(127);
  }
  if (pid > 0) waitpid(pid, nullptr, 0);
}

class FuseMountImpl final : public FuseMount {
 public:
  ~FuseMountImpl() override { Shutdown(); }

  Status Init(const Config& cfg) {
    mountpoint_ = cfg.fuse.mountpoint;
    RETURN_IF_ERROR(CheckKeeperSetting(cfg));
    handover_path_ = HandoverSocketPath(cfg);
    keeper_path_ = KeeperSocketPath(cfg);
    // A running granary-fuse hands its connection over (an upgrade); else a keeper holds the
    // connection of one that died (a crash). Asked before anything touches the mount point: a
    // connection nobody serves would stall our own stat() of it.
    ASSIGN_OR_RETURN(std::optional<HandoverReceived> got,
                     RequestTakeover(handover_path_, Fingerprint(cfg), std::chrono::minutes(2)));
    bool from_keeper = false;
    if (!got) {
      auto kept = WithdrawFromKeeper(keeper_path_, cfg.fuse.mountpoint);
      if (!kept.ok()) {
        spdlog::warn("the FUSE keeper: {}; mounting anew", kept.status().message());
      } else if (*kept) {
        got = std::move(*kept);
        from_keeper = true;
      }
    }
    if (got && got->msg.state().format() != kHandoverFormat) {
      close(got->fd);
      return FailedPreconditionError("the kept FUSE connection of " + cfg.fuse.mountpoint + " is in hand-over format " +
                                     std::to_string(got->msg.state().format()) + ", this granary-fuse speaks " +
                                     std::to_string(kHandoverFormat) + "; unmount it (fusermount3 -u) and start again");
    }
    if (got && got->msg.state().fingerprint() != Fingerprint(cfg)) {
      close(got->fd);
      return FailedPreconditionError("the kept FUSE connection of " + cfg.fuse.mountpoint + " was made with other " +
                                     "settings (" + got->msg.state().fingerprint() + "); start granary-fuse with the same " +
                                     "fuse.mountpoint, fuse.root, fuse.open and fuse.allow_other, or " +
                                     "unmount it first");
    }
    if (!got) RETURN_IF_ERROR(CheckMountPoint());

    fs_ = std::make_unique<Fs>();
    fs_->cfg = cfg;
    if (cfg.fuse.open == "daemon") {
      fs_->wanted = OpenMode::kDaemon;
    } else if (cfg.fuse.open == "kernel") {
      fs_->wanted = OpenMode::kKernel;
    } else {
      fs_->wanted = OpenMode::kPassthrough;  // auto: passthrough where it can work, else kernel
      fs_->wanted_explicitly = cfg.fuse.open == "passthrough";
    }
    fs_->mode = fs_->wanted.load();
    {
      std::random_device rd;
      fs_->next_fh = ((static_cast<uint64_t>(rd()) & 0x7fffff) + 1) << 40;
    }
    ASSIGN_OR_RETURN(fs_->client, Client::Create(cfg));
    fs_->files = std::make_unique<FileCache>(cfg.fuse.file_cache_entries, cfg.fuse.attr_timeout);
    fs_->entries = std::make_unique<EntryCache>(cfg.fuse.file_cache_entries,
                                                std::min(cfg.fuse.entry_timeout, cfg.fuse.attr_timeout));
    fs_->tracer = std::make_unique<Tracer>(TracePaths(fs_.get()));
    if (got) {
      fs_->root_ino = got->msg.state().root_ino();
    } else if (cfg.fuse.root != "/") {
      auto root = fs_->client->Resolve(cfg.fuse.root);
      if (!root.ok()) return root.status().WithContext("fuse.root " + cfg.fuse.root);
      if (root->type() != rpc::DIRECTORY) return InvalidArgumentError("fuse.root " + cfg.fuse.root + " is not a directory");
      fs_->root_ino = root->ino();
    }

    std::string opts = "default_permissions,ro,fsname=granary,subtype=granary";
    if (cfg.fuse.allow_other) opts += ",allow_other";
    const char* argv[] = {"granary-fuse", "-o", opts.c_str()};
    fuse_args args = FUSE_ARGS_INIT(3, const_cast<char**>(argv));
    fuse_lowlevel_ops ops = MakeOps();
    se_ = fuse_session_new(&args, &ops, sizeof ops, fs_.get());
    fuse_opt_free_args(&args);
    if (se_ == nullptr) {
      if (got) close(got->fd);
      return InternalError("cannot create the FUSE session (see the message above)");
    }
    fs_->se = se_;
    int fd = -1;
    std::string replay;
    if (got) {
      const rpc::FuseConnectionState& st = got->msg.state();
      mountpoint_ = st.mountpoint();
      fd = got->fd;
      replay = st.init_request();
      fs_->taken_over = true;
      fs_->mode = static_cast<OpenMode>(st.mode());
      if (fs_->mode != fs_->wanted && !(fs_->wanted == OpenMode::kPassthrough && !fs_->wanted_explicitly)) {
        fs_->fallback_reason = "the predecessor's";
      }
      if (!fs_->wanted_explicitly && fs_->wanted == OpenMode::kPassthrough) fs_->wanted = fs_->mode.load();
      fs_->passthrough_refused = st.passthrough_refused();
    } else {
      if (fuse_session_mount(se_, mountpoint_.c_str()) != 0) {
        fuse_session_destroy(se_);
        se_ = nullptr;
        return UnavailableError("cannot mount FUSE at " + mountpoint_ +
                                " (is /dev/fuse available, and for allow_other are you root or is user_allow_other "
                                "set in /etc/fuse.conf?)");
      }
      mounted_ = true;
      fd = fuse_session_fd(se_);
    }
    // Our own /dev/fuse I/O (session_io.h): passthrough, INIT kept and replayed, hand-over.
    auto io = SessionIo::Install(se_, fd, fs_->mode == OpenMode::kPassthrough, replay);
    if (!io.ok()) {
      if (!mounted_) close(fd);
      fuse_session_destroy(se_);
      se_ = nullptr;
      return io.status().WithContext("granary-fuse's /dev/fuse I/O");
    }
    io_ = std::move(*io);
    fs_->io = io_.get();
    if (got) {
      io_->SetNegotiated(got->msg.state().passthrough_negotiated());
      ApplyState(got->msg.state());
    }
    fs_->trim_idle = [fs = fs_.get()] {
      std::vector<std::unique_ptr<FileLease>> done;  // ended after the lock is released
      std::lock_guard<std::mutex> lock(fs->opens_mu);
      TrimIdleLocked(fs, &done);
    };
    if (!keeper_path_.empty()) {  // deposits once INIT is known
      fs_->keeper = std::make_unique<KeeperLink>(keeper_path_, cfg.fuse.keeper == "spawn", io_->fd(),
                                                 [this] { return Snapshot(false); },
                                                 [io = io_.get()](int id) { io->CloseBacking(id); }, got.has_value());
    }
    StartInvalidator();
    if (!got) RaiseReadaheadOf(mountpoint_);
    StartLoop();
    if (got) {
      spdlog::info("took over the FUSE connection of {} from {} ({} mode, {} open files, {} backing files)", mountpoint_,
                   from_keeper ? "the keeper (the previous granary-fuse died)" : got->msg.state().sender(),
                   ModeName(fs_->mode), got->msg.state().handles_size(), got->msg.state().backings_size());
      // Requests a dead predecessor had read and not answered: the kernel sends them again.
      if (from_keeper) {
        Status rs = io_->NotifyResend();
        if (!rs.ok()) {
          spdlog::warn("{}: requests the previous granary-fuse had read and not answered fail with EIO", rs.message());
        }
      }
    }
    auto listener = ListenLocal(handover_path_);
    if (listener.ok()) {
      listen_fd_ = *listener;
      responder_ = std::thread([this] { RespondLoop(); });
    } else {
      spdlog::warn("no hand-over socket ({}): an upgrade of granary-fuse will remount instead",
                   listener.status().message());
    }
    if (!got) {
      spdlog::info("granary-fuse mounted at {} (master {}, worker {})", mountpoint_, cfg.master.address, cfg.fuse.worker);
    }
    StartMetrics();
    return Status::OK();
  }

  // The metrics endpoint, the access trace's root-only socket (never a network port: the trace
  // shows every reader's paths, pids and uids), and the file naming both for the CLI on this machine.
  void StartMetrics() {
    metrics_ = metrics::StartOrWarn(
        "fuse.metrics_listen", fs_->cfg.fuse.metrics_listen, [this](metrics::Exposition* e) { Render(e); },
        [this] { return Ready(); });
    char real[PATH_MAX];
    if (!trace_ && realpath(mountpoint_.c_str(), real) != nullptr) {
      // Named by pid too: a predecessor still serving its trace never removes its successor's socket.
      RemoveDeadTraceSockets(real);
      auto t = StreamSocket::Start(MountRunFile(real, "-" + std::to_string(getpid()) + ".trace.sock"),
                                   [this](const std::map<std::string, std::string>& params,
                                          StreamSink* sink) { fs_->tracer->Serve(params, sink); });
      if (t.ok()) {
        trace_ = std::move(t).value();
      } else {
        spdlog::warn("access trace off: {}", t.status().message());
      }
    }
    WriteEndpoints();
  }
  // Trace sockets of this mount point left by processes that died without stopping (kill -9).
  static void RemoveDeadTraceSockets(const std::string& mountpoint) {
    const std::string prefix = MountRunFile(mountpoint, "-");
    const std::string dir = prefix.substr(0, prefix.rfind('/'));
    const std::string stem = prefix.substr(prefix.rfind('/') + 1);
    const std::string suffix = ".trace.sock";
    DIR* d = opendir(dir.c_str());
    if (d == nullptr) return;
    while (dirent* e = readdir(d)) {
      std::string name = e->d_name;
      if (name.size() <= stem.size() + suffix.size() || name.compare(0, stem.size(), stem) != 0 ||
          name.compare(name.size() - suffix.size(), suffix.size(), suffix) != 0) {
        continue;
      }
      std::string pid = name.substr(stem.size(), name.size() - stem.size() - suffix.size());
      char* end = nullptr;
      long p = std::strtol(pid.c_str(), &end, 10);
      if (end == nullptr || *end != '\0' || p <= 0) continue;
      if (kill(static_cast<pid_t>(p), 0) != 0 && errno == ESRCH) unlink((dir + "/" + name).c_str());
    }
    closedir(d);
  }
  void StopMetrics() {
    fs_->tracer->Close();  // trace streams end, so their threads can be joined
    metrics_.reset();
    trace_.reset();
    fs_->tracer->Reopen();
  }
  // RuntimeDir()/fuse-<hash>.json: where `granary stats` and `granary trace` find this mount's
  // endpoints. A successor rewrites it; the last process to serve the mount removes it.
  void WriteEndpoints() {
    char real[PATH_MAX];
    if (realpath(mountpoint_.c_str(), real) == nullptr) return;
    endpoints_file_ = MountEndpointsFile(real);
    std::string metrics = metrics_ ? metrics_->address() : "";
    if (metrics.rfind("0.0.0.0:", 0) == 0) metrics = "127.0.0.1:" + metrics.substr(8);
    std::string worker = fs_->cfg.fuse.worker;
    nlohmann::json j = {{"mountpoint", real},          {"root", fs_->cfg.fuse.root}, {"pid", getpid()},
                        {"metrics", metrics},        {"worker", fs_->cfg.fuse.worker},
                        {"master", fs_->cfg.master.address}, {"trace", trace_ ? trace_->path() : ""}};
    Status st = WriteFileAtomic(endpoints_file_, j.dump() + "\n");  // RuntimeDir() exists once named
    if (!st.ok()) spdlog::warn("cannot write {} (granary stats will not find this mount): {}", endpoints_file_, st.message());
  }
  void RemoveEndpoints() {
    if (endpoints_file_.empty()) return;
    auto text = ReadFileToString(endpoints_file_);
    if (!text.ok()) return;
    auto j = nlohmann::json::parse(*text, nullptr, false);
    if (j.is_object() && j.value("pid", 0) == getpid()) unlink(endpoints_file_.c_str());
  }

  // A fresh mount: the mount point exists and is a directory; a stale mount left by a crashed
  // predecessor with no keeper ("Transport endpoint is not connected") is cleared.
  Status CheckMountPoint() {
    char real[PATH_MAX];
    struct stat st {};
    // A dead FUSE mount (its daemon killed) may still answer stat() from the kernel's attribute
    // cache; statfs() always asks the daemon, so it is what tells a dead mount apart.
    struct statvfs probe {};
    bool dead = statvfs(mountpoint_.c_str(), &probe) != 0 && (errno == ENOTCONN || errno == ECONNABORTED);
    if (dead || stat(mountpoint_.c_str(), &st) != 0) {
      if (dead || errno == ENOTCONN || errno == ECONNABORTED) {
        spdlog::warn("clearing a stale mount at {} (Transport endpoint is not connected)", mountpoint_);
        Unmount(mountpoint_);
        umount2(mountpoint_.c_str(), MNT_DETACH);
      }
      if (stat(mountpoint_.c_str(), &st) != 0) {
        if (errno == ENOENT) {
          return NotFoundError("mount point " + mountpoint_ + " does not exist (create it with mkdir -p " +
                               mountpoint_ + ")");
        }
        return ErrnoError(errno, "mount point " + mountpoint_);
      }
    }
    if (!S_ISDIR(st.st_mode)) return InvalidArgumentError("mount point " + mountpoint_ + " is not a directory");
    if (realpath(mountpoint_.c_str(), real) != nullptr) mountpoint_ = real;
    return Status::OK();
  }

  void StartLoop() {
    loop_cfg_ = fuse_loop_cfg_create();
    fuse_loop_cfg_set_max_threads(loop_cfg_, static_cast<unsigned>(fs_->cfg.fuse.max_threads));
    // A few idle threads only: the kernel hands requests to waiting threads in turn, so more idle
    // threads means colder ones (keeping all 16 cut warm passthrough opens from 66 k to 40-51 k/s).
    fuse_loop_cfg_set_idle_threads(loop_cfg_, std::min<unsigned>(static_cast<unsigned>(fs_->cfg.fuse.max_threads), 4));
    loop_done_ = false;
    loop_ = std::thread([this] {
      int rc = fuse_session_loop_mt(se_, loop_cfg_);
      loop_done_ = true;
      if (!stopping_ && !handing_over_) {
        spdlog::warn("the FUSE mount at {} went away (rc {}); stopping", mountpoint_, rc);
        Shutdown::Request("FUSE mount removed");
      }
    });
  }

  void StartInvalidator() {
    {
      std::lock_guard<std::mutex> lock(fs_->inval_mu);
      fs_->inval_stop = false;
    }
    fs_->inval_thread = std::thread([fs = fs_.get()] { fs->InvalidateLoop(); });
  }
  void StopInvalidator() {
    {
      std::lock_guard<std::mutex> lock(fs_->inval_mu);
      fs_->inval_stop = true;
    }
    fs_->inval_cv.notify_all();
    if (fs_->inval_thread.joinable()) fs_->inval_thread.join();
  }

  // What a successor needs (with_handles: a hand-over; without: a deposit with the keeper, which
  // learns backing ids and passthrough mode's daemon-served handles as they change).
  rpc::FuseConnectionState Snapshot(bool with_handles) {
    rpc::FuseConnectionState st;
    st.set_format(kHandoverFormat);
    st.set_mountpoint(mountpoint_);
    st.set_init_request(io_->init_request());
    st.set_mode(static_cast<uint32_t>(fs_->mode.load()));
    st.set_passthrough_negotiated(io_->negotiated());
    st.set_root_ino(fs_->root_ino);
    st.set_fingerprint(Fingerprint(fs_->cfg));
    st.set_sender("granary-fuse pid " + std::to_string(getpid()));
    st.set_passthrough_refused(fs_->passthrough_refused);
    {
      // handles_mu before opens_mu (as ApplyState): counted_cached is written under opens_mu.
      std::lock_guard<std::mutex> hlock(fs_->handles_mu);
      std::lock_guard<std::mutex> lock(fs_->opens_mu);
      for (const auto& [kino, o] : fs_->opens) {
        if (o.backing_id <= 0) continue;
        rpc::FuseBacking* b = st.add_backings();
        b->set_kino(kino);
        b->set_backing_id(o.backing_id);
        *b->mutable_info() = o.info;
        b->set_passthrough(o.passthrough);
        b->set_idle(o.idle_seq != 0);
      }
      // A hand-over carries every handle; a deposit only the daemon-served opens of passthrough
      // mode (the keeper learns the rest of them as they change, fuse/handover.h).
      if (with_handles) st.set_next_fh(fs_->next_fh);
      for (const auto& [fh, of] : fs_->handles) {
        if (!with_handles && !of->counted_cached) continue;
        *st.add_handles() = fs_->HandleOf(fh, *of);
      }
    }
    return st;
  }

  // A successor's side of Snapshot: the handles and backing ids of the connection it took over.
  void ApplyState(const rpc::FuseConnectionState& st) {
    // After a crash the keeper does not know how many files are open on a backing id: it stays
    // registered (and reused by reopens of that version) until the mount ends.
    constexpr int kUnknownOpens = 1 << 30;
    for (const rpc::FuseBacking& b : st.backings()) {
      InodeOpens o;
      o.backing_id = b.backing_id();
      o.info = b.info();
      o.version = b.info().version();
      o.bytes = b.info().attr().size();
      o.passthrough = b.passthrough() < 0 ? kUnknownOpens : b.passthrough();
      // Our own lease keeps the worker from evicting the data file under the kernel's reads (the
      // kernel holds the file it opened either way, so bytes stay right without one).
      auto lease = fs_->client->LeaseFile(b.info());
      if (lease.ok()) o.lease = std::move(*lease);
      std::lock_guard<std::mutex> lock(fs_->opens_mu);
      if (b.idle() && o.passthrough == 0) {
        o.idle_seq = fs_->idle_next++;
        o.idle_since = std::chrono::steady_clock::now();
        fs_->idle.emplace(o.idle_seq, b.kino());
        fs_->idle_bytes += o.bytes;
      }
      fs_->opens[b.kino()] = std::move(o);
    }
    std::lock_guard<std::mutex> lock(fs_->handles_mu);
    if (st.next_fh() > 0) fs_->next_fh = st.next_fh();
    for (const rpc::FuseHandle& h : st.handles()) {
      auto of = std::make_shared<OpenFile>();
      of->info = h.info();
      of->passthrough = h.passthrough();
      of->counted_cached = h.counted_cached();
      if (of->counted_cached) {
        std::lock_guard<std::mutex> l2(fs_->opens_mu);
        fs_->opens[h.kino()].cached++;
      }
      fs_->handles.emplace(h.fh(), std::move(of));
      // A hand-over's numbering goes on; a keeper's handles are a dead predecessor's, whose
      // other numbers (not listed) may still be open: this process keeps its own epoch.
      if (st.next_fh() > 0) fs_->next_fh = std::max(fs_->next_fh, h.fh() + 1);
    }
  }

  // Serves the hand-over socket: a successor's TAKEOVER.
  void RespondLoop() {
    while (!stopping_ && !handed_over_) {
      pollfd p{listen_fd_, POLLIN, 0};
      if (poll(&p, 1, 500) <= 0) continue;
      int c = accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
      if (c < 0) continue;
      auto m = ReceiveHandover(c, std::chrono::seconds(5));
      if (m.ok() && m->msg.kind() == rpc::HandoverMessage::TAKEOVER) HandOver(c, m->msg);
      if (m.ok() && m->fd >= 0) close(m->fd);
      close(c);
    }
  }

  void HandOver(int c, const rpc::HandoverMessage& m) {
    auto refuse = [&](const std::string& why) {
      rpc::HandoverMessage r;
      r.set_kind(rpc::HandoverMessage::REFUSED);
      r.set_text(why);
      (void)SendHandover(c, r);
      spdlog::warn("refused to hand {} over: {}", mountpoint_, why);
    };
    if (m.format() != kHandoverFormat) {
      return refuse("the successor speaks hand-over format " + std::to_string(m.format()) + " and this granary-fuse " +
                    std::to_string(kHandoverFormat) + "; stop this one (SIGTERM unmounts) and start the new one");
    }
    std::string mine = Fingerprint(fs_->cfg);
    if (m.fingerprint() != mine) {
      return refuse("the successor's settings (" + m.fingerprint() + ") differ from this mount's (" + mine +
                    "); start it with the same fuse.mountpoint, fuse.root, fuse.open and fuse.allow_other");
    }
    std::lock_guard<std::mutex> lock(stop_mu_);
    if (stopping_ || loop_done_) return refuse("this granary-fuse is stopping");
    auto start = std::chrono::steady_clock::now();
    handing_over_ = true;
    // Its port is the successor's when both share a network namespace. A process that stays idle
    // (Kubernetes, each pod its own network) keeps answering probes: /readyz says "handed over".
    if (fs_->cfg.fuse.exit_after_handover) StopMetrics();
    io_->Drain(se_);   // every request read is answered; nothing more is read
    if (loop_.joinable()) loop_.join();
    StopInvalidator();
    rpc::HandoverMessage out;
    out.set_kind(rpc::HandoverMessage::STATE);
    *out.mutable_state() = Snapshot(true);
    close(listen_fd_);  // the successor listens on the same path
    listen_fd_ = -1;
    Status st = SendHandover(c, out, io_->fd());
    if (!st.ok()) {
      spdlog::warn("handing {} over failed ({}); serving on", mountpoint_, st.message());
      io_->Resume();
      fuse_session_reset(se_);
      handing_over_ = false;
      StartInvalidator();
      StartLoop();
      auto listener = ListenLocal(handover_path_);
      if (listener.ok()) listen_fd_ = *listener;
      if (!metrics_) StartMetrics();
      return;
    }
    handed_over_ = true;
    if (fs_->keeper) fs_->keeper->Stop();  // the successor deposits with the keeper; it keeps ours meanwhile
    {
      // The successor registered its own leases; ours end. The backing ids are the successor's now.
      std::lock_guard<std::mutex> l2(fs_->opens_mu);
      fs_->opens.clear();
      fs_->idle.clear();
    }
    spdlog::info("handed {} over ({} open files, {} backing files) in {} ms", mountpoint_, out.state().handles_size(),
                 out.state().backings_size(),
                 std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - start).count());
    if (fs_->cfg.fuse.exit_after_handover) {
      Shutdown::Request("handed the mount over to a successor");
    } else {
      spdlog::info("fuse.exit_after_handover is false: idle until stopped (SIGTERM leaves the mount to the successor)");
    }
  }

  std::string address() const override { return mountpoint_; }
  std::string metrics_address() const override { return metrics_ ? metrics_->address() : ""; }

  void Render(metrics::Exposition* e) {
    fs_->op_latency.Write(e, "granary_fuse_operation_duration_seconds",
                          "Time granary-fuse took to answer a kernel request, by operation.");
    e->Family("granary_fuse_errors_total", "counter", "Error replies to the kernel, by operation and errno.");
    for (const auto& [k, n] : ErrorCounts()) {
      e->Sample("granary_fuse_errors_total", {{"op", k.first}, {"errno", k.second}}, static_cast<double>(n));
    }
    e->Counter("granary_fuse_read_bytes_total", "Bytes returned to readers.", static_cast<double>(fs_->read_bytes));
    const ClientCounters& c = fs_->client->counters();
    e->Family("granary_fuse_read_pieces_total", "counter",
              "Pieces of reads by how they came: zero_copy (a leased block file from the local worker), "
              "local (the local worker over gRPC), failover (another worker, the local one being down).");
    e->Sample("granary_fuse_read_pieces_total", {{"source", "zero_copy"}}, static_cast<double>(c.zero_copy_pieces));
    e->Sample("granary_fuse_read_pieces_total", {{"source", "local"}}, static_cast<double>(c.local_grpc_pieces));
    e->Sample("granary_fuse_read_pieces_total", {{"source", "failover"}}, static_cast<double>(c.failover_pieces));
    e->Counter("granary_fuse_prefetch_hints_total", "Readahead hints sent to workers.",
               static_cast<double>(c.prefetch_hints));
    e->Counter("granary_fuse_worker_waits_total",
               "Reads that found no worker able to serve them and waited for one (fuse.worker_wait).",
               static_cast<double>(c.worker_waits));
    e->Counter("granary_fuse_worker_waits_ended_total", "Of those, the reads whose wait ended with their bytes.",
               static_cast<double>(c.worker_waits_ended));
    e->Gauge("granary_fuse_keeper_holds", "1 while a keeper holds a copy of the FUSE connection (fuse.keeper).",
             fs_->keeper && fs_->keeper->deposited() ? 1 : 0);
    e->Gauge("granary_fuse_mounted", "1 while the mount is served.", loop_done_ ? 0 : 1);
    e->Family("granary_fuse_open_mode", "gauge",
              "The connection's read mode (fuse.open): 1 for the mode in force. fallback=\"1\" when it is not the "
              "mode asked for (the log says why).");
    bool fallback = fs_->mode != fs_->wanted || fs_->passthrough_refused;
    for (OpenMode m : {OpenMode::kDaemon, OpenMode::kKernel, OpenMode::kPassthrough}) {
      e->Sample("granary_fuse_open_mode", {{"mode", ModeName(m)}, {"fallback", fallback ? "1" : "0"}},
                fs_->mode == m ? 1 : 0);
    }
    e->Family("granary_fuse_opens_total", "counter",
              "Opens by how they were served: passthrough (the kernel reads the cache data file), daemon "
              "(granary-fuse serves the reads), kernel (answered once with ENOSYS; later opens never reach "
              "granary-fuse).");
    e->Sample("granary_fuse_opens_total", {{"mode", "passthrough"}}, static_cast<double>(fs_->opens_passthrough));
    e->Sample("granary_fuse_opens_total", {{"mode", "daemon"}}, static_cast<double>(fs_->opens_daemon));
    e->Sample("granary_fuse_opens_total", {{"mode", "kernel"}}, static_cast<double>(fs_->opens_kernel));
    e->Counter("granary_fuse_passthrough_misses_total",
               "Opens in passthrough mode served by granary-fuse instead: the file is empty, not wholly cached "
               "on this node's worker in one cache directory, or its inode is open in the other io mode.",
               static_cast<double>(fs_->passthrough_misses));
    e->Counter("granary_fuse_reads_by_inode_total", "Reads that came with no open file (kernel mode).",
               static_cast<double>(fs_->reads_by_inode));
    e->Counter("granary_fuse_invalidations_total", "Files whose cached pages were dropped for a new version.",
               static_cast<double>(fs_->invalidations));
    e->Family("granary_fuse_mount_read_bytes_total", "counter",
              "Bytes granary-fuse returned to readers per mount id, by where they came from: local (this node's "
              "worker cache), peer (another worker), under_storage. Reads the kernel serves itself (page cache, "
              "passthrough) are not seen here.");
    {
      std::lock_guard<std::mutex> lock(fs_->mount_bytes_mu);
      for (const auto& [mount, b] : fs_->mount_bytes) {
        for (size_t i = 0; i < 3; ++i) {
          e->Sample("granary_fuse_mount_read_bytes_total",
                    {{"mount", std::to_string(mount)}, {"source", NodeSourceName(static_cast<NodeSource>(i))}},
                    static_cast<double>(b[i]));
        }
      }
    }
    e->Family("granary_fuse_master_call_duration_seconds", "histogram",
              "Round trip of granary-fuse's metadata calls to the master.");
    fs_->client->master_latency().Write(e, "granary_fuse_master_call_duration_seconds", {});
    e->Counter("granary_fuse_files_read_total", "Reads at offset 0 granary-fuse served: files readers started on.",
               static_cast<double>(fs_->files_read));
    e->Counter("granary_fuse_trace_records_total",
               "Access-trace records made (only while a `granary trace` listens; 0 means tracing cost nothing).",
               static_cast<double>(fs_->tracer->records()));
    e->Counter("granary_fuse_trace_dropped_total", "Access-trace records a slow listener missed.",
               static_cast<double>(fs_->tracer->dropped()));
    metrics::WriteProcessMetrics(e);
  }

  // Ready while serving the mount and the master answers.
  Status Ready() {
    if (handed_over_) return UnavailableError("handed the mount at " + mountpoint_ + " over to a successor");
    if (loop_done_) return UnavailableError("the mount at " + mountpoint_ + " is gone");
    auto root = fs_->client->Resolve("/");
    if (!root.ok()) return root.status().WithContext("the master");
    return Status::OK();
  }

  void Shutdown() override {
    stopping_ = true;
    if (responder_.joinable()) responder_.join();
    std::lock_guard<std::mutex> lock(stop_mu_);
    if (fs_) {
      StopMetrics();
      if (!handed_over_) RemoveEndpoints();
    }
    if (se_ == nullptr) return;
    if (listen_fd_ >= 0) {
      close(listen_fd_);
      listen_fd_ = -1;
      unlink(handover_path_.c_str());
    }
    if (handed_over_) {
      // The successor serves the mount: leave it, and close only our copy of the connection.
      fuse_session_destroy(se_);
      se_ = nullptr;
      if (loop_cfg_) fuse_loop_cfg_destroy(loop_cfg_);
      loop_cfg_ = nullptr;
      spdlog::info("left {} to its successor", mountpoint_);
      return;
    }
    // Stopped for good: the keeper lets the connection go, and the mount goes.
    if (fs_->keeper) fs_->keeper->Release(mountpoint_);
    if (!loop_done_) {
      fuse_session_exit(se_);
      Unmount(mountpoint_);
    }
    if (loop_.joinable()) loop_.join();
    StopInvalidator();
    fs_->keeper.reset();
    fs_->opens.clear();  // the leases end; the connection is gone with its backing ids
    fs_->idle.clear();
    if (mounted_) fuse_session_unmount(se_);
    fuse_session_destroy(se_);
    se_ = nullptr;
    if (loop_cfg_) fuse_loop_cfg_destroy(loop_cfg_);
    loop_cfg_ = nullptr;
    spdlog::info("unmounted {}", mountpoint_);
  }

 private:
  std::string mountpoint_;
  std::string endpoints_file_;
  std::string handover_path_, keeper_path_;
  int listen_fd_ = -1;
  std::thread responder_;
  std::atomic<bool> handing_over_{false};
  std::atomic<bool> handed_over_{false};
  std::unique_ptr<Fs> fs_;
  std::unique_ptr<SessionIo> io_;
  fuse_session* se_ = nullptr;
  fuse_loop_config* loop_cfg_ = nullptr;
  bool mounted_ = false;
  std::thread loop_;
  std::atomic<bool> loop_done_{false};
  std::atomic<bool> stopping_{false};
  std::mutex stop_mu_;
  std::unique_ptr<metrics::MetricsServer> metrics_;
  std::unique_ptr<StreamSocket> trace_;  // the access trace, for root and this user only
};

}  // namespace

StatusOr<std::unique_ptr<FuseMount>> FuseMount::Start(const Config& cfg) {
  auto m = std::make_unique<FuseMountImpl>();
  RETURN_IF_ERROR(m->Init(cfg));
  return std::unique_ptr<FuseMount>(std::move(m));
}

}  // namespace granary::fuse
