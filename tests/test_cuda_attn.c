/* test_cuda_attn.c — the decode split attention (+ combine, + gate) of both kernels, tc (tensor
 * cores) and v1 (CUDA cores), against an f64 reference, through muser_cuda_attn_run().
 *
 * Glimmer's geometry (32 query heads, 2 KV heads, D 128) on FULL planes (head-major; lengths 1,
 * 33, 1000, 2049 with a partial last split and tile, 4096 with 16 tiles per warp; 100, 8100,
 * 4096 and 8192 for the combine over 2 .. 256 used splits) and SWA rings (token-major,
 * wrapping, a full window), plus a GQA 4:1 D 64 geometry that must fall back to v1. Each tc call
 * is run twice and must give the same bits. Error: max
 * |out − ref| over every head and dimension; |v| ≤ 1 and sigmoid ≤ 1, so that is the error per
 * unit of V. Bound 1e-5: f32 arithmetic lands near 1e-7 .. 1e-6 here; q or p rounded to f16 once
 * (lossy storage, what SPEC §4 refuses) lands at 2e-5 .. 1e-3 on these cases — the test emulates
 * that on the CPU and checks the bound would catch it. Fail closed: a NaN in an attended K or V
 * row, or an Inf in q, makes that KV head's (or that head's) outputs non-finite; a NaN in a row
 * outside the attended range changes nothing (bit for bit). The QK-norm/RoPE/KV store folded into
 * the tc split kernel (the route's default there) is checked against the separate kernel: K/V
 * planes bit-identical, outputs within the bound.
 * SKIP (77) when built without CUDA or when no GPU is present. */
#include "check.h"

#ifdef MUSER_HAVE_CUDA
#include "cuda/attention.h"
#endif

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define BOUND 1e-5

#ifdef MUSER_HAVE_CUDA
static uint64_t rng_state = 0x243F6A8885A308D3ull;
static uint32_t rng(void)
{
    rng_state = rng_state * 6364136223846793005ull + 1442695040888963407ull;
    return (uint32_t)(rng_state >> 33);
}
/* uniform in [0, 1), 24 bits of rng() */
static float urand(void) { return (float)(rng() >> 8) / 16777216.0f; }

/* f16 bits of k/1024, |k| <= 1024 (exact: normal f16 or zero) */
static uint16_t f16_of_k(int k)
{
    if (k == 0) return 0;
    const uint16_t sign = k < 0 ? 0x8000 : 0;
    int e;
    const double f = frexp(fabs(k / 1024.0), &e); /* f in [0.5, 1) */
    const uint16_t mant = (uint16_t)((f * 2.0 - 1.0) * 1024.0);
    return (uint16_t)(sign | (uint16_t)((e - 1 + 15) << 10) | mant);
}
static double f16_val(uint16_t b)
{
    const int ex = (b >> 10) & 31, mant = b & 1023;
    const double s = (b & 0x8000) ? -1.0 : 1.0;
    if (ex == 31) return mant ? NAN : s * INFINITY;
    if (ex == 0) return s * ldexp(mant, -24);
    return s * ldexp(1024 + mant, ex - 25);
}
/* f32 -> nearest f16 value (round to nearest even), as a double; for the lossy emulation */
static double f16_round(double x)
{
    if (x == 0 || !isfinite(x)) return x;
    int e;
    frexp(x, &e);                       /* |x| in [2^(e-1), 2^e) */
    const int q = e - 1 < -14 ? -24 : e - 11; /* ulp exponent */
    return nearbyint(ldexp(x, -q)) * ldexp(1.0, q);
}

typedef struct acase {
    const char *name;
    uint32_t H, HKV, D;
    int ring;
    uint64_t cap, len, pos, origin_physical;
    uint32_t n_split;
    int gate;
} acase;

