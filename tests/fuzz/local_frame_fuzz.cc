// Fuzzes the worker's local socket as a client could drive it: any bytes arrive on a connected
// AF_UNIX stream socket and are cut into frames (rpc/local_wire.h RecvFrame, with the worker's
// request limit); every LocalRequest.write that parses is handled by a real WriteSessions over a
// fresh staging directory (worker/writes.h), whose mounts all fail to resolve, and the connection
// then closes. No crash, no hang, no leak, and nothing left open: the staging directory ends empty
// of unsealed files.
#include <dirent.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <string>

#include "rpc/local_wire.h"
#include "worker/writes.h"

using namespace granary;

namespace {

class NoMounts : public worker::MountResolver {
 public:
  StatusOr<worker::MountHandle> GetMount(uint64_t id) override {
    return NotFoundError("mount " + std::to_string(id) + " (the fuzzer has none)");
  }
};

std::string FreshDir() {
  static int n = 0;
  std::string d = std::filesystem::temp_directory_path().string() + "/granary-fuzz-frames-" +
                  std::to_string(getpid()) + "-" + std::to_string(n++);
  std::filesystem::remove_all(d);
  return d;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size > 64 * 1024) return 0;  // the socket buffer holds the whole input: no writer thread needed
  int sv[2];
  if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0) std::abort();
  int buf = 256 * 1024;
  setsockopt(sv[1], SOL_SOCKET, SO_SNDBUF, &buf, sizeof buf);
  setsockopt(sv[0], SOL_SOCKET, SO_RCVBUF, &buf, sizeof buf);
  size_t off = 0;
  while (off < size) {
    ssize_t n = send(sv[1], data + off, size - off, MSG_NOSIGNAL);
    if (n <= 0) break;
    off += static_cast<size_t>(n);
  }
  shutdown(sv[1], SHUT_WR);

  static NoMounts mounts;
  const std::string dir = FreshDir();
  auto sessions = worker::WriteSessions::Open(dir, &mounts, [](const rpc::CommitWriteRequest&) { return Status::OK(); });
  if (!sessions.ok()) std::abort();
  const uint64_t conn = 1;
  for (int frames = 0; frames < 64; ++frames) {
    rpc::LocalRequest req;
    int fd = -1;
    Status got = RecvFrame(sv[0], &req, &fd, kMaxLocalRequest);
    if (fd >= 0) close(fd);
    if (!got.ok()) break;
    if (!req.has_write()) continue;
    rpc::WriteCall call = req.write();
    call.set_wait_upload(false);  // an fsync waits for its upload by design (up to a minute)
    rpc::LocalResponse resp;
    int staged = -1;
    (void)(*sessions)->Handle(conn, call, &resp, &staged);
    if (staged >= 0) close(staged);
  }
  (*sessions)->ConnectionClosed(conn);
  // Every session the connection did not seal is gone with it.
  if ((*sessions)->backlog().open_sessions != 0) std::abort();
  sessions->reset();
  close(sv[0]);
  close(sv[1]);
  std::filesystem::remove_all(dir);

  // The same bytes as granary-fuse reads the worker's answers (RecvFrameInto): bytes land in the
  // caller's buffer only when they fit it exactly, and a landed frame never also carries them.
  if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0) std::abort();
  setsockopt(sv[1], SOL_SOCKET, SO_SNDBUF, &buf, sizeof buf);
  setsockopt(sv[0], SOL_SOCKET, SO_RCVBUF, &buf, sizeof buf);
  for (off = 0; off < size;) {
    ssize_t n = send(sv[1], data + off, size - off, MSG_NOSIGNAL);
    if (n <= 0) break;
    off += static_cast<size_t>(n);
  }
  shutdown(sv[1], SHUT_WR);
  const size_t want = size > 0 ? data[0] * 7 : 0;  // varies with the input, up to 1785 bytes
  std::string into(want + 1, '\x5a');
  for (int frames = 0; frames < 64; ++frames) {
    rpc::LocalResponse resp;
    int fd = -1;
    bool landed = false;
    Status got = RecvFrameInto(sv[0], &resp, &fd, rpc::LocalResponse::kDataFieldNumber, into.data(), want, &landed);
    if (fd >= 0) close(fd);
    if (!got.ok()) break;
    if (landed && !resp.data().empty()) std::abort();
    if (into[want] != '\x5a') std::abort();  // nothing past the caller's buffer
  }
  close(sv[0]);
  close(sv[1]);
  return 0;
}
