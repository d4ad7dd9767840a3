/* test_fail_closed.c — SPEC §4 "fail closed", across backends: a forward call whose rows produce
 * non-finite values returns MUSER_E_NUMERIC, does not advance the session and leaves its cache as
 * it was — also for a prefill that asks for no logits at all (logits == NULL), and also when the
 * poisoned row sits in a later pass of a multi-pass call. Afterwards the session must continue
 * exactly like one that never saw the bad call (bit-identical logits). The bad call wraps the
 * 16-row SWA ring over stored rows, so rows it overwrote must come back too. The CUDA backend is
 * checked when a device is present (it runs a multi-row call row by row).
 *
 * The same holds for a step of several sessions (muser_step: on the GPU one multi-row pass, or
 * several when the rows exceed one): every session of the failed step keeps its position and its
 * cache bytes (SHA-256 against a twin that never saw the step) and goes on like the twin.
 *
 * The poison: token 5's embedding row is set to NaN in a tiny F32 model. */
#include "check.h"
#include "session.h"
#include "synth.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define NAN_TOKEN 5

static int poison_embedding_row(const char *path, int32_t token, muser_error *err)
{
    gguf_file *f = NULL;
    int rc = gguf_open(&f, path, err);
    if (rc)
        return rc;
    const gguf_tensor *t = gguf_find_tensor(f, "token_embd.weight");
    if (!t || t->type != 0) {
        gguf_close(f);
        return muser_errorf(err, MUSER_E_SHAPE, "token_embd.weight missing or not F32");
    }
    const uint64_t off = f->data_offset + t->offset + (uint64_t)token * t->ne[0] * 4;
    const uint64_t ne0 = t->ne[0];
    gguf_close(f);
    FILE *fp = fopen(path, "r+b");
    if (!fp || fseek(fp, (long)off, SEEK_SET) != 0)
        return muser_errorf(err, MUSER_E_IO, "cannot patch %s", path);
    const float nan_value = NAN;
    for (uint64_t i = 0; i < ne0; i++)
        fwrite(&nan_value, 4, 1, fp);
    fclose(fp);
    return MUSER_OK;
}

/* A step with a poisoned row fails closed for every session in it. Sessions s[0] and s[1] (and
 * their twins t[0], t[1]) hold `prefix` tokens; the step gives s[0] n_bad rows holding the NaN token
 * (past the 16-row ring: they wrap it) and s[1] n_good clean rows, or the other way round when
 * bad_last; then each session's cache must equal its twin's and the next steps the same logits. */
static void step_fails_closed(const muser_model *m, muser_backend_kind kind, uint32_t prefix, uint32_t n_bad,
                              uint32_t n_good, bool bad_last)
{
    const char *name = muser_backend_name(kind);
    const uint32_t V = m->hp.n_vocab;
    muser_session_opts o = {.backend = kind, .n_ctx = 64, .n_threads = 2};
    muser_error err = {0};
    muser_device *d = NULL;
    CHECK_OK(muser_device_new(&d, m, &o, &err), &err);
    if (!d)
        return;
    muser_session *s[2] = {0}, *t[2] = {0};
    for (int i = 0; i < 2; i++) {
        CHECK_OK(muser_session_open(&s[i], d, 0, &err), &err);
        CHECK_OK(muser_session_open(&t[i], d, 0, &err), &err);
    }
    int32_t pre[32], tok[MUSER_STEP_MAX_ROWS];
    muser_session *who[MUSER_STEP_MAX_ROWS];
    for (uint32_t i = 0; i < prefix; i++)
        pre[i] = 40 + (int32_t)(i * 7 % 50);
    for (int i = 0; i < 2 && s[i] && t[i]; i++) {
        CHECK_OK(muser_session_forward(s[i], pre, prefix, NULL, false, &err), &err);
        CHECK_OK(muser_session_forward(t[i], pre, prefix, NULL, false, &err), &err);
    }
    uint32_t n = 0;
    for (int part = 0; part < 2; part++) {
        const bool bad = (part == 0) != bad_last;
        const uint32_t k = bad ? n_bad : n_good;
        for (uint32_t j = 0; j < k; j++) {
            who[n] = s[bad ? 0 : 1];
            tok[n++] = bad && j == k / 2 ? NAN_TOKEN : 60 + (int32_t)j;
        }
    }
    float *lg = malloc((size_t)n * V * sizeof(float)), *a = malloc(sizeof(float) * V),
          *b = malloc(sizeof(float) * V);
    const int rc = muser_step(d, who, tok, n, lg, NULL, NULL, &err);
    CHECKF(rc == MUSER_E_NUMERIC, "%s: poisoned step (%u + %u rows) returned %d", name, n_bad, n_good, rc);
    for (int i = 0; i < 2; i++) {
        CHECKF(s[i]->n_past == prefix, "%s: session %d at %llu after a failed step", name, i,
               (unsigned long long)s[i]->n_past);
        char hs[65], ht[65];
        CHECK_OK(muser_session_kv_sha256(s[i], hs, &err), &err);
        CHECK_OK(muser_session_kv_sha256(t[i], ht, &err), &err);
        CHECKF(!strcmp(hs, ht), "%s: session %d's cache changed in a failed step (%u + %u rows)", name, i,
               n_bad, n_good);
        const int32_t next[3] = {61, 62, 63};
        for (int j = 0; j < 3; j++) {
            CHECK_OK(muser_step(d, &s[i], &next[j], 1, a, NULL, NULL, &err), &err);
            CHECK_OK(muser_step(d, &t[i], &next[j], 1, b, NULL, NULL, &err), &err);
            CHECKF(!memcmp(a, b, sizeof(float) * V), "%s: session %d differs from its twin after a failed step",
                   name, i);
        }
    }
    printf("%s: a step of %u poisoned + %u clean rows%s fails closed for both sessions\n", name, n_bad, n_good,
           bad_last ? " (poison last)" : "");
    free(lg);
    free(a);
    free(b);
    for (int i = 0; i < 2; i++) {
        muser_session_free(s[i]);
        muser_session_free(t[i]);
    }
    muser_device_free(d);
}

