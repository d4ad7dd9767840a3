/* spec.c — speculative decoding (spec.h): the drafters, the acceptance rule and the round loop. */
#include "spec.h"
#include "util.h"

#include <stdlib.h>
#include <string.h>

static double tensor_macs(const muser_tensor *t) { return (double)t->rows * (double)t->cols; }
/* The multiply-adds of one row through a layer's projections (a target's or a drafter's layer: the
 * members share their names), the attention gate aside. */
#define LAYER_MACS(L)                                                                                   \
    (tensor_macs(&(L)->attn_q) + tensor_macs(&(L)->attn_k) + tensor_macs(&(L)->attn_v) +                \
     tensor_macs(&(L)->attn_output) + tensor_macs(&(L)->ffn_gate) + tensor_macs(&(L)->ffn_up) +         \
     tensor_macs(&(L)->ffn_down))

/* ---- acceptance ---- */

int32_t muser_spec_accept(muser_sampler *s, const float *row, int32_t d, bool *accepted)
{
    const int32_t *ids;
    const float *w;
    uint32_t n;
    double mass;
    *accepted = false;
    if (muser_sampler_dist(s, row, &ids, &w, &n, &mass))
        return MUSER_E_NUMERIC;
    if (n == 1) { /* greedy (or one candidate): accept exactly the argmax */
        *accepted = ids[0] == d;
        return ids[0];
    }
    double wd = 0.0;
    for (uint32_t i = 0; i < n; i++)
        if (ids[i] == d) {
            wd = (double)w[i];
            break;
        }
    if (wd > 0.0 && muser_sampler_uniform(s) * mass < wd) { /* with probability p(d) */
        *accepted = true;
        return d;
    }
    /* the residual: p without d, renormalised */
    const double u = muser_sampler_uniform(s) * (mass - wd);
    double acc = 0.0;
    int32_t last = -1;
    for (uint32_t i = 0; i < n; i++) {
        if (ids[i] == d || !(w[i] > 0.0f)) /* (an id the truncation dropped weighs 0) */
            continue;
        acc += (double)w[i];
        last = ids[i];
        if (u < acc)
            return ids[i];
    }
    return last; /* rounding can leave u just past the last step */
}

/* ---- prompt lookup ---- */

typedef struct ngram {
    muser_drafter base;
    uint32_t n_max;
} ngram;

static int ngram_propose(muser_drafter *dr, const int32_t *ctx, uint64_t n, uint32_t k, int32_t *out, muser_error *err)
{
    (void)err;
    const ngram *g = dr->self;
    for (uint32_t len = g->n_max < n ? g->n_max : (uint32_t)(n ? n - 1 : 0); len >= 1; len--) {
        const int32_t *suf = ctx + n - len;
        /* the latest earlier occurrence whose continuation exists */
        for (uint64_t at = n - len; at-- > 0;) {
            if (memcmp(ctx + at, suf, len * sizeof *ctx))
                continue;
            uint32_t m = 0;
            for (uint64_t p = at + len; m < k && p < n; p++)
                out[m++] = ctx[p];
            return (int)m;
        }
    }
    return 0;
}

static void ngram_free(muser_drafter *dr)
{
    free(dr->self);
}

int muser_drafter_ngram_new(muser_drafter **out, uint32_t n_max, muser_error *err)
{
    *out = NULL;
    if (n_max < 1 || n_max > 64)
        return muser_errorf(err, MUSER_E_ARG, "n-gram drafter: n %u (1..64)", n_max);
    ngram *g = calloc(1, sizeof *g);
    if (!g)
        return muser_errorf(err, MUSER_E_NOMEM, "n-gram drafter: out of memory");
    g->n_max = n_max;
    g->base = (muser_drafter){.name = "ngram", .propose = ngram_propose, .free = ngram_free, .self = g};
    *out = &g->base;
    return MUSER_OK;
}

/* ---- a draft model ---- */

/* The draft model's sequence on a draft engine: a round feeds the context it lacks (the prefill
 * route), takes the first draft from that row, and each further draft from a muser_seq_draft row of
 * the previous one (the rows of concurrent drafters on one engine share passes). Those rows form a
 * block that the next round rolls back to what the target accepted. */
