# serve-bench.sh — muser serve under bench/bench_serve: aggregate tok/s at 1, 4 and 16 streams, and the
# inter-token latency of 8 streams idle and while a long prompt arrives (bench/RESULTS.md, "Server").
#   sh scripts/serve-bench.sh MODEL [BUILD]   (defaults: /tmp/small.gguf, ./build; --backend via SERVE_ARGS)
# SERVE_CTX: the per-sequence context (2048); LONG_REPEAT: the long prompt's sentences (60: ~1,150
# tokens; 1720: ~27,400, with SERVE_CTX 34816); STREAM_TOKENS: the 8 streams' tokens each (48; make
# them outlast the long prompt's prefill to see its whole effect); TEMP: the requests' temperature
# (0.8; 0 is greedy, whose rows the GPU hands back as one id instead of the whole row).
set -u
CTX=${SERVE_CTX:-2048}
LR=${LONG_REPEAT:-60}
ST=${STREAM_TOKENS:-48}
TEMP=${TEMP:-0.8}
M=${1:-/tmp/small.gguf}
B=${2:-build}
$B/muser serve -m "$M" --port 0 --slots 16 ${SERVE_ARGS:--t 2} --ctx $CTX --prefix-cache 0 >"${TMPDIR:-/tmp}/serve-bench.log" 2>&1 &
SP=$!
for _ in $(seq 1 300); do PORT=$(sed -n 's|.*listening on http://127.0.0.1:\([0-9]*\).*|\1|p' "${TMPDIR:-/tmp}/serve-bench.log"); [ -n "$PORT" ] && curl -s http://127.0.0.1:$PORT/health | grep -q ok && break; sleep 0.2; done
for c in 1 4 16; do
  n=$((c < 2 ? 2 : c))
  echo "== concurrency $c"; $B/bench/bench_serve --port $PORT --requests $n --concurrency $c --max-tokens 32 --temperature $TEMP --prompt "And God said, Let there be light"
done
python3 -c "print('And it came to pass in those days, that there went out a decree. ' * $LR)" > "${TMPDIR:-/tmp}/serve-bench-long.txt"
echo "== 8 streams idle"; $B/bench/bench_serve --port $PORT --requests 8 --concurrency 8 --max-tokens $ST --temperature $TEMP --prompt "And God said"
echo "== 8 streams while a long prompt arrives"
( sleep 1; $B/bench/bench_serve --port $PORT --requests 1 --concurrency 1 --max-tokens 1 --prompt-file "${TMPDIR:-/tmp}/serve-bench-long.txt" > "${TMPDIR:-/tmp}/serve-bench-long.out" 2>&1 ) &
LP=$!
$B/bench/bench_serve --port $PORT --requests 8 --concurrency 8 --max-tokens $ST --temperature $TEMP --prompt "And God said"
wait $LP 2>/dev/null; sleep 0.5; echo "-- the long prompt:"; cat "${TMPDIR:-/tmp}/serve-bench-long.out"
curl -s http://127.0.0.1:$PORT/metrics | grep -E "^muser_prompt_tokens_total|^muser_engine"
kill -TERM $SP; wait $SP
