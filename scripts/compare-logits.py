#!/usr/bin/env python3
"""compare-logits.py — two `muser eval --dump-logits` files (little-endian f32 [n][V]) side by side.

Per position: max |log_softmax(a) - log_softmax(b)| (in f64), whether the top-1 tokens agree, and
the gap between b's best two logits. Exits 1 if any position exceeds --tol (default 1e-3, the
SPEC §4 contract) or the top-1 differs where b's best two are more than --tol apart.
For fast-vs-fast checks where the oracle is too slow (full-size Glimmer: CUDA vs the CPU engine).

    scripts/compare-logits.py A.bin B.bin VOCAB [--tol 1e-3] [--every K]

--every K compares positions K-1, 2K-1, ... and the last (long prompts: a position costs ~0.1 s).
"""
import argparse
import array
import math
import sys


def log_softmax(row):
    m = max(row)
    s = math.fsum(math.exp(v - m) for v in row)
    lse = m + math.log(s)
    return [v - lse for v in row]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("a")
    ap.add_argument("b")
    ap.add_argument("vocab", type=int)
    ap.add_argument("--tol", type=float, default=1e-3)
    ap.add_argument("--every", type=int, default=1)
    o = ap.parse_args()
    xa, xb = array.array("f"), array.array("f")
    with open(o.a, "rb") as f:
        xa.frombytes(f.read())
    with open(o.b, "rb") as f:
        xb.frombytes(f.read())
    if sys.byteorder != "little":
        xa.byteswap()
        xb.byteswap()
    V = o.vocab
    if len(xa) != len(xb) or len(xa) % V:
        print(f"compare-logits: sizes {len(xa)} and {len(xb)} floats are not equal multiples of V={V}")
        return 2
    bad = 0
    worst = 0.0
    n = len(xa) // V
    every = max(1, o.every)
    positions = [p for p in range(n) if p % every == every - 1 or p == n - 1]
    agree = 0
    print(f"{'pos':>4} {'max|dlsm|':>11} {'top1 a':>8} {'top1 b':>8} {'gap b':>9}")
    for p in positions:
        ra, rb = xa[p * V:(p + 1) * V], xb[p * V:(p + 1) * V]
        if not all(math.isfinite(v) for v in ra) or not all(math.isfinite(v) for v in rb):
            print(f"{p:>4} non-finite logits")
            bad += 1
            continue
        la, lb = log_softmax(ra), log_softmax(rb)
        d = max(abs(u - v) for u, v in zip(la, lb))
        ta = max(range(V), key=ra.__getitem__)
        tb = max(range(V), key=rb.__getitem__)
        best = sorted(rb, reverse=True)[:2]
        gap = best[0] - best[1]
        worst = max(worst, d)
        agree += ta == tb
        flag = d > o.tol or (ta != tb and gap > o.tol)
        bad += flag
        print(f"{p:>4} {d:>11.3e} {ta:>8} {tb:>8} {gap:>9.2e}{'  <-- breach' if flag else ''}")
    print(f"{'PASS' if not bad else 'FAIL'}: max |dlogsoftmax| {worst:.3e} over {len(positions)} of {n} positions, "
          f"top-1 the same at {agree} (tolerance {o.tol:g})")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
