# cli_eval_routes.sh — `muser eval --route` end to end on the tiny preset: three sequences of
# different lengths (past the 16-row window) through decode, verify and packed give the same
# logits bytes per sequence (row invariance, SHA-256 and the dumps), the batch (prefill) route
# is its own, one list dumps to PREFIX and several to PREFIX.k, and bad routes exit 2.
set -u
BIN=${MUSER_BIN:?MUSER_BIN not set}
DIR=$(mktemp -d)
trap 'rm -rf "$DIR"' EXIT
fail() { echo "FAIL: $*"; exit 1; }

"$BIN" synth --preset tiny -o "$DIR/tiny.gguf" >/dev/null || fail "synth tiny"
A=$(seq -s, 1 17 680) # 40 tokens
B=$(seq -s, 3 11 300) # 28
C=5,6,7
for r in decode verify packed batch; do
    "$BIN" eval -m "$DIR/tiny.gguf" --route $r --tokens "$A" --tokens "$B" --tokens $C \
        --dump-logits "$DIR/$r" >"$DIR/$r.out" 2>&1 || fail "route $r exited $?: $(tail -2 "$DIR/$r.out")"
    grep "^sequence" "$DIR/$r.out" | awk '{print $NF}' >"$DIR/$r.sha"
    [ "$(wc -l <"$DIR/$r.sha")" = 3 ] || fail "route $r: three sequences expected"
    for k in 0 1 2; do [ -f "$DIR/$r.$k" ] || fail "route $r: no dump $DIR/$r.$k"; done
done
for r in verify packed; do
    cmp -s "$DIR/decode.sha" "$DIR/$r.sha" || fail "route $r's logits differ from decode's"
    for k in 0 1 2; do cmp -s "$DIR/decode.$k" "$DIR/$r.$k" || fail "route $r: dump $k differs"; done
done
cmp -s "$DIR/decode.sha" "$DIR/batch.sha" && fail "the prefill route gave decode's bytes: is it the same route?"
echo "decode = verify = packed: $(tr '\n' ' ' <"$DIR/decode.sha" | cut -c1-40)..."
# one list, decode: the dump is PREFIX itself, [40][768] f32
"$BIN" eval -m "$DIR/tiny.gguf" --route decode --tokens "$A" --dump-logits "$DIR/one" >/dev/null || fail "one list"
[ "$(stat -c %s "$DIR/one")" = $((40 * 768 * 4)) ] || fail "one list: dump size"
cmp -s "$DIR/one" "$DIR/decode.0" || fail "a sequence alone differs from the same sequence beside two others"
"$BIN" eval -m "$DIR/tiny.gguf" --route sideways --tokens 1,2 >/dev/null 2>&1
[ $? = 2 ] || fail "an unknown route must exit 2"
echo "PASS"
