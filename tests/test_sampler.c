/* test_sampler.c — the sampling chain against what it promises: greedy and its ties, seeded
 * reproducibility, the softmax at temperature 1 and 0.5 (chi-square, with a control that a wrong
 * distribution fails), top-k / top-p / min-p keeping exactly the right set, penalties, the raw
 * log-probabilities, non-finite logits, bad parameters, and an exact match against a plain
 * full-sort implementation of the same chain on a Glimmer-wide row. */
#include "check.h"
#include "sampler.h"
#include "util.h"

#include <math.h>
#include <stdint.h>
#include <string.h>
#include <time.h>

static muser_sampler_params plain_params(float temp, uint64_t seed)
{
    muser_sampler_params p;
    muser_sampler_params_default(&p);
    p.temperature = temp;
    p.top_k = 0;
    p.top_p = 1.0f;
    p.min_p = 0.0f;
    p.seed = seed;
    return p;
}

static muser_sampler *make(uint32_t V, const muser_sampler_params *p)
{
    muser_sampler *s = NULL;
    muser_error err = {0};
    CHECK_OK(muser_sampler_new(&s, V, p, &err), &err);
    return s;
}

/* A deterministic pseudo-random row, independent of the sampler's RNG. */
static void fill_row(float *x, uint32_t n, uint32_t seed, float scale)
{
    uint32_t st = seed * 2654435761u + 1;
    for (uint32_t i = 0; i < n; i++) {
        st = st * 1664525u + 1013904223u;
        x[i] = scale * ((float)(st >> 8) / 16777216.0f - 0.5f);
    }
}

static void test_greedy(void)
{
    float row[6] = {0.5f, 3.0f, -1.0f, 3.0f, 2.9f, -INFINITY};
    muser_sampler_params p = plain_params(0.0f, 1);
    muser_sampler *s = make(6, &p);
    CHECKF(muser_sampler_sample(s, row, NULL, NULL) == 1, "greedy ties go to the lowest id");
    row[3] = 3.5f;
    CHECK(muser_sampler_sample(s, row, NULL, NULL) == 3);
    muser_sampler_free(s);

    /* Temperature so small that (l - max) / T underflows: still the argmax, never NaN. */
    p = plain_params(1e-30f, 1);
    s = make(6, &p);
    for (int i = 0; i < 20; i++)
        CHECK(muser_sampler_sample(s, row, NULL, NULL) == 3);
    muser_sampler_free(s);
}

static void test_seeds(void)
{
    enum { V = 1000, N = 64 };
    static float row[V];
    fill_row(row, V, 7, 6.0f);
    int32_t a[N], b[N], c[N];
    muser_sampler_params p;
    muser_sampler_params_default(&p);
    p.top_k = 0; /* a wide distribution so different seeds have room to differ */
    p.min_p = 0.0f;
    p.temperature = 1.0f;
    p.seed = 1234;
    muser_sampler *s1 = make(V, &p), *s2 = make(V, &p);
    p.seed = 1235;
    muser_sampler *s3 = make(V, &p);
    for (int i = 0; i < N; i++) {
        a[i] = muser_sampler_sample(s1, row, NULL, NULL);
        b[i] = muser_sampler_sample(s2, row, NULL, NULL);
        c[i] = muser_sampler_sample(s3, row, NULL, NULL);
    }
    CHECK(memcmp(a, b, sizeof a) == 0);
    CHECK(memcmp(a, c, sizeof a) != 0);
    /* reset restarts the RNG from the seed */
    muser_sampler_reset(s1);
    for (int i = 0; i < N; i++)
        b[i] = muser_sampler_sample(s1, row, NULL, NULL);
    CHECK(memcmp(a, b, sizeof a) == 0);
    muser_sampler_free(s1);
    muser_sampler_free(s2);
    muser_sampler_free(s3);
}

/* Chi-square of draws against expected probabilities; returns the statistic. */
static double chi_square(const long *counts, const double *prob, int n, long draws)
{
    double chi = 0.0;
    for (int i = 0; i < n; i++) {
        double e = prob[i] * (double)draws;
        chi += ((double)counts[i] - e) * ((double)counts[i] - e) / e;
    }
    return chi;
}

static void test_softmax_distribution(void)
{
    enum { V = 8 };
    const float row[V] = {1.0f, 0.5f, 0.0f, -0.5f, 2.0f, 1.5f, -1.0f, 0.25f};
    const long draws = getenv("MUSER_SANITIZED") ? 40000 : 200000;
    const float temps[2] = {1.0f, 0.5f};
    for (int t = 0; t < 2; t++) {
        muser_sampler_params p = plain_params(temps[t], 42 + (uint64_t)t);
        muser_sampler *s = make(V, &p);
        long counts[V] = {0};
        for (long d = 0; d < draws; d++) {
            int32_t id = muser_sampler_sample(s, row, NULL, NULL);
            CHECK(id >= 0 && id < V);
            if (id >= 0 && id < V)
                counts[id]++;
        }
        double prob[V], z = 0.0, uni[V];
        for (int i = 0; i < V; i++)
            z += (prob[i] = exp((double)row[i] / temps[t]));
        for (int i = 0; i < V; i++) {
            prob[i] /= z;
            uni[i] = 1.0 / V;
        }
        /* 7 degrees of freedom: 24.32 is the 0.999 quantile. The seed is fixed, so this either
         * always passes or always fails; the control shows the statistic can fail. */
        double chi = chi_square(counts, prob, V, draws);
        CHECKF(chi < 24.32, "T=%g chi-square %.2f over 7 dof", (double)temps[t], chi);
        double wrong = chi_square(counts, uni, V, draws);
        CHECKF(wrong > 1000.0, "control: uniform expectation gave only %.2f", wrong);
        muser_sampler_free(s);
    }
}

