/* mmq.cuh — the Q4_K matvec on tensor cores (mma.sync m16n8k32 u8 × s8 → s32).
 *
 * Numerics (docs/numerics.md): per 32-group of x a power of two s and X = rint(x/s), a 24-bit
 * integer (mmq_group_int), split into four signed-byte digits X = e0 + 2^7·e1 + 2^14·e2 + 2^21·e3
 * (e0..e2 in [0,127], e3 in [-4,3]) so that every digit is an s8. Σ q·X over a (row, sub-block) is
 * exact in int32 per digit and combined in f32 with one rounding; then the block's
 * d·Σ sc·s·P − dmin·Σ m·S in f32, and the sums over blocks, lanes and warps in f64 in a fixed
 * order, one rounding per output. The prototype, its layouts and numbers: bench/kernels/mma.cu and
 * bench/kernels/NOTES.md ("mma").
 *
 * Weights: MV_T_Q4_KT, repacked at upload into units of (16-row tile, block), 2304 bytes (the
 * GGUF 144 bytes per block). x: mmq_prep / mmq_prep_warp, 2240 bytes per 256 elements.
 * Launches: CTAs of 8 warps; KW warps split the blocks of the same tiles and sum in fixed order
 * (replays are bit-identical); R tiles of 16 rows per warp. One matrix (the stacked attention
 * projections, o_proj, a Q4_K down, a Q4_K LM head with scale and soft cap), or the gate·up pair
 * writing silu(g)·u as pair-units one CTA per 8 tiles (the workbench's; the route's gate·up pair is
 * mmi.cuh's, and this file's persistent pair is bench/kernels/mpp.cuh). */
#ifndef MUSER_CUDA_MMQ_CUH
#define MUSER_CUDA_MMQ_CUH

#include "cuda/launch.cuh"
#include "cuda/matvec.cuh"

/* ---- x as exact integers ---------------------------------------------------------------------- */
/* The group's power-of-two scale *s and this lane's X = rint(v/s), 24-bit signed; all 32 lanes of
 * the 32-group call it (mmq_prep_warp and mmq6_prep_warp share it: the same integers). With
 * 2^(e−1) ≤ max|x| < 2^e over the group, s = 2^(e−23) and |x − s·X| ≤ s/2 = 2^−24·2^e: the
 * rounding an f32 sum of magnitude max|x| makes anyway. Inf or NaN in the group makes s NaN, so
 * every output that reads it is NaN (fail closed). */
__device__ __forceinline__ int mmq_group_int(float v, float *s_out)
{
    const uint32_t mx = __reduce_max_sync(0xFFFFFFFFu, __float_as_uint(v) & 0x7FFFFFFFu);
    float s;
    int X = 0;
    if (mx >= 0x7F800000u) {
        s = __int_as_float(0x7FC00000); /* Inf or NaN in the group: every dot reading it is NaN */
    } else if (mx == 0) {
        s = 1.f;
    } else {
        /* max|x| < 2^(eb-126) with eb its biased exponent; s = 2^(eb-126-23), at least 2^-126 */
        int eb = (int)(mx >> 23);
        if (eb < 23) eb = 23;
        s = __int_as_float((eb - 22) << 23);
        const float inv = __int_as_float((149 - eb + 127) << 23);
        X = __float2int_rn(v * inv);
        X = max(-8388607, min(8388607, X));
    }
    *s_out = s;
    return X;
}

/* ---- layouts -------------------------------------------------------------------------------- */
#define MMQ_UNIT 2304u   /* bytes of one (16-row tile, block) unit: 16 × 144 */
#define MMQ_CPAIR 544u   /* x bytes of one chunk pair: 16 lanes × 32 B + 32 zero bytes */
#define MMQ_XBLK 2240u   /* x bytes of one block: 8 chunks + 64 B of scales */

static inline size_t mmq_x_bytes(uint32_t K) { return (size_t)K / 256 * MMQ_XBLK; }

/* Sub-block of item (t, G): lanes t = 0,1 lo subs of pairs 2G, 2G+1; t = 2,3 the hi subs. */
__host__ __device__ inline uint32_t mmq_sub(uint32_t t, uint32_t G) { return 4 * G + 2 * (t & 1) + (t >> 1); }

