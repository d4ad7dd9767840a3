/* mmqd6.cuh — the Q6_K matvec of a multi-row pass on tensor cores, x rows as the mma's columns.
 *
 * mmq6.cuh gives each x row its own m16n8k32: k = the 32 positions of a chunk, column 4h + d =
 * digit d of 16-group h, zero on the other half, so half of the products are zero and each row
 * costs the whole mma and fold work again. Here the columns are the rows: per chunk and 16-group
 * h one m16n8k16 takes the 16 weight rows × 16 positions (A = mmq6's a0, a1 for h = 0, a2, a3 for
 * h = 1: the same registers, the same decode) against 2 x rows × 4 digits; every product is used,
 * and a chunk's decode and scales serve every row of the CTA.
 *
 * Same bits as mmq6_block (row invariance, docs/routes.md). The C lane (g, t) of such an mma holds
 * rows g, g + 8 × columns 2t, 2t + 1 = x row 2m + (t >> 1), digits 2(t & 1), 2(t & 1) + 1: the
 * same integers lo = c0 + 2^7·c1 (t even) or hi (t odd) that mmq6's lane 2h + (t & 1) holds for
 * 16-group h, exact either way. Every operation after them is mmq6_block's, in its order, with
 * explicit roundings: s_eff·L (L the exact integer as f32, s_eff the same s/4 or s·2^12), the f32
 * chain sc·(s_eff·L) over the 8 chunks (a product first, then fused multiply-adds), d·part added
 * into an f64 sum per (row, 16-group, digit pair) over the warp's blocks kw, kw + KW, … in order
 * (the KW of the one-row launch of the same matrix: mmqd6_launch_down, mmqd6_launch_auto), then
 * ((lo₀ + hi₀) + (lo₁ + hi₁)) over the 16-groups — mmq_rows_f64's butterfly — and the KW warps in
 * f64 in warp order, one rounding to f32 per output.
 *
 * The exact sums become floats without I2F: the mma's accumulator starts at 0x4B400000
 * (1.5·2^23 as f32), so each c_k read as a float is 1.5·2^23 + c_k exactly (|c_k| < 2^18), and
 * L = (128·f1 − 129·1.5·2^23) + f0 = c0 + 128·c1 with both roundings exact (a multiple of 2^9
 * below 2^26, then a multiple of 4 below 2^25): the value mmq6 gets from I2F, so the same bits.
 *
 * Weights: the Q6_KT units as mmq6 loads them (the lane's six q planes and its d word), and both
 * halves' 16 scale bytes of its row pair. x (mmqd6_prep_warp): per row and block, 8 chunks × 4
 * digits × 4 lanes t of 8 B — the words of 16-groups 0 and 1, each the digit of positions
 * 16h + 4t … + 3 — then mmq6's s_eff[2][8]: MMQD6_XBLK bytes, against MMQ6_XBLK. */
#ifndef MUSER_CUDA_MMQD6_CUH
#define MUSER_CUDA_MMQD6_CUH

#include "cuda/mmq6.cuh"
#include "cuda/mmqd.cuh"

#define MMQD6_XBLK 1088u /* x bytes of one row's block */
#define MMQD6_XS 1024u   /* s_eff[2][8] within it */

static inline size_t mmqd6_x_bytes(uint32_t K) { return (size_t)K / 256 * MMQD6_XBLK; }

/* One 32-group (chunk c of block b) of one row's x: lane e holds v = x[p], p = 256b + 32c + e;
 * all 32 lanes call it. The same s, X and digits as mmq6_prep_warp; lane i of each 4-lane group
 * (positions 16h + 4t … + 3) writes digit i of the four. */
__device__ __forceinline__ void mmqd6_prep_warp(float v, uint32_t p, uint8_t *__restrict__ buf)
{
    const uint32_t e = p & 31, c = (p >> 5) & 7;
    uint8_t *blk = buf + (size_t)(p >> 8) * MMQD6_XBLK;
    float s;
    const uint32_t w = mmq6_digit_word(v, e, &s);
    const uint32_t i = e & 3, h = e >> 4, t = (e >> 2) & 3;
    *(uint32_t *)(blk + ((c * 4 + i) * 4 + t) * 8 + 4 * h) = w;
    if (e == 0) {
        float *se = (float *)(blk + MMQD6_XS);
        se[c] = s * 0.25f;      /* as mmq6_prep_warp */
        se[8 + c] = s * 4096.f;
    }
}

