#!/usr/bin/env bash
# Standby masters under fire (issue 32): three granary-masters electing through a 3-member etcd,
# N reader nodes (network namespaces, scripts/netns.sh) each with a worker, granary-fuse and a
# training-like reader (bench/failover_reader.py: shuffled epochs, cold then warm, every byte
# checked, a stat before each open so metadata calls reach the master once the kernel's 1 s
# attributes expire), and a load job of the whole dataset running meanwhile. The leader is killed
# with -9 KILLS times and its link cut (ip link set down, for CUT_S seconds) CUTS times; after each
# fault the old leader comes back (restarted on its address, or its link up) and must catch up as a
# standby before the next fault.
#
#   bench/failover.sh [--nodes 4] [--files 600] [--kills 10] [--cuts 5] [--ttl 5s] [--cut-s 8]
#
# Prints each failover (fault to a new leader answering), then p50/p99/max, reader errors, wrong
# bytes, the longest stall a reader saw, the load job's end, the bytes read from the under-storage
# against the dataset's, and last:
#   failover p99 <s> s, max <s> s, reader errors <n>, wrong bytes <n>
# Everything it starts is stopped on exit. Needs root (namespaces, FUSE).
set -euo pipefail
NODES=4; FILES=600; KILLS=10; CUTS=5; TTL=5s; CUT_S=8
while [ $# -gt 0 ]; do
  case "$1" in
    --nodes) NODES=$2; shift 2;; --files) FILES=$2; shift 2;; --kills) KILLS=$2; shift 2;;
    --cuts) CUTS=$2; shift 2;; --ttl) TTL=$2; shift 2;; --cut-s) CUT_S=$2; shift 2;;
    *) sed -n '2,20p' "$0" >&2; exit 2;;
  esac
done
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BIN=${BIN_DIR:-$ROOT/build/bin}
export NETNS_PREFIX=gfo NETNS_SUBNET=10.234.0
NET="$ROOT/scripts/netns.sh"
bash "$ROOT/scripts/etcd.sh" install
WORK=$(mktemp -d /tmp/granary-failover-XXXXXX)
declare -A PIDS MADDR MPID
ip_of() { echo "$NETNS_SUBNET.$(($1 + 1))"; }         # node k's address (k = 1..)
mns() { echo "gfo-n$((NODES + $1))"; }               # master i's namespace (i = 1..3)
cleanup() {
  set +e
  touch "$WORK/stop"
  for p in "${PIDS[@]}" "${MPID[@]}"; do kill "$p" 2>/dev/null; done
  sleep 1
  for p in "${PIDS[@]}" "${MPID[@]}"; do kill -9 "$p" 2>/dev/null; done
  for m in $(awk -v w="$WORK" '$2 ~ "^"w {print $2}' /proc/mounts); do umount -l "$m" 2>/dev/null; done
  pkill -f "granary-fuse.*$WORK" 2>/dev/null
  bash "$ROOT/scripts/etcd.sh" stop "$WORK/etcd"
  bash "$NET" down >/dev/null
  [ -n "${KEEP_WORK:-}" ] && { echo "work dir kept: $WORK" >&2; return; }
  rm -rf "$WORK"
}
trap cleanup EXIT
trap 'exit 130' INT TERM
wait_file() {  # FILE [SECONDS]
  for _ in $(seq $((${2:-60} * 20))); do [ -s "$1" ] && return 0; sleep 0.05; done
  echo "error: $1 never appeared" >&2; return 1
}

bash "$NET" up $((NODES + 3)) 1gbit >&2
ETCD_OUT=$(ip netns exec gfo-storage env ETCD_HOST="$NETNS_SUBNET.1" bash "$ROOT/scripts/etcd.sh" start "$WORK/etcd" 3)
ETCD=$(echo "$ETCD_OUT" | sed -n 's/^READY //p'); ETCD_TLS_DIR=$(echo "$ETCD_OUT" | sed -n 's/^TLS //p')
# etcd over TLS with client certificates (issue 51): the masters present scripts/etcd.sh's client certificate.
ETCD_TLS=(--master.etcd_tls_ca "$ETCD_TLS_DIR/ca.pem" --master.etcd_tls_cert "$ETCD_TLS_DIR/client.pem"
          --master.etcd_tls_key "$ETCD_TLS_DIR/client-key.pem")
