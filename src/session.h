/* session.h — backend instances (devices) and the sequences (sessions) on them.
 *
 * A device is one backend instance over a shared model: the weights where the backend keeps them
 * (on a GPU: uploaded once), its threads and its pass workspace. A session is one sequence on a
 * device: its KV cache and position. muser_session_new makes a private device for one session
 * (the simple case); muser_device_new + muser_session_open put many sessions on one device, so
 * their decode steps can share a pass (muser_step).
 *
 * Routes. muser_step is the small-batch route: up to d->max_rows rows per pass, each from any
 * session on the device (packed decode), or several consecutive rows of one session (speculative
 * verify); a row's logits and the K/V it writes are bit-identical whatever else shares its pass
 * (SPEC §4, row invariance). muser_session_forward with n == 1 is that route with one row;
 * n > 1 is the prefill route (chunks of max_batch rows), which meets the contract.
 * Every backend implements the same contract; the oracle is a backend too, so tools can compare
 * any two. Nothing is allocated per token: sessions and devices size everything at creation. */
#ifndef MUSER_SESSION_H
#define MUSER_SESSION_H

#include "forward.h"
#include "kv.h"
#include "model.h"

typedef enum {
    MUSER_BACKEND_CPU = 0,    /* the fast CPU engine */
    MUSER_BACKEND_ORACLE = 1, /* src/reference.c: plain, f64, the judge */
    MUSER_BACKEND_CUDA = 2,
} muser_backend_kind;

/* Rows one small-batch pass takes at most (a device may take fewer: d->max_rows). */
#define MUSER_STEP_MAX_ROWS 64u

typedef struct muser_session_opts {
    muser_backend_kind backend;
    uint64_t n_ctx;          /* 0 = the model's context_length; on a device: the largest
                              * context a session may open with (its default) */
    uint32_t n_threads;      /* CPU; 0 = all cores */
    uint32_t max_batch;      /* rows per prefill-route call; 0 = 512 */
    int device;              /* CUDA device ordinal */
    uint32_t tp_ranks;        /* > 1: the model split across that many ranks of `backend` (tp.h's split
                               * device); 0 or 1: one */
    struct muser_tp_comm *tp; /* a rank of a split device (tp.c sets these): the ranks' reduce, NULL: one rank */
    uint32_t tp_rank;         /* this device's rank (its model is that rank's shard) */
    void *tp_nccl;            /* CUDA ranks on GPUs of their own: the rank's NCCL communicator (tp.c);
                               * NULL: they reduce through tp on the host */
    bool tp_share_gpu;        /* a split device's CUDA ranks may share opts.device when the host has
                               * fewer GPUs than ranks (the host reduce: tests); else that is an error */
} muser_session_opts;

typedef struct muser_session muser_session;
typedef struct muser_device muser_device;

/* The hidden-state tap of a step (forward.h): the residual after each listed layer, per row. */
typedef fwd_tap muser_tap;
#define MUSER_TAP_MAX_LAYERS 8u

/* A step's best logits per row: what a greedy or top-k sampler needs instead of the row. */
#define MUSER_TOP_MAX 64u
typedef struct muser_top {
    uint32_t k;                /* per row, 1..MUSER_TOP_MAX */
    float *v;                  /* [n][k] the k largest logits, best first (may be NULL: ids only) */
    int32_t *id;               /* [n][k] their ids: ties to the lower id, -0 tying +0 (muser_top_k) */
} muser_top;

/* A row's token drawn where its logits are: what muser_sampler_sample_u(s, row, u) gives for a
 * sampler whose choice is a draw over the whole row (muser_sampler_draw_params: x = (l − max) / T,
 * draw.h's weights, min-p and top-p as draw.h truncates, the blocks' sums and the walk), so that the
 * row need not come back. A backend that draws (CUDA) sets id and leaves the row's buffer as it
 * was; one that does not, or cannot for this row, leaves id −1 and writes the row for the caller to
 * draw from with the same u. */
typedef struct muser_draw {
    float temperature;         /* > 0, finite */
    float top_p;               /* (0, 1]; 1: none */
    float min_p;               /* [0, 1]; 0: none */
    double u;                  /* in [0, 1): the sampler's uniform for this token (muser_sampler_uniform) */
    int32_t id;                /* out: the token, or −1 (the row is in the row's buffer) */
} muser_draw;

/* One small-batch pass as the backend receives it, checked by muser_step: rows of the same
 * session are one contiguous run at that session's next positions. */
