/* session.c — devices (backend instances) and the sessions on them: picks the backend, resolves
 * options, checks every call's arguments once (so backends can trust them) and keeps n_past.
 *
 * The session owns only n_past; the KV cache lives in the backend's session state
 * (s->be_state), weights, threads and activations in its device state (d->be_state). Every
 * check happens before the backend runs, and n_past moves only when the backend succeeded, so a
 * refused or failed call leaves every session as it was. */
#include "session.h"
#include "sampler.h"
#include "tp.h"

#include <math.h>
#include <openssl/evp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define SESSION_MAX_THREADS 512
#define SESSION_DEFAULT_MAX_BATCH 512u

#ifndef MUSER_HAVE_CUDA
/* Built without CUDA: the backend does not exist (src/cuda/ defines it when it does). */
const muser_backend *muser_backend_cuda(void)
{
    return NULL;
}
#endif

const char *muser_backend_name(muser_backend_kind k)
{
    switch (k) {
    case MUSER_BACKEND_CPU: return "cpu";
    case MUSER_BACKEND_ORACLE: return "oracle";
    case MUSER_BACKEND_CUDA: return "cuda";
    }
    return "unknown";
}

int muser_backend_from_name(const char *name)
{
    if (!name)
        return -1;
    if (!strcmp(name, "cpu"))
        return MUSER_BACKEND_CPU;
    if (!strcmp(name, "oracle"))
        return MUSER_BACKEND_ORACLE;
    if (!strcmp(name, "cuda"))
        return MUSER_BACKEND_CUDA;
    return -1;
}

static const muser_backend *backend_for(muser_backend_kind k)
{
    switch (k) {
    case MUSER_BACKEND_CPU: return muser_backend_cpu();
    case MUSER_BACKEND_ORACLE: return muser_backend_oracle();
    case MUSER_BACKEND_CUDA: return muser_backend_cuda();
    }
    return NULL;
}

int muser_device_new(muser_device **out, const muser_model *m, const muser_session_opts *o,
                     muser_error *err)
{
    if (!out || !m)
        return muser_errorf(err, MUSER_E_ARG, "muser_device_new: NULL argument");
    *out = NULL;
    muser_session_opts opts;
    if (o)
        opts = *o;
    else
        memset(&opts, 0, sizeof opts); /* cpu backend, model context, all cores */
    if ((int)opts.backend < 0 || opts.backend > MUSER_BACKEND_CUDA)
        return muser_errorf(err, MUSER_E_ARG, "session: unknown backend %d", (int)opts.backend);
    const muser_backend *be = backend_for(opts.backend);
    if (be && opts.tp_ranks > 1) { /* a split device over ranks of that backend (tp.h) */
        if (opts.backend == MUSER_BACKEND_ORACLE)
            return muser_errorf(err, MUSER_E_UNSUPPORTED, "tensor parallel: ranks run on cpu or cuda, not oracle");
        if (opts.tp)
            return muser_errorf(err, MUSER_E_ARG, "tensor parallel: a rank is not split again");
        be = muser_backend_split();
    }
    if (!be) {
        if (opts.backend == MUSER_BACKEND_CUDA)
            return muser_errorf(err, MUSER_E_BACKEND,
                                "muser was built without CUDA (backend 'cuda' is unavailable)");
        return muser_errorf(err, MUSER_E_BACKEND, "backend '%s' is not available in this build",
                            muser_backend_name(opts.backend));
    }
    if (opts.tp && opts.backend == MUSER_BACKEND_ORACLE) /* the CPU and CUDA backends reduce (tp.h) */
        return muser_errorf(err, MUSER_E_UNSUPPORTED, "session: tensor-parallel ranks run on cpu or cuda, not %s",
                            muser_backend_name(opts.backend));
    if (opts.n_ctx == 0)
        opts.n_ctx = m->hp.n_ctx_train;
    if (opts.max_batch == 0)
        opts.max_batch = SESSION_DEFAULT_MAX_BATCH;
    if (opts.n_threads > SESSION_MAX_THREADS) /* each thread gets per-thread scratch */
        return muser_errorf(err, MUSER_E_ARG, "session: %u threads requested, at most %u",
                            opts.n_threads, SESSION_MAX_THREADS);
    muser_device *d = calloc(1, sizeof *d);
    if (!d)
        return muser_errorf(err, MUSER_E_NOMEM, "device: out of memory");
    d->model = m;
    d->opts = opts;
    d->be = be;
    d->max_rows = MUSER_STEP_MAX_ROWS;
    for (uint32_t n = 0; n <= KV_MAX_SPEC_ROWS; n++)
        d->pass_cost[n] = n ? 1.0 + 0.5 * (n - 1) : 0.0;
    int rc = be->dev_init(d, err);
    if (rc) {
        free(d);
        return rc;
    }
    if (d->max_rows > MUSER_STEP_MAX_ROWS)
        d->max_rows = MUSER_STEP_MAX_ROWS;
    *out = d;
    return MUSER_OK;
}

