// HttpClient: the seam between under-storage clients and the network.
//
// CurlHttpClient sends requests with libcurl, reusing connections (a pool of easy handles, each
// keeping its connection alive) and bounding every transfer: a connect timeout, a total timeout,
// and a low-speed limit that ends a stalled body. Transport failures come back as UNAVAILABLE
// (retryable); an HTTP status is never an error here — the caller interprets it. Tests substitute a
// fault-injecting client. Thread-safe.
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "common/status.h"
#include "common/thread_annotations.h"
#include "ufs/sigv4.h"

namespace granary {

class ReadProgress;  // ufs/ufs.h

struct HttpRequest {
  std::string method;  // GET, HEAD, PUT, POST, DELETE
  std::string url;     // already percent-encoded
  HeaderList headers;
  // Where a 2xx body goes, when set: its first sink_capacity bytes are written straight into the
  // caller's buffer (a block being fetched), with no copy and no growing string; the rest, and any
  // other status's body, go to HttpResponse::body. A client may also ignore the sink (a test fake):
  // the caller reads HttpResponse::sunk bytes from the sink, then body.
  char* sink = nullptr;
  size_t sink_capacity = 0;
  // With a sink: the sink's front is reported here as it fills (ReadProgress::Landed), when the
  // response is the range asked for — a 206 whose Content-Range starts at `progress_first`, or a
  // 200 when that is 0 — and the bytes below what landed before (an earlier attempt's) are not
  // written again.
  ReadProgress* progress = nullptr;
  uint64_t progress_first = 0;
  // The request's body (PUT, POST): not owned, sent as it is (size 0: an empty body).
  const char* body = nullptr;
  size_t body_size = 0;
};

struct HttpResponse {
  long status = 0;
  HeaderList headers;  // names lower-cased
  std::string body;
  size_t sunk = 0;  // body bytes written into the request's sink (they are not in `body`)

  size_t BodySize() const { return sunk + body.size(); }

  std::string Header(const std::string& lower_name) const;
};

class HttpClient {
 public:
  virtual ~HttpClient() = default;
  virtual StatusOr<HttpResponse> Send(const HttpRequest& req) = 0;
};

struct CurlOptions {
  std::chrono::milliseconds connect_timeout{5000};
  std::chrono::milliseconds request_timeout{60000};
  long low_speed_bytes_per_s = 1024;  // below this for low_speed_time, the transfer is abandoned
  std::chrono::seconds low_speed_time{10};
  // Each connection's socket receive buffer (SO_RCVBUF, bytes; 0: the kernel's autotuning). A
  // fresh or idle connection's window otherwise starts at ~64 KiB (tcp_rmem's default 128 KiB
  // halved) and grows only as whole windows arrive, so with the store 20 ms away a 110 KB object
  // took two or three round trips and a block more; with 2 MiB it comes in one. The kernel caps it
  // at net.core.rmem_max (212992 on a stock kernel: raise it on the nodes to get all of it).
  // Measured in docs/benchmarks.md, session 44.
  int receive_buffer = 2 << 20;
  // TLS beyond the system's roots (each a PEM file's path; empty: not used): the roots that
  // verify the server (ca_file), and a client certificate and its key for servers that ask for one
  // (etcd with --client-cert-auth). The server's certificate is always verified, its name too.
  std::string ca_file, cert_file, key_file;
};

// Sets a connection's socket options from `opts` (what CurlHttpClient does to every socket it opens).
Status ApplySocketOptions(int fd, const CurlOptions& opts);

class CurlHttpClient : public HttpClient {
 public:
  explicit CurlHttpClient(CurlOptions opts = {});
  ~CurlHttpClient() override;
  StatusOr<HttpResponse> Send(const HttpRequest& req) override;

 private:
  void* Acquire();
  void Release(void* handle);

  const CurlOptions opts_;
  Mutex mu_;
  std::vector<void*> idle_ GUARDED_BY(mu_);  // CURL* handles with live connections
};

}  // namespace granary
