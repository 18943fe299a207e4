#!/usr/bin/env bash
# Metadata at scale: `find` and `ls -lR` (a stat of every file) over an N-file dataset through the
# mount, beside the same on the local ext4 directory in the same run; the master's memory and
# RocksDB bytes per file; metadata operations per second the master sustains (granary-meta-bench).
# The under-storage is the local directory (file://), so the storage is not the bottleneck.
#
#   bench/metadata_scan.sh [--files N] [--per-dir M] [--build DIR] [--work DIR] [--keep]
#
# Files are empty (metadata only) in directories of M entries. Everything it starts is stopped and
# unmounted on exit, also on failure.
set -euo pipefail
FILES=200000; PER_DIR=1000; BUILD=""; WORK=""; KEEP=0
while [ $# -gt 0 ]; do
  case "$1" in
    --files) FILES=$2; shift 2;;
    --per-dir) PER_DIR=$2; shift 2;;
    --build) BUILD=$2; shift 2;;
    --work) WORK=$2; shift 2;;
    --keep) KEEP=1; shift;;
    *) echo "usage: $0 [--files N] [--per-dir M] [--build DIR] [--work DIR] [--keep]" >&2; exit 2;;
  esac
done
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BUILD=${BUILD:-$ROOT/build}
BIN=$BUILD/bin
for b in granary granary-master granary-worker granary-fuse granary-meta-bench; do
  [ -x "$BIN/$b" ] || { echo "error: $BIN/$b not found; build first (scripts/build.sh)" >&2; exit 1; }
done
WORK=${WORK:-$(mktemp -d /tmp/granary-bench-XXXXXX)}
mkdir -p "$WORK"
SRC=$WORK/src; MNT=$WORK/mnt
PIDS=()
cleanup() {
  if grep -q " $MNT " /proc/mounts 2>/dev/null; then fusermount3 -u -z "$MNT" 2>/dev/null || umount -l "$MNT" 2>/dev/null || true; fi
  for p in "${PIDS[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
  for p in "${PIDS[@]}"; do for _ in $(seq 100); do kill -0 "$p" 2>/dev/null || break; sleep 0.05; done; kill -9 "$p" 2>/dev/null || true; done
  [ "$KEEP" = 1 ] || rm -rf "$WORK"
}
trap cleanup EXIT INT TERM
drop_caches() { sync; if [ -w /proc/sys/vm/drop_caches ]; then echo 3 > /proc/sys/vm/drop_caches; fi; }
now() { date +%s.%N; }
rss() { awk '/VmRSS/ {print $2 * 1024}' "/proc/$1/status"; }
wait_file() { for _ in $(seq 600); do [ -s "$1" ] && return 0; sleep 0.05; done; echo "error: $1 never appeared" >&2; exit 1; }

if [ ! -d "$SRC" ]; then
  echo "creating $FILES files in $SRC ..." >&2
  /usr/bin/python3 - "$SRC" "$FILES" "$PER_DIR" <<'PY'
