/* mvq.cuh — workbench entry: v7, the integer-digit K-quant matvec (DP4A), the route's matvec before
 * the tensor-core kernels (src/cuda/mmq.cuh, mmq6.cuh) took its numerics onto mma.sync. Measured
 * (H200, kbench_mma, bench/kernels/NOTES.md "mma"): Q4_K 6656→4096 33%, 6656→19968 57%,
 * 19968→6656 66%, the 6656→202048 head 82% of the streaming read, against the tensor-core kernel's
 * 45 / 73 / 77 / 96% on the same data; in the engine (one run, bench/RESULTS.md history) v7
 * everywhere decoded Glimmer at 145.4 tok/s where the first tensor-core route gave 160.0 (today's
 * route: 191.7). kbench_matvec, kbench_mma and kbench_mma6 time it beside its successors.
 *
 * Why: the f32 kernels of matvec.cuh spend 4.4–5.7 instructions per Q4_K weight turning nibbles
 * into floats (PRMT + FADD/FFMA per weight), so they are issue-bound near 1.8 TB/s, while the
 * H200 streams 4.5 TB/s. Here the multiply-adds run as DP4A (4 byte products + add, one
 * instruction) on exact integers: ~1.6 instructions per weight in the inner loop, ~2.9 for the
 * whole kernel (SASS count; bench/kernels/NOTES.md).
 *
 * The activations stay f32-exact to within half an ulp of each 32-element group's largest
 * element. The matvec input x is written once per token as block floating point (by mvq_prep, or
 * by the kernel that produces x, with mvq_prep_warp): per group
 * g of 32 elements a power of two s_g with max|x| < 2^23·s_g, and X = rint(x/s_g), a 24-bit
 * signed integer, split into three byte digits X = 65536·d2 + 256·d1 + d0 (d0, d1 unsigned,
 * d2 signed). |x − s_g·X| ≤ s_g/2 = 2^-24·2^e where 2^(e−1) ≤ max|x| < 2^e: the rounding an f32
 * sum of magnitude max|x| makes anyway. Nothing is stored lossy between operations (SPEC §4):
 * this is the representation of the f32 vector the dot products read, built from it each time.
 * A dot over one 32-group is then Σ q·X = 65536·Σ q·d2 + 256·Σ q·d1 + Σ q·d0, three DP4A chains
 * of exact integers; the result is converted to f32 once per (row, 32 weights).
 * A non-finite x makes its group's s NaN, so every output that reads it is NaN (fail closed).
 *
 * Prepared x (mvq_x_bytes): 432-byte records of 128 positions holding the digits, the group
 * scales s and S16 = s·Σ X over each 16 elements (the Q4_K mins and the Q6_K −32 need Σx); see
 * "prepared x" below.
 *
 * Lanes: 4 per 256-block, lane c owns positions 64c .. 64c+63 of the block (sub-blocks 2c, 2c+1
 * of Q4_K; 16-groups 4c .. 4c+3 of Q6_K); a warp covers 8 blocks per step and R rows, which share
 * the x loads.
 * Both formats are repacked at upload into planes of the GGUF size, laid out so that each
 * 16-byte load instruction of a warp reads whole 32-byte sectors (a sector fetched twice from L2
 * halved the throughput of the first version): byte (lane c, half p, j) at 64p + 16c + j.
 * Q4_K (mvq_repack_q4k, MV_T_Q4_KD): qs [nblk][128] (GGUF qs byte 32c + 16p + j, which holds
 *   positions 64c + 16p + j (low nibble) and 64c + 32 + 16p + j (high)), hdr [nblk][16].
 * Q6_K (mvq_repack_q6k, MV_T_Q6_KD):
 *   ql [nblk][128]: lane c, l = 16p + j: lo4(64c + l) | lo4(64c + 32 + l) << 4
 *   qh [nblk][64] : byte 16c + 4m + j, bits 2s..2s+1 = hi2(64c + 16s + 4m + j)
 *   sc [nblk][16] : the GGUF int8 scales, sc[t/16] for position t
 *   d  [nblk]     : f16
 * so a lane's 64 six-bit values come from 48 contiguous bytes with no per-lane byte shuffling. */
