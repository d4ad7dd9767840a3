# cli_bench.sh — `muser bench` on the tiny preset: the CPU lane prints one line per --ctx depth
# with prefill and decode tok/s, bytes/token, GB/s, the same run's bandwidth and the number of
# timed repetitions; bad arguments exit 2; a context too long for the model is an error.
set -u
BIN=${MUSER_BIN:?MUSER_BIN not set}
DIR=$(mktemp -d)
trap 'rm -rf "$DIR"' EXIT
fail() { echo "FAIL: $*"; exit 1; }

"$BIN" synth --preset tiny -o "$DIR/tiny.gguf" >/dev/null || fail "synth tiny"
out=$("$BIN" bench -m "$DIR/tiny.gguf" --backend cpu --prompt 20 --gen 4 --ctx 0,24 --reps 2 \
      --threads 1 2>&1) || fail "bench exited $?: $out"
echo "$out"
[ "$(echo "$out" | grep -c '^ctx ')" = 2 ] || fail "expected one line per depth"
echo "$out" | grep -q '^ctx 24 .*prefill *20 tok: *[0-9.]* tok/s.*decode *4 tok: *[0-9.]* tok/s.*GB/s = [0-9]*% of [0-9.]* GB/s | median of 2$' ||
    fail "the ctx 24 line lacks a field"
"$BIN" bench -m "$DIR/tiny.gguf" --reps 0 >/dev/null 2>&1; [ $? = 2 ] || fail "--reps 0 not a usage error"
"$BIN" bench -m "$DIR/tiny.gguf" --frobnicate >/dev/null 2>&1; [ $? = 2 ] || fail "unknown flag not a usage error"
"$BIN" bench -m "$DIR/tiny.gguf" --ctx 600 >/dev/null 2>&1; [ $? = 1 ] || fail "ctx past the model's context accepted"
"$BIN" bench -m "$DIR/missing.gguf" >/dev/null 2>&1; [ $? = 1 ] || fail "missing model not exit 1"
echo "PASS: muser bench"