static void test_top_k(void)
{
    enum { V = 300 };
    static float row[V];
    fill_row(row, V, 3, 4.0f);
    /* top-k = 1 is greedy, whatever the temperature */
    muser_sampler_params p = plain_params(1.5f, 9);
    p.top_k = 1;
    muser_sampler *s = make(V, &p);
    muser_sampler_params pg = plain_params(0.0f, 9);
    muser_sampler *g = make(V, &pg);
    for (uint32_t r = 0; r < 50; r++) {
        fill_row(row, V, r, 4.0f);
        CHECK(muser_sampler_sample(s, row, NULL, NULL) == muser_sampler_sample(g, row, NULL, NULL));
    }
    muser_sampler_free(s);
    muser_sampler_free(g);

    /* top-k = 5 with a flat-ish tail: only the five best ever appear, and all of them do. */
    fill_row(row, V, 11, 1.0f);
    int best[5];
    for (int j = 0; j < 5; j++) {
        best[j] = -1;
        for (int i = 0; i < V; i++) {
            bool taken = false;
            for (int q = 0; q < j; q++)
                taken |= best[q] == i;
            if (!taken && (best[j] < 0 || row[i] > row[best[j]]))
                best[j] = i;
        }
    }
    p = plain_params(5.0f, 10);
    p.top_k = 5;
    s = make(V, &p);
    int seen[5] = {0}, outside = 0;
    for (int d = 0; d < 5000; d++) {
        int32_t id = muser_sampler_sample(s, row, NULL, NULL);
        int hit = -1;
        for (int j = 0; j < 5; j++)
            if (best[j] == id)
                hit = j;
        if (hit < 0)
            outside++;
        else
            seen[hit]++;
    }
    CHECKF(outside == 0, "%d draws outside the top 5", outside);
    for (int j = 0; j < 5; j++)
        CHECKF(seen[j] > 500, "top-k member %d drawn only %d times", j, seen[j]);
    muser_sampler_free(s);

    /* Ties at the cut go to the lowest ids: eight equal logits, top-k 3 keeps ids 2, 4, 5. */
    float tied[10] = {-1.0f, -2.0f, 1.0f, -1.0f, 1.0f, 1.0f, 1.0f, 1.0f, 1.0f, 1.0f};
    p = plain_params(1.0f, 12);
    p.top_k = 3;
    s = make(10, &p);
    int hits[10] = {0};
    for (int d = 0; d < 3000; d++) {
        int32_t id = muser_sampler_sample(s, tied, NULL, NULL);
        if (id >= 0 && id < 10)
            hits[id]++;
    }
    CHECKF(hits[2] > 0 && hits[4] > 0 && hits[5] > 0 && hits[2] + hits[4] + hits[5] == 3000,
           "top-k ties: %d %d %d of 3000", hits[2], hits[4], hits[5]);
    muser_sampler_free(s);
}

static void test_top_p_min_p(void)
{
    enum { V = 4 };
    float row[V];
    const double prob[V] = {0.5, 0.3, 0.15, 0.05};
    for (int i = 0; i < V; i++)
        row[i] = (float)log(prob[i]);

    /* top-p 0.75: 0.5 < 0.75 <= 0.8, so {0, 1} in the ratio 5:3. */
    muser_sampler_params p = plain_params(1.0f, 5);
    p.top_p = 0.75f;
    muser_sampler *s = make(V, &p);
    long counts[V] = {0};
    for (int d = 0; d < 20000; d++)
        counts[muser_sampler_sample(s, row, NULL, NULL)]++;
    CHECKF(counts[2] == 0 && counts[3] == 0, "top-p kept 2 or 3: %ld %ld", counts[2], counts[3]);
    double frac0 = (double)counts[0] / 20000.0;
    CHECKF(fabs(frac0 - 0.625) < 0.02, "top-p renormalised share of 0 is %.3f, want 0.625", frac0);
    muser_sampler_free(s);

    /* top-p 0.85: {0, 1, 2}; token 3 never. */
    p.top_p = 0.85f;
    s = make(V, &p);
    memset(counts, 0, sizeof counts);
    for (int d = 0; d < 20000; d++)
        counts[muser_sampler_sample(s, row, NULL, NULL)]++;
    CHECK(counts[3] == 0 && counts[2] > 0);
    muser_sampler_free(s);

    /* min-p 0.2: threshold 0.1, so {0, 1, 2} minus... 0.15 >= 0.1 stays, 0.05 goes. */
    p = plain_params(1.0f, 6);
    p.min_p = 0.2f;
    s = make(V, &p);
    memset(counts, 0, sizeof counts);
    for (int d = 0; d < 20000; d++)
        counts[muser_sampler_sample(s, row, NULL, NULL)]++;
    CHECK(counts[3] == 0 && counts[2] > 0 && counts[1] > 0);
    muser_sampler_free(s);

    /* min-p 0.5: threshold 0.25, so {0, 1}. */
    p.min_p = 0.5f;
    s = make(V, &p);
    memset(counts, 0, sizeof counts);
    for (int d = 0; d < 20000; d++)
        counts[muser_sampler_sample(s, row, NULL, NULL)]++;
    CHECK(counts[2] == 0 && counts[3] == 0 && counts[1] > 0);
    muser_sampler_free(s);

    /* Masked (-inf) tokens are never drawn, even at a high temperature. */
    float masked[V] = {0.0f, -INFINITY, 0.0f, -INFINITY};
    p = plain_params(10.0f, 7);
    s = make(V, &p);
    int bad = 0;
    for (int d = 0; d < 2000; d++) {
        int32_t id = muser_sampler_sample(s, masked, NULL, NULL);
        bad += (id == 1 || id == 3);
    }
    CHECK(bad == 0);
    muser_sampler_free(s);
}

