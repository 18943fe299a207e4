// The metrics endpoint's port is its own: a second server on the same port is refused (issue 54:
// with SO_REUSEPORT, httplib's default, two `granary local` shared 19996 and a scrape reached
// either at random).
#include <gtest/gtest.h>

#include <memory>
#include <string>

#include "common/metrics.h"

namespace granary::metrics {
namespace {

TEST(MetricsServerTest, ASecondServerOnTheSamePortIsRefused) {
  auto render = [](Exposition* e) { e->Gauge("granary_test_value", "A value.", 1); };
  auto ready = [] { return Status::OK(); };
  auto first = MetricsServer::Start("127.0.0.1:0", render, ready);
  ASSERT_TRUE(first.ok()) << first.status().ToString();
  const std::string address = (*first)->address();
  auto second = MetricsServer::Start(address, render, ready);
  EXPECT_FALSE(second.ok()) << "two servers share " << address;
  if (!second.ok()) {
    EXPECT_NE(second.status().message().find("in use"), std::string::npos) << second.status().ToString();
  }
  // Once the first is gone the port is free again at once (SO_REUSEADDR).
  first->reset();
  auto again = MetricsServer::Start(address, render, ready);
  EXPECT_TRUE(again.ok()) << again.status().ToString();
}

}  // namespace
}  // namespace granary::metrics
