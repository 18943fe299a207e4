// S3Ufs: `s3://bucket/prefix` as under-storage, over the S3 REST API (ListObjectsV2, HeadObject,
// ranged GetObject), signed with SigV4 (sigv4.h), sent through an HttpClient (http.h).
//
// Mapping: the mount's path "a/b.jpg" is the object key "<prefix>/a/b.jpg". Directories are the
// common prefixes of a delimiter listing, so levels holding no object directly still appear. A
// file's version is its ETag; reads carry `If-Match: <ETag>`, so an object rewritten since it was
// listed fails with FAILED_PRECONDITION instead of mixing versions. Keys whose name at some level
// cannot be a file name (empty from "//", ".", "..", over 255 bytes) are skipped with a warning.
// An object "a" beside objects under "a/": the directory wins and the object is skipped (logged).
//
// Settings (mount options, then environment, then the shared credentials file):
//   endpoint        http(s)://host[:port]   AWS_ENDPOINT_URL; default https://s3.<region>.amazonaws.com
//   region          us-east-1               AWS_REGION, AWS_DEFAULT_REGION
//   path_style      true with a custom endpoint, else false (virtual-hosted: bucket.host)
//   access_key_file, secret_key_file, session_token_file  (files, e.g. a mounted Kubernetes Secret)
//                                           AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN
//   (inline access_key / secret_key / session_token are refused: RefuseInlineSecrets, common/tiers.h)
//   credentials_file, profile               AWS_SHARED_CREDENTIALS_FILE (~/.aws/credentials), AWS_PROFILE
//   max_attempts (5), retry_deadline (20s), max_requests (32: requests in flight at once; each
//   keeps its connection alive for reuse)
// Retries: transport errors, 429 and 5xx (503 SlowDown included) with exponential backoff and full
// jitter, within the deadline. 403 and 404 are final and come back as clear errors. Credentials
// never appear in errors or logs. Thread-safe.
#pragma once

#include <condition_variable>
#include <functional>
#include <map>
#include <memory>
#include <string>

#include "common/thread_annotations.h"
#include "ufs/http.h"
#include "ufs/s3_xml.h"
#include "ufs/sigv4.h"
#include "ufs/ufs.h"

namespace granary {

struct S3Settings {
  // Which API dialect and signature: S3 (AWS SigV4), or Alibaba OSS with its V4 or V1 signature.
  enum class Signing { kAwsV4, kOssV4, kOssV1 };
  Signing signing = Signing::kAwsV4;
  std::string bucket;
  std::string prefix;  // no leading or trailing '/'
  std::string endpoint;
  std::string region;
  bool path_style = false;
  AwsCredentials creds;
  int max_attempts = 5;
  std::chrono::milliseconds retry_deadline{20000};
  int max_requests = 32;  // requests in flight at once from this process, per mount
};

// Resolves settings from the URI's bucket/prefix, the mount options, the environment and the
// credentials file. INVALID_ARGUMENT names a bad or unknown option; UNAUTHENTICATED when no
// credentials are found.
StatusOr<S3Settings> ResolveS3Settings(const std::string& bucket, const std::string& prefix,
                                       const std::map<std::string, std::string>& options);

// `oss://bucket/prefix`: the same client speaking Alibaba OSS. Options use Fluid's names:
//   fs.oss.endpoint          oss-cn-hangzhou.aliyuncs.com (or with http(s)://)   OSS_ENDPOINT
//   fs.oss.region            derived from the endpoint (oss-cn-hangzhou -> cn-hangzhou)  OSS_REGION
//   fs.oss.accessKeyId       the key id, or a path to a file holding it           OSS_ACCESS_KEY_ID
//   fs.oss.accessKeySecret   a path to a file holding the secret (never inline)   OSS_ACCESS_KEY_SECRET
//   fs.oss.securityToken     a path to a file holding an STS token                OSS_SESSION_TOKEN
//   fs.oss.signatureVersion  v4 (default) or v1
//   max_attempts, retry_deadline as for s3.
StatusOr<S3Settings> ResolveOssSettings(const std::string& bucket, const std::string& prefix,
                                        const std::map<std::string, std::string>& options);

class S3Ufs : public UnderFileSystem {
 public:
  static StatusOr<std::shared_ptr<UnderFileSystem>> Open(const std::string& uri, S3Settings settings,
                                                         std::shared_ptr<HttpClient> http = nullptr);

