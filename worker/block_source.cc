#include "worker/block_source.h"

#include <spdlog/spdlog.h>

namespace granary::worker {

BlockSource::BlockSource(BlockStore* store, MountResolver* mounts, BlockReporter* reporter)
    : store_(store), mounts_(mounts), reporter_(reporter) {
  store_->SetRemovedListener([reporter](const BlockMeta& m) { reporter->BlockRemoved(m); });
}

Status BlockSource::Read(const BlockRequest& req, std::string* out, bool* hit) {
  if (req.block_size == 0) return InvalidArgumentError("block_size must be positive");
  uint64_t block_start = req.index * req.block_size;
  if (req.index > req.file_size / req.block_size || block_start >= req.file_size) {
    return InvalidArgumentError("block " + std::to_string(req.index) + " is past the end of the file");
  }
  uint64_t block_len = std::min(req.block_size, req.file_size - block_start);
  if (req.offset >= block_len) {
    out->clear();
    *hit = true;
    return Status::OK();
  }
  uint64_t len = std::min(req.length, block_len - req.offset);
  ASSIGN_OR_RETURN(MountHandle mount, mounts_->GetMount(req.mount_id));
  BlockMeta meta{BlockId{MakeFileKey(mount.uri, req.ufs_path, req.version), req.index}, req.mount_id, block_len};

  out->resize(len);
  auto cached = store_->Read(meta.id, req.offset, len, out->data());
  if (cached.ok() && *cached == len) {
    *hit = true;
    counters_.hits++;
    counters_.bytes_served += len;
    return Status::OK();
  }
  *hit = false;
  counters_.misses++;
  ASSIGN_OR_RETURN(std::shared_ptr<const std::string> block, Fetch(req, mount, meta));
  out->assign(block->data() + req.offset, len);
  counters_.bytes_served += len;
  return Status::OK();
}

BlockSource::Fetched BlockSource::Fetch(const BlockRequest& req, const MountHandle& mount, const BlockMeta& meta) {
  std::promise<Fetched> promise;
  std::shared_future<Fetched> future;
  bool leader = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto u = uncached_.begin(); u != uncached_.end(); ++u) {
      if (u->first == meta.id) {
        counters_.buffered++;
        uncached_.splice(uncached_.begin(), uncached_, u);
        return u->second;
      }
    }
    auto it = inflight_.find(meta.id);
    if (it != inflight_.end()) {
      future = it->second;
      counters_.coalesced++;
    } else {
      future = promise.get_future().share();
      inflight_.emplace(meta.id, future);
      leader = true;
    }
  }
  if (!leader) return future.get();
  Fetched result = FetchOnce(req, mount, meta);
  promise.set_value(result);
  std::lock_guard<std::mutex> lock(mu_);
  inflight_.erase(meta.id);
  return result;
}

BlockSource::Fetched BlockSource::FetchOnce(const BlockRequest& req, const MountHandle& mount, const BlockMeta& meta) {
  auto data = std::make_shared<std::string>(meta.length, '\0');
  counters_.ufs_reads++;
  auto n = mount.ufs->Read(req.ufs_path, req.version, req.index * req.block_size, meta.length, data->data());
  if (!n.ok()) return n.status();
  counters_.ufs_bytes += *n;
  if (*n != meta.length) {
    return FailedPreconditionError(req.ufs_path + " is shorter in the under-storage than when it was listed");
  }
  if (mount.policy) store_->SetMountPolicy(req.mount_id, *mount.policy);
  Status st = store_->Put(meta, *data);
  std::shared_ptr<const std::string> block(std::move(data));
  if (st.ok()) {
    reporter_->BlockAdded(meta);
  } else {
    spdlog::debug("serving block uncached: {}", st.message());
    std::lock_guard<std::mutex> lock(mu_);
    uncached_.emplace_front(meta.id, block);
    if (uncached_.size() > kUncachedBlocks) uncached_.pop_back();
  }
  return block;
}

}  // namespace granary::worker
