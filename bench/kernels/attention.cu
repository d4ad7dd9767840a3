/* attention.cu — workbench for src/cuda/attention.cu: decode split attention + combine.
 *
 * Glimmer geometry (32 query heads, 2 KV heads, D 128). Random f16 K/V planes (FULL head-major,
 * capacity 131072, 256 splits per KV head as the backend sets them; SWA ring of 2048 rows, 32
 * splits, with the stored range wrapping), random q. For each length each version runs the whole
 * cu_attention() (split kernel + the unchanged combine), its output is compared with an f64 CPU
 * reference on a sample of query heads, and it is timed with events around single calls, each
 * after a 128 MiB streaming read that evicts the KV from L2 (in decode, ~300 MB of weights pass
 * between two layers' attention): median of N. Columns: µs per call, GB/s of KV read (K and V of
 * the attended rows), % of a streaming read (cu_read_stream, 1 GiB) measured in the same run.
 * Versions (the story is in NOTES.md); each is one att_plan run through att_run():
 *   tc    the route: k_attn_split_tc (mma.sync m16n8k16, the 16 heads as M, f32 q and p as f16
 *         hi + lo, per-warp 3-stage cp.async pipelines), at most 64 splits (ring: TC_RING_SPLIT),
 *         split lengths a multiple of TC_ALIGN, then the parallel combine (8 warps over splits,
 *         lanes over dimensions, fixed-shape reductions) as a programmatic dependent (PDL)
 *   tc0   the route before 2026-11-30: the split kernel at align 32 and at most 128 splits, then
 *         the old serial combine (k_attn_combine0 below: one block per query head walking the
 *         splits), no PDL
 *   v1    k_attn_split (CUDA cores) + the new combine; tc nopdl / tc 128 / tc128 np / tc a32 /
 *         tc n/2: the route with knobs changed (no PDL; 128 FULL splits with and without PDL;
 *         align 32; half the splits). Variants measured once and dropped (align 128, a quarter of
 *         the splits, 256 splits, 2 and 4 stages) are in NOTES.md.
 * Three timings per cell: "cold" as above (events around one call after the L2 flush); "chain":
 * 52 calls back to back captured in one CUDA graph (a decode token's 52 layers, without the
 * weights between them: KV and partials stay in L2, so it measures the fixed cost of short calls,
 * not DRAM), µs per call; the split kernel alone, cold. The chain is replayed twice more and must
 * give the same output bits (no order-dependent sums).
 * Error: max |out − ref| over the sampled heads (|v| < 1, so per unit of V). The run fails (exit 1)
 * above 1e-5: f32 arithmetic stays near 1e-7 .. 1.5e-6, rounding q or p to f16 once gives 1e-4 ..
 * 5e-4 (tests/test_cuda_attn.c measures both sides of that bound).
 *   usage: kbench_attention [reps] */
#include "cuda/attention.cu"
#include "cuda/norm.cu"

#include "kbench.cuh"

#define H 32
#define HKV 2
#define D 128
#define FULL_CAP 131072
#define RING_CAP 2048
#define BOUND 1e-5
#define CHAIN 52

/* The combine before 2026-11-30, kept here as the "tc0" baseline: one block per query head, the
 * threads over dimensions walking the used splits one after another. */
