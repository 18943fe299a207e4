#include <sys/stat.h>
#include <cerrno>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <set>
#include <google/protobuf/message.h>
#include <nlohmann/json.hpp>

#include "cli/cli.h"
#include "cli/deploy.h"
#include "cli/fluid.h"
#include "cli/load.h"
#include "cli/local.h"
#include "cli/master_conn.h"
#include "cli/observe.h"
#include "fuse/trace.h"
#include "common/allocator.h"
#include "common/fs.h"
#include "common/shutdown.h"
#include "common/tiers.h"
#include "ufs/ufs.h"
#include "common/units.h"
#include "proto/granary.grpc.pb.h"
#include "rpc/rpc.h"

namespace granary::cli {

std::string Count(uint64_t n, const std::string& noun) { return std::to_string(n) + " " + noun + (n == 1 ? "" : "s"); }

int Fail(const Status& st) {
  std::fprintf(stderr, "granary: error: %s\n", st.message().c_str());
  return 1;
}

namespace {

std::string ModeString(const rpc::Attr& a) {
  std::string s = a.type() == rpc::DIRECTORY ? "d" : "-";
  const char* rwx = "rwxrwxrwx";
  for (int i = 0; i < 9; ++i) s += (a.mode() & (0400 >> i)) ? rwx[i] : '-';
  return s;
}

std::string TimeString(int64_t ns) {
  time_t t = static_cast<time_t>(ns / 1'000'000'000);
  struct tm tm;
  localtime_r(&t, &tm);
  char buf[64];
  strftime(buf, sizeof buf, "%Y-%m-%d %H:%M:%S", &tm);
  return buf;
}

std::string Percent(uint64_t part, uint64_t whole) {
  if (whole == 0) return "0.0%";
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f%%", 100.0 * static_cast<double>(part) / static_cast<double>(whole));
  return buf;
}

std::string NormalizePath(std::string p) {
  if (p.empty() || p[0] != '/') p = "/" + p;
  while (p.size() > 1 && p.back() == '/') p.pop_back();
  return p;
}

// A mount's write mode (mount option `write`: off, through or back), read the way the master reads
// it (common/tiers.h SplitMountOptions; options it cannot read leave the mount read-only there too).
WriteMode WriteModeOf(const google::protobuf::Map<std::string, std::string>& options) {
  std::map<std::string, std::string> all(options.begin(), options.end()), ufs;
  MountCacheOptions cache;
  if (!SplitMountOptions(all, &ufs, &cache).ok()) return WriteMode::kOff;
  return cache.write;
}

// The write mode of each of `mounts`, by mount id. ListMounts and GetReport leave every option out
// of their answers (credential file paths among them), so each mount's come from GetMount; only its
// write mode is kept. A mount removed in the meantime is left out.
StatusOr<std::map<uint64_t, WriteMode>> WriteModes(MasterConn& m, const std::vector<uint64_t>& mounts) {
  std::map<uint64_t, WriteMode> out;
  for (uint64_t id : mounts) {
    rpc::GetMountRequest req;
    req.set_id(id);
    rpc::MountInfo info;
    Status st = m.Call(&rpc::Master::Stub::GetMount, req, &info);
    if (st.IsNotFound()) continue;
    RETURN_IF_ERROR(st);
    out[id] = WriteModeOf(info.options());
  }
  return out;
}

// "off", "through", "back"; "-" for a mount WriteModes left out.
std::string WriteModeText(const std::map<uint64_t, WriteMode>& modes, uint64_t id) {
  auto it = modes.find(id);
  return it == modes.end() ? "-" : WriteModeName(it->second);
}

int CmdMount(MasterConn& m, const std::string& path, const std::string& uri,
             const std::map<std::string, std::string>& options) {
  rpc::MountRequest req;
  req.set_path(NormalizePath(path));
  req.set_uri(uri);
  req.mutable_options()->insert(options.begin(), options.end());
  rpc::MountResponse resp;
  Status st = m.Call(&rpc::Master::Stub::Mount, req, &resp);
  if (!st.ok()) return Fail(st);
  std::printf("mounted %s at %s\n", RedactUri(resp.mount().uri()).c_str(), resp.mount().path().c_str());
  return 0;
}

int CmdUnmount(MasterConn& m, const std::string& path) {
  rpc::UnmountRequest req;
  req.set_path(NormalizePath(path));
  rpc::UnmountResponse resp;
  Status st = m.Call(&rpc::Master::Stub::Unmount, req, &resp);
  if (!st.ok()) return Fail(st);
  std::printf("unmounted %s\n", req.path().c_str());
  return 0;
}

int CmdMounts(MasterConn& m) {
  rpc::ListMountsResponse resp;
  Status st = m.Call(&rpc::Master::Stub::ListMounts, rpc::ListMountsRequest(), &resp);
  if (!st.ok()) return Fail(st);
  std::vector<uint64_t> ids;
  for (const auto& mi : resp.mounts()) ids.push_back(mi.id());
  auto modes = WriteModes(m, ids);
  if (!modes.ok()) return Fail(modes.status());
  // WRITE: the mount option `write` (off: read-only; through, back: docs/semantics.md "Writes").
  std::printf("%-24s %-48s %-7s %12s %12s\n", "PATH", "URI", "WRITE", "FILES SEEN", "BYTES SEEN");
  for (const auto& mi : resp.mounts()) {
    std::printf("%-24s %-48s %-7s %12llu %12s\n", mi.path().c_str(), RedactUri(mi.uri()).c_str(),
                WriteModeText(*modes, mi.id()).c_str(), static_cast<unsigned long long>(mi.known_files()),
                FormatBytes(mi.known_bytes()).c_str());
  }
  return 0;
}

void PrintLsLine(const rpc::Attr& a, const std::string& name) {
  std::printf("%s %5u %5u %12llu %s %s%s\n", ModeString(a).c_str(), a.uid(), a.gid(),
              static_cast<unsigned long long>(a.size()), TimeString(a.mtime_ns()).c_str(), name.c_str(),
              a.type() == rpc::DIRECTORY ? "/" : "");
}

int CmdLs(MasterConn& m, const std::string& raw) {
  std::string path = NormalizePath(raw);
  rpc::ResolvePathRequest rreq;
  rreq.set_path(path);
  rpc::AttrResponse attr;
  Status st = m.Call(&rpc::Master::Stub::ResolvePath, rreq, &attr);
  if (!st.ok()) return Fail(st);
  if (attr.attr().type() != rpc::DIRECTORY) {
    PrintLsLine(attr.attr(), path);
    return 0;
  }
  uint64_t after = 0;
  for (;;) {
    rpc::ReadDirRequest req;
    req.set_ino(attr.attr().ino());
    req.set_after(after);
    req.set_limit(1000);
    rpc::ReadDirResponse page;
    st = m.Call(&rpc::Master::Stub::ReadDir, req, &page);
    if (!st.ok()) return Fail(st);
    for (const auto& e : page.entries()) {
      PrintLsLine(e.attr(), e.name());
      after = e.cookie();
    }
    if (page.end() || page.entries_size() == 0) break;
  }
  return 0;
}

int CmdStat(MasterConn& m, const std::string& raw) {
  rpc::ResolvePathRequest req;
  req.set_path(NormalizePath(raw));
  rpc::AttrResponse resp;
  Status st = m.Call(&rpc::Master::Stub::ResolvePath, req, &resp);
  if (!st.ok()) return Fail(st);
  const auto& a = resp.attr();
  std::printf("  Path: %s\n  Type: %s\n  Size: %llu\n  Mode: %s (%04o)\n   Uid: %u\n   Gid: %u\n Inode: %llu\n Mtime: %s\n",
              req.path().c_str(), a.type() == rpc::DIRECTORY ? "directory" : "file",
              static_cast<unsigned long long>(a.size()), ModeString(a).c_str(), a.mode(), a.uid(), a.gid(),
              static_cast<unsigned long long>(a.ino()), TimeString(a.mtime_ns()).c_str());
  return 0;
}

int CmdPin(MasterConn& m, const std::string& raw, bool pin) {
  rpc::PinRequest req;
  req.set_path(NormalizePath(raw));
  req.set_pin(pin);
  rpc::PinResponse resp;
  Status st = m.Call(&rpc::Master::Stub::Pin, req, &resp);
  if (!st.ok()) return Fail(st);
  std::printf("%s %s: %s, %s told\n", pin ? "pinned" : "unpinned", req.path().c_str(), Count(resp.files(), "file").c_str(),
              Count(resp.workers(), "worker").c_str());
  return 0;
}

int CmdFree(MasterConn& m, const std::string& raw) {
  rpc::FreeRequest req;
  req.set_path(NormalizePath(raw));
  rpc::FreeResponse resp;
  Status st = m.Call(&rpc::Master::Stub::Free, req, &resp);
  if (!st.ok()) return Fail(st);
  std::printf("freed %s: %s, %s removed from %s\n", req.path().c_str(), Count(resp.files(), "file").c_str(),
              Count(resp.blocks(), "cached block").c_str(), Count(resp.workers(), "worker").c_str());
  return 0;
}

// A message's scalar fields (and repeated strings) as JSON, keyed by field name: a counter added to
// WorkerStats or TierStats shows in `granary report --json` without another list to update.
// Message and map fields are left to the caller.
nlohmann::json ScalarFieldsJson(const google::protobuf::Message& m) {
  using FD = google::protobuf::FieldDescriptor;
  const auto* d = m.GetDescriptor();
  const auto* r = m.GetReflection();
  nlohmann::json out = nlohmann::json::object();
  for (int i = 0; i < d->field_count(); ++i) {
    const FD* f = d->field(i);
    if (f->is_repeated()) {
      if (f->cpp_type() != FD::CPPTYPE_STRING) continue;
      std::vector<std::string> v;
      for (int k = 0; k < r->FieldSize(m, f); ++k) v.push_back(r->GetRepeatedString(m, f, k));
      out[f->name()] = v;
      continue;
    }
    switch (f->cpp_type()) {
      case FD::CPPTYPE_UINT64: out[f->name()] = r->GetUInt64(m, f); break;
      case FD::CPPTYPE_UINT32: out[f->name()] = r->GetUInt32(m, f); break;
      case FD::CPPTYPE_INT64: out[f->name()] = r->GetInt64(m, f); break;
      case FD::CPPTYPE_INT32: out[f->name()] = r->GetInt32(m, f); break;
      case FD::CPPTYPE_DOUBLE: out[f->name()] = r->GetDouble(m, f); break;
      case FD::CPPTYPE_FLOAT: out[f->name()] = r->GetFloat(m, f); break;
      case FD::CPPTYPE_BOOL: out[f->name()] = r->GetBool(m, f); break;
      case FD::CPPTYPE_STRING: out[f->name()] = r->GetString(m, f); break;
      default: break;  // messages, enums: the caller's
    }
  }
  return out;
}

// A mount's block reads over the live workers: (hits, misses).
std::pair<uint64_t, uint64_t> MountAccess(const rpc::Report& r, uint64_t mount_id) {
  uint64_t hits = 0, misses = 0;
  for (const auto& w : r.workers()) {
    if (!w.alive()) continue;
    auto it = w.stats().mount_counters().find(mount_id);
    if (it == w.stats().mount_counters().end()) continue;
    hits += it->second.hits();
    misses += it->second.misses();
  }
  return {hits, misses};
}

int CmdReport(MasterConn& m, bool json) {
  rpc::Report r;
  Status st = m.Call(&rpc::Master::Stub::GetReport, rpc::GetReportRequest(), &r);
  if (!st.ok()) return Fail(st);
  uint64_t capacity = 0, used = 0, hits = 0, misses = 0, ufs_bytes = 0;
  for (const auto& w : r.workers()) {
    if (!w.alive()) continue;
    capacity += w.stats().capacity_bytes();
    used += w.stats().used_bytes();
    hits += w.stats().hits();
    misses += w.stats().misses();
    ufs_bytes += w.stats().ufs_bytes();
  }
  std::vector<uint64_t> ids;
  for (const auto& mr : r.mounts()) ids.push_back(mr.mount().id());
  auto modes = WriteModes(m, ids);
  if (!modes.ok()) return Fail(modes.status());
  // Every master this CLI was given that the leader does not count among its standbys, asked
  // itself (issue 51: a dead master was left out of the report).
  struct OtherMaster {
    std::string address, state, detail;
  };
  std::vector<OtherMaster> others;
  if (r.has_master() && r.master().ha()) {
    std::set<std::string> known{r.master().id()};
    for (const auto& sb : r.master().standbys()) known.insert(sb.id());
    for (const std::string& a : m.addresses()) {
      if (known.count(a) > 0) continue;
      auto role = m.RoleOf(a, std::chrono::seconds(2));
      if (!role.ok()) {
        others.push_back({a, "unreachable", role.status().message()});
      } else if (known.count(role->id()) == 0) {
        others.push_back({a, role->leader() ? "leads too?" : "standby, not following the leader",
                          role->leader_id().empty() ? "it knows no leader" : "it names " + role->leader_id()});
      }
    }
  }
  std::vector<std::string> writable;  // "PATH (MODE)" of each writable mount
  for (const auto& mr : r.mounts()) {
    auto it = modes->find(mr.mount().id());
    if (it != modes->end() && it->second != WriteMode::kOff) {
      writable.push_back(mr.mount().path() + " (" + WriteModeName(it->second) + ")");
    }
  }
  // Writes over the live workers (as of their last heartbeats): files being written now, uploaded
  // since each worker started (write=through and write=back alike), the write=back backlog and the
  // uploads that failed (each retried). A lost worker's backlog is counted apart: its staged files
  // wait on its disk until it is back (docs/semantics.md, "Writes").
  struct WriteTotals {
    uint64_t sessions = 0, uploaded_files = 0, uploaded_bytes = 0, backlog_files = 0, backlog_bytes = 0,
             failures = 0, lost_backlog_files = 0, lost_backlog_bytes = 0;
  } wt;
  for (const auto& w : r.workers()) {
    const auto& s = w.stats();
    if (!w.alive()) {
      wt.lost_backlog_files += s.writeback_files();
      wt.lost_backlog_bytes += s.writeback_bytes();
      continue;
    }
    wt.sessions += s.write_sessions();
    wt.uploaded_files += s.uploaded_files();
    wt.uploaded_bytes += s.uploaded_bytes();
    wt.backlog_files += s.writeback_files();
    wt.backlog_bytes += s.writeback_bytes();
    wt.failures += s.upload_failures();
  }
  if (json) {
    nlohmann::json j;
    j["block_size"] = r.block_size();
    j["workers"] = nlohmann::json::array();
    for (const auto& w : r.workers()) {
      const auto& s = w.stats();
      nlohmann::json wj = ScalarFieldsJson(s);
      wj["id"] = w.id();
      wj["address"] = w.address();
      wj["alive"] = w.alive();
      wj["health"] = w.alive() ? "alive" : "lost";
      wj["last_heartbeat_ns"] = w.last_heartbeat_ns();
      wj["tiers"] = nlohmann::json::array();
      for (const auto& t : s.tiers()) wj["tiers"].push_back(ScalarFieldsJson(t));
      j["workers"].push_back(std::move(wj));
    }
    j["mounts"] = nlohmann::json::array();
    for (const auto& mr : r.mounts()) {
      double pct = mr.mount().known_bytes() ? 100.0 * mr.cached_bytes() / mr.mount().known_bytes() : 0.0;
      auto [mh, mm] = MountAccess(r, mr.mount().id());
      j["mounts"].push_back({{"path", mr.mount().path()},
                             {"uri", RedactUri(mr.mount().uri())},
                             {"write", WriteModeText(*modes, mr.mount().id())},
                             {"ufs_files_seen", mr.mount().known_files()},
                             {"ufs_bytes_seen", mr.mount().known_bytes()},
                             {"ufs_total_bytes", mr.mount().known_bytes()},
                             {"cached_bytes", mr.cached_bytes()},
                             {"cached_blocks", mr.cached_blocks()},
                             {"replica_bytes", mr.replica_bytes()},
                             {"elastic_bytes", mr.elastic_bytes()},
                             {"cache_capacity_bytes", capacity},
                             {"cached_percentage", pct},
                             {"hits", mh},
                             {"misses", mm},
                             {"hit_ratio", mh + mm ? static_cast<double>(mh) / static_cast<double>(mh + mm) : 0.0}});
    }
    j["cache"] = {{"capacity_bytes", capacity}, {"used_bytes", used}, {"hits", hits},
                  {"misses", misses}, {"ufs_bytes", ufs_bytes}};
    j["writes"] = {{"writable_mounts", writable.size()},
                   {"files_being_written", wt.sessions},
                   {"uploaded_files", wt.uploaded_files},
                   {"uploaded_bytes", wt.uploaded_bytes},
                   {"writeback_files", wt.backlog_files},
                   {"writeback_bytes", wt.backlog_bytes},
                   {"upload_failures", wt.failures},
                   {"lost_workers_writeback_files", wt.lost_backlog_files},
                   {"lost_workers_writeback_bytes", wt.lost_backlog_bytes}};
    const rpc::MasterRole& role = r.master();
    nlohmann::json mj = {{"leader", role.id()},
                         {"ha", role.ha()},
                         {"term", role.term()},
                         {"since_unix_ns", role.since_unix_ns()},
                         {"journal_index", role.position().index()}};
    mj["standbys"] = nlohmann::json::array();
    for (const auto& sb : role.standbys()) {
      mj["standbys"].push_back(
          {{"id", sb.id()}, {"in_sync", sb.in_sync()}, {"acked_index", sb.acked_index()}, {"lag", sb.lag()}});
    }
    mj["others"] = nlohmann::json::array();
    for (const auto& o : others) mj["others"].push_back({{"address", o.address}, {"state", o.state}, {"detail", o.detail}});
    j["master"] = std::move(mj);
    std::printf("%s\n", j.dump(2).c_str());
    return 0;
  }
  std::printf("Cache: %s capacity, %s used, %llu hits, %llu misses (hit ratio %s), %s read from under-storage\n",
              FormatBytes(capacity).c_str(), FormatBytes(used).c_str(), static_cast<unsigned long long>(hits),
              static_cast<unsigned long long>(misses), Percent(hits, hits + misses).c_str(),
              FormatBytes(ufs_bytes).c_str());
  if (writable.empty() && wt.sessions + wt.uploaded_files + wt.backlog_files + wt.failures + wt.lost_backlog_files == 0) {
    std::printf("Writes: off (every mount is read-only; mount option write=through or write=back makes one writable)\n");
  } else {
    std::string which;
    for (const auto& w : writable) which += (which.empty() ? "" : ", ") + w;
    std::printf("Writes: %zu writable mount%s%s%s; %s being written, uploaded %s (%s), write-back "
                "backlog %s (%s), %s (retried)\n",
                writable.size(), writable.size() == 1 ? "" : "s", which.empty() ? "" : ": ", which.c_str(),
                Count(wt.sessions, "file").c_str(), Count(wt.uploaded_files, "file").c_str(),
                FormatBytes(wt.uploaded_bytes).c_str(), Count(wt.backlog_files, "file").c_str(),
                FormatBytes(wt.backlog_bytes).c_str(), Count(wt.failures, "failed upload").c_str());
    if (wt.lost_backlog_files > 0) {
      std::printf("  %s (%s) staged on lost workers wait there to be uploaded when they are back\n",
                  Count(wt.lost_backlog_files, "file").c_str(), FormatBytes(wt.lost_backlog_bytes).c_str());
    }
  }
  if (r.has_master() && !r.master().id().empty()) {
    const rpc::MasterRole& role = r.master();
    if (role.ha()) {
      std::time_t since = static_cast<std::time_t>(role.since_unix_ns() / 1000000000);
      char when[32];
      std::strftime(when, sizeof(when), "%Y-%m-%d %H:%M:%S", std::gmtime(&since));
      std::printf("Master: %s leads since %s UTC (term %llu, journal at entry %llu)\n", role.id().c_str(), when,
                  static_cast<unsigned long long>(role.term()), static_cast<unsigned long long>(role.position().index()));
      if (role.standbys_size() == 0) std::printf("  no standby follows it: a failover would wait for it to come back\n");
      for (const auto& sb : role.standbys()) {
        std::printf("  standby %-24s %-12s %llu entries behind\n", sb.id().c_str(), sb.in_sync() ? "in sync" : "catching up",
                    static_cast<unsigned long long>(sb.lag()));
      }
      for (const auto& o : others) {
        std::printf("  master  %-24s %s (%s)\n", o.address.c_str(), o.state.c_str(), o.detail.c_str());
      }
    } else {
      std::printf("Master: %s (single master, no standbys)\n", role.id().c_str());
    }
  }
  std::printf("\nWorkers:\n  %-4s %-24s %-6s %10s %10s %10s %8s %10s %11s\n", "ID", "ADDRESS", "STATE", "CAPACITY",
              "USED", "ELASTIC", "BLOCKS", "READ HITS", "READ MISSES");
  for (const auto& w : r.workers()) {
    const auto& s = w.stats();
    std::printf("  %-4llu %-24s %-6s %10s %10s %10s %8llu %10llu %11llu\n", static_cast<unsigned long long>(w.id()),
                w.address().c_str(), w.alive() ? "alive" : "lost", FormatBytes(s.capacity_bytes()).c_str(),
                FormatBytes(s.used_bytes()).c_str(), FormatBytes(s.elastic_bytes()).c_str(),
                static_cast<unsigned long long>(s.blocks()), static_cast<unsigned long long>(s.hits()),
                static_cast<unsigned long long>(s.misses()));
    for (const auto& t : s.tiers()) {
      std::string paths;
      for (const auto& p : t.paths()) paths += (paths.empty() ? "" : ",") + p;
      std::printf("       %-4s %10s of %-10s %8llu blocks  lookups found %llu, not found %llu  evicted %llu  "
                  "demoted %llu  promoted %llu  (%s)\n",
                  t.medium().c_str(), FormatBytes(t.used_bytes()).c_str(), FormatBytes(t.capacity_bytes()).c_str(),
                  static_cast<unsigned long long>(t.blocks()), static_cast<unsigned long long>(t.hits()),
                  static_cast<unsigned long long>(t.misses()), static_cast<unsigned long long>(t.evictions()),
                  static_cast<unsigned long long>(t.demotions()), static_cast<unsigned long long>(t.promotions()),
                  paths.c_str());
    }
    if (s.writeback_files() + s.uploaded_files() + s.upload_failures() + s.write_sessions() > 0) {
      std::printf("       writes: %u being written, write-back backlog %llu files (%s), uploaded %llu (%s), failed "
                  "uploads %llu (retried)\n",
                  s.write_sessions(), static_cast<unsigned long long>(s.writeback_files()),
                  FormatBytes(s.writeback_bytes()).c_str(), static_cast<unsigned long long>(s.uploaded_files()),
                  FormatBytes(s.uploaded_bytes()).c_str(), static_cast<unsigned long long>(s.upload_failures()));
    }
    if (s.peer_reads() + s.peer_served() + s.peer_failovers() > 0) {
      std::printf("       from peers %llu reads (%s), served to peers %llu, failovers %llu\n",
                  static_cast<unsigned long long>(s.peer_reads()), FormatBytes(s.peer_bytes()).c_str(),
                  static_cast<unsigned long long>(s.peer_served()),
                  static_cast<unsigned long long>(s.peer_failovers()));
    }
  }
  if (r.workers_size() > 0) {
    std::printf("  (READ HITS / MISSES: block reads this worker answered from its cache / had to fetch; a level's\n"
                "   lookups count every look into its index: reads, whole-file leases, peers' cache-only asks)\n");
  }
  std::printf("\nMounts:\n  %-20s %-32s %-7s %14s %10s %10s %10s %14s %9s %9s\n", "PATH", "URI", "WRITE",
              "UFS TOTAL SIZE", "CACHED", "REPLICAS", "ELASTIC", "CACHE CAPACITY", "CACHED %", "HIT RATIO");
  for (const auto& mr : r.mounts()) {
    auto [mh, mm] = MountAccess(r, mr.mount().id());
    std::printf("  %-20s %-32s %-7s %14s %10s %10s %10s %14s %9s %9s\n", mr.mount().path().c_str(),
                RedactUri(mr.mount().uri()).c_str(), WriteModeText(*modes, mr.mount().id()).c_str(),
                FormatBytes(mr.mount().known_bytes()).c_str(),
                FormatBytes(mr.cached_bytes()).c_str(), FormatBytes(mr.replica_bytes()).c_str(),
                FormatBytes(mr.elastic_bytes()).c_str(), FormatBytes(capacity).c_str(),
                Percent(mr.cached_bytes(), mr.mount().known_bytes()).c_str(), Percent(mh, mh + mm).c_str());
  }
  std::printf("  (WRITE is the mount option write: off read-only, through or back writable; CACHED counts each block\n"
              "   once; REPLICAS every replica copy; ELASTIC the nodes' extra local copies, evicted first: mount option\n"
              "   cache.elastic)\n");
  std::printf("  (UFS TOTAL SIZE counts the files listed so far; `granary load --metadata-only PATH` lists them all)\n");
  return 0;
}

// The FUSE container of a Fluid ThinRuntime: the Dataset's mounts into the namespace, then
// granary-fuse at Fluid's targetPath (exec'd, so it is the container's process from then on).
int CmdFluidFuse(const Config& base, const std::string& fluid_config, const std::string& secrets_dir, bool dry_run,
                 const ConfigFlags& flags) {
  const std::string& config_file = flags.config_file;
  auto text = ReadFileToString(fluid_config);
  if (!text.ok()) {
    return Fail(NotFoundError("cannot read the Fluid config " + fluid_config + ": " + text.status().message() +
                              " (Fluid writes it for ThinRuntime FUSE containers; --fluid-config names another)"));
  }
  auto plan = ParseFluidConfig(*text, secrets_dir);
  if (!plan.ok()) return Fail(plan.status().WithContext(fluid_config));
  Config cfg = base;
  // The master: the Dataset's runtimeOptions.master, else --master.address given to this command,
  // else GRANARY_MASTER (the profile's), else the configuration's.
  if (plan->master.empty() && flags.values.count("master.address") == 0) {
    if (const char* env = std::getenv("GRANARY_MASTER"); env && *env) plan->master = env;
  }
  if (!plan->master.empty()) {
    Status st = cfg.Set("master.address", plan->master, "runtimeOptions.master");
    if (!st.ok()) return Fail(st);
  }
  std::vector<std::string> args{"granary-fuse"};
  if (!config_file.empty()) args.insert(args.end(), {"--config", config_file});
  args.insert(args.end(), {"--master.address", cfg.master.address, "--fuse.mountpoint", plan->target_path,
                           "--fuse.root", plan->root});
  // This command's own settings reach granary-fuse too (the token it calls the master with, ...);
  // the Dataset's runtimeOptions come last and win.
  for (const auto& [k, v] : flags.values) {
    if (plan->settings.count(k) == 0 && k != "master.address" && k != "fuse.mountpoint" && k != "fuse.root") {
      args.insert(args.end(), {"--" + k, v});
    }
  }
  for (const auto& [k, v] : plan->settings) args.insert(args.end(), {"--" + k, v});
  if (dry_run) {
    nlohmann::json j;
    j["master"] = cfg.master.address;
    j["target_path"] = plan->target_path;
    j["root"] = plan->root;
    j["read_only"] = plan->read_only;
    j["writable_mounts"] = plan->writable;
    j["mounts"] = nlohmann::json::array();
    for (const auto& m : plan->mounts) j["mounts"].push_back({{"path", m.path}, {"uri", m.uri}, {"options", m.options}});
    j["fuse_args"] = args;
    std::printf("%s\n", j.dump(2).c_str());
    return 0;
  }
  auto conn = MasterConn::Open(cfg);
  if (!conn.ok()) return Fail(conn.status());
  rpc::ListMountsResponse existing;
  Status st = conn->Call(&rpc::Master::Stub::ListMounts, rpc::ListMountsRequest(), &existing);
  if (!st.ok()) return Fail(st);
  for (const auto& m : plan->mounts) {
    bool have = false;
    for (const auto& e : existing.mounts()) {
      if (e.path() == m.path) {
        if (RedactUri(e.uri()) != RedactUri(m.uri)) {
          return Fail(FailedPreconditionError(m.path + " is already mounted from " + RedactUri(e.uri()) + ", not " +
                                              RedactUri(m.uri) + " (granary unmount " + m.path + " first)"));
        }
        // The Dataset's write option must be the mount's: a Dataset asking to write into a mount made
        // read-only would get EROFS at its first write, and one asking for read-only would write.
        auto modes = WriteModes(*conn, {e.id()});
        if (!modes.ok()) return Fail(modes.status());
        google::protobuf::Map<std::string, std::string> wanted(m.options.begin(), m.options.end());
        const WriteMode want = WriteModeOf(wanted);
        auto have_mode = modes->find(e.id());
        if (have_mode != modes->end() && have_mode->second != want) {
          return Fail(FailedPreconditionError(m.path + " is already mounted with write=" +
                                              WriteModeName(have_mode->second) + ", the Dataset asks for write=" +
                                              WriteModeName(want) + " (granary unmount " + m.path + " first)"));
        }
        have = true;
      }
    }
    if (have) continue;
    if (CmdMount(*conn, m.path, m.uri, m.options) != 0) return 1;
  }
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  char exe[4096];
  ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
  std::string self = n > 0 ? std::string(exe, n) : std::string("/usr/local/bin/granary");
  self = self.substr(0, self.rfind('/')) + "/granary-fuse";
  execv(self.c_str(), argv.data());
  return Fail(ErrnoError(errno, "cannot start " + self));
}

int CmdConfig(bool markdown) {
  if (markdown) {
    std::printf("| key | default | unit | meaning |\n|---|---|---|---|\n");
    for (const auto& s : Config::Settings()) {
      std::string def = s.default_value.empty() ? "(empty)" : "`" + s.default_value + "`";
      std::printf("| `%s` | %s | %s | %s |\n", s.key.c_str(), def.c_str(), s.unit.c_str(), s.doc.c_str());
    }
    return 0;
  }
  std::printf("# Every Granary setting with its default. Sections nest: `worker: {cache_quota: 20Gi}`.\n");
  // Sections nest by the dots of the key (worker.tieredstore.levels -> worker: tieredstore: levels).
  std::vector<std::string> open;
  for (const auto& s : Config::Settings()) {
    std::vector<std::string> parts;
    for (size_t start = 0;;) {
      size_t dot = s.key.find('.', start);
      parts.push_back(s.key.substr(start, dot == std::string::npos ? std::string::npos : dot - start));
      if (dot == std::string::npos) break;
      start = dot + 1;
    }
    size_t common = 0;
    while (common < open.size() && common + 1 < parts.size() && open[common] == parts[common]) ++common;
    open.resize(common);
    for (size_t i = common; i + 1 < parts.size(); ++i) {
      std::printf("%s%s:\n", std::string(2 * i, ' ').c_str(), parts[i].c_str());
      open.push_back(parts[i]);
    }
    std::string indent(2 * open.size(), ' ');
    std::string value = "\"" + s.default_value + "\"";
    if (s.kind == SettingKind::kTierLevels) value = "[]  # e.g. [{mediumtype: MEM, path: /dev/shm/granary, quota: 2Gi}]";
    std::printf("%s# %s [%s]\n%s%s: %s\n", indent.c_str(), s.doc.c_str(), s.unit.c_str(), indent.c_str(),
                parts.back().c_str(), value.c_str());
  }
  return 0;
}

}  // namespace

std::string GranaryHome() {
  if (const char* h = std::getenv("GRANARY_HOME"); h && *h) return h;
  if (const char* h = std::getenv("HOME"); h && *h) return std::string(h) + "/.granary";
  return "/tmp/granary-" + std::to_string(getuid());
}

std::string LocalDiscoveryFile() { return GranaryHome() + "/local.yaml"; }

int Main(int argc, char** argv) {
  CLI::App app{"granary: a distributed cache for machine-learning training data"};
  app.require_subcommand(1);
  ConfigFlags flags;
  std::string master;
  app.add_option("--master", master, "host:port of granary-master (also $GRANARY_MASTER)");
  app.add_option("--config", flags.config_file, "YAML configuration file");

  std::string path, uri;
  std::vector<std::string> raw_options;
  auto* mount = app.add_subcommand("mount", "Mount an under-storage URI at a namespace path");
  mount->add_option("PATH", path, "Namespace path, e.g. /imagenet")->required();
  mount->add_option("URI", uri, "Under-storage, e.g. file:///srv/imagenet or s3://bucket/prefix")->required();
  mount->add_option("-o,--option", raw_options, "Mount option KEY=VALUE (repeatable), e.g. endpoint=http://host:7480");
  auto* unmount = app.add_subcommand("unmount", "Remove a mounted dataset from the namespace");
  unmount->add_option("PATH", path)->required();
  auto* mounts = app.add_subcommand("mounts", "List mounted datasets");
  auto* ls = app.add_subcommand("ls", "List a directory of the namespace");
  ls->add_option("PATH", path)->required();
  auto* stat = app.add_subcommand("stat", "Show a file's or directory's attributes");
  stat->add_option("PATH", path)->required();
  auto* pin = app.add_subcommand("pin", "Keep a file's or directory's cached blocks from eviction");
  pin->add_option("PATH", path)->required();
  auto* unpin = app.add_subcommand("unpin", "Let a pinned path's blocks be evicted again");
  unpin->add_option("PATH", path)->required();
  auto* free_cmd = app.add_subcommand("free", "Remove a path's cached blocks from every worker");
  free_cmd->add_option("PATH", path)->required();
  bool json = false;
  auto* report = app.add_subcommand("report", "Workers, capacity, usage, hits and cached share per mount");
  report->add_flag("--json", json, "Print JSON");
  auto* du = app.add_subcommand("du", "Under-storage size against cached bytes, for a path and its subdirectories");
  du->add_option("PATH", path)->required();
  du->add_flag("--json", json, "Print JSON");
  LoadOptions load_opts;
  auto* load = app.add_subcommand("load", "Warm the cache: load files (or directories, recursively) into the workers");
  load->add_option("PATH", load_opts.paths, "Namespace paths, e.g. /imagenet/train");
  load->add_option("--replicas", load_opts.replicas, "Copies kept across workers (default: the mount's cache.replicas)")
      ->check(CLI::Range(1, 16));
  load->add_flag("--metadata-only", load_opts.metadata_only, "List the under-storage into the namespace; load no data");
  load->add_option("--include", load_opts.include, "Only files matching this glob (repeatable; a glob with / matches "
                                                   "the whole path, else the file name)");
  load->add_option("--exclude", load_opts.exclude, "Leave out files matching this glob (repeatable)");
  load->add_option("--from-file", load_opts.from_file, "Load the paths listed in this file, one per line (- for stdin)");
  load->add_option("--parallel", load_opts.parallel, "Concurrent block fetches per worker (default 8)")
      ->check(CLI::Range(1, 64));
  load->add_option("--bandwidth", load_opts.bandwidth, "Limit for the whole job in bytes/s, e.g. 100Mi or 50M/s");
  load->add_flag("--background", load_opts.background, "Submit the job and return (see granary jobs)");
  load->add_flag("--json", load_opts.json, "Print the job as JSON when it ends (no progress output)");
  load->add_option("--cancel", load_opts.cancel, "Cancel the load job with this ID");
  bool jobs_json = false;
  auto* jobs = app.add_subcommand("jobs", "List load jobs with their state and progress");
  jobs->add_flag("--json", jobs_json, "Print JSON");
  auto* deploy = app.add_subcommand("deploy", "Generate deployment files from the configuration");
  auto* worker_tiers = deploy->add_subcommand(
      "worker-tiers", "Print the worker DaemonSet patch (volumes, memory) for worker.tieredstore.levels of --config");
  deploy->require_subcommand(1);
  deploy->fallthrough();  // --config after the subcommand names the file, as before it
  worker_tiers->fallthrough();
  std::string fluid_config = kFluidConfig, secrets_dir = kFluidSecrets;
  bool dry_run = false;
  auto* fluid = app.add_subcommand("fluid-fuse", "Fluid ThinRuntime FUSE entrypoint: mount the Dataset, run granary-fuse");
  fluid->add_option("--fluid-config", fluid_config, "Fluid's config.json");
  fluid->add_option("--secrets-dir", secrets_dir, "Where Fluid mounts the secrets of encryptOptions");
  fluid->add_flag("--dry-run", dry_run, "Print the plan (mounts, granary-fuse arguments) as JSON and stop");
  // Settings for this command's calls and for the granary-fuse it runs, e.g. the ThinRuntimeProfile's
  // --rpc.token_file (a Fluid FUSE pod has no config file).
  ConfigFlags fluid_flags;
  AddConfigFlags(*fluid, &fluid_flags);
  fluid->fallthrough();
  auto* config = app.add_subcommand("config", "Print every setting with its default and meaning");
  bool markdown = false;
  config->add_flag("--markdown", markdown, "Print a Markdown table (docs/configuration.md)");
  std::string get_key;
  config->add_option("--get", get_key, "Print the effective value of one setting (after --config and flags)");
  config->fallthrough();

  StatsOptions stats_opts;
  auto* stats = app.add_subcommand("stats", "Live view of one node (FUSE, reads by source, metadata, cache, "
                                            "under-storage, memory), one line per interval");
  stats->add_option("PATH", stats_opts.path, "A path in a granary mount (default: fuse.mountpoint; with none, "
                                             "every worker of the cluster)");
  stats->add_option("--interval", stats_opts.interval, "Time between lines, e.g. 1s (default 1s)");
  stats->add_option("--count", stats_opts.count, "Lines to print, then stop (default: until Ctrl-C)")
      ->check(CLI::NonNegativeNumber);
  stats->add_flag("--json", stats_opts.json, "One JSON object per line (counts over the interval)");
  TraceOptions trace_opts;
  auto* trace = app.add_subcommand("trace", "Stream the FUSE operations of this node's mount, one line each");
  trace->add_option("PATH", trace_opts.path, "A path in a granary mount (default: fuse.mountpoint)");
  trace->add_option("--pid", trace_opts.pid, "Only this process's operations")->check(CLI::NonNegativeNumber);
  trace->add_option("--prefix", trace_opts.prefix, "Only paths under this namespace path, e.g. /imagenet/train");
  trace->add_option("--op", trace_opts.ops, "Only these operations (repeatable): lookup, getattr, open, read, release, "
                                           "opendir, readdir, readdirplus, statfs, and the writes' create, write, "
                                           "flush, fsync, setattr, mkdir, rmdir, unlink, rename")
      ->check(CLI::IsMember(fuse::kTracedOps));
  trace->add_option("--count", trace_opts.count, "Records to print, then stop")->check(CLI::NonNegativeNumber);
  trace->add_flag("--json", trace_opts.json, "One JSON object per line (what `granary profile --file` reads)");
  ProfileOptions profile_opts;
  auto* profile = app.add_subcommand("profile", "Summarise a live trace (for --duration) or a saved one (--file): "
                                                "top operations, top files, slowest calls");
  profile->add_option("PATH", profile_opts.path, "A path in a granary mount, for a live trace (default: fuse.mountpoint)");
  profile->add_option("--file", profile_opts.file, "A trace saved with `granary trace --json` (- for standard input)");
  profile->add_option("--duration", profile_opts.duration, "How long a live trace runs (default 10s)");
  profile->add_option("--pid", profile_opts.pid, "Only this process's operations")->check(CLI::NonNegativeNumber);
  profile->add_option("--top", profile_opts.top, "Rows in each list (default 10)");
  profile->add_flag("--json", profile_opts.json, "Print JSON");
  InfoOptions info_opts;
  auto* info = app.add_subcommand("info", "Where a file's blocks are cached (worker, tier, replica, local), or a "
                                          "directory's cached share and files wholly on this node");
  info->add_option("PATH", info_opts.path, "A namespace path (/imagenet/...) or a path in a granary mount")->required();
  info->add_flag("--json", info_opts.json, "Print JSON");

  LocalOptions local_opts;
  ConfigFlags local_flags;
  auto* local = app.add_subcommand("local", "Run master, worker and FUSE on this machine over URI, mounted at MOUNTPOINT");
  local->add_option("URI", local_opts.uri, "Under-storage, e.g. file:///srv/imagenet or /srv/imagenet")->required();
  local->add_option("MOUNTPOINT", local_opts.mountpoint, "An existing empty directory")->required();
  local->add_option("--dir", local_opts.dir, "State and cache directory (default ~/.granary/local)");
  local->add_option("--name", local_opts.name, "Namespace path of the dataset (default /<last URI segment>)");
  local->add_option("-o,--option", raw_options,
                    "Mount option KEY=VALUE (repeatable), as for granary mount: the under-storage's (endpoint=..., "
                    "region=...) and the dataset's (write=through|back, cache.policy=..., cache.replicas=...)");
  AddConfigFlags(*local, &local_flags);

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }

