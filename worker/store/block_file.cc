#include "worker/store/block_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

namespace granary::worker::store {
namespace {

// "GRNBLK02": version 2 of the block format (version 1 kept the header in front of the data).
constexpr char kMagic[8] = {'G', 'R', 'N', 'B', 'L', 'K', '0', '2'};
constexpr size_t kFixed = 8 + 4 + 4 + 16 + 8 + 8 + 8 + 4 + 4;  // 64 bytes before the chunk sums

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

Status WriteNew(const std::string& path, std::string_view bytes) {
  int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0) return ErrnoError(errno, "create " + path);
  Status st = WriteFull(fd, bytes.data(), bytes.size(), path);
  if (close(fd) != 0 && st.ok()) st = ErrnoError(errno, "close " + path);
  if (!st.ok()) unlink(path.c_str());
  return st;
}

// The whole of a file that should be `len` bytes long (DATA_LOSS when it is not).
Status ReadExactly(const std::string& path, uint64_t len, std::string* out) {
  int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    return errno == ENOENT ? DataLossError(path + " vanished from the cache") : ErrnoError(errno, "open " + path);
  }
  struct stat st {};
  Status s;
  if (fstat(fd, &st) != 0) {
    s = ErrnoError(errno, "stat " + path);
  } else if (static_cast<uint64_t>(st.st_size) != len) {
    s = DataLossError(path + ": " + std::to_string(st.st_size) + " bytes where " + std::to_string(len) +
                      " were expected");
  } else {
    out->resize(len);
    s = PreadFull(fd, out->data(), len, 0, path);
  }
  close(fd);
  return s;
}

StatusOr<Sidecar> ReadSidecar(const std::string& path, uint64_t* file_size) {
  std::string mpath = SidecarPath(path);
  int fd = open(mpath.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    return errno == ENOENT ? DataLossError(mpath + " vanished from the cache") : ErrnoError(errno, "open " + mpath);
  }
  struct stat st {};
  fstat(fd, &st);
  if (file_size) *file_size = static_cast<uint64_t>(st.st_size);
  std::string buf(std::min<uint64_t>(static_cast<uint64_t>(st.st_size), 64 * 1024), '\0');
  Status s = PreadFull(fd, buf.data(), buf.size(), 0, mpath);
  close(fd);
  RETURN_IF_ERROR(s);
  Sidecar sc;
  RETURN_IF_ERROR(DecodeSidecar(buf, mpath, &sc));
  return sc;
}

}  // namespace

uint32_t SidecarLen(uint64_t data_len) {
  uint64_t raw = kFixed + 8 * Chunks(data_len) + 8;
  return static_cast<uint32_t>((raw + 4095) / 4096 * 4096);
}

uint64_t BlockFileBytes(uint64_t data_len) { return SidecarLen(data_len) + data_len; }

std::string SidecarPath(const std::string& data_path) { return data_path + kSidecarSuffix; }

