#!/usr/bin/env bash
# The quick start's main job: install, build, then generate a small ImageNet-like dataset on local
# disk, serve it with `granary local` (master, worker and FUSE on this machine), read every file
# through the mount cold and warm, and print throughput beside the local disk plus the cache's hits.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
bash "$ROOT/scripts/install-deps.sh"
bash "$ROOT/scripts/build.sh"
bash "$ROOT/scripts/install-python.sh"  # granary:// for fsspec, into Debian's python3 (docs/python.md)
bash "$ROOT/bench/local_read.sh" --files "${DEMO_FILES:-1000}" "$@"
