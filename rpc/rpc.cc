#include "rpc/rpc.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <spdlog/spdlog.h>

#include <cstdlib>
#include <string_view>

#include "common/fs.h"
#include "common/net.h"

namespace granary {

namespace {

constexpr std::string_view kReasonPrefix = "granary-reason=";

Reason ReasonOf(const grpc::Status& s) {
  const std::string& d = s.error_details();
  if (d.size() <= kReasonPrefix.size() || d.compare(0, kReasonPrefix.size(), kReasonPrefix) != 0) return Reason::kNone;
  return ReasonFromWire(std::atoi(d.c_str() + kReasonPrefix.size()));
}

}  // namespace

std::string LeaderHint(const grpc::Status& s) {
  const std::string& d = s.error_details();
  constexpr size_t n = sizeof(kLeaderHint) - 1;
  if (d.size() <= n || d.compare(0, n, kLeaderHint) != 0) return "";
  return d.substr(n);
}

std::vector<std::string> SplitAddressList(const std::string& list) {
  std::vector<std::string> out;
  size_t start = 0;
  while (start <= list.size()) {
    size_t comma = list.find(',', start);
    if (comma == std::string::npos) comma = list.size();
    std::string one = list.substr(start, comma - start);
    size_t b = one.find_first_not_of(" \t"), e = one.find_last_not_of(" \t");
    if (b != std::string::npos) out.push_back(one.substr(b, e - b + 1));
    start = comma + 1;
  }
  return out;
}

grpc::Status ToGrpc(const Status& s) {
  if (s.ok()) return grpc::Status::OK;
  auto code = static_cast<grpc::StatusCode>(static_cast<int>(s.code()));
  // An UNAVAILABLE of ours always carries details (reason 0 when none), so a client can tell a
  // server that answered "unavailable" (its under-storage failed) from one it never reached
  // (ServerUnreachable).
  if (s.reason() == Reason::kNone && code != grpc::StatusCode::UNAVAILABLE) return grpc::Status(code, s.message());
  return grpc::Status(code, s.message(), std::string(kReasonPrefix) + std::to_string(static_cast<int>(s.reason())));
}

bool IsNotLeader(const grpc::Status& s) {
  constexpr size_t n = sizeof(kLeaderHint) - 1;
  return s.error_code() == grpc::StatusCode::UNAVAILABLE && s.error_details().compare(0, n, kLeaderHint) == 0;
}

bool ServerUnreachable(const grpc::Status& s) {
  return s.error_code() == grpc::StatusCode::UNAVAILABLE && s.error_details().empty();
}

Status FromGrpc(const grpc::Status& s, const std::string& context) {
  if (s.ok()) return Status::OK();
  int code = static_cast<int>(s.error_code());
  if (code < 0 || code > 16) code = static_cast<int>(Code::kUnknown);
  std::string msg = s.error_message();
  // The code alone cannot tell an unreachable server from one that answered UNAVAILABLE (its
  // under-storage failed), so the message names who answered and leaves the diagnosis to it.
  if (s.error_code() == grpc::StatusCode::UNAVAILABLE) return Status(Code::kUnavailable, context + ": " + msg, ReasonOf(s));
  return Status(static_cast<Code>(code), msg, ReasonOf(s));
}

StatusOr<std::shared_ptr<RpcSecurity>> RpcSecurity::FromConfig(const RpcConfig& cfg) {
  auto sec = std::make_shared<RpcSecurity>();
  auto read = [](const std::string& path, const char* key, std::string* out) -> Status {
    if (path.empty()) return Status::OK();
    auto data = ReadFileToString(path);
    if (!data.ok()) return data.status().WithContext(key);
    *out = std::move(data).value();
    return Status::OK();
  };
  RETURN_IF_ERROR(read(cfg.token_file, "rpc.token_file", &sec->token_));
  while (!sec->token_.empty() && (sec->token_.back() == '\n' || sec->token_.back() == '\r')) sec->token_.pop_back();
  if (!cfg.token_file.empty() && sec->token_.empty()) {
    return InvalidArgumentError("rpc.token_file: " + cfg.token_file + " is empty");
  }
  RETURN_IF_ERROR(read(cfg.tls_cert, "rpc.tls_cert", &sec->cert_));
  RETURN_IF_ERROR(read(cfg.tls_key, "rpc.tls_key", &sec->key_));
  RETURN_IF_ERROR(read(cfg.tls_ca, "rpc.tls_ca", &sec->ca_));
  if (sec->cert_.empty() != sec->key_.empty()) {
    return InvalidArgumentError("rpc.tls_cert and rpc.tls_key must be set together");
  }
  return sec;
}

bool IsLoopbackHost(const std::string& host) {
  if (host == "localhost") return true;
  in_addr v4{};
  if (inet_pton(AF_INET, host.c_str(), &v4) == 1) return (ntohl(v4.s_addr) >> 24) == 127;
  in6_addr v6{};
  return inet_pton(AF_INET6, host.c_str(), &v6) == 1 && IN6_IS_ADDR_LOOPBACK(&v6);
}

Status CheckServingPolicy(const std::string& setting_key, const std::string& listen, const RpcConfig& cfg) {
  if (!cfg.token_file.empty() || cfg.allow_unauthenticated || listen.rfind("unix:", 0) == 0) return Status::OK();
  ASSIGN_OR_RETURN(HostPort hp, ParseHostPort(listen));
  if (IsLoopbackHost(hp.host)) return Status::OK();
  return InvalidArgumentError(setting_key + " " + listen +
                              " is reachable from the network and rpc.token_file is not set: anyone who reaches it "
                              "could mount, read and free datasets. Set rpc.token_file (docs/security.md), listen on "
                              "127.0.0.1, or set rpc.allow_unauthenticated: true to serve without a token on purpose");
}

void WarnIfServingWithoutToken(const std::string& listen, const RpcConfig& cfg) {
  if (!cfg.token_file.empty()) return;
  auto hp = ParseHostPort(listen);
  if (listen.rfind("unix:", 0) == 0 || (hp.ok() && IsLoopbackHost(hp->host))) {
    spdlog::warn("serving gRPC on {} without rpc.token_file: every user of this machine may mount, read and free "
                 "datasets (set rpc.token_file to require a token; see docs/security.md)",
                 listen);
    return;
  }
  spdlog::warn("SERVING WITHOUT A TOKEN on {} (rpc.allow_unauthenticated): anyone who reaches this address may mount, "
               "read and free datasets; set rpc.token_file (docs/security.md)",
               listen);
}

std::shared_ptr<grpc::ServerCredentials> RpcSecurity::ServerCredentials() const {
  if (cert_.empty()) return grpc::InsecureServerCredentials();
  grpc::SslServerCredentialsOptions opts;
  opts.pem_root_certs = ca_;
  opts.pem_key_cert_pairs.push_back({key_, cert_});
  return grpc::SslServerCredentials(opts);
}

std::shared_ptr<grpc::Channel> RpcSecurity::MakeChannel(const std::string& address) const {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(kMaxMessageBytes);
  args.SetMaxSendMessageSize(kMaxMessageBytes);
  // Reconnect quickly after a daemon restarts.
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 2000);
  args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 1000);
  // A peer that vanishes without closing its connection (host down, link cut) fails the calls in
  // flight after kKeepalive + kKeepaliveTimeout instead of at their deadline: pings go out while a
  // call waits, however long it waits without data.
  args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, static_cast<int>(std::chrono::milliseconds(kKeepalive).count()));
  args.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, static_cast<int>(std::chrono::milliseconds(kKeepaliveTimeout).count()));
  args.SetInt(GRPC_ARG_HTTP2_MAX_PINGS_WITHOUT_DATA, 0);
  std::shared_ptr<grpc::ChannelCredentials> creds;
  if (ca_.empty()) {
    creds = grpc::InsecureChannelCredentials();
  } else {
    grpc::SslCredentialsOptions opts;
    opts.pem_root_certs = ca_;
    creds = grpc::SslCredentials(opts);
  }
  return grpc::CreateCustomChannel(address, creds, args);
}

