/* generate.c — the generation plumbing shared by `muser run` and `muser chat`: option parsing for
 * sampling and the engine, opening everything with progress, chunked prefill, and the sample ->
 * print -> forward loop. See generate.h for the pending-token invariant. */
#include "generate.h"
#include "kv.h"
#include "tp.h"

#include "util.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

volatile sig_atomic_t gen_interrupted;

static void on_sigint(int sig)
{
    (void)sig;
    gen_interrupted = 1;
}

void gen_catch_sigint(bool on)
{
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on ? on_sigint : SIG_DFL;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = 0; /* no SA_RESTART: a blocking read is interrupted */
    sigaction(SIGINT, &sa, NULL);
}

void gen_opts_default(gen_opts *o, uint32_t n_predict)
{
    memset(o, 0, sizeof *o);
    o->sess.backend = MUSER_BACKEND_CPU;
    muser_sampler_params_default(&o->sp);
    o->n_predict = n_predict;
}

void gen_print_option_help(FILE *f)
{
    fprintf(f,
            "  -m, --model PATH        GGUF model (default: $MUSER_MODEL, else %s)\n"
            "  -n, --n-predict N       tokens to generate (per reply in chat)\n"
            "  --temp T                temperature; 0 = greedy (default 0.8)\n"
            "  --top-k K               keep the K most likely; 0 = off (default 40)\n"
            "  --top-p P               keep the smallest set with mass >= P; 1 = off (default 0.95)\n"
            "  --min-p M               drop p < M * p_max; 0 = off (default 0.05)\n"
            "  --repeat-penalty R      penalise recent tokens; 1 = off (default 1)\n"
            "  --repeat-last-n N       window for the penalties (default 64)\n"
            "  --presence-penalty P    subtract P from recent tokens (default 0)\n"
            "  --frequency-penalty F   subtract F x count from recent tokens (default 0)\n"
            "  --seed S                RNG seed (default: random, printed on stderr)\n"
            "  --backend NAME          cpu | cuda | oracle (default cpu)\n"
            "  -t, --threads N         CPU threads; 0 = all cores (default 0)\n"
            "  --ctx N                 context limit in tokens (default: see docs/cli.md)\n"
            "  --tensor-parallel N     split the model across N ranks: with cuda a GPU each (NCCL),\n"
            "                          on the cpu threads sharing the cores (docs/tp.md; default 1)\n",
            cli_default_model());
}

static int parse_u32(const char *cmd, const char *opt, const char *v, uint32_t *out)
{
    uint64_t x;
    if (!v || !muser_parse_u64(v, &x) || x > UINT32_MAX)
        return cli_usage_error(cmd, "%s needs a non-negative integer, got '%s'", opt,
                               v ? v : "(nothing)"),
               -1;
    *out = (uint32_t)x;
    return 1;
}

static int parse_float(const char *cmd, const char *opt, const char *v, float lo, float hi,
                       float *out)
{
    double x;
    if (!v || !muser_parse_f64(v, &x) || !(x >= lo && x <= hi))
        return cli_usage_error(cmd, "%s needs a number in [%g, %g], got '%s'", opt, (double)lo,
                               (double)hi, v ? v : "(nothing)"),
               -1;
    *out = (float)x;
    return 1;
}

