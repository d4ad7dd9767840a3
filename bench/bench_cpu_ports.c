/* bench_cpu_ports.c — does an exact-integer prefill GEMM pay on this core? (docs/cpu-engine.md)
 *
 * The prefill GEMM runs at the core's f32 FMA rate: 16 FMAs per 16 outputs, 16 k and activation
 * row. On exact integer digits of x (three bytes, as the decode dots use) the same work is 12
 * vpdpbusd (4 k per lane, three digits) plus the fold: two shifts to join the digits, one convert,
 * one multiply by the group's scale and one FMA into the f32 sum. That wins only where vpdpbusd
 * issues on pipes the FMAs do not need. This program times (single ops on 12 independent chains,
 * the mixes on 8 activation rows):
 *   fma      one zmm FMA
 *   dpbusd   one zmm vpdpbusd
 *   both     one of each (shared pipes: the sum of the two; separate ones: the larger)
 *   f32 mix  the f32 GEMM's 16 FMAs per (row, 16 k)
 *   int mix  the integer GEMM's 12 vpdpbusd + 2 shifts + convert + multiply + FMA
 * and prints the integer GEMM's ceiling over the f32 one (f32 mix / int mix).
 *
 *   bench_cpu_ports [--iters N]     (N millions of steps; default 50)
 * Prints SKIP and exits 0 on a CPU without AVX-512 VNNI. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>

#define TGT __attribute__((target("avx512f,avx512bw,avx512vnni"), noinline))
#define CH 12

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* the checksum of n vectors (what keeps the timed chains from being dropped) */
static TGT float sum_ps(const __m512 *f, int n)
{
    float r = 0;
    for (int i = 0; i < n; i++)
        r += _mm512_reduce_add_ps(f[i]);
    return r;
}

static TGT float sum_epi32(const __m512i *a, int n)
{
    float r = 0;
    for (int i = 0; i < n; i++)
        r += (float)_mm512_reduce_add_epi32(a[i]);
    return r;
}

/* each returns a checksum so that nothing is dropped; n steps of CH chains */
static TGT float run_fma(long n)
{
    __m512 f[CH];
    const __m512 w = _mm512_set1_ps(1.0001f), x = _mm512_set1_ps(0.25f);
    for (int i = 0; i < CH; i++)
        f[i] = _mm512_set1_ps((float)i);
    for (long s = 0; s < n; s++) {
#pragma GCC unroll 12
        for (int i = 0; i < CH; i++)
            f[i] = _mm512_fmadd_ps(f[i], w, x);
    }
    return sum_ps(f, CH);
}

static TGT float run_dp(long n)
{
    __m512i a[CH];
    const __m512i w = _mm512_set1_epi32(0x01020304), x = _mm512_set1_epi32(0x05060708);
    for (int i = 0; i < CH; i++)
        a[i] = _mm512_set1_epi32(i);
    for (long s = 0; s < n; s++) {
#pragma GCC unroll 12
        for (int i = 0; i < CH; i++)
            a[i] = _mm512_dpbusd_epi32(a[i], w, x);
    }
    return sum_epi32(a, CH);
}

static TGT float run_both(long n)
{
    __m512i a[CH / 2];
    __m512 f[CH / 2];
    const __m512i w = _mm512_set1_epi32(0x01020304), x = _mm512_set1_epi32(0x05060708);
    const __m512 fw = _mm512_set1_ps(1.0001f), fx = _mm512_set1_ps(0.25f);
    for (int i = 0; i < CH / 2; i++) {
        a[i] = _mm512_set1_epi32(i);
        f[i] = _mm512_set1_ps((float)i);
    }
    for (long s = 0; s < n; s++) {
#pragma GCC unroll 6
        for (int i = 0; i < CH / 2; i++) {
            a[i] = _mm512_dpbusd_epi32(a[i], w, x);
            f[i] = _mm512_fmadd_ps(f[i], fw, fx);
        }
    }
    return sum_epi32(a, CH / 2) + sum_ps(f, CH / 2);
}

/* one step: the integer GEMM's work for 8 activation rows, one 16-output column and 16 k (the
 * weights' four zmm of bytes shared by the rows, as a micro-kernel would hold them) */