void RpcSecurity::Prepare(grpc::ClientContext* ctx, std::chrono::milliseconds timeout) const {
  if (!token_.empty()) ctx->AddMetadata("authorization", "Bearer " + token_);
  if (timeout.count() > 0) ctx->set_deadline(std::chrono::system_clock::now() + timeout);
}

std::string RpcSecurity::Mac(const std::string& message) const {
  if (token_.empty()) return "";
  unsigned char out[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  if (HMAC(EVP_sha256(), token_.data(), static_cast<int>(token_.size()),
           reinterpret_cast<const unsigned char*>(message.data()), message.size(), out, &len) == nullptr) {
    return "";
  }
  return std::string(reinterpret_cast<char*>(out), len);
}

grpc::Status RpcSecurity::CheckToken(const grpc::ServerContextBase* ctx) const {
  if (token_.empty()) return grpc::Status::OK;
  const auto& md = ctx->client_metadata();
  auto it = md.find("authorization");
  std::string want = "Bearer " + token_;
  if (it != md.end() && it->second.size() == want.size() &&
      CRYPTO_memcmp(it->second.data(), want.data(), want.size()) == 0) {
    return grpc::Status::OK;
  }
  return grpc::Status(grpc::StatusCode::UNAUTHENTICATED, "missing or wrong rpc token (see rpc.token_file)");
}

Status ReadBlockStream(rpc::Worker::Stub& stub, grpc::ClientContext& ctx, const rpc::ReadBlockRequest& req,
                       uint64_t want, std::string* out, const std::string& who, bool* cache_hit,
                       uint32_t* source) {
  // Chunks as large as this channel takes (MakeChannel): a block that fits comes in one message,
  // whose bytes become `out` without a copy.
  rpc::ReadBlockRequest sized = req;
  sized.set_max_chunk_bytes(kMaxReadChunkBytes);
  auto reader = stub.ReadBlock(&ctx, sized);
  rpc::ReadBlockChunk chunk;
  const size_t base = out->size();
  uint64_t got = 0;
  bool first = true;
  while (reader->Read(&chunk)) {
    if (first && cache_hit) *cache_hit = chunk.cache_hit();
    if (first && source) *source = chunk.source();
    first = false;
    std::string* d = chunk.mutable_data();
    got += d->size();
    if (out->empty() && d->size() == want) {
      out->swap(*d);
      continue;
    }
    // Room for the whole answer at once: appended chunk by chunk, a block-sized string would be
    // reallocated and copied on its way. More than `want` is no answer anyway (and no block is
    // larger than kMaxBlockSize).
    if (out->capacity() < base + want) out->reserve(base + std::min<uint64_t>(want, kMaxBlockSize));
    out->append(*d);
  }
  RETURN_IF_ERROR(FromGrpc(reader->Finish(), who));
  if (got != want) {
    return DataLossError(who + " returned " + std::to_string(got) + " bytes of a block, wanted " + std::to_string(want));
  }
  return Status::OK();
}

void AllowKeepalivePings(grpc::ServerBuilder* builder) {
  builder->AddChannelArgument(GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS,
                              static_cast<int>(std::chrono::milliseconds(kKeepalive).count() / 2));
  builder->AddChannelArgument(GRPC_ARG_HTTP2_MAX_PING_STRIKES, 0);
}

}  // namespace granary