int gen_parse_option(const char *cmd, int argc, char **argv, int *i, gen_opts *o)
{
    const char *a = argv[*i];
    const char *v = *i + 1 < argc ? argv[*i + 1] : NULL;
    int rc;
    uint32_t u;
#define TAKES_VALUE() (*i)++
    if (!strcmp(a, "-m") || !strcmp(a, "--model")) {
        if (!v)
            return cli_usage_error(cmd, "%s needs a path", a), -1;
        o->model_path = v;
        TAKES_VALUE();
        return 1;
    }
    if (!strcmp(a, "-n") || !strcmp(a, "--n-predict")) {
        rc = parse_u32(cmd, a, v, &o->n_predict);
    } else if (!strcmp(a, "--temp")) {
        rc = parse_float(cmd, a, v, 0.0f, 1e6f, &o->sp.temperature);
    } else if (!strcmp(a, "--top-k")) {
        rc = parse_u32(cmd, a, v, &o->sp.top_k);
    } else if (!strcmp(a, "--top-p")) {
        rc = parse_float(cmd, a, v, 1e-6f, 1.0f, &o->sp.top_p);
    } else if (!strcmp(a, "--min-p")) {
        rc = parse_float(cmd, a, v, 0.0f, 1.0f, &o->sp.min_p);
    } else if (!strcmp(a, "--repeat-penalty")) {
        rc = parse_float(cmd, a, v, 1e-3f, 1e3f, &o->sp.repeat_penalty);
    } else if (!strcmp(a, "--repeat-last-n")) {
        rc = parse_u32(cmd, a, v, &o->sp.repeat_last_n);
    } else if (!strcmp(a, "--presence-penalty")) {
        rc = parse_float(cmd, a, v, -1e3f, 1e3f, &o->sp.presence_penalty);
    } else if (!strcmp(a, "--frequency-penalty")) {
        rc = parse_float(cmd, a, v, -1e3f, 1e3f, &o->sp.frequency_penalty);
    } else if (!strcmp(a, "--seed")) {
        if (!v || !muser_parse_u64(v, &o->sp.seed))
            return cli_usage_error(cmd, "--seed needs an unsigned 64-bit integer, got '%s'",
                                   v ? v : "(nothing)"),
                   -1;
        o->seed_given = true;
        rc = 1;
    } else if (!strcmp(a, "--backend")) {
        int b = v ? muser_backend_from_name(v) : -1;
        if (b < 0)
            return cli_usage_error(cmd, "--backend must be cpu, cuda or oracle, got '%s'",
                                   v ? v : "(nothing)"),
                   -1;
        o->sess.backend = (muser_backend_kind)b;
        rc = 1;
    } else if (!strcmp(a, "-t") || !strcmp(a, "--threads")) {
        rc = parse_u32(cmd, a, v, &o->sess.n_threads);
    } else if (!strcmp(a, "--ctx")) {
        rc = parse_u32(cmd, a, v, &u);
        o->sess.n_ctx = u;
    } else if (!strcmp(a, "--tensor-parallel")) {
        rc = parse_u32(cmd, a, v, &u);
        if (rc == 1 && (u < 1 || u > MUSER_TP_MAX))
            return cli_usage_error(cmd, "--tensor-parallel needs 1 .. %u ranks, got %u", MUSER_TP_MAX, u), -1;
        o->sess.tp_ranks = u;
    } else {
        return 0;
    }
    if (rc == 1)
        TAKES_VALUE();
#undef TAKES_VALUE
    return rc;
}

/* A seed nobody chose: the kernel's randomness, else the clock and pid. */
static uint64_t random_seed(void)
{
    uint64_t s = 0;
    int fd = open("/dev/urandom", O_RDONLY | O_CLOEXEC);
    if (fd >= 0) {
        ssize_t got = read(fd, &s, sizeof s);
        close(fd);
        if (got == (ssize_t)sizeof s)
            return s;
    }
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return ((uint64_t)ts.tv_sec * 1000000007ULL) ^ (uint64_t)ts.tv_nsec ^
           ((uint64_t)getpid() << 32);
}

/* Touch every page of the mapped weights so the load shows progress here instead of stalling the
 * first token; on a warm page cache this is a quick pass. */
static void page_in(const muser_model *m)
{
    const gguf_file *f = m->gguf;
    if (!f || !f->map || f->size <= f->data_offset)
        return;
    const uint64_t page = 4096, step = 64ull << 20;
    const volatile uint8_t *p = f->map;
    uint64_t total = f->size - f->data_offset;
    muser_progress pr;
    muser_progress_begin(&pr, "loading", total);
    uint8_t sink = 0;
    for (uint64_t off = 0; off < total; off += page) {
        sink ^= p[f->data_offset + off];
        if (off % step == 0)
            muser_progress_update(&pr, off);
    }
    muser_progress_update(&pr, total);
    muser_progress_finish(&pr);
    (void)sink;
}

