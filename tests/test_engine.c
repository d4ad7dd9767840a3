/* test_engine.c — the engine (engine.h) on the CPU: its scheduling asserted on its own pass log,
 * its outputs against the session driven directly, cancellation, budgets, and 16 threads at
 * random (run under ASan in make test-asan and under TSan in make test-tsan).
 *
 *   1. outputs: 16 sequences (prompts of different lengths, teacher-forced decode steps) through
 *      the engine, alone and all at once from 16 threads, give the bytes of each one run on its own
 *      session (SHA-256 over every decode row's logits);
 *   2. decode outranks prefill: while a 4,096-token prompt prefills, its chunks run in parts of
 *      layers (each continuing its chunk's layers) and a decode step of another sequence runs
 *      after at most one part; with nothing decoding the chunks run whole; and two sequences
 *      decoding without pause starve neither the opening of a sequence nor its prompt (prefill
 *      passes and decode passes alternate);
 *      decoders that fell out of step (two groups, each arriving during the other's pass) meet in
 *      one pass again;
 *   3. the batch window: steps submitted together share a pass; a lone one runs within the window;
 *   4. cancellation mid-prefill and mid-decode returns MUSER_E_CANCELLED and frees the cache
 *      (the engine's open-sequence and reserved-KV counters return to zero);
 *   5. budgets: a sequence that does not fit the engine's KV budget is refused; a full context
 *      fails only its own step;
 *   6. 16 threads open, prefill, decode, cancel and close at random for a bounded time;
 *   7. a copy (muser_seq_copy_from): a sequence forked from a prefilled one decodes the bytes of the
 *      session driven directly, and so does the source after it, each on its own cache.
 * Where a GPU is present, 1 and 7 run again on CUDA (else a visible SKIP line). */
#include "check.h"
#include "gpu.h"
#include "engine.h"
#include "sampler.h"
#include "synth.h"
#include "util.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define N_SEQ 16
#define N_DEC 12

static muser_model *g_m;
static bool g_san;
static muser_backend_kind g_backend = MUSER_BACKEND_CPU; /* outputs() and copy() run on each */

static int32_t tok_of(uint32_t k, uint32_t i, uint32_t V) { return (int32_t)((k * 7919u + i * 104729u + 13u) % V); }
static uint32_t prompt_len(uint32_t k) { return 3 + 11 * k; } /* 3 .. 168: chunks of 64 end anywhere */

static muser_engine *engine_threads(const muser_model *m, uint32_t window_us, uint64_t n_ctx, uint64_t budget,
                                    uint32_t threads)
{
    muser_engine_opts o;
    memset(&o, 0, sizeof o);
    o.dev.backend = g_backend;
    o.dev.n_threads = threads;
    o.dev.n_ctx = n_ctx;
    o.batch_window_us = window_us;
    o.kv_budget_bytes = budget;
    muser_error err = {0};
    muser_engine *e = NULL;
    CHECK_OK(muser_engine_new(&e, m, &o, &err), &err);
    return e;
}

static muser_engine *engine_on(const muser_model *m, uint32_t window_us, uint64_t n_ctx, uint64_t budget)
{
    return engine_threads(m, window_us, n_ctx, budget, 2);
}

static muser_engine *engine_new(uint32_t window_us, uint64_t n_ctx, uint64_t budget)
{
    return engine_on(g_m, window_us, n_ctx, budget);
}

/* ---- 1. outputs equal the session driven directly ---- */
typedef struct seq_job {
    muser_engine *e;
    uint32_t k;
    float *logits; /* [N_DEC][V] */
    int rc;
    pthread_barrier_t *go;
} seq_job;

static void *seq_thread(void *arg)
{
    seq_job *j = arg;
    const uint32_t V = g_m->hp.n_vocab, P = prompt_len(j->k);
    int32_t *p = malloc(P * sizeof *p);
    for (uint32_t i = 0; i < P; i++) p[i] = tok_of(j->k, i, V);
    muser_error err = {0};
    muser_seq *q = NULL;
    j->rc = muser_engine_open(j->e, 0, &q, &err);
    if (j->go) pthread_barrier_wait(j->go);
    if (!j->rc) j->rc = muser_seq_prefill(q, p, P, NULL, &err);
    for (uint32_t i = 0; i < N_DEC && !j->rc; i++)
        j->rc = muser_seq_decode(q, tok_of(j->k, P + i, V), j->logits + (size_t)i * V, NULL, &err);
    if (j->rc) fprintf(stderr, "sequence %u: %s\n", j->k, err.msg);
    muser_engine_close(q);
    free(p);
    return NULL;
}

static void direct(uint32_t k, float *logits)
{
    const uint32_t V = g_m->hp.n_vocab, P = prompt_len(k);
    muser_session_opts o;
    memset(&o, 0, sizeof o);
    o.backend = g_backend;
    o.n_threads = 2;
    o.n_ctx = 256;
    muser_error err = {0};
    muser_session *s = NULL;
    CHECK_OK(muser_session_new(&s, g_m, &o, &err), &err);
    int32_t *p = malloc(P * sizeof *p);
    for (uint32_t i = 0; i < P; i++) p[i] = tok_of(k, i, V);
    CHECK_OK(muser_session_forward(s, p, P, NULL, false, &err), &err);
    for (uint32_t i = 0; i < N_DEC; i++) {
        const int32_t t = tok_of(k, P + i, V);
        CHECK_OK(muser_session_forward(s, &t, 1, logits + (size_t)i * V, false, &err), &err);
    }
    free(p);
    muser_session_free(s);
}

