#include "ufs/sigv4.h"

#include <openssl/core_names.h>
#include <openssl/evp.h>
#include <openssl/params.h>

#include <algorithm>
#include <cctype>

namespace granary {
namespace {

std::string Hex(const unsigned char* p, size_t n) {
  static const char kHex[] = "0123456789abcdef";
  std::string s;
  s.reserve(2 * n);
  for (size_t i = 0; i < n; ++i) {
    s += kHex[p[i] >> 4];
    s += kHex[p[i] & 15];
  }
  return s;
}

// OpenSSL 3's one-shot SHA256() and HMAC() fetch their algorithm by name on every call (a lookup
// under the library's locks, contended by a worker's fetch threads): the algorithms are fetched
// once per process and each thread keeps its contexts. A context holds the last HMAC key, so
// signing with the day's key re-keys nothing (EVP_MAC_init with no key reuses it).
const EVP_MD* Sha256() {
  static EVP_MD* md = EVP_MD_fetch(nullptr, "SHA256", nullptr);
  return md;
}

struct MacCtx {
  MacCtx() {
    static EVP_MAC* mac = EVP_MAC_fetch(nullptr, "HMAC", nullptr);
    if (mac != nullptr) ctx = EVP_MAC_CTX_new(mac);
  }
  ~MacCtx() { EVP_MAC_CTX_free(ctx); }
  EVP_MAC_CTX* ctx = nullptr;
  std::string key;  // the key ctx holds; empty before the first
};

std::string Hmac(std::string_view key, std::string_view data) {
  thread_local MacCtx m;
  unsigned char out[EVP_MAX_MD_SIZE];
  size_t len = 0;
  bool ok = m.ctx != nullptr;
  if (ok && !m.key.empty() && key == m.key) {
    ok = EVP_MAC_init(m.ctx, nullptr, 0, nullptr) == 1;
  } else if (ok) {
    char digest[] = "SHA256";
    OSSL_PARAM params[] = {OSSL_PARAM_construct_utf8_string(OSSL_MAC_PARAM_DIGEST, digest, 0), OSSL_PARAM_construct_end()};
    ok = EVP_MAC_init(m.ctx, reinterpret_cast<const unsigned char*>(key.data()), key.size(), params) == 1;
    m.key = ok ? std::string(key) : std::string();
  }
  ok = ok && EVP_MAC_update(m.ctx, reinterpret_cast<const unsigned char*>(data.data()), data.size()) == 1 &&
       EVP_MAC_final(m.ctx, out, &len, sizeof out) == 1;
  if (!ok) {  // never expected: OpenSSL without HMAC or SHA-256. A wrong signature the store refuses.
    m.key.clear();
    return std::string();
  }
  return std::string(reinterpret_cast<char*>(out), len);
}

// The signing key, HMAC(HMAC(HMAC(HMAC("AWS4" + secret, date), region), service), "aws4_request"),
// changes once a day: kept per thread for the last (secret, date, region, service), so a request
// costs one HMAC instead of five (each of OpenSSL 3's one-shot HMACs looks its algorithms up by
// name: SigV4 was ~5% of a worker's CPU on cold small files, docs/benchmarks.md session 37).
std::string SigningKey(const std::string& secret, const char* date, const std::string& region,
                       const std::string& service) {
  struct Cached {
    std::string secret, date, region, service, key;
  };
  thread_local Cached c;
  if (c.key.empty() || c.date != date || c.secret != secret || c.region != region || c.service != service) {
    std::string key = Hmac("AWS4" + secret, date);
    key = Hmac(key, region);
    key = Hmac(key, service);
    c = Cached{secret, date, region, service, Hmac(key, "aws4_request")};
  }
  return c.key;
}

std::string Lower(std::string s) {
  for (auto& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

// Trims and folds runs of spaces, as the canonical header value requires.
std::string FoldSpaces(std::string_view v) {
  std::string out;
  bool space = false;
  for (char c : v) {
    if (c == ' ' || c == '\t') {
      space = !out.empty();
      continue;
    }
    if (space) out += ' ';
    space = false;
    out += c;
  }
  return out;
}

}  // namespace

std::string Sha256Hex(std::string_view data) {
  struct Ctx {
    Ctx() : ctx(EVP_MD_CTX_new()) {}
    ~Ctx() { EVP_MD_CTX_free(ctx); }
    EVP_MD_CTX* ctx;
  };
  thread_local Ctx c;
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  if (c.ctx == nullptr || Sha256() == nullptr || EVP_DigestInit_ex2(c.ctx, Sha256(), nullptr) != 1 ||
      EVP_DigestUpdate(c.ctx, data.data(), data.size()) != 1 || EVP_DigestFinal_ex(c.ctx, md, &len) != 1) {
    return std::string();  // never expected (see Hmac)
  }
  return Hex(md, len);
}

std::string AwsUriEncode(std::string_view s, bool keep_slash) {
  static const char kHex[] = "0123456789ABCDEF";
  std::string out;
  out.reserve(s.size());
  for (unsigned char c : s) {
    if (std::isalnum(c) || c == '-' || c == '_' || c == '.' || c == '~' || (keep_slash && c == '/')) {
      out += static_cast<char>(c);
    } else {
      out += '%';
      out += kHex[c >> 4];
      out += kHex[c & 15];
    }
  }
  return out;
}

std::string CanonicalQuery(const HeaderList& query) {
  std::vector<std::pair<std::string, std::string>> enc;
  for (const auto& [k, v] : query) enc.emplace_back(AwsUriEncode(k, false), AwsUriEncode(v, false));
  std::sort(enc.begin(), enc.end());
  std::string out;
  for (const auto& [k, v] : enc) {
    if (!out.empty()) out += '&';
    out += k + "=" + v;
  }
  return out;
}

SigV4Result SignV4(const SigV4Request& req, const AwsCredentials& creds, const std::string& region,
                   const std::string& service, std::time_t now) {
  char amz_date[17], date[9];
  struct tm tm;
  gmtime_r(&now, &tm);
  strftime(amz_date, sizeof amz_date, "%Y%m%dT%H%M%SZ", &tm);
  strftime(date, sizeof date, "%Y%m%d", &tm);
  static const std::string kEmptySha256 = Sha256Hex("");
  const std::string& payload = req.payload_sha256.empty() ? kEmptySha256 : req.payload_sha256;

  SigV4Result r;
  r.headers.emplace_back("host", req.host);
  r.headers.emplace_back("x-amz-content-sha256", payload);
  r.headers.emplace_back("x-amz-date", amz_date);
  if (!creds.session_token.empty()) r.headers.emplace_back("x-amz-security-token", creds.session_token);
  std::vector<std::pair<std::string, std::string>> signed_headers;
  for (const auto& [k, v] : r.headers) signed_headers.emplace_back(k, v);
  for (const auto& [k, v] : req.headers) signed_headers.emplace_back(Lower(k), FoldSpaces(v));
  std::sort(signed_headers.begin(), signed_headers.end());

  std::string canonical_headers, names;
  for (const auto& [k, v] : signed_headers) {
    canonical_headers += k + ":" + v + "\n";
    if (!names.empty()) names += ';';
    names += k;
  }
  r.canonical_request = req.method + "\n" + AwsUriEncode(req.path.empty() ? "/" : req.path, true) + "\n" +
                        CanonicalQuery(req.query) + "\n" + canonical_headers + "\n" + names + "\n" + payload;
  std::string scope = std::string(date) + "/" + region + "/" + service + "/aws4_request";
  r.string_to_sign = "AWS4-HMAC-SHA256\n" + std::string(amz_date) + "\n" + scope + "\n" + Sha256Hex(r.canonical_request);
  std::string sig = Hmac(SigningKey(creds.secret_key, date, region, service), r.string_to_sign);
  r.signature = Hex(reinterpret_cast<const unsigned char*>(sig.data()), sig.size());
  r.headers.emplace_back("authorization", "AWS4-HMAC-SHA256 Credential=" + creds.access_key + "/" + scope +
                                              ", SignedHeaders=" + names + ", Signature=" + r.signature);
  return r;
}

}  // namespace granary
