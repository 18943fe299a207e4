// Requests refused as malformed or oversized (a frame longer than the protocol allows, a block size
// other than the mount's, a range outside the file): each is counted for the daemon's /metrics
// (granary_bad_requests_total) and logged, at most one line per kBadRequestLogEvery for each place, with the
// count of those not logged since. A flood of bad requests thus grows neither memory nor the log.
// Thread-safe.
#pragma once

#include <chrono>
#include <cstdint>

#include "common/status.h"

namespace granary {

inline constexpr std::chrono::seconds kBadRequestLogEvery{10};

// Counts one refusal at `where` (a static string: "local socket", "ReadBlock", ...) for `why`.
void NoteBadRequest(const char* where, const Status& why);
// Refusals counted in this process since it started.
uint64_t BadRequests();

}  // namespace granary
