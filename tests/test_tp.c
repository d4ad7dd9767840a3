/* test_tp.c — tensor parallelism (src/tp.c): the split's refusals (ranks that do not divide the KV
 * heads, column pieces that are not whole blocks), two ranks of a split device meeting SPEC §4
 * against the oracle on muse, llama and qwen3 (a prompt past the sliding window, then decode steps),
 * deterministic run to run, each rank's cache holding its own heads and its LM head its vocabulary
 * rows; the split device under the engine's calls (split_api) and with the hidden-state tap
 * (split_tap); the host reduce when a rank failed before it (reduce_failures).
 *
 * `test_tp` runs CPU ranks; `test_tp cuda` (ctest tp_cuda) the same on CUDA ranks: a GPU each
 * through NCCL where the host has two, else both on one GPU reducing through the host (which still
 * checks the shards on the GPU kernels, the reduce points and the gather); a visible SKIP without a
 * GPU. MUSER_TP_MODEL=path adds a model of the caller's (the synthesized Glimmer on the device:
 * its tensor-core shards), two ranks against one rank on the same backend. */
#include <math.h>
#include <pthread.h>
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

/* The largest |Δ log-softmax| over n rows of V logits, a against b; *top_bad += rows whose top-1
 * differs. */
static double rows_lsm_diff(const float *a, const float *b, uint32_t n, uint32_t V, int *top_bad)
{
    double worst = 0;
    for (uint32_t i = 0; i < n; i++) {
        bool ok = true;
        const double d = check_lsm_diff(a + (size_t)i * V, b + (size_t)i * V, V, &ok);
        worst = d > worst ? d : worst;
        *top_bad += !ok;
    }
    return worst;
}

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

/* logits [N_TOK − N_PRE + 1][V] of positions N_PRE − 1 .. N_TOK − 1 through n ranks (a split device;
 * n = 1: a plain session): a prefill of N_PRE tokens, then one decode step a token */
static int run_group(const muser_model *m, uint32_t n, const int32_t *tok, float *out)
{
    const uint32_t V = m->hp.n_vocab;
    muser_session_opts o = cpu_opts();
    o.tp_ranks = n;
    muser_session *s = NULL;
    muser_error err = {0};
    int rc = muser_session_new(&s, m, &o, &err);
    CHECK_OK(rc, &err);
    if (rc)
        return rc;
    /* each rank's cache holds its own heads; its LM head, its vocabulary rows */
    for (uint32_t r = 0; n > 1 && r < n; r++) {
        const muser_session *rs = muser_tp_rank_session(s, r);
        CHECK(rs != NULL);
        if (!rs)
            break;
        const muser_model *sm = rs->model;
        CHECK(sm->hp.n_head_kv == m->hp.n_head_kv / n && sm->hp.n_head == m->hp.n_head / n);
        CHECK(sm->output.rows == m->hp.n_vocab / n && sm->hp.n_vocab == m->hp.n_vocab);
    }
    rc = muser_session_prefill(s, tok, N_PRE, out, &err);
    CHECK_OK(rc, &err);
    for (uint32_t i = N_PRE; !rc && i < N_TOK; i++) {
        rc = muser_step(s->dev, &s, &tok[i], 1, out + (size_t)(i - N_PRE + 1) * V, NULL, NULL, &err);
        CHECK_OK(rc, &err);
    }
    muser_session_free(s);
    return rc;
}

/* The hidden-state tap through a split (every rank runs the tapped pass, rank 0's rows come out):
 * a tapped step gives the untapped step's logits and cache (a, b: two sessions at the same point),
 * and its rows, like a tapped prefill's, are within 1e-3 of their scale of a plain session's. */
