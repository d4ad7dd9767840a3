# cli_handoff.sh — remote prefill on the command line (docs/handoff.md): `muser prefill-serve` and
# `muser run --remote-prefill` give the text a local `muser run` gives (greedy, the trained model, a
# prompt past the window), with the producer and the consumer in two network namespaces joined
# by a veth pair where this machine allows it (made and removed here), over loopback otherwise;
# refused handoffs exit 1 with a one-line reason and print no text (the wrong HMAC key, a
# certificate of another CA, the wrong model, no producer, a key file others can read), bad
# arguments exit 2, and the producer serves on after all of it; `muser serve --remote-prefill`
# answers like a local server, its prefix cache asking the producer for the suffix only; SIGTERM
# stops the producer with exit 0.
set -u
BIN=${MUSER_BIN:?MUSER_BIN not set}
SRC=${MUSER_SOURCE_DIR:?MUSER_SOURCE_DIR not set}
DIR=$(mktemp -d)
PIDS=""
NS=""
VETH=""
cleanup() {
    for p in $PIDS; do kill "$p" 2>/dev/null; done
    wait 2>/dev/null
    [ -n "$VETH" ] && ip link del "$VETH" 2>/dev/null
    for n in $NS; do ip netns del "$n" 2>/dev/null; done
    rm -rf "$DIR"
}
trap cleanup EXIT
fail() { echo "FAIL: $*"; for f in "$DIR"/*.log; do [ -f "$f" ] && { echo "--- $f"; tail -5 "$f"; }; done; exit 1; }
command -v openssl >/dev/null || { echo "SKIP: the openssl CLI is not installed"; exit 77; }
# the producer logs a session when its thread ends, just after the consumer is done: wait for it
wait_log() { for _ in $(seq 1 100); do grep -q "$1" "$2" && return 0; sleep 0.05; done; return 1; }

sh "$SRC/scripts/make-test-certs.sh" "$DIR/c" >/dev/null || fail "make-test-certs.sh"
sh "$SRC/scripts/make-test-certs.sh" "$DIR/o" >/dev/null || fail "make-test-certs.sh (second CA)"
cp "$SRC/models/default.gguf" "$DIR/m.gguf" # the model id cache (m.gguf.sha256) lands here, not in the tree
M="$DIR/m.gguf"
C=(--tls-dir "$DIR/c/consumer" --hmac-key-file "$DIR/c/hmac.key" --ledger "$DIR/ledger")
PROMPT="In the beginning God created the heaven and the earth. And the earth was without form, and void; and darkness was upon the face of the deep. And the Spirit of God moved upon the face of the waters."

# start_producer LOG [PREFIX...] -- ARGS: the producer (under PREFIX, e.g. ip netns exec NS), PORT
start_producer() {
    local log=$1
    shift
    local pre=()
    while [ "$1" != -- ]; do pre+=("$1"); shift; done
    shift
    "${pre[@]}" "$BIN" prefill-serve -m "$M" --port 0 --tls-dir "$DIR/c/producer" --hmac-key-file "$DIR/c/hmac.key" \
        -t 1 --tile-rows 64 --timeout-ms 5000 "$@" >"$log" 2>&1 &
    PPID_=$!
    PIDS="$PIDS $PPID_"
    for _ in $(seq 1 100); do
        PORT=$(sed -n 's/.*listening on [0-9.]*:\([0-9]*\);.*/\1/p' "$log")
        [ -n "$PORT" ] && return 0
        kill -0 "$PPID_" 2>/dev/null || fail "the producer exited: $(cat "$log")"
        sleep 0.1
    done
    fail "the producer did not come up"
}

"$BIN" run -m "$M" -p "$PROMPT" -n 24 --temp 0 -t 1 >"$DIR/local.txt" 2>"$DIR/local.log" || fail "local run"
[ -s "$DIR/local.txt" ] || fail "the local run printed nothing"

