/* test_reference.c — the oracle (src/reference.c) on hand-built tiny models with F32 weights.
 *
 *   1. It equals a separately written naive forward pass: layer-major over the whole sequence
 *      (no cache, no ring: every query looks its keys up by position in a plain array), for
 *      muse (sandwich norms, gate, QK-norm, RoPE on SWA layers only, soft cap) and llama.
 *      At position 0 the naive pass also checks the hand-derivable identity o = v ⊙ sigmoid(g).
 *   2. The sliding window: in an all-SWA model of L layers, position p depends only on tokens
 *      p - L(W-1) .. p, so changing an older token leaves its logits bit-identical (the ring
 *      wraps many times), while a FULL model changes everywhere after the edit.
 *   3. Batch (n > 1) equals decode one by one, bit for bit; thread count does not matter.
 *   4. Fail closed: a poisoned weight gives MUSER_E_NUMERIC, n_past, the KV cache and the
 *      caller's logits unchanged; a discontinuous position is refused with nothing changed.
 *   5. Checkpoint / rollback through the session equals never having run the rejected rows;
 *      context full is refused with the numbers. */
#include "check.h"
#include "session.h"
#include "util.h"

#include <math.h>
#include <string.h>

/* ---- a hand-built model with F32 weights in memory ---- */

typedef struct test_model {
    muser_model m;
    float *owned[512];
    int n_owned;
} test_model;

static uint64_t rng_state;

