/* test_quant.c — the block formats: type table, hand-built blocks with known dequantized values
 * (pinning the ggml bit layouts), quantize -> dequantize error bounds per type, the scale search
 * beating plain max-abs quantization, degenerate inputs, the release-mix rule, and the f16/bf16
 * converters' edge cases. Dot products (quant_dot and the CPU engine's kernels against
 * quant_dot_f64) are in test_cpu_dots.c. */
#include "check.h"
#include "quant.h"
#include "util.h"

#include <math.h>
#include <stdint.h>
#include <string.h>


static void put_f16(uint8_t *p, uint16_t h) { memcpy(p, &h, 2); }

/* ---- independent test-side packers, written from the layout description ---- */

/* Q4_K: element e lives in qs[32*(e/64) + e%32], low nibble if e%64 < 32 else high nibble. */
static void pack_q4k(uint8_t *blk, float d, float dmin, const uint8_t sc[8], const uint8_t mn[8],
                     const uint8_t q[256])
{
    put_f16(blk, muser_f32_to_f16(d));
    put_f16(blk + 2, muser_f32_to_f16(dmin));
    uint8_t *s = blk + 4;
    for (int j = 0; j < 4; j++) {
        s[j] = (uint8_t)(sc[j] | ((sc[j + 4] >> 4) << 6));
        s[j + 4] = (uint8_t)(mn[j] | ((mn[j + 4] >> 4) << 6));
        s[j + 8] = (uint8_t)((sc[j + 4] & 15) | ((mn[j + 4] & 15) << 4));
    }
    memset(blk + 16, 0, 128);
    for (int e = 0; e < 256; e++) {
        int byte = 32 * (e / 64) + e % 32;
        blk[16 + byte] |= (uint8_t)(e % 64 < 32 ? q[e] : q[e] << 4);
    }
}

/* Q6_K: element e = 128h + 32k + l; low 4 bits in ql[64h + 32*(k&1) + l] (high nibble if k >= 2),
 * top 2 bits in qh[32h + l] at bit 2k. u[e] = q + 32 in [0, 63]. */
static void pack_q6k(uint8_t *blk, float d, const int8_t sc[16], const uint8_t u[256])
{
    memset(blk, 0, 192);
    for (int e = 0; e < 256; e++) {
        int h = e / 128, k = (e % 128) / 32, l = e % 32;
        int lo = 64 * h + 32 * (k & 1) + l;
        blk[lo] |= (uint8_t)(k >= 2 ? (u[e] & 15) << 4 : (u[e] & 15));
        blk[128 + 32 * h + l] |= (uint8_t)((u[e] >> 4) << (2 * k));
    }
    memcpy(blk + 192, sc, 16);
    put_f16(blk + 208, muser_f32_to_f16(d));
}

/* ---- plain max-abs quantizers (the baseline the search must beat) ---- */

static void plain_q8_0(const float *x, uint8_t *out, int nb)
{
    for (int b = 0; b < nb; b++, x += 32, out += 34) {
        float amax = 0;
        for (int i = 0; i < 32; i++)
            amax = fmaxf(amax, fabsf(x[i]));
        float d = muser_f16_to_f32(muser_f32_to_f16(amax / 127.0f));
        put_f16(out, muser_f32_to_f16(d));
        for (int i = 0; i < 32; i++)
            out[2 + i] = (uint8_t)(int8_t)(d > 0 ? lrintf(x[i] / d) : 0);
    }
}

static void plain_q4k(const float *x, uint8_t *out, int nb)
{
    for (int b = 0; b < nb; b++, x += 256, out += 144) {
        float s[8], m[8], maxs = 0, maxm = 0;
        for (int j = 0; j < 8; j++) {
            float lo = 0, hi = x[32 * j];
            for (int i = 0; i < 32; i++) {
                lo = fminf(lo, x[32 * j + i]);
                hi = fmaxf(hi, x[32 * j + i]);
            }
            s[j] = (hi - lo) / 15.0f;
            m[j] = -lo;
            maxs = fmaxf(maxs, s[j]);
            maxm = fmaxf(maxm, m[j]);
        }
        float d = muser_f16_to_f32(muser_f32_to_f16(maxs / 63.0f));
        float dm = muser_f16_to_f32(muser_f32_to_f16(maxm / 63.0f));
        uint8_t sc[8], mn[8], q[256];
        for (int j = 0; j < 8; j++) {
            sc[j] = (uint8_t)fminf(63, lrintf(s[j] / d));
            mn[j] = (uint8_t)fminf(63, lrintf(m[j] / dm));
            for (int i = 0; i < 32; i++) {
                float v = sc[j] ? (x[32 * j + i] + dm * mn[j]) / (d * sc[j]) : 0;
                q[32 * j + i] = (uint8_t)fmaxf(0, fminf(15, lrintf(v)));
            }
        }
        pack_q4k(out, d, dm, sc, mn, q);
    }
}

