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
// Each operation finds the mount's state with FsOf(req) (fuse/fs_state.h, which also says what
// each lock guards), may run on any of libfuse's threads beside any other, and replies to its
// request once, errors through fuse/errno.h.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "fuse/client.h"
#include "fuse/fs_state.h"
#include "fuse/trace.h"
#include "proto/granary.pb.h"

namespace granary::fuse::internal {

// ---- fuse/ops_meta.cc ----
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
// Namespace paths of master inodes, for the access trace (fuse/trace.h).
Tracer::PathFn TracePaths(Fs* fs);

// ---- fuse/ops_write.cc ----
// An OPEN for writing (or with O_TRUNC): joins or starts the inode's write (fuse/writes.h).
void OpenForWrite(fuse_req_t req, fuse_ino_t ino, fuse_file_info* fi);
// READ, FLUSH/FSYNC and RELEASE of a write handle.
void ReadWriteHandle(fuse_req_t req, fuse_ino_t ino, uint64_t fh, size_t size, off_t off);
void CommitWriteHandle(fuse_req_t req, fuse_ino_t ino, uint64_t fh, bool wait_upload);
void ReleaseWriteHandle(fuse_req_t req, fuse_ino_t ino, uint64_t fh);

// ---- fuse/ops_read.cc ----
void OpOpen(fuse_req_t req, fuse_ino_t ino, fuse_file_info* fi);
void OpRead(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off, fuse_file_info* fi);
void OpRelease(fuse_req_t req, fuse_ino_t ino, fuse_file_info* fi);
void OpFlush(fuse_req_t req, fuse_ino_t, fuse_file_info*);
void OpFsync(fuse_req_t req, fuse_ino_t, int, fuse_file_info*);

// Ends one open in passthrough mode's bookkeeping (fuse/passthrough.h): its RELEASE, or an open
// whose reply was interrupted. Nothing for opens it did not count.
void EndOpen(Fs* fs, uint64_t kino, uint64_t fh, const OpenFile& of);

}  // namespace granary::fuse::internal