typedef struct draft_model {
    muser_drafter base;
    double macs;         /* the draft model's multiply-adds per token */
    muser_engine *e;
    muser_engine *own;   /* e when the drafter made it (muser_drafter_model_new) */
    muser_seq *q;
    uint64_t n_ctx;
    uint32_t V;
    int32_t *fed;        /* the tokens the draft sequence holds */
    uint64_t n_fed;
    bool block;          /* the last round's drafts are an open block from block_pos on */
    uint64_t block_pos;
    float *logits;       /* [V] */
} draft_model;

/* a round: k tokens through the draft model (the catch-up of the last round's tokens aside) */
static double dm_round_macs(const muser_drafter *dr, uint32_t k)
{
    return k * ((const draft_model *)dr->self)->macs;
}

/* an empty sequence in place of the one held */
static int dm_reopen(draft_model *m, muser_error *err)
{
    muser_engine_close(m->q);
    m->q = NULL;
    m->n_fed = 0;
    m->block = false;
    return muser_engine_open(m->e, m->n_ctx, &m->q, err);
}

/* The rows of ctx[c, n) into the sequence (which holds ctx[0, c)), and the best token after them:
 * up to 16 as draft rows (a block the round's drafts extend, packed with other drafters' rows), more
 * (a prompt) through the prefill route. */
static int dm_catch_up(draft_model *m, const int32_t *ctx, uint64_t c, uint64_t n, uint32_t k, int32_t *next,
                       muser_error *err)
{
    const uint32_t j = (uint32_t)(n - c);
    int rc;
    if (j <= KV_MAX_SPEC_ROWS) {
        int32_t ids[KV_MAX_SPEC_ROWS];
        const muser_top top = {.k = 1, .id = ids};
        m->block = true;
        m->block_pos = c;
        if ((rc = muser_seq_draft(m->q, ctx + c, j, NULL, &top, err)))
            return rc;
        *next = ids[j - 1];
        if (j + k - 1 > KV_MAX_SPEC_ROWS) { /* no room left for the drafts: keep these rows, a new block */
            rc = muser_seq_rollback(m->q, n, err);
            m->block = false;
        }
        return rc;
    }
    if ((rc = muser_seq_prefill(m->q, ctx + c, j, m->logits, err)))
        return rc;
    *next = muser_argmax(m->logits, m->V); /* (a prefill with a non-finite logit failed closed) */
    return MUSER_OK;
}

static int dm_propose(muser_drafter *dr, const int32_t *ctx, uint64_t n, uint32_t k, int32_t *out, muser_error *err)
{
    draft_model *m = dr->self;
    if (n == 0 || k == 0 || n + k > m->n_ctx)
        return 0; /* nothing to follow, or no room: no drafts */
    int rc = m->q ? MUSER_OK : dm_reopen(m, err); /* (a reopen that failed last round) */
    if (rc)
        return rc;
    uint64_t c = 0; /* the common prefix of what the draft holds and the context */
    while (c < m->n_fed && c < n && m->fed[c] == ctx[c])
        c++;
    if (c == n)
        c = n - 1; /* the last token again: its row's best token was not kept */
    if (m->block && c >= m->block_pos) /* drop the drafts past what was accepted */
        rc = muser_seq_rollback(m->q, c, err);
    else if (c < m->n_fed) {
        rc = dm_reopen(m, err);
        c = 0;
    }
    m->block = false;
    m->n_fed = c;
    if (!rc)
        rc = dm_catch_up(m, ctx, c, n, k, &out[0], err);
    if (!rc) {
        memcpy(m->fed + c, ctx + c, (n - c) * sizeof *ctx);
        m->n_fed = n;
    }
    for (uint32_t got = 1; !rc && got < k; got++) {
        int32_t id;
        const muser_top top = {.k = 1, .id = &id};
        if (!m->block)
            m->block_pos = m->n_fed;
        m->block = true;
        if (!(rc = muser_seq_draft(m->q, &out[got - 1], 1, NULL, &top, err))) {
            m->fed[m->n_fed++] = out[got - 1];
            out[got] = id;
        }
    }
    if (rc) { /* the sequence's state is the engine's to say: start over next round */
        muser_error ignored;
        dm_reopen(m, &ignored);
        return rc;
    }
    return (int)k;
}

