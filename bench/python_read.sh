#!/usr/bin/env bash
# Python readers through granary:// (fsspec, the worker's local socket; docs/python.md) against
# the same files on local ext4 and through the FUSE mount, in one run (issue 55's targets).
#
# Rows (8 threads of one Python process, bench/python_read.py; files shuffled; warm, dropped and
# loader rows run three rounds with the sides taking turns, and the table shows medians):
#   small files, page cache warm     ImageNet-like files read whole: ext4 open().read() against
#                                    fs.cat_file and `with fs.open(p) as f: f.read()`, and the
#                                    mount's open().read() (the FUSE floor it avoids)
#   small files, page cache dropped  the same after `echo 3 > /proc/sys/vm/drop_caches` on both
#                                    sides (the tier is on disk, an SSD level)
#   small files, cold                Granary's cache freed too: fsspec against the mount, both
#                                    fetching from the under-storage (a local directory here)
#   torchvision-style loader, warm   PIL.Image.open of the opened file, convert("RGB"), resize to
#                                    224x224, on real JPEGs: fs.open against open() on ext4
# Every row's bytes are checked against the source afterwards (untimed); a mismatch fails the run.
#
#   bench/python_read.sh [--files N] [--images N] [--threads T] [--build DIR] [--work DIR] [--keep]
#
# Prints a Markdown table of ratios to the baseline of each row. Everything it starts is stopped
# and unmounted on exit, also on failure or Ctrl-C. Needs root (drop_caches).
set -euo pipefail
FILES=3000; IMAGES=600; THREADS=8; BUILD=""; WORK=""; KEEP=0
while [ $# -gt 0 ]; do
  case "$1" in
    --files) FILES=$2; shift 2;;
    --images) IMAGES=$2; shift 2;;
    --threads) THREADS=$2; shift 2;;
    --build) BUILD=$2; shift 2;;
    --work) WORK=$2; shift 2;;
    --keep) KEEP=1; shift;;
    *) echo "usage: $0 [--files N] [--images N] [--threads T] [--build DIR] [--work DIR] [--keep]" >&2; exit 2;;
  esac
done
[ -w /proc/sys/vm/drop_caches ] || { echo "error: needs root (drop_caches)" >&2; exit 1; }
PY=/usr/bin/python3  # Debian's, with python3-fsspec and python3-pil
source "$(dirname "$0")/lib.sh"
bench_setup granary-py
PKG=${BUILD:-$ROOT/build}/python
[ -f "$PKG/granary/__init__.py" ] || { echo "error: $PKG/granary not built (scripts/build.sh)" >&2; exit 1; }
export PYTHONPATH=$PKG GRANARY_SOCKET=$WORK/worker.sock
DATA=$WORK/data; MNT=$WORK/mnt; OUT=$WORK/results.jsonl
cleanup() {
  stop_local
  [ "$KEEP" = 1 ] || rm -rf "$WORK"
}
trap cleanup EXIT INT TERM
drop_caches() { sync; echo 3 > /proc/sys/vm/drop_caches; }

mkdir -p "$DATA" "$MNT"
[ -d "$DATA/small" ] || $PY "$ROOT/bench/gen_dataset.py" --out "$DATA/small" --files "$FILES" --seed 42 >/dev/null
[ -d "$DATA/images" ] || $PY "$ROOT/bench/gen_dataset.py" --out "$DATA/images" --files "$IMAGES" --jpeg --seed 43 >/dev/null
: > "$OUT"
QUOTA=$(( ($(du -sb "$DATA" | cut -f1)) * 2 ))
cat > "$WORK/granary.yaml" <<YAML
worker:
  local_socket: $WORK/worker.sock
  tieredstore:
    levels:
      - {mediumtype: SSD, path: $WORK/tier, quota: $QUOTA}
YAML
NS=/$(basename "$DATA")
fresh() {  # a new `granary local` with nothing cached and nothing remembered (fetch-ahead's evidence)
  stop_local
  rm -rf "$WORK/tier" "$WORK/state"
  start_local "$WORK/local.log" "file://$DATA" "$MNT" --dir "$WORK/state" --config "$WORK/granary.yaml"
}

row() {  # ROW ARGS...: one python_read.py run, tagged
  local name=$1; shift
  local line
  line=$($PY "$ROOT/bench/python_read.py" --threads "$THREADS" --verify "$@") || { echo "error: row $name failed: $line" >&2; exit 1; }
  $PY -c 'import json,sys; d=json.loads(sys.argv[2]); d["row"]=sys.argv[1]; print(json.dumps(d))' "$name" "$line" >> "$OUT"
}

