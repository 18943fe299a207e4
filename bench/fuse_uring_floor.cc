// granary-fuse-uring-floor: does FUSE over io_uring lower the floor of a FUSE request on this
// kernel? The same minimal server (no libfuse: libfuse 3.14 has no io_uring) over two transports,
// so the transport is the only difference:
//
//   granary-fuse-uring-floor MOUNTPOINT --transport dev|uring [--threads N] [--file-mb N]
//
// It mounts (as root, mount(2) with default_permissions) a root directory holding `small` (4 KiB)
// and `big` (N MiB, default 64), the files of bench/fuse_floor.cc's server, whose bytes are a
// pattern. `dev`: N threads read requests from /dev/fuse and write the replies, as libfuse's
// multi-threaded loop does. `uring` (Linux >= 6.14, the fuse module's enable_uring=Y): the INIT
// reply asks for FUSE_OVER_IO_URING; then one io_uring per CPU (the kernel queues a request on
// the queue of the CPU its caller runs on) registers N entries (a 288-byte header and a payload
// buffer each) with FUSE_IO_URING_CMD_REGISTER, and answers each request with
// FUSE_IO_URING_CMD_COMMIT_AND_FETCH, which commits the reply and waits for the next request in
// one submission. FORGET and INTERRUPT still come through /dev/fuse (one reader thread).
// Prints "READY" once mounted (and, with uring, once every queue is registered); runs until
// SIGTERM or SIGINT, then unmounts. bench/fuse_uring.sh times both with the probe of
// granary-fuse-floor; bench/fuse_uring_handover.sh kills one and lets a successor take the
// connection over (--adopt-pid, --adopt-fd: the descriptor of a process keeping it).
//
// The io_uring layout (fs/fuse/dev_uring.c): the request's fuse_in_header is in the header's
// in_out, its first argument (the per-operation header; empty for LOOKUP) in op_in, the other
// arguments in the payload (ring_ent_in_out.payload_sz bytes); the reply's fuse_out_header goes to
// in_out and all its arguments to the payload.
#include <fcntl.h>
#include <linux/fuse.h>
#include <liburing.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <sys/mount.h>
#include <sys/syscall.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "fuse/kernel_abi.h"
#include "fuse/uring_cmd.h"

