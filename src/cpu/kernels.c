/* kernels.c — the CPU engine's hot loops (see kernels.h for the shapes), AVX2 and scalar.
 *
 * Block layouts are the public ggml ones (quant.h):
 *   Q4_K [144]: f16 d, f16 dmin, 12 bytes packed 6-bit (scale, min) x 8, 128 bytes of nibbles.
 *               Byte i of the j-th 32-byte group holds element 64j+i (low nibble) and 64j+32+i
 *               (high nibble); element value d*sc*q - dmin*m of its 32-element sub-block.
 *   Q6_K [210]: ql[128], qh[64], int8 scales[16], f16 d. In each 128-element half n, for
 *               l < 32: elements l, l+32, l+64, l+96 take ql[l] & 15, ql[l+32] & 15, ql[l] >> 4,
 *               ql[l+32] >> 4 as low bits and qh[l] bits (0,1), (2,3), (4,5), (6,7) as high bits;
 *               value d*sc*(q-32), one scale per 16 elements.
 *   Q8_0 [34]:  f16 d, int8 q[32].
 *
 * The AVX2 Q4_K / Q6_K decode dots read each 32-byte group of quants with one load and mask
 * byte t of every dword lane in place, giving q * 2^8t exactly; x comes in through xp, a copy in
 * lane order scaled by 2^-8t (kernels.h), so every product equals q * x. Sub-block scales are
 * applied once per 32 (or 16) elements; constant terms use the precomputed sums of x. */
#include "cpu/kernels.h"

#include "quant.h"
#include "util.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#if defined(__x86_64__) || defined(__i386__)
#define CPU_HAVE_X86 1
#include <immintrin.h>
#endif

/* ---- shared helpers ---- */

static inline float load_f16(const uint8_t *p)
{
    uint16_t h;
    memcpy(&h, p, 2);
    return muser_f16_to_f32(h);
}

/* ---- scalar versions ---- */

static void xsums_scalar(const float *x, uint64_t n, cpu_xsums *out)
{
    for (uint64_t g = 0; g < n / 16; g++) {
        float s = 0.0f;
        for (int i = 0; i < 16; i++)
            s += x[g * 16 + i];
        out->s16[g] = s;
    }
    for (uint64_t g = 0; g < n / 32; g++)
        out->s32[g] = out->s16[2 * g] + out->s16[2 * g + 1];
    for (uint64_t c = 0; c + 32 <= n; c += 32)
        for (int t = 0; t < 4; t++)
            for (int i = 0; i < 8; i++)
                out->xp[c + 8 * t + i] = ldexpf(x[c + 4 * i + t], -8 * t);
}

static float dot_row_scalar(uint32_t type, const void *row, const float *x, const cpu_xsums *xs,
                            uint64_t n)
{
    (void)xs;
    return quant_dot(type, row, x, n);
}

static void dot_rows_scalar(uint32_t type, const void *row, const float *x, uint64_t ldx, const cpu_xsums *xs,
                            uint32_t m, uint64_t n, float *out, uint64_t ldo)
{
    for (uint32_t i = 0; i < m; i++)
        out[i * ldo] = dot_row_scalar(type, row, x + i * ldx, xs + i, n);
}

/* src rows r < CPU_PANEL, lds floats apart, K elements -> panel [K][CPU_PANEL]. */
static void transpose_scalar(const float *src, uint64_t lds, float *panel, uint64_t K)
{
    for (uint64_t k = 0; k < K; k++)
        for (int r = 0; r < CPU_PANEL; r++)
            panel[k * CPU_PANEL + r] = src[(uint64_t)r * lds + k];
}

/* Whole rows into tmp [CPU_PANEL][K] (rows nc.. zero), then one transpose. */
static int unpack_rows(int (*dequant)(uint32_t, const void *, float *, uint64_t),
                       void (*transpose)(const float *, uint64_t, float *, uint64_t),
                       uint32_t type, const uint8_t *row0, uint64_t row_bytes, uint32_t nc,
                       uint64_t K, float *tmp, float *panel)
{
    for (uint32_t r = 0; r < CPU_PANEL; r++) {
        float *dst = tmp + (uint64_t)r * K;
        if (r >= nc) {
            memset(dst, 0, K * sizeof(float));
            continue;
        }
        const int rc = dequant(type, row0 + r * row_bytes, dst, K);
        if (rc)
            return rc;
    }
    transpose(tmp, K, panel, K);
    return MUSER_OK;
}

static int unpack_panel_scalar(uint32_t type, const uint8_t *row0, uint64_t row_bytes, uint32_t nc,
                               uint64_t K, float *tmp, float *panel)
{
    return unpack_rows(quant_dequantize_row, transpose_scalar, type, row0, row_bytes, nc, K, tmp,
                       panel);
}

/* Rows in the GEMM group that starts at row i of m: CPU_MR while whole groups last. A tail of 1
 * or 2 rows would have only 2 or 4 independent FMA chains (latency-bound at a quarter or half of
 * peak): it is taken with the last full group as 4 + 3 or 4 + 4 rows instead. Every output is
 * one sequential sum over K whatever its group, so the grouping changes no bits. */
static uint64_t gemm_group_mr(uint64_t m, uint64_t i, uint64_t mr)
{
    uint64_t full = m;
    if (m > mr && m % mr != 0 && m % mr <= 2)
        full = m - mr - m % mr;
    if (i + mr <= full)
        return mr;
    return m - i > mr ? 4 : m - i;
}
static uint64_t gemm_group(uint64_t m, uint64_t i) { return gemm_group_mr(m, i, CPU_MR); }

static void pack_x_mr(const float *X, uint64_t ldx, uint64_t m, uint64_t K, float *Xp, uint64_t mr)
{
    for (uint64_t i = 0, r; i < m; i += r) {
        r = gemm_group_mr(m, i, mr);
        float *dst = Xp + i * K;
        for (uint64_t k = 0; k < K; k++)
            for (uint64_t ii = 0; ii < r; ii++)
                dst[k * r + ii] = X[(i + ii) * ldx + k];
    }
}
static void pack_x(const float *X, uint64_t ldx, uint64_t m, uint64_t K, float *Xp) { pack_x_mr(X, ldx, m, K, Xp, CPU_MR); }

static void gemm_panel_scalar(const float *Xp, uint64_t m, const float *panel, uint64_t K,
                              float *C, uint64_t ldc, uint32_t nc)
{
    for (uint64_t i0 = 0, r; i0 < m; i0 += r) {
        r = gemm_group(m, i0);
        for (uint64_t ii = 0; ii < r; ii++) {
            float acc[CPU_PANEL] = {0};
            const float *x = Xp + i0 * K + ii;
            for (uint64_t k = 0; k < K; k++)
                for (int c = 0; c < CPU_PANEL; c++)
                    acc[c] += x[k * r] * panel[k * CPU_PANEL + c];
            memcpy(C + (i0 + ii) * ldc, acc, nc * sizeof(float));
        }
    }
}

static float dot_f16_scalar(const float *q, const uint16_t *k, uint32_t n)
{
    float s = 0.0f;
    for (uint32_t i = 0; i < n; i++)
        s += q[i] * muser_f16_to_f32(k[i]);
    return s;
}

static void axpy_f16_scalar(float *o, float p, const uint16_t *v, uint32_t n)
{
    for (uint32_t i = 0; i < n; i++)
        o[i] += p * muser_f16_to_f32(v[i]);
}

static void f16_to_f32_scalar(const uint16_t *src, float *dst, uint32_t n)
{
    for (uint32_t i = 0; i < n; i++)
        dst[i] = muser_f16_to_f32(src[i]);
}

static void f32_to_f16_scalar(const float *src, uint16_t *dst, uint32_t n)
{
    for (uint32_t i = 0; i < n; i++)
        dst[i] = muser_f32_to_f16(src[i]);
}

static float exp_sum_scalar(float *x, uint64_t n)
{
    float s = 0.0f;
    for (uint64_t i = 0; i < n; i++) {
        x[i] = expf(x[i]);
        s += x[i];
    }
    return s;
}

static void swiglu_scalar(float *g, const float *u, uint64_t n)
{
    for (uint64_t i = 0; i < n; i++)
        g[i] = g[i] / (1.0f + expf(-g[i])) * u[i];
}

static void sigmoid_gate_scalar(float *o, const float *g, uint64_t n)
{
    for (uint64_t i = 0; i < n; i++)
        o[i] *= 1.0f / (1.0f + expf(-g[i]));
}

static bool logit_finish_scalar(float *y, uint64_t n, float scale, float cap)
{
    bool ok = true;
    for (uint64_t i = 0; i < n; i++) {
        float z = y[i] * scale;
        if (cap > 0.0f)
            z = cap * tanhf(z / cap);
        y[i] = z;
        ok &= isfinite(z) != 0;
    }
    return ok;
}

/* ---- AVX2 / FMA / F16C versions ---- */
#ifdef CPU_HAVE_X86
#define TGT __attribute__((target("avx2,fma,f16c")))
#define TGT_INLINE __attribute__((target("avx2,fma,f16c"), always_inline)) inline

static TGT_INLINE float hsum256(__m256 v)
{
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* Decode dots prefetch the weight bytes this far ahead of the block they are on. A thread's rows
 * are contiguous, so this runs into the next row; the hardware prefetcher alone left one core at
 * ~5 GB/s of a ~12 GB/s stream (measured: +16-30% decode with one thread, +18% with two).
 * Prefetching past the end of the tensor cannot fault. */
#define CPU_PREFETCH 1536
/* lines 64-byte cache lines from CPU_PREFETCH bytes past blk (a thread's rows are contiguous) */
static TGT_INLINE void prefetch_ahead(const uint8_t *blk, int lines)
{
    for (int l = 0; l < lines; l++)
        _mm_prefetch((const char *)blk + CPU_PREFETCH + 64 * l, _MM_HINT_T0);
}

/* An f16 scale from a block header, through F16C (no call per block). */
static TGT_INLINE float f16_at(const uint8_t *p)
{
    uint16_t h;
    memcpy(&h, p, 2);
    return _cvtsh_ss(h);
}

/* 8 bytes -> 8 zero-extended dword lanes. */
static TGT_INLINE __m256i load8_u8(const uint8_t *p)
{
    return _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(const void *)p));
}

/* exp of 8 lanes: x = n*ln2 + r, |r| <= ln2/2, degree-7 Taylor polynomial (rel. error ~1e-7),
 * times 2^n built in the exponent field. Inputs are clamped to [-87.3, 88.7]; a NaN stays NaN
 * (max/min return their second operand when unordered, so x goes second), so a NaN gate or
 * attention score poisons the logits and fails closed like the oracle instead of passing as ~1. */
static TGT_INLINE __m256 exp256(__m256 x)
{
    x = _mm256_min_ps(_mm256_set1_ps(88.7f), _mm256_max_ps(_mm256_set1_ps(-87.3f), x));
    const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                     _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
    __m256 p = _mm256_set1_ps(1.0f / 5040.0f);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 720.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 120.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 24.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 6.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(0.5f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
    const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n),
                                                         _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(p, _mm256_castsi256_ps(e));
}

/* x's 16- and 32-sums (every level's K-quant dots read them) */
static TGT void xsums_sums_avx2(const float *x, uint64_t n, cpu_xsums *out)
{
    for (uint64_t g = 0; g < n / 16; g++) {
        const __m256 s = _mm256_add_ps(_mm256_loadu_ps(x + g * 16), _mm256_loadu_ps(x + g * 16 + 8));
        out->s16[g] = hsum256(s);
    }
    for (uint64_t g = 0; g < n / 32; g++)
        out->s32[g] = out->s16[2 * g] + out->s16[2 * g + 1];
}

static TGT void xsums_avx2(const float *x, uint64_t n, cpu_xsums *out)
{
    xsums_sums_avx2(x, n, out);
    /* xp: per 32-chunk a 4x4 transpose in each 128-bit half puts x[4i+t] of halves into
     * r_t = {i = 0,2,4,6 | 1,3,5,7}; one lane permute restores i order; times 2^-8t. */
    const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    const __m256 p0 = _mm256_set1_ps(1.0f), p1 = _mm256_set1_ps(0x1p-8f),
                 p2 = _mm256_set1_ps(0x1p-16f), p3 = _mm256_set1_ps(0x1p-24f);
    for (uint64_t c = 0; c + 32 <= n; c += 32) {
        const __m256 v0 = _mm256_loadu_ps(x + c), v1 = _mm256_loadu_ps(x + c + 8),
                     v2 = _mm256_loadu_ps(x + c + 16), v3 = _mm256_loadu_ps(x + c + 24);
        const __m256 a = _mm256_unpacklo_ps(v0, v1), b = _mm256_unpackhi_ps(v0, v1);
        const __m256 e = _mm256_unpacklo_ps(v2, v3), f = _mm256_unpackhi_ps(v2, v3);
        const __m256 r0 = _mm256_shuffle_ps(a, e, 0x44), r1 = _mm256_shuffle_ps(a, e, 0xEE);
        const __m256 r2 = _mm256_shuffle_ps(b, f, 0x44), r3 = _mm256_shuffle_ps(b, f, 0xEE);
        _mm256_storeu_ps(out->xp + c, _mm256_mul_ps(_mm256_permutevar8x32_ps(r0, order), p0));
        _mm256_storeu_ps(out->xp + c + 8, _mm256_mul_ps(_mm256_permutevar8x32_ps(r1, order), p1));
        _mm256_storeu_ps(out->xp + c + 16, _mm256_mul_ps(_mm256_permutevar8x32_ps(r2, order), p2));
        _mm256_storeu_ps(out->xp + c + 24, _mm256_mul_ps(_mm256_permutevar8x32_ps(r3, order), p3));
    }
}

