/* prefill.cu — the prefill route's kernels (declarations and numerics: prefill.cuh). */
#include <math.h>
#include <string.h>

#include "cuda/prefill.cuh"
#include "cuda/wgmma.cuh"

/* ---- weights ----------------------------------------------------------------------------------
 * A thread unpacks 8 consecutive elements of a row. In the tensor-core layouts those 8 share one
 * sub-block (one scale and min) and sit in two 4-byte words of the unit, so the header is decoded
 * once per 8 weights; the arithmetic per weight is mv_elem's (Q4_K d·sc·q − dmin·m, Q6_K
 * d·sc·(q − 32), in f32). */

/* Elements e0 .. e0+7 (e0 % 8 == 0) of row g + 8h of a Q4_KT unit (mmq.cuh's layout, the inverse
 * of mmq_repack_q4k: qs byte b = 32P + 8c + 4(t&1) + k of the GGUF block sits in lane t = 2(P&1) +
 * (t&1) of load u4 = ci/2, word w = 2(ci&1) + h, ci = 4(P/2) + c). */
__device__ __forceinline__ void pf_q4kt8(const uint8_t *unit, uint32_t g, uint32_t h, uint32_t e0, float out[8])
{
    const uint32_t qb = 32 * (e0 / 64) + e0 % 32, P = qb / 32, c = (qb % 32) / 8;
    const uint32_t t = 2 * (P % 2), ci = 4 * (P / 2) + c, u4 = ci / 2, w = 2 * (ci % 2) + h;
    const uint32_t w0 = *(const uint32_t *)(unit + (u4 * 32 + 4 * g + t) * 16 + 4 * w);
    const uint32_t w1 = *(const uint32_t *)(unit + (u4 * 32 + 4 * g + t + 1) * 16 + 4 * w);
    const uint32_t sh = (e0 % 64) < 32 ? 0 : 4;
    /* sub-block j is item q' = 2h + j/4 of header lane t' with j % 4 = 2(t'&1) + (t'>>1) */
    const uint32_t j = e0 / 32, jr = j % 4, ts = 2 * (jr % 2) + jr / 2, qi = 2 * h + j / 4;
    const uint8_t *hd = unit + 2048 + 32 * g;
    const uint32_t sw = *(const uint32_t *)(hd + 8 + 4 * ts), hw = *(const unsigned short *)(hd + 24 + 2 * ts);
    const uint32_t sc = (sw >> (6 * qi)) & 63u;
    const uint32_t mn = qi == 0 ? (sw >> 24) & 63u : qi == 1 ? hw & 63u : qi == 2 ? (hw >> 6) & 63u
                                                                          : ((sw >> 30) << 4) | (hw >> 12);
    const float d = __half2float(*(const __half *)(hd + 2 * h)), dmin = __half2float(*(const __half *)(hd + 4 + 2 * h));
#pragma unroll
    for (int k = 0; k < 8; k++) {
        const uint32_t q = (((k < 4 ? w0 : w1) >> (8 * (k % 4))) >> sh) & 15u;
        out[k] = d * (float)sc * (float)q - dmin * (float)mn;
    }
}

/* Elements e0 .. e0+7 of row g + 8r of a Q6_KT unit (mmq6.cuh's layout): chunk c = e0/32, half
 * hh, lanes t and t + 1 of 4 elements each; Q = q ^ 32 from the three words W0..W2. */
__device__ __forceinline__ void pf_q6kt8(const uint8_t *unit, uint32_t g, uint32_t r, uint32_t e0, float out[8])
{
    const uint32_t c = e0 / 32, hh = (e0 % 32) / 16, t0 = (e0 % 16) / 4;
    uint32_t W[2][3];
#pragma unroll
    for (uint32_t tt = 0; tt < 2; tt++)
#pragma unroll
        for (uint32_t j = 0; j < 3; j++)
            W[tt][j] = *(const uint32_t *)(unit + ((2 * j + (c >> 2)) * 32 + 4 * g + t0 + tt) * 16 + 4 * (c & 3));
    const float sc = (float)(int8_t)unit[MMQ6_SC + 32 * g + 16 * hh + 2 * c + r];
    const float d = __half2float(*(const __half *)(unit + MMQ6_D + 4 * g + 2 * r));
#pragma unroll
    for (int k = 0; k < 8; k++) {
        const uint32_t *Wk = W[k / 4], b = 8 * (k % 4);
        uint32_t Q;
        if (hh == 0) Q = ((r == 0 ? Wk[0] : Wk[1]) >> b & 255u) >> 2;
        else if (r == 0) Q = (Wk[2] >> b & 255u) >> 2;
        else Q = (Wk[0] >> b & 3u) | (Wk[1] >> b & 3u) << 2 | (Wk[2] >> b & 3u) << 4;
        out[k] = d * sc * (float)((int)(Q ^ 32u) - 32);
    }
}

static __global__ void pf_unpack_kernel(const mv_mat m, uint32_t r0, uint32_t nr, __half *__restrict__ wh,
                                        __half *__restrict__ wl)
{
    const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x, per_row = m.cols / 8;
    if (i >= (size_t)nr * per_row) return;
    const uint32_t r = (uint32_t)(i / per_row), c0 = (uint32_t)(i % per_row) * 8, row = r0 + r;
    float v[8];
    if (m.type == MV_T_Q4_KT || m.type == MV_T_Q6_KT) {
        const uint32_t nb = m.cols / 256, rr = row % 16;
        const size_t unit = (size_t)(row / 16) * nb + c0 / 256;
        if (m.type == MV_T_Q4_KT) pf_q4kt8(m.data + unit * MMQ_UNIT, rr & 7, rr >> 3, c0 % 256, v);
        else pf_q6kt8(m.data + unit * MMQ6_UNIT, rr & 7, rr >> 3, c0 % 256, v);
    } else {
#pragma unroll
        for (int k = 0; k < 8; k++) v[k] = mv_elem(m, row, c0 + k);
    }
    __align__(16) __half h[8], l[8];
#pragma unroll
    for (int k = 0; k < 8; k++) {
        h[k] = __float2half_rn(v[k]);
        l[k] = __float2half_rn(v[k] - __half2float(h[k]));
    }
    *(uint4 *)(wh + (size_t)r * m.cols + c0) = *(const uint4 *)h;
    *(uint4 *)(wl + (size_t)r * m.cols + c0) = *(const uint4 *)l;
}

void pf_unpack_w(cudaStream_t st, const mv_mat *w, uint32_t r0, uint32_t nr, __half *wh, __half *wl)
{
    const size_t n = (size_t)nr * (w->cols / 8);
    pf_unpack_kernel<<<(unsigned)((n + 255) / 256), 256, 0, st>>>(*w, r0, nr, wh, wl);
}

/* ---- x ---------------------------------------------------------------------------------------- */
#define PF_ROW_T 256
/* the block's max of v (all threads call it; red: PF_ROW_T/32 floats of shared memory) */
__device__ __forceinline__ float pf_block_max(float v, float *red)
{
#pragma unroll
    for (int o = 16; o; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xFFFFFFFFu, v, o));
    if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = v;
    __syncthreads();
    float m = red[0];
    for (int w = 1; w < PF_ROW_T / 32; w++) m = fmaxf(m, red[w]);
    __syncthreads();
    return m;
}

/* the block's sum of v in f64, in a fixed order (all threads call it; red: PF_ROW_T/32 doubles) */
__device__ __forceinline__ double pf_block_sum(double v, double *red)
{
#pragma unroll
    for (int o = 16; o; o >>= 1) v += __shfl_xor_sync(0xFFFFFFFFu, v, o);
    if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = v;
    __syncthreads();
    double s = 0;
    for (int w = 0; w < PF_ROW_T / 32; w++) s += red[w];
    __syncthreads();
    return s;
}

/* Element of a 256-block at position p (0..255) of x in the unit's k order: slice p/64, k16 step
 * (p/16)%4, logical k l = p%16 of that step, whose thread t = (l%8)/2 holds bytes 0, 2 (l < 8)
 * and 1, 3 (l ≥ 8) of its word. Q4_K step = 2·nibble + (chunk & 1); Q6_K step = 2·(chunk & 1) +
 * half. */
__host__ __device__ __forceinline__ uint32_t pf_kq_elem(bool q6, uint32_t p)
{
    const uint32_t s = p >> 6, step = (p >> 4) & 3, l = p & 15, t = (l & 7) >> 1;
    const uint32_t kk = l < 8 ? 2 * (l & 1) : 1 + 2 * (l & 1);
    if (q6) return 32 * (2 * s + (step >> 1)) + 16 * (step & 1) + 4 * t + kk;
    const uint32_t P = 2 * (s >> 1) + (t >> 1), c = 2 * (s & 1) + (step & 1);
    return 64 * P + 32 * (step >> 1) + 8 * c + 4 * (t & 1) + kk;
}

/* One row of x per block, scaled by a power of two so that max|x| < 2^15 and split into f16 pairs;
 * kind 0 in x's order (pf_gemm), 1 in Q4_KT's k order with the sub-block sums, 2 in Q6_KT's k order
 * (pf_gemm_kq). */
