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
#include "cuda/mvq.cuh"
#include "cuda/mmq.cuh"
#include "cuda/mmq6.cuh"

#include <cuda_runtime.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <algorithm>
#include <vector>

extern "C" {
#include "quant.h"
}

#define CK(x)                                                                                    \
    do {                                                                                         \
        cudaError_t e_ = (x);                                                                    \
        if (e_ != cudaSuccess) {                                                                 \
            fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_));  \
            exit(1);                                                                             \
        }                                                                                        \
    } while (0)

/* ---- data ------------------------------------------------------------------------------------ */
static __device__ uint32_t hash32(uint64_t i, uint32_t seed)
{
    uint64_t z = i * 0x9E3779B97F4A7C15ull + seed * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return (uint32_t)(z ^ (z >> 31));
}
static __device__ float urand(uint64_t i, uint32_t seed) { return (float)(hash32(i, seed) >> 8) * (2.0f / 16777216.0f) - 1.0f; }

/* Raw Q6_K blocks: random ql, qh and scale bytes, a sane f16 d (as matvec.cu draws them). */
static __global__ void fill_q6k(uint8_t *p, size_t n, uint32_t seed)
{
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n / 2; i += (size_t)gridDim.x * blockDim.x) {
        uint16_t v = (uint16_t)hash32(i, seed);
        if ((2 * i) % 210 == 208) v = __half_as_ushort(__float2half(0.0005f + 0.001f * fabsf(urand(i, seed))));
        ((uint16_t *)p)[i] = v;
    }
}
static __global__ void fill_x(float *x, uint32_t n, uint32_t seed)
{
    const uint32_t i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] = urand(i, seed);
}
static __global__ void read_bw(const uint4 *p, size_t n, uint32_t *sink)
{
    uint32_t acc = 0;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        const uint4 v = __ldg(p + i);
        acc ^= v.x ^ v.y ^ v.z ^ v.w;
    }
    if (acc == 0x12345678u) sink[0] = acc;
}

/* A Q6_K matrix: n rotating copies in v7's planes and in mmq6's units, sampled raw rows. */
struct qmat {
    uint32_t rows, cols;
    size_t bytes;
    std::vector<uint8_t *> v7, mm;
    std::vector<uint8_t> host_raw;
    std::vector<uint32_t> sample;
};
static void make_mat(qmat &m, uint32_t rows, uint32_t cols, int n_copy, uint32_t seed)
{
    m.rows = rows;
    m.cols = cols;
    const uint32_t nb = cols / 256;
    const size_t rb = (size_t)nb * 210, nblk = (size_t)rows * nb;
    m.bytes = rb * rows;
    uint8_t *raw;
    CK(cudaMalloc(&raw, m.bytes));
    for (int k = 0; k < n_copy; k++) {
        fill_q6k<<<2048, 256>>>(raw, m.bytes, seed + k);
        CK(cudaGetLastError());
        if (k == 0) {
            for (uint32_t i = 0; i < 1024 && i < rows; i++) m.sample.push_back((uint32_t)(((uint64_t)i * 2654435761u) % rows));
            m.sample.push_back(0);
            m.sample.push_back(rows - 1);
            m.host_raw.resize(rb * m.sample.size());
            for (size_t i = 0; i < m.sample.size(); i++)
                CK(cudaMemcpy(m.host_raw.data() + i * rb, raw + (size_t)m.sample[i] * rb, rb, cudaMemcpyDeviceToHost));
        }
        uint8_t *d7, *dm;
        CK(cudaMalloc(&d7, m.bytes));
        CK(cudaMalloc(&dm, m.bytes));
        mvq_repack_q6k<<<(unsigned)((nblk + 255) / 256), 256>>>(raw, d7, nblk, 0, nblk);
        const size_t nt = (size_t)rows / 16 * nb * 8;
        mmq6_repack_q6k<<<(unsigned)((nt + 255) / 256), 256>>>(raw, dm, rows, nb, 0);
        CK(cudaGetLastError());
        m.v7.push_back(d7);
        m.mm.push_back(dm);
    }
    CK(cudaDeviceSynchronize());
    CK(cudaFree(raw));
}
static void free_mat(qmat &m)
{
    for (uint8_t *p : m.v7) CK(cudaFree(p));
    for (uint8_t *p : m.mm) CK(cudaFree(p));
    m.v7.clear();
    m.mm.clear();
}

