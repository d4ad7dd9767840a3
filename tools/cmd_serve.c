/* cmd_serve.c — `muser serve`: an OpenAI-compatible HTTP server over the engine.
 *
 * libmicrohttpd, a thread per connection: each request's thread decodes the body (serve_req.c),
 * tokenizes, opens a sequence on the one engine and runs its prefill and decode steps there, so
 * the decode steps of all running requests share passes (docs/engine.md) and a request's bytes
 * do not depend on its neighbours (row invariance). Streaming responses are server-sent events
 * produced by MHD's content reader, token by token; a client that goes away makes MHD free the
 * reader, which cancels the sequence and frees its slot. SIGTERM (or SIGINT) stops accepting,
 * waits up to --drain seconds for running requests, cancels the rest and exits 0.
 * GET / and its files are the chat page (web/, embedded at build time: serve_page.h).
 * docs/serve.md lists the routes, fields, errors and metrics. */
#include "chat_template.h"
#include "cli.h"
#include "generate.h"
#include "kv.h"
#include "handoff_cli.h"
#include "serve_page.h"
#include "serve_req.h"
#include "spec.h"
#include "util.h"

#include <cjson/cJSON.h>
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <math.h>
#include <microhttpd.h>
#include <openssl/crypto.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define SERVE_BODY_MAX (1u << 20)
#define SERVE_DEFAULT_MAX_TOKENS 256u
#define SERVE_HIST_BUCKETS 12

static const double hist_le[SERVE_HIST_BUCKETS] = {0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30};

typedef struct histo {
    uint64_t b[SERVE_HIST_BUCKETS + 1];
    double sum;
    uint64_t n;
} histo;

#define SERVE_CACHE_MAX 64

/* A prefix-cache entry: an idle sequence holding exactly a prompt's rows (prefilled). */
typedef struct cache_entry {
    muser_seq *q;
    int32_t *tokens;
    size_t n;
    uint64_t used;
    uint32_t refs; /* requests copying from it now */
} cache_entry;

typedef struct server {
    gen_ctx g; /* model, tokenizer (its engine and sequence are unused: the server has its own) */
    muser_engine *eng;
    const chat_template *tpl;
    char eot[64];
    uint64_t n_ctx;
    uint32_t slots, max_waiting;
    const char *api_key;
    const char *model_name;
    const char *backend;
    atomic_bool ready;          /* the model is loaded: set once by the main thread, read by the HTTP threads */
    pthread_mutex_t mu;
    pthread_cond_t slot_free;
    uint32_t running, waiting;
    uint64_t next_id;
    histo ttft, itl, e2e, queue;
    uint64_t prompt_tokens, gen_tokens, outcome[5]; /* stop, length, error, cancelled, refused */
    cache_entry cache[SERVE_CACHE_MAX];
    uint32_t n_cache;         /* --prefix-cache: entries at most (0: off) */
    uint64_t tick, cache_hits, cache_misses, cache_reused;
    handoff_client *remote;   /* --remote-prefill: prompts are prefilled by that producer */
    gen_draft draft;          /* --draft-ngram / --draft: requests speculate */
    muser_model *draft_model; /* --draft: the draft model, and the one engine all requests' drafters */
    muser_engine *draft_eng;  /* share (their draft rows share passes, as the target's rows do) */
    muser_spec_stats spec;    /* the finished requests' speculation, summed */
} server;

enum { OUT_STOP, OUT_LENGTH, OUT_ERROR, OUT_CANCELLED, OUT_REFUSED };
static const char *const outcome_name[] = {"stop", "length", "error", "cancelled", "refused"};

static atomic_int g_stop; /* lock-free: set by the signal handler, read by every thread */
static void on_signal(int sig)
{
    (void)sig;
    atomic_store(&g_stop, 1);
}

static void histo_add(histo *h, double v)
{
    uint32_t i = 0;
    while (i < SERVE_HIST_BUCKETS && v > hist_le[i]) i++;
    h->b[i]++;
    h->sum += v;
    h->n++;
}

/* ---- responses ---- */

static enum MHD_Result reply(struct MHD_Connection *c, int status, const char *type, char *body)
{
    struct MHD_Response *r = MHD_create_response_from_buffer(strlen(body), body, MHD_RESPMEM_MUST_FREE);
    MHD_add_response_header(r, "Content-Type", type);
    enum MHD_Result rc = MHD_queue_response(c, (unsigned)status, r);
    MHD_destroy_response(r);
    return rc;
}

/* A file of the chat page, from the binary. The policy lets the page load its own files only and
 * talk to this server only: no inline script or style, nothing from elsewhere, no framing. */
static enum MHD_Result reply_page(struct MHD_Connection *c, const web_file *f)
{
    struct MHD_Response *r = MHD_create_response_from_buffer(f->size, (void *)f->data, MHD_RESPMEM_PERSISTENT);
    MHD_add_response_header(r, "Content-Type", f->content_type);
    MHD_add_response_header(r, "Content-Security-Policy",
                            "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; "
                            "img-src 'self' data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'");
    MHD_add_response_header(r, "X-Content-Type-Options", "nosniff");
    MHD_add_response_header(r, "Referrer-Policy", "no-referrer");
    MHD_add_response_header(r, "Cache-Control", "no-cache");
    enum MHD_Result rc = MHD_queue_response(c, 200, r);
    MHD_destroy_response(r);
    return rc;
}

static enum MHD_Result reply_json(struct MHD_Connection *c, int status, cJSON *j)
{
    char *s = cJSON_PrintUnformatted(j);
    cJSON_Delete(j);
    return reply(c, status, "application/json", s ? s : strdup("{}"));
}

static cJSON *error_json(const serve_err *e)
{
    cJSON *root = cJSON_CreateObject(), *o = cJSON_AddObjectToObject(root, "error");
    cJSON_AddStringToObject(o, "message", e->msg);
    cJSON_AddStringToObject(o, "type", e->type);
    if (e->param[0]) cJSON_AddStringToObject(o, "param", e->param);
    else cJSON_AddNullToObject(o, "param");
    if (e->code[0]) cJSON_AddStringToObject(o, "code", e->code);
    else cJSON_AddNullToObject(o, "code");
    return root;
}

static enum MHD_Result reply_error(struct MHD_Connection *c, const serve_err *e)
{
    return reply_json(c, e->status, error_json(e));
}

static enum MHD_Result simple_error(struct MHD_Connection *c, int status, const char *type, const char *code,
                                    const char *msg)
{
    serve_err e;
    serve_err_set(&e, status, type, code, NULL, "%s", msg);
    return reply_error(c, &e);
}

/* ---- a generation ---- */

typedef struct tok_rec {
    int32_t id;
    float lp;
    size_t start, end; /* its bytes in the text */
    muser_logprob top[SERVE_MAX_LOGPROBS];
} tok_rec;

typedef struct job {
    server *sv;
    serve_req req;
    uint64_t id;
    muser_seq *q;
    muser_sampler *smp;
    float *logits;               /* the next token's row, unless */
    uint32_t top_n;              /* > 0: it is in top_v / top_id, the last step's best logits (a
                                  * request without logprobs whose sampler needs no more) */
    float top_v[MUSER_TOP_MAX];
    int32_t top_id[MUSER_TOP_MAX];
    bool drawn;                  /* the last step drew the token where its logits are (a plain
                                  * temperature request without logprobs): draw.id, or logits at −1 */
    muser_draw draw;
    /* speculation (the server's drafter; not for a request asking for top logprobs): each round's
     * tokens and logprobs, handed out one a step */
    muser_drafter *d;
    muser_spec sp;
    bool spec_on;
    int32_t sp_ids[KV_MAX_SPEC_ROWS];
    float sp_lp[KV_MAX_SPEC_ROWS];
    uint32_t sp_n, sp_at;
    int32_t *prompt;
    size_t n_prompt, prompt_cap;
    uint32_t max_tokens;
    /* output */
    char *text;
    size_t len, cap, released;  /* bytes of text sent (or final) */
    tok_rec *toks;
    size_t toks_cap;
    uint32_t n_toks, toks_sent;
    muser_detok_stream ds;
    char *piece;
    size_t piece_cap;
    bool done, slot_held, started;
    int outcome;
    double t_submit, t_start, t_first, t_last;
    /* streaming */
    char *sse;
    size_t sse_len, sse_cap, sse_off;
    bool sse_done;
    char created_id[40];
    time_t created;
} job;

