#!/usr/bin/env bash
# Cold random reads into a large file: the first pass of an LMDB or numpy.memmap loader, through a
# fresh `granary local` mount (nothing cached) against reading the under-storage's file directly,
# the page cache dropped on both sides, in one run. Range first (worker/block_source.h) is what
# this measures: a 4 KiB read into a cold 4 MiB block waits for 4 KiB, not 4 MiB.
#
#   bench/cold_random.sh [--large-mb N] [--ops N] [--threads T] [--patterns "pread mmap"] [--floor]
#                        [--compare "ARGS"] [--build DIR] [--work DIR] [--keep]
#
# --compare "ARGS" adds a column: the same Granary passes with ARGS added to `granary local`
# (e.g. "--fuse.source_reads false"), each pattern's two mounts one after the other.
#
# --floor adds a column: the same reads through the minimal FUSE server of bench/fuse_floor.cc
# serving the file by one pread per READ (`granary-fuse-floor serve --backing`), nothing cached —
# what any FUSE daemon that reads the under-storage itself reaches on this kernel.
#
# Rows: random 4 KiB preads, random 2 KiB mmap windows (granary-access-read, the same code on both
# sides, every byte verified on the mount). Prints a Markdown table with each row's ratio to direct.
# Everything it starts is stopped and unmounted on exit. Needs root (drop_caches).
set -euo pipefail
LARGE_MB=1024; OPS=4000; THREADS=8; PATTERNS="pread mmap"; BUILD=""; WORK=""; KEEP=0; FLOOR=0; COMPARE=""
while [ $# -gt 0 ]; do
  case "$1" in
    --large-mb) LARGE_MB=$2; shift 2;;
    --ops) OPS=$2; shift 2;;
    --threads) THREADS=$2; shift 2;;
    --patterns) PATTERNS=$2; shift 2;;
    --build) BUILD=$2; shift 2;;
    --work) WORK=$2; shift 2;;
    --keep) KEEP=1; shift;;
    --floor) FLOOR=1; shift;;
    --compare) COMPARE=$2; shift 2;;
    *) sed -n '2,20p' "$0" >&2; exit 2;;
  esac
done
[ -w /proc/sys/vm/drop_caches ] || { echo "error: needs root (drop_caches)" >&2; exit 1; }
source "$(dirname "$0")/lib.sh"
bench_setup granary-cold-random
[ -x "$BIN/granary-access-read" ] || { echo "error: $BIN/granary-access-read not found; build first" >&2; exit 1; }
DATA=$WORK/data; MNT=$WORK/mnt; FLOOR_MNT=$WORK/floor; FLOOR_PID=""
stop_floor() {
  if grep -q " $FLOOR_MNT " /proc/mounts 2>/dev/null; then fusermount3 -u "$FLOOR_MNT" 2>/dev/null || umount -l "$FLOOR_MNT" 2>/dev/null || true; fi
  if [ -n "$FLOOR_PID" ]; then kill "$FLOOR_PID" 2>/dev/null || true; wait "$FLOOR_PID" 2>/dev/null || true; fi
  FLOOR_PID=""
}
cleanup() { stop_local; stop_floor; [ "$KEEP" = 1 ] || rm -rf "$WORK"; }
trap cleanup EXIT INT TERM
drop_caches() { sync; echo 3 > /proc/sys/vm/drop_caches; }
# Waits (up to 60 s) until the worker of the `granary local` logging to $1 has no fill or fetch
# ahead in progress: its fetched-ahead count unchanged for a second. The second pass then sees what
# the first left in the cache, as a later epoch would.
settle() {
  python3 - "$1" <<'PY'
import re, sys, time, urllib.request
urls = re.findall(r"metrics on (http://[0-9.:]+/metrics)", open(sys.argv[1]).read())
def ahead():
    for u in urls:
        try:
            body = urllib.request.urlopen(u, timeout=5).read().decode()
        except OSError:
            continue
        m = re.search(r"^granary_worker_prefetched_blocks_total (\S+)", body, re.M)
        if m:
            return float(m.group(1))
    return None
last, since, end = ahead(), time.time(), time.time() + 60
while time.time() < end:
    time.sleep(0.25)
    now = ahead()
    if now != last:
        last, since = now, time.time()
    elif time.time() - since >= 1.0:
        break
PY
}

mkdir -p "$DATA/large" "$MNT"
[ -f "$DATA/large/big.bin" ] || head -c "$((LARGE_MB * 1024 * 1024))" /dev/urandom > "$DATA/large/big.bin"
declare -A SECS FLOORS OTHERS
if [ "$FLOOR" = 1 ]; then
  mkdir -p "$FLOOR_MNT"
  "$BIN/granary-fuse-floor" serve "$FLOOR_MNT" --backing "$DATA/large/big.bin" > "$WORK/floor.log" 2>&1 &
  FLOOR_PID=$!
  for _ in $(seq 200); do grep -q READY "$WORK/floor.log" && break; kill -0 "$FLOOR_PID" 2>/dev/null || break; sleep 0.05; done
  grep -q READY "$WORK/floor.log" || { echo "error: granary-fuse-floor did not mount:" >&2; cat "$WORK/floor.log" >&2; exit 1; }
