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
  // Built by appending into reserved strings: a request is signed for every GET of a cold epoch,
  // and the temporaries of operator+ and strftime were most of SignV4's CPU once OpenSSL's lookups
  // were gone (docs/benchmarks.md, session 38).
  struct tm tm;
  gmtime_r(&now, &tm);
  char amz_date[17];  // YYYYMMDDTHHMMSSZ
  {
    auto put = [](char* p, int v, int digits) {
      for (int i = digits - 1; i >= 0; --i, v /= 10) p[i] = static_cast<char>('0' + v % 10);
    };
    put(amz_date, tm.tm_year + 1900, 4);
    put(amz_date + 4, tm.tm_mon + 1, 2);
    put(amz_date + 6, tm.tm_mday, 2);
    amz_date[8] = 'T';
    put(amz_date + 9, tm.tm_hour, 2);
    put(amz_date + 11, tm.tm_min, 2);
    put(amz_date + 13, tm.tm_sec, 2);
    amz_date[15] = 'Z';
    amz_date[16] = '\0';
  }
  const std::string_view date(amz_date, 8);
  static const std::string kEmptySha256 = Sha256Hex("");
  const std::string& payload = req.payload_sha256.empty() ? kEmptySha256 : req.payload_sha256;

  SigV4Result r;
  r.headers.reserve(5);
  r.headers.emplace_back("host", req.host);
  r.headers.emplace_back("x-amz-content-sha256", payload);
  r.headers.emplace_back("x-amz-date", amz_date);
  if (!creds.session_token.empty()) r.headers.emplace_back("x-amz-security-token", creds.session_token);
  // The signed headers: ours as they are, the caller's lower-cased and folded (kept in `extra`).
  std::vector<std::pair<std::string, std::string>> extra;
  extra.reserve(req.headers.size());
  for (const auto& [k, v] : req.headers) extra.emplace_back(Lower(k), FoldSpaces(v));
  std::vector<std::pair<std::string_view, std::string_view>> signed_headers;
  signed_headers.reserve(r.headers.size() + extra.size());
  for (const auto& [k, v] : r.headers) signed_headers.emplace_back(k, v);
  for (const auto& [k, v] : extra) signed_headers.emplace_back(k, v);
  std::sort(signed_headers.begin(), signed_headers.end());

  std::string names;
  names.reserve(96);
  for (const auto& h : signed_headers) {
    if (!names.empty()) names += ';';
    names += h.first;
  }
  std::string& cr = r.canonical_request;
  cr.reserve(256 + req.path.size() * 3 + payload.size());
  cr += req.method;
  cr += '\n';
  cr += AwsUriEncode(req.path.empty() ? "/" : req.path, true);
  cr += '\n';
  if (!req.query.empty()) cr += CanonicalQuery(req.query);
  cr += '\n';
  for (const auto& [k, v] : signed_headers) {
    cr += k;
    cr += ':';
    cr += v;
    cr += '\n';
  }
  cr += '\n';
  cr += names;
  cr += '\n';
  cr += payload;

  std::string scope;
  scope.reserve(date.size() + region.size() + service.size() + 16);
  scope.append(date).append("/").append(region).append("/").append(service).append("/aws4_request");
  std::string& sts = r.string_to_sign;
  sts.reserve(32 + 16 + scope.size() + 64);
  sts.append("AWS4-HMAC-SHA256\n").append(amz_date).append("\n").append(scope).append("\n").append(Sha256Hex(cr));
  const std::string day(date);
  std::string sig = Hmac(SigningKey(creds.secret_key, day.c_str(), region, service), sts);
  r.signature = Hex(reinterpret_cast<const unsigned char*>(sig.data()), sig.size());
  std::string auth;
  auth.reserve(64 + creds.access_key.size() + scope.size() + names.size() + r.signature.size());
  auth.append("AWS4-HMAC-SHA256 Credential=").append(creds.access_key).append("/").append(scope);
  auth.append(", SignedHeaders=").append(names).append(", Signature=").append(r.signature);
  r.headers.emplace_back("authorization", std::move(auth));
  return r;
}

}  // namespace granary