struct mmqd6_prep {
    static constexpr int tag = TL_MMQ6_PREP;
    static __device__ __forceinline__ void write(float v, uint32_t p, uint8_t *buf) { mmqd6_prep_warp(v, p, buf); }
};

/* A tile's unit for one block: mmq6's q planes and d word, and the row pair's scales of both
 * halves (sc[h] byte 2c + r: row g + 8r, 16-group 2c + h). */
struct mmqd6_w {
    uint4 q[6];
    uint4 sc[2];
    uint32_t d;
};
/* q: the lane's 16 bytes of plane 0 (unit + 16·lane); so: the row pair's scales minus that */
__device__ __forceinline__ void mmqd6_load(const uint8_t *q, int32_t so, int32_t dof, mmqd6_w &W)
{
#pragma unroll
    for (int u = 0; u < 6; u++) W.q[u] = cu_ldw(q + u * 512);
    W.sc[0] = cu_ldw(q + so);
    W.sc[1] = cu_ldw(q + so + 16);
    W.d = cu_ldw32(q + dof);
}

/* m16n8k16 s8 × s8 with the accumulator starting at c_in */
__device__ __forceinline__ void mmqd6_mma(int c[4], uint32_t a0, uint32_t a1, uint32_t b, int c_in)
{
    asm("mma.sync.aligned.m16n8k16.row.col.s32.s8.s8.s32 {%0, %1, %2, %3}, {%4, %5}, {%6}, {%7, %7, %7, %7};"
        : "=r"(c[0]), "=r"(c[1]), "=r"(c[2]), "=r"(c[3])
        : "r"(a0), "r"(a1), "r"(b), "r"(c_in));
}

#define MMQD6_MAGIC 0x4B400000 /* 1.5·2^23 as f32 bits */
/* c0 + 128·c1 as f32 from two accumulators that started at MMQD6_MAGIC: exact (header) */
__device__ __forceinline__ float mmqd6_pair(int c0, int c1)
{
    return __fadd_rn(__fmaf_rn(128.f, __int_as_float(c1), -1623195648.f), __int_as_float(c0));
}

/* One block of one tile for NP pairs of x rows: acc[m][h][r] += d_r·part, part = lane (g, t)'s
 * chain of mmq6_block for row g + 8r, 16-group half h, digit pair t & 1, x row 2m + (t >> 1).
 * xb: row 0's block, xs: bytes between rows, nx: rows that exist (the rest read row nx − 1 and
 * are never stored). */
template <int NP>
__device__ __forceinline__ void mmqd6_block(const mmqd6_w &W, const uint8_t *xb, uint32_t xs, uint32_t nx, uint32_t lane,
                                            double acc[NP][2][2])
{
    const uint32_t g = lane >> 2, t = lane & 3;
    uint32_t oq[NP], oe[NP]; /* 32-bit offsets from xb (16 rows of any K the route takes) */
#pragma unroll
    for (int m = 0; m < NP; m++) {
        uint32_t rb = 2 * m + (g >> 2), ro = 2 * m + (t >> 1); /* B's x row, the lane's own */
        rb = rb < nx ? rb : nx - 1;
        ro = ro < nx ? ro : nx - 1;
        oq[m] = rb * xs + ((g & 3) * 4 + t) * 8;
        oe[m] = ro * xs + MMQD6_XS + 32 * (t & 1);
    }
    float part[NP][2][2];
#pragma unroll
    for (int j = 0; j < 4; j++) { /* chunk pairs: one s_eff load for both */
        float2 se[NP];
#pragma unroll
        for (int m = 0; m < NP; m++) se[m] = cu_ldx<float2>(xb + oe[m] + 8 * j);
#pragma unroll
        for (int c2 = 0; c2 < 2; c2++) {
            const int c = 2 * j + c2;
            uint2 B[NP]; /* digit g & 3 of x row 2m + (g >> 2), 16-groups 0 and 1 */
#pragma unroll
            for (int m = 0; m < NP; m++) B[m] = cu_ldx<uint2>(xb + oq[m] + c * 128);
            uint32_t a[4];
            mmq6_decode(cu_word(W.q[c >> 2], c & 3), cu_word(W.q[2 + (c >> 2)], c & 3), cu_word(W.q[4 + (c >> 2)], c & 3), a);
#pragma unroll
            for (int h = 0; h < 2; h++) {
                const uint32_t sw = cu_word(W.sc[h], j);
                const float sg = mmq6_s8f(sw, 2 * c2), sg8 = mmq6_s8f(sw, 2 * c2 + 1);
#pragma unroll
                for (int m = 0; m < NP; m++) {
                    int C[4];
                    mmqd6_mma(C, a[2 * h], a[2 * h + 1], h ? B[m].y : B[m].x, MMQD6_MAGIC);
                    const float s = c2 ? se[m].y : se[m].x;
                    const float vg = __fmul_rn(s, mmqd6_pair(C[0], C[1]));
                    const float vg8 = __fmul_rn(s, mmqd6_pair(C[2], C[3]));
                    part[m][h][0] = c == 0 ? __fmul_rn(sg, vg) : __fmaf_rn(sg, vg, part[m][h][0]);
                    part[m][h][1] = c == 0 ? __fmul_rn(sg8, vg8) : __fmaf_rn(sg8, vg8, part[m][h][1]);
                }
            }
        }
    }
    const float2 d = __half22float2(*(const __half2 *)&W.d);
#pragma unroll
    for (int m = 0; m < NP; m++)
#pragma unroll
        for (int h = 0; h < 2; h++) {
            acc[m][h][0] = __fma_rn((double)d.x, (double)part[m][h][0], acc[m][h][0]);
            acc[m][h][1] = __fma_rn((double)d.y, (double)part[m][h][1], acc[m][h][1]);
        }
}

