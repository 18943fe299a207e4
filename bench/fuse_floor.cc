// granary-fuse-floor: the floor of a FUSE request on this kernel, and a probe that measures it.
//
//   granary-fuse-floor serve MOUNTPOINT [--single] [--file-mb N] [--backing FILE]
//       A minimal low-level libfuse server that answers from memory: a root directory holding
//       `small` (4 KiB) and `big` (N MiB, default 64) whose bytes are a pattern computed on the
//       fly. Mounted with default_permissions, as granary-fuse is. No ioctl handler (libfuse
//       answers ENOSYS, as for granary-fuse). Multi-threaded session loop unless --single. Runs
//       until unmounted or SIGTERM; prints "READY" once mounted. With --backing FILE, `big` is
//       that file's size and every READ of it is one pread of FILE: the floor of a FUSE server
//       that reads a local under-storage itself, nothing cached (bench/cold_random.sh --floor).
//
//   granary-fuse-floor serve MOUNTPOINT --writes DIR [--single]
//       The floor of a writable FUSE filesystem (bench/writes.sh's "fuse floor" row): a minimal
//       low-level libfuse server whose tree starts empty and lives in memory behind one mutex. It
//       answers LOOKUP, GETATTR, MKDIR, CREATE, WRITE, SETATTR, FLUSH, RELEASE, and OPEN, READ,
//       OPENDIR, READDIR, UNLINK and RMDIR, enough to read the tree back and remove it (no RENAME,
//       links or xattrs: ENOSYS). Each created file is backed by a new local file in DIR (0600,
//       named by its inode), every WRITE one pwrite of it, closed at RELEASE; owner, mode, times and
//       size are kept in memory (a size change also truncates the backing file). It caches as
//       granary-fuse caches a writable mount: a file's name and attributes are not cached, found
//       or not (entry_timeout 0: close-to-open), a directory's name and attributes for 1 s; files are opened
//       for writing with direct_io, no writeback cache. Mounted with default_permissions and
//       allow_other, as granary-fuse is. Runs until unmounted or SIGTERM; prints "READY" once mounted.
//
//   granary-fuse-floor serve MOUNTPOINT --mirror DIR [--single]
//       The floor of a FUSE cache serving warm files from its local tier: DIR's tree, read-only,
//       served as granary-fuse's kernel read mode serves a cached dataset (OPEN answered ENOSYS,
//       READs spliced from each file's descriptor, the same INIT and timeouts; namespace mirror
//       below). bench/rig.sh's `fuse-floor` system mounts it over the rig's local copy of the
//       dataset: its CPU per GB beside Granary's warm epochs. Mounted with default_permissions,
//       allow_other and ro. Runs until unmounted or SIGTERM; prints "READY" once mounted.
//
//   granary-fuse-floor probe --file PATH --op OP [--threads T] [--seconds S]
//       T threads each issue one kind of request in a loop for S seconds, each on its own file
//       descriptor, and print one JSON line: ops, ops/s and the latency (mean, p50, p99 in µs)
//       of the round trips. OP is one of:
//         ioctl     TCGETS on the open file (what CPython's open() does through isatty()): FUSE_IOCTL
//         getattr   statx(AT_STATX_FORCE_SYNC): a GETATTR that the kernel's attribute cache cannot answer
//         read4k    a 4 KiB pread at a random aligned offset, O_DIRECT: a READ the page cache cannot answer
//         read128k  the same with 128 KiB
//
// bench/fuse_floor.sh runs both against this server and granary-fuse and prints the ratios;
// bench/writes.sh times its small-file writers against the --writes server.
#define FUSE_USE_VERSION 312
#include <dirent.h>
#include <fcntl.h>
#include <fuse3/fuse_lowlevel.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <termios.h>
#include <time.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

