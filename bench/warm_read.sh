#!/usr/bin/env bash
# Warm reads through the mount against the same files on local ext4, in one run, in every read
# mode (fuse.open: kernel, passthrough, daemon). The cache tier is on disk (SSD level on ext4), so
# the "page cache dropped" rows read from the medium on both sides.
#
# Rows (each side runs the same reader, bench/access_read.cc or the Python loop below):
#   small files, page cache warm    ImageNet-like files read whole, shuffled, T threads (compiled, Python)
#   small files, page cache dropped the same after `echo 3 > /proc/sys/vm/drop_caches` on both sides
#   large file, sequential          1 MiB reads of one big file, page cache dropped
#   random pread                    4 KiB preads at random offsets of the big file, page cache dropped
#   random mmap windows             2 KiB windows copied out of an mmap of the big file (numpy.memmap,
#                                   LMDB), page cache dropped
# and, per mode, the page cache one pass over everything takes (from /proc/meminfo) against
# ext4's, beside the bytes the tier holds: what each mode costs in memory.
#
# A mode written MODE-nowrites (kernel-nowrites) runs it with `fuse.writes: false` (no OPEN in the
# kernel mode). A mode written MODE-uring (kernel-uring, daemon-uring) runs that mode with `fuse.transport: uring`
# (FUSE over io_uring; the fuse module's enable_uring is set to Y for the run and put back).
#
#   bench/warm_read.sh [--files N] [--large-mb N] [--threads T] [--ops N] [--modes "kernel passthrough daemon"]
#                      [--build DIR] [--work DIR] [--keep]
#
# Prints a Markdown table with each mode's ratio to ext4. Everything it starts is stopped and
# unmounted on exit, also on failure or Ctrl-C. Needs root (drop_caches; passthrough).
set -euo pipefail
FILES=3000; LARGE_MB=512; THREADS=8; OPS=20000; MODES="kernel passthrough daemon"; BUILD=""; WORK=""; KEEP=0
while [ $# -gt 0 ]; do
  case "$1" in
    --files) FILES=$2; shift 2;;
    --large-mb) LARGE_MB=$2; shift 2;;
    --threads) THREADS=$2; shift 2;;
    --ops) OPS=$2; shift 2;;
    --modes) MODES=$2; shift 2;;
    --build) BUILD=$2; shift 2;;
    --work) WORK=$2; shift 2;;
    --keep) KEEP=1; shift;;
    *) echo "usage: $0 [--files N] [--large-mb N] [--threads T] [--ops N] [--modes LIST] [--build DIR] [--work DIR] [--keep]" >&2; exit 2;;
  esac
done
for m in $MODES; do b=${m%-nowrites}; case "${b%-uring}" in kernel|passthrough|daemon) ;; *) echo "error: unknown mode $m" >&2; exit 2;; esac; done
URING_PARAM=/sys/module/fuse/parameters/enable_uring
URING_WAS=$(cat "$URING_PARAM" 2>/dev/null || echo N)
[ -w /proc/sys/vm/drop_caches ] || { echo "error: needs root (drop_caches)" >&2; exit 1; }
source "$(dirname "$0")/lib.sh"
bench_setup granary-warm
[ -x "$BIN/granary-access-read" ] || { echo "error: $BIN/granary-access-read not found; build first" >&2; exit 1; }
DATA=$WORK/data; MNT=$WORK/mnt; OUT=$WORK/results.jsonl
cleanup() {
  stop_local
  [ -w "$URING_PARAM" ] && echo "$URING_WAS" > "$URING_PARAM"
  [ "$KEEP" = 1 ] || rm -rf "$WORK"
}
trap cleanup EXIT INT TERM
drop_caches() { sync; echo 3 > /proc/sys/vm/drop_caches; }
cached_kb() { awk '/^Cached:/ {print $2}' /proc/meminfo; }

