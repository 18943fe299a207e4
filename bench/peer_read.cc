// What a peer block read costs in CPU, per GB, against what the machine's loopback TCP costs for
// the same bytes (docs/benchmarks.md, "The peer path").
//
// One process serves a block-sized body and reads it back `--blocks` times on `--threads` threads:
//   grpc  Worker.ReadBlock through rpc/'s ReadBlockStream on a channel as MakeChannel makes it (the
//         server's ReadBlock swaps its buffer into one message, as worker/server.cc does);
//   tcp   the baseline: a plain loopback socket per thread, a 16-byte request, the body written from
//         a buffer and read into one (no framing beyond the request), as cheap as a transport gets.
// Prints one line per mode: seconds, GB/s, CPU-s per GB (the whole process: both ends), and the
// ratio of gRPC's CPU per GB to the baseline's. --grpc-arg NAME=INT adds a channel argument on both
// ends (to try gRPC's HTTP/2 settings).
#include <arpa/inet.h>
#include <grpcpp/grpcpp.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "proto/granary.grpc.pb.h"
#include "rpc/rpc.h"

namespace {

double CpuSeconds() {
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  auto s = [](const timeval& t) { return t.tv_sec + t.tv_usec / 1e6; };
  return s(ru.ru_utime) + s(ru.ru_stime);
}

class BodyWorker final : public granary::rpc::Worker::Service {
 public:
  explicit BodyWorker(size_t bytes) : bytes_(bytes) {}
  grpc::Status ReadBlock(grpc::ServerContext*, const granary::rpc::ReadBlockRequest*,
                         grpc::ServerWriter<granary::rpc::ReadBlockChunk>* writer) override {
    std::string data(bytes_, 'x');  // as the worker's: its buffer swapped into the one message
    granary::rpc::ReadBlockChunk c;
    c.mutable_data()->swap(data);
    c.set_cache_hit(true);
    writer->Write(c);
    return grpc::Status::OK;
  }

