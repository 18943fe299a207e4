// What the cache is doing, seen through the CLI against real daemons and a real mount:
// `granary trace` (only the traced process, nothing when no one listens), `granary profile` of a
// saved trace, `granary stats` on `granary local` with no flags (counts that add up to what a
// reader did, 80 columns in a terminal), the Grafana dashboard against the names /metrics serves, and
// each mount's write mode and the writes in `granary mounts`, `report` and `stats`.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <regex>
#include <set>
#include <sstream>

#include <nlohmann/json.hpp>

#include "tests/integration/harness.h"

namespace granary::testing {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

// The JSON objects among a log's lines (stderr lines and blank keep-alives are skipped).
std::vector<json> JsonLines(const std::string& log) {
  std::vector<json> out;
  std::istringstream in(log);
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] != '{') continue;
    json j = json::parse(line, nullptr, false);
    if (j.is_object()) out.push_back(std::move(j));
  }
  return out;
}

// A process that waits for a line on its standard input, then reads `files` whole and finally
// stats `marker` (which does not exist): a lookup that ends its part of the trace.
const char* kReader = R"(
import os, sys
sys.stdin.readline()
for p in sys.argv[2:]:
    with open(p, 'rb') as f:
        while f.read(1 << 20):
            pass
try:
    os.stat(sys.argv[1])
except FileNotFoundError:
    pass
)";

