// `granary load`, `granary jobs`, `granary du` and the report against a real S3 server (Ceph RGW on
// loopback): a 10k-file dataset loaded to 100%, a reload that moves nothing, a master killed with
// -9 in the middle of a load, cancellation, bad requests, the progress bar in a terminal, and
// fetch-ahead through a store that answers 503 SlowDown and resets connections (tests/testutil/proxy.h).
#include <gtest/gtest.h>
#include <httplib.h>
#include <sys/stat.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <random>
#include <thread>
#include <nlohmann/json.hpp>
#include <sstream>

#include "tests/integration/harness.h"
#include "tests/testutil/proxy.h"

namespace granary::testing {
namespace {

constexpr int kTenK = 10000;
constexpr int kTenKSize = 1000;
constexpr int kSlow = 2000;
constexpr int kSlowSize = 4096;
constexpr int kAheadPerDir = 60;  // ahead/{a,b,c,d}/k000NN: an epoch's tree for fetch-ahead
constexpr int kAheadSize = 20000;

// The bytes s3_put.py writes for a "many" object.
std::string ManyBody(const std::string& key, size_t size) {
  std::string out;
  while (out.size() < size) out += key + "\n";
  out.resize(size);
  return out;
}

class LoadTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new TempDir();
    RunResult r = RunCommand({"bash", SourceDir() + "/scripts/s3-server.sh", "start", *dir_ / "rgw"}, {},
                             std::chrono::seconds(180));
    std::istringstream in(r.out.substr(std::min(r.out.size(), r.out.rfind("READY"))));
    std::string ready;
    in >> ready >> endpoint_ >> ak_ >> sk_;
    started_ = r.code == 0 && ready == "READY";
    if (!started_) {
      start_log_ = r.out;
      return;
    }
    nlohmann::json spec = {
        {"bucket", "granary-load"},
        {"objects",
         {{{"many", "ten/k"}, {"count", kTenK}, {"size", kTenKSize}, {"threads", 16}},
          {{"many", "slow/s"}, {"count", kSlow}, {"size", kSlowSize}, {"threads", 16}},
          {{"many", "ahead/a/k"}, {"count", kAheadPerDir}, {"size", kAheadSize}, {"threads", 16}},
          {{"many", "ahead/b/k"}, {"count", kAheadPerDir}, {"size", kAheadSize}, {"threads", 16}},
          {{"many", "ahead/c/k"}, {"count", kAheadPerDir}, {"size", kAheadSize}, {"threads", 16}},
          {{"many", "ahead/d/k"}, {"count", kAheadPerDir}, {"size", kAheadSize}, {"threads", 16}}}}};
    WriteFile(*dir_ / "spec.json", spec.dump());
    RunResult put = RunCommand({"/usr/bin/python3", SourceDir() + "/tests/integration/s3_put.py", endpoint_, ak_, sk_,
                                *dir_ / "spec.json"}, {}, std::chrono::seconds(600));
    if (put.code != 0) {
      started_ = false;
      start_log_ = put.out;
    }
    WriteFile(*dir_ / "ak", ak_);
    WriteFile(*dir_ / "sk", sk_);
  }
  static void TearDownTestSuite() {
    RunCommand({"bash", SourceDir() + "/scripts/s3-server.sh", "stop", *dir_ / "rgw"});
    delete dir_;
  }
  void SetUp() override { ASSERT_TRUE(started_) << "S3 server did not start:\n" << start_log_; }

