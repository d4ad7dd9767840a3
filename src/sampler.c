/* sampler.c — turn one logit row into one token.
 *
 * The chain, in order (llama.cpp semantics, so settings carry over):
 *   1. penalties over the last repeat_last_n accepted tokens, each distinct token once:
 *        repeat:    l > 0 ? l / r : l * r
 *        presence:  l -= presence            (if the token occurs at all)
 *        frequency: l -= frequency * count
 *   2. temperature 0 -> greedy: argmax of the penalised row, ties to the lowest id. Otherwise
 *      l / T, then
 *   3. top-k (k largest, ties to the lowest id), 4. top-p (smallest best-ranked prefix whose
 *      probability reaches p), 5. min-p (drop p_i < min_p * p_max), 6. draw.
 *
 * Cost per token on a V-wide row: one check and one scan of the row (and a copy when a penalty
 * applies). With top-k the k best come
 * from a size-k min-heap (O(V log k)) and only k exponentials are taken. min-p is a threshold on
 * the scaled logit (no exponential needed to decide). Without top-k, every id stays in the list
 * in id order, the ones min-p or top-p drop weighing 0 (draw.h), and top-p needs no full sort: its
 * sums are exact per exponent of the weight (so the GPU, adding in parallel, gets the same bits),
 * the walk from the top finds the exponent, then the bucket of seven mantissa bits, and only that
 * bucket is sorted to place the exact cut. top-p and min-p both keep a best-ranked prefix, so
 * filtering min-p first gives the same set as the documented order, provided top-p is measured
 * against the weight of all candidates left by top-k (it is).
 *
 * The draw walks the kept candidates in rank order when top-k is on and in id order otherwise;
 * the distribution is the same either way, the order only fixes which token a seed yields.
 *
 * RNG: xoshiro256** (Blackman & Vigna), its 256-bit state filled by four successive outputs of
 * splitmix64 started at the seed. A uniform double in [0,1) is (next() >> 11) * 2^-53; one draw
 * per sampled token (greedy draws none).
 *
 * Non-finite logits: NaN or +Inf anywhere in the row, or a row that is -Inf everywhere, fails
 * closed: muser_sampler_sample returns MUSER_E_NUMERIC (negative) and picks nothing. -Inf alone is
 * a legitimate mask.
 *
 * Log-probabilities are of log_softmax(raw logits): before penalties, temperature and truncation,
 * so they describe what the model said, not what the sampler did. They cost one extra pass
 * (V exponentials) and are skipped when neither output is asked for.
 *
 * All buffers are sized at muser_sampler_new; nothing is allocated per token. */
#include "sampler.h"
#include "draw.h"
#include "util.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define SAMPLER_MAX_LOGPROBS 20
#define W_BLOCK MUSER_DRAW_BLOCK /* the draw's blocks of candidates (block_sums) */

struct muser_sampler {
    muser_sampler_params p;
    uint32_t n_vocab;
    float *work;       /* [V] penalised logits (a copy; the caller's row is never written) */
    const float *row;  /* the row the chain reads: the caller's, or work when a penalty applies */
    int32_t *idx;      /* [V] candidate ids */
    float *val;        /* [V] candidate values, parallel to idx */
    int32_t *b_idx;    /* [V] top-p: the candidates of the boundary bucket */
    float *b_val;      /* [V] without top-k: the scaled logits, then the boundary bucket's weights */
    double *bsum;      /* [V / W_BLOCK + 1] the kept candidates' weight per block of W_BLOCK (draw) */
    int32_t *iota;     /* [V] 0, 1, ... V - 1 */
    int32_t *counts;   /* [V] occurrences of each id in the penalty window */
    int32_t *history;  /* [repeat_last_n] ring of the last accepted ids */
    uint32_t hist_len, hist_head;
    uint64_t rng[4];
};

/* ---- RNG ---- */

