#include "worker/block_store.h"

#include <dirent.h>
#include <fcntl.h>
#include <spdlog/spdlog.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "common/fs.h"

namespace granary::worker {
namespace {

constexpr char kMagic[8] = {'G', 'R', 'N', 'B', 'L', 'K', '0', '1'};
constexpr size_t kFixedHeader = 8 + 4 + 4 + 16 + 8 + 8 + 8 + 4 + 4;  // 64 bytes

template <typename T>
void Put(std::string* s, T v) {
  s->append(reinterpret_cast<const char*>(&v), sizeof v);
}
template <typename T>
T Get(const char* p) {
  T v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

Status PreadFull(int fd, char* buf, size_t len, uint64_t off, const std::string& path) {
  size_t done = 0;
  while (done < len) {
    ssize_t n = pread(fd, buf + done, len - done, static_cast<off_t>(off + done));
    if (n < 0) {
      if (errno == EINTR) continue;
      return ErrnoError(errno, "read " + path);
    }
    if (n == 0) return DataLossError(path + " is shorter than its header says");
    done += static_cast<size_t>(n);
  }
  return Status::OK();
}

Status WriteFull(int fd, const char* buf, size_t len, const std::string& path) {
  size_t done = 0;
  while (done < len) {
    ssize_t n = write(fd, buf + done, len - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      return ErrnoError(errno, "write " + path);
    }
    done += static_cast<size_t>(n);
  }
  return Status::OK();
}

struct Header {
  uint32_t header_len = 0;
  uint32_t chunk_size = 0;
  FileKey key{};
  uint64_t index = 0;
  uint64_t mount_id = 0;
  uint64_t data_len = 0;
  std::vector<uint64_t> sums;
};

std::string EncodeHeader(const BlockMeta& meta, std::string_view data) {
  uint32_t header_len = BlockHeaderLen(data.size());
  uint32_t nchunks = static_cast<uint32_t>((data.size() + BlockStore::kChunkSize - 1) / BlockStore::kChunkSize);
  std::string h;
  h.reserve(header_len);
  h.append(kMagic, sizeof kMagic);
  Put<uint32_t>(&h, header_len);
  Put<uint32_t>(&h, BlockStore::kChunkSize);
  h.append(reinterpret_cast<const char*>(meta.id.key.data()), meta.id.key.size());
  Put<uint64_t>(&h, meta.id.index);
  Put<uint64_t>(&h, meta.mount_id);
  Put<uint64_t>(&h, data.size());
  Put<uint32_t>(&h, nchunks);
  Put<uint32_t>(&h, 0);
  for (uint32_t c = 0; c < nchunks; ++c) {
    size_t off = static_cast<size_t>(c) * BlockStore::kChunkSize;
    Put<uint64_t>(&h, Checksum64(data.data() + off, std::min<size_t>(BlockStore::kChunkSize, data.size() - off)));
  }
  Put<uint64_t>(&h, Checksum64(h.data(), h.size()));
  h.resize(header_len, '\0');
  return h;
}

Status DecodeHeader(const std::string& buf, const std::string& path, Header* h) {
  if (buf.size() < kFixedHeader || std::memcmp(buf.data(), kMagic, sizeof kMagic) != 0) {
    return DataLossError(path + ": not a block file");
  }
  const char* p = buf.data() + 8;
  h->header_len = Get<uint32_t>(p);
  h->chunk_size = Get<uint32_t>(p + 4);
  std::memcpy(h->key.data(), p + 8, 16);
  h->index = Get<uint64_t>(p + 24);
  h->mount_id = Get<uint64_t>(p + 32);
  h->data_len = Get<uint64_t>(p + 40);
  uint32_t nchunks = Get<uint32_t>(p + 48);
  if (h->chunk_size != BlockStore::kChunkSize || h->header_len != BlockHeaderLen(h->data_len) ||
      nchunks != (h->data_len + h->chunk_size - 1) / h->chunk_size || buf.size() < h->header_len) {
    return DataLossError(path + ": inconsistent block header");
  }
  size_t sums_at = kFixedHeader;
  size_t end = sums_at + 8ull * nchunks;
  if (Get<uint64_t>(buf.data() + end) != Checksum64(buf.data(), end)) {
    return DataLossError(path + ": block header checksum mismatch");
  }
  h->sums.resize(nchunks);
  for (uint32_t c = 0; c < nchunks; ++c) h->sums[c] = Get<uint64_t>(buf.data() + sums_at + 8ull * c);
  return Status::OK();
}

}  // namespace

uint32_t BlockHeaderLen(uint64_t data_len) {
  uint64_t nchunks = (data_len + BlockStore::kChunkSize - 1) / BlockStore::kChunkSize;
  uint64_t raw = kFixedHeader + 8 * nchunks + 8;
  return static_cast<uint32_t>((raw + 4095) / 4096 * 4096);
}

size_t BlockIdHash::operator()(const BlockId& id) const {
  uint64_t a;
  std::memcpy(&a, id.key.data(), 8);
  return static_cast<size_t>(a ^ (id.index * 0x9e3779b97f4a7c15ull));
}

StatusOr<std::unique_ptr<BlockStore>> BlockStore::Open(const std::string& dir, uint64_t quota) {
  RETURN_IF_ERROR(MakeDirs(dir, 0700).WithContext("worker.cache_dir"));
  chmod(dir.c_str(), 0700);
  RETURN_IF_ERROR(MakeDirs(dir + "/blocks", 0700));
  RETURN_IF_ERROR(MakeDirs(dir + "/tmp", 0700));
  std::unique_ptr<BlockStore> store(new BlockStore(dir, quota));
  RETURN_IF_ERROR(store->Scan());
  return store;
}

std::string BlockStore::PathOf(const BlockId& id) const {
  std::string hex = FileKeyHex(id.key);
  return dir_ + "/blocks/" + hex.substr(0, 2) + "/" + hex + "-" + std::to_string(id.index);
}

Status BlockStore::Scan() {
  // Half-written blocks from a crash.
  if (DIR* d = opendir((dir_ + "/tmp").c_str())) {
    while (dirent* de = readdir(d)) {
      if (de->d_name[0] != '.') unlink((dir_ + "/tmp/" + de->d_name).c_str());
    }
    closedir(d);
  }
  DIR* top = opendir((dir_ + "/blocks").c_str());
  if (top == nullptr) return ErrnoError(errno, "open " + dir_ + "/blocks");
  while (dirent* sub = readdir(top)) {
    if (sub->d_name[0] == '.') continue;
    std::string subdir = dir_ + "/blocks/" + sub->d_name;
    DIR* d = opendir(subdir.c_str());
    if (d == nullptr) continue;
    while (dirent* de = readdir(d)) {
      if (de->d_name[0] == '.') continue;
      std::string path = subdir + "/" + de->d_name;
      Status st = LoadOne(path, de->d_name);
      if (!st.ok()) {
        spdlog::warn("discarding cached block: {}", st.message());
        unlink(path.c_str());
        ++corrupt_;
      }
    }
    closedir(d);
  }
  closedir(top);
  // Past the quota (it was lowered): evict down to it.
  std::vector<BlockMeta> evicted;
  std::vector<std::string> unlinks;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (used_ > quota_) MakeRoomLocked(0, &evicted, &unlinks);
  }
  for (const auto& p : unlinks) unlink(p.c_str());
  spdlog::info("block cache {}: {} blocks, {} bytes of {} quota", dir_, index_.size(), used_, quota_);
  return Status::OK();
}

Status BlockStore::LoadOne(const std::string& path, const std::string& name) {
  size_t dash = name.find('-');
  BlockId id;
  if (dash != 32 || !ParseFileKeyHex(name.substr(0, 32), &id.key)) return DataLossError(path + ": unexpected name");
  auto idx = std::strtoull(name.c_str() + 33, nullptr, 10);
  id.index = idx;
  int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return ErrnoError(errno, "open " + path);
  struct stat st;
  fstat(fd, &st);
  std::string buf(std::min<uint64_t>(static_cast<uint64_t>(st.st_size), 64 * 1024), '\0');
  Status rs = PreadFull(fd, buf.data(), buf.size(), 0, path);
  close(fd);
  RETURN_IF_ERROR(rs);
  Header h;
  RETURN_IF_ERROR(DecodeHeader(buf, path, &h));
  if (h.key != id.key || h.index != id.index) return DataLossError(path + ": header names another block");
  if (static_cast<uint64_t>(st.st_size) != h.header_len + h.data_len) return DataLossError(path + ": wrong size");
  std::lock_guard<std::mutex> lock(mu_);
  Entry e;
  e.meta = BlockMeta{id, h.mount_id, h.data_len};
  e.file_bytes = static_cast<uint64_t>(st.st_size);
  e.header_len = h.header_len;
  lru_.push_back(id);
  e.lru = std::prev(lru_.end());
  used_ += e.file_bytes;
  index_.emplace(id, e);
  return Status::OK();
}

StatusOr<size_t> BlockStore::Read(const BlockId& id, uint64_t offset, size_t length, char* out) {
  uint64_t data_len;
  uint32_t header_len;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = index_.find(id);
    if (it == index_.end()) return NotFoundError("block not cached");
    ++it->second.readers;
    lru_.splice(lru_.begin(), lru_, it->second.lru);
    data_len = it->second.meta.length;
    header_len = it->second.header_len;
  }
  auto release = [&](bool corrupt) {
    std::vector<std::string> unlinks;
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = index_.find(id);
      if (it != index_.end()) {
        --it->second.readers;
        if (corrupt) {
          ++corrupt_;
          RemoveLocked(id, &unlinks);
        }
      }
    }
    for (const auto& p : unlinks) unlink(p.c_str());
  };
  if (offset >= data_len) {
    release(false);
    return size_t{0};
  }
  length = std::min<uint64_t>(length, data_len - offset);
  std::string path = PathOf(id);
  int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    int err = errno;
    release(err == ENOENT);
    return err == ENOENT ? DataLossError(path + " vanished from the cache") : ErrnoError(err, "open " + path);
  }
  // Read the header and whole chunks covering the range, verify, then copy out the range.
  std::string header(header_len, '\0');
  Status st = PreadFull(fd, header.data(), header_len, 0, path);
  Header h;
  if (st.ok()) st = DecodeHeader(header, path, &h);
  if (st.ok() && (h.key != id.key || h.index != id.index || h.data_len != data_len)) {
    st = DataLossError(path + ": header names another block");
  }
  uint64_t first = offset / kChunkSize;
  uint64_t last = (offset + length - 1) / kChunkSize;
  uint64_t span_start = first * kChunkSize;
  uint64_t span_end = std::min<uint64_t>((last + 1) * kChunkSize, data_len);
  std::string span;
  if (st.ok()) {
    span.resize(span_end - span_start);
    st = PreadFull(fd, span.data(), span.size(), header_len + span_start, path);
  }
  close(fd);
  for (uint64_t c = first; st.ok() && c <= last; ++c) {
    uint64_t off = c * kChunkSize - span_start;
    uint64_t len = std::min<uint64_t>(kChunkSize, data_len - c * kChunkSize);
    if (Checksum64(span.data() + off, len) != h.sums[c]) {
      st = DataLossError(path + ": chunk " + std::to_string(c) + " failed its checksum");
    }
  }
  if (!st.ok()) {
    spdlog::warn("cached block is corrupt, discarding it: {}", st.message());
    release(true);
    return st.IsDataLoss() ? st : DataLossError(st.message());
  }
  std::memcpy(out, span.data() + (offset - span_start), length);
  release(false);
  return length;
}

