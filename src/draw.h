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

#endif
