// BlockFile: the on-disk format of cached blocks, and the file operations on them. The block store
// (worker/block_store.h) decides where blocks go and when they leave; this file decides how their
// bytes and identity sit on disk. The format is written up in docs/block_format.md.
//
// Design
// ------
// The blocks of one under-storage file (one version of it) that a cache directory holds share one
// data file, each at its own offset in the file; each block has a sidecar of its own:
//
//   <dir>/blocks/<2 hex>/<32 hex key>            data: block i's bytes at i x block_size, holes elsewhere
//   <dir>/blocks/<2 hex>/<32 hex key>-<index>.m  sidecar: identity (file key, index, mount, offset),
//                                                length, an XXH3-64 per 64 KiB chunk, and an
//                                                XXH3-64 of the sidecar itself
//
// Byte N of a data file is byte N of the under-storage file, so a file whose blocks are all cached
// in one directory can be given to the kernel as a FUSE passthrough backing file: the kernel then
// serves read, pread and mmap straight from it. Names are hashes, never object keys; files are
// 0600 in 0700 directories.
//
// Crash safety: a block's bytes are written into its range of the data file, then its sidecar is
// written at its name (a block being put is in no index entry, so nothing else touches that name;
// a move between levels writes it under <dir>/tmp and renames it into place): the sidecar is the
// commit record; one cut short by a crash (not a whole number of 4 KiB units) is debris. Removal
// unlinks the sidecar first, then punches the range out of the data file (and unlinks the data
// file with its last block). After a crash, a range without a sidecar is garbage nobody reads, and
// a data file without any sidecar is removed at start (BlockStore::ScanDir). A sidecar whose own
// checksum fails, or whose range lies past its data file's end, drops the block.
//
// Integrity: chunk checksums are computed from the bytes as they enter the cache, written to the
// sidecar, and kept in memory by the store (read back from the verified sidecar at start). Reads
// that go through the worker (ReadRange) verify the chunks they touch, except where every page is
// still dirty from this worker's own write of the block (FileAsWritten: the bytes never left
// memory); the scrub verifies all of them. Reads the kernel serves from the data file
// (passthrough) are not verified per read.
//
// Thread-safety: free functions, no state. Writers of one data file touch disjoint ranges; the
// store decides when a data file may be unlinked.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "common/hash.h"
#include "common/status.h"

