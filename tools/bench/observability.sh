#!/usr/bin/env bash
# What watching a run costs: the quickstart model for STEPS steps with only the default metrics
# sink (jsonl_metrics), and with every per-step monitor and sink on at once — console_logger,
# jsonl_metrics, tensorboard, progress_bar (lines), health (NaN/spike checks, which read the loss
# and grad norm every step, and the hang watchdog thread), memory_monitor every step, gc every 100
# steps — and the same with gc every step, to show what trimming the heap each step costs. The
# periodic ones (evaluation, sample_text, profiler) cost what their work costs and are left out.
# Prints the median step time of each over steps 11..STEPS and the difference; three rounds each,
# interleaved, the faster median shown. Also the MoE example (configs/moe.yaml) with and without
# moe_monitor, whose statistics cost one all-reduce and one host copy per step.
# Usage: tools/bench/observability.sh [STEPS]   (needs data/fortunes from tools/quickstart.sh)
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$root"
steps=${1:-60}
echo "machine: $(nproc) cores, $(free -g | awk '/Mem:/ {print $2}') GiB, $(lscpu | sed -n 's/^Model name: *//p')"
echo "config: configs/quickstart.yaml and configs/moe.yaml, $steps steps; medians over steps 11..$steps"
work=$(mktemp -d /tmp/tessera-bench-obs.XXXX)
trap 'rm -rf "$work"' EXIT
common=(--set "trainer.max_steps=$steps" --set components.scheduler.config.warmup_steps=5
        --set checkpoint.at_end=false --set checkpoint.export_at_end=false)
plain='[{component_key: callback, variant_key: jsonl_metrics}]'
everything='[{component_key: callback, variant_key: health, config: {hang_timeout_s: 600}},
  {component_key: callback, variant_key: memory_monitor, config: {every: 1}},
  {component_key: callback, variant_key: gc, config: {every: 100}},
  {component_key: callback, variant_key: console_logger, config: {every: 1}},
  {component_key: callback, variant_key: progress_bar, config: {mode: lines, every: 1}},
  {component_key: callback, variant_key: jsonl_metrics},
  {component_key: callback, variant_key: tensorboard, config: {every: 1}}]'
everything_gc="${everything/every: 100/every: 1}"
moe_plain='[{component_key: callback, variant_key: jsonl_metrics}]'
moe_monitored='[{component_key: callback, variant_key: moe_monitor, config: {every: 1}},
  {component_key: callback, variant_key: jsonl_metrics}]'
for round in 1 2 3; do
  build/bin/tessera train configs/quickstart.yaml "${common[@]}" --set "components.callbacks=$plain" \
    --run-dir "$work/plain-$round" >"$work/plain-$round.log" 2>&1
  build/bin/tessera train configs/quickstart.yaml "${common[@]}" --set "components.callbacks=$everything" \
    --run-dir "$work/everything-$round" >"$work/everything-$round.log" 2>&1
  build/bin/tessera train configs/quickstart.yaml "${common[@]}" --set "components.callbacks=$everything_gc" \
    --run-dir "$work/everything_gc-$round" >"$work/everything_gc-$round.log" 2>&1
  build/bin/tessera train configs/moe.yaml "${common[@]}" --set "components.callbacks=$moe_plain" \
    --run-dir "$work/moe_plain-$round" >"$work/moe_plain-$round.log" 2>&1
  build/bin/tessera train configs/moe.yaml "${common[@]}" --set "components.callbacks=$moe_monitored" \
    --run-dir "$work/moe_monitored-$round" >"$work/moe_monitored-$round.log" 2>&1
done
python3 - "$work" <<'PY'
import json, statistics, sys, pathlib
work = pathlib.Path(sys.argv[1])
def median_ms(name):
    best = None
    for r in (1, 2, 3):
        rows = [json.loads(l) for l in open(work / f"{name}-{r}" / "metrics.jsonl") if '"eval"' not in l][10:]
        m = statistics.median(x["step_time_s"] for x in rows) * 1000
        best = m if best is None else min(best, m)
    return best
print()
print("| model | callbacks | median step time (ms) | difference (ms) |")
print("|---|---|---|---|")
for model, base, variants in [("gpt (quickstart)", "plain", [("everything", "every per-step monitor and sink, gc every 100"),
                                                             ("everything_gc", "the same with gc every step")]),
                              ("gpt_moe (moe.yaml)", "moe_plain", [("moe_monitored", "+ moe_monitor every step")])]:
    a = median_ms(base)
    print(f"| {model} | jsonl_metrics only | {a:.1f} | |")
    for name, label in variants:
        b = median_ms(name)
        print(f"| {model} | {label} | {b:.1f} | {b - a:+.1f} ({(b - a) / a * 100:+.1f} %) |")
PY