static void plain_q6k(const float *x, uint8_t *out, int nb)
{
    for (int b = 0; b < nb; b++, x += 256, out += 210) {
        float s[16], maxs = 0;
        for (int j = 0; j < 16; j++) {
            float amax = 0;
            for (int i = 0; i < 16; i++)
                amax = fmaxf(amax, fabsf(x[16 * j + i]));
            s[j] = amax / 31.0f;
            maxs = fmaxf(maxs, s[j]);
        }
        float d = muser_f16_to_f32(muser_f32_to_f16(maxs / 127.0f));
        int8_t sc[16];
        uint8_t u[256];
        for (int j = 0; j < 16; j++) {
            sc[j] = (int8_t)lrintf(s[j] / d);
            for (int i = 0; i < 16; i++) {
                float v = sc[j] ? x[16 * j + i] / (d * sc[j]) : 0;
                u[16 * j + i] = (uint8_t)(fmaxf(-32, fminf(31, lrintf(v))) + 32);
            }
        }
        pack_q6k(out, d, sc, u);
    }
}

/* ---- tests ---- */

static void test_type_table(void)
{
    struct { uint32_t t; const char *name; uint32_t be, bb; bool sup; } want[] = {
        {GGML_TYPE_F32, "f32", 1, 4, true},       {GGML_TYPE_F16, "f16", 1, 2, true},
        {GGML_TYPE_BF16, "bf16", 1, 2, true},     {GGML_TYPE_Q8_0, "q8_0", 32, 34, true},
        {GGML_TYPE_Q4_K, "q4_k", 256, 144, true}, {GGML_TYPE_Q6_K, "q6_k", 256, 210, true},
        {GGML_TYPE_Q4_0, "q4_0", 32, 18, false},  {GGML_TYPE_Q4_1, "q4_1", 32, 20, false},
        {GGML_TYPE_Q5_0, "q5_0", 32, 22, false},  {GGML_TYPE_Q5_1, "q5_1", 32, 24, false},
        {GGML_TYPE_Q8_1, "q8_1", 32, 36, false},  {GGML_TYPE_Q2_K, "q2_k", 256, 84, false},
        {GGML_TYPE_Q3_K, "q3_k", 256, 110, false}, {GGML_TYPE_Q5_K, "q5_k", 256, 176, false},
        {GGML_TYPE_Q8_K, "q8_k", 256, 292, false}, {24, "i8", 1, 1, false},
        {25, "i16", 1, 2, false}, {26, "i32", 1, 4, false}, {27, "i64", 1, 8, false},
        {28, "f64", 1, 8, false},
    };
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        const quant_type_info *ti = quant_info(want[i].t);
        CHECKF(ti != NULL, "type %u", want[i].t);
        if (!ti)
            continue;
        CHECKF(!strcmp(ti->name, want[i].name), "type %u name %s", want[i].t, ti->name);
        CHECKF(ti->block_elems == want[i].be && ti->block_bytes == want[i].bb, "type %s", ti->name);
        CHECKF(ti->supported == want[i].sup, "type %s supported", ti->name);
        CHECK(quant_type_from_name(want[i].name) == (int)want[i].t);
    }
    CHECK(quant_info(4) == NULL && quant_info(5) == NULL && quant_info(31) == NULL);
    CHECK(quant_info(40) == NULL && quant_info(0xffffffffu) == NULL);
    CHECK(quant_type_from_name("Q4_K") == GGML_TYPE_Q4_K);
    CHECK(quant_type_from_name("BF16") == GGML_TYPE_BF16);
    CHECK(quant_type_from_name("q4_k_m") == -1 && quant_type_from_name("") == -1);
    CHECK(quant_type_from_name("q4") == -1 && quant_type_from_name(NULL) == -1);
    CHECK(quant_row_bytes(GGML_TYPE_Q4_K, 6656) == 26 * 144);
    CHECK(quant_row_bytes(GGML_TYPE_Q6_K, 19968) == 78 * 210);
    CHECK(quant_row_bytes(GGML_TYPE_Q8_0, 96) == 3 * 34);
    CHECK(quant_row_bytes(GGML_TYPE_F16, 7) == 14);
    CHECK(quant_row_bytes(GGML_TYPE_Q4_K, 100) == 0);
    CHECK(quant_row_bytes(99, 256) == 0);
}