typedef struct muser_step_rows {
    uint32_t n;
    muser_session *const *seq; /* [n] */
    const int32_t *tokens;     /* [n] */
    const muser_tap *tap;      /* NULL: none */
    const muser_top *top;      /* each row's best logits; NULL: none */
    float *const *out;         /* [n] each row's logits [V] (a NULL entry: not wanted), in place of the
                                * step's contiguous logits buffer; NULL: that buffer */
    muser_draw *const *draw;   /* [n] a row's draw (a NULL entry: none; its row's buffer is needed), set
                                * to id −1 by muser_step; NULL: none */
} muser_step_rows;

/* Where a step writes row i's logits: rows->out[i], else logits + i·V (NULL: nowhere). */
static inline float *muser_row_dst(const muser_step_rows *r, float *logits, uint32_t i, uint64_t V)
{
    return r->out ? r->out[i] : logits ? logits + (size_t)i * V : NULL;
}

/* Backend vtable. dev_init allocates the device state (d->be_state); init a session's state on
 * s->dev (s->be_state). */
typedef struct muser_backend {
    const char *name;
    int (*dev_init)(muser_device *d, muser_error *err);
    void (*dev_free)(muser_device *d);
    int (*init)(muser_session *s, muser_error *err);
    void (*free)(muser_session *s);
    /* The prefill route: tokens[0..n) at s->n_past; logits [n][V] if all_logits else [V] for the
     * last row (logits may be NULL). Must leave the session unchanged on error. */
    int (*forward)(muser_session *s, const int32_t *tokens, uint32_t n, float *logits,
                   bool all_logits, muser_error *err);
    /* The small-batch route: each row's logits where muser_row_dst(rows, logits, i, V) says (logits
     * [n][V], or rows->out's per-row buffers; NULL: not wanted) and rows->top (may be NULL), each
     * written only on success. Must leave every session unchanged on error. */
    int (*step)(muser_device *d, const muser_step_rows *rows, float *logits, muser_error *err);
    int (*checkpoint)(muser_session *s, muser_error *err);
    int (*rollback)(muser_session *s, uint64_t n_keep, muser_error *err);
    void (*commit)(muser_session *s);
    void (*reset)(muser_session *s);
    /* Layer l's plane: its metadata, and its whole storage (capacity rows, kv.h's layout, f16)
     * into k and v. */
    int (*kv_export)(const muser_session *s, uint32_t l, kv_plane *meta, uint16_t *k, uint16_t *v,
                     muser_error *err);
    /* dst's cache becomes a byte copy of src's (same device, same context). */
    int (*kv_copy)(muser_session *dst, const muser_session *src, muser_error *err);
    /* Layer l's K/V at logical positions [pos0, pos0 + n) (held; session.c checked), token-major:
     * [n][HKV*D] f16 each (kv_plane_read_rows). */
    int (*kv_rows)(const muser_session *s, uint32_t l, uint64_t pos0, uint32_t n, uint16_t *k,
                   uint16_t *v, muser_error *err);
    /* Remote install into a session nothing runs on: layer l's metadata becomes *meta (session.c
     * made it: a local prefill's shape) and the token-major rows of positions [pos0, pos0 + n)
     * land where meta places them (n == 0: the metadata only; kv_plane_import). */
    int (*kv_import)(muser_session *s, uint32_t l, const kv_plane *meta, uint64_t pos0, uint32_t n,
                     const uint16_t *k, const uint16_t *v, muser_error *err);
    /* The prefill route with the hidden-state tap (tap->out [n][n_layers][E], session.c checked
     * it), otherwise forward exactly: the same bytes. NULL: the backend has no prefill tap (CUDA
     * and the oracle for now). */
    int (*forward_tap)(muser_session *s, const int32_t *tokens, uint32_t n, float *logits, bool all_logits,
                       const muser_tap *tap, muser_error *err);
    /* The prefill route over one chunk in parts (fwd_run_layers): layers [l0, l1) of rows->n
     * rows (≤ d->part_rows) of up to MUSER_PREFILL_MAX_SEQS sessions, each session's rows one run
     * at its n_past (session.c checked them as muser_step's). session.c calls l0 = 0 first and
     * then each part where the last one ended, with the same rows; between the parts nothing runs
     * on those sessions and no other prefill on the device (other sessions' steps may). The part
     * that reaches n_layer checks and commits as forward does and writes each session's last
     * row's logits, [sessions][V] in run order (when non-NULL). A session's bytes are those of
     * forward over its rows alone, whatever the parts and whatever else shares the chunk. Nothing
     * is committed before the last part, so an error, or a chunk never finished, leaves every
     * session as it was. NULL: the backend runs chunks whole. */
    int (*forward_part)(muser_device *d, const muser_step_rows *rows, uint32_t l0, uint32_t l1, float *logits,
                        muser_error *err);
} muser_backend;

