// OSS mode of the object-store client: option resolution with Fluid's names, and the requests it
// sends (captured; no OSS server is reachable here — signatures are checked against the official
// SDK by oss_sign_sdk.js).
#include <gtest/gtest.h>

#include <atomic>
#include <condition_variable>
#include <mutex>
#include <thread>

#include "common/tiers.h"
#include "ufs/s3_ufs.h"
#include "tests/testutil/testutil.h"

namespace granary {
namespace {

// Answers like OSS would and records every request.
class CapturingHttp : public HttpClient {
 public:
  StatusOr<HttpResponse> Send(const HttpRequest& req) override {
    std::lock_guard<std::mutex> lock(mu);
    requests.push_back(req);
    if (req.url.find("list-type=2") != std::string::npos) {
      return HttpResponse{200, {}, R"(<?xml version="1.0" encoding="UTF-8"?>
<ListBucketResult><Name>bkt</Name><Prefix>data/</Prefix><IsTruncated>false</IsTruncated>
<Contents><Key>data/a.jpg</Key><LastModified>2026-11-20T10:00:00.000Z</LastModified><ETag>"ETAG-A"</ETag><Size>5</Size></Contents>
<CommonPrefixes><Prefix>data/sub/</Prefix></CommonPrefixes></ListBucketResult>)"};
    }
    return HttpResponse{206, {{"content-range", "bytes 1-3/5"}}, "BCD"};
  }
  std::string Header(size_t i, const std::string& name) {
    for (const auto& [k, v] : requests[i].headers) {
      if (k == name) return v;
    }
    return "";
  }
  std::mutex mu;
  std::vector<HttpRequest> requests;
};

TEST(OssSettings, FluidNamesAndFileReferencedSecrets) {
  testing::TempDir dir;
  testing::WriteFile(dir / "id", "LTAIexample\n");
  testing::WriteFile(dir / "secret", "s3cr3t\n");
  auto s = ResolveOssSettings("bkt", "data/", {{"fs.oss.endpoint", "oss-cn-hangzhou-internal.aliyuncs.com"},
                                               {"fs.oss.accessKeyId", dir / "id"},
                                               {"fs.oss.accessKeySecret", dir / "secret"}});
  ASSERT_TRUE(s.ok()) << s.status().message();
  EXPECT_EQ(s->region, "cn-hangzhou");
  EXPECT_EQ(s->endpoint, "https://oss-cn-hangzhou-internal.aliyuncs.com");
  EXPECT_EQ(s->creds.access_key, "LTAIexample");
  EXPECT_EQ(s->creds.secret_key, "s3cr3t");
  EXPECT_EQ(s->prefix, "data");
  EXPECT_TRUE(s->signing == S3Settings::Signing::kOssV4);

  auto inline_secret = ResolveOssSettings("bkt", "", {{"fs.oss.endpoint", "oss-cn-beijing.aliyuncs.com"},
                                                      {"fs.oss.accessKeyId", "LTAI"},
                                                      {"fs.oss.accessKeySecret", "plain-secret"}});
  EXPECT_EQ(inline_secret.status().code(), Code::kInvalidArgument);
  EXPECT_NE(inline_secret.status().message().find("path of a file holding the secret"), std::string::npos)
      << inline_secret.status().message();
  EXPECT_EQ(inline_secret.status().message().find("plain-secret"), std::string::npos);

  EXPECT_NE(ResolveOssSettings("bkt", "", {{"fs.oss.endpointt", "x"}}).status().message().find("unknown oss mount option"),
            std::string::npos);
  EXPECT_NE(ResolveOssSettings("bkt", "", {{"fs.oss.accessKeyId", "x"}}).status().message().find("fs.oss.endpoint"),
            std::string::npos);
  EXPECT_EQ(ResolveOssSettings("bkt", "", {{"fs.oss.endpoint", "e"}, {"fs.oss.signatureVersion", "v3"}}).status().code(),
            Code::kInvalidArgument);
}

S3Settings Settings(S3Settings::Signing signing) {
  S3Settings s;
  s.signing = signing;
  s.bucket = "bkt";
  s.prefix = "data";
  s.endpoint = "https://oss-cn-hangzhou.aliyuncs.com";
  s.region = "cn-hangzhou";
  s.creds = {"LTAIexample", "s3cr3t", "sts-token"};
  return s;
}

TEST(OssUfs, RequestsAreVirtualHostedAndOssSigned) {
  for (auto signing : {S3Settings::Signing::kOssV4, S3Settings::Signing::kOssV1}) {
    auto http = std::make_shared<CapturingHttp>();
    auto ufs = S3Ufs::Open("oss://bkt/data", Settings(signing), http);
    ASSERT_TRUE(ufs.ok()) << ufs.status().message();
    std::vector<std::string> names;
    ASSERT_TRUE((*ufs)->List("", 100, [&](std::vector<UfsEntry>& page) {
      for (auto& e : page) names.push_back(e.name + (e.is_dir ? "/" : ""));
      return Status::OK();
    }).ok());
    EXPECT_EQ(names, (std::vector<std::string>{"a.jpg", "sub/"}));
    char buf[8];
    auto n = (*ufs)->Read("a.jpg", "\"ETAG-A\"", 1, 3, buf);
    ASSERT_TRUE(n.ok()) << n.status().message();
    EXPECT_EQ(std::string(buf, *n), "BCD");

    ASSERT_GE(http->requests.size(), 3u);
    size_t last = http->requests.size() - 1;
    EXPECT_EQ(http->requests[last].url, "https://bkt.oss-cn-hangzhou.aliyuncs.com/data/a.jpg");
    EXPECT_EQ(http->Header(last, "If-Match"), "\"ETAG-A\"");
    EXPECT_EQ(http->Header(last, "Range"), "bytes=1-3");
    EXPECT_EQ(http->Header(last, "x-oss-security-token"), "sts-token");
    EXPECT_FALSE(http->Header(last, "x-oss-date").empty());
    std::string auth = http->Header(last, "authorization");
    if (signing == S3Settings::Signing::kOssV4) {
      EXPECT_EQ(auth.rfind("OSS4-HMAC-SHA256 Credential=LTAIexample/", 0), 0u) << auth;
      EXPECT_NE(auth.find("/cn-hangzhou/oss/aliyun_v4_request,Signature="), std::string::npos) << auth;
      EXPECT_EQ(http->Header(last, "x-oss-content-sha256"), "UNSIGNED-PAYLOAD");
    } else {
      EXPECT_EQ(auth.rfind("OSS LTAIexample:", 0), 0u) << auth;
    }
    for (const auto& r : http->requests) {
      for (const auto& [k, v] : r.headers) EXPECT_EQ(v.find("s3cr3t"), std::string::npos) << k;
      EXPECT_EQ(r.url.find("bkt.oss-cn-hangzhou.aliyuncs.com"), 8u) << r.url;
    }
  }
}

TEST(S3Settings, SharedCredentialsFileAndProfile) {
  testing::TempDir dir;
  testing::WriteFile(dir / "credentials",
                     "[default]\naws_access_key_id = DEFAULTKEY\naws_secret_access_key = defaultsecret\n\n"
                     "[training]\naws_access_key_id=TRAININGKEY\naws_secret_access_key=trainingsecret\n"
                     "aws_session_token = tok\n");
  unsetenv("AWS_ACCESS_KEY_ID");
  unsetenv("AWS_SECRET_ACCESS_KEY");
  auto s = ResolveS3Settings("bkt", "p", {{"credentials_file", dir / "credentials"}, {"profile", "training"}});
  ASSERT_TRUE(s.ok()) << s.status().message();
  EXPECT_EQ(s->creds.access_key, "TRAININGKEY");
  EXPECT_EQ(s->creds.secret_key, "trainingsecret");
  EXPECT_EQ(s->creds.session_token, "tok");
  EXPECT_EQ(ResolveS3Settings("bkt", "p", {{"credentials_file", dir / "credentials"}})->creds.access_key, "DEFAULTKEY");
  auto none = ResolveS3Settings("bkt", "p", {{"credentials_file", dir / "missing"}});
  EXPECT_EQ(none.status().code(), Code::kUnauthenticated);
  EXPECT_NE(none.status().message().find("no S3 credentials"), std::string::npos);
}

TEST(S3Settings, InlineCredentialsAreRefusedByName) {
  for (const char* key : {"access_key", "secret_key", "session_token"}) {
    auto s = ResolveS3Settings("bkt", "p", {{key, "V3RY-S3CRET-VALUE"}});
    ASSERT_FALSE(s.ok()) << key;
    EXPECT_EQ(s.status().code(), Code::kInvalidArgument);
    EXPECT_NE(s.status().message().find(std::string(key) + "_file=PATH"), std::string::npos) << s.status().message();
    EXPECT_EQ(s.status().message().find("V3RY-S3CRET-VALUE"), std::string::npos) << "the value must not be echoed";
    // Every entry point applies the same policy: opening any under-storage, and the mount-option split.
    EXPECT_EQ(OpenUnderFileSystem("s3://bkt/p", {{key, "x"}}).status().code(), Code::kInvalidArgument);
    EXPECT_EQ(OpenUnderFileSystem("file:///tmp", {{key, "x"}}).status().message(), s.status().message());
    std::map<std::string, std::string> ufs;
    MountCacheOptions cache;
    EXPECT_EQ(SplitMountOptions({{key, "x"}}, &ufs, &cache).message(), s.status().message());
  }
}

TEST(S3Ufs, VirtualHostedAddressingWithoutAnEndpoint) {
  unsetenv("AWS_ENDPOINT_URL");
  testing::TempDir dir;
  testing::WriteFile(dir / "ak", "AKIDEXAMPLE");
  testing::WriteFile(dir / "sk", "secret");
  auto s = ResolveS3Settings("bkt", "data", {{"region", "us-west-2"}, {"access_key_file", dir / "ak"},
                                        {"secret_key_file", dir / "sk"}});
  ASSERT_TRUE(s.ok()) << s.status().message();
  EXPECT_FALSE(s->path_style);
  auto http = std::make_shared<CapturingHttp>();
  auto ufs = S3Ufs::Open("s3://bkt/data", *s, http);
  ASSERT_TRUE(ufs.ok()) << ufs.status().message();
  char buf[8];
  ASSERT_TRUE((*ufs)->Read("a.jpg", "\"ETAG-A\"", 1, 3, buf).ok());
  const HttpRequest& last = http->requests.back();
  EXPECT_EQ(last.url, "https://bkt.s3.us-west-2.amazonaws.com/data/a.jpg");
  EXPECT_EQ(http->Header(http->requests.size() - 1, "authorization").rfind("AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/", 0), 0u);
  auto path_style = ResolveS3Settings("bkt", "data", {{"endpoint", "http://127.0.0.1:9000"}, {"access_key_file", dir / "ak"},
                                                      {"secret_key_file", dir / "sk"}});
  EXPECT_TRUE(path_style->path_style) << "a custom endpoint defaults to path-style";
}

// Holds every request until released, and records how many were in flight at once.
class GatedHttp : public CapturingHttp {
 public:
  StatusOr<HttpResponse> Send(const HttpRequest& req) override {
    {
      std::unique_lock<std::mutex> lock(gate_mu);
      peak = std::max(peak, ++in_flight);
      gate_cv.wait(lock, [&] { return open; });
    }
    auto r = CapturingHttp::Send(req);
    std::lock_guard<std::mutex> lock(gate_mu);
    --in_flight;
    return r;
  }
  void Open() {
    std::lock_guard<std::mutex> lock(gate_mu);
    open = true;
    gate_cv.notify_all();
  }
  int InFlight() {
    std::lock_guard<std::mutex> lock(gate_mu);
    return in_flight;
  }
  std::mutex gate_mu;
  std::condition_variable gate_cv;
  bool open = true;
  int in_flight = 0, peak = 0;
};

TEST(ObjectStore, MaxRequestsBoundsConcurrency) {
  auto http = std::make_shared<GatedHttp>();
  S3Settings s = Settings(S3Settings::Signing::kOssV4);
  s.max_requests = 2;
  auto ufs = S3Ufs::Open("oss://bkt/data", s, http);
  ASSERT_TRUE(ufs.ok());
  {
    std::lock_guard<std::mutex> lock(http->gate_mu);
    http->open = false;
    http->peak = 0;
  }
  std::vector<std::thread> readers;
  std::atomic<int> ok{0};
  for (int i = 0; i < 8; ++i) {
    readers.emplace_back([&] {
      char buf[8];
      if ((*ufs)->Read("a.jpg", "\"ETAG-A\"", 1, 3, buf).ok()) ok++;
    });
  }
  ASSERT_TRUE(testing::WaitFor([&] { return http->InFlight() == 2; }));
  http->Open();
  for (auto& t : readers) t.join();
  EXPECT_EQ(ok.load(), 8);
  EXPECT_EQ(http->peak, 2) << "max_requests=2 must hold with 8 concurrent readers";
}

}  // namespace
}  // namespace granary
