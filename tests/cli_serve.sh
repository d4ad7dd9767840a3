# cli_serve.sh — `muser serve` end to end on the trained default model, over loopback with curl:
# every route and the chat page's files, streaming (SSE, [DONE], usage), stop strings held back and never leaked, logprobs,
# the prefix cache (a warm prompt gives the cold bytes), the error cases (malformed JSON, wrong types, unknown fields, context too long, ranges, 413,
# 404, 405, 401 with an API key, 429), 16 parallel streaming clients whose text and logprobs equal
# the same requests run one at a time with the same seeds, a disconnect mid-stream freeing its
# slot, and SIGTERM exiting 0.
set -u
BIN=${MUSER_BIN:?MUSER_BIN not set}
DIR=$(mktemp -d)
PIDS=""
cleanup() { for p in $PIDS; do kill "$p" 2>/dev/null; done; rm -rf "$DIR"; }
trap cleanup EXIT
fail() { echo "FAIL: $*"; [ -f "$DIR/serve.log" ] && tail -5 "$DIR/serve.log"; exit 1; }
command -v curl >/dev/null || { echo "SKIP: curl is not installed"; exit 77; }

start() { # start ARGS... : the server on a port the system picks (PORT, U), waits for /health
    "$BIN" serve --port 0 "$@" >"$DIR/serve.log" 2>&1 &
    SPID=$!
    PIDS="$PIDS $SPID"
    for _ in $(seq 1 300); do
        PORT=$(sed -n 's|.*listening on http://127.0.0.1:\([0-9]*\).*|\1|p' "$DIR/serve.log")
        U="http://localhost:$PORT"
        [ -n "$PORT" ] && curl -s "$U/health" | grep -q '"ok"' && return 0
        sleep 0.1
    done
    fail "the server did not come up"
}
post() { curl -s -o "$DIR/body" -w '%{http_code}' -H 'Content-Type: application/json' "$@"; }

start --slots 4 -t 2
[ "$(curl -s "$U/health")" = '{"status":"ok"}' ] || fail "health"
curl -s "$U/v1/models" >"$DIR/models"
grep -q '"context_length":512' "$DIR/models" || fail "models: context length: $(cat "$DIR/models")"
grep -q '"backend":"cpu"' "$DIR/models" || fail "models: backend: $(cat "$DIR/models")"
grep -q '"slots":4' "$DIR/models" || fail "models: slots: $(cat "$DIR/models")"
# the chat page (web/, embedded): its files with their types and a strict CSP; GET only
curl -s -D "$DIR/page.h" -o "$DIR/page" "$U/"
grep -qi '^content-type: text/html; charset=utf-8' "$DIR/page.h" || fail "GET /: $(cat "$DIR/page.h")"
grep -qi "^content-security-policy: default-src 'none'; script-src 'self'" "$DIR/page.h" || fail "GET /: no CSP: $(cat "$DIR/page.h")"
cmp -s "$DIR/page" "$MUSER_SOURCE_DIR/web/index.html" || fail "GET / is not web/index.html"
curl -s -D "$DIR/js.h" -o "$DIR/js" "$U/chat.js"
grep -qi '^content-type: text/javascript' "$DIR/js.h" && cmp -s "$DIR/js" "$MUSER_SOURCE_DIR/web/chat.js" || fail "GET /chat.js"
[ "$(curl -s -o /dev/null -w '%{http_code} %{content_type}' "$U/chat.css")" = "200 text/css; charset=utf-8" ] || fail "GET /chat.css"
[ "$(curl -s -o /dev/null -w '%{http_code}' -X POST "$U/")" = 405 ] || fail "POST / is not 405"
echo "chat page: /, /chat.js, /chat.css with their types and CSP; /v1/models: context_length, backend, slots"

# completions, greedy, logprobs with alternatives
code=$(post "$U/v1/completions" -d '{"prompt":"The Lord is my shepherd;","max_tokens":16,"temperature":0,"logprobs":3}')
[ "$code" = 200 ] || fail "completions: $code $(cat "$DIR/body")"
grep -q '"finish_reason":"length"' "$DIR/body" || fail "completions: finish_reason"
grep -q '"token_logprobs":\[' "$DIR/body" || fail "completions: logprobs"
grep -q '"completion_tokens":16' "$DIR/body" || fail "completions: usage"
# chat with logprobs and bytes
code=$(post "$U/v1/chat/completions" -d '{"messages":[{"role":"system","content":"Be brief."},{"role":"user","content":"Who made the heaven?"}],"max_completion_tokens":8,"seed":5,"logprobs":true,"top_logprobs":2}')
[ "$code" = 200 ] || fail "chat: $code $(cat "$DIR/body")"
grep -q '"role":"assistant"' "$DIR/body" || fail "chat: message"
grep -q '"bytes":\[' "$DIR/body" || fail "chat: bytes"
grep -q '"top_logprobs":\[{' "$DIR/body" || fail "chat: top_logprobs"
# tokenize / detokenize round trip
code=$(post "$U/tokenize" -d '{"content":"In the beginning"}')
[ "$code" = 200 ] || fail "tokenize $code"
toks=$(sed 's/.*"tokens":\(\[[^]]*\]\).*/\1/' "$DIR/body")
code=$(post "$U/detokenize" -d "{\"tokens\":$toks}")
grep -q '"content":"In the beginning"' "$DIR/body" || fail "detokenize: $(cat "$DIR/body")"