struct muser_device {
    const muser_model *model;
    muser_session_opts opts;  /* resolved */
    const muser_backend *be;
    void *be_state;
    uint32_t max_rows;        /* rows one muser_step may carry */
    uint32_t prefill_rows;    /* the fewest rows a prefill call needs to run near its best rate (the
                               * GPU's GEMM tile; 0: no such floor): the engine's contended chunks
                               * that run whole (a tapped prompt's) take at least this many */
    uint32_t part_rows;       /* the most rows of a chunk run in parts (0: the backend has no parts) */
    struct {                  /* the chunk open in parts (n 0: none) */
        muser_session **seq;  /* [n] each row's session */
        int32_t *tokens;      /* [n] */
        uint32_t n, n_seqs, next_layer;
    } part;
    uint32_t n_sessions;      /* sessions open on it */
    /* pass_cost[n]: a pass of n rows of one sequence (a verify block), in decode steps, as the
     * backend estimates it (a fixed figure per backend and machine, never timed at run time, so
     * that a controller reading it stays deterministic); 1 + 0.5·(n − 1) unless dev_init sets it. */
    double pass_cost[KV_MAX_SPEC_ROWS + 1];
};

struct muser_session {
    const muser_model *model;
    muser_session_opts opts;  /* the device's, n_ctx this session's */
    const muser_backend *be;
    muser_device *dev;
    bool owns_dev;            /* made by muser_session_new: freed with the session */
    void *be_state;
    uint64_t n_past;
    bool in_part;             /* its rows are in the device's chunk open in parts */
};

int muser_device_new(muser_device **out, const muser_model *m, const muser_session_opts *o,
                     muser_error *err);
/* Sessions still open on the device are an error the caller made; they must be freed first. */
void muser_device_free(muser_device *d);
/* A session on d with context n_ctx (0: the device's; at most the device's). */
int muser_session_open(muser_session **out, muser_device *d, uint64_t n_ctx, muser_error *err);

/* A private device and one session on it. */
int muser_session_new(muser_session **out, const muser_model *m, const muser_session_opts *o,
                      muser_error *err);
void muser_session_free(muser_session *s);
int muser_session_forward(muser_session *s, const int32_t *tokens, uint32_t n, float *logits,
                          bool all_logits, muser_error *err);
/* The prefill route at any n (one row included): what a chunked prompt calls, so that its bytes
 * do not depend on where the chunks end (logits [V] of the last row, may be NULL). */
int muser_session_prefill(muser_session *s, const int32_t *tokens, uint32_t n, float *logits,
                          muser_error *err);
/* muser_session_prefill with the hidden-state tap (tap->out [n][n_layers][E]; tap NULL: none): the
 * same bytes of logits and cache. MUSER_E_UNSUPPORTED on a backend without a prefill tap. */
int muser_session_prefill_tap(muser_session *s, const int32_t *tokens, uint32_t n, float *logits,
                              const muser_tap *tap, muser_error *err);
/* The prefill route over one chunk in parts of layers, so that other sessions' passes (muser_step)
 * can run between the parts: a long prompt's chunk does not hold decode steps back for its whole
 * length, and several prompts share a chunk (the engine's scheduler, docs/engine.md).
 * muser_prefill_begin checks rows (seq[i], tokens[i]) as muser_step does — each session's rows
 * one run, at most MUSER_PREFILL_MAX_SEQS sessions, n ≤ d->part_rows, each run within its
 * session's context — keeps a copy and opens the chunk; each muser_prefill_part runs the next
 * `layers` layers (at least one; the first part also the embedding, the last the LM head and the
 * commit, which advances each session's n_past by its rows and writes each one's last row's
 * logits [sessions][V], in run order, when logits is non-NULL) and sets *done after the last. A
 * session's bytes of cache and logits are muser_session_prefill's over its rows, however the
 * chunk is cut and whatever shares it. While the chunk is open no other prefill runs on the
 * device, and its sessions take no call; muser_prefill_abort closes it unfinished (every session
 * as before it; freeing or resetting one of its sessions aborts it too). An error in a part
 * aborts the chunk. MUSER_E_UNSUPPORTED where the backend runs chunks whole (d->part_rows 0).
 * muser_session_prefill_begin is the chunk of one session's n rows. */
#define MUSER_PREFILL_MAX_SEQS 16
int muser_prefill_begin(muser_device *d, muser_session *const *seq, const int32_t *tokens, uint32_t n,
                        muser_error *err);