void muser_device_free(muser_device *d)
{
    if (!d)
        return;
    if (d->be && d->be->dev_free)
        d->be->dev_free(d);
    free(d);
}

int muser_session_open(muser_session **out, muser_device *d, uint64_t n_ctx, muser_error *err)
{
    if (!out || !d)
        return muser_errorf(err, MUSER_E_ARG, "muser_session_open: NULL argument");
    *out = NULL;
    if (n_ctx == 0)
        n_ctx = d->opts.n_ctx;
    if (n_ctx > d->opts.n_ctx)
        return muser_errorf(err, MUSER_E_ARG,
                            "session: a context of %llu exceeds the device's %llu (its workspace "
                            "is sized for that)",
                            (unsigned long long)n_ctx, (unsigned long long)d->opts.n_ctx);
    muser_session *s = calloc(1, sizeof *s);
    if (!s)
        return muser_errorf(err, MUSER_E_NOMEM, "session: out of memory");
    s->model = d->model;
    s->opts = d->opts;
    s->opts.n_ctx = n_ctx;
    s->be = d->be;
    s->dev = d;
    s->n_past = 0;
    int rc = d->be->init(s, err);
    if (rc) {
        free(s);
        return rc;
    }
    d->n_sessions++;
    *out = s;
    return MUSER_OK;
}

int muser_session_new(muser_session **out, const muser_model *m, const muser_session_opts *o,
                      muser_error *err)
{
    if (!out || !m)
        return muser_errorf(err, MUSER_E_ARG, "muser_session_new: NULL argument");
    *out = NULL;
    muser_device *d = NULL;
    int rc = muser_device_new(&d, m, o, err);
    if (rc)
        return rc;
    rc = muser_session_open(out, d, 0, err);
    if (rc) {
        muser_device_free(d);
        return rc;
    }
    (*out)->owns_dev = true;
    return MUSER_OK;
}

void muser_session_free(muser_session *s)
{
    if (!s)
        return;
    if (s->in_part)
        muser_prefill_abort(s->dev);
    if (s->be && s->be->free)
        s->be->free(s);
    muser_device *d = s->dev;
    const bool owns = s->owns_dev;
    free(s);
    if (d) {
        d->n_sessions--;
        if (owns)
            muser_device_free(d);
    }
}

static int check_tokens(const muser_model *m, const int32_t *tokens, uint32_t n, muser_error *err)
{
    const uint32_t V = m->hp.n_vocab;
    for (uint32_t i = 0; i < n; i++)
        if (tokens[i] < 0 || (uint32_t)tokens[i] >= V)
            return muser_errorf(err, MUSER_E_ARG, "token %d at index %u is not in [0, %u)",
                                tokens[i], i, V);
    return MUSER_OK;
}

