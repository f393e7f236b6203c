#!/usr/bin/env bash
# The README's test command: set up (tools/setup.sh), build everything, run the whole suite.
# Extra arguments go to ctest, e.g. tools/test.sh -L unit
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
tools/setup.sh
export CCACHE_DIR=${CCACHE_DIR:-$HOME/.cache/tessera-ccache}
# Paths relative to the checkout, so every clone (and CI) hits the same cache.
export CCACHE_BASEDIR=${CCACHE_BASEDIR:-$root}
start=$(date +%s)
cmake --build --preset default
echo "build: $(( $(date +%s) - start )) s"
ctest --preset default "$@"
