// The serving side of a hand-over (fuse/handover.h): the state a successor needs (Snapshot, also
// what the keeper is given), taking such a state in (ApplyState), and the hand-over socket
// (RespondLoop, HandOver) (FuseMountImpl, fuse/mount_impl.h).
#include "fuse/mount_impl.h"

#include <poll.h>
#include <spdlog/spdlog.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <memory>
#include <string>

#include "common/net.h"
#include "common/shutdown.h"
#include "fuse/client.h"
#include "fuse/fs_state.h"
#include "fuse/handover.h"
#include "fuse/session_io.h"

namespace granary::fuse::internal {

// What a successor needs (with_handles: a hand-over; without: a deposit with the keeper, which
// learns backing ids and passthrough mode's daemon-served handles as they change).
rpc::FuseConnectionState FuseMountImpl::Snapshot(bool with_handles) {
  // The current connection's I/O (the keeper link's thread calls this beside a replacement:
  // fuse/mount_replace.cc; a replaced one lives on while it drains).
  SessionIo* io = fs_->io.load();
  rpc::FuseConnectionState st;
  st.set_format(kHandoverFormat);
  st.set_mountpoint(mountpoint_);
  st.set_init_request(io->init_request());
  st.set_mode(static_cast<uint32_t>(fs_->mode.load()));
  st.set_passthrough_negotiated(io->negotiated());
  st.set_root_ino(fs_->root_ino);
  st.set_fingerprint(Fingerprint(fs_->cfg));
  st.set_sender("granary-fuse pid " + std::to_string(getpid()));
  st.set_passthrough_refused(fs_->passthrough->refused());
  st.set_uring_payload(io->uring_payload());
  if (std::shared_ptr<UringQueues> ring = uring()) {
    st.set_uring_memory_base(ring->memory().base);
    st.set_uring_memory_bytes(ring->memory().bytes);
  }
  {
    MutexLock lock(&fs_->passthrough->mu);
    for (const auto& [kino, o] : fs_->passthrough->entries()) {
      if (o.backing_id <= 0) continue;
      rpc::FuseBacking* b = st.add_backings();
      b->set_kino(kino);
      b->set_backing_id(o.backing_id);
      *b->mutable_info() = o.info;
      b->set_passthrough(o.passthrough);
      b->set_idle(o.idle_seq != 0);
    }
  }
  // A hand-over carries every handle; a deposit only the daemon-served opens of passthrough mode
  // (the keeper learns the rest of them as they change, fuse/handover.h). counted_cached is written
  // under the passthrough table's lock, taken after the handles' (the lock order).
  const uint64_t next = fs_->handles->ForEach([&](uint64_t fh, const OpenFile& of) {
    MutexLock lock(&fs_->passthrough->mu);
    if (!with_handles && !of.counted_cached) return;
    *st.add_handles() = fs_->HandleOf(fh, of);
  });
  if (with_handles) st.set_next_fh(next);
  {
    MutexLock keys(&keys_mu_);  // the replaced connections still draining (fuse/mount_replace.cc)
    for (const std::string& k : draining_keys_) st.add_draining_keys(k);
  }
  const Connection* current = fs_->current.load();
  st.set_open_free(current != nullptr && current->open_free);
  st.set_minor(conn_minor_.load());
  return st;
}

// A successor's side of Snapshot: the handles and backing ids of the connection it took over.
void FuseMountImpl::ApplyState(const rpc::FuseConnectionState& st) {
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
    // Our own lease keeps the worker off the data file under the kernel's reads: taken while the
    // predecessor still holds its own (it waits for LEASED, or for RINGS_READY). Without one (the
    // file was freed, evicted or moved meanwhile, or a crash left a gap) the entry is let go as
    // soon as no file is open on it (LetGoUnleased, once the keeper link exists: fuse/mount.cc).
    auto lease = fs_->client->LeaseFile(b.info());
    if (lease.ok()) o.lease = std::move(*lease);
    fs_->passthrough->Adopt(b.kino(), std::move(o), b.idle());
  }
  // A hand-over's numbering goes on; a keeper's handles are a dead predecessor's, whose other
  // numbers (not listed) may still be open: this process keeps its own epoch.
  if (st.next_fh() > 0) fs_->handles->ContinueFrom(st.next_fh());
  for (const rpc::FuseHandle& h : st.handles()) {
    auto of = std::make_shared<OpenFile>();
    of->info = h.info();
    of->passthrough = h.passthrough();
    of->counted_cached = h.counted_cached();
    if (of->counted_cached) fs_->passthrough->AddCached(h.kino());
    fs_->handles->Restore(h.fh(), std::move(of), st.next_fh() > 0);
  }
}

