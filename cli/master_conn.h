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
    c.holder_ = std::make_shared<StubHolder<rpc::Master>>(sec, cfg.master.address);
    return c;
  }
  // Calls stub method `fn` with a prepared context. With several masters (standbys) the call
  // follows the leader and waits out an election, for up to rpc.master_wait; with one address, a
  // standby's answer still leads to the leader it names, and a master that does not answer is said
  // within kSingleMasterWait: long enough for a loaded master's first HTTP/2 handshake (a second
  // was not, under ThreadSanitizer's slowdown: "timed out before receiving SETTINGS frame"), short
  // enough that a master that is not running is said at once to a person at a terminal.
  static constexpr std::chrono::milliseconds kSingleMasterWait{5000};
  template <typename Req, typename Resp, typename Fn>
  Status Call(Fn fn, const Req& req, Resp* resp) {
    auto wait = holder_->address_count() > 1 ? cfg_.rpc.master_wait : kSingleMasterWait;
    grpc::Status s = CallWithFailover(*holder_, *sec_, cfg_.rpc.timeout, wait,
                                      [&](rpc::Master::Stub& stub, grpc::ClientContext& ctx) {
                                        return (stub.*fn)(&ctx, req, resp);
                                      });
    if (s.error_code() == grpc::StatusCode::UNAVAILABLE) {
      return UnavailableError("cannot reach the master at " + cfg_.master.address + ": " + s.error_message() +
                              " (is granary-master or `granary local` running? set --master or GRANARY_MASTER;"
                              " if the master uses TLS, set rpc.tls_ca in --config)");
    }
    return FromGrpc(s, "the master");
  }
  // The master addresses this CLI was given (--master, master.address).
  std::vector<std::string> addresses() const { return SplitAddressList(cfg_.master.address); }
  // One master's own word on its role, asked of it alone (no following, no waiting out an election).
  StatusOr<rpc::MasterRole> RoleOf(const std::string& address, std::chrono::milliseconds timeout) const {
    auto stub = rpc::Master::NewStub(sec_->MakeChannel(address));
    grpc::ClientContext ctx;
    sec_->Prepare(&ctx, timeout);
    rpc::MasterRole r;
    grpc::Status s = stub->GetRole(&ctx, rpc::GetRoleRequest(), &r);
    if (!s.ok()) return FromGrpc(s, "the master at " + address);
    return r;
  }

 private:
  Config cfg_;
  std::shared_ptr<RpcSecurity> sec_;
  std::shared_ptr<StubHolder<rpc::Master>> holder_;
};


}  // namespace granary::cli