static void test_penalties(void)
{
    muser_sampler_params p = plain_params(0.0f, 1);
    p.repeat_penalty = 1.5f;
    muser_sampler *s = make(4, &p);
    float pos[4] = {2.0f, 1.9f, -1.0f, -3.0f};
    CHECK(muser_sampler_sample(s, pos, NULL, NULL) == 0);
    muser_sampler_accept(s, 0);
    CHECK(muser_sampler_sample(s, pos, NULL, NULL) == 1); /* 2.0 / 1.5 < 1.9 */
    float neg[4] = {-1.0f, -1.2f, -5.0f, -6.0f};
    CHECK(muser_sampler_sample(s, neg, NULL, NULL) == 1); /* -1.0 * 1.5 < -1.2 */
    CHECK(pos[0] == 2.0f && neg[0] == -1.0f);             /* the caller's row is untouched */
    muser_sampler_reset(s);
    CHECK(muser_sampler_sample(s, pos, NULL, NULL) == 0); /* reset forgot the history */
    muser_sampler_free(s);

    float row[4] = {2.0f, 1.5f, 0.0f, 0.0f};
    p = plain_params(0.0f, 1);
    p.presence_penalty = 0.6f;
    s = make(4, &p);
    muser_sampler_accept(s, 0);
    muser_sampler_accept(s, 0);
    CHECK(muser_sampler_sample(s, row, NULL, NULL) == 1); /* 2.0 - 0.6 once, not per count */
    muser_sampler_free(s);
    p.presence_penalty = 0.4f;
    s = make(4, &p);
    muser_sampler_accept(s, 0);
    muser_sampler_accept(s, 0);
    CHECK(muser_sampler_sample(s, row, NULL, NULL) == 0); /* 1.6 > 1.5 */
    muser_sampler_free(s);

    p = plain_params(0.0f, 1);
    p.frequency_penalty = 0.2f;
    s = make(4, &p);
    muser_sampler_accept(s, 0);
    CHECK(muser_sampler_sample(s, row, NULL, NULL) == 0); /* 1.8 */
    muser_sampler_accept(s, 0);
    muser_sampler_accept(s, 0);
    CHECK(muser_sampler_sample(s, row, NULL, NULL) == 1); /* 1.4 */
    muser_sampler_free(s);

    /* The window: with repeat_last_n = 2, a token two accepts ago is no longer penalised. */
    p = plain_params(0.0f, 1);
    p.repeat_penalty = 1.5f;
    p.repeat_last_n = 2;
    s = make(4, &p);
    muser_sampler_accept(s, 0);
    muser_sampler_accept(s, 2);
    CHECK(muser_sampler_sample(s, pos, NULL, NULL) == 1);
    muser_sampler_accept(s, 3);
    CHECK(muser_sampler_sample(s, pos, NULL, NULL) == 0);
    muser_sampler_accept(s, -5); /* ignored, not a crash */
    muser_sampler_accept(s, 4);
    muser_sampler_free(s);
}

