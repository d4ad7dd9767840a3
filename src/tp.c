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

void muser_tp_reduce(muser_tp_comm *c, uint32_t rank, float *buf, size_t count)
{
    if (c->n == 1)
        return;
    c->slot[rank] = buf;
    pthread_barrier_wait(&c->bar);
    float *s = c->sum[rank];
    for (size_t i = 0; i < count; i++) {
        float v = c->slot[0][i];
        for (uint32_t r = 1; r < c->n; r++)
            v += c->slot[r][i];
        s[i] = v;
    }
    pthread_barrier_wait(&c->bar); /* nobody reads a slot after this */
    memcpy(buf, s, count * sizeof(float));
}

void muser_tp_gather(muser_tp_comm *c, uint32_t rank, const float *mine, uint32_t rows, size_t per, float *full)
{
    c->slot[rank] = (float *)mine;
    if (c->n > 1)
        pthread_barrier_wait(&c->bar);
    for (uint32_t i = 0; i < rows; i++)
        for (uint32_t r = 0; r < c->n; r++)
            memcpy(full + ((size_t)i * c->n + r) * per, c->slot[r] + (size_t)i * per, per * sizeof(float));
    if (c->n > 1)
        pthread_barrier_wait(&c->bar); /* nobody reads a slot after this */
}

/* ---- a group of CPU ranks ----------------------------------------------------------------------- */

/* One call, as every rank runs it. */
typedef struct tp_call {
    const int32_t *tokens;
    uint32_t n;
    bool step;
} tp_call;

struct muser_tp_group {
    uint32_t n;
    muser_model shard[MUSER_TP_MAX];
    muser_device *dev[MUSER_TP_MAX];
    muser_session *s[MUSER_TP_MAX];
    muser_tp_comm *comm;
    void *nccl[MUSER_TP_MAX];  /* CUDA ranks on GPUs of their own: each rank's communicator */
    float *scratch; /* [n][V] each rank's logits */
    /* ranks 1..n−1 run on their own threads, started once, woken per call (rank 0: the caller's) */
    pthread_t th[MUSER_TP_MAX];
    uint32_t started;           /* threads running */
    pthread_mutex_t mu;
    pthread_cond_t go, done;
    uint64_t gen;               /* calls posted */
    uint32_t finished;          /* ranks done with the current call */
    bool quit;
    tp_call call;
    int rc[MUSER_TP_MAX];
    muser_error err[MUSER_TP_MAX];
    struct tp_rank {
        muser_tp_group *g;
        uint32_t r;
    } rank[MUSER_TP_MAX]; /* each thread's argument */
};

static void tp_rank_run(muser_tp_group *g, uint32_t r)
{
    muser_session *s = g->s[r];
    float *logits = g->scratch + (size_t)r * g->shard[0].hp.n_vocab;
    memset(&g->err[r], 0, sizeof g->err[r]);
    if (g->call.step)
        g->rc[r] = muser_step(g->dev[r], &s, g->call.tokens, 1, logits, NULL, NULL, &g->err[r]);
    else
        g->rc[r] = muser_session_prefill(s, g->call.tokens, g->call.n, logits, &g->err[r]);
}

static void *tp_rank_main(void *arg)
{
    muser_tp_group *g = ((struct tp_rank *)arg)->g;
    const uint32_t r = ((struct tp_rank *)arg)->r;
    uint64_t seen = 0;
    for (;;) {
        pthread_mutex_lock(&g->mu);
        while (!g->quit && g->gen == seen)
            pthread_cond_wait(&g->go, &g->mu);
        if (g->quit) {
            pthread_mutex_unlock(&g->mu);
            return NULL;
        }
        seen = g->gen;
        pthread_mutex_unlock(&g->mu);
        tp_rank_run(g, r);
        pthread_mutex_lock(&g->mu);
        g->finished++;
        pthread_cond_signal(&g->done);
        pthread_mutex_unlock(&g->mu);
    }
}

void muser_tp_group_free(muser_tp_group *g)
{
    if (!g)
        return;
    pthread_mutex_lock(&g->mu);
    g->quit = true;
    pthread_cond_broadcast(&g->go);
    pthread_mutex_unlock(&g->mu);
    for (uint32_t r = 1; r < g->started; r++)
        pthread_join(g->th[r], NULL);
    for (uint32_t r = 0; r < g->n; r++) {
        muser_session_free(g->s[r]);
        muser_device_free(g->dev[r]);
        muser_tp_shard_free(&g->shard[r]);
#ifdef MUSER_HAVE_CUDA
        muser_cuda_tp_comm_free(g->nccl[r]);
#endif
    }
    muser_tp_comm_free(g->comm);
    free(g->scratch);
    pthread_mutex_destroy(&g->mu);
    pthread_cond_destroy(&g->go);
    pthread_cond_destroy(&g->done);
    free(g);
}