static int prefill(muser_session *s, const int32_t *tokens, uint32_t n, float *logits, bool all_logits,
                   const muser_tap *tap, muser_error *err);

int muser_session_forward(muser_session *s, const int32_t *tokens, uint32_t n, float *logits,
                          bool all_logits, muser_error *err)
{
    if (!s || (!tokens && n))
        return muser_errorf(err, MUSER_E_ARG, "muser_session_forward: NULL argument");
    if (n == 0)
        return muser_errorf(err, MUSER_E_ARG, "muser_session_forward: no tokens");
    if (n == 1) /* the small-batch route with one row: decode */
        return muser_step(s->dev, &s, tokens, 1, logits, NULL, NULL, err);
    return prefill(s, tokens, n, logits, all_logits, NULL, err);
}

int muser_session_prefill(muser_session *s, const int32_t *tokens, uint32_t n, float *logits,
                          muser_error *err)
{
    return muser_session_prefill_tap(s, tokens, n, logits, NULL, err);
}

int muser_session_prefill_tap(muser_session *s, const int32_t *tokens, uint32_t n, float *logits,
                              const muser_tap *tap, muser_error *err)
{
    if (!s || !tokens)
        return muser_errorf(err, MUSER_E_ARG, "muser_session_prefill: NULL argument");
    if (n == 0)
        return muser_errorf(err, MUSER_E_ARG, "muser_session_prefill: no tokens");
    return prefill(s, tokens, n, logits, false, tap, err);
}

int muser_tap_check(const muser_model *m, const muser_tap *tap, muser_error *err)
{
    if (!tap->out || !tap->layers || tap->n_layers == 0 || tap->n_layers > MUSER_TAP_MAX_LAYERS)
        return muser_errorf(err, MUSER_E_ARG, "tap: %u layers (1..%u) and an output buffer are needed", tap->n_layers,
                            MUSER_TAP_MAX_LAYERS);
    for (uint32_t k = 0; k < tap->n_layers; k++)
        if (tap->layers[k] >= m->hp.n_layer || (k > 0 && tap->layers[k] <= tap->layers[k - 1]))
            return muser_errorf(err, MUSER_E_ARG, "tap layer %u (entry %u): layers must ascend below %u",
                                tap->layers[k], k, m->hp.n_layer);
    return MUSER_OK;
}

/* the prefill route (the backend's forward, or forward_tap with a tap) for any n: checked here,
 * n_past advanced on success */
/* A chunk open in parts holds the device's prefill route and its own sessions (what = the call). */
static int part_busy(const muser_session *s, bool prefill_route, const char *what, muser_error *err)
{
    if (s->dev && s->dev->part.n && (s->in_part || prefill_route))
        return muser_errorf(err, MUSER_E_ARG, "%s: a prefill chunk is open in parts on %s; finish or abort it first",
                            what, s->in_part ? "this session" : "other sessions of the device");
    return MUSER_OK;
}

static int prefill(muser_session *s, const int32_t *tokens, uint32_t n, float *logits, bool all_logits,
                   const muser_tap *tap, muser_error *err)
{
    int rc = part_busy(s, true, "prefill", err);
    if (rc)
        return rc;
    rc = check_tokens(s->model, tokens, n, err);
    if (!rc && tap)
        rc = muser_tap_check(s->model, tap, err);
    if (!rc && tap && !s->be->forward_tap)
        rc = muser_errorf(err, MUSER_E_UNSUPPORTED,
                          "the %s backend has no hidden-state tap on the prefill route (the cpu backend has)",
                          s->be->name);
    if (rc)
        return rc;
    if (s->n_past + n > s->opts.n_ctx)
        return muser_errorf(err, MUSER_E_CONTEXT_FULL,
                            "context full: %llu tokens held + %u new > context of %llu",
                            (unsigned long long)s->n_past, n, (unsigned long long)s->opts.n_ctx);
    rc = tap ? s->be->forward_tap(s, tokens, n, logits, all_logits, tap, err)
             : s->be->forward(s, tokens, n, logits, all_logits, err);
    if (rc)
        return rc;
    s->n_past += n;
    return MUSER_OK;
}

