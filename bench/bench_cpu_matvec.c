/* bench_cpu_matvec.c — does the decode matvec scale from one thread to two, and what bounds it?
 *
 * Runs the CPU engine's decode dot (cpu_kernels.dot_row) on 1 and on 2 threads at once, in
 * four settings, each reported as GB/s of weight bytes (and GFLOP/s for the FMA loop):
 *   fma:    a register-only multiply-add loop (96 independent chains, baseline ISA: its GFLOP/s
 *           is not the core's FMA peak) — do the two vCPUs have their own FP pipes, or share
 *           one physical core's (SMT siblings would halve it on two threads)?
 *   l2:     each thread dots its own 400 Q4_K rows of K 2048 (460 KB, in its L2) again and again
 *           — the kernel's compute rate without DRAM;
 *   dram:   one pass over --mb MB of Q4_K rows (K 2048), each thread a contiguous share, started
 *           together with raw pthreads — the kernel against DRAM with no pool in the way;
 *   pool:   the same rows through cpu_pool in the decode route's shape: the `small` preset's
 *           matrix groups (4608, 2048, 11264, 2048 rows) one pool job each, rows handed out
 *           like the engine (--block 0: guided, 1/(2 nt) of those left, at least 8) or in fixed
 *           blocks of --block rows; also each thread's own rate and how late the worker joins.
 * Best of --reps for each.
 *
 *   bench_cpu_matvec [--mb 512] [--reps 5] [--block 0]
 */
#include "cpu/kernels.h"
#include "cpu/pool.h"
#include "quant.h"
#include "util.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define K_COLS 2048u

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static uint64_t bench_rng = 0x9e3779b97f4a7c15ull;
static uint8_t rnd_byte(void)
{
    bench_rng = bench_rng * 6364136223846793005ull + 1442695040888963407ull;
    return (uint8_t)(bench_rng >> 56);
}

/* rows of random Q4_K with d = dmin = 2^-9 (finite, like a real layer) */
static uint8_t *make_q4k(uint64_t rows, uint64_t *row_bytes)
{
    const uint64_t rb = quant_row_bytes(GGML_TYPE_Q4_K, K_COLS);
    uint8_t *w = muser_alloc_aligned(rows * rb);
    if (!w)
        return NULL;
    const uint16_t h = muser_f32_to_f16(1.0f / 512.0f);
    for (uint64_t i = 0; i < rows * rb; i++)
        w[i] = rnd_byte();
    for (uint64_t b = 0; b < rows * rb; b += 144) {
        memcpy(w + b, &h, 2);
        memcpy(w + b + 2, &h, 2);
    }
    *row_bytes = rb;
    return w;
}

typedef struct shared_run {
    cpu_kernels kn;
    const cpu_xsums *xs;
    const float *x;
    const uint8_t *w;
    uint64_t rb, rows, reps; /* per thread: rows [t*rows, (t+1)*rows) (l2: own copy) */
    int mode;                /* 0 fma, 1 l2, 2 dram */
    atomic_int ready, go;
    double secs[2];
    float sink[2];
} shared_run;

typedef struct thr_arg {
    shared_run *s;
    int t;
} thr_arg;

static float fma_loop(uint64_t iters)
{
    float acc[12][8] = {{0}};
    const float a = 0.999999f, b = 1e-7f;
    for (uint64_t i = 0; i < iters; i++)
        for (int c = 0; c < 12; c++)
            for (int l = 0; l < 8; l++)
                acc[c][l] = acc[c][l] * a + b;
    float s = 0;
    for (int c = 0; c < 12; c++)
        for (int l = 0; l < 8; l++)
            s += acc[c][l];
    return s;
}