#ifndef MUSER_CUDA_MVQ_CUH
#define MUSER_CUDA_MVQ_CUH

#include "cuda/matvec.cuh"
#include "cuda/mmq.cuh" /* mmq_group_int, and launch.cuh */

/* Device-only layouts of v7: Q4_K and Q6_K repacked into planes, same bytes. */
#define MV_T_Q4_KD 112u
#define MV_T_Q6_KD 114u

/* ---- prepared x --------------------------------------------------------------------------- */
/* Records of 128 positions (a half block), MVQ_REC bytes each:
 *   [0, 384)   digits d0 | d1 | d2, 128 bytes each
 *   [384, 400) s of the record's four 32-groups (f32)
 *   [400, 432) S16 = s·Σ X of its eight 16-groups (f32)
 * A lane's whole x for one block (64 positions) is in one record at one pointer with immediate
 * offsets, and 432 ≡ 48 (mod 128) puts the 8 lanes of a 16-byte load phase (2 blocks × 4 lanes:
 * 4 records × 2 halves) on 8 distinct 16-byte bank groups. */
#define MVQ_REC 432u

typedef struct mvq_x {
    const uint8_t *rec; /* [K/128][MVQ_REC] */
    uint32_t K;
} mvq_x;

static inline size_t mvq_x_bytes(uint32_t K) { return (size_t)K / 128 * MVQ_REC; }

__host__ __device__ inline mvq_x mvq_x_at(const uint8_t *buf, uint32_t K)
{
    mvq_x q;
    q.rec = buf;
    q.K = K;
    return q;
}

/* One 32-group of x into buf: lane l holds v = x[p], p = 32g + l; all 32 lanes call it. Kernels
 * that produce a matvec input with a warp per 32 consecutive elements (the tails, the embedding
 * norm, the attention combine) called it as they wrote x, when v7 was the route's matvec. The
 * group's s and X are mmq_group_int's (src/cuda/mmq.cuh): the same integers as v8. */
__device__ __forceinline__ void mvq_prep_warp(float v, uint32_t p, uint8_t *__restrict__ buf)
{
    const uint32_t lane = p & 31;
    float s;
    const int X = mmq_group_int(v, &s);
    uint8_t *r = buf + (size_t)(p >> 7) * MVQ_REC;
    const uint32_t w = p & 127;
    r[w] = (uint8_t)(X & 255);
    r[128 + w] = (uint8_t)((X >> 8) & 255);
    r[256 + w] = (uint8_t)((X >> 16) & 255);
    int t = X;
#pragma unroll
    for (int o = 1; o < 16; o <<= 1) t += __shfl_xor_sync(0xFFFFFFFFu, t, o);
    if ((lane & 15) == 0) ((float *)(r + 400))[(w >> 4)] = s * (float)t;
    if (lane == 0) ((float *)(r + 384))[(w >> 5)] = s;
}

/* One warp per 32-group. K multiple of 256 (blocks), buf 16-byte aligned. */
static __global__ void __launch_bounds__(256) mvq_prep(const float *x, uint8_t *__restrict__ buf, uint32_t K)
{
    CU_TL_SCOPE(TL_MVQ_PREP);
    cu_pdl_trigger();
    cu_pdl_wait(); /* x is the previous kernel's output (a no-op unless launched as a dependent) */
    const uint32_t g = blockIdx.x * 8 + (threadIdx.x >> 5);
    if (g >= K / 32) return;
    const uint32_t p = 32 * g + (threadIdx.x & 31);
    mvq_prep_warp(x[p], p, buf);
}

static inline void mvq_prep_launch(cudaStream_t st, const float *x, uint8_t *buf, uint32_t K)
{
    mvq_prep<<<(K / 32 + 7) / 8, 256, 0, st>>>(x, buf, K);
}