/* A Q4_K block's 8 scales and 8 mins as f32 lanes, times d and dmin. The 16 header bytes (d,
 * dmin, 12 packed bytes p[0..11] at offset 4) are loaded into both 128-bit halves (a plain
 * load, no shuffle), and one in-lane byte shuffle per vector builds, in dword lane j,
 *   scales: p[j]            (j < 4)   | p[j+4] | p[j-4] << 8  (j >= 4: low 4 bits, top 2 bits)
 *   mins:   p[j+4]          (j < 4)   | p[j+4] | p[j]   << 8  (j >= 4: high 4 bits, top 2 bits)
 * so each value is (lane >> s) & (63 or 15) | (lane >> 10) & 0x30. The previous version did
 * this on general-purpose registers and moved the result over; measured per Q4_K dot in L2,
 * that decode cost ~20% of the block and this one ~5%. Same integers, same products. */
static TGT_INLINE void q4k_scales_vec(const uint8_t *blk, __m256 *dsc, __m256 *dmn)
{
    const __m256i v =
        _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)(const void *)blk));
    const __m256i S = _mm256_shuffle_epi8(v, _mm256_setr_epi8(4, -1, -1, -1, 5, -1, -1, -1,
                                                              6, -1, -1, -1, 7, -1, -1, -1,
                                                              12, 4, -1, -1, 13, 5, -1, -1,
                                                              14, 6, -1, -1, 15, 7, -1, -1));
    const __m256i M = _mm256_shuffle_epi8(v, _mm256_setr_epi8(8, -1, -1, -1, 9, -1, -1, -1,
                                                              10, -1, -1, -1, 11, -1, -1, -1,
                                                              12, 8, -1, -1, 13, 9, -1, -1,
                                                              14, 10, -1, -1, 15, 11, -1, -1));
    const __m256i low = _mm256_setr_epi32(63, 63, 63, 63, 15, 15, 15, 15);
    const __m256i top = _mm256_set1_epi32(0x30);
    const __m256i sc = _mm256_or_si256(_mm256_and_si256(S, low),
                                       _mm256_and_si256(_mm256_srli_epi32(S, 10), top));
    const __m256i mn = _mm256_or_si256(
        _mm256_and_si256(_mm256_srlv_epi32(M, _mm256_setr_epi32(0, 0, 0, 0, 4, 4, 4, 4)), low),
        _mm256_and_si256(_mm256_srli_epi32(M, 10), top));
    *dsc = _mm256_mul_ps(_mm256_cvtepi32_ps(sc), _mm256_set1_ps(f16_at(blk)));
    *dmn = _mm256_mul_ps(_mm256_cvtepi32_ps(mn), _mm256_set1_ps(f16_at(blk + 2)));
}

/* The four 6-bit quants of Q6_K lanes l..l+7 of one 128-element half (see the header). */
#define Q6K_UNPACK(QL, QH, l, q1, q2, q3, q4)                                                  \
    do {                                                                                       \
        const __m256i A_ = load8_u8((QL) + (l)), B_ = load8_u8((QL) + 32 + (l));               \
        const __m256i H_ = load8_u8((QH) + (l));                                               \
        q1 = _mm256_or_si256(_mm256_and_si256(A_, m4),                                         \
                             _mm256_slli_epi32(_mm256_and_si256(H_, m3), 4));                  \
        q2 = _mm256_or_si256(_mm256_and_si256(B_, m4),                                         \
                             _mm256_and_si256(_mm256_slli_epi32(H_, 2), m30));                 \
        q3 = _mm256_or_si256(_mm256_srli_epi32(A_, 4), _mm256_and_si256(H_, m30));             \
        q4 = _mm256_or_si256(_mm256_srli_epi32(B_, 4),                                         \
                             _mm256_and_si256(_mm256_srli_epi32(H_, 2), m30));                 \
    } while (0)

/* Block b of a Q6_K row: prefetch ahead, its 16 scales times d as two vectors of 8 (ds), and each
 * input's −32 term (offs[r] += ds · the input's 16-sums). */
static TGT_INLINE void q6k_block_head(const uint8_t *blk, uint64_t b, const cpu_xsums *xs, const int R, __m256 ds[2],
                                      __m256 *offs)
{
    prefetch_ahead(blk, 4); /* a Q6_K block: 210 bytes */
    const __m256 d = _mm256_set1_ps(f16_at(blk + 208));
    const __m128i sc8 = _mm_loadu_si128((const __m128i *)(const void *)(blk + 192));
    ds[0] = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(sc8)), d);
    ds[1] = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(sc8, 8))), d);
#pragma GCC unroll 4
    for (int r = 0; r < R; r++) {
        offs[r] = _mm256_fmadd_ps(ds[0], _mm256_loadu_ps(xs[r].s16 + b * 16), offs[r]);
        offs[r] = _mm256_fmadd_ps(ds[1], _mm256_loadu_ps(xs[r].s16 + b * 16 + 8), offs[r]);
    }
}

/* The four quarters' 6-bit quants of half n of a Q6_K block, every byte of a lane at once:
 * ql[0..32), ql[32..64) and qh[0..32) of the half are one load each (A, B, H). */
static TGT_INLINE void q6k_quarters(const uint8_t *blk, int n, __m256i q[4])
{
    const __m256i m4 = _mm256_set1_epi32(0x0F0F0F0F), m30 = _mm256_set1_epi32(0x30303030);
    const uint8_t *QL = blk + 64 * n, *QH = blk + 128 + 32 * n;
    const __m256i A = _mm256_loadu_si256((const __m256i *)(const void *)QL);
    const __m256i B = _mm256_loadu_si256((const __m256i *)(const void *)(QL + 32));
    const __m256i H = _mm256_loadu_si256((const __m256i *)(const void *)QH);
    q[0] = _mm256_or_si256(_mm256_and_si256(A, m4), _mm256_and_si256(_mm256_slli_epi32(H, 4), m30));
    q[1] = _mm256_or_si256(_mm256_and_si256(B, m4), _mm256_and_si256(_mm256_slli_epi32(H, 2), m30));
    q[2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi32(A, 4), m4), _mm256_and_si256(H, m30));
    q[3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi32(B, 4), m4), _mm256_and_si256(_mm256_srli_epi32(H, 2), m30));
}

/* ---- one weight row against several inputs (the small-batch route) ----
 * dot_q4k_avx2 / dot_q6k_avx2 with the weight unpacking done once for R inputs: each input's
 * products, accumulators and final sums are the single dot's, in its order (no reassociation: the
 * engine builds with -std=c11, so nothing is contracted), so out[i] is bit for bit what dot_row
 * gives for x_i alone, whatever R and whichever inputs share the call. */
/* Q4_K against xp. Each 32-byte group is one load; lane i holds bytes 4i..4i+3, i.e. the low
 * nibbles of elements 4i+t (t = 0..3, sub-block 2j) and, after one 4-bit shift, the high
 * nibbles (sub-block 2j+1). Masking nibble t in place gives q·2^8t as an exact integer; the
 * 2^-8t folded into xp cancels it exactly in the product, so each product equals q·x. */
static TGT_INLINE void dot_q4k_multi(const uint8_t *row, const cpu_xsums *xs, const int R, uint64_t nb, float *out,
                                     uint64_t ldo)
{
    const __m256i m0 = _mm256_set1_epi32(0xF), m1 = _mm256_set1_epi32(0xF00),
                  m2 = _mm256_set1_epi32(0xF0000), m3 = _mm256_set1_epi32(0xF000000);
    __m256 acc0[4], acc1[4], mins[4];
#pragma GCC unroll 4
    for (int r = 0; r < R; r++)
        acc0[r] = acc1[r] = mins[r] = _mm256_setzero_ps();
    float dsc_s[8] __attribute__((aligned(32)));
    for (uint64_t b = 0; b < nb; b++) {
        const uint8_t *blk = row + b * Q4_K_BLOCK_BYTES;
        prefetch_ahead(blk, 3); /* a Q4_K block: 144 bytes */
        __m256 dsc, dmn;
        q4k_scales_vec(blk, &dsc, &dmn);
#pragma GCC unroll 4
        for (int r = 0; r < R; r++)
            mins[r] = _mm256_fmadd_ps(dmn, _mm256_loadu_ps(xs[r].s32 + b * 8), mins[r]);
        _mm256_store_ps(dsc_s, dsc);
        const uint8_t *qs = blk + 16;
#pragma GCC unroll 4
        for (int j = 0; j < 4; j++) {
            const __m256i v = _mm256_loadu_si256((const __m256i *)(const void *)(qs + 32 * j));
            const __m256i h = _mm256_srli_epi32(v, 4);
            const __m256 wl0 = _mm256_cvtepi32_ps(_mm256_and_si256(v, m0)), wh0 = _mm256_cvtepi32_ps(_mm256_and_si256(h, m0));
            const __m256 wl1 = _mm256_cvtepi32_ps(_mm256_and_si256(v, m1)), wh1 = _mm256_cvtepi32_ps(_mm256_and_si256(h, m1));
            const __m256 wl2 = _mm256_cvtepi32_ps(_mm256_and_si256(v, m2)), wh2 = _mm256_cvtepi32_ps(_mm256_and_si256(h, m2));
            const __m256 wl3 = _mm256_cvtepi32_ps(_mm256_and_si256(v, m3)), wh3 = _mm256_cvtepi32_ps(_mm256_and_si256(h, m3));
            const __m256 d0 = _mm256_broadcast_ss(dsc_s + 2 * j), d1 = _mm256_broadcast_ss(dsc_s + 2 * j + 1);
#pragma GCC unroll 4
            for (int r = 0; r < R; r++) {
                const float *xl = xs[r].xp + b * QK_K + 64 * j, *xh = xl + 32;
                __m256 lo = _mm256_mul_ps(wl0, _mm256_loadu_ps(xl));
                __m256 hi = _mm256_mul_ps(wh0, _mm256_loadu_ps(xh));
                lo = _mm256_fmadd_ps(wl1, _mm256_loadu_ps(xl + 8), lo);
                hi = _mm256_fmadd_ps(wh1, _mm256_loadu_ps(xh + 8), hi);
                lo = _mm256_fmadd_ps(wl2, _mm256_loadu_ps(xl + 16), lo);
                hi = _mm256_fmadd_ps(wh2, _mm256_loadu_ps(xh + 16), hi);
                lo = _mm256_fmadd_ps(wl3, _mm256_loadu_ps(xl + 24), lo);
                hi = _mm256_fmadd_ps(wh3, _mm256_loadu_ps(xh + 24), hi);
                acc0[r] = _mm256_fmadd_ps(lo, d0, acc0[r]);
                acc1[r] = _mm256_fmadd_ps(hi, d1, acc1[r]);
            }
        }
    }
#pragma GCC unroll 4
    for (int r = 0; r < R; r++)
        out[r * ldo] = hsum256(_mm256_add_ps(acc0[r], acc1[r])) - hsum256(mins[r]);
}

/* Q6_K against xp. Per 128-element half, ql[0..32), ql[32..64) and qh[0..32) are one load each
 * (A, B, H); lane i holds l = 4i..4i+3. The four quarters' 6-bit quants are assembled for all
 * four bytes of a lane at once (see the header for which bits), then byte t is masked in place:
 * q·2^8t, cancelled exactly by xp's 2^-8t. Scales are per 16 elements = lanes 0-3 / 4-7, so a
 * quarter's scale vector is two scales spread by one lane permute. */
static TGT_INLINE void dot_q6k_multi(const uint8_t *row, const cpu_xsums *xs, const int R, uint64_t nb, float *out,
                                     uint64_t ldo)
{
    const __m256i k0 = _mm256_set1_epi32(0x3F), k1 = _mm256_set1_epi32(0x3F00),
                  k2 = _mm256_set1_epi32(0x3F0000), k3 = _mm256_set1_epi32(0x3F000000);
    const __m256i sel[4] = {_mm256_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1),
                            _mm256_setr_epi32(2, 2, 2, 2, 3, 3, 3, 3),
                            _mm256_setr_epi32(4, 4, 4, 4, 5, 5, 5, 5),
                            _mm256_setr_epi32(6, 6, 6, 6, 7, 7, 7, 7)};
    __m256 acc[4][4], offs[4];
#pragma GCC unroll 4
    for (int r = 0; r < R; r++) {
        acc[r][0] = acc[r][1] = acc[r][2] = acc[r][3] = _mm256_setzero_ps();
        offs[r] = _mm256_setzero_ps();
    }
    for (uint64_t b = 0; b < nb; b++) {
        const uint8_t *blk = row + b * Q6_K_BLOCK_BYTES;
        __m256 ds[2];
        q6k_block_head(blk, b, xs, R, ds, offs);
#pragma GCC unroll 2
        for (int n = 0; n < 2; n++) {
            __m256i q[4];
            q6k_quarters(blk, n, q);
#pragma GCC unroll 4
            for (int t = 0; t < 4; t++) {
                const __m256 w0 = _mm256_cvtepi32_ps(_mm256_and_si256(q[t], k0)), w1 = _mm256_cvtepi32_ps(_mm256_and_si256(q[t], k1));
                const __m256 w2 = _mm256_cvtepi32_ps(_mm256_and_si256(q[t], k2)), w3 = _mm256_cvtepi32_ps(_mm256_and_si256(q[t], k3));
                const __m256 sc = _mm256_permutevar8x32_ps(ds[n], sel[t]);
#pragma GCC unroll 4
                for (int r = 0; r < R; r++) {
                    const float *yt = xs[r].xp + b * QK_K + 128 * n + 32 * t;
                    __m256 a = _mm256_mul_ps(w0, _mm256_loadu_ps(yt));
                    __m256 c = _mm256_mul_ps(w1, _mm256_loadu_ps(yt + 8));
                    a = _mm256_fmadd_ps(w2, _mm256_loadu_ps(yt + 16), a);
                    c = _mm256_fmadd_ps(w3, _mm256_loadu_ps(yt + 24), c);
                    acc[r][t] = _mm256_fmadd_ps(_mm256_add_ps(a, c), sc, acc[r][t]);
                }
            }
        }
    }
#pragma GCC unroll 4
    for (int r = 0; r < R; r++)
        out[r * ldo] = hsum256(_mm256_add_ps(_mm256_add_ps(acc[r][0], acc[r][1]), _mm256_add_ps(acc[r][2], acc[r][3]))) -
                       32.0f * hsum256(offs[r]);
}

