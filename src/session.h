/* session.h — one sequence over a shared model: its KV cache, activations and backend.
 *
 * muser_session_forward runs n tokens at positions n_past .. n_past+n-1 through the route that
 * fits: n == 1 is the decode route, n > 1 the batch route (prefill chunks, speculative verify).
 * Every backend implements the same contract (SPEC §4); the oracle is a backend too, so tools can
 * compare any two. Nothing is allocated per token: sessions size everything at creation. */
#ifndef MUSER_SESSION_H
#define MUSER_SESSION_H

#include "kv.h"
#include "model.h"

typedef enum {
    MUSER_BACKEND_CPU = 0,    /* the fast CPU engine */
    MUSER_BACKEND_ORACLE = 1, /* src/reference.c: plain, f64, the judge */
    MUSER_BACKEND_CUDA = 2,
} muser_backend_kind;

typedef struct muser_session_opts {
    muser_backend_kind backend;
    uint64_t n_ctx;          /* 0 = the model's context_length */
    uint32_t n_threads;      /* CPU; 0 = all cores */
    uint32_t max_batch;      /* rows per batch-route call; 0 = 512 */
    int device;              /* CUDA device ordinal */
} muser_session_opts;

typedef struct muser_session muser_session;

/* Backend vtable. Each backend's session_new allocates its state and stores it in s->be_state. */
typedef struct muser_backend {
    const char *name;
    int (*init)(muser_session *s, muser_error *err);
    void (*free)(muser_session *s);
    /* Run tokens[0..n) at s->n_past; logits [n][V] if all_logits else [V] for the last row
     * (logits may be NULL). Must leave the session unchanged on error. */
    int (*forward)(muser_session *s, const int32_t *tokens, uint32_t n, float *logits,
                   bool all_logits, muser_error *err);
    int (*checkpoint)(muser_session *s, muser_error *err);
    int (*rollback)(muser_session *s, uint64_t n_keep, muser_error *err);
    void (*commit)(muser_session *s);
    void (*reset)(muser_session *s);
} muser_backend;

struct muser_session {
    const muser_model *model;
    muser_session_opts opts;  /* n_ctx resolved */
    const muser_backend *be;
    void *be_state;
    uint64_t n_past;
};

int muser_session_new(muser_session **out, const muser_model *m, const muser_session_opts *o,
                      muser_error *err);
void muser_session_free(muser_session *s);
int muser_session_forward(muser_session *s, const int32_t *tokens, uint32_t n, float *logits,
                          bool all_logits, muser_error *err);
int muser_session_checkpoint(muser_session *s, muser_error *err);
int muser_session_rollback(muser_session *s, uint64_t n_keep, muser_error *err);
void muser_session_commit(muser_session *s);
void muser_session_reset(muser_session *s);
const char *muser_backend_name(muser_backend_kind k);
int muser_backend_from_name(const char *name); /* -1 if unknown */

/* Backends (each in its own source; cuda returns NULL when built without CUDA). */
const muser_backend *muser_backend_cpu(void);
const muser_backend *muser_backend_oracle(void);
const muser_backend *muser_backend_cuda(void);

#endif
