#!/usr/bin/env bash
# On a lent GPU machine (the device tool's `run`, in a copy of this repository): builds Tessera
# against the machine's own torch and does what docs/gpu.md lists, stage by stage.
#
#   tools/device/gpu.sh [STAGE...]          default: every stage, in this order
#
#   env         the machine: GPU, driver, torch, CUDA, compiler, cmake
#   build       unpacks .device/debs into $TESSERA_DEBS (default /tmp/tessera-debs), links .venv
#               to the Python that holds torch, configures (preset default) and builds everything;
#               a no-op where build/ is already built (a warm machine keeps it between calls)
#   test        the whole suite (ctest), then the CUDA-only tests again, verbosely: the stage
#               fails if any of them was skipped
#   quickstart  configs/quickstart.yaml on cuda, fp32 then bf16
#   gpt2        configs/gpt2-124m.yaml for $GPT2_STEPS steps (default 300)
#   bench       tools/bench/vs_pytorch --device cuda: quickstart (bf16 also with trainer.cuda_graph),
#               then GPT-2 124M in bf16 at micro-batch $GPT2_BATCH (default 16)
#   memory      tools/bench/memory --device cuda --precision bf16
#   profile     GPT-2 124M with the profiler callback (kineto) over steps 6-7, summarised by
#               tools/bench/trace_summary.py
#
# Prepare here first (tools/device/prepare.sh), then e.g.
#   run(command="tools/device/gpu.sh build test", carry=[".device"], timeout_s=600)
# Everything goes to standard output and runs/device/ (a log per stage, the runs' metrics and
# traces). Where $OUT is set (the device tool's return folder), the whole output is written to
# $OUT/gpu.log as it happens and runs/device/ is packed into $OUT/results.tar.gz after every
# stage: a call cut off at the device tool's time limit still brings back what was done. A
# failing stage is reported and the next one runs (except after build). The exit status is the
# number of failed stages.
set -uo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$root"
results=$root/runs/device
mkdir -p "$results/logs"
debs_prefix=${TESSERA_DEBS:-/tmp/tessera-debs}
gpt2_steps=${GPT2_STEPS:-300}
gpt2_batch=${GPT2_BATCH:-16}
stages=("$@")
[ ${#stages[@]} -gt 0 ] || stages=(env build test quickstart gpt2 bench memory profile)

# The carried Debian packages, unpacked into a private prefix; CMake, pkg-config and the loader
# look there. Done by every call before its first stage: a fresh machine has nothing of an
# earlier call.
use_debs() {
  if [ ! -d "$debs_prefix/usr" ]; then
    compgen -G ".device/debs/*.deb" >/dev/null ||
      { echo "gpu.sh: no .device/debs here: run tools/device/prepare.sh, then carry .device" >&2; return 1; }
    mkdir -p "$debs_prefix"
    for f in .device/debs/*.deb; do dpkg -x "$f" "$debs_prefix"; done
  fi
  local lib=$debs_prefix/usr/lib/x86_64-linux-gnu
  export CMAKE_PREFIX_PATH=$debs_prefix/usr${CMAKE_PREFIX_PATH:+:$CMAKE_PREFIX_PATH}
  export LD_LIBRARY_PATH=$lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  export PKG_CONFIG_LIBDIR=$lib/pkgconfig:$debs_prefix/usr/share/pkgconfig
  export PKG_CONFIG_SYSROOT_DIR=$debs_prefix
  export PKG_CONFIG=$debs_prefix/usr/bin/pkgconf
  [ -d /usr/local/cuda/bin ] && export PATH=/usr/local/cuda/bin:$PATH
  # The tests that read Debian's fortunes look in /usr/share/games/fortunes.
  if [ ! -e /usr/share/games/fortunes ] && [ -w /usr/share ]; then
    mkdir -p /usr/share/games && ln -s "$debs_prefix/usr/share/games/fortunes" /usr/share/games/fortunes
  fi
  # The quickstart's token files, carried in .device/data.
  if [ ! -f data/fortunes/train.bin ] && [ -d .device/data/fortunes ]; then
    mkdir -p data && cp -r .device/data/fortunes data/
  fi
  # The tests and tools/bench use .venv/bin/python3: here, the machine's Python with torch.
  if [ ! -e .venv ]; then
    local prefix
    prefix=$(python3 -c 'import torch, sys; print(sys.prefix)') ||
      { echo "gpu.sh: this machine's python3 has no torch to build against" >&2; return 1; }
    ln -s "$prefix" .venv
  fi
}

stage_env() {
  nvidia-smi || true
  .venv/bin/python3 -c 'import torch; print("torch", torch.__version__, "CUDA", torch.version.cuda, "NCCL",
torch.cuda.nccl.version() if torch.cuda.is_available() else "-", "GPU",
torch.cuda.get_device_name() if torch.cuda.is_available() else "none")'
  nvcc --version | tail -2
  c++ --version | head -1
  cmake --version | head -1
  nproc
}

stage_build() {
  if [ ! -f build/CMakeCache.txt ]; then
    cmake --preset default -DCMAKE_PREFIX_PATH="$CMAKE_PREFIX_PATH" -DPKG_CONFIG_EXECUTABLE="$PKG_CONFIG" || return 1
  fi
  time cmake --build --preset default || return 1
  # Which packages the configure found, to show they are the carried ones.
  grep -E "^(yaml-cpp|spdlog|fmt|GTest|nlohmann_json|Boost|Torch)_DIR:" build/CMakeCache.txt
}

stage_test() {
  local status=0
  # Under the device tool's 600 s a call: a hung test fails alone, the call still reports.
  ctest --preset default -j 8 --timeout 300 || status=1
  # The CUDA-only tests again, verbosely: none may be skipped on a GPU machine.
  local log=$results/logs/cuda_tests.log
  build/bin/tessera_unit_tests --gtest_filter='CudaStep.*:*Cuda*:*Nccl*' 2>&1 | tee "$log" || status=1
  if grep -q "SKIPPED" "$log"; then
    echo "gpu.sh: CUDA-only tests were skipped on a GPU machine:"; grep "SKIPPED" "$log"
    status=1
  fi
  return $status
}

stage_quickstart() {
  local status=0
  for precision in fp32 bf16; do
    build/bin/tessera train configs/quickstart.yaml --run-dir "runs/device/quickstart-$precision" \
      --set settings.device=cuda --set settings.precision=$precision || status=1
  done
  return $status
}

# GPT-2 124M on data/gpt2/{train,val}.bin (GPT-2 token ids) where present, else on the fortunes
# bytes (ids below 256 in GPT-2's 50257-id space: real text, so the loss must fall).
gpt2_data_sets() {
  if [ ! -f data/gpt2/train.bin ]; then
    echo "--set components.train_data.config.path=data/fortunes/train.bin"
    echo "--set components.callbacks.2.config.data.config.path=data/fortunes/val.bin"
  fi
}

stage_gpt2() {
  local status=0
  # One micro-batch a step (the config's 32 are 0.5M tokens), warmup scaled to the short run.
  build/bin/tessera train configs/gpt2-124m.yaml --run-dir runs/device/gpt2 $(gpt2_data_sets) \
    --set trainer.max_steps="$gpt2_steps" --set trainer.grad_accum=1 \
    --set components.scheduler.config.warmup_steps=30 --set checkpoint.every_steps=0 \
    --set checkpoint.at_end=false --set checkpoint.export_at_end=false || status=1
  return $status
}

stage_bench() {
  local status=0
  .venv/bin/python3 tools/bench/vs_pytorch --device cuda --precision fp32 --model quickstart --steps 80 --rounds 3 || status=1
  .venv/bin/python3 tools/bench/vs_pytorch --device cuda --precision bf16 --model quickstart --steps 80 --rounds 3 || status=1
  # The small model is where launch overhead shows: again with the micro-batches replayed from a CUDA graph.
  .venv/bin/python3 tools/bench/vs_pytorch --device cuda --precision bf16 --model quickstart --steps 80 --rounds 3 \
    --tessera-set trainer.cuda_graph=true || status=1
  .venv/bin/python3 tools/bench/vs_pytorch --device cuda --precision bf16 --model gpt2-124m --batch "$gpt2_batch" \
    --steps 40 --skip 10 --rounds 2 || status=1
  return $status
}

stage_memory() {
  .venv/bin/python3 tools/bench/memory --device cuda --precision bf16
}

stage_profile() {
  local status=0
  build/bin/tessera train configs/gpt2-124m.yaml --run-dir runs/device/profile $(gpt2_data_sets) \
    --set trainer.max_steps=8 --set trainer.grad_accum=1 --set checkpoint.every_steps=0 \
    --set checkpoint.at_end=false --set checkpoint.export_at_end=false \
    --set 'components.callbacks=[{component_key: callback, variant_key: console_logger, config: {every: 1}},
           {component_key: callback, variant_key: profiler, config: {start_step: 6, steps: 2, backend: kineto}}]' \
    || status=1
  # Where the two steps' time went (GPU busy share, gaps, host waits, copies, top kernels).
  for trace in runs/device/profile/profiles/rank_0/*.json; do
    python3 tools/bench/trace_summary.py "$trace" --top 25 || status=1
  done
  return $status
}

for stage in "${stages[@]}"; do
  if ! declare -F "stage_$stage" >/dev/null; then
    echo "gpu.sh: unknown stage '$stage' (env build test quickstart gpt2 bench memory profile)" >&2
    exit 64
  fi
done

# Metrics, logs and traces into $OUT; checkpoints and exports stay behind.
pack_results() {
  [ -n "${OUT:-}" ] || return 0
  tar -czf "$OUT/results.tar.gz.part" --exclude='checkpoints' --exclude='*.safetensors' -C "$root/runs" device &&
    mv "$OUT/results.tar.gz.part" "$OUT/results.tar.gz"
}

run_stages() {
  use_debs || return 1
  local failed=0 stage start status
  for stage in "${stages[@]}"; do
    echo "== $stage ($(date -u +%H:%M:%S))"
    start=$(date +%s)
    "stage_$stage" 2>&1 | tee "$results/logs/$stage.log"
    status=${PIPESTATUS[0]}
    echo "== $stage: $([ "$status" = 0 ] && echo ok || echo FAILED) in $(( $(date +%s) - start )) s"
    pack_results
    if [ "$status" != 0 ]; then
      failed=$((failed + 1))
      [ "$stage" = build ] && return $failed
    fi
  done
  return $failed
}

logs=("$results/logs/gpu.log")
[ -n "${OUT:-}" ] && logs+=("$OUT/gpu.log")
run_stages 2>&1 | tee "${logs[@]}"
failed=${PIPESTATUS[0]}
pack_results
exit "$failed"
