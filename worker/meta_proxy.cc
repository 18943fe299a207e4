#include "worker/meta_proxy.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

namespace granary::worker {
namespace {

constexpr uint64_t kRootIno = 1;  // master/namespace.h
constexpr size_t kMacBytes = 16;  // of HMAC-SHA256's 32

void PutU64(std::string* s, uint64_t v) {
  for (int i = 0; i < 8; ++i) s->push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}
void PutStr(std::string* s, const std::string& v) {
  PutU64(s, v.size());
  s->append(v);
}

}  // namespace

LocalPeer LocalPeer::Of(int conn) {
  LocalPeer p;
  ucred cred{};
  socklen_t len = sizeof(cred);
  if (getsockopt(conn, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0) {
    p.uid = p.gid = static_cast<uint32_t>(-1);  // unknown: trusted with nothing
    return p;
  }
  p.uid = cred.uid;
  p.gid = cred.gid;
  p.trusted = cred.uid == 0 || cred.uid == geteuid();
  if (!p.trusted) {
    std::vector<gid_t> groups(64);
    socklen_t glen = static_cast<socklen_t>(groups.size() * sizeof(gid_t));
    if (getsockopt(conn, SOL_SOCKET, SO_PEERGROUPS, groups.data(), &glen) != 0 && errno == ERANGE) {
      groups.resize(glen / sizeof(gid_t) + 1);  // glen is the size needed
      glen = static_cast<socklen_t>(groups.size() * sizeof(gid_t));
      if (getsockopt(conn, SOL_SOCKET, SO_PEERGROUPS, groups.data(), &glen) != 0) glen = 0;
    }
    groups.resize(glen / sizeof(gid_t));
    p.groups.assign(groups.begin(), groups.end());
    std::sort(p.groups.begin(), p.groups.end());
    p.groups.erase(std::unique(p.groups.begin(), p.groups.end()), p.groups.end());
  }
  return p;
}

MetaProxy::MetaProxy(const Config& cfg, std::shared_ptr<RpcSecurity> sec)
    : cfg_(cfg),
      sec_(std::move(sec)),
      master_(sec_, cfg_.master.address),
      grant_ttl_(std::max<std::chrono::milliseconds>(cfg_.fuse.attr_timeout, std::chrono::seconds(1))) {
  if (RAND_bytes(key_.data(), static_cast<int>(key_.size())) != 1) {
    // No randomness: no grant can be trusted; an empty key would make them forgeable. Abort
    // rather than serve: OpenSSL's generator does not fail on Linux with getrandom().
    std::abort();
  }
}

uint32_t MetaProxy::PermFor(const LocalPeer& peer, const rpc::Attr& attr) {
  if (peer.trusted || peer.uid == 0) return kRead | kWrite | kSearch;
  const uint32_t mode = attr.mode();
  if (attr.uid() == peer.uid) return (mode >> 6) & 7;
  if (attr.gid() == peer.gid || std::binary_search(peer.groups.begin(), peer.groups.end(), attr.gid())) {
    return (mode >> 3) & 7;
  }
  return mode & 7;
}

std::string MetaProxy::Mac(const std::string& message) const {
  unsigned char out[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  HMAC(EVP_sha256(), key_.data(), static_cast<int>(key_.size()), reinterpret_cast<const unsigned char*>(message.data()),
       message.size(), out, &len);
  return std::string(reinterpret_cast<const char*>(out), kMacBytes);
}

uint64_t MetaProxy::NowMs() const {
  // From a base far enough back that any age (a test's) is representable; grants never leave this
  // process, so the base is arbitrary.
  constexpr uint64_t kBase = uint64_t{1} << 40;
  return kBase + static_cast<uint64_t>(
                     std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - start_).count());
}

void MetaProxy::PutPeer(std::string* m, const LocalPeer& peer) {
  PutU64(m, peer.uid);
  PutU64(m, peer.gid);
  PutU64(m, peer.groups.size());
  for (uint32_t g : peer.groups) PutU64(m, g);
}

// A grant: [bits (namespace grants only)] time (8 bytes, ms since the proxy started) MAC (16).
Status MetaProxy::CheckMac(std::string message, const std::string& grant, size_t skip) const {
  if (grant.size() != skip + 8 + kMacBytes) return UnauthenticatedError("not a grant of this worker");
  uint64_t made = 0;
  for (int i = 0; i < 8; ++i) made |= static_cast<uint64_t>(static_cast<unsigned char>(grant[skip + i])) << (8 * i);
  message.append(grant, skip, 8);
  const std::string want = Mac(message);
  if (CRYPTO_memcmp(want.data(), grant.data() + skip + 8, kMacBytes) != 0) {
    return UnauthenticatedError("not a grant of this worker for this user (the worker restarted?)");
  }
  const uint64_t now = NowMs();
  if (made > now || now - made > static_cast<uint64_t>(grant_ttl_.count())) {
    return UnauthenticatedError("an expired grant (older than " + std::to_string(grant_ttl_.count()) + " ms)");
  }
  return Status::OK();
}

std::string MetaProxy::Grant(const LocalPeer& peer, uint64_t ino, uint32_t perm, std::chrono::milliseconds age) const {
  std::string m = "ns";
  PutPeer(&m, peer);
  PutU64(&m, ino);
  PutU64(&m, perm);
  std::string when;
  PutU64(&when, NowMs() - std::min<uint64_t>(NowMs(), static_cast<uint64_t>(age.count())));
  return std::string(1, static_cast<char>(perm)) + when + Mac(m + when);
}

StatusOr<uint32_t> MetaProxy::Verify(const LocalPeer& peer, uint64_t ino, const std::string& grant) const {
  if (grant.empty()) {
    return UnauthenticatedError("entry " + std::to_string(ino) + " named without its grant: walk from the root");
  }
  const uint32_t perm = static_cast<unsigned char>(grant[0]) & 7u;
  std::string m = "ns";
  PutPeer(&m, peer);
  PutU64(&m, ino);
  PutU64(&m, perm);
  Status st = CheckMac(m, grant, 1);
  if (!st.ok()) return UnauthenticatedError("entry " + std::to_string(ino) + ": " + st.message() + ": walk from the root again");
  return perm;
}

std::string MetaProxy::DataGrant(const LocalPeer& peer, uint64_t mount_id, const std::string& ufs_path,
                                 const std::string& version, uint64_t size, uint64_t block_size,
                                 std::chrono::milliseconds age) const {
  std::string m = "data";
  PutPeer(&m, peer);
  PutU64(&m, mount_id);
  PutStr(&m, ufs_path);
  PutStr(&m, version);
  PutU64(&m, size);
  PutU64(&m, block_size);
  std::string when;
  PutU64(&when, NowMs() - std::min<uint64_t>(NowMs(), static_cast<uint64_t>(age.count())));
  return when + Mac(m + when);
}

void MetaProxy::GrantEntry(const LocalPeer& peer, const rpc::Attr& attr, rpc::FileInfo* file, std::string* grant,
                           std::string* data_grant) const {
  if (peer.trusted) return;
  const uint32_t perm = PermFor(peer, attr);
  *grant = Grant(peer, attr.ino(), perm);
  if (file == nullptr) return;
  if (attr.type() == rpc::REGULAR && (perm & kRead) != 0 && !file->ufs_path().empty()) {
    *data_grant = DataGrant(peer, file->mount_id(), file->ufs_path(), file->version(), file->attr().size(),
                            file->block_size());
  } else {
    file->Clear();  // a file it may not read: not even where it is in the under-storage
  }
}

Status MetaProxy::CheckRead(const LocalPeer& peer, const rpc::ReadBlockRequest& r, const std::string& grant) const {
  if (peer.trusted) return Status::OK();
  std::string m = "data";
  PutPeer(&m, peer);
  PutU64(&m, r.mount_id());
  PutStr(&m, r.ufs_path());
  PutStr(&m, r.version());
  PutU64(&m, r.file_size());
  PutU64(&m, r.block_size());
  Status st = CheckMac(m, grant, 0);
  if (!st.ok()) return UnauthenticatedError("no valid data grant for this read (" + st.message() + "): look the file up again");
  return Status::OK();
}

grpc::Status MetaProxy::CallMaster(const std::function<grpc::Status(rpc::Master::Stub&, grpc::ClientContext&)>& call) {
  return CallWithFailover(master_, *sec_, cfg_.rpc.timeout, cfg_.rpc.master_wait, call);
}

Status MetaProxy::Handle(const LocalPeer& peer, const rpc::MetaCall& call, rpc::MetaAnswer* out) {
  // The bits the named entry's grant gives (all for a trusted peer).
  auto bits = [&]() -> StatusOr<uint32_t> {
    if (peer.trusted) return kRead | kWrite | kSearch;
    return Verify(peer, call.ino(), call.grant());
  };
  auto need = [&](uint32_t have, uint32_t want, const char* what) -> Status {
    if ((have & want) == want) return Status::OK();
    return PermissionDeniedError(std::string(what) + " entry " + std::to_string(call.ino()) + ": permission denied");
  };
  switch (call.op()) {
    case rpc::MetaCall::ROOT: {
      rpc::GetAttrRequest req;
      req.set_ino(kRootIno);
      rpc::AttrResponse* e = out->mutable_entry();
      RETURN_IF_ERROR(FromGrpc(
          CallMaster([&](rpc::Master::Stub& m, grpc::ClientContext& ctx) { return m.GetAttr(&ctx, req, e); }),
          "the master"));
      GrantEntry(peer, e->attr(), nullptr, out->mutable_grant(), out->mutable_data_grant());
      if (!peer.trusted) out->set_grant_ttl_ms(static_cast<uint64_t>(grant_ttl_.count()));
      return Status::OK();
    }
    case rpc::MetaCall::LOOKUP: {
      ASSIGN_OR_RETURN(uint32_t have, bits());
      RETURN_IF_ERROR(need(have, kSearch, "lookup in"));
      if (call.name().empty() || call.name().find('/') != std::string::npos) {
        return InvalidArgumentError("lookup of '" + call.name() + "': a name is one path component");
      }
      rpc::LookupRequest req;
      req.set_parent(call.ino());
      req.set_name(call.name());
      req.set_file(true);
      rpc::AttrResponse* e = out->mutable_entry();
      RETURN_IF_ERROR(FromGrpc(
          CallMaster([&](rpc::Master::Stub& m, grpc::ClientContext& ctx) { return m.Lookup(&ctx, req, e); }),
          "the master"));
      GrantEntry(peer, e->attr(), e->has_file() ? e->mutable_file() : nullptr, out->mutable_grant(),
                 out->mutable_data_grant());
      if (!e->has_file() || e->file().ufs_path().empty()) e->clear_file();
      if (!peer.trusted) out->set_grant_ttl_ms(static_cast<uint64_t>(grant_ttl_.count()));
      return Status::OK();
    }
    case rpc::MetaCall::READDIR: {
      ASSIGN_OR_RETURN(uint32_t have, bits());
      RETURN_IF_ERROR(need(have, kRead | kSearch, "listing of"));
      rpc::ReadDirRequest req;
      req.set_ino(call.ino());
      req.set_after(call.after());
      req.set_limit(call.limit() == 0 ? 1024 : std::min<uint32_t>(call.limit(), 4096));
      req.set_files(true);
      rpc::ReadDirResponse* d = out->mutable_dir();
      RETURN_IF_ERROR(FromGrpc(
          CallMaster([&](rpc::Master::Stub& m, grpc::ClientContext& ctx) { return m.ReadDir(&ctx, req, d); }),
          "the master"));
      if (!peer.trusted) {
        for (rpc::DirEntry& e : *d->mutable_entries()) {
          GrantEntry(peer, e.attr(), e.has_file() ? e.mutable_file() : nullptr, out->add_grants(), out->add_data_grants());
          if (e.has_file() && e.file().ufs_path().empty()) e.clear_file();
        }
        out->set_grant_ttl_ms(static_cast<uint64_t>(grant_ttl_.count()));
      }
      return Status::OK();
    }
    case rpc::MetaCall::GETFILE: {
      ASSIGN_OR_RETURN(uint32_t have, bits());
      RETURN_IF_ERROR(need(have, kRead, "read of"));
      rpc::GetFileRequest req;
      req.set_ino(call.ino());
      rpc::FileInfo* f = out->mutable_entry()->mutable_file();
      RETURN_IF_ERROR(FromGrpc(
          CallMaster([&](rpc::Master::Stub& m, grpc::ClientContext& ctx) { return m.GetFile(&ctx, req, f); }),
          "the master"));
      *out->mutable_entry()->mutable_attr() = f->attr();
      GrantEntry(peer, out->entry().attr(), f, out->mutable_grant(), out->mutable_data_grant());
      if (!peer.trusted) out->set_grant_ttl_ms(static_cast<uint64_t>(grant_ttl_.count()));
      return Status::OK();
    }
    case rpc::MetaCall::NOTE_OPENS: {
      if (call.inos_size() > 4096) return InvalidArgumentError("NOTE_OPENS names at most 4096 files");
      rpc::NoteOpensRequest req;
      if (peer.trusted) {
        *req.mutable_inos() = call.inos();
      } else {
        // Only files this reader may read: a note starts warming the cache.
        for (int i = 0; i < call.inos_size() && i < call.grants_size(); ++i) {
          auto bits = Verify(peer, call.inos(i), call.grants(i));
          if (bits.ok() && (*bits & kRead) != 0) req.add_inos(call.inos(i));
        }
        if (req.inos().empty()) return Status::OK();
      }
      rpc::NoteOpensResponse resp;
      // As granary-fuse sends them (NodeClient::NoteOpens): one quick call, its answer not noted (a
      // standby's "not the leader" must not move the metadata calls).
      grpc::ClientContext ctx;
      sec_->Prepare(&ctx, std::min<std::chrono::milliseconds>(cfg_.rpc.timeout, std::chrono::seconds(2)));
      return FromGrpc(master_.Get()->NoteOpens(&ctx, req, &resp), "the master");
    }
    default:
      return InvalidArgumentError("unknown metadata call " + std::to_string(static_cast<int>(call.op())));
  }
}

}  // namespace granary::worker