static uint64_t splitmix64_next(uint64_t *x)
{
    uint64_t z = (*x += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

static uint64_t rotl64(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

static uint64_t xoshiro_next(uint64_t s[4])
{
    uint64_t result = rotl64(s[1] * 5, 7) * 9;
    uint64_t t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl64(s[3], 45);
    return result;
}

static void rng_seed(uint64_t s[4], uint64_t seed)
{
    uint64_t x = seed;
    for (int i = 0; i < 4; i++)
        s[i] = splitmix64_next(&x);
}

static double rng_uniform(uint64_t s[4])
{
    return (double)(xoshiro_next(s) >> 11) * (1.0 / 9007199254740992.0);
}

/* ---- params and lifetime ---- */

void muser_sampler_params_default(muser_sampler_params *p)
{
    memset(p, 0, sizeof *p);
    p->temperature = 0.8f;
    p->top_k = 40;
    p->top_p = 0.95f;
    p->min_p = 0.05f;
    p->repeat_penalty = 1.0f;
    p->presence_penalty = 0.0f;
    p->frequency_penalty = 0.0f;
    p->repeat_last_n = 64;
    p->seed = 0;
    p->n_logprobs = 0;
}

static int check_params(const muser_sampler_params *p, muser_error *err)
{
    if (!(p->temperature >= 0.0f) || !isfinite(p->temperature))
        return muser_errorf(err, MUSER_E_ARG, "sampler: temperature %g must be finite and >= 0",
                            (double)p->temperature);
    if (!(p->top_p > 0.0f && p->top_p <= 1.0f))
        return muser_errorf(err, MUSER_E_ARG, "sampler: top_p %g must be in (0, 1]",
                            (double)p->top_p);
    if (!(p->min_p >= 0.0f && p->min_p <= 1.0f))
        return muser_errorf(err, MUSER_E_ARG, "sampler: min_p %g must be in [0, 1]",
                            (double)p->min_p);
    if (!(p->repeat_penalty > 0.0f) || !isfinite(p->repeat_penalty))
        return muser_errorf(err, MUSER_E_ARG, "sampler: repeat_penalty %g must be finite and > 0",
                            (double)p->repeat_penalty);
    if (!isfinite(p->presence_penalty) || !isfinite(p->frequency_penalty))
        return muser_errorf(err, MUSER_E_ARG, "sampler: presence/frequency penalty must be finite");
    if (p->n_logprobs > SAMPLER_MAX_LOGPROBS)
        return muser_errorf(err, MUSER_E_ARG, "sampler: n_logprobs %u exceeds %d", p->n_logprobs,
                            SAMPLER_MAX_LOGPROBS);
    return MUSER_OK;
}

int muser_sampler_new(muser_sampler **out, uint32_t n_vocab, const muser_sampler_params *p,
                      muser_error *err)
{
    *out = NULL;
    if (n_vocab == 0 || n_vocab > (uint32_t)INT32_MAX)
        return muser_errorf(err, MUSER_E_ARG, "sampler: n_vocab %u out of range", n_vocab);
    int rc = check_params(p, err);
    if (rc)
        return rc;
    muser_sampler *s = calloc(1, sizeof *s);
    if (!s)
        return muser_errorf(err, MUSER_E_NOMEM, "sampler: out of memory");
    s->p = *p;
    s->n_vocab = n_vocab;
    s->work = malloc((size_t)n_vocab * sizeof *s->work);
    s->idx = malloc((size_t)n_vocab * sizeof *s->idx);
    s->val = malloc((size_t)n_vocab * sizeof *s->val);
    s->b_idx = malloc((size_t)n_vocab * sizeof *s->b_idx);
    s->b_val = malloc((size_t)n_vocab * sizeof *s->b_val);
    s->bsum = malloc(((size_t)n_vocab / W_BLOCK + 1) * sizeof *s->bsum);
    s->iota = malloc((size_t)n_vocab * sizeof *s->iota);
    s->counts = calloc(n_vocab, sizeof *s->counts);
    s->history = malloc((size_t)(p->repeat_last_n ? p->repeat_last_n : 1) * sizeof *s->history);
    if (!s->work || !s->idx || !s->val || !s->b_idx || !s->b_val || !s->bsum || !s->iota || !s->counts ||
        !s->history) {
        muser_sampler_free(s);
        return muser_errorf(err, MUSER_E_NOMEM, "sampler: out of memory for %u-entry buffers",
                            n_vocab);
    }
    for (uint32_t i = 0; i < n_vocab; i++)
        s->iota[i] = (int32_t)i;
    rng_seed(s->rng, p->seed);
    *out = s;
    return MUSER_OK;
}

void muser_sampler_free(muser_sampler *s)
{
    if (!s)
        return;
    free(s->work);
    free(s->idx);
    free(s->val);
    free(s->b_idx);
    free(s->b_val);
    free(s->bsum);
    free(s->iota);
    free(s->counts);
    free(s->history);
    free(s);
}

/* Forget the penalty window and restart the RNG from the seed: a reset sampler repeats itself. */
void muser_sampler_reset(muser_sampler *s)
{
    /* Until the ring wraps, slots [0, hist_len) are the filled ones; after, all of them. */
    for (uint32_t i = 0; i < s->hist_len; i++)
        s->counts[s->history[i]] = 0;
    s->hist_len = 0;
    s->hist_head = 0;
    rng_seed(s->rng, s->p.seed);
}

/* Ids outside [0, V) cannot be penalised and are ignored. */
void muser_sampler_accept(muser_sampler *s, int32_t id)
{
    uint32_t n = s->p.repeat_last_n;
    if (n == 0 || id < 0 || (uint32_t)id >= s->n_vocab)
        return;
    if (s->hist_len == n)
        s->counts[s->history[s->hist_head]]--; /* the oldest leaves the window */
    else
        s->hist_len++;
    s->history[s->hist_head] = id;
    s->counts[id]++;
    s->hist_head = (s->hist_head + 1) % n;
}

static bool penalties_active(const muser_sampler_params *p)
{
    return p->repeat_last_n > 0 &&
           (p->repeat_penalty != 1.0f || p->presence_penalty != 0.0f ||
            p->frequency_penalty != 0.0f);
}

/* Penalise each distinct id in the window once. counts[id] is negated while an id is done and
 * restored in a second pass, so no extra marker array is needed. */
static void apply_penalties(muser_sampler *s)
{
    const muser_sampler_params *p = &s->p;
    for (uint32_t i = 0; i < s->hist_len; i++) {
        int32_t id = s->history[i];
        int32_t c = s->counts[id];
        if (c <= 0)
            continue;
        float l = s->work[id];
        l = l > 0.0f ? l / p->repeat_penalty : l * p->repeat_penalty;
        l -= p->presence_penalty + p->frequency_penalty * (float)c;
        s->work[id] = l;
        s->counts[id] = -c;
    }
    for (uint32_t i = 0; i < s->hist_len; i++) {
        int32_t id = s->history[i];
        if (s->counts[id] < 0)
            s->counts[id] = -s->counts[id];
    }
}

/* ---- ordering helpers: "a before b" means larger value, then lower id ---- */

static inline bool ranks_before(float va, int32_t ia, float vb, int32_t ib)
{
    return va > vb || (va == vb && ia < ib);
}

/* Min-heap (the worst candidate at the root) over parallel idx/val arrays. */
static void heap_sift_down(int32_t *idx, float *val, uint32_t n, uint32_t i)
{
    for (;;) {
        uint32_t l = 2 * i + 1, r = l + 1, w = i;
        if (l < n && ranks_before(val[w], idx[w], val[l], idx[l]))
            w = l;
        if (r < n && ranks_before(val[w], idx[w], val[r], idx[r]))
            w = r;
        if (w == i)
            return;
        int32_t ti = idx[i];
        float tv = val[i];
        idx[i] = idx[w];
        val[i] = val[w];
        idx[w] = ti;
        val[w] = tv;
        i = w;
    }
}

static void swap_cand(int32_t *idx, float *val, uint32_t a, uint32_t b)
{
    int32_t ti = idx[a];
    float tv = val[a];
    idx[a] = idx[b];
    val[a] = val[b];
    idx[b] = ti;
    val[b] = tv;
}

/* Insertion sort for short runs, heap sort otherwise: deterministic, no allocation. */
static void sort_cands(int32_t *idx, float *val, uint32_t n)
{
    if (n <= 32) {
        for (uint32_t i = 1; i < n; i++) {
            int32_t ci = idx[i];
            float cv = val[i];
            uint32_t j = i;
            while (j > 0 && ranks_before(cv, ci, val[j - 1], idx[j - 1])) {
                idx[j] = idx[j - 1];
                val[j] = val[j - 1];
                j--;
            }
            idx[j] = ci;
            val[j] = cv;
        }
        return;
    }
    /* Heap sort with the min-heap: pop the worst to the end; the array ends best-first. */
    for (uint32_t i = n / 2; i-- > 0;)
        heap_sift_down(idx, val, n, i);
    for (uint32_t end = n - 1; end > 0; end--) {
        swap_cand(idx, val, 0, end);
        heap_sift_down(idx, val, end, 0);
    }
    /* Min-heap pops put the worst at the end first, so idx[0] is now the best. */
}

/* ---- the chain ---- */

/* Σ exp((double)x[i] − mx) over the row, in f64: the log-sum-exp of the logprobs. With AVX2 four
 * lanes at a time by a Cody–Waite reduction (x = k·ln2 + r, |r| ≤ ln2/2) and a degree-11 Taylor
 * polynomial (|error| < 2^−53 relative on the reduced range: below exp's own rounding), summed
 * per lane and then the lanes in order, so a row's sum is the same on every run; else exp() one
 * element at a time. (The two differ in the last bits; a logprob is reported in f32.) */
#if defined(__x86_64__)
#include <immintrin.h>
__attribute__((target("avx2,fma"))) static double exp_sum_avx2(const float *x, uint32_t n, double mx)
{
    const __m256d vmx = _mm256_set1_pd(mx), log2e = _mm256_set1_pd(1.4426950408889634);
    const __m256d ln2hi = _mm256_set1_pd(6.93147180369123816490e-01), ln2lo = _mm256_set1_pd(1.90821492927058770002e-10);
    const __m256d lo = _mm256_set1_pd(-708.0);
    __m256d acc = _mm256_setzero_pd();
    uint32_t i = 0;
    for (; i + 4 <= n; i += 4) {
        __m256d v = _mm256_sub_pd(_mm256_cvtps_pd(_mm_loadu_ps(x + i)), vmx);
        v = _mm256_max_pd(v, lo); /* exp(−708) ≈ 3e−308: what underflows contributes nothing */
        const __m256d k = _mm256_round_pd(_mm256_mul_pd(v, log2e), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        __m256d r = _mm256_fnmadd_pd(k, ln2hi, v);
        r = _mm256_fnmadd_pd(k, ln2lo, r);
        /* Taylor to r^11 / 11!, Horner */
        __m256d p = _mm256_set1_pd(1.0 / 39916800.0);
        static const double c[11] = {1.0 / 3628800.0, 1.0 / 362880.0, 1.0 / 40320.0, 1.0 / 5040.0, 1.0 / 720.0,
                                     1.0 / 120.0,     1.0 / 24.0,      1.0 / 6.0,     0.5,          1.0, 1.0};
        for (int j = 0; j < 11; j++) p = _mm256_fmadd_pd(p, r, _mm256_set1_pd(c[j]));
        /* 2^k into the exponent field (k in [−1022, 0] here) */
        const __m128i ki = _mm256_cvtpd_epi32(k);
        const __m256i e = _mm256_slli_epi64(_mm256_add_epi64(_mm256_cvtepi32_epi64(ki), _mm256_set1_epi64x(1023)), 52);
        acc = _mm256_add_pd(acc, _mm256_mul_pd(p, _mm256_castsi256_pd(e)));
    }
    double lanes[4];
    _mm256_storeu_pd(lanes, acc);
    double sum = ((lanes[0] + lanes[1]) + (lanes[2] + lanes[3]));
    for (; i < n; i++) sum += exp((double)x[i] - mx);
    return sum;
}
#endif

static double exp_sum(const float *x, uint32_t n, double mx)
{
#if defined(__x86_64__)
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return exp_sum_avx2(x, n, mx);
#endif
    double sum = 0.0;
    for (uint32_t i = 0; i < n; i++) sum += exp((double)x[i] - mx);
    return sum;
}

/* Whether a row can be sampled: no NaN or +inf, and not -inf everywhere. With AVX2 eight lanes at
 * a time, else one branch-free pass on the bits. */
#if defined(__x86_64__)
__attribute__((target("avx2"))) static bool row_ok_avx2(const float *x, uint32_t n)
{
    const __m256 pinf = _mm256_set1_ps(INFINITY), ninf = _mm256_set1_ps(-INFINITY);
    __m256 bad = _mm256_setzero_ps(), finite = _mm256_setzero_ps();
    uint32_t i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m256 v = _mm256_loadu_ps(x + i);
        bad = _mm256_or_ps(bad, _mm256_or_ps(_mm256_cmp_ps(v, v, _CMP_UNORD_Q), _mm256_cmp_ps(v, pinf, _CMP_EQ_OQ)));
        finite = _mm256_or_ps(finite, _mm256_cmp_ps(v, ninf, _CMP_NEQ_UQ));
    }
    bool any_bad = _mm256_movemask_ps(bad) != 0, any_finite = _mm256_movemask_ps(finite) != 0;
    for (; i < n; i++) {
        any_bad |= isnan(x[i]) || x[i] == INFINITY;
        any_finite |= x[i] != -INFINITY;
    }
    return !any_bad && any_finite;
}
#endif

static bool row_ok(const float *restrict in, uint32_t n)
{
#if defined(__x86_64__)
    if (muser_rows_avx2()) return row_ok_avx2(in, n);
#endif
    uint32_t bad = 0, finite = 0;
    for (uint32_t i = 0; i < n; i++) { /* on the bits: NaN or +inf is bad, all -inf is not finite */
        uint32_t u;
        memcpy(&u, &in[i], sizeof u);
        const uint32_t special = (u & 0x7F800000u) == 0x7F800000u, neg_inf = u == 0xFF800000u;
        bad |= special & (neg_inf ^ 1u);
        finite |= neg_inf ^ 1u;
    }
    return !bad && finite;
}

/* The first index at or after i whose value exceeds worst, or n: the top-k scan's filter, which
 * rejects most of a row. With AVX2 sixteen entries per step, else one compare each. */
#if defined(__x86_64__)
__attribute__((target("avx2"))) static uint32_t next_above_avx2(const float *x, uint32_t i, uint32_t n, float worst)
{
    const __m256 w = _mm256_set1_ps(worst);
    for (; i + 16 <= n; i += 16) {
        const int lo = _mm256_movemask_ps(_mm256_cmp_ps(_mm256_loadu_ps(x + i), w, _CMP_GT_OQ));
        const int hi = _mm256_movemask_ps(_mm256_cmp_ps(_mm256_loadu_ps(x + i + 8), w, _CMP_GT_OQ));
        if (lo | hi) return i + (uint32_t)__builtin_ctz((unsigned)(lo | hi << 8));
    }
    for (; i < n && !(x[i] > worst); i++) {}
    return i;
}
#endif

static uint32_t next_above(const float *x, uint32_t i, uint32_t n, float worst, bool avx2)
{
#if defined(__x86_64__)
    if (avx2) return next_above_avx2(x, i, n, worst);
#else
    (void)avx2;
#endif
    for (; i < n && !(x[i] > worst); i++) {}
    return i;
}

void muser_top_k(const float *x, uint32_t n, uint32_t k, float *v, int32_t *id)
{
    if (k == 1) {
        id[0] = muser_argmax(x, n);
        v[0] = x[id[0]];
        return;
    }
    uint32_t i = 0;
    for (; i < k; i++) { /* the first k, made a min-heap (the worst kept at the root) */
        id[i] = (int32_t)i;
        v[i] = x[i];
    }
    for (uint32_t j = k / 2; j-- > 0;)
        heap_sift_down(id, v, k, j);
    /* Most of the row is rejected by comparing it with a local copy of the root (next_above). An
     * equal value loses: its id is higher than every id in the heap. */
    float worst = v[0];
    const bool avx2 = muser_rows_avx2(); /* once a scan: it reads the environment */
    for (i = next_above(x, i, n, worst, avx2); i < n; i = next_above(x, i + 1, n, worst, avx2)) {
        id[0] = (int32_t)i;
        v[0] = x[i];
        heap_sift_down(id, v, k, 0);
        worst = v[0];
    }
    sort_cands(id, v, k);
}

/* Log-probabilities of the raw row: log_softmax(logits)[chosen] and the top-N entries. */
static void raw_logprobs(const muser_sampler *s, const float *logits, int32_t chosen,
                         float *chosen_logprob, muser_logprob *top)
{
    uint32_t V = s->n_vocab;
    float mx = logits[muser_argmax(logits, V)];
    const double sum = exp_sum(logits, V, (double)mx);
    double lse = (double)mx + log(sum);
    if (chosen_logprob)
        *chosen_logprob = (float)((double)logits[chosen] - lse);
    if (!top)
        return;
    const uint32_t n = s->p.n_logprobs, have = n < V ? n : V;
    float v[SAMPLER_MAX_LOGPROBS];
    int32_t id[SAMPLER_MAX_LOGPROBS];
    if (have)
        muser_top_k(logits, V, have, v, id);
    for (uint32_t j = 0; j < have; j++) {
        top[j].id = id[j];
        top[j].logprob = (float)((double)v[j] - lse);
    }
    for (uint32_t j = have; j < n; j++) {
        top[j].id = -1;
        top[j].logprob = -INFINITY;
    }
}

/* A candidate's weight e^x (draw.h: the steps the GPU's draw takes too) */
#define W_LOG2E MUSER_W_LOG2E
#define W_LN2_HI MUSER_W_LN2_HI
#define W_LN2_LO MUSER_W_LN2_LO
#define W_FLOOR MUSER_W_FLOOR
static const float w_c[8] = {MUSER_W_C0, MUSER_W_C1, MUSER_W_C2, MUSER_W_C3,
                             MUSER_W_C4, MUSER_W_C5, MUSER_W_C6, MUSER_W_C7};

static float weight_of(float x) { return muser_weight_of(x); }

#if defined(__x86_64__)
__attribute__((target("avx2,fma"))) static void weights_avx2(const float *x, float *w, uint32_t n)
{
    const __m256 floor = _mm256_set1_ps(W_FLOOR), log2e = _mm256_set1_ps(W_LOG2E);
    const __m256 nhi = _mm256_set1_ps(-W_LN2_HI), nlo = _mm256_set1_ps(-W_LN2_LO);
    uint32_t i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m256 v = _mm256_loadu_ps(x + i);
        const __m256 keep = _mm256_cmp_ps(v, floor, _CMP_GE_OQ);
        const __m256 k = _mm256_round_ps(_mm256_mul_ps(v, log2e), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        __m256 r = _mm256_fmadd_ps(k, nhi, v);
        r = _mm256_fmadd_ps(k, nlo, r);
        __m256 p = _mm256_set1_ps(w_c[0]);
        for (int j = 1; j < 8; j++)
            p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(w_c[j]));
        const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(k), _mm256_set1_epi32(127)), 23);
        _mm256_storeu_ps(w + i, _mm256_and_ps(keep, _mm256_mul_ps(p, _mm256_castsi256_ps(e))));
    }
    for (; i < n; i++)
        w[i] = weight_of(x[i]);
}
#endif

