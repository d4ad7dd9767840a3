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
 * Versions (the story is in NOTES.md):
 *   v1  k_attn_split: CUDA cores, lane-per-position scores, lane-per-dimension P·V, 2 × 8 heads
 *   tc  k_attn_split_tc: mma.sync m16n8k16 with the 16 heads as M, f32 q and p as f16 hi + lo
 *       pairs, per-warp 3-stage cp.async pipelines of 16-position tiles, at most 128 splits
 *   tc 256 splits / tc 2 stages / tc 4 stages: the variants the route did not take
 * A second table times each split kernel alone and the combine alone.
 * Error: max |out − ref| over the sampled heads (|v| < 1, so per unit of V). The run fails (exit 1)
 * above 1e-5: f32 arithmetic stays near 1e-7 .. 1.5e-6, rounding q or p to f16 once gives 1e-4 ..
 * 5e-4 (tests/test_cuda_attn.c measures both sides of that bound).
 *   usage: kbench_attention [reps] */
#include "cuda/attention.cu"
#include "cuda/norm.cu"

#include <algorithm>
#include <vector>

#define CK(x)                                                                                    \
    do {                                                                                         \
        cudaError_t e_ = (x);                                                                    \
        if (e_ != cudaSuccess) {                                                                 \
            fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_));  \
            exit(1);                                                                             \
        }                                                                                        \
    } while (0)