static void outputs(void)
{
    const uint32_t V = g_m->hp.n_vocab;
    const size_t row = (size_t)N_DEC * V;
    float *ref = malloc(N_SEQ * row * sizeof(float)), *alone = malloc(N_SEQ * row * sizeof(float)),
          *together = malloc(N_SEQ * row * sizeof(float));
    for (uint32_t k = 0; k < N_SEQ; k++) direct(k, ref + k * row);
    muser_engine *e = engine_new(250, 256, 0);
    if (!e) return;
    /* alone: one sequence at a time */
    for (uint32_t k = 0; k < N_SEQ; k++) {
        seq_job j = {.e = e, .k = k, .logits = alone + k * row};
        seq_thread(&j);
        CHECK(j.rc == 0);
    }
    /* together: 16 threads, released at once */
    pthread_t th[N_SEQ];
    seq_job jobs[N_SEQ];
    pthread_barrier_t go;
    pthread_barrier_init(&go, NULL, N_SEQ);
    for (uint32_t k = 0; k < N_SEQ; k++) {
        jobs[k] = (seq_job){.e = e, .k = k, .logits = together + k * row, .go = &go};
        pthread_create(&th[k], NULL, seq_thread, &jobs[k]);
    }
    for (uint32_t k = 0; k < N_SEQ; k++) {
        pthread_join(th[k], NULL);
        CHECK(jobs[k].rc == 0);
    }
    pthread_barrier_destroy(&go);
    int same_alone = 0, same_together = 0;
    for (uint32_t k = 0; k < N_SEQ; k++) {
        char a[65], b[65], c[65];
        muser_sha256_hex(ref + k * row, row * sizeof(float), a);
        muser_sha256_hex(alone + k * row, row * sizeof(float), b);
        muser_sha256_hex(together + k * row, row * sizeof(float), c);
        same_alone += !strcmp(a, b);
        same_together += !strcmp(a, c);
    }
    muser_pass_rec rec[MUSER_ENGINE_LOG];
    const uint32_t np = muser_engine_passes(e, rec, MUSER_ENGINE_LOG);
    uint32_t most = 0, shared = 0;
    for (uint32_t i = 0; i < np; i++) {
        if (rec[i].kind == MUSER_PASS_DECODE && rec[i].rows > most) most = rec[i].rows;
        if (rec[i].kind == MUSER_PASS_PREFILL && rec[i].seqs > shared) shared = rec[i].seqs;
    }
    printf("outputs: %d/%d sequences alone and %d/%d beside 15 others equal the direct session's bytes; "
           "widest decode pass %u rows, widest prefill chunk %u prompts\n", same_alone, N_SEQ, same_together, N_SEQ,
           most, shared);
    CHECK(same_alone == N_SEQ);
    CHECK(same_together == N_SEQ);
    /* (how often they shared a pass depends on timing; window() asserts the sharing) */
    muser_engine_stats st;
    muser_engine_stats_get(e, &st);
    CHECK(st.open_seqs == 0 && st.kv_reserved_bytes == 0);
    muser_engine_free(e);
    free(ref);
    free(alone);
    free(together);
}

/* ---- 2. decode outranks prefill ---- */
typedef struct prefill_job {
    muser_seq *q;
    const int32_t *tok;
    uint32_t n;
    int rc;
} prefill_job;

static void *prefill_thread(void *arg)
{
    prefill_job *j = arg;
    muser_error err = {0};
    j->rc = muser_seq_prefill(j->q, j->tok, j->n, NULL, &err);
    return NULL;
}

static uint32_t prefill_passes_of(muser_engine *e, uint64_t id, muser_pass_rec *rec, uint32_t *np)
{
    *np = muser_engine_passes(e, rec, MUSER_ENGINE_LOG);
    uint32_t c = 0;
    for (uint32_t i = 0; i < *np; i++) c += rec[i].kind == MUSER_PASS_PREFILL && rec[i].first_seq == id;
    return c;
}

static void outranks(void)
{
    const uint32_t V = g_m->hp.n_vocab, N = g_san ? 1024 : 4096;
    muser_engine *e = engine_new(250, N + 64, 0);
    if (!e) return;
    muser_error err = {0};
    muser_seq *a = NULL, *b = NULL;
    CHECK_OK(muser_engine_open(e, 0, &a, &err), &err);
    CHECK_OK(muser_engine_open(e, 0, &b, &err), &err);
    int32_t *tok = malloc(N * sizeof *tok);
    for (uint32_t i = 0; i < N; i++) tok[i] = tok_of(3, i, V);
    CHECK_OK(muser_seq_prefill(a, tok, 5, NULL, &err), &err); /* a decodes from here on */
    CHECK_OK(muser_seq_decode(a, 7, NULL, NULL, &err), &err);
    prefill_job pj = {.q = b, .tok = tok, .n = N};
    pthread_t th;
    pthread_create(&th, NULL, prefill_thread, &pj);
    muser_pass_rec *rec = malloc(MUSER_ENGINE_LOG * sizeof *rec);
    uint32_t np = 0;
    while (prefill_passes_of(e, muser_seq_id(b), rec, &np) < 3) usleep(100); /* b is prefilling */
    const double t_submit = muser_now_s();
    CHECK_OK(muser_seq_decode(a, 8, NULL, NULL, &err), &err);
    pthread_join(th, NULL);
    CHECK(pj.rc == 0);
    np = muser_engine_passes(e, rec, MUSER_ENGINE_LOG);
    const uint32_t L = g_m->hp.n_layer;
    uint32_t before = 0, chunks = 0, parts = 0, broken = 0, next = 0, rows = 0;
    bool found = false;
    for (uint32_t i = 0; i < np; i++) {
        if (rec[i].kind == MUSER_PASS_PREFILL && rec[i].first_seq == muser_seq_id(b)) {
            parts++;
            broken += rec[i].layer0 != next || rec[i].layer1 <= rec[i].layer0 || rec[i].layer1 > L;
            next = rec[i].layer1 == L ? 0 : rec[i].layer1;
            if (rec[i].layer1 == L) chunks++, rows += rec[i].rows;
            if (!found && rec[i].t_end > t_submit) before++; /* prefill passes that ended after the submit */
        }
        if (rec[i].kind == MUSER_PASS_DECODE && rec[i].first_seq == muser_seq_id(a) && rec[i].t_start >= t_submit)
            found = true;
    }
    printf("outranks: %u-token prompt in %u chunks of %u passes (parts of layers) while another sequence decoded; the "
           "decode step submitted during it ran after %u of them\n", N, chunks, parts, before);
    CHECK(found);
    CHECKF(before <= 1, "the decode step waited for %u prefill passes", before);
    CHECKF(broken == 0, "%u prefill passes did not continue their chunk's layers", broken);
    CHECKF(rows == N, "the chunks held %u rows of %u", rows, N);
    CHECKF(parts > chunks, "no chunk ran in parts while a sequence decoded (%u passes, %u chunks)", parts, chunks);
    /* with nothing decoding (b's prompt done makes b a decoder too) a prompt's chunks run whole */
    muser_engine_close(a);
    muser_engine_close(b);
    muser_seq *c = NULL;
    CHECK_OK(muser_engine_open(e, 0, &c, &err), &err);
    const uint32_t P = N > 1100 ? 1100 : N;
    CHECK_OK(muser_seq_prefill(c, tok, P, NULL, &err), &err);
    np = muser_engine_passes(e, rec, MUSER_ENGINE_LOG);
    uint32_t whole = 0, other = 0, wrows = 0;
    for (uint32_t i = 0; i < np; i++)
        if (rec[i].kind == MUSER_PASS_PREFILL && rec[i].first_seq == muser_seq_id(c)) {
            const bool w = rec[i].layer0 == 0 && rec[i].layer1 == L;
            whole += w;
            other += !w;
            wrows += w ? rec[i].rows : 0;
        }
    CHECKF(other == 0 && wrows == P, "an uncontended %u-token prompt ran %u whole chunks (%u rows) and %u parts", P,
           whole, wrows, other);
    muser_engine_close(c);
    free(rec);
    free(tok);
    muser_engine_free(e);
}

