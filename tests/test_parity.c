/* test_parity.c — the fast CPU backend against the oracle (SPEC §4) on the tiny preset, written
 * with the synth library (8 layers, W 16; a 40-token prompt wraps every SWA ring twice).
 *
 *   decode route (one token per call) and batch route (one 40-row call, and chunks of 7 rows
 *   whose boundaries fall anywhere in the ring) each within 1e-3 of the oracle in
 *   log_softmax over the whole vocabulary at every position, with the same top-1 wherever the
 *   oracle's best two logits are more than 1e-3 apart; decode and batch prefill agree with each
 *   other to the same tolerance and carry on to the same next-token distribution;
 *   a rejected 16-row verify block rolled back leaves a cache that decodes bit-identically to
 *   one that never saw the block; a partly accepted block carries on within the contract;
 *   the same for the llama architecture. */
#include "check.h"
#include "synth_model.h"
#include "session.h"
#include "synth.h"
#include "util.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define TOL 1e-3

static uint32_t V;

/* max_i |log_softmax(a)_i - log_softmax(b)_i| in f64. */
static double max_dlsm(const float *a, const float *b)
{
    double ma = a[0], mb = b[0], sa = 0, sb = 0;
    for (uint32_t i = 1; i < V; i++) {
        ma = a[i] > ma ? a[i] : ma;
        mb = b[i] > mb ? b[i] : mb;
    }
    for (uint32_t i = 0; i < V; i++) {
        sa += exp(a[i] - ma);
        sb += exp(b[i] - mb);
    }
    const double na = ma + log(sa), nb = mb + log(sb);
    double worst = 0;
    for (uint32_t i = 0; i < V; i++) {
        double d = fabs((a[i] - na) - (b[i] - nb));
        worst = d > worst || isnan(d) ? d : worst;
    }
    return worst;
}

/* Top-1 agreement where the oracle's best two logits are more than TOL apart. */
static bool top1_ok(const float *fast, const float *oracle)
{
    uint32_t best = 0, bf = 0;
    for (uint32_t i = 1; i < V; i++) {
        best = oracle[i] > oracle[best] ? i : best;
        bf = fast[i] > fast[bf] ? i : bf;
    }
    double second = -INFINITY;
    for (uint32_t i = 0; i < V; i++)
        if (i != best && oracle[i] > second)
            second = oracle[i];
    return oracle[best] - second <= TOL || best == bf;
}

/* Every position of fast [n][V] within the contract of oracle [n][V]; returns the worst. */
static double check_rows(const char *what, const float *fast, const float *oracle, uint32_t n)
{
    double worst = 0;
    for (uint32_t p = 0; p < n; p++) {
        const double d = max_dlsm(fast + (size_t)p * V, oracle + (size_t)p * V);
        CHECKF(d <= TOL, "%s: position %u: max |dlogsoftmax| %.3e", what, p, d);
        CHECKF(top1_ok(fast + (size_t)p * V, oracle + (size_t)p * V), "%s: position %u: top-1",
               what, p);
        worst = d > worst ? d : worst;
    }
    printf("%-40s max |dlogsoftmax| %.3e over %u positions\n", what, worst, n);
    return worst;
}

static muser_session *open_session(const muser_model *m, muser_backend_kind b)
{
    muser_session_opts o = {.backend = b, .n_ctx = 128};
    muser_session *s = NULL;
    muser_error err = {0};
    CHECK_OK(muser_session_new(&s, m, &o, &err), &err);
    return s;
}

/* Feed tok[0..n) in calls of `step` rows, all logits into out [n][V]. */
static void feed(muser_session *s, const int32_t *tok, uint32_t n, uint32_t step, float *out)
{
    muser_error err = {0};
    for (uint32_t at = 0; at < n; at += step) {
        const uint32_t c = n - at < step ? n - at : step;
        CHECK_OK(muser_session_forward(s, tok + at, c, out ? out + (size_t)at * V : NULL, true,
                                       &err),
                 &err);
    }
}