/* f64 references of the sampled rows: quant.c's f32 dequantized weights × x, summed in f64. */
static std::vector<double> reference(const qmat &m, const float *hx)
{
    const size_t rb = (size_t)m.cols / 256 * 210;
    std::vector<float> w(m.cols);
    std::vector<double> ref(m.sample.size());
    for (size_t i = 0; i < m.sample.size(); i++) {
        if (quant_dequantize_row(GGML_TYPE_Q6_K, m.host_raw.data() + i * rb, w.data(), m.cols) != 0) {
            fprintf(stderr, "quant_dequantize_row failed\n");
            exit(1);
        }
        double s = 0;
        for (uint32_t c = 0; c < m.cols; c++) s += (double)w[c] * hx[c];
        ref[i] = s;
    }
    return ref;
}
struct errs {
    double max, l2; /* max: max |Δ| / max |ref|; -1 if any output is NaN/Inf or unwritten */
};
static errs check(const qmat &m, const std::vector<double> &ref, const std::vector<float> &hy, bool cap, float scale, float capv)
{
    for (uint32_t i = 0; i < m.rows; i++)
        if (!isfinite(hy[i])) return {-1, -1};
    double num = 0, den = 0, mx = 0, mr = 0;
    for (size_t i = 0; i < m.sample.size(); i++) {
        double r = ref[i];
        if (cap) r = capv * tanh(r * scale / capv);
        const double e = hy[m.sample[i]] - r;
        num += e * e;
        den += r * r;
        mx = fmax(mx, fabs(e));
        mr = fmax(mr, fabs(r));
    }
    return {mx / (mr > 0 ? mr : 1), sqrt(num / (den > 0 ? den : 1))};
}

typedef void (*launch_fn)(int copy);
static float time_it(launch_fn f, int ncopy, int reps)
{
    cudaEvent_t a, b;
    CK(cudaEventCreate(&a));
    CK(cudaEventCreate(&b));
    const int burst = 8;
    for (int i = 0; i < 2; i++) f(i % ncopy);
    std::vector<float> t;
    for (int i = 0; i < reps; i++) {
        CK(cudaEventRecord(a));
        for (int k = 0; k < burst; k++) f((i * burst + k) % ncopy);
        CK(cudaEventRecord(b));
        CK(cudaEventSynchronize(b));
        float ms;
        CK(cudaEventElapsedTime(&ms, a, b));
        t.push_back(ms / burst);
    }
    CK(cudaGetLastError());
    CK(cudaEventDestroy(a));
    CK(cudaEventDestroy(b));
    std::sort(t.begin(), t.end());
    return t[t.size() / 2];
}

/* ---- the launches ------------------------------------------------------------------------------ */
static const qmat *g_m;
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
    mvq_trigger();
    const uint32_t wid = threadIdx.x >> 5, lane = threadIdx.x & 31, kw = wid % KW, set = wid / KW;
    const uint32_t nb = A.K / 256, ntile = A.rows / 16;
    uint32_t tile = blockIdx.x * (8 / KW) + set;
    if (tile >= ntile) tile = ntile - 1;
    const uint8_t *unit = A.a + ((size_t)tile * nb + kw) * MMQ6_UNIT + 16 * lane;
    const mmq6_off o = mmq6_lane_off(lane);
    uint32_t acc = 0;
    mvq_wait();
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
    qmat m;
    make_mat(m, 16, 256, 1, 77);
    g_m = &m;
    std::vector<float> hx(256), hy(16);
    printf("diagnose (16 rows x 256, x in one 16-group; max rel. err of rows 0-7 | 8-15, mmq6 R1 KW8 / v7):\n");
    for (int grp = -1; grp < 16; grp++) {
        for (int i = 0; i < 256; i++) {
            const uint32_t h = (uint32_t)(i * 2654435761u + 12345u * (grp + 2));
            hx[i] = (grp < 0 || i / 16 == grp) ? (float)((int)(h >> 8) % 2001 - 1000) / 1000.f : 0.f;
        }
        CK(cudaMemcpy(x, hx.data(), 256 * 4, cudaMemcpyHostToDevice));
        mvq_prep_launch(0, x, xq7, 256);
        mmq6_prep_launch(0, x, xq6, 256);
        const std::vector<double> ref = reference(m, hx.data());
        printf("  grp %2d:", grp);
        for (int k = 0; k < 2; k++) {
            CK(cudaMemset(g_y, 0xFF, 16 * 4));
            if (k == 0) run_mm<1, 8, 8, false>(0);
            else run_v7(0);
            CK(cudaDeviceSynchronize());
            CK(cudaMemcpy(hy.data(), g_y, 16 * 4, cudaMemcpyDeviceToHost));
            double n[2] = {0, 0}, d[2] = {0, 0};
            for (size_t i = 0; i < m.sample.size(); i++) {
                const int hf = m.sample[i] >= 8;
                n[hf] = fmax(n[hf], fabs(hy[m.sample[i]] - ref[i]));
                d[hf] = fmax(d[hf], fabs(ref[i]));
            }
            printf("  %s %.1e | %.1e", k == 0 ? "mmq6" : "v7", n[0] / (d[0] + 1e-300), n[1] / (d[1] + 1e-300));
        }
        printf("\n");
    }
    free_mat(m);
}