/* reference: f64, scores with the kernels' f32 scale; lossy = q and p rounded to f16 */
static void reference(const muser_cuda_attn_case *c, int lossy, double *out)
{
    const uint32_t H = c->n_head, HKV = c->n_head_kv, D = c->head_dim, G = H / HKV;
    double *s = malloc(c->len * sizeof(double));
    double *qd = malloc(D * sizeof(double));
    for (uint32_t i = 0; i < H; i++) {
        const uint32_t kh = i / G;
        for (uint32_t d = 0; d < D; d++) qd[d] = lossy ? f16_round(c->q[i * D + d]) : c->q[i * D + d];
        double mx = -INFINITY;
        for (uint64_t t = 0; t < c->len; t++) {
            const uint64_t j = c->pos + 1 - c->len + t;
            const uint64_t r = c->ring ? (c->origin_physical + j - c->origin_logical) % c->capacity : j;
            const size_t off = c->ring ? (size_t)r * HKV * D + (size_t)kh * D : ((size_t)kh * c->capacity + r) * D;
            double acc = 0;
            for (uint32_t d = 0; d < D; d++) acc += qd[d] * f16_val(c->k_plane[off + d]);
            s[t] = acc * (double)c->scale;
            if (s[t] > mx) mx = s[t];
        }
        double l = 0;
        for (uint64_t t = 0; t < c->len; t++) {
            s[t] = exp(s[t] - mx);
            if (lossy) s[t] = f16_round(s[t]);
            l += s[t];
        }
        for (uint32_t d = 0; d < D; d++) {
            double acc = 0;
            for (uint64_t t = 0; t < c->len; t++) {
                const uint64_t j = c->pos + 1 - c->len + t;
                const uint64_t r = c->ring ? (c->origin_physical + j - c->origin_logical) % c->capacity : j;
                const size_t off = c->ring ? (size_t)r * HKV * D + (size_t)kh * D : ((size_t)kh * c->capacity + r) * D;
                acc += s[t] * f16_val(c->v_plane[off + d]);
            }
            double o = acc / l;
            if (c->gate) o *= 1.0 / (1.0 + exp(-(double)c->gate[i * D + d]));
            out[i * D + d] = o;
        }
    }
    free(s);
    free(qd);
}

static double max_err(const float *a, const double *ref, size_t n)
{
    double w = 0;
    for (size_t i = 0; i < n; i++) {
        const double d = fabs((double)a[i] - ref[i]);
        if (!(d <= w)) w = d; /* NaN wins */
    }
    return w;
}

static int head_nonfinite(const float *o, uint32_t head, uint32_t D)
{
    for (uint32_t d = 0; d < D; d++)
        if (!isfinite(o[head * D + d])) return 1;
    return 0;
}

/* Random planes (k/1024 values), q in [-8, 8) (score std ~2.7), gate in [-4, 4), and the case
 * describing them for acase a. */
static void fill_case(const acase *a, uint16_t *kp, uint16_t *vp, float *q, float *gate, muser_cuda_attn_case *c)
{
    const size_t plane = (size_t)a->cap * a->HKV * a->D, QD = (size_t)a->H * a->D;
    for (size_t i = 0; i < plane; i++) {
        kp[i] = f16_of_k((int)(rng() % 2049) - 1024);
        vp[i] = f16_of_k((int)(rng() % 2049) - 1024);
    }
    for (size_t i = 0; i < QD; i++) {
        q[i] = (urand() - 0.5f) * 16.0f;
        gate[i] = (urand() - 0.5f) * 8.0f;
    }
    memset(c, 0, sizeof *c);
    c->n_head = a->H;
    c->n_head_kv = a->HKV;
    c->head_dim = a->D;
    c->ring = a->ring;
    c->n_split = a->n_split;
    c->scale = (float)(1.0 / sqrt((double)a->D));
    c->pos = a->pos;
    c->len = a->len;
    c->capacity = a->cap;
    c->origin_logical = a->pos + 1 - a->len;
    c->origin_physical = a->ring ? a->origin_physical : 0;
    c->k_plane = kp;
    c->v_plane = vp;
    c->q = q;
    c->gate = a->gate ? gate : NULL;
}

