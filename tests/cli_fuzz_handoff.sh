#!/usr/bin/env bash
# cli_fuzz_handoff.sh — the short libFuzzer run of the remote-prefill wire format after TLS
# (fuzz/fuzz_handoff.c: frame headers, requests, manifests and the consumer's stream state machine):
# scripts/fuzz.sh --short handoff (~15 s, ASan + UBSan) as a ctest. Fails on any finding; skips
# (77) with a message when clang is absent. docs/fuzzing.md says what the harness checks.
exec bash "${MUSER_SOURCE_DIR:?MUSER_SOURCE_DIR not set}/tests/fuzz_ctest.sh" handoff
