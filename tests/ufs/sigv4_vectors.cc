// Prints generated S3 requests and Granary's SigV4 signatures for them, one JSON object per line,
// for tests/ufs/sigv4_botocore.py to re-sign with botocore and compare.
#include <cstdio>
#include <nlohmann/json.hpp>
#include <random>

#include "ufs/sigv4.h"

int main() {
  using granary::HeaderList;
  std::mt19937 rng(20261121);
  const std::vector<std::string> keys = {
      "train/n01440764/n01440764_10026.JPEG", "a b/c d.jpg", "unicode/日本語/ü é.txt", "plus+sign=eq&amp.bin",
      "tilde~/star*(paren)'quote'", "percent%20literal", "semi;colon,comma!bang$dollar@at", "deep/a/b/c/d/e/f/g.h",
      "trailing/slash/", "#hash?question"};
  const std::vector<std::string> hosts = {"127.0.0.1:7480", "bucket.s3.us-west-2.amazonaws.com",
                                          "s3.eu-central-1.amazonaws.com", "localhost:40080"};
  const std::vector<std::string> regions = {"us-east-1", "us-west-2", "eu-central-1", "cn-north-1"};
  for (int i = 0; i < 200; ++i) {
    granary::SigV4Request req;
    req.method = (i % 5 == 0) ? "HEAD" : "GET";
    req.host = hosts[rng() % hosts.size()];
    req.path = "/bucket-" + std::to_string(i % 3) + "/" + keys[rng() % keys.size()];
    if (i % 3 == 0) {
      req.path = "/bucket-" + std::to_string(i % 3);
      req.query = {{"list-type", "2"}, {"delimiter", "/"}, {"prefix", keys[rng() % keys.size()]}};
      if (i % 2) req.query.push_back({"continuation-token", "1ueGcxLPRx1Tr/XYExHnhbYLgveDs2J/wm36Hy4vbOwM="});
      if (i % 4 == 0) req.query.push_back({"max-keys", std::to_string(rng() % 1000 + 1)});
    }
    if (i % 2 == 0) req.headers.push_back({"Range", "bytes=" + std::to_string(i * 1000) + "-" + std::to_string(i * 1000 + 4194303)});
    if (i % 4 == 1) req.headers.push_back({"If-Match", "\"9b2cf535f27731c974343645a3985328-" + std::to_string(i) + "\""});
    granary::AwsCredentials creds{"AKID" + std::to_string(i), "secret/+key" + std::to_string(rng()),
                                  i % 7 == 0 ? "FwoGZXIvYXdzEJr//////////token" + std::to_string(i) : ""};
    std::string region = regions[rng() % regions.size()];
    std::time_t now = 1700000000 + static_cast<std::time_t>(rng() % 100000000);
    auto r = granary::SignV4(req, creds, region, "s3", now);
    nlohmann::json j = {{"method", req.method}, {"host", req.host},       {"path", req.path},
                        {"query", req.query},   {"headers", req.headers}, {"access_key", creds.access_key},
                        {"secret_key", creds.secret_key}, {"token", creds.session_token}, {"region", region},
                        {"time", now},          {"signature", r.signature}};
    std::printf("%s\n", j.dump().c_str());
  }
  return 0;
}
