#!/usr/bin/env bash
# fuzz_ctest.sh TARGET [MIN_INPUTS] — the body of the tests/cli_fuzz_<target>.sh ctests: one short libFuzzer
# run (scripts/fuzz.sh --short TARGET, ASan + UBSan) that fails on any finding or when the
# fuzzer did not really run, and skips (77) with a message when clang is absent. Not a test
# itself (the ctest glob takes tests/cli_*.sh only).
set -uo pipefail
TARGET=${1:?usage: fuzz_ctest.sh TARGET [MIN_INPUTS]}
MIN=${2:-1000} # inputs the short run must get through (a slow harness passes fewer)
SRC=${MUSER_SOURCE_DIR:?MUSER_SOURCE_DIR not set}
BUILD=${MUSER_BUILD_DIR:-$PWD}
if ! command -v clang >/dev/null 2>&1 && ! command -v clang-14 >/dev/null 2>&1; then
  echo "SKIP: clang not found; the $TARGET fuzzer needs clang with libFuzzer (scripts/fuzz.sh)"
  exit 77
fi
if [ "${MUSER_SANITIZED:-0}" = 1 ]; then
  echo "note: MUSER_SANITIZED=1; the fuzzer carries its own ASan/UBSan build, running it anyway"
fi
export MUSER_FUZZ_DIR="$BUILD/fuzz"
# scripts/fuzz.sh keeps gguf in $MUSER_FUZZ_DIR itself, every other target in a folder of its own
tdir="$MUSER_FUZZ_DIR/$TARGET"
[ "$TARGET" = gguf ] && tdir="$MUSER_FUZZ_DIR"
rm -rf "$tdir/corpus"
log="$BUILD/fuzz-$TARGET.log"
mkdir -p "$MUSER_FUZZ_DIR"
bash "$SRC/scripts/fuzz.sh" --short "$TARGET" >"$log" 2>&1
rc=$?
grep -E "^fuzz_$TARGET: (vocabulary|no )" "$log"
tail -n 6 "$log"
if [ $rc -eq 77 ]; then
  exit 77
fi
if [ $rc -ne 0 ]; then
  echo "FAIL: fuzz_$TARGET exited $rc (full log: $log; crash inputs in $tdir)"
  grep -m 20 -E "ERROR|runtime error|invariant|SUMMARY|error:" "$log"
  exit 1
fi
execs=$(grep -o 'number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$')
if [ -z "$execs" ] || [ "$execs" -lt "$MIN" ]; then
  echo "FAIL: the fuzzer did not run (executed units: '${execs}')"
  exit 1
fi
echo "PASS: fuzz_$TARGET ran $execs inputs without a finding"
