#!/usr/bin/env bash
# What a checkpoint costs the training loop: the quickstart model for STEPS steps with no
# checkpoints, with a checkpoint every EVERY steps written in the background (async, the default)
# and written inline (async: false). Prints the median step time, the time training waits at a
# save (the state copy, plus the write when inline), the write time, and the training time each
# save adds (the difference in total training time against no checkpoints, per save). Each mode
# runs twice; the faster run is shown.
# Usage: tools/bench/checkpoint.sh [STEPS] [EVERY]   (needs data/fortunes from tools/quickstart.sh)
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$root"
steps=${1:-60}
every=${2:-5}
echo "machine: $(nproc) cores, $(free -g | awk '/Mem:/ {print $2}') GiB, $(lscpu | sed -n 's/^Model name: *//p')"
echo "config: configs/quickstart.yaml, $steps steps, checkpoint every $every steps; medians over steps 6..$steps"
work=$(mktemp -d /tmp/tessera-bench-ckpt.XXXX)
trap 'rm -rf "$work"' EXIT
common=(train configs/quickstart.yaml --set "trainer.max_steps=$steps" --set checkpoint.export_at_end=false
        --set components.scheduler.config.warmup_steps=5)
for round in 1 2; do
  build/bin/tessera "${common[@]}" --set checkpoint.at_end=false --run-dir "$work/none-$round" >"$work/none-$round.log" 2>&1
  build/bin/tessera "${common[@]}" --set "checkpoint.every_steps=$every" --run-dir "$work/async-$round" >"$work/async-$round.log" 2>&1
  build/bin/tessera "${common[@]}" --set "checkpoint.every_steps=$every" --set checkpoint.async=false \
    --run-dir "$work/inline-$round" >"$work/inline-$round.log" 2>&1
done
python3 - "$work" <<'PY'
import json, re, statistics, sys, pathlib
work = pathlib.Path(sys.argv[1])
print()
print("| checkpoints | training time (s) | added per save vs none (ms) | median step time (ms) | median step right after a save (ms) | training waits per save (ms) | write per save (ms) | checkpoint size (MiB) |")
print("|---|---|---|---|---|---|---|---|")
results = {}
for mode in ["none", "async", "inline"]:
    best = None
    for r in (1, 2):
        run = work / f"{mode}-{r}"
        rows = [json.loads(l) for l in open(run / "metrics.jsonl")][5:]
        step = statistics.median(x["step_time_s"] for x in rows) * 1000
        after = [x["step_time_s"] * 1000 for x in rows if "time_checkpoint_s" in x]
        log = open(f"{run}.log").read()
        waits = [float(m) for m in re.findall(r"state copied in ([0-9.e+-]+) ms", log)]
        writes = [float(m) * 1000 for m in re.findall(r"written in ([0-9.e+-]+) s", log)]
        all_rows = [json.loads(l) for l in open(run / "metrics.jsonl")]
        elapsed = all_rows[-1]["elapsed_s"]
        size = sum(f.stat().st_size for f in (run / "checkpoints").rglob("*") if f.is_file()) if (run / "checkpoints").exists() else 0
        n = max(1, len([d for d in (run / "checkpoints").glob("step_*")])) if size else 1
        row = (step, statistics.median(after) if after else None, statistics.median(waits) if waits else None,
               statistics.median(writes) if writes else None, size / n / 2**20, elapsed, len(waits))
        if best is None or row[5] < best[5]:
            best = row
    results[mode] = best
fmt = lambda v: "–" if v is None else f"{v:.1f}"
base = results["none"][5]
for mode, r in results.items():
    added = None if mode == "none" or not r[6] else (r[5] - base) * 1000 / r[6]
    print(f"| {mode} | {r[5]:.2f} | {fmt(added)} | {fmt(r[0])} | {fmt(r[1])} | {fmt(r[2])} | "
          f"{fmt(r[3] if mode != 'none' else None)} | {fmt(r[4] if mode != 'none' else None)} |")
PY
