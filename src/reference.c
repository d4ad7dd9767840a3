/* reference.c — the oracle: SPEC §1's forward pass, read literally, in plain C. It is the judge
 * every fast path is compared with (SPEC §4), so it is slow and dumb on purpose:
 *
 *   - every activation is an f64 vector, every dot product, norm and softmax sums in f64;
 *   - weights are dequantized one row at a time (quant_dequantize_row, f32) and each element is
 *     widened to f64 before it is multiplied;
 *   - the only narrowing is the KV cache: k and v are rounded f64 -> f32 -> f16 when stored
 *     (kv_plane_append) and attention reads them back as f16;
 *   - logits are computed in f64 and rounded to f32 once, at the end.
 * docs/numerics.md states this definition and the contract it judges.
 *
 * One token at a time: a batch call (n > 1) loops over its tokens. The only concession to speed
 * is that the rows of each matrix-vector product are split over a small pool of threads (each
 * row's sum is still one sequential f64 loop, so the result does not depend on the thread
 * count). Nothing is allocated per token: buffers, the pool and the undo copy are made at init.
 *
 * Fail closed: NaN or Inf in the logits returns MUSER_E_NUMERIC and puts the KV cache back as it
 * was before the call (rows saved in an undo copy), so the session is unchanged. */
#include "reference.h"
#include "session.h"

#include "quant.h"
#include "util.h"

#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define ORACLE_MAX_THREADS 64

/* ---- a pool of threads for y = W·x (rows split in contiguous ranges) ---- */

typedef struct oracle_pool oracle_pool;

typedef struct oracle_worker {
    oracle_pool *pool;
    uint32_t index;
    float *row;               /* [max_cols] dequantized weight row */
    int rc;                   /* status of this worker's part of the current job */
} oracle_worker;

struct oracle_pool {
    uint32_t n;               /* threads including the caller */
    pthread_t *threads;       /* [n-1] */
    oracle_worker *workers;   /* [n]; workers[0] is the caller */
    pthread_mutex_t mu;
    pthread_cond_t start, done;
    uint64_t generation;      /* bumped for each job */
    uint32_t pending;         /* workers still running the current job */
    bool quit;
    bool sync_ready;
    /* the current job */
    const muser_tensor *w;
    const double *x;
    double *y;
};

/* Rows [r0, r1) of y = W·x: dequantize the row, then one f64 sum in column order. */
static int matvec_rows(const muser_tensor *w, const double *x, double *y, float *row, uint64_t r0,
                       uint64_t r1)
{
    for (uint64_t r = r0; r < r1; r++) {
        int rc = quant_dequantize_row(w->type, muser_tensor_row(w, r), row, w->cols);
        if (rc)
            return rc;
        double acc = 0.0;
        for (uint64_t c = 0; c < w->cols; c++)
            acc += (double)row[c] * x[c];
        y[r] = acc;
    }
    return MUSER_OK;
}

static void pool_run_part(oracle_pool *p, uint32_t i)
{
    const uint64_t rows = p->w->rows;
    const uint64_t r0 = rows * i / p->n, r1 = rows * (i + 1) / p->n;
    p->workers[i].rc = matvec_rows(p->w, p->x, p->y, p->workers[i].row, r0, r1);
}

static void *pool_thread(void *arg)
{
    oracle_worker *wk = arg;
    oracle_pool *p = wk->pool;
    uint64_t seen = 0;
    pthread_mutex_lock(&p->mu);
    for (;;) {
        while (!p->quit && p->generation == seen)
            pthread_cond_wait(&p->start, &p->mu);
        if (p->quit)
            break;
        seen = p->generation;
        pthread_mutex_unlock(&p->mu);
        pool_run_part(p, wk->index);
        pthread_mutex_lock(&p->mu);
        if (--p->pending == 0)
            pthread_cond_signal(&p->done);
    }
    pthread_mutex_unlock(&p->mu);
    return NULL;
}

