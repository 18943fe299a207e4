// Etcd: what the masters' leader election needs of a consensus store, and a client for etcd v3.
//
// Design note. Granary runs no consensus protocol of its own (issue 32): the masters elect their
// leader through etcd. They need these things of it, the `Coordinator` interface: a lease with a TTL
// (Grant), kept alive (KeepAlive) or given up (Revoke); a key created only if it does not exist,
// bound to a lease, in one transaction (CreateIfAbsent: the election); a read of a key (Get: who
// leads); and, for choosing among candidates, a plain write (Put) and a read of every key under a
// prefix (List) with each key's mod_revision (master/election.h, "Which master"). Tests drive the election through a fake Coordinator on a fake clock
// (tests/master/election_test.cc); `EtcdClient` is the real one.
//
// EtcdClient speaks etcd's JSON gateway (/v3/kv/txn, /v3/kv/range, /v3/lease/grant,
// /v3/lease/keepalive, /v3/lease/revoke; keys and values base64, 64-bit integers as strings) over
// HTTPS with libcurl (ufs/http.h's client): no gRPC stubs of etcd's protos to vendor, the same wire
// etcdctl's --debug shows. TLS with a client certificate is the default (etcd's --client-cert-auth:
// only a holder of the masters' certificate may name a leader); plain HTTP only when the operator
// says so (master.etcd_allow_plaintext), since whoever can write to etcd decides who leads. Each call starts at the endpoint that last answered and tries the others in turn,
// so a member down costs one timeout once, not on every call. Errors: UNAVAILABLE when no endpoint
// answered (retry later), INTERNAL for an answer that is not what etcd sends (named in the message).
// Thread-safe (each call opens its own connection).
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/status.h"

namespace granary {
class HttpClient;
}

namespace granary::master {

// How the masters reach etcd: PEM files (master.etcd_tls_ca, _cert, _key) and whether plain
// http:// endpoints are accepted at all (master.etcd_allow_plaintext).
struct EtcdTls {
  std::string ca;    // roots that verify etcd's certificate (empty: the system's)
  std::string cert;  // the masters' client certificate, for etcd's --client-cert-auth
  std::string key;   // its private key
  bool allow_plaintext = false;
};

// A key as etcd holds it. create_revision orders the key's creations cluster-wide: a leader key
// created later has a larger one, so it numbers the leadership terms.
// mod_revision is the revision of the key's last write: every Put of it, even of the same value,
// gives a larger one.
struct EtcdKv {
  std::string key, value;
  int64_t create_revision = 0;
  int64_t lease = 0;
  int64_t mod_revision = 0;
};

class Coordinator {
 public:
  virtual ~Coordinator() = default;
  // A new lease that expires `ttl` after it was granted or last kept alive.
  virtual StatusOr<int64_t> Grant(std::chrono::seconds ttl) = 0;
  // Keeps `lease` alive; its TTL left, in seconds. NOT_FOUND when it has expired (or was revoked).
  virtual StatusOr<int64_t> KeepAlive(int64_t lease) = 0;
  // Ends `lease` now; its keys go with it.
  virtual Status Revoke(int64_t lease) = 0;
  // In one transaction: puts key = value bound to `lease` if the key does not exist. Returns the
  // key as it is afterwards: ours (its value is `value` and its lease `lease`) or the holder's.
  virtual StatusOr<EtcdKv> CreateIfAbsent(const std::string& key, const std::string& value, int64_t lease) = 0;
  // The key, or nullopt when it does not exist.
  virtual StatusOr<std::optional<EtcdKv>> Get(const std::string& key) = 0;
  // Puts key = value (no lease: it stays until overwritten).
  virtual Status Put(const std::string& key, const std::string& value) = 0;
  // Removes every key that starts with `prefix` (OK when there is none).
  virtual Status DeletePrefix(const std::string& prefix) = 0;
  // In one transaction: removes `key` if it was last changed at `mod_revision` (OK either way: a
  // key changed since is left alone).
  virtual Status DeleteIfUnchanged(const std::string& key, int64_t mod_revision) = 0;
  // Every key that starts with `prefix`, in key order.
  virtual StatusOr<std::vector<EtcdKv>> List(const std::string& prefix) = 0;
};

class EtcdClient : public Coordinator {
 public:
  // `endpoints`: "https://host:port" each ("http://" only with tls.allow_plaintext; otherwise
  // INVALID_ARGUMENT saying how to set TLS up). `timeout` bounds each request to one endpoint.
  static StatusOr<std::unique_ptr<EtcdClient>> Create(const std::vector<std::string>& endpoints,
                                                      std::chrono::milliseconds timeout, const EtcdTls& tls);
  ~EtcdClient() override;

  StatusOr<int64_t> Grant(std::chrono::seconds ttl) override;
  StatusOr<int64_t> KeepAlive(int64_t lease) override;
  Status Revoke(int64_t lease) override;
  StatusOr<EtcdKv> CreateIfAbsent(const std::string& key, const std::string& value, int64_t lease) override;
  StatusOr<std::optional<EtcdKv>> Get(const std::string& key) override;
  Status Put(const std::string& key, const std::string& value) override;
  Status DeletePrefix(const std::string& prefix) override;
  Status DeleteIfUnchanged(const std::string& key, int64_t mod_revision) override;
  // Puts key = value bound to `lease` (0: none), whoever holds the key (tests: a forged record).
  Status PutLeased(const std::string& key, const std::string& value, int64_t lease);
  StatusOr<std::vector<EtcdKv>> List(const std::string& prefix) override;

 private:
  EtcdClient(std::vector<std::string> endpoints, std::unique_ptr<HttpClient> http);
  // POSTs `body` (JSON) to `path` of the first endpoint that answers; the answer's body.
  StatusOr<std::string> Post(const std::string& path, const std::string& body);

  const std::vector<std::string> endpoints_;  // "https://host:port", no trailing slash
  const std::unique_ptr<HttpClient> http_;
  std::atomic<size_t> preferred_{0};  // the endpoint that answered last
};

// Base64 as etcd's gateway writes keys and values (standard alphabet, padded).
std::string Base64Encode(const std::string& in);
StatusOr<std::string> Base64Decode(const std::string& in);

}  // namespace granary::master