/* Per row pair, the header record (32 B): item q of lane t is (row g + 8(q>>1), group G = q&1).
 *   w0 = d_g | d_g8 << 16, w1 = dmin_g | dmin_g8 << 16 (f16 bits)
 *   w2+t: sc(q) at bits 6q (q = 0..3), m(0) at 24..29, bits 30..31 = m(3) >> 4
 *   half at 24 + 2t: m(1) at 0..5, m(2) at 6..11, m(3) & 15 at 12..15 */
static __global__ void mmq_repack_q4k(const uint8_t *__restrict__ src, uint8_t *__restrict__ dst, uint32_t rows, uint32_t nb,
                                      size_t first_tile)
{
    /* src: rows (a multiple of 16) GGUF rows; dst: the whole matrix, these rows from tile first_tile */
    const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; /* (tile, block, row pair g) */
    if (i >= (size_t)rows / 16 * nb * 8) return;
    const uint32_t g = (uint32_t)(i % 8), b = (uint32_t)((i / 8) % nb);
    const size_t tile = i / 8 / nb;
    uint8_t *u = dst + ((first_tile + tile) * nb + b) * MMQ_UNIT;
    const uint8_t *blk[2];
    for (int h = 0; h < 2; h++) blk[h] = src + ((tile * 16 + g + 8 * h) * nb + b) * 144;
    /* qs words: lane (g, t), load u4, word w = 2·(chunk&1) + h: chunk ci = 2·u4 + (w>>1) */
    for (uint32_t t = 0; t < 4; t++)
        for (uint32_t u4 = 0; u4 < 4; u4++)
            for (uint32_t w = 0; w < 4; w++) {
                const uint32_t ci = 2 * u4 + (w >> 1), h = w & 1, G = ci / 4, c = ci % 4;
                const uint32_t P = 2 * G + (t >> 1), pp = 8 * c + 4 * (t & 1);
                for (uint32_t k = 0; k < 4; k++)
                    u[(u4 * 32 + 4 * g + t) * 16 + 4 * w + k] = blk[h][16 + 32 * P + pp + k];
            }
    uint8_t *hd = u + 2048 + 32 * g;
    for (int h = 0; h < 2; h++) {
        hd[2 * h] = blk[h][0];
        hd[2 * h + 1] = blk[h][1];
        hd[4 + 2 * h] = blk[h][2];
        hd[4 + 2 * h + 1] = blk[h][3];
    }
    for (uint32_t t = 0; t < 4; t++) {
        uint32_t sc[4], mn[4];
        for (uint32_t q = 0; q < 4; q++) {
            const uint8_t *s = blk[q >> 1] + 4;
            const uint32_t j = mmq_sub(t, q & 1);
            if (j < 4) {
                sc[q] = s[j] & 63;
                mn[q] = s[j + 4] & 63;
            } else {
                sc[q] = (s[j + 4] & 15) | ((s[j - 4] >> 6) << 4);
                mn[q] = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
            }
        }
        const uint32_t w = sc[0] | sc[1] << 6 | sc[2] << 12 | sc[3] << 18 | mn[0] << 24 | (mn[3] >> 4) << 30;
        const uint32_t hw = mn[1] | mn[2] << 6 | (mn[3] & 15) << 12;
        memcpy(hd + 8 + 4 * t, &w, 4);
        hd[24 + 2 * t] = (uint8_t)(hw & 255);
        hd[24 + 2 * t + 1] = (uint8_t)(hw >> 8);
    }
}

/* x → digits in B-fragment order, one 32-group (= one Q4_K sub-block): lane l holds v = x[p],
 * p = 32g + l; all 32 lanes call it. Kernels that produce a matvec input with a warp per 32
 * consecutive elements call it as they write x. */
