/* bench_quant.c — the CPU decode hot loop in isolation: a row-by-row matvec (quant_dot per row,
 * and quant_dot_rows) over a ~64 MB Q4_K / Q6_K / Q8_0 / F16 matrix, scalar vs AVX2, reported as
 * GB/s of weight bytes read; plus quant_dot_rows_multi (one weight row against m activation rows,
 * the prefill shape) and quantizer throughput. Single thread; best of --reps runs.
 *
 *   bench_quant [--mb 64] [--reps 5] [--n 6656] [--m 16]
 */
#include "quant.h"
#include "util.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static uint64_t rng_state = 0x853c49e6748fea9bull;
static uint64_t rng_u64(void)
{
    rng_state ^= rng_state >> 12;
    rng_state ^= rng_state << 25;
    rng_state ^= rng_state >> 27;
    return rng_state * 0x2545f4914f6cdd1dull;
}
static float rng_f(void) { return (float)(rng_u64() >> 40) / 16777216.0f - 0.5f; }

/* Random quantized bytes with sane f16 scales (what synth does), so filling 64 MB is quick. */
static void fill_matrix(uint32_t type, uint8_t *W, uint64_t rows, uint64_t n)
{
    uint64_t rb = quant_row_bytes(type, n);
    for (uint64_t i = 0; i < rows * rb; i++)
        W[i] = (uint8_t)rng_u64();
    const quant_type_info *ti = quant_info(type);
    uint16_t h = muser_f32_to_f16(0.002f);
    for (uint64_t r = 0; r < rows; r++)
        for (uint64_t b = 0; b < n / ti->block_elems; b++) {
            uint8_t *blk = W + r * rb + b * ti->block_bytes;
            if (type == GGML_TYPE_Q4_K || type == GGML_TYPE_Q8_0) {
                memcpy(blk, &h, 2);
                if (type == GGML_TYPE_Q4_K)
                    memcpy(blk + 2, &h, 2);
            } else if (type == GGML_TYPE_Q6_K) {
                memcpy(blk + 208, &h, 2);
            } else if (type == GGML_TYPE_F16) {
                uint16_t v = muser_f32_to_f16(rng_f());
                memcpy(blk, &v, 2);
            }
        }
}

static volatile float sink;

