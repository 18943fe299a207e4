// open, read and release: the data path of the three read modes (fuse.open; fuse/mount.h).
//
// Design
// ------
// The mode is chosen at INIT (fuse/ops_meta.cc) and read once per OPEN (Fs::mode); its rules for
// an OPEN are a ReadMode (fuse/ops.h: KernelMode, DaemonMode, PassthroughMode below), asking
// objects that know nothing of the kernel (fuse/fs_state.h lists them). Every function answers
// through a Reply (fuse/reply.h: libfuse's in the Op* adapters at the end, a recording one in
// tests/fuse/ops_test.cc):
//   kernel       Open answers ENOSYS once (with fuse.writes: handle 0 at once, as a write needs its
//                OPEN): from then on the kernel opens every file itself and sends reads with no
//                file handle. Read serves them by inode: KernelReads says which version the
//                reading process is on (fuse/kernel_reads.h).
//   daemon       Open gets the file's info (FileCache, else the master), lets the kernel keep its
//                pages when DaemonPages says they are of the version opened (fuse.keep_cache) and
//                hands out a handle (OpenHandles). Read serves the handle's version, failing
//                with ESTALE once the under-storage has changed; Release drops the handle.
//   passthrough  Open asks PassthroughOpens for a backing id (fuse/passthrough.h). With one, the
//                kernel reads the cache data file itself and only RELEASE comes back; without one
//                (the file is empty, not wholly cached on this node, or its inode is open in the
//                kernel's other io mode) the open is served as in daemon mode. Once the kernel
//                refuses a backing file, every open is answered as in kernel mode.
// In kernel and daemon modes a file read at random while whole in the local cache is leased and
// its READs answered from the cache data file (MaybeLease, ReplyFromLease; fuse/read_leases.h).
// In every mode a sequential read hints the blocks after it to the workers (MaybeReadahead), and
// the bytes a read returns are counted per mount by where they came from (CountReadSources). A
// read with a handle this process does not know (a crashed predecessor's) is served by inode and
// its handle adopted.
#include "fuse/ops.h"

#include <fcntl.h>
#include <sys/uio.h>

#include <unistd.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstring>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "fuse/client.h"
#include "fuse/errno.h"
#include "fuse/fs_state.h"
#include "fuse/session_io.h"
#include "fuse/trace.h"
#include "fuse/uring.h"