static void test_logprobs(void)
{
    enum { V = 12 };
    float row[V];
    fill_row(row, V, 21, 8.0f);
    row[5] = -INFINITY;
    double z = 0.0, mx = -INFINITY;
    for (int i = 0; i < V; i++)
        mx = fmax(mx, row[i]);
    for (int i = 0; i < V; i++)
        z += exp(row[i] - mx);
    double lse = mx + log(z);

    muser_sampler_params p;
    muser_sampler_params_default(&p);
    p.n_logprobs = 20; /* more than V: the tail is padded with id -1 */
    p.temperature = 2.0f;
    p.repeat_penalty = 1.3f;
    p.seed = 77;
    muser_sampler *s = make(V, &p);
    muser_sampler_accept(s, 0);
    for (int d = 0; d < 20; d++) {
        float lp = 0.0f;
        muser_logprob top[20];
        int32_t id = muser_sampler_sample(s, row, &lp, top);
        CHECK(id >= 0 && id < V);
        if (id < 0)
            continue;
        /* raw log_softmax: temperature and penalty do not enter */
        CHECKF(fabs(lp - (row[id] - lse)) < 1e-5, "chosen logprob %g want %g", (double)lp,
               row[id] - lse);
        double sum = 0.0;
        bool found = false;
        for (int j = 0; j < V; j++) {
            if (top[j].id < 0)
                continue;
            sum += exp(top[j].logprob);
            if (j > 0)
                CHECK(top[j].logprob <= top[j - 1].logprob);
            found |= (top[j].id == id && top[j].logprob == lp);
        }
        CHECKF(fabs(sum - 1.0) < 1e-5, "sum of exp(logprobs) %.7f", sum);
        CHECK(found);
        CHECK(top[V].id == -1 && top[19].id == -1);
        muser_sampler_accept(s, id);
    }
    muser_sampler_free(s);

    /* NULL outputs are allowed */
    p.n_logprobs = 3;
    s = make(V, &p);
    muser_logprob top3[3];
    CHECK(muser_sampler_sample(s, row, NULL, top3) >= 0);
    CHECK(top3[0].logprob >= top3[1].logprob && top3[1].logprob >= top3[2].logprob);
    muser_sampler_free(s);
}

static void test_nonfinite_and_params(void)
{
    float row[4] = {0.0f, NAN, 1.0f, 2.0f};
    muser_sampler_params p;
    muser_sampler_params_default(&p);
    muser_sampler *s = make(4, &p);
    CHECK(muser_sampler_sample(s, row, NULL, NULL) == MUSER_E_NUMERIC);
    row[1] = INFINITY;
    CHECK(muser_sampler_sample(s, row, NULL, NULL) == MUSER_E_NUMERIC);
    float allneg[4] = {-INFINITY, -INFINITY, -INFINITY, -INFINITY};
    CHECK(muser_sampler_sample(s, allneg, NULL, NULL) == MUSER_E_NUMERIC);
    row[1] = -INFINITY;
    CHECK(muser_sampler_sample(s, row, NULL, NULL) >= 0);
    muser_sampler_free(s);

    muser_error err = {0};
    muser_sampler *bad = NULL;
    muser_sampler_params q = p;
    q.temperature = -1.0f;
    CHECK(muser_sampler_new(&bad, 4, &q, &err) == MUSER_E_ARG && bad == NULL);
    CHECK(strstr(err.msg, "temperature") != NULL);
    q = p;
    q.top_p = 0.0f;
    CHECK(muser_sampler_new(&bad, 4, &q, &err) == MUSER_E_ARG);
    q = p;
    q.min_p = 1.5f;
    CHECK(muser_sampler_new(&bad, 4, &q, &err) == MUSER_E_ARG);
    q = p;
    q.repeat_penalty = 0.0f;
    CHECK(muser_sampler_new(&bad, 4, &q, &err) == MUSER_E_ARG);
    q = p;
    q.n_logprobs = 21;
    CHECK(muser_sampler_new(&bad, 4, &q, &err) == MUSER_E_ARG);
    CHECK(muser_sampler_new(&bad, 0, &p, &err) == MUSER_E_ARG);
}

/* ---- a plain reference of the documented chain: full sort, same RNG ---- */

static uint64_t ref_rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

typedef struct ref_rng { uint64_t s[4]; } ref_rng;

static void ref_seed(ref_rng *r, uint64_t seed)
{
    for (int i = 0; i < 4; i++) {
        seed += 0x9e3779b97f4a7c15ULL;
        uint64_t z = seed;
        z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
        z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
        r->s[i] = z ^ (z >> 31);
    }
}

static double ref_uniform(ref_rng *r)
{
    uint64_t *s = r->s;
    uint64_t out = ref_rotl(s[1] * 5, 7) * 9, t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = ref_rotl(s[3], 45);
    return (double)(out >> 11) / 9007199254740992.0;
}

typedef struct ref_cand { int32_t id; float l; float w; } ref_cand;

static int ref_cmp(const void *a, const void *b)
{
    const ref_cand *x = a, *y = b;
    if (x->l != y->l)
        return x->l > y->l ? -1 : 1;
    return x->id < y->id ? -1 : 1;
}

static int ref_cmp_id(const void *a, const void *b)
{
    const ref_cand *x = a, *y = b;
    return x->id < y->id ? -1 : x->id > y->id;
}

static int ref_cmp_w(const void *a, const void *b)
{
    const ref_cand *x = a, *y = b;
    if (x->w != y->w)
        return x->w > y->w ? -1 : 1;
    return x->id < y->id ? -1 : 1;
}

/* The chain as docs/cli.md states it, the slow way: full sorts, no heap, no buckets. Sums run in
 * the sampler's list order (rank order with top-k, id order without) so the two agree exactly. */