import os, sys
root, n, per = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
for i in range(n):
    d = os.path.join(root, "d%05d" % (i // per))
    if i % per == 0:
        os.makedirs(d, exist_ok=True)
    os.close(os.open(os.path.join(d, "f%07d.jpg" % i), os.O_CREAT | os.O_WRONLY, 0o644))
PY
fi
mkdir -p "$MNT"

timed() {  # LABEL COMMAND... -> "LABEL SECONDS COUNT"
  local label=$1; shift
  local t0 t1 n
  t0=$(now); n=$("$@" | wc -l); t1=$(now)
  echo "$label $(echo "$t1 - $t0" | bc) $n"
}

RESULTS=()
drop_caches
RESULTS+=("$(timed local_find_cold find "$SRC" -type f)")
RESULTS+=("$(timed local_find_warm find "$SRC" -type f)")
drop_caches
RESULTS+=("$(timed local_lslR_cold ls -lR "$SRC")")
RESULTS+=("$(timed local_lslR_warm ls -lR "$SRC")")

"$BIN/granary-master" --master.listen 127.0.0.1:0 --master.data_dir "$WORK/master" --ready-file "$WORK/master.addr" \
  --ufs.local_roots "$SRC" > "$WORK/master.log" 2>&1 &
PIDS+=($!); MASTER_PID=$!
wait_file "$WORK/master.addr"; MASTER=$(cat "$WORK/master.addr")
"$BIN/granary-worker" --master.address "$MASTER" --worker.listen 127.0.0.1:0 --worker.cache_dir "$WORK/cache" \
  --worker.cache_quota 1Gi --ready-file "$WORK/worker.addr" --ufs.local_roots "$SRC" > "$WORK/worker.log" 2>&1 &
PIDS+=($!)
wait_file "$WORK/worker.addr"; WORKER=$(cat "$WORK/worker.addr")
"$BIN/granary" --master "$MASTER" mount /ds "file://$SRC" > /dev/null
"$BIN/granary-fuse" --master.address "$MASTER" --fuse.worker "$WORKER" --fuse.mountpoint "$MNT" --fuse.root /ds \
  --ready-file "$WORK/fuse.addr" > "$WORK/fuse.log" 2>&1 &
PIDS+=($!); FUSE_PID=$!
wait_file "$WORK/fuse.addr"
RSS_BASE=$(rss "$MASTER_PID")

drop_caches
RESULTS+=("$(timed granary_find_cold find "$MNT" -type f)")   # the master lists every directory
RSS_LOADED=$(rss "$MASTER_PID")
DB_BYTES=$(du -sb "$WORK/master" | cut -f1)
drop_caches
RESULTS+=("$(timed granary_find_warm_master find "$MNT" -type f)")   # kernel caches dropped
RESULTS+=("$(timed granary_find_warm find "$MNT" -type f)")
# The kernel fills its FUSE readdir cache over several passes on large trees: show them.
RESULTS+=("$(timed granary_find_warm3 find "$MNT" -type f)")
RESULTS+=("$(timed granary_find_warm4 find "$MNT" -type f)")
drop_caches
RESULTS+=("$(timed granary_lslR_warm_master ls -lR "$MNT")")
RESULTS+=("$(timed granary_lslR_warm ls -lR "$MNT")")
FUSE_RSS=$(rss "$FUSE_PID")
OPS=$("$BIN/granary-meta-bench" --master "$MASTER" --path /ds/d00000 --local "$SRC/d00000" --threads 16 --seconds 4)
# The bulk load (one flat, paged listing) into a fresh mount of the same directory.
"$BIN/granary" --master "$MASTER" mount /bulk "file://$SRC" > /dev/null
LOAD=$("$BIN/granary-meta-bench" --master "$MASTER" --load /bulk)

/usr/bin/python3 - "$FILES" "$RSS_BASE" "$RSS_LOADED" "$DB_BYTES" "$FUSE_RSS" "$OPS" "$LOAD" "${RESULTS[@]}" <<'PY'
import json, sys
files, base, loaded, db, fuse_rss = (int(x) for x in sys.argv[1:6])
ops = json.loads(sys.argv[6])
load = json.loads(sys.argv[7])
runs = {}
for r in sys.argv[8:]:
    label, secs, n = r.split()
    runs[label] = (float(secs), int(n))
def row(name, label, base_label):
    s, n = runs[label]
    bs, bn = runs[base_label]
    print("| %s | %d | %.2f | %.0f | %.2f |" % (name, n, s, n / s, (n / s) / (bn / bs)))
print("| run (%d files) | entries | seconds | entries/s | vs local (same kind) |" % files)
print("|---|---:|---:|---:|---:|")
row("local ext4, `find`, cold", "local_find_cold", "local_find_cold")
row("local ext4, `find`, warm", "local_find_warm", "local_find_warm")
row("local ext4, `ls -lR`, cold", "local_lslR_cold", "local_lslR_cold")
row("local ext4, `ls -lR`, warm", "local_lslR_warm", "local_lslR_warm")
row("granary, `find`, cold (first listing)", "granary_find_cold", "local_find_cold")
row("granary, `find`, master warm, kernel cold", "granary_find_warm_master", "local_find_cold")
row("granary, `find`, warm (2nd pass)", "granary_find_warm", "local_find_warm")
row("granary, `find`, warm (3rd pass)", "granary_find_warm3", "local_find_warm")
row("granary, `find`, warm (4th pass)", "granary_find_warm4", "local_find_warm")
row("granary, `ls -lR`, master warm, kernel cold", "granary_lslR_warm_master", "local_lslR_cold")
row("granary, `ls -lR`, warm", "granary_lslR_warm", "local_lslR_warm")
print()
print("master RSS: %.1f MiB at start, %.1f MiB with %d files loaded: %.0f bytes/file beyond the base; "
      "RocksDB on disk %.1f MiB = %.0f bytes/file; granary-fuse RSS %.1f MiB" % (
      base / 2**20, loaded / 2**20, files, (loaded - base) / files, db / 2**20, db / files, fuse_rss / 2**20))
print("master metadata ops (Lookup+GetAttr, %d threads): %.0f/s; local stat+lstat: %.0f/s; ratio %.2f" % (
      ops["threads"], ops["master_ops_per_s"], ops["local_stat_ops_per_s"], ops["ratio"]))
s, n = runs["granary_find_cold"]
print("bulk metadata load of the same tree (one flat listing): %d files in %.2f s = %.0f files/s, %.1f x the "
      "lazy listing done by the cold `find` (%.0f entries/s)" % (load["files"], load["seconds"], load["files_per_s"],
      load["files_per_s"] / (n / s), n / s))
PY
