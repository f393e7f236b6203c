#!/usr/bin/env bash
# Here, on this CPU machine: the GPU lease's one command, rehearsed as the GPU machine will run
# it. Builds the bundle (tools/device/bundle.sh), copies what a device call carries (the working
# tree's tracked and unignored files, plus .device) into a fresh folder, and runs
# tools/device/gpu.sh there in a clean environment: no variables but a minimal PATH whose python3
# is .venv's (the GPU machine's python3 holds torch), the loader finding our libraries only in the
# bundle (gpu.sh's bundle stage checks with ldd that every one resolves from the bundle, torch or
# the base system). CUDA stages say "skipped: no GPU" and run briefly on the CPU instead. Prints
# each stage's wall time; exits non-zero when a stage failed.
#   tools/device/rehearse.sh [--keep] [STAGE...]      (stages as gpu.sh's; default all)
set -euo pipefail
keep=0
[ "${1:-}" = "--keep" ] && { keep=1; shift; }
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$root"
tools/device/bundle.sh

work=$(mktemp -d /tmp/tessera-rehearse.XXXXXX)
[ "$keep" = 1 ] || trap 'rm -rf "$work"' EXIT
mkdir -p "$work/repo" "$work/out" "$work/bin" "$work/home"
git ls-files -z -co --exclude-standard | tar --null -T - -cf - | tar -xf - -C "$work/repo"
cp -r .device "$work/repo/.device"
# The GPU machine's python3 is the one holding torch: here, .venv's.
printf '#!/bin/sh\nexec %s "$@"\n' "$root/.venv/bin/python3" > "$work/bin/python3"
chmod +x "$work/bin/python3"
echo "rehearse: a fresh copy in $work/repo ($(du -sh "$work/repo" | cut -f1) with .device); running gpu.sh there"
start=$(date +%s)
set +e
(cd "$work/repo" && env -i HOME="$work/home" PATH="$work/bin:/usr/local/bin:/usr/bin:/bin" LANG=C.UTF-8 \
   OUT="$work/out" TMPDIR="$work" bash tools/device/gpu.sh "$@")
status=$?
set -e
echo
echo "rehearse: gpu.sh took $(( $(date +%s) - start )) s and exited with $status; its stages:"
grep -E "^== [a-z_]+: " "$work/out/gpu.log" | sed 's/^== /  /'
echo "rehearse: came back in \$OUT: $(cd "$work/out" && ls | tr '\n' ' ')"
[ "$keep" = 1 ] && echo "rehearse: kept $work"
exit "$status"
