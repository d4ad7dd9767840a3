#!/usr/bin/env bash
# cli_run.sh — `muser run` end to end on the tiny synthetic model: usage errors exit 2, a missing or
# corrupt model is one line and exit 1, a fixed seed reproduces its output, different seeds
# differ, -n bounds the tokens, greedy ignores the seed, and the output agrees with the stats.
set -u
BIN=${MUSER_BIN:?MUSER_BIN must point at the muser binary}
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
# One engine thread: the tiny model gains nothing from more, and the CI's two cores are shared
# by parallel tests (a spinning pool on a busy machine is slower by orders of magnitude).
T="--threads ${MUSER_TEST_THREADS:-1}"

# --- usage errors: exit 2, before any model is touched ---
expect_rc 2 "no prompt" -- "$BIN" run -m "$TMP/none.gguf"
expect_rc 2 "unknown option" -- "$BIN" run -p hi --bogus
expect_rc 2 "bad --temp" -- "$BIN" run -p hi --temp warm
expect_rc 2 "negative --temp" -- "$BIN" run -p hi --temp -1
expect_rc 2 "--top-p above 1" -- "$BIN" run -p hi --top-p 1.5
expect_rc 2 "--min-p above 1" -- "$BIN" run -p hi --min-p 2
expect_rc 2 "bad -n" -- "$BIN" run -p hi -n many
expect_rc 2 "bad --seed" -- "$BIN" run -p hi --seed -3
expect_rc 2 "unknown backend" -- "$BIN" run -p hi --backend abacus
expect_rc 2 "-p without value" -- "$BIN" run -p
grep -q "see: muser run --help" "$TMP/err" || fail "usage error does not point at --help"
expect_rc 0 "--help" -- "$BIN" run --help
grep -q "usage: muser run" "$TMP/out" || fail "--help does not print the usage on stdout"

# --- missing / corrupt model: one line on stderr, exit 1 ---
expect_rc 1 "missing model" -- "$BIN" run -m "$TMP/none.gguf" -p hi
[ "$(wc -l <"$TMP/err")" -eq 1 ] || fail "missing model: want one line, got: $(cat "$TMP/err")"
grep -q "none.gguf" "$TMP/err" || fail "missing model: the message does not name the file"
head -c 4096 /dev/urandom >"$TMP/junk.gguf"
expect_rc 1 "corrupt model" -- "$BIN" run -m "$TMP/junk.gguf" -p hi
[ "$(wc -l <"$TMP/err")" -eq 1 ] || fail "corrupt model: want one line, got: $(cat "$TMP/err")"
expect_rc 1 "missing default model" -- env MUSER_MODEL="$TMP/none.gguf" "$BIN" run -p hi
[ "$(wc -l <"$TMP/err")" -eq 1 ] || fail "missing default model: want one line"

# --- on a real (synthetic) model ---
M="$TMP/tiny.gguf"
if ! "$BIN" synth --preset tiny -o "$M" >"$TMP/synth.log" 2>&1; then
    echo "SKIP: muser synth --preset tiny failed (synth not built yet?):"; tail -3 "$TMP/synth.log"
    [ "$fails" -eq 0 ] || exit 1
    exit 77
fi
if ! "$BIN" run $T -m "$M" -p "probe" -n 1 --temp 0 >"$TMP/probe" 2>"$TMP/probe.err"; then
    if grep -q "not built in this tree\|not available" "$TMP/probe.err"; then
        echo "SKIP: the engine is not built yet:"; cat "$TMP/probe.err"
        [ "$fails" -eq 0 ] || exit 1
        exit 77
    fi
    fail "a one-token run failed: $(cat "$TMP/probe.err")"
fi

