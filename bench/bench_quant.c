/* bench_quant.c — the CPU engine's dot kernels (src/cpu/kernels.c) per weight type, one thread:
 * the decode matvec (dot_row per row, x's sums computed once per vector, as the decode route
 * does) over a ~64 MB Q4_K / Q6_K / Q8_0 / F16 matrix on the scalar table (quant_dot) and the
 * AVX2 one, reported as GB/s of weight bytes read; the batch shape (panels of CPU_PANEL rows
 * unpacked once and multiplied against m activation rows packed by pack_x) as GB/s and GFLOP/s;
 * and quantizer throughput. Best of --reps runs. bench_cpu_matvec takes the decode dot to two
 * threads and through the pool.
 *
 *   bench_quant [--mb 64] [--reps 5] [--n 6656] [--m 16]
 */
#include "cpu/kernels.h"
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
    cpu_kernels tables[2];
    cpu_kernels_init(&tables[0], true);
    cpu_kernels_init(&tables[1], false);
    const int n_tables = tables[1].simd ? 2 : 1;
    printf("bench_quant: n=%llu, ~%llu MB per matrix, best of %llu, kernel tables: %s\n",
           (unsigned long long)n, (unsigned long long)mb, (unsigned long long)reps,
           n_tables == 2 ? "scalar, avx2" : "scalar");
    float *x = malloc(n * 4 * m), *y = NULL;
    for (uint64_t i = 0; i < n * m; i++)
        x[i] = rng_f();
    cpu_xsums xs = {malloc(n / 16 * 4), malloc(n / 32 * 4), malloc(n * 4), malloc(CPU_XD_BYTES(n))};
    float *Xp = malloc(n * 4 * m), *C = malloc(m * CPU_PANEL * 4);
    float *tmp = muser_alloc_aligned(CPU_PANEL * n * 4), *panel = muser_alloc_aligned(n * CPU_PANEL * 4);
    if (!x || !xs.s16 || !xs.s32 || !xs.xp || !xs.xd || !Xp || !C || !tmp || !panel) {
        fprintf(stderr, "bench_quant: out of memory\n");
        return 1;
    }

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
        for (int k = 0; k < n_tables; k++) {
            const cpu_kernels *kn = &tables[k];
            double best = 1e30;
            for (uint64_t r = 0; r < reps; r++) {
                double t0 = muser_now_s();
                kn->xsums(x, n, &xs);
                for (uint64_t i = 0; i < rows; i++)
                    y[i] = kn->dot_row(type, W + i * rb, x, &xs, n);
                double dt = muser_now_s() - t0;
                best = dt < best ? dt : best;
                sink = y[rows / 2];
            }
            printf("%-6s %-22s %10.2f %10.2f\n", quant_info(type)->name,
                   kn->simd ? "dot_row avx2" : "dot_row scalar", (double)(rows * rb) / best / 1e9,
                   best * 1e3);
        }
        /* batch shape: every panel of rows against m activation rows; an eighth of the matrix
         * (at least one panel) */
        const cpu_kernels *kn = &tables[n_tables - 1];
        uint64_t prows = rows / 8 / CPU_PANEL * CPU_PANEL;
        if (prows == 0)
            prows = rows / CPU_PANEL * CPU_PANEL;
        double best = 1e30;
        for (uint64_t r = 0; r < reps; r++) {
            double t0 = muser_now_s();
            kn->pack_x(x, n, m, n, Xp);
            for (uint64_t r0 = 0; r0 < prows; r0 += CPU_PANEL) {
                (void)kn->unpack_panel(type, W + r0 * rb, rb, CPU_PANEL, n, tmp, panel);
                kn->gemm_panel(Xp, m, panel, n, C, CPU_PANEL, CPU_PANEL);
            }
            double dt = muser_now_s() - t0;
            best = dt < best ? dt : best;
            sink = C[0];
        }
        char path[48];
        snprintf(path, sizeof path, "panels m=%llu %s", (unsigned long long)m,
                 kn->simd ? "avx2" : "scalar");
        printf("%-6s %-22s %10.2f  (%.1f GFLOP/s)\n", quant_info(type)->name, path,
               (double)(prows * rb) / best / 1e9, 2.0 * (double)(prows * n * m) / best / 1e9);
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
    free(xs.s16);
    free(xs.s32);
    free(xs.xp);
    free(xs.xd);
    free(Xp);
    free(C);
    muser_free_aligned(tmp);
    muser_free_aligned(panel);
    return 0;
}
