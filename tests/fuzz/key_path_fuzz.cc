// Fuzzes the mapping from what the store names (URIs, object keys, paths) to what Granary names on
// disk and in its namespace: ParseUri/RedactUri, CheckRelativePath/JoinPath, and the cache's file
// names (a FileKey hashed from URI, path and version; DataPath/SidecarPath; ParseName). Checks:
// an accepted relative path has no empty, "." or ".." component and no leading '/'; a redacted
// URI keeps no user-info or query; cache file names are hex of the hash, never the key, and parse
// back to the same key and index.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "common/hash.h"
#include "ufs/ufs.h"
#include "worker/store/block_file.h"

using namespace granary;
namespace store = granary::worker::store;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string text(reinterpret_cast<const char*>(data), size);
  // Three fields separated by NUL: uri, path, version (a missing one is empty).
  std::string fields[3];
  for (size_t i = 0, f = 0; i < text.size() && f < 3; ++i) {
    if (text[i] == '\0') ++f;
    else fields[f].push_back(text[i]);
  }
  const std::string &uri = fields[0], &path = fields[1], &version = fields[2];

  if (CheckRelativePath(path).ok() && !path.empty()) {
    if (path.front() == '/' || path.back() == '/' || path.find("//") != std::string::npos) std::abort();
    size_t s = 0;
    for (;;) {
      size_t e = path.find('/', s);
      std::string part = path.substr(s, e == std::string::npos ? std::string::npos : e - s);
      if (part.empty() || part == "." || part == ".." || part.find('\0') != std::string::npos) std::abort();
      if (e == std::string::npos) break;
      s = e + 1;
    }
    if (!CheckRelativePath(JoinPath(path, "x")).ok()) std::abort();
  }

  if (auto u = ParseUri(uri); u.ok()) {
    std::string red = RedactUri(uri);
    if (red.find('?') != std::string::npos && !u->query.empty()) std::abort();
  }

  const FileKey key = MakeFileKey(uri, path, version);
  const std::string hex = FileKeyHex(key);
  FileKey back{};
  if (!ParseFileKeyHex(hex, &back) || back != key) std::abort();
  const uint64_t index = size;
  const std::string data_path = store::DataPath("/c", key), sidecar = store::SidecarPath("/c", key, index);
  for (const std::string& p : {data_path, sidecar}) {
    std::string name = p.substr(p.rfind('/') + 1);
    FileKey k{};
    uint64_t i = 0;
    bool is_sidecar = false;
    if (!store::ParseName(name, &k, &i, &is_sidecar) || k != key) std::abort();
    if (is_sidecar != (p == sidecar) || (is_sidecar && i != index)) std::abort();
    for (char c : name) {
      if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || c == '-' || c == '.' || c == 'm')) std::abort();
    }
  }
  // Names found on disk: any name parses or not, and one that parses is one we would have made.
  FileKey k{};
  uint64_t i = 0;
  bool is_sidecar = false;
  if (store::ParseName(text, &k, &i, &is_sidecar)) {
    std::string made = is_sidecar ? store::SidecarPath("", k, i) : store::DataPath("", k);
    if (made.substr(made.rfind('/') + 1) != text) std::abort();
  }
  ParseFileKeyHex(text, &k);
  return 0;
}
