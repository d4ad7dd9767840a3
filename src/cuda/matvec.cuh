/* matvec.cuh — the general matvec path, and the types every matvec shares.
 *
 * y[r] = Σ_c W[r][c] · x[c] for W in Q4_K, Q6_K, Q8_0, F16, BF16 or F32, x f32, in f32 arithmetic.
 * The route runs it for what the tensor-core kernels (mmq.cuh, mmq6.cuh) do not take: Q8_0 and the
 * float formats, and K-quant matrices whose rows are not whole 16-row tiles. 16- or 8-byte weight
 * loads, coalesced per block of lanes, dequantized in registers; x read as float4 through L1 and
 * shared by the R rows one warp works on.
 *
 * Layouts on the device. Q4_K stays as in GGUF (144-byte blocks, header = first 16 bytes, so every
 * block is 16-byte aligned). Q6_K (210-byte blocks) and Q8_0 (34-byte blocks) are only 2-byte
 * aligned, so at upload they are repacked into planes of the same total size:
 *   Q6_K: ql [rows*nb][128] | qh [rows*nb][64] | scales [rows*nb][16] | d [rows*nb] f16
 *   Q8_0: qs [rows*nb][32]  | d [rows*nb] f16
 * (nb = blocks per row). Bytes read per token are exactly the GGUF bytes. The embedding keeps these
 * layouts too: mv_elem reads one element of any of them.
 *
 * Byte -> float uses the exponent trick: bits 0x4B0000qq are the float 2^23 + q exactly, and one
 * FADD removes 2^23 (plus the format's offset) — a PRMT and a FADD instead of a quarter-rate I2F.
 *
 * One launch covers up to MV_MAX_SEG segments (several matrices over one x). A segment is either R
 * consecutive rows of one matrix per warp, or a "pair" (ffn gate row r and ffn up row r in one
 * warp, writing silu(g)·u). Epilogues: store, or the LM head's scale + soft cap. The workbench
 * (bench/kernels/matvec.cu) times this kernel beside its predecessors. */
#ifndef MUSER_CUDA_MATVEC_CUH
#define MUSER_CUDA_MATVEC_CUH

#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>

#define MV_MAX_SEG 4
#define MV_WARPS 8 /* warps per block */

enum { MV_T_F32 = 0, MV_T_F16 = 1, MV_T_Q8_0 = 8, MV_T_Q4_K = 12, MV_T_Q6_K = 14, MV_T_BF16 = 30 };
/* Device-only layouts of the tensor-core matvecs: Q4_K (mmq.cuh) and Q6_K (mmq6.cuh) in
 * (16-row tile, block) units, the GGUF bytes. */
#define MV_T_Q4_KT 116u
#define MV_T_Q6_KT 117u

/* Layouts that the upload repacks block by block (Q6_K, Q8_0: planes; the tensor-core tiles). */
static inline bool mv_repacked(uint32_t t)
{
    return t == MV_T_Q6_K || t == MV_T_Q8_0 || t == MV_T_Q4_KT || t == MV_T_Q6_KT;
}
/* GGUF bytes of one block and its elements (float formats: 1 byte / 8 elements, the granule the
 * kernels need). */
static inline size_t mv_block_bytes(uint32_t t)
{
    return t == MV_T_Q6_K || t == MV_T_Q6_KT ? 210 : t == MV_T_Q4_K || t == MV_T_Q4_KT ? 144 : t == MV_T_Q8_0 ? 34 : 1;
}
static inline uint32_t mv_block_elems(uint32_t t)
{
    return t == MV_T_Q4_K || t == MV_T_Q6_K || t == MV_T_Q4_KT || t == MV_T_Q6_KT ? 256 : t == MV_T_Q8_0 ? 32 : 8;
}
enum { MV_OP_STORE = 0, MV_OP_SOFTCAP = 1, MV_OP_SILU_MUL = 2 };

/* A weight matrix as the kernels see it (device pointer, repacked layout for Q6_K/Q8_0). */
typedef struct mv_mat {
    const uint8_t *data;
    uint32_t type;
    uint32_t rows, cols;
    const uint8_t *rexp; /* Q4_KT gate and up: each row's largest f16 exponent of d, dmin (mmi.cuh), or NULL */
} mv_mat;

