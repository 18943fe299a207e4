#include "ufs/s3_ufs.h"

#include <spdlog/spdlog.h>

#include <cstdlib>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <random>
#include <set>
#include <thread>

#include "common/backoff.h"
#include "common/fs.h"
#include "common/path.h"
#include "common/tiers.h"
#include "ufs/oss_sign.h"
#include "ufs/s3_xml.h"
#include "common/units.h"

namespace granary {
namespace {

std::string Env(const char* name) {
  const char* v = std::getenv(name);
  return v ? v : "";
}

std::string Trimmed(std::string s) {
  while (!s.empty() && (s.back() == '\n' || s.back() == '\r' || s.back() == ' ')) s.pop_back();
  return s;
}

// Reads [profile] keys from an AWS shared credentials file.
std::map<std::string, std::string> ReadCredentialsFile(const std::string& path, const std::string& profile) {
  std::map<std::string, std::string> out;
  std::ifstream in(path);
  std::string line, section;
  while (std::getline(in, line)) {
    line = Trimmed(line);
    if (line.empty() || line[0] == '#' || line[0] == ';') continue;
    if (line.front() == '[' && line.back() == ']') {
      section = line.substr(1, line.size() - 2);
      continue;
    }
    size_t eq = line.find('=');
    if (section != profile || eq == std::string::npos) continue;
    std::string k = Trimmed(line.substr(0, eq)), v = line.substr(eq + 1);
    while (!k.empty() && k.back() == ' ') k.pop_back();
    while (!v.empty() && v.front() == ' ') v.erase(0, 1);
    out[k] = Trimmed(v);
  }
  return out;
}

bool Retryable(long status) { return status == 429 || status >= 500; }

// Hands `page` to on_page in batches of exactly page_size, keeping the remainder.
Status EmitFullPages(std::vector<UfsEntry>* page, size_t page_size, const UnderFileSystem::PageFn& on_page) {
  size_t done = 0;
  while (page->size() - done >= page_size) {
    std::vector<UfsEntry> batch(std::make_move_iterator(page->begin() + done),
                                std::make_move_iterator(page->begin() + done + page_size));
    RETURN_IF_ERROR(on_page(batch));
    done += page_size;
  }
  page->erase(page->begin(), page->begin() + done);
  return Status::OK();
}

// max_attempts, retry_deadline and max_requests, shared by s3:// and oss://.
Status ApplyRequestOptions(const std::map<std::string, std::string>& options, S3Settings* s) {
  auto rest = options;
  ASSIGN_OR_RETURN(UfsRetry retry, UfsRetry::FromOptions(&rest));  // the contract nfs:// keeps too
  s->max_attempts = retry.max_attempts;
  s->retry_deadline = retry.deadline;
  if (auto it = options.find("max_requests"); it != options.end()) {
    ASSIGN_OR_RETURN(uint64_t n, ParseUint(it->second));
    s->max_requests = static_cast<int>(std::clamp<uint64_t>(n, 1, 1024));
  }
  return Status::OK();
}

}  // namespace

StatusOr<S3Settings> ResolveS3Settings(const std::string& bucket, const std::string& prefix,
                                       const std::map<std::string, std::string>& options) {
  static const std::set<std::string> kKnown = {
      "endpoint",      "region",          "path_style",       "access_key_file", "secret_key_file",
      "session_token_file", "credentials_file", "profile",     "max_attempts",    "retry_deadline",
      "max_requests"};
  RETURN_IF_ERROR(RefuseInlineSecrets(options));
  for (const auto& [k, v] : options) {
    if (!kKnown.count(k)) return InvalidArgumentError("unknown s3 mount option '" + k + "'");
  }
  auto opt = [&](const std::string& k) {
    auto it = options.find(k);
    return it == options.end() ? std::string() : it->second;
  };
  S3Settings s;
  if (bucket.empty()) return InvalidArgumentError("s3:// URIs need a bucket: s3://bucket/prefix");
  s.bucket = bucket;
  s.prefix = prefix;
  while (!s.prefix.empty() && s.prefix.back() == '/') s.prefix.pop_back();
  s.region = opt("region");
  if (s.region.empty()) s.region = Env("AWS_REGION");
  if (s.region.empty()) s.region = Env("AWS_DEFAULT_REGION");
  if (s.region.empty()) s.region = "us-east-1";
  s.endpoint = opt("endpoint");
  if (s.endpoint.empty()) s.endpoint = Env("AWS_ENDPOINT_URL");
  bool custom = !s.endpoint.empty();
  if (!custom) s.endpoint = "https://s3." + s.region + ".amazonaws.com";
  while (!s.endpoint.empty() && s.endpoint.back() == '/') s.endpoint.pop_back();
  if (s.endpoint.rfind("http://", 0) != 0 && s.endpoint.rfind("https://", 0) != 0) {
    return InvalidArgumentError("s3 endpoint '" + s.endpoint + "' must start with http:// or https://");
  }
  s.path_style = custom;
  if (!opt("path_style").empty()) {
    ASSIGN_OR_RETURN(s.path_style, ParseBool(opt("path_style")));
  }
  RETURN_IF_ERROR(ApplyRequestOptions(options, &s));
  // Credentials: option files, environment, shared credentials file (never inline options).
  auto from_file = [&](const std::string& key, std::string* out) -> Status {
    if (!out->empty() || opt(key).empty()) return Status::OK();
    auto data = ReadFileToString(opt(key));
    if (!data.ok()) return data.status().WithContext("s3 option " + key);
    *out = Trimmed(*data);
    return Status::OK();
  };
  RETURN_IF_ERROR(from_file("access_key_file", &s.creds.access_key));
  RETURN_IF_ERROR(from_file("secret_key_file", &s.creds.secret_key));
  RETURN_IF_ERROR(from_file("session_token_file", &s.creds.session_token));
  if (s.creds.access_key.empty()) {
    s.creds.access_key = Env("AWS_ACCESS_KEY_ID");
    s.creds.secret_key = Env("AWS_SECRET_ACCESS_KEY");
    s.creds.session_token = Env("AWS_SESSION_TOKEN");
  }
  if (s.creds.access_key.empty()) {
    std::string file = opt("credentials_file");
    if (file.empty()) file = Env("AWS_SHARED_CREDENTIALS_FILE");
    if (file.empty() && !Env("HOME").empty()) file = Env("HOME") + "/.aws/credentials";
    std::string profile = opt("profile");
    if (profile.empty()) profile = Env("AWS_PROFILE");
    if (profile.empty()) profile = "default";
    auto kv = ReadCredentialsFile(file, profile);
    s.creds.access_key = kv["aws_access_key_id"];
    s.creds.secret_key = kv["aws_secret_access_key"];
    s.creds.session_token = kv["aws_session_token"];
  }
  if (s.creds.access_key.empty() || s.creds.secret_key.empty()) {
    return UnauthenticatedError("no S3 credentials for s3://" + bucket +
                                " (set access_key_file/secret_key_file mount options, AWS_ACCESS_KEY_ID and "
                                "AWS_SECRET_ACCESS_KEY, or ~/.aws/credentials)");
  }
  return s;
}

S3Ufs::S3Ufs(std::string uri, S3Settings s, std::shared_ptr<HttpClient> http)
    : uri_(std::move(uri)), s_(std::move(s)), http_(std::move(http)),
      opened_ns_(static_cast<int64_t>(std::time(nullptr)) * 1'000'000'000) {}

StatusOr<S3Settings> ResolveOssSettings(const std::string& bucket, const std::string& prefix,
                                        const std::map<std::string, std::string>& options) {
  static const std::set<std::string> kKnown = {"fs.oss.endpoint",      "fs.oss.region",       "fs.oss.accessKeyId",
                                               "fs.oss.accessKeySecret", "fs.oss.securityToken", "fs.oss.signatureVersion",
                                               "max_attempts",         "retry_deadline",        "max_requests"};
  RETURN_IF_ERROR(RefuseInlineSecrets(options));
  for (const auto& [k, v] : options) {
    if (!kKnown.count(k)) return InvalidArgumentError("unknown oss mount option '" + k + "'");
  }
  auto opt = [&](const std::string& k, const char* env) {
    auto it = options.find(k);
    return it != options.end() ? it->second : Env(env);
  };
  if (bucket.empty()) return InvalidArgumentError("oss:// URIs need a bucket: oss://bucket/prefix");
  S3Settings s;
  s.bucket = bucket;
  s.prefix = prefix;
  while (!s.prefix.empty() && s.prefix.back() == '/') s.prefix.pop_back();
  std::string version = opt("fs.oss.signatureVersion", "OSS_SIGNATURE_VERSION");
  if (version.empty() || version == "v4" || version == "4") {
    s.signing = S3Settings::Signing::kOssV4;
  } else if (version == "v1" || version == "1") {
    s.signing = S3Settings::Signing::kOssV1;
  } else {
    return InvalidArgumentError("fs.oss.signatureVersion '" + version + "' must be v4 or v1");
  }
  std::string endpoint = opt("fs.oss.endpoint", "OSS_ENDPOINT");
  s.region = opt("fs.oss.region", "OSS_REGION");
  if (endpoint.empty() && s.region.empty()) {
    return InvalidArgumentError("oss://" + bucket + " needs fs.oss.endpoint (e.g. oss-cn-hangzhou.aliyuncs.com)");
  }
  if (endpoint.empty()) endpoint = "oss-" + s.region + ".aliyuncs.com";
  if (endpoint.find("://") == std::string::npos) endpoint = "https://" + endpoint;
  while (!endpoint.empty() && endpoint.back() == '/') endpoint.pop_back();
  s.endpoint = endpoint;
  if (s.region.empty()) {
    // https://oss-cn-hangzhou.aliyuncs.com and oss-cn-hangzhou-internal.aliyuncs.com -> cn-hangzhou
    std::string host = endpoint.substr(endpoint.find("://") + 3);
    host = host.substr(0, host.find('.'));
    if (host.rfind("oss-", 0) == 0) host = host.substr(4);
    if (host.size() > 9 && host.compare(host.size() - 9, 9, "-internal") == 0) host.resize(host.size() - 9);
    s.region = host;
  }
  s.path_style = false;  // OSS serves buckets by host name only
  RETURN_IF_ERROR(ApplyRequestOptions(options, &s));
  // Secrets come by file reference (a mounted Secret; RefuseInlineSecrets refused anything else);
  // the access key id may also be given as it is.
  auto from_file = [&](const std::string& key, const std::string& value, std::string* out) -> Status {
    if (value.empty()) return Status::OK();
    if (value[0] != '/') {
      *out = value;
      return Status::OK();
    }
    auto data = ReadFileToString(value);
    if (!data.ok()) return data.status().WithContext(key);
    *out = Trimmed(*data);
    return Status::OK();
  };
  if (auto it = options.find("fs.oss.accessKeyId"); it != options.end()) {
    RETURN_IF_ERROR(from_file(it->first, it->second, &s.creds.access_key));
  }
  if (auto it = options.find("fs.oss.accessKeySecret"); it != options.end()) {
    RETURN_IF_ERROR(from_file(it->first, it->second, &s.creds.secret_key));
  }
  if (auto it = options.find("fs.oss.securityToken"); it != options.end()) {
    RETURN_IF_ERROR(from_file(it->first, it->second, &s.creds.session_token));
  }
  if (s.creds.access_key.empty()) s.creds.access_key = Env("OSS_ACCESS_KEY_ID");
  if (s.creds.secret_key.empty()) s.creds.secret_key = Env("OSS_ACCESS_KEY_SECRET");
  if (s.creds.session_token.empty()) s.creds.session_token = Env("OSS_SESSION_TOKEN");
  if (s.creds.access_key.empty() || s.creds.secret_key.empty()) {
    return UnauthenticatedError("no OSS credentials for oss://" + bucket +
                                " (set fs.oss.accessKeyId and fs.oss.accessKeySecret=/path/to/secret-file, or "
                                "OSS_ACCESS_KEY_ID and OSS_ACCESS_KEY_SECRET)");
  }
  return s;
}

StatusOr<std::shared_ptr<UnderFileSystem>> S3Ufs::Open(const std::string& uri, S3Settings settings,
                                                       std::shared_ptr<HttpClient> http) {
  if (!http) http = std::make_shared<CurlHttpClient>();
  std::shared_ptr<S3Ufs> ufs(new S3Ufs(RedactUri(uri), std::move(settings), std::move(http)));
  auto root = ufs->Stat("");
  if (!root.ok() && root.status().IsNotFound() && !ufs->s_.prefix.empty()) {
    // A prefix with nothing below it: the bucket and credentials are proven by a one-key listing
    // of the bucket; whether an empty prefix may be mounted is the caller's (a writable mount may).
    ASSIGN_OR_RETURN(HttpResponse r, ufs->Call("GET", "", {{"list-type", "2"}, {"max-keys", "1"}}, {}));
    if (r.status != 200) return ufs->ErrorFor(r, ufs->uri_);
    return std::shared_ptr<UnderFileSystem>(ufs);
  }
  if (!root.ok()) return root.status();
  return std::shared_ptr<UnderFileSystem>(ufs);
}

std::string S3Ufs::KeyOf(const std::string& path) const {
  if (s_.prefix.empty()) return path;
  return path.empty() ? s_.prefix : s_.prefix + "/" + path;
}

StatusOr<HttpResponse> S3Ufs::Call(const std::string& method, const std::string& key, const HeaderList& query,
                                   const HeaderList& headers, const Check& check, char* sink, size_t sink_capacity,
                                   std::string_view body, ReadProgress* progress, uint64_t progress_first) {
  const bool sends_body = method == "PUT" || method == "POST";
  size_t scheme_end = s_.endpoint.find("://") + 3;
  std::string scheme = s_.endpoint.substr(0, scheme_end);
  std::string host = s_.endpoint.substr(scheme_end);
  std::string path;
  if (s_.path_style) {
    path = "/" + s_.bucket + (key.empty() ? "" : "/" + key);
  } else {
    host = s_.bucket + "." + host;
    path = "/" + key;
  }
  std::string url = scheme + host + AwsUriEncode(path, true);
  std::string q = CanonicalQuery(query);
  if (!q.empty()) url += "?" + q;

  const auto start = std::chrono::steady_clock::now();
  const auto deadline = start + s_.retry_deadline;
  Status last = Status::OK();
  Backoff backoff(kUnderStorageRetry);
  for (int attempt = 0; attempt < s_.max_attempts; ++attempt) {
    if (attempt > 0) {
      NoteUfsRetry();
      if (!backoff.SleepBefore(deadline)) break;
    }
    HttpRequest req{method, url, headers, sink, sink_capacity, progress, progress_first, body.data(), body.size()};
    std::time_t now = std::time(nullptr);
    if (s_.signing == S3Settings::Signing::kAwsV4) {
      SigV4Request sreq{method, host, path, query, headers, sends_body ? "UNSIGNED-PAYLOAD" : ""};
      for (auto& h : SignV4(sreq, s_.creds, s_.region, "s3", now).headers) {
        if (h.first != "host") req.headers.push_back(h);
      }
    } else {
      OssRequest oreq{method, s_.bucket, key, query, {}, headers, {}};
      for (const auto& [k, v] : query) {
        if (k == "continuation-token" || k == "uploads" || k == "uploadId" || k == "partNumber") {
          oreq.subresources.emplace_back(k, v);
        }
      }
      HeaderList signed_headers = s_.signing == S3Settings::Signing::kOssV4 ? OssSignV4(oreq, s_.creds, s_.region, now)
                                                                              : OssSignV1(oreq, s_.creds, now);
      req.headers.insert(req.headers.end(), signed_headers.begin(), signed_headers.end());
    }
    StatusOr<HttpResponse> resp = UnavailableError("not sent");
    {
      MutexLock lock(&slots_mu_);
      while (in_flight_ >= s_.max_requests) lock.Wait(&slots_cv_);
      ++in_flight_;
    }
    resp = http_->Send(req);
    {
      MutexLock lock(&slots_mu_);
      --in_flight_;
    }
    slots_cv_.notify_one();
    if (!resp.ok()) {  // the transport's error, named with the request it ended
      last = Status(resp.status().code(), method + " s3://" + s_.bucket + "/" + key + ": " + resp.status().message());
      spdlog::debug("s3 {} s3://{}/{}: attempt {} failed: {}", method, s_.bucket, key, attempt + 1, last.message());
      continue;
    }
    if (Retryable(resp->status)) {
      last = ErrorFor(*resp, method + " s3://" + s_.bucket + "/" + key);
      spdlog::debug("s3 {}: attempt {} got HTTP {}", method, attempt + 1, resp->status);
      continue;
    }
    if (check) {
      Status ok = check(*resp);
      if (!ok.ok()) {
        last = ok;
        spdlog::debug("s3 {}: attempt {}: {}", method, attempt + 1, ok.message());
        continue;
      }
    }
    return resp;
  }
  const auto took = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - start);
  return Status(last.code(), last.message() + " (gave up after retries, " + std::to_string(took.count()) + " ms)");
}

Status S3Ufs::ErrorFor(const HttpResponse& r, const std::string& what) const {
  auto [code, message] = ParseS3Error(r.body);
  std::string detail = "HTTP " + std::to_string(r.status) + (code.empty() ? "" : " " + code) +
                       (message.empty() ? "" : ": " + message);
  if (r.status == 403) {
    return PermissionDeniedError(what + ": access denied (" + detail +
                                 "); check the access key, secret key and the bucket's permissions");
  }
  if (r.status == 404) {
    if (code == "NoSuchBucket") return NotFoundError("bucket '" + s_.bucket + "' does not exist (" + detail + ")");
    return NotFoundError(what + ": not found (" + detail + ")");
  }
  if (r.status == 412) return VersionChangedError(what + " changed in the under-storage since it was listed");
  if (Retryable(r.status)) return UnavailableError(what + ": " + detail);
  return InternalError(what + ": unexpected " + detail);
}

StatusOr<S3ListPage> S3Ufs::ParsePage(const HttpResponse& r, const std::string& list_prefix,
                                      const std::string& token) const {
  const std::string where = "list s3://" + s_.bucket + "/" + list_prefix;
  auto page = ParseS3ListPage(r.body);
  if (!page.ok()) return InternalError(where + ": " + page.status().message());
  if (page->skipped > 0) {
    spdlog::warn("{}: skipped {} object(s) whose key or size the answer gave malformed", where, page->skipped);
  }
  // A store that names the token it was asked with would be followed forever.
  if (page->truncated && page->next_token == token) {
    return InternalError(where + ": the answer names the continuation token it was asked with; the listing would "
                         "not end");
  }
  // Keys outside the prefix asked for are not ours to show (a misbehaving store or proxy).
  auto outside = [&](const std::string& key) { return key.compare(0, list_prefix.size(), list_prefix) != 0; };
  size_t before = page->objects.size() + page->prefixes.size();
  std::erase_if(page->objects, [&](const S3ListedObject& o) { return outside(o.key); });
  std::erase_if(page->prefixes, outside);
  if (size_t dropped = before - page->objects.size() - page->prefixes.size(); dropped > 0) {
    spdlog::warn("{}: skipped {} key(s) outside the prefix asked for", where, dropped);
  }
  return page;
}

StatusOr<bool> S3Ufs::HasChildren(const std::string& key_prefix) {
  ASSIGN_OR_RETURN(HttpResponse r, Call("GET", "", {{"list-type", "2"}, {"prefix", key_prefix}, {"max-keys", "1"}}, {}));
  if (r.status != 200) return ErrorFor(r, "list s3://" + s_.bucket + "/" + key_prefix);
  // As a listing reads it: a key outside the prefix asked for is no child. (No token was sent, and
  // a truncated answer always names one: ParseS3ListPage refuses it otherwise.)
  ASSIGN_OR_RETURN(S3ListPage page, ParsePage(r, key_prefix, ""));
  return !page.objects.empty() || !page.prefixes.empty() || page.skipped > 0;
}

StatusOr<UfsEntry> S3Ufs::Stat(const std::string& path) {
  UfsEntry dir;
  dir.is_dir = true;
  dir.mode = 0555;
  dir.mtime_ns = opened_ns_;
  dir.name = path.substr(path.rfind('/') + 1);
  std::string key = KeyOf(path);
  if (key.empty()) {
    // A one-key listing proves the bucket exists and the credentials work (S3 and OSS alike).
    ASSIGN_OR_RETURN(HttpResponse r, Call("GET", "", {{"list-type", "2"}, {"max-keys", "1"}}, {}));
    if (r.status != 200) return ErrorFor(r, uri_);
    return dir;
  }
  if (!path.empty()) {
    ASSIGN_OR_RETURN(HttpResponse r, Call("HEAD", key, {}, {}));
    if (r.status == 200) {
      UfsEntry f;
      f.name = dir.name;
      f.size = std::strtoull(r.Header("content-length").c_str(), nullptr, 10);
      f.mtime_ns = ParseS3TimeNs(r.Header("last-modified"));
      f.mode = 0444;
      f.version = r.Header("etag");
      return f;
    }
    if (r.status != 404) return ErrorFor(r, "s3://" + s_.bucket + "/" + key);
  }
  ASSIGN_OR_RETURN(bool has, HasChildren(key + "/"));
  if (!has) return NotFoundError("s3://" + s_.bucket + "/" + key + " does not exist");
  return dir;
}

Status S3Ufs::List(const std::string& dir, size_t page_size, const PageFn& on_page) {
  std::string base = KeyOf(dir);
  std::string list_prefix = base.empty() ? "" : base + "/";
  std::string token;
  // Files held back until the listing has passed "<name>/", where a directory of the same name
  // would appear (keys come sorted; the directory wins).
  std::vector<UfsEntry> pending, page;
  auto flush_pending_before = [&](const std::string& key_name) {
    while (!pending.empty() && (key_name.empty() || pending.front().name + "/" < key_name)) {
      page.push_back(std::move(pending.front()));
      pending.erase(pending.begin());
    }
  };
  do {
    HeaderList q = {{"list-type", "2"}, {"delimiter", "/"}, {"prefix", list_prefix},
                    {"max-keys", std::to_string(std::clamp<size_t>(page_size, 1, 1000))}};
    if (!token.empty()) q.push_back({"continuation-token", token});
    ASSIGN_OR_RETURN(HttpResponse r, Call("GET", "", q, {}));
    if (r.status != 200) return ErrorFor(r, "list s3://" + s_.bucket + "/" + list_prefix);
    ASSIGN_OR_RETURN(S3ListPage listed, ParsePage(r, list_prefix, token));
    // Merge files and common prefixes back into key order.
    std::vector<std::pair<std::string, UfsEntry>> items;
    for (S3ListedObject& o : listed.objects) {
      UfsEntry e;
      e.name = o.key.substr(list_prefix.size());
      e.size = o.size;
      e.mtime_ns = o.mtime_ns;
      e.mode = 0444;
      e.version = std::move(o.etag);
      items.emplace_back(std::move(o.key), std::move(e));
    }
    for (std::string& key : listed.prefixes) {
      UfsEntry e;
      e.is_dir = true;
      e.mode = 0555;
      e.mtime_ns = opened_ns_;
      e.name = key.substr(list_prefix.size());
      if (!e.name.empty() && e.name.back() == '/') e.name.pop_back();
      items.emplace_back(std::move(key), std::move(e));
    }
    std::sort(items.begin(), items.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
    for (auto& [key, e] : items) {
      if (!e.is_dir && e.name.empty()) continue;  // the "dir/" marker object itself
      if (!IsValidName(e.name)) {
        spdlog::warn("skipping s3 key under {} whose name cannot be a file name ({} bytes)", list_prefix, key.size());
        continue;
      }
      flush_pending_before(e.name);
      if (e.is_dir) {
        for (auto it = pending.begin(); it != pending.end(); ++it) {
          if (it->name == e.name) {
            spdlog::warn("s3 object {}{} is hidden by the directory of the same name", list_prefix, e.name);
            pending.erase(it);
            break;
          }
        }
        page.push_back(std::move(e));
      } else {
        pending.push_back(std::move(e));
      }
    }
    RETURN_IF_ERROR(EmitFullPages(&page, page_size, on_page));
    token = listed.next_token;
  } while (!token.empty());
  flush_pending_before("");
  RETURN_IF_ERROR(EmitFullPages(&page, page_size, on_page));
  if (!page.empty()) RETURN_IF_ERROR(on_page(page));
  return Status::OK();
}

Status S3Ufs::ListTree(const std::string& dir, size_t page_size, const PageFn& on_page, const std::string& after) {
  // One flat listing (no delimiter): 1000 objects per request however the keys nest. Keys come
  // sorted, so everything below a "directory" is contiguous, as ListTree promises.
  std::string base = KeyOf(dir);
  std::string list_prefix = base.empty() ? "" : base + "/";
  std::string token;
  std::vector<UfsEntry> page;  // in key order
  // Files that a directory of the same name may still hide ("x" before "x/..."; the directory
  // wins, as in List): they and what follows them are passed on only once the listing is past
  // where that directory would be, so pages stay in key order and a checkpoint never skips one.
  std::vector<std::string> held;
  auto settle = [&](const UfsEntry& e) {
    for (auto it = held.begin(); it != held.end();) {
      const std::string& f = *it;
      if (PathWithin(e.name, f)) {  // the directory "f" itself (its marker), or a key below it
        spdlog::warn("s3 object {}{} is hidden by the directory of the same name", list_prefix, f);
        for (auto p = page.begin(); p != page.end(); ++p) {
          if (!p->is_dir && p->name == f) {
            page.erase(p);
            break;
          }
        }
        it = held.erase(it);
      } else if (e.name > f + "/") {
        it = held.erase(it);  // past every key below "f/"
      } else {
        ++it;
      }
    }
  };
  auto emit_ready = [&](bool all) -> Status {
    size_t ready = page.size();
    if (!held.empty()) {
      for (size_t i = 0; i < page.size(); ++i) {
        if (!page[i].is_dir && page[i].name == held.front()) {
          ready = i;
          break;
        }
      }
    }
    size_t done = 0;
    while (ready - done >= page_size || (all && ready > done)) {
      size_t n = std::min(page_size, ready - done);
      std::vector<UfsEntry> batch(std::make_move_iterator(page.begin() + static_cast<long>(done)),
                                  std::make_move_iterator(page.begin() + static_cast<long>(done + n)));
      RETURN_IF_ERROR(on_page(batch));
      done += n;
    }
    page.erase(page.begin(), page.begin() + static_cast<long>(done));
    return Status::OK();
  };
  do {
    HeaderList q = {{"list-type", "2"}, {"prefix", list_prefix},
                    {"max-keys", std::to_string(std::clamp<size_t>(page_size, 1, 1000))}};
    if (!token.empty()) q.push_back({"continuation-token", token});
    // The checkpoint is the key passed last (a directory marker's with its '/'): keys sort byte by
    // byte, so the listing goes on exactly after it.
    if (token.empty() && !after.empty()) q.push_back({"start-after", list_prefix + after});
    ASSIGN_OR_RETURN(HttpResponse r, Call("GET", "", q, {}));
    if (r.status != 200) return ErrorFor(r, "list s3://" + s_.bucket + "/" + list_prefix);
    ASSIGN_OR_RETURN(S3ListPage listed, ParsePage(r, list_prefix, token));
    for (S3ListedObject& o : listed.objects) {
      UfsEntry e;
      e.name = o.key.substr(list_prefix.size());
      if (e.name.empty()) continue;  // the "dir/" marker of the listed directory itself
      if (e.name.back() == '/') {    // a directory marker
        e.name.pop_back();
        e.is_dir = true;
        e.mode = 0555;
        e.mtime_ns = opened_ns_;
      } else {
        e.size = o.size;
        e.mtime_ns = o.mtime_ns;
        e.mode = 0444;
        e.version = std::move(o.etag);
      }
      settle(e);
      if (!e.is_dir) held.push_back(e.name);
      page.push_back(std::move(e));
    }
    RETURN_IF_ERROR(emit_ready(false));
    token = listed.next_token;
  } while (!token.empty());
  held.clear();  // nothing is left to hide them
  return emit_ready(true);
}

StatusOr<size_t> S3Ufs::Read(const std::string& path, const std::string& version, uint64_t offset, size_t length,
                             char* out) {
  return ReadStreaming(path, version, offset, length, out, nullptr);
}

StatusOr<size_t> S3Ufs::ReadStreaming(const std::string& path, const std::string& version, uint64_t offset,
                                      size_t length, char* out, ReadProgress* progress) {
  return Get(path, version, offset, length, out, progress, false);
}

StatusOr<size_t> S3Ufs::ReadWhole(const std::string& path, const std::string& version, size_t size, char* out,
                                  ReadProgress* progress) {
  return Get(path, version, 0, size, out, progress, true);
}

StatusOr<size_t> S3Ufs::Get(const std::string& path, const std::string& version, uint64_t offset, size_t length,
                            char* out, ReadProgress* progress, bool whole_object) {
  if (length == 0) return size_t{0};
  std::string key = KeyOf(path);
  HeaderList headers = {{"If-Match", version}};
  if (!whole_object) {
    headers.insert(headers.begin(),
                   {"Range", "bytes=" + std::to_string(offset) + "-" + std::to_string(offset + length - 1)});
  }
  // A 206 must carry exactly the bytes its Content-Range announces, and a whole object's 200
  // exactly its listed size; anything shorter was cut in transit and is fetched again, never
  // returned as data.
  auto complete = [&](const HttpResponse& r) -> Status {
    if (whole_object && r.status == 200 && r.BodySize() != length) {
      return UnavailableError("s3 GET " + key + ": body of " + std::to_string(r.BodySize()) + " bytes, not the " +
                              std::to_string(length) + " listed");
    }
    if (r.status != 206) return Status::OK();
    const std::string cr = r.Header("content-range");  // "bytes FIRST-LAST/TOTAL"
    unsigned long long first = 0, last = 0;
    if (std::sscanf(cr.c_str(), "bytes %llu-%llu", &first, &last) != 2 || first != offset || last < first) {
      return UnavailableError("s3 GET " + key + ": unexpected Content-Range '" + cr + "'");
    }
    if (r.BodySize() != last - first + 1) {
      return UnavailableError("s3 GET " + key + ": body cut short (" + std::to_string(r.BodySize()) + " of " +
                              std::to_string(last - first + 1) + " bytes)");
    }
    return Status::OK();
  };
  // The body lands in `out` itself (the block's buffer): no copy, no growing string.
  ASSIGN_OR_RETURN(HttpResponse r, Call("GET", key, {}, headers, complete, out, length, {}, progress, offset));
  if (r.status == 416) return size_t{0};  // at or past the end
  if (r.status != 206 && r.status != 200) return ErrorFor(r, "s3://" + s_.bucket + "/" + key);
  if (r.status == 200 && offset != 0) return InternalError("s3 ignored the Range header for " + key);
  // A client that ignored the sink (a test's) left the bytes in body.
  if (r.sunk < length && !r.body.empty()) std::memcpy(out + r.sunk, r.body.data(), std::min(length - r.sunk, r.body.size()));
  return std::min(length, r.BodySize());
}

// ---- writes ----

namespace {
std::string XmlEscape(const std::string& in) {
  std::string out;
  for (char c : in) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      default: out += c;
    }
  }
  return out;
}
}  // namespace

