/* test_cpu_units.c — the CPU engine's pieces on their own:
 *
 * - the worker pool (src/cpu/pool.c): many jobs of varying size on 1-4 threads; every item is
 *   processed exactly once, no thread index is used by two threads at once, and no thread is
 *   still inside a job when cpu_pool_run returns (late workers must skip a finished job, not
 *   run it against the next job's arguments);
 * - the decode dots (src/cpu/kernels.c) for Q4_K / Q6_K, whose AVX2 versions read x through the
 *   lane-order copy xp (x scaled by 2^-8t): each row against the f64 dequantize-then-dot, for
 *   x of ordinary, tiny (1e-20) and large (1e20) magnitude, AVX2 and scalar tables;
 * - the batch route's panel unpack and GEMM: unpack_panel of 1..16 rows of every K-quant and
 *   plain type equals the table's dequant_row transposed, bit for bit, with the missing columns
 *   zero (K-quants take the block-column path, a K below one buffer the whole-row path); the
 *   GEMM of m = 1..20 rows (packed by pack_x into its row groups) equals the same rows run one
 *   at a time bit for bit (the m % 6 = 1, 2 tails are split 4 + 3 / 4 + 4) and is within f32
 *   rounding of an f64 reference on the unpacked rows (a wrong packing fails it). */
#include "check.h"
#include "cpu/kernels.h"
#include "cpu/pool.h"
#include "quant.h"
#include "util.h"

#include <math.h>
#include <stdatomic.h>
#include <string.h>

/* ---- pool ---- */

#define MAX_ITEMS 512
#define MAX_T 4

typedef struct pool_job {
    uint64_t id, n_items;
    atomic_uint_fast64_t next;
    atomic_int hits[MAX_ITEMS];
} pool_job;

static atomic_uint_fast64_t current_id; /* the job cpu_pool_run is running now */
static atomic_int inside;               /* threads inside a job function */
static atomic_int t_busy[MAX_T];
static atomic_int stale, index_clash;

static void job_fn(void *arg, uint32_t t, uint32_t nt)
{
    pool_job *j = arg;
    atomic_fetch_add(&inside, 1);
    if (t >= nt || atomic_exchange(&t_busy[t], 1) != 0)
        atomic_fetch_add(&index_clash, 1);
    if (j->id != atomic_load(&current_id))
        atomic_fetch_add(&stale, 1);
    uint64_t lo, hi;
    /* odd jobs hand out their items like the decode matvec (guided), even ones in fixed blocks */
    while (j->id % 2 ? cpu_pool_grab_guided(&j->next, j->n_items, 2, 2 * (uint64_t)nt, &lo, &hi)
                     : cpu_pool_grab(&j->next, j->n_items, 3, &lo, &hi))
        for (uint64_t i = lo; i < hi; i++) {
            atomic_fetch_add(&j->hits[i], 1);
            for (volatile int spin = 0; spin < 50; spin++) {
            }
        }
    if (t < MAX_T)
        atomic_store(&t_busy[t], 0);
    atomic_fetch_sub(&inside, 1);
}

static void test_pool(uint32_t n_threads, int jobs)
{
    muser_error err = {0};
    cpu_pool *p = NULL;
    CHECK_OK(cpu_pool_new(&p, n_threads, &err), &err);
    if (!p)
        return;
    CHECK(cpu_pool_threads(p) == n_threads);
    static pool_job j; /* reused by every job: a late worker would see the next one's id */
    int bad_items = 0, left_inside = 0;
    for (int k = 0; k < jobs; k++) {
        j.id = (uint64_t)k + 1;
        j.n_items = 1 + (uint64_t)(k * 37) % MAX_ITEMS;
        atomic_init(&j.next, 0);
        for (uint64_t i = 0; i < MAX_ITEMS; i++)
            atomic_init(&j.hits[i], 0);
        atomic_store(&current_id, j.id);
        cpu_pool_run(p, job_fn, &j);
        left_inside += atomic_load(&inside) != 0;
        atomic_store(&current_id, 0);
        for (uint64_t i = 0; i < MAX_ITEMS; i++)
            bad_items += atomic_load(&j.hits[i]) != (i < j.n_items ? 1 : 0);
    }
    CHECKF(bad_items == 0, "%u threads: %d items not processed exactly once", n_threads, bad_items);
    CHECKF(left_inside == 0, "%u threads: a thread was inside a job after it returned (%d)",
           n_threads, left_inside);
    CHECKF(atomic_load(&stale) == 0, "%u threads: a job ran with another job's arguments",
           n_threads);
    CHECKF(atomic_load(&index_clash) == 0, "%u threads: a thread index was used twice", n_threads);
    cpu_pool_free(p);
}

/* cpu_pool_grab_guided on one thread: consecutive blocks tiling [0, total), each 1/share of
 * what is left but at least min_block (only the last may be shorter), never growing. */
