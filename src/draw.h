/* draw.h — the arithmetic of a sampled token's weight, shared by the host sampler (sampler.c) and
 * the GPU's draw (src/cuda/norm.cu, cu_draw), so both give the same bits.
 *
 * A candidate's weight is e^x for x = (l − l_max) / T ≤ 0: x = k·ln2 + r (k the nearest integer to
 * x·log2 e, ln2 in two parts), e^r by its Taylor polynomial of degree 7 (|r| ≤ ln2/2: truncation
 * under 4e-9 relative), times 2^k. Every step is one IEEE multiply, round or fused multiply-add
 * (no step a compiler may contract or reorder), so sampler.c's AVX2 pass, its plain loop and the
 * GPU give the same bits, within 2 ulp of e^x; below x = −87 (under the smallest normal float, a
 * weight no draw can meet against the best's 1) it is 0. The best candidate (x = 0) weighs
 * exactly 1.
 *
 * The draw sums the weights per block of MUSER_DRAW_BLOCK candidates (lane j of a block the
 * candidates j, j + 8, … summed in f64 in order, the eight lanes then added in order), the blocks
 * in order, and walks the same sums (sampler.c's block_sums and draw). */
#ifndef MUSER_DRAW_H
#define MUSER_DRAW_H

#include <math.h>
#include <stdint.h>

#ifdef __CUDACC__
#define MUSER_HD __host__ __device__
#else
#define MUSER_HD
#endif

#define MUSER_DRAW_BLOCK 64

/* min-p's cut on x = (l − l_max) / T: a candidate keeps x ≥ logf(min_p); −inf without min-p */
static inline float muser_min_p_cut(float min_p) { return min_p > 0.0f ? logf(min_p) : -INFINITY; }
#define MUSER_W_LOG2E 1.44269504f
#define MUSER_W_LN2_HI 0.693145751953125f
#define MUSER_W_LN2_LO 1.428606765330187e-06f
#define MUSER_W_FLOOR -87.0f
/* the polynomial's coefficients 1/7!, 1/6!, …, 1/1!, 1/0! (each the f32 nearest) */
#define MUSER_W_C0 (1.0f / 5040)
#define MUSER_W_C1 (1.0f / 720)
#define MUSER_W_C2 (1.0f / 120)
#define MUSER_W_C3 (1.0f / 24)
#define MUSER_W_C4 (1.0f / 6)
#define MUSER_W_C5 0.5f
#define MUSER_W_C6 1.0f
#define MUSER_W_C7 1.0f

static inline MUSER_HD float muser_weight_of(float x)
{
    if (!(x >= MUSER_W_FLOOR))
        return 0.0f;
    const float k = rintf(x * MUSER_W_LOG2E);
    float r = fmaf(k, -MUSER_W_LN2_HI, x);
    r = fmaf(k, -MUSER_W_LN2_LO, r);
    float p = MUSER_W_C0;
    p = fmaf(p, r, MUSER_W_C1);
    p = fmaf(p, r, MUSER_W_C2);
    p = fmaf(p, r, MUSER_W_C3);
    p = fmaf(p, r, MUSER_W_C4);
    p = fmaf(p, r, MUSER_W_C5);
    p = fmaf(p, r, MUSER_W_C6);
    p = fmaf(p, r, MUSER_W_C7);
    union {
        uint32_t u;
        float f;
    } scale;
    scale.u = (uint32_t)((int32_t)k + 127) << 23;
    return p * scale.f;
}

/* ---- truncation where the draw is made: min-p and top-p over the whole row (no top-k) ----------
 * A candidate is an id whose logit is not −inf and, with min-p, whose x reaches cut = logf(min_p);
 * the draw weighs the others 0 and walks the whole row in id order (its blocks, then its ids).
 *
 * top-p needs sums whose bits do not depend on the order they are taken in, so that a GPU adding in
 * parallel gets the host's: the weights are summed per biased exponent e of the f32 weight (0 .. 127:
 * weights lie in (0, 1]; zero weights add nothing). Every weight of one exponent is a multiple of
 * that exponent's ulp 2^(e−150) below 2^(e−126), so fewer than 2^29 of them sum exactly in f64 (42
 * bits for a 202,048-wide row), in any order. z (every candidate's weight, before min-p) and the
 * kept mass are then the exponents' sums added from e = 127 down. top-p applies when the mass reaches
 * need = top_p·z: the walk from the top finds the exponent, then the bucket of the top seven
 * mantissa bits within it (again exact sums), then, among that bucket's candidates ranked by weight
 * and then the lower id, the first j for which above + (the exact sum of candidates 0..j) reaches
 * need: the last one kept (lv, li). The walks over groups add in one fixed order and the last one's
 * sums are exact, so the host and the GPU (which scans the bucket in parallel) take the same steps. */
#define MUSER_DRAW_EXPS 128 /* biased exponents of weights in [0, 1] */
#define MUSER_DRAW_SUBS 128 /* buckets within an exponent: the top seven mantissa bits */

static inline MUSER_HD uint32_t muser_w_bits(float w)
{
    union {
        float f;
        uint32_t u;
    } b;
    b.f = w;
    return b.u;
}
static inline MUSER_HD uint32_t muser_w_exp(float w) { return muser_w_bits(w) >> 23; }
static inline MUSER_HD uint32_t muser_w_sub(float w) { return (muser_w_bits(w) >> 16) & (MUSER_DRAW_SUBS - 1); }

/* The sum of groups [0, n) from the top, the order z and the mass take */
static inline MUSER_HD double muser_topp_total(const double *sums, int n)
{
    double t = 0.0;
    for (int k = n - 1; k >= 0; k--) t += sums[k];
    return t;
}

/* One level of top-p's walk: from the top group down, the first group k with weight whose sum
 * brings *above to need, or else the lowest group with weight (rounding can leave the running sum
 * short of the exact total); *above grows by the groups passed. −1 when no group has weight. */
static inline MUSER_HD int muser_topp_walk(const double *sums, int n, double need, double *above)
{
    int lo = -1;
    for (int k = 0; k < n && lo < 0; k++)
        if (sums[k] > 0.0) lo = k;
    for (int k = n - 1; k > lo; k--) {
        if (!(sums[k] > 0.0)) continue;
        if (*above + sums[k] >= need) return k;
        *above += sums[k];
    }
    return lo;
}

/* Whether a candidate of weight w and id i ranks at or before the last one top-p keeps (lv, li) */
static inline MUSER_HD int muser_topp_keeps(float w, int32_t i, float lv, int32_t li)
{
    return w > lv || (w == lv && i <= li);
}

#endif