static void *thr_main(void *p)
{
    thr_arg *a = p;
    shared_run *s = a->s;
    atomic_fetch_add(&s->ready, 1);
    while (!atomic_load(&s->go))
        ;
    const double t0 = now_s();
    float sum = 0;
    if (s->mode == 0) {
        sum = fma_loop(s->reps);
    } else {
        const uint8_t *base = s->w + (uint64_t)a->t * s->rows * s->rb;
        for (uint64_t r = 0; r < s->reps; r++)
            for (uint64_t i = 0; i < s->rows; i++)
                sum += s->kn.dot_row(GGML_TYPE_Q4_K, base + i * s->rb, s->x, s->xs, K_COLS);
    }
    s->secs[a->t] = now_s() - t0;
    s->sink[a->t] = sum;
    return NULL;
}

/* run mode on nt (1 or 2) threads started together; returns the slowest thread's seconds */
static double run_threads(shared_run *s, int nt)
{
    pthread_t th[2];
    thr_arg args[2];
    atomic_store(&s->ready, 0);
    atomic_store(&s->go, 0);
    for (int t = 0; t < nt; t++) {
        args[t] = (thr_arg){s, t};
        pthread_create(&th[t], NULL, thr_main, &args[t]);
    }
    while (atomic_load(&s->ready) < nt)
        ;
    atomic_store(&s->go, 1);
    double worst = 0;
    for (int t = 0; t < nt; t++) {
        pthread_join(th[t], NULL);
        if (s->secs[t] > worst)
            worst = s->secs[t];
    }
    return worst;
}

typedef struct pool_mv {
    cpu_kernels *kn;
    const cpu_xsums *xs;
    const float *x;
    const uint8_t *w;
    uint64_t rb, rows, block, share; /* share 0: fixed blocks of `block` rows */
    float *dst;
    atomic_uint_fast64_t next;
    uint64_t done[2];
    double busy[2], t_start;
} pool_mv;

static void pool_mv_main(void *arg, uint32_t t, uint32_t nt)
{
    (void)nt;
    pool_mv *j = arg;
    uint64_t lo, hi;
    const double t0 = now_s();
    uint64_t done = 0;
    while (j->share ? cpu_pool_grab_guided(&j->next, j->rows, j->block, j->share, &lo, &hi)
                    : cpu_pool_grab(&j->next, j->rows, j->block, &lo, &hi))
        for (uint64_t i = lo; i < hi; i++, done++)
            j->dst[i] = j->kn->dot_row(GGML_TYPE_Q4_K, j->w + i * j->rb, j->x, j->xs, K_COLS);
    j->busy[t] = now_s() - t0;
    j->done[t] = done;
    if (t)
        j->t_start = t0 - j->t_start;
}

