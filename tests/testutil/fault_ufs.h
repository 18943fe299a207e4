// FaultUfs: wraps a real UnderFileSystem to count calls and inject faults — fail the next reads
// with a given Status, or hold reads at a gate until the test opens it. Thread-safe.
#pragma once

#include <atomic>
#include <condition_variable>
#include <memory>
#include <mutex>

#include "ufs/ufs.h"

namespace granary::testing {

class FaultUfs : public UnderFileSystem {
 public:
  explicit FaultUfs(std::shared_ptr<UnderFileSystem> real) : real_(std::move(real)) {}

  const std::string& uri() const override { return real_->uri(); }
  StatusOr<UfsEntry> Stat(const std::string& path) override { return real_->Stat(path); }
  Status List(const std::string& dir, size_t page_size, const PageFn& on_page) override {
    return real_->List(dir, page_size, on_page);
  }
  StatusOr<size_t> Read(const std::string& path, const std::string& version, uint64_t offset, size_t length,
                        char* out) override {
    reads_started++;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return gate_open_ || length < gate_min_length_; });
      if (fail_next_ > 0) {
        --fail_next_;
        return fail_status_;
      }
    }
    return real_->Read(path, version, offset, length, out);
  }

  // Streamed reads (ReadStreaming with a progress), once SplitStreams(n): the first n bytes land
  // (reported), then the read waits until OpenStreamGate() — and fails then with `fail` if set —
  // before the rest lands.
  StatusOr<size_t> ReadStreaming(const std::string& path, const std::string& version, uint64_t offset, size_t length,
                                 char* out, ReadProgress* progress) override {
    size_t split;
    {
      std::lock_guard<std::mutex> lock(mu_);
      split = split_;
    }
    if (progress == nullptr || split == 0) return Read(path, version, offset, length, out);
    reads_started++;
    auto n = real_->Read(path, version, offset, length, out);
    if (!n.ok()) return n;
    streams_split++;  // counted before it lands: a reader answered by it sees the count
    progress->Landed(std::min(split, *n));
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return stream_gate_open_; });
    if (!stream_fail_.ok()) return stream_fail_;
    lock.unlock();
    progress->Landed(*n);
    return n;
  }
  void SplitStreams(size_t first_bytes, Status fail = Status::OK()) {
    std::lock_guard<std::mutex> lock(mu_);
    split_ = first_bytes;
    stream_gate_open_ = false;
    stream_fail_ = std::move(fail);
  }
  void OpenStreamGate() {
    std::lock_guard<std::mutex> lock(mu_);
    stream_gate_open_ = true;
    cv_.notify_all();
  }
  std::atomic<int> streams_split{0};  // streamed reads that landed their first part

  // Reads (of at least min_length bytes) wait until OpenGate().
  void CloseGate(size_t min_length = 0) {
    std::lock_guard<std::mutex> lock(mu_);
    gate_open_ = false;
    gate_min_length_ = min_length;
  }
  void OpenGate() {
    std::lock_guard<std::mutex> lock(mu_);
    gate_open_ = true;
    cv_.notify_all();
  }
  void FailNext(int n, Status s) {
    std::lock_guard<std::mutex> lock(mu_);
    fail_next_ = n;
    fail_status_ = std::move(s);
  }

  std::atomic<int> reads_started{0};

 private:
  std::shared_ptr<UnderFileSystem> real_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool gate_open_ = true;
  size_t split_ = 0;
  bool stream_gate_open_ = true;
  Status stream_fail_;
  size_t gate_min_length_ = 0;
  int fail_next_ = 0;
  Status fail_status_;
};

}  // namespace granary::testing
