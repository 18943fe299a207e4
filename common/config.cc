#include "common/config.h"

#include <yaml-cpp/yaml.h>

#include <CLI/CLI.hpp>
#include <fstream>
#include <sstream>

#include "common/net.h"
#include "common/units.h"

namespace granary {
namespace {

template <typename T>
StatusOr<T> ParseAs(SettingKind kind, std::string_view text);

template <>
StatusOr<std::string> ParseAs<std::string>(SettingKind kind, std::string_view text) {
  std::string v(text);
  if (kind == SettingKind::kAddress && !v.empty() && v != "off") {
    auto hp = ParseHostPort(v);
    if (!hp.ok()) return hp.status();
  }
  if (kind == SettingKind::kAddressList) {
    if (v.empty()) return InvalidArgumentError("an empty list of addresses (give host:port, or several comma-separated)");
    size_t start = 0;
    for (;;) {
      size_t comma = v.find(',', start);
      std::string one = v.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
      auto hp = ParseHostPort(one);
      if (!hp.ok()) return InvalidArgumentError("'" + one + "' in '" + v + "': " + hp.status().message());
      if (comma == std::string::npos) break;
      start = comma + 1;
    }
  }
  if (kind == SettingKind::kLogLevel) {
    static const char* kLevels[] = {"trace", "debug", "info", "warn", "error", "critical", "off"};
    for (const char* l : kLevels) {
      if (v == l) return v;
    }
    return InvalidArgumentError("'" + v + "' is not a log level (trace, debug, info, warn, error, critical, off)");
  }
  if (kind == SettingKind::kOpenMode && v != "auto" && v != "kernel" && v != "passthrough" && v != "daemon") {
    return InvalidArgumentError("'" + v + "' is not a read mode (auto, kernel, passthrough or daemon)");
  }
  return v;
}
template <>
StatusOr<uint64_t> ParseAs<uint64_t>(SettingKind kind, std::string_view text) {
  return kind == SettingKind::kBytes ? ParseBytes(text) : ParseUint(text);
}
template <>
StatusOr<std::chrono::milliseconds> ParseAs<std::chrono::milliseconds>(SettingKind, std::string_view text) {
  return ParseDuration(text);
}
template <>
StatusOr<CachePolicy> ParseAs<CachePolicy>(SettingKind, std::string_view text) {
  return ParseCachePolicy(text);
}
template <>
StatusOr<std::vector<TierLevel>> ParseAs<std::vector<TierLevel>>(SettingKind, std::string_view text) {
  return ParseTierLevels(text);
}
template <>
StatusOr<int64_t> ParseAs<int64_t>(SettingKind, std::string_view text) {
  return ParseSyncInterval(text);
}
template <>
StatusOr<bool> ParseAs<bool>(SettingKind, std::string_view text) {
  return ParseBool(text);
}

std::string Show(SettingKind, const std::string& v) { return v; }
std::string Show(SettingKind kind, uint64_t v) {
  return kind == SettingKind::kBytes ? FormatBytes(v) : std::to_string(v);
}
std::string Show(SettingKind, std::chrono::milliseconds v) { return FormatDuration(v); }
std::string Show(SettingKind, bool v) { return v ? "true" : "false"; }
std::string Show(SettingKind, int64_t v) { return FormatSyncInterval(v); }
std::string Show(SettingKind, CachePolicy v) { return CachePolicyName(v); }
std::string Show(SettingKind, const std::vector<TierLevel>& v) { return v.empty() ? "" : FormatTierLevels(v); }

const char* UnitOf(SettingKind kind) {
  switch (kind) {
    case SettingKind::kString: return "text";
    case SettingKind::kAddress: return "host:port";
    case SettingKind::kAddressList: return "host:port[,host:port...]";
    case SettingKind::kPath: return "path";
    case SettingKind::kBytes: return "bytes (512Mi, 10Gi)";
    case SettingKind::kDuration: return "duration (500ms, 3s, 1m)";
    case SettingKind::kBool: return "true/false";
    case SettingKind::kCount: return "count";
    case SettingKind::kLogLevel: return "level";
    case SettingKind::kOpenMode: return "mode";
    case SettingKind::kPolicy: return "lru or shuffle";
    case SettingKind::kTierLevels: return "list of levels";
    case SettingKind::kSyncInterval: return "never, always or a duration";
  }
  return "";
}

// One table row bound to a field of a section of Config.
template <typename Section, typename T>
Setting Row(std::string key, SettingKind kind, std::string def, std::string doc, Section Config::*section,
            T Section::*field) {
  Setting s;
  s.key = std::move(key);
  s.kind = kind;
  s.default_value = std::move(def);
  s.unit = UnitOf(kind);
  s.doc = std::move(doc);
  s.set = [kind, section, field](Config& c, std::string_view text) -> Status {
    auto v = ParseAs<T>(kind, text);
    if (!v.ok()) return v.status();
    (c.*section).*field = std::move(v).value();
    return Status::OK();
  };
  s.get = [kind, section, field](const Config& c) { return Show(kind, (c.*section).*field); };
  return s;
}

// A row bound to a field of worker.tieredstore.
template <typename T>
Setting TierRow(std::string key, SettingKind kind, std::string def, std::string doc, T TieredStoreConfig::*field) {
  Setting s;
  s.key = std::move(key);
  s.kind = kind;
  s.default_value = std::move(def);
  s.unit = UnitOf(kind);
  s.doc = std::move(doc);
  s.set = [kind, field](Config& c, std::string_view text) -> Status {
    auto v = ParseAs<T>(kind, text);
    if (!v.ok()) return v.status();
    c.worker.tieredstore.*field = std::move(v).value();
    return Status::OK();
  };
  s.get = [kind, field](const Config& c) { return Show(kind, c.worker.tieredstore.*field); };
  return s;
}

std::vector<Setting> MakeSettings() {
  using K = SettingKind;
  std::vector<Setting> t;
  // master
  t.push_back(Row("master.listen", K::kAddress, "0.0.0.0:19998",
                  "Where granary-master's gRPC server listens. Port 0 lets the OS pick a free port.",
                  &Config::master, &MasterConfig::listen));
  t.push_back(Row("master.metrics_listen", K::kAddress, "0.0.0.0:19996",
                  "Where granary-master serves Prometheus /metrics and the /healthz and /readyz probes (HTTP). "
                  "off: no endpoint. A busy port leaves it off with a warning.",
                  &Config::master, &MasterConfig::metrics_listen));
  t.push_back(Row("master.address", K::kAddressList, "127.0.0.1:19998",
                  "Where workers, FUSE clients and the CLI reach the master. With standby masters: every "
                  "master, comma-separated (or one name that reaches any of them); clients find the leader "
                  "by themselves and follow it across failovers.",
                  &Config::master, &MasterConfig::address));
  t.push_back(Row("master.data_dir", K::kPath, "/var/lib/granary/master",
                  "RocksDB directory holding the namespace and mount table. Put it on a persistent volume.",
                  &Config::master, &MasterConfig::data_dir));
  t.push_back(Row("master.block_size", K::kBytes, "4Mi",
                  "Files are cached in blocks of this size. 4Mi keeps a ~110 KB image in one block and splits a "
                  "56 MB shard into 14 blocks that several workers can fetch in parallel.",
                  &Config::master, &MasterConfig::block_size));
  t.push_back(Row("master.worker_timeout", K::kDuration, "30s",
                  "A worker that has not sent a heartbeat for this long is considered lost: it leaves the "
                  "membership (block placement) and its cache stops counting in the cached figures.",
                  &Config::master, &MasterConfig::worker_timeout));
  t.push_back(Row("master.metadata_sync_interval", K::kSyncInterval, "never",
                  "How often a mount's directories and files are checked again against the under-storage, for "
                  "mounts without the metadata.sync_interval option: never (fastest; changes need a remount), "
                  "always (every lookup, listing and open asks the under-storage), or a duration such as 5m. See "
                  "\"Metadata consistency\".",
                  &Config::master, &MasterConfig::metadata_sync_ms));
  t.push_back(Row("master.rocksdb_cache", K::kBytes, "256Mi",
                  "RocksDB block cache of the namespace. The master's memory stays near this plus a fixed base "
                  "however many files are mounted; a larger cache makes cold metadata faster.",
                  &Config::master, &MasterConfig::rocksdb_cache));
  t.push_back(Row("master.etcd_endpoints", K::kString, "",
                  "etcd client URLs (https://host:2379, comma-separated) through which several granary-masters "
                  "elect one leader; the others are standbys that keep a copy of the namespace and take over "
                  "within about master.election_ttl when the leader goes. Empty: one master, no election.",
                  &Config::master, &MasterConfig::etcd_endpoints));
  t.push_back(Row("master.etcd_prefix", K::kString, "/granary",
                  "Prefix of the keys the masters keep in etcd (the leader key is <prefix>/master/leader): one "
                  "per Granary cluster sharing an etcd.",
                  &Config::master, &MasterConfig::etcd_prefix));
  t.push_back(Row("master.etcd_tls_ca", K::kString, "",
                  "PEM file of the roots that verify etcd's certificate (empty: the system's roots).",
                  &Config::master, &MasterConfig::etcd_tls_ca));
  t.push_back(Row("master.etcd_tls_cert", K::kString, "",
                  "PEM file of the masters' client certificate for etcd (etcd's --client-cert-auth: only its "
                  "holders may name a leader). Set with master.etcd_tls_key.",
                  &Config::master, &MasterConfig::etcd_tls_cert));
  t.push_back(Row("master.etcd_tls_key", K::kString, "", "PEM file of that certificate's private key.",
                  &Config::master, &MasterConfig::etcd_tls_key));
  t.push_back(Row("master.etcd_allow_plaintext", K::kBool, "false",
                  "Accept http:// etcd endpoints. Whoever can write to etcd decides which master the standbys "
                  "follow, so plain HTTP is refused unless this says it is meant (a loud warning then).",
                  &Config::master, &MasterConfig::etcd_allow_plaintext));
  t.push_back(Row("master.advertise", K::kAddress, "",
                  "The address other masters and clients dial for this master (what it stands for in the "
                  "election). Empty: master.listen, with 0.0.0.0 replaced by this host's name.",
                  &Config::master, &MasterConfig::advertise));
  t.push_back(Row("master.election_ttl", K::kDuration, "5s",
                  "The leader's lease in etcd. A leader that cannot renew it stops leading before it ends; the "
                  "standby furthest along takes over about 1.5 s after the lease ends (within this long "
                  "and 1.5 s of a kill).",
                  &Config::master, &MasterConfig::election_ttl));
  t.push_back(Row("master.replication_log", K::kBytes, "64Mi",
                  "With standby masters: the most recent namespace writes kept in memory, so a standby that "
                  "fell behind catches up from them; one further behind copies the whole namespace.",
                  &Config::master, &MasterConfig::replication_log));
  // worker
  t.push_back(Row("worker.listen", K::kAddress, "0.0.0.0:29999",
                  "Where granary-worker's gRPC server listens (FUSE clients and peers read blocks here).",
                  &Config::worker, &WorkerConfig::listen));
  t.push_back(Row("worker.metrics_listen", K::kAddress, "0.0.0.0:29996",
                  "Where granary-worker serves Prometheus /metrics and the /healthz and /readyz probes (HTTP). "
                  "off: no endpoint.",
                  &Config::worker, &WorkerConfig::metrics_listen));
  t.push_back(Row("worker.advertise", K::kAddress, "",
                  "The address the master hands to others for this worker. Empty: the listen address, with "
                  "0.0.0.0 replaced by this host's name.",
                  &Config::worker, &WorkerConfig::advertise));
  t.push_back(Row("worker.local_socket", K::kString, "auto",
                  "Unix domain socket through which the FUSE client on this node reads cached blocks without "
                  "copying them (their file descriptors are passed and spliced). auto: "
                  "/run/granary/worker-<port>.sock; off: none (reads then go over gRPC); or a path. The FUSE "
                  "client learns it from the worker, so in Kubernetes both pods need the directory (hostPath).",
                  &Config::worker, &WorkerConfig::local_socket));
  t.push_back(Row("worker.local_socket_group", K::kString, "",
                  "A group (a name, or a gid as a number) whose members may read through worker.local_socket without being root: the Python "
                  "client (granary:// for fsspec, docs/python.md) in a training process that is not root. The "
                  "socket becomes 0660 to this group (and /run/granary 0750, with local_socket auto); its members "
                  "see the namespace and read the files their uid and primary gid may read by the files' modes, "
                  "and nothing else: no writes. Empty: only root and the worker's own user may connect "
                  "(docs/security.md).",
                  &Config::worker, &WorkerConfig::local_socket_group));
  t.push_back(Row("worker.staging_dir", K::kString, "auto",
                  "Where files written through a writable mount (mount option write=through or back) are staged "
                  "before and while they are uploaded; with write=back, what is staged here survives a restart "
                  "and is uploaded then. auto: <dir>.staging beside the first cache directory that is not MEM. Needs room for "
                  "the files being written at once (a full disk gives the writer ENOSPC).",
                  &Config::worker, &WorkerConfig::staging_dir));
  t.push_back(Row("worker.scrub_bandwidth", K::kBytes, "16Mi",
                  "Bytes per second the background scrub reads to verify every cached block's checksums, over and "
                  "over, after the full pass at start. Reads through the worker verify what they touch anyway; "
                  "the scrub is what finds a damaged block that only the kernel reads (fuse.open passthrough). 0 "
                  "scrubs at start only; more finds damage sooner and costs disk bandwidth.",
                  &Config::worker, &WorkerConfig::scrub_bandwidth));
  t.push_back(Row("worker.trust_own_writes", K::kDuration, "10s",
                  "For this long after the worker writes a fetched block into its cache, the FUSE client's "
                  "zero-copy reads of it skip its checksum check: the sums were computed from the very bytes "
                  "written (docs/block_format.md, \"Verification\"). A cold epoch reads nearly every block within a "
                  "second of its arrival, and a large block, written around the page cache, would be read back "
                  "from the disk and hashed again. Copies for peers and replicas, whole-file leases (read "
                  "leases, passthrough) and the scrub always check. 0s: every read checks what it touches (but "
                  "for pages still dirty from the write).",
                  &Config::worker, &WorkerConfig::trust_own_writes));
  t.push_back(Row("worker.cache_dir", K::kPath, "/var/cache/granary",
                  "Directory holding cached blocks (0700; block files 0600, named by hash).", &Config::worker,
                  &WorkerConfig::cache_dir));
  t.push_back(Row("worker.cache_quota", K::kBytes, "10Gi",
                  "Most bytes of block files the worker keeps in cache_dir (when worker.tieredstore.levels is "
                  "empty).",
                  &Config::worker, &WorkerConfig::cache_quota));
  t.push_back(Row("worker.heartbeat_interval", K::kDuration, "3s",
                  "How often the worker reports its health and counters to the master.", &Config::worker,
                  &WorkerConfig::heartbeat_interval));
  t.push_back(TierRow("worker.tieredstore.policy", K::kPolicy, "lru",
                      "Cache policy for mounts that do not choose one (mount option cache.policy). lru evicts the "
                      "least recently used blocks. shuffle is for epoch-style reading of a dataset larger than "
                      "the cache: once the cache is full, a dataset's blocks stop replacing its own cached blocks, "
                      "so every epoch hits on the fraction that fits instead of on almost nothing.",
                      &TieredStoreConfig::policy));
  t.push_back(TierRow("worker.tieredstore.promote", K::kBool, "true",
                      "Move a block read from a lower tier up to the tier above when that tier is below its high "
                      "watermark.",
                      &TieredStoreConfig::promote));
  t.push_back(TierRow("worker.tieredstore.levels", K::kTierLevels, "",
                      "Cache tiers, fastest first: a list of {mediumtype: MEM|SSD|HDD, path: \"/a,/b\", quota: "
                      "2Gi (or quotaList: \"1Gi,1Gi\"), high: \"0.95\", low: \"0.7\"}, as Fluid writes them. "
                      "Empty: one SSD level at worker.cache_dir with worker.cache_quota. A path must be absolute, "
                      "valid UTF-8, and hold no control characters, quotes or backslashes. See \"Sizing the cache\".",
                      &TieredStoreConfig::levels));
  // fuse
  t.push_back(Row("fuse.mountpoint", K::kPath, "/data", "Where granary-fuse mounts the namespace.",
                  &Config::fuse, &FuseConfig::mountpoint));
  t.push_back(Row("fuse.root", K::kPath, "/",
                  "The namespace path shown at the mount point: / shows every mounted dataset as a folder; "
                  "/imagenet shows that dataset's files directly.",
                  &Config::fuse, &FuseConfig::root));
  t.push_back(Row("fuse.worker", K::kAddress, "127.0.0.1:29999",
                  "The worker on this node, which serves every read of this FUSE client.", &Config::fuse,
                  &FuseConfig::worker));
  t.push_back(Row("fuse.metrics_listen", K::kAddress, "0.0.0.0:29997",
                  "Where granary-fuse serves Prometheus /metrics and the /healthz and /readyz probes (HTTP). "
                  "off: no endpoint.",
                  &Config::fuse, &FuseConfig::metrics_listen));
  t.push_back(Row("fuse.entry_timeout", K::kDuration, "60s",
                  "How long the kernel may cache a name lookup. Longer is faster for directory scans; "
                  "the namespace only changes when a dataset is mounted or unmounted.",
                  &Config::fuse, &FuseConfig::entry_timeout));
  t.push_back(Row("fuse.attr_timeout", K::kDuration, "60s", "How long the kernel may cache file attributes.",
                  &Config::fuse, &FuseConfig::attr_timeout));
  t.push_back(Row("fuse.negative_timeout", K::kDuration, "5s",
                  "How long the kernel may remember that a name does not exist.", &Config::fuse,
                  &FuseConfig::negative_timeout));
  t.push_back(Row("fuse.keep_cache", K::kBool, "true",
                  "Keep the kernel's page cache of a file across opens while its version is unchanged, so a "
                  "re-read costs no request at all. The pages count against the node's memory like any file "
                  "cache; false makes every open read from the worker (benchmarks of the tiers want that).",
                  &Config::fuse, &FuseConfig::keep_cache));
  t.push_back(Row("fuse.writes", K::kBool, "true",
                  "Take writes to datasets mounted writable (mount option write=through or back). In the kernel "
                  "read mode a mount that shows no writable dataset still opens files without asking granary-fuse "
                  "(its superblock read-only); the first writable dataset shown puts a new FUSE connection, which "
                  "asks granary-fuse at every open as writes need, at the mount point (as root, Linux >= 6.5, "
                  "fuse.transport dev; else opens keep coming from the start). false mounts read-only and answers "
                  "every write with EROFS. See \"Read modes\".",
                  &Config::fuse, &FuseConfig::writes));
  t.push_back(Row("fuse.open", K::kOpenMode, "auto",
                  "How reads of cached files reach their bytes. kernel: opens are answered by the kernel itself "
                  "(no OPEN, RELEASE or FLUSH request) and a re-read is served from the page cache without asking "
                  "granary-fuse. passthrough: a file wholly cached on this node's worker is opened on its cache data "
                  "file, and the kernel reads it (read, pread, mmap) straight from there; other files go through "
                  "granary-fuse. daemon: every open and every uncached read asks granary-fuse (the version of a "
                  "file is pinned per open). auto: passthrough for datasets of large files (8 MiB a file on "
                  "average) or larger than half the node's memory, when the kernel offers it (Linux >= 6.9) and granary-fuse has CAP_SYS_ADMIN, else "
                  "kernel. A mode that cannot work falls "
                  "back (logged once, and in /metrics as granary_fuse_open_mode). See \"Read modes\".",
                  &Config::fuse, &FuseConfig::open));
  t.push_back(Row("fuse.handover_socket", K::kPath, "",
                  "Unix socket on which the serving granary-fuse hands its live FUSE connection over to a "
                  "successor: starting granary-fuse with the same configuration while one runs takes the mount "
                  "over with no error to readers (fuse/handover.h). Empty: /run/granary/fuse-<hash of "
                  "fuse.mountpoint>.sock (under $XDG_RUNTIME_DIR or /tmp when /run/granary is not writable).",
                  &Config::fuse, &FuseConfig::handover_socket));
  t.push_back(Row("fuse.keeper", K::kString, "spawn",
                  "What keeps the FUSE connection alive when granary-fuse dies, so that the next granary-fuse "
                  "takes it over instead of readers seeing \"Transport endpoint is not connected\". spawn: a "
                  "small keeper process started beside granary-fuse (socket <fuse.handover_socket>.keeper). A "
                  "socket path: an external keeper listening there (granary-fuse --keeper PATH; in Kubernetes "
                  "a sidecar that outlives a crash of the FUSE container). off: none (a crash ends the mount).",
                  &Config::fuse, &FuseConfig::keeper));
  t.push_back(Row("fuse.exit_after_handover", K::kBool, "true",
                  "Exit once the connection is handed over to a successor. false: stay idle (not ready) until "
                  "SIGTERM, then exit without unmounting; for a supervisor that would restart an exited "
                  "process, as Kubernetes does. An idle one in its successor's network namespace with a fixed "
                  "fuse.metrics_listen port gives the port up to it.",
                  &Config::fuse, &FuseConfig::exit_after_handover));
  t.push_back(Row("fuse.worker_wait", K::kDuration, "2m",
                  "How long a read waits for a worker when none can serve it (this node's worker restarting "
                  "and no live peer holding the block) before it fails with EIO. Reads the kernel serves "
                  "itself (page cache, passthrough) go on meanwhile. A worker that answers that the "
                  "under-storage is down is not waited for: the read fails after the storage's retry_deadline.",
                  &Config::fuse, &FuseConfig::worker_wait));
  t.push_back(Row("fuse.zero_copy", K::kBool, "true",
                  "Read cached blocks through the worker's local socket (worker.local_socket): the block file's "
                  "descriptor is passed and its pages spliced into the reply, nothing copied. false: every "
                  "read streams over gRPC.",
                  &Config::fuse, &FuseConfig::zero_copy));
  t.push_back(Row("fuse.source_reads", K::kBool, "true",
                  "With fuse.zero_copy and an under-storage that is a directory of this machine (a local disk, "
                  "an NFS volume mounted in the pod): once the worker answers a read of a block that is not "
                  "cached from the under-storage, it hands granary-fuse the file (checked to have the listed "
                  "version) and says which of its blocks are cached; granary-fuse then reads the file's random "
                  "ranges (up to 1 MiB) in blocks not cached itself, checking the file's stat after each, and "
                  "asks the worker every ninth read of a block; it reports each block's first touches to the "
                  "worker, so its policy still fills hot blocks. Cold random reads (LMDB, numpy.memmap) skip "
                  "the worker's hop. false: every read goes through the worker.",
                  &Config::fuse, &FuseConfig::source_reads));
  t.push_back(Row("fuse.readahead_blocks", K::kCount, "2",
                  "When a file is read sequentially, how many of its next blocks the workers fetch into the "
                  "cache ahead of the reader (each at its home worker). 0 turns readahead off; more helps a "
                  "slow, high-latency under-storage and costs cache space for shards read only in part.",
                  &Config::fuse, &FuseConfig::readahead_blocks));
  t.push_back(Row("fuse.allow_other", K::kBool, "true",
                  "Let users other than the one running granary-fuse use the mount (permissions are still "
                  "checked by the kernel, default_permissions). Needs root or user_allow_other in "
                  "/etc/fuse.conf.",
                  &Config::fuse, &FuseConfig::allow_other));
  t.push_back(Row("fuse.file_cache_entries", K::kCount, "100000",
                  "How many files' open information (version, block size, location) granary-fuse keeps, each "
                  "for attr_timeout, so reopening a file, or opening one a listing or lookup just named, needs no "
                  "call to the master; as many lookups (name to attributes, each for the shorter of entry_timeout "
                  "and attr_timeout), so a path walk after the kernel dropped its dentries needs none either, and "
                  "as many attributes. About 1 KB per file for all of them once a listing filled them (100000: "
                  "~110 MB); 0 turns them off.",
                  &Config::fuse, &FuseConfig::file_cache_entries));
  t.push_back(Row("fuse.max_threads", K::kCount, "16", "Most threads serving FUSE requests at once.",
                  &Config::fuse, &FuseConfig::max_threads));
  t.push_back(Row("fuse.transport", K::kString, "dev",
                  "How FUSE requests reach granary-fuse. dev: read from /dev/fuse by up to fuse.max_threads "
                  "threads. uring: through io_uring queues, one per CPU (Linux >= 6.14 with the fuse module's "
                  "enable_uring parameter Y, set by the privileged FUSE pod or `echo Y > "
                  "/sys/module/fuse/parameters/enable_uring`): a round trip costs 0.55-1.05x of a minimal "
                  "/dev/fuse server's (bench/fuse_floor.sh --uring). An upgrade hands the queues' entries and "
                  "the requests they hold to the successor, and after a crash the successor adopts them from "
                  "fuse.keeper; but on Linux 6.18 a request the kernel gives an entry in the instant its process "
                  "dies fails with ECANCELED, which is why dev stays the default. A FUSE container limited to "
                  "some CPUs (a cpuset) cannot be upgraded over uring. Where the kernel does not offer it, dev "
                  "is used (logged). See \"Transports\" in docs/semantics.md.",
                  &Config::fuse, &FuseConfig::transport));
  t.push_back(Row("fuse.uring_depth", K::kCount, "4",
                  "fuse.transport uring: requests each CPU's queue serves at once (each entry has its own "
                  "thread, which blocks while the request waits for a worker). More lets more cold reads from "
                  "one CPU wait on the store together; each entry holds a 1 MiB buffer.",
                  &Config::fuse, &FuseConfig::uring_depth));
  // rpc
  t.push_back(Row("rpc.token_file", K::kPath, "",
                  "File holding a shared token. When set, servers reject calls without it and clients send "
                  "it. The token itself never appears in arguments or logs.",
                  &Config::rpc, &RpcConfig::token_file));
  t.push_back(Row("rpc.allow_unauthenticated", K::kBool, "false",
                  "Serve gRPC on an address other than loopback without rpc.token_file. Off: a daemon told to "
                  "listen beyond loopback with no token refuses to start, since anyone who reaches it could "
                  "mount, read and free datasets. See docs/security.md.",
                  &Config::rpc, &RpcConfig::allow_unauthenticated));
  t.push_back(Row("rpc.tls_cert", K::kPath, "", "PEM certificate chain; with tls_key, servers speak TLS.",
                  &Config::rpc, &RpcConfig::tls_cert));
  t.push_back(Row("rpc.tls_key", K::kPath, "", "PEM private key matching tls_cert.", &Config::rpc,
                  &RpcConfig::tls_key));
  t.push_back(Row("rpc.tls_ca", K::kPath, "", "PEM roots that clients trust; when set, clients use TLS.",
                  &Config::rpc, &RpcConfig::tls_ca));
  t.push_back(Row("rpc.timeout", K::kDuration, "30s", "Deadline of one unary RPC (metadata calls, reports).",
                  &Config::rpc, &RpcConfig::timeout));
  t.push_back(Row("rpc.master_wait", K::kDuration, "30s",
                  "How long a call to the master (a lookup, a heartbeat, a CLI command) keeps trying while no "
                  "master answers — one restarting, or standbys electing a new leader — before it fails (a "
                  "reader then gets EIO). Longer than master.election_ttl, so a failover is waited out.",
                  &Config::rpc, &RpcConfig::master_wait));
  // ufs
  t.push_back(Row("ufs.local_roots", K::kString, "",
                  "Comma-separated directories that file:// mounts may name and their reads may reach (at or "
                  "below them, after symbolic links are resolved). Empty: no file:// mount is allowed; "
                  "`granary local` allows its own source. Set it on the master and the workers alike.",
                  &Config::ufs, &UfsConfig::local_roots));
  t.push_back(Row("ufs.secrets_dir", K::kPath, "",
                  "Directory that credential files named by mount options (access_key_file, "
                  "fs.oss.accessKeySecret=/path, ...) must be below. Empty: mounts may name no credential file "
                  "(the daemons' environment and ~/.aws/credentials still apply).",
                  &Config::ufs, &UfsConfig::secrets_dir));
  // log
  t.push_back(Row("log.level", K::kLogLevel, "info", "trace, debug, info, warn, error, critical or off.",
                  &Config::log, &LogConfig::level));
  return t;
}

const Setting* FindSetting(std::string_view key) {
  for (const auto& s : Config::Settings()) {
    if (s.key == key) return &s;
  }
  return nullptr;
}

Status Walk(Config& c, const YAML::Node& node, const std::string& prefix, std::string_view origin) {
  for (auto it = node.begin(); it != node.end(); ++it) {
    std::string name = it->first.as<std::string>();
    std::string key = prefix.empty() ? name : prefix + "." + name;
    const YAML::Node v = it->second;  // a copy: `it->second` lives in a temporary proxy
    if (v.IsMap()) {
      RETURN_IF_ERROR(Walk(c, v, key, origin));
    } else if (v.IsScalar()) {
      RETURN_IF_ERROR(c.Set(key, v.Scalar(), origin));
    } else if (v.IsSequence() && FindSetting(key) && FindSetting(key)->kind == SettingKind::kTierLevels) {
      YAML::Emitter e;
      e.SetMapFormat(YAML::Flow);
      e.SetSeqFormat(YAML::Flow);
      e << v;
      RETURN_IF_ERROR(c.Set(key, e.c_str(), origin));
    } else if (v.IsNull()) {
      if (!FindSetting(key)) return InvalidArgumentError(std::string(origin) + ": unknown setting '" + key + "'");
      return InvalidArgumentError(std::string(origin) + ": " + key + ": no value given");
    } else {
      return InvalidArgumentError(std::string(origin) + ": " + key + ": expected a single value, not a list");
    }
  }
  return Status::OK();
}

}  // namespace

std::vector<TierLevel> WorkerConfig::EffectiveLevels() const {
  if (!tieredstore.levels.empty()) return tieredstore.levels;
  TierLevel l;
  l.medium = "SSD";
  l.paths = {cache_dir};
  l.quotas = {cache_quota};
  return {l};
}

const std::vector<Setting>& Config::Settings() {
  static const std::vector<Setting> kSettings = MakeSettings();
  return kSettings;
}

Config Config::Defaults() {
  Config c;
  for (const auto& s : Settings()) {
    Status st = s.set(c, s.default_value);
    assert(st.ok() && "bad default in the settings table");
    st.IgnoreError();
  }
  return c;
}

Status Config::Set(std::string_view key, std::string_view value, std::string_view source) {
  const Setting* s = FindSetting(key);
  if (s == nullptr) {
    return InvalidArgumentError(std::string(source) + ": unknown setting '" + std::string(key) +
                                "' (run `granary config` to list every setting)");
  }
  Status st = s->set(*this, value);
  if (!st.ok()) return InvalidArgumentError(std::string(source) + ": " + s->key + ": " + st.message());
  explicit_[s->key] = std::string(source);
  return Status::OK();
}

std::string Config::Get(std::string_view key) const {
  const Setting* s = FindSetting(key);
  return s ? s->get(*this) : "";
}

Status Config::LoadYaml(std::string_view text, std::string_view origin) {
  YAML::Node root;
  try {
    root = YAML::Load(std::string(text));
  } catch (const YAML::Exception& e) {
    return InvalidArgumentError(std::string(origin) + ": not valid YAML: " + e.what());
  }
  if (root.IsNull()) return Status::OK();
  if (!root.IsMap()) return InvalidArgumentError(std::string(origin) + ": expected a map of sections (master:, worker:, ...)");
  try {
    return Walk(*this, root, "", origin);
  } catch (const YAML::Exception& e) {
    return InvalidArgumentError(std::string(origin) + ": " + e.what());
  }
}

Status Config::LoadFile(const std::string& path) {
  std::ifstream in(path);
  if (!in) return NotFoundError("config file " + path + " cannot be read (does it exist?)");
  std::stringstream ss;
  ss << in.rdbuf();
  return LoadYaml(ss.str(), path);
}

void AddConfigFlags(CLI::App& app, ConfigFlags* flags) {
  app.add_option("--config", flags->config_file, "YAML configuration file");
  for (const auto& s : Config::Settings()) {
    std::string key = s.key;
    app.add_option_function<std::string>(
           "--" + key, [flags, key](const std::string& v) { flags->values[key] = v; }, s.doc)
        ->type_name(s.unit)
        ->group("Settings (also in the --config file)");
  }
}

StatusOr<Config> BuildConfig(const ConfigFlags& flags) {
  Config c = Config::Defaults();
  if (!flags.config_file.empty()) RETURN_IF_ERROR(c.LoadFile(flags.config_file));
  for (const auto& [k, v] : flags.values) RETURN_IF_ERROR(c.Set(k, v, "--" + k));
  if (c.master.block_size < kMinBlockSize || c.master.block_size > kMaxBlockSize) {
    return InvalidArgumentError("master.block_size: " + FormatBytes(c.master.block_size) +
                                " is out of range (64Ki to 256Mi)");
  }
  if (c.master.election_ttl < std::chrono::seconds(2) || c.master.election_ttl > std::chrono::minutes(5)) {
    return InvalidArgumentError("master.election_ttl: " + FormatDuration(c.master.election_ttl) +
                                " is out of range (2s to 5m; 5s fails over in about 5 s)");
  }
  if (!c.worker.tieredstore.levels.empty() && c.IsExplicit("worker.cache_dir")) {
    return InvalidArgumentError(
        "worker.cache_dir and worker.tieredstore.levels are both set: with levels, each level's path is the cache "
        "directory (drop worker.cache_dir)");
  }
  if (c.fuse.max_threads == 0) return InvalidArgumentError("fuse.max_threads: must be at least 1");
  if (c.fuse.transport != "dev" && c.fuse.transport != "uring") {
    return InvalidArgumentError("fuse.transport: '" + c.fuse.transport + "' is not a transport (dev or uring)");
  }
  if (c.fuse.uring_depth == 0 || c.fuse.uring_depth > 64) {
    return InvalidArgumentError("fuse.uring_depth: " + std::to_string(c.fuse.uring_depth) + " is out of range (1 to 64)");
  }
  return c;
}

}  // namespace granary