static __global__ void __launch_bounds__(PF_ROW_T) pf_split_kernel(const float *__restrict__ x, uint64_t ldx, uint32_t K,
                                                                   int kind, __half *__restrict__ xh,
                                                                   __half *__restrict__ xl, __half *__restrict__ xsh,
                                                                   __half *__restrict__ xsl, float *__restrict__ rs)
{
    __shared__ float red[PF_ROW_T / 32];
    const float *row = x + (size_t)blockIdx.x * ldx;
    float m = 0.f;
    bool bad = false;
    for (uint32_t k = threadIdx.x; k < K; k += PF_ROW_T) {
        m = fmaxf(m, fabsf(row[k]));
        bad |= !isfinite(row[k]);
    }
    bad = __syncthreads_or(bad);
    m = pf_block_max(m, red);
    /* max|x| < 2^ex; s = 2^(15 − ex) (at most 2^126) so that |x·s| < 2^15, inside f16's range */
    int ex = 0;
    if (m > 0.f) frexpf(m, &ex);
    const int e = min(15 - ex, 126);
    const float s = bad ? 0.f : ldexpf(1.f, e);
    if (threadIdx.x == 0) rs[blockIdx.x] = bad ? __int_as_float(0x7FC00000) : ldexpf(1.f, -e);
    __half *h = xh + (size_t)blockIdx.x * K, *l = xl + (size_t)blockIdx.x * K;
    for (uint32_t p = threadIdx.x; p < K; p += PF_ROW_T) {
        const uint32_t k = kind ? (p & ~255u) + pf_kq_elem(kind == 2, p & 255) : p;
        const float v = bad ? 0.f : row[k] * s;
        const __half hv = __float2half_rn(v);
        h[p] = hv;
        l[p] = __float2half_rn(v - __half2float(hv));
    }
    if (kind != 1 || !xsh) return;
    /* Q4_K's min term: per sub-block 2^-6·Σ x (|Σ| < 2^20 before the 2^-6), summed in f64 by a warp
     * (one element a lane, a fixed tree) */
    __half *sh = xsh + (size_t)blockIdx.x * (K / 32), *sl = xsl + (size_t)blockIdx.x * (K / 32);
    const uint32_t lane = threadIdx.x & 31;
    for (uint32_t j = threadIdx.x >> 5; j < K / 32; j += PF_ROW_T / 32) {
        double a = bad ? 0.f : row[32 * j + lane] * s;
#pragma unroll
        for (int o = 16; o; o >>= 1) a += __shfl_xor_sync(0xFFFFFFFFu, a, o);
        if (lane == 0) {
            const float v = (float)a * 0.015625f;
            const __half hv = __float2half_rn(v);
            sh[j] = hv;
            sl[j] = __float2half_rn(v - __half2float(hv));
        }
    }
}

void pf_split_x(cudaStream_t st, const float *x, uint64_t ldx, uint32_t n, uint32_t K, __half *xh, __half *xl,
                float *rs)
{
    pf_split_kernel<<<n, PF_ROW_T, 0, st>>>(x, ldx, K, 0, xh, xl, NULL, NULL, rs);
}

/* ---- the GEMM ----------------------------------------------------------------------------------
 * CTA tile PF_TM rows of x × PF_TN rows of w, k in steps of 32, a 2-stage cp.async pipeline; 8
 * warps as 2 (x rows) × 4 (w rows), each (PF_TM/2) × 32: PF_TM/32 × 4 mma tiles of m16n8k16,
 * three products per tile and k-step (hh, hl, lh) into one f32 accumulator, in that order. x
 * tiles are the grid's fastest index, so the CTAs that read one w tile run together and w comes
 * from DRAM about once. Rows past n or M are zero-filled in shared memory and never stored. */
#define PF_BK 32
#define PF_LD (PF_BK + 8) /* halves per shared row: 80 bytes, so ldmatrix's 8 rows hit 8 distinct 16-byte slots */
/* Two stages of 40 KB so that two CTAs (123 registers a thread) share an SM: 6% faster on
 * Glimmer's pp512 than three stages at one CTA per SM, and than 64-row x tiles at three stages
 * (bench/RESULTS.md, "Prefill on the GPU"). */
#define PF_STAGES 2
#define PF_MT (PF_TM / 32) /* m16 tiles per warp */
#define PF_STAGE_HALVES (2 * PF_TM * PF_LD + 2 * PF_TN * PF_LD)
#define PF_SMEM ((size_t)PF_STAGES * PF_STAGE_HALVES * sizeof(__half))
#define PF_MINB 2

__device__ __forceinline__ void pf_cp16(void *smem, const void *gmem, bool valid)
{
    const uint32_t s = (uint32_t)__cvta_generic_to_shared(smem);
    const int n = valid ? 16 : 0;
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(s), "l"(gmem), "r"(n));
}

__device__ __forceinline__ void pf_ldsm_x4(uint32_t r[4], const __half *p)
{
    const uint32_t s = (uint32_t)__cvta_generic_to_shared(p);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(s));
}

__device__ __forceinline__ void pf_mma(float c[4], const uint32_t a[4], uint32_t b0, uint32_t b1)
{
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
                 "{%0, %1, %2, %3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

struct pf_gemm_args {
    const __half *xh, *xl, *wh, *wl;
    const float *rs;
    uint32_t n, M, K;
    float *y;
    uint64_t ldy;
    uint32_t op;
    float scale, cap;
};

/* stage s's four tiles: x hi, x lo [PF_TM][PF_LD], w hi, w lo [PF_TN][PF_LD] */
__device__ __forceinline__ void pf_load_stage(const pf_gemm_args &A, __half *sm, uint32_t m0, uint32_t n0, uint32_t k0)
{
    __half *ah = sm, *al = ah + PF_TM * PF_LD, *bh = al + PF_TM * PF_LD, *bl = bh + PF_TN * PF_LD;
    /* 16-byte chunks: 4 per 32-half row */
    for (uint32_t c = threadIdx.x; c < PF_TM * 4; c += blockDim.x) {
        const uint32_t r = c / 4, q = c % 4, row = m0 + r;
        const bool ok = row < A.n;
        const size_t off = (size_t)(ok ? row : 0) * A.K + k0 + 8 * q;
        pf_cp16(ah + r * PF_LD + 8 * q, A.xh + off, ok);
        pf_cp16(al + r * PF_LD + 8 * q, A.xl + off, ok);
    }
    for (uint32_t c = threadIdx.x; c < PF_TN * 4; c += blockDim.x) {
        const uint32_t r = c / 4, q = c % 4, row = n0 + r;
        const bool ok = row < A.M;
        const size_t off = (size_t)(ok ? row : 0) * A.K + k0 + 8 * q;
        pf_cp16(bh + r * PF_LD + 8 * q, A.wh + off, ok);
        pf_cp16(bl + r * PF_LD + 8 * q, A.wl + off, ok);
    }
}

static __global__ void __launch_bounds__(256, PF_MINB) pf_gemm_kernel(const pf_gemm_args A)
{
    extern __shared__ __align__(16) __half pf_sm[];
    const uint32_t wid = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const uint32_t wm = wid / 4, wn = wid % 4; /* the warp's PF_TM/2 x rows and 32 w rows */
    const uint32_t n0 = blockIdx.y * PF_TN, m0 = blockIdx.x * PF_TM;
    const uint32_t KT = A.K / PF_BK;
    float acc[PF_MT][4][4];
#pragma unroll
    for (int i = 0; i < PF_MT; i++)
#pragma unroll
        for (int j = 0; j < 4; j++)
#pragma unroll
            for (int k = 0; k < 4; k++) acc[i][j][k] = 0.f;
#pragma unroll
    for (uint32_t s = 0; s < PF_STAGES - 1; s++) {
        if (s < KT) pf_load_stage(A, pf_sm + s * PF_STAGE_HALVES, m0, n0, s * PF_BK);
        asm volatile("cp.async.commit_group;\n" ::);
    }
    for (uint32_t kt = 0; kt < KT; kt++) {
        asm volatile("cp.async.wait_group %0;\n" ::"n"(PF_STAGES - 2));
        __syncthreads();
        const uint32_t nk = kt + PF_STAGES - 1;
        if (nk < KT) pf_load_stage(A, pf_sm + (nk % PF_STAGES) * PF_STAGE_HALVES, m0, n0, nk * PF_BK);
        asm volatile("cp.async.commit_group;\n" ::);
        const __half *sm = pf_sm + (kt % PF_STAGES) * PF_STAGE_HALVES;
        const __half *ah = sm, *al = ah + PF_TM * PF_LD, *bh = al + PF_TM * PF_LD, *bl = bh + PF_TN * PF_LD;
#pragma unroll
        for (uint32_t kk = 0; kk < PF_BK; kk += 16) {
            uint32_t wb[2][2][4]; /* [pair of n tiles][hi, lo]: b0, b1 of tile 2p, then of 2p + 1 */
#pragma unroll
            for (int p = 0; p < 2; p++) {
                const uint32_t r = wn * 32 + p * 16 + (lane & 7) + ((lane >> 4) << 3), c = kk + ((lane >> 3) & 1) * 8;
                pf_ldsm_x4(wb[p][0], bh + r * PF_LD + c);
                pf_ldsm_x4(wb[p][1], bl + r * PF_LD + c);
            }
#pragma unroll
            for (int i = 0; i < PF_MT; i++) {
                uint32_t xa[2][4]; /* hi, lo */
                const uint32_t r = wm * (PF_TM / 2) + i * 16 + (lane % 16), c = kk + (lane / 16) * 8;
                pf_ldsm_x4(xa[0], ah + r * PF_LD + c);
                pf_ldsm_x4(xa[1], al + r * PF_LD + c);
#pragma unroll
                for (int j = 0; j < 4; j++) {
                    const int p = j / 2, o = 2 * (j % 2);
                    pf_mma(acc[i][j], xa[0], wb[p][0][o], wb[p][0][o + 1]); /* hi · hi */
                    pf_mma(acc[i][j], xa[0], wb[p][1][o], wb[p][1][o + 1]); /* hi · lo */
                    pf_mma(acc[i][j], xa[1], wb[p][0][o], wb[p][0][o + 1]); /* lo · hi */
                }
            }
        }
    }
    asm volatile("cp.async.wait_group 0;\n" ::);
    const uint32_t g = lane >> 2, t = lane & 3;
#pragma unroll
    for (int i = 0; i < PF_MT; i++)
#pragma unroll
        for (int hlf = 0; hlf < 2; hlf++) {
            const uint32_t row = m0 + wm * (PF_TM / 2) + i * 16 + g + 8 * hlf;
            if (row >= A.n) continue;
            const float s = A.rs[row];
            float *yr = A.y + (size_t)row * A.ldy;
#pragma unroll
            for (int j = 0; j < 4; j++)
#pragma unroll
                for (int e = 0; e < 2; e++) {
                    const uint32_t col = n0 + wn * 32 + j * 8 + 2 * t + e;
                    if (col >= A.M) continue;
                    float v = acc[i][j][2 * hlf + e] * s;
                    if (A.op == MV_OP_SOFTCAP) {
                        v = v * A.scale;
                        if (A.cap > 0.f) v = A.cap * tanhf(v / A.cap);
                    }
                    yr[col] = v;
                }
        }
}

void pf_gemm(cudaStream_t st, const __half *xh, const __half *xl, const float *rs, uint32_t n, const __half *wh,
             const __half *wl, uint32_t M, uint32_t K, float *y, uint64_t ldy, uint32_t op, float scale, float cap)
{
    /* per device (each rank of a split binds its own): raised at every launch */
    cudaFuncSetAttribute(pf_gemm_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)PF_SMEM);
    pf_gemm_args A;
    A.xh = xh;
    A.xl = xl;
    A.wh = wh;
    A.wl = wl;
    A.rs = rs;
    A.n = n;
    A.M = M;
    A.K = K;
    A.y = y;
    A.ldy = ldy;
    A.op = op;
    A.scale = scale;
    A.cap = cap;
    const dim3 grid((n + PF_TM - 1) / PF_TM, (M + PF_TN - 1) / PF_TN);
    pf_gemm_kernel<<<grid, 256, PF_SMEM, st>>>(A);
}

