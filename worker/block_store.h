// BlockStore: the worker's tiered block cache (MEM, SSD, HDD levels; each level one or more
// directories, each directory with its own byte quota).
//
// Design
// ------
// A block is one fixed-size piece of one version of one file, identified by (FileKey, index); the
// FileKey hashes the under-storage URI, path and version, so a new version can never be served
// from an old version's blocks.
//
// On disk, in every directory of every level (worker/store/block_file.h, docs/block_format.md):
// the blocks of one file (one version) that the directory holds share a data file,
// <dir>/blocks/<2 hex>/<32 hex key>, each block at its own offset in it (its offset in the file),
// and each has a sidecar beside it, <32 hex key>-<index>.m (identity and a checksum per 64 KiB
// chunk). Directories 0700, files 0600; names are hashes, never object keys. Byte N of a data file
// is byte N of the under-storage file, so a file whose blocks are all in one directory can be read
// by the kernel straight from its data file (FUSE passthrough, LeaseFile()). A Put prefers the
// directory that already holds the file's other blocks.
//
// Crash safety: a block's bytes go into its range of the data file and its sidecar is then
// renamed into place from <dir>/tmp: the sidecar is the commit record (tmp is emptied at start).
// Removal unlinks the sidecar, then punches the range out while other blocks stay in the data
// file; a data file's last block (and blocks freed together with all the others left in it) is
// never punched: the file is unlinked as it is. The kernel may hold a data file open as a FUSE
// passthrough backing file beyond any lease — a granary-fuse successor between its predecessor's
// end and its own re-lease, a worker restarted under a mount — and an unlinked file keeps its
// bytes for whoever holds it, where a punched one would read as zeros. A data file once leased
// whole (LeaseFile) is never punched at all while this process runs: a block of it that leaves
// gives its space back only with the file's last block. Open() rebuilds the index from the sidecars (checksum, name, range within the data file)
// and drops what disagrees and data files without a sidecar; a background scrub then checks every
// chunk checksum, and every read through the worker checks the chunks it touches. A mismatch
// removes the block and returns DATA_LOSS: corrupt bytes are never served through the worker (the
// caller refetches).
//
// Space: used + reserved never exceeds any directory's quota. Put() writes a new block to the
// fastest level with room. When no level has room it evicts, bottom level first, the blocks the
// policy allows (see below); only when nothing evictable is left does Put() return
// RESOURCE_EXHAUSTED (the caller then serves the block uncached).
//
// Watermarks: a background reserver keeps each level at or below high x quota: above it, the
// level's coldest blocks are demoted to the level below (or, on the last level, evicted) until
// usage is at low x quota. A block read from a lower level is promoted one level up when that
// level is below its high watermark (StoreOptions::promote).
//
// Policies (per mount, default StoreOptions::policy):
//   lru      the least recently used block goes first.
//   shuffle  for epoch-style reads of a dataset larger than the cache: a dataset's blocks never
//            evict blocks of the same dataset, and the reserver never evicts them from the last
//            level. Once the cache is full the cached fraction stays put, so every shuffled epoch
//            hits on it; new blocks are admitted as space frees (another dataset's blocks, free).
// Elastic copies (BlockMeta::elastic: blocks this node keeps beyond their replica holders) are
// evicted before any replica whatever the policy, and an elastic copy never evicts a replica; the
// rules are worker/store/eviction.h. Classify() re-sorts blocks after a membership change.
// Pinned blocks (Pin) are never evicted or moved. A block with a reader is never removed or moved
// under it: Free() of such a block takes effect when its last reader finishes.
//
// Frees and fetches under way: a free must not be undone by bytes that were already on their way
// (a reader's miss, a load batch's last block, a copy from a peer) when it ran. A caller takes a
// ticket (FreeTicket) before it starts fetching a block's bytes and hands it to Put: a free since
// then that covers the block makes the Put cache nothing (ABORTED). Every Put also checks the frees
// that ran while it wrote. The frees of the last 10 minutes are remembered (at most 256); a ticket
// older than every remembered free counts as freed.
//
// Across the cluster a free reaches the workers one by one, and a load batch may reach a worker
// after the free did (sent before, or formed before and sent after): its ticket, taken when it
// arrives, would not see the free. So the master stamps both (Cluster::NextFreeStamp): a free
// carries its stamp, a batch the stamp current when its files were read, and the batch's ticket is
// FreeTicketAt(its stamp) — the ticket as it was before the first free remembered here with a
// later stamp. Whichever arrives first, a batch older than a free caches nothing that free covers.
// A hint that waited in granary-fuse's queue is taken as of when it was asked there
// (FreeTicketAsOf): the frees that ran here since count.
//
// Thread-safety: all methods are thread-safe; `mu_` guards the index, the policy lists and the
// byte counts. Block data I/O happens outside the lock; unlinks happen under it, so a removal can
// never delete a newer file of the same block.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "common/hash.h"
#include "common/status.h"
#include "common/thread_annotations.h"
#include "common/tiers.h"
#include "worker/store/block_file.h"
#include "worker/store/block_id.h"
#include "worker/store/eviction.h"

