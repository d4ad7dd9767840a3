/* test_spec.c — speculative decoding (spec.h) on the CPU, and part 1 again on CUDA where a GPU is
 * present (else a visible SKIP line).
 *
 *   1. greedy: plain greedy decoding through the engine against speculation with the n-gram
 *      drafter (n 2, 3) and the committed draft model, draft lengths 1, 2, 3, 7, 15, on prompts
 *      longer than the window of the trained model (64) and of tiny (16), generating past the
 *      ring's wrap: the same tokens, the same logprob bytes, and the same KV cache content
 *      (SHA-256 of the rows it holds) at the end, however many verified rows were rolled back;
 *   2. the acceptance rule: on a fixed 8-token distribution (plain, and with top-k 3 / top-p 0.9),
 *      200,000 draws through muser_spec_accept for several drafts match the sampler's
 *      distribution within a total-variation bound that the naive rule (redraw from p) misses by
 *      far; seeded sampled speculation repeats exactly;
 *   3. drafters sharing one draft engine (a server's requests): three seeded sampled jobs give
 *      the same bytes run one at a time and run at once (their draft rows then share passes), and
 *      the draft engine refuses a block past 16 rows with nothing changed;
 *   4. a draft model with another vocabulary is refused with a clear error. */
#include "spec_run.h"
#include "synth.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static void greedy(const muser_model *m, const muser_model *draft, const char *what, const int32_t *prompt, uint32_t np)
{
    muser_engine *e = engine(m);
    if (!e) return;
    out ref;
    plain(e, prompt, np, 0.0f, 1, &ref);
    const uint32_t ks[] = {1, 2, 3, 7, 15, 15}; /* the last: adaptive, at most 15 */
    int same = 0, total = 0;
    uint64_t acc = 0, drafted = 0, rounds = 0;
    for (int dk = 0; dk < 3; dk++) {
        if (dk == 2 && !draft) continue;
        for (size_t ki = 0; ki < sizeof ks / sizeof ks[0]; ki++) {
            muser_error err = {0};
            muser_drafter *d = NULL;
            if (dk < 2) CHECK_OK(muser_drafter_ngram_new(&d, 2 + (uint32_t)dk, &err), &err);
            else CHECK_OK(muser_drafter_model_new(&d, draft, m, g_backend, 2, 512, &err), &err);
            if (!d) continue;
            out got;
            g_adaptive = ki == sizeof ks / sizeof ks[0] - 1;
            speculate(e, d, ks[ki], prompt, np, 0.0f, 1, &got);
            const bool ok = same_output(&got, &ref);
            CHECKF(ok, "%s: %s drafter, k %u%s: the tokens, logprobs or cache differ from plain greedy decoding", what,
                   dk < 2 ? "n-gram" : "model", ks[ki], g_adaptive ? " adaptive" : "");
            g_adaptive = false;
            same += ok;
            total++;
            acc += got.st.accepted;
            drafted += got.st.drafted;
            rounds += got.st.rounds;
            muser_drafter_free(d);
        }
    }
    printf("%-18s greedy: %d/%d speculative runs (n-gram 2, 3%s; k 1..15, adaptive) give plain decoding's tokens, logprob bytes "
           "and cache; %llu of %llu drafts accepted over %llu verify passes\n", what, same, total,
           draft ? ", draft model" : "", (unsigned long long)acc, (unsigned long long)drafted,
           (unsigned long long)rounds);
    muser_engine_free(e);
}

/* ---- no logprobs asked: a round without drafts decodes plainly ---- */
/* Speculation asking for no logprobs (muser_spec_next's logprobs NULL: a round whose drafter proposes
 * nothing decodes t0 through the plain step, its next token drawn on the device, taken from the best
 * logits or from the row) gives the tokens and cache of the same run with logprobs, for greedy,
 * top-k, temperature alone and top-p samplers, fixed and adaptive draft lengths; greedy also plain
 * decoding's. */