/* ---- the K-quant layouts -------------------------------------------------------------------------
 * Q4_K and Q6_K matrices in their tensor-core layouts (MV_T_Q4_KT, MV_T_Q6_KT) are read as they
 * are: no unpack, no scratch. x is written in the unit's k order (pf_kq_elem), so each lane's 16
 * (Q6_K: 3 × 8) bytes of a unit slice are its A fragments (mma.sync m16n8k16's, which are wgmma's)
 * of four k16 steps, the quants as exact f16 integers (Q4_K sc·q, Q6_K q − 32): low nibbles by
 * (q | 0x6400) − 1024 folded into one HFMA2 with the scale, high nibbles by
 * (16q | 0x6400)·sc/16 − 64·sc. The GEMM on them is the warpgroup GEMM below. */
#define KQ_WU 768u         /* shared bytes per unit slice: Q4_K 512, Q6_K 3 planes × 256 */
#define KQ_HU 288u         /* shared bytes per unit header: Q4_K 256 (unit + 2048), Q6_K 288 (unit + 3072) */

void pf_split_kq(cudaStream_t st, const float *x, uint64_t ldx, uint32_t n, uint32_t K, bool q6, __half *xh, __half *xl,
                 __half *xsh, __half *xsl, float *rs)
{
    pf_split_kernel<<<n, PF_ROW_T, 0, st>>>(x, ldx, K, q6 ? 2 : 1, xh, xl, xsh, xsl, rs);
}

#define KQ_SEGS 4
struct pf_kq_args {
    const __half *xh, *xl, *xsh, *xsl; /* x's f16 pair; Q4_K's sub-block sums (the exact variant) */
    const float *rs;
    const uint8_t *w;
    uint32_t n, M, K;
    /* the output of weight rows seg_end[s−1] .. seg_end[s]: y[s], row stride ldy[s] */
    uint32_t nseg, seg_end[KQ_SEGS];
    float *y[KQ_SEGS];
    uint64_t ldy[KQ_SEGS];
    uint32_t op;
    float scale, cap;
    /* K split in nsplit pieces (1: none): CTA z sums blocks [z·NB/nsplit, (z+1)·NB/nsplit) into
     * part[z][row][col] (before any scale) and, for z = 0, its weight rows' 2^-e into
     * part[nsplit·n·M + col]; pf_wg_reduce adds the pieces in z order */
    uint32_t nsplit;
    float *part;
};

__device__ __forceinline__ void pf_cp8(void *smem, const void *gmem, bool valid)
{
    const uint32_t s = (uint32_t)__cvta_generic_to_shared(smem);
    const int n = valid ? 8 : 0;
    asm volatile("cp.async.ca.shared.global [%0], [%1], 8, %2;\n" ::"r"(s), "l"(gmem), "r"(n));
}

__device__ __forceinline__ uint32_t pf_lop_or(uint32_t w, uint32_t mask, uint32_t bits)
{
    uint32_t r;
    asm("lop3.b32 %0, %1, %2, %3, 0xEA;\n" : "=r"(r) : "r"(w), "r"(mask), "r"(bits)); /* (w & mask) | bits */
    return r;
}

__device__ __forceinline__ uint32_t pf_lop_xor(uint32_t w, uint32_t mask, uint32_t bits)
{
    uint32_t r;
    asm("lop3.b32 %0, %1, %2, %3, 0x6A;\n" : "=r"(r) : "r"(w), "r"(mask), "r"(bits)); /* (w & mask) ^ bits */
    return r;
}

__device__ __forceinline__ uint32_t pf_h2fma(uint32_t a, uint32_t b, uint32_t c)
{
    const __half2 r = __hfma2(*(const __half2 *)&a, *(const __half2 *)&b, *(const __half2 *)&c);
    return *(const uint32_t *)&r;
}

__device__ __forceinline__ uint32_t pf_h2(float v)
{
    const __half2 r = __float2half2_rn(v);
    return *(const uint32_t *)&r;
}

/* Q4_K: the 6-bit scale or min of item q (row half q >> 1, group q & 1) of header lane ts */
__device__ __forceinline__ uint32_t pf_q4_sc(const uint8_t *hd, uint32_t ts, uint32_t q)
{
    return (*(const uint32_t *)(hd + 8 + 4 * ts) >> (6 * q)) & 63u;
}
__device__ __forceinline__ uint32_t pf_q4_mn(const uint8_t *hd, uint32_t ts, uint32_t q)
{
    const uint32_t sw = *(const uint32_t *)(hd + 8 + 4 * ts), hw = *(const unsigned short *)(hd + 24 + 2 * ts);
    return q == 0 ? (sw >> 24) & 63u : q == 1 ? hw & 63u : q == 2 ? (hw >> 6) & 63u : ((sw >> 30) << 4) | (hw >> 12);
}

/* The A fragments (mma.sync m16n8k16, rows g and g + 8 of unit u, logical k 2t, 2t+1 | +8, +9)
 * of k16 step `step` of slice s from the unit slice ws and the block's header hb: Q4_K sc·q,
 * Q6_K q − 32, exact f16 integers. */
template <bool Q6>
__device__ __forceinline__ void pf_kq_frag(const uint8_t *ws, const uint8_t *hb, uint32_t u, uint32_t s, uint32_t step,
                                           uint32_t lane, uint32_t a[4])
{
    const uint32_t g = lane >> 2, t = lane & 3;
    const uint8_t *wu = ws + u * KQ_WU;
    if (!Q6) {
        /* low nibbles of sub-block 2P (header lane t >> 1), high ones of 2P + 1 (lane 2 + (t >> 1)) */
        const uint8_t *hd = hb + u * KQ_HU + 32 * g;
        const uint32_t hi = step >> 1, ts = hi ? 2 + (t >> 1) : t >> 1;
        const float sc0 = (float)pf_q4_sc(hd, ts, s >> 1), sc1 = (float)pf_q4_sc(hd, ts, 2 + (s >> 1));
        const uint32_t mul0 = pf_h2(hi ? sc0 * 0.0625f : sc0), add0 = pf_h2(hi ? -64.f * sc0 : -1024.f * sc0);
        const uint32_t mul1 = pf_h2(hi ? sc1 * 0.0625f : sc1), add1 = pf_h2(hi ? -64.f * sc1 : -1024.f * sc1);
        const uint32_t mask = hi ? 0x00F000F0u : 0x000F000Fu;
        const uint32_t w0 = *(const uint32_t *)(wu + 16 * lane + 8 * (step & 1)),
                       w1 = *(const uint32_t *)(wu + 16 * lane + 8 * (step & 1) + 4);
        a[0] = pf_h2fma(pf_lop_or(w0, mask, 0x64006400u), mul0, add0);
        a[1] = pf_h2fma(pf_lop_or(w1, mask, 0x64006400u), mul1, add1);
        a[2] = pf_h2fma(pf_lop_or(w0 >> 8, mask, 0x64006400u), mul0, add0);
        a[3] = pf_h2fma(pf_lop_or(w1 >> 8, mask, 0x64006400u), mul1, add1);
    } else {
        const uint32_t c = 2 * s + (step >> 1), hh = step & 1, wo = 8 * lane + 4 * (c & 1);
        const uint32_t W0 = *(const uint32_t *)(wu + wo), W1 = *(const uint32_t *)(wu + 256 + wo),
                       W2 = *(const uint32_t *)(wu + 512 + wo);
        uint32_t r0, r8; /* the 6-bit Q of rows g and g + 8, one per byte */
        if (!hh) {
            r0 = W0 >> 2, r8 = W1 >> 2;
        } else {
            r0 = W2 >> 2;
            r8 = (W0 & 0x03030303u) | (W1 & 0x03030303u) << 2 | (W2 & 0x03030303u) << 4;
        }
        const uint32_t off = pf_h2(-1056.f), one = pf_h2(1.f);
        a[0] = pf_h2fma(pf_lop_xor(r0, 0x003F003Fu, 0x64206420u), one, off);
        a[1] = pf_h2fma(pf_lop_xor(r8, 0x003F003Fu, 0x64206420u), one, off);
        a[2] = pf_h2fma(pf_lop_xor(r0 >> 8, 0x003F003Fu, 0x64206420u), one, off);
        a[3] = pf_h2fma(pf_lop_xor(r8 >> 8, 0x003F003Fu, 0x64206420u), one, off);
    }
}

bool pf_kq_ok(const mv_mat *w) { return (w->type == MV_T_Q4_KT || w->type == MV_T_Q6_KT) && w->cols % 256 == 0; }

static size_t pf_kq_bytes(const mv_mat *w)
{
    return (size_t)w->rows / 16 * (w->cols / 256) * (w->type == MV_T_Q6_KT ? MMQ6_UNIT : MMQ_UNIT);
}

bool pf_kq_adjacent(const mv_mat *a, const mv_mat *b)
{
    return pf_kq_ok(a) && pf_kq_ok(b) && a->type == b->type && a->cols == b->cols && a->rows % 16 == 0 &&
           b->data == a->data + pf_kq_bytes(a);
}