/* w[i] = weight_of(x[i]) (w may be x) */
static void weights(const float *x, float *w, uint32_t n)
{
#if defined(__x86_64__)
    if (muser_rows_avx2() && __builtin_cpu_supports("fma")) {
        weights_avx2(x, w, n);
        return;
    }
#endif
    for (uint32_t i = 0; i < n; i++)
        w[i] = weight_of(x[i]);
}

/* The largest of x[0, n) (no NaN; -inf for n 0): eight lanes with AVX2 (the maximum does not
 * depend on the order), else one compare each. */
#if defined(__x86_64__)
__attribute__((target("avx2"))) static float max_of_avx2(const float *x, uint32_t n)
{
    __m256 m = _mm256_set1_ps(-INFINITY);
    uint32_t i = 0;
    for (; i + 8 <= n; i += 8)
        m = _mm256_max_ps(m, _mm256_loadu_ps(x + i));
    float lane[8], r = -INFINITY;
    _mm256_storeu_ps(lane, m);
    for (int j = 0; j < 8; j++)
        r = lane[j] > r ? lane[j] : r;
    for (; i < n; i++)
        r = x[i] > r ? x[i] : r;
    return r;
}
#endif

static float max_of(const float *x, uint32_t n)
{
#if defined(__x86_64__)
    if (muser_rows_avx2()) return max_of_avx2(x, n);
#endif
    float r = -INFINITY;
    for (uint32_t i = 0; i < n; i++)
        r = x[i] > r ? x[i] : r;
    return r;
}

