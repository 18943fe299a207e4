#include "common/hash.h"

#include <xxhash.h>

#include <cstring>

namespace granary {

FileKey MakeFileKey(std::string_view ufs_uri, std::string_view path, std::string_view version) {
  // Length-prefixed fields so ("a", "bc") and ("ab", "c") never collide.
  std::string buf;
  for (std::string_view part : {ufs_uri, path, version}) {
    uint64_t n = part.size();
    buf.append(reinterpret_cast<const char*>(&n), sizeof n);
    buf.append(part);
  }
  XXH128_hash_t h = XXH3_128bits(buf.data(), buf.size());
  XXH128_canonical_t canon;
  XXH128_canonicalFromHash(&canon, h);
  FileKey key;
  std::memcpy(key.data(), canon.digest, key.size());
  return key;
}

std::string FileKeyHex(const FileKey& key) {
  static const char kHex[] = "0123456789abcdef";
  std::string s;
  s.reserve(32);
  for (uint8_t b : key) {
    s.push_back(kHex[b >> 4]);
    s.push_back(kHex[b & 15]);
  }
  return s;
}

bool ParseFileKeyHex(std::string_view hex, FileKey* key) {
  if (hex.size() != 32) return false;
  auto nibble = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    return -1;
  };
  for (size_t i = 0; i < 16; ++i) {
    int hi = nibble(hex[2 * i]), lo = nibble(hex[2 * i + 1]);
    if (hi < 0 || lo < 0) return false;
    (*key)[i] = static_cast<uint8_t>(hi << 4 | lo);
  }
  return true;
}

uint64_t Checksum64(const void* data, size_t len) { return XXH3_64bits(data, len); }

}  // namespace granary