/* ---- the warpgroup GEMM (wgmma) -------------------------------------------------------------------
 * x in the unit's k order from pf_split_kq, the units as they are, on Hopper's warpgroup products;
 * the weights are the A operand, built in registers by the warp that owns their 16 rows (a unit),
 * x is B, both halves 128-byte-swizzled tiles in shared memory. Two kernels:
 *  - pf_wg_kernel, three products (the product's Q6_K; its Q4_K instance is kbench_pfgemm's
 *    contender): each weight made whole in f32 from its unit (Q6_K (d·sc)·(q − 32), Q4_K
 *    d·(sc·q) − dmin·m, each one rounding), scaled by a power of two per weight row 2^e_r
 *    (max |w·2^e_r| < 2^15) and split into an f16 pair wh + wl (22 bits, as the general path's
 *    unpack), so one accumulator takes the whole sum wh·xh + wh·xl + wl·xh, no fold;
 *  - pf_wgx_kernel, Q4_K exact (below): two products of sc·q and a fold per block.
 * CTA: WG_NWG warpgroups × 64 weight rows, NX x rows (the products' N); k in slices of 64 through
 * a WG_STAGES cp.async pipeline, loads WG_STAGES − 2 slices ahead, one barrier a slice. Each
 * output's sum runs over k in one order whatever rows share the call, so a row's bytes do not
 * depend on n (checked by kbench_pfgemm and test_cuda). A grid that would leave SMs idle splits K
 * into pieces fixed by the matrix's shape alone (wg_nsplit: never by n), summed in one order. */
#define WG_NWG(nx) 4
#define WG_TW(nx) (64 * WG_NWG(nx))
#define WG_STAGES 4
#define WG_XT(nx) ((uint32_t)(nx) * 128u) /* bytes of one x tile, hi or lo */
#define WG_STAGE_BYTES(nx) (2 * WG_XT(nx) + (WG_TW(nx) / 16) * KQ_WU)
#define WG_SMEM(nx) ((size_t)WG_STAGES * WG_STAGE_BYTES(nx) + 2 * (WG_TW(nx) / 16) * KQ_HU + 1024)

__device__ __forceinline__ void wg_fence_proxy() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }

/* slice i's x tiles and unit slices into stage sm (1024-aligned), at slice 0 of a block its headers
 * into hb */
template <bool Q6, int NX, int TW = WG_TW(NX)>
__device__ __forceinline__ void wg_load(const pf_kq_args &A, uint8_t *sm, uint8_t *hb, uint32_t m0, uint32_t n0,
                                        uint32_t i)
{
    const uint32_t nb = A.K / 256, b = i / 4, s = i % 4, k0 = 64 * i;
    uint8_t *xh = sm, *xl = sm + WG_XT(NX), *ws = sm + 2 * WG_XT(NX);
    for (uint32_t c = threadIdx.x; c < NX * 8; c += blockDim.x) {
        const uint32_t r = c / 8, q = c % 8, row = m0 + r, o = r * 128 + ((q ^ (r & 7)) << 4);
        const bool ok = row < A.n;
        const size_t off = (size_t)(ok ? row : 0) * A.K + k0 + 8 * q;
        pf_cp16(xh + o, A.xh + off, ok);
        pf_cp16(xl + o, A.xl + off, ok);
    }
    const uint32_t unit_bytes = Q6 ? MMQ6_UNIT : MMQ_UNIT;
    if (!Q6) {
        for (uint32_t c = threadIdx.x; c < (TW / 16) * 32; c += blockDim.x) {
            const uint32_t u = c / 32, L = c % 32, tile = n0 / 16 + u;
            const bool ok = 16 * tile < A.M;
            const uint8_t *src = A.w + ((size_t)(ok ? tile : 0) * nb + b) * unit_bytes + 512 * s + 16 * L;
            pf_cp16(ws + u * KQ_WU + 16 * L, src, ok);
        }
    } else {
        for (uint32_t c = threadIdx.x; c < (TW / 16) * 96; c += blockDim.x) {
            const uint32_t u = c / 96, j = (c % 96) / 32, L = c % 32, tile = n0 / 16 + u;
            const bool ok = 16 * tile < A.M;
            const uint8_t *src = A.w + ((size_t)(ok ? tile : 0) * nb + b) * unit_bytes + 512 * (2 * j + s / 2) + 16 * L +
                                 8 * (s % 2);
            pf_cp8(ws + u * KQ_WU + 256 * j + 8 * L, src, ok);
        }
    }
    if (s == 0) {
        const uint32_t hbytes = Q6 ? 288 : 256, hoff = Q6 ? MMQ6_SC : 2048;
        for (uint32_t c = threadIdx.x; c < (TW / 16) * (hbytes / 16); c += blockDim.x) {
            const uint32_t u = c / (hbytes / 16), q = c % (hbytes / 16), tile = n0 / 16 + u;
            const bool ok = 16 * tile < A.M;
            pf_cp16(hb + u * KQ_HU + 16 * q, A.w + ((size_t)(ok ? tile : 0) * nb + b) * unit_bytes + hoff + 16 * q, ok);
        }
    }
}

/* The power of two 2^e for weight rows g + 8h of unit `tile` (lane 4g + t; every lane of the warp
 * calls it): max over the row's blocks of |w| ≤ |d|·945 + |dmin|·63 (Q4_K), |d|·4096 (Q6_K), then
 * e so that the bound·2^e < 2^15 (e = 0 for a zero or non-finite bound). */
template <bool Q6>
__device__ __forceinline__ float wg_row_scale(const pf_kq_args &A, uint32_t tile, uint32_t lane, uint32_t h)
{
    const uint32_t nb = A.K / 256, g = lane >> 2, t = lane & 3;
    float m = 0.f;
    if (16 * tile < A.M)
        for (uint32_t b = t; b < nb; b += 4) {
            const uint8_t *u = A.w + ((size_t)tile * nb + b) * (Q6 ? MMQ6_UNIT : MMQ_UNIT);
            if (Q6) {
                m = fmaxf(m, fabsf(__half2float(*(const __half *)(u + MMQ6_D + 4 * g + 2 * h))) * 4096.f);
            } else {
                const __half *hd = (const __half *)(u + 2048 + 32 * g);
                m = fmaxf(m, fabsf(__half2float(hd[h])) * 945.f + fabsf(__half2float(hd[2 + h])) * 63.f);
            }
        }
    m = fmaxf(m, __shfl_xor_sync(0xFFFFFFFFu, m, 1));
    m = fmaxf(m, __shfl_xor_sync(0xFFFFFFFFu, m, 2));
    int ex = 0;
    if (m > 0.f && isfinite(m)) frexpf(m, &ex);
    return ldexpf(1.f, max(-120, min(120, 15 - ex)));
}

/* a[r] = the f16 pair of mul·v − sub for the two f16 integers v of core[r] */
__device__ __forceinline__ void wg_split(const uint32_t core, float mul, float sub, uint32_t &hi, uint32_t &lo)
{
    const float2 v = __half22float2(*(const __half2 *)&core);
    const float w0 = fmaf(mul, v.x, -sub), w1 = fmaf(mul, v.y, -sub);
    const __half2 h = __floats2half2_rn(w0, w1);
    const float2 hf = __half22float2(h);
    const __half2 l = __floats2half2_rn(w0 - hf.x, w1 - hf.y);
    hi = *(const uint32_t *)&h;
    lo = *(const uint32_t *)&l;
}

template <int NX> __device__ __forceinline__ void wg_mma(float *d, const uint32_t a[4], uint64_t desc);
template <> __device__ __forceinline__ void wg_mma<64>(float *d, const uint32_t a[4], uint64_t desc) { wg_mma_n64(d, a, desc); }
template <> __device__ __forceinline__ void wg_mma<128>(float *d, const uint32_t a[4], uint64_t desc) { wg_mma_n128(d, a, desc); }

/* A warp's outputs (weight rows c0 + g, c0 + g + 8 at 2^-e inv0, inv1; x rows m0 + 8j + 2t + e):
 * y = op(acc·inv·rs), or with K split, the raw piece into A.part (and piece 0 the inverse scales) */
template <int NX>
__device__ __forceinline__ void wg_store(const pf_kq_args &A, const float *acc, uint32_t m0, uint32_t c0, uint32_t lane,
                                         float inv0, float inv1)
{
    const uint32_t g = lane >> 2, t = lane & 3, z = blockIdx.z;
    if (c0 >= A.M) return;
    if (A.nsplit > 1) {
        float *P = A.part + (size_t)z * A.n * A.M;
#pragma unroll
        for (int j = 0; j < NX / 8; j++)
#pragma unroll
            for (int e = 0; e < 2; e++) {
                const uint32_t row = m0 + 8 * j + 2 * t + e;
                if (row >= A.n) continue;
                P[(size_t)row * A.M + c0 + g] = acc[4 * j + e];
                P[(size_t)row * A.M + c0 + g + 8] = acc[4 * j + 2 + e];
            }
        if (z == 0 && blockIdx.x == 0 && t == 0) {
            float *einv = A.part + (size_t)A.nsplit * A.n * A.M;
            einv[c0 + g] = inv0;
            einv[c0 + g + 8] = inv1;
        }
        return;
    }
    uint32_t sg = 0, sb = 0;
    while (c0 >= A.seg_end[sg]) sb = A.seg_end[sg++];
#pragma unroll
    for (int j = 0; j < NX / 8; j++)
#pragma unroll
        for (int e = 0; e < 2; e++) {
            const uint32_t row = m0 + 8 * j + 2 * t + e;
            if (row >= A.n) continue;
            const float rs = A.rs[row];
            float *yr = A.y[sg] + (size_t)row * A.ldy[sg] - sb;
#pragma unroll
            for (int hlf = 0; hlf < 2; hlf++) {
                float v = acc[4 * j + 2 * hlf + e] * (hlf ? inv1 : inv0) * rs;
                if (A.op == MV_OP_SOFTCAP) {
                    v = v * A.scale;
                    if (A.cap > 0.f) v = A.cap * tanhf(v / A.cap);
                }
                yr[c0 + g + 8 * hlf] = v;
            }
        }
}