__device__ __forceinline__ void mmq_prep_warp(float v, uint32_t p, uint8_t *__restrict__ buf)
{
    const uint32_t sub = (p >> 5) & 7, lane = p & 31, b = p >> 8;
    float s;
    const int X = mmq_group_int(v, &s);
    const int e[4] = {X & 127, (X >> 7) & 127, (X >> 14) & 127, X >> 21};
    uint8_t *blk = buf + (size_t)b * MMQ_XBLK;
    /* where this position's digits go: pair P, hi?, position pp in the pair */
    const uint32_t P = sub >> 1, hi = sub & 1, pp = lane, G = P >> 1, c = pp >> 3;
    const uint32_t tp = 2 * (P & 1) + ((pp >> 2) & 1), i = pp & 3; /* the B lane's t' and byte */
    const uint32_t uu = hi ? 2 + (P & 1) : (P & 1);
    /* chunk pair cp = 2G + c/2; chunk c even → b0, odd → b1; fragment of B lane j: 32 B =
     * [raw mma: digits e0,e1 (b0, b1) | e2,e3 (b0, b1)][twin mma: the same] */
    uint8_t *ch = blk + (2 * G + (c >> 1)) * MMQ_CPAIR;
    for (int dp = 0; dp < 2; dp++)
        for (int ee = 0; ee < 2; ee++) {
            const uint32_t n = 2 * uu + ee, j = 2 * n + (tp & 1);
            const int D = e[2 * dp + ee];
            uint8_t *f = ch + 32 * j + 8 * dp + 4 * (c & 1) + i;
            f[0] = hi ? 0 : (uint8_t)(int8_t)D;              /* raw byte: lo + 16·hi */
            f[16] = (uint8_t)(int8_t)(hi ? D : -D);          /* twin byte: 16·hi */
        }
    if (sub == 0) ((uint32_t *)(blk + (lane >> 3) * MMQ_CPAIR + 512))[lane & 7] = 0u; /* the zero slots */
    int t = X;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) t += __shfl_xor_sync(0xFFFFFFFFu, t, o);
    if (lane == 0) {
        /* lane t of the kernel holding this sub-block, and its group */
        const uint32_t sq = sub & 3, tt = 2 * (sq & 1) + (sq >> 1), GG = sub >> 2;
        float *sc = (float *)(blk + 4 * MMQ_CPAIR) + 4 * tt;
        sc[GG] = hi ? s * 0.0625f : s;
        sc[2 + GG] = s * (float)t;
    }
}

/* A prep: x → a tensor-core digit layout by the warp writer WR::write (WR: mmq_prep_q4 here,
 * mmq_prep_q6 in mmq6.cuh), one CTA of MMQ_PREP_T threads per 256-block, a warp per 32-group in
 * turn. K a multiple of 256. 128 threads (~4K registers) fit beside the two CTAs of the persistent
 * gate·up on every SM, so as a programmatic dependent the prep is resident before gate·up ends (256
 * threads did not fit: it launched ~1.7 us after gate·up's end; timeline, H200). Both of a
 * thread's elements are loaded before either is written, so their chains overlap (+0.3% per
 * token against one after the other). */
#define MMQ_PREP_T 128
template <typename WR>
static __global__ void __launch_bounds__(MMQ_PREP_T) mmq_prep_kernel(const float *x, uint8_t *__restrict__ buf, uint32_t K,
                                                                      uint32_t xst, uint32_t bst)
{
    CU_TL_SCOPE(WR::tag);
    cu_pdl_trigger();
    x += (size_t)blockIdx.y * xst; /* the pass row (xst floats, bst bytes apart) */
    buf += (size_t)blockIdx.y * bst;
    cu_pdl_wait(); /* x is the previous kernel's output (a no-op unless launched as a dependent) */
    const uint32_t p0 = 256 * blockIdx.x + threadIdx.x;
    (void)K; /* a multiple of 256: every element of the block exists */
    float v[256 / MMQ_PREP_T];
#pragma unroll
    for (int k = 0; k < 256 / MMQ_PREP_T; k++) v[k] = x[p0 + k * MMQ_PREP_T];
#pragma unroll
    for (int k = 0; k < 256 / MMQ_PREP_T; k++) WR::write(v[k], p0 + k * MMQ_PREP_T, buf);
}

/* pdl: as a programmatic dependent of the kernel before it (only where no kernel that may still
 * run then reads buf: see cu_ldx) */
template <typename WR>
static inline void mmq_prep_launch_t(cudaStream_t st, const float *x, uint8_t *buf, uint32_t K, bool pdl, uint32_t rows = 1,
                                     uint32_t xst = 0, uint32_t bst = 0)
{
    cudaLaunchAttribute at[1];
    const cudaLaunchConfig_t cfg = cu_pdl_cfg(dim3(K / 256, rows), dim3(MMQ_PREP_T), st, pdl, at);
    cudaLaunchKernelEx(&cfg, mmq_prep_kernel<WR>, x, buf, K, xst, bst);
}

