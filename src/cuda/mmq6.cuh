/* mmq6.cuh — the Q6_K matvec on tensor cores ("mmq6"): the exact-integer products as
 * mma.sync m16n8k32 s8 × s8 → s32, the Q6_K counterpart of mmq.cuh. Workbench, design story
 * and numbers: bench/kernels/mma6.cu and bench/kernels/NOTES.md ("mma6").
 *
 * Numerics. x as for mmq.cuh: per 32-group a power of two s and X = rint(x/s), 24-bit, the
 * same s and X (mmq_group_int), split into four s8 digits X = e0 + 2^7·e1 + 2^14·e2 +
 * 2^21·e3 (e0..e2 ∈ [0,127], e3 ∈ [−4,3]). A Q6_K weight is d·sc·(q − 32) (d f16 per row and
 * block, sc int8 per 16 elements, q 6-bit). The A operand is 4·(q − 32) ∈ [−128, 124] as an s8:
 * the −32 is inside the product, so no Σx term is needed. Per (row, 16-group) the mma gives, in
 * two lanes, the exact integers lo = Σ 4(q−32)·(e0 + 2^7·e1) (|lo| < 2^25, a multiple of 4: exact
 * in f32) and hi = Σ 4(q−32)·(e2 + 2^7·e3) (|hi| ≤ 2^20); each lane turns its integer into f32
 * exactly (s/4 and s·2^12 are powers of two), multiplies by sc and chains its 8 chunks in f32
 * (one rounding per 16 weights, at the magnitude of sc·Σ(q−32)·x: the −32 has cancelled before
 * any rounding); then d·part and the running sum over blocks in f64, and the 4 lanes of a row and
 * the KW warps of a tile in f64 in a fixed order: one rounding to f32 per output (below the error
 * of the DP4A kernel with separately rounded Σx terms, bench/kernels/mvq.cuh; the workbench
 * reports both on the same data). A non-finite x makes its group's s NaN, so every output
 * reading it is NaN (fail closed).
 *
 * mma fragments (PTX ISA, m16n8k32 .s8): lane (g, t) = (lane >> 2, lane & 3) holds A rows g, g+8
 * at k = 4t..4t+3 (a0: row g, a1: row g+8) and k = 16+4t..16+4t+3 (a2: row g, a3: row g+8); B
 * column g at k = 4t.. (b0) and 16+4t.. (b1); C rows g, g+8 at columns 2t, 2t+1 (c0,c1 | c2,c3).
 * Here k = the 32 elements of chunk c (c = 0..7 of a 256-block; one 32-group of x, so one s),
 * k 0..15 its first 16-group ("half" 0), 16..31 the second. B column n = 4h + d is digit d of
 * the elements of half h and 0 on the other half, so B lane (g, t) has one nonzero register: b_h
 * with h = g >> 2, holding digit g & 3 of elements 16h + 4t .. 16h + 4t + 3. C lane t then holds
 * half t >> 1, digits 2(t&1), 2(t&1)+1 for rows g and g+8: lo (t even) or hi (t odd) as
 * c0 + 128·c1 and c2 + 128·c3. One mma per chunk per 16-row tile, 8 per (tile, block).
 *
 * Weights (a new matrix type for the engine, e.g. MV_T_Q6_KT; mmq6_repack_q6k at upload; 210
 * bytes per block as in GGUF): units of (16-row tile, block), MMQ6_UNIT = 3360 bytes = 16 × 210, unit (tile, b) at
 * (tile·nb + b)·3360:
 *   [0, 3072)    six planes p = 0..5 of [lane][16 B]: plane 2j + (c >> 2), word c & 3 of lane
 *                (g, t) is word W_j of chunk c (j = 0, 1, 2), so each of a lane's six 16-byte
 *                loads is a warp load of 512 contiguous bytes. With Q = q ^ 32 (6 bits; 4·Q read
 *                as an s8 is 4(q − 32)) and byte i of each word belonging to element 4t + i of
 *                its half:
 *                  W0 byte i = Q(row g,   half 0) << 2 | bits 0-1 of Q(row g+8, half 1)
 *                  W1 byte i = Q(row g+8, half 0) << 2 | bits 2-3 of Q(row g+8, half 1)
 *                  W2 byte i = Q(row g,   half 1) << 2 | bits 4-5 of Q(row g+8, half 1)
 *                so a0..a2 = W & 0xFCFCFCFC and a3 = (Σ_j (W_j & 0x03030303) << 2j) << 2:
 *                9 integer instructions per 64 weights·lane, no byte shuffles.
 *   [3072, 3328) scales: per row pair g and half h 16 bytes at 32g + 16h: byte 2c + r is the
 *                int8 scale of row g + 8r, 16-group 2c + h (one 16-byte load per lane).
 *   [3328, 3360) d: per row pair g a 32-bit word d(g) | d(g+8) << 16 (f16 bits) at 4g.
 *
 * x (mmq6_prep / mmq6_prep_warp; MMQ6_XBLK = 2112 bytes per 256 elements, mmq6_x_bytes):
 *   [0, 2048)    B fragments: uint4 j (chunks 2j, 2j+1) of lane L at 512j + 16L, words
 *                (b0, b1) of chunk 2j then (b0, b1) of chunk 2j + 1; one of each pair is zero.
 *   [2048, 2112) s_eff: [2][8] f32: s_c/4 (lo lanes), s_c·2^12 (hi lanes) for chunk c.
 *
 * Launch: CTAs of NW warps; KW warps split the blocks of the same tiles, R tiles per warp;
 * fixed-order f64 reduction in the epilogue (replays are bit-identical); programmatic dependent
 * launch (cu_pdl_trigger at the top, the first weights loaded before cu_pdl_wait, x only
 * after it, through cu_ldx). mmq6_launch_auto: the LM head (≥ 4096 tiles) R 2 KW 2, every
 * other shape R 1 KW 8 with the next block's weights prefetched into registers (kbench_mma6,
 * H200: 19968→6656 at 85% of the streaming read, the LM head at 97%). Output ops: MV_OP_STORE
 * and MV_OP_SOFTCAP (y·scale, then cap·tanh(y/cap) when cap > 0, as the general path does).
 *
 * For the integrator: the input must be in mmq6's x layout (mmq6_prep_launch, or a producer
 * calling mmq6_prep_warp per 32-group), a buffer of mmq6_x_bytes(K), 16-byte aligned; it is not
 * mmq's layout. */