/* ---- 2b. a stream of decode steps does not starve a prompt ---- */
typedef struct spin_job {
    muser_seq *q;
    atomic_int *stop;
    atomic_uint steps; /* read by the main thread while the spinner runs */
    uint32_t cap, delay_us;
    uint32_t turn_us;  /* the caller's time between steps (0: 300 µs) */
    int rc;
} spin_job;

static void *spin_thread(void *arg)
{
    spin_job *j = arg;
    muser_error err = {0};
    usleep(j->delay_us); /* the second starts while the first one's pass runs: out of step */
    for (uint32_t n = 0; !atomic_load(j->stop) && n < j->cap && !j->rc; n++) {
        j->rc = muser_seq_decode(j->q, (int32_t)(n % 7), NULL, NULL, &err);
        atomic_store(&j->steps, n + 1);
        usleep(j->turn_us ? j->turn_us : 300); /* a caller's sampling: shorter than a pass, so they fall out of step */
    }
    return NULL;
}

/* The trained default model (models/default.gguf): its passes are long beside a caller's time
 * between steps. */
static muser_model *trained_model(void)
{
    const char *src = getenv("MUSER_SOURCE_DIR");
    char path[1024];
    snprintf(path, sizeof path, "%s/models/default.gguf", src ? src : ".");
    muser_error err = {0};
    muser_model *m = NULL;
    CHECK_OK(muser_model_load(&m, path, &err), &err);
    return m;
}

static void no_starving(void)
{
    muser_error err = {0};
    muser_model *m = trained_model();
    if (!m) return;
    const uint32_t V = m->hp.n_vocab, P = 300;
    muser_engine *e = engine_on(m, 1, 1024, 0); /* a 1 µs window: the decoders fall out of step */
    if (!e) return;
    atomic_int stop = 0;
    spin_job sj[2];
    pthread_t th[2];
    for (int i = 0; i < 2; i++) {
        memset(&sj[i], 0, sizeof sj[i]);
        sj[i].stop = &stop;
        sj[i].cap = 600;
        sj[i].delay_us = i ? 1500u : 0u;
        atomic_init(&sj[i].steps, 0);
        CHECK_OK(muser_engine_open(e, 0, &sj[i].q, &err), &err);
        pthread_create(&th[i], NULL, spin_thread, &sj[i]);
    }
    while (atomic_load(&sj[0].steps) < 3 || atomic_load(&sj[1].steps) < 3) usleep(100);
    muser_seq *c = NULL;
    CHECK_OK(muser_engine_open(e, 0, &c, &err), &err);
    const uint32_t opening = c ? muser_seq_open_waited(c) : 0; /* the engine's own count, not a clock */
    int32_t *tok = malloc(P * sizeof *tok);
    for (uint32_t i = 0; i < P; i++) tok[i] = tok_of(9, i, V);
    const double t_submit = muser_now_s();
    CHECK_OK(muser_seq_prefill(c, tok, P, NULL, &err), &err);
    const uint32_t s0 = atomic_load(&sj[0].steps), s1 = atomic_load(&sj[1].steps);
    const bool spinning = s0 < sj[0].cap && s1 < sj[1].cap;
    atomic_store(&stop, 1);
    for (int i = 0; i < 2; i++) pthread_join(th[i], NULL);
    muser_pass_rec *rec = malloc(MUSER_ENGINE_LOG * sizeof *rec);
    const uint32_t np = muser_engine_passes(e, rec, MUSER_ENGINE_LOG);
    uint32_t chunks = 0, passes = 0, between = 0, worst = 0, before = 0;
    for (uint32_t i = 0; i < np; i++) {
        before += !passes && rec[i].kind == MUSER_PASS_DECODE && rec[i].t_start >= t_submit;
        if (rec[i].kind == MUSER_PASS_PREFILL && rec[i].first_seq == muser_seq_id(c)) {
            if (passes++ && between > worst) worst = between;
            chunks += rec[i].layer1 == m->hp.n_layer;
            between = 0;
        } else if (passes && rec[i].kind == MUSER_PASS_DECODE) {
            between++;
        }
    }
    printf("no starving: a %u-token prompt beside two sequences decoding without pause opened after %u decode "
           "pass%s, started after %u and ran in %u chunks of %u passes, at most %u decode pass%s between two\n", P,
           opening, opening == 1 ? "" : "es", before, chunks, passes, worst, worst == 1 ? "" : "es");
    CHECKF(before <= 1, "the prompt waited for %u decode passes before its first chunk", before);
    CHECKF(opening <= 1, "opening the prompt's sequence waited for %u decode passes", opening);
    CHECKF(spinning, "the prompt finished only after the decoders stopped (%u, %u steps)", s0, s1);
    CHECK(sj[0].rc == 0 && sj[1].rc == 0);
    CHECKF(passes > chunks, "%u prefill passes for %u chunks: none in parts beside the decoders", passes, chunks);
    CHECKF(worst <= 1, "%u decode passes between two prefill passes of a waiting prompt", worst);
    for (int i = 0; i < 2; i++) muser_engine_close(sj[i].q);
    muser_engine_close(c);
    free(rec);
    free(tok);
    muser_engine_free(e);
    muser_model_free(m);
}

