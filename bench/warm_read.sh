#!/usr/bin/env bash
# Warm reads through the mount against the medium underneath, in one run (issue 7's targets):
#   large  one big file read sequentially (1 MiB reads) through the mount, warm, against a plain
#          read of the same cached bytes: the block files in the tier directory, same reader;
#   small  ImageNet-like files read whole in shuffled order by several threads, warm, against the
#          same files on local ext4 (page cache warm, and cold).
# The mount runs with fuse.keep_cache false, so every read goes to the worker (zero-copy local
# path) instead of the kernel's page cache. Prints a Markdown table with the ratios.
#
#   bench/warm_read.sh [--large-mb N] [--files N] [--threads T] [--tier mem|ssd] [--epochs E]
#                      [--zero-copy true|false] [--build DIR] [--work DIR] [--keep]
#
# Everything it starts is stopped and unmounted on exit, also on failure or Ctrl-C.
set -euo pipefail
LARGE_MB=512; FILES=2000; THREADS=8; TIER=mem; EPOCHS=3; ZERO_COPY=true; BUILD=""; WORK=""; KEEP=0
while [ $# -gt 0 ]; do
  case "$1" in
    --large-mb) LARGE_MB=$2; shift 2;;
    --files) FILES=$2; shift 2;;
    --threads) THREADS=$2; shift 2;;
    --tier) TIER=$2; shift 2;;
    --epochs) EPOCHS=$2; shift 2;;
    --zero-copy) ZERO_COPY=$2; shift 2;;
    --build) BUILD=$2; shift 2;;
    --work) WORK=$2; shift 2;;
    --keep) KEEP=1; shift;;
    *) echo "usage: $0 [--large-mb N] [--files N] [--threads T] [--tier mem|ssd] [--epochs E] [--zero-copy true|false] [--build DIR] [--work DIR] [--keep]" >&2; exit 2;;
  esac
done
case "$TIER" in mem|ssd) ;; *) echo "error: --tier is mem or ssd" >&2; exit 2;; esac
source "$(dirname "$0")/lib.sh"
bench_setup granary-warm
DATA=$WORK/data; MNT=$WORK/mnt; STATE=$WORK/state
if [ "$TIER" = mem ]; then TIERDIR=$(mktemp -d /dev/shm/granary-warm-XXXXXX); MEDIUM=MEM; else TIERDIR=$WORK/tier; MEDIUM=SSD; fi
cleanup() {
  stop_local
  case "$TIERDIR" in /dev/shm/granary-warm-*) rm -rf "$TIERDIR";; esac
  [ "$KEEP" = 1 ] || rm -rf "$WORK"
}
trap cleanup EXIT INT TERM
drop_caches() { sync; if [ -w /proc/sys/vm/drop_caches ]; then echo 3 > /proc/sys/vm/drop_caches; fi; }

mkdir -p "$DATA/large" "$MNT"
[ -f "$DATA/large/big.bin" ] || head -c "$((LARGE_MB * 1024 * 1024))" /dev/urandom > "$DATA/large/big.bin"
[ -d "$DATA/small" ] || python3 "$ROOT/bench/gen_dataset.py" --out "$DATA/small" --files "$FILES" --seed 42 >/dev/null
QUOTA=$(( (LARGE_MB * 1024 * 1024 + $(du -sb "$DATA/small" | cut -f1)) * 2 ))
cat > "$WORK/granary.yaml" <<YAML
worker:
  tieredstore:
    levels:
      - {mediumtype: $MEDIUM, path: $TIERDIR, quota: $QUOTA}
fuse:
  keep_cache: false
  zero_copy: $ZERO_COPY
YAML

start_local "$WORK/local.log" "file://$DATA" "$MNT" --dir "$STATE" --config "$WORK/granary.yaml"

run() {  # ROOT MODE THREADS SEED LABEL -> the last epoch's JSON line
  "$BIN/granary-train-read" --root "$1" --mode "$2" --threads "$3" --epochs "$EPOCHS" --seed "$4" --label "$5" | tail -1
}

# Large: warm the cache (cold read), then the tier's block files, then the mount, each warm.
"$BIN/granary-train-read" --root "$MNT/large" --mode shards --threads 1 --label warmup >/dev/null
TIER_LARGE=$(run "$TIERDIR" shards 1 1 "tier directory ($MEDIUM), block files")
MNT_LARGE=$(run "$MNT/large" shards 1 2 "granary mount, warm")

# Small: local ext4 cold and warm, then through the mount (first epoch fills the cache).
drop_caches
SRC_COLD=$("$BIN/granary-train-read" --root "$DATA/small" --threads "$THREADS" --seed 3 --label "local ext4, cold page cache")
SRC_WARM=$(run "$DATA/small" files "$THREADS" 4 "local ext4, warm page cache")
"$BIN/granary-train-read" --root "$MNT/small" --threads "$THREADS" --seed 5 --label warmup >/dev/null
MNT_SMALL=$(run "$MNT/small" files "$THREADS" 6 "granary mount, warm")

REPORT=$("$BIN/granary" report --json)
python3 - "$TIER_LARGE" "$MNT_LARGE" "$SRC_COLD" "$SRC_WARM" "$MNT_SMALL" "$REPORT" "$THREADS" "$ZERO_COPY" <<'PY'
import json, sys
tier, mnt, cold, warm, small = [json.loads(x) for x in sys.argv[1:6]]
rep = json.loads(sys.argv[6]); threads = sys.argv[7]; zc = sys.argv[8]
print()
print("| reader | files | MB | MB/s | files/s | p50 ms | p99 ms | ratio |")
print("|---|---:|---:|---:|---:|---:|---:|---:|")
def row(r, ratio):
    print("| %s | %d | %.0f | %.1f | %.0f | %.2f | %.2f | %s |" % (r["label"], r["files"], r["bytes"] / 1e6, r["mb_per_s"],
          r["files_per_s"], r["p50_ms"], r["p99_ms"], ratio))
print("| **large file, sequential, 1 thread** | | | | | | | |")
row(tier, "1.00")
row(mnt, "**%.2f** x tier (target >= 0.8)" % (mnt["mb_per_s"] / tier["mb_per_s"]))
print("| **small files, shuffled, %s threads** | | | | | | | |" % threads)
row(cold, "%.2f" % (cold["files_per_s"] / warm["files_per_s"]))
row(warm, "1.00")
row(small, "**%.2f** x ext4 warm, %.2f x ext4 cold (target >= 0.5)" % (small["files_per_s"] / warm["files_per_s"],
                                                                      small["files_per_s"] / cold["files_per_s"]))
w = rep["workers"][0]
print()
print("zero_copy=%s: worker hits %d, misses %d, leased (zero-copy) %d, prefetched %d" % (
    zc, w["hits"], w["misses"], w["leases"], w["prefetched"]))
bad = [r["label"] for r in (tier, mnt, cold, warm, small) if r["errors"]]
if bad:
    print("ERRORS in: " + ", ".join(bad)); sys.exit(1)
PY