mkdir -p "$DATA/large" "$MNT"
[ -f "$DATA/large/big.bin" ] || head -c "$((LARGE_MB * 1024 * 1024))" /dev/urandom > "$DATA/large/big.bin"
[ -d "$DATA/small" ] || python3 "$ROOT/bench/gen_dataset.py" --out "$DATA/small" --files "$FILES" --seed 42 >/dev/null
: > "$OUT"

PYREAD='
import concurrent.futures, json, os, random, sys, time
root, threads, label = sys.argv[1], int(sys.argv[2]), sys.argv[3]
files = sorted(os.path.join(d, f) for d, _, fs in os.walk(root) for f in fs)
random.Random(7).shuffle(files)
def one(p):
    with open(p, "rb") as f:
        return len(f.read())
epochs = 3
t = time.monotonic()
total = 0
with concurrent.futures.ThreadPoolExecutor(threads) as ex:
    for _ in range(epochs):
        total += sum(ex.map(one, files))
s = time.monotonic() - t
n = len(files) * epochs
print(json.dumps({"label": label, "pattern": "pyfiles", "ops": n, "bytes": total, "seconds": s,
                  "ops_per_s": n / s, "mb_per_s": total / s / 1e6, "errors": 0, "mismatches": 0}))
'
# side ROW SMALL_ROOT BIG_FILE: every row against one tree; appends JSON lines with "side" and "row".
rows() {
  local side=$1 small=$2 big=$3 ref_small=$4 ref_big=$5
  emit() { python3 -c 'import json,sys; d=json.loads(sys.argv[3]); d["side"]=sys.argv[1]; d["row"]=sys.argv[2]; print(json.dumps(d))' "$side" "$1" "$2" >> "$OUT"; }
  # Warm page cache: one pass to fill it, then the measured pass.
  "$BIN/granary-access-read" --pattern files --root "$small" --threads "$THREADS" --epochs 2 --verify "$ref_small" >/dev/null
  emit small_warm_c "$("$BIN/granary-access-read" --pattern files --root "$small" --threads "$THREADS" --seed 3 --epochs 5)"
  python3 -c "$PYREAD" "$small" "$THREADS" py >/dev/null
  emit small_warm_py "$(python3 -c "$PYREAD" "$small" "$THREADS" py)"
  drop_caches
  emit small_cold_c "$("$BIN/granary-access-read" --pattern files --root "$small" --threads "$THREADS" --seed 4)"
  drop_caches
  emit large_seq "$("$BIN/granary-access-read" --pattern seq --file "$big")"
  # Timed without --verify (it reads the reference copy first, which would warm ext4's side);
  # the bytes are checked by a run of their own afterwards.
  drop_caches
  emit pread_4k "$("$BIN/granary-access-read" --pattern pread --file "$big" --threads "$THREADS" --ops "$OPS")"
  drop_caches
  emit mmap_2k "$("$BIN/granary-access-read" --pattern mmap --file "$big" --threads "$THREADS" --ops "$OPS")"
  "$BIN/granary-access-read" --pattern pread --file "$big" --threads "$THREADS" --ops 2000 --seed 9 --verify "$ref_big" >/dev/null
  "$BIN/granary-access-read" --pattern mmap --file "$big" --threads "$THREADS" --ops 2000 --seed 9 --verify "$ref_big" >/dev/null
  # Memory: page cache after one pass over everything.
  drop_caches
  local before after
  before=$(cached_kb)
  "$BIN/granary-access-read" --pattern files --root "$small" --threads "$THREADS" >/dev/null
  "$BIN/granary-access-read" --pattern seq --file "$big" >/dev/null
  after=$(cached_kb)
  echo "{\"side\":\"$side\",\"row\":\"page_cache_mb\",\"mb\":$(( (after - before) / 1024 ))}" >> "$OUT"
}

rows ext4 "$DATA/small" "$DATA/large/big.bin" "$DATA/small" "$DATA/large/big.bin"

