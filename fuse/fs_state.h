// Fs: the state one granary-fuse mount shares between its FUSE operations (the session's
// userdata), and what every operation uses with it: FsOf, OpScope (an operation's latency and its
// access-trace record), ToStat / ToEntry (a master Attr as the kernel sees it), FileInfoOf.
// Internal to fuse/: the operations (fuse/ops.h) and the mount (fuse/mount_impl.h) include it.
//
// Design
// ------
// One Fs per mount. FuseMountImpl::Init (fuse/mount.cc) fills it before the session's loop starts;
// it outlives the loop, the invalidation thread and the keeper link. The operations run on
// libfuse's threads (up to fuse.max_threads at once) and reach it through FsOf(req).
//
// Written before the loop starts and only read while it runs: cfg, client, files, entries, se, io,
// root_ino, tracer, keeper, taken_over, wanted_explicitly, and the read modes' objects. Written at
// INIT (ChooseMode, fuse/ops_meta.cc; the kernel sends nothing else before INIT is answered):
// wanted, fallback_reason. `mode` is an atomic because passthrough falls back to kernel mode at the
// first backing file the kernel refuses (MakeBackingHost). The counters are atomics, the latency
// histograms are made up front, and FileCache, EntryCache, Client, Tracer, KeeperLink and the read
// modes' objects lock inside themselves.
//
// Each read mode's rules are an object of its own, testable without a kernel (tests/fuse/); the
// operations in fuse/ops_read.cc are the glue between them and libfuse:
//   kernel       KernelReads (fuse/kernel_reads.h): no open, reads come by inode; which version
//                each process reads. A read with a handle this process does not know (a crashed
//                predecessor's, in any mode) is served the same way and its handle adopted.
//   daemon       DaemonPages (fuse/daemon_pages.h): keep_cache across opens of one version;
//                OpenHandles (fuse/open_handles.h): one OpenFile per open (fi->fh).
//   passthrough  PassthroughOpens (fuse/passthrough.h): one backing id per inode, kept after the
//                last close, and which io mode the kernel holds each inode in; OpenHandles. An open
//                that cannot be passed through is served as in daemon mode.
//   every mode   attr_versions (a new version hash drops the kernel's pages: NoteVersion), the
//                invalidation queue, dir_gens (cached directory listings), mount_bytes.
// dir_gens is a BoundedMap of at most kInodeStates entries (the oldest half forgotten when full).
//
// Locks: what each mutex guards.
//   dir_gens_mu       dir_gens
//   attr_versions_mu  attr_versions
//   OpenHandles::mu   the open file handles and their numbering
//   inval_mu          inval_queue, inval_stop (inval_cv waits on it)
//   conns_mu          conns (held while an invalidation is sent: a connection's session is
//                     destroyed only after it left the list)
//   mount_bytes_mu    mount_bytes
//   OpenFile::mu      an open file's readahead and lease state (next_offset, hinted_through,
//                     local_reads, lease_next, lease_asked)
//   PassthroughOpens::mu  its table, and OpenFile::counted_cached (which the analysis cannot name
//                     from inside OpenFile: a comment there says so)
// clang checks them (GUARDED_BY, REQUIRES; scripts/thread-safety.sh).
// Lock order, where two are held at once:
//   FuseMountImpl::stop_mu_ -> OpenHandles::mu -> PassthroughOpens::mu -> the KeeperLink's and
//   SessionIo's own
//   SuperblockMode's own -> (TryLock only) FuseMountImpl::stop_mu_ -> FuseMountImpl::replace_mu_ ->
//   conns_mu (a connection replaced: fuse/mount_replace.cc)
// OpenHandles::mu comes before PassthroughOpens::mu where both are held (Snapshot in
// fuse/mount_handover.cc). PassthroughOpens::mu is held while the keeper is told of a change
// (BackingHost::Announce / Drop, KeeperLink::PutHandle / DropHandle), so it hears of changes in the
// order they happen (fuse/handover.h): one small message on a local socket. The other mutexes are
// leaves. None of these is held across a call to the master or a worker; leases taken out of the
// passthrough table end after its lock is released.
#pragma once

#define FUSE_USE_VERSION 312
#include <fuse_lowlevel.h>
#include <sys/stat.h>
#include <sys/types.h>