TEST(Trace, SeesExactlyTheTracedProcessAndNothingCostsWhenNoOneListens) {
  TempDir dir;
  std::map<std::string, std::string> files;
  for (int i = 0; i < 8; ++i) files["a/f" + std::to_string(i)] = RandomBytes(30000 + 7000 * i, i);
  for (int i = 0; i < 8; ++i) files["b/g" + std::to_string(i)] = RandomBytes(20000 + 1000 * i, 50 + i);
  for (const auto& [name, bytes] : files) WriteFile(dir / ("src/" + name), bytes);
  LocalCluster c(dir);  // daemon read mode, no page cache kept: every read reaches granary-fuse
  std::string why;
  ASSERT_TRUE(c.StartDaemons(&why)) << why;
  ASSERT_EQ(c.Cli({"mount", "/ds", "file://" + dir / "src"}).code, 0);
  ASSERT_TRUE(c.StartFuse(&why)) << why;

  // Nobody listens: the mount serves reads and lookups, and not one trace record is made.
  double ops_before = c.Metric("fuse", "granary_fuse_operation_duration_seconds_count{op=\"read\"}");
  for (const auto& [name, bytes] : files) EXPECT_EQ(ReadFile(c.mountpoint() + "/ds/" + name), bytes);
  EXPECT_GT(c.Metric("fuse", "granary_fuse_operation_duration_seconds_count{op=\"read\"}"), ops_before);
  EXPECT_EQ(c.Metric("fuse", "granary_fuse_trace_records_total"), 0) << "tracing cost something with no listener";

  // The traced reader reads a/, another process reads b/ at the same time.
  WriteFile(dir / "reader.py", kReader);
  std::vector<std::string> mine = {"/usr/bin/python3", dir / "reader.py", c.mountpoint() + "/ds/a/END-MARKER"};
  for (int i = 0; i < 8; ++i) mine.push_back(c.mountpoint() + "/ds/a/f" + std::to_string(i));
  int go[2];
  ASSERT_EQ(pipe(go), 0);
  pid_t reader = fork();
  if (reader == 0) {
    dup2(go[0], 0);
    close(go[1]);
    std::vector<char*> argv;
    for (auto& a : mine) argv.push_back(a.data());
    argv.push_back(nullptr);
    execv(argv[0], argv.data());
    _exit(127);
  }
  close(go[0]);
  Process trace({Bin("granary"), "trace", c.mountpoint(), "--pid", std::to_string(reader), "--json"},
                dir / "trace.log");
  ASSERT_TRUE(WaitFor([&] { return trace.Log().find("tracing") != std::string::npos || !trace.Running(); }))
      << trace.Log();
  ASSERT_TRUE(trace.Running()) << trace.Log();
  std::atomic<bool> stop{false};
  std::thread other([&] {
    while (!stop) {
      for (int i = 0; i < 8; ++i) ReadFile(c.mountpoint() + "/ds/b/g" + std::to_string(i));
    }
  });
  ASSERT_EQ(write(go[1], "go\n", 3), 3);
  close(go[1]);
  int status = 0;
  ASSERT_EQ(waitpid(reader, &status, 0), reader);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  // The marker lookup comes last: once it is in the trace, so is everything before it.
  bool ended = WaitFor([&] {
    for (const auto& r : JsonLines(trace.Log())) {
      if (r["op"] == "lookup" && r["path"] == "/ds/a/END-MARKER") return true;
    }
    return false;
  });
  stop = true;
  other.join();
  trace.Stop(SIGINT);
  ASSERT_TRUE(ended) << trace.Log();
  std::map<std::string, uint64_t> read_bytes;
  for (const auto& r : JsonLines(trace.Log())) {
    EXPECT_EQ(r["pid"].get<int64_t>(), reader) << r.dump();
    EXPECT_NE(r["path"].get<std::string>().rfind("/ds/b", 0), 0u) << "another process's operation: " << r.dump();
    if (r["op"] == "read" && r["result"] == "ok") {
      EXPECT_EQ(r["source"], "local") << r.dump();
      // A read's size is what the kernel asked for; what came back is clipped at the end of file.
      std::string name = r["path"].get<std::string>().substr(4);  // "/ds/a/f0" -> "a/f0"
      EXPECT_TRUE(files.count(name)) << r.dump();
      uint64_t end = std::min<uint64_t>(r["offset"].get<uint64_t>() + r["size"].get<uint64_t>(), files[name].size());
      read_bytes[name] += end - std::min<uint64_t>(end, r["offset"].get<uint64_t>());
    }
  }
  for (int i = 0; i < 8; ++i) {
    std::string name = "a/f" + std::to_string(i);
    EXPECT_EQ(read_bytes[name], files[name].size()) << name << " is not wholly in the trace";
  }
  EXPECT_GT(c.Metric("fuse", "granary_fuse_trace_records_total"), 0);

  // A saved trace is summarised by `granary profile --file`.
  std::ofstream saved(dir / "saved.jsonl");
  for (const auto& r : JsonLines(trace.Log())) saved << r.dump() << "\n";
  saved.close();
  RunResult p = RunCommand({Bin("granary"), "profile", "--file", dir / "saved.jsonl", "--json"});
  ASSERT_EQ(p.code, 0) << p.out;
  json pj = json::parse(p.out, nullptr, false);
  ASSERT_TRUE(pj.is_object()) << p.out;
  uint64_t reads = 0, bytes = 0;
  for (const auto& o : pj["operations"]) {
    if (o["op"] == "read") {
      reads = o["count"];
      bytes = o["bytes"];
    }
  }
  EXPECT_GT(reads, 0u) << p.out;
  EXPECT_GE(bytes, 8u * 30000) << p.out;
  EXPECT_FALSE(pj["slowest"].empty());
  // p99 by nearest rank: of 5 reads, the slowest, never below the average (it was 100us against an
  // average of 280us).
  std::ofstream few(dir / "few.jsonl");
  for (int lat : {100, 100, 100, 100, 1000}) few << json{{"op", "read"}, {"latency_us", lat}, {"size", 4096}}.dump() << "\n";
  few.close();
  RunResult fp = RunCommand({Bin("granary"), "profile", "--file", dir / "few.jsonl", "--json"});
  ASSERT_EQ(fp.code, 0) << fp.out;
  json fj = json::parse(fp.out, nullptr, false);
  ASSERT_TRUE(fj.is_object() && fj["operations"].size() == 1u) << fp.out;
  EXPECT_DOUBLE_EQ(fj["operations"][0]["p99_s"].get<double>(), 0.001) << fp.out;
  EXPECT_GE(fj["operations"][0]["p99_s"].get<double>(), fj["operations"][0]["avg_s"].get<double>()) << fp.out;
  // An operation no record carries is refused, naming it and what is accepted.
  RunResult bogus = RunCommand({Bin("granary"), "trace", c.mountpoint(), "--op", "bogus", "--count", "1"});
  EXPECT_NE(bogus.code, 0) << bogus.out;
  EXPECT_NE(bogus.out.find("bogus"), std::string::npos) << bogus.out;
  EXPECT_NE(bogus.out.find("readdirplus"), std::string::npos) << bogus.out;
  RunResult bad = RunCommand({Bin("granary"), "profile", "--file", dir / "reader.py"});
  EXPECT_NE(bad.code, 0);
  EXPECT_NE(bad.out.find("granary trace --json"), std::string::npos) << bad.out;
}

