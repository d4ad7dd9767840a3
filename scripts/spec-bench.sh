#!/bin/sh
# spec-bench.sh — speculative decoding beside plain decoding on the same prompts (docs/spec.md,
# docs/dflash.md): per drafter, tokens per verify pass (the acceptance length per round), the
# drafts accepted, tok/s and the speedup over plain greedy decoding. Every speculative run's text
# is checked against plain decoding's (greedy: they must be the same).
#   sh scripts/spec-bench.sh [BUILD] [-- extra `muser run` options]
# Drafters: prompt lookup (n 3), the draft model (models/draft.gguf), and each DFlash drafter in
# DFLASH (default: models/dflash-b*.gguf that exist; a synthesized one measures only the plumbing).
# Environment: MODEL (models/default.gguf), N (tokens, 128), K (drafts per pass, 15: a whole block;
# a drafter proposes at most its block size - 1), THREADS (2). Each drafter runs twice: with the
# adaptive draft length (at most K a round, `muser run`'s default) and with --draft-fixed.
set -u
B=${1:-build}
[ $# -gt 0 ] && shift
[ "${1:-}" = "--" ] && shift
M=${MODEL:-models/default.gguf}
N=${N:-128}
K=${K:-15}
T=${THREADS:-2}
DFLASH=${DFLASH:-$(ls models/dflash-b*.gguf 2>/dev/null)}
TMP=${TMPDIR:-/tmp}/spec-bench.$$
mkdir -p "$TMP"
trap 'rm -rf "$TMP"' EXIT
EXTRA="$*" # extra `muser run` options (split on spaces)
run() { # run NAME PROMPT [drafter options] -> one table row
    name=$1 p=$2; shift 2
    # shellcheck disable=SC2086 # EXTRA is meant to split
    "$B/muser" run -m "$M" -p "$p" -n "$N" --temp 0 -t "$T" $EXTRA "$@" >"$TMP/out" 2>"$TMP/err" || { echo "$name: failed: $(tail -1 "$TMP/err")"; return; }
    tps=$(sed -n 's/.*generated [0-9]* tokens in [0-9.]* s (\([0-9.]*\) tok\/s).*/\1/p' "$TMP/err")
    per=$(sed -n 's/.*, \([0-9.]*\) tokens per pass/\1/p' "$TMP/err")
    acc=$(sed -n 's/.* \([0-9]* of [0-9]* drafts accepted ([0-9.]*%)\).*/\1/p' "$TMP/err")
    same=yes
    [ -f "$TMP/plain" ] && ! cmp -s "$TMP/out" "$TMP/plain" && same=NO
    [ "$name" = plain ] && cp "$TMP/out" "$TMP/plain" && PLAIN=$tps
    speed=$(awk -v a="$tps" -v b="${PLAIN:-0}" 'BEGIN { if (b > 0) printf "%.2fx", a / b; else print "-" }')
    printf "| %s | %s | %s | %s | %s | %s |\n" "$name" "${per:-1.00}" "${acc:--}" "$tps" "$speed" "$same"
}
# prompts after which the default model does not stop early (greedy), so each run makes N tokens
for p in "And God said, Let there be light" \
         "And the LORD spake unto Moses, saying," \
         "And Jesus answered and said unto them,"; do
    echo
    echo "prompt: $p"
    echo "| drafter | tokens per pass | drafts accepted | tok/s | speedup | same text |"
    echo "|---|---|---|---|---|---|"
    rm -f "$TMP/plain"
    run plain "$p"
    # each drafter with the adaptive draft length (at most K a round) and with K every round
    for mode in "" --draft-fixed; do
        tag=${mode:+, fixed}
        run "n-gram 3, K $K$tag" "$p" --draft-ngram 3 --draft-max "$K" $mode
        run "draft model, K 4$tag" "$p" --draft models/draft.gguf --draft-max 4 $mode
        for d in $DFLASH; do
            run "DFlash $(basename "$d" .gguf), K $K$tag" "$p" --draft-dflash "$d" --draft-max "$K" $mode
        done
    done
done