  if (*config && !get_key.empty()) {
    auto cfg = BuildConfig(flags);
    if (!cfg.ok()) return Fail(cfg.status());
    for (const auto& st : Config::Settings()) {
      if (st.key == get_key) {
        std::printf("%s\n", st.get(*cfg).c_str());
        return 0;
      }
    }
    return Fail(NotFoundError("no setting " + get_key + " (granary config lists them)"));
  }
  if (*config) return CmdConfig(markdown);
  auto options = ParseMountOptions(raw_options);
  if (!options.ok()) return Fail(options.status());
  if (*local) {
    TuneAllocator();  // the daemons run in this process (common/allocator.h)
    Shutdown::InstallSignalHandling();
    if (local_flags.config_file.empty()) local_flags.config_file = flags.config_file;
    auto cfg = BuildConfig(local_flags);
    if (!cfg.ok()) return Fail(cfg.status());
    local_opts.options = *options;
    return RunLocal(local_opts, std::move(cfg).value());
  }

  if (*deploy) {
    auto cfg = BuildConfig(flags);
    if (!cfg.ok()) return Fail(cfg.status());
    auto patch = WorkerTiersPatch(*cfg, flags.config_file.empty() ? "(defaults)" : flags.config_file);
    if (!patch.ok()) return Fail(patch.status());
    std::fputs(patch->c_str(), stdout);
    return *worker_tiers ? 0 : 1;
  }
  // Before any thread exists (gRPC's included): Ctrl-C ends these long-running views cleanly.
  if (*stats || *trace || *profile) Shutdown::InstallSignalHandling();
  if (*trace || *profile) {
    if (flags.config_file.empty() && access(LocalDiscoveryFile().c_str(), R_OK) == 0) {
      flags.config_file = LocalDiscoveryFile();
    }
    auto cfg = BuildConfig(flags);
    if (!cfg.ok()) return Fail(cfg.status());
    return *trace ? CmdTrace(*cfg, trace_opts) : CmdProfile(*cfg, profile_opts);
  }
  if (*fluid) {
    if (fluid_flags.config_file.empty()) fluid_flags.config_file = flags.config_file;
    auto cfg = BuildConfig(fluid_flags);
    if (!cfg.ok()) return Fail(cfg.status());
    return CmdFluidFuse(*cfg, fluid_config, secrets_dir, dry_run, fluid_flags);
  }