static int grow(void **p, size_t *cap, size_t need, size_t elem)
{
    if (need <= *cap) return 0;
    size_t c = *cap ? *cap : 64;
    while (c < need) c *= 2;
    void *n = realloc(*p, c * elem);
    if (!n) return -1;
    *p = n;
    *cap = c;
    return 0;
}

static int add_tokens(job *j, const char *text, bool special, bool bos, muser_error *err)
{
    int32_t *ids = NULL;
    size_t n = 0;
    int rc = muser_tokenize(j->sv->g.tok, text, strlen(text), bos, special, &ids, &n, err);
    if (rc) return rc;
    if (grow((void **)&j->prompt, &j->prompt_cap, j->n_prompt + n, sizeof *j->prompt)) {
        free(ids);
        return muser_errorf(err, MUSER_E_NOMEM, "out of memory");
    }
    memcpy(j->prompt + j->n_prompt, ids, n * sizeof *ids);
    j->n_prompt += n;
    free(ids);
    return MUSER_OK;
}

/* The prompt's tokens: the text (completions, BOS where the model wants it), or the messages in
 * the model's chat template and the assistant header (chat). */
static int build_prompt(job *j, muser_error *err)
{
    const server *sv = j->sv;
    if (j->req.kind == SERVE_COMPLETIONS) return add_tokens(j, j->req.prompt, false, muser_tokenizer_add_bos(sv->g.tok), err);
    const chat_template *t = sv->tpl;
    int rc = MUSER_OK;
    if (t->add_bos && muser_token_bos(sv->g.tok) >= 0) rc = add_tokens(j, "", true, true, err);
    for (uint32_t i = 0; i < j->req.n_messages && !rc; i++) {
        const serve_msg *m = &j->req.messages[i];
        const char *prefix = m->role == SERVE_ROLE_SYSTEM ? t->system_prefix
                             : m->role == SERVE_ROLE_USER ? t->user_prefix
                                                          : t->assistant_prefix;
        rc = add_tokens(j, prefix, true, false, err);
        if (!rc) rc = add_tokens(j, m->content, false, false, err);
        if (!rc) rc = add_tokens(j, sv->eot, true, false, err);
        if (!rc) rc = add_tokens(j, t->after_end, true, false, err);
    }
    if (!rc) rc = add_tokens(j, t->assistant_prefix, true, false, err);
    return rc;
}

/* The longest suffix of text[from, len) that is a prefix of a stop string: held back. */
static size_t stop_holdback(const job *j)
{
    size_t best = 0;
    for (uint32_t s = 0; s < j->req.n_stop; s++) {
        const char *st = j->req.stop[s];
        const size_t sl = strlen(st);
        for (size_t k = sl - 1; k > best; k--)
            if (k <= j->len - j->released && !memcmp(j->text + j->len - k, st, k)) {
                best = k;
                break;
            }
    }
    return best;
}

/* A stop string in the unreleased text: its offset, or (size_t)-1. */
static size_t stop_found(const job *j, size_t from)
{
    size_t first = (size_t)-1;
    for (uint32_t s = 0; s < j->req.n_stop; s++) {
        const size_t sl = strlen(j->req.stop[s]);
        for (size_t p = from; p + sl <= j->len; p++)
            if (!memcmp(j->text + p, j->req.stop[s], sl)) {
                if (p < first) first = p;
                break;
            }
    }
    return first;
}

/* With sv->mu held. */
static void take_slot(job *j)
{
    server *sv = j->sv;
    sv->waiting--;
    sv->running++;
    j->slot_held = true;
}

static void job_finish_metrics(job *j)
{
    server *sv = j->sv;
    const double now = muser_now_s();
    pthread_mutex_lock(&sv->mu);
    sv->outcome[j->outcome]++;
    sv->gen_tokens += j->n_toks;
    if (j->spec_on) {
        sv->spec.rounds += j->sp.st.rounds;
        sv->spec.drafted += j->sp.st.drafted;
        sv->spec.accepted += j->sp.st.accepted;
        sv->spec.emitted += j->sp.st.emitted;
    }
    if (j->started) histo_add(&sv->e2e, now - j->t_submit);
    pthread_mutex_unlock(&sv->mu);
    fprintf(stderr, "muser serve: request %llu: %s, prompt %zu tokens, generated %u, ttft %.3f s, %.1f tok/s, %s\n",
            (unsigned long long)j->id, j->req.kind == SERVE_CHAT ? "chat" : "completion", j->n_prompt, j->n_toks,
            j->t_first > 0 ? j->t_first - j->t_submit : 0.0,
            j->n_toks > 1 && j->t_last > j->t_first ? (j->n_toks - 1) / (j->t_last - j->t_first) : 0.0,
            outcome_name[j->outcome]);
}

static void job_free(job *j)
{
    if (!j) return;
    if (j->q) {
        muser_seq_cancel(j->q);
        muser_engine_close(j->q);
    }
    if (!j->done) {
        j->outcome = OUT_CANCELLED;
        job_finish_metrics(j);
    }
    if (j->spec_on) muser_spec_free(&j->sp);
    muser_drafter_free(j->d); /* (its draft sequence closed: the draft engine holds one a slot) */
    j->d = NULL;
    if (j->slot_held) { /* after the sequences are closed: their KV is free for the next request */
        server *sv = j->sv;
        pthread_mutex_lock(&sv->mu);
        sv->running--;
        j->slot_held = false;
        pthread_cond_signal(&sv->slot_free);
        pthread_mutex_unlock(&sv->mu);
    }
    muser_sampler_free(j->smp);
    serve_req_free(&j->req);
    free(j->logits);
    free(j->prompt);
    free(j->text);
    free(j->toks);
    free(j->piece);
    free(j->sse);
    free(j);
}

/* ---- the prefix cache ----
 * After a prompt is prefilled its cache is forked into an entry (a sequence of its own holding
 * exactly the prompt's rows, least recently used out first). A later request whose prompt starts
 * with an entry's whole prompt copies that cache (muser_seq_copy_from) and prefills only the rest.
 * The copied rows are what the prefill route computed for those tokens, and the route's bytes do
 * not depend on where a prompt's chunks end, so a warm request gives a cold one's bytes. Only whole
 * cached prompts are reused: cutting one shorter would need the sliding-window rows its later
 * positions overwrote. */
static size_t cache_take(job *j)
{
    server *sv = j->sv;
    if (!sv->n_cache) return 0;
    cache_entry *hit = NULL;
    pthread_mutex_lock(&sv->mu);
    for (uint32_t i = 0; i < sv->n_cache; i++) {
        cache_entry *c = &sv->cache[i];
        if (c->q && c->n < j->n_prompt && (!hit || c->n > hit->n) && !memcmp(c->tokens, j->prompt, c->n * sizeof *j->prompt))
            hit = c;
    }
    if (hit) {
        hit->refs++;
        hit->used = ++sv->tick;
    }
    pthread_mutex_unlock(&sv->mu);
    if (!hit) {
        pthread_mutex_lock(&sv->mu);
        sv->cache_misses++;
        pthread_mutex_unlock(&sv->mu);
        return 0;
    }
    muser_error err = {0};
    const int rc = muser_seq_copy_from(j->q, hit->q, &err);
    pthread_mutex_lock(&sv->mu);
    hit->refs--;
    const size_t n = rc ? 0 : hit->n;
    if (rc) sv->cache_misses++;
    else {
        sv->cache_hits++;
        sv->cache_reused += n;
    }
    pthread_mutex_unlock(&sv->mu);
    return n;
}

static void cache_put(job *j)
{
    server *sv = j->sv;
    if (!sv->n_cache || j->n_prompt < 16) return;
    pthread_mutex_lock(&sv->mu);
    cache_entry *slot = NULL;
    for (uint32_t i = 0; i < sv->n_cache; i++) {
        cache_entry *c = &sv->cache[i];
        if (c->q && c->n == j->n_prompt && !memcmp(c->tokens, j->prompt, c->n * sizeof *j->prompt)) {
            c->used = ++sv->tick; /* already cached */
            pthread_mutex_unlock(&sv->mu);
            return;
        }
        if (!c->q) {
            if (!slot || slot->q) slot = c;
        } else if (!c->refs && (!slot || (slot->q && c->used < slot->used))) {
            slot = c;
        }
    }
    if (!slot) {
        pthread_mutex_unlock(&sv->mu);
        return;
    }
    if (slot->q) { /* the least recently used goes */
        muser_engine_close(slot->q);
        free(slot->tokens);
        memset(slot, 0, sizeof *slot);
    }
    muser_error err = {0};
    slot->tokens = malloc(j->n_prompt * sizeof *slot->tokens);
    if (slot->tokens && !muser_engine_open(sv->eng, 0, &slot->q, &err)) {
        if (muser_seq_copy_from(slot->q, j->q, &err)) {
            muser_engine_close(slot->q);
            slot->q = NULL;
        } else {
            memcpy(slot->tokens, j->prompt, j->n_prompt * sizeof *slot->tokens);
            slot->n = j->n_prompt;
            slot->used = ++sv->tick;
        }
    }
    if (!slot->q) {
        free(slot->tokens);
        memset(slot, 0, sizeof *slot);
    }
    pthread_mutex_unlock(&sv->mu);
}

