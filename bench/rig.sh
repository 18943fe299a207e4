#!/usr/bin/env bash
# The training-read experiment in miniature: N nodes (network namespaces) share one capped link to
# an S3 server (Ceph RGW in its own namespace). Every node reads the dataset each epoch in a new
# shuffled order (granary-train-read). Systems side by side, 1 node and N nodes:
#   local disk (the limit), s3fs (no cache), rclone mount --vfs-cache-mode full, Granary (one
#   master, a worker and a FUSE mount per node).
# For each epoch: the slowest node's time, files/s and MB/s per node, p50/p99, and the bytes the
# storage host sent (counted on its capped interface, not by the systems themselves).
#
#   bench/rig.sh [--quick] [--nodes N] [--rate 400mbit] [--images N] [--shards N] [--shard-mb M]
#                [--epochs E] [--procs P] [--threads T] [--systems "local s3fs rclone granary"] [--no-docs]
#                [--latency-ms MS] [--granary-opts "-o k=v ..."] [--perf DIR]
#
# --latency-ms puts the store MS ms away: every response of the S3 server is held MS ms by a
# user-space delay line (bench/delay_line.py; this kernel has no netem), as a store in another zone.
#
# --perf DIR records every epoch with `perf record -a -g` (499 Hz, the whole machine) into
# DIR/<system>-<dataset>-<nodes>n-e<epoch>.data, for bench/perf_stages.py's table of where each
# role's CPU went (the epoch's times and CPU figures then include perf's own cost). RIG_PERF_ARGS
# replaces perf's options (default "-a -g -F 499"; e.g. "-a --call-graph dwarf,16384 -F 199" for
# user stacks through libraries built without frame pointers). RIG_KEEP_LOGS=DIR copies the S3
# server's logs (RGW's has one line per request: method, object, range, latency) and the Granary
# daemons' logs to DIR at the end, and the master's and workers' /metrics after every epoch.
# RIG_FUSE_ARGS adds flags to every granary-fuse (e.g. "--fuse.readahead_blocks 4"), RIG_WORKER_ARGS
# to every granary-worker (e.g. "--worker.trust_own_writes 0s").
# RIG_TMP=DIR holds the run's files (the caches, the generated dataset) instead of /tmp: to compare
# the filesystem the tiers are on (docs/benchmarks.md, session 37). RIG_DIRECT_INFLIGHT=N gives the
# direct C client N GETs in flight instead of 64 (docs/benchmarks.md, session 40: the store's CPU
# against the epoch's length).
#
# Systems: local, s3fs, rclone, granary (defaults), direct (every object fetched by one C client,
# `curl --parallel` with 64 GETs in flight, bench/direct_get.py: the floor of a cold epoch on this
# machine; its CPU is printed as the system's), direct-py (the same with Python's boto3 and 64
# threads, bench/s3_get_all.py: the rig's old "direct"), granary-no-ahead (the
# dataset mounted with -o cache.fetch_ahead=false), and granary-no-elastic (the dataset mounted
# with -o cache.elastic=false: each node keeps only its replicas and reads the rest from peers),
# and fuse-floor (one node: the rig's local copy of the dataset served by the minimal FUSE server
# of bench/fuse_floor.cc --mirror, as granary-fuse's kernel mode serves a warm tier: every epoch
# is warm, the page cache dropped; its CPU per GB is the floor of Granary's warm epochs), and
# granary-passthrough (granary-fuse with --fuse.open passthrough: what fuse.open=auto chooses for a
# dataset larger than half the node's memory, which the rig's dropped page cache stands for; at
# the rig's size auto chooses kernel mode).
# For Granary each epoch's line also has rpc_calls_per_file: the gRPC calls the master and the
# workers received, by method, per file read (from granary_{master,worker}_rpc_calls_total).
# Writes WORK/results.jsonl, prints a Markdown table, writes docs/img/rig.png and the table into
# docs/benchmarks.md (between the rig markers) unless --no-docs. Everything it starts is torn down on exit or Ctrl-C.
set -euo pipefail
LATENCY_MS=0; GRANARY_OPTS=""; PERF_DIR=""; NODES=4; RATE=400mbit; IMAGES=2000; SHARDS=4; SHARD_MB=56; EPOCHS=2; PROCS=2; THREADS=4
SYSTEMS="local s3fs rclone granary"; QUICK=0; DOCS=1; CMDLINE="bench/rig.sh${*:+ $*}"
while [ $# -gt 0 ]; do
  case "$1" in
    --quick) QUICK=1; IMAGES=300; SHARDS=2; SHARD_MB=16; shift;;
    --nodes) NODES=$2; shift 2;; --rate) RATE=$2; shift 2;; --images) IMAGES=$2; shift 2;;
    --shards) SHARDS=$2; shift 2;; --shard-mb) SHARD_MB=$2; shift 2;; --epochs) EPOCHS=$2; shift 2;;
    --procs) PROCS=$2; shift 2;; --threads) THREADS=$2; shift 2;; --systems) SYSTEMS=$2; shift 2;;
    --no-docs) DOCS=0; shift;;
    --latency-ms) LATENCY_MS=$2; shift 2;; --granary-opts) GRANARY_OPTS=$2; shift 2;;
    --perf) PERF_DIR=$(mkdir -p "$2" && cd "$2" && pwd); shift 2;;
    *) sed -n '2,16p' "$0" >&2; exit 2;;
  esac
