#!/usr/bin/env bash
# Times a cold CI run the way CI runs it: a fresh clone of REV (default HEAD) with a read-only copy
# of ../shared beside it, an empty compiler cache, CI=true and no standard input, then
# `bash .ci/run`. Prints the exit status, the wall time and the stage times
# (tools/check/ci_stage_times.py on the run's own output, kept in WORK/ci.log).
# pip's cache is left as it is: the torch wheel's download is not part of the figure.
# The clone, its .venv, builds and compiler cache (~7.5 GiB) are removed afterwards; ci.log stays.
# Usage: tools/bench/ci_cold.sh [REV] [WORK]   (WORK default: a new folder under /tmp; takes the
# machine for the whole run: ~40 minutes on 2 cores; run nothing else meanwhile)
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
rev=$(git -C "$root" rev-parse --short "${1:-HEAD}")
work=${2:-$(mktemp -d /tmp/tessera-ci-cold.XXXX)}
git clone -q "$root" "$work/main"
git -C "$work/main" checkout -q "$rev"
cp -r "$root/../shared" "$work/shared"
chmod -R a-w "$work/shared"
echo "commit $rev, $(date -u '+%F %H:%M') UTC, $(nproc) cores, $(free -g | awk '/Mem:/ {print $2}') GiB," \
     "$(lscpu | sed -n 's/^Model name: *//p'), gcc $(c++ -dumpfullversion), clang $(clang++ -dumpversion)"
start=$(date +%s)
rc=0
(cd "$work/main" && CI=true CCACHE_DIR="$work/ccache" bash .ci/run </dev/null >"$work/ci.log" 2>&1) || rc=$?
echo ".ci/run exited $rc after $(( $(date +%s) - start )) s (its output: $work/ci.log)"
python3 "$root/tools/check/ci_stage_times.py" "$work/ci.log"
chmod -R u+w "$work/shared"
rm -rf "$work/main" "$work/shared" "$work/ccache"