// `granary stats` finds `granary local` with no flags; three JSON lines come; over a window that
// holds a whole read, the counts add up to what the reader did; in a terminal every line fits 80
// columns.
TEST(Stats, CountsAddUpOnGranaryLocalAndFitEightyColumns) {
  TempDir dir;
  std::map<std::string, std::string> files;
  uint64_t total = 0;
  for (int i = 0; i < 12; ++i) {
    files["img" + std::to_string(i) + ".jpg"] = RandomBytes(40000 + 5000 * i, 300 + i);
    total += files["img" + std::to_string(i) + ".jpg"].size();
  }
  for (const auto& [name, bytes] : files) WriteFile(dir / ("ds/" + name), bytes);
  mkdir((dir / "mnt").c_str(), 0755);
  std::map<std::string, std::string> env{{"GRANARY_HOME", dir / "home"}};
  Process local({Bin("granary"), "local", "file://" + dir / "ds", dir / "mnt", "--dir", dir / "state",
                 "--fuse.keep_cache", "false", "--fuse.open", "daemon"},
                dir / "local.log", env);
  ASSERT_TRUE(WaitFor([&] { return IsMounted(dir / "mnt") || !local.Running(); })) << local.Log();
  ASSERT_TRUE(IsMounted(dir / "mnt")) << local.Log();

  RunResult three = RunCommand({Bin("granary"), "stats", "--count", "3", "--interval", "200ms", "--json"}, env);
  ASSERT_EQ(three.code, 0) << three.out;
  EXPECT_EQ(JsonLines(three.out).size(), 3u) << three.out;

  Process stats({Bin("granary"), "stats", "--interval", "300ms", "--json"}, dir / "stats.log", env);
  ASSERT_TRUE(WaitFor([&] { return JsonLines(stats.Log()).size() >= 1 || !stats.Running(); })) << stats.Log();
  size_t first = JsonLines(stats.Log()).size();  // lines so far cover time before the read
  for (const auto& [name, bytes] : files) EXPECT_EQ(ReadFile(dir / ("mnt/" + name)), bytes);
  // Two more lines once the read ended: the second was taken wholly after it.
  const size_t done = JsonLines(stats.Log()).size();  // lines printed by the time the read ended
  ASSERT_TRUE(WaitFor([&] { return JsonLines(stats.Log()).size() >= done + 2; })) << stats.Log();
  stats.Stop(SIGINT);
  auto lines = JsonLines(stats.Log());
  double files_read = 0, read_bytes = 0, local_b = 0, peer_b = 0, ufs_b = 0, ufs_req_bytes = 0;
  for (size_t i = first; i < lines.size(); ++i) {
    const json& l = lines[i];
    files_read += l["fuse"]["files"].get<double>();
    read_bytes += l["fuse"]["read_bytes"].get<double>();
    local_b += l["read"]["local_bytes"].get<double>();
    peer_b += l["read"]["peer_bytes"].get<double>();
    ufs_b += l["read"]["under_storage_bytes"].get<double>();
    ufs_req_bytes += l["ufs"]["bytes"].get<double>();
  }
  EXPECT_EQ(files_read, files.size()) << stats.Log();
  EXPECT_EQ(read_bytes, total) << stats.Log();
  EXPECT_EQ(local_b + peer_b + ufs_b, total) << "every byte has one source";
  // Cold: a file's first read fetched its block from the under-storage; the rest of the file was
  // then in this node's cache.
  EXPECT_GE(ufs_b, files.size()) << "a cold read fetched from the under-storage";
  EXPECT_EQ(peer_b, 0) << "one worker: no peers";
  EXPECT_EQ(ufs_req_bytes, total) << "the worker fetched each byte once";

  // Warm: the same read is all local hits.
  Process warm({Bin("granary"), "stats", "--interval", "300ms", "--json"}, dir / "warm.log", env);
  ASSERT_TRUE(WaitFor([&] { return JsonLines(warm.Log()).size() >= 1 || !warm.Running(); })) << warm.Log();
  first = JsonLines(warm.Log()).size();
  for (const auto& [name, bytes] : files) EXPECT_EQ(ReadFile(dir / ("mnt/" + name)), bytes);
  const size_t warm_done = JsonLines(warm.Log()).size();
  ASSERT_TRUE(WaitFor([&] { return JsonLines(warm.Log()).size() >= warm_done + 2; })) << warm.Log();
  warm.Stop(SIGINT);
  lines = JsonLines(warm.Log());
  double hits = 0, all = 0;
  for (size_t i = first; i < lines.size(); ++i) {
    hits += lines[i]["read"]["local_bytes"].get<double>();
    all += lines[i]["fuse"]["read_bytes"].get<double>();
  }
  EXPECT_EQ(all, total);
  EXPECT_EQ(hits, total) << "a warm read is all local";

  // In a pseudo-terminal (script(1)), the live view fits 80 columns.
  RunResult tty = RunCommand({"script", "-qec", Bin("granary") + " stats --count 2 --interval 200ms", "/dev/null"}, env);
  ASSERT_EQ(tty.code, 0) << tty.out;
  int rows = 0;
  std::istringstream in(tty.out);
  std::string line;
  while (std::getline(in, line)) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.empty()) continue;
    ++rows;
    EXPECT_LE(line.size(), 80u) << "too wide: [" << line << "]";
  }
  EXPECT_EQ(rows, 4) << "two header lines and two rows:\n" << tty.out;
  EXPECT_NE(tty.out.find("fuse"), std::string::npos) << tty.out;

  EXPECT_EQ(local.Stop(SIGINT), 0) << local.Log();
}

