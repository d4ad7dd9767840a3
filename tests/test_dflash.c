/* test_dflash.c — the DFlash drafter (dflash.h, docs/dflash.md) on the CPU, with synthesized
 * (random-weight) drafters for the tiny model and the trained default model:
 *
 *   1. the CPU forward against the f64 oracle within SPEC §4's contract (max |Δ log_softmax| <= 1e-3
 *      over every row of the block, the same top-1 where the oracle's best two are > 1e-3 apart), on
 *      the target's real tapped residuals, for several context lengths, F32 and Q8_0 / Q4_K
 *      matrices; a tapped prefill gives plain prefill's logit bytes; a truncated-and-retaken context
 *      gives the same block bytes as a fresh one;
 *   2. greedy speculation with the DFlash drafter (B 4, 8, 16; k 1, 3, 7, 15): the tokens, logprob
 *      bytes and KV cache of plain greedy decoding, and the drafter's context covers every kept
 *      position;
 *   3. the round loop hands the drafter exactly the kept rows: a drafter that proposes the right
 *      token or a wrong one by turns (so rounds keep 1..k+1 rows) ends with a context whose block
 *      bytes equal those of a run fed by plain decoding's taps; four sequences speculating at once
 *      on one engine (two drafters of one tap, one of other layers, a plain decoder) share passes
 *      and each keeps its plain decoding's output;
 *   4. refusals: a drafter made for another target (other weights: the fingerprint; another
 *      vocabulary), a file that is not a drafter, and every metadata key dropped or corrupted (and
 *      a tensor dropped), each with an error naming what is wrong and *out left NULL. */
#include "dflash.h"
#include "gguf.h"
#include "gpu.h"
#include "quant.h"
#include "spec_run.h"
#include "synth.h"

#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define CTX 512

static char g_tmp[256];

static const char *tmp_path(const char *what)
{
    snprintf(g_tmp, sizeof g_tmp, "test_dflash_%d_%s.gguf", (int)getpid(), what);
    return g_tmp;
}

static muser_model *synth_target(uint64_t seed)
{
    muser_synth_opts so;
    muser_synth_opts_default(&so);
    so.seed = seed;
    so.n_threads = 2;
    muser_error err = {0};
    muser_model *m = NULL;
    const char *p = tmp_path("target");
    CHECK_OK(muser_synth_write(&so, p, NULL, &err), &err);
    CHECK_OK(muser_model_load(&m, p, &err), &err);
    unlink(p);
    return m;
}

static muser_dflash *synth_drafter(const muser_model *t, uint32_t B, uint32_t layers, int type, uint64_t seed)
{
    muser_synth_dflash_opts o;
    memset(&o, 0, sizeof o);
    o.seed = seed;
    o.n_layer = layers;
    o.block_size = B;
    o.type = type;
    muser_error err = {0};
    const char *p = tmp_path("drafter");
    muser_dflash *d = NULL;
    CHECK_OK(muser_synth_dflash_write(t, &o, p, &err), &err);
    CHECK_OK(muser_dflash_load(&d, p, t, &err), &err);
    unlink(p);
    return d;
}

static muser_session *cpu_session(const muser_model *m)
{
    muser_session_opts so;
    memset(&so, 0, sizeof so);
    so.n_threads = 2;
    so.n_ctx = CTX;
    muser_error err = {0};
    muser_session *s = NULL;
    CHECK_OK(muser_session_new(&s, m, &so, &err), &err);
    return s;
}

/* the target's tapped residuals of tokens[0..n) through the prefill route, and its last logits */
static float *tapped_prefill(const muser_model *m, const muser_dflash *d, const int32_t *tokens, uint32_t n,
                             float *logits)
{
    muser_error err = {0};
    muser_session *s = cpu_session(m);
    float *f = malloc((size_t)n * d->hp.n_tap * m->hp.n_embd * sizeof(float));
    const muser_tap tap = {.n_layers = d->hp.n_tap, .layers = d->hp.tap_layers, .out = f};
    if (s)
        CHECK_OK(muser_session_prefill_tap(s, tokens, n, logits, &tap, &err), &err);
    muser_session_free(s);
    return f;
}

/* the drafter's backend under test: the CPU's, then the GPU's where there is one */
static muser_dflash_kind g_dkind = MUSER_DFLASH_CPU;

