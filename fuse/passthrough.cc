// Passthrough mode's backing files: which backing id an open gets, and which are kept after their
// last close (fuse.open=passthrough; fuse/session_io.h registers them with the kernel).
//
// Design
// ------
// A file wholly cached on this node's worker is opened on its cache data file: the worker leases
// the file (no eviction or move while leased; fuse/client.h) and the kernel gets a backing id for
// it, one per inode, shared by the inode's opens (InodeOpens, fuse/fs_state.h). The kernel keeps an
// inode in one io mode — every open passthrough on the same backing file, or every open cached —
// and fails an open that asks for the other one, so an open follows the mode its inode is in: a
// new version while the old one is open in passthrough is served by granary-fuse with direct_io,
// and an inode with a daemon-served open stays daemon-served until those opens close.
//
// When the last open of an inode closes, its backing id and lease are kept (Fs::idle), so the next
// epoch's reopen costs one OPEN round trip instead of a lease and an ioctl. Kept files are let go
// past kIdleBackingFiles or kIdleBackingBytes, and after fuse.attr_timeout (TrimIdleLocked: at
// opens and releases, and once a second from the invalidation thread).
//
// The bookkeeping is done under Fs::opens_mu. The lease and the ioctl are made between two locked
// sections, so PassthroughBacking looks again afterwards (another open may have got there first).
// Leases end after the lock is released. The keeper hears of a backing id before the kernel sees
// it and before it is closed (Fs::KeeperPut, Fs::DropBacking; fuse/handover.h says why).
#include "fuse/ops.h"

#include <spdlog/spdlog.h>

#include <chrono>
#include <map>
#include <memory>
#include <utility>
#include <vector>

#include "fuse/client.h"
#include "fuse/fs_state.h"
#include "fuse/session_io.h"

namespace granary::fuse::internal {
namespace {

// Passthrough: how many closed files keep their backing file (and their blocks held on the
// worker) so that reopening them costs one OPEN round trip instead of a lease and an ioctl, and
// for how many bytes of files at most. A kept file is let go after fuse.attr_timeout.
constexpr size_t kIdleBackingFiles = 4096;
constexpr uint64_t kIdleBackingBytes = 1ull << 30;

}  // namespace

// Lets go of kept backing files: the oldest while over the bounds, and any older than attr_timeout.
// Leases to end go to *done (ended by the caller after the lock is released).
void TrimIdleLocked(Fs* fs, std::vector<std::unique_ptr<FileLease>>* done) REQUIRES(fs->opens_mu) {
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

namespace {

// Takes a kept (closed) entry out of the idle list.
void UnidleLocked(Fs* fs, InodeOpens& st) REQUIRES(fs->opens_mu) {
  if (st.idle_seq == 0) return;
  fs->idle.erase(st.idle_seq);
  fs->idle_bytes -= st.bytes;
  st.idle_seq = 0;
}

}  // namespace

// Passthrough mode: the backing id to open `info` on (its cache data file), counted as one more
// passthrough open of the inode; 0 leaves the open to granary-fuse (with fi->direct_io set when it
// must not use the page cache, as while other opens of the inode read another version through the
// kernel).
int PassthroughBacking(Fs* fs, uint64_t kino, const rpc::FileInfo& info, fuse_file_info* fi) {
  std::vector<std::unique_ptr<FileLease>> done;  // ended after the lock is released
  {
    MutexLock lock(&fs->opens_mu);
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
  MutexLock lock(&fs->opens_mu);
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
  MutexLock lock(&fs->opens_mu);
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

}  // namespace granary::fuse::internal
