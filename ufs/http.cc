#include "ufs/http.h"

#include <curl/curl.h>
#include <sys/socket.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstring>

#include "ufs/ufs.h"

namespace granary {
namespace {

constexpr size_t kDefaultBuffer = 16 * 1024;   // libcurl's CURLOPT_BUFFERSIZE default
// Each idle handle keeps its buffer: 128 KiB (a whole image; a 4 MiB block in 32 reads, not 256)
// bounds that at a few tens of MB for a worker's hundreds of handles.
constexpr size_t kLargeBuffer = 128 * 1024;

struct CurlGlobal {
  CurlGlobal() { curl_global_init(CURL_GLOBAL_DEFAULT); }
};

// Where a transfer's body goes: the request's sink while the status is 2xx and it has room, else
// the response's body string.
struct BodyTarget {
  CURL* curl;
  const HttpRequest* req;
  HttpResponse* resp;
  int streams = -1;  // whether the sink's front is reported (HttpRequest::progress): -1 not decided yet
};

// Whether a response (status `code`) is the range the request's progress is for: its body starts
// at byte progress_first of the object.
bool StartsWhereAsked(const BodyTarget& t, long code) {
  if (code == 200) return t.req->progress_first == 0;
  if (code != 206) return false;
  unsigned long long first = 0;
  return std::sscanf(t.resp->Header("content-range").c_str(), "bytes %llu-", &first) == 1 &&
         first == t.req->progress_first;
}

size_t OnBody(char* p, size_t size, size_t n, void* ud) {
  auto* t = static_cast<BodyTarget*>(ud);
  size_t len = size * n;
  if (t->req->sink != nullptr && t->resp->body.empty() && t->resp->sunk < t->req->sink_capacity) {
    long code = 0;
    curl_easy_getinfo(t->curl, CURLINFO_RESPONSE_CODE, &code);
    if (code >= 200 && code < 300) {
      ReadProgress* progress = t->req->progress;
      if (progress != nullptr && t->streams < 0) t->streams = StartsWhereAsked(*t, code) ? 1 : 0;
      size_t k = std::min(len, t->req->sink_capacity - t->resp->sunk);
      const size_t at = t->resp->sunk;
      // Bytes an earlier attempt landed may be read by now: never written again (the same bytes: the
      // request pins the version; a response that is not the range asked for is refused anyway).
      const uint64_t landed = progress != nullptr ? progress->landed() : 0;
      const size_t skip = landed > at ? static_cast<size_t>(std::min<uint64_t>(landed - at, k)) : 0;
      std::memcpy(t->req->sink + at + skip, p + skip, k - skip);
      if (t->streams == 1) progress->Landed(at + k);
      t->resp->sunk += k;
      p += k;
      len -= k;
    }
  }
  t->resp->body.append(p, len);
  return size * n;
}

int OnSocket(void* ud, curl_socket_t fd, curlsocktype) {
  // A socket whose buffer cannot be set still works (with the kernel's): not a reason to fail.
  (void)ApplySocketOptions(fd, *static_cast<const CurlOptions*>(ud));
  return CURL_SOCKOPT_OK;
}

size_t OnHeader(char* p, size_t size, size_t n, void* ud) {
  std::string line(p, size * n);
  auto* headers = static_cast<HeaderList*>(ud);
  if (line.rfind("HTTP/", 0) == 0) headers->clear();  // a new response (after 100-continue or a redirect)
  size_t colon = line.find(':');
  if (colon == std::string::npos) return size * n;
  std::string name = line.substr(0, colon);
  for (auto& c : name) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  std::string value = line.substr(colon + 1);
  while (!value.empty() && std::isspace(static_cast<unsigned char>(value.front()))) value.erase(0, 1);
  while (!value.empty() && std::isspace(static_cast<unsigned char>(value.back()))) value.pop_back();
  headers->emplace_back(std::move(name), std::move(value));
  return size * n;
}

}  // namespace

Status ApplySocketOptions(int fd, const CurlOptions& opts) {
  if (opts.receive_buffer > 0 &&
      setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &opts.receive_buffer, sizeof opts.receive_buffer) != 0) {
    return ErrnoError(errno, "setting a connection's receive buffer");
  }
  return Status::OK();
}

std::string HttpResponse::Header(const std::string& lower_name) const {
  for (const auto& [k, v] : headers) {
    if (k == lower_name) return v;
  }
  return "";
}

CurlHttpClient::CurlHttpClient(CurlOptions opts) : opts_(opts) { static CurlGlobal global; }

CurlHttpClient::~CurlHttpClient() {
  for (void* h : idle_) curl_easy_cleanup(static_cast<CURL*>(h));
}