/* ---- 1. the CPU (or GPU) forward against the oracle ---- */
static void against_oracle(const muser_model *m, const muser_dflash *d, const char *what)
{
    const uint32_t V = m->hp.n_vocab, B = d->hp.block_size, np = 70;
    int32_t toks[70];
    for (uint32_t i = 0; i < np; i++) toks[i] = (int32_t)((i * 37 + 11) % (V - 8) + 5);
    float *lt = malloc(V * sizeof(float)), *lp = malloc(V * sizeof(float));
    float *feats = tapped_prefill(m, d, toks, np, lt);
    { /* the tap changes no byte of the prefill route */
        muser_error err = {0};
        muser_session *s = cpu_session(m);
        if (s) CHECK_OK(muser_session_prefill(s, toks, np, lp, &err), &err);
        CHECKF(!memcmp(lt, lp, V * sizeof(float)), "%s: a tapped prefill's logits differ from a plain one's", what);
        muser_session_free(s);
    }
    muser_error err = {0};
    muser_dflash_run *cpu = NULL, *ora = NULL, *again = NULL;
    CHECK_OK(muser_dflash_run_new(&cpu, d, g_dkind, CTX, &err), &err);
    CHECK_OK(muser_dflash_run_new(&ora, d, MUSER_DFLASH_ORACLE, CTX, &err), &err);
    CHECK_OK(muser_dflash_run_new(&again, d, g_dkind, CTX, &err), &err);
    float *a = malloc((size_t)(B - 1) * V * sizeof(float)), *b = malloc((size_t)(B - 1) * V * sizeof(float));
    float *c = malloc((size_t)(B - 1) * V * sizeof(float));
    const uint64_t row = (uint64_t)d->hp.n_tap * m->hp.n_embd;
    double worst = 0;
    bool top1 = true, distinct = false;
    const uint32_t lens[] = {0, 1, 17, 40, 69};
    uint64_t held = 0;
    for (size_t li = 0; cpu && ora && again && li < sizeof lens / sizeof lens[0]; li++) {
        const uint32_t L = lens[li];
        CHECK_OK(muser_dflash_run_context(cpu, held, feats + held * row, (uint32_t)(L - held), &err), &err);
        CHECK_OK(muser_dflash_run_context(ora, held, feats + held * row, (uint32_t)(L - held), &err), &err);
        held = L;
        CHECK(muser_dflash_run_held(cpu) == L);
        CHECK_OK(muser_dflash_run_block(cpu, toks[L], B - 1, a, &err), &err);
        CHECK_OK(muser_dflash_run_block(ora, toks[L], B - 1, b, &err), &err);
        for (uint32_t r = 0; r + 1 < B; r++) {
            bool ok = true;
            const double dd = check_lsm_diff(a + (uint64_t)r * V, b + (uint64_t)r * V, V, &ok);
            if (dd > worst) worst = dd;
            top1 &= ok;
        }
        distinct |= memcmp(a, a + V, V * sizeof(float)) != 0;
        /* the draft's tokens are the block's per-row argmax, the lower id on a tie */
        int32_t ids[MUSER_DFLASH_MAX_BLOCK];
        CHECK_OK(muser_dflash_run_draft(cpu, toks[L], B - 1, ids, &err), &err);
        for (uint32_t r = 0; r + 1 < B; r++) {
            const float *row_r = a + (uint64_t)r * V;
            int32_t best = 0;
            for (uint32_t v = 1; v < V; v++)
                if (row_r[v] > row_r[best]) best = (int32_t)v;
            CHECKF(ids[r] == best, "%s: context %u row %u: draft token %d, the logits' argmax %d", what, L, r, ids[r],
                   best);
        }
        CHECK(muser_dflash_run_held(cpu) == L);
        /* a context taken whole, after a longer one was truncated back, gives the same bytes */
        CHECK_OK(muser_dflash_run_context(again, 0, feats, np - 1, &err), &err);
        CHECK_OK(muser_dflash_run_context(again, 0, feats, L, &err), &err);
        CHECK_OK(muser_dflash_run_block(again, toks[L], B - 1, c, &err), &err);
        CHECKF(!memcmp(a, c, (size_t)(B - 1) * V * sizeof(float)), "%s: context %u: truncate-and-retake differs", what,
               L);
        /* fewer rows of logits: the same bytes for those rows */
        CHECK_OK(muser_dflash_run_block(again, toks[L], 2, c, &err), &err);
        CHECKF(!memcmp(a, c, (size_t)2 * V * sizeof(float)), "%s: context %u: 2 rows differ from the whole block's", what, L);
    }
    CHECKF(worst <= 1e-3, "%s: max |dlog_softmax| %.3g against the oracle", what, worst);
    CHECKF(top1, "%s: a top-1 differs from the oracle's", what);
    CHECKF(distinct, "%s: the block's rows all give the same logits", what);
    /* refusals that change nothing */
    CHECK(muser_dflash_run_context(cpu, held + 1, feats, 1, &err) == MUSER_E_CACHE_DISCONTINUITY);
    CHECK(muser_dflash_run_held(cpu) == held);
    CHECK(muser_dflash_run_block(cpu, (int32_t)V, B - 1, a, &err) == MUSER_E_ARG);
    CHECK(muser_dflash_run_block(cpu, 1, B, a, &err) == MUSER_E_ARG && muser_dflash_run_held(cpu) == held);
    CHECK(muser_dflash_run_block(cpu, 1, 0, a, &err) == MUSER_E_ARG);
    printf("%-26s B %2u, %u layer(s), %s: %s vs oracle max |dlog_softmax| %.2e over contexts 0..69, top-1 %s\n",
           what, B, d->hp.n_layer, quant_info(d->layers[0].attn_q.type)->name, g_dkind == MUSER_DFLASH_CUDA ? "CUDA" : "CPU",
           worst, top1 ? "same" : "DIFFERS");
    muser_dflash_run_free(cpu);
    muser_dflash_run_free(ora);
    muser_dflash_run_free(again);
    free(a);
    free(b);
    free(c);
    free(feats);
    free(lt);
    free(lp);
}

