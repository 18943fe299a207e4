#include "common/logging.h"

#include <spdlog/pattern_formatter.h>
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include <cstdio>

namespace granary {
namespace {

// %* : the message with every control character escaped (\n, \r, \t, \xNN), so a name that came
// from a user — a file name holding a newline — can never start a line of its own in the log.
class EscapedMessage : public spdlog::custom_flag_formatter {
 public:
  void format(const spdlog::details::log_msg& msg, const std::tm&, spdlog::memory_buf_t& dest) override {
    for (char c : msg.payload) {
      const unsigned char u = static_cast<unsigned char>(c);
      if (u >= 0x20 && u != 0x7f && c != '\\') {
        dest.push_back(c);
        continue;
      }
      const char* esc = c == '\n' ? "\\n" : c == '\r' ? "\\r" : c == '\t' ? "\\t" : c == '\\' ? "\\\\" : nullptr;
      char hex[5];
      if (esc == nullptr) {
        std::snprintf(hex, sizeof hex, "\\x%02x", u);
        esc = hex;
      }
      for (const char* p = esc; *p != '\0'; ++p) dest.push_back(*p);
    }
  }
  std::unique_ptr<custom_flag_formatter> clone() const override { return std::make_unique<EscapedMessage>(); }
};

}  // namespace

std::unique_ptr<spdlog::formatter> MakeLogFormatter() {
  auto f = std::make_unique<spdlog::pattern_formatter>();
  f->add_flag<EscapedMessage>('*').set_pattern("%Y-%m-%dT%H:%M:%S.%e %^%L%$ %n[%t] %*");
  return f;
}

void InitLogging(const std::string& program, const std::string& level) {
  auto logger = spdlog::stderr_color_mt(program);
  spdlog::set_default_logger(logger);
  spdlog::set_formatter(MakeLogFormatter());
  spdlog::set_level(spdlog::level::from_str(level));
  spdlog::flush_on(spdlog::level::warn);
}

}  // namespace granary