/* ---- helpers ------------------------------------------------------------------------------ */
__device__ __forceinline__ uint32_t mvq_dp4a_uu(uint32_t a, uint32_t b, uint32_t c) { return __dp4a(a, b, c); }
__device__ __forceinline__ int mvq_dp4a_us(uint32_t a, uint32_t b, int c)
{
    int d;
    asm("dp4a.u32.s32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
    return d;
}

/* Small non-negative int to float without I2F: 0x4B000000 | v is 2^23 + v. */
__device__ __forceinline__ float mvq_small(uint32_t v) { return __int_as_float((int)(0x4B000000u | v)) - 8388608.f; }

/* The x a lane needs for one block sits in one record: xr points at its 64 positions' d0 (the
 * record start + 64·(c&1)); chunk k of digit dg at xr + 128·dg + 16·k; its two s at xs, its four
 * S16 at xS. */
struct mvq_xp {
    const uint8_t *xr;
    const float *xs;
    const float *xS;
};
__device__ __forceinline__ void mvq_load_chunk(const mvq_xp &X, int k, uint4 D[3])
{
#pragma unroll
    for (int dg = 0; dg < 3; dg++) D[dg] = cu_ldx<uint4>(X.xr + 128 * dg + 16 * k);
}
/* The lane's x pointers at block b, and their step for b += 8. */
__device__ __forceinline__ mvq_xp mvq_xp_at(const mvq_x &q, uint32_t b, uint32_t c)
{
    const uint8_t *r = q.rec + (size_t)(2 * b + (c >> 1)) * MVQ_REC;
    mvq_xp X;
    X.xr = r + 64 * (c & 1);
    X.xs = (const float *)(r + 384) + 2 * (c & 1);
    X.xS = (const float *)(r + 400) + 4 * (c & 1);
    return X;
}
#define MVQ_XSTEP (16 * MVQ_REC) /* bytes from block b to b + 8 */
__device__ __forceinline__ void mvq_xp_next(mvq_xp &X)
{
    X.xr += MVQ_XSTEP;
    X.xs = (const float *)((const uint8_t *)X.xs + MVQ_XSTEP);
    X.xS = (const float *)((const uint8_t *)X.xS + MVQ_XSTEP);
}

/* Exact Σ q·X over a chunk as three digit accumulators. */
struct mvq_acc {
    uint32_t a0, a1;
    int a2;
};
__device__ __forceinline__ void mvq_acc4(mvq_acc &A, uint32_t qw, const uint4 D[3], int w)
{
    A.a0 = mvq_dp4a_uu(qw, cu_word(D[0], w), A.a0);
    A.a1 = mvq_dp4a_uu(qw, cu_word(D[1], w), A.a1);
    A.a2 = mvq_dp4a_us(qw, cu_word(D[2], w), A.a2);
}
/* s·Σ q·X as f32: the two converted parts add with one rounding. */
__device__ __forceinline__ float mvq_val(const mvq_acc &A, float s)
{
    const int lo = (int)(A.a1 * 256u + A.a0);
    return fmaf((float)A.a2, s * 65536.f, (float)lo * s);
}

/* ---- Q4_K --------------------------------------------------------------------------------- */
/* Lane c of a block: qs bytes [32c, 32c+32) (two uint4: chunks 0/2 and 1/3 as low/high
 * nibbles), sub-blocks j0 = 2c (chunks 0, 1) and j1 = 2c+1 (chunks 2, 3; high nibbles taken as
 * 16·q in place, the 1/16 goes into s). */
struct mvq_q4w {
    uint4 hdr, qa, qb;
};
/* A row's running pointers: qs at (block, lane c), hdr at the block. */
struct mvq_q4p {
    const uint8_t *qs, *hdr;
};
__device__ __forceinline__ void mvq_q4k_load(const mvq_q4p &P, mvq_q4w &W)
{
    W.hdr = cu_ldw(P.hdr);
    W.qa = cu_ldw(P.qs);
    W.qb = cu_ldw(P.qs + 64);
}
/* d·(sc0·Pl + sc1·Ph) − dmin·(m0·Σx_j0 + m1·Σx_j1) */
__device__ __forceinline__ float mvq_q4k_finish(const uint4 &hdr, uint32_t c, float Pl, float Ph, float Sl, float Sh)
{
    /* 6-bit (scale, min) of sub-blocks 2c, 2c+1 (GGUF get_scale_min_k4), branch-free */
    const uint32_t bsh = 16u * (c & 1u);
    const bool lo = c < 2;
    const uint32_t mA = lo ? 0x3F3Fu : 0u, mC = lo ? 0u : 0x0F0Fu, mA2 = lo ? 0u : 0x3030u;
    const uint32_t A = hdr.y >> bsh, B = hdr.z >> bsh, C = hdr.w >> bsh;
    const uint32_t scp = (A & mA) | (C & mC) | ((A >> 2) & mA2);
    const uint32_t mp = (B & mA) | ((C >> 4) & mC) | ((B >> 2) & mA2);
    const float d = __half2float(__ushort_as_half((unsigned short)(hdr.x & 0xFFFF)));
    const float dmin = __half2float(__ushort_as_half((unsigned short)(hdr.x >> 16)));
    const float sc0 = mvq_small(scp & 0xFF), sc1 = mvq_small((scp >> 8) & 0xFF);
    const float m0 = mvq_small(mp & 0xFF), m1 = mvq_small((mp >> 8) & 0xFF);
    return d * fmaf(sc0, Pl, sc1 * Ph) - dmin * fmaf(m0, Sl, m1 * Sh);
}

template <int R>
__device__ __forceinline__ void mvq_q4k_compute(const mvq_q4w W[R], const mvq_xp &X, uint32_t c, float acc[R])
{
    const float2 s = cu_ldx<float2>(X.xs);
    const float4 S = cu_ldx<float4>(X.xS);
    float Pl[R];
    mvq_acc A[R];
#pragma unroll
    for (int k = 0; k < 4; k++) {
        uint4 D[3];
        mvq_load_chunk(X, k, D);
#pragma unroll
        for (int r = 0; r < R; r++) {
            if (k == 0 || k == 2) A[r] = {0u, 0u, 0};
            const uint4 &src = (k & 1) ? W[r].qb : W[r].qa;
            const uint32_t mask = k < 2 ? 0x0F0F0F0Fu : 0xF0F0F0F0u;
#pragma unroll
            for (int w = 0; w < 4; w++) mvq_acc4(A[r], cu_word(src, w) & mask, D, w);
            if (k == 1) Pl[r] = mvq_val(A[r], s.x);
            if (k == 3) acc[r] += mvq_q4k_finish(W[r].hdr, c, Pl[r], mvq_val(A[r], s.y * 0.0625f), S.x + S.y, S.z + S.w);
        }
    }
}

/* ---- Q6_K (MV_T_Q6_KD planes) --------------------------------------------------------------- */
struct mvq_q6w {
    uint4 qa, qb, h;
    uint32_t s4;
    float d;
};
/* A row's running pointers at (block, lane c): ql, qh, scales, d. */
struct mvq_q6p {
    const uint8_t *ql, *qh, *sc;
    const __half *d;
};
__device__ __forceinline__ void mvq_q6k_load(const mvq_q6p &P, mvq_q6w &W)
{
    W.qa = cu_ldw(P.ql);
    W.qb = cu_ldw(P.ql + 64);
    W.h = cu_ldw(P.qh);
    W.s4 = cu_ldw32(P.sc);
    W.d = __half2float(*P.d);
}
/* The 6-bit values of chunk k, word w: low nibble from ql, two high bits from qh at bits 4-5. */
__device__ __forceinline__ uint32_t mvq_q6_word(const mvq_q6w &W, int k, int w)
{
    const uint32_t a = cu_word(W.qa, w), bq = cu_word(W.qb, w), hw = cu_word(W.h, w);
    switch (k) {
    case 0: return (a & 0x0F0F0F0Fu) | ((hw << 4) & 0x30303030u);
    case 1: return (bq & 0x0F0F0F0Fu) | ((hw << 2) & 0x30303030u);
    case 2: return ((a >> 4) & 0x0F0F0F0Fu) | (hw & 0x30303030u);
    default: return ((bq >> 4) & 0x0F0F0F0Fu) | ((hw >> 2) & 0x30303030u);
    }
}

template <int R>
__device__ __forceinline__ void mvq_q6k_compute(const mvq_q6w W[R], const mvq_xp &X, float acc[R])
{
    const float2 s = cu_ldx<float2>(X.xs);
    const float4 S4 = cu_ldx<float4>(X.xS);
    const float S[4] = {S4.x, S4.y, S4.z, S4.w};
    float part[R];
#pragma unroll
    for (int k = 0; k < 4; k++) {
        uint4 D[3];
        mvq_load_chunk(X, k, D);
#pragma unroll
        for (int r = 0; r < R; r++) {
            mvq_acc A = {0u, 0u, 0};
#pragma unroll
            for (int w = 0; w < 4; w++) mvq_acc4(A, mvq_q6_word(W[r], k, w), D, w);
            /* Σ (q−32)·x = s·Σ q·X − 32·S16 over the 16-group; int8 scale */
            const float v = fmaf(-32.f, S[k], mvq_val(A, k < 2 ? s.x : s.y));
            const float scv = (float)(int8_t)((W[r].s4 >> (8 * k)) & 255);
            part[r] = k == 0 ? scv * v : fmaf(scv, v, part[r]);
        }
    }
#pragma unroll
    for (int r = 0; r < R; r++) acc[r] += W[r].d * part[r];
}

/* ---- the launch ----------------------------------------------------------------------------- */
#define MVQ_T_MIXED 0u /* kernel template: each warp branches on its segment's format */

template <int R, uint32_t T>
__device__ __forceinline__ void mvq_dot_rows(const mv_mat *const mk[R], const uint32_t row[R], const mvq_x &q,
                                             int lane, float acc[R])
{
    const uint32_t nb = mk[0]->cols / 256, c = (uint32_t)lane & 3u, b0 = (uint32_t)lane >> 2;
#pragma unroll
    for (int r = 0; r < R; r++) acc[r] = 0.f;
    if (b0 >= nb) { /* no block for this lane (K < 2048): nothing to read */
        cu_pdl_wait();
        return;
    }
    mvq_xp X = mvq_xp_at(q, b0, c);
    if (T == MV_T_Q6_KD || (T == MVQ_T_MIXED && mk[0]->type == MV_T_Q6_KD)) {
        mvq_q6p P[R];
#pragma unroll
        for (int r = 0; r < R; r++) {
            const size_t n = (size_t)mk[r]->rows * nb, blk = (size_t)row[r] * nb + b0;
            const uint8_t *m = mk[r]->data;
            P[r].ql = m + blk * 128 + 16 * c;
            P[r].qh = m + n * 128 + blk * 64 + 16 * c;
            P[r].sc = m + n * 192 + blk * 16 + 4 * c;
            P[r].d = (const __half *)(m + n * 208) + blk;
        }
        mvq_q6w W[R];
        for (uint32_t b = b0;;) {
#pragma unroll
            for (int r = 0; r < R; r++) {
                mvq_q6k_load(P[r], W[r]);
                P[r].ql += 8 * 128;
                P[r].qh += 8 * 64;
                P[r].sc += 8 * 16;
                P[r].d += 8;
            }
            if (b == b0) cu_pdl_wait(); /* x is the previous kernel's output */
            mvq_q6k_compute<R>(W, X, acc);
            mvq_xp_next(X);
            if ((b += 8) >= nb) break;
        }
    } else {
        mvq_q4p P[R];
#pragma unroll
        for (int r = 0; r < R; r++) {
            const size_t blk = (size_t)row[r] * nb + b0;
            P[r].qs = mk[r]->data + blk * 128 + 16 * c;
            P[r].hdr = mk[r]->data + (size_t)mk[r]->rows * nb * 128 + blk * 16;
        }
        mvq_q4w W[R];
        for (uint32_t b = b0;;) {
#pragma unroll
            for (int r = 0; r < R; r++) {
                mvq_q4k_load(P[r], W[r]);
                P[r].qs += 8 * 128;
                P[r].hdr += 8 * 16;
            }
            if (b == b0) cu_pdl_wait(); /* x is the previous kernel's output */
            mvq_q4k_compute<R>(W, X, c, acc);
            mvq_xp_next(X);
            if ((b += 8) >= nb) break;
        }
    }
}

/* Warp sum of each acc[r] (lanes past the last block hold 0). */
template <int R>
__device__ __forceinline__ void mvq_warp_sum(float acc[R])
{
#pragma unroll
    for (int r = 0; r < R; r++)
        for (int o = 16; o > 0; o >>= 1) acc[r] += __shfl_xor_sync(0xFFFFFFFFu, acc[r], o);
}

/* Segments as in mv_kernel, all of format T (MV_T_Q4_K or MV_T_Q6_KD; a kernel per format keeps
 * Q4_K at 128 registers, 2 blocks per SM). R rows per warp; a SiLU pair segment takes R/2 rows
 * of gate and the same R/2 rows of up. */
template <int R, uint32_t T>
__global__ void __launch_bounds__(MV_WARPS * 32, 2) mvq_kernel(const mv_launch L, const uint8_t *xbuf, uint32_t K)
{
    CU_TL_SCOPE(TL_MVQ);
    cu_pdl_trigger();
    const uint32_t warp = blockIdx.x * MV_WARPS + (threadIdx.x >> 5);
    const int lane = threadIdx.x & 31;
    if (warp >= L.n_warps) return;
    uint32_t s = 0;
    while (s + 1 < L.n_seg && warp >= L.seg[s + 1].warp_begin) s++;
    const mv_seg &g = L.seg[s];
    const uint32_t w = warp - g.warp_begin;
    const mvq_x q = mvq_x_at(xbuf, K);
    const mv_mat *mk[R];
    uint32_t row[R];
    const bool pair = g.op == MV_OP_SILU_MUL;
    const uint32_t per = pair ? R / 2 : R;
#pragma unroll
    for (int r = 0; r < R; r++) {
        const uint32_t i = pair ? (uint32_t)r % per : (uint32_t)r;
        mk[r] = (pair && r >= R / 2) ? &g.b : &g.a;
        const uint32_t rw = w * per + i;
        row[r] = rw < g.a.rows ? rw : g.a.rows - 1; /* tail: recompute the last row, store once */
    }
    float acc[R];
    mvq_dot_rows<R, T>(mk, row, q, lane, acc);
    mvq_warp_sum<R>(acc);
    if (lane != 0) return;
    for (uint32_t i = 0; i < per; i++) {
        const uint32_t rw = w * per + i;
        if (rw >= g.a.rows) break;
        float y = acc[i];
        if (pair) {
            const float u = acc[i + per];
            y = y / (1.f + expf(-y)) * u;
        } else if (g.op == MV_OP_SOFTCAP) {
            y = y * g.scale;
            if (g.cap > 0.f) y = g.cap * tanhf(y / g.cap);
        }
        g.out[rw] = y;
    }
}

/* The launch configuration of L: a block per MV_WARPS warps. */
static inline cudaLaunchConfig_t mvq_cfg(const mv_launch &L, cudaStream_t st, bool pdl, cudaLaunchAttribute *at)
{
    return cu_pdl_cfg(dim3((L.n_warps + MV_WARPS - 1) / MV_WARPS), dim3(MV_WARPS * 32), st, pdl, at);
}

/* A launch whose segments mix Q4_KD and Q6_KD (the attention projections of the layers whose
 * attn_v is Q6_K): one kernel, R = 2 rows per warp for every segment, a warp-uniform branch on
 * the format. Three launches (q+k | v | gate) took ~29 us there, one ~18 us (ncu, H200). */
#define MVQ_R_MIXED 2
static inline void mvq_launch_mixed(cudaStream_t st, const mv_launch &L, const uint8_t *xbuf, bool pdl = true)
{
    cudaLaunchAttribute at[1];
    const cudaLaunchConfig_t cfg = mvq_cfg(L, st, pdl, at);
    cudaLaunchKernelEx(&cfg, mvq_kernel<MVQ_R_MIXED, MVQ_T_MIXED>, L, xbuf, L.seg[0].a.cols);
}

/* Rows per warp by format: Q4_K 4 (128 registers, no spill), Q6_KD 2 (4 rows spill). */
static inline int mvq_rows_per_warp(uint32_t type) { return type == MV_T_Q6_KD ? 2 : 4; }

/* Warps for a segment of `rows` rows (pairs: rows of gate) at R rows per warp. */
static inline uint32_t mvq_seg_warps_r(uint32_t rows, bool pair, int R) { return (rows + (pair ? R / 2 : R) - 1) / (pair ? R / 2 : R); }
static inline uint32_t mvq_seg_warps(uint32_t type, uint32_t rows, bool pair)
{
    return mvq_seg_warps_r(rows, pair, mvq_rows_per_warp(type));
}

static inline bool mvq_type_ok(uint32_t t) { return t == MV_T_Q4_KD || t == MV_T_Q6_KD; }

/* xbuf must hold mvq_prep's output for the launch's input (K = seg[0].a.cols); every segment has
 * the format of seg[0] and warps counted at mvq_rows_per_warp of it. pdl: launch with
 * programmatic stream serialization (see mvq_wait). Only the two kernels that fit their registers
 * are instantiated: Q4_KD at R = 4, Q6_KD at R = 2. */
static inline void mvq_launch(cudaStream_t st, const mv_launch &L, const uint8_t *xbuf, bool pdl = true)
{
    cudaLaunchAttribute at[1];
    const cudaLaunchConfig_t cfg = mvq_cfg(L, st, pdl, at);
    const uint32_t K = L.seg[0].a.cols;
    if (L.seg[0].a.type == MV_T_Q6_KD) cudaLaunchKernelEx(&cfg, mvq_kernel<2, MV_T_Q6_KD>, L, xbuf, K);
    else cudaLaunchKernelEx(&cfg, mvq_kernel<4, MV_T_Q4_KD>, L, xbuf, K);
}

/* ---- Q6_K repack into the mvq planes (one thread per block) ------------------------------ */
static __global__ void mvq_repack_q6k(const uint8_t *__restrict__ src, uint8_t *__restrict__ dst, size_t n_blk,
                                      size_t first_blk, size_t total_blk)
{
    const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n_blk) return;
    const uint8_t *s = src + i * 210;
    const size_t o = first_blk + i;
    uint8_t *ql = dst + o * 128, *qh = dst + total_blk * 128 + o * 64;
    /* GGUF: position t = 128n + 32k + l: lo4 from ql[64n + 32(k&1) + l] (nibble k>>1),
     * hi2 from qh[32n + l] bits 2k */
    uint8_t lo[256], hi[256];
    for (int t = 0; t < 256; t++) {
        const int n = t / 128, k = (t % 128) / 32, l = t % 32;
        lo[t] = (uint8_t)((s[64 * n + 32 * (k & 1) + l] >> (4 * (k >> 1))) & 15);
        hi[t] = (uint8_t)((s[128 + 32 * n + l] >> (2 * k)) & 3);
    }
    for (int c = 0; c < 4; c++) {
        for (int l = 0; l < 32; l++) ql[64 * (l / 16) + 16 * c + l % 16] = (uint8_t)(lo[64 * c + l] | (lo[64 * c + 32 + l] << 4));
        for (int m = 0; m < 4; m++)
            for (int j = 0; j < 4; j++) {
                uint8_t v = 0;
                for (int sh = 0; sh < 4; sh++) v |= (uint8_t)(hi[64 * c + 16 * sh + 4 * m + j] << (2 * sh));
                qh[16 * c + 4 * m + j] = v;
            }
    }
    mv_q6k_sc_d(s, dst, o, total_blk);
}

