/* tp.c — tensor parallelism over threads of ranks: CPU ranks, or CUDA ranks on GPUs of their own
 * (NCCL) or sharing one (the host reduce) (tp.h). */
#include "tp.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "quant.h"
#ifdef MUSER_HAVE_CUDA
#include "cuda/cuda_backend.h"
#endif

/* ---- the split ---------------------------------------------------------------------------------- */

/* Whether an n-way split of t's columns leaves every piece whole blocks of its format. */
static bool cols_split_ok(const muser_tensor *t, uint32_t n)
{
    const quant_type_info *qi = quant_info(t->type);
    return qi && t->cols % n == 0 && (t->cols / n) % qi->block_elems == 0;
}

int muser_tp_check(const muser_model *m, uint32_t n, muser_error *err)
{
    const muser_hparams *hp = &m->hp;
    if (n < 1 || n > MUSER_TP_MAX)
        return muser_errorf(err, MUSER_E_ARG, "tensor parallel: %u ranks (1 .. %u)", n, MUSER_TP_MAX);
    if (hp->n_head_kv % n || hp->n_head % n)
        return muser_errorf(err, MUSER_E_ARG,
                            "tensor parallel: %u ranks do not divide the model's %u KV heads (%u query heads): "
                            "each rank holds whole heads",
                            n, hp->n_head_kv, hp->n_head);
    if (hp->n_ff % n)
        return muser_errorf(err, MUSER_E_ARG, "tensor parallel: %u ranks do not divide the FFN width %u", n, hp->n_ff);
    if (hp->n_vocab % n)
        return muser_errorf(err, MUSER_E_ARG, "tensor parallel: %u ranks do not divide the vocabulary of %u", n,
                            hp->n_vocab);
    for (uint32_t l = 0; l < hp->n_layer; l++) {
        const muser_layer *L = &m->layers[l];
        const muser_tensor *cs[] = {&L->attn_output, &L->ffn_down};
        for (size_t i = 0; i < 2; i++)
            if (!cols_split_ok(cs[i], n)) {
                const quant_type_info *qi = quant_info(cs[i]->type);
                return muser_errorf(err, MUSER_E_ARG,
                                    "tensor parallel: %s's %llu columns in %u pieces are not whole %s blocks of %u",
                                    cs[i]->name ? cs[i]->name : "a matrix", (unsigned long long)cs[i]->cols, n,
                                    qi ? qi->name : "?", qi ? qi->block_elems : 0);
            }
    }
    return MUSER_OK;
}

/* rows [r·rows/n, (r+1)·rows/n) of t: a view */
static muser_tensor rows_view(const muser_tensor *t, uint32_t n, uint32_t r)
{
    muser_tensor v = *t;
    const uint64_t per = t->rows / n;
    v.data = (const uint8_t *)t->data + (size_t)(per * r) * t->row_bytes;
    v.rows = per;
    return v;
}

/* columns [r·cols/n, (r+1)·cols/n) of every row of t, copied to dst (cols_split_ok) */
static muser_tensor cols_copy(const muser_tensor *t, uint32_t n, uint32_t r, uint8_t *dst)
{
    muser_tensor v = *t;
    const uint64_t per = t->cols / n, off = quant_row_bytes(t->type, per * r), rb = quant_row_bytes(t->type, per);
    for (uint64_t i = 0; i < t->rows; i++)
        memcpy(dst + i * rb, (const uint8_t *)t->data + i * t->row_bytes + off, rb);
    v.data = dst;
    v.cols = per;
    v.row_bytes = rb;
    return v;
}

