// Fluid's ThinRuntime contract for a FUSE image, on Granary's side.
//
// Fluid starts the runtime's FUSE container with /etc/fluid/config/config.json:
//   {"mounts": [{"mountPoint": "s3://bucket/prefix", "name": "imagenet", "path": "/imagenet",
//                "options": {"endpoint": "http://..."},
//                "encryptOptions": [{"name": "access_key",
//                                    "valueFrom": {"secretKeyRef": {"name": "s3-cred", "key": "ak"}}}]}],
//    "targetPath": "/runtime-mnt/thin/<namespace>/<dataset>/thin-fuse",
//    "runtimeOptions": {"master": "granary-master-0.granary-master.granary:19998"},
//    "accessModes": ["ReadOnlyMany"]}
// and the secrets named by encryptOptions as files, /etc/fluid/secrets/<secret>/<key>.
//
// ParseFluidConfig turns that into a plan: each mount becomes a Granary mount at /<name> (or
// `path`) with its options; each encryptOption becomes the Granary option that takes a *file*
// (access_key_file, secret_key_file, session_token_file, fs.oss.accessKeySecret, ...), pointing at
// the secret's file — a secret's value is never read here or put in an argument. Unknown
// credential names are an error that lists the known ones. runtimeOptions may set `master`,
// `worker`, `block_size`-free Granary settings as `granary.<key>` (passed to granary-fuse as
// --<key>), and `root` (the namespace path to show; default: the single mount, else /).
// accessModes ReadWriteMany (or ReadWriteOnce) needs a writable mount (options.write: through or
// back, docs/semantics.md "Writes"); a Dataset whose mounts are all read-only is refused, naming
// the option.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "common/status.h"

namespace granary::cli {

struct FluidMount {
  std::string path;  // namespace path, e.g. /imagenet
  std::string uri;
  std::map<std::string, std::string> options;
};

struct FluidPlan {
  std::vector<FluidMount> mounts;
  std::string target_path;                      // where granary-fuse mounts
  std::string master;                           // "" : the config's master.address
  std::string root = "/";                       // fuse.root
  std::map<std::string, std::string> settings;  // extra granary-fuse settings (key -> value)
  // false when accessModes asks for writes (ReadWriteMany, ReadWriteOnce): allowed only when at
  // least one mount is writable (mount option write=through or write=back); the others answer
  // EROFS to writes as everywhere.
  bool read_only = true;
  std::vector<std::string> writable;  // namespace paths of the mounts with write=through|back
};

inline constexpr const char* kFluidConfig = "/etc/fluid/config/config.json";
inline constexpr const char* kFluidSecrets = "/etc/fluid/secrets";

StatusOr<FluidPlan> ParseFluidConfig(const std::string& json_text, const std::string& secrets_dir = kFluidSecrets);

}  // namespace granary::cli