/* ---- 2c. decoders that fell out of step meet in one pass again ---- */
/* One run of regroup's scenario on a fresh engine (one thread: long passes beside usleep's
 * granularity): *pass the fastest one-row pass, *turn_us the callers' time; returns the rows a pass
 * in the second half of the decode passes. */
static double regroup_once(muser_model *m, double *pass, uint32_t *turn_us)
{
    muser_error err = {0};
    muser_engine *e = engine_threads(m, 1, 1024, 0, 1);
    if (!e) return 0.0;
    enum { N = 4, STEPS = 40, WARM = 6 };
    *pass = 1e9;
    {
        muser_seq *q = NULL;
        CHECK_OK(muser_engine_open(e, 0, &q, &err), &err);
        for (int i = 0; q && i < WARM; i++) {
            const double t0 = muser_now_s();
            CHECK_OK(muser_seq_decode(q, i, NULL, NULL, &err), &err);
            const double t = muser_now_s() - t0;
            *pass = t < *pass ? t : *pass;
        }
        muser_engine_close(q);
    }
    *turn_us = (uint32_t)(*pass * 1e6 / 10);
    atomic_int stop = 0;
    spin_job sj[N];
    pthread_t th[N];
    for (int i = 0; i < N; i++) {
        memset(&sj[i], 0, sizeof sj[i]);
        sj[i].stop = &stop;
        sj[i].cap = STEPS;
        sj[i].delay_us = i < 2 ? 0u : (uint32_t)(*pass * 1e6 / 2);
        sj[i].turn_us = *turn_us;
        atomic_init(&sj[i].steps, 0);
        CHECK_OK(muser_engine_open(e, 0, &sj[i].q, &err), &err);
    }
    for (int i = 0; i < N; i++) pthread_create(&th[i], NULL, spin_thread, &sj[i]);
    for (int i = 0; i < N; i++) pthread_join(th[i], NULL);
    muser_pass_rec *rec = malloc(MUSER_ENGINE_LOG * sizeof *rec);
    const uint32_t np = muser_engine_passes(e, rec, MUSER_ENGINE_LOG);
    uint32_t n_dec = 0, rows = 0, late = 0, late_rows = 0;
    for (uint32_t i = 0; i < np; i++) n_dec += rec[i].kind == MUSER_PASS_DECODE;
    for (uint32_t i = 0, k = 0; i < np; i++) /* the second half of the decode passes */
        if (rec[i].kind == MUSER_PASS_DECODE) {
            rows += rec[i].rows;
            if (k++ >= n_dec / 2) late++, late_rows += rec[i].rows;
        }
    CHECK(rows == N * STEPS + WARM);
    for (int i = 0; i < N; i++) CHECK(sj[i].rc == 0);
    for (int i = 0; i < N; i++) muser_engine_close(sj[i].q);
    free(rec);
    muser_engine_free(e);
    return late ? (double)late_rows / late : 0;
}

static void regroup(void)
{
    /* four decoders on the trained model in two groups out of step (the second pair starts while
     * the first pair's pass runs), each caller a tenth of a pass between steps, a 1 µs window: the
     * window alone never joins the groups, since each group's steps arrive during the other's
     * pass. The engine waits for decoders whose callers are due back within a quarter of a pass,
     * so the groups merge. The callers' time is measured against a pass of this machine; on a
     * machine shared with other work (ctest -j) a caller's time varies, and the engine does not
     * wait for an unsteady one, so the scenario runs up to three times and a run must beat 2.5 rows
     * a pass (seen: 2.74–3.96; without the wait every run stays apart at 1.97–2.00). */
    muser_model *m = trained_model();
    if (!m) return;
    double pass = 0, best = 0;
    uint32_t turn_us = 0;
    char runs[128] = "";
    for (int a = 0; a < 3 && best < 3.5; a++) {
        const double mean = regroup_once(m, &pass, &turn_us);
        best = mean > best ? mean : best;
        snprintf(runs + strlen(runs), sizeof runs - strlen(runs), "%s%.2f", a ? ", " : "", mean);
    }
    printf("regroup: 4 decoders started out of step (a pass %.2f ms, callers %u µs); rows a pass in the second "
           "half: %s\n", pass * 1e3, turn_us, runs);
    if (turn_us >= 150) /* (the callers' time must be well above usleep's granularity and the wait's 0.1 ms) */
        CHECKF(best >= 2.5, "the decoders stayed apart: %s rows a pass (4 decoding)", runs);
    else
        printf("SKIP: regroup's check: a pass of %.2f ms is too short on this machine for callers of a tenth of it\n",
               pass * 1e3);
    muser_model_free(m);
}

