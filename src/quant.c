/* quant.c — the block formats: type table, dequantize, quantize (scale search), and dot products
 * of a quantized row with an f32 vector, scalar and AVX2/FMA (chosen at run time).
 *
 * Layouts are ggml's (docs/quant.md draws them):
 *   Q8_0  [d:f16][qs:i8 x32]                                     w = d*q
 *   Q4_K  [d:f16][dmin:f16][scales:12][qs:128]                   w = d*sc[j]*q - dmin*m[j]
 *         8 sub-blocks of 32; qs byte 32c+l holds element 64c+l (low nibble, sub-block 2c) and
 *         element 64c+32+l (high nibble, sub-block 2c+1). scales packs eight 6-bit sc and eight
 *         6-bit m: bytes 0-3 sc[0..3] (+2 high bits of sc[4..7]), bytes 4-7 m[0..3] (+2 high bits
 *         of m[4..7]), bytes 8-11 low nibble sc[4..7], high nibble m[4..7].
 *   Q6_K  [ql:128][qh:64][scales:i8 x16][d:f16]                  w = d*sc[e/16]*(q-32)
 *         two halves of 128; in half h, for l < 32: ql[64h+l] low/high nibble = elements
 *         128h+l / 128h+64+l, ql[64h+32+l] low/high = 128h+32+l / 128h+96+l, and qh[32h+l] bits
 *         0-1, 2-3, 4-5, 6-7 are the top two bits of 128h+l, +32+l, +64+l, +96+l.
 *
 * The SIMD functions carry __attribute__((target)) so the default build stays portable; the
 * dispatcher only calls them after cpuid says the CPU has AVX2, FMA and F16C. */
#include "quant.h"

#include "util.h"

#include <ctype.h>
#include <math.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#if defined(__x86_64__) || defined(__i386__)
#define QUANT_X86 1
#include <immintrin.h>
#endif

/* ---- the type table ---- */

static const quant_type_info type_table[GGML_TYPE_COUNT] = {
    [GGML_TYPE_F32] = {"f32", 1, 4, true},
    [GGML_TYPE_F16] = {"f16", 1, 2, true},
    [GGML_TYPE_Q4_0] = {"q4_0", 32, 18, false},
    [GGML_TYPE_Q4_1] = {"q4_1", 32, 20, false},
    [GGML_TYPE_Q5_0] = {"q5_0", 32, 22, false},
    [GGML_TYPE_Q5_1] = {"q5_1", 32, 24, false},
    [GGML_TYPE_Q8_0] = {"q8_0", 32, 34, true},
    [GGML_TYPE_Q8_1] = {"q8_1", 32, 36, false},
    [GGML_TYPE_Q2_K] = {"q2_k", 256, 84, false},
    [GGML_TYPE_Q3_K] = {"q3_k", 256, 110, false},
    [GGML_TYPE_Q4_K] = {"q4_k", 256, 144, true},
    [GGML_TYPE_Q5_K] = {"q5_k", 256, 176, false},
    [GGML_TYPE_Q6_K] = {"q6_k", 256, 210, true},
    [GGML_TYPE_Q8_K] = {"q8_k", 256, 292, false},
    [GGML_TYPE_IQ2_XXS] = {"iq2_xxs", 256, 66, false},
    [GGML_TYPE_IQ2_XS] = {"iq2_xs", 256, 74, false},
    [GGML_TYPE_IQ3_XXS] = {"iq3_xxs", 256, 98, false},
    [GGML_TYPE_IQ1_S] = {"iq1_s", 256, 50, false},
    [GGML_TYPE_IQ4_NL] = {"iq4_nl", 32, 18, false},
    [GGML_TYPE_IQ3_S] = {"iq3_s", 256, 110, false},
    [GGML_TYPE_IQ2_S] = {"iq2_s", 256, 82, false},
    [GGML_TYPE_IQ4_XS] = {"iq4_xs", 256, 136, false},
    [GGML_TYPE_I8] = {"i8", 1, 1, false},
    [GGML_TYPE_I16] = {"i16", 1, 2, false},
    [GGML_TYPE_I32] = {"i32", 1, 4, false},
    [GGML_TYPE_I64] = {"i64", 1, 8, false},
    [GGML_TYPE_F64] = {"f64", 1, 8, false},
    [GGML_TYPE_IQ1_M] = {"iq1_m", 256, 56, false},
    [GGML_TYPE_BF16] = {"bf16", 1, 2, true},
    [GGML_TYPE_TQ1_0] = {"tq1_0", 256, 54, false},
    [GGML_TYPE_TQ2_0] = {"tq2_0", 256, 66, false},
    [GGML_TYPE_MXFP4] = {"mxfp4", 32, 17, false},
};

const quant_type_info *quant_info(uint32_t type)
{
    if (type >= GGML_TYPE_COUNT || !type_table[type].name)
        return NULL;
    return &type_table[type];
}

int quant_type_from_name(const char *name)
{
    if (!name)
        return -1;
    for (uint32_t t = 0; t < GGML_TYPE_COUNT; t++) {
        const char *tn = type_table[t].name;
        if (!tn)
            continue;
        size_t i = 0;
        while (tn[i] && name[i] && tolower((unsigned char)name[i]) == tn[i])
            i++;
        if (!tn[i] && !name[i])
            return (int)t;
    }
    return -1;
}

uint64_t quant_row_bytes(uint32_t type, uint64_t n)
{
    const quant_type_info *ti = quant_info(type);
    if (!ti || n % ti->block_elems)
        return 0;
    return n / ti->block_elems * ti->block_bytes;
}

/* True when type is one muser computes with and n fits its block. */
static bool row_ok(uint32_t type, uint64_t n)
{
    const quant_type_info *ti = quant_info(type);
    return ti && ti->supported && n % ti->block_elems == 0;
}

static int row_check(uint32_t type, uint64_t n)
{
    const quant_type_info *ti = quant_info(type);
    if (!ti || !ti->supported)
        return MUSER_E_UNSUPPORTED;
    if (n % ti->block_elems)
        return MUSER_E_ARG;
    return MUSER_OK;
}

/* ---- small helpers ---- */

static inline float rd_f16(const uint8_t *p)
{
    uint16_t h;
    memcpy(&h, p, 2);
    return muser_f16_to_f32(h);
}

static inline void wr_f16(uint8_t *p, float f)
{
    uint16_t h = muser_f32_to_f16(f);
    memcpy(p, &h, 2);
}

/* The value an f32 takes once stored as f16 (scales are stored that way). */
static inline float f16_round(float f) { return muser_f16_to_f32(muser_f32_to_f16(f)); }

/* min/max without libm calls (fminf/fmaxf are not inlined under strict IEEE semantics); the
 * first argument wins on NaN, and no caller passes one where it matters. */
static inline float minf(float a, float b) { return b < a ? b : a; }
static inline float maxf(float a, float b) { return b > a ? b : a; }

static inline int clampi(int v, int lo, int hi) { return v < lo ? lo : v > hi ? hi : v; }

/* Nearest integer to f clamped to [lo, hi] (|lo|, |hi| < 2^22), ties to even like lrintf:
 * clamp in float (NaN becomes lo), then add 1.5*2^23 so the integer lands in the low mantissa
 * bits. Inline and branch-free: the quantizers call it for every element of every candidate. */
