/* test_cuda.c — the CUDA decode backend against the oracle (SPEC §4), on synthesized tiny models.
 *
 * For muse (every matrix format: the release mix, Q4_K, Q6_K, Q8_0, F16, BF16, F32) and llama:
 * decode past the SWA window, per position max |log_softmax(cuda) − log_softmax(oracle)| <= 1e-3
 * and the same top-1 where the oracle's best two are > 1e-3 apart. Then: a replayed graph after
 * reset gives the same logits bit for bit; checkpoint / rollback of a 3-token block restores the
 * ring rows so re-decoding the rejected tokens reproduces the first logits bit for bit; a token
 * out of order is refused (cache discontinuity) and changes nothing. The formats reach every
 * matvec the route has: the release mix and Q4_K / Q6_K everywhere on the tensor cores (Q4_K: the
 * gate·up pair and a Q4_K LM head; Q6_K: gate and up apart, then SiLU·up), Q8_0 and the float
 * formats on the general path; tiny's geometry takes the CUDA-core attention (v1), Glimmer's
 * tensor-core attention is checked by test_cuda_attn.
 * The prefill route (every format, muse and llama): one call of 70 tokens against the oracle at
 * every position, the same bytes in chunks of 5, then decode on the cache it wrote; its GEMM per
 * format and layout against the f64 dot, and a row's bytes alone and among 70.
 * SKIP (77) when built without CUDA or when no GPU is present. */
#include "check.h"
#include "synth_model.h"
#include "quant.h"
#include "sampler.h"
#include "session.h"
#include "synth.h"
#ifdef MUSER_HAVE_CUDA
#include "cuda/cuda_backend.h"
#endif

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static double max_dlsm(const float *a, const float *b, uint32_t V, uint32_t *top_a, uint32_t *top_b, double *gap)
{
    double ma = -INFINITY, mb = -INFINITY, sa = 0, sb = 0, second = -INFINITY;
    *top_a = *top_b = 0;
    for (uint32_t i = 0; i < V; i++) {
        if (a[i] > ma) { ma = a[i]; *top_a = i; }
        if (b[i] > mb) { mb = b[i]; *top_b = i; }
    }
    for (uint32_t i = 0; i < V; i++) {
        sa += exp(a[i] - ma);
        sb += exp(b[i] - mb);
        if (i != *top_b && b[i] > second) second = b[i];
    }
    *gap = mb - second;
    const double la = ma + log(sa), lb = mb + log(sb);
    double worst = 0;
    for (uint32_t i = 0; i < V; i++) {
        const double d = fabs((a[i] - la) - (b[i] - lb));
        if (d > worst) worst = d;
    }
    return worst;
}

static int cuda_present(void)
{
#ifndef MUSER_HAVE_CUDA
    return 0;
#else
    return muser_backend_cuda() != NULL;
#endif
}

/* Returns 0 ok, 77 if the backend reports no device. */
/* The tiny preset of arch with matrices of type (a synth type), written and loaded; NULL on failure
 * (a failed check). */
static muser_model *tiny_model(muser_arch arch, int type) { return check_synth_model("test_cuda", arch, type); }