/* Q4_K into the mvq planes: qs [nblk][128] then hdr [nblk][16] (d, dmin, 12 scale bytes as in
 * GGUF). GGUF qs byte 32c + 16p + j (lane c, half p) moves to 64p + 16c + j, so each of a
 * lane group's two 16-byte loads reads 64 contiguous bytes: no 32-byte sector is fetched twice. */
static __global__ void mvq_repack_q4k(const uint8_t *__restrict__ src, uint8_t *__restrict__ dst, size_t n_blk,
                                      size_t first_blk, size_t total_blk)
{
    const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n_blk) return;
    const uint8_t *s = src + i * 144;
    const size_t o = first_blk + i;
    uint8_t *qs = dst + o * 128, *hd = dst + total_blk * 128 + o * 16;
    for (int k = 0; k < 16; k++) hd[k] = s[k];
    for (int k = 0; k < 128; k++) qs[64 * ((k % 32) / 16) + 16 * (k / 32) + k % 16] = s[16 + k];
}

/* Element c of row r of an MV_T_Q4_KD matrix (slow; embedding rows and checks). */
static __device__ inline float mvq_elem_q4kd(const mv_mat &m, uint32_t r, uint32_t c)
{
    const uint32_t nb = m.cols / 256;
    const size_t blk = (size_t)r * nb + c / 256, nblk = (size_t)m.rows * nb;
    const uint8_t *h = m.data + nblk * 128 + blk * 16;
    const uint32_t e = c % 256, j = e / 32, lc = e / 64, l = e % 32;
    uint32_t sc, mn;
    mv_q4k_scale_min(h + 4, j, &sc, &mn);
    const uint8_t q = m.data[blk * 128 + 64 * (l / 16) + 16 * lc + l % 16];
    const uint32_t qv = (e % 64) < 32 ? (q & 15) : (q >> 4);
    const float d = __half2float(*(const __half *)h), dmin = __half2float(*(const __half *)(h + 2));
    return d * (float)sc * (float)qv - dmin * (float)mn;
}

/* Element c of row r of an MV_T_Q6_KD matrix (slow; embedding rows and checks). */
static __device__ inline float mvq_elem_q6kd(const mv_mat &m, uint32_t r, uint32_t c)
{
    const uint32_t nb = m.cols / 256;
    const size_t blk = (size_t)r * nb + c / 256, nblk = (size_t)m.rows * nb;
    const uint32_t t = c % 256, lc = t / 64, tp = t % 64;
    const uint32_t l = tp % 32;
    const uint8_t qlb = m.data[blk * 128 + 64 * (l / 16) + 16 * lc + l % 16];
    const uint32_t lo = tp < 32 ? (qlb & 15u) : (qlb >> 4);
    const uint32_t sh = tp / 16, rem = tp % 16; /* tp = 16·sh + 4m + j */
    const uint8_t qhb = m.data[nblk * 128 + blk * 64 + 16 * lc + rem];
    const uint32_t hi = (qhb >> (2 * sh)) & 3u;
    const float d = __half2float(((const __half *)(m.data + nblk * 208))[blk]);
    const int8_t scv = (int8_t)m.data[nblk * 192 + blk * 16 + t / 16];
    return d * (float)scv * (float)((int)(lo | (hi << 4)) - 32);
}

#endif
