// BlockSource: where the worker gets the bytes of a block.
//
// Read path: the BlockStore first (a hit). On a miss, the block's place in the cluster decides
// (Placement, see worker/peers.h for the ranking):
//   - this worker is the block's home (first in its ranking), or works alone, or the request came
//     from a peer: one fetch of the whole block from the under-storage;
//   - this worker is one of the mount's `cache.replicas` holders but not the home: the whole block
//     from the home (which fetches it once for the whole cluster), kept here too;
//   - otherwise, with the mount's `cache.elastic` on (the default) and room for it here: the whole
//     block from a holder, kept as an *elastic copy* (BlockMeta::elastic) — evicted before any
//     replica, never counted as one, never asked for by peers (they ask the ranking's holders), and
//     never a reason for an under-storage fetch (only a holder fetches). The next read of it, and the
//     kernel-served and passthrough fast paths, are local. The node's reads thus make every node a
//     full copy of the dataset when the caches have room, and give the room back first when not;
//   - otherwise (cache.elastic off, or no room an elastic copy may take): just the requested range
//     from the home, streamed and not kept, so the cluster never caches more than replicas × the
//     dataset.
// Whether a cached block is a replica or an elastic copy is a function of the membership: after a
// change (MembershipChanged) every cached block is classified again in the background, so blocks a
// worker holds beyond their replica count after a join or a leave become elastic copies (evicted
// first) and the cache never keeps more replicas than asked.
// A join moves 1/N of the blocks' homes to the new worker. For 30 minutes after a membership change
// (PeerSet::kPreviousWindow) a home that misses a block first asks the block's previous home (the
// home under the membership before the change) for its cached copy only (cached_only: NOT_FOUND,
// nothing fetched, when it has none) and fetches from the under-storage only then: what the
// cluster cached before the join is not fetched again. The price, for a block that was never
// cached, is one peer round trip.
// Whole-block fetches are shared by every concurrent request for the same block (single-flight);
// a fetched block is written to the store and reported to the master. A peer that fails with a
// retryable error is marked down and the next-ranked worker asked (kMaxPeerAttempts); when no peer
// can serve, the worker fetches from the under-storage itself, so a dead worker costs readers a
// retry, never an error. Errors about the data itself (the file changed: FAILED_PRECONDITION) are
// returned as they are. A cached block that fails its checksum
// is dropped by the store and fetched again, so corrupt bytes are never returned. When the block
// cannot be cached (no room, or the shuffle policy keeps the cache as it is) it is still served from
// the fetched copy, which is kept in a small in-memory buffer (the last kUncachedBlocks such
// blocks) so the next requests for the rest of the block, from the same reader, do not fetch it
// again. The buffer is deliberately tiny: it is not a cache.
// Range first: a miss that starts inside its block (offset > 0; a sequential reader starts each
// block at 0) unless granary-fuse saw it continue a sequential stream (BlockRequest::continues),
// or anywhere in it for a random reader's (BlockRequest::random: granary-fuse saw the
// read land far from the file's last one, so a window crossing into a block is not a sequential
// reader's block start), of at most rpc::kRangeFirstMax bytes and half the block, in a block of at
// least rpc::kRangeFirstMinBlock (the rule: rpc::IsRangeFirst, which granary-fuse shares), that this
// worker would fetch from the under-storage itself with no fetch of
// the block in flight, is answered from a ranged read of just its bytes: a random 4 KiB read into
// a cold 4 MiB block waits for 4 KiB, not 4 MiB. The whole block follows in the background (a
// fill) on the block's second range-first touch, and only when the cache has free room for it
// below the low watermark. A fill holds a fetch-ahead's pacer slot (demand misses go first), and
// range reads of its block meanwhile read their ranges rather than wait for it. Measured in
// docs/benchmarks.md ("Range first").
// Streaming: a demand miss of part of a block of at least kStreamMinBlock that this worker fetches
// from the under-storage itself does not wait for the whole block: the fetch runs on a thread of
// its own (stream_pool_) into a buffer that the requests for the block share, the under-storage
// reports the buffer's front as it lands (UnderFileSystem::ReadStreaming, ReadProgress), and each
// request is answered as soon as its own range has landed — a sequential reader of a cold shard
// gets its first bytes after the first round trip, not after 4 MiB. The bytes are the fetch's (one
// version: the read pins it, and a retry never rewrites what landed); what the fetch then keeps
// and reports is as for any miss. Stores that report nothing early (NFS, local) answer when the
// whole block is in, as before.
//
// Thread-safe.
#pragma once

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdlib>
#include <deque>
#include <future>
#include <list>
#include <map>
#include <memory>
#include <mutex>
#include <new>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "common/metrics.h"
#include "common/rate_limiter.h"
#include "common/status.h"
#include "common/thread_annotations.h"
#include "common/thread_pool.h"
#include "rpc/wire.h"
#include "worker/block_buffers.h"
#include "worker/block_store.h"
#include "worker/fetch_pacer.h"
#include "worker/interfaces.h"

