#!/usr/bin/env bash
# Writes through `granary local -o write=through` and `-o write=back` over a local directory
# (file://), against the same writers on local disk, in one run (issue 50, "Small files at
# local-disk speed"). Everything is on one filesystem: the work directory (WORK, default
# /var/tmp/granary-writes-*) holds the data, the local-disk targets, the stores and Granary's state.
#
#   bench/writes.sh [--files 500] [--runs 3] [--size-mb 2048] [--build DIR] [--work DIR] [--keep]
#
# Small files: FILES files of 1-40 KiB (incompressible, 50 a folder), written by
#   tar x            GNU tar extracting their archive
#   tarfile          Python's tarfile.extractall of it (the writer in the issue's figures)
#   copytree         shutil.copytree of the extracted folder
# to local disk (the page cache: none of them fsyncs), to local disk with an fsync per file before
# its close (tarfile and copytree; the baseline for write=through, whose close() returns once the
# file is durable in the store), into the FUSE floor, through write=through, and through write=back:
# timed from the writer's start to its end (for write=back, the same process then polls the store
# until the last file is there, timed from the writer's end: "then uploaded"). Each timing is the
# median of RUNS runs, every run into a new folder after a `sync`.
#
# The FUSE floor: `granary-fuse-floor serve MNT --writes DIR` (bench/fuse_floor.cc), a minimal
# low-level libfuse server that keeps the tree in memory and pwrites each created file into a new
# local file in DIR (under WORK), mounted and cached as granary-fuse mounts a writable folder
# (default_permissions, allow_other, no entry cached, found or not, direct_io writes, no writeback
# cache). Every file written through any FUSE filesystem costs a request round trip to its server
# per LOOKUP, CREATE, WRITE, SETATTR, FLUSH and RELEASE, however little the server does: that, not
# local disk, is the floor for Granary's small files on this kernel, and `back / floor` is how far
# write=back is above it (what Granary itself adds: the master's round trips, the staging, the commit).
#
# The checkpoint: SIZE_MB MiB of the bytes bench/checkpoint_io.py writes (what torch.save of a state
# dict writes: incompressible, 1 MiB sequential writes, then close), timed as bench/checkpoint.sh
# times it but with the payload made and hashed before the clock starts (on local disk that costs
# as much as the writes):
#   local     the file on local disk (close returned; torch.save does not fsync)
#   direct    that file copied into a store folder (sendfile) and fsynced, file and folder: what a
#             local store's commit makes durable, done directly (checkpoint.sh's direct upload)
#   through   write=through: close returned once the file is whole in the store
#   back      write=back: close returned once staged; then the upload, from close to the file
#             whole in the store
#
# Ratios and targets (issue 50): write=back small files >= 0.5x local disk; write=through small
# files >= 0.5x local disk with an fsync per file (tar x is compared with tarfile's fsync baseline:
# GNU tar has no fsync); through checkpoint >= 0.9x direct, back close >= 0.8x local and back upload
# >= 0.9x direct (bench/checkpoint.sh's). Every file written is read back and compared, from the
# store and through the mount; the exit code is 1 when a byte is wrong (a missed target is reported,
# not an error). Last line: `back small <a>x local, through small <b>x local+fsync, through ckpt
# <c>x direct, back ckpt close <d>x local, back ckpt upload <e>x direct, fuse floor small <f>x local,
# back small <g>x floor, fuse floor ckpt <h>x direct, through ckpt <i>x floor` (small: tar x's ratios; each is the named baseline's time over the
# measured one's: below 1 is slower than that baseline).
# Everything it starts is stopped and unmounted on exit, also on failure or Ctrl-C; no fixed port.
set -euo pipefail
FILES=500; RUNS=3; SIZE_MB=2048; BUILD=""; WORK=""; KEEP=0; OURS=0
while [ $# -gt 0 ]; do
  case "$1" in
    --files) FILES=$2; shift 2;; --runs) RUNS=$2; shift 2;; --size-mb) SIZE_MB=$2; shift 2;;
    --build) BUILD=$2; shift 2;; --work) WORK=$2; shift 2;; --keep) KEEP=1; shift;;
    *) sed -n '2,49p' "$0" >&2; exit 2;;
  esac
done
source "$(dirname "$0")/lib.sh"  # start_local, stop_local
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BIN=${BUILD:-$ROOT/build}/bin
for b in granary granary-fuse-floor; do
  [ -x "$BIN/$b" ] || { echo "error: $BIN/$b not found; build first (scripts/build.sh)" >&2; exit 1; }