struct mmq_prep_q4 {
    static constexpr int tag = TL_MMQ_PREP;
    static __device__ __forceinline__ void write(float v, uint32_t p, uint8_t *buf) { mmq_prep_warp(v, p, buf); }
};
static inline void mmq_prep_launch(cudaStream_t st, const float *x, uint8_t *buf, uint32_t K, bool pdl = false)
{
    mmq_prep_launch_t<mmq_prep_q4>(st, x, buf, K, pdl);
}

/* ---- the kernel ------------------------------------------------------------------------------ */
__device__ __forceinline__ void mmq_mma(int c[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0, uint32_t b1)
{
    asm("mma.sync.aligned.m16n8k32.row.col.s32.u8.s8.s32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"
        : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

/* One tile's weights for one block: the 4 qs loads and the lane's header words. */
struct mmq_w {
    uint4 q[4];
    uint2 dd;      /* d pair, dmin pair */
    uint32_t sc;   /* scales word */
    uint32_t mh;   /* mins half */
};
__device__ __forceinline__ void mmq_load(const uint8_t *unit, uint32_t lane, mmq_w &W)
{
#pragma unroll
    for (int u = 0; u < 4; u++) W.q[u] = cu_ldw(unit + (u * 32 + lane) * 16);
    const uint8_t *hd = unit + 2048 + 32 * (lane >> 2);
    W.dd = __ldg((const uint2 *)hd);
    W.sc = __ldg((const uint32_t *)(hd + 8 + 4 * (lane & 3)));
    W.mh = __ldg((const unsigned short *)(hd + 24 + 2 * (lane & 3)));
}

__device__ __forceinline__ float mmq_i2f(int v) { return __int2float_rn(v); }
/* P = exact Σ q·X (as f32) from the two digit-pair sums */
__device__ __forceinline__ float mmq_p(int c0, int c1, int c2, int c3)
{
    return __fmaf_rn(mmq_i2f(c2 + 128 * c3), 16384.f, mmq_i2f(c0 + 128 * c1));
}

/* One (tile, block) of lane (g, t)'s sums: rows g and g + 8 from the exact products of its two
 * sub-blocks (Psc[G][half] = P·s of sub mmq_sub(t, G), S0/S1 = s·ΣX of those subs), its scales word
 * w, mins half h and d/dmin pair dd; acc[half] += d·Σ sc·P·s − dmin·Σ m·S. Every rounding is an
 * explicit intrinsic (nothing left for the compiler to contract), so each kernel that calls it
 * (mmq_block, the dense multi-row kernels) gives the same bits from the same products. */
__device__ __forceinline__ void mmq_fold(uint32_t w, uint32_t h, uint2 dd, const float Psc[2][2], float S0, float S1,
                                         float acc[2])
{
    /* scales: field q at bits 6q; I2F of the masked field is sc·2^(6q), exact */
    const float sc0 = __int2float_rn((int)(w & 63u)), sc1 = __int2float_rn((int)(w & (63u << 6)));
    const float sc2 = __int2float_rn((int)(w & (63u << 12))), sc3 = __int2float_rn((int)(w & (63u << 18)));
    const float m0 = __int2float_rn((int)(w & (63u << 24))), m1 = __int2float_rn((int)(h & 63u));
    const float m2 = __int2float_rn((int)(h & (63u << 6))), m3 = __int2float_rn((int)(((w >> 26) & 0x30u) | (h >> 12)));
    const float2 d = __half22float2(*(const __half2 *)&dd.x);
    const float2 dm = __half22float2(*(const __half2 *)&dd.y);
    /* row g: items 0 (G0), 1 (G1); row g+8: items 2 (G0), 3 (G1); the power-of-two factors exact */
    const float vg = __fmaf_rn(sc1 * 0x1p-6f, Psc[1][0], __fmul_rn(sc0, Psc[0][0]));
    const float vg8 = __fmaf_rn(sc3 * 0x1p-18f, Psc[1][1], __fmul_rn(sc2 * 0x1p-12f, Psc[0][1]));
    const float ng = __fmaf_rn(m1, S1, __fmul_rn(m0 * 0x1p-24f, S0));
    const float ng8 = __fmaf_rn(m3, S1, __fmul_rn(m2 * 0x1p-6f, S0));
    /* the block's scale and min terms meet first */
    acc[0] = __fadd_rn(acc[0], __fmaf_rn(d.x, vg, -__fmul_rn(dm.x, ng)));
    acc[1] = __fadd_rn(acc[1], __fmaf_rn(d.y, vg8, -__fmul_rn(dm.y, ng8)));
}

/* The lane's x for one block: B fragments of the 8 chunks, its (s_eff, S) of groups 0, 1. */
template <int R>
__device__ __forceinline__ void mmq_block(const mmq_w W[R], const uint8_t *xb, uint32_t lane, float acc[R][2])
{
    const uint32_t t = lane & 3;
    const uint32_t g = lane >> 2;
    const uint32_t j = ((g >> 1) & 1) == (t >> 1) ? 2 * g + (t & 1) : 16; /* nonzero B lane, or the zero slot */
    const float4 sS = cu_ldx<float4>(xb + 4 * MMQ_CPAIR + 16 * t);
    /* item q = (row half q>>1, group q&1); scale fields at bit 6q, min fields: see repack */
    const float ks[2] = {sS.x, sS.y};
    float Psc[R][2][2]; /* [tile][group][row half] P·s_eff·2^(6q) as computed below */
#pragma unroll
    for (int G = 0; G < 2; G++) {
        int C[R][2][4];
#pragma unroll
        for (int r = 0; r < R; r++)
#pragma unroll
            for (int k = 0; k < 4; k++) C[r][0][k] = C[r][1][k] = 0;
#pragma unroll
        for (int c2 = 0; c2 < 2; c2++) {
            /* chunk pair cp: A = the loaded words as they are (chunk 2cp in k 0..15, 2cp+1 in
             * k 16..31), then their twins; no register moves for the fragments */
            const uint32_t cp = 2 * G + c2;
            const uint4 Br = cu_ldx<uint4>(xb + cp * MMQ_CPAIR + 32 * j);
            const uint4 Bt = cu_ldx<uint4>(xb + cp * MMQ_CPAIR + 32 * j + 16);
#pragma unroll
            for (int r = 0; r < R; r++) {
                const uint4 &q = W[r].q[cp];
                const uint32_t m = 0xF0F0F0F0u;
                mmq_mma(C[r][0], q.x, q.y, q.z, q.w, Br.x, Br.y);
                mmq_mma(C[r][1], q.x, q.y, q.z, q.w, Br.z, Br.w);
                mmq_mma(C[r][0], q.x & m, q.y & m, q.z & m, q.w & m, Bt.x, Bt.y);
                mmq_mma(C[r][1], q.x & m, q.y & m, q.z & m, q.w & m, Bt.z, Bt.w);
            }
        }
#pragma unroll
        for (int r = 0; r < R; r++) {
            Psc[r][G][0] = __fmul_rn(mmq_p(C[r][0][0], C[r][0][1], C[r][1][0], C[r][1][1]), ks[G]);
            Psc[r][G][1] = __fmul_rn(mmq_p(C[r][0][2], C[r][0][3], C[r][1][2], C[r][1][3]), ks[G]);
        }
    }
#pragma unroll
    for (int r = 0; r < R; r++) mmq_fold(W[r].sc, W[r].mh, W[r].dd, Psc[r], sS.z, sS.w, acc[r]);
}

/* mmq_block over the nx (<= NX) x rows of a multi-row pass, x row n at xb + n·xs: the weights
 * stay in registers and each row's products, roundings and sums are mmq_block's for that row
 * alone, so a row's bits do not depend on how many rows share the pass (docs/routes.md). */
template <int R, int NX>
__device__ __forceinline__ void mmq_block_rows(const mmq_w W[R], const uint8_t *xb, uint32_t xs, uint32_t nx,
                                               uint32_t lane, float acc[NX][R][2])
{
#pragma unroll
    for (int n = 0; n < NX; n++)
        if (n == 0 || (uint32_t)n < nx) mmq_block<R>(W, xb + (size_t)n * xs, lane, acc[n]);
}

/* A lane's sums of its rows g and g + 8 (lane = 4g + t), added over the 4 lanes t = 0..3 in f64
 * in a fixed butterfly order; lane t = 0 stores them at dst[g] and dst[g + 8]. All 32 lanes call
 * it. The epilogues of mmq_kernel, mmq6_kernel and the workbench's persistent pair (bench/kernels/mpp.cuh). */
__device__ __forceinline__ void mmq_rows_f64(double a0, double a1, double *dst, uint32_t lane)
{
    const double a[2] = {a0, a1};
#pragma unroll
    for (int h = 0; h < 2; h++) {
        double v = a[h];
        v += __shfl_xor_sync(0xFFFFFFFFu, v, 1);
        v += __shfl_xor_sync(0xFFFFFFFFu, v, 2);
        if ((lane & 3) == 0) dst[(lane >> 2) + 8 * h] = v;
    }
}

/* A warp's walk over its blocks kw, kw + KW, … < nb (mmq_body, mmq6_body): load(W, ahead) loads the
 * weights of the current block (ahead 0) or of the next (ahead 1) into W[R]; block(W) adds one
 * block's products; step() moves the weight and x cursors one turn on. The first block's weights
 * are loaded before cu_pdl_wait (x only after it); with PF the next block's are loaded before this
 * block's arithmetic, else after it. */
template <int R, int KW, bool PF, typename Wt, typename Load, typename Block, typename Step, typename Wait>
__device__ __forceinline__ void mmq_walk(uint32_t kw, uint32_t nb, Load load, Block block, Step step, Wait wait)
{
    if (kw >= nb) {
        wait();
        return;
    }
    Wt W[R];
    load(W, 0);
    wait();
    for (uint32_t b = kw;;) {
        const bool more = b + KW < nb;
        if (PF) {
            Wt N[R];
            if (more) load(N, 1);
            block(W);
            if (!more) break;
#pragma unroll
            for (int r = 0; r < R; r++) W[r] = N[r];
        } else {
            block(W);
            if (!more) break;
            load(W, 1);
        }
        step();
        b += KW;
    }
}

struct mmq_args {
    const uint8_t *a, *b; /* repacked matrices (b: up, PAIR only) */
    uint32_t rows, K;     /* rows of a */
    const uint8_t *x;
    float *out;
    uint32_t op;          /* MV_OP_STORE or MV_OP_SOFTCAP (not PAIR: that is MV_OP_SILU_MUL) */
    float scale, cap;     /* MV_OP_SOFTCAP: out = cap·tanh(y·scale/cap), or y·scale if cap == 0 */
    /* A multi-row pass (0 and 1: one row): nx x rows, row n at x + n·xs bytes, its output at
     * out + n·os floats; the grid holds ng = ceil(nx / NX) row groups per CTA's tiles (mmq_rows). */
    uint32_t nx, xs, os, ng;
};

/* Rows of group `grp` of a multi-row launch with NX rows per group: x and out moved to its first
 * row, the count it takes returned (at least 1). */
template <typename Args, int NX>
__host__ __device__ __forceinline__ uint32_t mmq_group(Args &A, uint32_t grp)
{
    if (A.nx <= 1) return 1;
    A.x += (size_t)grp * NX * A.xs;
    A.out += (size_t)grp * NX * A.os;
    const uint32_t left = A.nx - grp * NX;
    return left < (uint32_t)NX ? left : (uint32_t)NX;
}

/* The wait of a kernel launched as a programmatic dependent (cu_pdl_wait); a persistent grid passes
 * its own (bench/kernels/persist.cu). */
struct mmq_pdl_wait {
    __device__ __forceinline__ void operator()() const { cu_pdl_wait(); }
};

/* R tiles per warp, KW warps per tile set splitting the blocks, PF: next block's weights loaded
 * before this block's arithmetic. PAIR, R = 1 (KW <= 4): the CTA's sets alternate gate / up of
 * the same tile; PAIR, R = 2: each warp takes gate and up of the same tile and block, so x is
 * loaded once for both (kbench_stream's "pair-units"). MINB: blocks per SM for the registers. */
template <int R, int KW, bool PF, bool PAIR, typename Wait = mmq_pdl_wait, int NX = 1>
__device__ __forceinline__ void mmq_body(const mmq_args &A0, uint32_t cta, Wait wait = Wait(), uint32_t grp = 0)
{
    constexpr int SETS = 8 / KW;
    constexpr bool PU = PAIR && R == 2;                         /* pair-units */
    constexpr int TPC = PU ? SETS : PAIR ? SETS / 2 : SETS * R; /* output tiles per CTA */
    static_assert(!PAIR || PU || (R == 1 && SETS >= 2), "pair: gate and up sets, or gate and up in each warp");
    cu_pdl_trigger(); /* weights first, then wait for x */
    __shared__ double red[NX][8][R][16];
    mmq_args A = A0;
    const uint32_t nx = mmq_group<mmq_args, NX>(A, grp); /* x rows of this CTA (its row group's) */
    const uint32_t wid = threadIdx.x >> 5, lane = threadIdx.x & 31, kw = wid % KW, set = wid / KW;
    const uint32_t nb = A.K / 256, ntile = A.rows / 16;
    const uint8_t *unit[R];
#pragma unroll
    for (int r = 0; r < R; r++) {
        uint32_t tile = PU ? cta * TPC + set : PAIR ? cta * TPC + set / 2 : (cta * SETS + set) * R + r;
        if (tile >= ntile) tile = ntile - 1; /* tail: recompute, store once */
        const bool up = PU ? r == 1 : PAIR && (set & 1);
        unit[r] = (up ? A.b : A.a) + ((size_t)tile * nb + kw) * MMQ_UNIT;
    }
    float acc[NX][R][2];
#pragma unroll
    for (int n = 0; n < NX; n++)
#pragma unroll
        for (int r = 0; r < R; r++) acc[n][r][0] = acc[n][r][1] = 0.f;
    const uint8_t *xb = A.x + (size_t)kw * MMQ_XBLK;
    mmq_walk<R, KW, PF, mmq_w>(
        kw, nb,
        [&](mmq_w *W, int ahead) {
#pragma unroll
            for (int r = 0; r < R; r++) mmq_load(unit[r] + (size_t)ahead * KW * MMQ_UNIT, lane, W[r]);
        },
        [&](const mmq_w *W) { mmq_block_rows<R, NX>(W, xb, A.xs, nx, lane, acc); },
        [&]() {
#pragma unroll
            for (int r = 0; r < R; r++) unit[r] += (size_t)KW * MMQ_UNIT;
            xb += (size_t)KW * MMQ_XBLK;
        },
        wait);
    /* sum the 4 lanes of each row (t = 0..3), then the KW warps of the set, in f64 and in a fixed
     * order: one rounding to f32 per output (in f32 this serial sum's error was 3–15% above a
     * 32-lane f32 tree's; in f64 it is below it) */
#pragma unroll
    for (int n = 0; n < NX; n++)
#pragma unroll
        for (int r = 0; r < R; r++) mmq_rows_f64(acc[n][r][0], acc[n][r][1], red[n][wid][r], lane);
    __syncthreads();
    for (uint32_t i = threadIdx.x; i < nx * (uint32_t)(TPC * 16); i += blockDim.x) {
        const uint32_t n = i / (TPC * 16), ot = i % (TPC * 16) / 16, row16 = i % 16, tile = cta * TPC + ot;
        if (tile >= ntile) continue;
        double ys = 0, us = 0;
        float y;
        if (PAIR) {
            for (int k = 0; k < KW; k++) {
                ys += PU ? red[n][ot * KW + k][0][row16] : red[n][(2 * ot) * KW + k][0][row16];
                us += PU ? red[n][ot * KW + k][1][row16] : red[n][(2 * ot + 1) * KW + k][0][row16];
            }
            y = (float)ys;
            const float u = (float)us;
            y = y / (1.f + expf(-y)) * u; /* SiLU·up on the f32 matvec results */
        } else {
            const uint32_t st = ot / R, rt = ot % R;
            for (int k = 0; k < KW; k++) ys += red[n][st * KW + k][rt][row16];
            y = (float)ys;
            if (A.op == MV_OP_SOFTCAP) { /* the LM head, as the general path and mmq6 */
                y = y * A.scale;
                if (A.cap > 0.f) y = A.cap * tanhf(y / A.cap);
            }
        }
        A.out[(size_t)n * A.os + (size_t)tile * 16 + row16] = y;
    }
}
/* A launch's CTA and row group: CTA c's row groups are the consecutive blocks c·ng … c·ng + ng − 1,
 * so the groups reading one weight tile run side by side and all but the first read it from L2. */
__device__ __forceinline__ uint32_t mmq_cta(uint32_t ng) { return ng > 1 ? blockIdx.x / ng : blockIdx.x; }
__device__ __forceinline__ uint32_t mmq_grp(uint32_t ng) { return ng > 1 ? blockIdx.x % ng : 0; }

template <int R, int KW, bool PF, bool PAIR, int MINB, int NX = 1>
__global__ void __launch_bounds__(256, MINB) mmq_kernel(const mmq_args A)
{
    CU_TL_SCOPE(TL_MMQ);
    mmq_body<R, KW, PF, PAIR, mmq_pdl_wait, NX>(A, mmq_cta(A.ng), mmq_pdl_wait(), mmq_grp(A.ng));
}

/* The x rows one CTA of a multi-row launch takes: 1 for one row, else 2 or 4 (more rows run as
 * more row groups: mmq_cta). 4 keeps a warp's sums in registers beside R = 2 tiles of weights. */
static inline uint32_t mmq_nx_of(uint32_t nx) { return nx <= 1 ? 1 : nx == 2 ? 2 : 4; }

template <int R, int KW, bool PF, bool PAIR, int MINB_ = 0>
static void mmq_launch(const mmq_args &A0, cudaStream_t st = 0, bool pdl = true)
{
    constexpr int MINB = MINB_ ? MINB_ : R >= 2 ? 2 : PF ? 3 : 4;
    const uint32_t tiles_per_cta = PAIR ? (R == 2 ? 8 / KW : 8 / KW / 2) : (8 / KW) * R;
    const uint32_t ntile = A0.rows / 16, NXL = mmq_nx_of(A0.nx);
    mmq_args A = A0;
    A.ng = (A.nx <= 1 ? 1 : A.nx + NXL - 1) / NXL;
    const uint32_t ctas = (ntile + tiles_per_cta - 1) / tiles_per_cta;
    cudaLaunchAttribute at[1];
    const cudaLaunchConfig_t cfg = cu_pdl_cfg(dim3(ctas * A.ng), dim3(256), st, pdl, at);
    if (NXL == 1) {
        cudaLaunchKernelEx(&cfg, mmq_kernel<R, KW, PF, PAIR, MINB>, A);
    } else if constexpr (PAIR) { /* several rows of one matrix run mmqd.cuh's kernel; of a pair whose
                                   * dense sums do not fit shared memory, these */
        if (NXL == 2) cudaLaunchKernelEx(&cfg, mmq_kernel<R, KW, PF, PAIR, MINB < 2 ? MINB : 2, 2>, A);
        else cudaLaunchKernelEx(&cfg, mmq_kernel<R, KW, PF, PAIR, 1, 4>, A); /* 4 rows' sums: the registers of 1 a SM */
    }
}

/* The route's choice per launch (kbench_mma, kbench_stream and the engine, H200): the SiLU pair
 * as pair-units, KW 8, one CTA per 8 tiles (the workbench's: the route's pair is mmi.cuh's); the
 * LM-head-sized launches (≥ 65536 rows) R 1 KW 2; the per-layer shapes R 2 KW 8. Loading the next
 * block first (PF) lost 2-10% in the engine on the pair and the per-layer shapes
 * (bench/kernels/NOTES.md). */
static inline void mmq_launch_auto(const mmq_args &A, bool pair, cudaStream_t st, bool pdl, int n_sm = 0)
{
    if (pair) mmq_launch<2, 8, false, true>(A, st, pdl);
    else if (A.rows >= 65536) mmq_launch<1, 2, false, false>(A, st, pdl);
    /* more CTAs than 2 per SM hold (the 8704-row stack with v: 272 for 264): the 80-register build
     * at 3 per SM runs them in one wave instead of a second of 8 (timeline, H200: 15.7 -> 12.2 us;
     * where 2 per SM suffice it is 2-10% slower) */
    else if (n_sm && A.rows / 32 > (uint32_t)n_sm * 2) mmq_launch<2, 8, false, false, 3>(A, st, pdl);
    else mmq_launch<2, 8, false, false>(A, st, pdl);
}

/* A matrix the mmq kernel can take: Q4_K, whole 16-row tiles, whole blocks. */
static inline bool mmq_shape_ok(uint32_t rows, uint32_t cols) { return rows % 16 == 0 && cols % 256 == 0 && rows >= 16; }

#endif
