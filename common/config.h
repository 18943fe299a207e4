// Config: every setting of every Granary binary, in one table.
//
// A setting has a dotted key ("worker.cache_quota"), a kind (size, duration, ...), a default, a unit
// and a one-line reason. Values come, in increasing precedence, from the default, a YAML file
// (`--config FILE`, sections nest as maps: `worker: {cache_quota: 20Gi}`) and the command line
// (`--worker.cache_quota 20Gi`, registered for every key by AddConfigFlags). Unknown keys, empty
// values and malformed values are errors that name the key and the expected form.
//
// The table (Config::Settings()) is also what `granary config` prints and what
// docs/configuration.md documents; a test keeps the two in step.
//
// Thread-safety: a Config is built once at start-up and then only read.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"
#include "common/tiers.h"

namespace CLI {
class App;
}

namespace granary {

// The range of master.block_size: a block is the most any one read request makes a worker allocate.
inline constexpr uint64_t kMinBlockSize = 64 * 1024;
inline constexpr uint64_t kMaxBlockSize = 256ull * 1024 * 1024;

struct MasterConfig {
  std::string listen;       // host:port the gRPC server binds (port 0: the OS picks)
  std::string metrics_listen;  // host:port of /metrics, /healthz, /readyz; "off": none
  std::string address;      // host:port clients dial; standby masters: several, comma-separated
  std::string data_dir;     // RocksDB directory
  uint64_t block_size = 0;  // bytes per block of new files
  std::chrono::milliseconds worker_timeout{};
  int64_t metadata_sync_ms = kSyncNever;  // default for mounts without metadata.sync_interval
  uint64_t rocksdb_cache = 0;             // bytes of RocksDB block cache
  // Standby masters (docs/architecture.md, "Master failover"): etcd's client URLs, comma-separated
  // (empty: one master, no election); the leader key's prefix; the lease; entries kept for standbys.
  std::string etcd_endpoints;
  std::string etcd_prefix;
  std::string etcd_tls_ca, etcd_tls_cert, etcd_tls_key;  // PEM files: etcd over TLS with a client certificate
  bool etcd_allow_plaintext = false;                      // accept http:// endpoints (loudly)
  std::string advertise;  // the address other masters and clients dial for this one; empty: derived
  std::chrono::milliseconds election_ttl{};
  uint64_t replication_log = 0;
};

struct TieredStoreConfig {
  CachePolicy policy = CachePolicy::kLru;  // for mounts that do not set cache.policy
  bool promote = true;                     // move blocks read from a lower tier up
  std::vector<TierLevel> levels;           // empty: one SSD level at worker.cache_dir
};

struct WorkerConfig {
  std::string listen;
  std::string metrics_listen;
  std::string advertise;  // address others dial; empty: derived from listen
  std::string cache_dir;
  uint64_t cache_quota = 0;
  std::chrono::milliseconds heartbeat_interval{};
  std::string local_socket;  // "auto", "off" or a path (zero-copy reads for the FUSE client)
  std::string local_socket_group;  // a group whose members read through the socket; "": none
  std::string staging_dir;   // where written files are staged (worker/writes.h); "auto": beside the cache
  uint64_t scrub_bandwidth = 0;  // bytes/s the background scrub verifies after the start-up pass; 0: off
  std::chrono::milliseconds trust_own_writes{};  // leases of a block put this recently are not checked
  TieredStoreConfig tieredstore;
  // The levels in effect: tieredstore.levels, or one SSD level at cache_dir with cache_quota.
  std::vector<TierLevel> EffectiveLevels() const;
};

struct FuseConfig {
  std::string mountpoint;
  std::string root;    // namespace path shown at the mount point
  std::string worker;  // the worker on this node
  std::string metrics_listen;
  std::chrono::milliseconds entry_timeout{};
  std::chrono::milliseconds attr_timeout{};
  std::chrono::milliseconds negative_timeout{};
  bool allow_other = true;
  uint64_t max_threads = 0;
  uint64_t file_cache_entries = 0;  // open-file info kept in the FUSE process
  bool keep_cache = true;           // keep the kernel's page cache across opens of an unchanged file
  bool writes = true;               // take writes to writable datasets (fuse/writes.h)
  bool zero_copy = true;            // read cached blocks through the worker's local socket
  bool source_reads = true;         // read uncached ranges of a local under-storage's files here
  uint64_t readahead_blocks = 0;    // blocks warmed ahead of a sequential reader
  std::string open = "auto";        // read mode: auto, kernel, passthrough or daemon (fuse/mount.h)
  std::string handover_socket;      // take-over socket of the serving process ("": derived from mountpoint)
  std::string keeper = "spawn";     // who keeps the connection across a crash: spawn, off or a socket path
  bool exit_after_handover = true;  // exit once handed over (false: idle until SIGTERM, for Kubernetes)
  std::chrono::milliseconds worker_wait{};  // how long a read waits for a restarting worker
  std::string transport = "dev";    // how requests reach granary-fuse: dev (/dev/fuse) or uring (fuse/uring.h)
  uint64_t uring_depth = 0;         // uring: entries (each with its own thread) per CPU queue
};

struct RpcConfig {
  std::string token_file;  // shared secret required on every call when set
  bool allow_unauthenticated = false;  // serve gRPC beyond loopback without a token, on purpose
  std::string tls_cert;    // PEM certificate chain of this server
  std::string tls_key;     // PEM private key of this server
  std::string tls_ca;      // PEM roots clients trust (and with a cert, enables TLS)
  std::chrono::milliseconds timeout{};
  std::chrono::milliseconds master_wait{};  // how long calls to the master retry UNAVAILABLE
};

// What a mount may name on a daemon's machine (ufs/access.h).
struct UfsConfig {
  std::string local_roots;  // comma-separated directories file:// mounts may be below; "": none
  std::string secrets_dir;  // directory credential files may be below; "": none
};

struct LogConfig {
  std::string level;
};

enum class SettingKind { kString, kAddress, kAddressList, kPath, kBytes, kDuration, kBool, kCount, kLogLevel, kPolicy, kTierLevels, kSyncInterval, kOpenMode };

struct Config;

struct Setting {
  std::string key;
  SettingKind kind;
  std::string default_value;
  std::string unit;  // "bytes", "duration", "host:port", ...
  std::string doc;
  std::function<Status(Config&, std::string_view)> set;
  std::function<std::string(const Config&)> get;
};

struct Config {
  MasterConfig master;
  WorkerConfig worker;
  FuseConfig fuse;
  RpcConfig rpc;
  UfsConfig ufs;
  LogConfig log;

  // Every setting, in documentation order.
  static const std::vector<Setting>& Settings();

  // A config with every default applied.
  static Config Defaults();

  // Sets one key from its text form; `source` is remembered for IsExplicit.
  Status Set(std::string_view key, std::string_view value, std::string_view source);
  // Loads a YAML file (overrides defaults for the keys it names).
  Status LoadFile(const std::string& path);
  Status LoadYaml(std::string_view text, std::string_view origin);

  // True when the key was given by a file or flag rather than left at its default.
  bool IsExplicit(std::string_view key) const { return explicit_.count(std::string(key)) > 0; }
  // The value of a key in text form ("" for unknown keys).
  std::string Get(std::string_view key) const;

 private:
  std::map<std::string, std::string> explicit_;  // key -> where it came from
};

// Command-line overrides gathered before the config file is read, applied after it.
struct ConfigFlags {
  std::string config_file;
  std::map<std::string, std::string> values;
};

// Registers `--config FILE` and one `--KEY VALUE` option per setting on `app`.
void AddConfigFlags(CLI::App& app, ConfigFlags* flags);

// Defaults, then the file named by --config (if any), then the flags.
StatusOr<Config> BuildConfig(const ConfigFlags& flags);

}  // namespace granary
