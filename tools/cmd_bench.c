/* cmd_bench.c — `muser bench`: prefill and decode speed of a backend, and how close decode
 * comes to the machine's memory bandwidth.
 *
 *   muser bench -m MODEL [--backend cpu|cuda|oracle] [--prompt 128] [--gen 32] [--threads N]
 *               [--ctx 0,4096,...] [--max-batch N]
 *
 * For each context length C in --ctx (default 0): a fresh session and one untimed warm-up prefill
 * (the first forward of a process pays first-touch costs — measured ~10% on the CPU), then
 * --reps times (default 3, medians reported): reset, C filler tokens prefilled untimed, prefill
 * = ONE forward call over --prompt tokens (the batch route), decode = --gen steps of one token,
 * each the greedy token the step before returned (muser_step's argmax: no logits copied out).
 * Decode bytes/token = the weight bytes one token reads (every matrix once, one embedding row)
 * + the K/V bytes its attention reads (f16, every allowed position of every layer); achieved
 * GB/s = bytes/token x tok/s, reported as a % of a bandwidth measured in the same run (a
 * multi-threaded streaming read of a buffer much larger than the caches). A backend whose
 * memory is not host memory (cuda) adds its own measurement in measure_bandwidth.
 *
 * --backend cuda runs the device's own decode lane instead (muser_cuda_bench: the route recorded
 * once as a CUDA graph, greedy tokens fed back on the device, no logits readback), so the numbers
 * are the device's: per depth tok/s, ms/token, weight + KV bytes per token, achieved GB/s and its
 * share of a streaming read of device memory measured in the same run. Then the prefill route:
 * per depth, --prompt tokens in one call after that many untimed (bench_cuda_prefill). --threads
 * does not apply to it. */
#include "cli.h"
#include "cpu/kernels.h"
#include "engine.h"
#include "generate.h"
#include "session.h"
#include "tp.h"
#include "util.h"

#ifdef MUSER_HAVE_CUDA
#include "cuda/cuda_backend.h"
#endif

#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#define BENCH_MAX_CTX 16
#define BENCH_BW_BYTES (512ull << 20)

typedef struct bench_opts {
    const char *model;
    int backend;
    uint32_t prompt, gen, threads, max_batch, reps; /* prompt: the length being measured */
    uint32_t prompts[BENCH_MAX_CTX];                 /* --prompt N1,N2,...: each measured in turn */
    uint32_t n_prompts;
    uint64_t ctx[BENCH_MAX_CTX];
    uint32_t n_ctx;
    uint32_t par[BENCH_MAX_CTX]; /* --parallel: sequence counts (0 entries: not asked) */
    uint32_t n_par;
    uint32_t ver[BENCH_MAX_CTX]; /* --verify: block sizes (0 entries: not asked) */
    uint32_t n_ver;
    uint32_t tp;                 /* --tensor-parallel: ranks (0: not asked) */
    const char *text;            /* -p: the prompt speculation is measured after */
    gen_draft dr;                /* --draft, --draft-ngram, --draft-dflash, --draft-max, --draft-fixed */
} bench_opts;

/* ---- memory bandwidth: threads each sum a slice of one large buffer ---- */

typedef struct bw_slice {
    const uint64_t *p;
    size_t n;
    uint64_t sum;
} bw_slice;

#if defined(__x86_64__)
__attribute__((target("avx2"))) static uint64_t bw_read_avx2(const uint64_t *p, size_t n)
{
    __m256i a = _mm256_setzero_si256(), b = a, c = a, d = a;
    for (size_t i = 0; i + 16 <= n; i += 16) {
        a = _mm256_add_epi64(a, _mm256_load_si256((const __m256i *)(p + i)));
        b = _mm256_add_epi64(b, _mm256_load_si256((const __m256i *)(p + i + 4)));
        c = _mm256_add_epi64(c, _mm256_load_si256((const __m256i *)(p + i + 8)));
        d = _mm256_add_epi64(d, _mm256_load_si256((const __m256i *)(p + i + 12)));
    }
    a = _mm256_add_epi64(_mm256_add_epi64(a, b), _mm256_add_epi64(c, d));
    uint64_t o[4];
    _mm256_storeu_si256((__m256i *)o, a);
    return o[0] + o[1] + o[2] + o[3];
}
#endif

static void *bw_thread(void *arg)
{
    bw_slice *s = arg;
#if defined(__x86_64__)
    if (__builtin_cpu_supports("avx2")) {
        s->sum = bw_read_avx2(s->p, s->n);
        return NULL;
    }
#endif
    uint64_t a = 0;
    for (size_t i = 0; i < s->n; i++)
        a += s->p[i];
    s->sum = a;
    return NULL;
}

/* Best of 5 reads of a 512 MiB buffer by n threads, in GB/s (1e9 bytes); 0 on failure. */
static double host_bandwidth(uint32_t n)
{
    if (n == 0 || n > 256)
        n = 1;
    uint64_t *buf = muser_alloc_aligned(BENCH_BW_BYTES);
    bw_slice *sl = calloc(n, sizeof *sl);
    pthread_t *th = calloc(n, sizeof *th);
    double best = 0.0;
    if (!buf || !sl || !th)
        goto out;
    const size_t words = BENCH_BW_BYTES / 8, per = words / n / 16 * 16;
    for (size_t i = 0; i < words; i++)
        buf[i] = i;
    for (int rep = 0; rep < 5; rep++) {
        const double t0 = muser_now_s();
        uint32_t started = 0;
        for (uint32_t t = 0; t < n; t++) {
            sl[t] = (bw_slice){.p = buf + t * per, .n = per};
            if (pthread_create(&th[t], NULL, bw_thread, &sl[t]))
                break;
            started++;
        }
        for (uint32_t t = 0; t < started; t++)
            pthread_join(th[t], NULL);
        const double dt = muser_now_s() - t0;
        if (started == n && dt > 0) {
            const double gbs = (double)per * n * 8 / dt / 1e9;
            best = gbs > best ? gbs : best;
        }
    }
out:
    muser_free_aligned(buf);
    free(sl);
    free(th);
    return best;
}

/* The bandwidth decode is bounded by on this backend; name says what was measured. */
static double measure_bandwidth(int backend, uint32_t threads, const char **name)
{
    (void)backend; /* the cuda lane measures device memory itself (bench_cuda) */
    *name = "host memory, streaming read";
    return host_bandwidth(threads);
}

/* ---- model byte counts ---- */

