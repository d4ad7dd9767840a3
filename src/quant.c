/* quant.c — the block formats: type table, dequantize, quantize (scale search), and the reference
 * dot products of a quantized row with an f32 vector.
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
 * The dots here are plain on purpose: quant_dot is the scalar f32 reference (the CPU engine's
 * scalar kernel table runs it; its AVX2 dots live in src/cpu/kernels.c) and quant_dot_f64 the
 * test oracle that both are checked against. */
#include "quant.h"

#include "util.h"

#include <ctype.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

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

/* ---- dots: the scalar reference and the f64 oracle ---- */

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

float quant_dot(uint32_t type, const void *row, const float *x, uint64_t n)
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
