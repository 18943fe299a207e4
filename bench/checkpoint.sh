#!/usr/bin/env bash
# Checkpoints written through Granary (mount option write=through and write=back) against the
# same bytes written to local disk and uploaded straight to the store with the SDK, in one run, on
# the rig's capped link (scripts/netns.sh: a node and an S3 server, Ceph RGW, in network
# namespaces; the node's uplink and the store's link capped at RATE).
#
#   bench/checkpoint.sh [--size-mb 2048] [--rate 400mbit]
#
# The checkpoint is what torch.save of a state dict writes (bench/checkpoint_io.py: incompressible
# bytes in 1 MiB sequential writes, then close). Timed: open to close returned. Reported:
#   local     the file on local disk (the page cache; torch.save does not fsync)
#   direct    that file uploaded with boto3's multipart transfer (16 MiB parts, 8 in flight)
#   through   write=through: close returns once the object is whole in the store
#   back      write=back: close returns once the bytes are staged on the node's disk; then the
#             upload in the background, timed from close to the object being in the store
# and the ratios the issue names: through / direct upload (target >= 0.9), back's close / local
# disk (>= 0.8), back's upload / direct upload (>= 0.9). Every object is read back and checked.
# Last line: `through <x>x direct, back close <y>x local, back upload <z>x direct`.
# Everything it starts is stopped on exit or Ctrl-C.
set -euo pipefail
SIZE_MB=2048; RATE=400mbit
while [ $# -gt 0 ]; do
  case "$1" in
    --size-mb) SIZE_MB=$2; shift 2;; --rate) RATE=$2; shift 2;;
    *) sed -n '2,20p' "$0" >&2; exit 2;;
  esac
done
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BIN=$ROOT/build/bin
NET="$ROOT/scripts/netns.sh"
IO="$ROOT/bench/checkpoint_io.py"
bash "$ROOT/scripts/s3-server.sh" install >/dev/null
WORK=$(mktemp -d /var/tmp/granary-ckpt-XXXXXX)
AK=GRANARYTESTKEY000000; SK='granary/test+secret0000000000000000000000'
export AWS_ACCESS_KEY_ID=$AK AWS_SECRET_ACCESS_KEY=$SK
HOST=""; PIDS=()
cleanup() {
  set +e
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null; done
  if [ -n "$HOST" ]; then
    for m in $(nsenter -t "$HOST" -m awk -v w="$WORK" '$2 ~ "^"w {print $2}' /proc/mounts 2>/dev/null); do
      nsenter -t "$HOST" -m umount -l "$m" 2>/dev/null
    done
  fi
  for p in "${PIDS[@]}"; do wait "$p" 2>/dev/null; done
  ip netns exec grp-storage bash "$ROOT/scripts/s3-server.sh" stop "$WORK/rgw" >/dev/null 2>&1
  bash "$NET" down
  rm -rf "$WORK"
}
trap cleanup EXIT
trap 'exit 130' INT TERM
on() { nsenter -t "$HOST" -m -n "$@"; }  # run on the node (its mount and network namespaces)
field() { python3 -c 'import json,sys; print(json.loads(sys.stdin.read().strip().splitlines()[-1])[sys.argv[1]])' "$1"; }

NETNS_CAP_UPLINK=1 bash "$NET" up 1 "$RATE" >&2
ip netns exec grp-n1 unshare --mount --propagation private sleep infinity &
PIDS+=($!); HOST=$!
for _ in $(seq 100); do [ "$(readlink /proc/$HOST/ns/mnt)" != "$(readlink /proc/self/ns/mnt)" ] && break; sleep 0.05; done
HOST=$(pgrep -P "$HOST" sleep || echo "$HOST")
export S3_MEMSTORE_BYTES=$(( SIZE_MB * 4 * 1048576 + 1073741824 ))
read -r _ EP _ _ < <(S3_BIND=10.233.0.1 ip netns exec grp-storage bash "$ROOT/scripts/s3-server.sh" start "$WORK/rgw" | tail -1)
echo "checkpoint: ${SIZE_MB} MiB, store $EP, links capped at $RATE" >&2
echo '{"bucket": "ckpt", "objects": []}' > "$WORK/spec.json"
on /usr/bin/python3 "$ROOT/tests/integration/s3_put.py" "$EP" "$AK" "$SK" "$WORK/spec.json" >/dev/null
BYTES=$(( SIZE_MB * 1048576 ))

# Local disk, then the same file uploaded with the SDK.
mkdir -p "$WORK/local"
sync
LOCAL=$(python3 "$IO" write "$WORK/local/ckpt.pt" "$SIZE_MB")
LOCAL_S=$(echo "$LOCAL" | field seconds); WANT=$(echo "$LOCAL" | field sha256)
sync
DIRECT_S=$(on /usr/bin/python3 "$IO" upload "$EP" ckpt direct/ckpt.pt "$WORK/local/ckpt.pt" | field seconds)
echo "local ${LOCAL_S}s, direct upload ${DIRECT_S}s" >&2
rm -f "$WORK/local/ckpt.pt"

