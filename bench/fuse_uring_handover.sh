#!/usr/bin/env bash
# Can a FUSE connection served over io_uring be handed to a successor after its server is killed,
# as granary-fuse's hand-over does over /dev/fuse (fuse/handover.h)? The minimal server of
# bench/fuse_uring.sh, one transport at a time: a keeper process holds a copy of the /dev/fuse
# descriptor (pidfd_getfd), a reader issues forced GETATTRs in a loop, the server is killed with -9,
# and a successor takes the descriptor from the keeper, sends FUSE_NOTIFY_RESEND (the kernel sends
# again what the dead server had taken and not answered), registers its own queues and serves.
# Prints one line per transport: whether the reader finished, its errors, and its slowest round
# trip. A reader stuck past the deadline is freed by aborting the connection (fusectl).
#
#   bench/fuse_uring_handover.sh [--seconds S]
#
# Needs root, Linux >= 6.14 (fuse's enable_uring: set to Y for the run, then put back).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BIN=${GRANARY_BIN_DIR:-$ROOT/build/bin}
SECS=8
[ "${1:-}" = --seconds ] && SECS=$2
PARAM=/sys/module/fuse/parameters/enable_uring
[ -e "$PARAM" ] || { echo "fuse_uring_handover: skipped: no FUSE over io_uring on this kernel" >&2; exit 3; }
WAS=$(cat "$PARAM")
WORK=$(mktemp -d /tmp/granary-uring-ho-XXXXXX)
CTL_MOUNTED=0
PIDS=()
cleanup() {
  for p in "${PIDS[@]}"; do kill -9 "$p" 2>/dev/null || true; done
  mountpoint -q "$WORK/m" 2>/dev/null && umount -l "$WORK/m" 2>/dev/null || true
  [ "$CTL_MOUNTED" = 1 ] && umount /sys/fs/fuse/connections 2>/dev/null || true
  echo "$WAS" > "$PARAM" 2>/dev/null || true
  rm -rf "$WORK"
}
trap cleanup EXIT INT TERM
echo Y > "$PARAM"
cat > "$WORK/keeper.py" <<'PY'
import ctypes, os, signal, sys
libc = ctypes.CDLL(None, use_errno=True)
pidfd = libc.syscall(434, int(sys.argv[1]), 0)           # pidfd_open
fd = libc.syscall(438, pidfd, int(sys.argv[2]), 0)       # pidfd_getfd
if fd < 0:
    sys.exit("pidfd_getfd: errno %d" % ctypes.get_errno())
print("KEEP %d" % fd, flush=True)
signal.pause()
PY
wait_for() {  # FILE PATTERN
  for _ in $(seq 1 200); do grep -q "$2" "$1" 2>/dev/null && return 0; sleep 0.05; done
  return 1
}
for t in dev uring; do
  mkdir -p "$WORK/m"
  "$BIN/granary-fuse-uring-floor" "$WORK/m" --transport "$t" > "$WORK/a.log" 2>&1 & A=$!; PIDS+=($A)
  wait_for "$WORK/a.log" READY || { cat "$WORK/a.log" >&2; exit 1; }
  fd=$(sed -n 's/.*fd=\([0-9]*\).*/\1/p' "$WORK/a.log")
  python3 "$WORK/keeper.py" "$A" "$fd" > "$WORK/k.log" 2>&1 & K=$!; PIDS+=($K)
  wait_for "$WORK/k.log" KEEP || { cat "$WORK/k.log" >&2; exit 1; }
  kfd=$(awk '/KEEP/{print $2}' "$WORK/k.log")
  "$BIN/granary-fuse-floor" probe --file "$WORK/m/small" --op getattr --threads 4 --seconds "$SECS" > "$WORK/probe.json" 2>&1 &
  P=$!; PIDS+=($P)
  sleep 2
  kill -9 "$A"
  "$BIN/granary-fuse-uring-floor" "$WORK/m" --transport "$t" --adopt-pid "$K" --adopt-fd "$kfd" > "$WORK/b.log" 2>&1 &
  B=$!; PIDS+=($B)
  finished=no
  for _ in $(seq 1 $(( (SECS + 20) * 10 ))); do kill -0 "$P" 2>/dev/null || { finished=yes; break; }; sleep 0.1; done
  if [ "$finished" = no ]; then
    # Stuck in the kernel (uninterruptible): only ending the connection frees the reader.
    mountpoint -q /sys/fs/fuse/connections || { mount -t fusectl none /sys/fs/fuse/connections && CTL_MOUNTED=1; }
    echo 1 > "/sys/fs/fuse/connections/$(stat -c %d "$WORK/m")/abort" || true
  fi
  wait "$P" 2>/dev/null || true
  python3 - "$t" "$finished" "$WORK/probe.json" <<'PY'
import json, sys
t, finished, path = sys.argv[1:]
try:
    r = json.loads(open(path).read().strip().splitlines()[-1])
    detail = "errors %d, p99 %.0f µs, %d round trips" % (r["errors"], r["p99_us"], r["ops"])
except Exception:
    detail = "no result"
print("%-5s  reader finished: %-3s  %s" % (t, finished, detail))
PY
  kill "$B" "$K" 2>/dev/null || true
  wait "$B" "$K" 2>/dev/null || true
  mountpoint -q "$WORK/m" && umount -l "$WORK/m" || true
  PIDS=()
done
