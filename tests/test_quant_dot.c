/* test_quant_dot.c — dot products of quantized rows with f32 vectors: the scalar and AVX2 paths,
 * quant_dot_rows and quant_dot_rows_multi, each against the f64 oracle (quant_dot_f64) on the
 * SAME bytes, with a bound (1e-5 of sum|w*x|) tight enough that one flipped nibble, 2-bit field or
 * scale bit is caught — shown by flipping them. Rows come both from the quantizer and from random
 * bytes, so every bit pattern (negative Q6_K scales, -128 in Q8_0) reaches the kernels. */
#include "check.h"
#include "quant.h"
#include "util.h"

#include <math.h>
#include <stdint.h>
#include <string.h>


#define REL_BOUND 1e-5

/* sum |w_i * x_i| in f64 from the dequantized row: the scale the error bound is relative to. */
static double abs_dot(uint32_t type, const void *row, const float *x, uint64_t n)
{
    float *w = malloc(n * sizeof *w);
    quant_dequantize_row(type, row, w, n);
    double s = 0;
    for (uint64_t i = 0; i < n; i++)
        s += fabs((double)w[i] * x[i]);
    free(w);
    return s;
}

/* Random bytes with the f16 scales replaced by sane values, so no Inf/NaN. */
static void random_row(uint32_t type, uint8_t *row, uint64_t n)
{
    uint64_t bytes = quant_row_bytes(type, n);
    for (uint64_t i = 0; i < bytes; i++)
        row[i] = (uint8_t)check_rng_u64();
    const quant_type_info *ti = quant_info(type);
    for (uint64_t b = 0; b < n / ti->block_elems; b++) {
        uint8_t *blk = row + b * ti->block_bytes;
        uint16_t h1 = muser_f32_to_f16(0.001f + 0.01f * check_rng_uniform());
        uint16_t h2 = muser_f32_to_f16(0.001f + 0.01f * check_rng_uniform());
        if (type == GGML_TYPE_Q8_0) {
            memcpy(blk, &h1, 2);
        } else if (type == GGML_TYPE_Q4_K) {
            memcpy(blk, &h1, 2);
            memcpy(blk + 2, &h2, 2);
        } else if (type == GGML_TYPE_Q6_K) {
            memcpy(blk + 208, &h1, 2);
        }
    }
}

/* One row, one x: scalar, SIMD (when the CPU has it), rows and multi paths vs the oracle. */
static void check_row(const char *what, uint32_t type, const uint8_t *row, const float *x,
                      uint64_t n)
{
    const char *nm = quant_info(type)->name;
    double ref = quant_dot_f64(type, row, x, n);
    double bound = REL_BOUND * abs_dot(type, row, x, n) + 1e-30;
    double s = quant_dot_scalar(type, row, x, n);
    CHECKF(fabs(s - ref) <= bound, "%s %s n=%llu scalar %.9g ref %.9g bound %.3g", what, nm,
           (unsigned long long)n, s, ref, bound);
    bool modes[2] = {false, true};
    for (int m = 0; m < 2; m++) {
        if (modes[m] && !quant_simd_available())
            continue;
        quant_simd_enable(modes[m]);
        double v = quant_dot(type, row, x, n);
        CHECKF(fabs(v - ref) <= bound, "%s %s n=%llu %s %.9g ref %.9g bound %.3g", what, nm,
               (unsigned long long)n, quant_simd_name(), v, ref, bound);
        float o = NAN;
        CHECK(quant_dot_rows(type, row, quant_row_bytes(type, n), 1, x, n, &o) == 0);
        CHECKF(fabs(o - ref) <= bound, "%s %s rows %s %.9g ref %.9g", what, nm,
               quant_simd_name(), o, ref);
        float om[2] = {NAN, NAN};
        CHECK(quant_dot_rows_multi(type, row, n, x, 0, 1, om, 1) == 0);
        CHECKF(fabs(om[0] - ref) <= bound, "%s %s multi %s %.9g ref %.9g", what, nm,
               quant_simd_name(), om[0], ref);
    }
    quant_simd_enable(true);
}