/* The R-input instances the route calls (4 inputs share one pass over the weight row; more
 * inputs take several passes over it, from L1). */
#define CPU_DOT_GROUP 4
static TGT void dot_q4k_m1(const uint8_t *w, const cpu_xsums *xs, uint64_t nb, float *o, uint64_t ldo) { dot_q4k_multi(w, xs, 1, nb, o, ldo); }
static TGT void dot_q4k_m2(const uint8_t *w, const cpu_xsums *xs, uint64_t nb, float *o, uint64_t ldo) { dot_q4k_multi(w, xs, 2, nb, o, ldo); }
static TGT void dot_q4k_m3(const uint8_t *w, const cpu_xsums *xs, uint64_t nb, float *o, uint64_t ldo) { dot_q4k_multi(w, xs, 3, nb, o, ldo); }
static TGT void dot_q4k_m4(const uint8_t *w, const cpu_xsums *xs, uint64_t nb, float *o, uint64_t ldo) { dot_q4k_multi(w, xs, 4, nb, o, ldo); }
static TGT void dot_q6k_m1(const uint8_t *w, const cpu_xsums *xs, uint64_t nb, float *o, uint64_t ldo) { dot_q6k_multi(w, xs, 1, nb, o, ldo); }
static TGT void dot_q6k_m2(const uint8_t *w, const cpu_xsums *xs, uint64_t nb, float *o, uint64_t ldo) { dot_q6k_multi(w, xs, 2, nb, o, ldo); }
static TGT void dot_q6k_m3(const uint8_t *w, const cpu_xsums *xs, uint64_t nb, float *o, uint64_t ldo) { dot_q6k_multi(w, xs, 3, nb, o, ldo); }
static TGT void dot_q6k_m4(const uint8_t *w, const cpu_xsums *xs, uint64_t nb, float *o, uint64_t ldo) { dot_q6k_multi(w, xs, 4, nb, o, ldo); }
typedef void (*dot_multi_fn)(const uint8_t *, const cpu_xsums *, uint64_t, float *, uint64_t);
static const dot_multi_fn dot_q4k_m[CPU_DOT_GROUP] = {dot_q4k_m1, dot_q4k_m2, dot_q4k_m3, dot_q4k_m4};
static const dot_multi_fn dot_q6k_m[CPU_DOT_GROUP] = {dot_q6k_m1, dot_q6k_m2, dot_q6k_m3, dot_q6k_m4};

static TGT float dot_q8_0_avx2(const uint8_t *row, const float *x, uint64_t nb)
{
    __m256 acc = _mm256_setzero_ps();
    for (uint64_t b = 0; b < nb; b++) {
        const uint8_t *blk = row + b * Q8_0_BLOCK_BYTES;
        const float *xb = x + b * QK8_0;
        __m256 a = _mm256_setzero_ps();
#pragma GCC unroll 4
        for (int g = 0; g < 4; g++) {
            const __m256i q = _mm256_cvtepi8_epi32(
                _mm_loadl_epi64((const __m128i *)(const void *)(blk + 2 + 8 * g)));
            a = _mm256_fmadd_ps(_mm256_cvtepi32_ps(q), _mm256_loadu_ps(xb + 8 * g), a);
        }
        acc = _mm256_fmadd_ps(a, _mm256_set1_ps(f16_at(blk)), acc);
    }
    return hsum256(acc);
}

static TGT float dot_f32_avx2(const float *w, const float *x, uint64_t n)
{
    __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
    uint64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        a0 = _mm256_fmadd_ps(_mm256_loadu_ps(w + i), _mm256_loadu_ps(x + i), a0);
        a1 = _mm256_fmadd_ps(_mm256_loadu_ps(w + i + 8), _mm256_loadu_ps(x + i + 8), a1);
    }
    float s = hsum256(_mm256_add_ps(a0, a1));
    for (; i < n; i++)
        s += w[i] * x[i];
    return s;
}

static TGT float dot_f16_avx2(const float *q, const uint16_t *k, uint32_t n)
{
    __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
    uint32_t i = 0;
    for (; i + 16 <= n; i += 16) {
        a0 = _mm256_fmadd_ps(_mm256_loadu_ps(q + i),
                             _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(k + i))), a0);
        a1 = _mm256_fmadd_ps(_mm256_loadu_ps(q + i + 8),
                             _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(k + i + 8))), a1);
    }
    for (; i + 8 <= n; i += 8)
        a0 = _mm256_fmadd_ps(_mm256_loadu_ps(q + i),
                             _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(k + i))), a0);
    float s = hsum256(_mm256_add_ps(a0, a1));
    for (; i < n; i++)
        s += q[i] * muser_f16_to_f32(k[i]);
    return s;
}

static TGT float dot_bf16_avx2(const uint16_t *w, const float *x, uint64_t n)
{
    __m256 a = _mm256_setzero_ps();
    uint64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m256i u = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(w + i)));
        a = _mm256_fmadd_ps(_mm256_castsi256_ps(_mm256_slli_epi32(u, 16)), _mm256_loadu_ps(x + i),
                            a);
    }
    float s = hsum256(a);
    for (; i < n; i++)
        s += muser_bf16_to_f32(w[i]) * x[i];
    return s;
}

static TGT float dot_row_avx2(uint32_t type, const void *row, const float *x, const cpu_xsums *xs,
                              uint64_t n)
{
    switch (type) {
    case GGML_TYPE_Q4_K:
    case GGML_TYPE_Q6_K: {
        float o;
        (type == GGML_TYPE_Q4_K ? dot_q4k_m1 : dot_q6k_m1)(row, xs, n / QK_K, &o, 1);
        return o;
    }
    case GGML_TYPE_Q8_0: return dot_q8_0_avx2(row, x, n / QK8_0);
    case GGML_TYPE_F32: return dot_f32_avx2(row, x, n);
    case GGML_TYPE_F16: return dot_f16_avx2(x, row, (uint32_t)n);
    case GGML_TYPE_BF16: return dot_bf16_avx2(row, x, n);
    default: return quant_dot(type, row, x, n);
    }
}

static TGT void dot_rows_avx2(uint32_t type, const void *row, const float *x, uint64_t ldx, const cpu_xsums *xs,
                              uint32_t m, uint64_t n, float *out, uint64_t ldo)
{
    const dot_multi_fn *f = type == GGML_TYPE_Q4_K ? dot_q4k_m : type == GGML_TYPE_Q6_K ? dot_q6k_m : NULL;
    for (uint32_t i = 0; i < m;) {
        const uint32_t g = m - i < CPU_DOT_GROUP ? m - i : CPU_DOT_GROUP;
        if (f) {
            f[g - 1](row, xs + i, n / QK_K, out + i * ldo, ldo);
            i += g;
        } else { /* the other formats: dot_row per input (the weight row stays in L1) */
            out[i * ldo] = dot_row_avx2(type, row, x + i * ldx, xs + i, n);
            i++;
        }
    }
}

static TGT void dequant_q4k_avx2(const uint8_t *row, float *dst, uint64_t nb)
{
    const __m256i m4 = _mm256_set1_epi32(0xF);
    for (uint64_t b = 0; b < nb; b++) {
        const uint8_t *blk = row + b * Q4_K_BLOCK_BYTES;
        /* d*sc and dmin*m as f32 products, the same values the scalar d * sc[j] gives */
        float ds[8], dm[8];
        __m256 dsc, dmn;
        q4k_scales_vec(blk, &dsc, &dmn);
        _mm256_storeu_ps(ds, dsc);
        _mm256_storeu_ps(dm, dmn);
        const uint8_t *qs = blk + 16;
        float *o = dst + b * QK_K;
#pragma GCC unroll 4
        for (int j = 0; j < 4; j++) {
            const __m256 dl = _mm256_broadcast_ss(ds + 2 * j), ml = _mm256_broadcast_ss(dm + 2 * j);
            const __m256 dh = _mm256_broadcast_ss(ds + 2 * j + 1),
                         mh = _mm256_broadcast_ss(dm + 2 * j + 1);
#pragma GCC unroll 4
            for (int k = 0; k < 4; k++) {
                const __m256i w = load8_u8(qs + 32 * j + 8 * k);
                _mm256_storeu_ps(o + 64 * j + 8 * k,
                                 _mm256_fmsub_ps(_mm256_cvtepi32_ps(_mm256_and_si256(w, m4)), dl, ml));
                _mm256_storeu_ps(o + 64 * j + 32 + 8 * k,
                                 _mm256_fmsub_ps(_mm256_cvtepi32_ps(_mm256_srli_epi32(w, 4)), dh, mh));
            }
        }
    }
}

static TGT void dequant_q6k_avx2(const uint8_t *row, float *dst, uint64_t nb)
{
    const __m256i m4 = _mm256_set1_epi32(0xF), m3 = _mm256_set1_epi32(3),
                  m30 = _mm256_set1_epi32(0x30), c32 = _mm256_set1_epi32(32);
    for (uint64_t b = 0; b < nb; b++) {
        const uint8_t *blk = row + b * Q6_K_BLOCK_BYTES;
        const int8_t *sc = (const int8_t *)(blk + 192);
        const float d = f16_at(blk + 208);
        for (int n = 0; n < 2; n++) {
            const uint8_t *QL = blk + 64 * n, *QH = blk + 128 + 32 * n;
            float *o = dst + b * QK_K + 128 * n;
            for (int l = 0; l < 32; l += 8) {
                __m256i q[4];
                Q6K_UNPACK(QL, QH, l, q[0], q[1], q[2], q[3]);
                for (int t = 0; t < 4; t++) {
                    const __m256 s = _mm256_set1_ps(d * (float)sc[8 * n + l / 16 + 2 * t]);
                    _mm256_storeu_ps(o + 32 * t + l,
                                     _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_sub_epi32(q[t], c32)), s));
                }
            }
        }
    }
}

static TGT int dequant_row_avx2(uint32_t type, const void *row, float *dst, uint64_t n)
{
    switch (type) {
    case GGML_TYPE_Q4_K:
        if (n % QK_K)
            return MUSER_E_ARG;
        dequant_q4k_avx2(row, dst, n / QK_K);
        return MUSER_OK;
    case GGML_TYPE_Q6_K:
        if (n % QK_K)
            return MUSER_E_ARG;
        dequant_q6k_avx2(row, dst, n / QK_K);
        return MUSER_OK;
    case GGML_TYPE_F32: memcpy(dst, row, n * sizeof(float)); return MUSER_OK;
    default: return quant_dequantize_row(type, row, dst, n);
    }
}

/* 8x8 transpose of r[0..8) in registers (every loop fully unrolled: at -O2 GCC otherwise keeps
 * the arrays on the stack, which made the transpose cost more than the dequantization). */
static TGT_INLINE void transpose8(__m256 r[8])
{
    __m256 t[8], s[8];
#pragma GCC unroll 4
    for (int i = 0; i < 4; i++) {
        t[2 * i] = _mm256_unpacklo_ps(r[2 * i], r[2 * i + 1]);
        t[2 * i + 1] = _mm256_unpackhi_ps(r[2 * i], r[2 * i + 1]);
    }
#pragma GCC unroll 2
    for (int i = 0; i < 2; i++) {
        s[4 * i + 0] = _mm256_shuffle_ps(t[4 * i + 0], t[4 * i + 2], 0x44);
        s[4 * i + 1] = _mm256_shuffle_ps(t[4 * i + 0], t[4 * i + 2], 0xEE);
        s[4 * i + 2] = _mm256_shuffle_ps(t[4 * i + 1], t[4 * i + 3], 0x44);
        s[4 * i + 3] = _mm256_shuffle_ps(t[4 * i + 1], t[4 * i + 3], 0xEE);
    }
#pragma GCC unroll 4
    for (int i = 0; i < 4; i++) {
        r[i] = _mm256_permute2f128_ps(s[i], s[i + 4], 0x20);
        r[i + 4] = _mm256_permute2f128_ps(s[i], s[i + 4], 0x31);
    }
}

static TGT void transpose_avx2(const float *src, uint64_t lds, float *panel, uint64_t K)
{
    uint64_t k = 0;
    for (; k + 8 <= K; k += 8) {
#pragma GCC unroll 2
        for (int rb = 0; rb < CPU_PANEL; rb += 8) {
            __m256 r[8];
#pragma GCC unroll 8
            for (int i = 0; i < 8; i++)
                r[i] = _mm256_loadu_ps(src + (uint64_t)(rb + i) * lds + k);
            transpose8(r);
#pragma GCC unroll 8
            for (int i = 0; i < 8; i++)
                _mm256_storeu_ps(panel + (k + i) * CPU_PANEL + rb, r[i]);
        }
    }
    for (; k < K; k++)
        for (int r = 0; r < CPU_PANEL; r++)
            panel[k * CPU_PANEL + r] = src[(uint64_t)r * lds + k];
}

/* Row stride of the block-column buffer: 256 floats plus one line, so its 16 rows spread over
 * L1 sets instead of sharing them (a 1 KB stride repeats every 4 rows). */
#define CPU_BLOCK_LDS (QK_K + 16)

/* K-quant panels one block column at a time: dequantize block b of each row into
 * buf [CPU_PANEL][CPU_BLOCK_LDS] (in L1), transpose it into panel rows 256b..256b+255. Rows nc..
 * stay zero in buf. Same per-element arithmetic as dequant_q4k_avx2 / dequant_q6k_avx2. */
static TGT void unpack_kquant_avx2(void (*dq)(const uint8_t *, float *, uint64_t), uint64_t bb,
                                   const uint8_t *row0, uint64_t row_bytes, uint32_t nc,
                                   uint64_t K, float *buf, float *panel)
{
    memset(buf + (uint64_t)nc * CPU_BLOCK_LDS, 0,
           (uint64_t)(CPU_PANEL - nc) * CPU_BLOCK_LDS * sizeof(float));
    for (uint64_t b = 0; b < K / QK_K; b++) {
        for (uint32_t r = 0; r < nc; r++)
            dq(row0 + r * row_bytes + b * bb, buf + (uint64_t)r * CPU_BLOCK_LDS, 1);
        transpose_avx2(buf, CPU_BLOCK_LDS, panel + b * QK_K * CPU_PANEL, QK_K);
    }
}