namespace granary::worker {

struct TierStats {
  std::string medium;
  std::vector<std::string> paths;
  double high = 0, low = 0;
  uint64_t capacity = 0, used = 0, blocks = 0;
  uint64_t hits = 0;       // reads served by this level
  uint64_t misses = 0;     // reads not served by this level or one above it
  uint64_t evictions = 0;  // blocks removed from this level to make room
  uint64_t demotions = 0;  // blocks moved from this level to the one below
  uint64_t promotions = 0; // blocks moved into this level from the one below
};

// What the store holds of one mount, in data bytes; kept as blocks come, go and change kind.
struct MountUsage {
  uint64_t blocks = 0, bytes = 0;                  // every block, whatever its kind
  uint64_t elastic_blocks = 0, elastic_bytes = 0;  // elastic copies among them
  uint64_t home_blocks = 0, home_bytes = 0;        // blocks this worker is the home of
  bool empty() const { return blocks == 0; }
};

struct BlockStoreStats {
  uint64_t capacity = 0;
  uint64_t used = 0;  // bytes of block files (sidecars included)
  uint64_t blocks = 0;
  uint64_t evictions = 0;
  uint64_t corrupt = 0;        // blocks found corrupt and discarded
  uint64_t scrubbed = 0;       // blocks the scrub verified
  uint64_t reads_as_written = 0;  // reads not checked: pages still dirty from the block's Put, or a
                                  // lease within trust_own_writes of it
  uint64_t pinned_blocks = 0;
  uint64_t rejected = 0;       // Puts refused because nothing evictable was left
  uint64_t leases = 0;         // blocks leased for zero-copy reads
  uint64_t elastic_blocks = 0, elastic_bytes = 0;  // elastic copies among `blocks` (data bytes)
  std::map<uint64_t, MountUsage> mounts;            // by mount id
  std::vector<TierStats> tiers;
};

class BlockStore;

// A cached block's data file, open for one reader: bytes [data_offset, data_offset + length) of
// `fd` are the requested bytes. While the lease is held the block is neither removed nor moved
// (a Free() of it takes effect when the last lease ends). Move-only; the lease ends, once, at
// Reset() or destruction, so a second release cannot end another reader's lease.
class BlockLease {
 public:
  BlockLease() = default;
  BlockLease(BlockLease&& o) noexcept { *this = std::move(o); }
  BlockLease& operator=(BlockLease&& o) noexcept;
  BlockLease(const BlockLease&) = delete;
  BlockLease& operator=(const BlockLease&) = delete;
  ~BlockLease() { Reset(); }

  // Ends the lease (if held) and closes fd (if open).
  void Reset();
  // Closes fd, keeping the lease (once its descriptor has been handed on).
  void CloseFd();
  bool held() const { return store_ != nullptr; }

