/* engine.c — the engine of engine.h: one worker thread owns the device and runs every pass;
 * callers enqueue requests and sleep on their own condition until the worker finishes them.
 *
 * Scheduling, each time the worker looks for work (under the engine's lock):
 *   1. sequences cancelled since the last pass are freed (their requests fail MUSER_E_CANCELLED);
 *   2. if decode requests wait: once the oldest has waited batch_window_us (or the step is full,
 *      or nothing else can arrive because no other open sequence is idle-decoding), they run as
 *      one small-batch pass; a row past its context fails alone before the pass, a pass that
 *      fails on a non-finite row reruns its rows one by one so only that row fails;
 *   3. else the oldest prefill request runs its next chunk: on a device that runs chunks in parts
 *      of layers (session.h, muser_session_prefill_begin), the next part of its open chunk (one of
 *      prefill_chunk rows), as long as ENGINE_PART_SHARE of a decode pass while any other open
 *      sequence is decoding, the whole rest otherwise; on one that does not, a whole chunk,
 *      contended_chunk rows while another sequence decodes; so a decode step that arrives waits
 *      for at most one part (or contended chunk), and decode passes and prefill passes alternate
 *      while both wait;
 *   4. else the worker sleeps until a request arrives.
 * The lock is dropped while a pass runs; the pass touches only its sequences' sessions, which no
 * caller touches while its request is queued. */
#include "engine.h"

#include "util.h"

#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define ENGINE_DEFAULT_WINDOW_US 250u
#define ENGINE_DEFAULT_CHUNK 512u
#define ENGINE_DEFAULT_CONTENDED 64u
#define ENGINE_DEFAULT_MAX_SEQS 256u
/* a contended part of a chunk in parts: about this share of the last decode pass, so that a decode
 * step during a long prompt takes about 1.75 idle steps (below 2, with room for a part's spread),
 * while the prompt still gets more than a third of the device */
#define ENGINE_PART_SHARE 0.75

typedef enum { REQ_NONE, REQ_DECODE, REQ_PREFILL, REQ_ROLLBACK, REQ_COPY } req_kind;
/* A decode request's rows as a speculative block: none, a new block (muser_seq_verify: checkpoint
 * first), or more rows of the open one (muser_seq_draft: a checkpoint only when none is open). */
enum { BLOCK_NONE, BLOCK_NEW, BLOCK_EXTEND };

struct muser_seq {
    muser_engine *e;
    uint64_t id;
    uint64_t n_ctx, kv_bytes;
    uint32_t open_waited;      /* passes that ended while its open waited (muser_seq_open_waited) */
    muser_session *s;          /* NULL once freed (cancelled) */
    bool cancelled, freed, decoding;
    uint64_t pos;              /* tokens held, as of the last pass (read under the lock) */
    double t_done, turn, dev;  /* decode: when its last step's pass ended; how long its caller takes to
                                * come back with the next, and how much that varies (running means;
                                * 0: not known yet) */
    /* the request in flight (one per sequence) */
    req_kind req;
    const int32_t *tokens;
    uint32_t n, done;          /* prefill: rows done so far */
    uint32_t part_rows;        /* prefill: the rows of its chunk open in parts (0: none open) */
    int32_t token;             /* a one-row decode's token (tokens points here) */
    int block;                 /* decode rows of a speculative block (BLOCK_*): checkpoint first */
    uint32_t block_rows;       /* rows of the block open since the last checkpoint (0: none open) */
    const muser_tap *tap;      /* the request's hidden-state tap (out [n][n_layers][E]); NULL none */
    uint64_t n_keep;           /* rollback */
    muser_seq *copy_src;       /* copy: the sequence whose cache this one takes */
    float *logits;
    const muser_top *top;      /* the request's rows' best logits out (NULL: none) */
    muser_draw *draw;          /* a one-row decode's draw (NULL: none; logits then its fallback row) */
    double t_submit;
    int rc;
    muser_error err;
    bool finished;
    pthread_cond_t cv;         /* the caller waits here */
    muser_seq *next;           /* in the engine's list of open sequences */
};

struct muser_engine {
    muser_device *d;
    muser_engine_opts o;
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t work;       /* the worker waits here */
    bool stop;
    bool in_pass;              /* a pass runs (the lock is dropped): sessions are not opened then */
    uint32_t n_opening;        /* callers waiting to open a session: the next pass waits for them */
    pthread_cond_t idle;       /* signalled when a pass ends */
    muser_seq **cand;          /* [max_seqs] decode candidates */
    muser_seq *seqs;           /* open sequences, newest first */
    uint64_t next_id;
    uint32_t n_open;
    uint64_t kv_reserved;
    muser_pass_rec log[MUSER_ENGINE_LOG];
    uint64_t n_passes, decode_passes, decode_rows, prefill_rows;
    double busy_s;
    double last_decode_s;      /* the last decode pass's time: the window and a contended chunk scale with it */
    double t_free;             /* when the last pass ended */
    double prefill_row_s;      /* time per row of the last prefill chunk */
    /* the chunk open in parts: its sequences (their rows in order) and the rows it carries */
    muser_seq *part[MUSER_PREFILL_MAX_SEQS];
    uint32_t part_n;           /* its sequences (0: none open) */
    muser_session **part_ss;   /* [d->part_rows] each row's session, for muser_prefill_begin */
    int32_t *part_tok;         /* [d->part_rows] */
    uint32_t solo_chunks;      /* chunks to open with one prompt each: a shared one failed on a
                                * non-finite logit, so whose it was shows alone */
    double part_layer_s;       /* time per layer of the last part */
    uint32_t part_layer_rows;  /* the rows of the chunk that part was of */
    bool prefill_turn;         /* a decode pass ran since the last prefill chunk */
    float *scratch;            /* [MUSER_STEP_MAX_ROWS][V] a step's logits */
    float *tap_scratch;        /* [MUSER_STEP_MAX_ROWS][MUSER_TAP_MAX_LAYERS][E] a step's tapped rows;
                                * made at the first tapped request */
};