int muser_tp_shard(const muser_model *m, uint32_t n, uint32_t rank, muser_model *out, muser_error *err)
{
    memset(out, 0, sizeof *out);
    int rc = muser_tp_check(m, n, err);
    if (rc)
        return rc;
    if (rank >= n)
        return muser_errorf(err, MUSER_E_ARG, "tensor parallel: rank %u of %u", rank, n);
    const muser_hparams *hp = &m->hp;
    /* one allocation: the layer table, then every column-split copy */
    size_t bytes = (size_t)hp->n_layer * sizeof(muser_layer);
    for (uint32_t l = 0; l < hp->n_layer; l++) {
        const muser_layer *L = &m->layers[l];
        bytes += (size_t)L->attn_output.rows * quant_row_bytes(L->attn_output.type, L->attn_output.cols / n) + 64;
        bytes += (size_t)L->ffn_down.rows * quant_row_bytes(L->ffn_down.type, L->ffn_down.cols / n) + 64;
    }
    uint8_t *mem = malloc(bytes);
    if (!mem)
        return muser_errorf(err, MUSER_E_NOMEM, "tensor parallel: out of memory for rank %u's shard", rank);
    *out = *m;
    out->gguf = NULL; /* the bytes stay m's */
    out->hp.n_head = hp->n_head / n;
    out->hp.n_head_kv = hp->n_head_kv / n;
    out->hp.n_ff = hp->n_ff / n;
    out->layers = (muser_layer *)mem;
    uint8_t *at = mem + (size_t)hp->n_layer * sizeof(muser_layer);
    out->output = rows_view(&m->output, n, rank); /* the LM head by vocabulary rows */
    uint64_t wb = m->tok_embd.rows * m->tok_embd.row_bytes + out->output.rows * out->output.row_bytes;
    for (uint32_t l = 0; l < hp->n_layer; l++) {
        const muser_layer *L = &m->layers[l];
        muser_layer *S = &out->layers[l];
        *S = *L;
        S->attn_q = rows_view(&L->attn_q, n, rank);
        S->attn_k = rows_view(&L->attn_k, n, rank);
        S->attn_v = rows_view(&L->attn_v, n, rank);
        if (hp->attn_gate)
            S->attn_gate = rows_view(&L->attn_gate, n, rank);
        S->ffn_gate = rows_view(&L->ffn_gate, n, rank);
        S->ffn_up = rows_view(&L->ffn_up, n, rank);
        S->attn_output = cols_copy(&L->attn_output, n, rank, at);
        at += (S->attn_output.rows * S->attn_output.row_bytes + 63) / 64 * 64 + 64;
        S->ffn_down = cols_copy(&L->ffn_down, n, rank, at);
        at += (S->ffn_down.rows * S->ffn_down.row_bytes + 63) / 64 * 64 + 64;
        const muser_tensor *ms[] = {&S->attn_q, &S->attn_k, &S->attn_v, &S->attn_gate, &S->attn_output,
                                    &S->ffn_gate, &S->ffn_up, &S->ffn_down};
        for (size_t i = 0; i < sizeof ms / sizeof ms[0]; i++)
            if (ms[i]->data)
                wb += ms[i]->rows * ms[i]->row_bytes;
    }
    out->weight_bytes = wb;
    return MUSER_OK;
}

void muser_tp_shard_free(muser_model *shard)
{
    if (!shard)
        return;
    free(shard->layers);
    memset(shard, 0, sizeof *shard);
}

/* ---- the reduce --------------------------------------------------------------------------------- */

struct muser_tp_comm {
    uint32_t n;
    size_t max_count;
    pthread_barrier_t bar;
    bool bar_ok;               /* bar was initialised */
    float *slot[MUSER_TP_MAX]; /* each rank's buffer of the reduce in progress */
    size_t cnt[MUSER_TP_MAX];  /* and its count (a rank that failed before it passes none) */
    float *sum[MUSER_TP_MAX];  /* each rank's copy of the sum, [max_count] */
};