static void test_dots(uint64_t base_n)
{
    uint32_t types[] = {GGML_TYPE_F32, GGML_TYPE_F16, GGML_TYPE_BF16,
                        GGML_TYPE_Q8_0, GGML_TYPE_Q4_K, GGML_TYPE_Q6_K};
    for (size_t t = 0; t < sizeof types / sizeof types[0]; t++) {
        uint32_t type = types[t];
        const quant_type_info *ti = quant_info(type);
        /* the base size, one block, and (for the 1-element types) a ragged tail */
        uint64_t ns[3] = {base_n, ti->block_elems == 1 ? 8 : ti->block_elems,
                          ti->block_elems == 1 ? base_n + 7 : base_n + ti->block_elems};
        for (int k = 0; k < 3; k++) {
            uint64_t n = ns[k];
            float *w = malloc(n * 4), *x = malloc(n * 4);
            uint8_t *row = malloc(n * 4 + 64);
            for (uint64_t i = 0; i < n; i++) {
                w[i] = 0.05f * check_rng_gauss();
                x[i] = check_rng_gauss();
            }
            CHECK(quant_quantize_row(type, w, row, n) == 0);
            check_row("quantized", type, row, x, n);
            if (ti->block_elems > 1) {
                random_row(type, row, n);
                check_row("random-bytes", type, row, x, n);
            }
            free(w);
            free(x);
            free(row);
        }
    }
}

/* Flip one field; the dot of the damaged row must miss the original's oracle by more than the
 * bound, on both paths — so the bound above would catch a wrong nibble, 2-bit field or scale. */
static void flip_case(const char *what, uint32_t type, uint64_t n, uint64_t byte, uint8_t mask)
{
    float *w = malloc(n * 4), *x = malloc(n * 4);
    uint8_t *row = malloc(quant_row_bytes(type, n)), *bad = malloc(quant_row_bytes(type, n));
    for (uint64_t i = 0; i < n; i++) {
        w[i] = 0.05f * check_rng_gauss();
        x[i] = 1.0f + check_rng_uniform(); /* positive: a flipped field cannot cancel out */
    }
    CHECK(quant_quantize_row(type, w, row, n) == 0);
    memcpy(bad, row, quant_row_bytes(type, n));
    bad[byte] ^= mask;
    double ref = quant_dot_f64(type, row, x, n);
    double bound = REL_BOUND * abs_dot(type, row, x, n);
    bool modes[2] = {false, true};
    for (int m = 0; m < 2; m++) {
        if (modes[m] && !quant_simd_available())
            continue;
        quant_simd_enable(modes[m]);
        double v = quant_dot(type, bad, x, n);
        CHECKF(fabs(v - ref) > bound, "%s: flip not caught on %s (diff %.3g bound %.3g)", what,
               quant_simd_name(), fabs(v - ref), bound);
        /* and the damaged row is still computed correctly against its own oracle */
        double ref_bad = quant_dot_f64(type, bad, x, n);
        CHECKF(fabs(v - ref_bad) <= REL_BOUND * abs_dot(type, bad, x, n), "%s: damaged row %s",
               what, quant_simd_name());
    }
    quant_simd_enable(true);
    free(w);
    free(x);
    free(row);
    free(bad);
}

static void test_flips(void)
{
    uint64_t n = 4096;
    /* Q4_K: a low nibble, a high nibble (block 3), a packed 6-bit scale, a packed min */
    flip_case("q4_k low nibble", GGML_TYPE_Q4_K, n, 16 + 5, 0x04);
    flip_case("q4_k high nibble", GGML_TYPE_Q4_K, n, 3 * 144 + 16 + 100, 0x40);
    flip_case("q4_k scale sc[4] low bit", GGML_TYPE_Q4_K, n, 4 + 8, 0x01);
    flip_case("q4_k min m[1] bit", GGML_TYPE_Q4_K, n, 4 + 5, 0x02);
    /* Q6_K: a low nibble, one qh 2-bit field, a scale, in the second half of a block */
    flip_case("q6_k ql nibble", GGML_TYPE_Q6_K, n, 64 + 7, 0x10);
    flip_case("q6_k qh field", GGML_TYPE_Q6_K, n, 210 + 128 + 40, 0x20);
    flip_case("q6_k scale", GGML_TYPE_Q6_K, n, 192 + 11, 0x10);
    /* Q8_0: one quant bit, one bit of d */
    flip_case("q8_0 quant", GGML_TYPE_Q8_0, n, 34 * 9 + 2 + 17, 0x04);
    flip_case("q8_0 scale", GGML_TYPE_Q8_0, n, 34 * 2 + 1, 0x04);
}

/* quant_dot_rows over a strided matrix and quant_dot_rows_multi over more x rows than one pass,
 * with strides on both sides. */