static void dm_free(muser_drafter *dr)
{
    draft_model *m = dr->self;
    muser_engine_close(m->q);
    muser_engine_free(m->own);
    free(m->fed);
    free(m->logits);
    free(m);
}

int muser_draft_model_check(const muser_model *draft, const muser_model *target, muser_error *err)
{
    if (draft->hp.n_vocab == target->hp.n_vocab)
        return MUSER_OK;
    return muser_errorf(err, MUSER_E_ARG,
                        "draft model: its vocabulary has %u tokens, the target's %u (a draft must share the target's "
                        "tokenizer)",
                        draft->hp.n_vocab, target->hp.n_vocab);
}

int muser_drafter_model_on(muser_drafter **out, muser_engine *e, const muser_model *target, uint64_t n_ctx,
                           muser_error *err)
{
    *out = NULL;
    const muser_model *draft = muser_engine_device(e)->model;
    int rc = muser_draft_model_check(draft, target, err);
    if (rc)
        return rc;
    draft_model *m = calloc(1, sizeof *m);
    if (!m)
        return muser_errorf(err, MUSER_E_NOMEM, "draft model: out of memory");
    m->e = e;
    m->n_ctx = n_ctx;
    m->V = draft->hp.n_vocab;
    rc = muser_engine_open(e, n_ctx, &m->q, err);
    m->fed = malloc(n_ctx * sizeof *m->fed);
    m->logits = malloc((size_t)draft->hp.n_vocab * sizeof *m->logits);
    if (!rc && (!m->fed || !m->logits))
        rc = muser_errorf(err, MUSER_E_NOMEM, "draft model: out of memory");
    if (rc) {
        muser_engine_close(m->q);
        free(m->fed);
        free(m->logits);
        free(m);
        return rc;
    }
    m->macs = muser_model_token_macs(draft);
    m->base = (muser_drafter){.name = "model", .propose = dm_propose, .free = dm_free, .self = m,
                              .round_macs = dm_round_macs};
    *out = &m->base;
    return MUSER_OK;
}

int muser_drafter_model_new(muser_drafter **out, const muser_model *draft, const muser_model *target,
                            muser_backend_kind b, uint32_t n_threads, uint64_t n_ctx, muser_error *err)
{
    *out = NULL;
    int rc = muser_draft_model_check(draft, target, err); /* (before an engine starts for it) */
    if (rc)
        return rc;
    muser_engine_opts o;
    memset(&o, 0, sizeof o);
    o.dev.backend = b;
    o.dev.n_threads = n_threads;
    o.dev.n_ctx = n_ctx;
    muser_engine *e = NULL;
    rc = muser_engine_new(&e, draft, &o, err);
    if (!rc)
        rc = muser_drafter_model_on(out, e, target, n_ctx, err);
    if (rc) {
        muser_engine_free(e);
        return rc;
    }
    ((draft_model *)(*out)->self)->own = e;
    return MUSER_OK;
}

/* ---- DFlash ---- */

_Static_assert(MUSER_DFLASH_MAX_TAP <= MUSER_TAP_MAX_LAYERS, "a drafter's target layers must fit one tap");

typedef struct dflash_drafter {
    muser_drafter base;
    muser_dflash_run *run;
} dflash_drafter;

static int df_propose(muser_drafter *dr, const int32_t *ctx, uint64_t n, uint32_t k, int32_t *out, muser_error *err)
{
    dflash_drafter *f = dr->self;
    const muser_dflash *df = f->run->d;
    const uint32_t B = df->hp.block_size;
    /* the block starts at the next token's position; every earlier position's features must be in */
    if (n == 0 || muser_dflash_run_held(f->run) != n - 1 || n - 1 + B > f->run->n_ctx)
        return 0;
    const uint32_t m = k < B - 1 ? k : B - 1; /* only the rows it will propose need the LM head */
    const int rc = muser_dflash_run_draft(f->run, ctx[n - 1], m, out, err);
    return rc ? rc : (int)m;
}