int muser_tp_group_new(muser_tp_group **out, const muser_model *m, uint32_t n, const muser_session_opts *o,
                       muser_error *err)
{
    *out = NULL;
    muser_session_opts opts;
    if (o)
        opts = *o;
    else
        memset(&opts, 0, sizeof opts);
    if (opts.backend == MUSER_BACKEND_ORACLE)
        return muser_errorf(err, MUSER_E_UNSUPPORTED, "tensor parallel: ranks run on the cpu or cuda backend");
    int rc = muser_tp_check(m, n, err);
    if (rc)
        return rc;
    muser_tp_group *g = calloc(1, sizeof *g);
    if (!g)
        return muser_errorf(err, MUSER_E_NOMEM, "tensor parallel: out of memory");
    g->n = n;
    g->started = 1;
    pthread_mutex_init(&g->mu, NULL);
    pthread_cond_init(&g->go, NULL);
    pthread_cond_init(&g->done, NULL);
    const uint32_t rows = opts.max_batch ? opts.max_batch : 512;
    /* a reduce carries FWD_SUB: a pass's rows × E (a pass holds at most a chunk or a step) */
    rc = muser_tp_comm_new(&g->comm, n, (size_t)(rows > MUSER_STEP_MAX_ROWS ? rows : MUSER_STEP_MAX_ROWS) * m->hp.n_embd, err);
    if (!rc && !(g->scratch = malloc((size_t)n * m->hp.n_vocab * sizeof(float))))
        rc = muser_errorf(err, MUSER_E_NOMEM, "tensor parallel: out of memory for the logits");
    /* CUDA: rank r on GPU r through NCCL where the host has n GPUs, else every rank on opts.device,
     * reducing through the host (a test configuration: no graphs, a wait mid-pass) */
    bool gpus = false;
#ifdef MUSER_HAVE_CUDA
    if (!rc && opts.backend == MUSER_BACKEND_CUDA && n > 1) {
        const int have = muser_cuda_device_count();
        gpus = have >= (int)n;
        if (gpus)
            rc = muser_cuda_tp_comms_new(n, g->nccl, err);
        else if (!opts.tp_share_gpu)
            rc = muser_errorf(err, MUSER_E_ARG, "tensor parallel: %u ranks need %u GPUs, this host has %d", n, n, have);
        else
            fprintf(stderr, "muser: tensor parallel: %u ranks share GPU %d (fewer GPUs than ranks): they reduce "
                            "through the host, a test configuration, not a fast one\n", n, opts.device);
    }
#endif
    for (uint32_t r = 0; !rc && r < n; r++) {
        rc = muser_tp_shard(m, n, r, &g->shard[r], err);
        muser_session_opts ro = opts;
        ro.tp = g->comm;
        ro.tp_rank = r;
        ro.tp_nccl = g->nccl[r];
        if (gpus)
            ro.device = (int)r;
        if (!rc)
            rc = muser_device_new(&g->dev[r], &g->shard[r], &ro, err);
        if (!rc)
            rc = muser_session_open(&g->s[r], g->dev[r], 0, err);
    }
    for (uint32_t r = 1; !rc && r < n; r++) {
        g->rank[r].g = g;
        g->rank[r].r = r;
        if (pthread_create(&g->th[r], NULL, tp_rank_main, &g->rank[r])) {
            rc = muser_errorf(err, MUSER_E_BACKEND, "tensor parallel: cannot start rank %u's thread", r);
            break;
        }
        g->started = r + 1;
    }
    if (rc) {
        muser_tp_group_free(g);
        return rc;
    }
    *out = g;
    return MUSER_OK;
}

muser_session *muser_tp_session(muser_tp_group *g, uint32_t r) { return r < g->n ? g->s[r] : NULL; }

void muser_tp_reset(muser_tp_group *g)
{
    for (uint32_t r = 0; r < g->n; r++)
        muser_session_reset(g->s[r]);
}

/* Every rank runs the same call (rank 0 on the caller's thread, the others woken on theirs); the
 * first failing rank's error is the call's. The ranks fail alike: they see the same positions and
 * tokens, and hold the same residual and logits. */
static int tp_run(muser_tp_group *g, const int32_t *tokens, uint32_t n, bool step, float *logits, muser_error *err)
{
    pthread_mutex_lock(&g->mu);
    g->call = (tp_call){tokens, n, step};
    g->finished = 0;
    g->gen++;
    pthread_cond_broadcast(&g->go);
    pthread_mutex_unlock(&g->mu);
    tp_rank_run(g, 0);
    pthread_mutex_lock(&g->mu);
    while (g->finished < g->n - 1)
        pthread_cond_wait(&g->done, &g->mu);
    pthread_mutex_unlock(&g->mu);
    for (uint32_t r = 0; r < g->n; r++)
        if (g->rc[r]) {
            if (err)
                *err = g->err[r];
            return g->rc[r];
        }
    /* every rank holds the same residual, so the same logits: anything else is a broken split */
    const size_t V = g->shard[0].hp.n_vocab;
    for (uint32_t r = 1; r < g->n; r++)
        if (memcmp(g->scratch + r * V, g->scratch, V * sizeof(float)))
            return muser_errorf(err, MUSER_E_NUMERIC, "tensor parallel: rank %u's logits differ from rank 0's", r);
    if (logits)
        memcpy(logits, g->scratch, V * sizeof(float));
    return MUSER_OK;
}

int muser_tp_prefill(muser_tp_group *g, const int32_t *tokens, uint32_t n, float *logits, muser_error *err)
{
    return tp_run(g, tokens, n, false, logits, err);
}

int muser_tp_step(muser_tp_group *g, int32_t token, float *logits, muser_error *err)
{
    return tp_run(g, &token, 1, true, logits, err);
}