fi
for p in $PATTERNS; do
  rs=4096; [ "$p" = mmap ] && rs=2048
  drop_caches
  direct=$("$BIN/granary-access-read" --pattern "$p" --file "$DATA/large/big.bin" --ops "$OPS" --read-size "$rs" --threads "$THREADS" --seed 11)
  # A fresh mount each time: nothing of the file is cached.
  rm -rf "$WORK/state-$p"
  start_local "$WORK/local-$p.log" "$DATA/large" "$MNT" --dir "$WORK/state-$p"
  drop_caches
  mounted=$("$BIN/granary-access-read" --pattern "$p" --file "$MNT/big.bin" --ops "$OPS" --read-size "$rs" --threads "$THREADS" --seed 11)
  # A second pass, other offsets, page cache dropped: what the first pass left in the cache.
  settle "$WORK/local-$p.log"
  drop_caches
  second=$("$BIN/granary-access-read" --pattern "$p" --file "$MNT/big.bin" --ops "$OPS" --read-size "$rs" --threads "$THREADS" --seed 13)
  drop_caches
  direct2=$("$BIN/granary-access-read" --pattern "$p" --file "$DATA/large/big.bin" --ops "$OPS" --read-size "$rs" --threads "$THREADS" --seed 13)
  # Every byte checked afterwards (the check reads the reference whole, which would warm the
  # under-storage's page cache before the timed pass).
  verified=$("$BIN/granary-access-read" --pattern "$p" --file "$MNT/big.bin" --ops "$OPS" --read-size "$rs" --threads "$THREADS" --seed 12 --verify "$DATA/large/big.bin" || true)
  stop_local
  if [ -n "$COMPARE" ]; then
    rm -rf "$WORK/state-$p-b"
    # shellcheck disable=SC2086
    start_local "$WORK/local-$p-b.log" "$DATA/large" "$MNT" --dir "$WORK/state-$p-b" $COMPARE
    drop_caches
    o1=$("$BIN/granary-access-read" --pattern "$p" --file "$MNT/big.bin" --ops "$OPS" --read-size "$rs" --threads "$THREADS" --seed 11)
    settle "$WORK/local-$p-b.log"
    drop_caches
    o2=$("$BIN/granary-access-read" --pattern "$p" --file "$MNT/big.bin" --ops "$OPS" --read-size "$rs" --threads "$THREADS" --seed 13)
    stop_local
    OTHERS[$p]=$(python3 -c 'import json,sys; print(json.loads(sys.argv[1])["seconds"], json.loads(sys.argv[2])["seconds"])' "$o1" "$o2")
  else
    OTHERS[$p]="0 0"
  fi
  if [ "$FLOOR" = 1 ]; then
    drop_caches
    f1=$("$BIN/granary-access-read" --pattern "$p" --file "$FLOOR_MNT/big" --ops "$OPS" --read-size "$rs" --threads "$THREADS" --seed 11)
    drop_caches
    f2=$("$BIN/granary-access-read" --pattern "$p" --file "$FLOOR_MNT/big" --ops "$OPS" --read-size "$rs" --threads "$THREADS" --seed 13)
    FLOORS[$p]=$(python3 -c 'import json,sys; print(json.loads(sys.argv[1])["seconds"], json.loads(sys.argv[2])["seconds"])' "$f1" "$f2")
  else
    FLOORS[$p]="0 0"
  fi
  SECS[$p]=$(python3 -c 'import json,sys; d=json.loads(sys.argv[1]); g=json.loads(sys.argv[2]); v=json.loads(sys.argv[3] or "{\"errors\": 1, \"mismatches\": 0}"); s=json.loads(sys.argv[4]); d2=json.loads(sys.argv[5]); print(d["seconds"], g["seconds"], g["errors"] + v["errors"] + v["mismatches"] + s["errors"], d2["seconds"], s["seconds"])' "$direct" "$mounted" "$verified" "$second" "$direct2")
done
echo "### $(date +%F) — $(nproc) cores, $(uname -sr), \`bench/cold_random.sh --large-mb $LARGE_MB --ops $OPS --threads $THREADS\`"
echo
head="| row | direct s | Granary s | × direct |"; rule="|---|---:|---:|---:|"
[ -n "$COMPARE" ] && { head="$head Granary with \`$COMPARE\` s | its × direct |"; rule="$rule---:|---:|"; }
[ "$FLOOR" = 1 ] && { head="$head minimal FUSE server (pread per READ) s | its × direct |"; rule="$rule---:|---:|"; }
echo "$head errors |"
echo "$rule---:|"
for p in $PATTERNS; do
  read -r d g e d2 g2 <<< "${SECS[$p]}"
  read -r f1 f2 <<< "${FLOORS[$p]}"
  read -r o1 o2 <<< "${OTHERS[$p]}"
  python3 -c 'import sys; p,d,g,e,d2,g2,f1,f2,fl,o1,o2,cmp=sys.argv[1:]; n={"pread": "4 KiB pread", "mmap": "2 KiB mmap windows"}[p]
for label, a, b, f, o in (("first pass (cold)", float(d), float(g), float(f1), float(o1)), ("second pass", float(d2), float(g2), float(f2), float(o2))):
    other = " %.2f | %.2f |" % (o, a / o if o else 0) if cmp else ""
    floor = " %.2f | %.2f |" % (f, a / f if f else 0) if fl == "1" else ""
    print("| random %s, page cache dropped, %s | %.2f | %.2f | %.2f |%s%s %s |" % (n, label, a, b, a / b if b else 0, other, floor, e))' "$p" "$d" "$g" "$e" "$d2" "$g2" "$f1" "$f2" "$FLOOR" "$o1" "$o2" "$COMPARE"
done