  int fd = -1;
  uint64_t data_offset = 0;
  uint64_t length = 0;

 private:
  friend class BlockStore;
  BlockStore* store_ = nullptr;
  std::vector<BlockId> ids_;  // the blocks held (one, or every block of a file)
};

struct StoreOptions {
  std::vector<TierLevel> levels;  // fastest first (ParseTierLevels orders them)
  CachePolicy policy = CachePolicy::kLru;
  bool promote = true;
  // Run the reserver and the start-up scrub on a background thread. Tests that want to step the
  // store by hand set false and call Reserve()/Scrub().
  bool background = true;
  std::chrono::milliseconds reserve_interval{500};
  // After the start-up scrub, the background thread keeps verifying blocks at this many bytes per
  // second (0: no continuous scrub).
  uint64_t scrub_bandwidth = 0;
  // For this long after this process put a block, leases of it (Lease: the zero-copy reads of the
  // local FUSE client) are not checked against its sums: they were computed from the very bytes
  // written (worker.trust_own_writes). Copies (Read: peers, replicas), whole-file leases and the
  // scrub always check. 0: every lease checks (but for pages still dirty, store::FileAsWritten).
  std::chrono::milliseconds trust_own_writes{0};
  bool require_tmpfs_for_mem = true;  // a MEM level must be on tmpfs/ramfs
};

class BlockStore {
 public:
  static constexpr uint32_t kChunkSize = 64 * 1024;
  using RemovedFn = std::function<void(const BlockMeta&)>;

  // Opens or creates every level's directories and rebuilds the index from the files there.
  static StatusOr<std::unique_ptr<BlockStore>> Open(const StoreOptions& options);
  // One SSD level in `dir` with `quota`, watermarks at 1.0 (no background freeing); for tools/tests.
  static StatusOr<std::unique_ptr<BlockStore>> Open(const std::string& dir, uint64_t quota);
  ~BlockStore();

  // Called (outside the store's lock) for every block the store loses: evicted, freed, corrupt.
  void SetRemovedListener(RemovedFn fn);

  // Copies [offset, offset+length) of a cached block into `out` (clipped at the block's end) and
  // returns the bytes copied. NOT_FOUND when not cached; DATA_LOSS when the bytes failed their
  // checksum (the block is removed).
  StatusOr<size_t> Read(const BlockId& id, uint64_t offset, size_t length, char* out);

  // Leases [offset, offset+length) of a cached block (clipped at its end) for a zero-copy read: the
  // chunks covering the range are read and checked exactly as Read() does, then the open block file
  // is handed out instead of a copy, so what the reader splices from it is what was just verified.
  // NOT_FOUND when not cached; DATA_LOSS when a chunk failed (the block is removed). Counts as a read
  // (hits, LRU order). fd is -1 (length 0, no lease held) when the offset is past the block's end.
  // `verify` false leases without reading: only for a block this worker put an instant ago, whose
  // checksums were computed from the very bytes written (BlockSource::Miss). Whatever `verify`
  // says, a block this process put within StoreOptions::trust_own_writes, or whose pages are all
  // still dirty from that write (store::FileAsWritten: its bytes never left memory), is not read
  // either. (Read() copies are checked whatever the window: peers and re-puts store what they return.)
  StatusOr<BlockLease> Lease(const BlockId& id, uint64_t offset, size_t length, bool verify = true);
  // Leases the data file of a whole file — blocks 0..blocks-1 of `key`, every one cached in the
  // same directory, the data file `file_size` bytes long — without reading it (for FUSE
  // passthrough: the kernel then reads the file itself; its chunks were verified when they entered
  // the cache and are by the scrub). Every block is held until the lease ends. Counts as a read of
  // each block. NOT_FOUND when a block is missing or the blocks are spread over directories.
  // With `verify`, every chunk of every block is checked first, as the scrub does (DATA_LOSS, the
  // damaged block removed, when one fails).
  StatusOr<BlockLease> LeaseFile(const FileKey& key, uint64_t blocks, uint64_t file_size, bool verify = false);