static void split_tap(const char *name, const muser_model *m, muser_device *d, muser_session *a, muser_session *b,
                      const int32_t *ta)
{
    const uint32_t V = m->hp.n_vocab, E = m->hp.n_embd, L = m->hp.n_layer;
    const uint32_t layers[2] = {0, L - 1};
    const size_t w = 2 * (size_t)E;
    float *la = malloc((size_t)V * 4), *lb = malloc((size_t)V * 4), *tp = malloc(N_PRE * w * 4), *tq = malloc(N_PRE * w * 4);
    muser_session *p = NULL;
    muser_error err = {0};
    muser_session_opts po = cpu_opts();
    CHECK_OK(muser_session_new(&p, m, &po, &err), &err);
    if (!la || !lb || !tp || !tq || !p) goto out;
    muser_session_reset(a);
    muser_session_reset(b);
    muser_tap tap = {2, layers, tp};
    CHECK_OK(muser_session_prefill_tap(a, ta, N_PRE, NULL, &tap, &err), &err);
    tap.out = tq;
    CHECK_OK(muser_session_prefill_tap(p, ta, N_PRE, NULL, &tap, &err), &err);
    CHECK_OK(muser_session_prefill(b, ta, N_PRE, NULL, &err), &err);
    double worst = 0, scale = 0;
    for (size_t i = 0; i < N_PRE * w; i++) {
        worst = fmax(worst, fabs((double)tp[i] - tq[i]));
        scale = fmax(scale, fabs((double)tq[i]));
    }
    const int32_t next = 5 % (int32_t)V;
    tap.out = tp;
    CHECK_OK(muser_step(d, &a, &next, 1, la, NULL, &tap, &err), &err);
    CHECK_OK(muser_step(d, &b, &next, 1, lb, NULL, NULL, &err), &err);
    tap.out = tq;
    CHECK_OK(muser_step(p->dev, &p, &next, 1, NULL, NULL, &tap, &err), &err);
    for (size_t i = 0; i < w; i++) {
        worst = fmax(worst, fabs((double)tp[i] - tq[i]));
        scale = fmax(scale, fabs((double)tq[i]));
    }
    CHECKF(!memcmp(la, lb, (size_t)V * 4), "%s: a tapped step of a split session changed its logits", name);
    char ha[65], hb[65];
    CHECK_OK(muser_session_kv_sha256(a, ha, &err), &err);
    CHECK_OK(muser_session_kv_sha256(b, hb, &err), &err);
    CHECKF(!strcmp(ha, hb), "%s: a tapped split session's cache differs from an untapped one's", name);
    CHECKF(scale > 0 && worst <= 1e-3 * scale, "%s: the split tap against one rank's: %.3g of %.3g", name, worst, scale);
out:
    muser_session_free(p);
    free(la);
    free(lb);
    free(tp);
    free(tq);
}

/* The split device under the calls the engine and the server make: two sessions packed in one step
 * give the bytes of each stepped alone (row invariance holds on every rank, so on the split); a
 * checkpoint and rollback, a session copy; KV rows out of one split session into another (every
 * layer, then sealed) give the same cache digest; layer 0's K/V rows (whole dot products on every
 * rank, before any reduce) are a plain session's bytes. */