/* Hand-built blocks: literal bytes, values worked out by hand from the ggml layout. */
static void test_known_answers(void)
{
    float y[256];

    /* Q8_0: d = 0.5, q[i] = i - 16 */
    uint8_t q8[34];
    put_f16(q8, 0x3800);
    for (int i = 0; i < 32; i++)
        q8[2 + i] = (uint8_t)(int8_t)(i - 16);
    CHECK(quant_dequantize_row(GGML_TYPE_Q8_0, q8, y, 32) == 0);
    for (int i = 0; i < 32; i++)
        CHECKF(y[i] == 0.5f * (float)(i - 16), "q8_0 [%d] = %g", i, y[i]);

    /* Q4_K: d = 1, dmin = 1, sc = {1,2,3,63,17,33,49,5}, m = {0,1,62,3,20,40,60,7}, packed by
     * hand into the 12 scale bytes; every qs byte 0x93 (low nibble 3, high nibble 9). */
    uint8_t q4[144];
    static const uint8_t q4_scales[12] = {0x41, 0x82, 0xC3, 0x3F, 0x40, 0x81,
                                          0xFE, 0x03, 0x41, 0x81, 0xC1, 0x75};
    put_f16(q4, 0x3C00);
    put_f16(q4 + 2, 0x3C00);
    memcpy(q4 + 4, q4_scales, 12);
    memset(q4 + 16, 0x93, 128);
    CHECK(quant_dequantize_row(GGML_TYPE_Q4_K, q4, y, 256) == 0);
    /* sub-block j: elements 32j..32j+31; even j use the low nibble (3), odd j the high (9) */
    static const float q4_want[8] = {1 * 3 - 0,  2 * 9 - 1,  3 * 3 - 62, 63 * 9 - 3,
                                     17 * 3 - 20, 33 * 9 - 40, 49 * 3 - 60, 5 * 9 - 7};
    for (int e = 0; e < 256; e++)
        CHECKF(y[e] == q4_want[e / 32], "q4_k [%d] = %g want %g", e, y[e], q4_want[e / 32]);
    /* the test-side packer reproduces the literal bytes */
    {
        uint8_t sc[8] = {1, 2, 3, 63, 17, 33, 49, 5}, mn[8] = {0, 1, 62, 3, 20, 40, 60, 7};
        uint8_t q[256], blk[144];
        for (int e = 0; e < 256; e++)
            q[e] = (e / 32) % 2 ? 9 : 3;
        pack_q4k(blk, 1.0f, 1.0f, sc, mn, q);
        CHECK(memcmp(blk, q4, 144) == 0);
    }
    /* distinct nibbles per position: qs[i] = i (so low nibble i%16, high nibble i/16) */
    for (int i = 0; i < 128; i++)
        q4[16 + i] = (uint8_t)i;
    CHECK(quant_dequantize_row(GGML_TYPE_Q4_K, q4, y, 256) == 0);
    CHECK(y[0] == 1 * 0 - 0);          /* qs[0] low = 0 */
    CHECK(y[5] == 1 * 5 - 0);          /* qs[5] low = 5 */
    CHECK(y[37] == 2 * 0 - 1);         /* qs[5] high = 0 */
    CHECK(y[64 + 20] == 3 * 4 - 62);   /* qs[52] = 0x34: low 4 */
    CHECK(y[96 + 20] == 63 * 3 - 3);   /* qs[52] high 3 */
    CHECK(y[192 + 31] == 49 * 15 - 60); /* qs[127] = 0x7f: low 15 */
    CHECK(y[224 + 31] == 5 * 7 - 7);   /* qs[127] high 7 */

    /* Q6_K: d = 1, all scales 1 except scale 9 (elements 144..159) = -2; ql = 0x21 (low 1,
     * high 2), qh = 0xE4 (2-bit fields 0,1,2,3 for the groups +0, +32, +64, +96). */
    uint8_t q6[210];
    memset(q6, 0x21, 128);
    memset(q6 + 128, 0xE4, 64);
    memset(q6 + 192, 1, 16);
    q6[192 + 9] = (uint8_t)(int8_t)-2;
    put_f16(q6 + 208, 0x3C00);
    CHECK(quant_dequantize_row(GGML_TYPE_Q6_K, q6, y, 256) == 0);
    /* group +0: q = 1 | 0<<4 = 1; +32: 1 | 1<<4 = 17; +64: 2 | 2<<4 = 34; +96: 2 | 3<<4 = 50 */
    static const float q6_want[4] = {1 - 32, 17 - 32, 34 - 32, 50 - 32};
    for (int e = 0; e < 256; e++) {
        float want = q6_want[(e % 128) / 32] * (e / 16 == 9 ? -2.0f : 1.0f);
        CHECKF(y[e] == want, "q6_k [%d] = %g want %g", e, y[e], want);
    }
    /* per-position bytes: ql[i] = i, qh[i] = 3*i, scales j+1, d = 0.5 */
    for (int i = 0; i < 128; i++)
        q6[i] = (uint8_t)i;
    for (int i = 0; i < 64; i++)
        q6[128 + i] = (uint8_t)(3 * i);
    for (int j = 0; j < 16; j++)
        q6[192 + j] = (uint8_t)(j + 1);
    put_f16(q6 + 208, 0x3800);
    CHECK(quant_dequantize_row(GGML_TYPE_Q6_K, q6, y, 256) == 0);
    /* element 5: ql[5]=5 low 5, qh[5]=15 bits0-1 = 3 -> q = 53, scale 1 */
    CHECK(y[5] == 0.5f * 1 * (53 - 32));
    /* element 37 (+32 group, l=5): ql[37]=37=0x25 low 5, qh[5]=15 bits2-3 = 3 -> 53, scale 3 */
    CHECK(y[37] == 0.5f * 3 * (53 - 32));
    /* element 69 (+64, l=5): ql[5] high 0, qh bits4-5 = 0 -> 0, scale 5 */
    CHECK(y[69] == 0.5f * 5 * (0 - 32));
    /* element 128+96+10 = 234: h=1, ql[64+32+10]=106=0x6a high 6, qh[32+10]=126=0x7e bits6-7 = 1
     * -> 6 | 16 = 22, scale index 234/16 = 14 -> 15 */
    CHECK(y[234] == 0.5f * 15 * (22 - 32));
    /* the test-side packer agrees with the dequantizer on this block */
    {
        int8_t sc[16];
        uint8_t u[256], blk[210];
        for (int j = 0; j < 16; j++)
            sc[j] = (int8_t)(j + 1);
        for (int e = 0; e < 256; e++)
            u[e] = (uint8_t)lrintf(y[e] / (0.5f * sc[e / 16]) + 32);
        pack_q6k(blk, 0.5f, sc, u);
        CHECK(memcmp(blk, q6, 210) == 0);
    }
}