int main(void)
{
    const char *dir = getenv("MUSER_BUILD_DIR");
    char path[1024];
    snprintf(path, sizeof path, "%s/fail_closed_tiny.gguf", dir ? dir : ".");
    muser_synth_opts o;
    muser_synth_opts_default(&o);
    o.type = 0; /* F32: the NaN row reaches the forward pass exactly */
    muser_error err = {0};
    CHECK_OK(muser_synth_write(&o, path, NULL, &err), &err);
    CHECK_OK(poison_embedding_row(path, NAN_TOKEN, &err), &err);
    muser_model *m = NULL;
    CHECK_OK(muser_model_load(&m, path, &err), &err);
    if (!m)
        return check_report("fail_closed");
    const uint32_t V = m->hp.n_vocab;
    float *a = malloc(sizeof(float) * V), *b = malloc(sizeof(float) * V);
    const int32_t good[20] = {1, 2, 3, 4, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 30, 31};
    const uint32_t P = 12; /* prefix; P + 10 rows > the 16-row window: the bad call wraps the ring */
    const int32_t bad[10] = {20, 21, 22, 23, 24, NAN_TOKEN, 26, 27, 28, 29};

    const muser_backend_kind kinds[] = {MUSER_BACKEND_CPU, MUSER_BACKEND_ORACLE, MUSER_BACKEND_CUDA};
    for (int k = 0; k < 3; k++) {
        const char *name = muser_backend_name(kinds[k]);
        if (kinds[k] == MUSER_BACKEND_CUDA) {
            muser_session_opts probe = {.backend = MUSER_BACKEND_CUDA, .n_ctx = 64};
            muser_session *s = NULL;
            muser_error perr = {0};
            if (muser_session_new(&s, m, &probe, &perr) != 0) {
                printf("cuda: SKIP (%s)\n", perr.msg);
                continue;
            }
            muser_session_free(s);
        }
        /* max_batch 4: the 10-row call runs in 3 passes and the NaN row is in the second */
        muser_session_opts so = {.backend = kinds[k], .n_ctx = 64, .n_threads = 2, .max_batch = 4};
        muser_session *s1 = NULL, *s2 = NULL, *s3 = NULL;
        CHECK_OK(muser_session_new(&s1, m, &so, &err), &err);
        CHECK_OK(muser_session_new(&s2, m, &so, &err), &err);
        CHECK_OK(muser_session_new(&s3, m, &so, &err), &err);
        if (!s1 || !s2 || !s3)
            break;
        CHECK_OK(muser_session_forward(s1, good, P, NULL, false, &err), &err);
        CHECK_OK(muser_session_forward(s2, good, P, NULL, false, &err), &err);

        int rc = muser_session_forward(s1, bad, 10, a, false, &err);
        CHECKF(rc == MUSER_E_NUMERIC, "%s: poisoned call with logits returned %d", name, rc);
        CHECKF(s1->n_past == P, "%s: n_past %llu after a failed call", name,
               (unsigned long long)s1->n_past);
        CHECK_OK(muser_session_forward(s1, good + P, 8, a, false, &err), &err);
        CHECK_OK(muser_session_forward(s2, good + P, 8, b, false, &err), &err);
        CHECKF(!memcmp(a, b, sizeof(float) * V),
               "%s: after a failed call the session differs from a clean one", name);

        /* a prefill that wants no logits must fail closed too */
        rc = muser_session_forward(s3, bad, 10, NULL, false, &err);
        CHECKF(rc == MUSER_E_NUMERIC, "%s: poisoned prefill without logits returned %d", name, rc);
        CHECKF(s3->n_past == 0, "%s: n_past %llu after a failed prefill", name,
               (unsigned long long)s3->n_past);
        CHECK_OK(muser_session_forward(s3, good, P, NULL, false, &err), &err);
        CHECK_OK(muser_session_forward(s3, good + P, 8, a, false, &err), &err);
        CHECKF(!memcmp(a, b, sizeof(float) * V),
               "%s: after a failed prefill the session differs from a clean one", name);
        printf("%s: fails closed (with and without logits, multi-pass)\n", name);
        /* steps: one pass of 8 rows (a run that wraps the ring), and 20 rows (two passes on the
         * GPU, the poisoned run in the second) */
        step_fails_closed(m, kinds[k], P, 6, 2, false);
        step_fails_closed(m, kinds[k], P, 6, 14, true);
        muser_session_free(s1);
        muser_session_free(s2);
        muser_session_free(s3);
    }
    free(a);
    free(b);
    muser_model_free(m);
    remove(path);
    return check_report("fail_closed");
}