static int32_t ref_sample(const float *row, uint32_t V, const muser_sampler_params *p,
                          ref_rng *rng, ref_cand *c)
{
    uint32_t n = 0;
    for (uint32_t i = 0; i < V; i++)
        if (row[i] != -INFINITY)
            c[n++] = (ref_cand){(int32_t)i, row[i], 0.0f};
    bool with_k = p->top_k > 0 && p->top_k < V;
    if (with_k) {
        qsort(c, n, sizeof *c, ref_cmp);
        if (n > p->top_k)
            n = p->top_k;
    }
    float mx = -INFINITY;
    for (uint32_t i = 0; i < n; i++)
        mx = fmaxf(mx, c[i].l);
    double z = 0.0;
    for (uint32_t i = 0; i < n; i++) {
        c[i].l = (c[i].l - mx) / p->temperature; /* now the scaled logit x */
        z += (double)expf(c[i].l);
    }
    if (p->min_p > 0.0f) {
        uint32_t kept = 0;
        for (uint32_t i = 0; i < n; i++)
            if (c[i].l >= logf(p->min_p))
                c[kept++] = c[i];
        n = kept;
    }
    double mass = 0.0;
    for (uint32_t i = 0; i < n; i++) {
        c[i].w = expf(c[i].l);
        mass += (double)c[i].w;
    }
    if (p->top_p < 1.0f && n > 1 && mass >= (double)p->top_p * z) {
        if (!with_k)
            qsort(c, n, sizeof *c, ref_cmp_w);
        double cum = 0.0;
        for (uint32_t i = 0; i < n; i++) {
            cum += (double)c[i].w;
            if (cum >= (double)p->top_p * z) {
                n = i + 1;
                break;
            }
        }
        if (!with_k)
            qsort(c, n, sizeof *c, ref_cmp_id);
        mass = 0.0;
        for (uint32_t i = 0; i < n; i++)
            mass += (double)c[i].w;
    }
    double u = ref_uniform(rng) * mass, acc = 0.0;
    for (uint32_t i = 0; i < n; i++) {
        acc += (double)c[i].w;
        if (u < acc)
            return c[i].id;
    }
    return c[n - 1].id;
}

/* On a Glimmer-wide row the sampler (heap, buckets) and the reference (full sorts)
 * pick the same token for the same seed, draw after draw, under several settings. */
static void test_against_reference(void)
{
    const uint32_t V = 202048;
    float *row = malloc(V * sizeof *row);
    ref_cand *c = malloc(V * sizeof *c);
    const int draws = getenv("MUSER_SANITIZED") ? 4 : 12;
    struct { float t; uint32_t k; float top_p, min_p; } cfg[] = {
        {0.8f, 40, 0.95f, 0.05f}, {1.0f, 0, 0.9f, 0.0f}, {0.7f, 0, 0.5f, 0.02f},
        {1.3f, 1000, 0.99f, 0.0f}, {1.0f, 0, 0.999f, 0.0f}, {1.0f, 0, 1.0f, 0.0f},
        {0.9f, 0, 1.0f, 0.01f}, {2.0f, 0, 0.2f, 0.3f},
    };
    for (size_t ci = 0; ci < sizeof cfg / sizeof cfg[0]; ci++) {
        muser_sampler_params p = plain_params(cfg[ci].t, 1000 + ci);
        p.top_k = cfg[ci].k;
        p.top_p = cfg[ci].top_p;
        p.min_p = cfg[ci].min_p;
        muser_sampler *s = make(V, &p);
        ref_rng rng;
        ref_seed(&rng, p.seed);
        int mismatches = 0;
        for (int d = 0; d < draws; d++) {
            fill_row(row, V, 100 + (uint32_t)d, 12.0f);
            row[(uint32_t)d * 7919u % V] += 6.0f; /* a few clear favourites */
            row[(uint32_t)d * 104729u % V] += 5.0f;
            int32_t a = muser_sampler_sample(s, row, NULL, NULL);
            int32_t b = ref_sample(row, V, &p, &rng, c);
            mismatches += (a != b);
        }
        CHECKF(mismatches == 0, "config %zu: %d of %d draws differ from the reference", ci,
               mismatches, draws);
        muser_sampler_free(s);
    }

    /* Timing on the full row (informational: thread CPU time, best of 3 runs of 10 draws). */
    struct { const char *name; float t; uint32_t k; float top_p, min_p; } tc[] = {
        {"greedy", 0.0f, 0, 1.0f, 0.0f},        {"default (0.8/40/0.95/0.05)", 0.8f, 40, 0.95f, 0.05f},
        {"top-p 0.9 only", 1.0f, 0, 0.9f, 0.0f}, {"min-p 0.05 only", 1.0f, 0, 1.0f, 0.05f},
        {"temperature only", 1.0f, 0, 1.0f, 0.0f},
    };
    fill_row(row, V, 5, 12.0f);
    for (size_t ti = 0; ti < sizeof tc / sizeof tc[0]; ti++) {
        muser_sampler_params p = plain_params(tc[ti].t, 3);
        p.top_k = tc[ti].k;
        p.top_p = tc[ti].top_p;
        p.min_p = tc[ti].min_p;
        muser_sampler *s = make(V, &p);
        double best = 1e30;
        for (int rep = 0; rep < 3; rep++) {
            struct timespec t0, t1;
            clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t0);
            for (int i = 0; i < 10; i++)
                CHECK(muser_sampler_sample(s, row, NULL, NULL) >= 0);
            clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t1);
            double ms = ((double)(t1.tv_sec - t0.tv_sec) * 1e3 +
                         (double)(t1.tv_nsec - t0.tv_nsec) / 1e6) / 10;
            best = ms < best ? ms : best;
        }
        printf("V=%u %-28s %.3f ms per token\n", V, tc[ti].name, best);
        muser_sampler_free(s);
    }
    free(row);
    free(c);
}