typedef struct mv_seg {
    mv_mat a, b;         /* b only for MV_OP_SILU_MUL (gate = a, up = b) */
    float *out;          /* [a.rows] */
    uint32_t op;
    uint32_t warp_begin; /* first warp of this segment in the launch */
    float scale, cap;    /* MV_OP_SOFTCAP: out = cap·tanh(y·scale/cap), or y·scale if cap == 0 */
    uint32_t os;         /* a multi-row pass: floats between the rows' outputs */
} mv_seg;

typedef struct mv_launch {
    mv_seg seg[MV_MAX_SEG];
    uint32_t n_seg;
    uint32_t n_warps;
} mv_launch;

/* ---- byte -> float -------------------------------------------------------------------------- */
/* Byte k of w (0..255) as float, minus `off` (off already includes the 2^23 of the trick). */
__device__ __forceinline__ float mv_byte(uint32_t w, int k, float off)
{
    uint32_t sel = (uint32_t)k | 0x7440u;
    return __int_as_float((int)__byte_perm(w, 0x4B000000u, sel)) - off;
}
#define MV_MAGIC 8388608.0f

/* Byte k (run-time k, 0..3) of w, zero-extended. */
__device__ __forceinline__ uint32_t mv_b(uint32_t w, uint32_t k)
{
    return __byte_perm(w, 0u, 0x4440u | k);
}

__device__ __forceinline__ float4 mv_ldx(const float *x, uint32_t i)
{
    return __ldg((const float4 *)(x + i));
}

/* Dot of 4 bytes of w (as floats minus off) with 4 x values. */
__device__ __forceinline__ float mv_dot4(uint32_t w, float4 x, float off, float acc)
{
    acc = fmaf(mv_byte(w, 0, off), x.x, acc);
    acc = fmaf(mv_byte(w, 1, off), x.y, acc);
    acc = fmaf(mv_byte(w, 2, off), x.z, acc);
    acc = fmaf(mv_byte(w, 3, off), x.w, acc);
    return acc;
}

/* ---- per-format warp dots: R rows, one x ---------------------------------------------------- */
/* Each returns the lane's partial sums acc[0..R) (to be warp-reduced by the caller). */

/* Q4_K: 8 lanes per 256-block; lane c takes qs bytes [16c, 16c+16): 16 low nibbles (sub-block
 * 2·(c/2)) and 16 high nibbles (sub-block 2·(c/2)+1). w = d·sc·q − dmin·m. */
template <int R>
__device__ __forceinline__ void mv_dot_q4k(const uint8_t *const rowp[R], const float *x, uint32_t nb,
                                           int lane, float acc[R])
{
    const int bi = lane >> 3, c = lane & 7, il = c >> 1;
    const int j0 = 2 * il, j1 = j0 + 1;
    for (uint32_t b = bi; b < nb; b += 4) {
        uint4 hdr[R], qs[R];
#pragma unroll
        for (int r = 0; r < R; r++) {
            const uint4 *blk = (const uint4 *)(rowp[r] + (size_t)b * 144);
            hdr[r] = __ldg(blk);
            qs[r] = __ldg(blk + 1 + c);
        }
        const uint32_t xb = b * 256 + 64 * il + 16 * (c & 1);
        float4 xl[4], xh[4];
        float sxl = 0.f, sxh = 0.f;
#pragma unroll
        for (int i = 0; i < 4; i++) {
            xl[i] = mv_ldx(x, xb + 4 * i);
            xh[i] = mv_ldx(x, xb + 32 + 4 * i);
            sxl += (xl[i].x + xl[i].y) + (xl[i].z + xl[i].w);
            sxh += (xh[i].x + xh[i].y) + (xh[i].z + xh[i].w);
        }
#pragma unroll
        for (int r = 0; r < R; r++) {
            const uint32_t s03 = hdr[r].y, s47 = hdr[r].z, s811 = hdr[r].w;
            /* 6-bit (scale, min) of sub-blocks j0, j1 (ggml get_scale_min_k4), bytes picked with
             * PRMT so nothing is indexed at run time (that would go to local memory). */
            uint32_t sc0, m0, sc1, m1;
            if (j0 < 4) {
                sc0 = mv_b(s03, j0) & 63; m0 = mv_b(s47, j0) & 63;
                sc1 = mv_b(s03, j1) & 63; m1 = mv_b(s47, j1) & 63;
            } else {
                const uint32_t a0 = mv_b(s811, j0 - 4), a1 = mv_b(s811, j1 - 4);
                sc0 = (a0 & 15) | ((mv_b(s03, j0 - 4) >> 6) << 4);
                m0 = (a0 >> 4) | ((mv_b(s47, j0 - 4) >> 6) << 4);
                sc1 = (a1 & 15) | ((mv_b(s03, j1 - 4) >> 6) << 4);
                m1 = (a1 >> 4) | ((mv_b(s47, j1 - 4) >> 6) << 4);
            }
            const float d = __half2float(__ushort_as_half((unsigned short)(hdr[r].x & 0xFFFF)));
            const float dmin = __half2float(__ushort_as_half((unsigned short)(hdr[r].x >> 16)));
            const uint32_t q[4] = {qs[r].x, qs[r].y, qs[r].z, qs[r].w};
            float sl = 0.f, sh = 0.f;
#pragma unroll
            for (int i = 0; i < 4; i++) {
                sl = mv_dot4(q[i] & 0x0F0F0F0Fu, xl[i], MV_MAGIC, sl);
                sh = mv_dot4((q[i] >> 4) & 0x0F0F0F0Fu, xh[i], MV_MAGIC, sh);
            }
            acc[r] += d * ((float)sc0 * sl + (float)sc1 * sh) - dmin * ((float)m0 * sxl + (float)m1 * sxh);
        }
    }
}

