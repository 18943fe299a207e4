// The S3/OSS answer parsers (ufs/s3_xml.h) and what S3Ufs does with a misbehaving store's answers.
// The cases below are what tests/fuzz/s3_xml_fuzz.cc and reading the old parsers found.
#include "ufs/s3_xml.h"

#include <gtest/gtest.h>

#include "ufs/s3_ufs.h"
#include "tests/ufs/s3_test_settings.h"

namespace granary {
namespace {

TEST(S3Xml, ListPageObjectsPrefixesAndToken) {
  auto p = ParseS3ListPage(
      "<?xml version=\"1.0\"?><ListBucketResult><IsTruncated>true</IsTruncated>"
      "<NextContinuationToken>tok</NextContinuationToken>"
      "<Contents><Key>d/a</Key><Size>5</Size><ETag>\"e\"</ETag><LastModified>2026-11-20T10:00:00.000Z</LastModified></Contents>"
      "<CommonPrefixes><Prefix>d/s/</Prefix></CommonPrefixes></ListBucketResult>");
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  ASSERT_EQ(p->objects.size(), 1u);
  EXPECT_EQ(p->objects[0].key, "d/a");
  EXPECT_EQ(p->objects[0].size, 5u);
  EXPECT_EQ(p->objects[0].etag, "\"e\"");
  EXPECT_EQ(p->objects[0].mtime_ns, 1795168800LL * 1'000'000'000);
  EXPECT_EQ(p->prefixes, std::vector<std::string>{"d/s/"});
  EXPECT_TRUE(p->truncated);
  EXPECT_EQ(p->next_token, "tok");
}

// strtoull took "-1" as 2^64-1 and "x" as 0: a file of 16 EiB, or an empty one.
TEST(S3Xml, MalformedSizesAreSkippedNeverTrusted) {
  for (const char* size : {"-1", "x", "", "18446744073709551616", "5497558138881", " 5", "5 "}) {
    auto p = ParseS3ListPage(std::string("<ListBucketResult><Contents><Key>k</Key><Size>") + size +
                             "</Size></Contents></ListBucketResult>");
    ASSERT_TRUE(p.ok()) << size;
    EXPECT_TRUE(p->objects.empty()) << size;
    EXPECT_EQ(p->skipped, 1u) << size;
  }
  auto big = ParseS3ListPage("<ListBucketResult><Contents><Key>k</Key><Size>5497558138880</Size></Contents></ListBucketResult>");
  ASSERT_TRUE(big.ok());
  ASSERT_EQ(big->objects.size(), 1u);
  EXPECT_EQ(big->objects[0].size, kMaxListedObjectSize);
}

// A body of only a declaration or a comment parses with no root element: HasChildren dereferenced
// it (a crash of the master or worker on one malformed answer).
TEST(S3Xml, BodiesWithoutARootAreErrors) {
  for (const char* body : {"<?xml version=\"1.0\"?>", "<!-- nothing -->", "", "not xml", "<a>"}) {
    EXPECT_FALSE(ParseS3ListPage(body).ok()) << body;
    EXPECT_FALSE(ParseS3UploadId(body).ok()) << body;
    EXPECT_FALSE(ParseS3CompleteUpload(body).ok()) << body;
    EXPECT_TRUE(ParseS3Error(body).code.empty()) << body;
  }
  EXPECT_FALSE(ParseS3ListPage("<Error><Code>AccessDenied</Code></Error>").ok());
}

TEST(S3Xml, TruncatedWithoutATokenIsAnError) {
  auto p = ParseS3ListPage("<ListBucketResult><IsTruncated>true</IsTruncated></ListBucketResult>");
  ASSERT_FALSE(p.ok());
  EXPECT_NE(p.status().message().find("NextContinuationToken"), std::string::npos);
}

TEST(S3Xml, CompleteUploadAnswers) {
  auto ok = ParseS3CompleteUpload("<CompleteMultipartUploadResult><ETag>\"x-2\"</ETag></CompleteMultipartUploadResult>");
  ASSERT_TRUE(ok.ok());
  EXPECT_EQ(*ok, "\"x-2\"");
  auto err = ParseS3CompleteUpload("<?xml version=\"1.0\"?>\n\n<Error><Code>InternalError</Code><Message>m</Message></Error>");
  ASSERT_FALSE(err.ok());
  EXPECT_EQ(err.status().code(), Code::kUnavailable);
  EXPECT_NE(err.status().message().find("InternalError"), std::string::npos);
  EXPECT_EQ(ParseS3CompleteUpload("<Other/>").status().code(), Code::kInternal);
  auto e = ParseS3Error("<Error><Code>SlowDown</Code><Message>Please reduce your request rate.</Message></Error>");
  EXPECT_EQ(e.code, "SlowDown");
  EXPECT_EQ(e.message, "Please reduce your request rate.");
}

// A store answering every page with the token it was asked with.
class LoopingStore : public HttpClient {
 public:
  StatusOr<HttpResponse> Send(const HttpRequest&) override {
    HttpResponse r;
    r.status = 200;
    r.body = "<ListBucketResult><IsTruncated>true</IsTruncated><NextContinuationToken>" +
             std::string(calls++ == 0 ? "t1" : "t1") +
             "</NextContinuationToken><Contents><Key>m/a</Key><Size>1</Size></Contents>"
             "<Contents><Key>elsewhere/b</Key><Size>1</Size></Contents></ListBucketResult>";
    return r;
  }
  int calls = 0;
};

TEST(S3Xml, AListingThatWouldNotEndFailsAndKeysOutsideThePrefixAreDropped) {
  S3Settings s = testing::FakeS3Settings("m");
  auto http = std::make_shared<LoopingStore>();
  auto ufs = S3Ufs::Open("s3://bkt/m", s, http);
  ASSERT_TRUE(ufs.ok()) << ufs.status().ToString();
  std::vector<std::string> names;
  Status st = (*ufs)->List("", 1000, [&](std::vector<UfsEntry>& page) {
    for (const auto& e : page) names.push_back(e.name);
    return Status::OK();
  });
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("would not end"), std::string::npos) << st.ToString();
  EXPECT_LE(http->calls, 3);  // the open's probe, the first page, the page that repeats its token
  for (const auto& n : names) EXPECT_EQ(n, "a");
}


// A store whose one-key answer names a key outside the prefix asked for: no child there, so no
// directory (Stat probes a directory with such a listing).
class StrayKeyStore : public HttpClient {
 public:
  StatusOr<HttpResponse> Send(const HttpRequest& req) override {
    HttpResponse r;
    if (req.method == "HEAD") {
      r.status = 404;
      return r;
    }
    r.status = 200;
    r.body = "<ListBucketResult><IsTruncated>false</IsTruncated>"
             "<Contents><Key>elsewhere/b</Key><Size>1</Size></Contents></ListBucketResult>";
    return r;
  }
};

TEST(S3Xml, AKeyOutsideThePrefixIsNoChild) {
  S3Settings s = testing::FakeS3Settings("m");
  auto ufs = S3Ufs::Open("s3://bkt/m", s, std::make_shared<StrayKeyStore>());
  ASSERT_TRUE(ufs.ok()) << ufs.status().ToString();
  auto st = (*ufs)->Stat("dir");
  EXPECT_EQ(st.status().code(), Code::kNotFound) << (st.ok() ? "a directory" : st.status().ToString());
}

}  // namespace
}  // namespace granary
