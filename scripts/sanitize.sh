#!/usr/bin/env bash
# Runs the unit and integration tests with every binary (tests and daemons alike) built under a
# sanitizer, and fails on any report — also one written by a daemon that a test started and
# stopped, which a test's own result would not show.
#
#   scripts/sanitize.sh [asan|tsan|all] [ctest args...]
#
#   asan   AddressSanitizer + UndefinedBehaviorSanitizer (leaks included), build in build-asan/
#   tsan   ThreadSanitizer, build in build-tsan/
#   all    both, one after the other (the default)
#
# Every report goes to a file under <build>/sanitizer-logs/ (log_path), so a daemon's report is not
# lost with its stderr; the script prints them and exits 1 if there is any. The image test (it
# builds the container image with the release build) and the deploy test (manifests, no C++) are
# not run. Suppressions, each explained in a line: scripts/sanitizers/*.supp. For TSan, Debian's
# Abseil is built with TSan first (scripts/sanitizers/absl-tsan.sh: it fetches the source package,
# adding a deb-src entry if there is none). Needs what scripts/test.sh installs.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
what=${1:-all}; shift || true
case "$what" in asan|tsan|all) ;; *) sed -n '2,17p' "$0" >&2; exit 2;; esac

run() {  # KIND FLAGS
  local kind=$1 flags=$2
  local build=${SANITIZE_BUILD_ROOT:-$ROOT}/build-$kind
  local logs=$build/sanitizer-logs
  # -O1 keeps the stacks readable and the run fast enough; the sanitizer's own flags come from
  # GRANARY_SANITIZE (CMakeLists.txt). Benchmarks are built too: the metadata test runs one.
  cmake -S "$ROOT" -B "$build" -DCMAKE_BUILD_TYPE=Debug -DCMAKE_CXX_FLAGS_DEBUG="-O1 -g" \
    -DGRANARY_SANITIZE="$flags" >/dev/null
  cmake --build "$build" -j"$(nproc)"
  rm -rf "$logs"; mkdir -p "$logs"
  local supp=$ROOT/scripts/sanitizers
  # Reports are collected from the log files (a daemon's exit code is not what a test checks);
  # exitcode=0 keeps a report from turning a test's clean stop of a daemon into a second failure.
  export ASAN_OPTIONS="log_path=$logs/asan:detect_leaks=1:exitcode=0:abort_on_error=0:detect_stack_use_after_return=0:strict_string_checks=0:handle_segv=1"
  export LSAN_OPTIONS="suppressions=$supp/lsan.supp:print_suppressions=0"
  export UBSAN_OPTIONS="log_path=$logs/ubsan:print_stacktrace=1:halt_on_error=0:suppressions=$supp/ubsan.supp"
  # ignore_noninstrumented_modules: Debian builds gRPC, protobuf and RocksDB without TSan, so their
  # own synchronisation (atomics) is invisible and the memory their malloc, free and memcpy calls
  # touch would look raced; TSan then skips the accesses of calls made from such code (their locks
  # still count). Every access our code makes is still checked.
  export TSAN_OPTIONS="log_path=$logs/tsan:exitcode=0:halt_on_error=0:second_deadlock_stack=1:ignore_noninstrumented_modules=1:suppressions=$supp/tsan.supp:print_suppressions=0"
  # Under TSan, Abseil built with TSan (Debian's version, scripts/sanitizers/absl-tsan.sh) comes
  # first, so gRPC's hand-offs between its threads (absl::Mutex) are seen, not reported as races.
  local libs=${LD_LIBRARY_PATH:-}
  if [ "$kind" = tsan ]; then
    "$ROOT/scripts/sanitizers/absl-tsan.sh" "$build/absl-tsan"
    libs=$build/absl-tsan${libs:+:$libs}
  fi
  local rc=0
  (cd "$build" && LD_LIBRARY_PATH=$libs ctest --output-on-failure --timeout 1800 -E '^(image_test|deploy_test)$' "$@") || rc=$?
  unset ASAN_OPTIONS LSAN_OPTIONS UBSAN_OPTIONS TSAN_OPTIONS
  local reports
  reports=$(find "$logs" -type f -size +0 | sort)
  if [ -n "$reports" ]; then
    echo "sanitize $kind: $(echo "$reports" | wc -l) report file(s):" >&2
    for f in $reports; do echo "==== $f" >&2; head -c 20000 "$f" >&2; done
    rc=1
  fi
  if [ "$rc" = 0 ]; then echo "sanitize $kind: the unit and integration tests pass, no report"; fi
  return "$rc"
}

rc=0
if [ "$what" = asan ] || [ "$what" = all ]; then run asan "address,undefined" "$@" || rc=1; fi
if [ "$what" = tsan ] || [ "$what" = all ]; then run tsan "thread" "$@" || rc=1; fi
exit "$rc"