python3 "$ROOT/bench/gen_dataset.py" --out "$WORK/src" --files "$FILES" --seed 7 >&2
DATASET_BYTES=$(du -sb "$WORK/src" | cut -f1)
# Every daemon serves on its namespace's network: with a shared token (rpc.token_file), as in a cluster.
head -c 32 /dev/urandom | base64 > "$WORK/token"; chmod 600 "$WORK/token"
AUTH=(--rpc.token_file "$WORK/token")
printf 'rpc:\n  master_wait: 3s\n  token_file: %s\n' "$WORK/token" > "$WORK/cli.yaml"

start_master() {  # I LISTEN
  local i=$1; rm -f "$WORK/m$i.addr"
  nsenter --net="/run/netns/$(mns "$i")" "$BIN/granary-master" --master.listen "$2" --master.data_dir "$WORK/m$i" \
    --master.etcd_endpoints "$ETCD" "${ETCD_TLS[@]}" --master.election_ttl "$TTL" --master.metrics_listen off \
    --ufs.local_roots "$WORK/src" "${AUTH[@]}" --ready-file "$WORK/m$i.addr" >> "$WORK/m$i.log" 2>&1 &
  MPID[$i]=$!
  wait_file "$WORK/m$i.addr"
  MADDR[$i]=$(cat "$WORK/m$i.addr")
}
for i in 1 2 3; do start_master "$i" "$(ip_of $((NODES + i))):0"; done
MASTERS="${MADDR[1]},${MADDR[2]},${MADDR[3]}"
cli() { GRANARY_HOME="$WORK/home" nsenter --net=/run/netns/gfo-n1 "$BIN/granary" --config "$WORK/cli.yaml" --master "$MASTERS" "$@"; }
# master I... of the leader ("" none), and how many standbys are in sync with it
state() {
  cli report --json 2>/dev/null | python3 -c '
import json, sys
m = json.load(sys.stdin)["master"]
print(m["leader"], sum(1 for s in m["standbys"] if s["in_sync"]))' 2>/dev/null || echo "- 0"
}
leader_i() { local a; a=$(state | cut -d" " -f1); for i in 1 2 3; do [ "${MADDR[$i]}" = "$a" ] && echo "$i" && return; done; echo 0; }
wait_healthy() {  # a leader with both standbys in sync
  for _ in $(seq 1200); do [ "$(state | cut -d" " -f2)" = 2 ] && return 0; sleep 0.1; done
  echo "error: no leader with two standbys in sync" >&2; return 1
}
wait_healthy
echo "masters: $MASTERS; etcd: $ETCD" >&2

for n in $(seq 1 "$NODES"); do
  mkdir -p "$WORK/mnt/$n"
  nsenter --net=/run/netns/gfo-n$n "$BIN/granary-worker" --master.address "$MASTERS" --worker.listen "$(ip_of "$n"):0" \
    --worker.cache_dir "$WORK/cache$n" --worker.cache_quota 4Gi --worker.heartbeat_interval 1s \
    --worker.local_socket "$WORK/w$n.sock" --worker.metrics_listen off --ufs.local_roots "$WORK/src" "${AUTH[@]}" \
    --ready-file "$WORK/w$n.addr" > "$WORK/w$n.log" 2>&1 &
  PIDS[w$n]=$!
done
for n in $(seq 1 "$NODES"); do wait_file "$WORK/w$n.addr"; done
cli mount /data "file://$WORK/src" >&2
for n in $(seq 1 "$NODES"); do
  nsenter --net=/run/netns/gfo-n$n "$BIN/granary-fuse" --master.address "$MASTERS" --fuse.worker "$(cat "$WORK/w$n.addr")" \
    --fuse.mountpoint "$WORK/mnt/$n" --fuse.metrics_listen off --fuse.handover_socket "$WORK/f$n.sock" \
    --fuse.entry_timeout 1s --fuse.attr_timeout 1s "${AUTH[@]}" --ready-file "$WORK/f$n.addr" > "$WORK/f$n.log" 2>&1 &
  PIDS[f$n]=$!
done
for n in $(seq 1 "$NODES"); do wait_file "$WORK/f$n.addr"; done
cli load /data --background >&2
for n in $(seq 1 "$NODES"); do
  python3 "$ROOT/bench/failover_reader.py" --mount "$WORK/mnt/$n/data" --source "$WORK/src" --seed "$n" \
    --status "$WORK/r$n.json" --stop "$WORK/stop" &
  PIDS[r$n]=$!