static int df_observe(muser_drafter *dr, uint64_t pos0, const float *feats, uint32_t n, muser_error *err)
{
    dflash_drafter *f = dr->self;
    if (pos0 > muser_dflash_run_held(f->run) || pos0 + n > f->run->n_ctx)
        return MUSER_OK; /* a gap (a prompt prefilled without the tap) or past its context: it drafts nothing */
    return muser_dflash_run_context(f->run, pos0, feats, n, err);
}

/* a round: the block's B rows through fc and the layers, the LM head for the k rows it proposes */
static double df_round_macs(const muser_drafter *dr, uint32_t k)
{
    const muser_dflash *df = ((const dflash_drafter *)dr->self)->run->d;
    double rows = tensor_macs(&df->fc);
    for (uint32_t l = 0; l < df->hp.n_layer; l++) {
        const muser_dflash_layer *L = &df->layers[l];
        rows += LAYER_MACS(L);
    }
    const uint32_t m = k < df->hp.block_size - 1 ? k : df->hp.block_size - 1;
    return df->hp.block_size * rows + m * tensor_macs(&df->target->output);
}

static void df_free(muser_drafter *dr)
{
    dflash_drafter *f = dr->self;
    muser_dflash_run_free(f->run);
    free(f);
}

int muser_drafter_dflash_new(muser_drafter **out, const muser_dflash *df, muser_dflash_kind kind, uint64_t n_ctx,
                             muser_error *err)
{
    *out = NULL;
    dflash_drafter *f = calloc(1, sizeof *f);
    if (!f)
        return muser_errorf(err, MUSER_E_NOMEM, "dflash drafter: out of memory");
    const int rc = muser_dflash_run_new(&f->run, df, kind, n_ctx, err);
    if (rc) {
        free(f);
        return rc;
    }
    f->base = (muser_drafter){.name = "dflash", .propose = df_propose, .free = df_free, .self = f,
                              .n_tap = df->hp.n_tap, .tap_layers = df->hp.tap_layers, .observe = df_observe,
                              .round_macs = df_round_macs, .observe_early = muser_dflash_run_async(f->run)};
    *out = &f->base;
    return MUSER_OK;
}

void muser_drafter_free(muser_drafter *d)
{
    if (d && d->free)
        d->free(d);
}

/* ---- rounds ---- */

#define SPEC_TAP_CHUNK 256u /* prompt rows per tapped prefill call: bounds the features in memory */

int muser_spec_prefill(muser_seq *q, muser_drafter *d, const int32_t *tokens, uint32_t n, float *logits,
                       muser_error *err)
{
    if (!d || !d->n_tap)
        return muser_seq_prefill(q, tokens, n, logits, err);
    const uint64_t row = (uint64_t)d->n_tap * muser_seq_model(q)->hp.n_embd;
    float *feats = malloc((size_t)(n < SPEC_TAP_CHUNK ? n : SPEC_TAP_CHUNK) * row * sizeof(float));
    if (!feats)
        return muser_errorf(err, MUSER_E_NOMEM, "speculation: out of memory for a prompt's tapped rows");
    int rc = MUSER_OK;
    for (uint32_t off = 0; off < n && !rc; off += SPEC_TAP_CHUNK) {
        const uint32_t c = n - off < SPEC_TAP_CHUNK ? n - off : SPEC_TAP_CHUNK;
        const uint64_t pos0 = muser_seq_pos(q);
        const muser_tap tap = {.n_layers = d->n_tap, .layers = d->tap_layers, .out = feats};
        rc = muser_seq_prefill_tap(q, tokens + off, c, logits, &tap, err);
        if (!rc)
            rc = d->observe(d, pos0, feats, c, err);
    }
    free(feats);
    return rc;
}