static void test_batched(void)
{
    uint32_t types[] = {GGML_TYPE_Q4_K, GGML_TYPE_Q6_K, GGML_TYPE_Q8_0, GGML_TYPE_F16,
                        GGML_TYPE_BF16, GGML_TYPE_F32};
    const uint64_t n = 1024, rows = 9, m = 70, ldx = n + 8, ldo = 3;
    float *x = malloc(m * ldx * 4), *out = malloc(m * ldo * 4);
    for (uint64_t i = 0; i < m * ldx; i++)
        x[i] = check_rng_gauss();
    for (size_t t = 0; t < sizeof types / sizeof types[0]; t++) {
        uint32_t type = types[t];
        const char *nm = quant_info(type)->name;
        uint64_t rb = quant_row_bytes(type, n) + 40; /* padded rows */
        uint8_t *W = calloc(rows, rb);
        float *w = malloc(n * 4);
        for (uint64_t r = 0; r < rows; r++) {
            for (uint64_t i = 0; i < n; i++)
                w[i] = 0.05f * check_rng_gauss();
            quant_quantize_row(type, w, W + r * rb, n);
        }
        bool modes[2] = {false, true};
        for (int md = 0; md < 2; md++) {
            if (modes[md] && !quant_simd_available())
                continue;
            quant_simd_enable(modes[md]);
            float o[9];
            CHECK(quant_dot_rows(type, W, rb, rows, x, n, o) == 0);
            for (uint64_t r = 0; r < rows; r++) {
                double ref = quant_dot_f64(type, W + r * rb, x, n);
                double bound = REL_BOUND * abs_dot(type, W + r * rb, x, n);
                CHECKF(fabs(o[r] - ref) <= bound, "%s rows[%llu] %s", nm, (unsigned long long)r,
                       quant_simd_name());
            }
            for (uint64_t i = 0; i < m * ldo; i++)
                out[i] = -12345.0f;
            CHECK(quant_dot_rows_multi(type, W + 4 * rb, n, x, ldx, m, out, ldo) == 0);
            int bad = 0, touched = 0;
            for (uint64_t i = 0; i < m; i++) {
                double ref = quant_dot_f64(type, W + 4 * rb, x + i * ldx, n);
                double bound = REL_BOUND * abs_dot(type, W + 4 * rb, x + i * ldx, n);
                bad += fabs(out[i * ldo] - ref) > bound;
                touched += out[i * ldo + 1] != -12345.0f || out[i * ldo + 2] != -12345.0f;
            }
            CHECKF(bad == 0, "%s multi %s: %d of %llu rows off", nm, quant_simd_name(), bad,
                   (unsigned long long)m);
            CHECKF(touched == 0, "%s multi wrote between strided outputs", nm);
        }
        quant_simd_enable(true);
        CHECK(quant_dot_rows(type, W, quant_row_bytes(type, n) - 1, 2, x, n, out) == MUSER_E_ARG);
        free(W);
        free(w);
    }
    CHECK(quant_dot_rows(GGML_TYPE_Q4_K, x, 1000, 1, x, 100, out) == MUSER_E_ARG);
    CHECK(quant_dot_rows_multi(GGML_TYPE_Q5_K, x, 256, x, 256, 1, out, 1) == MUSER_E_UNSUPPORTED);
    free(x);
    free(out);
}

static void test_dot_f32_and_switch(void)
{
    uint64_t n = 1031;
    float *a = malloc(n * 4), *b = malloc(n * 4);
    double ref = 0, mag = 0;
    for (uint64_t i = 0; i < n; i++) {
        a[i] = check_rng_gauss();
        b[i] = check_rng_gauss();
        ref += (double)a[i] * b[i];
        mag += fabs((double)a[i] * b[i]);
    }
    quant_simd_enable(false);
    CHECK(!strcmp(quant_simd_name(), "scalar"));
    CHECK(fabs(quant_dot_f32(a, b, n) - ref) <= REL_BOUND * mag);
    quant_simd_enable(true);
    CHECK(!strcmp(quant_simd_name(), quant_simd_available() ? "avx2" : "scalar"));
    CHECK(fabs(quant_dot_f32(a, b, n) - ref) <= REL_BOUND * mag);
    CHECK(quant_dot_f32(a, b, 0) == 0.0f);
    printf("  simd: %s (available: %s)\n", quant_simd_name(), quant_simd_available() ? "yes" : "no");
    free(a);
    free(b);
}

int main(void)
{
    check_rng_seed(0x243f6a8885a308d3ull);
    bool small = getenv("MUSER_SANITIZED") && getenv("MUSER_SANITIZED")[0] == '1';
    test_dot_f32_and_switch();
    test_dots(small ? 1024 : 4096);
    test_flips();
    test_batched();
    return check_report("test_quant_dot");
}