int gen_open(gen_ctx *g, const char *cmd, gen_opts *o)
{
    memset(g, 0, sizeof *g);
    g->cmd = cmd;
    muser_error err = {0};
    const char *path = o->model_path ? o->model_path : cli_default_model();
    if (!o->model_path && access(path, F_OK) != 0) {
        fprintf(stderr, "muser %s: no model given (-m) and the default model %s does not exist\n",
                cmd, path);
        return 1;
    }
    double t0 = muser_now_s();
    int rc = muser_model_load(&g->model, path, &err);
    if (rc) {
        fprintf(stderr, "muser %s: cannot load model: %s\n", cmd, err.msg);
        return 1;
    }
    if (o->sess.backend != MUSER_BACKEND_CUDA)
        page_in(g->model);
    rc = muser_tokenizer_load(&g->tok, g->model->gguf, &err);
    if (rc) {
        fprintf(stderr, "muser %s: cannot load the tokenizer of %s: %s\n", cmd, path, err.msg);
        gen_close(g);
        return 1;
    }
    const muser_hparams *hp = &g->model->hp;
    g->n_vocab = hp->n_vocab;
    double mb = (double)g->model->weight_bytes / 1e6;
    fprintf(stderr, "muser %s: %s: %s, %u layers, E %u, V %u, %.*f %s of weights, loaded in %.2f s\n",
            cmd, path, muser_arch_name(hp->arch), hp->n_layer, hp->n_embd, hp->n_vocab,
            mb >= 1000 ? 2 : 1, mb >= 1000 ? mb / 1000 : mb, mb >= 1000 ? "GB" : "MB",
            muser_now_s() - t0);

    if (!o->seed_given)
        o->sp.seed = random_seed();
    fprintf(stderr, "muser %s: seed %llu (--seed %llu reproduces this run)\n", cmd,
            (unsigned long long)o->sp.seed, (unsigned long long)o->sp.seed);
    rc = muser_sampler_new(&g->smp, g->n_vocab, &o->sp, &err);
    if (rc) {
        fprintf(stderr, "muser %s: %s\n", cmd, err.msg);
        gen_close(g);
        return 1;
    }
    g->logits = malloc((size_t)g->n_vocab * sizeof *g->logits);
    if (!g->logits) {
        fprintf(stderr, "muser %s: out of memory for the logit row\n", cmd);
        gen_close(g);
        return 1;
    }
    return 0;
}

int gen_start_session(gen_ctx *g, gen_opts *o, uint64_t n_ctx)
{
    muser_error err = {0};
    muser_engine_opts eo;
    memset(&eo, 0, sizeof eo);
    eo.dev = o->sess;
    eo.dev.n_ctx = n_ctx;
    eo.prefill_chunk = o->sess.max_batch; /* 0: the engine's 512 */
    double t0 = muser_now_s();
    int rc = muser_engine_new(&g->eng, g->model, &eo, &err);
    if (!rc) rc = muser_engine_open(g->eng, n_ctx, &g->seq, &err);
    if (rc) {
        fprintf(stderr, "muser %s: cannot start a %s session: %s\n", g->cmd,
                muser_backend_name(o->sess.backend), err.msg);
        return 1;
    }
    g->n_ctx = n_ctx;
    const muser_device *d = muser_engine_device(g->eng);
    g->max_batch = d->opts.max_batch;
    char split[48] = "";
    if (d->opts.tp_ranks > 1) snprintf(split, sizeof split, " split across %u ranks", d->opts.tp_ranks);
    fprintf(stderr, "muser %s: %s backend%s, context %llu tokens (KV cache %.1f MB), ready in %.2f s\n", g->cmd,
            muser_backend_name(d->opts.backend), split, (unsigned long long)n_ctx,
            kv_cache_bytes(&g->model->hp, n_ctx) / 1e6, muser_now_s() - t0);
    return 0;
}

uint64_t gen_pos(const gen_ctx *g)
{
    return g->seq ? muser_seq_pos(g->seq) : 0;
}

int gen_reset(gen_ctx *g, muser_error *err)
{
    muser_engine_close(g->seq);
    g->seq = NULL;
    g->top_n = 0;
    g->drawn = false;
    return muser_engine_open(g->eng, g->n_ctx, &g->seq, err);
}

void gen_close(gen_ctx *g)
{
    muser_engine_close(g->seq);
    muser_engine_free(g->eng);
    muser_sampler_free(g->smp);
    muser_tokenizer_free(g->tok);
    muser_model_free(g->model);
    free(g->logits);
    memset(g, 0, sizeof *g);
}

/* ---- prefill progress --------------------------------------------------------------------------
 * A prompt that takes longer than MUSER_PROGRESS_AFTER seconds (default 1) to prefill reports on
 * stderr: a bar redrawn 4 times a second on a terminal, else a plain line every 2 s, then one line
 * with the total. The engine runs the prompt in chunks and publishes each chunk's end as the
 * sequence's position, so a thread polling that position sees the progress. */