namespace granary::worker {

struct SourceCounters {
  std::atomic<uint64_t> hits{0}, misses{0}, ufs_reads{0}, ufs_bytes{0}, bytes_served{0};
  std::atomic<uint64_t> coalesced{0};  // misses that joined another request's in-flight fetch
  std::atomic<uint64_t> buffered{0};   // misses served from the uncached-block buffer
  std::atomic<uint64_t> peer_reads{0}, peer_bytes{0};  // ranges and blocks fetched from peers
  std::atomic<uint64_t> peer_served{0};     // requests from peers this worker answered
  std::atomic<uint64_t> peer_failovers{0};  // peer calls that failed and moved to the next worker
  std::atomic<uint64_t> leased{0};          // hits served as a leased file descriptor (zero-copy)
  std::atomic<uint64_t> passthrough_leases{0};  // whole data files leased for FUSE passthrough opens
  std::atomic<uint64_t> prefetched{0};      // blocks fetched ahead of readers
  std::atomic<uint64_t> hints_freed{0};     // hints and fills dropped: freed since they were asked
  std::atomic<uint64_t> loaded_blocks{0}, loaded_bytes{0};  // fetched by load jobs
  std::atomic<uint64_t> ahead_blocks{0}, ahead_bytes{0};    // fetched by fetch-ahead (master/fetch_ahead.h)
  std::atomic<uint64_t> ahead_no_room{0};   // fetch-ahead blocks skipped: no free room (nothing fetched)
  std::atomic<uint64_t> range_reads{0};     // small misses answered from a ranged read (range first)
  std::atomic<uint64_t> streamed{0};        // misses answered as their range landed (streaming)
  std::atomic<uint64_t> previous_home_blocks{0};  // blocks this new home got from their previous home
  std::atomic<uint64_t> ufs_errors{0};      // under-storage reads that failed
  std::atomic<uint64_t> elastic_peer_bytes{0};  // bytes copied from holders into elastic copies
  std::atomic<uint64_t> classified{0};      // cached blocks whose kind a classification changed
};

// Where the bytes of a read came from: this worker's cache, another worker, or the under-storage
// (a read that joined a fetch in flight, or found the block in the uncached buffer, counts where
// that fetch got it). The wire's own enum (rpc/wire.h), so what the worker sends is what it counts.
using rpc::ReadSource;
const char* ReadSourceName(ReadSource s);  // "cache", "peer", "under_storage"

// Reads of one mount: hits + misses, and of the misses served, where the bytes came from.
struct MountAccess {
  uint64_t hits = 0, misses = 0;
  uint64_t peer = 0, under_storage = 0;
};

// Bytes of a fetch's buffer, without a copy: `bytes` stay valid and unchanged while `keep` is held.
struct SharedBytes {
  std::shared_ptr<const void> keep;
  std::string_view bytes;
};

class BlockSource {
 public:
  // Routes the store's removals (evictions, frees, corrupt blocks) to `reporter`. `placement` may be
  // null: the worker works alone.
  BlockSource(BlockStore* store, MountResolver* mounts, BlockReporter* reporter, Placement* placement = nullptr);
  ~BlockSource();