#ifndef MUSER_CUDA_MMQ6_CUH
#define MUSER_CUDA_MMQ6_CUH

#include "cuda/mmq.cuh"

/* ---- layouts -------------------------------------------------------------------------------- */
#define MMQ6_UNIT 3360u /* bytes of one (16-row tile, block) unit: 16 × 210 */
#define MMQ6_SC 3072u   /* the unit's scale table */
#define MMQ6_D 3328u    /* the unit's d words */
#define MMQ6_XBLK 2112u /* x bytes of one block: 2048 B of B fragments + 64 B of s_eff */
#define MMQ6_XS 2048u   /* s_eff within an x block */

static inline size_t mmq6_x_bytes(uint32_t K) { return (size_t)K / 256 * MMQ6_XBLK; }

/* A matrix mmq6 can take: whole 16-row tiles, whole blocks. */
static inline bool mmq6_shape_ok(uint32_t rows, uint32_t cols) { return rows % 16 == 0 && cols % 256 == 0 && rows >= 16; }

/* Q = q ^ 32 of element e of a GGUF block_q6_K (ql[128], qh[64], scales[16], d): element
 * e = 128n + 32k + l has its low nibble in ql[64n + 32(k&1) + l] (nibble k >> 1) and its two
 * high bits in qh[32n + l] (bits 2k). */
__host__ __device__ inline uint32_t mmq6_Q(const uint8_t *blk, uint32_t e)
{
    const uint32_t n = e / 128, k = (e % 128) / 32, l = e % 32;
    const uint32_t lo = (blk[64 * n + 32 * (k & 1) + l] >> (4 * (k >> 1))) & 15u;
    const uint32_t hi = (blk[128 + 32 * n + l] >> (2 * k)) & 3u;
    return (lo | hi << 4) ^ 32u;
}

