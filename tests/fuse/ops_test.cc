// The data path's operations (fuse/ops.h: Open, Read, Release, Flush, Fsync) driven without a
// kernel: a fake Client holds the files, a recording Reply keeps each answer. What only mounted
// tests covered before: an interrupted open, the kernel mode's ENOSYS and by-inode reads, a handle
// a predecessor left, ESTALE when the under-storage changed, the errno funnel's answers.
#include <fcntl.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <cerrno>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "fuse/ops.h"
#include "fuse/reply.h"
#include "tests/testutil/testutil.h"

namespace granary::fuse::internal {
namespace {

// The master and the local worker of one node, in memory: files by master inode. A read of a
// version that is no longer the file's fails as the worker's does (VersionChangedError).
class FakeClient final : public Client {
 public:
  struct File {
    rpc::FileInfo info;
    std::string bytes;
  };
  void Put(uint64_t ino, const std::string& bytes, const std::string& version) {
    File f;
    f.info.mutable_attr()->set_ino(ino);
    f.info.mutable_attr()->set_type(rpc::REGULAR);
    f.info.mutable_attr()->set_size(bytes.size());
    f.info.mutable_attr()->set_mode(0644);
    f.info.mutable_attr()->set_version_hash(std::hash<std::string>()(version));
    f.info.set_mount_id(1);
    f.info.set_ufs_path("f" + std::to_string(ino));
    f.info.set_version(version);
    f.info.set_block_size(4096);
    f.bytes = bytes;
    files_[ino] = std::move(f);
  }

  StatusOr<rpc::FileInfo> GetFile(uint64_t ino) override {
    get_file_calls++;
    auto it = files_.find(ino);
    if (it == files_.end()) return NotFoundError("inode " + std::to_string(ino));
    return it->second.info;
  }
  Status Read(const rpc::FileInfo& file, uint64_t offset, uint64_t length, ReadResult* out, bool, char*,
              bool) override {
    reads++;
    auto it = files_.find(file.attr().ino());
    if (it == files_.end()) return NotFoundError("no such file");
    if (it->second.info.version() != file.version()) return VersionChangedError("the file changed");
    const std::string& b = it->second.bytes;
    if (offset >= b.size()) return Status::OK();
    LocalChannel::Piece p;
    p.data = b.substr(offset, length);
    p.length = p.data.size();
    p.source = NodeSource::kLocal;
    out->pieces.push_back(std::move(p));
    return Status::OK();
  }
  void Prefetch(const rpc::FileInfo&, uint64_t first, uint64_t count) override {
    hints.emplace_back(first, count);
  }

  // One directory, the root (inode 1), holds every file put, by name.
  void Name(const std::string& name, uint64_t ino) { names_[name] = ino; }
  StatusOr<rpc::Attr> Lookup(uint64_t parent, const std::string& name, rpc::FileInfo*) override {
    lookups++;
    auto it = names_.find(name);
    if (parent != 1 || it == names_.end()) return NotFoundError(name + " is not in the directory");
    if (during_lookup) during_lookup();
    return files_.at(it->second).info.attr();
  }
  // Marks a file's attributes writable (below a writable mount).
  void SetWritable(uint64_t ino) { files_.at(ino).info.mutable_attr()->set_writable(true); }
  std::function<void()> during_lookup;  // runs while a lookup is asked (a connection replaced meanwhile)
  StatusOr<rpc::Attr> GetAttr(uint64_t ino) override {
    getattrs++;
    if (!master_up) return UnavailableError("the master is not answering");
    if (ino == 1) {
      rpc::Attr a;
      a.set_ino(1);
      a.set_type(rpc::DIRECTORY);
      a.set_mode(0755);
      a.set_parent(1);
      a.set_generation(1);
      return a;
    }
    auto it = files_.find(ino);
    if (it == files_.end()) return NotFoundError("inode " + std::to_string(ino));
    return it->second.info.attr();
  }
  Status ReadDir(uint64_t ino, uint64_t after, uint32_t limit, rpc::ReadDirResponse* out, bool) override {
    listings++;
    if (ino != 1) return NotFoundError("not a directory");
    uint64_t cookie = 0;
    for (const auto& [name, child] : names_) {  // cookies 1, 2, ... in name order
      if (++cookie <= after) continue;
      if (out->entries_size() >= static_cast<int>(limit)) return Status::OK();
      rpc::DirEntry* e = out->add_entries();
      e->set_name(name);
      *e->mutable_attr() = files_.at(child).info.attr();
      e->set_cookie(cookie);
    }
    out->set_end(true);
    return Status::OK();
  }
  StatusOr<rpc::WorkerStats> WorkerStats() override {
    rpc::WorkerStats s;
    s.set_capacity_bytes(100 << 20);
    s.set_used_bytes(30 << 20);
    return s;
  }
  bool master_up = true;
  int lookups = 0, getattrs = 0, listings = 0;

