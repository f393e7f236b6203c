#!/usr/bin/env bash
# The README's test command: set up (tools/setup.sh), build everything, run the whole suite.
#
#   tools/test.sh [--sanitize] [--fuzz SECONDS] [ctest arguments, e.g. -L unit]
#
# --sanitize     first: the unit suite built with ASan + UBSan (preset sanitize, build-sanitize/),
#                run with the suppressions in tools/check/sanitizers/ (none needed today)
# --fuzz SECONDS first: every libFuzzer target for SECONDS on its corpus (tools/fuzz/run.sh)
# CI (.ci/run) passes both. The whole suite always runs last, so the last line is its summary.
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
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
# Each stage's own time, for the CI log.
stage() {
  echo "== $1: $(( $(date +%s) - stage_start )) s"
  stage_start=$(date +%s)
}
stage_start=$(date +%s)
cmake --build --preset default
stage "build"
if [ "$sanitize" = 1 ]; then
  tools/check/sanitized_unit_suite.sh
  stage "unit suite under ASan + UBSan"
fi
if [ "$fuzz_seconds" != 0 ]; then
  TESSERA_FUZZ_SEED=${TESSERA_FUZZ_SEED:-1} tools/fuzz/run.sh "$fuzz_seconds"
  stage "fuzzing"
fi
ctest --preset default ${ctest_args[@]+"${ctest_args[@]}"}
