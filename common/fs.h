// Small filesystem helpers over POSIX calls, returning Status. Thread-safe.
#pragma once

#include <string>

#include "common/status.h"

namespace granary {

// mkdir -p with `mode` for every directory it creates; an existing directory is fine.
Status MakeDirs(const std::string& path, unsigned mode);
// Writes `data` to path.tmp, fsyncs, renames over `path` (mode 0600).
Status WriteFileAtomic(const std::string& path, const std::string& data);
StatusOr<std::string> ReadFileToString(const std::string& path);
bool IsDirectory(const std::string& path);
// The directory part of `path`: "/a/b" for "/a/b/c", "/" for "/c" or a path without a slash.
std::string ParentDir(const std::string& path);

// When `path` is on an ext4 file system without a journal, that file system's name in
// /sys/fs/ext4 (e.g. "vda"); "" otherwise or when it cannot tell. Such an ext4 scans past every
// recently deleted inode when it creates a file, which a cache that evicts and admits all the time
// pays on every new block file (docs/benchmarks.md, session 37).
std::string Ext4WithoutJournal(const std::string& path);

// Where daemons leave small files for each other and the CLI on this machine (hand-over sockets,
// mount endpoints): $GRANARY_RUN_DIR, else /run/granary where writable (root), else
// $XDG_RUNTIME_DIR/granary, else /tmp/granary-<uid>. Private or refused: created 0700 when missing;
// an existing one is used only when it is a directory (not a link) owned by this process's user,
// its group and other permission bits then removed. One another user made (a squat in /tmp, which
// anyone may write) is skipped when it is /run's or $XDG_RUNTIME_DIR's and refused otherwise:
// PERMISSION_DENIED naming it and its owner, since whatever it holds could be theirs.
StatusOr<std::string> RuntimeDir();
// fuse-<16 hex digits of the path's hash><suffix>: the name of a file about the mount at `mountpoint`.
std::string MountRunFileName(const std::string& mountpoint, const std::string& suffix);
// RuntimeDir()/MountRunFileName(mountpoint, suffix).
StatusOr<std::string> MountRunFile(const std::string& mountpoint, const std::string& suffix);
// The file in which the granary-fuse serving `mountpoint` (an absolute, canonical path) names its
// endpoints (JSON: mountpoint, root, pid, metrics, worker, master), for `granary stats`, `trace`,
// `profile` and `info`.
StatusOr<std::string> MountEndpointsFile(const std::string& mountpoint);
// Makes `dir` (its parents as MakeDirs does) and checks it as RuntimeDir checks its own.
Status MakePrivateDir(const std::string& dir);

}  // namespace granary
