#!/usr/bin/env bash
# cli_serve_openai.sh — the openai npm client (tests/openai/client.mjs, package.json beside it)
# against `muser serve` on the trained default model over loopback, with an API key. Installs the
# package with npm when absent; skips (77) visibly without node, npm or the registry.
set -u
: "${MUSER_BIN:?}" "${MUSER_SOURCE_DIR:?}" "${MUSER_BUILD_DIR:?}"
command -v node >/dev/null || { echo "SKIP: node is not installed (Debian: nodejs npm)"; exit 77; }
command -v curl >/dev/null || { echo "SKIP: curl is not installed"; exit 77; }
NPM_DIR="$MUSER_BUILD_DIR/npm-openai"
if [ ! -f "$NPM_DIR/node_modules/openai/package.json" ]; then
    mkdir -p "$NPM_DIR"
    cp "$MUSER_SOURCE_DIR/tests/openai/package.json" "$NPM_DIR/"
    if ! command -v npm >/dev/null || ! (cd "$NPM_DIR" && timeout 300 npm install --no-audit --no-fund >/dev/null 2>&1); then
        echo "SKIP: could not install the openai npm package into $NPM_DIR (registry unreachable?)"
        exit 77
    fi
fi
cp "$MUSER_SOURCE_DIR/tests/openai/client.mjs" "$NPM_DIR/"
LOG=$(mktemp)
"$MUSER_BIN" serve --port 0 --api-key muse-key -t 2 >"$LOG" 2>&1 &
SPID=$!
trap 'kill $SPID 2>/dev/null; rm -f "$LOG"' EXIT
PORT=
for _ in $(seq 1 300); do
    PORT=$(sed -n 's|.*listening on http://127.0.0.1:\([0-9]*\).*|\1|p' "$LOG")
    [ -n "$PORT" ] && curl -s "localhost:$PORT/health" | grep -q '"ok"' && break
    sleep 0.1
done
[ -n "$PORT" ] || { echo "FAIL: the server did not come up"; cat "$LOG"; exit 1; }
node "$NPM_DIR/client.mjs" $PORT muse-key || { tail -5 "$LOG"; exit 1; }
kill -TERM $SPID
wait $SPID || { echo "FAIL: the server's exit after SIGTERM"; exit 1; }
echo PASS