static double rel_rms(const float *a, const float *b, size_t n)
{
    double e = 0, s = 0;
    for (size_t i = 0; i < n; i++) {
        e += ((double)a[i] - b[i]) * ((double)a[i] - b[i]);
        s += (double)b[i] * b[i];
    }
    return s > 0 ? sqrt(e / s) : sqrt(e);
}

static void test_roundtrip(size_t n)
{
    float *x = malloc(n * 4), *y = malloc(n * 4);
    uint8_t *q = malloc(n * 4), *q2 = malloc(n * 4);
    for (size_t i = 0; i < n; i++)
        x[i] = 0.02f * check_rng_gauss();
    struct { uint32_t t; double bound; } cases[] = {
        {GGML_TYPE_F32, 0.0}, {GGML_TYPE_F16, 1e-3}, {GGML_TYPE_BF16, 5e-3},
        {GGML_TYPE_Q8_0, 0.01}, {GGML_TYPE_Q6_K, 0.03}, {GGML_TYPE_Q4_K, 0.10},
    };
    double err_search[3] = {0};
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        uint32_t t = cases[c].t;
        CHECK(quant_quantize_row(t, x, q, n) == 0);
        CHECK(quant_dequantize_row(t, q, y, n) == 0);
        double e = rel_rms(y, x, n);
        printf("  %-5s relative rms error %.5f (bound %.3f)\n", quant_info(t)->name, e,
               cases[c].bound);
        CHECKF(e <= cases[c].bound, "%s error %g", quant_info(t)->name, e);
        /* deterministic */
        CHECK(quant_quantize_row(t, x, q2, n) == 0);
        CHECK(memcmp(q, q2, quant_row_bytes(t, n)) == 0);
        if (t == GGML_TYPE_Q8_0) err_search[0] = e;
        if (t == GGML_TYPE_Q4_K) err_search[1] = e;
        if (t == GGML_TYPE_Q6_K) err_search[2] = e;
    }
    /* the search beats plain max-abs quantization */
    void (*plain[3])(const float *, uint8_t *, int) = {plain_q8_0, plain_q4k, plain_q6k};
    uint32_t pt[3] = {GGML_TYPE_Q8_0, GGML_TYPE_Q4_K, GGML_TYPE_Q6_K};
    for (int k = 0; k < 3; k++) {
        plain[k](x, q, (int)(n / quant_info(pt[k])->block_elems));
        CHECK(quant_dequantize_row(pt[k], q, y, n) == 0);
        double e = rel_rms(y, x, n);
        printf("  %-5s plain max-abs error %.5f, search %.5f (%.1f%% less)\n",
               quant_info(pt[k])->name, e, err_search[k], 100.0 * (1 - err_search[k] / e));
        CHECKF(err_search[k] < 0.97 * e, "%s search %g vs plain %g", quant_info(pt[k])->name,
               err_search[k], e);
    }
    free(x);
    free(y);
    free(q);
    free(q2);
}