/* The weight of the candidates w[0, n) per block of W_BLOCK into bsum, and their sum: a block's
 * is eight lanes (lane j the candidates j, j + 8, ... of the block, each summed in f64 in order)
 * added in lane order, the blocks then in order. The AVX2 pass and the plain loop do the same adds
 * in the same order, so they give the same bits; the draw walks the same blocks. */
static double block_sums_plain(const float *w, uint32_t n, double *bsum, uint32_t b0)
{
    double mass = 0.0;
    for (uint32_t b = b0; b * W_BLOCK < n; b++) {
        double lane[8] = {0, 0, 0, 0, 0, 0, 0, 0};
        const uint32_t end = (b + 1) * W_BLOCK < n ? (b + 1) * W_BLOCK : n;
        for (uint32_t i = b * W_BLOCK; i < end; i++)
            lane[i % 8] += (double)w[i];
        double t = 0.0;
        for (int j = 0; j < 8; j++)
            t += lane[j];
        bsum[b] = t;
    }
    for (uint32_t b = 0; b * W_BLOCK < n; b++)
        mass += bsum[b];
    return mass;
}

#if defined(__x86_64__)
__attribute__((target("avx2"))) static double block_sums_avx2(const float *w, uint32_t n, double *bsum)
{
    const uint32_t full = n / W_BLOCK;
    for (uint32_t b = 0; b < full; b++) {
        const float *x = w + (size_t)b * W_BLOCK;
        __m256d lo = _mm256_setzero_pd(), hi = _mm256_setzero_pd();
        for (uint32_t g = 0; g < W_BLOCK; g += 8) {
            const __m256 v = _mm256_loadu_ps(x + g);
            lo = _mm256_add_pd(lo, _mm256_cvtps_pd(_mm256_castps256_ps128(v)));
            hi = _mm256_add_pd(hi, _mm256_cvtps_pd(_mm256_extractf128_ps(v, 1)));
        }
        double lane[8];
        _mm256_storeu_pd(lane, lo);
        _mm256_storeu_pd(lane + 4, hi);
        double t = 0.0;
        for (int j = 0; j < 8; j++)
            t += lane[j];
        bsum[b] = t;
    }
    return block_sums_plain(w, n, bsum, full); /* the tail block, and the sum over all blocks */
}
#endif