static inline int round_clamp(float f, int lo, int hi)
{
    f = f >= (float)lo ? f : (float)lo;
    f = f <= (float)hi ? f : (float)hi;
    float t = f + 12582912.0f;
    int32_t i;
    memcpy(&i, &t, 4);
    return i - 0x4B400000;
}

/* Q4_K: 12 packed bytes -> eight 6-bit scales and mins. */
static inline void q4k_unpack_scales(const uint8_t *s, uint8_t sc[8], uint8_t mn[8])
{
    for (int j = 0; j < 4; j++) {
        sc[j] = s[j] & 63;
        mn[j] = s[j + 4] & 63;
        sc[j + 4] = (uint8_t)((s[j + 8] & 0x0f) | ((s[j] >> 6) << 4));
        mn[j + 4] = (uint8_t)((s[j + 8] >> 4) | ((s[j + 4] >> 6) << 4));
    }
}

static inline void q4k_pack_scales(uint8_t *s, const uint8_t sc[8], const uint8_t mn[8])
{
    for (int j = 0; j < 4; j++) {
        s[j] = (uint8_t)((sc[j] & 63) | ((sc[j + 4] >> 4) << 6));
        s[j + 4] = (uint8_t)((mn[j] & 63) | ((mn[j + 4] >> 4) << 6));
        s[j + 8] = (uint8_t)((sc[j + 4] & 0x0f) | ((mn[j + 4] & 0x0f) << 4));
    }
}

/* ---- dequantize: one block -> f32 ---- */

static void deq_q8_0(const uint8_t *b, float *y)
{
    float d = rd_f16(b);
    const int8_t *q = (const int8_t *)(b + 2);
    for (int i = 0; i < QK8_0; i++)
        y[i] = d * (float)q[i];
}

static void deq_q4_k(const uint8_t *b, float *y)
{
    float d = rd_f16(b), dmin = rd_f16(b + 2);
    uint8_t sc[8], mn[8];
    q4k_unpack_scales(b + 4, sc, mn);
    const uint8_t *qs = b + 16;
    for (int c = 0; c < 4; c++) {
        float d1 = d * sc[2 * c], m1 = dmin * mn[2 * c];
        float d2 = d * sc[2 * c + 1], m2 = dmin * mn[2 * c + 1];
        for (int l = 0; l < 32; l++) {
            y[64 * c + l] = d1 * (float)(qs[32 * c + l] & 0x0f) - m1;
            y[64 * c + 32 + l] = d2 * (float)(qs[32 * c + l] >> 4) - m2;
        }
    }
}

static void deq_q6_k(const uint8_t *b, float *y)
{
    const uint8_t *ql = b, *qh = b + 128;
    const int8_t *sc = (const int8_t *)(b + 192);
    float d = rd_f16(b + 208);
    for (int h = 0; h < 2; h++) {
        const uint8_t *L = ql + 64 * h, *H = qh + 32 * h;
        const int8_t *S = sc + 8 * h;
        float *Y = y + 128 * h;
        for (int l = 0; l < 32; l++) {
            int g = l / 16;
            int q1 = ((L[l] & 0x0f) | ((H[l] & 3) << 4)) - 32;
            int q2 = ((L[l + 32] & 0x0f) | (((H[l] >> 2) & 3) << 4)) - 32;
            int q3 = ((L[l] >> 4) | (((H[l] >> 4) & 3) << 4)) - 32;
            int q4 = ((L[l + 32] >> 4) | (((H[l] >> 6) & 3) << 4)) - 32;
            Y[l] = d * (float)S[g] * (float)q1;
            Y[l + 32] = d * (float)S[g + 2] * (float)q2;
            Y[l + 64] = d * (float)S[g + 4] * (float)q3;
            Y[l + 96] = d * (float)S[g + 6] * (float)q4;
        }
    }
}

/* Dequantize elements [0, len) of a row starting at element `first` (a block boundary). */
static void deq_range(uint32_t type, const void *row, uint64_t first, uint64_t len, float *y)
{
    const uint8_t *r = row;
    switch (type) {
    case GGML_TYPE_F32:
        memcpy(y, r + 4 * first, len * 4);
        break;
    case GGML_TYPE_F16:
        for (uint64_t i = 0; i < len; i++)
            y[i] = rd_f16(r + 2 * (first + i));
        break;
    case GGML_TYPE_BF16:
        for (uint64_t i = 0; i < len; i++) {
            uint16_t h;
            memcpy(&h, r + 2 * (first + i), 2);
            y[i] = muser_bf16_to_f32(h);
        }
        break;
    case GGML_TYPE_Q8_0:
        for (uint64_t b = 0; b < len / QK8_0; b++)
            deq_q8_0(r + (first / QK8_0 + b) * Q8_0_BLOCK_BYTES, y + b * QK8_0);
        break;
    case GGML_TYPE_Q4_K:
        for (uint64_t b = 0; b < len / QK_K; b++)
            deq_q4_k(r + (first / QK_K + b) * Q4_K_BLOCK_BYTES, y + b * QK_K);
        break;
    case GGML_TYPE_Q6_K:
        for (uint64_t b = 0; b < len / QK_K; b++)
            deq_q6_k(r + (first / QK_K + b) * Q6_K_BLOCK_BYTES, y + b * QK_K);
        break;
    default:
        break;
    }
}

int quant_dequantize_row(uint32_t type, const void *src, float *dst, uint64_t n)
{
    int rc = row_check(type, n);
    if (rc)
        return rc;
    deq_range(type, src, 0, n, dst);
    return MUSER_OK;
}

/* ---- quantize ----
 * Each format: fit each sub-block's scale (and min) by trying candidate scales around the
 * max-abs one, refitting by least squares and keeping the least squared error; then quantize the
 * sub-block scales against the super-block scale and try +-1 on each quantized scale, requantizing
 * the elements, to recover what the 6/8-bit scale rounding lost. All deterministic. */

/* Q8_0: try inverse scales t/amax, t from 127 down to 123.5, each refit by least squares; the
 * candidate d is rounded to f16 before the elements are requantized and the error measured. */
static void quant_q8_0_block(const float *x, uint8_t *out)
{
    float amax = 0.0f;
    for (int i = 0; i < QK8_0; i++)
        amax = maxf(amax, fabsf(x[i]));
    int8_t *qs = (int8_t *)(out + 2);
    if (!(amax > 0.0f) || !isfinite(amax)) {
        wr_f16(out, 0.0f);
        memset(qs, 0, QK8_0);
        return;
    }
    float best_d = f16_round(amax / 127.0f), best_err = INFINITY;
    for (int k = 0; k < 8; k++) {
        float iscale = (127.0f - 0.5f * (float)k) / amax;
        float sxq = 0.0f, sqq = 0.0f;
        for (int i = 0; i < QK8_0; i++) {
            float q = (float)round_clamp(x[i] * iscale, -127, 127);
            sxq += x[i] * q;
            sqq += q * q;
        }
        float cands[2] = {1.0f / iscale, sqq > 0.0f ? sxq / sqq : 1.0f / iscale};
        for (int c = 0; c < 2; c++) {
            float d = f16_round(cands[c]);
            if (!(d > 0.0f) || !isfinite(d))
                continue;
            float id = 1.0f / d, err = 0.0f;
            for (int i = 0; i < QK8_0; i++) {
                float e = d * (float)round_clamp(x[i] * id, -127, 127) - x[i];
                err += e * e;
            }
            if (err < best_err) {
                best_err = err;
                best_d = d;
            }
        }
    }
    wr_f16(out, best_d);
    float id = best_d > 0.0f ? 1.0f / best_d : 0.0f;
    for (int i = 0; i < QK8_0; i++)
        qs[i] = (int8_t)round_clamp(x[i] * id, -127, 127);
}

