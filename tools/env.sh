# Sourced by tools/test.sh and tools/quickstart.sh: runs the set-up and exports the build's
# environment (ccache outside the checkout, paths relative to it so every clone shares hits).
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
export CCACHE_DIR=${CCACHE_DIR:-$HOME/.cache/tessera-ccache}
export CCACHE_BASEDIR=${CCACHE_BASEDIR:-$root}
tools/setup.sh
