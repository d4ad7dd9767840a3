/* mma.cu — workbench for a research prototype: v7's exact-integer Q4_K matvec with the integer
 * products on tensor cores (mma.sync m16n8k32 u8 x s8 -> s32) instead of DP4A. Nothing here is
 * used by the engine; v7 (src/cuda/mvq.cuh) is run beside it, read-only, as the baseline.
 * Results, instruction counts and what to do next: bench/kernels/NOTES.md, "mma".
 *
 * Numerics are v7's: per 32-group of x a power of two s and X = rint(x/s), a 24-bit integer
 * (the same s, rounding and clamp as mvq_prep_warp). Here X is split into four signed-byte
 * digits X = e0 + 2^7·e1 + 2^14·e2 + 2^21·e3 (e0..e2 in [0,127], e3 in [-4,3]), so every digit
 * is an s8 and no offset column is needed. Σ q·X over a (row, sub-block) is exact in int32 per
 * digit, combined as lo = c0 + 128·c1, hi = c2 + 128·c3 (both exact in f32: < 2^23, or
 * multiples of 16 below 2^27), so P = 16384·f(hi) + f(lo) is one rounding; then the block's
 * d·Σ sc·s·P − dmin·Σ m·S in f32 as v7 does (S = s·ΣX over the 32-group).
 *
 * One mma: A = 16 rows × 32 k (u8), B = 32 k × 8 columns (s8), C = 16 × 8 (s32); lane (g, t)
 * holds A rows g, g+8 at k = 4t..4t+3 (a0, a1) and 16+4t.. (a2, a3), B column g at the same k,
 * C rows g, g+8 at columns 2t, 2t+1.
 *   A: a Q4_K qs byte holds sub-block 2P's position l (lo nibble) and 2P+1's (hi). A chunk is
 *   8 positions of pairs P0 = 2G (lanes t = 0,1) and P1 = 2G+1 (t = 2,3); a chunk pair (c, c')
 *   is one mma's k: c in k 0..15, c' in k 16..31. So a lane's 16-byte load (rows g, g+8 ×
 *   chunks c, c') is the A fragment as it lies, and the same four words & 0xF0F0F0F0 (the
 *   "twins", 16·hi) are a second one: 4 LOP3 per 64 weights, no register moves.
 *   B columns n = 2u + e: u = 0: lo sub of P0, 1: lo sub of P1, 2: hi sub of P0, 3: hi sub of
 *   P1; e the digit (e0,e1 in one mma, e2,e3 in the next, same A). For a lo sub B is +D against
 *   the raw bytes and −D against the twins (Σ (raw − 16·hi)·D = Σ lo·D); for a hi sub 0 and +D
 *   (16·Σ hi·D; the 1/16 goes into s). So C lane (g, t) holds the two digit sums of sub-block
 *   u = t for rows g and g+8: each (row, sub-block) lives in exactly one lane, which decodes its
 *   scale and min once.
 * A 256-block per 16 rows: 2 groups G × 2 chunk pairs × (raw, twin) × 2 digit pairs = 16 mma;
 * the int32 C accumulates over a group, then each lane scales its 4 (row, sub-block) items.
 *
 * Weights, repacked at upload (mmq_repack_q4k; 144 bytes per block as in GGUF): units of
 * (16-row tile, block), 2304 bytes: qs [u = 0..3][lane][16 B] — lane (g, t)'s words for chunks
 * 2u, 2u+1, rows g, g+8 — so each of a lane's four 16-byte loads is a warp load of 512 contiguous
 * bytes; then the headers per row pair g (32 B): d_g|d_g8, dmin_g|dmin_g8, one 32-bit word of
 * four 6-bit scales (+ a min and 2 bits) per lane t, a 16-bit word of mins per lane t.
 * x, prepared per token (mmq_prep): per block 4 chunk pairs × 544 B (16 nonzero B lanes × 32 B:
 * raw and twin fragments of both digit pairs, + 32 zero bytes read by the other 16 lanes) and
 * 4 × (s_eff0, s_eff1, S0, S1) per lane t (s_eff = s, or s/16 for hi sub-blocks).
 *
 * Launch: a CTA of 8 warps; KW warps split the blocks of the same tiles (in-CTA reduction),
 * each warp works on R tiles of 16 rows. PAIR (R = 1): the CTA's warp sets alternate gate and
 * up rows of the same tile, output silu(g)·u. Programmatic dependent launch as v7.
 *   usage: kbench_mma [reps]   (exit 1 if a check fails) */