static void no_logprobs(const muser_model *m, const char *what, const int32_t *prompt, uint32_t np)
{
    muser_engine *e = engine(m);
    if (!e) return;
    out ref;
    plain(e, prompt, np, 0.0f, 1, &ref);
    int same = 0, total = 0;
    uint64_t rounds = 0, drafted = 0;
    for (int smp = 0; smp < 4; smp++) {
        const float temp = smp == 0 ? 0.0f : 0.8f;
        g_sampling = smp < 2 ? 0 : smp - 1;
        for (int ad = 0; ad < 2; ad++) {
            muser_error err = {0};
            muser_drafter *d = NULL;
            CHECK_OK(muser_drafter_ngram_new(&d, 3, &err), &err);
            if (!d) continue;
            g_adaptive = ad == 1;
            out with, without;
            speculate(e, d, ad ? 15 : 3, prompt, np, temp, 7, &with);
            g_no_lp = true;
            speculate(e, d, ad ? 15 : 3, prompt, np, temp, 7, &without);
            g_no_lp = false;
            g_adaptive = false;
            const bool ok = with.n == without.n && !memcmp(with.ids, without.ids, with.n * sizeof *with.ids) &&
                            !strcmp(with.kv, without.kv) && with.pos == without.pos &&
                            (temp > 0.0f || (ref.n == with.n && !memcmp(ref.ids, with.ids, ref.n * sizeof *ref.ids)));
            CHECKF(ok, "%s: sampler %d%s: speculation without logprobs differs from the run with them", what, smp,
                   ad ? ", adaptive" : "");
            same += ok;
            total++;
            rounds += without.st.rounds;
            drafted += without.st.drafted;
            muser_drafter_free(d);
        }
    }
    g_sampling = 0;
    printf("%-18s no logprobs: %d/%d speculative runs (greedy, top-k, temperature alone, top-p) give the tokens and "
           "cache of the run with logprobs; %llu drafts over %llu rounds\n", what, same, total,
           (unsigned long long)drafted, (unsigned long long)rounds);
    muser_engine_free(e);
}

/* ---- the adaptive draft length's choice ---- */
static double fixed_round(const muser_drafter *d, uint32_t k)
{
    (void)d;
    (void)k;
    return 4.0e6; /* a round that costs 4 target tokens of 1e6 multiply-adds, whatever k */
}

/* k for acceptance a (as decayed counts) under cost table c and drafter d, with a greedy sampler
 * or not, n rows of other sequences in the pass, and `skipped` rounds without drafts before it */
static uint32_t choose_k_beside(const double *c, double a, const muser_drafter *d, bool greedy, uint32_t n,
                                uint32_t skipped)
{
    muser_spec sp;
    memset(&sp, 0, sizeof sp);
    sp.adaptive = true;
    sp.k_max = MUSER_SPEC_MAX_DRAFT;
    sp.d = (muser_drafter *)d;
    sp.target_macs = 1.0e6;
    memcpy(sp.cost, c, sizeof sp.cost);
    sp.acc_w = 100.0 * a;
    sp.rej_w = 100.0 * (1.0 - a);
    sp.greedy = greedy;
    sp.skipped = skipped;
    muser_spec_set_neighbours(&sp, n);
    return muser_spec_next_k(&sp);
}

/* the best k ≥ 1 (a round that must draft: the exploring one) */
static uint32_t choose_k(const double *c, double a, const muser_drafter *d)
{
    return choose_k_beside(c, a, d, false, 0, 1000);
}

