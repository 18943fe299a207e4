// What a mount shows outside the filesystem: /metrics (Render) and /readyz (Ready), the access
// trace's root-only Unix socket, and the endpoints file through which `granary stats` and
// `granary trace` find both (FuseMountImpl, fuse/mount_impl.h).
#include "fuse/mount_impl.h"

#include <dirent.h>
#include <signal.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstdlib>
#include <map>
#include <string>

#include <nlohmann/json.hpp>

#include "common/fs.h"
#include "common/metrics.h"
#include "common/stream_socket.h"
#include "fuse/client.h"
#include "fuse/errno.h"
#include "fuse/fs_state.h"
#include "fuse/trace.h"

namespace granary::fuse::internal {

// The metrics endpoint, the access trace's root-only socket (never a network port: the trace
// shows every reader's paths, pids and uids), and the file naming both for the CLI on this machine.
void FuseMountImpl::StartMetrics() {
  metrics_ = metrics::StartOrWarn(
      "fuse.metrics_listen", fs_->cfg.fuse.metrics_listen, [this](metrics::Exposition* e) { Render(e); },
      [this] { return Ready(); });
  {
    MutexLock lock(&metrics_mu_);
    metrics_address_ = metrics_ ? metrics_->address() : "";
  }
  char real[PATH_MAX];
  if (!trace_ && realpath(mountpoint_.c_str(), real) != nullptr) {
    // Named by pid too: a predecessor still serving its trace never removes its successor's socket.
    RemoveDeadTraceSockets(real);
    auto path = MountRunFile(real, "-" + std::to_string(getpid()) + ".trace.sock");
    auto t = path.ok() ? StreamSocket::Start(*path,
                                             [this](const std::map<std::string, std::string>& params,
                                                    StreamSink* sink) { fs_->tracer->Serve(params, sink); })
                       : StatusOr<std::unique_ptr<StreamSocket>>(path.status());
    if (t.ok()) {
      trace_ = std::move(t).value();
    } else {
      spdlog::warn("access trace off: {}", t.status().message());
    }
  }
  WriteEndpoints();
}
// Trace sockets of this mount point left by processes that died without stopping (kill -9).
void FuseMountImpl::RemoveDeadTraceSockets(const std::string& mountpoint) {
  auto named = MountRunFile(mountpoint, "-");
  if (!named.ok()) return;
  const std::string prefix = *named;
  const std::string dir = prefix.substr(0, prefix.rfind('/'));
  const std::string stem = prefix.substr(prefix.rfind('/') + 1);
  const std::string suffix = ".trace.sock";
  DIR* d = opendir(dir.c_str());
  if (d == nullptr) return;
  while (dirent* e = readdir(d)) {
    std::string name = e->d_name;
    if (name.size() <= stem.size() + suffix.size() || name.compare(0, stem.size(), stem) != 0 ||
        name.compare(name.size() - suffix.size(), suffix.size(), suffix) != 0) {
      continue;
    }
    std::string pid = name.substr(stem.size(), name.size() - stem.size() - suffix.size());
    char* end = nullptr;
    long p = std::strtol(pid.c_str(), &end, 10);
    if (end == nullptr || *end != '\0' || p <= 0) continue;
    if (kill(static_cast<pid_t>(p), 0) != 0 && errno == ESRCH) unlink((dir + "/" + name).c_str());
  }
  closedir(d);
}
void FuseMountImpl::StopMetrics() {
  fs_->tracer->Close();  // trace streams end, so their threads can be joined
  {
    MutexLock lock(&metrics_mu_);
    metrics_address_.clear();
  }
  metrics_.reset();
  trace_.reset();
  fs_->tracer->Reopen();
}
// RuntimeDir()/fuse-<hash>.json: where `granary stats` and `granary trace` find this mount's
// endpoints. A successor rewrites it; the last process to serve the mount removes it.
void FuseMountImpl::WriteEndpoints() {
  char real[PATH_MAX];
  if (realpath(mountpoint_.c_str(), real) == nullptr) return;
  auto file = MountEndpointsFile(real);
  if (!file.ok()) {
    spdlog::warn("granary stats will not find this mount: {}", file.status().message());
    return;
  }
  endpoints_file_ = *file;
  std::string metrics = metrics_ ? metrics_->address() : "";
  if (metrics.rfind("0.0.0.0:", 0) == 0) metrics = "127.0.0.1:" + metrics.substr(8);
  std::string worker = fs_->cfg.fuse.worker;
  nlohmann::json j = {{"mountpoint", real},          {"root", fs_->cfg.fuse.root}, {"pid", getpid()},
                      {"metrics", metrics},        {"worker", fs_->cfg.fuse.worker},
                      {"master", fs_->cfg.master.address}, {"trace", trace_ ? trace_->path() : ""}};
  Status st = WriteFileAtomic(endpoints_file_, j.dump() + "\n");  // RuntimeDir() exists once named
  if (!st.ok()) spdlog::warn("cannot write {} (granary stats will not find this mount): {}", endpoints_file_, st.message());
}
void FuseMountImpl::RemoveEndpoints() {
  if (endpoints_file_.empty()) return;
  auto text = ReadFileToString(endpoints_file_);
  if (!text.ok()) return;
  auto j = nlohmann::json::parse(*text, nullptr, false);
  if (j.is_object() && j.value("pid", 0) == getpid()) unlink(endpoints_file_.c_str());
}

void FuseMountImpl::Render(metrics::Exposition* e) {
  fs_->op_latency.Write(e, "granary_fuse_operation_duration_seconds",
                        "Time granary-fuse took to answer a kernel request, by operation.");
  e->Family("granary_fuse_errors_total", "counter", "Error replies to the kernel, by operation and errno.");
  for (const auto& [k, n] : ErrorCounts()) {
    e->Sample("granary_fuse_errors_total", {{"op", k.first}, {"errno", k.second}}, static_cast<double>(n));
  }
  e->Counter("granary_fuse_read_bytes_total", "Bytes returned to readers.", static_cast<double>(fs_->read_bytes));
  e->Counter("granary_fuse_written_bytes_total", "Bytes written to files of writable mounts (fuse/writes.h).",
             static_cast<double>(fs_->written_bytes));
  e->Counter("granary_fuse_files_committed_total",
             "Written files committed by a close() or fsync() (write=through: in the under-storage; write=back: "
             "staged for upload).",
             static_cast<double>(fs_->files_committed));
  {
    WriteFiles* w = fs_->WritesIfAny();
    e->Gauge("granary_fuse_files_being_written", "Files open for writing through this mount now.",
             w != nullptr ? static_cast<double>(w->open_files()) : 0.0);
  }
  const ClientCounters& c = fs_->client->counters();
  e->Family("granary_fuse_read_pieces_total", "counter",
            "Pieces of reads by how they came: zero_copy (a leased block file from the local worker), "
            "piped (a range of a block the local worker was fetching, through the connection's pipe), "
            "local (the local worker over gRPC), failover (another worker, the local one being down), "
            "source (read from a local under-storage's file by granary-fuse itself, fuse.source_reads).");
  e->Sample("granary_fuse_read_pieces_total", {{"source", "zero_copy"}}, static_cast<double>(c.zero_copy_pieces));
  e->Sample("granary_fuse_read_pieces_total", {{"source", "piped"}}, static_cast<double>(c.piped_pieces));
  e->Sample("granary_fuse_read_pieces_total", {{"source", "local"}}, static_cast<double>(c.local_grpc_pieces));
  e->Sample("granary_fuse_read_pieces_total", {{"source", "failover"}}, static_cast<double>(c.failover_pieces));
  e->Sample("granary_fuse_read_pieces_total", {{"source", "source"}}, static_cast<double>(c.source_reads));
  e->Counter("granary_fuse_prefetch_hints_total", "Readahead hints sent to workers.",
             static_cast<double>(c.prefetch_hints));
  e->Counter("granary_fuse_worker_waits_total",
             "Reads that found no worker able to serve them and waited for one (fuse.worker_wait).",
             static_cast<double>(c.worker_waits));
  e->Counter("granary_fuse_worker_waits_ended_total", "Of those, the reads whose wait ended with their bytes.",
             static_cast<double>(c.worker_waits_ended));
  e->Gauge("granary_fuse_keeper_holds", "1 while a keeper holds a copy of the FUSE connection (fuse.keeper).",
           fs_->keeper && fs_->keeper->deposited() ? 1 : 0);
  e->Gauge("granary_fuse_mounted", "1 while the mount is served.", loop_done_ ? 0 : 1);
  const Connection* current = fs_->current.load();
  e->Gauge("granary_fuse_open_free",
           "1 while the connection at the mount point opens files without asking granary-fuse (kernel mode, no "
           "writable dataset shown: no OPEN, RELEASE or FLUSH request).",
           current != nullptr && current->open_free ? 1 : 0);
  e->Counter("granary_fuse_connections_replaced_total",
             "Open-free connections replaced at the mount point by one that takes writes (a writable dataset shown).",
             static_cast<double>(replaced_.load()));
  e->Gauge("granary_fuse_connections_draining",
           "Replaced connections still serving what was opened through them before.", draining_live_.load());
  e->Family("granary_fuse_open_mode", "gauge",
            "The connection's read mode (fuse.open): 1 for the mode in force. fallback=\"1\" when it is not the "
            "mode asked for (the log says why).");
  bool fallback = fs_->mode != fs_->wanted || fs_->passthrough->refused();
  for (OpenMode m : {OpenMode::kDaemon, OpenMode::kKernel, OpenMode::kPassthrough}) {
    e->Sample("granary_fuse_open_mode", {{"mode", ModeName(m)}, {"fallback", fallback ? "1" : "0"}},
              fs_->mode == m ? 1 : 0);
  }
  e->Family("granary_fuse_transport", "gauge",
            "How requests reach granary-fuse (fuse.transport): 1 for the transport in force (uring only once "
            "its queues are registered).");
  std::shared_ptr<UringQueues> ring = uring();
  e->Sample("granary_fuse_transport", {{"transport", "dev"}}, ring ? 0 : 1);
  e->Sample("granary_fuse_transport", {{"transport", "uring"}}, ring ? 1 : 0);
  e->Counter("granary_fuse_uring_requests_total", "Requests served through io_uring (fuse.transport uring).",
             ring ? static_cast<double>(ring->requests()) : 0);
  e->Counter("granary_fuse_uring_commit_failures_total",
             "Replies through io_uring the kernel refused (their requests aborted meanwhile); each entry is "
             "registered again.",
             ring ? static_cast<double>(ring->commit_failures()) : 0);
  e->Counter("granary_fuse_uring_adopted_total",
             "Requests a predecessor's io_uring entries held (parked for an upgrade, or left by a crash) that "
             "this granary-fuse answered for it.",
             ring ? static_cast<double>(ring->adopted_requests()) : 0);
  e->Family("granary_fuse_opens_total", "counter",
            "Opens by how they were served: passthrough (the kernel reads the cache data file), daemon "
            "(granary-fuse serves the reads), kernel (answered once with ENOSYS; later opens never reach "
            "granary-fuse).");
  e->Sample("granary_fuse_opens_total", {{"mode", "passthrough"}}, static_cast<double>(fs_->opens_passthrough));
  e->Sample("granary_fuse_opens_total", {{"mode", "daemon"}}, static_cast<double>(fs_->opens_daemon));
  e->Sample("granary_fuse_opens_total", {{"mode", "kernel"}}, static_cast<double>(fs_->opens_kernel));
  e->Counter("granary_fuse_passthrough_misses_total",
             "Opens in passthrough mode served by granary-fuse instead: the file is empty, not wholly cached "
             "on this node's worker in one cache directory, or its inode is open in the other io mode.",
             static_cast<double>(fs_->passthrough_misses));
  e->Counter("granary_fuse_reads_by_inode_total", "Reads that came with no open file (kernel mode).",
             static_cast<double>(fs_->reads_by_inode));
  e->Counter("granary_fuse_leased_reads_total",
             "Reads answered from a read lease of the local cache's data file, without a worker round trip.",
             static_cast<double>(fs_->leased_reads));
  e->Gauge("granary_fuse_read_leases", "Files read through a read lease now (their blocks held in the local cache).",
           static_cast<double>(fs_->read_leases ? fs_->read_leases->files() : 0));
  e->Counter("granary_fuse_invalidations_total", "Files whose cached pages were dropped for a new version.",
             static_cast<double>(fs_->invalidations));
  e->Family("granary_fuse_mount_read_bytes_total", "counter",
            "Bytes granary-fuse returned to readers per mount id, by where they came from: local (this node's "
            "worker cache), peer (another worker), under_storage. Reads the kernel serves itself (page cache, "
            "passthrough) are not seen here.");
  {
    MutexLock lock(&fs_->mount_bytes_mu);
    for (const auto& [mount, b] : fs_->mount_bytes) {
      for (size_t i = 0; i < 3; ++i) {
        e->Sample("granary_fuse_mount_read_bytes_total",
                  {{"mount", std::to_string(mount)}, {"source", NodeSourceName(static_cast<NodeSource>(i))}},
                  static_cast<double>(b[i]));
      }
    }
  }
  e->Family("granary_fuse_master_call_duration_seconds", "histogram",
            "Round trip of granary-fuse's metadata calls to the master.");
  fs_->client->master_latency().Write(e, "granary_fuse_master_call_duration_seconds", {});
  e->Counter("granary_fuse_files_read_total", "Reads at offset 0 granary-fuse served: files readers started on.",
             static_cast<double>(fs_->files_read));
  e->Counter("granary_fuse_trace_records_total",
             "Access-trace records made (only while a `granary trace` listens; 0 means tracing cost nothing).",
             static_cast<double>(fs_->tracer->records()));
  e->Counter("granary_fuse_trace_dropped_total", "Access-trace records a slow listener missed.",
             static_cast<double>(fs_->tracer->dropped()));
  metrics::WriteProcessMetrics(e);
}

// Ready while serving the mount and the master answers.
Status FuseMountImpl::Ready() {
  if (handed_over_) return UnavailableError("handed the mount at " + mountpoint_ + " over to a successor");
  if (loop_done_) return UnavailableError("the mount at " + mountpoint_ + " is gone");
  return fs_->client->MasterAnswers().WithContext("the master");
}

}  // namespace granary::fuse::internal