/* Q6_K planes: 8 lanes per block; lane t: half n = t/4, l0 = 8·(t%4); 8 bytes of ql at l0 and
 * l0+32, 8 bytes of qh at l0 -> 32 weights at n·128 + l0 + {0,32,64,96} + 0..7. w = d·sc·(q−32). */
template <int R>
__device__ __forceinline__ void mv_dot_q6k(const mv_mat &m, const uint32_t row[R], const float *x,
                                           uint32_t nb, int lane, float acc[R])
{
    const size_t nblk = (size_t)m.rows * nb;
    const uint8_t *ql = m.data, *qh = m.data + nblk * 128, *sc = m.data + nblk * 192;
    const __half *dp = (const __half *)(m.data + nblk * 208);
    const int bi = lane >> 3, t = lane & 7, n = t >> 2, l0 = 8 * (t & 3), is = (t & 3) >> 1;
    for (uint32_t b = bi; b < nb; b += 4) {
        const uint32_t xb = b * 256 + n * 128 + l0;
        float4 xv[4][2];
#pragma unroll
        for (int k = 0; k < 4; k++) {
            xv[k][0] = mv_ldx(x, xb + 32 * k);
            xv[k][1] = mv_ldx(x, xb + 32 * k + 4);
        }
#pragma unroll
        for (int r = 0; r < R; r++) {
            const size_t blk = (size_t)row[r] * nb + b;
            const uint2 A = __ldg((const uint2 *)(ql + blk * 128 + n * 64 + l0));
            const uint2 B = __ldg((const uint2 *)(ql + blk * 128 + n * 64 + 32 + l0));
            const uint2 H = __ldg((const uint2 *)(qh + blk * 64 + n * 32 + l0));
            const uint2 S = __ldg((const uint2 *)(sc + blk * 16 + n * 8));
            const float d = __half2float(dp[blk]);
            const uint32_t a2[2] = {A.x, A.y}, b2[2] = {B.x, B.y}, h2[2] = {H.x, H.y};
            float s[4] = {0.f, 0.f, 0.f, 0.f};
            const float off = MV_MAGIC + 32.f;
#pragma unroll
            for (int w = 0; w < 2; w++) {
                const uint32_t q1 = (a2[w] & 0x0F0F0F0Fu) | ((h2[w] << 4) & 0x30303030u);
                const uint32_t q2 = (b2[w] & 0x0F0F0F0Fu) | ((h2[w] << 2) & 0x30303030u);
                const uint32_t q3 = ((a2[w] >> 4) & 0x0F0F0F0Fu) | (h2[w] & 0x30303030u);
                const uint32_t q4 = ((b2[w] >> 4) & 0x0F0F0F0Fu) | ((h2[w] >> 2) & 0x30303030u);
                s[0] = mv_dot4(q1, xv[0][w], off, s[0]);
                s[1] = mv_dot4(q2, xv[1][w], off, s[1]);
                s[2] = mv_dot4(q3, xv[2][w], off, s[2]);
                s[3] = mv_dot4(q4, xv[3][w], off, s[3]);
            }
            /* scales sc[n*8 + is + 2k] as int8 */
            const float c0 = (float)(int8_t)((is ? S.x >> 8 : S.x) & 255);
            const float c1 = (float)(int8_t)((is ? S.x >> 24 : S.x >> 16) & 255);
            const float c2 = (float)(int8_t)((is ? S.y >> 8 : S.y) & 255);
            const float c3 = (float)(int8_t)((is ? S.y >> 24 : S.y >> 16) & 255);
            acc[r] += d * ((c0 * s[0] + c1 * s[1]) + (c2 * s[2] + c3 * s[3]));
        }
    }
}