/* The bytes of unit u that come from row pair g: GGUF blocks r0 (row g) and r8 (row g + 8). */
__host__ __device__ inline void mmq6_repack_pair(const uint8_t *r0, const uint8_t *r8, uint32_t g, uint8_t *u)
{
    for (uint32_t t = 0; t < 4; t++)
        for (uint32_t c = 0; c < 8; c++)
            for (uint32_t i = 0; i < 4; i++) {
                const uint32_t e0 = 32 * c + 4 * t + i, e1 = e0 + 16; /* halves 0 and 1 */
                const uint32_t q3 = mmq6_Q(r8, e1);                  /* a3's value, in pieces */
                const uint32_t w[3] = {mmq6_Q(r0, e0) << 2 | (q3 & 3u), mmq6_Q(r8, e0) << 2 | ((q3 >> 2) & 3u),
                                       mmq6_Q(r0, e1) << 2 | ((q3 >> 4) & 3u)};
                for (uint32_t j = 0; j < 3; j++)
                    u[((2 * j + (c >> 2)) * 32 + 4 * g + t) * 16 + 4 * (c & 3) + i] = (uint8_t)w[j];
            }
    for (uint32_t h = 0; h < 2; h++)
        for (uint32_t c = 0; c < 8; c++) {
            u[MMQ6_SC + 32 * g + 16 * h + 2 * c] = r0[192 + 2 * c + h];
            u[MMQ6_SC + 32 * g + 16 * h + 2 * c + 1] = r8[192 + 2 * c + h];
        }
    u[MMQ6_D + 4 * g] = r0[208];
    u[MMQ6_D + 4 * g + 1] = r0[209];
    u[MMQ6_D + 4 * g + 2] = r8[208];
    u[MMQ6_D + 4 * g + 3] = r8[209];
}

/* src: `rows` (a multiple of 16) GGUF Q6_K rows of nb blocks; dst: the whole repacked matrix,
 * these rows from tile first_tile on (the upload's chunks). A thread per (tile, block, row pair):
 * grid ((rows / 16 · nb · 8 + 255) / 256) × 256. */
static __global__ void mmq6_repack_q6k(const uint8_t *__restrict__ src, uint8_t *__restrict__ dst, uint32_t rows, uint32_t nb,
                                       size_t first_tile)
{
    const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (size_t)rows / 16 * nb * 8) return;
    const uint32_t g = (uint32_t)(i % 8), b = (uint32_t)((i / 8) % nb);
    const size_t tile = i / 8 / nb;
    mmq6_repack_pair(src + ((tile * 16 + g) * nb + b) * 210, src + ((tile * 16 + g + 8) * nb + b) * 210, g,
                     dst + ((first_tile + tile) * nb + b) * MMQ6_UNIT);
}

/* ---- x ---------------------------------------------------------------------------------------- */
/* One 32-group of x into buf in the B-fragment layout: lane l holds v = x[p], p = 32G + l; all 32
 * lanes call it (the same s and X as mmq). Kernels that produce a matvec input with a warp
 * per 32 consecutive elements can call it as they write x, as mmq_prep_warp for mmq. Each lane
 * writes one 8-byte (b0, b1) pair: the 4 lanes of a 4-element group trade their packed digits,
 * and lane i of the group writes digit i of all four. */
/* The group's scale *s and the word lane e writes: digit e & 3 of the four elements of its 4-lane
 * group (byte j from lane (e & ~3) + j). Both Q6_K layouts (mmq6_prep_warp, mmqd6_prep_warp) store
 * these words, each in its own place. */
__device__ __forceinline__ uint32_t mmq6_digit_word(float v, uint32_t e, float *s)
{
    const int X = mmq_group_int(v, s);
    const uint32_t D = (uint32_t)(X & 127) | (uint32_t)((X >> 7) & 127) << 8 | (uint32_t)((X >> 14) & 127) << 16 |
                       (uint32_t)(X >> 21) << 24; /* byte d = digit d (e3 signed) */
    uint32_t Dj[4];
#pragma unroll
    for (int j = 0; j < 4; j++) Dj[j] = __shfl_sync(0xFFFFFFFFu, D, (int)((e & ~3u) | (uint32_t)j));
    const uint32_t i = e & 3;
    const uint32_t sel = i | (i + 4) << 4;
    return __byte_perm(__byte_perm(Dj[0], Dj[1], sel), __byte_perm(Dj[2], Dj[3], sel), 0x5410);
}

