// NfsUfs: `nfs://server/export/path` as under-storage through libnfs, a userspace NFS client (no
// kernel mount, no privileges). NFSv4 unless the URI says otherwise; URI arguments go to libnfs
// (`?version=4&nfsport=2049`). The path after the server is mounted as the root (NFSv4 reaches
// any directory below the pseudo-root).
//
// An nfs_context is not thread-safe, so the client keeps a pool of `connections` mounted contexts
// (mount option, default 4) and lends one to each call. A context that saw a transport error is
// destroyed and replaced by a fresh connection on next use. Reads are issued in pieces of at most
// 1 MiB (libnfs 4.0 fails larger NFSv4 READs and breaks the connection). Versions are "<size>-<mtime ns>-<inode>"
// as for local files; reads check the version before and after, so a file changed underneath
// fails with FAILED_PRECONDITION. Reads, stats and listings keep the retry contract of s3://
// (UfsRetry: max_attempts, retry_deadline): a call that fails with a retryable status — the
// server unreachable, a connection broken mid-call — is tried again on a fresh connection after a
// pause; a listing only until it has handed on its first page. Writes are not retried: a rename or
// remove whose reply was lost would fail the second time for having succeeded the first. Thread-safe.
//
// Listing streams: libnfs's nfs_opendir reads a whole directory into memory before the first entry
// is returned (a million-entry directory would be ~100 MB of dirents), so List sends its own NFSv4
// COMPOUNDs instead — PUTROOTFH, LOOKUP of each path component, READDIR with the cookie and
// verifier of the previous reply and the attributes a UfsEntry needs — and hands each reply's
// entries (kReaddirBytes, a few hundred) to the caller before asking for the next. No Stat per
// entry either: the attributes come with the names.
#pragma once

#include <condition_variable>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "common/thread_annotations.h"
#include "ufs/ufs.h"

struct nfs_context;

namespace granary {

class NfsUfs : public UnderFileSystem {
 public:
  static StatusOr<std::shared_ptr<UnderFileSystem>> Open(const std::string& uri,
                                                         const std::map<std::string, std::string>& options);
  ~NfsUfs() override;

  const std::string& uri() const override { return uri_; }
  StatusOr<UfsEntry> Stat(const std::string& path) override;
  Status List(const std::string& dir, size_t page_size, const PageFn& on_page) override;
  StatusOr<size_t> Read(const std::string& path, const std::string& version, uint64_t offset, size_t length,
                        char* out) override;
  // Writes, as LocalUfs makes them: a hidden temporary file beside the target (kWritingPrefix),
  // fsynced (COMMIT), renamed over it.
  StatusOr<std::unique_ptr<UfsWriter>> Create(const std::string& path, uint32_t mode, const WriteCaller& as) override;
  Status Remove(const std::string& path, const WriteCaller& as) override;
  Status MakeDir(const std::string& path, uint32_t mode, const WriteCaller& as) override;
  Status RemoveDir(const std::string& path, const WriteCaller& as) override;
  Status Rename(const std::string& from, const std::string& to, const WriteCaller& as) override;
  Status SetAttr(const std::string& path, const UfsAttrChange& change, const WriteCaller& as) override;

 private:
  friend class NfsWriter;
  // One try of List (handed_on: a page went to on_page) and of Read; the public calls retry them.
  Status ListOnce(const std::vector<std::string>& path, const std::string& dir, size_t page_size,
                  const PageFn& on_page, bool* handed_on);
  StatusOr<size_t> ReadOnce(const std::string& path, const std::string& version, uint64_t offset, size_t length,
                            char* out);
  // Where the next READDIR continues (RFC 7530 16.24: cookie 0 and a zero verifier to start).
  struct ReaddirCursor {
    uint64_t cookie = 0;
    char verifier[8] = {};
    bool eof = false;
  };
  static constexpr uint32_t kReaddirBytes = 64 * 1024;  // maxcount of one READDIR reply

  explicit NfsUfs(std::string uri) : uri_(std::move(uri)) {}
  // `export_path`, when set, receives the path mounted on the server ("/export/sub").
  StatusOr<nfs_context*> Connect(std::string* export_path = nullptr);
  // Stat on a context the caller holds (follows symbolic links).
  StatusOr<UfsEntry> StatOn(nfs_context* c, const std::string& path);
  // One READDIR round trip on `c` for the directory at `path` (components from the server's root),
  // appending the files and directories it returned to `out` and advancing `cursor`. `dir` names
  // the directory (relative to the mount) and symbolic links in it are resolved with StatOn.
  // UNAVAILABLE on transport errors (the context is then broken).
  Status ReaddirPage(nfs_context* c, const std::vector<std::string>& path, const std::string& dir,
                     ReaddirCursor& cursor, std::vector<UfsEntry>& out);
  StatusOr<nfs_context*> Acquire();
  // OK when no directory on the way to `path` is a symbolic link (NfsUfs's write calls).
  Status CheckNoLinks(nfs_context* c, const std::string& path);
  // `broken`: the context saw a transport error; it is destroyed and reconnected on next use.
  void Release(nfs_context* c, bool broken);

  std::string uri_;
  std::vector<std::string> export_components_;  // the mounted path's components; set by Open
  UfsRetry retry_;  // max_attempts, retry_deadline: reads, stats and listings (set by Open)
  Mutex mu_;
  std::condition_variable cv_;
  std::vector<nfs_context*> idle_ GUARDED_BY(mu_);
  size_t missing_ GUARDED_BY(mu_) = 0;  // contexts to reconnect
};

}  // namespace granary
