#!/usr/bin/env bash
# cli_tiktoken.sh — muser's o200k tokenizer against the tiktoken npm package itself: a few hundred
# varied strings (tests/tiktoken/gen_cases.cjs) encoded by tiktoken (encode_ordinary, and
# encode with every special allowed) and by `muser tokenize --vocab o200k --batch`; ids must be
# identical. Skips (77) when node is missing or the tiktoken module cannot be installed.
set -u
: "${MUSER_BIN:?}" "${MUSER_SOURCE_DIR:?}" "${MUSER_BUILD_DIR:?}"
if ! command -v node >/dev/null; then
    echo "SKIP: node is not installed (Debian: nodejs npm)"
    exit 77
fi
NPM_DIR="$MUSER_BUILD_DIR/npm"
if [ ! -f "$NPM_DIR/node_modules/tiktoken/package.json" ]; then
    if ! command -v npm >/dev/null ||
        ! timeout 180 npm install --prefix "$NPM_DIR" --no-audit --no-fund tiktoken >/dev/null 2>&1; then
        echo "SKIP: could not install the tiktoken npm module into $NPM_DIR (registry unreachable?)"
        exit 77
    fi
fi
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
N=400
[ "${MUSER_SANITIZED:-0}" = 1 ] && N=120
node "$MUSER_SOURCE_DIR/tests/tiktoken/gen_cases.cjs" "$NPM_DIR/node_modules" "$WORK/cases" "$N" || {
    echo "FAIL: tiktoken case generation"
    exit 1
}
fail=0
"$MUSER_BIN" tokenize --vocab o200k --batch "$WORK/cases.inp" >"$WORK/got.out" || fail=1
if ! cmp -s "$WORK/got.out" "$WORK/cases.out"; then
    echo "FAIL: muser and tiktoken disagree (line: muser / tiktoken):"
    diff "$WORK/got.out" "$WORK/cases.out" | head -20
    fail=1
fi
"$MUSER_BIN" tokenize --vocab o200k --special --batch "$WORK/cases.special.inp" >"$WORK/got.special.out" || fail=1
if ! cmp -s "$WORK/got.special.out" "$WORK/cases.special.out"; then
    echo "FAIL: special-token cases disagree:"
    diff "$WORK/got.special.out" "$WORK/cases.special.out" | head -20
    fail=1
fi
n=$(wc -l <"$WORK/cases.out")
ns=$(wc -l <"$WORK/cases.special.out")
[ "$fail" = 0 ] && echo "tiktoken o200k_base: $n ordinary + $ns special strings, identical ids"
exit $fail