  // Nothing else is asked here.
  StatusOr<rpc::Attr> Resolve(const std::string&) override { return Unasked(); }
  Status MasterAnswers() override { return Status::OK(); }
  Status NoteOpens(const std::vector<uint64_t>&) override { return Status::OK(); }
  StatusOr<rpc::WriteTarget> PrepareCreate(const rpc::PrepareCreateRequest&) override { return Unasked(); }
  StatusOr<rpc::WriteTarget> PrepareWrite(uint64_t) override { return Unasked(); }
  StatusOr<rpc::Attr> MakeDir(const rpc::MakeDirRequest&) override { return Unasked(); }
  Status Remove(const rpc::RemoveRequest&) override { return Unasked(); }
  Status Rename(const rpc::RenameRequest&) override { return Unasked(); }
  StatusOr<rpc::Attr> SetAttr(const rpc::SetAttrRequest&) override { return Unasked(); }
  StatusOr<std::string> LocalSocketPath() override { return Unasked(); }
  StatusOr<rpc::Report> GetReport() override { return Unasked(); }
  StatusOr<std::unique_ptr<FileLease>> LeaseFile(const rpc::FileInfo&, bool) override { return Unasked(); }
  void TrimSourceReads() override {}
  const ClientCounters& counters() const override { return counters_; }
  const metrics::Histogram& master_latency() const override { return latency_; }

  int get_file_calls = 0, reads = 0, unasked = 0;
  std::vector<std::pair<uint64_t, uint64_t>> hints;

 private:
  Status Unasked() {
    unasked++;
    return UnimplementedError("not asked on the data path");
  }
  std::map<uint64_t, File> files_;
  std::map<std::string, uint64_t> names_;
  ClientCounters counters_;
  metrics::Histogram latency_;
};

// Every answer an operation gave, in order. `open_result`: what an OPEN answer returns (a negative
// errno: the request was interrupted, as libfuse says when the kernel gave up on it).
class RecordingReply final : public Reply {
 public:
  struct Answer {
    enum Kind { kErr, kOpen, kData, kEntry, kAttr, kCreate, kWrite, kStatfs } kind = kErr;
    int err = 0;
    fuse_file_info fi{};
    int backing_id = 0;
    std::string bytes;
    fuse_entry_param entry{};  // kEntry, kCreate; kAttr: attr and attr_timeout
    size_t written = 0;
    struct statvfs statfs {};
  };
  pid_t pid() const override { return 4242; }
  Connection* connection() const override { return conn; }
  Connection* conn = nullptr;  // the connection the request came on (null: the mount's current one)
  uid_t uid() const override { return 1000; }
  gid_t gid() const override { return 1000; }
  int groups(int, gid_t*) const override { return 0; }
  int Err(int err) override {
    answers.push_back({Answer::kErr, err, {}, 0, {}});
    return 0;
  }
  using Reply::Open;
  int Open(const fuse_file_info& fi, int backing_id) override {
    answers.push_back({Answer::kOpen, 0, fi, backing_id, {}});
    return open_result;
  }
  int Buf(const char* data, size_t n) override {
    answers.push_back({Answer::kData, 0, {}, 0, std::string(data == nullptr ? "" : std::string(data, n))});
    return 0;
  }
  int Iov(const iovec* iov, int count) override {
    std::string b;
    for (int i = 0; i < count; ++i) b.append(static_cast<const char*>(iov[i].iov_base), iov[i].iov_len);
    answers.push_back({Answer::kData, 0, {}, 0, std::move(b)});
    return 0;
  }
  int Data(fuse_bufvec* bv, fuse_buf_copy_flags) override {
    std::string b(fuse_buf_size(bv), '\0');
    fuse_bufvec dst = FUSE_BUFVEC_INIT(b.size());
    dst.buf[0].mem = b.data();
    const ssize_t n = fuse_buf_copy(&dst, bv, static_cast<fuse_buf_copy_flags>(0));
    b.resize(n < 0 ? 0 : static_cast<size_t>(n));
    answers.push_back({Answer::kData, 0, {}, 0, std::move(b)});
    return 0;
  }
  int Entry(const fuse_entry_param& e) override {
    Answer a{Answer::kEntry, 0, {}, 0, {}};
    a.entry = e;
    answers.push_back(a);
    return 0;
  }
  int Attr(const struct stat& st, double timeout) override {
    Answer a{Answer::kAttr, 0, {}, 0, {}};
    a.entry.attr = st;
    a.entry.attr_timeout = timeout;
    answers.push_back(a);
    return 0;
  }
  int Create(const fuse_entry_param& e, const fuse_file_info& fi) override {
    Answer a{Answer::kCreate, 0, fi, 0, {}};
    a.entry = e;
    answers.push_back(a);
    return open_result;
  }
  int Write(size_t written) override {
    Answer a{Answer::kWrite, 0, {}, 0, {}};
    a.written = written;
    answers.push_back(a);
    return 0;
  }
  int Statfs(const struct statvfs& v) override {
    Answer a{Answer::kStatfs, 0, {}, 0, {}};
    a.statfs = v;
    answers.push_back(a);
    return 0;
  }
  // Packed as libfuse packs them (its packing asks nothing of the request).
  size_t AddDirent(char* buf, size_t size, const char* name, const struct stat& st, off_t next) override {
    names.emplace_back(name);
    return fuse_add_direntry(nullptr, buf, size, name, &st, next);
  }
  size_t AddDirentPlus(char* buf, size_t size, const char* name, const fuse_entry_param& e, off_t next) override {
    names.emplace_back(name);
    return fuse_add_direntry_plus(nullptr, buf, size, name, &e, next);
  }