static int parity_one(muser_arch arch, int type, uint32_t n, bool extra)
{
    muser_error err = {0};
    muser_model *m = tiny_model(arch, type);
    if (!m) return 0;
    const uint32_t V = m->hp.n_vocab;
    muser_session_opts o;
    memset(&o, 0, sizeof o);
    o.backend = MUSER_BACKEND_CUDA;
    o.n_ctx = n + 8;
    muser_session *sc = NULL, *so_ = NULL;
    int rc = muser_session_new(&sc, m, &o, &err);
    if (rc == MUSER_E_BACKEND && strstr(err.msg, "no CUDA device")) {
        muser_model_free(m);
        return 77;
    }
    CHECK_OK(rc, &err);
    o.backend = MUSER_BACKEND_ORACLE;
    CHECK_OK(muser_session_new(&so_, m, &o, &err), &err);
    if (!sc || !so_) {
        muser_session_free(sc);
        muser_session_free(so_);
        muser_model_free(m);
        return 0;
    }
    int32_t *tok = malloc(n * sizeof *tok);
    float *lc = malloc((size_t)n * V * sizeof(float)), *lo = malloc((size_t)V * sizeof(float));
    uint64_t x = 777 + (uint64_t)type;
    for (uint32_t i = 0; i < n; i++) {
        x = x * 6364136223846793005ull + 1442695040888963407ull;
        tok[i] = (int32_t)((x >> 33) % V);
    }
    double worst = 0;
    int top_bad = 0;
    for (uint32_t i = 0; i < n; i++) {
        CHECK_OK(muser_session_forward(sc, &tok[i], 1, lc + (size_t)i * V, false, &err), &err);
        CHECK_OK(muser_session_forward(so_, &tok[i], 1, lo, false, &err), &err);
        uint32_t ta, tb;
        double gap;
        const double d = max_dlsm(lc + (size_t)i * V, lo, V, &ta, &tb, &gap);
        if (d > worst) worst = d;
        if (gap > 1e-3 && ta != tb) top_bad++;
    }
    printf("%-6s type %3d: %u positions (window %u), max |dlogsoftmax| %.3g, top-1 mismatches %d\n",
           muser_arch_name(arch), type, n, m->hp.swa_window, worst, top_bad);
    CHECKF(worst <= 1e-3, "max |dlogsoftmax| %.3g > 1e-3", worst);
    CHECK(top_bad == 0);

    if (extra) {
        /* replay after reset: bit for bit */
        float *l2 = malloc((size_t)V * sizeof(float));
        muser_session_reset(sc);
        bool same = true;
        for (uint32_t i = 0; i < n; i++) {
            CHECK_OK(muser_session_forward(sc, &tok[i], 1, l2, false, &err), &err);
            same = same && memcmp(l2, lc + (size_t)i * V, (size_t)V * sizeof(float)) == 0;
        }
        CHECKF(same, "replayed graph differs from the first run");
        /* checkpoint at n-3 after a reset, decode 3, roll back to keep 1, re-decode 2 */
        muser_session_reset(sc);
        for (uint32_t i = 0; i + 3 < n; i++) CHECK_OK(muser_session_forward(sc, &tok[i], 1, NULL, false, &err), &err);
        CHECK_OK(muser_session_checkpoint(sc, &err), &err);
        const int32_t junk[3] = {1, 2, 3};
        CHECK_OK(muser_session_forward(sc, junk, 3, NULL, false, &err), &err);
        CHECK_OK(muser_session_rollback(sc, n - 3, &err), &err);
        muser_session_commit(sc);
        same = true;
        for (uint32_t i = n - 3; i < n; i++) {
            CHECK_OK(muser_session_forward(sc, &tok[i], 1, l2, false, &err), &err);
            same = same && memcmp(l2, lc + (size_t)i * V, (size_t)V * sizeof(float)) == 0;
        }
        CHECKF(same, "re-decoding after a rollback differs from the first run");
        free(l2);
    }
    free(tok);
    free(lc);
    free(lo);
    muser_session_free(sc);
    muser_session_free(so_);
    muser_model_free(m);
    return 0;
}

#ifdef MUSER_HAVE_CUDA
/* One matvec per (format, shape, layout) through the route's dispatch (muser_cuda_matvec_check)
 * against the f64 dot of the same bytes: |y − ref| ≤ 1e-5·Σ|w·x| per row (f32 arithmetic over
 * cols terms). 48 rows take the tensor-core layouts for the K-quants, 40 rows (not whole 16-row
 * tiles) and tc = 0 the general path; every format with the LM head's scale and soft cap too. */
