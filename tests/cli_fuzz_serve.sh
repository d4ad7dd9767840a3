#!/usr/bin/env bash
# cli_fuzz_serve.sh — the short libFuzzer run of `muser serve`'s request decoding
# (fuzz/fuzz_serve.c): scripts/fuzz.sh --short serve (~15 s, ASan + UBSan) as a ctest. Fails on any
# finding; skips (77) with a message when clang is absent. docs/fuzzing.md says what it checks.
exec bash "${MUSER_SOURCE_DIR:?MUSER_SOURCE_DIR not set}/tests/fuzz_ctest.sh" serve