  // The one answer given (fails the test when there is not exactly one).
  Answer Only() const {
    EXPECT_EQ(answers.size(), 1u) << "an operation answers exactly once";
    return answers.empty() ? Answer{Answer::kErr, -1, {}, 0, {}} : answers.back();
  }

  std::vector<Answer> answers;
  std::vector<std::string> names;  // a listing's names, in the order packed
  int open_result = 0;
};

constexpr fuse_ino_t kIno = 7;

class OpsTest : public ::testing::Test {
 protected:
  // A mount's state in `mode` ("kernel", "daemon"), fuse.writes `writes`, over the fake.
  void Make(const std::string& mode, bool writes) {
    Config cfg = Config::Defaults();
    cfg.fuse.open = mode;
    cfg.fuse.writes = writes;
    cfg.fuse.readahead_blocks = 2;
    fs_ = std::make_unique<Fs>();
    auto client = std::make_unique<FakeClient>();
    client_ = client.get();
    fs_->client = std::move(client);
    InitFs(fs_.get(), cfg);
    fs_->passthrough = std::make_unique<PassthroughOpens>(nullptr, cfg.fuse.attr_timeout);
    data_ = testing::RandomBytes(10000, 3);
    client_->Put(kIno, data_, "v1");
  }
  RecordingReply::Answer DoOpen(int flags = O_RDONLY, int open_result = 0, fuse_file_info* out = nullptr) {
    RecordingReply r;
    r.open_result = open_result;
    fuse_file_info fi{};
    fi.flags = flags;
    Open(fs_.get(), r, kIno, &fi);
    if (out) *out = fi;
    return r.Only();
  }
  RecordingReply::Answer DoRead(uint64_t fh, off_t off, size_t size) {
    RecordingReply r;
    fuse_file_info fi{};
    fi.fh = fh;
    Read(fs_.get(), r, kIno, size, off, &fi);
    return r.Only();
  }
  RecordingReply::Answer DoRelease(uint64_t fh) {
    RecordingReply r;
    fuse_file_info fi{};
    fi.fh = fh;
    Release(fs_.get(), r, kIno, &fi);
    return r.Only();
  }

