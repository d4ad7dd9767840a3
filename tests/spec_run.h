/* spec_run.h — what the speculation tests share (test_spec, test_dflash): an engine on the test
 * backend, a sampler, plain decoding and speculative decoding of GEN tokens after a prompt, each
 * ending with the tokens, their logprob bytes, the position and the KV cache digest. Speculation
 * prefills through muser_spec_prefill, so a drafter with a tap (DFlash) gets the prompt's features. */
#ifndef MUSER_TEST_SPEC_RUN_H
#define MUSER_TEST_SPEC_RUN_H

#include "check.h"
#include "spec.h"

#include <stdlib.h>
#include <string.h>

#define GEN 90

static muser_backend_kind g_backend = MUSER_BACKEND_CPU; /* greedy() runs on each */
static bool g_adaptive = false; /* speculate() with the adaptive draft length (k the cap) */
static bool g_no_lp = false;    /* speculate() asks for no logprobs (o->lp all 0) */
static int g_sampling = 0;      /* sampler() with temp > 0: 0 the defaults (top-k 40, top-p 0.95, min-p
                                 * 0.05), 1 temperature alone (a plain draw), 2 top-p 0.9 alone */

typedef struct out {
    int32_t ids[GEN];
    float lp[GEN];
    uint32_t n;
    uint64_t pos;            /* tokens the sequence holds at the end */
    char kv[65];
    muser_spec_stats st;
} out;

static muser_engine *engine(const muser_model *m)
{
    muser_engine_opts o;
    memset(&o, 0, sizeof o);
    o.dev.backend = g_backend;
    o.dev.n_threads = 2;
    o.dev.n_ctx = 512;
    muser_error err = {0};
    muser_engine *e = NULL;
    CHECK_OK(muser_engine_new(&e, m, &o, &err), &err);
    return e;
}

static muser_sampler *sampler(uint32_t V, float temp, uint64_t seed)
{
    muser_sampler_params p;
    muser_sampler_params_default(&p);
    p.temperature = temp;
    p.seed = seed;
    if (g_sampling) {
        p.top_k = 0;
        p.top_p = g_sampling == 2 ? 0.9f : 1.0f;
        p.min_p = 0.0f;
    }
    muser_error err = {0};
    muser_sampler *s = NULL;
    CHECK_OK(muser_sampler_new(&s, V, &p, &err), &err);
    return s;
}

/* plain decoding: sample, emit, feed (not the last) */
static void plain(muser_engine *e, const int32_t *prompt, uint32_t np, float temp, uint64_t seed, out *o)
{
    muser_error err = {0};
    muser_seq *q = NULL;
    CHECK_OK(muser_engine_open(e, 0, &q, &err), &err);
    const uint32_t V = muser_seq_model(q)->hp.n_vocab;
    float *lg = malloc(V * sizeof(float));
    muser_sampler *s = sampler(V, temp, seed);
    CHECK_OK(muser_seq_prefill(q, prompt, np, lg, &err), &err);
    for (uint32_t i = 0; i < np; i++) muser_sampler_accept(s, prompt[i]);
    o->n = 0;
    for (uint32_t g = 0; g < GEN; g++) {
        const int32_t t = muser_sampler_sample(s, lg, &o->lp[o->n], NULL);
        o->ids[o->n++] = t;
        if (g + 1 == GEN) break;
        CHECK_OK(muser_seq_decode(q, t, lg, NULL, &err), &err);
        muser_sampler_accept(s, t);
    }
    o->pos = muser_seq_pos(q);
    CHECK_OK(muser_seq_kv_sha256(q, o->kv, &err), &err);
    muser_sampler_free(s);
    free(lg);
    muser_engine_close(q);
}

static void speculate(muser_engine *e, muser_drafter *d, uint32_t k, const int32_t *prompt, uint32_t np, float temp,
                      uint64_t seed, out *o)
{
    muser_error err = {0};
    muser_seq *q = NULL;
    CHECK_OK(muser_engine_open(e, 0, &q, &err), &err);
    const uint32_t V = muser_seq_model(q)->hp.n_vocab;
    float *lg = malloc(V * sizeof(float));
    muser_sampler *s = sampler(V, temp, seed);
    CHECK_OK(muser_spec_prefill(q, d, prompt, np, lg, &err), &err);
    for (uint32_t i = 0; i < np; i++) muser_sampler_accept(s, prompt[i]);
    muser_spec sp;
    CHECK_OK(muser_spec_init(&sp, q, 512, s, d, k, prompt, np, lg, &err), &err);
    muser_spec_adaptive(&sp, g_adaptive);
    o->n = 0;
    while (o->n < GEN) {
        uint32_t n = 0;
        bool ended = false;
        int rc = muser_spec_next(&sp, GEN - o->n, true, NULL, NULL, o->ids + o->n, g_no_lp ? NULL : o->lp + o->n, &n,
                                 &ended, &err);
        if (g_no_lp) memset(o->lp + o->n, 0, n * sizeof *o->lp);
        CHECK_OK(rc, &err);
        o->n += n;
        if (rc || ended || !n) break;
    }
    o->st = sp.st;
    muser_spec_free(&sp);
    o->pos = muser_seq_pos(q);
    CHECK_OK(muser_seq_kv_sha256(q, o->kv, &err), &err);
    muser_sampler_free(s);
    free(lg);
    muser_engine_close(q);
}

/* the same tokens, logprob bytes and cache */
static bool same_output(const out *a, const out *b)
{
    return a->n == b->n && !memcmp(a->ids, b->ids, a->n * sizeof *a->ids) &&
           !memcmp(a->lp, b->lp, a->n * sizeof *a->lp) && !strcmp(a->kv, b->kv);
}

#endif