int muser_tp_comm_new(muser_tp_comm **out, uint32_t n, size_t max_count, muser_error *err)
{
    *out = NULL;
    if (n < 1 || n > MUSER_TP_MAX)
        return muser_errorf(err, MUSER_E_ARG, "tensor parallel: %u ranks (1 .. %u)", n, MUSER_TP_MAX);
    muser_tp_comm *c = calloc(1, sizeof *c);
    if (!c)
        return muser_errorf(err, MUSER_E_NOMEM, "tensor parallel: out of memory");
    c->n = n;
    c->max_count = max_count;
    for (uint32_t r = 0; r < n; r++)
        if (!(c->sum[r] = malloc(max_count * sizeof(float)))) {
            muser_tp_comm_free(c);
            return muser_errorf(err, MUSER_E_NOMEM, "tensor parallel: out of memory for the reduce");
        }
    if (pthread_barrier_init(&c->bar, NULL, n)) {
        muser_tp_comm_free(c);
        return muser_errorf(err, MUSER_E_BACKEND, "tensor parallel: no barrier");
    }
    c->bar_ok = true;
    *out = c;
    return MUSER_OK;
}

uint32_t muser_tp_comm_ranks(const muser_tp_comm *c) { return c ? c->n : 1; }

void muser_tp_comm_free(muser_tp_comm *c)
{
    if (!c)
        return;
    if (c->bar_ok)
        pthread_barrier_destroy(&c->bar);
    for (uint32_t r = 0; r < c->n; r++)
        free(c->sum[r]);
    free(c);
}

/* every rank passed a buffer of count (read between the barriers) */
static bool all_passed(const muser_tp_comm *c, size_t count)
{
    for (uint32_t r = 0; r < c->n; r++)
        if (!c->slot[r] || c->cnt[r] != count)
            return false;
    return true;
}

bool muser_tp_reduce(muser_tp_comm *c, uint32_t rank, float *buf, size_t count)
{
    if (c->n == 1)
        return true;
    c->slot[rank] = buf;
    c->cnt[rank] = buf ? count : 0;
    pthread_barrier_wait(&c->bar);
    if (!all_passed(c, count)) { /* every rank sees it, and leaves after the second barrier */
        pthread_barrier_wait(&c->bar);
        return false;
    }
    float *s = c->sum[rank];
    for (size_t i = 0; i < count; i++) {
        float v = c->slot[0][i];
        for (uint32_t r = 1; r < c->n; r++)
            v += c->slot[r][i];
        s[i] = v;
    }
    pthread_barrier_wait(&c->bar); /* nobody reads a slot after this */
    memcpy(buf, s, count * sizeof(float));
    return true;
}

bool muser_tp_gather(muser_tp_comm *c, uint32_t rank, const float *mine, uint32_t rows, size_t per, float *full)
{
    c->slot[rank] = (float *)mine;
    c->cnt[rank] = mine ? (size_t)rows * per : 0;
    if (c->n > 1)
        pthread_barrier_wait(&c->bar);
    if (!all_passed(c, (size_t)rows * per)) {
        if (c->n > 1)
            pthread_barrier_wait(&c->bar);
        return false;
    }
    for (uint32_t i = 0; i < rows; i++)
        for (uint32_t r = 0; r < c->n; r++)
            memcpy(full + ((size_t)i * c->n + r) * per, c->slot[r] + (size_t)i * per, per * sizeof(float));
    if (c->n > 1)
        pthread_barrier_wait(&c->bar); /* nobody reads a slot after this */
    return true;
}

/* ---- the split device: a device whose ranks hold the shards ------------------------------------- */

/* One call as every rank runs it (ranks 1..n−1 on threads started with the device, rank 0 on the
 * caller's): the prefill route or a step, the ops whose passes meet in the reduce. */
typedef enum { TP_FORWARD, TP_STEP } tp_op;

