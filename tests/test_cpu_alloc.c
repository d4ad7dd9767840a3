/* test_cpu_alloc.c — "nothing allocated per token": the CPU backend's forward path (decode and
 * batch, including a call of several passes) makes no heap allocation. The test interposes the
 * allocator (glibc's __libc_* entry points) and counts calls while forward runs; sessions are
 * created before counting starts. Under a sanitizer (which owns malloc) it is skipped. */
#include "check.h"
#include "session.h"
#include "synth.h"

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#if defined(__SANITIZE_ADDRESS__) || !defined(__GLIBC__)
int main(void)
{
    SKIP("allocator interposition needs glibc without a sanitizer");
}
#else
extern void *__libc_malloc(size_t);
extern void *__libc_calloc(size_t, size_t);
extern void *__libc_realloc(void *, size_t);
extern void *__libc_memalign(size_t, size_t);
extern void __libc_free(void *);

static atomic_int counting, allocs;

void *malloc(size_t n)
{
    if (atomic_load(&counting))
        atomic_fetch_add(&allocs, 1);
    return __libc_malloc(n);
}
void *calloc(size_t a, size_t b)
{
    if (atomic_load(&counting))
        atomic_fetch_add(&allocs, 1);
    return __libc_calloc(a, b);
}
void *realloc(void *p, size_t n)
{
    if (atomic_load(&counting))
        atomic_fetch_add(&allocs, 1);
    return __libc_realloc(p, n);
}
int posix_memalign(void **out, size_t align, size_t n)
{
    if (atomic_load(&counting))
        atomic_fetch_add(&allocs, 1);
    *out = __libc_memalign(align, n);
    return *out ? 0 : 12 /* ENOMEM */;
}
void *aligned_alloc(size_t align, size_t n)
{
    if (atomic_load(&counting))
        atomic_fetch_add(&allocs, 1);
    return __libc_memalign(align, n);
}
void free(void *p)
{
    __libc_free(p);
}

int main(void)
{
    muser_synth_opts o;
    muser_synth_opts_default(&o);
    o.seed = 3;
    muser_error err = {0};
    muser_model *m = NULL;
    if (muser_synth_write(&o, "test_cpu_alloc_tiny.gguf", NULL, &err) ||
        muser_model_load(&m, "test_cpu_alloc_tiny.gguf", &err)) {
        fprintf(stderr, "%s\n", err.msg);
        return 1;
    }
    const uint32_t V = m->hp.n_vocab;
    muser_session_opts so = {.backend = MUSER_BACKEND_CPU, .n_threads = 2, .max_batch = 8};
    muser_session *s = NULL;
    CHECK_OK(muser_session_new(&s, m, &so, &err), &err);
    float *logits = __libc_malloc((size_t)40 * V * sizeof(float));
    int32_t tok[40];
    for (int i = 0; i < 40; i++)
        tok[i] = (i * 37 + 5) % (int32_t)V;
    /* the sanity of the counter itself: an allocation while counting is seen */
    atomic_store(&counting, 1);
    void *probe = malloc(16);
    atomic_store(&counting, 0);
    free(probe);
    CHECK(atomic_load(&allocs) == 1);
    atomic_store(&allocs, 0);

    atomic_store(&counting, 1);
    CHECK_OK(muser_session_forward(s, tok, 3, logits, true, &err), &err);    /* batch, one pass */
    CHECK_OK(muser_session_forward(s, tok, 20, logits, false, &err), &err);  /* several passes */
    for (int i = 0; i < 17; i++)                                             /* decode, ring wraps */
        CHECK_OK(muser_session_forward(s, tok + i, 1, logits, false, &err), &err);
    atomic_store(&counting, 0);
    CHECKF(atomic_load(&allocs) == 0, "%d heap allocations in the forward path",
           atomic_load(&allocs));
    __libc_free(logits);
    muser_session_free(s);
    muser_model_free(m);
    return check_report("test_cpu_alloc");
}
#endif