// The columns of the line of `granary mounts` (or the report's Mounts table) naming mount `path`;
// empty when no line does.
std::vector<std::string> MountRow(const std::string& out, const std::string& path) {
  std::istringstream in(out);
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream words(line);
    std::vector<std::string> cols;
    for (std::string w; words >> w;) cols.push_back(w);
    if (!cols.empty() && cols[0] == path) return cols;
  }
  return {};
}

// Whether a mount is writable, and what was written: `granary mounts` and `granary report` (text
// and --json) show each mount's write mode; the report's writes line and `granary stats` count the
// files uploaded in both modes (write=through as its close() returns, write=back after) and the
// write-back backlog.
TEST(Report, ShowsEachMountsWriteModeAndCountsUploadsInBothModes) {
  TempDir dir;
  WriteFile(dir / "ro/a.txt", "read only");
  fs::create_directories(dir / "through");
  fs::create_directories(dir / "back");
  LocalCluster c(dir);
  std::string why;
  ASSERT_TRUE(c.StartDaemons(&why)) << why;
  ASSERT_TRUE(c.StartFuse(&why)) << why;
  ASSERT_EQ(c.Cli({"mount", "/ro", "file://" + dir / "ro"}).code, 0);
  RunResult text = c.Cli({"report"});
  ASSERT_EQ(text.code, 0) << text.out;
  EXPECT_NE(text.out.find("Writes: off (every mount is read-only"), std::string::npos) << text.out;

  ASSERT_EQ(c.Cli({"mount", "/t", "file://" + dir / "through", "-o", "write=through"}).code, 0);
  ASSERT_EQ(c.Cli({"mount", "/b", "file://" + dir / "back", "-o", "write=back"}).code, 0);
  RunResult mounts = c.Cli({"mounts"});
  ASSERT_EQ(mounts.code, 0) << mounts.out;
  EXPECT_EQ(MountRow(mounts.out, "PATH").at(2), "WRITE") << mounts.out;
  EXPECT_EQ(MountRow(mounts.out, "/ro").at(2), "off") << mounts.out;
  EXPECT_EQ(MountRow(mounts.out, "/t").at(2), "through") << mounts.out;
  EXPECT_EQ(MountRow(mounts.out, "/b").at(2), "back") << mounts.out;
  json r = c.Report();
  ASSERT_TRUE(r.is_object());
  std::map<std::string, std::string> modes;
  for (const auto& m : r["mounts"]) modes[m["path"]] = m.value("write", "(none)");
  EXPECT_EQ(modes, (std::map<std::string, std::string>{{"/ro", "off"}, {"/t", "through"}, {"/b", "back"}}))
      << r.dump(2);
  ASSERT_TRUE(r.contains("writes")) << r.dump(2);
  EXPECT_EQ(r["writes"]["writable_mounts"], 2);

  // `granary stats` of this node over the writes, its lines summed.
  Process stats({Bin("granary"), "--master", c.master_address(), "stats", c.mountpoint(), "--interval", "300ms",
                 "--json"},
                dir / "stats.log", {{"GRANARY_HOME", dir / "home"}});
  ASSERT_TRUE(WaitFor([&] { return JsonLines(stats.Log()).size() >= 1 || !stats.Running(); })) << stats.Log();
  const std::string a = RandomBytes(100000, 1), b = RandomBytes(50000, 2);
  WriteFile(c.mountpoint() + "/t/a.bin", a);
  WriteFile(c.mountpoint() + "/b/b.bin", b);
  EXPECT_TRUE(WaitFor([&] { return fs::exists(dir / "back/b.bin") && ReadFile(dir / "back/b.bin") == b; }))
      << c.Logs();
  EXPECT_EQ(ReadFile(dir / "through/a.bin"), a);

  // As of the worker's next heartbeat: two files uploaded, none waiting, none failed.
  EXPECT_TRUE(WaitFor([&] {
    r = c.Report();
    return r.is_object() && r.contains("writes") && r["writes"].value("uploaded_files", 0) == 2 &&
           r["writes"].value("writeback_files", 1) == 0;
  })) << r.dump(2);
  EXPECT_EQ(r["writes"].value("uploaded_bytes", 0), a.size() + b.size()) << r.dump(2);
  EXPECT_EQ(r["writes"].value("upload_failures", 1), 0) << r.dump(2);
  text = c.Cli({"report"});
  EXPECT_NE(text.out.find("Writes: 2 writable mounts: /t (through), /b (back); 0 files being written, uploaded 2 "
                          "files"),
            std::string::npos)
      << text.out;
  EXPECT_EQ(MountRow(text.out, "/t").at(2), "through") << text.out;
  EXPECT_EQ(MountRow(text.out, "/ro").at(2), "off") << text.out;

  ASSERT_TRUE(WaitFor([&] {
    double n = 0;
    for (const auto& l : JsonLines(stats.Log())) n += l["writes"].value("uploaded_files", 0.0);
    return n == 2 || !stats.Running();
  })) << stats.Log();
  stats.Stop(SIGINT);
  double bytes = 0;
  for (const auto& l : JsonLines(stats.Log())) bytes += l["writes"].value("uploaded_bytes", 0.0);
  EXPECT_EQ(bytes, static_cast<double>(a.size() + b.size())) << stats.Log();
  EXPECT_TRUE(c.StopAll(&why)) << why;
}

}  // namespace
}  // namespace granary::testing
