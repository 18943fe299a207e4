// StreamSocket: a long-lived text stream (the access trace) served on a unix socket that only root
// and the daemon's own user may use — never on a network port, where any local user or anyone on
// the network could read it.
//
// Access: the socket file is 0600 in a 0700 directory the daemon made (RuntimeDir()), and a
// connecting process must run as root or as the daemon's user (SO_PEERCRED); anyone else is
// refused before a byte is read.
//
// Protocol: the client sends one line, a JSON object of string parameters (`{"pid":"12"}`; at most
// kMaxRequest bytes), then reads text until either side closes. The handler gets the parameters and
// a StreamSink writing to the connection. At most kMaxStreams run at once; beyond that a client
// reads one line, {"error":"..."}. A request line that is too long or not a JSON object of strings
// is refused the same way (and counted, common/bad_request.h).
//
// One thread accepts; each stream gets its own (common/unix_server.h). Thread-safe; Stop() (or the destructor) ends every
// stream and waits for their threads, after `close` makes the handlers return (the handler must
// return once its sink's Write fails or it is told to stop by its own means).
#pragma once

#include <atomic>
#include <condition_variable>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <thread>

#include "common/status.h"
#include "common/unix_server.h"

namespace granary {

// Where a handler writes its stream. Write returns false once the client went away; Alive tells
// that without writing.
class StreamSink {
 public:
  virtual ~StreamSink() = default;
  virtual bool Write(const std::string& text) = 0;
  virtual bool Alive() = 0;
};

class StreamSocket {
 public:
  static constexpr int kMaxStreams = 4;
  static constexpr size_t kMaxRequest = 4096;
  using Handler = std::function<void(const std::map<std::string, std::string>& params, StreamSink* sink)>;

  // Listens on `path` (a stale socket file there is replaced; its directory is made 0700).
  static StatusOr<std::unique_ptr<StreamSocket>> Start(const std::string& path, Handler handler);
  ~StreamSocket();
  // Shuts every connection down, then waits for the handlers to return.
  void Stop();
  const std::string& path() const { return path_; }

 private:
  StreamSocket(std::string path, Handler handler) : path_(std::move(path)), handler_(std::move(handler)) {}
  void Serve(int conn);

  const std::string path_;
  const Handler handler_;
  std::unique_ptr<UnixServer> server_;  // accepts, checks the peer, a thread per stream
};

// Client side: connects to `path`, sends `params`, and calls `on_line` with each line received
// (without its newline) until it returns false, the server closes, or `stop` returns true (checked
// at least every 500 ms). UNAVAILABLE when nobody listens there; PERMISSION_DENIED when this user
// may not connect.
Status ReadStream(const std::string& path, const std::map<std::string, std::string>& params,
                  const std::function<bool(const std::string&)>& on_line, const std::function<bool()>& stop);

}  // namespace granary
