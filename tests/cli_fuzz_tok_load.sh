#!/usr/bin/env bash
# cli_fuzz_tok_load.sh — the short libFuzzer run of tokenizer loading from hostile
# tokenizer.ggml.* metadata (fuzz/fuzz_tok_load.c):
# scripts/fuzz.sh --short tok_load (~15 s, ASan + UBSan) as a ctest. Fails on any finding;
# skips (77) with a message when clang is absent. docs/fuzzing.md says what the harness checks.
exec bash "${MUSER_SOURCE_DIR:?MUSER_SOURCE_DIR not set}/tests/fuzz_ctest.sh" tok_load
