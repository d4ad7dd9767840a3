/* check.h — the tiny test harness: CHECK macros that count failures and keep going (from any
 * thread: the counters are atomic), and a SKIP exit code (77) that ctest shows as skipped. */
#ifndef MUSER_CHECK_H
#define MUSER_CHECK_H

#include <math.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

static _Atomic int check_failures;
static _Atomic int check_count;

#define CHECK(cond)                                                                    \
    do {                                                                               \
        check_count++;                                                                 \
        if (!(cond)) {                                                                 \
            check_failures++;                                                          \
            fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond);   \
        }                                                                              \
    } while (0)

#define CHECKF(cond, ...)                                                              \
    do {                                                                               \
        check_count++;                                                                 \
        if (!(cond)) {                                                                 \
            check_failures++;                                                          \
            fprintf(stderr, "%s:%d: CHECK failed: %s: ", __FILE__, __LINE__, #cond);   \
            fprintf(stderr, __VA_ARGS__);                                              \
            fputc('\n', stderr);                                                       \
        }                                                                              \
    } while (0)

#define CHECK_OK(expr, errp)                                                           \
    do {                                                                               \
        check_count++;                                                                 \
        int check_rc_ = (expr);                                                        \
        if (check_rc_ != 0) {                                                          \
            check_failures++;                                                          \
            fprintf(stderr, "%s:%d: %s returned %d: %s\n", __FILE__, __LINE__, #expr,   \
                    check_rc_, (errp)->msg);                                           \
        }                                                                              \
    } while (0)

#define SKIP(...)                                                                      \
    do {                                                                               \
        printf("SKIP: ");                                                              \
        printf(__VA_ARGS__);                                                           \
        printf("\n");                                                                  \
        exit(77);                                                                      \
    } while (0)

/* xorshift64*: deterministic test data; seed with check_rng_seed. */
static uint64_t check_rng_state = 0x9e3779b97f4a7c15ull;
static inline void check_rng_seed(uint64_t s) { check_rng_state = s; }
static inline uint64_t check_rng_u64(void)
{
    check_rng_state ^= check_rng_state >> 12;
    check_rng_state ^= check_rng_state << 25;
    check_rng_state ^= check_rng_state >> 27;
    return check_rng_state * 0x2545f4914f6cdd1dull;
}
static inline float check_rng_uniform(void)
{
    return (float)((check_rng_u64() >> 40) + 0.5) / 16777216.0f;
}
static inline float check_rng_gauss(void) /* needs <math.h> */
{
    float u = check_rng_uniform(), v = check_rng_uniform();
    return sqrtf(-2.0f * logf(u)) * cosf(6.2831853f * v);
}

/* A whole file, NUL-terminated (the NUL is not counted in *n); NULL if unreadable. */
static inline char *check_read_file(const char *path, size_t *n)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    fseek(f, 0, SEEK_END);
    long sz = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *b = sz >= 0 ? malloc((size_t)sz + 1) : NULL;
    if (b && fread(b, 1, (size_t)sz, f) != (size_t)sz) {
        free(b);
        b = NULL;
    }
    fclose(f);
    if (b) {
        b[sz] = 0;
        *n = (size_t)sz;
    }
    return b;
}

/* SPEC §4 for one row against its reference: max |log_softmax(got) - log_softmax(ref)| over the V
 * logits, and *top1_ok: the same argmax, or the reference's best two within 1e-3 of each other. */
static inline double check_lsm_diff(const float *got, const float *ref, uint32_t V, bool *top1_ok)
{
    double mg = -INFINITY, mr = -INFINITY, sg = 0, sr = 0;
    for (uint32_t i = 0; i < V; i++) {
        mg = got[i] > mg ? got[i] : mg;
        mr = ref[i] > mr ? ref[i] : mr;
    }
    for (uint32_t i = 0; i < V; i++) {
        sg += exp((double)got[i] - mg);
        sr += exp((double)ref[i] - mr);
    }
    const double lg = mg + log(sg), lr = mr + log(sr);
    double worst = 0, second = -INFINITY;
    uint32_t tg = 0, tr = 0;
    for (uint32_t i = 0; i < V; i++) {
        const double d = fabs(((double)got[i] - lg) - ((double)ref[i] - lr));
        worst = d > worst ? d : worst;
        tg = got[i] > got[tg] ? i : tg;
        tr = ref[i] > ref[tr] ? i : tr;
    }
    for (uint32_t i = 0; i < V; i++)
        if (i != tr && ref[i] > second) second = ref[i];
    *top1_ok = tg == tr || (double)ref[tr] - second <= 1e-3;
    return worst;
}

static inline int check_report(const char *name)
{
    printf("%s: %d checks, %d failures\n", name, check_count, check_failures);
    return check_failures ? 1 : 0;
}

#endif
