#!/usr/bin/env bash
# Cold reads from S3 (Ceph RGW on loopback): Granary's mount beside `aws s3 cp` and s3fs reading
# the same objects in the same run. Small files (ImageNet-like) and large files (shards).
#
#   bench/s3_cold_read.sh [--small N] [--large N] [--large-mb MB] [--threads T] [--build DIR]
#
# Installs what it needs (Ceph RGW, awscli, s3fs), and stops every server and mount on exit.
set -euo pipefail
SMALL=1000; LARGE=3; LARGE_MB=128; THREADS=8; BUILD=""
while [ $# -gt 0 ]; do
  case "$1" in
    --small) SMALL=$2; shift 2;; --large) LARGE=$2; shift 2;; --large-mb) LARGE_MB=$2; shift 2;;
    --threads) THREADS=$2; shift 2;; --build) BUILD=$2; shift 2;;
    *) echo "usage: $0 [--small N] [--large N] [--large-mb MB] [--threads T] [--build DIR]" >&2; exit 2;;
  esac
done
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BIN=${BUILD:-$ROOT/build}/bin
bash "$ROOT/scripts/s3-server.sh" install
bash "$ROOT/scripts/apt-ensure.sh" awscli s3fs
WORK=$(mktemp -d /tmp/granary-s3bench-XXXXXX)
PIDS=(); MOUNTS=()
cleanup() {
  for m in "${MOUNTS[@]}"; do fusermount3 -u -z "$m" 2>/dev/null || umount -l "$m" 2>/dev/null || true; done
  for p in "${PIDS[@]}"; do kill -INT "$p" 2>/dev/null || true; done
  for p in "${PIDS[@]}"; do for _ in $(seq 100); do kill -0 "$p" 2>/dev/null || break; sleep 0.05; done; kill -9 "$p" 2>/dev/null || true; done
  bash "$ROOT/scripts/s3-server.sh" stop "$WORK/rgw" || true
  rm -rf "$WORK"
}
trap cleanup EXIT INT TERM
drop_caches() { sync; [ -w /proc/sys/vm/drop_caches ] && echo 3 > /proc/sys/vm/drop_caches || true; }

# Large files need room in the memstore OSD.
export S3_MEMSTORE_BYTES=$(( (SMALL * 200000 + LARGE * LARGE_MB * 1048576) * 2 + 1073741824 ))
read -r _ EP AK SK < <(bash "$ROOT/scripts/s3-server.sh" start "$WORK/rgw" | tail -1)
python3 "$ROOT/bench/gen_dataset.py" --out "$WORK/data/small" --files "$SMALL" --seed 42 >/dev/null
mkdir -p "$WORK/data/large"
for i in $(seq 1 "$LARGE"); do head -c $((LARGE_MB * 1048576)) /dev/urandom > "$WORK/data/large/shard-$i.tfrecord"; done
python3 - "$WORK/data" > "$WORK/spec.json" <<'PY'
import json, os, sys
root = sys.argv[1]
objs = [{"key": os.path.relpath(os.path.join(d, f), root), "file": os.path.join(d, f)}
        for d, _, fs in os.walk(root) for f in fs]
print(json.dumps({"bucket": "bench", "objects": objs}))
PY
/usr/bin/python3 "$ROOT/tests/integration/s3_put.py" "$EP" "$AK" "$SK" "$WORK/spec.json" >/dev/null

export AWS_ACCESS_KEY_ID=$AK AWS_SECRET_ACCESS_KEY=$SK AWS_ENDPOINT_URL=$EP AWS_DEFAULT_REGION=us-east-1
json_run() {  # label, seconds, files, bytes -> one JSON line like granary-train-read's
  python3 -c 'import json,sys; l,s,f,b=sys.argv[1:]; s=float(s); print(json.dumps({"label":l,"files":int(f),"bytes":int(b),"seconds":s,"files_per_s":int(f)/s,"mb_per_s":int(b)/s/1e6,"p50_ms":0,"p99_ms":0,"errors":0}))' "$@"
}
RESULTS=()
for set in small large; do
  files=$(find "$WORK/data/$set" -type f | wc -l); bytes=$(du -sb "$WORK/data/$set" | cut -f1)
  # aws s3 cp: the command-line baseline (its own parallelism)
  drop_caches; rm -rf "$WORK/cp"; t0=$(date +%s.%N)
  env -u AWS_CA_BUNDLE aws s3 cp --quiet --recursive "s3://bench/$set" "$WORK/cp" --endpoint-url "$EP"
  t1=$(date +%s.%N); RESULTS+=("$(json_run "$set: aws s3 cp --recursive" "$(python3 -c "print($t1 - $t0)")" "$files" "$bytes")")
  rm -rf "$WORK/cp"
  # s3fs, no cache
  mkdir -p "$WORK/s3fs"; echo "$AK:$SK" > "$WORK/passwd"; chmod 600 "$WORK/passwd"
  s3fs bench "$WORK/s3fs" -o passwd_file="$WORK/passwd" -o url="$EP" -o use_path_request_style
  MOUNTS+=("$WORK/s3fs")
  for _ in $(seq 100); do grep -q " $WORK/s3fs " /proc/mounts && break; sleep 0.05; done
  drop_caches
  RESULTS+=("$("$BIN/granary-train-read" --root "$WORK/s3fs/$set" --threads "$THREADS" --seed 1 --label "$set: s3fs (no cache)")")
  fusermount3 -u "$WORK/s3fs"
  # granary, cold then warm
  mkdir -p "$WORK/g-$set"
  GRANARY_HOME=$WORK/home-$set "$BIN/granary" local "s3://bench/$set" "$WORK/g-$set" --dir "$WORK/state-$set" \
    > "$WORK/granary-$set.log" 2>&1 &
  PIDS+=($!); MOUNTS+=("$WORK/g-$set")
  for _ in $(seq 400); do grep -q " $WORK/g-$set " /proc/mounts && break; sleep 0.05; done
  drop_caches
  RESULTS+=("$("$BIN/granary-train-read" --root "$WORK/g-$set" --threads "$THREADS" --seed 2 --label "$set: granary, cold")")
  RESULTS+=("$("$BIN/granary-train-read" --root "$WORK/g-$set" --threads "$THREADS" --seed 3 --label "$set: granary, warm")")
done
python3 - "${RESULTS[@]}" <<'PY'
import json, sys
rows = [json.loads(x) for x in sys.argv[1:]]
print("| reader (S3 on loopback, cold unless marked) | files | MB | seconds | files/s | MB/s |")
print("|---|---:|---:|---:|---:|---:|")
for r in rows:
    print("| %s | %d | %.0f | %.2f | %.0f | %.1f |" % (r["label"], r["files"], r["bytes"] / 1e6, r["seconds"],
                                                       r["files_per_s"], r["mb_per_s"]))
if any(r["errors"] for r in rows):
    print("ERRORS in: " + ", ".join(r["label"] for r in rows if r["errors"])); sys.exit(1)
PY
