/* matvec.cu — workbench for src/cuda/matvec.cuh: the decode route's quantized matrix × vector.
 *
 * For each Glimmer shape (cols -> rows) and each weight format it: fills random raw GGUF blocks on
 * the device (valid f16 scales), repacks as the backend does, checks each version against a CPU
 * reference (quant.c's dequantize, f64 dot) on sampled rows, poisons the output to catch unwritten
 * rows, and times each version with events over rotating copies (> L2) — median of N.
 * Versions (the story is in NOTES.md):
 *   v1  warp per row, element-wise dequant (mv_elem)        — the plain correct one
 *   v2  R=1: vector loads, in-register dequant, byte trick   — one row per warp
 *   v3  R=2: two rows per warp share the x registers
 *   v4  R=4
 *   v5  the library's choice: a kernel per format (no run-time type switch), R by format
 *   v6  (removed; git keeps it) v5 with the mantissa trick for Q4_K/Q6_K: 1.5x v5, below v7
 *   v7  mvq.cuh: x as 24-bit block fixed point in byte digits, DP4A on exact integers (K-quants;
 *       other formats as v5); the per-input mvq_prep is timed on its own
 * v5 is src/cuda/matvec.cuh, the route's general path (formats and shapes the tensor-core
 * kernels do not take); the tensor-core kernels have their own workbenches (mma.cu, mma6.cu).
 * Each cell prints the relative L2 error against the f64 reference next to the time.
 * Also: a streaming-read kernel (the bandwidth ceiling measured in the same run), the four
 * attention projections as one launch, and the ffn gate·up pair with SiLU fused.
 *   usage: kbench_matvec [reps] */
#include "cuda/matvec.cuh"
#include "mvq.cuh"

#include "kbench.cuh"

/* Raw GGUF bytes: random quants, sane f16 scales. n = total raw bytes. */
__global__ void fill_raw(uint8_t *p, size_t n, uint32_t type, uint32_t seed)
{
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; type != MV_T_F32 && i < n / 2;
         i += (size_t)gridDim.x * blockDim.x) {
        uint16_t v = (uint16_t)kb_hash32(i, seed);
        if (type == MV_T_F16) {
            v = __half_as_ushort(__float2half(kb_urand(i, seed)));
        } else if (type == MV_T_Q4_K) {
            v = kb_q4k_word(i, seed); /* as kb_fill_q4k */
        } else if (type == MV_T_Q6_K) {
            v = kb_q6k_word(i, seed);
        } else if (type == MV_T_Q8_0) {
            if ((2 * i) % 34 == 0) v = __half_as_ushort(__float2half(0.002f + 0.004f * fabsf(kb_urand(i, seed))));
        }
        ((uint16_t *)p)[i] = v;
    }
    if (type == MV_T_F32) /* overwrite as floats */
        for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n / 4; i += (size_t)gridDim.x * blockDim.x)
            ((float *)p)[i] = kb_urand(i + 77, seed) * 0.05f;
}

/* v1: warp per row, element-wise. */
__global__ void mv_v1(mv_mat m, const float *x, float *y)
{
    const uint32_t row = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    const int lane = threadIdx.x & 31;
    if (row >= m.rows) return;
    float s = 0.f;
    for (uint32_t c = lane; c < m.cols; c += 32) s += mv_elem(m, row, c) * x[c];
    for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xFFFFFFFFu, s, o);
    if (lane == 0) y[row] = s;
}

static int ggml_type_of(uint32_t t) { return (int)t; } /* MV_T_* are the ggml ids */

static const char *tname(uint32_t t)
{
    switch (t) {
    case MV_T_F32: return "f32";
    case MV_T_F16: return "f16";
    case MV_T_Q8_0: return "q8_0";
    case MV_T_Q4_K: return "q4_k";
    case MV_T_Q6_K: return "q6_k";
    default: return "?";
    }
}

/* A matrix in device layout, n_copy rotating copies. */
struct devmat {
    std::vector<uint8_t *> copies;
    std::vector<uint8_t *> copies7; /* Q4_K / Q6_K in the mvq plane layouts (v7) */
    size_t bytes;
    mv_mat m;
    std::vector<uint8_t> host_raw; /* sampled rows, raw GGUF */
    std::vector<uint32_t> sample_rows;
};