static void adaptive_choice(void)
{
    double cpu[KV_MAX_SPEC_ROWS + 1], lin[KV_MAX_SPEC_ROWS + 1];
    for (uint32_t n = 0; n <= KV_MAX_SPEC_ROWS; n++) { /* rows in groups of 4 (1.7 a group), and nearly free rows */
        const uint32_t full = n ? (n - 1) / 4 : 0, rest = n - 4 * full;
        cpu[n] = n ? full * 1.7 + 1.0 + 0.7 * (rest - 1) / 3.0 : 0.0;
        lin[n] = n ? 1.0 + 0.02 * (n - 1) : 0.0;
    }
    muser_drafter free_d = {.name = "free"}, fixed_d = {.name = "fixed", .round_macs = fixed_round};
    const uint32_t k_low = choose_k(cpu, 0.1, &free_d), k_mid = choose_k(cpu, 0.6, &free_d),
                   k_high = choose_k(cpu, 0.9, &free_d);
    CHECKF(k_low == 1, "acceptance 0.1 on group costs: k %u, want 1", k_low);
    CHECKF(k_high == 3, "acceptance 0.9 on groups of 4: k %u, want 3 (a whole group)", k_high);
    CHECKF(k_low <= k_mid && k_mid <= k_high, "k not monotone in the acceptance: %u %u %u", k_low, k_mid, k_high);
    const uint32_t k_free = choose_k(lin, 0.99, &free_d);
    CHECKF(k_free == MUSER_SPEC_MAX_DRAFT, "nearly free rows at acceptance 0.99: k %u, want %d", k_free,
           MUSER_SPEC_MAX_DRAFT);
    const uint32_t k_fix = choose_k(cpu, 0.9, &fixed_d);
    CHECKF(k_fix > k_high, "a round's fixed drafter cost should lengthen the block: k %u against %u", k_fix, k_high);
    /* beside other sequences' rows: a greedy run drafts only where the pass has room worth it; a
     * sampled run's choice does not see them */
    const uint32_t k_full = choose_k_beside(cpu, 0.9, &free_d, true, 15, 0),
                   k_alone = choose_k_beside(cpu, 0.9, &free_d, true, 0, 0),
                   k_sampled = choose_k_beside(cpu, 0.9, &free_d, false, 15, 0),
                   k_room = choose_k_beside(lin, 0.99, &free_d, true, 3, 0);
    /* alone: no drafts when they do not pay, until the exploring round */
    const uint32_t k_none = choose_k_beside(cpu, 0.1, &free_d, false, 0, 0),
                   k_explore = choose_k_beside(cpu, 0.1, &free_d, false, 0, 8),
                   k_costly = choose_k_beside(cpu, 0.9, &fixed_d, false, 0, 0);
    CHECKF(k_none == 0, "acceptance 0.1 on group costs, alone: k %u, want 0 (a plain step)", k_none);
    CHECKF(k_explore == 1, "the 9th round without drafts: k %u, want 1", k_explore);
    CHECKF(k_costly == 0, "a drafter whose round costs 4 tokens at acceptance 0.9: k %u, want 0", k_costly);
    CHECKF(k_full == 0, "greedy beside 15 rows at acceptance 0.9 on groups of 4: k %u, want 0", k_full);
    CHECKF(k_alone == k_high, "greedy with no neighbours: k %u, want %u", k_alone, k_high);
    CHECKF(k_sampled == k_high, "a sampled run weighed its neighbours: k %u, want %u", k_sampled, k_high);
    CHECKF(k_room > 0, "greedy beside 3 rows on nearly free rows at 0.99: k %u, want some", k_room);
    muser_spec off;
    memset(&off, 0, sizeof off);
    off.k_max = 9;
    CHECKF(muser_spec_next_k(&off) == 9, "not adaptive: k is k_max");
    printf("adaptive draft length: k %u / %u / %u at acceptance 0.1 / 0.6 / 0.9 on groups of 4 rows, %u with a "
           "4-token drafter round, %u on nearly free rows at 0.99 (the best k >= 1); none at 0.1 (%u) until the 9th "
           "round (%u); greedy beside 15 rows %u, beside 3 on free rows %u\n",
           k_low, k_mid, k_high, k_fix, k_free, k_none, k_explore, k_full, k_room);
}

