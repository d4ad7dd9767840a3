/* persist.cu — workbench for a research question: how much of a decode layer's time past its
 * weight-read floor would a grid that stays resident across the layer (a persistent decode
 * kernel) win back from the per-launch route the engine runs now?
 *
 * The layer, reduced to its Q4_K matrices in their engine shapes and their order: the stack
 * (8704 x 6656), o_proj (6656 x 4096), the gate.up pair (2 x 19968 x 6656), ffn_down (6656 x 19968),
 * each after a latency-bound step that stands for the small kernels between them (attention +
 * combine, tail, prep, tail): one CTA that waits for the matrix before it, then spins LAT us on
 * %globaltimer. NL distinct layers (their weights pass L2) run back to back; the inputs are fixed
 * prepared digits (the data does not flow: the dependency is the ordering only).
 *
 *   launches   the engine's route: every matrix and step its own launch, programmatic dependents,
 *              the matrices on the engine's kernels (mmq_kernel, mmq_pair_persist), in a CUDA graph
 *   persist    one launch of 2 CTAs per SM for all NL layers; each matrix a phase over the same
 *              bodies (mmq_body, mpp_body) whose wait is a flag barrier of the previous phase
 *              (per-phase counters, release/acquire), so a CTA done with one matrix loads its first
 *              weights of the next while the rest of the grid finishes
 *   persist+pf as persist, and a CTA that reaches a phase before its barrier opens first issues an
 *              L2 bulk prefetch of the first PF KB of its own weight range of that phase
 *
 * Checks: each variant's outputs (every layer, every matrix) bit-identical to the launches'.
 * Outcome (bench/kernels/NOTES.md, "Eighth device session"): persist is 10-11 us a layer slower than
 * the launches and hides none of the latency steps; the prefetch makes it slower still.
 *   usage: kbench_persist [reps] [lat_us a,b,c,d] [pf_kb]   (exit 1 if a check fails) */
#include "cuda/matvec.cuh"
#include "mvq.cuh"
#include "cuda/mmq.cuh"
#include "mpp.cuh"

#include "kbench.cuh"

#include <functional>

#define PS_NL 4     /* distinct layers per launch */
#define PS_NPH 8    /* phases a layer: S, lat, O, lat, GU, lat, D, lat */
#define PS_CPS 2    /* CTAs per SM of the persistent grid */

struct ps_mat {
    const uint8_t *a, *b; /* b: up (the pair) */
    uint32_t rows, K;
    const uint8_t *x;
    float *out;
};
struct ps_args {
    ps_mat m[PS_NL][4]; /* S, O, GU, D */
    uint32_t lat_ns[4];
    uint32_t *cnt;      /* PS_NL * PS_NPH phase counters, zero at launch */
    uint32_t pf_bytes;  /* persist+pf: L2 prefetch per CTA and matrix phase */
    uint64_t *t_open;   /* PS_NL * PS_NPH + 1: %globaltimer when each phase's barrier opened; [last]: start */
};

__device__ __forceinline__ void ps_spin(uint32_t ns)
{
    const uint64_t t0 = kb_now();
    while (kb_now() - t0 < ns) {
    }
}

/* The barrier of phase `ph` (counter cnt[ph]) opens when all `grid` CTAs arrived. */
struct ps_wait {
    const uint32_t *c;
    uint32_t grid;
    __device__ __forceinline__ void operator()() const
    {
        if (c && threadIdx.x == 0)
            while (kb_ld_acquire(c) < grid) {
            }
        __syncthreads();
    }
};
/* the last CTA to arrive stamps t (when not NULL) */
__device__ __forceinline__ void ps_arrive(uint32_t *c, uint64_t *t)
{
    __syncthreads();
    if (threadIdx.x == 0) {
        __threadfence();
        if (atomicAdd(c, 1u) == gridDim.x - 1 && t) *t = kb_now();
    }
}
__host__ __device__ static inline size_t ps_min(size_t a, size_t b) { return a < b ? a : b; }
/* one elected thread: bulk L2 prefetch of [p, p + n) in 64 KB pieces (16-byte multiples) */
__device__ __forceinline__ void ps_prefetch(const uint8_t *p, size_t n)
{
    if (threadIdx.x != 0) return;
    for (size_t o = 0; o < n; o += 65536) {
        const uint32_t len = (uint32_t)(n - o < 65536 ? n - o : 65536) & ~15u;
        if (len) asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(p + o), "r"(len) : "memory");
    }
}