/* The row passes run eight or sixteen lanes at a time where the CPU has AVX2, with scalar tails:
 * on rows of many widths, with the special value in the vector body, at its end and in the tail,
 * the argmax (ties to the lowest id, -0 tying +0), the non-finite checks and the top logprobs'
 * ids must be what one plain loop gives. */
static void wide_rows(void)
{
    const uint32_t widths[] = {1, 7, 8, 9, 15, 16, 17, 31, 33, 1000, 4099, 202048};
    float *row = malloc(202048 * sizeof *row);
    int bad = 0;
    for (size_t wi = 0; wi < sizeof widths / sizeof widths[0]; wi++) {
        const uint32_t n = widths[wi];
        const uint32_t at[] = {0, n / 2, n > 16 ? n - 17 : 0, n > 8 ? (n & ~7u) - 1 : 0, n - 1};
        for (size_t ai = 0; ai < sizeof at / sizeof at[0]; ai++) {
            /* coarse values (many ties), the maximum placed at at[ai] and again later */
            for (uint32_t i = 0; i < n; i++) row[i] = (float)((i * 7919u + wi) % 13) - 6.0f;
            row[at[ai]] = 9.0f;
            if (at[ai] + 3 < n) row[at[ai] + 3] = 9.0f;
            uint32_t want = 0;
            for (uint32_t i = 1; i < n; i++)
                if (row[i] > row[want]) want = i;
            bad += muser_argmax(row, n) != (int32_t)want;
            /* all zeros of either sign: the first */
            for (uint32_t i = 0; i < n; i++) row[i] = (i % 3) ? 0.0f : -0.0f;
            bad += muser_argmax(row, n) != 0;
            /* the checks: NaN and +inf fail, -inf is a mask, -inf everywhere fails */
            muser_sampler_params p = plain_params(0.0f, 1);
            muser_sampler *sg = make(n, &p);
            for (uint32_t i = 0; i < n; i++) row[i] = -INFINITY;
            bad += muser_sampler_sample(sg, row, NULL, NULL) != MUSER_E_NUMERIC;
            row[at[ai]] = 1.0f;
            bad += muser_sampler_sample(sg, row, NULL, NULL) != (int32_t)at[ai];
            row[n - 1 - at[ai]] = NAN;
            bad += n > 1 && muser_sampler_sample(sg, row, NULL, NULL) != MUSER_E_NUMERIC;
            row[n - 1 - at[ai]] = INFINITY;
            bad += n > 1 && muser_sampler_sample(sg, row, NULL, NULL) != MUSER_E_NUMERIC;
            muser_sampler_free(sg);
        }
        /* the top 5 logprobs' ids against a plain ranking (value, then the lower id) */
        for (uint32_t i = 0; i < n; i++) row[i] = (float)((i * 104729u + 3) % 97);
        muser_sampler_params p = plain_params(0.0f, 1);
        p.n_logprobs = 5;
        muser_sampler *s = make(n, &p);
        muser_logprob top[5];
        CHECK(muser_sampler_sample(s, row, NULL, top) >= 0);
        int32_t ref[5];
        uint32_t have = 0;
        for (uint32_t i = 0; i < n; i++) {
            if (have == 5 && !(row[i] > row[ref[4]])) continue;
            uint32_t j = have < 5 ? have++ : 4;
            while (j > 0 && row[i] > row[ref[j - 1]]) {
                ref[j] = ref[j - 1];
                j--;
            }
            ref[j] = (int32_t)i;
        }
        for (uint32_t j = 0; j < 5; j++) bad += top[j].id != (j < have ? ref[j] : -1);
        muser_sampler_free(s);
    }
    CHECKF(bad == 0, "%d row-pass results differ from the plain loops (MUSER_SIMD %s)", bad,
           getenv("MUSER_SIMD") ? getenv("MUSER_SIMD") : "unset");
    free(row);
}

static void test_wide_rows(void)
{
    wide_rows(); /* the AVX2 passes where the CPU has them */
    setenv("MUSER_SIMD", "0", 1);
    wide_rows(); /* the plain loops */
    unsetenv("MUSER_SIMD");
}

/* Sampling from the row's best logits (muser_top_k, what the GPU hands back) draws what sampling
 * the whole row draws, token for token and seed step for seed step, wherever it applies; it does
 * not apply with a penalty or without top-k, and too few candidates are refused. */
