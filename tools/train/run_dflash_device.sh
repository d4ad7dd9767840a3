#!/bin/sh
# Run ON THE GPU MACHINE from the repository root (the device tool's working tree), with the
# corpus carried in .train/corpus.txt and the Debian packages in .deps (scripts/device-build.sh):
#  1. train DFlash drafters for models/default.gguf, one per block size in BLOCKS (default "4 8 16";
#     train_dflash.py, MINUTES each, default 2.5; extra arguments go to train_dflash.py). A device
#     call has 10 minutes: BLOCKS=16 MINUTES=4 in one call, BLOCKS="4 8" in another (docs/dflash.md);
#  2. build muser (CPU only; MUSER_BUILD=DIR takes DIR/muser instead), quantize each drafter to Q8_0 (muser quantize), and check it there:
#     it loads for models/default.gguf and greedy speculation with it gives plain decoding's text;
#     then the acceptance figures beside the other drafters (scripts/spec-bench.sh);
#  3. PyTorch reference block logits of the block-16 drafter (reference_dflash.py).
# Results in $OUT: dflash-b{4,8,16}.gguf, dflash_ref.{bin,txt}, dflash-meta.tar (loss curves,
# summaries, logs, the benchmark table).
set -eu
: "${OUT:?}"
W=/tmp/dflash-out
mkdir -p $W
export PYTHONUNBUFFERED=1
BLOCKS=${BLOCKS:-"4 8 16"}
MINUTES=${MINUTES:-2.5}
for b in $BLOCKS; do
    python3 tools/train/train_dflash.py --target models/default.gguf --tokenizer models/tokenizer.json \
        --corpus .train/corpus.txt --out $W --block "$b" --minutes "$MINUTES" --data-cache $W/data.pt "$@" 2>&1 \
        | tee $W/train-b$b.log
done
# MUSER_BUILD: a folder holding a muser binary built elsewhere (e.g. .devbin from
# scripts/device-prebuilt.sh, with its libraries on LD_LIBRARY_PATH); else build one here
BT=${MUSER_BUILD:-build-train}
if [ -z "${MUSER_BUILD:-}" ]; then
    scripts/device-build.sh build-train -DMUSER_CUDA=OFF >$W/build.log 2>&1 || { tail -30 $W/build.log >&2; exit 1; }
fi
P="And the LORD spake unto Moses, saying,"  # greedy runs to the limit after it
$BT/muser run -m models/default.gguf -p "$P" -n 96 --temp 0 -t 4 >$W/plain.txt 2>/dev/null
for b in $BLOCKS; do
    $BT/muser quantize $W/dflash-b$b-f16.gguf $W/dflash-b$b.gguf --type q8_0
    $BT/muser run -m models/default.gguf -p "$P" -n 96 --temp 0 -t 4 --draft-dflash $W/dflash-b$b.gguf --draft-max 15 \
        >$W/spec-b$b.txt 2>$W/spec-b$b.log
    cmp $W/plain.txt $W/spec-b$b.txt || { echo "block $b: speculation changed the text" >&2; exit 1; }
    tail -1 $W/spec-b$b.log
    cp $W/dflash-b$b.gguf "$OUT/"
done
DFLASH=$(for b in $BLOCKS; do printf '%s ' $W/dflash-b$b.gguf; done) THREADS=4 \
    sh scripts/spec-bench.sh $BT 2>&1 | tee $W/spec-bench.md
if echo " $BLOCKS " | grep -q " 16 "; then
    python3 tools/train/reference_dflash.py models/default.gguf $W/dflash-b16.gguf models/tokenizer.json $W \
        2>&1 | tee $W/reference.log
    cp $W/dflash_ref.bin $W/dflash_ref.txt "$OUT/"
fi
tar -C $W -cf "$OUT/dflash-meta.tar" $(cd $W && ls *-loss.csv *-loss.png *-summary.json *.log spec-bench.md 2>/dev/null)