static void parity_model(muser_arch arch, uint32_t n)
{
    muser_error err = {0};
    muser_model *m = check_synth_model("test_parity", arch, MUSER_SYNTH_TYPE_MIX);
    if (!m)
        return;
    V = m->hp.n_vocab;
    if (arch == MUSER_ARCH_MUSE)
        CHECKF(m->hp.swa_window < n, "the prompt (%u) must be longer than the window (%u)", n,
               m->hp.swa_window);

    int32_t *tok = malloc((n + 1) * sizeof *tok);
    uint64_t x = 12345;
    for (uint32_t i = 0; i <= n; i++) {
        x = x * 6364136223846793005ull + 1442695040888963407ull;
        tok[i] = (int32_t)((x >> 33) % V);
    }
    float *lo = malloc((size_t)(n + 1) * V * sizeof(float));
    float *ld = malloc((size_t)(n + 1) * V * sizeof(float));
    float *lb = malloc((size_t)(n + 1) * V * sizeof(float));
    float *lc = malloc((size_t)n * V * sizeof(float));
    char what[96];

    /* the oracle, one token at a time, n + 1 positions */
    muser_session *so_ = open_session(m, MUSER_BACKEND_ORACLE);
    feed(so_, tok, n + 1, 1, lo);
    muser_session_free(so_);

    /* decode route */
    muser_session *sd = open_session(m, MUSER_BACKEND_CPU);
    feed(sd, tok, n, 1, ld);
    snprintf(what, sizeof what, "%s decode vs oracle", muser_arch_name(arch));
    check_rows(what, ld, lo, n);

    /* batch route: one call of n rows, then the next token decoded on top */
    muser_session *sb = open_session(m, MUSER_BACKEND_CPU);
    feed(sb, tok, n, n, lb);
    snprintf(what, sizeof what, "%s batch(%u) vs oracle", muser_arch_name(arch), n);
    check_rows(what, lb, lo, n);
    snprintf(what, sizeof what, "%s decode vs batch prefill", muser_arch_name(arch));
    check_rows(what, ld, lb, n);
    feed(sd, tok + n, 1, 1, ld + (size_t)n * V);
    feed(sb, tok + n, 1, 1, lb + (size_t)n * V);
    snprintf(what, sizeof what, "%s next token after decode/batch", muser_arch_name(arch));
    check_rows(what, ld + (size_t)n * V, lb + (size_t)n * V, 1);
    check_rows(what, lb + (size_t)n * V, lo + (size_t)n * V, 1);
    printf("%s decode and batch prefill bit-identical: %s\n", muser_arch_name(arch),
           memcmp(ld, lb, (size_t)n * V * sizeof(float)) ? "no" : "yes");
    muser_session_free(sd);
    muser_session_free(sb);

    /* batch route in chunks of 7 rows */
    muser_session *sc = open_session(m, MUSER_BACKEND_CPU);
    feed(sc, tok, n, 7, lc);
    snprintf(what, sizeof what, "%s batch(7-row chunks) vs oracle", muser_arch_name(arch));
    check_rows(what, lc, lo, n);
    muser_session_free(sc);

    /* speculation: a rejected 16-row block rolled back is invisible, bit for bit */
    const uint32_t pre = n - 8, block = KV_MAX_SPEC_ROWS;
    int32_t draft[KV_MAX_SPEC_ROWS];
    for (uint32_t i = 0; i < block; i++)
        draft[i] = (int32_t)((tok[i] + 7) % V);
    muser_session *plain = open_session(m, MUSER_BACKEND_CPU);
    muser_session *spec = open_session(m, MUSER_BACKEND_CPU);
    feed(plain, tok, pre, pre, NULL);
    feed(spec, tok, pre, pre, NULL);
    CHECK_OK(muser_session_checkpoint(spec, &err), &err);
    feed(spec, draft, block, block, NULL);
    CHECK_OK(muser_session_rollback(spec, pre, &err), &err);
    CHECK(spec->n_past == pre);
    feed(plain, tok + pre, 8, 1, ld);
    feed(spec, tok + pre, 8, 1, lb);
    CHECKF(!memcmp(ld, lb, (size_t)8 * V * sizeof(float)),
           "%s: decoding after a rolled-back block differs from never having run it",
           muser_arch_name(arch));

    /* a partly accepted block (its first 5 rows are the true tokens) carries on within the
     * contract of the oracle */
    memcpy(draft, tok + pre, 5 * sizeof *draft);
    muser_session_reset(spec);
    CHECK(spec->n_past == 0);
    feed(spec, tok, pre, pre, NULL);
    CHECK_OK(muser_session_checkpoint(spec, &err), &err);
    feed(spec, draft, block, block, NULL);
    CHECK_OK(muser_session_rollback(spec, pre + 5, &err), &err);
    feed(spec, tok + pre + 5, n + 1 - (pre + 5), 1, lb);
    snprintf(what, sizeof what, "%s after partial accept vs oracle", muser_arch_name(arch));
    check_rows(what, lb, lo + (size_t)(pre + 5) * V, n + 1 - (pre + 5));
    muser_session_free(plain);
    muser_session_free(spec);

    free(tok);
    free(lo);
    free(ld);
    free(lb);
    free(lc);
    muser_model_free(m);
}

int main(void)
{
    const char *san = getenv("MUSER_SANITIZED");
    const uint32_t n = san && !strcmp(san, "1") ? 24 : 40; /* both longer than the window 16 */
    parity_model(MUSER_ARCH_MUSE, n);
    parity_model(MUSER_ARCH_LLAMA, n);
    return check_report("parity");
}