__device__ __forceinline__ void mmq6_prep_warp(float v, uint32_t p, uint8_t *__restrict__ buf)
{
    const uint32_t e = p & 31, c = (p >> 5) & 7;
    uint8_t *blk = buf + (size_t)(p >> 8) * MMQ6_XBLK;
    float s;
    const uint32_t w = mmq6_digit_word(v, e, &s);
    const uint32_t i = e & 3, h = e >> 4, t = (e >> 2) & 3;
    const uint32_t L = 4 * (4 * h + i) + t; /* the B lane: column 4h + i, same t */
    *(uint2 *)(blk + (c >> 1) * 512 + 16 * L + 8 * (c & 1)) = h ? make_uint2(0u, w) : make_uint2(w, 0u);
    if (e == 0) {
        float *se = (float *)(blk + MMQ6_XS);
        se[c] = s * 0.25f;       /* lo lanes: A is 4(q − 32) */
        se[8 + c] = s * 4096.f;  /* hi lanes: 2^14 / 4 */
    }
}

/* The prep of this layout (mmq_prep_kernel in mmq.cuh): K a multiple of 256, buf 16-byte aligned. */
struct mmq_prep_q6 {
    static constexpr int tag = TL_MMQ6_PREP;
    static __device__ __forceinline__ void write(float v, uint32_t p, uint8_t *buf) { mmq6_prep_warp(v, p, buf); }
};
static inline void mmq6_prep_launch(cudaStream_t st, const float *x, uint8_t *buf, uint32_t K, bool pdl = false)
{
    mmq_prep_launch_t<mmq_prep_q6>(st, x, buf, K, pdl);
}

/* ---- the kernel ------------------------------------------------------------------------------ */
/* A operand of chunk c from its three words: 4·(q − 32) as s8 per byte. */
__host__ __device__ __forceinline__ void mmq6_decode(uint32_t w0, uint32_t w1, uint32_t w2, uint32_t a[4])
{
    const uint32_t M = 0xFCFCFCFCu, P = 0x03030303u;
    a[0] = w0 & M;
    a[1] = w1 & M;
    a[2] = w2 & M;
    a[3] = ((w0 & P) | (w1 & P) << 2 | (w2 & P) << 4) << 2;
}

__device__ __forceinline__ void mmq6_mma(int c[4], const uint32_t a[4], uint32_t b0, uint32_t b1)
{
    asm("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%10, %10, %10, %10};"
        : "=r"(c[0]), "=r"(c[1]), "=r"(c[2]), "=r"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1), "r"(0));
}

/* One tile's weights for one block: six q words per chunk set, the lane's scales and d pair.
 * The lane's pointer q points at its 16 bytes of plane 0 (unit + 16·lane); its scales and d sit
 * at the lane offsets mmq6_lane_off from there. */
struct mmq6_w {
    uint4 q[6];
    uint4 sc;
    uint32_t d;
};
struct mmq6_off {
    int32_t sc, d;
};
__device__ __forceinline__ mmq6_off mmq6_lane_off(uint32_t lane)
{
    mmq6_off o;
    o.sc = (int32_t)(MMQ6_SC + 32 * (lane >> 2) + 16 * ((lane >> 1) & 1)) - (int32_t)(16 * lane);
    o.d = (int32_t)(MMQ6_D + 4 * (lane >> 2)) - (int32_t)(16 * lane);
    return o;
}
__device__ __forceinline__ void mmq6_load(const uint8_t *q, const mmq6_off &o, mmq6_w &W)
{
#pragma unroll
    for (int u = 0; u < 6; u++) W.q[u] = cu_ldw(q + u * 512);
    W.sc = cu_ldw(q + o.sc);
    W.d = cu_ldw32(q + o.d);
}

/* int8 byte k of w as f32 */
__device__ __forceinline__ float mmq6_s8f(uint32_t w, int k) { return (float)(int8_t)(uint8_t)(w >> (8 * k)); }