int main(int argc, char **argv)
{
    const int reps = argc > 1 ? atoi(argv[1]) : 25;
    cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, 0));
    printf("device: %s, %d SMs, L2 %d MB\n", prop.name, prop.multiProcessorCount, prop.l2CacheSize >> 20);

    const size_t bw_bytes = (size_t)4 << 30;
    uint4 *big;
    uint32_t *sink;
    CK(cudaMalloc(&big, bw_bytes));
    CK(cudaMalloc(&sink, 4));
    fill_q6k<<<2048, 256>>>((uint8_t *)big, bw_bytes, 1);
    std::vector<float> tb;
    cudaEvent_t ea, eb;
    CK(cudaEventCreate(&ea));
    CK(cudaEventCreate(&eb));
    for (int i = 0; i < 12; i++) {
        CK(cudaEventRecord(ea));
        read_bw<<<prop.multiProcessorCount * 8, 512>>>(big, bw_bytes / 16, sink);
        CK(cudaEventRecord(eb));
        CK(cudaEventSynchronize(eb));
        float ms;
        CK(cudaEventElapsedTime(&ms, ea, eb));
        if (i >= 2) tb.push_back(ms);
    }
    std::sort(tb.begin(), tb.end());
    const double read_gbs = bw_bytes / (tb[tb.size() / 2] * 1e-3) / 1e9;
    printf("streaming read: %.1f GB/s (4 GiB, median of 10)\n", read_gbs);
    CK(cudaFree(big));

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
        qmat m;
        const size_t bytes = (size_t)rows * cols / 256 * 210;
        const int n_copy = (int)std::min<size_t>(128, std::max<size_t>(2, (size_t)(400u << 20) / bytes + 1));
        make_mat(m, rows, cols, n_copy, 1000 + cols + rows);
        g_m = &m;
        fill_x<<<(cols + 255) / 256, 256>>>(x, cols, cols + rows);
        mvq_prep_launch(0, x, xq7, cols);
        mmq6_prep_launch(0, x, xq6, cols);
        CK(cudaGetLastError());
        CK(cudaMemcpy(hx.data(), x, cols * 4, cudaMemcpyDeviceToHost));
        const std::vector<double> ref = reference(m, hx.data());
        errs e7 = {0, 0};
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
            const errs e = check(m, ref, hy, g_cap, g_scale, g_capv);
            if (v == 0) e7 = e;
            const float ms = time_it(vs[v].f, n_copy, reps);
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
        free_mat(m);
    }

    /* fail closed: an Inf in x makes every output NaN */
    {
        qmat m;
        make_mat(m, 64, 6656, 1, 4242);
        g_m = &m;
        g_cap = false;
        fill_x<<<(6656 + 255) / 256, 256>>>(x, 6656, 9);
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
        free_mat(m);
    }

    /* the per-token x prep of each form, timed alone */
    for (uint32_t K : {6656u, 19968u}) {
        std::vector<float> t7, t6;
        for (int it = 0; it < reps + 2; it++) {
            float ms;
            CK(cudaEventRecord(ea));
            mvq_prep_launch(0, x, xq7, K);
            CK(cudaEventRecord(eb));
            CK(cudaEventSynchronize(eb));
            CK(cudaEventElapsedTime(&ms, ea, eb));
            if (it >= 2) t7.push_back(ms);
            CK(cudaEventRecord(ea));
            mmq6_prep_launch(0, x, xq6, K);
            CK(cudaEventRecord(eb));
            CK(cudaEventSynchronize(eb));
            CK(cudaEventElapsedTime(&ms, ea, eb));
            if (it >= 2) t6.push_back(ms);
        }
        std::sort(t7.begin(), t7.end());
        std::sort(t6.begin(), t6.end());
        printf("x prep K=%u: v7 mvq_prep %.1f us, mmq6_prep %.1f us (one launch each, timed alone)\n", K, t7[t7.size() / 2] * 1e3,
               t6[t6.size() / 2] * 1e3);
    }
    printf("\nkbench_mma6: %s\n", fails ? "FAILED" : "all checks ok");
    return fails ? 1 : 0;
}