typedef struct tp_dev {
    uint32_t n;
    muser_model shard[MUSER_TP_MAX];
    muser_device *dev[MUSER_TP_MAX];
    muser_tp_comm *comm;
    void *nccl[MUSER_TP_MAX]; /* CUDA ranks on GPUs of their own: each rank's communicator */
    pthread_t th[MUSER_TP_MAX];
    uint32_t started;         /* threads running (rank 0 counts: the caller's) */
    pthread_mutex_t mu;
    pthread_cond_t go, done;
    uint64_t gen;             /* calls posted */
    uint32_t finished;        /* ranks done with the current call */
    bool quit;
    struct {                  /* the call in flight */
        tp_op op;
        /* TP_FORWARD */
        muser_session *s;
        const int32_t *tokens;
        uint32_t n;
        float *logits;
        bool all_logits;
        const muser_tap *tap;
        /* TP_STEP */
        const muser_step_rows *rows;
        float *const *out;
    } call;
    /* ranks 1..n−1 take the tap too, into these (unread): a rank's pass must be its peers', or
     * one rank's tapped graph or route meets another's plain one in the reduce */
    float *tap_buf[MUSER_TP_MAX];
    size_t tap_cap;           /* floats in each */
    int rc[MUSER_TP_MAX];
    muser_error err[MUSER_TP_MAX];
    muser_session *rseq[MUSER_TP_MAX][MUSER_STEP_MAX_ROWS]; /* a step's rows' sessions, per rank */
    struct tp_rank {
        struct tp_dev *t;
        uint32_t r;
    } rank[MUSER_TP_MAX];     /* each thread's argument */
} tp_dev;

/* A session of the split device: a session on each rank. Their n_past follow the split session's
 * (set before each call: session.c keeps the one that counts). */
typedef struct tp_seq {
    muser_session *s[MUSER_TP_MAX];
} tp_seq;

static muser_session *rank_seq(const muser_session *s, uint32_t r) { return ((tp_seq *)s->be_state)->s[r]; }

static void sync_past(const muser_session *s, uint32_t n)
{
    for (uint32_t r = 0; r < n; r++)
        rank_seq(s, r)->n_past = s->n_past;
}

/* Rank r's part of the call: rank 0 writes what the caller asked for, the others only their caches
 * (and a tap into their scratch, so that every rank runs the same passes). Whatever rank 0's calls
 * check beyond the others' (the draws, the top) session.c checked on the split call already, so no
 * rank refuses alone and leaves the others waiting in a reduce. */
static void rank_run(tp_dev *t, uint32_t r)
{
    muser_error *err = &t->err[r];
    memset(err, 0, sizeof *err);
    const bool lead = r == 0;
    const muser_tap *tap = t->call.op == TP_FORWARD ? t->call.tap : t->call.rows->tap;
    muser_tap own; /* a rank past the lead: the same layers into its scratch */
    if (tap && !lead) {
        own = *tap;
        own.out = t->tap_buf[r];
        tap = &own;
    }
    if (t->call.op == TP_FORWARD) {
        muser_session *s = rank_seq(t->call.s, r);
        float *logits = lead ? t->call.logits : NULL;
        t->rc[r] = t->call.all_logits
                       ? muser_session_forward(s, t->call.tokens, t->call.n, logits, true, err)
                       : muser_session_prefill_tap(s, t->call.tokens, t->call.n, logits, tap, err);
        return;
    }
    const muser_step_rows *rows = t->call.rows;
    t->rc[r] = muser_step_out(t->dev[r], t->rseq[r], rows->tokens, rows->n, lead ? t->call.out : NULL,
                              lead ? rows->draw : NULL, lead ? rows->top : NULL, tap, err);
}

static void *rank_main(void *arg)
{
    tp_dev *t = ((struct tp_rank *)arg)->t;
    const uint32_t r = ((struct tp_rank *)arg)->r;
    uint64_t seen = 0;
    for (;;) {
        pthread_mutex_lock(&t->mu);
        while (!t->quit && t->gen == seen)
            pthread_cond_wait(&t->go, &t->mu);
        if (t->quit) {
            pthread_mutex_unlock(&t->mu);
            return NULL;
        }
        seen = t->gen;
        pthread_mutex_unlock(&t->mu);
        rank_run(t, r);
        pthread_mutex_lock(&t->mu);
        t->finished++;
        pthread_cond_signal(&t->done);
        pthread_mutex_unlock(&t->mu);
    }
}