/* A pass into the log; a prefill's layers [l0, l1) of its chunk, whose rows count once it is done. */
static void log_pass(muser_engine *e, muser_pass_kind kind, uint32_t rows, uint32_t seqs, uint32_t waiting,
                     uint64_t first, double t0, double t1, uint32_t l0, uint32_t l1)
{
    muser_pass_rec *r = &e->log[e->n_passes % MUSER_ENGINE_LOG];
    r->layer0 = l0;
    r->layer1 = l1;
    r->index = e->n_passes++;
    r->kind = kind;
    r->rows = rows;
    r->seqs = seqs;
    r->waiting_decoders = waiting;
    r->first_seq = first;
    r->t_start = t0;
    r->t_end = t1;
    e->busy_s += t1 - t0;
    e->t_free = t1;
    if (kind == MUSER_PASS_DECODE) e->decode_rows += rows, e->decode_passes++;
    else if (l1 == e->d->model->hp.n_layer) e->prefill_rows += rows;
}

static void finish(muser_seq *q, int rc)
{
    q->rc = rc;
    q->finished = true;
    q->req = REQ_NONE;
    pthread_cond_signal(&q->cv);
}

static void fail(muser_seq *q, int rc, const muser_error *err)
{
    if (err) q->err = *err;
    else muser_errorf(&q->err, (muser_status)rc, "sequence %llu was cancelled", (unsigned long long)q->id);
    finish(q, rc);
}

/* Under the lock: free cancelled sequences' sessions (outside the pass, so nothing runs on them). */
static void reap(muser_engine *e)
{
    for (muser_seq *q = e->seqs; q; q = q->next)
        if (q->cancelled && !q->freed && !q->part_rows) { /* (one in the open chunk: when the chunk ends) */
            if (q->req != REQ_NONE) fail(q, MUSER_E_CANCELLED, NULL);
            muser_session_free(q->s);
            q->s = NULL;
            q->freed = true;
            q->decoding = false;
            e->kv_reserved -= q->kv_bytes;
            pthread_cond_broadcast(&q->cv); /* muser_engine_close waits for this */
        }
}

static uint32_t count_decodes(const muser_engine *e, double *oldest, uint32_t *idle_decoders)
{
    uint32_t n = 0;
    *oldest = 0;
    *idle_decoders = 0;
    for (const muser_seq *q = e->seqs; q; q = q->next) {
        if (q->freed) continue;
        if (q->req == REQ_DECODE) {
            if (!n || q->t_submit < *oldest) *oldest = q->t_submit;
            n++;
        } else if (q->req == REQ_NONE && q->decoding) {
            (*idle_decoders)++; /* may submit its next step within the window */
        }
    }
    return n;
}

/* Another sequence decodes (a step of its waits, or it may submit one): a prompt's chunks stay
 * short for its sake. The prompt's own sequence does not count (a chat's next turn). */
static bool others_decoding(const muser_engine *e, const muser_seq *self)
{
    for (const muser_seq *q = e->seqs; q; q = q->next)
        if (q != self && !q->part_rows && !q->freed && (q->req == REQ_DECODE || q->decoding)) return true;
    return false;
}

/* One small-batch pass over the waiting decode and verify requests (oldest first; a request's rows
 * stay together), the lock dropped. A verify request's session is checkpointed first (SPEC §3), as
 * is a draft row's that opens a block, so a later rollback can drop its rejected rows. */
