/* mma6.cu — workbench of mmq6 (src/cuda/mmq6.cuh): the Q6_K matvec on tensor cores, beside v7's
 * Q6_K kernel (src/cuda/mvq.cuh, MV_T_Q6_KD) on the same data in the same run.
 *
 * What it does: random raw GGUF Q6_K blocks generated on the device (random ql/qh bytes and
 * int8 scales, f16 d in [0.0005, 0.0015)), repacked into both layouts; x uniform in [-1, 1);
 * each kernel's output (poisoned with NaN first) is checked against quant.c's dequantized rows
 * dotted with x in f64 on 1026 sampled rows (the soft-capped LM head against cap·tanh(scale·ref/
 * cap) in f64); every output must be finite. Errors: "max" = max |y − ref| / max |ref| over the
 * sampled rows (the checker's bar: ≤ 1e-6), "L2" = the relative L2 error as in kbench_mma. Timed
 * with CUDA events over bursts of 8 launches on rotating copies (> L2 in all), median; % of a
 * streaming read over 4 GiB measured in the same run. Also: a one-tile diagnosis (x nonzero in
 * one 16-group at a time: localizes a layout mistake in one run), bit-identical replays, a
 * non-finite x (every output must be NaN), the x preps timed alone, and a load-only probe of
 * mmq6's access pattern (its output is garbage and not checked).
 *   usage: kbench_mma6 [reps]   (exit 1 if a check fails) */
#include "cuda/matvec.cuh"
#include "mvq.cuh"
#include "cuda/mmq.cuh"
#include "cuda/mmq6.cuh"

#include "kbench.cuh"

/* A Q6_K matrix: n rotating copies in v7's planes and in mmq6's units, sampled raw rows. */
static void make_mat(kb_qmat &m, uint32_t rows, uint32_t cols, int n_copy, uint32_t seed)
{
    kb_make_qmat(m, GGML_TYPE_Q6_K, rows, cols, n_copy, seed, mvq_repack_q6k, mmq6_repack_q6k);
}

typedef void (*launch_fn)(int copy);

/* ---- the launches ------------------------------------------------------------------------------ */
static const kb_qmat *g_m;
static const uint8_t *g_xq7, *g_xq6;
static float *g_y;
static bool g_pdl = true, g_cap = false;
static cudaError_t g_err = cudaSuccess; /* the last mmq6 launch's error */
static const float g_scale = 0.196116f, g_capv = 20.f; /* Glimmer's logit scale and soft cap */

static void run_v7(int copy)
{
    mv_launch L;
    memset(&L, 0, sizeof L);
    L.n_seg = 1;
    L.seg[0].a.type = MV_T_Q6_KD;
    L.seg[0].a.rows = g_m->rows;
    L.seg[0].a.cols = g_m->cols;
    L.seg[0].a.data = g_m->v7[copy];
    L.seg[0].out = g_y;
    L.seg[0].op = g_cap ? MV_OP_SOFTCAP : MV_OP_STORE;
    L.seg[0].scale = g_scale;
    L.seg[0].cap = g_capv;
    L.n_warps = mvq_seg_warps(MV_T_Q6_KD, g_m->rows, false);
    mvq_launch(0, L, g_xq7, g_pdl);
}
static void run_v7_nopdl(int copy)
{
    g_pdl = false;
    run_v7(copy);
    g_pdl = true;
}
static mmq6_args args6(int copy)
{
    mmq6_args A;
    memset(&A, 0, sizeof A);
    A.a = g_m->mm[copy];
    A.rows = g_m->rows;
    A.K = g_m->cols;
    A.x = g_xq6;
    A.out = g_y;
    A.op = g_cap ? MV_OP_SOFTCAP : MV_OP_STORE;
    A.scale = g_scale;
    A.cap = g_capv;
    return A;
}
template <int R, int KW, int NW, bool PF>
static void run_mm(int copy)
{
    g_err = mmq6_launch<R, KW, NW, PF>(args6(copy), 0, g_pdl);
}
static void run_auto(int copy) { g_err = mmq6_launch_auto(args6(copy), 0, g_pdl); }
static void run_auto_nopdl(int copy)
{
    g_pdl = false;
    run_auto(copy);
    g_pdl = true;
}

/* Probe (not a matvec): mmq6's loads of R = 1, KW warps per tile, with the arithmetic replaced by
 * an XOR of the loaded words: what the memory side of this access pattern can do per shape. */