/* Rows (seq[i], tokens[i]) of sessions on d for one pass: each session's rows one run, tokens in
 * the vocabulary, each run within its session's context (what = the call, in the messages). The
 * number of runs into *runs. */
static int check_rows(muser_device *d, muser_session *const *seq, const int32_t *tokens, uint32_t n, const char *what,
                      uint32_t *runs, muser_error *err)
{
    int rc = check_tokens(d->model, tokens, n, err);
    if (rc)
        return rc;
    *runs = 0;
    for (uint32_t i = 0; i < n; i++) {
        if (!seq[i] || seq[i]->dev != d)
            return muser_errorf(err, MUSER_E_ARG, "%s: row %u's session is %s", what, i,
                                seq[i] ? "on another device" : "NULL");
        if (seq[i]->in_part)
            return muser_errorf(err, MUSER_E_ARG, "%s: row %u's session has a prefill chunk open in parts", what, i);
        if (i > 0 && seq[i] != seq[i - 1])
            for (uint32_t j = 0; j + 1 < i; j++)
                if (seq[j] == seq[i])
                    return muser_errorf(err, MUSER_E_ARG,
                                        "%s: row %u continues the session of row %u after another session's rows (a "
                                        "session's rows must be one run, in order)",
                                        what, i, j);
    }
    for (uint32_t i = 0; i < n;) {
        uint32_t k = i;
        while (k < n && seq[k] == seq[i])
            k++;
        const muser_session *s = seq[i];
        if (s->n_past + (k - i) > s->opts.n_ctx)
            return muser_errorf(err, MUSER_E_CONTEXT_FULL,
                                "%s: row %u is at position %llu, past its session's context of %llu", what,
                                i + (uint32_t)(s->opts.n_ctx - s->n_past), (unsigned long long)s->opts.n_ctx,
                                (unsigned long long)s->opts.n_ctx);
        (*runs)++;
        i = k;
    }
    return MUSER_OK;
}

int muser_prefill_begin(muser_device *d, muser_session *const *seq, const int32_t *tokens, uint32_t n,
                        muser_error *err)
{
    if (!d || !seq || !tokens)
        return muser_errorf(err, MUSER_E_ARG, "muser_prefill_begin: NULL argument");
    if (!n)
        return muser_errorf(err, MUSER_E_ARG, "muser_prefill_begin: no rows");
    if (!d->be->forward_part || !d->part_rows)
        return muser_errorf(err, MUSER_E_UNSUPPORTED, "the %s backend runs a prefill chunk whole, not in parts",
                            d->be->name);
    if (d->part.n)
        return muser_errorf(err, MUSER_E_ARG, "prefill in parts: a chunk is open on the device; finish or abort it first");
    if (n > d->part_rows)
        return muser_errorf(err, MUSER_E_ARG, "prefill in parts: a chunk of %u rows, at most %u", n, d->part_rows);
    uint32_t runs = 0;
    int rc = check_rows(d, seq, tokens, n, "prefill in parts", &runs, err);
    if (rc)
        return rc;
    if (runs > MUSER_PREFILL_MAX_SEQS)
        return muser_errorf(err, MUSER_E_ARG, "prefill in parts: %u sessions in one chunk, at most %u", runs,
                            MUSER_PREFILL_MAX_SEQS);
    d->part.seq = malloc((size_t)n * sizeof *seq);
    d->part.tokens = malloc((size_t)n * sizeof *tokens);
    if (!d->part.seq || !d->part.tokens) {
        free(d->part.seq);
        free(d->part.tokens);
        memset(&d->part, 0, sizeof d->part);
        return muser_errorf(err, MUSER_E_NOMEM, "prefill in parts: out of memory");
    }
    memcpy(d->part.seq, seq, (size_t)n * sizeof *seq);
    memcpy(d->part.tokens, tokens, (size_t)n * sizeof *tokens);
    d->part.n = n;
    d->part.n_seqs = runs;
    d->part.next_layer = 0;
    for (uint32_t i = 0; i < n; i++)
        seq[i]->in_part = true;
    return MUSER_OK;
}

