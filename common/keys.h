// Byte encodings of keys, written once: big-endian integers (RocksDB keys that sort numerically)
// and FileKeys on the wire (16 raw bytes in a protobuf `bytes` field).
//
// Pure functions; thread-safe.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>

#include "common/hash.h"

namespace granary {

// Appends `v` as 8 big-endian bytes.
inline void PutBe64(std::string* out, uint64_t v) {
  for (int i = 7; i >= 0; --i) out->push_back(static_cast<char>((v >> (i * 8)) & 0xff));
}
inline std::string Be64(uint64_t v) {
  std::string s;
  s.reserve(8);
  PutBe64(&s, v);
  return s;
}
// The 8 big-endian bytes at `p` (the caller checked there are 8).
inline uint64_t GetBe64(const char* p) {
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v = v << 8 | static_cast<uint8_t>(p[i]);
  return v;
}
// The 8 big-endian bytes of `s` at `at`; 0 when `s` is too short.
inline uint64_t GetBe64(std::string_view s, size_t at) { return s.size() >= at + 8 ? GetBe64(s.data() + at) : 0; }

// A FileKey as the 16 raw bytes the protocol carries.
inline std::string FileKeyBytes(const FileKey& k) { return std::string(reinterpret_cast<const char*>(k.data()), k.size()); }
// The FileKey in `bytes`; false unless it is exactly 16 bytes.
inline bool FileKeyFromBytes(std::string_view bytes, FileKey* k) {
  if (bytes.size() != k->size()) return false;
  std::memcpy(k->data(), bytes.data(), k->size());
  return true;
}

}  // namespace granary