# streaming: chunks, a final finish_reason, usage, [DONE]
curl -sN "$U/v1/completions" -d '{"prompt":"In the beginning","max_tokens":6,"temperature":0,"stream":true,"stream_options":{"include_usage":true}}' >"$DIR/sse"
grep -c '^data: ' "$DIR/sse" | grep -q '^9$' || fail "stream: expected 6 tokens + finish + usage + [DONE] events, got $(grep -c '^data: ' "$DIR/sse")"
tail -n 2 "$DIR/sse" | grep -q '^data: \[DONE\]' || fail "stream: no [DONE]"
grep -q '"usage":{"prompt_tokens"' "$DIR/sse" || fail "stream: usage"
# stop strings: the text before the first stop, the stop itself never sent (not even in part)
full=$(post "$U/v1/completions" -d '{"prompt":"The Lord is my shepherd;","max_tokens":30,"temperature":0}' >/dev/null; sed 's/.*"text":"\([^"]*\)".*/\1/' "$DIR/body")
stop=$(echo "$full" | cut -c9-12) # four characters from inside the greedy text
[ ${#stop} = 4 ] || fail "stop: the greedy text is too short: '$full'"
want=$(python3 -c 'import sys; t, s = sys.argv[1], sys.argv[2]; print(t[:t.index(s)])' "$full" "$stop")
curl -sN "$U/v1/completions" -d "{\"prompt\":\"The Lord is my shepherd;\",\"max_tokens\":30,\"temperature\":0,\"stream\":true,\"stop\":[\"zzzz\",\"$stop\"]}" >"$DIR/sse2"
got=$(grep '^data: {' "$DIR/sse2" | python3 -c 'import json,sys; print("".join(json.loads(l[6:])["choices"][0]["text"] for l in sys.stdin if json.loads(l[6:])["choices"]))')
[ "$got" = "$want" ] || fail "stop: streamed '$got', want '$want' (stop '$stop')"
grep -q '"finish_reason":"stop"' "$DIR/sse2" || fail "stop: finish_reason"

# errors
expect() { # CODE ROUTE BODY [param|code]
    c=$(post "$U$2" -d "$3")
    [ "$c" = "$1" ] || fail "expected $1 for $3, got $c: $(cat "$DIR/body")"
    [ -z "${4:-}" ] || grep -q "$4" "$DIR/body" || fail "error for $3 does not name $4: $(cat "$DIR/body")"
}
expect 400 /v1/completions '{"prompt": "x",' ''
expect 400 /v1/completions '{"prompt": 5}' '"param":"prompt"'
expect 400 /v1/completions '{"prompt": "x", "best_of": 2}' 'best_of'
expect 400 /v1/completions '{"prompt": "x", "max_tokens": 0}' 'max_tokens'
expect 400 /v1/completions '{"prompt": "x", "temperature": "hot"}' 'temperature'
expect 400 /v1/completions '{"prompt": "x", "n": 2}' '"param":"n"'
expect 400 /v1/chat/completions '{"messages": [{"role":"user","content":"x"}], "logprobs": true, "top_logprobs": 21}' 'top_logprobs'
expect 400 /v1/chat/completions '{"messages": [{"role":"wizard","content":"x"}]}' 'messages.role'
expect 400 /v1/completions '{"prompt": "x", "max_tokens": 100000}' 'context_length_exceeded'
long=$(python3 -c 'print("word " * 2000)')
expect 400 /v1/completions "{\"prompt\": \"$long\"}" 'context_length_exceeded'
python3 -c 'print("{\"prompt\": \"" + "a" * (1 << 20) + "\"}")' >"$DIR/big.json"
c=$(curl -s -o "$DIR/body" -w '%{http_code}' "$U/v1/completions" --data-binary @"$DIR/big.json")
[ "$c" = 413 ] || fail "a 1 MiB body: $c"
[ "$(curl -s -o /dev/null -w '%{http_code}' "$U/v2/nothing")" = 404 ] || fail "404"
[ "$(curl -s -o /dev/null -w '%{http_code}' "$U/v1/completions")" = 405 ] || fail "405"
[ "$(curl -s -o /dev/null -w '%{http_code}' -X DELETE "$U/v1/models")" = 405 ] || fail "405 models"
echo "errors: 400 (syntax, types, unknown field, ranges, n, role, context), 413, 404, 405"

# 16 parallel streaming clients, seeded and sampled, against the same requests one at a time
req() { echo "{\"prompt\":\"Chapter $1: And it came to pass\",\"max_tokens\":24,\"temperature\":0.9,\"seed\":$((100 + $1)),\"logprobs\":1,\"stream\":true}"; }
for i in $(seq 1 16); do curl -sN "$U/v1/completions" -d "$(req $i)" | grep '^data: {' | sed 's/"created":[0-9]*,//; s/"id":"[^"]*",//' >"$DIR/alone.$i"; done
for i in $(seq 1 16); do (curl -sN "$U/v1/completions" -d "$(req $i)" | grep '^data: {' | sed 's/"created":[0-9]*,//; s/"id":"[^"]*",//' >"$DIR/par.$i") & done
wait_all() { for _ in $(seq 1 600); do [ "$(jobs -rp | grep -vw "$SPID" | wc -l)" = 0 ] && return 0; sleep 0.1; done; return 1; }
wait_all || fail "parallel clients did not finish"
for i in $(seq 1 16); do cmp -s "$DIR/alone.$i" "$DIR/par.$i" || fail "client $i: its stream beside 15 others differs from the same request alone"; done
shared=$(curl -s "$U/metrics" | grep '^muser_engine_passes_total' | awk '{print $2}')
dp=$(curl -s "$U/metrics" | grep '^muser_engine_decode_passes_total' | awk '{print $2}')
dr=$(curl -s "$U/metrics" | grep '^muser_engine_decode_rows_total' | awk '{print $2}')
[ -n "$dp" ] && [ -n "$dr" ] && [ "$dp" -gt 0 ] && [ "$dr" -gt "$dp" ] && [ "$dp" -lt "$shared" ] ||
    fail "decode passes $dp and their rows $dr: 16 parallel clients should have shared passes (of $shared in all)"
echo "16 parallel streaming clients: text and logprob bytes equal the sequential runs ($shared engine passes so far, $dp decode passes of $dr rows)"

# a client that disconnects mid-stream frees its slot
for attempt in 1 2 3 4 5; do # (a sampled stream may reach an end token before the client goes: retry)
    # the client goes after its first events (head closes the pipe), however fast the server is
    curl -sN "$U/v1/completions" -d "{\"prompt\":\"And\",\"max_tokens\":400,\"temperature\":0.8,\"seed\":$attempt,\"stream\":true}" 2>/dev/null |
        head -c 400 >/dev/null
    for _ in $(seq 1 50); do
        curl -s "$U/metrics" | grep -q '^muser_requests_running 0' && break
        sleep 0.1
    done
    curl -s "$U/metrics" | grep -q '^muser_requests_running 0' || fail "a disconnected stream kept its slot"
    curl -s "$U/metrics" | grep -q 'muser_requests_total{outcome="cancelled"} [1-9]' && break
done
curl -s "$U/metrics" | grep -q 'muser_requests_total{outcome="cancelled"} [1-9]' || fail "the disconnect is not counted as cancelled"
curl -s "$U/metrics" | grep -q '^muser_time_to_first_token_seconds_bucket{le="+Inf"}' || fail "metrics: ttft histogram"
echo "disconnect: the slot is free again, counted as cancelled"

# the prefix cache: a prompt that extends a cached one starts from its rows, and gives the cold bytes
A="In the beginning God created the heaven and the earth. And the earth was without form, and void;"
B="$A and darkness was upon the face of the deep. And the Spirit of God moved"
creq() { echo "{\"prompt\":\"$1\",\"max_tokens\":16,\"temperature\":0,\"logprobs\":3}"; }
hits() { curl -s "$U/metrics" | sed -n 's/^muser_prefix_cache_hits_total //p'; }
post "$U/v1/completions" -d "$(creq "$B")" >/dev/null
sed 's/"created":[0-9]*,//; s/"id":"[^"]*",//' "$DIR/body" >"$DIR/cold"
grep -q '"token_logprobs":\[' "$DIR/cold" || fail "prefix cache: the cold request: $(cat "$DIR/cold")"
h0=$(hits)
post "$U/v1/completions" -d "$(creq "$A")" >/dev/null # caches A's prompt (B's entry is no prefix of A)
post "$U/v1/completions" -d "$(creq "$B")" >/dev/null # starts from A's rows
sed 's/"created":[0-9]*,//; s/"id":"[^"]*",//' "$DIR/body" >"$DIR/warm"
h1=$(hits)
[ "$h1" -gt "$h0" ] || fail "prefix cache: no hit for a prompt extending a cached one ($h0 -> $h1)"
cmp -s "$DIR/cold" "$DIR/warm" || fail "prefix cache: the warm request differs from the cold one: $(cat "$DIR/cold") vs $(cat "$DIR/warm")"
reused=$(curl -s "$U/metrics" | sed -n 's/^muser_prefix_cache_reused_tokens_total //p')
[ "$reused" -ge 16 ] || fail "prefix cache: $reused tokens reused"
echo "prefix cache: a prompt extending a cached one reuses its rows ($reused tokens so far), text and logprob bytes equal the cold run"

# SIGTERM: exits 0
kill -TERM $SPID
for _ in $(seq 1 100); do kill -0 $SPID 2>/dev/null || break; sleep 0.1; done
wait $SPID
rc=$?
[ $rc = 0 ] || fail "SIGTERM: exit $rc"

# an API key: 401 without it, 200 with it, /health open; 429 beyond the queue
start --slots 1 --queue 0 --api-key sesame -t 2
[ "$(curl -s -o /dev/null -w '%{http_code}' "$U/v1/models")" = 401 ] || fail "no key: not 401"
[ "$(curl -s -o /dev/null -w '%{http_code}' -H 'Authorization: Bearer sesamf' "$U/v1/models")" = 401 ] || fail "wrong key"
[ "$(curl -s -o /dev/null -w '%{http_code}' -H 'Authorization: Bearer sesame' "$U/v1/models")" = 200 ] || fail "the key"
[ "$(curl -s -o /dev/null -w '%{http_code}' "$U/health")" = 200 ] || fail "health needs no key"
[ "$(curl -s -o /dev/null -w '%{http_code} %{content_type}' "$U/")" = "200 text/html; charset=utf-8" ] || fail "the page needs no key"
c=none
for attempt in 1 2 3 4 5; do # a long request holds the one slot (it may end early at an end token: retry)
    curl -sN -H 'Authorization: Bearer sesame' "$U/v1/completions" \
        -d '{"prompt":"And","max_tokens":480,"temperature":2.0,"stream":true}' >/dev/null &
    for _ in $(seq 1 20); do
        curl -s -H 'Authorization: Bearer sesame' "$U/metrics" | grep -q '^muser_requests_running 1' && break
        sleep 0.02
    done
    c=$(curl -s -o "$DIR/body" -w '%{http_code}' -H 'Authorization: Bearer sesame' "$U/v1/completions" -d '{"prompt":"x","max_tokens":2}')
    [ "$c" = 429 ] && break
    wait %1 2>/dev/null
done
[ "$c" = 429 ] || fail "a request beyond the slot and the queue: $c"
grep -q '"code":"too_many_requests"' "$DIR/body" || fail "429 body"
echo "api key: 401 / 200; 429 when the slot and the queue are full"
kill -TERM $SPID
wait $SPID || fail "second server exit"

# the model split across two CPU ranks (docs/tp.md): four seeded requests at once give the bytes
# of each run alone (the split device keeps row invariance), and SIGTERM still exits 0
start --slots 4 --tensor-parallel 2 -t 2
for k in 1 2 3 4; do
    post "$U/v1/completions" -d "{\"prompt\":\"And God said\",\"max_tokens\":12,\"seed\":$k,\"logprobs\":2}" >/dev/null
    sed 's/"created":[0-9]*,//; s/"id":"[^"]*",//' "$DIR/body" >"$DIR/tp_alone$k"
done
CP=""
for k in 1 2 3 4; do
    curl -s -H 'Content-Type: application/json' "$U/v1/completions" \
        -d "{\"prompt\":\"And God said\",\"max_tokens\":12,\"seed\":$k,\"logprobs\":2}" >"$DIR/tp_par$k" &
    CP="$CP $!"
done
for p in $CP; do wait "$p"; done
for k in 1 2 3 4; do
    sed -i 's/"created":[0-9]*,//; s/"id":"[^"]*",//' "$DIR/tp_par$k"
    grep -q '"finish_reason"' "$DIR/tp_par$k" || fail "tensor parallel: request $k: $(cat "$DIR/tp_par$k")"
    cmp -s "$DIR/tp_alone$k" "$DIR/tp_par$k" || fail "tensor parallel: request $k packed differs from alone"
done
kill -TERM $SPID
wait $SPID || fail "tensor-parallel server exit"
echo "tensor parallel 2: four seeded requests at once give each one's bytes alone"
echo "PASS"