static void test_sample_top(void)
{
    const uint32_t V = 50000;
    float *row = malloc(V * sizeof *row);
    struct { float t; uint32_t k; float top_p, min_p; } cfg[] = {
        {0.0f, 0, 1.0f, 0.0f},   {0.8f, 40, 0.95f, 0.05f}, {1.0f, 64, 1.0f, 0.0f},
        {1.5f, 7, 0.9f, 0.0f},   {0.9f, 1, 1.0f, 0.0f},    {2.0f, 64, 0.5f, 0.2f},
    };
    int differ = 0, draws = 0;
    for (size_t ci = 0; ci < sizeof cfg / sizeof cfg[0]; ci++) {
        muser_sampler_params p = plain_params(cfg[ci].t, 77 + ci);
        p.top_k = cfg[ci].k;
        p.top_p = cfg[ci].top_p;
        p.min_p = cfg[ci].min_p;
        muser_sampler *a = make(V, &p), *b = make(V, &p);
        const uint32_t k = muser_sampler_top_needed(b);
        CHECKF(k == (cfg[ci].t == 0.0f || cfg[ci].k == 1 ? 1 : cfg[ci].k), "config %zu: %u candidates needed", ci, k);
        float v[64];
        int32_t id[64];
        for (int d = 0; d < 40; d++) {
            fill_row(row, V, 900 + (uint32_t)d, d % 2 ? 3.0f : 14.0f); /* flat and peaked rows */
            for (uint32_t i = 0; i < V; i += 997) row[i] = row[(i * 31u) % V]; /* ties */
            row[(uint32_t)d * 131u % V] = -INFINITY;
            row[(uint32_t)d * 257u % V] = -0.0f;
            muser_top_k(row, V, k, v, id);
            const int32_t x = muser_sampler_sample(a, row, NULL, NULL);
            const int32_t y = muser_sampler_sample_top(b, v, id, k);
            differ += x != y;
            draws++;
        }
        CHECK(muser_sampler_sample_top(b, v, id, k - 1) == MUSER_E_ARG || k == 1);
        muser_sampler_free(a);
        muser_sampler_free(b);
    }
    CHECKF(differ == 0, "%d of %d draws from the best logits differ from the whole row's", differ, draws);
    muser_sampler_params p = plain_params(0.8f, 1);
    p.top_k = 40;
    p.repeat_penalty = 1.1f;
    muser_sampler *s = make(V, &p);
    CHECK(muser_sampler_top_needed(s) == 0); /* a penalty changes logits the top may not hold */
    muser_sampler_free(s);
    p = plain_params(0.8f, 1); /* no top-k: every token a candidate */
    s = make(V, &p);
    CHECK(muser_sampler_top_needed(s) == 0);
    muser_sampler_free(s);
    free(row);
}

/* The candidates' weights (muser_sampler_dist without top-k, top-p or min-p: every id, e^x for
 * x = (l − l_max) / T): within 2 ulp of expf where e^x is a normal float, 0 below e^-87, the best
 * exactly 1, and the same bits at both SIMD levels; then 300 seeded draws from a 202,048-id row,
 * -inf masks included, give the same tokens at both levels. */
static void test_weights(void)
{
    const uint32_t V = 202048;
    float *row = malloc(V * sizeof *row), *w0 = malloc(V * sizeof *w0);
    for (uint32_t i = 0; i < V; i++) row[i] = 10.0f - 75.0f * (float)((i * 2654435761u) % 100003u) / 100003.0f;
    row[77] = 10.0f;
    int32_t draws[2][300];
    double worst = 0;
    uint32_t bad = 0;
    for (int level = 0; level < 2; level++) {
        if (level) setenv("MUSER_SIMD", "0", 1);
        muser_sampler_params p = plain_params(0.8f, 5);
        muser_sampler *s = make(V, &p);
        const int32_t *ids;
        const float *w;
        uint32_t n;
        double mass;
        CHECK(muser_sampler_dist(s, row, &ids, &w, &n, &mass) == MUSER_OK && n == V);
        for (uint32_t i = 0; i < n && !level; i++) {
            const float x = (row[ids[i]] - 10.0f) / 0.8f, e = expf(x);
            if (x < -87.0f) {
                bad += w[i] != 0.0f;
            } else if (e >= 1.1754944e-38f) {
                const double ulp = (double)nextafterf(e, INFINITY) - e, err = fabs((double)w[i] - e) / ulp;
                worst = err > worst ? err : worst;
                bad += err > 2.0;
            }
            w0[i] = w[i];
        }
        for (uint32_t i = 0; i < n && level; i++) bad += memcmp(&w[i], &w0[i], sizeof w[i]) != 0;
        bad += w[77] != 1.0f;
        float *masked = malloc(V * sizeof *masked);
        memcpy(masked, row, V * sizeof *masked);
        for (uint32_t i = 0; i < V; i += 97) masked[i] = -INFINITY;
        for (int t = 0; t < 300; t++) draws[level][t] = muser_sampler_sample(s, t % 2 ? masked : row, NULL, NULL);
        free(masked);
        muser_sampler_free(s);
    }
    unsetenv("MUSER_SIMD");
    uint32_t differ = 0;
    for (int t = 0; t < 300; t++) differ += draws[0][t] != draws[1][t];
    printf("weights: worst %.2f ulp from expf over %u candidates; 300 draws, %u differ between the SIMD levels\n",
           worst, V, differ);
    CHECKF(bad == 0, "%u weights off (more than 2 ulp from expf, not 0 below e^-87, or not the same bits at both "
           "SIMD levels)", bad);
    CHECKF(differ == 0, "%u of 300 draws differ between the SIMD levels", differ);
    free(row);
    free(w0);
}