static void matvec_checks(void)
{
    const uint32_t types[] = {12 /* Q4_K */, 14 /* Q6_K */, 8 /* Q8_0 */, 1 /* F16 */, 30 /* BF16 */, 0 /* F32 */};
    const uint32_t cols = 768, rows_of[2] = {48, 40};
    float *wf = malloc((size_t)48 * cols * sizeof(float)), *x = malloc(cols * sizeof(float));
    float *deq = malloc(cols * sizeof(float)), *y = malloc(48 * sizeof(float));
    uint8_t *w = malloc((size_t)48 * quant_row_bytes(0, cols));
    uint64_t st = 12345;
    for (uint32_t i = 0; i < 48 * cols; i++) {
        st = st * 6364136223846793005ull + 1442695040888963407ull;
        wf[i] = (float)((double)(st >> 11) / 9007199254740992.0 * 2 - 1);
    }
    for (uint32_t i = 0; i < cols; i++) {
        st = st * 6364136223846793005ull + 1442695040888963407ull;
        x[i] = (float)((double)(st >> 11) / 9007199254740992.0 * 4 - 2);
    }
    for (size_t ti = 0; ti < sizeof types / sizeof types[0]; ti++) {
        const uint32_t type = types[ti];
        const uint64_t rb = quant_row_bytes(type, cols);
        for (uint32_t r = 0; r < 48; r++) CHECK(quant_quantize_row(type, wf + (size_t)r * cols, w + r * rb, cols) == 0);
        for (int si = 0; si < 2; si++)
            for (int tc = 1; tc >= 0; tc--)
                for (int cap = 0; cap < 2; cap++) {
                    const uint32_t rows = rows_of[si];
                    const float scale = cap ? 0.25f : 1.f, capv = cap ? 3.f : 0.f;
                    uint32_t layout = 0;
                    muser_error err = {0};
                    CHECK_OK(muser_cuda_matvec_check(type, rows, cols, w, x, tc, cap, scale, capv, y, &layout, &err), &err);
                    const bool kq = type == 12 || type == 14;
                    const uint32_t want = kq && tc && rows % 16 == 0 ? (type == 12 ? 116u : 117u) : type;
                    CHECKF(layout == want, "type %u rows %u tc %d: layout %u, want %u", type, rows, tc, layout, want);
                    double worst = 0;
                    for (uint32_t r = 0; r < rows; r++) {
                        CHECK(quant_dequantize_row(type, w + r * rb, deq, cols) == 0);
                        double mag = 0;
                        for (uint32_t i = 0; i < cols; i++) mag += fabs((double)deq[i] * x[i]);
                        double ref = quant_dot_f64(type, w + r * rb, x, cols), tol = 1e-5 * mag;
                        if (cap) {
                            ref = capv * tanh(ref * scale / capv);
                            tol *= scale;
                        }
                        const double d = fabs((double)y[r] - ref) / tol;
                        if (!(d <= worst)) worst = d; /* NaN (an unwritten row) sticks */
                    }
                    CHECKF(worst <= 1.0, "matvec type %u rows %u tc %d cap %d: error %.3g of the bound", type, rows, tc,
                           cap, worst);
                }
    }
    printf("matvec checks: %zu formats x 2 shapes x 2 layouts x 2 epilogues\n", sizeof types / sizeof types[0]);
    free(wf);
    free(x);
    free(deq);
    free(y);
    free(w);
}

/* The device's top 64 (muser_cuda_topk_check, cu_topk: what a top-k sampler's step hands back)
 * against muser_top_k on the host, on rows of Glimmer's width and others: coarse values (many
 * ties, broken by the lower id), -0 beside +0, -inf, a row whose best sit in one slice, one at the
 * last id. Ids exactly, values as floats compare. */
static void topk_checks(void)
{
    const uint32_t widths[] = {202048, 4096, 65, 262144};
    const uint32_t rows = 3;
    for (size_t wi = 0; wi < sizeof widths / sizeof widths[0]; wi++) {
        const uint32_t n = widths[wi];
        float *x = malloc((size_t)rows * n * sizeof *x), *v = malloc((size_t)rows * 64 * sizeof *v);
        int32_t *id = malloc((size_t)rows * 64 * sizeof *id);
        check_rng_seed(77 + wi);
        for (uint32_t r = 0; r < rows; r++)
            for (uint32_t i = 0; i < n; i++) {
                float *xi = &x[(size_t)r * n + i];
                *xi = r == 0 ? (float)(check_rng_u64() % 41) - 20.0f           /* many ties */
                    : r == 1 ? (float)((double)(check_rng_u64() >> 11) / 9007199254740992.0 * 30.0 - 15.0)
                             : (i / 4096 == 3 ? 5.0f : -1.0f) + (float)(i % 7) * 0.25f; /* one slice's */
                if (i % 1009 == 5) *xi = -INFINITY;
                if (i % 997 == 3) *xi = r == 0 ? 20.0f : -0.0f;
            }
        x[n - 1] = 100.0f; /* row 0's best at the last id */
        muser_error err = {0};
        CHECK_OK(muser_cuda_topk_check(x, n, rows, v, id, &err), &err);
        int bad = 0;
        for (uint32_t r = 0; r < rows && n >= 64; r++) {
            float rv[64];
            int32_t ri[64];
            muser_top_k(x + (size_t)r * n, n, 64, rv, ri);
            for (uint32_t j = 0; j < 64; j++) bad += ri[j] != id[r * 64 + j] || rv[j] != v[r * 64 + j];
        }
        CHECKF(bad == 0, "cu_topk, %u logits a row: %d of %u entries differ from muser_top_k's", n, bad, rows * 64);
        free(x);
        free(v);
        free(id);
    }
    printf("cu_topk: the exact top 64 at 65 .. 262,144 logits a row, the host's ranking\n");
}