typedef struct gen_progress {
    gen_ctx *g;
    uint64_t p0, total;
    double t0, after, last_line;
    bool tty, shown, stop;
    pthread_t th;
    pthread_mutex_t mu;
    pthread_cond_t cv;
} gen_progress;

static double progress_after(void)
{
    const char *v = getenv("MUSER_PROGRESS_AFTER");
    char *end;
    const double a = v && *v ? strtod(v, &end) : 1.0;
    return v && *v && (*end || !(a >= 0)) ? 1.0 : a;
}

static void progress_print(gen_progress *p, uint64_t done, bool final)
{
    const double el = muser_now_s() - p->t0, rate = el > 0 ? (double)done / el : 0;
    const double left = rate > 0 ? (double)(p->total - done) / rate : 0;
    if (p->tty) {
        char bar[31];
        const int k = (int)(30.0 * (double)done / (double)p->total);
        memset(bar, '#', (size_t)k);
        memset(bar + k, '.', (size_t)(30 - k));
        bar[30] = 0;
        fprintf(stderr, "\r\033[Kmuser %s: prefill [%s] %llu/%llu tokens, %.0f tok/s, ", p->g->cmd, bar,
                (unsigned long long)done, (unsigned long long)p->total, rate);
        if (final) fprintf(stderr, "%.1f s\n", el);
        else fprintf(stderr, "%.1f s left", left);
    } else if (final) {
        fprintf(stderr, "muser %s: prefill %llu tokens in %.1f s (%.0f tok/s)\n", p->g->cmd, (unsigned long long)done, el,
                rate);
    } else {
        fprintf(stderr, "muser %s: prefill %llu/%llu tokens, %.0f tok/s, %.1f s left\n", p->g->cmd,
                (unsigned long long)done, (unsigned long long)p->total, rate, left);
    }
    fflush(stderr);
}

static void *progress_main(void *arg)
{
    gen_progress *p = arg;
    pthread_mutex_lock(&p->mu);
    while (!p->stop) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_nsec += 250000000L;
        if (ts.tv_nsec >= 1000000000L) {
            ts.tv_sec++;
            ts.tv_nsec -= 1000000000L;
        }
        pthread_cond_timedwait(&p->cv, &p->mu, &ts);
        const double now = muser_now_s();
        if (p->stop || now - p->t0 < p->after || (!p->tty && now - p->last_line < 2.0)) continue;
        pthread_mutex_unlock(&p->mu);
        const uint64_t done = gen_pos(p->g) - p->p0;
        pthread_mutex_lock(&p->mu);
        if (p->stop) break;
        progress_print(p, done, false);
        p->shown = true;
        p->last_line = now;
    }
    pthread_mutex_unlock(&p->mu);
    return NULL;
}

/* Start the reporter for a prompt of n tokens (false: not started, the prefill runs all the same). */
static bool progress_start(gen_progress *p, gen_ctx *g, uint64_t n)
{
    memset(p, 0, sizeof *p);
    p->g = g;
    p->p0 = gen_pos(g);
    p->total = n;
    p->after = progress_after();
    p->t0 = muser_now_s();
    p->tty = isatty(STDERR_FILENO) != 0;
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->cv, NULL);
    if (pthread_create(&p->th, NULL, progress_main, p)) {
        pthread_mutex_destroy(&p->mu);
        pthread_cond_destroy(&p->cv);
        return false;
    }
    return true;
}

/* Stop it; a prefill that ran past the threshold (or showed progress) ends with its total line. */
static void progress_end(gen_progress *p, bool ok)
{
    pthread_mutex_lock(&p->mu);
    p->stop = true;
    pthread_cond_signal(&p->cv);
    pthread_mutex_unlock(&p->mu);
    pthread_join(p->th, NULL);
    if (ok && (p->shown || muser_now_s() - p->t0 >= p->after)) progress_print(p, p->total, true);
    else if (p->shown && p->tty) fputc('\n', stderr);
    pthread_mutex_destroy(&p->mu);
    pthread_cond_destroy(&p->cv);
}

int gen_prefill(gen_ctx *g, const int32_t *toks, size_t n, muser_error *err)
{
    return gen_prefill_spec(g, NULL, toks, n, err);
}