/* Admission, tokenization, the sequence, the prompt: 0, or -1 with *e. */
static int job_start(job *j, serve_err *e)
{
    server *sv = j->sv;
    muser_error err = {0};
    if (build_prompt(j, &err))
        return serve_err_set(e, 400, "invalid_request_error", NULL, NULL, "cannot tokenize the input: %s", err.msg);
    if (j->n_prompt == 0) return serve_err_set(e, 400, "invalid_request_error", NULL, "prompt", "the prompt is empty");
    if (j->n_prompt >= sv->n_ctx)
        return serve_err_set(e, 400, "invalid_request_error", "context_length_exceeded", "messages",
                             "this model's context holds %llu tokens; the input is %zu tokens",
                             (unsigned long long)sv->n_ctx, j->n_prompt);
    const uint64_t room = sv->n_ctx - j->n_prompt;
    j->max_tokens = j->req.max_tokens ? j->req.max_tokens : (uint32_t)(room < SERVE_DEFAULT_MAX_TOKENS ? room : SERVE_DEFAULT_MAX_TOKENS);
    if (j->max_tokens > room)
        return serve_err_set(e, 400, "invalid_request_error", "context_length_exceeded", "max_tokens",
                             "this model's context holds %llu tokens; %zu are the input and %u were asked for",
                             (unsigned long long)sv->n_ctx, j->n_prompt, j->max_tokens);
    /* a slot: wait for one, or 429 when too many wait already */
    pthread_mutex_lock(&sv->mu);
    if (sv->running >= sv->slots && sv->waiting >= sv->max_waiting) {
        sv->outcome[OUT_REFUSED]++;
        const uint32_t running = sv->running, waiting = sv->waiting;
        pthread_mutex_unlock(&sv->mu);
        return serve_err_set(e, 429, "rate_limit_error", "too_many_requests", NULL,
                             "%u requests are running and %u waiting; try again later", running, waiting);
    }
    sv->waiting++;
    while (sv->running >= sv->slots && !atomic_load(&g_stop)) pthread_cond_wait(&sv->slot_free, &sv->mu);
    take_slot(j); /* in the same hold of the lock as the wait: no other request takes the slot between */
    pthread_mutex_unlock(&sv->mu);
    j->t_start = muser_now_s();
    j->started = true;
    pthread_mutex_lock(&sv->mu);
    histo_add(&sv->queue, j->t_start - j->t_submit);
    sv->prompt_tokens += j->n_prompt;
    pthread_mutex_unlock(&sv->mu);
    muser_sampler_params sp;
    muser_sampler_params_default(&sp);
    sp.temperature = j->req.temperature;
    sp.top_p = j->req.top_p;
    sp.top_k = j->req.top_k;
    sp.min_p = j->req.min_p;
    sp.presence_penalty = j->req.presence_penalty;
    sp.frequency_penalty = j->req.frequency_penalty;
    sp.seed = j->req.has_seed ? j->req.seed : (uint64_t)time(NULL) ^ (j->id * 0x9E3779B97F4A7C15ull);
    sp.n_logprobs = j->req.top_logprobs;
    const uint32_t V = sv->g.n_vocab;
    j->logits = malloc(V * sizeof(float));
    if (!j->logits || muser_sampler_new(&j->smp, V, &sp, &err))
        return serve_err_set(e, 500, "server_error", NULL, NULL, "cannot start a sampler: %s", err.msg);
    if (muser_engine_open(sv->eng, 0, &j->q, &err))
        return serve_err_set(e, err.code == MUSER_E_NO_ROOM ? 429 : 500, "server_error", NULL, NULL, "%s", err.msg);
    const size_t reuse = cache_take(j);
    /* remote: the producer sends the rows past the cached prefix (the sequence's position) */
    if (sv->remote ? handoff_fetch(sv->remote, j->q, j->prompt, (uint32_t)j->n_prompt, j->logits, NULL, &err)
                   : muser_seq_prefill(j->q, j->prompt + reuse, (uint32_t)(j->n_prompt - reuse), j->logits, &err))
        return serve_err_set(e, sv->remote ? 502 : 500, "server_error", NULL, NULL, "%s: %s",
                             sv->remote ? "remote prefill" : "prefill", err.msg);
    cache_put(j);
    for (size_t i = 0; i < j->n_prompt; i++) muser_sampler_accept(j->smp, j->prompt[i]);
    if ((sv->draft.ngram || sv->draft_eng) && !j->req.top_logprobs) { /* (a round reports each token's logprob, not
                                                                      * the alternatives) */
        if ((sv->draft_eng ? muser_drafter_model_on(&j->d, sv->draft_eng, sv->g.model, sv->n_ctx, &err)
                           : muser_drafter_ngram_new(&j->d, sv->draft.ngram, &err)) ||
            muser_spec_init(&j->sp, j->q, sv->n_ctx, j->smp, j->d, sv->draft.max, j->prompt, j->n_prompt, j->logits,
                            &err))
            return serve_err_set(e, 500, "server_error", NULL, NULL, "cannot start speculation: %s", err.msg);
        muser_spec_adaptive(&j->sp, !sv->draft.fixed);
        j->spec_on = true;
    }
    muser_detok_stream_init(&j->ds, sv->g.tok);
    j->piece_cap = muser_detok_stream_min_cap(sv->g.tok) + 256;
    j->piece = malloc(j->piece_cap);
    if (!j->piece) return serve_err_set(e, 500, "server_error", NULL, NULL, "out of memory");
    return 0;
}

static bool spec_stop(int32_t id, void *arg) { return muser_token_is_eog((const muser_tokenizer *)arg, id); }

/* A speculating request's next token and its logprob: the next of the last round's, or a new round
 * (the drafter's proposals verified in one pass, the tokens fed as they are accepted). */
static int spec_token(job *j, int32_t *id, float *lp, serve_err *e)
{
    if (j->sp_at == j->sp_n) {
        muser_error err = {0};
        bool ended = false;
        j->sp_n = j->sp_at = 0;
        pthread_mutex_lock(&j->sv->mu);
        const uint32_t others = j->sv->running > 0 ? j->sv->running - 1 : 0; /* (each decodes a row a pass) */
        pthread_mutex_unlock(&j->sv->mu);
        muser_spec_set_neighbours(&j->sp, others);
        if (muser_spec_next(&j->sp, j->max_tokens - j->n_toks, true, spec_stop, j->sv->g.tok, j->sp_ids,
                            j->req.logprobs ? j->sp_lp : NULL, &j->sp_n, &ended, &err))
            return serve_err_set(e, err.code == MUSER_E_CANCELLED ? 499 : 500, "server_error", NULL, NULL, "decode: %s",
                                 err.msg);
        if (!j->sp_n)
            return serve_err_set(e, 500, "server_error", NULL, NULL, "speculation returned no token");
    }
    *id = j->sp_ids[j->sp_at];
    *lp = j->req.logprobs ? j->sp_lp[j->sp_at] : 0.0f;
    j->sp_at++;
    return 0;
}

/* One token: sample (or take speculation's next), record, detokenize, check the stops, feed (unless
 * speculation fed it). Sets done (and outcome). */