/* VAR: 0 the product; workbench variants that leave work out (kbench_pfgemm): 1 one product of
 * three, 2 no f32 weights (the exact integers as they come) */
template <bool Q6, int NX, int VAR = 0>
static __global__ void __launch_bounds__(128 * WG_NWG(NX), 1) pf_wg_kernel(const pf_kq_args A)
{
    extern __shared__ uint8_t wg_sm_raw[];
    uint8_t *wg_sm = wg_sm_raw + ((1024u - ((uint32_t)__cvta_generic_to_shared(wg_sm_raw) & 1023u)) & 1023u);
    uint8_t *hbuf = wg_sm + WG_STAGES * WG_STAGE_BYTES(NX);
    const uint32_t wid = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2;
    const uint32_t m0 = blockIdx.x * NX, n0 = blockIdx.y * WG_TW(NX), tile = n0 / 16 + wid;
    const uint32_t NB = A.K / 256, z = blockIdx.z, i0 = 4 * (z * NB / A.nsplit), i1 = 4 * ((z + 1) * NB / A.nsplit);
    float acc[NX / 2];
#pragma unroll
    for (int j = 0; j < NX / 2; j++) acc[j] = 0.f;
#define WG_STAGE_AT(i) (wg_sm + ((i) % WG_STAGES) * WG_STAGE_BYTES(NX))
#define WG_HB_AT(i) (hbuf + (((i) / 4) % 2) * (WG_TW(NX) / 16) * KQ_HU)
#pragma unroll
    for (uint32_t s = i0; s < i0 + WG_STAGES - 2; s++) {
        if (s < i1) wg_load<Q6, NX>(A, WG_STAGE_AT(s), WG_HB_AT(s), m0, n0, s);
        asm volatile("cp.async.commit_group;\n" ::);
    }
    const float e0 = wg_row_scale<Q6>(A, tile, lane, 0), e1 = wg_row_scale<Q6>(A, tile, lane, 1);
    for (uint32_t i = i0; i < i1; i++) {
        asm volatile("cp.async.wait_group %0;\n" ::"n"(WG_STAGES - 3));
        wg_fence_proxy();
        __syncthreads();
        const uint32_t nk = i + WG_STAGES - 2;
        if (nk < i1) wg_load<Q6, NX>(A, WG_STAGE_AT(nk), WG_HB_AT(nk), m0, n0, nk);
        asm volatile("cp.async.commit_group;\n" ::);
        const uint8_t *sm = WG_STAGE_AT(i), *ws = sm + 2 * WG_XT(NX), *hb = WG_HB_AT(i);
        const uint32_t s = i % 4, xs = (uint32_t)__cvta_generic_to_shared(sm);
#pragma unroll
        for (uint32_t step = 0; step < 4; step++) {
            uint32_t core[4], ah[4], al[4];
            pf_kq_frag<Q6>(ws, hb, wid, s, step, lane, core);
            float mul0, mul1, sub0 = 0.f, sub1 = 0.f;
            if (!Q6) {
                const uint8_t *hd = hb + wid * KQ_HU + 32 * g;
                const uint32_t t = lane & 3, ts = (step >> 1) ? 2 + (t >> 1) : t >> 1;
                const __half *dd = (const __half *)hd;
                mul0 = __half2float(dd[0]) * e0;
                mul1 = __half2float(dd[1]) * e1;
                sub0 = __half2float(dd[2]) * (float)pf_q4_mn(hd, ts, s >> 1) * e0;
                sub1 = __half2float(dd[3]) * (float)pf_q4_mn(hd, ts, 2 + (s >> 1)) * e1;
            } else {
                const uint8_t *hd = hb + wid * KQ_HU;
                const uint32_t c = 2 * s + (step >> 1), hh = step & 1;
                const __half *dd = (const __half *)(hd + 256 + 4 * g);
                const int8_t *scp = (const int8_t *)(hd + 32 * g + 16 * hh + 2 * c);
                mul0 = __half2float(dd[0]) * (float)scp[0] * e0;
                mul1 = __half2float(dd[1]) * (float)scp[1] * e1;
            }
            if (VAR == 2) {
#pragma unroll
                for (int r = 0; r < 4; r++) ah[r] = al[r] = core[r] ^ __float_as_uint(mul0 + mul1 + sub0 + sub1);
            } else {
                wg_split(core[0], mul0, sub0, ah[0], al[0]);
                wg_split(core[1], mul1, sub1, ah[1], al[1]);
                wg_split(core[2], mul0, sub0, ah[2], al[2]);
                wg_split(core[3], mul1, sub1, ah[3], al[3]);
            }
            wg_fence();
            const uint64_t dh = wg_desc_sw128(xs + 32 * step), dl = wg_desc_sw128(xs + WG_XT(NX) + 32 * step);
            wg_mma<NX>(acc, ah, dh);
            if (VAR != 1) {
                wg_mma<NX>(acc, ah, dl);
                wg_mma<NX>(acc, al, dh);
            }
            wg_commit();
            wg_wait<1>();
        }
    }
    wg_wait<0>();
    asm volatile("cp.async.wait_group 0;\n" ::);
    wg_store<NX>(A, acc, m0, 16 * tile, lane, 1.f / e0, 1.f / e1);
#undef WG_STAGE_AT
#undef WG_HB_AT
}

/* ---- the exact Q4_K variant: two products and a fold per block ----------------------------------
 * Q4_K's A as pf_kq_frag makes it, the exact integers sc·q (≤ 945), so a block's sum needs only x's
 * two halves: tmp = Σ_block sc·q·(xh + xl) on the tensor cores (256 positions, 32 products), then
 * per (weight row, block) acc += d·tmp − dmin·Σ_j m_j·xs_j in f32 (the min term one m16n8k8 pair of
 * 64·m against xs = 2^−6·Σ_{sub-block} x, pf_split_kq's sums). Two accumulators a thread, so 64 x
 * rows a CTA; the fold waits for the block's products (wgmma.wait_group 0). */
/* NWG warpgroups (64 weight rows each) × NX x rows a CTA: 4 × 64, one CTA an SM (the product's); 2 × 64,
 * two an SM, and 2 × 128, one (213 registers), the same bytes and slower (kbench_pfgemm) */
#define WGX_XS(nx) ((nx) * 32u) /* shared bytes of a block's sub-block sums: rows × 8 × (hi, lo) */
#define WGX_STAGE_BYTES(nwg, nx) (2 * WG_XT(nx) + (nwg) * 4 * KQ_WU + WGX_XS(nx))
#define WGX_SMEM(nwg, nx) ((size_t)WG_STAGES * WGX_STAGE_BYTES(nwg, nx) + 2 * (nwg) * 4 * KQ_HU + 1024)

