/* bench_cpu_levels.c — the CPU kernels at each level this CPU has (AVX2, and AVX-512 where
 * present), on one thread, best of --reps, the levels interleaved --rounds times:
 *   gemm: the prefill micro-kernel (gemm_panel), GFLOP/s of a 128-row chunk against 8 panels of
 *         K 2048 (in L1/L2: the micro-kernel's own rate, no unpacking);
 *   dot:  the decode matvec (dot_rows) over 200 Q4_K / Q6_K rows of K 2048 (--k) kept in L2, against
 *         1 and 4 inputs: GB/s of weight bytes (the kernel's compute rate, no DRAM). At K 5632 (the
 *         small preset's ffn_down) four inputs' x no longer fits L1 beside the rows.
 * The AVX-512 level computes the same bits as AVX2 (test_cpu_dots); this says what the width buys.
 * The AVX-512 VNNI level (Q4_K and Q6_K on integer digits of x; docs/cpu-engine.md) is within the contract,
 * not the same bits; its GEMM is AVX-512's.
 *
 *   bench_cpu_levels [--reps 20] [--rounds 3] [--k 2048]
 */
#include "cpu/kernels.h"
#include "quant.h"
#include "util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define DOT_ROWS 200
/* GB/s of weight bytes: DOT_ROWS rows of K of type (random weights) against m inputs */
static double dot_rate(const cpu_kernels *k, uint32_t type, const float *x, uint64_t K, uint32_t m, int reps)
{
    const uint64_t rb = quant_row_bytes(type, K);
    uint8_t *W = malloc(DOT_ROWS * rb);
    float *w = malloc(K * sizeof *w), out[4 * DOT_ROWS];
    cpu_xsums xs[4];
    for (uint32_t i = 0; i < 4; i++) {
        xs[i].s16 = malloc(K / 16 * sizeof(float));
        xs[i].s32 = malloc(K / 32 * sizeof(float));
        xs[i].xp = malloc(K * sizeof(float));
        xs[i].xd = muser_alloc_aligned(CPU_XD_BYTES(K)); /* 64-byte aligned, as the engine keeps it */
        k->xsums(x + i * K, K, &xs[i]);
    }
    for (uint32_t r = 0; r < DOT_ROWS; r++) {
        for (uint64_t i = 0; i < K; i++) w[i] = (float)((r * 31 + i * 17) % 101) * 0.01f - 0.5f;
        quant_quantize_row(type, w, W + r * rb, K);
    }
    double best = 1e30;
    for (int rep = 0; rep < reps; rep++) {
        const double t0 = muser_now_s();
        for (uint32_t r = 0; r < DOT_ROWS; r++) k->dot_rows(type, W + r * rb, x, K, xs, m, K, out + r, DOT_ROWS);
        const double dt = muser_now_s() - t0;
        if (dt < best) best = dt;
    }
    for (uint32_t i = 0; i < 4; i++) {
        free(xs[i].s16);
        free(xs[i].s32);
        free(xs[i].xp);
        muser_free_aligned(xs[i].xd);
    }
    free(W);
    free(w);
    return (double)DOT_ROWS * rb / best / 1e9;
}

int main(int argc, char **argv)
{
    int reps = 20, rounds = 3, kd = 2048;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--reps")) reps = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--rounds")) rounds = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--k")) kd = atoi(argv[i + 1]);
        else {
            fprintf(stderr, "usage: bench_cpu_levels [--reps 20] [--rounds 3] [--k 2048]\n");
            return 2;
        }
    }
    if (kd < 256 || kd % 256 || kd > 4 * 8192) {
        fprintf(stderr, "bench_cpu_levels: --k %d: a multiple of 256 up to 32768\n", kd);
        return 2;
    }
    enum { M = 128, K = 2048, PANELS = 8 };
    float *X = malloc((size_t)M * K * 4), *Xp = malloc((size_t)M * K * 4);
    float *P = malloc((size_t)K * CPU_PANEL * 4), *C = malloc((size_t)M * CPU_PANEL * 4);
    if (!X || !Xp || !P || !C) return 1;
    for (int i = 0; i < M * K; i++) X[i] = (float)(i % 97) * 0.01f - 0.4f;
    for (int i = 0; i < K * CPU_PANEL; i++) P[i] = (float)(i % 89) * 0.01f - 0.4f;
    const char *levels[] = {"avx2", "avxvnni", "avx512", NULL}; /* NULL: the default table (the widest) */
    for (int round = 0; round < rounds; round++)
        for (int v = 0; v < 4; v++) {
            if (levels[v]) setenv("MUSER_SIMD", levels[v], 1);
            else unsetenv("MUSER_SIMD");
            cpu_kernels k;
            cpu_kernels_init(&k, false);
            /* a level this CPU lacks falls back to a lower one; the default only where it is none of these */
            if (v > 0 && strcmp(k.level, levels[v] ? levels[v] : "avx512vnni")) continue;
            k.pack_x(X, K, M, K, Xp);
            double best = 1e30;
            for (int r = 0; r < reps; r++) {
                const double t0 = muser_now_s();
                for (int p = 0; p < PANELS; p++) k.gemm_panel(Xp, M, P, K, C, CPU_PANEL, CPU_PANEL);
                const double dt = muser_now_s() - t0;
                if (dt < best) best = dt;
            }
            printf("round %d  %-10s gemm_panel %3d rows x %d panels x K %d: %6.1f GFLOP/s\n", round + 1, k.level, M,
                   PANELS, K, (double)PANELS * M * K * CPU_PANEL * 2 / best / 1e9);
            const uint32_t types[2] = {GGML_TYPE_Q4_K, GGML_TYPE_Q6_K};
            for (int ti = 0; ti < 2; ti++)
                for (uint32_t m = 1; m <= 4; m += 3) {
                    const double gbs = dot_rate(&k, types[ti], X, (uint64_t)kd, m, reps);
                    printf("round %d  %-10s dot_rows %s, %u input%s, %d rows x K %d in L2: %6.2f GB/s of weights\n",
                           round + 1, k.level, quant_info(types[ti])->name, m, m > 1 ? "s" : "", DOT_ROWS, kd, gbs);
                }
        }
    unsetenv("MUSER_SIMD");
    free(X);
    free(Xp);
    free(P);
    free(C);
    return 0;
}