int gen_prefill_spec(gen_ctx *g, muser_drafter *d, const int32_t *toks, size_t n, muser_error *err)
{
    const uint64_t past = gen_pos(g);
    if (past + n > g->n_ctx)
        return muser_errorf(err, MUSER_E_CONTEXT_FULL,
                            "%zu tokens do not fit: %llu of %llu context positions are used", n,
                            (unsigned long long)past, (unsigned long long)g->n_ctx);
    if (n > UINT32_MAX)
        return muser_errorf(err, MUSER_E_ARG, "%zu tokens in one prompt", n);
    if (n) { /* the engine runs it in chunks */
        gen_progress pr;
        const bool reporting = progress_start(&pr, g, n);
        int rc = muser_spec_prefill(g->seq, d, toks, (uint32_t)n, g->logits, err);
        if (reporting)
            progress_end(&pr, rc == MUSER_OK);
        if (rc)
            return rc;
        g->top_n = 0;
        g->drawn = false;
    }
    for (size_t i = 0; i < n; i++)
        muser_sampler_accept(g->smp, toks[i]);
    return MUSER_OK;
}

int gen_tokenize_append(gen_ctx *g, const char *text, bool add_bos, bool parse_special,
                        int32_t **vec, size_t *n, size_t *cap, muser_error *err)
{
    int32_t *ids = NULL;
    size_t n_ids = 0;
    int rc = muser_tokenize(g->tok, text, strlen(text), add_bos, parse_special, &ids, &n_ids, err);
    if (rc)
        return rc;
    if (*n + n_ids > *cap) {
        size_t want = (*n + n_ids) * 2 + 16;
        int32_t *grown = realloc(*vec, want * sizeof *grown);
        if (!grown) {
            free(ids);
            return muser_errorf(err, MUSER_E_NOMEM, "out of memory for %zu tokens", want);
        }
        *vec = grown;
        *cap = want;
    }
    if (n_ids)
        memcpy(*vec + *n, ids, n_ids * sizeof *ids);
    *n += n_ids;
    free(ids);
    return MUSER_OK;
}

int gen_generate(gen_ctx *g, uint32_t max_tokens, int32_t stop_id, FILE *out,
                 volatile sig_atomic_t *interrupt, gen_reply *r, muser_error *err)
{
    memset(r, 0, sizeof *r);
    r->pending = -1;
    r->stop = GEN_STOP_LIMIT;
    muser_detok_stream ds;
    muser_detok_stream_init(&ds, g->tok);
    /* one reply's text buffer, big enough for the longest token (a smaller one truncates it) */
    size_t text_cap = muser_detok_stream_min_cap(g->tok);
    text_cap = text_cap < 256 ? 256 : text_cap;
    char *text = malloc(text_cap);
    if (!text)
        return muser_errorf(err, MUSER_E_NOMEM, "out of memory for a %zu-byte text buffer",
                            text_cap);
    int rc = MUSER_OK;
    /* greedy or top-k sampling without penalties: each step hands back the row's best logits the
     * draw needs, and no logit row is copied */
    const uint32_t top_k = muser_sampler_top_needed(g->smp);
    const muser_top top = {.k = top_k, .v = g->top_v, .id = g->top_id};
    const bool by_top = top_k > 0 && top_k <= MUSER_TOP_MAX;
    /* a draw over the whole row (temperature, top-p, min-p): made where the logits are (on the GPU:
     * no row copied) */
    float temp = 0.0f, top_p = 1.0f, min_p = 0.0f;
    const bool by_draw = !by_top && muser_sampler_draw_params(g->smp, &temp, &top_p, &min_p);
    double t0 = muser_now_s();
    while (r->n_tokens < max_tokens) {
        if (interrupt && *interrupt) {
            r->stop = GEN_STOP_INTERRUPT;
            break;
        }
        int32_t id = g->drawn   ? (g->draw.id >= 0 ? g->draw.id : muser_sampler_sample_u(g->smp, g->logits, g->draw.u))
                     : g->top_n ? muser_sampler_sample_top(g->smp, g->top_v, g->top_id, g->top_n)
                                : muser_sampler_sample(g->smp, g->logits, NULL, NULL);
        if (id < 0) {
            rc = muser_errorf(err, (muser_status)id,
                              "the logits at position %llu hold NaN or Inf; stopping",
                              (unsigned long long)gen_pos(g));
            break;
        }
        r->n_tokens++;
        r->pending = id;
        if (id == stop_id || muser_token_is_eog(g->tok, id)) {
            r->stop = GEN_STOP_END;
            break;
        }
        size_t k = muser_detok_stream_push(&ds, id, text, text_cap);
        if (k) {
            fwrite(text, 1, k, out);
            fflush(out);
        }
        if (r->n_tokens == max_tokens)
            break;
        if (gen_pos(g) >= g->n_ctx) {
            r->stop = GEN_STOP_CONTEXT; /* no position left for it */
            break;
        }
        if (by_draw) {
            g->draw = (muser_draw){.temperature = temp, .top_p = top_p, .min_p = min_p, .u = muser_sampler_uniform(g->smp)};
            rc = muser_seq_decode_draw(g->seq, id, g->logits, &g->draw, err);
        } else {
            rc = muser_seq_decode(g->seq, id, by_top ? NULL : g->logits, by_top ? &top : NULL, err);
        }
        g->drawn = false;
        if (rc)
            break;
        g->top_n = by_top ? top_k : 0;
        g->drawn = by_draw;
        muser_sampler_accept(g->smp, id); /* in the context now, so it counts for penalties */
        r->pending = -1;
    }
    size_t k = muser_detok_stream_flush(&ds, text, text_cap);
    if (k)
        fwrite(text, 1, k, out);
    fflush(out);
    free(text);
    r->seconds = muser_now_s() - t0;
    return rc;
}

