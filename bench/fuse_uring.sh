#!/usr/bin/env bash
# Does FUSE over io_uring lower the floor of a FUSE request on this kernel? One minimal server
# (bench/fuse_uring_floor.cc, no libfuse) mounted twice: answering over /dev/fuse (read and writev,
# 8 threads, as libfuse's multi-threaded loop does) and over io_uring (one ring per CPU, 8 entries
# each, FUSE_IO_URING_CMD_COMMIT_AND_FETCH), and libfuse's minimal server (bench/fuse_floor.cc) for
# reference. The probe of bench/fuse_floor.sh times an ioctl, a forced GETATTR and O_DIRECT READs
# of 4 KiB and 128 KiB, with 1 and 8 threads, --rounds times in alternating order; the table shows
# medians and the ratio io_uring ÷ /dev/fuse (below 1: io_uring is faster).
#
#   bench/fuse_uring.sh [--seconds S] [--rounds N]
#
# Needs root, Linux >= 6.14 with the fuse module's enable_uring parameter: the script sets it to Y
# for the run and puts back what it was. Exits 3 (skipped) when the kernel has no FUSE io_uring.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BIN=${GRANARY_BIN_DIR:-$ROOT/build/bin}
SECONDS_PER=2; ROUNDS=3; CMDLINE="bench/fuse_uring.sh${*:+ $*}"
while [ $# -gt 0 ]; do
  case $1 in
    --seconds) SECONDS_PER=$2; shift 2;;
    --rounds) ROUNDS=$2; shift 2;;
    *) echo "usage: bench/fuse_uring.sh [--seconds S] [--rounds N]" >&2; exit 2;;
  esac
done
for b in granary-fuse-floor granary-fuse-uring-floor; do
  [ -x "$BIN/$b" ] || { echo "fuse_uring: $BIN/$b is missing: build first (liburing-dev installed)" >&2; exit 1; }
done
PARAM=/sys/module/fuse/parameters/enable_uring
[ -e "$PARAM" ] || { echo "fuse_uring: skipped: this kernel has no FUSE over io_uring ($PARAM)" >&2; exit 3; }
WAS=$(cat "$PARAM")

WORK=$(mktemp -d /tmp/granary-uring-XXXXXX)
PIDS=()
cleanup() {
  for m in "$WORK/dev" "$WORK/uring" "$WORK/libfuse"; do
    mountpoint -q "$m" 2>/dev/null && { umount -l "$m" 2>/dev/null || true; }
  done
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${PIDS[@]}"; do wait "$p" 2>/dev/null || true; done
  echo "$WAS" > "$PARAM" 2>/dev/null || true
  rm -rf "$WORK"
}
trap cleanup EXIT INT TERM
echo Y > "$PARAM"

wait_ready() {  # LOG PID
  for _ in $(seq 1 300); do
    grep -q READY "$1" && return 0
    kill -0 "$2" 2>/dev/null || return 1
    sleep 0.1
  done
  return 1
}
mkdir -p "$WORK/dev" "$WORK/uring" "$WORK/libfuse"
for t in dev uring; do
  "$BIN/granary-fuse-uring-floor" "$WORK/$t" --transport "$t" > "$WORK/$t.log" 2>&1 & PIDS+=($!)
  wait_ready "$WORK/$t.log" "$!" || { echo "fuse_uring: the $t server did not start:" >&2; cat "$WORK/$t.log" >&2; exit 1; }
done
"$BIN/granary-fuse-floor" serve "$WORK/libfuse" > "$WORK/libfuse.log" 2>&1 & PIDS+=($!)
wait_ready "$WORK/libfuse.log" "$!" || { cat "$WORK/libfuse.log" >&2; exit 1; }

RESULTS=$WORK/results.jsonl; : > "$RESULTS"
source "$ROOT/bench/floor_probe.sh"
probe_rounds "$RESULTS" "$ROUNDS" "$SECONDS_PER" "$WORK" dev uring libfuse

PYTHONPATH=$ROOT/bench python3 - "$RESULTS" "$CMDLINE" <<'PY'
import sys
from floor_stats import NAMES, OPS, Results, heading
res = Results(sys.argv[1])
print(heading())
print("Command: `%s`. Round trip mean / p50 in µs, medians over %d rounds; ratios: medians of the rounds' "
      "ratios. Probe errors: %d.\n" % (sys.argv[2], res.rounds, res.errors))
print("| request | threads | libfuse minimal | same server, /dev/fuse | same server, io_uring | io_uring ÷ /dev/fuse (mean) | (p50) |")
print("|---|---:|---:|---:|---:|---:|---:|")
for op in OPS:
    for t in (1, 8):
        l, d, u = res.median("libfuse", op, t), res.median("dev", op, t), res.median("uring", op, t)
        print("| %s | %d | %.1f / %.1f | %.1f / %.1f | %.1f / %.1f | %.2f | %.2f |" % (
            NAMES[op], t, l["mean_us"], l["p50_us"], d["mean_us"], d["p50_us"], u["mean_us"], u["p50_us"],
            res.ratio("uring", "dev", op, t, "mean_us"), res.ratio("uring", "dev", op, t, "p50_us")))
PY