#include "cuda/matvec.cuh"
#include "cuda/mvq.cuh"

#include <cuda_runtime.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <algorithm>
#include <vector>

extern "C" {
#include "quant.h"
}

#define CK(x)                                                                                    \
    do {                                                                                         \
        cudaError_t e_ = (x);                                                                    \
        if (e_ != cudaSuccess) {                                                                 \
            fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_));  \
            exit(1);                                                                             \
        }                                                                                        \
    } while (0)

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
static __global__ void mmq_repack_q4k(const uint8_t *__restrict__ src, uint8_t *__restrict__ dst, uint32_t rows, uint32_t nb)
{
    const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; /* (tile, block, row pair g) */
    if (i >= (size_t)rows / 16 * nb * 8) return;
    const uint32_t g = (uint32_t)(i % 8), b = (uint32_t)((i / 8) % nb);
    const size_t tile = i / 8 / nb;
    uint8_t *u = dst + (tile * nb + b) * MMQ_UNIT;
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

/* x → digits in B-fragment order. One warp per 32-group (= one Q4_K sub-block), 8 per CTA. */
static __global__ void __launch_bounds__(256) mmq_prep(const float *__restrict__ x, uint8_t *__restrict__ buf, uint32_t K)
{
    const uint32_t sub = threadIdx.x >> 5, lane = threadIdx.x & 31, b = blockIdx.x;
    if (b >= K / 256) return;
    const float v = x[256 * b + 32 * sub + lane];
    /* s and X exactly as mvq_prep_warp */
    const uint32_t mx = __reduce_max_sync(0xFFFFFFFFu, __float_as_uint(v) & 0x7FFFFFFFu);
    float s;
    int X = 0;
    if (mx >= 0x7F800000u) {
        s = __int_as_float(0x7FC00000);
    } else if (mx == 0) {
        s = 1.f;
    } else {
        int eb = (int)(mx >> 23);
        if (eb < 23) eb = 23;
        s = __int_as_float((eb - 22) << 23);
        const float inv = __int_as_float((149 - eb + 127) << 23);
        X = __float2int_rn(v * inv);
        X = max(-8388607, min(8388607, X));
    }
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

/* ---- the kernel ------------------------------------------------------------------------------ */
__device__ __forceinline__ uint4 mmq_ldw(const void *p)
{
    uint4 v;
    asm("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
    return v;
}
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
    for (int u = 0; u < 4; u++) W.q[u] = mmq_ldw(unit + (u * 32 + lane) * 16);
    const uint8_t *hd = unit + 2048 + 32 * (lane >> 2);
    W.dd = __ldg((const uint2 *)hd);
    W.sc = __ldg((const uint32_t *)(hd + 8 + 4 * (lane & 3)));
    W.mh = __ldg((const unsigned short *)(hd + 24 + 2 * (lane & 3)));
}

__device__ __forceinline__ float mmq_i2f(int v) { return __int2float_rn(v); }
/* P = exact Σ q·X (as f32) from the two digit-pair sums */
__device__ __forceinline__ float mmq_p(int c0, int c1, int c2, int c3)
{
    return fmaf(mmq_i2f(c2 + 128 * c3), 16384.f, mmq_i2f(c0 + 128 * c1));
}

/* The lane's x for one block: B fragments of the 8 chunks, its (s_eff, S) of groups 0, 1. */
template <int R>
__device__ __forceinline__ void mmq_block(const mmq_w W[R], const uint8_t *xb, uint32_t lane, float acc[R][2])
{
    const uint32_t t = lane & 3;
    const uint32_t g = lane >> 2;
    const uint32_t j = ((g >> 1) & 1) == (t >> 1) ? 2 * g + (t & 1) : 16; /* nonzero B lane, or the zero slot */
    const float4 sS = __ldg((const float4 *)(xb + 4 * MMQ_CPAIR + 16 * t));
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
            const uint4 Br = __ldg((const uint4 *)(xb + cp * MMQ_CPAIR + 32 * j));
            const uint4 Bt = __ldg((const uint4 *)(xb + cp * MMQ_CPAIR + 32 * j + 16));
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
            Psc[r][G][0] = mmq_p(C[r][0][0], C[r][0][1], C[r][1][0], C[r][1][1]) * ks[G];
            Psc[r][G][1] = mmq_p(C[r][0][2], C[r][0][3], C[r][1][2], C[r][1][3]) * ks[G];
        }
    }
#pragma unroll
    for (int r = 0; r < R; r++) {
        const uint32_t w = W[r].sc, h = W[r].mh;
        /* scales: field q at bits 6q; I2F of the masked field is sc·2^(6q), exact */
        const float sc0 = mmq_i2f((int)(w & 63u)), sc1 = mmq_i2f((int)(w & (63u << 6)));
        const float sc2 = mmq_i2f((int)(w & (63u << 12))), sc3 = mmq_i2f((int)(w & (63u << 18)));
        const float m0 = mmq_i2f((int)(w & (63u << 24))), m1 = mmq_i2f((int)(h & 63u));
        const float m2 = mmq_i2f((int)(h & (63u << 6))), m3 = mmq_i2f((int)(((w >> 26) & 0x30u) | (h >> 12)));
        const float2 d = __half22float2(*(const __half2 *)&W[r].dd.x);
        const float2 dm = __half22float2(*(const __half2 *)&W[r].dd.y);
        /* row g: items 0 (G0), 1 (G1); row g+8: items 2 (G0), 3 (G1) */
        const float vg = fmaf(sc1 * 0x1p-6f, Psc[r][1][0], sc0 * Psc[r][0][0]);
        const float vg8 = fmaf(sc3 * 0x1p-18f, Psc[r][1][1], sc2 * 0x1p-12f * Psc[r][0][1]);
        const float ng = fmaf(m1, sS.w, m0 * 0x1p-24f * sS.z);
        const float ng8 = fmaf(m3, sS.w, m2 * 0x1p-6f * sS.z);
        acc[r][0] += d.x * vg - dm.x * ng; /* as v7: the block's scale and min terms meet first */
        acc[r][1] += d.y * vg8 - dm.y * ng8;
    }
}