static bool spec_stop(int32_t id, void *arg)
{
    return muser_token_is_eog((const muser_tokenizer *)arg, id);
}

int gen_generate_spec(gen_ctx *g, muser_drafter *d, uint32_t k, bool adaptive, const int32_t *ctx, size_t n_ctx_toks,
                      uint32_t max_tokens, FILE *out, volatile sig_atomic_t *interrupt, gen_reply *r,
                      muser_spec_stats *st, muser_error *err)
{
    memset(r, 0, sizeof *r);
    r->pending = -1;
    r->stop = GEN_STOP_LIMIT;
    if (g->top_n || (g->drawn && g->draw.id >= 0))
        return muser_errorf(err, MUSER_E_ARG, "speculation needs the last logit row, and a greedy run kept only its token");
    muser_spec sp;
    int rc = muser_spec_init(&sp, g->seq, g->n_ctx, g->smp, d, k, ctx, n_ctx_toks, g->logits, err);
    if (rc)
        return rc;
    muser_spec_adaptive(&sp, adaptive);
    muser_detok_stream ds;
    muser_detok_stream_init(&ds, g->tok);
    size_t text_cap = muser_detok_stream_min_cap(g->tok);
    text_cap = text_cap < 256 ? 256 : text_cap;
    char *text = malloc(text_cap);
    if (!text) {
        muser_spec_free(&sp);
        return muser_errorf(err, MUSER_E_NOMEM, "out of memory for a %zu-byte text buffer", text_cap);
    }
    int32_t ids[KV_MAX_SPEC_ROWS];
    double t0 = muser_now_s();
    while (r->n_tokens < max_tokens) {
        if (interrupt && *interrupt) {
            r->stop = GEN_STOP_INTERRUPT;
            break;
        }
        uint32_t n = 0;
        bool ended = false;
        rc = muser_spec_next(&sp, max_tokens - r->n_tokens, true, spec_stop, g->tok, ids, NULL, &n, &ended, err);
        for (uint32_t i = 0; i < n; i++) {
            r->n_tokens++;
            if (muser_token_is_eog(g->tok, ids[i])) {
                r->stop = GEN_STOP_END;
                break;
            }
            size_t m = muser_detok_stream_push(&ds, ids[i], text, text_cap);
            if (m) {
                fwrite(text, 1, m, out);
                fflush(out);
            }
        }
        if (rc || r->stop == GEN_STOP_END)
            break;
        if (ended) {
            r->stop = GEN_STOP_CONTEXT;
            break;
        }
    }
    size_t m = muser_detok_stream_flush(&ds, text, text_cap);
    if (m)
        fwrite(text, 1, m, out);
    fflush(out);
    free(text);
    r->seconds = muser_now_s() - t0;
    *st = sp.st;
    muser_spec_free(&sp);
    return rc;
}

/* ---- the drafter options ---- */

