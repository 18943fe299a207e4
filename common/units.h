// Parsing and printing of the units that appear in configuration and CLI output.
//
// Sizes are written like Kubernetes quantities: a plain number of bytes ("4096"), binary suffixes
// Ki Mi Gi Ti Pi (powers of 1024) or decimal suffixes k M G T P (powers of 1000). Durations are a
// number with ms, s, m or h ("500ms", "3s", "1h"); a bare number means seconds. All functions are
// pure and thread-safe.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <string_view>

#include "common/status.h"

namespace granary {

StatusOr<uint64_t> ParseBytes(std::string_view text);
// "4Mi", "1.5Gi", "512" — exact binary suffix when it divides evenly, else one decimal.
std::string FormatBytes(uint64_t bytes);

StatusOr<std::chrono::milliseconds> ParseDuration(std::string_view text);
std::string FormatDuration(std::chrono::milliseconds d);

// true/false, yes/no, on/off, 1/0.
StatusOr<bool> ParseBool(std::string_view text);

StatusOr<uint64_t> ParseUint(std::string_view text);

}  // namespace granary