static double block_sums(const float *w, uint32_t n, double *bsum)
{
#if defined(__x86_64__)
    if (muser_rows_avx2()) return block_sums_avx2(w, n, bsum);
#endif
    return block_sums_plain(w, n, bsum, 0);
}

/* Whether top-k applies: it keeps fewer than the whole vocabulary. */
static bool top_k_on(const muser_sampler *s) { return s->p.top_k > 0 && s->p.top_k < s->n_vocab; }

static void finish_cands(muser_sampler *s, uint32_t n, uint32_t *n_out, double *mass_out);
static void cands_all(muser_sampler *s, uint32_t *n_out, double *mass_out);

/* The candidates after temperature, top-k, top-p and min-p (s->row: the penalised row):
 * s->idx / s->val [0, *n) with their unnormalised weights, *mass their sum. */
static void truncate_cands(muser_sampler *s, uint32_t *n_out, double *mass_out)
{
    if (!top_k_on(s)) {
        cands_all(s, n_out, mass_out);
        return;
    }
    /* the top-k, sorted; -inf is never one */
    uint32_t n = 0;
    muser_top_k(s->row, s->n_vocab, s->p.top_k, s->val, s->idx);
    while (n < s->p.top_k && s->val[n] != -INFINITY)
        n++;
    finish_cands(s, n, n_out, mass_out);
}

