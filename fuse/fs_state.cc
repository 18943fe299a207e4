// The helpers every FUSE operation shares (fuse/fs_state.h): a master Attr as the kernel sees it
// (ToStat, ToEntry) and a file's open information (FileInfoOf).
#include "fuse/fs_state.h"

#include <sys/stat.h>

#include <utility>

namespace granary::fuse::internal {

struct stat ToStat(const Fs* fs, const rpc::Attr& a) {
  struct stat st {};
  st.st_ino = fs->ToKernel(a.ino());
  st.st_mode = (a.type() == rpc::DIRECTORY ? S_IFDIR : S_IFREG) | (a.mode() & 07777);
  st.st_nlink = a.nlink();
  st.st_uid = a.uid();
  st.st_gid = a.gid();
  st.st_size = static_cast<off_t>(a.size());
  st.st_blksize = 128 * 1024;
  st.st_blocks = static_cast<blkcnt_t>((a.size() + 511) / 512);
  st.st_mtim.tv_sec = a.mtime_ns() / 1'000'000'000;
  st.st_mtim.tv_nsec = a.mtime_ns() % 1'000'000'000;
  st.st_atim = st.st_mtim;
  st.st_ctim = st.st_mtim;
  return st;
}

fuse_entry_param ToEntry(Fs* fs, const rpc::Attr& a) {
  if (a.type() != rpc::DIRECTORY) fs->NoteVersion(fs->ToKernel(a.ino()), a.version_hash());
  fuse_entry_param e{};
  e.ino = fs->ToKernel(a.ino());
  e.generation = 1;
  e.attr = ToStat(fs, a);
  e.attr_timeout = Seconds(fs->cfg.fuse.attr_timeout);
  e.entry_timeout = Seconds(fs->cfg.fuse.entry_timeout);
  return e;
}

// The file's open information: from the FileCache, else from the master.
StatusOr<rpc::FileInfo> FileInfoOf(Fs* fs, uint64_t master_ino) {
  if (auto cached = fs->files->Get(master_ino)) return std::move(*cached);
  auto f = fs->client->GetFile(master_ino);
  if (!f.ok()) return f.status();
  fs->files->Put(master_ino, *f);
  return f;
}

}  // namespace granary::fuse::internal