/* mmq6_body (R = 1) with mmqd6_block: NW warps, KW of them splitting the blocks of each of the
 * CTA's NW / KW tiles as the one-row launch does; NP pairs of x rows (row group grp, mmq_group). */
template <int KW, int NW, int NP>
__device__ __forceinline__ void mmqd6_body(const mmq6_args &A0, uint32_t cta, uint32_t grp)
{
    constexpr int SETS = NW / KW, NX = 2 * NP;
    cu_pdl_trigger(); /* weights first, then wait for x */
    __shared__ double red[NX][NW][16];
    mmq6_args A = A0;
    const uint32_t nx = mmq_group<mmq6_args, NX>(A, grp);
    const uint32_t wid = threadIdx.x >> 5, lane = threadIdx.x & 31, kw = wid % KW, set = wid / KW;
    const uint32_t nb = A.K / 256, ntile = A.rows / 16, g = lane >> 2, t = lane & 3;
    uint32_t tile = cta * SETS + set;
    if (tile >= ntile) tile = ntile - 1; /* tail: recompute, store once */
    const uint8_t *q = A.a + ((size_t)tile * nb + kw) * MMQ6_UNIT + 16 * lane;
    const int32_t so = (int32_t)(MMQ6_SC + 32 * g) - (int32_t)(16 * lane), dof = (int32_t)(MMQ6_D + 4 * g) - (int32_t)(16 * lane);
    double acc[NP][2][2];
#pragma unroll
    for (int m = 0; m < NP; m++) acc[m][0][0] = acc[m][0][1] = acc[m][1][0] = acc[m][1][1] = 0.0;
    uint32_t xo = kw * MMQD6_XBLK;
    mmq_walk<1, KW, false, mmqd6_w>(
        kw, nb, [&](mmqd6_w *W, int ahead) { mmqd6_load(q + (size_t)ahead * KW * MMQ6_UNIT, so, dof, W[0]); },
        [&](const mmqd6_w *W) { mmqd6_block<NP>(W[0], A.x + xo, A.xs, nx, lane, acc); },
        [&]() {
            q += (size_t)KW * MMQ6_UNIT;
            xo += KW * MMQD6_XBLK;
        },
        mmq_pdl_wait());
    /* the lanes of a row: (lo + hi) of each 16-group across lanes t, t ^ 1, then group 0 + group 1
     * (mmq_rows_f64's order) */
#pragma unroll
    for (int m = 0; m < NP; m++) {
        const uint32_t n = 2 * m + (t >> 1);
#pragma unroll
        for (int r = 0; r < 2; r++) {
            const double v0 = acc[m][0][r] + __shfl_xor_sync(0xFFFFFFFFu, acc[m][0][r], 1);
            const double v1 = acc[m][1][r] + __shfl_xor_sync(0xFFFFFFFFu, acc[m][1][r], 1);
            if ((t & 1) == 0 && n < nx) red[n][wid][g + 8 * r] = v0 + v1;
        }
    }
    __syncthreads();
    mmqd_store<KW, SETS>(red, nx, cta, ntile, A.op, A.scale, A.cap, A.out, A.os);
}