/* ---- 2, 3. speculation ---- */

static void greedy(const muser_model *m, const char *what, const int32_t *prompt, uint32_t np)
{
    muser_engine *e = engine(m);
    if (!e) return;
    out ref, got;
    plain(e, prompt, np, 0.0f, 1, &ref);
    const uint32_t Bs[] = {4, 8, 16}, ks[] = {1, 3, 7, 15};
    int ok_runs = 0, runs = 0;
    uint64_t acc = 0, drafted = 0, rounds = 0;
    for (size_t bi = 0; bi < 3; bi++) {
        muser_dflash *df = synth_drafter(m, Bs[bi], bi == 1 ? 2 : 1, GGML_TYPE_F32, 7 + bi);
        for (size_t ki = 0; df && ki < 4; ki++) {
            muser_error err = {0};
            muser_drafter *d = NULL;
            CHECK_OK(muser_drafter_dflash_new(&d, df, g_dkind, CTX, &err), &err);
            if (!d) continue;
            speculate(e, d, ks[ki], prompt, np, 0.0f, 1, &got);
            const bool ok = same_output(&got, &ref);
            CHECKF(ok, "%s: DFlash B %u, k %u: the tokens, logprobs or cache differ from plain greedy decoding", what,
                   Bs[bi], ks[ki]);
            /* a round drafts only when the drafter's context is every position before it: all but the
             * last (which may have no room left) must have */
            CHECKF(got.st.drafted + 1 >= got.st.rounds, "%s: DFlash B %u, k %u: %llu drafts in %llu rounds", what,
                   Bs[bi], ks[ki], (unsigned long long)got.st.drafted, (unsigned long long)got.st.rounds);
            CHECKF(got.st.drafted <= got.st.rounds * (ks[ki] < Bs[bi] - 1 ? ks[ki] : Bs[bi] - 1),
                   "%s: more drafts than a block holds", what);
            ok_runs += ok;
            runs++;
            acc += got.st.accepted;
            drafted += got.st.drafted;
            rounds += got.st.rounds;
            muser_drafter_free(d);
        }
        muser_dflash_free(df);
    }
    printf("%-26s greedy: %d/%d DFlash runs (B 4, 8, 16; k 1, 3, 7, 15) give plain decoding's tokens, logprob "
           "bytes and cache; %llu of %llu drafts accepted over %llu passes (random drafters)\n",
           what, ok_runs, runs, (unsigned long long)acc, (unsigned long long)drafted, (unsigned long long)rounds);
    muser_engine_free(e);
}

/* A drafter that proposes plain decoding's own tokens, the draft at index (round mod k+1) wrong (none
 * when that is k), and keeps a DFlash run fed through observe: rounds keep 1..k+1 rows. */
typedef struct cheat {
    muser_drafter base;
    const out *ref;
    uint32_t np;
    muser_dflash_run *run;
    uint64_t calls;
} cheat;

static int cheat_propose(muser_drafter *dr, const int32_t *ctx, uint64_t n, uint32_t k, int32_t *o, muser_error *err)
{
    (void)ctx;
    (void)err;
    cheat *c = dr->self;
    uint32_t m = 0;
    const uint64_t wrong = c->calls++ % (k + 1);
    for (uint64_t g = n - c->np; m < k && g < c->ref->n; g++, m++)
        o[m] = m == wrong ? (c->ref->ids[g] + 1) % 7 : c->ref->ids[g];
    return (int)m;
}

