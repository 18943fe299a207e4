// CurlHttpClient's body sink (ufs/http.h) against a real HTTP server on loopback (cpp-httplib): a
// 2xx body lands in the caller's buffer, what does not fit and every other status's body in
// HttpResponse::body, so an error's XML never lands in a block's bytes.
#include <gtest/gtest.h>
#include <httplib.h>

#include <algorithm>
#include <string>
#include <thread>

#include "tests/testutil/testutil.h"
#include "ufs/http.h"
#include "ufs/ufs.h"

namespace granary {
namespace {

class HttpSinkTest : public ::testing::Test {
 protected:
  void SetUp() override {
    body_ = std::string(300'000, 'b');
    for (size_t i = 0; i < body_.size(); ++i) body_[i] = static_cast<char>('a' + i % 26);
    server_.Get("/ok", [&](const httplib::Request&, httplib::Response& res) { res.set_content(body_, "application/octet-stream"); });
    // A range of the body from byte `first` (query), announced as starting at byte `says`.
    server_.Get("/range", [&](const httplib::Request& req, httplib::Response& res) {
      size_t first = std::stoul(req.get_param_value("first")), says = std::stoul(req.get_param_value("says"));
      res.status = 206;
      res.set_header("Content-Range", "bytes " + std::to_string(says) + "-" + std::to_string(says + body_.size() - first - 1) +
                                          "/" + std::to_string(body_.size()));
      res.set_content(body_.substr(first), "application/octet-stream");
    });
    server_.Get("/missing", [&](const httplib::Request&, httplib::Response& res) {
      res.status = 404;
      res.set_content("<Error><Code>NoSuchKey</Code></Error>", "application/xml");
    });
    port_ = server_.bind_to_any_port("127.0.0.1");
    ASSERT_GT(port_, 0);
    thread_ = std::thread([&] { server_.listen_after_bind(); });
    ASSERT_TRUE(testing::WaitFor([&] { return server_.is_running(); }));
  }
  void TearDown() override {
    server_.stop();
    thread_.join();
  }
  std::string Url(const std::string& path) { return "http://127.0.0.1:" + std::to_string(port_) + path; }

  httplib::Server server_;
  std::thread thread_;
  int port_ = 0;
  std::string body_;
};

TEST_F(HttpSinkTest, A2xxBodyGoesIntoTheSink) {
  CurlHttpClient http;
  std::string buf(body_.size(), '\0');
  auto r = http.Send(HttpRequest{"GET", Url("/ok"), {}, buf.data(), buf.size()});
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ(r->status, 200);
  EXPECT_EQ(r->sunk, body_.size());
  EXPECT_TRUE(r->body.empty());
  EXPECT_EQ(buf, body_);
}

// Streaming (ufs/ufs.h, ReadProgress): the sink's front is reported as it fills when the response
// is the range asked for, and never when it starts elsewhere; bytes below what an earlier attempt
// landed are not written again.
TEST_F(HttpSinkTest, TheSinksFrontIsReportedOnlyForTheRangeAskedFor) {
  CurlHttpClient http;
  std::string buf(body_.size() - 1000, '\0');
  ReadProgress asked;
  HttpRequest req{"GET", Url("/range?first=1000&says=1000"), {}, buf.data(), buf.size(), &asked, 1000};
  auto r = http.Send(req);
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ(r->status, 206);
  EXPECT_EQ(asked.landed(), buf.size());
  EXPECT_EQ(buf, body_.substr(1000));

  ReadProgress elsewhere;  // a range that starts at another byte than asked: nothing landed
  std::string other(buf.size(), '\0');
  req = HttpRequest{"GET", Url("/range?first=1000&says=2000"), {}, other.data(), other.size(), &elsewhere, 1000};
  r = http.Send(req);
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ(elsewhere.landed(), 0u);
  EXPECT_EQ(r->sunk, other.size());

  ReadProgress whole;  // a 200 counts only for a range from byte 0
  std::string all(body_.size(), '\0');
  r = http.Send(HttpRequest{"GET", Url("/ok"), {}, all.data(), all.size(), &whole, 0});
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(whole.landed(), body_.size());
  ReadProgress not_from_zero;
  r = http.Send(HttpRequest{"GET", Url("/ok"), {}, all.data(), all.size(), &not_from_zero, 5});
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(not_from_zero.landed(), 0u);

  // A retry: what landed before stays as it is (here marked, to see that it is not written again).
  ReadProgress retried;
  retried.Landed(4096);
  std::string again(body_.size(), 'x');
  r = http.Send(HttpRequest{"GET", Url("/ok"), {}, again.data(), again.size(), &retried, 0});
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(again.substr(0, 4096), std::string(4096, 'x'));
  EXPECT_EQ(again.substr(4096), body_.substr(4096));
  EXPECT_EQ(retried.landed(), body_.size());
}

TEST_F(HttpSinkTest, WhatDoesNotFitGoesToTheBody) {
  CurlHttpClient http;
  std::string buf(1000, '\0');
  auto r = http.Send(HttpRequest{"GET", Url("/ok"), {}, buf.data(), buf.size()});
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ(r->sunk, 1000u);
  EXPECT_EQ(r->BodySize(), body_.size());
  EXPECT_EQ(buf + r->body, body_);
}

TEST_F(HttpSinkTest, AnErrorsBodyNeverEntersTheSink) {
  CurlHttpClient http;
  std::string buf(64, 'x');
  auto r = http.Send(HttpRequest{"GET", Url("/missing"), {}, buf.data(), buf.size()});
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ(r->status, 404);
  EXPECT_EQ(r->sunk, 0u);
  EXPECT_NE(r->body.find("NoSuchKey"), std::string::npos);
  EXPECT_EQ(buf, std::string(64, 'x'));
}

TEST_F(HttpSinkTest, WithoutASinkTheBodyIsAString) {
  CurlHttpClient http;
  auto r = http.Send(HttpRequest{"GET", Url("/ok"), {}});
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ(r->sunk, 0u);
  EXPECT_EQ(r->body, body_);
}

// The receive buffer every connection gets (CurlOptions::receive_buffer), as the kernel reports the
// client's socket to the test's server: twice what was asked (the kernel's bookkeeping), capped at
// net.core.rmem_max.
TEST_F(HttpSinkTest, EveryConnectionGetsTheReceiveBufferAskedFor) {
  CurlOptions opts;
  opts.receive_buffer = 1 << 20;
  CurlHttpClient http(opts);
  auto r = http.Send(HttpRequest{"GET", Url("/ok"), {}});
  ASSERT_TRUE(r.ok()) << r.status().message();
  // The connection stays open for the next request: its socket's memory, from ss.
  testing::RunResult ss = testing::RunCommand({"ss", "-tmnH", "dst", "127.0.0.1:" + std::to_string(port_)});
  ASSERT_EQ(ss.code, 0) << ss.out;
  size_t at = ss.out.find(",rb");
  ASSERT_NE(at, std::string::npos) << ss.out;
  const long rb = std::stol(ss.out.substr(at + 3));
  const long rmem_max = std::stol(testing::ReadFile("/proc/sys/net/core/rmem_max"));
  EXPECT_EQ(rb, 2 * std::min<long>(opts.receive_buffer, rmem_max)) << ss.out;
}

}  // namespace
}  // namespace granary
