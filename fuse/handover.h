// Hand-over of a live FUSE connection between granary-fuse processes, and the keeper that holds it
// across a crash.
//
// Design
// ------
// The kernel keeps a FUSE connection (and so the mount, and every reader's open files and mmaps)
// alive while some process holds its /dev/fuse descriptor. Requests wait in the kernel's queue
// while nobody reads them. So a successor that gets the descriptor (SCM_RIGHTS over a Unix socket)
// can go on serving the same mount:
//
//   upgrade   The successor connects to the serving process's hand-over socket
//             (fuse.handover_socket) and sends TAKEOVER. The serving process checks that the
//             successor can serve this connection (Fingerprint, kHandoverFormat; else REFUSED and it
//             goes on serving), stops reading /dev/fuse, lets the requests it has read be answered
//             (SessionIo::Drain), and sends STATE: the descriptor, the kernel's INIT request, the
//             read mode, the open file handles and the passthrough backing ids (which belong to the
//             connection); then a WRITE_FILE message for each file open for writing (its staging
//             file and its write session's connection to the worker attached: the session lives
//             on, and its writers go on writing into their own file, fuse/writes.h). It then exits
//             without unmounting. No request is lost, and no write.
//   crash     A keeper holds a duplicate of the descriptor and the connection's state (DEPOSIT,
//             then BACKING_PUT / BACKING_DROP as backing ids change, HANDLE_PUT / HANDLE_DROP as
//             passthrough mode's daemon-served opens come and go). When the serving process dies
//             the connection lives on in the keeper; the next granary-fuse finds no one on the
//             hand-over socket, asks the keeper (WITHDRAW) and gets STATE from it. Requests the dead
//             process had read but not answered are re-sent by the kernel when told to
//             (FUSE_NOTIFY_RESEND, Linux >= 6.9); open file handles are rebuilt from the inode.
//   io_uring  A connection served through io_uring also carries its entries' memory (a memfd, sent
//             beside the descriptor in STATE and DEPOSIT): the successor answers what the
//             predecessor's entries hold (fuse/uring.h).
//
// A successor's libfuse session has never seen INIT, and the kernel sends INIT only once: the
// successor replays the saved INIT request through its own /dev/fuse I/O and swallows the reply
// (fuse/session_io.h).
//
// Where the keeper lives (fuse.keeper): `spawn` starts it as a small process of its own, detached
// from granary-fuse (`granary-fuse --keeper PATH`), one per mount, which exits when the connection
// ends; in Kubernetes it is a sidecar container of the FUSE pod, which a crash of the FUSE container
// does not take down (docs/architecture.md says why not the worker).
//
// The wire format: a little-endian u32 length, then a serialized rpc::HandoverMessage; a message
// that carries the descriptor sends it as SCM_RIGHTS with its first byte. Only local sockets (0600
// in a 0700 directory); nothing here touches the network.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <optional>
#include <string>
#include <vector>
#include <thread>

#include "common/config.h"
#include "common/status.h"
#include "common/thread_annotations.h"
#include "proto/granary.pb.h"