struct mmq_args {
    const uint8_t *a, *b; /* repacked matrices (b: up, PAIR only) */
    uint32_t rows, K;     /* rows of a */
    const uint8_t *x;
    float *out;
};

/* R tiles per warp, KW warps per tile set splitting the blocks, PF: next block's weights loaded
 * before this block's arithmetic. PAIR (R = 1, KW <= 4): the CTA's sets alternate gate / up of
 * the same tile. MINB: blocks per SM for the register budget. */
template <int R, int KW, bool PF, bool PAIR, int MINB>
__global__ void __launch_bounds__(256, MINB) mmq_kernel(const mmq_args A)
{
    constexpr int SETS = 8 / KW;
    constexpr int TPC = PAIR ? SETS / 2 : SETS * R; /* output tiles per CTA */
    static_assert(!PAIR || (R == 1 && SETS >= 2), "pair: one tile per warp, gate and up sets");
    mvq_trigger(); /* programmatic dependent launch as v7: weights first, then wait for x */
    __shared__ float red[8][R][16];
    const uint32_t wid = threadIdx.x >> 5, lane = threadIdx.x & 31, kw = wid % KW, set = wid / KW;
    const uint32_t nb = A.K / 256, ntile = A.rows / 16;
    const uint8_t *unit[R];
#pragma unroll
    for (int r = 0; r < R; r++) {
        uint32_t tile = PAIR ? blockIdx.x * TPC + set / 2 : (blockIdx.x * SETS + set) * R + r;
        if (tile >= ntile) tile = ntile - 1; /* tail: recompute, store once */
        unit[r] = (PAIR && (set & 1) ? A.b : A.a) + ((size_t)tile * nb + kw) * MMQ_UNIT;
    }
    float acc[R][2];
#pragma unroll
    for (int r = 0; r < R; r++) acc[r][0] = acc[r][1] = 0.f;
    const uint8_t *xb = A.x + (size_t)kw * MMQ_XBLK;
    if (kw < nb) {
        mmq_w W[R];
#pragma unroll
        for (int r = 0; r < R; r++) mmq_load(unit[r], lane, W[r]);
        mvq_wait();
        for (uint32_t b = kw;;) {
            const bool more = b + KW < nb;
            if (PF) {
                mmq_w N[R];
                if (more)
#pragma unroll
                    for (int r = 0; r < R; r++) mmq_load(unit[r] + (size_t)KW * MMQ_UNIT, lane, N[r]);
                mmq_block<R>(W, xb, lane, acc);
                if (!more) break;
#pragma unroll
                for (int r = 0; r < R; r++) W[r] = N[r];
            } else {
                mmq_block<R>(W, xb, lane, acc);
                if (!more) break;
#pragma unroll
                for (int r = 0; r < R; r++) mmq_load(unit[r] + (size_t)KW * MMQ_UNIT, lane, W[r]);
            }
#pragma unroll
            for (int r = 0; r < R; r++) unit[r] += (size_t)KW * MMQ_UNIT;
            xb += (size_t)KW * MMQ_XBLK;
            b += KW;
        }
    } else {
        mvq_wait();
    }
    /* sum the 4 lanes of each row (t = 0..3), then the KW warps of the set */
#pragma unroll
    for (int r = 0; r < R; r++)
#pragma unroll
        for (int h = 0; h < 2; h++) {
            float v = acc[r][h];
            v += __shfl_xor_sync(0xFFFFFFFFu, v, 1);
            v += __shfl_xor_sync(0xFFFFFFFFu, v, 2);
            if ((lane & 3) == 0) red[wid][r][(lane >> 2) + 8 * h] = v;
        }
    __syncthreads();
    for (uint32_t i = threadIdx.x; i < (uint32_t)(TPC * 16); i += blockDim.x) {
        const uint32_t ot = i / 16, row16 = i % 16, tile = blockIdx.x * TPC + ot;
        if (tile >= ntile) continue;
        float y = 0.f, u = 0.f;
        if (PAIR) {
            for (int k = 0; k < KW; k++) {
                y += red[(2 * ot) * KW + k][0][row16];
                u += red[(2 * ot + 1) * KW + k][0][row16];
            }
            y = y / (1.f + expf(-y)) * u;
        } else {
            const uint32_t st = ot / R, rt = ot % R;
            for (int k = 0; k < KW; k++) y += red[st * KW + k][rt][row16];
        }
        A.out[(size_t)tile * 16 + row16] = y;
    }
}