static void run_decode(muser_engine *e)
{
    const uint32_t cap = e->d->max_rows;
    uint32_t m = 0;
    for (muser_seq *q = e->seqs; q; q = q->next)
        if (!q->freed && q->req == REQ_DECODE) {
            if (q->s->n_past + q->n > q->s->opts.n_ctx) { /* fails alone, before the pass */
                muser_error er;
                muser_errorf(&er, MUSER_E_CONTEXT_FULL, "sequence %llu: %u rows do not fit its context of %llu",
                             (unsigned long long)q->id, q->n, (unsigned long long)q->s->opts.n_ctx);
                fail(q, MUSER_E_CONTEXT_FULL, &er);
                continue;
            }
            /* insertion by submit time: the oldest first */
            uint32_t at = m++;
            while (at > 0 && e->cand[at - 1]->t_submit > q->t_submit) {
                e->cand[at] = e->cand[at - 1];
                at--;
            }
            e->cand[at] = q;
        }
    muser_seq *reqs[MUSER_STEP_MAX_ROWS];
    uint32_t first[MUSER_STEP_MAX_ROWS + 1], nr = 0, n = 0;
    muser_session *ss[MUSER_STEP_MAX_ROWS];
    int32_t tok[MUSER_STEP_MAX_ROWS];
    const muser_tap *tap = NULL; /* the pass's: the oldest tapped request's layers; other layer lists wait */
    for (uint32_t i = 0; i < m; i++) { /* requests that fit, in age order (a younger small one may pass a big one) */
        muser_seq *q = e->cand[i];
        if (n + q->n > cap) continue;
        if (q->tap && tap && (q->tap->n_layers != tap->n_layers ||
                              memcmp(q->tap->layers, tap->layers, tap->n_layers * sizeof *tap->layers)))
            continue;
        if (q->tap && !tap) tap = q->tap;
        if (q->block && !q->block_rows) { /* (submit ends any open block but for BLOCK_EXTEND) */
            muser_error er = {0};
            const int rc = muser_session_checkpoint(q->s, &er);
            if (rc) {
                fail(q, rc, &er);
                continue;
            }
            q->block_rows = 0;
        }
        if (q->block) q->block_rows += q->n;
        reqs[nr] = q;
        first[nr++] = n;
        for (uint32_t j = 0; j < q->n; j++) {
            ss[n] = q->s;
            tok[n++] = q->tokens[j];
        }
    }
    first[nr] = n;
    if (!nr) return;
    const uint64_t V = e->d->model->hp.n_vocab;
    /* logits: each row straight into its request's buffer (or nowhere: a greedy or top-k caller
     * takes the best logits, and the GPU copies no row back). The pass's best logits: as many per
     * row as the request that wants most. */
    bool want_logits = false;
    uint32_t k = 0;
    for (uint32_t r = 0; r < nr; r++) {
        want_logits |= reqs[r]->logits != NULL;
        if (reqs[r]->top && reqs[r]->top->k > k) k = reqs[r]->top->k;
    }
    float *row_out[MUSER_STEP_MAX_ROWS]; /* each row straight into its request's buffer */
    muser_draw *row_draw[MUSER_STEP_MAX_ROWS];
    bool any_draw = false;
    for (uint32_t r = 0; r < nr; r++)
        for (uint32_t j = first[r]; j < first[r + 1]; j++) {
            row_out[j] = reqs[r]->logits ? reqs[r]->logits + (size_t)(j - first[r]) * V : NULL;
            row_draw[j] = reqs[r]->draw;
            any_draw |= reqs[r]->draw != NULL;
        }
    float top_v[MUSER_STEP_MAX_ROWS * MUSER_TOP_MAX];
    int32_t top_id[MUSER_STEP_MAX_ROWS * MUSER_TOP_MAX];
    const muser_top pass_top = {.k = k, .v = top_v, .id = top_id};
    const uint64_t trow = tap ? (uint64_t)tap->n_layers * e->d->model->hp.n_embd : 0; /* floats per tapped row */
    muser_tap pass_tap = {0};
    if (tap) pass_tap = (muser_tap){.n_layers = tap->n_layers, .layers = tap->layers, .out = e->tap_scratch};
    e->in_pass = true;
    pthread_mutex_unlock(&e->mu);
    muser_error err = {0};
    const double t0 = muser_now_s();
    int rc = muser_step_out(e->d, ss, tok, n, want_logits ? row_out : NULL, any_draw ? row_draw : NULL,
                            k ? &pass_top : NULL, tap ? &pass_tap : NULL, &err);
    int rcs[MUSER_STEP_MAX_ROWS];
    muser_error errs[MUSER_STEP_MAX_ROWS];
    for (uint32_t r = 0; r < nr; r++) {
        rcs[r] = rc;
        errs[r] = err;
    }
    if (rc == MUSER_E_NUMERIC && nr > 1) /* whose: each request alone (its bytes are the same either way) */
        for (uint32_t r = 0; r < nr; r++) {
            muser_error er = {0};
            muser_tap one = pass_tap;
            one.out = tap ? e->tap_scratch + first[r] * trow : NULL;
            rcs[r] = muser_step_out(e->d, ss + first[r], tok + first[r], first[r + 1] - first[r],
                                    reqs[r]->logits ? row_out + first[r] : NULL, any_draw ? row_draw + first[r] : NULL,
                                    reqs[r]->top, tap ? &one : NULL, &er);
            errs[r] = er;
        }
    const double t1 = muser_now_s();
    pthread_mutex_lock(&e->mu);
    e->in_pass = false;
    pthread_cond_broadcast(&e->idle);
    log_pass(e, MUSER_PASS_DECODE, n, nr, 0, reqs[0]->id, t0, t1, 0, 0);
    e->last_decode_s = t1 - t0;
    e->prefill_turn = true;
    for (uint32_t r = 0; r < nr; r++) {
        muser_seq *q = reqs[r];
        q->pos = q->s->n_past;
        if (rcs[r]) {
            if (q->block) { /* nothing of it was appended; the block (and its checkpoint) ends */
                muser_session_commit(q->s);
                q->block_rows = 0;
            }
            fail(q, rcs[r], &errs[r]);
            continue;
        }
        for (uint32_t j = 0; q->top && rc == MUSER_OK && j < q->n; j++) { /* (a rerun alone wrote its own) */
            const size_t at = (size_t)(first[r] + j) * k;
            memcpy(q->top->id + (size_t)j * q->top->k, top_id + at, q->top->k * sizeof *top_id);
            if (q->top->v) memcpy(q->top->v + (size_t)j * q->top->k, top_v + at, q->top->k * sizeof *top_v);
        }
        if (q->tap) memcpy(q->tap->out, e->tap_scratch + first[r] * trow, (size_t)q->n * trow * sizeof(float));
        q->decoding = true;
        q->t_done = t1;
        finish(q, MUSER_OK);
    }
}

/* Under the lock, between passes: a copy request (this sequence becomes a copy of copy_src). */
static void run_copy(muser_seq *q)
{
    muser_seq *src = q->copy_src;
    muser_error er = {0};
    int rc = src->freed || src->req != REQ_NONE
                 ? muser_errorf(&er, MUSER_E_ARG, "sequence %llu is busy or cancelled", (unsigned long long)src->id)
                 : muser_session_copy(q->s, src->s, &er);
    q->pos = q->s->n_past;
    if (!rc) q->decoding = false;
    if (rc) fail(q, rc, &er);
    else finish(q, MUSER_OK);
}

/* Under the lock, between passes: a rollback request (drop rows past n_keep of the open block). */
static void run_rollback(muser_seq *q)
{
    muser_error er = {0};
    int rc = muser_session_rollback(q->s, q->n_keep, &er);
    if (!rc) muser_session_commit(q->s);
    q->block_rows = 0;
    q->pos = q->s->n_past;
    if (rc) fail(q, rc, &er);
    else finish(q, MUSER_OK);
}

/* Under the lock: open a chunk in parts with the waiting prompts, oldest first (q, the oldest,
 * among them), each taking as many of its next rows as the chunk has left: prefill_chunk rows, at
 * most the device's part_rows, at most MUSER_PREFILL_MAX_SEQS prompts (one after a shared chunk
 * failed on a non-finite logit). A prompt's bytes do not depend on where its chunks end or what
 * shares them (session.h). Returns the rows, 0 when q failed to open. */
static uint32_t open_chunk(muser_engine *e, muser_seq *q)
{
    uint32_t cap = e->o.prefill_chunk < e->d->part_rows ? e->o.prefill_chunk : e->d->part_rows, n = 0;
    const uint32_t most = e->solo_chunks ? 1 : MUSER_PREFILL_MAX_SEQS;
    if (e->solo_chunks) e->solo_chunks--;
    for (muser_seq *p = q; p && e->part_n < most && n < cap;) {
        uint32_t c = p->n - p->done < cap - n ? p->n - p->done : cap - n;
        for (uint32_t i = 0; i < c; i++) {
            e->part_ss[n + i] = p->s;
            e->part_tok[n + i] = p->tokens[p->done + i];
        }
        p->part_rows = c;
        e->part[e->part_n++] = p;
        n += c;
        /* the next oldest waiting prompt (no tap: a tapped one runs its chunks whole) */
        muser_seq *next = NULL;
        for (muser_seq *r = e->seqs; r; r = r->next)
            if (!r->freed && !r->cancelled && r->req == REQ_PREFILL && !r->tap && !r->part_rows &&
                (!next || r->t_submit < next->t_submit))
                next = r;
        p = next;
    }
    muser_error err = {0};
    const int rc = muser_prefill_begin(e->d, e->part_ss, e->part_tok, n, &err);
    if (rc) { /* the oldest alone, next time: then it is its own error */
        for (uint32_t k = 0; k < e->part_n; k++) e->part[k]->part_rows = 0;
        if (e->part_n == 1) fail(q, rc, &err);
        else e->solo_chunks = 1;
        e->part_n = 0;
        return 0;
    }
    return n;
}

