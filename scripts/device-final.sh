#!/bin/bash
# device-final.sh — the ONE command of the second device session (~150 s of wall time in all):
# build the CUDA targets ON the device, then measure and check the matvec v6 (mantissa trick)
# against v5, most valuable result first, each step under its own timeout. Kept as the record of
# how bench/RESULTS.md's v5/v6 rows were made; v7 (mvq.cuh) is the default now, and the current
# recipe is scripts/device-prebuilt.sh (build here, run there: no device build time).
#   run on the GPU machine from the repository root, carrying .deps:   bash scripts/device-final.sh
# Logs go to $OUT (8 files at most); a summary is printed at the end (and saved as summary.txt).
#   1 build.log        scripts/device-build.sh build-cuda, only the targets needed
#   2 ctest_v6.log     ctest -R cuda with MUSER_CUDA_MATVEC=v6 (parity vs oracle, all formats)
#   3 kbench.log       kbench_matvec: v5 / v6 / v6b GB/s and rel. error per shape (MUSER_KBENCH_FAST)
#   4 bench.log        muser bench --backend cuda, synthesized Glimmer, v6 then v5 then v6b
#   5 ctest_v5.log     ctest -R cuda, default (v5)
#   6 parity.log       muser parity on synthesized small, --backend cuda, v6 then v5
#   7 sass.txt         SASS instruction counts of the Q4_K/Q6_K kernels, v5 vs v6 (if cuobjdump exists)
#   8 summary.txt
set -u
OUT=${OUT:-/tmp/device-final-out}
mkdir -p "$OUT"
B=build-cuda
T0=$(date +%s)
el() { echo "$(( $(date +%s) - T0 ))s"; }
S="$OUT/summary.txt"
: >"$S"
note() { echo "[$(el)] $*" | tee -a "$S"; }
export MUSER_SANITIZED=0

# 1. build: only what this run uses, all cores
MUSER_BUILD_TARGETS="muser test_cuda test_cuda_bench kbench_matvec" \
    timeout -k 5 110 sh scripts/device-build.sh "$B" >"$OUT/build.log" 2>&1
rc=$?
note "build rc=$rc ($(tail -1 "$OUT/build.log"))"
[ -x "$B/muser" ] || { cat "$OUT/build.log"; cat "$S"; exit 1; }

# synthesized Glimmer for step 4, written while steps 2-3 use the GPU (the synth is CPU work)
( timeout -k 5 60 "$B/muser" synth --preset glimmer -o /tmp/g.gguf >/tmp/synth_g.log 2>&1; echo "rc=$?" >>/tmp/synth_g.log ) &
SYNTH=$!

# 2. the library's v6 path: parity against the oracle for every format
( cd "$B" && MUSER_CUDA_MATVEC=v6 timeout -k 5 45 ctest -R cuda --output-on-failure ) >"$OUT/ctest_v6.log" 2>&1
note "ctest -R cuda (v6) rc=$? :: $(grep -E 'tests passed|tests failed' "$OUT/ctest_v6.log" | tail -1)"

# 3. kernel workbench, v5 / v6 / v6b only, few reps
MUSER_KBENCH_FAST=1 timeout -k 5 40 "$B/bench/kbench_matvec" 5 >"$OUT/kbench.log" 2>&1
note "kbench rc=$? :: $(grep -E 'kbench_matvec:' "$OUT/kbench.log")"
grep -E '^(q4_k|q6_k) ' "$OUT/kbench.log" | sed 's/^/    /' | cut -c1-200 >>"$S"
grep -E 'one launch' "$OUT/kbench.log" | sed 's/^/    /' >>"$S"

# 4. end-to-end decode on Glimmer: v6, v5, v6b
wait "$SYNTH"
note "synth glimmer: $(tail -1 /tmp/synth_g.log)"
for v in v6 v5 v6b; do
    echo "=== MUSER_CUDA_MATVEC=$v" >>"$OUT/bench.log"
    MUSER_CUDA_MATVEC=$v timeout -k 5 40 "$B/muser" bench --backend cuda -m /tmp/g.gguf --gen 64 --ctx 0,32768 \
        >>"$OUT/bench.log" 2>&1
    note "bench $v rc=$?"
    awk -v v="$v" '/^=== /{cur=$2} cur=="MUSER_CUDA_MATVEC="v && /^ctx /' "$OUT/bench.log" | sed 's/^/    /' >>"$S"
done

# 5. the default path still passes
( cd "$B" && timeout -k 5 40 ctest -R cuda --output-on-failure ) >"$OUT/ctest_v5.log" 2>&1
note "ctest -R cuda (v5) rc=$? :: $(grep -E 'tests passed|tests failed' "$OUT/ctest_v5.log" | tail -1)"

# 6. parity on small (the f64 oracle is slow there: 12 tokens)
timeout -k 5 20 "$B/muser" synth --preset small -o /tmp/small.gguf >"$OUT/parity.log" 2>&1
for v in v6 v5; do
    echo "=== MUSER_CUDA_MATVEC=$v" >>"$OUT/parity.log"
    MUSER_CUDA_MATVEC=$v timeout -k 5 30 "$B/muser" parity -m /tmp/small.gguf --backend cuda --tokens 12 \
        >>"$OUT/parity.log" 2>&1
    note "parity small $v rc=$? :: $(tail -2 "$OUT/parity.log" | tr '\n' ' ' | cut -c1-160)"
done

# 7. SASS instruction counts (no GPU time): Q4_K (12) and Q6_K (14), R=4, v5 vs v6
if command -v cuobjdump >/dev/null 2>&1 || [ -x /usr/local/cuda/bin/cuobjdump ]; then
    CO=$(command -v cuobjdump || echo /usr/local/cuda/bin/cuobjdump)
    timeout 20 "$CO" --dump-sass "$B/bench/kbench_matvec" 2>/dev/null | awk '
        /Function :/ { keep = ($0 ~ /mv_kernelILi4ELi1[24]ELi[56]E/); if (keep) { name = $3; print "=== " name } next }
        keep && /\/\*[0-9a-f]+\*\/ / { line = $0; sub(/.*\*\/ +/, "", line); sub(/^@!?U?P[0-9T] +/, "", line);
            split(line, w, /[ .;]/); op = w[1]; n[name]++; c[name " " op]++ }
        END { for (k in n) print "total " k, n[k]; for (k in c) print "op " k, c[k] }' | sort >"$OUT/sass.txt"
    note "sass: $(grep '^total' "$OUT/sass.txt" | tr '\n' ';')"
    note "sass per-op counts in sass.txt (whole kernels; the R=4 K-quant loop dominates)"
else
    note "sass: no cuobjdump on this machine"
fi
note "done"
cat "$S"