static int cheat_observe(muser_drafter *dr, uint64_t pos0, const float *feats, uint32_t n, muser_error *err)
{
    cheat *c = dr->self;
    return muser_dflash_run_context(c->run, pos0, feats, n, err);
}

/* early: the cheat's observe is early (spec.h), as the GPU drafter's: every verified row is handed
 * on right after the verify and the rejected ones are cut back after acceptance */
static void kept_rows(const muser_model *m, const int32_t *prompt, uint32_t np, muser_dflash_kind kind, bool early)
{
    muser_dflash *df = synth_drafter(m, 8, 1, GGML_TYPE_F32, 3);
    muser_engine *e = engine(m);
    if (!df || !e) {
        muser_dflash_free(df);
        muser_engine_free(e);
        return;
    }
    out ref, got;
    plain(e, prompt, np, 0.0f, 1, &ref);
    muser_error err = {0};
    cheat c = {.ref = &ref, .np = np};
    CHECK_OK(muser_dflash_run_new(&c.run, df, kind, CTX, &err), &err);
    c.base = (muser_drafter){.name = "cheat", .propose = cheat_propose, .self = &c, .n_tap = df->hp.n_tap,
                             .tap_layers = df->hp.tap_layers, .observe = cheat_observe, .observe_early = early};
    if (!c.run) {
        muser_engine_free(e);
        muser_dflash_free(df);
        return;
    }
    speculate(e, &c.base, 5, prompt, np, 0.0f, 1, &got);
    CHECKF(same_output(&got, &ref), "kept rows: the output differs from plain decoding");
    CHECKF(got.st.accepted > got.st.rounds, "kept rows: %llu accepted over %llu rounds: too few to test",
           (unsigned long long)got.st.accepted, (unsigned long long)got.st.rounds);
    CHECK(muser_dflash_run_held(c.run) == got.pos);
    /* plain decoding's taps: the prompt through the prefill route, each fed token one decode row */
    muser_session *s = cpu_session(m);
    const uint64_t row = (uint64_t)df->hp.n_tap * m->hp.n_embd;
    float *f = malloc(got.pos * row * sizeof(float));
    muser_tap tap = {.n_layers = df->hp.n_tap, .layers = df->hp.tap_layers, .out = f};
    if (s) CHECK_OK(muser_session_prefill_tap(s, prompt, np, NULL, &tap, &err), &err);
    for (uint64_t p = np; s && p < got.pos; p++) {
        tap.out = f + p * row;
        const int32_t t = ref.ids[p - np];
        CHECK_OK(muser_step(s->dev, &s, &t, 1, NULL, NULL, &tap, &err), &err);
    }
    muser_dflash_run *fresh = NULL;
    CHECK_OK(muser_dflash_run_new(&fresh, df, kind, CTX, &err), &err);
    if (fresh) CHECK_OK(muser_dflash_run_context(fresh, 0, f, (uint32_t)got.pos, &err), &err);
    const uint32_t V = m->hp.n_vocab;
    float *a = malloc(7 * (size_t)V * sizeof(float)), *b = malloc(7 * (size_t)V * sizeof(float));
    if (fresh) {
        CHECK_OK(muser_dflash_run_block(c.run, 5, 7, a, &err), &err);
        CHECK_OK(muser_dflash_run_block(fresh, 5, 7, b, &err), &err);
        CHECKF(!memcmp(a, b, 7 * (size_t)V * sizeof(float)),
               "kept rows: the drafter's context after speculation differs from plain decoding's taps");
    }
    printf("kept rows (%s drafter, %s observe): %llu rounds keeping %llu drafts; the drafter's %llu-position context "
           "is plain decoding's, byte for byte\n",
           kind == MUSER_DFLASH_CUDA ? "CUDA" : "CPU", early ? "early" : "late", (unsigned long long)got.st.rounds,
           (unsigned long long)got.st.accepted, (unsigned long long)got.pos);
    free(a);
    free(b);
    free(f);
    muser_dflash_run_free(fresh);
    muser_session_free(s);
    muser_dflash_run_free(c.run);
    muser_engine_free(e);
    muser_dflash_free(df);
}

/* 3b. sequences speculating at once on one engine: drafters with different tap layers, and a
 * plain decoder, share passes (a pass carries one tap's layers; the others wait a pass), and each
 * sequence's output is still its plain decoding's */
typedef struct job {
    muser_engine *e;
    muser_drafter *d;      /* NULL: plain decoding */
    const int32_t *prompt;
    uint32_t np;
    pthread_barrier_t *go;
    out o;
} job;

