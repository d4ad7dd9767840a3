/* bench_cpu_amx.c — a contender for the prefill GEMM on Intel AMX (not in the product yet;
 * docs/cpu-engine.md, "AMX: the next prefill GEMM").
 *
 * The product's GEMM multiplies f32 panels on AVX-512 FMAs. AMX-BF16 multiplies bf16 tiles into
 * f32 at several times that rate, but SPEC §4 rules out rounding activations (or weights) to bf16.
 * An f32 value is instead the exact sum of three bf16 pieces (8 + 8 + 8 significant bits: each
 * rounding to nearest takes 8 bits and leaves an exact f32 remainder), so a product of an f32
 * weight and an f32 activation is nine piece products, of which the six down to 2^-18 of the
 * product are kept (w1x1, w1x2, w1x3, w2x1, w2x2, w3x1) and the three at or under 2^-27 dropped.
 * Each kept product is one TDPBF16PS over 32 k: this program times that loop on the layouts the
 * product would use and checks it against an f64 sum.
 *
 *   weights: the A operand, per 16 weight rows, 32 k and piece one 1 KB tile [16 rows][32 k] bf16,
 *            written from dequantized rows with no transpose (rows K apart would alias in L1);
 *   x:       the B operand in the pair layout, per 32 k and piece [16 k pairs][16 x rows][2];
 *   C:       [16 weight rows][16 x rows] f32, summed over the whole K in one order (per k step
 *            the six products in the order above), so a row's result does not depend on its pass.
 *
 *   bench_cpu_amx [--rows 64] [--xrows 128] [--K 2048] [--reps 20]
 * Prints SKIP and exits 0 on a CPU or kernel without AMX-BF16. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* syscall */
#endif
#include "util.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && __GNUC__ >= 11
#include <cpuid.h>
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>

#define AMX_TGT __attribute__((target("amx-tile,amx-bf16,avx512f,avx512bw,avx512bf16")))

typedef struct {
    uint8_t palette, start;
    uint8_t res[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} tile_cfg;

static bool amx_usable(void)
{
    unsigned a, b, c, d;
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d) || !(d & (1u << 24)) || !(d & (1u << 22)))
        return false; /* AMX-TILE, AMX-BF16 */
    unsigned a1, b1, c1, d1;
    if (!__get_cpuid_count(7, 1, &a1, &b1, &c1, &d1) || !(a1 & (1u << 5)))
        return false; /* AVX512-BF16 (the piece conversions) */
    /* ARCH_REQ_XCOMP_PERM for XTILEDATA: the kernel must let this process use the tile state */
    return syscall(SYS_arch_prctl, 0x1023, 18) == 0;
}

/* eight tiles of 16 rows × 64 bytes: the layout every tile of both kernels has. GCC's
 * _tile_loadconfig tells the compiler it reads only a pointer's worth of the 64-byte config, so
 * the stores that fill it must be forced out before it (a stack copy's stores were dropped). */
static tile_cfg amx_cfg __attribute__((aligned(64)));
static AMX_TGT void amx_config(void)
{
    memset(&amx_cfg, 0, sizeof amx_cfg);
    amx_cfg.palette = 1;
    for (int i = 0; i < 8; i++) {
        amx_cfg.rows[i] = 16;
        amx_cfg.colsb[i] = 64;
    }
    __asm__ volatile("" ::: "memory");
    _tile_loadconfig(&amx_cfg);
}

/* v = p0 + p1 + p2 exactly (finite, normal v) */
static void pieces(float v, uint16_t p[3])
{
    p[0] = muser_f32_to_bf16(v);
    const float r1 = v - muser_bf16_to_f32(p[0]);
    p[1] = muser_f32_to_bf16(r1);
    p[2] = muser_f32_to_bf16(r1 - muser_bf16_to_f32(p[1]));
}

/* C[rows][xrows] = W[rows][K] · X[xrows][K]ᵀ: W pieces wp[3][rows][K], X pieces in the pair layout
 * xp[xg][ks][3][16][16][2]; 4 weight tiles × 1 x group at a time (4 C tiles, 3 x tiles, 1 weight
 * tile: the 8 tile registers). */
