#!/usr/bin/env bash
# Here (a machine with Debian's apt), before a GPU session's first device `run`: gathers into
# .device/ (git-ignored, carried with `carry: [".device"]`) what the GPU machine lacks, since it
# has CUDA, cmake, ninja, a compiler and Python's torch 2.11 (LibTorch + NCCL) but no network:
#   - .device/debs/  the Debian packages Tessera builds and links against (tools/device/gpu.sh
#                    unpacks them there into a private prefix, never into /);
#   - .device/data/  the quickstart's token files (data/fortunes, made here if missing).
# Prints the size (a device call carries at most 64 MiB with the working tree).
#   tools/device/prepare.sh [EXTRA_DEBIAN_PACKAGE...]
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$root"
dest=.device
# The packages: tools/device/packages.txt (and any given here).
mapfile -t packages < <(sed 's/#.*//' tools/device/packages.txt | tr -s ' ' '\n' | grep -v '^$')
packages+=("$@")
mkdir -p "$dest/debs" "$dest/data"
missing=()
for p in "${packages[@]}"; do
  compgen -G "$dest/debs/${p}_*.deb" >/dev/null || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "prepare: downloading ${#missing[@]} Debian packages into $dest/debs"
  (cd "$dest/debs" && apt-get -oAPT::Architecture=amd64 download "${missing[@]}" >/dev/null)
fi
if [ ! -f data/fortunes/train.bin ]; then
  python3 tools/data/text_to_tokens.py /usr/share/games/fortunes --exclude art --exclude ascii-art \
    --fortune-split --out data/fortunes
fi
rm -rf "$dest/data/fortunes" && cp -r data/fortunes "$dest/data/fortunes"
grep -qxF "/.device/" .gitignore || { echo "prepare: .device/ must be in .gitignore" >&2; exit 1; }
echo "prepare: $(du -sh "$dest" | cut -f1) in $dest; working tree $(git ls-files -z | du -sch --files0-from=- | tail -1 | cut -f1)"
echo "prepare: now device run(command=\"tools/device/gpu.sh build test\", carry=[\".device\"])"