static int job_step(job *j, serve_err *e)
{
    server *sv = j->sv;
    muser_error err = {0};
    if (grow((void **)&j->toks, &j->toks_cap, j->n_toks + 1, sizeof *j->toks))
        return serve_err_set(e, 500, "server_error", NULL, NULL, "out of memory");
    tok_rec *t = &j->toks[j->n_toks];
    memset(t, 0, sizeof *t);
    int32_t sid = -1;
    if (j->spec_on && spec_token(j, &sid, &t->lp, e)) return -1;
    const int32_t id = j->spec_on ? sid
                     : j->drawn   ? (j->draw.id >= 0 ? j->draw.id : muser_sampler_sample_u(j->smp, j->logits, j->draw.u))
                       : j->top_n ? muser_sampler_sample_top(j->smp, j->top_v, j->top_id, j->top_n)
                                  : muser_sampler_sample(j->smp, j->logits, j->req.logprobs ? &t->lp : NULL,
                                                         j->req.top_logprobs ? t->top : NULL);
    if (id < 0) return serve_err_set(e, 500, "server_error", NULL, NULL, "the model's logits are not finite");
    const double now = muser_now_s();
    if (!j->n_toks) {
        j->t_first = now;
        pthread_mutex_lock(&sv->mu);
        histo_add(&sv->ttft, now - j->t_submit);
        pthread_mutex_unlock(&sv->mu);
    } else {
        pthread_mutex_lock(&sv->mu);
        histo_add(&sv->itl, now - j->t_last);
        pthread_mutex_unlock(&sv->mu);
    }
    j->t_last = now;
    t->id = id;
    j->n_toks++;
    if (muser_token_is_eog(sv->g.tok, id)) {
        j->n_toks--; /* the end marker is not part of the reply */
        j->released = j->len;
        j->done = true;
        j->outcome = OUT_STOP;
        return 0;
    }
    size_t k = muser_detok_stream_push(&j->ds, id, j->piece, j->piece_cap);
    if (grow((void **)&j->text, &j->cap, j->len + k + 1, 1))
        return serve_err_set(e, 500, "server_error", NULL, NULL, "out of memory");
    t->start = j->len;
    memcpy(j->text + j->len, j->piece, k);
    j->len += k;
    t->end = j->len;
    const size_t from = j->released > 64 ? j->released - 64 : 0;
    const size_t at = j->req.n_stop ? stop_found(j, from) : (size_t)-1;
    if (at != (size_t)-1 && at >= j->released) {
        j->len = at;
        j->released = at;
        while (j->n_toks && j->toks[j->n_toks - 1].start >= at) j->n_toks--; /* tokens inside the stop */
        j->done = true;
        j->outcome = OUT_STOP;
        return 0;
    }
    if (j->n_toks >= j->max_tokens) {
        j->len += muser_detok_stream_flush(&j->ds, j->text + j->len, j->cap - j->len);
        j->released = j->len;
        j->done = true;
        j->outcome = OUT_LENGTH;
        return 0;
    }
    j->released = j->len - (j->req.n_stop ? stop_holdback(j) : 0);
    if (j->spec_on) return 0; /* (the round fed it) */
    /* without logprobs, a greedy or top-k request takes the step's best logits, not its row, and a
     * request drawing over the whole row (temperature, top-p, min-p) its token drawn where the logits are */
    const uint32_t top_k = j->req.logprobs ? 0 : muser_sampler_top_needed(j->smp);
    const muser_top top = {.k = top_k, .v = j->top_v, .id = j->top_id};
    const bool by_top = top_k > 0 && top_k <= MUSER_TOP_MAX;
    float temp = 0.0f, top_p = 1.0f, min_p = 0.0f;
    const bool by_draw = !by_top && !j->req.logprobs && !j->req.top_logprobs &&
                         muser_sampler_draw_params(j->smp, &temp, &top_p, &min_p);
    int rc;
    if (by_draw) {
        j->draw = (muser_draw){.temperature = temp, .top_p = top_p, .min_p = min_p, .u = muser_sampler_uniform(j->smp)};
        rc = muser_seq_decode_draw(j->q, id, j->logits, &j->draw, &err);
    } else {
        rc = muser_seq_decode(j->q, id, by_top ? NULL : j->logits, by_top ? &top : NULL, &err);
    }
    if (rc)
        return serve_err_set(e, err.code == MUSER_E_CANCELLED ? 499 : 500, "server_error", NULL, NULL, "decode: %s",
                             err.msg);
    j->top_n = by_top ? top_k : 0;
    j->drawn = by_draw;
    muser_sampler_accept(j->smp, id);
    return 0;
}

/* ---- JSON of the output ---- */

static cJSON *bytes_of(const char *s, size_t n)
{
    cJSON *a = cJSON_CreateArray();
    for (size_t i = 0; i < n; i++) cJSON_AddItemToArray(a, cJSON_CreateNumber((unsigned char)s[i]));
    return a;
}

static char *token_text(const server *sv, int32_t id, size_t *n)
{
    size_t len = 0;
    const char *b = muser_token_bytes(sv->g.tok, id, &len);
    char *s = malloc(len + 1);
    if (s) {
        if (len) memcpy(s, b, len);
        s[len] = 0;
    }
    *n = len;
    return s;
}

/* Tokens [a, b) as the logprobs object: chat's {content: [{token, logprob, bytes, top_logprobs}]},
 * or completions' {tokens, token_logprobs, top_logprobs, text_offset}. */
static cJSON *logprobs_json(const job *j, uint32_t a, uint32_t b)
{
    const server *sv = j->sv;
    cJSON *lp = cJSON_CreateObject();
    if (j->req.kind == SERVE_CHAT) {
        cJSON *content = cJSON_AddArrayToObject(lp, "content");
        for (uint32_t i = a; i < b; i++) {
            const tok_rec *t = &j->toks[i];
            cJSON *o = cJSON_CreateObject();
            size_t n;
            char *s = token_text(sv, t->id, &n);
            cJSON_AddStringToObject(o, "token", s ? s : "");
            cJSON_AddNumberToObject(o, "logprob", t->lp);
            cJSON_AddItemToObject(o, "bytes", bytes_of(s ? s : "", n));
            free(s);
            cJSON *top = cJSON_AddArrayToObject(o, "top_logprobs");
            for (uint32_t k = 0; k < j->req.top_logprobs && t->top[k].id >= 0; k++) {
                cJSON *x = cJSON_CreateObject();
                char *ts = token_text(sv, t->top[k].id, &n);
                cJSON_AddStringToObject(x, "token", ts ? ts : "");
                cJSON_AddNumberToObject(x, "logprob", t->top[k].logprob);
                cJSON_AddItemToObject(x, "bytes", bytes_of(ts ? ts : "", n));
                free(ts);
                cJSON_AddItemToArray(top, x);
            }
            cJSON_AddItemToArray(content, o);
        }
        return lp;
    }
    cJSON *toks = cJSON_AddArrayToObject(lp, "tokens"), *lps = cJSON_AddArrayToObject(lp, "token_logprobs");
    cJSON *tops = cJSON_AddArrayToObject(lp, "top_logprobs"), *offs = cJSON_AddArrayToObject(lp, "text_offset");
    for (uint32_t i = a; i < b; i++) {
        const tok_rec *t = &j->toks[i];
        size_t n;
        char *s = token_text(sv, t->id, &n);
        cJSON_AddItemToArray(toks, cJSON_CreateString(s ? s : ""));
        free(s);
        cJSON_AddItemToArray(lps, cJSON_CreateNumber(t->lp));
        cJSON *top = cJSON_CreateObject();
        for (uint32_t k = 0; k < j->req.top_logprobs && t->top[k].id >= 0; k++) {
            char *ts = token_text(sv, t->top[k].id, &n);
            cJSON_AddNumberToObject(top, ts ? ts : "", t->top[k].logprob);
            free(ts);
        }
        cJSON_AddItemToArray(tops, top);
        cJSON_AddItemToArray(offs, cJSON_CreateNumber((double)t->start));
    }
    return lp;
}

static cJSON *usage_json(const job *j)
{
    cJSON *u = cJSON_CreateObject();
    cJSON_AddNumberToObject(u, "prompt_tokens", (double)j->n_prompt);
    cJSON_AddNumberToObject(u, "completion_tokens", j->n_toks);
    cJSON_AddNumberToObject(u, "total_tokens", (double)(j->n_prompt + j->n_toks));
    return u;
}

static cJSON *envelope(const job *j, bool chunk)
{
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "id", j->created_id);
    cJSON_AddStringToObject(o, "object", j->req.kind == SERVE_CHAT ? (chunk ? "chat.completion.chunk" : "chat.completion")
                                                                     : "text_completion");
    cJSON_AddNumberToObject(o, "created", (double)j->created);
    cJSON_AddStringToObject(o, "model", j->sv->model_name);
    return o;
}