int muser_prefill_part(muser_device *d, uint32_t layers, float *logits, bool *done, muser_error *err)
{
    if (!d || !done)
        return muser_errorf(err, MUSER_E_ARG, "muser_prefill_part: NULL argument");
    *done = false;
    if (!d->part.n)
        return muser_errorf(err, MUSER_E_ARG, "prefill part: no chunk is open on the device");
    const uint32_t L = d->model->hp.n_layer, l0 = d->part.next_layer;
    const uint32_t l1 = layers >= L - l0 ? L : l0 + (layers ? layers : 1);
    const muser_step_rows rows = {.n = d->part.n, .seq = d->part.seq, .tokens = d->part.tokens};
    int rc = d->be->forward_part(d, &rows, l0, l1, l1 == L ? logits : NULL, err);
    if (rc) {
        muser_prefill_abort(d);
        return rc;
    }
    d->part.next_layer = l1;
    if (l1 == L) {
        for (uint32_t i = 0; i < d->part.n; i++)
            d->part.seq[i]->n_past++;
        muser_prefill_abort(d); /* closed: done */
        *done = true;
    }
    return MUSER_OK;
}

void muser_prefill_abort(muser_device *d)
{
    if (!d || !d->part.n)
        return;
    for (uint32_t i = 0; i < d->part.n; i++)
        d->part.seq[i]->in_part = false;
    free(d->part.seq);
    free(d->part.tokens);
    memset(&d->part, 0, sizeof d->part);
}

int muser_session_prefill_begin(muser_session *s, const int32_t *tokens, uint32_t n, muser_error *err)
{
    if (!s || !tokens)
        return muser_errorf(err, MUSER_E_ARG, "muser_session_prefill_begin: NULL argument");
    muser_session **seq = malloc((size_t)(n ? n : 1) * sizeof *seq);
    if (!seq)
        return muser_errorf(err, MUSER_E_NOMEM, "prefill in parts: out of memory");
    for (uint32_t i = 0; i < n; i++)
        seq[i] = s;
    const int rc = muser_prefill_begin(s->dev, seq, tokens, n, err);
    free(seq);
    return rc;
}

static int step_rows(muser_device *d, muser_session *const *seq, const int32_t *tokens, uint32_t n, float *logits,
                     float *const *out, muser_draw *const *draw, const muser_top *top, const muser_tap *tap,
                     muser_error *err);

int muser_step(muser_device *d, muser_session *const *seq, const int32_t *tokens, uint32_t n,
               float *logits, const muser_top *top, const muser_tap *tap, muser_error *err)
{
    return step_rows(d, seq, tokens, n, logits, NULL, NULL, top, tap, err);
}

int muser_step_out(muser_device *d, muser_session *const *seq, const int32_t *tokens, uint32_t n,
                   float *const *out, muser_draw *const *draw, const muser_top *top, const muser_tap *tap,
                   muser_error *err)
{
    return step_rows(d, seq, tokens, n, NULL, out, draw, top, tap, err);
}

