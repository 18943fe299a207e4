#!/usr/bin/env bash
# Installs dependencies, builds, and runs every test (unit and integration, with real daemons and a
# real FUSE mount). Needs root for apt-get and /dev/fuse.
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
bash "$ROOT/scripts/thread-safety.sh"       # the annotated modules' locks, checked by clang
cd "${BUILD_DIR:-$ROOT/build}"
ctest --output-on-failure --timeout 900 "$@"
