# cli_parity.sh — `muser parity` and `muser eval` end to end on the tiny preset (written with
# `muser synth`, as muse, llama and qwen3): the CPU backend meets the SPEC §4 contract against the oracle on both routes
# for a prompt longer than the SWA window, the JSON report says so, eval dumps [n][V] f32 that
# match the oracle's own report, and usage errors exit 2.
set -u
BIN=${MUSER_BIN:?MUSER_BIN not set}
DIR=$(mktemp -d)
trap 'rm -rf "$DIR"' EXIT
fail() { echo "FAIL: $*"; exit 1; }

N=40 # > window 16: every ring wraps
[ "${MUSER_SANITIZED:-0}" = 1 ] && N=24

"$BIN" synth --preset tiny -o "$DIR/tiny.gguf" >/dev/null || fail "synth tiny"
"$BIN" synth --preset tiny --arch llama -o "$DIR/tiny-llama.gguf" >/dev/null ||
    fail "synth tiny llama"
"$BIN" synth --preset tiny --arch qwen3 -o "$DIR/tiny-qwen3.gguf" >/dev/null ||
    fail "synth tiny qwen3"

for model in tiny tiny-llama tiny-qwen3; do
    for route in decode batch; do
        out=$("$BIN" parity -m "$DIR/$model.gguf" --backend cpu --tokens $N --route $route \
              --max-batch 7 2>&1)
        rc=$?
        echo "$out" | tail -n 3
        [ $rc = 0 ] || fail "$model $route: parity exited $rc"
        echo "$out" | grep -q "^PASS: max |dlogsoftmax|" || fail "$model $route: no PASS line"
    done
done

json=$("$BIN" parity -m "$DIR/tiny.gguf" --tokens 20 --seed 3 --route batch --json) ||
    fail "parity --json exited $?"
echo "$json" | grep -q '"pass": true' || fail "json: pass not true"
echo "$json" | grep -q '"tokens": 20' || fail "json: token count"
python3 -c 'import json,sys; d=json.loads(sys.argv[1]); assert len(d["positions"]) == 20' \
    "$json" 2>/dev/null || { command -v python3 >/dev/null && fail "json does not parse"; }

# A token list; the oracle judged against itself is exact and bit-identical.
out=$("$BIN" parity -m "$DIR/tiny.gguf" --backend oracle --tokens 5,6,7) || fail "oracle self"
echo "$out" | grep -q "^PASS: max |dlogsoftmax| 0.000e+00" || fail "oracle self not exact"

# eval: the dump holds [n][V] f32, and the oracle's logits hash matches parity's oracle hash.
"$BIN" eval -m "$DIR/tiny.gguf" --backend oracle --tokens 5,6,7 --dump-logits "$DIR/l.bin" \
    >"$DIR/eval.txt" || fail "eval exited $?"
V=$("$BIN" parity -m "$DIR/tiny.gguf" --backend oracle --tokens 1, --json |
    sed -n 's/.*"vocab": \([0-9]*\).*/\1/p')
size=$(stat -c %s "$DIR/l.bin")
[ "$size" = $((3 * V * 4)) ] || fail "eval dump is $size bytes, expected 3 x $V x 4"
sha_eval=$(sed -n 's/^logits sha256 //p' "$DIR/eval.txt")
echo "$out" | grep -q "oracle $sha_eval" || fail "eval and parity disagree on the oracle logits"
[ "$(sha256sum "$DIR/l.bin" | cut -d' ' -f1)" = "$sha_eval" ] || fail "dump bytes != hash"

# usage errors exit 2
for args in "--route sideways" "--tokens 0" "--tokens 1,,2" "--backend gpu" "--bogus 1"; do
    # shellcheck disable=SC2086
    "$BIN" parity -m "$DIR/tiny.gguf" $args >/dev/null 2>&1
    rc=$?
    [ $rc = 2 ] || fail "parity $args exited $rc, expected 2"
done
"$BIN" eval -m "$DIR/tiny.gguf" >/dev/null 2>&1
[ $? = 2 ] || fail "eval without --tokens should exit 2"
"$BIN" parity --help | grep -q "log_softmax" || fail "parity --help"
"$BIN" eval --help | grep -q "dump-logits" || fail "eval --help"
echo "cli_parity: ok"
