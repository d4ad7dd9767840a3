# cli_bench.sh — `muser bench` on the tiny preset: the CPU lane prints one line per --ctx depth
# (and --prompt length) with prefill and decode tok/s, bytes/token, GB/s, the same run's bandwidth and the number of
# timed repetitions; bad arguments exit 2; a context too long for the model is an error. --verify
# prints a line per block; -p with a drafter measures speculation against plain decoding (the
# same text) on the committed model; --tensor-parallel splits the model over CPU ranks.
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
# --prompt N1,N2: a line per depth and length, in that order
out=$("$BIN" bench -m "$DIR/tiny.gguf" --backend cpu --prompt 8,30 --gen 2 --ctx 0,16 --reps 1 --threads 1 2>&1) ||
    fail "bench --prompt 8,30 exited $?: $out"
[ "$(echo "$out" | grep '^ctx ' | sed 's/^ctx *\([0-9]*\) *prefill *\([0-9]*\) tok:.*/\1:\2/' | tr '\n' ' ')" = "0:8 0:30 16:8 16:30 " ] ||
    fail "--prompt 8,30 --ctx 0,16: want the lines 0:8 0:30 16:8 16:30: $out"
"$BIN" bench -m "$DIR/tiny.gguf" --prompt 8,1 >/dev/null 2>&1; [ $? = 2 ] || fail "--prompt 8,1 not a usage error"
"$BIN" bench -m "$DIR/tiny.gguf" --prompt 8,x >/dev/null 2>&1; [ $? = 2 ] || fail "--prompt 8,x not a usage error"
"$BIN" bench -m "$DIR/tiny.gguf" --prompt 8,600 >/dev/null 2>&1; [ $? = 1 ] || fail "a prompt past the model's context accepted"
"$BIN" bench -m "$DIR/tiny.gguf" --reps 0 >/dev/null 2>&1; [ $? = 2 ] || fail "--reps 0 not a usage error"
"$BIN" bench -m "$DIR/tiny.gguf" --frobnicate >/dev/null 2>&1; [ $? = 2 ] || fail "unknown flag not a usage error"
"$BIN" bench -m "$DIR/tiny.gguf" --ctx 600 >/dev/null 2>&1; [ $? = 1 ] || fail "ctx past the model's context accepted"
"$BIN" bench -m "$DIR/missing.gguf" >/dev/null 2>&1; [ $? = 1 ] || fail "missing model not exit 1"
# --verify: a line per block, B 1 first; at most a verify block's 16 rows
out=$("$BIN" bench -m "$DIR/tiny.gguf" --verify 4 --gen 2 --reps 1 --threads 1 2>&1) || fail "bench --verify: $out"
[ "$(echo "$out" | grep -c '^verify  ctx 0 ')" = 2 ] || fail "--verify 4: expected the lines of B 1 and 4: $out"
"$BIN" bench -m "$DIR/tiny.gguf" --verify 17 >/dev/null 2>&1; [ $? = 2 ] || fail "--verify 17 not a usage error"
# --tensor-parallel N (CPU ranks): a line for one rank, then for N; what does not split is an error
"$BIN" synth --preset tiny --type q8_0 -o "$DIR/tiny-q8.gguf" >/dev/null || fail "synth tiny q8_0"
out=$("$BIN" bench -m "$DIR/tiny-q8.gguf" --tensor-parallel 2 --prompt 8 --gen 2 --reps 1 --threads 2 2>&1) ||
    fail "bench --tensor-parallel 2 exited $?: $out"
[ "$(echo "$out" | grep -c '^tp [12] *prefill *8 tok: *[0-9.]* tok/s (.*) | decode *2 tok: *[0-9.]* tok/s')" = 2 ] ||
    fail "--tensor-parallel 2: want the lines of 1 and 2 ranks: $out"
out=$("$BIN" bench -m "$DIR/tiny-q8.gguf" --tensor-parallel 3 2>&1); rc=$?
[ $rc = 1 ] && echo "$out" | grep -q "KV heads" || fail "--tensor-parallel 3 on 2 KV heads: rc $rc: $out"
out=$("$BIN" bench -m "$DIR/tiny.gguf" --tensor-parallel 2 2>&1); rc=$?
[ $rc = 1 ] && echo "$out" | grep -q "blocks" || fail "--tensor-parallel 2 on Q4_K tiny (half blocks): rc $rc: $out"
"$BIN" bench -m "$DIR/tiny-q8.gguf" --tensor-parallel 0 >/dev/null 2>&1; [ $? = 2 ] || fail "--tensor-parallel 0 not a usage error"
"$BIN" bench -m "$DIR/tiny-q8.gguf" --backend oracle --tensor-parallel 2 >/dev/null 2>&1; [ $? = 1 ] ||
    fail "--tensor-parallel on the oracle accepted"
# speculation against plain decoding on the committed model: the same text, the figures on one line
SRC=$(cd "$(dirname "$0")/.." && pwd)
out=$("$BIN" bench -m "$SRC/models/default.gguf" -p "And God said, Let there be light" --gen 48 --reps 1 \
      --threads 1 --draft-ngram 3 --draft-max 15 2>&1) || fail "bench --draft-ngram exited $?: $out"
echo "$out" | grep -q '^spec    plain [0-9.]* tok/s | n-gram (up to 15 drafts): [0-9.]* tok/s = [0-9.]*x, [0-9.]* tokens per pass, .* | the same text | median of 1$' ||
    fail "the spec line lacks a field: $out"
out=$("$BIN" bench -m "$SRC/models/default.gguf" -p "And God said" --gen 16 --reps 1 --threads 1 \
      --draft "$SRC/models/draft.gguf" --draft-max 3 --draft-fixed 2>&1) || fail "bench --draft exited $?: $out"
echo "$out" | grep -q 'draft model (always 3 drafts).*the same text' || fail "bench --draft: $out"
"$BIN" bench -m "$DIR/tiny.gguf" --draft-ngram 3 >/dev/null 2>&1; [ $? = 2 ] || fail "a drafter without -p not a usage error"
"$BIN" bench -m "$DIR/tiny.gguf" -p hi --draft-ngram 3 --draft-dflash x.gguf >/dev/null 2>&1; [ $? = 2 ] ||
    fail "two drafters not a usage error"
echo "PASS: muser bench"