void* CurlHttpClient::Acquire() {
  {
    MutexLock lock(&mu_);
    if (!idle_.empty()) {
      void* h = idle_.back();
      idle_.pop_back();
      return h;
    }
  }
  return curl_easy_init();
}

void CurlHttpClient::Release(void* handle) {
  MutexLock lock(&mu_);
  idle_.push_back(handle);
}

StatusOr<HttpResponse> CurlHttpClient::Send(const HttpRequest& req) {
  CURL* c = static_cast<CURL*>(Acquire());
  if (c == nullptr) return InternalError("cannot create a libcurl handle");
  curl_easy_reset(c);  // keeps the connection cache
  HttpResponse resp;
  curl_slist* hdrs = nullptr;
  for (const auto& [k, v] : req.headers) hdrs = curl_slist_append(hdrs, (k + ": " + v).c_str());
  hdrs = curl_slist_append(hdrs, "Expect:");
  curl_easy_setopt(c, CURLOPT_URL, req.url.c_str());
  curl_easy_setopt(c, CURLOPT_HTTPHEADER, hdrs);
  if (req.method == "HEAD") {
    curl_easy_setopt(c, CURLOPT_NOBODY, 1L);
  } else if (req.method != "GET") {
    curl_easy_setopt(c, CURLOPT_CUSTOMREQUEST, req.method.c_str());
  }
  if (req.method == "PUT" || req.method == "POST") {  // the body as it is (POSTFIELDS copies nothing)
    curl_easy_setopt(c, CURLOPT_POSTFIELDS, req.body != nullptr ? req.body : "");
    curl_easy_setopt(c, CURLOPT_POSTFIELDSIZE_LARGE, static_cast<curl_off_t>(req.body_size));
  }
  if (req.sink != nullptr && req.sink_capacity > kDefaultBuffer) {
    // A body read into the caller's buffer: libcurl's receive buffer as large as the body (up to
    // kLargeBuffer), so a block costs fewer reads and copies of the socket than one per 16 KiB.
    curl_easy_setopt(c, CURLOPT_BUFFERSIZE, static_cast<long>(std::min(req.sink_capacity, kLargeBuffer)));
  }
  BodyTarget target{c, &req, &resp};
  curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, OnBody);
  curl_easy_setopt(c, CURLOPT_WRITEDATA, &target);
  curl_easy_setopt(c, CURLOPT_HEADERFUNCTION, OnHeader);
  curl_easy_setopt(c, CURLOPT_HEADERDATA, &resp.headers);
  curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(c, CURLOPT_CONNECTTIMEOUT_MS, static_cast<long>(opts_.connect_timeout.count()));
  curl_easy_setopt(c, CURLOPT_TIMEOUT_MS, static_cast<long>(opts_.request_timeout.count()));
  curl_easy_setopt(c, CURLOPT_LOW_SPEED_LIMIT, opts_.low_speed_bytes_per_s);
  curl_easy_setopt(c, CURLOPT_LOW_SPEED_TIME, static_cast<long>(opts_.low_speed_time.count()));
  curl_easy_setopt(c, CURLOPT_TCP_KEEPALIVE, 1L);
  curl_easy_setopt(c, CURLOPT_SOCKOPTFUNCTION, OnSocket);
  curl_easy_setopt(c, CURLOPT_SOCKOPTDATA, &opts_);
  if (!opts_.ca_file.empty()) curl_easy_setopt(c, CURLOPT_CAINFO, opts_.ca_file.c_str());
  if (!opts_.cert_file.empty()) curl_easy_setopt(c, CURLOPT_SSLCERT, opts_.cert_file.c_str());
  if (!opts_.key_file.empty()) curl_easy_setopt(c, CURLOPT_SSLKEY, opts_.key_file.c_str());
  // curl's own words on a failure say which step failed ("Connection timed out after 5001
  // milliseconds", "Operation too slow ..."), where curl_easy_strerror says only "Timeout was reached".
  char detail[CURL_ERROR_SIZE] = {0};
  curl_easy_setopt(c, CURLOPT_ERRORBUFFER, detail);
  CURLcode rc = curl_easy_perform(c);
  curl_easy_setopt(c, CURLOPT_ERRORBUFFER, nullptr);
  curl_slist_free_all(hdrs);
  if (rc != CURLE_OK) {
    // The connection may be broken: drop this handle rather than reuse it.
    curl_easy_cleanup(c);
    std::string what = std::string(curl_easy_strerror(rc));
    if (detail[0] != '\0' && what != detail) what += " (" + std::string(detail) + ")";
    if (rc == CURLE_OPERATION_TIMEDOUT) return DeadlineExceededError(what);
    return UnavailableError(what);
  }
  curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &resp.status);
  Release(c);
  return resp;
}

}  // namespace granary