/* Temperature, min-p and top-p over the candidates s->idx / s->val [0, n) (raw logits, best
 * first). */
static void finish_cands(muser_sampler *s, uint32_t n, uint32_t *n_out, double *mass_out)
{
    const muser_sampler_params *p = &s->p;

    /* Temperature: val becomes x = (l - l_max) / T <= 0, the best at 0; a tiny T sends the rest
     * to -inf (never inf * 0 = NaN). A candidate's weight is weight_of(x) ≈ e^x, the best
     * weighing 1. */
    const float raw_max = n ? s->val[0] : -INFINITY;
    for (uint32_t i = 0; i < n; i++)
        s->val[i] = (s->val[i] - raw_max) / p->temperature;

    /* Weights. top-p measures against z, the weight of every candidate left by top-k; min-p
     * (p_i >= min_p * p_max <=> x_i >= log(min_p)) filters on x first, keeping the order, so
     * only its survivors need a weight beyond z. */
    double z = 0.0, mass = 0.0;
    if (p->min_p > 0.0f) {
        if (p->top_p < 1.0f) {
            weights(s->val, s->b_val, n);
            for (uint32_t i = 0; i < n; i++)
                z += (double)s->b_val[i];
        }
        const float cut = logf(p->min_p);
        uint32_t kept = 0;
        for (uint32_t i = 0; i < n; i++)
            if (s->val[i] >= cut) {
                s->idx[kept] = s->idx[i];
                s->val[kept] = s->val[i];
                kept++;
            }
        n = kept;
        weights(s->val, s->val, n);
        for (uint32_t i = 0; i < n; i++)
            mass += (double)s->val[i];
    } else {
        weights(s->val, s->val, n);
        if (p->top_p < 1.0f) /* (what top-p measures against; the draw's weight is block_sums') */
            for (uint32_t i = 0; i < n; i++)
                mass += (double)s->val[i];
        z = mass;
    }

    /* top-p: keep the best-ranked candidates up to the first whose running weight reaches
     * top_p * z. When min-p already kept less than that, top-p keeps all of it. */
    if (p->top_p < 1.0f && n > 1 && mass >= (double)p->top_p * z) {
        const double need = (double)p->top_p * z;
        double cum = 0.0;
        for (uint32_t i = 0; i < n; i++) {
            cum += (double)s->val[i];
            if (cum >= need) {
                n = i + 1;
                break;
            }
        }
    }
    *n_out = n;
    *mass_out = block_sums(s->val, n, s->bsum); /* the kept list's weight, as the draw walks it */
}

/* x[i] = (l[i] − mx) / T for i in [i0, n), each one IEEE subtract and divide (the GPU's draw takes
 * the same); scale_row: eight lanes at a time with AVX2 */
static void scale_from(const float *l, float mx, float T, float *x, uint32_t i0, uint32_t n)
{
    for (uint32_t i = i0; i < n; i++)
        x[i] = (l[i] - mx) / T;
}

/* w[i] = 0 for i in [i0, n) unless v[i] > c, or v[i] == c and i ≤ ci (muser_topp_keeps; ci
 * INT32_MAX: v[i] ≥ c); keep_at_least: eight lanes at a time with AVX2 */
static void keep_from(const float *v, float c, int32_t ci, float *w, uint32_t i0, uint32_t n)
{
    for (uint32_t i = i0; i < n; i++)
        if (!muser_topp_keeps(v[i], (int32_t)i, c, ci)) w[i] = 0.0f;
}

#if defined(__x86_64__)
__attribute__((target("avx2"))) static uint32_t scale_avx2(const float *l, float mx, float T, float *x, uint32_t n)
{
    const __m256 m = _mm256_set1_ps(mx), t = _mm256_set1_ps(T);
    uint32_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(x + i, _mm256_div_ps(_mm256_sub_ps(_mm256_loadu_ps(l + i), m), t));
    return i;
}

__attribute__((target("avx2"))) static uint32_t keep_avx2(const float *v, float c, int32_t ci, float *w, uint32_t n)
{
    const __m256 cc = _mm256_set1_ps(c);
    const __m256i ci8 = _mm256_set1_epi32(ci), step = _mm256_set1_epi32(8);
    __m256i id = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    uint32_t i = 0;
    for (; i + 8 <= n; i += 8, id = _mm256_add_epi32(id, step)) {
        const __m256 vv = _mm256_loadu_ps(v + i);
        const __m256 eq_ok = _mm256_and_ps(_mm256_cmp_ps(vv, cc, _CMP_EQ_OQ),
                                           _mm256_castsi256_ps(_mm256_xor_si256(_mm256_cmpgt_epi32(id, ci8), _mm256_set1_epi32(-1))));
        const __m256 keep = _mm256_or_ps(_mm256_cmp_ps(vv, cc, _CMP_GT_OQ), eq_ok);
        _mm256_storeu_ps(w + i, _mm256_and_ps(keep, _mm256_loadu_ps(w + i)));
    }
    return i;
}
#endif

