// MasterConn: the master client every `granary` command but `local` and `config` uses. Errors
// reaching the master say how to point the CLI at it.
#pragma once

#include <memory>
#include <string>

#include "common/config.h"
#include "common/status.h"
#include "proto/granary.grpc.pb.h"
#include "rpc/rpc.h"

namespace granary::cli {

class MasterConn {
 public:
  static StatusOr<MasterConn> Open(const Config& cfg) {
    ASSIGN_OR_RETURN(auto sec, RpcSecurity::FromConfig(cfg.rpc));
    MasterConn c;
    c.cfg_ = cfg;
    c.sec_ = sec;
    c.stub_ = std::shared_ptr<rpc::Master::Stub>(rpc::Master::NewStub(sec->MakeChannel(cfg.master.address)));
    return c;
  }
  // Calls stub method `fn` with a prepared context.
  template <typename Req, typename Resp, typename Fn>
  Status Call(Fn fn, const Req& req, Resp* resp) {
    grpc::ClientContext ctx;
    sec_->Prepare(&ctx, cfg_.rpc.timeout);
    grpc::Status s = ((*stub_).*fn)(&ctx, req, resp);
    if (s.error_code() == grpc::StatusCode::UNAVAILABLE) {
      return UnavailableError("cannot reach the master at " + cfg_.master.address + ": " + s.error_message() +
                              " (is granary-master or `granary local` running? set --master or GRANARY_MASTER;"
                              " if the master uses TLS, set rpc.tls_ca in --config)");
    }
    return FromGrpc(s, "the master");
  }

 private:
  Config cfg_;
  std::shared_ptr<RpcSecurity> sec_;
  std::shared_ptr<rpc::Master::Stub> stub_;
};


}  // namespace granary::cli