done
reads() { python3 -c '
import json, sys
t = 0
for f in sys.argv[1:]:
    try: t += json.load(open(f))["reads"]
    except Exception: pass
print(t)' "$WORK"/r*.json; }
reads_go_on() {  # every reader node read another 50 files
  local before; before=$(reads)
  for _ in $(seq 1200); do [ "$(reads)" -ge $((before + 50 * NODES)) ] && return 0; sleep 0.1; done
  echo "error: the readers are stuck" >&2; return 1
}
reads_go_on

: > "$WORK/failovers"
faults=$((KILLS + CUTS)); kills=0; cuts=0
for k in $(seq 1 "$faults"); do
  wait_healthy
  reads_go_on
  L=$(leader_i); [ "$L" != 0 ] || { echo "error: no leader" >&2; exit 1; }
  kind=kill
  if [ "$cuts" -lt "$CUTS" ] && { [ "$kills" -ge "$KILLS" ] || [ $((k % 3)) = 0 ]; }; then kind=cut; fi
  t0=$(date +%s.%N)
  if [ "$kind" = kill ]; then { kill -9 "${MPID[$L]}"; wait "${MPID[$L]}"; } 2>/dev/null || true; kills=$((kills + 1)); else ip -n "$(mns "$L")" link set eth0 down; cuts=$((cuts + 1)); fi
  for _ in $(seq 1200); do N=$(leader_i); [ "$N" != 0 ] && [ "$N" != "$L" ] && break; sleep 0.1; done
  t1=$(date +%s.%N)
  took=$(python3 -c "print(f'{$t1 - $t0:.2f}')")
  echo "$took" >> "$WORK/failovers"
  echo "fault $k ($kind): leader ${MADDR[$L]} -> ${MADDR[$N]} in $took s" >&2
  if [ "$kind" = kill ]; then
    { wait "${MPID[$L]}"; } 2>/dev/null || true
    start_master "$L" "${MADDR[$L]}"
  else
    sleep "$CUT_S"  # the cut's length (a fault), then the link comes back
    ip -n "$(mns "$L")" link set eth0 up
  fi
done
wait_healthy
reads_go_on
# The load job ran across the faults: it ends, every file loaded once.
job_state=""
for _ in $(seq 3000); do
  job_state=$(cli jobs --json 2>/dev/null | python3 -c '
import json, sys
j = json.load(sys.stdin)
jobs = j["jobs"] if isinstance(j, dict) else j
job = jobs[0]  # newest first: the one submitted above
print(job.get("state", "?"), job.get("files_done", 0), job.get("files_total", 0), job.get("files_failed", 0))' 2>/dev/null || true)
  case "$job_state" in succeeded*|failed*|cancel*) break;; esac
  sleep 0.2
done
touch "$WORK/stop"
for n in $(seq 1 "$NODES"); do wait "${PIDS[r$n]}" || true; done
UFS_BYTES=$(cli report --json | python3 -c '
import json, sys
print(sum(w["ufs_bytes"] for w in json.load(sys.stdin)["workers"] if w.get("alive")))')
python3 - "$WORK/failovers" "$DATASET_BYTES" "$UFS_BYTES" "$job_state" "$KILLS" "$CUTS" "$WORK"/r*.json <<'PY'
import json, math, sys
times = sorted(float(x) for x in open(sys.argv[1]).read().split())
dataset, ufs, job, kills, cuts = int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5], sys.argv[6]
rs = [json.load(open(f)) for f in sys.argv[7:]]
pick = lambda q: times[min(len(times) - 1, max(0, math.ceil(q * len(times)) - 1))]
errors = sum(r["errors"] for r in rs); wrong = sum(r["wrong"] for r in rs)
print(f"faults: {kills} kills -9 and {cuts} link cuts of the leader")
print(f"failover (fault to a new leader answering): p50 {pick(0.5):.2f} s, p99 {pick(0.99):.2f} s, max {times[-1]:.2f} s")
print(f"readers: {len(rs)} nodes, {sum(r['reads'] for r in rs)} files read, {sum(r['epochs'] for r in rs)} epochs, "
      f"errors {errors}, wrong {wrong}, longest stall {max(r['longest_stall_s'] for r in rs):.2f} s")
for r in rs:
    for e in r["first_errors"][:3]: print("  ", e)
print(f"load job: {job} (state, files done, files total, failed)")
print(f"under-storage bytes read by the workers: {ufs / dataset:.2f}x the dataset ({ufs} of {dataset})")
print(f"failover p99 {pick(0.99):.2f} s, max {times[-1]:.2f} s, reader errors {errors}, wrong bytes {wrong}")
PY
