#!/usr/bin/env python3
"""Prints the stage times of a CI run from its own output, so every run is measured one way.

    tools/check/ci_stage_times.py LOG        (or: ... | tools/check/ci_stage_times.py -)

LOG is what `bash .ci/run` (tools/test.sh) printed. Each stage of tools/test.sh prints
"== STAGE: N s"; the suite's time is ctest's "Total Test time (real)", and its summary line
("N% tests passed, F tests failed out of T") is printed as it stands. The total is the sum of
the stages, i.e. the run's wall time less the few seconds between ctest's end and the script's.
"""
import re
import sys

STAGE = re.compile(r"^== (.+): (\d+) s$")
CTEST_TOTAL = re.compile(r"^Total Test time \(real\) =\s*([\d.]+) sec")
CTEST_SUMMARY = re.compile(r"^\d+% tests passed, \d+ tests? failed out of \d+")


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__.strip())
    text = sys.stdin.read() if sys.argv[1] == "-" else open(sys.argv[1], errors="replace").read()
    stages, summary = [], None
    for line in text.splitlines():
        line = line.rstrip()
        if m := STAGE.match(line):
            stages.append((m.group(1), float(m.group(2))))
        elif m := CTEST_TOTAL.match(line):
            stages.append(("test suite (ctest)", float(m.group(1))))
        elif CTEST_SUMMARY.match(line):
            summary = line
    if not stages:
        sys.exit(f"{sys.argv[1]}: no '== STAGE: N s' lines: not the output of tools/test.sh")
    width = max(len(name) for name, _ in stages)
    for name, seconds in stages:
        print(f"{name:<{width}}  {seconds:7.0f} s  {seconds / 60:5.1f} min")
    total = sum(seconds for _, seconds in stages)
    print(f"{'total':<{width}}  {total:7.0f} s  {total / 60:5.1f} min")
    print(summary or "no ctest summary line: the suite did not finish")


if __name__ == "__main__":
    main()