namespace {

constexpr fuse_ino_t kSmall = 2, kBig = 3;
constexpr size_t kSmallSize = 4096;
size_t big_size = 64ull << 20;
// The bytes every read is served from: 1 MiB of a pattern, repeated.
std::vector<char> pattern;
// --backing: `big`'s bytes come from this descriptor (-1: the pattern).
int backing_fd = -1;

size_t SizeOf(fuse_ino_t ino) { return ino == kSmall ? kSmallSize : big_size; }

struct stat Stat(fuse_ino_t ino) {
  struct stat st {};
  st.st_ino = ino;
  if (ino == FUSE_ROOT_ID) {
    st.st_mode = S_IFDIR | 0755;
    st.st_nlink = 2;
  } else {
    st.st_mode = S_IFREG | 0644;
    st.st_nlink = 1;
    st.st_size = static_cast<off_t>(SizeOf(ino));
  }
  return st;
}

void Lookup(fuse_req_t req, fuse_ino_t parent, const char* name) {
  fuse_ino_t ino = 0;
  if (parent == FUSE_ROOT_ID && std::strcmp(name, "small") == 0) ino = kSmall;
  if (parent == FUSE_ROOT_ID && std::strcmp(name, "big") == 0) ino = kBig;
  if (ino == 0) {
    fuse_reply_err(req, ENOENT);
    return;
  }
  fuse_entry_param e{};
  e.ino = ino;
  e.attr = Stat(ino);
  e.attr_timeout = 1.0;
  e.entry_timeout = 1.0;
  fuse_reply_entry(req, &e);
}

void Getattr(fuse_req_t req, fuse_ino_t ino, fuse_file_info*) {
  if (ino != FUSE_ROOT_ID && ino != kSmall && ino != kBig) {
    fuse_reply_err(req, ENOENT);
    return;
  }
  struct stat st = Stat(ino);
  fuse_reply_attr(req, &st, 1.0);
}

void Open(fuse_req_t req, fuse_ino_t ino, fuse_file_info* fi) {
  if (ino != kSmall && ino != kBig) {
    fuse_reply_err(req, EISDIR);
    return;
  }
  fi->keep_cache = 1;
  fuse_reply_open(req, fi);
}

void Read(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off, fuse_file_info*) {
  const size_t len = SizeOf(ino);
  if (static_cast<size_t>(off) >= len) {
    fuse_reply_buf(req, nullptr, 0);
    return;
  }
  size = std::min(size, len - static_cast<size_t>(off));
  if (ino == kBig && backing_fd >= 0) {
    thread_local std::vector<char> buf;
    buf.resize(std::max(buf.size(), size));
    ssize_t n = pread(backing_fd, buf.data(), size, off);
    if (n < 0) {
      fuse_reply_err(req, errno);
      return;
    }
    fuse_reply_buf(req, buf.data(), static_cast<size_t>(n));
    return;
  }
  // A read of at most 1 MiB (the kernel asks for at most max_pages) starting inside the pattern's first copy: one buffer.
  const size_t start = static_cast<size_t>(off) % (pattern.size() / 2);
  fuse_reply_buf(req, pattern.data() + start, size);
}

void Readdir(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off, fuse_file_info*) {
  if (ino != FUSE_ROOT_ID) {
    fuse_reply_err(req, ENOTDIR);
    return;
  }
  std::vector<char> buf(size);
  size_t used = 0;
  const char* names[] = {".", "..", "small", "big"};
  const fuse_ino_t inos[] = {FUSE_ROOT_ID, FUSE_ROOT_ID, kSmall, kBig};
  for (off_t i = off; i < 4; ++i) {
    struct stat st = Stat(inos[i]);
    size_t n = fuse_add_direntry(req, buf.data() + used, size - used, names[i], &st, i + 1);
    if (n > size - used) break;
    used += n;
  }
  fuse_reply_buf(req, buf.data(), used);
}

// --writes: the in-memory tree of the writable server. Inodes are never reused (no FORGET handler:
// a node lives as long as the server).
namespace wr {

struct Node {
  struct stat st {};
  std::map<std::string, fuse_ino_t> kids;  // a directory's entries
};

std::mutex mu;
std::unordered_map<fuse_ino_t, Node> nodes;  // guarded by mu
fuse_ino_t next_ino = FUSE_ROOT_ID + 1;      // guarded by mu
std::string dir;                             // the backing files' folder

constexpr double kDirAttrTimeout = 1.0;  // granary-fuse's for a writable directory (files: 0)

std::string BackingPath(fuse_ino_t ino) { return dir + "/" + std::to_string(ino); }

timespec Now() {
  timespec t{};
  clock_gettime(CLOCK_REALTIME, &t);
  return t;
}

double AttrTimeout(const struct stat& st) { return S_ISDIR(st.st_mode) ? kDirAttrTimeout : 0; }

fuse_entry_param Entry(fuse_ino_t ino, const struct stat& st) {
  fuse_entry_param e{};
  e.ino = ino;
  e.generation = 1;
  e.attr = st;
  e.attr_timeout = AttrTimeout(st);
  // A writable network filesystem: another node may make or remove a file's name (asked again at
  // every lookup); a directory's name may be a second old, as granary-fuse keeps it.
  e.entry_timeout = S_ISDIR(st.st_mode) ? kDirAttrTimeout : 0;
  return e;
}

// The node, or null; mu held.
Node* Find(fuse_ino_t ino) {
  auto it = nodes.find(ino);
  return it == nodes.end() ? nullptr : &it->second;
}

// A new node named `name` in directory `parent`, owned by the caller; mu held. 0 and *err set when
// the parent is gone or not a directory, or the name is taken.
fuse_ino_t Make(fuse_req_t req, fuse_ino_t parent, const char* name, mode_t mode, int* err) {
  Node* p = Find(parent);
  *err = p == nullptr ? ENOENT : !S_ISDIR(p->st.st_mode) ? ENOTDIR : p->kids.count(name) != 0 ? EEXIST : 0;
  if (*err != 0) return 0;
  const fuse_ino_t ino = next_ino++;
  Node n;
  const fuse_ctx* ctx = fuse_req_ctx(req);
  n.st.st_ino = ino;
  n.st.st_mode = mode;
  n.st.st_nlink = S_ISDIR(mode) ? 2 : 1;
  n.st.st_uid = ctx->uid;
  n.st.st_gid = ctx->gid;
  n.st.st_blksize = 4096;
  n.st.st_atim = n.st.st_mtim = n.st.st_ctim = Now();
  nodes.emplace(ino, std::move(n));
  p->kids.emplace(name, ino);
  p->st.st_mtim = p->st.st_ctim = Now();
  if (S_ISDIR(mode)) p->st.st_nlink++;
  return ino;
}

void Init(void*, fuse_conn_info* conn) {
  conn->want &= ~FUSE_CAP_WRITEBACK_CACHE;  // as granary-fuse: every write reaches the server
}

void Lookup(fuse_req_t req, fuse_ino_t parent, const char* name) {
  std::lock_guard<std::mutex> g(mu);
  Node* p = Find(parent);
  if (p == nullptr) return (void)fuse_reply_err(req, ENOENT);
  auto it = p->kids.find(name);
  if (it == p->kids.end()) {
    fuse_entry_param e{};  // ino 0: a negative entry, and entry_timeout 0: not remembered
    fuse_reply_entry(req, &e);
    return;
  }
  fuse_entry_param e = Entry(it->second, nodes.at(it->second).st);
  fuse_reply_entry(req, &e);
}

void Getattr(fuse_req_t req, fuse_ino_t ino, fuse_file_info*) {
  std::lock_guard<std::mutex> g(mu);
  Node* n = Find(ino);
  if (n == nullptr) return (void)fuse_reply_err(req, ENOENT);
  fuse_reply_attr(req, &n->st, AttrTimeout(n->st));
}

void Mkdir(fuse_req_t req, fuse_ino_t parent, const char* name, mode_t mode) {
  std::lock_guard<std::mutex> g(mu);
  int err = 0;
  const fuse_ino_t ino = Make(req, parent, name, S_IFDIR | (mode & 07777), &err);
  if (ino == 0) return (void)fuse_reply_err(req, err);
  fuse_entry_param e = Entry(ino, nodes.at(ino).st);
  fuse_reply_entry(req, &e);
}

// A name that exists is EEXIST even without O_EXCL: the kernel sends CREATE only after a LOOKUP
// found nothing, so that is a race with another creator, which a benchmark's writer never runs.
void Create(fuse_req_t req, fuse_ino_t parent, const char* name, mode_t mode, fuse_file_info* fi) {
  fuse_ino_t ino;
  {
    std::lock_guard<std::mutex> g(mu);
    int err = 0;
    ino = Make(req, parent, name, S_IFREG | (mode & 07777), &err);
    if (ino == 0) return (void)fuse_reply_err(req, err);
  }
  // The node is visible before its backing file exists; an OPEN of it meanwhile finds no file
  // (ENOENT), which no writer here can race into.
  const int fd = open(BackingPath(ino).c_str(), O_CREAT | O_EXCL | O_RDWR | O_CLOEXEC, 0600);
  std::lock_guard<std::mutex> g(mu);
  if (fd < 0) {
    const int err = errno;
    nodes.erase(ino);
    if (Node* p = Find(parent)) p->kids.erase(name);
    return (void)fuse_reply_err(req, err);
  }
  fi->fh = static_cast<uint64_t>(fd);
  fi->direct_io = 1;  // as granary-fuse's writes: from the writer's buffer into the request
  fi->keep_cache = 0;
  fuse_entry_param e = Entry(ino, nodes.at(ino).st);
  if (fuse_reply_create(req, &e, fi) != 0) close(fd);  // the creator is gone: no RELEASE follows
}

void Open(fuse_req_t req, fuse_ino_t ino, fuse_file_info* fi) {
  {
    std::lock_guard<std::mutex> g(mu);
    Node* n = Find(ino);
    if (n == nullptr) return (void)fuse_reply_err(req, ENOENT);
    if (S_ISDIR(n->st.st_mode)) return (void)fuse_reply_err(req, EISDIR);
  }
  const int acc = fi->flags & O_ACCMODE;
  const int fd = open(BackingPath(ino).c_str(), acc | (fi->flags & O_TRUNC) | O_CLOEXEC);
  if (fd < 0) return (void)fuse_reply_err(req, errno);
  if (fi->flags & O_TRUNC) {  // atomic_o_trunc (not asked for: the kernel sends a SETATTR instead)
    std::lock_guard<std::mutex> g(mu);
    if (Node* n = Find(ino)) n->st.st_size = n->st.st_blocks = 0;
  }
  fi->fh = static_cast<uint64_t>(fd);
  fi->direct_io = acc != O_RDONLY;
  fi->keep_cache = 0;
  if (fuse_reply_open(req, fi) != 0) close(fd);
}

void Read(fuse_req_t req, fuse_ino_t, size_t size, off_t off, fuse_file_info* fi) {
  thread_local std::vector<char> buf;
  buf.resize(std::max(buf.size(), size));
  const ssize_t n = pread(static_cast<int>(fi->fh), buf.data(), size, off);
  if (n < 0) return (void)fuse_reply_err(req, errno);
  fuse_reply_buf(req, buf.data(), static_cast<size_t>(n));
}

void Write(fuse_req_t req, fuse_ino_t ino, const char* buf, size_t size, off_t off, fuse_file_info* fi) {
  const ssize_t n = pwrite(static_cast<int>(fi->fh), buf, size, off);
  if (n < 0) return (void)fuse_reply_err(req, errno);
  {
    std::lock_guard<std::mutex> g(mu);
    if (Node* node = Find(ino)) {
      const off_t end = off + n;
      if (end > node->st.st_size) {
        node->st.st_size = end;
        node->st.st_blocks = (end + 511) / 512;
      }
      node->st.st_mtim = node->st.st_ctim = Now();
    }
  }
  fuse_reply_write(req, static_cast<size_t>(n));
}

void Setattr(fuse_req_t req, fuse_ino_t ino, struct stat* attr, int to_set, fuse_file_info* fi) {
  if (to_set & FUSE_SET_ATTR_SIZE) {  // the bytes first, outside the lock
    bool file = false;
    {
      std::lock_guard<std::mutex> g(mu);
      Node* n = Find(ino);
      if (n == nullptr) return (void)fuse_reply_err(req, ENOENT);
      file = S_ISREG(n->st.st_mode);
    }
    if (!file) return (void)fuse_reply_err(req, EISDIR);
    const int rc = fi != nullptr ? ftruncate(static_cast<int>(fi->fh), attr->st_size)
                                 : truncate(BackingPath(ino).c_str(), attr->st_size);
    if (rc != 0) return (void)fuse_reply_err(req, errno);
  }
  std::lock_guard<std::mutex> g(mu);
  Node* n = Find(ino);
  if (n == nullptr) return (void)fuse_reply_err(req, ENOENT);
  struct stat& st = n->st;
  const timespec now = Now();
  if (to_set & FUSE_SET_ATTR_MODE) st.st_mode = (st.st_mode & S_IFMT) | (attr->st_mode & 07777);
  if (to_set & FUSE_SET_ATTR_UID) st.st_uid = attr->st_uid;
  if (to_set & FUSE_SET_ATTR_GID) st.st_gid = attr->st_gid;
  if (to_set & FUSE_SET_ATTR_SIZE) {
    st.st_size = attr->st_size;
    st.st_blocks = (attr->st_size + 511) / 512;
    st.st_mtim = now;
  }
  if (to_set & FUSE_SET_ATTR_ATIME) st.st_atim = attr->st_atim;
  if (to_set & FUSE_SET_ATTR_ATIME_NOW) st.st_atim = now;
  if (to_set & FUSE_SET_ATTR_MTIME) st.st_mtim = attr->st_mtim;
  if (to_set & FUSE_SET_ATTR_MTIME_NOW) st.st_mtim = now;
  st.st_ctim = (to_set & FUSE_SET_ATTR_CTIME) ? attr->st_ctim : now;
  fuse_reply_attr(req, &st, AttrTimeout(st));
}

void Flush(fuse_req_t req, fuse_ino_t, fuse_file_info*) { fuse_reply_err(req, 0); }

void Release(fuse_req_t req, fuse_ino_t, fuse_file_info* fi) {
  close(static_cast<int>(fi->fh));
  fuse_reply_err(req, 0);
}

// A directory's listing, taken at OPENDIR (READDIR's offsets index it).
struct Listing {
  std::vector<std::pair<std::string, struct stat>> entries;
};

void Opendir(fuse_req_t req, fuse_ino_t ino, fuse_file_info* fi) {
  auto* l = new Listing;
  {
    std::lock_guard<std::mutex> g(mu);
    Node* n = Find(ino);
    if (n == nullptr || !S_ISDIR(n->st.st_mode)) {
      delete l;
      return (void)fuse_reply_err(req, n == nullptr ? ENOENT : ENOTDIR);
    }
    struct stat dot {};
    dot.st_ino = ino;
    dot.st_mode = S_IFDIR;
    l->entries.emplace_back(".", dot);
    l->entries.emplace_back("..", dot);  // the kernel fills in ".."'s inode itself
    for (const auto& [name, kid] : n->kids) l->entries.emplace_back(name, nodes.at(kid).st);
  }
  fi->fh = reinterpret_cast<uint64_t>(l);
  if (fuse_reply_open(req, fi) != 0) delete l;
}

void Readdir(fuse_req_t req, fuse_ino_t, size_t size, off_t off, fuse_file_info* fi) {
  const auto* l = reinterpret_cast<const Listing*>(fi->fh);
  std::vector<char> buf(size);
  size_t used = 0;
  for (size_t i = static_cast<size_t>(off); i < l->entries.size(); ++i) {
    const auto& [name, st] = l->entries[i];
    const size_t n = fuse_add_direntry(req, buf.data() + used, size - used, name.c_str(), &st, static_cast<off_t>(i + 1));
    if (n > size - used) break;
    used += n;
  }
  fuse_reply_buf(req, buf.data(), used);
}

void Releasedir(fuse_req_t req, fuse_ino_t, fuse_file_info* fi) {
  delete reinterpret_cast<Listing*>(fi->fh);
  fuse_reply_err(req, 0);
}

// Removes `name` from `parent` if it is a directory (dir) or not; mu held. 0, or an errno.
int Remove(fuse_ino_t parent, const char* name, bool dir) {
  Node* p = Find(parent);
  if (p == nullptr) return ENOENT;
  auto it = p->kids.find(name);
  if (it == p->kids.end()) return ENOENT;
  Node& n = nodes.at(it->second);
  if (dir && !S_ISDIR(n.st.st_mode)) return ENOTDIR;
  if (!dir && S_ISDIR(n.st.st_mode)) return EISDIR;
  if (dir && !n.kids.empty()) return ENOTEMPTY;
  // The node stays (an open file keeps its backing descriptor and attributes); only its name goes.
  if (!dir) unlink(BackingPath(it->second).c_str());
  n.st.st_nlink = 0;
  n.st.st_ctim = Now();
  p->kids.erase(it);
  if (dir) p->st.st_nlink--;
  p->st.st_mtim = p->st.st_ctim = Now();
  return 0;
}

void Unlink(fuse_req_t req, fuse_ino_t parent, const char* name) {
  std::lock_guard<std::mutex> g(mu);
  fuse_reply_err(req, Remove(parent, name, false));
}

void Rmdir(fuse_req_t req, fuse_ino_t parent, const char* name) {
  std::lock_guard<std::mutex> g(mu);
  fuse_reply_err(req, Remove(parent, name, true));
}

fuse_lowlevel_ops Ops() {
  Node root;
  root.st.st_ino = FUSE_ROOT_ID;
  root.st.st_mode = S_IFDIR | 0755;
  root.st.st_nlink = 2;
  root.st.st_uid = getuid();
  root.st.st_gid = getgid();
  root.st.st_blksize = 4096;
  root.st.st_atim = root.st.st_mtim = root.st.st_ctim = Now();
  nodes.emplace(FUSE_ROOT_ID, std::move(root));
  fuse_lowlevel_ops ops{};
  ops.init = Init;
  ops.lookup = Lookup;
  ops.getattr = Getattr;
  ops.setattr = Setattr;
  ops.mkdir = Mkdir;
  ops.unlink = Unlink;
  ops.rmdir = Rmdir;
  ops.create = Create;
  ops.open = Open;
  ops.read = Read;
  ops.write = Write;
  ops.flush = Flush;
  ops.release = Release;
  ops.opendir = Opendir;
  ops.readdir = Readdir;
  ops.releasedir = Releasedir;
  return ops;
}

}  // namespace wr

// --mirror: a read-only view of a local directory tree, served as granary-fuse's kernel read mode
// serves a warm dataset from its tier: the same INIT (readdirplus, async reads, ~1 MiB reads,
// splice), the same 60 s entry and attribute timeouts, OPEN answered ENOSYS (the kernel opens
// files itself and sends READs with no handle), and every READ answered from the file's
// descriptor by splice (fuse_reply_data), as granary-fuse answers from a tier file. What is left
// is the least any FUSE cache pays to hand a warm local file to a reader: the floor of the rig's
// warm epochs (bench/rig.sh --systems fuse-floor). Inodes are the source's; nodes are never
// forgotten (no FORGET handler), descriptors kept open while the server runs.
namespace mirror {

struct Node {
  std::string path;
  int fd = -1;  // opened for reading at the first READ
};

std::mutex mu;
std::unordered_map<fuse_ino_t, Node> nodes;  // guarded by mu; FUSE_ROOT_ID is the root's
constexpr double kTimeout = 60.0;            // fuse.entry_timeout and fuse.attr_timeout's defaults

std::string PathOf(fuse_ino_t ino) {
  std::lock_guard<std::mutex> g(mu);
  auto it = nodes.find(ino);
  return it == nodes.end() ? std::string() : it->second.path;
}

// lstat of `path`, its node registered; the FUSE inode number (the root's is FUSE_ROOT_ID).
int StatAndRegister(const std::string& path, struct stat* st, fuse_ino_t* ino) {
  if (lstat(path.c_str(), st) != 0) return errno;
  *ino = st->st_ino;
  std::lock_guard<std::mutex> g(mu);
  if (nodes.at(FUSE_ROOT_ID).path == path) {
    *ino = FUSE_ROOT_ID;
  } else {
    nodes.try_emplace(*ino, Node{path, -1});
  }
  st->st_ino = *ino;
  return 0;
}

void Init(void*, fuse_conn_info* conn) {
  if (conn->capable & FUSE_CAP_READDIRPLUS) conn->want |= FUSE_CAP_READDIRPLUS;
  if (conn->capable & FUSE_CAP_ASYNC_READ) conn->want |= FUSE_CAP_ASYNC_READ;
  conn->want &= ~FUSE_CAP_WRITEBACK_CACHE;
  conn->max_readahead = (1 << 20) - (16 << 10);  // granary-fuse's kMaxReadahead (fuse/fs_state.h)
  conn->max_write = conn->max_readahead;
  if (conn->capable & FUSE_CAP_SPLICE_WRITE) conn->want |= FUSE_CAP_SPLICE_WRITE;
  if (conn->capable & FUSE_CAP_SPLICE_MOVE) conn->want |= FUSE_CAP_SPLICE_MOVE;
}

void Lookup(fuse_req_t req, fuse_ino_t parent, const char* name) {
  const std::string dir = PathOf(parent);
  if (dir.empty()) return static_cast<void>(fuse_reply_err(req, ENOENT));
  fuse_entry_param e{};
  if (int err = StatAndRegister(dir + "/" + name, &e.attr, &e.ino); err != 0) {
    return static_cast<void>(fuse_reply_err(req, err));
  }
  e.attr_timeout = e.entry_timeout = kTimeout;
  fuse_reply_entry(req, &e);
}

void Getattr(fuse_req_t req, fuse_ino_t ino, fuse_file_info*) {
  const std::string path = PathOf(ino);
  struct stat st {};
  fuse_ino_t id = 0;
  if (path.empty()) return static_cast<void>(fuse_reply_err(req, ENOENT));
  if (int err = StatAndRegister(path, &st, &id); err != 0) return static_cast<void>(fuse_reply_err(req, err));
  fuse_reply_attr(req, &st, kTimeout);
}

void Open(fuse_req_t req, fuse_ino_t, fuse_file_info*) { fuse_reply_err(req, ENOSYS); }

void Read(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off, fuse_file_info*) {
  int fd;
  {
    std::lock_guard<std::mutex> g(mu);
    auto it = nodes.find(ino);
    if (it == nodes.end()) return static_cast<void>(fuse_reply_err(req, ENOENT));
    if (it->second.fd < 0) it->second.fd = open(it->second.path.c_str(), O_RDONLY | O_CLOEXEC);
    fd = it->second.fd;
  }
  if (fd < 0) return static_cast<void>(fuse_reply_err(req, errno));
  fuse_bufvec bv = FUSE_BUFVEC_INIT(size);
  bv.buf[0].flags = static_cast<fuse_buf_flags>(FUSE_BUF_IS_FD | FUSE_BUF_FD_SEEK);
  bv.buf[0].fd = fd;
  bv.buf[0].pos = off;
  fuse_reply_data(req, &bv, FUSE_BUF_SPLICE_MOVE);
}

void Opendir(fuse_req_t req, fuse_ino_t ino, fuse_file_info* fi) {
  const std::string path = PathOf(ino);
  DIR* d = path.empty() ? nullptr : opendir(path.c_str());
  if (d == nullptr) return static_cast<void>(fuse_reply_err(req, path.empty() ? ENOENT : errno));
  auto* names = new std::vector<std::string>;
  while (dirent* de = readdir(d)) names->emplace_back(de->d_name);
  closedir(d);
  fi->fh = reinterpret_cast<uint64_t>(names);
  fi->cache_readdir = 1;
  fi->keep_cache = 1;
  fuse_reply_open(req, fi);
}

void Readdirplus(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off, fuse_file_info* fi) {
  const auto& names = *reinterpret_cast<std::vector<std::string>*>(fi->fh);
  const std::string dir = PathOf(ino);
  std::vector<char> buf(size);
  size_t used = 0;
  for (size_t i = static_cast<size_t>(off); i < names.size(); ++i) {
    fuse_entry_param e{};
    if (names[i] == "." || names[i] == "..") {
      e.attr.st_mode = S_IFDIR;  // e.ino 0: the kernel keeps no entry; a nonzero d_ino so readdir lists it
      e.attr.st_ino = ino;
    } else if (StatAndRegister(dir + "/" + names[i], &e.attr, &e.ino) != 0) {
      continue;
    } else {
      e.attr_timeout = e.entry_timeout = kTimeout;
    }
    size_t n = fuse_add_direntry_plus(req, buf.data() + used, size - used, names[i].c_str(), &e, static_cast<off_t>(i + 1));
    if (n > size - used) break;
    used += n;
  }
  fuse_reply_buf(req, buf.data(), used);
}

void Releasedir(fuse_req_t req, fuse_ino_t, fuse_file_info* fi) {
  delete reinterpret_cast<std::vector<std::string>*>(fi->fh);
  fuse_reply_err(req, 0);
}

fuse_lowlevel_ops Ops(const std::string& root) {
  nodes.emplace(FUSE_ROOT_ID, Node{root, -1});
  fuse_lowlevel_ops ops{};
  ops.init = Init;
  ops.lookup = Lookup;
  ops.getattr = Getattr;
  ops.open = Open;
  ops.read = Read;
  ops.opendir = Opendir;
  ops.readdirplus = Readdirplus;
  ops.releasedir = Releasedir;
  return ops;
}

}  // namespace mirror

// The read-only server's tree: `small` and `big`.
fuse_lowlevel_ops ReadOps() {
  pattern.resize(2 << 20);
  std::mt19937_64 rng(42);
  for (size_t i = 0; i < pattern.size() / 2; i += 8) {
    uint64_t v = rng();
    std::memcpy(pattern.data() + i, &v, 8);
  }
  std::memcpy(pattern.data() + pattern.size() / 2, pattern.data(), pattern.size() / 2);

  fuse_lowlevel_ops ops{};
  ops.lookup = Lookup;
  ops.getattr = Getattr;
  ops.open = Open;
  ops.read = Read;
  ops.readdir = Readdir;
  return ops;
}

// Mounts `ops` with mount options `opts` and serves until unmounted or a signal.
int Serve(const std::string& mountpoint, bool single, const fuse_lowlevel_ops& ops, const char* opts) {
  const char* argv[] = {"granary-fuse-floor", "-o", opts};
  fuse_args args = FUSE_ARGS_INIT(3, const_cast<char**>(argv));
  fuse_session* se = fuse_session_new(&args, &ops, sizeof ops, nullptr);
  if (se == nullptr) return 1;
  if (fuse_set_signal_handlers(se) != 0 || fuse_session_mount(se, mountpoint.c_str()) != 0) {
    fuse_session_destroy(se);
    return 1;
  }
  std::printf("READY\n");
  std::fflush(stdout);
  int rc;
  if (single) {
    rc = fuse_session_loop(se);
  } else {
    fuse_loop_config* cfg = fuse_loop_cfg_create();
    fuse_loop_cfg_set_max_threads(cfg, 16);
    rc = fuse_session_loop_mt(se, cfg);
    fuse_loop_cfg_destroy(cfg);
  }
  fuse_session_unmount(se);
  fuse_remove_signal_handlers(se);
  fuse_session_destroy(se);
  return rc < 0 ? 1 : 0;
}

int Probe(const std::string& file, const std::string& op, int threads, double seconds) {
  const bool read = op == "read4k" || op == "read128k";
  if (!read && op != "ioctl" && op != "getattr") {
    std::fprintf(stderr, "unknown --op %s: one of ioctl, getattr, read4k, read128k\n", op.c_str());
    return 2;
  }
  const size_t size = op == "read128k" ? 131072 : 4096;
  struct stat st {};
  if (stat(file.c_str(), &st) != 0) {
    std::fprintf(stderr, "%s: %s\n", file.c_str(), std::strerror(errno));
    return 1;
  }
  const uint64_t slots = std::max<uint64_t>(1, static_cast<uint64_t>(st.st_size) / size);
  std::vector<std::vector<double>> lat(threads);
  std::atomic<int> errors{0};
  std::atomic<bool> go{false};
  const auto stop_after = std::chrono::duration<double>(seconds);
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&, t] {
      int fd = open(file.c_str(), O_RDONLY | (read ? O_DIRECT : 0));
      if (fd < 0) {
        errors++;
        return;
      }
      void* buf = nullptr;
      if (posix_memalign(&buf, 4096, size) != 0) {
        close(fd);
        errors++;
        return;
      }
      std::mt19937_64 rng(t + 1);
      auto& mine = lat[t];
      mine.reserve(1 << 20);
      while (!go) std::this_thread::yield();
      const auto begin = std::chrono::steady_clock::now();
      for (;;) {
        const auto s = std::chrono::steady_clock::now();
        if (s - begin > stop_after) break;
        if (op == "ioctl") {
          termios tio;
          if (ioctl(fd, TCGETS, &tio) == 0) errors++;  // a regular file is no terminal
        } else if (op == "getattr") {
          struct statx sx;
          if (statx(AT_FDCWD, file.c_str(), AT_STATX_FORCE_SYNC, STATX_BASIC_STATS, &sx) != 0) errors++;
        } else {
          off_t off = static_cast<off_t>((rng() % slots) * size);
          if (pread(fd, buf, size, off) != static_cast<ssize_t>(size)) errors++;
        }
        mine.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - s).count());
      }
      free(buf);
      close(fd);
    });
  }
  const auto t0 = std::chrono::steady_clock::now();
  go = true;
  for (auto& th : pool) th.join();
  const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::vector<double> all;
  for (auto& v : lat) all.insert(all.end(), v.begin(), v.end());
  if (all.empty()) {
    std::fprintf(stderr, "no request completed (%d errors)\n", errors.load());
    return 1;
  }
  std::sort(all.begin(), all.end());
  double sum = 0;
  for (double v : all) sum += v;
  auto pct = [&](double p) { return all[std::min(all.size() - 1, static_cast<size_t>(p * all.size()))]; };
  std::printf("{\"op\": \"%s\", \"threads\": %d, \"ops\": %zu, \"ops_per_s\": %.0f, \"mean_us\": %.2f, "
              "\"p50_us\": %.2f, \"p99_us\": %.2f, \"errors\": %d}\n",
              op.c_str(), threads, all.size(), all.size() / wall, sum / all.size(), pct(0.5), pct(0.99),
              errors.load());
  return errors.load() == 0 ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"The floor of a FUSE request: a minimal server, and a probe of round trips."};
  app.require_subcommand(1);
  std::string mountpoint, file, op;
  bool single = false;
  int threads = 1;
  double seconds = 3;
  size_t file_mb = 64;
  auto* serve = app.add_subcommand("serve", "mount the minimal server");
  serve->add_option("mountpoint", mountpoint)->required();
  serve->add_flag("--single", single, "single-threaded session loop");
  serve->add_option("--file-mb", file_mb, "size of `big` in MiB");
  std::string backing;
  serve->add_option("--backing", backing, "serve `big` by a pread of this file per READ");
  std::string writes;
  serve->add_option("--writes", writes, "serve a writable tree in memory, each file backed by a new file in this folder")
      ->check(CLI::ExistingDirectory)
      ->excludes("--backing")
      ->excludes("--file-mb");
  std::string mirror_dir;
  serve->add_option("--mirror", mirror_dir, "serve this directory tree read-only, as granary-fuse's kernel mode serves a warm tier")
      ->check(CLI::ExistingDirectory)
      ->excludes("--backing")
      ->excludes("--file-mb")
      ->excludes("--writes");
  auto* probe = app.add_subcommand("probe", "measure round trips");
  probe->add_option("--file", file)->required();
  probe->add_option("--op", op)->required();
  probe->add_option("--threads", threads)->check(CLI::Range(1, 256));
  probe->add_option("--seconds", seconds)->check(CLI::Range(0.1, 600.0));
  CLI11_PARSE(app, argc, argv);
  if (serve->parsed() && !writes.empty()) {
    wr::dir = writes;
    return Serve(mountpoint, single, wr::Ops(), "default_permissions,allow_other,fsname=floor-writes");
  }
  if (serve->parsed() && !mirror_dir.empty()) {
    char* real = realpath(mirror_dir.c_str(), nullptr);
    std::string root = real ? real : mirror_dir;
    free(real);
    return Serve(mountpoint, single, mirror::Ops(root), "default_permissions,allow_other,ro,fsname=floor-mirror");
  }
  if (serve->parsed()) {
    big_size = file_mb << 20;
    if (!backing.empty()) {
      backing_fd = open(backing.c_str(), O_RDONLY | O_CLOEXEC);
      struct stat st {};
      if (backing_fd < 0 || fstat(backing_fd, &st) != 0) {
        std::fprintf(stderr, "--backing %s: %s\n", backing.c_str(), std::strerror(errno));
        return 1;
      }
      big_size = static_cast<size_t>(st.st_size);
    }
    return Serve(mountpoint, single, ReadOps(), "default_permissions,fsname=floor");
  }
  return Probe(file, op, threads, seconds);
}