static AMX_TGT void gemm_amx(const uint16_t *wp, uint64_t rows, const uint16_t *xp, uint64_t xrows, uint64_t K,
                             float *C)
{
    amx_config();
    const uint64_t nks = K / 32;
    float ct[16 * 16];
    for (uint64_t xg = 0; xg < xrows / 16; xg++)
        for (uint64_t w0 = 0; w0 < rows; w0 += 64) {
            _tile_zero(0);
            _tile_zero(1);
            _tile_zero(2);
            _tile_zero(3);
            for (uint64_t ks = 0; ks < nks; ks++) {
                const uint16_t *xb = xp + (xg * nks + ks) * 3 * 512;
                _tile_loadd(4, xb, 64);
                _tile_loadd(5, xb + 512, 64);
                _tile_loadd(6, xb + 1024, 64);
                const uint16_t *wa = wp + ((w0 / 16) * nks + ks) * 3 * 512;
#define AMX_TILE_ROWS(T)                                                                                   \
    _tile_loadd(7, wa + (T)*nks * 1536, 64);                                                              \
    _tile_dpbf16ps(T, 7, 4);                                                                              \
    _tile_dpbf16ps(T, 7, 5);                                                                              \
    _tile_dpbf16ps(T, 7, 6);                                                                              \
    _tile_loadd(7, wa + (T)*nks * 1536 + 512, 64);                                                        \
    _tile_dpbf16ps(T, 7, 4);                                                                              \
    _tile_dpbf16ps(T, 7, 5);                                                                              \
    _tile_loadd(7, wa + (T)*nks * 1536 + 1024, 64);                                                       \
    _tile_dpbf16ps(T, 7, 4);
                AMX_TILE_ROWS(0)
                AMX_TILE_ROWS(1)
                AMX_TILE_ROWS(2)
                AMX_TILE_ROWS(3)
#undef AMX_TILE_ROWS
            }
#define AMX_STORE(T)                                                                                       \
    _tile_stored(T, ct, 64);                                                                               \
    for (int r = 0; r < 16; r++)                                                                          \
        for (int c = 0; c < 16; c++)                                                                      \
            C[(xg * 16 + c) * rows + w0 + (T)*16 + r] = ct[16 * r + c];
            AMX_STORE(0)
            AMX_STORE(1)
            AMX_STORE(2)
            AMX_STORE(3)
#undef AMX_STORE
        }
    _tile_release();
}

/* The contender with exact integer weights (Q4_K's q, Q6_K's q − 32 are exact in bf16): one
 * weight piece, three products per 32 k, and per 32 k (a Q4_K sub-block) the fold
 * acc += sc·C that the sub-block scale needs: C stored, 16 FMAs, C zeroed. 4 weight tiles × 1 x
 * group; the scale is one f32 per (weight row, 32 k). Returns nothing; C as gemm_amx. */
static AMX_TGT void gemm_amx_int(const uint16_t *wq, const float *sc, uint64_t rows, const uint16_t *xp,
                                 uint64_t xrows, uint64_t K, float *C)
{
    amx_config();
    const uint64_t nks = K / 32;
    float ct[4][16 * 16] __attribute__((aligned(64)));
    for (uint64_t xg = 0; xg < xrows / 16; xg++)
        for (uint64_t w0 = 0; w0 < rows; w0 += 64) {
            __m512 acc[4][16];
            for (int t = 0; t < 4; t++)
                for (int r = 0; r < 16; r++) acc[t][r] = _mm512_setzero_ps();
            for (uint64_t ks = 0; ks < nks; ks++) {
                const uint16_t *xb = xp + (xg * nks + ks) * 3 * 512;
                _tile_loadd(4, xb, 64);
                _tile_loadd(5, xb + 512, 64);
                _tile_loadd(6, xb + 1024, 64);
#define AMX_INT_TILE(T)                                                                                    \
    _tile_zero(T);                                                                                         \
    _tile_loadd(7, wq + ((w0 / 16 + (T)) * nks + ks) * 512, 64);                                          \
    _tile_dpbf16ps(T, 7, 4);                                                                              \
    _tile_dpbf16ps(T, 7, 5);                                                                              \
    _tile_dpbf16ps(T, 7, 6);                                                                              \
    _tile_stored(T, ct[T], 64);
                AMX_INT_TILE(0)
                AMX_INT_TILE(1)
                AMX_INT_TILE(2)
                AMX_INT_TILE(3)
#undef AMX_INT_TILE
                for (int t = 0; t < 4; t++)
                    for (int r = 0; r < 16; r++)
                        acc[t][r] = _mm512_fmadd_ps(_mm512_set1_ps(sc[(w0 + 16 * t + r) * nks + ks]),
                                                    _mm512_load_ps(ct[t] + 16 * r), acc[t][r]);
            }
            for (int t = 0; t < 4; t++)
                for (int r = 0; r < 16; r++) {
                    float v[16];
                    _mm512_storeu_ps(v, acc[t][r]);
                    for (int c = 0; c < 16; c++) C[(xg * 16 + c) * rows + w0 + 16 * t + r] = v[c];
                }
        }
    _tile_release();
}