static void pool_free(oracle_pool *p)
{
    if (p->threads) {
        pthread_mutex_lock(&p->mu);
        p->quit = true;
        pthread_cond_broadcast(&p->start);
        pthread_mutex_unlock(&p->mu);
        for (uint32_t i = 1; i < p->n; i++)
            if (p->threads[i - 1])
                pthread_join(p->threads[i - 1], NULL);
        free(p->threads);
    }
    if (p->sync_ready) {
        pthread_mutex_destroy(&p->mu);
        pthread_cond_destroy(&p->start);
        pthread_cond_destroy(&p->done);
    }
    if (p->workers)
        for (uint32_t i = 0; i < p->n; i++)
            free(p->workers[i].row);
    free(p->workers);
    memset(p, 0, sizeof *p);
}

static int pool_init(oracle_pool *p, uint32_t n_threads, uint64_t max_cols, muser_error *err)
{
    memset(p, 0, sizeof *p);
    p->n = n_threads;
    p->workers = calloc(n_threads, sizeof *p->workers);
    if (!p->workers)
        return muser_errorf(err, MUSER_E_NOMEM, "oracle: out of memory for %u workers", n_threads);
    for (uint32_t i = 0; i < n_threads; i++) {
        p->workers[i].pool = p;
        p->workers[i].index = i;
        p->workers[i].row = malloc(max_cols * sizeof(float));
        if (!p->workers[i].row) {
            pool_free(p);
            return muser_errorf(err, MUSER_E_NOMEM, "oracle: out of memory for row buffers");
        }
    }
    if (n_threads == 1)
        return MUSER_OK;
    if (pthread_mutex_init(&p->mu, NULL) || pthread_cond_init(&p->start, NULL) ||
        pthread_cond_init(&p->done, NULL)) {
        pool_free(p);
        return muser_errorf(err, MUSER_E_BACKEND, "oracle: cannot create thread sync objects");
    }
    p->sync_ready = true;
    p->threads = calloc(n_threads - 1, sizeof *p->threads);
    if (!p->threads) {
        pool_free(p);
        return muser_errorf(err, MUSER_E_NOMEM, "oracle: out of memory for threads");
    }
    for (uint32_t i = 1; i < n_threads; i++)
        if (pthread_create(&p->threads[i - 1], NULL, pool_thread, &p->workers[i])) {
            p->threads[i - 1] = 0;
            pool_free(p);
            return muser_errorf(err, MUSER_E_BACKEND, "oracle: cannot start thread %u", i);
        }
    return MUSER_OK;
}

/* y[W.rows] = W·x[W.cols], f64. */
static int matvec(oracle_pool *p, const muser_tensor *w, const double *x, double *y,
                  muser_error *err)
{
    int rc;
    if (p->n == 1 || w->rows < 2 * p->n) {
        rc = matvec_rows(w, x, y, p->workers[0].row, 0, w->rows);
    } else {
        pthread_mutex_lock(&p->mu);
        p->w = w;
        p->x = x;
        p->y = y;
        p->pending = p->n - 1;
        p->generation++;
        pthread_cond_broadcast(&p->start);
        pthread_mutex_unlock(&p->mu);
        pool_run_part(p, 0);
        pthread_mutex_lock(&p->mu);
        while (p->pending > 0)
            pthread_cond_wait(&p->done, &p->mu);
        pthread_mutex_unlock(&p->mu);
        rc = MUSER_OK;
        for (uint32_t i = 0; i < p->n && !rc; i++)
            rc = p->workers[i].rc;
    }
    if (rc)
        return muser_errorf(err, rc, "oracle: cannot dequantize %s (type %u, %llu columns)",
                            w->name ? w->name : "tensor", w->type, (unsigned long long)w->cols);
    return MUSER_OK;
}

/* ---- the oracle's session state ---- */

