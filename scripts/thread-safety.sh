#!/usr/bin/env bash
# Checks the lock annotations (common/thread_annotations.h) of every module (common, ufs, rpc,
# master, worker, fuse, cli, python) with clang's -Wthread-safety as errors (cmake/granary.cmake turns it on
# for each granary_library): a field touched without its mutex, or a *Locked function called
# without it, fails. Builds only those modules (and what they need) into build-tsa/ with clang++.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BUILD=${TSA_BUILD_DIR:-$ROOT/build-tsa}
command -v clang++ >/dev/null || bash "$ROOT/scripts/apt-ensure.sh" clang
CXX=clang++ cmake -S "$ROOT" -B "$BUILD" -DCMAKE_BUILD_TYPE=Debug -DGRANARY_THREAD_SAFETY=ON \
  -DGRANARY_BUILD_TESTS=OFF -DGRANARY_BUILD_BENCH=OFF >/dev/null
cmake --build "$BUILD" -j"$(nproc)" --target granary_common granary_ufs granary_rpc granary_master granary_worker granary_fuse granary_cli granary_pyclient
echo "thread-safety: every module (common, ufs, rpc, master, worker, fuse, cli, python) passes clang -Wthread-safety"
