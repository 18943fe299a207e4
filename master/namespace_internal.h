// What the files of Namespace (master/namespace*.cc) share and nobody else uses: the RocksDB key
// layout of the namespace's records, and small helpers. Not part of the master's interface.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "common/keys.h"
#include "common/path.h"
#include "common/status.h"
#include "proto/granary.pb.h"
#include "proto/meta.pb.h"

namespace granary::master::nsdetail {

// Keys: I<ino> an inode record, E<parent><name> a directory entry, C<parent><child> a child in
// listing order, M<id> a mount, L<mount><ino> a bulk load's cursor, R<ino> a directory rename
// under way, S/... counters. (J, P and W/ are the MetaStore's: master/meta_store.h.)

inline std::string InodeKey(uint64_t ino) { return "I" + Be64(ino); }
inline std::string EntryKey(uint64_t parent, const std::string& name) { return "E" + Be64(parent) + name; }
inline std::string ChildKey(uint64_t parent, uint64_t child) { return "C" + Be64(parent) + Be64(child); }
inline std::string MountKey(uint64_t id) { return "M" + Be64(id); }
inline std::string CursorKey(uint64_t mount_id, uint64_t ino) { return "L" + Be64(mount_id) + Be64(ino); }
inline std::string RenameKey(uint64_t ino) { return "R" + Be64(ino); }
inline constexpr char kNextIno[] = "S/next_ino";
inline constexpr char kNextMount[] = "S/next_mount";
inline constexpr char kFreeStamps[] = "S/free_stamps";
inline constexpr uint64_t kFreeStampBlock = 1 << 20;  // reserved at once

inline int64_t NowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// A file made by PrepareCreate whose first commit has not come (no version yet), made less than a
// day ago: syncs leave it alone (the store has nothing of it yet).
inline bool IsPendingWrite(const InodeRecord& r, int64_t now_ns) {
  constexpr int64_t kPendingNs = 24LL * 3600 * 1'000'000'000;
  return r.type() == rpc::REGULAR && r.version().empty() && now_ns - r.synced_ns() < kPendingNs;
}

// Splits "/a/b" into {"a", "b"}; fails on anything that is not a clean absolute path.
inline StatusOr<std::vector<std::string>> SplitPath(const std::string& path) {
  if (path.empty() || path[0] != '/') return InvalidArgumentError("'" + path + "' is not an absolute path");
  std::vector<std::string> parts;
  size_t start = 1;
  while (start < path.size()) {
    size_t end = path.find('/', start);
    if (end == std::string::npos) end = path.size();
    std::string part = path.substr(start, end - start);
    if (!part.empty() || end != path.size()) {
      if (!IsValidName(part)) return InvalidArgumentError("'" + path + "' is not a valid path");
      parts.push_back(std::move(part));
    }
    start = end + 1;
  }
  return parts;
}

inline rpc::FileInfo FileInfoOf(const InodeRecord& r, rpc::Attr attr) {
  rpc::FileInfo f;
  *f.mutable_attr() = std::move(attr);
  f.set_mount_id(r.mount_id());
  f.set_ufs_path(r.ufs_path());
  f.set_version(r.version());
  f.set_block_size(r.block_size());
  return f;
}

}  // namespace granary::master::nsdetail