/* Squared error of a Q4_K sub-block of 32 under w = s*q - m, q = nearest in [0, 15]. */
static float q4_sub_err(const float *x, float s, float m)
{
    float err = 0.0f;
    if (s > 0.0f) {
        float is = 1.0f / s;
        for (int i = 0; i < 32; i++) {
            int q = round_clamp((x[i] + m) * is, 0, 15);
            float e = s * (float)q - m - x[i];
            err += e * e;
        }
    } else {
        for (int i = 0; i < 32; i++)
            err += (x[i] + m) * (x[i] + m);
    }
    return err;
}

/* Fit (s, m >= 0) for one sub-block of 32 so s*q - m, q in [0, 15], is close to x. */
static void q4_fit_sub(const float *x, float *s_out, float *m_out)
{
    float xmin = x[0], xmax = x[0];
    for (int i = 1; i < 32; i++) {
        xmin = minf(xmin, x[i]);
        xmax = maxf(xmax, x[i]);
    }
    if (xmin > 0.0f)
        xmin = 0.0f; /* the min term only subtracts */
    if (!(xmax - xmin > 1e-30f)) {
        *s_out = 0.0f;
        *m_out = -xmin;
        return;
    }
    float best_s = (xmax - xmin) / 15.0f, best_m = -xmin;
    float best_err = q4_sub_err(x, best_s, best_m);
    for (int k = -6; k <= 4; k++) {
        float iscale = (15.0f + 0.25f * (float)k) / (xmax - xmin);
        float sq = 0.0f, sqq = 0.0f, sx = 0.0f, sxq = 0.0f;
        for (int i = 0; i < 32; i++) {
            float q = (float)round_clamp((x[i] - xmin) * iscale, 0, 15);
            sq += q;
            sqq += q * q;
            sx += x[i];
            sxq += x[i] * q;
        }
        /* least squares for x ~ s*q + b, with b = -m <= 0 */
        float det = 32.0f * sqq - sq * sq, s, b;
        if (!(det > 0.0f))
            continue;
        s = (32.0f * sxq - sq * sx) / det;
        b = (sqq * sx - sq * sxq) / det;
        if (b > 0.0f) {
            b = 0.0f;
            s = sqq > 0.0f ? sxq / sqq : 0.0f;
        }
        if (!(s > 0.0f))
            continue;
        float err = q4_sub_err(x, s, -b);
        if (err < best_err) {
            best_err = err;
            best_s = s;
            best_m = -b;
        }
    }
    *s_out = best_s;
    *m_out = best_m;
}

static void quant_q4_k_block(const float *x, uint8_t *out)
{
    float s[8], m[8], maxs = 0.0f, maxm = 0.0f;
    for (int j = 0; j < 8; j++) {
        q4_fit_sub(x + 32 * j, &s[j], &m[j]);
        maxs = maxf(maxs, s[j]);
        maxm = maxf(maxm, m[j]);
    }
    float d = f16_round(minf(maxs / 63.0f, 65504.0f));
    float dmin = f16_round(minf(maxm / 63.0f, 65504.0f));
    uint8_t sc[8], mn[8];
    for (int j = 0; j < 8; j++) {
        int isc = d > 0.0f ? round_clamp(s[j] / d, 0, 63) : 0;
        int imn = dmin > 0.0f ? round_clamp(m[j] / dmin, 0, 63) : 0;
        /* the 6-bit rounding moved (s, m): try the neighbours with the elements requantized */
        int bsc = isc, bmn = imn;
        float best = INFINITY;
        for (int a = -1; a <= 1; a++) {
            for (int c = -1; c <= 1; c++) {
                int tsc = isc + a, tmn = imn + c;
                if (tsc < 0 || tsc > 63 || tmn < 0 || tmn > 63)
                    continue;
                float err = q4_sub_err(x + 32 * j, d * (float)tsc, dmin * (float)tmn);
                if (err < best) {
                    best = err;
                    bsc = tsc;
                    bmn = tmn;
                }
            }
        }
        sc[j] = (uint8_t)bsc;
        mn[j] = (uint8_t)bmn;
    }
    wr_f16(out, d);
    wr_f16(out + 2, dmin);
    q4k_pack_scales(out + 4, sc, mn);
    uint8_t q[QK_K];
    for (int j = 0; j < 8; j++) {
        float es = d * (float)sc[j], em = dmin * (float)mn[j];
        float is = es > 0.0f ? 1.0f / es : 0.0f;
        for (int i = 0; i < 32; i++)
            q[32 * j + i] = es > 0.0f ? (uint8_t)round_clamp((x[32 * j + i] + em) * is, 0, 15)
                                      : 0;
    }
    uint8_t *qs = out + 16;
    for (int c = 0; c < 4; c++)
        for (int l = 0; l < 32; l++)
            qs[32 * c + l] = (uint8_t)(q[64 * c + l] | (q[64 * c + 32 + l] << 4));
}

/* Squared error of a Q6_K sub-block of 16 under w = s*q, q = nearest in [-32, 31]. */
static float q6_sub_err(const float *x, float s)
{
    float err = 0.0f;
    if (s != 0.0f) {
        float is = 1.0f / s;
        for (int i = 0; i < 16; i++) {
            float e = s * (float)round_clamp(x[i] * is, -32, 31) - x[i];
            err += e * e;
        }
    } else {
        for (int i = 0; i < 16; i++)
            err += x[i] * x[i];
    }
    return err;
}

/* Fit a signed scale for 16 elements: the largest-magnitude element v is mapped near -32 (the
 * extra negative level) or near +31, each candidate refit by least squares. */
static float q6_fit_sub(const float *x)
{
    float v = 0.0f;
    for (int i = 0; i < 16; i++)
        if (fabsf(x[i]) > fabsf(v))
            v = x[i];
    if (!(fabsf(v) > 1e-30f) || !isfinite(v))
        return 0.0f;
    float best_s = -v / 32.0f, best_err = q6_sub_err(x, best_s);
    for (int k = 0; k < 14; k++) {
        /* t: -32.5 .. -29.5 then 31.5 .. 28.5 */
        float t = k < 7 ? -32.5f + 0.5f * (float)k : 31.5f - 0.5f * (float)(k - 7);
        float iscale = t / v, sxq = 0.0f, sqq = 0.0f;
        for (int i = 0; i < 16; i++) {
            float q = (float)round_clamp(x[i] * iscale, -32, 31);
            sxq += x[i] * q;
            sqq += q * q;
        }
        if (!(sqq > 0.0f))
            continue;
        float s = sxq / sqq, err = q6_sub_err(x, s);
        if (err < best_err) {
            best_err = err;
            best_s = s;
        }
    }
    return best_s;
}