/* ---- 2. the acceptance rule ---- */
static void acceptance(void)
{
    const uint32_t V = 8, N = 200000;
    const float row[8] = {2.0f, 1.2f, 0.9f, 0.3f, 0.0f, -0.5f, -1.0f, -2.5f};
    for (int cfg = 0; cfg < 2; cfg++) {
        muser_sampler_params p;
        muser_sampler_params_default(&p);
        p.temperature = 1.0f;
        p.top_k = cfg ? 3 : 0;
        p.top_p = cfg ? 0.9f : 1.0f;
        p.min_p = 0.0f;
        p.seed = 7;
        muser_error err = {0};
        muser_sampler *s = NULL;
        CHECK_OK(muser_sampler_new(&s, V, &p, &err), &err);
        if (!s) return;
        /* the target distribution: the sampler's own candidates */
        double pd[8] = {0};
        const int32_t *ids;
        const float *w;
        uint32_t n;
        double mass;
        CHECK_OK(muser_sampler_dist(s, row, &ids, &w, &n, &mass), &err);
        for (uint32_t i = 0; i < n; i++) pd[ids[i]] = w[i] / mass;
        const int32_t drafts[3] = {0, 2, 6};
        for (int di = 0; di < 3; di++) {
            const int32_t d = drafts[di];
            uint32_t hist[8] = {0}, acc = 0;
            for (uint32_t t = 0; t < N; t++) {
                bool a = false;
                const int32_t x = muser_spec_accept(s, row, d, &a);
                CHECK(x >= 0 && x < (int32_t)V);
                if (x >= 0 && x < (int32_t)V) hist[x]++;
                acc += a;
            }
            double tv = 0, naive = 0;
            for (uint32_t i = 0; i < V; i++) {
                tv += fabs(hist[i] / (double)N - pd[i]);
                /* redrawing from p (d included) on rejection: p(d)·[i = d] + (1 − p(d))·p(i) */
                naive += fabs((i == (uint32_t)d ? pd[d] : 0.0) + (1 - pd[d]) * pd[i] - pd[i]);
            }
            tv /= 2;
            naive /= 2;
            printf("acceptance %s, draft %d (p %.3f): accepted %.3f, TV to p %.4f (the naive rule's %.4f)\n",
                   cfg ? "top-k 3, top-p 0.9" : "plain", d, pd[d], acc / (double)N, tv, naive);
            CHECKF(tv < 0.005, "draft %d: TV %.4f", d, tv);
            CHECKF(pd[d] == 0 || naive > 0.02, "the bound would not catch the naive rule (%.4f)", naive);
            CHECKF(fabs(acc / (double)N - pd[d]) < 0.005, "draft %d accepted %.4f, p(d) %.4f", d, acc / (double)N,
                   pd[d]);
        }
        muser_sampler_free(s);
    }
}

/* ---- 3. drafters sharing one draft engine ---- */
typedef struct job {
    muser_engine *e, *de;
    const muser_model *m;
    const int32_t *prompt;
    uint64_t seed;
    pthread_barrier_t *go;
    out o;
} job;

static void job_run1(job *j)
{
    muser_error err = {0};
    muser_drafter *d = NULL;
    CHECK_OK(muser_drafter_model_on(&d, j->de, j->m, 512, &err), &err);
    if (d) speculate(j->e, d, 7, j->prompt, 60, 0.8f, j->seed, &j->o);
    muser_drafter_free(d);
}

static void *job_thread(void *arg)
{
    job *j = arg;
    pthread_barrier_wait(j->go);
    job_run1(j);
    return NULL;
}

/* The draft engine's block limit: 10 rows then 7 more is refused, nothing changed; rollback then
 * keeps what decoding the kept rows one at a time would have written. */
static void draft_limit(muser_engine *de, const int32_t *prompt)
{
    muser_error err = {0};
    muser_seq *q = NULL, *r = NULL;
    CHECK_OK(muser_engine_open(de, 64, &q, &err), &err);
    CHECK_OK(muser_engine_open(de, 64, &r, &err), &err);
    if (!q || !r) return;
    CHECK_OK(muser_seq_prefill(q, prompt, 5, NULL, &err), &err);
    CHECK_OK(muser_seq_draft(q, prompt + 5, 10, NULL, NULL, &err), &err);
    CHECK(muser_seq_draft(q, prompt + 15, 7, NULL, NULL, &err) == MUSER_E_ARG);
    printf("draft block past 16 rows: %s\n", err.msg);
    CHECK(muser_seq_pos(q) == 15);
    CHECK_OK(muser_seq_draft(q, prompt + 15, 6, NULL, NULL, &err), &err); /* 16 in all: taken */
    CHECK_OK(muser_seq_rollback(q, 12, &err), &err);
    CHECK(muser_seq_pos(q) == 12);
    CHECK_OK(muser_seq_prefill(r, prompt, 5, NULL, &err), &err);
    for (uint32_t i = 5; i < 12; i++) CHECK_OK(muser_seq_decode(r, prompt[i], NULL, NULL, &err), &err);
    char a[65], b[65];
    CHECK_OK(muser_seq_kv_sha256(q, a, &err), &err);
    CHECK_OK(muser_seq_kv_sha256(r, b, &err), &err);
    CHECKF(!strcmp(a, b), "draft rows rolled back: the cache differs from decoding the kept rows alone");
    muser_engine_close(q);
    muser_engine_close(r);
}