# Cold: each side on a fresh `granary local` (nothing cached, fetch-ahead starting from nothing),
# the page cache dropped; the under-storage read through each path.
fresh; drop_caches
row cold_mount --how mount --root "$MNT/small" --source "$DATA/small" --epochs 1 --warm 0
fresh; drop_caches
row cold_cat --how cat --root "$NS/small" --source "$DATA/small" --epochs 1 --warm 0
"$BIN/granary" load "$NS" >/dev/null  # every block into the tier

# Warm: one untimed pass on each side, then three epochs; the sides take turns, three rounds
# (the table has each side's median: 8 Python threads on 2 cores are noisy).
for round in 1 2 3; do
  row warm_ext4 --how open --root "$DATA/small" --source "$DATA/small"
  row warm_cat --how cat --root "$NS/small" --source "$DATA/small"
  row warm_open --how fsspec-open --root "$NS/small" --source "$DATA/small"
  row warm_mount --how mount --root "$MNT/small" --source "$DATA/small"
done

# Page cache dropped on both sides before one epoch (sides in turn, three rounds).
for round in 1 2 3; do
  drop_caches
  row dropped_ext4 --how open --root "$DATA/small" --source "$DATA/small" --epochs 1 --warm 0
  drop_caches
  row dropped_cat --how cat --root "$NS/small" --source "$DATA/small" --epochs 1 --warm 0
done

# A torchvision-style loader on real JPEGs, warm (sides in turn, three rounds).
for round in 1 2 3; do
  row loader_ext4 --how open --root "$DATA/images" --source "$DATA/images" --task decode --epochs 2
  row loader_fsspec --how fsspec-open --root "$NS/images" --source "$DATA/images" --task decode --epochs 2
done

$PY - "$OUT" "$FILES" "$IMAGES" "$THREADS" <<'PYEND'
import json, sys
import statistics
runs = {}
for r in map(json.loads, open(sys.argv[1])):
    runs.setdefault(r["row"], []).append(r)
# Each row's median run (by files/s); mismatches of any run count.
rows = {}
for name, rs in runs.items():
    m = sorted(rs, key=lambda r: r["ops_per_s"])[len(rs) // 2]
    rows[name] = dict(m, mismatches=sum(r["mismatches"] for r in rs), runs=[round(r["ops_per_s"]) for r in rs])
files, images, threads = sys.argv[2:5]
def cell(name, base):
    r = rows[name]
    return "%.0f (**%.2f**)" % (r["ops_per_s"], r["ops_per_s"] / rows[base]["ops_per_s"])
print()
print("| Python, %s threads (files/s) | baseline | granary:// | through the mount | target |" % threads)
print("|---|---:|---:|---:|---:|")
print("| %s small files, page cache warm, fs.cat_file | ext4 %.0f | %s | %s | >= 1.0 |" % (
    files, rows["warm_ext4"]["ops_per_s"], cell("warm_cat", "warm_ext4"), cell("warm_mount", "warm_ext4")))
print("| %s small files, page cache warm, fs.open().read() | ext4 %.0f | %s | | >= 1.0 |" % (
    files, rows["warm_ext4"]["ops_per_s"], cell("warm_open", "warm_ext4")))
print("| %s small files, page cache dropped | ext4 %.0f | %s | | >= 0.8 |" % (
    files, rows["dropped_ext4"]["ops_per_s"], cell("dropped_cat", "dropped_ext4")))
print("| %s small files, cold (from the under-storage) | mount %.0f | %s | | >= 1.0 |" % (
    files, rows["cold_mount"]["ops_per_s"], cell("cold_cat", "cold_mount")))
print("| %s JPEGs, PIL decode + resize, warm | ext4 %.0f | %s | | >= 0.95 |" % (
    images, rows["loader_ext4"]["ops_per_s"], cell("loader_fsspec", "loader_ext4")))
print("runs (files/s): " + "; ".join("%s %s" % (n, rows[n]["runs"]) for n in sorted(rows)))
bad = [n for n, r in rows.items() if r["mismatches"]]
print("bytes checked against the source after every run: %d runs, %s" % (
    sum(len(v) for v in runs.values()), "wrong bytes in " + ", ".join(bad) if bad else "all equal"))
sys.exit(1 if bad else 0)
PYEND
