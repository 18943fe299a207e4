#include "master/replication.h"

#include <spdlog/spdlog.h>

#include <openssl/crypto.h>
#include <openssl/rand.h>

#include <cctype>
#include <cstdlib>

#include <atomic>
#include <optional>
#include <vector>

#include "common/keys.h"

namespace granary::master {
namespace {

constexpr size_t kBatchBytes = 1 << 20;                     // entries or snapshot bytes per message
constexpr auto kIdleBeat = std::chrono::milliseconds(250);  // an empty batch when nothing is new
constexpr auto kRetry = std::chrono::milliseconds(200);     // between streams
constexpr auto kHeardRecently = std::chrono::seconds(3);    // a standby serves reads while in touch

rpc::JournalPosition ToProto(const LogPosition& p) {
  rpc::JournalPosition out;
  out.set_term(p.term);
  out.set_index(p.index);
  return out;
}
LogPosition FromProto(const rpc::JournalPosition& p) { return {p.term(), p.index()}; }

constexpr size_t kNonceBytes = 32;
constexpr size_t kMaxIdBytes = 256;

std::string ProofMessage(const std::string& id, const std::string& nonce) {
  std::string m = "granary-master-proof";
  m.push_back('\0');
  m += id;
  m.push_back('\0');
  m += nonce;
  return m;
}

// A standby's id: the host:port it stands for, nothing else (it goes into logs and GetRole).
bool ValidId(const std::string& id) {
  if (id.empty() || id.size() > kMaxIdBytes) return false;
  for (char c : id) {
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == ':' || c == '-' || c == '_' || c == '[' ||
          c == ']')) {
      return false;
    }
  }
  return true;
}

}  // namespace

grpc::Status ProveMaster(const RpcSecurity& sec, const std::string& self, const rpc::MasterChallenge& req,
                         rpc::MasterProof* resp) {
  if (req.nonce().size() != kNonceBytes) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "the challenge must be 32 bytes");
  }
  if (!sec.has_token()) return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION, "no rpc.token_file: nothing to prove");
  resp->set_id(self);
  resp->set_mac(sec.Mac(ProofMessage(self, req.nonce())));
  return grpc::Status::OK;
}

Status VerifyMaster(const RpcSecurity& sec, rpc::Master::StubInterface* stub, const std::string& address) {
  if (!sec.has_token()) return Status::OK();
  rpc::MasterChallenge c;
  std::string nonce(kNonceBytes, '\0');
  if (RAND_bytes(reinterpret_cast<unsigned char*>(nonce.data()), static_cast<int>(nonce.size())) != 1) {
    return InternalError("no random bytes for the leader's challenge");
  }
  c.set_nonce(nonce);
  rpc::MasterProof p;
  grpc::ClientContext ctx;  // no token: the other side proves, this one gives nothing away
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  grpc::Status st = stub->ProveMaster(&ctx, c, &p);
  if (!st.ok()) {
    if (ServerUnreachable(st)) return FromGrpc(st, "the leader at " + address);
    return PermissionDeniedError("the process at " + address + " (named leader in etcd) did not prove it is a master "
                                 "of this cluster (" + st.error_message().substr(0, 200) +
                                 "): not following it and not sending it the token; a forged leader record in etcd?");
  }
  const std::string want = sec.Mac(ProofMessage(address, nonce));
  if (p.id() != address || p.mac().size() != want.size() ||
      CRYPTO_memcmp(p.mac().data(), want.data(), want.size()) != 0) {
    return PermissionDeniedError("the process at " + address + " (named leader in etcd) failed the proof that it holds "
                                 "this cluster's token for that address: not following it and not sending it the "
                                 "token; a forged leader record in etcd?");
  }
  return Status::OK();
}

