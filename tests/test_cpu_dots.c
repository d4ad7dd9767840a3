/* test_cpu_dots.c — the CPU engine's dot products (src/cpu/kernels.c) against the f64 oracle
 * (quant_dot_f64) on the SAME bytes, for every type muser computes with and both kernel tables:
 * AVX2 when the CPU has it, and the scalar one (whose dot_row is quant_dot, the plain reference).
 * The bound, 1e-5 of sum|w*x|, is tight enough that one flipped nibble, 2-bit field or scale bit
 * is caught — shown by flipping them. Rows come both from the quantizer and from random bytes, so
 * every bit pattern (negative Q6_K scales, -128 in Q8_0) reaches the kernels.
 *
 *   - dot_row (the decode dot, x's sums and lane-order copy from xsums) on one row: the base size,
 *     one block, and a ragged tail for the one-element types;
 *   - the decode matvec: a strided matrix (padded rows) against one xsums shared by every row;
 *   - the batch shape: unpack_panel of strided rows (a full panel and a partial one), pack_x of
 *     more activation rows than one micro-kernel group (strided), gemm_panel into strided outputs:
 *     every output within the bound, nothing written between them;
 *   - the errors the kernels report: an unsupported type (NaN from dot_row, MUSER_E_UNSUPPORTED
 *     from dequant_row and unpack_panel), a block type's n off its block (MUSER_E_ARG);
 *   - the table choice: MUSER_SIMD=0 gives the scalar table, and without it the AVX2 one exactly
 *     when the CPU has AVX2, FMA and F16C; with AVX-512F its GEMM too (MUSER_SIMD=avx2 keeps
 *     AVX2's), whose outputs must be AVX2's bits; with AVX-512 VNNI the Q4_K and Q6_K decode dots on integer
 *     digits of x (MUSER_SIMD=avx512 keeps the f32 ones): within the bound, not AVX2's bits, and
 *     every other output still AVX2's bits; with AVX-VNNI (MUSER_SIMD=avxvnni on an AVX-512 CPU)
 *     the same digit dots at 256 bits on the AVX2 table: avx512vnni's digits and outputs, bit
 *     for bit, where the CPU has both, and AVX2's bits for everything else;
 *   - the digits' edges at that level: a group whose largest element rounds up to 2^23 (the
 *     largest float under a power of two), groups of zeros and of denormals beside normal ones,
 *     a NaN or an infinity in x making the dots that read it NaN; and dot_rows over 1..9 inputs
 *     giving each input dot_row's bits (row invariance within the level). */
#include "check.h"
#include "cpu/kernels.h"
#include "quant.h"
#include "util.h"

#include <math.h>
#include <stdint.h>
#include <string.h>

#define REL_BOUND 1e-5

typedef struct table {
    const char *name;
    cpu_kernels kn;
} table;

static table tables[5];
static int n_tables;

static const uint32_t all_types[] = {GGML_TYPE_F32, GGML_TYPE_F16, GGML_TYPE_BF16,
                                     GGML_TYPE_Q8_0, GGML_TYPE_Q4_K, GGML_TYPE_Q6_K};
#define N_TYPES (sizeof all_types / sizeof all_types[0])

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

/* True when |got - oracle| is within the bound for this row and x. */
static bool near_oracle(double got, uint32_t type, const void *row, const float *x, uint64_t n)
{
    return fabs(got - quant_dot_f64(type, row, x, n)) <= REL_BOUND * abs_dot(type, row, x, n) + 1e-30;
}

/* x's sums and lane-order copy as the decode route computes them, once per vector. */
static cpu_xsums xsums_new(const cpu_kernels *kn, const float *x, uint64_t n)
{
    cpu_xsums xs = {malloc((n / 16 + 1) * sizeof(float)), malloc((n / 32 + 1) * sizeof(float)),
                    malloc((n + 32) * sizeof(float)), malloc(CPU_XD_BYTES(n))};
    kn->xsums(x, n, &xs);
    return xs;
}