/* The scratch of ranks 1..n−1 for a tap of rows rows (tap NULL: none needed) */
static int tap_scratch(tp_dev *t, const muser_tap *tap, uint32_t rows, muser_error *err)
{
    const size_t need = tap ? (size_t)rows * tap->n_layers * t->shard[0].hp.n_embd : 0;
    if (need <= t->tap_cap)
        return MUSER_OK;
    for (uint32_t r = 1; r < t->n; r++) {
        float *b = realloc(t->tap_buf[r], need * sizeof(float));
        if (!b)
            return muser_errorf(err, MUSER_E_NOMEM, "tensor parallel: out of memory for a rank's tap");
        t->tap_buf[r] = b;
    }
    t->tap_cap = need;
    return MUSER_OK;
}

/* The call in t->call on every rank at once; the first failing rank's error is the call's (the ranks
 * fail alike: they see the same rows and hold the same residual and logits). */
static int run_all(tp_dev *t, muser_error *err)
{
    pthread_mutex_lock(&t->mu);
    t->finished = 0;
    t->gen++;
    pthread_cond_broadcast(&t->go);
    pthread_mutex_unlock(&t->mu);
    rank_run(t, 0);
    pthread_mutex_lock(&t->mu);
    while (t->finished < t->n - 1)
        pthread_cond_wait(&t->done, &t->mu);
    pthread_mutex_unlock(&t->mu);
    for (uint32_t r = 0; r < t->n; r++)
        if (t->rc[r]) {
            if (err)
                *err = t->err[r];
            return t->rc[r];
        }
    return MUSER_OK;
}

static void tp_dev_free(muser_device *d)
{
    tp_dev *t = d->be_state;
    if (!t)
        return;
    pthread_mutex_lock(&t->mu);
    t->quit = true;
    pthread_cond_broadcast(&t->go);
    pthread_mutex_unlock(&t->mu);
    for (uint32_t r = 1; r < t->started; r++)
        pthread_join(t->th[r], NULL);
    for (uint32_t r = 0; r < t->n; r++) {
        muser_device_free(t->dev[r]);
        muser_tp_shard_free(&t->shard[r]);
#ifdef MUSER_HAVE_CUDA
        muser_cuda_tp_comm_free(t->nccl[r]);
#endif
    }
    muser_tp_comm_free(t->comm);
    for (uint32_t r = 0; r < t->n; r++)
        free(t->tap_buf[r]);
    pthread_mutex_destroy(&t->mu);
    pthread_cond_destroy(&t->go);
    pthread_cond_destroy(&t->done);
    free(t);
    d->be_state = NULL;
}

