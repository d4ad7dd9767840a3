/* mma.cu — workbench for a research prototype: v7's exact-integer Q4_K matvec with the integer
 * products on tensor cores (mma.sync m16n8k32 u8 x s8 -> s32) instead of DP4A. Nothing here is
 * used by the engine; v7 (src/cuda/mvq.cuh) is run beside it, read-only, as the baseline.
 * Results, instruction counts and what to do next: bench/kernels/NOTES.md, "mma".
 *
 * Numerics are v7's: per 32-group of x a power of two s and X = rint(x/s), a 24-bit integer
 * (the same s, rounding and clamp as mvq_prep_warp). Here X is split into four signed-byte
 * digits X = e0 + 2^7·e1 + 2^14·e2 + 2^21·e3 (e0..e2 in [0,127], e3 in [-4,3]), so every digit
 * is an s8 and no offset column is needed. Σ q·X over a (row, sub-block) is exact in int32 per
 * digit, combined as lo = c0 + 128·c1, hi = c2 + 128·c3 (both exact in f32: < 2^23, or
 * multiples of 16 below 2^27), so P = 16384·f(hi) + f(lo) is one rounding; then the block's
 * d·Σ sc·s·P − dmin·Σ m·S in f32 as v7 does (S = s·ΣX over the 32-group).
 *
 * One mma: A = 16 rows × 32 k (u8), B = 32 k × 8 columns (s8), C = 16 × 8 (s32); lane (g, t)
 * holds A rows g, g+8 at k = 4t..4t+3 (a0, a1) and 16+4t.. (a2, a3), B column g at the same k,
 * C rows g, g+8 at columns 2t, 2t+1.
 *   A: a Q4_K qs byte holds sub-block 2P's position l (lo nibble) and 2P+1's (hi). A chunk is
 *   8 positions of pairs P0 = 2G (lanes t = 0,1) and P1 = 2G+1 (t = 2,3); a chunk pair (c, c')
 *   is one mma's k: c in k 0..15, c' in k 16..31. So a lane's 16-byte load (rows g, g+8 ×
 *   chunks c, c') is the A fragment as it lies, and the same four words & 0xF0F0F0F0 (the
 *   "twins", 16·hi) are a second one: 4 LOP3 per 64 weights, no register moves.
 *   B columns n = 2u + e: u = 0: lo sub of P0, 1: lo sub of P1, 2: hi sub of P0, 3: hi sub of
 *   P1; e the digit (e0,e1 in one mma, e2,e3 in the next, same A). For a lo sub B is +D against
 *   the raw bytes and −D against the twins (Σ (raw − 16·hi)·D = Σ lo·D); for a hi sub 0 and +D
 *   (16·Σ hi·D; the 1/16 goes into s). So C lane (g, t) holds the two digit sums of sub-block
 *   u = t for rows g and g+8: each (row, sub-block) lives in exactly one lane, which decodes its
 *   scale and min once.
 * A 256-block per 16 rows: 2 groups G × 2 chunk pairs × (raw, twin) × 2 digit pairs = 16 mma;
 * the int32 C accumulates over a group, then each lane scales its 4 (row, sub-block) items.
 *
 * Weights, repacked at upload (mmq_repack_q4k; 144 bytes per block as in GGUF): units of
 * (16-row tile, block), 2304 bytes: qs [u = 0..3][lane][16 B] — lane (g, t)'s words for chunks
 * 2u, 2u+1, rows g, g+8 — so each of a lane's four 16-byte loads is a warp load of 512 contiguous
 * bytes; then the headers per row pair g (32 B): d_g|d_g8, dmin_g|dmin_g8, one 32-bit word of
 * four 6-bit scales (+ a min and 2 bits) per lane t, a 16-bit word of mins per lane t.
 * x, prepared per token (mmq_prep): per block 4 chunk pairs × 544 B (16 nonzero B lanes × 32 B:
 * raw and twin fragments of both digit pairs, + 32 zero bytes read by the other 16 lanes) and
 * 4 × (s_eff0, s_eff1, S0, S1) per lane t (s_eff = s, or s/16 for hi sub-blocks).
 *
 * Launch: a CTA of 8 warps; KW warps split the blocks of the same tiles (in-CTA reduction),
 * each warp works on R tiles of 16 rows. PAIR (R = 1): the CTA's warp sets alternate gate and
 * up rows of the same tile, output silu(g)·u. Programmatic dependent launch as v7.
 *   usage: kbench_mma [reps]   (exit 1 if a check fails) */
#include "cuda/matvec.cuh"
#include "mvq.cuh"
#include "cuda/mmq.cuh"