static int step_rows(muser_device *d, muser_session *const *seq, const int32_t *tokens, uint32_t n, float *logits,
                     float *const *out, muser_draw *const *draw, const muser_top *top, const muser_tap *tap,
                     muser_error *err)
{
    if (!d || !seq || !tokens)
        return muser_errorf(err, MUSER_E_ARG, "muser_step: NULL argument");
    if (n == 0)
        return muser_errorf(err, MUSER_E_ARG, "muser_step: no rows");
    if (n > d->max_rows)
        return muser_errorf(err, MUSER_E_ARG, "step: %u rows, but one pass takes at most %u", n,
                            d->max_rows);
    uint32_t runs = 0;
    int rc = check_rows(d, seq, tokens, n, "step", &runs, err);
    if (rc)
        return rc;
    if (tap && (rc = muser_tap_check(d->model, tap, err)))
        return rc;
    if (top && (top->k == 0 || top->k > MUSER_TOP_MAX || top->k > d->model->hp.n_vocab || !top->id))
        return muser_errorf(err, MUSER_E_ARG, "step: the best %u logits per row (1..%u) and an id buffer are needed",
                            top->k, MUSER_TOP_MAX);
    for (uint32_t i = 0; draw && i < n; i++) {
        const muser_draw *w = draw[i];
        if (!w) continue;
        if (!out || !out[i])
            return muser_errorf(err, MUSER_E_ARG, "step: row %u has a draw but no buffer for its logits", i);
        char what[48];
        snprintf(what, sizeof what, "step: row %u's draw", i);
        if ((rc = muser_draw_check(w, what, err)))
            return rc;
    }
    for (uint32_t i = 0; draw && i < n; i++)
        if (draw[i]) draw[i]->id = -1;
    const muser_step_rows rows = {.n = n, .seq = seq, .tokens = tokens, .tap = tap, .top = top, .out = out,
                                  .draw = draw};
    rc = d->be->step(d, &rows, logits, err);
    if (rc)
        return rc;
    for (uint32_t i = 0; i < n; i++)
        seq[i]->n_past++;
    return MUSER_OK;
}

int muser_draw_check(const muser_draw *w, const char *what, muser_error *err)
{
    if (!(w->temperature > 0.0f) || !isfinite(w->temperature) || !(w->u >= 0.0 && w->u < 1.0) ||
        !(w->top_p > 0.0f && w->top_p <= 1.0f) || !(w->min_p >= 0.0f && w->min_p <= 1.0f))
        return muser_errorf(err, MUSER_E_ARG,
                            "%s: temperature %g (finite, > 0), top-p %g (in (0, 1]), min-p %g (in [0, 1]), u %g (in [0, 1))",
                            what, (double)w->temperature, (double)w->top_p, (double)w->min_p, w->u);
    return MUSER_OK;
}

void muser_top_rows(const muser_top *top, const float *logits, uint32_t n, uint32_t V)
{
    float v[MUSER_TOP_MAX];
    for (uint32_t i = 0; i < n; i++)
        muser_top_k(logits + (size_t)i * V, V, top->k, top->v ? top->v + (size_t)i * top->k : v,
                    top->id + (size_t)i * top->k);
}

int muser_session_checkpoint(muser_session *s, muser_error *err)
{
    if (!s)
        return muser_errorf(err, MUSER_E_ARG, "muser_session_checkpoint: NULL session");
    const int rc = part_busy(s, false, "checkpoint", err);
    return rc ? rc : s->be->checkpoint(s, err);
}

int muser_session_rollback(muser_session *s, uint64_t n_keep, muser_error *err)
{
    if (!s)
        return muser_errorf(err, MUSER_E_ARG, "muser_session_rollback: NULL session");
    if (n_keep > s->n_past)
        return muser_errorf(err, MUSER_E_ARG, "rollback to %llu: only %llu tokens are held",
                            (unsigned long long)n_keep, (unsigned long long)s->n_past);
    int rc = part_busy(s, false, "rollback", err);
    if (rc)
        return rc;
    rc = s->be->rollback(s, n_keep, err);
    if (rc)
        return rc;
    s->n_past = n_keep;
    return MUSER_OK;
}

void muser_session_commit(muser_session *s)
{
    if (s)
        s->be->commit(s);
}

