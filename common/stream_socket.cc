#include "common/stream_socket.h"

#include <errno.h>
#include <poll.h>
#include <spdlog/spdlog.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include "common/bad_request.h"
#include "common/fs.h"
#include "common/net.h"

namespace granary {
namespace {

bool SendAll(int fd, const std::string& text) {
  size_t off = 0;
  while (off < text.size()) {
    ssize_t n = send(fd, text.data() + off, text.size() - off, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    off += static_cast<size_t>(n);
  }
  return true;
}

class SocketSink final : public StreamSink {
 public:
  explicit SocketSink(int fd) : fd_(fd) {}
  bool Write(const std::string& text) override { return SendAll(fd_, text); }
  bool Alive() override {
    pollfd p{fd_, POLLRDHUP, 0};
    return poll(&p, 1, 0) == 0;
  }

 private:
  int fd_;
};

std::string ErrorLine(const std::string& message) {
  return nlohmann::json{{"error", message}}.dump() + "\n";
}

// Reads the request line: at most StreamSocket::kMaxRequest bytes, within a few seconds.
StatusOr<std::map<std::string, std::string>> ReadRequest(int fd) {
  std::string line;
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (line.find('\n') == std::string::npos) {
    if (line.size() > StreamSocket::kMaxRequest) {
      return InvalidArgumentError("a request line longer than " + std::to_string(StreamSocket::kMaxRequest) + " bytes");
    }
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) return DeadlineExceededError("no request line in time");
    pollfd p{fd, POLLIN, 0};
    if (poll(&p, 1, static_cast<int>(left.count())) <= 0) continue;
    char buf[1024];
    ssize_t n = recv(fd, buf, sizeof buf, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return UnavailableError("the client went away");
    line.append(buf, static_cast<size_t>(n));
  }
  line.resize(line.find('\n'));
  auto j = nlohmann::json::parse(line, nullptr, false);
  if (!j.is_object()) return InvalidArgumentError("the request line is not a JSON object");
  std::map<std::string, std::string> params;
  for (auto it = j.begin(); it != j.end(); ++it) {
    if (!it.value().is_string()) return InvalidArgumentError("parameter '" + it.key() + "' is not a string");
    params[it.key()] = it.value().get<std::string>();
  }
  return params;
}

}  // namespace

StatusOr<std::unique_ptr<StreamSocket>> StreamSocket::Start(const std::string& path, Handler handler) {
  std::string dir = path.substr(0, path.rfind('/'));
  if (!dir.empty()) RETURN_IF_ERROR(MakeDirs(dir, 0700));
  unlink(path.c_str());  // a socket left by a process that died (the path is this process's own)
  std::unique_ptr<StreamSocket> s(new StreamSocket(path, std::move(handler)));
  UnixServer::Options o;
  o.what = "the trace socket " + path;
  o.backlog = 16;
  o.max_connections = kMaxStreams;
  o.on_full = [](int c) { SendAll(c, ErrorLine("at most " + std::to_string(kMaxStreams) + " streams at once; stop one")); };
  ASSIGN_OR_RETURN(s->server_, UnixServer::Start(path, std::move(o), [p = s.get()](int c) { p->Serve(c); }));
  return s;
}

StreamSocket::~StreamSocket() { Stop(); }

void StreamSocket::Stop() {
  if (server_) server_->Stop();
}

void StreamSocket::Serve(int conn) {
  auto params = ReadRequest(conn);
  if (params.ok()) {
    SocketSink sink(conn);
    handler_(*params, &sink);
  } else if (params.status().code() == Code::kInvalidArgument) {
    NoteBadRequest("trace socket", params.status());
    SendAll(conn, ErrorLine(params.status().message()));
  }
}

Status ReadStream(const std::string& path, const std::map<std::string, std::string>& params,
                  const std::function<bool(const std::string&)>& on_line, const std::function<bool()>& stop) {
  ASSIGN_OR_RETURN(int fd, ConnectUnix(path, "the trace socket"));
  nlohmann::json req = nlohmann::json::object();
  for (const auto& [k, v] : params) req[k] = v;
  if (!SendAll(fd, req.dump() + "\n")) {
    close(fd);
    return UnavailableError(path + " closed the connection at once (only root or the daemon's own user may read it)");
  }
  std::string pending;
  Status st = Status::OK();
  for (;;) {
    if (stop && stop()) break;
    pollfd p{fd, POLLIN, 0};
    int rc = poll(&p, 1, 500);
    if (rc < 0 && errno != EINTR) {
      st = ErrnoError(errno, "poll " + path);
      break;
    }
    if (rc <= 0) continue;
    char buf[65536];
    ssize_t n = recv(fd, buf, sizeof buf, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;  // the server ended the stream
    pending.append(buf, static_cast<size_t>(n));
    size_t eol;
    bool more = true;
    while (more && (eol = pending.find('\n')) != std::string::npos) {
      more = on_line(pending.substr(0, eol));
      pending.erase(0, eol + 1);
    }
    if (!more) break;
  }
  close(fd);
  return st;
}

}  // namespace granary