  // Caches a whole block (OK when already cached, or while another Put of it is in progress).
  // RESOURCE_EXHAUSTED when nothing evictable is left to make room. `meta.elastic` puts an elastic
  // copy, which only takes free room or another elastic copy's; a replica Put of a block cached as
  // an elastic copy makes it a replica. ABORTED, nothing cached, when a Free or FreeMount that
  // covers the block ran after `ticket` was taken (kNoTicket: after this Put began).
  static constexpr uint64_t kNoTicket = ~uint64_t{0};
  Status Put(const BlockMeta& meta, std::string_view data, uint64_t ticket = kNoTicket);
  // Taken before fetching a block's bytes, for its Put (see "Frees and fetches under way").
  uint64_t FreeTicket() const;
  // The ticket of bytes fetched for a load batch stamped `stamp` by the master: as FreeTicket, but
  // from before the first free stamped later (see "Frees and fetches under way"). 0: FreeTicket().
  uint64_t FreeTicketAt(uint64_t stamp) const;
  // The ticket of bytes asked for at `asked` (a hint that waited in granary-fuse's queue): as
  // FreeTicket, but from before the first free that ran here after `asked`. Before what this
  // store remembers (or before this process registered): a ticket every Put counts as freed.
  uint64_t FreeTicketAsOf(std::chrono::steady_clock::time_point asked) const;
  // The master's free stamp at each registration. The first one is a floor: a batch stamped before
  // it may predate frees this process never heard of (it was not running), so it caches nothing
  // here. A later one below a stamp this process has seen means the master's stamps went back (a
  // master started on a new database): every ticket taken so far counts as freed, and the stamps
  // remembered are dropped, so that new batches cache again.
  void SetFreeFloor(uint64_t stamp);
  // The largest free stamp this process has seen from the master (its frees and registrations):
  // the stamp of a readahead hint queued now, sent with it to the peer that runs it.
  uint64_t KnownStamp() const;
  // Whether a free that covers `meta`'s block ran after `ticket` was taken.
  bool FreedSince(uint64_t ticket, const BlockMeta& meta) const;
  // Whether a Put of `meta` would find room now (free room, or a block the rules let it evict):
  // a hint for callers deciding whether to fetch a whole block, not a reservation.
  bool CanAdmit(const BlockMeta& meta) const;
  // Whether `bytes` of data fit below some level's *low* watermark without evicting anything: the
  // room fetch-ahead may fill. Never past low, so it never pushes a level over its high watermark
  // (where the reserver would evict down to low), and the room between is left to readers.
  bool HasFreeRoom(uint64_t bytes) const;
  // Re-decides, for every cached block, whether it is an elastic copy or a replica and whether
  // this worker is its home (`kind(meta)`) — after a membership change, so the cache never keeps
  // more replicas than asked and each block is counted once. Returns the blocks whose kind changed,
  // as they are now. `kind` runs without the store's lock.
  struct Kind {
    bool elastic = false;
    bool home = true;
  };
  std::vector<BlockMeta> Classify(const std::function<Kind(const BlockMeta&)>& kind);
  // Makes a cached elastic copy a replica (`home`: this worker is its home); true when it was an
  // elastic copy (false: not cached, or a replica already).
  bool MakeReplica(const BlockId& id, bool home);

  // The policy for blocks of a mount (the worker's default until set).
  void SetMountPolicy(uint64_t mount_id, CachePolicy policy);

  // Pins (pin=true) or unpins files: their blocks, cached now or later, are never evicted.
  // Persisted in the cache, so a restarted worker keeps its pins.
  Status Pin(const std::vector<FileKey>& keys, bool pin);
  // Replaces the whole pin set (the master's view at registration).
  Status SetPins(const std::vector<FileKey>& keys);
  // Removes every cached block of these files (pinned ones too); returns how many. Blocks with a
  // reader go when their last reader is done.
  // `stamp`: the master's free stamp (0: a free of this worker's own).
  size_t Free(const std::vector<FileKey>& keys, uint64_t stamp = 0);
  // The same for every cached block of a mount (an unmounted dataset).
  size_t FreeMount(uint64_t mount_id, uint64_t stamp = 0);