static void make_mat(devmat &dm, uint32_t type, uint32_t rows, uint32_t cols, int n_copy, uint32_t seed)
{
    const size_t rb = mv_row_bytes(type, cols);
    dm.bytes = rb * rows;
    dm.m.type = type;
    dm.m.rows = rows;
    dm.m.cols = cols;
    uint8_t *raw = NULL;
    const bool repack = type == MV_T_Q6_K || type == MV_T_Q8_0;
    CK(cudaMalloc(&raw, dm.bytes));
    for (int k = 0; k < n_copy; k++) {
        fill_raw<<<2048, 256>>>(raw, dm.bytes, type, seed + k);
        CK(cudaGetLastError());
        if (k == 0) kb_sample_rows(raw, rows, rb, 48, dm.sample_rows, dm.host_raw); /* for the CPU check */
        uint8_t *dst = NULL;
        CK(cudaMalloc(&dst, dm.bytes));
        if (repack) {
            const size_t bb = type == MV_T_Q6_K ? 210 : 34;
            const size_t nblk = dm.bytes / bb;
            if (type == MV_T_Q6_K)
                mv_repack_q6k<<<(unsigned)((nblk + 255) / 256), 256>>>(raw, dst, nblk, 0, nblk);
            else
                mv_repack_q80<<<(unsigned)((nblk + 255) / 256), 256>>>(raw, dst, nblk, 0, nblk);
            CK(cudaGetLastError());
        } else {
            CK(cudaMemcpy(dst, raw, dm.bytes, cudaMemcpyDeviceToDevice));
        }
        dm.copies.push_back(dst);
        if (type == MV_T_Q6_K || type == MV_T_Q4_K) {
            uint8_t *d7 = NULL;
            CK(cudaMalloc(&d7, dm.bytes));
            const size_t nblk = dm.bytes / (type == MV_T_Q6_K ? 210 : 144);
            if (type == MV_T_Q6_K) mvq_repack_q6k<<<(unsigned)((nblk + 255) / 256), 256>>>(raw, d7, nblk, 0, nblk);
            else mvq_repack_q4k<<<(unsigned)((nblk + 255) / 256), 256>>>(raw, d7, nblk, 0, nblk);
            CK(cudaGetLastError());
            dm.copies7.push_back(d7);
        }
    }
    CK(cudaDeviceSynchronize());
    CK(cudaFree(raw));
}

static void free_mat(devmat &dm)
{
    for (uint8_t *p : dm.copies) CK(cudaFree(p));
    for (uint8_t *p : dm.copies7) CK(cudaFree(p));
    dm.copies.clear();
    dm.copies7.clear();
}

/* Relative L2 error of the sampled rows against the f64 CPU reference; -1 if any row unwritten. */
static double check(const devmat &dm, const float *hx, const float *hy, uint32_t cols)
{
    const size_t rb = mv_row_bytes(dm.m.type, cols);
    std::vector<float> w(cols);
    double num = 0, den = 0;
    for (size_t i = 0; i < dm.sample_rows.size(); i++) {
        if (quant_dequantize_row((uint32_t)ggml_type_of(dm.m.type), dm.host_raw.data() + i * rb, w.data(), cols) != 0) {
            fprintf(stderr, "quant_dequantize_row failed for %s\n", tname(dm.m.type));
            return 1e30;
        }
        const double ref = kb_dot_f64(w.data(), hx, cols);
        const float got = hy[dm.sample_rows[i]];
        if (!isfinite(got)) return -1;
        num += (got - ref) * (got - ref);
        den += ref * ref;
    }
    return sqrt(num / (den > 0 ? den : 1));
}

static int count_unwritten(const float *hy, uint32_t n)
{
    int bad = 0;
    for (uint32_t i = 0; i < n; i++) bad += !isfinite(hy[i]);
    return bad;
}

typedef void (*launch_fn)(const devmat &, int copy, const float *x, float *y);