int muser_spec_init(muser_spec *sp, muser_seq *q, uint64_t n_ctx, muser_sampler *smp, muser_drafter *d,
                    uint32_t k_max, const int32_t *prompt, uint64_t n_prompt, float *logits, muser_error *err)
{
    memset(sp, 0, sizeof *sp);
    if (k_max < 1 || k_max > MUSER_SPEC_MAX_DRAFT)
        return muser_errorf(err, MUSER_E_ARG, "speculation: %u drafts per round (1..%d)", k_max, MUSER_SPEC_MAX_DRAFT);
    const uint64_t V = muser_seq_model(q)->hp.n_vocab;
    sp->q = q;
    sp->smp = smp;
    sp->d = d;
    sp->k_max = k_max;
    sp->n_ctx = n_ctx;
    sp->logits = logits;
    sp->pending = -1;
    sp->greedy = muser_sampler_greedy(smp);
    sp->cap = n_ctx + 1;
    sp->hist = malloc(sp->cap * sizeof *sp->hist);
    sp->rows = malloc((size_t)KV_MAX_SPEC_ROWS * V * sizeof *sp->rows);
    if (d->n_tap)
        sp->feats = malloc((size_t)KV_MAX_SPEC_ROWS * d->n_tap * muser_seq_model(q)->hp.n_embd * sizeof *sp->feats);
    if (!sp->hist || !sp->rows || (d->n_tap && !sp->feats)) {
        muser_spec_free(sp);
        return muser_errorf(err, MUSER_E_NOMEM, "speculation: out of memory");
    }
    memcpy(sp->hist, prompt, n_prompt * sizeof *prompt);
    sp->n_hist = n_prompt;
    return MUSER_OK;
}

/* The weight the earlier rounds' acceptance keeps per round (adaptive draft length). */
#define SPEC_DECAY 0.8
/* Rounds without drafts after which a sequence alone drafts again (adaptive draft length). */
#define SPEC_EXPLORE 8

double muser_model_token_macs(const muser_model *m)
{
    double s = tensor_macs(&m->output);
    for (uint32_t l = 0; l < m->hp.n_layer; l++) {
        const muser_layer *L = &m->layers[l];
        s += LAYER_MACS(L);
        if (m->hp.attn_gate)
            s += tensor_macs(&L->attn_gate);
    }
    return s;
}

void muser_spec_adaptive(muser_spec *sp, bool on)
{
    sp->adaptive = on;
    const muser_device *d = muser_engine_device(muser_seq_engine(sp->q));
    for (uint32_t n = 0; n <= KV_MAX_SPEC_ROWS; n++)
        sp->cost[n] = d->pass_cost[n];
    sp->target_macs = muser_model_token_macs(muser_seq_model(sp->q));
    sp->acc_w = sp->rej_w = 1.0; /* an even prior: a = 1/2 */
}

void muser_spec_set_neighbours(muser_spec *sp, uint32_t n) { sp->neighbours = n; }

/* The cost of passes holding n rows, in decode steps: full passes of KV_MAX_SPEC_ROWS, then the rest. */
static double rows_cost(const muser_spec *sp, uint32_t n)
{
    double c = 0.0;
    for (; n > KV_MAX_SPEC_ROWS; n -= KV_MAX_SPEC_ROWS)
        c += sp->cost[KV_MAX_SPEC_ROWS];
    return c + sp->cost[n];
}

uint32_t muser_spec_next_k(const muser_spec *sp)
{
    if (!sp->adaptive)
        return sp->k_max;
    const double a = sp->acc_w / (sp->acc_w + sp->rej_w);
    const uint32_t others = sp->greedy ? sp->neighbours : 0; /* (a sampled run's tokens must not see them) */
    /* no drafts is a choice too, except every SPEC_EXPLORE-th round of a sequence alone, whose
     * acceptance would otherwise never be measured again */
    const bool none_ok = others > 0 || sp->skipped < SPEC_EXPLORE;
    uint32_t best = none_ok ? 0 : 1;
    double best_v = none_ok ? (others + 1.0) / rows_cost(sp, others + 1) : 0.0, e = 1.0, ak = 1.0;
    for (uint32_t k = 1; k <= sp->k_max; k++) {
        ak *= a;
        e += ak; /* the expected tokens of a block of k drafts: 1 + a + … + a^k */
        const double r = sp->d->round_macs && sp->target_macs > 0 ? sp->d->round_macs(sp->d, k) / sp->target_macs : 0.0;
        const double v = (others + e) / (rows_cost(sp, others + 1 + k) + r);
        if (v > best_v) {
            best_v = v;
            best = k;
        }
    }
    return best;
}