static void quant_q6_k_block(const float *x, uint8_t *out)
{
    float s[16], maxs = 0.0f;
    for (int j = 0; j < 16; j++) {
        s[j] = q6_fit_sub(x + 16 * j);
        maxs = maxf(maxs, fabsf(s[j]));
    }
    float d = f16_round(minf(maxs / 127.0f, 65504.0f));
    int8_t sc[16];
    for (int j = 0; j < 16; j++) {
        int isc = d > 0.0f ? round_clamp(s[j] / d, -128, 127) : 0;
        int bsc = isc;
        float best = INFINITY;
        for (int a = -1; a <= 1; a++) {
            int t = isc + a;
            if (t < -128 || t > 127)
                continue;
            float err = q6_sub_err(x + 16 * j, d * (float)t);
            if (err < best) {
                best = err;
                bsc = t;
            }
        }
        sc[j] = (int8_t)bsc;
    }
    uint8_t q[QK_K]; /* q + 32, in [0, 63] */
    for (int j = 0; j < 16; j++) {
        float es = d * (float)sc[j], is = es != 0.0f ? 1.0f / es : 0.0f;
        for (int i = 0; i < 16; i++)
            q[16 * j + i] = (uint8_t)(round_clamp(x[16 * j + i] * is, -32, 31) + 32);
    }
    uint8_t *ql = out, *qh = out + 128;
    for (int h = 0; h < 2; h++) {
        const uint8_t *Q = q + 128 * h;
        for (int l = 0; l < 32; l++) {
            ql[64 * h + l] = (uint8_t)((Q[l] & 0x0f) | ((Q[l + 64] & 0x0f) << 4));
            ql[64 * h + 32 + l] = (uint8_t)((Q[l + 32] & 0x0f) | ((Q[l + 96] & 0x0f) << 4));
            qh[32 * h + l] = (uint8_t)((Q[l] >> 4) | ((Q[l + 32] >> 4) << 2) |
                                       ((Q[l + 64] >> 4) << 4) | ((Q[l + 96] >> 4) << 6));
        }
    }
    memcpy(out + 192, sc, 16);
    wr_f16(out + 208, d);
}

int quant_quantize_row(uint32_t type, const float *src, void *dst, uint64_t n)
{
    int rc = row_check(type, n);
    if (rc)
        return rc;
    uint8_t *o = dst;
    switch (type) {
    case GGML_TYPE_F32:
        memcpy(o, src, n * 4);
        break;
    case GGML_TYPE_F16:
        for (uint64_t i = 0; i < n; i++)
            wr_f16(o + 2 * i, src[i]);
        break;
    case GGML_TYPE_BF16:
        for (uint64_t i = 0; i < n; i++) {
            uint16_t h = muser_f32_to_bf16(src[i]);
            memcpy(o + 2 * i, &h, 2);
        }
        break;
    case GGML_TYPE_Q8_0:
        for (uint64_t b = 0; b < n / QK8_0; b++)
            quant_q8_0_block(src + b * QK8_0, o + b * Q8_0_BLOCK_BYTES);
        break;
    case GGML_TYPE_Q4_K:
        for (uint64_t b = 0; b < n / QK_K; b++)
            quant_q4_k_block(src + b * QK_K, o + b * Q4_K_BLOCK_BYTES);
        break;
    case GGML_TYPE_Q6_K:
        for (uint64_t b = 0; b < n / QK_K; b++)
            quant_q6_k_block(src + b * QK_K, o + b * Q6_K_BLOCK_BYTES);
        break;
    default:
        return MUSER_E_UNSUPPORTED;
    }
    return MUSER_OK;
}

/* ---- scalar dots (the reference for the SIMD ones) ---- */

static float dot_f32_scalar(const float *a, const float *b, uint64_t n)
{
    float s = 0.0f;
    for (uint64_t i = 0; i < n; i++)
        s += a[i] * b[i];
    return s;
}

static float dot_q8_0_scalar(const uint8_t *r, const float *x, uint64_t nb)
{
    float s = 0.0f;
    for (uint64_t b = 0; b < nb; b++, r += Q8_0_BLOCK_BYTES, x += QK8_0) {
        const int8_t *q = (const int8_t *)(r + 2);
        float bs = 0.0f;
        for (int i = 0; i < QK8_0; i++)
            bs += (float)q[i] * x[i];
        s += rd_f16(r) * bs;
    }
    return s;
}

/* Per sub-block j: d*sc[j]*sum(q*x) - dmin*m[j]*sum(x). */
static float dot_q4_k_scalar(const uint8_t *r, const float *x, uint64_t nb)
{
    float s = 0.0f;
    for (uint64_t b = 0; b < nb; b++, r += Q4_K_BLOCK_BYTES, x += QK_K) {
        float d = rd_f16(r), dmin = rd_f16(r + 2);
        uint8_t sc[8], mn[8];
        q4k_unpack_scales(r + 4, sc, mn);
        const uint8_t *qs = r + 16;
        for (int c = 0; c < 4; c++) {
            float qx1 = 0.0f, qx2 = 0.0f, sx1 = 0.0f, sx2 = 0.0f;
            for (int l = 0; l < 32; l++) {
                float x1 = x[64 * c + l], x2 = x[64 * c + 32 + l];
                qx1 += (float)(qs[32 * c + l] & 0x0f) * x1;
                qx2 += (float)(qs[32 * c + l] >> 4) * x2;
                sx1 += x1;
                sx2 += x2;
            }
            s += d * (float)sc[2 * c] * qx1 - dmin * (float)mn[2 * c] * sx1;
            s += d * (float)sc[2 * c + 1] * qx2 - dmin * (float)mn[2 * c + 1] * sx2;
        }
    }
    return s;
}

static float dot_q6_k_scalar(const uint8_t *r, const float *x, uint64_t nb)
{
    float s = 0.0f;
    for (uint64_t b = 0; b < nb; b++, r += Q6_K_BLOCK_BYTES, x += QK_K) {
        const uint8_t *ql = r, *qh = r + 128;
        const int8_t *sc = (const int8_t *)(r + 192);
        float d = rd_f16(r + 208);
        float g[16] = {0}; /* sum((q-32)*x) per 16-element group */
        for (int h = 0; h < 2; h++) {
            const uint8_t *L = ql + 64 * h, *H = qh + 32 * h;
            const float *X = x + 128 * h;
            float *G = g + 8 * h;
            for (int l = 0; l < 32; l++) {
                int gi = l / 16;
                G[gi] += (float)(((L[l] & 0x0f) | ((H[l] & 3) << 4)) - 32) * X[l];
                G[gi + 2] += (float)(((L[l + 32] & 0x0f) | (((H[l] >> 2) & 3) << 4)) - 32) * X[l + 32];
                G[gi + 4] += (float)(((L[l] >> 4) | (((H[l] >> 4) & 3) << 4)) - 32) * X[l + 64];
                G[gi + 6] += (float)(((L[l + 32] >> 4) | (((H[l] >> 6) & 3) << 4)) - 32) * X[l + 96];
            }
        }
        float bs = 0.0f;
        for (int j = 0; j < 16; j++)
            bs += (float)sc[j] * g[j];
        s += d * bs;
    }
    return s;
}