/* One segment: copy of dm into y (stored), R rows per warp. */
static mv_launch one_seg(const devmat &dm, int copy, float *y, uint32_t R)
{
    mv_launch L;
    memset(&L, 0, sizeof L);
    L.n_seg = 1;
    L.seg[0].a = dm.m;
    L.seg[0].a.data = dm.copies[copy];
    L.seg[0].out = y;
    L.seg[0].op = MV_OP_STORE;
    L.n_warps = (dm.m.rows + R - 1) / R;
    return L;
}
template <int R>
static void launch_vR(const devmat &dm, int copy, const float *x, float *y)
{
    const mv_launch L = one_seg(dm, copy, y, R);
    mv_kernel<R><<<(L.n_warps + MV_WARPS - 1) / MV_WARPS, MV_WARPS * 32>>>(L, x);
}
/* v5: the library's launch: a kernel per format (no type switch), R by format. */
static void launch_v5(const devmat &dm, int copy, const float *x, float *y)
{
    mv_launch_typed(0, one_seg(dm, copy, y, (uint32_t)mv_rows_per_warp(dm.m.type)), x);
}
/* v7: mvq (K-quants; other formats as v5); g_xq holds mvq_prep of the current x. The launch for
 * R rows per warp (R = 0: the library's choice by format). */
static const uint8_t *g_xq;
static bool v7_setup(const devmat &dm, int copy, float *y, int R, mv_launch &L)
{
    if (dm.m.type != MV_T_Q4_K && dm.m.type != MV_T_Q6_K) return false;
    memset(&L, 0, sizeof L);
    L.n_seg = 1;
    L.seg[0].a = dm.m;
    L.seg[0].a.type = dm.m.type == MV_T_Q6_K ? MV_T_Q6_KD : MV_T_Q4_KD;
    L.seg[0].a.data = dm.copies7[copy];
    L.seg[0].out = y;
    L.seg[0].op = MV_OP_STORE;
    L.n_warps = R ? mvq_seg_warps_r(dm.m.rows, false, R) : mvq_seg_warps(L.seg[0].a.type, dm.m.rows, false);
    return true;
}
static void launch_v7(const devmat &dm, int copy, const float *x, float *y)
{
    mv_launch L;
    if (v7_setup(dm, copy, y, 0, L)) mvq_launch(0, L, g_xq);
    else launch_v5(dm, copy, x, y);
}
/* v7 launched without programmatic dependent launch */
static void launch_v7nopdl(const devmat &dm, int copy, const float *x, float *y)
{
    mv_launch L;
    if (v7_setup(dm, copy, y, 0, L)) mvq_launch(0, L, g_xq, false);
    else launch_v5(dm, copy, x, y);
}
/* Probes (not matvecs; their output is garbage, so the checker marks them BAD): v7's exact
 * Q4_KD access pattern with the arithmetic removed — weights only (XOR of the loaded words), and
 * weights + the x digit loads. They bound what the memory side of v7 can do per shape. */
template <bool WITH_X>
__global__ void __launch_bounds__(MV_WARPS * 32, 2) probe_q4(const mv_mat m, const uint8_t *__restrict__ xbuf, float *y)
{
    const uint32_t warp = blockIdx.x * MV_WARPS + (threadIdx.x >> 5), lane = threadIdx.x & 31;
    const uint32_t nb = m.cols / 256, c = lane & 3u, b0 = lane >> 2;
    if (warp * 4 >= m.rows) return;
    uint32_t acc = 0;
    const mvq_x q = mvq_x_at(xbuf, m.cols);
    for (uint32_t b = b0; b < nb; b += 8) {
        mvq_q4w W[4];
#pragma unroll
        for (int r = 0; r < 4; r++) {
            const size_t blk = (size_t)(warp * 4 + r) * nb + b;
            mvq_q4p P;
            P.qs = m.data + blk * 128 + 16 * c;
            P.hdr = m.data + (size_t)m.rows * nb * 128 + blk * 16;
            mvq_q4k_load(P, W[r]);
        }
        if (WITH_X) {
            const mvq_xp X = mvq_xp_at(q, b, c);
#pragma unroll
            for (int k = 0; k < 4; k++) {
                uint4 D[3];
                mvq_load_chunk(X, k, D);
                acc ^= D[0].x ^ D[1].y ^ D[2].z;
            }
        }
#pragma unroll
        for (int r = 0; r < 4; r++) acc ^= W[r].hdr.x ^ W[r].qa.y ^ W[r].qb.z;
    }
    for (int o = 16; o > 0; o >>= 1) acc ^= __shfl_xor_sync(0xFFFFFFFFu, acc, o);
    if (lane == 0) y[warp * 4] = (float)(acc & 1);
}
template <bool WITH_X>
static void launch_probe(const devmat &dm, int copy, const float *x, float *y)
{
    mv_launch L;
    if (!v7_setup(dm, copy, y, 4, L) || dm.m.type != MV_T_Q4_K) return launch_v5(dm, copy, x, y);
    probe_q4<WITH_X><<<(L.n_warps + MV_WARPS - 1) / MV_WARPS, MV_WARPS * 32>>>(L.seg[0].a, g_xq, y);
}
static void launch_var(int var, const mv_launch &L, const float *x)
{
    if (var == 0) mv_launch_typed(0, L, x);
    else mvq_launch(0, L, g_xq);
}
static void launch_v1(const devmat &dm, int copy, const float *x, float *y)
{
    mv_mat m = dm.m;
    m.data = dm.copies[copy];
    mv_v1<<<(m.rows + 7) / 8, 256>>>(m, x, y);
}