#define H 32
#define HKV 2
#define D 128
#define FULL_CAP 131072
#define RING_CAP 2048
#define BOUND 1e-5

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
    std::vector<float> ts;
    for (int r = 0; r < 7; r++) {
        CK(cudaEventRecord(e0, st));
        cu_read_stream(st, big, stream_bytes, sink, n_sm);
        CK(cudaEventRecord(e1, st));
        CK(cudaEventSynchronize(e1));
        float ms;
        CK(cudaEventElapsedTime(&ms, e0, e1));
        ts.push_back(ms);
    }
    std::sort(ts.begin(), ts.end());
    const double read_gbs = stream_bytes / (ts[ts.size() / 2] * 1e-3) / 1e9;
    printf("streaming read (cu_read_stream, 1 GiB): %.0f GB/s\n\n", read_gbs);

    const wcase cases[] = {
        {"full", false, 1, 0, 0, 256},          {"full", false, 31, 30, 0, 256},
        {"full", false, 32, 31, 0, 256},        {"full", false, 33, 32, 0, 256},
        {"full", false, 2048, 2047, 0, 256},    {"full", false, 4096, 4095, 0, 256},
        {"full", false, 32768, 32767, 0, 256},  {"full", false, 131072, 131071, 0, 256},
        {"ring", true, 1, 0, 2047, 32},         {"ring", true, 33, 32, 2030, 32},
        {"ring", true, 2048, 5000, 2953 % 2048, 32},
    };
    const float scale = (float)(1.0 / sqrt((double)D));
    const uint32_t sample[] = {0, 7, 16, 31};
    int fails = 0;
    /* versions: 0 v1 and 1 tc as cu_attention runs them (the route's); 2..4 tc variants */
    const char *vname[] = {"v1", "tc", "tc 256 splits", "tc 2 stages", "tc 4 stages"};
    const int n_var = 5;
    std::vector<std::vector<double>> t_all(n_var), t_split(n_var);
    std::vector<double> t_comb128, t_comb256;
    auto enqueue = [&](int var, const wcase &c, bool with_combine) -> int {
        cu_attn_geom g;
        memset(&g, 0, sizeof g);
        g.n_head = H;
        g.n_head_kv = HKV;
        g.head_dim = D;
        g.ring = c.ring;
        g.n_split = c.n_split;
        g.scale = scale;
        g.impl = var == 0 ? CU_ATTN_V1 : CU_ATTN_TC;
        const uint16_t *kp = c.ring ? rk : fk, *vp = c.ring ? rv : fv;
        const cu_step *ds = (const cu_step *)dstep;
        const cu_plane_meta *dm = (const cu_plane_meta *)(ds + 1);
        if (var <= 1 && with_combine) return cu_attention(st, dq, ds, dm, kp, vp, pml, pacc, NULL, dout, &g, NULL);
        if (var == 0) return launch_by_g<4>(st, dq, ds, dm, kp, vp, pml, pacc, &g);
        if (var != 2 && g.n_split > TC_MAX_SPLIT) g.n_split = TC_MAX_SPLIT;
        int rc = var == 3 ? launch_split_tc<2>(st, dq, ds, dm, kp, vp, pml, pacc, &g)
                 : var == 4 ? launch_split_tc<4>(st, dq, ds, dm, kp, vp, pml, pacc, &g)
                            : launch_split_tc<TC_STAGES>(st, dq, ds, dm, kp, vp, pml, pacc, &g);
        if (!rc && with_combine)
            k_attn_combine<<<H, D, 0, st>>>(pml, pacc, ds, dm, NULL, dout, H / HKV, D, g.n_split, NULL);
        return rc;
    };
    auto time_it = [&](auto &&fn) -> double {
        ts.clear();
        for (int r = 0; r < reps; r++) {
            cu_read_stream(st, big, flush_bytes, sink, n_sm);
            CK(cudaEventRecord(e0, st));
            fn();
            CK(cudaEventRecord(e1, st));
            CK(cudaEventSynchronize(e1));
            float ms;
            CK(cudaEventElapsedTime(&ms, e0, e1));
            ts.push_back(ms);
        }
        std::sort(ts.begin(), ts.end());
        return ts[ts.size() / 2] * 1e3;
    };
    printf("split + combine (cu_attention), KV evicted from L2 before each call; err = max |out - ref|\n");
    printf("%-5s %7s | %9s %7s %6s %9s | %9s %7s %6s %9s | %6s\n", "plane", "len", "v1 us", "GB/s", "%read", "err",
           "tc us", "GB/s", "%read", "err", "v1/tc");
    std::vector<double> var_err(n_var * 16);
    int ci = 0;
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
            CK(cudaMemsetAsync(dout, 0xFF, H * D * sizeof(float), st)); /* NaN: unwritten shows */
            if (enqueue(var, c, true)) {
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
            var_err[var * 16 + ci] = w;
            if (!(w <= BOUND)) fails++;
            t_all[var].push_back(time_it([&] { enqueue(var, c, true); }));
            t_split[var].push_back(time_it([&] { enqueue(var, c, false); }));
        }
        /* the combine alone over the partials just written (time_it flushes L2 first, so they are
         * cold here; in the route they are hot: an upper bound) */
        {
            const cu_step *ds = (const cu_step *)dstep;
            const cu_plane_meta *dm = (const cu_plane_meta *)(ds + 1);
            enqueue(1, c, false);
            t_comb128.push_back(time_it([&] {
                k_attn_combine<<<H, D, 0, st>>>(pml, pacc, ds, dm, NULL, dout, H / HKV, D,
                                                 c.n_split < TC_MAX_SPLIT ? c.n_split : TC_MAX_SPLIT, NULL);
            }));
            enqueue(2, c, false);
            t_comb256.push_back(time_it([&] {
                k_attn_combine<<<H, D, 0, st>>>(pml, pacc, ds, dm, NULL, dout, H / HKV, D, c.n_split, NULL);
            }));
        }
        const double kv_bytes = 2.0 * c.len * HKV * D * 2;
        printf("%-5s %7llu |", c.kind, (unsigned long long)c.len);
        for (int var = 0; var < 2; var++) {
            const double us = t_all[var][ci], gbs = kv_bytes / (us * 1e-6) / 1e9;
            printf(" %9.2f %7.0f %5.1f%% %9.2e |", us, gbs, 100.0 * gbs / read_gbs, var_err[var * 16 + ci]);
        }
        printf(" %5.2fx\n", t_all[0][ci] / t_all[1][ci]);
        ci++;
    }
    printf("\nsplit kernel alone, us (%% of read), err; combine alone, us (after the L2 flush too: partials cold, an upper bound)\n");
    printf("%-5s %7s |", "plane", "len");
    for (int var = 0; var < n_var; var++) printf(" %20s |", vname[var]);
    printf(" %8s %8s\n", "comb<=128", "comb 256");
    ci = 0;
    for (const wcase &c : cases) {
        const double kv_bytes = 2.0 * c.len * HKV * D * 2;
        printf("%-5s %7llu |", c.kind, (unsigned long long)c.len);
        for (int var = 0; var < n_var; var++) {
            const double us = t_split[var][ci], gbs = kv_bytes / (us * 1e-6) / 1e9;
            printf(" %7.2f %5.1f%% %6.1e |", us, 100.0 * gbs / read_gbs, var_err[var * 16 + ci]);
        }
        printf(" %8.2f %8.2f\n", t_comb128[ci], t_comb256[ci]);
        ci++;
    }
    printf("\nkbench_attention: %s (%d cells above the %.0e error bound)\n", fails ? "FAIL" : "ok", fails, BOUND);
    return fails ? 1 : 0;
}
