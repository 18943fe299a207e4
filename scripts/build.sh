#!/usr/bin/env bash
# Configures and builds Granary into build/ (binaries in build/bin). Uses ccache when present.
# BUILD_DIR, BUILD_TYPE (RelWithDebInfo), and GRANARY_BUILD_TESTS / GRANARY_BUILD_BENCH /
# GRANARY_BUILD_PYTHON (ON: all OFF builds only the daemons and the CLI, as the image does).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BUILD=${BUILD_DIR:-$ROOT/build}
cmake -S "$ROOT" -B "$BUILD" -DCMAKE_BUILD_TYPE="${BUILD_TYPE:-RelWithDebInfo}" \
  -DGRANARY_BUILD_TESTS="${GRANARY_BUILD_TESTS:-ON}" -DGRANARY_BUILD_BENCH="${GRANARY_BUILD_BENCH:-ON}" \
  -DGRANARY_BUILD_PYTHON="${GRANARY_BUILD_PYTHON:-ON}" >/dev/null
cmake --build "$BUILD" -j"$(nproc)"
echo "build: binaries in $BUILD/bin"
