// The FUSE operations of a granary-fuse mount (libfuse's low-level table, which MakeOps in
// fuse/mount.cc fills) and the helpers the files holding them share. Internal to fuse/.
//
//   fuse/ops_meta.cc     INIT and the read-mode choice, lookup, getattr, directories, statfs, the
//                        refusals of a read-only mount; the access trace's namespace paths
//   fuse/ops_read.cc     open, read, release: the read modes' data path (its design note)
//   fuse/ops_write.cc    create, write, flush/fsync of written files, setattr, mkdir, unlink,
//                        rmdir, rename (mounts with write=through or back; fuse/writes.h)
//   fuse/passthrough.h   passthrough mode's backing files, one per inode, kept after the last close
//                        (PassthroughOpens: the rules, apart from the kernel)
//
// Each operation takes the mount's state (fuse/fs_state.h, which also says what each lock guards)
// and a Reply (fuse/reply.h), may run on any of libfuse's threads beside any other, and answers
// once, errors through fuse/errno.h. The Op* functions are the adapters libfuse calls (FsOf(req),
// FuseReply(req)); tests/fuse/ops_test.cc drives the operations without them.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "fuse/client.h"
#include "fuse/fs_state.h"
#include "fuse/reply.h"
#include "fuse/trace.h"
#include "proto/granary.pb.h"