  // One reserver pass: queued promotions, then levels above their high watermark brought down to
  // low (bottom level first). The background thread calls it; tests may too.
  void Reserve();
  // Verifies every chunk of every cached block; corrupt ones are removed. Returns how many.
  size_t Scrub();

  bool Contains(const BlockId& id) const;
  // The level index holding a block, or -1.
  int LevelOf(const BlockId& id) const;
  // Where a cached block is: its level, whether it is an elastic copy, its length. nullopt: not here.
  struct Place {
    int level;
    bool elastic;
    uint64_t length;
  };
  std::optional<Place> Locate(const BlockId& id) const;
  std::vector<BlockMeta> List() const;
  BlockStoreStats Stats() const;  // walks the index: not for every request
  // The medium of each level (MEM, SSD, HDD), fastest first.
  std::vector<std::string> Media() const;

  // The data file a block lives in, and its sidecar ("" when not cached; for tests that corrupt
  // them). The block's bytes start at its BlockMeta::offset in the data file.
  std::string PathOf(const BlockId& id) const;
  std::string SidecarPathOf(const BlockId& id) const;

 private:
  // Removes every cached block `doomed` picks (called under mu_, once per block); returns how many.
  // Remembered as a recent free, so Puts of bytes fetched before it cache nothing it covers.
  using Doomed = std::function<bool(const BlockId&, const BlockMeta&)>;
  size_t FreeIf(Doomed doomed, uint64_t stamp = 0) EXCLUDES(mu_);
  struct Dir {
    std::string path;
    uint64_t quota = 0;
    uint64_t used = 0;
    uint64_t reserved = 0;
  };
  struct Tier {
    TierLevel level;
    std::vector<Dir> dirs;
    // Evictable-in-principle blocks per mount, oldest access first (seq -> id). Pinned blocks are
    // not listed. The choice among them: store::PickVictim (worker/store/eviction.h).
    store::LruLists lru;
    store::LruLists elastic;  // the same, for elastic copies (evicted first)
    uint64_t hits = 0, misses = 0, evictions = 0, demotions = 0, promotions = 0;
    uint64_t Quota() const;
    uint64_t Used() const;      // used + reserved
    uint64_t Occupied() const;  // used only
    uint64_t nblocks = 0;
  };
  struct Entry {
    BlockMeta meta;
    uint64_t file_bytes = 0;  // data and sidecar
    // The chunk checksums, as the sidecar holds them (read once, at Open or Put): a read verifies
    // against them without reading the sidecar again. 8 bytes per 64 KiB cached (about 0.01%).
    std::shared_ptr<const std::vector<uint64_t>> sums;
    int tier = 0;
    int dir = 0;
    int readers = 0;
    uint64_t seq = 0;  // last access
    bool pinned = false;
    bool moving = false;  // being copied to another level
    bool doomed = false;  // freed while read; removed when readers drop to 0
    // Its sums were computed from the bytes this process wrote into its range (Put): while those
    // pages are dirty, a read need not check them (store::Check::kChunksUnlessAsWritten). Not for
    // a block found at start or moved between levels (copied by the kernel, never hashed).
    bool own_write = false;
    std::chrono::steady_clock::time_point written{};  // when Put wrote it (own_write): trust_own_writes
  };
  using Purpose = store::Purpose;
  struct Removal {
    std::vector<BlockMeta> removed;  // files already unlinked; listeners still to be told
  };