void muser_spec_free(muser_spec *sp)
{
    free(sp->hist);
    free(sp->rows);
    free(sp->feats);
    memset(sp, 0, sizeof *sp);
}

/* A round without drafts (and no logprobs wanted): t0 through the plain decode step, the next token
 * taken as plain decoding takes it — drawn on the device, or from the best logits, where the sampler
 * allows (no row copied back), else from the row — and kept as the round's pending token. The
 * generator's draws come in plain decoding's order. */
static int decode_plain(muser_spec *sp, int32_t t0, muser_error *err)
{
    float temp = 0.0f, top_p = 1.0f, min_p = 0.0f;
    const uint32_t top_k = muser_sampler_top_needed(sp->smp);
    int32_t next = -1, top_id[MUSER_TOP_MAX];
    float top_v[MUSER_TOP_MAX];
    int rc;
    if (top_k > 0 && top_k <= MUSER_TOP_MAX) { /* greedy or top-k, no penalty: the best logits */
        const muser_top top = {.k = top_k, .v = top_v, .id = top_id};
        rc = muser_seq_decode(sp->q, t0, NULL, &top, err);
        if (!rc) muser_sampler_accept(sp->smp, t0);
        if (!rc) next = muser_sampler_sample_top(sp->smp, top_v, top_id, top_k);
    } else if (muser_sampler_draw_params(sp->smp, &temp, &top_p, &min_p)) { /* the uniform first, as the next sample takes it */
        muser_draw dw = {.temperature = temp, .top_p = top_p, .min_p = min_p, .u = muser_sampler_uniform(sp->smp)};
        rc = muser_seq_decode_draw(sp->q, t0, sp->logits, &dw, err);
        if (!rc) muser_sampler_accept(sp->smp, t0);
        if (!rc) next = dw.id >= 0 ? dw.id : muser_sampler_sample_u(sp->smp, sp->logits, dw.u);
    } else { /* the row: the next round samples it */
        rc = muser_seq_decode(sp->q, t0, sp->logits, NULL, err);
        if (!rc) muser_sampler_accept(sp->smp, t0);
        if (!rc) {
            sp->st.rounds++;
            return MUSER_OK;
        }
    }
    if (rc)
        return rc;
    if (next < 0)
        return muser_errorf(err, MUSER_E_NUMERIC, "the logits at position %llu hold NaN or Inf",
                            (unsigned long long)sp->n_hist);
    sp->st.rounds++;
    sp->pending = next;
    sp->pending_lp = 0.0f;
    return MUSER_OK;
}

