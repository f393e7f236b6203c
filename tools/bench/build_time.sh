#!/usr/bin/env bash
# Measures what the precompiled LibTorch headers (cmake/TesseraPch.cmake) save: two clean builds
# of everything (Release, no ccache), with TESSERA_PCH=ON and OFF, one after the other in fresh
# temporary folders. Prints each wall time and the ratio; docs/benchmarks.md records them.
# Usage: tools/bench/build_time.sh [TARGET]   (after tools/setup.sh; TARGET default: all)
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$root"
target=${1:-all}
echo "commit $(git rev-parse --short HEAD), $(date -u +%F), gcc $(c++ -dumpfullversion)"
echo "machine: $(nproc) cores, $(free -g | awk '/Mem:/ {print $2}') GiB, $(lscpu | sed -n 's/^Model name: *//p')"
declare -A seconds
for pch in ON OFF; do
  dir=$(mktemp -d /tmp/tessera-build-time.XXXX)
  cmake -S . -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=Release -DTESSERA_PCH=$pch -DCMAKE_CXX_COMPILER_LAUNCHER= \
    -DCMAKE_C_COMPILER_LAUNCHER= >/dev/null
  start=$(date +%s)
  CCACHE_DISABLE=1 cmake --build "$dir" --target "$target" >/dev/null
  seconds[$pch]=$(( $(date +%s) - start ))
  units=$(grep -c '\.o$\|\.gch$' <(cut -f4 "$dir/.ninja_log"))
  echo "clean build, TESSERA_PCH=$pch: ${seconds[$pch]} s ($units compilations, target $target, no ccache)"
  rm -rf "$dir"
done
python3 -c "print(f'with / without precompiled headers: {${seconds[ON]} / ${seconds[OFF]}:.2f}')"
