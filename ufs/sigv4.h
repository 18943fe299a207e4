// AWS Signature Version 4 for S3 requests, sent in the Authorization header.
//
// Sign() builds the canonical request exactly as S3 specifies it: the path URI-encoded once
// (every byte but A-Z a-z 0-9 - _ . ~ and '/'), query parameters encoded and sorted, header names
// lower-cased and sorted, values trimmed with inner runs of spaces folded, and the payload's
// SHA-256 (or UNSIGNED-PAYLOAD). It returns the headers to add to the request. The secret key
// never leaves this function; only the derived signature does.
//
// Checked against AWS's documented example and against botocore signing the same generated
// requests (tests/ufs/sigv4_test.cc, tests/ufs/sigv4_botocore.py). Pure and thread-safe.
#pragma once

#include <ctime>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace granary {

struct AwsCredentials {
  std::string access_key;
  std::string secret_key;
  std::string session_token;  // STS; empty when not used
};

using HeaderList = std::vector<std::pair<std::string, std::string>>;

struct SigV4Request {
  std::string method;  // "GET", "HEAD"
  std::string host;    // Host header value: "bucket.s3.us-east-1.amazonaws.com", "127.0.0.1:7480"
  std::string path;    // decoded path, starting with '/': "/bucket/a b.jpg"
  HeaderList query;    // decoded name/value pairs
  HeaderList headers;  // extra headers to sign, e.g. {"Range", "bytes=0-9"}
  std::string payload_sha256;  // hex SHA-256 of the body, or "UNSIGNED-PAYLOAD"; empty means ""'s hash
};

struct SigV4Result {
  HeaderList headers;  // host, x-amz-date, x-amz-content-sha256, [x-amz-security-token], authorization
  std::string canonical_request;
  std::string string_to_sign;
  std::string signature;
};

SigV4Result SignV4(const SigV4Request& req, const AwsCredentials& creds, const std::string& region,
                   const std::string& service, std::time_t now);

// Percent-encoding per SigV4: unreserved bytes stay, everything else becomes %XX (upper-case hex);
// '/' stays only when `keep_slash`.
std::string AwsUriEncode(std::string_view s, bool keep_slash);

// The query string as sent on the wire (same encoding and order as the canonical one).
std::string CanonicalQuery(const HeaderList& query);

std::string Sha256Hex(std::string_view data);

}  // namespace granary