  // Fills `out` with the requested range (clipped at the block's end); `hit` tells whether it came
  // from the cache. INVALID_ARGUMENT for a range outside the file; FAILED_PRECONDITION when the file
  // changed in the under-storage.
  // `source` (optional) gets where the bytes came from.
  Status Read(const BlockRequest& req, std::string* out, bool* hit, ReadSource* source = nullptr);
  // Read for the zero-copy path: a cached block is not copied but leased (BlockStore::Lease) —
  // lease->fd >= 0, its bytes at lease->data_offset for lease->length; the block stays put until
  // the lease ends. So is a missed block once it is fetched and kept here. Otherwise (a range
  // streamed from a peer or read first, a block not kept) `out` has the bytes, as from Read.
  // With `shared`, a range answered from a fetch's buffer (a range of a block streamed as it lands,
  // or of a whole block fetched and not leased) comes there instead of in `out`: a view of the
  // buffer that shared->keep holds, for the caller to send from where it is (no copy; the bytes of
  // a fetch that landed never change).
  Status ReadOrLease(const BlockRequest& req, std::string* out, BlockLease* lease, bool* hit,
                     ReadSource* source = nullptr, SharedBytes* shared = nullptr);
  // For FUSE passthrough: leases the data file of a whole file (req names block 0 at offset 0, and
  // the file's size and block size), holding every block of it. A file of one block is fetched
  // first when this worker keeps it but has not cached it yet. NOT_FOUND when a block is not cached
  // here (another worker is its holder, it could not be cached, or the blocks are spread over
  // cache directories).
  StatusOr<BlockLease> LeaseFile(const BlockRequest& req, bool* hit, ReadSource* source = nullptr, bool verify = false);
  // The under-storage's file of `req` open for reading, when it is a file of this machine
  // (UnderFileSystem::OpenLocal), for granary-fuse to read uncached ranges of it itself. The
  // caller owns the descriptor. UNIMPLEMENTED for other under-storages.
  StatusOr<LocalFile> OpenSource(const BlockRequest& req);
  // A file this node just wrote to the under-storage (worker/writes.h): its blocks, read from the
  // staging file `fd` (the file's `size` bytes at their offsets), are kept here as a fetched block
  // would be (the home's copy, a replica, or an elastic copy while there is room), so reading it
  // back is warm. Blocks this worker would not keep are skipped; the first failure is returned.
  Status KeepWritten(uint64_t mount_id, const std::string& ufs_path, const std::string& version, uint64_t size,
                     uint64_t block_size, int fd);

  // granary-fuse read req's range (offset, length) from the under-storage's file itself
  // (OpenSource): counted as a range-first touch of the block, so a block touched twice is filled
  // in the background as RangeFirst would (this worker fetches it itself, the cache has free room).
  // Nothing is read now. True when a fill was queued.
  bool Touched(const BlockRequest& req);

  // Readahead: queues a background fetch of req's whole block unless it is cached. A holder of the
  // block fetches it like a miss (from the home, or the under-storage); any other worker passes the
  // hint to the block's home. At most kPrefetchQueue hints wait (false: dropped), kPrefetchThreads
  // run at once, so readahead never crowds out reads.
  bool Prefetch(const BlockRequest& req);

  // Load jobs: brings req's whole block into this worker's cache if this worker is one of the
  // block's first `replicas` holders (0: the mount's cache.replicas) — the home fetches it from the
  // under-storage, another holder copies it from the home. The ranking is over `members` (the
  // master's list for the batch; this worker is `self_id` in it), or this worker's own view when
  // `members` is empty. kNotMine: another worker's share;
  // kCached: it was cached already, nothing moved. A fetch first takes the block's bytes from
  // `pace` (may be null); CANCELLED when pace was stopped.
  //
  // A fetch-ahead (`ahead` set) differs in three ways: it fetches only into free room below a
  // level's low watermark (BlockStore::HasFreeRoom; kNoRoom, nothing fetched, when there is none:
  // it never evicts, so it never takes what the policy keeps); each fetch first takes a slot from
  // the pacer (FetchPacer::AcquireAhead: as many in flight as the measured bandwidth and latency
  // need, at most `ahead->cap`, demand misses first; CANCELLED when `ahead->stop` says so); and it
  // is counted as fetch-ahead, not as a load.
  //
  // `free_stamp`: the master's stamp of the batch (LoadBlocksRequest.free_stamp): a free stamped
  // later that covers the block, here before or after the batch, makes the fetch cache nothing
  // (kFetched; BlockStore::FreeTicketAt). 0: only frees from this call on count.
  enum class LoadOutcome { kNotMine, kCached, kFetched, kNoRoom };
  //
  // `ahead->held` (optional, one per calling thread): the caller keeps its pacer slot from one
  // block to the next, so a thread fetching a batch's blocks one after another does not hand its
  // slot to a waiting thread and wait for another (two context switches a block). Load takes a slot
  // only when *held is false and sets it once it has one; it gives a held slot back first when
  // fetch-ahead and demand fetches in flight exceed the target (FetchPacer::WithinTarget: a demand
  // miss came, or the target shrank). The caller gives it back at the end (ReleaseAheadSlot).
  struct AheadOptions {
    uint32_t cap = FetchPacer::kMaxCap;
    std::function<bool()> stop;
    bool* held = nullptr;
  };
  StatusOr<LoadOutcome> Load(BlockRequest req, uint32_t replicas, RateLimiter* pace = nullptr,
                             const std::vector<PeerRef>& members = {}, uint64_t self_id = 0,
                             const AheadOptions* ahead = nullptr, uint64_t free_stamp = 0);

