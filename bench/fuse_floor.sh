#!/usr/bin/env bash
# The floor of a FUSE request on this kernel, and how far granary-fuse is above it.
#
# A minimal low-level libfuse server that answers from memory (bench/fuse_floor.cc, its session loop
# multi-threaded as granary-fuse's is, and single-threaded for reference) is mounted beside
# `granary local` over a local directory holding the same two files (4 KiB and 64 MiB), warm in
# Granary's cache, so that only the FUSE request path is measured. granary-fuse runs in kernel mode
# (`--fuse.open kernel`): READs the page cache cannot answer reach it. (At default settings this
# dataset gets passthrough, whose READs never reach granary-fuse: the kernel reads the cache file.) For each
# request kind — an ioctl (TCGETS, as CPython's open() sends), a GETATTR the attribute cache cannot
# answer (statx AT_STATX_FORCE_SYNC), and 4 KiB and 128 KiB READs the page cache cannot answer
# (O_DIRECT) — with 1 and 8 threads, it prints the round trip's mean and p50 on each server and
# granary-fuse's ratio to the minimal server's. The target: granary-fuse ≤ 1.2× for each.
#
# With --uring (Linux >= 6.14; the fuse module's enable_uring is set to Y for the run and restored)
# a second `granary local` serves the same files with `--fuse.transport uring`, and the minimal
# server of bench/fuse_uring_floor.cc runs over io_uring beside them: the table gains granary-fuse
# over io_uring, divided by the minimal server on /dev/fuse (the target's denominator) and by the
# minimal server over io_uring (the floor of that transport).
#
# Each probe runs --rounds times (3), the servers' probes back to back in alternating order
# (this machine's noise moves a 2-second probe by ±30%); the table shows the medians, and the ratio
# column the median of the rounds' ratios, each taken from two probes a few seconds apart.
#
#   bench/fuse_floor.sh [--seconds S] [--rounds N] [--uring] [--no-docs]
#
# Writes the table into docs/benchmarks.md between the fuse-floor markers unless --no-docs.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BIN=${GRANARY_BIN_DIR:-$ROOT/build/bin}
SECONDS_PER=3; ROUNDS=3; DOCS=1; URING=0; CMDLINE="bench/fuse_floor.sh${*:+ $*}"
while [ $# -gt 0 ]; do
  case $1 in
    --seconds) SECONDS_PER=$2; shift 2;;
    --rounds) ROUNDS=$2; shift 2;;
    --no-docs) DOCS=0; shift;;
    --uring) URING=1; shift;;
    *) echo "usage: bench/fuse_floor.sh [--seconds S] [--rounds N] [--uring] [--no-docs]" >&2; exit 2;;
  esac
done
NEED=(granary granary-fuse-floor); [ "$URING" = 1 ] && NEED+=(granary-fuse-uring-floor)
for b in "${NEED[@]}"; do
  [ -x "$BIN/$b" ] || { echo "fuse_floor: $BIN/$b is missing: build first (bash scripts/build.sh)" >&2; exit 1; }
done

WORK=$(mktemp -d /tmp/granary-floor-XXXXXX)
PIDS=()
URING_PARAM=/sys/module/fuse/parameters/enable_uring
URING_WAS=$(cat "$URING_PARAM" 2>/dev/null || echo N)
cleanup() {
  for m in "$WORK/floor" "$WORK/floor1" "$WORK/granary" "$WORK/granary-uring" "$WORK/floor-uring"; do
    mountpoint -q "$m" 2>/dev/null && { fusermount3 -u "$m" 2>/dev/null || umount -l "$m" 2>/dev/null || true; }
  done
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${PIDS[@]}"; do wait "$p" 2>/dev/null || true; done
  [ "$URING" = 1 ] && echo "$URING_WAS" > "$URING_PARAM" 2>/dev/null
  rm -rf "$WORK"
}
trap cleanup EXIT INT TERM

wait_mounted() {  # MOUNTPOINT PID
  for _ in $(seq 1 300); do
    mountpoint -q "$1" && return 0
    kill -0 "$2" 2>/dev/null || return 1
    sleep 0.1
  done
  return 1
}

mkdir -p "$WORK/src" "$WORK/floor" "$WORK/floor1" "$WORK/granary" "$WORK/granary-uring" "$WORK/floor-uring"
head -c 4096 /dev/urandom > "$WORK/src/small"
head -c $((64 << 20)) /dev/urandom > "$WORK/src/big"

"$BIN/granary-fuse-floor" serve "$WORK/floor" > "$WORK/floor.log" 2>&1 & PIDS+=($!)
wait_mounted "$WORK/floor" "$!" || { cat "$WORK/floor.log"; exit 1; }
"$BIN/granary-fuse-floor" serve "$WORK/floor1" --single > "$WORK/floor1.log" 2>&1 & PIDS+=($!)
wait_mounted "$WORK/floor1" "$!" || { cat "$WORK/floor1.log"; exit 1; }
# Two instances side by side (--uring): every port chosen by the OS.
PORTS=(--master.listen 127.0.0.1:0 --worker.listen 127.0.0.1:0 --master.metrics_listen off
       --worker.metrics_listen off --fuse.metrics_listen off)