static void split_api(const char *name, const muser_model *m)
{
    const uint32_t V = m->hp.n_vocab, L = m->hp.n_layer, KD = m->hp.n_head_kv * m->hp.head_dim;
    muser_session_opts o = cpu_opts();
    o.tp_ranks = 2;
    muser_device *d = NULL;
    muser_error err = {0};
    CHECK_OK(muser_device_new(&d, m, &o, &err), &err);
    if (!d)
        return;
    muser_session *a = NULL, *b = NULL, *c = NULL, *e = NULL;
    CHECK_OK(muser_session_open(&a, d, 0, &err), &err);
    CHECK_OK(muser_session_open(&b, d, 0, &err), &err);
    CHECK_OK(muser_session_open(&c, d, 0, &err), &err);
    CHECK_OK(muser_session_open(&e, d, 0, &err), &err);
    int32_t ta[N_PRE], tb[N_PRE];
    for (uint32_t i = 0; i < N_PRE; i++)
        ta[i] = (int32_t)(check_rng_u64() % V), tb[i] = (int32_t)(check_rng_u64() % V);
    float *packed = malloc(2 * (size_t)V * sizeof(float)), *alone = malloc(2 * (size_t)V * sizeof(float));
    uint16_t *k = malloc(N_TOK * (size_t)KD * 2), *v = malloc(N_TOK * (size_t)KD * 2);
    uint16_t *k1 = malloc(N_TOK * (size_t)KD * 2), *v1 = malloc(N_TOK * (size_t)KD * 2);
    if (a && b && c && e && packed && alone && k && v && k1 && v1) {
        CHECK_OK(muser_session_prefill(a, ta, N_PRE, NULL, &err), &err);
        CHECK_OK(muser_session_prefill(b, tb, N_PRE, NULL, &err), &err);
        CHECK_OK(muser_session_copy(c, a, &err), &err);
        CHECK_OK(muser_session_copy(e, b, &err), &err);
        muser_session *const ab[2] = {a, b};
        const int32_t next[2] = {7 % (int32_t)V, 11 % (int32_t)V};
        CHECK_OK(muser_step(d, ab, next, 2, packed, NULL, NULL, &err), &err);
        CHECK_OK(muser_step(d, &c, &next[0], 1, alone, NULL, NULL, &err), &err);
        CHECK_OK(muser_step(d, &e, &next[1], 1, alone + V, NULL, NULL, &err), &err);
        CHECKF(!memcmp(packed, alone, 2 * (size_t)V * sizeof(float)), "%s: a packed step of two split sessions "
               "differs from each alone", name);
        /* a verify-shaped block and its rollback leave the cache as it was */
        char before[65], after[65];
        CHECK_OK(muser_session_kv_sha256(a, before, &err), &err);
        CHECK_OK(muser_session_checkpoint(a, &err), &err);
        muser_session *const aa[3] = {a, a, a};
        const int32_t blk[3] = {1, 2, 3};
        CHECK_OK(muser_step(d, aa, blk, 3, NULL, NULL, NULL, &err), &err);
        CHECK_OK(muser_session_rollback(a, N_PRE + 1, &err), &err);
        muser_session_commit(a);
        CHECK_OK(muser_session_kv_sha256(a, after, &err), &err);
        CHECKF(!strcmp(before, after), "%s: a rolled-back block changed the split cache", name);
        /* every layer's rows out of a into the detached c, sealed: the same digest */
        muser_session_reset(c);
        for (uint32_t l = 0; l < L; l++) {
            kv_plane meta;
            kv_plane_shape(&meta, &m->hp, l, a->opts.n_ctx);
            kv_plane_meta_after(&meta, a->n_past);
            const uint64_t first = kv_plane_first_pos(&meta), n = a->n_past - first;
            CHECK_OK(muser_session_kv_rows(a, l, first, (uint32_t)n, k, v, &err), &err);
            CHECK_OK(muser_session_kv_import(c, l, a->n_past, first, (uint32_t)n, k, v, &err), &err);
        }
        CHECK_OK(muser_session_kv_seal(c, a->n_past, &err), &err);
        char moved[65];
        CHECK_OK(muser_session_kv_sha256(c, moved, &err), &err);
        CHECKF(!strcmp(before, moved), "%s: KV rows moved between split sessions change the digest", name);
        /* layer 0 against a plain session of the same tokens */
        muser_session_opts po = cpu_opts();
        muser_session *p = NULL;
        CHECK_OK(muser_session_new(&p, m, &po, &err), &err);
        if (p) {
            CHECK_OK(muser_session_prefill(p, ta, N_PRE, NULL, &err), &err);
            CHECK_OK(muser_step(p->dev, &p, &next[0], 1, NULL, NULL, NULL, &err), &err);
            kv_plane meta;
            kv_plane_shape(&meta, &m->hp, 0, a->opts.n_ctx);
            kv_plane_meta_after(&meta, a->n_past);
            const uint64_t first = kv_plane_first_pos(&meta), n = a->n_past - first;
            CHECK_OK(muser_session_kv_rows(a, 0, first, (uint32_t)n, k, v, &err), &err);
            CHECK_OK(muser_session_kv_rows(p, 0, first, (uint32_t)n, k1, v1, &err), &err);
            CHECKF(!memcmp(k, k1, n * KD * 2) && !memcmp(v, v1, n * KD * 2),
                   "%s: layer 0's K/V rows of two ranks differ from one rank's", name);
        }
        muser_session_free(p);
        split_tap(name, m, d, a, b, ta);
        printf("%-18s split device: packed step = each alone; rollback, copy, KV rows moved (same digest); "
               "layer 0's K/V = a plain session's; the tap\n", name);
    }
    free(packed);
    free(alone);
    free(k);
    free(v);
    free(k1);
    free(v1);
    muser_session_free(a);
    muser_session_free(b);
    muser_session_free(c);
    muser_session_free(e);
    muser_device_free(d);
}

/* The host reduce when a rank failed before it (passes no buffer): every rank's reduce and gather
 * return false with its buffer as it was, and the communicator serves the next call. */
typedef struct {
    muser_tp_comm *c;
    uint32_t rank;
    bool fail;
    float buf[4], full[8];
    bool ok_reduce, ok_gather;
} reduce_arg;

static void *reduce_rank(void *p)
{
    reduce_arg *a = p;
    a->ok_reduce = muser_tp_reduce(a->c, a->rank, a->fail ? NULL : a->buf, 4);
    a->ok_gather = muser_tp_gather(a->c, a->rank, a->fail ? NULL : a->buf, 2, 2, a->full);
    return NULL;
}

