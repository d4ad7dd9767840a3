# cli_serve_spec.sh — speculation through the server on the trained default model over loopback,
# with prompt lookup (`--draft-ngram`, adaptive) and with the draft model (`--draft`, 4 drafts a
# round, one draft engine all requests share): greedy completions and chats give the plain server's
# text and logprob bytes, streamed or not; a seeded sampled request gives the same text alone and beside three others;
# drafts were proposed and accepted (/metrics); a request asking for top logprobs decodes plainly;
# four requests queued for one slot with a draft model are all served.
# A draft model with another vocabulary and a DFlash drafter are refused at start with a message.
# SERVE_EXTRA adds options to every server (the device: SERVE_EXTRA="--backend cuda").
set -u
BIN=${MUSER_BIN:?MUSER_BIN not set}
SRC=${MUSER_SOURCE_DIR:?MUSER_SOURCE_DIR not set}
DIR=$(mktemp -d)
PIDS=""
cleanup() { for p in $PIDS; do kill "$p" 2>/dev/null; done; rm -rf "$DIR"; }
trap cleanup EXIT
fail() { echo "FAIL: $*"; for f in "$DIR"/serve*.log; do [ -f "$f" ] && tail -5 "$f"; done; exit 1; }
command -v curl >/dev/null || { echo "SKIP: curl is not installed"; exit 77; }

start() { # start NAME ARGS... : a server on a port the system picks; its URL in U_NAME
    name=$1
    shift
    # shellcheck disable=SC2086
    "$BIN" serve --port 0 "$@" ${SERVE_EXTRA:-} >"$DIR/serve_$name.log" 2>&1 &
    PIDS="$PIDS $!"
    for _ in $(seq 1 300); do
        port=$(sed -n 's|.*listening on http://127.0.0.1:\([0-9]*\).*|\1|p' "$DIR/serve_$name.log")
        if [ -n "$port" ] && curl -s "http://localhost:$port/health" | grep -q '"ok"'; then
            eval "U_$name=http://localhost:$port"
            return 0
        fi
        sleep 0.1
    done
    fail "the $name server did not come up"
}
# choice U PATH BODY OUT: the request's choices (text or message, logprobs), without ids and times
choice() {
    curl -s -H 'Content-Type: application/json' "$1$2" -d "$3" >"$DIR/raw"
    python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); print(json.dumps(d["choices"], sort_keys=True))' \
        "$DIR/raw" >"$4" 2>/dev/null || fail "$2: $(cat "$DIR/raw")"
}

"$BIN" serve --port 0 --draft-dflash "$SRC/models/dflash-b8.gguf" >"$DIR/serve_bad.log" 2>&1 && fail "a DFlash drafter was taken"
grep -q "does not share among requests" "$DIR/serve_bad.log" || fail "DFlash: $(cat "$DIR/serve_bad.log")"
"$BIN" synth --preset tiny -o "$DIR/tiny.gguf" -t 2 >/dev/null 2>&1 || fail "synth tiny"
"$BIN" serve --port 0 --draft "$DIR/tiny.gguf" >"$DIR/serve_bad.log" 2>&1 && fail "a draft of another vocabulary was taken"
grep -q "vocabulary" "$DIR/serve_bad.log" || fail "mismatched draft: $(cat "$DIR/serve_bad.log")"
echo "refused: $(grep -o 'draft model.*' "$DIR/serve_bad.log" | head -1)"

