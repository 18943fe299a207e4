// Conversions between what the master keeps in RocksDB (proto/meta.proto, package granary.master)
// and the wire messages (proto/granary.proto), field by field: the two schemas evolve apart, and a
// field added to one is not on the other until it is written here.
#pragma once

#include "proto/granary.pb.h"
#include "proto/meta.pb.h"

namespace granary::master {

MountRecord ToRecord(const rpc::MountInfo& m);
rpc::MountInfo FromRecord(const MountRecord& r);

LoadJobSpecRecord ToRecord(const rpc::LoadJobSpec& s);
rpc::LoadJobSpec FromRecord(const LoadJobSpecRecord& r);

LoadJobRecord ToRecord(const rpc::LoadJob& j);
rpc::LoadJob FromRecord(const LoadJobRecord& r);

}  // namespace granary::master