/* One block, R tiles: xq = the lane's B fragments (x block + 16·lane), xs = its s_eff (x block
 * + MMQ6_XS + 32·(lane & 1)). part[r][0] (row g), [1] (row g + 8): the lane's Σ sc·s·P over the
 * 8 chunks in f32; then acc += d·part, the product exact in f64, the running sum in f64. */
template <int R>
__device__ __forceinline__ void mmq6_block(const mmq6_w W[R], const uint8_t *xq, const uint8_t *xs, double acc[R][2])
{
    float part[R][2];
#pragma unroll
    for (int j = 0; j < 4; j++) { /* chunk pairs: x loaded as it is used (registers) */
        const uint4 B = cu_ldx<uint4>(xq + j * 512); /* x after cu_pdl_wait: see cu_ldx in launch.cuh */
        const float2 se = cu_ldx<float2>(xs + 8 * j);
#pragma unroll
        for (int c2 = 0; c2 < 2; c2++) {
            const int c = 2 * j + c2;
            const uint32_t b0 = c2 ? B.z : B.x, b1 = c2 ? B.w : B.y;
            const float s = c2 ? se.y : se.x;
#pragma unroll
            for (int r = 0; r < R; r++) {
                uint32_t a[4];
                mmq6_decode(cu_word(W[r].q[c >> 2], c & 3), cu_word(W[r].q[2 + (c >> 2)], c & 3), cu_word(W[r].q[4 + (c >> 2)], c & 3),
                            a);
                int C[4];
                mmq6_mma(C, a, b0, b1);
                /* exact integers, exact f32 (multiple of 4 below 2^25, or below 2^20), exact × s_eff */
                const float vg = s * (float)(C[0] + 128 * C[1]);
                const float vg8 = s * (float)(C[2] + 128 * C[3]);
                const uint32_t sw = cu_word(W[r].sc, j);
                const float sg = mmq6_s8f(sw, 2 * c2), sg8 = mmq6_s8f(sw, 2 * c2 + 1);
                part[r][0] = c == 0 ? sg * vg : fmaf(sg, vg, part[r][0]);
                part[r][1] = c == 0 ? sg8 * vg8 : fmaf(sg8, vg8, part[r][1]);
            }
        }
    }
#pragma unroll
    for (int r = 0; r < R; r++) {
        const float2 d = __half22float2(*(const __half2 *)&W[r].d);
        acc[r][0] = fma((double)d.x, (double)part[r][0], acc[r][0]);
        acc[r][1] = fma((double)d.y, (double)part[r][1], acc[r][1]);
    }
}

/* mmq6_block over the nx (<= NX) x rows of a multi-row pass, x row n at xq/xs + n·xstride: each
 * row's arithmetic is mmq6_block's for it alone (mmq_block_rows says why). Decoding each chunk's A
 * once for all rows instead (rows innermost) measured 8% slower at 4 rows and equal at 16 (H200):
 * the registers it holds cost more than the decode. */
template <int R, int NX>
__device__ __forceinline__ void mmq6_block_rows(const mmq6_w W[R], const uint8_t *xq, const uint8_t *xs, uint32_t xstride,
                                                uint32_t nx, double acc[NX][R][2])
{
#pragma unroll
    for (int n = 0; n < NX; n++)
        if (n == 0 || (uint32_t)n < nx) mmq6_block<R>(W, xq + (size_t)n * xstride, xs + (size_t)n * xstride, acc[n]);
}

struct mmq6_args {
    const uint8_t *a;  /* repacked matrix (mmq6_repack_q6k) */
    uint32_t rows, K;  /* rows a multiple of 16, K of 256 */
    const uint8_t *x;  /* mmq6_prep output of the input: mmq6_x_bytes(K) */
    float *out;        /* [rows] */
    uint32_t op;       /* MV_OP_STORE or MV_OP_SOFTCAP */
    float scale, cap;  /* MV_OP_SOFTCAP: out = cap·tanh(y·scale/cap), or y·scale if cap == 0 */
    uint32_t nx, xs, os, ng; /* a multi-row pass, as mmq_args */
};

