#include "fuse/local_channel.h"

#include <fcntl.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <cerrno>

#include "rpc/local_wire.h"
#include "rpc/wire.h"

namespace granary::fuse {

const char* NodeSourceName(NodeSource s) {
  switch (s) {
    case NodeSource::kLocal: return "local";
    case NodeSource::kPeer: return "peer";
    case NodeSource::kUnderStorage: return "under_storage";
  }
  return "local";
}

LocalChannel::~LocalChannel() {
  for (int c : idle_) close(c);
  for (const auto& [conn, pipe] : pipes_) {
    if (pipe >= 0) close(pipe);
  }
  for (LeaseLine& l : lines_) {
    MutexLock lock(&l.mu);
    if (l.conn >= 0) close(l.conn);
  }
}

StatusOr<int> LocalChannel::Take() {
  {
    MutexLock lock(&mu_);
    if (!idle_.empty()) {
      int c = idle_.back();
      idle_.pop_back();
      return c;
    }
  }
  return Connect();
}

StatusOr<int> LocalChannel::Dial() {
  ASSIGN_OR_RETURN(int conn, ConnectUnix(path_));
  if (io_timeout_.count() > 0) {
    timeval tv{};
    tv.tv_sec = static_cast<time_t>(io_timeout_.count() / 1000);
    tv.tv_usec = static_cast<suseconds_t>((io_timeout_.count() % 1000) * 1000);
    setsockopt(conn, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    setsockopt(conn, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
  }
  return conn;
}

StatusOr<int> LocalChannel::Connect() {
  ASSIGN_OR_RETURN(int conn, Dial());
  int pipe_r = -1;
  int p[2];
  if (pipe2(p, O_CLOEXEC) == 0) {
    // Below kPipeBytes (fs.pipe-max-size for an unprivileged process), the worker pipes less.
    if (fcntl(p[1], F_SETPIPE_SZ, kPipeBytes) < 0) fcntl(p[1], F_SETPIPE_SZ, 1 << 20);
    rpc::LocalRequest lr;
    lr.set_stream_pipe(true);
    Status st = SendFrame(conn, lr, p[1]);
    close(p[1]);
    rpc::LocalResponse resp;
    int stray = -1;
    if (st.ok()) st = RecvFrame(conn, &resp, &stray);
    if (stray >= 0) close(stray);
    if (!st.ok()) {
      close(p[0]);
      close(conn);
      return st;
    }
    if (rpc::StatusOf(resp).ok()) {
      pipe_r = p[0];
    } else {
      close(p[0]);  // a worker that takes no pipe: every byte comes inline
    }
  }
  MutexLock lock(&mu_);
  pipes_[conn] = pipe_r;
  return conn;
}

void LocalChannel::CloseConn(int conn) {
  int pipe = -1;
  {
    MutexLock lock(&mu_);
    auto it = pipes_.find(conn);
    if (it != pipes_.end()) {
      pipe = it->second;
      pipes_.erase(it);
    }
  }
  if (pipe >= 0) close(pipe);
  close(conn);
}

int LocalChannel::PipeOf(int conn) {
  MutexLock lock(&mu_);
  auto it = pipes_.find(conn);
  return it == pipes_.end() ? -1 : it->second;
}

Status LocalChannel::ReadInto(const Piece& p, char* dst) {
  for (size_t done = 0; done < p.length;) {
    ssize_t got = p.pipe ? read(p.fd, dst + done, p.length - done)
                         : pread(p.fd, dst + done, p.length - done, static_cast<off_t>(p.offset + done));
    if (got < 0 && errno == EINTR) continue;
    if (got < 0) return ErrnoError(errno, p.pipe ? "read of the worker's pipe" : "read of a cached block file");
    if (got == 0) {
      return DataLossError(p.pipe ? "the worker's pipe held fewer bytes than its answer said"
                                  : "a cached block file is shorter than its lease");
    }
    done += static_cast<size_t>(got);
  }
  return Status::OK();
}

void LocalChannel::Give(int conn) {
  MutexLock lock(&mu_);
  idle_.push_back(conn);
}

Status LocalChannel::Meta(const rpc::MetaCall& call, rpc::MetaAnswer* out) {
  auto taken = Take();
  if (!taken.ok()) {
    // This user may not connect: said as such (waiting would not help).
    if (taken.status().code() == Code::kPermissionDenied) return taken.status();
    return UnavailableError("the worker's local socket: " + taken.status().message());
  }
  const int conn = *taken;
  rpc::LocalRequest lr;
  *lr.mutable_meta() = call;
  rpc::LocalResponse resp;
  int fd = -1;
  Status st = SendFrame(conn, lr);
  if (st.ok()) st = RecvFrame(conn, &resp, &fd);
  if (fd >= 0) close(fd);
  if (!st.ok()) {
    CloseConn(conn);
    return UnavailableError("the worker's local socket: " + st.message());
  }
  Give(conn);
  RETURN_IF_ERROR(rpc::StatusOf(resp));
  *out = std::move(*resp.mutable_meta());
  return Status::OK();
}

Status LocalChannel::Read(const rpc::ReadBlockRequest& req, Piece* out, bool want_source,
                          std::shared_ptr<const SourceFile>* source_file, char* into, const std::string& grant) {
  // A failure to reach the worker or a broken connection is UNAVAILABLE (the worker restarting or
  // gone); only the worker's own answers carry other codes.
  auto taken = Take();
  if (!taken.ok()) return UnavailableError("the worker's local socket: " + taken.status().message());
  int conn = *taken;
  rpc::LocalRequest lr;
  *lr.mutable_read() = req;
  lr.set_want_source(want_source && source_file != nullptr);
  if (!grant.empty()) lr.set_read_grant(grant);
  rpc::LocalResponse resp;
  int fd = -1;
  bool landed = false;
  Status st = SendFrame(conn, lr);
  if (st.ok()) {
    st = into != nullptr ? RecvFrameInto(conn, &resp, &fd, rpc::LocalResponse::kDataFieldNumber, into, req.length(), &landed)
                         : RecvFrame(conn, &resp, &fd);
  }
  if (!st.ok()) {
    CloseConn(conn);  // broken: never reused
    return UnavailableError("the worker's local socket: " + st.message());
  }
  Status answer = rpc::StatusOf(resp);
  if (answer.ok() && resp.lease() != 0 && fd < 0) answer = DataLossError("the worker's lease came without a descriptor");
  if (!answer.ok()) {
    if (fd >= 0) close(fd);
    rpc::LocalRequest rel;
    rel.set_release(resp.lease());
    if (resp.lease() != 0 && !SendFrame(conn, rel).ok()) {
      CloseConn(conn);  // the worker releases a closed connection's leases itself
    } else {
      Give(conn);
    }
    return answer;
  }
  out->length = resp.length();
  out->source = NodeSourceOf(rpc::ReadSourceFromWire(resp.source()), /*this_node=*/true);
  if (resp.in_pipe()) {
    const int pipe = PipeOf(conn);
    if (pipe < 0 || fd >= 0 || resp.lease() != 0 || landed) {
      if (fd >= 0) close(fd);
      CloseConn(conn);
      return UnavailableError("the worker's local socket: bytes in a pipe this connection did not give it");
    }
    out->fd = pipe;
    out->pipe = true;
    out->offset = 0;
    out->conn = conn;  // held until Release, which checks the bytes were taken
    return Status::OK();
  }
  if (resp.lease() != 0) {
    out->fd = fd;
    out->offset = resp.data_offset();
    out->lease = resp.lease();
    out->conn = conn;  // held until Release
    return Status::OK();
  }
  if (fd >= 0 && resp.source_file() && source_file != nullptr) {
    // The under-storage's file, not a lease: granary-fuse reads its uncached ranges itself.
    *source_file = std::make_shared<const SourceFile>(fd, resp.source_size(), resp.source_mtime_ns(), resp.source_ino(),
                                                     resp.source_cached());
    fd = -1;
  }
  if (fd >= 0) close(fd);
  Give(conn);
  if (landed) {
    out->mem = into;
    if (req.length() != out->length) return DataLossError("the worker sent a short inline block");
    return Status::OK();
  }
  out->data = std::move(*resp.mutable_data());
  if (out->data.size() != out->length) return DataLossError("the worker sent a short inline block");
  return Status::OK();
}

Status LocalChannel::LeaseFile(const rpc::ReadBlockRequest& req, Piece* out, bool verify) {
  const unsigned index = next_line_.fetch_add(1, std::memory_order_relaxed) % kLeaseLines;
  LeaseLine& line = lines_[index];
  MutexLock lock(&line.mu);
  if (line.conn < 0) {
    ASSIGN_OR_RETURN(line.conn, Dial());
    ++line.gen;
  }
  rpc::LocalRequest lr;
  *lr.mutable_read() = req;
  lr.set_whole_file(true);
  lr.set_verify(verify);
  rpc::LocalResponse resp;
  int fd = -1;
  Status st = SendFrame(line.conn, lr);
  if (st.ok()) st = RecvFrame(line.conn, &resp, &fd);
  if (!st.ok()) {
    close(line.conn);  // broken: the worker ends its leases; the next call reconnects
    line.conn = -1;
    return st;
  }
  Status answer = rpc::StatusOf(resp);
  if (answer.ok() && (resp.lease() == 0 || fd < 0)) answer = DataLossError("the worker's lease came without a descriptor");
  if (!answer.ok()) {
    if (fd >= 0) close(fd);
    if (resp.lease() != 0) {
      rpc::LocalRequest rel;
      rel.set_release(resp.lease());
      (void)SendFrame(line.conn, rel);
    }
    return answer;
  }
  out->fd = fd;
  out->offset = resp.data_offset();
  out->length = resp.length();
  out->lease = resp.lease();
  out->conn = -1;
  out->shared_gen = line.gen;
  out->line = index;
  return Status::OK();
}

void LocalChannel::Release(Piece* p) {
  if (p->pipe) {
    // The connection goes back only with its pipe empty: what is left there would be taken for
    // the next read's bytes.
    int queued = 0;
    const bool drained = p->fd >= 0 && ioctl(p->fd, FIONREAD, &queued) == 0 && queued == 0;
    p->fd = -1;
    p->pipe = false;
    if (p->conn >= 0) drained ? Give(p->conn) : CloseConn(p->conn);
    p->conn = -1;
    return;
  }
  if (p->fd >= 0) close(p->fd);
  p->fd = -1;
  if (p->shared_gen != 0) {
    LeaseLine& line = lines_[p->line % kLeaseLines];
    MutexLock lock(&line.mu);
    if (p->shared_gen == line.gen && line.conn >= 0) {
      rpc::LocalRequest rel;
      rel.set_release(p->lease);
      if (!SendFrame(line.conn, rel).ok()) {
        close(line.conn);
        line.conn = -1;
      }
    }
    p->shared_gen = 0;
    return;
  }
  if (p->conn < 0) return;
  rpc::LocalRequest rel;
  rel.set_release(p->lease);
  if (SendFrame(p->conn, rel).ok()) {
    Give(p->conn);
  } else {
    CloseConn(p->conn);  // the worker releases a closed connection's leases itself
  }
  p->conn = -1;
}

}  // namespace granary::fuse