static void xsums_free(cpu_xsums *xs)
{
    free(xs->s16);
    free(xs->s32);
    free(xs->xp);
    free(xs->xd);
}

static float dot_row(const cpu_kernels *kn, uint32_t type, const void *row, const float *x,
                     uint64_t n)
{
    cpu_xsums xs = xsums_new(kn, x, n);
    const float v = kn->dot_row(type, row, x, &xs, n);
    xsums_free(&xs);
    return v;
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

/* One row, one x: dot_row of every table vs the oracle. */
static void check_row(const char *what, uint32_t type, const uint8_t *row, const float *x,
                      uint64_t n)
{
    const char *nm = quant_info(type)->name;
    const double ref = quant_dot_f64(type, row, x, n);
    const bool digits = type == GGML_TYPE_Q4_K || type == GGML_TYPE_Q6_K;
    float avx2 = 0, vnni512 = 0;
    bool have512 = false;
    for (int t = 0; t < n_tables; t++) {
        const char *tn = tables[t].name;
        const float v = dot_row(&tables[t].kn, type, row, x, n);
        CHECKF(near_oracle(v, type, row, x, n), "%s %s n=%llu %s %.9g ref %.9g", what, nm,
               (unsigned long long)n, tn, v, ref);
        if (!strcmp(tn, "avx2"))
            avx2 = v;
        if (!strcmp(tn, "avx512vnni")) {
            vnni512 = v;
            have512 = true;
        }
        /* the 512-bit dots are AVX2's lanes side by side: the same bits (and the VNNI levels'
         * for every type but Q4_K and Q6_K, which they take on integer digits) */
        if (!strcmp(tn, "avx512") || (!digits && (!strcmp(tn, "avx512vnni") || !strcmp(tn, "avxvnni"))))
            CHECKF(!memcmp(&v, &avx2, sizeof v), "%s %s n=%llu: %s %.9g, avx2 %.9g", what, nm,
                   (unsigned long long)n, tn, v, avx2);
        /* the 256-bit digit dots are the 512-bit ones' halves side by side (avxvnni comes last) */
        if (digits && have512 && !strcmp(tn, "avxvnni"))
            CHECKF(!memcmp(&v, &vnni512, sizeof v), "%s %s n=%llu: avxvnni %.9g, avx512vnni %.9g", what, nm,
                   (unsigned long long)n, v, vnni512);
    }
}

static void test_dots(uint64_t base_n)
{
    for (size_t t = 0; t < N_TYPES; t++) {
        uint32_t type = all_types[t];
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
 * bound, on every table — so the bound above would catch a wrong nibble, 2-bit field or scale. */
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
    const double ref = quant_dot_f64(type, row, x, n);
    const double bound = REL_BOUND * abs_dot(type, row, x, n);
    for (int t = 0; t < n_tables; t++) {
        const double v = dot_row(&tables[t].kn, type, bad, x, n);
        CHECKF(fabs(v - ref) > bound, "%s: flip not caught on %s (diff %.3g bound %.3g)", what,
               tables[t].name, fabs(v - ref), bound);
        /* and the damaged row is still computed correctly against its own oracle */
        CHECKF(near_oracle(v, type, bad, x, n), "%s: damaged row %s", what, tables[t].name);
    }
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

/* A strided matrix through both routes' kernels: the decode matvec (dot_row per row, one xsums
 * for all of them) and the batch shape (panels of the same rows against m strided x rows). */
static void test_matrix(void)
{
    enum { N = 1024, ROWS = CPU_PANEL + 3, M = 70, LDX = N + 8, LDC = ROWS + 5 };
    const float sentinel = -12345.0f;
    float *x = malloc(M * LDX * 4), *C = malloc(M * LDC * 4), *C2 = malloc(M * LDC * 4), *Xp = malloc(M * N * 4);
    float *tmp = malloc(CPU_PANEL * N * 4), *panel = malloc(N * CPU_PANEL * 4);
    for (uint64_t i = 0; i < (uint64_t)M * LDX; i++)
        x[i] = check_rng_gauss();
    for (size_t t = 0; t < N_TYPES; t++) {
        const uint32_t type = all_types[t];
        const char *nm = quant_info(type)->name;
        const uint64_t rb = quant_row_bytes(type, N) + 40; /* padded rows */
        uint8_t *W = calloc(ROWS, rb);
        float *w = malloc(N * 4);
        for (uint64_t r = 0; r < ROWS; r++) {
            for (uint64_t i = 0; i < N; i++)
                w[i] = 0.05f * check_rng_gauss();
            CHECK(quant_quantize_row(type, w, W + r * rb, N) == 0);
        }
        for (int tb = 0; tb < n_tables; tb++) {
            const cpu_kernels *kn = &tables[tb].kn;
            const char *tn = tables[tb].name;
            cpu_xsums xs = xsums_new(kn, x, N);
            int bad = 0;
            for (uint64_t r = 0; r < ROWS; r++)
                bad += !near_oracle(kn->dot_row(type, W + r * rb, x, &xs, N), type, W + r * rb, x, N);
            CHECKF(bad == 0, "%s matvec %s: %d of %d rows off", nm, tn, bad, ROWS);
            xsums_free(&xs);

            for (uint64_t i = 0; i < (uint64_t)M * LDC; i++)
                C[i] = sentinel;
            kn->pack_x(x, LDX, M, N, Xp);
            for (uint64_t r0 = 0; r0 < ROWS; r0 += CPU_PANEL) {
                const uint32_t nc = (uint32_t)(ROWS - r0 < CPU_PANEL ? ROWS - r0 : CPU_PANEL);
                CHECK(kn->unpack_panel(type, W + r0 * rb, rb, nc, N, tmp, panel) == 0);
                kn->gemm_panel(Xp, M, panel, N, C + r0, LDC, nc);
            }
            int off = 0, touched = 0;
            for (uint64_t i = 0; i < M; i++) {
                for (uint64_t r = 0; r < ROWS; r++)
                    off += !near_oracle(C[i * LDC + r], type, W + r * rb, x + i * LDX, N);
                for (uint64_t c = ROWS; c < LDC; c++)
                    touched += C[i * LDC + c] != sentinel;
            }
            CHECKF(off == 0, "%s panels %s: %d of %d outputs off", nm, tn, off, M * ROWS);
            CHECKF(touched == 0, "%s panels %s wrote between strided outputs", nm, tn);
            /* the wider GEMM is the same sums: AVX-512's outputs are AVX2's bits */
            if (!strcmp(tn, "avx2"))
                memcpy(C2, C, (size_t)M * LDC * 4);
            if (!strcmp(tn, "avx512") || !strcmp(tn, "avx512vnni") || !strcmp(tn, "avxvnni"))
                CHECKF(!memcmp(C2, C, (size_t)M * LDC * 4), "%s panels: %s differs from avx2", nm, tn);
        }
        free(W);
        free(w);
    }
    free(x);
    free(C);
    free(C2);
    free(Xp);
    free(tmp);
    free(panel);
}

/* What the kernels refuse: a type muser does not compute with, a block type's n off its block. */
static void test_errors(void)
{
    static uint8_t row[4096];
    static float x[1024], tmp[CPU_PANEL * 1024], panel[1024 * CPU_PANEL], dst[1024];
    for (int t = 0; t < n_tables; t++) {
        const cpu_kernels *kn = &tables[t].kn;
        const char *tn = tables[t].name;
        CHECKF(isnan(dot_row(kn, GGML_TYPE_Q5_K, row, x, 256)), "%s: q5_k dot", tn);
        CHECKF(kn->dequant_row(GGML_TYPE_Q5_K, row, dst, 256) == MUSER_E_UNSUPPORTED, "%s", tn);
        CHECKF(kn->unpack_panel(GGML_TYPE_Q5_K, row, 176, 2, 256, tmp, panel) == MUSER_E_UNSUPPORTED,
               "%s", tn);
        CHECKF(kn->dequant_row(GGML_TYPE_Q4_K, row, dst, 100) == MUSER_E_ARG, "%s", tn);
        CHECKF(kn->unpack_panel(GGML_TYPE_Q4_K, row, 144, 2, 100, tmp, panel) == MUSER_E_ARG, "%s",
               tn);
        CHECKF(kn->unpack_panel(GGML_TYPE_Q8_0, row, 34, 2, 40, tmp, panel) == MUSER_E_ARG, "%s", tn);
        CHECKF(dot_row(kn, GGML_TYPE_F32, row, x, 0) == 0.0f, "%s: empty f32 dot", tn);
    }
}

/* The digits' edges, at every table (the VNNI level is the one they are about): x whose group
 * maxima round up to 2^23 s, zero and denormal groups beside normal ones, non-finite x; and
 * dot_rows over 1..9 inputs against dot_row per input, bit for bit. */
static void test_digit_edges_type(uint32_t type)
{
    const char *nm = quant_info(type)->name;
    enum { N = 1024, M = 9 };
    float *x = malloc(M * N * 4), *w = malloc(N * 4), out[M];
    uint8_t *row = malloc(quant_row_bytes(type, N));
    for (uint64_t i = 0; i < N; i++)
        w[i] = 0.05f * check_rng_gauss();
    CHECK(quant_quantize_row(type, w, row, N) == 0);
    for (uint64_t i = 0; i < (uint64_t)M * N; i++)
        x[i] = check_rng_gauss();
    for (int g = 0; g < N / 32; g++) {
        float *xg = x + 32 * g;
        switch (g % 4) {
        case 0: xg[g % 32] = nextafterf(2.0f, 0.0f); break;  /* rint(x / s) = 2^23 */
        case 1: xg[g % 32] = -2.0f; break;                   /* -2^23 s */
        case 2: for (int i = 0; i < 32; i++) xg[i] = 0.0f; break;
        default: for (int i = 0; i < 32; i++) xg[i] = 1e-40f * (float)(i - 16); break;
        }
    }
    uint8_t *xd512 = malloc((size_t)M * CPU_XD_BYTES(N));
    float out512[M];
    bool have512 = false;
    for (int t = 0; t < n_tables; t++) {
        const cpu_kernels *kn = &tables[t].kn;
        const char *tn = tables[t].name;
        const float v = dot_row(kn, type, row, x, N);
        CHECKF(near_oracle(v, type, row, x, N), "%s %s digit edges: %.9g ref %.9g", tn, nm, v,
               quant_dot_f64(type, row, x, N));
        cpu_xsums xs[M];
        for (int i = 0; i < M; i++)
            xs[i] = xsums_new(kn, x + i * N, N);
        /* both VNNI levels write the same digits and give the same bits (avxvnni comes last) */
        const size_t xdb = (size_t)N / 256 * CPU_XD_BLOCK;
        if (!strcmp(tn, "avx512vnni")) {
            for (int i = 0; i < M; i++)
                memcpy(xd512 + i * xdb, xs[i].xd, xdb);
            kn->dot_rows(type, row, x, N, xs, M, N, out512, 1);
            have512 = true;
        }
        if (have512 && !strcmp(tn, "avxvnni")) {
            int xd_same = 0;
            for (int i = 0; i < M; i++)
                xd_same += !memcmp(xd512 + i * xdb, xs[i].xd, xdb);
            CHECKF(xd_same == M, "%s: avxvnni's digits are avx512vnni's for %d of %d inputs", nm, xd_same, M);
            kn->dot_rows(type, row, x, N, xs, M, N, out, 1);
            CHECKF(!memcmp(out, out512, sizeof out), "%s digit edges: avxvnni's dot_rows not avx512vnni's bits", nm);
        }
        for (uint32_t m = 1; m <= M; m++) {
            kn->dot_rows(type, row, x, N, xs, m, N, out, 1);
            int same = 0;
            for (uint32_t i = 0; i < m; i++) {
                const float one = kn->dot_row(type, row, x + i * N, &xs[i], N);
                same += !memcmp(&one, &out[i], sizeof one);
            }
            CHECKF(same == (int)m, "%s %s dot_rows of %u inputs: %d of them dot_row's bits", tn, nm, m, same);
        }
        for (int i = 0; i < M; i++)
            xsums_free(&xs[i]);
        const float keep = x[300];
        x[300] = NAN;
        CHECKF(isnan(dot_row(kn, type, row, x, N)), "%s: a NaN in x, %s dot not NaN", tn, nm);
        x[300] = INFINITY;
        const float vi = dot_row(kn, type, row, x, N);
        CHECKF(!isfinite(vi), "%s: an infinity in x, %s dot %.9g", tn, nm, vi);
        x[300] = keep;
    }
    free(xd512);
    free(x);
    free(w);
    free(row);
}

/* The digit dots' int32 headroom: every quant at its largest (Q4_K 15, Q6_K 63) against x whose
 * every element is its group's extreme digit (X = -2^23, or 2^23 - 1), so each 16-element group's
 * sum of q X is as large as it gets (Q4_K 240·2^23, under 2^31; Q6_K's would pass it, so its
 * dots keep two partial sums) */
static void test_digit_headroom(uint32_t type)
{
    enum { N = 512 };
    const quant_type_info *ti = quant_info(type);
    uint8_t *row = malloc(quant_row_bytes(type, N));
    float x[N];
    memset(row, 0xFF, quant_row_bytes(type, N));
    const uint16_t d = muser_f32_to_f16(0.01f), zero = 0;
    for (uint64_t b = 0; b < N / ti->block_elems; b++) {
        uint8_t *blk = row + b * ti->block_bytes;
        if (type == GGML_TYPE_Q4_K) { /* all scales and mins 63, dmin 0 */
            memcpy(blk, &d, 2);
            memcpy(blk + 2, &zero, 2);
        } else { /* scales 127 */
            memset(blk + 192, 127, 16);
            memcpy(blk + 208, &d, 2);
        }
    }
    for (int sign = 0; sign < 2; sign++) {
        for (int i = 0; i < N; i++) x[i] = sign ? -2.0f : nextafterf(2.0f, 0.0f);
        check_row(sign ? "headroom, x = -2^23 s" : "headroom, x = (2^23 - 1) s", type, row, x, N);
    }
    free(row);
}

static void test_digit_edges(void)
{
    test_digit_edges_type(GGML_TYPE_Q4_K);
    test_digit_edges_type(GGML_TYPE_Q6_K);
    test_digit_headroom(GGML_TYPE_Q4_K);
    test_digit_headroom(GGML_TYPE_Q6_K);
}

/* dot_tile (the tables that have one): 37 rows of K 5632 (three K-chunks, three row tiles) against
 * 1..9 inputs, every output dot_rows's bits; a type without a state kernel (Q8_0) the same. */
static void test_dot_tile(void)
{
    enum { N = 5632, M = 9, ROWS = 37 };
    const uint32_t types[3] = {GGML_TYPE_Q4_K, GGML_TYPE_Q6_K, GGML_TYPE_Q8_0};
    float *x = malloc(M * N * 4), *w = malloc(N * 4), *t1 = malloc(M * ROWS * 4), *t2 = malloc(M * ROWS * 4);
    for (uint64_t i = 0; i < (uint64_t)M * N; i++)
        x[i] = check_rng_gauss();
    for (int ti = 0; ti < 3; ti++) {
        const uint32_t type = types[ti];
        const uint64_t rb = quant_row_bytes(type, N);
        uint8_t *W = malloc(ROWS * rb);
        for (int r = 0; r < ROWS; r++) {
            for (uint64_t i = 0; i < N; i++)
                w[i] = 0.05f * check_rng_gauss();
            CHECK(quant_quantize_row(type, w, W + r * rb, N) == 0);
        }
        for (int t = 0; t < n_tables; t++) {
            const cpu_kernels *kn = &tables[t].kn;
            if (!kn->dot_tile)
                continue;
            cpu_xsums xs[M];
            for (int i = 0; i < M; i++)
                xs[i] = xsums_new(kn, x + i * N, N);
            for (uint32_t m = 1; m <= M; m += 2) {
                for (int r = 0; r < ROWS; r++)
                    kn->dot_rows(type, W + r * rb, x, N, xs, m, N, t1 + r, ROWS);
                for (uint64_t i = 0; i < (uint64_t)M * ROWS; i++)
                    t2[i] = NAN;
                kn->dot_tile(type, W, rb, ROWS, x, N, xs, m, N, t2, ROWS);
                CHECKF(!memcmp(t1, t2, (size_t)m * ROWS * 4), "%s %s dot_tile of %u inputs: not dot_rows's bits",
                       tables[t].name, quant_info(type)->name, m);
            }
            for (int i = 0; i < M; i++)
                xsums_free(&xs[i]);
        }
        free(W);
    }
    free(x);
    free(w);
    free(t1);
    free(t2);
}

static bool cpu_has_avx2(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
           __builtin_cpu_supports("f16c");
#else
    return false;
#endif
}

/* MUSER_SIMD=0 selects the scalar table; then the tables every test runs. */
static void init_tables(void)
{
    cpu_kernels k;
    setenv("MUSER_SIMD", "0", 1);
    cpu_kernels_init(&k, false);
    CHECK(!k.simd);
    unsetenv("MUSER_SIMD");
    cpu_kernels_init(&k, false);
    CHECK(k.simd == cpu_has_avx2());
    tables[0].name = "scalar";
    cpu_kernels_init(&tables[0].kn, true);
    CHECK(!tables[0].kn.simd);
    n_tables = 1;
    if (k.simd) {
        cpu_kernels a2;
        setenv("MUSER_SIMD", "avx2", 1);
        cpu_kernels_init(&a2, false);
        unsetenv("MUSER_SIMD");
        CHECK(!strcmp(a2.level, "avx2"));
        tables[n_tables++] = (table){"avx2", a2};
        if (!strcmp(k.level, "avx512vnni")) {
            cpu_kernels a5;
            setenv("MUSER_SIMD", "avx512", 1);
            cpu_kernels_init(&a5, false);
            unsetenv("MUSER_SIMD");
            CHECK(!strcmp(a5.level, "avx512"));
            tables[n_tables++] = (table){"avx512", a5};
            tables[n_tables++] = (table){"avx512vnni", k};
        } else if (!strcmp(k.level, "avx512")) {
            tables[n_tables++] = (table){"avx512", k};
        }
        /* AVX-VNNI: the default where the CPU has no AVX-512, else MUSER_SIMD=avxvnni */
        cpu_kernels av;
        setenv("MUSER_SIMD", "avxvnni", 1);
        cpu_kernels_init(&av, false);
        unsetenv("MUSER_SIMD");
        if (!strcmp(av.level, "avxvnni"))
            tables[n_tables++] = (table){"avxvnni", av};
        else
            CHECK(strcmp(k.level, "avxvnni") != 0);
    }
    printf("  kernel tables:");
    for (int t = 0; t < n_tables; t++)
        printf(" %s", tables[t].name);
    printf("%s\n", n_tables == 1 ? " (no AVX2+FMA+F16C)" : "");
}

int main(void)
{
    check_rng_seed(0x243f6a8885a308d3ull);
    bool small = getenv("MUSER_SANITIZED") && getenv("MUSER_SANITIZED")[0] == '1';
    init_tables();
    test_dots(small ? 1024 : 4096);
    test_flips();
    test_matrix();
    test_errors();
    test_digit_edges();
    test_dot_tile();
    return check_report("test_cpu_dots");
}
