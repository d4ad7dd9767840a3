#!/usr/bin/env bash
# cli_dflash.sh — `muser synth --dflash-for` and `muser run --draft-dflash` end to end on the tiny
# synthetic model and the committed default model: greedy output with a (random) DFlash drafter,
# and with prompt lookup, adaptive or --draft-fixed, is plain greedy decoding's, the speculation
# line reports DFlash rounds, a drafter for another target is refused with its reason, a drafter
# is not a model, and the CUDA backend and a second drafter are usage errors.
set -u
BIN=${MUSER_BIN:?MUSER_BIN must point at the muser binary}
SRC=${MUSER_SOURCE_DIR:-.}
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
fails=0
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }
expect_rc() { # expect_rc WANT DESCRIPTION -- command...
    local want=$1 what=$2; shift 3
    "$@" >"$TMP/out" 2>"$TMP/err"; local rc=$?
    [ "$rc" -eq "$want" ] || { fail "$what: exit $rc, want $want"; sed 's/^/  stderr: /' "$TMP/err" | head -5; }
}
if [ ! -x "$BIN" ]; then echo "SKIP: $BIN is not built"; exit 77; fi
T="--threads ${MUSER_TEST_THREADS:-1}"

expect_rc 0 "--help" -- "$BIN" run --help
grep -q -- "--draft-dflash MODEL" "$TMP/out" || fail "run --help does not list --draft-dflash"
expect_rc 0 "synth --help" -- "$BIN" synth --help
grep -q -- "--dflash-for" "$TMP/out" || fail "synth --help does not list --dflash-for"

expect_rc 0 "synth tiny" -- "$BIN" synth --preset tiny -o "$TMP/tiny.gguf" $T
expect_rc 0 "synth tiny seed 2" -- "$BIN" synth --preset tiny --seed 2 -o "$TMP/tiny2.gguf" $T
expect_rc 0 "synth drafter" -- "$BIN" synth --dflash-for "$TMP/tiny.gguf" -o "$TMP/dfl.gguf" --block 16 --type q8_0
expect_rc 2 "--block out of range" -- "$BIN" synth --dflash-for "$TMP/tiny.gguf" -o "$TMP/x.gguf" --block 17
expect_rc 2 "--block without --dflash-for" -- "$BIN" synth --preset tiny -o "$TMP/x.gguf" --block 4

P="The quick brown fox jumps over the lazy dog. The quick brown fox"
for m in "$TMP/tiny.gguf:$TMP/dfl.gguf" "$SRC/models/default.gguf:$TMP/dfl_def.gguf"; do
    model=${m%%:*} drafter=${m##*:}
    [ -f "$drafter" ] || expect_rc 0 "synth drafter for $model" -- "$BIN" synth --dflash-for "$model" -o "$drafter" --block 8
    expect_rc 0 "plain greedy ($model)" -- "$BIN" run -m "$model" -p "$P" -n 40 --temp 0 $T
    cp "$TMP/out" "$TMP/plain"
    for k in 1 7 15; do
        expect_rc 0 "DFlash greedy k $k ($model)" -- "$BIN" run -m "$model" -p "$P" -n 40 --temp 0 $T \
            --draft-dflash "$drafter" --draft-max $k
        cmp -s "$TMP/out" "$TMP/plain" || fail "DFlash k $k on $model: output differs from plain greedy decoding"
        grep -q "speculation (DFlash, up to $k drafts)" "$TMP/err" || fail "DFlash k $k: no speculation line"
    done
    # every round K drafts (no adaptive length), and prompt lookup both ways: the same text
    expect_rc 0 "DFlash greedy fixed k 7 ($model)" -- "$BIN" run -m "$model" -p "$P" -n 40 --temp 0 $T \
        --draft-dflash "$drafter" --draft-max 7 --draft-fixed
    cmp -s "$TMP/out" "$TMP/plain" || fail "DFlash fixed k 7 on $model: output differs from plain greedy decoding"
    grep -q "speculation (DFlash, always 7 drafts)" "$TMP/err" || fail "DFlash fixed k 7: no speculation line"
    for mode in "" --draft-fixed; do
        expect_rc 0 "n-gram greedy k 15 $mode ($model)" -- "$BIN" run -m "$model" -p "$P" -n 40 --temp 0 $T \
            --draft-ngram 3 --draft-max 15 $mode
        cmp -s "$TMP/out" "$TMP/plain" || fail "n-gram k 15 $mode on $model: output differs from plain greedy decoding"
    done
done

# refusals: another target (same shape, other weights), another vocabulary, a drafter as a model
expect_rc 1 "drafter for another target" -- "$BIN" run -m "$TMP/tiny2.gguf" -p hi -n 2 $T --draft-dflash "$TMP/dfl.gguf"
grep -q "fingerprint" "$TMP/err" || fail "other target: the error does not say why: $(cat "$TMP/err")"
expect_rc 1 "drafter for another vocabulary" -- "$BIN" run -m "$SRC/models/default.gguf" -p hi -n 2 $T \
    --draft-dflash "$TMP/dfl.gguf"
grep -q "vocabulary" "$TMP/err" || fail "other vocabulary: the error does not say why: $(cat "$TMP/err")"
expect_rc 1 "a drafter as the model" -- "$BIN" run -m "$TMP/dfl.gguf" -p hi -n 2 $T
grep -q -- "--draft-dflash" "$TMP/err" || fail "a drafter as the model: no hint: $(cat "$TMP/err")"
expect_rc 1 "a model as the drafter" -- "$BIN" run -m "$TMP/tiny.gguf" -p hi -n 2 $T --draft-dflash "$TMP/tiny2.gguf"
grep -q "not a DFlash drafter" "$TMP/err" || fail "a model as the drafter: $(cat "$TMP/err")"
expect_rc 2 "--draft-dflash on the oracle" -- "$BIN" run -m "$TMP/tiny.gguf" -p hi --backend oracle --draft-dflash "$TMP/dfl.gguf"
grep -q "backend cpu or cuda" "$TMP/err" || fail "oracle refusal does not say what to do: $(cat "$TMP/err")"
expect_rc 2 "two drafters" -- "$BIN" run -m "$TMP/tiny.gguf" -p hi --draft-ngram 3 --draft-dflash "$TMP/dfl.gguf"

# the training tools' fingerprint (tools/train/dflash_io.py, plain Python) is muser's
if command -v python3 >/dev/null 2>&1; then
    for m in "$TMP/tiny.gguf:$TMP/dfl.gguf" "$SRC/models/default.gguf:$TMP/dfl_def.gguf"; do
        python3 "$SRC/tools/train/dflash_io.py" check "${m%%:*}" "${m##*:}" >"$TMP/out" 2>&1 \
            || fail "dflash_io.py's fingerprint of ${m%%:*} is not muser's: $(cat "$TMP/out")"
    done
    python3 "$SRC/tools/train/dflash_io.py" check "$TMP/tiny2.gguf" "$TMP/dfl.gguf" >/dev/null 2>&1 \
        && fail "dflash_io.py check accepts a drafter for another target"
else
    echo "SKIP (part): no python3 for the fingerprint cross-check"
fi

[ "$fails" -eq 0 ] && echo "cli_dflash: all checks passed"
exit $((fails > 0))
