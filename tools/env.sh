# Sourced by tools/test.sh and tools/quickstart.sh: runs the set-up and exports the build's
# environment (ccache outside the checkout, paths relative to it so every clone shares hits).
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
export CCACHE_DIR=${CCACHE_DIR:-$HOME/.cache/tessera-ccache}
export CCACHE_BASEDIR=${CCACHE_BASEDIR:-$root}
# Builds with debug info (the sanitize and fuzz presets) would otherwise hash the build folder
# into every entry, so a fresh clone in another folder missed all of them (a cold 24-minute
# sanitized build in CI); its debug info then names the folder the object was first built in.
export CCACHE_NOHASHDIR=${CCACHE_NOHASHDIR:-1}
tools/setup.sh