typedef struct oracle_state {
    muser_kv kv;              /* f16 K/V with CPU storage */
    oracle_pool pool;
    /* activations, f64 */
    double *h;                /* [E] residual stream */
    double *a;                /* [E] normed input of a sub-layer */
    double *q, *g, *o;        /* [H*D] query, gate, attention output */
    double *k, *v;            /* [HKV*D] */
    float *k32, *v32;         /* [HKV*D] k, v rounded to f32 for kv_plane_append */
    double *scores;           /* [n_ctx] one head's attention weights */
    double *proj;             /* [E] Wo·o or Wdown·m */
    double *ffn_gate, *ffn_up;/* [F] */
    double *logits;           /* [V] */
    float *row;               /* [max cols] for the embedding row */
    kv_undo undo;             /* the cache before the current call, for fail-closed errors */
} oracle_state;

static void oracle_free(muser_session *s)
{
    oracle_state *st = s->be_state;
    if (!st)
        return;
    kv_undo_free(&st->undo);
    kv_free(&st->kv);
    pool_free(&st->pool);
    free(st->h);
    free(st->a);
    free(st->q);
    free(st->g);
    free(st->o);
    free(st->k);
    free(st->v);
    free(st->k32);
    free(st->v32);
    free(st->scores);
    free(st->proj);
    free(st->ffn_gate);
    free(st->ffn_up);
    free(st->logits);
    free(st->row);
    free(st);
    s->be_state = NULL;
}

/* Norm weights are read as f32 directly (model.c already requires F32; checked again here). */
static int check_norm(const muser_tensor *t, uint64_t n, muser_error *err)
{
    if (!t->data || t->type != GGML_TYPE_F32 || t->cols != n)
        return muser_errorf(err, MUSER_E_UNSUPPORTED,
                            "oracle: norm %s must be f32 [%llu] (type %u, %llu columns)",
                            t->name ? t->name : "(missing)", (unsigned long long)n, t->type,
                            (unsigned long long)t->cols);
    return MUSER_OK;
}

static int oracle_check_model(const muser_model *m, muser_error *err)
{
    const muser_hparams *hp = &m->hp;
    int rc = check_norm(&m->output_norm, hp->n_embd, err);
    for (uint32_t l = 0; l < hp->n_layer && !rc; l++) {
        const muser_layer *L = &m->layers[l];
        if ((rc = check_norm(&L->attn_norm, hp->n_embd, err)) ||
            (rc = check_norm(&L->ffn_norm, hp->n_embd, err)))
            break;
        if (hp->qk_norm && ((rc = check_norm(&L->attn_q_norm, hp->head_dim, err)) ||
                            (rc = check_norm(&L->attn_k_norm, hp->head_dim, err))))
            break;
        if (hp->sandwich && ((rc = check_norm(&L->post_attention_norm, hp->n_embd, err)) ||
                             (rc = check_norm(&L->post_ffw_norm, hp->n_embd, err))))
            break;
    }
    return rc;
}

