// MetaStore: the master's records that are not the namespace — load jobs (J...), pinned paths
// (P<path>) and the live workers (W/members) — in the namespace's RocksDB and written through its
// journal, so a standby holds them too and a new leader starts from them. The job manager
// (master/jobs.h), the cache admin (pins, master/cache_admin.h) and the server (members) use it
// directly; what the records mean is theirs.
//
// Thread-safe: each call is one RocksDB read or one journal commit (Journal::Commit serialises
// writers; a writer owes Journal::WaitReplicated like any other, master/journal.h).
#pragma once

#include <rocksdb/db.h>

#include <functional>
#include <map>
#include <string>
#include <vector>

#include "common/hash.h"
#include "common/status.h"
#include "master/journal.h"
#include "proto/meta.pb.h"

namespace granary::master {

class MetaStore {
 public:
  // `db` and `journal` (over the same db) outlive this.
  MetaStore(rocksdb::DB* db, Journal* journal) : db_(db), journal_(journal) {}

  // Load jobs' records (master/jobs.h owns their meaning).
  Status PutJobRecord(const std::string& key, const std::string& value);
  StatusOr<std::string> GetJobRecord(const std::string& key) const;  // NOT_FOUND when absent
  Status ForEachJobRecord(const std::string& prefix,
                          const std::function<void(const std::string& key, const std::string& value)>& fn) const;

  // The live workers (master/cluster.h), kept for a standby that takes over.
  Status PutMembers(const MembersRecord& r);
  StatusOr<MembersRecord> GetMembers() const;  // empty when none was written

  // Pinned paths (canonical, like /imagenet/train) and the FileKeys they cover.
  Status PutPin(const std::string& path, const std::vector<FileKey>& keys);
  Status DeletePin(const std::string& path);
  StatusOr<std::map<std::string, std::vector<FileKey>>> Pins() const;

 private:
  rocksdb::DB* const db_;
  Journal* const journal_;
};

}  // namespace granary::master