static void reduce_failures(void)
{
    muser_tp_comm *c = NULL;
    muser_error err = {0};
    CHECK_OK(muser_tp_comm_new(&c, 2, 4, &err), &err);
    if (!c)
        return;
    for (int round = 0; round < 2; round++) { /* a failed call, then a good one on the same comm */
        reduce_arg a[2];
        pthread_t th;
        for (uint32_t r = 0; r < 2; r++) {
            memset(&a[r], 0, sizeof a[r]);
            a[r].c = c;
            a[r].rank = r;
            a[r].fail = round == 0 && r == 1;
            for (int i = 0; i < 4; i++)
                a[r].buf[i] = (float)(10 * r + i);
        }
        CHECK(pthread_create(&th, NULL, reduce_rank, &a[1]) == 0);
        reduce_rank(&a[0]);
        pthread_join(th, NULL);
        const bool want = round == 1;
        CHECK(a[0].ok_reduce == want && a[1].ok_reduce == want && a[0].ok_gather == want && a[1].ok_gather == want);
        CHECK(a[0].buf[3] == (want ? 3.0f + 13.0f : 3.0f));
        CHECK(a[0].full[0] == (want ? a[0].buf[0] : 0.0f));
    }
    muser_tp_comm_free(c);
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
    muser_session_opts so = cpu_opts();
    so.tp_ranks = 2;
    muser_device *d = NULL;
    CHECK(muser_device_new(&d, m, &so, &err) == MUSER_E_ARG && d == NULL);
    muser_model shard;
    CHECK(muser_tp_shard(m, 1, 1, &shard, &err) == MUSER_E_ARG);
    /* a rank on a backend without the reduce is refused, not run unsplit */
    muser_session_opts o = cpu_opts();
    o.backend = MUSER_BACKEND_ORACLE;
    o.tp = (muser_tp_comm *)&shard; /* never read: refused first */
    CHECK(muser_device_new(&d, m, &o, &err) == MUSER_E_UNSUPPORTED && d == NULL);
    o.tp = NULL;
    o.tp_ranks = 2;
    CHECK(muser_device_new(&d, m, &o, &err) == MUSER_E_UNSUPPORTED && d == NULL);
    muser_model_free(m);
#ifdef MUSER_HAVE_CUDA
    /* more CUDA ranks than GPUs, unless the caller lets them share one: an error at the start */
    if (g_backend == MUSER_BACKEND_CUDA && muser_cuda_device_count() < 2) {
        muser_model *q = synth(8 /* Q8_0 */, MUSER_ARCH_MUSE);
        o = cpu_opts();
        o.tp_share_gpu = false;
        o.tp_ranks = 2;
        if (q) {
            CHECK(muser_device_new(&d, q, &o, &err) == MUSER_E_ARG && d == NULL);
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
        int top_bad = 0;
        const double worst = rows_lsm_diff(t2, t1, NR, V, &top_bad);
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
    float *ref = malloc((size_t)N_TOK * V * sizeof(float));
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
    if (!run_group(m, 1, tok, t1) && !run_group(m, 2, tok, t2) && !run_group(m, 2, tok, t2b)) {
        CHECKF(!memcmp(t2, t2b, (size_t)NR * V * sizeof(float)), "%s: two runs of two ranks differ", name);
        int top_bad = 0, top_bad1 = 0; /* (against one rank: printed, not bounded) */
        const double worst = rows_lsm_diff(t2, ref + (size_t)(N_PRE - 1) * V, NR, V, &top_bad);
        const double vs1 = rows_lsm_diff(t2, t1, NR, V, &top_bad1);
        CHECKF(worst <= 1e-3 && top_bad == 0, "%s: two ranks against the oracle: %.3g, %d top-1 mismatches", name,
               worst, top_bad);
        printf("%-18s 2 ranks: %u positions (prefill %u in chunks of 5, then steps), max |dlogsoftmax| %.3g vs "
               "the oracle, %.3g vs one rank; top-1 mismatches %d; deterministic\n",
               name, NR, (unsigned)N_PRE, worst, vs1, top_bad);
    }
    free(ref);
    free(t1);
    free(t2);
    free(t2b);
    split_api(name, m);
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
    reduce_failures();
    one_model("tiny muse q8_0", 8 /* Q8_0 */, MUSER_ARCH_MUSE);
    one_model("tiny llama f16", 1 /* F16 */, MUSER_ARCH_LLAMA);
    one_model("tiny qwen3 q8_0", 8, MUSER_ARCH_QWEN3);
    const char *path = getenv("MUSER_TP_MODEL");
    if (path && *path)
        caller_model(path);
    return check_report("test_tp");
}
