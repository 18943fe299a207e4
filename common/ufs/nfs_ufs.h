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
// fails with FAILED_PRECONDITION. Thread-safe.
#pragma once

#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "common/ufs/ufs.h"

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

 private:
  explicit NfsUfs(std::string uri) : uri_(std::move(uri)) {}
  StatusOr<nfs_context*> Connect();
  StatusOr<nfs_context*> Acquire();
  // `broken`: the context saw a transport error; it is destroyed and reconnected on next use.
  void Release(nfs_context* c, bool broken);

  std::string uri_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<nfs_context*> idle_;  // GUARDED_BY(mu_)
  size_t missing_ = 0;              // contexts to reconnect; GUARDED_BY(mu_)
};

}  // namespace granary
