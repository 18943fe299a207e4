#!/usr/bin/env bash
# The master's memory and RocksDB bytes per file as the namespace grows: N empty files (in
# directories of M) are bulk-loaded into a standalone granary-master (LoadMetadata), and its RSS
# and data directory are measured before and after. Target: <= 200 bytes of RSS per file beyond a
# fixed base (the RocksDB block cache and memtables are part of the base: they do not grow with N).
# Then W simulated workers (granary-cluster-sim, the workers' own protocol) cache every file's
# block between them and report it, and the RSS is measured again. Target: RSS with the whole
# namespace cached <= 1.2x the RSS with nothing cached (the master keeps no per-block map).
#
#   bench/master_memory.sh [--files N] [--per-dir M] [--cache-workers W] [--links] [--interrupt S]
#                          [--build DIR] [--work DIR] [--keep]
#
# --interrupt S kills the master with -9 S seconds into the load, starts it again on its data and
# loads again: the second load resumes after the first one's last written page (the namespace's
# load cursor), and the table says how many files each listed. The RSS figures are then the
# restarted master's.
#
# --links makes every file of a directory a hard link to one empty file: a name costs a directory
# entry, not an inode, so tens of millions of files fit a filesystem's inode count and are made
# several times faster (with --work on a tmpfs such as /dev/shm: about 250 bytes of RAM a name).
set -euo pipefail
FILES=1000000; PER_DIR=1000; CACHE_WORKERS=4; LINKS=0; INTERRUPT=0; BUILD=""; WORK=""; KEEP=0
while [ $# -gt 0 ]; do
  case "$1" in
    --files) FILES=$2; shift 2;;
    --per-dir) PER_DIR=$2; shift 2;;
    --cache-workers) CACHE_WORKERS=$2; shift 2;;
    --links) LINKS=1; shift;;
    --interrupt) INTERRUPT=$2; shift 2;;
    --build) BUILD=$2; shift 2;;
    --work) WORK=$2; shift 2;;
    --keep) KEEP=1; shift;;
    *) echo "usage: $0 [--files N] [--per-dir M] [--cache-workers W] [--links] [--interrupt S] [--build DIR] [--work DIR] [--keep]" >&2; exit 2;;
  esac
done
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BIN=${BUILD:-$ROOT/build}/bin
for b in granary granary-master granary-meta-bench granary-cluster-sim; do
  [ -x "$BIN/$b" ] || { echo "error: $BIN/$b not found; build first (scripts/build.sh)" >&2; exit 1; }
done
WORK=${WORK:-$(mktemp -d /tmp/granary-bench-XXXXXX)}
mkdir -p "$WORK"
SRC=$WORK/src
MASTER_PID=""
cleanup() {
  if [ -n "$MASTER_PID" ]; then kill -TERM "$MASTER_PID" 2>/dev/null || true; wait "$MASTER_PID" 2>/dev/null || true; fi
  if [ "$KEEP" = 1 ] || [ "$FINISHED" != 1 ]; then
    echo "kept $WORK (a rerun with --work $WORK reuses or resumes its dataset)" >&2
  else
    rm -rf "$WORK"
  fi
}
FINISHED=0
trap cleanup EXIT INT TERM
rss() { awk '/VmRSS/ {print $2 * 1024}' "/proc/$1/status"; }
# The dataset is made once per --work directory, resumably: a run cut short goes on where it stopped
# (whole directories are skipped), and the marker says it is complete.
if [ ! -e "$WORK/src.done" ]; then
  echo "creating $FILES files in $SRC ..." >&2
  /usr/bin/python3 - "$SRC" "$FILES" "$PER_DIR" "$LINKS" <<'PY'