# ---- where the producer runs: another network namespace if we may make one ----
HOST=127.0.0.1
PRE=()
CPRE=()
ns_ok=0
if [ "$(id -u)" = 0 ] && command -v ip >/dev/null; then
    a="muser-hxp-$$"; b="muser-hxc-$$"; VETH="mhx$$"
    if ip netns add "$a" 2>/dev/null; then
        NS="$a"
        if ip netns add "$b" 2>/dev/null; then
            NS="$a $b"
            if ip link add "$VETH" type veth peer name "${VETH}p" 2>/dev/null &&
               ip link set "$VETH" netns "$b" && ip link set "${VETH}p" netns "$a" &&
               ip -n "$a" addr add 10.231.7.1/30 dev "${VETH}p" && ip -n "$b" addr add 10.231.7.2/30 dev "$VETH" &&
               ip -n "$a" link set "${VETH}p" up && ip -n "$b" link set "$VETH" up &&
               ip -n "$a" link set lo up && ip -n "$b" link set lo up &&
               ip netns exec "$b" timeout 3 bash -c 'exec 3<>/dev/tcp/10.231.7.1/9' 2>&1 | grep -q refused; then
                # a reset from port 9 of the far end: the pair carries packets
                ns_ok=1
            fi
        fi
    fi
    VETH="" # moved into a namespace: it goes with the namespace
fi
if [ $ns_ok = 1 ]; then
    HOST=10.231.7.1
    PRE=(ip netns exec "$a")
    CPRE=(ip netns exec "$b")
    echo "network: producer in netns $a (10.231.7.1), consumer in netns $b (10.231.7.2), joined by a veth pair"
else
    echo "network: loopback (no network namespaces here: not root, no ip(8), or ip netns/veth refused)"
fi

start_producer "$DIR/producer.log" "${PRE[@]}" -- --host "$HOST"
"${CPRE[@]}" "$BIN" run -m "$M" -p "$PROMPT" -n 24 --temp 0 -t 1 --remote-prefill "$HOST:$PORT" "${C[@]}" \
    >"$DIR/remote.txt" 2>"$DIR/remote.log" || fail "remote run: $(tail -2 "$DIR/remote.log")"
cmp -s "$DIR/local.txt" "$DIR/remote.txt" || fail "remote text '$(cat "$DIR/remote.txt")' != local '$(cat "$DIR/local.txt")'"
grep -q "remote prefill from $HOST:$PORT: session" "$DIR/remote.log" || fail "no remote prefill line"
wait_log "session .* [0-9]* tokens from 0, [0-9]* tiles" "$DIR/producer.log" || fail "no session line from the producer"
echo "remote run ($HOST:$PORT) == local run: $(head -c 60 "$DIR/local.txt")..."

# ---- refused: exit 1, one line, no text ----
refused() { # WANT LABEL ARGS...: run with ARGS, expect exit 1 and WANT in its one error line
    local want=$1 label=$2
    shift 2
    "${CPRE[@]}" "$BIN" run -m "$M" -p "$PROMPT" -n 8 --temp 0 -t 1 "$@" >"$DIR/out.txt" 2>"$DIR/err.log"
    local rc=$?
    [ $rc = 1 ] || fail "$label: exit $rc, want 1 ($(tail -1 "$DIR/err.log"))"
    [ ! -s "$DIR/out.txt" ] || fail "$label: text was printed: $(cat "$DIR/out.txt")"
    local line
    line=$(grep 'muser run: remote prefill' "$DIR/err.log")
    [ "$(echo "$line" | wc -l)" = 1 ] && echo "$line" | grep -q "$want" || fail "$label: '$want' not in: $(cat "$DIR/err.log")"
    echo "refused ($label): $line"
}
openssl rand -hex 32 >"$DIR/k2" && chmod 600 "$DIR/k2"
refused "the request's MAC does not verify" "wrong HMAC key" --remote-prefill "$HOST:$PORT" --tls-dir "$DIR/c/consumer" \
    --hmac-key-file "$DIR/k2" --ledger "$DIR/ledger"
refused "certificate verify failed" "CA of another cluster" --remote-prefill "$HOST:$PORT" --tls-dir "$DIR/o/consumer" \
    --hmac-key-file "$DIR/c/hmac.key" --ledger "$DIR/ledger"
"$BIN" synth --preset tiny -o "$DIR/tiny.gguf" >/dev/null 2>&1 || fail "synth"
refused "wrong model" "wrong model" -m "$DIR/tiny.gguf" --remote-prefill "$HOST:$PORT" "${C[@]}"
chmod 644 "$DIR/k2"
refused "readable by others" "key file mode 644" --remote-prefill "$HOST:$PORT" --tls-dir "$DIR/c/consumer" \
    --hmac-key-file "$DIR/k2" --ledger "$DIR/ledger"
