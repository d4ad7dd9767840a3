# cli_serve_load.sh — a bounded load run against `muser serve` (the trained default model): 48
# streaming completions, 12 at a time over loopback, from bench/bench_serve (a C load generator).
# Every request must end with a 200, its usage and [DONE]; the server counts 48 finished requests
# and no error, and exits 0 on SIGTERM (under make test-asan: no ASan report, no leak).
set -u
BIN=${MUSER_BIN:?MUSER_BIN not set}
LOAD=${MUSER_BUILD_DIR:?MUSER_BUILD_DIR not set}/bench/bench_serve
DIR=$(mktemp -d)
SPID=""
cleanup() { [ -n "$SPID" ] && kill "$SPID" 2>/dev/null; rm -rf "$DIR"; }
trap cleanup EXIT
fail() { echo "FAIL: $*"; tail -5 "$DIR/serve.log"; exit 1; }
command -v curl >/dev/null || { echo "SKIP: curl is not installed"; exit 77; }
[ -x "$LOAD" ] || fail "no load generator at $LOAD"

"$BIN" serve --port 0 --slots 4 -t 2 >"$DIR/serve.log" 2>&1 &
SPID=$!
for _ in $(seq 1 300); do
    PORT=$(sed -n 's|.*listening on http://127.0.0.1:\([0-9]*\).*|\1|p' "$DIR/serve.log")
    [ -n "$PORT" ] && curl -s "http://127.0.0.1:$PORT/health" | grep -q '"ok"' && break
    sleep 0.1
done
[ -n "$PORT" ] || fail "the server did not come up"
"$LOAD" --port "$PORT" --requests 48 --concurrency 12 --max-tokens 24 --prompt "And God said, Let there be" \
    >"$DIR/load.out" 2>&1 || { cat "$DIR/load.out"; fail "the load run had failed requests"; }
cat "$DIR/load.out"
M=$(curl -s "http://127.0.0.1:$PORT/metrics")
done_n=$(echo "$M" | awk '/^muser_requests_total\{outcome="(stop|length)"\}/ {s += $2} END {print s + 0}')
err_n=$(echo "$M" | awk '/^muser_requests_total\{outcome="(error|refused|cancelled)"\}/ {s += $2} END {print s + 0}')
[ "$done_n" = 48 ] || fail "the server counts $done_n finished requests, not 48"
[ "$err_n" = 0 ] || fail "the server counts $err_n failed, refused or cancelled requests"
echo "$M" | grep -q '^muser_requests_running 0' || fail "requests still running after the load"
kill -TERM $SPID
wait $SPID
rc=$?
SPID=""
[ $rc = 0 ] || fail "SIGTERM after the load: exit $rc"
! grep -q 'Sanitizer' "$DIR/serve.log" || fail "a sanitizer report: $(grep -m1 Sanitizer "$DIR/serve.log")"
echo "PASS"