P="The quick brown fox jumps over the lazy dog. Once upon a time"
gen() { # gen OUTFILE args...: stdout to OUTFILE, stderr to OUTFILE.err
    local out=$1; shift
    "$BIN" run $T -m "$M" -p "$P" "$@" >"$out" 2>"$out.err" || fail "run $* exited $?: $(tail -2 "$out.err")"
}
gen "$TMP/s7a" -n 40 --seed 7 --temp 1.0 --top-k 0 --min-p 0
gen "$TMP/s7b" -n 40 --seed 7 --temp 1.0 --top-k 0 --min-p 0
gen "$TMP/s8" -n 40 --seed 8 --temp 1.0 --top-k 0 --min-p 0
cmp -s "$TMP/s7a" "$TMP/s7b" || fail "the same seed gave different output"
cmp -s "$TMP/s7a" "$TMP/s8" && fail "seeds 7 and 8 gave identical output"
[ -s "$TMP/s7a" ] || fail "no output for seed 7"
grep -q "seed 7 " "$TMP/s7a.err" || fail "the seed is not reported on stderr"

# An unseeded run reports a seed, and that seed reproduces it.
gen "$TMP/r1" -n 24 --temp 1.0 --top-k 0
seed=$(sed -n 's/.*seed \([0-9][0-9]*\) .*/\1/p' "$TMP/r1.err" | head -1)
[ -n "$seed" ] || fail "an unseeded run did not print its seed"
gen "$TMP/r2" -n 24 --temp 1.0 --top-k 0 --seed "${seed:-0}"
cmp -s "$TMP/r1" "$TMP/r2" || fail "the printed seed $seed did not reproduce the run"

# Greedy: the seed does not matter.
gen "$TMP/g1" -n 30 --temp 0 --seed 1
gen "$TMP/g2" -n 30 --temp 0 --seed 2
cmp -s "$TMP/g1" "$TMP/g2" || fail "greedy output depends on the seed"
# top-k 1 is greedy too.
gen "$TMP/k1" -n 30 --temp 1.5 --top-k 1 --seed 3
cmp -s "$TMP/g1" "$TMP/k1" || fail "top-k 1 differs from greedy"

# -n bounds the tokens: the stats say so, and the text re-tokenizes to about that many.
for n in 1 5 17; do
    gen "$TMP/n$n" -n $n --seed 11 --temp 1.0
    got=$(sed -n 's/.*generated \([0-9][0-9]*\) tokens.*/\1/p' "$TMP/n$n.err")
    stop=$(sed -n 's/.*stop: \(.*\)$/\1/p' "$TMP/n$n.err")
    if [ "$stop" = "limit" ]; then
        [ "$got" = "$n" ] || fail "-n $n: generated ${got:-?} tokens"
    else
        [ -n "$got" ] && [ "$got" -le "$n" ] || fail "-n $n: generated ${got:-?} tokens (stop: $stop)"
    fi
    head -c -1 "$TMP/n$n" >"$TMP/n$n.txt" # drop the final newline run adds
    if [ -s "$TMP/n$n.txt" ]; then
        ids=$("$BIN" tokenize -m "$M" -f "$TMP/n$n.txt" 2>/dev/null | wc -w)
        # re-encoding may merge differently; it can never need more than 4 tokens per generated one
        [ "$ids" -ge 1 ] && [ "$ids" -le $((4 * n)) ] || fail "-n $n: text re-tokenizes to $ids tokens"
    fi
done
# Longer runs produce more text.
[ "$(wc -c <"$TMP/n17")" -gt "$(wc -c <"$TMP/n1")" ] || fail "-n 17 printed no more than -n 1"
gen "$TMP/n0" -n 0 --seed 1
[ "$(wc -c <"$TMP/n0")" -eq 0 ] || fail "-n 0 printed text"