done
PY=/usr/bin/python3
IO="$ROOT/bench/writes_io.py"
[ -n "$WORK" ] || { WORK=$(mktemp -d /var/tmp/granary-writes-XXXXXX); OURS=1; }
mkdir -p "$WORK"
export GRANARY_HOME=$WORK/home
MNT=""; FLOOR_PID=""; FLOOR_MNT=$WORK/mnt-floor
# The FUSE floor's server: started, waited for until mounted; stopped (SIGTERM, then SIGKILL) and
# its mount removed if it is still there.
start_floor() {
  mkdir -p "$FLOOR_MNT" "$WORK/floor-files"
  "$BIN/granary-fuse-floor" serve "$FLOOR_MNT" --writes "$WORK/floor-files" > "$WORK/floor.log" 2>&1 &
  FLOOR_PID=$!
  for _ in $(seq 200); do grep -q " $FLOOR_MNT " /proc/mounts && break; kill -0 "$FLOOR_PID" 2>/dev/null || break; sleep 0.05; done
  grep -q " $FLOOR_MNT " /proc/mounts || { echo "error: granary-fuse-floor did not mount:" >&2; cat "$WORK/floor.log" >&2; exit 1; }
}
stop_floor() {
  if [ -n "$FLOOR_PID" ] && kill -0 "$FLOOR_PID" 2>/dev/null; then
    kill -TERM "$FLOOR_PID" 2>/dev/null || true
    for _ in $(seq 200); do kill -0 "$FLOOR_PID" 2>/dev/null || break; sleep 0.05; done
    kill -9 "$FLOOR_PID" 2>/dev/null || true
    wait "$FLOOR_PID" 2>/dev/null || true
  fi
  FLOOR_PID=""
  if grep -q " $FLOOR_MNT " /proc/mounts 2>/dev/null; then fusermount3 -u -z "$FLOOR_MNT" 2>/dev/null || umount -l "$FLOOR_MNT" 2>/dev/null || true; fi
}
cleanup() { set +e; stop_floor; stop_local; [ "$KEEP" = 1 ] || [ "$OURS" = 0 ] || rm -rf "$WORK"; }
trap cleanup EXIT
trap 'exit 130' INT TERM

field() { $PY -c 'import json,sys; v=json.loads(sys.stdin.read().strip().splitlines()[-1])[sys.argv[1]]; print("nan" if v is None else v)' "$1"; }
median() { printf '%s\n' "$@" | sort -g | awk '{a[NR]=$1} END {print (NR % 2) ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2}'; }
FS=$(df -T "$WORK" | awk 'NR==2 {print $2" ("$1")"}')
echo "writes: $FILES small files x $RUNS runs, a $SIZE_MB MiB checkpoint; everything on $WORK, $FS" >&2

DATA=$WORK/data
GEN=$($PY "$IO" gen "$DATA" "$FILES" 50)
SMALL_BYTES=$(echo "$GEN" | field bytes)
tar -cf "$WORK/small.tar" -C "$DATA" .
cat "$WORK/small.tar" > /dev/null

# One small-file writer into DEST (a new folder); prints the helper's JSON line. UPLOAD: the
# folder in the store whose upload is waited for and timed from the writer's end ("" for none).
write_small() {  # WRITER DEST UPLOAD [--fsync]
  local w=$1 d=$2 up=$3; shift 3
  local wait=(); [ -n "$up" ] && wait=(--upload "$DATA" "$up")
  sync
  case "$w" in
    tar) mkdir "$d"; $PY "$IO" "${wait[@]}" tar "$WORK/small.tar" "$d";;
    tarfile) mkdir "$d"; $PY "$IO" "${wait[@]}" extract "$WORK/small.tar" "$d" "$@";;
    copytree) $PY "$IO" "${wait[@]}" copytree "$DATA" "$d" "$@";;
  esac
}

declare -A T  # T[writer,target] = median seconds; T[writer,back-upload] likewise
BAD=0; C_THROUGH=""; C_BACK=""; C_UPLOAD=""
check() {  # SRC DEST LABEL: every byte compared
  local r
  if ! r=$($PY "$IO" verify "$1" "$2"); then echo "WRONG BYTES in $3: $r" >&2; BAD=$((BAD + 1)); fi
}

# Local disk, without and with an fsync per file.
mkdir -p "$WORK/local"
for w in tar tarfile copytree; do
  for target in local local+fsync; do
    [ "$w" = tar ] && [ "$target" = local+fsync ] && continue
    s=()
    for r in $(seq "$RUNS"); do
      d="$WORK/local/$w-$target-$r"
      s+=("$(write_small "$w" "$d" "" $([ "$target" = local+fsync ] && echo --fsync) | field seconds)")
      check "$DATA" "$d" "$d"
    done
    T[$w,$target]=$(median "${s[@]}")
    echo "  $w, $target: ${s[*]} s" >&2
  done
done
rm -rf "$WORK/local"

