/* mmi.cuh — the Q4_K gate·up pair as exact integers per block (mma.sync m16n8k32 u8 × s8 → s32),
 * each row count on its own kernel shape with the same bytes per row (bench/kernels/NOTES.md, "mmi").
 *
 * Numerics. x per (row, 256-block): a power of two s with |x|/s < 2^30 and v = rint(x/s), 31 bits
 * of the block's largest element, as four balanced signed-byte digits v = d0 + 2^8·d1 + 2^16·d2 +
 * 2^24·d3. Per weight row and digit the main term T_k = Σ_j sc_j·Σ_{p∈j} q_p·d_k,p is an exact
 * int32 (< 2^25): one m16n8k32 per sub-block j, then one IMAD by sc_j. The min term
 * M = Σ_j m_j·2^-20·Σ_{p∈j} v_p runs through one m16n8k8 (f16 m against the f16 hi/lo pieces of the
 * sub-block sums the x writer made): not exact, but a column's result depends on its own operands
 * only. Then per (weight row, x row, block) one f64 fold s·(d·Σ_k 2^8k·T_k − dmin·2^20·M) (the Σ is
 * exact, < 2^49), rounded to an integer grid fixed per (weight row, x row) (below, "the sums on a
 * fixed grid"), and the blocks added as int64: an integer sum has no order, so how the blocks are
 * split over warps and CTAs does not matter. One rounding to f32, then silu(g)·u. Nothing in a
 * row's arithmetic depends on which other rows share the launch, how many there are or which
 * kernel ran: a row's bytes are the same at every row count (SPEC §4, row invariance).
 *
 * Weights: the engine's Q4_KT units as stored (mmq.cuh, 2304 bytes per (16-row tile, block)), read
 * at other addresses: lane (g, t) takes, for byte pair P = 0..3 of the GGUF block (sub-blocks 2P in
 * the low nibbles, 2P + 1 in the high), the 16-byte slot (2(P>>1) + (t>>1))·32 + 4g + 2(P&1) + (t&1).
 * Its words are then rows g, g+8, g, g+8 at bytes swap34(k) of the pair for the mma's k (bits 3 and
 * 4 of k swapped), so sub-block 2P + n is the A fragment (words >> 4n) & 0x0F0F0F0F. Sub-block j's
 * scale is field 2h + (j>>2) of the row pair's scale word 2(j&1) + ((j>>1)&1) (mmq_sub's inverse);
 * lane t's own word and mins half hold the mins of sub-blocks mmq_sub(t, 0..1) of both rows: the min
 * mma's k = 2t + G.
 *
 * x, per row and block, MMI_XBLK bytes (mmi_prep_kernel):
 *   [0, 1024)     [j 0..7][digit 0..3][t 0..3][b0: k 4t..4t+3 | b1: k 16+4t..16+4t+3], position
 *                 swap34(k) of sub-block j
 *   [1024, 1056)  [piece hi, lo][t 0..3][G 0..1] f16: 2^-20·Σ v of sub-block mmq_sub(t, G)
 *   [1056, 1060)  s (f32); Inf or NaN in the block makes s NaN, so every output reading it is NaN
 *
 * Launches (mmi_pair_launch): one or two rows on a persistent grid (mmi_pair_persist, x loaded once
 * for gate and up), more in CTAs of KW-split tile pairs with the rows as n-tiles (mmi_pair_rows). */
#ifndef MUSER_CUDA_MMI_CUH
#define MUSER_CUDA_MMI_CUH

#include <cuda_fp16.h>

#include "cuda/launch.cuh"
#include "cuda/mmq.cuh"

#define MMI_XBLK 1072u /* x bytes of one (row, block) */

static inline size_t mmi_x_bytes(uint32_t K) { return (size_t)K / 256 * MMI_XBLK; }

/* the mma's k ↔ the position in the sub-block (an involution) */
__host__ __device__ __forceinline__ uint32_t mmi_swap34(uint32_t p) { return (p & ~0x18u) | ((p & 8u) << 1) | ((p >> 1) & 8u); }

