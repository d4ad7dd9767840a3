# mmi_grid.py — a numpy model of the gate·up pair's block folds rounded to an integer grid per (weight row,
# x row) and summed as int64 (bench/kernels/mmi-grid.patch, NOTES "Grid sums"): its arithmetic, not
# the kernel's lane mapping. Needs python3-numpy. Prints, per shape, the error against the f64 dot
# and how far the largest block and the sum sit above the grid (the sum must stay under 2^62).
import numpy as np, math
rng = np.random.default_rng(7)
def f16(v): return np.float16(v).astype(np.float64)
def trial(K, outlier, dscale):
    nb = K // 256; L = max(0, math.ceil(math.log2(nb)))
    # weights: Q4_K-like: per block d, dmin (f16), per sub-block sc, m (6-bit), q (4-bit)
    d = f16(rng.uniform(0.5, 1, nb) * dscale); dm = f16(rng.uniform(0.5, 1, nb) * dscale)
    sc = rng.integers(0, 64, (nb, 8)); m = rng.integers(0, 64, (nb, 8)); q = rng.integers(0, 16, (nb, 8, 32))
    w = d[:, None, None] * sc[:, :, None] * q - dm[:, None, None] * m[:, :, None]
    x = rng.standard_normal(K).astype(np.float32)
    if outlier: x[rng.integers(0, K)] *= outlier
    xb = x.reshape(nb, 8, 32).astype(np.float64)
    # x per block: s = 2^(e-30), v = rint(x/s)
    mx = np.abs(xb).reshape(nb, -1).max(1); e = np.floor(np.log2(mx)) + 1; s = 2.0 ** (e - 30)
    v = np.rint(xb / s[:, None, None])
    T = (sc[:, :, None] * q * v).sum((1, 2))                      # exact (int < 2^48, exact in f64)
    sums = v.sum(2) * 2.0 ** -20                                  # per sub-block, f32 then hi/lo f16 pieces
    hi = f16(sums.astype(np.float32)); lo = f16((sums.astype(np.float32) - hi).astype(np.float32))
    M = (m * (hi + lo)).sum(1).astype(np.float32)                 # (tensor core f32 accumulate, approx.)
    val = s * (d * T - dm * 2.0**20 * M.astype(np.float64))       # the f64 fold
    Ew = max(1, int(max(np.frexp(d.max())[1], np.frexp(dm.max())[1]) + 14))  # biased f16 exponent
    ew = Ew - 14; eS = int(e.max()) - 30
    G = eS + ew + 49 + L - 62
    grid = np.rint(val * 2.0 ** -G)
    assert np.abs(grid).max() < 2.0 ** (62 - L) and abs(grid.sum()) < 2.0 ** 62
    y = np.float32(float(grid.sum()) * 2.0 ** G)                 # (ll2float, then 2^G)
    ref = float((w.reshape(-1) * x.astype(np.float64)).sum()); mag = float(np.abs(w.reshape(-1) * x).sum())
    bits = math.log2(np.abs(val).max() / 2.0 ** G)
    return abs(float(y) - ref) / mag, bits, math.log2(np.abs(grid).max() * nb) 
for K, out, ds in [(6656, 0, 1e-3), (6656, 300, 1e-3), (19968, 0, 1e-4), (19968, 1e4, 1e-2), (4096, 300, 60000.0)]:
    r = [trial(K, out, ds) for _ in range(20)]
    print(f"K {K} outlier {out} d~{ds}: max err {max(a for a,_,_ in r):.2e} of sum|wx|; largest block {min(b for _,b,_ in r):.1f}..{max(b for _,b,_ in r):.1f} bits over the grid; sum bound 2^{max(c for *_,c in r):.1f}")