static TGT int unpack_panel_avx2(uint32_t type, const uint8_t *row0, uint64_t row_bytes,
                                 uint32_t nc, uint64_t K, float *tmp, float *panel)
{
    if (K % QK_K == 0 && (uint64_t)CPU_PANEL * CPU_BLOCK_LDS <= (uint64_t)CPU_PANEL * K) {
        if (type == GGML_TYPE_Q4_K) {
            unpack_kquant_avx2(dequant_q4k_avx2, Q4_K_BLOCK_BYTES, row0, row_bytes, nc, K, tmp,
                               panel);
            return MUSER_OK;
        }
        if (type == GGML_TYPE_Q6_K) {
            unpack_kquant_avx2(dequant_q6k_avx2, Q6_K_BLOCK_BYTES, row0, row_bytes, nc, K, tmp,
                               panel);
            return MUSER_OK;
        }
    }
    return unpack_rows(dequant_row_avx2, transpose_avx2, type, row0, row_bytes, nc, K, tmp, panel);
}

/* MR activation rows x 16 outputs over the whole K, the rows packed [K][MR] at X: 2*MR
 * accumulators stay in registers (6x16: 12 FMAs per 2 panel loads and 6 broadcasts from one
 * 24-byte step of a single stream; 99% of the 2-FMA/cycle peak with the panel in L1). */
static TGT_INLINE void gemm_mk(int MR, const float *X, const float *P, uint64_t K, float *C,
                               uint64_t ldc, uint32_t nc)
{
    __m256 c0[CPU_MR], c1[CPU_MR];
#pragma GCC unroll 8
    for (int i = 0; i < MR; i++)
        c0[i] = c1[i] = _mm256_setzero_ps();
    for (uint64_t k = 0; k < K; k++) {
        const __m256 w0 = _mm256_loadu_ps(P + k * CPU_PANEL);
        const __m256 w1 = _mm256_loadu_ps(P + k * CPU_PANEL + 8);
#pragma GCC unroll 8
        for (int i = 0; i < MR; i++) {
            const __m256 b = _mm256_broadcast_ss(X + k * MR + i);
            c0[i] = _mm256_fmadd_ps(b, w0, c0[i]);
            c1[i] = _mm256_fmadd_ps(b, w1, c1[i]);
        }
    }
#pragma GCC unroll 8
    for (int i = 0; i < MR; i++) {
        float *c = C + (uint64_t)i * ldc;
        if (nc == CPU_PANEL) {
            _mm256_storeu_ps(c, c0[i]);
            _mm256_storeu_ps(c + 8, c1[i]);
        } else {
            float t[CPU_PANEL];
            _mm256_storeu_ps(t, c0[i]);
            _mm256_storeu_ps(t + 8, c1[i]);
            memcpy(c, t, nc * sizeof(float));
        }
    }
}

/* A GEMM over the chunk's row groups (gemm_group) with micro-kernel MK, each group size its own
 * instance (MR a constant, so the accumulators stay in registers). */
#define GEMM_PANEL_FN(ATTR, NAME, MK)                                                              \
    static ATTR void NAME(const float *Xp, uint64_t m, const float *panel, uint64_t K, float *C,  \
                          uint64_t ldc, uint32_t nc)                                               \
    {                                                                                              \
        for (uint64_t i = 0, r; i < m; i += r) {                                                   \
            r = gemm_group(m, i);                                                                  \
            const float *X = Xp + i * K;                                                           \
            float *Ci = C + i * ldc;                                                               \
            switch (r) {                                                                           \
            case 6: MK(6, X, panel, K, Ci, ldc, nc); break;                                        \
            case 5: MK(5, X, panel, K, Ci, ldc, nc); break;                                        \
            case 4: MK(4, X, panel, K, Ci, ldc, nc); break;                                        \
            case 3: MK(3, X, panel, K, Ci, ldc, nc); break;                                        \
            case 2: MK(2, X, panel, K, Ci, ldc, nc); break;                                        \
            default: MK(1, X, panel, K, Ci, ldc, nc); break;                                       \
            }                                                                                      \
        }                                                                                          \
    }
GEMM_PANEL_FN(TGT, gemm_panel_avx2, gemm_mk)

/* ---- AVX-512F: the GEMM micro-kernel at twice the width ----
 * One zmm holds a panel row's 16 outputs, so MR rows keep MR accumulators; each is the same
 * sequential FMA chain over K as gemm_mk's two ymm halves (the same operations on every output,
 * in the same order), so the two give the same bits and only the width differs. Groups of up to
 * CPU_MR512 rows (its own pack_x grouping: which rows share a call changes no bits) keep 12
 * chains in flight, as gemm_mk's 6 × 2 do. */
#define CPU_MR512 12
#define TGT512 __attribute__((target("avx512f,avx512dq,avx2,fma,f16c")))
#define TGT512_INLINE __attribute__((target("avx512f,avx512dq,avx2,fma,f16c"), always_inline)) inline

static TGT512_INLINE void gemm_mk512(int MR, const float *X, const float *P, uint64_t K, float *C, uint64_t ldc,
                                     uint32_t nc)
{
    __m512 c[CPU_MR512];
#pragma GCC unroll 12
    for (int i = 0; i < MR; i++)
        c[i] = _mm512_setzero_ps();
    for (uint64_t k = 0; k < K; k++) {
        const __m512 w = _mm512_loadu_ps(P + k * CPU_PANEL);
#pragma GCC unroll 12
        for (int i = 0; i < MR; i++)
            c[i] = _mm512_fmadd_ps(_mm512_set1_ps(X[k * MR + i]), w, c[i]);
    }
    const __mmask16 keep = (__mmask16)((1u << nc) - 1u);
#pragma GCC unroll 12
    for (int i = 0; i < MR; i++)
        _mm512_mask_storeu_ps(C + (uint64_t)i * ldc, keep, c[i]);
}

static TGT512 void gemm_panel_avx512(const float *Xp, uint64_t m, const float *panel, uint64_t K, float *C,
                                     uint64_t ldc, uint32_t nc)
{
    for (uint64_t i = 0, r; i < m; i += r) {
        r = gemm_group_mr(m, i, CPU_MR512);
        const float *X = Xp + i * K;
        float *Ci = C + i * ldc;
        switch (r) {
        case 12: gemm_mk512(12, X, panel, K, Ci, ldc, nc); break;
        case 11: gemm_mk512(11, X, panel, K, Ci, ldc, nc); break;
        case 10: gemm_mk512(10, X, panel, K, Ci, ldc, nc); break;
        case 9: gemm_mk512(9, X, panel, K, Ci, ldc, nc); break;
        case 8: gemm_mk512(8, X, panel, K, Ci, ldc, nc); break;
        case 7: gemm_mk512(7, X, panel, K, Ci, ldc, nc); break;
        case 6: gemm_mk512(6, X, panel, K, Ci, ldc, nc); break;
        case 5: gemm_mk512(5, X, panel, K, Ci, ldc, nc); break;
        case 4: gemm_mk512(4, X, panel, K, Ci, ldc, nc); break;
        case 3: gemm_mk512(3, X, panel, K, Ci, ldc, nc); break;
        case 2: gemm_mk512(2, X, panel, K, Ci, ldc, nc); break;
        default: gemm_mk512(1, X, panel, K, Ci, ldc, nc); break;
        }
    }
}
static void pack_x12(const float *X, uint64_t ldx, uint64_t m, uint64_t K, float *Xp) { pack_x_mr(X, ldx, m, K, Xp, CPU_MR512); }

/* The prefill's panels at 512 bits: a K-quant block column dequantized 16 elements at a time and
 * transposed 16 x 16 (CPU_PANEL is one zmm of outputs), the same per-element arithmetic as
 * dequant_q4k_avx2 / dequant_q6k_avx2 (an explicit FMS or multiply per weight), so the panels are
 * AVX2's bits; the transpose only moves them. */
static TGT512_INLINE __m512i load16_u8(const uint8_t *p) { return _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(const void *)p)); }

static TGT512 void dequant_q4k_block512(const uint8_t *blk, float *o)
{
    const __m512i m4 = _mm512_set1_epi32(0xF);
    float ds[8], dm[8];
    __m256 dsc, dmn;
    q4k_scales_vec(blk, &dsc, &dmn);
    _mm256_storeu_ps(ds, dsc);
    _mm256_storeu_ps(dm, dmn);
    const uint8_t *qs = blk + 16;
#pragma GCC unroll 4
    for (int j = 0; j < 4; j++) {
        const __m512 dl = _mm512_set1_ps(ds[2 * j]), ml = _mm512_set1_ps(dm[2 * j]);
        const __m512 dh = _mm512_set1_ps(ds[2 * j + 1]), mh = _mm512_set1_ps(dm[2 * j + 1]);
#pragma GCC unroll 2
        for (int k = 0; k < 2; k++) {
            const __m512i w = load16_u8(qs + 32 * j + 16 * k);
            _mm512_storeu_ps(o + 64 * j + 16 * k, _mm512_fmsub_ps(_mm512_cvtepi32_ps(_mm512_and_si512(w, m4)), dl, ml));
            _mm512_storeu_ps(o + 64 * j + 32 + 16 * k, _mm512_fmsub_ps(_mm512_cvtepi32_ps(_mm512_srli_epi32(w, 4)), dh, mh));
        }
    }
}

static TGT512 void dequant_q6k_block512(const uint8_t *blk, float *o)
{
    const __m512i m4 = _mm512_set1_epi32(0xF), m3 = _mm512_set1_epi32(3), m30 = _mm512_set1_epi32(0x30),
                  c32 = _mm512_set1_epi32(32);
    const int8_t *sc = (const int8_t *)(blk + 192);
    const float d = f16_at(blk + 208);
    for (int n = 0; n < 2; n++) {
        const uint8_t *QL = blk + 64 * n, *QH = blk + 128 + 32 * n;
#pragma GCC unroll 2
        for (int l = 0; l < 32; l += 16) {
            const __m512i A = load16_u8(QL + l), B = load16_u8(QL + 32 + l), H = load16_u8(QH + l);
            const __m512i q[4] = {
                _mm512_or_si512(_mm512_and_si512(A, m4), _mm512_slli_epi32(_mm512_and_si512(H, m3), 4)),
                _mm512_or_si512(_mm512_and_si512(B, m4), _mm512_and_si512(_mm512_slli_epi32(H, 2), m30)),
                _mm512_or_si512(_mm512_srli_epi32(A, 4), _mm512_and_si512(H, m30)),
                _mm512_or_si512(_mm512_srli_epi32(B, 4), _mm512_and_si512(_mm512_srli_epi32(H, 2), m30))};
#pragma GCC unroll 4
            for (int t = 0; t < 4; t++) {
                const __m512 sv = _mm512_set1_ps(d * (float)sc[8 * n + l / 16 + 2 * t]);
                _mm512_storeu_ps(o + 128 * n + 32 * t + l, _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_sub_epi32(q[t], c32)), sv));
            }
        }
    }
}

