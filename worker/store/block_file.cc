#include "worker/store/block_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <memory>

namespace granary::worker::store {
namespace {

// "GRNBLK02": version 2 of the block format (version 1 kept a header in front of each block's
// data, one file per block).
constexpr char kMagic[8] = {'G', 'R', 'N', 'B', 'L', 'K', '0', '2'};
// magic 8 | length 4 | chunk size 4 | key 16 | index 8 | mount 8 | offset 8 | data length 8 |
// chunks 4 | 0 4
constexpr size_t kFixed = 8 + 4 + 4 + 16 + 8 + 8 + 8 + 8 + 4 + 4;  // 72 bytes before the chunk sums

template <typename T>
void Append(std::string* s, T v) {
  s->append(reinterpret_cast<const char*>(&v), sizeof v);
}
template <typename T>
T Get(const char* p) {
  T v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

uint64_t Chunks(uint64_t data_len) { return (data_len + kChunkSize - 1) / kChunkSize; }

Status PreadFull(int fd, char* buf, size_t len, uint64_t off, const std::string& path) {
  size_t done = 0;
  while (done < len) {
    ssize_t n = pread(fd, buf + done, len - done, static_cast<off_t>(off + done));
    if (n < 0) {
      if (errno == EINTR) continue;
      return ErrnoError(errno, "read " + path);
    }
    if (n == 0) return DataLossError(path + " is shorter than its sidecar says");
    done += static_cast<size_t>(n);
  }
  return Status::OK();
}

Status PwriteFull(int fd, const char* buf, size_t len, uint64_t off, const std::string& path) {
  size_t done = 0;
  while (done < len) {
    ssize_t n = pwrite(fd, buf + done, len - done, static_cast<off_t>(off + done));
    if (n < 0) {
      if (errno == EINTR) continue;
      return ErrnoError(errno, "write " + path);
    }
    done += static_cast<size_t>(n);
  }
  return Status::OK();
}

Status Missing(int err, const std::string& what, const std::string& path) {
  return err == ENOENT ? DataLossError(path + " vanished from the cache") : ErrnoError(err, what + " " + path);
}

}  // namespace

uint32_t SidecarLen(uint64_t data_len) {
  uint64_t raw = kFixed + 8 * Chunks(data_len) + 8;
  return static_cast<uint32_t>((raw + kSidecarUnit - 1) / kSidecarUnit * kSidecarUnit);
}

uint64_t BlockFileBytes(uint64_t data_len) { return SidecarLen(data_len) + data_len; }

std::string DataPath(const std::string& dir, const FileKey& key) {
  std::string hex = FileKeyHex(key);
  return dir + "/blocks/" + hex.substr(0, 2) + "/" + hex;
}

std::string SidecarPath(const std::string& dir, const FileKey& key, uint64_t index) {
  return DataPath(dir, key) + "-" + std::to_string(index) + ".m";
}

bool ParseName(const std::string& name, FileKey* key, uint64_t* index, bool* sidecar) {
  if (name.size() < 32 || !ParseFileKeyHex(name.substr(0, 32), key)) return false;
  if (name.size() == 32) {
    *sidecar = false;
    return true;
  }
  if (name[32] != '-' || name.size() < 36 || name.compare(name.size() - 2, 2, ".m") != 0) return false;
  std::string digits = name.substr(33, name.size() - 35);
  if (digits.empty() || digits.size() > 19 || !std::all_of(digits.begin(), digits.end(), ::isdigit)) return false;
  // Only the name SidecarPath makes: "-06.m" would be a second sidecar file of block 6.
  if (digits.size() > 1 && digits[0] == '0') return false;
  *index = std::stoull(digits);
  *sidecar = true;
  return true;
}

std::vector<uint64_t> ChunkSums(std::string_view data) {
  std::vector<uint64_t> sums(Chunks(data.size()));
  for (size_t c = 0; c < sums.size(); ++c) {
    size_t off = c * kChunkSize;
    sums[c] = Checksum64(data.data() + off, std::min<size_t>(kChunkSize, data.size() - off));
  }
  return sums;
}

std::string EncodeSidecar(const FileKey& key, uint64_t index, uint64_t mount_id, uint64_t offset, uint64_t data_len,
                          const std::vector<uint64_t>& sums) {
  uint32_t len = SidecarLen(data_len);
  uint32_t nchunks = static_cast<uint32_t>(sums.size());
  std::string h;
  h.reserve(len);
  h.append(kMagic, sizeof kMagic);
  Append<uint32_t>(&h, len);
  Append<uint32_t>(&h, kChunkSize);
  h.append(reinterpret_cast<const char*>(key.data()), key.size());
  Append<uint64_t>(&h, index);
  Append<uint64_t>(&h, mount_id);
  Append<uint64_t>(&h, offset);
  Append<uint64_t>(&h, data_len);
  Append<uint32_t>(&h, nchunks);
  Append<uint32_t>(&h, 0);
  for (uint64_t sum : sums) Append<uint64_t>(&h, sum);
  Append<uint64_t>(&h, Checksum64(h.data(), h.size()));
  h.resize(len, '\0');
  return h;
}

Status DecodeSidecar(const std::string& buf, const std::string& path, Sidecar* out) {
  if (buf.size() < kFixed || std::memcmp(buf.data(), kMagic, sizeof kMagic) != 0) {
    return DataLossError(path + ": not a block sidecar");
  }
  const char* p = buf.data() + 8;
  uint32_t len = Get<uint32_t>(p);
  uint32_t chunk = Get<uint32_t>(p + 4);
  std::memcpy(out->key.data(), p + 8, 16);
  out->index = Get<uint64_t>(p + 24);
  out->mount_id = Get<uint64_t>(p + 32);
  out->offset = Get<uint64_t>(p + 40);
  out->data_len = Get<uint64_t>(p + 48);
  uint32_t nchunks = Get<uint32_t>(p + 56);
  if (chunk != kChunkSize || len != SidecarLen(out->data_len) || nchunks != Chunks(out->data_len) ||
      buf.size() != len) {
    return DataLossError(path + ": inconsistent block sidecar");
  }
  size_t end = kFixed + 8ull * nchunks;
  if (Get<uint64_t>(buf.data() + end) != Checksum64(buf.data(), end)) {
    return DataLossError(path + ": block sidecar checksum mismatch");
  }
  out->sums.resize(nchunks);
  for (uint32_t c = 0; c < nchunks; ++c) out->sums[c] = Get<uint64_t>(buf.data() + kFixed + 8ull * c);
  return Status::OK();
}

StatusOr<Sidecar> ReadSidecar(const std::string& path) {
  int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return Missing(errno, "open", path);
  struct stat st {};
  fstat(fd, &st);
  std::string buf(std::min<uint64_t>(static_cast<uint64_t>(st.st_size), 1 << 20), '\0');
  Status s = PreadFull(fd, buf.data(), buf.size(), 0, path);
  close(fd);
  RETURN_IF_ERROR(s);
  Sidecar sc;
  RETURN_IF_ERROR(DecodeSidecar(buf, path, &sc));
  return sc;
}

namespace {
// The directory `path` is in, made (0700) when missing. Callers try first and make it only on
// ENOENT: a mkdir per block that finds it there was ~2% of a worker's CPU on cold small files.
Status MakeParent(const std::string& path) {
  std::string sub = path.substr(0, path.rfind('/'));
  if (mkdir(sub.c_str(), 0700) != 0 && errno != EEXIST) return ErrnoError(errno, "mkdir " + sub);
  return Status::OK();
}
}  // namespace

Status WriteData(const std::string& data_path, uint64_t offset, std::string_view data, bool direct) {
  constexpr uint64_t kAlign = 4096;  // what every Linux file system's O_DIRECT accepts
  const uint64_t aligned = data.size() / kAlign * kAlign;
  direct = direct && aligned > 0 && offset % kAlign == 0 && reinterpret_cast<uintptr_t>(data.data()) % kAlign == 0;
  int flags = O_WRONLY | O_CREAT | O_CLOEXEC | (direct ? O_DIRECT : 0);
  int fd = open(data_path.c_str(), flags, 0600);
  if (fd < 0 && errno == ENOENT) {
    RETURN_IF_ERROR(MakeParent(data_path));
    fd = open(data_path.c_str(), flags, 0600);
  }
  if (fd < 0 && direct && errno == EINVAL) {  // a file system without O_DIRECT
    direct = false;
    fd = open(data_path.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC, 0600);
  }
  if (fd < 0) return ErrnoError(errno, "open " + data_path);
  uint64_t done = 0;
  Status st;
  if (direct) {
    ssize_t n = pwrite(fd, data.data(), aligned, static_cast<off_t>(offset));
    if (n > 0) done = static_cast<uint64_t>(n) / kAlign * kAlign;  // a short write goes on buffered
    if (n < 0 && errno != EINVAL && errno != EINTR) st = ErrnoError(errno, "write " + data_path);
    // The rest (the tail, or all of it when the device refused the alignment) through the page cache.
    if (st.ok() && done < data.size() && fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_DIRECT) != 0) {
      st = ErrnoError(errno, "fcntl " + data_path);
    }
  }
  if (st.ok() && done < data.size()) st = PwriteFull(fd, data.data() + done, data.size() - done, offset + done, data_path);
  if (close(fd) != 0 && st.ok()) st = ErrnoError(errno, "close " + data_path);
  return st;
}

Status CopyData(const std::string& src, const std::string& dst, uint64_t offset, uint64_t len) {
  int in = open(src.c_str(), O_RDONLY | O_CLOEXEC);
  if (in < 0) return Missing(errno, "open", src);
  std::string buf(len, '\0');
  Status st = PreadFull(in, buf.data(), len, offset, src);
  close(in);
  RETURN_IF_ERROR(st);
  return WriteData(dst, offset, buf);
}

void PunchData(const std::string& data_path, uint64_t offset, uint64_t len) {
  int fd = open(data_path.c_str(), O_WRONLY | O_CLOEXEC);
  if (fd < 0) return;
  fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, static_cast<off_t>(offset), static_cast<off_t>(len));
  close(fd);
}

