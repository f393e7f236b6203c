#!/usr/bin/env bash
# The unit suite built with ASan + UBSan (preset sanitize: clang, in build-sanitize/, the build the
# fuzz targets share) and run with the suppressions beside this script. Any report fails the run:
# UBSan halts on its first error, ASan always does, LeakSanitizer reports at exit; the shard's log
# then ends with the test that was running. Called by tools/test.sh --sanitize.
#
# The tests run in two processes, each one half of them (GoogleTest's sharding), not one process
# per test as ctest runs them: under ASan a process spends ~1.5 s loading LibTorch and the plugins
# before its first test, which was ~80 % of the stage's time over ~480 processes.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$root"
here=tools/check/sanitizers
if ! configured=$(cmake --preset sanitize 2>&1); then echo "$configured" >&2; exit 2; fi
# The unit tests, the plugins they load and the host binary; the integration tests are not built here.
cmake --build --preset sanitize --target tessera_unit_tests tessera
export ASAN_OPTIONS="detect_leaks=1:abort_on_error=1:symbolize=1:suppressions=$root/$here/asan.supp"
export LSAN_OPTIONS="suppressions=$root/$here/lsan.supp:print_suppressions=0"
export UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1:suppressions=$root/$here/ubsan.supp"
shards=2
logs=build-sanitize/unit-shards
rm -rf "$logs" && mkdir -p "$logs"
pids=()
for ((i = 0; i < shards; ++i)); do
  # In the directory ctest runs them in (the tests' binary directory).
  (cd build-sanitize/tests && GTEST_TOTAL_SHARDS=$shards GTEST_SHARD_INDEX=$i \
     timeout 1800 ../bin/tessera_unit_tests --gtest_brief=1 >"$root/$logs/shard-$i.log" 2>&1) &
  pids+=($!)
done
status=0
for ((i = 0; i < shards; ++i)); do
  if wait "${pids[$i]}"; then
    echo "sanitized unit shard $((i + 1))/$shards: $(grep -m1 -E '^\[  PASSED  \]' "$logs/shard-$i.log" || echo 'passed')"
  else
    status=1
    echo "sanitized unit shard $((i + 1))/$shards FAILED; the end of $logs/shard-$i.log:" >&2
    tail -60 "$logs/shard-$i.log" >&2
  fi
done
tests=$(cat "$logs"/shard-*.log | grep -oE '^\[==========\] [0-9]+ tests? from' | awk '{n += $2} END {print n + 0}')
echo "sanitized unit suite: $tests tests in $shards processes, $([ $status = 0 ] && echo 'no report' || echo 'FAILED')"
exit $status