/* src rows 0..15 (lds apart), columns k0..k0+15 -> panel rows k0..k0+15 of 16 */
static TGT512_INLINE void transpose16_avx512(const float *src, uint64_t lds, float *panel)
{
    __m512 r[16], t[16];
#pragma GCC unroll 16
    for (int i = 0; i < 16; i++) r[i] = _mm512_loadu_ps(src + (uint64_t)i * lds);
#pragma GCC unroll 8
    for (int i = 0; i < 8; i++) { /* per 128-bit lane: rows 2i, 2i+1 interleaved */
        t[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
        t[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
    }
#pragma GCC unroll 4
    for (int g = 0; g < 4; g++) { /* r[4g + c]: per lane L, column 4L + c of rows 4g..4g+3 */
        r[4 * g + 0] = _mm512_shuffle_ps(t[4 * g + 0], t[4 * g + 2], 0x44);
        r[4 * g + 1] = _mm512_shuffle_ps(t[4 * g + 0], t[4 * g + 2], 0xEE);
        r[4 * g + 2] = _mm512_shuffle_ps(t[4 * g + 1], t[4 * g + 3], 0x44);
        r[4 * g + 3] = _mm512_shuffle_ps(t[4 * g + 1], t[4 * g + 3], 0xEE);
    }
#pragma GCC unroll 4
    for (int c = 0; c < 4; c++) { /* column 4L + c: lane L of r[c], r[4 + c], r[8 + c], r[12 + c] */
        const __m512 x0 = _mm512_shuffle_f32x4(r[c], r[4 + c], 0x44), x1 = _mm512_shuffle_f32x4(r[c], r[4 + c], 0xEE);
        const __m512 y0 = _mm512_shuffle_f32x4(r[8 + c], r[12 + c], 0x44), y1 = _mm512_shuffle_f32x4(r[8 + c], r[12 + c], 0xEE);
        _mm512_storeu_ps(panel + (0 + c) * CPU_PANEL, _mm512_shuffle_f32x4(x0, y0, 0x88));
        _mm512_storeu_ps(panel + (4 + c) * CPU_PANEL, _mm512_shuffle_f32x4(x0, y0, 0xDD));
        _mm512_storeu_ps(panel + (8 + c) * CPU_PANEL, _mm512_shuffle_f32x4(x1, y1, 0x88));
        _mm512_storeu_ps(panel + (12 + c) * CPU_PANEL, _mm512_shuffle_f32x4(x1, y1, 0xDD));
    }
}

static TGT512 int unpack_panel_avx512(uint32_t type, const uint8_t *row0, uint64_t row_bytes, uint32_t nc, uint64_t K,
                                      float *buf, float *panel)
{
    _Static_assert(CPU_PANEL == 16, "a panel row is one zmm");
    const bool q4 = type == GGML_TYPE_Q4_K, q6 = type == GGML_TYPE_Q6_K;
    if (!(q4 || q6) || K % QK_K || (uint64_t)CPU_PANEL * CPU_BLOCK_LDS > (uint64_t)CPU_PANEL * K)
        return unpack_panel_avx2(type, row0, row_bytes, nc, K, buf, panel);
    const uint64_t bb = q4 ? Q4_K_BLOCK_BYTES : Q6_K_BLOCK_BYTES;
    memset(buf + (uint64_t)nc * CPU_BLOCK_LDS, 0, (uint64_t)(CPU_PANEL - nc) * CPU_BLOCK_LDS * sizeof(float));
    for (uint64_t b = 0; b < K / QK_K; b++) {
        for (uint32_t r = 0; r < nc; r++) {
            const uint8_t *blk = row0 + r * row_bytes + b * bb;
            if (q4) dequant_q4k_block512(blk, buf + (uint64_t)r * CPU_BLOCK_LDS);
            else dequant_q6k_block512(blk, buf + (uint64_t)r * CPU_BLOCK_LDS);
        }
        for (uint64_t k = 0; k < QK_K; k += 16)
            transpose16_avx512(buf + k, CPU_BLOCK_LDS, panel + (b * QK_K + k) * CPU_PANEL);
    }
    return MUSER_OK;
}

/* The decode dots at 512 bits, the same bits as AVX2's: every zmm is two of dot_q4k_multi's (or
 * dot_q6k_multi's) ymm side by side — the lo and hi nibbles of one 32-byte group, or two quarters
 * t of a Q6_K half — with the same operations per lane in the same order, and the final sums
 * taken in AVX2's order from the two halves. Half the instructions per input: the decode dot is
 * compute-bound on this machine. Its xsums put each 64-element chunk's two 32-halves of xp side by
 * side at 8-element granularity (xp512[64c + 16t + 8h + i] = xp[64c + 32h + 8t + i]), so one
 * 512-bit load fetches what the two ymm loads of AVX2 did. */
static TGT void xsums_avx512(const float *x, uint64_t n, cpu_xsums *out)
{
    xsums_avx2(x, n, out);
    float tmp[64];
    for (uint64_t c = 0; c + 64 <= n; c += 64) {
        memcpy(tmp, out->xp + c, sizeof tmp);
        for (int t = 0; t < 4; t++)
            for (int h = 0; h < 2; h++)
                memcpy(out->xp + c + 16 * t + 8 * h, tmp + 32 * h + 8 * t, 8 * sizeof(float));
    }
}

static TGT512_INLINE float hsum_halves(__m512 v) /* hsum256(lo + hi), AVX2's final sum */
{
    return hsum256(_mm256_add_ps(_mm512_castps512_ps256(v), _mm512_extractf32x8_ps(v, 1)));
}

/* A multi-input dot's state between K-chunks (dot_tile): per input CPU_TILE_STATE floats, its
 * accumulators as they stand after the chunk's last block. Storing and reloading them changes no
 * bit: the next chunk continues the same sums in the same order. */
#define CPU_TILE_STATE 48 /* two zmm and a ymm */
typedef void (*dot_state_fn)(const uint8_t *, const cpu_xsums *, uint64_t, uint64_t, float *, int, int, float *, uint64_t);

static TGT512_INLINE void state_in(const int R, const float *st, int first, __m512 acc[4], __m256 v[4])
{
#pragma GCC unroll 4
    for (int r = 0; r < R; r++) {
        acc[r] = first ? _mm512_setzero_ps() : _mm512_loadu_ps(st + r * CPU_TILE_STATE);
        v[r] = first ? _mm256_setzero_ps() : _mm256_loadu_ps(st + r * CPU_TILE_STATE + 32);
    }
}
static TGT512_INLINE void state_out(const int R, float *st, const __m512 acc[4], const __m256 v[4])
{
#pragma GCC unroll 4
    for (int r = 0; r < R; r++) {
        _mm512_storeu_ps(st + r * CPU_TILE_STATE, acc[r]);
        _mm256_storeu_ps(st + r * CPU_TILE_STATE + 32, v[r]);
    }
}
static TGT512_INLINE void state2_in(const int R, const float *st, int first, __m512 acc[4][2], __m256 v[4])
{
#pragma GCC unroll 4
    for (int r = 0; r < R; r++) {
        acc[r][0] = first ? _mm512_setzero_ps() : _mm512_loadu_ps(st + r * CPU_TILE_STATE);
        acc[r][1] = first ? _mm512_setzero_ps() : _mm512_loadu_ps(st + r * CPU_TILE_STATE + 16);
        v[r] = first ? _mm256_setzero_ps() : _mm256_loadu_ps(st + r * CPU_TILE_STATE + 32);
    }
}
static TGT512_INLINE void state2_out(const int R, float *st, const __m512 acc[4][2], const __m256 v[4])
{
#pragma GCC unroll 4
    for (int r = 0; r < R; r++) {
        _mm512_storeu_ps(st + r * CPU_TILE_STATE, acc[r][0]);
        _mm512_storeu_ps(st + r * CPU_TILE_STATE + 16, acc[r][1]);
        _mm256_storeu_ps(st + r * CPU_TILE_STATE + 32, v[r]);
    }
}

static TGT512_INLINE void dot_q4k_multi512(const uint8_t *row, const cpu_xsums *xs, const int R, uint64_t b0, uint64_t nb,
                                           float *st, int first, int last, float *out, uint64_t ldo)
{
    const __m512i m0 = _mm512_set1_epi32(0xF), m1 = _mm512_set1_epi32(0xF00), m2 = _mm512_set1_epi32(0xF0000),
                  m3 = _mm512_set1_epi32(0xF000000);
    const __m512i shift = _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 4, 4, 4, 4, 4, 4, 4, 4);
    const __m512i dsel = _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1);
    __m512 acc[4];
    __m256 mins[4];
    state_in(R, st, first, acc, mins);
    for (uint64_t b = b0; b < nb; b++) {
        const uint8_t *blk = row + b * Q4_K_BLOCK_BYTES;
        prefetch_ahead(blk, 3); /* a Q4_K block: 144 bytes */
        __m256 dsc, dmn;
        q4k_scales_vec(blk, &dsc, &dmn);
#pragma GCC unroll 4
        for (int r = 0; r < R; r++)
            mins[r] = _mm256_fmadd_ps(dmn, _mm256_loadu_ps(xs[r].s32 + b * 8), mins[r]);
        const __m512 dz = _mm512_castps256_ps512(dsc);
        const uint8_t *qs = blk + 16;
#pragma GCC unroll 4
        for (int j = 0; j < 4; j++) {
            const __m256i v = _mm256_loadu_si256((const __m256i *)(const void *)(qs + 32 * j));
            const __m512i V = _mm512_srlv_epi32(_mm512_broadcast_i64x4(v), shift); /* [lo nibbles | hi nibbles] */
            const __m512 w0 = _mm512_cvtepi32_ps(_mm512_and_si512(V, m0)), w1 = _mm512_cvtepi32_ps(_mm512_and_si512(V, m1));
            const __m512 w2 = _mm512_cvtepi32_ps(_mm512_and_si512(V, m2)), w3 = _mm512_cvtepi32_ps(_mm512_and_si512(V, m3));
            /* [d·sc of sub-block 2j | of 2j + 1] */
            const __m512 d = _mm512_permutexvar_ps(_mm512_add_epi32(dsel, _mm512_set1_epi32(2 * j)), dz);
#pragma GCC unroll 4
            for (int r = 0; r < R; r++) {
                const float *xq = xs[r].xp + b * QK_K + 64 * j;
                __m512 a = _mm512_mul_ps(w0, _mm512_loadu_ps(xq));
                a = _mm512_fmadd_ps(w1, _mm512_loadu_ps(xq + 16), a);
                a = _mm512_fmadd_ps(w2, _mm512_loadu_ps(xq + 32), a);
                a = _mm512_fmadd_ps(w3, _mm512_loadu_ps(xq + 48), a);
                acc[r] = _mm512_fmadd_ps(a, d, acc[r]);
            }
        }
    }
    if (!last) {
        state_out(R, st, acc, mins);
        return;
    }
#pragma GCC unroll 4
    for (int r = 0; r < R; r++)
        out[r * ldo] = hsum_halves(acc[r]) - hsum256(mins[r]);
}

static TGT512_INLINE void dot_q6k_multi512(const uint8_t *row, const cpu_xsums *xs, const int R, uint64_t b0, uint64_t nb,
                                           float *st, int first, int last, float *out, uint64_t ldo)
{
    const __m512i k0 = _mm512_set1_epi32(0x3F), k1 = _mm512_set1_epi32(0x3F00), k2 = _mm512_set1_epi32(0x3F0000),
                  k3 = _mm512_set1_epi32(0x3F000000);
    /* quarters (0, 1) and (2, 3): AVX2's sel[t] side by side */
    const __m512i sel[2] = {_mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3),
                            _mm512_setr_epi32(4, 4, 4, 4, 5, 5, 5, 5, 6, 6, 6, 6, 7, 7, 7, 7)};
    __m512 acc[4][2];
    __m256 offs[4];
    state2_in(R, st, first, acc, offs);
    for (uint64_t b = b0; b < nb; b++) {
        const uint8_t *blk = row + b * Q6_K_BLOCK_BYTES;
        __m256 ds[2];
        q6k_block_head(blk, b, xs, R, ds, offs);
#pragma GCC unroll 2
        for (int n = 0; n < 2; n++) {
            __m256i q[4];
            q6k_quarters(blk, n, q);
            const __m512 dsz = _mm512_castps256_ps512(ds[n]);
#pragma GCC unroll 2
            for (int p = 0; p < 2; p++) {
                const __m512i Q = _mm512_inserti64x4(_mm512_castsi256_si512(q[2 * p]), q[2 * p + 1], 1);
                const __m512 w0 = _mm512_cvtepi32_ps(_mm512_and_si512(Q, k0)), w1 = _mm512_cvtepi32_ps(_mm512_and_si512(Q, k1));
                const __m512 w2 = _mm512_cvtepi32_ps(_mm512_and_si512(Q, k2)), w3 = _mm512_cvtepi32_ps(_mm512_and_si512(Q, k3));
                const __m512 sc = _mm512_permutexvar_ps(sel[p], dsz);
#pragma GCC unroll 4
                for (int r = 0; r < R; r++) {
                    const float *yt = xs[r].xp + b * QK_K + 128 * n + 64 * p;
                    __m512 a = _mm512_mul_ps(w0, _mm512_loadu_ps(yt));
                    __m512 c = _mm512_mul_ps(w1, _mm512_loadu_ps(yt + 16));
                    a = _mm512_fmadd_ps(w2, _mm512_loadu_ps(yt + 32), a);
                    c = _mm512_fmadd_ps(w3, _mm512_loadu_ps(yt + 48), c);
                    acc[r][p] = _mm512_fmadd_ps(_mm512_add_ps(a, c), sc, acc[r][p]);
                }
            }
        }
    }
    if (!last) {
        state2_out(R, st, acc, offs);
        return;
    }
#pragma GCC unroll 4
    for (int r = 0; r < R; r++) {
        const __m512 a01 = acc[r][0], a23 = acc[r][1];
        const __m256 s01 = _mm256_add_ps(_mm512_castps512_ps256(a01), _mm512_extractf32x8_ps(a01, 1));
        const __m256 s23 = _mm256_add_ps(_mm512_castps512_ps256(a23), _mm512_extractf32x8_ps(a23, 1));
        out[r * ldo] = hsum256(_mm256_add_ps(s01, s23)) - 32.0f * hsum256(offs[r]);
    }
}

/* A level's multi-input state kernel impl as tab[g - 1], the kernel for g inputs. */
#define STATE_KERNEL(ATTR, name, impl, R)                                                                          \
    static ATTR void name(const uint8_t *w, const cpu_xsums *xs, uint64_t b0, uint64_t b1, float *st, int first,  \
                          int last, float *o, uint64_t ldo)                                                         \
    {                                                                                                               \
        impl(w, xs, R, b0, b1, st, first, last, o, ldo);                                                            \
    }