static int oracle_init(muser_session *s, muser_error *err)
{
    const muser_model *m = s->model;
    const muser_hparams *hp = &m->hp;
    int rc = oracle_check_model(m, err);
    if (rc)
        return rc;
    oracle_state *st = calloc(1, sizeof *st);
    if (!st)
        return muser_errorf(err, MUSER_E_NOMEM, "oracle: out of memory");
    s->be_state = st;

    const uint64_t E = hp->n_embd, F = hp->n_ff, QD = (uint64_t)hp->n_head * hp->head_dim;
    const uint64_t KVD = (uint64_t)hp->n_head_kv * hp->head_dim, V = hp->n_vocab;
    uint64_t max_cols = E > F ? E : F;
    if (QD > max_cols)
        max_cols = QD;

    if ((rc = kv_init(&st->kv, hp, s->opts.n_ctx, true, err)))
        goto fail;
    uint32_t n_threads = s->opts.n_threads;
    if (n_threads == 0) {
        long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
        n_threads = ncpu > 0 ? (uint32_t)ncpu : 1;
    }
    if (n_threads > ORACLE_MAX_THREADS)
        n_threads = ORACLE_MAX_THREADS;
    if ((rc = pool_init(&st->pool, n_threads, max_cols, err)))
        goto fail;

    st->h = malloc(E * sizeof(double));
    st->a = malloc(E * sizeof(double));
    st->q = malloc(QD * sizeof(double));
    st->g = malloc(QD * sizeof(double));
    st->o = malloc(QD * sizeof(double));
    st->k = malloc(KVD * sizeof(double));
    st->v = malloc(KVD * sizeof(double));
    st->k32 = malloc(KVD * sizeof(float));
    st->v32 = malloc(KVD * sizeof(float));
    st->scores = malloc(s->opts.n_ctx * sizeof(double));
    st->proj = malloc(E * sizeof(double));
    st->ffn_gate = malloc(F * sizeof(double));
    st->ffn_up = malloc(F * sizeof(double));
    st->logits = malloc(V * sizeof(double));
    st->row = malloc(E * sizeof(float));
    if (!st->h || !st->a || !st->q || !st->g || !st->o || !st->k || !st->v || !st->k32 ||
        !st->v32 || !st->scores || !st->proj || !st->ffn_gate || !st->ffn_up || !st->logits ||
        !st->row) {
        rc = muser_errorf(err, MUSER_E_NOMEM, "oracle: out of memory for activations");
        goto fail;
    }
    if ((rc = kv_undo_init(&st->undo, &st->kv, err)) != 0)
        goto fail;
    return MUSER_OK;
fail:
    oracle_free(s);
    return rc;
}

/* ---- the operations of SPEC §1, f64 ---- */

/* y = x / sqrt(mean(x²) + eps) ⊙ w  (w == NULL: weightless). y may alias x. */
void oracle_rmsnorm(double *y, const double *x, const float *w, uint64_t n, double eps)
{
    double ss = 0.0;
    for (uint64_t i = 0; i < n; i++)
        ss += x[i] * x[i];
    const double inv = 1.0 / sqrt(ss / (double)n + eps);
    for (uint64_t i = 0; i < n; i++)
        y[i] = x[i] * inv * (w ? (double)w[i] : 1.0);
}

static const float *norm_weight(const muser_tensor *t)
{
    return (const float *)t->data;
}

/* RoPE of one head at position pos. NORM mode (muse, llama): pairs (x[2i], x[2i+1]); NEOX mode
 * (qwen3, as its public GGUF files expect): pairs (x[i], x[i + D/2]). Angle pos·theta^(-2i/D). */
void oracle_rope_head(double *x, uint32_t D, uint64_t pos, double theta, bool neox)
{
    for (uint32_t i = 0; i < D / 2; i++) {
        const double angle = (double)pos * pow(theta, -2.0 * (double)i / (double)D);
        const double c = cos(angle), s = sin(angle);
        const uint32_t i0 = neox ? i : 2 * i, i1 = neox ? i + D / 2 : 2 * i + 1;
        const double x0 = x[i0], x1 = x[i1];
        x[i0] = x0 * c - x1 * s;
        x[i1] = x0 * s + x1 * c;
    }
}

/* Attention of every query head at pos over the stored f16 keys/values of layer l's plane.
 * Allowed positions: SWA pos-W < j <= pos, FULL 0 <= j <= pos. Writes st->o [H*D]. */