// One object being written: bytes gather into a part; full parts upload on threads of their own
// (at most kPartsInFlight at once) while the writer appends.
class S3Writer : public UfsWriter {
 public:
  S3Writer(S3Ufs* fs, std::string path) : fs_(fs), path_(std::move(path)), key_(fs->KeyOf(path_)) {}
  ~S3Writer() override { Abort(); }

  Status Append(std::string_view data) override {
    if (done_) return FailedPreconditionError("write to " + Where() + " after it was committed or aborted");
    while (!data.empty()) {
      size_t k = std::min(data.size(), S3Ufs::kPartSize - buf_.size());
      buf_.append(data.data(), k);
      data.remove_prefix(k);
      written_ += k;
      if (buf_.size() == S3Ufs::kPartSize) RETURN_IF_ERROR(SendPart());
    }
    return Status::OK();
  }

  StatusOr<UfsEntry> Commit() override {
    if (done_) return FailedPreconditionError("commit of " + Where() + " after it was committed or aborted");
    std::string etag;
    if (upload_id_.empty()) {  // smaller than a part: one PUT
      ASSIGN_OR_RETURN(HttpResponse r, fs_->Call("PUT", key_, {}, {{"Content-Type", "application/octet-stream"}},
                                                 nullptr, nullptr, 0, buf_));
      if (r.status != 200) return fs_->ErrorFor(r, "put " + Where());
      etag = r.Header("etag");
    } else {
      if (!buf_.empty()) RETURN_IF_ERROR(SendPart());
      RETURN_IF_ERROR(WaitParts(0));
      std::string xml = "<CompleteMultipartUpload>";
      {
        MutexLock l(&mu_);  // every part's thread has ended; the analysis wants it said
        for (size_t i = 0; i < etags_.size(); ++i) {
          xml += "<Part><PartNumber>" + std::to_string(i + 1) + "</PartNumber><ETag>" + XmlEscape(etags_[i]) +
                 "</ETag></Part>";
        }
      }
      xml += "</CompleteMultipartUpload>";
      ASSIGN_OR_RETURN(HttpResponse r, fs_->Call("POST", key_, {{"uploadId", upload_id_}},
                                                 {{"Content-Type", "application/xml"}}, nullptr, nullptr, 0, xml));
      if (r.status != 200) return fs_->ErrorFor(r, "complete the upload of " + Where());
      // A 200 may still carry an error document (the completion failed after it began).
      auto completed = ParseS3CompleteUpload(r.body);
      if (!completed.ok()) {
        return Status(completed.status().code(), "complete the upload of " + Where() + ": " + completed.status().message());
      }
      etag = *completed;
    }
    done_ = true;
    upload_id_.clear();
    buf_.clear();
    // The entry of what this writer stored: its own ETag and byte count (a Stat could see another
    // writer's object that replaced it since); the time from a Stat when it is still ours.
    UfsEntry e;
    e.name = path_.substr(path_.rfind('/') + 1);
    e.size = written_;
    e.mode = 0444;
    e.version = etag;
    auto st = fs_->Stat(path_);
    if (st.ok() && !st->is_dir && (etag.empty() || st->version == etag)) return *st;
    if (etag.empty() && !st.ok()) return st.status();
    if (etag.empty()) return DataLossError("the store did not name the version it stored of " + Where());
    e.mtime_ns = std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::system_clock::now().time_since_epoch()).count();
    return e;
  }

  void Abort() override {
    if (done_) return;
    done_ = true;
    (void)WaitParts(0);
    if (upload_id_.empty()) return;
    auto r = fs_->Call("DELETE", key_, {{"uploadId", upload_id_}}, {});
    if (!r.ok() || (r->status != 204 && r->status != 200 && r->status != 404)) {
      spdlog::warn("could not abort the multipart upload of {}: {} (the bucket's lifecycle rule for incomplete "
                   "uploads removes it)", Where(), r.ok() ? "HTTP " + std::to_string(r->status) : r.status().message());
    }
    upload_id_.clear();
  }

 private:
  std::string Where() const { return "s3://" + fs_->s_.bucket + "/" + key_; }

  Status Begin() {
    ASSIGN_OR_RETURN(HttpResponse r, fs_->Call("POST", key_, {{"uploads", ""}},
                                               {{"Content-Type", "application/octet-stream"}}));
    if (r.status != 200) return fs_->ErrorFor(r, "start an upload of " + Where());
    auto id = ParseS3UploadId(r.body);
    if (!id.ok()) return InternalError("start an upload of " + Where() + ": " + id.status().message());
    upload_id_ = std::move(*id);
    return Status::OK();
  }

  // Hands the gathered part to a thread of its own.
  Status SendPart() {
    if (upload_id_.empty()) RETURN_IF_ERROR(Begin());
    RETURN_IF_ERROR(WaitParts(S3Ufs::kPartsInFlight - 1));
    size_t number;
    {
      MutexLock l(&mu_);  // the part threads write their slots under mu_
      number = etags_.size() + 1;
      etags_.emplace_back();
    }
    auto part = std::make_shared<std::string>(std::move(buf_));
    buf_.clear();
    buf_.reserve(S3Ufs::kPartSize);
    in_flight_.push_back(std::thread([this, part, number] {
      auto r = fs_->Call("PUT", key_, {{"partNumber", std::to_string(number)}, {"uploadId", upload_id_}},
                         {{"Content-Type", "application/octet-stream"}}, nullptr, nullptr, 0, *part);
      Status st = r.ok() ? Status::OK() : r.status();
      if (st.ok() && r->status != 200) st = fs_->ErrorFor(*r, "upload part " + std::to_string(number) + " of " + Where());
      MutexLock l(&mu_);
      if (st.ok()) {
        etags_[number - 1] = r->Header("etag");
      } else if (failed_.ok()) {
        failed_ = st;
      }
    }));
    return Status::OK();
  }

  // Waits until at most `keep` parts are uploading; the first failure of any part.
  Status WaitParts(size_t keep) {
    while (in_flight_.size() > keep) {
      in_flight_.front().join();
      in_flight_.erase(in_flight_.begin());
    }
    MutexLock l(&mu_);
    return failed_;
  }

  S3Ufs* const fs_;
  const std::string path_, key_;
  std::string buf_;
  std::string upload_id_;
  Mutex mu_;
  std::vector<std::string> etags_ GUARDED_BY(mu_);  // by part number - 1; written by the part's thread
  std::vector<std::thread> in_flight_;
  Status failed_ GUARDED_BY(mu_);
  bool done_ = false;
  uint64_t written_ = 0;  // bytes appended
};