  friend class BlockLease;
  explicit BlockStore(StoreOptions options) : options_(std::move(options)) {}
  void Release(const BlockId& id);  // a lease ended
  // Init and ScanDir run inside Open, before the store is shared with any other thread: they touch
  // the guarded state without mu_ (the analysis is told so).
  // How many levels there are: fixed once Open returns (levels change inside, never in number).
  size_t TierCount() const NO_THREAD_SAFETY_ANALYSIS { return tiers_.size(); }
  Status Init() NO_THREAD_SAFETY_ANALYSIS;
  Status ScanDir(int tier, int dir) NO_THREAD_SAFETY_ANALYSIS;
  // Indexes the block whose sidecar is `sidecar` (its data file `data`).
  Status LoadOne(int tier, int dir, const FileKey& key, uint64_t index, const std::string& data,
                 const std::string& sidecar);
  Status LoadPins();
  Status SavePins() REQUIRES(pins_mu_);
  std::string PathLocked(const BlockId& id, int tier, int dir) const REQUIRES(mu_);         // the data file
  std::string SidecarLocked(const BlockId& id, int tier, int dir) const REQUIRES(mu_);
  // Data files in use (blocks indexed in them, or being written into them), by path; a data file
  // is unlinked when its count drops to 0.
  void HoldFileLocked(const std::string& path) REQUIRES(mu_);
  void DropFileLocked(const std::string& path) REQUIRES(mu_);
  // A block leaves the data file `path` (its range [offset, offset+len)): punched out only while
  // blocks that are not doomed stay in the file, then the file's count dropped (the design note
  // says why). `doomed`: the leaving block was freed while read (counted in file_doomed_).
  void LetGoRangeLocked(const std::string& path, uint64_t offset, uint64_t len, bool doomed) REQUIRES(mu_);
  // Punches a range out of a data file, unless the file was ever leased whole (whole_leased_).
  void PunchLocked(const std::string& path, uint64_t offset, uint64_t len) REQUIRES(mu_);
  // Where a new block of `key` goes on level `tier`: the directory already holding the file's
  // blocks if it has room, else FitLocked's choice (-1: no room).
  int FitFileLocked(int tier, const FileKey& key, uint64_t bytes, double fraction) const REQUIRES(mu_);
  std::string TmpPath(int tier, int dir);
  void Finish(Removal& r);  // notifies the listener, outside mu_
  void Loop();

  CachePolicy PolicyLocked(uint64_t mount_id) const REQUIRES(mu_);
  void ListLocked(const BlockId& id, Entry& e) REQUIRES(mu_);
  void UnlistLocked(Entry& e) REQUIRES(mu_);
  void TouchLocked(const BlockId& id, Entry& e) REQUIRES(mu_);
  void RemoveLocked(const BlockId& id, Removal* r) REQUIRES(mu_);
  int FitLocked(int tier, uint64_t bytes, double fraction) const REQUIRES(mu_);  // dir index or -1
  bool PickVictimLocked(int tier, Purpose purpose, uint64_t for_mount, bool for_elastic, BlockId* out,
                        bool elastic_only = false) const REQUIRES(mu_);
  bool EvictOneLocked(int tier, Purpose purpose, uint64_t for_mount, bool for_elastic, Removal* r,
                      bool elastic_only = false) REQUIRES(mu_);
  void SetKindLocked(const BlockId& id, Entry& e, Kind kind) REQUIRES(mu_);
  bool FreedSinceLocked(uint64_t ticket, const BlockMeta& meta) const REQUIRES(mu_);
  // Adds (sign +1) or takes away (-1) an indexed block's share of usage_.
  void AccountLocked(const BlockMeta& m, int sign) REQUIRES(mu_);
  // Moves a block one level (down: demotion; up: promotion) into `to_dir` if it still has room
  // below fraction x quota. Takes and releases mu_ itself.
  bool MoveBlock(const BlockId& id, int from_tier, int to_tier, int to_dir, double fraction);
  void ReserveTier(int t);
  StatusOr<bool> VerifyOne(const BlockId& id);
  // Read(); `account` false leaves the LRU order, the counters and promotion alone (the scrub).
  // With `lease`, nothing is copied to `out` (may be null): the open file and the reader count are
  // handed to the lease instead. `check` as store::ReadRange takes it, kChunksUnlessAsWritten
  // meaning kChunks for a block not put by this process (Entry::own_write). *checked (if given):
  // whether the chunks were verified.
  StatusOr<size_t> ReadInternal(const BlockId& id, uint64_t offset, size_t length, char* out, bool account,
                                BlockLease* lease, store::Check check, bool* checked = nullptr);

