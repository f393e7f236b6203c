#!/usr/bin/env python3
"""Compares two runs' metrics.jsonl step by step, exactly (bit for bit, as the JSON holds them).

For changes that must not change numerics (a refactor of the trainer, a new file layout):
    tools/check/compare_runs.py runs/before runs/after            # loss, grad_norm, lr, tokens
    tools/check/compare_runs.py A B --fields loss,grad_norm
Prints the number of steps compared and "identical", or the first step and field that differ;
exits 1 when they differ or the runs have different lengths.
"""
import argparse
import json
import sys
from pathlib import Path


def steps(run: Path):
    path = run / "metrics.jsonl" if run.is_dir() else run
    with open(path) as f:
        return [line for line in (json.loads(l) for l in f if l.strip()) if "eval" not in line]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("a", type=Path, help="a run directory or its metrics.jsonl")
    parser.add_argument("b", type=Path)
    parser.add_argument("--fields", default="loss,grad_norm,lr,tokens")
    args = parser.parse_args()
    fields = args.fields.split(",")
    a, b = steps(args.a), steps(args.b)
    if len(a) != len(b):
        print(f"different lengths: {len(a)} and {len(b)} steps")
        return 1
    for x, y in zip(a, b):
        for field in fields:
            if x.get(field) != y.get(field):
                print(f"step {x.get('step')}: {field} {x.get(field)!r} != {y.get(field)!r}")
                return 1
    print(f"{len(a)} steps, {', '.join(fields)}: identical")
    return 0


if __name__ == "__main__":
    sys.exit(main())
