#!/usr/bin/env python3
"""What a prebuilt Tessera needs to load on a GPU machine that has LibTorch (its Python's torch),
CUDA and the base system, and nothing of our Debian libraries (tools/device/bundle.sh, gpu.sh).

    bundle_libs.py closure FILE...              the libraries to carry for these ELF files
    bundle_libs.py copy DEST FILE...            copies them into DEST (stripped)
    bundle_libs.py check-list FILE...           the closure against tools/device/bundle-libraries.txt
    bundle_libs.py requires FILE...             the newest GLIBC_/GLIBCXX_/CXXABI_ versions they need
    bundle_libs.py machine-has REQUIRES_FILE    whether this machine's glibc and libstdc++ give them
    bundle_libs.py check-loads BUNDLE TORCH_LIB every ELF under BUNDLE resolves from BUNDLE/lib,
                                                TORCH_LIB (and its CUDA/NCCL), or the base system
    bundle_libs.py selftest BUILD_DIR           stages BUILD_DIR's binaries as bundle.sh does into a
                                                temporary folder and runs check-list and check-loads

A library is one of three kinds: the base system (glibc, libstdc++, libgcc: on every machine),
LibTorch and CUDA (the torch wheel, its nvidia-* packages, the CUDA toolkit: on the GPU machine
already), or one to carry. The carried set is written down in tools/device/bundle-libraries.txt,
so that a new dependency changes a reviewed file (and the bundle's size) rather than slipping in;
bundle.sh refuses a closure that differs from it, and the test Device.BundleCarriesWhatTheBuildLoads
runs `selftest` on every build. Exit status 0 when all is well, 1 otherwise.
"""
import os
import pathlib
import re
import shutil
import subprocess
import sys
import tempfile

ROOT = pathlib.Path(__file__).resolve().parents[2]
LIST = ROOT / "tools/device/bundle-libraries.txt"
# glibc's libraries, the C++ runtime and the loader: on any machine that runs C++ programs.
BASE = re.compile(r"^(libc|libm|libpthread|libdl|librt|libresolv|libutil|libmvec|libstdc\+\+|libgcc_s|"
                  r"ld-linux-x86-64|linux-vdso)\.so")
# LibTorch and what it brings: the torch wheel's lib/, its nvidia-* wheels, the CUDA toolkit and
# the driver's libraries.
TORCH = re.compile(r"/site-packages/(torch|nvidia|triton)/|/usr/local/cuda|/usr/local/nvidia|libcuda\.so")
# CUDA's and NCCL's own libraries by name, wherever the loader found them: a machine may link them
# into /usr/local/lib or /usr/lib (the CI machine's libcudart.so.13 is /usr/local/lib's link).
CUDA_SONAME = re.compile(r"^lib(cuda|cudart|cublas|cublasLt|cufft|curand|cusparse|cusparseLt|cusolver|cudnn\w*|"
                         r"nvrtc\w*|nvJitLink|nvToolsExt|nvrtx|cupti|nccl|nvshmem\w*|cufile)\.so")
VERSION = re.compile(r"\b(GLIBC|GLIBCXX|CXXABI)_(\d+(?:\.\d+)*)\b")


def is_elf(path):
    try:
        with open(path, "rb") as f:
            return f.read(4) == b"\x7fELF"
    except OSError:
        return False


def ldd(path, env=None):
    """(soname, resolved path or None) for every library the loader would map for PATH."""
    out = subprocess.run(["ldd", str(path)], capture_output=True, text=True, env=env).stdout
    for line in out.splitlines():
        line = line.strip()
        m = re.match(r"(\S+) => (\S+)", line)
        if m:
            yield m.group(1), (None if m.group(2) == "not" else m.group(2))
        elif line and not line.startswith(("linux-vdso", "statically")):
            yield pathlib.Path(line.split()[0]).name, line.split()[0]


def kind(soname, resolved):
    if BASE.match(soname):
        return "base"
    if CUDA_SONAME.match(soname):
        return "torch"
    if resolved and (TORCH.search(resolved) or TORCH.search(os.path.realpath(resolved))):
        return "torch"
    return "carry"


