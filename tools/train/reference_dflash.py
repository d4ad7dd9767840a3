#!/usr/bin/env python3
"""reference_dflash.py — PyTorch block logits of a committed DFlash drafter for its target, the data
muser's drafter (CPU forward and oracle) is checked against (tests/data/dflash_ref.*,
tests/test_dflash_trained.c), in the manner of reference.py:

  the target (released, quantized weights, dequantized by gguf_io) runs in float64 on the CPU with
  K/V rounded to f16 (SPEC §3), giving the residuals at the drafter's target layers; the drafter
  (its GGUF weights, dequantized the same way) runs in float64; for each case (a fixed text, a
  block position p) the logits of block rows 1..B-1 with t0 = ids[p] over the context of positions
  < p are stored as f32.

  dflash_ref.bin   little-endian f32 [cases][B-1][V]
  dflash_ref.txt   what the C test reads: the two files' SHA-256, n_vocab, block, then per case
                   "case P T0" and "ids ..." (the context's tokens, positions 0..P-1)
usage: reference_dflash.py TARGET.gguf DRAFTER.gguf TOKENIZER.json OUT_DIR
"""
import hashlib, os, sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gguf_io as G  # noqa: E402
from dflash_model import DFlash, config_from as dconfig_from, target_features  # noqa: E402
from model import Muse  # noqa: E402
from reference import TEXTS, config_from  # noqa: E402

POSITIONS = (1, 20, 70)  # block positions per text: a one-token context, and past the 64-row window


def main():
    tpath, dpath, tok_path, out = sys.argv[1:5]
    from tokenizers import Tokenizer
    tok = Tokenizer.from_file(tok_path)
    torch.backends.cuda.matmul.allow_tf32 = False
    tr, dr = G.Reader(tpath), G.Reader(dpath)
    target = Muse(config_from(tr))
    target.load_gguf(tr)
    target = target.double().eval()
    c = dconfig_from(dr)
    drafter = DFlash(c, target)
    drafter.load_gguf(dr)
    drafter = drafter.double().eval()
    rows, cases = [], []
    with torch.no_grad():
        for t in TEXTS:
            ids = tok.encode(t, add_special_tokens=False).ids
            feats, _ = target_features(target, torch.tensor([ids]), c.taps, kv_f16=True)
            for p in POSITIONS:
                assert p < len(ids)
                lg = drafter(feats[:, :p], torch.tensor([[ids[p]]]), torch.tensor([[p]]))[0, 0]
                rows.append(lg.numpy().astype("<f4"))
                cases.append((p, ids[p], ids[:p]))
                print(f"case p {p} t0 {ids[p]}: drafts {lg.argmax(-1).tolist()}; the text goes on "
                      f"{ids[p + 1:p + c.block]}")
    os.makedirs(out, exist_ok=True)
    np.stack(rows).tofile(os.path.join(out, "dflash_ref.bin"))
    sha = lambda p: hashlib.sha256(open(p, "rb").read()).hexdigest()  # noqa: E731
    with open(os.path.join(out, "dflash_ref.txt"), "w") as f:
        f.write("# PyTorch reference for the committed DFlash drafter (tools/train/reference_dflash.py); "
                "logits in dflash_ref.bin\n")
        f.write("target_sha256 %s\ndrafter_sha256 %s\nn_vocab %d\nblock %d\n"
                % (sha(tpath), sha(dpath), target.c.n_vocab, c.block))
        for p, t0, ctx in cases:
            f.write("case %d %d\nids %s\n" % (p, t0, " ".join(map(str, ctx))))


if __name__ == "__main__":
    main()
