/* mmi.cuh — what the exact-integer workbenches (mmi.cu: Q4_K, mmi6.cu: Q6_K) share: x as a 31-bit
 * fixed point per (row, block) in four balanced int8 digits, in the B layout of m16n8k32 (and of
 * m16n8k16 per half), and the integer mma. The numerics are in mmi.cu's header. */
#ifndef MUSER_MMI_CUH
#define MUSER_MMI_CUH

#include "kbench_q4k.cuh"

/* x per row and block: [j 0..7][digit][t][b0 4 bytes, b1 4 bytes] (1024), then [piece][t] the f16
 * pair of 2^-20·Σ v over sub-blocks 2t, 2t+1 (32), then s (f32), padding */
#define MMI_XBLK 1072u

/* ---- the x writer: one warp per (row, block); lane l holds positions 32i + l (sub-block i) ------ */
__global__ void mmi_prep(const float *x, uint32_t K, uint32_t nx, uint8_t *xq)
{
    const uint32_t warp = (blockIdx.x * blockDim.x + threadIdx.x) >> 5, lane = threadIdx.x & 31, nb = K / 256;
    if (warp >= nx * nb) return;
    const uint32_t r = warp / nb, b = warp % nb;
    const float *xb = x + (size_t)r * K + 256 * b;
    float v[8], mx = 0.f;
#pragma unroll
    for (int i = 0; i < 8; i++) {
        v[i] = xb[32 * i + lane];
        mx = fmaxf(mx, fabsf(v[i]));
    }
#pragma unroll
    for (int o = 16; o; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xFFFFFFFFu, mx, o));
    float s = 1.f; /* |x| / s < 2^30 (1 for an all-zero block) */
    if (mx > 0.f) {
        int e;
        frexpf(mx, &e); /* mx < 2^e */
        s = ldexpf(1.f, e - 30);
    }
    uint8_t *o = xq + ((size_t)r * nb + b) * MMI_XBLK;
#pragma unroll
    for (int i = 0; i < 8; i++) {
        const int32_t q = __float2int_rn(v[i] / s); /* exact division by a power of two, then rint */
        const int32_t d0 = (int8_t)(q & 0xFF), q1 = (q - d0) >> 8, d1 = (int8_t)(q1 & 0xFF), q2 = (q1 - d1) >> 8,
                      d2 = (int8_t)(q2 & 0xFF), d3 = (q2 - d2) >> 8;
        const int32_t dg[4] = {d0, d1, d2, d3};
        const uint32_t kk = lane, t = (kk & 15) >> 2, half = kk >> 4, by = kk & 3;
#pragma unroll
        for (int c = 0; c < 4; c++) o[((i * 4 + c) * 4 + t) * 8 + half * 4 + by] = (uint8_t)(int8_t)dg[c];
        /* the sub-block's Σ v (exact in f64: < 2^35), as 2^-20·Σ in two f16 pieces */
        double sum = (double)q;
#pragma unroll
        for (int w = 16; w; w >>= 1) sum += __shfl_xor_sync(0xFFFFFFFFu, sum, w);
        if (lane == 0) kq4_sum_pieces(o + 1024, i, (float)(sum * 0x1p-20));
    }
    if (lane == 0) *(float *)(o + 1056) = s;
}

