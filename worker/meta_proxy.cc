#include "worker/meta_proxy.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>
#include <sys/socket.h>
#include <unistd.h>

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
  return p;
}

MetaProxy::MetaProxy(const Config& cfg, std::shared_ptr<RpcSecurity> sec)
    : cfg_(cfg), sec_(std::move(sec)), master_(sec_, cfg_.master.address) {
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
  if (attr.gid() == peer.gid) return (mode >> 3) & 7;
  return mode & 7;
}

std::string MetaProxy::Mac(const std::string& message) const {
  unsigned char out[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  HMAC(EVP_sha256(), key_.data(), static_cast<int>(key_.size()), reinterpret_cast<const unsigned char*>(message.data()),
       message.size(), out, &len);
  return std::string(reinterpret_cast<const char*>(out), kMacBytes);
}

std::string MetaProxy::Grant(const LocalPeer& peer, uint64_t ino, uint32_t perm) const {
  std::string m = "ns";
  PutU64(&m, peer.uid);
  PutU64(&m, peer.gid);
  PutU64(&m, ino);
  PutU64(&m, perm);
  return std::string(1, static_cast<char>(perm)) + Mac(m);
}

StatusOr<uint32_t> MetaProxy::Verify(const LocalPeer& peer, uint64_t ino, const std::string& grant) const {
  if (grant.size() == 1 + kMacBytes) {
    const uint32_t perm = static_cast<unsigned char>(grant[0]) & 7u;
    const std::string want = Grant(peer, ino, perm);
    if (CRYPTO_memcmp(want.data(), grant.data(), want.size()) == 0) return perm;
  }
  return UnauthenticatedError("no valid grant for entry " + std::to_string(ino) +
                              " (the worker restarted, or it was not made for this user): walk from the root again");
}

std::string MetaProxy::DataGrant(const LocalPeer& peer, uint64_t mount_id, const std::string& ufs_path,
                                 const std::string& version, uint64_t size, uint64_t block_size) const {
  std::string m = "data";
  PutU64(&m, peer.uid);
  PutU64(&m, peer.gid);
  PutU64(&m, mount_id);
  PutStr(&m, ufs_path);
  PutStr(&m, version);
  PutU64(&m, size);
  PutU64(&m, block_size);
  return Mac(m);
}

void MetaProxy::GrantEntry(const LocalPeer& peer, const rpc::Attr& attr, const rpc::FileInfo* file, std::string* grant,
                           std::string* data_grant) const {
  if (peer.trusted) return;
  const uint32_t perm = PermFor(peer, attr);
  *grant = Grant(peer, attr.ino(), perm);
  if (file != nullptr && attr.type() == rpc::REGULAR && (perm & kRead) != 0 && !file->ufs_path().empty()) {
    *data_grant = DataGrant(peer, file->mount_id(), file->ufs_path(), file->version(), file->attr().size(),
                            file->block_size());
  }
}

Status MetaProxy::CheckRead(const LocalPeer& peer, const rpc::ReadBlockRequest& r, const std::string& grant) const {
  if (peer.trusted) return Status::OK();
  const std::string want = DataGrant(peer, r.mount_id(), r.ufs_path(), r.version(), r.file_size(), r.block_size());
  if (grant.size() == want.size() && CRYPTO_memcmp(want.data(), grant.data(), want.size()) == 0) return Status::OK();
  return UnauthenticatedError("no valid data grant for this read (the worker restarted, or the grant is not this "
                              "user's): look the file up again");
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
      GrantEntry(peer, e->attr(), e->has_file() ? &e->file() : nullptr, out->mutable_grant(),
                 out->mutable_data_grant());
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
        for (const rpc::DirEntry& e : d->entries()) {
          GrantEntry(peer, e.attr(), e.has_file() ? &e.file() : nullptr, out->add_grants(), out->add_data_grants());
        }
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
      GrantEntry(peer, f->attr(), f, out->mutable_grant(), out->mutable_data_grant());
      return Status::OK();
    }
    case rpc::MetaCall::NOTE_OPENS: {
      if (call.inos_size() > 4096) return InvalidArgumentError("NOTE_OPENS names at most 4096 files");
      rpc::NoteOpensRequest req;
      *req.mutable_inos() = call.inos();
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