template <int KW>
__global__ void __launch_bounds__(256, 4) probe6(const mmq6_args A)
{
    cu_pdl_trigger();
    const uint32_t wid = threadIdx.x >> 5, lane = threadIdx.x & 31, kw = wid % KW, set = wid / KW;
    const uint32_t nb = A.K / 256, ntile = A.rows / 16;
    uint32_t tile = blockIdx.x * (8 / KW) + set;
    if (tile >= ntile) tile = ntile - 1;
    const uint8_t *unit = A.a + ((size_t)tile * nb + kw) * MMQ6_UNIT + 16 * lane;
    const mmq6_off o = mmq6_lane_off(lane);
    uint32_t acc = 0;
    cu_pdl_wait();
    for (uint32_t b = kw; b < nb; b += KW, unit += (size_t)KW * MMQ6_UNIT) {
        mmq6_w W;
        mmq6_load(unit, o, W);
        for (int u = 0; u < 6; u++) acc ^= W.q[u].x ^ W.q[u].y ^ W.q[u].z ^ W.q[u].w;
        acc ^= W.sc.x ^ W.sc.w ^ W.d;
    }
    if (acc == 0x9E3779B9u) A.out[tile * 16] = 1.f;
}
template <int KW>
static void run_probe(int copy)
{
    const mmq6_args A = args6(copy);
    cudaLaunchAttribute at[1];
    const cudaLaunchConfig_t cfg = cu_pdl_cfg(dim3((A.rows / 16 + 8 / KW - 1) / (8 / KW)), dim3(256), 0, g_pdl, at);
    cudaLaunchKernelEx(&cfg, probe6<KW>, A);
}

struct variant {
    const char *name;
    launch_fn f;
    bool probe;
};

/* One 16-row tile, one block, x nonzero in one 16-group at a time: the error of mmq6 per
 * (16-group, row half) against the f64 reference, v7 beside it. */
static void diagnose(float *x, uint8_t *xq7, uint8_t *xq6)
{
    kb_qmat m;
    make_mat(m, 16, 256, 1, 77);
    g_m = &m;
    printf("diagnose (16 rows x 256, x in one 16-group; max rel. err of rows 0-7 | 8-15, mmq6 R1 KW8 / v7):\n");
    const launch_fn run[2] = {run_mm<1, 8, 8, false>, run_v7};
    const char *const name[2] = {"mmq6", "v7"};
    kb_diagnose(m, x, g_y, 16, "grp", true, [&] {
        mvq_prep_launch(0, x, xq7, 256);
        mmq6_prep_launch(0, x, xq6, 256);
    }, run, name);
    kb_free_qmat(m);
}

