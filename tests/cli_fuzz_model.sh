#!/usr/bin/env bash
# cli_fuzz_model.sh — the short libFuzzer run of the model binder and a 1-token oracle forward
# on mutated micro models (fuzz/fuzz_model.c):
# scripts/fuzz.sh --short model (~15 s, ASan + UBSan) as a ctest. Fails on any finding;
# skips (77) with a message when clang is absent. docs/fuzzing.md says what the harness checks.
exec bash "${MUSER_SOURCE_DIR:?MUSER_SOURCE_DIR not set}/tests/fuzz_ctest.sh" model