#define MR 8
static TGT float run_int_mix(long n)
{
    __m512 f[MR];
    __m512i w[4];
    for (int i = 0; i < 4; i++)
        w[i] = _mm512_set1_epi32(0x01020304 + i);
    const __m512 ws = _mm512_set1_ps(0.5f);
    for (int i = 0; i < MR; i++)
        f[i] = _mm512_setzero_ps();
    int32_t dig[MR][3]; /* each row's three digits of x, broadcast from memory as a kernel would */
    for (int i = 0; i < MR; i++)
        for (int j = 0; j < 3; j++)
            dig[i][j] = 0x01010101 * (i + j + 1);
    for (long s = 0; s < n; s++) {
        /* new weights and digits each step as far as the compiler knows: nothing is hoisted */
        __asm__ volatile("" : "+v"(w[0]), "+v"(w[1]), "+v"(w[2]), "+v"(w[3]) : : "memory");
#pragma GCC unroll 8
        for (int i = 0; i < MR; i++) {
            /* Horner over the digits in one sum (the two-step shift keeps it under 2^31); three
             * sums side by side, joined by two shifts and two adds, measured 0.91x instead */
            __m512i acc = _mm512_setzero_si512();
            for (int k = 0; k < 4; k++)
                acc = _mm512_dpbusd_epi32(acc, w[k], _mm512_set1_epi32(dig[i][0]));
            acc = _mm512_slli_epi32(acc, 8);
            for (int k = 0; k < 4; k++)
                acc = _mm512_dpbusd_epi32(acc, _mm512_set1_epi32(dig[i][1]), w[k]);
            acc = _mm512_slli_epi32(acc, 8);
            for (int k = 0; k < 4; k++)
                acc = _mm512_dpbusd_epi32(acc, _mm512_set1_epi32(dig[i][2]), w[k]);
            const __m512 sc = _mm512_mul_ps(ws, _mm512_set1_ps(1.0f + (float)i));
            f[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(acc), sc, f[i]);
        }
    }
    return sum_ps(f, MR);
}

/* the f32 GEMM's work for the same 8 rows, 16 outputs and 16 k */
static TGT float run_f32_mix(long n)
{
    __m512 f[MR];
    const __m512 w = _mm512_set1_ps(1.0001f);
    for (int i = 0; i < MR; i++)
        f[i] = _mm512_setzero_ps();
    for (long s = 0; s < n; s++) {
        for (int k = 0; k < 16; k++) {
#pragma GCC unroll 8
            for (int i = 0; i < MR; i++)
                f[i] = _mm512_fmadd_ps(_mm512_set1_ps(0.25f + (float)i), w, f[i]);
        }
    }
    return sum_ps(f, MR);
}

int main(int argc, char **argv)
{
    long iters = 50;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--iters") && i + 1 < argc) {
            iters = strtol(argv[++i], NULL, 10);
        } else {
            fprintf(stderr, "usage: bench_cpu_ports [--iters MILLIONS]\n");
            return 2;
        }
    }
    if (iters < 1) {
        fprintf(stderr, "bench_cpu_ports: --iters must be at least 1\n");
        return 2;
    }
    __builtin_cpu_init();
    if (!__builtin_cpu_supports("avx512f") || !__builtin_cpu_supports("avx512vnni")) {
        printf("SKIP: no AVX-512 VNNI on this CPU\n");
        return 0;
    }
    const long n = iters * 1000000L;
    float sink = 0;
    double t = now_s();
    sink += run_fma(n);
    const double t_fma = (now_s() - t) / ((double)n * CH);
    t = now_s();
    sink += run_dp(n);
    const double t_dp = (now_s() - t) / ((double)n * CH);
    t = now_s();
    sink += run_both(n);
    const double t_both = (now_s() - t) / ((double)n * CH / 2);
    t = now_s();
    sink += run_f32_mix(n / 8);
    const double t_f32 = (now_s() - t) / ((double)(n / 8) * MR);
    t = now_s();
    sink += run_int_mix(n / 8);
    const double t_int = (now_s() - t) / ((double)(n / 8) * MR);
    printf("zmm fma            %.3f ns\n", 1e9 * t_fma);
    printf("zmm vpdpbusd       %.3f ns\n", 1e9 * t_dp);
    printf("one of each        %.3f ns  (%s)\n", 1e9 * t_both,
           t_both > 1.5 * (t_fma > t_dp ? t_fma : t_dp) ? "shared pipes" : "separate pipes");
    printf("f32 GEMM, row x 16 k x 16 outputs   %.3f ns\n", 1e9 * t_f32);
    printf("int GEMM, row x 16 k x 16 outputs   %.3f ns\n", 1e9 * t_int);
    printf("integer GEMM ceiling over f32: %.2fx   (checksum %g)\n", t_f32 / t_int, (double)(sink != 0));
    return 0;
}
#else
int main(void)
{
    printf("SKIP: bench_cpu_ports needs x86-64 and GCC\n");
    return 0;
}
#endif