QUOTA=$(( ($(du -sb "$DATA" | cut -f1)) * 2 ))
for mode in $MODES; do
  transport=dev
  writes=true  # MODE-nowrites: fuse.writes false (the kernel mode's open-free reads, no writes)
  base=${mode%-nowrites}; [ "$base" != "$mode" ] && writes=false
  if [ "$base" != "${base%-uring}" ]; then
    transport=uring
    echo Y > "$URING_PARAM" || { echo "error: cannot set $URING_PARAM (Linux >= 6.14)" >&2; exit 1; }
  fi
  cat > "$WORK/granary.yaml" <<YAML
worker:
  tieredstore:
    levels:
      - {mediumtype: SSD, path: $WORK/tier-$mode, quota: $QUOTA}
fuse:
  open: ${base%-uring}
  transport: $transport
  writes: $writes
YAML
  start_local "$WORK/local-$mode.log" "file://$DATA" "$MNT" --dir "$WORK/state-$mode" --config "$WORK/granary.yaml"
  "$BIN/granary" load "/$(basename "$DATA")" >/dev/null  # every block into the tier
  rows "$mode" "$MNT/small" "$MNT/large/big.bin" "$DATA/small" "$DATA/large/big.bin"
  TIER_MB=$("$BIN/granary" report --json | python3 -c 'import json,sys; r=json.load(sys.stdin); print(sum(w["used_bytes"] for w in r["workers"]) // 1000000)')
  echo "{\"side\":\"$mode\",\"row\":\"tier_mb\",\"mb\":$TIER_MB}" >> "$OUT"
  grep -h "read mode\|io_uring" "$WORK/local-$mode.log" | tail -2 >&2 || true
  stop_local
  rm -rf "$WORK/tier-$mode" "$WORK/state-$mode"
done

python3 - "$OUT" "$MODES" "$THREADS" "$FILES" "$LARGE_MB" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
modes = sys.argv[2].split(); threads, files, large = sys.argv[3], sys.argv[4], sys.argv[5]
get = {(r["side"], r["row"]): r for r in rows}
spec = [("small_warm_c", "%s small files, page cache warm, compiled reader (files/s)" % files, "ops_per_s", 0.85),
        ("small_warm_py", "%s small files, page cache warm, Python reader (files/s)" % files, "ops_per_s", 0.7),
        ("small_cold_c", "%s small files, page cache dropped (files/s)" % files, "ops_per_s", 0.6),
        ("large_seq", "%s MB file, sequential 1 MiB reads, page cache dropped (MB/s)" % large, "mb_per_s", 0.8),
        ("pread_4k", "random 4 KiB pread, page cache dropped (reads/s)", "ops_per_s", 0.6),
        ("mmap_2k", "random 2 KiB mmap windows, page cache dropped (reads/s)", "ops_per_s", 0.6)]
print()
print("| workload (%s threads) | ext4 | %s | target |" % (threads, " | ".join(modes)))
print("|---|---:|" + "---:|" * len(modes) + "---:|")
bad = []
for key, label, field, target in spec:
    base = get[("ext4", key)][field]
    cells = []
    for m in modes:
        r = get[(m, key)]
        if r["errors"] or r["mismatches"]: bad.append("%s %s" % (m, key))
        cells.append("%.0f (**%.2f**)" % (r[field], r[field] / base))
    print("| %s | %.0f | %s | >= %.2f |" % (label, base, " | ".join(cells), target))
print("| page cache after one pass over everything (MB) | %d | %s | |" % (
    get[("ext4", "page_cache_mb")]["mb"], " | ".join("%d" % get[(m, "page_cache_mb")]["mb"] for m in modes)))
print("| bytes in the tier (MB) | - | %s | |" % " | ".join("%d" % get[(m, "tier_mb")]["mb"] for m in modes))
if bad:
    print("ERRORS or wrong bytes in: " + ", ".join(bad)); sys.exit(1)
PY
