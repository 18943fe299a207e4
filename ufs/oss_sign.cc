#include "ufs/oss_sign.h"

#include <openssl/evp.h>
#include <openssl/hmac.h>

#include <algorithm>
#include <cctype>
#include <map>
#include <set>

namespace granary {
namespace {

std::string Hmac(const EVP_MD* md, std::string_view key, std::string_view data) {
  unsigned char out[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  HMAC(md, key.data(), static_cast<int>(key.size()), reinterpret_cast<const unsigned char*>(data.data()), data.size(),
       out, &len);
  return std::string(reinterpret_cast<char*>(out), len);
}

std::string Hex(const std::string& s) {
  static const char kHex[] = "0123456789abcdef";
  std::string out;
  for (unsigned char c : s) {
    out += kHex[c >> 4];
    out += kHex[c & 15];
  }
  return out;
}

std::string Base64(const std::string& s) {
  std::string out(4 * ((s.size() + 2) / 3) + 1, '\0');
  int n = EVP_EncodeBlock(reinterpret_cast<unsigned char*>(out.data()), reinterpret_cast<const unsigned char*>(s.data()),
                          static_cast<int>(s.size()));
  out.resize(static_cast<size_t>(n));
  return out;
}

std::string Lower(std::string s) {
  for (auto& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

std::string Trim(std::string s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.pop_back();
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front()))) s.erase(0, 1);
  return s;
}

// Lower-cased name -> trimmed value of every header the request will carry.
std::map<std::string, std::string> AllHeaders(const HeaderList& a, const HeaderList& b) {
  std::map<std::string, std::string> m;
  for (const auto& [k, v] : a) m[Lower(k)] = Trim(v);
  for (const auto& [k, v] : b) m[Lower(k)] = Trim(v);
  return m;
}

}  // namespace

HeaderList OssSignV4(const OssRequest& req, const AwsCredentials& creds, const std::string& region, std::time_t now) {
  char stamp[17], date[9];
  struct tm tm;
  gmtime_r(&now, &tm);
  strftime(stamp, sizeof stamp, "%Y%m%dT%H%M%SZ", &tm);
  strftime(date, sizeof date, "%Y%m%d", &tm);
  HeaderList added = {{"x-oss-content-sha256", "UNSIGNED-PAYLOAD"}, {"x-oss-date", stamp}};
  if (!creds.session_token.empty()) added.emplace_back("x-oss-security-token", creds.session_token);
  auto headers = AllHeaders(req.headers, added);

  std::set<std::string> additional;
  for (const auto& [name, unused] : req.additional) {
    std::string n = Lower(name);
    if (n != "content-type" && n != "content-md5" && n.rfind("x-oss-", 0) != 0) additional.insert(n);
  }
  std::set<std::string> signed_names(additional);
  for (const auto& [k, v] : headers) {
    if (k == "content-type" || k == "content-md5" || k.rfind("x-oss-", 0) == 0) signed_names.insert(k);
  }
  std::string canonical_headers;
  for (const auto& k : signed_names) canonical_headers += k + ":" + headers[k] + "\n";
  std::string additional_list;
  for (const auto& k : additional) additional_list += (additional_list.empty() ? "" : ";") + k;

  std::string uri = "/" + (req.bucket.empty() ? "" : req.bucket + "/") + req.key;
  std::string canonical = req.method + "\n" + AwsUriEncode(uri, true) + "\n" + CanonicalQuery(req.query) + "\n" +
                          canonical_headers + "\n" + additional_list + "\nUNSIGNED-PAYLOAD";
  std::string scope = std::string(date) + "/" + region + "/oss/aliyun_v4_request";
  std::string to_sign = "OSS4-HMAC-SHA256\n" + std::string(stamp) + "\n" + scope + "\n" + Sha256Hex(canonical);
  std::string key = Hmac(EVP_sha256(), "aliyun_v4" + creds.secret_key, date);
  key = Hmac(EVP_sha256(), key, region);
  key = Hmac(EVP_sha256(), key, "oss");
  key = Hmac(EVP_sha256(), key, "aliyun_v4_request");
  std::string sig = Hex(Hmac(EVP_sha256(), key, to_sign));
  added.emplace_back("authorization", "OSS4-HMAC-SHA256 Credential=" + creds.access_key + "/" + scope + "," +
                                          (additional_list.empty() ? "" : "AdditionalHeaders=" + additional_list + ",") +
                                          "Signature=" + sig);
  return added;
}

HeaderList OssSignV1(const OssRequest& req, const AwsCredentials& creds, std::time_t now) {
  char when[64];
  struct tm tm;
  gmtime_r(&now, &tm);
  strftime(when, sizeof when, "%a, %d %b %Y %H:%M:%S GMT", &tm);
  HeaderList added = {{"x-oss-date", when}};
  if (!creds.session_token.empty()) added.emplace_back("x-oss-security-token", creds.session_token);
  auto headers = AllHeaders(req.headers, added);
  std::string s = req.method + "\n" + headers["content-md5"] + "\n" + headers["content-type"] + "\n" + when + "\n";
  for (const auto& [k, v] : headers) {
    if (k.rfind("x-oss-", 0) == 0) s += k + ":" + v + "\n";
  }
  std::string resource = "/" + (req.bucket.empty() ? "" : req.bucket + "/") + req.key;
  std::vector<std::pair<std::string, std::string>> sub(req.subresources.begin(), req.subresources.end());
  std::sort(sub.begin(), sub.end());
  char sep = '?';
  for (const auto& [k, v] : sub) {
    resource += sep + k + (v.empty() ? "" : "=" + v);
    sep = '&';
  }
  s += resource;
  added.emplace_back("authorization", "OSS " + creds.access_key + ":" + Base64(Hmac(EVP_sha1(), creds.secret_key, s)));
  return added;
}

}  // namespace granary
