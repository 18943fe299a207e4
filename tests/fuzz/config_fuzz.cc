// Fuzzes what users type: mount options (`granary mount -o k=v ...`: ParseMountOptions, then
// SplitMountOptions with the secret policy), the tier levels' YAML, config files (Config::LoadYaml,
// every setting's parser) and the unit parsers. Any input gives a value or an error, never an
// exception across the module, a crash or a hang; and an accepted value reads back the same.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include "common/config.h"
#include "common/tiers.h"
#include "common/units.h"

using namespace granary;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string text(reinterpret_cast<const char*>(data), size);

  // Mount options: the input cut at ',' and '\n' into pairs, as a shell would pass several -o.
  std::vector<std::string> raw;
  size_t start = 0;
  for (size_t i = 0; i <= text.size(); ++i) {
    if (i == text.size() || text[i] == ',' || text[i] == '\n') {
      raw.push_back(text.substr(start, i - start));
      start = i + 1;
    }
  }
  auto options = ParseMountOptions(raw);
  if (options.ok()) {
    std::map<std::string, std::string> ufs;
    MountCacheOptions cache;
    if (SplitMountOptions(*options, &ufs, &cache).ok()) {
      if (cache.replicas < 1 || cache.replicas > kMaxReplicas) std::abort();
      for (const auto& [k, v] : ufs) {
        if (k.rfind("cache.", 0) == 0) std::abort();  // Granary's own options never reach a store
      }
    }
  }

  auto levels = ParseTierLevels(text);
  if (levels.ok()) {
    auto again = ParseTierLevels(FormatTierLevels(*levels));
    if (!again.ok() || FormatTierLevels(*again) != FormatTierLevels(*levels)) std::abort();
  }

  Config c = Config::Defaults();
  (void)c.LoadYaml(text, "fuzz.yaml");
  // One setting set from the input's first line, the rest as its value.
  size_t eq = text.find('=');
  if (eq != std::string::npos) (void)c.Set(text.substr(0, eq), text.substr(eq + 1), "fuzz");

  if (auto b = ParseBytes(text); b.ok()) {
    auto again = ParseBytes(FormatBytes(*b));
    (void)again;
  }
  (void)ParseDuration(text);
  (void)ParseBool(text);
  (void)ParseUint(text);
  if (auto s = ParseSyncInterval(text); s.ok()) {
    auto again = ParseSyncInterval(FormatSyncInterval(*s));
    if (!again.ok() || *again != *s) std::abort();
  }
  (void)ParseCachePolicy(text);
  (void)ParseWriteMode(text);
  return 0;
}
