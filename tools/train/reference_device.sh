#!/bin/sh
# Run ON THE GPU MACHINE (it has PyTorch; this machine does not): PyTorch reference logits of the
# committed release-mix default model. Results in $OUT: ref_logits.bin, ref_logits.json.
set -eu
: "${OUT:?}"
python3 tools/train/reference.py models/default.gguf models/tokenizer.json "$OUT"