static void scale_row(const float *l, float mx, float T, float *x, uint32_t n)
{
    uint32_t i0 = 0;
#if defined(__x86_64__)
    if (muser_rows_avx2()) i0 = scale_avx2(l, mx, T, x, n);
#endif
    scale_from(l, mx, T, x, i0, n);
}

static void keep_at_least(const float *v, float c, int32_t ci, float *w, uint32_t n)
{
    uint32_t i0 = 0;
#if defined(__x86_64__)
    if (muser_rows_avx2()) i0 = keep_avx2(v, c, ci, w, n);
#endif
    keep_from(v, c, ci, w, i0, n);
}

/* w as a double where keep is 1, else 0 (a mask, not a branch: which ids pass is random) */
static inline double dkeep(float w, int keep)
{
    double d = (double)w;
    uint64_t b;
    memcpy(&b, &d, sizeof b);
    b &= (uint64_t)0 - (uint64_t)(keep & 1);
    memcpy(&d, &b, sizeof d);
    return d;
}

/* top-p over the whole row (draw.h): w [V] the weights with min-p's drops already 0, z the weight
 * of every candidate before min-p, em the kept weight per exponent; the last candidate kept,
 * (*lv, *li), or false when top-p keeps everything min-p kept. */
static bool topp_cut(muser_sampler *s, const float *w, double z, const double *em, float *lv, int32_t *li)
{
    const uint32_t V = s->n_vocab;
    const double need = (double)s->p.top_p * z;
    if (!(muser_topp_total(em, MUSER_DRAW_EXPS) >= need))
        return false;
    double bs[MUSER_DRAW_SUBS] = {0};
    double above = 0.0;
    const int e = muser_topp_walk(em, MUSER_DRAW_EXPS, need, &above);
    if (e < 0) return false;
    /* (branch-free passes: which ids pass a test is random along the row) */
    for (uint32_t i = 0; i < V; i++) {
        const uint32_t bits = muser_w_bits(w[i]); /* (a weight of 0 has exponent 0 < e or none) */
        bs[(bits >> 16) & (MUSER_DRAW_SUBS - 1)] += dkeep(w[i], (bits >> 23 == (uint32_t)e) & (w[i] > 0.0f));
    }
    const uint32_t b = (uint32_t)e << 7 | (uint32_t)muser_topp_walk(bs, MUSER_DRAW_SUBS, need, &above);
    uint32_t m = 0;
    for (uint32_t i = 0; i < V; i++) {
        s->b_idx[m] = (int32_t)i;
        s->b_val[m] = w[i];
        m += (w[i] > 0.0f) & (muser_w_bits(w[i]) >> 16 == b);
    }
    sort_cands(s->b_idx, s->b_val, m); /* weight, then the lower id */
    uint32_t last = m - 1;
    double cum = 0.0; /* exact: one exponent's weights (draw.h) */
    for (uint32_t j = 0; j < m; j++) {
        cum += (double)s->b_val[j];
        if (above + cum >= need) {
            last = j;
            break;
        }
    }
    *lv = s->b_val[last];
    *li = s->b_idx[last];
    return true;
}

/* Without top-k (draw.h): every id a candidate in id order, s->val its weight, 0 for an id whose
 * logit is −inf or that min-p or top-p drops. */
static void cands_all(muser_sampler *s, uint32_t *n_out, double *mass_out)
{
    const muser_sampler_params *p = &s->p;
    const uint32_t V = s->n_vocab;
    float *x = s->b_val, *w = s->val;
    scale_row(s->row, max_of(s->row, V), p->temperature, x, V);
    weights(x, w, V);
    const float cut = muser_min_p_cut(p->min_p);
    double ez[MUSER_DRAW_EXPS] = {0}, em[MUSER_DRAW_EXPS] = {0};
    if (p->top_p < 1.0f) { /* the sums per exponent: exact in any order (draw.h), so four tables
                            * (independent chains of adds) summed after give the same bits */
        double t[2][4][MUSER_DRAW_EXPS];
        memset(t, 0, sizeof t);
        const int both = p->min_p > 0.0f;
        for (uint32_t i = 0; i < V; i++) { /* (a weight 0 adds 0; no branch on a random test) */
            const uint32_t e = muser_w_exp(w[i]);
            t[0][i & 3][e] += (double)w[i];
            if (both) t[1][i & 3][e] += dkeep(w[i], x[i] >= cut);
        }
        for (int e = 0; e < MUSER_DRAW_EXPS; e++) {
            ez[e] = (t[0][0][e] + t[0][1][e]) + (t[0][2][e] + t[0][3][e]);
            em[e] = both ? (t[1][0][e] + t[1][1][e]) + (t[1][2][e] + t[1][3][e]) : ez[e];
        }
    }
    if (p->min_p > 0.0f) keep_at_least(x, cut, INT32_MAX, w, V); /* min-p: x ≥ cut */
    float lv;
    int32_t li;
    if (p->top_p < 1.0f && topp_cut(s, w, muser_topp_total(ez, MUSER_DRAW_EXPS), em, &lv, &li))
        keep_at_least(w, lv, li, w, V); /* top-p: ranked at or before (lv, li) */
    memcpy(s->idx, s->iota, (size_t)V * sizeof *s->idx);
    *n_out = V;
    *mass_out = block_sums(w, V, s->bsum);
}

/* The last candidate of val[lo, hi) with weight, else lo's: where the draw's walk lands when
 * rounding leaves u just past the steps it added */