namespace {

// The FUSE-over-io_uring ABI (Debian 12's headers are protocol 7.38 and do not have it).
using granary::fuse::kabi::kUringCmdCommitAndFetch;
using granary::fuse::kabi::kUringCmdRegister;
using granary::fuse::kabi::UringReqHeader;
constexpr uint64_t kFuseOverIoUring = granary::fuse::kabi::kInitOverIoUring;

constexpr uint64_t kSmall = 2, kBig = 3;
constexpr size_t kSmallSize = 4096;
constexpr uint32_t kMaxPages = 256;  // READs of up to 1 MiB
constexpr size_t kPayload = kMaxPages * 4096;
size_t big_size = 64ull << 20;
std::vector<char> pattern;  // 1 MiB, repeated
int fuse_fd = -1;
std::atomic<bool> stopping{false};

uint64_t SizeOf(uint64_t ino) { return ino == kSmall ? kSmallSize : big_size; }

void FillAttr(uint64_t ino, fuse_attr* a) {
  std::memset(a, 0, sizeof *a);
  a->ino = ino;
  a->blksize = 4096;
  if (ino == FUSE_ROOT_ID) {
    a->mode = S_IFDIR | 0755;
    a->nlink = 2;
  } else {
    a->mode = S_IFREG | 0644;
    a->nlink = 1;
    a->size = SizeOf(ino);
    a->blocks = (a->size + 511) / 512;
  }
}

// Answers one request: the reply's arguments go to `out` (*out_len bytes); returns 0 or a negative
// errno. `arg0` is the request's first argument, `rest` what follows it (for LOOKUP: the name).
// A request that takes no reply (FORGET) sets *no_reply.
int Handle(const fuse_in_header& in, const char* arg0, const char* rest, char* out, size_t* out_len, bool* no_reply) {
  *out_len = 0;
  *no_reply = false;
  switch (in.opcode) {
    case FUSE_LOOKUP: {
      if (in.nodeid != FUSE_ROOT_ID) return -ENOENT;
      uint64_t ino = std::strcmp(rest, "small") == 0 ? kSmall : std::strcmp(rest, "big") == 0 ? kBig : 0;
      if (ino == 0) return -ENOENT;
      auto* e = reinterpret_cast<fuse_entry_out*>(out);
      std::memset(e, 0, sizeof *e);
      e->nodeid = ino;
      e->attr_valid = 3600;
      e->entry_valid = 3600;
      FillAttr(ino, &e->attr);
      *out_len = sizeof *e;
      return 0;
    }
    case FUSE_GETATTR: {
      if (in.nodeid != FUSE_ROOT_ID && in.nodeid != kSmall && in.nodeid != kBig) return -ENOENT;
      auto* a = reinterpret_cast<fuse_attr_out*>(out);
      std::memset(a, 0, sizeof *a);
      a->attr_valid = 3600;
      FillAttr(in.nodeid, &a->attr);
      *out_len = sizeof *a;
      return 0;
    }
    case FUSE_OPEN:
    case FUSE_OPENDIR: {
      auto* o = reinterpret_cast<fuse_open_out*>(out);
      std::memset(o, 0, sizeof *o);
      o->fh = 1;
      o->open_flags = FOPEN_KEEP_CACHE;
      *out_len = sizeof *o;
      return 0;
    }
    case FUSE_READ: {
      const auto* r = reinterpret_cast<const fuse_read_in*>(arg0);
      const uint64_t size = SizeOf(in.nodeid);
      if (r->offset >= size) return 0;
      size_t n = std::min<uint64_t>(std::min<uint64_t>(r->size, kPayload), size - r->offset);
      for (size_t done = 0; done < n;) {
        size_t at = (r->offset + done) % pattern.size();
        size_t piece = std::min(n - done, pattern.size() - at);
        std::memcpy(out + done, pattern.data() + at, piece);
        done += piece;
      }
      *out_len = n;
      return 0;
    }
    case FUSE_RELEASE:
    case FUSE_RELEASEDIR:
      return 0;
    case FUSE_STATFS: {
      auto* s = reinterpret_cast<fuse_statfs_out*>(out);
      std::memset(s, 0, sizeof *s);
      s->st.bsize = 4096;
      s->st.namelen = 255;
      *out_len = sizeof *s;
      return 0;
    }
    case FUSE_FORGET:
    case FUSE_BATCH_FORGET:
    case FUSE_INTERRUPT:
      *no_reply = true;
      return 0;
    case FUSE_DESTROY:
      return 0;
    default:  // IOCTL (ENOTTY for the reader), FLUSH, GETXATTR, ACCESS, READDIR, ...: as libfuse without a handler
      return -ENOSYS;
  }
}

// ---- /dev/fuse transport ----

void WriteReply(uint64_t unique, int error, const char* out, size_t n) {
  fuse_out_header oh{};
  oh.unique = unique;
  oh.error = error;
  oh.len = static_cast<uint32_t>(sizeof oh + n);
  iovec iov[2] = {{&oh, sizeof oh}, {const_cast<char*>(out), n}};
  ssize_t w = writev(fuse_fd, iov, n ? 2 : 1);
  (void)w;  // ENOENT: the request was interrupted
}

void DevLoop() {
  std::vector<char> buf(kPayload + 4096);
  std::vector<char> out(kPayload);
  for (;;) {
    ssize_t n = read(fuse_fd, buf.data(), buf.size());
    if (n < 0) {
      if (errno == EINTR || errno == ENOENT || errno == EAGAIN) continue;
      return;  // ENODEV: unmounted
    }
    if (static_cast<size_t>(n) < sizeof(fuse_in_header)) continue;
    const auto* in = reinterpret_cast<const fuse_in_header*>(buf.data());
    const char* arg0 = buf.data() + sizeof *in;
    size_t len;
    bool no_reply;
    int err = Handle(*in, arg0, arg0, out.data(), &len, &no_reply);
    if (!no_reply) WriteReply(in->unique, err, out.data(), err ? 0 : len);
  }
}

// Reads and answers INIT on /dev/fuse; with `uring`, asks for FUSE_OVER_IO_URING.
bool Init(bool uring) {
  std::vector<char> buf(kPayload + 4096);
  ssize_t n = read(fuse_fd, buf.data(), buf.size());
  if (n < static_cast<ssize_t>(sizeof(fuse_in_header) + sizeof(fuse_init_in))) return false;
  const auto* in = reinterpret_cast<const fuse_in_header*>(buf.data());
  const auto* init = reinterpret_cast<const fuse_init_in*>(buf.data() + sizeof *in);
  if (in->opcode != FUSE_INIT) return false;
  uint64_t offered = init->flags;
  if (init->flags & FUSE_INIT_EXT) offered |= static_cast<uint64_t>(init->flags2) << 32;
  if (uring && !(offered & kFuseOverIoUring)) {
    std::fprintf(stderr, "the kernel does not offer FUSE_OVER_IO_URING (protocol 7.%u); "
                 "load fuse with enable_uring=Y on Linux >= 6.14\n", init->minor);
    return false;
  }
  fuse_init_out o{};
  o.major = FUSE_KERNEL_VERSION;
  o.minor = init->minor;
  o.max_readahead = init->max_readahead;
  uint64_t want = FUSE_ASYNC_READ | FUSE_MAX_PAGES | FUSE_PARALLEL_DIROPS | FUSE_INIT_EXT;
  if (uring) want |= kFuseOverIoUring;
  want &= offered | FUSE_INIT_EXT;
  o.flags = static_cast<uint32_t>(want);
  o.flags2 = static_cast<uint32_t>(want >> 32);
  o.max_background = 64;
  o.congestion_threshold = 48;
  o.max_write = 128 * 1024;
  o.time_gran = 1;
  o.max_pages = kMaxPages;
  WriteReply(in->unique, 0, reinterpret_cast<const char*>(&o), sizeof o);
  return true;
}

// ---- io_uring transport ----

struct Entry {
  UringReqHeader header;
  std::unique_ptr<char[]> payload{new char[kPayload]};
  iovec iov[2];
};

void PrepCmd(io_uring* ring, Entry* e, uint32_t op, uint16_t qid, uint64_t commit_id) {
  if (op == kUringCmdRegister) {
    e->iov[0] = {&e->header, sizeof e->header};
    e->iov[1] = {e->payload.get(), kPayload};
  }
  granary::fuse::PrepFuseUringCmd(ring, fuse_fd, e, e->iov, op, qid, commit_id);
}

void QueueLoop(uint16_t qid, int depth, std::atomic<int>* registered, std::atomic<int>* failed) {
  cpu_set_t cpus;
  CPU_ZERO(&cpus);
  CPU_SET(qid, &cpus);
  pthread_setaffinity_np(pthread_self(), sizeof cpus, &cpus);  // requests of CPU qid come to queue qid
  io_uring ring;
  int rc = io_uring_queue_init(depth * 2, &ring, IORING_SETUP_SQE128);
  if (rc < 0) {
    std::fprintf(stderr, "queue %u: io_uring_queue_init: %s\n", qid, std::strerror(-rc));
    (*failed)++;
    return;
  }
  std::vector<std::unique_ptr<Entry>> entries;
  for (int i = 0; i < depth; ++i) {
    entries.push_back(std::make_unique<Entry>());
    PrepCmd(&ring, entries.back().get(), kUringCmdRegister, qid, 0);
  }
  rc = io_uring_submit(&ring);
  if (rc != depth) {
    std::fprintf(stderr, "queue %u: submitting the registrations: %s\n", qid, rc < 0 ? std::strerror(-rc) : "short");
    (*failed)++;
    return;
  }
  (*registered)++;
  for (;;) {
    io_uring_cqe* cqe = nullptr;
    rc = io_uring_wait_cqe(&ring, &cqe);
    if (rc == -EINTR) continue;
    if (rc < 0) break;
    auto* e = reinterpret_cast<Entry*>(cqe->user_data);
    const int res = cqe->res;
    io_uring_cqe_seen(&ring, cqe);
    if (res < 0) {
      if (!stopping) std::fprintf(stderr, "queue %u: %s\n", qid, std::strerror(-res));
      if (res == -ENOTCONN || res == -ECANCELED || stopping) break;
      (*failed)++;
      break;
    }
    const auto* in = reinterpret_cast<const fuse_in_header*>(e->header.in_out);
    const uint64_t unique = e->header.ring_ent_in_out.commit_id;
    // The name of a LOOKUP is in the payload (its first argument is empty).
    const char* rest = e->header.ring_ent_in_out.payload_sz ? e->payload.get() : e->header.op_in;
    static thread_local std::vector<char> out(kPayload);
    size_t len;
    bool no_reply;
    int err = Handle(*in, e->header.op_in, rest, out.data(), &len, &no_reply);
    if (err) len = 0;
    std::memcpy(e->payload.get(), out.data(), len);
    fuse_out_header oh{};
    oh.unique = unique;
    oh.error = err;
    oh.len = static_cast<uint32_t>(sizeof oh + len);
    std::memcpy(e->header.in_out, &oh, sizeof oh);
    e->header.ring_ent_in_out.payload_sz = static_cast<uint32_t>(len);
    PrepCmd(&ring, e, kUringCmdCommitAndFetch, qid, unique);
    io_uring_submit(&ring);
  }
  io_uring_queue_exit(&ring);
}

int PossibleCpus() {
  std::ifstream f("/sys/devices/system/cpu/possible");
  std::string s;
  std::getline(f, s);  // "0-1" or "0"
  size_t dash = s.find('-');
  return dash == std::string::npos ? 1 : std::stoi(s.substr(dash + 1)) + 1;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"granary-fuse-uring-floor: the minimal FUSE server over /dev/fuse or io_uring"};
  std::string mountpoint, transport = "dev";
  int threads = 8;
  size_t file_mb = 64;
  app.add_option("mountpoint", mountpoint)->required();
  app.add_option("--transport", transport)->check(CLI::IsMember({"dev", "uring"}));
  app.add_option("--threads", threads, "dev: reader threads; uring: entries per queue");
  app.add_option("--file-mb", file_mb);
  // The hand-over experiment: take the connection over from the process holding it (a keeper of
  // the descriptor, after this server's predecessor died): no mount, no INIT; FUSE_NOTIFY_RESEND
  // asks the kernel to send again what the predecessor had taken and not answered.
  int adopt_pid = 0, adopt_fd = -1;
  app.add_option("--adopt-pid", adopt_pid);
  app.add_option("--adopt-fd", adopt_fd);
  CLI11_PARSE(app, argc, argv);
  big_size = file_mb << 20;
  pattern.resize(1 << 20);
  for (size_t i = 0; i < pattern.size(); ++i) pattern[i] = static_cast<char>((i * 131 + 7) & 0xff);