static void attention(oracle_state *st, const muser_hparams *hp, uint32_t l, uint64_t pos)
{
    const kv_plane *pl = &st->kv.planes[l];
    const uint32_t D = hp->head_dim, group = hp->n_head / hp->n_head_kv;
    const double scale = 1.0 / sqrt((double)D);
    uint64_t first = 0;
    if (muser_layer_is_swa(hp, l) && pos + 1 > hp->swa_window)
        first = pos + 1 - hp->swa_window;
    for (uint32_t hq = 0; hq < hp->n_head; hq++) {
        const uint32_t hk = hq / group;
        const double *q = st->q + (uint64_t)hq * D;
        double max = -INFINITY;
        for (uint64_t j = first; j <= pos; j++) {
            const uint16_t *kj = kv_plane_k(pl, hk, j);
            double dot = 0.0;
            for (uint32_t d = 0; d < D; d++)
                dot += q[d] * (double)muser_f16_to_f32(kj[d]);
            st->scores[j - first] = dot * scale;
            if (st->scores[j - first] > max)
                max = st->scores[j - first];
        }
        double sum = 0.0;
        for (uint64_t j = first; j <= pos; j++) {
            st->scores[j - first] = exp(st->scores[j - first] - max);
            sum += st->scores[j - first];
        }
        double *o = st->o + (uint64_t)hq * D;
        for (uint32_t d = 0; d < D; d++)
            o[d] = 0.0;
        for (uint64_t j = first; j <= pos; j++) {
            const double p = st->scores[j - first] / sum;
            const uint16_t *vj = kv_plane_v(pl, hk, j);
            for (uint32_t d = 0; d < D; d++)
                o[d] += p * (double)muser_f16_to_f32(vj[d]);
        }
    }
}

static double sigmoid(double x) { return 1.0 / (1.0 + exp(-x)); }

/* One token at position pos through every layer; leaves z = final-normed h in st->a. tap_out
 * (NULL: no tap): [tap->n_layers][E], the residual after each tapped layer, rounded to f32. */
static int forward_token(muser_session *s, oracle_state *st, int32_t token, uint64_t pos,
                         const muser_tap *tap, float *tap_out, muser_error *err)
{
    const muser_model *m = s->model;
    const muser_hparams *hp = &m->hp;
    const uint64_t E = hp->n_embd, F = hp->n_ff;
    const uint32_t D = hp->head_dim;
    const double eps = hp->rms_eps, post_eps = hp->post_norm_eps;
    oracle_pool *pool = &st->pool;
    int rc;

    /* h = embed[token] (entry norm, weightless, for muse) */
    if ((rc = quant_dequantize_row(m->tok_embd.type, muser_tensor_row(&m->tok_embd, token),
                                   st->row, E)))
        return muser_errorf(err, rc, "oracle: cannot dequantize token_embd row %d", token);
    for (uint64_t i = 0; i < E; i++)
        st->h[i] = st->row[i];
    if (hp->entry_norm)
        oracle_rmsnorm(st->h, st->h, NULL, E, eps);

    for (uint32_t l = 0; l < hp->n_layer; l++) {
        const muser_layer *L = &m->layers[l];
        /* attention block */
        oracle_rmsnorm(st->a, st->h, norm_weight(&L->attn_norm), E, eps);
        if ((rc = matvec(pool, &L->attn_q, st->a, st->q, err)) ||
            (rc = matvec(pool, &L->attn_k, st->a, st->k, err)) ||
            (rc = matvec(pool, &L->attn_v, st->a, st->v, err)))
            return rc;
        if (hp->attn_gate && (rc = matvec(pool, &L->attn_gate, st->a, st->g, err)))
            return rc;
        if (hp->qk_norm) {
            for (uint32_t h = 0; h < hp->n_head; h++)
                oracle_rmsnorm(st->q + (uint64_t)h * D, st->q + (uint64_t)h * D,
                        norm_weight(&L->attn_q_norm), D, eps);
            for (uint32_t h = 0; h < hp->n_head_kv; h++)
                oracle_rmsnorm(st->k + (uint64_t)h * D, st->k + (uint64_t)h * D,
                        norm_weight(&L->attn_k_norm), D, eps);
        }
        if (muser_layer_has_rope(hp, l)) {
            const bool neox = hp->arch == MUSER_ARCH_QWEN3;
            for (uint32_t h = 0; h < hp->n_head; h++)
                oracle_rope_head(st->q + (uint64_t)h * D, D, pos, hp->rope_theta, neox);
            for (uint32_t h = 0; h < hp->n_head_kv; h++)
                oracle_rope_head(st->k + (uint64_t)h * D, D, pos, hp->rope_theta, neox);
        }
        const uint64_t KVD = (uint64_t)hp->n_head_kv * D;
        for (uint64_t i = 0; i < KVD; i++) {
            st->k32[i] = (float)st->k[i];
            st->v32[i] = (float)st->v[i];
        }
        if ((rc = kv_plane_append(&st->kv.planes[l], pos, st->k32, st->v32, err)))
            return rc;
        attention(st, hp, l, pos);
        if (hp->attn_gate)
            for (uint64_t i = 0; i < (uint64_t)hp->n_head * D; i++)
                st->o[i] *= sigmoid(st->g[i]);
        if ((rc = matvec(pool, &L->attn_output, st->o, st->proj, err)))
            return rc;
        if (hp->sandwich)
            oracle_rmsnorm(st->proj, st->proj, norm_weight(&L->post_attention_norm), E, post_eps);
        for (uint64_t i = 0; i < E; i++)
            st->h[i] += st->proj[i];

        /* FFN block: silu(gate) ⊙ up, down */
        oracle_rmsnorm(st->a, st->h, norm_weight(&L->ffn_norm), E, eps);
        if ((rc = matvec(pool, &L->ffn_gate, st->a, st->ffn_gate, err)) ||
            (rc = matvec(pool, &L->ffn_up, st->a, st->ffn_up, err)))
            return rc;
        for (uint64_t i = 0; i < F; i++)
            st->ffn_gate[i] = st->ffn_gate[i] * sigmoid(st->ffn_gate[i]) * st->ffn_up[i];
        if ((rc = matvec(pool, &L->ffn_down, st->ffn_gate, st->proj, err)))
            return rc;
        if (hp->sandwich)
            oracle_rmsnorm(st->proj, st->proj, norm_weight(&L->post_ffw_norm), E, post_eps);
        for (uint64_t i = 0; i < E; i++)
            st->h[i] += st->proj[i];
        for (uint32_t k = 0; tap && k < tap->n_layers; k++)
            if (tap->layers[k] == l)
                for (uint64_t i = 0; i < E; i++)
                    tap_out[(uint64_t)k * E + i] = (float)st->h[i];
    }
    oracle_rmsnorm(st->a, st->h, norm_weight(&m->output_norm), E, eps);
    return MUSER_OK;
}