static int tp_dev_init(muser_device *d, muser_error *err)
{
    const muser_model *m = d->model;
    const uint32_t n = d->opts.tp_ranks;
    int rc = muser_tp_check(m, n, err);
    if (rc)
        return rc;
    tp_dev *t = calloc(1, sizeof *t);
    if (!t)
        return muser_errorf(err, MUSER_E_NOMEM, "tensor parallel: out of memory");
    t->n = n;
    t->started = 1;
    pthread_mutex_init(&t->mu, NULL);
    pthread_cond_init(&t->go, NULL);
    pthread_cond_init(&t->done, NULL);
    d->be_state = t;
    /* a reduce carries FWD_SUB: a pass's rows × E (a pass holds at most a chunk or a step) */
    const uint32_t rows = d->opts.max_batch > MUSER_STEP_MAX_ROWS ? d->opts.max_batch : MUSER_STEP_MAX_ROWS;
    rc = muser_tp_comm_new(&t->comm, n, (size_t)rows * m->hp.n_embd, err);
    /* CUDA: rank r on GPU opts.device + r through NCCL where the host has them, else (when the
     * caller lets them) every rank on opts.device, reducing through the host: a test configuration */
    bool gpus = false;
    const int first = d->opts.device > 0 ? d->opts.device : 0;
#ifdef MUSER_HAVE_CUDA
    if (!rc && d->opts.backend == MUSER_BACKEND_CUDA) {
        const int have = muser_cuda_device_count();
        gpus = have >= first + (int)n;
        if (gpus)
            rc = muser_cuda_tp_comms_new(first, n, t->nccl, err);
        else if (!d->opts.tp_share_gpu)
            rc = muser_errorf(err, MUSER_E_ARG, "tensor parallel: %u ranks from GPU %d need GPUs %d..%d, this host has %d",
                              n, first, first, first + (int)n - 1, have);
        else
            fprintf(stderr, "muser: tensor parallel: %u ranks share GPU %d (fewer GPUs than ranks): they reduce "
                            "through the host, a test configuration, not a fast one\n", n, d->opts.device);
    }
#endif
    for (uint32_t r = 0; !rc && r < n; r++) {
        rc = muser_tp_shard(m, n, r, &t->shard[r], err);
        muser_session_opts ro = d->opts;
        ro.tp_ranks = 0;
        ro.tp = t->comm;
        ro.tp_rank = r;
        ro.tp_nccl = t->nccl[r];
        if (gpus)
            ro.device = first + (int)r;
        if (!rc)
            rc = muser_device_new(&t->dev[r], &t->shard[r], &ro, err);
    }
    for (uint32_t r = 1; !rc && r < n; r++) {
        t->rank[r].t = t;
        t->rank[r].r = r;
        if (pthread_create(&t->th[r], NULL, rank_main, &t->rank[r])) {
            rc = muser_errorf(err, MUSER_E_BACKEND, "tensor parallel: cannot start rank %u's thread", r);
            break;
        }
        t->started = r + 1;
    }
    if (rc) {
        tp_dev_free(d);
        return rc;
    }
    /* what the engine plans with: rank 0's figures (the ranks are alike), a rank's chunks whole */
    d->max_rows = t->dev[0]->max_rows;
    d->prefill_rows = t->dev[0]->prefill_rows;
    d->part_rows = 0;
    memcpy(d->pass_cost, t->dev[0]->pass_cost, sizeof d->pass_cost);
    return MUSER_OK;
}

static void tp_free(muser_session *s)
{
    tp_seq *q = s->be_state;
    if (!q)
        return;
    const tp_dev *t = s->dev->be_state;
    for (uint32_t r = 0; r < t->n; r++)
        muser_session_free(q->s[r]);
    free(q);
    s->be_state = NULL;
}

static int tp_init(muser_session *s, muser_error *err)
{
    const tp_dev *t = s->dev->be_state;
    tp_seq *q = calloc(1, sizeof *q);
    if (!q)
        return muser_errorf(err, MUSER_E_NOMEM, "tensor parallel: out of memory");
    s->be_state = q;
    for (uint32_t r = 0; r < t->n; r++) {
        const int rc = muser_session_open(&q->s[r], t->dev[r], s->opts.n_ctx, err);
        if (rc) {
            tp_free(s);
            return rc;
        }
    }
    return MUSER_OK;
}

static int tp_forward_tap(muser_session *s, const int32_t *tokens, uint32_t n, float *logits, bool all_logits,
                          const muser_tap *tap, muser_error *err)
{
    tp_dev *t = s->dev->be_state;
    /* refused here, not on rank 0 alone: the others would wait in the reduce for it */
    if (tap && !t->dev[0]->be->forward_tap)
        return muser_errorf(err, MUSER_E_UNSUPPORTED, "the %s backend has no hidden-state tap on the prefill route",
                            t->dev[0]->be->name);
    const int rc = tap_scratch(t, tap, n, err);
    if (rc)
        return rc;
    sync_past(s, t->n);
    t->call.op = TP_FORWARD;
    t->call.s = s;
    t->call.tokens = tokens;
    t->call.n = n;
    t->call.logits = logits;
    t->call.all_logits = all_logits;
    t->call.tap = tap;
    return run_all(t, err);
}

static int tp_forward(muser_session *s, const int32_t *tokens, uint32_t n, float *logits, bool all_logits,
                      muser_error *err)
{
    return tp_forward_tap(s, tokens, n, logits, all_logits, NULL, err);
}