/* R tiles per warp; KW warps per tile set splitting the blocks; NW warps per CTA; PF: the next
 * block's weights loaded before this block's arithmetic (twice the weight registers) instead of
 * after it; MINB: CTAs per SM for the registers. */
template <int R, int KW, int NW, bool PF, int NX = 1>
__device__ __forceinline__ void mmq6_body(const mmq6_args &A0, uint32_t cta, uint32_t grp = 0)
{
    constexpr int SETS = NW / KW;
    constexpr int TPC = SETS * R; /* output tiles per CTA */
    cu_pdl_trigger(); /* weights first, then wait for x */
    __shared__ double red[NX][NW][R][16];
    mmq6_args A = A0;
    const uint32_t nx = mmq_group<mmq6_args, NX>(A, grp);
    const uint32_t wid = threadIdx.x >> 5, lane = threadIdx.x & 31, kw = wid % KW, set = wid / KW;
    const uint32_t nb = A.K / 256, ntile = A.rows / 16;
    const mmq6_off o = mmq6_lane_off(lane);
    const uint8_t *q[R];
#pragma unroll
    for (int r = 0; r < R; r++) {
        uint32_t tile = (cta * SETS + set) * R + r;
        if (tile >= ntile) tile = ntile - 1; /* tail: recompute, store once */
        q[r] = A.a + ((size_t)tile * nb + kw) * MMQ6_UNIT + 16 * lane;
    }
    double acc[NX][R][2];
#pragma unroll
    for (int n = 0; n < NX; n++)
#pragma unroll
        for (int r = 0; r < R; r++) acc[n][r][0] = acc[n][r][1] = 0.0;
    uint32_t xo = kw * MMQ6_XBLK; /* 32-bit offsets into x (K below 5·10^8) */
    const uint32_t xql = 16 * lane, xsl = MMQ6_XS + 32 * (lane & 1);
    mmq_walk<R, KW, PF, mmq6_w>(
        kw, nb,
        [&](mmq6_w *W, int ahead) {
#pragma unroll
            for (int r = 0; r < R; r++) mmq6_load(q[r] + (size_t)ahead * KW * MMQ6_UNIT, o, W[r]);
        },
        [&](const mmq6_w *W) { mmq6_block_rows<R, NX>(W, A.x + xo + xql, A.x + xo + xsl, A.xs, nx, acc); },
        [&]() {
#pragma unroll
            for (int r = 0; r < R; r++) q[r] += (size_t)KW * MMQ6_UNIT;
            xo += KW * MMQ6_XBLK;
        },
        mmq_pdl_wait());
    /* the 4 lanes of a row (half 0/1 × lo/hi digits), then the KW warps of the set: f64, fixed
     * order */
#pragma unroll
    for (int n = 0; n < NX; n++)
#pragma unroll
        for (int r = 0; r < R; r++) mmq_rows_f64(acc[n][r][0], acc[n][r][1], red[n][wid][r], lane);
    __syncthreads();
    for (uint32_t i = threadIdx.x; i < nx * (uint32_t)(TPC * 16); i += blockDim.x) {
        const uint32_t n = i / (TPC * 16), ot = i % (TPC * 16) / 16, row16 = i % 16, tile = cta * TPC + ot;
        if (tile >= ntile) continue;
        const uint32_t st = ot / R, rt = ot % R;
        double ys = 0;
        for (int k = 0; k < KW; k++) ys += red[n][st * KW + k][rt][row16];
        float y = (float)ys;
        if (A.op == MV_OP_SOFTCAP) { /* the LM head, as the general path */
            y = y * A.scale;
            if (A.cap > 0.f) y = A.cap * tanhf(y / A.cap);
        }
        A.out[(size_t)n * A.os + (size_t)tile * 16 + row16] = y;
    }
}
template <int R, int KW, int NW, bool PF, int MINB, int NX = 1>
__global__ void __launch_bounds__(NW * 32, MINB) mmq6_kernel(const mmq6_args A)
{
    CU_TL_SCOPE(TL_MMQ6);
    mmq6_body<R, KW, NW, PF, NX>(A, mmq_cta(A.ng), mmq_grp(A.ng));
}