std::string EncodeSidecar(const FileKey& key, uint64_t index, uint64_t mount_id, std::string_view data) {
  uint32_t len = SidecarLen(data.size());
  uint32_t nchunks = static_cast<uint32_t>(Chunks(data.size()));
  std::string h;
  h.reserve(len);
  h.append(kMagic, sizeof kMagic);
  Append<uint32_t>(&h, len);
  Append<uint32_t>(&h, kChunkSize);
  h.append(reinterpret_cast<const char*>(key.data()), key.size());
  Append<uint64_t>(&h, index);
  Append<uint64_t>(&h, mount_id);
  Append<uint64_t>(&h, data.size());
  Append<uint32_t>(&h, nchunks);
  Append<uint32_t>(&h, 0);
  for (uint32_t c = 0; c < nchunks; ++c) {
    size_t off = static_cast<size_t>(c) * kChunkSize;
    Append<uint64_t>(&h, Checksum64(data.data() + off, std::min<size_t>(kChunkSize, data.size() - off)));
  }
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
  out->data_len = Get<uint64_t>(p + 40);
  uint32_t nchunks = Get<uint32_t>(p + 48);
  if (chunk != kChunkSize || len != SidecarLen(out->data_len) || nchunks != Chunks(out->data_len) ||
      buf.size() < len) {
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

Status WriteTmp(const std::string& tmp_data, std::string_view data, const std::string& sidecar) {
  RETURN_IF_ERROR(WriteNew(tmp_data, data));
  Status st = WriteNew(SidecarPath(tmp_data), sidecar);
  if (!st.ok()) unlink(tmp_data.c_str());
  return st;
}

Status CopyToTmp(const std::string& src, uint64_t data_len, const std::string& tmp_data) {
  std::string data, sidecar;
  RETURN_IF_ERROR(ReadExactly(src, data_len, &data));
  RETURN_IF_ERROR(ReadExactly(SidecarPath(src), SidecarLen(data_len), &sidecar));
  return WriteTmp(tmp_data, data, sidecar);
}

Status Commit(const std::string& tmp_data, const std::string& path) {
  std::string sub = path.substr(0, path.rfind('/'));
  if (mkdir(sub.c_str(), 0700) != 0 && errno != EEXIST) return ErrnoError(errno, "mkdir " + sub);
  if (rename(tmp_data.c_str(), path.c_str()) != 0) return ErrnoError(errno, "rename to " + path);
  if (rename(SidecarPath(tmp_data).c_str(), SidecarPath(path).c_str()) != 0) {
    Status st = ErrnoError(errno, "rename to " + SidecarPath(path));
    unlink(path.c_str());
    return st;
  }
  return Status::OK();
}

void Remove(const std::string& path) {
  unlink(SidecarPath(path).c_str());
  unlink(path.c_str());
}

StatusOr<Sidecar> Load(const std::string& path) {
  uint64_t msize = 0;
  ASSIGN_OR_RETURN(Sidecar sc, ReadSidecar(path, &msize));
  if (msize != SidecarLen(sc.data_len)) return DataLossError(SidecarPath(path) + ": wrong size");
  struct stat st {};
  if (stat(path.c_str(), &st) != 0) {
    return errno == ENOENT ? DataLossError(path + ": data file missing") : ErrnoError(errno, "stat " + path);
  }
  if (static_cast<uint64_t>(st.st_size) != sc.data_len) {
    return DataLossError(path + ": " + std::to_string(st.st_size) + " bytes of data where the sidecar says " +
                         std::to_string(sc.data_len));
  }
  return sc;
}

Status ReadRange(const std::string& path, const FileKey& key, uint64_t index, uint64_t data_len, uint64_t offset,
                 uint64_t length, std::string* out, int* keep_fd) {
  ASSIGN_OR_RETURN(Sidecar sc, ReadSidecar(path, nullptr));
  if (sc.key != key || sc.index != index || sc.data_len != data_len) {
    return DataLossError(SidecarPath(path) + ": sidecar names another block");
  }
  int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    return errno == ENOENT ? DataLossError(path + " vanished from the cache") : ErrnoError(errno, "open " + path);
  }
  // Whole chunks covering the range are read and verified; then the range is cut out.
  uint64_t first = offset / kChunkSize;
  uint64_t last = (offset + length - 1) / kChunkSize;
  uint64_t span_start = first * kChunkSize;
  uint64_t span_end = std::min<uint64_t>((last + 1) * kChunkSize, data_len);
  std::string span(span_end - span_start, '\0');
  Status st = PreadFull(fd, span.data(), span.size(), span_start, path);
  for (uint64_t c = first; st.ok() && c <= last; ++c) {
    uint64_t off = c * kChunkSize - span_start;
    uint64_t len = std::min<uint64_t>(kChunkSize, data_len - c * kChunkSize);
    if (Checksum64(span.data() + off, len) != sc.sums[c]) {
      st = DataLossError(path + ": chunk " + std::to_string(c) + " failed its checksum");
    }
  }
  if (!st.ok() || keep_fd == nullptr) {
    close(fd);
  } else {
    *keep_fd = fd;
  }
  RETURN_IF_ERROR(st);
  if (span_start == offset && span.size() == length) {
    *out = std::move(span);
  } else {
    out->assign(span, offset - span_start, length);
  }
  return Status::OK();
}

}  // namespace granary::worker::store
