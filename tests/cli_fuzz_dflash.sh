#!/usr/bin/env bash
# cli_fuzz_dflash.sh — the short libFuzzer run of the DFlash drafter's binder, a context step and a
# block on edited micro drafters (fuzz/fuzz_dflash.c): scripts/fuzz.sh --short dflash (~40 s,
# ASan + UBSan) as a ctest. Fails on any finding or when fewer than 200 inputs ran (a load binds a
# whole drafter: ~30 inputs a second on a 2-core VM); skips (77) with a message when clang is
# absent. docs/fuzzing.md says what the harness checks.
exec bash "${MUSER_SOURCE_DIR:?MUSER_SOURCE_DIR not set}/tests/fuzz_ctest.sh" dflash 200