int main(int argc, char **argv)
{
    const int reps = argc > 1 ? atoi(argv[1]) : 25;
    const cudaDeviceProp prop = kb_device();
    const double read_gbs = kb_read_ceiling(prop.multiProcessorCount, kb_fill_q6k);

    const variant vs[] = {
        {"v7", run_v7, false},
        {"v7 (no PDL)", run_v7_nopdl, false},
        {"mmq6 auto", run_auto, false},
        {"mmq6 auto (no PDL)", run_auto_nopdl, false},
        {"R1 KW8", run_mm<1, 8, 8, false>, false},
        {"R1 KW8 pf", run_mm<1, 8, 8, true>, false},
        {"R1 KW4 pf", run_mm<1, 4, 8, true>, false},
        {"R1 KW2", run_mm<1, 2, 8, false>, false},
        {"R1 KW2 pf", run_mm<1, 2, 8, true>, false},
        {"R2 KW8", run_mm<2, 8, 8, false>, false},
        {"R2 KW2", run_mm<2, 2, 8, false>, false},
        {"R1 KW16 NW16", run_mm<1, 16, 16, false>, false},
        {"probe KW8", run_probe<8>, true},
        {"probe KW2", run_probe<2>, true},
    };
    const int NV = (int)(sizeof vs / sizeof vs[0]);

    float *x;
    uint8_t *xq7, *xq6;
    CK(cudaMalloc(&x, 20224 * 4));
    CK(cudaMalloc(&xq7, mvq_x_bytes(20224)));
    CK(cudaMalloc(&xq6, mmq6_x_bytes(20224)));
    CK(cudaMalloc(&g_y, 202048 * 4));
    g_xq7 = xq7;
    g_xq6 = xq6;
    std::vector<float> hx(20224), hy(202048), hy2(202048);

    diagnose(x, xq7, xq6);

    /* {cols, rows, soft-capped} */
    const uint32_t shapes[][3] = {{19968, 6656, 0}, {6656, 202048, 1}, {6656, 256, 0}, {6656, 4096, 0}};
    int fails = 0;
    printf("\n%-24s %8s | %-20s %8s %7s %6s %9s %9s\n", "shape (cols->rows)", "MB", "kernel", "us", "GB/s", "%read", "max err", "L2 err");
    for (auto &sh : shapes) {
        const uint32_t cols = sh[0], rows = sh[1];
        g_cap = sh[2] != 0;
        kb_qmat m;
        const size_t bytes = (size_t)rows * cols / 256 * 210;
        const int n_copy = kb_n_copy(bytes, 128);
        make_mat(m, rows, cols, n_copy, 1000 + cols + rows);
        g_m = &m;
        kb_fill_x<<<(cols + 255) / 256, 256>>>(x, cols, cols + rows);
        mvq_prep_launch(0, x, xq7, cols);
        mmq6_prep_launch(0, x, xq6, cols);
        CK(cudaGetLastError());
        CK(cudaMemcpy(hx.data(), x, cols * 4, cudaMemcpyDeviceToHost));
        const std::vector<double> ref = kb_reference(m, hx.data());
        kb_errs e7 = {0, 0};
        char label[64];
        snprintf(label, sizeof label, "%u->%u%s", cols, rows, g_cap ? " softcap" : "");
        for (int v = 0; v < NV; v++) {
            CK(cudaMemset(g_y, 0xFF, (size_t)rows * 4)); /* NaN poison */
            g_err = cudaSuccess;
            vs[v].f(0);
            if (g_err != cudaSuccess) { /* a configuration the device refuses: report, go on */
                (void)cudaGetLastError();
                fails++;
                printf("%-24s %8.1f | %-20s launch failed: %s BAD\n", v == 0 ? label : "", bytes / 1e6, vs[v].name,
                       cudaGetErrorString(g_err));
                continue;
            }
            CK(cudaDeviceSynchronize());
            CK(cudaMemcpy(hy.data(), g_y, (size_t)rows * 4, cudaMemcpyDeviceToHost));
            const kb_errs e = kb_check(m, ref, hy, NULL, g_cap, g_scale, g_capv);
            if (v == 0) e7 = e;
            const float ms = kb_time_launches(vs[v].f, n_copy, reps);
            const double gbs = bytes / (ms * 1e-3) / 1e9;
            const bool ok = vs[v].probe || (e.max >= 0 && e.max <= 1e-6 && e.l2 <= 1e-6);
            if (!ok) fails++;
            printf("%-24s %8.1f | %-20s %8.1f %7.0f %5.1f%% ", v == 0 ? label : "", bytes / 1e6, vs[v].name, ms * 1e3, gbs,
                   100 * gbs / read_gbs);
            if (vs[v].probe) printf("%9s %9s probe\n", "-", "-");
            else printf("%9.2e %9.2e %s%s\n", e.max, e.l2, ok ? "ok" : "BAD", v > 1 && e.max > e7.max ? " (max > v7)" : "");
        }
        /* replays of the engine's choice are bit-identical */
        run_auto(0);
        CK(cudaDeviceSynchronize());
        CK(cudaMemcpy(hy.data(), g_y, (size_t)rows * 4, cudaMemcpyDeviceToHost));
        for (int k = 1; k < n_copy && k < 3; k++) run_auto(k);
        run_auto(0);
        CK(cudaDeviceSynchronize());
        CK(cudaMemcpy(hy2.data(), g_y, (size_t)rows * 4, cudaMemcpyDeviceToHost));
        const bool same = memcmp(hy.data(), hy2.data(), (size_t)rows * 4) == 0;
        if (!same) fails++;
        printf("%-24s replay of mmq6 auto: %s\n", "", same ? "bit-identical" : "DIFFERS (BAD)");
        kb_free_qmat(m);
    }

    /* fail closed: an Inf in x makes every output NaN */
    {
        kb_qmat m;
        make_mat(m, 64, 6656, 1, 4242);
        g_m = &m;
        g_cap = false;
        kb_fill_x<<<(6656 + 255) / 256, 256>>>(x, 6656, 9);
        const float inf = INFINITY;
        CK(cudaMemcpy(x + 1000, &inf, 4, cudaMemcpyHostToDevice));
        mmq6_prep_launch(0, x, xq6, 6656);
        run_auto(0);
        CK(cudaDeviceSynchronize());
        CK(cudaMemcpy(hy.data(), g_y, 64 * 4, cudaMemcpyDeviceToHost));
        int nan = 0;
        for (int i = 0; i < 64; i++) nan += isnan(hy[i]) ? 1 : 0;
        if (nan != 64) fails++;
        printf("\nInf in x: %d of 64 outputs NaN %s\n", nan, nan == 64 ? "ok" : "BAD");
        kb_free_qmat(m);
    }

    /* the per-token x prep of each form, timed alone */
    cudaEvent_t ea, eb;
    CK(cudaEventCreate(&ea));
    CK(cudaEventCreate(&eb));
    for (uint32_t K : {6656u, 19968u}) {
        float m7, m6;
        kb_median_ms2(reps + 2, 2, ea, eb, [&] { mvq_prep_launch(0, x, xq7, K); }, [&] { mmq6_prep_launch(0, x, xq6, K); }, &m7, &m6);
        printf("x prep K=%u: v7 mvq_prep %.1f us, mmq6_prep %.1f us (one launch each, timed alone)\n", K, m7 * 1e3, m6 * 1e3);
    }
    printf("\nkbench_mma6: %s\n", fails ? "FAILED" : "all checks ok");
    return fails ? 1 : 0;
}