/* logits = cap·tanh(z·scale/cap) (no cap when final_softcap == 0), f64, rounded to f32 once.
 * NaN/Inf -> MUSER_E_NUMERIC naming the first bad index; `out` is written only when every
 * logit is finite. */
static int lm_head(muser_session *s, oracle_state *st, uint64_t pos, float *out, muser_error *err)
{
    const muser_model *m = s->model;
    const muser_hparams *hp = &m->hp;
    int rc = matvec(&st->pool, &m->output, st->a, st->logits, err);
    if (rc)
        return rc;
    const double scale = hp->logit_scale, cap = hp->final_softcap;
    for (uint64_t i = 0; i < hp->n_vocab; i++) {
        double z = st->logits[i] * scale;
        if (cap > 0.0)
            z = cap * tanh(z / cap);
        if (!isfinite((float)z))
            return muser_errorf(err, MUSER_E_NUMERIC,
                                "oracle: logit %llu at position %llu is %g (fail closed)",
                                (unsigned long long)i, (unsigned long long)pos, z);
        st->logits[i] = z;
    }
    if (out)
        for (uint64_t i = 0; i < hp->n_vocab; i++)
            out[i] = (float)st->logits[i];
    return MUSER_OK;
}

/* tokens[0..n) at positions s->n_past.. (the caller saved the undo copy) */
static int oracle_run(muser_session *s, const int32_t *tokens, uint32_t n, float *logits,
                      bool all_logits, const muser_tap *tap, muser_error *err)
{
    oracle_state *st = s->be_state;
    const muser_hparams *hp = &s->model->hp;
    int rc = MUSER_OK;
    for (uint32_t t = 0; t < n && !rc; t++) {
        const uint64_t pos = s->n_past + t;
        rc = forward_token(s, st, tokens[t], pos, tap,
                           tap ? tap->out + (uint64_t)t * tap->n_layers * hp->n_embd : NULL, err);
        if (!rc && (all_logits || t == n - 1))
            rc = lm_head(s, st, pos, logits ? logits + (all_logits ? (uint64_t)t * hp->n_vocab
                                                                    : 0)
                                            : NULL,
                         err);
    }
    return rc;
}