__host__ __device__ static mmq_args ps_mmq(const ps_mat &m)
{
    mmq_args A = {};
    A.a = m.a;
    A.b = m.b;
    A.rows = m.rows;
    A.K = m.K;
    A.x = m.x;
    A.out = m.out;
    return A;
}

/* the latency-bound step: one CTA waits for the previous phase, spins, and (persist) arrives */
static __global__ void ps_lat_kernel(uint32_t ns)
{
    cu_pdl_trigger();
    cu_pdl_wait();
    ps_spin(ns);
}

template <bool PF>
static __global__ void __launch_bounds__(256, PS_CPS) ps_persist(const ps_args P)
{
    extern __shared__ double ps_red[];
    const uint32_t G = gridDim.x, cta = blockIdx.x;
    const uint32_t *prev = NULL;
    if (cta == 0 && threadIdx.x == 0) P.t_open[PS_NL * PS_NPH] = kb_now();
    for (int l = 0; l < PS_NL; l++)
        for (int ph = 0; ph < PS_NPH; ph++) {
            uint32_t *mine = P.cnt + l * PS_NPH + ph;
            const ps_wait w = {prev, G};
            if (ph & 1) { /* latency step */
                if (cta == 0) {
                    w();
                    if (threadIdx.x == 0) ps_spin(P.lat_ns[ph / 2]);
                }
            } else {
                const mmq_args A = ps_mmq(P.m[l][ph / 2]);
                const uint32_t nb = A.K / 256, ntile = A.rows / 16;
                if (ph / 2 == 2) { /* the pair: whole tile ranges per CTA */
                    if (PF) {
                        const uint32_t t0 = (uint32_t)((uint64_t)cta * ntile / G), t1 = (uint32_t)((uint64_t)(cta + 1) * ntile / G);
                        const size_t n = ps_min((size_t)(t1 - t0) * nb * MMQ_UNIT, P.pf_bytes / 2);
                        ps_prefetch(A.a + (size_t)t0 * nb * MMQ_UNIT, n);
                        ps_prefetch(A.b + (size_t)t0 * nb * MMQ_UNIT, n);
                    }
                    mpp_body(A, cta, G, ps_red, w);
                } else { /* R 2 KW 8: item c is tiles 2c, 2c + 1 */
                    const uint32_t nitem = (ntile + 1) / 2;
                    if (PF && cta < nitem)
                        ps_prefetch(A.a + (size_t)2 * cta * nb * MMQ_UNIT,
                                    ps_min((size_t)(ntile - 2 * cta >= 2 ? 2 : 1) * nb * MMQ_UNIT, P.pf_bytes));
                    for (uint32_t c = cta; c < nitem; c += G) mmq_body<2, 8, false, false>(A, c, w);
                }
            }
            ps_arrive(mine, P.t_open + l * PS_NPH + ph);
            prev = mine;
        }
}

/* ---- workbench ---------------------------------------------------------------------------------- */
static int g_nsm;

static void launches(const ps_args &P, cudaStream_t st)
{
    for (int l = 0; l < PS_NL; l++)
        for (int k = 0; k < 4; k++) {
            const mmq_args A = ps_mmq(P.m[l][k]);
            if (k == 0) mmq_launch<2, 8, false, false, 3>(A, st, true); /* the engine's stack: one wave at 3 per SM */
            else if (k == 2) mmq_pair_persist_launch(A, g_nsm, st, true);
            else mmq_launch<2, 8, false, false>(A, st, true);
            cudaLaunchAttribute at[1];
            const cudaLaunchConfig_t cfg = cu_pdl_cfg(dim3(1), dim3(32), st, true, at);
            CK(cudaLaunchKernelEx(&cfg, ps_lat_kernel, P.lat_ns[k]));
        }
}
static size_t ps_smem(const ps_args &P)
{
    const uint32_t ntile = P.m[0][2].rows / 16, G = (uint32_t)(PS_CPS * g_nsm);
    return (size_t)((ntile + G - 1) / G) * 256 * sizeof(double);
}
template <bool PF>
static void persist(const ps_args &P, cudaStream_t st)
{
    CK(cudaMemsetAsync(P.cnt, 0, PS_NL * PS_NPH * 4, st));
    ps_persist<PF><<<PS_CPS * g_nsm, 256, ps_smem(P), st>>>(P);
}