start_granary() {  # NAME EXTRA...
  local name=$1; shift
  GRANARY_HOME=$WORK/home-$name "$BIN/granary" local "$WORK/src" "$WORK/$name" --dir "$WORK/state-$name" \
    --fuse.open kernel "${PORTS[@]}" "$@" > "$WORK/$name.log" 2>&1 &
  PIDS+=($!)
  wait_mounted "$WORK/$name" "$!" || { cat "$WORK/$name.log"; exit 1; }
  # Warm: both files in Granary's cache (the worker's), so every READ is a cache hit there.
  cat "$WORK/$name/small" "$WORK/$name/big" > /dev/null
}
start_granary granary
SERVERS=(floor floor1:1 granary)
if [ "$URING" = 1 ]; then
  echo Y > "$URING_PARAM" || { echo "fuse_floor: cannot set $URING_PARAM (Linux >= 6.14, root)" >&2; exit 1; }
  start_granary granary-uring --fuse.transport uring
  grep -q "requests come through io_uring" "$WORK/granary-uring.log" ||
    { echo "fuse_floor: granary-fuse did not start its io_uring queues:" >&2; cat "$WORK/granary-uring.log" >&2; exit 1; }
  "$BIN/granary-fuse-uring-floor" "$WORK/floor-uring" --transport uring --file-mb 64 > "$WORK/floor-uring.log" 2>&1 &
  PIDS+=($!)
  for _ in $(seq 1 300); do grep -q READY "$WORK/floor-uring.log" && break; sleep 0.1; done
  grep -q READY "$WORK/floor-uring.log" || { cat "$WORK/floor-uring.log"; exit 1; }
  SERVERS+=(granary-uring floor-uring)
fi

RESULTS=$WORK/results.jsonl; : > "$RESULTS"
source "$ROOT/bench/floor_probe.sh"
probe_rounds "$RESULTS" "$ROUNDS" "$SECONDS_PER" "$WORK" "${SERVERS[@]}"

TABLE=$(PYTHONPATH=$ROOT/bench python3 - "$RESULTS" "$CMDLINE" <<'PY'
import sys
from floor_stats import NAMES, OPS, Results, heading
res = Results(sys.argv[1])
print(heading())
print("Command: `%s`. Mean and p50 round trip in µs, medians over %d rounds (the servers' probes back to "
      "back, in alternating order); the ratios are the medians of the rounds' ratios. The minimal server's "
      "session loop is multi-threaded as granary-fuse's is (single-threaded in its own column, 1 thread only); "
      "granary-fuse in kernel mode, the files warm in its worker's cache.\n" % (sys.argv[2], res.rounds))
print("| request | threads | minimal server mean / p50 | minimal, single-threaded loop mean / p50 | granary-fuse mean / p50 | granary-fuse ÷ minimal (mean) | (p50) |")
print("|---|---:|---:|---:|---:|---:|---:|")
for op in OPS:
    for t in (1, 8):
        f, g, s = res.median("floor", op, t), res.median("granary", op, t), res.median("floor1", op, t)
        single = "%.1f / %.1f" % (s["mean_us"], s["p50_us"]) if s else "-"
        print("| %s | %d | %.1f / %.1f | %s | %.1f / %.1f | %.2f | %.2f |" % (
            NAMES[op], t, f["mean_us"], f["p50_us"], single, g["mean_us"], g["p50_us"],
            res.ratio("granary", "floor", op, t, "mean_us"), res.ratio("granary", "floor", op, t, "p50_us")))
if res.median("granary-uring", "ioctl", 1):
    print("\nOver io_uring (`--fuse.transport uring`; the minimal server of bench/fuse_uring_floor.cc over "
          "io_uring beside it):\n")
    print("| request | threads | minimal server over io_uring mean / p50 | granary-fuse over io_uring mean / p50 | "
          "÷ minimal on /dev/fuse (mean) | (p50) | ÷ minimal over io_uring (mean) |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for op in OPS:
        for t in (1, 8):
            u, g = res.median("floor-uring", op, t), res.median("granary-uring", op, t)
            print("| %s | %d | %.1f / %.1f | %.1f / %.1f | %.2f | %.2f | %.2f |" % (
                NAMES[op], t, u["mean_us"], u["p50_us"], g["mean_us"], g["p50_us"],
                res.ratio("granary-uring", "floor", op, t, "mean_us"),
                res.ratio("granary-uring", "floor", op, t, "p50_us"),
                res.ratio("granary-uring", "floor-uring", op, t, "mean_us")))
PY
)
echo "$TABLE"
if [ "$DOCS" = 1 ]; then
  python3 - "$ROOT/docs/benchmarks.md" "$TABLE" <<'PY'
import sys
path, table = sys.argv[1], sys.argv[2]
doc = open(path).read()
begin, end = "<!-- fuse-floor:begin -->", "<!-- fuse-floor:end -->"
if begin in doc and end in doc:
    doc = doc[:doc.index(begin) + len(begin)] + "\n" + table + "\n" + doc[doc.index(end):]
else:
    doc += "\n" + begin + "\n" + table + "\n" + end + "\n"
open(path, "w").write(doc)
PY
fi