/* The device's draw (cu_draw) against the host sampler's (muser_sampler_sample_u with the same u):
 * rows of Glimmer's width and others (a tail block of 1), bell-shaped, coarse ties, a soft cap's
 * range, one dominant logit, all equal; temperatures from 1e-4 to 3, top-p from 0.2 to 0.999 and
 * min-p from 0.02 to 0.3, alone and together; uniforms at random, 0 and the last below 1; a row
 * without a draw left at −1. A device's −1 for a drawing row is allowed only where top-p's boundary
 * is a tie wider than the device sorts (all 262,144 or 202,048 logits equal). */
static void draw_checks(void)
{
    const uint32_t widths[] = {202048, 4096, 65, 262144};
    const struct { float t, top_p, min_p; } set[] = {
        {0.8f, 1.0f, 0.0f},  {1.0f, 1.0f, 0.0f},   {0.05f, 1.0f, 0.0f},  {3.0f, 1.0f, 0.0f},
        {1e-4f, 1.0f, 0.0f}, {0.37f, 1.0f, 0.0f},  {0.8f, 0.9f, 0.0f},   {1.0f, 0.5f, 0.0f},
        {0.7f, 1.0f, 0.05f}, {1.0f, 0.95f, 0.02f}, {2.0f, 0.2f, 0.3f},   {0.8f, 0.999f, 0.0f},
    };
    enum { NSET = sizeof set / sizeof set[0], ROWS = 16, ROUNDS = 12 };
    uint64_t draws = 0, host = 0, truncated = 0;
    for (size_t wi = 0; wi < sizeof widths / sizeof widths[0]; wi++) {
        const uint32_t n = widths[wi];
        float *x = malloc((size_t)ROWS * n * sizeof *x);
        muser_sampler *smp[NSET];
        for (size_t t = 0; t < NSET; t++) {
            muser_sampler_params p;
            muser_sampler_params_default(&p);
            p.temperature = set[t].t;
            p.top_k = 0;
            p.top_p = set[t].top_p;
            p.min_p = set[t].min_p;
            p.repeat_penalty = 1.0f;
            muser_error err = {0};
            CHECK_OK(muser_sampler_new(&smp[t], n, &p, &err), &err);
            CHECK(muser_sampler_draw_params(smp[t], NULL, NULL, NULL));
        }
        check_rng_seed(91 + wi);
        int bad = 0;
        for (uint32_t round = 0; round < ROUNDS; round++) {
            float temp[ROWS], top_p[ROWS], min_p[ROWS];
            double u[ROWS];
            int32_t id[ROWS];
            uint32_t kinds[ROWS];
            size_t which[ROWS];
            for (uint32_t r = 0; r < ROWS; r++) {
                const uint32_t kind = (r + round) % 5;
                kinds[r] = kind;
                for (uint32_t i = 0; i < n; i++) {
                    const double g = (double)(check_rng_u64() >> 11) / 9007199254740992.0;
                    float *xi = &x[(size_t)r * n + i];
                    *xi = kind == 0 ? (float)(g * 30.0 - 15.0)
                        : kind == 1 ? (float)(check_rng_u64() % 41) - 20.0f
                        : kind == 2 ? 30.0f * tanhf((float)(g * 8.0 - 6.0))
                        : kind == 3 ? (i == n / 3 + r % 7 ? 100.0f : (float)(g * 4.0))
                                    : 1.5f;
                }
                which[r] = (r + 5 * round) % NSET;
                if (round % 4 == 3) /* a call without top-p in any row: its kernels are not launched */
                    while (set[which[r]].top_p < 1.0f) which[r] = (which[r] + 1) % NSET;
                temp[r] = r == ROWS - 1 && round % 3 == 0 ? 0.0f : set[which[r]].t;
                top_p[r] = set[which[r]].top_p;
                min_p[r] = set[which[r]].min_p;
                u[r] = round == 0 && r < 2 ? (r == 0 ? 0.0 : 1.0 - 0x1p-53)
                                           : (double)(check_rng_u64() >> 11) / 9007199254740992.0;
            }
            muser_error err = {0};
            CHECK_OK(muser_cuda_draw_check(x, n, ROWS, temp, top_p, min_p, u, id, &err), &err);
            for (uint32_t r = 0; r < ROWS; r++) {
                if (temp[r] == 0.0f) {
                    bad += id[r] != -1;
                    continue;
                }
                if (id[r] == -1 && kinds[r] == 4 && top_p[r] < 1.0f && n > 16384) {
                    host++; /* left to the host: its logits come back */
                    continue;
                }
                const int32_t want = muser_sampler_sample_u(smp[which[r]], x + (size_t)r * n, u[r]);
                if (want != id[r] && bad < 5)
                    fprintf(stderr, "cu_draw: %u logits, round %u row %u (kind %u), T %g top-p %g min-p %g u %.17g: device %d, host %d\n",
                            n, round, r, kinds[r], (double)temp[r], (double)top_p[r], (double)min_p[r], u[r], id[r], want);
                bad += want != id[r];
                draws++;
                truncated += top_p[r] < 1.0f || min_p[r] > 0.0f;
            }
        }
        CHECKF(bad == 0, "cu_draw, %u logits a row: %d of %u draws differ from the host sampler's", n, bad,
               ROWS * ROUNDS);
        for (size_t t = 0; t < NSET; t++) muser_sampler_free(smp[t]);
        free(x);
    }
    printf("cu_draw: %llu draws at 65 .. 262,144 logits a row (%llu with top-p or min-p), each the host sampler's "
           "token; %llu left to the host (a flat row's tie)\n",
           (unsigned long long)draws, (unsigned long long)truncated, (unsigned long long)host);
}

