// BlockFile: the on-disk format of one cached block, and the file operations on it. The block store
// (worker/block_store.h) decides where blocks go and when they leave; this file decides how their
// bytes and identity sit on disk. The format is written up in docs/block_format.md.
//
// Design
// ------
// A block is two files side by side in <level dir>/blocks/<2 hex>/:
//
//   <32 hex key>-<index>      the data: exactly the block's bytes, nothing before or after them
//   <32 hex key>-<index>.m    the sidecar: identity (file key, index, mount), length, an XXH3-64
//                             per 64 KiB chunk, and an XXH3-64 of the sidecar itself
//
// The data file holds only data so that a file which fits in one block can be given to the kernel
// as a FUSE passthrough backing file: byte N of the data file is byte N of the under-storage file
// (block index 0). Names are hashes, never object keys; files are 0600 in 0700 directories.
//
// Crash safety: both files are written under <level dir>/tmp, then the data file is renamed into
// place and the sidecar after it: the sidecar is the commit record. Removal unlinks the sidecar
// first. So after a crash, a sidecar always has its data file; a data file without a sidecar is
// debris of an interrupted write, move or removal, and Recover drops it. A sidecar whose data file
// has the wrong size, or whose own checksum fails, drops the block too.
//
// Integrity: the chunk checksums are computed from the bytes as they enter the cache. Reads that
// go through the worker (ReadRange) verify the chunks they touch; the scrub verifies all of them.
// Reads the kernel serves straight from the data file (passthrough) are not verified per read.
//
// Thread-safety: free functions, no state; the caller serialises operations on one block's files.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "common/hash.h"
#include "common/status.h"

namespace granary::worker::store {

constexpr uint32_t kChunkSize = 64 * 1024;
constexpr const char* kSidecarSuffix = ".m";

// What a sidecar says about its block.
struct Sidecar {
  FileKey key{};
  uint64_t index = 0;
  uint64_t mount_id = 0;
  uint64_t data_len = 0;
  std::vector<uint64_t> sums;  // one per chunk
};

// Bytes of the sidecar for a block of `data_len` bytes (rounded up to 4 KiB, the space a small
// file takes on disk, so quotas count what the disk spends).
uint32_t SidecarLen(uint64_t data_len);
// Bytes a block of `data_len` costs against a quota: data plus sidecar.
uint64_t BlockFileBytes(uint64_t data_len);

std::string SidecarPath(const std::string& data_path);

// The sidecar of a block whose bytes are `data`.
std::string EncodeSidecar(const FileKey& key, uint64_t index, uint64_t mount_id, std::string_view data);
// DATA_LOSS (naming `path`) when `buf` is not a whole, self-consistent sidecar.
Status DecodeSidecar(const std::string& buf, const std::string& path, Sidecar* out);

// Writes `data` and its sidecar as two new files `tmp_data` and `tmp_data`.m (0600). On error
// neither is left behind.
Status WriteTmp(const std::string& tmp_data, std::string_view data, const std::string& sidecar);
// Copies a committed block (data and sidecar) at `src` to `tmp_data` and its sidecar. DATA_LOSS
// when the source is shorter than `data_len`.
Status CopyToTmp(const std::string& src, uint64_t data_len, const std::string& tmp_data);
// Moves tmp files into place at `path` (creating its <2 hex> directory): data first, sidecar last.
Status Commit(const std::string& tmp_data, const std::string& path);
// Removes a block's files: sidecar first, then data. Missing files are fine.
void Remove(const std::string& path);

// Reads and checks the sidecar of the block at `path`, and that the data file has the length it
// names. DATA_LOSS when either is missing, torn or disagrees.
StatusOr<Sidecar> Load(const std::string& path);

// Reads [offset, offset+length) of the block at `path` (the caller clipped the range to
// `data_len`), verifying every chunk the range touches against the sidecar, which must name
// `key`/`index`. The bytes go to *out (resized). With `keep_fd`, the open data file is returned
// there (the caller closes it) so a reader can splice exactly what was verified.
// DATA_LOSS on any mismatch, and when a file vanished; other errors are I/O errors.
Status ReadRange(const std::string& path, const FileKey& key, uint64_t index, uint64_t data_len, uint64_t offset,
                 uint64_t length, std::string* out, int* keep_fd);

}  // namespace granary::worker::store