  sigset_t sigs;
  sigemptyset(&sigs);
  sigaddset(&sigs, SIGTERM);
  sigaddset(&sigs, SIGINT);
  pthread_sigmask(SIG_BLOCK, &sigs, nullptr);  // every thread; main waits for them below

  const bool uring = transport == "uring";
  if (adopt_pid > 0) {
    int pidfd = static_cast<int>(syscall(SYS_pidfd_open, adopt_pid, 0));
    fuse_fd = pidfd < 0 ? -1 : static_cast<int>(syscall(SYS_pidfd_getfd, pidfd, adopt_fd, 0));
    if (fuse_fd < 0) {
      std::perror("pidfd_getfd");
      return 1;
    }
    fuse_out_header resend{};
    resend.len = sizeof resend;
    resend.error = 7;  // FUSE_NOTIFY_RESEND
    if (write(fuse_fd, &resend, sizeof resend) < 0) std::perror("FUSE_NOTIFY_RESEND");
  } else {
    fuse_fd = open("/dev/fuse", O_RDWR | O_CLOEXEC);
    if (fuse_fd < 0) {
      std::perror("/dev/fuse");
      return 1;
    }
    std::string opts = "fd=" + std::to_string(fuse_fd) + ",rootmode=40000,user_id=0,group_id=0,default_permissions";
    if (mount("floor", mountpoint.c_str(), "fuse.floor", MS_NOSUID | MS_NODEV, opts.c_str()) != 0) {
      std::perror("mount");
      return 1;
    }
    if (!Init(uring)) {
      umount2(mountpoint.c_str(), MNT_DETACH);
      return 1;
    }
  }
  std::vector<std::thread> pool;
  if (uring) {
    const int queues = PossibleCpus();
    std::atomic<int> registered{0}, failed{0};
    for (int q = 0; q < queues; ++q) pool.emplace_back(QueueLoop, static_cast<uint16_t>(q), threads, &registered, &failed);
    while (registered + failed < queues) usleep(1000);
    if (failed > 0) {
      stopping = true;
      umount2(mountpoint.c_str(), MNT_DETACH);
      std::_Exit(1);
    }
    pool.emplace_back(DevLoop);  // FORGET and INTERRUPT
  } else {
    for (int t = 0; t < threads; ++t) pool.emplace_back(DevLoop);
  }
  std::printf("READY %s fd=%d pid=%d\n", transport.c_str(), fuse_fd, getpid());
  std::fflush(stdout);
  int sig = 0;
  sigwait(&sigs, &sig);
  stopping = true;
  umount2(mountpoint.c_str(), MNT_DETACH);
  std::_Exit(0);  // the loops end with the connection; nothing to flush
}