/* The gate·up pair of the decode route (muser_cuda_pair_check: silu(gate·x)·(up·x), exact integers
 * per block summed on a fixed grid, mmi.cuh) against the f64 dots of the same bytes, and row
 * invariance: every row's bytes the same alone, beside 1, 2, 4, 7, 15 other rows (the persistent
 * kernel and the 2-, 4- and 8-n-tile ones), with other neighbours, and on persistent grids of other
 * sizes (other splits of the blocks). x rows of very different magnitudes, one with a 300x outlier
 * per block; a row with an Inf is NaN throughout and leaves its neighbours' bytes alone. */
static void pair_checks(void)
{
    const uint32_t rows = 80, cols = 2048, NX = 16; /* 5 tiles, 8 blocks */
    const uint64_t rb = quant_row_bytes(12, cols);
    float *wf = malloc((size_t)rows * cols * sizeof(float)), *x = malloc((size_t)(NX + 1) * cols * sizeof(float));
    float *y = malloc((size_t)NX * rows * sizeof(float)), *y1 = malloc((size_t)NX * rows * sizeof(float));
    float *deq = malloc(cols * sizeof(float));
    uint8_t *wg = malloc(rows * rb), *wu = malloc(rows * rb);
    uint64_t st = 777;
    for (int m = 0; m < 2; m++) {
        for (uint32_t i = 0; i < rows * cols; i++) {
            st = st * 6364136223846793005ull + 1442695040888963407ull;
            wf[i] = (float)((double)(st >> 11) / 9007199254740992.0 * 2 - 1) * (m ? 0.03f : 0.01f);
        }
        for (uint32_t r = 0; r < rows; r++) CHECK(quant_quantize_row(12, wf + (size_t)r * cols, (m ? wu : wg) + r * rb, cols) == 0);
    }
    for (uint32_t i = 0; i < (NX + 1) * cols; i++) {
        st = st * 6364136223846793005ull + 1442695040888963407ull;
        const uint32_t r = i / cols;
        float v = (float)((double)(st >> 11) / 9007199254740992.0 * 4 - 2) * ldexpf(1.f, (int)(r % 7) * 5 - 12);
        if (r == 5 && i % 256 == 17) v *= 300.f; /* an outlier per block */
        x[i] = v;
    }
    /* the f64 reference of silu(g)·u, and the error against the bound 1e-6·Σ|w·x| (gate's and up's
     * through the product) */
    muser_error err = {0};
    CHECK_OK(muser_cuda_pair_check(rows, cols, wg, wu, NX, x, 0, y, &err), &err);
    double worst = 0;
    for (uint32_t i = 0; i < NX; i++)
        for (uint32_t r = 0; r < rows; r++) {
            const float *xi = x + (size_t)i * cols;
            double mg = 0, mu = 0;
            CHECK(quant_dequantize_row(12, wg + r * rb, deq, cols) == 0);
            for (uint32_t k = 0; k < cols; k++) mg += fabs((double)deq[k] * xi[k]);
            CHECK(quant_dequantize_row(12, wu + r * rb, deq, cols) == 0);
            for (uint32_t k = 0; k < cols; k++) mu += fabs((double)deq[k] * xi[k]);
            const double g = quant_dot_f64(12, wg + r * rb, xi, cols), u = quant_dot_f64(12, wu + r * rb, xi, cols);
            const double sg = g / (1 + exp(-g)), ref = sg * u;
            const double dsg = fabs(1 / (1 + exp(-g)) * (1 + g * (1 - 1 / (1 + exp(-g))))); /* |d silu / dg| */
            const double tol = 1e-6 * (dsg * mg * fabs(u) + fabs(sg) * mu) + 1e-30;
            const double d = fabs((double)y[(size_t)i * rows + r] - ref) / tol;
            if (!(d <= worst)) worst = d; /* NaN (an unwritten output) sticks */
        }
    CHECKF(worst <= 1.0, "pair: error %.3g of the bound", worst);
    /* row invariance: each count n from row 0, and windows that give a row other neighbours; every
     * launch shape of mmi_pair_launch (1–2, 3–4, 5–8 rows; 9 and 12: a full group of 8 and a part) */
    uint32_t cmp = 0, bad = 0;
    const uint32_t ns[] = {1, 2, 3, 5, 8, 9, 12, 16};
    for (size_t ni = 0; ni < sizeof ns / sizeof ns[0]; ni++)
        for (uint32_t off = 0; off + ns[ni] <= NX; off += ns[ni] == 16 ? 16 : 3 * ns[ni] + 1) {
            CHECK_OK(muser_cuda_pair_check(rows, cols, wg, wu, ns[ni], x + (size_t)off * cols, 0, y1, &err), &err);
            for (uint32_t i = 0; i < ns[ni]; i++, cmp++)
                bad += memcmp(y1 + (size_t)i * rows, y + (size_t)(off + i) * rows, rows * sizeof(float)) != 0;
        }
    /* persistent grids of 1 and 3 SMs: other splits of the blocks over warps and CTAs */
    for (int sm = 1; sm <= 3; sm += 2)
        for (uint32_t n = 1; n <= 2; n++) {
            CHECK_OK(muser_cuda_pair_check(rows, cols, wg, wu, n, x + 4 * cols, sm, y1, &err), &err);
            for (uint32_t i = 0; i < n; i++, cmp++)
                bad += memcmp(y1 + (size_t)i * rows, y + (size_t)(4 + i) * rows, rows * sizeof(float)) != 0;
        }
    CHECKF(bad == 0, "pair: %u of %u rows differ from the same row in the 16-row launch", bad, cmp);
    /* fail closed: an Inf in row 1 of 3 makes that row NaN and leaves rows 0 and 2 as they were */
    memcpy(x + (size_t)NX * cols, x + (size_t)2 * cols, cols * sizeof(float));
    float *x3 = x + (size_t)(NX - 2) * cols; /* rows 14, 15 and the copy of row 2 */
    const float keep = x3[cols + 300];
    x3[cols + 300] = INFINITY;
    CHECK_OK(muser_cuda_pair_check(rows, cols, wg, wu, 3, x3, 0, y1, &err), &err);
    x3[cols + 300] = keep;
    uint32_t nan = 0;
    for (uint32_t r = 0; r < rows; r++) nan += isnan(y1[rows + r]);
    CHECKF(nan == rows, "pair: %u of %u outputs of the row with an Inf are NaN", nan, rows);
    CHECKF(!memcmp(y1, y + (size_t)14 * rows, rows * sizeof(float)) &&
               !memcmp(y1 + 2 * rows, y + (size_t)2 * rows, rows * sizeof(float)),
           "pair: a neighbour of the row with an Inf changed");
    printf("pair checks: error %.3g of the bound; %u rows alone or among others, %u differ\n", worst, cmp, bad);
    free(wf);
    free(x);
    free(y);
    free(y1);
    free(deq);
    free(wg);
    free(wu);
}