float quant_dot_scalar(uint32_t type, const void *row, const float *x, uint64_t n)
{
    if (!row_ok(type, n))
        return NAN;
    const uint8_t *r = row;
    switch (type) {
    case GGML_TYPE_F32:
        return dot_f32_scalar(row, x, n);
    case GGML_TYPE_F16: {
        float s = 0.0f;
        for (uint64_t i = 0; i < n; i++)
            s += rd_f16(r + 2 * i) * x[i];
        return s;
    }
    case GGML_TYPE_BF16: {
        float s = 0.0f;
        for (uint64_t i = 0; i < n; i++) {
            uint16_t h;
            memcpy(&h, r + 2 * i, 2);
            s += muser_bf16_to_f32(h) * x[i];
        }
        return s;
    }
    case GGML_TYPE_Q8_0:
        return dot_q8_0_scalar(r, x, n / QK8_0);
    case GGML_TYPE_Q4_K:
        return dot_q4_k_scalar(r, x, n / QK_K);
    case GGML_TYPE_Q6_K:
        return dot_q6_k_scalar(r, x, n / QK_K);
    }
    return NAN;
}

double quant_dot_f64(uint32_t type, const void *row, const float *x, uint64_t n)
{
    if (!row_ok(type, n))
        return NAN;
    float w[QK_K];
    double s = 0.0;
    for (uint64_t off = 0; off < n; off += QK_K) {
        uint64_t len = n - off < QK_K ? n - off : QK_K; /* a multiple of the block: n is */
        deq_range(type, row, off, len, w);
        for (uint64_t i = 0; i < len; i++)
            s += (double)w[i] * (double)x[off + i];
    }
    return s;
}

/* ---- AVX2 + FMA (+F16C) dots ---- */
#ifdef QUANT_X86
#define SIMD_FN __attribute__((target("avx2,fma,f16c")))

SIMD_FN static inline float hsum8(__m256 v)
{
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

SIMD_FN static inline float f16_at(const uint8_t *p)
{
    uint16_t h;
    memcpy(&h, p, 2);
    return _cvtsh_ss(h);
}

/* 8 bytes -> 8 int32 lanes */
SIMD_FN static inline __m256i load8_u8(const uint8_t *p)
{
    return _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)p));
}

SIMD_FN static float dot_f32_avx2(const float *a, const float *b, uint64_t n)
{
    __m256 s0 = _mm256_setzero_ps(), s1 = s0, s2 = s0, s3 = s0;
    uint64_t i = 0;
    for (; i + 32 <= n; i += 32) {
        s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), s0);
        s1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8), s1);
        s2 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 16), _mm256_loadu_ps(b + i + 16), s2);
        s3 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 24), _mm256_loadu_ps(b + i + 24), s3);
    }
    for (; i + 8 <= n; i += 8)
        s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), s0);
    float s = hsum8(_mm256_add_ps(_mm256_add_ps(s0, s1), _mm256_add_ps(s2, s3)));
    for (; i < n; i++)
        s += a[i] * b[i];
    return s;
}

SIMD_FN static float dot_f16_avx2(const uint8_t *r, const float *x, uint64_t n)
{
    __m256 s0 = _mm256_setzero_ps(), s1 = s0;
    uint64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m256 w0 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(r + 2 * i)));
        __m256 w1 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(r + 2 * i + 16)));
        s0 = _mm256_fmadd_ps(w0, _mm256_loadu_ps(x + i), s0);
        s1 = _mm256_fmadd_ps(w1, _mm256_loadu_ps(x + i + 8), s1);
    }
    float s = hsum8(_mm256_add_ps(s0, s1));
    for (; i < n; i++)
        s += rd_f16(r + 2 * i) * x[i];
    return s;
}

SIMD_FN static float dot_bf16_avx2(const uint8_t *r, const float *x, uint64_t n)
{
    __m256 s0 = _mm256_setzero_ps(), s1 = s0;
    uint64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m256i h = _mm256_loadu_si256((const __m256i *)(r + 2 * i));
        __m256 w0 = _mm256_castsi256_ps(
            _mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm256_castsi256_si128(h)), 16));
        __m256 w1 = _mm256_castsi256_ps(
            _mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm256_extracti128_si256(h, 1)), 16));
        s0 = _mm256_fmadd_ps(w0, _mm256_loadu_ps(x + i), s0);
        s1 = _mm256_fmadd_ps(w1, _mm256_loadu_ps(x + i + 8), s1);
    }
    float s = hsum8(_mm256_add_ps(s0, s1));
    for (; i < n; i++) {
        uint16_t h;
        memcpy(&h, r + 2 * i, 2);
        s += muser_bf16_to_f32(h) * x[i];
    }
    return s;
}

SIMD_FN static float dot_q8_0_avx2(const uint8_t *r, const float *x, uint64_t nb)
{
    __m256 acc = _mm256_setzero_ps();
    for (uint64_t b = 0; b < nb; b++, r += Q8_0_BLOCK_BYTES, x += QK8_0) {
        const __m128i *q = (const __m128i *)(r + 2);
        __m128i q0 = _mm_loadu_si128(q), q1 = _mm_loadu_si128(q + 1);
        __m256 w0 = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q0));
        __m256 w1 = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_unpackhi_epi64(q0, q0)));
        __m256 w2 = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q1));
        __m256 w3 = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_unpackhi_epi64(q1, q1)));
        __m256 s01 = _mm256_mul_ps(w0, _mm256_loadu_ps(x));
        __m256 s23 = _mm256_mul_ps(w2, _mm256_loadu_ps(x + 16));
        s01 = _mm256_fmadd_ps(w1, _mm256_loadu_ps(x + 8), s01);
        s23 = _mm256_fmadd_ps(w3, _mm256_loadu_ps(x + 24), s23);
        acc = _mm256_fmadd_ps(_mm256_add_ps(s01, s23), _mm256_set1_ps(f16_at(r)), acc);
    }
    return hsum8(acc);
}

/* Q4_K scale bytes -> d*sc[0..7] and dmin*m[0..7] as 8 lanes each. The 12 bytes read as three
 * little-endian words: word 0 holds sc[0..3] (low 6 bits of each byte) and the top bits of
 * sc[4..7]; word 1 the same for the mins; word 2 the low nibbles of sc[4..7] and m[4..7]. */
SIMD_FN static inline void q4k_scales_avx2(const uint8_t *s, float d, float dmin, __m256 *dsc,
                                           __m256 *dmn)
{
    uint32_t w[3];
    memcpy(w, s, 12);
    uint32_t sc_lo = w[0] & 0x3f3f3f3fu, mn_lo = w[1] & 0x3f3f3f3fu;
    uint32_t sc_hi = (w[2] & 0x0f0f0f0fu) | (((w[0] >> 6) & 0x03030303u) << 4);
    uint32_t mn_hi = ((w[2] >> 4) & 0x0f0f0f0fu) | (((w[1] >> 6) & 0x03030303u) << 4);
    __m128i sc8 = _mm_cvtsi64_si128((long long)((uint64_t)sc_hi << 32 | sc_lo));
    __m128i mn8 = _mm_cvtsi64_si128((long long)((uint64_t)mn_hi << 32 | mn_lo));
    *dsc = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(sc8)), _mm256_set1_ps(d));
    *dmn = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(mn8)), _mm256_set1_ps(dmin));
}