static double rng_uniform(void) /* splitmix64 -> [-1, 1) */
{
    uint64_t z = (rng_state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    return (double)(z >> 11) / 9007199254740992.0 * 2.0 - 1.0;
}

/* rows x cols F32: values uniform in ±amp, or 1 ± amp for norms (rows == 1, norm == true). */
static muser_tensor make_tensor(test_model *tm, const char *name, uint64_t cols, uint64_t rows,
                                double amp, bool norm)
{
    float *w = malloc(cols * rows * sizeof(float));
    for (uint64_t i = 0; i < cols * rows; i++)
        w[i] = (float)((norm ? 1.0 : 0.0) + amp * rng_uniform());
    tm->owned[tm->n_owned++] = w;
    muser_tensor t = {.data = w, .type = 0 /* F32 */, .cols = cols, .rows = rows,
                      .row_bytes = cols * sizeof(float), .name = name};
    return t;
}

static void build_model(test_model *tm, muser_arch arch, uint32_t n_layer, uint32_t pattern,
                        uint64_t seed)
{
    memset(tm, 0, sizeof *tm);
    rng_state = seed;
    muser_hparams *hp = &tm->m.hp;
    hp->arch = arch;
    hp->n_layer = n_layer;
    hp->n_embd = 32;
    hp->n_ff = 48;
    hp->n_head = 4;
    hp->n_head_kv = 2;
    hp->head_dim = 8;
    hp->n_vocab = 40;
    hp->n_ctx_train = 64;
    hp->rms_eps = 1e-5f;
    hp->rope_theta = 100.0f; /* small base: large angles even at small positions */
    hp->rope_dim = 8;
    hp->attn_scale = 1.0f / sqrtf(8.0f);
    hp->logit_scale = 1.0f;
    if (arch == MUSER_ARCH_MUSE) {
        hp->post_norm_eps = 1e-8f;
        hp->swa_window = 4;
        hp->swa_pattern = pattern;
        hp->logit_scale = 0.7f;
        hp->final_softcap = 3.0f;
        hp->entry_norm = hp->sandwich = hp->attn_gate = hp->qk_norm = true;
    }
    const uint64_t E = hp->n_embd, F = hp->n_ff, QD = hp->n_head * hp->head_dim;
    const uint64_t KVD = hp->n_head_kv * hp->head_dim, V = hp->n_vocab, D = hp->head_dim;
    tm->m.tok_embd = make_tensor(tm, "token_embd.weight", E, V, 1.0, false);
    tm->m.output_norm = make_tensor(tm, "output_norm.weight", E, 1, 0.2, true);
    tm->m.output = make_tensor(tm, "output.weight", E, V, 1.0, false);
    tm->m.layers = calloc(n_layer, sizeof *tm->m.layers);
    for (uint32_t l = 0; l < n_layer; l++) {
        muser_layer *L = &tm->m.layers[l];
        L->attn_norm = make_tensor(tm, "attn_norm", E, 1, 0.2, true);
        L->attn_q = make_tensor(tm, "attn_q", E, QD, 0.5, false);
        L->attn_k = make_tensor(tm, "attn_k", E, KVD, 0.5, false);
        L->attn_v = make_tensor(tm, "attn_v", E, KVD, 0.5, false);
        L->attn_output = make_tensor(tm, "attn_output", QD, E, 0.3, false);
        L->ffn_norm = make_tensor(tm, "ffn_norm", E, 1, 0.2, true);
        L->ffn_gate = make_tensor(tm, "ffn_gate", E, F, 0.4, false);
        L->ffn_up = make_tensor(tm, "ffn_up", E, F, 0.4, false);
        L->ffn_down = make_tensor(tm, "ffn_down", F, E, 0.3, false);
        if (arch == MUSER_ARCH_MUSE) {
            L->attn_gate = make_tensor(tm, "attn_gate", E, QD, 0.5, false);
            L->attn_q_norm = make_tensor(tm, "attn_q_norm", D, 1, 0.2, true);
            L->attn_k_norm = make_tensor(tm, "attn_k_norm", D, 1, 0.2, true);
            L->post_attention_norm = make_tensor(tm, "post_attention_norm", E, 1, 0.2, true);
            L->post_ffw_norm = make_tensor(tm, "post_ffw_norm", E, 1, 0.2, true);
        }
    }
}

static void free_model(test_model *tm)
{
    for (int i = 0; i < tm->n_owned; i++)
        free(tm->owned[i]);
    free(tm->m.layers);
}

/* ---- the naive pass: layer-major, whole sequence, plain arrays ---- */

static const float *W(const muser_tensor *t) { return (const float *)t->data; }

/* y[rows] = W x */
static void naive_mv(const muser_tensor *t, const double *x, double *y)
{
    for (uint64_t r = 0; r < t->rows; r++) {
        double s = 0;
        for (uint64_t c = 0; c < t->cols; c++)
            s += (double)W(t)[r * t->cols + c] * x[c];
        y[r] = s;
    }
}

static void naive_norm(double *x, const float *w, uint64_t n, double eps)
{
    double ms = 0;
    for (uint64_t i = 0; i < n; i++)
        ms += x[i] * x[i] / (double)n;
    for (uint64_t i = 0; i < n; i++)
        x[i] = x[i] / sqrt(ms + eps) * (w ? w[i] : 1.0);
}

static double f16_round(double x) { return muser_f16_to_f32(muser_f32_to_f16((float)x)); }

#define NMAX 32

/* logits[n][V] of tokens[0..n) from position 0. Returns the largest |o - v⊙σ(g)| seen at
 * position 0 (the single-key identity), which must be 0. */
static double naive_forward(const muser_model *m, const int32_t *tok, int n, float *logits)
{
    const muser_hparams *hp = &m->hp;
    enum { E = 32, F = 48, QD = 32, KVD = 16, D = 8 };
    static double h[NMAX][E], a[E], q[NMAX][QD], k[NMAX][KVD], v[NMAX][KVD], g[NMAX][QD],
        o[QD], t[E], fg[F], fu[F], lg[64];
    double pos0_err = 0;
    for (int p = 0; p < n; p++) {
        for (int i = 0; i < E; i++)
            h[p][i] = W(&m->tok_embd)[tok[p] * E + i];
        if (hp->entry_norm)
            naive_norm(h[p], NULL, E, hp->rms_eps);
    }
    for (uint32_t l = 0; l < hp->n_layer; l++) {
        const muser_layer *L = &m->layers[l];
        const bool swa = hp->arch == MUSER_ARCH_MUSE && l % hp->swa_pattern != hp->swa_pattern - 1;
        const bool rope = hp->arch != MUSER_ARCH_MUSE || swa;
        for (int p = 0; p < n; p++) { /* projections of every position */
            memcpy(a, h[p], sizeof a);
            naive_norm(a, W(&L->attn_norm), E, hp->rms_eps);
            naive_mv(&L->attn_q, a, q[p]);
            naive_mv(&L->attn_k, a, k[p]);
            naive_mv(&L->attn_v, a, v[p]);
            if (hp->attn_gate)
                naive_mv(&L->attn_gate, a, g[p]);
            for (int hh = 0; hh < QD / D; hh++) {
                double *x = q[p] + hh * D;
                if (hp->qk_norm)
                    naive_norm(x, W(&L->attn_q_norm), D, hp->rms_eps);
                for (int i = 0; rope && i < D / 2; i++) {
                    double th = p * exp(-2.0 * i / D * log(hp->rope_theta));
                    double x0 = x[2 * i], x1 = x[2 * i + 1];
                    x[2 * i] = x0 * cos(th) - x1 * sin(th);
                    x[2 * i + 1] = x1 * cos(th) + x0 * sin(th);
                }
            }
            for (int hh = 0; hh < KVD / D; hh++) {
                double *x = k[p] + hh * D;
                if (hp->qk_norm)
                    naive_norm(x, W(&L->attn_k_norm), D, hp->rms_eps);
                for (int i = 0; rope && i < D / 2; i++) {
                    double th = p * exp(-2.0 * i / D * log(hp->rope_theta));
                    double x0 = x[2 * i], x1 = x[2 * i + 1];
                    x[2 * i] = x0 * cos(th) - x1 * sin(th);
                    x[2 * i + 1] = x1 * cos(th) + x0 * sin(th);
                }
            }
            for (int i = 0; i < KVD; i++) { /* the cache holds f16 */
                k[p][i] = f16_round(k[p][i]);
                v[p][i] = f16_round(v[p][i]);
            }
        }
        for (int p = 0; p < n; p++) {
            for (int hh = 0; hh < QD / D; hh++) {
                const int kh = hh / ((QD / D) / (KVD / D));
                const int j0 = swa && p >= (int)hp->swa_window ? p - (int)hp->swa_window + 1 : 0;
                double w[NMAX], mx = -1e300, sum = 0;
                for (int j = j0; j <= p; j++) {
                    w[j] = 0;
                    for (int d = 0; d < D; d++)
                        w[j] += q[p][hh * D + d] * k[j][kh * D + d];
                    w[j] /= sqrt((double)D);
                    mx = w[j] > mx ? w[j] : mx;
                }
                for (int j = j0; j <= p; j++)
                    sum += (w[j] = exp(w[j] - mx));
                for (int d = 0; d < D; d++) {
                    double acc = 0;
                    for (int j = j0; j <= p; j++)
                        acc += w[j] / sum * v[j][kh * D + d];
                    const double gate = hp->attn_gate ? 1 / (1 + exp(-g[p][hh * D + d])) : 1;
                    o[hh * D + d] = acc * gate;
                    if (p == 0) {
                        double e = fabs(o[hh * D + d] - v[0][kh * D + d] * gate);
                        pos0_err = e > pos0_err ? e : pos0_err;
                    }
                }
            }
            naive_mv(&L->attn_output, o, t);
            if (hp->sandwich)
                naive_norm(t, W(&L->post_attention_norm), E, hp->post_norm_eps);
            for (int i = 0; i < E; i++)
                h[p][i] += t[i];
            memcpy(a, h[p], sizeof a);
            naive_norm(a, W(&L->ffn_norm), E, hp->rms_eps);
            naive_mv(&L->ffn_gate, a, fg);
            naive_mv(&L->ffn_up, a, fu);
            for (int i = 0; i < F; i++)
                fg[i] = fg[i] / (1 + exp(-fg[i])) * fu[i];
            naive_mv(&L->ffn_down, fg, t);
            if (hp->sandwich)
                naive_norm(t, W(&L->post_ffw_norm), E, hp->post_norm_eps);
            for (int i = 0; i < E; i++)
                h[p][i] += t[i];
        }
    }
    for (int p = 0; p < n; p++) {
        memcpy(a, h[p], sizeof a);
        naive_norm(a, W(&m->output_norm), E, hp->rms_eps);
        naive_mv(&m->output, a, lg);
        for (uint32_t i = 0; i < hp->n_vocab; i++) {
            double z = lg[i] * hp->logit_scale;
            if (hp->final_softcap > 0)
                z = hp->final_softcap * tanh(z / hp->final_softcap);
            logits[(uint64_t)p * hp->n_vocab + i] = (float)z;
        }
    }
    return pos0_err;
}

/* ---- helpers ---- */

static muser_session *new_session(const muser_model *m, uint64_t n_ctx, uint32_t threads)
{
    muser_session_opts o = {.backend = MUSER_BACKEND_ORACLE, .n_ctx = n_ctx,
                            .n_threads = threads};
    muser_session *s = NULL;
    muser_error err = {0};
    CHECK_OK(muser_session_new(&s, m, &o, &err), &err);
    return s;
}

static void make_tokens(int32_t *t, int n, uint32_t V, uint64_t seed)
{
    rng_state = seed;
    for (int i = 0; i < n; i++)
        t[i] = (int32_t)((rng_uniform() + 1.0) * 0.5 * V) % (int32_t)V;
}

static float max_abs_diff(const float *a, const float *b, size_t n)
{
    float mx = 0;
    for (size_t i = 0; i < n; i++) {
        float d = fabsf(a[i] - b[i]);
        mx = d > mx || isnan(d) ? d : mx;
    }
    return mx;
}

/* ---- the tests ---- */

static void test_against_naive(muser_arch arch, uint32_t n_layer, uint32_t pattern)
{
    test_model tm;
    build_model(&tm, arch, n_layer, pattern, 42 + arch);
    const uint32_t V = tm.m.hp.n_vocab;
    enum { N = 13 }; /* > 3 windows: the rings wrap */
    int32_t tok[N];
    make_tokens(tok, N, V, 7);
    static float want[N * 64], got[N * 64];
    double pos0 = naive_forward(&tm.m, tok, N, want);
    CHECKF(pos0 == 0.0, "position 0: o differs from v*sigmoid(g) by %g", pos0);

    muser_session *s = new_session(&tm.m, 32, 2);
    muser_error err = {0};
    for (int p = 0; p < N; p++)
        CHECK_OK(muser_session_forward(s, &tok[p], 1, got + (size_t)p * V, false, &err), &err);
    float d = max_abs_diff(want, got, (size_t)N * V);
    CHECKF(d <= 2e-6f, "%s: oracle vs naive max |diff| %g", muser_arch_name(arch), d);
    /* A logit is not constant: the check above has teeth. */
    CHECK(max_abs_diff(got, got + V, V) > 1e-2f);
    printf("%s (%u layers): oracle vs naive over %d positions: max |diff| %.3g\n",
           muser_arch_name(arch), n_layer, N, d);
    muser_session_free(s);
    free_model(&tm);
}

static void test_window(void)
{
    /* pattern 100 with 2 layers: every layer SWA, W = 4: receptive field 2*(4-1) = 6 back. */
    test_model tm;
    build_model(&tm, MUSER_ARCH_MUSE, 2, 100, 5);
    const uint32_t V = tm.m.hp.n_vocab;
    enum { N = 20, EDIT = 5 };
    int32_t a[N], b[N];
    make_tokens(a, N, V, 11);
    memcpy(b, a, sizeof a);
    b[EDIT] = (a[EDIT] + 1) % (int32_t)V;
    static float la[N * 64], lb[N * 64];
    muser_error err = {0};
    muser_session *sa = new_session(&tm.m, 32, 1), *sb = new_session(&tm.m, 32, 1);
    CHECK_OK(muser_session_forward(sa, a, N, la, true, &err), &err);
    CHECK_OK(muser_session_forward(sb, b, N, lb, true, &err), &err);
    for (int p = 0; p < N; p++) {
        const bool reach = p >= EDIT && p <= EDIT + 2 * 3;
        const bool same = !memcmp(la + (size_t)p * V, lb + (size_t)p * V, V * sizeof(float));
        CHECKF(same != reach, "position %d: edit at %d %s", p, EDIT,
               reach ? "should change the logits" : "must not change the logits");
    }
    muser_session_free(sa);
    muser_session_free(sb);
    free_model(&tm);

    /* pattern 1: every layer FULL (NoPE): the edit reaches every later position. */
    build_model(&tm, MUSER_ARCH_MUSE, 2, 1, 5);
    sa = new_session(&tm.m, 32, 1);
    sb = new_session(&tm.m, 32, 1);
    CHECK_OK(muser_session_forward(sa, a, N, la, true, &err), &err);
    CHECK_OK(muser_session_forward(sb, b, N, lb, true, &err), &err);
    for (int p = 0; p < N; p++) {
        const bool same = !memcmp(la + (size_t)p * V, lb + (size_t)p * V, V * sizeof(float));
        CHECKF(same == (p < EDIT), "FULL model, position %d", p);
    }
    muser_session_free(sa);
    muser_session_free(sb);
    free_model(&tm);
}

static void test_batch_equals_decode(void)
{
    test_model tm;
    build_model(&tm, MUSER_ARCH_MUSE, 4, 4, 9);
    const uint32_t V = tm.m.hp.n_vocab;
    enum { N = 11 };
    int32_t tok[N];
    make_tokens(tok, N, V, 3);
    static float one[N * 64], all[N * 64], last[64];
    muser_error err = {0};
    muser_session *s1 = new_session(&tm.m, 16, 1), *s3 = new_session(&tm.m, 16, 3);
    for (int p = 0; p < N; p++)
        CHECK_OK(muser_session_forward(s1, &tok[p], 1, one + (size_t)p * V, false, &err), &err);
    CHECK_OK(muser_session_forward(s3, tok, 6, all, true, &err), &err);
    CHECK_OK(muser_session_forward(s3, tok + 6, N - 6, all + 6 * V, true, &err), &err);
    CHECK(!memcmp(one, all, sizeof(float) * N * V));
    CHECK(s1->n_past == N && s3->n_past == N);
    /* last-row-only batch gives the last row */
    muser_session_reset(s3);
    CHECK(s3->n_past == 0);
    CHECK_OK(muser_session_forward(s3, tok, N, last, false, &err), &err);
    CHECK(!memcmp(last, one + (size_t)(N - 1) * V, sizeof(float) * V));

    /* context full, with numbers; nothing changes */
    int rc = muser_session_forward(s1, tok, 6, last, false, &err);
    CHECKF(rc == MUSER_E_CONTEXT_FULL && strstr(err.msg, "16"), "rc %d: %s", rc, err.msg);
    CHECK(s1->n_past == N);
    CHECK(muser_session_forward(s1, (int32_t[]){(int32_t)V}, 1, last, false, &err) == MUSER_E_ARG);
    CHECK(muser_session_forward(s1, (int32_t[]){-1}, 1, last, false, &err) == MUSER_E_ARG);
    CHECK(muser_session_forward(s1, tok, 0, last, false, &err) == MUSER_E_ARG);
    muser_session_free(s1);
    muser_session_free(s3);
    free_model(&tm);
}

static void test_fail_closed(void)
{
    test_model tm;
    build_model(&tm, MUSER_ARCH_MUSE, 4, 4, 13);
    const uint32_t V = tm.m.hp.n_vocab;
    int32_t tok[12];
    make_tokens(tok, 12, V, 17);
    static float ref[3 * 64], got[3 * 64], sentinel[64];
    muser_error err = {0};
    muser_session *clean = new_session(&tm.m, 32, 1), *s = new_session(&tm.m, 32, 1);
    CHECK_OK(muser_session_forward(clean, tok, 6, NULL, false, &err), &err);
    CHECK_OK(muser_session_forward(s, tok, 6, NULL, false, &err), &err);

    /* Poison one LM-head weight: every logit row has a NaN. A 3-token batch appends to every
     * ring (wrapping it: W = 4) before the last row's LM head fails. */
    float *out_w = (float *)tm.m.output.data;
    const float saved = out_w[5];
    out_w[5] = NAN;
    for (int i = 0; i < 64; i++)
        sentinel[i] = got[i] = 1234.5f;
    int rc = muser_session_forward(s, tok + 6, 3, got, false, &err);
    CHECKF(rc == MUSER_E_NUMERIC, "rc %d", rc);
    CHECK(s->n_past == 6);
    CHECK(!memcmp(got, sentinel, sizeof(float) * 64)); /* caller's logits untouched */
    out_w[5] = saved;
    /* Carrying on gives exactly what a session that never failed gives. */
    CHECK_OK(muser_session_forward(clean, tok + 6, 3, ref, true, &err), &err);
    CHECK_OK(muser_session_forward(s, tok + 6, 3, got, true, &err), &err);
    CHECK(!memcmp(ref, got, sizeof(float) * 3 * V));

    /* A position the cache does not expect is refused (the session's count is forced out of
     * step with the cache here, as a buggy caller of the backend would) and changes nothing. */
    s->n_past = 11;
    rc = muser_session_forward(s, tok + 9, 1, got, false, &err);
    CHECKF(rc == MUSER_E_CACHE_DISCONTINUITY, "rc %d: %s", rc, err.msg);
    s->n_past = 9;
    CHECK_OK(muser_session_forward(clean, tok + 9, 1, ref, false, &err), &err);
    CHECK_OK(muser_session_forward(s, tok + 9, 1, got, false, &err), &err);
    CHECK(!memcmp(ref, got, sizeof(float) * V));
    muser_session_free(clean);
    muser_session_free(s);
    free_model(&tm);
}

static void test_checkpoint_rollback(void)
{
    test_model tm;
    build_model(&tm, MUSER_ARCH_MUSE, 4, 4, 21);
    const uint32_t V = tm.m.hp.n_vocab;
    int32_t tok[16], draft[5];
    make_tokens(tok, 16, V, 23);
    make_tokens(draft, 5, V, 29);
    static float ref[64], got[64];
    muser_error err = {0};
    muser_session *a = new_session(&tm.m, 32, 1), *b = new_session(&tm.m, 32, 1);
    CHECK_OK(muser_session_forward(a, tok, 7, NULL, false, &err), &err);
    CHECK_OK(muser_session_forward(b, tok, 7, NULL, false, &err), &err);
    /* a: checkpoint, verify a 4-row draft (a whole ring's worth: W = 4) whose first 2 rows are
     * accepted, roll back to 9 */
    draft[0] = tok[7];
    draft[1] = tok[8];
    CHECK_OK(muser_session_checkpoint(a, &err), &err);
    CHECK_OK(muser_session_forward(a, draft, 4, NULL, true, &err), &err);
    CHECK(muser_session_rollback(a, 12, &err) == MUSER_E_ARG); /* past n_past */
    CHECK(muser_session_rollback(a, 6, &err) == MUSER_E_ARG);  /* before the checkpoint */
    CHECK(a->n_past == 11);
    CHECK_OK(muser_session_rollback(a, 9, &err), &err);
    CHECK(a->n_past == 9);
    CHECK_OK(muser_session_forward(b, tok + 7, 2, NULL, false, &err), &err);
    CHECK_OK(muser_session_forward(a, tok + 9, 7, got, false, &err), &err);
    CHECK_OK(muser_session_forward(b, tok + 9, 7, ref, false, &err), &err);
    CHECK(!memcmp(ref, got, sizeof(float) * V));
    /* commit keeps the block */
    CHECK_OK(muser_session_checkpoint(a, &err), &err);
    muser_session_commit(a);
    CHECK(muser_session_rollback(a, 16, &err) == MUSER_E_ARG);
    muser_session_free(a);
    muser_session_free(b);
    free_model(&tm);
}

int main(void)
{
    test_against_naive(MUSER_ARCH_MUSE, 4, 4);
    test_against_naive(MUSER_ARCH_MUSE, 3, 2);
    test_against_naive(MUSER_ARCH_LLAMA, 2, 0);
    test_window();
    test_batch_equals_decode();
    test_fail_closed();
    test_checkpoint_rollback();
    return check_report("reference");
}
