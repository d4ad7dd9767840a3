#!/usr/bin/env python3
"""dflash_io.py — the DFlash drafter's file conventions for the training tools (docs/dflash.md), in
plain Python (gguf_io's directory reader, struct, hashlib: no numpy, so it runs wherever muser's
tests run).

  fingerprint(path)   the target identity muser checks at load (src/dflash.c,
                      muser_dflash_fingerprint): SHA-256 over the GGUF tensor directory in file
                      order — per tensor its name, a 0 byte, type (u32), n_dims (u32), dims (u64
                      each), data size (u64), then its first and last 4096 data bytes (all of
                      them when it has at most 8192) — as 64 hex digits;
  drafter_kvs(...)    the drafter's metadata, in gguf_io.write's (key, type, value) form.

usage: dflash_io.py fingerprint TARGET.gguf
       dflash_io.py check TARGET.gguf DRAFTER.gguf   (exit 1 unless the drafter names this target)
"""
import hashlib
import os
import struct
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gguf_io as G  # noqa: E402

EDGE = 4096
T_U32, T_F32, T_STR, T_ARR = 4, 6, 8, 9


def fingerprint(path):
    r = G.Reader(path)
    h = hashlib.sha256()
    for i in range(len(r.tinfo)):
        name, dims, typ, data = r.raw(i)
        h.update(name.encode("utf-8") + b"\0")
        h.update(struct.pack("<II", typ, len(dims)))
        for x in dims:
            h.update(struct.pack("<Q", x))
        h.update(struct.pack("<Q", len(data)))
        h.update(data if len(data) <= 2 * EDGE else data[:EDGE] + data[-EDGE:])
    return h.hexdigest()


def drafter_kvs(target_path, n_layer, n_embd, n_ff, n_head, n_head_kv, head_dim, eps, rope_theta,
                block_size, target_layers, name):
    t = G.Reader(target_path)
    arch = t.kv["general.architecture"]
    vocab = t.kv.get(arch + ".vocab_size", len(t.kv.get("tokenizer.ggml.tokens", [])))
    return [
        ("general.architecture", T_STR, "dflash"),
        ("general.name", T_STR, name),
        ("general.alignment", T_U32, 32),
        ("dflash.block_count", T_U32, n_layer),
        ("dflash.embedding_length", T_U32, n_embd),
        ("dflash.feed_forward_length", T_U32, n_ff),
        ("dflash.attention.head_count", T_U32, n_head),
        ("dflash.attention.head_count_kv", T_U32, n_head_kv),
        ("dflash.attention.key_length", T_U32, head_dim),
        ("dflash.attention.layer_norm_rms_epsilon", T_F32, eps),
        ("dflash.rope.freq_base", T_F32, rope_theta),
        ("dflash.block_size", T_U32, block_size),
        ("dflash.target_layers", T_ARR, (T_U32, list(target_layers))),
        ("dflash.target.vocab_size", T_U32, vocab),
        ("dflash.target.block_count", T_U32, t.kv[arch + ".block_count"]),
        ("dflash.target.fingerprint", T_STR, fingerprint(target_path)),
    ]


def main(argv):
    if len(argv) == 3 and argv[1] == "fingerprint":
        print(fingerprint(argv[2]))
        return 0
    if len(argv) == 4 and argv[1] == "check":
        want = G.Reader(argv[3]).kv.get("dflash.target.fingerprint")
        have = fingerprint(argv[2])
        print(f"target {have}\ndrafter names {want}")
        return 0 if want == have else 1
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))