/* One x row (a multi-row pass runs mmqd6.cuh's kernels). MINB = 0: CTAs per SM for ~64 registers
 * per thread (R 1), ~128 (R 2 or PF). pdl: programmatic stream serialization (see cu_pdl_wait). */
template <int R, int KW, int NW, bool PF, int MINB_ = 0>
static cudaError_t mmq6_launch(const mmq6_args &A0, cudaStream_t st = 0, bool pdl = true)
{
    constexpr int T = R >= 2 || PF ? 512 : 1024;
    constexpr int MINB = MINB_ ? MINB_ : T / (NW * 32) > 0 ? T / (NW * 32) : 1;
    const uint32_t tiles_per_cta = (NW / KW) * R, ntile = A0.rows / 16;
    mmq6_args A = A0;
    A.ng = 1;
    cudaLaunchAttribute at[1];
    const cudaLaunchConfig_t cfg =
        cu_pdl_cfg(dim3((ntile + tiles_per_cta - 1) / tiles_per_cta * A.ng), dim3(NW * 32), st, pdl, at);
    return cudaLaunchKernelEx(&cfg, mmq6_kernel<R, KW, NW, PF, MINB>, A);
}

/* The engine's choice per shape (kbench_mma6, H200): see bench/kernels/NOTES.md ("mma6"). */
static inline cudaError_t mmq6_launch_auto(const mmq6_args &A, cudaStream_t st, bool pdl)
{
    const uint32_t ntile = A.rows / 16;
    if (ntile >= 4096) return mmq6_launch<2, 2, 8, false>(A, st, pdl); /* the LM head */
    return mmq6_launch<1, 8, 8, true>(A, st, pdl);                     /* ffn_down, attn_v, ... */
}

/* ffn_down (416 tiles on Glimmer): one tile per CTA of 4 warps at 4 CTAs per SM, so the tiles run
 * in one wave (528 slots on 132 SMs) instead of mmq6_launch_auto's two of 264 (H200, interleaved:
 * +0.5% per token; the same bits, the sums being f64). */
static inline cudaError_t mmq6_launch_down(const mmq6_args &A, cudaStream_t st, bool pdl)
{
    return mmq6_launch<1, 4, 4, false, 4>(A, st, pdl);
}

/* ---- the attention projections with a Q6_K v: one launch ------------------------------------ */
/* The Q4_KT stack (q | k | gate) and a Q6_KT v read the same input; as two launches v's 16 CTAs
 * ran after the whole stack (~4.8 us a layer in 25 of Glimmer's 52). Here one grid: CTAs [0, nv)
 * take v's tiles as mmq6_launch_auto's per-layer shape does (R 1, KW 8, next block prefetched), the
 * rest the stack's as mmq_launch_auto's (R 2, KW 8), at 3 CTAs per SM (the 80-register builds) so
 * the 16 + 264 CTAs run in one wave, v's first. Same arithmetic per output as the two launches. */
static __global__ void __launch_bounds__(256, 3) mmq_stack_v(const mmq_args S, const mmq6_args V, uint32_t nv)
{
    CU_TL_SCOPE(TL_MMQ);
    const uint32_t c = mmq_cta(S.ng), grp = mmq_grp(S.ng);
    if (c < nv) mmq6_body<1, 8, 8, true>(V, c, grp);
    else mmq_body<2, 8, false, false, mmq_pdl_wait>(S, c - nv, mmq_pdl_wait(), grp);
}

/* S: the stack (rows a multiple of 16, x in mmq's layout); V: v (x in mmq6's), MV_OP_STORE; one x
 * row (a multi-row pass runs mmqd_stack_v). */
static inline void mmq_stack_v_launch(const mmq_args &S0, const mmq6_args &V0, cudaStream_t st, bool pdl)
{
    const uint32_t nv = V0.rows / 16, ns = (S0.rows / 16 + 1) / 2;
    mmq_args S = S0;
    mmq6_args V = V0;
    S.ng = V.ng = 1;
    cudaLaunchAttribute at[1];
    const cudaLaunchConfig_t cfg = cu_pdl_cfg(dim3((nv + ns) * S.ng), dim3(256), st, pdl, at);
    cudaLaunchKernelEx(&cfg, mmq_stack_v, S, V, nv);
}

#endif
