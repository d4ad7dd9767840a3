#!/usr/bin/env bash
# cli_fuzz_gguf.sh — the short libFuzzer run of the GGUF reader (scripts/fuzz.sh --short, ~20 s,
# ASan + UBSan) as a ctest. Fails on any finding; skips (77) with a message when clang is absent.
set -uo pipefail
SRC=${MUSER_SOURCE_DIR:?MUSER_SOURCE_DIR not set}
BUILD=${MUSER_BUILD_DIR:-$PWD}
if ! command -v clang >/dev/null 2>&1 && ! command -v clang-14 >/dev/null 2>&1; then
  echo "SKIP: clang not found; the GGUF fuzzer needs clang with libFuzzer (scripts/fuzz.sh)"
  exit 77
fi
if [ "${MUSER_SANITIZED:-0}" = 1 ]; then
  echo "note: MUSER_SANITIZED=1; the fuzzer carries its own ASan/UBSan build, running it anyway"
fi
export MUSER_FUZZ_DIR="$BUILD/fuzz-gguf"
rm -rf "$MUSER_FUZZ_DIR/corpus"
log="$BUILD/fuzz-gguf.log"
mkdir -p "$MUSER_FUZZ_DIR"
bash "$SRC/scripts/fuzz.sh" --short >"$log" 2>&1
rc=$?
tail -n 8 "$log"
if [ $rc -eq 77 ]; then
  exit 77
fi
if [ $rc -ne 0 ]; then
  echo "FAIL: fuzz_gguf exited $rc (full log: $log; crash inputs in $MUSER_FUZZ_DIR)"
  grep -m 20 -E "ERROR|runtime error|invariant|SUMMARY" "$log"
  exit 1
fi
execs=$(grep -o 'number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$')
if [ -z "$execs" ] || [ "$execs" -lt 1000 ]; then
  echo "FAIL: the fuzzer did not run (executed units: '${execs}')"
  exit 1
fi
echo "PASS: fuzz_gguf ran $execs inputs without a finding"
