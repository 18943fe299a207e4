#include "worker/local_server.h"

#include <dirent.h>

#include <errno.h>
#include <spdlog/spdlog.h>
#include <string.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <unordered_map>

#include "common/bad_request.h"
#include "common/net.h"
#include "proto/granary.pb.h"
#include "rpc/local_wire.h"
#include "worker/meta_proxy.h"
#include "worker/writes.h"

namespace granary::worker {

namespace {

// Sockets of workers killed with -9 (a worker on another port: the auto path is per port) stay
// behind in the directory; whichever starts next removes those that no longer answer.
void RemoveDeadSockets(const std::string& path) {
  const size_t slash = path.rfind('/');
  if (slash == std::string::npos) return;
  const std::string dir = path.substr(0, slash);
  DIR* d = opendir(dir.c_str());
  if (d == nullptr) return;
  while (dirent* e = readdir(d)) {
    const std::string name = e->d_name;
    if (name.rfind("worker-", 0) != 0 || name.size() < 5 || name.compare(name.size() - 5, 5, ".sock") != 0) continue;
    const std::string p = dir + "/" + name;
    struct stat st;
    if (p == path || lstat(p.c_str(), &st) != 0 || !S_ISSOCK(st.st_mode)) continue;
    auto probe = ConnectUnix(p);
    if (probe.ok()) {
      close(*probe);
    } else if (probe.status().message().find("refused") != std::string::npos) {
      unlink(p.c_str());  // nobody listens: its worker is gone
    }
  }
  closedir(d);
}

}  // namespace

LocalServer::StreamPipe::~StreamPipe() {
  if (fd >= 0) close(fd);
}

Status LocalServer::StreamPipe::Adopt(int pipe_fd) {
  if (pipe_fd < 0) return InvalidArgumentError("stream_pipe came without a pipe");
  struct stat st;
  const int size = fcntl(pipe_fd, F_GETPIPE_SZ);
  const int fl = fcntl(pipe_fd, F_GETFL);
  if (fstat(pipe_fd, &st) != 0 || !S_ISFIFO(st.st_mode) || size <= 0 || fl < 0 || (fl & O_ACCMODE) != O_WRONLY) {
    close(pipe_fd);
    return InvalidArgumentError("stream_pipe: the descriptor is not the write end of a pipe");
  }
  if (fd >= 0) close(fd);
  fd = pipe_fd;
  capacity = static_cast<size_t>(size);
  return Status::OK();
}

bool LocalServer::StreamPipe::Empty() const {
  int queued = 0;
  return fd >= 0 && ioctl(fd, FIONREAD, &queued) == 0 && queued == 0;
}

LocalServer::StreamPipe::Put LocalServer::StreamPipe::TryPut(const SharedBytes& b) {
  // Room for the range's pages, one pipe slot each, when it starts and ends inside a page.
  if (fd < 0 || b.bytes.size() < kMinBytes || b.bytes.size() + 2 * 4096 > capacity) return Put::kInline;
  if (!Empty()) return Put::kInline;  // not drained
  iovec iov{const_cast<char*>(b.bytes.data()), b.bytes.size()};
  while (iov.iov_len > 0) {
    // The range fits in the empty pipe: this does not wait for the client.
    ssize_t n = vmsplice(fd, &iov, 1, SPLICE_F_NONBLOCK);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      if (iov.iov_len == b.bytes.size()) return Put::kInline;  // nothing went in
      held = b;  // part of it did, and the rest cannot follow: the connection is over
      return Put::kBroken;
    }
    iov.iov_base = static_cast<char*>(iov.iov_base) + n;
    iov.iov_len -= static_cast<size_t>(n);
  }
  held = b;
  return Put::kPiped;
}

StatusOr<std::unique_ptr<LocalServer>> LocalServer::Start(const std::string& path, BlockSource* source,
                                                          WriteSessions* writes, MetaProxy* meta, bool group_readers) {
  RemoveDeadSockets(path);
  struct stat st;
  if (lstat(path.c_str(), &st) == 0) {
    if (!S_ISSOCK(st.st_mode)) return InvalidArgumentError("worker.local_socket: " + path + " exists and is not a socket");
    // A socket left by a worker that died; a live one would still answer.
    auto probe = ConnectUnix(path);
    if (probe.ok()) {
      close(*probe);
      return AlreadyExistsError("worker.local_socket: another worker is listening on " + path);
    }
    unlink(path.c_str());
  }
  std::unique_ptr<LocalServer> s(new LocalServer(path, source, writes, meta));
  UnixServer::Options o;
  o.what = "worker.local_socket";
  o.any_peer = group_readers;
  o.max_connections = kMaxConnections;
  ASSIGN_OR_RETURN(s->server_, UnixServer::Start(path, std::move(o), [p = s.get()](int c) { p->Serve(c); }));
  return s;
}