  // A cluster with the bucket's `prefix` mounted at /ds (through `endpoint`, RGW's by default, with
  // `mount_opts` as further mount options).
  std::unique_ptr<LocalCluster> Start(const TempDir& dir, const std::string& prefix, bool fuse = false,
                                      std::string endpoint = "", std::vector<std::string> mount_opts = {}) {
    ClusterOptions opts;  // 64 KiB blocks: each object is one block
    opts.extra_args = {"--ufs.secrets_dir", dir_->path()};  // the suite's credential files
    auto c = std::make_unique<LocalCluster>(dir, opts);
    std::string why;
    EXPECT_TRUE(c->StartDaemons(&why)) << why;
    if (fuse) {
      EXPECT_TRUE(c->StartFuse(&why)) << why;
    }
    std::vector<std::string> args = {"mount", "/ds", "s3://granary-load/" + prefix,
                                     "-o", "endpoint=" + (endpoint.empty() ? endpoint_ : endpoint),
                                     "-o", "access_key_file=" + (*dir_ / "ak"),
                                     "-o", "secret_key_file=" + (*dir_ / "sk")};
    for (const auto& o : mount_opts) {
      args.push_back("-o");
      args.push_back(o);
    }
    RunResult m = c->Cli(args);
    EXPECT_EQ(m.code, 0) << m.out;
    return c;
  }
  static RunResult Load(LocalCluster& c, std::vector<std::string> args) {
    args.insert(args.begin(), {Bin("granary"), "--master", c.master_address(), "load"});
    return RunCommand(args, {}, std::chrono::seconds(600));
  }
  static nlohmann::json Json(const RunResult& r) { return nlohmann::json::parse(r.out, nullptr, false); }
  static nlohmann::json Job(LocalCluster& c, uint64_t id) {
    RunResult r = c.Cli({"jobs", "--json"});
    auto j = Json(r);
    if (j.is_discarded()) return nullptr;
    for (const auto& job : j) {
      if (job["id"] == id) return job;
    }
    return nullptr;
  }
  static uint64_t UfsBytes(LocalCluster& c) {
    uint64_t h = 0, m = 0, u = 0;
    EXPECT_TRUE(c.WorkerCounters(&h, &m, &u));
    return u;
  }

  static TempDir* dir_;
  static bool started_;
  static std::string endpoint_, ak_, sk_, start_log_;
};
TempDir* LoadTest::dir_ = nullptr;
bool LoadTest::started_ = false;
std::string LoadTest::endpoint_, LoadTest::ak_, LoadTest::sk_, LoadTest::start_log_;

TEST_F(LoadTest, TenThousandFilesLoadToFullAndASecondLoadMovesNothing) {
  TempDir dir;
  auto c = Start(dir, "ten", /*fuse=*/true);
  RunResult first = Load(*c, {"/ds", "--json"});
  ASSERT_EQ(first.code, 0) << first.out;
  auto j = Json(first);
  ASSERT_FALSE(j.is_discarded()) << first.out;
  EXPECT_EQ(j["state"], "succeeded");
  EXPECT_EQ(j["files_total"], kTenK);
  EXPECT_EQ(j["files_done"], kTenK);
  EXPECT_EQ(j["files_failed"], 0);
  EXPECT_EQ(j["bytes_fetched"], uint64_t{kTenK} * kTenKSize);
  EXPECT_EQ(j["blocks_fetched"], kTenK);
  EXPECT_EQ(UfsBytes(*c), uint64_t{kTenK} * kTenKSize) << "every block came from the under-storage exactly once";

  // The workers' counters reach the master with their next heartbeat (early after a change).
  nlohmann::json report;
  EXPECT_TRUE(WaitFor([&] {
    report = c->Report();
    return !report.is_null() && report["mounts"].size() == 1 &&
           report["mounts"][0]["cached_bytes"] == uint64_t{kTenK} * kTenKSize;
  })) << report.dump(1);
  ASSERT_FALSE(report.is_null());
  ASSERT_EQ(report["mounts"].size(), 1u);
  EXPECT_EQ(report["mounts"][0]["ufs_total_bytes"], uint64_t{kTenK} * kTenKSize);
  EXPECT_DOUBLE_EQ(report["mounts"][0]["cached_percentage"].get<double>(), 100.0);
  RunResult text = c->Cli({"report"});
  EXPECT_NE(text.out.find("100.0%"), std::string::npos) << text.out;

  RunResult du = c->Cli({"du", "/ds", "--json"});
  auto d = Json(du);
  ASSERT_FALSE(d.is_discarded()) << du.out;
  EXPECT_EQ(d["total"]["files"], kTenK);
  EXPECT_EQ(d["total"]["cached_bytes"], d["total"]["bytes"]);

  RunResult second = Load(*c, {"/ds", "--json"});
  ASSERT_EQ(second.code, 0) << second.out;
  auto j2 = Json(second);
  EXPECT_EQ(j2["files_done"], kTenK);
  EXPECT_EQ(j2["bytes_fetched"], 0) << "a second load of a cached dataset moves no bytes";
  EXPECT_EQ(j2["blocks_cached"], kTenK);
  EXPECT_EQ(UfsBytes(*c), uint64_t{kTenK} * kTenKSize);

  // Loaded bytes are the object's bytes, and reads of them are hits.
  uint64_t hits0 = 0, misses0 = 0, ufs0 = 0;
  ASSERT_TRUE(c->WorkerCounters(&hits0, &misses0, &ufs0));
  for (int i = 0; i < kTenK; i += 997) {
    char name[16];
    std::snprintf(name, sizeof name, "k%05d", i);
    EXPECT_EQ(ReadFile(c->mountpoint() + "/ds/" + name), ManyBody(std::string("ten/") + name, kTenKSize)) << name;
  }
  // The report carries the counters of the worker's last heartbeat: wait for the reads to show.
  uint64_t hits1 = 0, misses1 = 0, ufs1 = 0;
  ASSERT_TRUE(WaitFor([&] { return c->WorkerCounters(&hits1, &misses1, &ufs1) && hits1 >= hits0 + 11; }))
      << hits1 << " hits";
  EXPECT_EQ(misses1, misses0);
  EXPECT_EQ(ufs1, ufs0);

  // Free empties the cache again: du and report agree.
  ASSERT_EQ(c->Cli({"free", "/ds"}).code, 0);
  EXPECT_TRUE(WaitFor([&] {
    auto r = c->Report();
    return !r.is_null() && r["mounts"][0]["cached_bytes"] == 0;
  }));
}

