/* mmqd.cuh — the Q4_K matrices of a multi-row pass on tensor cores, x rows as the columns (the
 * stacked attention projections, o_proj; the gate·up pair is mmi.cuh's).
 *
 * mmq.cuh's kernels give each x row its own mma columns: 8 columns (4 sub-blocks × 2 digits) of
 * which each is non-zero on half the k, and a raw and a masked "twin" product per digit pair, so a
 * quarter of the products are useful and each extra row costs the whole mma count again. Here the
 * columns are the rows: per sub-block one m16n8k32 takes the 16 weight rows × 32 positions of that
 * sub-block (the nibbles unpacked) against 4 x rows × 2 digits, and a second one the other two
 * digits, so every product is used and 4 rows cost what 1 did.
 *
 * Same bits as mmq_block (row invariance, docs/routes.md): the products are exact integers either
 * way, so each (row, sub-block) gets the same P = Σ q·X; the fold (mmq_fold) and every sum after it
 * are the one-row kernel's, over the same blocks in the same order (mmqd_body, below).
 *
 * Weights: the Q4_KT units as they are. Lane (g, t) loads the words it loads in mmq_block: pair
 * P = 2G + (t >> 1) of group G, positions 8c + 4(t & 1) + i (c = 0..3). An mma over one pair needs
 * every lane's 8 positions of that pair, so lanes t and t ^ 2 swap the half of each group's words
 * (c = 2, 3) the other pair's mma takes; the k order inside the mma is then a fixed permutation of
 * the positions, and the x digits are stored in the same permutation (mmqd_prep_warp).
 *
 * x: per row and block, 8 sub-blocks × 4 digits × 4 lanes × 8 bytes of B fragments, then (s, S)
 * per sub-block (s the group's power of two, S = s·ΣX as mmq_prep_warp's): MMQD_XBLK bytes. */
#ifndef MUSER_CUDA_MMQD_CUH
#define MUSER_CUDA_MMQD_CUH

#include "cuda/mmq.cuh"

#define MMQD_XBLK 1088u /* x bytes of one row's block */
#define MMQD_XS 1024u   /* the (s, S) pairs within it */

static inline size_t mmqd_x_bytes(uint32_t K) { return (size_t)K / 256 * MMQD_XBLK; }

/* One 32-group (= one Q4_K sub-block j) of one row's x: lane l holds v = x[p], p = 32·(8b + j) + l;
 * all 32 lanes call it. Position l of pair P = j >> 1 sits at k 4t' + i (word 0) or 16 + 4t' + i
 * (word 1) of lane t''s fragment: l = 8q + 4e + i goes to t' = 2·(q < 2 ? π : 1 − π) + e, word q & 1
 * (π = P & 1: the lanes that hold the pair keep positions 0..15, the others get 16..31). */
__device__ __forceinline__ void mmqd_prep_warp(float v, uint32_t p, uint8_t *__restrict__ buf)
{
    const uint32_t j = (p >> 5) & 7, l = p & 31;
    float s;
    const int X = mmq_group_int(v, &s);
    uint8_t *blk = buf + (size_t)(p >> 8) * MMQD_XBLK;
    const uint32_t pi = (j >> 1) & 1, q = l >> 3, e = (l >> 2) & 1, i = l & 3;
    const uint32_t tp = 2 * (q < 2 ? pi : 1 - pi) + e, ws = q & 1;
    const int dg[4] = {X & 127, (X >> 7) & 127, (X >> 14) & 127, X >> 21};
#pragma unroll
    for (int d = 0; d < 4; d++) blk[((j * 4 + d) * 4 + tp) * 8 + ws * 4 + i] = (uint8_t)(int8_t)dg[d];
    int t = X;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) t += __shfl_xor_sync(0xFFFFFFFFu, t, o);
    if (l == 0) ((float2 *)(blk + MMQD_XS))[j] = make_float2(s, s * (float)t);
}

struct mmqd_prep {
    static constexpr int tag = TL_MMQ_PREP;
    static __device__ __forceinline__ void write(float v, uint32_t p, uint8_t *buf) { mmqd_prep_warp(v, p, buf); }
};

/* A tile's unit for one block: the qs words (as mmq_w) and the row pair's whole 32-byte header
 * (d and dmin pair, the four lanes' scale words, their min halves). */
