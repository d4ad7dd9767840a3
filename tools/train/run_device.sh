#!/bin/sh
# Run ON THE GPU MACHINE from the repository root (the device tool's working tree), with the
# corpus carried in .train/corpus.txt and the Debian packages in .deps (scripts/device-build.sh).
#  1. train the default model and its draft (train.py);
#  2. build muser (CPU only) and quantize both to the release mix (muser quantize --type mix);
#  3. PyTorch reference logits of the quantized default model (reference.py).
# Results in $OUT: default.gguf, draft.gguf, ref_logits.bin, meta.tar (tokenizer, loss curve,
# samples, reference json, logs). If step 2 fails, the F16 export comes back in parts instead.
set -eu
: "${OUT:?}"
W=/tmp/train-out
mkdir -p $W
export PYTHONUNBUFFERED=1
if [ "${SKIP_TRAIN:-0}" != 1 ]; then
    python3 tools/train/train.py --corpus .train/corpus.txt --out $W "$@" 2>&1 | tee $W/train.log
fi
if scripts/device-build.sh build-train -DMUSER_CUDA=OFF >$W/build.log 2>&1 \
   && build-train/muser quantize $W/default-f16.gguf $W/default.gguf --type mix \
   && build-train/muser quantize $W/draft-f16.gguf $W/draft.gguf --type mix; then
    python3 tools/train/reference.py $W/default.gguf $W/tokenizer.json $W 2>&1 | tee $W/reference.log
    cp $W/default.gguf $W/draft.gguf $W/ref_logits.bin "$OUT/"
else
    echo "muser build/quantize failed on the device; returning the F16 export" >&2
    tail -30 $W/build.log >&2
    python3 - <<PY
data = open("$W/default-f16.gguf", "rb").read()
for i in range(0, len(data), 15 << 20):
    open("$OUT/default-f16.gguf.part%02d" % (i // (15 << 20)), "wb").write(data[i:i + (15 << 20)])
PY
    cp $W/draft-f16.gguf "$OUT/"
fi
tar -C $W -cf "$OUT/meta.tar" $(cd $W && ls tokenizer.json tokenizer_ref.json loss.csv loss.png \
    samples.json summary.json train.log build.log reference.log ref_logits.json 2>/dev/null)
