/* pool.h — a persistent pthread worker pool for the CPU engine.
 *
 * cpu_pool_run(pool, fn, arg) calls fn(arg, t, n) once on each of the n threads (the caller is
 * thread 0) and returns when all have finished. Workers spin briefly between jobs (a decode step
 * issues a few hundred jobs, so a sleep/wake per job would cost more than the job) and then sleep
 * on a condition variable. Work splitting is the job's business: jobs usually hand out row blocks
 * through an atomic counter (cpu_pool_grab) so a slow core does not hold the others up. */
#ifndef MUSER_CPU_POOL_H
#define MUSER_CPU_POOL_H

#include "muser.h"

#include <stdatomic.h>

typedef void (*cpu_job_fn)(void *arg, uint32_t thread, uint32_t n_threads);

typedef struct cpu_pool cpu_pool;

/* n_threads >= 1 (1 = no worker threads). */
int cpu_pool_new(cpu_pool **out, uint32_t n_threads, muser_error *err);
void cpu_pool_free(cpu_pool *p);
uint32_t cpu_pool_threads(const cpu_pool *p);
void cpu_pool_run(cpu_pool *p, cpu_job_fn fn, void *arg);

/* Take the next block of `block` items from [0, total) via *next; false when none are left. */
static inline bool cpu_pool_grab(atomic_uint_fast64_t *next, uint64_t total, uint64_t block,
                                 uint64_t *lo, uint64_t *hi)
{
    const uint64_t b = atomic_fetch_add_explicit(next, block, memory_order_relaxed);
    if (b >= total)
        return false;
    *lo = b;
    *hi = b + block < total ? b + block : total;
    return true;
}

#endif
