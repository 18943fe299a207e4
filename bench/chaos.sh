#!/usr/bin/env bash
# The chaos epoch (issue 34): every fault at once under training reads and writes, on a cluster in
# network namespaces — 4 nodes (worker, granary-fuse, reader; writers on two), 3 masters electing
# through etcd, Ceph RGW behind a fault-injecting proxy. The design and what each fault is: the
# docstring of bench/chaos.py.
#
#   bench/chaos.sh [--minutes M] [--seed N] [--nodes 4] [--files 400] [--keep-work]
#                  [--modes "kernel daemon passthrough kernel"]   (the nodes' fuse.open, in turn)
#
# Prints operations, reader errors (must be 0), wrong bytes (0), the longest stall, store bytes as a
# multiple of the dataset, faults by kind, the seed to replay; last line:
#   reader errors <n>, wrong bytes <n>, longest stall <s> s, faults <n>, seed <n>
# Exit status 0 only with no reader error and no wrong byte. Everything it starts is stopped on
# exit. Needs root (namespaces, mounts), RGW and etcd (scripts/test.sh installs them), and a build
# (BIN_DIR, default build/bin).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
bash "$ROOT/scripts/etcd.sh" install >/dev/null
exec python3 "$ROOT/bench/chaos.py" "$@"