start plain --slots 4 -t 2
start ngram --slots 4 -t 2 --draft-ngram 3 --draft-max 4
start model --slots 4 -t 2 --draft "$SRC/models/draft.gguf" --draft-max 4 --draft-fixed
grep -q "draft model $SRC/models/draft.gguf on [a-z]* (KV cache" "$DIR/serve_model.log" || fail "no draft engine line: $(cat "$DIR/serve_model.log")"
PROMPT='And God said, Let there be light: and there was light. And God saw the light, that it was good: and God divided the light from the darkness. And God said,'
check_spec() { # check_spec NAME: the server U_NAME against the plain one
    name=$1
    eval "U=\$U_$name"
    n=0
    for body in \
        "{\"prompt\":\"$PROMPT\",\"max_tokens\":48,\"temperature\":0,\"logprobs\":0}" \
        "{\"prompt\":\"In the beginning God created the heaven and the earth. In the beginning\",\"max_tokens\":40,\"temperature\":0}" \
        "{\"prompt\":\"$PROMPT\",\"max_tokens\":24,\"temperature\":0,\"logprobs\":3}"; do
        choice "$U_plain" /v1/completions "$body" "$DIR/a$n"
        choice "$U" /v1/completions "$body" "$DIR/b$n"
        cmp -s "$DIR/a$n" "$DIR/b$n" || fail "completion $n: $name: speculation changed the greedy output: $(head -c 300 "$DIR/a$n") / $(head -c 300 "$DIR/b$n")"
        n=$((n + 1))
    done
    chat='{"messages":[{"role":"user","content":"Who divided the light from the darkness? Say it twice."}],"max_completion_tokens":40,"temperature":0,"logprobs":true}'
    choice "$U_plain" /v1/chat/completions "$chat" "$DIR/ca"
    choice "$U" /v1/chat/completions "$chat" "$DIR/cb"
    cmp -s "$DIR/ca" "$DIR/cb" || fail "chat: $name: speculation changed the greedy output"
    # streamed: the text of the deltas is the plain server's
    stream="{\"prompt\":\"$PROMPT\",\"max_tokens\":48,\"temperature\":0,\"stream\":true}"
    curl -s -N -H 'Content-Type: application/json' "$U/v1/completions" -d "$stream" >"$DIR/sse"
    tail -1 "$DIR/sse" | grep -q '^data: \[DONE\]' || grep -q '^data: \[DONE\]' "$DIR/sse" || fail "$name stream: no [DONE]"
    got=$(grep '^data: {' "$DIR/sse" | python3 -c 'import json,sys; print("".join(json.loads(l[6:])["choices"][0]["text"] for l in sys.stdin if json.loads(l[6:])["choices"]))')
    want=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))[0]["text"])' "$DIR/a0")
    [ "$got" = "$want" ] || fail "$name stream: '$got' against '$want'"
    echo "$name greedy: 3 completions (chosen logprobs, none, top logprobs), a chat and a stream: the plain server's bytes"

    # seeded sampling: the same text alone and beside three others
    sampled="{\"prompt\":\"$PROMPT\",\"max_tokens\":40,\"temperature\":0.8,\"seed\":11,\"logprobs\":0}"
    choice "$U" /v1/completions "$sampled" "$DIR/alone"
    CPIDS=""
    for k in 1 2 3 4; do
        curl -s -H 'Content-Type: application/json' "$U/v1/completions" \
            -d "{\"prompt\":\"$PROMPT\",\"max_tokens\":40,\"temperature\":0.8,\"seed\":$((10 + k)),\"logprobs\":0}" >"$DIR/par$k" &
        CPIDS="$CPIDS $!"
    done
    for p in $CPIDS; do wait "$p"; done # (not the servers)
    python3 -c 'import json,sys; print(json.dumps(json.load(open(sys.argv[1]))["choices"], sort_keys=True))' "$DIR/par1" >"$DIR/together" ||
        fail "$name parallel: $(cat "$DIR/par1")"
    cmp -s "$DIR/alone" "$DIR/together" || fail "$name seeded: speculation's text alone and beside three others differ"
    echo "$name seeded: the same text and logprobs alone and beside three others"

    curl -s "$U/metrics" >"$DIR/metrics"
    drafted=$(sed -n 's/^muser_spec_draft_tokens_total //p' "$DIR/metrics")
    accepted=$(sed -n 's/^muser_spec_accepted_tokens_total //p' "$DIR/metrics")
    rounds=$(sed -n 's/^muser_spec_rounds_total //p' "$DIR/metrics")
    [ "${drafted:-0}" -gt 0 ] && [ "${accepted:-0}" -gt 0 ] || fail "$name metrics: drafted ${drafted:-?}, accepted ${accepted:-?}"
    echo "$name metrics: $rounds verify rounds, $drafted drafts proposed, $accepted accepted"
}
check_spec ngram
check_spec model
# one slot, four requests queued for it: each takes the draft engine's one sequence as the last frees it
start one --slots 1 -t 2 --draft "$SRC/models/draft.gguf" --draft-max 4 --draft-fixed
CPIDS=""
for k in 1 2 3 4; do
    curl -s -o "$DIR/one$k" -w '%{http_code}' -H 'Content-Type: application/json' "$U_one/v1/completions" \
        -d "{\"prompt\":\"$PROMPT\",\"max_tokens\":16,\"temperature\":0.8,\"seed\":$k}" >"$DIR/one$k.code" &
    CPIDS="$CPIDS $!"
done
for p in $CPIDS; do wait "$p"; done
for k in 1 2 3 4; do
    [ "$(cat "$DIR/one$k.code")" = 200 ] || fail "one slot: request $k: $(cat "$DIR/one$k.code") $(cat "$DIR/one$k")"
done
echo "one slot, a draft model: 4 queued requests all served"
plain_rounds=$(curl -s "$U_plain/metrics" | sed -n 's/^muser_spec_rounds_total //p')
[ "$plain_rounds" = 0 ] || fail "the plain server speculated: $plain_rounds rounds"
echo "cli_serve_spec: ok"