int muser_session_copy(muser_session *dst, const muser_session *src, muser_error *err)
{
    if (!dst || !src)
        return muser_errorf(err, MUSER_E_ARG, "muser_session_copy: NULL session");
    if (dst->dev != src->dev || dst->opts.n_ctx != src->opts.n_ctx)
        return muser_errorf(err, MUSER_E_ARG, "session copy: the sessions need one device and one context");
    if (dst == src)
        return MUSER_OK;
    int rc = part_busy(dst, false, "session copy", err);
    if (!rc)
        rc = part_busy(src, false, "session copy", err);
    if (rc)
        return rc;
    rc = dst->be->kv_copy(dst, src, err);
    if (rc)
        return rc;
    dst->n_past = src->n_past;
    return MUSER_OK;
}

/* Layer l's shape when the cache holds n_past positions (what a local prefill leaves). */
static int shape_after(const muser_session *s, uint32_t l, uint64_t n_past, kv_plane *meta, muser_error *err)
{
    const muser_hparams *hp = &s->model->hp;
    if (l >= hp->n_layer)
        return muser_errorf(err, MUSER_E_ARG, "KV rows: layer %u of a model of %u layers", l, hp->n_layer);
    if (n_past > s->opts.n_ctx)
        return muser_errorf(err, MUSER_E_CONTEXT_FULL, "KV rows: %llu positions exceed the context of %llu",
                            (unsigned long long)n_past, (unsigned long long)s->opts.n_ctx);
    kv_plane_shape(meta, hp, l, s->opts.n_ctx);
    kv_plane_meta_after(meta, n_past);
    return MUSER_OK;
}

/* Rows [pos0, pos0 + n) must be positions the shape holds. */
static int check_held(const kv_plane *meta, uint32_t l, uint64_t pos0, uint32_t n, muser_error *err)
{
    const uint64_t first = kv_plane_first_pos(meta);
    if (pos0 < first || pos0 > meta->next_pos || n > meta->next_pos - pos0)
        return muser_errorf(err, MUSER_E_ARG,
                            "KV rows: positions %llu..%llu of layer %u, which holds %llu..%llu",
                            (unsigned long long)pos0, (unsigned long long)(pos0 + n), l,
                            (unsigned long long)first, (unsigned long long)meta->next_pos);
    return MUSER_OK;
}

int muser_session_kv_rows(const muser_session *s, uint32_t l, uint64_t pos0, uint32_t n, uint16_t *k,
                          uint16_t *v, muser_error *err)
{
    if (!s || (n && (!k || !v)))
        return muser_errorf(err, MUSER_E_ARG, "muser_session_kv_rows: NULL argument");
    kv_plane meta;
    int rc = part_busy(s, false, "KV rows", err);
    if (!rc)
        rc = shape_after(s, l, s->n_past, &meta, err);
    if (!rc)
        rc = check_held(&meta, l, pos0, n, err);
    return rc || !n ? rc : s->be->kv_rows(s, l, pos0, n, k, v, err);
}

int muser_session_kv_import(muser_session *s, uint32_t l, uint64_t n_past, uint64_t pos0, uint32_t n,
                            const uint16_t *k, const uint16_t *v, muser_error *err)
{
    if (!s || (n && (!k || !v)))
        return muser_errorf(err, MUSER_E_ARG, "muser_session_kv_import: NULL argument");
    kv_plane meta;
    int rc = part_busy(s, false, "KV import", err);
    if (!rc)
        rc = shape_after(s, l, n_past, &meta, err);
    if (!rc)
        rc = check_held(&meta, l, pos0, n, err);
    return rc ? rc : s->be->kv_import(s, l, &meta, pos0, n, k, v, err);
}

int muser_session_kv_seal(muser_session *s, uint64_t n_past, muser_error *err)
{
    if (!s)
        return muser_errorf(err, MUSER_E_ARG, "muser_session_kv_seal: NULL session");
    kv_plane meta;
    int rc = part_busy(s, false, "KV seal", err);
    for (uint32_t l = 0; l < s->model->hp.n_layer && !rc; l++)
        if (!(rc = shape_after(s, l, n_past, &meta, err)))
            rc = s->be->kv_import(s, l, &meta, 0, 0, NULL, NULL, err);
    if (!rc)
        s->n_past = n_past;
    return rc;
}

