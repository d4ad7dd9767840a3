/* test_tp.c — tensor parallelism (src/tp.c): the split's refusals (ranks that do not divide the KV
 * heads, column pieces that are not whole blocks), one rank through the group giving a plain
 * session's bytes, two ranks meeting SPEC §4 against the oracle on muse, llama and qwen3 (a prompt
 * past the sliding window, then decode steps), deterministic run to run, each rank's cache holding
 * its own heads and its LM head its vocabulary rows.
 *
 * `test_tp` runs CPU ranks; `test_tp cuda` (ctest tp_cuda) the same on CUDA ranks: a GPU each
 * through NCCL where the host has two, else both on one GPU reducing through the host (which still
 * checks the shards on the GPU kernels, the reduce points and the gather); a visible SKIP without a
 * GPU. MUSER_TP_MODEL=path adds a model of the caller's (the synthesized Glimmer on the device:
 * its tensor-core shards), two ranks against one rank on the same backend. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "gpu.h"
#include "session.h"
#include "synth_model.h"
#include "tp.h"
#ifdef MUSER_HAVE_CUDA
#include "cuda/cuda_backend.h"
#endif

#define N_TOK 40 /* > the tiny preset's window of 16: every ring wraps */
#define N_PRE 13 /* prefilled in chunks of 5 (max_batch), then decode steps */

static muser_model *synth(int type, muser_arch arch) { return check_synth_model("test_tp", arch, type); }

static muser_backend_kind g_backend = MUSER_BACKEND_CPU;

static muser_session_opts cpu_opts(void)
{
    muser_session_opts o;
    memset(&o, 0, sizeof o);
    o.backend = g_backend;
    o.n_ctx = 64;
    o.n_threads = 1;
    o.max_batch = 5;
    o.tp_share_gpu = true; /* one GPU: the ranks share it */
    return o;
}

/* logits [N_TOK − N_PRE + 1][V] of positions N_PRE − 1 .. N_TOK − 1 through n ranks: a prefill of
 * N_PRE tokens, then one decode step a token */
static int run_group(const muser_model *m, uint32_t n, const int32_t *tok, float *out)
{
    const uint32_t V = m->hp.n_vocab;
    const muser_session_opts o = cpu_opts();
    muser_tp_group *g = NULL;
    muser_error err = {0};
    int rc = muser_tp_group_new(&g, m, n, &o, &err);
    CHECK_OK(rc, &err);
    if (rc)
        return rc;
    /* each rank's cache holds its own heads; its LM head, its vocabulary rows */
    for (uint32_t r = 0; r < n; r++) {
        const muser_model *sm = muser_tp_session(g, r)->model;
        CHECK(sm->hp.n_head_kv == m->hp.n_head_kv / n && sm->hp.n_head == m->hp.n_head / n);
        CHECK(sm->output.rows == m->hp.n_vocab / n && sm->hp.n_vocab == m->hp.n_vocab);
    }
    rc = muser_tp_prefill(g, tok, N_PRE, out, &err);
    CHECK_OK(rc, &err);
    for (uint32_t i = N_PRE; !rc && i < N_TOK; i++) {
        rc = muser_tp_step(g, tok[i], out + (size_t)(i - N_PRE + 1) * V, &err);
        CHECK_OK(rc, &err);
    }
    muser_tp_group_free(g);
    return rc;
}

