// What a worker's answers carry besides bytes, encoded and decoded in this one place: where the
// bytes came from (LocalResponse.source, ReadBlockResponse.source) and, on the local socket, the
// status (LocalResponse.code / message / reason). The worker encodes, granary-fuse decodes.
#pragma once

#include <cstdint>

#include "common/status.h"
#include "proto/granary.pb.h"

namespace granary::rpc {

// Where the worker that answered got the bytes of a read: its cache, another worker, or the
// under-storage (a read that joined a fetch in flight counts where that fetch got them).
enum class ReadSource : uint32_t { kCache = 0, kPeer = 1, kUnderStorage = 2 };

inline uint32_t ToWire(ReadSource s) { return static_cast<uint32_t>(s); }
// A value this build does not know (a newer worker's) counts as the under-storage: the costliest.
inline ReadSource ReadSourceFromWire(uint32_t v) {
  switch (v) {
    case 0: return ReadSource::kCache;
    case 1: return ReadSource::kPeer;
    default: return ReadSource::kUnderStorage;
  }
}

// Range first (docs/architecture.md, the read path): a miss of `length` bytes at `offset` of a block
// `block_length` long (of a mount whose block size is `block_size`) that the worker answers from a
// ranged read of just those bytes, when it would fetch the block itself: at most kRangeFirstMax
// bytes and half the block, in a block of at least kRangeFirstMinBlock (a smaller one costs about
// one round trip whole), inside the block unless the read continues a sequential stream
// (ReadBlockRequest.continues), or anywhere in it when the read is a random one
// (ReadBlockRequest.random). The worker decides with it (BlockSource) and granary-fuse predicts the
// worker with it (fuse/source_reads.h): one rule for both.
inline constexpr uint64_t kRangeFirstMax = 1024 * 1024;
inline constexpr uint64_t kRangeFirstMinBlock = 1024 * 1024;
inline bool IsRangeFirst(uint64_t block_size, uint64_t block_length, uint64_t offset, uint64_t length, bool random,
                         bool continues) {
  return block_size >= kRangeFirstMinBlock && (random || (offset > 0 && !continues)) && length <= kRangeFirstMax &&
         length * 2 <= block_length;
}

inline void SetStatus(const Status& st, LocalResponse* resp) {
  resp->set_code(static_cast<int32_t>(st.code()));
  resp->set_message(st.message());
  resp->set_reason(static_cast<int32_t>(st.reason()));
}
// A code outside the ones this build knows (a malformed frame, a newer worker) is UNKNOWN.
inline Status StatusOf(const LocalResponse& resp) {
  const int32_t c = resp.code();
  const Code code = c >= 0 && c <= static_cast<int32_t>(Code::kUnauthenticated) ? static_cast<Code>(c) : Code::kUnknown;
  return Status(code, resp.message(), ReasonFromWire(resp.reason()));
}

}  // namespace granary::rpc
