// Hashes used for identity and integrity (xxHash, XXH3).
//
// FileKey: the 128-bit identity of one version of one under-storage file, hash of
// (under-storage URI, path, version). Block files are named by it, never by the object key, and a new
// version of a file gets new keys, so bytes of two versions are never mixed.
// Checksum64: XXH3-64 over a byte range, for block chunk checksums.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace granary {

using FileKey = std::array<uint8_t, 16>;

FileKey MakeFileKey(std::string_view ufs_uri, std::string_view path, std::string_view version);
std::string FileKeyHex(const FileKey& key);
bool ParseFileKeyHex(std::string_view hex, FileKey* key);

uint64_t Checksum64(const void* data, size_t len);

}  // namespace granary
