#include "common/unix_server.h"

#include <spdlog/spdlog.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <system_error>
#include <thread>

#include "common/net.h"

namespace granary {

StatusOr<std::unique_ptr<UnixServer>> UnixServer::Start(const std::string& path, Options options, Serve serve) {
  ASSIGN_OR_RETURN(int fd, ListenUnix(path, options.backlog, options.what));
  std::unique_ptr<UnixServer> s(new UnixServer(path, fd, std::move(options), std::move(serve)));
  struct stat st {};
  if (lstat(path.c_str(), &st) == 0) s->inode_ = st.st_ino;
  s->acceptor_ = std::thread([p = s.get()] { p->AcceptLoop(); });
  return s;
}

UnixServer::~UnixServer() { Stop(); }

void UnixServer::Stop() {
  if (stop_.exchange(true)) return;
  shutdown(listen_fd_, SHUT_RDWR);
  if (acceptor_.joinable()) acceptor_.join();
  close(listen_fd_);
  {
    MutexLock lock(&mu_);
    for (int c : conns_) shutdown(c, SHUT_RDWR);
    while (!conns_.empty()) lock.Wait(&idle_);
  }
  // Only its own file: a successor with the same name (the next pod's daemon) may have replaced it.
  struct stat st {};
  if (lstat(path_.c_str(), &st) == 0 && st.st_ino == inode_) unlink(path_.c_str());
}

void UnixServer::AcceptLoop() {
  while (!stop_) {
    AcceptedPeer a = AcceptPeer(listen_fd_, options_.any_peer);
    if (a.refused) {
      spdlog::warn("{}: refusing a process of uid {} (only root or uid {} may connect)", options_.what, a.uid,
                   geteuid());
      continue;
    }
    if (a.fd < 0) {
      if (stop_) return;
      spdlog::warn("{}: accept: {}", options_.what, strerror(a.error));
      if (a.error == EMFILE || a.error == ENFILE || a.error == ENOBUFS || a.error == ENOMEM) {
        // Out of descriptors or memory (a flood of connections): the socket must outlive it.
        // Stop() sets stop_ before it shuts the socket down, so this ends within the pause.
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
        continue;
      }
      return;
    }
    bool full = false;
    {
      MutexLock lock(&mu_);
      if (stop_) {
        close(a.fd);
        return;
      }
      full = options_.max_connections != 0 && conns_.size() >= options_.max_connections;
      if (!full) {
        conns_.insert(a.fd);
        try {
          std::thread([this, c = a.fd] { Run(c); }).detach();  // Stop() waits for conns_ to empty
        } catch (const std::system_error& e) {
          // No thread to be had (a flood of connections): this one is turned away, not the process.
          conns_.erase(a.fd);
          spdlog::warn("{}: no thread for a connection ({}): closed", options_.what, e.what());
          close(a.fd);
          continue;
        }
      }
    }
    if (full) {
      if (options_.on_full) options_.on_full(a.fd);  // outside the lock: it writes to the client
      close(a.fd);
    }
  }
}

void UnixServer::Run(int conn) {
  serve_(conn);
  MutexLock lock(&mu_);
  conns_.erase(conn);
  close(conn);
  idle_.notify_all();  // under the lock: Stop() cannot return (and free this) before it is done
}

}  // namespace granary