import os, sys
root, n, per, links = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4] == "1"
first = None
i = 0
while i < n:
    d = os.path.join(root, "d%05d" % (i // per))
    name = os.path.join(d, "f%08d.jpg" % i)
    if i % per == 0:
        want = min(per, n - i)
        if os.path.isdir(d) and len(os.listdir(d)) == want:
            i += want  # made by an earlier run
            continue
        os.makedirs(d, exist_ok=True)
        first = name
    if os.path.exists(name):
        i += 1
        continue
    if links and name != first:
        os.link(first, name)
    else:
        os.close(os.open(name, os.O_CREAT | os.O_WRONLY, 0o644))
    i += 1
PY
  touch "$WORK/src.done"
fi
rm -rf "$WORK/master" "$WORK/master.addr"  # the load is what is measured: always into a fresh master
start_master() {
  rm -f "$WORK/master.addr"
  "$BIN/granary-master" --master.listen 127.0.0.1:0 --master.data_dir "$WORK/master" --ready-file "$WORK/master.addr" \
    --ufs.local_roots "$SRC" \
    >> "$WORK/master.log" 2>&1 &
  MASTER_PID=$!
  for _ in $(seq 1200); do [ -s "$WORK/master.addr" ] && break; sleep 0.05; done
  MASTER=$(cat "$WORK/master.addr")
}
: > "$WORK/master.log"
start_master
"$BIN/granary" --master "$MASTER" mount /ds "file://$SRC" > /dev/null
FIRST='null'
if [ "$INTERRUPT" != 0 ]; then
  T0=$(date +%s%N)
  "$BIN/granary-meta-bench" --master "$MASTER" --load /ds > /dev/null 2>&1 &
  LOADER=$!
  sleep "$INTERRUPT"
  kill -KILL "$MASTER_PID"; wait "$MASTER_PID" 2>/dev/null || true
  wait "$LOADER" 2>/dev/null || true
  FIRST="{\"seconds\": $(( ($(date +%s%N) - T0) / 1000000 ))e-3}"
  start_master
fi
BASE=$(rss "$MASTER_PID")
LOAD=$("$BIN/granary-meta-bench" --master "$MASTER" --load /ds)
AFTER=$(rss "$MASTER_PID")
DB=$(du -sb "$WORK/master" | cut -f1)
# Every file's block cached once across the workers, reported over 10 s (one report a second each).
SIM=$("$BIN/granary-cluster-sim" --master "$MASTER" --path /ds/d00000 --workers "$CACHE_WORKERS" --clients 0 \
  --seconds 10 --blocks-per-s $(( (FILES + CACHE_WORKERS * 10 - 1) / (CACHE_WORKERS * 10) )) --master-pid "$MASTER_PID")
CACHED=$(rss "$MASTER_PID")
# A cold `ls`: the master restarted on its data (RocksDB's caches empty) and the page cache dropped,
# then one directory in the middle of the namespace listed.
kill -TERM "$MASTER_PID"; wait "$MASTER_PID" 2>/dev/null || true
sync; echo 3 > /proc/sys/vm/drop_caches 2>/dev/null || echo "warning: cannot drop the page cache (not root?)" >&2
start_master
LSDIR=$(printf "/ds/d%05d" $(( FILES / PER_DIR / 2 )))
T0=$(date +%s%N)
LSN=$("$BIN/granary" --master "$MASTER" ls "$LSDIR" | wc -l)
COLD_LS_MS=$(( ($(date +%s%N) - T0) / 1000000 ))
/usr/bin/python3 - "$FILES" "$BASE" "$AFTER" "$DB" "$LOAD" "$CACHED" "$SIM" "$CACHE_WORKERS" "$LSDIR" "$LSN" "$COLD_LS_MS" \
  "$FIRST" <<'PY'
import json, sys
n, base, after, db = (int(x) for x in sys.argv[1:5])
load = json.loads(sys.argv[5])
cached, sim, workers = int(sys.argv[6]), json.loads(sys.argv[7]), int(sys.argv[8])
lsdir, lsn, ls_ms = sys.argv[9], int(sys.argv[10]), int(sys.argv[11])
first = json.loads(sys.argv[12])
if first is not None:
    print("| load killed (-9) after | resumed load: files listed (of %d) | its seconds | resumed |" % n)
    print("|---:|---:|---:|---|")
    print("| %.1f s | %d | %.1f | %s |" % (first["seconds"], load["files"], load["seconds"], load["resumed"]))
    print()
print("| files | load s | files/s | master RSS before | after | RSS bytes/file beyond base | RocksDB bytes/file |")
print("|---:|---:|---:|---:|---:|---:|---:|")
print("| %d | %.1f | %.0f | %.1f MiB | %.1f MiB | %.0f | %.0f |" % (n, load["seconds"], load["files_per_s"],
      base / 2**20, after / 2**20, (after - base) / n, db / n))
print()
print("| blocks cached (on %d workers) | master RSS nothing cached | all cached | ratio (target <= 1.2) |" % workers)
print("|---:|---:|---:|---:|")
print("| %d | %.1f MiB | %.1f MiB | %.3f |" % (sim["blocks_reported"], after / 2**20, cached / 2**20, cached / after))
print()
print("cold ls of %s (%d lines; master restarted, page cache dropped; the CLI's start included): %d ms"
      % (lsdir, lsn, ls_ms))
PY
FINISHED=1
