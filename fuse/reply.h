// Reply: how a FUSE operation answers its request, apart from libfuse. The data path's operations
// (open, read, release, flush, fsync: fuse/ops.h, "The data path") take one and know nothing of
// the kernel; FuseReply writes to libfuse, and tests record (tests/fuse/ops_test.cc), so the
// operations' rules — interrupted opens, the kernel mode's ENOSYS, handles a predecessor left,
// ESTALE when the under-storage changed — are tested without a mount.
//
// Contract: an operation answers exactly once. Each answer returns 0 when it reached the kernel,
// or a negative errno when it did not (the request was interrupted: nobody waits for it, and for
// an OPEN no RELEASE will come, so what the open took must be given back). Errors go through the
// errno funnel (fuse/errno.h), which calls Err.
#pragma once

#define FUSE_USE_VERSION 312
#include <fuse_lowlevel.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/types.h>
#include <sys/uio.h>

#include <cstddef>

namespace granary::fuse {
namespace internal {
struct Connection;  // fuse/fs_state.h
}

class Reply {
 public:
  virtual ~Reply() = default;
  // Who asked (0 when unknown).
  virtual pid_t pid() const = 0;
  virtual uid_t uid() const = 0;
  virtual gid_t gid() const = 0;
  // Its supplementary groups, as fuse_req_getgroups: how many it has (up to `size` put in `list`),
  // or a negative errno when they cannot be known.
  virtual int groups(int size, gid_t* list) const = 0;
  // The FUSE connection the request came on (a mount may have an older one draining beside its
  // current one: fuse/fs_state.h, Connection); null when unknown (tests): the mount's current one.
  virtual internal::Connection* connection() const { return nullptr; }
  // An error, or 0: done, nothing to return (RELEASE, FLUSH, FSYNC).
  virtual int Err(int err) = 0;
  // An open's handle and flags; `backing_id` > 0: passthrough to that backing file
  // (fuse/session_io.h: the reply carries it).
  virtual int Open(const fuse_file_info& fi, int backing_id) = 0;
  int Open(const fuse_file_info& fi) { return Open(fi, 0); }
  // A read's bytes: one buffer, buffers in memory, or buffers that may be descriptors to splice
  // from (libfuse's fuse_bufvec; FUSE_BUF_FD_SEEK: at the buffer's pos).
  virtual int Buf(const char* data, size_t n) = 0;
  virtual int Iov(const iovec* iov, int count) = 0;
  virtual int Data(fuse_bufvec* bv, fuse_buf_copy_flags flags) = 0;
  // A name's entry (e.ino 0: a negative entry, remembered for e.entry_timeout), attributes for
  // `timeout` seconds, a new file's entry and open handle, bytes written, the file system's sizes.
  virtual int Entry(const fuse_entry_param& e) = 0;
  virtual int Attr(const struct stat& st, double timeout) = 0;
  virtual int Create(const fuse_entry_param& e, const fuse_file_info& fi) = 0;
  virtual int Write(size_t written) = 0;
  virtual int Statfs(const struct statvfs& v) = 0;
  // A directory listing's entries are packed into a buffer (answered with Buf) as libfuse packs
  // them: the bytes the entry takes, which is more than `size` when it does not fit.
  virtual size_t AddDirent(char* buf, size_t size, const char* name, const struct stat& st, off_t next) = 0;
  virtual size_t AddDirentPlus(char* buf, size_t size, const char* name, const fuse_entry_param& e, off_t next) = 0;
};

// The answer to a request from the kernel, through libfuse.
class FuseReply final : public Reply {
 public:
  explicit FuseReply(fuse_req_t req) : req_(req) {}
  pid_t pid() const override;
  uid_t uid() const override;
  gid_t gid() const override;
  int groups(int size, gid_t* list) const override;
  internal::Connection* connection() const override;
  int Err(int err) override;
  using Reply::Open;
  int Open(const fuse_file_info& fi, int backing_id) override;
  int Buf(const char* data, size_t n) override;
  int Iov(const iovec* iov, int count) override;
  int Data(fuse_bufvec* bv, fuse_buf_copy_flags flags) override;
  int Entry(const fuse_entry_param& e) override;
  int Attr(const struct stat& st, double timeout) override;
  int Create(const fuse_entry_param& e, const fuse_file_info& fi) override;
  int Write(size_t written) override;
  int Statfs(const struct statvfs& v) override;
  size_t AddDirent(char* buf, size_t size, const char* name, const struct stat& st, off_t next) override;
  size_t AddDirentPlus(char* buf, size_t size, const char* name, const fuse_entry_param& e, off_t next) override;

 private:
  fuse_req_t req_;
};

}  // namespace granary::fuse
