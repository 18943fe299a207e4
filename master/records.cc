#include "master/records.h"

namespace granary::master {

MountRecord ToRecord(const rpc::MountInfo& m) {
  MountRecord r;
  r.set_id(m.id());
  r.set_path(m.path());
  r.set_uri(m.uri());
  r.mutable_options()->insert(m.options().begin(), m.options().end());
  r.set_root_ino(m.root_ino());
  r.set_created_ns(m.created_ns());
  r.set_known_files(m.known_files());
  r.set_known_bytes(m.known_bytes());
  r.set_block_size(m.block_size());
  return r;
}

rpc::MountInfo FromRecord(const MountRecord& r) {
  rpc::MountInfo m;
  m.set_id(r.id());
  m.set_path(r.path());
  m.set_uri(r.uri());
  m.mutable_options()->insert(r.options().begin(), r.options().end());
  m.set_root_ino(r.root_ino());
  m.set_created_ns(r.created_ns());
  m.set_known_files(r.known_files());
  m.set_known_bytes(r.known_bytes());
  m.set_block_size(r.block_size());
  return m;
}

LoadJobSpecRecord ToRecord(const rpc::LoadJobSpec& s) {
  LoadJobSpecRecord r;
  r.mutable_paths()->CopyFrom(s.paths());
  r.mutable_include()->CopyFrom(s.include());
  r.mutable_exclude()->CopyFrom(s.exclude());
  r.set_replicas(s.replicas());
  r.set_metadata_only(s.metadata_only());
  r.set_parallel(s.parallel());
  r.set_bandwidth(s.bandwidth());
  r.set_fetch_ahead(s.fetch_ahead());
  return r;
}

rpc::LoadJobSpec FromRecord(const LoadJobSpecRecord& r) {
  rpc::LoadJobSpec s;
  s.mutable_paths()->CopyFrom(r.paths());
  s.mutable_include()->CopyFrom(r.include());
  s.mutable_exclude()->CopyFrom(r.exclude());
  s.set_replicas(r.replicas());
  s.set_metadata_only(r.metadata_only());
  s.set_parallel(r.parallel());
  s.set_bandwidth(r.bandwidth());
  s.set_fetch_ahead(r.fetch_ahead());
  return s;
}

LoadJobRecord ToRecord(const rpc::LoadJob& j) {
  LoadJobRecord r;
  r.set_id(j.id());
  *r.mutable_spec() = ToRecord(j.spec());
  r.set_state(static_cast<int32_t>(j.state()));
  r.set_error(j.error());
  r.set_files_total(j.files_total());
  r.set_bytes_total(j.bytes_total());
  r.set_files_done(j.files_done());
  r.set_bytes_done(j.bytes_done());
  r.set_files_failed(j.files_failed());
  r.set_blocks_fetched(j.blocks_fetched());
  r.set_bytes_fetched(j.bytes_fetched());
  r.set_blocks_cached(j.blocks_cached());
  r.set_checkpoint(j.checkpoint());
  for (const auto& f : j.failures()) {
    LoadFailureRecord* fr = r.add_failures();
    fr->set_path(f.path());
    fr->set_reason(f.reason());
  }
  r.set_created_ns(j.created_ns());
  r.set_started_ns(j.started_ns());
  r.set_finished_ns(j.finished_ns());
  r.set_paths_total(j.paths_total());
  r.set_resumed(j.resumed());
  r.set_note(j.note());
  return r;
}

rpc::LoadJob FromRecord(const LoadJobRecord& r) {
  rpc::LoadJob j;
  j.set_id(r.id());
  *j.mutable_spec() = FromRecord(r.spec());
  j.set_state(rpc::JobState_IsValid(r.state()) ? static_cast<rpc::JobState>(r.state()) : rpc::JOB_FAILED);
  j.set_error(r.error());
  j.set_files_total(r.files_total());
  j.set_bytes_total(r.bytes_total());
  j.set_files_done(r.files_done());
  j.set_bytes_done(r.bytes_done());
  j.set_files_failed(r.files_failed());
  j.set_blocks_fetched(r.blocks_fetched());
  j.set_bytes_fetched(r.bytes_fetched());
  j.set_blocks_cached(r.blocks_cached());
  j.set_checkpoint(r.checkpoint());
  for (const auto& f : r.failures()) {
    rpc::LoadFailure* w = j.add_failures();
    w->set_path(f.path());
    w->set_reason(f.reason());
  }
  j.set_created_ns(r.created_ns());
  j.set_started_ns(r.started_ns());
  j.set_finished_ns(r.finished_ns());
  j.set_paths_total(r.paths_total());
  j.set_resumed(r.resumed());
  j.set_note(r.note());
  return j;
}

}  // namespace granary::master
