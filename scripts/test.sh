#!/usr/bin/env bash
# Installs dependencies, builds, and runs every test: the fuzz targets for a while each, the unit and
# integration tests (real daemons, real FUSE mounts, real servers), and a 3-minute chaos epoch.
# Needs root for apt-get and /dev/fuse. FUZZ_SECONDS and CHAOS_MINUTES change the two run lengths.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
bash "$ROOT/scripts/install-deps.sh"
bash "$ROOT/scripts/s3-server.sh" install   # Ceph RGW for the S3 tests
bash "$ROOT/scripts/nfs-server.sh" install  # nfs-ganesha for the NFS tests
bash "$ROOT/scripts/etcd.sh" install        # etcd for the masters' leader election tests
# The official ali-oss SDK, to check OSS signatures against (versions pinned by package-lock.json).
command -v npm >/dev/null || bash "$ROOT/scripts/apt-ensure.sh" nodejs npm
(cd "$ROOT/tests/ufs/oss_sdk" && npm ci --silent --no-audit --no-fund >/dev/null)
bash "$ROOT/scripts/build.sh"
bash "$ROOT/scripts/install-python.sh"  # granary:// for fsspec, into Debian's python3 (docs/python.md)
bash "$ROOT/scripts/thread-safety.sh"       # the annotated modules' locks, checked by clang
# Every libFuzzer target on its checked-in corpus for a while (tests/fuzz; clang, ASan, UBSan).
bash "$ROOT/scripts/fuzz.sh" --seconds "${FUZZ_SECONDS:-20}"
(cd "${BUILD_DIR:-$ROOT/build}" && ctest --output-on-failure --timeout 900 "$@")
# The chaos epoch: every fault at once under training reads and writes, nodes in every read mode
# (kernel, daemon, passthrough, kernel; docs/benchmarks.md).
BIN_DIR="${BUILD_DIR:-$ROOT/build}/bin" bash "$ROOT/bench/chaos.sh" --minutes "${CHAOS_MINUTES:-3}"