/* Q8_0 planes: 2 lanes per 32-block, 16 int8 each. w = d·q. */
template <int R>
__device__ __forceinline__ void mv_dot_q80(const mv_mat &m, const uint32_t row[R], const float *x,
                                           uint32_t nb, int lane, float acc[R])
{
    const size_t nblk = (size_t)m.rows * nb;
    const uint8_t *qs = m.data;
    const __half *dp = (const __half *)(m.data + nblk * 32);
    const int bi = lane >> 1, hf = lane & 1;
    for (uint32_t b = bi; b < nb; b += 16) {
        const uint32_t xb = b * 32 + 16 * hf;
        float4 xv[4];
#pragma unroll
        for (int i = 0; i < 4; i++) xv[i] = mv_ldx(x, xb + 4 * i);
#pragma unroll
        for (int r = 0; r < R; r++) {
            const size_t blk = (size_t)row[r] * nb + b;
            const uint4 q = __ldg((const uint4 *)(qs + blk * 32 + 16 * hf));
            const float d = __half2float(dp[blk]);
            const uint32_t qw[4] = {q.x, q.y, q.z, q.w};
            float s = 0.f;
#pragma unroll
            for (int i = 0; i < 4; i++) s = mv_dot4(qw[i] ^ 0x80808080u, xv[i], MV_MAGIC + 128.f, s);
            acc[r] += d * s;
        }
    }
}

/* F16 / BF16: 8 elements (16 bytes) per lane per step. */
template <int R, bool BF>
__device__ __forceinline__ void mv_dot_h(const uint8_t *const rowp[R], const float *x, uint32_t cols,
                                         int lane, float acc[R])
{
    for (uint32_t c = (uint32_t)lane * 8; c < cols; c += 256) {
        const float4 x0 = mv_ldx(x, c), x1 = mv_ldx(x, c + 4);
        const float xs[8] = {x0.x, x0.y, x0.z, x0.w, x1.x, x1.y, x1.z, x1.w};
#pragma unroll
        for (int r = 0; r < R; r++) {
            const uint4 q = __ldg((const uint4 *)(rowp[r] + (size_t)c * 2));
            const uint32_t qw[4] = {q.x, q.y, q.z, q.w};
            float s = acc[r];
#pragma unroll
            for (int i = 0; i < 4; i++) {
                float lo, hi;
                if (BF) {
                    lo = __uint_as_float(qw[i] << 16);
                    hi = __uint_as_float(qw[i] & 0xFFFF0000u);
                } else {
                    const float2 f = __half22float2(*(const __half2 *)&qw[i]);
                    lo = f.x;
                    hi = f.y;
                }
                s = fmaf(lo, xs[2 * i], s);
                s = fmaf(hi, xs[2 * i + 1], s);
            }
            acc[r] = s;
        }
    }
}

template <int R>
__device__ __forceinline__ void mv_dot_f32(const uint8_t *const rowp[R], const float *x, uint32_t cols,
                                           int lane, float acc[R])
{
    for (uint32_t c = (uint32_t)lane * 4; c < cols; c += 128) {
        const float4 xv = mv_ldx(x, c);
#pragma unroll
        for (int r = 0; r < R; r++) {
            const float4 w = __ldg((const float4 *)(rowp[r] + (size_t)c * 4));
            acc[r] = fmaf(w.x, xv.x, fmaf(w.y, xv.y, fmaf(w.z, xv.z, fmaf(w.w, xv.w, acc[r]))));
        }
    }
}