static void *job_run(void *arg)
{
    job *j = arg;
    pthread_barrier_wait(j->go);
    if (j->d) speculate(j->e, j->d, 7, j->prompt, j->np, 0.0f, 1, &j->o);
    else plain(j->e, j->prompt, j->np, 0.0f, 1, &j->o);
    return NULL;
}

static void packed(const muser_model *m, const int32_t *prompt)
{
    muser_engine *e = engine(m);
    muser_synth_dflash_opts o;
    memset(&o, 0, sizeof o);
    o.block_size = 8;
    muser_dflash *dfa = NULL, *dfb = NULL;
    muser_error err = {0};
    const char *p = tmp_path("packed");
    for (int k = 0; k < 2; k++) {
        o.seed = 20 + (uint64_t)k;
        o.n_tap = k ? 2 : 3;
        const uint32_t la[3] = {1, 4, 7}, lb[2] = {2, 5};
        memcpy(o.tap_layers, k ? lb : la, o.n_tap * sizeof(uint32_t));
        CHECK_OK(muser_synth_dflash_write(m, &o, p, &err), &err);
        CHECK_OK(muser_dflash_load(k ? &dfb : &dfa, p, m, &err), &err);
        unlink(p);
    }
    if (!e || !dfa || !dfb) {
        muser_dflash_free(dfa);
        muser_dflash_free(dfb);
        muser_engine_free(e);
        return;
    }
    enum { NJ = 4 };
    job jobs[NJ];
    memset(jobs, 0, sizeof jobs);
    out ref[NJ];
    for (int i = 0; i < NJ; i++) {
        jobs[i].e = e;
        jobs[i].prompt = prompt + 7 * i;
        jobs[i].np = 24;
        plain(e, jobs[i].prompt, jobs[i].np, 0.0f, 1, &ref[i]);
    }
    CHECK_OK(muser_drafter_dflash_new(&jobs[0].d, dfa, MUSER_DFLASH_CPU, CTX, &err), &err);
    CHECK_OK(muser_drafter_dflash_new(&jobs[1].d, dfa, MUSER_DFLASH_CPU, CTX, &err), &err);
    CHECK_OK(muser_drafter_dflash_new(&jobs[2].d, dfb, MUSER_DFLASH_CPU, CTX, &err), &err);
    pthread_barrier_t go;
    pthread_barrier_init(&go, NULL, NJ);
    pthread_t th[NJ];
    for (int i = 0; i < NJ; i++) {
        jobs[i].go = &go;
        pthread_create(&th[i], NULL, job_run, &jobs[i]);
    }
    for (int i = 0; i < NJ; i++) pthread_join(th[i], NULL);
    pthread_barrier_destroy(&go);
    static muser_pass_rec rec[MUSER_ENGINE_LOG];
    const uint32_t np = muser_engine_passes(e, rec, MUSER_ENGINE_LOG);
    uint32_t shared = 0;
    for (uint32_t i = 0; i < np; i++) shared += rec[i].kind == MUSER_PASS_DECODE && rec[i].seqs > 1;
    CHECKF(shared > 0, "packed: no decode pass was shared: the packing was not tested");
    int ok = 0;
    for (int i = 0; i < NJ; i++) {
        const bool same = same_output(&jobs[i].o, &ref[i]);
        CHECKF(same, "packed: sequence %d (%s) differs from its plain decoding", i,
               !jobs[i].d ? "plain" : i == 2 ? "other tap layers" : "DFlash");
        ok += same;
        muser_drafter_free(jobs[i].d);
    }
    printf("packed: %d/%d concurrent sequences (two drafters of one tap, one of another, a plain one) give "
           "plain decoding's output; %u decode passes were shared by several sequences\n",
           ok, NJ, shared);
    muser_dflash_free(dfa);
    muser_dflash_free(dfb);
    muser_engine_free(e);
}

/* ---- 4. refusals ---- */

/* A copy of the drafter file src with one key changed: dropped (kind 0), a string (1), 0 (2), huge
 * (3); or one tensor dropped (kind 4, key is its name). */
