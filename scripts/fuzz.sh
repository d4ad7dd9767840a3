#!/usr/bin/env bash
# fuzz.sh — build and run muser's libFuzzer harnesses with ASan + UBSan, straight from the
# sources, each seeded from fuzz/corpus/<target>/ (docs/fuzzing.md says what each one checks):
#   gguf      fuzz/fuzz_gguf.c      the GGUF reader on raw bytes
#   tok       fuzz/fuzz_tok.c       muser_tokenize / detokenize / streaming on arbitrary text
#   tok_load  fuzz/fuzz_tok_load.c  muser_tokenizer_load on hostile tokenizer.ggml.* metadata
#   model     fuzz/fuzz_model.c     muser_model_bind (+ a 1-token oracle forward) on mutated models
#   serve     fuzz/fuzz_serve.c     `muser serve`'s request decoding (tools/serve_req.c) on JSON bodies
#   handoff   fuzz/fuzz_handoff.c   the remote-prefill frames, request, manifest and stream (src/handoff/wire.c)
#   dflash    fuzz/fuzz_dflash.c    muser_dflash_load (+ a context step and a block) on edited drafters
#
#   scripts/fuzz.sh --short [TARGET...]          gguf 20 s, dflash 40 s, the others 15 s each
#   scripts/fuzz.sh --long [SECONDS] [TARGET...] default 3600 s per target
#   scripts/fuzz.sh --seeds                      regenerate fuzz/corpus/gguf/ with fuzz/make_seeds.c
# TARGET defaults to gguf (what tests/cli_fuzz_gguf.sh runs); "all" runs them all in turn.
# MUSER_FUZZ_SECONDS overrides the time per target; MUSER_FUZZ_JOBS=N runs N workers (--long).
#
# Exits non-zero on a finding (the crashing input is left in $MUSER_FUZZ_DIR as crash-*, or
# $MUSER_FUZZ_DIR/<target>/ for the non-gguf targets), 77 when clang is missing. New inputs go to
# $MUSER_FUZZ_DIR[/<target>]/corpus, never into the seeds.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
MODE=${1:---short}
[ $# -gt 0 ] && shift
OUT=${MUSER_FUZZ_DIR:-$ROOT/build-fuzz}
CLANG=${CLANG:-$(command -v clang || command -v clang-14 || true)}

if [ -z "$CLANG" ]; then
  echo "fuzz.sh: clang not found; cannot build the libFuzzer harnesses" >&2
  exit 77
fi
mkdir -p "$OUT"

if [ "$MODE" = "--seeds" ]; then
  SEEDS=$ROOT/fuzz/corpus/gguf
  "$CLANG" -std=c11 -D_GNU_SOURCE -O1 -g -Wall -Wextra -I"$ROOT/include" -I"$ROOT/src" \
    "$ROOT/fuzz/make_seeds.c" "$ROOT/src/gguf.c" "$ROOT/src/util.c" -lcrypto -lm \
    -o "$OUT/make_seeds"
  mkdir -p "$SEEDS"
  "$OUT/make_seeds" "$SEEDS"
  ls -l "$SEEDS"
  exit 0
fi

LONG_SECONDS=
case "$MODE" in
  --short) ;;
  --long)
    if [ $# -gt 0 ] && [[ $1 =~ ^[0-9]+$ ]]; then LONG_SECONDS=$1; shift; fi
    LONG_SECONDS=${LONG_SECONDS:-${MUSER_FUZZ_SECONDS:-3600}} ;;
  *) echo "usage: scripts/fuzz.sh [--short | --long [SECONDS] | --seeds]" \
          "[gguf|tok|tok_load|model|serve|handoff|all ...]" >&2
     exit 2 ;;