int main(int argc, char **argv)
{
    uint64_t mb = 512, reps = 5, block = 0;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--mb"))
            mb = strtoull(argv[i + 1], NULL, 10);
        else if (!strcmp(argv[i], "--reps"))
            reps = strtoull(argv[i + 1], NULL, 10);
        else if (!strcmp(argv[i], "--block"))
            block = strtoull(argv[i + 1], NULL, 10);
    }
    shared_run s;
    memset(&s, 0, sizeof s);
    cpu_kernels_init(&s.kn, false);
    float *x = muser_alloc_aligned(K_COLS * sizeof(float));
    cpu_xsums xs = {calloc(K_COLS / 16, sizeof(float)), calloc(K_COLS / 32, sizeof(float)),
                    muser_alloc_aligned((K_COLS + 32) * sizeof(float)), muser_alloc_aligned(CPU_XD_BYTES(K_COLS))};
    for (uint32_t i = 0; i < K_COLS; i++)
        x[i] = (float)(rnd_byte() - 128) / 128.0f;
    s.kn.xsums(x, K_COLS, &xs);
    s.x = x;
    s.xs = &xs;

    /* fma */
    s.mode = 0;
    s.reps = 200000000ull / 96;
    for (int nt = 1; nt <= 2; nt++) {
        double best = 1e9;
        for (uint64_t r = 0; r < reps; r++) {
            double t = run_threads(&s, nt);
            best = t < best ? t : best;
        }
        printf("fma  %d thr: %6.1f GFLOP/s per thread\n", nt, 2.0 * 96 * (double)s.reps / best / 1e9);
    }

    /* l2: 400 rows per thread */
    uint64_t rb;
    uint8_t *wl2 = make_q4k(800, &rb);
    s.mode = 1;
    s.w = wl2;
    s.rb = rb;
    s.rows = 400;
    s.reps = 200;
    for (int nt = 1; nt <= 2; nt++) {
        double best = 1e9;
        for (uint64_t r = 0; r < reps; r++) {
            double t = run_threads(&s, nt);
            best = t < best ? t : best;
        }
        printf("l2   %d thr: %6.2f GB/s per thread\n", nt, (double)(400 * 200) * (double)rb / best / 1e9);
    }

    /* dram: contiguous halves */
    const uint64_t rows = (mb << 20) / rb / 2 * 2;
    uint8_t *w = make_q4k(rows, &rb);
    s.w = w;
    s.mode = 2;
    s.reps = 1;
    for (int nt = 1; nt <= 2; nt++) {
        s.rows = rows / (uint64_t)nt;
        double best = 1e9;
        for (uint64_t r = 0; r < reps; r++) {
            double t = run_threads(&s, nt);
            best = t < best ? t : best;
        }
        printf("dram %d thr: %6.2f GB/s total\n", nt, (double)rows * (double)rb / best / 1e9);
    }

    /* pool: the layer's matrix groups in sequence over the whole buffer */
    static const uint64_t groups[4] = {4608, 2048, 11264, 2048};
    float *dst = muser_alloc_aligned(11264 * sizeof(float));
    for (uint32_t nt = 1; nt <= 2; nt++) {
        cpu_pool *pool;
        muser_error err;
        if (cpu_pool_new(&pool, nt, &err))
            return 1;
        double best = 1e9;
        uint64_t jobs = 0, mine[2] = {0, 0}, joined = 0;
        double busy[2] = {0, 0}, late = 0;
        for (uint64_t r = 0; r < reps; r++) {
            const double t0 = now_s();
            uint64_t off = 0;
            jobs = 0;
            for (int g = 0; off + groups[g % 4] <= rows; g++) {
                pool_mv j = {.kn = &s.kn, .xs = &xs, .x = x, .w = w + off * rb, .rb = rb,
                             .rows = groups[g % 4], .dst = dst};
                j.block = block ? block : 8;
                j.share = block ? 0 : 2 * (uint64_t)nt;
                atomic_init(&j.next, 0);
                j.t_start = now_s();
                cpu_pool_run(pool, pool_mv_main, &j);
                off += groups[g % 4];
                jobs++;
                if (nt == 2) {
                    mine[0] += j.done[0];
                    mine[1] += j.done[1];
                    busy[0] += j.busy[0];
                    busy[1] += j.busy[1];
                    if (j.done[1])
                        late += j.t_start, joined++;
                }
            }
            const double t = now_s() - t0;
            best = t < best ? t : best;
        }
        printf("pool %u thr: %6.2f GB/s total (%llu jobs, %.1f us per job)\n", nt,
               (double)rows * (double)rb / best / 1e9, (unsigned long long)jobs, best / (double)jobs * 1e6);
        if (nt == 2)
            printf("  caller %.2f GB/s, worker %.2f GB/s, worker busy %.0f%% of caller, joined %llu "
                   "jobs, %.1f us late on average\n",
                   (double)mine[0] * (double)rb / busy[0] / 1e9,
                   (double)mine[1] * (double)rb / busy[1] / 1e9, 100 * busy[1] / busy[0],
                   (unsigned long long)joined, joined ? late / (double)joined * 1e6 : 0.0);
        cpu_pool_free(pool);
    }
    printf("(sink %g)\n", (double)(s.sink[0] + s.sink[1] + dst[0]));
    return 0;
}