// Serves the hand-over socket: a successor's TAKEOVER.
void FuseMountImpl::RespondLoop() {
  while (!stopping_ && !handed_over_) {
    pollfd p{listen_fd_, POLLIN, 0};
    if (poll(&p, 1, 500) <= 0) continue;
    AcceptedPeer a = AcceptPeer(listen_fd_);
    if (a.refused) {  // a TAKEOVER gets this mount's FUSE connection
      spdlog::warn("hand-over socket {}: refusing a process of uid {}", handover_path_, a.uid);
      continue;
    }
    if (a.fd < 0) continue;
    const int c = a.fd;
    auto m = ReceiveHandover(c, std::chrono::seconds(5));
    if (m.ok() && m->msg.kind() == rpc::HandoverMessage::TAKEOVER) HandOver(c, m->msg);
    if (m.ok()) m->CloseAll();
    close(c);
  }
}

namespace {
// Whether the process at the other end of unix socket `c` is in this process's network namespace
// (then its metrics endpoint wants this one's port). False when that cannot be told.
bool PeerSharesNetwork(int c) {
  ucred cr{};
  socklen_t len = sizeof cr;
  if (getsockopt(c, SOL_SOCKET, SO_PEERCRED, &cr, &len) != 0 || cr.pid <= 0) return false;
  char mine[64] = {0}, theirs[64] = {0};
  const ssize_t a = readlink("/proc/self/ns/net", mine, sizeof mine - 1);
  const std::string peer = "/proc/" + std::to_string(cr.pid) + "/ns/net";
  const ssize_t b = readlink(peer.c_str(), theirs, sizeof theirs - 1);
  return a > 0 && b > 0 && std::string(mine, static_cast<size_t>(a)) == std::string(theirs, static_cast<size_t>(b));
}

// Whether `listen` (fuse.metrics_listen) names a port of its own, which a successor would bind too
// (not "off", not port 0).
bool FixedMetricsPort(const std::string& listen) {
  if (listen.empty() || listen == "off") return false;
  auto hp = ParseHostPort(listen);
  return hp.ok() && hp->port != 0;
}
}  // namespace