static void refusals(void)
{
    muser_model *m = synth(MUSER_SYNTH_TYPE_MIX, MUSER_ARCH_MUSE); /* Q4_K: blocks of 256 */
    if (!m)
        return;
    muser_error err = {0};
    CHECK(muser_tp_check(m, 1, &err) == MUSER_OK);
    CHECK(muser_tp_check(m, 0, &err) == MUSER_E_ARG);
    CHECK(muser_tp_check(m, MUSER_TP_MAX + 1, &err) == MUSER_E_ARG);
    CHECK(muser_tp_check(m, 3, &err) == MUSER_E_ARG);
    CHECKF(strstr(err.msg, "KV heads") != NULL, "3 ranks: %s", err.msg);
    /* attn_output's 256 columns in 2 pieces of 128: not whole Q4_K blocks */
    CHECK(muser_tp_check(m, 2, &err) == MUSER_E_ARG);
    CHECKF(strstr(err.msg, "blocks") != NULL, "2 ranks on Q4_K: %s", err.msg);
    muser_tp_group *g = NULL;
    CHECK(muser_tp_group_new(&g, m, 2, NULL, &err) == MUSER_E_ARG && g == NULL);
    muser_model shard;
    CHECK(muser_tp_shard(m, 1, 1, &shard, &err) == MUSER_E_ARG);
    /* a rank on a backend without the reduce is refused, not run unsplit */
    muser_session_opts o = cpu_opts();
    o.backend = MUSER_BACKEND_ORACLE;
    o.tp = (muser_tp_comm *)&shard; /* never read: refused first */
    muser_device *d = NULL;
    CHECK(muser_device_new(&d, m, &o, &err) == MUSER_E_UNSUPPORTED && d == NULL);
    CHECK(muser_tp_group_new(&g, m, 1, &o, &err) == MUSER_E_UNSUPPORTED);
    muser_model_free(m);
#ifdef MUSER_HAVE_CUDA
    /* more CUDA ranks than GPUs, unless the caller lets them share one: an error at the start */
    if (g_backend == MUSER_BACKEND_CUDA && muser_cuda_device_count() < 2) {
        muser_model *q = synth(8 /* Q8_0 */, MUSER_ARCH_MUSE);
        o = cpu_opts();
        o.tp_share_gpu = false;
        if (q) {
            CHECK(muser_tp_group_new(&g, q, 2, &o, &err) == MUSER_E_ARG && g == NULL);
            CHECKF(strstr(err.msg, "GPUs") != NULL, "2 ranks on one GPU: %s", err.msg);
        }
        muser_model_free(q);
    }
#endif
}

/* MUSER_TP_MODEL: two ranks against one on the backend, N_TOK positions (the oracle would take too
 * long on a large model): within the contract's bound of each other, the same top-1, deterministic. */
static void caller_model(const char *path)
{
    muser_model *m = NULL;
    muser_error err = {0};
    CHECK_OK(muser_model_load(&m, path, &err), &err);
    if (!m)
        return;
    if (muser_tp_check(m, 2, &err)) {
        printf("SKIP: %s does not split in 2: %s\n", path, err.msg);
        muser_model_free(m);
        return;
    }
    const uint32_t V = m->hp.n_vocab, NR = N_TOK - N_PRE + 1;
    int32_t tok[N_TOK];
    check_rng_seed(99);
    for (uint32_t i = 0; i < N_TOK; i++)
        tok[i] = (int32_t)(check_rng_u64() % V);
    float *t1 = malloc((size_t)NR * V * sizeof(float)), *t2 = malloc((size_t)NR * V * sizeof(float));
    float *t2b = malloc((size_t)NR * V * sizeof(float));
    if (t1 && t2 && t2b && !run_group(m, 1, tok, t1) && !run_group(m, 2, tok, t2) && !run_group(m, 2, tok, t2b)) {
        CHECKF(!memcmp(t2, t2b, (size_t)NR * V * sizeof(float)), "%s: two runs of two ranks differ", path);
        double worst = 0;
        int top_bad = 0;
        for (uint32_t i = 0; i < NR; i++) {
            bool ok = true;
            const double d = check_lsm_diff(t2 + (size_t)i * V, t1 + (size_t)i * V, V, &ok);
            worst = d > worst ? d : worst;
            top_bad += !ok;
        }
        CHECKF(worst <= 1e-3 && top_bad == 0, "%s: two ranks against one: %.3g, %d top-1 mismatches", path, worst,
               top_bad);
        printf("%s: 2 ranks against 1 on %s: %u positions, max |dlogsoftmax| %.3g, top-1 mismatches %d; "
               "deterministic\n", path, muser_backend_name(g_backend), NR, worst, top_bad);
    }
    free(t1);
    free(t2);
    free(t2b);
    muser_model_free(m);
}