def closure(files, own_dirs=()):
    """{soname: path} of the libraries to carry for FILES: neither base, nor LibTorch/CUDA, nor
    one of our own (those in OWN_DIRS, which bundle.sh copies itself). ldd lists the whole
    dependency tree already."""
    own = [str(pathlib.Path(d).resolve()) for d in own_dirs]
    carry, missing = {}, []
    for f in files:
        for soname, resolved in ldd(f):
            if resolved is None:
                missing.append(f"{f}: {soname}")
            elif kind(soname, resolved) == "carry" and not any(str(pathlib.Path(resolved).resolve()).startswith(d + "/")
                                                            for d in own):
                carry[soname] = resolved
    if missing:
        sys.exit("bundle_libs: not found here: " + "; ".join(missing))
    return carry


def listed():
    text = LIST.read_text()
    return {w for line in text.splitlines() for w in line.split("#")[0].split()}


def compare_with_list(carry):
    expected = listed()
    ok = True
    for soname in sorted(set(carry) - expected):
        print(f"bundle_libs: {soname} ({carry[soname]}) is loaded but not in {LIST.relative_to(ROOT)}: add it")
        ok = False
    for soname in sorted(expected - set(carry)):
        print(f"bundle_libs: {soname} is in {LIST.relative_to(ROOT)} but nothing loads it: remove it")
        ok = False
    return ok


def copy(dest, carry):
    dest = pathlib.Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    for soname, path in sorted(carry.items()):
        target = dest / soname
        shutil.copy2(path, target)
        os.chmod(target, 0o755)
        subprocess.run(["strip", "--strip-unneeded", str(target)], check=True)


def version_key(v):
    return tuple(int(x) for x in v.split("."))


def requires(files):
    """{prefix: newest version} over the version references of FILES."""
    newest = {}
    for f in files:
        out = subprocess.run(["objdump", "-p", str(f)], capture_output=True, text=True).stdout
        for prefix, version in VERSION.findall(out.split("Version References:", 1)[-1]):
            if prefix not in newest or version_key(version) > version_key(newest[prefix]):
                newest[prefix] = version
    return newest


def machine_has():
    """{prefix: newest version} this machine's glibc and the libstdc++ its loader picks provide."""
    have = {"GLIBC": os.confstr("CS_GNU_LIBC_VERSION").split()[-1]}
    cache = subprocess.run(["/sbin/ldconfig", "-p"], capture_output=True, text=True).stdout
    libstdcxx = next((line.split("=>")[-1].strip() for line in cache.splitlines()
                      if "libstdc++.so.6 " in line and "x86-64" in line), None)
    if libstdcxx:
        data = pathlib.Path(libstdcxx).read_bytes().decode("latin-1")
        for prefix in ("GLIBCXX", "CXXABI"):
            versions = [v for p, v in VERSION.findall(data) if p == prefix]
            if versions:
                have[prefix] = max(versions, key=version_key)
    return have, libstdcxx


def elf_files(bundle):
    return sorted(p for p in pathlib.Path(bundle).rglob("*") if p.is_file() and is_elf(p))


def check_loads(bundle, torch_lib):
    """Every ELF file under BUNDLE resolves with LD_LIBRARY_PATH=BUNDLE/lib:TORCH_LIB to the bundle,
    LibTorch/CUDA or the base system (what the GPU machine gives it), nothing else."""
    bundle = pathlib.Path(bundle).resolve()
    env = dict(os.environ, LD_LIBRARY_PATH=f"{bundle}/lib:{torch_lib}")
    problems, counts = [], {"bundle": 0, "torch": 0, "base": 0}
    for f in elf_files(bundle):
        for soname, resolved in ldd(f, env):
            if resolved is None:
                problems.append(f"{f.relative_to(bundle)}: {soname} not found")
            elif str(pathlib.Path(resolved).resolve()).startswith(str(bundle) + "/"):
                counts["bundle"] += 1
            elif kind(soname, resolved) in ("base", "torch"):
                counts[kind(soname, resolved)] += 1
            else:
                problems.append(f"{f.relative_to(bundle)}: {soname} resolves outside the bundle, to {resolved}")
    print(f"check-loads: {len(elf_files(bundle))} files; references resolved from the bundle {counts['bundle']}, "
          f"LibTorch/CUDA {counts['torch']}, the base system {counts['base']}")
    for p in problems:
        print(f"check-loads: {p}")
    return not problems