static void test_grab_guided(void)
{
    const uint64_t totals[5] = {1, 7, 8, 100, 11264};
    int bad = 0;
    for (int k = 0; k < 5; k++)
        for (uint64_t share = 1; share <= 4; share++) {
            atomic_uint_fast64_t next;
            atomic_init(&next, 0);
            uint64_t lo, hi, end = 0, prev = UINT64_MAX;
            while (cpu_pool_grab_guided(&next, totals[k], 8, share, &lo, &hi)) {
                const uint64_t n = hi - lo, left = totals[k] - lo;
                const uint64_t want = left / share < 8 ? 8 : left / share;
                bad += lo != end || n == 0 || n > prev || n != (want < left ? want : left);
                end = hi;
                prev = n;
            }
            bad += end != totals[k];
        }
    CHECKF(bad == 0, "guided grab: %d bad blocks", bad);
}

/* ---- decode dots ---- */

static uint64_t rng_state = 0x9E3779B97F4A7C15ull;
static uint32_t rnd(void)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (uint32_t)(rng_state >> 11);
}
static float frand(void)
{
    return (float)(rnd() % 2000001) / 1000000.0f - 1.0f;
}

static void test_dots(const cpu_kernels *kn, const char *name)
{
    enum { K = 1024 };
    static float x[K], w[K], xs16[K / 16], xs32[K / 32], xp[K];
    static uint8_t xd[CPU_XD_BYTES(K)];
    static uint8_t row[K / QK_K * Q6_K_BLOCK_BYTES];
    const uint32_t types[2] = {GGML_TYPE_Q4_K, GGML_TYPE_Q6_K};
    const float mags[3] = {1.0f, 1e-20f, 1e20f};
    for (int ti = 0; ti < 2; ti++)
        for (int mi = 0; mi < 3; mi++) {
            double worst = 0.0;
            for (int trial = 0; trial < 20; trial++) {
                for (int i = 0; i < K; i++) {
                    w[i] = frand() * (trial % 3 == 0 ? 4.0f : 0.05f);
                    x[i] = frand() * mags[mi];
                }
                if (trial % 5 == 1) /* one-signed rows stress the Q4_K min term */
                    for (int i = 0; i < K; i++)
                        w[i] = fabsf(w[i]);
                CHECK(quant_quantize_row(types[ti], w, row, K) == 0);
                cpu_xsums xs = {xs16, xs32, xp, xd};
                kn->xsums(x, K, &xs);
                const float got = kn->dot_row(types[ti], row, x, &xs, K);
                const double ref = quant_dot_f64(types[ti], row, x, K);
                /* |error| against the sum of |terms|: f32 accumulation of 1024 products */
                static float deq[K];
                CHECK(quant_dequantize_row(types[ti], row, deq, K) == 0);
                double mag = 0.0;
                for (int i = 0; i < K; i++)
                    mag += fabs((double)deq[i] * x[i]);
                const double rel = fabs(got - ref) / (mag > 0 ? mag : 1.0);
                worst = rel > worst ? rel : worst;
            }
            CHECKF(worst < 2e-6, "%s %s, |x| ~ %g: error %.3g of sum|w*x|", name,
                   quant_info(types[ti])->name, mags[mi], worst);
            printf("%s %-5s |x|~%-6g max error / sum|w*x| = %.2e\n", name,
                   quant_info(types[ti])->name, mags[mi], worst);
        }
}

/* ---- batch panels ---- */