/* ---- the x writers ------------------------------------------------------------------------------ */
/* The block's power of two s (and 1/s) from mx, the largest |x| of the block as f32 bits */
__device__ __forceinline__ void mmi_scale(uint32_t mx, float &s, float &inv)
{
    if (mx >= 0x7F800000u) { /* Inf or NaN: every v 0, every output reading the block NaN */
        s = __int_as_float(0x7FC00000);
        inv = 0.f;
        return;
    }
    /* max|x| < 2^(eb-126), eb its biased exponent: s = 2^(eb-156), at least 2^-126 */
    const int eb = max((int)(mx >> 23), 30);
    s = __int_as_float((eb - 29) << 23);
    inv = __int_as_float((283 - eb) << 23);
}

/* Sub-block j of a block (o: the row's block in the layout above): all 32 lanes of a warp call it,
 * lane l with v = x[32j + l] of the block, s and inv its block's (mmi_scale); the lane of sub-block 0
 * also stores s. */
__device__ __forceinline__ void mmi_sub_write(float v, uint32_t lane, uint32_t j, float s, float inv, uint8_t *__restrict__ o)
{
    const uint32_t k = mmi_swap34(lane), t = (k & 15) >> 2, half = k >> 4, by = k & 3;
    const int32_t q = __float2int_rn(v * inv); /* exact scaling by a power of two, then rint */
    const int32_t d0 = (int8_t)(q & 0xFF), q1 = (q - d0) >> 8, d1 = (int8_t)(q1 & 0xFF), q2 = (q1 - d1) >> 8,
                  d2 = (int8_t)(q2 & 0xFF), d3 = (q2 - d2) >> 8;
    const int32_t dg[4] = {d0, d1, d2, d3};
#pragma unroll
    for (int c = 0; c < 4; c++) o[((j * 4 + c) * 4 + t) * 8 + half * 4 + by] = (uint8_t)(int8_t)dg[c];
    /* Σ v exactly (< 2^35): 15-bit low parts and the rest summed apart */
    const int32_t lo = (int32_t)__reduce_add_sync(0xFFFFFFFFu, (uint32_t)(q & 0x7FFF));
    const int32_t hi = (int32_t)__reduce_add_sync(0xFFFFFFFFu, (uint32_t)(q >> 15));
    if (lane == 0) {
        const float f = (float)(((double)hi * 32768.0 + (double)lo) * 0x1p-20);
        const __half ph = __float2half_rn(f), pl = __float2half_rn(f - __half2float(ph));
        const uint32_t ti = 2 * (j & 1) + ((j >> 1) & 1), G = j >> 2;
        __half *sp = (__half *)(o + 1024);
        sp[(0 * 4 + ti) * 2 + G] = ph;
        sp[(1 * 4 + ti) * 2 + G] = pl;
        if (j == 0) *(float *)(o + 1056) = s;
    }
}

/* A whole block by one warp: lane l with v[i] = x[32i + l] of the block */
__device__ __forceinline__ void mmi_block_write(const float (&v)[8], uint32_t lane, uint8_t *__restrict__ o)
{
    uint32_t mx = 0;
#pragma unroll
    for (int i = 0; i < 8; i++) mx = max(mx, __float_as_uint(v[i]) & 0x7FFFFFFFu);
    float s, inv;
    mmi_scale(__reduce_max_sync(0xFFFFFFFFu, mx), s, inv);
#pragma unroll
    for (int i = 0; i < 8; i++) mmi_sub_write(v[i], lane, (uint32_t)i, s, inv, o);
}

#define MMI_PREP_T 128
/* x of K elements → the layout above, a warp per block; row blockIdx.y at x + y·xst floats, buf + y·bst */
static __global__ void __launch_bounds__(MMI_PREP_T) mmi_prep_kernel(const float *x, uint8_t *__restrict__ buf, uint32_t nb,
                                                                      uint32_t xst, uint32_t bst)
{
    CU_TL_SCOPE(TL_MMQ_PREP);
    cu_pdl_trigger();
    const uint32_t lane = threadIdx.x & 31, b = blockIdx.x * (MMI_PREP_T / 32) + (threadIdx.x >> 5);
    x += (size_t)blockIdx.y * xst;
    buf += (size_t)blockIdx.y * bst;
    cu_pdl_wait(); /* x is the previous kernel's output */
    if (b >= nb) return;
    float v[8];
#pragma unroll
    for (int i = 0; i < 8; i++) v[i] = x[256 * b + 32 * i + lane];
    mmi_block_write(v, lane, buf + (size_t)b * MMI_XBLK);
}