/* One choice: text [a_txt, b_txt), tokens [a, b), the finish reason (NULL: none yet). */
static cJSON *choice_json(const job *j, size_t a_txt, size_t b_txt, uint32_t a, uint32_t b, const char *finish,
                          bool chunk, bool first)
{
    cJSON *c = cJSON_CreateObject();
    cJSON_AddNumberToObject(c, "index", 0);
    char *s = malloc(b_txt - a_txt + 1);
    if (s) {
        memcpy(s, j->text + a_txt, b_txt - a_txt);
        s[b_txt - a_txt] = 0;
    }
    if (j->req.kind == SERVE_CHAT) {
        cJSON *m = cJSON_AddObjectToObject(c, chunk ? "delta" : "message");
        if (!chunk || first) cJSON_AddStringToObject(m, "role", "assistant");
        if (!chunk || b_txt > a_txt || !finish) cJSON_AddStringToObject(m, "content", s ? s : "");
    } else {
        cJSON_AddStringToObject(c, "text", s ? s : "");
    }
    free(s);
    if (j->req.logprobs) cJSON_AddItemToObject(c, "logprobs", logprobs_json(j, a, b));
    else cJSON_AddNullToObject(c, "logprobs");
    if (finish) cJSON_AddStringToObject(c, "finish_reason", finish);
    else cJSON_AddNullToObject(c, "finish_reason");
    return c;
}

/* ---- streaming ---- */

static void sse_add(job *j, cJSON *o)
{
    char *s = o ? cJSON_PrintUnformatted(o) : NULL;
    cJSON_Delete(o);
    const char *body = s ? s : "[DONE]";
    const size_t n = strlen(body) + 8;
    if (!grow((void **)&j->sse, &j->sse_cap, j->sse_len + n + 1, 1))
        j->sse_len += (size_t)snprintf(j->sse + j->sse_len, n + 1, "data: %s\n\n", body);
    free(s);
}

static ssize_t sse_reader(void *cls, uint64_t pos, char *buf, size_t max)
{
    (void)pos;
    job *j = cls;
    while (j->sse_off == j->sse_len) {
        j->sse_off = j->sse_len = 0;
        if (j->sse_done) return MHD_CONTENT_READER_END_OF_STREAM;
        if (atomic_load(&g_stop) && !j->done) { /* shutting down past the drain: end the stream as cut */
            j->done = true;
            j->outcome = OUT_CANCELLED;
        }
        serve_err e;
        const uint32_t t0 = j->toks_sent;
        const size_t txt0 = j->released;
        int rc = j->done ? 0 : job_step(j, &e);
        if (rc) {
            j->done = true;
            j->outcome = OUT_ERROR;
            cJSON *err = error_json(&e);
            sse_add(j, err);
            sse_add(j, NULL);
            j->sse_done = true;
            job_finish_metrics(j);
            break;
        }
        /* the tokens whose text is now released */
        uint32_t t1 = t0;
        while (t1 < j->n_toks && j->toks[t1].end <= j->released) t1++;
        if (j->done) t1 = j->n_toks;
        const bool first = t0 == 0 && txt0 == 0;
        if (j->released > txt0 || t1 > t0 || first) {
            cJSON *o = envelope(j, true);
            cJSON *ch = cJSON_AddArrayToObject(o, "choices");
            cJSON_AddItemToArray(ch, choice_json(j, txt0, j->released, t0, t1, NULL, true, first));
            if (j->req.include_usage) cJSON_AddNullToObject(o, "usage");
            sse_add(j, o);
            j->toks_sent = t1;
        }
        if (j->done) {
            cJSON *o = envelope(j, true);
            cJSON *ch = cJSON_AddArrayToObject(o, "choices");
            cJSON_AddItemToArray(ch, choice_json(j, j->released, j->released, t1, t1,
                                                 j->outcome == OUT_LENGTH ? "length" : "stop", true, false));
            if (j->req.include_usage) cJSON_AddNullToObject(o, "usage");
            sse_add(j, o);
            if (j->req.include_usage) {
                cJSON *u = envelope(j, true);
                cJSON_AddArrayToObject(u, "choices");
                cJSON_AddItemToObject(u, "usage", usage_json(j));
                sse_add(j, u);
            }
            sse_add(j, NULL);
            j->sse_done = true;
            job_finish_metrics(j);
        }
    }
    const size_t n = j->sse_len - j->sse_off < max ? j->sse_len - j->sse_off : max;
    memcpy(buf, j->sse + j->sse_off, n);
    j->sse_off += n;
    return (ssize_t)n;
}

static void sse_free(void *cls)
{
    job_free(cls);
}

/* ---- routes ---- */

typedef struct conn {
    char *body;
    size_t len, cap;
    bool too_big;
} conn;

static enum MHD_Result do_generate(server *sv, struct MHD_Connection *c, serve_kind kind, const conn *k)
{
    job *j = calloc(1, sizeof *j);
    if (!j) return simple_error(c, 500, "server_error", NULL, "out of memory");
    j->sv = sv;
    j->t_submit = muser_now_s();
    j->created = time(NULL);
    pthread_mutex_lock(&sv->mu);
    j->id = sv->next_id++;
    pthread_mutex_unlock(&sv->mu);
    snprintf(j->created_id, sizeof j->created_id, "%s-%llu", kind == SERVE_CHAT ? "chatcmpl" : "cmpl",
             (unsigned long long)j->id);
    serve_err e;
    if (serve_req_parse(kind, k->body ? k->body : "", k->len, &j->req, &e)) {
        free(j);
        return reply_error(c, &e);
    }
    if (job_start(j, &e)) {
        j->done = true;
        j->outcome = e.status == 429 ? OUT_REFUSED : OUT_ERROR;
        if (j->started) job_finish_metrics(j);
        job_free(j);
        return reply_error(c, &e);
    }
    if (j->req.stream) {
        struct MHD_Response *r = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 4096, sse_reader, j, sse_free);
        MHD_add_response_header(r, "Content-Type", "text/event-stream");
        MHD_add_response_header(r, "Cache-Control", "no-cache");
        enum MHD_Result rc = MHD_queue_response(c, 200, r);
        MHD_destroy_response(r);
        return rc;
    }
    while (!j->done) {
        if (atomic_load(&g_stop)) {
            j->outcome = OUT_CANCELLED;
            break;
        }
        if (job_step(j, &e)) {
            j->done = true;
            j->outcome = OUT_ERROR;
            job_finish_metrics(j);
            job_free(j);
            return reply_error(c, &e);
        }
    }
    j->done = true;
    cJSON *o = envelope(j, false);
    cJSON *ch = cJSON_AddArrayToObject(o, "choices");
    cJSON_AddItemToArray(ch, choice_json(j, 0, j->len, 0, j->n_toks, j->outcome == OUT_LENGTH ? "length" : "stop", false,
                                         true));
    cJSON_AddItemToObject(o, "usage", usage_json(j));
    job_finish_metrics(j);
    job_free(j);
    return reply_json(c, 200, o);
}