namespace {
// Creates `path` (0600; `flags` adds O_TRUNC or O_EXCL) holding `bytes`, making its directory when
// `make_parent` and it is missing. On an error nothing is left at `path`.
Status WriteNewFile(const std::string& path, std::string_view bytes, int flags, bool make_parent) {
  const int f = O_WRONLY | O_CREAT | O_CLOEXEC | flags;
  int fd = open(path.c_str(), f, 0600);
  if (fd < 0 && errno == ENOENT && make_parent) {
    RETURN_IF_ERROR(MakeParent(path));
    fd = open(path.c_str(), f, 0600);
  }
  if (fd < 0) return ErrnoError(errno, "create " + path);
  Status st = PwriteFull(fd, bytes.data(), bytes.size(), 0, path);
  if (close(fd) != 0 && st.ok()) st = ErrnoError(errno, "close " + path);
  if (!st.ok()) unlink(path.c_str());
  return st;
}
}  // namespace

Status WriteSidecar(const std::string& path, std::string_view sidecar) {
  return WriteNewFile(path, sidecar, O_TRUNC, /*make_parent=*/true);
}

bool IsTornSidecar(uint64_t size) { return size < kSidecarUnit || size % kSidecarUnit != 0; }

Status WriteSidecarTmp(const std::string& tmp, std::string_view sidecar) {
  return WriteNewFile(tmp, sidecar, O_EXCL, /*make_parent=*/false);
}