# The FUSE floor: the same writers into the minimal writable server; every byte read back through it.
start_floor
for w in tar tarfile copytree; do
  s=()
  for r in $(seq "$RUNS"); do
    d="$FLOOR_MNT/$w-$r"
    s+=("$(write_small "$w" "$d" "" | field seconds)")
    check "$DATA" "$d" "$w-$r read through the FUSE floor"
  done
  T[$w,floor]=$(median "${s[@]}")
  echo "  $w, fuse floor: ${s[*]} s" >&2
done
# The checkpoint into the floor: what any FUSE filesystem's direct_io writes cost here (no fsync:
# an upper bound for both write=through and write=back's close).
sync
C_FLOOR=$($PY "$IO" ckpt "$FLOOR_MNT/ckpt.pt" "$SIZE_MB" | field seconds)
FLOOR_SHA=$($PY "$IO" sha "$FLOOR_MNT/ckpt.pt")  # compared once the local checkpoint's hash is known
echo "  checkpoint, fuse floor: ${C_FLOOR}s" >&2
stop_floor
rm -rf "$WORK/floor-files" "$FLOOR_MNT"

# The checkpoint on local disk, then copied into a store folder directly.
mkdir -p "$WORK/ckpt" "$WORK/direct"
sync
LOCAL=$($PY "$IO" ckpt "$WORK/ckpt/ckpt.pt" "$SIZE_MB")
C_LOCAL=$(echo "$LOCAL" | field seconds); WANT=$(echo "$LOCAL" | field sha256)
[ "$FLOOR_SHA" = "$WANT" ] || { echo "WRONG BYTES in the floor's checkpoint" >&2; BAD=$((BAD + 1)); }
sync
C_DIRECT=$($PY "$IO" copy "$WORK/ckpt/ckpt.pt" "$WORK/direct/ckpt.pt" | field seconds)
[ "$($PY "$IO" sha "$WORK/direct/ckpt.pt")" = "$WANT" ] || { echo "WRONG BYTES in the direct copy" >&2; BAD=$((BAD + 1)); }
rm -rf "$WORK/ckpt" "$WORK/direct"
echo "  checkpoint: local ${C_LOCAL}s, direct copy ${C_DIRECT}s" >&2

# Granary, one mode after the other: `granary local` over an empty store folder.
for mode in back through; do
  STORE=$WORK/store-$mode; MNT=$WORK/mnt-$mode
  mkdir -p "$STORE" "$MNT"
  start_local "$WORK/local-$mode.log" "file://$STORE" "$MNT" --dir "$WORK/state-$mode" -o write=$mode \
    --master.metrics_listen 127.0.0.1:0 --worker.metrics_listen 127.0.0.1:0
  for w in tar tarfile copytree; do
    s=(); u=()
    for r in $(seq "$RUNS"); do
      if [ "$mode" = back ]; then
        R=$(write_small "$w" "$MNT/$w-$r" "$STORE/$w-$r") || { echo "uploads did not finish: $R" >&2; BAD=$((BAD + 1)); }
        u+=("$(echo "$R" | field upload_seconds)")
      else
        R=$(write_small "$w" "$MNT/$w-$r" "")
      fi
      s+=("$(echo "$R" | field seconds)")
      check "$DATA" "$STORE/$w-$r" "the store's $w-$r ($mode)"
      check "$DATA" "$MNT/$w-$r" "$w-$r read through the mount ($mode)"
    done
    T[$w,$mode]=$(median "${s[@]}")
    [ "$mode" = back ] && T[$w,back-upload]=$(median "${u[@]}")
    echo "  $w, write=$mode: ${s[*]} s$([ "$mode" = back ] && echo " (then uploaded in ${u[*]} s)")" >&2
  done
  sync
  if [ "$mode" = back ]; then
    R=$($PY "$IO" --upload $((SIZE_MB << 20)) "$STORE/ckpt.pt" ckpt "$MNT/ckpt.pt" "$SIZE_MB") ||
      { echo "the checkpoint's upload did not finish: $R" >&2; BAD=$((BAD + 1)); }
    C_BACK=$(echo "$R" | field seconds); C_UPLOAD=$(echo "$R" | field upload_seconds)
  else
    R=$($PY "$IO" ckpt "$MNT/ckpt.pt" "$SIZE_MB")
    C_THROUGH=$(echo "$R" | field seconds)
  fi
  [ "$($PY "$IO" sha "$STORE/ckpt.pt")" = "$WANT" ] || { echo "WRONG BYTES in the store's checkpoint ($mode)" >&2; BAD=$((BAD + 1)); }
  echo "  checkpoint, write=$mode: $(echo "$R" | field seconds)s$([ "$mode" = back ] && echo ", uploaded ${C_UPLOAD}s after close")" >&2
  stop_local
  rm -rf "$STORE" "$WORK/state-$mode"
done

