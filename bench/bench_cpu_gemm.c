/* bench_cpu_gemm.c — the prefill GEMM micro-kernel (cpu_kernels.gemm_panel) at each kernel level
 * this CPU has, on one thread: GFLOP/s of a 128-row chunk against 8 panels of K 2048 (in L1/L2,
 * the micro-kernel's own rate, no unpacking), best of --reps, the levels interleaved --rounds
 * times. The AVX-512 level computes the same bits as AVX2 (test_cpu_dots); this says what the
 * width buys.
 *
 *   bench_cpu_gemm [--reps 20] [--rounds 3]
 */
#include "cpu/kernels.h"
#include "util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int main(int argc, char **argv)
{
    int reps = 20, rounds = 3;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--reps")) reps = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--rounds")) rounds = atoi(argv[i + 1]);
        else {
            fprintf(stderr, "usage: bench_cpu_gemm [--reps 20] [--rounds 3]\n");
            return 2;
        }
    }
    enum { M = 128, K = 2048, PANELS = 8 };
    float *X = malloc((size_t)M * K * 4), *Xp = malloc((size_t)M * K * 4);
    float *P = malloc((size_t)K * CPU_PANEL * 4), *C = malloc((size_t)M * CPU_PANEL * 4);
    if (!X || !Xp || !P || !C) return 1;
    for (int i = 0; i < M * K; i++) X[i] = (float)(i % 97) * 0.01f - 0.4f;
    for (int i = 0; i < K * CPU_PANEL; i++) P[i] = (float)(i % 89) * 0.01f - 0.4f;
    const char *levels[] = {"avx2", NULL}; /* NULL: the default table (the widest) */
    for (int round = 0; round < rounds; round++)
        for (int v = 0; v < 2; v++) {
            if (levels[v]) setenv("MUSER_SIMD", levels[v], 1);
            else unsetenv("MUSER_SIMD");
            cpu_kernels k;
            cpu_kernels_init(&k, false);
            if (!levels[v] && !strcmp(k.level, "avx2")) continue; /* no wider level here */
            k.pack_x(X, K, M, K, Xp);
            double best = 1e30;
            for (int r = 0; r < reps; r++) {
                const double t0 = muser_now_s();
                for (int p = 0; p < PANELS; p++) k.gemm_panel(Xp, M, P, K, C, CPU_PANEL, CPU_PANEL);
                const double dt = muser_now_s() - t0;
                if (dt < best) best = dt;
            }
            printf("round %d  %-7s gemm_panel %3d rows x %d panels x K %d: %6.1f GFLOP/s\n", round + 1, k.level, M,
                   PANELS, K, (double)PANELS * M * K * CPU_PANEL * 2 / best / 1e9);
        }
    unsetenv("MUSER_SIMD");
    free(X);
    free(Xp);
    free(P);
    free(C);
    return 0;
}