done
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BIN=$ROOT/build/bin
NET="$ROOT/scripts/netns.sh"
bash "$ROOT/scripts/s3-server.sh" install
bash "$ROOT/scripts/apt-ensure.sh" s3fs rclone python3-matplotlib
WORK=$(mktemp -d "${RIG_TMP:-/tmp}/granary-rig-XXXXXX")
declare -A HOST  # node -> pid of its namespace host process
AK=GRANARYTESTKEY000000; SK='granary/test+secret0000000000000000000000'
export AWS_ACCESS_KEY_ID=$AK AWS_SECRET_ACCESS_KEY=$SK

DELAY_PID=""
cleanup() {
  set +e
  [ -n "$DELAY_PID" ] && kill "$DELAY_PID" 2>/dev/null
  for n in "${!HOST[@]}"; do
    for m in $(nsenter -t "${HOST[$n]}" -m awk -v w="$WORK" '$2 ~ "^"w {print $2}' /proc/mounts 2>/dev/null); do
      nsenter -t "${HOST[$n]}" -m umount -l "$m" 2>/dev/null
    done
  done
  bash "$NET" down
  [ -n "${RIG_KEEP_LOGS:-}" ] && mkdir -p "$RIG_KEEP_LOGS" && cp -r "$WORK"/rgw/log "$WORK"/*.log "$RIG_KEEP_LOGS"/ 2>/dev/null
  rm -rf "$WORK"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

is_direct() { [ "$1" = direct ] || [ "$1" = direct-py ]; }
one_node_only() { [ "$1" = local ] || [ "$1" = fuse-floor ] || is_direct "$1"; }
on() { local n=$1; shift; nsenter -t "${HOST[$n]}" -m -n "$@"; }  # run on node n (mount + net ns)
storage_tx() { ip netns exec grp-storage cat /sys/class/net/eth0/statistics/tx_bytes; }
drop_caches() { sync; echo 3 > /proc/sys/vm/drop_caches 2>/dev/null || true; }

bash "$NET" up "$NODES" "$RATE"
for n in $(seq 1 "$NODES"); do
  ip netns exec "grp-n$n" unshare --mount --propagation private sleep infinity &
  HOST[$n]=$!
done
# wait until each host process has entered its namespaces
for n in $(seq 1 "$NODES"); do
  for _ in $(seq 100); do [ "$(readlink /proc/${HOST[$n]}/ns/mnt)" != "$(readlink /proc/self/ns/mnt)" ] && break; sleep 0.05; done
  HOST[$n]=$(pgrep -P "${HOST[$n]}" sleep || echo "${HOST[$n]}")
done
export S3_MEMSTORE_BYTES=$(( (IMAGES * 200000 + SHARDS * SHARD_MB * 1100000) * 2 + 1073741824 ))
read -r _ EP _ _ < <(S3_BIND=10.233.0.1 ip netns exec grp-storage bash "$ROOT/scripts/s3-server.sh" start "$WORK/rgw" | tail -1)
echo "rig: $NODES nodes, storage $EP capped at $RATE" >&2
UPLOAD_EP=$EP
if [ "$LATENCY_MS" != 0 ]; then
  rm -f "$WORK/delay.addr"
  ip netns exec grp-storage python3 "$ROOT/bench/delay_line.py" --listen 10.233.0.1:0 --to "${EP#http://}" \
    --delay-ms "$LATENCY_MS" --ready-file "$WORK/delay.addr" &
  DELAY_PID=$!
  for _ in $(seq 200); do [ -s "$WORK/delay.addr" ] && break; sleep 0.05; done
  EP="http://$(cat "$WORK/delay.addr")"
  echo "rig: readers reach the storage through a ${LATENCY_MS} ms delay line at $EP" >&2
fi
export RIG_LATENCY_MS=$LATENCY_MS

python3 "$ROOT/bench/gen_dataset.py" --out "$WORK/src/images" --files "$IMAGES" --seed 42 >&2
python3 "$ROOT/bench/gen_dataset.py" --out "$WORK/src/shards" --shards "$SHARDS" --shard-mb "$SHARD_MB" --seed 43 >&2
python3 - "$WORK/src" > "$WORK/spec.json" <<'PY'
import json, os, sys
root = sys.argv[1]
print(json.dumps({"bucket": "rig", "objects": [{"key": os.path.relpath(os.path.join(d, f), root), "file": os.path.join(d, f)}
                                              for d, _, fs in os.walk(root) for f in fs]}))
PY
on 1 /usr/bin/python3 "$ROOT/tests/integration/s3_put.py" "$UPLOAD_EP" "$AK" "$SK" "$WORK/spec.json" >/dev/null

RESULTS=$WORK/results.jsonl; : > "$RESULTS"
# CPU time the whole machine spent busy (every node, the storage server, the readers), in ticks:
# on a machine shared by all the nodes, the epoch's cost in CPU, beside its wall time.
cpu_busy() { awk '/^cpu /{print $2 + $3 + $4 + $7 + $8 + $9}' /proc/stat; }
# run_epochs SYSTEM DATASET MODE NODES: all nodes read together, epoch by epoch. On several nodes,
# one more warm epoch follows with the nodes reading one at a time ("alone": its time is the
# slowest node's): the time a node takes when it does not share this machine's cores with the
# other nodes' readers and daemons, as on a real cluster (the peers it reads from still run).
run_epochs() {
  local sys=$1 ds=$2 mode=$3 nn=$4
  local last=$EPOCHS; [ "$nn" -gt 1 ] && ! one_node_only "$sys" && last=$((EPOCHS + 1))
  is_direct "$sys" && last=1  # nothing is cached: every pass is the first
  for e in $(seq 1 "$last"); do
    local alone=0 alone_failed=0; [ "$e" -gt "$EPOCHS" ] && alone=1
    if [ "$e" -gt 1 ] && is_granary "$sys"; then
      # A warm epoch reads blocks written long ago, as the next epoch of a real job does: past the
      # worker's worker.trust_own_writes (10 s), within which a block's reads skip its checksum.
      local since=$(( $(date +%s) - ${epoch_end:-0} ))
      [ "$since" -lt 11 ] && sleep $(( 11 - since ))
    fi
    drop_caches
    python3 "$ROOT/bench/proc_cpu.py" snap "$WORK/cpu.snap"
    is_granary "$sys" && rpc_calls "$nn" > "$WORK/calls.before"
    local perf_pid=""
    if [ -n "$PERF_DIR" ]; then
      perf record ${RIG_PERF_ARGS:--a -g -F 499} -o "$PERF_DIR/$sys-$ds-${nn}n-e$e.data" > "$PERF_DIR/$sys-$ds-${nn}n-e$e.log" 2>&1 &
      perf_pid=$!
      for _ in $(seq 100); do [ -s "$PERF_DIR/$sys-$ds-${nn}n-e$e.data" ] && break; sleep 0.05; done  # recording
    fi
    local before; before=$(storage_tx); local cpu0; cpu0=$(cpu_busy); local pids=()
    for n in $(seq 1 "$nn"); do
      local root="$WORK/mnt/$n/$ds"; [ "$sys" = local ] && root="$WORK/src/$ds"
      if [ "$sys" = direct ]; then
        # The store read directly by one C client, 64 GETs in flight, nothing kept: the cold epoch's floor.
        on "$n" /usr/bin/python3 "$ROOT/bench/direct_get.py" "$EP" rig "$ds/" ${RIG_DIRECT_INFLIGHT:-64} "$WORK/spec.json" > "$WORK/out.$n" &
      elif [ "$sys" = direct-py ]; then
        on "$n" /usr/bin/python3 "$ROOT/bench/s3_get_all.py" "$EP" rig "$ds/" 64 > "$WORK/out.$n" &
      elif [ "$sys" = local ]; then
        "$BIN/granary-train-read" --root "$root" --mode "$mode" --processes "$PROCS" --threads "$THREADS" \
          --seed "$e" --verify "$WORK/src/$ds" --verify-sample 20 --label "$n" > "$WORK/out.$n" &
      else
        on "$n" "$BIN/granary-train-read" --root "$root" --mode "$mode" --processes "$PROCS" --threads "$THREADS" \
          --seed "$((e * 100 + n))" --verify "$WORK/src/$ds" --verify-sample 20 --label "$n" > "$WORK/out.$n" &
      fi
      if [ "$alone" = 1 ]; then wait "$!" || alone_failed=1; else pids+=($!); fi
    done
    local failed=$alone_failed; for p in "${pids[@]}"; do wait "$p" || failed=1; done
    local after; after=$(storage_tx); local cpu1; cpu1=$(cpu_busy); epoch_end=$(date +%s)
    if [ -n "$perf_pid" ]; then kill -INT "$perf_pid"; wait "$perf_pid" || true; fi
    local roles; roles=$(python3 "$ROOT/bench/proc_cpu.py" diff "$WORK/cpu.snap")
    local calls="{}"
    if is_granary "$sys"; then
      rpc_calls "$nn" > "$WORK/calls.after"
      if [ -n "${RIG_KEEP_LOGS:-}" ]; then  # every daemon's metrics after the epoch
        mkdir -p "$RIG_KEEP_LOGS"
        on 1 curl -s --max-time 5 http://127.0.0.1:19996/metrics > "$RIG_KEEP_LOGS/$sys-$ds-${nn}n-e$e-master.metrics" || true
        for n in $(seq 1 "$nn"); do
          on "$n" curl -s --max-time 5 http://127.0.0.1:29996/metrics > "$RIG_KEEP_LOGS/$sys-$ds-${nn}n-e$e-worker$n.metrics" || true
        done
      fi
      calls=$(python3 - "$WORK/calls.before" "$WORK/calls.after" <<'PY'
import json, sys
a, b = (json.load(open(f)) for f in sys.argv[1:3])
print(json.dumps({k: v - a.get(k, 0) for k, v in sorted(b.items()) if v - a.get(k, 0) > 0}))
PY
)
    fi
    python3 - "$sys" "$ds" "$nn" "$e" "$((after - before))" "$failed" "$((cpu1 - cpu0))" "$alone" "$roles" "$calls" $(for n in $(seq 1 "$nn"); do echo "$WORK/out.$n"; done) >> "$RESULTS" <<'PY'
import json, os, sys
sysname, ds, nn, epoch, served, failed, cpu_ticks, alone, roles, calls = sys.argv[1:11]
runs = [json.loads(open(f).read().strip().splitlines()[-1]) for f in sys.argv[11:]]
roles = json.loads(roles)
files = sum(r.get("files", 0) for r in runs)  # a direct client reports none
print(json.dumps({"system": sysname, "dataset": ds, "nodes": int(nn), "epoch": int(epoch),
                  "seconds": max(r["seconds"] for r in runs), "files_per_s_node": sum(r["files_per_s"] for r in runs) / len(runs),
                  "mb_per_s_node": sum(r["mb_per_s"] for r in runs) / len(runs), "p50_ms": max(r["p50_ms"] for r in runs),
                  "p99_ms": max(r["p99_ms"] for r in runs), "storage_bytes": int(served),
                  "dataset_bytes": runs[0]["bytes"], "cpu_s": int(cpu_ticks) / os.sysconf("SC_CLK_TCK"), "alone": alone == "1",
                  # A direct client has ended before the snapshot: it reports its own CPU.
                  "system_cpu_s": roles["system"] + sum(r.get("client_cpu_s", 0) for r in runs), "store_cpu_s": roles["store"],
                  "cpu_by_process": roles["by_process"],
                  # gRPC calls the master and the workers received, per file read (every node's).
                  "rpc_calls_per_file": {k: round(v / files, 3) for k, v in json.loads(calls).items()} if files else {},
                  "errors": sum(r["errors"] + r["mismatches"] for r in runs) + int(failed)}))
PY
    tail -1 "$RESULTS" >&2
  done
}

is_granary() { case "$1" in granary|granary-*) return 0;; esac; return 1; }
# rpc_calls NODES: the gRPC calls the master and every worker received so far, by role and method
# ({"master.Lookup": n, "worker.ReadBlock": n, ...}), from their /metrics.
rpc_calls() {
  { on 1 curl -s --max-time 5 http://127.0.0.1:19996/metrics || true
    for n in $(seq 1 "$1"); do on "$n" curl -s --max-time 5 http://127.0.0.1:29996/metrics || true; done; } | python3 -c '
import json, re, sys
out = {}
for line in sys.stdin:
    m = re.match(r"granary_(master|worker)_rpc_calls_total\{method=\"(\w+)\"\} (\S+)", line)
    if m:
        key = m.group(1) + "." + m.group(2)
        out[key] = out.get(key, 0) + float(m.group(3))
print(json.dumps(out))'
}

start_system() {  # SYSTEM NODES: mount the bucket at WORK/mnt/<n> on every node
  local sys=$1 nn=$2
  for n in $(seq 1 "$nn"); do mkdir -p "$WORK/mnt/$n"; done
  case "$sys" in
    s3fs)
      echo "$AK:$SK" > "$WORK/passwd"; chmod 600 "$WORK/passwd"
      for n in $(seq 1 "$nn"); do
        on "$n" s3fs rig "$WORK/mnt/$n" -o passwd_file="$WORK/passwd" -o url="$EP" -o use_path_request_style
      done;;
    rclone)
      for n in $(seq 1 "$nn"); do
        RCLONE_CONFIG_RIG_TYPE=s3 RCLONE_CONFIG_RIG_PROVIDER=Other RCLONE_CONFIG_RIG_ENDPOINT=$EP \
        RCLONE_CONFIG_RIG_ACCESS_KEY_ID=$AK RCLONE_CONFIG_RIG_SECRET_ACCESS_KEY=$SK RCLONE_CONFIG_RIG_FORCE_PATH_STYLE=true \
          on "$n" env -u AWS_CA_BUNDLE rclone mount rig:rig "$WORK/mnt/$n" --vfs-cache-mode full --cache-dir "$WORK/rclone-cache-$nn-$n" \
          --read-only --daemon --config /dev/null
      done;;
    fuse-floor)
      on 1 "$BIN/granary-fuse-floor" serve "$WORK/mnt/1" --mirror "$WORK/src" > "$WORK/fuse-floor.log" 2>&1 &;;
    granary|granary-no-elastic|granary-no-ahead|granary-passthrough)
      local opts=(); [ "$sys" = granary-no-elastic ] && opts=(-o cache.elastic=false)
      [ "$sys" = granary-no-ahead ] && opts=(-o cache.fetch_ahead=false)
      # shellcheck disable=SC2206
      [ -n "$GRANARY_OPTS" ] && opts+=($GRANARY_OPTS)
      rm -f "$WORK/master.addr"
      # The rig's own network namespaces: no token, on purpose.
      on 1 "$BIN/granary-master" --master.listen 10.233.0.2:0 --master.data_dir "$WORK/$sys-$nn/master" --rpc.allow_unauthenticated true \
        --ready-file "$WORK/master.addr" > "$WORK/$sys-$nn-master.log" 2>&1 &
      for _ in $(seq 200); do [ -s "$WORK/master.addr" ] && break; sleep 0.05; done
      local maddr; maddr=$(cat "$WORK/master.addr")
      on 1 "$BIN/granary" --master "$maddr" mount /ds s3://rig -o endpoint="$EP" "${opts[@]}" >&2
      for n in $(seq 1 "$nn"); do
        local ip=10.233.0.$((n + 1))
        rm -f "$WORK/w$n.addr"
        on "$n" "$BIN/granary-worker" --master.address "$maddr" --worker.listen "$ip:0" --worker.cache_dir "$WORK/$sys-$nn/cache$n" \
          --rpc.allow_unauthenticated true --worker.cache_quota 20Gi --worker.heartbeat_interval 500ms --ready-file "$WORK/w$n.addr" ${RIG_WORKER_ARGS:-} \
          > "$WORK/$sys-$nn-worker$n.log" 2>&1 &
        for _ in $(seq 200); do [ -s "$WORK/w$n.addr" ] && break; sleep 0.05; done
        on "$n" "$BIN/granary-fuse" --master.address "$maddr" --fuse.worker "$(cat "$WORK/w$n.addr")" --fuse.root /ds \
          --fuse.mountpoint "$WORK/mnt/$n" $([ "$sys" = granary-passthrough ] && echo --fuse.open passthrough) ${RIG_FUSE_ARGS:-} > "$WORK/$sys-$nn-fuse$n.log" 2>&1 &
      done
      # Every worker must place blocks over the same membership before the first read.
      for _ in $(seq 200); do
        on 1 "$BIN/granary" --master "$maddr" report --json | python3 -c '
import json, sys
w = [x for x in json.load(sys.stdin)["workers"] if x["alive"]]
sys.exit(0 if len(w) == int(sys.argv[1]) and all(x["peers"] == int(sys.argv[1]) for x in w) else 1)' "$nn" && break
        sleep 0.1
      done;;
  esac
  [ "$sys" = local ] || is_direct "$sys" && return 0
  for n in $(seq 1 "$nn"); do
    for _ in $(seq 400); do on "$n" grep -q " $WORK/mnt/$n " /proc/mounts && break; sleep 0.05; done
    on "$n" grep -q " $WORK/mnt/$n " /proc/mounts || { echo "rig: $sys did not mount on node $n" >&2; exit 1; }
  done
}

stop_system() {  # SYSTEM NODES
  local sys=$1 nn=$2
  [ "$sys" = local ] || is_direct "$sys" && return 0
  for n in $(seq 1 "$nn"); do on "$n" umount -l "$WORK/mnt/$n" 2>/dev/null || true; done
  for n in $(seq 1 "$nn"); do
    for p in $(ip netns pids "grp-n$n"); do [ "$p" != "${HOST[$n]}" ] && kill "$p" 2>/dev/null || true; done
  done
  sleep 0.5
}

NODE_COUNTS="1"; [ "$NODES" != 1 ] && NODE_COUNTS="1 $NODES"  # --nodes 1: the one-node pass once
for nn in $NODE_COUNTS; do
  for sys in $SYSTEMS; do
    one_node_only "$sys" && [ "$nn" != 1 ] && continue
    echo "rig: $sys on $nn node(s)" >&2
    start_system "$sys" "$nn"
    run_epochs "$sys" images files "$nn"
    run_epochs "$sys" shards shards "$nn"
    stop_system "$sys" "$nn"
  done
done

PNG=$ROOT/docs/img/rig.png; [ "$DOCS" = 1 ] || PNG=$WORK/rig.png
/usr/bin/python3 "$ROOT/bench/rig_report.py" "$RESULTS" "$PNG" "$CMDLINE" "$NODES" "$RATE" "$IMAGES" "$SHARDS" "$SHARD_MB" "$EPOCHS" "$PROCS" "$THREADS" > "$WORK/table.md"
cat "$WORK/table.md"
[ "$DOCS" = 1 ] && python3 - "$ROOT/docs/benchmarks.md" "$WORK/table.md" <<'PY'
import sys
doc, table = open(sys.argv[1]).read(), open(sys.argv[2]).read()
b, e = "<!-- rig:begin -->", "<!-- rig:end -->"
if b in doc:
    doc = doc[:doc.index(b) + len(b)] + "\n" + table + doc[doc.index(e):]
open(sys.argv[1], "w").write(doc)
PY
if grep -q '"errors": [1-9]' "$RESULTS"; then echo "rig: some readers failed or read wrong bytes" >&2; exit 1; fi