static int tp_step(muser_device *d, const muser_step_rows *rows, float *logits, muser_error *err)
{
    tp_dev *t = d->be_state;
    const int rc = tap_scratch(t, rows->tap, rows->n, err);
    if (rc)
        return rc;
    float *out[MUSER_STEP_MAX_ROWS];
    for (uint32_t i = 0; i < rows->n; i++) {
        out[i] = muser_row_dst(rows, logits, i, d->model->hp.n_vocab);
        sync_past(rows->seq[i], t->n);
        for (uint32_t r = 0; r < t->n; r++)
            t->rseq[r][i] = rank_seq(rows->seq[i], r);
    }
    t->call.op = TP_STEP;
    t->call.rows = rows;
    t->call.out = out;
    return run_all(t, err);
}

/* The calls without a pass run rank by rank on the caller's thread. */
static int tp_checkpoint(muser_session *s, muser_error *err)
{
    const tp_dev *t = s->dev->be_state;
    sync_past(s, t->n);
    int rc = MUSER_OK;
    for (uint32_t r = 0; r < t->n && !rc; r++)
        rc = muser_session_checkpoint(rank_seq(s, r), err);
    return rc;
}

static int tp_rollback(muser_session *s, uint64_t n_keep, muser_error *err)
{
    const tp_dev *t = s->dev->be_state;
    sync_past(s, t->n);
    int rc = MUSER_OK;
    for (uint32_t r = 0; r < t->n && !rc; r++)
        rc = muser_session_rollback(rank_seq(s, r), n_keep, err);
    return rc;
}

static void tp_commit(muser_session *s)
{
    const tp_dev *t = s->dev->be_state;
    for (uint32_t r = 0; r < t->n; r++)
        muser_session_commit(rank_seq(s, r));
}

static void tp_reset(muser_session *s)
{
    const tp_dev *t = s->dev->be_state;
    for (uint32_t r = 0; r < t->n; r++)
        muser_session_reset(rank_seq(s, r));
}

static int tp_kv_copy(muser_session *dst, const muser_session *src, muser_error *err)
{
    const tp_dev *t = dst->dev->be_state;
    sync_past(src, t->n);
    int rc = MUSER_OK;
    for (uint32_t r = 0; r < t->n && !rc; r++)
        rc = muser_session_copy(rank_seq(dst, r), rank_seq(src, r), err);
    return rc;
}

/* Whole K/V rows [n][HKV·D] and rank r's [n][w = HKV/N·D]: its heads are the r-th slice of a row. */
static void rows_put(uint16_t *whole, const uint16_t *part, uint64_t n, size_t w, uint32_t r, uint32_t ranks)
{
    for (uint64_t i = 0; i < n; i++)
        memcpy(whole + (i * ranks + r) * w, part + i * w, w * sizeof(uint16_t));
}

static void rows_take(uint16_t *part, const uint16_t *whole, uint64_t n, size_t w, uint32_t r, uint32_t ranks)
{
    for (uint64_t i = 0; i < n; i++)
        memcpy(part + i * w, whole + (i * ranks + r) * w, w * sizeof(uint16_t));
}

static int tp_kv_rows(const muser_session *s, uint32_t l, uint64_t pos0, uint32_t n, uint16_t *k, uint16_t *v,
                      muser_error *err)
{
    const tp_dev *t = s->dev->be_state;
    sync_past(s, t->n);
    const size_t w = (size_t)t->shard[0].hp.n_head_kv * t->shard[0].hp.head_dim;
    uint16_t *pk = malloc((size_t)n * w * sizeof(uint16_t)), *pv = malloc((size_t)n * w * sizeof(uint16_t));
    int rc = pk && pv ? MUSER_OK : muser_errorf(err, MUSER_E_NOMEM, "tensor parallel: out of memory for KV rows");
    for (uint32_t r = 0; r < t->n && !rc; r++) {
        rc = muser_session_kv_rows(rank_seq(s, r), l, pos0, n, pk, pv, err);
        if (!rc) {
            rows_put(k, pk, n, w, r, t->n);
            rows_put(v, pv, n, w, r, t->n);
        }
    }
    free(pk);
    free(pv);
    return rc;
}

