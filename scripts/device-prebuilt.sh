#!/bin/bash
# device-prebuilt.sh — run binaries built HERE (Debian 12, nvcc 13, sm_90) on the GPU machine,
# skipping the ~2 min device build. Build and stage them first on the dev machine:
#   cmake --build build-cuda --target muser test_cuda test_fail_closed test_cuda_attn kbench_matvec kbench_mma \
#       kbench_attention
#   scripts/device-prebuilt.sh --stage          # copies them into .devbin/ (git-ignored)
# then on the device, from the repository root, carrying .deps and .devbin:
#   bash scripts/device-prebuilt.sh [steps...]  # steps: tests rows parity kbench bench (default: all),
#                                               # and glimmer, rows, parallel, verify, spec, serve-spec, prefill, engine, serve, topp, host, handoff, dflash, mmh, mmi, pair, pfgemm, ncu-pfgemm, pfshort, prefill-llama, tests-quick, tp, pfcpu-start … pfcpu-end,
#                                               # skip, ab, abm,
#                                               # ncu, timeline (below)
# The device tool copies at most 64 MiB (working tree + carry); the staged binaries are ~45 MB, so
# `--pack` also writes them xz-compressed (~6 MB) into .devbin-pack/ (git-ignored): carry
# .devbin-pack and .deps and run `tar xJf .devbin-pack/bin.tar.xz && bash scripts/device-prebuilt.sh …`.
# The .deps Debian packages (scripts/device-deps-fetch.sh) are unpacked into /opt/muser-deps and
# put on LD_LIBRARY_PATH: the device has no PCRE2 / libedit. Logs go to $OUT.
set -u
if [ "${1:-}" = "--stage" ] || [ "${1:-}" = "--pack" ]; then
    B=${MUSER_BUILD_DIR:-build-cuda}
    mkdir -p .devbin
    cp "$B/muser" "$B/tests/test_cuda" "$B/tests/test_fail_closed" "$B/tests/test_cuda_attn" "$B/tests/test_rows" "$B/tests/test_engine" \
        "$B/tests/test_spec" "$B/tests/test_handoff" "$B/tests/test_dflash" "$B/tests/test_tp" "$B/bench/bench_serve" "$B/bench/bench_sampler" "$B/bench/kbench_matvec" \
        "$B/bench/kbench_mma" "$B/bench/kbench_mma6" "$B/bench/kbench_mmh" "$B/bench/kbench_mmi" "$B/bench/kbench_mmi6" "$B/bench/kbench_pfgemm" "$B/bench/kbench_stream" "$B/bench/kbench_attention" \
        "$B/bench/kbench_persist" "$B/bench/kbench_allreduce" "$B/bench/kbench_pair" .devbin/
    # the timeline build (cmake -B build-cuda-tl -DMUSER_CUDA_TIMELINE=ON), when there is one
    TL=${MUSER_TL_BUILD_DIR:-build-cuda-tl}
    if [ -x "$TL/muser" ]; then cp "$TL/muser" .devbin/muser-tl; else rm -f .devbin/muser-tl; fi
    if [ "$1" = "--pack" ]; then
        mkdir -p .devbin-pack
        # one xz dictionary larger than a binary: the binaries share most of their device code
        XZ_OPT="--lzma2=preset=6,dict=128MiB" tar cJf .devbin-pack/bin.tar.xz .devbin
    fi
    ls -la .devbin .devbin-pack 2>/dev/null
    exit 0
