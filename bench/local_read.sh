#!/usr/bin/env bash
# The read experiment on one machine: an ImageNet-like dataset on local disk, served by
# `granary local`, read in shuffled order by several threads — from the source directory (the
# limit), then through the mount cold (empty cache) and warm (second epoch). Prints a Markdown
# table with the ratios and the cache's counters.
#
#   bench/local_read.sh [--files N] [--threads T] [--build DIR] [--work DIR] [--keep]
#
# Everything it starts is stopped and unmounted on exit, also on failure or Ctrl-C.
set -euo pipefail
FILES=2000; THREADS=8; BUILD=""; WORK=""; KEEP=0
while [ $# -gt 0 ]; do
  case "$1" in
    --files) FILES=$2; shift 2;;
    --threads) THREADS=$2; shift 2;;
    --build) BUILD=$2; shift 2;;
    --work) WORK=$2; shift 2;;
    --keep) KEEP=1; shift;;
    *) echo "usage: $0 [--files N] [--threads T] [--build DIR] [--work DIR] [--keep]" >&2; exit 2;;
  esac
done
source "$(dirname "$0")/lib.sh"
bench_setup granary-bench
DATA=$WORK/imagenet; MNT=$WORK/mnt; STATE=$WORK/state
cleanup() { stop_local; [ "$KEEP" = 1 ] || rm -rf "$WORK"; }
trap cleanup EXIT INT TERM

drop_caches() { sync; if [ -w /proc/sys/vm/drop_caches ]; then echo 3 > /proc/sys/vm/drop_caches; fi; }

if [ ! -d "$DATA" ]; then python3 "$ROOT/bench/gen_dataset.py" --out "$DATA" --files "$FILES" --seed 42; fi
mkdir -p "$MNT"

read_run() { "$BIN/granary-train-read" --root "$1" --threads "$THREADS" --seed "$2" --label "$3"; }

drop_caches
SRC_COLD=$(read_run "$DATA" 1 "local disk, cold page cache")
SRC_WARM=$(read_run "$DATA" 2 "local disk, warm page cache")

# keep_cache off: the warm epochs measure the worker's cache, not the kernel's page cache.
start_local "$WORK/local.log" "file://$DATA" "$MNT" --dir "$STATE" --fuse.keep_cache false

drop_caches
G_COLD=$(read_run "$MNT" 3 "granary, cold cache (epoch 1)")
G_WARM=$(read_run "$MNT" 4 "granary, warm cache (epoch 2)")
G_WARM2=$(read_run "$MNT" 5 "granary, warm cache (epoch 3)")

# Counters arrive with the worker's next report; poll until the cold epoch's misses are visible.
# (Warm epochs reach the worker only in the daemon read mode: in the kernel mode, auto's choice for
# small files, the kernel serves them from its page cache.)
REPORT=""
for _ in $(seq 100); do
  REPORT=$("$BIN/granary" report --json)
  python3 - "$REPORT" "$FILES" <<'PY' && break
import json, sys
r = json.loads(sys.argv[1]); sys.exit(0 if r["cache"]["misses"] >= int(sys.argv[2]) else 1)
PY
  sleep 0.1
done

python3 - "$SRC_COLD" "$SRC_WARM" "$G_COLD" "$G_WARM" "$G_WARM2" "$REPORT" "$THREADS" <<'PY'
import json, sys
runs = [json.loads(x) for x in sys.argv[1:6]]
rep = json.loads(sys.argv[6]); threads = sys.argv[7]
src_warm = runs[1]
print()
print("| reader (%s threads, shuffled) | files | MB | files/s | MB/s | p50 ms | p99 ms | vs local warm |" % threads)
print("|---|---:|---:|---:|---:|---:|---:|---:|")
for r in runs:
    print("| %s | %d | %.0f | %.0f | %.1f | %.2f | %.2f | %.2f |" % (
        r["label"], r["files"], r["bytes"] / 1e6, r["files_per_s"], r["mb_per_s"], r["p50_ms"], r["p99_ms"],
        r["files_per_s"] / src_warm["files_per_s"]))
c = rep["cache"]; m = rep["mounts"][0]
print()
print("cache: %d hits, %d misses, %.1f MB read from the under-storage, %.1f%% of %s cached" % (
    c["hits"], c["misses"], c["ufs_bytes"] / 1e6, m["cached_percentage"], m["path"]))
print("(hits count reads that reached the worker; in the kernel read mode, the default for small files,")
print(" warm epochs are served by the kernel's page cache and never reach granary-fuse or the worker)")
bad = [r["label"] for r in runs if r["errors"]]
if bad:
    print("ERRORS in: " + ", ".join(bad)); sys.exit(1)
PY
