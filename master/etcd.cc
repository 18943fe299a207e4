#include "master/etcd.h"

#include <openssl/evp.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include <nlohmann/json.hpp>

#include "ufs/http.h"

namespace granary::master {
namespace {

using json = nlohmann::json;

// etcd's gateway writes 64-bit integers as strings, and leaves out fields at their default.
int64_t Int(const json& j, const char* field) {
  auto it = j.find(field);
  if (it == j.end()) return 0;
  if (it->is_number_integer()) return it->get<int64_t>();
  if (it->is_string()) {
    try {
      return std::stoll(it->get<std::string>());
    } catch (...) {
      return 0;
    }
  }
  return 0;
}

StatusOr<EtcdKv> KvOf(const json& j) {
  EtcdKv kv;
  ASSIGN_OR_RETURN(kv.key, Base64Decode(j.value("key", std::string())));
  ASSIGN_OR_RETURN(kv.value, Base64Decode(j.value("value", std::string())));
  kv.create_revision = Int(j, "create_revision");
  kv.lease = Int(j, "lease");
  kv.mod_revision = Int(j, "mod_revision");
  return kv;
}

StatusOr<json> Parse(const std::string& body, const std::string& what) {
  json j = json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return InternalError("etcd answered " + what + " with something that is not JSON");
  if (j.contains("error") || j.contains("code")) {
    return InternalError("etcd refused " + what + ": " + j.value("message", j.value("error", std::string("?"))));
  }
  return j;
}

}  // namespace

std::string Base64Encode(const std::string& in) {
  std::string out(4 * ((in.size() + 2) / 3), '\0');
  int n = EVP_EncodeBlock(reinterpret_cast<unsigned char*>(out.data()),
                          reinterpret_cast<const unsigned char*>(in.data()), static_cast<int>(in.size()));
  out.resize(n > 0 ? static_cast<size_t>(n) : 0);
  return out;
}

StatusOr<std::string> Base64Decode(const std::string& in) {
  if (in.empty()) return std::string();
  if (in.size() % 4 != 0) return InvalidArgumentError("not base64 (length " + std::to_string(in.size()) + ")");
  std::string out(3 * (in.size() / 4), '\0');
  int n = EVP_DecodeBlock(reinterpret_cast<unsigned char*>(out.data()),
                          reinterpret_cast<const unsigned char*>(in.data()), static_cast<int>(in.size()));
  if (n < 0) return InvalidArgumentError("not base64");
  // EVP_DecodeBlock counts the padding's bytes as data: take them off.
  size_t len = static_cast<size_t>(n);
  if (in.back() == '=') --len;
  if (in.size() >= 2 && in[in.size() - 2] == '=') --len;
  out.resize(len);
  return out;
}

StatusOr<std::unique_ptr<EtcdClient>> EtcdClient::Create(const std::vector<std::string>& endpoints,
                                                         std::chrono::milliseconds timeout, const EtcdTls& tls) {
  if (endpoints.empty()) return InvalidArgumentError("no etcd endpoint given (master.etcd_endpoints)");
  if (tls.cert.empty() != tls.key.empty()) {
    return InvalidArgumentError("master.etcd_tls_cert and master.etcd_tls_key must be set together");
  }
  std::vector<std::string> parsed;
  for (const std::string& e : endpoints) {
    const bool https = e.rfind("https://", 0) == 0, http = e.rfind("http://", 0) == 0;
    if (!https && !http) return InvalidArgumentError("etcd endpoint '" + e + "' is not https://HOST:PORT");
    if (http && !tls.allow_plaintext) {
      return InvalidArgumentError(
          "etcd endpoint '" + e + "' is plain HTTP: whoever reaches it could name the leader the standby masters "
          "follow and send their token to. Serve etcd over TLS with client certificates and give "
          "master.etcd_tls_ca, master.etcd_tls_cert and master.etcd_tls_key (docs/deploy.md; scripts/etcd.sh does it "
          "for tests), or set master.etcd_allow_plaintext: true to accept plain HTTP on purpose");
    }
    std::string rest = e.substr(https ? 8 : 7);
    while (!rest.empty() && rest.back() == '/') rest.pop_back();
    const size_t colon = rest.rfind(':');
    if (colon == std::string::npos || colon == 0 || colon + 1 == rest.size() ||
        rest.find('/') != std::string::npos) {
      return InvalidArgumentError("etcd endpoint '" + e + "' is not " + (https ? "https" : "http") + "://HOST:PORT");
    }
    try {
      size_t used = 0;
      const int port = std::stoi(rest.substr(colon + 1), &used);
      if (used != rest.size() - colon - 1 || port <= 0 || port > 65535) throw std::out_of_range("port");
    } catch (...) {
      return InvalidArgumentError("etcd endpoint '" + e + "' has no valid port (1-65535)");
    }
    parsed.push_back((https ? "https://" : "http://") + rest);
  }
  for (const auto& [file, key] : {std::pair{tls.ca, "master.etcd_tls_ca"}, std::pair{tls.cert, "master.etcd_tls_cert"},
                                  std::pair{tls.key, "master.etcd_tls_key"}}) {
    if (!file.empty() && access(file.c_str(), R_OK) != 0) {
      return InvalidArgumentError(std::string(key) + ": cannot read " + file + " (" + std::strerror(errno) + ")");
    }
  }
  CurlOptions o;
  o.connect_timeout = timeout;
  o.request_timeout = timeout;
  o.ca_file = tls.ca;
  o.cert_file = tls.cert;
  o.key_file = tls.key;
  return std::unique_ptr<EtcdClient>(new EtcdClient(std::move(parsed), std::make_unique<CurlHttpClient>(o)));
}

EtcdClient::EtcdClient(std::vector<std::string> endpoints, std::unique_ptr<HttpClient> http)
    : endpoints_(std::move(endpoints)), http_(std::move(http)) {}

EtcdClient::~EtcdClient() = default;

StatusOr<std::string> EtcdClient::Post(const std::string& path, const std::string& body) {
  std::string last = "no endpoint";
  const size_t first = preferred_.load();
  for (size_t i = 0; i < endpoints_.size(); ++i) {
    const size_t at = (first + i) % endpoints_.size();
    HttpRequest req;
    req.method = "POST";
    req.url = endpoints_[at] + path;
    req.headers = {{"Content-Type", "application/json"}};
    req.body = body.data();
    req.body_size = body.size();
    auto res = http_->Send(req);
    if (!res.ok()) {  // curl's words in full: which step failed, and why
      last = endpoints_[at] + ": " + res.status().message();
      continue;
    }
    if (res->status >= 500) {  // a member without quorum, or shutting down: another may answer
      last = endpoints_[at] + ": HTTP " + std::to_string(res->status);
      continue;
    }
    preferred_ = at;
    if (res->status != 200) {
      return InternalError("etcd at " + endpoints_[at] + " answered " + path + " with HTTP " +
                           std::to_string(res->status) + ": " + res->body.substr(0, 200));
    }
    return std::move(res->body);
  }
  return UnavailableError("etcd: no endpoint answered " + path + " (last: " + last + ")");
}

StatusOr<int64_t> EtcdClient::Grant(std::chrono::seconds ttl) {
  ASSIGN_OR_RETURN(std::string body, Post("/v3/lease/grant", json{{"TTL", ttl.count()}}.dump()));
  ASSIGN_OR_RETURN(json j, Parse(body, "a lease grant"));
  const int64_t id = Int(j, "ID");
  if (id == 0) return InternalError("etcd granted a lease with no ID");
  return id;
}

StatusOr<int64_t> EtcdClient::KeepAlive(int64_t lease) {
  ASSIGN_OR_RETURN(std::string body, Post("/v3/lease/keepalive", json{{"ID", std::to_string(lease)}}.dump()));
  ASSIGN_OR_RETURN(json j, Parse(body, "a lease keep-alive"));
  const json& r = j.contains("result") && j["result"].is_object() ? j["result"] : j;
  const int64_t ttl = Int(r, "TTL");
  if (ttl <= 0) return NotFoundError("etcd lease " + std::to_string(lease) + " has expired");
  return ttl;
}

Status EtcdClient::Revoke(int64_t lease) {
  ASSIGN_OR_RETURN(std::string body, Post("/v3/lease/revoke", json{{"ID", std::to_string(lease)}}.dump()));
  return Parse(body, "a lease revocation").status();
}

StatusOr<EtcdKv> EtcdClient::CreateIfAbsent(const std::string& key, const std::string& value, int64_t lease) {
  const std::string k = Base64Encode(key);
  json txn = {
      {"compare", json::array({{{"key", k}, {"result", "EQUAL"}, {"target", "CREATE"}, {"create_revision", "0"}}})},
      {"success", json::array({{{"requestPut", {{"key", k}, {"value", Base64Encode(value)}, {"lease", std::to_string(lease)}}}}})},
      {"failure", json::array({{{"requestRange", {{"key", k}}}}})},
  };
  ASSIGN_OR_RETURN(std::string body, Post("/v3/kv/txn", txn.dump()));
  ASSIGN_OR_RETURN(json j, Parse(body, "a transaction"));
  if (j.value("succeeded", false)) {
    EtcdKv kv;
    kv.key = key;
    kv.value = value;
    kv.lease = lease;
    kv.create_revision = j.contains("header") ? Int(j["header"], "revision") : 0;
    if (kv.create_revision == 0) return InternalError("etcd's transaction answer has no revision");
    return kv;
  }
  // Someone holds it: the range in the failure branch says who.
  const json* kvs = nullptr;
  if (j.contains("responses") && j["responses"].is_array() && !j["responses"].empty()) {
    const json& r = j["responses"][0];
    if (r.contains("response_range") && r["response_range"].contains("kvs")) kvs = &r["response_range"]["kvs"];
  }
  if (kvs == nullptr || !kvs->is_array() || kvs->empty()) {
    // Cannot be etcd's (the compare and the range are one transaction): say what came.
    return InternalError("etcd's failed transaction on " + key + " shows no key: " + body.substr(0, 200));
  }
  return KvOf((*kvs)[0]);
}

StatusOr<std::optional<EtcdKv>> EtcdClient::Get(const std::string& key) {
  ASSIGN_OR_RETURN(std::string body, Post("/v3/kv/range", json{{"key", Base64Encode(key)}}.dump()));
  ASSIGN_OR_RETURN(json j, Parse(body, "a range read"));
  if (!j.contains("kvs") || !j["kvs"].is_array() || j["kvs"].empty()) return std::optional<EtcdKv>();
  ASSIGN_OR_RETURN(EtcdKv kv, KvOf(j["kvs"][0]));
  return std::optional<EtcdKv>(std::move(kv));
}

Status EtcdClient::Put(const std::string& key, const std::string& value) { return PutLeased(key, value, 0); }

Status EtcdClient::PutLeased(const std::string& key, const std::string& value, int64_t lease) {
  json put = {{"key", Base64Encode(key)}, {"value", Base64Encode(value)}};
  if (lease != 0) put["lease"] = std::to_string(lease);
  ASSIGN_OR_RETURN(std::string body, Post("/v3/kv/put", put.dump()));
  return Parse(body, "a put").status();
}

namespace {

// etcd's range end for "every key that starts with prefix": the prefix with its last byte
// incremented (a last byte of 0xff is dropped and the one before incremented).
StatusOr<std::string> PrefixEnd(const std::string& prefix, const char* what) {
  if (prefix.empty()) return InvalidArgumentError(std::string("etcd ") + what + ": an empty prefix would take every key");
  std::string end = prefix;
  while (!end.empty() && static_cast<unsigned char>(end.back()) == 0xff) end.pop_back();
  if (end.empty()) return InvalidArgumentError(std::string("etcd ") + what + ": the prefix has no range end");
  end.back() = static_cast<char>(static_cast<unsigned char>(end.back()) + 1);
  return end;
}

}  // namespace

StatusOr<std::vector<EtcdKv>> EtcdClient::List(const std::string& prefix) {
  ASSIGN_OR_RETURN(std::string end, PrefixEnd(prefix, "list"));
  ASSIGN_OR_RETURN(std::string body, Post("/v3/kv/range", json{{"key", Base64Encode(prefix)},
                                                                {"range_end", Base64Encode(end)}}.dump()));
  ASSIGN_OR_RETURN(json j, Parse(body, "a range read"));
  std::vector<EtcdKv> out;
  if (!j.contains("kvs") || !j["kvs"].is_array()) return out;
  for (const json& k : j["kvs"]) {
    ASSIGN_OR_RETURN(EtcdKv kv, KvOf(k));
    out.push_back(std::move(kv));
  }
  return out;
}

Status EtcdClient::DeletePrefix(const std::string& prefix) {
  ASSIGN_OR_RETURN(std::string end, PrefixEnd(prefix, "delete"));
  ASSIGN_OR_RETURN(std::string body, Post("/v3/kv/deleterange", json{{"key", Base64Encode(prefix)},
                                                                     {"range_end", Base64Encode(end)}}.dump()));
  return Parse(body, "a range delete").status();
}

Status EtcdClient::DeleteIfUnchanged(const std::string& key, int64_t mod_revision) {
  const std::string k = Base64Encode(key);
  json txn = {
      {"compare", json::array({{{"key", k}, {"result", "EQUAL"}, {"target", "MOD"},
                                {"mod_revision", std::to_string(mod_revision)}}})},
      {"success", json::array({{{"requestDeleteRange", {{"key", k}}}}})},
  };
  ASSIGN_OR_RETURN(std::string body, Post("/v3/kv/txn", txn.dump()));
  return Parse(body, "a transaction").status();
}

}  // namespace granary::master