__device__ __forceinline__ void pf_mma_k8(float c[4], uint32_t a0, uint32_t a1, uint32_t b0)
{
    asm("mma.sync.aligned.m16n8k8.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5}, {%6}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a0), "r"(a1), "r"(b0));
}

__device__ __forceinline__ uint32_t pf_pack_h2(float lo, float hi)
{
    const __half2 r = __floats2half2_rn(lo, hi);
    return *(const uint32_t *)&r;
}

/* One n8 tile's block fold (rows g: d0, mn0; g + 8: d1, mn1): acc += d·tmp − dmin·(64·m · xs), the
 * min term one m16n8k8 pair (am: 64·m of the tile's rows; xbh, xbl: its x rows' xs pair), tmp = 0 */
__device__ __forceinline__ void pf_q4_fold_tile(float ac[4], float tp[4], uint32_t am0, uint32_t am1, uint32_t xbh,
                                                uint32_t xbl, float d0, float d1, float mn0, float mn1)
{
    float c4[4] = {0.f, 0.f, 0.f, 0.f};
    pf_mma_k8(c4, am0, am1, xbh);
    pf_mma_k8(c4, am0, am1, xbl);
    ac[0] = fmaf(-mn0, c4[0], fmaf(d0, tp[0], ac[0]));
    ac[1] = fmaf(-mn0, c4[1], fmaf(d0, tp[1], ac[1]));
    ac[2] = fmaf(-mn1, c4[2], fmaf(d1, tp[2], ac[2]));
    ac[3] = fmaf(-mn1, c4[3], fmaf(d1, tp[3], ac[3]));
    tp[0] = tp[1] = tp[2] = tp[3] = 0.f;
}

template <int NWG, int NX>
static __global__ void __launch_bounds__(128 * NWG, NX == 64 ? 4 / NWG : 1) pf_wgx_kernel(const pf_kq_args A)
{
    extern __shared__ uint8_t wg_sm_raw[];
    uint8_t *wg_sm = wg_sm_raw + ((1024u - ((uint32_t)__cvta_generic_to_shared(wg_sm_raw) & 1023u)) & 1023u);
    uint8_t *hbuf = wg_sm + WG_STAGES * WGX_STAGE_BYTES(NWG, NX);
    const uint32_t wid = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const uint32_t m0 = blockIdx.x * NX, n0 = blockIdx.y * (64 * NWG), tile = n0 / 16 + wid;
    const uint32_t NB = A.K / 256, z = blockIdx.z, i0 = 4 * (z * NB / A.nsplit), i1 = 4 * ((z + 1) * NB / A.nsplit);
    float acc[NX / 2], tmp[NX / 2];
#pragma unroll
    for (int j = 0; j < NX / 2; j++) acc[j] = tmp[j] = 0.f;
#define WGX_STAGE_AT(i) (wg_sm + ((i) % WG_STAGES) * WGX_STAGE_BYTES(NWG, NX))
#define WGX_HB_AT(i) (hbuf + (((i) / 4) % 2) * ((64 * NWG) / 16) * KQ_HU)
#define WGX_LOAD(i)                                                                                            \
    do {                                                                                                       \
        uint8_t *sm_ = WGX_STAGE_AT(i);                                                                        \
        wg_load<false, NX, 64 * NWG>(A, sm_, WGX_HB_AT(i), m0, n0, (i));                                             \
        if ((i) % 4 == 3)                                                                                      \
            for (uint32_t c = threadIdx.x; c < 2 * NX; c += blockDim.x) {                                  \
                const uint32_t r = c / 2, row = m0 + r;                                                        \
                const bool ok = row < A.n;                                                                     \
                const __half *src = (c & 1 ? A.xsl : A.xsh) + (size_t)(ok ? row : 0) * (A.K / 32) + 8 * ((i) / 4); \
                pf_cp16(sm_ + WGX_STAGE_BYTES(NWG, NX) - WGX_XS(NX) + (c & 1) * NX * 16 + 16 * r, src, ok);               \
            }                                                                                                  \
    } while (0)
    for (uint32_t s = i0; s < i0 + WG_STAGES - 2; s++) {
        if (s < i1) WGX_LOAD(s);
        asm volatile("cp.async.commit_group;\n" ::);
    }
    for (uint32_t i4 = i0; i4 < i1; i4 += 4)
#pragma unroll
    for (uint32_t s = 0; s < 4; s++) {
        const uint32_t i = i4 + s;
        asm volatile("cp.async.wait_group %0;\n" ::"n"(WG_STAGES - 3));
        wg_fence_proxy();
        __syncthreads();
        const uint32_t nk = i + WG_STAGES - 2;
        if (nk < i1) WGX_LOAD(nk);
        asm volatile("cp.async.commit_group;\n" ::);
        const uint8_t *sm = WGX_STAGE_AT(i), *ws = sm + 2 * WG_XT(NX), *hb = WGX_HB_AT(i);
        const uint32_t xs = (uint32_t)__cvta_generic_to_shared(sm);
        /* the slice's scale constants (pf_kq_frag's, made once for its four k16 steps) and the lane's
         * 16 bytes of the unit slice */
        uint32_t mul[2][2], add[2][2];
        {
            const uint8_t *hd = hb + wid * KQ_HU + 32 * g;
#pragma unroll
            for (uint32_t hi = 0; hi < 2; hi++) {
                const uint32_t ts = hi ? 2 + (t >> 1) : t >> 1;
#pragma unroll
                for (uint32_t r = 0; r < 2; r++) {
                    const float sc = (float)pf_q4_sc(hd, ts, 2 * r + (s >> 1));
                    mul[hi][r] = pf_h2(hi ? sc * 0.0625f : sc);
                    add[hi][r] = pf_h2(hi ? -64.f * sc : -1024.f * sc);
                }
            }
        }
        const uint4 wq = *(const uint4 *)(ws + wid * KQ_WU + 16 * lane);
#pragma unroll
        for (uint32_t step = 0; step < 4; step++) {
            const uint32_t hi = step >> 1, mask = hi ? 0x00F000F0u : 0x000F000Fu;
            const uint32_t w0 = step & 1 ? wq.z : wq.x, w1 = step & 1 ? wq.w : wq.y;
            uint32_t a[4];
            a[0] = pf_h2fma(pf_lop_or(w0, mask, 0x64006400u), mul[hi][0], add[hi][0]);
            a[1] = pf_h2fma(pf_lop_or(w1, mask, 0x64006400u), mul[hi][1], add[hi][1]);
            a[2] = pf_h2fma(pf_lop_or(w0 >> 8, mask, 0x64006400u), mul[hi][0], add[hi][0]);
            a[3] = pf_h2fma(pf_lop_or(w1 >> 8, mask, 0x64006400u), mul[hi][1], add[hi][1]);
            wg_fence();
            wg_mma<NX>(tmp, a, wg_desc_sw128(xs + 32 * step));
            wg_mma<NX>(tmp, a, wg_desc_sw128(xs + WG_XT(NX) + 32 * step));
            wg_commit();
            wg_wait<1>();
        }
        if (s == 3) {
            /* the block's end: acc += d·tmp − dmin·(64·m · xs) per weight row */
            wg_wait<0>();
            const uint8_t *xsb = sm + WGX_STAGE_BYTES(NWG, NX) - WGX_XS(NX);
            uint32_t xb[2][NX / 32][4]; /* [hi, lo][32-row group] the B fragments of 4 n8 tiles each */
#pragma unroll
            for (int p = 0; p < 2; p++)
#pragma unroll
                for (int q = 0; q < NX / 32; q++) {
                    const uint32_t sh = (uint32_t)__cvta_generic_to_shared(xsb + p * NX * 16 + 16 * (32 * q + lane));
                    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                                 : "=r"(xb[p][q][0]), "=r"(xb[p][q][1]), "=r"(xb[p][q][2]), "=r"(xb[p][q][3])
                                 : "r"(sh));
                }
            const uint8_t *hd = hb + wid * KQ_HU + 32 * g;
            const uint32_t G = t >> 1, te = t & 1, to = 2 + (t & 1);
            /* 64·m of sub-blocks 2t, 2t + 1 for rows g (item G) and g + 8 (item 2 + G) */
            const uint32_t am0 = pf_pack_h2(64.f * (float)pf_q4_mn(hd, te, G), 64.f * (float)pf_q4_mn(hd, to, G));
            const uint32_t am1 = pf_pack_h2(64.f * (float)pf_q4_mn(hd, te, 2 + G), 64.f * (float)pf_q4_mn(hd, to, 2 + G));
            const __half *dd = (const __half *)hd;
            const float d0 = __half2float(dd[0]), d1 = __half2float(dd[1]), mn0 = __half2float(dd[2]),
                        mn1 = __half2float(dd[3]);
#pragma unroll
            for (int j = 0; j < NX / 8; j++)
                pf_q4_fold_tile(acc + 4 * j, tmp + 4 * j, am0, am1, xb[0][j / 4][j % 4], xb[1][j / 4][j % 4], d0, d1, mn0, mn1);
        }
    }
    asm volatile("cp.async.wait_group 0;\n" ::);
    wg_store<NX>(A, acc, m0, 16 * tile, lane, 1.f, 1.f);
#undef WGX_STAGE_AT
#undef WGX_HB_AT
#undef WGX_LOAD
}

/* the pieces of a split K summed in z order, then the epilogue pf_wg_kernel's would have applied */
static __global__ void pf_wg_reduce_kernel(const pf_kq_args A)
{
    const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x, nm = (size_t)A.n * A.M;
    if (i >= nm) return;
    const uint32_t row = (uint32_t)(i / A.M), col = (uint32_t)(i % A.M);
    float v = A.part[i];
    for (uint32_t z = 1; z < A.nsplit; z++) v += A.part[z * nm + i];
    v = v * A.part[A.nsplit * nm + col] * A.rs[row];
    if (A.op == MV_OP_SOFTCAP) {
        v = v * A.scale;
        if (A.cap > 0.f) v = A.cap * tanhf(v / A.cap);
    }
    uint32_t sg = 0, sb = 0;
    while (col >= A.seg_end[sg]) sb = A.seg_end[sg++];
    A.y[sg][(size_t)row * A.ldy[sg] + col - sb] = v;
}

/* the current device's SMs (asked each time: a split's ranks call from their threads, each on its
 * own device; the attribute query is a host-side lookup) */
static int wg_sms(void)
{
    int dev = 0, sms = 0;
    cudaGetDevice(&dev);
    if (cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev) || sms <= 0) sms = 132;
    return sms;
}

/* How many pieces K is split into for an M × K matrix: the count that a full chunk (512 rows: X
 * x tiles) finishes soonest with, by a model of the kernel (`slice_us` a 64-column slice of a CTA,
 * 8 bytes of partial sums an output and piece at 3.5 TB/s), at most 5 rounds of CTAs of 4 x tiles
 * (pf_kq_part_bytes). A function of the shape and kernel alone, so that a row's bytes do not
 * depend on the call's rows. */
static uint32_t wg_nsplit(uint32_t M, uint32_t K, uint32_t X, double slice_us)
{
    const uint32_t sms = (uint32_t)wg_sms(), T = (M + WG_TW(128) - 1) / WG_TW(128), NB = K / 256;
    uint32_t best = 1;
    double best_t = 1e30;
    for (uint32_t S = 1; S <= NB && S <= 32 && 4 * T * S <= 5 * sms; S++) {
        const double rounds = (X * T * S + sms - 1) / sms, blocks = (NB + S - 1) / S;
        const double t = rounds * blocks * 4 * slice_us + (S > 1 ? S * 512.0 * M * 8 / 3.5e6 : 0);
        if (t < best_t) best = S, best_t = t;
    }
    return best;
}

size_t pf_kq_part_bytes(uint32_t rows)
{
    /* S·T ≤ 5·sms/4 pieces of 256 weight rows (wg_nsplit), and the row scales */
    return ((size_t)5 * wg_sms() / 4 * WG_TW(128) * ((size_t)rows + 1)) * sizeof(float);
}

template <bool Q6, int NX, int VAR = 0> static void wg_launch(cudaStream_t st, const pf_kq_args &A)
{
    /* per device (each rank of a split binds its own): raised at every launch */
    cudaFuncSetAttribute(pf_wg_kernel<Q6, NX, VAR>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)WG_SMEM(NX));
    const dim3 grid((A.n + NX - 1) / NX, (A.M + WG_TW(NX) - 1) / WG_TW(NX), A.nsplit);
    pf_wg_kernel<Q6, NX, VAR><<<grid, 128 * WG_NWG(NX), WG_SMEM(NX), st>>>(A);
    if (A.nsplit > 1) {
        const size_t nm = (size_t)A.n * A.M;
        pf_wg_reduce_kernel<<<(unsigned)((nm + 255) / 256), 256, 0, st>>>(A);
    }
}

template <int NWG, int NX> static void wgx_launch(cudaStream_t st, const pf_kq_args &A)
{
    /* per device (each rank of a split binds its own): raised at every launch */
    cudaFuncSetAttribute(pf_wgx_kernel<NWG, NX>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)WGX_SMEM(NWG, NX));
    const dim3 grid((A.n + NX - 1) / NX, (A.M + 64 * NWG - 1) / (64 * NWG), A.nsplit);
    pf_wgx_kernel<NWG, NX><<<grid, 128 * NWG, WGX_SMEM(NWG, NX), st>>>(A);
    if (A.nsplit > 1) {
        const size_t nm = (size_t)A.n * A.M;
        pf_wg_reduce_kernel<<<(unsigned)((nm + 255) / 256), 256, 0, st>>>(A);
    }
}

