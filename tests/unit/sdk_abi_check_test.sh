#!/usr/bin/env bash
# The SDK ABI check (cmake/SdkAbi.cmake) on the real headers, then on a copy of the SDK:
# comment-only edits and a new release version pass; a changed declaration without a version bump fails and says so;
# re-recording a version with other headers is refused; a bump plus a record passes.
set -euo pipefail
src=$1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# CMake wraps long messages; the output is read with its white space folded.
check() { cmake -DSDK_DIR="$tmp/sdk" "$@" -P "$src/cmake/SdkAbi.cmake" 2>&1 | tr -s " \n" "  "; }
fail() { echo "FAIL: $*"; exit 1; }

cmake -P "$src/cmake/SdkAbi.cmake" >/dev/null 2>&1 || fail "the checked-in headers do not match sdk/abi_versions.txt"

mkdir -p "$tmp/sdk"
cp -r "$src/sdk/include" "$tmp/sdk/include"
cp "$src/sdk/abi_versions.txt" "$tmp/sdk/"
out=$(check) || fail "the unchanged copy fails: $out"

# Documentation is not ABI.
printf '\n// A comment the test added.\n/* and a block\n   comment */\n' >> "$tmp/sdk/include/tessera/run/batch.hpp"
out=$(check) || fail "a comment-only change fails the check: $out"

# Nor is a release: the version string is not part of the hash.
sed -i 's/^#define TESSERA_VERSION_STRING ".*"/#define TESSERA_VERSION_STRING "9.9.9"/' "$tmp/sdk/include/tessera/version.hpp"
grep -q '"9.9.9"' "$tmp/sdk/include/tessera/version.hpp" || fail "the test could not edit version.hpp"
out=$(check) || fail "a new release version fails the check: $out"

# A new member in a public struct, the version unchanged: the build must fail.
sed -i 's/struct StepMetrics {/struct StepMetrics {\n  int added_by_the_test = 0;/' "$tmp/sdk/include/tessera/components/callback.hpp"
grep -q added_by_the_test "$tmp/sdk/include/tessera/components/callback.hpp" || fail "the test could not edit callback.hpp"
if out=$(check); then fail "a changed header passed the check without a version bump"; fi
grep -q "the public SDK headers changed" <<<"$out" || fail "unexpected message: $out"
grep -q "bump TESSERA_SDK_ABI_VERSION" <<<"$out" || fail "the message does not say what to do: $out"

# The record of a released version cannot be overwritten to make the check pass.
if out=$(check -DMODE=record); then fail "re-recording the same version with other headers was accepted"; fi
grep -q "cannot be re-recorded" <<<"$out" || fail "unexpected message: $out"

# Bumped but not recorded: still a failure, naming the command.
sed -i 's/^#define TESSERA_SDK_ABI_VERSION [0-9]*/#define TESSERA_SDK_ABI_VERSION 9999/' "$tmp/sdk/include/tessera/version.hpp"
if out=$(check); then fail "a bumped version without a record passed"; fi
grep -q "9999 has no recorded header hash" <<<"$out" || fail "unexpected message: $out"

# Bumped and recorded: passes.
check -DMODE=record >/dev/null || fail "recording the bumped version failed"
grep -q "^9999 " "$tmp/sdk/abi_versions.txt" || fail "the record has no line for 9999"
out=$(check) || fail "the bumped and recorded headers fail: $out"
echo "SDK ABI check: all cases behave"
