// The daemons' log format (common/logging.h): a message can never start a line of its own.
#include "common/logging.h"

#include <gtest/gtest.h>
#include <spdlog/sinks/ostream_sink.h>
#include <spdlog/spdlog.h>

#include <sstream>

namespace granary {
namespace {

std::string LogOnce(const std::string& message) {
  std::ostringstream out;
  auto sink = std::make_shared<spdlog::sinks::ostream_sink_mt>(out);
  spdlog::logger logger("granary-test", sink);
  logger.set_formatter(MakeLogFormatter());
  logger.warn("created {}", message);
  logger.flush();
  return out.str();
}

TEST(Logging, ANameWithANewlineCannotForgeALogLine) {
  const std::string forged = "x.bin\n2026-11-29T00:00:00.000 E granary-master[1] token stolen";
  std::string line = LogOnce(forged);
  ASSERT_FALSE(line.empty());
  EXPECT_EQ(line.find('\n'), line.size() - 1) << line;  // one line: only the sink's own newline
  EXPECT_NE(line.find("x.bin\\n2026-11-29T00:00:00.000 E granary-master[1] token stolen"), std::string::npos) << line;
}

TEST(Logging, ControlCharactersAndBackslashesAreEscaped) {
  std::string line = LogOnce(std::string("a\rb\tc\x1b[31md\\e\x7f", 14));
  EXPECT_NE(line.find("a\\rb\\tc\\x1b[31md\\\\e\\x7f"), std::string::npos) << line;
  EXPECT_EQ(line.find('\r'), std::string::npos);
  EXPECT_EQ(line.find('\x1b'), std::string::npos);
}

TEST(Logging, PlainTextIsUnchanged) {
  std::string line = LogOnce("/imagenet/n01440764/x.JPEG (110 KB, ünïcode)");
  EXPECT_NE(line.find("created /imagenet/n01440764/x.JPEG (110 KB, ünïcode)\n"), std::string::npos) << line;
}

}  // namespace
}  // namespace granary