namespace granary::fuse {

// Bumped when FuseConnectionState changes meaning; a successor of another format is refused.
// (STATE followed by WRITE_FILE messages is format 1 still: a successor that predates them ignores
// state.write_files and the messages, and those writers get EIO, as before them.)
inline constexpr uint32_t kHandoverFormat = 1;

// The settings a successor must share with the process it takes over from: the mount, what it
// shows, and the read mode the kernel was told about.
std::string Fingerprint(const Config& cfg);

// fuse.handover_socket, or its default for `mountpoint`.
StatusOr<std::string> HandoverSocketPath(const Config& cfg);
// The keeper's socket: fuse.keeper when it is a path, <handover socket>.keeper for `spawn`, "" off.
StatusOr<std::string> KeeperSocketPath(const Config& cfg);
// INVALID_ARGUMENT unless fuse.keeper is spawn, off or an absolute path.
Status CheckKeeperSetting(const Config& cfg);

struct HandoverReceived {
  rpc::HandoverMessage msg;
  int fd = -1;  // the descriptor that came with it, owned by the receiver (-1: none)
  // The memory of the connection's io_uring entries (a memfd; state.uring_memory_base says where
  // the sender mapped it), when it came along; owned by the receiver (-1: none).
  int ring_fd = -1;
  // A hand-over of a connection served through io_uring: the socket to the predecessor, kept open
  // for RINGS_READY (fuse/uring.h), owned by the receiver (-1: none).
  int peer = -1;
  // A hand-over's files open for writing (WRITE_FILE messages after STATE): each with its staging
  // file and its write session's connection (-1: none), owned by the receiver.
  struct WriteFile {
    rpc::FuseWriteFile file;
    int fd = -1, conn = -1;
  };
  std::vector<WriteFile> write_files;
  // A hand-over's replaced connections still draining (DRAINING messages after the WRITE_FILEs;
  // fuse/mount_replace.cc): each with its descriptor (-1: none), owned by the receiver.
  struct DrainingConnection {
    rpc::FuseConnectionState state;
    int fd = -1;
  };
  std::vector<DrainingConnection> draining;
  void CloseAll();  // closes what it owns
};

// Framing on a connected Unix stream socket. Send passes `fd` along when >= 0, and `fd2` beside it
// when that is >= 0 too (the receiver's ring_fd).
Status SendHandover(int sock, const rpc::HandoverMessage& m, int fd = -1, int fd2 = -1);
// DEADLINE_EXCEEDED past `timeout`; UNAVAILABLE when the peer closed.
StatusOr<HandoverReceived> ReceiveHandover(int sock, std::chrono::milliseconds timeout);

// A connected socket to `path`; UNAVAILABLE when nobody listens there.
StatusOr<int> ConnectLocal(const std::string& path);
// A listening socket at `path` (its directory made 0700, the socket 0600); a stale socket file
// nobody answers on is replaced. ALREADY_EXISTS when someone listens there.
StatusOr<int> ListenLocal(const std::string& path);

// Successor side of an upgrade: asks whoever serves `socket_path` for the connection. nullopt when
// nobody listens there; FAILED_PRECONDITION (with the server's reason) when refused.
StatusOr<std::optional<HandoverReceived>> RequestTakeover(const std::string& socket_path, const std::string& fingerprint,
                                                          std::chrono::milliseconds timeout);
// Tells the keeper at `keeper_path` to let go of what it holds for `mountpoint` (nothing when no
// keeper answers).
void ReleaseFromKeeper(const std::string& keeper_path, const std::string& mountpoint);
// Successor side of a crash: the connection the keeper at `keeper_path` holds for `mountpoint`.
// nullopt when there is no keeper or it holds nothing for that mount.
StatusOr<std::optional<HandoverReceived>> WithdrawFromKeeper(const std::string& keeper_path,
                                                             const std::string& mountpoint);

// granary-fuse's link to its keeper: deposits the connection, tells it about backing ids, and
// deposits again whenever the keeper comes back (a restarted sidecar). With `spawn`, starts the
// keeper process when none answers.
//
// What the keeper holds must never name a backing id the kernel no longer has: a successor after a
// crash would answer opens with it, and the kernel fails such an open with EIO, every time. So a
// change reaches the keeper's socket before the kernel sees it: PutBacking before the open reply
// that uses the id, DropBacking before the id is closed. Both write to the socket from the
// caller's thread (one small message; the keeper reads at once). While no keeper is connected they
// are kept and replayed after the next deposit, and ids to close wait until then (`close_backing`
// closes them from the link's thread).
class KeeperLink {
 public:
  // `snapshot` gives the state to deposit (called with no lock of the link's held); `fd` is the
  // connection. With `deposit_now`, the first deposit is made before the constructor returns (a
  // connection taken over: the keeper must hold this process's state before it serves, or a crash
  // right after would hand a successor the predecessor's); else from the link's thread.
  KeeperLink(std::string path, bool spawn, int fd, std::function<rpc::FuseConnectionState()> snapshot,
             std::function<void(int)> close_backing, bool deposit_now = false);
  ~KeeperLink();  // Stop()
  // Stops talking to the keeper; the keeper keeps what it holds (the successor's deposit
  // replaces it). Call once, from one thread.
  void Stop();
  KeeperLink(const KeeperLink&) = delete;
  KeeperLink& operator=(const KeeperLink&) = delete;