/* The prefill route's GEMM (muser_cuda_gemm_check) per format and layout against the f64 dot of the
 * same bytes, |y − ref| ≤ 1e-5·Σ|w·x|, for 1, 5 and 70 input rows (two row tiles, one partial);
 * and every row's bytes the same whatever rows share the call (row 3 alone against row 3 of 70). */
static void gemm_checks(void)
{
    const uint32_t types[] = {12 /* Q4_K */, 14 /* Q6_K */, 8 /* Q8_0 */, 1 /* F16 */, 30 /* BF16 */, 0 /* F32 */};
    const uint32_t cols = 768, rows_of[2] = {144, 40}, NX = 70;
    float *wf = malloc((size_t)144 * cols * sizeof(float)), *x = malloc((size_t)NX * cols * sizeof(float));
    float *deq = malloc(cols * sizeof(float)), *y = malloc((size_t)NX * 144 * sizeof(float));
    float *y1 = malloc((size_t)144 * sizeof(float));
    uint8_t *w = malloc((size_t)144 * quant_row_bytes(0, cols));
    uint64_t st = 54321;
    for (uint32_t i = 0; i < 144 * cols; i++) {
        st = st * 6364136223846793005ull + 1442695040888963407ull;
        wf[i] = (float)((double)(st >> 11) / 9007199254740992.0 * 2 - 1);
    }
    for (uint32_t i = 0; i < NX * cols; i++) { /* rows of very different magnitudes */
        st = st * 6364136223846793005ull + 1442695040888963407ull;
        x[i] = (float)((double)(st >> 11) / 9007199254740992.0 * 4 - 2) * ldexpf(1.f, (int)(i / cols % 9) * 7 - 28);
    }
    uint32_t runs = 0;
    for (size_t ti = 0; ti < sizeof types / sizeof types[0]; ti++) {
        const uint32_t type = types[ti];
        const uint64_t rb = quant_row_bytes(type, cols);
        for (uint32_t r = 0; r < 144; r++) CHECK(quant_quantize_row(type, wf + (size_t)r * cols, w + r * rb, cols) == 0);
        for (int si = 0; si < 2; si++) {
            const uint32_t rows = rows_of[si], ns[3] = {1, 5, NX};
            for (int ni = 0; ni < 3; ni++) {
                const uint32_t n = ns[ni];
                uint32_t layout = 0;
                muser_error err = {0};
                CHECK_OK(muser_cuda_gemm_check(type, rows, cols, w, n, x, y, &layout, &err), &err);
                double worst = 0;
                for (uint32_t r = 0; r < rows; r++) {
                    CHECK(quant_dequantize_row(type, w + r * rb, deq, cols) == 0);
                    for (uint32_t i = 0; i < n; i++) {
                        const float *xi = x + (size_t)i * cols;
                        double mag = 0;
                        for (uint32_t k = 0; k < cols; k++) mag += fabs((double)deq[k] * xi[k]);
                        const double ref = quant_dot_f64(type, w + r * rb, xi, cols);
                        const double d = fabs((double)y[(size_t)i * rows + r] - ref) / (1e-5 * mag);
                        if (!(d <= worst)) worst = d; /* NaN (an unwritten output) sticks */
                    }
                }
                CHECKF(worst <= 1.0, "gemm type %u rows %u n %u (layout %u): error %.3g of the bound", type, rows, n,
                       layout, worst);
                runs++;
            }
            /* row invariance: row 3 of the 70-row call equals row 3 computed alone */
            muser_error err = {0};
            CHECK_OK(muser_cuda_gemm_check(type, rows, cols, w, 1, x + 3 * cols, y1, NULL, &err), &err);
            CHECKF(!memcmp(y1, y + 3 * rows, rows * sizeof(float)), "gemm type %u rows %u: row 3 alone differs", type,
                   rows);
        }
    }
    printf("prefill gemm checks: %u runs (%zu formats x 2 layouts x 1, 5, 70 rows), rows alone = rows in a call\n", runs,
           sizeof types / sizeof types[0]);
    free(wf);
    free(x);
    free(deq);
    free(y);
    free(y1);
    free(w);
}
#endif