static void shared_drafts(const muser_model *m, const muser_model *draft, const int32_t *prompt)
{
    muser_engine *e = engine(m), *de = engine(draft);
    if (!e || !de) {
        muser_engine_free(e);
        muser_engine_free(de);
        return;
    }
    enum { NJ = 3 };
    job jobs[NJ];
    out alone[NJ];
    memset(jobs, 0, sizeof jobs);
    for (int i = 0; i < NJ; i++) {
        jobs[i].e = e;
        jobs[i].de = de;
        jobs[i].m = m;
        jobs[i].prompt = prompt + 13 * i;
        jobs[i].seed = 5 + (uint64_t)i;
        job_run1(&jobs[i]);
        alone[i] = jobs[i].o;
    }
    static muser_pass_rec rec[MUSER_ENGINE_LOG];
    const uint32_t before = muser_engine_passes(de, rec, MUSER_ENGINE_LOG);
    const uint64_t first = before ? rec[before - 1].index + 1 : 0;
    pthread_barrier_t go;
    pthread_barrier_init(&go, NULL, NJ);
    pthread_t th[NJ];
    for (int i = 0; i < NJ; i++) {
        jobs[i].go = &go;
        pthread_create(&th[i], NULL, job_thread, &jobs[i]);
    }
    for (int i = 0; i < NJ; i++) pthread_join(th[i], NULL);
    pthread_barrier_destroy(&go);
    const uint32_t np = muser_engine_passes(de, rec, MUSER_ENGINE_LOG);
    uint32_t shared = 0, passes = 0;
    for (uint32_t i = 0; i < np; i++) {
        if (rec[i].index < first) continue;
        passes++;
        shared += rec[i].kind == MUSER_PASS_DECODE && rec[i].seqs > 1;
    }
    CHECKF(shared > 0, "shared draft engine: no draft pass held two sequences: the sharing was not tested");
    int ok = 0;
    uint64_t acc = 0, drafted = 0;
    for (int i = 0; i < NJ; i++) {
        const bool same = same_output(&jobs[i].o, &alone[i]);
        CHECKF(same, "shared draft engine: job %d (seed %llu) differs run beside the others", i,
               (unsigned long long)jobs[i].seed);
        ok += same;
        acc += jobs[i].o.st.accepted;
        drafted += jobs[i].o.st.drafted;
    }
    CHECKF(drafted > 0 && acc > 0, "shared draft engine: nothing drafted or accepted");
    printf("shared draft engine: %d/%d seeded sampled jobs (T 0.8) give the same bytes alone and at once; "
           "%u of %u draft-engine passes held several sequences; %llu of %llu drafts accepted\n",
           ok, NJ, shared, passes, (unsigned long long)acc, (unsigned long long)drafted);
    draft_limit(de, prompt);
    muser_engine_free(e);
    muser_engine_free(de);
}

static muser_model *load_default(void)
{
    char path[4096];
    const char *src = getenv("MUSER_SOURCE_DIR");
    snprintf(path, sizeof path, "%s/models/default.gguf", src ? src : ".");
    muser_error err = {0};
    muser_model *m = NULL;
    CHECK_OK(muser_model_load(&m, path, &err), &err);
    return m;
}

