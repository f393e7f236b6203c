#!/usr/bin/env bash
# Installs Tessera to a temporary prefix, then builds the example plugins and a plugin made by
# `tessera new-plugin` with nothing but the installed CMake package, and trains with them through
# the installed `tessera`, whose checksum must be the same before and after.
# Usage: out_of_tree_test.sh BUILD_DIR SOURCE_DIR
set -euo pipefail
build=$1
src=$2
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

cmake --install "$build" --prefix "$tmp/prefix" >/dev/null
bin=$tmp/prefix/bin/tessera
before=$(sha256sum "$bin" | cut -d' ' -f1)

# Each plugin's configure, one-unit build and tests are mostly one process at a time: they run
# two at a time (this machine's cores), each failure reported with its log.
pids=() names=()
in_parallel() {  # in_parallel NAME COMMAND...: starts it, waiting first for one of two running
  if [ ${#pids[@]} -ge 2 ]; then finish_one; fi
  "${@:2}" &
  pids+=($!) names+=("$1")
}
finish_one() {  # waits for whichever ends first
  local done_pid rc=0 i
  wait -n -p done_pid "${pids[@]}" || rc=$?
  for i in "${!pids[@]}"; do
    if [ "${pids[$i]}" = "$done_pid" ]; then
      [ "$rc" -eq 0 ] || fail "${names[$i]} (log above)"
      unset 'pids[i]' 'names[i]'
    fi
  done
  pids=("${pids[@]}") names=("${names[@]}")
}
finish_all() { while [ ${#pids[@]} -gt 0 ]; do finish_one; done; }

build_example() {
  local example=$1
  cmake -S "$src/examples/plugins/$example" -B "$tmp/$example" -G Ninja -DCMAKE_PREFIX_PATH="$tmp/prefix" \
    >"$tmp/$example.configure.log" 2>&1 || { cat "$tmp/$example.configure.log"; echo "FAIL: configure $example" >&2; return 1; }
  cmake --build "$tmp/$example" -j 1 >"$tmp/$example.build.log" 2>&1 \
    || { cat "$tmp/$example.build.log"; echo "FAIL: build $example" >&2; return 1; }
}
for example in step_decay stop_at_loss whole_matrix length_reward; do in_parallel "example $example" build_example "$example"; done
finish_all
paths="--plugin-path $tmp/step_decay/plugins --plugin-path $tmp/stop_at_loss/plugins --plugin-path $tmp/length_reward/plugins"

# The installed host lists the bundled plugins from its prefix and the examples from their builds.
"$bin" components $paths >"$tmp/components.txt"
grep -q "scheduler/step_decay" "$tmp/components.txt" || fail "step_decay not listed"
grep -q "callback/stop_at_loss" "$tmp/components.txt" || fail "stop_at_loss not listed"
grep -q "reward/length_target" "$tmp/components.txt" || fail "length_target (a reward) not listed"
grep -q "$tmp/prefix/lib/tessera/plugins/libtessera_model_gpt.so" "$tmp/components.txt" || fail "bundled plugins not found in the prefix"

cat >"$tmp/run.yaml" <<YAML
name: out_of_tree
components:
  model: {component_key: model, variant_key: gpt, config: {n_layer: 1, n_head: 2, n_embd: 16, max_seq_len: 16}}
  train_data: {component_key: dataset, variant_key: tokens, config: {path: $src/README.md, dtype: uint8, seq_len: 16}}
  loss: {component_key: loss, variant_key: cross_entropy}
  optimizer: {component_key: optimizer, variant_key: adamw, config: {lr: 0.01, model: {instance_key: model}}}
  scheduler: {component_key: scheduler, variant_key: step_decay, config: {step_size: 2, gamma: 0.5}}
  callbacks:
    - {component_key: callback, variant_key: stop_at_loss, config: {target: 1000.0, window: 3}}
trainer: {max_steps: 10, micro_batch_size: 2}
YAML
"$bin" train "$tmp/run.yaml" $paths --run-dir "$tmp/run" >"$tmp/train.log" 2>&1 || { cat "$tmp/train.log"; fail "train"; }
# stop_at_loss (target far above any loss, window 3) ends the run after step 3, not at 10.
[ "$(wc -l <"$tmp/run/metrics.jsonl")" -eq 3 ] || { cat "$tmp/train.log"; fail "expected 3 steps"; }
# step_decay (step_size 2, gamma 0.5): steps 1-2 at lr 0.01, step 3 at 0.005.
grep -q '"lr":0.01,' <(sed -n 2p "$tmp/run/metrics.jsonl") || fail "step 2 lr: $(sed -n 2p "$tmp/run/metrics.jsonl")"
grep -q '"lr":0.005,' <(sed -n 3p "$tmp/run/metrics.jsonl") || fail "step 3 lr: $(sed -n 3p "$tmp/run/metrics.jsonl")"

# callback/whole_matrix gathers a whole matrix through the SDK's placements: on two
# tensor-parallel ranks (each holding half of c_fc's 64 rows) it is the one rank's matrix.
cat >"$tmp/whole.yaml" <<YAML
name: whole_matrix
components:
  model: {component_key: model, variant_key: gpt, config: {n_layer: 1, n_head: 2, n_embd: 16, max_seq_len: 16, dropout: 0.0}}
  train_data: {component_key: dataset, variant_key: tokens, config: {path: $src/README.md, dtype: uint8, seq_len: 16}}
  loss: {component_key: loss, variant_key: cross_entropy}
  optimizer: {component_key: optimizer, variant_key: adamw, config: {lr: 0.01, model: {instance_key: model}}}
  callbacks:
    - {component_key: callback, variant_key: whole_matrix, config: {parameter: h.0.mlp.c_fc.weight}}
trainer: {max_steps: 2, micro_batch_size: 2}
YAML
whole_paths="--plugin-path $tmp/whole_matrix/plugins"
"$bin" train "$tmp/whole.yaml" $whole_paths --run-dir "$tmp/whole1" >"$tmp/whole1.log" 2>&1 || { cat "$tmp/whole1.log"; fail "whole_matrix on one rank"; }
"$bin" launch --nproc-per-node 2 -- train "$tmp/whole.yaml" $whole_paths --set parallelism.tp=2 --run-dir "$tmp/whole2" \
  >"$tmp/whole2.log" 2>&1 || { cat "$tmp/whole2.log"; fail "whole_matrix on two tensor-parallel ranks"; }
python3 - "$tmp/whole1/metrics.jsonl" "$tmp/whole2/metrics.jsonl" <<'PY' || fail "whole_matrix: the two ranks' whole matrix is not the one rank's"
import json, sys
one, two = ([json.loads(l) for l in open(p)] for p in sys.argv[1:3])
assert len(one) == len(two) == 2, (len(one), len(two))
for a, b in zip(one, two):
    assert a["whole_matrix/rows"] == b["whole_matrix/rows"] == 64, (a, b)
    assert a["whole_matrix/local_rows"] == 64 and b["whole_matrix/local_rows"] == 32, (a, b)
    # After AdamW steps the two meshes' sums differ in order: equal to rounding, far from a half.
    assert abs(a["whole_matrix/norm"] - b["whole_matrix/norm"]) <= 1e-4 * a["whole_matrix/norm"], (a, b)
PY

# A scaffolded plugin of every kind builds and passes its generated tests as generated.
build_scaffold() {
  local kind=$1 name=my_$1
  cmake -S "$tmp/$name" -B "$tmp/$name/build" -G Ninja -DCMAKE_PREFIX_PATH="$tmp/prefix" >/dev/null 2>&1 \
    || { echo "FAIL: configure scaffold $kind" >&2; return 1; }
  cmake --build "$tmp/$name/build" -j 1 >"$tmp/$name.log" 2>&1 \
    || { cat "$tmp/$name.log"; echo "FAIL: build scaffold $kind" >&2; return 1; }
  (cd "$tmp/$name/build" && ctest --output-on-failure >"$tmp/$name.ctest.log" 2>&1) \
    || { cat "$tmp/$name.ctest.log"; echo "FAIL: scaffold $kind tests" >&2; return 1; }
  grep -q "2 tests passed\|100% tests passed" "$tmp/$name.ctest.log" || { echo "FAIL: scaffold $kind ran no tests" >&2; return 1; }
}
# The model's first: its tests (one rank against two under three meshes) take longest.
for kind in model adapter dataset loss optimizer scheduler callback; do
  "$bin" new-plugin "$kind" "my_$kind" --dir "$tmp" >/dev/null
  in_parallel "scaffold $kind" build_scaffold "$kind"
done
finish_all

after=$(sha256sum "$bin" | cut -d' ' -f1)
[ "$before" = "$after" ] || fail "the tessera binary changed"
echo "out-of-tree plugins: ok (tessera sha256 $before unchanged)"
