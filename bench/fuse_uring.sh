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
for round in $(seq "$ROUNDS"); do
  order="dev uring libfuse"; [ $((round % 2)) = 0 ] && order="libfuse uring dev"
  for op in ioctl getattr read4k read128k; do
    file=small; case $op in read*) file=big;; esac
    for t in 1 8; do
      for srv in $order; do
        line=$("$BIN/granary-fuse-floor" probe --file "$WORK/$srv/$file" --op "$op" --threads "$t" --seconds "$SECONDS_PER")
        echo "{\"server\": \"$srv\", \"round\": $round, ${line#\{}" | tee -a "$RESULTS" >&2
      done
    done
  done
done

python3 - "$RESULTS" "$CMDLINE" <<'PY'
import datetime, json, os, platform, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
errors = sum(r["errors"] for r in rows)
runs = {}
for r in rows:
    runs.setdefault((r["server"], r["op"], r["threads"]), {})[r["round"]] = r
med = statistics.median
by = {k: {f: med(x[f] for x in v.values()) for f in ("mean_us", "p50_us", "ops_per_s")} for k, v in runs.items()}
def ratio(op, t, field):
    u, d = runs[("uring", op, t)], runs[("dev", op, t)]
    return med(u[r][field] / d[r][field] for r in u if r in d)
names = {"ioctl": "ioctl (TCGETS)", "getattr": "GETATTR (statx, forced)", "read4k": "READ 4 KiB (O_DIRECT)",
         "read128k": "READ 128 KiB (O_DIRECT)"}
print("### %s — %d cores, %s %s\n" % (datetime.date.today(), os.cpu_count(), platform.system(), platform.release()))
print("Command: `%s`. Round trip mean / p50 in µs, medians over %d rounds; ratios: medians of the rounds' "
      "ratios. Probe errors: %d.\n" % (sys.argv[2], len({r["round"] for r in rows}), errors))
print("| request | threads | libfuse minimal | same server, /dev/fuse | same server, io_uring | io_uring ÷ /dev/fuse (mean) | (p50) |")
print("|---|---:|---:|---:|---:|---:|---:|")
for op in ("ioctl", "getattr", "read4k", "read128k"):
    for t in (1, 8):
        l, d, u = by[("libfuse", op, t)], by[("dev", op, t)], by[("uring", op, t)]
        print("| %s | %d | %.1f / %.1f | %.1f / %.1f | %.1f / %.1f | %.2f | %.2f |" % (
            names[op], t, l["mean_us"], l["p50_us"], d["mean_us"], d["p50_us"], u["mean_us"], u["p50_us"],
            ratio(op, t, "mean_us"), ratio(op, t, "p50_us")))
PY
