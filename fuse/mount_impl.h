// FuseMountImpl: the FuseMount of fuse/mount.h, one mount's lifecycle. Internal to fuse/.
//
//   fuse/mount.cc           Init (a fresh mount, or a connection taken over from a predecessor or
//                           the keeper), the FUSE loop and the invalidation thread, Shutdown
//   fuse/mount_handover.cc  the hand-over socket and the state a successor gets (Snapshot,
//                           ApplyState, RespondLoop, HandOver)
//   fuse/mount_replace.cc   an open-free connection replaced by one that takes writes
//   fuse/mount_metrics.cc   /metrics (Render) and /readyz (Ready), the access trace's socket, the
//                           endpoints file
//
// Threads: the owner calls Init once, then Shutdown (from any thread, idempotent). Meanwhile its
// code also runs on the FUSE loop's thread (loop_), the hand-over responder (responder_: HandOver),
// the metrics server's (Render, Ready) and the keeper link's (Snapshot(false)), and a replacement
// of the connection on a request's thread (ReplaceConnection, fuse/mount_replace.cc). stop_mu_
// keeps a hand-over, a shutdown and a replacement apart; it comes before every lock of Fs
// (fuse/fs_state.h) but one: a replacement runs under Fs::sb_mode's lock and so takes stop_mu_
// only with TryLock (never waiting for it). Then replace_mu_ (draining_, never held while a loop
// is joined: a draining loop's end takes it), then fs_->conns_mu; keys_mu_ is a leaf.
#pragma once

#include <atomic>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "common/config.h"
#include "common/metrics.h"
#include "common/status.h"
#include "common/stream_socket.h"
#include "common/thread_annotations.h"
#include "fuse/fs_state.h"
#include "fuse/handover.h"
#include "fuse/mount.h"
#include "fuse/session_io.h"
#include "fuse/uring.h"
#include "proto/granary.pb.h"

namespace granary::fuse::internal {

// The mount's operations (MakeOps), and two helpers on a mount point that ask the kernel nothing
// through it (fuse/mount.cc).
fuse_lowlevel_ops MakeOps();
// The minor device number of the FUSE mount at `mp` (its /sys/fs/fuse/connections entry), from
// /proc/self/mountinfo (the last mount listed there).
std::optional<unsigned> FuseConnection(const std::string& mp);
// Lets the kernel ask for 1 MiB reads on the mount at `mountpoint` (its bdi's read_ahead_kb).
void RaiseReadaheadOf(const std::string& mountpoint);

class FuseMountImpl final : public FuseMount {
 public:
  // A replaced connection, detached from the mount point, served until its last user goes (its
  // loop ends by itself: /dev/fuse reads fail ENODEV once the kernel lets its superblock go).
  struct Draining {
    std::unique_ptr<Connection> conn;
    fuse_session* se = nullptr;
    std::unique_ptr<SessionIo> io;
    fuse_loop_config* loop_cfg = nullptr;
    std::thread loop;
    std::optional<unsigned> minor;       // its /sys/fs/fuse/connections entry (to abort it)
    std::string key;                     // the name the keeper holds it under: <mount point>#replaced-N
    std::unique_ptr<KeeperLink> keeper;  // its deposit with the keeper (fuse.keeper)
    bool handed = false;                 // handed to a successor: its descriptor is the successor's
    std::atomic<bool> ended{false};      // its loop ended and it was let go
  };
  ~FuseMountImpl() override { Shutdown(); }

  // fuse/mount.cc
  Status Init(const Config& cfg);
  void Shutdown() override;
  // Init's steps (fuse/mount.cc): the predecessor, the filesystem's state, the session's I/O and
  // the keeper link, and the two ways to serve: a fresh mount, or a predecessor's connection
  // adopted (its files open for writing, its io_uring entries, telling it when it may let go).
  StatusOr<std::optional<HandoverReceived>> FindPredecessor(const Config& cfg, bool* from_keeper);
  Status MakeFs(const Config& cfg, std::optional<uint64_t> adopted_root);
  Status InstallIo(int fd, const std::string& replay);
  void StartKeeperLink(const Config& cfg, bool adopted);
  Status StartFresh(const Config& cfg);
  Status Adopt(const Config& cfg, HandoverReceived* got, bool from_keeper);
  void AdoptWriteFiles(HandoverReceived* got);
  bool AdoptUring(HandoverReceived* got);
  void TellPredecessor(HandoverReceived* got, bool adopting);
  Status CheckMountPoint();
  void StartLoop();
  // Registers and serves the io_uring queues (fuse/uring.h), adopting a predecessor's entries when
  // their memory is given; on failure the kernel falls back to /dev/fuse.
  void StartUring(size_t payload, const UringQueues::Memory* adopt = nullptr);
  void StartInvalidator();
  void StopInvalidator();
  // fuse/mount_replace.cc
  // Whether an open-free connection could be replaced here (kernel mode with writes, /dev/fuse
  // transport, CAP_SYS_ADMIN, Linux >= 6.5 for MOVE_MOUNT_BENEATH): only then may one go open-free.
  bool CanReplaceConnection(const Config& cfg) const;
  // Puts a fresh connection (answering OPEN) at the mount point under the current one, detaches
  // the current one and lets it drain (fuse/fs_state.h, Connection). Called from a request's
  // thread (SuperblockMode::NoteWritable); refused while a hand-over or a stop is under way.
  Status ReplaceConnection();
  Status ReplaceConnectionLocked() REQUIRES(stop_mu_);
  // A new libfuse session over `conn` (the mount's operations).
  fuse_session* NewSession(Connection* conn);
  // Ends the draining connections (the mount stops for good, or was handed over): their users get
  // ENOTCONN; joins their loops.
  void EndDraining();
  // A session's loop thread: serves until the loop ends, then lets a draining connection go
  // (LoopEnded) or, for the current one gone from outside, stops the process.
  void RunLoop(fuse_session* se, fuse_loop_config* cfg);
  // A draining connection's loop ended: let it go (true); false when `se` is not a draining one.
  bool LoopEnded(fuse_session* se);
  std::string address() const override { return mountpoint_; }
  // Read by other threads (DaemonMain's ready file) while a hand-over may stop the endpoint.
  std::string metrics_address() const override {
    MutexLock lock(&metrics_mu_);
    return metrics_address_;
  }