  // Find the master.
  if (flags.config_file.empty() && master.empty() && !std::getenv("GRANARY_MASTER") &&
      access(LocalDiscoveryFile().c_str(), R_OK) == 0) {
    flags.config_file = LocalDiscoveryFile();
  }
  auto cfg = BuildConfig(flags);
  if (!cfg.ok()) return Fail(cfg.status());
  if (master.empty()) {
    if (const char* env = std::getenv("GRANARY_MASTER"); env && *env) master = env;
  }
  if (!master.empty()) {
    Status st = cfg->Set("master.address", master, "--master");
    if (!st.ok()) return Fail(st);
  }
  auto conn = MasterConn::Open(*cfg);
  if (!conn.ok()) return Fail(conn.status());

  if (*mount) return CmdMount(*conn, path, uri, *options);
  if (*unmount) return CmdUnmount(*conn, path);
  if (*mounts) return CmdMounts(*conn);
  if (*ls) return CmdLs(*conn, path);
  if (*stat) return CmdStat(*conn, path);
  if (*report) return CmdReport(*conn, json);
  if (*pin) return CmdPin(*conn, path, true);
  if (*unpin) return CmdPin(*conn, path, false);
  if (*free_cmd) return CmdFree(*conn, path);
  if (*du) return CmdDu(*conn, path, json);
  if (*load) return CmdLoad(*conn, load_opts);
  if (*jobs) return CmdJobs(*conn, jobs_json);
  if (*stats) return CmdStats(*cfg, *conn, stats_opts);
  if (*info) return CmdInfo(*cfg, *conn, info_opts);
  return 1;
}

}  // namespace granary::cli