  // Call in the same order as the changes they describe (the mount makes both under one lock).
  void PutBacking(const rpc::FuseBacking& b);
  // True: the keeper has been told, close `backing_id` now. False: the link closes it once a
  // keeper holds a state without it.
  bool DropBacking(uint64_t kino, int backing_id);
  // Passthrough mode: a daemon-served open (no backing id) puts its inode in the kernel's cached io
  // mode until released, and the kernel then fails any passthrough open of that inode. A
  // successor after a crash must know such opens to answer the inode's opens without a backing id
  // meanwhile: PutHandle before the open reply, DropHandle when its RELEASE comes.
  void PutHandle(const rpc::FuseHandle& h);
  void DropHandle(uint64_t fh);
  // The memory of the connection's io_uring entries (fuse/uring.h), deposited beside the
  // descriptor from now on: a deposit is made again at once. The caller keeps `fd` open.
  void SetRingMemory(int fd);
  // The mount's connection is now `fd` (an open-free one replaced: fuse/mount_replace.cc): a
  // deposit of it, with a fresh snapshot, is made again at once. The caller keeps `fd` open.
  void SetConnection(int fd);
  // Waits until a keeper holds the connection (deposited), at most `timeout`; whether it does.
  bool WaitDeposited(std::chrono::milliseconds timeout);
  // The mount is gone for good: the keeper lets the connection go.
  void Release(const std::string& mountpoint);
  // Whether a keeper holds the connection now.
  bool deposited() const;

 private:
  void Loop();
  // Connects (spawning the keeper when allowed) and deposits `snap`: the socket, or -1.
  int Connect(const rpc::FuseConnectionState& snap);
  // Under mu_: writes `m` to the keeper, or keeps it for the next deposit.
  void SendLocked(rpc::HandoverMessage m) REQUIRES(mu_);
  // SendLocked under mu_, unless stopped.
  void Send(rpc::HandoverMessage m);
  void DisconnectLocked() REQUIRES(mu_);

  const std::string path_;
  const bool spawn_;
  std::atomic<int> fd_;
  std::atomic<int> ring_fd_{-1};
  uint64_t ring_changes_ GUARDED_BY(mu_) = 0;  // SetRingMemory and SetConnection calls: a deposit begun before one is made again
  const std::function<rpc::FuseConnectionState()> snapshot_;
  const std::function<void(int)> close_backing_;
  mutable Mutex mu_;
  std::condition_variable cv_;
  std::deque<rpc::HandoverMessage> pending_ GUARDED_BY(mu_);  // changes since the snapshot being deposited
  std::vector<int> to_close_ GUARDED_BY(mu_);  // backing ids whose drop the keeper has not heard
  bool stop_ GUARDED_BY(mu_) = false;
  int sock_ GUARDED_BY(mu_) = -1;  // connected and deposited when >= 0
  std::chrono::steady_clock::time_point last_spawn_{};  // only the link's thread uses it
  std::thread thread_;
};

// Starts a detached keeper process (`granary-fuse --keeper PATH --exit-when-empty`, its log at
// PATH.log, its pid in PATH.pid) and waits until it listens.
Status SpawnKeeper(const std::string& path);

// The keeper's main: serves `path` until SIGTERM/SIGINT, or, with `exit_when_empty`, until it holds
// no connection and no one is connected (after having held one, or 60 s after start). Returns the
// process's exit code.
int RunKeeper(const std::string& path, bool exit_when_empty);

}  // namespace granary::fuse
