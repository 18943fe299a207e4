// Alibaba Cloud OSS request signing, V4 (OSS4-HMAC-SHA256, the default) and V1 (HMAC-SHA1).
//
// V4: like AWS SigV4 but with x-oss- headers, the resource "/bucket/key" (the bucket always in
// the canonical URI, "/bucket/" for bucket requests), an unsigned payload, and the signing key
// chain "aliyun_v4"+secret -> date -> region -> "oss" -> "aliyun_v4_request". Signed headers are
// content-type, content-md5, every x-oss- header, plus `additional` (e.g. host, range).
// V1: Signature = base64(HMAC-SHA1(secret, VERB\nContent-MD5\nContent-Type\nDate\n
// <x-oss- headers>\n<resource with sub-resources>)).
//
// Checked against the official ali-oss SDK's signUtils for generated requests
// (tests/ufs/oss_sign_vectors.cc, tests/ufs/oss_sign_sdk.js). Pure and thread-safe.
#pragma once

#include <ctime>
#include <string>

#include "ufs/sigv4.h"

namespace granary {

struct OssRequest {
  std::string method;
  std::string bucket;
  std::string key;         // decoded; empty for bucket requests
  HeaderList query;        // decoded; all of them are signed in V4
  HeaderList subresources; // V1 only: query parameters that are part of the resource (continuation-token)
  HeaderList headers;      // headers to send, e.g. Range, If-Match, Host
  HeaderList additional;   // V4: names (lower-case) of non-x-oss headers to sign, e.g. {"host", ""}
};

// Adds x-oss-date, x-oss-content-sha256, [x-oss-security-token] and authorization (lower-case
// names) to the returned list; the caller sends req.headers plus these.
HeaderList OssSignV4(const OssRequest& req, const AwsCredentials& creds, const std::string& region, std::time_t now);
HeaderList OssSignV1(const OssRequest& req, const AwsCredentials& creds, std::time_t now);

}  // namespace granary