static enum MHD_Result do_tokenize(server *sv, struct MHD_Connection *c, const conn *k, bool detok)
{
    cJSON *root = cJSON_ParseWithLength(k->body ? k->body : "", k->len);
    if (!root || !cJSON_IsObject(root)) {
        cJSON_Delete(root);
        return simple_error(c, 400, "invalid_request_error", NULL, "the body must be a JSON object");
    }
    cJSON *out = cJSON_CreateObject();
    const cJSON *f = cJSON_GetObjectItemCaseSensitive(root, detok ? "tokens" : "content");
    const cJSON *x;
    cJSON_ArrayForEach(x, root)
    {
        if (strcmp(x->string, detok ? "tokens" : "content") && (detok || strcmp(x->string, "add_special"))) {
            serve_err e;
            serve_err_set(&e, 400, "invalid_request_error", "unsupported_field", x->string, "field '%.48s' is not supported",
                          x->string);
            cJSON_Delete(root);
            cJSON_Delete(out);
            return reply_error(c, &e);
        }
    }
    if (!detok) {
        const cJSON *sp = cJSON_GetObjectItemCaseSensitive(root, "add_special");
        if (!cJSON_IsString(f) || (sp && !cJSON_IsBool(sp))) {
            cJSON_Delete(root);
            cJSON_Delete(out);
            return simple_error(c, 400, "invalid_request_error", NULL,
                                "'content' must be a string (and 'add_special' a boolean)");
        }
        int32_t *ids = NULL;
        size_t n = 0;
        muser_error err = {0};
        if (muser_tokenize(sv->g.tok, f->valuestring, strlen(f->valuestring), sp && cJSON_IsTrue(sp), false, &ids, &n,
                           &err)) {
            cJSON_Delete(root);
            cJSON_Delete(out);
            return simple_error(c, 400, "invalid_request_error", NULL, err.msg);
        }
        cJSON *a = cJSON_AddArrayToObject(out, "tokens");
        for (size_t i = 0; i < n; i++) cJSON_AddItemToArray(a, cJSON_CreateNumber(ids[i]));
        free(ids);
    } else {
        if (!cJSON_IsArray(f)) {
            cJSON_Delete(root);
            cJSON_Delete(out);
            return simple_error(c, 400, "invalid_request_error", NULL, "'tokens' must be an array of token ids");
        }
        size_t len = 0, cap = 0;
        char *s = NULL;
        cJSON_ArrayForEach(x, f)
        {
            if (!cJSON_IsNumber(x) || x->valuedouble < 0 || x->valuedouble >= sv->g.n_vocab ||
                x->valuedouble != floor(x->valuedouble)) {
                free(s);
                cJSON_Delete(root);
                cJSON_Delete(out);
                return simple_error(c, 400, "invalid_request_error", NULL, "'tokens' holds a value that is not a token id");
            }
            size_t n = 0;
            const char *b = muser_token_bytes(sv->g.tok, (int32_t)x->valuedouble, &n);
            if (grow((void **)&s, &cap, len + n + 1, 1)) break;
            memcpy(s + len, b, n);
            len += n;
        }
        if (s) s[len] = 0;
        cJSON_AddStringToObject(out, "content", s ? s : "");
        free(s);
    }
    cJSON_Delete(root);
    return reply_json(c, 200, out);
}

static void histo_text(char **s, size_t *len, size_t *cap, const char *name, const char *help, const histo *h)
{
    char line[256];
    int n = snprintf(line, sizeof line, "# HELP %s %s\n# TYPE %s histogram\n", name, help, name);
    uint64_t cum = 0;
    for (int i = 0; i <= SERVE_HIST_BUCKETS; i++) {
        cum += h->b[i];
        if (grow((void **)s, cap, *len + 512, 1)) return;
        memcpy(*s + *len, line, (size_t)n);
        *len += (size_t)n;
        if (i < SERVE_HIST_BUCKETS) n = snprintf(line, sizeof line, "%s_bucket{le=\"%g\"} %llu\n", name, hist_le[i], (unsigned long long)cum);
        else n = snprintf(line, sizeof line, "%s_bucket{le=\"+Inf\"} %llu\n", name, (unsigned long long)cum);
    }
    if (grow((void **)s, cap, *len + 512, 1)) return;
    memcpy(*s + *len, line, (size_t)n);
    *len += (size_t)n;
    *len += (size_t)snprintf(*s + *len, 512, "%s_sum %.6f\n%s_count %llu\n", name, h->sum, name, (unsigned long long)h->n);
}

static enum MHD_Result do_metrics(server *sv, struct MHD_Connection *c)
{
    char *s = NULL;
    size_t len = 0, cap = 0;
    muser_engine_stats st;
    muser_engine_stats_get(sv->eng, &st);
    pthread_mutex_lock(&sv->mu);
    const server snap = *sv;
    pthread_mutex_unlock(&sv->mu);
    histo_text(&s, &len, &cap, "muser_time_to_first_token_seconds", "time from arrival to the first token", &snap.ttft);
    histo_text(&s, &len, &cap, "muser_inter_token_latency_seconds", "time between a request's tokens", &snap.itl);
    histo_text(&s, &len, &cap, "muser_request_latency_seconds", "time from arrival to the last token", &snap.e2e);
    histo_text(&s, &len, &cap, "muser_queue_time_seconds", "time waiting for a slot", &snap.queue);
    if (grow((void **)&s, &cap, len + 4096, 1)) return simple_error(c, 500, "server_error", NULL, "out of memory");
    len += (size_t)snprintf(s + len, 4096,
                            "# HELP muser_requests_running requests holding a slot\n# TYPE muser_requests_running gauge\n"
                            "muser_requests_running %u\n"
                            "# HELP muser_requests_waiting requests waiting for a slot\n# TYPE muser_requests_waiting gauge\n"
                            "muser_requests_waiting %u\n"
                            "# HELP muser_kv_cache_usage_ratio KV cache reserved by open sequences, of all slots' budget\n"
                            "# TYPE muser_kv_cache_usage_ratio gauge\nmuser_kv_cache_usage_ratio %.6f\n"
                            "# HELP muser_prompt_tokens_total prompt tokens prefilled\n# TYPE muser_prompt_tokens_total counter\n"
                            "muser_prompt_tokens_total %llu\n"
                            "# HELP muser_generation_tokens_total tokens generated\n# TYPE muser_generation_tokens_total counter\n"
                            "muser_generation_tokens_total %llu\n"
                            "# HELP muser_engine_passes_total passes the engine ran\n# TYPE muser_engine_passes_total counter\n"
                            "muser_engine_passes_total %llu\n"
                            "# HELP muser_engine_decode_passes_total decode passes (packed steps) the engine ran\n"
                            "# TYPE muser_engine_decode_passes_total counter\nmuser_engine_decode_passes_total %llu\n"
                            "# HELP muser_engine_decode_rows_total rows of those passes (over the passes: rows a pass)\n"
                            "# TYPE muser_engine_decode_rows_total counter\nmuser_engine_decode_rows_total %llu\n"
                            "# HELP muser_engine_busy_seconds_total time the engine spent inside passes\n"
                            "# TYPE muser_engine_busy_seconds_total counter\nmuser_engine_busy_seconds_total %.6f\n"
                            "# HELP muser_prefix_cache_hits_total prompts that started from a cached prefix\n"
                            "# TYPE muser_prefix_cache_hits_total counter\nmuser_prefix_cache_hits_total %llu\n"
                            "# HELP muser_prefix_cache_misses_total prompts that found no cached prefix\n"
                            "# TYPE muser_prefix_cache_misses_total counter\nmuser_prefix_cache_misses_total %llu\n"
                            "# HELP muser_prefix_cache_reused_tokens_total prompt tokens taken from the cache\n"
                            "# TYPE muser_prefix_cache_reused_tokens_total counter\nmuser_prefix_cache_reused_tokens_total %llu\n"
                            "# HELP muser_requests_total requests by outcome\n# TYPE muser_requests_total counter\n",
                            snap.running, snap.waiting, snap.slots ? (double)(st.open_seqs < snap.running ? st.open_seqs : snap.running) / snap.slots : 0.0,
                            (unsigned long long)snap.prompt_tokens, (unsigned long long)snap.gen_tokens,
                            (unsigned long long)st.passes, (unsigned long long)st.decode_passes,
                            (unsigned long long)st.decode_rows, st.busy_s, (unsigned long long)snap.cache_hits,
                            (unsigned long long)snap.cache_misses, (unsigned long long)snap.cache_reused);
    for (int i = 0; i < 5; i++)
        len += (size_t)snprintf(s + len, 128, "muser_requests_total{outcome=\"%s\"} %llu\n", outcome_name[i],
                                (unsigned long long)snap.outcome[i]);
    if (grow((void **)&s, &cap, len + 1024, 1)) return simple_error(c, 500, "server_error", NULL, "out of memory");
    len += (size_t)snprintf(s + len, 1024,
                            "# HELP muser_spec_rounds_total verify passes of speculating requests (finished ones)\n"
                            "# TYPE muser_spec_rounds_total counter\nmuser_spec_rounds_total %llu\n"
                            "# HELP muser_spec_draft_tokens_total tokens the drafter proposed\n"
                            "# TYPE muser_spec_draft_tokens_total counter\nmuser_spec_draft_tokens_total %llu\n"
                            "# HELP muser_spec_accepted_tokens_total of them accepted\n"
                            "# TYPE muser_spec_accepted_tokens_total counter\nmuser_spec_accepted_tokens_total %llu\n",
                            (unsigned long long)snap.spec.rounds, (unsigned long long)snap.spec.drafted,
                            (unsigned long long)snap.spec.accepted);
    return reply(c, 200, "text/plain; version=0.0.4", s);
}