/* Bytes of one row in the device layout's row-major view (Q4_K/F16/BF16/F32 only). */
__host__ __device__ inline size_t mv_row_bytes(uint32_t type, uint32_t cols)
{
    switch (type) {
    case MV_T_F32: return (size_t)cols * 4;
    case MV_T_F16: case MV_T_BF16: return (size_t)cols * 2;
    case MV_T_Q4_K: return (size_t)cols / 256 * 144;
    case MV_T_Q6_K: return (size_t)cols / 256 * 210;
    case MV_T_Q8_0: return (size_t)cols / 32 * 34;
    default: return 0;
    }
}

/* R dot products: slot k is row[k] of matrix *mk[k] (all slots share type and cols). */
template <int R, int T = -1>
__device__ __forceinline__ void mv_dot_rows(const mv_mat *const mk[R], const uint32_t row[R],
                                            const float *x, int lane, float acc[R])
{
    const uint32_t type = T >= 0 ? (uint32_t)T : mk[0]->type, cols = mk[0]->cols;
    const uint8_t *rowp[R];
#pragma unroll
    for (int r = 0; r < R; r++) {
        acc[r] = 0.f;
        rowp[r] = mk[r]->data + (size_t)row[r] * mv_row_bytes(type, cols);
    }
    switch (type) {
    case MV_T_Q4_K: mv_dot_q4k<R>(rowp, x, cols / 256, lane, acc); break;
    case MV_T_Q6_K:
        if (R == 1 || mk[0] == mk[R - 1]) {
            mv_dot_q6k<R>(*mk[0], row, x, cols / 256, lane, acc);
        } else { /* pair of different matrices: one row at a time */
#pragma unroll
            for (int r = 0; r < R; r++) {
                float a1[1];
                a1[0] = 0.f;
                const uint32_t rr[1] = {row[r]};
                mv_dot_q6k<1>(*mk[r], rr, x, cols / 256, lane, a1);
                acc[r] = a1[0];
            }
        }
        break;
    case MV_T_Q8_0:
        if (R == 1 || mk[0] == mk[R - 1]) {
            mv_dot_q80<R>(*mk[0], row, x, cols / 32, lane, acc);
        } else {
#pragma unroll
            for (int r = 0; r < R; r++) {
                float a1[1];
                a1[0] = 0.f;
                const uint32_t rr[1] = {row[r]};
                mv_dot_q80<1>(*mk[r], rr, x, cols / 32, lane, a1);
                acc[r] = a1[0];
            }
        }
        break;
    case MV_T_F16: mv_dot_h<R, false>(rowp, x, cols, lane, acc); break;
    case MV_T_BF16: mv_dot_h<R, true>(rowp, x, cols, lane, acc); break;
    default: mv_dot_f32<R>(rowp, x, cols, lane, acc); break;
    }
#pragma unroll
    for (int r = 0; r < R; r++)
        for (int o = 16; o > 0; o >>= 1) acc[r] += __shfl_xor_sync(0xFFFFFFFFu, acc[r], o);
}

/* The launch: warp w finds its segment, computes R rows (or one gate/up pair), lane 0 stores. */
/* T: the weight format when every segment has it (a kernel per format: no switch, better code),
 * or -1 for the generic one. */