$PY - "$FILES" "$SMALL_BYTES" "$RUNS" "$SIZE_MB" "$FS" "$BAD" "$C_LOCAL" "$C_DIRECT" "$C_THROUGH" "$C_BACK" "$C_UPLOAD" "$C_FLOOR" \
  "$(for k in "${!T[@]}"; do echo "$k=${T[$k]}"; done)" <<'PY'
import sys
files, small_bytes, runs, mb = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
fs, bad = sys.argv[5], int(sys.argv[6])
num = lambda x: float(x) if x else float("nan")  # nan: a step that failed (then bad > 0)
c_local, c_direct, c_through, c_back, c_upload, c_floor = map(num, sys.argv[7:13])
t = {}
for line in sys.argv[13].split("\n"):
    k, v = line.split("=")
    w, target = k.split(",")
    t[(w, target)] = num(v)
met = lambda r, goal: f"{r:.2f}x {'met' if r >= goal else 'MISSED'}"
print(f"| {files} files of 1-40 KiB ({small_bytes / 1e6:.1f} MB), median of {runs}, on {fs} | local | local+fsync "
      "| FUSE floor | write=through | write=back | back: then uploaded | through / local+fsync (>= 0.5) "
      "| back / local (>= 0.5) | floor / local | back / floor |")
print("|---|---:|---:|---:|---:|---:|---:|---|---|---:|---:|")
names = {"tar": "`tar x` (GNU tar)", "tarfile": "`tarfile.extractall`", "copytree": "`shutil.copytree`"}
for w in ("tar", "tarfile", "copytree"):
    fsync_base = t.get((w, "local+fsync"), t[("tarfile", "local+fsync")])
    lf = f"{t[(w, 'local+fsync')]:.3f} s" if (w, "local+fsync") in t else "(tarfile's)"
    print(f"| {names[w]} | {t[(w, 'local')]:.3f} s | {lf} | {t[(w, 'floor')]:.3f} s | {t[(w, 'through')]:.3f} s "
          f"| {t[(w, 'back')]:.3f} s | +{t[(w, 'back-upload')]:.3f} s | {met(fsync_base / t[(w, 'through')], 0.5)} "
          f"| {met(t[(w, 'local')] / t[(w, 'back')], 0.5)} | {t[(w, 'local')] / t[(w, 'floor')]:.2f}x "
          f"| {t[(w, 'floor')] / t[(w, 'back')]:.2f}x |")
per_file = lambda s: f"{s / files * 1000:.2f} ms a file"
print(f"(tar x per file: local {per_file(t[('tar', 'local')])}, FUSE floor {per_file(t[('tar', 'floor')])}, "
      f"through {per_file(t[('tar', 'through')])}, back {per_file(t[('tar', 'back')])}; "
      f"tarfile with an fsync per file locally: {per_file(t[('tarfile', 'local+fsync')])})")
print()
mbs = lambda s: mb * 1.048576 / s
print(f"| {mb} MiB checkpoint | seconds | MB/s | ratio | target |")
print("|---|---:|---:|---:|---|")
print(f"| local disk (close returned) | {c_local:.2f} | {mbs(c_local):.0f} | | |")
print(f"| direct copy into the store folder, fsynced | {c_direct:.2f} | {mbs(c_direct):.0f} | | |")
print(f"| FUSE floor (close returned, no fsync) | {c_floor:.2f} | {mbs(c_floor):.0f} | {c_direct / c_floor:.2f}x direct | |")
print(f"| write=through (close returned: in the store) | {c_through:.2f} | {mbs(c_through):.0f} | {met(c_direct / c_through, 0.9)} direct | >= 0.9 |")
print(f"| write=back (close returned: staged) | {c_back:.2f} | {mbs(c_back):.0f} | {met(c_local / c_back, 0.8)} local | >= 0.8 |")
print(f"| write=back upload (after close) | {c_upload:.2f} | {mbs(c_upload):.0f} | {met(c_direct / c_upload, 0.9)} direct | >= 0.9 |")
print(f"wrong: {bad}")
print(f"back small {t[('tar', 'local')] / t[('tar', 'back')]:.2f}x local, "
      f"through small {t[('tarfile', 'local+fsync')] / t[('tar', 'through')]:.2f}x local+fsync, "
      f"through ckpt {c_direct / c_through:.2f}x direct, back ckpt close {c_local / c_back:.2f}x local, "
      f"back ckpt upload {c_direct / c_upload:.2f}x direct, "
      f"fuse floor small {t[('tar', 'local')] / t[('tar', 'floor')]:.2f}x local, "
      f"back small {t[('tar', 'floor')] / t[('tar', 'back')]:.2f}x floor, "
      f"fuse floor ckpt {c_direct / c_floor:.2f}x direct, through ckpt {c_floor / c_through:.2f}x floor")
sys.exit(1 if bad else 0)
PY