static bool authorized(const server *sv, struct MHD_Connection *c)
{
    if (!sv->api_key) return true;
    const char *h = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Authorization");
    const size_t kl = strlen(sv->api_key);
    if (!h || strncmp(h, "Bearer ", 7) || strlen(h + 7) != kl) return false;
    return CRYPTO_memcmp(h + 7, sv->api_key, kl) == 0;
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *c, const char *url, const char *method,
                                  const char *version, const char *upload, size_t *upload_size, void **con_cls)
{
    (void)version;
    server *sv = cls;
    conn *k = *con_cls;
    if (!k) {
        k = calloc(1, sizeof *k);
        if (!k) return MHD_NO;
        *con_cls = k;
        return MHD_YES;
    }
    if (*upload_size) {
        if (k->len + *upload_size > SERVE_BODY_MAX) k->too_big = true;
        else if (!grow((void **)&k->body, &k->cap, k->len + *upload_size + 1, 1)) {
            memcpy(k->body + k->len, upload, *upload_size);
            k->len += *upload_size;
        }
        *upload_size = 0;
        return MHD_YES;
    }
    const bool post = !strcmp(method, "POST"), get = !strcmp(method, "GET");
    const web_file *page = web_file_find(url);
    if (page) { /* no key: the page asks for one; served while the model loads */
        if (!get && strcmp(method, "HEAD")) return simple_error(c, 405, "invalid_request_error", "method_not_allowed", "use GET");
        return reply_page(c, page);
    }
    if (!strcmp(url, "/health")) {
        if (!get) return simple_error(c, 405, "invalid_request_error", "method_not_allowed", "use GET");
        return atomic_load(&sv->ready) ? reply(c, 200, "application/json", strdup("{\"status\":\"ok\"}"))
                         : reply(c, 503, "application/json", strdup("{\"status\":\"loading\"}"));
    }
    if (!atomic_load(&sv->ready)) return simple_error(c, 503, "server_error", "loading", "the model is loading");
    if (!authorized(sv, c)) return simple_error(c, 401, "authentication_error", "invalid_api_key", "a valid 'Authorization: Bearer KEY' header is required");
    if (k->too_big)
        return simple_error(c, 413, "invalid_request_error", "request_too_large", "the body is larger than 1 MiB");
    static const struct { const char *path; bool post; } routes[] = {
        {"/v1/completions", true}, {"/v1/chat/completions", true}, {"/tokenize", true}, {"/detokenize", true},
        {"/v1/models", false},     {"/metrics", false},
    };
    int r = -1;
    for (int i = 0; i < (int)(sizeof routes / sizeof routes[0]); i++)
        if (!strcmp(url, routes[i].path)) r = i;
    if (r < 0) return simple_error(c, 404, "invalid_request_error", "not_found", "no such route");
    if (routes[r].post ? !post : !get)
        return simple_error(c, 405, "invalid_request_error", "method_not_allowed", routes[r].post ? "use POST" : "use GET");
    switch (r) {
    case 0: return do_generate(sv, c, SERVE_COMPLETIONS, k);
    case 1: return do_generate(sv, c, SERVE_CHAT, k);
    case 2: return do_tokenize(sv, c, k, false);
    case 3: return do_tokenize(sv, c, k, true);
    case 4: {
        cJSON *o = cJSON_CreateObject(), *d = cJSON_AddArrayToObject(o, "data"), *m = cJSON_CreateObject();
        cJSON_AddStringToObject(o, "object", "list");
        cJSON_AddStringToObject(m, "id", sv->model_name);
        cJSON_AddStringToObject(m, "object", "model");
        cJSON_AddNumberToObject(m, "created", 0);
        cJSON_AddStringToObject(m, "owned_by", "muser");
        cJSON_AddNumberToObject(m, "context_length", (double)sv->n_ctx);
        cJSON_AddStringToObject(m, "backend", sv->backend);
        cJSON_AddNumberToObject(m, "slots", sv->slots);
        cJSON_AddItemToArray(d, m);
        return reply_json(c, 200, o);
    }
    default: return do_metrics(sv, c);
    }
}

static void on_done(void *cls, struct MHD_Connection *c, void **con_cls, enum MHD_RequestTerminationCode toe)
{
    (void)cls;
    (void)c;
    (void)toe;
    conn *k = *con_cls;
    if (k) {
        free(k->body);
        free(k);
    }
    *con_cls = NULL;
}

/* ---- the command ---- */

static void serve_help(FILE *f)
{
    fprintf(f, "usage: muser serve [-m MODEL] [--host 127.0.0.1] [--port 8080] [--slots N] [--ctx N]\n"
               "                   [--api-key KEY | --api-key-file F] [options]\n\n"
               "An OpenAI-compatible HTTP server: POST /v1/completions, /v1/chat/completions,\n"
               "/tokenize, /detokenize; GET /v1/models, /health, /metrics, and a chat page at /.\n"
               "The decode steps of all running requests share passes; a request's output does not\n"
               "depend on its neighbours.\n\n"
               "options:\n"
               "  --host ADDR             IPv4 address to listen on (default 127.0.0.1)\n"
               "  --port N                TCP port (default 8080; 0: any free one, printed)\n"
               "  --slots N               requests generating at once (default 4); more wait\n"
               "  --queue N               requests that may wait for a slot before 429 (default 64)\n"
               "  --ctx N                 context per request (default 4096, at most the model's)\n"
               "  --prefix-cache N        prompts kept for reuse by later prompts that extend them\n"
               "                          (default 4, at most 64; 0: off)\n"
               "  --api-key KEY           require 'Authorization: Bearer KEY' (not on /health)\n"
               "  --api-key-file F        the same, the key read from F\n"
               "  --drain S               on SIGTERM, seconds to let running requests finish (default 10)\n"
               "  --draft-ngram N         speculate with prompt lookup (n-grams up to N tokens): each\n"
               "                          request's drafts verified in one pass with its next token;\n"
               "                          greedy output unchanged, sampled output the same distribution\n"
               "                          (not for requests asking for top logprobs)\n"
               "  --draft MODEL           speculate with a draft model sharing the vocabulary: one more\n"
               "                          engine on the same backend, its KV a sequence per slot, the\n"
               "                          requests' draft rows sharing its passes\n"
               "  --draft-max K           at most K drafts per verify pass, 1..15 (default 8); each\n"
               "                          round takes as many as the request's acceptance makes pay\n"
               "  --draft-fixed           always ask for K drafts\n"
               "  --backend NAME          cpu (default) or cuda\n"
               "  -t, --threads N         CPU threads\n"
               "  --tensor-parallel N     split the model across N ranks (cuda: a GPU each; docs/tp.md)\n"
               "  -m, --model PATH        GGUF model (default: $MUSER_MODEL or models/default.gguf)\n"
               "  -h, --help              this help\n");
    cli_remote_help(f);
}

/* --draft: the draft model on an engine of its own, on the server's backend (one rank: a draft
 * is small), a sequence of the server's context for each slot. */
static int serve_draft_open(server *sv, const gen_opts *o, muser_error *err)
{
    int rc = muser_model_load(&sv->draft_model, sv->draft.model_path, err);
    if (!rc)
        rc = muser_draft_model_check(sv->draft_model, sv->g.model, err);
    if (rc)
        return rc;
    muser_engine_opts eo;
    memset(&eo, 0, sizeof eo);
    eo.dev.backend = o->sess.backend == MUSER_BACKEND_CUDA ? MUSER_BACKEND_CUDA : MUSER_BACKEND_CPU;
    eo.dev.n_threads = o->sess.n_threads;
    eo.dev.device = o->sess.device;
    eo.dev.n_ctx = sv->n_ctx;
    eo.max_seqs = sv->slots;
    rc = muser_engine_new(&sv->draft_eng, sv->draft_model, &eo, err);
    if (rc)
        return rc;
    fprintf(stderr, "muser serve: draft model %s on %s (KV cache %.1f MB when every slot drafts)\n",
            sv->draft.model_path, muser_backend_name(eo.dev.backend),
            (double)kv_cache_bytes(&sv->draft_model->hp, sv->n_ctx) * sv->slots / 1e6);
    return MUSER_OK;
}

