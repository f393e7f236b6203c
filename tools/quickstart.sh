#!/usr/bin/env bash
# The README's quickstart: set up, build the host and plugins, turn Debian's fortunes into
# byte tokens, train configs/quickstart.yaml on the CPU, and plot the run's metrics
# (RUN_DIR/plots/*.png). Extra arguments go to `tessera train`, e.g.
#   tools/quickstart.sh --set trainer.max_steps=50
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
cmake --build --preset default --target tessera tessera_plugins
if [ ! -f data/fortunes/train.bin ]; then
  .venv/bin/python3 tools/data/text_to_tokens.py /usr/share/games/fortunes \
    --exclude art --exclude ascii-art --fortune-split --out data/fortunes
fi
build/bin/tessera train configs/quickstart.yaml "$@"
run_dir=runs/quickstart
while [ $# -gt 0 ]; do
  if [ "$1" = "--run-dir" ] && [ $# -gt 1 ]; then run_dir=$2; fi
  shift
done
if .venv/bin/python3 -c "import matplotlib" 2>/dev/null; then
  echo "plots of $run_dir/metrics.jsonl:"
  .venv/bin/python3 tools/plot/plot_metrics.py "$run_dir"
else
  echo "quickstart: matplotlib is not installed in .venv; no plots (tools/setup.sh installs it)"
fi