StatusOr<std::unique_ptr<UfsWriter>> S3Ufs::Create(const std::string& path, uint32_t, const WriteCaller&) {
  RETURN_IF_ERROR(CheckRelativePath(path));
  if (path.empty()) return InvalidArgumentError("cannot write the mount's root directory as a file");
  return std::unique_ptr<UfsWriter>(new S3Writer(this, path));
}

Status S3Ufs::Remove(const std::string& path, const WriteCaller&) {
  RETURN_IF_ERROR(CheckRelativePath(path));
  std::string key = KeyOf(path);
  ASSIGN_OR_RETURN(HttpResponse r, Call("DELETE", key, {}, {}));
  if (r.status != 204 && r.status != 200) return ErrorFor(r, "delete s3://" + s_.bucket + "/" + key);
  return Status::OK();
}

Status S3Ufs::MakeDir(const std::string& path, uint32_t, const WriteCaller&) {
  RETURN_IF_ERROR(CheckRelativePath(path));
  std::string key = KeyOf(path);
  auto st = Stat(path);
  if (st.ok()) return AlreadyExistsError("s3://" + s_.bucket + "/" + key + " exists");
  if (st.status().code() != Code::kNotFound) return st.status();
  ASSIGN_OR_RETURN(HttpResponse r, Call("PUT", key + "/", {}, {{"Content-Type", "application/x-directory"}}));
  if (r.status != 200) return ErrorFor(r, "make directory s3://" + s_.bucket + "/" + key + "/");
  return Status::OK();
}

