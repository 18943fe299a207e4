#include "cli/fluid.h"

#include <nlohmann/json.hpp>

#include "common/tiers.h"

namespace granary::cli {
namespace {

// Fluid-side credential names (as users write them in Dataset encryptOptions) -> the Granary mount
// option that takes the path of a file holding the value.
const std::map<std::string, std::string>& CredentialOptions() {
  static const std::map<std::string, std::string> m{
      {"access_key", "access_key_file"},
      {"access-key", "access_key_file"},
      {"aws_access_key_id", "access_key_file"},
      {"fs.s3a.access.key", "access_key_file"},
      {"secret_key", "secret_key_file"},
      {"secret-key", "secret_key_file"},
      {"aws_secret_access_key", "secret_key_file"},
      {"fs.s3a.secret.key", "secret_key_file"},
      {"session_token", "session_token_file"},
      {"session-token", "session_token_file"},
      {"aws_session_token", "session_token_file"},
      {"credentials", "credentials_file"},
      {"fs.oss.accessKeySecret", "fs.oss.accessKeySecret"},
      {"fs.oss.securityToken", "fs.oss.securityToken"},
  };
  return m;
}

std::string KnownCredentials() {
  std::string out;
  for (const auto& [k, v] : CredentialOptions()) out += (out.empty() ? "" : ", ") + k;
  return out;
}

bool SafeComponent(const std::string& s) {
  return !s.empty() && s != "." && s != ".." && s.find('/') == std::string::npos;
}

}  // namespace

StatusOr<FluidPlan> ParseFluidConfig(const std::string& json_text, const std::string& secrets_dir) {
  auto j = nlohmann::json::parse(json_text, nullptr, false);
  if (j.is_discarded() || !j.is_object()) {
    return InvalidArgumentError("the Fluid config is not a JSON object (expected Fluid's config.json for ThinRuntime)");
  }
  FluidPlan plan;
  if (!j.contains("targetPath") || !j["targetPath"].is_string() || j["targetPath"].get<std::string>().empty()) {
    return InvalidArgumentError("the Fluid config has no targetPath (where the FUSE mount goes)");
  }
  plan.target_path = j["targetPath"].get<std::string>();
  if (plan.target_path[0] != '/') return InvalidArgumentError("targetPath '" + plan.target_path + "' is not absolute");
  if (!j.contains("mounts") || !j["mounts"].is_array() || j["mounts"].empty()) {
    return InvalidArgumentError("the Fluid config has no mounts (the Dataset's spec.mounts)");
  }
  for (size_t i = 0; i < j["mounts"].size(); ++i) {
    const auto& m = j["mounts"][i];
    const std::string at = "mounts[" + std::to_string(i) + "]";
    if (!m.is_object() || !m.contains("mountPoint") || !m["mountPoint"].is_string()) {
      return InvalidArgumentError(at + " has no mountPoint");
    }
    FluidMount fm;
    fm.uri = m["mountPoint"].get<std::string>();
    while (fm.uri.size() > 1 && fm.uri.back() == '/' && fm.uri.find("://") + 3 < fm.uri.size()) fm.uri.pop_back();
    std::string name = m.value("name", "");
    std::string path = m.value("path", "");
    if (!path.empty()) {
      if (path[0] != '/') path = "/" + path;
      fm.path = path;
    } else if (SafeComponent(name)) {
      fm.path = "/" + name;
    } else {
      return InvalidArgumentError(at + " needs a name (one path component) or a path");
    }
    if (m.contains("options")) {
      if (!m["options"].is_object()) return InvalidArgumentError(at + ".options is not a map");
      for (const auto& [k, v] : m["options"].items()) {
        if (!v.is_string()) return InvalidArgumentError(at + ".options." + k + " is not a string");
        if (CredentialOptions().count(k) && CredentialOptions().at(k).find("_file") != std::string::npos) {
          return InvalidArgumentError(at + ".options." + k + " is a credential: put it in encryptOptions (a Secret)");
        }
        fm.options[k] = v.get<std::string>();
      }
    }
    if (m.contains("encryptOptions")) {
      if (!m["encryptOptions"].is_array()) return InvalidArgumentError(at + ".encryptOptions is not a list");
      for (const auto& e : m["encryptOptions"]) {
        std::string ename = e.value("name", "");
        auto opt = CredentialOptions().find(ename);
        if (opt == CredentialOptions().end()) {
          return InvalidArgumentError(at + ".encryptOptions '" + ename +
                                      "' is not a credential Granary knows (known: " + KnownCredentials() + ")");
        }
        const auto* ref = e.contains("valueFrom") && e["valueFrom"].contains("secretKeyRef")
                              ? &e["valueFrom"]["secretKeyRef"]
                              : nullptr;
        std::string secret = ref ? ref->value("name", "") : "";
        std::string key = ref ? ref->value("key", "") : "";
        if (!SafeComponent(secret) || !SafeComponent(key)) {
          return InvalidArgumentError(at + ".encryptOptions '" + ename +
                                      "' needs valueFrom.secretKeyRef with a name and a key");
        }
        fm.options[opt->second] = secrets_dir + "/" + secret + "/" + key;
      }
    }
    plan.mounts.push_back(std::move(fm));
  }
  if (j.contains("runtimeOptions") && j["runtimeOptions"].is_object()) {
    for (const auto& [k, v] : j["runtimeOptions"].items()) {
      if (!v.is_string()) return InvalidArgumentError("runtimeOptions." + k + " is not a string");
      std::string val = v.get<std::string>();
      if (k == "master") {
        plan.master = val;
      } else if (k == "root") {
        plan.root = val;
      } else if (k.rfind("granary.", 0) == 0) {
        plan.settings[k.substr(8)] = val;
      } else {
        return InvalidArgumentError("runtimeOptions." + k + " is not a Granary option (master, root, granary.<setting>)");
      }
    }
  }
  if (!j.contains("runtimeOptions") || !j["runtimeOptions"].contains("root")) {
    plan.root = plan.mounts.size() == 1 ? plan.mounts[0].path : "/";
  }
  // Which mounts take writes: the mount option `write` (docs/semantics.md, "Writes"), checked here
  // so that a bad value is said before anything is mounted.
  for (size_t i = 0; i < plan.mounts.size(); ++i) {
    auto w = plan.mounts[i].options.find("write");
    if (w == plan.mounts[i].options.end()) continue;
    auto mode = ParseWriteMode(w->second);
    if (!mode.ok()) {
      return InvalidArgumentError("mounts[" + std::to_string(i) + "].options.write: " + mode.status().message());
    }
    if (*mode != WriteMode::kOff) plan.writable.push_back(plan.mounts[i].path);
  }
  if (j.contains("accessModes") && j["accessModes"].is_array()) {
    for (const auto& a : j["accessModes"]) {
      if (!a.is_string()) return InvalidArgumentError("accessModes holds a value that is not a string");
      const std::string mode = a.get<std::string>();
      if (mode.rfind("ReadWrite", 0) != 0) continue;
      if (plan.writable.empty()) {
        return InvalidArgumentError("accessModes " + mode +
                                    ": every mount of this Dataset is read-only; give the mounts to write to the "
                                    "option write=through or write=back (mounts[].options.write), or use "
                                    "ReadOnlyMany");
      }
      plan.read_only = false;
    }
  }
  return plan;
}

}  // namespace granary::cli
