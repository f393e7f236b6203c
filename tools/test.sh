#!/usr/bin/env bash
# The README's test command: set up (tools/setup.sh), build everything, run the whole suite.
#
#   tools/test.sh [--sanitize] [--fuzz SECONDS] [ctest arguments, e.g. -L unit]
#
# --sanitize     first: the unit suite built with ASan + UBSan (preset sanitize: clang,
#                build-sanitize/), run with the suppressions in tools/check/sanitizers/ (none
#                needed today)
# --fuzz SECONDS first: every libFuzzer target for SECONDS on its corpus (tools/fuzz/run.sh), from
#                the same clang build as --sanitize
# CI (.ci/run) passes both. The whole suite always runs last, so the last line is its summary.
# Each stage prints its wall time as "== STAGE: N s"; tools/check/ci_stage_times.py reads them
# (and ctest's total) back from a saved log.
set -euo pipefail
sanitize=0
fuzz_seconds=0
ctest_args=()
while [ $# -gt 0 ]; do
  case "$1" in
    --sanitize) sanitize=1; shift ;;
    --fuzz) fuzz_seconds=${2:?--fuzz needs SECONDS}; shift 2 ;;
    *) ctest_args+=("$1"); shift ;;
  esac
done
# Each stage's own time, for the CI log (tools/check/ci_stage_times.py).
stage() {
  echo "== $1: $(( $(date +%s) - stage_start )) s"
  stage_start=$(date +%s)
}
stage_start=$(date +%s)
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
stage "setup"
cmake --build --preset default
stage "build"
if [ "$sanitize" = 1 ] || [ "$fuzz_seconds" != 0 ]; then
  # One clang build with ASan + UBSan (and libFuzzer's coverage on the code under test) serves
  # both stages below; built in one go so that both cores stay busy to its end.
  sanitized_targets=()
  [ "$sanitize" = 1 ] && sanitized_targets+=(tessera_unit_tests tessera)
  [ "$fuzz_seconds" != 0 ] && sanitized_targets+=(fuzzers)
  if ! configured=$(cmake --preset sanitize 2>&1); then echo "$configured" >&2; exit 2; fi
  cmake --build --preset sanitize --target "${sanitized_targets[@]}"
  stage "sanitized build (clang, ASan + UBSan)"
fi
if [ "$sanitize" = 1 ]; then
  tools/check/sanitized_unit_suite.sh
  stage "unit suite under ASan + UBSan"
fi
if [ "$fuzz_seconds" != 0 ]; then
  TESSERA_FUZZ_SEED=${TESSERA_FUZZ_SEED:-1} tools/fuzz/run.sh "$fuzz_seconds"
  stage "fuzzing"
fi
# ctest starts the tests that took longest in the last run first (build/Testing/Temporary/
# CTestCostData.txt); a fresh build starts from the times kept in tools/check/ctest_costs.txt,
# so that no long test is left to start last with one core idle beside it.
costs=build/Testing/Temporary/CTestCostData.txt
if [ ! -f "$costs" ]; then mkdir -p "$(dirname "$costs")" && cp tools/check/ctest_costs.txt "$costs"; fi
ctest --preset default ${ctest_args[@]+"${ctest_args[@]}"}