/* The next part of the chunk open in parts (opened here when none is, from q on), the lock
 * dropped. While a sequence outside the chunk decodes, a part is about ENGINE_PART_SHARE of the
 * last decode pass long (from the last part's time per layer; one layer at least), so a decode
 * step waits that long for the prompts before it; otherwise the rest of the chunk. */
static void run_part(muser_engine *e, muser_seq *q, uint32_t waiting)
{
    const uint32_t L = e->d->model->hp.n_layer;
    if (!e->part_n && !open_chunk(e, q)) return;
    uint32_t rows = 0;
    bool want = false;
    for (uint32_t k = 0; k < e->part_n; k++) {
        const muser_seq *p = e->part[k];
        rows += p->part_rows;
        want |= p->logits && p->done + p->part_rows == p->n;
    }
    const uint32_t l0 = e->d->part.next_layer;
    uint32_t layers = L - l0;
    if (others_decoding(e, NULL)) {
        layers = 1; /* until a part of a chunk of these rows was timed (a layer's time is not
                     * proportional to the rows: a 144-row chunk's says little about a 512-row one's) */
        if (e->part_layer_s > 0 && e->last_decode_s > 0 && e->part_layer_rows == rows) {
            const double fit = ENGINE_PART_SHARE * e->last_decode_s / e->part_layer_s;
            layers = fit < 1 ? 1 : fit >= L ? L : (uint32_t)fit;
        }
    }
    float *lg = want ? e->scratch : NULL; /* [sessions][V]: each one's last row */
    e->in_pass = true;
    pthread_mutex_unlock(&e->mu);
    muser_error err = {0};
    bool done = false;
    const double t0 = muser_now_s();
    int rc = muser_prefill_part(e->d, layers, lg, &done, &err);
    const double t1 = muser_now_s();
    pthread_mutex_lock(&e->mu);
    e->in_pass = false;
    pthread_cond_broadcast(&e->idle);
    const uint32_t l1 = rc ? l0 : done ? L : e->d->part.next_layer;
    log_pass(e, MUSER_PASS_PREFILL, rows, e->part_n, waiting, e->part[0]->id, t0, t1, l0, l1);
    if (l1 > l0) {
        e->part_layer_s = (t1 - t0) / (l1 - l0);
        e->part_layer_rows = rows;
    }
    if (!rc && !done) return;
    if (!rc) e->prefill_row_s = (t1 - t0) / rows;
    const uint64_t V = e->d->model->hp.n_vocab;
    const bool shared = e->part_n > 1;
    if (rc == MUSER_E_NUMERIC && shared) e->solo_chunks = e->part_n; /* each alone: the culprit fails alone */
    for (uint32_t k = 0; k < e->part_n; k++) {
        muser_seq *p = e->part[k];
        const uint32_t c = p->part_rows;
        p->part_rows = 0;
        p->pos = p->s->n_past;
        if (p->cancelled) continue; /* reap fails its request and frees it */
        if (rc) {
            if (!(rc == MUSER_E_NUMERIC && shared)) fail(p, rc, &err);
            continue;
        }
        p->done += c;
        if (p->done == p->n) {
            if (p->logits) memcpy(p->logits, e->scratch + (size_t)k * V, (size_t)V * sizeof(float));
            p->decoding = true; /* a prompt is usually followed by its decode steps */
            finish(p, MUSER_OK);
        }
    }
    e->part_n = 0;
}

/* The next chunk of the oldest prefill request, the lock dropped: in parts where the device runs
 * them (run_part; not with a tap, which needs the whole chunk), else whole. */
static void run_prefill(muser_engine *e, muser_seq *q, uint32_t waiting, bool interleaved)
{
    if (e->d->part_rows && (e->part_n || !q->tap)) {
        run_part(e, q, waiting);
        return;
    }
    /* while other sequences decode, contended_chunk rows; while their passes actually alternate
     * with this prompt's chunks, a chunk about one decode pass long (8 rows at least), so a decode
     * step waits about a pass for the chunk before it */
    uint32_t chunk = e->o.prefill_chunk;
    if (others_decoding(e, q)) {
        chunk = e->o.contended_chunk;
        if (interleaved && e->prefill_row_s > 0 && e->last_decode_s > 0) {
            const double fit = e->last_decode_s / e->prefill_row_s;
            if (fit < chunk) chunk = fit < 8 ? 8 : (uint32_t)fit;
            if (chunk > e->o.contended_chunk) chunk = e->o.contended_chunk;
        }
        /* a device whose prefill call has a large fixed cost (the GPU: a GEMM tile of rows and the
         * weights unpacked once per call) gets chunks it runs efficiently, or a prompt would crawl
         * at a few rows per pass */
        const uint32_t floor = e->d->prefill_rows < e->o.prefill_chunk ? e->d->prefill_rows : e->o.prefill_chunk;
        if (chunk < floor) chunk = floor;
    }
    uint32_t c = q->n - q->done < chunk ? q->n - q->done : chunk;
    const bool last = q->done + c == q->n;
    muser_session *s = q->s;
    const int32_t *tok = q->tokens + q->done;
    float *logits = last ? q->logits : NULL;
    e->in_pass = true;
    pthread_mutex_unlock(&e->mu);
    muser_error err = {0};
    const double t0 = muser_now_s();
    /* the prefill route for every chunk, a one-row tail included: the prompt's bytes do not
     * depend on where its chunks end */
    muser_tap chunk_tap;
    if (q->tap) {
        chunk_tap = *q->tap;
        chunk_tap.out = q->tap->out + (uint64_t)q->done * q->tap->n_layers * s->model->hp.n_embd;
    }
    int rc = muser_session_prefill_tap(s, tok, c, logits, q->tap ? &chunk_tap : NULL, &err);
    const double t1 = muser_now_s();
    pthread_mutex_lock(&e->mu);
    e->in_pass = false;
    pthread_cond_broadcast(&e->idle);
    log_pass(e, MUSER_PASS_PREFILL, c, 1, waiting, q->id, t0, t1, 0, rc ? 0 : s->model->hp.n_layer);
    e->prefill_row_s = (t1 - t0) / c;
    q->pos = s->n_past;
    if (rc) {
        fail(q, rc, &err);
        return;
    }
    q->done += c;
    if (last) {
        q->decoding = true; /* a prompt is usually followed by its decode steps */
        finish(q, MUSER_OK);
    }
}

