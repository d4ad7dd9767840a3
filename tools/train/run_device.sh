#!/bin/sh
# Run ON THE GPU MACHINE from the repository root (the device tool's working tree), with the
# corpus carried in .train/corpus.txt. Trains the default model and its draft; results in $OUT:
# default-f16.gguf.partNN (join with cat), draft-f16.gguf, meta.tar (tokenizer, loss, samples).
set -eu
: "${OUT:?}"
W=/tmp/train-out
export PYTHONUNBUFFERED=1
python3 tools/train/train.py --corpus .train/corpus.txt --out $W "$@" 2>&1 | tee $W.log
cp $W/default-f16.gguf.part* $W/draft-f16.gguf "$OUT/"
cp $W.log $W/train.log
tar -C $W -cf "$OUT/meta.tar" tokenizer.json tokenizer_ref.json loss.csv samples.json summary.json train.log $(cd $W && ls loss.png 2>/dev/null)
