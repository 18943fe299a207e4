// FuseMountImpl: the FuseMount of fuse/mount.h, one mount's lifecycle. Internal to fuse/.
//
//   fuse/mount.cc           Init (a fresh mount, or a connection taken over from a predecessor or
//                           the keeper), the FUSE loop and the invalidation thread, Shutdown
//   fuse/mount_handover.cc  the hand-over socket and the state a successor gets (Snapshot,
//                           ApplyState, RespondLoop, HandOver)
//   fuse/mount_metrics.cc   /metrics (Render) and /readyz (Ready), the access trace's socket, the
//                           endpoints file
//
// Threads: the owner calls Init once, then Shutdown (from any thread, idempotent). Meanwhile its
// code also runs on the FUSE loop's thread (loop_), the hand-over responder (responder_: HandOver),
// the metrics server's (Render, Ready) and the keeper link's (Snapshot(false)). stop_mu_ keeps a hand-over and a shutdown apart; it
// comes before every lock of Fs (fuse/fs_state.h).
#pragma once

#include <atomic>
#include <memory>
#include <optional>
#include <string>
#include <thread>

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

class FuseMountImpl final : public FuseMount {
 public:
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
};

}  // namespace granary::fuse::internal
