"""Long run without growth: thousands of tiny steps of configs/everything.yaml's run (every
callback on: health with its watchdog, evaluation, MoE and memory monitors, gc, a profiler
trace, console, progress bar, metrics.jsonl, TensorBoard every step, text samples) with
asynchronous checkpoints every 250 steps (keep_last 2) and model exports, at a size where a
step takes milliseconds. The process's resident memory (VmRSS) and open file descriptors are
sampled from /proc every 0.2 s; printed: both at 10%, 25%, 50%, 75% and 95% of the steps (the
last 5% include the end of training: the final checkpoint and export), and the RSS slope over
steps 50%..95% in KiB per 1000 steps (flat: within the noise of a few hundred KiB).

    .venv/bin/python tools/bench/long_run/long_run.py [--steps 50000] [--data data/fortunes/train.bin]

Needs build/bin/tessera and a token file (tools/quickstart.sh makes data/fortunes). Exits 1 if
the second half had more open descriptors than the first or the RSS slope exceeds
--max-slope-kib (default 512 KiB per 1000 steps).
"""
import argparse
import json
import os
import pathlib
import subprocess
import sys
import tempfile
import time

root = pathlib.Path(__file__).resolve().parents[3]


def rss_kib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def fd_count(pid):
    return len(os.listdir(f"/proc/{pid}/fd"))


def steps_done(metrics):
    """The step of the last per-step row of metrics.jsonl (evaluation rows carry "eval")."""
    try:
        with open(metrics, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - 16384))
            tail = f.read().decode(errors="replace").split("\n")
    except FileNotFoundError:
        return 0
    for line in reversed(tail):
        try:
            row = json.loads(line)
        except ValueError:
            continue
        if "eval" not in row and "step" in row:
            return int(row["step"])
    return 0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=50000)
    ap.add_argument("--data", default=str(root / "data/fortunes/train.bin"))
    ap.add_argument("--max-slope-kib", type=float, default=512)
    args = ap.parse_args()
    work = pathlib.Path(tempfile.mkdtemp(prefix="tessera-long-run-"))
    s = args.steps
    sets = {
        "trainer.max_steps": s, "trainer.micro_batch_size": 2, "trainer.grad_accum": 1, "trainer.prefetch": 2,
        "components.model.config.n_layer": 1, "components.model.config.n_embd": 32, "components.model.config.n_head": 2,
        "components.model.config.expert_hidden": 32, "components.model.config.max_seq_len": 32,
        "components.train_data.config.path": args.data, "components.train_data.config.seq_len": 32,
        "components.callbacks.1.config.data.config.path": args.data,
        "components.callbacks.1.config.data.config.seq_len": 32, "components.callbacks.1.config.every": 100,
        "components.callbacks.1.config.batches": 2, "components.callbacks.1.config.micro_batch_size": 2,
        "components.callbacks.4.config.every": 50,
        "components.callbacks.5.config.start_step": 20,
        "components.callbacks.6.config.every": 500, "components.callbacks.7.config.every": 500,
        "components.callbacks.10.config.every": 500, "components.callbacks.10.config.max_new_tokens": 16,
        "checkpoint.every_steps": 250, "checkpoint.keep_last": 2, "checkpoint.async": "true",
        "checkpoint.export_every_steps": 1000, "settings.num_threads": 1, "plugins.paths": f"[{root}/build/plugins]",
        "components.scheduler.config.warmup_steps": 50,
    }
    cmd = [str(root / "build/bin/tessera"), "train", str(root / "configs/everything.yaml"), "--run-dir", str(work / "run")]
    for k, v in sets.items():
        cmd += ["--set", f"{k}={v}"]
    log = open(work / "train.log", "w")
    start = time.time()
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=root)
    metrics = work / "run/metrics.jsonl"
    samples = []  # (steps done, rss KiB, fds)
    while proc.poll() is None:
        try:
            sample = (steps_done(metrics), rss_kib(proc.pid), fd_count(proc.pid))
        except (FileNotFoundError, ProcessLookupError):
            break
        if sample[1] > 0 and sample[2] > 0:  # not a process already being torn down
            samples.append(sample)
        time.sleep(0.2)
    seconds = time.time() - start
    if proc.returncode != 0:
        print(open(work / "train.log").read()[-4000:])
        sys.exit(f"long_run: tessera exited {proc.returncode}")
    if len({x[0] for x in samples if s // 2 <= x[0] <= int(0.95 * s)}) < 2:
        sys.exit("long_run: too few samples in the second half of the run; use more --steps")
    print(f"{s} steps of configs/everything.yaml (every callback, async checkpoints "
          f"every 250, exports every 1000) at tiny size in {seconds:.0f} s")
    print(f"machine: {os.cpu_count()} cores; VmRSS and open fds by step:")
    print(f"{'steps':>8} {'VmRSS MiB':>10} {'open fds':>9}")
    picks = {}
    for frac in (0.1, 0.25, 0.5, 0.75, 0.95):
        target = int(frac * s)
        row = min((x for x in samples if x[0] >= min(target, samples[-1][0])), key=lambda x: x[0], default=samples[-1])
        picks[frac] = row
        print(f"{row[0]:>8} {row[1] / 1024:>10.1f} {row[2]:>9}")
    end = int(0.95 * s)
    half = [x for x in samples if s // 2 <= x[0] <= end]
    n = len(half)
    xs = [x[0] for x in half]
    ys = [x[1] for x in half]
    mx, my = sum(xs) / n, sum(ys) / n
    slope = sum((a - mx) * (b - my) for a, b in zip(xs, ys)) / max(sum((a - mx) ** 2 for a in xs), 1e-9) * 1000
    fds_second_half = [x[2] for x in half]
    print(f"RSS slope over steps {s // 2}..{end}: {slope:+.1f} KiB per 1000 steps; open fds from step {s // 10} to "
          f"{end}: {min(x[2] for x in samples if s // 10 <= x[0] <= end)}..{max(x[2] for x in samples if s // 10 <= x[0] <= end)}")
    rows = [json.loads(line) for line in open(metrics) if line.strip()]
    rows = [r for r in rows if "eval" not in r]
    last_loss = rows[-1].get("loss")
    print(f"steps written to metrics.jsonl: {len(rows)}; last loss "
          f"{'none' if last_loss is None else format(last_loss, '.4f')}")
    # A save in flight holds a file open for a moment, so single samples vary by one or two: the
    # second half may not reach more open files than the first did.
    fds_first_half = [x[2] for x in samples if s // 10 <= x[0] < s // 2]
    ok = slope <= args.max_slope_kib and max(fds_second_half) <= max(fds_first_half)
    print("flat" if ok else f"GROWTH: slope above {args.max_slope_kib} KiB per 1000 steps, or more open files in the "
                            "second half than in the first")
    subprocess.run(["rm", "-rf", str(work)])
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