/* The whole-row draw (muser_sampler_draw_params, muser_sampler_sample_u: what a GPU draws where
 * the logits are): which samplers draw over the whole row (top-p and min-p included); with u taken
 * from the generator first, sample_u gives muser_sampler_sample's tokens (masked rows and both SIMD
 * levels included) and the generator ends where it does; greedy takes no draw; a non-finite row
 * fails closed; a truncated id is never drawn. */
static void test_plain_draw(void)
{
    const uint32_t V = 202048;
    float *row = malloc(V * sizeof *row);
    muser_sampler_params p = plain_params(0.8f, 9);
    p.top_p = 0.9f;
    p.min_p = 0.02f;
    muser_sampler *s = make(V, &p);
    float t = 0.0f, tp = 0.0f, mp = 0.0f;
    CHECK(muser_sampler_draw_params(s, &t, &tp, &mp) && t == 0.8f && tp == 0.9f && mp == 0.02f);
    muser_sampler_free(s);
    struct { float t; uint32_t k; float top_p, min_p, rep; } no[] = {
        {0.0f, 0, 1.0f, 0.0f, 1.0f}, {0.8f, 40, 1.0f, 0.0f, 1.0f}, {0.8f, 0, 0.95f, 0.0f, 1.1f},
        {0.8f, 1, 0.95f, 0.05f, 1.0f},
    };
    for (size_t i = 0; i < sizeof no / sizeof no[0]; i++) {
        p = plain_params(no[i].t, 9);
        p.top_k = no[i].k;
        p.top_p = no[i].top_p;
        p.min_p = no[i].min_p;
        p.repeat_penalty = no[i].rep;
        s = make(V, &p);
        CHECKF(!muser_sampler_draw_params(s, NULL, NULL, NULL), "sampler %zu draws over the whole row", i);
        muser_sampler_free(s);
    }
    int differ = 0;
    for (int level = 0; level < 2; level++) {
        if (level) setenv("MUSER_SIMD", "0", 1);
        for (int ci = 0; ci < 7; ci++) {
            const float temps[7] = {0.8f, 1.7f, 0.01f, 0.8f, 1.0f, 0.7f, 2.0f};
            const float top_ps[7] = {1.0f, 1.0f, 1.0f, 0.9f, 0.5f, 1.0f, 0.95f};
            const float min_ps[7] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.05f, 0.01f};
            p = plain_params(temps[ci], 31 + (uint64_t)ci);
            p.top_p = top_ps[ci];
            p.min_p = min_ps[ci];
            muser_sampler *a = make(V, &p), *b = make(V, &p);
            for (int d = 0; d < 30; d++) {
                fill_row(row, V, 300 + (uint32_t)d, d % 2 ? 3.0f : 14.0f);
                if (d % 3 == 0) row[(uint32_t)d * 131u % V] = -INFINITY;
                const int32_t x = muser_sampler_sample(a, row, NULL, NULL);
                const double u = muser_sampler_uniform(b);
                differ += x != muser_sampler_sample_u(b, row, u);
                /* the draw lands only on ids the truncation keeps, whatever the uniform */
                const int32_t *ids;
                const float *w;
                uint32_t n;
                double mass;
                CHECK(muser_sampler_dist(b, row, &ids, &w, &n, &mass) == MUSER_OK && n == V);
                const double us[3] = {0.0, 0.999999999, 0.5};
                for (int k = 0; k < 3; k++) {
                    const int32_t y = muser_sampler_sample_u(b, row, us[k]);
                    differ += !(y >= 0 && (uint32_t)y < V);
                    if (y >= 0 && (uint32_t)y < V) {
                        muser_sampler_dist(b, row, &ids, &w, &n, &mass);
                        differ += !(w[y] > 0.0f);
                    }
                }
            }
            differ += muser_sampler_uniform(a) != muser_sampler_uniform(b); /* both generators where they were */
            row[5] = NAN;
            CHECK(muser_sampler_sample_u(b, row, 0.5) == MUSER_E_NUMERIC);
            muser_sampler_free(a);
            muser_sampler_free(b);
        }
    }
    unsetenv("MUSER_SIMD");
    CHECKF(differ == 0, "%d plain draws with the uniform given differ from muser_sampler_sample's", differ);
    free(row);
}

int main(void)
{
    test_greedy();
    test_seeds();
    test_softmax_distribution();
    test_top_k();
    test_top_p_min_p();
    test_penalties();
    test_logprobs();
    test_nonfinite_and_params();
    test_wide_rows();
    test_sample_top();
    test_weights();
    test_plain_draw();
    test_against_reference();
    return check_report("sampler");
}