/* ---- 3. the batch window ---- */
typedef struct dec_job {
    muser_seq *q;
    pthread_barrier_t *go;
    int32_t token;
    double t_submit;
    int rc;
} dec_job;

static void *dec_thread(void *arg)
{
    dec_job *j = arg;
    muser_error err = {0};
    pthread_barrier_wait(j->go);
    j->t_submit = muser_now_s();
    j->rc = muser_seq_decode(j->q, j->token, NULL, NULL, &err);
    return NULL;
}

static void window(void)
{
    const uint32_t W = 50000; /* 50 ms: four threads released together arrive well inside it */
    muser_engine *e = engine_new(W, 64, 0);
    if (!e) return;
    muser_error err = {0};
    muser_seq *q[4];
    for (int k = 0; k < 4; k++) {
        CHECK_OK(muser_engine_open(e, 0, &q[k], &err), &err);
        const int32_t t = 3 + k;
        CHECK_OK(muser_seq_prefill(q[k], &t, 1, NULL, &err), &err);
    }
    pthread_barrier_t go;
    pthread_barrier_init(&go, NULL, 4);
    pthread_t th[4];
    dec_job j[4];
    for (int k = 0; k < 4; k++) {
        j[k] = (dec_job){.q = q[k], .go = &go, .token = 9};
        pthread_create(&th[k], NULL, dec_thread, &j[k]);
    }
    for (int k = 0; k < 4; k++) {
        pthread_join(th[k], NULL);
        CHECK(j[k].rc == 0);
    }
    pthread_barrier_destroy(&go);
    muser_pass_rec rec[64];
    uint32_t np = muser_engine_passes(e, rec, 64);
    CHECKF(np > 0 && rec[np - 1].kind == MUSER_PASS_DECODE && rec[np - 1].rows == 4,
           "four steps submitted together took %u rows in the last pass", np ? rec[np - 1].rows : 0);
    /* alone (three others decoding, idle): held at most the window */
    const double t0 = muser_now_s();
    CHECK_OK(muser_seq_decode(q[0], 5, NULL, NULL, &err), &err);
    const double waited = muser_now_s() - t0;
    np = muser_engine_passes(e, rec, 64);
    CHECK(rec[np - 1].rows == 1);
    printf("window: 4 steps submitted together shared one pass; a lone step waited %.1f ms (window %.0f ms)\n",
           waited * 1e3, W / 1e3);
    CHECKF(waited < 4 * W * 1e-6, "a lone step waited %.1f ms, the window is %.0f ms", waited * 1e3, W / 1e3);
    for (int k = 0; k < 4; k++) muser_engine_close(q[k]);
    muser_engine_free(e);
    /* with no other decoder the step does not wait for the window at all: a window of 2 s, far
     * above a step's time even under a sanitizer on a loaded machine, so holding it would show */
    const uint32_t W2 = 2000000;
    e = engine_new(W2, 64, 0);
    if (!e) return;
    muser_seq *lone = NULL;
    CHECK_OK(muser_engine_open(e, 0, &lone, &err), &err);
    const int32_t t = 3;
    CHECK_OK(muser_seq_prefill(lone, &t, 1, NULL, &err), &err);
    const double t1 = muser_now_s();
    CHECK_OK(muser_seq_decode(lone, 6, NULL, NULL, &err), &err);
    const double alone = muser_now_s() - t1;
    CHECKF(alone < 0.5 * W2 * 1e-6, "the only decoder was held for the window (%.0f ms of a %.0f ms window)",
           alone * 1e3, W2 / 1e3);
    muser_engine_close(lone);
    muser_engine_free(e);
}