fi
OUT=${OUT:-/tmp/device-prebuilt-out}
mkdir -p "$OUT"
P=/opt/muser-deps
if [ ! -d "$P/usr" ]; then
    mkdir -p "$P"
    for f in .deps/*.deb; do dpkg -x "$f" "$P"; done
fi
export LD_LIBRARY_PATH="$P/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export MUSER_SANITIZED=0
D=${DEVBIN:-.devbin}   # DEVBIN=dir runs another staged set (e.g. a copy with another build as muser)
T0=$(date +%s)
S="$OUT/summary.txt"
note() { echo "[$(($(date +%s) - T0))s] $*" | tee -a "$S"; }
steps=${*:-tests rows parity kbench bench}
W=$(mktemp -d)
for step in $steps; do
    case $step in
    tests)
        (cd "$W" && MUSER_BUILD_DIR="$W" timeout -k 5 90 "$OLDPWD/$D/test_cuda") >"$OUT/test_cuda.log" 2>&1
        note "test_cuda rc=$? :: $(tail -1 "$OUT/test_cuda.log")"
        (cd "$W" && MUSER_BUILD_DIR="$W" timeout -k 5 90 "$OLDPWD/$D/test_fail_closed") >"$OUT/test_fail_closed.log" 2>&1
        note "test_fail_closed rc=$? :: $(tail -1 "$OUT/test_fail_closed.log")"
        (cd "$W" && MUSER_BUILD_DIR="$W" timeout -k 5 90 "$OLDPWD/$D/test_cuda_attn") >"$OUT/test_cuda_attn.log" 2>&1
        note "test_cuda_attn rc=$? :: $(tail -1 "$OUT/test_cuda_attn.log")"
        if [ -x "$D/test_rows" ]; then
            (cd "$W" && MUSER_SOURCE_DIR="$OLDPWD" timeout -k 5 200 "$OLDPWD/$D/test_rows") >"$OUT/test_rows.log" 2>&1
            note "test_rows rc=$? :: $(grep -E 'invariance|oracle|parts|test_rows' "$OUT/test_rows.log" | tr '\n' ';')"
        fi
        ;;
    prefill)
        # the prefill route on the synthesized Glimmer: pp512 at depths 0 and 4096, one profiled call
        # (MUSER_CUDA_PROFILE=1: time per op family), and PF_LONG=N tokens from depth 0 when set
        [ -f /tmp/g.gguf ] || timeout -k 5 90 "$D/muser" synth --preset glimmer -o /tmp/g.gguf >/dev/null 2>&1
        timeout -k 5 150 "$D/muser" bench --backend cuda -m /tmp/g.gguf --gen 16 --ctx 0,4096 --prompt 512 \
            >"$OUT/prefill.log" 2>&1
        note "prefill rc=$?"
        grep '^ctx ' "$OUT/prefill.log" | sed 's/^/    /' >>"$S"
        MUSER_CUDA_PROFILE=1 timeout -k 5 100 "$D/muser" bench --backend cuda -m /tmp/g.gguf --gen 2 --ctx 0 --prompt 512 \
            >"$OUT/prefill_profile.log" 2>&1
        grep -A11 'prefill profile' "$OUT/prefill_profile.log" | sed 's/^/    /' >>"$S"
        if [ -n "${PF_LONG:-}" ]; then
            timeout -k 5 400 "$D/muser" bench --backend cuda -m /tmp/g.gguf --gen 2 --ctx 0 --prompt "$PF_LONG" \
                >"$OUT/prefill_long.log" 2>&1
            note "prefill $PF_LONG rc=$?"
            grep -E 'prefill|reserve|workspace|KV' "$OUT/prefill_long.log" | sed 's/^/    /' >>"$S"
        fi
        ;;
    engine)
        # the engine and speculation on the GPU: the same bytes as the session driven directly
        for t in test_engine test_spec; do
            (cd "$W" && MUSER_SOURCE_DIR="$OLDPWD" timeout -k 5 240 "$OLDPWD/$D/$t") >"$OUT/$t.log" 2>&1
            note "$t rc=$? :: $(grep -E '^CUDA|^SKIP|outputs|copy:|greedy|test_' "$OUT/$t.log" | tr '\n' ';')"
        done
        ;;
    serve)
        # muser serve --backend cuda on the synthesized Glimmer under bench_serve (1, 4, 16 streams),
        # and `muser run` decode beside `muser bench` (the host's share of a token)
        [ -f /tmp/g.gguf ] || timeout -k 5 90 "$D/muser" synth --preset glimmer -o /tmp/g.gguf >/dev/null 2>&1
        timeout -k 5 120 "$D/muser" run -m /tmp/g.gguf --backend cuda -n 128 --temp 0 -p "Once upon a time" \
            >"$OUT/run.log" 2>"$OUT/run.err"
        note "run rc=$? :: $(grep -iE 'tok/s' "$OUT/run.err" | tail -2 | tr '\n' ' ')"
        mkdir -p "$W/sb"
        ln -sf "$PWD/$D/muser" "$W/sb/muser"
        mkdir -p "$W/sb/bench" && ln -sf "$PWD/$D/bench_serve" "$W/sb/bench/bench_serve"
        TMPDIR=$W SERVE_ARGS="--backend cuda" timeout -k 5 300 sh scripts/serve-bench.sh /tmp/g.gguf "$W/sb" \
            >"$OUT/serve.log" 2>&1
        note "serve rc=$?"
        grep -E '^==|aggregate|tok/s|p50|p99' "$OUT/serve.log" | sed 's/^/    /' >>"$S"
        ;;
    topp)
        # sampled serving with top-p (OpenAI's top_p, no top-k): muser serve --backend cuda, a staged
        # muser-base (BASE_BIN) against muser, interleaved, TOPP_ROUNDS rounds (2); bench_serve at 1, 4
        # and 16 streams, T 0.8, at each top-p of TOP_P (a list; 0.9), 96 tokens, 3 requests a stream
        [ -f /tmp/g.gguf ] || timeout -k 5 90 "$D/muser" synth --preset glimmer -o /tmp/g.gguf >/dev/null 2>&1
        for round in $(seq 1 "${TOPP_ROUNDS:-2}"); do
            for bin in ${BASE_BIN:-muser-base} muser; do
                "$D/$bin" serve -m /tmp/g.gguf --backend cuda --port 0 --slots 16 --ctx 2048 --prefix-cache 0 \
                    >"$OUT/topp_serve_$bin.log" 2>&1 &
                sp=$!
                port=
                for _ in $(seq 1 600); do
                    port=$(sed -n 's|.*listening on http://127.0.0.1:\([0-9]*\).*|\1|p' "$OUT/topp_serve_$bin.log")
                    [ -n "$port" ] && curl -s "http://127.0.0.1:$port/health" | grep -q ok && break
                    sleep 0.2
                done
                for tp in ${TOP_P:-0.9}; do
                    for c in 1 4 16; do
                        timeout -k 5 120 "$D/bench_serve" --port "$port" --requests $((3 * c)) --concurrency $c --max-tokens 96 \
                            --temperature 0.8 --top-p "$tp" --prompt "And God said, Let there be light" \
                            >"$OUT/topp.log" 2>&1
                        note "topp r$round $bin top-p $tp c$c rc=$? :: $(grep -E 'aggregate|inter-token' "$OUT/topp.log" | tr '\n' ' ')"
                    done
                done
                kill -TERM $sp
                wait $sp
            done
        done
        ;;
    host)
        # the host side of a token: `muser run` decode (greedy, then the default sampling: top-k 40,
        # top-p 0.95, min-p 0.05, T 0.8) against `muser bench`'s device lane, interleaved, two
        # rounds; the engine's packed figures beside the route's; the sampler's time per token
        [ -f /tmp/g.gguf ] || timeout -k 5 90 "$D/muser" synth --preset glimmer -o /tmp/g.gguf >/dev/null 2>&1
        for round in 1 2; do
            timeout -k 5 120 "$D/muser" bench --backend cuda -m /tmp/g.gguf --gen 128 --ctx 0 >"$OUT/host_bench.log" 2>&1
            note "host r$round bench rc=$? :: $(grep '^ctx ' "$OUT/host_bench.log" | head -1)"
            for mode in greedy sampled; do
                a="--temp 0"
                [ $mode = sampled ] && a="--seed 7"
                # shellcheck disable=SC2086
                timeout -k 5 120 "$D/muser" run -m /tmp/g.gguf --backend cuda -n 256 $a -p "Once upon a time" \
                    >"$OUT/host_run.out" 2>"$OUT/host_run.err"
                note "host r$round run $mode rc=$? :: $(grep -oE 'generated [0-9]+ tokens in [0-9.]+ s \([0-9.]+ tok/s\)' "$OUT/host_run.err")"
            done
        done
        timeout -k 5 200 "$D/muser" bench --backend cuda -m /tmp/g.gguf --parallel ${PAR:-1,4,16} --gen 32 --reps 2 \
            >"$OUT/host_parallel.log" 2>&1
        note "host parallel rc=$?"
        grep -E '^parallel|^engine' "$OUT/host_parallel.log" | sed 's/^/    /' >>"$S"
        timeout -k 5 60 "$D/bench_sampler" >"$OUT/sampler.log" 2>&1
        note "sampler rc=$?"
        sed 's/^/    /' "$OUT/sampler.log" >>"$S"
        ;;
    dflash)
        # DFlash with the target on the GPU (its tap): test_dflash's CUDA half (the drafter's CUDA
        # forward, speculation with it on the CPU and on the GPU), then every drafter beside plain
        # decoding on the default model, the target and the drafters on the GPU (scripts/spec-bench.sh)
        (cd "$W" && MUSER_SOURCE_DIR="$OLDPWD" timeout -k 5 300 "$OLDPWD/$D/test_dflash") >"$OUT/test_dflash.log" 2>&1
        note "test_dflash rc=$? :: $(grep -E 'cuda|SKIP|test_dflash' "$OUT/test_dflash.log" | tr '\n' ';')"
        mkdir -p "$W/sb" && ln -sf "$PWD/$D/muser" "$W/sb/muser"
        TMPDIR=$W N=${SB_N:-400} timeout -k 5 300 sh scripts/spec-bench.sh "$W/sb" -- --backend cuda >"$OUT/spec_bench.log" 2>&1
        note "spec-bench (cuda) rc=$?"
        grep '^|' "$OUT/spec_bench.log" | sed 's/^/    /' >>"$S"
        ;;
    handoff)
        # remote prefill on the GPU: test_handoff (its CUDA cases), then a producer process
        # (prefill-serve --backend cuda) and consumer processes (run --remote-prefill) against a
        # local prefill, at HO_N tokens (default 4096 32768): time to first token, bytes, the text.
        # HO_MODES="remote" skips the local runs: the producer's log line of each session carries its
        # prefill time, which is what a local prefill on this GPU takes (HO_N=130815 HO_MODES=remote:
        # the longest row in one call; HO_MODES=local the other half); HO_CTX sizes the producer
        # (default 33000); HO_TIMEOUT bounds each consumer run (default 300 s; 420 for 130,815)
        (cd "$W" && MUSER_SOURCE_DIR="$OLDPWD" timeout -k 5 300 "$OLDPWD/$D/test_handoff") >"$OUT/test_handoff.log" 2>&1
        note "test_handoff rc=$? :: $(grep -E 'SKIP|CUDA|cuda|test_handoff|handoff:' "$OUT/test_handoff.log" | tail -4 | tr '\n' ';')"
        [ -f /tmp/g.gguf ] || timeout -k 5 90 "$D/muser" synth --preset glimmer -o /tmp/g.gguf >/dev/null 2>&1
        sh scripts/make-test-certs.sh "$W/certs" || note "handoff: make-test-certs.sh failed"
        "$D/muser" prefill-serve -m /tmp/g.gguf --backend cuda --port 7070 --ctx "${HO_CTX:-33000}" --tls-dir "$W/certs/producer" \
            --hmac-key-file "$W/certs/hmac.key" >"$OUT/producer.log" 2>&1 &
        ppid=$!
        for _ in $(seq 1 240); do grep -q listening "$OUT/producer.log" && break; sleep 0.5; done
        note "handoff producer :: $(head -c 300 "$OUT/producer.log" | tr '\n' ' ')"
        for n in ${HO_N:-4096 32768}; do
            python3 -c "import random; r = random.Random($n); w = 'the of and to in is was for on that with as by at from it his an be this are which or had'.split(); print(' '.join(r.choice(w) for _ in range($n - 1)))" \
                >"$W/prompt_$n.txt"
            for mode in ${HO_MODES:-local remote}; do
                a=""
                [ $mode = remote ] && a="--remote-prefill 127.0.0.1:7070 --tls-dir $W/certs/consumer --hmac-key-file $W/certs/hmac.key --ledger $W/ledger"
                # shellcheck disable=SC2086
                timeout -k 5 "${HO_TIMEOUT:-300}" "$D/muser" run -m /tmp/g.gguf --backend cuda -f "$W/prompt_$n.txt" -n 16 --temp 0 $a \
                    >"$OUT/ho_${mode}_$n.out" 2>"$OUT/ho_${mode}_$n.err"
                note "handoff $n $mode rc=$? :: $(grep -E 'prompt [0-9]+ tokens|remote prefill from' "$OUT/ho_${mode}_$n.err" | sed 's/muser run: //' | tr '\n' ' ')"
            done
            if [ -f "$OUT/ho_local_$n.out" ] && [ -f "$OUT/ho_remote_$n.out" ]; then
                same=same; cmp -s "$OUT/ho_local_$n.out" "$OUT/ho_remote_$n.out" || same=DIFFERENT
                note "handoff $n: local and remote texts $same"
            fi
        done
        kill "$ppid" 2>/dev/null; wait "$ppid" 2>/dev/null
        grep -E 'session .* tokens from' "$OUT/producer.log" | sed 's/^/    producer: /' >>"$S"
        note "handoff producer :: $(tail -1 "$OUT/producer.log")"
        ;;
    rows)
        # row invariance on the synthesized Glimmer (the tensor-core matvecs and attention): the logits
        # of 18 sequences of different lengths through decode, packed (passes of 16 rows and more)
        # and verify, byte for byte (SHA-256 per sequence)
        [ -f /tmp/g.gguf ] || timeout -k 5 90 "$D/muser" synth --preset glimmer -o /tmp/g.gguf >/dev/null 2>&1
        TL=""
        for k in $(seq 0 17); do
            n=$((2 + (k * 7) % 11)); TL="$TL --tokens $(seq -s, $((100 + 37 * k)) $((100 + 37 * k + n - 1)))"
        done
        for bin in ${ROWS_BINS:-muser}; do # ROWS_BINS="muser muser-full": each staged build in turn
            for r in decode packed verify; do
                timeout -k 5 150 "$D/$bin" eval -m /tmp/g.gguf --backend cuda $TL --route $r --dump-logits "$W/rows_$r" \
                    >"$OUT/rows_${bin}_$r.log" 2>&1
                note "rows [$bin] eval $r rc=$?"
            done
            bad=0
            for k in $(seq 0 17); do
                a=$(sha256sum <"$W/rows_decode.$k" | cut -c1-16)
                for r in packed verify; do
                    b=$(sha256sum <"$W/rows_$r.$k" 2>/dev/null | cut -c1-16)
                    [ "$a" = "$b" ] || { bad=$((bad + 1)); note "rows [$bin]: sequence $k $r $b != decode $a"; }
                done
            done
            note "rows [$bin]: $bad mismatches over 18 sequences x (packed, verify)"
            rm -f "$W"/rows_*
        done
        ;;
    parity)
        "$D/muser" synth --preset small -o "$W/small.gguf" >/dev/null 2>&1
        for bin in ${ROWS_BINS:-muser}; do
            timeout -k 5 150 "$D/$bin" parity -m "$W/small.gguf" --backend cuda --tokens 24 --route decode \
                >"$OUT/parity_small_$bin.log" 2>&1
            note "parity small cuda [$bin] rc=$? :: $(grep -iE 'max' "$OUT/parity_small_$bin.log" | tail -2 | tr '\n' ' ')"
        done
        ;;
    glimmer)
        # synthesized Glimmer, 8 positions: the CUDA route against the CPU engine (SPEC §4), and the
        # logits of GLIMMER_CMP="NAME[:ENV=V ...] ..." (staged builds with settings) byte-compared
        # with the default's, e.g. GLIMMER_CMP="muser-base muser:MUSER_CUDA_SKIP=head"
        [ -f /tmp/g.gguf ] || timeout -k 5 90 "$D/muser" synth --preset glimmer -o /tmp/g.gguf >/dev/null 2>&1
        toks=9001,17,123456,4242,77777,202000,31337,5
        timeout -k 5 120 "$D/muser" eval -m /tmp/g.gguf --backend cuda --tokens $toks --dump-logits "$W/gc.bin" \
            >"$OUT/glimmer_cuda.log" 2>&1
        note "glimmer cuda eval rc=$?"
        for spec in ${GLIMMER_CMP:-}; do
            bin=${spec%%:*}
            envs=
            [ "$bin" != "$spec" ] && envs=${spec#*:}
            # shellcheck disable=SC2086
            env ${envs//,/ } timeout -k 5 120 "$D/$bin" eval -m /tmp/g.gguf --backend cuda --tokens $toks \
                --dump-logits "$W/gx.bin" >>"$OUT/glimmer_cuda.log" 2>&1
            if cmp -s "$W/gc.bin" "$W/gx.bin"; then r=identical; else r=DIFFERENT; fi
            note "glimmer logits [$spec] vs default: $r; $(python3 scripts/compare-logits.py "$W/gx.bin" "$W/gc.bin" 202048 2>&1 | tail -1)"
        done
        timeout -k 5 300 "$D/muser" eval -m /tmp/g.gguf --backend cpu --tokens $toks --dump-logits "$W/gp.bin" \
            >"$OUT/glimmer_cpu.log" 2>&1
        note "glimmer cpu eval rc=$?"
        python3 scripts/compare-logits.py "$W/gp.bin" "$W/gc.bin" 202048 >"$OUT/glimmer_cmp.log" 2>&1
        note "glimmer cuda vs cpu :: $(tail -3 "$OUT/glimmer_cmp.log" | tr '\n' ' ')"
        ;;
    parallel)
        # aggregate decode through the small-batch route (muser_step) at 1 / 4 / 16 sequences; with
        # PAR_BINS="muser-base muser" (staged builds) each in turn, PAR_ROUNDS rounds (1)
        [ -f /tmp/g.gguf ] || timeout -k 5 90 "$D/muser" synth --preset glimmer -o /tmp/g.gguf >/dev/null 2>&1
        for round in $(seq 1 "${PAR_ROUNDS:-1}"); do
            for bin in ${PAR_BINS:-muser}; do
                timeout -k 5 200 "$D/$bin" bench --backend cuda -m /tmp/g.gguf --parallel ${PAR:-1,4,16} --gen 32 --reps 2 \
                    >"$OUT/parallel_${bin}_$round.log" 2>&1
                note "parallel [$bin] rc=$?"
                grep '^parallel' "$OUT/parallel_${bin}_$round.log" | sed 's/^/    /' >>"$S"
            done
        done
        # PAR_PROFILE=1: each build's unfused time per op family at the last count of PAR
        counts=${PAR:-1,4,16}
        for bin in ${PAR_PROFILE:+${PAR_BINS:-muser}}; do
            MUSER_CUDA_PROFILE=1 timeout -k 5 100 "$D/$bin" bench --backend cuda -m /tmp/g.gguf --parallel "${counts##*,}" \
                --gen 8 --reps 1 >"$OUT/parallel_profile_$bin.log" 2>&1
            note "parallel profile [$bin] rc=$?"
        done
        ;;
    tp)
        # tensor parallelism on CUDA ranks: test_tp cuda (a GPU each through NCCL where there are two,
        # else both ranks on one GPU reducing through the host), again with the synthesized Glimmer's
        # tensor-core shards (two ranks against one); with two GPUs `bench --tensor-parallel 2` (TP_BIN)
        (cd "$W" && MUSER_BUILD_DIR="$W" timeout -k 5 120 "$OLDPWD/$D/test_tp" cuda) >"$OUT/test_tp.log" 2>&1
        note "test_tp cuda rc=$? :: $(grep -E '^CUDA ranks|test_tp' "$OUT/test_tp.log" | tr '\n' ';')"
        [ -f /tmp/g.gguf ] || timeout -k 5 90 "$D/muser" synth --preset glimmer -o /tmp/g.gguf >/dev/null 2>&1
        (cd "$W" && MUSER_BUILD_DIR="$W" MUSER_TP_MODEL=/tmp/g.gguf timeout -k 5 300 "$OLDPWD/$D/test_tp" cuda) \
            >"$OUT/test_tp_glimmer.log" 2>&1
        note "test_tp cuda glimmer rc=$? :: $(grep -E 'g.gguf|test_tp' "$OUT/test_tp_glimmer.log" | tr '\n' ';')"
        if [ "$(nvidia-smi -L 2>/dev/null | wc -l)" -ge 2 ]; then
            # the all-reduce a token pays 104 times, per NCCL protocol (bench/kernels/allreduce.cu)
            for proto in default LL LL128 Simple; do
                if [ $proto = default ]; then env -u NCCL_PROTO timeout -k 5 120 "$D/kbench_allreduce"
                else NCCL_PROTO=$proto timeout -k 5 120 "$D/kbench_allreduce"; fi >"$OUT/allreduce_$proto.log" 2>&1
                note "allreduce NCCL_PROTO=$proto rc=$?"
                grep -E '^[0-9]' "$OUT/allreduce_$proto.log" | sed 's/^/    /' >>"$S"
            done
            timeout -k 5 300 "$D/${TP_BIN:-muser}" bench --backend cuda -m /tmp/g.gguf --tensor-parallel 2 --prompt 512 \
                --gen 64 --reps 2 >"$OUT/tp_bench.log" 2>&1
            note "tp bench rc=$?"
            grep -E '^tp|^model' "$OUT/tp_bench.log" | sed 's/^/    /' >>"$S"
        fi
        ;;
    verify)
        # what a speculative verify pass of B rows costs against a decode step (one sequence)
        [ -f /tmp/g.gguf ] || timeout -k 5 90 "$D/muser" synth --preset glimmer -o /tmp/g.gguf >/dev/null 2>&1
        timeout -k 5 200 "$D/muser" bench --backend cuda -m /tmp/g.gguf --verify ${VER:-2,4,8,16} --ctx ${VER_CTX:-0,4096} \
            --gen 16 --reps 2 >"$OUT/verify.log" 2>&1
        note "verify rc=$?"
        grep '^verify' "$OUT/verify.log" | sed 's/^/    /' >>"$S"
        ;;
    serve-spec)
        # speculation through the server on the GPU: tests/cli_serve_spec.sh with every server on
        # cuda (prompt lookup and the shared draft engine against the plain server's bytes), and
        # `muser run --draft` on the default model against plain decoding (the same text)
        MUSER_BIN="$PWD/$D/muser" MUSER_SOURCE_DIR="$PWD" SERVE_EXTRA="--backend cuda" TMPDIR=$W \
            timeout -k 5 180 bash tests/cli_serve_spec.sh >"$OUT/serve_spec.log" 2>&1
        note "cli_serve_spec (cuda) rc=$? :: $(grep -vE '^muser serve' "$OUT/serve_spec.log" | tail -9 | tr '\n' ';')"
        for a in "" "--draft models/draft.gguf --draft-max 4" "--draft models/draft.gguf --draft-max 4 --draft-fixed"; do
            # shellcheck disable=SC2086
            timeout -k 5 60 "$D/muser" run -m models/default.gguf --backend cuda -n 400 --temp 0 \
                -p "And God said, Let there be light" $a >"$OUT/dm.out" 2>"$OUT/dm.err"
            rc=$?
            [ -z "$a" ] && cp "$OUT/dm.out" "$OUT/dm_plain.out"
            same=same; cmp -s "$OUT/dm_plain.out" "$OUT/dm.out" || same=DIFFERENT
            note "run --draft [${a:-plain}] rc=$rc ($same text) :: $(grep -oE 'generated [0-9]+ tokens in [0-9.]+ s \([0-9.]+ tok/s\)|[0-9.]+ tokens per pass' "$OUT/dm.err" | tr '\n' ' ')"
        done
        ;;
    spec)
        # speculative decoding on the GPU (synthesized Glimmer): plain greedy decoding, then prompt
        # lookup at several block sizes on the same prompt; the texts must be the same
        [ -f /tmp/g.gguf ] || timeout -k 5 90 "$D/muser" synth --preset glimmer -o /tmp/g.gguf >/dev/null 2>&1
        P="${SPEC_PROMPT:-one two three four five six seven eight nine ten one two three four five six seven eight nine ten one two three}"
        timeout -k 5 120 "$D/muser" run -m /tmp/g.gguf --backend cuda -n ${SPEC_N:-160} --temp 0 -p "$P" \
            >"$OUT/spec_plain.out" 2>"$OUT/spec_plain.err"
        note "spec plain rc=$? :: $(grep -iE 'tok/s' "$OUT/spec_plain.err" | tail -1)"
        for k in ${SPEC_K:-3 7 15}; do
            timeout -k 5 120 "$D/muser" run -m /tmp/g.gguf --backend cuda -n ${SPEC_N:-160} --temp 0 -p "$P" \
                --draft-ngram 3 --draft-max "$k" >"$OUT/spec_ng$k.out" 2>"$OUT/spec_ng$k.err"
            rc=$?
            same=same; cmp -s "$OUT/spec_plain.out" "$OUT/spec_ng$k.out" || same=DIFFERENT
            note "spec n-gram 3 K $k rc=$rc ($same text) :: $(grep -iE 'tok/s|per pass|accepted' "$OUT/spec_ng$k.err" | tr '\n' ' ')"
        done
        # the trained default model on the GPU (its greedy text repeats, so prompt lookup finds
        # drafts): 400 tokens after three prompts, plain, adaptive and fixed K 15, two rounds
        for round in 1 2; do
            for p in "And God said, Let there be light" "And the LORD spake unto Moses, saying," \
                "And Jesus answered and said unto them,"; do
                for mode in plain adaptive fixed; do
                    a=""
                    [ "$mode" != plain ] && a="--draft-ngram 3 --draft-max 15"
                    [ "$mode" = fixed ] && a="$a --draft-fixed"
                    # shellcheck disable=SC2086
                    timeout -k 5 60 "$D/muser" run -m models/default.gguf --backend cuda -n 400 --temp 0 -p "$p" $a \
                        >"$OUT/specd.out" 2>"$OUT/specd.err"
                    note "spec default r$round [${p:0:12}] $mode :: $(grep -oE 'generated [0-9]+ tokens in [0-9.]+ s \([0-9.]+ tok/s\)|[0-9.]+ tokens per pass' "$OUT/specd.err" | tr '\n' ' ')"
                done
            done
        done
        ;;
    same)
        # logits of the staged build $SAME_BASE (default muser-base) against muser's, byte for byte
        # (SHA-256 of `muser eval --dump-logits`): tiny (release mix, all-Q4_K, all-Q6_K, llama),
        # small, the embedded default model and Glimmer (synthesized)
        B0=${SAME_BASE:-muser-base}
        [ -f /tmp/g.gguf ] || timeout -k 5 90 "$D/muser" synth --preset glimmer -o /tmp/g.gguf >/dev/null 2>&1
        "$D/muser" synth --preset tiny -o "$W/tiny.gguf" >/dev/null 2>&1
        "$D/muser" synth --preset tiny --type q4_k -o "$W/tiny_q4k.gguf" >/dev/null 2>&1
        "$D/muser" synth --preset tiny --type q6_k -o "$W/tiny_q6k.gguf" >/dev/null 2>&1
        "$D/muser" synth --preset tiny --arch llama -o "$W/tiny_llama.gguf" >/dev/null 2>&1
        [ -f "$W/small.gguf" ] || "$D/muser" synth --preset small -o "$W/small.gguf" >/dev/null 2>&1
        t40=$(seq -s, 1 17 680)
        for spec in tiny:$t40 tiny_q4k:$t40 tiny_q6k:$t40 tiny_llama:$t40 small:$(seq -s, 5 997 24000) \
            default:$(seq -s, 3 61 2400) glimmer:9001,17,123456,4242,77777,202000,31337,5; do
            name=${spec%%:*}
            toks=${spec#*:}
            f="$W/$name.gguf"
            [ "$name" = default ] && f=models/default.gguf
            [ "$name" = glimmer ] && f=/tmp/g.gguf
            for b in "$B0" muser; do
                timeout -k 5 150 "$D/$b" eval -m "$f" --backend cuda --tokens "$toks" --dump-logits "$W/l_$b.bin" \
                    >>"$OUT/same.log" 2>&1 || echo "eval $b $name failed" >>"$OUT/same.log"
            done
            h0=$(sha256sum <"$W/l_$B0.bin" | cut -c1-16)
            h1=$(sha256sum <"$W/l_muser.bin" | cut -c1-16)
            r=DIFFERENT
            [ "$h0" = "$h1" ] && r=identical
            note "same $name: $B0 $h0 | muser $h1 | $r"
        done
        ;;
    kbench)
        MUSER_KBENCH_KQ=1 MUSER_KBENCH_FAST=1 timeout -k 5 120 "$D/kbench_matvec" 9 >"$OUT/kbench.log" 2>&1
        note "kbench rc=$? :: $(grep 'kbench_matvec:' "$OUT/kbench.log")"
        timeout -k 5 100 "$D/kbench_mma" 9 >"$OUT/kbench_mma.log" 2>&1
        note "kbench_mma rc=$? :: $(grep 'kbench_mma:' "$OUT/kbench_mma.log")"
        timeout -k 5 100 "$D/kbench_mma6" 9 >"$OUT/kbench_mma6.log" 2>&1
        note "kbench_mma6 rc=$?"
        ;;
    mmh)
        # the #19 redesign's Q4_K kernel (bench/kernels/mmh.cu) beside the engine's, 1..16 rows
        timeout -k 5 100 "$D/kbench_mmh" 9 >"$OUT/kbench_mmh.log" 2>&1
        note "kbench_mmh rc=$? :: $(grep 'kbench_mmh:' "$OUT/kbench_mmh.log")"
        grep -E '^  (engine|[124]x4|vs f64|row inv)|^[0-9]+ x ' "$OUT/kbench_mmh.log" | sed 's/^/    /' >>"$S"
        ;;
    pfgemm)
        # the prefill GEMM per Glimmer shape at 512 rows (bench/kernels/pfgemm.cu): the warpgroup GEMM
        # beside the mma.sync one and the general path, its error and its bytes across variants
        timeout -k 5 120 "$D/kbench_pfgemm" 512 >"$OUT/kbench_pfgemm.log" 2>&1
        note "kbench_pfgemm rc=$?"
        sed 's/^/    /' "$OUT/kbench_pfgemm.log" >>"$S"
        ;;
    prefill-llama)
        # the prefill route on the llama-arch file of Glimmer's dimensions (llama.cpp's identical bytes)
        [ -f /tmp/gl.gguf ] || timeout -k 5 150 "$D/muser" synth --preset glimmer --arch llama -o /tmp/gl.gguf >/dev/null 2>&1
        timeout -k 5 300 "$D/muser" bench --backend cuda -m /tmp/gl.gguf --gen 16 --ctx 0 --prompt 512,32768,130815 \
            >"$OUT/prefill_llama.log" 2>&1
        note "prefill-llama rc=$?"
        grep -E '^ctx ' "$OUT/prefill_llama.log" | sed 's/^/    /' >>"$S"
        ;;
    test-rows)
        # test_rows alone: every row's bytes alone and packed (tiny models), and against the oracle
        (cd "$W" && MUSER_SOURCE_DIR="$OLDPWD" timeout -k 5 200 "$OLDPWD/$D/test_rows") >"$OUT/test_rows.log" 2>&1
        note "test_rows rc=$? :: $(grep -E 'invariance|oracle|parts|test_rows' "$OUT/test_rows.log" | tr '\n' ';')"
        ;;
    tests-quick)
        # test_cuda and test_fail_closed only (the prefill route's GEMM and fail-closed checks)
        (cd "$W" && MUSER_BUILD_DIR="$W" timeout -k 5 90 "$OLDPWD/$D/test_cuda") >"$OUT/test_cuda.log" 2>&1
        note "test_cuda rc=$? :: $(tail -1 "$OUT/test_cuda.log")"
        (cd "$W" && MUSER_BUILD_DIR="$W" timeout -k 5 90 "$OLDPWD/$D/test_fail_closed") >"$OUT/test_fail_closed.log" 2>&1
        note "test_fail_closed rc=$? :: $(tail -1 "$OUT/test_fail_closed.log")"
        ;;
    pfshort)
        # short prompts: the prefill call's fixed cost (time to the first token at 8 .. 512 rows)
        [ -f /tmp/g.gguf ] || timeout -k 5 90 "$D/muser" synth --preset glimmer -o /tmp/g.gguf >/dev/null 2>&1
        timeout -k 5 150 "$D/muser" bench --backend cuda -m /tmp/g.gguf --prompt 8,32,128,512 --gen 4 --reps 2 \
            >"$OUT/pfshort.log" 2>&1
        note "pfshort rc=$?"
        grep '^ctx ' "$OUT/pfshort.log" | sed 's/^/    /' >>"$S"
        ;;
    pfcpu-start)
        # the prefill route against the CPU engine on the synthesized Glimmer (SPEC §4), part 1: the
        # CPU engine's logits of PF_CPU_N random tokens (default: as many as its measured prefill
        # rate does in PF_CPU_S seconds, 280 by default, at most 4096), in the background on cores 4..
        [ -f /tmp/g.gguf ] || timeout -k 5 90 "$D/muser" synth --preset glimmer -o /tmp/g.gguf >/dev/null 2>&1
        NC=$(nproc)
        taskset -c 4-$((NC - 1)) timeout -k 5 120 "$D/muser" bench -m /tmp/g.gguf --threads $((NC - 4)) --prompt 32 --gen 1 \
            >"$OUT/pfcpu_rate.log" 2>&1
        rate=$(grep -o 'prefill *32 tok: *[0-9.]*' "$OUT/pfcpu_rate.log" | awk '{print $NF}')
        N=${PF_CPU_N:-$(python3 -c "print(max(64, min(4096, int(float('${rate:-10}') * ${PF_CPU_S:-280}))))")}
        python3 -c "import random; random.seed(7); print(','.join(str(random.randrange(202048)) for _ in range($N)))" \
            >"$W/pf_tok.txt"
        note "pfcpu: CPU prefill ${rate:-?} tok/s on $((NC - 4)) cores; $N tokens"
        (taskset -c 4-$((NC - 1)) timeout -k 5 500 "$D/muser" eval -m /tmp/g.gguf --backend cpu -t $((NC - 4)) \
            --tokens "$(cat "$W/pf_tok.txt")" --dump-logits "$W/pf_cpu.bin" >"$OUT/pfcpu_cpu.log" 2>&1;
         echo "rc=$?" >>"$OUT/pfcpu_cpu.log") &
        PFCPU_PID=$!
        ;;
    pfcpu-end)
        # part 2: the CUDA prefill route's logits of the same tokens, compared every 256 positions
        timeout -k 5 120 taskset -c 0-3 "$D/muser" eval -m /tmp/g.gguf --backend cuda --tokens "$(cat "$W/pf_tok.txt")" \
            --dump-logits "$W/pf_gpu.bin" >"$OUT/pfcpu_gpu.log" 2>&1
        note "pfcpu: cuda eval rc=$?; waiting for the CPU engine"
        wait "${PFCPU_PID:-0}" 2>/dev/null
        note "pfcpu: cpu eval $(tail -1 "$OUT/pfcpu_cpu.log")"
        python3 scripts/compare-logits.py "$W/pf_gpu.bin" "$W/pf_cpu.bin" 202048 --every 256 >"$OUT/pfcpu_cmp.log" 2>&1
        note "pfcpu: $(tail -1 "$OUT/pfcpu_cmp.log")"
        rm -f "$W/pf_gpu.bin" "$W/pf_cpu.bin"
        ;;
    ncu-pfgemm)
        # ncu on Q4_K's exact warpgroup kernel (4 warpgroups) at the ffn_gate shape (kbench_pfgemm's 4th
        # Q4_K shape: 21 launches of that kernel a shape come before it): speed of light, memory, stalls
        timeout -k 5 200 ncu --clock-control none --kernel-name-base mangled -k 'regex:pf_wgx_kernelILi4E' \
            --launch-skip 64 -c 1 --section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats \
            --section ComputeWorkloadAnalysis --section Occupancy \
            --metrics 'regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio' \
            "$D/kbench_pfgemm" 512 >"$OUT/ncu_pfgemm.txt" 2>&1
        note "ncu-pfgemm rc=$?"
        grep -E 'Duration|Throughput|L2|DRAM|Issued|Eligible|Warp Cycles|Occupancy|Pipe|stalled' "$OUT/ncu_pfgemm.txt" |
            awk '!/stalled/ || $NF + 0 > 0.05' | head -70 | sed 's/^/    /' >>"$S"
        ;;
    mmi)
        # exact integers per block (bench/kernels/mmi.cu, mmi6.cu: Q4_K, Q6_K): its kernels per row count
        # beside the engine's; MMI_FILTER=text: only kbench_mmi's variants whose name holds it (and the
        # 16-row references), e.g. MMI_FILTER=staged
        kbs="mmi mmi6"
        [ -n "${MMI_FILTER:-}" ] && kbs=mmi
        for k in $kbs; do
            timeout -k 5 200 "$D/kbench_$k" ${MMI_REPS:-9} ${MMI_FILTER:+"$MMI_FILTER"} >"$OUT/kbench_$k.log" 2>&1
            note "kbench_$k rc=$? :: $(grep "kbench_$k:" "$OUT/kbench_$k.log")"
            grep -E '^  (engine|[0-9]+ n-tiles|x staged|x, units|vs f64|row inv)|^[0-9]+ x ' "$OUT/kbench_$k.log" |
                sed 's/^/    /' >>"$S"
        done
        ;;
    pair)
        # the route's gate·up pair alone (bench/kernels/pair.cu): µs per launch at 1 .. 16 rows and
        # every row's bytes in a 16-row launch against the row alone; run beside `mmi` to compare
        timeout -k 5 200 "$D/kbench_pair" ${PAIR_REPS:-9} >"$OUT/kbench_pair.log" 2>&1
        note "kbench_pair rc=$?"
        grep -E '^(device|streaming|gate|rows?|[0-9]+ )' "$OUT/kbench_pair.log" | sed 's/^/    /' >>"$S"
        ;;
    bench)
        [ -f /tmp/g.gguf ] || timeout -k 5 90 "$D/muser" synth --preset glimmer -o /tmp/g.gguf >/dev/null 2>&1
        # the decode table at the four depths
        timeout -k 5 120 "$D/muser" bench --backend cuda -m /tmp/g.gguf --gen 64 --ctx 0,4096,32768,130943 \
            >"$OUT/bench.log" 2>&1
        note "bench rc=$?"
        grep '^ctx ' "$OUT/bench.log" | sed 's/^/    /' >>"$S"
        MUSER_CUDA_PROFILE=1 timeout -k 5 60 "$D/muser" bench --backend cuda -m /tmp/g.gguf --gen 8 --ctx 0 \
            >"$OUT/profile.log" 2>&1
        note "phase profile rc=$?"
        ;;
    skip)
        # each op family's cost inside the graph, by difference: the route with that family left
        # out (MUSER_CUDA_SKIP, timing only), against the whole route before and after
        [ -f /tmp/g.gguf ] || timeout -k 5 90 "$D/muser" synth --preset glimmer -o /tmp/g.gguf >/dev/null 2>&1
        for f in none qkvg rope attn oproj tail gu prep down head none; do
            sk=$f
            [ "$f" = none ] && sk=
            MUSER_CUDA_SKIP=$sk timeout -k 5 60 "$D/muser" bench --backend cuda -m /tmp/g.gguf --gen 64 --ctx 0,32768 \
                >"$OUT/skip_$f.log" 2>&1
            note "skip $f rc=$? :: $(grep '^ctx ' "$OUT/skip_$f.log" | awk '{printf "%s ", $0}')"
        done
        ;;
    ab)
        # interleaved A/B of one setting: AB_VAR=NAME AB_VALS="a b ..." (2 rounds), AB_CTX (0,32768)
        [ -f /tmp/g.gguf ] || timeout -k 5 90 "$D/muser" synth --preset glimmer -o /tmp/g.gguf >/dev/null 2>&1
        for round in 1 2; do
            for v in ${AB_VALS:-}; do
                env "${AB_VAR:?AB_VAR=NAME}=$v" timeout -k 5 60 "$D/muser" bench --backend cuda -m /tmp/g.gguf \
                    --gen 64 --ctx "${AB_CTX:-0,32768}" >"$OUT/ab_${v}_$round.log" 2>&1
                note "ab ${AB_VAR}=$v rc=$? :: $(grep '^ctx ' "$OUT/ab_${v}_$round.log" | awk '{printf "%s %s | ", $2, $6}')"
            done
        done
        ;;
    abm)
        # interleaved A/B of whole settings: AB_CONFIGS="defaults;NAME=V NAME2=V2;NAME=W" (';'
        # between configurations, each a space-separated env list or "defaults"; BIN=muser-base
        # runs another staged build, e.g. one copied into .devbin by hand), AB_ROUNDS rounds (2),
        # AB_CTX; then each configuration's mean tok/s per context and its change against the first
        [ -f /tmp/g.gguf ] || timeout -k 5 90 "$D/muser" synth --preset glimmer -o /tmp/g.gguf >/dev/null 2>&1
        IFS=';' read -r -a cfgs <<<"${AB_CONFIGS:-}"
        for round in $(seq 1 "${AB_ROUNDS:-2}"); do
            i=0
            for cfg in "${cfgs[@]}"; do
                [ "$cfg" = defaults ] && cfg=
                # BIN=name in a configuration runs $D/name instead of $D/muser (a build staged beside it)
                bin=muser
                case " $cfg " in *" BIN="*) bin=$(sed 's/.*BIN=\([^ ]*\).*/\1/' <<<"$cfg") ;; esac
                # shellcheck disable=SC2086
                env $cfg timeout -k 5 60 "$D/$bin" bench --backend cuda -m /tmp/g.gguf --gen 64 \
                    --ctx "${AB_CTX:-0,32768}" >"$OUT/abm_${i}_$round.log" 2>&1
                note "abm [${cfg:-defaults}] rc=$? :: $(grep '^ctx ' "$OUT/abm_${i}_$round.log" | awk '{printf "%s %s | ", $2, $6}')"
                i=$((i + 1))
            done
        done
        for i in "${!cfgs[@]}"; do
            cat "$OUT"/abm_"${i}"_*.log | awk -v name="${cfgs[$i]}" '/^ctx / { s[$2] += $6; n[$2]++; if (!($2 in o)) { o[$2] = k++ } }
                END { line = ""; for (c in o) idx[o[c]] = c
                      for (j = 0; j < k; j++) { c = idx[j]; line = line sprintf("%s %.2f | ", c, s[c] / n[c]) }
                      print "abm mean [" name "] :: " line }'
        done | tee -a "$S" >"$OUT/abm_means.txt"
        awk -F' :: ' 'NR == 1 { n = split($2, a, " [|] "); for (j = 1; j <= n; j++) { split(a[j], f, " "); base[f[1]] = f[2] } }
            { n = split($2, a, " [|] "); line = ""
              for (j = 1; j <= n; j++) { split(a[j], f, " "); if (f[1] != "" && base[f[1]] > 0)
                  line = line sprintf("%s %+.2f%% | ", f[1], 100 * (f[2] / base[f[1]] - 1)) }
              print $1 " vs first :: " line }' "$OUT/abm_means.txt" | tee -a "$S" >/dev/null
        ;;
    timeline)
        # one token's per-CTA timeline inside the graph (a MUSER_CUDA_TIMELINE build staged as
        # muser-tl), summarised per kernel family by scripts/timeline.py
        [ -f /tmp/g.gguf ] || timeout -k 5 90 "$D/muser" synth --preset glimmer -o /tmp/g.gguf >/dev/null 2>&1
        MUSER_CUDA_TIMELINE="$OUT/tl" timeout -k 5 90 "$D/muser-tl" bench --backend cuda -m /tmp/g.gguf --gen 8 \
            --ctx ${TL_CTX:-0,32768} >"$OUT/timeline.log" 2>&1
        note "timeline rc=$? :: $(grep '^ctx ' "$OUT/timeline.log" | awk '{printf "%s ", $0}')"
        for f in "$OUT"/tl.ctx*; do
            python3 scripts/timeline.py "$f" >"$f.txt" 2>&1
            sed 's/^/    /' "$f.txt" >>"$S"
        done
        ;;
    ncu)
        # isolated duration and DRAM bytes of every kernel of one non-graph token (the phase profile's)
        [ -f /tmp/g.gguf ] || timeout -k 5 90 "$D/muser" synth --preset glimmer -o /tmp/g.gguf >/dev/null 2>&1
        MUSER_CUDA_PROFILE=1 timeout -k 5 200 ncu --clock-control none --csv --print-units base \
            --metrics gpu__time_duration.sum,dram__bytes_read.sum -k 'regex:^(?!.*repack)' \
            "$D/muser" bench --backend cuda -m /tmp/g.gguf --gen 1 --ctx 0 >"$OUT/ncu.csv" 2>"$OUT/ncu.err"
        note "ncu rc=$? :: $(wc -l <"$OUT/ncu.csv") lines; $(tail -2 "$OUT/ncu.err" | tr '\n' ' ')"
        ;;
    esac
done
rm -rf "$W"
cat "$S"