  const std::string& uri() const override { return uri_; }
  StatusOr<UfsEntry> Stat(const std::string& path) override;
  Status List(const std::string& dir, size_t page_size, const PageFn& on_page) override;
  // One flat listing; resumes with ListObjectsV2's start-after.
  Status ListTree(const std::string& dir, size_t page_size, const PageFn& on_page, const std::string& after) override;
  bool ListsTreeFlat() const override { return true; }
  StatusOr<size_t> Read(const std::string& path, const std::string& version, uint64_t offset, size_t length,
                        char* out) override;
  StatusOr<size_t> ReadStreaming(const std::string& path, const std::string& version, uint64_t offset, size_t length,
                                 char* out, ReadProgress* progress) override;
  // A GET without a Range (still If-Match the version): its 200 must carry exactly `size` bytes.
  StatusOr<size_t> ReadWhole(const std::string& path, const std::string& version, size_t size, char* out,
                             ReadProgress* progress) override;
  // Writes: a multipart upload (parts of kPartSize, up to kPartsInFlight uploading at once while
  // the writer appends), completed at Commit — or one PUT for a file smaller than a part. Abort
  // (or an uncommitted writer's end) aborts the upload. Directories: a "dir/" marker object made
  // by MakeDir, removed by RemoveDir when nothing else is below it. Rename of a file: a server-side
  // copy, then a delete of the source (up to 5 GiB; larger files and directories are
  // NotSupportedError: object stores cannot rename them at once).
  StatusOr<std::unique_ptr<UfsWriter>> Create(const std::string& path, uint32_t mode, const WriteCaller& as) override;
  Status Remove(const std::string& path, const WriteCaller& as) override;
  Status MakeDir(const std::string& path, uint32_t mode, const WriteCaller& as) override;
  Status RemoveDir(const std::string& path, const WriteCaller& as) override;
  Status Rename(const std::string& from, const std::string& to, const WriteCaller& as) override;

  static constexpr size_t kPartSize = 16 << 20;
  static constexpr int kPartsInFlight = 4;

 private:
  friend class S3Writer;
  S3Ufs(std::string uri, S3Settings s, std::shared_ptr<HttpClient> http);
  std::string KeyOf(const std::string& path) const;
  // Sends a signed request for `key` ("" = the bucket) with retries; any final HTTP status is
  // returned. `check` may reject a response as broken in transit (a truncated body): it is then
  // retried like a reset connection.
  using Check = std::function<Status(const HttpResponse&)>;
  // With `sink`, a 2xx body is written into sink[0, sink_capacity) (HttpRequest::sink).
  // `body`: what a PUT or POST sends (not signed: UNSIGNED-PAYLOAD).
  StatusOr<HttpResponse> Call(const std::string& method, const std::string& key, const HeaderList& query,
                              const HeaderList& headers, const Check& check = nullptr, char* sink = nullptr,
                              size_t sink_capacity = 0, std::string_view body = {}, ReadProgress* progress = nullptr,
                              uint64_t progress_first = 0);
  Status ErrorFor(const HttpResponse& r, const std::string& what) const;
  // ReadStreaming's GET, of `length` bytes at `offset` with a Range, or of the whole object
  // (offset 0, `length` its size) without one.
  StatusOr<size_t> Get(const std::string& path, const std::string& version, uint64_t offset, size_t length, char* out,
                       ReadProgress* progress, bool whole_object);
  // One listing page of `r` (asked for `list_prefix` with continuation `token`): parsed
  // (ufs/s3_xml.h), keys outside the prefix dropped, a token that would loop refused.
  StatusOr<S3ListPage> ParsePage(const HttpResponse& r, const std::string& list_prefix, const std::string& token) const;
  StatusOr<bool> HasChildren(const std::string& key_prefix);

  std::string uri_;
  S3Settings s_;
  std::shared_ptr<HttpClient> http_;
  Mutex slots_mu_;
  std::condition_variable slots_cv_;
  int in_flight_ GUARDED_BY(slots_mu_) = 0;
  int64_t opened_ns_;  // S3 has no directory times; directories show when the mount was opened
};

}  // namespace granary