static void *worker(void *arg)
{
    muser_engine *e = arg;
    pthread_mutex_lock(&e->mu);
    for (;;) {
        while (e->n_opening && !e->stop) pthread_cond_wait(&e->work, &e->mu);
        reap(e);
        if (e->stop) break;
        for (muser_seq *q = e->seqs; q; q = q->next) /* rollbacks: quick, between passes */
            if (!q->freed && q->req == REQ_ROLLBACK) run_rollback(q);
            else if (!q->freed && q->req == REQ_COPY) run_copy(q);
        double oldest;
        uint32_t idle;
        const uint32_t n_dec = count_decodes(e, &oldest, &idle);
        muser_seq *p = e->part_n ? e->part[0] : NULL; /* a chunk open in parts goes on before any other prompt */
        for (muser_seq *q = e->seqs; q && !e->part_n; q = q->next)
            if (!q->freed && q->req == REQ_PREFILL && (!p || q->t_submit < p->t_submit)) p = q;
        /* a waiting prompt gets one chunk after each decode pass: decode outranks prefill, but a
         * stream of decode steps never starves a prompt */
        if (p && (!n_dec || e->prefill_turn)) {
            const bool interleaved = e->prefill_turn;
            e->prefill_turn = false;
            run_prefill(e, p, n_dec, interleaved);
            continue;
        }
        if (n_dec) {
            /* the window: the configured one, or an eighth of the last decode pass (at most 20 ms)
             * when that is longer, so rows whose callers spend a while between steps (sampling,
             * streaming) still meet in one pass */
            double win = e->last_decode_s / 8 < 0.02 ? e->last_decode_s / 8 : 0.02;
            if (win < e->o.batch_window_us * 1e-6) win = e->o.batch_window_us * 1e-6;
            const double now = muser_now_s();
            double wait_until = oldest + win;
            /* decoders not back yet whose callers usually return soon: wait for them too, up to a
             * quarter of a pass after the engine came free (or after the oldest request, when that is
             * later). Without this the streams split into groups that take turns: each group's
             * requests arrive during the other's pass, find the window long over when it ends, and
             * run at once, so the groups never meet in one pass again. */
            const double from = oldest > e->t_free ? oldest : e->t_free;
            const double last_call = from + (win > e->last_decode_s / 4 ? win : e->last_decode_s / 4);
            for (const muser_seq *q = e->seqs; q; q = q->next)
                if (!q->freed && q->req == REQ_NONE && q->decoding && q->t_done > 0 && q->turn > 0) {
                    const double back = q->t_done + q->turn + 2 * q->dev + 1e-4; /* (an unsteady caller: not waited for) */
                    if (back > now && back <= last_call && back > wait_until) wait_until = back;
                }
            /* run now when the window is over, the step is full, or no other decoder could join */
            if (now >= wait_until || n_dec >= e->d->max_rows || idle == 0) {
                run_decode(e);
                continue;
            }
            struct timespec ts;
            clock_gettime(CLOCK_REALTIME, &ts);
            const double dt = wait_until - now;
            ts.tv_sec += (time_t)dt;
            ts.tv_nsec += (long)((dt - (double)(time_t)dt) * 1e9);
            if (ts.tv_nsec >= 1000000000L) {
                ts.tv_sec++;
                ts.tv_nsec -= 1000000000L;
            }
            pthread_cond_timedwait(&e->work, &e->mu, &ts);
            continue;
        }
        pthread_cond_wait(&e->work, &e->mu);
    }
    pthread_mutex_unlock(&e->mu);
    return NULL;
}

/* Everything but the thread and the sequences. */
static void engine_release(muser_engine *e)
{
    pthread_mutex_destroy(&e->mu);
    pthread_cond_destroy(&e->work);
    pthread_cond_destroy(&e->idle);
    free(e->cand);
    free(e->scratch);
    free(e->part_ss);
    free(e->part_tok);
    free(e->tap_scratch);
    muser_device_free(e->d);
    free(e);
}

int muser_engine_new(muser_engine **out, const muser_model *m, const muser_engine_opts *o, muser_error *err)
{
    if (!out || !m) return muser_errorf(err, MUSER_E_ARG, "muser_engine_new: NULL argument");
    *out = NULL;
    muser_engine *e = calloc(1, sizeof *e);
    if (!e) return muser_errorf(err, MUSER_E_NOMEM, "engine: out of memory");
    if (o) e->o = *o;
    if (!e->o.batch_window_us) e->o.batch_window_us = ENGINE_DEFAULT_WINDOW_US;
    if (!e->o.prefill_chunk) e->o.prefill_chunk = ENGINE_DEFAULT_CHUNK;
    if (!e->o.contended_chunk) e->o.contended_chunk = ENGINE_DEFAULT_CONTENDED;
    if (!e->o.max_seqs) e->o.max_seqs = ENGINE_DEFAULT_MAX_SEQS;
    /* the device's prefill calls take whole chunks */
    if (e->o.dev.max_batch < e->o.prefill_chunk) e->o.dev.max_batch = e->o.prefill_chunk;
    int rc = muser_device_new(&e->d, m, &e->o.dev, err);
    if (rc) {
        free(e);
        return rc;
    }
    e->scratch = malloc((size_t)MUSER_STEP_MAX_ROWS * m->hp.n_vocab * sizeof(float));
    e->cand = calloc(e->o.max_seqs, sizeof *e->cand);
    e->part_ss = calloc(e->d->part_rows + 1, sizeof *e->part_ss);
    e->part_tok = calloc(e->d->part_rows + 1, sizeof *e->part_tok);
    if (!e->scratch || !e->cand || !e->part_ss || !e->part_tok) {
        free(e->scratch);
        free(e->part_ss);
        free(e->part_tok);
        free(e->cand);
        muser_device_free(e->d);
        free(e);
        return muser_errorf(err, MUSER_E_NOMEM, "engine: out of memory for a step's logits");
    }
    pthread_mutex_init(&e->mu, NULL);
    pthread_cond_init(&e->work, NULL);
    pthread_cond_init(&e->idle, NULL);
    if (pthread_create(&e->thread, NULL, worker, e)) {
        engine_release(e);
        return muser_errorf(err, MUSER_E_BACKEND, "engine: cannot start its thread");
    }
    *out = e;
    return MUSER_OK;
}

