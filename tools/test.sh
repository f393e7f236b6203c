#!/usr/bin/env bash
# The README's test command: set up (tools/setup.sh), build everything, run the whole suite.
# Extra arguments go to ctest, e.g. tools/test.sh -L unit
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
start=$(date +%s)
cmake --build --preset default
echo "build: $(( $(date +%s) - start )) s"
ctest --preset default "$@"