FREE=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
refused "cannot connect" "no producer" --remote-prefill "127.0.0.1:$FREE" "${C[@]}" --handoff-timeout-ms 2000
"$BIN" run -m "$M" -p x --remote-prefill "$HOST:$PORT" >/dev/null 2>&1
[ $? = 2 ] || fail "--remote-prefill without --tls-dir: want exit 2"
"$BIN" run -m "$M" -p x --tls-dir "$DIR/c/consumer" >/dev/null 2>&1
[ $? = 2 ] || fail "--tls-dir without --remote-prefill: want exit 2"
"$BIN" run -m "$M" -p x --remote-prefill nohost "${C[@]}" >/dev/null 2>&1
[ $? = 2 ] || fail "--remote-prefill without a port: want exit 2"
"$BIN" prefill-serve -m "$M" --port 0 >/dev/null 2>&1
[ $? = 2 ] || fail "prefill-serve without --tls-dir: want exit 2"

# the producer served on through all of that
"${CPRE[@]}" "$BIN" run -m "$M" -p "$PROMPT" -n 24 --temp 0 -t 1 --remote-prefill "$HOST:$PORT" "${C[@]}" \
    >"$DIR/remote2.txt" 2>"$DIR/remote2.log" || fail "remote run after the refusals: $(tail -1 "$DIR/remote2.log")"
cmp -s "$DIR/local.txt" "$DIR/remote2.txt" || fail "the second remote run differs"

# ---- muser serve --remote-prefill: the local server's answers; its prefix cache sends only the suffix ----
if command -v curl >/dev/null; then
    start_serve() { # LOG ARGS...: SPORT
        local log=$1
        shift
        "${CPRE[@]}" "$BIN" serve -m "$M" --port 0 -t 1 --ctx 512 "$@" >"$log" 2>&1 &
        PIDS="$PIDS $!"
        for _ in $(seq 1 200); do
            SPORT=$(sed -n 's|.*listening on http://127.0.0.1:\([0-9]*\).*|\1|p' "$log")
            [ -n "$SPORT" ] && "${CPRE[@]}" curl -s "http://127.0.0.1:$SPORT/health" | grep -q '"ok"' && return 0
            sleep 0.1
        done
        fail "muser serve did not come up: $(tail -3 "$log")"
    }
    complete() { # PORT PROMPT: the greedy completion's text
        "${CPRE[@]}" curl -s "http://127.0.0.1:$1/v1/completions" -H 'Content-Type: application/json' \
            -d "{\"prompt\":\"$2\",\"max_tokens\":16,\"temperature\":0}" | sed 's/.*"text":"\([^"]*\)".*/\1/'
    }
    start_serve "$DIR/serve-local.log"
    LP=$SPORT
    start_serve "$DIR/serve-remote.log" --remote-prefill "$HOST:$PORT" "${C[@]}"
    RP=$SPORT
    P1="The Lord is my shepherd; I shall not want. He maketh me to lie down in green pastures."
    P2="$P1 He leadeth me beside the still waters. He restoreth my soul."
    for p in "$P1" "$P2"; do
        l=$(complete "$LP" "$p")
        r=$(complete "$RP" "$p")
        [ -n "$l" ] && [ "$l" = "$r" ] || fail "serve: remote '$r' != local '$l'"
    done
    "${CPRE[@]}" curl -s "http://127.0.0.1:$RP/metrics" | grep -q '^muser_prefix_cache_hits_total 1' ||
        fail "serve: the second prompt did not start from the cached first"
    wait_log "tokens from [1-9][0-9]*," "$DIR/producer.log" || fail "serve: no delta session (from a warm prefix) at the producer"
    echo "serve --remote-prefill == local serve (2 prompts, the second a delta: $(grep -o 'tokens from [1-9][0-9]*, [0-9]* tiles' "$DIR/producer.log" | tail -1))"
else
    echo "note: curl is not installed; the muser serve part is skipped"
fi

kill -TERM "$PPID_"
wait "$PPID_"
rc=$?
[ $rc = 0 ] || fail "the producer exited $rc on SIGTERM"
grep -q "stopping; [0-9]* sessions served, [0-9]* refused" "$DIR/producer.log" || fail "no stopping line"
grep "stopping" "$DIR/producer.log"
echo "PASS"