static void one_model(const char *name, int type, muser_arch arch)
{
    muser_model *m = synth(type, arch);
    if (!m)
        return;
    const uint32_t V = m->hp.n_vocab, NR = N_TOK - N_PRE + 1;
    int32_t tok[N_TOK];
    check_rng_seed(1234 + (uint64_t)arch);
    for (uint32_t i = 0; i < N_TOK; i++)
        tok[i] = (int32_t)(check_rng_u64() % V);
    float *ref = malloc((size_t)N_TOK * V * sizeof(float)), *plain = malloc((size_t)NR * V * sizeof(float));
    float *t1 = malloc((size_t)NR * V * sizeof(float)), *t2 = malloc((size_t)NR * V * sizeof(float));
    float *t2b = malloc((size_t)NR * V * sizeof(float));
    muser_error err = {0};
    /* the oracle: every position's logits */
    muser_session_opts oo = cpu_opts();
    oo.backend = MUSER_BACKEND_ORACLE;
    muser_session *s = NULL;
    CHECK_OK(muser_session_new(&s, m, &oo, &err), &err);
    if (s)
        CHECK_OK(muser_session_forward(s, tok, N_TOK, ref, true, &err), &err);
    muser_session_free(s);
    /* one plain CPU session, the same calls as a group makes */
    const muser_session_opts co = cpu_opts();
    s = NULL;
    CHECK_OK(muser_session_new(&s, m, &co, &err), &err);
    if (s) {
        CHECK_OK(muser_session_prefill(s, tok, N_PRE, plain, &err), &err);
        for (uint32_t i = N_PRE; i < N_TOK; i++)
            CHECK_OK(muser_step(s->dev, &s, &tok[i], 1, plain + (size_t)(i - N_PRE + 1) * V, NULL, NULL, &err), &err);
    }
    muser_session_free(s);
    if (!run_group(m, 1, tok, t1) && !run_group(m, 2, tok, t2) && !run_group(m, 2, tok, t2b)) {
        CHECKF(!memcmp(t1, plain, (size_t)NR * V * sizeof(float)), "%s: one rank differs from a plain session", name);
        CHECKF(!memcmp(t2, t2b, (size_t)NR * V * sizeof(float)), "%s: two runs of two ranks differ", name);
        double worst = 0, vs1 = 0;
        int top_bad = 0;
        for (uint32_t i = 0; i < NR; i++) {
            bool ok = true, ok1 = true;
            const double d = check_lsm_diff(t2 + (size_t)i * V, ref + (size_t)(N_PRE - 1 + i) * V, V, &ok);
            const double d1 = check_lsm_diff(t2 + (size_t)i * V, t1 + (size_t)i * V, V, &ok1);
            worst = d > worst ? d : worst;
            vs1 = d1 > vs1 ? d1 : vs1;
            top_bad += !ok;
        }
        CHECKF(worst <= 1e-3 && top_bad == 0, "%s: two ranks against the oracle: %.3g, %d top-1 mismatches", name,
               worst, top_bad);
        printf("%-18s 2 ranks: %u positions (prefill %u in chunks of 5, then steps), max |dlogsoftmax| %.3g vs "
               "the oracle, %.3g vs one rank; top-1 mismatches %d; deterministic; 1 rank = a plain session\n",
               name, NR, N_PRE, worst, vs1, top_bad);
    }
    free(ref);
    free(plain);
    free(t1);
    free(t2);
    free(t2b);
    muser_model_free(m);
}

int main(int argc, char **argv)
{
    if (argc > 1 && !strcmp(argv[1], "cuda")) {
        g_backend = MUSER_BACKEND_CUDA;
        muser_model *m = synth(8, MUSER_ARCH_MUSE);
        const bool gpu = m && gpu_present(m);
        muser_model_free(m);
        if (!gpu) {
            printf("SKIP: test_tp cuda: no GPU, or built without CUDA\n");
            return 77;
        }
#ifdef MUSER_HAVE_CUDA
        printf("CUDA ranks: %s\n", muser_cuda_device_count() >= 2 ? "a GPU each, through NCCL"
                                                                   : "both on one GPU, reducing through the host");
#endif
    } else if (argc > 1) {
        fprintf(stderr, "usage: test_tp [cuda]\n");
        return 2;
    }
    refusals();
    one_model("tiny muse q8_0", 8 /* Q8_0 */, MUSER_ARCH_MUSE);
    one_model("tiny llama f16", 1 /* F16 */, MUSER_ARCH_LLAMA);
    one_model("tiny qwen3 q8_0", 8, MUSER_ARCH_QWEN3);
    const char *path = getenv("MUSER_TP_MODEL");
    if (path && *path)
        caller_model(path);
    return check_report("test_tp");
}