#include <array>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "common/bounded_map.h"
#include "common/config.h"
#include "common/metrics.h"
#include "common/status.h"
#include "common/thread_annotations.h"
#include "fuse/client.h"
#include "fuse/errno.h"
#include "fuse/writes.h"
#include "fuse/file_cache.h"
#include "fuse/open_notes.h"
#include "fuse/daemon_pages.h"
#include "fuse/handover.h"
#include "fuse/kernel_reads.h"
#include "fuse/known_dirs.h"
#include "fuse/superblock_mode.h"
#include "fuse/open_file.h"
#include "fuse/open_handles.h"
#include "fuse/passthrough.h"
#include "fuse/reply.h"
#include "fuse/read_leases.h"
#include "fuse/session_io.h"
#include "fuse/trace.h"
#include "proto/granary.pb.h"

namespace granary::fuse::internal {

// A duration in the seconds libfuse's timeouts take.
inline double Seconds(std::chrono::milliseconds ms) { return static_cast<double>(ms.count()) / 1000.0; }

// How opens and reads are served on this connection (fuse.open; see docs/configuration.md).
enum class OpenMode { kDaemon = 0, kKernel = 1, kPassthrough = 2 };
inline const char* ModeName(OpenMode m) {
  switch (m) {
    case OpenMode::kDaemon: return "daemon";
    case OpenMode::kKernel: return "kernel";
    case OpenMode::kPassthrough: return "passthrough";
  }
  return "?";
}


// Per-inode state remembered to spare a call or a re-read (dir_gens, DaemonPages): at most this
// many entries each, the oldest half forgotten when full (common/bounded_map.h).
inline constexpr size_t kInodeStates = 1'000'000;

struct Fs;

// One FUSE connection of the mount: the userdata of the libfuse session serving it (FsOf reaches
// the mount's state through it; a Reply names it: Fs::ConnOf). A mount has one current connection,
// the one at its mount point, and after a swap older ones draining.
//
// Why more than one: in kernel mode the kernel opens files by itself only on a connection whose
// first OPEN was answered ENOSYS, and that is permanent for the connection; a write needs its OPEN
// (docs/architecture.md, "kernel"). So a kernel-mode connection that shows no writable dataset
// goes open-free at its first read-only OPEN, its superblock made read-only first (the kernel then
// refuses writes there with EROFS before any reaches granary-fuse: SuperblockMode::GoOpenFree).
// When a writable dataset is shown later, a fresh connection is slid under the mount point and the
// old one detached (FuseMountImpl::ReplaceConnection, fuse/mount_replace.cc): new path walks reach the new
// one, which answers OPEN; files and working directories opened through the old one go on there
// until their last user goes, then its loop ends.
struct Connection {
  Fs* fs = nullptr;
  fuse_session* se = nullptr;
  // This connection answered OPEN ENOSYS (kernel mode): no OPEN, RELEASE or FLUSH comes on it, and
  // its superblock is read-only. Set once, never cleared.
  std::atomic<bool> open_free{false};
  // Made to replace an open-free connection: the read mode was chosen at the first one's INIT.
  bool replacement = false;
  // When it was replaced at the mount point (steady clock, ns; 0: it was not, here), and the
  // lookups on it answered ESTALE since (ops_meta.cc, ReplyEntry): a walk that was under way
  // through it is sent round again, once per process and name, for kRedirectWindow.
  static constexpr std::chrono::seconds kRedirectWindow{5};
  std::atomic<int64_t> replaced_at_ns{0};
  // True once for (pid, parent, name) while the window lasts.
  bool RedirectOnce(pid_t pid, uint64_t parent, const char* name) {
    const int64_t at = replaced_at_ns.load();
    const int64_t now = std::chrono::steady_clock::now().time_since_epoch().count();
    if (at == 0 || now - at > std::chrono::nanoseconds(kRedirectWindow).count()) return false;
    MutexLock lock(&redirect_mu);
    if (redirected.size() >= 65536) return false;
    return redirected.insert(std::to_string(pid) + "/" + std::to_string(parent) + "/" + name).second;
  }
  Mutex redirect_mu;
  std::unordered_set<std::string> redirected GUARDED_BY(redirect_mu);
};

// Everything the operations need; reached from a request through its Connection.
struct Fs {
  Config cfg;
  std::unique_ptr<Client> client;
  // The files being written here (fuse/writes.h), made at the first write (the worker's local
  // socket must be known by then). Writes() is that, or why there can be none.
  Mutex writes_mu;
  std::unique_ptr<WriteFiles> writes GUARDED_BY(writes_mu);
  StatusOr<WriteFiles*> Writes() {
    MutexLock lock(&writes_mu);
    if (writes) return writes.get();
    auto path = client->LocalSocketPath();
    if (!path.ok()) return path.status();
    writes = std::make_unique<WriteFiles>(*path, [this] { return handles->Number(); });
    return writes.get();
  }
  // The write handles' table when writes began (null: none did).
  WriteFiles* WritesIfAny() {
    MutexLock lock(&writes_mu);
    return writes.get();
  }
  std::unique_ptr<FileCache> files;
  // Opens served from listed or looked-up information, sent to the master as fetch-ahead's
  // evidence (fuse/open_notes.h). Null when the FileCache keeps nothing (fuse.file_cache_entries 0
  // or fuse.attr_timeout 0): listings and lookups then ask for no open information.
  std::unique_ptr<OpenNotes> open_notes;
  std::unique_ptr<EntryCache> entries;  // lookups, for min(entry_timeout, attr_timeout)
  std::unique_ptr<AttrCache> attrs;     // attributes by master inode, for attr_timeout
  // The connection at the mount point (null before the mount, and in tests), and every connection
  // served, for the invalidations (the current one and those draining; fuse/mount.cc keeps it).
  std::atomic<Connection*> current{nullptr};
  Mutex conns_mu;
  std::vector<Connection*> conns GUARDED_BY(conns_mu);
  // The connection a request came on (a Reply that cannot tell: the current one; null in tests).
  Connection* ConnOf(const Reply& r) const {
    Connection* c = r.connection();
    return c != nullptr ? c : current.load();
  }
  std::atomic<SessionIo*> io{nullptr};  // the current connection's; set when granary-fuse does the session's I/O (passthrough wanted)
  std::atomic<OpenMode> wanted{OpenMode::kKernel};  // from fuse.open (auto: its choice at INIT)
  bool wanted_explicitly = false;       // fuse.open named the mode: a fallback is a warning
  std::atomic<OpenMode> mode{OpenMode::kKernel};  // decided at INIT
  std::string fallback_reason;                     // why the wanted mode is not the mode (set at INIT)

