// Namespace, bulk loads: LoadTree lists a whole subtree from the under-storage in flat pages (an
// object store lists every key below a prefix at once), resumable from its cursor after a crash.
#include "master/namespace.h"

#include <rocksdb/write_batch.h>
#include <spdlog/spdlog.h>

#include <chrono>
#include <set>
#include <unordered_set>

#include "common/hash.h"
#include "common/keys.h"
#include "common/path.h"
#include "master/records.h"
#include "master/namespace_internal.h"

namespace granary::master {

using namespace nsdetail;  // NOLINT: this module's own helpers

StatusOr<LoadStats> Namespace::LoadTree(const std::string& path, const LoadTreeOptions& opts) {
  ASSIGN_OR_RETURN(rpc::Attr top_attr, Resolve(path));
  ASSIGN_OR_RETURN(InodeRecord top, GetRecord(top_attr.ino()));
  if (top.type() != rpc::DIRECTORY) return InvalidArgumentError(path + " is a file; load a directory");
  if (top.mount_id() == 0) return InvalidArgumentError(path + " is not inside a mounted dataset (see `granary mounts`)");
  return LoadTreeOf(std::move(top), path, opts);
}

// One LoadTree under way. `chain`: the directories from `top` to the one entries are being added
// to. A directory leaves the chain when the listing has moved past everything below it: then it is
// complete, and is marked listed (and swept of children the listing did not see). Each directory
// stamps the entries it holds with its `gen`.
struct Namespace::TreeLoad {
  struct Open {
    std::string rel;  // relative to top, "" for top itself
    InodeRecord rec;
    uint64_t gen;
  };
  TreeLoad(InodeRecord t, const std::string& p, const LoadTreeOptions& o)
      : top(std::move(t)), path(p), opts(o), cursor_key(CursorKey(top.mount_id(), top.ino())) {
    chain.push_back(Open{"", top, top.sync_gen() + 1});
  }
  const InodeRecord top;
  const std::string& path;
  const LoadTreeOptions& opts;
  const std::string cursor_key;
  SyncBatch b;
  std::vector<Open> chain;
  // The last directory passed as an entry, while nothing below it has come: what is below a
  // directory comes right after its entry, so if the next entry is not below it, it is empty.
  std::optional<Open> fresh_dir;
  LoadStats stats;
  std::string after;           // where the listing continues (a resumed load's checkpoint)
  uint64_t passed = 0;         // entries passed to this load
  bool out_of_budget = false;  // opts.max_entries reached
};

StatusOr<LoadStats> Namespace::LoadTreeOf(InodeRecord top, const std::string& path, const LoadTreeOptions& opts) {
  ASSIGN_OR_RETURN(auto ufs, UfsFor(top.mount_id()));
  TreeLoad load(std::move(top), path, opts);
  {
    ASSIGN_OR_RETURN(rpc::MountInfo m, GetMount(load.top.mount_id()));
    load.b.uri = m.uri();
  }
  load.b.now = NowNs();
  RETURN_IF_ERROR(ResumeLoad(&load));
  Status st = ufs->ListTree(load.top.ufs_path(), opts.page_size,
                            [&](std::vector<UfsEntry>& page) { return LoadPage(&load, page); }, load.after);
  return EndLoad(&load, st);
}

// An earlier load of this directory that stopped: take its chain back, stamping with the
// generations it recorded, so what it wrote counts as seen by this load, and continue after its
// checkpoint. That stays safe whatever happened to those directories since: one finished by that
// load after its last cursor (a crash in the middle of a page) or listed since (a lookup) has
// every present child stamped at or above the recorded generation, and a sweep deletes only
// children stamped below it. A directory gone since, or a cursor that does not parse, starts
// the load over.
Status Namespace::ResumeLoad(TreeLoad* load) {
  std::string raw;
  rocksdb::Status got = db_->Get({}, load->cursor_key, &raw);
  if (!got.ok() && !got.IsNotFound()) RETURN_IF_ERROR(FromRocks(got, "read the load cursor of " + load->path));
  LoadCursorRecord cursor;
  if (!got.ok() || !cursor.ParseFromString(raw)) return Status::OK();
  std::vector<TreeLoad::Open> kept;
  bool same = !cursor.after().empty() && cursor.open_ino_size() > 0 &&
              cursor.open_ino_size() == cursor.open_gen_size() && cursor.open_ino_size() == cursor.open_rel_size() &&
              cursor.open_ino(0) == load->top.ino() && cursor.open_rel(0).empty();
  for (int i = 0; same && i < cursor.open_ino_size(); ++i) {
    auto r = GetRecord(cursor.open_ino(i));
    same = r.ok() && r->type() == rpc::DIRECTORY && r->sync_gen() + 1 >= cursor.open_gen(i);
    if (same) kept.push_back(TreeLoad::Open{cursor.open_rel(i), *r, cursor.open_gen(i)});
  }
  if (same && cursor.fresh_dir_ino() != 0) {
    auto r = GetRecord(cursor.fresh_dir_ino());
    same = r.ok() && r->type() == rpc::DIRECTORY;
    if (same) load->fresh_dir = TreeLoad::Open{cursor.fresh_dir_rel(), *r, 0};
  }
  if (same) {
    load->chain = std::move(kept);
    load->after = cursor.after();
    load->stats.resumed_after = load->after;
    spdlog::info("loading the metadata of {}: resuming after '{}'", load->path, load->after);
  } else {
    load->fresh_dir.reset();
    spdlog::info("loading the metadata of {}: the interrupted load's directories are gone; starting over",
                 load->path);
  }
  return Status::OK();
}

// A directory of the load is complete: marked listed, swept of the children this load did not see
// (`gen` 0: a fresh directory, stamped at its next generation).
Status Namespace::FinishLoadDirLocked(TreeLoad* load, uint64_t ino, uint64_t gen) {
  RETURN_IF_ERROR(WriteLocked(&load->b));  // the sweep reads the stamps from RocksDB
  ASSIGN_OR_RETURN(InodeRecord rec, GetRecord(ino));  // content_gen may have moved
  RETURN_IF_ERROR(FinishListingLocked(rec, gen != 0 ? gen : rec.sync_gen() + 1, true, &load->b));
  ++load->stats.dirs;
  return Status::OK();
}

Status Namespace::CloseLoadDirLocked(TreeLoad* load) {
  TreeLoad::Open o = std::move(load->chain.back());
  load->chain.pop_back();
  return FinishLoadDirLocked(load, o.rec.ino(), o.gen);
}

// The entry at `rel` has come: a fresh directory it is not below is empty.
Status Namespace::SettleFreshDirLocked(TreeLoad* load, const std::string& rel) {
  if (!load->fresh_dir) return Status::OK();
  bool below = rel != load->fresh_dir->rel && PathWithin(rel, load->fresh_dir->rel);
  TreeLoad::Open o = std::move(*load->fresh_dir);
  load->fresh_dir.reset();
  return below ? Status::OK() : FinishLoadDirLocked(load, o.rec.ino(), o.gen);
}

// The directories holding an entry `depth` levels below top (parts[0..depth) are their names):
// leaves those it is not below, enters (creates) the missing ones.
Status Namespace::EnterLoadDirsLocked(TreeLoad* load, const std::vector<std::string>& parts, size_t depth) {
  auto& chain = load->chain;
  std::string want;
  size_t keep = 1;
  for (size_t i = 0; i < depth; ++i) {
    want += (i ? "/" : "") + parts[i];
    if (keep == i + 1 && chain.size() > i + 1 && chain[i + 1].rel == want) keep = i + 2;
  }
  while (chain.size() > keep) RETURN_IF_ERROR(CloseLoadDirLocked(load));
  for (size_t i = chain.size() - 1; i < depth; ++i) {
    // Entering a directory may replace a file of the same name: write what is pending first so
    // the replacement sees it.
    RETURN_IF_ERROR(WriteLocked(&load->b));
    UfsEntry d;
    d.name = parts[i];
    d.is_dir = true;
    d.mode = 0555;
    d.mtime_ns = load->b.now;
    if (auto known = GetChild(chain.back().rec.ino(), d.name); known.ok()) {
      if (auto r = GetRecord(*known); r.ok() && r->type() == rpc::DIRECTORY) {
        d.mode = r->mode();
        d.mtime_ns = r->mtime_ns();
        d.uid = r->uid();
        d.gid = r->gid();
      }
    }
    ASSIGN_OR_RETURN(uint64_t ino, UpsertChildLocked(chain.back().rec, chain.back().gen, d, &load->b));
    RETURN_IF_ERROR(WriteLocked(&load->b));
    ASSIGN_OR_RETURN(InodeRecord rec, GetRecord(ino));
    chain.push_back(TreeLoad::Open{chain.back().rel.empty() ? parts[i] : chain.back().rel + "/" + parts[i], rec,
                                   rec.sync_gen() + 1});
  }
  return Status::OK();
}

// One page of the flat listing: every entry written below its directories, then the cursor that
// lets an interrupted load resume after the page, in the page's last batch.
Status Namespace::LoadPage(TreeLoad* load, std::vector<UfsEntry>& page) {
  if (load->opts.stop && load->opts.stop()) return CancelledError("the load was stopped; loading again resumes it");
  if (load->opts.max_entries != 0 && load->passed >= load->opts.max_entries) {
    load->out_of_budget = true;
    return CancelledError("more entries than the load may list");
  }
  load->passed += page.size();
  if (page.empty()) return Status::OK();
  const std::string checkpoint = page.back().name + (page.back().is_dir ? "/" : "");
  MutexLock lock(&mu_);
  auto mit = mounts_.find(load->top.mount_id());
  if (mit == mounts_.end()) return NotFoundError("the mount was removed while loading");
  load->b.mount = mit->second;
  for (UfsEntry& e : page) RETURN_IF_ERROR(LoadEntryLocked(load, e));
  LoadCursorRecord cursor;
  cursor.set_after(checkpoint);
  for (const TreeLoad::Open& o : load->chain) {
    cursor.add_open_ino(o.rec.ino());
    cursor.add_open_gen(o.gen);
    cursor.add_open_rel(o.rel);
  }
  if (load->fresh_dir) {
    cursor.set_fresh_dir_ino(load->fresh_dir->rec.ino());
    cursor.set_fresh_dir_rel(load->fresh_dir->rel);
  }
  load->b.batch.Put(load->cursor_key, cursor.SerializeAsString());
  return WriteLocked(&load->b);
}

Status Namespace::LoadEntryLocked(TreeLoad* load, UfsEntry& e) {
  std::vector<std::string> parts;
  bool valid = !e.name.empty();
  for (size_t start = 0; valid;) {
    size_t slash = e.name.find('/', start);
    parts.push_back(e.name.substr(start, slash == std::string::npos ? std::string::npos : slash - start));
    valid = IsValidName(parts.back());
    if (slash == std::string::npos) break;
    start = slash + 1;
  }
  // A name that cannot be a file name is skipped, as a per-directory listing skips it; the
  // directories above it still exist (they would show in that listing too), and the entry is
  // below all of them.
  if (!valid) {
    ++load->stats.skipped;
    parts.pop_back();
    if (parts.empty()) return Status::OK();
  }
  const size_t depth = valid ? parts.size() - 1 : parts.size();  // directories above the entry, below top
  std::string rel;
  for (const auto& p : parts) rel += (rel.empty() ? "" : "/") + p;
  RETURN_IF_ERROR(SettleFreshDirLocked(load, valid ? rel : rel + "/"));
  RETURN_IF_ERROR(EnterLoadDirsLocked(load, parts, depth));
  if (!valid) return Status::OK();
  const TreeLoad::Open& dir = load->chain.back();
  e.name = parts.back();
  if (e.is_dir) {
    // Written in its parent; entered when something below it comes, else complete (empty).
    if (auto known = GetChild(dir.rec.ino(), e.name); known.ok()) {
      if (auto r = GetRecord(*known); r.ok() && r->type() == rpc::DIRECTORY) e.mtime_ns = r->mtime_ns();
    }
    ASSIGN_OR_RETURN(uint64_t ino, UpsertChildLocked(dir.rec, dir.gen, e, &load->b));
    InodeRecord placeholder;
    placeholder.set_ino(ino);
    load->fresh_dir = TreeLoad::Open{rel, placeholder, 0};
    return Status::OK();
  }
  ++load->stats.files;
  load->stats.bytes += e.size;
  return UpsertChildLocked(dir.rec, dir.gen, e, &load->b).status();
}

// The listing ended (`st`): complete what is open, or, stopped by the entry budget, keep what was
// written and drop the cursor (not an interruption to resume).
StatusOr<LoadStats> Namespace::EndLoad(TreeLoad* load, Status st) {
  SyncBatch& b = load->b;
  if (load->out_of_budget) {
    MutexLock lock(&mu_);
    if (mounts_.count(load->top.mount_id()) == 0) {
      st = NotFoundError("the mount was removed while loading");
    } else {
      b.batch.Delete(load->cursor_key);
      st = journal_.Commit(&b.batch).WithContext("drop a load's cursor");
      b.batch.Clear();
    }
  } else if (st.ok()) {
    MutexLock lock(&mu_);
    auto mit = mounts_.find(load->top.mount_id());
    if (mit == mounts_.end()) {
      st = NotFoundError("the mount was removed while loading");
    } else {
      b.mount = mit->second;
      if (load->fresh_dir) {
        TreeLoad::Open o = std::move(*load->fresh_dir);
        load->fresh_dir.reset();
        st = FinishLoadDirLocked(load, o.rec.ino(), o.gen);
      }
      while (!load->chain.empty() && st.ok()) st = CloseLoadDirLocked(load);
      b.batch.Delete(load->cursor_key);
      if (st.ok()) st = WriteLocked(&b);
    }
  }
  Reclaim(std::move(b.reclaim));
  if (!st.ok()) return st.WithContext("loading the metadata of " + load->path);
  LoadStats stats = std::move(load->stats);
  stats.complete = !load->out_of_budget;
  stats.added = b.added;
  stats.changed = b.changed;
  stats.removed = b.removed;
  if (!load->out_of_budget) {
    spdlog::log(load->opts.max_entries != 0 ? spdlog::level::debug : spdlog::level::info,
                "loaded the metadata of {}: {} files ({} bytes) in {} directories; {} new, {} changed, {} removed",
                load->path, stats.files, stats.bytes, stats.dirs, b.added, b.changed, b.removed);
  }
  return stats;
}

}  // namespace granary::master
