#!/usr/bin/env bash
# Test hosts on this machine for the benchmark rig and the multi-node tests: network namespaces on
# one bridge, with the storage host's link capped, so the under-storage is the bottleneck as in the
# field.
#
#   scripts/netns.sh up N RATE     storage host $PREFIX-storage (SUBNET.1) and nodes $PREFIX-n1..N
#                                  (SUBNET.2..), storage egress capped at RATE (e.g. 400mbit)
#   scripts/netns.sh down          removes every namespace, link and qdisc it made
#   scripts/netns.sh exec NS CMD   runs CMD inside namespace NS (and a mount namespace of its own)
#
# NETNS_CAP_UPLINK=1 caps each node's egress at RATE too (bench/checkpoint.sh: uploads).
# NETNS_PREFIX (default grp) and NETNS_SUBNET (default 10.233.0) keep several sets apart; the
# tests use their own. Processes that must mount into the caller's mount namespace join only the
# network namespace: nsenter --net=/run/netns/NS CMD.
# Traffic stays between these namespaces (the SUBNET addresses exist only here). Needs root.
set -euo pipefail
PREFIX=${NETNS_PREFIX:-grp}
SUBNET=${NETNS_SUBNET:-10.233.0}
cmd=${1:?usage: netns.sh up N RATE | down | exec NS CMD...}
case "$cmd" in
  up)
    N=${2:?usage: netns.sh up N RATE}; RATE=${3:?usage: netns.sh up N RATE}
    "$0" down
    ip link add $PREFIX-br type bridge
    ip link set $PREFIX-br up
    hosts=($PREFIX-storage)
    for i in $(seq 1 "$N"); do hosts+=("$PREFIX-n$i"); done
    i=1
    for ns in "${hosts[@]}"; do
      ip netns add "$ns"
      ip link add "$PREFIX-v$i" type veth peer name eth0 netns "$ns"
      ip link set "$PREFIX-v$i" master $PREFIX-br up
      ip -n "$ns" addr add "$SUBNET.$i/24" dev eth0
      ip -n "$ns" link set eth0 up
      ip -n "$ns" link set lo up
      i=$((i + 1))
    done
    # Everything the storage host sends to the nodes shares this one capped link.
    ip netns exec $PREFIX-storage tc qdisc add dev eth0 root tbf rate "$RATE" burst 256kb latency 50ms
    # NETNS_CAP_UPLINK=1: each node's own link to the others is capped at RATE too (uploads).
    if [ "${NETNS_CAP_UPLINK:-0}" = 1 ]; then
      for i in $(seq 1 "$N"); do
        ip netns exec "$PREFIX-n$i" tc qdisc add dev eth0 root tbf rate "$RATE" burst 256kb latency 50ms
      done
    fi
    echo "up: storage $SUBNET.1, nodes $SUBNET.2-$((N + 1)), storage egress $RATE"
    ;;
  down)
    for ns in $(ip netns list | awk '{print $1}' | grep "^$PREFIX-" || true); do
      ip netns pids "$ns" 2>/dev/null | xargs -r kill 2>/dev/null || true
      ip netns del "$ns"
    done
    ip link del $PREFIX-br 2>/dev/null || true
    # Veth pairs die asynchronously with their namespace: remove stragglers, wait until gone.
    for _ in $(seq 100); do
      left=$(ip -br link | awk '{print $1}' | grep "^$PREFIX-" | cut -d@ -f1 || true)
      [ -z "$left" ] && break
      for l in $left; do ip link del "$l" 2>/dev/null || true; done
      sleep 0.05
    done
    ;;
  exec)
    ns=${2:?usage: netns.sh exec NS CMD...}; shift 2
    exec ip netns exec "$ns" "$@"
    ;;
  *) echo "usage: netns.sh up N RATE | down | exec NS CMD..." >&2; exit 2 ;;
esac
