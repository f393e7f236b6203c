#!/usr/bin/env python3
"""Turns a Tessera run directory's metrics.jsonl into PNG plots.

    .venv/bin/python3 tools/plot/plot_metrics.py RUN_DIR [--out DIR]

Writes loss.png (training loss, and every evaluation's loss), lr.png, grad_norm.png and
tokens_per_s.png, plus mfu.png when the run reported MFU, into DIR (default RUN_DIR/plots).
Lines of metrics.jsonl with an "eval" key are evaluations; the others are steps.
"""
import argparse
import json
import math
import os
import sys

import matplotlib

matplotlib.use("Agg")  # files only, no display
import matplotlib.pyplot as plt  # noqa: E402


def read_metrics(path):
    steps, evals = [], []
    with open(path) as f:
        for number, line in enumerate(f, 1):
            line = line.strip()
            if not line:
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                sys.exit(f"{path}:{number}: not JSON ({e}); is this a Tessera metrics.jsonl?")
            (evals if "eval" in row else steps).append(row)
    return steps, evals


def series(rows, key):
    """(steps, values) of the rows that have a finite value for key (null is a NaN/Inf step)."""
    xs, ys = [], []
    for row in rows:
        value = row.get(key)
        if isinstance(value, (int, float)) and math.isfinite(value):
            xs.append(row["step"])
            ys.append(value)
    return xs, ys


def plot(path, title, ylabel, lines, log_y=False):
    fig, ax = plt.subplots(figsize=(7, 4), dpi=100)
    for label, (xs, ys), style in lines:
        ax.plot(xs, ys, style, label=label, linewidth=1.2, markersize=4)
    ax.set_title(title)
    ax.set_xlabel("step")
    ax.set_ylabel(ylabel)
    if log_y:
        ax.set_yscale("log")
    ax.grid(True, alpha=0.3)
    if len(lines) > 1:
        ax.legend()
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run_dir", help="a run directory holding metrics.jsonl")
    parser.add_argument("--out", help="where the PNGs go (default RUN_DIR/plots)")
    args = parser.parse_args()
    metrics = os.path.join(args.run_dir, "metrics.jsonl")
    if not os.path.isfile(metrics):
        sys.exit(f"{metrics}: no such file; pass the run directory of a `tessera train` run")
    steps, evals = read_metrics(metrics)
    if not steps:
        sys.exit(f"{metrics}: no step lines to plot")
    out = args.out or os.path.join(args.run_dir, "plots")
    os.makedirs(out, exist_ok=True)

    written = []
    loss_lines = [("train", series(steps, "loss"), "-")]
    for name in sorted({row["eval"] for row in evals}):
        loss_lines.append((name, series([r for r in evals if r["eval"] == name], f"{name}/loss"), "o-"))
    written.append(plot(os.path.join(out, "loss.png"), "loss", "loss (nats/token)", loss_lines))
    written.append(plot(os.path.join(out, "lr.png"), "learning rate", "lr", [("lr", series(steps, "lr"), "-")]))
    written.append(plot(os.path.join(out, "grad_norm.png"), "gradient norm (before clipping)", "L2 norm",
                        [("grad_norm", series(steps, "grad_norm"), "-")], log_y=True))
    written.append(plot(os.path.join(out, "tokens_per_s.png"), "throughput", "tokens/s (all ranks)",
                        [("tokens/s", series(steps, "tokens_per_s"), "-")]))
    mfu = series(steps, "mfu")
    if mfu[0]:
        written.append(plot(os.path.join(out, "mfu.png"), "model FLOPs utilisation", "MFU",
                            [("mfu", mfu, "-")]))
    for path in written:
        print(path)


if __name__ == "__main__":
    main()
