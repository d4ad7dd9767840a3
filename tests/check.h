/* check.h — the tiny test harness: CHECK macros that count failures and keep going, and a
 * SKIP exit code (77) that ctest shows as skipped. */
#ifndef MUSER_CHECK_H
#define MUSER_CHECK_H

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

static int check_failures;
static int check_count;

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

static inline int check_report(const char *name)
{
    printf("%s: %d checks, %d failures\n", name, check_count, check_failures);
    return check_failures ? 1 : 0;
}

#endif