/* Q4_K. xsum32 (may be NULL) holds sum(x) over each 32-element sub-block of the whole row, so
 * the min term is one multiply-add of 8 lanes per block instead of touching x again. */
SIMD_FN static float dot_q4_k_avx2(const uint8_t *r, const float *x, uint64_t nb,
                                   const float *xsum32)
{
    const __m256i m4 = _mm256_set1_epi32(0x0f);
    __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps(), accm = _mm256_setzero_ps();
    float dsc[8] __attribute__((aligned(32)));
    for (uint64_t b = 0; b < nb; b++, r += Q4_K_BLOCK_BYTES, x += QK_K) {
        __m256 vdsc, vdmn;
        q4k_scales_avx2(r + 4, f16_at(r), f16_at(r + 2), &vdsc, &vdmn);
        _mm256_store_ps(dsc, vdsc);
        const uint8_t *qs = r + 16;
        float dmn[8] __attribute__((aligned(32)));
        if (xsum32)
            accm = _mm256_fmadd_ps(vdmn, _mm256_loadu_ps(xsum32 + 8 * b), accm);
        else
            _mm256_store_ps(dmn, vdmn);
        for (int c = 0; c < 4; c++) {
            const float *xl = x + 64 * c, *xh = xl + 32;
            const uint8_t *q = qs + 32 * c;
            __m256 xl0 = _mm256_loadu_ps(xl), xl1 = _mm256_loadu_ps(xl + 8);
            __m256 xl2 = _mm256_loadu_ps(xl + 16), xl3 = _mm256_loadu_ps(xl + 24);
            __m256 xh0 = _mm256_loadu_ps(xh), xh1 = _mm256_loadu_ps(xh + 8);
            __m256 xh2 = _mm256_loadu_ps(xh + 16), xh3 = _mm256_loadu_ps(xh + 24);
            __m256i v0 = load8_u8(q), v1 = load8_u8(q + 8), v2 = load8_u8(q + 16), v3 = load8_u8(q + 24);
            __m256 lo0 = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_and_si256(v0, m4)), xl0);
            __m256 lo1 = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_and_si256(v1, m4)), xl1);
            __m256 hi0 = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_srli_epi32(v0, 4)), xh0);
            __m256 hi1 = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_srli_epi32(v1, 4)), xh1);
            lo0 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_and_si256(v2, m4)), xl2, lo0);
            lo1 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_and_si256(v3, m4)), xl3, lo1);
            hi0 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_srli_epi32(v2, 4)), xh2, hi0);
            hi1 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_srli_epi32(v3, 4)), xh3, hi1);
            acc0 = _mm256_fmadd_ps(_mm256_add_ps(lo0, lo1), _mm256_broadcast_ss(dsc + 2 * c), acc0);
            acc1 = _mm256_fmadd_ps(_mm256_add_ps(hi0, hi1), _mm256_broadcast_ss(dsc + 2 * c + 1), acc1);
            if (!xsum32) {
                __m256 sl = _mm256_add_ps(_mm256_add_ps(xl0, xl1), _mm256_add_ps(xl2, xl3));
                __m256 sh = _mm256_add_ps(_mm256_add_ps(xh0, xh1), _mm256_add_ps(xh2, xh3));
                accm = _mm256_fmadd_ps(sl, _mm256_broadcast_ss(dmn + 2 * c), accm);
                accm = _mm256_fmadd_ps(sh, _mm256_broadcast_ss(dmn + 2 * c + 1), accm);
            }
        }
    }
    return hsum8(_mm256_add_ps(acc0, acc1)) - hsum8(accm);
}

SIMD_FN static void sums32_avx2(const float *x, uint64_t n, float *out)
{
    for (uint64_t j = 0; j < n / 32; j++) {
        const float *p = x + 32 * j;
        __m256 s = _mm256_add_ps(_mm256_add_ps(_mm256_loadu_ps(p), _mm256_loadu_ps(p + 8)),
                                 _mm256_add_ps(_mm256_loadu_ps(p + 16), _mm256_loadu_ps(p + 24)));
        out[j] = hsum8(s);
    }
}

SIMD_FN static float dot_q6_k_avx2(const uint8_t *r, const float *x, uint64_t nb)
{
    const __m256i m4 = _mm256_set1_epi32(0x0f), m30 = _mm256_set1_epi32(0x30);
    const __m256i k32 = _mm256_set1_epi32(32);
    __m256 acc = _mm256_setzero_ps();
    __m256 acc2 = _mm256_setzero_ps();
    float dsc[16] __attribute__((aligned(32)));
    for (uint64_t b = 0; b < nb; b++, r += Q6_K_BLOCK_BYTES, x += QK_K) {
        __m256 vd = _mm256_set1_ps(f16_at(r + 208));
        __m128i sc16 = _mm_loadu_si128((const __m128i *)(r + 192));
        _mm256_store_ps(dsc, _mm256_mul_ps(vd, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(sc16))));
        _mm256_store_ps(dsc + 8, _mm256_mul_ps(vd, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(
                                                       _mm_unpackhi_epi64(sc16, sc16)))));
        for (int h = 0; h < 2; h++) {
            const uint8_t *L = r + 64 * h, *H = r + 128 + 32 * h;
            const float *S = dsc + 8 * h;
            const float *X = x + 128 * h;
            for (int g = 0; g < 2; g++) {
                __m256 a1 = _mm256_setzero_ps(), a2 = a1, a3 = a1, a4 = a1;
                for (int k = 0; k < 2; k++) {
                    int l = 16 * g + 8 * k;
                    __m256i l0 = load8_u8(L + l), l1 = load8_u8(L + 32 + l), hb = load8_u8(H + l);
                    __m256i q1 = _mm256_or_si256(_mm256_and_si256(l0, m4),
                                                 _mm256_and_si256(_mm256_slli_epi32(hb, 4), m30));
                    __m256i q2 = _mm256_or_si256(_mm256_and_si256(l1, m4),
                                                 _mm256_and_si256(_mm256_slli_epi32(hb, 2), m30));
                    __m256i q3 = _mm256_or_si256(_mm256_srli_epi32(l0, 4), _mm256_and_si256(hb, m30));
                    __m256i q4 = _mm256_or_si256(_mm256_srli_epi32(l1, 4),
                                                 _mm256_and_si256(_mm256_srli_epi32(hb, 2), m30));
                    a1 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_sub_epi32(q1, k32)),
                                         _mm256_loadu_ps(X + l), a1);
                    a2 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_sub_epi32(q2, k32)),
                                         _mm256_loadu_ps(X + l + 32), a2);
                    a3 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_sub_epi32(q3, k32)),
                                         _mm256_loadu_ps(X + l + 64), a3);
                    a4 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_sub_epi32(q4, k32)),
                                         _mm256_loadu_ps(X + l + 96), a4);
                }
                acc = _mm256_fmadd_ps(a1, _mm256_broadcast_ss(S + g), acc);
                acc2 = _mm256_fmadd_ps(a2, _mm256_broadcast_ss(S + g + 2), acc2);
                acc = _mm256_fmadd_ps(a3, _mm256_broadcast_ss(S + g + 4), acc);
                acc2 = _mm256_fmadd_ps(a4, _mm256_broadcast_ss(S + g + 6), acc2);
            }
        }
    }
    return hsum8(_mm256_add_ps(acc, acc2));
}

