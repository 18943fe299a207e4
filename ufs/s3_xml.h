// The S3 and OSS answers Granary reads, parsed from their XML bodies. The body is whatever arrived:
// the store, a proxy or anything between may send any bytes, truncated, nested or huge. Contract:
// these functions never crash, never loop on their input, and never trust a number they did not
// check; a malformed answer is an error that says what was wrong with it. Fuzzed
// (tests/fuzz/s3_xml_fuzz.cc).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"

namespace granary {

// Largest object size a listing may announce: 5 TiB, S3's and OSS's limit. A larger or malformed
// <Size> (a sign, letters, an overflow) makes the object skipped, never a file of a wrong size.
constexpr uint64_t kMaxListedObjectSize = 5ull << 40;

// The <Code> and <Message> of an <Error> document; both empty when the body is not one.
struct S3ErrorBody {
  std::string code;
  std::string message;
};
S3ErrorBody ParseS3Error(std::string_view body);

struct S3ListedObject {
  std::string key;
  uint64_t size = 0;
  int64_t mtime_ns = 0;  // 0 when LastModified is missing or malformed
  std::string etag;
};

// One page of ListObjectsV2 (S3) or ListObjects type 2 (OSS): objects and common prefixes in the
// order the body lists them. `skipped` counts <Contents> left out for a malformed key or size.
struct S3ListPage {
  std::vector<S3ListedObject> objects;
  std::vector<std::string> prefixes;
  bool truncated = false;
  std::string next_token;  // non-empty whenever truncated
  size_t skipped = 0;
};
// INTERNAL for a body that is not a ListBucketResult, or a truncated page without a continuation
// token (following it would end the listing early without saying so).
StatusOr<S3ListPage> ParseS3ListPage(std::string_view body);

// The UploadId of an InitiateMultipartUploadResult; INTERNAL when there is none.
StatusOr<std::string> ParseS3UploadId(std::string_view body);

// The ETag of a CompleteMultipartUploadResult ("" when the store named none). A 200 answer may
// still carry an <Error> document (the completion failed after it began): UNAVAILABLE then, with
// its code and message; INTERNAL for a body that is neither.
StatusOr<std::string> ParseS3CompleteUpload(std::string_view body);

// Nanoseconds since the epoch from "2026-11-21T10:00:00.000Z" (listings) or
// "Sat, 21 Nov 2026 10:00:00 GMT" (HEAD); 0 when it is neither.
int64_t ParseS3TimeNs(const std::string& s);

}  // namespace granary