struct mmqd_w {
    uint4 q[4];
    uint4 h0, h1;
};
__device__ __forceinline__ void mmqd_load(const uint8_t *unit, uint32_t lane, mmqd_w &W)
{
#pragma unroll
    for (int u = 0; u < 4; u++) W.q[u] = cu_ldw(unit + (u * 32 + lane) * 16);
    const uint8_t *hd = unit + 2048 + 32 * (lane >> 2);
    W.h0 = __ldg((const uint4 *)hd);
    W.h1 = __ldg((const uint4 *)(hd + 16));
}

/* x's loads: global memory through the non-coherent path, or (SM) a copy in shared memory */
template <typename T, bool SM>
__device__ __forceinline__ T mmqd_ldx(const uint8_t *p)
{
    if (SM) return *(const T *)p;
    return cu_ldx<T>(p);
}

/* One item (NU units of the same block: gate r = 0 and up r = 1, or NU = 1 tile of one matrix) for
 * NQ quads of x rows: acc[Q][r][t][half] gets lane t's fold of mmq_block for x row 4Q + (lane & 3)
 * (mmq_fold adds into it). xb: row 0's block (SM: in shared memory); xs: bytes between rows; nx:
 * rows that exist (the rest read row nx − 1 and are never stored). */
template <int NQ, int NU = 2, bool SM = false>
__device__ __forceinline__ void mmqd_block(const mmqd_w *W, const uint8_t *xb, uint32_t xs, uint32_t nx, uint32_t lane,
                                           float acc[NQ][NU][4][2])
{
    const uint32_t g = lane >> 2, t = lane & 3;
    /* the words of group G's other pair: the partner's c = 2, 3 words */
    uint4 recv[NU][2];
#pragma unroll
    for (int r = 0; r < NU; r++)
#pragma unroll
        for (int G = 0; G < 2; G++) {
            const uint4 m = W[r].q[2 * G + 1];
            recv[r][G] = make_uint4(__shfl_xor_sync(0xFFFFFFFFu, m.x, 2), __shfl_xor_sync(0xFFFFFFFFu, m.y, 2),
                                    __shfl_xor_sync(0xFFFFFFFFu, m.z, 2), __shfl_xor_sync(0xFFFFFFFFu, m.w, 2));
        }
    /* pairs in the order f = 0 (pairs 0, 2: subs 0, 1, 4, 5), f = 1 (pairs 1, 3): each lane pair's
     * folds t = 2·(t>>1)… need sub-blocks mmq_sub(t, 0) = 2f + e and mmq_sub(t, 1) = 4 + 2f + e of
     * the same f, so a half is folded as soon as its four sub-blocks are known */
#pragma unroll
    for (int f = 0; f < 2; f++) {
        float Psc[NQ][NU][2][2][2]; /* [Q][r][G][nibble e][half] */
        float Sv[NQ][2][2];        /* [Q][G][e]: S of sub 4G + 2f + e of the lane's x row */
#pragma unroll
        for (int G = 0; G < 2; G++) {
            const uint32_t P = 2 * G + f;
            uint32_t a[NU][2][4]; /* [r][nibble][4 words] */
#pragma unroll
            for (int r = 0; r < NU; r++) {
                const uint4 A = (t >> 1) == (uint32_t)f ? W[r].q[2 * G] : recv[r][G];
                const uint32_t w4[4] = {A.x, A.y, A.z, A.w};
#pragma unroll
                for (int k = 0; k < 4; k++) {
                    a[r][0][k] = w4[k] & 0x0F0F0F0Fu;
                    a[r][1][k] = (w4[k] >> 4) & 0x0F0F0F0Fu;
                }
            }
#pragma unroll
            for (int e = 0; e < 2; e++) {
                const uint32_t j = 2 * P + e; /* the sub-block: lo nibbles e = 0, hi e = 1 */
#pragma unroll
                for (int Q = 0; Q < NQ; Q++) {
                    uint32_t rb = 4 * Q + (g >> 1), ro = 4 * Q + t; /* B's row, the lane's own */
                    rb = rb < nx ? rb : nx - 1;
                    ro = ro < nx ? ro : nx - 1;
                    const uint8_t *xr = xb + (size_t)rb * xs + ((j * 4 + (g & 1)) * 4 + t) * 8;
                    const uint2 b01 = mmqd_ldx<uint2, SM>(xr), b23 = mmqd_ldx<uint2, SM>(xr + 64);
                    const float2 sS = mmqd_ldx<float2, SM>(xb + (size_t)ro * xs + MMQD_XS + 8 * j);
                    Sv[Q][G][e] = sS.y;
#pragma unroll
                    for (int r = 0; r < NU; r++) {
                        int C1[4] = {0, 0, 0, 0}, C2[4] = {0, 0, 0, 0};
                        mmq_mma(C1, a[r][e][0], a[r][e][1], a[r][e][2], a[r][e][3], b01.x, b01.y);
                        mmq_mma(C2, a[r][e][0], a[r][e][1], a[r][e][2], a[r][e][3], b23.x, b23.y);
                        Psc[Q][r][G][e][0] = __fmul_rn(mmq_p(C1[0], C1[1], C2[0], C2[1]), sS.x);
                        Psc[Q][r][G][e][1] = __fmul_rn(mmq_p(C1[2], C1[3], C2[2], C2[3]), sS.x);
                    }
                }
            }
        }
        /* fold t = 2e + f: its sub-blocks mmq_sub(t, G) = 4G + 2f + e */
#pragma unroll
        for (int e = 0; e < 2; e++) {
            const int tf = 2 * e + f;
#pragma unroll
            for (int r = 0; r < NU; r++) {
                const mmqd_w &U = W[r];
                const uint32_t scw = tf == 0 ? U.h0.z : tf == 1 ? U.h0.w : tf == 2 ? U.h1.x : U.h1.y;
                const uint32_t mh = ((tf >> 1 ? U.h1.w : U.h1.z) >> (16 * (tf & 1))) & 0xFFFFu;
                const uint2 dd = make_uint2(U.h0.x, U.h0.y);
#pragma unroll
                for (int Q = 0; Q < NQ; Q++) {
                    const float ps[2][2] = {{Psc[Q][r][0][e][0], Psc[Q][r][0][e][1]},
                                            {Psc[Q][r][1][e][0], Psc[Q][r][1][e][1]}};
                    mmq_fold(scw, mh, dd, ps, Sv[Q][0][e], Sv[Q][1][e], acc[Q][r][tf]);
                }
            }
        }
    }
}

