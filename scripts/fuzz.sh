#!/usr/bin/env bash
# fuzz.sh — build and run the libFuzzer harness of the GGUF reader (fuzz/fuzz_gguf.c) with
# ASan + UBSan, straight from the sources (src/gguf.c src/util.c), seeded from fuzz/corpus/gguf/.
#
#   scripts/fuzz.sh --short          ~30 s (the ctest cli_fuzz_gguf runs this)
#   scripts/fuzz.sh --long [SECONDS] default 3600 s
#   scripts/fuzz.sh --seeds          regenerate fuzz/corpus/gguf/ with fuzz/make_seeds.c
#
# Exits non-zero on a finding (the crashing input is left in $MUSER_FUZZ_DIR as crash-*),
# 77 when clang is missing. New inputs go to $MUSER_FUZZ_DIR/corpus, never into the seeds.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
MODE=${1:---short}
OUT=${MUSER_FUZZ_DIR:-$ROOT/build-fuzz}
CLANG=${CLANG:-$(command -v clang || command -v clang-14 || true)}
SEEDS=$ROOT/fuzz/corpus/gguf

if [ -z "$CLANG" ]; then
  echo "fuzz.sh: clang not found; cannot build the libFuzzer harness" >&2
  exit 77
fi
mkdir -p "$OUT/corpus"

if [ "$MODE" = "--seeds" ]; then
  "$CLANG" -std=c11 -D_GNU_SOURCE -O1 -g -Wall -Wextra -I"$ROOT/include" -I"$ROOT/src" \
    "$ROOT/fuzz/make_seeds.c" "$ROOT/src/gguf.c" "$ROOT/src/util.c" -lcrypto -lm \
    -o "$OUT/make_seeds"
  mkdir -p "$SEEDS"
  "$OUT/make_seeds" "$SEEDS"
  ls -l "$SEEDS"
  exit 0
fi

case "$MODE" in
  --short) SECONDS_TO_RUN=${MUSER_FUZZ_SECONDS:-30} ;;
  --long) SECONDS_TO_RUN=${2:-${MUSER_FUZZ_SECONDS:-3600}} ;;
  *) echo "usage: scripts/fuzz.sh [--short | --long [SECONDS] | --seeds]" >&2; exit 2 ;;
esac

"$CLANG" -std=c11 -D_GNU_SOURCE -O1 -g -fno-omit-frame-pointer \
  -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=all \
  -I"$ROOT/include" -I"$ROOT/src" \
  "$ROOT/fuzz/fuzz_gguf.c" "$ROOT/src/gguf.c" "$ROOT/src/util.c" -lcrypto -lm \
  -o "$OUT/fuzz_gguf"

echo "fuzz.sh: running fuzz_gguf for ${SECONDS_TO_RUN}s (seeds: $SEEDS, new inputs: $OUT/corpus)"
# -max_len: seeds are < 4 KB; room to grow a little. -rss_limit_mb guards runaway allocation.
exec "$OUT/fuzz_gguf" "$OUT/corpus" "$SEEDS" \
  -max_total_time="$SECONDS_TO_RUN" -max_len=16384 -timeout=10 -rss_limit_mb=2048 \
  -print_final_stats=1 -artifact_prefix="$OUT/"