# Granary on the node: master, worker, FUSE; the bucket's two prefixes mounted writable.
rm -f "$WORK/master.addr" "$WORK/w.addr"
on "$BIN/granary-master" --master.listen 10.233.0.2:0 --master.data_dir "$WORK/master" --rpc.allow_unauthenticated true \
  --ready-file "$WORK/master.addr" > "$WORK/master.log" 2>&1 &
PIDS+=($!)
for _ in $(seq 200); do [ -s "$WORK/master.addr" ] && break; sleep 0.05; done
MADDR=$(cat "$WORK/master.addr")
on "$BIN/granary-worker" --master.address "$MADDR" --worker.listen 10.233.0.2:0 --worker.cache_dir "$WORK/cache" \
  --worker.cache_quota $(( SIZE_MB * 3 ))Mi --rpc.allow_unauthenticated true --ready-file "$WORK/w.addr" > "$WORK/worker.log" 2>&1 &
PIDS+=($!)
for _ in $(seq 200); do [ -s "$WORK/w.addr" ] && break; sleep 0.05; done
on "$BIN/granary" --master "$MADDR" mount /through s3://ckpt/through -o endpoint="$EP" -o write=through >&2
on "$BIN/granary" --master "$MADDR" mount /back s3://ckpt/back -o endpoint="$EP" -o write=back >&2
mkdir -p "$WORK/mnt"
on "$BIN/granary-fuse" --master.address "$MADDR" --fuse.worker "$(cat "$WORK/w.addr")" --fuse.mountpoint "$WORK/mnt" \
  --ready-file "$WORK/fuse.addr" > "$WORK/fuse.log" 2>&1 &
PIDS+=($!)
for _ in $(seq 200); do [ -s "$WORK/fuse.addr" ] && break; sleep 0.05; done

# write=back first, on a quiet node (after an upload the worker caches the file's blocks in the
# background, which would share the two cores with the next writer).
sync
BACK=$(on /usr/bin/python3 "$IO" write "$WORK/mnt/back/ckpt.pt" "$SIZE_MB")
BACK_S=$(echo "$BACK" | field seconds)
UPLOAD_S=$(on /usr/bin/python3 "$IO" wait "$EP" ckpt back/ckpt.pt "$BYTES" 600 | field seconds)
sync
THROUGH=$(on /usr/bin/python3 "$IO" write "$WORK/mnt/through/ckpt.pt" "$SIZE_MB")
THROUGH_S=$(echo "$THROUGH" | field seconds)
echo "through ${THROUGH_S}s, back close ${BACK_S}s then upload ${UPLOAD_S}s" >&2

BAD=0
for k in direct/ckpt.pt through/ckpt.pt back/ckpt.pt; do
  got=$(on /usr/bin/python3 "$IO" sha "$EP" ckpt "$k")
  [ "$got" = "$WANT" ] || { echo "WRONG BYTES in $k" >&2; BAD=$((BAD + 1)); }
done

python3 - "$SIZE_MB" "$RATE" "$LOCAL_S" "$DIRECT_S" "$THROUGH_S" "$BACK_S" "$UPLOAD_S" "$BAD" <<'PY'
import sys
mb, rate = int(sys.argv[1]), sys.argv[2]
local, direct, through, back, upload = map(float, sys.argv[3:8])
bad = int(sys.argv[8])
mbs = lambda s: mb * 1.048576 / s
print(f"| {mb} MiB checkpoint, links at {rate} | seconds | MB/s | ratio | target |")
print("|---|---:|---:|---:|---|")
print(f"| local disk (close returned) | {local:.2f} | {mbs(local):.0f} | | |")
print(f"| direct upload (boto3, 16 MiB parts x 8) | {direct:.2f} | {mbs(direct):.0f} | | |")
print(f"| write=through (close returned: in the store) | {through:.2f} | {mbs(through):.0f} | {direct / through:.2f}x direct | >= 0.9 |")
print(f"| write=back (close returned: staged) | {back:.2f} | {mbs(back):.0f} | {local / back:.2f}x local | >= 0.8 |")
print(f"| write=back upload (after close) | {upload:.2f} | {mbs(upload):.0f} | {direct / upload:.2f}x direct | >= 0.9 |")
print(f"wrong objects: {bad}")
print(f"through {direct / through:.2f}x direct, back close {local / back:.2f}x local, back upload {direct / upload:.2f}x direct")
sys.exit(1 if bad else 0)
PY