#include "kbench.cuh"

/* The kernel, its layouts, prep and launch live in src/cuda/mmq.cuh (the engine's v8). */

/* ---- workbench -------------------------------------------------------------------------------- */
/* A Q4_K matrix: n rotating copies in v7's layout and in ours, sampled raw rows for the check. */
static void make_mat(kb_qmat &m, uint32_t rows, uint32_t cols, int n_copy, uint32_t seed)
{
    kb_make_qmat(m, GGML_TYPE_Q4_K, rows, cols, n_copy, seed, mvq_repack_q4k, mmq_repack_q4k);
}

typedef void (*launch_fn)(int copy);

/* the current case, for the launch functions */
static const kb_qmat *g_m, *g_mu; /* g_mu: up (pair) */
static const uint8_t *g_xq7, *g_xqm;
static float *g_y;
static bool g_pdl = true;

static void run_v7(int copy)
{
    mv_launch L;
    memset(&L, 0, sizeof L);
    L.n_seg = 1;
    L.seg[0].a.type = MV_T_Q4_KD;
    L.seg[0].a.rows = g_m->rows;
    L.seg[0].a.cols = g_m->cols;
    L.seg[0].a.data = g_m->v7[copy];
    L.seg[0].out = g_y;
    if (g_mu) {
        L.seg[0].b = L.seg[0].a;
        L.seg[0].b.data = g_mu->v7[copy];
        L.seg[0].op = MV_OP_SILU_MUL;
        L.n_warps = mvq_seg_warps_r(g_m->rows, true, 4);
    } else {
        L.seg[0].op = MV_OP_STORE;
        L.n_warps = mvq_seg_warps(MV_T_Q4_KD, g_m->rows, false);
    }
    mvq_launch(0, L, g_xq7, g_pdl);
}
static void run_v7_nopdl(int copy)
{
    g_pdl = false;
    run_v7(copy);
    g_pdl = true;
}
template <int R, int KW, bool PF, bool PAIR = false>
static void run_mm(int copy)
{
    mmq_args A;
    memset(&A, 0, sizeof A);
    A.a = g_m->mm[copy];
    A.b = g_mu ? g_mu->mm[copy] : NULL;
    A.rows = g_m->rows;
    A.K = g_m->cols;
    A.x = g_xqm;
    A.out = g_y;
    if constexpr (PAIR) mmq_launch<1, KW, PF, true>(A);
    else mmq_launch<R, KW, PF, false>(A);
}

/* One 16-row tile, one block, x nonzero in one sub-block σ at a time: the error of the mma kernel
 * per (σ, row half) against the f64 reference. Localizes a layout mistake in one device run. */
static void diagnose(float *x, uint8_t *xq7, uint8_t *xqm)
{
    kb_qmat m;
    make_mat(m, 16, 256, 1, 77);
    g_m = &m;
    g_mu = NULL;
    printf("diagnose (16 rows x 256, x in one sub-block; rel. err of rows 0-7 | 8-15, mma R1 / v7):\n");
    const launch_fn run[2] = {run_mm<1, 8, false>, run_v7};
    const char *const name[2] = {"mma", "v7"};
    kb_diagnose(m, x, g_y, 32, "sub", false, [&] {
        mvq_prep_launch(0, x, xq7, 256);
        mmq_prep_launch(0, x, xqm, 256);
    }, run, name);
    kb_free_qmat(m);
}

struct variant {
    const char *name;
    launch_fn f;
};