 private:
  size_t bytes_;
};

struct Result {
  double seconds = 0, cpu = 0, gb = 0;
};

void Print(const char* mode, const Result& r, double base_cpu_per_gb) {
  const double per_gb = r.cpu / r.gb;
  std::printf("%-5s %7.3f s  %6.2f GB/s  %6.2f CPU-s per GB", mode, r.seconds, r.gb / r.seconds, per_gb);
  if (base_cpu_per_gb > 0) std::printf("  %5.2fx the tcp baseline's CPU", per_gb / base_cpu_per_gb);
  std::printf("\n");
}

template <typename Fn>
Result Run(int threads, int blocks, size_t bytes, Fn per_thread) {
  std::atomic<int> next{0};
  const double c0 = CpuSeconds();
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<std::thread> ts;
  for (int t = 0; t < threads; ++t) ts.emplace_back([&] { per_thread(next, blocks); });
  for (auto& t : ts) t.join();
  Result r;
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  r.cpu = CpuSeconds() - c0;
  r.gb = double(blocks) * bytes / 1e9;
  return r;
}

Result RunGrpc(int threads, int blocks, size_t bytes, const std::vector<std::pair<std::string, int>>& extra) {
  BodyWorker service(bytes);
  grpc::ServerBuilder b;
  int port = 0;
  b.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
  b.SetMaxSendMessageSize(granary::kMaxMessageBytes);
  b.SetMaxReceiveMessageSize(granary::kMaxMessageBytes);
  for (const auto& [k, v] : extra) b.AddChannelArgument(k, v);
  b.RegisterService(&service);
  auto server = b.BuildAndStart();
  if (!server) {
    std::fprintf(stderr, "peer_read: no gRPC server\n");
    std::exit(1);
  }
  std::shared_ptr<grpc::Channel> channel;
  if (extra.empty()) {
    granary::RpcSecurity sec;  // no TLS, no token: as the rig's workers
    channel = sec.MakeChannel("127.0.0.1:" + std::to_string(port));
  } else {
    grpc::ChannelArguments args;
    args.SetMaxReceiveMessageSize(granary::kMaxMessageBytes);
    args.SetMaxSendMessageSize(granary::kMaxMessageBytes);
    for (const auto& [k, v] : extra) args.SetInt(k, v);
    channel = grpc::CreateCustomChannel("127.0.0.1:" + std::to_string(port), grpc::InsecureChannelCredentials(), args);
  }
  auto stub = granary::rpc::Worker::NewStub(channel);
  Result r = Run(threads, blocks, bytes, [&](std::atomic<int>& next, int n) {
    std::string out;
    while (next.fetch_add(1) < n) {
      out.clear();
      grpc::ClientContext ctx;
      auto st = granary::ReadBlockStream(*stub, ctx, granary::rpc::ReadBlockRequest(), bytes, &out, "bench");
      if (!st.ok()) {
        std::fprintf(stderr, "peer_read: %s\n", st.ToString().c_str());
        std::exit(1);
      }
    }
  });
  server->Shutdown();
  return r;
}

bool WriteAll(int fd, const char* p, size_t n) {
  while (n > 0) {
    ssize_t w = ::send(fd, p, n, MSG_NOSIGNAL);
    if (w <= 0) return false;
    p += w;
    n -= static_cast<size_t>(w);
  }
  return true;
}
bool ReadAll(int fd, char* p, size_t n) {
  while (n > 0) {
    ssize_t r = ::recv(fd, p, n, 0);
    if (r <= 0) return false;
    p += r;
    n -= static_cast<size_t>(r);
  }
  return true;
}

Result RunTcp(int threads, int blocks, size_t bytes) {
  int lfd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t al = sizeof a;
  if (lfd < 0 || ::bind(lfd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 || ::listen(lfd, 64) != 0 ||
      ::getsockname(lfd, reinterpret_cast<sockaddr*>(&a), &al) != 0) {
    std::perror("peer_read: listen");
    std::exit(1);
  }
  // One serving thread per connection: a 16-byte request in, the body out of one buffer.
  std::vector<std::thread> servers;
  std::vector<int> clients;
  for (int t = 0; t < threads; ++t) {
    int c = ::socket(AF_INET, SOCK_STREAM, 0);
    if (c < 0 || ::connect(c, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
      std::perror("peer_read: connect");
      std::exit(1);
    }
    clients.push_back(c);
    int s = ::accept(lfd, nullptr, nullptr);
    servers.emplace_back([s, bytes] {
      std::string body(bytes, 'x');
      char req[16];
      while (ReadAll(s, req, sizeof req) && WriteAll(s, body.data(), body.size())) {
      }
      ::close(s);
    });
  }
  std::atomic<int> conn{0};
  Result r = Run(threads, blocks, bytes, [&](std::atomic<int>& next, int n) {
    const int c = clients[conn.fetch_add(1)];
    std::string out(bytes, '\0');
    char req[16] = {};
    while (next.fetch_add(1) < n) {
      if (!WriteAll(c, req, sizeof req) || !ReadAll(c, out.data(), bytes)) {
        std::fprintf(stderr, "peer_read: tcp read failed\n");
        std::exit(1);
      }
    }
  });
  for (int c : clients) ::shutdown(c, SHUT_RDWR);
  for (auto& t : servers) t.join();
  for (int c : clients) ::close(c);
  ::close(lfd);
  return r;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"CPU per GB of a peer block read: gRPC against loopback TCP"};
  int blocks = 256, threads = 4;
  size_t block_mb = 4;
  std::vector<std::string> grpc_args;
  std::string modes = "tcp,grpc";
  app.add_option("--blocks", blocks, "blocks read per mode")->check(CLI::PositiveNumber);
  app.add_option("--threads", threads, "readers at once")->check(CLI::Range(1, 64));
  app.add_option("--block-mb", block_mb, "block size, MiB (a gRPC message takes at most 15)")->check(CLI::Range(1, 15));
  app.add_option("--modes", modes, "comma-separated: tcp, grpc");
  app.add_option("--grpc-arg", grpc_args, "NAME=INT channel argument on both gRPC ends");
  CLI11_PARSE(app, argc, argv);
  std::vector<std::pair<std::string, int>> extra;
  for (const auto& a : grpc_args) {
    auto eq = a.find('=');
    if (eq == std::string::npos) {
      std::fprintf(stderr, "peer_read: --grpc-arg wants NAME=INT, got '%s'\n", a.c_str());
      return 2;
    }
    extra.emplace_back(a.substr(0, eq), std::stoi(a.substr(eq + 1)));
  }
  const size_t bytes = block_mb << 20;
  double base = 0;
  if (modes.find("tcp") != std::string::npos) {
    Result r = RunTcp(threads, blocks, bytes);
    Print("tcp", r, 0);
    base = r.cpu / r.gb;
  }
  if (modes.find("grpc") != std::string::npos) Print("grpc", RunGrpc(threads, blocks, bytes, extra), base);
  return 0;
}