static void seq_destroy(muser_seq *q)
{
    pthread_cond_destroy(&q->cv);
    free(q);
}

void muser_engine_free(muser_engine *e)
{
    if (!e) return;
    pthread_mutex_lock(&e->mu);
    for (muser_seq *q = e->seqs; q; q = q->next) q->cancelled = true;
    e->stop = true; /* the worker frees the sessions (reap) after its pass, then leaves */
    pthread_cond_signal(&e->work);
    pthread_mutex_unlock(&e->mu);
    pthread_join(e->thread, NULL);
    for (muser_seq *q = e->seqs, *n; q; q = n) {
        n = q->next;
        seq_destroy(q);
    }
    engine_release(e);
}

int muser_engine_open(muser_engine *e, uint64_t n_ctx, muser_seq **out, muser_error *err)
{
    if (!e || !out) return muser_errorf(err, MUSER_E_ARG, "muser_engine_open: NULL argument");
    *out = NULL;
    if (!n_ctx) n_ctx = e->d->opts.n_ctx;
    if (n_ctx > e->d->opts.n_ctx)
        return muser_errorf(err, MUSER_E_ARG, "engine: a context of %llu exceeds the engine's %llu",
                            (unsigned long long)n_ctx, (unsigned long long)e->d->opts.n_ctx);
    const uint64_t bytes = kv_cache_bytes(&e->d->model->hp, n_ctx);
    muser_seq *q = calloc(1, sizeof *q);
    if (!q) return muser_errorf(err, MUSER_E_NOMEM, "engine: out of memory");
    pthread_cond_init(&q->cv, NULL);
    q->e = e;
    q->n_ctx = n_ctx;
    q->kv_bytes = bytes;
    pthread_mutex_lock(&e->mu);
    int rc = MUSER_OK;
    if (e->n_open >= e->o.max_seqs)
        rc = muser_errorf(err, MUSER_E_NO_ROOM, "engine: %u sequences are open, the most it takes", e->n_open);
    else if (e->o.kv_budget_bytes && e->kv_reserved + bytes > e->o.kv_budget_bytes)
        rc = muser_errorf(err, MUSER_E_NO_ROOM,
                          "engine: a context of %llu needs %.1f MB of KV cache; %.1f MB of the %.1f MB budget are "
                          "free",
                          (unsigned long long)n_ctx, bytes / 1e6, (e->o.kv_budget_bytes - e->kv_reserved) / 1e6,
                          e->o.kv_budget_bytes / 1e6);
    if (!rc && e->stop)
        rc = muser_errorf(err, MUSER_E_CANCELLED, "engine: shutting down");
    if (!rc) {
        /* no pass may run while the device gets a session (a GPU session records its graph on
         * the device's stream): wait for the one in flight, then open under the lock, which
         * keeps the worker from starting another */
        e->n_opening++; /* the worker starts no pass while an open waits (opens would starve) */
        const uint64_t asked = e->n_passes;
        while (e->in_pass) pthread_cond_wait(&e->idle, &e->mu);
        q->open_waited = (uint32_t)(e->n_passes - asked);
        rc = muser_session_open(&q->s, e->d, n_ctx, err);
        e->n_opening--;
        pthread_cond_signal(&e->work);
    }
    if (rc) {
        pthread_mutex_unlock(&e->mu);
        seq_destroy(q);
        return rc;
    }
    q->id = e->next_id++;
    q->next = e->seqs;
    e->seqs = q;
    e->n_open++;
    e->kv_reserved += bytes;
    pthread_mutex_unlock(&e->mu);
    *out = q;
    return MUSER_OK;
}

void muser_seq_cancel(muser_seq *q)
{
    if (!q) return;
    muser_engine *e = q->e;
    pthread_mutex_lock(&e->mu);
    q->cancelled = true;
    pthread_cond_signal(&e->work);
    pthread_mutex_unlock(&e->mu);
}

void muser_engine_close(muser_seq *q)
{
    if (!q) return;
    muser_engine *e = q->e;
    pthread_mutex_lock(&e->mu);
    q->cancelled = true;
    pthread_cond_signal(&e->work);
    while (!q->freed) pthread_cond_wait(&q->cv, &e->mu);
    for (muser_seq **pp = &e->seqs; *pp; pp = &(*pp)->next)
        if (*pp == q) {
            *pp = q->next;
            break;
        }
    e->n_open--;
    pthread_mutex_unlock(&e->mu);
    seq_destroy(q);
}

