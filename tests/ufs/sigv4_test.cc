#include "ufs/sigv4.h"

#include <gtest/gtest.h>

#include <set>
#include <string>
#include <thread>

namespace granary {
namespace {

// 2013-05-24T00:00:00Z, the date of AWS's published examples.
constexpr std::time_t kExampleTime = 1369353600;
const AwsCredentials kExampleCreds{"AKIAIOSFODNN7EXAMPLE", "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY", ""};

std::string Header(const SigV4Result& r, const std::string& name) {
  for (const auto& [k, v] : r.headers) {
    if (k == name) return v;
  }
  return "";
}

// AWS S3 API reference, "Signature Calculations for the Authorization Header", GET Object example.
TEST(SigV4, AwsDocumentedGetObjectExample) {
  SigV4Request req{"GET", "examplebucket.s3.amazonaws.com", "/test.txt", {}, {{"Range", "bytes=0-9"}}, ""};
  SigV4Result r = SignV4(req, kExampleCreds, "us-east-1", "s3", kExampleTime);
  EXPECT_EQ(r.signature, "f0e8bdb87c964420e857bd35b5d6ed310bd44f0170aba48dd91039c6036bdb41") << r.canonical_request;
  EXPECT_EQ(Header(r, "authorization"),
            "AWS4-HMAC-SHA256 Credential=AKIAIOSFODNN7EXAMPLE/20130524/us-east-1/s3/aws4_request, "
            "SignedHeaders=host;range;x-amz-content-sha256;x-amz-date, "
            "Signature=f0e8bdb87c964420e857bd35b5d6ed310bd44f0170aba48dd91039c6036bdb41");
  EXPECT_EQ(Header(r, "x-amz-date"), "20130524T000000Z");
  EXPECT_EQ(Header(r, "x-amz-content-sha256"), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
}

// The same page's GET Bucket (list objects) example: a query string in the canonical request.
TEST(SigV4, AwsDocumentedListObjectsExample) {
  SigV4Request req{"GET", "examplebucket.s3.amazonaws.com", "/", {{"prefix", "J"}, {"max-keys", "2"}}, {}, ""};
  SigV4Result r = SignV4(req, kExampleCreds, "us-east-1", "s3", kExampleTime);
  EXPECT_EQ(r.signature, "34b48302e7b5fa45bde8084f4b7868a86f0a534bc59db6670ed5711ef69dc6f7") << r.canonical_request;
}

// The signing key is kept per thread for the last secret, day, region and service: a change of
// any of them signs with the right key, and coming back gives the documented signature again.
TEST(SigV4, AKeptSigningKeyNeverSignsForAnotherSecretDayOrRegion) {
  SigV4Request req{"GET", "examplebucket.s3.amazonaws.com", "/test.txt", {}, {{"Range", "bytes=0-9"}}, ""};
  const std::string documented = "f0e8bdb87c964420e857bd35b5d6ed310bd44f0170aba48dd91039c6036bdb41";
  const AwsCredentials other{"AKIAIOSFODNN7EXAMPLE", "another-secret", ""};
  std::set<std::string> seen;
  for (int round = 0; round < 2; ++round) {
    EXPECT_EQ(SignV4(req, kExampleCreds, "us-east-1", "s3", kExampleTime).signature, documented);
    seen.insert(SignV4(req, other, "us-east-1", "s3", kExampleTime).signature);
    EXPECT_EQ(SignV4(req, kExampleCreds, "us-east-1", "s3", kExampleTime).signature, documented);
    seen.insert(SignV4(req, kExampleCreds, "eu-west-1", "s3", kExampleTime).signature);
    seen.insert(SignV4(req, kExampleCreds, "us-east-1", "oss", kExampleTime).signature);
    // The next day (the signed date changes too, so compare against a second thread's signature,
    // which starts with nothing kept).
    SigV4Result next_day = SignV4(req, kExampleCreds, "us-east-1", "s3", kExampleTime + 86400);
    std::string fresh;
    std::thread([&] { fresh = SignV4(req, kExampleCreds, "us-east-1", "s3", kExampleTime + 86400).signature; }).join();
    EXPECT_EQ(next_day.signature, fresh);
    seen.insert(next_day.signature);
  }
  EXPECT_EQ(seen.size(), 4u) << "each secret, region, service and day signs differently";
  EXPECT_EQ(seen.count(documented), 0u);
}

TEST(SigV4, EncodingRules) {
  EXPECT_EQ(AwsUriEncode("a b/c~d_e-f.g", true), "a%20b/c~d_e-f.g");
  EXPECT_EQ(AwsUriEncode("a b/c", false), "a%20b%2Fc");
  EXPECT_EQ(AwsUriEncode("+=&ü", false), "%2B%3D%26%C3%BC");
  EXPECT_EQ(CanonicalQuery({{"prefix", "a/b c"}, {"delimiter", "/"}, {"list-type", "2"}}),
            "delimiter=%2F&list-type=2&prefix=a%2Fb%20c");
}

TEST(SigV4, SessionTokenIsSignedAndSecretNeverAppears) {
  AwsCredentials creds{"AK", "very-secret-key", "session-token-xyz"};
  SigV4Request req{"GET", "h:1", "/b/k", {}, {{"If-Match", "  \"etag\"  "}}, ""};
  SigV4Result r = SignV4(req, creds, "us-east-1", "s3", kExampleTime);
  EXPECT_EQ(Header(r, "x-amz-security-token"), "session-token-xyz");
  EXPECT_NE(Header(r, "authorization").find("if-match;x-amz-content-sha256;x-amz-date;x-amz-security-token"),
            std::string::npos);
  EXPECT_NE(r.canonical_request.find("if-match:\"etag\"\n"), std::string::npos) << r.canonical_request;
  for (const auto& [k, v] : r.headers) EXPECT_EQ(v.find("very-secret-key"), std::string::npos) << k;
  EXPECT_EQ(r.canonical_request.find("very-secret-key"), std::string::npos);
}

}  // namespace
}  // namespace granary