static uint64_t tensor_bytes(const muser_tensor *t)
{
    return t->data ? t->row_bytes * t->rows : 0;
}

/* Weight bytes one decode token reads: everything once, but one row of the embedding (unless
 * the LM head is the embedding). */
static uint64_t decode_weight_bytes(const muser_model *m)
{
    uint64_t b = m->weight_bytes - tensor_bytes(&m->tok_embd) + m->tok_embd.row_bytes;
    if (m->output.data == m->tok_embd.data)
        b += tensor_bytes(&m->tok_embd);
    return b;
}

/* f16 K+V bytes attention reads for a token at position p. */
static uint64_t kv_bytes_at(const muser_hparams *hp, uint64_t p)
{
    uint64_t rows = 0;
    for (uint32_t l = 0; l < hp->n_layer; l++) {
        uint64_t span = p + 1;
        if (muser_layer_is_swa(hp, l) && span > hp->swa_window)
            span = hp->swa_window;
        rows += span;
    }
    return rows * hp->n_head_kv * hp->head_dim * 2 * sizeof(uint16_t);
}

/* ---- the run ---- */

#define BENCH_MAX_REPS 64

static int cmp_double(const void *a, const void *b)
{
    const double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median(double *v, uint32_t n)
{
    qsort(v, n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

static int bench_one(const bench_opts *o, const muser_model *m, uint64_t ctx, double bw)
{
    const muser_hparams *hp = &m->hp;
    const uint32_t V = hp->n_vocab;
    muser_session_opts so = {.backend = (muser_backend_kind)o->backend,
                             .n_ctx = ctx + o->prompt + o->gen + 1,
                             .n_threads = o->threads,
                             .max_batch = o->max_batch};
    muser_session *s = NULL;
    muser_error err = {0};
    float *logits = malloc((uint64_t)V * sizeof(float));
    int32_t *tok = malloc((ctx > o->prompt ? ctx : o->prompt) * sizeof(int32_t) + 4);
    int rc = 1;
    if (!logits || !tok) {
        fprintf(stderr, "muser bench: out of memory\n");
        goto out;
    }
    if (muser_session_new(&s, m, &so, &err)) {
        fprintf(stderr, "muser bench: %s\n", err.msg);
        goto out;
    }
    /* deterministic filler tokens */
    uint64_t x = 88172645463325252ull;
    const uint64_t nfill = ctx > o->prompt ? ctx : o->prompt;
    for (uint64_t i = 0; i < nfill; i++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        tok[i] = (int32_t)(x % V);
    }
    const uint32_t step = o->max_batch ? o->max_batch : 512;
    /* warm-up: untimed, so the timed passes do not pay the process's first-touch costs */
    if (muser_session_forward(s, tok, o->prompt, logits, false, &err)) {
        fprintf(stderr, "muser bench: warm-up prefill: %s\n", err.msg);
        goto out;
    }
    double pre_tps[BENCH_MAX_REPS], dec_tps[BENCH_MAX_REPS], pre_s[BENCH_MAX_REPS];
    uint64_t kv_read = 0;
    for (uint32_t r = 0; r < o->reps; r++) {
        muser_session_reset(s);
        for (uint64_t off = 0; off < ctx; off += step) {
            const uint32_t n = (uint32_t)(ctx - off < step ? ctx - off : step);
            if (muser_session_forward(s, tok + off, n, NULL, false, &err)) {
                fprintf(stderr, "muser bench: filling the context: %s\n", err.msg);
                goto out;
            }
        }
        double t0 = muser_now_s();
        if (muser_session_forward(s, tok, o->prompt, logits, false, &err)) {
            fprintf(stderr, "muser bench: prefill: %s\n", err.msg);
            goto out;
        }
        pre_s[r] = muser_now_s() - t0;
        pre_tps[r] = o->prompt / pre_s[r];
        kv_read = 0;
        t0 = muser_now_s();
        int32_t next = muser_argmax(logits, V);
        const muser_top top = {.k = 1, .id = &next};
        for (uint32_t g = 0; g < o->gen; g++) { /* greedy: the step's argmax, no logits copied */
            const int32_t in = next;
            kv_read += kv_bytes_at(hp, s->n_past);
            if (muser_step(s->dev, &s, &in, 1, NULL, &top, NULL, &err)) {
                fprintf(stderr, "muser bench: decode: %s\n", err.msg);
                goto out;
            }
        }
        dec_tps[r] = o->gen / (muser_now_s() - t0);
    }
    const double t_prefill = median(pre_s, o->reps);
    const double prefill_tps = median(pre_tps, o->reps);
    const double decode_tps = median(dec_tps, o->reps);
    const double bytes_tok = (double)decode_weight_bytes(m) + (double)kv_read / o->gen;
    const double gbs = bytes_tok * decode_tps / 1e9;
    printf("ctx %-7llu prefill %4u tok: %8.2f tok/s (%.3f s) | decode %4u tok: %7.2f tok/s "
           "(%.2f ms/tok) | %.1f MB/tok -> %.2f GB/s = %.0f%% of %.2f GB/s | median of %u\n",
           (unsigned long long)ctx, o->prompt, prefill_tps, t_prefill, o->gen, decode_tps,
           1e3 / decode_tps, bytes_tok / 1e6, gbs, bw > 0 ? 100.0 * gbs / bw : 0.0, bw, o->reps);
    rc = 0;
out:
    muser_session_free(s);
    free(logits);
    free(tok);
    return rc;
}

/* Aggregate decode of P sequences on one device: each prefilled with its own short prompt (16 +
 * 3k tokens, so every sequence is at its own position), then --gen steps of one row per sequence
 * in one pass (muser_step), each row the greedy token its sequence's last step returned. */
static int bench_parallel(const bench_opts *o, const muser_model *m, uint32_t P, double *single_tps, double *tps_out)
{
    const uint32_t V = m->hp.n_vocab;
    const uint32_t longest = 16 + 3 * (P - 1);
    muser_session_opts so = {.backend = (muser_backend_kind)o->backend,
                             .n_ctx = longest + o->gen + 1,
                             .n_threads = o->threads,
                             .max_batch = o->max_batch};
    muser_device *d = NULL;
    muser_session *s[MUSER_STEP_MAX_ROWS] = {0};
    muser_error err = {0};
    float *logits = malloc((size_t)P * V * sizeof(float));
    int32_t *tok = malloc((size_t)longest * sizeof(int32_t)), next[MUSER_STEP_MAX_ROWS];
    int rc = 1;
    double tps[BENCH_MAX_REPS];
    if (!logits || !tok || muser_device_new(&d, m, &so, &err)) {
        fprintf(stderr, "muser bench: %s\n", logits && tok ? err.msg : "out of memory");
        goto out;
    }
    for (uint32_t k = 0; k < P; k++)
        if (muser_session_open(&s[k], d, 0, &err)) {
            fprintf(stderr, "muser bench: %s\n", err.msg);
            goto out;
        }
    uint64_t x = 88172645463325252ull;
    for (uint32_t i = 0; i < longest; i++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        tok[i] = (int32_t)(x % V);
    }
    for (uint32_t r = 0; r <= o->reps; r++) { /* rep 0: untimed warm-up */
        for (uint32_t k = 0; k < P; k++) {
            muser_session_reset(s[k]);
            if (muser_session_forward(s[k], tok, 16 + 3 * k, logits + (size_t)k * V, false, &err)) {
                fprintf(stderr, "muser bench: prompt: %s\n", err.msg);
                goto out;
            }
        }
        for (uint32_t k = 0; k < P; k++)
            next[k] = muser_argmax(logits + (size_t)k * V, V);
        const muser_top top = {.k = 1, .id = next};
        const double t0 = muser_now_s();
        for (uint32_t g = 0; g < o->gen; g++) { /* each row's argmax feeds its next step */
            int32_t in[MUSER_STEP_MAX_ROWS];
            memcpy(in, next, P * sizeof *in);
            if (muser_step(d, s, in, P, NULL, &top, NULL, &err)) {
                fprintf(stderr, "muser bench: step: %s\n", err.msg);
                goto out;
            }
        }
        if (r) tps[r - 1] = (double)P * o->gen / (muser_now_s() - t0);
    }
    const double agg = median(tps, o->reps);
    *tps_out = agg;
    if (P == 1) *single_tps = agg;
    printf("parallel %-3u decode %4u steps: %8.2f tok/s aggregate (%.2f ms/step, %.2f tok/s per sequence)",
           P, o->gen, agg, 1e3 * P / agg, agg / P);
    if (*single_tps > 0) printf(" = %.2fx one sequence", agg / *single_tps);
    printf(" | median of %u\n", o->reps);
    rc = 0;
out:
    for (uint32_t k = 0; k < P; k++) muser_session_free(s[k]);
    muser_device_free(d);
    free(logits);
    free(tok);
    return rc;
}

/* --verify: what a speculative verify pass costs. One sequence after C tokens (each --ctx; a
 * short prompt at 0), then --gen times: checkpoint, one pass of B rows of that sequence (the block
 * muser_step verifies), rollback to where it was; ms per pass against B = 1 (a decode step). */
static int bench_verify(const bench_opts *o, const muser_model *m, uint64_t C)
{
    const uint32_t V = m->hp.n_vocab;
    uint32_t bmax = 1;
    for (uint32_t k = 0; k < o->n_ver; k++)
        if (o->ver[k] > bmax) bmax = o->ver[k];
    const uint64_t pre = C > 16 ? C : 16;
    muser_session_opts so = {.backend = (muser_backend_kind)o->backend,
                             .n_ctx = pre + bmax + 1,
                             .n_threads = o->threads,
                             .max_batch = o->max_batch};
    muser_device *d = NULL;
    muser_session *s = NULL;
    muser_error err = {0};
    float *logits = malloc((size_t)bmax * V * sizeof(float));
    int32_t *tok = malloc((size_t)(pre > bmax ? pre : bmax) * sizeof(int32_t));
    muser_session *rs[MUSER_STEP_MAX_ROWS];
    int rc = 1;
    if (!logits || !tok || muser_device_new(&d, m, &so, &err) || muser_session_open(&s, d, 0, &err)) {
        fprintf(stderr, "muser bench: %s\n", logits && tok ? err.msg : "out of memory");
        goto out;
    }
    uint64_t x = 0x9E3779B97F4A7C15ull;
    for (uint64_t i = 0; i < (pre > bmax ? pre : bmax); i++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        tok[i] = (int32_t)(x % V);
    }
    for (uint32_t i = 0; i < bmax; i++) rs[i] = s;
    if (muser_session_forward(s, tok, (uint32_t)pre, NULL, false, &err)) {
        fprintf(stderr, "muser bench: prompt: %s\n", err.msg);
        goto out;
    }
    double one = 0;
    for (uint32_t k = 0; k <= o->n_ver; k++) {
        const uint32_t B = k == 0 ? 1 : o->ver[k - 1];
        if (k > 0 && B == 1) continue;
        double ms[BENCH_MAX_REPS];
        for (uint32_t r = 0; r <= o->reps; r++) { /* rep 0: untimed warm-up (a row count's first pass records its graph) */
            const double t0 = muser_now_s();
            for (uint32_t g = 0; g < o->gen; g++) {
                if (muser_session_checkpoint(s, &err) || muser_step(d, rs, tok, B, logits, NULL, NULL, &err) ||
                    muser_session_rollback(s, pre, &err)) {
                    fprintf(stderr, "muser bench: verify %u: %s\n", B, err.msg);
                    goto out;
                }
            }
            if (r) ms[r - 1] = 1e3 * (muser_now_s() - t0) / o->gen;
        }
        const double t = median(ms, o->reps);
        if (B == 1) one = t;
        printf("verify  ctx %-6llu %2u rows: %8.2f ms/pass = %5.2fx a decode step (%.1f rows/s) | median of %u\n",
               (unsigned long long)C, B, t, t / one, 1e3 * B / t, o->reps);
    }
    rc = 0;
out:
    muser_session_free(s);
    muser_device_free(d);
    free(logits);
    free(tok);
    return rc;
}

/* One greedy generation of o->gen tokens after toks through muser run's loop (generate.c): with
 * drafter d when non-NULL; its text into *text (malloc'ed), its tok/s into *tps. */
static int spec_once(gen_ctx *g, const bench_opts *o, muser_drafter *d, const int32_t *toks, size_t n, char **text,
                     double *tps, muser_spec_stats *st, muser_error *err)
{
    size_t len = 0;
    *text = NULL;
    FILE *f = open_memstream(text, &len);
    if (!f) return muser_errorf(err, MUSER_E_NOMEM, "out of memory");
    gen_reply r;
    int rc = gen_reset(g, err);
    if (!rc) rc = gen_prefill_spec(g, d, toks, n, err);
    if (!rc)
        rc = d ? gen_generate_spec(g, d, o->dr.max, !o->dr.fixed, toks, n, o->gen, f, NULL, &r, st, err)
               : gen_generate(g, o->gen, -1, f, NULL, &r, err);
    fclose(f);
    *tps = !rc && r.seconds > 0 ? r.n_tokens / r.seconds : 0.0;
    return rc;
}

/* --draft…: plain greedy decoding and speculative decoding of --gen tokens after the prompt text
 * -p, in turns (an untimed warm-up of each, then --reps timed rounds), through muser run's loop;
 * the medians, the speedup, the drafts accepted, and whether every text is plain decoding's
 * (greedy: it must be, else the run fails). */
static int bench_spec(const bench_opts *o)
{
    gen_opts go;
    gen_opts_default(&go, o->gen);
    go.model_path = o->model;
    go.sess.backend = (muser_backend_kind)o->backend;
    go.sess.n_threads = o->threads;
    go.sess.max_batch = o->max_batch;
    go.sp.temperature = 0.0f;
    gen_ctx g;
    if (gen_open(&g, "bench", &go)) return 1;
    muser_error err = {0};
    int32_t *toks = NULL;
    size_t n = 0, cap = 0;
    gen_drafter gd = {0};
    char *ref = NULL;
    int rc = 1;
    if (gen_tokenize_append(&g, o->text, true, false, &toks, &n, &cap, &err) || n == 0) {
        fprintf(stderr, "muser bench: the prompt: %s\n", n ? err.msg : "empty");
        goto out;
    }
    const uint64_t n_ctx = n + o->gen + KV_MAX_SPEC_ROWS + 1;
    if (n_ctx > g.model->hp.n_ctx_train) {
        fprintf(stderr, "muser bench: a prompt of %zu tokens and --gen %u exceed the model's context %u\n", n, o->gen,
                g.model->hp.n_ctx_train);
        goto out;
    }
    if (gen_start_session(&g, &go, n_ctx)) goto out;
    printf("model   %s: %s, %u layers, E %u, V %u; backend %s; prompt %zu tokens, %u generated, greedy\n",
           o->model ? o->model : cli_default_model(), muser_arch_name(g.model->hp.arch), g.model->hp.n_layer,
           g.model->hp.n_embd, g.model->hp.n_vocab, muser_backend_name((muser_backend_kind)o->backend), n, o->gen);
    double plain[BENCH_MAX_REPS], spec[BENCH_MAX_REPS];
    muser_spec_stats st;
    memset(&st, 0, sizeof st);
    bool same = true;
    for (uint32_t r = 0; r <= o->reps; r++) { /* round 0: untimed warm-up */
        for (int s = 0; s < 2; s++) {
            char *text = NULL;
            double tps = 0;
            gen_drafter_close(&gd); /* a fresh drafter per run */
            if (s && gen_drafter_open(&g, &o->dr, &go, n_ctx, &gd, &err)) {
                fprintf(stderr, "muser bench: %s\n", err.msg);
                goto out;
            }
            memset(&st, 0, sizeof st);
            if (spec_once(&g, o, gd.d, toks, n, &text, &tps, &st, &err)) {
                fprintf(stderr, "muser bench: %s generation: %s\n", s ? "speculative" : "plain", err.msg);
                free(text);
                goto out;
            }
            if (!s && !ref) ref = text;
            else {
                same &= !strcmp(ref, text);
                free(text);
            }
            if (r) (s ? spec : plain)[r - 1] = tps;
        }
    }
    const double p = median(plain, o->reps), q = median(spec, o->reps);
    printf("spec    plain %.1f tok/s | %s (%s %u drafts): %.1f tok/s = %.2fx, %.2f tokens per pass, %llu of %llu "
           "drafts accepted (%.1f%%) | %s text | median of %u\n",
           p, gen_draft_name(&o->dr), o->dr.fixed ? "always" : "up to", o->dr.max, q, p > 0 ? q / p : 0.0,
           st.rounds ? (double)st.emitted / st.rounds : 0.0, (unsigned long long)st.accepted,
           (unsigned long long)st.drafted, st.drafted ? 100.0 * st.accepted / st.drafted : 0.0,
           same ? "the same" : "A DIFFERENT", o->reps);
    if (!same) fprintf(stderr, "muser bench: speculation changed the greedy text (a bug: it must not)\n");
    rc = same ? 0 : 1;
out:
    gen_drafter_close(&gd);
    free(ref);
    free(toks);
    gen_close(&g);
    return rc;
}

/* The same through the engine (engine.h): P threads, each its sequence's prompt and --gen decode
 * steps (muser_seq_decode), the engine's batcher packing them; the wall time from all threads'
 * release to the last step. */
typedef struct eng_job {
    muser_seq *q;
    const int32_t *tok;
    uint32_t n_prompt, gen, V;
    pthread_barrier_t *go;
    int rc;
} eng_job;

static void *eng_thread(void *arg)
{
    eng_job *j = arg;
    muser_error err = {0};
    float *lg = malloc((size_t)j->V * sizeof *lg);
    j->rc = lg ? muser_seq_prefill(j->q, j->tok, j->n_prompt, lg, &err) : MUSER_E_NOMEM;
    int32_t next = j->rc ? 0 : muser_argmax(lg, j->V);
    const muser_top top = {.k = 1, .id = &next};
    pthread_barrier_wait(j->go);
    for (uint32_t g = 0; g < j->gen && !j->rc; g++) /* greedy: the engine hands back the argmax */
        j->rc = muser_seq_decode(j->q, next, NULL, &top, &err);
    if (j->rc) fprintf(stderr, "muser bench: engine: %s\n", err.msg);
    free(lg);
    return NULL;
}

static int bench_parallel_engine(const bench_opts *o, const muser_model *m, uint32_t P, double packed_tps)
{
    const uint32_t V = m->hp.n_vocab, longest = 16 + 3 * (P - 1);
    muser_engine_opts eo;
    memset(&eo, 0, sizeof eo);
    eo.dev.backend = (muser_backend_kind)o->backend;
    eo.dev.n_ctx = longest + o->gen + 1;
    eo.dev.n_threads = o->threads;
    eo.max_seqs = P;
    muser_engine *e = NULL;
    muser_error err = {0};
    int32_t *tok = malloc((size_t)longest * sizeof *tok);
    double tps[BENCH_MAX_REPS];
    int rc = 1;
    if (!tok || muser_engine_new(&e, m, &eo, &err)) {
        fprintf(stderr, "muser bench: %s\n", tok ? err.msg : "out of memory");
        free(tok);
        return 1;
    }
    uint64_t x = 88172645463325252ull;
    for (uint32_t i = 0; i < longest; i++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        tok[i] = (int32_t)(x % V);
    }
    muser_engine_stats st0 = {0};
    for (uint32_t r = 0; r <= o->reps; r++) { /* rep 0: untimed warm-up */
        muser_engine_stats_get(e, &st0);
        eng_job jobs[MUSER_STEP_MAX_ROWS];
        pthread_t th[MUSER_STEP_MAX_ROWS];
        pthread_barrier_t go;
        pthread_barrier_init(&go, NULL, P + 1);
        bool ok = true;
        for (uint32_t k = 0; k < P; k++) {
            jobs[k] = (eng_job){.tok = tok, .n_prompt = 16 + 3 * k, .gen = o->gen, .V = V, .go = &go};
            ok &= muser_engine_open(e, 0, &jobs[k].q, &err) == 0;
            pthread_create(&th[k], NULL, eng_thread, &jobs[k]);
        }
        pthread_barrier_wait(&go);
        const double t0 = muser_now_s();
        for (uint32_t k = 0; k < P; k++) {
            pthread_join(th[k], NULL);
            ok &= jobs[k].rc == 0;
            muser_engine_close(jobs[k].q);
        }
        pthread_barrier_destroy(&go);
        if (!ok) goto out;
        if (r) tps[r - 1] = (double)P * o->gen / (muser_now_s() - t0);
    }
    const double agg = median(tps, o->reps);
    /* the last rep's decode passes, from the engine's log: rows per pass, time in and between them */
    muser_engine_stats st1;
    muser_engine_stats_get(e, &st1);
    const uint32_t np = (uint32_t)(st1.passes - st0.passes < MUSER_ENGINE_LOG ? st1.passes - st0.passes : MUSER_ENGINE_LOG);
    muser_pass_rec *log = malloc((size_t)np * sizeof *log);
    uint32_t nd = 0, got = log ? muser_engine_passes(e, log, np) : 0;
    double rows = 0, in = 0, gap = 0, prev_end = 0;
    for (uint32_t i = 0; i < got; i++) {
        if (log[i].kind != MUSER_PASS_DECODE) continue;
        rows += log[i].rows;
        in += log[i].t_end - log[i].t_start;
        if (nd++) gap += log[i].t_start - prev_end;
        prev_end = log[i].t_end;
    }
    free(log);
    printf("engine   %-3u decode %4u steps: %8.2f tok/s aggregate through the engine = %.1f%% of the packed route's"
           " | %u passes of %.1f rows, %.2f ms in a pass, %.3f ms between passes\n",
           P, o->gen, agg, packed_tps > 0 ? 100.0 * agg / packed_tps : 0.0, nd, nd ? rows / nd : 0.0,
           nd ? 1e3 * in / nd : 0.0, nd > 1 ? 1e3 * gap / (nd - 1) : 0.0);
    rc = 0;
out:
    muser_engine_free(e);
    free(tok);
    return rc;
}

#ifdef MUSER_HAVE_CUDA
/* The CUDA prefill route: per depth and --prompt length, the depth's tokens prefilled untimed,
 * then the prompt timed (one call; the route cuts it into its chunks), then --gen greedy decode
 * steps after it, on one session. */
static int bench_cuda_prefill(const bench_opts *o, const muser_model *m)
{
    const uint64_t lim = m->hp.n_ctx_train;
    uint64_t need = 0; /* the longest depth + prompt + gen that fits the model's context */
    for (uint32_t i = 0; i < o->n_ctx; i++)
        for (uint32_t k = 0; k < o->n_prompts; k++) {
            const uint64_t n = o->ctx[i] + o->prompts[k] + o->gen + 1;
            if (n <= lim && n > need) need = n;
        }
    if (!need) {
        printf("prefill: skipped (no depth + prompt + gen fits the model's context of %llu)\n", (unsigned long long)lim);
        return 0;
    }
    muser_session_opts so;
    memset(&so, 0, sizeof so);
    so.backend = MUSER_BACKEND_CUDA;
    so.n_ctx = need;
    if (o->max_batch) so.max_batch = o->max_batch;
    muser_error err = {0};
    muser_session *s = NULL;
    if (muser_session_new(&s, m, &so, &err)) {
        fprintf(stderr, "muser bench: %s\n", err.msg);
        return 1;
    }
    printf("session: context %llu, KV cache %.1f MB (the prefill workspace: the backend's line on stderr)\n",
           (unsigned long long)so.n_ctx, kv_cache_bytes(&m->hp, so.n_ctx) / 1e6);
    const uint32_t V = m->hp.n_vocab;
    int32_t *tok = malloc(need * sizeof *tok);
    if (!tok) {
        muser_session_free(s);
        fprintf(stderr, "muser bench: out of memory\n");
        return 1;
    }
    uint64_t x = 99;
    for (uint64_t i = 0; i < need; i++) {
        x = x * 6364136223846793005ull + 1442695040888963407ull;
        tok[i] = (int32_t)((x >> 33) % V);
    }
    int rc = 0;
    for (uint32_t i = 0; i < o->n_ctx && !rc; i++)
        for (uint32_t k = 0; k < o->n_prompts && !rc; k++) {
            muser_session_reset(s);
            const uint64_t depth = o->ctx[i];
            const uint32_t prompt = o->prompts[k];
            if (depth + prompt + o->gen + 1 > lim) {
                printf("ctx %-7llu prefill %5u tok: skipped (past the model's context of %llu)\n",
                       (unsigned long long)depth, prompt, (unsigned long long)lim);
                continue;
            }
            for (uint64_t p = 0; p < depth && !rc; p += 4096) { /* the context, untimed */
                const uint32_t c = (uint32_t)(depth - p < 4096 ? depth - p : 4096);
                rc = muser_session_prefill(s, tok + p, c, NULL, &err);
            }
            const double t0 = muser_now_s();
            if (!rc) rc = muser_session_prefill(s, tok + depth, prompt, NULL, &err);
            const double dt = muser_now_s() - t0;
            /* decode after it: greedy steps through the small-batch route, no logits copied */
            int32_t next = tok[depth + prompt];
            const muser_top top = {.k = 1, .id = &next};
            const double t1 = muser_now_s();
            for (uint32_t g = 0; g < o->gen && !rc; g++) {
                const int32_t in = next;
                rc = muser_step(s->dev, &s, &in, 1, NULL, &top, NULL, &err);
            }
            const double dd = muser_now_s() - t1;
            if (rc) break;
            printf("ctx %-7llu prefill %5u tok: %8.1f tok/s (%.3f s to the first token) | decode %4u tok after it: "
                   "%7.2f tok/s\n",
                   (unsigned long long)depth, prompt, prompt / dt, dt, o->gen, o->gen / dd);
        }
    if (rc) fprintf(stderr, "muser bench: %s\n", err.msg);
    free(tok);
    muser_session_free(s);
    return rc ? 1 : 0;
}
#endif

/* The CUDA lane: one muser_cuda_bench call over every depth (weights uploaded once), then the
 * prefill route when --prompt is given. */
static int bench_cuda(const bench_opts *o, const muser_model *m)
{
#ifdef MUSER_HAVE_CUDA
    muser_cuda_bench_result res;
    muser_cuda_bench_row rows[BENCH_MAX_CTX];
    muser_error err = {0};
    if (muser_cuda_bench(m, 0, o->ctx, o->n_ctx, o->gen, &res, rows, &err)) {
        fprintf(stderr, "muser bench: %s\n", err.msg);
        return 1;
    }
    printf("backend cuda: %s, %s; bandwidth %.1f GB/s (device memory, streaming read); "
           "upload %.1f s; weights read per token %.1f MB\n",
           res.device, res.route, res.read_gbs, res.upload_s, res.weight_bytes / 1e6);
    for (uint32_t i = 0; i < o->n_ctx; i++)
        printf("ctx %-7llu decode %4u tok: %7.2f tok/s (%.3f ms/tok) | %.1f MB/tok -> %.1f GB/s = %.1f%% "
               "of %.1f GB/s\n",
               (unsigned long long)rows[i].ctx, rows[i].gen, rows[i].tok_per_s, rows[i].ms_per_token,
               rows[i].bytes_per_token / 1e6, rows[i].gbs, rows[i].pct_of_read, res.read_gbs);
    return o->prompt ? bench_cuda_prefill(o, m) : 0;
#else
    (void)o;
    (void)m;
    fprintf(stderr, "muser bench: this build has no CUDA backend\n");
    return 1;
#endif
}

static int parse_ctx_list(const char *s, bench_opts *o)
{
    o->n_ctx = 0;
    char buf[256];
    if (strlen(s) >= sizeof buf)
        return -1;
    strcpy(buf, s);
    for (char *save = NULL, *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
        if (o->n_ctx == BENCH_MAX_CTX || !muser_parse_u64(t, &o->ctx[o->n_ctx]))
            return -1;
        o->n_ctx++;
    }
    return o->n_ctx ? 0 : -1;
}

static bool parse_u32(const char *s, uint32_t *out, uint32_t lo)
{
    uint64_t v;
    if (!muser_parse_u64(s, &v) || v < lo || v > UINT32_MAX)
        return false;
    *out = (uint32_t)v;
    return true;
}

/* A list like 4,16 of counts in 1..max into out[] (*n of them); a usage error (printed, -1) else. */
static int parse_count_list(const char *v, const char *flag, const char *what, uint32_t max, uint32_t *out,
                            uint32_t *n)
{
    bench_opts t = {0};
    if (parse_ctx_list(v, &t)) {
        cli_usage_error("bench", "%s wants a list like 4,16, got '%s'", flag, v);
        return -1;
    }
    for (uint32_t k = 0; k < t.n_ctx; k++) {
        if (t.ctx[k] < 1 || t.ctx[k] > max) {
            cli_usage_error("bench", "%s %s must be 1..%u, got %llu", flag, what, max, (unsigned long long)t.ctx[k]);
            return -1;
        }
        out[k] = (uint32_t)t.ctx[k];
    }
    *n = t.n_ctx;
    return 0;
}

/* --threads, or every online core */
static uint32_t bench_threads(const bench_opts *o)
{
    if (o->threads) return o->threads;
    const long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? (uint32_t)n : 1;
}

/* --tensor-parallel N: a prefill of --prompt tokens, then --gen greedy decode steps, on N ranks that
 * each hold 1/N of every matrix, beside one rank (tp.h): CPU ranks share the threads, CUDA ranks
 * take a GPU each. */
static int bench_tp_one(const bench_opts *o, const muser_model *m, uint32_t n, uint32_t threads, double *pf, double *dec)
{
    const uint32_t V = m->hp.n_vocab;
    muser_session_opts so = {.backend = o->backend,
                             .tp_ranks = n,
                             .n_ctx = o->prompt + o->gen + 1,
                             .n_threads = threads / n ? threads / n : 1,
                             .max_batch = o->max_batch};
    muser_session *s = NULL;
    muser_error err = {0};
    float *logits = malloc((size_t)V * sizeof(float));
    int32_t *tok = malloc((size_t)o->prompt * sizeof(int32_t));
    double tpf[BENCH_MAX_REPS], tdec[BENCH_MAX_REPS];
    int rc = 1;
    if (!logits || !tok) {
        fprintf(stderr, "muser bench: out of memory\n");
        goto out;
    }
    uint64_t x = 88172645463325252ull;
    for (uint32_t i = 0; i < o->prompt; i++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        tok[i] = (int32_t)(x % V);
    }
    if (muser_session_new(&s, m, &so, &err)) {
        fprintf(stderr, "muser bench: --tensor-parallel %u: %s\n", n, err.msg);
        goto out;
    }
    for (uint32_t r = 0; r <= o->reps; r++) { /* rep 0: untimed warm-up */
        muser_session_reset(s);
        const double t0 = muser_now_s();
        if (muser_session_prefill(s, tok, o->prompt, logits, &err)) {
            fprintf(stderr, "muser bench: prompt: %s\n", err.msg);
            goto out;
        }
        const double t1 = muser_now_s();
        /* greedy: each step hands back its best token only (no logit row copied) */
        int32_t t = muser_argmax(logits, V);
        const muser_top best = {.k = 1, .v = NULL, .id = &t};
        for (uint32_t k = 0; k < o->gen; k++)
            if (muser_step(s->dev, &s, &t, 1, NULL, &best, NULL, &err)) {
                fprintf(stderr, "muser bench: step: %s\n", err.msg);
                goto out;
            }
        if (r) tpf[r - 1] = o->prompt / (t1 - t0), tdec[r - 1] = o->gen / (muser_now_s() - t1);
    }
    *pf = median(tpf, o->reps);
    *dec = median(tdec, o->reps);
    rc = 0;
out:
    muser_session_free(s);
    free(logits);
    free(tok);
    return rc;
}

static int bench_tp(const bench_opts *o, const muser_model *m)
{
    if (o->backend != MUSER_BACKEND_CPU && o->backend != MUSER_BACKEND_CUDA) {
        fprintf(stderr, "muser bench: --tensor-parallel runs on the cpu or cuda backend\n");
        return 1;
    }
    muser_error err = {0};
    if (muser_tp_check(m, o->tp, &err)) {
        fprintf(stderr, "muser bench: --tensor-parallel %u: %s\n", o->tp, err.msg);
        return 1;
    }
    const uint32_t threads = bench_threads(o);
    const bool gpu = o->backend == MUSER_BACKEND_CUDA;
    printf("model   %s: %s, %u layers, E %u, F %u, V %u, %.1f MB of weights; backend %s", o->model,
           muser_arch_name(m->hp.arch), m->hp.n_layer, m->hp.n_embd, m->hp.n_ff, m->hp.n_vocab, m->weight_bytes / 1e6,
           gpu ? "cuda, a GPU a rank" : "cpu");
    if (!gpu) printf(", %u threads", threads);
    printf("\n");
    double pf1 = 0, dec1 = 0;
    const uint32_t ns[2] = {1, o->tp};
    for (uint32_t k = 0; k < (o->tp > 1 ? 2u : 1u); k++) {
        double pf, dec;
        if (bench_tp_one(o, m, ns[k], threads, &pf, &dec)) return 1;
        if (k == 0) pf1 = pf, dec1 = dec;
        printf("tp %-2u   prefill %5u tok: %9.2f tok/s (%.2fx one rank) | decode %4u tok: %8.2f tok/s (%.2fx) | ",
               ns[k], o->prompt, pf, pf / pf1, o->gen, dec, dec / dec1);
        if (!gpu) printf("%u threads a rank | ", threads / ns[k] ? threads / ns[k] : 1);
        printf("median of %u\n", o->reps);
    }
    return 0;
}

int cmd_bench(int argc, char **argv)
{
    if (cli_wants_help(argc, argv)) {
        printf("usage: muser bench [-m MODEL] [--backend cpu|cuda|oracle] [--prompt N1,N2,...] [--gen N]\n"
               "                   [--threads N] [--ctx C1,C2,...] [--max-batch N] [--reps N]\n"
               "                   [--parallel P1,P2,...] [--verify B1,B2,...] [--tensor-parallel N]\n"
               "                   [-p TEXT --draft MODEL|--draft-ngram N|--draft-dflash MODEL\n"
               "                    [--draft-max K] [--draft-fixed]]\n"
               "Prefill (one batch call of --prompt tokens, default 128; a list measures each\n"
               "length) and decode (--gen greedy tokens, default 32) speed after C tokens of\n"
               "context (--ctx, default 0), with decode bytes/token, achieved GB/s and its share\n"
               "of the memory bandwidth measured in the same run. CPU/oracle: one untimed\n"
               "warm-up prefill, then --reps timed repetitions (default 3, at most 64); the\n"
               "medians are printed. CUDA: the decode table per depth, then per depth and\n"
               "prompt length the prefill's tok/s, its time to the first token and decode after it.\n"
               "--parallel P1,P2,...: aggregate decode of P sequences packed into one pass per\n"
               "step (the small-batch route; P <= 64), each after its own short prompt, beside\n"
               "P = 1 (single-stream decode through the same route).\n"
               "--verify B1,B2,...: the cost of a speculative verify pass of B rows of one\n"
               "sequence (checkpoint, one muser_step of B rows, rollback) beside a decode step,\n"
               "after each --ctx of context (B <= 16).\n"
               "--tensor-parallel N: prefill (--prompt) and decode (--gen) with the model split\n"
               "across N ranks (heads and FFN rows), beside one rank: CPU ranks share the\n"
               "cores; with --backend cuda a GPU a rank, reducing through NCCL (docs/tp.md).\n"
               "-p TEXT with a drafter (below): greedy speculative decoding of --gen tokens after\n"
               "TEXT against plain greedy decoding, in turns, --reps rounds after a warm-up; the\n"
               "medians, the speedup, the acceptance; the texts must be the same.\n");
        gen_print_draft_help(stdout);
        return 0;
    }
    bench_opts o = {.model = NULL, .backend = MUSER_BACKEND_CPU, .prompt = 128, .prompts = {128}, .n_prompts = 1,
                    .gen = 32, .n_ctx = 1, .reps = 3, .dr = GEN_DRAFT_DEFAULT};
    for (int i = 1; i < argc; i++) {
        const int drc = gen_parse_draft_option("bench", argc, argv, &i, &o.dr);
        if (drc < 0) return CLI_EXIT_USAGE;
        if (drc > 0) continue;
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "-p")) {
            if (!v) return cli_usage_error("bench", "-p needs a prompt text");
            o.text = argv[++i];
            continue;
        }
        if (!strcmp(a, "-m") || !strcmp(a, "--model") || !strcmp(a, "--backend") ||
            !strcmp(a, "--prompt") || !strcmp(a, "--gen") || !strcmp(a, "--threads") ||
            !strcmp(a, "--ctx") || !strcmp(a, "--max-batch") || !strcmp(a, "--reps") ||
            !strcmp(a, "--parallel") || !strcmp(a, "--verify") || !strcmp(a, "--tensor-parallel")) {
            if (!v)
                return cli_usage_error("bench", "%s needs a value", a);
            i++;
        } else {
            return cli_usage_error("bench", "unknown argument '%s'", a);
        }
        if (!strcmp(a, "-m") || !strcmp(a, "--model")) {
            o.model = v;
        } else if (!strcmp(a, "--backend")) {
            if ((o.backend = muser_backend_from_name(v)) < 0)
                return cli_usage_error("bench", "unknown backend '%s' (cpu, cuda, oracle)", v);
        } else if (!strcmp(a, "--prompt")) {
            if (parse_count_list(v, "--prompt", "lengths", UINT32_MAX - 1, o.prompts, &o.n_prompts))
                return CLI_EXIT_USAGE;
            for (uint32_t k = 0; k < o.n_prompts; k++)
                if (o.prompts[k] < 2)
                    return cli_usage_error("bench", "--prompt lengths must be at least 2, got %u", o.prompts[k]);
            o.prompt = o.prompts[0];
        } else if (!strcmp(a, "--gen")) {
            if (!parse_u32(v, &o.gen, 1))
                return cli_usage_error("bench", "--gen wants an integer >= 1, got '%s'", v);
        } else if (!strcmp(a, "--threads")) {
            if (!parse_u32(v, &o.threads, 1))
                return cli_usage_error("bench", "--threads wants an integer >= 1, got '%s'", v);
        } else if (!strcmp(a, "--max-batch")) {
            if (!parse_u32(v, &o.max_batch, 1))
                return cli_usage_error("bench", "--max-batch wants an integer >= 1, got '%s'", v);
        } else if (!strcmp(a, "--reps")) {
            if (!parse_u32(v, &o.reps, 1) || o.reps > BENCH_MAX_REPS)
                return cli_usage_error("bench", "--reps wants an integer in [1, %d], got '%s'",
                                       BENCH_MAX_REPS, v);
        } else if (!strcmp(a, "--ctx")) {
            if (parse_ctx_list(v, &o))
                return cli_usage_error("bench", "--ctx wants a list like 0,4096, got '%s'", v);
        } else if (!strcmp(a, "--verify")) {
            if (parse_count_list(v, "--verify", "blocks", KV_MAX_SPEC_ROWS, o.ver, &o.n_ver))
                return CLI_EXIT_USAGE;
        } else if (!strcmp(a, "--tensor-parallel")) {
            if (!parse_u32(v, &o.tp, 1) || o.tp > MUSER_TP_MAX)
                return cli_usage_error("bench", "--tensor-parallel wants 1..%u ranks, got '%s'", MUSER_TP_MAX, v);
        } else if (!strcmp(a, "--parallel")) {
            if (parse_count_list(v, "--parallel", "counts", MUSER_STEP_MAX_ROWS, o.par, &o.n_par))
                return CLI_EXIT_USAGE;
        }
    }
    if (gen_draft_wanted(&o.dr)) { /* speculation against plain decoding, through muser run's loop */
        if (!o.text) return cli_usage_error("bench", "speculation is measured after a prompt text: -p TEXT");
        if (gen_draft_check("bench", &o.dr, (muser_backend_kind)o.backend)) return CLI_EXIT_USAGE;
        return bench_spec(&o);
    }
    if (!o.model)
        o.model = cli_default_model();
    muser_model *m = NULL;
    muser_error err = {0};
    if (muser_model_load(&m, o.model, &err)) {
        fprintf(stderr, "muser bench: %s\n", err.msg);
        return 1;
    }
    const muser_hparams *hp = &m->hp;
    const bool cuda = o.backend == MUSER_BACKEND_CUDA;
    uint32_t longest = 0;
    for (uint32_t k = 0; k < o.n_prompts; k++)
        if (o.prompts[k] > longest) longest = o.prompts[k];
    const uint32_t prompt = cuda ? 0 : longest; /* the cuda lane skips the depths a prompt does not fit */
    for (uint32_t c = 0; c < o.n_ctx; c++)
        if (o.ctx[c] + prompt + o.gen > hp->n_ctx_train) {
            fprintf(stderr,
                    "muser bench: ctx %llu + prompt %u + gen %u exceeds the model's context %u\n",
                    (unsigned long long)o.ctx[c], prompt, o.gen, hp->n_ctx_train);
            muser_model_free(m);
            return 1;
        }
    if (o.tp) {
        const int rc = bench_tp(&o, m);
        muser_model_free(m);
        return rc;
    }
    if (o.n_ver) { /* verify passes: B = 1 first, so each block compares with it */
        printf("model   %s: %s, %u layers, E %u, F %u, V %u, %.1f MB of weights; backend %s\n", o.model,
               muser_arch_name(hp->arch), hp->n_layer, hp->n_embd, hp->n_ff, hp->n_vocab, m->weight_bytes / 1e6,
               muser_backend_name((muser_backend_kind)o.backend));
        int rc = 0;
        for (uint32_t c = 0; c < o.n_ctx && !rc; c++) rc = bench_verify(&o, m, o.ctx[c]);
        muser_model_free(m);
        return rc;
    }
    if (o.n_par) { /* the small-batch route: P = 1 first, so each count compares with it */
        printf("model   %s: %s, %u layers, E %u, F %u, V %u, %.1f MB of weights; backend %s\n", o.model,
               muser_arch_name(hp->arch), hp->n_layer, hp->n_embd, hp->n_ff, hp->n_vocab, m->weight_bytes / 1e6,
               muser_backend_name((muser_backend_kind)o.backend));
        double single = 0, packed = 0;
        int rc = bench_parallel(&o, m, 1, &single, &packed);
        if (!rc) rc = bench_parallel_engine(&o, m, 1, packed);
        for (uint32_t k = 0; k < o.n_par && !rc; k++)
            if (o.par[k] != 1) {
                rc = bench_parallel(&o, m, o.par[k], &single, &packed);
                if (!rc) rc = bench_parallel_engine(&o, m, o.par[k], packed);
            }
        muser_model_free(m);
        return rc;
    }
    if (cuda) {
        printf("model   %s: %s, %u layers, E %u, F %u, V %u, %.1f MB of weights\n", o.model,
               muser_arch_name(hp->arch), hp->n_layer, hp->n_embd, hp->n_ff, hp->n_vocab,
               m->weight_bytes / 1e6);
        const int rc = bench_cuda(&o, m);
        muser_model_free(m);
        return rc;
    }
    const uint32_t threads = bench_threads(&o);
    const char *bw_name;
    const double bw = measure_bandwidth(o.backend, threads, &bw_name);
    printf("model   %s: %s, %u layers, E %u, F %u, V %u, %.1f MB of weights\n", o.model,
           muser_arch_name(hp->arch), hp->n_layer, hp->n_embd, hp->n_ff, hp->n_vocab,
           m->weight_bytes / 1e6);
    cpu_kernels kn; /* the table the CPU engine picks (cpuid, MUSER_SIMD), for the report */
    cpu_kernels_init(&kn, false);
    printf("backend %s, %u threads, simd %s; bandwidth %.2f GB/s (%s, %u threads)\n",
           muser_backend_name((muser_backend_kind)o.backend), threads, kn.level,
           bw, bw_name, threads);
    int rc = 0;
    for (uint32_t c = 0; c < o.n_ctx && rc == 0; c++)
        for (uint32_t k = 0; k < o.n_prompts && rc == 0; k++) {
            bench_opts ok = o;
            ok.prompt = o.prompts[k];
            rc = bench_one(&ok, m, o.ctx[c], bw);
        }
    muser_model_free(m);
    return rc;
}
