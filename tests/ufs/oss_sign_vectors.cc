// Prints generated OSS requests and Granary's V4 and V1 signatures, one JSON object per line, for
// tests/ufs/oss_sign_sdk.js to recompute with the official ali-oss SDK and compare.
#include <cstdio>
#include <nlohmann/json.hpp>
#include <random>

#include "ufs/oss_sign.h"

int main() {
  std::mt19937 rng(1121);
  const std::vector<std::string> keys = {"train/n01440764/n01440764_10026.JPEG", "a b/c d.jpg", "unicode/日本語/ü é.txt",
                                         "plus+sign=eq&amp.bin", "tilde~/star*(paren)'quote'", "percent%20literal",
                                         "deep/a/b/c/d/e/f/g.h", ""};
  const std::vector<std::string> regions = {"cn-hangzhou", "cn-beijing", "ap-southeast-1", "us-west-1"};
  for (int i = 0; i < 200; ++i) {
    granary::OssRequest req;
    req.method = i % 5 == 0 ? "HEAD" : "GET";
    req.bucket = "bucket-" + std::to_string(i % 4);
    req.key = keys[rng() % keys.size()];
    std::string host = req.bucket + ".oss-" + regions[i % regions.size()] + ".aliyuncs.com";
    req.headers.push_back({"Host", host});
    if (req.key.empty() || i % 3 == 0) {
      req.key.clear();
      req.query = {{"list-type", "2"}, {"delimiter", "/"}, {"prefix", keys[rng() % keys.size()] + "x"}};
      if (i % 2) {
        std::string token = "CgpDb250aW51ZS8/VG9rZW4=" + std::to_string(i);
        req.query.push_back({"continuation-token", token});
        req.subresources.push_back({"continuation-token", token});
      }
      if (i % 4 == 0) req.query.push_back({"max-keys", std::to_string(rng() % 1000 + 1)});
    } else {
      req.headers.push_back({"Range", "bytes=" + std::to_string(i * 1000) + "-" + std::to_string(i * 1000 + 4194303)});
      if (i % 4 == 1) req.headers.push_back({"If-Match", "\"5B3C1A2E053D763E1B002CC607C5A0FE-" + std::to_string(i) + "\""});
    }
    if (i % 2 == 0) req.additional.push_back({"host", ""});
    if (i % 6 == 2 && req.key.size()) req.additional.push_back({"range", ""});
    granary::AwsCredentials creds{"LTAI" + std::to_string(i), "oss/secret+" + std::to_string(rng()),
                                  i % 7 == 0 ? "CAIS" + std::to_string(rng()) + "/token==" : ""};
    std::string region = regions[i % regions.size()];
    std::time_t now = 1700000000 + static_cast<std::time_t>(rng() % 100000000);
    auto v4 = granary::OssSignV4(req, creds, region, now);
    auto v1 = granary::OssSignV1(req, creds, now);
    nlohmann::json j = {{"method", req.method},   {"bucket", req.bucket},         {"key", req.key},
                        {"query", req.query},     {"subresources", req.subresources}, {"headers", req.headers},
                        {"additional", req.additional}, {"access_key", creds.access_key},
                        {"secret_key", creds.secret_key}, {"token", creds.session_token}, {"region", region},
                        {"time", now},            {"v4", v4},                     {"v1", v1}};
    std::printf("%s\n", j.dump().c_str());
  }
  return 0;
}