/* returns 77 when there is no device */
static int run_case(const acase *a, int *first)
{
    const size_t plane = (size_t)a->cap * a->HKV * a->D, QD = (size_t)a->H * a->D;
    uint16_t *kp = malloc(plane * 2), *vp = malloc(plane * 2);
    float *q = malloc(QD * sizeof(float)), *gate = malloc(QD * sizeof(float));
    float *o_tc = malloc(QD * sizeof(float)), *o_v1 = malloc(QD * sizeof(float)), *o2 = malloc(QD * sizeof(float));
    double *ref = malloc(QD * sizeof(double)), *lossy = malloc(QD * sizeof(double));
    muser_cuda_attn_case c;
    fill_case(a, kp, vp, q, gate, &c);
    char msg[256];
    int rc = muser_cuda_attn_run(&c, CU_ATTN_TC, o_tc, msg, sizeof msg);
    if (rc == 77 && *first) goto out;
    *first = 0;
    CHECKF(rc == 0, "%s tc: %s", a->name, msg);
    rc = muser_cuda_attn_run(&c, CU_ATTN_V1, o_v1, msg, sizeof msg);
    CHECKF(rc == 0, "%s v1: %s", a->name, msg);
    /* the same call again: bit for bit (no sum whose order depends on timing) */
    rc = muser_cuda_attn_run(&c, CU_ATTN_TC, o2, msg, sizeof msg);
    CHECKF(rc == 0 && !memcmp(o2, o_tc, QD * sizeof(float)), "%s: tc output differs run to run", a->name);
    reference(&c, 0, ref);
    reference(&c, 1, lossy);
    double el = 0;
    for (size_t i = 0; i < QD; i++) el = fmax(el, fabs(lossy[i] - ref[i]));
    const double et = max_err(o_tc, ref, QD), ev = max_err(o_v1, ref, QD);
    printf("%-28s tc %.3e  v1 %.3e  (q, p rounded to f16: %.3e)\n", a->name, et, ev, el);
    CHECKF(et <= BOUND, "%s: tc error %.3e > %.0e", a->name, et, BOUND);
    CHECKF(ev <= BOUND, "%s: v1 error %.3e > %.0e", a->name, ev, BOUND);
    if (a->len >= 256) CHECKF(el > BOUND, "%s: lossy emulation %.3e would pass the bound", a->name, el);

    if (a->H == 32 && a->len >= 33) {
        /* a NaN in a K row inside the range (KV head 0) and in a V element (KV head 1) */
        const uint64_t jn = a->pos - a->len / 2;
        const uint64_t rn = a->ring ? (c.origin_physical + jn - c.origin_logical) % a->cap : jn;
        const size_t off0 = a->ring ? rn * a->HKV * a->D : rn * a->D;
        const size_t off1 = a->ring ? rn * a->HKV * a->D + a->D : ((size_t)a->cap + rn) * a->D;
        const uint16_t k0 = kp[off0 + 5], v1 = vp[off1 + 7];
        kp[off0 + 5] = 0x7E00;
        vp[off1 + 7] = 0x7E00;
        for (int impl = 0; impl < 2; impl++) {
            rc = muser_cuda_attn_run(&c, impl ? CU_ATTN_V1 : CU_ATTN_TC, o2, msg, sizeof msg);
            CHECKF(rc == 0, "%s nan: %s", a->name, msg);
            int bad0 = 0, bad1 = 0;
            for (uint32_t hh = 0; hh < 16; hh++) {
                bad0 += head_nonfinite(o2, hh, a->D);
                bad1 += head_nonfinite(o2, 16 + hh, a->D);
            }
            CHECKF(bad0 == 16 && bad1 == 16, "%s %s: NaN in K (head 0) / V (head 1) reached %d / %d of 16 heads",
                   a->name, impl ? "v1" : "tc", bad0, bad1);
        }
        kp[off0 + 5] = k0;
        vp[off1 + 7] = v1;
        /* a NaN in rows that are not attended: the next position (FULL) or a stale ring row */
        if (!a->ring || a->len < a->cap) {
            const uint64_t ro = a->ring ? (c.origin_physical + a->len) % a->cap : a->pos + 1;
            if (ro < a->cap) {
                for (uint32_t kh = 0; kh < a->HKV; kh++) {
                    const size_t o = a->ring ? ro * a->HKV * a->D + kh * a->D : ((size_t)kh * a->cap + ro) * a->D;
                    for (uint32_t d = 0; d < a->D; d++) kp[o + d] = vp[o + d] = 0x7E00;
                }
                rc = muser_cuda_attn_run(&c, CU_ATTN_TC, o2, msg, sizeof msg);
                CHECKF(rc == 0 && !memcmp(o2, o_tc, QD * sizeof(float)),
                       "%s: a NaN row outside the range changed the tc output", a->name);
                rc = muser_cuda_attn_run(&c, CU_ATTN_V1, o2, msg, sizeof msg);
                CHECKF(rc == 0 && !memcmp(o2, o_v1, QD * sizeof(float)),
                       "%s: a NaN row outside the range changed the v1 output", a->name);
            }
        }
        /* an Inf in q of head 5: head 5 non-finite, head 6 untouched */
        const float q5 = q[5 * a->D + 3];
        q[5 * a->D + 3] = INFINITY;
        rc = muser_cuda_attn_run(&c, CU_ATTN_TC, o2, msg, sizeof msg);
        CHECKF(rc == 0 && head_nonfinite(o2, 5, a->D) && !head_nonfinite(o2, 6, a->D), "%s: Inf in q (tc)", a->name);
        q[5 * a->D + 3] = q5;
    }
    rc = 0;
out:
    free(kp);
    free(vp);
    free(q);
    free(gate);
    free(o_tc);
    free(o_v1);
    free(o2);
    free(ref);
    free(lossy);
    return rc;
}

/* The QK-norm/RoPE/store folded into the tc split kernel (the route's default for Glimmer's
 * geometry) against QK-norm/RoPE as its own kernel, on the same raw q, k, v and planes: the K and V
 * planes bit-identical (the same arithmetic), the outputs within BOUND (only q's norm sums in
 * another order). */