/* ---- AVX2 dequantize of one block, for the multi-row kernel ---- */

SIMD_FN static void deq_q4_k_avx2(const uint8_t *b, float *y)
{
    const __m256i m4 = _mm256_set1_epi32(0x0f);
    __m256 vdsc, vdmn;
    float dsc[8] __attribute__((aligned(32))), dmn[8] __attribute__((aligned(32)));
    q4k_scales_avx2(b + 4, f16_at(b), f16_at(b + 2), &vdsc, &vdmn);
    _mm256_store_ps(dsc, vdsc);
    _mm256_store_ps(dmn, vdmn);
    for (int c = 0; c < 4; c++) {
        __m256 s1 = _mm256_broadcast_ss(dsc + 2 * c), m1 = _mm256_broadcast_ss(dmn + 2 * c);
        __m256 s2 = _mm256_broadcast_ss(dsc + 2 * c + 1), m2 = _mm256_broadcast_ss(dmn + 2 * c + 1);
        for (int k = 0; k < 4; k++) {
            __m256i v = load8_u8(b + 16 + 32 * c + 8 * k);
            _mm256_storeu_ps(y + 64 * c + 8 * k,
                             _mm256_fmsub_ps(_mm256_cvtepi32_ps(_mm256_and_si256(v, m4)), s1, m1));
            _mm256_storeu_ps(y + 64 * c + 32 + 8 * k,
                             _mm256_fmsub_ps(_mm256_cvtepi32_ps(_mm256_srli_epi32(v, 4)), s2, m2));
        }
    }
}

SIMD_FN static void deq_q6_k_avx2(const uint8_t *b, float *y)
{
    const __m256i m4 = _mm256_set1_epi32(0x0f), m30 = _mm256_set1_epi32(0x30);
    const __m256i k32 = _mm256_set1_epi32(32);
    float dsc[16] __attribute__((aligned(32)));
    __m256 vd = _mm256_set1_ps(f16_at(b + 208));
    __m128i sc16 = _mm_loadu_si128((const __m128i *)(b + 192));
    _mm256_store_ps(dsc, _mm256_mul_ps(vd, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(sc16))));
    _mm256_store_ps(dsc + 8, _mm256_mul_ps(vd, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(
                                                   _mm_unpackhi_epi64(sc16, sc16)))));
    for (int h = 0; h < 2; h++) {
        const uint8_t *L = b + 64 * h, *H = b + 128 + 32 * h;
        const float *S = dsc + 8 * h;
        float *Y = y + 128 * h;
        for (int l = 0; l < 32; l += 8) {
            int g = l / 16;
            __m256i l0 = load8_u8(L + l), l1 = load8_u8(L + 32 + l), hb = load8_u8(H + l);
            __m256i q1 = _mm256_or_si256(_mm256_and_si256(l0, m4),
                                         _mm256_and_si256(_mm256_slli_epi32(hb, 4), m30));
            __m256i q2 = _mm256_or_si256(_mm256_and_si256(l1, m4),
                                         _mm256_and_si256(_mm256_slli_epi32(hb, 2), m30));
            __m256i q3 = _mm256_or_si256(_mm256_srli_epi32(l0, 4), _mm256_and_si256(hb, m30));
            __m256i q4 = _mm256_or_si256(_mm256_srli_epi32(l1, 4),
                                         _mm256_and_si256(_mm256_srli_epi32(hb, 2), m30));
            _mm256_storeu_ps(Y + l, _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_sub_epi32(q1, k32)),
                                                  _mm256_broadcast_ss(S + g)));
            _mm256_storeu_ps(Y + l + 32, _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_sub_epi32(q2, k32)),
                                                       _mm256_broadcast_ss(S + g + 2)));
            _mm256_storeu_ps(Y + l + 64, _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_sub_epi32(q3, k32)),
                                                       _mm256_broadcast_ss(S + g + 4)));
            _mm256_storeu_ps(Y + l + 96, _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_sub_epi32(q4, k32)),
                                                       _mm256_broadcast_ss(S + g + 6)));
        }
    }
}

/* Elements [first, first+len) of a row as f32 into y (first a block boundary), AVX2 where the
 * format has a kernel; same values as deq_range (the same f32 products). */
SIMD_FN static void deq_range_avx2(uint32_t type, const void *row, uint64_t first, uint64_t len,
                                   float *y)
{
    const uint8_t *r = row;
    if (type == GGML_TYPE_Q4_K) {
        for (uint64_t b = 0; b < len / QK_K; b++)
            deq_q4_k_avx2(r + (first / QK_K + b) * Q4_K_BLOCK_BYTES, y + b * QK_K);
    } else if (type == GGML_TYPE_Q6_K) {
        for (uint64_t b = 0; b < len / QK_K; b++)
            deq_q6_k_avx2(r + (first / QK_K + b) * Q6_K_BLOCK_BYTES, y + b * QK_K);
    } else if (type == GGML_TYPE_Q8_0) {
        for (uint64_t b = 0; b < len / QK8_0; b++) {
            const uint8_t *blk = r + (first / QK8_0 + b) * Q8_0_BLOCK_BYTES;
            __m256 d = _mm256_set1_ps(f16_at(blk));
            for (int k = 0; k < 4; k++)
                _mm256_storeu_ps(y + b * QK8_0 + 8 * k,
                                 _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(
                                                   _mm_loadl_epi64((const __m128i *)(blk + 2 + 8 * k)))),
                                               d));
        }
    } else if (type == GGML_TYPE_F16) {
        uint64_t i = 0;
        for (; i + 8 <= len; i += 8)
            _mm256_storeu_ps(y + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(r + 2 * (first + i)))));
        for (; i < len; i++)
            y[i] = f16_at(r + 2 * (first + i));
    } else {
        deq_range(type, row, first, len, y);
    }
}

/* The multi-row kernel: one weight row against m x rows. Per 256-element chunk the row is
 * dequantized once into w, then swept against 4 x rows at a time (one w load feeds 4 FMAs). */
SIMD_FN static void dot_multi_avx2(uint32_t type, const void *row, uint64_t n, const float *x,
                                   uint64_t ldx, uint64_t m, float *out, uint64_t ldo)
{
    float w[QK_K] __attribute__((aligned(32)));
    for (uint64_t i0 = 0; i0 < m; i0 += 4) {
        uint64_t cnt = m - i0 < 4 ? m - i0 : 4;
        const float *xr[4];
        for (uint64_t i = 0; i < 4; i++)
            xr[i] = x + (i0 + (i < cnt ? i : 0)) * ldx; /* pad with row i0: computed, not stored */
        __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
        float tail[4] = {0, 0, 0, 0};
        for (uint64_t off = 0; off < n; off += QK_K) {
            uint64_t len = n - off < QK_K ? n - off : QK_K;
            const float *wp = w;
            if (type == GGML_TYPE_F32)
                wp = (const float *)row + off;
            else
                deq_range_avx2(type, row, off, len, w);
            uint64_t e = 0;
            for (; e + 8 <= len; e += 8) {
                __m256 wv = _mm256_loadu_ps(wp + e);
                a0 = _mm256_fmadd_ps(wv, _mm256_loadu_ps(xr[0] + off + e), a0);
                a1 = _mm256_fmadd_ps(wv, _mm256_loadu_ps(xr[1] + off + e), a1);
                a2 = _mm256_fmadd_ps(wv, _mm256_loadu_ps(xr[2] + off + e), a2);
                a3 = _mm256_fmadd_ps(wv, _mm256_loadu_ps(xr[3] + off + e), a3);
            }
            for (; e < len; e++)
                for (int i = 0; i < 4; i++)
                    tail[i] += wp[e] * xr[i][off + e];
        }
        __m256 av[4] = {a0, a1, a2, a3};
        for (uint64_t i = 0; i < cnt; i++)
            out[(i0 + i) * ldo] = hsum8(av[i]) + tail[i];
    }
}
#endif /* QUANT_X86 */