  struct DirGen {
    uint64_t generation;                           // whose listing the kernel may hold
    std::chrono::steady_clock::time_point checked;  // when the master last confirmed it
    bool writable = false;  // below a writable mount: confirmed at every opendir (close-to-open)
    // The cookie after which the master last said the listing ends, and when: the kernel's closing
    // readdir at that offset is answered empty without asking again (ops_meta.cc, ReadDirCommon).
    uint64_t end_after = UINT64_MAX;
    std::chrono::steady_clock::time_point end_at{};
  };
  // Directories below writable mounts seen lately (master inodes): a name missing from one is not
  // remembered by the kernel (another node may create it). Cleared when it grows past kInodeStates.
  // Directories this node made lately, with the names it put in them: a lookup of another name
  // there is answered "no such entry" without the master (fuse/known_dirs.h).
  KnownDirs known_dirs;
  Mutex writable_dirs_mu;
  std::unordered_set<uint64_t> writable_dirs GUARDED_BY(writable_dirs_mu);
  void NoteWritableDir(uint64_t master_ino) {
    MutexLock lock(&writable_dirs_mu);
    if (writable_dirs.size() >= kInodeStates) writable_dirs.clear();
    writable_dirs.insert(master_ino);
  }
  bool IsWritableDir(uint64_t master_ino) {
    MutexLock lock(&writable_dirs_mu);
    return writable_dirs.count(master_ino) != 0;
  }
  Mutex dir_gens_mu;
  BoundedMap<uint64_t, DirGen> dir_gens GUARDED_BY(dir_gens_mu){kInodeStates};  // master ino -> DirGen
  // Daemon mode: the version whose bytes the kernel's page cache may hold for a file: the one it
  // was last opened at. An open of the same version keeps those pages (keep_cache); another
  // version drops them.
  DaemonPages pages{kInodeStates};
  // Every mode: the version hash each file's attributes last carried. A change that the kernel
  // cannot see in size or mtime (a new ETag) drops its cached pages through the invalidator.
  Mutex attr_versions_mu;
  std::unordered_map<uint64_t, uint64_t> attr_versions GUARDED_BY(attr_versions_mu);  // kernel ino -> Attr.version_hash
  // Kernel mode: the file each process reads by inode (fuse/kernel_reads.h). Made at mount.
  std::unique_ptr<KernelReads> kernel_reads;
  // Passthrough mode: backing ids per inode, kept after the last close (fuse/passthrough.h). Made
  // at mount, before the loop starts.
  std::unique_ptr<BackingHost> backing_host;
  std::unique_ptr<PassthroughOpens> passthrough;

  // Open file handles (fi->fh) of daemon-served opens and passthrough opens (fuse/open_handles.h).
  // Made at mount, before the loop starts.
  std::unique_ptr<OpenHandles> handles;

