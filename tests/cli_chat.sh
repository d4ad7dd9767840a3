#!/usr/bin/env bash
# cli_chat.sh — `muser chat` with piped input on the tiny synthetic model: usage errors exit 2, a
# missing model exits 1, every message gets a reply, a fixed seed reproduces a conversation, the
# first greedy reply equals `muser run` on the same template text (so the template and the
# prefill are right), the history in the KV cache changes later replies, /reset forgets it, and a
# full context restarts the conversation instead of failing.
set -u
BIN=${MUSER_BIN:?MUSER_BIN must point at the muser binary}
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
fails=0
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }
expect_rc() { # expect_rc WANT DESCRIPTION -- command...
    local want=$1 what=$2; shift 3
    "$@" </dev/null >"$TMP/out" 2>"$TMP/err"; local rc=$?
    [ "$rc" -eq "$want" ] || { fail "$what: exit $rc, want $want"; sed 's/^/  stderr: /' "$TMP/err" | head -5; }
}

if [ ! -x "$BIN" ]; then echo "SKIP: $BIN is not built"; exit 77; fi
# One engine thread: the tiny model gains nothing from more, and the CI's two cores are shared
# by parallel tests (a spinning pool on a busy machine is slower by orders of magnitude).
T="--threads ${MUSER_TEST_THREADS:-1}"

expect_rc 2 "unknown template" -- "$BIN" chat --template jinja
expect_rc 2 "unknown option" -- "$BIN" chat --bogus
expect_rc 2 "--system without text" -- "$BIN" chat --system
expect_rc 2 "bad --top-k" -- "$BIN" chat --top-k -1
expect_rc 0 "--help" -- "$BIN" chat --help
grep -q "usage: muser chat" "$TMP/out" || fail "--help does not print the usage"
expect_rc 1 "missing model" -- "$BIN" chat -m "$TMP/none.gguf"
[ "$(wc -l <"$TMP/err")" -eq 1 ] || fail "missing model: want one line, got: $(cat "$TMP/err")"

M="$TMP/tiny.gguf"
if ! "$BIN" synth --preset tiny -o "$M" >"$TMP/synth.log" 2>&1; then
    echo "SKIP: muser synth --preset tiny failed (synth not built yet?):"; tail -3 "$TMP/synth.log"
    [ "$fails" -eq 0 ] || exit 1
    exit 77
fi
if ! echo hi | "$BIN" chat $T -m "$M" -n 1 --temp 0 >"$TMP/probe" 2>"$TMP/probe.err"; then
    if grep -q "not built in this tree\|not available" "$TMP/probe.err"; then
        echo "SKIP: the engine is not built yet:"; cat "$TMP/probe.err"
        [ "$fails" -eq 0 ] || exit 1
        exit 77
    fi
    fail "a one-message chat failed: $(cat "$TMP/probe.err")"
fi

chat() { # chat OUTFILE INPUT args...
    local out=$1 input=$2; shift 2
    printf '%b' "$input" | "$BIN" chat $T -m "$M" "$@" >"$out" 2>"$out.err" ||
        fail "chat $* exited $?: $(tail -2 "$out.err")"
}

# Every message gets a reply: with -n 1 each reply is exactly one sampled token (replies may
# themselves contain newlines, so count tokens, not lines).
chat "$TMP/c3" 'hello there\nhow are you\ntell me a story\n' -n 1 --temp 0
grep -q "; 3 tokens generated" "$TMP/c3.err" || fail "three messages: $(tail -1 "$TMP/c3.err")"
chat "$TMP/c" 'hello there\nhow are you\n' -n 16 --seed 5
[ -s "$TMP/c" ] || fail "no reply text"
grep -q "tokens generated" "$TMP/c.err" || fail "no summary on stderr"
gen=$(sed -n 's/.*; \([0-9][0-9]*\) tokens generated.*/\1/p' "$TMP/c.err")
[ "${gen:-0}" -ge 2 ] && [ "${gen:-0}" -le 32 ] || fail "two replies of <= 16 tokens: ${gen:-?} generated"
grep -q "template muse" "$TMP/c.err" || fail "the tiny model's template was not recognised as muse: $(grep template "$TMP/c.err")"
chat "$TMP/c_again" 'hello there\nhow are you\n' -n 16 --seed 5
cmp -s "$TMP/c" "$TMP/c_again" || fail "the same seed gave a different conversation"

# The first greedy reply is what `run` continues from the same template text (BOS included).
chat "$TMP/first" 'hello there\n' -n 20 --temp 0
"$BIN" run $T -m "$M" -n 20 --temp 0 --special -p $'<|user|>\nhello there<|end|>\n<|assistant|>\n' \
    >"$TMP/first_run" 2>"$TMP/first_run.err" || fail "run on the template text failed"
cmp -s "$TMP/first" "$TMP/first_run" || fail "chat's first reply differs from run on the template text"
# ... and with a system message.
chat "$TMP/sys" 'hello there\n' -n 20 --temp 0 --system 'You are terse.'
"$BIN" run $T -m "$M" -n 20 --temp 0 --special \
    -p $'<|system|>\nYou are terse.<|end|>\n<|user|>\nhello there<|end|>\n<|assistant|>\n' \
    >"$TMP/sys_run" 2>/dev/null || fail "run on the system template text failed"
cmp -s "$TMP/sys" "$TMP/sys_run" || fail "chat with --system differs from run on the template text"

# History lives in the cache: the second reply depends on the first turn; /reset forgets it.
# Replies are cut at -n 12 or end at the end-of-turn token; each is followed by one newline.
chat "$TMP/r1" 'hello there\n' -n 12 --temp 0
chat "$TMP/one" 'what next\n' -n 12 --temp 0
chat "$TMP/two" 'hello there\nwhat next\n' -n 12 --temp 0
chat "$TMP/reset" 'hello there\n/reset\nwhat next\n' -n 12 --temp 0
cat "$TMP/r1" "$TMP/one" >"$TMP/r1_one"
head -c "$(wc -c <"$TMP/r1")" "$TMP/two" | cmp -s - "$TMP/r1" || fail "a later message changed the first reply"
cmp -s "$TMP/two" "$TMP/r1_one" && fail "the second reply ignored the history"
cmp -s "$TMP/reset" "$TMP/r1_one" || fail "/reset did not forget the history"
grep -q "conversation reset" "$TMP/reset.err" || fail "/reset not acknowledged"

# A context too small for the conversation starts over instead of failing; all four answered.
chat "$TMP/full" 'hello there my friend\nand again\nand once more\nstill here\n' -n 1 --temp 0 --ctx 40
grep -q "context full" "$TMP/full.err" || fail "--ctx 40 never filled up"
grep -q "; 4 tokens generated" "$TMP/full.err" || fail "after a full context: $(tail -1 "$TMP/full.err")"

# --template chatml on a model without its markers still answers (markers as plain text).
chat "$TMP/chatml" 'hi\n' -n 4 --temp 0 --template chatml
grep -q "template chatml" "$TMP/chatml.err" || fail "--template chatml not used"
# /exit stops reading.
chat "$TMP/exit" 'hi\n/exit\nnever answered\n' -n 1 --temp 0
grep -q "; 1 tokens generated" "$TMP/exit.err" || fail "/exit did not stop the conversation"

if [ "$fails" -ne 0 ]; then echo "cli_chat: $fails failures"; exit 1; fi
echo "cli_chat: all checks passed"