int main(int argc, char **argv)
{
    uint64_t mb = 64, reps = 5, n = 6656, m = 16;
    for (int i = 1; i + 1 < argc; i += 2) {
        uint64_t v;
        if (!muser_parse_u64(argv[i + 1], &v) || v == 0) {
            fprintf(stderr, "bench_quant: bad value for %s\n", argv[i]);
            return 2;
        }
        if (!strcmp(argv[i], "--mb")) mb = v;
        else if (!strcmp(argv[i], "--reps")) reps = v;
        else if (!strcmp(argv[i], "--n")) n = v;
        else if (!strcmp(argv[i], "--m")) m = v;
        else {
            fprintf(stderr, "usage: bench_quant [--mb 64] [--reps 5] [--n 6656] [--m 16]\n");
            return 2;
        }
    }
    if (n % 256) {
        fprintf(stderr, "bench_quant: --n must be a multiple of 256\n");
        return 2;
    }
    printf("bench_quant: n=%llu, ~%llu MB per matrix, best of %llu, simd available: %s\n",
           (unsigned long long)n, (unsigned long long)mb, (unsigned long long)reps,
           quant_simd_available() ? "avx2" : "no");
    float *x = malloc(n * 4 * m), *y = NULL;
    for (uint64_t i = 0; i < n * m; i++)
        x[i] = rng_f();

    uint32_t types[] = {GGML_TYPE_Q4_K, GGML_TYPE_Q6_K, GGML_TYPE_Q8_0, GGML_TYPE_F16};
    printf("%-6s %-22s %10s %10s\n", "type", "path", "GB/s", "ms/matvec");
    for (size_t t = 0; t < sizeof types / sizeof types[0]; t++) {
        uint32_t type = types[t];
        uint64_t rb = quant_row_bytes(type, n), rows = mb * 1000000 / rb;
        uint8_t *W = muser_alloc_aligned(rows * rb);
        y = realloc(y, rows * 4);
        if (!W || !y) {
            fprintf(stderr, "bench_quant: out of memory\n");
            return 1;
        }
        fill_matrix(type, W, rows, n);
        struct { const char *name; bool simd; bool rows_call; } paths[] = {
            {"quant_dot scalar", false, false}, {"quant_dot avx2", true, false},
            {"quant_dot_rows avx2", true, true}};
        for (int p = 0; p < 3; p++) {
            if (paths[p].simd && !quant_simd_available())
                continue;
            quant_simd_enable(paths[p].simd);
            double best = 1e30;
            for (uint64_t r = 0; r < reps; r++) {
                double t0 = muser_now_s();
                if (paths[p].rows_call)
                    quant_dot_rows(type, W, rb, rows, x, n, y);
                else
                    for (uint64_t i = 0; i < rows; i++)
                        y[i] = quant_dot(type, W + i * rb, x, n);
                double dt = muser_now_s() - t0;
                best = dt < best ? dt : best;
                sink = y[rows / 2];
            }
            printf("%-6s %-22s %10.2f %10.2f\n", quant_info(type)->name, paths[p].name,
                   (double)(rows * rb) / best / 1e9, best * 1e3);
        }
        /* prefill shape: every weight row against m activation rows; a fraction of the matrix */
        if (quant_simd_available()) {
            quant_simd_enable(true);
            uint64_t mrows = rows / 8;
            float *o = malloc(m * 4);
            double best = 1e30;
            for (uint64_t r = 0; r < reps; r++) {
                double t0 = muser_now_s();
                for (uint64_t i = 0; i < mrows; i++)
                    quant_dot_rows_multi(type, W + i * rb, n, x, n, m, o, 1);
                double dt = muser_now_s() - t0;
                best = dt < best ? dt : best;
                sink = o[0];
            }
            printf("%-6s multi m=%-3llu avx2       %10.2f  (%.1f GFLOP/s)\n", quant_info(type)->name,
                   (unsigned long long)m, (double)(mrows * rb) / best / 1e9,
                   2.0 * (double)(mrows * n * m) / best / 1e9);
            free(o);
        }
        muser_free_aligned(W);
    }

    /* quantizer throughput over 8 MB of f32 */
    uint64_t qn = 2 * 1024 * 1024;
    float *src = malloc(qn * 4);
    uint8_t *dst = malloc(qn * 4);
    for (uint64_t i = 0; i < qn; i++)
        src[i] = 0.05f * rng_f();
    uint32_t qtypes[] = {GGML_TYPE_Q4_K, GGML_TYPE_Q6_K, GGML_TYPE_Q8_0};
    for (int t = 0; t < 3; t++) {
        struct timespec c0, c1;
        clock_gettime(CLOCK_THREAD_CPUTIME_ID, &c0);
        double t0 = muser_now_s();
        for (uint64_t off = 0; off < qn; off += 4096)
            quant_quantize_row(qtypes[t], src + off, dst + quant_row_bytes(qtypes[t], off), 4096);
        double dt = muser_now_s() - t0;
        clock_gettime(CLOCK_THREAD_CPUTIME_ID, &c1);
        double cpu = (double)(c1.tv_sec - c0.tv_sec) + (double)(c1.tv_nsec - c0.tv_nsec) * 1e-9;
        printf("quantize %-5s %8.1f MB/s of f32 input per thread (%.1f MB/s wall)\n",
               quant_info(qtypes[t])->name, (double)qn * 4 / cpu / 1e6, (double)qn * 4 / dt / 1e6);
    }
    free(src);
    free(dst);
    free(x);
    free(y);
    return 0;
}
