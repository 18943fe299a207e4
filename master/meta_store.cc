#include "master/meta_store.h"

#include <rocksdb/write_batch.h>

#include <memory>

#include "common/keys.h"

namespace granary::master {

Status MetaStore::PutJobRecord(const std::string& key, const std::string& value) {
  rocksdb::WriteBatch batch;
  batch.Put("J" + key, value);
  return journal_->Commit(&batch).WithContext("record job");
}

StatusOr<std::string> MetaStore::GetJobRecord(const std::string& key) const {
  std::string v;
  rocksdb::Status s = db_->Get({}, "J" + key, &v);
  if (s.IsNotFound()) return NotFoundError("no job record " + key);
  RETURN_IF_ERROR(FromRocks(s, "read job"));
  return v;
}

Status MetaStore::ForEachJobRecord(const std::string& prefix,
                                   const std::function<void(const std::string&, const std::string&)>& fn) const {
  std::unique_ptr<rocksdb::Iterator> it(db_->NewIterator({}));
  const std::string p = "J" + prefix;
  for (it->Seek(p); it->Valid() && it->key().starts_with(p); it->Next()) {
    fn(it->key().ToString().substr(1), it->value().ToString());
  }
  return FromRocks(it->status(), "list jobs");
}

Status MetaStore::PutMembers(const MembersRecord& r) {
  rocksdb::WriteBatch batch;
  batch.Put("W/members", r.SerializeAsString());
  return journal_->Commit(&batch).WithContext("record the workers");
}

StatusOr<MembersRecord> MetaStore::GetMembers() const {
  std::string v;
  MembersRecord r;
  rocksdb::Status s = db_->Get({}, "W/members", &v);
  if (s.IsNotFound()) return r;
  RETURN_IF_ERROR(FromRocks(s, "read the workers"));
  if (!r.ParseFromString(v)) return DataLossError("the master's database holds a malformed worker list");
  return r;
}

Status MetaStore::PutPin(const std::string& path, const std::vector<FileKey>& keys) {
  std::string v;
  v.reserve(keys.size() * 16);
  for (const auto& k : keys) v += FileKeyBytes(k);
  rocksdb::WriteBatch batch;
  batch.Put("P" + path, v);
  return journal_->Commit(&batch).WithContext("record pin");
}

Status MetaStore::DeletePin(const std::string& path) {
  rocksdb::WriteBatch batch;
  batch.Delete("P" + path);
  return journal_->Commit(&batch).WithContext("remove pin");
}

StatusOr<std::map<std::string, std::vector<FileKey>>> MetaStore::Pins() const {
  std::map<std::string, std::vector<FileKey>> out;
  std::unique_ptr<rocksdb::Iterator> it(db_->NewIterator({}));
  for (it->Seek("P"); it->Valid() && it->key().starts_with("P"); it->Next()) {
    auto& keys = out[it->key().ToString().substr(1)];
    for (size_t off = 0; off + 16 <= it->value().size(); off += 16) {
      FileKey k;
      if (FileKeyFromBytes(std::string_view(it->value().data() + off, 16), &k)) keys.push_back(k);
    }
  }
  RETURN_IF_ERROR(FromRocks(it->status(), "list pins"));
  return out;
}

}  // namespace granary::master
