/* check.h — the tiny test harness: CHECK macros that count failures and keep going, and a
 * SKIP exit code (77) that ctest shows as skipped. */
#ifndef MUSER_CHECK_H
#define MUSER_CHECK_H

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
