// Network addresses: "host:port" parsing and a bind check that turns "port in use" into a clear
// error before a gRPC server would fail with a vague one. Thread-safe.
#pragma once

#include <cstdint>
#include <string>

#include "common/status.h"

namespace granary {

struct HostPort {
  std::string host;
  uint16_t port = 0;
};

// "127.0.0.1:80", "[::1]:80", "node-1:29999".
StatusOr<HostPort> ParseHostPort(const std::string& text);

// Tries to bind a TCP socket to `address` (then closes it). Fails with ALREADY_EXISTS naming the
// address when it is in use, INVALID_ARGUMENT when it cannot be resolved.
Status CheckCanListen(const std::string& address);

// This machine's host name.
std::string HostName();

}  // namespace granary