static int32_t last_weighed(const muser_sampler *s, uint32_t lo, uint32_t hi)
{
    for (uint32_t i = hi; i-- > lo;)
        if (s->val[i] > 0.0f) return s->idx[i];
    return s->idx[lo];
}

/* Draw: the uniform's step u in [0, mass) found by walking the blocks' weights (block_sums, which
 * the candidates' pass left), then the candidates of that block in order (rank order with top-k,
 * id order without). */
static int32_t draw_u(muser_sampler *s, uint32_t n, double mass, double u01)
{
    const double u = u01 * mass;
    double acc = 0.0;
    for (uint32_t b = 0; b * W_BLOCK < n; b++) {
        if (!(u < acc + s->bsum[b])) {
            acc += s->bsum[b];
            continue;
        }
        const uint32_t end = (b + 1) * W_BLOCK < n ? (b + 1) * W_BLOCK : n;
        for (uint32_t i = b * W_BLOCK; i < end; i++) {
            acc += (double)s->val[i];
            if (u < acc)
                return s->idx[i];
        }
        return last_weighed(s, b * W_BLOCK, end); /* the block's candidates summed in order fall short */
    }
    return last_weighed(s, 0, n);
}

static int32_t draw(muser_sampler *s, uint32_t n, double mass) { return draw_u(s, n, mass, rng_uniform(s->rng)); }

/* The draw with u01 as its uniform (the generator unmoved). */
static int32_t sample_truncated_u(muser_sampler *s, double u01)
{
    uint32_t n;
    double mass;
    truncate_cands(s, &n, &mass);
    return draw_u(s, n, mass, u01);
}

static int32_t sample_truncated(muser_sampler *s) { return sample_truncated_u(s, rng_uniform(s->rng)); }

/* Validate the row; the chain reads it where it is, or a copy in s->work with the penalties
 * applied. */
static int load_row(muser_sampler *s, const float *logits)
{
    const uint32_t n = s->n_vocab;
    if (!row_ok(logits, n))
        return MUSER_E_NUMERIC;
    s->row = logits;
    if (penalties_active(&s->p)) {
        memcpy(s->work, logits, (size_t)n * sizeof *s->work);
        apply_penalties(s);
        s->row = s->work;
    }
    return MUSER_OK;
}

static bool is_greedy(const muser_sampler *s) { return s->p.temperature == 0.0f || s->p.top_k == 1; }

uint32_t muser_sampler_top_needed(const muser_sampler *s)
{
    if (penalties_active(&s->p)) return 0;
    return is_greedy(s) ? 1 : top_k_on(s) ? s->p.top_k : 0;
}

int32_t muser_sampler_sample_top(muser_sampler *s, const float *v, const int32_t *id, uint32_t n)
{
    const uint32_t k = muser_sampler_top_needed(s);
    if (!k || n < k || !v || !id)
        return MUSER_E_ARG;
    if (isnan(v[0]) || v[0] == INFINITY || v[0] == -INFINITY) /* what load_row refuses, seen from the top */
        return MUSER_E_NUMERIC;
    if (is_greedy(s))
        return id[0];
    uint32_t m = 0;
    while (m < k && v[m] != -INFINITY) { /* the first k, -inf never a candidate: truncate_cands' list */
        s->idx[m] = id[m];
        s->val[m] = v[m];
        m++;
    }
    uint32_t kept;
    double mass;
    finish_cands(s, m, &kept, &mass);
    return draw(s, kept, mass);
}

int32_t muser_sampler_sample(muser_sampler *s, const float *logits, float *chosen_logprob,
                             muser_logprob *top)
{
    const muser_sampler_params *p = &s->p;
    const uint32_t V = s->n_vocab;
    if (load_row(s, logits))
        return MUSER_E_NUMERIC;

    int32_t chosen = is_greedy(s) ? muser_argmax(s->row, V)
                                                                : sample_truncated(s);
    if (chosen_logprob || (top && p->n_logprobs > 0))
        raw_logprobs(s, logits, chosen, chosen_logprob, p->n_logprobs ? top : NULL);
    return chosen;
}

int muser_sampler_dist(muser_sampler *s, const float *logits, const int32_t **ids, const float **w,
                       uint32_t *n, double *mass)
{
    int rc = load_row(s, logits);
    if (rc)
        return rc;
    if (is_greedy(s)) {
        s->idx[0] = muser_argmax(s->row, s->n_vocab);
        s->val[0] = 1.0f;
        *n = 1;
        *mass = 1.0;
    } else {
        truncate_cands(s, n, mass);
    }
    *ids = s->idx;
    *w = s->val;
    return MUSER_OK;
}

bool muser_sampler_greedy(const muser_sampler *s) { return is_greedy(s); }

bool muser_sampler_draw_params(const muser_sampler *s, float *temperature, float *top_p, float *min_p)
{
    const muser_sampler_params *p = &s->p;
    if (penalties_active(p) || is_greedy(s) || top_k_on(s))
        return false;
    if (temperature) *temperature = p->temperature;
    if (top_p) *top_p = p->top_p;
    if (min_p) *min_p = p->min_p;
    return true;
}

int32_t muser_sampler_sample_u(muser_sampler *s, const float *logits, double u)
{
    if (load_row(s, logits))
        return MUSER_E_NUMERIC;
    return is_greedy(s) ? muser_argmax(s->row, s->n_vocab) : sample_truncated_u(s, u);
}

double muser_sampler_uniform(muser_sampler *s)
{
    return rng_uniform(s->rng);
}

float muser_sampler_logprob(const muser_sampler *s, const float *logits, int32_t id)
{
    float lp = 0.0f;
    raw_logprobs(s, logits, id, &lp, NULL);
    return lp;
}
