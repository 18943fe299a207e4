#include "worker/stat_metrics.h"

#include <gtest/gtest.h>

#include <set>
#include <string>

namespace granary::worker {
namespace {

TEST(StatMetrics, EveryRowNamesAnIntegerFieldAndAUniqueMetric) {
  rpc::WorkerStats s;
  std::set<std::string> names;
  for (const StatMetric& m : kStatMetrics) {
    EXPECT_GE(StatValue(s, m.field), 0) << m.field << " is not an integer field of WorkerStats";
    EXPECT_TRUE(names.insert(m.metric).second) << m.metric;
    EXPECT_EQ(std::string(m.metric).rfind("granary_worker_", 0), 0u) << m.metric;
    EXPECT_EQ(std::string(m.metric).size() > 6 && std::string(m.metric).substr(std::string(m.metric).size() - 6) == "_total",
              !m.gauge)
        << m.metric << ": counters end in _total, gauges do not";
  }
  s.set_coalesced(7);
  EXPECT_EQ(StatValue(s, "coalesced"), 7);
  EXPECT_EQ(StatValue(s, "no_such_field"), -1);
  EXPECT_EQ(StatValue(s, "policy"), -1);  // a string
}

}  // namespace
}  // namespace granary::worker
