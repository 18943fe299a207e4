#include "common/tiers.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cstdlib>
#include <sstream>

#include "common/units.h"

namespace granary {
namespace {

// A cache directory's path as a level may name it: no control characters, quotes or backslashes,
// and valid UTF-8 — what FormatTierLevels writes back inside YAML double quotes unchanged.
bool PlainPath(const std::string& p) {
  for (size_t i = 0; i < p.size();) {
    const unsigned char c = static_cast<unsigned char>(p[i]);
    if (c < 0x20 || c == 0x7f || c == '"' || c == '\\') return false;
    size_t n = c < 0x80 ? 1 : (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xe ? 3 : (c >> 3) == 0x1e ? 4 : 0;
    if (n == 0 || i + n > p.size()) return false;
    for (size_t k = 1; k < n; ++k) {
      if ((static_cast<unsigned char>(p[i + k]) & 0xc0) != 0x80) return false;
    }
    i += n;
  }
  return true;
}

int MediumRank(const std::string& m) { return m == "MEM" ? 0 : m == "SSD" ? 1 : 2; }

std::vector<std::string> SplitComma(const std::string& s) {
  std::vector<std::string> out;
  std::string cur;
  std::stringstream ss(s);
  while (std::getline(ss, cur, ',')) {
    auto b = cur.find_first_not_of(" \t");
    auto e = cur.find_last_not_of(" \t");
    out.push_back(b == std::string::npos ? "" : cur.substr(b, e - b + 1));
  }
  return out;
}

StatusOr<double> ParseFraction(const std::string& what, const std::string& text) {
  char* end = nullptr;
  double v = std::strtod(text.c_str(), &end);
  if (text.empty() || end == nullptr || *end != '\0' || !(v > 0.0 && v <= 1.0)) {
    return InvalidArgumentError(what + ": '" + text + "' is not a fraction in (0, 1] (write it like \"0.95\")");
  }
  return v;
}

std::string ExactBytes(uint64_t b) {
  std::string f = FormatBytes(b);
  auto back = ParseBytes(f);
  return back.ok() && *back == b ? f : std::to_string(b);
}

std::string FormatFraction(double v) {
  std::ostringstream os;
  os << v;
  return os.str();
}

}  // namespace

StatusOr<CachePolicy> ParseCachePolicy(std::string_view text) {
  if (text == "lru") return CachePolicy::kLru;
  if (text == "shuffle") return CachePolicy::kShuffle;
  return InvalidArgumentError("'" + std::string(text) + "' is not a cache policy (lru or shuffle)");
}

const char* CachePolicyName(CachePolicy p) { return p == CachePolicy::kShuffle ? "shuffle" : "lru"; }

uint64_t TierLevel::quota() const {
  uint64_t q = 0;
  for (uint64_t v : quotas) q += v;
  return q;
}

StatusOr<std::vector<TierLevel>> ParseTierLevels(std::string_view yaml) {
  std::vector<TierLevel> out;
  YAML::Node root;
  try {
    root = YAML::Load(std::string(yaml));
  } catch (const YAML::Exception& e) {
    return InvalidArgumentError(std::string("not valid YAML: ") + e.what());
  }
  if (root.IsNull()) return out;
  if (!root.IsSequence()) {
    return InvalidArgumentError("expected a list of levels like [{mediumtype: MEM, path: /dev/shm/granary, quota: 2Gi}]");
  }
  for (size_t i = 0; i < root.size(); ++i) {
    const YAML::Node& n = root[i];
    std::string at = "level " + std::to_string(i);
    if (!n.IsMap()) return InvalidArgumentError(at + ": expected a map with mediumtype, path and quota");
    TierLevel l;
    std::string quota, quota_list, high, low;
    for (auto it = n.begin(); it != n.end(); ++it) {
      // A key that is itself a list or a map would throw from as<std::string>() (found by
      // tests/fuzz/config_fuzz.cc: an uncaught exception, a daemon down on one config value).
      if (!it->first.IsScalar()) return InvalidArgumentError(at + ": a field name must be a plain word");
      std::string k = it->first.Scalar();
      if (!it->second.IsScalar()) return InvalidArgumentError(at + ": " + k + ": expected a single value");
      std::string v = it->second.Scalar();
      if (k == "mediumtype") {
        std::transform(v.begin(), v.end(), v.begin(), ::toupper);
        l.medium = v;
      } else if (k == "path") {
        l.paths = SplitComma(v);
      } else if (k == "quota") {
        quota = v;
      } else if (k == "quotaList") {
        quota_list = v;
      } else if (k == "high") {
        high = v;
      } else if (k == "low") {
        low = v;
      } else if (k == "volumeType" || k == "volumeSource") {
        // Kubernetes volume details (Fluid); the worker only needs the path.
      } else {
        return InvalidArgumentError(at + ": unknown field '" + k +
                                    "' (expected mediumtype, path, quota, quotaList, high, low)");
      }
    }
    if (l.medium != "MEM" && l.medium != "SSD" && l.medium != "HDD") {
      return InvalidArgumentError(at + ": mediumtype must be MEM, SSD or HDD (got '" + l.medium + "')");
    }
    at += " (" + l.medium + ")";
    if (l.paths.empty()) return InvalidArgumentError(at + ": path is required");
    for (const auto& p : l.paths) {
      if (p.empty() || p[0] != '/') {
        return InvalidArgumentError(at + ": path '" + p + "' must be absolute (several paths: \"/a,/b\")");
      }
      if (!PlainPath(p)) {
        return InvalidArgumentError(at + ": a path may not hold control characters, quotes, backslashes or "
                                         "bytes that are not UTF-8; name a plain directory");
      }
    }
    if (!quota_list.empty()) {
      auto qs = SplitComma(quota_list);
      if (qs.size() != l.paths.size()) {
        return InvalidArgumentError(at + ": quotaList has " + std::to_string(qs.size()) + " entries for " +
                                    std::to_string(l.paths.size()) + " paths");
      }
      for (const auto& q : qs) {
        auto b = ParseBytes(q);
        if (!b.ok()) return InvalidArgumentError(at + ": quotaList: " + b.status().message());
        l.quotas.push_back(*b);
      }
    } else if (!quota.empty()) {
      auto b = ParseBytes(quota);
      if (!b.ok()) return InvalidArgumentError(at + ": quota: " + b.status().message());
      for (size_t p = 0; p < l.paths.size(); ++p) l.quotas.push_back(*b / l.paths.size());
    } else {
      return InvalidArgumentError(at + ": quota (or quotaList) is required, e.g. quota: 2Gi");
    }
    for (uint64_t q : l.quotas) {
      if (q < (1u << 20)) return InvalidArgumentError(at + ": each path needs a quota of at least 1Mi");
    }
    if (!high.empty()) {
      ASSIGN_OR_RETURN(l.high, ParseFraction(at + ": high", high));
    }
    if (!low.empty()) {
      ASSIGN_OR_RETURN(l.low, ParseFraction(at + ": low", low));
    }
    if (l.low > l.high) {
      return InvalidArgumentError(at + ": low (" + FormatFraction(l.low) + ") must not be above high (" +
                                  FormatFraction(l.high) + ")");
    }
    for (const auto& prev : out) {
      if (prev.medium == l.medium) return InvalidArgumentError(at + ": mediumtype " + l.medium + " appears twice");
      for (const auto& p : prev.paths) {
        if (std::find(l.paths.begin(), l.paths.end(), p) != l.paths.end()) {
          return InvalidArgumentError(at + ": path " + p + " is already used by the " + prev.medium + " level");
        }
      }
    }
    out.push_back(std::move(l));
  }
  std::stable_sort(out.begin(), out.end(),
                   [](const TierLevel& a, const TierLevel& b) { return MediumRank(a.medium) < MediumRank(b.medium); });
  return out;
}

std::string FormatTierLevels(const std::vector<TierLevel>& levels) {
  std::string s = "[";
  for (size_t i = 0; i < levels.size(); ++i) {
    const TierLevel& l = levels[i];
    std::string paths, quotas;
    for (size_t p = 0; p < l.paths.size(); ++p) {
      paths += (p ? "," : "") + l.paths[p];
      quotas += (p ? "," : "") + ExactBytes(l.quotas[p]);
    }
    s += (i ? ", " : "") + std::string("{mediumtype: ") + l.medium + ", path: \"" + paths + "\", quotaList: \"" +
         quotas + "\", high: \"" + FormatFraction(l.high) + "\", low: \"" + FormatFraction(l.low) + "\"}";
  }
  return s + "]";
}

StatusOr<int64_t> ParseSyncInterval(std::string_view text) {
  if (text == "never") return kSyncNever;
  if (text == "always") return 0;
  auto d = ParseDuration(text);
  if (!d.ok()) {
    return InvalidArgumentError("'" + std::string(text) +
                                "' is not a sync interval (never, always, or a duration like 30s or 5m)");
  }
  return static_cast<int64_t>(d->count());
}

std::string FormatSyncInterval(int64_t ms) {
  if (ms < 0) return "never";
  if (ms == 0) return "always";
  return FormatDuration(std::chrono::milliseconds(ms));
}

Status RefuseInlineSecrets(const std::map<std::string, std::string>& options) {
  for (const auto& [k, v] : options) {
    if (k == "access_key" || k == "secret_key" || k == "session_token") {
      return InvalidArgumentError("mount option " + k + " would keep a credential in process arguments, the master's " +
                                  "database and `granary mounts`; use " + k +
                                  "_file=PATH (a file holding it, such as a mounted Kubernetes Secret) or the "
                                  "environment instead");
    }
    if ((k == "fs.oss.accessKeySecret" || k == "fs.oss.securityToken") && (v.empty() || v[0] != '/')) {
      return InvalidArgumentError("mount option " + k +
                                  " must be the absolute path of a file holding the secret (such as a mounted "
                                  "Kubernetes Secret), not the secret itself");
    }
  }
  return Status::OK();
}

StatusOr<WriteMode> ParseWriteMode(std::string_view text) {
  if (text == "off") return WriteMode::kOff;
  if (text == "through") return WriteMode::kThrough;
  if (text == "back") return WriteMode::kBack;
  return InvalidArgumentError("'" + std::string(text) + "' is not off, through or back");
}

const char* WriteModeName(WriteMode m) {
  switch (m) {
    case WriteMode::kOff: return "off";
    case WriteMode::kThrough: return "through";
    case WriteMode::kBack: return "back";
  }
  return "off";
}

Status SplitMountOptions(const std::map<std::string, std::string>& all, std::map<std::string, std::string>* ufs,
                         MountCacheOptions* cache) {
  RETURN_IF_ERROR(RefuseInlineSecrets(all));
  for (const auto& [k, v] : all) {
    if (k == "metadata.sync_interval") {
      auto ms = ParseSyncInterval(v);
      if (!ms.ok()) return InvalidArgumentError("mount option metadata.sync_interval: " + ms.status().message());
      cache->metadata_sync_ms = *ms;
      continue;
    }
    if (k == "write") {
      auto m = ParseWriteMode(v);
      if (!m.ok()) return InvalidArgumentError("mount option write: " + m.status().message());
      cache->write = *m;
      continue;
    }
    if (k.rfind("cache.", 0) != 0 && k.rfind("metadata.", 0) != 0) {
      (*ufs)[k] = v;
      continue;
    }
    if (k == "cache.policy") {
      auto p = ParseCachePolicy(v);
      if (!p.ok()) return InvalidArgumentError("mount option cache.policy: " + p.status().message());
      cache->policy = *p;
    } else if (k == "cache.replicas") {
      auto n = ParseUint(v);
      if (!n.ok() || *n < 1 || *n > kMaxReplicas) {
        return InvalidArgumentError("mount option cache.replicas: '" + v + "' is not a whole number from 1 to " +
                                    std::to_string(kMaxReplicas));
      }
      cache->replicas = static_cast<uint32_t>(*n);
    } else if (k == "cache.elastic") {
      if (v != "true" && v != "false") {
        return InvalidArgumentError("mount option cache.elastic: '" + v + "' is not true or false");
      }
      cache->elastic = v == "true";
    } else if (k == "cache.fetch_ahead") {
      if (v != "true" && v != "false") {
        return InvalidArgumentError("mount option cache.fetch_ahead: '" + v + "' is not true or false");
      }
      cache->fetch_ahead = v == "true";
    } else if (k == "cache.fetch_ahead.bandwidth") {
      auto b = ParseBytes(v);
      if (!b.ok()) {
        return InvalidArgumentError("mount option cache.fetch_ahead.bandwidth: '" + v +
                                    "' is not bytes per second (such as 200MiB; 0 for no cap)");
      }
      cache->fetch_ahead_bandwidth = *b;
    } else if (k == "cache.fetch_ahead.inflight") {
      auto n = ParseUint(v);
      if (!n.ok() || *n < 1 || *n > kMaxFetchAheadInflight) {
        return InvalidArgumentError("mount option cache.fetch_ahead.inflight: '" + v +
                                    "' is not a whole number from 1 to " + std::to_string(kMaxFetchAheadInflight));
      }
      cache->fetch_ahead_inflight = static_cast<uint32_t>(*n);
    } else {
      return InvalidArgumentError("unknown mount option '" + k +
                                  "' (Granary's own options: cache.policy, cache.replicas, cache.elastic, cache.fetch_ahead, "
                                  "cache.fetch_ahead.bandwidth, cache.fetch_ahead.inflight, metadata.sync_interval, write)");
    }
  }
  return Status::OK();
}

StatusOr<std::map<std::string, std::string>> ParseMountOptions(const std::vector<std::string>& raw) {
  std::map<std::string, std::string> out;
  for (const auto& kv : raw) {
    size_t eq = kv.find('=');
    if (eq == std::string::npos || eq == 0) {
      return InvalidArgumentError("--option '" + kv.substr(0, kv.find('=')) + "' must be KEY=VALUE");
    }
    out[kv.substr(0, eq)] = kv.substr(eq + 1);
  }
  RETURN_IF_ERROR(RefuseInlineSecrets(out));  // before the options go anywhere
  return out;
}

}  // namespace granary