int main(int argc, char **argv)
{
    const int reps = argc > 1 ? atoi(argv[1]) : 25;
    const cudaDeviceProp prop = kb_device();
    const double read_gbs = kb_read_ceiling(prop.multiProcessorCount, kb_fill_q4k);

    const variant vs[] = {
        {"v7", run_v7},
        {"v7 (no PDL)", run_v7_nopdl},
        {"mma R1 KW8", run_mm<1, 8, false>},
        {"mma R1 KW8 pf", run_mm<1, 8, true>},
        {"mma R1 KW4", run_mm<1, 4, false>},
        {"mma R1 KW4 pf", run_mm<1, 4, true>},
        {"mma R1 KW2", run_mm<1, 2, false>},
        {"mma R2 KW8", run_mm<2, 8, false>},
    };
    const variant vp[] = { /* the gate·up pair: v7's SiLU pair segment; ours gate/up warp sets */
        {"v7", run_v7},
        {"v7 (no PDL)", run_v7_nopdl},
        {"mma pair KW4", run_mm<1, 4, false, true>},
        {"mma pair KW4 pf", run_mm<1, 4, true, true>},
        {"mma pair KW2", run_mm<1, 2, false, true>},
        {"mma pair KW2 pf", run_mm<1, 2, true, true>},
    };

    float *x;
    uint8_t *xq7, *xqm;
    CK(cudaMalloc(&x, 20224 * 4));
    CK(cudaMalloc(&xq7, mvq_x_bytes(20224)));
    CK(cudaMalloc(&xqm, mmq_x_bytes(20224)));
    CK(cudaMalloc(&g_y, 202048 * 4));
    g_xq7 = xq7;
    g_xqm = xqm;
    std::vector<float> hx(20224), hy(202048);

    diagnose(x, xq7, xqm);

    /* {cols, rows, pair} */
    const uint32_t shapes[][3] = {{6656, 4096, 0}, {4096, 6656, 0}, {6656, 19968, 0}, {19968, 6656, 0}, {6656, 202048, 0}, {6656, 19968, 1}};
    int fails = 0;
    printf("\n%-22s %10s | %-16s %8s %7s %6s %9s\n", "shape (cols->rows)", "MB", "kernel", "us", "GB/s", "%read", "rel.err");
    for (auto &sh : shapes) {
        const uint32_t cols = sh[0], rows = sh[1];
        const bool pair = sh[2] != 0;
        kb_qmat m, mu;
        const size_t bytes = (size_t)rows * cols / 256 * 144 * (pair ? 2 : 1);
        const int n_copy = kb_n_copy(bytes, 8);
        make_mat(m, rows, cols, n_copy, 1000 + cols + rows);
        if (pair) make_mat(mu, rows, cols, n_copy, 5000 + cols + rows);
        g_m = &m;
        g_mu = pair ? &mu : NULL;
        kb_fill_x<<<(cols + 255) / 256, 256>>>(x, cols, cols + rows);
        mvq_prep_launch(0, x, xq7, cols);
        mmq_prep_launch(0, x, xqm, cols);
        CK(cudaGetLastError());
        CK(cudaMemcpy(hx.data(), x, cols * 4, cudaMemcpyDeviceToHost));
        const std::vector<double> ref = kb_reference(m, hx.data());
        std::vector<double> refu;
        if (pair) refu = kb_reference(mu, hx.data());
        double err7 = 0;
        char label[64];
        snprintf(label, sizeof label, "%s%u->%u", pair ? "gate.up 2x " : "", cols, rows);
        const variant *V = pair ? vp : vs;
        const int NV = pair ? (int)(sizeof vp / sizeof vp[0]) : (int)(sizeof vs / sizeof vs[0]);
        for (int v = 0; v < NV; v++) {
            CK(cudaMemset(g_y, 0xFF, (size_t)rows * 4)); /* NaN poison */
            V[v].f(0);
            CK(cudaDeviceSynchronize());
            CK(cudaMemcpy(hy.data(), g_y, (size_t)rows * 4, cudaMemcpyDeviceToHost));
            const double err = kb_check(m, ref, hy, pair ? &refu : NULL).l2;
            if (v == 0) err7 = err;
            const float ms = kb_time_launches(V[v].f, n_copy, reps);
            const double gbs = bytes / (ms * 1e-3) / 1e9;
            /* ours must be finite, written, < 1e-6; report whether it is <= v7's */
            const bool ok = err >= 0 && err < 1e-6;
            if (!ok) fails++;
            printf("%-22s %10.1f | %-16s %8.1f %7.0f %5.1f%% %9.2e %s%s\n", v == 0 ? label : "", bytes / 1e6, V[v].name, ms * 1e3, gbs,
                   100 * gbs / read_gbs, err, ok ? "ok" : "BAD", v > 1 && err > err7 ? " (> v7)" : "");
        }
        kb_free_qmat(m);
        if (pair) kb_free_qmat(mu);
    }
    /* the per-token x prep of each form, timed alone */
    cudaEvent_t ea, eb;
    CK(cudaEventCreate(&ea));
    CK(cudaEventCreate(&eb));
    for (uint32_t K : {4096u, 6656u, 19968u}) {
        float m7, mm;
        kb_median_ms2(reps + 2, 2, ea, eb, [&] { mvq_prep_launch(0, x, xq7, K); }, [&] { mmq_prep_launch(0, x, xqm, K); }, &m7, &mm);
        printf("x prep K=%u: v7 mvq_prep %.1f us, mmq_prep %.1f us (one launch each, timed alone)\n", K, m7 * 1e3, mm * 1e3);
    }
    printf("\nkbench_mma: %s\n", fails ? "FAILED" : "all checks ok");
    return fails ? 1 : 0;
}
