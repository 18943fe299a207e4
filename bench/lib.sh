# Sourced by the bench scripts that run `granary local`: find the build and a work directory, start
# `granary local` in the background and wait for its mount, stop it and unmount (safe to call from
# an EXIT trap, and more than once).

# Sets ROOT, BIN (from $BUILD or ROOT/build; exits unless it has granary and granary-train-read)
# and WORK ($WORK or a new directory named after PREFIX), and points GRANARY_HOME into WORK.
bench_setup() {  # PREFIX
  ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
  BIN=${BUILD:-$ROOT/build}/bin
  for b in granary granary-train-read; do
    [ -x "$BIN/$b" ] || { echo "error: $BIN/$b not found; build first (scripts/build.sh)" >&2; exit 1; }
  done
  WORK=${WORK:-$(mktemp -d "/tmp/$1-XXXXXX")}
  mkdir -p "$WORK"
  export GRANARY_HOME=$WORK/home
}

# Needs MNT (the mount point); sets LOCAL_PID.
LOCAL_PID=""

start_local() {  # LOG ARGS... — runs `granary local ARGS...`, output to LOG
  local log=$1; shift
  "$BIN/granary" local "$@" > "$log" 2>&1 &
  LOCAL_PID=$!
  for _ in $(seq 600); do grep -q " $MNT " /proc/mounts && break; kill -0 "$LOCAL_PID" 2>/dev/null || break; sleep 0.05; done
  grep -q " $MNT " /proc/mounts || { echo "error: granary local did not mount:" >&2; cat "$log" >&2; exit 1; }
}

stop_local() {
  if [ -n "$LOCAL_PID" ] && kill -0 "$LOCAL_PID" 2>/dev/null; then
    kill -INT "$LOCAL_PID" 2>/dev/null || true
    for _ in $(seq 200); do kill -0 "$LOCAL_PID" 2>/dev/null || break; sleep 0.05; done
    kill -9 "$LOCAL_PID" 2>/dev/null || true
  fi
  LOCAL_PID=""
  if grep -q " $MNT " /proc/mounts 2>/dev/null; then fusermount3 -u -z "$MNT" 2>/dev/null || umount -l "$MNT" 2>/dev/null || true; fi
}
