// UringQueues (fuse/uring.h, whose design note says how requests and replies move).
#include "fuse/uring.h"

#include <fcntl.h>
#include <liburing.h>
#include <linux/fuse.h>
#include <sched.h>
#include <spdlog/spdlog.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <fstream>
#include <string>

#include "fuse/kernel_abi.h"
#include "fuse/session_io.h"
#include "fuse/uring_cmd.h"
#include "fuse/uring_internal.h"

#ifdef GRANARY_TSAN_BUILD
#include <sanitizer/tsan_interface.h>
#endif

namespace granary::fuse {

using namespace uring_detail;  // NOLINT: this class's own layout

thread_local void* t_entry = nullptr;

namespace {

// Released at each ring's end, acquired at each ring's start (InitRing, ExitRing).
[[maybe_unused]] char ring_memory_token;

}  // namespace

// liburing maps and unmaps a ring's memory with raw system calls that ThreadSanitizer does not see:
// a ring mapped where another thread's ring had been unmapped looked written by two threads at once
// (a false report in PrepFuseUringCmd, 2026-11-27). The kernel orders the unmap before the map.
int InitRing(io_uring* ring, unsigned flags) {
  const int rc = io_uring_queue_init(2, ring, flags);
#ifdef GRANARY_TSAN_BUILD
  if (rc >= 0) __tsan_acquire(&ring_memory_token);
#endif
  return rc;
}

void ExitRing(io_uring* ring) {
#ifdef GRANARY_TSAN_BUILD
  __tsan_release(&ring_memory_token);
#endif
  io_uring_queue_exit(ring);
}

Status UringQueues::Probe() {
  io_uring ring;
  int rc = InitRing(&ring, IORING_SETUP_SQE128);
  if (rc < 0) return ErrnoError(-rc, "io_uring_queue_init (SQE128)");
  ExitRing(&ring);
  return Status::OK();
}

int UringQueues::QueueCount() {
  std::ifstream f("/sys/devices/system/cpu/possible");
  std::string s;
  std::getline(f, s);  // "0-1", "0" or "0-3,5"
  int last = 0;
  size_t i = 0;
  while (i < s.size()) {
    size_t end = s.find_first_of(",", i);
    std::string part = s.substr(i, end == std::string::npos ? std::string::npos : end - i);
    size_t dash = part.find('-');
    try {
      last = std::max(last, std::stoi(dash == std::string::npos ? part : part.substr(dash + 1)));
    } catch (...) {
    }
    if (end == std::string::npos) break;
    i = end + 1;
  }
  return last + 1;
}

StatusOr<std::unique_ptr<UringQueues>> UringQueues::Start(fuse_session* se, int fd, size_t payload, int depth,
                                                         const Memory* adopt) {
  std::unique_ptr<UringQueues> q(new UringQueues(se, fd));
  RETURN_IF_ERROR(q->MapMemory(adopt, payload, depth));
  const int queues = QueueCount();
  std::vector<std::atomic<int>> registered(queues);
  std::atomic<int> failed{0};
  for (auto& e : q->entries_) {
    q->threads_.emplace_back(&UringQueues::Serve, q.get(), e.get(), &registered[e->qid], &failed);
  }
  // Each thread says once whether its registration was taken (its first completion, or a second
  // without one). Registration is quick: the kernel answers at once.
  auto settled = [&] {
    int n = failed.load();
    for (auto& r : registered) n += r.load();
    return n;
  };
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (settled() < static_cast<int>(q->entries_.size()) && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  bool every_queue = true;
  for (auto& r : registered) every_queue = every_queue && r.load() > 0;
  // The adoptions are settled: from now on the pool is this generation's (a successor takes what
  // this process's entries hold; slots of older generations that held nothing are free).
  reinterpret_cast<PoolHeader*>(q->memory_.base)->generation = q->generation_;
  if (!every_queue && q->adopted_) {
    spdlog::error("fuse.transport=uring: a CPU's io_uring queue has no entry after adopting the predecessor's; "
                  "requests from that CPU wait until granary-fuse is restarted");
  }
  if (every_queue || q->adopted_) {
    // The ring is ready: the kernel sends requests to it now. Serve with what registered.
    if (failed.load() > 0) {
      spdlog::warn("fuse.transport=uring: {} of {} io_uring entries were refused; serving with the others",
                   failed.load(), q->entries_.size());
    }
    return q;
  }
  // Not ready, and the kernel holds every request until it is: turn io_uring off on this
  // connection (a registration the kernel refuses does that), so /dev/fuse serves it.
  q->DisableOnConnection();
  q->Stop();
  return UnavailableError("registering " + std::to_string(q->entries_.size()) + " io_uring entries on " +
                          std::to_string(queues) + " queues failed (" + std::to_string(failed.load()) +
                          " refused; see the log): the kernel serves this mount through /dev/fuse");
}

UringQueues::UringQueues(fuse_session* se, int fd) : se_(se), fd_(fd) {}

void UringQueues::DisableOnConnection() {
  io_uring ring;
  if (InitRing(&ring, IORING_SETUP_SQE128) < 0) return;
  static kabi::UringReqHeader header;
  static char payload[1];
  iovec iov[2] = {{&header, sizeof header}, {payload, sizeof payload}};
  // A queue number past the last: the kernel refuses the registration and turns io_uring off.
  PrepFuseUringCmd(&ring, fd_, nullptr, iov, kabi::kUringCmdRegister, static_cast<uint16_t>(QueueCount()), 0);
  io_uring_cqe* cqe = nullptr;
  if (io_uring_submit_and_wait(&ring, 1) >= 0 && io_uring_peek_cqe(&ring, &cqe) == 0) io_uring_cqe_seen(&ring, cqe);
  ExitRing(&ring);
}

UringQueues::~UringQueues() {
  Stop();
  if (memory_.base != 0) munmap(reinterpret_cast<void*>(memory_.base), memory_.bytes);
  if (memory_.fd >= 0) close(memory_.fd);
}

void UringQueues::Stop() {
  {
    MutexLock lock(&park_mu_);
    stopping_ = true;
  }
  park_cv_.notify_all();
  for (auto& t : threads_) {
    if (t.joinable()) t.join();
  }
}

void UringQueues::Process(Entry* e, std::vector<char>* scratch) {
  // The request, laid out as /dev/fuse gives it: header, first argument, the rest.
  const auto* in = reinterpret_cast<const fuse_in_header*>(e->header->in_out);
  const size_t payload_sz = e->header->ring_ent_in_out.payload_sz;
  const size_t total = in->len;
  e->replied = false;
  SessionIo::NoteRequest(in);  // for the reply hooks (passthrough's open reply)
  if (total >= sizeof(fuse_in_header) + payload_sz && total - sizeof(fuse_in_header) - payload_sz <= kabi::kUringOpInOut &&
      payload_sz <= e->payload_size && in->unique == e->unique) {
    const size_t op_in = total - sizeof(fuse_in_header) - payload_sz;
    scratch->resize(std::max<size_t>(total, 4096));
    std::memcpy(scratch->data(), in, sizeof(fuse_in_header));
    std::memcpy(scratch->data() + sizeof(fuse_in_header), e->header->op_in, op_in);
    std::memcpy(scratch->data() + sizeof(fuse_in_header) + op_in, e->payload, payload_sz);
    fuse_buf buf{};
    buf.size = total;
    buf.mem = scratch->data();
    requests_.fetch_add(1, std::memory_order_relaxed);
    fuse_session_process_buf(se_, &buf);
  }
  if (!e->replied) FailInEntry(e, EIO);  // malformed, or an operation that did not answer on this thread
}

void UringQueues::FailInEntry(Entry* e, int err) {
  fuse_out_header oh{};
  oh.len = sizeof oh;
  oh.error = -err;
  oh.unique = e->unique;
  Store(&e->state->step, kReplying);
  std::memcpy(e->header->in_out, &oh, sizeof oh);
  e->header->ring_ent_in_out.payload_sz = 0;
  Store(&e->state->step, kReplied);
  e->replied = true;
}

void UringQueues::Serve(Entry* e, std::atomic<int>* registered, std::atomic<int>* failed) {
  io_uring ring;
  // One thread issues and reaps (SINGLE_ISSUER), and the kernel's work of handing it a request runs
  // when it waits (DEFER_TASKRUN), not as an interruption; plain SQE128 where those are refused.
  int rc = InitRing(&ring, IORING_SETUP_SQE128 | IORING_SETUP_SINGLE_ISSUER | IORING_SETUP_DEFER_TASKRUN);
  if (rc == -EINVAL) rc = InitRing(&ring, IORING_SETUP_SQE128);
  if (rc < 0) {
    spdlog::warn("fuse.transport=uring: io_uring_queue_init: {}", std::strerror(-rc));
    failed->fetch_add(1);
    return;
  }
  // What a successor reads of this entry (fuse/uring.h): written before each step it describes.
  auto register_entry = [&] {
    Store(&e->header->ring_ent_in_out.commit_id, 0);  // nothing held until the kernel writes a request
    Store(&e->state->unique, 0);
    Store(&e->state->qid, e->qid);
    Store(&e->state->step, kRegistered);
    Store(&e->state->generation, generation_);
    PrepFuseUringCmd(&ring, fd_, e, e->iov, kabi::kUringCmdRegister, e->qid, 0);
  };
  auto commit = [&] {
    Store(&e->state->step, kReplied);
    PrepFuseUringCmd(&ring, fd_, e, e->iov, kabi::kUringCmdCommitAndFetch, e->qid, e->unique);
  };
  // The kernel queues a request on its caller's CPU's queue: served on that CPU, the request and
  // its answer stay in that CPU's caches, and no thread migrates (bench/fuse_floor.sh --uring: 1.16-1.91x
  // the io_uring floor unpinned, 1.05-1.37x pinned). A CPU this process may not run on: anywhere.
  (void)RunOnCpu(e->qid);
  t_entry = e;
  std::vector<char> scratch;
  // A predecessor's entry: answer what it holds (or commit the answer it holds), which makes it ours.
  bool adopting = e->first != Entry::kRegister;
  if (adopting) {
    e->unique = Load(&e->header->ring_ent_in_out.commit_id);
    if (e->first == Entry::kProcess) Process(e, &scratch);
    if (e->first == Entry::kFail) FailInEntry(e, EIO);  // half written by a process that died: EIO
    commit();
  } else {
    register_entry();
  }
  // A registration (or commit) the kernel takes completes only with the next request; one it
  // refuses completes at once with the error. No completion within a short wait: taken.
  bool counted = false;
  bool in_service = false;    // counted in serving_
  bool reregistered = false;  // the last submission registered the entry again after a refused commit
  auto taken = [&] {
    if (!counted) {
      counted = true;
      in_service = true;
      registered->fetch_add(1);
      serving_.fetch_add(1);
    }
    if (adopting) {  // the commit was taken: the kernel's entry is ours now, and so is the slot
      adopting = false;
      Store(&e->state->generation, generation_);
      adopted_requests_.fetch_add(1, std::memory_order_relaxed);
    }
  };
  for (;;) {
    io_uring_cqe* cqe = nullptr;
    __kernel_timespec wait{};
    wait.tv_nsec = counted ? 0 : 50'000'000;
    wait.tv_sec = counted ? 1 : 0;
    // Submits what is queued (the registration, or the last reply's commit) and waits, in one call.
    rc = io_uring_submit_and_wait_timeout(&ring, &cqe, 1, &wait, nullptr);
    if (rc >= 0 && cqe == nullptr) continue;
    if (rc == -ETIME || rc == -EINTR) {
      taken();
      if (stopping_) break;
      continue;
    }
    if (rc < 0) {
      spdlog::warn("fuse.transport=uring: waiting for a request: {}", std::strerror(-rc));
      break;
    }
    const int res = cqe->res;
    io_uring_cqe_seen(&ring, cqe);
    if (res < 0 && adopting) {
      // Its request was answered already (or aborted): the entry stays the predecessor's (idle
      // until its ring closes). Register on a free slot instead.
      adopting = false;
      // A dead generation's stale answer: forget it, so the next successor does not try it again
      // (a predecessor's slot may still be its idle entry, which the kernel may write to: untouched).
      if (Load(&e->state->generation) != previous_generation_) Store(&e->header->ring_ent_in_out.commit_id, 0);
      if (!TakeFreeSlot(e)) {
        spdlog::warn("fuse.transport=uring: no free slot for an entry of queue {}", e->qid);
        break;
      }
      register_entry();
      continue;
    }
    if (res < 0) {
      if (!counted) {
        spdlog::warn("fuse.transport=uring: the kernel refused an entry of queue {}: {}", e->qid, std::strerror(-res));
        failed->fetch_add(1);
        counted = true;
        break;
      }
      if (res == -ENOTCONN || res == -ECANCELED || stopping_ || reregistered || Parking()) {
        break;  // ended, Stop, refused again, or a hand-over under way (the slot may be the successor's)
      }
      // A commit the kernel refused (the request was aborted meanwhile): the entry is not the
      // queue's any more; register its buffers again, so the queue keeps its depth.
      commit_failures_.fetch_add(1, std::memory_order_relaxed);
      spdlog::warn("fuse.transport=uring: a reply on queue {} was refused ({}); registering its entry again",
                   e->qid, std::strerror(-res));
      register_entry();
      reregistered = true;
      continue;
    }
    reregistered = false;
    taken();
    e->unique = Load(&e->header->ring_ent_in_out.commit_id);
    Store(&e->state->unique, e->unique);
    Store(&e->state->step, kHeld);
    if (HoldWhileParked()) break;  // stopped while parked: the successor answers it
    Process(e, &scratch);
    commit();
    if (stopping_) {  // commit, and leave: the kernel cancels the entry when this ring closes
      io_uring_submit(&ring);
      break;
    }
  }
  if (!counted) failed->fetch_add(1);
  if (in_service) {
    MutexLock lock(&park_mu_);
    serving_.fetch_sub(1);
    park_cv_.notify_all();
  }
  t_entry = nullptr;
  ExitRing(&ring);
}

bool UringQueues::OnRingThread() { return t_entry != nullptr; }

char* UringQueues::ReplyBuffer(size_t n) {
  auto* e = static_cast<Entry*>(t_entry);
  return e != nullptr && n <= e->payload_size ? e->payload : nullptr;
}

bool UringQueues::TakeReply(const struct iovec* iov, int count, ssize_t* n) {
  auto* e = static_cast<Entry*>(t_entry);
  if (e == nullptr || count < 1 || iov[0].iov_len < sizeof(fuse_out_header)) return false;
  fuse_out_header oh;
  std::memcpy(&oh, iov[0].iov_base, sizeof oh);
  if (oh.unique != e->unique || e->replied) return false;
  Store(&e->state->step, kReplying);  // the request is overwritten from here on (fuse/uring.h)
  size_t total = 0, body = 0;
  for (int i = 0; i < count; ++i) total += iov[i].iov_len;
  body = total - sizeof oh;
  if (body > e->payload_size) {  // cannot happen within max_pages; answer EIO rather than overrun
    oh.error = -EIO;
    body = 0;
  } else {
    char* out = e->payload;
    size_t skip = sizeof oh;
    for (int i = 0; i < count; ++i) {
      const char* p = static_cast<const char*>(iov[i].iov_base);
      size_t len = iov[i].iov_len;
      if (skip >= len) {
        skip -= len;
        continue;
      }
      p += skip;
      len -= skip;
      skip = 0;
      if (p != out) std::memcpy(out, p, len);
      out += len;
    }
  }
  oh.len = static_cast<uint32_t>(sizeof oh + body);
  std::memcpy(e->header->in_out, &oh, sizeof oh);
  e->header->ring_ent_in_out.payload_sz = static_cast<uint32_t>(body);
  Store(&e->state->step, kReplied);  // whole: a successor commits it as it is
  e->replied = true;
  *n = static_cast<ssize_t>(total);
  return true;
}

bool UringQueues::TakeSplicedReply(int pipe_fd, int dev_fd, size_t len, ssize_t* n) {
  auto* e = static_cast<Entry*>(t_entry);
  if (e == nullptr) return false;
  thread_local std::vector<char> buf;
  buf.resize(len);
  size_t got = 0;
  while (got < len) {
    ssize_t r = read(pipe_fd, buf.data() + got, len - got);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) {  // the pipe no longer holds the whole reply: fail it rather than send a part
      *n = -1;
      errno = EIO;
      return true;
    }
    got += static_cast<size_t>(r);
  }
  iovec iov{buf.data(), len};
  if (TakeReply(&iov, 1, n)) return true;
  *n = write(dev_fd, buf.data(), len);  // not this thread's request: as the splice would have
  return true;
}

}  // namespace granary::fuse
