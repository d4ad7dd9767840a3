#!/usr/bin/env python3
"""reference.py — PyTorch logits of the *released* (quantized) default model, the data muser's
oracle and CPU engine are checked against (tests/data/).

Loads models/default.gguf with gguf_io (its own numpy dequantizer of Q4_K/Q6_K/Q8_0), runs
model.Muse in float64 on the CPU with K/V rounded to f16 (SPEC §3) — float64 so the reference's
own rounding (f32 noise flips f16 KV roundings, which a sharp trained model amplifies to ~1e-3)
does not eat the 1e-3 budget; logits are stored as f32, for a few fixed token
sequences longer than the sliding window, and writes:
  ref_logits.bin   little-endian f32 [sum of sequence lengths][V]
  ref_logits.json  {"model_sha256":..., "n_vocab":V, "sequences":[{"text":..., "ids":[...]}]}
usage: reference.py MODEL.gguf TOKENIZER.json OUT_DIR
"""
import hashlib, json, os, sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gguf_io as G  # noqa: E402
from model import Config, Muse  # noqa: E402

TEXTS = [
    "In the beginning God created the heaven and the earth. And the earth was without form, and "
    "void; and darkness was upon the face of the deep. And the Spirit of God moved upon the face "
    "of the waters. And God said, Let there be light: and there was light. And God saw the light, "
    "that it was good: and God divided the light from the darkness.",
    "HACKER n. [originally, someone who makes furniture with an axe] 1. A person who enjoys "
    "exploring the details of programmable systems and how to stretch their capabilities, as "
    "opposed to most users, who prefer to learn only the minimum necessary. 2. One who programs "
    "enthusiastically (even obsessively) or who enjoys programming rather than just theorizing.",
]


def config_from(r):
    kv, a = r.kv, "muse."
    return Config(n_layer=kv[a + "block_count"], n_embd=kv[a + "embedding_length"],
                  n_ff=kv[a + "feed_forward_length"], n_head=kv[a + "attention.head_count"],
                  n_head_kv=kv[a + "attention.head_count_kv"],
                  head_dim=kv[a + "attention.key_length"], n_vocab=kv[a + "vocab_size"],
                  n_ctx=kv[a + "context_length"], window=kv[a + "attention.sliding_window"],
                  pattern=kv[a + "attention.sliding_window_pattern"],
                  rope_theta=kv[a + "rope.freq_base"],
                  eps=kv[a + "attention.layer_norm_rms_epsilon"],
                  post_eps=kv[a + "attention.post_norm_epsilon"],
                  logit_scale=kv[a + "logit_scale"], softcap=kv[a + "final_logit_softcapping"])


def main():
    path, tok_path, out = sys.argv[1:4]
    from tokenizers import Tokenizer
    tok = Tokenizer.from_file(tok_path)
    r = G.Reader(path)
    c = config_from(r)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    model = Muse(c)
    model.load_gguf(r)
    model = model.double()
    model.eval()
    seqs, rows = [], []
    with torch.no_grad():
        for t in TEXTS:
            ids = tok.encode(t, add_special_tokens=False).ids
            assert len(ids) > c.window, (len(ids), c.window)
            logits = model(torch.tensor([ids]), kv_f16=True)[0].double().numpy()
            rows.append(logits.astype("<f4"))
            seqs.append({"text": t, "ids": ids})
            print(f"sequence of {len(ids)} tokens; top-1 of last row {int(logits[-1].argmax())}")
    os.makedirs(out, exist_ok=True)
    np.concatenate(rows).tofile(os.path.join(out, "ref_logits.bin"))
    sha = hashlib.sha256(open(path, "rb").read()).hexdigest()
    json.dump({"model_sha256": sha, "n_vocab": c.n_vocab, "sequences": seqs,
               "note": "PyTorch float64 on CPU, K/V rounded to f16, dequantized release weights; stored f32"},
              open(os.path.join(out, "ref_logits.json"), "w"), ensure_ascii=False, indent=1)
    with open(os.path.join(out, "ref_logits.txt"), "w") as f:  # what the C test reads
        f.write("# PyTorch reference for models/default.gguf (tools/train/reference.py); "
                "logits in ref_logits.bin\n")
        f.write("sha256 %s\nn_vocab %d\n" % (sha, c.n_vocab))
        for s in seqs:
            f.write("ids " + " ".join(map(str, s["ids"])) + "\n")


if __name__ == "__main__":
    main()