static void fuse_case(const acase *a, int rope)
{
    const size_t plane = (size_t)a->cap * a->HKV * a->D, QD = (size_t)a->H * a->D, KD = (size_t)a->HKV * a->D;
    uint16_t *kp = malloc(plane * 2), *vp = malloc(plane * 2);
    float *q = malloc(QD * sizeof(float)), *gate = malloc(QD * sizeof(float));
    float *kr = malloc(KD * sizeof(float)), *vr = malloc(KD * sizeof(float));
    float *qn = malloc(a->D * sizeof(float)), *kn = malloc(a->D * sizeof(float));
    muser_cuda_attn_case c;
    fill_case(a, kp, vp, q, gate, &c);
    for (size_t i = 0; i < KD; i++) {
        kr[i] = (urand() - 0.5f) * 6.0f;
        vr[i] = (urand() - 0.5f) * 2.0f;
    }
    for (uint32_t d = 0; d < a->D; d++) {
        qn[d] = 0.5f + urand();
        kn[d] = 0.5f + urand();
    }
    char msg[256];
    double mx = -1;
    int eq = 0;
    const int rc = muser_cuda_attn_fuse_check(&c, kr, vr, qn, kn, 1e-5f, rope, 500000.0f, &mx, &eq, msg, sizeof msg);
    printf("%-28s fused vs separate QK-norm/RoPE%s: out %.3e, K/V planes %s\n", a->name, rope ? "" : " (no rope)", mx,
           eq ? "bit-identical" : "DIFFER");
    CHECKF(rc == 0, "%s fused: %s", a->name, msg);
    CHECKF(mx >= 0 && mx <= BOUND, "%s: fused output differs by %.3e", a->name, mx);
    CHECKF(eq, "%s: the fused K/V store differs from the separate one", a->name);
    free(kp);
    free(vp);
    free(q);
    free(gate);
    free(kr);
    free(vr);
    free(qn);
    free(kn);
}
#endif

int main(void)
{
#ifndef MUSER_HAVE_CUDA
    printf("SKIP: built without CUDA\n");
    return 77;
#else
    static const acase cases[] = {
        {"full len 1", 32, 2, 128, 0, 4096, 1, 0, 0, 64, 1},
        {"full len 33", 32, 2, 128, 0, 4096, 33, 32, 0, 64, 1},
        {"full len 1000", 32, 2, 128, 0, 4096, 1000, 999, 0, 64, 1},
        {"full len 2049, partial split", 32, 2, 128, 0, 4096, 2049, 2048, 0, 8, 0},
        {"full len 4096, 4 splits", 32, 2, 128, 0, 4096, 4096, 4095, 0, 4, 0},
        {"ring len 256 wrapped", 32, 2, 128, 1, 256, 256, 1000, 745 % 256, 4, 1},
        {"ring len 33 wrapped", 32, 2, 128, 1, 256, 33, 32, 240, 4, 0},
        {"ring len 100 of 256", 32, 2, 128, 1, 256, 100, 99, 200, 4, 0},
        /* the combine over few and many used splits (tc cuts splits at multiples of 64, at most
         * 64 of them; v1 at multiples of 32): tc / v1 used 2 / 4, 64 / 127 (last split partial),
         * 64 / 128, 64 / 256 (two batches of the combine) */
        {"full len 100, used 2 / 4", 32, 2, 128, 0, 4096, 100, 99, 0, 64, 1},
        {"full len 8100, used 64 / 127", 32, 2, 128, 0, 8192, 8100, 8099, 0, 128, 1},
        {"full len 4096, used 64 / 128", 32, 2, 128, 0, 4096, 4096, 4095, 0, 128, 0},
        {"full len 8192, used 64 / 256", 32, 2, 128, 0, 8192, 8192, 8191, 0, 256, 0},
        {"ring len 2048 of 2048, 32", 32, 2, 128, 1, 2048, 2048, 3000, 953, 32, 1},
        {"gqa 4:1 D 64 (falls back)", 8, 2, 64, 0, 512, 300, 299, 0, 8, 1},
    };
    int first = 1;
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        if (run_case(&cases[i], &first) == 77) {
            printf("SKIP: no CUDA device\n");
            return 77;
        }
    /* the fused QK-norm/RoPE/store: rings with RoPE (SWA layers), FULL planes without (NoPE), both
     * ways on a few; the token's row in the first, a middle and the last used split */
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        if (cases[i].H != 32) continue;
        fuse_case(&cases[i], cases[i].ring);
        if (cases[i].len == 33 || cases[i].len == 1000) fuse_case(&cases[i], !cases[i].ring);
    }
    printf("test_cuda_attn: %d checks, %d failures\n", check_count, check_failures);
    return check_failures ? 1 : 0;
#endif
}
