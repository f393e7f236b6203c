#!/usr/bin/env python3
"""Where the recorded steps' time goes, from a Kineto trace written by the `profiler` callback
(RUN_DIR/profiles/rank_R/trace_steps_A-B.json), as text, so a short GPU lease need not ship the
trace home to learn what is in the way.

    tools/bench/trace_summary.py TRACE [--top N]

For each recorded step (the ProfilerStep#N ranges):
  - its wall time on the host;
  - on a GPU, for the kernels, copies and memsets the step launched (matched to their launches by
    Kineto's correlation ids): the time the device was busy with them (the union of their
    intervals), that as a share of their span, and the longest idle gap inside that span;
  - the host's waits for the device (cudaStreamSynchronize, cudaDeviceSynchronize,
    cudaEventSynchronize, blocking cudaMemcpy): count and time;
  - the copies between host and device: count and bytes.
Then the top N GPU kernels by total time over the steps, or, where the trace has none (a CPU
run), the top N operators by self time (their time less that of the operators they called).
Standard library only.
"""
import argparse
import collections
import json
import sys

GPU_CATEGORIES = {"kernel", "gpu_memcpy", "gpu_memset"}
HOST_WAITS = ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize", "cudaMemcpy")


def load_events(path):
    with open(path) as f:
        trace = json.load(f)
    events = trace["traceEvents"] if isinstance(trace, dict) else trace
    return [e for e in events if e.get("ph") == "X" and "dur" in e]


def union_and_gap(intervals):
    """The summed length of the union of [start, end) intervals, and the longest gap between them."""
    busy, longest_gap, end = 0.0, 0.0, None
    for start, stop in sorted(intervals):
        if end is None or start > end:
            if end is not None:
                longest_gap = max(longest_gap, start - end)
            busy += stop - start
            end = stop
        elif stop > end:
            busy += stop - end
            end = stop
    return busy, longest_gap


def self_times(ops):
    """Each operator's duration less that of the operators nested in it (same thread)."""
    totals = collections.defaultdict(float)
    by_thread = collections.defaultdict(list)
    for e in ops:
        by_thread[(e.get("pid"), e.get("tid"))].append(e)
    for events in by_thread.values():
        events.sort(key=lambda e: (e["ts"], -e["dur"]))
        stack = []  # [end, name, time of the operators nested in it, duration]
        def close(item):
            totals[item[1]] += (item[3] - item[2])
        for e in events:
            end = e["ts"] + e["dur"]
            while stack and stack[-1][0] <= e["ts"]:
                close(stack.pop())
            if stack:
                stack[-1][2] += e["dur"]
            stack.append([end, e["name"], 0.0, e["dur"]])
        while stack:
            close(stack.pop())
    return totals


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("trace")
    parser.add_argument("--top", type=int, default=15)
    args = parser.parse_args()
    events = load_events(args.trace)
    steps = sorted((e for e in events if e["name"].startswith("ProfilerStep#")), key=lambda e: e["ts"])
    if not steps:
        sys.exit(f"{args.trace}: no ProfilerStep# ranges (is it a trace of the profiler callback?)")
    gpu = [e for e in events if e.get("cat") in GPU_CATEGORIES]
    runtime = [e for e in events if e.get("cat") in ("cuda_runtime", "cuda_driver")]
    launched_at = {e["args"]["correlation"]: e["ts"] for e in runtime if "correlation" in e.get("args", {})}

    def step_of(ts):
        for i, s in enumerate(steps):
            if s["ts"] <= ts <= s["ts"] + s["dur"]:
                return i
        return None

    per_step_gpu = collections.defaultdict(list)
    for e in gpu:
        launch = launched_at.get(e.get("args", {}).get("correlation"))
        i = step_of(launch if launch is not None else e["ts"])
        if i is not None:
            per_step_gpu[i].append(e)

    print(f"{args.trace}: {len(steps)} recorded steps, {len(gpu)} GPU events")
    kernels = collections.Counter()
    kernel_calls = collections.Counter()
    for i, s in enumerate(steps):
        line = f"{s['name']}: {s['dur'] / 1000:.2f} ms on the host"
        mine = per_step_gpu.get(i, [])
        if mine:
            busy, gap = union_and_gap([(e["ts"], e["ts"] + e["dur"]) for e in mine])
            span = max(e["ts"] + e["dur"] for e in mine) - min(e["ts"] for e in mine)
            line += (f"; GPU busy {busy / 1000:.2f} ms of its {span / 1000:.2f} ms span "
                     f"({100 * busy / span if span else 0:.1f}%), longest idle gap {gap / 1000:.3f} ms")
            for e in mine:
                if e.get("cat") == "kernel":
                    kernels[e["name"]] += e["dur"]
                    kernel_calls[e["name"]] += 1
        in_step = [e for e in runtime if s["ts"] <= e["ts"] <= s["ts"] + s["dur"]]
        waits = [e for e in in_step if e["name"] in HOST_WAITS]
        line += f"; host waits for the device: {len(waits)} ({sum(e['dur'] for e in waits) / 1000:.3f} ms)"
        copies = collections.Counter()
        copied = collections.Counter()
        for e in mine:
            if e.get("cat") == "gpu_memcpy":
                kind = "DtoH" if "DtoH" in e["name"] else "HtoD" if "HtoD" in e["name"] else "DtoD"
                copies[kind] += 1
                copied[kind] += e.get("args", {}).get("bytes", 0)
        if copies:
            line += "; copies " + ", ".join(f"{k} {copies[k]} ({copied[k]} B)" for k in sorted(copies))
        print(line)
        for e in waits:
            print(f"  wait: {e['name']} {e['dur'] / 1000:.3f} ms")

    if kernels:
        total = sum(kernels.values())
        print(f"\ntop {args.top} GPU kernels of {len(kernels)} by time over the steps ({total / 1000:.2f} ms in all):")
        for name, t in kernels.most_common(args.top):
            print(f"  {t / 1000:9.3f} ms {100 * t / total:5.1f}% {kernel_calls[name]:6d}x  {name[:110]}")
    else:
        window = [e for e in events if e.get("cat") == "cpu_op" and step_of(e["ts"]) is not None]
        totals = self_times(window)
        total = sum(totals.values())
        print(f"\nno GPU kernels: top {args.top} operators of {len(totals)} by self time over the steps "
              f"({total / 1000:.2f} ms in all):")
        for name, t in sorted(totals.items(), key=lambda kv: -kv[1])[:args.top]:
            print(f"  {t / 1000:9.3f} ms {100 * t / total:5.1f}%  {name}")


if __name__ == "__main__":
    main()