TEST_F(LoadTest, FiltersAndMetadataOnly) {
  TempDir dir;
  auto c = Start(dir, "ten");
  RunResult meta = Load(*c, {"/ds", "--metadata-only", "--json"});
  ASSERT_EQ(meta.code, 0) << meta.out;
  auto m = Json(meta);
  EXPECT_EQ(m["files_total"], kTenK);
  EXPECT_EQ(m["bytes_fetched"], 0);
  EXPECT_EQ(UfsBytes(*c), 0u) << "--metadata-only reads no data";
  auto report = c->Report();
  EXPECT_EQ(report["mounts"][0]["ufs_total_bytes"], uint64_t{kTenK} * kTenKSize)
      << "after a metadata load the report knows the whole dataset";
  // Its text says what it did: files listed, no byte rate (it printed "8.0Mi/s" of listing).
  RunResult meta_text = Load(*c, {"/ds", "--metadata-only"});
  ASSERT_EQ(meta_text.code, 0) << meta_text.out;
  EXPECT_NE(meta_text.out.find("files listed"), std::string::npos) << meta_text.out;
  EXPECT_NE(meta_text.out.find("metadata only"), std::string::npos) << meta_text.out;
  EXPECT_EQ(meta_text.out.find("/s"), std::string::npos) << meta_text.out;

  // k000?0 and k001?0 minus k0010?: 10 + 10 - 1 files; a glob with / matches the whole path.
  RunResult some = Load(*c, {"/ds", "--include", "k000?0", "--include", "/ds/k001?0", "--exclude", "k00100", "--json"});
  ASSERT_EQ(some.code, 0) << some.out;
  auto s = Json(some);
  EXPECT_EQ(s["files_total"], 19);
  EXPECT_EQ(s["bytes_fetched"], 19 * kTenKSize);

  WriteFile(dir / "list", "# two files\n/ds/k09999\n\n  /ds/k00007  \n");
  RunResult listed = Load(*c, {"--from-file", dir / "list", "--json"});
  ASSERT_EQ(listed.code, 0) << listed.out;
  EXPECT_EQ(Json(listed)["files_total"], 2);
}

TEST_F(LoadTest, ResumesAfterTheMasterIsKilledMidLoad) {
  TempDir dir;
  auto c = Start(dir, "slow");
  // 8 MB at 1 MiB/s: the master dies well before the end.
  RunResult sub = Load(*c, {"/ds", "--bandwidth", "1Mi", "--background", "--json"});
  ASSERT_EQ(sub.code, 0) << sub.out;
  uint64_t id = Json(sub)["id"];
  ASSERT_TRUE(WaitFor([&] {
    auto j = Job(*c, id);
    return !j.is_null() && j["files_done"].get<uint64_t>() > 0;
  }, std::chrono::seconds(60))) << c->Logs();
  auto before = Job(*c, id);
  ASSERT_EQ(before["state"], "loading") << before.dump();
  ASSERT_LT(before["files_done"].get<uint64_t>(), uint64_t{kSlow});
  c->KillMaster();
  std::string why;
  ASSERT_TRUE(c->RestartMaster(&why)) << why;
  nlohmann::json j;
  ASSERT_TRUE(WaitFor([&] {
    j = Job(*c, id);
    return !j.is_null() && (j["state"] == "succeeded" || j["state"] == "failed");
  }, std::chrono::seconds(120))) << Job(*c, id).dump() << c->Logs();
  EXPECT_EQ(j["state"], "succeeded") << j.dump();
  EXPECT_GE(j["resumed"].get<int>(), 1);
  EXPECT_EQ(j["files_done"], kSlow);
  EXPECT_EQ(j["files_failed"], 0);
  EXPECT_EQ(UfsBytes(*c), uint64_t{kSlow} * kSlowSize) << "no block was fetched twice across the restart";
  nlohmann::json report;
  EXPECT_TRUE(WaitFor([&] {
    report = c->Report();
    return !report.is_null() && report["mounts"][0]["cached_bytes"] == uint64_t{kSlow} * kSlowSize;
  })) << report.dump(1);
  // The restarted master got no block list from the worker (registration carries its counters);
  // du asks the worker which blocks it holds, and agrees.
  RunResult du = c->Cli({"du", "/ds", "--json"});
  auto d = Json(du);
  ASSERT_FALSE(d.is_discarded()) << du.out;
  EXPECT_EQ(d["total"]["files"], kSlow);
  EXPECT_EQ(d["total"]["cached_bytes"], uint64_t{kSlow} * kSlowSize) << du.out;
  EXPECT_EQ(d["total"]["replica_bytes"], uint64_t{kSlow} * kSlowSize) << du.out;
}