  // Gives back a slot Load left held (AheadOptions::held).
  void ReleaseAheadSlot() { pacer_.ReleaseAhead(); }

  // Whether req's block is cached here (a cheap look: its key and the store's index).
  bool IsCached(const BlockRequest& req);
  // Which of the first `max_blocks` blocks of req's file are cached here: bit i of byte i / 8 for
  // block i (LocalResponse.source_cached). Empty when req does not resolve.
  std::string CachedBlocks(const BlockRequest& req, uint64_t max_blocks);

  // The membership changed: classify every cached block again (replica or elastic copy), in the
  // background, and report the changes. Calls while one runs coalesce into one more pass.
  void MembershipChanged();
  // One classification pass, now (the background thread runs this); returns the blocks changed.
  size_t ClassifyNow();

  const SourceCounters& counters() const { return counters_; }
  const metrics::Histogram& ufs_latency() const { return ufs_latency_; }
  const FetchPacer& pacer() const { return pacer_; }
  // Cache hits and misses of reads, per mount id.
  std::map<uint64_t, MountAccess> AccessByMount() const;

  static constexpr size_t kUncachedBlocks = 16;
  static constexpr size_t kMaxUfsPath = 4096;  // bytes of a request's ufs_path (PATH_MAX)
  static constexpr int kMaxPeerAttempts = 3;
  // Readahead hints waiting, and fetching at once: enough for several sequential readers to each
  // keep a few blocks in flight at a store's latency (deep readahead), few enough to leave the
  // cores to reads.
  static constexpr size_t kPrefetchQueue = 256;
  static constexpr size_t kPrefetchThreads = 8;
  static constexpr size_t kFillThreads = 2;
  // A granary-fuse hint or touch counts as asked this long before its sender's queue says it was
  // (PrefetchRequest.age_ms): the time on the way here. A free in that window also keeps it out;
  // the cost is a hint lost right after a free.
  static constexpr std::chrono::seconds kHintTransit{2};
  static constexpr size_t kTouched = 4096;  // blocks remembered as range-read once (SecondTouch)
  // Streaming: blocks at least this large are answered as their bytes land (a smaller block costs
  // about one round trip whole), by at most kStreamThreads fetches at once (more wait their turn).
  static constexpr uint64_t kStreamMinBlock = 1024 * 1024;
  static constexpr size_t kStreamThreads = 64;