/* rows x rows of K elements (row r at x + r·xst floats) into buf (row r at + r·bst bytes) */
static inline void mmi_prep_launch(cudaStream_t st, const float *x, uint8_t *buf, uint32_t K, bool pdl, uint32_t rows,
                                   uint32_t xst, uint32_t bst)
{
    const uint32_t nb = K / 256, per = MMI_PREP_T / 32;
    cudaLaunchAttribute at[1];
    const cudaLaunchConfig_t cfg = cu_pdl_cfg(dim3((nb + per - 1) / per, rows), dim3(MMI_PREP_T), st, pdl, at);
    cudaLaunchKernelEx(&cfg, mmi_prep_kernel, x, buf, nb, xst, bst);
}

/* ---- the kernel ------------------------------------------------------------------------------ */
__device__ __forceinline__ void mmi_mma(int c[4], const uint32_t a[4], uint32_t b0, uint32_t b1)
{
    asm("mma.sync.aligned.m16n8k32.row.col.s32.u8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
        : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
/* m16n8k8, f16 in, f32 accumulate */
__device__ __forceinline__ void mmi_mma8(float c[4], uint32_t a0, uint32_t a1, uint32_t b0)
{
    asm("mma.sync.aligned.m16n8k8.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5}, {%6}, {%0,%1,%2,%3};"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a0), "r"(a1), "r"(b0));
}

/* A lane's words of one unit: its four qs slots, its row pair's header (h0: d pair, dmin pair,
 * scale words 0, 1; h1: scale words 2, 3, mins halves 0|1, 2|3) */
struct mmi_w {
    uint4 q[4], h0, h1;
};
__device__ __forceinline__ void mmi_load(const uint8_t *unit, uint32_t lane, mmi_w &W)
{
    const uint32_t g = lane >> 2, t = lane & 3;
#pragma unroll
    for (int P = 0; P < 4; P++)
        W.q[P] = cu_ldw(unit + ((2 * (P >> 1) + (t >> 1)) * 32 + 4 * g + 2 * (P & 1) + (t & 1)) * 16);
    W.h0 = cu_ldw(unit + 2048 + 32 * g);
    W.h1 = cu_ldw(unit + 2048 + 32 * g + 16);
}

/* T = Σ_k 2^8k·T_k of this lane's weight row from its C fragment a (digits 2(t&1), 2(t&1)+1 of rows
 * g, g+8) and its partner's (lane ^ 1): the low-digit lane gets row g, its partner row g + 8 */
__device__ __forceinline__ double mmi_pair_T(const int a[4], uint32_t hi)
{
    const double p0 = (double)a[0] + 256.0 * (double)a[1];
    const double p8 = (double)a[2] + 256.0 * (double)a[3];
    const double mine = hi ? p8 : p0, other = __shfl_xor_sync(0xFFFFFFFFu, hi ? p0 : p8, 1);
    return hi ? other + 65536.0 * mine : mine + 65536.0 * other;
}

/* ---- the sums on a fixed grid ----------------------------------------------------------------- */
/* A block's f64 fold rounds once; what would still depend on the order is the sum over blocks.
 * Each block's value is therefore rounded to a grid 2^G fixed per (weight row, x row) and the
 * blocks are added as int64, which has no order: any split of the blocks over warps, CTAs or
 * launches gives the same sum, so each row count takes its own kernel shape. With |d|, |dmin| <
 * 2^ew over the weight row (ew = Ew − 14, Ew the largest biased f16 exponent of its d and dmin, at
 * least 1), |x| / s_b < 2^30 and s_b ≤ S = 2^eS over the x row's blocks, a block's value is below
 * s_b·(2^ew·2^48 + 2^ew·2^20·2^24) < 2^(eS + ew + 49), so with nb ≤ 2^L blocks and
 * G = eS + ew + 49 + L − 62 every partial sum is below 2^62. The grid sits ~2^-(62 − L) under the
 * largest value a block could take: 40+ bits under a typical block's, far below f32's rounding.
 * The sum becomes f32 with one rounding (then the exact power of two 2^G). A non-finite d or dmin
 * (Ew 31) or x (S's exponent 255) makes the output NaN (fail closed). */

/* Per weight row of a Q4_KT matrix: Ew (a byte), one thread per row, once at upload. */
static __global__ void mmi_rexp_kernel(const uint8_t *__restrict__ units, uint32_t rows, uint32_t nb, uint8_t *__restrict__ out)
{
    const uint32_t r = blockIdx.x * blockDim.x + threadIdx.x;
    if (r >= rows) return;
    const uint32_t tile = r / 16, g = r % 8, h = (r / 8) % 2;
    uint32_t e = 1;
    for (uint32_t b = 0; b < nb; b++) {
        const uint16_t *hd = (const uint16_t *)(units + ((size_t)tile * nb + b) * MMQ_UNIT + 2048 + 32 * g);
        e = max(e, max((hd[h] >> 10) & 31u, (hd[2 + h] >> 10) & 31u)); /* d_g, d_g8, dmin_g, dmin_g8 */
    }
    out[r] = (uint8_t)e;
}

/* L: the blocks' bits, nb ≤ 2^L */
__host__ __device__ __forceinline__ uint32_t mmi_lbits(uint32_t nb)
{
    uint32_t l = 0;
    while ((1u << l) < nb) l++;
    return l;
}

/* S's biased exponent for the x row at xrow (255 if a block is not finite): all 32 lanes call it */
__device__ __forceinline__ uint32_t mmi_row_sb(const uint8_t *xrow, uint32_t nb, uint32_t lane)
{
    uint32_t m = 0;
    for (uint32_t b = lane; b < nb; b += 32) m = max(m, __float_as_uint(cu_ldx<float>(xrow + (size_t)b * MMI_XBLK + 1056)));
    return __reduce_max_sync(0xFFFFFFFFu, m) >> 23;
}

/* 2^e as f64 (|e| < 1023) */
__device__ __forceinline__ double mmi_pow2(int e) { return __longlong_as_double((long long)(e + 1023) << 52); }

/* The output of a grid sum: sb = Sb (the x row's), ew = Ew (the weight row's), L the blocks' bits */
__device__ __forceinline__ float mmi_out(long long acc, uint32_t sb, uint32_t ew, uint32_t L)
{
    if (sb >= 255u || ew >= 31u) return __int_as_float(0x7FC00000);
    return (float)((double)__ll2float_rn(acc) * mmi_pow2((int)(sb + ew + L) - 154));
}

/* One block of NU units (sharing x) against the warp's NT n-tiles (x row n at min(2n + t/2, nx − 1)):
 * acc[u][n] += the block's value on the grid, for weight row g + 8(t&1) of unit u and x row 2n + t/2.
 * kx[xr]: x row xr's Sb (xr < 2·NT); ew[u]: the lane's weight row's Ew; L: mmi_lbits(nb). */
template <int NT, int NU>
__device__ __forceinline__ void mmi_block(const mmi_w (&W)[NU], const uint8_t *__restrict__ xb, uint32_t xs, uint32_t nx,
                                          uint32_t lane, const uint32_t *kx, const uint32_t (&ew)[NU], uint32_t L,
                                          long long (&acc)[NU][NT])
{
    constexpr int NM = (2 * NT + 3) / 4; /* min tiles: 4 x rows (hi, lo pieces) each */
    const uint32_t g = lane >> 2, t = lane & 3, hi = t & 1;
    const uint8_t *xp[NT]; /* the lane's B column of n-tile n: x row 2n + g/4, digit g%4 */
#pragma unroll
    for (int n = 0; n < NT; n++) xp[n] = xb + (size_t)min(2 * (uint32_t)n + (g >> 2), nx - 1) * xs + ((g & 3) * 4 + t) * 8;
    int T[NU][NT][4];
#pragma unroll
    for (int u = 0; u < NU; u++)
#pragma unroll
        for (int n = 0; n < NT; n++) T[u][n][0] = T[u][n][1] = T[u][n][2] = T[u][n][3] = 0;
#pragma unroll
    for (int j = 0; j < 8; j++) {
        uint32_t a[NU][4];
        int s0[NU], s8[NU];
#pragma unroll
        for (int u = 0; u < NU; u++) {
            const uint4 &Q = W[u].q[j >> 1];
            const uint32_t sh = 4 * (j & 1);
            a[u][0] = (Q.x >> sh) & 0x0F0F0F0Fu;
            a[u][1] = (Q.y >> sh) & 0x0F0F0F0Fu;
            a[u][2] = (Q.z >> sh) & 0x0F0F0F0Fu;
            a[u][3] = (Q.w >> sh) & 0x0F0F0F0Fu;
            const uint32_t sw = (j & 1) ? ((j >> 1) & 1 ? W[u].h1.y : W[u].h1.x) : ((j >> 1) & 1 ? W[u].h0.w : W[u].h0.z);
            const uint32_t f = 6 * (j >> 2);
            s0[u] = (int)((sw >> f) & 63u);
            s8[u] = (int)((sw >> (f + 12)) & 63u);
        }
#pragma unroll
        for (int n = 0; n < NT; n++) {
            const uint2 bx = cu_ldx<uint2>(xp[n] + j * 128);
#pragma unroll
            for (int u = 0; u < NU; u++) {
                int c[4] = {0, 0, 0, 0};
                mmi_mma(c, a[u], bx.x, bx.y);
                T[u][n][0] += s0[u] * c[0];
                T[u][n][1] += s0[u] * c[1];
                T[u][n][2] += s8[u] * c[2];
                T[u][n][3] += s8[u] * c[3];
            }
        }
    }
    uint32_t bm[NM];
#pragma unroll
    for (int k = 0; k < NM; k++) {
        const uint32_t xr = min(4 * (uint32_t)k + (g >> 1), nx - 1);
        bm[k] = cu_ldx<uint32_t>(xb + (size_t)xr * xs + 1024 + ((g & 1) * 4 + t) * 4);
    }
#pragma unroll
    for (int u = 0; u < NU; u++) {
        /* the min term: A = the mins of sub-blocks mmq_sub(t, 0..1) of rows g, g+8 as f16 (exact) */
        const uint32_t mw = t == 0 ? W[u].h0.z : t == 1 ? W[u].h0.w : t == 2 ? W[u].h1.x : W[u].h1.y;
        const uint32_t mh = (t & 2 ? W[u].h1.w : W[u].h1.z) >> (16 * (t & 1));
        const uint32_t m0 = (mw >> 24) & 63u, m1 = mh & 63u, m2 = (mh >> 6) & 63u, m3 = ((mw >> 26) & 0x30u) | ((mh >> 12) & 15u);
        const __half2 bias = __halves2half2(__ushort_as_half(0x6400), __ushort_as_half(0x6400)); /* 1024 */
        const uint32_t am0u = (0x6400u | m0) | (0x6400u | m1) << 16, am8u = (0x6400u | m2) | (0x6400u | m3) << 16;
        const __half2 am0 = __hsub2(*(const __half2 *)&am0u, bias), am8 = __hsub2(*(const __half2 *)&am8u, bias);
        const uint32_t a0 = *(const uint32_t *)&am0, a8 = *(const uint32_t *)&am8;
        float Mv[NM][4];
#pragma unroll
        for (int k = 0; k < NM; k++) {
            Mv[k][0] = Mv[k][1] = Mv[k][2] = Mv[k][3] = 0.f;
            mmi_mma8(Mv[k], a0, a8, bm[k]);
        }
        const float2 d2 = __half22float2(*(const __half2 *)&W[u].h0.x);
        const float2 m2v = __half22float2(*(const __half2 *)&W[u].h0.y);
        const double d = (double)(hi ? d2.y : d2.x), dm = 0x1p20 * (double)(hi ? m2v.y : m2v.x);
#pragma unroll
        for (int n = 0; n < NT; n++) {
            const uint32_t xr = 2 * n + (t >> 1), src = 4 * g + (xr & 3);
            const float *mv = Mv[n >> 1];
            const float M0 = __fadd_rn(mv[0], mv[1]), M8 = __fadd_rn(mv[2], mv[3]);
            const float M0r = __shfl_sync(0xFFFFFFFFu, M0, src), M8r = __shfl_sync(0xFFFFFFFFu, M8, src);
            /* s_b·2^-G = 2^(sb − Sb − Ew − L + 27), exact; the fold rounds once in f64, the grid once */
            const uint32_t sb = __float_as_uint(cu_ldx<float>(xb + (size_t)min(xr, nx - 1) * xs + 1056)) >> 23;
            const double v = fma(d, mmi_pair_T(T[u][n], hi), -dm * (double)(hi ? M8r : M0r)) *
                             mmi_pow2((int)sb - (int)(kx[min(xr, nx - 1)] + ew[u] + L) + 27);
            acc[u][n] += __double2ll_rn(v);
        }
    }
}

struct mmi_args {
    const uint8_t *a, *b;       /* gate and up, Q4_KT units */
    const uint8_t *ea, *eb;     /* their rows' Ew (mmi_rexp_kernel) */
    uint32_t rows, K;           /* rows of each */
    const uint8_t *x;           /* the pass's x rows in the layout above, xs bytes apart */
    uint32_t xs, nx;
    float *out;                 /* silu(g)·u of x row n at out + n·os */
    uint32_t os;
};

/* silu(g)·u of one output from the grid sums of gate and up */
__device__ __forceinline__ float mmi_silu_mul(long long gs, long long us, uint32_t sb, uint32_t eg, uint32_t eu, uint32_t L)
{
    const float y = mmi_out(gs, sb, eg, L), u = mmi_out(us, sb, eu, L);
    return y / (1.f + expf(-y)) * u; /* SiLU·up on the f32 matvec results */
}

/* ---- one or two rows: the persistent pair --------------------------------------------------------
 * MMI_PP CTAs an SM, each a contiguous range of whole tiles (as the workbench's mmq_pair_persist, bench/kernels/mpp.cuh); items (tile, block)
 * in tile-major order, warp w taking items u0 + w, u0 + w + 8, …, the gate and up units of one block
 * against x loaded once. A lane's grid sums of a tile go to shared memory by integer atomics when its
 * next item is in another tile (any order: the same sums). */
#define MMI_PP 2
static __global__ void __launch_bounds__(256, MMI_PP) mmi_pair_persist(const mmi_args A, uint32_t grid)
{
    CU_TL_SCOPE(TL_MMQ_PAIR);
    extern __shared__ long long mpr[]; /* [tile of the CTA][x row 0..1][gate, up][16] */
    cu_pdl_trigger();
    const uint32_t wid = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const uint32_t nb = A.K / 256, ntile = A.rows / 16, L = mmi_lbits(nb);
    const uint32_t t0 = (uint32_t)((uint64_t)blockIdx.x * ntile / grid);
    const uint32_t t1 = (uint32_t)((uint64_t)(blockIdx.x + 1) * ntile / grid);
    const uint32_t u1 = t1 * nb, xr = t >> 1, row16 = g + 8 * (t & 1);
    uint32_t u = t0 * nb + wid;
    mmi_w W[2]; /* the first item's weights are in flight while the sums are zeroed */
    if (u < u1) {
        mmi_load(A.a + (size_t)u * MMQ_UNIT, lane, W[0]);
        mmi_load(A.b + (size_t)u * MMQ_UNIT, lane, W[1]);
    }
    for (uint32_t i = threadIdx.x; i < (t1 - t0) * 64; i += blockDim.x) mpr[i] = 0;
    cu_pdl_wait();
    __shared__ uint32_t kx[2]; /* Sb of x rows 0 and 1: warps 0 and 1 */
    if (wid < 2 && wid < A.nx) {
        const uint32_t v = mmi_row_sb(A.x + (size_t)wid * A.xs, nb, lane);
        if (lane == 0) kx[wid] = v;
    }
    __syncthreads();
    uint32_t key = 0xFFFFFFFFu, ew[2] = {0, 0};
    long long acc[2][1] = {{0}, {0}};
    for (; u < u1; u += 8) {
        const uint32_t tile = u / nb, b = u - tile * nb;
        if (tile != key) {
            if (key != 0xFFFFFFFFu && xr < A.nx)
#pragma unroll
                for (int r = 0; r < 2; r++) atomicAdd((unsigned long long *)&mpr[(((key - t0) * 2 + xr) * 2 + r) * 16 + row16],
                                                      (unsigned long long)acc[r][0]);
            acc[0][0] = acc[1][0] = 0;
            key = tile;
            ew[0] = A.ea[tile * 16 + row16];
            ew[1] = A.eb[tile * 16 + row16];
        }
        mmi_block<1, 2>(W, A.x + (size_t)b * MMI_XBLK, A.xs, A.nx, lane, kx, ew, L, acc);
        if (u + 8 < u1) { /* the next item's weights, in flight through the next turn */
            mmi_load(A.a + (size_t)(u + 8) * MMQ_UNIT, lane, W[0]);
            mmi_load(A.b + (size_t)(u + 8) * MMQ_UNIT, lane, W[1]);
        }
    }
    if (key != 0xFFFFFFFFu && xr < A.nx)
#pragma unroll
        for (int r = 0; r < 2; r++)
            atomicAdd((unsigned long long *)&mpr[(((key - t0) * 2 + xr) * 2 + r) * 16 + row16], (unsigned long long)acc[r][0]);
    __syncthreads();
    for (uint32_t i = threadIdx.x; i < (t1 - t0) * 16 * A.nx; i += blockDim.x) {
        const uint32_t n = i / ((t1 - t0) * 16), tl = i % ((t1 - t0) * 16) / 16, r16 = i % 16, row = (t0 + tl) * 16 + r16;
        const long long *m = mpr + ((tl * 2 + n) * 2) * 16 + r16;
        A.out[(size_t)n * A.os + row] = mmi_silu_mul(m[0], m[16], kx[n], A.ea[row], A.eb[row], L);
    }
}

/* ---- three to sixteen rows: a CTA per KW-split tile pair -------------------------------------------
 * 8 warps: 8 / KW sets of KW warps (warp kw of a set takes blocks kw, kw + KW, …). NU 1: set s the
 * gate (s even) or up (s odd) unit of tile pair s / 2; NU 2: set s both units of its tile, against x
 * loaded once. A warp does NT n-tiles (2 x rows each); a group of 2·NT x rows a CTA, the groups of a
 * tile range in consecutive CTAs (the later ones read the weights from L2). */
template <int NT, int KW, int MINB, int NU = 1>
static __global__ void __launch_bounds__(256, MINB) mmi_pair_rows(const mmi_args A)
{
    CU_TL_SCOPE(TL_MMQ_PAIR);
    cu_pdl_trigger(); /* weights first, then wait for x */
    constexpr int SETS = 8 / KW, TPC = NU == 2 ? SETS : SETS / 2;
    __shared__ long long red[SETS][KW][NU][NT][32];
    const uint32_t warp = threadIdx.x >> 5, lane = threadIdx.x & 31, kw = warp % KW, set = warp / KW, g = lane >> 2, t = lane & 3;
    const uint32_t ngrp = (A.nx + 2 * NT - 1) / (2 * NT), grp = blockIdx.x % ngrp;
    const uint32_t nb = A.K / 256, x0 = grp * 2 * NT, nx = A.nx - x0, ntile = A.rows / 16, L = mmi_lbits(nb);
    uint32_t tile = blockIdx.x / ngrp * TPC + (NU == 2 ? set : set / 2);
    const bool live = tile < ntile;
    if (!live) tile = ntile - 1; /* the last CTA's later tiles: recompute, store nothing */
    const uint8_t *unit[NU];
    uint32_t ew[NU];
    const uint32_t row = tile * 16 + g + 8 * (t & 1);
#pragma unroll
    for (int u = 0; u < NU; u++) {
        const bool up = NU == 2 ? u == 1 : (set & 1);
        unit[u] = (up ? A.b : A.a) + ((size_t)tile * nb + kw) * MMQ_UNIT;
        ew[u] = (up ? A.eb : A.ea)[row];
    }
    const uint8_t *xb = A.x + (size_t)x0 * A.xs + (size_t)kw * MMI_XBLK;
    long long acc[NU][NT];
#pragma unroll
    for (int u = 0; u < NU; u++)
#pragma unroll
        for (int n = 0; n < NT; n++) acc[u][n] = 0;
    mmi_w W[NU];
    if (kw < nb)
#pragma unroll
        for (int u = 0; u < NU; u++) mmi_load(unit[u], lane, W[u]);
    cu_pdl_wait();
    __shared__ uint32_t kx[2 * NT]; /* Sb of the group's x rows, a warp per row */
    for (uint32_t r = warp; r < 2 * NT; r += 8)
        if (r < nx) {
            const uint32_t v = mmi_row_sb(A.x + (size_t)(x0 + r) * A.xs, nb, lane);
            if (lane == 0) kx[r] = v;
        }
    __syncthreads();
    for (uint32_t b = kw; b < nb; b += KW) {
        mmi_block<NT, NU>(W, xb, A.xs, nx, lane, kx, ew, L, acc);
        if (b + KW >= nb) break;
        xb += (size_t)KW * MMI_XBLK;
#pragma unroll
        for (int u = 0; u < NU; u++) {
            unit[u] += (size_t)KW * MMQ_UNIT;
            mmi_load(unit[u], lane, W[u]);
        }
    }
#pragma unroll
    for (int u = 0; u < NU; u++)
#pragma unroll
        for (int n = 0; n < NT; n++) red[set][kw][u][n][lane] = acc[u][n];
    __syncthreads();
    /* warp 0 of the set holding up sums the KW warps of gate and up (integers: any order) and stores
     * silu(g)·u */
    if (kw != 0 || (NU == 1 && !(set & 1)) || !live) return;
    const uint32_t gs_set = NU == 2 ? set : set - 1, gu = 0, uu = NU == 2 ? 1 : 0;
    const uint32_t eg = A.ea[row], eu = A.eb[row];
#pragma unroll
    for (int n = 0; n < NT; n++) {
        const uint32_t xr = 2 * n + (t >> 1);
        long long gs = 0, us = 0;
#pragma unroll
        for (int k = 0; k < KW; k++) {
            gs += red[gs_set][k][gu][n][lane];
            us += red[set][k][uu][n][lane];
        }
        if (xr < nx) A.out[(size_t)(x0 + xr) * A.os + row] = mmi_silu_mul(gs, us, kx[xr], eg, eu, L);
    }
}

/* One launch of mmi_pair_rows over A.nx x rows (groups of 2·NT) */
template <int NT, int KW, int MINB, int NU>
static inline void mmi_rows_launch(const mmi_args &A, cudaStream_t st, bool pdl)
{
    constexpr uint32_t TPC = NU == 2 ? 8 / KW : 4 / KW;
    cudaLaunchAttribute at[1];
    const uint32_t ntile = A.rows / 16, ngrp = (A.nx + 2 * NT - 1) / (2 * NT);
    const cudaLaunchConfig_t cfg = cu_pdl_cfg(dim3((ntile + TPC - 1) / TPC * ngrp), dim3(256), st, pdl, at);
    cudaLaunchKernelEx(&cfg, mmi_pair_rows<NT, KW, MINB, NU>, A);
}

/* The pair over A.nx (1 ≤ nx) x rows: the persistent kernel for one or two rows (where its CTAs'
 * sums fit shared memory), else n-tiles for the rows (groups of 16 beyond). Every choice gives a row
 * the same bytes (the grid sums). */
static inline void mmi_pair_launch(const mmi_args &A, int n_sm, cudaStream_t st, bool pdl)
{
    const uint32_t ntile = A.rows / 16, grid = (uint32_t)n_sm * MMI_PP, most = (ntile + grid - 1) / grid;
    const size_t smem = (size_t)most * 64 * sizeof(long long);
    if (A.nx <= 2 && smem <= 48 * 1024) {
        cudaLaunchAttribute at[1];
        cudaLaunchConfig_t cfg = cu_pdl_cfg(dim3(grid), dim3(256), st, pdl, at);
        cfg.dynamicSmemBytes = smem;
        cudaLaunchKernelEx(&cfg, mmi_pair_persist, A, grid);
        return;
    }
    /* kbench_pair's fastest shape per row count (H100): 3–4 rows 62 µs, 5–8 91, 9–16 153 (two
     * groups of 8 rows in consecutive CTAs) */
    if (A.nx <= 2) mmi_rows_launch<1, 4, 3, 1>(A, st, pdl);
    else if (A.nx <= 4) mmi_rows_launch<2, 4, 2, 1>(A, st, pdl);
    else if (A.nx <= 8) mmi_rows_launch<2, 4, 2, 2>(A, st, pdl);
    else mmi_rows_launch<4, 2, 2, 1>(A, st, pdl);
}

#endif
