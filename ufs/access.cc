#include "ufs/access.h"

#include <limits.h>
#include <stdlib.h>

#include "common/config.h"
#include "common/path.h"
#include "ufs/ufs.h"

namespace granary {
namespace {

// `path` with every symbolic link resolved; empty when it cannot be (it does not exist).
std::string Resolved(const std::string& path) {
  char real[PATH_MAX];
  if (realpath(path.c_str(), real) == nullptr) return "";
  return real;
}

bool Below(const std::string& real, const std::string& dir) {
  std::string d = Resolved(dir);
  return !real.empty() && !d.empty() && PathWithin(real, d);
}

}  // namespace

StatusOr<UfsAccess> UfsAccess::FromConfig(const Config& cfg) {
  UfsAccess a;
  const std::string& roots = cfg.ufs.local_roots;
  size_t start = 0;
  while (start <= roots.size()) {
    size_t end = roots.find(',', start);
    if (end == std::string::npos) end = roots.size();
    std::string root = roots.substr(start, end - start);
    while (!root.empty() && root.front() == ' ') root.erase(0, 1);
    while (!root.empty() && root.back() == ' ') root.pop_back();
    if (!root.empty()) {
      if (root[0] != '/') {
        return InvalidArgumentError("ufs.local_roots: '" + root + "' is not an absolute path");
      }
      a.local_roots.push_back(root);
    }
    start = end + 1;
  }
  a.secrets_dir = cfg.ufs.secrets_dir;
  if (!a.secrets_dir.empty() && a.secrets_dir[0] != '/') {
    return InvalidArgumentError("ufs.secrets_dir: '" + a.secrets_dir + "' is not an absolute path");
  }
  return a;
}

std::vector<std::pair<std::string, std::string>> CredentialFiles(const std::map<std::string, std::string>& options) {
  std::vector<std::pair<std::string, std::string>> files;
  for (const auto& [k, v] : options) {
    bool file_key = k == "access_key_file" || k == "secret_key_file" || k == "session_token_file" ||
                    k == "credentials_file";
    bool oss_key = k == "fs.oss.accessKeyId" || k == "fs.oss.accessKeySecret" || k == "fs.oss.securityToken";
    if (file_key || (oss_key && !v.empty() && v[0] == '/')) files.emplace_back(k, v);
  }
  return files;
}

Status CheckMountAccess(const std::string& uri, const std::map<std::string, std::string>& options,
                        const UfsAccess& access) {
  if (access.unrestricted) return Status::OK();
  ASSIGN_OR_RETURN(ParsedUri p, ParseUri(uri));
  if (p.scheme == "file") {
    std::string real = Resolved(p.path);
    bool allowed = false;
    for (const auto& root : access.local_roots) allowed = allowed || Below(real, root);
    if (!allowed) {
      std::string roots;
      for (const auto& r : access.local_roots) roots += (roots.empty() ? "" : ",") + r;
      return PermissionDeniedError(
          "file://" + p.path + (real.empty() ? " does not exist" : real != p.path ? " (" + real + ")" : "") +
          " is not below a directory this daemon may serve (ufs.local_roots: " + (roots.empty() ? "none" : roots) +
          "); add its directory to ufs.local_roots in the master's and the workers' configuration to allow it");
    }
  }
  for (const auto& [key, path] : CredentialFiles(options)) {
    if (access.secrets_dir.empty() || !Below(Resolved(path), access.secrets_dir)) {
      return PermissionDeniedError("mount option " + key + ": " + path +
                                   " is not below the directory credential files may be read from (ufs.secrets_dir: " +
                                   (access.secrets_dir.empty() ? "none" : access.secrets_dir) +
                                   "); put the file there (a mounted Kubernetes Secret) or set ufs.secrets_dir");
    }
  }
  return Status::OK();
}

}  // namespace granary