int muser_prefill_part(muser_device *d, uint32_t layers, float *logits, bool *done, muser_error *err);
void muser_prefill_abort(muser_device *d);
int muser_session_prefill_begin(muser_session *s, const int32_t *tokens, uint32_t n, muser_error *err);
/* A tap is well formed for m: 1..MUSER_TAP_MAX_LAYERS ascending layers below n_layer, a buffer. */
int muser_tap_check(const muser_model *m, const muser_tap *tap, muser_error *err);
/* The small-batch route over n rows (seq[i], tokens[i]) of sessions on d: logits [n][V] (may be
 * NULL), top each row's best top->k logits (may be NULL: a greedy or top-k sampler needs no more,
 * and the GPU then copies no row back), tap as muser_tap (may be NULL). Refused before anything runs, with an error naming the
 * row: more rows than d->max_rows, a session of another device, a token out of range, a
 * session's rows not one contiguous run, a row past its session's context. Each session's
 * n_past advances by its rows on success; on any error no session changes. */
int muser_step(muser_device *d, muser_session *const *seq, const int32_t *tokens, uint32_t n,
               float *logits, const muser_top *top, const muser_tap *tap, muser_error *err);
/* muser_step with each row's logits into its own buffer out[i] [V] (NULL entries: not wanted;
 * out NULL: none), each written only on success: a caller packing many requests' rows hands each
 * its row without a copy through a buffer of its own. draw (may be NULL) [n]: row i's token drawn
 * where the logits are (muser_draw; NULL entries: none), its row's buffer out[i] written only
 * where the backend did not draw (id −1). Refused: a draw without a row buffer, a temperature
 * not finite and > 0, u outside [0, 1). */
int muser_step_out(muser_device *d, muser_session *const *seq, const int32_t *tokens, uint32_t n,
                   float *const *out, muser_draw *const *draw, const muser_top *top, const muser_tap *tap,
                   muser_error *err);
/* A draw's parameters are well formed: temperature finite and > 0, u in [0, 1) (what the step
 * refuses; what names the caller in the message). */
int muser_draw_check(const muser_draw *w, const char *what, muser_error *err);
/* For a backend whose logits are in host memory: top's n rows from logits [n][V] (muser_top_k). */
void muser_top_rows(const muser_top *top, const float *logits, uint32_t n, uint32_t V);
int muser_session_checkpoint(muser_session *s, muser_error *err);
int muser_session_rollback(muser_session *s, uint64_t n_keep, muser_error *err);
void muser_session_commit(muser_session *s);
void muser_session_reset(muser_session *s);
/* dst (empty or not) becomes a copy of src: its cache bytes and position (same device, same
 * context; a prefix cache forks a prompt's cache this way). */
int muser_session_copy(muser_session *dst, const muser_session *src, muser_error *err);
/* Remote prefill (src/handoff). muser_session_kv_rows: layer l's K/V rows of positions
 * [pos0, pos0 + n), token-major [n][HKV*D] f16 each; refused unless the cache holds them all.
 * muser_session_kv_import: into a detached session (one nothing runs on and nobody reads until
 * muser_session_swap), the rows of positions [pos0, pos0 + n) that a cache of n_past positions
 * holds, placed as a local prefill of n_past tokens places them (a ring at origin_physical =
 * origin mod capacity); the layer's metadata becomes that shape; s->n_past does not move.
 * muser_session_kv_seal: every layer takes the shape of n_past positions and s->n_past = n_past,
 * once every row was imported. Refused, with nothing written: a layer out of range, n_past past
 * the context, rows a cache of n_past positions does not hold. */
int muser_session_kv_rows(const muser_session *s, uint32_t l, uint64_t pos0, uint32_t n, uint16_t *k,
                          uint16_t *v, muser_error *err);
int muser_session_kv_import(muser_session *s, uint32_t l, uint64_t n_past, uint64_t pos0, uint32_t n,
                            const uint16_t *k, const uint16_t *v, muser_error *err);
int muser_session_kv_seal(muser_session *s, uint64_t n_past, muser_error *err);
/* a and b (one device, one context) exchange their caches and positions: the atomic swap of a
 * remote install (nothing is copied; neither may be in a call). */
int muser_session_swap(muser_session *a, muser_session *b, muser_error *err);
/* SHA-256 over every plane's metadata and the K/V rows of the positions it holds, in layer and
 * position order: two caches with the same content (the same history on one backend, whatever
 * was verified and rolled back on the way) give the same digest. */
int muser_session_kv_sha256(const muser_session *s, char hex[65], muser_error *err);
const char *muser_backend_name(muser_backend_kind k);
int muser_backend_from_name(const char *name); /* -1 if unknown */

/* Backends (each in its own source; cuda returns NULL when built without CUDA). */
const muser_backend *muser_backend_cpu(void);
const muser_backend *muser_backend_oracle(void);
const muser_backend *muser_backend_cuda(void);

#endif