__global__ void k_attn_combine0(const float *part_ml, const float *part_acc, const cu_plane_meta *meta,
                                const float *gate, float *out, uint32_t GQ, uint32_t DIM, uint32_t n_split)
{
    __shared__ float wmax[32];
    const uint32_t hq = blockIdx.x, h = hq / GQ, g = hq % GQ;
    const uint64_t len = meta[0].len, chunk = att_chunk(len, n_split, 32);
    const uint32_t used = (uint32_t)((len + chunk - 1) / chunk);
    float M = -INFINITY;
    for (uint32_t s = threadIdx.x; s < used; s += blockDim.x) M = fmaxf(M, part_ml[(((size_t)h * n_split + s) * GQ + g) * 2]);
    for (int o = 16; o > 0; o >>= 1) M = fmaxf(M, __shfl_xor_sync(0xFFFFFFFFu, M, o));
    if ((threadIdx.x & 31) == 0) wmax[threadIdx.x >> 5] = M;
    __syncthreads();
    M = wmax[0];
    for (uint32_t i = 1; i < blockDim.x / 32; i++) M = fmaxf(M, wmax[i]);
    for (uint32_t d = threadIdx.x; d < DIM; d += blockDim.x) {
        float num = 0.f, den = 0.f;
#pragma unroll 8
        for (uint32_t s = 0; s < used; s++) {
            const size_t i = ((size_t)h * n_split + s) * GQ + g;
            const float f = __expf(part_ml[i * 2] - M);
            den += f * part_ml[i * 2 + 1];
            num += f * part_acc[i * DIM + d];
        }
        float o = num / den;
        if (gate) o = o * (1.f / (1.f + expf(-gate[(size_t)hq * DIM + d])));
        out[(size_t)hq * DIM + d] = o;
    }
}

struct wcase {
    const char *kind;
    bool ring;
    uint64_t len, pos, origin_physical;
    uint32_t n_split;
};

static double ref_head(const std::vector<uint16_t> &kh, const std::vector<uint16_t> &vh, const float *q,
                       const wcase &c, uint32_t i, float scale, double *o)
{
    const uint32_t kv = i / (H / HKV);
    const uint64_t cap = c.ring ? RING_CAP : FULL_CAP, ol = c.pos + 1 - c.len;
    std::vector<double> s(c.len);
    double mx = -INFINITY;
    for (uint64_t t = 0; t < c.len; t++) {
        const uint64_t j = ol + t, r = c.ring ? (c.origin_physical + j - ol) % cap : j;
        const size_t off = c.ring ? r * HKV * D + kv * D : ((size_t)kv * cap + r) * D;
        double a = 0;
        for (int d = 0; d < D; d++) a += (double)q[i * D + d] * (double)__half2float(__ushort_as_half(kh[off + d]));
        s[t] = a * (double)scale;
        mx = std::max(mx, s[t]);
    }
    double l = 0;
    for (uint64_t t = 0; t < c.len; t++) l += (s[t] = exp(s[t] - mx));
    for (int d = 0; d < D; d++) o[d] = 0;
    for (uint64_t t = 0; t < c.len; t++) {
        const uint64_t j = ol + t, r = c.ring ? (c.origin_physical + j - ol) % cap : j;
        const size_t off = c.ring ? r * HKV * D + kv * D : ((size_t)kv * cap + r) * D;
        for (int d = 0; d < D; d++) o[d] += s[t] * (double)__half2float(__ushort_as_half(vh[off + d]));
    }
    for (int d = 0; d < D; d++) o[d] /= l;
    return l;
}