  const StoreOptions options_;
  std::atomic<uint64_t> tmp_seq_{0};

  mutable Mutex mu_;
  std::vector<Tier> tiers_ GUARDED_BY(mu_);
  std::unordered_map<BlockId, Entry, BlockIdHash> index_ GUARDED_BY(mu_);
  uint64_t pinned_blocks_ GUARDED_BY(mu_) = 0;  // entries of index_ with `pinned` (Stats() is O(1))
  std::map<uint64_t, MountUsage> usage_ GUARDED_BY(mu_);  // index_ summed by mount
  std::unordered_map<uint64_t, CachePolicy> mount_policy_ GUARDED_BY(mu_);
  std::unordered_set<FileKey, FileKeyHash> pins_ GUARDED_BY(mu_);
  std::vector<BlockId> promote_queue_ GUARDED_BY(mu_);
  std::unordered_map<std::string, int> file_users_ GUARDED_BY(mu_);
  // Doomed blocks by data file: they leave when their readers end, so a block leaving beside only
  // doomed ones is the file's last and its range is not punched.
  std::unordered_map<std::string, int> file_doomed_ GUARDED_BY(mu_);
  // Data files handed out whole (LeaseFile) since start, and those of several blocks found at start:
  // the kernel may hold them as passthrough backing files past their leases (a granary-fuse crash's
  // gap, a worker restart), so no range of them is punched.
  std::unordered_set<std::string> whole_leased_ GUARDED_BY(mu_);
  // Blocks a Put is writing. One Put per block at a time: a second one could write the block's
  // range while a removal of the first one's copy punches that same range out.
  std::unordered_set<BlockId, BlockIdHash> putting_ GUARDED_BY(mu_);
  // Frees (Free, FreeMount) counted, and the recent ones, for Puts of bytes fetched meanwhile.
  struct RecentFree {
    uint64_t number;
    std::chrono::steady_clock::time_point at;
    Doomed covers;
    uint64_t stamp = 0;  // the master's (0: none)
  };
  uint64_t frees_ GUARDED_BY(mu_) = 0;
  uint64_t forgotten_frees_ GUARDED_BY(mu_) = 0;  // every free up to this number is forgotten
  uint64_t forgotten_stamp_ GUARDED_BY(mu_) = 0;  // the largest stamp among the forgotten frees
  std::chrono::steady_clock::time_point forgotten_at_ GUARDED_BY(mu_);  // when the last forgotten free ran
  bool floor_set_ GUARDED_BY(mu_) = false;
  uint64_t known_stamp_ GUARDED_BY(mu_) = 0;  // KnownStamp
  std::deque<RecentFree> recent_frees_ GUARDED_BY(mu_);
  uint64_t seq_ GUARDED_BY(mu_) = 0;
  uint64_t corrupt_ GUARDED_BY(mu_) = 0, rejected_ = 0;
  std::atomic<uint64_t> scrubbed_{0};
  std::atomic<uint64_t> reads_as_written_{0};
  uint64_t leases_ GUARDED_BY(mu_) = 0;
  RemovedFn on_removed_ GUARDED_BY(mu_);
  bool stop_ GUARDED_BY(mu_) = false;
  bool wake_ GUARDED_BY(mu_) = false;
  std::condition_variable cv_;

  Mutex pins_mu_;  // serialises writes of the pins file
  Mutex move_mu_;  // one reserver pass at a time
  std::thread thread_;
};

// Bytes a block of `data_len` bytes costs against a quota (data and sidecar).
uint64_t BlockFileBytes(uint64_t data_len);

}  // namespace granary::worker