template <int KW, int NW, int NP, int MINB>
__global__ void __launch_bounds__(NW * 32, MINB) mmqd6_kernel(const mmq6_args A)
{
    CU_TL_SCOPE(TL_MMQ6);
    mmqd6_body<KW, NW, NP>(A, mmq_cta(A.ng), mmq_grp(A.ng));
}

/* x rows per CTA of a dense launch: 2 or 4, more rows as more row groups (mmq_cta). 8 rows a CTA
 * (four pairs' sums, 208 registers unbounded) spilled at the 128 that 16 warps per SM allow, also
 * as two passes of two pairs. */
static inline uint32_t mmqd6_nx_of(uint32_t nx) { return nx <= 2 ? 2 : 4; }

/* A.nx > 1 rows, x in mmqd6's layout A.xs apart; KW and the tiles per CTA (NW / KW) as the one-row
 * launch of the same matrix; MINB CTAs per SM (the registers: ≤ 128 a thread at 4 warps × 4). */
template <int KW, int NW, int MINB>
static cudaError_t mmqd6_launch(const mmq6_args &A0, cudaStream_t st, bool pdl)
{
    const uint32_t ntile = A0.rows / 16, NXL = mmqd6_nx_of(A0.nx), tpc = NW / KW;
    mmq6_args A = A0;
    A.ng = (A.nx + NXL - 1) / NXL;
    cudaLaunchAttribute at[1];
    const cudaLaunchConfig_t cfg = cu_pdl_cfg(dim3((ntile + tpc - 1) / tpc * A.ng), dim3(NW * 32), st, pdl, at);
    if (NXL == 2) return cudaLaunchKernelEx(&cfg, mmqd6_kernel<KW, NW, 1, MINB>, A);
    return cudaLaunchKernelEx(&cfg, mmqd6_kernel<KW, NW, 2, MINB>, A);
}

/* ffn_down: KW 4 as mmq6_launch_down (one tile per CTA of 4 warps) */
static inline cudaError_t mmqd6_launch_down(const mmq6_args &A, cudaStream_t st, bool pdl)
{
    return mmqd6_launch<4, 4, 4>(A, st, pdl);
}
/* every other shape: KW as mmq6_launch_auto's (the head KW 2, the rest KW 8), 8 warps a CTA */
static inline cudaError_t mmqd6_launch_auto(const mmq6_args &A, cudaStream_t st, bool pdl)
{
    if (A.rows / 16 >= 4096) return mmqd6_launch<2, 8, 2>(A, st, pdl);
    return mmqd6_launch<8, 8, 2>(A, st, pdl);
}

/* ---- the attention projections with a Q6_K v, several rows: one launch ----------------------- */
/* mmq_stack_v for a multi-row pass, both dense: CTAs [0, nv·V.ng) take v's tiles (mmqd6_body, KW 8
 * as mmq_stack_v's v; one pair of rows per CTA, row group b % V.ng: with two pairs the kernel
 * spilled at 128 registers), the rest the stack's (mmqd_body, KW 8 as its mmq_body; one quad of
 * rows per CTA). */
static __global__ void __launch_bounds__(256, 2) mmqd_stack_v(const mmq_args S, const mmq6_args V, uint32_t nv)
{
    CU_TL_SCOPE(TL_MMQ);
    const uint32_t nvb = nv * V.ng;
    if (blockIdx.x < nvb) {
        mmqd6_body<8, 8, 1>(V, blockIdx.x / V.ng, blockIdx.x % V.ng);
    } else {
        const uint32_t b = blockIdx.x - nvb;
        mmqd_body<8, 1>(S, b / S.ng, b % S.ng);
    }
}

/* S: the stack (x in mmqd's layout), V: a Q6_KT v (x in mmqd6's), MV_OP_STORE; S.nx = V.nx > 1. */
static inline void mmqd_stack_v_launch(const mmq_args &S0, const mmq6_args &V0, cudaStream_t st, bool pdl)
{
    const uint32_t nv = V0.rows / 16, ns = S0.rows / 16;
    mmq_args S = S0;
    mmq6_args V = V0;
    S.ng = (S.nx + 3) / 4;
    V.ng = (V.nx + 1) / 2;
    cudaLaunchAttribute at[1];
    const cudaLaunchConfig_t cfg = cu_pdl_cfg(dim3(nv * V.ng + ns * S.ng), dim3(256), st, pdl, at);
    cudaLaunchKernelEx(&cfg, mmqd_stack_v, S, V, nv);
}

#endif