template <int R, int T = -1>
__global__ void __launch_bounds__(MV_WARPS * 32) mv_kernel(const mv_launch L, const float *__restrict__ x)
{
    const uint32_t warp = blockIdx.x * MV_WARPS + (threadIdx.x >> 5);
    const int lane = threadIdx.x & 31;
    if (warp >= L.n_warps) return;
    uint32_t s = 0;
    while (s + 1 < L.n_seg && warp >= L.seg[s + 1].warp_begin) s++;
    const mv_seg &g = L.seg[s];
    const uint32_t w = warp - g.warp_begin;
    if (g.op == MV_OP_SILU_MUL) {
        const mv_mat *mk[2] = {&g.a, &g.b};
        const uint32_t row[2] = {w, w};
        float acc[2];
        mv_dot_rows<2, T>(mk, row, x, lane, acc);
        if (lane == 0) {
            const float gv = acc[0], uv = acc[1];
            g.out[w] = gv / (1.f + expf(-gv)) * uv;
        }
        return;
    }
    const mv_mat *mk[R];
    uint32_t row[R];
#pragma unroll
    for (int r = 0; r < R; r++) {
        mk[r] = &g.a;
        const uint32_t rr = w * R + r;
        row[r] = rr < g.a.rows ? rr : g.a.rows - 1; /* tail: recompute the last row, store once */
    }
    float acc[R];
    mv_dot_rows<R, T>(mk, row, x, lane, acc);
    if (lane == 0) {
#pragma unroll
        for (int r = 0; r < R; r++) {
            const uint32_t rr = w * R + r;
            if (rr >= g.a.rows) break;
            float y = acc[r];
            if (g.op == MV_OP_SOFTCAP) {
                y = y * g.scale;
                if (g.cap > 0.f) y = g.cap * tanhf(y / g.cap);
            }
            g.out[rr] = y;
        }
    }
}

/* ---- repacking at upload -------------------------------------------------------------------- */
/* The scale and d planes of a Q6_K block s (GGUF bytes 192..209) into block o of a planar matrix
 * of total_blk blocks: sc [total_blk][16] at 192·total_blk, d [total_blk] (f16) at 208·total_blk.
 * Both planar Q6_K layouts share them (MV_T_Q6_K here, MV_T_Q6_KD in bench/kernels/mvq.cuh). */
static __device__ inline void mv_q6k_sc_d(const uint8_t *s, uint8_t *dst, size_t o, size_t total_blk)
{
    uint8_t *sc = dst + total_blk * 192 + o * 16;
    for (int k = 0; k < 16; k++) sc[k] = s[192 + k];
    uint8_t *d = dst + total_blk * 208 + o * 2;
    d[0] = s[208];
    d[1] = s[209];
}

/* src: n_blk raw GGUF blocks (contiguous, rows [r0, r0+n) of a matrix); dst: the matrix's planes,
 * total_blk = rows*nb blocks in all, writing blocks starting at first_blk. One thread per block. */
static __global__ void mv_repack_q6k(const uint8_t *__restrict__ src, uint8_t *__restrict__ dst, size_t n_blk,
                              size_t first_blk, size_t total_blk)
{
    const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n_blk) return;
    const uint8_t *s = src + i * 210;
    const size_t o = first_blk + i;
    uint8_t *ql = dst + o * 128, *qh = dst + total_blk * 128 + o * 64;
    for (int k = 0; k < 128; k++) ql[k] = s[k];
    for (int k = 0; k < 64; k++) qh[k] = s[128 + k];
    mv_q6k_sc_d(s, dst, o, total_blk);
}

static __global__ void mv_repack_q80(const uint8_t *__restrict__ src, uint8_t *__restrict__ dst, size_t n_blk,
                              size_t first_blk, size_t total_blk)
{
    const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n_blk) return;
    const uint8_t *s = src + i * 34;
    const size_t o = first_blk + i;
    uint8_t *qs = dst + o * 32;
    for (int k = 0; k < 32; k++) qs[k] = s[2 + k];
    uint8_t *d = dst + total_blk * 32 + o * 2;
    d[0] = s[0];
    d[1] = s[1];
}

/* 6-bit (scale, min) of sub-block j from a Q4_K block's 12 scale bytes s (GGUF get_scale_min_k4). */
static __device__ inline void mv_q4k_scale_min(const uint8_t *s, uint32_t j, uint32_t *sc, uint32_t *mn)
{
    if (j < 4) {
        *sc = s[j] & 63;
        *mn = s[j + 4] & 63;
    } else {
        *sc = (s[j + 4] & 15) | ((s[j - 4] >> 6) << 4);
        *mn = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
    }
}

