#!/usr/bin/env bash
# The data of configs/llama-tiny-bpe.yaml, from text to token files: Debian's fortunes as JSON
# lines and a 4096-id BPE trained on them (tools/data/fortunes_bpe.py, Python's tokenizers), then
# `tessera prepare-data` with that tokenizer. Then:
#   build/bin/tessera train configs/llama-tiny-bpe.yaml
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/../env.sh"
cmake --build --preset default --target tessera tessera_plugins
out=data/fortunes-bpe
.venv/bin/python3 tools/data/fortunes_bpe.py --out "$out"
for split in train val; do
  build/bin/tessera prepare-data "$out/$split.jsonl" --field text --out "$out/$split.bin" \
    --tokenizer "{variant_key: bpe, config: {path: $out/tokenizer.json}}"
done