/* m16n8k32, u8 A × s8 B → s32 (Q4_K's nibbles) */
__device__ __forceinline__ void mmi_imma(int c[4], const uint32_t a[4], uint32_t b0, uint32_t b1)
{
    asm volatile("mma.sync.aligned.m16n8k32.row.col.s32.u8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};"
                 : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
/* m16n8k16, s8 × s8 → s32 (Q6_K's 4·(q − 32) per 16-group) */
__device__ __forceinline__ void mmi_imma16(int c[4], uint32_t a0, uint32_t a1, uint32_t b0)
{
    asm volatile("mma.sync.aligned.m16n8k16.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5}, {%6}, {%0,%1,%2,%3};"
                 : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
                 : "r"(a0), "r"(a1), "r"(b0));
}

/* ---- the kernels' shared steps (mmi.cu's header has the numerics) --------------------------------- */
/* T = Σ_k 2^8k·T_k of this lane's weight row from its C fragment a (digits 2(t&1), 2(t&1)+1 of rows
 * g, g+8) and its partner's (lane ^ 1): the low-digit lane gets row g, its partner row g + 8 */
__device__ __forceinline__ double mmi_pair_T(const int a[4], uint32_t hi)
{
    const double p0 = (double)a[0] + 256.0 * (double)a[1];
    const double p8 = (double)a[2] + 256.0 * (double)a[3];
    const double mine = hi ? p8 : p0, other = __shfl_xor_sync(0xFFFFFFFFu, hi ? p0 : p8, 1);
    return hi ? other + 65536.0 * mine : mine + 65536.0 * other;
}

/* The KW warps' (or CTAs') f64 sums added in kw order: warp kw > 0 leaves its sums in red and is
 * done (false); warp 0 adds them (every thread of the CTA calls it) */
template <int KW, int NT, int SL>
__device__ __forceinline__ bool mmi_kw_sum(double (&red)[KW > 1 ? KW - 1 : 1][SL][NT][32], uint32_t kw, uint32_t slot,
                                           uint32_t lane, double (&yacc)[NT])
{
    if (KW == 1) return true;
    if (kw > 0)
#pragma unroll
        for (int n = 0; n < NT; n++) red[kw - 1][slot][n][lane] = yacc[n];
    __syncthreads();
    if (kw > 0) return false;
#pragma unroll
    for (int k = 0; k < KW - 1; k++)
#pragma unroll
        for (int n = 0; n < NT; n++) yacc[n] += red[k][slot][n][lane];
    return true;
}

/* y for this lane's rows: x row 2n + t/2 (of nx), weight row 16·tile + g + 8·(t&1), rounded once */
template <int NT>
__device__ __forceinline__ void mmi_store(float *y, const double (&yacc)[NT], uint32_t nx, uint32_t rows, uint32_t tile,
                                          uint32_t lane)
{
    const uint32_t g = lane >> 2, t = lane & 3;
#pragma unroll
    for (int n = 0; n < NT; n++) {
        const uint32_t xr = 2 * n + (t >> 1), row = tile * 16 + g + 8 * (t & 1);
        if (xr < nx) y[(size_t)xr * rows + row] = (float)yacc[n];
    }
}

/* ncopy copies of the matrix in a workbench's units: copy k drawn by fill with seed + k (the draws of
 * kb_make_qmat's copy k), repacked by repack (one thread per (tile, block, row pair)) */
typedef void (*mmi_repack_fn)(const uint8_t *, uint8_t *, uint32_t, uint32_t);
static inline std::vector<uint8_t *> mmi_units(kb_fill_fn fill, mmi_repack_fn repack, size_t raw_bytes, uint32_t rows,
                                               uint32_t nb, size_t ubytes, int ncopy, uint32_t seed)
{
    std::vector<uint8_t *> units;
    uint8_t *raw;
    CK(cudaMalloc(&raw, raw_bytes));
    for (int k = 0; k < ncopy; k++) {
        fill<<<2048, 256>>>(raw, raw_bytes, seed + k);
        uint8_t *u;
        CK(cudaMalloc(&u, ubytes));
        const size_t nt = (size_t)rows / 16 * nb * 8;
        repack<<<(unsigned)((nt + 255) / 256), 256>>>(raw, u, rows, nb);
        CK(cudaGetLastError());
        units.push_back(u);
    }
    CK(cudaDeviceSynchronize());
    CK(cudaFree(raw));
    return units;
}

/* The buffers of one shape: 16 rows of x (host hx, device x), in mmi's layout (xq, written here)
 * and one row of it (xq1), the outputs y [16][rows] and y1 [rows], and the engine's x layouts
 * (xe1: one row, xed: 16 rows; the caller writes them) */
struct mmi_bufs {
    std::vector<float> hx;
    float *x, *y, *y1;
    uint8_t *xq, *xq1, *xe1, *xed;
};
static inline mmi_bufs mmi_bufs_new(uint32_t rows, uint32_t cols, size_t xe1_bytes, size_t xed_bytes)
{
    const uint32_t NX = 16, nb = cols / 256;
    mmi_bufs b;
    b.hx = kq4_x_rows(NX, cols);
    CK(cudaMalloc(&b.x, (size_t)NX * cols * 4));
    CK(cudaMalloc(&b.y, (size_t)NX * rows * 4));
    CK(cudaMalloc(&b.y1, (size_t)rows * 4));
    CK(cudaMalloc(&b.xq, (size_t)NX * nb * MMI_XBLK));
    CK(cudaMalloc(&b.xq1, (size_t)nb * MMI_XBLK));
    CK(cudaMalloc(&b.xe1, xe1_bytes));
    CK(cudaMalloc(&b.xed, xed_bytes));
    CK(cudaMemcpy(b.x, b.hx.data(), b.hx.size() * 4, cudaMemcpyHostToDevice));
    mmi_prep<<<(NX * nb * 32 + 255) / 256, 256>>>(b.x, cols, NX, b.xq);
    CK(cudaGetLastError());
    return b;
}
static inline void mmi_bufs_free(mmi_bufs &b)
{
    for (void *p : {(void *)b.x, (void *)b.y, (void *)b.y1, (void *)b.xq, (void *)b.xq1, (void *)b.xe1, (void *)b.xed})
        CK(cudaFree(p));
}

/* ---- the workbenches' check and timing ------------------------------------------------------- */
struct mmi_vinfo {
    const char *name;
    uint32_t most; /* the x rows the kernel takes (2 per n-tile and column group) */
    int kw;        /* its block split: a row's bytes depend on it, never on the kernel */
};
/* Per block split KW, its 16-row kernel against f64 (< 1e-6 of max |y|); every row alone and rows
 * together in every kernel of that KW: the same bytes as that 16-row kernel; then the engine's
 * kernels (engine(copy, n, y)) and each variant (launch(i, copy, x, n, y)) timed at 1, 4, 8, 16
 * rows, on B's buffers. Returns the failed checks. */
template <class Launch, class Engine>
static int mmi_check_and_time(const kb_qmat &ref, uint32_t rows, uint32_t cols, size_t ubytes, int ncopy, int reps,
                              double ceil_gbs, const std::vector<mmi_vinfo> &vars, const mmi_bufs &B, const char *engine_name,
                              Launch &&launch, Engine &&engine)
{
    const std::vector<float> &hx = B.hx;
    const uint8_t *xq = B.xq;
    uint8_t *xq1 = B.xq1;
    float *y = B.y, *y1 = B.y1;
    const uint32_t NX = 16, nb = cols / 256;
    const int nv = (int)vars.size();
    int fails = 0;
    std::vector<float> h1(rows), hv((size_t)NX * rows);
    std::vector<int> ref_kw;
    std::vector<std::vector<float>> ref_y;
    auto worst_of = [&](const std::vector<float> &h) {
        double w = 0;
        for (uint32_t r = 0; r < NX; r++) {
            const std::vector<double> rr = kb_reference(ref, hx.data() + (size_t)r * cols);
            const std::vector<float> hy(h.begin() + (size_t)r * rows, h.begin() + (size_t)(r + 1) * rows);
            const kb_errs e = kb_check(ref, rr, hy, NULL);
            w = e.max < 0 ? 1e30 : std::max(w, e.max);
        }
        return w;
    };
    double worst = 0;
    for (int vi = 0; vi < nv; vi++) {
        if (vars[vi].most != NX || std::find(ref_kw.begin(), ref_kw.end(), vars[vi].kw) != ref_kw.end()) continue;
        std::vector<float> h((size_t)NX * rows);
        launch(vi, 0, xq, NX, y);
        CK(cudaDeviceSynchronize());
        CK(cudaMemcpy(h.data(), y, h.size() * 4, cudaMemcpyDeviceToHost));
        worst = std::max(worst, worst_of(h));
        ref_kw.push_back(vars[vi].kw);
        ref_y.push_back(h);
    }
    auto ref_of = [&](int kw) -> const std::vector<float> & {
        return ref_y[std::find(ref_kw.begin(), ref_kw.end(), kw) - ref_kw.begin()];
    };
    engine(0, NX, y);
    CK(cudaDeviceSynchronize());
    CK(cudaMemcpy(hv.data(), y, hv.size() * 4, cudaMemcpyDeviceToHost));
    printf("  vs f64: max |dy| / max |y| %.2e over 16 rows, %zu block splits (x 2^-8 .. 2^7, a 300x outlier a row); "
           "the engine's %s %.2e\n", worst, ref_kw.size(), engine_name, worst_of(hv));
    if (!(worst < 1e-6)) {
        printf("  FAIL: error above 1e-6\n");
        fails++;
    }
    int mism = 0, cmp = 0;
    for (uint32_t r = 0; r < NX; r++) {
        CK(cudaMemcpy(xq1, xq + (size_t)r * nb * MMI_XBLK, (size_t)nb * MMI_XBLK, cudaMemcpyDeviceToDevice));
        for (int vi = 0; vi < nv; vi++) {
            if (vars[vi].most > 2 && r % 5) continue; /* the one-row kernels on every row, the others on some */
            CK(cudaMemset(y1, 0xFF, rows * 4));
            launch(vi, 0, xq1, 1, y1);
            CK(cudaDeviceSynchronize());
            CK(cudaMemcpy(h1.data(), y1, rows * 4, cudaMemcpyDeviceToHost));
            cmp++;
            if (memcmp(h1.data(), ref_of(vars[vi].kw).data() + (size_t)r * rows, rows * 4)) {
                if (mism < 4) printf("  row %u alone (%s) is not its bytes among 16\n", r, vars[vi].name);
                mism++;
            }
        }
    }
    for (int vi = 0; vi < nv; vi++) {
        const uint32_t n = std::min(NX, vars[vi].most);
        CK(cudaMemset(y, 0xFF, (size_t)NX * rows * 4));
        launch(vi, 0, xq, n, y);
        CK(cudaDeviceSynchronize());
        CK(cudaMemcpy(hv.data(), y, (size_t)n * rows * 4, cudaMemcpyDeviceToHost));
        cmp++;
        if (memcmp(hv.data(), ref_of(vars[vi].kw).data(), (size_t)n * rows * 4)) {
            printf("  %s, %u rows: not the bytes of the 16-row kernel of its KW\n", vars[vi].name, n);
            mism++;
        }
    }
    printf("  row invariance: %d mismatches in %d comparisons (rows alone in every kernel, 2..16 rows together)\n", mism,
           cmp);
    if (mism) fails++;
    printf("  %-34s %5s %8s %8s %7s\n", "kernel", "rows", "us", "GB/s", "% read");
    const uint32_t nxs[4] = {1, 4, 8, 16};
    for (int k = 0; k < 4; k++) {
        const uint32_t n = nxs[k];
        const float ms = kb_time_launches([&](int c) { engine(c, n, y); }, ncopy, reps);
        printf("  %-34s %5u %8.1f %8.1f %6.1f%%\n", engine_name, n, ms * 1e3, ref.bytes / (ms * 1e-3) / 1e9,
               100 * ref.bytes / (ms * 1e-3) / 1e9 / ceil_gbs);
    }
    for (int vi = 0; vi < nv; vi++)
        for (int k = 0; k < 4; k++) {
            const uint32_t n = nxs[k], most = vars[vi].most;
            if (n > most || (most > 2 && n <= most / 2)) continue;
            const float ms = kb_time_launches([&](int c) { launch(vi, c, xq, n, y); }, ncopy, reps);
            printf("  %-34s %5u %8.1f %8.1f %6.1f%%\n", vars[vi].name, n, ms * 1e3, ubytes / (ms * 1e-3) / 1e9,
                   100 * ubytes / (ms * 1e-3) / 1e9 / ceil_gbs);
        }
    return fails;
}

#endif
