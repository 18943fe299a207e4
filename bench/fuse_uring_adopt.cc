// granary-fuse-uring-adopt: the experiment behind fuse/uring.h's way out of its two gaps. Can a
// successor answer the FUSE-over-io_uring requests a dead server held, by mapping the dead server's
// entry buffers (a memfd) at the same address and committing the requests itself?
//
//   granary-fuse-uring-adopt serve MNT          mounts (io_uring, 2 entries per CPU queue, their
//                                               buffers in a memfd at kBase); a READ at 1 MiB of
//                                               `big` is never answered; prints READY pid= fd= shm=
//   granary-fuse-uring-adopt adopt PID FD SHM MNT  takes FD (/dev/fuse) and SHM (the memfd) from PID
//                                               (pidfd_getfd), kills it with -9, maps SHM at kBase,
//                                               answers the request each entry holds and commits
//                                               it (FUSE_IO_URING_CMD_COMMIT_AND_FETCH names the
//                                               request by its unique), after registering entries of
//                                               its own, then makes one request on each CPU's queue
//                                               (a commit there fetches what queued meanwhile)
//
// bench/fuse_uring_adopt.sh runs it: a reader blocked on the stalled READ gets the right bytes from
// the successor. fs/fuse/dev_uring.c finds the request by its unique on the entry's queue and reads
// the reply from the entry's buffer addresses in the committing task's memory; it checks no owner.
// The entry is then the committer's: its next requests come to the successor's ring.
#include <fcntl.h>
#include <linux/fuse.h>
#include <liburing.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/mount.h>
#include <sys/syscall.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "fuse/kernel_abi.h"
#include "fuse/uring_cmd.h"

using namespace granary::fuse::kabi;

constexpr uintptr_t kBase = 0x600000000000ull;
constexpr size_t kSlot = 2 << 20;   // header page + 1 MiB payload, rounded
constexpr size_t kPayload = 1 << 20;
constexpr int kQueues = 2, kDepth = 2, kSlots = kQueues * kDepth;
constexpr uint64_t kBig = 3;
constexpr size_t kBigSize = 4 << 20;
int fuse_fd = -1;

char Pattern(uint64_t off) { return static_cast<char>((off * 131 + 7) & 0xff); }

struct Slot {
  UringReqHeader* h;
  char* payload;
  iovec iov[2];
  uint16_t qid;
};

Slot SlotAt(char* base, int i) {
  Slot s;
  s.h = reinterpret_cast<UringReqHeader*>(base + i * kSlot);
  s.payload = base + i * kSlot + 4096;
  s.iov[0] = {s.h, sizeof *s.h};
  s.iov[1] = {s.payload, kPayload};
  s.qid = static_cast<uint16_t>(i / kDepth);
  return s;
}

void Prep(io_uring* ring, Slot* s, uint32_t op, uint64_t commit_id) {
  granary::fuse::PrepFuseUringCmd(ring, fuse_fd, s, s->iov, op, s->qid, commit_id);
}

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
    a->size = kBigSize;
  }
}

bool g_stall = false;  // serve: a READ at 1 MiB never answers

