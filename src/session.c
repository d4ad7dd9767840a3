/* session.c — one sequence over a shared model: picks the backend, resolves options, checks
 * every call's arguments once (so backends can trust them) and keeps n_past.
 *
 * The session owns only n_past; the KV cache and activations live in the backend's state
 * (s->be_state). Every check happens before the backend runs, and n_past moves only when the
 * backend succeeded, so a refused or failed call leaves the session as it was. */
#include "session.h"

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

int muser_session_new(muser_session **out, const muser_model *m, const muser_session_opts *o,
                      muser_error *err)
{
    if (!out || !m)
        return muser_errorf(err, MUSER_E_ARG, "muser_session_new: NULL argument");
    *out = NULL;
    muser_session_opts opts;
    if (o)
        opts = *o;
    else
        memset(&opts, 0, sizeof opts); /* cpu backend, model context, all cores */
    if ((int)opts.backend < 0 || opts.backend > MUSER_BACKEND_CUDA)
        return muser_errorf(err, MUSER_E_ARG, "session: unknown backend %d", (int)opts.backend);
    const muser_backend *be = backend_for(opts.backend);
    if (!be) {
        if (opts.backend == MUSER_BACKEND_CUDA)
            return muser_errorf(err, MUSER_E_BACKEND,
                                "muser was built without CUDA (backend 'cuda' is unavailable)");
        return muser_errorf(err, MUSER_E_BACKEND, "backend '%s' is not available in this build",
                            muser_backend_name(opts.backend));
    }
    if (opts.n_ctx == 0)
        opts.n_ctx = m->hp.n_ctx_train;
    if (opts.max_batch == 0)
        opts.max_batch = SESSION_DEFAULT_MAX_BATCH;
    if (opts.n_threads > SESSION_MAX_THREADS) /* each thread gets per-thread scratch */
        return muser_errorf(err, MUSER_E_ARG, "session: %u threads requested, at most %u",
                            opts.n_threads, SESSION_MAX_THREADS);

    muser_session *s = calloc(1, sizeof *s);
    if (!s)
        return muser_errorf(err, MUSER_E_NOMEM, "session: out of memory");
    s->model = m;
    s->opts = opts;
    s->be = be;
    s->n_past = 0;
    int rc = be->init(s, err);
    if (rc) {
        free(s);
        return rc;
    }
    *out = s;
    return MUSER_OK;
}

void muser_session_free(muser_session *s)
{
    if (!s)
        return;
    if (s->be && s->be->free)
        s->be->free(s);
    free(s);
}

int muser_session_forward(muser_session *s, const int32_t *tokens, uint32_t n, float *logits,
                          bool all_logits, muser_error *err)
{
    if (!s || (!tokens && n))
        return muser_errorf(err, MUSER_E_ARG, "muser_session_forward: NULL argument");
    if (n == 0)
        return muser_errorf(err, MUSER_E_ARG, "muser_session_forward: no tokens");
    const uint32_t V = s->model->hp.n_vocab;
    for (uint32_t i = 0; i < n; i++)
        if (tokens[i] < 0 || (uint32_t)tokens[i] >= V)
            return muser_errorf(err, MUSER_E_ARG, "token %d at index %u is not in [0, %u)",
                                tokens[i], i, V);
    if (s->n_past + n > s->opts.n_ctx)
        return muser_errorf(err, MUSER_E_CONTEXT_FULL,
                            "context full: %llu tokens held + %u new > context of %llu",
                            (unsigned long long)s->n_past, n, (unsigned long long)s->opts.n_ctx);
    int rc = s->be->forward(s, tokens, n, logits, all_logits, err);
    if (rc)
        return rc;
    s->n_past += n;
    return MUSER_OK;
}

int muser_session_checkpoint(muser_session *s, muser_error *err)
{
    if (!s)
        return muser_errorf(err, MUSER_E_ARG, "muser_session_checkpoint: NULL session");
    return s->be->checkpoint(s, err);
}

int muser_session_rollback(muser_session *s, uint64_t n_keep, muser_error *err)
{
    if (!s)
        return muser_errorf(err, MUSER_E_ARG, "muser_session_rollback: NULL session");
    if (n_keep > s->n_past)
        return muser_errorf(err, MUSER_E_ARG, "rollback to %llu: only %llu tokens are held",
                            (unsigned long long)n_keep, (unsigned long long)s->n_past);
    int rc = s->be->rollback(s, n_keep, err);
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

void muser_session_reset(muser_session *s)
{
    if (!s)
        return;
    s->be->reset(s);
    s->n_past = 0;
}
