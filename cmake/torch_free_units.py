#!/usr/bin/env python3
"""Prints the source files under the tree that reach no LibTorch header, one per line.

cmake/TesseraPch.cmake compiles these without the precompiled LibTorch headers: GCC spends about
2.5 s loading them in every unit, for nothing when the unit never names a tensor. A unit reaches LibTorch
when it, or a project header it includes (followed through the project's include folders), names
a <torch/...>, <ATen/...>, <c10/...> or <caffe2/...> header. Includes the scan cannot resolve
(the standard library, Boost, yaml-cpp, ...) are not followed: none of them includes LibTorch.

    torch_free_units.py ROOT [INCLUDE_DIR...]
"""
import os
import re
import sys

INCLUDE = re.compile(r'^\s*#\s*include\s*([<"])([^>"]+)[>"]', re.M)
LIBTORCH = re.compile(r"^(torch|ATen|c10|caffe2)/")


def main():
    root = os.path.abspath(sys.argv[1])
    include_dirs = [os.path.abspath(d) for d in sys.argv[2:]]
    reaches = {}

    def reaches_libtorch(path, open_files):
        if path in reaches:
            return reaches[path]
        if path in open_files:  # an include cycle: the file's own verdict comes from its other includes
            return False
        open_files.add(path)
        with open(path, errors="replace") as f:
            text = f.read()
        found = False
        for kind, name in INCLUDE.findall(text):
            if LIBTORCH.match(name):
                found = True
                break
            here = [os.path.join(os.path.dirname(path), name)] if kind == '"' else []
            candidate = next((c for c in here + [os.path.join(d, name) for d in include_dirs] if os.path.isfile(c)), None)
            if candidate and reaches_libtorch(os.path.normpath(candidate), open_files):
                found = True
                break
        open_files.discard(path)
        reaches[path] = found
        return found

    for folder in ("sdk", "core", "plugins", "tests", "tools", "examples"):
        for dirpath, _, files in os.walk(os.path.join(root, folder)):
            for name in sorted(files):
                if name.endswith((".cpp", ".cc")):
                    path = os.path.join(dirpath, name)
                    if not reaches_libtorch(path, set()):
                        print(path)


if __name__ == "__main__":
    main()
