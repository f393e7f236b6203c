#!/usr/bin/env bash
# On a lent GPU machine, in one device call: the whole proof of Tessera on a GPU, from the bundle
# that tools/device/bundle.sh prebuilt here (nothing is built there unless the bundle cannot load).
#
#   tools/device/gpu.sh [STAGE...]     default: env bundle cuda_tests quickstart bench profile
#                                      generate grpo
#
#   env         the machine: GPU, driver, torch, CUDA, NCCL, glibc, cores
#   bundle      .device/bundle checked against the machine (its GLIBC_/GLIBCXX_ needs, every library
#               it loads resolving from the bundle, the machine's torch or the base system) and put
#               in place as build/; where it cannot load, a build there from .device/debs instead
#               (bundle.sh carries them), said loudly
#   cuda_tests  the CUDA-only unit tests (CudaStep.*, *Cuda*, *Nccl*: NCCL at world size 1); on a
#               GPU none may skip
#   quickstart  configs/quickstart.yaml on cuda, fp32 then bf16, $QUICKSTART_STEPS steps (200)
#   bench       tools/bench/vs_pytorch --device cuda --model gpt2-124m --precision bf16 against
#               eager PyTorch and torch.compile, the largest micro-batch that fits at seq 1024
#   profile     a few GPT-2 124M steps under the profiler callback (kineto), summarised by
#               tools/bench/trace_summary.py
#   generate    tools/bench/generate_cli --device cuda --precision bf16: decode tokens/s of the
#               `tessera generate` command beside transformers' generate, batch 1 and 32
#   grpo        tools/bench/grpo --device cuda: one GRPO step beside TRL's GRPOTrainer; TRL and
#               datasets come from .device/wheels (bundle.sh) where python3 lacks them
#   memory      (not by default) tools/bench/memory --device cuda --precision bf16
#
# Without a GPU (the rehearsal, tools/device/rehearse.sh) each CUDA part says "skipped: no GPU" and
# the stage runs the same binaries and scripts briefly on the CPU instead, so that everything but
# the GPU is exercised.
#
# Time: one device call runs at most 10 minutes and a lease has 15 in all, so the script aims at
# $GPU_SH_DEADLINE_S (510 s): each stage has a budget it prints its time against and a hard limit
# (1.5 x budget), and a stage whose budget no longer fits before the deadline is skipped. The
# whole output goes to $OUT/gpu.log as it happens and runs/device/ (logs, metrics, traces) is
# packed into $OUT/results.tar.gz after every stage, so a call cut off still brings back what was
# done. The exit status is the number of failed stages.
#
#   device run(command="tools/device/gpu.sh", carry=[".device"], timeout_s=570), then give_back.
set -uo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$root"
results=$root/runs/device
mkdir -p "$results/logs"
deadline_s=${GPU_SH_DEADLINE_S:-510}
quickstart_steps=${QUICKSTART_STEPS:-200}
started=$(date +%s)
stages=("$@")
[ ${#stages[@]} -gt 0 ] || stages=(env bundle cuda_tests quickstart bench profile generate grpo)
declare -A budget=([env]=15 [bundle]=30 [cuda_tests]=90 [quickstart]=60 [bench]=210 [profile]=45 [generate]=40
                   [grpo]=60 [memory]=90)

have_gpu() { python3 -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; }
no_gpu() { echo "skipped: no GPU${1:+ ($1)}"; }

stage_env() {
  nvidia-smi 2>/dev/null || no_gpu "nvidia-smi"
  python3 -c 'import torch; print("torch", torch.__version__, "CUDA", torch.version.cuda, "NCCL",
torch.cuda.nccl.version() if torch.cuda.is_available() else "-", "GPU",
torch.cuda.get_device_name() if torch.cuda.is_available() else "none")'
  echo "$(getconf GNU_LIBC_VERSION 2>/dev/null); $(nproc) cores; $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2)"
  echo "python3 $(command -v python3); cmake $(cmake --version 2>/dev/null | head -1 | awk '{print $3}')"
  [ -f .device/bundle/manifest.txt ] && sed 's/^/bundle: /' .device/bundle/manifest.txt
  return 0
}

# The bundle in place of a build: build/ is a link to it, so build/bin/tessera, build/plugins and
# the scripts that use them work as after a build.
torch_lib() { python3 -c 'import os, torch; print(os.path.join(os.path.dirname(torch.__file__), "lib"))'; }
bundle_loads() {
  local b=.device/bundle
  [ -x "$b/bin/tessera" ] || { echo "bundle: no .device/bundle here (tools/device/bundle.sh, then carry .device)"; return 1; }
  python3 tools/device/bundle_libs.py machine-has "$b/requires.txt" || return 1
  local want got
  want=$(sed -n 's/^torch \([^ ]*\).*/\1/p' "$b/manifest.txt")
  got=$(python3 -c 'import torch; print(torch.__version__)')
  [ "$want" = "$got" ] || { echo "bundle: built against torch $want, this machine has $got"; return 1; }
  python3 tools/device/bundle_libs.py check-loads "$b" "$(torch_lib)" || return 1
}
use_bundle() {
  if [ -e build ] && [ ! -L build ]; then
    echo "bundle: build/ exists and is not the bundle's link: using it as it is"
  else
    ln -sfn .device/bundle build
  fi
  build/bin/tessera --version
}
# The fallback: the Debian packages of .device/debs unpacked into a private prefix, then a build.
build_here() {
  echo "bundle: THE BUNDLE CANNOT LOAD ON THIS MACHINE: building here instead (minutes of the lease)"
  compgen -G ".device/debs/*.deb" >/dev/null ||
    { echo "bundle: no .device/debs to build with (tools/device/bundle.sh without --without-debs)"; return 1; }
  local prefix=/tmp/tessera-debs lib=/tmp/tessera-debs/usr/lib/x86_64-linux-gnu
  mkdir -p "$prefix" && for f in .device/debs/*.deb; do dpkg -x "$f" "$prefix"; done
  export CMAKE_PREFIX_PATH=$prefix/usr LD_LIBRARY_PATH=$lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  export PKG_CONFIG_LIBDIR=$lib/pkgconfig:$prefix/usr/share/pkgconfig PKG_CONFIG_SYSROOT_DIR=$prefix
  export PKG_CONFIG=$prefix/usr/bin/pkgconf
  [ -L build ] && rm build
  [ -e .venv ] || ln -s "$(python3 -c 'import sys; print(sys.prefix)')" .venv
  cmake --preset default -DCMAKE_PREFIX_PATH="$CMAKE_PREFIX_PATH" -DPKG_CONFIG_EXECUTABLE="$PKG_CONFIG" >/dev/null &&
    cmake --build --preset default --target tessera tessera_plugins tessera_unit_tests -- -j "$(nproc)"
}
stage_bundle() {
  if bundle_loads; then use_bundle; else build_here; fi || return 1
  prepare_environment
}
# The environment of every later stage, also when `bundle` is not among this call's stages.
environment_ready=0
prepare_environment() {
  [ "$environment_ready" = 1 ] && return 0
  environment_ready=1
  [ -e build ] || ln -sfn .device/bundle build
  if [ -L build ]; then
    export LD_LIBRARY_PATH=$root/.device/bundle/lib:$(torch_lib)${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  fi
  # The unit tests were built elsewhere: where their plugins and sources are now.
  export TESSERA_TEST_BUILD_DIR=$root/build TESSERA_TEST_SOURCE_DIR=$root
  if [ ! -f data/fortunes/train.bin ] && [ -d .device/data/fortunes ]; then
    mkdir -p data && cp -r .device/data/fortunes data/
  fi
}

stage_cuda_tests() {
  local log=$results/logs/cuda_tests.log
  build/bin/tessera_unit_tests --gtest_filter='CudaStep.*:*Cuda*:*Nccl*' 2>&1 | tee "$log"
  local status=${PIPESTATUS[0]}
  local skipped
  skipped=$(grep -c "^\[  SKIPPED \] [A-Za-z]" "$log")
  if ! have_gpu; then
    no_gpu "$skipped CUDA-only tests skipped themselves, as they must without one"
    return "$status"
  fi
  if [ "$skipped" != 0 ]; then
    echo "gpu.sh: $skipped CUDA-only tests skipped on a GPU machine:"; grep "SKIPPED" "$log"
    return 1
  fi
  return "$status"
}

stage_quickstart() {
  local status=0 precision device=cuda steps=$quickstart_steps
  if ! have_gpu; then no_gpu; device=cpu; steps=20; echo "rehearsal: the quickstart for $steps steps on the CPU instead"; fi
  for precision in fp32 bf16; do
    [ "$device" = cpu ] && [ "$precision" = bf16 ] && continue  # bf16 on a CPU without AVX-512 is minutes
    build/bin/tessera train configs/quickstart.yaml --run-dir "runs/device/quickstart-$precision" \
      --set settings.device=$device --set settings.precision=$precision --set trainer.max_steps=$steps \
      --set components.scheduler.config.warmup_steps=$((steps / 4)) \
      --set 'components.callbacks=[{component_key: callback, variant_key: console_logger, config: {every: 50}},
             {component_key: callback, variant_key: jsonl_metrics, config: {}}]' \
      --set checkpoint.at_end=false --set checkpoint.export_at_end=false || status=1
    tail -n 1 "runs/device/quickstart-$precision/metrics.jsonl" 2>/dev/null | python3 -c 'import json, sys
r = json.loads(sys.stdin.read()); print("quickstart: step", r["step"], "loss %.4f" % r["loss"],
"tokens/s %.0f" % r.get("tokens_per_s", 0), "mfu", r.get("mfu", "-"), "peak memory", r.get("memory_peak_bytes", "-"))' || true
  done
  return $status
}

stage_bench() {
  if ! have_gpu; then
    no_gpu; echo "rehearsal: vs_pytorch on the CPU for a few steps instead (the script, the bundle's binary, the machine's torch)"
    python3 tools/bench/vs_pytorch --device cpu --model quickstart --steps 12 --skip 2 --rounds 1 --no-compile
    return
  fi
  python3 tools/bench/vs_pytorch --device cuda --model gpt2-124m --precision bf16 --batch auto --steps 30 --skip 10 \
    --rounds 2 --batch-file "$results/gpt2_batch.txt"
}

stage_profile() {
  local status=0 config=configs/gpt2-124m.yaml batch device=cuda steps=8
  batch=$(cat "$results/gpt2_batch.txt" 2>/dev/null || echo 16)
  local sets=(--set components.train_data.config.path=data/fortunes/train.bin --set trainer.grad_accum=1
              --set trainer.micro_batch_size="$batch")
  if ! have_gpu; then
    no_gpu; echo "rehearsal: the quickstart model under the profiler on the CPU instead"
    config=configs/quickstart.yaml device=cpu sets=(--set settings.precision=fp32)
  fi
  # GPT-2's ids over the fortunes bytes (real text: the loss falls); steps 6-7 profiled.
  build/bin/tessera train "$config" --run-dir runs/device/profile "${sets[@]}" --set settings.device=$device \
    --set trainer.max_steps=$steps --set components.scheduler.config.warmup_steps=2 \
    --set checkpoint.every_steps=0 --set checkpoint.at_end=false \
    --set checkpoint.export_at_end=false \
    --set 'components.callbacks=[{component_key: callback, variant_key: console_logger, config: {every: 1}},
           {component_key: callback, variant_key: profiler, config: {start_step: 6, steps: 2, backend: kineto}}]' \
    || status=1
  local trace found=0
  for trace in runs/device/profile/profiles/rank_0/*.json; do
    [ -f "$trace" ] || continue
    found=1
    python3 tools/bench/trace_summary.py "$trace" --top 25 || status=1
  done
  [ "$found" = 1 ] || { echo "profile: no trace was written"; status=1; }
  return $status
}

stage_generate() {
  if ! have_gpu; then
    no_gpu; echo "rehearsal: tools/bench/generate_cli on the CPU instead, a small model and few tokens"
    python3 tools/bench/generate_cli --device cpu --batches 1,4 --layers 2 --width 128 --new-tokens 16
    return
  fi
  python3 tools/bench/generate_cli --device cuda --precision bf16 --batches 1,32 --layers 12 --width 768 \
    --new-tokens 256
}

stage_grpo() {
  if ! python3 -c 'import trl, datasets' 2>/dev/null; then
    # The machine has no registry: the wheels bundle.sh fetched, installed beside its packages.
    compgen -G ".device/wheels/*.whl" >/dev/null ||
      { echo "grpo: python3 has no trl and .device/wheels none (tools/device/bundle.sh)"; return 1; }
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/tessera-wheels \
      .device/wheels/*.whl || return 1
    export PYTHONPATH=/tmp/tessera-wheels${PYTHONPATH:+:$PYTHONPATH}
  fi
  if ! have_gpu; then
    no_gpu; echo "rehearsal: tools/bench/grpo on the CPU instead, a small model, 3 steps, one round"
    python3 tools/bench/grpo --device cpu --layers 2 --width 64 --steps 3 --rounds 1
    return
  fi
  python3 tools/bench/grpo --device cuda --steps 10 --rounds 2
}

stage_memory() {
  have_gpu || { no_gpu; return 0; }
  python3 tools/bench/memory --device cuda --precision bf16
}

for stage in "${stages[@]}"; do
  if ! declare -F "stage_$stage" >/dev/null; then
    echo "gpu.sh: unknown stage '$stage' (env bundle cuda_tests quickstart bench profile generate grpo memory)" >&2
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
  local failed=0 stage start status elapsed limit
  for stage in "${stages[@]}"; do
    [ "$stage" = bundle ] || [ "$stage" = env ] || prepare_environment
    elapsed=$(( $(date +%s) - started ))
    if [ $((elapsed + budget[$stage])) -gt "$deadline_s" ]; then
      echo "== $stage: skipped: its budget of ${budget[$stage]} s does not fit before the ${deadline_s} s deadline (at ${elapsed} s)"
      failed=$((failed + 1))
      continue
    fi
    limit=$(( budget[$stage] * 3 / 2 ))
    echo "== $stage (at ${elapsed} s, $(date -u +%H:%M:%S); budget ${budget[$stage]} s, limit ${limit} s)"
    start=$(date +%s)
    if [ "$stage" = bundle ] || [ "$stage" = env ]; then
      # In this shell: they export the environment of the later stages.
      "stage_$stage" > >(tee "$results/logs/$stage.log") 2>&1
      status=$?
    else
      export -f "stage_$stage" have_gpu no_gpu
      export results quickstart_steps
      timeout --kill-after=10 "$limit" bash -c "stage_$stage" 2>&1 | tee "$results/logs/$stage.log"
      status=${PIPESTATUS[0]}
      [ "$status" = 124 ] && echo "== $stage: cut off at its limit of ${limit} s"
    fi
    local took=$(( $(date +%s) - start ))
    echo "== $stage: $([ "$status" = 0 ] && echo ok || echo FAILED) in ${took} s (budget ${budget[$stage]} s$(
      [ "$took" -gt "${budget[$stage]}" ] && echo ", OVER"))"
    pack_results
    if [ "$status" != 0 ]; then
      failed=$((failed + 1))
      [ "$stage" = bundle ] && { echo "gpu.sh: nothing to run without a bundle or a build"; return $failed; }
    fi
  done
  echo "== all stages in $(( $(date +%s) - started )) s, $failed failed"
  return $failed
}

logs=("$results/logs/gpu.log")
[ -n "${OUT:-}" ] && logs+=("$OUT/gpu.log")
run_stages 2>&1 | tee "${logs[@]}"
failed=${PIPESTATUS[0]}
pack_results
exit "$failed"