 private:
  // A fetched block's bytes: an under-storage read lands in `raw` (allocated, never zero-filled
  // first: a 4 MiB memset per block was a tenth of a cold read's CPU), a peer's answer in `str`.
  struct FetchedBlock {
    std::string str;
    struct Free {
      Free() : capacity(0) {}  // (not `= 0` above: a nested class's initializer is not usable yet here)
      explicit Free(size_t c) : capacity(c) {}
      size_t capacity;
      void operator()(char* p) const { block_buffers::Give(p, capacity); }
    };
    std::unique_ptr<char, Free> raw;
    size_t raw_size = 0;
    ReadSource source;  // kPeer or kUnderStorage
    std::string_view bytes() const { return raw ? std::string_view(raw.get(), raw_size) : std::string_view(str); }
    // Not zeroed; 4 KiB-aligned, so the block store can write it with O_DIRECT (store::WriteData).
    // From worker/block_buffers.h: a large one is reused memory, its pages already mapped.
    char* Allocate(size_t n) {
      raw = std::unique_ptr<char, Free>(block_buffers::Take(n), Free(n));
      raw_size = n;
      return raw.get();
    }
  };
  using Fetched = StatusOr<std::shared_ptr<const FetchedBlock>>;
  // A fetch in flight (single-flight): its result for those who join it, and when it streams (see
  // "Streaming") the buffer it fills and how far that has landed.
  struct Flight {
    std::shared_ptr<FetchedBlock> block;  // null: not streamed; else allocated before the fetch, never reallocated
    ReadProgress progress;
    std::promise<Fetched> promise;
    std::shared_future<Fetched> result;
  };
  // What a request resolves to: its mount, its block, and how many bytes it covers (0: none).
  struct Target {
    MountHandle mount;
    BlockMeta meta;
    uint64_t len = 0;
  };
  StatusOr<Target> Resolve(const BlockRequest& req);
  // The rest of a read once the store missed: peers, the under-storage, single-flight. With
  // `lease`, a whole block fetched and kept here is answered as a lease on its cache file (out
  // empty), as a hit is; otherwise, and for ranges streamed or read first, `out` has the bytes.
  // With `shared`, bytes of a fetch's buffer come there (a view) rather than copied into `out`.
  Status Miss(const BlockRequest& req, const Target& t, std::string* out, bool* hit, ReadSource* source,
              BlockLease* lease = nullptr, SharedBytes* shared = nullptr);
  // How a missed block is fetched: from peers first (`ask_peers`), and whether it is kept.
  struct Route {
    bool ask_peers = false;
    bool keep = true;
    bool elastic = false;  // kept as an elastic copy
    bool home = true;      // kept by the block's home (first in the master's membership ranking)
    uint64_t gen = 0;      // classify_gen_ when the kind was decided
    bool ahead = false;    // a fetch-ahead's (holds a pacer slot; not a demand miss)
    // A load batch's free ticket (BlockStore::FreeTicketAt), for the Put; kNoTicket: one taken
    // when the fetch starts.
    uint64_t ticket = BlockStore::kNoTicket;
    // This worker became the block's home when the membership changed: the previous home is asked
    // for its cached copy before the under-storage (Placement::PreviousHome).
    std::optional<PeerRef> previous;
  };
  // After a Put of a block whose kind was decided at `gen`: when a classification pass started
  // since, it may have missed the block, so another one runs.
  void ClassifyAgainIfMissed(uint64_t gen);
  Fetched Fetch(const BlockRequest& req, const MountHandle& mount, const BlockMeta& meta, Route route);
  // `into` (optional): a streamed fetch, read into its buffer with its progress reported.
  Fetched FetchOnce(const BlockRequest& req, const MountHandle& mount, const BlockMeta& meta, Route route,
                    Flight* into = nullptr);
  // Whether a fetch by `route` of `meta` streams (see "Streaming").
  static bool Streams(const Route& route, const BlockMeta& meta);
  // A new fetch in flight of meta's block, with a buffer to stream into when `streams`.
  std::shared_ptr<Flight> NewFlightLocked(const BlockMeta& meta, bool streams) REQUIRES(mu_);
  // The leader's part of a fetch in flight (from NewFlightLocked): fetches, ends the fetch's time in
  // flight (a request after this starts its own), then publishes the result to those who joined.
  Fetched Lead(const BlockRequest& req, const MountHandle& mount, const BlockMeta& meta, const Route& route,
               const std::shared_ptr<Flight>& f);
  // Streaming: joins or starts a streamed fetch of t's block and waits for req's range. True with
  // *out (or *shared, when given) and *source set when the range landed; false when the fetch ended first, with *fetched
  // its result (the caller goes on as after Fetch); false with *fetched unset when the block does
  // not stream (a fetch of it that does not stream is in flight, or it is buffered).
  bool Stream(const BlockRequest& req, const Target& t, const Route& route, std::string* out, ReadSource* source,
              std::optional<Fetched>* fetched, SharedBytes* shared = nullptr);
  // Reads `req` from the best-ranked peer, failing over to the next; UNAVAILABLE when none could
  // serve, with *became_home set when the failures made this worker the block's home.
  Status FromPeers(const BlockRequest& req, const BlockId& id, std::string* out, bool* became_home);
  // Where a miss of `t` goes (see the design note); `home` gets the block's home when peers are asked.
  Route RouteFor(const BlockRequest& req, const Target& t, PeerRef* home);
  // Runs the readahead hints (fills: false) or the fills (true) until the worker stops.
  void PrefetchLoop(bool fills);
  void ClassifyLoop();
  void CountAccess(uint64_t mount_id, bool hit);
  void CountSource(uint64_t mount_id, ReadSource source);
  // A queued readahead hint, or a random reader's fill (`fill`: the block it fills, in fills_).
  struct Queued {
    BlockRequest req;
    std::optional<BlockId> fill;
    // Taken when the hint was queued: a free after it keeps the block out, however long the hint
    // waited (issue 56: a reader's readahead landed after a free of what it read).
    uint64_t ticket = BlockStore::kNoTicket;
  };
  // Queues a hint. Its ticket is taken now: from the stamp it came with (a peer's hint,
  // req.free_stamp), else from now; req.free_stamp is then set to the stamp this worker knew when
  // it queued the hint, so a peer that copies or warms the block for it honours the frees that
  // peer has seen since (BlockStore::FreeTicketAt).
  bool Enqueue(Queued q);
  Status Warm(BlockRequest req, const std::optional<BlockId>& fill = std::nullopt,
              uint64_t ticket = BlockStore::kNoTicket);
  // Whether a reader of a range of `id` waits for the whole block rather than reading its range:
  // the block was just fetched (buffered), or a fetch of it that a reader waits on is in flight. A
  // random reader's fill (fills_) is not waited for: the reader's own range costs one round trip,
  // the fill a whole block behind the readers it yields to.
  bool JoinRatherThanRange(const BlockId& id);
  // Queues the whole block `id` of `req` as a random reader's fill: fetched in the background with
  // a fetch-ahead's pacer slot (demand misses go first), not joined by range reads meanwhile. Fills
  // have a queue and kFillThreads threads of their own: one waiting for a slot never holds up a
  // readahead hint.
  void Fill(const BlockRequest& req, const BlockId& id);
  // True when `id` was range-read before (remembered in a direct-mapped table of kTouched
  // blocks): its second touch. Forgets it then.
  bool SecondTouch(const BlockId& id);
  // A small miss: its own bytes from a ranged under-storage read; the whole block follows in the
  // background when the cache has free room for it.
  Status RangeFirst(const BlockRequest& req, const Target& t, const Route& route, std::string* out,
                    ReadSource* source);

