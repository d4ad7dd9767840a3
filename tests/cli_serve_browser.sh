#!/usr/bin/env bash
# cli_serve_browser.sh — the chat page of `muser serve` (web/) in headless Chromium, driven by
# playwright-core (tests/browser/chat_page.mjs; package.json + package-lock.json beside it,
# installed with npm ci into the build directory). Two servers on loopback with the default model:
# one open, one with --api-key, --slots 1 --queue 0. The page's replies, token shades, alternatives
# and stats are checked against the server's own answers; stop must make the server cancel (its
# /metrics); the key is asked for once; 400 and 429 show the server's messages. Screenshots go to
# the build directory (chat.png, chat-phone.png). Skips (77) visibly without node, Chromium or
# the npm registry.
set -u
: "${MUSER_BIN:?}" "${MUSER_SOURCE_DIR:?}" "${MUSER_BUILD_DIR:?}"
CHROMIUM=${CHROMIUM:-/usr/bin/chromium}
command -v node >/dev/null || { echo "SKIP: node is not installed (Debian: nodejs npm)"; exit 77; }
command -v curl >/dev/null || { echo "SKIP: curl is not installed"; exit 77; }
[ -x "$CHROMIUM" ] || { echo "SKIP: Chromium is not at $CHROMIUM (Debian: apt-get install -y chromium; make deps installs it as root)"; exit 77; }
SRC="$MUSER_SOURCE_DIR/tests/browser"
NPM_DIR="$MUSER_BUILD_DIR/npm-browser"
if ! cmp -s "$SRC/package-lock.json" "$NPM_DIR/package-lock.json" || [ ! -f "$NPM_DIR/node_modules/playwright-core/package.json" ]; then
    rm -rf "$NPM_DIR"
    mkdir -p "$NPM_DIR"
    cp "$SRC/package.json" "$SRC/package-lock.json" "$NPM_DIR/"
    if ! command -v npm >/dev/null || ! (cd "$NPM_DIR" && timeout 300 npm ci --no-audit --no-fund >/dev/null 2>&1); then
        rm -f "$NPM_DIR/package-lock.json" # not installed: try again next time
        echo "SKIP: could not install playwright-core with npm ci into $NPM_DIR (registry unreachable?)"
        exit 77
    fi
fi
cp "$SRC/chat_page.mjs" "$NPM_DIR/"

DIR=$(mktemp -d)
PIDS=""
trap 'for p in $PIDS; do kill "$p" 2>/dev/null; done; rm -rf "$DIR"' EXIT
start() { # start NAME ARGS... : a server on a port the system picks; sets PORT
    local name=$1
    shift
    "$MUSER_BIN" serve --port 0 -t 2 "$@" >"$DIR/$name.log" 2>&1 &
    PIDS="$PIDS $!"
    eval "PID_$name=$!"
    for _ in $(seq 1 600); do
        PORT=$(sed -n 's|.*listening on http://127.0.0.1:\([0-9]*\).*|\1|p' "$DIR/$name.log")
        [ -n "$PORT" ] && curl -s "127.0.0.1:$PORT/health" | grep -q '"ok"' && return 0
        sleep 0.1
    done
    echo "FAIL: server $name did not come up"
    cat "$DIR/$name.log"
    exit 1
}
start open --slots 2
PORT_A=$PORT
start keyed --slots 1 --queue 0 --api-key muse-page-key
PORT_B=$PORT
if ! CHROMIUM="$CHROMIUM" timeout 600 node "$NPM_DIR/chat_page.mjs" "$PORT_A" "$PORT_B" muse-page-key "$MUSER_BUILD_DIR"; then
    echo "--- the open server's log (tail):"
    tail -8 "$DIR/open.log"
    echo "--- the keyed server's log (tail):"
    tail -8 "$DIR/keyed.log"
    exit 1
fi
for name in open keyed; do
    eval "pid=\$PID_$name"
    kill -TERM "$pid"
    wait "$pid" || { echo "FAIL: server $name's exit after SIGTERM"; exit 1; }
done
echo PASS
