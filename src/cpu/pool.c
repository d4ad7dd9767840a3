/* pool.c — the CPU engine's worker pool (see pool.h).
 *
 * One 64-bit word, `job`, holds the job in flight: its generation (high 32 bits), a CLOSED bit
 * and the number of workers inside fn (low bits). The caller publishes a job by storing a new
 * generation with no workers; a worker joins by incrementing the count with a CAS that fails
 * once the word's generation moved on or CLOSED is set, and leaves by decrementing it. When
 * the caller's own fn returns (the job's work counter is then exhausted) it sets CLOSED and
 * waits for the count to reach zero: it waits only for threads that are really working.
 *
 * Sleeping: a worker about to sleep increments `sleepers` under the mutex and re-checks the
 * generation before waiting; the publisher stores the generation first and then looks at
 * `sleepers` (both sequentially consistent), so one of the two always sees the other. */
#include "cpu/pool.h"

#include <pthread.h>
#include <sched.h>
#include <stdlib.h>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define CPU_RELAX() _mm_pause()
#else
#define CPU_RELAX() ((void)0)
#endif

/* Spin iterations before a worker sleeps (~100 us: longer than the gap between the jobs of one
 * decode step, short enough not to burn a shared core while the session is idle). */
#define POOL_SPIN 20000
/* Pause iterations before a waiting thread starts yielding its core: on a machine with more
 * runnable threads than cores, the thread being waited for may be descheduled, and spinning on
 * would only keep it off the core. */
#define POOL_YIELD_AFTER 2000

#define JOB_CLOSED (1ull << 31)
#define JOB_COUNT_MASK (JOB_CLOSED - 1)
#define JOB_GEN(w) ((uint32_t)((w) >> 32))

typedef struct pool_worker {
    cpu_pool *pool;
    uint32_t index;
    pthread_t thread;
} pool_worker;

struct cpu_pool {
    uint32_t n_threads;
    pool_worker *workers; /* [n_threads - 1] */
    uint32_t n_started;
    cpu_job_fn fn;
    void *arg;
    uint32_t generation;  /* the caller's count of published jobs */
    _Atomic uint64_t job; /* generation << 32 | CLOSED | workers inside fn */
    atomic_uint sleepers;
    atomic_bool stop;
    pthread_mutex_t mu;
    pthread_cond_t cv;
};

/* Join job generation gen if it is still open; false if it closed or a newer one replaced it. */
static bool pool_join(cpu_pool *pool, uint32_t gen)
{
    uint64_t w = atomic_load_explicit(&pool->job, memory_order_acquire);
    while (JOB_GEN(w) == gen && !(w & JOB_CLOSED))
        if (atomic_compare_exchange_weak_explicit(&pool->job, &w, w + 1, memory_order_acquire,
                                                  memory_order_acquire))
            return true;
    return false;
}

static void *pool_main(void *p)
{
    pool_worker *w = p;
    cpu_pool *pool = w->pool;
    uint32_t seen = 0;
    for (;;) {
        uint32_t gen;
        int spins = 0;
        while ((gen = JOB_GEN(atomic_load_explicit(&pool->job, memory_order_acquire))) == seen &&
               !atomic_load(&pool->stop)) {
            if (++spins < POOL_SPIN) {
                if (spins < POOL_YIELD_AFTER)
                    CPU_RELAX();
                else
                    sched_yield();
                continue;
            }
            pthread_mutex_lock(&pool->mu);
            atomic_fetch_add(&pool->sleepers, 1);
            while (JOB_GEN(atomic_load(&pool->job)) == seen && !atomic_load(&pool->stop))
                pthread_cond_wait(&pool->cv, &pool->mu);
            atomic_fetch_sub(&pool->sleepers, 1);
            pthread_mutex_unlock(&pool->mu);
            spins = 0;
        }
        if (atomic_load(&pool->stop))
            return NULL;
        seen = gen;
        if (!pool_join(pool, gen))
            continue; /* the caller already finished it */
        pool->fn(pool->arg, w->index, pool->n_threads);
        atomic_fetch_sub_explicit(&pool->job, 1, memory_order_release);
    }
}

int cpu_pool_new(cpu_pool **out, uint32_t n_threads, muser_error *err)
{
    *out = NULL;
    if (n_threads == 0)
        n_threads = 1;
    cpu_pool *p = calloc(1, sizeof *p);
    if (!p)
        return muser_errorf(err, MUSER_E_NOMEM, "cpu: out of memory for the thread pool");
    p->n_threads = n_threads;
    atomic_init(&p->job, 0);
    atomic_init(&p->sleepers, 0);
    atomic_init(&p->stop, false);
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->cv, NULL);
    if (n_threads > 1) {
        p->workers = calloc(n_threads - 1, sizeof *p->workers);
        if (!p->workers) {
            cpu_pool_free(p);
            return muser_errorf(err, MUSER_E_NOMEM, "cpu: out of memory for %u workers",
                                n_threads - 1);
        }
        for (uint32_t i = 0; i + 1 < n_threads; i++) {
            p->workers[i].pool = p;
            p->workers[i].index = i + 1;
            if (pthread_create(&p->workers[i].thread, NULL, pool_main, &p->workers[i])) {
                cpu_pool_free(p);
                return muser_errorf(err, MUSER_E_BACKEND, "cpu: cannot start worker thread %u",
                                    i + 1);
            }
            p->n_started++;
        }
    }
    *out = p;
    return MUSER_OK;
}

void cpu_pool_free(cpu_pool *p)
{
    if (!p)
        return;
    pthread_mutex_lock(&p->mu);
    atomic_store(&p->stop, true);
    pthread_cond_broadcast(&p->cv);
    pthread_mutex_unlock(&p->mu);
    for (uint32_t i = 0; i < p->n_started; i++)
        pthread_join(p->workers[i].thread, NULL);
    pthread_mutex_destroy(&p->mu);
    pthread_cond_destroy(&p->cv);
    free(p->workers);
    free(p);
}

uint32_t cpu_pool_threads(const cpu_pool *p)
{
    return p->n_threads;
}

void cpu_pool_run(cpu_pool *p, cpu_job_fn fn, void *arg)
{
    if (p->n_threads == 1) {
        fn(arg, 0, 1);
        return;
    }
    /* The previous job ended with no worker inside fn, so fn/arg can be replaced; the release
     * store publishes them with the new generation. */
    p->fn = fn;
    p->arg = arg;
    if (++p->generation == 0)
        p->generation = 1; /* 0 is what workers start out having seen */
    atomic_store(&p->job, (uint64_t)p->generation << 32);
    if (atomic_load(&p->sleepers) > 0) {
        pthread_mutex_lock(&p->mu);
        pthread_cond_broadcast(&p->cv);
        pthread_mutex_unlock(&p->mu);
    }
    fn(arg, 0, p->n_threads);
    atomic_fetch_or_explicit(&p->job, JOB_CLOSED, memory_order_acq_rel);
    for (int spins = 0;
         atomic_load_explicit(&p->job, memory_order_acquire) & JOB_COUNT_MASK; spins++) {
        if (spins < POOL_YIELD_AFTER)
            CPU_RELAX();
        else
            sched_yield();
    }
}