int muser_session_swap(muser_session *a, muser_session *b, muser_error *err)
{
    if (!a || !b)
        return muser_errorf(err, MUSER_E_ARG, "muser_session_swap: NULL session");
    if (a->dev != b->dev || a->opts.n_ctx != b->opts.n_ctx)
        return muser_errorf(err, MUSER_E_ARG, "session swap: the sessions need one device and one context");
    int rc = part_busy(a, false, "session swap", err);
    if (!rc)
        rc = part_busy(b, false, "session swap", err);
    if (rc)
        return rc;
    void *st = a->be_state;
    const uint64_t n = a->n_past;
    a->be_state = b->be_state;
    a->n_past = b->n_past;
    b->be_state = st;
    b->n_past = n;
    return MUSER_OK;
}

int muser_session_kv_sha256(const muser_session *s, char hex[65], muser_error *err)
{
    if (!s || !hex)
        return muser_errorf(err, MUSER_E_ARG, "muser_session_kv_sha256: NULL argument");
    const muser_hparams *hp = &s->model->hp;
    const uint64_t row = (uint64_t)hp->n_head_kv * hp->head_dim;
    const uint64_t most = hp->swa_window > s->opts.n_ctx ? hp->swa_window : s->opts.n_ctx; /* rows of any plane */
    uint16_t *k = malloc(most * row * sizeof(uint16_t)), *v = malloc(most * row * sizeof(uint16_t));
    EVP_MD_CTX *md = EVP_MD_CTX_new();
    int rc = k && v && md && EVP_DigestInit_ex(md, EVP_sha256(), NULL) == 1
                 ? MUSER_OK
                 : muser_errorf(err, MUSER_E_NOMEM, "kv digest: out of memory");
    for (uint32_t l = 0; l < hp->n_layer && !rc; l++) {
        kv_plane meta;
        if ((rc = s->be->kv_export(s, l, &meta, k, v, err)))
            break;
        if (meta.capacity > most) {
            rc = muser_errorf(err, MUSER_E_BACKEND, "kv digest: layer %u holds %llu rows", l,
                              (unsigned long long)meta.capacity);
            break;
        }
        const uint64_t m[5] = {meta.capacity, meta.origin_logical, meta.origin_physical, meta.len, meta.next_pos};
        EVP_DigestUpdate(md, m, sizeof m);
        /* the rows of the positions the plane holds, in position order (a ring's other slots and a
         * FULL plane's rows past len are not part of the cache's content) */
        const uint64_t first = meta.next_pos - meta.len, D = meta.head_dim;
        for (int kv = 0; kv < 2; kv++) {
            const uint16_t *p = kv ? v : k;
            if (meta.ring) {
                for (uint64_t pos = first; pos < meta.next_pos; pos++)
                    EVP_DigestUpdate(md, p + kv_plane_row(&meta, pos) * row, row * sizeof(uint16_t));
            } else {
                for (uint32_t h = 0; h < meta.n_head_kv; h++)
                    EVP_DigestUpdate(md, p + (uint64_t)h * meta.capacity * D, meta.len * D * sizeof(uint16_t));
            }
        }
    }
    if (!rc) {
        unsigned char d[32];
        unsigned int len = 0;
        EVP_DigestFinal_ex(md, d, &len);
        for (int i = 0; i < 32; i++)
            snprintf(hex + 2 * i, 3, "%02x", d[i]);
    }
    EVP_MD_CTX_free(md);
    free(k);
    free(v);
    return rc;
}

void muser_session_reset(muser_session *s)
{
    if (!s)
        return;
    if (s->in_part)
        muser_prefill_abort(s->dev);
    s->be->reset(s);
    s->n_past = 0;
}
