#!/usr/bin/env bash
# Warm-up throughput (issue 8's targets), in one run: a node (network namespace) reaches an S3
# server (Ceph RGW in its own namespace) over a link capped at RATE, and warms an ImageNet-like
# dataset three ways:
#   direct   every object fetched straight from S3 by 16 threads (boto3): what the link gives
#   load     `granary load /images` (the worker fetches blocks in parallel, --parallel P)
#   cat      after `granary free`, every file read through the mount with `cat`, one at a time
#            (what warming by reading looks like)
# Prints a Markdown table: MB/s of each, load against direct (target >= 0.9) and against cat
# (target >= 2). Bytes sent by the storage host are counted on its interface for each phase.
#
#   bench/warmup.sh [--rate 200mbit] [--files N] [--parallel P] [--build DIR] [--keep]
#
# Everything it starts is stopped, unmounted and removed on exit, also on failure or Ctrl-C.
set -euo pipefail
RATE=200mbit; FILES=2000; PARALLEL=16; BUILD=""; KEEP=0; WORK=""
while [ $# -gt 0 ]; do
  case "$1" in
    --rate) RATE=$2; shift 2;; --files) FILES=$2; shift 2;; --parallel) PARALLEL=$2; shift 2;;
    --build) BUILD=$2; shift 2;; --keep) KEEP=1; shift;;
    *) sed -n '2,14p' "$0" >&2; exit 2;;
  esac
done
source "$(dirname "$0")/lib.sh"
bench_setup granary-warmup
export NETNS_PREFIX=grw NETNS_SUBNET=10.235.0
NET="$ROOT/scripts/netns.sh"
MNT=$WORK/mnt
AK=GRANARYTESTKEY000000; SK='granary/test+secret0000000000000000000000'
export AWS_ACCESS_KEY_ID=$AK AWS_SECRET_ACCESS_KEY=$SK
bash "$ROOT/scripts/s3-server.sh" install >/dev/null

