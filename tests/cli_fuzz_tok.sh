#!/usr/bin/env bash
# cli_fuzz_tok.sh — the short libFuzzer run of the tokenizers on arbitrary text (fuzz/fuzz_tok.c):
# scripts/fuzz.sh --short tok (~15 s, ASan + UBSan) as a ctest. Fails on any finding;
# skips (77) with a message when clang is absent. docs/fuzzing.md says what the harness checks.
exec bash "${MUSER_SOURCE_DIR:?MUSER_SOURCE_DIR not set}/tests/fuzz_ctest.sh" tok