int gen_parse_draft_option(const char *cmd, int argc, char **argv, int *i, gen_draft *d)
{
    const char *a = argv[*i];
    if (!strcmp(a, "--draft-fixed")) {
        d->fixed = true;
        return 1;
    }
    if (!strcmp(a, "--draft") || !strcmp(a, "--draft-dflash")) {
        if (*i + 1 >= argc) {
            cli_usage_error(cmd, "%s needs a model path", a);
            return -1;
        }
        *(!strcmp(a, "--draft") ? &d->model_path : &d->dflash_path) = argv[++*i];
        return 1;
    }
    if (!strcmp(a, "--draft-ngram") || !strcmp(a, "--draft-max")) {
        uint64_t v;
        if (*i + 1 >= argc || !muser_parse_u64(argv[*i + 1], &v)) {
            cli_usage_error(cmd, "%s needs a number", a);
            return -1;
        }
        ++*i;
        if (!strcmp(a, "--draft-ngram")) {
            if (v < 1 || v > 64) {
                cli_usage_error(cmd, "--draft-ngram wants 1..64");
                return -1;
            }
            d->ngram = (uint32_t)v;
        } else {
            if (v < 1 || v > MUSER_SPEC_MAX_DRAFT) {
                cli_usage_error(cmd, "--draft-max wants 1..%d", MUSER_SPEC_MAX_DRAFT);
                return -1;
            }
            d->max = (uint32_t)v;
        }
        return 1;
    }
    return 0;
}

void gen_print_draft_help(FILE *f)
{
    fprintf(f, "  --draft MODEL           speculate with a draft model sharing the vocabulary\n"
               "  --draft-ngram N         speculate with prompt lookup (n-grams up to N tokens)\n"
               "  --draft-dflash MODEL    speculate with a DFlash drafter trained for this model\n"
               "                          (it reads the model's hidden states; cpu backend only)\n"
               "  --draft-max K           at most K drafts per verify pass, 1..15 (default 8); each\n"
               "                          round takes as many as the acceptance so far makes pay\n"
               "  --draft-fixed           always ask the drafter for K drafts\n");
}

int gen_draft_check(const char *cmd, const gen_draft *d, muser_backend_kind backend)
{
    if ((d->model_path != NULL) + (d->ngram != 0) + (d->dflash_path != NULL) > 1)
        return cli_usage_error(cmd, "--draft, --draft-ngram and --draft-dflash are three drafters: pick one");
    if (d->dflash_path && backend == MUSER_BACKEND_ORACLE)
        return cli_usage_error(cmd, "--draft-dflash reads the model's hidden states through the tap, which the oracle "
                                    "does not keep (it has no per-row residual): use --backend cpu or cuda");
    return 0;
}

/* err's message prefixed with what failed (a copy first: err->msg is also the output) */
static int draft_error(muser_error *err, int rc, const char *what, const char *path)
{
    char why[sizeof err->msg];
    snprintf(why, sizeof why, "%s", err->msg);
    return muser_errorf(err, rc, "%s %s: %s", what, path, why);
}

int gen_drafter_open(gen_ctx *g, const gen_draft *d, const gen_opts *o, uint64_t n_ctx, gen_drafter *out,
                     muser_error *err)
{
    memset(out, 0, sizeof *out);
    int rc = MUSER_OK;
    if (d->ngram) {
        rc = muser_drafter_ngram_new(&out->d, d->ngram, err);
    } else if (d->model_path) {
        rc = muser_model_load(&out->dm, d->model_path, err);
        if (!rc)
            rc = muser_drafter_model_new(&out->d, out->dm, g->model,
                                         o->sess.backend == MUSER_BACKEND_CUDA ? MUSER_BACKEND_CUDA : MUSER_BACKEND_CPU,
                                         o->sess.n_threads, n_ctx, err);
        if (rc)
            rc = draft_error(err, rc, "draft model", d->model_path);
    } else if (d->dflash_path) {
        rc = muser_dflash_load(&out->df, d->dflash_path, g->model, err);
        if (!rc)
            rc = muser_drafter_dflash_new(&out->d, out->df,
                                          o->sess.backend == MUSER_BACKEND_CUDA ? MUSER_DFLASH_CUDA : MUSER_DFLASH_CPU,
                                          n_ctx, err);
        if (rc)
            rc = draft_error(err, rc, "DFlash drafter", d->dflash_path);
    }
    if (rc)
        gen_drafter_close(out);
    return rc;
}

void gen_drafter_close(gen_drafter *dr)
{
    muser_drafter_free(dr->d);
    muser_dflash_free(dr->df);
    muser_model_free(dr->dm);
    memset(dr, 0, sizeof *dr);
}

const char *gen_draft_name(const gen_draft *d)
{
    return d->model_path ? "draft model" : d->dflash_path ? "DFlash" : "n-gram";
}
