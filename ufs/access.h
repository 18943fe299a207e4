// UfsAccess: what a mount may name on the machine of the daemon that opens it.
//
// Whoever holds the cluster's RPC token may mount datasets, and the daemons that open a mount (the
// master to list it, every worker to read it) run as root. Without a limit, a token holder could
// mount file:///etc and read root-only files through ReadBlock, or make the master read any file
// as a credential (access_key_file=/etc/shadow) and send it to an endpoint of the caller's choosing
// in an Authorization header. So a mount may name, on the daemon's machine:
//
//   a file:// path        only at or below one of `local_roots` (ufs.local_roots); none when empty
//                         (the cluster default). `granary local` allows its own source.
//   a credential file     (access_key_file, secret_key_file, session_token_file, credentials_file;
//                         fs.oss.accessKeyId, fs.oss.accessKeySecret and fs.oss.securityToken when
//                         given as a path) only at or below `secrets_dir` (ufs.secrets_dir); none
//                         when empty.
//
// Both are compared after every symbolic link is resolved (realpath), so a link below a root that
// points elsewhere is refused, and so is a path that does not exist yet. A refusal is
// PERMISSION_DENIED and names the setting that would allow it. Credentials the daemon finds on its
// own (its environment, ~/.aws/credentials) are its operator's choice and not checked here.
//
// Checked by OpenMount, so by every daemon that opens a mount with its own configuration.
// Immutable after construction; thread-safe.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "common/status.h"

namespace granary {

struct Config;

struct UfsAccess {
  // In-process tools and tests that open what their own user named: nothing is checked.
  bool unrestricted = false;
  std::vector<std::string> local_roots;  // absolute paths
  std::string secrets_dir;               // absolute path, or empty

  static UfsAccess Unrestricted() {
    UfsAccess a;
    a.unrestricted = true;
    return a;
  }
  // ufs.local_roots (comma-separated) and ufs.secrets_dir.
  static StatusOr<UfsAccess> FromConfig(const Config& cfg);
};

// OK when `uri` and the credential files `options` name are allowed by `access` (see above).
Status CheckMountAccess(const std::string& uri, const std::map<std::string, std::string>& options,
                        const UfsAccess& access);

// The mount options that name a file holding a credential, with the path each names (an OSS key id
// given as itself, not as a path, is not one).
std::vector<std::pair<std::string, std::string>> CredentialFiles(const std::map<std::string, std::string>& options);

}  // namespace granary