int cmd_serve(int argc, char **argv)
{
    if (cli_wants_help(argc, argv)) {
        serve_help(stdout);
        return 0;
    }
    static server sv;
    memset(&sv, 0, sizeof sv);
    sv.draft = GEN_DRAFT_DEFAULT;
    gen_opts o;
    gen_opts_default(&o, 0);
    const char *host = "127.0.0.1", *key_file = NULL;
    uint64_t port = 8080, slots = 4, queue = 64, ctx = 4096, drain = 10, pcache = 4;
    cli_remote remote = {0};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        uint64_t *num = !strcmp(a, "--port") ? &port : !strcmp(a, "--slots") ? &slots : !strcmp(a, "--queue") ? &queue
                        : !strcmp(a, "--ctx") ? &ctx : !strcmp(a, "--drain") ? &drain
                        : !strcmp(a, "--prefix-cache") ? &pcache : NULL;
        if (num) {
            if (!v || !muser_parse_u64(v, num) || (num != &drain && num != &queue && num != &port && num != &pcache && *num == 0) ||
                (num == &port && *num > 65535) || (num == &pcache && *num > SERVE_CACHE_MAX) ||
                (num == &slots && *num > MUSER_STEP_MAX_ROWS))
                return cli_usage_error("serve", "%s wants a positive number%s", a,
                                       num == &slots ? " up to 64" : num == &port ? " up to 65535" : "");
            i++;
        } else if (!strcmp(a, "--host")) {
            if (!v) return cli_usage_error("serve", "--host needs an address");
            host = v;
            i++;
        } else if (!strcmp(a, "--api-key")) {
            if (!v || !*v) return cli_usage_error("serve", "--api-key needs a key");
            sv.api_key = v;
            i++;
        } else if (!strcmp(a, "--api-key-file")) {
            if (!v) return cli_usage_error("serve", "--api-key-file needs a path");
            key_file = v;
            i++;
        } else {
            int rc = gen_parse_option("serve", argc, argv, &i, &o);
            if (rc == 0) rc = cli_remote_parse("serve", argc, argv, &i, &remote);
            if (rc == 0) rc = gen_parse_draft_option("serve", argc, argv, &i, &sv.draft);
            if (rc < 0) return CLI_EXIT_USAGE;
            if (rc == 0) return cli_usage_error("serve", "unknown option '%s'", a);
        }
    }
    if (cli_remote_check("serve", &remote)) return CLI_EXIT_USAGE;
    if (gen_draft_check("serve", &sv.draft, o.sess.backend)) return CLI_EXIT_USAGE;
    if (sv.draft.dflash_path)
        return cli_usage_error("serve", "--draft-dflash: the server speculates with prompt lookup (--draft-ngram N) or "
                               "a draft model (--draft MODEL); a DFlash drafter runs its own pass per request, "
                               "which the server does not share among requests");
    static char keybuf[512];
    if (key_file) {
        FILE *f = fopen(key_file, "r");
        if (!f || !fgets(keybuf, sizeof keybuf, f)) {
            if (f) fclose(f);
            fprintf(stderr, "muser serve: cannot read the API key from %s\n", key_file);
            return 1;
        }
        fclose(f);
        keybuf[strcspn(keybuf, "\r\n")] = 0;
        if (!*keybuf) {
            fprintf(stderr, "muser serve: %s holds an empty key\n", key_file);
            return 1;
        }
        sv.api_key = keybuf;
    }
    struct sockaddr_in addr;
    memset(&addr, 0, sizeof addr);
    addr.sin_family = AF_INET;
    addr.sin_port = htons((uint16_t)port);
    if (inet_pton(AF_INET, host, &addr.sin_addr) != 1) return cli_usage_error("serve", "--host wants an IPv4 address, got '%s'", host);
    sv.slots = (uint32_t)slots;
    sv.n_cache = (uint32_t)pcache;
    sv.max_waiting = (uint32_t)queue;
    pthread_mutex_init(&sv.mu, NULL);
    pthread_cond_init(&sv.slot_free, NULL);
    signal(SIGTERM, on_signal);
    signal(SIGINT, on_signal);
    signal(SIGPIPE, SIG_IGN);
    /* listen first: /health says 503 while the model loads */
    struct MHD_Daemon *d = MHD_start_daemon(MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_ERROR_LOG,
                                            0, NULL, NULL, on_request, &sv, MHD_OPTION_SOCK_ADDR, (struct sockaddr *)&addr,
                                            MHD_OPTION_NOTIFY_COMPLETED, on_done, NULL,
                                            MHD_OPTION_CONNECTION_MEMORY_LIMIT, (size_t)(64 * 1024),
                                            MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)600, MHD_OPTION_END);
    if (!d) {
        fprintf(stderr, "muser serve: cannot listen on %s:%llu: %s\n", host, (unsigned long long)port, strerror(errno));
        return 1;
    }
    const union MHD_DaemonInfo *bound = MHD_get_daemon_info(d, MHD_DAEMON_INFO_BIND_PORT);
    if (bound && bound->port) port = bound->port; /* --port 0: the one the system chose */
    fprintf(stderr, "muser serve: listening on http://%s:%llu\n", host, (unsigned long long)port);
    int status = 1;
    const char *path = o.model_path ? o.model_path : cli_default_model();
    if (gen_open(&sv.g, "serve", &o) || cli_remote_client("serve", &remote, sv.g.model, path, NULL, &sv.remote)) goto out;
    const uint64_t n_train = sv.g.model->hp.n_ctx_train ? sv.g.model->hp.n_ctx_train : ctx;
    sv.n_ctx = ctx < n_train ? ctx : n_train;
    const char *why;
    sv.tpl = choose_template(&sv.g, &why);
    resolve_end_of_turn(&sv.g, sv.tpl, sv.eot, sizeof sv.eot);
    muser_engine_opts eo;
    memset(&eo, 0, sizeof eo);
    eo.dev = o.sess;
    eo.dev.n_ctx = sv.n_ctx;
    eo.max_seqs = sv.slots * (sv.remote ? 2 : 1) + sv.n_cache; /* a remote prefill builds a detached generation */
    muser_error err = {0};
    if (muser_engine_new(&sv.eng, sv.g.model, &eo, &err)) {
        fprintf(stderr, "muser serve: %s\n", err.msg);
        goto out;
    }
    const muser_hparams *hp = &sv.g.model->hp;
    const double kv_mb = (double)kv_cache_bytes(hp, sv.n_ctx) * sv.slots / 1e6;
    if (sv.draft.model_path && serve_draft_open(&sv, &o, &err)) {
        fprintf(stderr, "muser serve: --draft %s: %s\n", sv.draft.model_path, err.msg);
        goto out;
    }
    const char *base = strrchr(path, '/');
    sv.model_name = base ? base + 1 : path;
    sv.backend = muser_backend_name(o.sess.backend);
    fprintf(stderr,
            "muser serve: %s on %s, %u slots of %llu tokens and %u prefix-cache entries (KV cache %.1f MB when all are "
            "in use), template %s%s%s\n",
            sv.model_name, sv.backend, sv.slots, (unsigned long long)sv.n_ctx, sv.n_cache,
            kv_mb * (sv.slots + sv.n_cache) / sv.slots, sv.tpl->name, remote.addr ? ", prompts prefilled by " : "",
            remote.addr ? remote.addr : "");
    atomic_store(&sv.ready, true);
    while (!atomic_load(&g_stop)) usleep(100 * 1000);
    fprintf(stderr, "muser serve: stopping; draining running requests (up to %llu s)\n", (unsigned long long)drain);
    MHD_quiesce_daemon(d);
    const double until = muser_now_s() + (double)drain;
    atomic_store(&g_stop, 0); /* running requests go on while they drain */
    for (;;) {
        pthread_mutex_lock(&sv.mu);
        const uint32_t busy = sv.running + sv.waiting;
        pthread_mutex_unlock(&sv.mu);
        if (!busy || muser_now_s() >= until) break;
        usleep(50 * 1000);
    }
    atomic_store(&g_stop, 1); /* the rest end now */
    pthread_mutex_lock(&sv.mu);
    pthread_cond_broadcast(&sv.slot_free);
    pthread_mutex_unlock(&sv.mu);
    status = 0;
out:
    MHD_stop_daemon(d);
    for (uint32_t i = 0; i < SERVE_CACHE_MAX; i++) {
        if (sv.cache[i].q) muser_engine_close(sv.cache[i].q);
        free(sv.cache[i].tokens);
    }
    muser_engine_free(sv.eng);
    muser_engine_free(sv.draft_eng); /* (after the requests: their drafters are gone with them) */
    muser_model_free(sv.draft_model);
    handoff_client_free(sv.remote);
    gen_close(&sv.g);
    return status;
}