#define STATE_KERNELS(ATTR, tab, impl)                                                                              \
    STATE_KERNEL(ATTR, tab##1, impl, 1)                                                                             \
    STATE_KERNEL(ATTR, tab##2, impl, 2)                                                                             \
    STATE_KERNEL(ATTR, tab##3, impl, 3)                                                                             \
    STATE_KERNEL(ATTR, tab##4, impl, 4)                                                                             \
    static const dot_state_fn tab[CPU_DOT_GROUP] = {tab##1, tab##2, tab##3, tab##4};

STATE_KERNELS(TGT512, dot_q4k_z, dot_q4k_multi512)
STATE_KERNELS(TGT512, dot_q6k_z, dot_q6k_multi512)

/* dot_rows by a level's state kernels f (f[g - 1] takes g inputs), whole rows: groups of up to
 * CPU_DOT_GROUP inputs, each over every block with no state carried */
static void dot_state_rows(const dot_state_fn *f, const void *row, const cpu_xsums *xs, uint32_t m, uint64_t nb, float *out,
                           uint64_t ldo)
{
    for (uint32_t i = 0; i < m; i += CPU_DOT_GROUP) {
        const uint32_t g = m - i < CPU_DOT_GROUP ? m - i : CPU_DOT_GROUP;
        f[g - 1](row, xs + i, 0, nb, NULL, 1, 1, out + i * ldo, ldo);
    }
}

/* A level's dot_row and dot_rows: Q4_K and Q6_K on its state kernels q4 / q6, the other types
 * on the fallback level fb's. */
#define LEVEL_DOTS(ATTR, lvl, q4, q6, fb)                                                                          \
    static ATTR float dot_row_##lvl(uint32_t type, const void *row, const float *x, const cpu_xsums *xs, uint64_t n) \
    {                                                                                                               \
        if (type != GGML_TYPE_Q4_K && type != GGML_TYPE_Q6_K)                                                       \
            return dot_row_##fb(type, row, x, xs, n);                                                               \
        float o;                                                                                                    \
        dot_state_rows(type == GGML_TYPE_Q4_K ? q4 : q6, row, xs, 1, n / QK_K, &o, 1);                              \
        return o;                                                                                                   \
    }                                                                                                               \
    static ATTR void dot_rows_##lvl(uint32_t type, const void *row, const float *x, uint64_t ldx,                 \
                                    const cpu_xsums *xs, uint32_t m, uint64_t n, float *out, uint64_t ldo)          \
    {                                                                                                               \
        const dot_state_fn *f = type == GGML_TYPE_Q4_K ? q4 : type == GGML_TYPE_Q6_K ? q6 : NULL;                   \
        if (f) dot_state_rows(f, row, xs, m, n / QK_K, out, ldo);                                                   \
        else dot_rows_##fb(type, row, x, ldx, xs, m, n, out, ldo);                                                  \
    }

LEVEL_DOTS(TGT512, avx512, dot_q4k_z, dot_q6k_z, avx2)

/* ---- AVX-512 VNNI: the Q4_K and Q6_K decode dots on exact integer digits of x ----
 *
 * Per 16-element group of x a power of two s with max|x| < 2^23 s and X = rint(x/s), a 24-bit
 * integer: every element within half an f32 ulp of the group's largest. (Groups of 32, the CUDA
 * matvecs' choice, cost the trained model's decode route 9.89e-4 of the 1e-3 bound against
 * PyTorch: ffn_down's input is heavy-tailed, and an outlier leaves the rest of its group few
 * bits; at 16 it is 8.5e-4, under the f32 dots' 9.25e-4.) X = D2 2^16 + B1 2^8 + B0 with
 * D2 = X >> 16 a signed byte and B1, B0 unsigned bytes: vpdpbusd multiplies unsigned by signed
 * bytes, so the quants (Q4_K 0..15, Q6_K 0..63) are its unsigned operand against D2 and its
 * signed one against B1 and B0. Each int32 lane holds one 16-element group over the block's four
 * vectors (the group-lane order below) and takes the digits by Horner (shift 8 between): for Q4_K
 * the group's exact sum of q X (< 240·2^23 < 2^31), for Q6_K (quants to 63) the exact sums of
 * q (X >> 8) and of q B0, joined in f32. Per 256 weights and input: 12 vpdpbusd, 4 shifts, one or
 * two conversions and one or two FMAs, where four elements a lane took 8 shifts, 4 conversions,
 * 4 permutes and 4 FMAs. The Q4_K dmin m and the Q6_K -32 terms use the f32 sums of x, as the f32
 * dots do. A non-finite x makes its group's s NaN, so every output that reads it is NaN. The
 * results are not the f32 dots' bits, so this is a level of its own. */
#define TGTVNNI __attribute__((target("avx512f,avx512dq,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")))
#define TGTVNNI_INLINE __attribute__((target("avx512f,avx512dq,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c"), always_inline)) inline

/* xd's order, per 256 elements of x: lane l of a zmm holds one 16-element group in all four vectors
 * of the block (vector v: the group's elements 4v..4v+3), each vector in three digit planes (B0, B1,
 * D2) of 64 bytes, then the 16 groups' s (f32) in lane order. A lane's Horner sums thus run over
 * its whole group, and a block takes one conversion and one FMA per input (x's order, four
 * elements a lane, took four conversions, four FMAs and four permutes). Group g = 4c + 2n + h sits
 * in lane c + 4h + 8n: for Q4_K the quants' 32-byte chunk c, nibble n and half h of the chunk, so
 * one dword permute of the 128 quant bytes gives a vector (lane l of vector v is dword
 * {0, 8, 16, 24, 4, 12, 20, 28}[l mod 8] + v, the low nibbles in lanes 0..7, the high ones in
 * 8..15); Q6_K's quants in x's order are transposed into it by dwords within each 128-bit lane. */
static inline int xd4_lane(int g) { return (g >> 2) + 4 * (g & 1) + 8 * ((g >> 1) & 1); }

/* group g's digit planes dg[d] (16 bytes each in x's order: B0, B1, D2) into block o */
static inline void xd4_put(uint8_t *o, int g, const uint8_t dg[3][16])
{
    const int l = xd4_lane(g);
    for (int d = 0; d < 3; d++)
        for (int v = 0; v < 4; v++) memcpy(o + 192 * v + 64 * d + 4 * l, dg[d] + 4 * v, 4);
}

/* the 16 groups' s, in lane order, after the digits */
static inline void xd4_scales(uint8_t *o, const float sg[16])
{
    float sl[16];
    for (int g = 0; g < 16; g++) sl[xd4_lane(g)] = sg[g];
    memcpy(o + 768, sl, sizeof sl);
}

static TGTVNNI void xsums_vnni(const float *x, uint64_t n, cpu_xsums *out)
{
    xsums_sums_avx2(x, n, out); /* no xp: only the f32 K-quant dots read it */
    const __m512i absm = _mm512_set1_epi32(0x7FFFFFFF);
    /* rint can reach 2^23 only from the largest float under 2^23 s; D2 must stay a byte */
    const __m512i top = _mm512_set1_epi32((1 << 23) - 1);
    for (uint64_t b = 0; b + QK_K <= n; b += QK_K) {
        uint8_t *o = out->xd + (b / QK_K) * CPU_XD_BLOCK;
        float sg[16];
        for (int g = 0; g < 16; g++) {
            const __m512 v0 = _mm512_loadu_ps(x + b + 16 * g);
            const int E = (int)(_mm512_reduce_max_epu32(_mm512_and_si512(_mm512_castps_si512(v0), absm)) >> 23);
            sg[g] = E == 255 ? NAN : ldexpf(1.0f, E - 149);
            const __m512 k = _mm512_set1_ps((float)(E == 255 ? 0 : 149 - E));
            const __m512i X0 = _mm512_min_epi32(
                _mm512_cvt_roundps_epi32(_mm512_scalef_ps(v0, k), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC), top);
            uint8_t dg[3][16];
            _mm_storeu_si128((__m128i *)(void *)dg[0], _mm512_cvtepi32_epi8(X0));
            _mm_storeu_si128((__m128i *)(void *)dg[1], _mm512_cvtepi32_epi8(_mm512_srai_epi32(X0, 8)));
            _mm_storeu_si128((__m128i *)(void *)dg[2], _mm512_cvtepi32_epi8(_mm512_srai_epi32(X0, 16)));
            xd4_put(o, g, dg);
        }
        xd4_scales(o, sg);
    }
}

/* One block's four zmm of quants in the group-lane order against one input's digits D: each lane's
 * exact sums over its group by Horner over D2, B1, B0 (vectors 0, 1 and 2, 3 as two chains, added
 * exactly), converted and FMA'd into acc by the lane's d sc s. Q6_K's quants reach 63, so 16 of its
 * products may pass 2^31 (q6): its Horner stops at D2 2^8 + B1 (|sum| < 2^25), B0's sum runs
 * beside it, and the two meet in f32 (hi 2^8 + lo, one FMA). */
static TGTVNNI_INLINE __m512 digits_fma(const __m512i Q[4], const uint8_t *D, __m512 dz, __m512 acc, const bool q6)
{
#define XD4(v, d) _mm512_loadu_si512((const void *)(D + 192 * (v) + 64 * (d)))
    __m512i a = _mm512_dpbusd_epi32(_mm512_setzero_si512(), Q[0], XD4(0, 2));
    __m512i c = _mm512_dpbusd_epi32(_mm512_setzero_si512(), Q[2], XD4(2, 2));
    a = _mm512_dpbusd_epi32(a, Q[1], XD4(1, 2));
    c = _mm512_dpbusd_epi32(c, Q[3], XD4(3, 2));
#pragma GCC unroll 2
    for (int d = 1; d >= 0; d--) {
        if (q6 && d == 0) break;
        a = _mm512_dpbusd_epi32(_mm512_slli_epi32(a, 8), XD4(0, d), Q[0]);
        c = _mm512_dpbusd_epi32(_mm512_slli_epi32(c, 8), XD4(2, d), Q[2]);
        a = _mm512_dpbusd_epi32(a, XD4(1, d), Q[1]);
        c = _mm512_dpbusd_epi32(c, XD4(3, d), Q[3]);
    }
    __m512 t = _mm512_cvtepi32_ps(_mm512_add_epi32(a, c));
    if (q6) {
        __m512i e = _mm512_dpbusd_epi32(_mm512_setzero_si512(), XD4(0, 0), Q[0]);
        __m512i f = _mm512_dpbusd_epi32(_mm512_setzero_si512(), XD4(2, 0), Q[2]);
        e = _mm512_dpbusd_epi32(e, XD4(1, 0), Q[1]);
        f = _mm512_dpbusd_epi32(f, XD4(3, 0), Q[3]);
        t = _mm512_fmadd_ps(t, _mm512_set1_ps(256.0f), _mm512_cvtepi32_ps(_mm512_add_epi32(e, f)));
    }
#undef XD4
    return _mm512_fmadd_ps(t, dz, acc);
}

static TGTVNNI_INLINE void dot_q4k_multivnni(const uint8_t *row, const cpu_xsums *xs, const int R, uint64_t b0, uint64_t nb,
                                             float *st, int first, int last, float *out, uint64_t ldo)
{
    const __m512i m4 = _mm512_set1_epi8(0x0F);
    const __m512i shift = _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 4, 4, 4, 4, 4, 4, 4, 4);
    const __m512i idx = _mm512_setr_epi32(0, 8, 16, 24, 4, 12, 20, 28, 0, 8, 16, 24, 4, 12, 20, 28);
    const __m512i sub = _mm512_setr_epi32(0, 2, 4, 6, 0, 2, 4, 6, 1, 3, 5, 7, 1, 3, 5, 7); /* each lane's sub-block */
    __m512 acc[4];
    __m256 mins[4];
    state_in(R, st, first, acc, mins);
    for (uint64_t b = b0; b < nb; b++) {
        const uint8_t *blk = row + b * Q4_K_BLOCK_BYTES;
        prefetch_ahead(blk, 3); /* a Q4_K block: 144 bytes */
        __m256 dsc, dmn;
        q4k_scales_vec(blk, &dsc, &dmn);
        const __m512i lo = _mm512_loadu_si512((const void *)(blk + 16)), hi = _mm512_loadu_si512((const void *)(blk + 80));
        __m512i Q[4]; /* the group-lane order (xd4_lane) */
#pragma GCC unroll 4
        for (int v = 0; v < 4; v++)
            Q[v] = _mm512_and_si512(
                _mm512_srlv_epi32(_mm512_permutex2var_epi32(lo, _mm512_add_epi32(idx, _mm512_set1_epi32(v)), hi), shift), m4);
        const __m512 dsc16 = _mm512_permutexvar_ps(sub, _mm512_castps256_ps512(dsc));
#pragma GCC unroll 4
        for (int r = 0; r < R; r++) {
            const uint8_t *D = xs[r].xd + b * CPU_XD_BLOCK;
            mins[r] = _mm256_fmadd_ps(dmn, _mm256_loadu_ps(xs[r].s32 + b * 8), mins[r]);
            const __m512 dz = _mm512_mul_ps(dsc16, _mm512_loadu_ps((const float *)(const void *)(D + 768)));
            acc[r] = digits_fma(Q, D, dz, acc[r], false);
        }
    }
    if (!last) {
        state_out(R, st, acc, mins);
        return;
    }
#pragma GCC unroll 4
    for (int r = 0; r < R; r++)
        out[r * ldo] = hsum_halves(acc[r]) - hsum256(mins[r]);
}

/* Q6_K on the same digits (digits_fma's q6 form) */
static TGTVNNI_INLINE void dot_q6k_multivnni(const uint8_t *row, const cpu_xsums *xs, const int R, uint64_t b0, uint64_t nb,
                                             float *st, int first, int last, float *out, uint64_t ldo)
{
    const __m512i grp = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15); /* lane l's group */
    __m512 acc[4];
    __m256 offs[4];
    state_in(R, st, first, acc, offs);
    for (uint64_t b = b0; b < nb; b++) {
        const uint8_t *blk = row + b * Q6_K_BLOCK_BYTES;
        __m256 ds[2];
        q6k_block_head(blk, b, xs, R, ds, offs);
        const __m512 d16 = _mm512_permutexvar_ps(grp, _mm512_insertf32x8(_mm512_castps256_ps512(ds[0]), ds[1], 1));
        __m512i X[4]; /* x's order: vector w has group 4w + l/4 in lane l */
#pragma GCC unroll 2
        for (int n = 0; n < 2; n++) {
            __m256i q[4];
            q6k_quarters(blk, n, q);
            X[2 * n] = _mm512_inserti64x4(_mm512_castsi256_si512(q[0]), q[1], 1);
            X[2 * n + 1] = _mm512_inserti64x4(_mm512_castsi256_si512(q[2]), q[3], 1);
        }
        /* into the group-lane order: lane 4k + c of vector v is dword 4k + v of X[c] */
        const __m512i u01l = _mm512_unpacklo_epi32(X[0], X[1]), u01h = _mm512_unpackhi_epi32(X[0], X[1]);
        const __m512i u23l = _mm512_unpacklo_epi32(X[2], X[3]), u23h = _mm512_unpackhi_epi32(X[2], X[3]);
        const __m512i Q[4] = {_mm512_unpacklo_epi64(u01l, u23l), _mm512_unpackhi_epi64(u01l, u23l),
                              _mm512_unpacklo_epi64(u01h, u23h), _mm512_unpackhi_epi64(u01h, u23h)};
#pragma GCC unroll 4
        for (int r = 0; r < R; r++) {
            const uint8_t *D = xs[r].xd + b * CPU_XD_BLOCK;
            const __m512 dz = _mm512_mul_ps(d16, _mm512_loadu_ps((const float *)(const void *)(D + 768)));
            acc[r] = digits_fma(Q, D, dz, acc[r], true);
        }
    }
    if (!last) {
        state_out(R, st, acc, offs);
        return;
    }
#pragma GCC unroll 4
    for (int r = 0; r < R; r++)
        out[r * ldo] = hsum_halves(acc[r]) - 32.0f * hsum256(offs[r]);
}

STATE_KERNELS(TGTVNNI, dot_q6k_v, dot_q6k_multivnni)
STATE_KERNELS(TGTVNNI, dot_q4k_v, dot_q4k_multivnni)
LEVEL_DOTS(TGTVNNI, vnni, dot_q4k_v, dot_q6k_v, avx512)

/* dot_tile: nr weight rows (row_bytes apart) against m inputs in tiles of CPU_TILE_ROWS rows, each
 * tile K-chunk by K-chunk (CPU_TILE_BLOCKS blocks: a few inputs' x stays in L1 while the tile's rows
 * pass through it) with each input's accumulators carried across the chunks: every output is
 * dot_rows's bits. A type without a state kernel takes dot_rows row by row. */
#define CPU_TILE_ROWS 16
#define CPU_TILE_BLOCKS 8
static void dot_tile_with(const dot_state_fn *f, void (*rows_fn)(uint32_t, const void *, const float *, uint64_t,
                                                                  const cpu_xsums *, uint32_t, uint64_t, float *, uint64_t),
                          uint32_t type, const uint8_t *rows, uint64_t row_bytes, uint32_t nr, const float *x, uint64_t ldx,
                          const cpu_xsums *xs, uint32_t m, uint64_t n, float *out, uint64_t ldo)
{
    if (!f || n % QK_K) {
        for (uint32_t r = 0; r < nr; r++) rows_fn(type, rows + r * row_bytes, x, ldx, xs, m, n, out + r, ldo);
        return;
    }
    float st[CPU_TILE_ROWS * CPU_DOT_GROUP * CPU_TILE_STATE];
    const uint64_t nb = n / QK_K;
    for (uint32_t r0 = 0; r0 < nr; r0 += CPU_TILE_ROWS) {
        const uint32_t tr = nr - r0 < CPU_TILE_ROWS ? nr - r0 : CPU_TILE_ROWS;
        for (uint32_t i = 0; i < m; i += CPU_DOT_GROUP) {
            const uint32_t g = m - i < CPU_DOT_GROUP ? m - i : CPU_DOT_GROUP;
            for (uint64_t c0 = 0; c0 < nb; c0 += CPU_TILE_BLOCKS) {
                const uint64_t c1 = nb - c0 < CPU_TILE_BLOCKS ? nb : c0 + CPU_TILE_BLOCKS;
                for (uint32_t r = 0; r < tr; r++)
                    f[g - 1](rows + (uint64_t)(r0 + r) * row_bytes, xs + i, c0, c1, st + r * CPU_DOT_GROUP * CPU_TILE_STATE,
                             c0 == 0, c1 == nb, out + i * ldo + r0 + r, ldo);
            }
        }
    }
}
/* a level's dot_tile on its state kernels (the other types row by row through its dot_rows) */
#define LEVEL_TILE(lvl, q4, q6)                                                                                     \
    static void dot_tile_##lvl(uint32_t type, const uint8_t *rows, uint64_t row_bytes, uint32_t nr, const float *x, \
                               uint64_t ldx, const cpu_xsums *xs, uint32_t m, uint64_t n, float *out, uint64_t ldo)  \
    {                                                                                                               \
        const dot_state_fn *f = type == GGML_TYPE_Q4_K ? q4 : type == GGML_TYPE_Q6_K ? q6 : NULL;                   \
        dot_tile_with(f, dot_rows_##lvl, type, rows, row_bytes, nr, x, ldx, xs, m, n, out, ldo);                    \
    }
LEVEL_TILE(avx512, dot_q4k_z, dot_q6k_z)
LEVEL_TILE(vnni, dot_q4k_v, dot_q6k_v)

/* ---- AVX-VNNI: the VNNI level's digit dots at 256 bits (CPUs with VEX vpdpbusd, no AVX-512) ----
 *
 * The same digits of x, in the same bytes (xsums_avxvnni writes xsums_vnni's xd with AVX2
 * instructions), and each zmm of the 512-bit dots taken as its two ymm halves side by side: lane
 * by lane the same exact integers, conversions and FMAs in the same order, and the final sums in
 * hsum_halves' order. So this level's outputs are avx512vnni's bits (test_cpu_dots checks it where
 * a CPU has both), on the AVX2 table otherwise (its GEMM, its other types). */
#define TGTAV __attribute__((target("avx2,fma,f16c,avxvnni")))
#define TGTAV_INLINE __attribute__((target("avx2,fma,f16c,avxvnni"), always_inline)) inline

/* the low byte of each int32 lane of a (8) then b (8) -> 16 bytes, as _mm512_cvtepi32_epi8 */
static TGTAV_INLINE __m128i low_bytes16(__m256i a, __m256i b)
{
    const __m256i pick = _mm256_setr_epi8(0, 4, 8, 12, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1,
                                          0, 4, 8, 12, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1);
    const __m256i two = _mm256_setr_epi32(0, 4, 0, 0, 0, 0, 0, 0);
    const __m256i A = _mm256_permutevar8x32_epi32(_mm256_shuffle_epi8(a, pick), two);
    const __m256i B = _mm256_permutevar8x32_epi32(_mm256_shuffle_epi8(b, pick), two);
    return _mm_unpacklo_epi64(_mm256_castsi256_si128(A), _mm256_castsi256_si128(B));
}

/* 2^e as a float, e in [-126, 127] */
static TGTAV_INLINE __m256 pow2_ps(int e) { return _mm256_castsi256_ps(_mm256_set1_epi32((e + 127) << 23)); }

static TGTAV void xsums_avxvnni(const float *x, uint64_t n, cpu_xsums *out)
{
    xsums_sums_avx2(x, n, out); /* no xp: only the f32 K-quant dots read it */
    const __m256i absm = _mm256_set1_epi32(0x7FFFFFFF);
    const __m256i top = _mm256_set1_epi32((1 << 23) - 1);
    for (uint64_t b = 0; b + QK_K <= n; b += QK_K) {
        uint8_t *o = out->xd + (b / QK_K) * CPU_XD_BLOCK;
        float sg[16];
        for (int g = 0; g < 16; g++) {
            const __m256 v0 = _mm256_loadu_ps(x + b + 16 * g), v1 = _mm256_loadu_ps(x + b + 16 * g + 8);
            __m256i m = _mm256_max_epu32(_mm256_and_si256(_mm256_castps_si256(v0), absm),
                                         _mm256_and_si256(_mm256_castps_si256(v1), absm));
            __m128i h = _mm_max_epu32(_mm256_castsi256_si128(m), _mm256_extracti128_si256(m, 1));
            h = _mm_max_epu32(h, _mm_shuffle_epi32(h, 0x4E));
            h = _mm_max_epu32(h, _mm_shuffle_epi32(h, 0xB1));
            const int E = (int)((uint32_t)_mm_cvtsi128_si32(h) >> 23);
            sg[g] = E == 255 ? NAN : ldexpf(1.0f, E - 149);
            /* x 2^k exactly, as scalef: in two power-of-two steps, each a normal float; a step
             * that underflows leaves a value that rounds to 0 either way */
            const int k = E == 255 ? 0 : 149 - E, k1 = k / 2;
            const __m256 f1 = pow2_ps(k1), f2 = pow2_ps(k - k1);
            const __m256i X0 = _mm256_min_epi32(_mm256_cvtps_epi32(_mm256_mul_ps(_mm256_mul_ps(v0, f1), f2)), top);
            const __m256i X1 = _mm256_min_epi32(_mm256_cvtps_epi32(_mm256_mul_ps(_mm256_mul_ps(v1, f1), f2)), top);
            uint8_t dg[3][16];
            _mm_storeu_si128((__m128i *)(void *)dg[0], low_bytes16(X0, X1));
            _mm_storeu_si128((__m128i *)(void *)dg[1], low_bytes16(_mm256_srai_epi32(X0, 8), _mm256_srai_epi32(X1, 8)));
            _mm_storeu_si128((__m128i *)(void *)dg[2], low_bytes16(_mm256_srai_epi32(X0, 16), _mm256_srai_epi32(X1, 16)));
            xd4_put(o, g, dg);
        }
        xd4_scales(o, sg);
    }
}

/* dot_tile's state as the 512-bit dots keep it: the zmm's halves at 0 and 8, the ymm at 32 */
static TGTAV_INLINE void state_in256(const int R, const float *st, int first, __m256 acc[4][2], __m256 v[4])
{
#pragma GCC unroll 4
    for (int r = 0; r < R; r++) {
        acc[r][0] = first ? _mm256_setzero_ps() : _mm256_loadu_ps(st + r * CPU_TILE_STATE);
        acc[r][1] = first ? _mm256_setzero_ps() : _mm256_loadu_ps(st + r * CPU_TILE_STATE + 8);
        v[r] = first ? _mm256_setzero_ps() : _mm256_loadu_ps(st + r * CPU_TILE_STATE + 32);
    }
}
static TGTAV_INLINE void state_out256(const int R, float *st, const __m256 acc[4][2], const __m256 v[4])
{
#pragma GCC unroll 4
    for (int r = 0; r < R; r++) {
        _mm256_storeu_ps(st + r * CPU_TILE_STATE, acc[r][0]);
        _mm256_storeu_ps(st + r * CPU_TILE_STATE + 8, acc[r][1]);
        _mm256_storeu_ps(st + r * CPU_TILE_STATE + 32, v[r]);
    }
}

/* digits_fma at 256 bits: vector v is Q[v][0] | Q[v][1] (the zmm's lanes 0..7 | 8..15), dz and
 * acc likewise: lane by lane the same exact sums, conversions and FMAs */
static TGTAV_INLINE void digits_fma256(const __m256i Q[4][2], const uint8_t *D, const __m256 dz[2], __m256 acc[2],
                                       const bool q6)
{
#pragma GCC unroll 2
    for (int h = 0; h < 2; h++) {
#define XD4(v, d) _mm256_loadu_si256((const __m256i *)(const void *)(D + 192 * (v) + 64 * (d) + 32 * h))
        __m256i a = _mm256_dpbusd_avx_epi32(_mm256_setzero_si256(), Q[0][h], XD4(0, 2));
        __m256i c = _mm256_dpbusd_avx_epi32(_mm256_setzero_si256(), Q[2][h], XD4(2, 2));
        a = _mm256_dpbusd_avx_epi32(a, Q[1][h], XD4(1, 2));
        c = _mm256_dpbusd_avx_epi32(c, Q[3][h], XD4(3, 2));
#pragma GCC unroll 2
        for (int d = 1; d >= 0; d--) {
            if (q6 && d == 0) break;
            a = _mm256_dpbusd_avx_epi32(_mm256_slli_epi32(a, 8), XD4(0, d), Q[0][h]);
            c = _mm256_dpbusd_avx_epi32(_mm256_slli_epi32(c, 8), XD4(2, d), Q[2][h]);
            a = _mm256_dpbusd_avx_epi32(a, XD4(1, d), Q[1][h]);
            c = _mm256_dpbusd_avx_epi32(c, XD4(3, d), Q[3][h]);
        }
        __m256 t = _mm256_cvtepi32_ps(_mm256_add_epi32(a, c));
        if (q6) {
            __m256i e = _mm256_dpbusd_avx_epi32(_mm256_setzero_si256(), XD4(0, 0), Q[0][h]);
            __m256i f = _mm256_dpbusd_avx_epi32(_mm256_setzero_si256(), XD4(2, 0), Q[2][h]);
            e = _mm256_dpbusd_avx_epi32(e, XD4(1, 0), Q[1][h]);
            f = _mm256_dpbusd_avx_epi32(f, XD4(3, 0), Q[3][h]);
            t = _mm256_fmadd_ps(t, _mm256_set1_ps(256.0f), _mm256_cvtepi32_ps(_mm256_add_epi32(e, f)));
        }
#undef XD4
        acc[h] = _mm256_fmadd_ps(t, dz[h], acc[h]);
    }
}

static TGTAV_INLINE void dot_q4k_multiav(const uint8_t *row, const cpu_xsums *xs, const int R, uint64_t b0, uint64_t nb,
                                         float *st, int first, int last, float *out, uint64_t ldo)
{
    const __m256i m4 = _mm256_set1_epi8(0x0F);
    const __m256i sub0 = _mm256_setr_epi32(0, 2, 4, 6, 0, 2, 4, 6), sub1 = _mm256_setr_epi32(1, 3, 5, 7, 1, 3, 5, 7);
    __m256 acc[4][2], mins[4];
    state_in256(R, st, first, acc, mins);
    for (uint64_t b = b0; b < nb; b++) {
        const uint8_t *blk = row + b * Q4_K_BLOCK_BYTES;
        prefetch_ahead(blk, 3); /* a Q4_K block: 144 bytes */
        __m256 dsc, dmn;
        q4k_scales_vec(blk, &dsc, &dmn);
        /* the group-lane order: dword 8c + 4h' + v of chunk c in lane c (+ 4 in the upper 128 bits) of
         * vector v, a 4 x 4 dword transpose of the chunks' 128-bit halves */
        __m256i Y[4], Q[4][2];
#pragma GCC unroll 4
        for (int c = 0; c < 4; c++) Y[c] = _mm256_loadu_si256((const __m256i *)(const void *)(blk + 16 + 32 * c));
        const __m256i u01l = _mm256_unpacklo_epi32(Y[0], Y[1]), u01h = _mm256_unpackhi_epi32(Y[0], Y[1]);
        const __m256i u23l = _mm256_unpacklo_epi32(Y[2], Y[3]), u23h = _mm256_unpackhi_epi32(Y[2], Y[3]);
        const __m256i T[4] = {_mm256_unpacklo_epi64(u01l, u23l), _mm256_unpackhi_epi64(u01l, u23l),
                              _mm256_unpacklo_epi64(u01h, u23h), _mm256_unpackhi_epi64(u01h, u23h)};
#pragma GCC unroll 4
        for (int v = 0; v < 4; v++) {
            Q[v][0] = _mm256_and_si256(T[v], m4);
            Q[v][1] = _mm256_and_si256(_mm256_srli_epi32(T[v], 4), m4);
        }
        const __m256 dsc0 = _mm256_permutevar8x32_ps(dsc, sub0), dsc1 = _mm256_permutevar8x32_ps(dsc, sub1);
#pragma GCC unroll 4
        for (int r = 0; r < R; r++) {
            const uint8_t *D = xs[r].xd + b * CPU_XD_BLOCK;
            mins[r] = _mm256_fmadd_ps(dmn, _mm256_loadu_ps(xs[r].s32 + b * 8), mins[r]);
            const float *sl = (const float *)(const void *)(D + 768);
            const __m256 dz[2] = {_mm256_mul_ps(dsc0, _mm256_loadu_ps(sl)), _mm256_mul_ps(dsc1, _mm256_loadu_ps(sl + 8))};
            digits_fma256(Q, D, dz, acc[r], false);
        }
    }
    if (!last) {
        state_out256(R, st, acc, mins);
        return;
    }
#pragma GCC unroll 4
    for (int r = 0; r < R; r++)
        out[r * ldo] = hsum256(_mm256_add_ps(acc[r][0], acc[r][1])) - hsum256(mins[r]);
}

static TGTAV_INLINE void dot_q6k_multiav(const uint8_t *row, const cpu_xsums *xs, const int R, uint64_t b0, uint64_t nb,
                                         float *st, int first, int last, float *out, uint64_t ldo)
{
    /* the lanes' groups (the inverse of xd4_lane): 0 4 8 12 1 5 9 13 | 2 6 10 14 3 7 11 15, from ds[0] (groups
     * 0..7) in lanes 0, 1, 4, 5 of each half and ds[1] (8..15) in lanes 2, 3, 6, 7 */
    const __m256i g0 = _mm256_setr_epi32(0, 4, 0, 4, 1, 5, 1, 5), g1 = _mm256_setr_epi32(2, 6, 2, 6, 3, 7, 3, 7);
    __m256 acc[4][2], offs[4];
    state_in256(R, st, first, acc, offs);
    for (uint64_t b = b0; b < nb; b++) {
        const uint8_t *blk = row + b * Q6_K_BLOCK_BYTES;
        __m256 ds[2];
        q6k_block_head(blk, b, xs, R, ds, offs);
        const __m256 d16[2] = {
            _mm256_blend_ps(_mm256_permutevar8x32_ps(ds[0], g0), _mm256_permutevar8x32_ps(ds[1], g0), 0xCC),
            _mm256_blend_ps(_mm256_permutevar8x32_ps(ds[0], g1), _mm256_permutevar8x32_ps(ds[1], g1), 0xCC)};
        __m256i X[4][2], Q[4][2];
#pragma GCC unroll 2
        for (int n = 0; n < 2; n++) {
            __m256i q[4];
            q6k_quarters(blk, n, q);
            X[2 * n][0] = q[0];
            X[2 * n][1] = q[1];
            X[2 * n + 1][0] = q[2];
            X[2 * n + 1][1] = q[3];
        }
#pragma GCC unroll 2
        for (int h = 0; h < 2; h++) {
            const __m256i u01l = _mm256_unpacklo_epi32(X[0][h], X[1][h]), u01h = _mm256_unpackhi_epi32(X[0][h], X[1][h]);
            const __m256i u23l = _mm256_unpacklo_epi32(X[2][h], X[3][h]), u23h = _mm256_unpackhi_epi32(X[2][h], X[3][h]);
            Q[0][h] = _mm256_unpacklo_epi64(u01l, u23l);
            Q[1][h] = _mm256_unpackhi_epi64(u01l, u23l);
            Q[2][h] = _mm256_unpacklo_epi64(u01h, u23h);
            Q[3][h] = _mm256_unpackhi_epi64(u01h, u23h);
        }
#pragma GCC unroll 4
        for (int r = 0; r < R; r++) {
            const uint8_t *D = xs[r].xd + b * CPU_XD_BLOCK;
            const float *sl = (const float *)(const void *)(D + 768);
            const __m256 dz[2] = {_mm256_mul_ps(d16[0], _mm256_loadu_ps(sl)), _mm256_mul_ps(d16[1], _mm256_loadu_ps(sl + 8))};
            digits_fma256(Q, D, dz, acc[r], true);
        }
    }
    if (!last) {
        state_out256(R, st, acc, offs);
        return;
    }
#pragma GCC unroll 4
    for (int r = 0; r < R; r++)
        out[r * ldo] = hsum256(_mm256_add_ps(acc[r][0], acc[r][1])) - 32.0f * hsum256(offs[r]);
}

STATE_KERNELS(TGTAV, dot_q6k_a, dot_q6k_multiav)
STATE_KERNELS(TGTAV, dot_q4k_a, dot_q4k_multiav)
LEVEL_DOTS(TGTAV, avxvnni, dot_q4k_a, dot_q6k_a, avx2)
LEVEL_TILE(avxvnni, dot_q4k_a, dot_q6k_a)

static TGT void axpy_f16_avx2(float *o, float p, const uint16_t *v, uint32_t n)
{
    const __m256 pv = _mm256_set1_ps(p);
    uint32_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(o + i, _mm256_fmadd_ps(pv,
                                                _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(v + i))),
                                                _mm256_loadu_ps(o + i)));
    for (; i < n; i++)
        o[i] += p * muser_f16_to_f32(v[i]);
}