static void test_panels(const cpu_kernels *kn, const char *name)
{
    enum { KMAX = 1024, ROWS = CPU_PANEL };
    static float w[KMAX], deq[ROWS][KMAX], tmp[CPU_PANEL * KMAX], panel[KMAX * CPU_PANEL];
    static uint8_t rows[ROWS * KMAX * 4];
    const uint32_t types[] = {GGML_TYPE_Q4_K, GGML_TYPE_Q6_K, GGML_TYPE_Q8_0, GGML_TYPE_F16,
                              GGML_TYPE_F32};
    const uint64_t Ks[] = {256, 512, 1024};
    int bad_unpack = 0;
    for (size_t ti = 0; ti < sizeof types / sizeof types[0]; ti++)
        for (size_t ki = 0; ki < sizeof Ks / sizeof Ks[0]; ki++) {
            const uint64_t K = Ks[ki], rb = quant_row_bytes(types[ti], K);
            for (uint32_t r = 0; r < ROWS; r++) {
                for (uint64_t i = 0; i < K; i++)
                    w[i] = frand() * (r % 3 == 0 ? 3.0f : 0.1f);
                CHECK(quant_quantize_row(types[ti], w, rows + r * rb, K) == 0);
                CHECK(kn->dequant_row(types[ti], rows + r * rb, deq[r], K) == 0);
            }
            for (uint32_t nc = 1; nc <= CPU_PANEL; nc += (nc < 3 ? 1 : 6)) {
                memset(panel, 0x7f, sizeof panel); /* garbage the unpack must overwrite */
                CHECK(kn->unpack_panel(types[ti], rows, rb, nc, K, tmp, panel) == 0);
                for (uint64_t k = 0; k < K; k++)
                    for (uint32_t r = 0; r < CPU_PANEL; r++) {
                        const float want = r < nc ? deq[r][k] : 0.0f;
                        bad_unpack += memcmp(&panel[k * CPU_PANEL + r], &want, sizeof want) != 0;
                    }
            }
        }
    CHECKF(bad_unpack == 0, "%s: %d panel values differ from dequantize + transpose", name,
           bad_unpack);

    /* GEMM: m rows at once vs one at a time (bit-identical), and vs f64 */
    enum { K = 512, M = 20, LDX = K + 8, LDC = CPU_PANEL + 3 };
    static float X[M * LDX], Xp[M * K], C[M * LDC], C1[LDC];
    for (uint64_t i = 0; i < (uint64_t)K * CPU_PANEL; i++)
        panel[i] = frand();
    for (int i = 0; i < M * LDX; i++)
        X[i] = frand();
    int bad_split = 0;
    double worst = 0.0;
    for (uint32_t m = 1; m <= M; m++)
        for (uint32_t nc = CPU_PANEL - 1; nc <= CPU_PANEL; nc++) {
            memset(C, 0, sizeof C);
            kn->pack_x(X, LDX, m, K, Xp);
            kn->gemm_panel(Xp, m, panel, K, C, LDC, nc);
            for (uint32_t i = 0; i < m; i++) {
                memset(C1, 0, sizeof C1);
                /* one row packs to itself */
                kn->gemm_panel(X + (uint64_t)i * LDX, 1, panel, K, C1, LDC, nc);
                bad_split += memcmp(C + (uint64_t)i * LDC, C1, sizeof C1) != 0;
                for (uint32_t c = 0; c < nc; c++) {
                    double ref = 0.0, mag = 0.0;
                    for (uint64_t k = 0; k < K; k++) {
                        ref += (double)X[i * LDX + k] * panel[k * CPU_PANEL + c];
                        mag += fabs((double)X[i * LDX + k] * panel[k * CPU_PANEL + c]);
                    }
                    const double e = fabs(C[(uint64_t)i * LDC + c] - ref) / mag;
                    worst = e > worst ? e : worst;
                }
            }
        }
    CHECKF(bad_split == 0, "%s: %d GEMM rows differ between m rows at once and one at a time",
           name, bad_split);
    CHECKF(worst < 1e-5, "%s: GEMM error %.3g of sum|x*w|", name, worst);
    printf("%s panels: unpack exact, GEMM m=1..%d split-exact, max error / sum|x*w| = %.2e\n", name,
           M, worst);
}

/* Non-finite inputs must stay non-finite through the vector exp (gate, softmax), so the engine
 * fails closed on them like the oracle instead of turning a NaN gate into a factor of ~1. */
static void test_nan_propagates(const cpu_kernels *kn, const char *name)
{
    float o[16], g[16], x[16];
    for (int i = 0; i < 16; i++) {
        o[i] = 1.0f;
        g[i] = 0.5f;
        x[i] = -1.0f;
    }
    g[3] = NAN;
    g[12] = NAN;
    kn->sigmoid_gate(o, g, 16);
    CHECKF(isnan(o[3]) && isnan(o[12]), "%s: sigmoid gate of NaN gave %g, %g", name, o[3], o[12]);
    CHECKF(fabsf(o[0] - 1.0f / (1.0f + expf(-0.5f))) < 1e-6f, "%s: sigmoid gate of 0.5 gave %g",
           name, o[0]);
    x[5] = NAN;
    const float sum = kn->exp_sum(x, 16);
    CHECKF(isnan(sum) && isnan(x[5]), "%s: exp of NaN gave %g (sum %g)", name, x[5], sum);
}

int main(void)
{
    const char *san = getenv("MUSER_SANITIZED");
    const int jobs = san && !strcmp(san, "1") ? 2000 : 20000;
    for (uint32_t nt = 1; nt <= MAX_T; nt++)
        test_pool(nt, jobs);
    test_grab_guided();

    cpu_kernels kn;
    cpu_kernels_init(&kn, false);
    test_dots(&kn, kn.simd ? "avx2  " : "scalar");
    test_panels(&kn, kn.simd ? "avx2  " : "scalar");
    test_nan_propagates(&kn, kn.simd ? "avx2" : "scalar");
    cpu_kernels_init(&kn, true);
    test_dots(&kn, "scalar");
    test_panels(&kn, "scalar");
    test_nan_propagates(&kn, "scalar");

    printf("%d checks, %d failures\n", check_count, check_failures);
    return check_failures ? 1 : 0;
}