/* Zeros, constants, one outlier, all-positive, tiny and large magnitudes: finite, and exact where
 * the format can be exact. */
static void test_degenerate(void)
{
    float x[512], y[512];
    uint8_t q[2048];
    uint32_t types[] = {GGML_TYPE_Q8_0, GGML_TYPE_Q4_K, GGML_TYPE_Q6_K};
    for (int t = 0; t < 3; t++) {
        uint32_t ty = types[t];
        const char *nm = quant_info(ty)->name;
        memset(x, 0, sizeof x);
        CHECK(quant_quantize_row(ty, x, q, 512) == 0);
        CHECK(quant_dequantize_row(ty, q, y, 512) == 0);
        for (int i = 0; i < 512; i++)
            CHECKF(y[i] == 0.0f, "%s zeros [%d] %g", nm, i, y[i]);
        /* one outlier in a block of zeros: the outlier survives within 1% */
        x[300] = 3.0f;
        CHECK(quant_quantize_row(ty, x, q, 512) == 0);
        CHECK(quant_dequantize_row(ty, q, y, 512) == 0);
        CHECKF(fabsf(y[300] - 3.0f) < 0.03f, "%s outlier %g", nm, y[300]);
        for (int i = 0; i < 512; i++)
            if (i != 300)
                CHECKF(fabsf(y[i]) < 0.03f, "%s outlier block [%d] %g", nm, i, y[i]);
        /* a negative constant and all-positive data (min term clamps at 0 for Q4_K) */
        for (int i = 0; i < 512; i++)
            x[i] = i < 256 ? -0.75f : 0.5f + 0.001f * (float)(i % 7);
        CHECK(quant_quantize_row(ty, x, q, 512) == 0);
        CHECK(quant_dequantize_row(ty, q, y, 512) == 0);
        CHECKF(rel_rms(y, x, 512) < 0.02, "%s constants %g", nm, rel_rms(y, x, 512));
        /* tiny (f16 scale underflows toward subnormal) and large magnitudes */
        float mags[2] = {1e-4f, 3000.0f};
        for (int k = 0; k < 2; k++) {
            for (int i = 0; i < 512; i++)
                x[i] = mags[k] * check_rng_gauss();
            CHECK(quant_quantize_row(ty, x, q, 512) == 0);
            CHECK(quant_dequantize_row(ty, q, y, 512) == 0);
            bool finite = true;
            for (int i = 0; i < 512; i++)
                finite = finite && isfinite(y[i]);
            CHECKF(finite, "%s magnitude %g", nm, mags[k]);
            double e = rel_rms(y, x, 512);
            CHECKF(e < (k == 0 ? 0.5 : 0.12), "%s magnitude %g error %g", nm, mags[k], e);
        }
    }
}