  std::unique_ptr<Fs> fs_;
  FakeClient* client_ = nullptr;
  std::string data_;
};

// Kernel mode with writes, on connections (fuse/fs_state.h, Connection): one that went open-free
// answers every OPEN and FLUSH ENOSYS (the kernel opens by itself there), and a write open that
// raced the switch EROFS; the current, writable one answers opens at once. A lookup that found its
// connection replaced while it asked, and shows a writable entry, is answered ESTALE (the kernel
// walks the path again, into the new connection); the same lookup on a connection already draining
// is answered (a process working in a directory of it reads on).
TEST_F(OpsTest, AnOpenFreeConnectionOpensNothingAndALookupThatReplacedItIsWalkedAgain) {
  Make("kernel", /*writes=*/true);
  Connection old_conn, new_conn;
  old_conn.fs = new_conn.fs = fs_.get();
  old_conn.open_free = true;
  fs_->current = &old_conn;
  auto open_on = [&](Connection* c, int flags) {
    RecordingReply r;
    r.conn = c;
    fuse_file_info fi{};
    fi.flags = flags;
    Open(fs_.get(), r, kIno, &fi);
    return r.Only();
  };
  EXPECT_EQ(open_on(&old_conn, O_RDONLY).err, ENOSYS);
  EXPECT_EQ(open_on(&old_conn, O_WRONLY).err, EROFS);
  {
    RecordingReply r;
    r.conn = &old_conn;
    fuse_file_info fi{};
    Flush(fs_.get(), r, kIno, &fi);
    EXPECT_EQ(r.Only().err, ENOSYS);
  }
  client_->Name("ckpt", kIno);
  client_->SetWritable(kIno);
  client_->during_lookup = [&] { fs_->current = &new_conn; };  // replaced while this lookup asked
  {
    RecordingReply r;
    r.conn = &old_conn;
    Lookup(fs_.get(), r, FUSE_ROOT_ID, "ckpt");
    EXPECT_EQ(r.Only().err, ESTALE) << "the kernel must walk the path again, into the new connection";
  }
  client_->during_lookup = nullptr;
  fs_->entries->Erase(EntryKey(1, "ckpt"));
  auto lookup_on = [&](Connection* c) {
    RecordingReply r;
    r.conn = c;
    Lookup(fs_.get(), r, FUSE_ROOT_ID, "ckpt");
    return r.Only();
  };
  // Just replaced: a walk that was under way through the old connection (or the kernel's second
  // LOOKUP after the first ESTALE made its dentry invalid) is sent round once per process and name.
  old_conn.replaced_at_ns = std::chrono::steady_clock::now().time_since_epoch().count();
  EXPECT_EQ(lookup_on(&old_conn).err, ESTALE);
  auto again = lookup_on(&old_conn);  // the same process again: answered (it works in a directory there)
  EXPECT_EQ(again.kind, RecordingReply::Answer::kEntry);
  EXPECT_EQ(again.entry.ino, kIno);
  // Past the window: answered.
  old_conn.replaced_at_ns = (std::chrono::steady_clock::now() - std::chrono::seconds(60)).time_since_epoch().count();
  {
    RecordingReply r;  // the old connection, draining now: answered
    r.conn = &old_conn;
    Lookup(fs_.get(), r, FUSE_ROOT_ID, "ckpt");
    EXPECT_EQ(r.Only().kind, RecordingReply::Answer::kEntry);
    EXPECT_EQ(r.Only().entry.ino, kIno);
  }
  {
    RecordingReply r;  // the new connection: answered, and its opens answered at once
    r.conn = &new_conn;
    Lookup(fs_.get(), r, FUSE_ROOT_ID, "ckpt");
    EXPECT_EQ(r.Only().kind, RecordingReply::Answer::kEntry);
    EXPECT_EQ(open_on(&new_conn, O_RDONLY).kind, RecordingReply::Answer::kOpen);
  }
}

// Kernel mode without writes: the first OPEN is answered ENOSYS (the kernel opens every file
// itself from then on, not an error counted), and READs with no handle are served by inode, the
// master asked once for the file.
TEST_F(OpsTest, KernelModeWithoutWritesGivesUpOpensAndReadsByInode) {
  Make("kernel", false);
  auto open = DoOpen();
  EXPECT_EQ(open.kind, RecordingReply::Answer::kErr);
  EXPECT_EQ(open.err, ENOSYS);
  EXPECT_EQ(client_->get_file_calls, 0) << "an ENOSYS open asks nothing";
  auto read = DoRead(0, 0, 4096);
  ASSERT_EQ(read.kind, RecordingReply::Answer::kData);
  EXPECT_EQ(read.bytes, data_.substr(0, 4096));
  auto more = DoRead(0, 4096, 8192);
  EXPECT_EQ(more.bytes, data_.substr(4096));
  EXPECT_EQ(client_->get_file_calls, 1) << "the process's file is kept between its reads";
  EXPECT_EQ(fs_->reads_by_inode.load(), 2u);
  // FLUSH is given up too: nothing to commit on a read-only mount.
  RecordingReply flush;
  fuse_file_info fi{};
  Flush(fs_.get(), flush, kIno, &fi);
  EXPECT_EQ(flush.Only().err, ENOSYS);
}

// Kernel mode, the file replaced in the under-storage: a read further into the file stays on the
// version its process was reading and fails with ESTALE once that version is gone (never bytes of
// two versions); the process's next read from offset 0 asks the master, moves to the new version,
// and the kernel's pages of the old one are dropped (queued for the invalidation thread).
TEST_F(OpsTest, KernelModeMovesAReaderStartingTheFileAgainToItsNewVersion) {
  Make("kernel", false);
  EXPECT_EQ(DoRead(0, 0, 4096).bytes, data_.substr(0, 4096));
  const std::string v2 = testing::RandomBytes(6000, 11);
  client_->Put(kIno, v2, "v2");
  auto stale = DoRead(0, 4096, 4096);
  EXPECT_EQ(stale.kind, RecordingReply::Answer::kErr);
  EXPECT_EQ(stale.err, ESTALE);
  EXPECT_EQ(DoRead(0, 0, 8192).bytes, v2);
  MutexLock lock(&fs_->inval_mu);
  EXPECT_GE(std::count(fs_->inval_queue.begin(), fs_->inval_queue.end(), kIno), 1)
      << "the kernel's pages of the old version are dropped";
}

// Kernel mode with writes: opens keep coming (a write needs its OPEN) but cost no call: handle 0,
// the kernel's pages kept, no FLUSH at close.
TEST_F(OpsTest, KernelModeWithWritesAnswersOpensAtOnce) {
  Make("kernel", true);
  auto open = DoOpen();
  ASSERT_EQ(open.kind, RecordingReply::Answer::kOpen);
  EXPECT_EQ(open.fi.fh, 0u);
  EXPECT_TRUE(open.fi.keep_cache);
  EXPECT_TRUE(open.fi.noflush);
  EXPECT_EQ(client_->get_file_calls, 0);
  EXPECT_EQ(DoRead(0, 100, 50).bytes, data_.substr(100, 50));
  EXPECT_EQ(DoRelease(0).err, 0);
  RecordingReply flush;
  fuse_file_info fi{};
  Flush(fs_.get(), flush, kIno, &fi);
  EXPECT_EQ(flush.Only().err, 0);
}

// Daemon mode: an open holds a handle of the version it opened; reads go through it; its release
// lets it go.
TEST_F(OpsTest, DaemonModeOpenReadRelease) {
  Make("daemon", true);
  auto open = DoOpen();
  ASSERT_EQ(open.kind, RecordingReply::Answer::kOpen);
  ASSERT_NE(open.fi.fh, 0u);
  EXPECT_TRUE(open.fi.noflush) << "a read-only open costs no FLUSH";
  EXPECT_NE(fs_->handles->Find(open.fi.fh, kIno), nullptr);
  EXPECT_EQ(DoRead(open.fi.fh, 0, 20000).bytes, data_) << "a read past the end returns what there is";
  auto eof = DoRead(open.fi.fh, 10000, 4096);
  EXPECT_EQ(eof.kind, RecordingReply::Answer::kData);
  EXPECT_TRUE(eof.bytes.empty()) << "a read at the end returns no bytes";
  EXPECT_EQ(DoRelease(open.fi.fh).err, 0);
  EXPECT_EQ(fs_->handles->Find(open.fi.fh, kIno), nullptr) << "the released handle is gone";
}

// An open whose answer did not reach the kernel (interrupted: no RELEASE will come) leaves no
// handle behind.
TEST_F(OpsTest, AnInterruptedOpenLeavesNoHandle) {
  Make("daemon", true);
  auto open = DoOpen(O_RDONLY, -ENOENT);
  ASSERT_EQ(open.kind, RecordingReply::Answer::kOpen);
  ASSERT_NE(open.fi.fh, 0u);
  EXPECT_EQ(fs_->handles->Find(open.fi.fh, kIno), nullptr) << "the handle of an interrupted open leaked";
}

// The file changed in the under-storage since it was opened: the open's reads fail with ESTALE
// (never the new bytes under the old open), and the next open asks the master and reads the new
// version whole.
TEST_F(OpsTest, AFileChangedUnderAnOpenFailsItsReadsWithEstaleAndTheNextOpenReadsTheNewVersion) {
  Make("daemon", true);
  auto open = DoOpen();
  ASSERT_NE(open.fi.fh, 0u);
  EXPECT_EQ(DoRead(open.fi.fh, 0, 100).bytes, data_.substr(0, 100));
  const std::string v2 = testing::RandomBytes(5000, 9);
  client_->Put(kIno, v2, "v2");
  auto stale = DoRead(open.fi.fh, 100, 100);
  EXPECT_EQ(stale.kind, RecordingReply::Answer::kErr);
  EXPECT_EQ(stale.err, ESTALE);
  EXPECT_EQ(DoRelease(open.fi.fh).err, 0);
  const int asked = client_->get_file_calls;
  auto reopen = DoOpen();
  ASSERT_EQ(reopen.kind, RecordingReply::Answer::kOpen);
  EXPECT_EQ(client_->get_file_calls, asked + 1) << "the changed file's info was kept";
  EXPECT_EQ(DoRead(reopen.fi.fh, 0, 8192).bytes, v2);
}

// A handle this process never gave out (a predecessor's that died before handing it over) is
// served by inode and adopted: its later reads and its release find it.
TEST_F(OpsTest, AHandleThisProcessDoesNotKnowIsServedByInodeAndAdopted) {
  Make("daemon", true);
  constexpr uint64_t kTheirs = 0x1234;
  EXPECT_EQ(DoRead(kTheirs, 0, 64).bytes, data_.substr(0, 64));
  EXPECT_NE(fs_->handles->Find(kTheirs, kIno), nullptr);
  EXPECT_EQ(DoRead(kTheirs, 64, 64).bytes, data_.substr(64, 64));
  EXPECT_EQ(client_->get_file_calls, 1) << "the adopted handle keeps its version";
  EXPECT_EQ(DoRelease(kTheirs).err, 0);
  EXPECT_EQ(fs_->handles->Find(kTheirs, kIno), nullptr);
}

// The errno funnel's answers on the data path: a file the master does not know is ENOENT; an open
// for writing where writes are off is EROFS; the same with O_TRUNC on a read-only open.
TEST_F(OpsTest, RefusalsAreTheFunnelsErrnos) {
  Make("daemon", false);
  client_->Put(kIno, data_, "v1");
  RecordingReply r;
  fuse_file_info fi{};
  fi.flags = O_RDONLY;
  Open(fs_.get(), r, 99, &fi);
  EXPECT_EQ(r.Only().err, ENOENT);
  EXPECT_EQ(DoOpen(O_WRONLY | O_TRUNC).err, EROFS);
  EXPECT_EQ(DoOpen(O_RDONLY | O_TRUNC).err, EROFS);
  EXPECT_EQ(client_->unasked, 0);
}

// A sequential reader's reads hint the blocks after them once each (fuse.readahead_blocks 2); a
// jump hints nothing.
TEST_F(OpsTest, ASequentialReaderHintsTheBlocksAheadOnce) {
  Make("daemon", true);
  auto open = DoOpen();
  ASSERT_NE(open.fi.fh, 0u);
  DoRead(open.fi.fh, 0, 4096);  // block 0: hints 1-2
  DoRead(open.fi.fh, 4096, 4096);  // block 1: hints 3 (1-2 were)
  DoRead(open.fi.fh, 9000, 100);   // a jump
  ASSERT_EQ(client_->hints.size(), 2u);
  EXPECT_EQ(client_->hints[0], std::make_pair(uint64_t{1}, uint64_t{2}));
  EXPECT_EQ(client_->hints[1], std::make_pair(uint64_t{3}, uint64_t{1}));
}

// ---- Passthrough ----

// The node's worker and the kernel's backing files, as the mount's BackingHost (fs_state.cc) gives
// them: a lease when the file is whole here, an id per registered lease; and, as that host does,
// a refusal by the kernel turns the connection to kernel mode.
class Backing final : public BackingHost {
 public:
  explicit Backing(Fs* fs) : fs_(fs) {}
  StatusOr<std::unique_ptr<FileLease>> Lease(const rpc::FileInfo& info) override {
    leases++;
    if (!whole) return NotFoundError("not wholly in this node's cache");
    LocalChannel::Piece p;
    p.fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
    p.length = info.attr().size();
    return std::make_unique<FileLease>(std::make_shared<LocalChannel>("/nonexistent"), std::move(p));
  }
  StatusOr<int> Register(const FileLease&) override {
    if (refuse) {
      fs_->mode = OpenMode::kKernel;
      return PermissionDeniedError("the kernel refused the backing file");
    }
    return ++registered;
  }
  void Unregister(int) override {}
  void Announce(uint64_t, const InodeOpens&) override {}
  void Drop(uint64_t, int) override {}