/* the weight side's cost per weight: f32 rows to the three piece planes (AVX-512 BF16) */
static AMX_TGT void split_rows(const float *w, uint64_t n, uint16_t *p0, uint16_t *p1, uint16_t *p2)
{
    for (uint64_t i = 0; i < n; i += 32) {
        const __m512 a = _mm512_loadu_ps(w + i), b = _mm512_loadu_ps(w + i + 16);
        const __m512bh h0 = _mm512_cvtne2ps_pbh(b, a);
        const __m512i u0 = (__m512i)h0;
        const __m512 a0 = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm512_castsi512_si256(u0)), 16));
        const __m512 b0 =
            _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm512_extracti64x4_epi64(u0, 1)), 16));
        const __m512 ra = _mm512_sub_ps(a, a0), rb = _mm512_sub_ps(b, b0);
        const __m512i u1 = (__m512i)_mm512_cvtne2ps_pbh(rb, ra);
        const __m512 a1 = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm512_castsi512_si256(u1)), 16));
        const __m512 b1 =
            _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm512_extracti64x4_epi64(u1, 1)), 16));
        const __m512i u2 = (__m512i)_mm512_cvtne2ps_pbh(_mm512_sub_ps(rb, b1), _mm512_sub_ps(ra, a1));
        _mm512_storeu_si512(p0 + i, u0);
        _mm512_storeu_si512(p1 + i, u1);
        _mm512_storeu_si512(p2 + i, u2);
    }
}

/* the worst |C − Σ w·x| / Σ |w·x| over all outputs (C [xrows][rows]), the sums in f64; with f32
 * non-NULL also the worst of a sequential f32 FMA chain, for scale */
static double worst_error(const float *w, const float *x, const float *C, uint64_t rows, uint64_t xrows, uint64_t K,
                          double *f32)
{
    double worst = 0, worst32 = 0;
    for (uint64_t i = 0; i < xrows; i++)
        for (uint64_t r = 0; r < rows; r++) {
            double ref = 0, mag = 0;
            float chain = 0;
            for (uint64_t k = 0; k < K; k++) {
                ref += (double)w[r * K + k] * x[i * K + k];
                mag += fabs((double)w[r * K + k] * x[i * K + k]);
                chain = fmaf(w[r * K + k], x[i * K + k], chain);
            }
            worst = fmax(worst, fabs(C[i * rows + r] - ref) / mag);
            worst32 = fmax(worst32, fabs(chain - ref) / mag);
        }
    if (f32) *f32 = worst32;
    return worst;
}

