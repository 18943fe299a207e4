// FaultProxy: a TCP proxy on an OS-chosen loopback port in front of a real server. In kPass mode it
// relays bytes both ways; in kReset mode it answers every new connection, and every connection
// that sends more, with a TCP reset. In kSlowDown mode it cuts live connections the same way and
// answers the first request of every new one as an S3 server under load does (503 SlowDown,
// Connection: close). Used to cut a real client off its server, or throttle it, mid-test.
#pragma once

#include <atomic>
#include <string>
#include <thread>
#include <vector>

namespace granary::testing {

class FaultProxy {
 public:
  enum Mode { kPass, kReset, kSlowDown };
  // `upstream_port`: the server on 127.0.0.1.
  explicit FaultProxy(int upstream_port);
  ~FaultProxy();
  int port() const { return port_; }
  void SetMode(Mode m) { mode_ = m; }
  int connections() const { return connections_; }
  int slowdowns() const { return slowdowns_; }  // 503 SlowDown answers sent

 private:
  void AcceptLoop();
  void Relay(int client);
  void SlowDown(int client);

  int upstream_port_;
  int listen_fd_ = -1;
  int port_ = 0;
  std::atomic<Mode> mode_{kPass};
  std::atomic<bool> stop_{false};
  std::atomic<int> connections_{0};
  std::atomic<int> slowdowns_{0};
  std::thread acceptor_;
  std::vector<std::thread> relays_;
};

}  // namespace granary::testing
