// Logging set-up: spdlog to stderr with a level from `log.level`. Call once from main before any
// thread starts; afterwards spdlog::info(...) and friends are safe from every thread.
// Never log credentials: log URIs through RedactUri (common/uri.h). Messages may carry names users
// chose (file names, paths): the formatter escapes every control character in a message (\n, \r,
// \t, \xNN; a backslash as \\), so no such name can forge a log line.
#pragma once

#include <spdlog/formatter.h>

#include <memory>
#include <string>

namespace granary {

void InitLogging(const std::string& program, const std::string& level);

// The daemons' log line: time, level, program, thread, the escaped message.
std::unique_ptr<spdlog::formatter> MakeLogFormatter();

}  // namespace granary
