// MetaProxy: the namespace through the worker's local socket (LocalRequest.meta), for clients that
// hold no credentials for the master — the Python client (python/, docs/python.md) — and the grants
// that let a peer in worker.local_socket_group (a local user who is neither root nor the worker's
// own user) read exactly what POSIX permissions would let it read through the mount.
//
// Design. The worker asks the master with its own token; the token never leaves root. A trusted
// peer (root, the worker's user) may ask anything and needs no grant. For any other peer each
// answered entry carries a grant: its permission bits for the peer (read, write, search: the
// owner, group or other bits of the entry's mode, picked as the kernel's default_permissions picks
// them, with the peer's uid, gid and supplementary groups from SO_PEERCRED and SO_PEERGROUPS), the
// time it was made, and an HMAC-SHA256 of (peer uid, gids, ino, bits, time) under a key random to
// this worker process. A grant lives `grant_ttl` (fuse.attr_timeout: the mount's kernel keeps an
// attribute as long), so a chmod reaches a reader as soon as it reaches the mount's users. Every call names its directory or
// file by ino *and* that grant: the grant proves the peer reached the entry by a walk from the root
// with search permission on each directory on the way, and says what it may do there. A regular
// file the peer may read also gets a data grant, an HMAC of (uid, gids, mount, under-storage path,
// version, size, block size): the worker's read path asks no master, so a read names the file by
// its under-storage identity, and the data grant keeps a peer from naming any other object below a
// mount's root (or another version). A new worker process has a new key: every grant is void
// (UNAUTHENTICATED), and the client walks again. A reader is shown no file's under-storage
// identity unless it may read the file. NOTE_OPENS names files by their grants too.
//
// Thread-safe.
#pragma once

#include <array>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/config.h"
#include "common/status.h"
#include "proto/granary.grpc.pb.h"
#include "rpc/rpc.h"

namespace granary::worker {

// Who is at the other end of a local connection.
struct LocalPeer {
  bool trusted = false;  // root or the worker's own user: no grants asked
  uint32_t uid = 0;
  uint32_t gid = 0;
  std::vector<uint32_t> groups;  // supplementary groups (SO_PEERGROUPS), sorted
  // SO_PEERCRED and SO_PEERGROUPS of `conn` (as they were at connect()); trusted for root and this
  // process's euid. A peer whose groups cannot be read gets none (stricter, never looser).
  static LocalPeer Of(int conn);
};

class MetaProxy {
 public:
  // Permission bits of a grant (as in a mode's rwx triple).
  static constexpr uint32_t kRead = 4, kWrite = 2, kSearch = 1;

  MetaProxy(const Config& cfg, std::shared_ptr<RpcSecurity> sec);

  // Answers `call` for `peer`. PERMISSION_DENIED when the entry's mode does not let the peer do
  // it; UNAUTHENTICATED for a grant this worker did not make for this peer (a forged one, or one
  // from before a restart); the master's error otherwise.
  Status Handle(const LocalPeer& peer, const rpc::MetaCall& call, rpc::MetaAnswer* out);
  // OK when `grant` is peer's data grant for the file `r` reads (always for a trusted peer);
  // UNAUTHENTICATED otherwise.
  Status CheckRead(const LocalPeer& peer, const rpc::ReadBlockRequest& r, const std::string& grant) const;

  // The bits `attr`'s mode gives `peer` (all for root).
  static uint32_t PermFor(const LocalPeer& peer, const rpc::Attr& attr);

  // How long a grant is good for (MetaAnswer.grant_ttl_ms).
  std::chrono::milliseconds grant_ttl() const { return grant_ttl_; }

  // The grants themselves (what Handle hands out; public for tests). `age`: made that long ago.
  std::string Grant(const LocalPeer& peer, uint64_t ino, uint32_t perm,
                    std::chrono::milliseconds age = std::chrono::milliseconds(0)) const;
  // The bits a grant of `ino` gives (UNAUTHENTICATED when it is not this worker's for this peer,
  // or older than grant_ttl).
  StatusOr<uint32_t> Verify(const LocalPeer& peer, uint64_t ino, const std::string& grant) const;
  std::string DataGrant(const LocalPeer& peer, uint64_t mount_id, const std::string& ufs_path,
                        const std::string& version, uint64_t size, uint64_t block_size,
                        std::chrono::milliseconds age = std::chrono::milliseconds(0)) const;

 private:
  std::string Mac(const std::string& message) const;
  // Milliseconds since this proxy started (a grant's time; never goes back).
  uint64_t NowMs() const;
  // The time and MAC part of a grant, checked: UNAUTHENTICATED when `grant` (after `skip` bytes)
  // is not `message`'s at its time, or is too old.
  Status CheckMac(std::string message, const std::string& grant, size_t skip) const;
  // Appends the peer's identity (uid, gid, groups) to a MAC's message.
  static void PutPeer(std::string* m, const LocalPeer& peer);
  // The grants of one entry (none for a trusted peer): `dir_perm` is the parent's bits.
  // A file's information the peer may not read is cleared (file->ufs_path() empty after).
  void GrantEntry(const LocalPeer& peer, const rpc::Attr& attr, rpc::FileInfo* file, std::string* grant,
                  std::string* data_grant) const;
  grpc::Status CallMaster(const std::function<grpc::Status(rpc::Master::Stub&, grpc::ClientContext&)>& call);

  const Config cfg_;
  std::shared_ptr<RpcSecurity> sec_;
  StubHolder<rpc::Master> master_;
  std::array<unsigned char, 32> key_{};
  const std::chrono::milliseconds grant_ttl_;
  const std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now();
};

}  // namespace granary::worker