template <int R, int KW, bool PF, bool PAIR>
static void mmq_launch(const mmq_args &A)
{
    constexpr int MINB = R >= 2 ? 2 : PF ? 3 : 4;
    const uint32_t tiles_per_cta = PAIR ? 8 / KW / 2 : (8 / KW) * R;
    const uint32_t ntile = A.rows / 16;
    cudaLaunchConfig_t cfg = {};
    cudaLaunchAttribute at[1];
    cfg.gridDim = dim3((ntile + tiles_per_cta - 1) / tiles_per_cta);
    cfg.blockDim = dim3(256);
    at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    at[0].val.programmaticStreamSerializationAllowed = 1;
    cfg.attrs = at;
    cfg.numAttrs = 1;
    cudaLaunchKernelEx(&cfg, mmq_kernel<R, KW, PF, PAIR, MINB>, A);
}

/* ---- workbench -------------------------------------------------------------------------------- */
static __device__ uint32_t hash32(uint64_t i, uint32_t seed)
{
    uint64_t z = i * 0x9E3779B97F4A7C15ull + seed * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return (uint32_t)(z ^ (z >> 31));
}
static __device__ float urand(uint64_t i, uint32_t seed) { return (float)(hash32(i, seed) >> 8) * (2.0f / 16777216.0f) - 1.0f; }

/* Raw Q4_K blocks: random qs and scale bytes, sane f16 d and dmin (as matvec.cu draws them). */
static __global__ void fill_q4k(uint8_t *p, size_t n, uint32_t seed)
{
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n / 2; i += (size_t)gridDim.x * blockDim.x) {
        uint16_t v = (uint16_t)hash32(i, seed);
        const size_t o = (2 * i) % 144;
        if (o == 0) v = __half_as_ushort(__float2half(0.002f + 0.004f * fabsf(urand(i, seed))));
        if (o == 2) v = __half_as_ushort(__float2half(0.001f + 0.002f * fabsf(urand(i, seed))));
        ((uint16_t *)p)[i] = v;
    }
}
static __global__ void fill_x(float *x, uint32_t n, uint32_t seed)
{
    const uint32_t i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] = urand(i, seed);
}
static __global__ void read_bw(const uint4 *p, size_t n, uint32_t *sink)
{
    uint32_t acc = 0;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        const uint4 v = __ldg(p + i);
        acc ^= v.x ^ v.y ^ v.z ^ v.w;
    }
    if (acc == 0x12345678u) sink[0] = acc;
}