  // Hand-over (fuse/handover.h). The keeper is told about backing ids as they change, under
  // PassthroughOpens::mu (so it hears of them in the order they happen).
  std::unique_ptr<KeeperLink> keeper;
  bool taken_over = false;        // this process took the connection over: the mode is the predecessor's
  // Read-only superblock until a writable dataset is shown (passthrough; fuse/superblock_mode.h).
  SuperblockMode sb_mode;
  void KeeperPut(uint64_t kino, const InodeOpens& st) {
    if (!keeper) return;
    rpc::FuseBacking b;
    b.set_kino(kino);
    b.set_backing_id(st.backing_id);
    *b.mutable_info() = st.info;
    keeper->PutBacking(b);
  }
  // An open file handle as a successor gets it (a hand-over, or the keeper).
  // Call with passthrough->mu held: it reads of.counted_cached.
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
    if (!keeper || keeper->DropBacking(kino, backing_id)) io.load()->CloseBacking(backing_id);
  }

  // Invalidations of cached pages, sent from their own thread: a notification from inside a
  // request for the same inode could deadlock on the pages that request holds.
  Mutex inval_mu;
  std::condition_variable inval_cv;
  std::deque<uint64_t> inval_queue GUARDED_BY(inval_mu);  // kernel inos
  bool inval_stop GUARDED_BY(inval_mu) = false;
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
  metrics::Histogram* lat_write = &op_latency.Get("write");
  metrics::Histogram* lat_flush = &op_latency.Get("flush");  // close(): a written file's commit
  metrics::Histogram* lat_fsync = &op_latency.Get("fsync");
  metrics::Histogram* lat_create = &op_latency.Get("create");
  std::atomic<uint64_t> read_bytes{0};
  std::atomic<uint64_t> written_bytes{0}, files_committed{0};  // writes (fuse/writes.h)
  std::atomic<uint64_t> opens_passthrough{0}, opens_daemon{0}, opens_kernel{0};
  std::atomic<uint64_t> reads_by_inode{0};  // kernel mode: reads with no open file handle
  // Daemon and kernel modes: files read from a leased cache data file (fuse/read_leases.h).
  std::unique_ptr<ReadLeases> read_leases;
  std::atomic<uint64_t> leased_reads{0};       // READs answered from a read lease
  std::atomic<int64_t> capacity_checked_ns{0};  // when the local worker's capacity was last asked
  std::atomic<uint64_t> passthrough_misses{0};  // passthrough mode: opens served by granary-fuse instead
  std::atomic<uint64_t> invalidations{0};
  std::atomic<uint64_t> files_read{0};  // reads at offset 0: files readers started on
  // Bytes returned to readers per mount id, by where they came from (NodeSource).
  Mutex mount_bytes_mu;
  std::map<uint64_t, std::array<uint64_t, 3>> mount_bytes GUARDED_BY(mount_bytes_mu);
  std::unique_ptr<Tracer> tracer;  // the access trace (fuse/trace.h)

  // The kernel's root inode is always 1; fuse.root may name another master inode.
  uint64_t ToMaster(fuse_ino_t ino) const { return ino == FUSE_ROOT_ID ? root_ino : ino; }
  uint64_t ToKernel(uint64_t ino) const { return ino == root_ino ? FUSE_ROOT_ID : ino; }

  void Invalidate(uint64_t kino) {
    MutexLock lock(&inval_mu);
    if (inval_queue.size() < 100000) inval_queue.push_back(kino);
    inval_cv.notify_one();
  }
  // Runs the invalidations; once a second also lets go of kept passthrough backing files that
  // outlived attr_timeout, of read leases past theirs, and of idle under-storage files.
  void InvalidateLoop() {
    auto last_trim = std::chrono::steady_clock::now();
    for (;;) {
      uint64_t kino = 0;
      bool trim = false;
      {
        MutexLock lock(&inval_mu);
        auto until = std::chrono::steady_clock::now() + std::chrono::seconds(1);
        while (!inval_stop && inval_queue.empty() && lock.WaitUntil(&inval_cv, until)) {
        }
        if (inval_stop) return;
        trim = inval_queue.empty() || std::chrono::steady_clock::now() - last_trim > std::chrono::seconds(1);
        if (!trim) {
          kino = inval_queue.front();
          inval_queue.pop_front();
        }
      }
      if (trim) {
        if (passthrough) passthrough->Trim();
        if (read_leases) read_leases->Trim();
        if (client) client->TrimSourceReads();
        last_trim = std::chrono::steady_clock::now();
        continue;
      }
      // -ENOENT: the kernel holds nothing of that inode. Fine. Every connection: one draining may
      // hold pages of the file too. (conns_mu held: a drained connection's session is destroyed
      // only after it left the list.)
      {
        MutexLock lock(&conns_mu);
        for (Connection* c : conns) fuse_lowlevel_notify_inval_inode(c->se, kino, 0, 0);
      }
      invalidations++;
    }
  }
  // Records the version a file's attributes carry; a change drops the kernel's pages of it.
  void NoteVersion(uint64_t kino, uint64_t version_hash) {
    if (version_hash == 0) return;
    {
      MutexLock lock(&attr_versions_mu);
      if (attr_versions.size() > std::max<uint64_t>(cfg.fuse.file_cache_entries, 1024)) attr_versions.clear();
      auto [it, fresh] = attr_versions.try_emplace(kino, version_hash);
      if (fresh || it->second == version_hash) return;
      it->second = version_hash;
    }
    Invalidate(kino);
  }
};

