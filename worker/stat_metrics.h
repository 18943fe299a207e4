// The worker's plain counters and gauges on /metrics, written once: each names the WorkerStats
// field that holds it (what GetStats, heartbeats and `granary report --json` carry, the JSON by
// reflection), so adding a counter is a proto field, a line in WorkerServer::Stats() and a row
// here. Families with labels (block reads by source, tiers, mounts) are rendered by hand.
#pragma once

#include <google/protobuf/descriptor.h>
#include <google/protobuf/message.h>

#include <cstdint>

#include "proto/granary.pb.h"

namespace granary::worker {

struct StatMetric {
  const char* field;   // an integer field of rpc::WorkerStats
  const char* metric;  // Prometheus name
  bool gauge;          // else a counter
  const char* help;
};

inline constexpr StatMetric kStatMetrics[] = {
    {"misses", "granary_worker_cache_misses_total", false, "Block reads that missed this worker's cache."},
    {"bytes_served", "granary_worker_served_bytes_total", false, "Bytes served to readers and peers."},
    {"peer_bytes", "granary_worker_peer_bytes_total", false, "Bytes fetched from peer workers."},
    {"ufs_bytes", "granary_worker_ufs_read_bytes_total", false, "Bytes read from the under-storage."},
    {"ufs_reads", "granary_worker_ufs_requests_total", false, "Read calls to the under-storage."},
    {"ufs_errors", "granary_worker_ufs_errors_total", false,
     "Under-storage fetches that failed (after the client's retries)."},
    {"passthrough_leases", "granary_worker_passthrough_leases_total", false,
     "Whole data files leased to the local FUSE client for passthrough opens (the kernel then reads them "
     "without asking)."},
    {"peer_served", "granary_worker_peer_served_total", false, "Block requests served to peer workers."},
    {"peer_failovers", "granary_worker_peer_failovers_total", false,
     "Peer calls that failed and went to the next worker."},
    {"coalesced", "granary_worker_coalesced_reads_total", false, "Misses that joined a fetch already in flight."},
    {"prefetched", "granary_worker_prefetched_blocks_total", false, "Blocks fetched ahead of readers."},
    {"hints_freed", "granary_worker_hints_freed_total", false,
     "Readahead hints and fills dropped because a free of their block ran after they were asked."},
    {"loaded_blocks", "granary_worker_loaded_blocks_total", false, "Blocks fetched by load jobs."},
    {"loaded_bytes", "granary_worker_loaded_bytes_total", false, "Bytes fetched by load jobs."},
    {"corrupt_blocks", "granary_worker_corrupt_blocks_total", false,
     "Cached blocks that failed their checksum and were dropped."},
    {"scrubbed_blocks", "granary_worker_scrubbed_blocks_total", false, "Cached blocks the scrub read and verified."},
    {"reads_as_written", "granary_worker_reads_as_written_total", false,
     "Cache reads not checked against their checksums: a zero-copy lease of a block this worker wrote within "
     "worker.trust_own_writes, or every page was still dirty from that write (never read back from the disk)."},
    {"rejected", "granary_worker_rejected_blocks_total", false, "Blocks not cached for want of evictable space."},
    {"pinned_blocks", "granary_worker_pinned_blocks", true, "Cached blocks that are pinned."},
    {"elastic_blocks", "granary_worker_elastic_blocks", true,
     "Cached blocks held as elastic copies (beyond the block's cache.replicas holders; evicted first)."},
    {"elastic_bytes", "granary_worker_elastic_bytes", true, "Data bytes of the elastic copies."},
    {"elastic_peer_bytes", "granary_worker_elastic_peer_bytes_total", false,
     "Bytes copied from peer workers into elastic copies."},
    {"peers", "granary_worker_peers", true, "Live workers this worker places blocks over, itself included."},
    {"ufs_retries", "granary_worker_ufs_retries_total", false,
     "Under-storage attempts beyond the first of a call (retries; divide by ufs_calls for retries per request)."},
    {"ufs_calls", "granary_worker_ufs_calls_total", false, "Under-storage calls of every kind (stat, list, read)."},
    {"ahead_blocks", "granary_worker_fetch_ahead_blocks_total", false,
     "Blocks fetched ahead of an epoch's readers (fetch-ahead)."},
    {"ahead_bytes", "granary_worker_fetch_ahead_bytes_total", false, "Bytes fetched ahead of an epoch's readers."},
    {"ahead_no_room", "granary_worker_fetch_ahead_no_room_total", false,
     "Fetch-ahead blocks skipped for want of free room (fetch-ahead never evicts)."},
    {"range_reads", "granary_worker_range_reads_total", false,
     "Small misses answered from a ranged under-storage read of their own bytes (range first)."},
    {"streamed", "granary_worker_streamed_reads_total", false,
     "Misses of part of a large block answered as soon as their range arrived from the under-storage, before the whole block (streaming)."},
    {"previous_home_blocks", "granary_worker_previous_home_blocks_total", false,
     "Blocks this worker, their new home after a join, copied from their previous home instead of the under-storage."},
    {"ahead_target", "granary_worker_fetch_ahead_target", true,
     "Under-storage fetches in flight the pacer allows now: 2 x measured bandwidth x latency / request size."},
    {"ahead_inflight", "granary_worker_fetch_ahead_inflight", true, "Fetch-ahead fetches in flight."},
    {"demand_inflight", "granary_worker_demand_fetches_inflight", true,
     "Demand-miss fetches from the under-storage in flight (fetch-ahead yields its slots to them)."},
    {"writeback_files", "granary_worker_writeback_backlog_files", true,
     "Files written with write=back, staged on this node and not uploaded yet (they survive restarts)."},
    {"writeback_bytes", "granary_worker_writeback_backlog_bytes", true, "Bytes of the write=back backlog."},
    {"uploaded_files", "granary_worker_uploaded_files_total", false,
     "Written files this worker uploaded to the under-storage (write=through at close, write=back in the background)."},
    {"uploaded_bytes", "granary_worker_uploaded_bytes_total", false, "Bytes of those files."},
    {"upload_failures", "granary_worker_upload_failures_total", false,
     "Background (write=back) uploads that failed (each is retried with backoff; its bytes stay staged)."},
    {"write_sessions", "granary_worker_write_sessions", true, "Files being written through this node now."},
    {"ufs_bandwidth_estimate", "granary_worker_ufs_bandwidth_estimate_bytes", true,
     "The pacer's estimate of the under-storage bandwidth (bytes/s; the largest 250 ms window of the last 2 s)."},
};

// The value of integer field `field` of `s`; -1 when WorkerStats has no such integer field.
inline double StatValue(const rpc::WorkerStats& s, const char* field) {
  using FD = google::protobuf::FieldDescriptor;
  const FD* f = rpc::WorkerStats::descriptor()->FindFieldByName(field);
  if (f == nullptr || f->is_repeated()) return -1;
  const auto* r = s.GetReflection();
  switch (f->cpp_type()) {
    case FD::CPPTYPE_UINT64: return static_cast<double>(r->GetUInt64(s, f));
    case FD::CPPTYPE_UINT32: return static_cast<double>(r->GetUInt32(s, f));
    default: return -1;
  }
}

}  // namespace granary::worker