TEST_F(LoadTest, CancelStopsARunningJob) {
  TempDir dir;
  auto c = Start(dir, "slow");
  RunResult sub = Load(*c, {"/ds", "--bandwidth", "512Ki", "--background", "--json"});
  ASSERT_EQ(sub.code, 0) << sub.out;
  uint64_t id = Json(sub)["id"];
  ASSERT_TRUE(WaitFor([&] {
    auto j = Job(*c, id);
    return !j.is_null() && j["state"] == "loading";
  }, std::chrono::seconds(60)));
  // A second load waits behind it, and says so (issue 54: "pending: 0 files" for 23 s, no word).
  Process second({Bin("granary"), "--master", c->master_address(), "load", "/ds"}, dir / "second.log");
  ASSERT_TRUE(WaitFor([&] { return second.Log().find("waiting for job " + std::to_string(id)) != std::string::npos; },
                      std::chrono::seconds(60)))
      << second.Log();
  EXPECT_EQ(second.Log().find("pending pending"), std::string::npos) << second.Log();
  RunResult listed = c->Cli({"jobs", "--json"});
  auto all = nlohmann::json::parse(listed.out, nullptr, false);
  ASSERT_TRUE(all.is_array()) << listed.out;
  ASSERT_FALSE(all.empty());
  EXPECT_EQ(all[0]["state"], "pending") << listed.out;
  EXPECT_EQ(all[0]["waiting_behind"], id) << listed.out;
  EXPECT_EQ(all[0]["jobs_ahead"], 1) << listed.out;
  RunResult cancel = Load(*c, {"--cancel", std::to_string(id)});
  EXPECT_EQ(cancel.code, 0) << cancel.out;
  // Once the first is cancelled the second runs to the end.
  EXPECT_EQ(second.Wait(std::chrono::seconds(120)), 0) << second.Log();
  EXPECT_NE(second.Log().find("succeeded"), std::string::npos) << second.Log();
  nlohmann::json j;
  ASSERT_TRUE(WaitFor([&] {
    j = Job(*c, id);
    return !j.is_null() && j["state"] == "cancelled";
  }, std::chrono::seconds(60))) << Job(*c, id).dump();
  EXPECT_LT(j["files_done"].get<uint64_t>(), uint64_t{kSlow});
  RunResult again = Load(*c, {"--cancel", std::to_string(id)});
  EXPECT_NE(again.code, 0);
  EXPECT_NE(again.out.find("already ended"), std::string::npos) << again.out;
  RunResult list = c->Cli({"jobs"});
  EXPECT_NE(list.out.find("cancelled"), std::string::npos) << list.out;
}

TEST_F(LoadTest, BadRequestsGetClearErrors) {
  TempDir dir;
  auto c = Start(dir, "ten");
  struct Case {
    std::vector<std::string> args;
    std::string says;
  } cases[] = {
      {{"/ds/nope"}, "/ds/nope does not exist"},
      {{"/ds", "--replicas", "2"}, "only 1 worker is alive"},
      {{"/ds", "--bandwidth", "fast"}, "--bandwidth fast"},
      {{"--from-file", dir / "missing.txt"}, "cannot open"},
      {{"--cancel", "999"}, "no load job 999"},
      {{}, "name a PATH"},
  };
  for (const auto& k : cases) {
    RunResult r = Load(*c, k.args);
    EXPECT_NE(r.code, 0) << r.out;
    EXPECT_NE(r.out.find(k.says), std::string::npos) << "expected '" << k.says << "' in: " << r.out;
    EXPECT_EQ(r.out.find("terminate"), std::string::npos) << r.out;
  }
  RunResult du = c->Cli({"du", "/nowhere"});
  EXPECT_NE(du.code, 0);
  RunResult list = c->Cli({"jobs"});
  EXPECT_EQ(list.code, 0) << list.out;
}