/* per-launch time with the queue kept full (kb_time_launches: bursts of 8 on rotating copies) */
static float time_it(launch_fn f, const devmat &dm, const float *x, float *y, int reps)
{
    return kb_time_launches([&](int copy) { f(dm, copy, x, y); }, (int)dm.copies.size(), reps);
}

int main(int argc, char **argv)
{
    const int reps = argc > 1 ? atoi(argv[1]) : 25;
    const cudaDeviceProp prop = kb_device();
    /* the ceiling: streaming read of 4 GiB (filled as fill_raw draws Q4_K) */
    const double read_gbs = kb_read_ceiling(prop.multiProcessorCount, kb_fill_q4k);
    cudaEvent_t a, b;
    CK(cudaEventCreate(&a));
    CK(cudaEventCreate(&b));

    const uint32_t shapes[][2] = {{6656, 4096}, {6656, 256}, {4096, 6656}, {6656, 19968}, {19968, 6656}, {6656, 202048}};
    const uint32_t types[] = {MV_T_Q4_K, MV_T_Q6_K, MV_T_Q8_0, MV_T_F16, MV_T_F32};
    const char *vname[] = {"v1", "v2(R1)", "v3(R2)", "v4(R4)", "v5(typed)", "v7", "v7(no PDL)", "probe:w", "probe:w+x"};
    launch_fn vf[] = {launch_v1, launch_vR<1>, launch_vR<2>, launch_vR<4>, launch_v5, launch_v7, launch_v7nopdl, launch_probe<false>, launch_probe<true>};
    const int NV = 9;
    /* MUSER_KBENCH_FAST=1: v5 and v7 only (the device run's short budget) */
    const bool fast = getenv("MUSER_KBENCH_FAST") && atoi(getenv("MUSER_KBENCH_FAST")) != 0;

    float *x, *y;
    uint8_t *xq;
    CK(cudaMalloc(&xq, mvq_x_bytes(20224)));
    g_xq = xq;
    CK(cudaMalloc(&x, 20000 * 4 * 4));
    CK(cudaMalloc(&y, 202048 * 4 * 2));
    std::vector<float> hx(20000 * 4), hy(202048 * 2);
    printf("\n%-6s %-14s %10s", "type", "shape", "MB");
    for (int v = 0; v < NV; v++)
        if (!fast || v >= 4) printf(" | %-34s", v == 0 ? "v1 us GB/s % relerr" : vname[v]);
    printf("\n");
    int fails = 0;
    /* MUSER_KBENCH_KQ=1: the K-quant formats only */
    const bool kq_only = getenv("MUSER_KBENCH_KQ") && atoi(getenv("MUSER_KBENCH_KQ")) != 0;
    for (uint32_t t : types) {
        if (kq_only && t != MV_T_Q4_K && t != MV_T_Q6_K) continue;
        for (auto &sh : shapes) {
            const uint32_t cols = sh[0], rows = sh[1];
            /* MUSER_KBENCH_ONLY=COLSxROWS: that shape only (profiling one kernel) */
            if (getenv("MUSER_KBENCH_ONLY")) {
                unsigned oc = 0, orows = 0;
                if (sscanf(getenv("MUSER_KBENCH_ONLY"), "%ux%u", &oc, &orows) == 2 && (oc != cols || orows != rows)) continue;
            }
            devmat dm;
            const size_t bytes = mv_row_bytes(t, cols) * rows;
            const int n_copy = kb_n_copy(bytes, 8);
            make_mat(dm, t, rows, cols, n_copy, 1000 + t * 7 + cols);
            kb_fill_x<<<(cols + 255) / 256, 256>>>(x, cols, cols + t);
            mvq_prep_launch(0, x, xq, cols);
            CK(cudaGetLastError());
            CK(cudaMemcpy(hx.data(), x, cols * 4, cudaMemcpyDeviceToHost));
            printf("%-6s %6u->%-7u %10.1f |", tname(t), cols, rows, bytes / 1e6);
            for (int v = 0; v < NV; v++) {
                if (fast && v < 4) continue;
                CK(cudaMemset(y, 0xFF, rows * 4)); /* NaN poison */
                vf[v](dm, 0, x, y);
                CK(cudaDeviceSynchronize());
                CK(cudaMemcpy(hy.data(), y, rows * 4, cudaMemcpyDeviceToHost));
                const int unw = count_unwritten(hy.data(), rows);
                const double err = check(dm, hx.data(), hy.data(), cols);
                const int vr = (v == 0 && bytes > (1u << 30)) ? 3 : reps;
                const float ms = time_it(vf[v], dm, x, y, vr);
                const double gbs = bytes / (ms * 1e-3) / 1e9;
                const bool probe = v >= 7; /* not a matvec */
                const bool ok = probe || (unw == 0 && err >= 0 && err < 1e-5);
                fails += !ok;
                printf(" %8.1f %6.0f %5.1f%% %.1e %s |", ms * 1e3, gbs, 100 * gbs / read_gbs, err, ok ? "ok" : "BAD");
                if (!ok) fprintf(stderr, "  %s %s %ux%u: unwritten %d rel err %.3g\n", tname(t), vname[v], cols, rows, unw, err);
            }
            printf("\n");
            free_mat(dm);
        }
    }

    /* Fused launches, Q4_K: the 4 attention projections, and ffn gate·up with SiLU. */
    {
        devmat q, k, v, g, fg, fu;
        make_mat(q, MV_T_Q4_K, 4096, 6656, 4, 11);
        make_mat(k, MV_T_Q4_K, 256, 6656, 4, 12);
        make_mat(v, MV_T_Q4_K, 256, 6656, 4, 13);
        make_mat(g, MV_T_Q4_K, 4096, 6656, 4, 14);
        make_mat(fg, MV_T_Q4_K, 19968, 6656, 2, 15);
        make_mat(fu, MV_T_Q4_K, 19968, 6656, 2, 16);
        kb_fill_x<<<(6656 + 255) / 256, 256>>>(x, 6656, 5);
        CK(cudaMemcpy(hx.data(), x, 6656 * 4, cudaMemcpyDeviceToHost));
        float *out;
        CK(cudaMalloc(&out, 40000 * 4));
        const char *varname[4] = {"v5", "", "", "v7"};
        mvq_prep_launch(0, x, xq, 6656);
        {   /* the per-input prep on its own, for the three input widths (into a spare buffer) */
            uint8_t *xq2;
            CK(cudaMalloc(&xq2, mvq_x_bytes(19968)));
            const uint32_t Ks[3] = {4096, 6656, 19968};
            for (uint32_t K : Ks) {
                const float ms = kb_median_ms(reps + 2, 2, a, b, [&] { mvq_prep_launch(0, x, xq2, K); });
                printf("v7 mvq_prep K=%u: %.1f us (one launch, timed alone)\n", K, ms * 1e3);
            }
            CK(cudaFree(xq2));
        }
        for (int var = 0; var < 4; var += 3) {
            const devmat *mats[4] = {&q, &k, &v, &g};
            std::vector<float> ts;
            for (int it = 0; it < reps + 2; it++) {
                mv_launch L;
                memset(&L, 0, sizeof L);
                L.n_seg = 4;
                uint32_t wb = 0, ob = 0;
                for (int s = 0; s < 4; s++) {
                    L.seg[s].a = mats[s]->m;
                    L.seg[s].a.data = mats[s]->copies[it % 4];
                    if (var >= 3) {
                        L.seg[s].a.type = MV_T_Q4_KD;
                        L.seg[s].a.data = mats[s]->copies7[it % 4];
                    }
                    L.seg[s].out = out + ob;
                    L.seg[s].warp_begin = wb;
                    wb += var == 3 ? mvq_seg_warps_r(mats[s]->m.rows, false, 4) : (mats[s]->m.rows + 3) / 4;
                    ob += mats[s]->m.rows;
                }
                L.n_warps = wb;
                if (it == 0) CK(cudaMemset(out, 0xFF, 40000 * 4));
                const float ms = kb_event_ms(a, b, [&] { launch_var(var, L, x); });
                if (it >= 2) ts.push_back(ms);
                if (it == 0) {
                    CK(cudaMemcpy(hy.data(), out, 8704 * 4, cudaMemcpyDeviceToHost));
                    uint32_t ob2 = 0;
                    for (int s = 0; s < 4; s++) {
                        const double e = check(*mats[s], hx.data(), hy.data() + ob2, 6656);
                        if (!(e >= 0 && e < 1e-5)) { fails++; fprintf(stderr, "%s qkvg seg %d err %g\n", varname[var], s, e); }
                        ob2 += mats[s]->m.rows;
                    }
                    fails += count_unwritten(hy.data(), 8704) != 0;
                }
            }
            const float tq = kb_median(ts);
            const double qb = 2.0 * (q.bytes + k.bytes);
            printf("\n%-4s q4_k QKVG one launch (8704 rows): %.1f us, %.0f GB/s, %.1f%%\n", varname[var], tq * 1e3, qb / (tq * 1e-3) / 1e9,
                   100 * qb / (tq * 1e-3) / 1e9 / read_gbs);

            ts.clear();
            for (int it = 0; it < reps + 2; it++) {
                mv_launch L;
                memset(&L, 0, sizeof L);
                L.n_seg = 1;
                L.seg[0].a = fg.m;
                L.seg[0].a.data = fg.copies[it % 2];
                L.seg[0].b = fu.m;
                L.seg[0].b.data = fu.copies[it % 2];
                if (var >= 3) {
                    L.seg[0].a.type = L.seg[0].b.type = MV_T_Q4_KD;
                    L.seg[0].a.data = fg.copies7[it % 2];
                    L.seg[0].b.data = fu.copies7[it % 2];
                }
                L.seg[0].op = MV_OP_SILU_MUL;
                L.seg[0].out = out;
                L.n_warps = var == 3 ? mvq_seg_warps_r(19968, true, 4) : 19968;
                const float ms = kb_event_ms(a, b, [&] { launch_var(var, L, x); });
                if (it >= 2) ts.push_back(ms);
                if (it == 0) { /* check silu(g)*u on sampled rows */
                    CK(cudaMemcpy(hy.data(), out, 19968 * 4, cudaMemcpyDeviceToHost));
                    std::vector<float> wg(6656), wu(6656);
                    double num = 0, den = 0;
                    const size_t rb = mv_row_bytes(MV_T_Q4_K, 6656);
                    for (size_t i = 0; i < fg.sample_rows.size(); i++) {
                        quant_dequantize_row(GGML_TYPE_Q4_K, fg.host_raw.data() + i * rb, wg.data(), 6656);
                        quant_dequantize_row(GGML_TYPE_Q4_K, fu.host_raw.data() + i * rb, wu.data(), 6656);
                        const double sg = kb_dot_f64(wg.data(), hx.data(), 6656), su = kb_dot_f64(wu.data(), hx.data(), 6656);
                        const double ref = sg / (1 + exp(-sg)) * su, got = hy[fg.sample_rows[i]];
                        num += (got - ref) * (got - ref);
                        den += ref * ref;
                    }
                    const double e = sqrt(num / den);
                    if (!(e < 1e-5)) { fails++; fprintf(stderr, "%s gate-up err %g\n", varname[var], e); }
                }
            }
            const float tg = kb_median(ts);
            const double gb = 2.0 * fg.bytes;
            printf("%-4s q4_k ffn gate+up+SiLU one launch (2x 6656->19968): %.1f us, %.0f GB/s, %.1f%%\n", varname[var], tg * 1e3,
                   gb / (tg * 1e-3) / 1e9, 100 * gb / (tg * 1e-3) / 1e9 / read_gbs);
        }
        free_mat(q); free_mat(k); free_mat(v); free_mat(g); free_mat(fg); free_mat(fu);
    }
    printf("\nkbench_matvec: %s\n", fails ? "FAILED" : "all checks ok");
    return fails ? 1 : 0;
}