Status CommitSidecar(const std::string& tmp, const std::string& path) {
  if (rename(tmp.c_str(), path.c_str()) == 0) return Status::OK();
  // ENOENT: the target's directory is missing (the source, in tmp/, was just written).
  if (errno != ENOENT) return ErrnoError(errno, "rename to " + path);
  RETURN_IF_ERROR(MakeParent(path));
  if (rename(tmp.c_str(), path.c_str()) != 0) return ErrnoError(errno, "rename to " + path);
  return Status::OK();
}

StatusOr<std::string> ReadSidecarBytes(const std::string& path, uint64_t data_len) {
  int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return Missing(errno, "open", path);
  std::string buf(SidecarLen(data_len), '\0');
  Status st = PreadFull(fd, buf.data(), buf.size(), 0, path);
  close(fd);
  RETURN_IF_ERROR(st);
  return buf;
}

Status ReadRange(const std::string& data_path, const std::vector<uint64_t>& sums, uint64_t block_offset,
                 uint64_t data_len, uint64_t offset, uint64_t length, char* out, int* keep_fd, Check check,
                 bool* checked) {
  if (checked != nullptr) *checked = false;
  if (sums.size() != Chunks(data_len)) return DataLossError(data_path + ": checksums do not cover the block");
  int fd = open(data_path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return Missing(errno, "open", data_path);
  bool verify = check == Check::kChunks || (check == Check::kNothing && out != nullptr);
  if (check == Check::kChunksUnlessAsWritten) verify = block_offset != 0 || !FileAsWritten(fd, data_len);
  Status st;
  if (verify || out != nullptr) {
    // Whole chunks covering the range are read and verified; then the range is cut out. A range of
    // whole chunks is read straight into `out`; otherwise through a buffer that is not zero-filled.
    // Unverified, only the range itself is read.
    uint64_t first = offset / kChunkSize;
    uint64_t last = (offset + length - 1) / kChunkSize;
    uint64_t span_start = verify ? first * kChunkSize : offset;
    uint64_t span_end = verify ? std::min<uint64_t>((last + 1) * kChunkSize, data_len) : offset + length;
    const bool direct = out != nullptr && span_start == offset && span_end - span_start == length;
    std::unique_ptr<char[]> buffer;
    char* span = out;
    if (!direct) {
      buffer.reset(new char[span_end - span_start]);
      span = buffer.get();
    }
    st = PreadFull(fd, span, span_end - span_start, block_offset + span_start, data_path);
    for (uint64_t c = first; verify && st.ok() && c <= last; ++c) {
      uint64_t off = c * kChunkSize - span_start;
      uint64_t len = std::min<uint64_t>(kChunkSize, data_len - c * kChunkSize);
      if (Checksum64(span + off, len) != sums[c]) {
        st = DataLossError(data_path + ": the block at offset " + std::to_string(block_offset) + ", chunk " +
                           std::to_string(c) + ", failed its checksum");
      }
    }
    if (st.ok() && out != nullptr && !direct) std::memcpy(out, span + (offset - span_start), length);
  }
  if (checked != nullptr) *checked = verify;
  if (!st.ok() || keep_fd == nullptr) {
    close(fd);
  } else {
    *keep_fd = fd;
  }
  return st;
}

namespace {

// cachestat(2) (Linux 6.5), called by number: Debian 12's headers predate it. 451 on every
// architecture (the unified syscall table).
struct CachestatRange {
  uint64_t off;
  uint64_t len;
};
struct Cachestat {
  uint64_t nr_cache;
  uint64_t nr_dirty;
  uint64_t nr_writeback;
  uint64_t nr_evicted;
  uint64_t nr_recently_evicted;
};
constexpr long kSysCachestat = 451;
std::atomic<bool> cachestat_missing{false};

}  // namespace

bool FileAsWritten(int fd, uint64_t length) {
  static const uint64_t page = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
  if (length == 0 || cachestat_missing.load(std::memory_order_relaxed)) return false;
  struct stat st {};
  if (fstat(fd, &st) != 0 || static_cast<uint64_t>(st.st_size) != length) return false;
  CachestatRange range{0, length};
  Cachestat cs{};
  if (syscall(kSysCachestat, fd, &range, &cs, 0) != 0) {
    if (errno == ENOSYS) cachestat_missing.store(true, std::memory_order_relaxed);
    return false;
  }
  // Only dirty pages count: a clean one may have been dropped and read again from the disk since
  // it was written (one under writeback counts as clean, to be sure). tmpfs, which never writes
  // pages back, reports none dirty: nothing on a MEM level reads as written.
  const uint64_t pages = (length + page - 1) / page;
  return cs.nr_cache == pages && cs.nr_dirty == pages;
}

}  // namespace granary::worker::store
