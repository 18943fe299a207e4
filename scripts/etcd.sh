#!/usr/bin/env bash
# A throwaway etcd for tests and benches: Debian's etcd-server on 127.0.0.1 only, every port chosen
# by the OS, one member or several (a real quorum), no systemd.
#
#   scripts/etcd.sh install              apt-get etcd-server etcd-client (root)
#   scripts/etcd.sh start DIR [MEMBERS]  prints "READY http://127.0.0.1:P1,http://127.0.0.1:P2,..."
#                                        once every member answers; data and logs under DIR
#   scripts/etcd.sh stop DIR [MEMBER]    stops every member (or member MEMBER, 0-based: a member down)
# ETCD_HOST (default 127.0.0.1): the address to serve on (a network namespace's, for the benches).
set -euo pipefail
cmd=${1:?usage: etcd.sh install|start DIR [MEMBERS]|stop DIR [MEMBER]}
if [ "$cmd" = install ]; then
  exec bash "$(dirname "$0")/apt-ensure.sh" etcd-server etcd-client
fi
D=${2:?usage: etcd.sh $cmd DIR}
stop_one() {  # PIDFILE
  [ -s "$1" ] || return 0
  local p; p=$(cat "$1"); kill "$p" 2>/dev/null || true
  for _ in $(seq 100); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
  kill -9 "$p" 2>/dev/null || true
  rm -f "$1"
}
if [ "$cmd" = stop ]; then
  if [ -n "${3:-}" ]; then stop_one "$D/m$3/pid"; exit 0; fi
  for f in "$D"/m*/pid; do [ -e "$f" ] && stop_one "$f"; done
  exit 0
fi
[ "$cmd" = start ] || { echo "usage: etcd.sh install|start DIR [MEMBERS]|stop DIR [MEMBER]" >&2; exit 2; }
N=${3:-1}
H=${ETCD_HOST:-127.0.0.1}
command -v etcd >/dev/null || { echo "error: etcd not installed (scripts/etcd.sh install)" >&2; exit 1; }
# Two ports per member (clients, peers), held by the OS until etcd binds them.
read -r -a PORTS < <(python3 -c '
import socket, sys
ss = [socket.socket() for _ in range(2 * int(sys.argv[1]))]
for s in ss: s.bind((sys.argv[2], 0))
print(*[s.getsockname()[1] for s in ss])
for s in ss: s.close()' "$N" "$H")
cluster=""; clients=""
for i in $(seq 0 $((N - 1))); do
  cluster+="${cluster:+,}m$i=http://$H:${PORTS[$((2 * i + 1))]}"
  clients+="${clients:+,}http://$H:${PORTS[$((2 * i))]}"
done
for i in $(seq 0 $((N - 1))); do
  m="$D/m$i"; mkdir -p "$m"
  setsid etcd --name "m$i" --data-dir "$m/data" \
    --listen-client-urls "http://$H:${PORTS[$((2 * i))]}" --advertise-client-urls "http://$H:${PORTS[$((2 * i))]}" \
    --listen-peer-urls "http://$H:${PORTS[$((2 * i + 1))]}" --initial-advertise-peer-urls "http://$H:${PORTS[$((2 * i + 1))]}" \
    --initial-cluster "$cluster" --initial-cluster-state new --initial-cluster-token "granary-$$" \
    --listen-metrics-urls "" > "$m/log" 2>&1 < /dev/null &
  echo $! > "$m/pid"
done
# Ready once every member reports itself healthy (a quorum has formed).
for _ in $(seq 300); do
  ok=0
  for i in $(seq 0 $((N - 1))); do
    curl -sf -m 2 "http://$H:${PORTS[$((2 * i))]}/health" 2>/dev/null | grep -q '"health":"true"' && ok=$((ok + 1))
  done
  [ "$ok" = "$N" ] && { echo "READY $clients"; exit 0; }
  for i in $(seq 0 $((N - 1))); do
    kill -0 "$(cat "$D/m$i/pid")" 2>/dev/null || { echo "error: etcd member $i exited:" >&2; tail -20 "$D/m$i/log" >&2; exit 1; }
  done
  sleep 0.1
done
echo "error: etcd did not become healthy within 30 s; logs under $D" >&2
exit 1