static int tp_kv_import(muser_session *s, uint32_t l, const kv_plane *meta, uint64_t pos0, uint32_t n,
                        const uint16_t *k, const uint16_t *v, muser_error *err)
{
    const tp_dev *t = s->dev->be_state;
    const size_t w = (size_t)t->shard[0].hp.n_head_kv * t->shard[0].hp.head_dim;
    uint16_t *pk = n ? malloc((size_t)n * w * sizeof(uint16_t)) : NULL;
    uint16_t *pv = n ? malloc((size_t)n * w * sizeof(uint16_t)) : NULL;
    int rc = !n || (pk && pv) ? MUSER_OK : muser_errorf(err, MUSER_E_NOMEM, "tensor parallel: out of memory for KV rows");
    for (uint32_t r = 0; r < t->n && !rc; r++) {
        muser_session *rs = rank_seq(s, r);
        kv_plane rm; /* the rank's shape of the same positions */
        kv_plane_shape(&rm, &t->shard[r].hp, l, rs->opts.n_ctx);
        kv_plane_meta_after(&rm, meta->next_pos);
        if (n) {
            rows_take(pk, k, n, w, r, t->n);
            rows_take(pv, v, n, w, r, t->n);
        }
        rc = rs->be->kv_import(rs, l, &rm, pos0, n, pk, pv, err);
    }
    free(pk);
    free(pv);
    return rc;
}

/* Layer l's plane as one device's: a ring's rows [capacity][HKV·D] joined from the ranks' slices, a
 * FULL plane's heads [HKV][capacity][D] the ranks' heads one after another. */
static int tp_kv_export(const muser_session *s, uint32_t l, kv_plane *meta, uint16_t *k, uint16_t *v, muser_error *err)
{
    const tp_dev *t = s->dev->be_state;
    const muser_hparams *hp = &t->shard[0].hp;
    const muser_session *r0 = rank_seq(s, 0);
    const uint64_t most = hp->swa_window > r0->opts.n_ctx ? hp->swa_window : r0->opts.n_ctx;
    const size_t w = (size_t)hp->n_head_kv * hp->head_dim, part = most * w;
    uint16_t *pk = malloc(part * sizeof(uint16_t)), *pv = malloc(part * sizeof(uint16_t));
    int rc = pk && pv ? MUSER_OK : muser_errorf(err, MUSER_E_NOMEM, "tensor parallel: out of memory for a plane");
    for (uint32_t r = 0; r < t->n && !rc; r++) {
        const muser_session *rs = rank_seq(s, r);
        rc = rs->be->kv_export(rs, l, meta, pk, pv, err);
        if (rc)
            break;
        if (meta->ring) {
            rows_put(k, pk, meta->capacity, w, r, t->n);
            rows_put(v, pv, meta->capacity, w, r, t->n);
        } else {
            memcpy(k + (size_t)r * meta->capacity * w, pk, meta->capacity * w * sizeof(uint16_t));
            memcpy(v + (size_t)r * meta->capacity * w, pv, meta->capacity * w * sizeof(uint16_t));
        }
    }
    meta->n_head_kv = hp->n_head_kv * t->n;
    free(pk);
    free(pv);
    return rc;
}

static const muser_backend split_backend = {
    .name = "split",
    .dev_init = tp_dev_init,
    .dev_free = tp_dev_free,
    .init = tp_init,
    .free = tp_free,
    .forward = tp_forward,
    .step = tp_step,
    .checkpoint = tp_checkpoint,
    .rollback = tp_rollback,
    .commit = tp_commit,
    .reset = tp_reset,
    .kv_export = tp_kv_export,
    .kv_copy = tp_kv_copy,
    .kv_rows = tp_kv_rows,
    .kv_import = tp_kv_import,
    .forward_tap = tp_forward_tap,
    .forward_part = NULL,
};

const muser_backend *muser_backend_split(void) { return &split_backend; }

muser_session *muser_tp_rank_session(const muser_session *s, uint32_t r)
{
    if (!s || s->be != &split_backend)
        return NULL;
    const tp_dev *t = s->dev->be_state;
    return r < t->n ? rank_seq(s, r) : NULL;
}