// Answers the request in slot `s` into it (reply header + payload).
void Answer(Slot* s) {
  const auto* in = reinterpret_cast<const fuse_in_header*>(s->h->in_out);
  fuse_in_header ih = *in;
  int err = 0;
  size_t len = 0;
  switch (ih.opcode) {
    case FUSE_LOOKUP: {
      const char* name = s->payload;
      if (ih.nodeid != FUSE_ROOT_ID || std::strcmp(name, "big") != 0) {
        err = -ENOENT;
        break;
      }
      auto* e = reinterpret_cast<fuse_entry_out*>(s->payload);
      std::memset(e, 0, sizeof *e);
      e->nodeid = kBig;
      e->attr_valid = 3600;
      e->entry_valid = 3600;
      FillAttr(kBig, &e->attr);
      len = sizeof *e;
      break;
    }
    case FUSE_GETATTR: {
      auto* a = reinterpret_cast<fuse_attr_out*>(s->payload);
      std::memset(a, 0, sizeof *a);
      a->attr_valid = 3600;
      FillAttr(ih.nodeid, &a->attr);
      len = sizeof *a;
      break;
    }
    case FUSE_OPEN: {
      auto* o = reinterpret_cast<fuse_open_out*>(s->payload);
      std::memset(o, 0, sizeof *o);
      len = sizeof *o;
      break;
    }
    case FUSE_READ: {
      fuse_read_in r;
      std::memcpy(&r, s->h->op_in, sizeof r);
      if (g_stall && r.offset == (1u << 20)) {
        std::fprintf(stderr, "serve: stalling READ unique=%llu at 1 MiB\n", (unsigned long long)ih.unique);
        for (;;) pause();
      }
      size_t n = r.offset >= kBigSize ? 0 : std::min<size_t>(r.size, kBigSize - r.offset);
      for (size_t i = 0; i < n; ++i) s->payload[i] = Pattern(r.offset + i);
      len = n;
      break;
    }
    case FUSE_RELEASE:
    case FUSE_FLUSH:
      break;
    default:
      err = -ENOSYS;
  }
  fuse_out_header oh{};
  oh.unique = ih.unique;
  oh.error = err;
  oh.len = static_cast<uint32_t>(sizeof oh + (err ? 0 : len));
  std::memcpy(s->h->in_out, &oh, sizeof oh);
  s->h->ring_ent_in_out.payload_sz = static_cast<uint32_t>(err ? 0 : len);
}

// One thread per slot: submit `first` (REGISTER, or COMMIT of an adopted request), then serve.
void Serve(Slot* s, uint32_t first, uint64_t commit_id) {
  io_uring ring;
  if (io_uring_queue_init(2, &ring, IORING_SETUP_SQE128) < 0) return;
  Prep(&ring, s, first, commit_id);
  for (;;) {
    io_uring_cqe* cqe = nullptr;
    int rc = io_uring_submit_and_wait(&ring, 1);
    if (rc < 0 && rc != -EINTR) break;
    if (io_uring_peek_cqe(&ring, &cqe) != 0) continue;
    int res = cqe->res;
    io_uring_cqe_seen(&ring, cqe);
    if (res < 0) {
      std::fprintf(stderr, "entry of queue %u: %s\n", s->qid, std::strerror(-res));
      break;
    }
    uint64_t unique = s->h->ring_ent_in_out.commit_id;
    Answer(s);
    Prep(&ring, s, kUringCmdCommitAndFetch, unique);
  }
}

void DevLoop() {  // FORGET, INTERRUPT
  std::vector<char> buf(kPayload + 4096);
  for (;;) {
    ssize_t n = read(fuse_fd, buf.data(), buf.size());
    if (n < 0 && (errno == EINTR || errno == EAGAIN || errno == ENOENT)) continue;
    if (n < 0) return;
  }
}

