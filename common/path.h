// Namespace paths: the one containment check every module uses.
#pragma once

#include <string_view>

namespace granary {

// Whether canonical absolute path `path` is `ancestor` or below it: /a/b is within /a and /, and
// /ab is not within /a. Both must be canonical (no trailing slash except "/" itself).
inline bool PathWithin(std::string_view path, std::string_view ancestor) {
  if (path == ancestor || ancestor == "/") return true;
  return path.size() > ancestor.size() && path.substr(0, ancestor.size()) == ancestor && path[ancestor.size()] == '/';
}

}  // namespace granary
