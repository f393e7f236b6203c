#!/usr/bin/env bash
# Here, before a GPU lease: builds Tessera (release, build/, against .venv's torch==2.11.0 CUDA 13
# wheel, the LibTorch the GPU machine's python3 holds) and packs into the git-ignored .device/
# everything a run there needs that the machine lacks, so that nothing is built there:
#   .device/bundle/bin/      tessera and tessera_unit_tests (its CUDA-only tests), stripped
#   .device/bundle/lib/      the SDK and core libraries, and every library they load that is
#                            neither LibTorch/CUDA/NCCL nor the base system (glibc, libstdc++,
#                            libgcc): tools/device/bundle-libraries.txt lists them
#   .device/bundle/plugins/  the bundled plugins
#   .device/bundle/requires.txt  the newest GLIBC_/GLIBCXX_/CXXABI_ versions all of it needs
#   .device/bundle/manifest.txt  commit, torch, date, sizes
#   .device/data/fortunes/   the quickstart's token files
#   .device/wheels/          TRL and what it needs beyond the GPU machine's image (datasets, dill,
#                            multiprocess), for tools/bench/grpo there: pure-Python wheels for its
#                            Python 3.12, at the versions .venv holds
#   .device/debs/            the Debian packages of a fallback build there (tools/device/prepare.sh),
#                            used only where the bundle cannot load; --without-debs leaves them out
#                            (they are ~23 MB of the 64 MiB a call carries)
# The scripts travel with the working tree. Prints the bundle's size and what a device call
# carries in all (the working tree plus .device), which must stay under 64 MiB.
#   tools/device/bundle.sh [--without-debs]
set -euo pipefail
with_debs=1
[ "${1:-}" = "--without-debs" ] && with_debs=0
source "$(dirname "${BASH_SOURCE[0]}")/../env.sh"
want_torch=2.11.0
got=$(.venv/bin/python3 -c 'import torch; print(torch.__version__, torch.version.cuda)')
case "$got" in
  "$want_torch+cu13"*" 13."*) ;;
  *) echo "bundle: .venv's torch is '$got'; the GPU machine's is $want_torch+cu130 (tools/setup.sh installs it)" >&2
     exit 1 ;;
esac
cmake --build --preset default --target tessera tessera_plugins tessera_unit_tests

dest=.device/bundle
rm -rf "$dest" && mkdir -p "$dest/bin" "$dest/lib" "$dest/plugins" .device/data
cp build/bin/tessera build/bin/tessera_unit_tests "$dest/bin/"
cp -P build/lib/*.so* "$dest/lib/"
cp build/plugins/*.so "$dest/plugins/"
for f in "$dest"/bin/* "$dest"/plugins/*.so "$dest"/lib/*.so*; do
  [ -L "$f" ] || strip --strip-unneeded "$f"
done
mapfile -t elves < <(ls build/bin/tessera build/bin/tessera_unit_tests build/plugins/*.so; find build/lib -maxdepth 1 -name '*.so*' -type f)
# The carried libraries must be the reviewed list (a new one changes the bundle's size).
python3 tools/device/bundle_libs.py check-list "${elves[@]}"
python3 tools/device/bundle_libs.py copy "$dest/lib" "${elves[@]}"
mapfile -t bundled < <(find "$dest" -type f)
python3 tools/device/bundle_libs.py requires "${bundled[@]}" > "$dest/requires.txt"
torch_lib=$(.venv/bin/python3 -c 'import os, torch; print(os.path.join(os.path.dirname(torch.__file__), "lib"))')
python3 tools/device/bundle_libs.py check-loads "$dest" "$torch_lib"

if [ ! -f data/fortunes/train.bin ]; then
  .venv/bin/python3 tools/data/text_to_tokens.py /usr/share/games/fortunes --exclude art --exclude ascii-art \
    --fortune-split --out data/fortunes
fi
rm -rf .device/data/fortunes && cp -r data/fortunes .device/data/fortunes
rm -rf .device/wheels && mkdir -p .device/wheels
wheels=()
for name in trl datasets dill multiprocess; do
  wheels+=("$name==$(.venv/bin/python3 -m pip show "$name" | sed -n 's/^Version: //p')")
done
.venv/bin/python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux2014_x86_64 -d .device/wheels "${wheels[@]}"
if [ "$with_debs" = 1 ]; then
  tools/device/prepare.sh >/dev/null
else
  rm -rf .device/debs
fi
grep -qxF "/.device/" .gitignore || { echo "bundle: .device/ must be in .gitignore" >&2; exit 1; }

{
  echo "commit $(git rev-parse HEAD)$(git diff --quiet HEAD -- . ':!.device' || echo ' (with uncommitted changes)')"
  echo "torch $got"
  echo "built $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(. /etc/os-release && echo "$PRETTY_NAME"), $(c++ --version | head -1)"
  echo "requires $(tr '\n' ' ' < "$dest/requires.txt")"
} > "$dest/manifest.txt"
bytes() { du -sb "$@" | awk '{s += $1} END {print s}'; }
device_bytes=$(bytes .device)
tree_bytes=$(git ls-files -z -co --exclude-standard | xargs -0 -r du -cb 2>/dev/null | tail -1 | cut -f1)
total=$((device_bytes + tree_bytes))
mib() { awk -v b="$1" 'BEGIN {printf "%.1f MiB", b / 1048576}'; }
echo "bundle: $dest $(mib "$(bytes "$dest")") (bin $(mib "$(bytes "$dest/bin")"), lib $(mib "$(bytes "$dest/lib")"),"\
     "plugins $(mib "$(bytes "$dest/plugins")")); .device in all $(mib "$device_bytes")"
echo "bundle: a device call carries $(mib "$total") (working tree $(mib "$tree_bytes") + .device); the limit is 64 MiB"
[ "$total" -lt $((64 * 1048576)) ] || { echo "bundle: over the 64 MiB a device call may carry" >&2; exit 1; }
echo "bundle: requires $(tr '\n' ' ' < "$dest/requires.txt")"
echo 'bundle: next, device run(command="tools/device/gpu.sh", carry=[".device"], timeout_s=570)'