/* ---- 4. cancellation, 5. budgets ---- */
static void cancel_and_budget(void)
{
    const uint32_t V = g_m->hp.n_vocab, N = g_san ? 1024 : 4096;
    muser_engine *e = engine_new(20000, N + 8, 0);
    if (!e) return;
    muser_error err = {0};
    muser_seq *b = NULL, *dec = NULL;
    CHECK_OK(muser_engine_open(e, 0, &b, &err), &err);
    CHECK_OK(muser_engine_open(e, 0, &dec, &err), &err);
    int32_t *tok = malloc(N * sizeof *tok);
    for (uint32_t i = 0; i < N; i++) tok[i] = tok_of(5, i, V);
    CHECK_OK(muser_seq_prefill(dec, tok, 1, NULL, &err), &err); /* a decoder: b's prompt runs in 64-row chunks */
    prefill_job pj = {.q = b, .tok = tok, .n = N};
    pthread_t th;
    pthread_create(&th, NULL, prefill_thread, &pj);
    muser_pass_rec *rec = malloc(MUSER_ENGINE_LOG * sizeof *rec);
    uint32_t np;
    while (prefill_passes_of(e, muser_seq_id(b), rec, &np) < 1) usleep(100);
    muser_seq_cancel(b);
    pthread_join(th, NULL);
    CHECKF(pj.rc == MUSER_E_CANCELLED, "a prefill cancelled midway returned %d", pj.rc);
    CHECK(muser_seq_decode(b, 1, NULL, NULL, &err) == MUSER_E_CANCELLED);
    muser_engine_close(b);
    muser_engine_close(dec);
    muser_engine_stats st;
    muser_engine_stats_get(e, &st);
    CHECKF(st.open_seqs == 0 && st.kv_reserved_bytes == 0, "after a cancelled prefill: %u open, %llu bytes reserved",
           st.open_seqs, (unsigned long long)st.kv_reserved_bytes);
    /* mid-decode: a step waiting out the window (another decoder idle) */
    muser_seq *x = NULL, *y = NULL;
    CHECK_OK(muser_engine_open(e, 0, &x, &err), &err);
    CHECK_OK(muser_engine_open(e, 0, &y, &err), &err);
    CHECK_OK(muser_seq_prefill(x, tok, 3, NULL, &err), &err);
    CHECK_OK(muser_seq_prefill(y, tok, 3, NULL, &err), &err);
    pthread_barrier_t go;
    pthread_barrier_init(&go, NULL, 2);
    dec_job dj = {.q = x, .go = &go, .token = 4};
    pthread_create(&th, NULL, dec_thread, &dj);
    pthread_barrier_wait(&go);
    muser_seq_cancel(x);
    pthread_join(th, NULL);
    pthread_barrier_destroy(&go);
    CHECKF(dj.rc == MUSER_E_CANCELLED || dj.rc == 0, "a cancelled step returned %d", dj.rc);
    muser_engine_close(x);
    CHECK_OK(muser_seq_decode(y, 4, NULL, NULL, &err), &err); /* the other goes on */
    muser_engine_close(y);
    muser_engine_stats_get(e, &st);
    CHECK(st.open_seqs == 0 && st.kv_reserved_bytes == 0);
    muser_engine_free(e);
    /* budgets: room for two sequences of 64 */
    const muser_hparams *hp = &g_m->hp;
    uint64_t rows = 0;
    for (uint32_t l = 0; l < hp->n_layer; l++) rows += muser_layer_is_swa(hp, l) ? hp->swa_window : 64;
    const uint64_t one = rows * hp->n_head_kv * hp->head_dim * 2 * 2;
    e = engine_new(250, 64, 2 * one + one / 2);
    if (!e) return;
    muser_seq *s1 = NULL, *s2 = NULL, *s3 = NULL, *small = NULL;
    CHECK_OK(muser_engine_open(e, 64, &s1, &err), &err);
    CHECK_OK(muser_engine_open(e, 64, &s2, &err), &err);
    CHECK(muser_engine_open(e, 64, &s3, &err) == MUSER_E_NO_ROOM);
    printf("budget: %s\n", err.msg);
    muser_engine_close(s2);
    CHECK_OK(muser_engine_open(e, 4, &small, &err), &err); /* a context of 4: its step past it fails alone */
    CHECK_OK(muser_seq_prefill(small, tok, 4, NULL, &err), &err);
    CHECK_OK(muser_seq_prefill(s1, tok, 4, NULL, &err), &err);
    CHECK(muser_seq_decode(small, 1, NULL, NULL, &err) == MUSER_E_CONTEXT_FULL);
    CHECK(muser_seq_prefill(small, tok, 1, NULL, &err) == MUSER_E_CONTEXT_FULL);
    CHECK_OK(muser_seq_decode(s1, 1, NULL, NULL, &err), &err);
    CHECK(muser_seq_pos(s1) == 5 && muser_seq_pos(small) == 4);
    muser_engine_close(small);
    muser_engine_close(s1);
    muser_engine_free(e);
    free(rec);
    free(tok);
}

/* ---- 6. 16 threads at random ---- */
typedef struct chaos {
    muser_engine *e;
    uint64_t seed;
    double until;
    muser_seq *volatile victim; /* published for another thread to cancel */
    pthread_mutex_t *vmu;
    int bad;
    uint64_t steps;
} chaos;

static void *chaos_thread(void *arg)
{
    chaos *c = arg;
    const uint32_t V = g_m->hp.n_vocab;
    uint64_t x = c->seed;
    int32_t tok[96];
    while (muser_now_s() < c->until) {
        x = x * 6364136223846793005ull + 1442695040888963407ull;
        muser_error err = {0};
        muser_seq *q = NULL;
        int rc = muser_engine_open(c->e, 0, &q, &err);
        if (rc) {
            c->bad += rc != MUSER_E_NO_ROOM;
            continue;
        }
        const uint32_t P = 1 + (uint32_t)((x >> 33) % 90);
        for (uint32_t i = 0; i < P; i++) tok[i] = (int32_t)(((x >> 7) + i) % V);
        const bool publish = (x >> 20) % 3 == 0;
        if (publish) {
            pthread_mutex_lock(c->vmu);
            c->victim = q;
            pthread_mutex_unlock(c->vmu);
        }
        rc = muser_seq_prefill(q, tok, P, NULL, &err);
        for (uint32_t g = 0; !rc && g < (uint32_t)((x >> 40) % 8); g++) {
            rc = muser_seq_decode(q, (int32_t)(g % V), NULL, NULL, &err);
            c->steps++;
            if ((x >> (g + 3)) % 11 == 0) muser_seq_cancel(q); /* cancel itself midway */
        }
        c->bad += rc && rc != MUSER_E_CANCELLED && rc != MUSER_E_CONTEXT_FULL;
        if (rc && rc != MUSER_E_CANCELLED && rc != MUSER_E_CONTEXT_FULL) fprintf(stderr, "chaos: %s\n", err.msg);
        if (publish) {
            pthread_mutex_lock(c->vmu);
            if (c->victim == q) c->victim = NULL;
            pthread_mutex_unlock(c->vmu);
        }
        muser_engine_close(q);
    }
    return NULL;
}

static void *canceller(void *arg)
{
    chaos *c = arg; /* the array of 16 */
    uint64_t x = 99;
    while (muser_now_s() < c[0].until) {
        x = x * 6364136223846793005ull + 1442695040888963407ull;
        chaos *t = &c[(x >> 33) % N_SEQ];
        pthread_mutex_lock(t->vmu);
        if (t->victim) muser_seq_cancel(t->victim);
        pthread_mutex_unlock(t->vmu);
        usleep(500 + (useconds_t)((x >> 40) % 2000));
    }
    return NULL;
}

