#!/usr/bin/env bash
# Configures and builds Granary into build/ (binaries in build/bin). Uses ccache when present.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BUILD=${BUILD_DIR:-$ROOT/build}
cmake -S "$ROOT" -B "$BUILD" -DCMAKE_BUILD_TYPE="${BUILD_TYPE:-RelWithDebInfo}" >/dev/null
cmake --build "$BUILD" -j"$(nproc)"
echo "build: binaries in $BUILD/bin"