// The bar, in a pseudo-terminal made by script(1): drawn in place, ending full at 100%.
TEST_F(LoadTest, ProgressBarInATerminal) {
  TempDir dir;
  auto c = Start(dir, "slow");
  std::string cmd = Bin("granary") + " --master " + c->master_address() + " load /ds --bandwidth 4Mi";
  RunResult r = RunCommand({"script", "-qefc", cmd, "/dev/null"}, {{"TERM", "xterm"}}, std::chrono::seconds(300));
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("\r"), std::string::npos) << "redrawn in place";
  EXPECT_NE(r.out.find("[" + std::string(30, '#') + "] 100.0%"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find(std::to_string(kSlow) + "/" + std::to_string(kSlow) + " files"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("ETA"), std::string::npos);
  EXPECT_NE(r.out.find("succeeded"), std::string::npos) << r.out;
  // Not a terminal: plain lines, no escape codes.
  RunResult plain = Load(*c, {"/ds"});
  ASSERT_EQ(plain.code, 0) << plain.out;
  EXPECT_EQ(plain.out.find("\033["), std::string::npos) << plain.out;
  EXPECT_NE(plain.out.find("succeeded"), std::string::npos) << plain.out;
}

// /metrics of master, worker and FUSE pass promtool, carry the names dashboards use, and the
// probes answer; a FUSE client whose master is gone is not ready.
TEST_F(LoadTest, MetricsPassPromtoolAndProbesAnswer) {
  TempDir dir;
  auto c = Start(dir, "slow", /*fuse=*/true);
  ASSERT_EQ(Load(*c, {"/ds/s00001", "/ds/s00002"}).code, 0);
  EXPECT_EQ(ReadFile(c->mountpoint() + "/ds/s00003"), ManyBody("slow/s00003", kSlowSize));
  struct Expect {
    std::string daemon;
    std::vector<std::string> names;
  } expects[] = {
      {"master",
       {"granary_master_workers{state=\"alive\"} 1", "granary_load_jobs{state=\"succeeded\"} 1",
        "granary_load_files_total 2", "granary_mount_ufs_files{mount=\"/ds\"}", "granary_cluster_cache_capacity_bytes"}},
      {"worker",
       {"granary_worker_block_reads_total{source=\"under_storage\"} 3", "granary_worker_loaded_blocks_total 2",
        "granary_worker_cache_used_bytes{tier=", "granary_worker_ufs_fetch_duration_seconds_bucket{le=\"+Inf\"} 3",
        "granary_worker_read_duration_seconds_count", "granary_worker_evictions_total"}},
      {"fuse",
       {"granary_fuse_operation_duration_seconds_bucket{op=\"read\",le=", "granary_fuse_read_bytes_total ",
        "granary_fuse_opens_total{mode=\"", "granary_fuse_open_mode{mode=\"",
        "granary_fuse_operation_duration_seconds_count{op=\"lookup\"}", "granary_fuse_mounted 1"}},
  };
  for (const auto& e : expects) {
    std::string addr = c->MetricsAddress(e.daemon);
    ASSERT_FALSE(addr.empty()) << e.daemon;
    auto [code, body] = HttpGet(addr, "/metrics");
    ASSERT_EQ(code, 200) << e.daemon;
    for (const auto& n : e.names) EXPECT_NE(body.find(n), std::string::npos) << e.daemon << " lacks " << n << ":\n" << body;
    WriteFile(dir / (e.daemon + ".prom"), body);
    RunResult check = RunCommand({"sh", "-c", "promtool check metrics < " + (dir / (e.daemon + ".prom"))});
    EXPECT_EQ(check.code, 0) << e.daemon << ": " << check.out;
    EXPECT_EQ(HttpGet(addr, "/healthz").first, 200) << e.daemon;
    EXPECT_EQ(HttpGet(addr, "/readyz").first, 200) << e.daemon;
  }
  c->KillMaster();
  auto [code, body] = HttpGet(c->MetricsAddress("fuse"), "/readyz");
  EXPECT_EQ(code, 503) << body;
  EXPECT_NE(body.find("master"), std::string::npos) << body;
  EXPECT_EQ(HttpGet(c->MetricsAddress("fuse"), "/healthz").first, 200);
  std::string why;
  ASSERT_TRUE(c->RestartMaster(&why)) << why;
}

// The store throttles and drops connections while fetch-ahead runs: the workers back off and
// retry (within the mount's retry bounds), the fetch-ahead job ends with every file fetched, and a
// reader reading meanwhile gets every byte right and no error.
TEST_F(LoadTest, FetchAheadRidesOutSlowDownAndResets) {
  FaultProxy proxy(std::stoi(endpoint_.substr(endpoint_.rfind(':') + 1)));
  TempDir dir;
  // The cap keeps fetch-ahead running for a few seconds, so the faults find it mid-way.
  auto c = Start(dir, "ahead", /*fuse=*/true, "http://127.0.0.1:" + std::to_string(proxy.port()),
                 {"cache.fetch_ahead.bandwidth=1000000", "max_attempts=12", "retry_deadline=60s"});
  std::vector<std::string> names;
  for (const char* d : {"a", "b", "c", "d"}) {
    for (int i = 0; i < kAheadPerDir; ++i) {
      char key[16];
      snprintf(key, sizeof key, "k%05d", i);
      names.push_back(std::string(d) + "/" + key);
    }
  }
  std::shuffle(names.begin(), names.end(), std::mt19937(7));
  const std::string root = c->mountpoint() + "/ds/";
  auto read_checked = [&](const std::string& n) {
    std::string got;
    return ReadFileChecked(root + n, &got) && got == ManyBody("ahead/" + n, kAheadSize);
  };
  // An epoch begins: 30 files across the four directories are evidence enough.
  for (size_t i = 0; i < 30; ++i) ASSERT_TRUE(read_checked(names[i])) << names[i];
  ASSERT_TRUE(WaitFor([&] { return c->Metric("worker", "granary_worker_fetch_ahead_bytes_total") > 0; },
                      std::chrono::seconds(60)))
      << c->Logs();

  // A reader goes on through the faults.
  std::atomic<int> wrong{0};
  std::thread reader([&] {
    for (size_t i = 30; i < names.size(); ++i) wrong += !read_checked(names[i]);
  });
  const int conns = proxy.connections();
  proxy.SetMode(FaultProxy::kSlowDown);
  EXPECT_TRUE(WaitFor([&] { return proxy.slowdowns() >= 10; }, std::chrono::seconds(60)));
  proxy.SetMode(FaultProxy::kReset);
  EXPECT_TRUE(WaitFor([&] { return proxy.connections() >= conns + proxy.slowdowns() + 5; },
                      std::chrono::seconds(60)));
  proxy.SetMode(FaultProxy::kPass);
  reader.join();
  EXPECT_EQ(wrong, 0) << "a reader got an error or wrong bytes while the store threw faults";

  // Every fetch-ahead job ends, none with a failed file.
  std::vector<nlohmann::json> ended;
  ASSERT_TRUE(WaitFor([&] {
    auto j = Json(c->Cli({"jobs", "--json"}));
    if (j.is_discarded()) return false;
    ended.clear();
    for (const auto& x : j) {
      if (!x.value("fetch_ahead", false)) continue;
      const std::string st = x["state"];
      if (st != "succeeded" && st != "failed" && st != "cancelled") return false;
      ended.push_back(x);
    }
    return !ended.empty();
  }, std::chrono::seconds(120))) << c->Logs();
  for (const auto& job : ended) {
    EXPECT_NE(job["state"], "failed") << job.dump();
    EXPECT_EQ(job["files_failed"], 0) << job.dump();
  }
  EXPECT_TRUE(std::any_of(ended.begin(), ended.end(), [](const auto& j) { return j["state"] == "succeeded"; }));
  EXPECT_GT(c->Metric("worker", "granary_worker_ufs_retries_total"), 0) << "the faults never reached the worker";
  EXPECT_EQ(c->Metric("worker", "granary_worker_ufs_errors_total"), 0);
  // Everything is cached now: a second pass reads no byte from the store.
  const uint64_t ufs0 = UfsBytes(*c);
  for (const auto& n : names) EXPECT_TRUE(read_checked(n)) << n;
  EXPECT_EQ(UfsBytes(*c), ufs0);
}

}  // namespace
}  // namespace granary::testing