int main(int argc, char** argv) {
  if (argc >= 3 && std::string(argv[1]) == "serve") {
    g_stall = true;
    fuse_fd = open("/dev/fuse", O_RDWR | O_CLOEXEC);
    std::string opts = "fd=" + std::to_string(fuse_fd) + ",rootmode=40000,user_id=0,group_id=0";
    if (mount("adopt", argv[2], "fuse.adopt", MS_NOSUID | MS_NODEV, opts.c_str()) != 0) return perror("mount"), 1;
    std::vector<char> buf(kPayload + 4096);
    ssize_t n = read(fuse_fd, buf.data(), buf.size());
    auto* in = reinterpret_cast<fuse_in_header*>(buf.data());
    auto* init = reinterpret_cast<fuse_init_in*>(in + 1);
    if (n <= 0 || in->opcode != FUSE_INIT) return 1;
    fuse_init_out o{};
    o.major = FUSE_KERNEL_VERSION;
    o.minor = init->minor;
    o.max_readahead = init->max_readahead;
    uint64_t want = FUSE_ASYNC_READ | FUSE_MAX_PAGES | FUSE_INIT_EXT | kInitOverIoUring;
    o.flags = static_cast<uint32_t>(want);
    o.flags2 = static_cast<uint32_t>(want >> 32);
    o.max_background = 64;
    o.congestion_threshold = 48;
    o.max_write = 128 * 1024;
    o.max_pages = 256;
    fuse_out_header oh{};
    oh.unique = in->unique;
    oh.len = sizeof oh + sizeof o;
    iovec iov[2] = {{&oh, sizeof oh}, {&o, sizeof o}};
    if (writev(fuse_fd, iov, 2) < 0) return perror("init reply"), 1;
    int shm = memfd_create("granary-uring-entries", MFD_CLOEXEC);
    if (ftruncate(shm, kSlots * kSlot) != 0) return 1;
    void* base = mmap(reinterpret_cast<void*>(kBase), kSlots * kSlot, PROT_READ | PROT_WRITE,
                      MAP_SHARED | MAP_FIXED_NOREPLACE, shm, 0);
    if (base == MAP_FAILED) return perror("mmap"), 1;
    std::vector<Slot> slots;
    for (int i = 0; i < kSlots; ++i) slots.push_back(SlotAt(static_cast<char*>(base), i));
    std::vector<std::thread> ts;
    for (auto& s : slots) ts.emplace_back(Serve, &s, kUringCmdRegister, 0);
    ts.emplace_back(DevLoop);
    std::printf("READY pid=%d fd=%d shm=%d\n", getpid(), fuse_fd, shm);
    std::fflush(stdout);
    for (;;) pause();
  }
  if (argc >= 6 && std::string(argv[1]) == "adopt") {
    int pid = std::atoi(argv[2]);
    int pidfd = static_cast<int>(syscall(SYS_pidfd_open, pid, 0));
    fuse_fd = static_cast<int>(syscall(SYS_pidfd_getfd, pidfd, std::atoi(argv[3]), 0));
    int shm = static_cast<int>(syscall(SYS_pidfd_getfd, pidfd, std::atoi(argv[4]), 0));
    if (fuse_fd < 0 || shm < 0) return perror("pidfd_getfd"), 1;
    kill(pid, SIGKILL);
    pollfd p{pidfd, POLLIN, 0};
    poll(&p, 1, 5000);  // readable once it is gone
    usleep(200000);     // and its rings torn down
    void* base = mmap(reinterpret_cast<void*>(kBase), kSlots * kSlot, PROT_READ | PROT_WRITE,
                      MAP_SHARED | MAP_FIXED_NOREPLACE, shm, 0);
    if (base == MAP_FAILED) return perror("mmap at the predecessor's address"), 1;
    std::vector<std::thread> ts;
    // Entries of our own first: requests that came while no entry was registered wait in their
    // queue, and only a commit fetches them (a registration does not).
    static std::vector<char> own(kSlots * kSlot);
    static std::vector<Slot> mine;
    for (int i = 0; i < kSlots; ++i) mine.push_back(SlotAt(own.data(), i));
    for (auto& s : mine) ts.emplace_back(Serve, &s, kUringCmdRegister, 0);
    usleep(100000);
    static std::vector<Slot> slots;
    for (int i = 0; i < kSlots; ++i) slots.push_back(SlotAt(static_cast<char*>(base), i));
    for (auto& s : slots) {      uint64_t unique = s.h->ring_ent_in_out.commit_id;
      // An entry never used holds zeros; one whose last request was answered holds the reply's
      // header there (its commit then fails with ENOENT: nothing to adopt).
      std::fprintf(stderr, "adopt: entry of queue %u: unique %llu\n", s.qid, (unsigned long long)unique);
      if (unique == 0) continue;
      Answer(&s);  // a request (or a stale one: its commit fails with ENOENT)
      ts.emplace_back(Serve, &s, kUringCmdCommitAndFetch, unique);
    }
    // A request on each CPU's queue: its commit fetches what waited there meanwhile.
    for (int q = 0; q < kQueues; ++q) {
      std::thread([q, mnt = std::string(argv[5])] {
        cpu_set_t cpus;
        CPU_ZERO(&cpus);
        CPU_SET(q, &cpus);
        sched_setaffinity(0, sizeof cpus, &cpus);
        struct statx st;
        statx(AT_FDCWD, mnt.c_str(), AT_STATX_FORCE_SYNC, STATX_BASIC_STATS, &st);
      }).join();
    }
    ts.emplace_back(DevLoop);
    std::printf("ADOPTED\n");
    std::fflush(stdout);
    for (;;) pause();
  }
  std::fprintf(stderr, "usage: granary-fuse-uring-adopt serve MNT | adopt PID FD SHM MNT\n");
  return 2;
}
