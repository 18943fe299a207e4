#include "fuse/client.h"

namespace granary::fuse {

StatusOr<std::unique_ptr<Client>> Client::Create(const Config& cfg) {
  ASSIGN_OR_RETURN(auto sec, RpcSecurity::FromConfig(cfg.rpc));
  return std::unique_ptr<Client>(new Client(cfg, std::move(sec)));
}

Client::Client(const Config& cfg, std::shared_ptr<RpcSecurity> sec)
    : cfg_(cfg), sec_(std::move(sec)), master_(sec_, cfg_.master.address), worker_(sec_, cfg_.fuse.worker) {}

grpc::Status Client::CallMaster(const std::function<grpc::Status(rpc::Master::Stub&, grpc::ClientContext&)>& call) {
  // Metadata calls are idempotent: after UNAVAILABLE (the master restarted), try once more on the
  // fresh channel the holder made.
  for (int attempt = 0;; ++attempt) {
    grpc::ClientContext ctx;
    sec_->Prepare(&ctx, cfg_.rpc.timeout);
    grpc::Status st = master_.Note(call(*master_.Get(), ctx));
    if (st.error_code() != grpc::StatusCode::UNAVAILABLE || attempt == 1) return st;
  }
}

StatusOr<rpc::Attr> Client::Lookup(uint64_t parent, const std::string& name) {
  rpc::LookupRequest req;
  req.set_parent(parent);
  req.set_name(name);
  rpc::AttrResponse resp;
  RETURN_IF_ERROR(FromGrpc(CallMaster([&](rpc::Master::Stub& m, grpc::ClientContext& ctx) { return m.Lookup(&ctx, req, &resp); }), "the master"));
  return resp.attr();
}

StatusOr<rpc::Attr> Client::GetAttr(uint64_t ino) {
  rpc::GetAttrRequest req;
  req.set_ino(ino);
  rpc::AttrResponse resp;
  RETURN_IF_ERROR(FromGrpc(CallMaster([&](rpc::Master::Stub& m, grpc::ClientContext& ctx) { return m.GetAttr(&ctx, req, &resp); }), "the master"));
  return resp.attr();
}

StatusOr<rpc::Attr> Client::Resolve(const std::string& path) {
  rpc::ResolvePathRequest req;
  req.set_path(path);
  rpc::AttrResponse resp;
  RETURN_IF_ERROR(FromGrpc(CallMaster([&](rpc::Master::Stub& m, grpc::ClientContext& ctx) { return m.ResolvePath(&ctx, req, &resp); }), "the master at " + cfg_.master.address));
  return resp.attr();
}

Status Client::ReadDir(uint64_t ino, uint64_t after, uint32_t limit, rpc::ReadDirResponse* out) {
  rpc::ReadDirRequest req;
  req.set_ino(ino);
  req.set_after(after);
  req.set_limit(limit);
  return FromGrpc(CallMaster([&](rpc::Master::Stub& m, grpc::ClientContext& ctx) { return m.ReadDir(&ctx, req, out); }), "the master");
}

StatusOr<rpc::FileInfo> Client::GetFile(uint64_t ino) {
  rpc::GetFileRequest req;
  req.set_ino(ino);
  rpc::FileInfo resp;
  RETURN_IF_ERROR(FromGrpc(CallMaster([&](rpc::Master::Stub& m, grpc::ClientContext& ctx) { return m.GetFile(&ctx, req, &resp); }), "the master"));
  return resp;
}

StatusOr<rpc::WorkerStats> Client::WorkerStats() {
  rpc::GetStatsRequest req;
  rpc::WorkerStats resp;
  grpc::ClientContext ctx;
  sec_->Prepare(&ctx, cfg_.rpc.timeout);
  RETURN_IF_ERROR(FromGrpc(worker_.Note(worker_.Get()->GetStats(&ctx, req, &resp)), "the worker at " + cfg_.fuse.worker));
  return resp;
}

Status Client::Read(const rpc::FileInfo& file, uint64_t offset, uint64_t length, std::string* out) {
  uint64_t size = file.attr().size();
  uint64_t bs = file.block_size();
  if (bs == 0) return InternalError("file has no block size");
  uint64_t end = std::min(size, offset + length);
  while (offset < end) {
    uint64_t index = offset / bs;
    uint64_t in_block = offset - index * bs;
    uint64_t want = std::min(end - offset, bs - in_block);
    rpc::ReadBlockRequest req;
    req.set_mount_id(file.mount_id());
    req.set_ufs_path(file.ufs_path());
    req.set_version(file.version());
    req.set_file_size(size);
    req.set_block_size(bs);
    req.set_index(index);
    req.set_offset(in_block);
    req.set_length(want);
    grpc::ClientContext ctx;
    sec_->Prepare(&ctx, cfg_.rpc.timeout);
    Status st = ReadBlockStream(*worker_.Get(), ctx, req, want, out, "the worker at " + cfg_.fuse.worker);
    if (st.code() == Code::kUnavailable) worker_.Note(grpc::Status(grpc::StatusCode::UNAVAILABLE, ""));
    RETURN_IF_ERROR(st);
    offset += want;
  }
  return Status::OK();
}

}  // namespace granary::fuse
