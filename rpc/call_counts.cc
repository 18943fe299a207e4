#include "rpc/call_counts.h"

#include <cstring>
#include <vector>

#include <grpcpp/support/server_interceptor.h>

namespace granary::rpc {

namespace {

class CountingFactory : public grpc::experimental::ServerInterceptorFactoryInterface {
 public:
  explicit CountingFactory(CallCounts* counts) : counts_(counts) {}
  grpc::experimental::Interceptor* CreateServerInterceptor(grpc::experimental::ServerRpcInfo* info) override {
    if (info != nullptr && info->method() != nullptr) counts_->Count(info->method());
    return nullptr;  // nothing to run on the call's steps
  }

 private:
  CallCounts* counts_;
};

}  // namespace

void CallCounts::Attach(grpc::ServerBuilder* builder) {
  std::vector<std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>> f;
  f.push_back(std::make_unique<CountingFactory>(this));
  builder->experimental().SetInterceptorCreators(std::move(f));
}

void CallCounts::Count(const char* method) {
  MutexLock lock(&mu_);
  // Methods are registered ones (a fixed set); an unknown method's name may be a new pointer each
  // time: the table stops growing at a size no service reaches.
  auto it = by_method_.find(method);
  if (it != by_method_.end()) {
    ++it->second;
  } else if (by_method_.size() < 512) {
    by_method_.emplace(method, 1);
  }
}

std::map<std::string, uint64_t> CallCounts::Snapshot() {
  std::map<std::string, uint64_t> out;
  MutexLock lock(&mu_);
  for (const auto& [method, n] : by_method_) {
    const char* slash = std::strrchr(method, '/');
    out[slash != nullptr ? slash + 1 : method] += n;
  }
  return out;
}

}  // namespace granary::rpc
