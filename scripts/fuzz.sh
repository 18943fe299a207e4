#!/usr/bin/env bash
# Builds the libFuzzer targets (tests/fuzz) with Debian's clang, ASan and UBSan into build-fuzz/,
# and runs each for a while on its checked-in corpus (tests/fuzz/corpus/<target>/; new inputs it
# finds go to build-fuzz/corpus/<target>/, never into the source tree). Fails on any crash, memory
# error, UB, leak (-detect_leaks=1), hang (-timeout) or memory blow-up (-rss_limit_mb); the input
# that did it is saved under build-fuzz/artifacts/<target>/ and printed as a command to replay.
#
#   scripts/fuzz.sh [--seconds N] [TARGET...]     N per target (default 20); all targets by default
#   scripts/fuzz.sh --replay TARGET FILE          runs one input (a found crash, a corpus file)
#   scripts/fuzz.sh --merge [TARGET...]           adds what earlier runs found and that covers something
#                                                 new to the checked-in corpus (-merge=1; files found-*)
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BUILD=${FUZZ_BUILD_DIR:-$ROOT/build-fuzz}
SECONDS_EACH=20
REPLAY=()
MERGE=0
targets=()
while [ $# -gt 0 ]; do
  case "$1" in
    --seconds) SECONDS_EACH=$2; shift 2;;
    --replay) REPLAY=("$2" "$3"); shift 3;;
    --merge) MERGE=1; shift;;
    -h|--help) sed -n '2,10p' "$0"; exit 0;;
    *) targets+=("$1"); shift;;
  esac
done
command -v clang++ >/dev/null || bash "$ROOT/scripts/apt-ensure.sh" clang
CXX=clang++ cmake -S "$ROOT" -B "$BUILD" -DCMAKE_BUILD_TYPE=Debug -DCMAKE_CXX_FLAGS_DEBUG="-O1 -g" \
  -DGRANARY_FUZZ=ON -DGRANARY_BUILD_TESTS=OFF -DGRANARY_BUILD_BENCH=OFF >/dev/null
cmake --build "$BUILD" -j"$(nproc)" --target fuzzers
export ASAN_OPTIONS="detect_leaks=1:abort_on_error=0"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"
if [ ${#REPLAY[@]} -gt 0 ]; then
  exec "$BUILD/bin/${REPLAY[0]}" "${REPLAY[1]}"
fi
if [ ${#targets[@]} -eq 0 ]; then
  for d in "$ROOT"/tests/fuzz/corpus/*/; do targets+=("$(basename "$d")"); done
fi
if [ "$MERGE" = 1 ]; then
  for t in "${targets[@]}"; do
    seeds=$ROOT/tests/fuzz/corpus/$t; new=$BUILD/merge/$t
    rm -rf "$new"; mkdir -p "$new"
    ASAN_OPTIONS=detect_leaks=0 "$BUILD/bin/$t" -merge=1 "$new" "$seeds" "$BUILD/corpus/$t" > "$BUILD/logs/$t.merge.log" 2>&1
    for f in "$new"/*; do [ -e "$f" ] || continue; cp -n "$f" "$seeds/found-$(basename "$f")"; done
    echo "fuzz merge $t: corpus now $(ls "$seeds" | wc -l) files"
  done
  exit 0
fi
failed=()
for t in "${targets[@]}"; do
  seeds=$ROOT/tests/fuzz/corpus/$t
  [ -d "$seeds" ] || { echo "error: no corpus for $t (tests/fuzz/corpus/$t)" >&2; exit 2; }
  work=$BUILD/corpus/$t; art=$BUILD/artifacts/$t; log=$BUILD/logs/$t.log
  mkdir -p "$work" "$art" "$(dirname "$log")"
  # -timeout: one input may take at most 10 s (a hang); -rss_limit_mb: 2 GiB; -max_len: 64 KiB.
  if "$BUILD/bin/$t" -max_total_time="$SECONDS_EACH" -timeout=10 -rss_limit_mb=2048 -max_len=65536 \
       -print_final_stats=1 -artifact_prefix="$art/" "$work" "$seeds" > "$log" 2>&1; then
    runs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$' || echo "?")
    echo "fuzz $t: $runs inputs in ${SECONDS_EACH}s, no finding (corpus $(ls "$seeds" | wc -l) seeds + $(ls "$work" | wc -l) found)"
  else
    echo "fuzz $t: FAILED; the last of its log ($log):" >&2
    tail -60 "$log" >&2
    for a in "$art"/*; do [ -e "$a" ] && echo "  replay: bash scripts/fuzz.sh --replay $t $a" >&2; done
    failed+=("$t")
  fi
done
if [ ${#failed[@]} -gt 0 ]; then echo "fuzz: ${failed[*]} failed" >&2; exit 1; fi
echo "fuzz: ${#targets[@]} targets, no finding"
