#!/usr/bin/env bash
# Measures the foundation's figures: a clean build of everything (no ccache) and the quickstart
# (wall time, first and last loss, tokens/s). Prints them; docs/benchmarks.md records them.
# Usage: tools/bench/foundation.sh [--skip-build]   (run after tools/setup.sh)
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$root"
echo "machine: $(nproc) cores, $(free -g | awk '/Mem:/ {print $2}') GiB, $(lscpu | sed -n 's/^Model name: *//p')"

if [ "${1:-}" != "--skip-build" ]; then
  dir=$(mktemp -d /tmp/tessera-clean-build.XXXX)
  trap 'rm -rf "$dir"' EXIT
  cmake -S . -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CXX_COMPILER_LAUNCHER= >/dev/null
  start=$(date +%s)
  CCACHE_DISABLE=1 cmake --build "$dir" >/dev/null
  echo "clean build (host, SDK, all plugins, all tests; no ccache): $(( $(date +%s) - start )) s"
fi

[ -f data/fortunes/train.bin ] || .venv/bin/python3 tools/data/text_to_tokens.py /usr/share/games/fortunes \
  --exclude art --exclude ascii-art --fortune-split --out data/fortunes >/dev/null
run=$(mktemp -d /tmp/tessera-quickstart.XXXX)
start=$(date +%s%N)
build/bin/tessera train configs/quickstart.yaml --run-dir "$run" >"$run/log" 2>&1
wall=$(( ($(date +%s%N) - start) / 1000000 ))
python3 - "$run/metrics.jsonl" "$wall" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
tps = sorted(r["tokens_per_s"] for r in rows)
print(f"quickstart: {len(rows)} steps, {rows[-1]['tokens']} tokens, wall {int(sys.argv[2]) / 1000:.1f} s "
      f"(process start to exit), train {rows[-1]['elapsed_s']:.1f} s")
print(f"quickstart loss: first step {rows[0]['loss']:.3f}, mean of last 20 steps "
      f"{sum(r['loss'] for r in rows[-20:]) / 20:.3f}; median tokens/s {tps[len(tps) // 2]:.0f}")
PY
grep "sample:" "$run/log" | cut -c1-200
rm -rf "$run"
