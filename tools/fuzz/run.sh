#!/usr/bin/env bash
# tools/fuzz/run.sh [SECONDS] [TARGET...]
#
# Builds the libFuzzer targets (preset sanitize, build-sanitize/: clang, everything they call
# instrumented, ASan + UBSan; the same build serves the sanitized unit suite) and runs each for
# SECONDS (default 60) from its seed corpus tools/fuzz/corpus/NAME and every earlier finding kept
# in tools/fuzz/regressions/NAME, two targets at a time (one per core; each target is one
# process). Inputs that reach new code go to build-sanitize/fuzzing/corpus/NAME, outside the
# tree. A finding stops that target with the reproducer in build-sanitize/fuzzing/findings/NAME/
# and makes the script exit 1; fix it, then add the file to tools/fuzz/regressions/NAME/ so every
# later run replays it. Prints one line per target, in the order named: executions, new corpus
# entries and findings (docs/robustness.md records them).
# TESSERA_FUZZ_SEED=N fixes libFuzzer's seed (tools/test.sh uses 1, so a CI run repeats the
# last one as far as time allows); unset, every run explores anew. TESSERA_FUZZ_JOBS=N runs N
# targets at a time (default 2).
set -euo pipefail
seconds=${1:-60}
shift || true
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"
targets=("$@")
if [ ${#targets[@]} -eq 0 ]; then
  targets=(config_fuzzer safetensors_fuzzer checkpoint_metadata_fuzzer token_index_fuzzer tokenizer_json_fuzzer
           vocab_merges_fuzzer jinja_fuzzer parquet_fuzzer)
fi
export CCACHE_DIR=${CCACHE_DIR:-$HOME/.cache/tessera-ccache}
export CCACHE_BASEDIR=$root
command -v clang++ >/dev/null || { echo "run.sh: clang++ is missing (Debian: apt-get install clang)" >&2; exit 2; }
if ! configured=$(cmake --preset sanitize 2>&1); then echo "$configured" >&2; exit 2; fi
cmake --build --preset fuzz

# LibTorch's own one-time allocations at load are not ours to judge; leaks are checked by the
# unit suite under the sanitize preset instead. Any UBSan report is a finding.
export ASAN_OPTIONS=detect_leaks=0:abort_on_error=1:symbolize=1
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
out=build-sanitize/fuzzing
jobs=${TESSERA_FUZZ_JOBS:-2}

# fuzz_one TARGET: runs one target and writes its summary line, or its failure, to $out/TARGET.result.
fuzz_one() {
  local t=$1 rc=0
  # This run's findings only; the seeds and kept regressions are read where present.
  rm -rf "$out/findings/$t"
  mkdir -p "$out/corpus/$t" "$out/findings/$t"
  local inputs=("$out/corpus/$t") d
  for d in "tools/fuzz/corpus/$t" "tools/fuzz/regressions/$t"; do [ -d "$d" ] && inputs+=("$d"); done
  local log="$out/$t.log" before after runs findings
  before=$(ls "$out/corpus/$t" | wc -l)
  # The targets' scratch files (fuzz_support.hpp) go under $out/tmp, removed afterwards.
  local tmp="$root/$out/tmp/$t"
  mkdir -p "$tmp"
  TMPDIR="$tmp" "build-sanitize/fuzz/$t" -seed="${TESSERA_FUZZ_SEED:-0}" -max_total_time="$seconds" -rss_limit_mb=4096 \
    -timeout=10 -max_len=65536 -artifact_prefix="$out/findings/$t/" -print_final_stats=1 \
    "${inputs[@]}" >"$log" 2>&1 || rc=$?
  rm -rf "$tmp"
  runs=$(grep -m1 -o 'stat::number_of_executed_units: [0-9]*' "$log" | grep -o '[0-9]*$' || echo 0)
  after=$(ls "$out/corpus/$t" | wc -l)
  findings=$(ls "$out/findings/$t" | wc -l)
  printf '%-28s %4ss  %10s executions  %5s new corpus entries  %s findings\n' "$t" "$seconds" "$runs" \
    "$((after - before))" "$findings" >"$out/$t.result"
  if [ "$rc" -ne 0 ] || [ "$findings" -ne 0 ]; then
    { echo "run.sh: $t found a problem (exit $rc); the log is $log, the input in $out/findings/$t/"
      tail -40 "$log"; } >"$out/$t.failure"
  fi
}

# parquet_fuzzer exists where the build found Apache Arrow (the pyarrow wheel; tools/setup.sh).
kept=()
for t in "${targets[@]}"; do
  if [ "$t" = parquet_fuzzer ] && [ ! -x "build-sanitize/fuzz/$t" ]; then
    echo "run.sh: parquet_fuzzer skipped: this build has no Apache Arrow (pyarrow in .venv)"
    continue
  fi
  kept+=("$t")
done
targets=("${kept[@]}")
mkdir -p "$out"
rm -f "$out"/*.result "$out"/*.failure
running=0
for t in "${targets[@]}"; do
  if [ "$running" -ge "$jobs" ]; then wait -n || true; running=$((running - 1)); fi
  fuzz_one "$t" &
  running=$((running + 1))
done
wait
status=0
for t in "${targets[@]}"; do
  cat "$out/$t.result" 2>/dev/null || { echo "run.sh: $t left no result (see $out/$t.log)" >&2; status=1; }
done
for t in "${targets[@]}"; do
  if [ -f "$out/$t.failure" ]; then cat "$out/$t.failure" >&2; status=1; fi
done
exit $status