static void test_bad_args(void)
{
    float x[300] = {0};
    uint8_t q[1024];
    CHECK(quant_quantize_row(GGML_TYPE_Q4_K, x, q, 100) == MUSER_E_ARG);
    CHECK(quant_dequantize_row(GGML_TYPE_Q8_0, q, x, 40) == MUSER_E_ARG);
    CHECK(quant_quantize_row(GGML_TYPE_Q5_K, x, q, 256) == MUSER_E_UNSUPPORTED);
    CHECK(quant_dequantize_row(77, q, x, 256) == MUSER_E_UNSUPPORTED);
    CHECK(isnan(quant_dot(GGML_TYPE_Q4_K, q, x, 100)));
    CHECK(isnan(quant_dot(GGML_TYPE_Q2_K, q, x, 256)));
    CHECK(isnan(quant_dot_f64(GGML_TYPE_Q6_K, q, x, 255)));
}

static void test_mix_rule(void)
{
    /* n = 52: n/8 = 6, 7n/8 = 45 -> layers 0-5, 8, 11, ..., 44, 45-51: 26 layers */
    int count = 0;
    char name[64];
    for (uint32_t l = 0; l < 52; l++) {
        snprintf(name, sizeof name, "blk.%u.ffn_down.weight", l);
        bool six = quant_mix_type(name, 52, GGML_TYPE_Q4_K) == GGML_TYPE_Q6_K;
        bool want = l < 6 || l >= 45 || (l >= 6 && (l - 6) % 3 == 2);
        CHECKF(six == want, "layer %u", l);
        snprintf(name, sizeof name, "blk.%u.attn_v.weight", l);
        CHECK((quant_mix_type(name, 52, GGML_TYPE_Q4_K) == GGML_TYPE_Q6_K) == want);
        snprintf(name, sizeof name, "blk.%u.attn_k.weight", l);
        CHECK(quant_mix_type(name, 52, GGML_TYPE_Q4_K) == GGML_TYPE_Q4_K);
        count += six;
    }
    CHECKF(count == 26, "%d", count);
    CHECK(quant_mix_type("blk.8.ffn_down.weight", 52, GGML_TYPE_Q4_K) == GGML_TYPE_Q6_K);
    CHECK(quant_mix_type("blk.9.ffn_down.weight", 52, GGML_TYPE_Q4_K) == GGML_TYPE_Q4_K);
    CHECK(quant_mix_type("output.weight", 52, GGML_TYPE_Q4_K) == GGML_TYPE_Q6_K);
    CHECK(quant_mix_type("token_embd.weight", 52, GGML_TYPE_Q4_K) == GGML_TYPE_Q4_K);
    CHECK(quant_mix_type("blk.x.ffn_down.weight", 52, GGML_TYPE_Q4_K) == GGML_TYPE_Q4_K);
    CHECK(quant_mix_type("blk.3.ffn_down.weight.extra", 52, GGML_TYPE_Q4_K) == GGML_TYPE_Q4_K);
    /* 2 layers: n/8 = 0, 7n/8 = 1: layer 1 only */
    CHECK(quant_mix_type("blk.0.ffn_down.weight", 2, GGML_TYPE_Q4_K) == GGML_TYPE_Q4_K);
    CHECK(quant_mix_type("blk.1.ffn_down.weight", 2, GGML_TYPE_Q4_K) == GGML_TYPE_Q6_K);
    CHECK(quant_fallback_type(GGML_TYPE_Q4_K, 6656) == GGML_TYPE_Q4_K);
    CHECK(quant_fallback_type(GGML_TYPE_Q6_K, 96) == GGML_TYPE_Q8_0);
    CHECK(quant_fallback_type(GGML_TYPE_Q4_K, 100) == GGML_TYPE_F16);
    CHECK(quant_fallback_type(GGML_TYPE_Q8_0, 48) == GGML_TYPE_F16);
    CHECK(quant_fallback_type(GGML_TYPE_F16, 7) == GGML_TYPE_F16);
}

static uint32_t f32_bits(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }
static float bits_f32(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }

static void test_half_conversions(void)
{
    /* f32 -> f16 */
    struct { float f; uint16_t h; } f16[] = {
        {0.0f, 0x0000}, {-0.0f, 0x8000}, {1.0f, 0x3C00}, {-2.0f, 0xC000},
        {65504.0f, 0x7BFF}, {65519.99f, 0x7BFF}, {65520.0f, 0x7C00}, {1e10f, 0x7C00},
        {-1e10f, 0xFC00}, {0x1p-24f, 0x0001}, {0x1p-25f, 0x0000} /* tie -> even (0) */,
        {0x1.8p-24f, 0x0002} /* 1.5 units: tie -> even (2) */, {0x1p-26f, 0x0000},
        {0x1.4p-24f, 0x0001}, {0x1p-14f, 0x0400} /* smallest normal */,
        {0x1.ffcp-15f, 0x0400} /* largest subnormal + half unit: tie -> even normal */,
        {1.0f + 0x1p-11f, 0x3C00} /* tie -> even */, {1.0f + 0x3p-11f, 0x3C02},
        {1.0f + 0x1.1p-11f, 0x3C01}, {INFINITY, 0x7C00}, {-INFINITY, 0xFC00},
    };
    for (size_t i = 0; i < sizeof f16 / sizeof f16[0]; i++) {
        uint16_t h = muser_f32_to_f16(f16[i].f);
        CHECKF(h == f16[i].h, "f16(%a) = 0x%04x want 0x%04x", f16[i].f, h, f16[i].h);
    }
    uint16_t hn = muser_f32_to_f16(NAN);
    CHECKF((hn & 0x7C00) == 0x7C00 && (hn & 0x3FF) != 0, "f16(NaN) = 0x%04x", hn);
    CHECK(isnan(muser_f16_to_f32(hn)));
    /* f16 -> f32 */
    CHECK(muser_f16_to_f32(0x0001) == 0x1p-24f);
    CHECK(muser_f16_to_f32(0x03FF) == 0x1.ff8p-15f);
    CHECK(muser_f16_to_f32(0x7BFF) == 65504.0f);
    CHECK(muser_f16_to_f32(0x7C00) == INFINITY && muser_f16_to_f32(0xFC00) == -INFINITY);
    CHECK(isnan(muser_f16_to_f32(0x7E00)) && isnan(muser_f16_to_f32(0xFC01)));
    float nz = muser_f16_to_f32(0x8000);
    CHECK(nz == 0.0f && signbit(nz));
    CHECK(muser_f16_to_f32(0x8001) == -0x1p-24f);
    /* every finite half survives the round trip */
    int bad = 0;
    for (uint32_t h = 0; h < 0x10000; h++) {
        if ((h & 0x7C00) == 0x7C00)
            continue;
        if (muser_f32_to_f16(muser_f16_to_f32((uint16_t)h)) != h)
            bad++;
    }
    CHECKF(bad == 0, "%d halves do not round-trip", bad);

    /* bf16 */
    CHECK(muser_f32_to_bf16(1.0f) == 0x3F80);
    CHECK(muser_f32_to_bf16(bits_f32(0x3F808000u)) == 0x3F80); /* tie -> even */
    CHECK(muser_f32_to_bf16(bits_f32(0x3F818000u)) == 0x3F82); /* tie -> even (up) */
    CHECK(muser_f32_to_bf16(bits_f32(0x3F808001u)) == 0x3F81);
    CHECK(muser_f32_to_bf16(bits_f32(0x7F7FFFFFu)) == 0x7F80); /* rounds to Inf */
    CHECK(muser_f32_to_bf16(INFINITY) == 0x7F80 && muser_f32_to_bf16(-INFINITY) == 0xFF80);
    CHECK(muser_f32_to_bf16(-0.0f) == 0x8000);
    CHECK(muser_f32_to_bf16(bits_f32(0x00010000u)) == 0x0001); /* subnormal kept */
    uint16_t bn = muser_f32_to_bf16(bits_f32(0x7F800001u)); /* NaN with low payload only */
    CHECKF((bn & 0x7F80) == 0x7F80 && (bn & 0x7F) != 0, "bf16(NaN) = 0x%04x", bn);
    CHECK(f32_bits(muser_bf16_to_f32(0x3F80)) == 0x3F800000u);
    CHECK(isnan(muser_bf16_to_f32(0x7FC0)));
}

int main(void)
{
    check_rng_seed(0x9e3779b97f4a7c15ull);
    bool small = getenv("MUSER_SANITIZED") && getenv("MUSER_SANITIZED")[0] == '1';
    test_type_table();
    test_known_answers();
    test_roundtrip(small ? 16384 : 262144);
    test_degenerate();
    test_bad_args();
    test_mix_rule();
    test_half_conversions();
    return check_report("test_quant");
}