/* ---- one matrix ------------------------------------------------------------------------------ */
/* mmq_body (one matrix) with mmqd_block for NQ quads of x rows (row group grp, mmq_group): one tile
 * per warp, KW warps splitting the blocks of each of the CTA's 8 / KW tiles as the one-row launch of
 * the same matrix does (mmqd_launch_auto), so each output's sum is mmq_body's: a lane's fold added
 * in f32 over its warp's blocks kw, kw + KW, … in order (mmq_block's acc), ((t0 + t1) + (t2 + t3))
 * over the four folds in f64 (mmq_rows_f64's order), the KW warps in f64 in warp order. */

/* The dense kernels' epilogue (mmqd_body, mmqd6_body): per x row n < nx and output tile of the
 * CTA's SETS sets, its KW warps' f64 sums in warp order, one rounding to f32, then the LM head's
 * scale and cap (MV_OP_SOFTCAP, as the one-row kernels), stored at out + n·os. */
template <int KW, int SETS, int NX, int NWR>
__device__ __forceinline__ void mmqd_store(const double (&red)[NX][NWR][16], uint32_t nx, uint32_t cta, uint32_t ntile,
                                           uint32_t op, float scale, float cap, float *out, uint32_t os)
{
    for (uint32_t i = threadIdx.x; i < nx * (uint32_t)(SETS * 16); i += blockDim.x) {
        const uint32_t n = i / (SETS * 16), st = i % (SETS * 16) / 16, row16 = i % 16, ot = cta * SETS + st;
        if (ot >= ntile) continue;
        double ys = 0;
        for (int k = 0; k < KW; k++) ys += red[n][st * KW + k][row16];
        float y = (float)ys;
        if (op == MV_OP_SOFTCAP) {
            y = y * scale;
            if (cap > 0.f) y = cap * tanhf(y / cap);
        }
        out[(size_t)n * os + (size_t)ot * 16 + row16] = y;
    }
}
/* mmqd_body's end (all threads): each lane's four folds of a row added ((t0 + t1) + (t2 + t3)) in f64
 * (mmq_rows_f64's order) into red[row][warp], then mmqd_store */