/* Queue the request and wait for it (the caller's one request). */
static int submit(muser_seq *q, req_kind kind, const int32_t *tokens, uint32_t n, int block, uint64_t n_keep,
                  float *logits, const muser_top *top, muser_draw *draw, const muser_tap *tap, muser_error *err)
{
    muser_engine *e = q->e;
    const uint32_t V = e->d->model->hp.n_vocab;
    for (uint32_t i = 0; kind != REQ_ROLLBACK && i < n; i++)
        if (tokens[i] < 0 || (uint32_t)tokens[i] >= V)
            return muser_errorf(err, MUSER_E_ARG, "token %d at index %u is not in [0, %u)", tokens[i], i, V);
    int rc = tap ? muser_tap_check(e->d->model, tap, err) : MUSER_OK;
    if (rc) return rc;
    pthread_mutex_lock(&e->mu);
    if (tap && kind == REQ_DECODE && !e->tap_scratch &&
        !(e->tap_scratch = malloc((size_t)MUSER_STEP_MAX_ROWS * MUSER_TAP_MAX_LAYERS * e->d->model->hp.n_embd *
                                  sizeof(float))))
        rc = muser_errorf(err, MUSER_E_NOMEM, "engine: out of memory for a step's tapped rows");
    else if (q->cancelled)
        rc = muser_errorf(err, MUSER_E_CANCELLED, "sequence %llu was cancelled", (unsigned long long)q->id);
    else if (q->req != REQ_NONE)
        rc = muser_errorf(err, MUSER_E_ARG, "sequence %llu already has a request running", (unsigned long long)q->id);
    else if (block == BLOCK_EXTEND && q->block_rows + n > KV_MAX_SPEC_ROWS)
        rc = muser_errorf(err, MUSER_E_ARG, "sequence %llu: a speculative block holds at most %u rows (%u open)",
                          (unsigned long long)q->id, KV_MAX_SPEC_ROWS, q->block_rows);
    else if (kind == REQ_PREFILL && q->pos + n > q->n_ctx)
        rc = muser_errorf(err, MUSER_E_CONTEXT_FULL, "sequence %llu: %llu tokens held + %u new exceed its context of %llu",
                          (unsigned long long)q->id, (unsigned long long)q->pos, n, (unsigned long long)q->n_ctx);
    if (rc) {
        pthread_mutex_unlock(&e->mu);
        return rc;
    }
    q->req = kind;
    if (kind == REQ_DECODE && n == 1) { /* the caller's token may be a temporary: keep a copy */
        q->token = tokens[0];
        tokens = &q->token;
    }
    q->tokens = tokens;
    q->n = n;
    q->done = 0;
    q->block = block;
    if (kind != REQ_ROLLBACK && block != BLOCK_EXTEND) q->block_rows = 0; /* anything else ends an open block */
    q->tap = tap;
    q->n_keep = n_keep;
    q->logits = logits;
    q->top = top;
    q->draw = draw;
    q->t_submit = muser_now_s();
    if (kind == REQ_DECODE && q->t_done > 0) { /* the caller's time between two steps */
        const double turn = q->t_submit - q->t_done;
        q->dev = q->turn > 0 ? 0.75 * q->dev + 0.25 * fabs(turn - q->turn) : 0.25 * turn;
        q->turn = q->turn > 0 ? 0.75 * q->turn + 0.25 * turn : turn;
    }
    if (kind != REQ_DECODE) q->t_done = q->turn = q->dev = 0; /* (a prompt, a copy or a rollback breaks the rhythm) */
    q->finished = false;
    if (kind == REQ_PREFILL) q->decoding = false; /* a new prompt: not decoding until it decodes */
    pthread_cond_signal(&e->work);
    while (!q->finished) pthread_cond_wait(&q->cv, &e->mu);
    rc = q->rc;
    if (rc && err) *err = q->err;
    pthread_mutex_unlock(&e->mu);
    return rc;
}

int muser_seq_prefill(muser_seq *q, const int32_t *tokens, uint32_t n, float *logits, muser_error *err)
{
    return muser_seq_prefill_tap(q, tokens, n, logits, NULL, err);
}

int muser_seq_prefill_tap(muser_seq *q, const int32_t *tokens, uint32_t n, float *logits, const muser_tap *tap,
                          muser_error *err)
{
    if (!q || (!tokens && n)) return muser_errorf(err, MUSER_E_ARG, "muser_seq_prefill: NULL argument");
    if (!n) return muser_errorf(err, MUSER_E_ARG, "muser_seq_prefill: no tokens");
    return submit(q, REQ_PREFILL, tokens, n, BLOCK_NONE, 0, logits, NULL, NULL, tap, err);
}

/* a request's best-logits ask (NULL: none) that cannot be served */
static bool top_bad(const muser_top *top) { return top && (top->k == 0 || top->k > MUSER_TOP_MAX || !top->id); }
static int top_error(const muser_top *top, const char *fn, muser_error *err)
{
    return muser_errorf(err, MUSER_E_ARG, "%s: the best %u logits (1..%u) and an id buffer are needed", fn, top->k,
                        MUSER_TOP_MAX);
}

int muser_seq_decode(muser_seq *q, int32_t token, float *logits, const muser_top *top, muser_error *err)
{
    if (!q) return muser_errorf(err, MUSER_E_ARG, "muser_seq_decode: NULL sequence");
    if (top_bad(top)) return top_error(top, "muser_seq_decode", err);
    return submit(q, REQ_DECODE, &token, 1, BLOCK_NONE, 0, logits, top, NULL, NULL, err);
}

int muser_seq_decode_draw(muser_seq *q, int32_t token, float *logits, muser_draw *draw, muser_error *err)
{
    if (!q || !draw || !logits) return muser_errorf(err, MUSER_E_ARG, "muser_seq_decode_draw: NULL argument");
    const int rc = muser_draw_check(draw, "muser_seq_decode_draw", err);
    if (rc) return rc;
    draw->id = -1;
    return submit(q, REQ_DECODE, &token, 1, BLOCK_NONE, 0, logits, NULL, draw, NULL, err);
}

int muser_seq_verify(muser_seq *q, const int32_t *tokens, uint32_t n, float *logits, muser_error *err)
{
    return muser_seq_verify_tap(q, tokens, n, logits, NULL, err);
}

int muser_seq_verify_tap(muser_seq *q, const int32_t *tokens, uint32_t n, float *logits, const muser_tap *tap,
                         muser_error *err)
{
    if (!q || !tokens) return muser_errorf(err, MUSER_E_ARG, "muser_seq_verify: NULL argument");
    if (n == 0 || n > KV_MAX_SPEC_ROWS || n > q->e->d->max_rows)
        return muser_errorf(err, MUSER_E_ARG, "muser_seq_verify: %u rows (1..%u)", n, KV_MAX_SPEC_ROWS);
    return submit(q, REQ_DECODE, tokens, n, BLOCK_NEW, 0, logits, NULL, NULL, tap, err);
}

int muser_seq_draft(muser_seq *q, const int32_t *tokens, uint32_t n, float *logits, const muser_top *top,
                    muser_error *err)
{
    if (!q || !tokens) return muser_errorf(err, MUSER_E_ARG, "muser_seq_draft: NULL argument");
    if (n == 0 || n > KV_MAX_SPEC_ROWS || n > q->e->d->max_rows)
        return muser_errorf(err, MUSER_E_ARG, "muser_seq_draft: %u rows (1..%u)", n, KV_MAX_SPEC_ROWS);
    if (top_bad(top)) return top_error(top, "muser_seq_draft", err);
    return submit(q, REQ_DECODE, tokens, n, BLOCK_EXTEND, 0, logits, top, NULL, NULL, err);
}

