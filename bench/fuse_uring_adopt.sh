#!/usr/bin/env bash
# The experiment behind fuse/uring.h's way out of its two gaps (bench/fuse_uring_adopt.cc): a FUSE
# server over io_uring whose entry buffers live in a memfd is killed with -9 while it holds a READ
# (it never answers that one); a successor takes its /dev/fuse descriptor and the memfd, maps the
# memfd at the same address, answers the request the entry holds and commits it itself. Prints the
# reader's result and one verdict line:
#   adopt: the held READ was answered by the successor (bytes right: yes|no) | never answered
#
#   bench/fuse_uring_adopt.sh
#
# Needs root and Linux >= 6.14; sets the fuse module's enable_uring to Y for the run and puts it back.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BIN=${GRANARY_BIN_DIR:-$ROOT/build/bin}
[ -x "$BIN/granary-fuse-uring-adopt" ] || { echo "fuse_uring_adopt: build first (bash scripts/build.sh)" >&2; exit 1; }
PARAM=/sys/module/fuse/parameters/enable_uring
[ -w "$PARAM" ] || { echo "fuse_uring_adopt: no writable $PARAM (Linux >= 6.14, root)" >&2; exit 1; }
WAS=$(cat "$PARAM")
WORK=$(mktemp -d /tmp/granary-adopt-XXXXXX)
PIDS=()
cleanup() {
  for p in "${PIDS[@]}"; do kill -9 "$p" 2>/dev/null || true; done
  if mountpoint -q "$WORK/mnt" 2>/dev/null; then
    # Abort the connection first: a reader still waiting (the experiment failed) ends with an error.
    conn=$(stat -c %d "$WORK/mnt" 2>/dev/null || true)
    mountpoint -q /sys/fs/fuse/connections || mount -t fusectl none /sys/fs/fuse/connections 2>/dev/null || true
    if [ -n "$conn" ] && [ -w "/sys/fs/fuse/connections/$conn/abort" ]; then
      echo 1 > "/sys/fs/fuse/connections/$conn/abort"
    fi
    umount -l "$WORK/mnt" 2>/dev/null || true
  fi
  for p in "${PIDS[@]}"; do wait "$p" 2>/dev/null || true; done
  echo "$WAS" > "$PARAM"
  rm -rf "$WORK"
}
trap cleanup EXIT INT TERM
echo Y > "$PARAM"
mkdir -p "$WORK/mnt"
"$BIN/granary-fuse-uring-adopt" serve "$WORK/mnt" > "$WORK/serve.out" 2> "$WORK/serve.err" & PIDS+=($!)
for _ in $(seq 1 100); do grep -q READY "$WORK/serve.out" && break; sleep 0.1; done
grep -q READY "$WORK/serve.out" || { cat "$WORK/serve.err"; exit 1; }
read -r _ pid fd shm < "$WORK/serve.out"
pid=${pid#pid=}; fd=${fd#fd=}; shm=${shm#shm=}
# The reader: a 4 KiB O_DIRECT pread at 1 MiB, which the server holds and never answers; then it
# closes the file (a FLUSH the successor must answer too).
python3 - "$WORK/mnt/big" > "$WORK/reader.out" 2>&1 <<'PY' &
import mmap, os, sys, time
fd = os.open(sys.argv[1], os.O_RDONLY | os.O_DIRECT)
buf = mmap.mmap(-1, 4096)
t = time.monotonic()
n = os.preadv(fd, [buf], 1 << 20)
right = n == 4096 and all(buf[i] == (((1 << 20) + i) * 131 + 7) & 0xff for i in range(4096))
print("reader: %d bytes after %.2f s, bytes right: %s" % (n, time.monotonic() - t, "yes" if right else "no"), flush=True)
os.close(fd)
print("closed", flush=True)
PY
READER=$!
for _ in $(seq 1 100); do grep -q stalling "$WORK/serve.err" && break; sleep 0.1; done
grep -q stalling "$WORK/serve.err" || { echo "the server never got the READ"; exit 1; }
"$BIN/granary-fuse-uring-adopt" adopt "$pid" "$fd" "$shm" "$WORK/mnt" > "$WORK/adopt.out" 2> "$WORK/adopt.err" & PIDS+=($!)
for _ in $(seq 1 100); do grep -q "^reader:" "$WORK/reader.out" && break; sleep 0.1; done
cat "$WORK/serve.err" "$WORK/adopt.err" >&2
if ! grep -q "^reader:" "$WORK/reader.out"; then
  echo "adopt: the held READ was never answered"
  exit 1
fi
for _ in $(seq 1 100); do grep -q "^closed" "$WORK/reader.out" && break; sleep 0.1; done
cat "$WORK/reader.out"
right=$(grep -o "bytes right: [a-z]*" "$WORK/reader.out" | cut -d' ' -f3)
closed=no; grep -q "^closed" "$WORK/reader.out" && closed=yes
echo "adopt: the held READ was answered by the successor (bytes right: ${right:-no}; the close after it answered: $closed)"
[ "$right" = yes ] && [ "$closed" = yes ]