static TGT void f16_to_f32_avx2(const uint16_t *src, float *dst, uint32_t n)
{
    uint32_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(src + i))));
    for (; i < n; i++)
        dst[i] = muser_f16_to_f32(src[i]);
}

static TGT void f32_to_f16_avx2(const float *src, uint16_t *dst, uint32_t n)
{
    /* F16C rounds to nearest even, as muser_f32_to_f16 does, so both give the same bits. */
    uint32_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm_storeu_si128((__m128i *)(dst + i),
                         _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT));
    for (; i < n; i++)
        dst[i] = muser_f32_to_f16(src[i]);
}

static TGT float exp_sum_avx2(float *x, uint64_t n)
{
    __m256 s = _mm256_setzero_ps();
    uint64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m256 e = exp256(_mm256_loadu_ps(x + i));
        _mm256_storeu_ps(x + i, e);
        s = _mm256_add_ps(s, e);
    }
    float sum = hsum256(s);
    for (; i < n; i++) {
        x[i] = expf(x[i]);
        sum += x[i];
    }
    return sum;
}

static TGT void swiglu_avx2(float *g, const float *u, uint64_t n)
{
    const __m256 one = _mm256_set1_ps(1.0f);
    uint64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m256 x = _mm256_loadu_ps(g + i);
        const __m256 e = exp256(_mm256_sub_ps(_mm256_setzero_ps(), x));
        _mm256_storeu_ps(g + i, _mm256_mul_ps(_mm256_div_ps(x, _mm256_add_ps(one, e)),
                                              _mm256_loadu_ps(u + i)));
    }
    for (; i < n; i++)
        g[i] = g[i] / (1.0f + expf(-g[i])) * u[i];
}