Status S3Ufs::RemoveDir(const std::string& path, const WriteCaller&) {
  RETURN_IF_ERROR(CheckRelativePath(path));
  if (path.empty()) return InvalidArgumentError("cannot remove the mount's root directory");
  std::string prefix = KeyOf(path) + "/";
  ASSIGN_OR_RETURN(HttpResponse r, Call("GET", "", {{"list-type", "2"}, {"prefix", prefix}, {"max-keys", "2"}}, {}));
  if (r.status != 200) return ErrorFor(r, "list s3://" + s_.bucket + "/" + prefix);
  auto listed = ParseS3ListPage(r.body);
  if (!listed.ok()) return InternalError("list s3://" + s_.bucket + "/" + prefix + ": " + listed.status().message());
  for (const S3ListedObject& o : listed->objects) {
    if (o.key != prefix) return NotEmptyError("s3://" + s_.bucket + "/" + prefix + " is not empty");
  }
  if (listed->skipped > 0) return NotEmptyError("s3://" + s_.bucket + "/" + prefix + " is not empty");
  ASSIGN_OR_RETURN(HttpResponse d, Call("DELETE", prefix, {}, {}));
  if (d.status != 204 && d.status != 200) return ErrorFor(d, "delete s3://" + s_.bucket + "/" + prefix);
  return Status::OK();
}

