#!/usr/bin/env bash
# cli_tokenize.sh — `muser tokenize` / `muser detokenize`: ids on one line and nothing else on
# stdout, round trips through detokenize, --special, --bos, --batch on the peer vectors, usage
# errors (exit 2), missing/corrupt model and invalid UTF-8 (one-line error, exit 1), and
# --export-vocab writing a vocabulary-only GGUF that tokenizes like --vocab o200k.
set -u
: "${MUSER_BIN:?}"
SHARED="${MUSER_SHARED_DIR:-${MUSER_SOURCE_DIR:-.}/../shared}/peer-tests/tokenizer"
GPT2="$SHARED/ggml-vocab-gpt-2.gguf"
PHI3="$SHARED/ggml-vocab-phi-3.gguf"
if [ ! -f "$GPT2" ] || [ ! -f "$PHI3" ]; then
    echo "SKIP: peer tokenizer vectors not found at $SHARED"
    exit 77
fi
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
fail=0
expect() { # expect NAME GOT WANT
    if [ "$2" != "$3" ]; then
        echo "FAIL: $1: got '$2', want '$3'"
        fail=1
    fi
}
rc_of() { "$@" >"$WORK/out" 2>"$WORK/err"; echo $?; }

expect "gpt2 ids" "$("$MUSER_BIN" tokenize -m "$GPT2" "Hello world")" "15496 995"
expect "gpt2 special off" "$("$MUSER_BIN" tokenize -m "$GPT2" "<|endoftext|>")" "27 91 437 1659 5239 91 29"
expect "gpt2 special on" "$("$MUSER_BIN" tokenize -m "$GPT2" --special "a<|endoftext|>")" "64 50256"
expect "gpt2 bos" "$("$MUSER_BIN" tokenize -m "$GPT2" --bos "Hello")" "50256 15496"
expect "phi3 ids" "$("$MUSER_BIN" tokenize -m "$PHI3" " Hello world")" "29871 15043 3186"
expect "phi3 bos" "$("$MUSER_BIN" tokenize -m "$PHI3" --bos "Hello")" "1 15043"
expect "detok args" "$("$MUSER_BIN" detokenize -m "$GPT2" 15496 995)" "Hello world"
expect "detok commas" "$("$MUSER_BIN" detokenize -m "$GPT2" "15496, 995,0")" "Hello world!"
expect "detok phi3" "$("$MUSER_BIN" detokenize -m "$PHI3" "29871 15043 3186")" " Hello world"
expect "empty text" "$("$MUSER_BIN" tokenize -m "$GPT2" "")" ""
text='Ünïcödé 🦙 and   spaces, "quotes" & 12345'
expect "round trip" "$("$MUSER_BIN" detokenize -m "$GPT2" "$("$MUSER_BIN" tokenize -m "$GPT2" "$text")")" "$text"
expect "round trip phi3" "$("$MUSER_BIN" detokenize -m "$PHI3" "$("$MUSER_BIN" tokenize -m "$PHI3" "$text")")" "$text"

# stdout is ids only; stderr empty on success
"$MUSER_BIN" tokenize -m "$GPT2" "$text" >"$WORK/o" 2>"$WORK/e"
grep -qvE '^[0-9]+( [0-9]+)*$' "$WORK/o" && { echo "FAIL: stdout is not just ids"; fail=1; }
[ "$(wc -l <"$WORK/o")" = 1 ] || { echo "FAIL: stdout is not one line"; fail=1; }
[ -s "$WORK/e" ] && { echo "FAIL: stderr not empty"; fail=1; }

# the peer vectors through --batch
for v in "$GPT2" "$PHI3"; do
    # the .out files start each line with a space
    if ! "$MUSER_BIN" tokenize -m "$v" --batch "$v.inp" | cmp -s - <(sed 's/^ //' "$v.out"); then
        echo "FAIL: --batch on $(basename "$v") differs from the expected ids"
        fail=1
    fi
done

# usage errors: exit 2
expect "no text" "$(rc_of "$MUSER_BIN" tokenize -m "$GPT2")" 2
expect "two texts" "$(rc_of "$MUSER_BIN" tokenize -m "$GPT2" a b)" 2
expect "bad option" "$(rc_of "$MUSER_BIN" tokenize --frobnicate x)" 2
expect "missing -m value" "$(rc_of "$MUSER_BIN" tokenize -m)" 2
expect "detok no ids" "$(rc_of "$MUSER_BIN" detokenize -m "$GPT2")" 2
expect "detok garbage" "$(rc_of "$MUSER_BIN" detokenize -m "$GPT2" 12 abc)" 2
expect "detok negative" "$(rc_of "$MUSER_BIN" detokenize -m "$GPT2" -- -5)" 2
expect "help" "$(rc_of "$MUSER_BIN" tokenize --help)" 0

# model and input errors: exit 1, one line on stderr
expect "missing model" "$(rc_of "$MUSER_BIN" tokenize -m "$WORK/nope.gguf" hi)" 1
expect "missing model msg" "$(wc -l <"$WORK/err")" 1
printf 'this is not a gguf file at all, just text\n' >"$WORK/bad.gguf"
expect "corrupt model" "$(rc_of "$MUSER_BIN" tokenize -m "$WORK/bad.gguf" hi)" 1
expect "corrupt model msg" "$(wc -l <"$WORK/err")" 1
expect "detok corrupt" "$(rc_of "$MUSER_BIN" detokenize -m "$WORK/bad.gguf" 1)" 1
expect "invalid utf8" "$(rc_of "$MUSER_BIN" tokenize -m "$GPT2" "$(printf 'ab\xffcd')")" 1
grep -q "offset 2" "$WORK/err" || { echo "FAIL: invalid UTF-8 message does not name offset 2: $(cat "$WORK/err")"; fail=1; }
expect "id out of range" "$(rc_of "$MUSER_BIN" detokenize -m "$GPT2" 50257)" 1

# --export-vocab: a vocabulary-only GGUF that behaves like the built-in vocabulary
"$MUSER_BIN" tokenize --vocab o200k --export-vocab "$WORK/o200k.gguf" || { echo "FAIL: export"; fail=1; }
a=$("$MUSER_BIN" tokenize --vocab o200k "Hello world, ünïcode 123456 🦙")
b=$("$MUSER_BIN" tokenize -m "$WORK/o200k.gguf" "Hello world, ünïcode 123456 🦙")
expect "o200k ids" "$a" "13225 2375 11 86582 9954 3056 220 7633 19354 9552 99 247" # tiktoken's
expect "exported gguf" "$b" "$a"
expect "o200k detok" "$("$MUSER_BIN" detokenize --vocab o200k 199999)" "<|endoftext|>"

[ "$fail" = 0 ] && echo "cli_tokenize: all checks passed"
exit $fail