static int rewrite(const char *src, const char *dst, const char *key, int kind, muser_error *err)
{
    gguf_file *f = NULL;
    int rc = gguf_open(&f, src, err);
    if (rc) return rc;
    gguf_writer *w = gguf_writer_new(0);
    for (uint64_t i = 0; i < f->n_kv; i++) {
        const gguf_kv *kv = &f->kv[i];
        if (kind == 4 || !gguf_str_eq(kv->key, key)) {
            gguf_writer_copy_kv(w, kv);
            continue;
        }
        if (kind == 1) gguf_writer_set_str(w, key, "garbage");
        if (kind == 2 && kv->type == GGUF_TYPE_ARRAY) {
            const uint32_t past = 99;
            gguf_writer_set_arr(w, key, GGUF_TYPE_UINT32, &past, 1);
        }
        if (kind == 3 && kv->type == GGUF_TYPE_ARRAY) {
            const uint32_t bad[2] = {3, 1};
            gguf_writer_set_arr(w, key, GGUF_TYPE_UINT32, bad, 2);
        }
        if (kind >= 2 && kv->type == GGUF_TYPE_FLOAT32) gguf_writer_set_f32(w, key, kind == 2 ? 0.0f : NAN);
        if (kind >= 2 && kv->type == GGUF_TYPE_UINT32) gguf_writer_set_u32(w, key, kind == 2 ? 0 : 0xffffffffu);
        if (kind >= 2 && kv->type == GGUF_TYPE_STRING)
            gguf_writer_set_str(w, key, kind == 2 ? "" : "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef");
    }
    for (uint64_t i = 0; i < f->n_tensors && !rc; i++) {
        const gguf_tensor *t = &f->tensors[i];
        if (kind == 4 && !strcmp(t->name_z, key)) continue;
        rc = gguf_writer_add_tensor(w, t->name_z, t->type, t->n_dims, t->ne, err);
    }
    if (!rc) rc = gguf_writer_begin(w, dst, err);
    for (uint64_t i = 0; i < f->n_tensors && !rc; i++)
        if (!(kind == 4 && !strcmp(f->tensors[i].name_z, key)))
            rc = gguf_writer_tensor_data(w, f->tensors[i].data, f->tensors[i].nbytes, err);
    if (!rc) rc = gguf_writer_finish(w, err);
    gguf_writer_free(w);
    gguf_close(f);
    return rc;
}

