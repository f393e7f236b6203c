#!/usr/bin/env bash
# Step time of 1 vs 2 ranks for every parallel strategy on the CPU (Gloo), and the bytes each
# rank holds between steps. Weak scaling: every rank runs the same micro-batch, so 2 ranks train
# on twice the tokens per step. Every rank gets one intra-op thread, so 2 ranks use 2 cores.
# Prints a Markdown table; docs/benchmarks.md records it.
# Usage: tools/bench/distributed.sh [CONFIG] [STEPS]   (default: tests/integration/configs/tiny.yaml, 40)
#   CONFIG may be configs/quickstart.yaml (needs data/fortunes from tools/quickstart.sh).
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$root"
config=${1:-tests/integration/configs/tiny.yaml}
steps=${2:-40}
echo "machine: $(nproc) cores, $(free -g | awk '/Mem:/ {print $2}') GiB, $(lscpu | sed -n 's/^Model name: *//p')"
echo "config: $config, $steps steps, median step time over steps 6..$steps, faster of two rounds"

work=$(mktemp -d /tmp/tessera-bench-dist.XXXX)
trap 'rm -rf "$work"' EXIT
data=()
if [[ "$config" == *tiny.yaml ]]; then
  # Real English text as byte tokens (the tiny config takes its token file from the command line).
  python3 - "$work/text.bin" <<'PY'
import array, sys
text = open("/usr/share/common-licenses/GPL-3", "rb").read()
array.array("H", list(text) * 4).tofile(open(sys.argv[1], "wb"))
PY
  data=(--set "components.train_data.config.path=$work/text.bin")
fi
common=(train "$config" "${data[@]}" --set "trainer.max_steps=$steps" --set trainer.grad_accum=1
        --set settings.num_threads=1)

run() {  # run NAME RANKS STRATEGY
  local name=$1 ranks=$2 strategy=$3
  local args=("${common[@]}" --run-dir "$work/$name")
  [ "$strategy" != none ] && args+=(--set components.parallel.component_key=parallel
                                    --set "components.parallel.variant_key=$strategy")
  if [ "$ranks" = 1 ]; then
    build/bin/tessera "${args[@]}" >"$work/$name.log" 2>&1
  else
    build/bin/tessera launch --nproc-per-node "$ranks" -- "${args[@]}" >"$work/$name.log" 2>&1
  fi
}

# Two interleaved rounds: this shared machine's speed drifts between runs, so each row shows the
# faster round's median.
for round in 1 2; do
  for strategy in none ddp zero1 zero2 fsdp; do
    for ranks in 1 2; do
      [ "$strategy" = none ] && [ "$ranks" = 2 ] && continue
      run "$strategy-$ranks-$round" "$ranks" "$strategy"
    done
  done
done

python3 - "$work" <<'PY'
import json, re, statistics, sys, pathlib
work = pathlib.Path(sys.argv[1])
line = re.compile(r"memory held by rank (\d+) between steps: parameters (\d+) B, gradients (\d+) B, "
                  r"optimizer state (\d+) B, total (\d+) B")
def kib(b): return f"{int(b) / 1024:.1f}"
print()
print("| strategy | ranks | median step time (ms) | tokens/s (all ranks) | per rank: params KiB | grads KiB | optimizer KiB | total KiB |")
print("|---|---|---|---|---|---|---|---|")
for strategy in ["none", "ddp", "zero1", "zero2", "fsdp"]:
    for ranks in [1, 2]:
        rounds = [work / f"{strategy}-{ranks}-{r}" for r in (1, 2)]
        if not (rounds[0] / "metrics.jsonl").exists():
            continue
        medians = []
        for run in rounds:
            rows = [json.loads(l) for l in open(run / "metrics.jsonl")][5:]
            medians.append((statistics.median(r["step_time_s"] for r in rows) * 1000,
                            statistics.median(r["tokens_per_s"] for r in rows)))
        step, tps = min(medians)
        mem = {int(m[0]): m[1:] for m in line.findall(open(f"{rounds[0]}.log").read())}
        p, g, o, t = mem[0]  # every rank holds the same up to padding; rank 0 shown
        label = "none (plain loop)" if strategy == "none" else strategy
        print(f"| {label} | {ranks} | {step:.1f} | {tps:.0f} | {kib(p)} | {kib(g)} | {kib(o)} | {kib(t)} |")
PY
