#!/usr/bin/env bash
# tools/fuzz/run.sh [SECONDS] [TARGET...]
#
# Builds the libFuzzer targets (preset fuzz: clang, everything they call instrumented, ASan +
# UBSan) and runs each for SECONDS (default 60) from its seed corpus tools/fuzz/corpus/NAME and
# every earlier finding kept in tools/fuzz/regressions/NAME. Inputs that reach new code go to
# build-fuzz/corpus/NAME, outside the tree. A finding stops that target with the reproducer in
# build-fuzz/findings/NAME/ and makes the script exit 1; fix it, then add the file to
# tools/fuzz/regressions/NAME/ so every later run replays it. Prints one line per target:
# executions, new corpus entries and findings (docs/robustness.md records them).
# TESSERA_FUZZ_SEED=N fixes libFuzzer's seed (tools/test.sh uses 1, so a CI run repeats the
# last one as far as time allows); unset, every run explores anew.
set -euo pipefail
seconds=${1:-60}
shift || true
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"
targets=("$@")
if [ ${#targets[@]} -eq 0 ]; then
  targets=(config_fuzzer safetensors_fuzzer checkpoint_metadata_fuzzer token_index_fuzzer tokenizer_json_fuzzer
           vocab_merges_fuzzer)
fi
export CCACHE_DIR=${CCACHE_DIR:-$HOME/.cache/tessera-ccache}
export CCACHE_BASEDIR=$root
command -v clang++ >/dev/null || { echo "run.sh: clang++ is missing (Debian: apt-get install clang)" >&2; exit 2; }
if ! configured=$(cmake --preset fuzz 2>&1); then echo "$configured" >&2; exit 2; fi
cmake --build --preset fuzz

# LibTorch's own one-time allocations at load are not ours to judge; leaks are checked by the
# unit suite under the sanitize preset instead. Any UBSan report is a finding.
export ASAN_OPTIONS=detect_leaks=0:abort_on_error=1:symbolize=1
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
status=0
summary=()
for t in "${targets[@]}"; do
  # This run's findings only; the seeds and kept regressions are read where present.
  rm -rf "build-fuzz/findings/$t"
  mkdir -p "build-fuzz/corpus/$t" "build-fuzz/findings/$t"
  inputs=("build-fuzz/corpus/$t")
  for d in "tools/fuzz/corpus/$t" "tools/fuzz/regressions/$t"; do [ -d "$d" ] && inputs+=("$d"); done
  log="build-fuzz/$t.log"
  before=$(ls "build-fuzz/corpus/$t" | wc -l)
  rc=0
  # The targets' scratch files (fuzz_support.hpp) go under build-fuzz/tmp, removed afterwards.
  export TMPDIR="$root/build-fuzz/tmp/$t"
  mkdir -p "$TMPDIR"
  "build-fuzz/fuzz/$t" -seed="${TESSERA_FUZZ_SEED:-0}" -max_total_time="$seconds" -rss_limit_mb=4096 -timeout=10 -max_len=65536 \
    -artifact_prefix="build-fuzz/findings/$t/" -print_final_stats=1 \
    "${inputs[@]}" >"$log" 2>&1 || rc=$?
  rm -rf "$TMPDIR"
  runs=$(grep -m1 -o 'stat::number_of_executed_units: [0-9]*' "$log" | grep -o '[0-9]*$' || echo 0)
  after=$(ls "build-fuzz/corpus/$t" | wc -l)
  findings=$(ls "build-fuzz/findings/$t" | wc -l)
  line=$(printf '%-28s %4ss  %10s executions  %5s new corpus entries  %s findings' "$t" "$seconds" "$runs" \
         "$((after - before))" "$findings")
  summary+=("$line")
  if [ "$rc" -ne 0 ] || [ "$findings" -ne 0 ]; then
    status=1
    echo "run.sh: $t found a problem (exit $rc); the log is $log, the input in build-fuzz/findings/$t/" >&2
    tail -40 "$log" >&2
  fi
done
printf '%s\n' "${summary[@]}"
exit $status