  // fuse/mount_metrics.cc
  void StartMetrics();
  static void RemoveDeadTraceSockets(const std::string& mountpoint);
  void StopMetrics();
  void WriteEndpoints();
  void RemoveEndpoints();
  void Render(metrics::Exposition* e);
  Status Ready();

  // fuse/mount_handover.cc
  rpc::FuseConnectionState Snapshot(bool with_handles);
  void ApplyState(const rpc::FuseConnectionState& st);
  void RespondLoop();
  void HandOver(int c, const rpc::HandoverMessage& m);

 private:
  std::string mountpoint_;
  std::string endpoints_file_;
  std::string handover_path_, keeper_path_;
  int listen_fd_ = -1;
  std::thread responder_;
  std::atomic<bool> handing_over_{false};
  std::atomic<bool> handed_over_{false};
  std::unique_ptr<Fs> fs_;
  // The current connection (fs_->current): its session's userdata.
  std::unique_ptr<Connection> conn_;
  std::unique_ptr<SessionIo> io_;
  // fuse.transport uring, once INIT asked for it (or a predecessor did). Set from a libfuse thread
  // (the INIT reply's hook) while others read it: only through uring() and std::atomic_store.
  std::shared_ptr<UringQueues> uring_;
  std::shared_ptr<UringQueues> uring() const { return std::atomic_load(&uring_); }
  fuse_session* se_ = nullptr;
  fuse_loop_config* loop_cfg_ = nullptr;
  bool mounted_ = false;
  std::thread loop_;
  std::atomic<bool> loop_done_{false};
  std::atomic<bool> stopping_{false};
  Mutex stop_mu_;
  // The endpoint and the trace socket: set by Init (before the hand-over responder starts) and
  // then only on the responder's thread (StopMetrics, and StartMetrics when a hand-over failed).
  std::unique_ptr<metrics::MetricsServer> metrics_;
  mutable Mutex metrics_mu_;
  std::string metrics_address_ GUARDED_BY(metrics_mu_);
  std::unique_ptr<StreamSocket> trace_;  // the access trace, for root and this user only

  // A draining connection as the keeper and a successor get it (its key as the mount point).
  rpc::FuseConnectionState DrainingState(const Draining& d) const;
  // A predecessor's draining connection (a hand-over's DRAINING message, or the keeper's copy).
  void AdoptDraining(const rpc::FuseConnectionState& st, int fd, bool from_keeper);
  // The predecessor's (hand-over: `got`'s) or the keeper's (after a crash) draining connections.
  void AdoptAllDraining(HandoverReceived* got, bool from_keeper);
  // Deposits a draining connection with the keeper under d->key (and notes the key for the
  // current connection's deposit).
  void DepositDraining(Draining* d);
  // A hand-over: the draining connections to send (marked handed), given back if it fails
  // (KeepDraining); HandOverDraining stops serving each and sends it to the successor on `c`.
  std::vector<Draining*> TakeDrainingForHandOver();
  void KeepDraining(const std::vector<Draining*>& drains);
  void HandOverDraining(int c, const std::vector<Draining*>& drains);
  Mutex replace_mu_;  // one replacement at a time; draining_
  std::vector<std::unique_ptr<Draining>> draining_ GUARDED_BY(replace_mu_);
  std::atomic<fuse_session*> current_se_{nullptr};  // se_, for loop threads that end
  // The current connection's minor device number (/sys/fs/fuse/connections/N; 0: not known):
  // recorded when it was mounted, told by the predecessor, or read from a new connection's mount.
  std::atomic<unsigned> conn_minor_{0};
  std::atomic<uint64_t> replaced_{0};  // connections replaced (metrics)
  std::atomic<int> draining_live_{0};  // draining connections not ended yet (metrics)
  uint64_t replaced_seq_ GUARDED_BY(replace_mu_) = 0;  // numbers the keys of replaced connections
  // The keys of the draining connections not ended, for the current connection's deposit (a
  // successor after a crash withdraws them). Its own lock: Snapshot runs on the keeper link's thread.
  mutable Mutex keys_mu_;
  std::vector<std::string> draining_keys_ GUARDED_BY(keys_mu_);
};

}  // namespace granary::fuse::internal