Status S3Ufs::Rename(const std::string& from, const std::string& to, const WriteCaller&) {
  RETURN_IF_ERROR(CheckRelativePath(from));
  RETURN_IF_ERROR(CheckRelativePath(to));
  ASSIGN_OR_RETURN(UfsEntry e, Stat(from));
  if (e.is_dir) {
    return NotSupportedError("cannot rename directory " + from + ": an object store has no directories to rename at "
                             "once (copy the files, then remove the old ones)");
  }
  if (e.size > (5ull << 30)) {
    return NotSupportedError("cannot rename " + from + ": objects over 5 GiB cannot be copied in one request; "
                             "write the file under its new name instead");
  }
  std::string src = KeyOf(from), dst = KeyOf(to);
  const bool oss = s_.signing != S3Settings::Signing::kAwsV4;
  std::string source = AwsUriEncode("/" + s_.bucket + "/" + src, true);
  ASSIGN_OR_RETURN(HttpResponse r, Call("PUT", dst, {}, {{oss ? "x-oss-copy-source" : "x-amz-copy-source", source}}));
  if (r.status != 200 || r.body.find("<Error>") != std::string::npos) {
    return ErrorFor(r, "copy s3://" + s_.bucket + "/" + src + " to " + dst);
  }
  return Remove(from, WriteCaller());
}

}  // namespace granary