int main(int argc, char **argv)
{
    const int reps = argc > 1 ? atoi(argv[1]) : 20;
    float lat_us[4] = {8.f, 3.f, 1.f, 3.f};
    if (argc > 2 && sscanf(argv[2], "%f,%f,%f,%f", &lat_us[0], &lat_us[1], &lat_us[2], &lat_us[3]) != 4) {
        fprintf(stderr, "usage: kbench_persist [reps] [lat_us a,b,c,d] [pf_kb]\n");
        return 2;
    }
    const uint32_t pf_kb = argc > 3 ? (uint32_t)atoi(argv[3]) : 64;
    const cudaDeviceProp prop = kb_device();
    g_nsm = prop.multiProcessorCount;
    const double read_gbs = kb_read_ceiling(g_nsm, kb_fill_q4k);

    /* {rows, K} of S, O, GU (each of gate, up), D */
    const uint32_t shp[4][2] = {{8704, 6656}, {6656, 4096}, {19968, 6656}, {6656, 19968}};
    ps_args P;
    memset(&P, 0, sizeof P);
    std::vector<kb_qmat> mats(PS_NL * 5);
    uint8_t *xq[3];
    const uint32_t Ks[3] = {6656, 4096, 19968};
    float *x;
    CK(cudaMalloc(&x, 19968 * 4));
    for (int i = 0; i < 3; i++) {
        CK(cudaMalloc(&xq[i], mmq_x_bytes(Ks[i])));
        kb_fill_x<<<(Ks[i] + 255) / 256, 256>>>(x, Ks[i], 77 + i);
        mmq_prep_launch(0, x, xq[i], Ks[i]);
    }
    double layer_bytes = 0;
    for (int l = 0; l < PS_NL; l++)
        for (int k = 0; k < 4; k++) {
            ps_mat &m = P.m[l][k];
            m.rows = shp[k][0];
            m.K = shp[k][1];
            kb_qmat &q = mats[l * 5 + k];
            kb_make_qmat(q, GGML_TYPE_Q4_K, m.rows, m.K, 1, 100 + l * 10 + k, NULL, mmq_repack_q4k);
            m.a = q.mm[0];
            if (k == 2) {
                kb_qmat &u = mats[l * 5 + 4];
                kb_make_qmat(u, GGML_TYPE_Q4_K, m.rows, m.K, 1, 500 + l * 10, NULL, mmq_repack_q4k);
                m.b = u.mm[0];
            }
            m.x = xq[m.K == 6656 ? 0 : m.K == 4096 ? 1 : 2];
            CK(cudaMalloc(&m.out, (size_t)m.rows * 4));
            if (l == 0) layer_bytes += (double)q.bytes * (k == 2 ? 2 : 1);
        }
    for (int k = 0; k < 4; k++) P.lat_ns[k] = (uint32_t)(lat_us[k] * 1000.f);
    P.pf_bytes = pf_kb * 1024;
    CK(cudaMalloc(&P.cnt, PS_NL * PS_NPH * 4));
    CK(cudaMalloc(&P.t_open, (PS_NL * PS_NPH + 1) * 8));
    const size_t smem = ps_smem(P);
    if (smem > 48 * 1024) {
        fprintf(stderr, "pair's reduction needs %zu B of shared memory\n", smem);
        return 1;
    }
    int occ[2];
    CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&occ[0], ps_persist<false>, 256, smem));
    CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&occ[1], ps_persist<true>, 256, smem));
    if (occ[0] < PS_CPS || occ[1] < PS_CPS) {
        fprintf(stderr, "the persistent grid does not fit: %d / %d CTAs per SM\n", occ[0], occ[1]);
        return 1;
    }
    CK(cudaDeviceSynchronize());

    cudaStream_t st;
    CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    /* the launches as a graph, as the engine replays them */
    cudaGraph_t g;
    cudaGraphExec_t ge;
    CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal));
    launches(P, st);
    CK(cudaStreamEndCapture(st, &g));
    CK(cudaGraphInstantiate(&ge, g, 0));

    auto snapshot = [&](std::vector<float> &h) {
        CK(cudaStreamSynchronize(st));
        h.clear();
        for (int l = 0; l < PS_NL; l++)
            for (int k = 0; k < 4; k++) {
                const size_t n = P.m[l][k].rows;
                const size_t o = h.size();
                h.resize(o + n);
                CK(cudaMemcpy(h.data() + o, P.m[l][k].out, n * 4, cudaMemcpyDeviceToHost));
            }
    };
    auto poison = [&]() {
        for (int l = 0; l < PS_NL; l++)
            for (int k = 0; k < 4; k++) CK(cudaMemsetAsync(P.m[l][k].out, 0xFF, (size_t)P.m[l][k].rows * 4, st));
    };
    std::vector<float> ref, got;
    poison();
    CK(cudaGraphLaunch(ge, st));
    snapshot(ref);
    bool nan = false;
    for (float v : ref) nan |= !(v == v);
    int fails = nan;

    struct var {
        const char *name;
        std::function<void()> f;
    };
    const var vars[] = {
        {"launches (graph)", [&] { CK(cudaGraphLaunch(ge, st)); }},
        {"persist", [&] { persist<false>(P, st); }},
        {"persist+pf", [&] { persist<true>(P, st); }},
    };
    printf("layer: S 8704x6656, O 6656x4096, GU 2x19968x6656, D 6656x19968 (Q4_K, %.1f MB); latency steps %.1f/%.1f/%.1f/%.1f us "
           "after S/O/GU/D; %d layers a launch; pf %u KB\n",
           layer_bytes / 1e6, lat_us[0], lat_us[1], lat_us[2], lat_us[3], PS_NL, pf_kb);
    const double floor_us = layer_bytes / (read_gbs * 1e3);
    printf("floor: %.2f us a layer (weights at the read); + latency steps serial: %.2f us\n", floor_us,
           floor_us + lat_us[0] + lat_us[1] + lat_us[2] + lat_us[3]);
    printf("%-18s | %9s %7s | %s\n", "variant", "us/layer", "%floor", "outputs = launches'");
    cudaEvent_t a, b;
    CK(cudaEventCreate(&a));
    CK(cudaEventCreate(&b));
    std::vector<std::vector<float>> t(3);
    for (int v = 0; v < 3; v++) vars[v].f(); /* warm */
    for (int r = 0; r < reps; r++) /* interleaved */
        for (int v = 0; v < 3; v++) t[v].push_back(kb_event_ms(a, b, vars[v].f, st));
    for (int v = 0; v < 3; v++) {
        poison();
        vars[v].f();
        snapshot(got);
        const bool same = got.size() == ref.size() && memcmp(got.data(), ref.data(), ref.size() * 4) == 0;
        if (!same) fails++;
        const double us = kb_median(t[v]) * 1e3 / PS_NL;
        printf("%-18s | %9.2f %6.1f%% | %s\n", vars[v].name, us, 100 * floor_us / us, same ? "bit-identical" : "DIFFERENT");
    }
    /* where a persistent layer's time goes: phase k's span = its barrier's opening - the previous
     * one's (the first phase from the kernel's start), median over reps, the layers after the first */
    for (int v = 1; v < 3; v++) {
        std::vector<std::vector<float>> span(PS_NPH);
        std::vector<uint64_t> h(PS_NL * PS_NPH + 1);
        for (int r = 0; r < reps; r++) {
            vars[v].f();
            CK(cudaStreamSynchronize(st));
            CK(cudaMemcpy(h.data(), P.t_open, h.size() * 8, cudaMemcpyDeviceToHost));
            for (int i = PS_NPH; i < PS_NL * PS_NPH; i++) span[i % PS_NPH].push_back((float)(h[i] - h[i - 1]) * 1e-3f);
        }
        printf("%-18s spans (us):", vars[v].name);
        const char *nm[PS_NPH] = {"S", "lat", "O", "lat", "GU", "lat", "D", "lat"};
        for (int k = 0; k < PS_NPH; k++) printf(" %s %.2f", nm[k], kb_median(span[k]));
        printf("\n");
    }
    printf("\nkbench_persist: %s\n", fails ? "FAILED" : "all checks ok");
    return fails ? 1 : 0;
}
