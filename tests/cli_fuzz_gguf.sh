#!/usr/bin/env bash
# cli_fuzz_gguf.sh — the short libFuzzer run of the GGUF reader (scripts/fuzz.sh --short gguf,
# ~20 s, ASan + UBSan) as a ctest. Fails on any finding; skips (77) with a message when clang is
# absent.
exec bash "${MUSER_SOURCE_DIR:?MUSER_SOURCE_DIR not set}/tests/fuzz_ctest.sh" gguf