void FuseMountImpl::HandOver(int c, const rpc::HandoverMessage& m) {
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
  MutexLock lock(&stop_mu_);
  if (stopping_ || loop_done_) return refuse("this granary-fuse is stopping");
  if (!m.knows_open_free() && (conn_->open_free || draining_live_ > 0)) {
    return refuse("the successor predates open-free connections, and this mount's is one (or one replaced is "
                  "still draining); start a granary-fuse of this version or later, or stop this one (SIGTERM "
                  "unmounts) and start the other");
  }
  // Over io_uring, every entry keeps the next request it gets, for the successor to adopt
  // (fuse/uring.h): from then on no request changes this process's state. An entry left serving
  // would answer beside the successor, so the hand-over waits for all or does not happen.
  std::shared_ptr<UringQueues> ring = uring();
  if (ring) {
    const int parked = ring->Park(mountpoint_, std::chrono::seconds(5));
    if (parked < ring->serving()) {
      ring->Unpark();
      return refuse(std::to_string(ring->serving() - parked) + " of its " + std::to_string(ring->serving()) +
                    " io_uring entries could not be parked in 5 s (busy with slow requests, or on a CPU this "
                    "process may not run on); try the upgrade again");
    }
  }
  auto start = std::chrono::steady_clock::now();
  handing_over_ = true;
  // A fixed port is the successor's when both share a network namespace (metrics ports are not
  // shared: common/metrics.cc). A process that stays idle in a network of its own (Kubernetes,
  // each pod its own), or on a port the OS chose, keeps answering probes: /readyz says "handed
  // over".
  if (fs_->cfg.fuse.exit_after_handover || (FixedMetricsPort(fs_->cfg.fuse.metrics_listen) && PeerSharesNetwork(c))) {
    StopMetrics();
  }
  io_->Drain(se_);   // every request read is answered; nothing more is read
  if (loop_.joinable()) loop_.join();
  StopInvalidator();
  rpc::HandoverMessage out;
  out.set_kind(rpc::HandoverMessage::STATE);
  *out.mutable_state() = Snapshot(true);
  // Files open for writing go on in the successor: their staging files and sessions go along.
  std::vector<WriteFiles::Exported> writing;
  if (WriteFiles* w = fs_->WritesIfAny()) writing = w->Export();
  out.mutable_state()->set_write_files(static_cast<uint32_t>(writing.size()));
  // Replaced connections still draining go along too (fuse/mount_replace.cc).
  const std::vector<Draining*> drains = TakeDrainingForHandOver();
  out.mutable_state()->set_draining(static_cast<uint32_t>(drains.size()));
  close(listen_fd_);  // the successor listens on the same path
  listen_fd_ = -1;
  Status st = SendHandover(c, out, io_->fd(), ring ? ring->memory().fd : -1);
  if (!st.ok()) {
    spdlog::warn("handing {} over failed ({}); serving on", mountpoint_, st.message());
    KeepDraining(drains);
    if (ring) ring->Unpark();
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
  for (size_t i = 0; i < writing.size(); ++i) {
    rpc::HandoverMessage wf;
    wf.set_kind(rpc::HandoverMessage::WRITE_FILE);
    *wf.mutable_write_file() = writing[i].file;
    Status sent = SendHandover(c, wf, writing[i].fd, writing[i].conn);
    if (!sent.ok()) {
      spdlog::error("handing over the files open for writing failed after {} of {} ({}); the writers of the others "
                    "get EIO and their files keep their previous versions", i, writing.size(), sent.message());
      break;
    }
  }
  if (!writing.empty()) spdlog::info("handed over {} file(s) open for writing", writing.size());
  HandOverDraining(c, drains);
  bool rings_kept = false;
  if (ring) {
    // Our parked entries hold their requests until the successor has adopted them and registered
    // the rest (fuse/uring.h). It may take 10 s for libfuse's replayed INIT and 10 s to register:
    // we wait longer. Only a successor that says it adopted nothing (REFUSED) gives them back to us:
    // after a silence it may have answered some already, so they stay its (or, if it died, the
    // next granary-fuse's, from the keeper's copy of the memory).
    auto ready = ReceiveHandover(c, std::chrono::seconds(60));
    if (ready.ok()) ready->CloseAll();
    if (!ready.ok() || ready->msg.kind() != rpc::HandoverMessage::REFUSED) {
      if (!ready.ok() || ready->msg.kind() != rpc::HandoverMessage::RINGS_READY) {
        spdlog::error("the successor did not say it serves the io_uring entries ({}); leaving them to it",
                      ready.ok() ? ready->msg.text() : ready.status().message());
      }
      ring->Stop();  // the parked threads leave their requests to the successor
    } else {
      // It adopted nothing and serves with entries of its own: ours serve too, or what they hold waits.
      ring->Unpark();
      rings_kept = true;
      spdlog::error("the successor did not register io_uring entries ({}); this process keeps serving the ring "
                    "until it is stopped",
                    ready.ok() ? ready->msg.text() : ready.status().message());
    }
  }
  if (!ring && out.state().backings_size() > 0) {
    // Our leases hold the backing files' blocks until the successor holds its own (ApplyState): a
    // block let go in between could be evicted and its data file punched under the kernel's reads.
    // A successor that says nothing (it died, or predates LEASED and closes the socket) is not waited for.
    auto leased = ReceiveHandover(c, std::chrono::seconds(10));
    if (leased.ok()) leased->CloseAll();
    if (!leased.ok() || leased->msg.kind() != rpc::HandoverMessage::LEASED) {
      spdlog::warn("the successor did not say it leased the {} backing files ({}); letting ours go",
                   out.state().backings_size(), leased.ok() ? leased->msg.text() : leased.status().message());
    }
  }
  if (fs_->keeper) fs_->keeper->Stop();  // the successor deposits with the keeper; it keeps ours meanwhile
  // The successor registered its own leases; ours end. The backing ids are the successor's now.
  fs_->passthrough->Clear();
  spdlog::info("handed {} over ({} open files, {} backing files) in {} ms", mountpoint_, out.state().handles_size(),
               out.state().backings_size(),
               std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - start).count());
  if (fs_->cfg.fuse.exit_after_handover && !rings_kept) {
    Shutdown::Request("handed the mount over to a successor");
  } else {
    spdlog::info("fuse.exit_after_handover is false: idle until stopped (SIGTERM leaves the mount to the successor)");
  }
}

}  // namespace granary::fuse::internal