grpc::Status ServeStandby(Namespace* ns, uint64_t term, const std::function<bool()>& leading, grpc::ServerContext* ctx,
                          grpc::ServerReaderWriter<rpc::ReplicaBatch, rpc::ReplicaAck>* stream) {
  rpc::ReplicaAck hello;
  if (!stream->Read(&hello)) return grpc::Status(grpc::StatusCode::CANCELLED, "the standby went before saying where it stands");
  if (!ValidId(hello.id())) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                        "a standby's id is its host:port (at most 256 characters of letters, digits, . : - _ [ ])");
  }
  const std::string id = hello.id();
  Journal& journal = ns->journal();
  LogPosition at = FromProto(hello.applied());
  // The last position this stream has sent (or the standby's own to begin with): an
  // acknowledgement beyond it is a lie that would count the standby in step.
  std::atomic<uint64_t> sent{at.index};
  std::atomic<bool> lied{false};
  std::thread acks([&] {
    rpc::ReplicaAck a;
    while (stream->Read(&a)) {
      if (a.applied().index() > sent.load()) {
        lied = true;
        ctx->TryCancel();
        break;
      }
      journal.Acked(id, a.applied().index());
    }
  });
  spdlog::info("standby master {} follows this leader from entry {} (this leader at {})", id, at.ToString(),
               journal.position().ToString());
  // The leader's position as of what the batch carries (its last entry, or the journal's now when
  // it carries none): a standby that applied a batch is in step with the leader as of that batch.
  auto stamp = [&](rpc::ReplicaBatch* b, const LogPosition* last = nullptr) {
    b->set_leader_term(term);
    *b->mutable_leader_position() = ToProto(last ? *last : journal.position());
  };
  // A snapshot's position, held (Journal::Hold) from the snapshot until the standby has caught up
  // with the entries after it: they must not be trimmed meanwhile, however many come.
  std::optional<uint64_t> held;
  auto release = [&] {
    if (held) journal.Unhold(*held);
    held.reset();
  };
  grpc::Status result = grpc::Status::OK;
  while (!ctx->IsCancelled()) {
    if (!leading()) {
      result = grpc::Status(grpc::StatusCode::UNAVAILABLE, "this master no longer leads", kLeaderHint);
      break;
    }
    std::vector<JournalEntry> entries;
    FollowerNeeds need = journal.Read(at, kBatchBytes, &entries);
    if (need == FollowerNeeds::kSnapshot) {
      spdlog::info("sending standby master {} a snapshot: it stands at {}, which this leader (at {}) cannot vouch for",
                   id, at.ToString(), journal.position().ToString());
      rpc::ReplicaBatch begin;
      begin.set_snapshot_begin(true);
      stamp(&begin);
      if (!stream->Write(begin)) break;
      release();
      LogPosition snap;
      Status st = journal.Snapshot(
          kBatchBytes,
          [&](const std::vector<std::string>& keys, const std::vector<std::string>& values) -> Status {
            rpc::ReplicaBatch page;
            for (size_t i = 0; i < keys.size(); ++i) {
              page.add_keys(keys[i]);
              page.add_values(values[i]);
            }
            stamp(&page);
            return stream->Write(page) ? Status::OK() : UnavailableError("the standby went");
          },
          &snap);
      held = snap.index;
      if (!st.ok()) {
        spdlog::warn("snapshot for standby master {}: {}", id, st.message());
        break;
      }
      rpc::ReplicaBatch end;
      end.set_snapshot_end(true);
      stamp(&end, &snap);
      sent = std::max(sent.load(), snap.index);
      if (!stream->Write(end)) break;
      at = snap;
      continue;
    }
    if (need == FollowerNeeds::kNothing) release();  // caught up
    rpc::ReplicaBatch b;
    if (need == FollowerNeeds::kEntries) {
      for (auto& e : entries) {
        auto* out = b.add_entries();
        *out->mutable_pos() = ToProto(e.pos);
        out->set_data(std::move(e.data));
      }
      at = entries.back().pos;
      stamp(&b, &at);
      sent = std::max(sent.load(), at.index);
    } else if (journal.WaitBeyond(at.index, kIdleBeat)) {
      continue;  // new entries: read them
    } else {
      stamp(&b);
    }
    if (!stream->Write(b)) break;
  }
  release();
  ctx->TryCancel();  // ends the acknowledgements' Read
  acks.join();
  journal.Forget(id);
  if (lied) {
    spdlog::warn("standby master {} acknowledged entries this leader never sent it: its stream was ended", id);
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "an acknowledgement beyond what was sent");
  }
  spdlog::info("standby master {} stopped following this leader", id);
  return result;
}

Follower::Follower(Namespace* ns, std::shared_ptr<RpcSecurity> sec, std::string self,
                   std::function<std::string()> leader)
    : ns_(ns), sec_(std::move(sec)), self_(std::move(self)), leader_(std::move(leader)) {}

Follower::~Follower() { Stop(); }

uint64_t Follower::term() const {
  MutexLock lock(&mu_);
  return max_term_;
}

void Follower::Start() {
  MutexLock lock(&mu_);
  stop_ = false;
  if (!thread_.joinable()) thread_ = std::thread([this] { Run(); });
}

void Follower::Stop() {
  {
    MutexLock lock(&mu_);
    stop_ = true;
    if (ctx_) ctx_->TryCancel();
    wake_.notify_all();
  }
  if (thread_.joinable()) thread_.join();
  thread_ = std::thread();
}

uint64_t Follower::lag() const {
  uint64_t mine = ns_->journal().position().index;
  MutexLock lock(&mu_);
  return leader_index_ > mine ? leader_index_ - mine : 0;
}

bool Follower::ServingReads() const {
  if (ns_->journal().position().index == 0 || !ns_->journal().Whole()) return false;
  MutexLock lock(&mu_);
  return !installing_ && std::chrono::steady_clock::now() - heard_ < kHeardRecently;
}