  BlockStore* store_;
  MountResolver* mounts_;
  BlockReporter* reporter_;
  Placement* placement_;
  SourceCounters counters_;
  metrics::Histogram ufs_latency_;  // whole-block reads from the under-storage
  FetchPacer pacer_;                // every under-storage fetch's bytes and time; fetch-ahead's slots
  Mutex mu_;
  std::unordered_map<BlockId, std::shared_ptr<Flight>, BlockIdHash> inflight_ GUARDED_BY(mu_);
  // Blocks served but not admitted to the store, most recent first (at most kUncachedBlocks).
  std::list<std::pair<BlockId, std::shared_ptr<const FetchedBlock>>> uncached_ GUARDED_BY(mu_);
  std::vector<BlockId> touched_ GUARDED_BY(mu_) = std::vector<BlockId>(kTouched);
  // Blocks queued or in flight as a random reader's fill (Fill).
  std::unordered_set<BlockId, BlockIdHash> fills_ GUARDED_BY(mu_);

  mutable Mutex access_mu_;
  std::unordered_map<uint64_t, MountAccess> access_ GUARDED_BY(access_mu_);

  // Bumped as a classification pass starts on a membership other than the last pass's, so a pass
  // rerun for a block it missed does not make blocks in flight ask for yet another.
  std::atomic<uint64_t> classify_gen_{0};
  Mutex classified_mu_;
  std::vector<PeerRef> classified_ GUARDED_BY(classified_mu_);  // the last pass's membership
  Mutex classify_mu_;
  std::condition_variable classify_cv_;
  bool classify_wanted_ GUARDED_BY(classify_mu_) = false;
  bool classify_stop_ GUARDED_BY(classify_mu_) = false;
  std::thread classifier_ GUARDED_BY(classify_mu_);

  Mutex prefetch_mu_;
  std::condition_variable prefetch_cv_;
  std::deque<Queued> prefetch_queue_ GUARDED_BY(prefetch_mu_);
  std::condition_variable fill_cv_;
  std::deque<Queued> fill_queue_ GUARDED_BY(prefetch_mu_);  // random readers' fills (Fill)
  std::vector<std::thread> fillers_ GUARDED_BY(prefetch_mu_);
  std::vector<std::thread> prefetchers_ GUARDED_BY(prefetch_mu_);
  bool prefetch_stop_ GUARDED_BY(prefetch_mu_) = false;
  // Demand misses' streamed fetches run here. Last: destroyed (its fetches finished) before what they use.
  ThreadPool stream_pool_{0, kStreamThreads, std::chrono::seconds(30)};
};

}  // namespace granary::worker
