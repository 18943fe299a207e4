// Fuzzes the S3/OSS answer parsers (ufs/s3_xml.h) with any bytes: listings, error documents, the
// answers to starting and completing a multipart upload, and the time formats. Besides "no crash,
// no hang, no leak", checks the contract: sizes within the limit, a truncated page always names
// its continuation token, empty keys never listed.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "ufs/s3_xml.h"

using namespace granary;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view body(reinterpret_cast<const char*>(data), size);
  auto page = ParseS3ListPage(body);
  if (page.ok()) {
    for (const S3ListedObject& o : page->objects) {
      if (o.size > kMaxListedObjectSize || o.key.empty() || o.mtime_ns < 0) std::abort();
    }
    for (const std::string& p : page->prefixes) {
      if (p.empty()) std::abort();
    }
    if (page->truncated && page->next_token.empty()) std::abort();
  }
  S3ErrorBody e = ParseS3Error(body);
  (void)e;
  auto id = ParseS3UploadId(body);
  if (id.ok() && id->empty()) std::abort();
  auto etag = ParseS3CompleteUpload(body);
  (void)etag;
  if (ParseS3TimeNs(std::string(body)) < 0) std::abort();
  return 0;
}