LocalServer::~LocalServer() { Stop(); }

void LocalServer::Stop() {
  if (server_) server_->Stop();
}

void LocalServer::Serve(int conn) {
  std::unordered_map<uint64_t, BlockLease> leases;  // held by this connection; they end with it
  uint64_t next_lease = 1;
  const uint64_t conn_id = next_conn_++;
  bool wrote = false;  // began a write session: its unsealed ones are dropped when this ends
  StreamPipe pipe;     // the client's pipe for bytes of fetch buffers (LocalRequest.stream_pipe)
  // Root or this user: everything; anyone else (worker.local_socket_group) reads with grants.
  const LocalPeer peer = LocalPeer::Of(conn);
  if (!peer.trusted) {
    // A reader's connections are counted by user: one user cannot take the socket's threads.
    bool full = false;
    {
      MutexLock lock(&readers_mu_);
      full = reader_conns_[peer.uid] >= kMaxReaderConnections;
      if (!full) ++reader_conns_[peer.uid];
    }
    if (full) {
      rpc::LocalResponse refused;
      rpc::SetStatus(ResourceExhaustedError("user " + std::to_string(peer.uid) + " has " +
                                            std::to_string(kMaxReaderConnections) +
                                            " connections to the worker's local socket already"),
                     &refused);
      SendFrame(conn, refused).IgnoreError();
      return;
    }
  }
  struct ReaderCount {
    LocalServer* s;
    const LocalPeer& p;
    ~ReaderCount() {
      if (p.trusted) return;
      MutexLock lock(&s->readers_mu_);
      if (--s->reader_conns_[p.uid] == 0) s->reader_conns_.erase(p.uid);
    }
  } reader_count{this, peer};
  // A vmsplice into a pipe whose reader is gone raises SIGPIPE at this thread: blocked here, it
  // stays pending and harmless, whatever the process does with the signal (daemons ignore it;
  // a test or a tool embedding this server may not).
  sigset_t sigpipe;
  sigemptyset(&sigpipe);
  sigaddset(&sigpipe, SIGPIPE);
  pthread_sigmask(SIG_BLOCK, &sigpipe, nullptr);
  for (;;) {
    // A buffer whose bytes went into the pipe is held until they are out of it: at the client's
    // next frame (it drains the pipe first), or when the pipe is seen empty on a connection gone
    // idle — not for as long as the connection idles (a block may be 256 MiB).
    while (pipe.held.keep) {
      pollfd pfd{conn, POLLIN, 0};
      if (poll(&pfd, 1, StreamPipe::kHeldCheckMs) != 0) break;  // a frame (or an error) to read
      if (pipe.Empty()) pipe.held = SharedBytes{};
    }
    rpc::LocalRequest req;
    int stray = -1;
    Status got = RecvFrame(conn, &req, &stray, kMaxLocalRequest);
    // The client drained the pipe before this frame: the buffer its last bytes were in is let go.
    pipe.held = SharedBytes{};
    if (got.ok() && req.stream_pipe()) {
      rpc::LocalResponse resp;
      if (!peer.trusted) {
        // A fetch buffer's pages stay in the pipe until the client reads them, and the buffer
        // is let go at its next frame: a client that does not drain first would keep pages the
        // pool gives to another file's fetch. Readers get their bytes inline.
        if (stray >= 0) close(stray);
        rpc::SetStatus(PermissionDeniedError("a reader in worker.local_socket_group gets bytes inline"), &resp);
      } else {
        rpc::SetStatus(pipe.Adopt(stray), &resp);  // takes the descriptor, or closes it
      }
      if (!SendFrame(conn, resp).ok()) break;
      continue;
    }
    if (stray >= 0) close(stray);  // no other request comes with a descriptor
    if (got.code() == Code::kInvalidArgument) {
      // Too long, or not a request: answered, counted, and the connection closed (after a frame
      // refused unread, the stream has no next frame to find).
      NoteBadRequest("worker's local socket", got);
      rpc::LocalResponse refused;
      refused.set_code(static_cast<int32_t>(got.code()));
      refused.set_message(got.message());
      SendFrame(conn, refused).IgnoreError();
      break;
    }
    if (!got.ok()) break;
    if (req.release() != 0) {
      leases.erase(req.release());  // ends the lease; an unknown or repeated number does nothing
      continue;
    }
    if (req.has_meta()) {
      rpc::LocalResponse resp;
      Status st = meta_ != nullptr ? meta_->Handle(peer, req.meta(), resp.mutable_meta())
                                   : UnimplementedError("this worker answers no metadata calls");
      if (st.code() == Code::kInvalidArgument) NoteBadRequest("worker's local socket", st);
      rpc::SetStatus(st, &resp);
      if (!SendFrame(conn, resp).ok()) break;
      continue;
    }
    if (req.has_write()) {
      rpc::LocalResponse resp;
      int fd = -1;
      Status st = !peer.trusted ? PermissionDeniedError("a reader in worker.local_socket_group may not write")
                  : writes_ != nullptr ? writes_->Handle(conn_id, req.write(), &resp, &fd)
                                       : ReadOnlyError("this worker takes no writes (no worker.staging_dir)");
      wrote = true;
      if (st.code() == Code::kInvalidArgument) NoteBadRequest("worker's local socket", st);
      rpc::SetStatus(st, &resp);
      Status sent = SendFrame(conn, resp, fd);
      if (fd >= 0) close(fd);
      if (!sent.ok()) break;
      continue;
    }
    const rpc::ReadBlockRequest& r = req.read();
    BlockRequest br{r.mount_id(), r.ufs_path(), r.version(), r.file_size(), r.block_size(),
                    r.index(),    r.offset(),   r.length(),  false};
    br.random = r.random();
    br.continues = r.continues();
    std::string data;
    SharedBytes shared;  // or the bytes are a view of a fetch's buffer, sent from there
    BlockLease lease;
    bool hit = false;
    ReadSource source = ReadSource::kCache;
    auto start = std::chrono::steady_clock::now();
    Status st;
    if (!peer.trusted) {
      // A reader names the file by its under-storage identity: only one its grant covers.
      st = meta_ != nullptr ? meta_->CheckRead(peer, r, req.read_grant())
                            : PermissionDeniedError("this worker serves readers no files");
      req.set_want_source(false);  // never an under-storage file's descriptor
    }
    if (!st.ok()) {
    } else if (req.whole_file()) {
      auto l = source_->LeaseFile(br, &hit, &source, req.verify());
      st = l.status();
      if (l.ok()) lease = std::move(*l);
    } else {
      st = source_->ReadOrLease(br, &data, &lease, &hit, &source, &shared);
    }
    read_latency_.Observe(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
    if (st.code() == Code::kInvalidArgument) NoteBadRequest("worker's local socket", st);
    rpc::LocalResponse resp;
    rpc::SetStatus(st, &resp);
    resp.set_source(rpc::ToWire(source));
    int fd = -1;
    int source_fd = -1;  // the under-storage's file (want_source), closed once sent
    bool inline_bytes = false;
    std::string_view bytes = data;
    if (st.ok() && lease.fd >= 0) {
      uint64_t n = next_lease++;
      resp.set_lease(n);
      resp.set_data_offset(lease.data_offset);
      resp.set_length(lease.length);
      fd = lease.fd;
    } else if (st.ok()) {
      if (shared.keep) bytes = shared.bytes;
      resp.set_length(bytes.size());  // the bytes go last, straight from where they are (SendFrameWithBytes)
      inline_bytes = !bytes.empty();
      // Read from the under-storage and not kept: granary-fuse may read the file's uncached
      // ranges itself from now on (fuse/source_reads.h). Where the file is not one of this
      // machine, nothing comes.
      if (req.want_source() && source == ReadSource::kUnderStorage) {
        StatusOr<LocalFile> f = source_->OpenSource(br);
        if (f.ok()) {
          source_fd = fd = f->fd;
          resp.set_source_file(true);
          resp.set_source_size(f->size);
          resp.set_source_mtime_ns(f->mtime_ns);
          resp.set_source_ino(f->ino);
          // Which blocks are cached here: granary-fuse asks for those rather than read the source.
          resp.set_source_cached(source_->CachedBlocks(br, kSourceCachedBlocks));
        } else if (f.status().code() != Code::kUnimplemented) {
          // granary-fuse asks again later (SourceReads::kAskAgain); the read itself was answered.
          spdlog::debug("no source file for granary-fuse: {}", f.status().ToString());
        }
      }
    }
    if (inline_bytes && fd < 0 && shared.keep) {
      const StreamPipe::Put put = pipe.TryPut(shared);
      if (put == StreamPipe::Put::kBroken) break;
      if (put == StreamPipe::Put::kPiped) {
        resp.set_in_pipe(true);  // the bytes are in the pipe; the buffer is held until the next frame
        inline_bytes = false;
      }
    }
    Status sent = inline_bytes ? SendFrameWithBytes(conn, resp, rpc::LocalResponse::kDataFieldNumber, bytes, fd)
                               : SendFrame(conn, resp, fd);
    if (source_fd >= 0) {
      close(source_fd);
    } else if (fd >= 0) {
      lease.CloseFd();  // the client has its own copy now
      leases.emplace(resp.lease(), std::move(lease));
    }
    if (!sent.ok()) break;
  }
  leases.clear();  // the client went away: its leases end
  if (wrote && writes_ != nullptr) writes_->ConnectionClosed(conn_id);  // never acknowledged: dropped
}

}  // namespace granary::worker