template <int KW, int NQ>
__device__ __forceinline__ void mmqd_end(const float (&acc)[NQ][1][4][2], double (&red)[4 * NQ][8][16], const mmq_args &A,
                                         uint32_t nx, uint32_t cta)
{
    const uint32_t wid = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
#pragma unroll
    for (int Q = 0; Q < NQ; Q++) {
        const uint32_t n = 4 * Q + t;
#pragma unroll
        for (int h = 0; h < 2; h++) {
            const double v = ((double)acc[Q][0][0][h] + (double)acc[Q][0][1][h]) + ((double)acc[Q][0][2][h] + (double)acc[Q][0][3][h]);
            if (n < nx) red[n][wid][g + 8 * h] = v;
        }
    }
    __syncthreads();
    mmqd_store<KW, 8 / KW>(red, nx, cta, A.rows / 16, A.op, A.scale, A.cap, A.out, A.os);
}
template <int KW, int NQ>
__device__ __forceinline__ void mmqd_body(const mmq_args &A0, uint32_t cta, uint32_t grp)
{
    constexpr int SETS = 8 / KW, NX = 4 * NQ;
    cu_pdl_trigger(); /* weights first, then wait for x */
    __shared__ double red[NX][8][16];
    mmq_args A = A0;
    const uint32_t nx = mmq_group<mmq_args, NX>(A, grp);
    const uint32_t wid = threadIdx.x >> 5, lane = threadIdx.x & 31, kw = wid % KW, set = wid / KW;
    const uint32_t nb = A.K / 256, ntile = A.rows / 16;
    uint32_t tile = cta * SETS + set;
    if (tile >= ntile) tile = ntile - 1; /* tail: recompute, store once */
    const uint8_t *unit = A.a + ((size_t)tile * nb + kw) * MMQ_UNIT;
    float acc[NQ][1][4][2];
#pragma unroll
    for (int Q = 0; Q < NQ; Q++)
#pragma unroll
        for (int k = 0; k < 4; k++) acc[Q][0][k][0] = acc[Q][0][k][1] = 0.f;
    const uint8_t *xb = A.x + (size_t)kw * MMQD_XBLK;
    mmq_walk<1, KW, false, mmqd_w>(
        kw, nb, [&](mmqd_w *W, int ahead) { mmqd_load(unit + (size_t)ahead * KW * MMQ_UNIT, lane, W[0]); },
        [&](const mmqd_w *W) { mmqd_block<NQ, 1>(W, xb, A.xs, nx, lane, acc); },
        [&]() {
            unit += (size_t)KW * MMQ_UNIT;
            xb += (size_t)KW * MMQD_XBLK;
        },
        mmq_pdl_wait());
    mmqd_end<KW, NQ>(acc, red, A, nx, cta);
}

template <int KW, int NQ, int MINB>
static __global__ void __launch_bounds__(256, MINB) mmqd_kernel(const mmq_args A)
{
    CU_TL_SCOPE(TL_MMQ);
    mmqd_body<KW, NQ>(A, mmq_cta(A.ng), mmq_grp(A.ng));
}

/* One matrix of A.nx > 1 rows (x in mmqd's layout, A.xs apart), not the SiLU pair: KW as
 * mmq_launch_auto's for the same shape (LM-head-sized launches KW 2, the rest KW 8); one quad of
 * rows per CTA (128 registers, 2 CTAs per SM; two quads take 228, one CTA per SM), more rows as
 * row groups. */
static inline void mmqd_launch_auto(const mmq_args &A0, cudaStream_t st, bool pdl)
{
    const uint32_t ntile = A0.rows / 16, tpc = A0.rows >= 65536 ? 4 : 1;
    mmq_args A = A0;
    A.ng = (A.nx + 3) / 4;
    cudaLaunchAttribute at[1];
    const cudaLaunchConfig_t cfg = cu_pdl_cfg(dim3((ntile + tpc - 1) / tpc * A.ng), dim3(256), st, pdl, at);
    if (A.rows >= 65536) cudaLaunchKernelEx(&cfg, mmqd_kernel<2, 1, 2>, A);
    else cudaLaunchKernelEx(&cfg, mmqd_kernel<8, 1, 2>, A);
}

#endif