  bool whole = true, refuse = false;
  int leases = 0, registered = 0;

 private:
  Fs* fs_;
};

class PassthroughOpsTest : public OpsTest {
 protected:
  void SetUp() override {
    Make("passthrough", true);
    backing_ = std::make_unique<Backing>(fs_.get());
    fs_->passthrough = std::make_unique<PassthroughOpens>(backing_.get(), fs_->cfg.fuse.attr_timeout);
  }
  void TearDown() override { fs_->passthrough.reset(); }  // before the host it uses
  std::unique_ptr<Backing> backing_;
};

// A file whole in the local cache: the open hands the kernel a backing file (it reads the cache's
// data file itself); after the release the backing file is kept for the next open.
TEST_F(PassthroughOpsTest, AnOpenOfAWholeFileIsPassedThroughAndItsBackingKept) {
  auto open = DoOpen();
  ASSERT_EQ(open.kind, RecordingReply::Answer::kOpen);
  EXPECT_EQ(open.backing_id, 1);
  EXPECT_NE(open.fi.fh, 0u);
  EXPECT_FALSE(open.fi.keep_cache) << "the kernel allows only direct_io and noflush beside passthrough";
  EXPECT_EQ(DoRelease(open.fi.fh).err, 0);
  auto again = DoOpen();
  EXPECT_EQ(again.backing_id, 1) << "the kept backing file was not used again";
  EXPECT_EQ(backing_->registered, 1);
}

// Not whole on this node: served as in daemon mode (a handle, reads through granary-fuse).
TEST_F(PassthroughOpsTest, AMissIsServedAsInDaemonMode) {
  backing_->whole = false;
  auto open = DoOpen();
  ASSERT_EQ(open.kind, RecordingReply::Answer::kOpen);
  EXPECT_EQ(open.backing_id, 0);
  ASSERT_NE(open.fi.fh, 0u);
  EXPECT_EQ(fs_->passthrough_misses.load(), 1u);
  EXPECT_EQ(DoRead(open.fi.fh, 0, 20000).bytes, data_);
  EXPECT_EQ(DoRelease(open.fi.fh).err, 0);
}

// The kernel refuses the first backing file (no CAP_SYS_ADMIN where it counts): that open is
// answered as in kernel mode, and so is every later one, without asking for a lease again.
TEST_F(PassthroughOpsTest, AKernelThatRefusesBackingFilesTurnsTheConnectionToKernelModeMidOpen) {
  backing_->refuse = true;
  auto open = DoOpen();
  ASSERT_EQ(open.kind, RecordingReply::Answer::kOpen);
  EXPECT_EQ(open.backing_id, 0);
  EXPECT_EQ(open.fi.fh, 0u) << "answered as kernel mode answers (fuse.writes on: handle 0)";
  EXPECT_TRUE(open.fi.keep_cache);
  EXPECT_EQ(fs_->mode.load(), OpenMode::kKernel);
  const int leases = backing_->leases;
  EXPECT_EQ(DoOpen().fi.fh, 0u);
  EXPECT_EQ(backing_->leases, leases) << "kernel mode asks for no lease";
  EXPECT_EQ(DoRead(0, 0, 64).bytes, data_.substr(0, 64)) << "reads by inode";
}

// ---- Names and attributes ----

// A name the master gave lately is answered from memory (the kernel dropped its dentry): one master
// call for two lookups, the second's timeouts no longer than the first's. A missing name is a
// negative entry the kernel keeps for fuse.negative_timeout.
TEST_F(OpsTest, LookupsAreAnsweredFromMemoryWhileFreshAndMissesAreNegativeEntries) {
  Make("kernel", true);
  client_->Name("a.jpg", kIno);
  RecordingReply first, second, missing;
  Lookup(fs_.get(), first, FUSE_ROOT_ID, "a.jpg");
  Lookup(fs_.get(), second, FUSE_ROOT_ID, "a.jpg");
  ASSERT_EQ(first.Only().kind, RecordingReply::Answer::kEntry);
  EXPECT_EQ(first.Only().entry.ino, kIno);
  EXPECT_EQ(first.Only().entry.attr.st_size, static_cast<off_t>(data_.size()));
  EXPECT_EQ(second.Only().entry.ino, kIno);
  EXPECT_LE(second.Only().entry.entry_timeout, first.Only().entry.entry_timeout);
  EXPECT_EQ(client_->lookups, 1);
  Lookup(fs_.get(), missing, FUSE_ROOT_ID, "b.jpg");
  ASSERT_EQ(missing.Only().kind, RecordingReply::Answer::kEntry);
  EXPECT_EQ(missing.Only().entry.ino, 0u) << "a negative entry, not an error";
  EXPECT_DOUBLE_EQ(missing.Only().entry.entry_timeout, Seconds(fs_->cfg.fuse.negative_timeout));
}

// getattr: the master's answer once, then from memory while fresh; a master that does not answer
// is EIO through the funnel, never a crash or a made-up answer.
TEST_F(OpsTest, GetattrAsksTheMasterOnceAndItsFailureIsEio) {
  Make("kernel", true);
  RecordingReply a, b;
  Getattr(fs_.get(), a, kIno);
  Getattr(fs_.get(), b, kIno);
  ASSERT_EQ(a.Only().kind, RecordingReply::Answer::kAttr);
  EXPECT_EQ(a.Only().entry.attr.st_size, static_cast<off_t>(data_.size()));
  EXPECT_EQ(b.Only().entry.attr.st_ino, kIno);
  EXPECT_EQ(client_->getattrs, 1);
  client_->master_up = false;
  RecordingReply c;
  Getattr(fs_.get(), c, 99);
  EXPECT_EQ(c.Only().kind, RecordingReply::Answer::kErr);
  EXPECT_EQ(c.Only().err, EIO);
}

// A listing: ".", "..", then the names; the kernel's closing readdir at the last offset is answered
// empty without asking the master again (the master said the listing ends there).
TEST_F(OpsTest, AListingThatFitsOneReplyCostsTheMasterOneCall) {
  Make("kernel", true);
  client_->Put(8, "eight", "v1");
  client_->Name("a.jpg", kIno);
  client_->Name("b.jpg", 8);
  RecordingReply open;
  fuse_file_info fi{};
  Opendir(fs_.get(), open, FUSE_ROOT_ID, &fi);
  ASSERT_EQ(open.Only().kind, RecordingReply::Answer::kOpen);
  EXPECT_TRUE(open.Only().fi.cache_readdir) << "the kernel may keep the listing";
  RecordingReply list;
  Readdirplus(fs_.get(), list, FUSE_ROOT_ID, 4096, 0);
  ASSERT_EQ(list.Only().kind, RecordingReply::Answer::kData);
  EXPECT_EQ(list.names, (std::vector<std::string>{".", "..", "a.jpg", "b.jpg"}));
  EXPECT_EQ(client_->listings, 1);
  // Where the kernel continues: after the last entry's offset (two dots and two names).
  const fuse_dirent* last = nullptr;
  for (size_t at = 0; at < list.Only().bytes.size();) {
    const auto* dp = reinterpret_cast<const fuse_direntplus*>(list.Only().bytes.data() + at);
    last = &dp->dirent;
    at += FUSE_DIRENTPLUS_SIZE(dp);
  }
  ASSERT_NE(last, nullptr);
  RecordingReply end;
  Readdirplus(fs_.get(), end, FUSE_ROOT_ID, 4096, static_cast<off_t>(last->off));
  EXPECT_TRUE(end.Only().bytes.empty());
  EXPECT_EQ(client_->listings, 1) << "the closing readdir asked the master again";
}

// statfs: the local worker's cache, in 4 KiB blocks.
TEST_F(OpsTest, StatfsIsTheLocalWorkersCache) {
  Make("kernel", true);
  RecordingReply r;
  Statfs(fs_.get(), r);
  ASSERT_EQ(r.Only().kind, RecordingReply::Answer::kStatfs);
  EXPECT_EQ(r.Only().statfs.f_blocks, (100u << 20) / 4096);
  EXPECT_EQ(r.Only().statfs.f_bfree, (70u << 20) / 4096);
}

// With fuse.writes off, every write call is EROFS before anything is asked of the master.
TEST_F(OpsTest, WriteCallsAreReadOnlyWhenWritesAreOff) {
  Make("kernel", false);
  RecordingReply create, mkdir, unlink, rename;
  fuse_file_info fi{};
  fi.flags = O_WRONLY | O_CREAT;
  Create(fs_.get(), create, FUSE_ROOT_ID, "new", 0644, &fi);
  Mkdir(fs_.get(), mkdir, FUSE_ROOT_ID, "dir", 0755);
  Unlink(fs_.get(), unlink, FUSE_ROOT_ID, "a.jpg");
  Rename(fs_.get(), rename, FUSE_ROOT_ID, "a.jpg", FUSE_ROOT_ID, "b.jpg", 0);
  for (RecordingReply* r : {&create, &mkdir, &unlink, &rename}) EXPECT_EQ(r->Only().err, EROFS);
  EXPECT_EQ(client_->unasked, 0);
  EXPECT_EQ(client_->lookups, 0);
}

}  // namespace
}  // namespace granary::fuse::internal