static void threads(void)
{
    muser_engine *e = engine_new(250, 128, 0);
    if (!e) return;
    chaos c[N_SEQ];
    pthread_mutex_t vmu[N_SEQ];
    pthread_t th[N_SEQ + 1];
    const double until = muser_now_s() + (g_san ? 6.0 : 3.0);
    for (int k = 0; k < N_SEQ; k++) {
        pthread_mutex_init(&vmu[k], NULL);
        c[k] = (chaos){.e = e, .seed = 1000 + (uint64_t)k, .until = until, .vmu = &vmu[k]};
        pthread_create(&th[k], NULL, chaos_thread, &c[k]);
    }
    pthread_create(&th[N_SEQ], NULL, canceller, c);
    int bad = 0;
    uint64_t steps = 0;
    for (int k = 0; k <= N_SEQ; k++) pthread_join(th[k], NULL);
    for (int k = 0; k < N_SEQ; k++) {
        bad += c[k].bad;
        steps += c[k].steps;
        pthread_mutex_destroy(&vmu[k]);
    }
    muser_engine_stats st;
    muser_engine_stats_get(e, &st);
    printf("threads: 16 threads + a canceller for %.0f s: %llu decode steps, %llu passes, %d unexpected errors; "
           "%u open, %llu KV bytes reserved at the end\n", g_san ? 6.0 : 3.0, (unsigned long long)steps,
           (unsigned long long)st.passes, bad, st.open_seqs, (unsigned long long)st.kv_reserved_bytes);
    CHECK(bad == 0);
    CHECK(steps > 0);
    CHECK(st.open_seqs == 0 && st.kv_reserved_bytes == 0);
    muser_engine_free(e);
}

/* ---- 7. a forked sequence is the source's prompt, on a cache of its own ---- */
static void copy(void)
{
    const uint32_t V = g_m->hp.n_vocab;
    muser_engine *e = engine_new(0, 256, 0);
    if (!e) return;
    float *want = malloc((size_t)N_DEC * V * sizeof *want), *got = malloc((size_t)V * sizeof *got);
    uint32_t same = 0, total = 0;
    const uint32_t ks[] = {0, 6, 15};
    for (uint32_t n = 0; n < sizeof ks / sizeof *ks; n++) {
        const uint32_t k = ks[n], P = prompt_len(k);
        direct(k, want);
        muser_error err = {0};
        muser_seq *src = NULL, *dst = NULL;
        CHECK_OK(muser_engine_open(e, 0, &src, &err), &err);
        CHECK_OK(muser_engine_open(e, 0, &dst, &err), &err);
        int32_t *p = malloc(P * sizeof *p);
        for (uint32_t i = 0; i < P; i++) p[i] = tok_of(k, i, V);
        CHECK_OK(muser_seq_prefill(src, p, P, NULL, &err), &err);
        CHECK_OK(muser_seq_decode(dst, tok_of(k, 0, V), NULL, NULL, &err), &err); /* dst's own rows go */
        CHECK_OK(muser_seq_copy_from(dst, src, &err), &err);
        CHECK(muser_seq_pos(dst) == P);
        for (uint32_t r = 0; r < 2; r++) { /* the copy first, then the source: neither sees the other */
            muser_seq *q = r ? src : dst;
            for (uint32_t i = 0; i < N_DEC; i++) {
                CHECK_OK(muser_seq_decode(q, tok_of(k, P + i, V), got, NULL, &err), &err);
                same += !memcmp(got, want + (size_t)i * V, (size_t)V * sizeof *got);
                total++;
            }
        }
        free(p);
        muser_engine_close(src);
        muser_engine_close(dst);
    }
    CHECKF(same == total, "%u of %u decode rows after a copy equal the direct session's bytes", same, total);
    printf("copy: %u of %u decode rows of forked sequences and their sources equal the direct session's bytes\n", same, total);
    free(want);
    free(got);
    muser_engine_free(e);
}

/* ---- draws where the logits are (muser_seq_decode_draw) ---- */
typedef struct draw_job {
    muser_engine *e;
    uint32_t k;
    bool by_draw;
    int32_t toks[N_DEC];
    uint32_t on_device; /* steps whose token the backend drew */
    int rc;
    pthread_barrier_t *go;
} draw_job;

/* Sequence k's prompt, then N_DEC tokens of a plain temperature sampler (seed k), each fed back:
 * through the row (muser_seq_decode, muser_sampler_sample) or drawn (muser_seq_decode_draw, the
 * row's draw on the host with the same uniform where the backend returned none). */
static void *draw_thread(void *arg)
{
    draw_job *j = arg;
    const uint32_t V = g_m->hp.n_vocab, P = prompt_len(j->k);
    int32_t *p = malloc(P * sizeof *p);
    float *lg = malloc(V * sizeof *lg);
    for (uint32_t i = 0; i < P; i++) p[i] = tok_of(j->k, i, V);
    muser_sampler_params sp;
    muser_sampler_params_default(&sp);
    sp.temperature = 0.7f + 0.05f * (float)j->k;
    sp.top_k = 0;
    sp.top_p = j->k % 4 == 1 || j->k % 4 == 3 ? 0.9f : 1.0f; /* top-p, min-p, both, or neither */
    sp.min_p = j->k % 4 >= 2 ? 0.05f : 0.0f;
    sp.seed = 100 + j->k;
    muser_error err = {0};
    muser_sampler *smp = NULL;
    muser_seq *q = NULL;
    j->rc = muser_sampler_new(&smp, V, &sp, &err);
    if (!j->rc) j->rc = muser_engine_open(j->e, 0, &q, &err);
    if (j->go) pthread_barrier_wait(j->go);
    if (!j->rc) j->rc = muser_seq_prefill(q, p, P, lg, &err);
    int32_t t = j->rc ? 0 : muser_sampler_sample(smp, lg, NULL, NULL);
    for (uint32_t i = 0; i < N_DEC && !j->rc; i++) {
        j->toks[i] = t;
        if (!j->by_draw) {
            j->rc = muser_seq_decode(q, t, lg, NULL, &err);
            if (!j->rc) t = muser_sampler_sample(smp, lg, NULL, NULL);
            continue;
        }
        muser_draw d = {.u = 0.0};
        if (!muser_sampler_draw_params(smp, &d.temperature, &d.top_p, &d.min_p)) j->rc = MUSER_E_ARG;
        d.u = muser_sampler_uniform(smp);
        if (!j->rc) j->rc = muser_seq_decode_draw(q, t, lg, &d, &err);
        if (j->rc) break;
        j->on_device += d.id >= 0;
        t = d.id >= 0 ? d.id : muser_sampler_sample_u(smp, lg, d.u);
    }
    if (j->rc) fprintf(stderr, "sequence %u: %s\n", j->k, err.msg);
    muser_engine_close(q);
    muser_sampler_free(smp);
    free(p);
    free(lg);
    return NULL;
}