/* ---- run-time selection ---- */

/* -1: not decided yet; 0: scalar; 1: AVX2. Process-wide CPU capability, not model state. */
static atomic_int simd_mode = -1;

bool quant_simd_available(void)
{
#ifdef QUANT_X86
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
           __builtin_cpu_supports("f16c");
#else
    return false;
#endif
}

static bool simd_on(void)
{
    int m = atomic_load_explicit(&simd_mode, memory_order_relaxed);
    if (m < 0) {
        const char *env = getenv("MUSER_SIMD");
        bool off = env && env[0] == '0' && env[1] == '\0';
        m = (!off && quant_simd_available()) ? 1 : 0;
        atomic_store_explicit(&simd_mode, m, memory_order_relaxed);
    }
    return m == 1;
}

void quant_simd_enable(bool on)
{
    atomic_store_explicit(&simd_mode, on && quant_simd_available() ? 1 : 0, memory_order_relaxed);
}

const char *quant_simd_name(void) { return simd_on() ? "avx2" : "scalar"; }

float quant_dot_f32(const float *a, const float *b, uint64_t n)
{
#ifdef QUANT_X86
    if (simd_on())
        return dot_f32_avx2(a, b, n);
#endif
    return dot_f32_scalar(a, b, n);
}

float quant_dot(uint32_t type, const void *row, const float *x, uint64_t n)
{
#ifdef QUANT_X86
    if (simd_on() && row_ok(type, n)) {
        switch (type) {
        case GGML_TYPE_F32: return dot_f32_avx2(row, x, n);
        case GGML_TYPE_F16: return dot_f16_avx2(row, x, n);
        case GGML_TYPE_BF16: return dot_bf16_avx2(row, x, n);
        case GGML_TYPE_Q8_0: return dot_q8_0_avx2(row, x, n / QK8_0);
        case GGML_TYPE_Q4_K: return dot_q4_k_avx2(row, x, n / QK_K, NULL);
        case GGML_TYPE_Q6_K: return dot_q6_k_avx2(row, x, n / QK_K);
        }
    }
#endif
    return quant_dot_scalar(type, row, x, n);
}

/* Largest row quant_dot_rows precomputes sub-block sums for on the stack (16 KB of sums). */
#define ROWS_MAX_SUMS 4096

int quant_dot_rows(uint32_t type, const void *w, uint64_t row_bytes, uint64_t n_rows,
                   const float *x, uint64_t n, float *out)
{
    int rc = row_check(type, n);
    if (rc)
        return rc;
    if (row_bytes < quant_row_bytes(type, n))
        return MUSER_E_ARG;
    const uint8_t *p = w;
#ifdef QUANT_X86
    if (simd_on() && type == GGML_TYPE_Q4_K && n / 32 <= ROWS_MAX_SUMS) {
        float sums[ROWS_MAX_SUMS];
        sums32_avx2(x, n, sums);
        for (uint64_t r = 0; r < n_rows; r++)
            out[r] = dot_q4_k_avx2(p + r * row_bytes, x, n / QK_K, sums);
        return MUSER_OK;
    }
#endif
    for (uint64_t r = 0; r < n_rows; r++)
        out[r] = quant_dot(type, p + r * row_bytes, x, n);
    return MUSER_OK;
}

/* Scalar multi-row path: x rows per pass, their 8 partial sums on the stack (2 KB). */
#define MULTI_PASS 64

int quant_dot_rows_multi(uint32_t type, const void *row, uint64_t n, const float *x, uint64_t ldx,
                         uint64_t m, float *out, uint64_t ldo)
{
    int rc = row_check(type, n);
    if (rc)
        return rc;
#ifdef QUANT_X86
    if (simd_on()) {
        dot_multi_avx2(type, row, n, x, ldx, m, out, ldo);
        return MUSER_OK;
    }
#endif
    float wbuf[QK_K];
    float acc[MULTI_PASS][8];
    for (uint64_t i0 = 0; i0 < m; i0 += MULTI_PASS) {
        uint64_t cnt = m - i0 < MULTI_PASS ? m - i0 : MULTI_PASS;
        memset(acc, 0, sizeof acc);
        for (uint64_t off = 0; off < n; off += QK_K) {
            uint64_t len = n - off < QK_K ? n - off : QK_K;
            const float *wp = wbuf;
            if (type == GGML_TYPE_F32)
                wp = (const float *)row + off;
            else
                deq_range(type, row, off, len, wbuf); /* once, reused by cnt rows */
            for (uint64_t i = 0; i < cnt; i++) {
                const float *xi = x + (i0 + i) * ldx + off;
                for (uint64_t e = 0; e < len; e++)
                    acc[i][e & 7] += wp[e] * xi[e];
            }
        }
        for (uint64_t i = 0; i < cnt; i++) {
            float s = 0.0f;
            for (int k = 0; k < 8; k++)
                s += acc[i][k];
            out[(i0 + i) * ldo] = s;
        }
    }
    return MUSER_OK;
}

/* ---- the release mix ---- */

/* Layer index of "blk.N.<suffix>", or -1 if name is not that. */
static long blk_layer(const char *name, const char *suffix)
{
    if (strncmp(name, "blk.", 4) != 0)
        return -1;
    char *end;
    long l = strtol(name + 4, &end, 10);
    if (end == name + 4 || *end != '.' || l < 0)
        return -1;
    return strcmp(end + 1, suffix) == 0 ? l : -1;
}

uint32_t quant_mix_type(const char *tensor_name, uint32_t n_layer, uint32_t default_type)
{
    if (!tensor_name)
        return default_type;
    if (strcmp(tensor_name, "output.weight") == 0)
        return GGML_TYPE_Q6_K;
    long l = blk_layer(tensor_name, "ffn_down.weight");
    if (l < 0)
        l = blk_layer(tensor_name, "attn_v.weight");
    if (l < 0 || n_layer == 0)
        return default_type;
    long n = n_layer, e = n / 8;
    bool more_bits = l < e || l >= 7 * n / 8 || (l - e) % 3 == 2;
    return more_bits ? GGML_TYPE_Q6_K : default_type;
}

uint32_t quant_fallback_type(uint32_t type, uint64_t ne0)
{
    const quant_type_info *ti = quant_info(type);
    if (ti && ne0 % ti->block_elems == 0)
        return type;
    if (ne0 % QK8_0 == 0)
        return GGML_TYPE_Q8_0;
    return GGML_TYPE_F16;
}