/* A Q4_K matrix: n rotating copies in v7's layout and in ours, sampled raw rows for the check. */
struct qmat {
    uint32_t rows, cols;
    size_t bytes;
    std::vector<uint8_t *> v7, mm;
    std::vector<uint8_t> host_raw;
    std::vector<uint32_t> sample;
};
static void make_mat(qmat &m, uint32_t rows, uint32_t cols, int n_copy, uint32_t seed)
{
    m.rows = rows;
    m.cols = cols;
    const uint32_t nb = cols / 256;
    const size_t rb = (size_t)nb * 144, nblk = (size_t)rows * nb;
    m.bytes = rb * rows;
    uint8_t *raw;
    CK(cudaMalloc(&raw, m.bytes));
    for (int k = 0; k < n_copy; k++) {
        fill_q4k<<<2048, 256>>>(raw, m.bytes, seed + k);
        CK(cudaGetLastError());
        if (k == 0) {
            for (uint32_t i = 0; i < 1024 && i < rows; i++) m.sample.push_back((uint32_t)(((uint64_t)i * 2654435761u) % rows));
            m.sample.push_back(0);
            m.sample.push_back(rows - 1);
            m.host_raw.resize(rb * m.sample.size());
            for (size_t i = 0; i < m.sample.size(); i++)
                CK(cudaMemcpy(m.host_raw.data() + i * rb, raw + (size_t)m.sample[i] * rb, rb, cudaMemcpyDeviceToHost));
        }
        uint8_t *d7, *dm;
        CK(cudaMalloc(&d7, m.bytes));
        CK(cudaMalloc(&dm, m.bytes));
        mvq_repack_q4k<<<(unsigned)((nblk + 255) / 256), 256>>>(raw, d7, nblk, 0, nblk);
        const size_t nt = (size_t)rows / 16 * nb * 8;
        mmq_repack_q4k<<<(unsigned)((nt + 255) / 256), 256>>>(raw, dm, rows, nb);
        CK(cudaGetLastError());
        m.v7.push_back(d7);
        m.mm.push_back(dm);
    }
    CK(cudaDeviceSynchronize());
    CK(cudaFree(raw));
}
static void free_mat(qmat &m)
{
    for (uint8_t *p : m.v7) CK(cudaFree(p));
    for (uint8_t *p : m.mm) CK(cudaFree(p));
    m.v7.clear();
    m.mm.clear();
}

/* f64 references of the sampled rows: quant.c's f32 dequantized weights × x, summed in f64. */
static std::vector<double> reference(const qmat &m, const float *hx)
{
    const size_t rb = (size_t)m.cols / 256 * 144;
    std::vector<float> w(m.cols);
    std::vector<double> ref(m.sample.size());
    for (size_t i = 0; i < m.sample.size(); i++) {
        if (quant_dequantize_row(GGML_TYPE_Q4_K, m.host_raw.data() + i * rb, w.data(), m.cols) != 0) {
            fprintf(stderr, "quant_dequantize_row failed\n");
            exit(1);
        }
        double s = 0;
        for (uint32_t c = 0; c < m.cols; c++) s += (double)w[c] * hx[c];
        ref[i] = s;
    }
    return ref;
}
/* Rel. L2 error on the sampled rows; -1 if any output (all rows) is NaN/Inf or unwritten. */
static double check(const qmat &m, const std::vector<double> &ref, const std::vector<float> &hy, bool silu_pair,
                    const std::vector<double> *ref_up)
{
    for (uint32_t i = 0; i < m.rows; i++)
        if (!isfinite(hy[i])) return -1;
    double num = 0, den = 0;
    for (size_t i = 0; i < m.sample.size(); i++) {
        double r = ref[i];
        if (silu_pair) r = r / (1 + exp(-r)) * (*ref_up)[i];
        const double e = hy[m.sample[i]] - r;
        num += e * e;
        den += r * r;
    }
    return sqrt(num / (den > 0 ? den : 1));
}

