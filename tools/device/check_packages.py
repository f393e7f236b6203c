#!/usr/bin/env python3
"""Device.PackagesCoverWhatTheBuildUses: every Debian package that the build in BUILD_DIR found at
configure time or links at run time is listed in tools/device/packages.txt, so that a GPU machine
without them (tools/device/gpu.sh) gets it. Without this check, a new dependency would first
show up as a failed build on a lent GPU, whose time is short.

    tools/device/check_packages.py BUILD_DIR

What it asks dpkg about:
  - configure time: the CMake packages' folders (`<Package>_DIR` in CMakeCache.txt), the
    libraries pkg-config found (`pkgcfg_lib_*`), protoc and pkg-config;
  - run time: what `ldd` resolves for the host, the SDK, the plugins and the test binaries.
LibTorch and CUDA (the torch wheel, the CUDA toolkit) are on the GPU machine already; so are
glibc, the compiler's runtime and zlib. Exit status 77 (a skip for CTest) where dpkg is missing.
"""
import pathlib
import re
import shutil
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]
# On any machine that can build C++: glibc, the compiler's runtime, zlib.
BASE = {"libc6", "libgcc-s1", "libstdc++6", "zlib1g"}
# Found at configure time but brought by the GPU machine itself.
NOT_DEBIAN = re.compile(r"site-packages|/usr/local/|/\.venv/")


def listed_packages():
    text = (ROOT / "tools/device/packages.txt").read_text()
    return {word for line in text.splitlines() for word in line.split("#")[0].split()}


def owners(path):
    """The Debian packages that own PATH (a file or a folder); empty when none does."""
    for candidate in {str(path), str(path).replace("/usr/lib/", "/lib/", 1)}:
        proc = subprocess.run(["dpkg", "-S", candidate], capture_output=True, text=True)
        if proc.returncode == 0:
            first = proc.stdout.splitlines()[0]
            return {p.strip().split(":")[0] for p in first.rsplit(": ", 1)[0].split(",")}
    return set()


def configure_time_paths(build):
    cache = (build / "CMakeCache.txt").read_text().splitlines()
    wanted = re.compile(r"^([A-Za-z0-9_-]+_DIR|pkgcfg_lib_[^:]+|PKG_CONFIG_EXECUTABLE|Protobuf_PROTOC_EXECUTABLE)"
                        r":(PATH|FILEPATH)=(/.+)$")
    for line in cache:
        m = wanted.match(line)
        if m and not NOT_DEBIAN.search(m.group(3)) and not m.group(1).startswith(("CUDA", "Torch", "Caffe2")):
            yield m.group(1), pathlib.Path(m.group(3))


def run_time_paths(build):
    binaries = [p for p in (build / "bin").iterdir() if p.is_file()]
    binaries += sorted((build / "lib").glob("*.so*")) + sorted((build / "plugins").glob("*.so"))
    for binary in binaries:
        out = subprocess.run(["ldd", str(binary)], capture_output=True, text=True).stdout
        for m in re.finditer(r"=> (/\S+)", out):
            if not NOT_DEBIAN.search(m.group(1)):
                yield binary.name, pathlib.Path(m.group(1)).resolve()


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    if not shutil.which("dpkg"):
        print("dpkg is not on this machine: the package list cannot be checked here")
        return 77
    build = pathlib.Path(sys.argv[1])
    listed = listed_packages()
    missing = {}
    checked = set()
    for what, path in list(configure_time_paths(build)) + list(run_time_paths(build)):
        if path in checked:
            continue
        checked.add(path)
        found = owners(path)
        if found and not (found & (listed | BASE)):
            missing.setdefault(", ".join(sorted(found)), []).append(f"{what}: {path}")
    print(f"checked {len(checked)} paths against {len(listed)} packages in tools/device/packages.txt")
    for package, uses in sorted(missing.items()):
        print(f"not in tools/device/packages.txt: {package} (for {'; '.join(uses[:3])})")
    return 1 if missing else 0


if __name__ == "__main__":
    sys.exit(main())