static TGT void sigmoid_gate_avx2(float *o, const float *g, uint64_t n)
{
    const __m256 one = _mm256_set1_ps(1.0f);
    uint64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m256 e = exp256(_mm256_sub_ps(_mm256_setzero_ps(), _mm256_loadu_ps(g + i)));
        _mm256_storeu_ps(o + i, _mm256_div_ps(_mm256_loadu_ps(o + i), _mm256_add_ps(one, e)));
    }
    for (; i < n; i++)
        o[i] *= 1.0f / (1.0f + expf(-g[i]));
}

/* tanh(t) = sign(t) * (1 - 2 / (exp(2|t|) + 1)); exp256 saturates for large |t|, giving 1. */
static TGT bool logit_finish_avx2(float *y, uint64_t n, float scale, float cap)
{
    const __m256 sv = _mm256_set1_ps(scale), one = _mm256_set1_ps(1.0f), two = _mm256_set1_ps(2.0f);
    const __m256 sign = _mm256_set1_ps(-0.0f), inf = _mm256_set1_ps(INFINITY);
    __m256 bad = _mm256_setzero_ps();
    uint64_t i = 0;
    if (cap > 0.0f) {
        const __m256 cv = _mm256_set1_ps(cap), icv = _mm256_set1_ps(1.0f / cap);
        for (; i + 8 <= n; i += 8) {
            const __m256 z = _mm256_mul_ps(_mm256_loadu_ps(y + i), sv);
            /* non-finite input: |z| == inf or z != z */
            bad = _mm256_or_ps(bad, _mm256_cmp_ps(_mm256_andnot_ps(sign, z), inf, _CMP_NLT_UQ));
            const __m256 t = _mm256_mul_ps(z, icv);
            const __m256 at = _mm256_andnot_ps(sign, t);
            const __m256 e = exp256(_mm256_mul_ps(two, at));
            const __m256 th = _mm256_sub_ps(one, _mm256_div_ps(two, _mm256_add_ps(e, one)));
            _mm256_storeu_ps(y + i, _mm256_mul_ps(cv, _mm256_or_ps(th, _mm256_and_ps(sign, t))));
        }
    } else {
        for (; i + 8 <= n; i += 8) {
            const __m256 z = _mm256_mul_ps(_mm256_loadu_ps(y + i), sv);
            bad = _mm256_or_ps(bad, _mm256_cmp_ps(_mm256_andnot_ps(sign, z), inf, _CMP_NLT_UQ));
            _mm256_storeu_ps(y + i, z);
        }
    }
    bool ok = _mm256_movemask_ps(bad) == 0;
    return logit_finish_scalar(y + i, n - i, scale, cap) && ok;
}
#endif /* CPU_HAVE_X86 */

/* ---- selection ---- */

void cpu_kernels_init(cpu_kernels *k, bool force_scalar)
{
    *k = (cpu_kernels){
        .simd = false,
        .level = "scalar",
        .xsums = xsums_scalar,
        .dot_row = dot_row_scalar,
        .dot_rows = dot_rows_scalar,
        .dequant_row = quant_dequantize_row,
        .unpack_panel = unpack_panel_scalar,
        .pack_x = pack_x,
        .gemm_panel = gemm_panel_scalar,
        .dot_f16 = dot_f16_scalar,
        .axpy_f16 = axpy_f16_scalar,
        .f16_to_f32 = f16_to_f32_scalar,
        .f32_to_f16 = f32_to_f16_scalar,
        .exp_sum = exp_sum_scalar,
        .swiglu = swiglu_scalar,
        .sigmoid_gate = sigmoid_gate_scalar,
        .logit_finish = logit_finish_scalar,
    };
#ifdef CPU_HAVE_X86
    const char *env = getenv("MUSER_SIMD");
    if (force_scalar || (env && !strcmp(env, "0")))
        return;
    __builtin_cpu_init();
    if (!__builtin_cpu_supports("avx2") || !__builtin_cpu_supports("fma") ||
        !__builtin_cpu_supports("f16c")) /* the kernels convert halves with F16C */
        return;
    *k = (cpu_kernels){
        .simd = true,
        .level = "avx2",
        .xsums = xsums_avx2,
        .dot_row = dot_row_avx2,
        .dot_rows = dot_rows_avx2,
        .dequant_row = dequant_row_avx2,
        .unpack_panel = unpack_panel_avx2,
        .pack_x = pack_x,
        .gemm_panel = gemm_panel_avx2,
        .dot_f16 = dot_f16_avx2,
        .axpy_f16 = axpy_f16_avx2,
        .f16_to_f32 = f16_to_f32_avx2,
        .f32_to_f16 = f32_to_f16_avx2,
        .exp_sum = exp_sum_avx2,
        .swiglu = swiglu_avx2,
        .sigmoid_gate = sigmoid_gate_avx2,
        .logit_finish = logit_finish_avx2,
    };
    const bool keep_avx2 = env && !strcmp(env, "avx2"), keep_avxvnni = env && !strcmp(env, "avxvnni");
    /* AVX-VNNI (VEX, 256 bits): the digit dots on the AVX2 table, avx512vnni's bits (on an
     * AVX-512 CPU only where MUSER_SIMD=avxvnni asks for it) */
    if (__builtin_cpu_supports("avxvnni") && !keep_avx2 &&
        (keep_avxvnni || !__builtin_cpu_supports("avx512f") || !__builtin_cpu_supports("avx512dq"))) {
        k->level = "avxvnni";
        k->xsums = xsums_avxvnni;
        k->dot_row = dot_row_avxvnni;
        k->dot_rows = dot_rows_avxvnni;
        k->dot_tile = dot_tile_avxvnni;
        return;
    }
    /* AVX-512F widens the GEMM (MUSER_SIMD=avx2 keeps the AVX2 table, for tests) */
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512dq") && !keep_avx2 && !keep_avxvnni) {
        k->level = "avx512";
        k->xsums = xsums_avx512;
        k->dot_row = dot_row_avx512;
        k->dot_rows = dot_rows_avx512;
        k->pack_x = pack_x12;
        k->gemm_panel = gemm_panel_avx512;
        k->unpack_panel = unpack_panel_avx512;
        k->dot_tile = dot_tile_avx512;
        /* VNNI: the Q4_K and Q6_K decode dots on integer digits (MUSER_SIMD=avx512 keeps the f32 ones) */
        if (__builtin_cpu_supports("avx512vnni") && __builtin_cpu_supports("avx512bw") &&
            __builtin_cpu_supports("avx512vl") && !(env && !strcmp(env, "avx512"))) {
            k->level = "avx512vnni";
            k->xsums = xsums_vnni;
            k->dot_row = dot_row_vnni;
            k->dot_rows = dot_rows_vnni;
            k->dot_tile = dot_tile_vnni;
        }
    }
#else
    (void)force_scalar;
#endif
}

/* dst = x / sqrt(mean(x^2) + eps) * w (w NULL: weightless). Sum of squares in f64. */
void cpu_rms_row(const float *x, const float *w, float eps, float *dst, uint64_t n)
{
    double ss = 0.0;
    for (uint64_t i = 0; i < n; i++)
        ss += (double)x[i] * x[i];
    const float inv = (float)(1.0 / sqrt(ss / (double)n + eps));
    if (w)
        for (uint64_t i = 0; i < n; i++)
            dst[i] = x[i] * inv * w[i];
    else
        for (uint64_t i = 0; i < n; i++)
            dst[i] = x[i] * inv;
}