int muser_seq_copy_from(muser_seq *q, muser_seq *src, muser_error *err)
{
    if (!q || !src) return muser_errorf(err, MUSER_E_ARG, "muser_seq_copy_from: NULL sequence");
    if (q->e != src->e || q->n_ctx != src->n_ctx)
        return muser_errorf(err, MUSER_E_ARG, "muser_seq_copy_from: the sequences need one engine and one context");
    q->copy_src = src;
    return submit(q, REQ_COPY, NULL, 0, BLOCK_NONE, 0, NULL, NULL, NULL, NULL, err);
}

int muser_seq_rollback(muser_seq *q, uint64_t n_keep, muser_error *err)
{
    if (!q) return muser_errorf(err, MUSER_E_ARG, "muser_seq_rollback: NULL sequence");
    return submit(q, REQ_ROLLBACK, NULL, 0, BLOCK_NONE, n_keep, NULL, NULL, NULL, NULL, err);
}

uint64_t muser_seq_pos(const muser_seq *q)
{
    muser_engine *e = q->e;
    pthread_mutex_lock(&e->mu);
    const uint64_t p = q->pos;
    pthread_mutex_unlock(&e->mu);
    return p;
}

uint64_t muser_seq_id(const muser_seq *q) { return q->id; }

uint32_t muser_seq_open_waited(const muser_seq *q) { return q->open_waited; }

const muser_model *muser_seq_model(const muser_seq *q) { return q->e->d->model; }

muser_engine *muser_seq_engine(const muser_seq *q) { return q->e; }

uint64_t muser_seq_ctx(const muser_seq *q) { return q->n_ctx; }

/* The session of an idle sequence (no request of it runs or waits, so no pass touches it), for a
 * call outside the lock; NULL with err filled when it is busy or cancelled. */
static muser_session *idle_session(muser_seq *q, muser_error *err)
{
    muser_engine *e = q->e;
    pthread_mutex_lock(&e->mu);
    muser_session *s = q->freed || q->cancelled || q->req != REQ_NONE ? NULL : q->s;
    pthread_mutex_unlock(&e->mu);
    if (!s) muser_errorf(err, MUSER_E_ARG, "sequence %llu is busy or cancelled", (unsigned long long)q->id);
    return s;
}

int muser_seq_kv_sha256(muser_seq *q, char hex[65], muser_error *err)
{
    muser_session *s = idle_session(q, err);
    return s ? muser_session_kv_sha256(s, hex, err) : MUSER_E_ARG;
}

int muser_seq_kv_rows(muser_seq *q, uint32_t l, uint64_t pos0, uint32_t n, uint16_t *k, uint16_t *v,
                      muser_error *err)
{
    muser_session *s = idle_session(q, err);
    return s ? muser_session_kv_rows(s, l, pos0, n, k, v, err) : MUSER_E_ARG;
}

int muser_seq_kv_import(muser_seq *q, uint32_t l, uint64_t n_past, uint64_t pos0, uint32_t n, const uint16_t *k,
                        const uint16_t *v, muser_error *err)
{
    muser_session *s = idle_session(q, err);
    return s ? muser_session_kv_import(s, l, n_past, pos0, n, k, v, err) : MUSER_E_ARG;
}

int muser_seq_install(muser_seq *q, muser_seq *gen, uint64_t n_past, muser_error *err)
{
    if (!q || !gen || q == gen) return muser_errorf(err, MUSER_E_ARG, "muser_seq_install: two sequences wanted");
    if (q->e != gen->e || q->n_ctx != gen->n_ctx)
        return muser_errorf(err, MUSER_E_ARG, "muser_seq_install: the sequences need one engine and one context");
    muser_engine *e = q->e;
    pthread_mutex_lock(&e->mu);
    int rc = MUSER_OK;
    if (q->cancelled || q->freed || gen->cancelled || gen->freed)
        rc = muser_errorf(err, MUSER_E_CANCELLED, "install: sequence %llu was cancelled",
                          (unsigned long long)(q->cancelled || q->freed ? q->id : gen->id));
    else if (q->req != REQ_NONE || gen->req != REQ_NONE)
        rc = muser_errorf(err, MUSER_E_ARG, "install: sequence %llu has a request running",
                          (unsigned long long)(q->req != REQ_NONE ? q->id : gen->id));
    /* no pass touches either session (neither has a request), so the seal (metadata) and the swap
     * (pointers) need no pass boundary */
    if (!rc) rc = muser_session_kv_seal(gen->s, n_past, err);
    if (!rc) rc = muser_session_swap(q->s, gen->s, err);
    if (!rc) {
        q->pos = q->s->n_past;
        gen->pos = gen->s->n_past;
        q->decoding = gen->decoding = false;
    }
    pthread_mutex_unlock(&e->mu);
    return rc;
}

uint32_t muser_engine_passes(muser_engine *e, muser_pass_rec *out, uint32_t max)
{
    pthread_mutex_lock(&e->mu);
    const uint64_t have = e->n_passes < MUSER_ENGINE_LOG ? e->n_passes : MUSER_ENGINE_LOG;
    const uint32_t n = (uint32_t)(have < max ? have : max);
    for (uint32_t i = 0; i < n; i++) out[i] = e->log[(e->n_passes - n + i) % MUSER_ENGINE_LOG];
    pthread_mutex_unlock(&e->mu);
    return n;
}

void muser_engine_stats_get(muser_engine *e, muser_engine_stats *out)
{
    pthread_mutex_lock(&e->mu);
    out->passes = e->n_passes;
    out->decode_rows = e->decode_rows;
    out->prefill_rows = e->prefill_rows;
    out->decode_passes = e->decode_passes;
    out->open_seqs = e->n_open;
    out->kv_reserved_bytes = e->kv_reserved;
    out->busy_s = e->busy_s;
    pthread_mutex_unlock(&e->mu);
}

const muser_device *muser_engine_device(const muser_engine *e) { return e->d; }
