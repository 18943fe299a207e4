#include "rpc/call_counts.h"

#include <cstring>
#include <vector>

#include <google/protobuf/descriptor.h>
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

void CallCounts::Attach(grpc::ServerBuilder* builder, const std::string& service) {
  {
    MutexLock lock(&mu_);
    const auto* d = google::protobuf::DescriptorPool::generated_pool()->FindServiceByName(service);
    for (int i = 0; d != nullptr && i < d->method_count(); ++i) known_.insert("/" + service + "/" + d->method(i)->name());
  }
  std::vector<std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>> f;
  f.push_back(std::make_unique<CountingFactory>(this));
  builder->experimental().SetInterceptorCreators(std::move(f));
}

void CallCounts::Count(const char* method) {
  MutexLock lock(&mu_);
  auto it = by_method_.find(method);
  if (it != by_method_.end()) {
    ++it->second;
  } else if (known_.count(method) != 0 && by_method_.size() < 4 * known_.size()) {
    by_method_.emplace(method, 1);  // a registered method: its name keeps this pointer
  } else {
    ++other_;  // a name no service has (its pointer is the call's own)
  }
}

std::map<std::string, uint64_t> CallCounts::Snapshot() {
  std::map<std::string, uint64_t> out;
  MutexLock lock(&mu_);
  for (const auto& [method, n] : by_method_) {
    const char* slash = std::strrchr(method, '/');
    out[slash != nullptr ? slash + 1 : method] += n;
  }
  if (other_ > 0) out["other"] += other_;
  return out;
}

}  // namespace granary::rpc
