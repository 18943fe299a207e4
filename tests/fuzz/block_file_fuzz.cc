// Fuzzes the block file format and its recovery (worker/store/block_file.h, docs/block_format.md):
// a sidecar of any bytes is decoded (DecodeSidecar: a whole, self-consistent sidecar or DATA_LOSS),
// and then the same bytes are put on disk as a block's sidecar beside a data file, where
// BlockStore::Open must rebuild its index without crashing, keep only what verifies, and serve
// reads of what it kept that check out (a block it keeps reads back its checksummed bytes).
#include <fcntl.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <string>

#include "common/hash.h"
#include "worker/block_store.h"
#include "worker/store/block_file.h"

using namespace granary;
namespace store = granary::worker::store;

namespace {

void WriteFile(const std::string& path, std::string_view bytes) {
  int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) std::abort();
  if (write(fd, bytes.data(), bytes.size()) != static_cast<ssize_t>(bytes.size())) std::abort();
  close(fd);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size > 256 * 1024) return 0;
  const std::string bytes(reinterpret_cast<const char*>(data), size);
  const FileKey key = MakeFileKey("s3://bucket", "dir/file", "\"etag\"");
  const std::string dir = std::filesystem::temp_directory_path().string() + "/granary-fuzz-blocks-" +
                          std::to_string(getpid());
  std::filesystem::remove_all(dir);

  // 1. The decoder alone: whatever it accepts is self-consistent.
  store::Sidecar sc;
  if (store::DecodeSidecar(bytes, "fuzz.m", &sc).ok()) {
    const uint64_t chunks = (sc.data_len + store::kChunkSize - 1) / store::kChunkSize;
    if (sc.sums.size() != chunks) std::abort();
  }

  // 2. Recovery: the bytes as the sidecar of block 0 of `key`, beside a data file whose first
  // 64 KiB hold the input again (so a sidecar naming their checksum can be valid).
  {
    auto s = worker::BlockStore::Open(dir, 64ull << 20);
    if (!s.ok()) std::abort();
  }
  std::string payload = bytes.substr(0, std::min<size_t>(bytes.size(), store::kChunkSize));
  std::string data_path = store::DataPath(dir, key);
  std::filesystem::create_directories(std::filesystem::path(data_path).parent_path());
  WriteFile(data_path, payload);
  WriteFile(store::SidecarPath(dir, key, 0), bytes);
  // Also a well-formed sidecar for those bytes at block 1, so the happy path is covered too.
  WriteFile(store::SidecarPath(dir, key, 1),
            store::EncodeSidecar(key, 1, 7, 0, payload.size(), store::ChunkSums(payload)));
  {
    auto s = worker::BlockStore::Open(dir, 64ull << 20);
    if (!s.ok()) std::abort();
    for (uint64_t index : {0, 1}) {
      worker::BlockId id{key, index};
      std::string out(payload.size() + 1, '\0');
      auto n = (*s)->Read(id, 0, payload.size(), out.data());
      // A block it serves is exactly the bytes its checksums name.
      if (n.ok() && *n > 0 && out.compare(0, *n, payload, 0, *n) != 0 && index == 1) std::abort();
    }
  }
  std::filesystem::remove_all(dir);
  return 0;
}