namespace granary::fuse::internal {

// ---- Names, attributes and the write calls, apart from libfuse (as the data path below) ----
// fuse/ops_meta.cc
void Lookup(Fs* fs, Reply& r, fuse_ino_t parent, const char* name);
void Getattr(Fs* fs, Reply& r, fuse_ino_t ino);
void Opendir(Fs* fs, Reply& r, fuse_ino_t ino, fuse_file_info* fi);
void Readdir(Fs* fs, Reply& r, fuse_ino_t ino, size_t size, off_t off);
void Readdirplus(Fs* fs, Reply& r, fuse_ino_t ino, size_t size, off_t off);
void Statfs(Fs* fs, Reply& r);
// fuse/ops_write.cc (mounts with write=through or back; fuse/writes.h)
void Create(Fs* fs, Reply& r, fuse_ino_t parent, const char* name, mode_t mode, fuse_file_info* fi);
void Write(Fs* fs, Reply& r, fuse_ino_t ino, const char* buf, size_t size, off_t off, fuse_file_info* fi);
void Setattr(Fs* fs, Reply& r, fuse_ino_t ino, struct stat* attr, int to_set, fuse_file_info* fi);
void Mkdir(Fs* fs, Reply& r, fuse_ino_t parent, const char* name, mode_t mode);
void Unlink(Fs* fs, Reply& r, fuse_ino_t parent, const char* name);
void Rmdir(Fs* fs, Reply& r, fuse_ino_t parent, const char* name);
void Rename(Fs* fs, Reply& r, fuse_ino_t parent, const char* name, fuse_ino_t new_parent, const char* new_name,
            unsigned flags);

// ---- The adapters to libfuse (MakeOps' table) ----
// fuse/ops_meta.cc
void OpInit(void* userdata, fuse_conn_info* conn);
void OpLookup(fuse_req_t req, fuse_ino_t parent, const char* name);
void OpForget(fuse_req_t req, fuse_ino_t, uint64_t);
void OpForgetMulti(fuse_req_t req, size_t, fuse_forget_data*);
void OpGetattr(fuse_req_t req, fuse_ino_t ino, fuse_file_info*);
void OpOpendir(fuse_req_t req, fuse_ino_t ino, fuse_file_info* fi);
void OpReaddir(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off, fuse_file_info*);
void OpReaddirplus(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off, fuse_file_info*);
void OpReleasedir(fuse_req_t req, fuse_ino_t, fuse_file_info*);
void OpStatfs(fuse_req_t req, fuse_ino_t);
void OpGetxattr(fuse_req_t req, fuse_ino_t, const char*, size_t);
void OpListxattr(fuse_req_t req, fuse_ino_t, size_t);
void OpReadlink(fuse_req_t req, fuse_ino_t);
void OpSetattr(fuse_req_t req, fuse_ino_t, struct stat*, int, fuse_file_info*);
void OpMknod(fuse_req_t req, fuse_ino_t, const char*, mode_t, dev_t);
void OpMkdir(fuse_req_t req, fuse_ino_t, const char*, mode_t);
void OpUnlink(fuse_req_t req, fuse_ino_t, const char*);
void OpRmdir(fuse_req_t req, fuse_ino_t, const char*);
void OpSymlink(fuse_req_t req, const char*, fuse_ino_t, const char*);
void OpRename(fuse_req_t req, fuse_ino_t, const char*, fuse_ino_t, const char*, unsigned);
void OpLink(fuse_req_t req, fuse_ino_t, fuse_ino_t, const char*);
void OpWrite(fuse_req_t req, fuse_ino_t, const char*, size_t, off_t, fuse_file_info*);
void OpCreate(fuse_req_t req, fuse_ino_t, const char*, mode_t, fuse_file_info*);
void OpSetxattr(fuse_req_t req, fuse_ino_t, const char*, const char*, size_t, int);
void OpRemovexattr(fuse_req_t req, fuse_ino_t, const char*);
void OpFallocate(fuse_req_t req, fuse_ino_t, int, off_t, off_t, fuse_file_info*);
// Whether this process may do what needs CAP_SYS_ADMIN (backing files, new mounts).
bool HasCapSysAdmin();
// Namespace paths of master inodes, for the access trace (fuse/trace.h).
Tracer::PathFn TracePaths(Fs* fs);

// ---- The data path, apart from libfuse ----
// Open, read, release, flush and fsync answer through a Reply (fuse/reply.h) and take the mount's
// state as an argument, so tests drive them without a kernel (tests/fuse/ops_test.cc); the Op*
// functions are their adapters to libfuse (FsOf(req), FuseReply(req)).
//   fuse/ops_read.cc   Open, Read, Release, Flush, Fsync (the read modes: its design note)
//   fuse/ops_write.cc  OpenForWrite and the write handles' READ, FLUSH/FSYNC and RELEASE
void Open(Fs* fs, Reply& r, fuse_ino_t ino, fuse_file_info* fi);
void Read(Fs* fs, Reply& r, fuse_ino_t ino, size_t size, off_t off, const fuse_file_info* fi);
void Release(Fs* fs, Reply& r, fuse_ino_t ino, const fuse_file_info* fi);
void Flush(Fs* fs, Reply& r, fuse_ino_t ino, const fuse_file_info* fi);
void Fsync(Fs* fs, Reply& r, fuse_ino_t ino, const fuse_file_info* fi);
// An OPEN for writing (or with O_TRUNC): joins or starts the inode's write (fuse/writes.h).
void OpenForWrite(Fs* fs, Reply& r, fuse_ino_t ino, fuse_file_info* fi);
// READ, FLUSH/FSYNC and RELEASE of a write handle.
void ReadWriteHandle(Fs* fs, Reply& r, fuse_ino_t ino, uint64_t fh, size_t size, off_t off);
void CommitWriteHandle(Fs* fs, Reply& r, fuse_ino_t ino, uint64_t fh, bool wait_upload);
void ReleaseWriteHandle(Fs* fs, Reply& r, fuse_ino_t ino, uint64_t fh);

// fuse/ops_read.cc
void OpOpen(fuse_req_t req, fuse_ino_t ino, fuse_file_info* fi);
void OpRead(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off, fuse_file_info* fi);
void OpRelease(fuse_req_t req, fuse_ino_t ino, fuse_file_info* fi);
void OpFlush(fuse_req_t req, fuse_ino_t, fuse_file_info*);
void OpFsync(fuse_req_t req, fuse_ino_t, int, fuse_file_info*);

// A read mode's answer to a read-only OPEN (fuse.open; the modes' rules: fuse/ops_read.cc's design
// note). The connection's mode is chosen at INIT (ChooseMode, fuse/ops_meta.cc) and read at each
// OPEN (Fs::mode): passthrough turns to kernel at the first backing file the kernel refuses.
class ReadMode {
 public:
  virtual ~ReadMode() = default;
  virtual OpenMode kind() const = 0;
  // Answers the OPEN of `ino` (read-only, not a file being written here).
  virtual void Open(Fs* fs, Reply& r, fuse_ino_t ino, fuse_file_info* fi) const = 0;
};
// The mode's rules (one object per mode, no state of its own: the state is the Fs's).
const ReadMode& ReadModeOf(OpenMode mode);

// Ends one open in passthrough mode's bookkeeping (fuse/passthrough.h): its RELEASE, or an open
// whose reply was interrupted. Nothing for opens it did not count.
void EndOpen(Fs* fs, uint64_t kino, uint64_t fh, const OpenFile& of);

}  // namespace granary::fuse::internal