namespace granary::worker::store {

constexpr uint32_t kChunkSize = 64 * 1024;
constexpr uint32_t kSidecarUnit = 4096;  // a sidecar's length is a whole number of these

// What a sidecar says about its block.
struct Sidecar {
  FileKey key{};
  uint64_t index = 0;
  uint64_t mount_id = 0;
  uint64_t offset = 0;  // where the block's bytes start in the data file (index x block size)
  uint64_t data_len = 0;
  std::vector<uint64_t> sums;  // one per chunk
};

// Bytes of a sidecar for a block of `data_len` bytes (a multiple of 4 KiB: what a small file costs
// on disk, so quotas count what the disk spends).
uint32_t SidecarLen(uint64_t data_len);
// Bytes a block of `data_len` costs against a quota: its data plus its sidecar.
uint64_t BlockFileBytes(uint64_t data_len);

// <dir>/blocks/<2 hex>/<32 hex key> and <...>-<index>.m.
std::string DataPath(const std::string& dir, const FileKey& key);
std::string SidecarPath(const std::string& dir, const FileKey& key, uint64_t index);
// Parses a name in blocks/<2 hex>/: a data file (true, *index untouched) or a sidecar (true, with
// *index and *sidecar set); false for anything else.
bool ParseName(const std::string& name, FileKey* key, uint64_t* index, bool* sidecar);

// XXH3-64 of each 64 KiB chunk of `data`.
std::vector<uint64_t> ChunkSums(std::string_view data);
// The sidecar of a block of `data_len` bytes whose chunk checksums are `sums` (ChunkSums).
std::string EncodeSidecar(const FileKey& key, uint64_t index, uint64_t mount_id, uint64_t offset, uint64_t data_len,
                          const std::vector<uint64_t>& sums);
// DATA_LOSS (naming `path`) when `buf` is not a whole, self-consistent sidecar.
Status DecodeSidecar(const std::string& buf, const std::string& path, Sidecar* out);
// Reads and decodes the sidecar at `path`.
StatusOr<Sidecar> ReadSidecar(const std::string& path);

// Blocks of at least this many bytes are written around the page cache (WriteData's `direct`):
// see WriteData.
constexpr uint64_t kDirectMinBytes = 1 << 20;
// Writes `data` at `offset` of the data file (created 0600 with its directory when missing).
// With `direct`, the 4 KiB-aligned part goes with O_DIRECT when `data` and `offset` are 4 KiB
// aligned: the bytes go from `data` to the device with no copy into the page cache (a 4 MiB block
// cost ~25x the CPU through the page cache, docs/benchmarks.md session 38) and the cache holds no
// second copy of what the FUSE mount's page cache keeps; the tail, and every write on a file system
// that refuses O_DIRECT (tmpfs before Linux 6.6, EINVAL), go through the page cache. A later read
// of the range comes from the device.
Status WriteData(const std::string& data_path, uint64_t offset, std::string_view data, bool direct = false);
// Copies [offset, offset+len) of one data file into the same range of another.
Status CopyData(const std::string& src, const std::string& dst, uint64_t offset, uint64_t len);
// Frees [offset, offset+len) of a data file (a hole; the file keeps its size). Best effort.
void PunchData(const std::string& data_path, uint64_t offset, uint64_t len);
// Writes a sidecar at its own name `path` (a Put's commit: the block's data was written first;
// the caller owns the name, see BlockStore::Put). A failed write leaves no file. A crash in the
// middle mostly leaves a sidecar shorter than kSidecarUnit or not a multiple of it, which recovery
// discards as an interrupted write (IsTornSidecar); one of full length whose bytes did not all
// reach the disk fails its own checksum and is discarded as corrupt.
Status WriteSidecar(const std::string& path, std::string_view sidecar);
// Whether a sidecar file of `size` bytes can only be an interrupted WriteSidecar (every sidecar
// is a whole number of kSidecarUnit bytes, at least one).
bool IsTornSidecar(uint64_t size);
// Writes a sidecar as a new file `tmp`, then renames it to `path` (a move's commit: the block's
// old copy elsewhere goes only once this one is in place).
Status WriteSidecarTmp(const std::string& tmp, std::string_view sidecar);
Status CommitSidecar(const std::string& tmp, const std::string& path);
// The sidecar file's bytes (for a move: copied as they are).
StatusOr<std::string> ReadSidecarBytes(const std::string& path, uint64_t data_len);

// How much of a range ReadRange checks against its chunk sums.
enum class Check {
  kChunks,  // every chunk the range touches is read and verified
  // As kChunks, unless the block is its data file's only content and every page of it is still the
  // one this worker wrote (FileAsWritten):
  // those bytes never left memory since their sums were computed from them, so nothing is checked
  // (a lease reads nothing; a copy is made without hashing). Only for a block whose sums were
  // computed from the very bytes this process wrote into its range (BlockStore::Put; not a block
  // moved between levels by copying, nor one found at start).
  kChunksUnlessAsWritten,
  // A lease only: nothing read (a block whose sums were computed from its bytes an instant ago, or
  // put by this process within StoreOptions::trust_own_writes).
  kNothing,
};

// Reads [offset, offset+length) of a block (relative to the block; the caller clipped the range to
// its length `data_len`) from its data file, verifying the chunks the range touches against
// `sums` (the block's chunk checksums, as its sidecar holds them) as `check` says. The `length`
// bytes go to `out` unless it is null (on an error its content is unspecified). With `keep_fd`, the
// open data file is returned there (the caller closes it) so a reader can splice exactly what was
// verified, at block_offset + offset. DATA_LOSS on any mismatch and when the file vanished.
// kNothing with out null opens the file and reads nothing; with `out` the chunks are always read
// and verified. `*checked` (when given) says whether chunks were verified.
Status ReadRange(const std::string& data_path, const std::vector<uint64_t>& sums, uint64_t block_offset,
                 uint64_t data_len, uint64_t offset, uint64_t length, char* out, int* keep_fd,
                 Check check = Check::kChunks, bool* checked = nullptr);

// Whether the open data file `fd` is exactly `length` bytes long and every page of it is in the
// page cache and dirty: written by a write(2) and not written back yet, so its bytes are the ones
// written and were never read back from the disk (bit rot happens on the medium; only root can
// write the cache's files). Only a whole file: the page cache tracks dirtiness per folio (up to
// 2 MiB), and a folio shared with another block's range may have been read back from the disk
// when that block was written. false on tmpfs (a MEM level), which never writes pages back and
// reports none dirty. false when the kernel has no cachestat(2) (Linux before 6.5) or refuses it.
// Costs two system calls, no read.
bool FileAsWritten(int fd, uint64_t length);

}  // namespace granary::worker::store