typedef void (*launch_fn)(int copy);
static float time_it(launch_fn f, int ncopy, int reps)
{
    cudaEvent_t a, b;
    CK(cudaEventCreate(&a));
    CK(cudaEventCreate(&b));
    const int burst = 8;
    for (int i = 0; i < 2; i++) f(i % ncopy);
    std::vector<float> t;
    for (int i = 0; i < reps; i++) {
        CK(cudaEventRecord(a));
        for (int k = 0; k < burst; k++) f((i * burst + k) % ncopy);
        CK(cudaEventRecord(b));
        CK(cudaEventSynchronize(b));
        float ms;
        CK(cudaEventElapsedTime(&ms, a, b));
        t.push_back(ms / burst);
    }
    CK(cudaGetLastError());
    CK(cudaEventDestroy(a));
    CK(cudaEventDestroy(b));
    std::sort(t.begin(), t.end());
    return t[t.size() / 2];
}

/* the current case, for the launch functions */
static const qmat *g_m, *g_mu; /* g_mu: up (pair) */
static const uint8_t *g_xq7, *g_xqm;
static float *g_y;
static bool g_pdl = true;

static void run_v7(int copy)
{
    mv_launch L;
    memset(&L, 0, sizeof L);
    L.n_seg = 1;
    L.seg[0].a.type = MV_T_Q4_KD;
    L.seg[0].a.rows = g_m->rows;
    L.seg[0].a.cols = g_m->cols;
    L.seg[0].a.data = g_m->v7[copy];
    L.seg[0].out = g_y;
    if (g_mu) {
        L.seg[0].b = L.seg[0].a;
        L.seg[0].b.data = g_mu->v7[copy];
        L.seg[0].op = MV_OP_SILU_MUL;
        L.n_warps = mvq_seg_warps_r(g_m->rows, true, 4);
    } else {
        L.seg[0].op = MV_OP_STORE;
        L.n_warps = mvq_seg_warps(MV_T_Q4_KD, g_m->rows, false);
    }
    mvq_launch(0, L, g_xq7, g_pdl);
}
static void run_v7_nopdl(int copy)
{
    g_pdl = false;
    run_v7(copy);
    g_pdl = true;
}
template <int R, int KW, bool PF, bool PAIR = false>
static void run_mm(int copy)
{
    mmq_args A;
    A.a = g_m->mm[copy];
    A.b = g_mu ? g_mu->mm[copy] : NULL;
    A.rows = g_m->rows;
    A.K = g_m->cols;
    A.x = g_xqm;
    A.out = g_y;
    if constexpr (PAIR) mmq_launch<1, KW, PF, true>(A);
    else mmq_launch<R, KW, PF, false>(A);
}

/* One 16-row tile, one block, x nonzero in one sub-block σ at a time: the error of the mma kernel
 * per (σ, row half) against the f64 reference. Localizes a layout mistake in one device run. */
static void diagnose(float *x, uint8_t *xq7, uint8_t *xqm)
{
    qmat m;
    make_mat(m, 16, 256, 1, 77);
    g_m = &m;
    g_mu = NULL;
    std::vector<float> hx(256), hy(16);
    printf("diagnose (16 rows x 256, x in one sub-block; rel. err of rows 0-7 | 8-15, mma R1 / v7):\n");
    for (int sub = -1; sub < 8; sub++) {
        for (int i = 0; i < 256; i++) {
            const uint32_t h = (uint32_t)(i * 2654435761u + 12345u * (sub + 2));
            hx[i] = (sub < 0 || i / 32 == sub) ? (float)((int)(h >> 8) % 2001 - 1000) / 1000.f : 0.f;
        }
        CK(cudaMemcpy(x, hx.data(), 256 * 4, cudaMemcpyHostToDevice));
        mvq_prep_launch(0, x, xq7, 256);
        mmq_prep<<<1, 256>>>(x, xqm, 256);
        const std::vector<double> ref = reference(m, hx.data());
        printf("  sub %2d:", sub);
        for (int k = 0; k < 2; k++) {
            CK(cudaMemset(g_y, 0xFF, 16 * 4));
            if (k == 0) run_mm<1, 8, false>(0);
            else run_v7(0);
            CK(cudaDeviceSynchronize());
            CK(cudaMemcpy(hy.data(), g_y, 16 * 4, cudaMemcpyDeviceToHost));
            double n[2] = {0, 0}, d[2] = {0, 0};
            for (size_t i = 0; i < m.sample.size(); i++) {
                const int hf = m.sample[i] >= 8;
                n[hf] += (hy[m.sample[i]] - ref[i]) * (hy[m.sample[i]] - ref[i]);
                d[hf] += ref[i] * ref[i];
            }
            printf("  %s %.1e | %.1e", k == 0 ? "mma" : "v7", sqrt(n[0] / (d[0] + 1e-300)), sqrt(n[1] / (d[1] + 1e-300)));
        }
        printf("\n");
    }
    free_mat(m);
}