# --echo prints the prompt first; --no-bos changes the token count by one.
gen "$TMP/e" -n 3 --temp 0 --echo
head -c ${#P} "$TMP/e" | grep -qF "$P" || fail "--echo did not print the prompt first"
gen "$TMP/b1" -n 1 --temp 0
gen "$TMP/b0" -n 1 --temp 0 --no-bos
p1=$(sed -n 's/.*prompt \([0-9]*\) tokens.*/\1/p' "$TMP/b1.err")
p0=$(sed -n 's/.*prompt \([0-9]*\) tokens.*/\1/p' "$TMP/b0.err")
[ "${p1:-0}" -eq $((${p0:-0} + 1)) ] || fail "--no-bos: prompt $p0 tokens vs $p1 with BOS"

# A context too small for the prompt is an error, not a crash.
expect_rc 1 "prompt longer than --ctx" -- "$BIN" run $T -m "$M" -p "$P" --ctx 4
# Generation stops when the context is full.
gen "$TMP/full" -n 500 --ctx 64 --temp 0 --seed 1
grep -q "stop: context full\|stop: end token" "$TMP/full.err" || fail "-n 500 did not stop at the context (--ctx 64): $(tail -1 "$TMP/full.err")"

# Prefill progress on stderr: past MUSER_PROGRESS_AFTER seconds (0 here: every prompt) a line with the
# prompt's total, plain when stderr is not a terminal; under the threshold (1000 s here) nothing.
MUSER_PROGRESS_AFTER=0 "$BIN" run $T -m "$M" -p "$P" -n 1 --temp 0 >"$TMP/pg" 2>"$TMP/pg.err" || fail "run with progress exited $?"
pt=$(sed -n 's/.*prompt \([0-9]*\) tokens.*/\1/p' "$TMP/pg.err")
grep -q "^muser run: prefill ${pt:-?} tokens in [0-9.]* s ([0-9]* tok/s)$" "$TMP/pg.err" ||
    fail "MUSER_PROGRESS_AFTER=0: no prefill line for the ${pt:-?}-token prompt: $(grep prefill "$TMP/pg.err")"

MUSER_PROGRESS_AFTER=1000 "$BIN" run $T -m "$M" -p "$P" -n 1 --temp 0 >"$TMP/pq" 2>"$TMP/pq.err" || fail "run exited $?"
grep -q "prefill" "$TMP/pq.err" && fail "a prefill under the threshold reported progress: $(grep prefill "$TMP/pq.err")"
cmp -s "$TMP/pg" "$TMP/pq" || fail "progress reporting changed the output"
if command -v script >/dev/null 2>&1; then # on a terminal: the bar, drawn with a carriage return
    MUSER_PROGRESS_AFTER=0 script -qec "$BIN run $T -m $M -p 'a b c d e f' -n 1 --temp 0" /dev/null >"$TMP/tty" 2>&1 ||
        fail "run under script exited $?"
    tr '\r' '\n' <"$TMP/tty" | grep -q "prefill \[##############################\] [0-9]*/[0-9]* tokens" ||
        fail "on a terminal: no progress bar: $(tr '\r' '\n' <"$TMP/tty" | grep prefill | head -2)"
else
    echo "SKIP: the terminal bar (no script(1))"
fi

# --- --tensor-parallel: the model split across CPU ranks (docs/tp.md) ---
expect_rc 2 "--tensor-parallel 0" -- "$BIN" run -p hi --tensor-parallel 0
expect_rc 1 "a split the tiny model's blocks refuse" -- "$BIN" run $T -m "$M" -p hi -n 2 --tensor-parallel 2
grep -q "blocks" "$TMP/err" || fail "--tensor-parallel 2 on tiny: the refusal does not say why: $(cat "$TMP/err")"
D="${MUSER_SOURCE_DIR:-.}/models/default.gguf"
if [ -f "$D" ]; then
    for k in 1 2; do
        "$BIN" run -m "$D" -p "Once upon a time" -n 24 --seed 7 --tensor-parallel 2 >"$TMP/tp$k" 2>"$TMP/tp$k.err" ||
            fail "--tensor-parallel 2 exited $?: $(tail -1 "$TMP/tp$k.err")"
    done
    grep -q "cpu backend split across 2 ranks" "$TMP/tp1.err" || fail "--tensor-parallel 2: no split named: $(cat "$TMP/tp1.err")"
    [ -s "$TMP/tp1" ] || fail "--tensor-parallel 2 generated nothing"
    cmp -s "$TMP/tp1" "$TMP/tp2" || fail "--tensor-parallel 2 with one seed: two runs differ"
else
    echo "SKIP: --tensor-parallel on the default model ($D is missing)"
fi

if [ "$fails" -ne 0 ]; then echo "cli_run: $fails failures"; exit 1; fi
echo "cli_run: all checks passed"
