#include "fuse/trace.h"

#include <cstring>
#include <ctime>
#include <list>
#include <unordered_map>
#include <vector>

#include <nlohmann/json.hpp>

namespace granary::fuse {
namespace {

std::string ErrName(int err) {
  if (err == 0) return "ok";
  const char* n = strerrorname_np(err);
  return n ? n : "E" + std::to_string(err);
}

std::string IsoTime(int64_t ns) {
  time_t s = static_cast<time_t>(ns / 1'000'000'000);
  struct tm tm;
  gmtime_r(&s, &tm);
  char buf[64];
  size_t n = strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%S", &tm);
  std::snprintf(buf + n, sizeof buf - n, ".%06lldZ", static_cast<long long>((ns % 1'000'000'000) / 1000));
  return buf;
}

// What one listener wants to see.
struct Filter {
  int64_t pid = -1;
  std::string prefix;  // "" or a path without trailing '/'
  std::set<std::string> ops;
  bool Wants(const TraceRecord& r) const {
    if (pid >= 0 && static_cast<int64_t>(r.pid) != pid) return false;
    return ops.empty() || ops.count(r.op);
  }
  bool WantsPath(const std::string& path) const {
    if (prefix.empty()) return true;
    return path.compare(0, prefix.size(), prefix) == 0 && (path.size() == prefix.size() || path[prefix.size()] == '/');
  }
};

// Paths of inodes, learnt from lookups and asked of PathFn, bounded.
class PathCache {
 public:
  explicit PathCache(const Tracer::PathFn& fn) : fn_(fn) {}
  std::string Get(uint64_t ino) {
    auto it = paths_.find(ino);
    if (it != paths_.end()) return it->second;
    std::string p = fn_ ? fn_(ino) : "";
    if (p.empty()) return "ino:" + std::to_string(ino);  // not kept: it may resolve later
    Put(ino, p);
    return p;
  }
  void Put(uint64_t ino, const std::string& path) {
    if (paths_.size() > 100000) paths_.clear();
    paths_[ino] = path;
  }

 private:
  const Tracer::PathFn& fn_;
  std::unordered_map<uint64_t, std::string> paths_;
};

std::string Join(const std::string& dir, const std::string& name) {
  if (dir.rfind("ino:", 0) == 0) return dir + "/" + name;
  return dir == "/" ? "/" + name : dir + "/" + name;
}

}  // namespace

std::string TraceLine(const TraceRecord& r, const std::string& path, const std::string& to) {
  nlohmann::json j;
  j["time"] = IsoTime(r.time_ns);
  j["pid"] = r.pid;
  j["uid"] = r.uid;
  j["op"] = r.op;
  j["path"] = path;
  if (!to.empty()) j["to"] = to;
  j["ino"] = r.ino;
  if (std::strcmp(r.op, "read") == 0 || std::strcmp(r.op, "write") == 0) {
    j["offset"] = r.offset;
    j["size"] = r.size;
  }
  j["result"] = ErrName(r.err);
  j["latency_us"] = static_cast<int64_t>(r.latency * 1e6);
  if (*r.source) j["source"] = r.source;
  return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

void Tracer::Emit(TraceRecord r) {
  records_++;
  MutexLock lock(&mu_);
  for (auto& [id, queue] : live_) {
    if (queue.size() >= kQueue) {
      dropped_++;
      continue;
    }
    queue.push_back(r);
  }
  cv_.notify_all();
}

void Tracer::Serve(const std::map<std::string, std::string>& params, StreamSink* sink) {
  Filter f;
  if (auto it = params.find("pid"); it != params.end() && !it->second.empty()) {
    char* end = nullptr;
    long long v = std::strtoll(it->second.c_str(), &end, 10);
    if (end == nullptr || *end != '\0' || v < 0) {
      sink->Write("{\"error\":\"pid must be a process id\"}\n");
      return;
    }
    f.pid = v;
  }
  if (auto it = params.find("prefix"); it != params.end()) {
    f.prefix = it->second;
    while (f.prefix.size() > 1 && f.prefix.back() == '/') f.prefix.pop_back();
    if (f.prefix == "/") f.prefix.clear();
  }
  if (auto it = params.find("op"); it != params.end()) {
    std::string ops = it->second;
    for (size_t start = 0; start <= ops.size();) {
      size_t comma = ops.find(',', start);
      if (comma == std::string::npos) comma = ops.size();
      if (comma > start) f.ops.insert(ops.substr(start, comma - start));
      start = comma + 1;
    }
  }
  uint64_t me;
  {
    MutexLock lock(&mu_);
    if (closed_) return;
    me = next_listener_++;
    live_[me];
    listeners_++;
  }
  // The stream starts with a comment line, so a client knows it is connected before any record.
  bool alive = sink->Write("{\"trace\":\"started\"}\n");
  PathCache paths(path_);
  std::vector<TraceRecord> batch;
  auto last_write = std::chrono::steady_clock::now();
  while (alive) {
    {
      MutexLock lock(&mu_);
      auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(500);
      while (!closed_ && live_[me].empty() && lock.WaitUntil(&cv_, until)) {
      }
      if (closed_) break;
      std::deque<TraceRecord>& queue = live_[me];
      batch.assign(std::make_move_iterator(queue.begin()), std::make_move_iterator(queue.end()));
      queue.clear();
    }
    if (batch.empty()) {
      // Idle: an empty line now and then tells a listener the stream lives (and us whether it does).
      if (std::chrono::steady_clock::now() - last_write >= std::chrono::seconds(1)) {
        alive = sink->Write("\n");
        last_write = std::chrono::steady_clock::now();
      } else {
        alive = sink->Alive();
      }
      continue;
    }
    std::string out;
    for (const TraceRecord& r : batch) {
      if (!f.Wants(r)) continue;
      std::string path;
      if (!r.name.empty()) {  // an operation on a name in directory r.ino
        path = Join(paths.Get(r.ino), r.name);
        if (r.child != 0) paths.Put(r.child, path);
      } else {
        path = paths.Get(r.ino);
      }
      std::string to;
      if (!r.to_name.empty()) to = Join(paths.Get(r.to_parent), r.to_name);
      if (!f.WantsPath(path) && (to.empty() || !f.WantsPath(to))) continue;
      out += TraceLine(r, path, to);
      out += '\n';
    }
    batch.clear();
    if (!out.empty()) {
      alive = sink->Write(out);
      last_write = std::chrono::steady_clock::now();
    }
  }
  MutexLock lock(&mu_);
  live_.erase(me);
  listeners_--;
}

void Tracer::Close() {
  MutexLock lock(&mu_);
  closed_ = true;
  cv_.notify_all();
}

void Tracer::Reopen() {
  MutexLock lock(&mu_);
  closed_ = false;
}

}  // namespace granary::fuse