struct variant {
    const char *name;
    launch_fn f;
};

int main(int argc, char **argv)
{
    const int reps = argc > 1 ? atoi(argv[1]) : 25;
    cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, 0));
    printf("device: %s, %d SMs, L2 %d MB\n", prop.name, prop.multiProcessorCount, prop.l2CacheSize >> 20);

    const size_t bw_bytes = (size_t)4 << 30;
    uint4 *big;
    uint32_t *sink;
    CK(cudaMalloc(&big, bw_bytes));
    CK(cudaMalloc(&sink, 4));
    fill_q4k<<<2048, 256>>>((uint8_t *)big, bw_bytes, 1);
    std::vector<float> tb;
    cudaEvent_t ea, eb;
    CK(cudaEventCreate(&ea));
    CK(cudaEventCreate(&eb));
    for (int i = 0; i < 12; i++) {
        CK(cudaEventRecord(ea));
        read_bw<<<prop.multiProcessorCount * 8, 512>>>(big, bw_bytes / 16, sink);
        CK(cudaEventRecord(eb));
        CK(cudaEventSynchronize(eb));
        float ms;
        CK(cudaEventElapsedTime(&ms, ea, eb));
        if (i >= 2) tb.push_back(ms);
    }
    std::sort(tb.begin(), tb.end());
    const double read_gbs = bw_bytes / (tb[tb.size() / 2] * 1e-3) / 1e9;
    printf("streaming read: %.1f GB/s (4 GiB, median of 10)\n", read_gbs);
    CK(cudaFree(big));

    const variant vs[] = {
        {"v7", run_v7},
        {"v7 (no PDL)", run_v7_nopdl},
        {"mma R1 KW8", run_mm<1, 8, false>},
        {"mma R1 KW8 pf", run_mm<1, 8, true>},
        {"mma R1 KW4", run_mm<1, 4, false>},
        {"mma R1 KW4 pf", run_mm<1, 4, true>},
        {"mma R1 KW2", run_mm<1, 2, false>},
        {"mma R2 KW8", run_mm<2, 8, false>},
    };
    const variant vp[] = { /* the gate·up pair: v7's SiLU pair segment; ours gate/up warp sets */
        {"v7", run_v7},
        {"v7 (no PDL)", run_v7_nopdl},
        {"mma pair KW4", run_mm<1, 4, false, true>},
        {"mma pair KW4 pf", run_mm<1, 4, true, true>},
        {"mma pair KW2", run_mm<1, 2, false, true>},
        {"mma pair KW2 pf", run_mm<1, 2, true, true>},
    };

    float *x;
    uint8_t *xq7, *xqm;
    CK(cudaMalloc(&x, 20224 * 4));
    CK(cudaMalloc(&xq7, mvq_x_bytes(20224)));
    CK(cudaMalloc(&xqm, mmq_x_bytes(20224)));
    CK(cudaMalloc(&g_y, 202048 * 4));
    g_xq7 = xq7;
    g_xqm = xqm;
    std::vector<float> hx(20224), hy(202048);

    diagnose(x, xq7, xqm);

    /* {cols, rows, pair} */
    const uint32_t shapes[][3] = {{6656, 4096, 0}, {4096, 6656, 0}, {6656, 19968, 0}, {19968, 6656, 0}, {6656, 202048, 0}, {6656, 19968, 1}};
    int fails = 0;
    printf("\n%-22s %10s | %-16s %8s %7s %6s %9s\n", "shape (cols->rows)", "MB", "kernel", "us", "GB/s", "%read", "rel.err");
    for (auto &sh : shapes) {
        const uint32_t cols = sh[0], rows = sh[1];
        const bool pair = sh[2] != 0;
        qmat m, mu;
        const size_t bytes = (size_t)rows * cols / 256 * 144 * (pair ? 2 : 1);
        const int n_copy = (int)std::min<size_t>(8, std::max<size_t>(2, (size_t)(400u << 20) / bytes + 1));
        make_mat(m, rows, cols, n_copy, 1000 + cols + rows);
        if (pair) make_mat(mu, rows, cols, n_copy, 5000 + cols + rows);
        g_m = &m;
        g_mu = pair ? &mu : NULL;
        fill_x<<<(cols + 255) / 256, 256>>>(x, cols, cols + rows);
        mvq_prep_launch(0, x, xq7, cols);
        mmq_prep<<<cols / 256, 256>>>(x, xqm, cols);
        CK(cudaGetLastError());
        CK(cudaMemcpy(hx.data(), x, cols * 4, cudaMemcpyDeviceToHost));
        const std::vector<double> ref = reference(m, hx.data());
        std::vector<double> refu;
        if (pair) refu = reference(mu, hx.data());
        double err7 = 0;
        char label[64];
        snprintf(label, sizeof label, "%s%u->%u", pair ? "gate.up 2x " : "", cols, rows);
        const variant *V = pair ? vp : vs;
        const int NV = pair ? (int)(sizeof vp / sizeof vp[0]) : (int)(sizeof vs / sizeof vs[0]);
        for (int v = 0; v < NV; v++) {
            CK(cudaMemset(g_y, 0xFF, (size_t)rows * 4)); /* NaN poison */
            V[v].f(0);
            CK(cudaDeviceSynchronize());
            CK(cudaMemcpy(hy.data(), g_y, (size_t)rows * 4, cudaMemcpyDeviceToHost));
            const double err = check(m, ref, hy, pair, pair ? &refu : NULL);
            if (v == 0) err7 = err;
            const float ms = time_it(V[v].f, n_copy, reps);
            const double gbs = bytes / (ms * 1e-3) / 1e9;
            /* ours must be finite, written, < 1e-6; report whether it is <= v7's */
            const bool ok = err >= 0 && err < 1e-6;
            if (!ok) fails++;
            printf("%-22s %10.1f | %-16s %8.1f %7.0f %5.1f%% %9.2e %s%s\n", v == 0 ? label : "", bytes / 1e6, V[v].name, ms * 1e3, gbs,
                   100 * gbs / read_gbs, err, ok ? "ok" : "BAD", v > 1 && err > err7 ? " (> v7)" : "");
        }
        free_mat(m);
        if (pair) free_mat(mu);
    }
    /* the per-token x prep of each form, timed alone */
    for (uint32_t K : {4096u, 6656u, 19968u}) {
        std::vector<float> t7, tm;
        for (int it = 0; it < reps + 2; it++) {
            float ms;
            CK(cudaEventRecord(ea));
            mvq_prep_launch(0, x, xq7, K);
            CK(cudaEventRecord(eb));
            CK(cudaEventSynchronize(eb));
            CK(cudaEventElapsedTime(&ms, ea, eb));
            if (it >= 2) t7.push_back(ms);
            CK(cudaEventRecord(ea));
            mmq_prep<<<K / 256, 256>>>(x, xqm, K);
            CK(cudaEventRecord(eb));
            CK(cudaEventSynchronize(eb));
            CK(cudaEventElapsedTime(&ms, ea, eb));
            if (it >= 2) tm.push_back(ms);
        }
        std::sort(t7.begin(), t7.end());
        std::sort(tm.begin(), tm.end());
        printf("x prep K=%u: v7 mvq_prep %.1f us, mmq_prep %.1f us (one launch each, timed alone)\n", K, t7[t7.size() / 2] * 1e3,
               tm[tm.size() / 2] * 1e3);
    }
    printf("\nkbench_mma: %s\n", fails ? "FAILED" : "all checks ok");
    return fails ? 1 : 0;
}
