#!/usr/bin/env bash
# Hit ratio over shuffled epochs through a real mount, lru beside shuffle, with the cache holding
# 25%, 50% and 75% of the dataset. For each case `granary local` serves an ImageNet-like dataset
# from local disk with one SSD level sized to the fraction; the worker's default policy is lru and
# the shuffle runs choose it per mount (-o cache.policy=shuffle). Hit ratios come from the worker's
# counters (read requests served from the cache / all read requests) per epoch, and the bytes read
# from the under-storage per later epoch as a share of the dataset (ideal: 1 - cache/dataset).
#
# With --levels 2 the cache is two levels, a MEM level on /dev/shm holding a quarter of it above an
# SSD level holding the rest (the shuffle policy must then hold across levels).
#
#   bench/cache_policy.sh [--files N] [--epochs E] [--threads T] [--levels 1|2] [--fractions "0.25 0.5"]
#                         [--build DIR] [--work DIR] [--keep]
#
# Prints a Markdown table. Everything it starts is stopped and unmounted on exit.
set -euo pipefail
FILES=1500; EPOCHS=5; THREADS=4; LEVELS=1; FRACTIONS="0.25 0.50 0.75"; BUILD=""; WORK=""; KEEP=0
while [ $# -gt 0 ]; do
  case "$1" in
    --files) FILES=$2; shift 2;;
    --epochs) EPOCHS=$2; shift 2;;
    --threads) THREADS=$2; shift 2;;
    --levels) LEVELS=$2; shift 2;;
    --fractions) FRACTIONS=$2; shift 2;;
    --build) BUILD=$2; shift 2;;
    --work) WORK=$2; shift 2;;
    --keep) KEEP=1; shift;;
    *) echo "usage: $0 [--files N] [--epochs E] [--threads T] [--levels 1|2] [--fractions LIST] [--build DIR] [--work DIR] [--keep]" >&2; exit 2;;
  esac
done
source "$(dirname "$0")/lib.sh"
bench_setup granary-bench
DATA=$WORK/imagenet; MNT=$WORK/mnt
SHM=/dev/shm/granary-cache-policy-$$
cleanup() { stop_local; rm -rf "$SHM"; [ "$KEEP" = 1 ] || rm -rf "$WORK"; }
trap cleanup EXIT INT TERM

[ -d "$DATA" ] || python3 "$ROOT/bench/gen_dataset.py" --out "$DATA" --files "$FILES" --seed 42 >/dev/null
mkdir -p "$MNT"
# Bytes the whole dataset takes in the cache: each file is one block (4 KiB header + data).
CACHED_BYTES=$(find "$DATA" -type f -printf '%s\n' | awk '{n += 4096 + $1} END {print n}')

counters() {  # hits misses ufs_bytes
  "$BIN/granary" report --json | python3 -c 'import json,sys; w=json.load(sys.stdin)["workers"][0]; print(w["hits"], w["misses"], w["ufs_bytes"])'
}
DATA_BYTES=$(find "$DATA" -type f -printf '%s\n' | awk '{n += $1} END {print n}')

ROWS=()
for FRAC in $FRACTIONS; do
  for POLICY in lru shuffle; do
    QUOTA=$(python3 -c "print(int($CACHED_BYTES * $FRAC))")
    CONF=$WORK/granary-$POLICY-$FRAC.yaml
    if [ "$LEVELS" = 2 ]; then
      LEVEL_LINES="      - {mediumtype: MEM, path: $SHM/mem-$POLICY-$FRAC, quota: $((QUOTA / 4)), high: \"0.95\", low: \"0.7\"}
      - {mediumtype: SSD, path: $WORK/cache-$POLICY-$FRAC, quota: $((QUOTA - QUOTA / 4)), high: \"0.95\", low: \"0.7\"}"
    else
      LEVEL_LINES="      - {mediumtype: SSD, path: $WORK/cache-$POLICY-$FRAC, quota: $QUOTA, high: \"0.95\", low: \"0.7\"}"
    fi
    cat > "$CONF" <<YAML
worker:
  tieredstore:
    policy: lru
    levels:
$LEVEL_LINES
fuse:
  # Every epoch must reach the worker's cache, not the kernel's page cache: no kept pages, and
  # every open asks granary-fuse (kernel-served opens keep pages whatever keep_cache says).
  keep_cache: false
  open: daemon
YAML
    OPT=()
    [ "$POLICY" = shuffle ] && OPT=(-o cache.policy=shuffle)
    start_local "$WORK/local-$POLICY-$FRAC.log" "file://$DATA" "$MNT" --dir "$WORK/state-$POLICY-$FRAC" --config "$CONF" "${OPT[@]}"
    read -r H0 M0 U0 < <(counters)
    U_START=$U0
    RATIOS=()
    for E in $(seq "$EPOCHS"); do
      "$BIN/granary-train-read" --root "$MNT" --threads "$THREADS" --seed "$E" --label "epoch $E" > /dev/null
      # Counters travel with the worker's reports: wait until this epoch's reads are all counted.
      for _ in $(seq 200); do
        read -r H1 M1 U1 < <(counters)
        [ $(( H1 + M1 - H0 - M0 )) -ge "$FILES" ] && { sleep 1.2; read -r H1 M1 U1 < <(counters); break; }
        sleep 0.1
      done
      RATIOS+=("$(python3 -c "print('%.3f' % (($H1-$H0)/max(1,($H1-$H0)+($M1-$M0))))")")
      H0=$H1; M0=$M1
      [ "$E" = 1 ] && U_START=$U1
    done
    stop_local
    UFS_LATER=$(python3 -c "print('%.3f' % (($U1-$U_START)/($DATA_BYTES*($EPOCHS-1))))")
    ROWS+=("$POLICY $FRAC $UFS_LATER ${RATIOS[*]}")
  done
done

python3 - "$EPOCHS" "${ROWS[@]}" <<'PY'
import sys
epochs = int(sys.argv[1])
print("| policy | cache/dataset | " + " | ".join("epoch %d" % (e + 1) for e in range(epochs)) +
      " | epochs 2-%d | vs cache/dataset | under-storage bytes per epoch 2-%d / dataset |" % (epochs, epochs))
print("|---|---:|" + "---:|" * (epochs + 3))
for row in sys.argv[2:]:
    p, frac, ufs, *r = row.split()
    r = [float(x) for x in r]
    later = sum(r[1:]) / len(r[1:])
    print("| %s | %s | %s | %.3f | %.2f | %s |" % (p, frac, " | ".join("%.3f" % x for x in r), later,
                                                  later / float(frac), ufs))
PY