cleanup() {
  set +e
  stop_local
  ip netns exec grw-storage bash "$ROOT/scripts/s3-server.sh" stop "$WORK/rgw" >/dev/null 2>&1
  bash "$NET" down >/dev/null 2>&1
  [ "$KEEP" = 1 ] || rm -rf "$WORK"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

node() { nsenter --net=/run/netns/grw-n1 "$@"; }  # the node's network, this mount namespace
storage_tx() { ip netns exec grw-storage cat /sys/class/net/eth0/statistics/tx_bytes; }
now() { date +%s.%N; }
drop_caches() { sync; echo 3 > /proc/sys/vm/drop_caches 2>/dev/null || true; }

bash "$NET" up 1 "$RATE" >&2
export S3_MEMSTORE_BYTES=$(( FILES * 400000 + 1073741824 ))
read -r _ EP _ _ < <(S3_BIND=$NETNS_SUBNET.1 ip netns exec grw-storage bash "$ROOT/scripts/s3-server.sh" start "$WORK/rgw" | tail -1)
python3 "$ROOT/bench/gen_dataset.py" --out "$WORK/src/images" --files "$FILES" --seed 42 >&2
python3 - "$WORK/src" > "$WORK/spec.json" <<'PY'
import json, os, sys
root = sys.argv[1]
print(json.dumps({"bucket": "warm", "objects": [{"key": os.path.relpath(os.path.join(d, f), root), "file": os.path.join(d, f)}
                                               for d, _, fs in os.walk(root) for f in fs]}))
PY
node /usr/bin/python3 "$ROOT/tests/integration/s3_put.py" "$EP" "$AK" "$SK" "$WORK/spec.json" >/dev/null
BYTES=$(du -sb --apparent-size "$WORK/src/images" | cut -f1)
echo "warmup: $FILES files, $BYTES bytes, storage $EP capped at $RATE" >&2

# direct: the link's practical rate for this dataset
tx0=$(storage_tx); t0=$(now)
node /usr/bin/python3 - "$EP" "$AK" "$SK" <<'PY'
import sys
from concurrent.futures import ThreadPoolExecutor
import boto3
from botocore.config import Config
ep, ak, sk = sys.argv[1:4]
s3 = boto3.client("s3", endpoint_url=ep, aws_access_key_id=ak, aws_secret_access_key=sk, region_name="us-east-1",
                  config=Config(s3={"addressing_style": "path"}, max_pool_connections=16))
keys = [o["Key"] for page in s3.get_paginator("list_objects_v2").paginate(Bucket="warm") for o in page.get("Contents", [])]
with ThreadPoolExecutor(16) as pool:
    list(pool.map(lambda k: s3.get_object(Bucket="warm", Key=k)["Body"].read(), keys))
PY
t1=$(now); tx1=$(storage_tx)
DIRECT_S=$(python3 -c "print($t1 - $t0)"); DIRECT_TX=$((tx1 - tx0))

# granary: every daemon on the node, the bucket mounted at /images
mkdir -p "$MNT"
cat > "$WORK/granary.yaml" <<YAML
worker:
  cache_quota: $((BYTES * 2))
fuse:
  keep_cache: false
YAML
LOCAL_LOG=$WORK/local.log
# nsenter execs granary, so LOCAL_PID is granary itself and stop_local's SIGINT reaches it.
nsenter --net=/run/netns/grw-n1 "$BIN/granary" local "s3://warm/images" "$MNT" --name /images --dir "$WORK/state" --config "$WORK/granary.yaml" \
  -o "endpoint=$EP" > "$LOCAL_LOG" 2>&1 &
LOCAL_PID=$!
for _ in $(seq 600); do grep -q " $MNT " /proc/mounts && break; kill -0 "$LOCAL_PID" 2>/dev/null || break; sleep 0.05; done
grep -q " $MNT " /proc/mounts || { echo "error: granary local did not mount:" >&2; cat "$LOCAL_LOG" >&2; exit 1; }
node "$BIN/granary" load /images --metadata-only >/dev/null  # listing is not warm-up: both contenders get it

tx0=$(storage_tx); t0=$(now)
node "$BIN/granary" load /images --parallel "$PARALLEL" --json > "$WORK/load.json"
t1=$(now); tx1=$(storage_tx)
LOAD_S=$(python3 -c "print($t1 - $t0)"); LOAD_TX=$((tx1 - tx0))
python3 -c 'import json,sys; j=json.load(open(sys.argv[1])); assert j["state"]=="succeeded", j; assert j["files_failed"]==0' "$WORK/load.json"

node "$BIN/granary" free /images >/dev/null
drop_caches
tx0=$(storage_tx); t0=$(now)
find "$MNT" -type f -print0 | sort -z | xargs -0 -n 1 cat > /dev/null
t1=$(now); tx1=$(storage_tx)
CAT_S=$(python3 -c "print($t1 - $t0)"); CAT_TX=$((tx1 - tx0))

python3 - "$BYTES" "$FILES" "$RATE" "$DIRECT_S" "$DIRECT_TX" "$LOAD_S" "$LOAD_TX" "$CAT_S" "$CAT_TX" "bench/warmup.sh${*:+ $*}" <<'PY'
import sys
b, files, rate = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
d_s, d_tx, l_s, l_tx, c_s, c_tx = float(sys.argv[4]), int(sys.argv[5]), float(sys.argv[6]), int(sys.argv[7]), float(sys.argv[8]), int(sys.argv[9])
mb = lambda s: b / s / 1e6
print(f"`{sys.argv[10]}`: {files} files, {b/1e6:.0f} MB, storage link capped at {rate}\n")
print("| warm-up | seconds | MB/s | storage bytes / dataset | ratio |")
print("|---|---|---|---|---|")
print(f"| direct S3 GETs, 16 threads (the link) | {d_s:.1f} | {mb(d_s):.1f} | {d_tx/b:.2f} | 1.00 |")
print(f"| `granary load` | {l_s:.1f} | {mb(l_s):.1f} | {l_tx/b:.2f} | **{d_s/l_s:.2f}x the link** (target >= 0.9) |")
print(f"| `cat` of every file through the mount | {c_s:.1f} | {mb(c_s):.1f} | {c_tx/b:.2f} | load is **{c_s/l_s:.2f}x faster** (target >= 2) |")
PY