def bundle_elf_inputs(build):
    """The files of BUILD that bundle.sh carries: the host, the SDK and core libraries, the
    bundled plugins and the unit tests (the CUDA-only ones run from it)."""
    build = pathlib.Path(build)
    files = [build / "bin/tessera", build / "bin/tessera_unit_tests"]
    files += sorted((build / "lib").glob("*.so*")) + sorted((build / "plugins").glob("*.so"))
    return [f for f in files if f.is_file() and not f.is_symlink()]


def classifies_cuda_wherever_it_lies():
    """The kinds of libraries as another machine's loader may resolve them (the CI machine's
    libcudart.so.13 came from /usr/local/lib, a link into the toolkit)."""
    cases = [("libcudart.so.13", "/usr/local/lib/libcudart.so.13", "torch"),
             ("libnccl.so.2", "/usr/lib/x86_64-linux-gnu/libnccl.so.2", "torch"),
             ("libc10.so", "/w/.venv/lib/python3.11/site-packages/torch/lib/libc10.so", "torch"),
             ("libstdc++.so.6", "/usr/lib/x86_64-linux-gnu/libstdc++.so.6", "base"),
             ("libfmt.so.9", "/usr/lib/x86_64-linux-gnu/libfmt.so.9", "carry"),
             ("libcudacxx_like.so.1", "/usr/lib/libcudacxx_like.so.1", "carry")]
    ok = True
    for soname, resolved, expected in cases:
        if kind(soname, resolved) != expected:
            print(f"selftest: {soname} at {resolved} is taken for {kind(soname, resolved)}, not {expected}")
            ok = False
    return ok


def selftest(build):
    build = pathlib.Path(build).resolve()
    if not classifies_cuda_wherever_it_lies():
        return False
    inputs = bundle_elf_inputs(build)
    if not (build / "bin/tessera").is_file():
        print(f"selftest: {build}/bin/tessera is not built")
        return False
    carry = closure(inputs, own_dirs=[build])
    ok = compare_with_list(carry)
    torch_lib = next((pathlib.Path(p) for p in re.findall(r"(/\S+/torch/lib)/libc10\.so", " ".join(
        r or "" for _, r in ldd(build / "bin/tessera")))), None)
    with tempfile.TemporaryDirectory(prefix="tessera-bundle-selftest.") as tmp:
        for sub in ("bin", "lib", "plugins"):
            (pathlib.Path(tmp) / sub).mkdir()
        for f in inputs:
            sub = "bin" if f.parent.name == "bin" else f.parent.name
            shutil.copy2(f, pathlib.Path(tmp) / sub / f.name)
        copy(pathlib.Path(tmp) / "lib", carry)
        ok = check_loads(tmp, torch_lib) and ok
    print(f"selftest: {len(carry)} libraries carried for {len(inputs)} files: {' '.join(sorted(carry))}")
    return ok


def main(argv):
    if len(argv) < 2:
        sys.exit(__doc__)
    command, args = argv[1], argv[2:]
    if command == "closure":
        for soname, path in sorted(closure(args).items()):
            print(soname, path)
        return 0
    if command == "copy":
        copy(args[0], closure(args[1:], own_dirs=[ROOT / "build"]))
        return 0
    if command == "check-list":
        return 0 if compare_with_list(closure(args, own_dirs=[ROOT / "build"])) else 1
    if command == "requires":
        for prefix, version in sorted(requires(args).items()):
            print(f"{prefix}_{version}")
        return 0
    if command == "machine-has":
        needed = dict(line.strip().split("_", 1) for line in pathlib.Path(args[0]).read_text().split() if line)
        have, libstdcxx = machine_has()
        ok = True
        for prefix, version in sorted(needed.items()):
            got = have.get(prefix)
            fits = got is not None and version_key(got) >= version_key(version)
            ok = ok and fits
            print(f"machine-has: {prefix}_{version} needed, {prefix}_{got or '?'} here"
                  f"{'' if prefix == 'GLIBC' else f' ({libstdcxx})'}: {'ok' if fits else 'TOO OLD'}")
        return 0 if ok else 1
    if command == "check-loads":
        return 0 if check_loads(args[0], args[1]) else 1
    if command == "selftest":
        return 0 if selftest(args[0]) else 1
    sys.exit(__doc__)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
