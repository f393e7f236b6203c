#!/usr/bin/env bash
# The README's quickstart: set up, build the host and plugins, turn Debian's fortunes into
# byte tokens, and train configs/quickstart.yaml on the CPU. Extra arguments go to
# `tessera train`, e.g. tools/quickstart.sh --set trainer.max_steps=50
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
cmake --build --preset default --target tessera tessera_plugins
if [ ! -f data/fortunes/train.bin ]; then
  .venv/bin/python3 tools/data/text_to_tokens.py /usr/share/games/fortunes \
    --exclude art --exclude ascii-art --fortune-split --out data/fortunes
fi
exec build/bin/tessera train configs/quickstart.yaml "$@"