// Bytes the kernel may ask for in one READ: 1 MiB less 16 KiB, so that a READ answered from a cache
// file is spliced. libfuse splices a reply through a pipe only when the pipe can hold the header,
// the data and a page per buffer besides; an unprivileged process cannot grow a pipe past
// /proc/sys/fs/pipe-max-size (1 MiB by default), and at a full 1 MiB libfuse fell back to a fresh
// 1 MiB buffer, a pread into it and a copy out for every READ (docs/benchmarks.md, "Cold shards").
inline constexpr unsigned kMaxReadahead = (1 << 20) - (16 << 10);

inline Fs* FsOf(fuse_req_t req) { return static_cast<Connection*>(fuse_req_userdata(req))->fs; }

// Fills what the operations need of a new Fs from `cfg` (the wanted read mode, the caches, the
// handle table, the read leases, the tracer); fs->client must be set. The mount (MakeFs) adds the
// passthrough objects and the root; tests drive the operations on an Fs made with it alone.
void InitFs(Fs* fs, const Config& cfg);

// Times one operation into its histogram (may be null) and, while someone listens to the access
// trace, records it (fuse/trace.h): with no listener it costs one atomic load. Construct it before
// replying (the request's context is gone after the reply).
class OpScope {
 public:
  OpScope(fuse_req_t req, const char* op, metrics::Histogram* h, fuse_ino_t ino)
      : OpScope(FsOf(req), FuseReply(req), op, h, ino) {}
  OpScope(Fs* fs, const Reply& r, const char* op, metrics::Histogram* h, fuse_ino_t ino)
      : fs_(fs), h_(h), start_(std::chrono::steady_clock::now()),
        tracing_(fs_->tracer && fs_->tracer->Listening()) {
    if (!tracing_) return;
    TakeReplyErrno();
    rec_.time_ns = std::chrono::duration_cast<std::chrono::nanoseconds>(
                       std::chrono::system_clock::now().time_since_epoch()).count();
    rec_.pid = static_cast<uint32_t>(r.pid());
    rec_.uid = r.uid();
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

// Passthrough mode's BackingHost on a mount: leases from the local worker, backing ids from the
// session's I/O (SessionIo), the keeper told first. The first backing file the kernel refuses
// turns the mount to kernel mode (with a warning).
std::unique_ptr<BackingHost> MakeBackingHost(Fs* fs);

// A master Attr as the kernel sees it (fuse.root's inode shown as the kernel's root, 1). An Attr
// below a writable mount first makes the mount writable (Fs::sb_mode).
struct stat ToStat(Fs* fs, const rpc::Attr& a);
// The kernel's attribute timeout for `a`: fuse.attr_timeout, or below a writable mount 0 for files
// (close-to-open) and at most 1 s for directories.
double WritableAttrTimeout(const Fs* fs, const rpc::Attr& a);
// A lookup's answer, with the kernel's timeouts; notes a file's version (Fs::NoteVersion).
fuse_entry_param ToEntry(Fs* fs, const rpc::Attr& a);
// The file's open information: from the FileCache, else from the master.
StatusOr<rpc::FileInfo> FileInfoOf(Fs* fs, uint64_t master_ino);
// A file's open information that came with a listing or a lookup: kept in the FileCache for the
// open to come (which then asks the master nothing) and noted for fetch-ahead (fuse/open_notes.h).
// Nothing when open_notes is null, `f` is empty (the master left it out: the file is due for a
// check), or the file is below a writable mount (close-to-open: its open asks the master), or the
// FileCache has an answer newer than `asked` (when the listing or lookup was sent).
void KeepListedFile(Fs* fs, const rpc::FileInfo& f, std::chrono::steady_clock::time_point asked);

}  // namespace granary::fuse::internal