int main(int argc, char **argv)
{
    const int reps = argc > 1 ? atoi(argv[1]) : 21;
    int dev = 0, n_sm = 0;
    CK(cudaGetDevice(&dev));
    CK(cudaDeviceGetAttribute(&n_sm, cudaDevAttrMultiProcessorCount, dev));
    cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, dev));
    printf("device: %s, %d SMs, L2 %d MiB\n", prop.name, n_sm, prop.l2CacheSize >> 20);
    cudaStream_t st;
    CK(cudaStreamCreate(&st));
    const size_t full_n = (size_t)FULL_CAP * HKV * D, ring_n = (size_t)RING_CAP * HKV * D;
    uint16_t *fk, *fv, *rk, *rv;
    CK(cudaMalloc(&fk, full_n * 2));
    CK(cudaMalloc(&fv, full_n * 2));
    CK(cudaMalloc(&rk, ring_n * 2));
    CK(cudaMalloc(&rv, ring_n * 2));
    cu_fill_plane_random(st, fk, full_n, 11);
    cu_fill_plane_random(st, fv, full_n, 12);
    cu_fill_plane_random(st, rk, ring_n, 13);
    cu_fill_plane_random(st, rv, ring_n, 14);
    std::vector<uint16_t> hfk(full_n), hfv(full_n), hrk(ring_n), hrv(ring_n);
    CK(cudaMemcpyAsync(hfk.data(), fk, full_n * 2, cudaMemcpyDeviceToHost, st));
    CK(cudaMemcpyAsync(hfv.data(), fv, full_n * 2, cudaMemcpyDeviceToHost, st));
    CK(cudaMemcpyAsync(hrk.data(), rk, ring_n * 2, cudaMemcpyDeviceToHost, st));
    CK(cudaMemcpyAsync(hrv.data(), rv, ring_n * 2, cudaMemcpyDeviceToHost, st));
    std::vector<float> hq(H * D);
    uint64_t z = 0x9E3779B97F4A7C15ull;
    for (auto &x : hq) {
        z = z * 6364136223846793005ull + 1442695040888963407ull;
        x = ((float)(z >> 40) / 16777216.f - 0.5f) * 16.f; /* [-8, 8): score std ~2.7 */
    }
    float *dq, *dout, *pml, *pacc;
    CK(cudaMalloc(&dq, H * D * sizeof(float)));
    CK(cudaMalloc(&dout, H * D * sizeof(float)));
    CK(cudaMalloc(&pml, (size_t)HKV * 256 * (H / HKV) * 2 * sizeof(float)));
    CK(cudaMalloc(&pacc, (size_t)HKV * 256 * (H / HKV) * D * sizeof(float)));
    CK(cudaMemcpy(dq, hq.data(), H * D * sizeof(float), cudaMemcpyHostToDevice));
    struct {
        cu_step s;
        cu_plane_meta m;
    } hs;
    void *dstep;
    CK(cudaMalloc(&dstep, sizeof hs));
    const uint64_t stream_bytes = 1ull << 30, flush_bytes = 128ull << 20;
    uint8_t *big;
    uint32_t *sink;
    CK(cudaMalloc(&big, stream_bytes));
    CK(cudaMemset(big, 1, stream_bytes));
    CK(cudaMalloc(&sink, 4));
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    /* the streaming-read ceiling */
    const float read_ms = kb_median_ms(7, 0, e0, e1, [&] { cu_read_stream(st, big, stream_bytes, sink, n_sm); }, st);
    const double read_gbs = stream_bytes / (read_ms * 1e-3) / 1e9;
    printf("streaming read (cu_read_stream, 1 GiB): %.0f GB/s\n\n", read_gbs);

    const wcase cases[] = {
        {"full", false, 1, 0, 0, 256},          {"full", false, 31, 30, 0, 256},
        {"full", false, 32, 31, 0, 256},        {"full", false, 33, 32, 0, 256},
        {"full", false, 2048, 2047, 0, 256},    {"full", false, 4096, 4095, 0, 256},
        {"full", false, 8192, 8191, 0, 256},    {"full", false, 32768, 32767, 0, 256},
        {"full", false, 131072, 131071, 0, 256},
        {"ring", true, 1, 0, 2047, 32},         {"ring", true, 33, 32, 2030, 32},
        {"ring", true, 2048, 5000, 2953 % 2048, 32},
    };
    const float scale = (float)(1.0 / sqrt((double)D));
    const uint32_t sample[] = {0, 7, 16, 31};
    int fails = 0;
    const char *vname[] = {"tc0", "tc", "v1", "tc nopdl", "tc 128", "tc128 np", "tc a32", "tc n/2"};
    const int n_var = 8;
    const cu_step *ds = (const cu_step *)dstep;
    const cu_plane_meta *dm = (const cu_plane_meta *)(ds + 1);
    auto geom_of = [&](const wcase &c) {
        cu_attn_geom g;
        memset(&g, 0, sizeof g);
        g.n_head = H;
        g.n_head_kv = HKV;
        g.head_dim = D;
        g.ring = c.ring;
        g.n_split = c.n_split;
        g.scale = scale;
        g.impl = CU_ATTN_TC;
        return g;
    };
    auto plan_of = [&](int var, const cu_attn_geom &g) {
        att_plan p = att_plan_for(&g);
        switch (var) {
        case 0: p.align = 32; p.pdl = false; p.n_split = g.n_split < 128 ? g.n_split : 128; break;
        case 2: p.tc = false; p.align = 32; p.n_split = g.n_split; break;
        case 3: p.pdl = false; break;
        case 4: p.n_split = g.n_split < 128 ? g.n_split : 128; break;
        case 5: p.n_split = g.n_split < 128 ? g.n_split : 128; p.pdl = false; break;
        case 6: p.align = 32; break;
        case 7: p.n_split /= 2; break;
        }
        return p;
    };
    /* parts: 1 split, 2 combine, 3 both */
    auto enqueue = [&](int var, const wcase &c, int parts) -> int {
        const cu_attn_geom g = geom_of(c);
        const att_plan p = plan_of(var, g);
        const uint16_t *kp = c.ring ? rk : fk, *vp = c.ring ? rv : fv;
        if (var != 0) return att_run(st, dq, ds, dm, kp, vp, pml, pacc, NULL, dout, &g, p, cu_digits{NULL, NULL, 0, NULL}, parts);
        int rc = parts & 1 ? att_run(st, dq, ds, dm, kp, vp, pml, pacc, NULL, dout, &g, p, cu_digits{NULL, NULL, 0, NULL}, 1) : 0;
        if (!rc && (parts & 2)) k_attn_combine0<<<H, D, 0, st>>>(pml, pacc, dm, NULL, dout, H / HKV, D, p.n_split);
        return rc;
    };
    auto time_it = [&](auto &&fn) -> double {
        std::vector<float> ts;
        for (int r = 0; r < reps; r++) {
            cu_read_stream(st, big, flush_bytes, sink, n_sm);
            ts.push_back(kb_event_ms(e0, e1, fn, st));
        }
        return kb_median(ts) * 1e3;
    };
    /* CHAIN calls in one graph; µs per call (median of 7 replays); *same: replays bit-identical */
    auto time_chain = [&](int var, const wcase &c, bool *same) -> double {
        cudaGraph_t gr;
        cudaGraphExec_t ge;
        CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeRelaxed));
        for (int i = 0; i < CHAIN; i++) enqueue(var, c, 3);
        CK(cudaStreamEndCapture(st, &gr));
        CK(cudaGraphInstantiate(&ge, gr, 0));
        std::vector<float> o1(H * D), o2(H * D);
        CK(cudaGraphLaunch(ge, st));
        CK(cudaMemcpyAsync(o1.data(), dout, H * D * sizeof(float), cudaMemcpyDeviceToHost, st));
        const float ms = kb_median_ms(7, 0, e0, e1, [&] { CK(cudaGraphLaunch(ge, st)); }, st);
        CK(cudaMemcpyAsync(o2.data(), dout, H * D * sizeof(float), cudaMemcpyDeviceToHost, st));
        CK(cudaStreamSynchronize(st));
        *same = !memcmp(o1.data(), o2.data(), o1.size() * sizeof(float));
        CK(cudaGraphExecDestroy(ge));
        CK(cudaGraphDestroy(gr));
        return ms * 1e3 / CHAIN;
    };
    const int n_case = (int)(sizeof cases / sizeof cases[0]);
    std::vector<double> t_cold(n_var * n_case), t_chain(n_var * n_case), t_split(n_var * n_case), err(n_var * n_case);
    std::vector<double> t_comb0(n_case), t_comb(n_case);
    int ci = 0, not_same = 0;
    for (const wcase &c : cases) {
        memset(&hs, 0, sizeof hs);
        hs.s.pos = c.pos;
        hs.s.n_layer = 1;
        hs.m.origin_logical = c.pos + 1 - c.len;
        hs.m.origin_physical = c.origin_physical;
        hs.m.len = c.len;
        hs.m.capacity = c.ring ? RING_CAP : FULL_CAP;
        CK(cudaMemcpy(dstep, &hs, sizeof hs, cudaMemcpyHostToDevice));
        std::vector<double> ref(4 * D);
        for (int si = 0; si < 4; si++)
            ref_head(c.ring ? hrk : hfk, c.ring ? hrv : hfv, hq.data(), c, sample[si], scale, &ref[si * D]);
        for (int var = 0; var < n_var; var++) {
            const int k = var * n_case + ci;
            CK(cudaMemsetAsync(dout, 0xFF, H * D * sizeof(float), st)); /* NaN: unwritten shows */
            if (enqueue(var, c, 3)) {
                fprintf(stderr, "%s refused\n", vname[var]);
                return 1;
            }
            CK(cudaGetLastError());
            std::vector<float> o(H * D);
            CK(cudaMemcpyAsync(o.data(), dout, H * D * sizeof(float), cudaMemcpyDeviceToHost, st));
            CK(cudaStreamSynchronize(st));
            double w = 0;
            for (int si = 0; si < 4; si++)
                for (int d = 0; d < D; d++) {
                    const double e = fabs((double)o[sample[si] * D + d] - ref[si * D + d]);
                    if (!(e <= w)) w = e;
                }
            err[k] = w;
            if (!(w <= BOUND)) fails++;
            t_cold[k] = time_it([&] { enqueue(var, c, 3); });
            t_split[k] = time_it([&] { enqueue(var, c, 1); });
            bool same = true;
            t_chain[k] = time_chain(var, c, &same);
            if (!same) {
                not_same++;
                fprintf(stderr, "%s %s %llu: graph replays differ\n", vname[var], c.kind, (unsigned long long)c.len);
            }
        }
        /* the combines alone over the partials just written (cold after the flush: an upper bound;
         * in the route they are hot) */
        enqueue(0, c, 1);
        t_comb0[ci] = time_it([&] { enqueue(0, c, 2); });
        enqueue(1, c, 1);
        t_comb[ci] = time_it([&] { enqueue(1, c, 2); });
        ci++;
    }
    auto table = [&](const char *title, const std::vector<double> &t, bool with_err) {
        printf("\n%s\n%-5s %7s |", title, "plane", "len");
        for (int var = 0; var < n_var; var++) printf(" %9s", vname[var]);
        printf(" | %%read(tc) tc0/tc\n");
        for (int i = 0; i < n_case; i++) {
            const wcase &c = cases[i];
            const double kv_bytes = 2.0 * c.len * HKV * D * 2;
            printf("%-5s %7llu |", c.kind, (unsigned long long)c.len);
            for (int var = 0; var < n_var; var++) printf(" %9.2f", t[var * n_case + i]);
            const double gbs = kv_bytes / (t[n_case + i] * 1e-6) / 1e9;
            printf(" | %8.1f%% %6.2fx\n", 100.0 * gbs / read_gbs, t[i] / t[n_case + i]);
        }
        if (with_err) {
            printf("err   %7s |", "max");
            for (int var = 0; var < n_var; var++) {
                double w = 0;
                for (int i = 0; i < n_case; i++) w = std::max(w, err[var * n_case + i]);
                printf(" %9.1e", w);
            }
            printf("\n");
        }
    };
    table("whole call, cold (us; KV evicted from L2 before each call)", t_cold, true);
    table("whole call in a graph chain of 52 (us per call; hot L2)", t_chain, false);
    table("split kernel alone, cold (us)", t_split, false);
    printf("\ncombine alone, cold (us): old serial (tc0) vs new, over the route's partials\n");
    for (int i = 0; i < n_case; i++)
        printf("%-5s %7llu | %8.2f %8.2f\n", cases[i].kind, (unsigned long long)cases[i].len, t_comb0[i], t_comb[i]);
    printf("\nkbench_attention: %s (%d cells above the %.0e error bound, %d graphs not bit-identical on replay)\n",
           fails || not_same ? "FAIL" : "ok", fails, BOUND, not_same);
    return fails || not_same ? 1 : 0;
}