esac
TARGETS=("$@")
[ ${#TARGETS[@]} -eq 0 ] && TARGETS=(gguf)
[ "${TARGETS[0]}" = all ] && TARGETS=(gguf tok tok_load model serve handoff dflash)

S=$ROOT/src
# util.c asks the CPU what it has (its row passes): every target with it links the shim
UTIL_SOURCES=("$S/util.c" "$ROOT/fuzz/fuzz_cpu_shim.c")
TOK_SOURCES=("$S/tokenizer.c" "$S/vocab_o200k.c" "$S/gguf.c" "${UTIL_SOURCES[@]}")
ENGINE_SOURCES=("$S/model.c" "$S/kv.c" "$S/session.c" "$S/sampler.c" "$S/reference.c" "$S/forward.c" "$S/tp.c" "$S/quant.c"
                "$S/cpu/"*.c "$S/gguf.c" "${UTIL_SOURCES[@]}")

# build TARGET: compile fuzz/fuzz_TARGET.c and what it drives into $dir/fuzz_TARGET.
build() {
  # clang 14 does not know __builtin_cpu_supports("f16c") (src/cpu/kernels.c asks): every source is
  # built with the builtin renamed to fuzz_model.c's muser_fuzz_cpu_supports (the same flags for
  # all targets, so they share the objects of src/).
  local target=$1 dir=$2 srcs=() libs=(-lcrypto -lm)
  local flags=("-D__builtin_cpu_supports=muser_fuzz_cpu_supports"
               -include "$ROOT/fuzz/fuzz_cpu_shim.h")
  case "$target" in
    gguf) srcs=("$S/gguf.c" "${UTIL_SOURCES[@]}") ;;
    tok | tok_load) srcs=("${TOK_SOURCES[@]}"); libs+=(-lpcre2-8) ;;
    model) srcs=("${ENGINE_SOURCES[@]}"); libs+=(-lpthread) ;;
    serve) srcs=("$ROOT/tools/serve_req.c"); libs+=(-lcjson) ;;
    handoff) srcs=("$S/handoff/wire.c" "${UTIL_SOURCES[@]}") ;;
    dflash) srcs=("${ENGINE_SOURCES[@]}" "$S/dflash.c" "$S/dflash_ref.c" "$S/synth.c" "$S/tokenizer.c" "$S/vocab_o200k.c")
            libs+=(-lpthread -lpcre2-8) ;;
    *) echo "fuzz.sh: unknown target '$target' (gguf, tok, tok_load, model, serve, handoff, dflash, all)" >&2; return 2 ;;
  esac
  local bin=$dir/fuzz_$target
  local all=("$ROOT/fuzz/fuzz_$target.c" "${srcs[@]}")
  # Up to date when newer than every source, header and this script (reruns skip the build).
  if [ -x "$bin" ] && [ -z "$(find "${all[@]}" "$ROOT"/fuzz/*.h "$ROOT"/tools/*.h "$S"/*.h "$S"/cpu/*.h "$S"/handoff/*.h \
        "$ROOT/include" "$ROOT/scripts/fuzz.sh" -newer "$bin" 2>/dev/null | head -n 1)" ]; then
    echo "fuzz.sh: $bin is up to date"
    return 0
  fi
  # One object per source, ${MUSER_FUZZ_BUILD_JOBS:-2} compiles at a time, then one link.
  # Objects are shared by the targets ($OUT/obj/) and rebuilt only when older than their source
  # or a header; each lands by an atomic mv, so ctests running side by side never link a
  # half-written one.
  local objs=() running=0 fail=0
  mkdir -p "$OUT/obj"
  for src in "${all[@]}"; do
    local obj=$OUT/obj/$(basename "$(dirname "$src")")-$(basename "$src" .c).o
    objs+=("$obj")
    if [ -f "$obj" ] && [ -z "$(find "$src" "$ROOT"/fuzz/*.h "$ROOT"/tools/*.h "$S"/*.h "$S"/cpu/*.h "$S"/handoff/*.h \
          "$ROOT/include" "$ROOT/scripts/fuzz.sh" -newer "$obj" 2>/dev/null | head -n 1)" ]; then
      continue
    fi
    # The CPU engine is linked (session.c refers to it) but never run by a harness (fuzz_model
    # uses the oracle): -O0 without coverage builds it in a tenth of the time.
    local cc=(-O1 -fsanitize=fuzzer,address,undefined)
    case "$src" in "$S"/cpu/*) cc=(-O0 -fsanitize=address,undefined) ;; esac
    ( "$CLANG" -std=c11 -D_GNU_SOURCE "${cc[@]}" -g -fno-omit-frame-pointer \
        -fno-sanitize-recover=all \
        -DMUSER_FUZZ_ROOT="\"$ROOT\"" -DMUSER_DATA_DIR="\"$ROOT/data\"" \
        "${flags[@]}" -I"$ROOT/include" -I"$S" -c "$src" -o "$obj.$$.tmp" &&
      mv -f "$obj.$$.tmp" "$obj" ) &
    running=$((running + 1))
    if [ $running -ge "${MUSER_FUZZ_BUILD_JOBS:-2}" ]; then
      wait -n || fail=1
      running=$((running - 1))
    fi
  done
  while [ $running -gt 0 ]; do
    wait -n || fail=1
    running=$((running - 1))
  done
  [ $fail -eq 0 ] || { echo "fuzz.sh: building fuzz_$target failed" >&2; return 1; }
  "$CLANG" -fsanitize=fuzzer,address,undefined "${objs[@]}" "${libs[@]}" -o "$bin.$$.tmp" &&
    mv -f "$bin.$$.tmp" "$bin"
}

status=0
for target in "${TARGETS[@]}"; do
  # gguf keeps its historical layout ($OUT/corpus, $OUT/crash-*); the others get a folder each.
  if [ "$target" = gguf ]; then dir=$OUT; else dir=$OUT/$target; fi
  mkdir -p "$dir/corpus"
  build "$target" "$dir" || { status=$?; break; }
  if [ -n "$LONG_SECONDS" ]; then
    secs=$LONG_SECONDS
  elif [ "$target" = gguf ]; then
    secs=${MUSER_FUZZ_SECONDS:-20}
  elif [ "$target" = dflash ]; then
    secs=${MUSER_FUZZ_SECONDS:-40} # a load binds a whole drafter and fingerprints its target: ~15 ms
  else
    secs=${MUSER_FUZZ_SECONDS:-15}
  fi
  jobs=()
  if [ -n "$LONG_SECONDS" ] && [ "${MUSER_FUZZ_JOBS:-1}" -gt 1 ]; then
    jobs=(-fork="$MUSER_FUZZ_JOBS" -ignore_crashes=0)
  fi
  echo "fuzz.sh: running fuzz_$target for ${secs}s" \
       "(seeds: $ROOT/fuzz/corpus/$target, new inputs: $dir/corpus)"
  # -max_len: the seeds are < 4 KB; room to grow a little. -rss_limit_mb guards runaway
  # allocation. -error_exitcode=1: libFuzzer's default (77) would read as SKIP in ctest.
  rc=0
  "$dir/fuzz_$target" "$dir/corpus" "$ROOT/fuzz/corpus/$target" "${jobs[@]}" \
    -max_total_time="$secs" -max_len=16384 -timeout=10 -rss_limit_mb=2048 \
    -print_final_stats=1 -error_exitcode=1 -artifact_prefix="$dir/" || rc=$?
  if [ $rc -ne 0 ]; then
    echo "fuzz.sh: fuzz_$target found something (exit $rc); inputs in $dir/" >&2
    status=$rc
  fi
done
exit $status