/* The prefill route (one call of n tokens, every row's logits) against the oracle, per position;
 * the same bytes when the call is cut into chunks of 5; then 4 decode steps on the cache it wrote,
 * against the oracle's. */
static void prefill_one(muser_arch arch, int type, uint32_t n)
{
    muser_error err = {0};
    muser_model *m = tiny_model(arch, type);
    if (!m) return;
    const uint32_t V = m->hp.n_vocab, ND = 4;
    muser_session_opts o;
    memset(&o, 0, sizeof o);
    o.backend = MUSER_BACKEND_CUDA;
    o.n_ctx = n + ND;
    muser_session *sc = NULL, *s5 = NULL, *so_ = NULL;
    CHECK_OK(muser_session_new(&sc, m, &o, &err), &err);
    o.max_batch = 5;
    CHECK_OK(muser_session_new(&s5, m, &o, &err), &err);
    o.max_batch = 0;
    o.backend = MUSER_BACKEND_ORACLE;
    CHECK_OK(muser_session_new(&so_, m, &o, &err), &err);
    int32_t *tok = malloc((n + ND) * sizeof *tok);
    float *lc = malloc((size_t)(n + ND) * V * sizeof(float)), *l5 = malloc((size_t)n * V * sizeof(float));
    float *lo = malloc((size_t)(n + ND) * V * sizeof(float));
    uint64_t x = 4242 + (uint64_t)type;
    for (uint32_t i = 0; i < n + ND; i++) {
        x = x * 6364136223846793005ull + 1442695040888963407ull;
        tok[i] = (int32_t)((x >> 33) % V);
    }
    if (sc && s5 && so_) {
        CHECK_OK(muser_session_forward(sc, tok, n, lc, true, &err), &err);
        CHECK_OK(muser_session_forward(s5, tok, n, l5, true, &err), &err);
        CHECK_OK(muser_session_forward(so_, tok, n, lo, true, &err), &err);
        for (uint32_t i = n; i < n + ND; i++) {
            CHECK_OK(muser_session_forward(sc, &tok[i], 1, lc + (size_t)i * V, false, &err), &err);
            CHECK_OK(muser_session_forward(so_, &tok[i], 1, lo + (size_t)i * V, false, &err), &err);
        }
        double worst = 0;
        int top_bad = 0;
        for (uint32_t i = 0; i < n + ND; i++) {
            uint32_t ta, tb;
            double gap;
            const double d = max_dlsm(lc + (size_t)i * V, lo + (size_t)i * V, V, &ta, &tb, &gap);
            if (!(d <= worst)) worst = d;
            if (gap > 1e-3 && ta != tb) top_bad++;
        }
        const bool same5 = !memcmp(lc, l5, (size_t)n * V * sizeof(float));
        printf("%-6s type %3d: prefill of %u (window %u) + %u decode steps, max |dlogsoftmax| %.3g, top-1 mismatches "
               "%d; chunks of 5 %s\n", muser_arch_name(arch), type, n, m->hp.swa_window, ND, worst, top_bad,
               same5 ? "give the same bytes" : "DIFFER");
        CHECKF(worst <= 1e-3, "prefill: max |dlogsoftmax| %.3g > 1e-3", worst);
        CHECK(top_bad == 0);
        CHECKF(same5, "prefill in chunks of 5 differs from one chunk");
    }
    free(tok);
    free(lc);
    free(l5);
    free(lo);
    muser_session_free(sc);
    muser_session_free(s5);
    muser_session_free(so_);
    muser_model_free(m);
}