/* The prefill route with the hidden-state tap (tap NULL: none), as the CPU's: tap->out[i][k] the
 * residual of row i after layer tap->layers[k]. */
static int oracle_forward_tap(muser_session *s, const int32_t *tokens, uint32_t n, float *logits,
                              bool all_logits, const muser_tap *tap, muser_error *err)
{
    oracle_state *st = s->be_state;
    const muser_hparams *hp = &s->model->hp;
    for (uint32_t t = 0; t < n; t++)
        if (tokens[t] < 0 || (uint32_t)tokens[t] >= hp->n_vocab)
            return muser_errorf(err, MUSER_E_ARG, "oracle: token %d at index %u not in [0, %u)",
                                tokens[t], t, hp->n_vocab);
    if (s->n_past + n > s->opts.n_ctx)
        return muser_errorf(err, MUSER_E_CONTEXT_FULL,
                            "oracle: %u tokens at position %llu exceed the context of %llu", n,
                            (unsigned long long)s->n_past, (unsigned long long)s->opts.n_ctx);
    kv_undo_save(&st->undo, &st->kv, n);
    int rc = oracle_run(s, tokens, n, logits, all_logits, tap, err);
    if (rc)
        kv_undo_restore(&st->undo, &st->kv);
    return rc;
}

static int oracle_forward(muser_session *s, const int32_t *tokens, uint32_t n, float *logits,
                          bool all_logits, muser_error *err)
{
    return oracle_forward_tap(s, tokens, n, logits, all_logits, NULL, err);
}

/* The oracle has no pass: a step is each session's run of rows, one token at a time (the
 * definition every fast route's rows are judged by). */
static int oracle_runs(muser_device *d, const muser_step_rows *rows, float *logits, muser_error *err)
{
    const uint64_t V = d->model->hp.n_vocab;
    for (uint32_t i = 0; i < rows->n; i++)
        if (i == 0 || rows->seq[i] != rows->seq[i - 1]) {
            oracle_state *st = rows->seq[i]->be_state;
            uint32_t k = i;
            while (k < rows->n && rows->seq[k] == rows->seq[i])
                k++;
            kv_undo_save(&st->undo, &st->kv, k - i);
        }
    int rc = MUSER_OK;
    uint32_t done = 0; /* rows whose runs ran */
    for (uint32_t i = 0; i < rows->n && !rc;) {
        uint32_t k = i;
        while (k < rows->n && rows->seq[k] == rows->seq[i])
            k++;
        muser_tap run_tap; /* the tap's rows of this run */
        if (rows->tap) {
            run_tap = *rows->tap;
            run_tap.out = rows->tap->out + (uint64_t)i * rows->tap->n_layers * d->model->hp.n_embd;
        }
        rc = oracle_run(rows->seq[i], rows->tokens + i, k - i, logits ? logits + i * V : NULL, true,
                        rows->tap ? &run_tap : NULL, err);
        done = k;
        i = k;
    }
    if (rc)
        for (uint32_t i = 0; i < done; i++)
            if (i == 0 || rows->seq[i] != rows->seq[i - 1]) {
                oracle_state *st = rows->seq[i]->be_state;
                kv_undo_restore(&st->undo, &st->kv);
            }
    return rc;
}

/* The best logits from the logits, and per-row buffers from them (its own buffer when the caller
 * gave none). */