/* The same tokens through the row and drawn where the logits are (temperature alone, with top-p,
 * min-p or both), alone and beside 15 others: on the CPU every draw comes back as a row (the host
 * draws), on the GPU every one on the device. A draw without a row buffer, or with a temperature,
 * top-p, min-p or uniform out of range, is refused. */
static void draws(void)
{
    muser_engine *e = engine_new(250, 256, 0);
    if (!e) return;
    draw_job rowj[N_SEQ], alone[N_SEQ], together[N_SEQ];
    for (uint32_t k = 0; k < N_SEQ; k++) {
        rowj[k] = (draw_job){.e = e, .k = k};
        draw_thread(&rowj[k]);
        alone[k] = (draw_job){.e = e, .k = k, .by_draw = true};
        draw_thread(&alone[k]);
    }
    pthread_t th[N_SEQ];
    pthread_barrier_t go;
    pthread_barrier_init(&go, NULL, N_SEQ);
    for (uint32_t k = 0; k < N_SEQ; k++) {
        together[k] = (draw_job){.e = e, .k = k, .by_draw = true, .go = &go};
        pthread_create(&th[k], NULL, draw_thread, &together[k]);
    }
    for (uint32_t k = 0; k < N_SEQ; k++) pthread_join(th[k], NULL);
    pthread_barrier_destroy(&go);
    uint32_t same = 0, dev = 0;
    for (uint32_t k = 0; k < N_SEQ; k++) {
        CHECK(rowj[k].rc == 0 && alone[k].rc == 0 && together[k].rc == 0);
        same += !memcmp(rowj[k].toks, alone[k].toks, sizeof rowj[k].toks) &&
                !memcmp(rowj[k].toks, together[k].toks, sizeof rowj[k].toks);
        dev += alone[k].on_device + together[k].on_device;
    }
    const bool gpu = g_backend == MUSER_BACKEND_CUDA;
    printf("draws: %u/%u sequences' %u sampled tokens the same through the row and drawn (alone, and beside 15 "
           "others); %u of %u drawn on the device (%s)\n", same, N_SEQ, N_DEC, dev, 2 * N_SEQ * N_DEC,
           gpu ? "all expected" : "none expected: the host draws from the row");
    CHECK(same == N_SEQ);
    CHECK(dev == (gpu ? 2u * N_SEQ * N_DEC : 0u));
    /* refusals */
    muser_error err = {0};
    muser_seq *q = NULL;
    CHECK_OK(muser_engine_open(e, 0, &q, &err), &err);
    const int32_t p0 = 1;
    CHECK_OK(muser_seq_prefill(q, &p0, 1, NULL, &err), &err);
    float *lg = malloc(g_m->hp.n_vocab * sizeof *lg);
    muser_draw d = {.temperature = 0.8f, .top_p = 1.0f, .u = 0.5};
    CHECK(muser_seq_decode_draw(q, 2, NULL, &d, &err) == MUSER_E_ARG);
    d.temperature = 0.0f;
    CHECK(muser_seq_decode_draw(q, 2, lg, &d, &err) == MUSER_E_ARG);
    d = (muser_draw){.temperature = 0.8f, .top_p = 1.0f, .u = 1.0};
    CHECK(muser_seq_decode_draw(q, 2, lg, &d, &err) == MUSER_E_ARG);
    d = (muser_draw){.temperature = 0.8f, .top_p = 0.0f, .u = 0.5};
    CHECK(muser_seq_decode_draw(q, 2, lg, &d, &err) == MUSER_E_ARG);
    d = (muser_draw){.temperature = 0.8f, .top_p = 1.5f, .u = 0.5};
    CHECK(muser_seq_decode_draw(q, 2, lg, &d, &err) == MUSER_E_ARG);
    d = (muser_draw){.temperature = 0.8f, .top_p = 1.0f, .min_p = -0.1f, .u = 0.5};
    CHECK(muser_seq_decode_draw(q, 2, lg, &d, &err) == MUSER_E_ARG);
    CHECK(muser_seq_pos(q) == 1);
    muser_engine_close(q);
    free(lg);
    muser_engine_free(e);
}

int main(void)
{
    g_san = getenv("MUSER_SANITIZED") && !strcmp(getenv("MUSER_SANITIZED"), "1");
    char path[256];
    snprintf(path, sizeof path, "test_engine_%d.gguf", (int)getpid());
    muser_synth_opts so;
    muser_synth_opts_default(&so);
    so.n_threads = 2;
    muser_error err = {0};
    CHECK_OK(muser_synth_write(&so, path, NULL, &err), &err);
    CHECK_OK(muser_model_load(&g_m, path, &err), &err);
    unlink(path);
    if (!g_m) return 1;
    outputs();
    outranks();
    no_starving();
    regroup();
    window();
    cancel_and_budget();
    threads();
    copy();
    draws();
    /* the engine on the GPU: the same bytes as the session driven directly there */
    if (gpu_present(g_m)) {
        g_backend = MUSER_BACKEND_CUDA;
        printf("CUDA:\n");
        outputs();
        copy();
        draws();
    } else {
        printf("SKIP: the CUDA half (no GPU, or built without CUDA)\n");
    }
    muser_model_free(g_m);
    printf("test_engine: %d checks, %d failures\n", check_count, check_failures);
    return check_failures ? 1 : 0;
}
