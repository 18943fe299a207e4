// UnixServer: a local (AF_UNIX stream) socket served with a thread per connection — the worker's
// local socket (worker/local_server.h) and the daemons' trace sockets (common/stream_socket.h).
//
// Start listens on `path` (its file 0600 before anyone can connect, ListenUnix; the caller has
// dealt with a stale file there) and accepts on a thread of its own. Every connection is checked
// (AcceptPeer: only root or this process's user; any other is refused before a byte is read, and
// logged) and handed to `serve` on a new thread, which owns it until `serve` returns; then it is
// closed. Past `max_connections` live ones, a connection gets `on_full(fd)` (a last word) and is
// closed. Stop() stops accepting, shuts every live connection down (their reads return 0, so the
// handlers end), waits for every handler to return, and removes the socket file when it is still
// this server's (a successor may have put its own at the same path).
//
// Thread-safe.
#pragma once

#include <atomic>
#include <condition_variable>
#include <functional>
#include <memory>
#include <set>
#include <string>
#include <thread>

#include "common/status.h"
#include "common/thread_annotations.h"

namespace granary {

class UnixServer {
 public:
  struct Options {
    std::string what;             // names the socket in logs and errors ("worker.local_socket")
    int backlog = 128;
    size_t max_connections = 0;   // 0: no limit
    std::function<void(int fd)> on_full;  // a connection past max_connections, before it is closed
    // Accept any process that could connect (the socket file's mode, set by the caller, decides
    // who can; the server tells its peers apart itself), not only root and this process's user.
    bool any_peer = false;
  };
  using Serve = std::function<void(int fd)>;

  static StatusOr<std::unique_ptr<UnixServer>> Start(const std::string& path, Options options, Serve serve);
  ~UnixServer();
  void Stop() EXCLUDES(mu_);
  const std::string& path() const { return path_; }

 private:
  UnixServer(std::string path, int fd, Options options, Serve serve)
      : path_(std::move(path)), listen_fd_(fd), options_(std::move(options)), serve_(std::move(serve)) {}
  void AcceptLoop() EXCLUDES(mu_);
  void Run(int conn) EXCLUDES(mu_);

  const std::string path_;
  const int listen_fd_;
  const Options options_;
  const Serve serve_;
  uint64_t inode_ = 0;  // of the socket file this one made
  std::atomic<bool> stop_{false};
  std::thread acceptor_;
  Mutex mu_;
  std::condition_variable idle_;  // a connection's thread ended
  std::set<int> conns_ GUARDED_BY(mu_);
};

}  // namespace granary