bool BlockStore::MakeRoomLocked(uint64_t bytes, std::vector<BlockMeta>* evicted, std::vector<std::string>* unlink) {
  auto it = lru_.end();
  while (used_ + reserved_ + bytes > quota_ && it != lru_.begin()) {
    --it;
    auto e = index_.find(*it);
    if (e->second.readers > 0) continue;
    BlockId victim = *it;
    evicted->push_back(e->second.meta);
    ++evictions_;
    // Step past the victim before its list node is erased.
    auto next = it;
    ++next;
    RemoveLocked(victim, unlink);
    it = next;
  }
  return used_ + reserved_ + bytes <= quota_;
}

void BlockStore::RemoveLocked(const BlockId& id, std::vector<std::string>* unlink) {
  auto it = index_.find(id);
  if (it == index_.end()) return;
  used_ -= it->second.file_bytes;
  lru_.erase(it->second.lru);
  index_.erase(it);
  unlink->push_back(PathOf(id));
}

Status BlockStore::Put(const BlockMeta& meta, std::string_view data, std::vector<BlockMeta>* evicted) {
  if (data.size() != meta.length) return InvalidArgumentError("block length does not match its data");
  uint64_t file_bytes = BlockHeaderLen(data.size()) + data.size();
  std::vector<std::string> unlinks;
  bool fits;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (index_.count(meta.id)) return Status::OK();
    fits = MakeRoomLocked(file_bytes, evicted, &unlinks);
    if (fits) reserved_ += file_bytes;
  }
  for (const auto& p : unlinks) unlink(p.c_str());
  if (!fits) return ResourceExhaustedError("no room in the cache for a block of " + std::to_string(file_bytes) + " bytes");

  auto unreserve = [&] {
    std::lock_guard<std::mutex> lock(mu_);
    reserved_ -= file_bytes;
  };
  std::string path = PathOf(meta.id);
  std::string tmp = dir_ + "/tmp/" + std::to_string(getpid()) + "-" + std::to_string(tmp_seq_++);
  std::string header = EncodeHeader(meta, data);
  int fd = open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0) {
    unreserve();
    return ErrnoError(errno, "create " + tmp);
  }
  Status st = WriteFull(fd, header.data(), header.size(), tmp);
  if (st.ok()) st = WriteFull(fd, data.data(), data.size(), tmp);
  if (close(fd) != 0 && st.ok()) st = ErrnoError(errno, "close " + tmp);
  if (st.ok()) {
    std::string sub = path.substr(0, path.rfind('/'));
    if (mkdir(sub.c_str(), 0700) != 0 && errno != EEXIST) st = ErrnoError(errno, "mkdir " + sub);
  }
  if (st.ok() && rename(tmp.c_str(), path.c_str()) != 0) st = ErrnoError(errno, "rename to " + path);
  if (!st.ok()) {
    unlink(tmp.c_str());
    unreserve();
    return st;
  }
  std::lock_guard<std::mutex> lock(mu_);
  reserved_ -= file_bytes;
  if (index_.count(meta.id)) return Status::OK();  // a concurrent Put of the same block won
  Entry e;
  e.meta = meta;
  e.file_bytes = file_bytes;
  e.header_len = static_cast<uint32_t>(header.size());
  lru_.push_front(meta.id);
  e.lru = lru_.begin();
  used_ += file_bytes;
  index_.emplace(meta.id, e);
  return Status::OK();
}

bool BlockStore::Contains(const BlockId& id) const {
  std::lock_guard<std::mutex> lock(mu_);
  return index_.count(id) > 0;
}

std::vector<BlockMeta> BlockStore::List() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<BlockMeta> out;
  out.reserve(index_.size());
  for (const auto& [id, e] : index_) out.push_back(e.meta);
  return out;
}

BlockStoreStats BlockStore::Stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return BlockStoreStats{quota_, used_, index_.size(), evictions_, corrupt_};
}

}  // namespace granary::worker
