#!/usr/bin/env python3
"""The source tree's structure as docs/architecture.md states it, checked:

- the SDK's folders are used top-down: a header or source in one folder includes only SDK
  headers of its own folder or of the folders above it (LAYERS, the order of the table in
  docs/architecture.md); text/ is its own library over the SDK, so no other folder includes it;
  a root header is either a basic or plumbing;
- sdk/src mirrors sdk/include: every folder of sources has its folder of headers;
- core/ includes nothing from plugins/ and its CMakeLists names no plugins/ path or plugin
  target, and the plugins' own sources (their tests aside) include nothing from core/;
- no source file in core/, sdk/ or plugins/ is longer than 400 lines (tests aside).

Usage: structure.py SOURCE_DIR. Prints every violation and exits 1 if there is one."""
import pathlib
import re
import sys

# Top to bottom; a folder uses those above it, never one below. The root's headers split in
# two: the basics every folder may use, and the plugin plumbing built on the configs and the run.
LAYERS = ["(base)", "run", "config", "formats", "text", "kernels", "parallel", "components", "nn", "generation", "(plumbing)"]
LEAVES = {"text"}  # a library of its own (libtessera_text.so) over the SDK
BASE = {"error.hpp", "log.hpp", "version.hpp", "export.hpp", "build_record.hpp"}
PLUMBING = {"registry.hpp", "plugin.hpp"}
MAX_LINES = 400
INCLUDE = re.compile(r'^\s*#\s*include\s+"tessera/([^"]+)"', re.M)
SOURCES = (".cpp", ".hpp", ".h", ".cc")


def layer_of_include(path):
    parts = path.split("/")
    if len(parts) == 1:
        return "(plumbing)" if parts[0] in PLUMBING else "(base)" if parts[0] in BASE else "(root?)"
    return parts[0]


def layer_of_file(sdk, f):
    rel = f.relative_to(sdk / "include" / "tessera") if (sdk / "include") in f.parents else f.relative_to(sdk / "src")
    if len(rel.parts) == 1:
        header = rel.stem + ".hpp"
        return "(plumbing)" if header in PLUMBING else "(base)" if header in BASE else "(root?)"
    return rel.parts[0]


def is_test(f, src):
    return f.stem.endswith("_test") or f.stem.startswith("test_") or "tests" in f.relative_to(src).parts


def main(src):
    src = pathlib.Path(src)
    sdk = src / "sdk"
    problems = []
    rank = {name: i for i, name in enumerate(LAYERS)}
    for f in sorted(list((sdk / "include" / "tessera").rglob("*")) + list((sdk / "src").rglob("*"))):
        if f.suffix not in SOURCES:
            continue
        mine = layer_of_file(sdk, f)
        if mine not in rank:
            problems.append(f"{f.relative_to(src)}: folder {mine} is not in the SDK's layers {LAYERS}")
            continue
        for inc in INCLUDE.findall(f.read_text(errors="replace")):
            if inc.startswith("core/"):
                problems.append(f"{f.relative_to(src)}: the SDK includes the engine's {inc}")
                continue
            theirs = layer_of_include(inc)
            if theirs not in rank:
                problems.append(f"{f.relative_to(src)} includes tessera/{inc}, in no layer of {LAYERS}")
            elif theirs in LEAVES and mine != theirs:
                problems.append(f"{f.relative_to(src)} ({mine}) includes tessera/{inc}: {theirs}/ is a library of its own")
            elif rank[theirs] > rank[mine]:
                problems.append(f"{f.relative_to(src)} ({mine}) includes tessera/{inc} ({theirs}), a folder below it")
    include_dirs = {p.name for p in (sdk / "include" / "tessera").iterdir() if p.is_dir()}
    for d in (sdk / "src").iterdir():
        if d.is_dir() and d.name not in include_dirs:
            problems.append(f"sdk/src/{d.name}/ has no sdk/include/tessera/{d.name}/")
    for f in sorted((src / "core").rglob("*")):
        if f.suffix in SOURCES and re.search(r'#\s*include\s+"(\.\./)*plugins/', f.read_text(errors="replace")):
            problems.append(f"{f.relative_to(src)}: the engine includes a plugin's file")
    core_cmake = (src / "core" / "CMakeLists.txt").read_text()
    if re.search(r"\$\{(PROJECT|CMAKE)_SOURCE_DIR\}/plugins|\.\./plugins", core_cmake):
        problems.append("core/CMakeLists.txt: the engine names a plugins/ path")
    for cm in (src / "plugins").rglob("CMakeLists.txt"):
        for target in re.findall(r"(?:add_library|tessera_add_plugin)\(\s*([A-Za-z0-9_]+)", cm.read_text()):
            if re.search(r"\b(tessera_)?" + re.escape(target) + r"\b", core_cmake):
                problems.append(f"core/CMakeLists.txt: the engine names the plugin target {target} ({cm.relative_to(src)})")
    for f in sorted((src / "plugins").rglob("*")):
        if f.suffix in SOURCES and not is_test(f, src) and re.search(r'#\s*include\s+"tessera/core/', f.read_text(errors="replace")):
            problems.append(f"{f.relative_to(src)}: a plugin includes the engine (tessera/core/)")
    for top in ("core", "sdk", "plugins"):
        for f in sorted((src / top).rglob("*")):
            if f.suffix in SOURCES and not is_test(f, src):
                n = len(f.read_text(errors="replace").splitlines())
                if n > MAX_LINES:
                    problems.append(f"{f.relative_to(src)}: {n} lines (at most {MAX_LINES})")
    for p in problems:
        print(p)
    print(f"structure: {len(problems)} problem(s)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else "."))
