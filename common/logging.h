// Logging set-up: spdlog to stderr with a level from `log.level`. Call once from main before any
// thread starts; afterwards spdlog::info(...) and friends are safe from every thread.
// Never log credentials: log URIs through RedactUri (common/uri.h).
#pragma once

#include <string>

namespace granary {

void InitLogging(const std::string& program, const std::string& level);

}  // namespace granary