static int oracle_step(muser_device *d, const muser_step_rows *rows, float *logits, muser_error *err)
{
    if (!rows->top && !rows->out) return oracle_runs(d, rows, logits, err);
    const uint32_t V = d->model->hp.n_vocab;
    float *lg = logits ? logits : malloc((size_t)rows->n * V * sizeof *lg);
    if (!lg) return muser_errorf(err, MUSER_E_NOMEM, "oracle: out of memory for %u rows of logits", rows->n);
    const int rc = oracle_runs(d, rows, lg, err);
    if (!rc && rows->top) muser_top_rows(rows->top, lg, rows->n, V);
    for (uint32_t i = 0; !rc && rows->out && i < rows->n; i++)
        if (rows->out[i]) memcpy(rows->out[i], lg + (size_t)i * V, (size_t)V * sizeof *lg);
    if (lg != logits) free(lg);
    return rc;
}

static int oracle_dev_init(muser_device *d, muser_error *err)
{
    (void)err;
    d->be_state = NULL; /* every session keeps its own pool and activations */
    d->max_rows = MUSER_STEP_MAX_ROWS;
    for (uint32_t n = 0; n <= KV_MAX_SPEC_ROWS; n++) /* one row at a time: a block costs its rows */
        d->pass_cost[n] = n;
    return MUSER_OK;
}

static void oracle_dev_free(muser_device *d)
{
    (void)d;
}

static int oracle_checkpoint(muser_session *s, muser_error *err)
{
    oracle_state *st = s->be_state;
    return kv_checkpoint(&st->kv, err);
}

static int oracle_rollback(muser_session *s, uint64_t n_keep, muser_error *err)
{
    oracle_state *st = s->be_state;
    return kv_rollback(&st->kv, n_keep, err);
}

static void oracle_commit(muser_session *s)
{
    oracle_state *st = s->be_state;
    kv_commit(&st->kv);
}

static void oracle_reset(muser_session *s)
{
    oracle_state *st = s->be_state;
    kv_reset(&st->kv);
}

static int oracle_kv_export(const muser_session *s, uint32_t l, kv_plane *meta, uint16_t *k, uint16_t *v,
                            muser_error *err)
{
    (void)err;
    const kv_plane *pl = &((const oracle_state *)s->be_state)->kv.planes[l];
    *meta = *pl;
    const uint64_t n = pl->capacity * pl->n_head_kv * pl->head_dim;
    memcpy(k, pl->k, n * sizeof(uint16_t));
    memcpy(v, pl->v, n * sizeof(uint16_t));
    return MUSER_OK;
}

static int oracle_kv_copy(muser_session *dst, const muser_session *src, muser_error *err)
{
    (void)err;
    kv_copy(&((oracle_state *)dst->be_state)->kv, &((const oracle_state *)src->be_state)->kv);
    return MUSER_OK;
}

static int oracle_kv_rows(const muser_session *s, uint32_t l, uint64_t pos0, uint32_t n, uint16_t *k,
                        uint16_t *v, muser_error *err)
{
    (void)err;
    kv_plane_read_rows(&((const oracle_state *)s->be_state)->kv.planes[l], pos0, n, k, v);
    return MUSER_OK;
}

static int oracle_kv_import(muser_session *s, uint32_t l, const kv_plane *meta, uint64_t pos0, uint32_t n,
                          const uint16_t *k, const uint16_t *v, muser_error *err)
{
    (void)err;
    muser_kv *kv = &((oracle_state *)s->be_state)->kv;
    kv_plane_import(&kv->planes[l], meta, pos0, n, k, v);
    kv->has_checkpoint = false;
    return MUSER_OK;
}

static const muser_backend oracle_backend = {
    .name = "oracle",
    .dev_init = oracle_dev_init,
    .dev_free = oracle_dev_free,
    .init = oracle_init,
    .free = oracle_free,
    .forward = oracle_forward,
    .forward_tap = oracle_forward_tap,
    .step = oracle_step,
    .checkpoint = oracle_checkpoint,
    .rollback = oracle_rollback,
    .commit = oracle_commit,
    .reset = oracle_reset,
    .kv_export = oracle_kv_export,
    .kv_copy = oracle_kv_copy,
    .kv_rows = oracle_kv_rows,
    .kv_import = oracle_kv_import,
};

const muser_backend *muser_backend_oracle(void)
{
    return &oracle_backend;
}
