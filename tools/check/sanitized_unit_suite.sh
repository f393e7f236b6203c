#!/usr/bin/env bash
# The unit suite built with ASan + UBSan (preset sanitize, in build-sanitize/) and run with the
# suppressions beside this script. Any report fails the test that caused it: UBSan halts on its
# first error, ASan always does. Called by tools/test.sh --sanitize.
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
ctest --test-dir build-sanitize -L unit -j2 --output-on-failure --timeout 900