int muser_spec_next(muser_spec *sp, uint32_t max_out, bool last_is_final, bool (*stop)(int32_t, void *), void *arg,
                    int32_t *ids, float *logprobs, uint32_t *n_out, bool *ended, muser_error *err)
{
    *n_out = 0;
    *ended = false;
    if (max_out == 0)
        return MUSER_OK;
    const uint64_t V = muser_seq_model(sp->q)->hp.n_vocab;
    const uint64_t p0 = sp->n_hist;
    uint32_t n = 0;
    /* the next token: a rejection's draw from the last round, or sampled from the current row as
     * plain decoding samples it */
    int32_t t0 = sp->pending;
    float lp0 = sp->pending_lp;
    sp->pending = -1;
    if (t0 < 0) {
        t0 = muser_sampler_sample(sp->smp, sp->logits, logprobs ? &lp0 : NULL, NULL);
        if (t0 < 0)
            return muser_errorf(err, MUSER_E_NUMERIC, "the logits at position %llu hold NaN or Inf",
                                (unsigned long long)p0);
    }
    ids[n] = t0;
    if (logprobs) logprobs[n] = lp0;
    n++;
    sp->st.emitted++;
    if ((stop && stop(t0, arg)) || (n == max_out && last_is_final) || p0 + 1 > sp->n_ctx) {
        *ended = (stop && stop(t0, arg)) || p0 + 1 > sp->n_ctx;
        *n_out = n;
        return MUSER_OK; /* not fed, as plain decoding does not feed it */
    }
    sp->hist[sp->n_hist++] = t0;
    /* drafts: as many as the caller's limit, the context and a verify block allow */
    uint64_t k = muser_spec_next_k(sp);
    sp->skipped = k ? 0 : sp->skipped + 1;
    if (k > max_out - n) k = max_out - n;
    if (k > sp->n_ctx - p0 - 1) k = sp->n_ctx - p0 - 1;
    int32_t block[KV_MAX_SPEC_ROWS];
    block[0] = t0;
    int kd = k ? sp->d->propose(sp->d, sp->hist, sp->n_hist, (uint32_t)k, block + 1, err) : 0;
    if (kd < 0)
        return kd;
    sp->st.drafted += (uint64_t)kd;
    if (kd == 0 && !logprobs && !sp->d->n_tap) { /* nothing to verify: t0 decodes as plain decoding's would */
        const int rc = decode_plain(sp, t0, err);
        if (rc)
            sp->n_hist--;
        *n_out = n;
        return rc;
    }
    const muser_tap tap = {.n_layers = sp->d->n_tap, .layers = sp->d->tap_layers, .out = sp->feats};
    int rc = muser_seq_verify_tap(sp->q, block, (uint32_t)kd + 1, sp->rows, sp->d->n_tap ? &tap : NULL, err);
    if (rc) {
        sp->n_hist--;
        return rc;
    }
    sp->st.rounds++;
    /* a drafter whose observe is queued takes every verified row now, beside the acceptance below;
     * the rows past the kept ones are cut after it (they are never read before) */
    int r1 = sp->d->n_tap && sp->d->observe_early ? sp->d->observe(sp->d, p0, sp->feats, (uint32_t)kd + 1, err)
                                                  : MUSER_OK;
    muser_sampler_accept(sp->smp, t0); /* fed: it counts for the penalties now */
    uint32_t keep = 1;                 /* rows of the block that stay: t0 and the accepted drafts */
    uint32_t n_acc = 0;                /* drafts accepted this round */
    bool all = true, rejected = false;
    for (int i = 0; i < kd; i++) {
        const float *row = sp->rows + (size_t)i * V;
        bool acc = false;
        const int32_t tok = muser_spec_accept(sp->smp, row, block[1 + i], &acc);
        if (tok < 0) {
            rc = muser_errorf(err, MUSER_E_NUMERIC, "the logits at position %llu hold NaN or Inf",
                              (unsigned long long)(p0 + 1 + i));
            break;
        }
        const float lp = logprobs ? muser_sampler_logprob(sp->smp, row, tok) : 0.0f;
        if (!acc) { /* the target's own token: emitted next round, fed in its block */
            sp->pending = tok;
            sp->pending_lp = lp;
            all = false;
            rejected = true;
            break;
        }
        sp->st.accepted++;
        n_acc++;
        sp->st.emitted++;
        ids[n] = tok;
        if (logprobs) logprobs[n] = lp;
        n++;
        if ((stop && stop(tok, arg)) || (n == max_out && last_is_final)) {
            *ended = stop && stop(tok, arg);
            all = false;
            break; /* emitted, not fed */
        }
        muser_sampler_accept(sp->smp, tok);
        sp->hist[sp->n_hist++] = tok;
        keep++;
    }
    if (!rc && all) /* every draft taken: the block's last row is the next position's */
        memcpy(sp->logits, sp->rows + (size_t)kd * V, V * sizeof(float));
    if (!rc && kd > 0) { /* what this round says of the acceptance (adaptive draft length) */
        sp->acc_w = SPEC_DECAY * sp->acc_w + n_acc;
        sp->rej_w = SPEC_DECAY * sp->rej_w + (rejected ? 1.0 : 0.0);
    }
    if (!rc)
        rc = r1;
    int r2 = muser_seq_rollback(sp->q, p0 + keep, err);
    /* the kept rows' hidden states: the drafter's next context (an early observer is cut back to
     * them whatever happened, as the cache is) */
    if (!r2 && sp->d->n_tap && sp->d->observe_early)
        r2 = sp->d->observe(sp->d, p0 + keep, NULL, 0, err);
    else if (!rc && !r2 && sp->d->n_tap)
        r2 = sp->d->observe(sp->d, p0, sp->feats, keep, err);
    *n_out = n;
    return rc ? rc : r2;
}