/* the arguments of a call; nsplit 1 (pf_gemm_kq_n sets it) */
static pf_kq_args wg_args(const __half *xh, const __half *xl, const __half *xsh, const __half *xsl, const float *rs,
                          uint32_t n, const mv_mat *w, uint32_t nw, float *const *y, const uint64_t *ldy, uint32_t op,
                          float scale, float cap, float *part)
{
    pf_kq_args A;
    memset(&A, 0, sizeof A);
    A.xh = xh;
    A.xl = xl;
    A.xsh = xsh;
    A.xsl = xsl;
    A.rs = rs;
    A.w = w[0].data;
    A.n = n;
    A.K = w[0].cols;
    A.nseg = nw;
    for (uint32_t i = 0; i < nw; i++) {
        A.M += w[i].rows;
        A.seg_end[i] = A.M;
        A.y[i] = y[i];
        A.ldy[i] = ldy[i];
    }
    A.op = op;
    A.scale = scale;
    A.cap = cap;
    A.nsplit = 1;
    A.part = part;
    return A;
}

/* the pieces K is split into for the call's kernel: Q4_K's exact variant (64 x rows a CTA) or
 * the three-product kernel (128) */
static uint32_t pf_kq_nsplit(uint32_t type, uint32_t M, uint32_t K)
{
    return type == MV_T_Q4_KT ? wg_nsplit(M, K, 512 / 64, 0.8) : wg_nsplit(M, K, 512 / 128, 2.1);
}

void pf_gemm_kq_n(cudaStream_t st, const __half *xh, const __half *xl, const __half *xsh, const __half *xsl,
                  const float *rs, uint32_t n, const mv_mat *w, uint32_t nw, float *const *y, const uint64_t *ldy,
                  uint32_t op, float scale, float cap, float *part)
{
    pf_kq_args A = wg_args(xh, xl, xsh, xsl, rs, n, w, nw, y, ldy, op, scale, cap, part);
    A.nsplit = part ? pf_kq_nsplit(w[0].type, A.M, A.K) : 1;
    if (w[0].type == MV_T_Q4_KT) { /* the exact variant */
        wgx_launch<4, 64>(st, A);
        return;
    }
    /* 128 x rows a CTA, 64 for calls of up to 64 rows (the same bytes: kbench_pfgemm) */
    if (n > 64) wg_launch<true, 128>(st, A);
    else wg_launch<true, 64>(st, A);
}

void pf_gemm_kq(cudaStream_t st, const __half *xh, const __half *xl, const __half *xsh, const __half *xsl,
                const float *rs, uint32_t n, const mv_mat *w, float *y, uint64_t ldy, uint32_t op, float scale, float cap,
                float *part)
{
    pf_gemm_kq_n(st, xh, xl, xsh, xsl, rs, n, w, 1, &y, &ldy, op, scale, cap, part);
}

/* ---- per-row operations ----------------------------------------------------------------------- */
static __global__ void __launch_bounds__(PF_ROW_T) pf_embed_kernel(const mv_mat emb, const int32_t *__restrict__ tokens,
                                                                   float *__restrict__ h, uint32_t E, bool entry_norm,
                                                                   float eps)
{
    __shared__ double red[PF_ROW_T / 32];
    float *row = h + (size_t)blockIdx.x * E;
    const uint32_t tok = (uint32_t)tokens[blockIdx.x];
    double ss = 0;
    for (uint32_t k = threadIdx.x; k < E; k += PF_ROW_T) {
        const float v = mv_elem(emb, tok, k);
        row[k] = v;
        ss += (double)v * v;
    }
    if (!entry_norm) return;
    ss = pf_block_sum(ss, red);
    const float inv = (float)(1.0 / sqrt(ss / (double)E + eps));
    for (uint32_t k = threadIdx.x; k < E; k += PF_ROW_T) row[k] = row[k] * inv;
}

void pf_embed(cudaStream_t st, const mv_mat *emb, const int32_t *tokens, uint32_t n, float *h, uint32_t E,
              bool entry_norm, float eps)
{
    pf_embed_kernel<<<n, PF_ROW_T, 0, st>>>(*emb, tokens, h, E, entry_norm, eps);
}

/* dst = src·inv(ss)·w over one row, ss the sum of squares (the CPU engine's rms_row) */
__device__ __forceinline__ void pf_norm_row(const float *src, const float *w, float eps, float *dst, uint32_t E, double *red)
{
    double ss = 0;
    for (uint32_t k = threadIdx.x; k < E; k += PF_ROW_T) ss += (double)src[k] * src[k];
    ss = pf_block_sum(ss, red);
    const float inv = (float)(1.0 / sqrt(ss / (double)E + eps));
    for (uint32_t k = threadIdx.x; k < E; k += PF_ROW_T) dst[k] = w ? src[k] * inv * w[k] : src[k] * inv;
}

static __global__ void __launch_bounds__(PF_ROW_T) pf_rmsnorm_kernel(const float *src, const float *w, float eps, float *dst,
                                                                     uint32_t E)
{
    __shared__ double red[PF_ROW_T / 32];
    pf_norm_row(src + (size_t)blockIdx.x * E, w, eps, dst + (size_t)blockIdx.x * E, E, red);
}

void pf_rmsnorm(cudaStream_t st, const float *src, const float *w, float eps, float *dst, uint32_t n, uint32_t E)
{
    pf_rmsnorm_kernel<<<n, PF_ROW_T, 0, st>>>(src, w, eps, dst, E);
}

static __global__ void __launch_bounds__(PF_ROW_T) pf_tail_kernel(const float *__restrict__ sub, float *__restrict__ h,
                                                                  const float *w_post, float eps_post, const float *w_next,
                                                                  float eps_next, float *__restrict__ dst, uint32_t E)
{
    __shared__ double red[PF_ROW_T / 32];
    const float *s = sub + (size_t)blockIdx.x * E;
    float *hr = h + (size_t)blockIdx.x * E;
    if (w_post) {
        double ss = 0;
        for (uint32_t k = threadIdx.x; k < E; k += PF_ROW_T) ss += (double)s[k] * s[k];
        ss = pf_block_sum(ss, red);
        const float inv = (float)(1.0 / sqrt(ss / (double)E + eps_post));
        for (uint32_t k = threadIdx.x; k < E; k += PF_ROW_T) hr[k] += s[k] * inv * w_post[k];
    } else {
        for (uint32_t k = threadIdx.x; k < E; k += PF_ROW_T) hr[k] += s[k];
    }
    __syncthreads(); /* each thread reads back only what it wrote, but keep the norm's reads ordered */
    pf_norm_row(hr, w_next, eps_next, dst + (size_t)blockIdx.x * E, E, red);
}

void pf_tail(cudaStream_t st, const float *sub, float *h, const float *w_post, float eps_post, const float *w_next,
             float eps_next, float *dst, uint32_t n, uint32_t E)
{
    pf_tail_kernel<<<n, PF_ROW_T, 0, st>>>(sub, h, w_post, eps_post, w_next, eps_next, dst, E);
}

/* A warp per head: norm over D in f64, RoPE at pos, then (k) the f16 stage. */
__device__ __forceinline__ void pf_head(float *x, const float *w, float eps, bool rope, bool neox, const double *inv_freq,
                                        uint64_t pos, uint32_t D, uint32_t lane)
{
    if (w) {
        double ss = 0;
        for (uint32_t d = lane; d < D; d += 32) ss += (double)x[d] * x[d];
#pragma unroll
        for (int o = 16; o; o >>= 1) ss += __shfl_xor_sync(0xFFFFFFFFu, ss, o);
        const float inv = (float)(1.0 / sqrt(ss / (double)D + eps));
        for (uint32_t d = lane; d < D; d += 32) x[d] = x[d] * inv * w[d];
        __syncwarp();
    }
    if (rope) {
        for (uint32_t i = lane; i < D / 2; i += 32) {
            const double a = (double)pos * inv_freq[i];
            const float c = (float)cos(a), s = (float)sin(a);
            const uint32_t i0 = neox ? i : 2 * i, i1 = neox ? i + D / 2 : 2 * i + 1;
            const float x0 = x[i0], x1 = x[i1];
            x[i0] = x0 * c - x1 * s;
            x[i1] = x0 * s + x1 * c;
        }
        __syncwarp();
    }
}

static __global__ void pf_stage_kernel(float *q, float *kbuf, const float *__restrict__ v, const float *q_norm,
                                       const float *k_norm, float eps, bool rope, bool neox,
                                       const double *__restrict__ inv_freq, uint64_t p0, uint32_t H, uint32_t HKV,
                                       uint32_t D, uint16_t *__restrict__ sk, uint16_t *__restrict__ sv)
{
    const uint32_t i = blockIdx.x, lane = threadIdx.x & 31, nw = blockDim.x / 32;
    const uint64_t pos = p0 + i;
    const size_t QD = (size_t)H * D, KD = (size_t)HKV * D;
    for (uint32_t hd = threadIdx.x / 32; hd < H + HKV; hd += nw) {
        const bool isq = hd < H;
        float *x = isq ? q + i * QD + (size_t)hd * D : kbuf + i * KD + (size_t)(hd - H) * D;
        pf_head(x, isq ? q_norm : k_norm, eps, rope, neox, inv_freq, pos, D, lane);
        if (!isq) {
            const uint32_t g = hd - H;
            for (uint32_t d = lane; d < D; d += 32) {
                sk[i * KD + (size_t)g * D + d] = __half_as_ushort(__float2half_rn(x[d]));
                sv[i * KD + (size_t)g * D + d] = __half_as_ushort(__float2half_rn(v[i * KD + (size_t)g * D + d]));
            }
        }
    }
}