static void refusals(const muser_model *tiny, const muser_model *tiny2, const muser_model *def)
{
    char good[256], bad[256];
    snprintf(good, sizeof good, "test_dflash_%d_good.gguf", (int)getpid());
    snprintf(bad, sizeof bad, "test_dflash_%d_bad.gguf", (int)getpid());
    muser_synth_dflash_opts o;
    memset(&o, 0, sizeof o);
    o.seed = 5;
    muser_error err = {0};
    CHECK_OK(muser_synth_dflash_write(tiny, &o, good, &err), &err);
    muser_dflash *d = (muser_dflash *)1;
    /* another target: same shapes, other weights */
    CHECK(muser_dflash_load(&d, good, tiny2, &err) == MUSER_E_ARG && !d);
    CHECKF(strstr(err.msg, "fingerprint") != NULL, "other weights: %s", err.msg);
    printf("other target's weights: %s\n", err.msg);
    if (def) {
        CHECK(muser_dflash_load(&d, good, def, &err) == MUSER_E_ARG && !d);
        CHECKF(strstr(err.msg, "vocabulary") != NULL, "other vocabulary: %s", err.msg);
        printf("other vocabulary: %s\n", err.msg);
    }
    { /* the oracle's tap: the CPU's residuals to f32 accuracy, and the logits of a plain prefill */
        const uint32_t E = tiny->hp.n_embd, V = tiny->hp.n_vocab;
        const uint32_t layers[2] = {0, 1};
        const int32_t toks[3] = {5, 6, 7};
        float *feats[2], *lg[3];
        for (int k = 0; k < 2; k++) feats[k] = calloc((size_t)3 * 2 * E, sizeof(float));
        for (int k = 0; k < 3; k++) lg[k] = calloc(V, sizeof(float));
        for (int k = 0; k < 3; k++) {
            muser_session_opts so;
            memset(&so, 0, sizeof so);
            so.backend = k == 1 ? MUSER_BACKEND_CPU : MUSER_BACKEND_ORACLE;
            so.n_ctx = 64;
            so.n_threads = 2;
            muser_session *s = NULL;
            CHECK_OK(muser_session_new(&s, tiny, &so, &err), &err);
            const muser_tap tap = {.n_layers = 2, .layers = layers, .out = feats[k == 1]};
            if (s && k < 2) CHECK_OK(muser_session_prefill_tap(s, toks, 3, lg[k], &tap, &err), &err);
            if (s && k == 2) CHECK_OK(muser_session_prefill(s, toks, 3, lg[k], &err), &err);
            muser_session_free(s);
        }
        double worst = 0, big = 0;
        for (size_t i = 0; i < (size_t)3 * 2 * E; i++) {
            const double dd = fabs((double)feats[0][i] - feats[1][i]);
            worst = dd > worst ? dd : worst;
            big = fabs(feats[0][i]) > big ? fabs(feats[0][i]) : big;
        }
        CHECKF(big > 0 && worst <= 1e-4 * big, "oracle tap against the cpu's: max |d| %.3g of max %.3g", worst, big);
        CHECKF(!memcmp(lg[0], lg[2], V * sizeof(float)), "the oracle's tapped prefill changed its logits");
        { /* the oracle's step tap: a verify block of the three rows taps the prefill's bytes */
            muser_session_opts so;
            memset(&so, 0, sizeof so);
            so.backend = MUSER_BACKEND_ORACLE;
            so.n_ctx = 64;
            muser_device *dv = NULL;
            muser_session *s = NULL;
            float *st = calloc((size_t)3 * 2 * E, sizeof(float)), *sl = calloc((size_t)3 * V, sizeof(float));
            CHECK_OK(muser_device_new(&dv, tiny, &so, &err), &err);
            if (dv) CHECK_OK(muser_session_open(&s, dv, 0, &err), &err);
            const muser_tap tap = {.n_layers = 2, .layers = layers, .out = st};
            muser_session *rs[3] = {s, s, s};
            if (s) CHECK_OK(muser_step(dv, rs, toks, 3, sl, NULL, &tap, &err), &err);
            CHECKF(!memcmp(st, feats[0], (size_t)3 * 2 * E * sizeof(float)), "the oracle's step tap differs from its prefill tap");
            muser_session_free(s);
            muser_device_free(dv);
            free(st);
            free(sl);
        }
        printf("oracle tap: the cpu's residuals within %.2g (max |h| %.3g); the logits of a plain prefill\n", worst,
               big);
        for (int k = 0; k < 2; k++) free(feats[k]);
        for (int k = 0; k < 3; k++) free(lg[k]);
    }
    /* a model is not a drafter, and a drafter not a model */
    muser_synth_opts so;
    muser_synth_opts_default(&so);
    so.n_threads = 2;
    CHECK_OK(muser_synth_write(&so, bad, NULL, &err), &err);
    CHECK(muser_dflash_load(&d, bad, tiny, &err) == MUSER_E_UNSUPPORTED && !d);
    CHECKF(strstr(err.msg, "not a DFlash drafter") != NULL, "a model: %s", err.msg);
    muser_model *mm = NULL;
    CHECK(muser_model_load(&mm, good, &err) == MUSER_E_UNSUPPORTED && !mm);
    CHECKF(strstr(err.msg, "--draft-dflash") != NULL, "a drafter as a model: %s", err.msg);
    /* every key dropped or corrupted */
    gguf_file *f = NULL;
    CHECK_OK(gguf_open(&f, good, &err), &err);
    int refused = 0, tried = 0;
    for (uint64_t i = 0; f && i < f->n_kv; i++) {
        char key[128];
        snprintf(key, sizeof key, "%.*s", (int)f->kv[i].key.len, f->kv[i].key.ptr);
        if (!strcmp(key, "general.name")) continue; /* free text */
        for (int kind = 0; kind < 4; kind++) {
            CHECK_OK(rewrite(good, bad, key, kind, &err), &err);
            err.msg[0] = 0;
            const int rc = muser_dflash_load(&d, bad, tiny, &err);
            tried++;
            refused += rc != 0 && !d && err.msg[0];
            CHECKF(rc != 0 && !d, "%s (change %d) was accepted", key, kind);
            if (kind == 0) CHECKF(strstr(err.msg, key) != NULL, "dropping %s: the error does not name it: %s", key, err.msg);
            muser_dflash_free(rc ? NULL : d);
        }
    }
    /* a tensor dropped */
    CHECK_OK(rewrite(good, bad, "blk.0.attn_k.weight", 4, &err), &err);
    CHECK(muser_dflash_load(&d, bad, tiny, &err) == MUSER_E_SHAPE && !d);
    CHECKF(strstr(err.msg, "blk.0.attn_k.weight") != NULL, "a dropped tensor: %s", err.msg);
    /* bytes flipped anywhere in the header: refused or loaded, never a crash (ASan watches) */
    size_t len = 0;
    unsigned char *buf = (unsigned char *)check_read_file(good, &len);
    CHECK(buf != NULL);
    check_rng_seed(11);
    int flips = 0;
    if (buf) { /* the unflipped bytes load */
        gguf_file *g = NULL;
        muser_dflash *x = NULL;
        CHECK_OK(gguf_open_memory(&g, buf, len, "unflipped", &err), &err);
        if (g) CHECK_OK(muser_dflash_bind(&x, g, tiny, &err), &err);
        if (x) muser_dflash_free(x);
        else gguf_close(g);
    }
    for (int it = 0; it < 300 && len > 1024; it++) {
        unsigned char *copy = malloc(len);
        memcpy(copy, buf, len);
        const size_t at = (size_t)(check_rng_u64() % 1024);
        copy[at] ^= (unsigned char)(1u << (check_rng_u64() % 8));
        gguf_file *g = NULL;
        if (gguf_open_memory(&g, copy, len, "flipped", &err) == 0) {
            muser_dflash *x = NULL;
            if (muser_dflash_bind(&x, g, tiny, &err) == 0) {
                muser_dflash_free(x);
            } else {
                gguf_close(g);
                flips++;
            }
        } else {
            flips++;
        }
        free(copy);
    }
    free(buf);
    printf("refusals: %d of %d corrupted keys refused, each naming it; %d of 300 header bit flips refused, none "
           "crashed\n",
           refused, tried, flips);
    gguf_close(f);
    unlink(good);
    unlink(bad);
}