int main(int argc, char **argv)
{
    uint64_t rows = 64, xrows = 128, K = 2048;
    int reps = 20;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--rows")) rows = strtoull(argv[i + 1], NULL, 10);
        else if (!strcmp(argv[i], "--xrows")) xrows = strtoull(argv[i + 1], NULL, 10);
        else if (!strcmp(argv[i], "--K")) K = strtoull(argv[i + 1], NULL, 10);
        else if (!strcmp(argv[i], "--reps")) reps = atoi(argv[i + 1]);
        else {
            fprintf(stderr, "usage: bench_cpu_amx [--rows 64] [--xrows 128] [--K 2048] [--reps 20]\n");
            return 2;
        }
    }
    if (rows % 64 || xrows % 16 || K % 32 || !rows || !xrows || !K || reps < 1) {
        fprintf(stderr, "bench_cpu_amx: rows a multiple of 64, xrows of 16, K of 32\n");
        return 2;
    }
    if (!amx_usable()) {
        printf("SKIP: this CPU or kernel has no usable AMX-BF16 / AVX512-BF16\n");
        return 0;
    }
    float *w = malloc(rows * K * 4), *x = malloc(xrows * K * 4), *C = malloc(rows * xrows * 4);
    uint16_t *wp = malloc(3 * rows * K * 2), *xp = malloc(3 * xrows * K * 2);
    uint64_t s = 0x9E3779B97F4A7C15ull;
    for (uint64_t i = 0; i < rows * K; i++) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        w[i] = (float)((int64_t)(s >> 11) % 2001 - 1000) * 1e-3f * ((s >> 8) & 1 ? 1.f : 0.01f);
    }
    for (uint64_t i = 0; i < xrows * K; i++) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        x[i] = (float)((double)(s >> 11) / 9007199254740992.0 * 2 - 1) * (i % 97 == 0 ? 40.f : 1.f);
    }
    const uint64_t nks = K / 32;
    for (uint64_t r = 0; r < rows; r++)
        for (uint64_t k = 0; k < K; k++) {
            uint16_t p[3];
            pieces(w[r * K + k], p);
            for (int j = 0; j < 3; j++) wp[(((r / 16) * nks + k / 32) * 3 + j) * 512 + (r % 16) * 32 + k % 32] = p[j];
        }
    for (uint64_t r = 0; r < xrows; r++)
        for (uint64_t k = 0; k < K; k++) {
            uint16_t p[3];
            pieces(x[r * K + k], p);
            const uint64_t xg = r / 16, ks = k / 32, pr = (k % 32) / 2;
            for (int j = 0; j < 3; j++)
                xp[((xg * nks + ks) * 3 + j) * 512 + pr * 32 + (r % 16) * 2 + k % 2] = p[j];
        }
    gemm_amx(wp, rows, xp, xrows, K, C);
    double worst_f32;
    const double worst = worst_error(w, x, C, rows, xrows, K, &worst_f32);
    printf("error / sum|w·x|: amx six pieces %.3g, sequential f32 fma %.3g\n", worst, worst_f32);
    double best = 1e30;
    for (int i = 0; i < reps; i++) {
        const double t0 = muser_now_s();
        gemm_amx(wp, rows, xp, xrows, K, C);
        const double t = muser_now_s() - t0;
        if (t < best) best = t;
    }
    const double flop = 2.0 * (double)rows * (double)xrows * (double)K;
    printf("amx gemm %llu weight rows x %llu rows x K %llu: %.1f GFLOP/s (f32-equivalent; %.1f bf16 TFLOP/s of "
           "tile products)\n",
           (unsigned long long)rows, (unsigned long long)xrows, (unsigned long long)K, flop / best * 1e-9,
           6 * flop / best * 1e-12);
    {
        /* integer weights q in 0..15 with a scale per (row, 32 k): W = sc·q */
        uint16_t *wq = malloc(rows * K * 2);
        float *sc = malloc(rows * nks * 4);
        for (uint64_t r = 0; r < rows; r++)
            for (uint64_t k = 0; k < K; k++) {
                s = s * 6364136223846793005ull + 1442695040888963407ull;
                const uint32_t q = (uint32_t)(s >> 60);
                if (k % 32 == 0) sc[r * nks + k / 32] = (float)((s >> 20) % 63 + 1) * 1e-3f;
                w[r * K + k] = sc[r * nks + k / 32] * (float)q;
                wq[((r / 16) * nks + k / 32) * 512 + (r % 16) * 32 + k % 32] = muser_f32_to_bf16((float)q);
            }
        gemm_amx_int(wq, sc, rows, xp, xrows, K, C);
        const double worst_i = worst_error(w, x, C, rows, xrows, K, NULL);
        double bi = 1e30;
        for (int i = 0; i < reps; i++) {
            const double t0 = muser_now_s();
            gemm_amx_int(wq, sc, rows, xp, xrows, K, C);
            const double t = muser_now_s() - t0;
            if (t < bi) bi = t;
        }
        printf("amx gemm, integer weights (3 products + a fold per 32 k): %.1f GFLOP/s, error %.3g\n",
               2.0 * (double)rows * (double)xrows * (double)K / bi * 1e-9, worst_i);
        free(wq);
        free(sc);
    }
    best = 1e30;
    for (int i = 0; i < reps; i++) {
        const double t0 = muser_now_s();
        split_rows(w, rows * K, wp, wp + rows * K, wp + 2 * rows * K);
        const double t = muser_now_s() - t0;
        if (t < best) best = t;
    }
    printf("weights to pieces: %.3f ns per weight\n", best / (double)(rows * K) * 1e9);
    free(w);
    free(x);
    free(C);
    free(wp);
    free(xp);
    return 0;
}
#else
int main(void)
{
    printf("SKIP: built without AMX support (x86-64 GCC 11 or later)\n");
    return 0;
}
#endif