void pf_stage(cudaStream_t st, float *q, const float *k, const float *v, const float *q_norm, const float *k_norm,
              float eps, bool rope, bool neox, const double *inv_freq, uint64_t p0, uint32_t n, uint32_t H,
              uint32_t HKV, uint32_t D, uint16_t *sk, uint16_t *sv)
{
    pf_stage_kernel<<<n, 256, 0, st>>>(q, (float *)k, v, q_norm, k_norm, eps, rope, neox, inv_freq, p0, H, HKV, D, sk, sv);
}

/* ---- attention ---------------------------------------------------------------------------------
 * A block per (row, KV head), a warp per query head of the group. Keys in tiles of 32 positions
 * from the row's first key: K and V rows into shared memory (a row of D + 2 halves, so lane j's
 * reads of row j fall in distinct banks), lane j scores key j against the warp's q (shared), an
 * online softmax over the warp, then each lane accumulates its D/32 dimensions. */
#define PF_KT 32
static __global__ void pf_attn_kernel(const float *__restrict__ q, const uint16_t *__restrict__ sk,
                                      const uint16_t *__restrict__ sv, const uint16_t *__restrict__ kp,
                                      const uint16_t *__restrict__ vp, cu_plane_meta meta, bool ring, uint64_t p0,
                                      uint32_t window, float scale, uint32_t H, uint32_t HKV, uint32_t D,
                                      float *__restrict__ out)
{
    extern __shared__ __align__(16) uint8_t pf_asm[];
    const uint32_t G = H / HKV, LD = D + 2;
    __half *Ks = (__half *)pf_asm, *Vs = Ks + PF_KT * LD;
    float *qs = (float *)(pf_asm + ((2 * PF_KT * LD * sizeof(__half) + 15) & ~(size_t)15));
    const uint32_t i = blockIdx.x, g = blockIdx.y, w = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const size_t QD = (size_t)H * D, KD = (size_t)HKV * D;
    const uint64_t pos = p0 + i;
    const uint64_t lo = window && pos + 1 > window ? pos + 1 - window : 0; /* a consistent cache holds it */
    for (uint32_t d = threadIdx.x; d < G * D; d += blockDim.x) qs[d] = q[i * QD + (size_t)g * G * D + d];
    float m = -INFINITY, l = 0.f, acc[4] = {0.f, 0.f, 0.f, 0.f}; /* dims lane + 32k, k < D/32 */
    const float *qh = qs + (size_t)w * D;
    for (uint64_t t0 = lo; t0 <= pos; t0 += PF_KT) {
        __syncthreads();
        /* K and V rows of positions t0 .. t0+31 (those <= pos) into shared memory, 8 halves a thread */
        const uint32_t chunks = PF_KT * (D / 8);
        for (uint32_t c = threadIdx.x; c < 2 * chunks; c += blockDim.x) {
            const bool isv = c >= chunks;
            const uint32_t cc = isv ? c - chunks : c, j = cc / (D / 8), d8 = (cc % (D / 8)) * 8;
            const uint64_t p = t0 + j;
            uint4 val = make_uint4(0, 0, 0, 0);
            if (p <= pos) {
                const uint16_t *src;
                if (p >= p0) {
                    src = (isv ? sv : sk) + (size_t)(p - p0) * KD + (size_t)g * D + d8;
                } else if (ring) {
                    const uint64_t phys = (meta.origin_physical + p - meta.origin_logical) % meta.capacity;
                    src = (isv ? vp : kp) + (size_t)phys * KD + (size_t)g * D + d8;
                } else {
                    src = (isv ? vp : kp) + ((size_t)g * meta.capacity + p) * D + d8;
                }
                val = *(const uint4 *)src;
            }
            __half *dst = (isv ? Vs : Ks) + (size_t)j * LD + d8;
            const uint32_t *vw = (const uint32_t *)&val;
#pragma unroll
            for (int u = 0; u < 4; u++) *(uint32_t *)(dst + 2 * u) = vw[u]; /* LD is even: 4-byte aligned */
        }
        __syncthreads();
        if (w >= G) continue;
        const uint64_t p = t0 + lane;
        float s = -INFINITY;
        if (p <= pos) {
            float a = 0.f;
            const __half2 *kr = (const __half2 *)(Ks + (size_t)lane * LD);
            for (uint32_t d = 0; d < D / 2; d++) {
                const float2 kf = __half22float2(kr[d]);
                a = fmaf(qh[2 * d], kf.x, a);
                a = fmaf(qh[2 * d + 1], kf.y, a);
            }
            s = a * scale;
        }
        float mt = s;
#pragma unroll
        for (int o = 16; o; o >>= 1) mt = fmaxf(mt, __shfl_xor_sync(0xFFFFFFFFu, mt, o));
        const float mn = fmaxf(m, mt);
        const float corr = expf(m - mn); /* m = -inf on the first tile: 0, and acc, l are 0 */
        const float pj = p <= pos ? expf(s - mn) : 0.f;
        float ps = pj;
#pragma unroll
        for (int o = 16; o; o >>= 1) ps += __shfl_xor_sync(0xFFFFFFFFu, ps, o);
        l = l * corr + ps;
#pragma unroll
        for (int k = 0; k < 4; k++) acc[k] *= corr;
        for (uint32_t j = 0; j < PF_KT; j++) {
            const float pb = __shfl_sync(0xFFFFFFFFu, pj, j);
#pragma unroll
            for (int k = 0; k < 4; k++)
                if (32 * k < (int)D) acc[k] = fmaf(pb, __half2float(Vs[(size_t)j * LD + lane + 32 * k]), acc[k]);
        }
        m = mn;
    }
    if (w >= G) return;
    float *o = out + i * QD + ((size_t)g * G + w) * D;
#pragma unroll
    for (int k = 0; k < 4; k++)
        if (32 * k < (int)D) o[lane + 32 * k] = acc[k] / l;
}

int pf_attention(cudaStream_t st, const float *q, const uint16_t *sk, const uint16_t *sv, const uint16_t *kp,
                 const uint16_t *vp, const cu_plane_meta *meta, bool ring, uint64_t p0, uint32_t n, uint32_t window,
                 float scale, uint32_t H, uint32_t HKV, uint32_t D, float *out)
{
    const uint32_t G = H / HKV;
    if (D % 32 || D > 128 || G > 32 || G == 0) return -1;
    const size_t smem = ((2 * PF_KT * (D + 2) * sizeof(__half) + 15) & ~(size_t)15) + (size_t)G * D * sizeof(float);
    const uint32_t threads = 32 * (G < 4 ? 4 : G); /* at least 128 threads for the tile loads */
    /* per device (each rank of a split binds its own): raised at every launch */
    cudaFuncSetAttribute(pf_attn_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, 64 * 1024);
    pf_attn_kernel<<<dim3(n, HKV), threads, smem, st>>>(q, sk, sv, kp, vp, *meta, ring, p0, window, scale, H, HKV, D, out);
    return 0;
}

/* ---- elementwise ------------------------------------------------------------------------------ */
static __global__ void pf_gate_kernel(float *o, const float *g, uint64_t n)
{
    const uint64_t i = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) o[i] *= 1.0f / (1.0f + expf(-g[i]));
}
void pf_gate(cudaStream_t st, float *o, const float *g, uint64_t n)
{
    pf_gate_kernel<<<(unsigned)((n + 255) / 256), 256, 0, st>>>(o, g, n);
}

static __global__ void pf_swiglu_kernel(float *g, const float *u, uint64_t n)
{
    const uint64_t i = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) g[i] = g[i] / (1.0f + expf(-g[i])) * u[i];
}
void pf_swiglu(cudaStream_t st, float *g, const float *u, uint64_t n)
{
    pf_swiglu_kernel<<<(unsigned)((n + 255) / 256), 256, 0, st>>>(g, u, n);
}

/* a thread per 8 halves of a staged row (K and V) */
static __global__ void pf_store_kernel(const uint16_t *__restrict__ sk, const uint16_t *__restrict__ sv,
                                       uint16_t *__restrict__ kp, uint16_t *__restrict__ vp, cu_plane_meta meta, bool ring,
                                       uint64_t p0, uint32_t n, uint32_t HKV, uint32_t D)
{
    const size_t KD = (size_t)HKV * D, per = KD / 8;
    const size_t c = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= (size_t)n * per) return;
    const uint32_t i = (uint32_t)(c / per), e = (uint32_t)(c % per) * 8;
    const uint64_t p = p0 + i;
    /* a ring keeps the last `capacity` positions; an older row of this pass is overwritten by a later one */
    if (ring && (uint64_t)n - i > meta.capacity) return;
    size_t dst;
    if (ring) {
        const uint64_t phys = (meta.origin_physical + p - meta.origin_logical) % meta.capacity;
        dst = (size_t)phys * KD + e;
    } else {
        const uint32_t g = e / D, d = e % D;
        dst = ((size_t)g * meta.capacity + p) * D + d;
    }
    *(uint4 *)(kp + dst) = *(const uint4 *)(sk + (size_t)i * KD + e);
    *(uint4 *)(vp + dst) = *(const uint4 *)(sv + (size_t)i * KD + e);
}

void pf_store(cudaStream_t st, const uint16_t *sk, const uint16_t *sv, uint16_t *kp, uint16_t *vp,
              const cu_plane_meta *meta, bool ring, uint64_t p0, uint32_t n, uint32_t HKV, uint32_t D)
{
    const size_t total = (size_t)n * HKV * D / 8;
    pf_store_kernel<<<(unsigned)((total + 255) / 256), 256, 0, st>>>(sk, sv, kp, vp, *meta, ring, p0, n, HKV, D);
}

static __global__ void pf_nonfinite_kernel(const float *y, uint64_t n, int32_t *count)
{
    uint32_t bad = 0;
    for (uint64_t i = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (uint64_t)gridDim.x * blockDim.x)
        bad += !isfinite(y[i]);
    bad = __reduce_add_sync(0xFFFFFFFFu, bad);
    if ((threadIdx.x & 31) == 0 && bad) atomicAdd(count, (int32_t)bad);
}

void pf_count_nonfinite(cudaStream_t st, const float *y, uint64_t n, int32_t *d_count)
{
    pf_nonfinite_kernel<<<264, 256, 0, st>>>(y, n, d_count);
}
