# Shared by bench/fuse_floor.sh and bench/fuse_uring.sh (sourced): the probe rounds.
#
#   probe_rounds RESULTS ROUNDS SECONDS DIR SERVER...
#
# For ROUNDS rounds, every request kind (ioctl, getattr, read4k, read128k) with 1 and 8 threads,
# probes each SERVER's mount DIR/SERVER (`small` for ioctl and getattr, `big` for READs) with
# granary-fuse-floor probe for SECONDS, the servers in the given order on odd rounds and reversed
# on even ones, and appends one JSON line per probe to RESULTS (server and round added). A SERVER
# written NAME:1 is probed with 1 thread only. Needs $BIN.
probe_rounds() {
  local results=$1 rounds=$2 secs=$3 dir=$4; shift 4
  local forward=("$@") backward=() order round op file t spec srv line
  for ((i = ${#forward[@]} - 1; i >= 0; i--)); do backward+=("${forward[i]}"); done
  for round in $(seq "$rounds"); do
    order=("${forward[@]}"); [ $((round % 2)) = 0 ] && order=("${backward[@]}")
    for op in ioctl getattr read4k read128k; do
      file=small; case $op in read*) file=big;; esac
      for t in 1 8; do
        for spec in "${order[@]}"; do
          srv=${spec%:1}
          [ "$spec" != "$srv" ] && [ "$t" != 1 ] && continue
          line=$("$BIN/granary-fuse-floor" probe --file "$dir/$srv/$file" --op "$op" --threads "$t" --seconds "$secs")
          echo "{\"server\": \"$srv\", \"round\": $round, ${line#\{}" | tee -a "$results" >&2
        done
      done
    done
  done
}