/* Element c of row r, any device layout (slow; for embedding rows and checks). */
static __device__ inline float mv_elem(const mv_mat &m, uint32_t r, uint32_t c)
{
    switch (m.type) {
    case MV_T_F32: return ((const float *)m.data)[(size_t)r * m.cols + c];
    case MV_T_F16: return __half2float(((const __half *)m.data)[(size_t)r * m.cols + c]);
    case MV_T_BF16: {
        const uint16_t v = ((const uint16_t *)m.data)[(size_t)r * m.cols + c];
        return __uint_as_float((uint32_t)v << 16);
    }
    case MV_T_Q8_0: {
        const uint32_t nb = m.cols / 32;
        const size_t blk = (size_t)r * nb + c / 32, nblk = (size_t)m.rows * nb;
        const float d = __half2float(((const __half *)(m.data + nblk * 32))[blk]);
        return d * (float)(int8_t)m.data[blk * 32 + c % 32];
    }
    case MV_T_Q4_K: {
        const uint8_t *b = m.data + ((size_t)r * (m.cols / 256) + c / 256) * 144;
        const uint32_t e = c % 256, j = e / 32, il = e / 64, l = e % 32;
        uint32_t sc, mn;
        mv_q4k_scale_min(b + 4, j, &sc, &mn);
        const uint8_t q = b[16 + 32 * il + l];
        const uint32_t qv = (e % 64) < 32 ? (q & 15) : (q >> 4);
        const float d = __half2float(*(const __half *)b), dmin = __half2float(*(const __half *)(b + 2));
        return d * (float)sc * (float)qv - dmin * (float)mn;
    }
    case MV_T_Q6_K: {
        const uint32_t nb = m.cols / 256;
        const size_t blk = (size_t)r * nb + c / 256, nblk = (size_t)m.rows * nb;
        const uint8_t *ql = m.data + blk * 128, *qh = m.data + nblk * 128 + blk * 64;
        const int8_t *sc = (const int8_t *)(m.data + nblk * 192 + blk * 16);
        const float d = __half2float(((const __half *)(m.data + nblk * 208))[blk]);
        const uint32_t e = c % 256, n = e / 128, k = (e % 128) / 32, l = e % 32;
        const uint8_t lq = ql[n * 64 + (k & 1) * 32 + l];
        const uint32_t lo = (k < 2) ? (lq & 15) : (lq >> 4);
        const uint32_t hi = (qh[n * 32 + l] >> (2 * k)) & 3;
        const int q = (int)(lo | (hi << 4)) - 32;
        return d * (float)sc[n * 8 + l / 16 + 2 * k] * (float)q;
    }
    default: return 0.f;
    }
}

/* Rows per warp by format (workbench, H200): R=4 for the K-quants and Q8_0, R=2 for floats. */
static inline int mv_rows_per_warp(uint32_t type)
{
    return (type == MV_T_Q4_K || type == MV_T_Q6_K || type == MV_T_Q8_0) ? 4 : 2;
}

template <int R, int T>
static inline void mv_launch_rt(cudaStream_t st, const mv_launch &L, const float *x)
{
    mv_kernel<R, T><<<(L.n_warps + MV_WARPS - 1) / MV_WARPS, MV_WARPS * 32, 0, st>>>(L, x);
}

/* Launch L (all segments of one format, warps counted with mv_rows_per_warp, or a SiLU pair
 * with one row per warp) with the format-specialized kernel. */
static inline void mv_launch_typed(cudaStream_t st, const mv_launch &L, const float *x)
{
    const bool pair = L.seg[0].op == MV_OP_SILU_MUL;
    switch (L.seg[0].a.type) {
    case MV_T_Q4_K: pair ? mv_launch_rt<2, MV_T_Q4_K>(st, L, x) : mv_launch_rt<4, MV_T_Q4_K>(st, L, x); break;
    case MV_T_Q6_K: pair ? mv_launch_rt<2, MV_T_Q6_K>(st, L, x) : mv_launch_rt<4, MV_T_Q6_K>(st, L, x); break;
    case MV_T_Q8_0: pair ? mv_launch_rt<2, MV_T_Q8_0>(st, L, x) : mv_launch_rt<4, MV_T_Q8_0>(st, L, x); break;
    case MV_T_F16: mv_launch_rt<2, MV_T_F16>(st, L, x); break;
    case MV_T_BF16: mv_launch_rt<2, MV_T_BF16>(st, L, x); break;
    default: mv_launch_rt<2, MV_T_F32>(st, L, x); break;
    }
}

#endif
