/* pool.h — a persistent pthread worker pool for the CPU engine.
 *
 * cpu_pool_run(pool, fn, arg) calls fn(arg, t, n) on the caller (thread 0) and on every worker
 * that picks the job up before the caller has finished its own call, and returns when those
 * have finished. A worker that is late (descheduled on a busy machine, or asleep) simply misses
 * the job: the caller never waits for a thread that has not started. So a job must be complete
 * when run by any subset of the threads that includes the caller: jobs hand out their work
 * through an atomic counter (cpu_pool_grab), and each thread index t is used by at most one
 * thread at a time (per-thread scratch stays safe). Workers spin briefly between jobs (a decode
 * step issues a few hundred jobs, so a sleep/wake per job would cost more than the job) and
 * then sleep on a condition variable. */
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

/* Guided variant: take a block of (items left) / share items, at least min_block. The first
 * grabs are large (each thread reads one long contiguous stretch) and the last ones small, so
 * threads finish within about min_block items of each other instead of one whole block. */
static inline bool cpu_pool_grab_guided(atomic_uint_fast64_t *next, uint64_t total,
                                        uint64_t min_block, uint64_t share, uint64_t *lo,
                                        uint64_t *hi)
{
    uint64_t b = atomic_load_explicit(next, memory_order_relaxed);
    for (;;) {
        if (b >= total)
            return false;
        uint64_t n = (total - b) / share;
        if (n < min_block)
            n = min_block;
        if (n > total - b)
            n = total - b;
        if (atomic_compare_exchange_weak_explicit(next, &b, b + n, memory_order_relaxed,
                                                  memory_order_relaxed)) {
            *lo = b;
            *hi = b + n;
            return true;
        }
    }
}

#endif
