// S3Settings for an S3Ufs over a fake HTTP client in the ufs unit tests: bucket "bkt" under
// `prefix`, path-style, fixed test keys, an endpoint nothing listens on (the fake answers).
#pragma once

#include <string>

#include "ufs/s3_ufs.h"

namespace granary::testing {

inline S3Settings FakeS3Settings(const std::string& prefix) {
  S3Settings s;
  s.bucket = "bkt";
  s.prefix = prefix;
  s.endpoint = "http://127.0.0.1:1";
  s.region = "us-east-1";
  s.path_style = true;
  s.creds.access_key = "AK";
  s.creds.secret_key = "SK";
  return s;
}

}  // namespace granary::testing