int main(void)
{
    if (!cuda_present()) {
        printf("SKIP: no CUDA device (built without CUDA)\n");
        return 77;
    }
    const bool san = getenv("MUSER_SANITIZED") != NULL;
    const uint32_t n = san ? 24 : 40; /* tiny's window is 16: both pass it */
    if (parity_one(MUSER_ARCH_MUSE, MUSER_SYNTH_TYPE_MIX, n, true) == 77) {
        printf("SKIP: no CUDA device\n");
        return 77;
    }
    const int types[] = {12 /* Q4_K */, 14 /* Q6_K */, 8 /* Q8_0 */, 1 /* F16 */, 30 /* BF16 */, 0 /* F32 */};
    for (size_t i = 0; i < sizeof types / sizeof types[0]; i++) parity_one(MUSER_ARCH_MUSE, types[i], 20, false);
    parity_one(MUSER_ARCH_LLAMA, MUSER_SYNTH_TYPE_MIX, 20, false);
    parity_one(MUSER_ARCH_QWEN3, MUSER_SYNTH_TYPE_MIX, 20, false);
    for (size_t i = 0; i < sizeof types / sizeof types[0]; i++) prefill_one(MUSER_ARCH_MUSE, types[i], 70);
    prefill_one(MUSER_ARCH_MUSE, MUSER_SYNTH_TYPE_MIX, 70);
    prefill_one(MUSER_ARCH_LLAMA, MUSER_SYNTH_TYPE_MIX, 40);
    prefill_one(MUSER_ARCH_QWEN3, MUSER_SYNTH_TYPE_MIX, 40);
#ifdef MUSER_HAVE_CUDA
    matvec_checks();
    pair_checks();
    gemm_checks();
    topk_checks();
    draw_checks();
#endif
    printf("test_cuda: %d checks, %d failures\n", check_count, check_failures);
    return check_failures ? 1 : 0;
}
