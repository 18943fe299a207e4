#include "common/units.h"

#include <cctype>
#include <charconv>
#include <cmath>
#include <cstdio>

namespace granary {
namespace {

std::string_view Trim(std::string_view s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front()))) s.remove_prefix(1);
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.remove_suffix(1);
  return s;
}

// Splits "12.5Gi" into 12.5 and "Gi"; fails when there is no leading number.
bool SplitNumber(std::string_view s, double* number, std::string_view* suffix) {
  size_t i = 0;
  while (i < s.size() && (std::isdigit(static_cast<unsigned char>(s[i])) || s[i] == '.')) ++i;
  if (i == 0) return false;
  std::string num(s.substr(0, i));
  char* end = nullptr;
  *number = std::strtod(num.c_str(), &end);
  if (end != num.c_str() + num.size()) return false;
  *suffix = Trim(s.substr(i));
  return true;
}

}  // namespace

StatusOr<uint64_t> ParseUint(std::string_view text) {
  text = Trim(text);
  uint64_t v = 0;
  auto [p, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (text.empty() || ec != std::errc() || p != text.data() + text.size()) {
    return InvalidArgumentError("'" + std::string(text) + "' is not a whole number");
  }
  return v;
}

StatusOr<uint64_t> ParseBytes(std::string_view text) {
  std::string_view s = Trim(text);
  double number = 0;
  std::string_view suffix;
  auto bad = [&] {
    return InvalidArgumentError("'" + std::string(text) +
                                "' is not a size (write bytes, or a number with Ki, Mi, Gi, Ti, e.g. 512Mi, 10Gi)");
  };
  if (!SplitNumber(s, &number, &suffix)) return bad();
  static constexpr struct {
    std::string_view name;
    double mult;
  } kSuffixes[] = {
      {"", 1},          {"B", 1},           {"Ki", 1024.0},     {"Mi", 1048576.0},
      {"Gi", 1073741824.0}, {"Ti", 1099511627776.0}, {"Pi", 1125899906842624.0},
      {"k", 1e3},       {"K", 1e3},         {"M", 1e6},         {"G", 1e9},
      {"T", 1e12},      {"P", 1e15},
  };
  for (const auto& suf : kSuffixes) {
    if (suffix == suf.name) {
      double bytes = number * suf.mult;
      // llround() is undefined past int64 (found by tests/fuzz/config_fuzz.cc): 8 EiB at most.
      if (!(bytes < 9.2e18)) return bad();
      return static_cast<uint64_t>(std::llround(bytes));
    }
  }
  return bad();
}

std::string FormatBytes(uint64_t bytes) {
  static constexpr const char* kNames[] = {"Ki", "Mi", "Gi", "Ti", "Pi"};
  if (bytes < 1024) return std::to_string(bytes);
  double v = static_cast<double>(bytes);
  int unit = -1;
  while (v >= 1024 && unit < 4) {
    v /= 1024;
    ++unit;
  }
  char buf[32];
  if (v == std::floor(v)) {
    std::snprintf(buf, sizeof buf, "%.0f%s", v, kNames[unit]);
  } else {
    std::snprintf(buf, sizeof buf, "%.1f%s", v, kNames[unit]);
  }
  return buf;
}

StatusOr<std::chrono::milliseconds> ParseDuration(std::string_view text) {
  std::string_view s = Trim(text);
  double number = 0;
  std::string_view suffix;
  if (!SplitNumber(s, &number, &suffix)) {
    return InvalidArgumentError("'" + std::string(text) + "' is not a duration (e.g. 500ms, 3s, 5m, 1h)");
  }
  double ms;
  if (suffix.empty() || suffix == "s") {
    ms = number * 1000;
  } else if (suffix == "ms") {
    ms = number;
  } else if (suffix == "m") {
    ms = number * 60'000;
  } else if (suffix == "h") {
    ms = number * 3'600'000;
  } else {
    return InvalidArgumentError("'" + std::string(text) + "' is not a duration (e.g. 500ms, 3s, 5m, 1h)");
  }
  // "1322...2ms" wrapped to a negative duration (found by tests/fuzz/config_fuzz.cc); a duration
  // is at most 1e15 ms (31,000 years) here, and never inf or NaN.
  if (!(ms <= 1e15)) {
    return InvalidArgumentError("'" + std::string(text) + "' is too long a duration (e.g. 500ms, 3s, 5m, 1h)");
  }
  return std::chrono::milliseconds(static_cast<int64_t>(std::llround(ms)));
}

std::string FormatDuration(std::chrono::milliseconds d) {
  int64_t ms = d.count();
  if (ms % 3'600'000 == 0 && ms != 0) return std::to_string(ms / 3'600'000) + "h";
  if (ms % 60'000 == 0 && ms != 0) return std::to_string(ms / 60'000) + "m";
  if (ms % 1000 == 0) return std::to_string(ms / 1000) + "s";
  return std::to_string(ms) + "ms";
}

StatusOr<bool> ParseBool(std::string_view text) {
  std::string s(Trim(text));
  for (auto& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if (s == "true" || s == "yes" || s == "on" || s == "1") return true;
  if (s == "false" || s == "no" || s == "off" || s == "0") return false;
  return InvalidArgumentError("'" + std::string(text) + "' is not true or false");
}

}  // namespace granary