int main(void)
{
    char path[4096];
    const char *src = getenv("MUSER_SOURCE_DIR");
    muser_error err = {0};
    muser_model *def = load_default(), *draft = NULL, *tiny = NULL;
    snprintf(path, sizeof path, "%s/models/draft.gguf", src ? src : ".");
    CHECK_OK(muser_model_load(&draft, path, &err), &err);
    char tp[256];
    snprintf(tp, sizeof tp, "test_spec_%d.gguf", (int)getpid());
    muser_synth_opts so;
    muser_synth_opts_default(&so);
    so.n_threads = 2;
    CHECK_OK(muser_synth_write(&so, tp, NULL, &err), &err);
    CHECK_OK(muser_model_load(&tiny, tp, &err), &err);
    unlink(tp);
    /* repetitive prompts (lists, a repeated passage) longer than the windows */
    int32_t prompt[120];
    for (uint32_t i = 0; i < 120; i++) prompt[i] = (int32_t)(40 + (i % 23) * 7 + (i / 46));
    if (def) greedy(def, draft, "default (trained)", prompt, 100);
    if (tiny) greedy(tiny, NULL, "tiny", prompt, 30);
    if (def) no_logprobs(def, "default (trained)", prompt, 100);
    if (tiny) no_logprobs(tiny, "tiny", prompt, 30);
    acceptance();
    adaptive_choice();
    if (def && draft) shared_drafts(def, draft, prompt);
    if (tiny) { /* seeded sampled speculation repeats exactly */
        muser_engine *e = engine(tiny);
        muser_drafter *d = NULL;
        CHECK_OK(muser_drafter_ngram_new(&d, 3, &err), &err);
        out a, b;
        if (e && d) {
            speculate(e, d, 5, prompt, 30, 0.8f, 42, &a);
            speculate(e, d, 5, prompt, 30, 0.8f, 42, &b);
            CHECKF(a.n == b.n && !memcmp(a.ids, b.ids, a.n * sizeof *a.ids), "seeded sampled runs differ");
            printf("sampled (T 0.8, seed 42): two runs give the same %u tokens\n", a.n);
            g_adaptive = true; /* the adaptive length reads no clock: seeded runs repeat too */
            speculate(e, d, 15, prompt, 30, 0.8f, 42, &a);
            speculate(e, d, 15, prompt, 30, 0.8f, 42, &b);
            g_adaptive = false;
            CHECKF(a.n == b.n && !memcmp(a.ids, b.ids, a.n * sizeof *a.ids), "seeded adaptive sampled runs differ");
            printf("sampled, adaptive draft length: two runs give the same %u tokens\n", a.n);
        }
        muser_drafter_free(d);
        muser_engine_free(e);
    }
    if (def && tiny) {
        muser_drafter *d = NULL;
        CHECK(muser_drafter_model_new(&d, tiny, def, MUSER_BACKEND_CPU, 1, 64, &err) == MUSER_E_ARG);
        printf("mismatched draft: %s\n", err.msg);
        CHECK(strstr(err.msg, "vocabulary") != NULL);
    }
    /* on the GPU: speculation changes no token, logprob or cache byte there either */
    bool cuda = false;
#ifdef MUSER_HAVE_CUDA
    if (tiny) {
        muser_session_opts o;
        memset(&o, 0, sizeof o);
        o.backend = MUSER_BACKEND_CUDA;
        o.n_ctx = 64;
        muser_session *s = NULL;
        cuda = muser_session_new(&s, tiny, &o, &err) == 0;
        muser_session_free(s);
    }
#endif
    if (cuda) {
        g_backend = MUSER_BACKEND_CUDA;
        printf("CUDA:\n");
        if (def) greedy(def, draft, "default (trained)", prompt, 100);
        if (tiny) greedy(tiny, NULL, "tiny", prompt, 30);
        if (def) no_logprobs(def, "default (trained)", prompt, 100);
    } else {
        printf("SKIP: the CUDA half (no GPU, or built without CUDA)\n");
    }
    muser_model_free(def);
    muser_model_free(draft);
    muser_model_free(tiny);
    printf("test_spec: %d checks, %d failures\n", check_count, check_failures);
    return check_failures ? 1 : 0;
}