bool Follower::HeardALeader() const {
  MutexLock lock(&mu_);
  return heard_ != std::chrono::steady_clock::time_point{};
}

bool Follower::Whole() const {
  if (ns_->journal().position().index == 0 || !ns_->journal().Whole()) return false;
  MutexLock lock(&mu_);
  return !installing_;
}

uint64_t Follower::CopyGeneration() const {
  MutexLock lock(&mu_);
  return generation_;
}

void Follower::Run() {
  std::string following;
  for (;;) {
    std::string leader = leader_();
    {
      MutexLock lock(&mu_);
      if (stop_) return;
    }
    if (!leader.empty() && leader != self_) {
      if (leader != following) spdlog::info("this standby master follows the leader at {}", leader);
      following = leader;
      Status st = FollowOnce(leader);
      if (!st.ok()) spdlog::debug("following the leader at {}: {}", leader, st.message());
    }
    MutexLock lock(&mu_);
    if (stop_) return;
    lock.WaitFor(&wake_, kRetry);
  }
}

Status Follower::FollowOnce(const std::string& leader) {
  auto stub = rpc::Master::NewStub(sec_->MakeChannel(leader));
  // The token goes only to a master that proved it holds it, for the address dialled.
  Status proof = VerifyMaster(*sec_, stub.get(), leader);
  if (!proof.ok()) {
    bool first = false;
    {
      MutexLock lock(&mu_);
      first = refused_ != leader;
      refused_ = leader;
    }
    if (first && proof.code() == Code::kPermissionDenied) spdlog::error("{}", proof.message());
    return proof;
  }
  {
    MutexLock lock(&mu_);
    refused_.clear();
  }
  grpc::ClientContext ctx;
  sec_->Prepare(&ctx, std::chrono::milliseconds(0));
  {
    MutexLock lock(&mu_);
    if (stop_) return Status::OK();
    ctx_ = &ctx;
  }
  auto stream = stub->Replicate(&ctx);
  Journal& journal = ns_->journal();
  rpc::ReplicaAck ack;
  ack.set_id(self_);
  *ack.mutable_applied() = ToProto(journal.position());
  Status st = Status::OK();
  if (stream->Write(ack)) {
    rpc::ReplicaBatch b;
    while (st.ok() && stream->Read(&b)) {
      {
        MutexLock lock(&mu_);
        if (b.leader_term() < max_term_) {
          st = FailedPreconditionError("a stream from a deposed leader (term " + std::to_string(b.leader_term()) +
                                       ", seen " + std::to_string(max_term_) + ")");
          break;
        }
        max_term_ = b.leader_term();
        heard_ = std::chrono::steady_clock::now();
        leader_index_ = b.leader_position().index();
        if (b.snapshot_begin()) {
          installing_ = true;
          ++generation_;  // reads made while it changes are answered "not the leader" (master/server.cc)
        }
      }
      if (b.snapshot_begin()) {
        spdlog::info("this standby master copies a snapshot of the leader's namespace");
        st = journal.InstallBegin();
      }
      if (st.ok() && b.keys_size() > 0) {
        st = journal.InstallPage({b.keys().begin(), b.keys().end()}, {b.values().begin(), b.values().end()});
      }
      if (st.ok() && b.snapshot_end()) {
        st = ns_->InstallSnapshotEnd();
        if (st.ok()) {
          spdlog::info("this standby master holds the leader's namespace as of entry {}", journal.position().ToString());
          MutexLock lock(&mu_);
          installing_ = false;
        }
      }
      for (const auto& e : b.entries()) {
        if (!st.ok()) break;
        st = ns_->ApplyEntry({FromProto(e.pos()), e.data()});
      }
      if (!st.ok()) break;
      if (b.snapshot_begin() || b.keys_size() > 0) continue;  // acknowledged once whole
      // Fault injection for benches only (bench/cluster_sim.sh --ack-delay-ms): a standby slow to
      // acknowledge, as one on a loaded or distant node is.
      static const long ack_delay_ms = [] {
        const char* d = std::getenv("GRANARY_FAULT_STANDBY_ACK_DELAY_MS");
        return d != nullptr ? std::strtol(d, nullptr, 10) : 0L;
      }();
      if (ack_delay_ms > 0 && !b.entries().empty()) std::this_thread::sleep_for(std::chrono::milliseconds(ack_delay_ms));
      *ack.mutable_applied() = ToProto(journal.position());
      if (!stream->Write(ack)) break;
    }
  }
  ctx.TryCancel();
  grpc::Status end = stream->Finish();
  {
    MutexLock lock(&mu_);
    ctx_ = nullptr;
  }
  if (!st.ok()) {
    spdlog::warn("following the leader at {}: {}", leader, st.message());
    return st;
  }
  if (!end.ok() && end.error_code() != grpc::StatusCode::CANCELLED) return FromGrpc(end, "the leader at " + leader);
  return Status::OK();
}

}  // namespace granary::master