namespace granary::fuse::internal {
namespace {

// A read that starts where the previous one ended (or at 0) is sequential: hint the blocks after
// the last one it touches (fuse.readahead_blocks), so the workers fetch them while the reader is
// still busy. Each block is hinted once per open. Returns whether the read is a random one: farther
// from where the last one ended than the kernel's readahead reorders (ReadLeases::kSequentialSlack
// or 4 READs), so a range it reads at a block's start is not a sequential reader's block start.
// *continues: the read is within 4 READs of where the last one ended (ReadBlockRequest.continues:
// the kernel's readahead reorders a stream's READs; a range inside a block is then no jump).
bool MaybeReadahead(Fs* fs, OpenFile* of, uint64_t off, uint64_t size, bool* continues) {
  uint64_t ahead = fs->cfg.fuse.readahead_blocks, bs = of->info.block_size();
  uint64_t first = 0, count = 0;
  bool random = false;
  {
    MutexLock lock(&of->mu);
    const uint64_t slack = std::max<uint64_t>(ReadLeases::kSequentialSlack, 4 * size);
    random = off != 0 && (off + slack < of->next_offset || off > of->next_offset + slack);
    *continues = off != 0 && off + 4 * size >= of->next_offset && off <= of->next_offset + 4 * size;
    bool sequential = off == of->next_offset;
    of->next_offset = off + size;
    if (!sequential || ahead == 0 || bs == 0 || size == 0) return random;
    uint64_t end_block = (off + size - 1) / bs;
    uint64_t last = end_block + ahead;
    first = std::max(of->hinted_through + 1, end_block + 1);
    if (last < first) return random;
    count = last - first + 1;
    of->hinted_through = last;
  }
  fs->client->Prefetch(of->info, first, count);
  return random;
}

// Kernel mode: the file behind a read that came with no open file handle, by its inode and the
// reading process (fuse/kernel_reads.h says which version each process gets). The information a
// listing or a lookup brought (fuse/open_notes.h) serves the file's first read, with its age, as
// it would serve an open; otherwise the master is asked directly, not through the FileCache (which
// serves opens). Either way the FileCache's entry is dropped: a file's info is kept in one place,
// and an open after it asks the master too.
StatusOr<std::shared_ptr<OpenFile>> InodeFile(Fs* fs, fuse_ino_t ino, uint64_t off, pid_t pid) {
  auto r = fs->kernel_reads->FileFor(ino, off, pid, [fs](uint64_t kino, std::chrono::milliseconds* age)
                                                        -> StatusOr<rpc::FileInfo> {
    const uint64_t mino = fs->ToMaster(kino);
    auto listed = fs->files->Get(mino, age);
    fs->files->Erase(mino);  // what an open would find may be as old: it asks anew
    if (listed && fs->open_notes && fs->open_notes->Opened(mino)) {
      fs->NoteVersion(kino, listed->attr().version_hash());
      return std::move(*listed);
    }
    *age = std::chrono::milliseconds(0);
    if (fs->open_notes) fs->open_notes->Forget(mino);
    ASSIGN_OR_RETURN(rpc::FileInfo info, fs->client->GetFile(mino));
    fs->NoteVersion(kino, info.attr().version_hash());
    fs->attrs->Put(info.attr().ino(), info.attr());  // the newest the master said
    return info;
  });
  if (!r.ok()) return r.status();
  if (r->new_version) fs->Invalidate(ino);  // the kernel's pages are the old version's
  return std::move(r->file);
}

// Counts a read's bytes by where they came from (`add`, by NodeSource), per mount; tells the
// trace record (if any) the source, or "mixed".
void CountSourceBytes(Fs* fs, uint64_t mount_id, const std::array<uint64_t, 3>& add, TraceRecord* rec) {
  {
    MutexLock lock(&fs->mount_bytes_mu);
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

void CountReadSources(Fs* fs, uint64_t mount_id, const ReadResult& data, TraceRecord* rec) {
  std::array<uint64_t, 3> add{};
  for (const auto& p : data.pieces) add[static_cast<size_t>(p.source)] += p.length;
  CountSourceBytes(fs, mount_id, add, rec);
}

// How file bytes go into a reply: spliced into /dev/fuse, or copied into the io_uring entry of a
// ring thread (fuse/uring.h), which a splice cannot reach.
fuse_buf_copy_flags ReplyCopyFlags() {
  return UringQueues::OnRingThread() ? FUSE_BUF_NO_SPLICE : FUSE_BUF_SPLICE_MOVE;
}

// This thread's scratch buffer for a READ's bytes, at least n long: grown without zero-filling it
// (a vector's resize wrote every byte of a new thread's buffer before its first READ; libfuse's
// loop ends and starts threads all through a cold epoch). Its content is unspecified.
char* ThreadScratch(size_t n) {
  thread_local std::unique_ptr<char[]> buf;
  thread_local size_t capacity = 0;
  if (capacity < n) {
    buf.reset(new char[n]);  // default-initialized: not zeroed
    capacity = n;
  }
  return buf.get();
}

// Answers a READ from the file's read lease (fuse/read_leases.h): spliced from the cache's data file,
// or, below kCopyBelow bytes, copied.
constexpr size_t kCopyBelow = 64 * 1024;
void ReplyFromLease(Reply& r, Fs* fs, const OpenFile& of, const FileLease& lease, uint64_t off, size_t size,
                    OpScope* scope) {
  const uint64_t end = std::min<uint64_t>(of.info.attr().size(), lease.length());
  if (off >= end) {
    r.Buf(nullptr, 0);
    return;
  }
  const size_t n = static_cast<size_t>(std::min<uint64_t>(size, end - off));
  fs->read_bytes += n;
  fs->leased_reads++;
  std::array<uint64_t, 3> add{};
  add[static_cast<size_t>(NodeSource::kLocal)] = n;  // a lease is of this node's cache
  CountSourceBytes(fs, of.info.mount_id(), add, scope->tracing() ? &scope->record() : nullptr);
  char* in_place = UringQueues::ReplyBuffer(n);  // a ring thread: read straight into its entry
  if (n <= kCopyBelow || in_place != nullptr) {
    // A small read costs less copied (pread, one write) than spliced through a pipe (two splices).
    char* dst = in_place != nullptr ? in_place : ThreadScratch(n);
    ssize_t got = pread(lease.fd(), dst, n, static_cast<off_t>(off));
    if (got < 0) return ReplyError(r, ErrnoError(errno, "read of the leased cache file"), "read");
    r.Buf(dst, static_cast<size_t>(got));
    return;
  }
  fuse_bufvec bv = FUSE_BUFVEC_INIT(n);
  bv.buf[0].flags = static_cast<fuse_buf_flags>(FUSE_BUF_IS_FD | FUSE_BUF_FD_SEEK);
  bv.buf[0].fd = lease.fd();
  bv.buf[0].pos = static_cast<off_t>(off);
  r.Data(&bv, ReplyCopyFlags());
}

// After a READ: counts the open's non-sequential reads from the local cache, and on the one past
// ReadLeases::kReadsBeforeLease asks the local worker for a read lease of the file (at most once per
// fuse.attr_timeout per open).
void MaybeLease(Fs* fs, OpenFile* of, bool local, uint64_t off, uint64_t size) {
  {
    MutexLock lock(&of->mu);
    // Within a few requests of where the last one ended is sequential: the kernel's readahead has
    // several READs of one file in flight, answered in any order.
    const uint64_t slack = std::max<uint64_t>(ReadLeases::kSequentialSlack, 4 * size);
    const bool sequential = off + slack >= of->lease_next && off <= of->lease_next + slack;
    of->lease_next = off + size;
    if (!local) {  // not (all) in the local cache yet: count again from here
      of->local_reads = 0;
      return;
    }
    // A sequential reader reads each byte once: a lease would only hold the file's blocks.
    if (sequential) return;
    if (++of->local_reads <= ReadLeases::kReadsBeforeLease) return;
    const auto now = std::chrono::steady_clock::now();
    if (of->lease_asked != std::chrono::steady_clock::time_point{} && now - of->lease_asked < fs->cfg.fuse.attr_timeout) {
      return;
    }
    of->lease_asked = now;
  }
  const uint64_t file_size = of->info.attr().size();
  // The bytes leased stay under half the local worker's cache: its capacity, asked once a minute.
  const int64_t now_ns = std::chrono::steady_clock::now().time_since_epoch().count();
  int64_t checked = fs->capacity_checked_ns.load();
  if (now_ns - checked > std::chrono::nanoseconds(std::chrono::minutes(1)).count() &&
      fs->capacity_checked_ns.compare_exchange_strong(checked, now_ns)) {
    if (auto stats = fs->client->WorkerStats(); stats.ok()) fs->read_leases->SetCapacity(stats->capacity_bytes());
  }
  if (file_size == 0 || !fs->read_leases->Fits(file_size)) return;
  auto lease = fs->client->LeaseFile(of->info, /*verify=*/true);
  if (!lease.ok()) return;  // not whole here, or spread over directories: this open reads as before
  fs->read_leases->Add(of->info.attr().ino(), of->info.version(), file_size, std::move(*lease));
}

// The pieces of a read, one after the other at `dst` (data.size() bytes).
Status CopyPieces(const ReadResult& data, char* dst) {
  for (const LocalChannel::Piece& p : data.pieces) {
    if (p.fd < 0) {
      if (p.mem != dst) std::memcpy(dst, p.bytes(), p.length);  // else read in place already
    } else {
      RETURN_IF_ERROR(LocalChannel::ReadInto(p, dst));
    }
    dst += p.length;
  }
  return Status::OK();
}

// The pieces of a read as the reply's buffers: a leased block file (libfuse splices its pages into
// /dev/fuse) or bytes in memory. The leases end when `data` goes, after the reply is written.
// Bytes that are all in memory go with one writev: libfuse's splice path would first copy them
// into a pipe (a write) and then splice the pipe, two copies where writev makes one.
void ReplyPieces(Reply& r, const ReadResult& data) {
  size_t n = data.pieces.size();
  if (std::none_of(data.pieces.begin(), data.pieces.end(), [](const LocalChannel::Piece& p) { return p.fd >= 0; })) {
    std::vector<iovec> iov(n);
    for (size_t i = 0; i < n; ++i) {
      iov[i].iov_base = const_cast<char*>(data.pieces[i].bytes());
      iov[i].iov_len = data.pieces[i].length;
    }
    r.Iov(iov.data(), static_cast<int>(n));
    return;
  }
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
      // A pipe has no position: its next bytes are the piece's (spliced pipe to pipe, no copy).
      b.flags = static_cast<fuse_buf_flags>(p.pipe ? FUSE_BUF_IS_FD : (FUSE_BUF_IS_FD | FUSE_BUF_FD_SEEK));
      b.fd = p.fd;
      b.pos = p.pipe ? 0 : static_cast<off_t>(p.offset);
    } else {
      b.mem = const_cast<char*>(p.bytes());
    }
  }
  r.Data(bv, ReplyCopyFlags());
}

}  // namespace

void EndOpen(Fs* fs, uint64_t kino, uint64_t fh, const OpenFile& of) {
  fs->passthrough->End(kino, of.passthrough, of.counted_cached, [&] {
    if (of.counted_cached && fs->keeper) fs->keeper->DropHandle(fh);
  });
}

namespace {
// Whether the connection `r` came on opens files by itself (fuse/fs_state.h, Connection): it is
// open-free already, or it is the current one and goes open-free now (SuperblockMode::GoOpenFree:
// no writable dataset shown, its superblock made read-only first). Only a connection in the
// kernel mode from its INIT: one that fell back from passthrough has opens served by granary-fuse
// and backing files on it.
bool OpenFree(Fs* fs, const Reply& r) {
  Connection* c = fs->ConnOf(r);
  if (c == nullptr) return false;
  if (c->open_free) return true;
  if (c != fs->current.load() || fs->wanted != OpenMode::kKernel) return false;
  if (!fs->sb_mode.GoOpenFree(&c->open_free)) return false;
  // The keeper's copy of the state says so from now on (a successor after a crash must not let
  // writes through this connection).
  if (fs->keeper) fs->keeper->SetConnection(fs->io.load()->fd());
  return true;
}
}  // namespace

// A read-only open in the kernel mode. ENOSYS, with fuse.writes off or on a connection that shows
// no writable dataset (OpenFree): the kernel answers every later open itself (no OPEN, no RELEASE),
// keeps the page cache across opens, and sends reads with no file handle (OpRead serves them by
// inode). Else opens keep coming (a write needs its OPEN): answered at once, reads served by
// inode, the page cache kept while the version is unchanged (NoteVersion), no FLUSH.
void ReplyKernelOpen(Reply& r, Fs* fs, fuse_file_info* fi) {
  fs->opens_kernel++;
  if (!fs->cfg.fuse.writes || OpenFree(fs, r)) return ReplyUnsupported(r);
  fi->fh = 0;
  fi->keep_cache = 1;
  fi->noflush = 1;
  r.Open(*fi);
}

// A read-only open of a file written on this node and not yet in the master as such (being written,
// or closed with write=back and its upload under way: fuse/writes.h, "Read-your-writes") reads
// the bytes written, in every read mode. True when answered so.
bool OpenWrittenHere(Reply& r, Fs* fs, fuse_ino_t ino, fuse_file_info* fi) {
  WriteFiles* w = fs->WritesIfAny();
  if (w == nullptr || !w->Has(ino)) return false;
  auto fh = w->OpenStaged(ino);
  if (!fh.ok()) return false;
  fi->fh = *fh;
  fi->keep_cache = 0;  // pages of an earlier version must not answer
  fi->direct_io = 0;   // mmap works
  fi->noflush = 1;     // a reader's close commits nothing
  if (r.Open(*fi) != 0) w->Abort(*fh, ino).IgnoreError();
  return true;
}

namespace {

// An open served by granary-fuse (daemon mode, and passthrough's misses): a handle of the version
// opened, the kernel's pages kept while that version is the one they hold (DaemonPages). After a
// passthrough miss (`passthrough`), an open in the kernel's cached io mode is counted for the
// keeper (fuse/handover.h), `choice` saying whether PassthroughOpens counted it already.
void ServeOpen(Fs* fs, Reply& r, fuse_ino_t ino, fuse_file_info* fi, const std::shared_ptr<OpenFile>& of,
               bool passthrough, const PassthroughOpens::Choice& choice) {
  fs->opens_daemon++;
  fi->fh = fs->handles->Add(of);
  fi->noflush = 1;  // a read-only open: close() costs no FLUSH request
  if (!fi->direct_io) {
    fi->keep_cache = fs->pages.Open(fs->ToMaster(ino), of->info.version(), fs->cfg.fuse.keep_cache);
    if (passthrough) {
      // It holds the inode in the kernel's cached io mode: the keeper must know (fuse/handover.h).
      auto tell = [&] {
        of->counted_cached = true;
        if (fs->keeper) fs->keeper->PutHandle(fs->HandleOf(fi->fh, *of));
      };
      if (choice.cached) {  // counted by Open
        MutexLock lock(&fs->passthrough->mu);
        tell();
      } else {  // refused: counted now
        fs->passthrough->AddCached(ino, tell);
      }
    }
  }
  if (r.Open(*fi) != 0) {  // the open was interrupted: no RELEASE will come
    EndOpen(fs, ino, fi->fh, *of);
    fs->handles->Take(fi->fh, ino);
  }
}

// The file an open opens, its version noted (a new one drops the kernel's pages); null when the
// open was answered with an error.
std::shared_ptr<OpenFile> OpenedFile(Fs* fs, Reply& r, fuse_ino_t ino) {
  auto info = FileInfoOf(fs, fs->ToMaster(ino));
  if (!info.ok()) {
    ReplyError(r, info.status(), "open");
    return nullptr;
  }
  fs->NoteVersion(ino, info->attr().version_hash());
  auto of = std::make_shared<OpenFile>();
  of->info = std::move(*info);
  return of;
}

class KernelMode final : public ReadMode {
 public:
  OpenMode kind() const override { return OpenMode::kKernel; }
  void Open(Fs* fs, Reply& r, fuse_ino_t, fuse_file_info* fi) const override { ReplyKernelOpen(r, fs, fi); }
};

class DaemonMode final : public ReadMode {
 public:
  OpenMode kind() const override { return OpenMode::kDaemon; }
  void Open(Fs* fs, Reply& r, fuse_ino_t ino, fuse_file_info* fi) const override {
    if (auto of = OpenedFile(fs, r, ino)) ServeOpen(fs, r, ino, fi, of, false, {});
  }
};

class PassthroughMode final : public ReadMode {
 public:
  OpenMode kind() const override { return OpenMode::kPassthrough; }
  void Open(Fs* fs, Reply& r, fuse_ino_t ino, fuse_file_info* fi) const override {
    auto of = OpenedFile(fs, r, ino);
    if (of == nullptr) return;
    PassthroughOpens::Choice choice = fs->passthrough->Open(ino, of->info);
    if (choice.backing_id > 0) {
      of->passthrough = true;
      fi->fh = fs->handles->Add(of);
      fi->keep_cache = 0;  // the kernel allows only direct_io and noflush beside passthrough
      fi->direct_io = 0;
      fi->noflush = 1;
      fs->opens_passthrough++;
      // Once: read-only until a writable dataset is shown. Before the reply, so that no read of
      // this first file finds the superblock writable (each would leave the inode's atime
      // invalid, and the next stat of it a GETATTR round trip).
      fs->sb_mode.OnPassthroughOpen();
      if (r.Open(*fi, choice.backing_id) != 0) {  // interrupted: no RELEASE will come
        EndOpen(fs, ino, fi->fh, *of);
        fs->handles->Take(fi->fh, ino);
      }
      return;
    }
    if (choice.direct_io) fi->direct_io = 1;  // another version of the inode is open in passthrough
    if (fs->mode == OpenMode::kKernel) {  // passthrough was refused just now: as in kernel mode
      if (choice.cached) fs->passthrough->End(ino, false, true);
      return ReplyKernelOpen(r, fs, fi);
    }
    fs->passthrough_misses++;
    ServeOpen(fs, r, ino, fi, of, true, choice);
  }
};

}  // namespace

const ReadMode& ReadModeOf(OpenMode mode) {
  static const KernelMode kernel;
  static const DaemonMode daemon;
  static const PassthroughMode passthrough;
  switch (mode) {
    case OpenMode::kDaemon: return daemon;
    case OpenMode::kPassthrough: return passthrough;
    case OpenMode::kKernel: break;
  }
  return kernel;
}

void Open(Fs* fs, Reply& r, fuse_ino_t ino, fuse_file_info* fi) {
  OpScope scope(fs, r, "open", fs->lat_open, ino);
  if ((fi->flags & O_ACCMODE) != O_RDONLY || (fi->flags & O_TRUNC)) {
    // An open-free connection's superblock is read-only: the kernel refuses writes before they
    // come (this one raced the switch).
    if (Connection* c = fs->ConnOf(r); c != nullptr && c->open_free) return ReplyErrno(r, EROFS);
    return OpenForWrite(fs, r, ino, fi);
  }
  if (OpenWrittenHere(r, fs, ino, fi)) return;
  ReadModeOf(fs->mode).Open(fs, r, ino, fi);
}

void Read(Fs* fs, Reply& r, fuse_ino_t ino, size_t size, off_t off, const fuse_file_info* fi) {
  OpScope scope(fs, r, "read", fs->lat_read, ino);
  if (scope.tracing()) {
    scope.record().offset = static_cast<uint64_t>(off);
    scope.record().size = size;
  }
  if (IsWriteHandle(fi->fh)) return ReadWriteHandle(fs, r, ino, fi->fh, size, off);
  std::shared_ptr<OpenFile> held = fi->fh != 0 ? fs->handles->Find(fi->fh, ino) : nullptr;
  if (!held) {
    // Kernel mode (no open), or a handle of a predecessor that died before handing it over:
    // served by inode, and such a handle keeps the version it is given now.
    fs->reads_by_inode++;
    auto f = InodeFile(fs, ino, static_cast<uint64_t>(off), r.pid());
    if (!f.ok()) return ReplyError(r, f.status(), "read");
    held = std::move(*f);
    if (fi->fh != 0) fs->handles->Adopt(fi->fh, held);
  }
  OpenFile* of = held.get();
  if (off == 0) fs->files_read++;
  if (std::shared_ptr<FileLease> lease = fs->read_leases->Find(of->info.attr().ino(), of->info.version())) {
    return ReplyFromLease(r, fs, *of, *lease, static_cast<uint64_t>(off), size, &scope);
  }
  bool continues = false;
  const bool random = MaybeReadahead(fs, of, static_cast<uint64_t>(off), size, &continues);
  // Where the reply is put together: a ring thread's entry, else this thread's buffer. Pieces read
  // from the source here, and bytes the worker sends inline, land in it directly (Client::Read's
  // scratch).
  char* ring = UringQueues::ReplyBuffer(size);
  char* scratch = ring != nullptr ? ring : ThreadScratch(size);
  ReadResult data;
  Status st = fs->client->Read(of->info, static_cast<uint64_t>(off), size, &data, random, scratch, continues);
  if (!st.ok()) {
    // The file changed in the under-storage since this open: this open fails (ESTALE), the next
    // open asks the master for the new version.
    if (st.IsVersionChanged()) {
      fs->files->Erase(of->info.attr().ino());
      fs->attrs->Erase(of->info.attr().ino());
      fs->pages.Forget(of->info.attr().ino());
      fs->kernel_reads->Unconfirm(ino);  // the next read by inode asks the master
    }
    return ReplyError(r, st, "read");
  }
  if (data.pieces.empty()) {
    r.Buf(nullptr, 0);
    return;
  }
  fs->read_bytes += data.size();
  CountReadSources(fs, of->info.mount_id(), data, scope.tracing() ? &scope.record() : nullptr);
  if (ring != nullptr) {
    // A ring thread: the pieces are read or copied straight into its entry, one copy in all.
    Status copied = CopyPieces(data, scratch);
    if (!copied.ok()) return ReplyError(r, copied, "read");
    r.Buf(scratch, data.size());
  } else {
    ReplyPieces(r, data);
  }
  // After the reply: a file read again and again from the local cache is leased for its next READs.
  const bool local = std::all_of(data.pieces.begin(), data.pieces.end(), [](const LocalChannel::Piece& p) {
    return p.source == NodeSource::kLocal;
  });
  MaybeLease(fs, of, local, static_cast<uint64_t>(off), size);
}

void Release(Fs* fs, Reply& r, fuse_ino_t ino, const fuse_file_info* fi) {
  OpScope scope(fs, r, "release", fs->lat_release, ino);
  if (IsWriteHandle(fi->fh)) return ReleaseWriteHandle(fs, r, ino, fi->fh);
  // A handle this process does not know (a crashed predecessor's) has nothing to end.
  if (auto of = fs->handles->Take(fi->fh, ino)) EndOpen(fs, ino, fi->fh, *of);
  r.Err(0);
}

// A write handle's close() commits what it wrote (fuse/writes.h); read-only opens are noflush, so
// a FLUSH of anything else has nothing to do.
void Flush(Fs* fs, Reply& r, fuse_ino_t ino, const fuse_file_info* fi) {
  if (IsWriteHandle(fi->fh)) return CommitWriteHandle(fs, r, ino, fi->fh, false);
  // ENOSYS: no FLUSH at all from now on (an open-free connection's opens have no noflush flag).
  if (Connection* c = fs->ConnOf(r); !fs->cfg.fuse.writes || (c != nullptr && c->open_free)) return ReplyUnsupported(r);
  r.Err(0);
}
void Fsync(Fs* fs, Reply& r, fuse_ino_t ino, const fuse_file_info* fi) {
  if (IsWriteHandle(fi->fh)) return CommitWriteHandle(fs, r, ino, fi->fh, true);
  r.Err(0);
}

// ---- The adapters to libfuse ----

void OpOpen(fuse_req_t req, fuse_ino_t ino, fuse_file_info* fi) {
  FuseReply r(req);
  Open(FsOf(req), r, ino, fi);
}
void OpRead(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off, fuse_file_info* fi) {
  FuseReply r(req);
  Read(FsOf(req), r, ino, size, off, fi);
}
void OpRelease(fuse_req_t req, fuse_ino_t ino, fuse_file_info* fi) {
  FuseReply r(req);
  Release(FsOf(req), r, ino, fi);
}
void OpFlush(fuse_req_t req, fuse_ino_t ino, fuse_file_info* fi) {
  FuseReply r(req);
  Flush(FsOf(req), r, ino, fi);
}
void OpFsync(fuse_req_t req, fuse_ino_t ino, int, fuse_file_info* fi) {
  FuseReply r(req);
  Fsync(FsOf(req), r, ino, fi);
}

}  // namespace granary::fuse::internal