/* 1's drafters: tiny's in three formats and block sizes, and one for the default model */
static void oracle_cases(const muser_model *tiny, const muser_model *def)
{
    const int types[] = {GGML_TYPE_F32, GGML_TYPE_Q8_0, GGML_TYPE_Q4_K};
    for (int i = 0; i < 3; i++) {
        muser_dflash *d = synth_drafter(tiny, i == 2 ? 16 : 8, i == 0 ? 2 : 1, types[i], 1 + i);
        if (d) against_oracle(tiny, d, "tiny");
        muser_dflash_free(d);
    }
    if (def) {
        muser_dflash *d = synth_drafter(def, 16, 1, GGML_TYPE_Q8_0, 9);
        if (d) against_oracle(def, d, "default (trained)");
        muser_dflash_free(d);
    }
}

int main(void)
{
    char path[4096];
    const char *src = getenv("MUSER_SOURCE_DIR");
    snprintf(path, sizeof path, "%s/models/default.gguf", src ? src : ".");
    muser_error err = {0};
    muser_model *def = NULL;
    CHECK_OK(muser_model_load(&def, path, &err), &err);
    muser_model *tiny = synth_target(1), *tiny2 = synth_target(2);
    if (!tiny || !tiny2) return 1;
    /* 1 */
    oracle_cases(tiny, def);
    /* 2, 3 */
    int32_t prompt[120];
    for (uint32_t i = 0; i < 120; i++) prompt[i] = (int32_t)(40 + (i % 23) * 7 + (i / 46));
    greedy(tiny, "tiny", prompt, 30);
    if (def) greedy(def, "default (trained)", prompt, 100);
    for (int early = 0; early < 2; early++) {
        kept_rows(tiny, prompt, 30, MUSER_DFLASH_CPU, early);
        if (def) kept_rows(def, prompt, 100, MUSER_DFLASH_CPU, early);
    }
    packed(tiny, prompt);
    /* 1 and 2 on the GPU where there is one: the drafter's CUDA forward against the oracle, then
     * speculation with the target there (its tap on prefill and verify), the drafter on the CPU and on
     * the GPU */
    if (gpu_present(tiny)) {
        g_dkind = MUSER_DFLASH_CUDA;
        oracle_cases(tiny, def);
        g_backend = MUSER_BACKEND_CUDA;
        g_dkind = MUSER_DFLASH_CPU;
        greedy(tiny, "tiny (cuda, cpu drafter)", prompt, 30);
        g_dkind = MUSER_DFLASH_CUDA;
        greedy(tiny, "tiny (cuda)", prompt, 30);
        if (def) greedy(def, "default (trained, cuda)", prompt, 100);
        g_backend = MUSER_BACKEND_CPU;
        for (int early = 0; early < 2; early++) kept_rows(tiny, prompt, 30, MUSER_DFLASH_CUDA, early);
        if (def) kept_rows(def, prompt, 100, MUSER_DFLASH_CUDA, true);
        g_backend = MUSER_BACKEND_CPU;
        g_dkind = MUSER_DFLASH_CPU;
    } else {
        printf("SKIP: the CUDA half (no GPU, or built without CUDA)\n");
    }
    /* 4 */
    refusals(tiny, tiny2, def);
    muser_model_free(def);
    muser_model_free(tiny);
    muser_model_free(tiny2);
    printf("test_dflash: %d checks, %d failures\n", check_count, check_failures);
    return check_failures ? 1 : 0;
}
