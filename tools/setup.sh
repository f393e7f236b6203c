#!/usr/bin/env bash
# Sets up a fresh Debian machine for Tessera; safe to run again (each step checks first):
#   1. the Debian packages the build needs,
#   2. .venv/ with the torch wheel, whose bundled LibTorch we build against,
#   3. the CMake configure of build/ (preset "default").
# Falls back to Debian's libtorch-dev + libgloo-dev (LibTorch 1.13, CPU) only when the wheel
# cannot be installed, and says so.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
TORCH_VERSION=2.11.0

packages=(build-essential cmake ninja-build ccache git python3 python3-venv
          libboost-dev libboost-program-options-dev libboost-filesystem-dev libyaml-cpp-dev
          libspdlog-dev libfmt-dev libgtest-dev nlohmann-json3-dev protobuf-compiler
          libprotobuf-dev libgloo-dev fortunes libpcre2-dev libsentencepiece-dev pkg-config
          clang libclang-rt-14-dev)  # clang + libFuzzer: tools/fuzz
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing Debian packages: ${missing[*]}"
  sudo=""; [ "$(id -u)" -eq 0 ] || sudo="sudo"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${missing[@]}" >/dev/null
fi

if [ ! -x .venv/bin/python3 ]; then
  echo "setup: creating .venv"
  python3 -m venv .venv
fi
# pip byte-compiles every module here on purpose: where PYTHONDONTWRITEBYTECODE is set (as on this
# machine), a venv installed with --no-compile recompiles torch and transformers from source in
# every Python process (the interop tests each took 15-37 s longer in a CI run, to save ~20 s here).
if ! .venv/bin/python3 -c "import torch, sys; sys.exit(torch.__version__.split('+')[0] != '$TORCH_VERSION')" 2>/dev/null; then
  # The wheel and what unpacks from it take ~6 GiB, the builds and the compiler cache ~3 GiB more:
  # on a fuller disk pip fails half-way and the build fails later with a misleading error.
  free_gib=$(( $(df -Pk . | awk 'NR == 2 {print $4}') / 1048576 ))
  if [ "$free_gib" -lt 12 ]; then
    echo "setup: only $free_gib GiB free on $(df -P . | awk 'NR == 2 {print $6}'); a fresh setup needs" \
         "about 12 GiB (.venv with torch 6 GiB, builds and compiler cache 3 GiB). Free space and rerun." >&2
    exit 1
  fi
  echo "setup: installing torch==$TORCH_VERSION into .venv (its LibTorch is what Tessera links)"
  if ! .venv/bin/pip install --quiet --progress-bar off "torch==$TORCH_VERSION"; then
    echo "setup: NOTE: the torch wheel could not be installed; falling back to Debian's"
    echo "setup: libtorch-dev + libgloo-dev (LibTorch 1.13, CPU only). This path is not what CI uses."
    sudo=""; [ "$(id -u)" -eq 0 ] || sudo="sudo"
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq libtorch-dev libgloo-dev >/dev/null
  fi
fi

# pyarrow's wheel carries Apache Arrow C++ (libarrow, libparquet and their headers), which
# `tessera prepare-data` links for Parquet files and datasets folders (cmake/TesseraArrow.cmake),
# as LibTorch comes from the torch wheel; `datasets` makes the save_to_disk folders its tests read.
# Without them Tessera builds without Parquet input, and says so when given one.
if ! .venv/bin/python3 -c "import pyarrow, datasets, sys; sys.exit(pyarrow.__version__ != '26.0.1')" 2>/dev/null; then
  .venv/bin/pip install --quiet --progress-bar off "pyarrow==26.0.1" "datasets==5.2.0" ||
    echo "setup: NOTE: pyarrow/datasets could not be installed; prepare-data will not read Parquet or datasets folders"
fi
# Python's safetensors reads Tessera's model exports back in the interop test (skipped without it).
if ! .venv/bin/python3 -c "import safetensors" 2>/dev/null; then
  .venv/bin/pip install --quiet --progress-bar off "safetensors==0.4.5" ||
    echo "setup: NOTE: Python's safetensors could not be installed; the export interop test will be skipped"
fi
# transformers, tokenizers and sentencepiece are the references of the interop tests: GPT-2 and
# Llama import/export, eval and training, and the tokenizers' ids (skipped without them).
# sentencepiece is pinned to 0.1.99 because Tessera links Debian's libsentencepiece 0.1.97:
# 0.2.x breaks ties between equally scored segmentations differently (runs of spaces, for one).
if ! .venv/bin/python3 -c "import transformers, tokenizers, sentencepiece, sys; sys.exit(sentencepiece.__version__ != '0.1.99')" 2>/dev/null; then
  .venv/bin/pip install --quiet --progress-bar off "transformers==5.23.0" "tokenizers==0.23.3" "sentencepiece==0.1.99" ||
    echo "setup: NOTE: transformers/tokenizers/sentencepiece could not be installed; the interop tests will be skipped"
fi
# peft is the reference of the LoRA tests: it loads Tessera's PEFT exports over their base model.
if ! .venv/bin/python3 -c "import peft" 2>/dev/null; then
  .venv/bin/pip install --quiet --progress-bar off "peft==0.21.2" "accelerate==1.15.0" ||
    echo "setup: NOTE: peft could not be installed; the LoRA interop test will be skipped"
fi
# trl is the reference of reinforcement learning: GRPOTrainer's formulas and its step beside ours.
if ! .venv/bin/python3 -c "import trl, sys; sys.exit(trl.__version__ != '1.16.0')" 2>/dev/null; then
  .venv/bin/pip install --quiet --progress-bar off "trl==1.16.0" ||
    echo "setup: NOTE: trl could not be installed; the GRPO reference tests will be skipped"
fi
# matplotlib draws tools/plot's PNGs; tensorboard's own reader checks the event files in a test.
if ! .venv/bin/python3 -c "import matplotlib, tensorboard" 2>/dev/null; then
  .venv/bin/pip install --quiet --progress-bar off "matplotlib==3.11.2" "tensorboard==2.21.0" ||
    echo "setup: NOTE: matplotlib/tensorboard could not be installed; plots and the TensorBoard read-back test will be skipped"
fi

export CCACHE_DIR=${CCACHE_DIR:-$HOME/.cache/tessera-ccache}
# Paths relative to the checkout, so every clone (and CI) hits the same cache.
export CCACHE_BASEDIR=${CCACHE_BASEDIR:-$root}
if [ ! -f build/CMakeCache.txt ]; then
  cmake --preset default >/dev/null
  echo "setup: configured build/ (cmake --preset default)"
fi
