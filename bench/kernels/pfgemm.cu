/* pfgemm.cu — the prefill route's K-quant GEMM (src/cuda/prefill.cu, pf_gemm_kq) on Glimmer's
 * per-layer shapes at a 512-row chunk, beside the general path (unpack + three f16 products,
 * pf_gemm) on the same shapes. Random bytes in the tensor-core layouts (speed does not depend on
 * their values); the product kernels are compiled into this workbench from the tree's source.
 *   kbench_pfgemm [rows]     (default 512) prints ms and TFLOP/s per shape, one product counted
 *                            (2·n·M·K), median of 9 launches after a warm-up; the contenders
 *                            measured so far are in NOTES.md ("The prefill GEMM").
 * The warpgroup GEMM (pf_gemm_wg_n) runs beside it at 64 and 128 x rows a CTA: its error against
 * the K-quant GEMM (max |Δy| / max |y|), whether its rows' bytes are the same in both and with 5
 * rows in the call instead of n, and two variants that leave work out (one product of its three;
 * no f32 weights) to show what binds it. */
#include "cuda/prefill.cu"
#include "kbench.cuh"

#include <vector>

/* the mma.sync K-quant GEMM (pf_kq_kernel), the product's before the warpgroup GEMM */
static void pf_gemm_kq_mma(cudaStream_t st, const __half *xh, const __half *xl, const __half *xsh, const __half *xsl,
                           const float *rs, uint32_t n, const mv_mat *w, float *y, uint64_t ldy)
{
    pf_gemm_kq_mma_n(st, xh, xl, xsh, xsl, rs, n, w, 1, &y, &ldy, MV_OP_STORE, 1.f, 0.f);
}

static __global__ void pfb_fill(uint8_t *p, size_t n, uint32_t seed, uint32_t unit, uint32_t hoff)
{
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        uint32_t v = kb_hash32(i, seed);
        /* f16 d fields of a unit's header: a small normal value, not NaN/Inf */
        if ((i % unit) >= hoff) v = (v & 0x03FFu) | 0x2000u;
        p[i] = (uint8_t)v;
    }
}

/* the L2 → SM read ceiling: every CTA reads the same `bytes` (held in L2) in 16-byte loads */
static __global__ void pfb_l2_read(const uint4 *__restrict__ p, size_t n16, uint32_t reps, uint32_t *sink)
{
    uint32_t acc = 0;
    for (uint32_t r = 0; r < reps; r++)
        for (size_t i = ((size_t)blockIdx.x * blockDim.x + threadIdx.x + r * 7919u) % n16, k = 0; k < n16 / gridDim.x;
             k += blockDim.x, i = (i + (size_t)gridDim.x * blockDim.x) % n16) {
            const uint4 v = __ldcg(p + i);
            acc ^= v.x ^ v.y ^ v.z ^ v.w;
        }
    if (acc == 0x9E3779B9u) *sink = acc;
}

int main(int argc, char **argv)
{
    const uint32_t n = argc > 1 ? (uint32_t)atoi(argv[1]) : 512;
    kb_device();
    struct shape { const char *name; uint32_t M, K; bool q6; } shapes[] = {
        {"q 6656->4096", 4096, 6656, false},   {"k 6656->256", 256, 6656, false},
        {"v 6656->256 (q6)", 256, 6656, true}, {"o 4096->6656", 6656, 4096, false},
        {"gate 6656->19968", 19968, 6656, false}, {"down 19968->6656 (q6)", 6656, 19968, true},
        {"head 6656->202048 (q6)", 202048, 6656, true}, {"q+k+gate 6656->8448", 8448, 6656, false}};
    const uint32_t Kmax = 19968, Mmax = 202048;
    float *x, *y, *rs;
    __half *xh, *xl, *xsh, *xsl, *wh, *wl;
    uint8_t *w;
    const size_t wbytes = (size_t)Mmax / 16 * (6656 / 256) * MMQ6_UNIT;
    CK(cudaMalloc(&x, (size_t)n * Kmax * 4));
    CK(cudaMalloc(&y, (size_t)n * Mmax * 4));
    CK(cudaMalloc(&rs, n * 4));
    CK(cudaMalloc(&xh, (size_t)n * Kmax * 2));
    CK(cudaMalloc(&xl, (size_t)n * Kmax * 2));
    CK(cudaMalloc(&xsh, (size_t)n * Kmax / 32 * 2));
    CK(cudaMalloc(&xsl, (size_t)n * Kmax / 32 * 2));
    CK(cudaMalloc(&wh, (size_t)19968 * 6656 * 2));
    CK(cudaMalloc(&wl, (size_t)19968 * 6656 * 2));
    CK(cudaMalloc(&w, wbytes));
    kb_fill_x<<<(unsigned)(((size_t)n * Kmax + 255) / 256), 256>>>(x, n * Kmax, 7u);
    CK(cudaDeviceSynchronize());
    {
        /* L2 ceiling: 16 MB read 64 times over by 264 CTAs of 512 threads */
        const size_t bytes = (size_t)16 << 20;
        uint32_t *sink;
        CK(cudaMalloc(&sink, 4));
        cudaEvent_t a, b;
        CK(cudaEventCreate(&a));
        CK(cudaEventCreate(&b));
        const double ms = kb_median_ms(5, 1, a, b, [&] { pfb_l2_read<<<264, 512>>>((const uint4 *)x, bytes / 16, 64, sink); });
        CK(cudaGetLastError());
        printf("L2 read ceiling: %.0f GB/s (16 MB held in L2, read 64 times by 264 CTAs)\n", bytes * 64.0 / ms / 1e6);
    }
    printf("prefill GEMM, %u rows; TFLOP/s counts one product (2·n·M·K)\n", n);
    printf("%-24s %9s %9s %9s %9s %9s %9s %9s %9s %9s %9s\n", "shape", "kq ms", "kq TF/s", "gen ms", "gen TF/s", "wg64 ms",
           "wg128 ms", "wg TF/s", "wg err", "1prod ms", "nosplit");
    float *y2, *y3;
    CK(cudaMalloc(&y2, (size_t)n * Mmax * 4));
    CK(cudaMalloc(&y3, (size_t)n * Mmax * 4));
    std::vector<float> h1, h2;
    int bad_bytes = 0;
    for (const shape &s : shapes) {
        const uint32_t unit = s.q6 ? MMQ6_UNIT : MMQ_UNIT;
        pfb_fill<<<1024, 256>>>(w, (size_t)s.M / 16 * (s.K / 256) * unit, 11u, unit, s.q6 ? MMQ6_D : 2048);
        mv_mat m;
        m.data = w;
        m.type = s.q6 ? MV_T_Q6_KT : MV_T_Q4_KT;
        m.rows = s.M;
        m.cols = s.K;
        pf_split_kq(0, x, s.K, n, s.K, s.q6, xh, xl, xsh, xsl, rs);
        cudaEvent_t a, b;
        CK(cudaEventCreate(&a));
        CK(cudaEventCreate(&b));
        const double kq = kb_median_ms(10, 1, a, b, [&] { pf_gemm_kq_mma(0, xh, xl, xsh, xsl, rs, n, &m, y, s.M); });
        const double fl = 2.0 * n * s.M * s.K;
        double gen = 0;
        if ((size_t)s.M * s.K <= (size_t)19968 * 6656) {
            pf_split_x(0, x, s.K, n, s.K, xh, xl, rs);
            gen = kb_median_ms(4, 1, a, b, [&] {
                pf_unpack_w(0, &m, 0, s.M, wh, wl);
                pf_gemm(0, xh, xl, rs, n, wh, wl, s.M, s.K, y, s.M, MV_OP_STORE, 1.f, 0.f);
            });
        }
        CK(cudaGetLastError());
        /* the warpgroup GEMM: 64 and 128 x rows a CTA (the bytes of each row compared), then the 128
         * variant leaving work out: one product of three, no f32 weights (times only) */
        pf_split_kq(0, x, s.K, n, s.K, s.q6, xh, xl, xsh, xsl, rs);
        pf_gemm_kq_mma(0, xh, xl, xsh, xsl, rs, n, &m, y, s.M);
        const uint64_t ldy = s.M;
        const pf_kq_args WA2 = wg_args(xh, xl, rs, n, &m, 1, &y2, &ldy, MV_OP_STORE, 1.f, 0.f);
        const pf_kq_args WA3 = wg_args(xh, xl, rs, n, &m, 1, &y3, &ldy, MV_OP_STORE, 1.f, 0.f);
        double wgt[4];
        wgt[0] = kb_median_ms(10, 1, a, b, [&] { s.q6 ? wg_launch<true, 64>(0, WA3) : wg_launch<false, 64>(0, WA3); });
        wgt[1] = kb_median_ms(10, 1, a, b, [&] { s.q6 ? wg_launch<true, 128>(0, WA2) : wg_launch<false, 128>(0, WA2); });
        CK(cudaDeviceSynchronize());
        CK(cudaGetLastError());
        h1.resize((size_t)n * s.M);
        h2.resize((size_t)n * s.M);
        CK(cudaMemcpy(h1.data(), y2, h1.size() * 4, cudaMemcpyDeviceToHost));
        CK(cudaMemcpy(h2.data(), y3, h2.size() * 4, cudaMemcpyDeviceToHost));
        if (memcmp(h1.data(), h2.data(), h1.size() * 4)) bad_bytes++, printf("  MISMATCH 64 vs 128\n");
        wgt[2] = kb_median_ms(10, 1, a, b, [&] { s.q6 ? wg_launch<true, 128, 1>(0, WA3) : wg_launch<false, 128, 1>(0, WA3); });
        wgt[3] = kb_median_ms(10, 1, a, b, [&] { s.q6 ? wg_launch<true, 128, 2>(0, WA3) : wg_launch<false, 128, 2>(0, WA3); });
        CK(cudaGetLastError());
        /* 5 rows in the call */
        {
            const uint32_t n5 = n < 5 ? n : 5;
            CK(cudaMemset(y3, 0xFF, (size_t)n * s.M * 4));
            pf_gemm_wg_n(0, xh, xl, rs, n5, &m, 1, &y3, &ldy, MV_OP_STORE, 1.f, 0.f, 128);
            std::vector<float> t((size_t)n5 * s.M);
            CK(cudaMemcpy(t.data(), y3, t.size() * 4, cudaMemcpyDeviceToHost));
            if (memcmp(t.data(), h1.data(), t.size() * 4)) bad_bytes++, printf("  MISMATCH 5 rows vs %u\n", n);
        }
        double err = 0, ymax = 0;
        {
            std::vector<float> r((size_t)n * s.M);
            CK(cudaMemcpy(r.data(), y, r.size() * 4, cudaMemcpyDeviceToHost));
            for (size_t i = 0; i < r.size(); i++) {
                ymax = fmax(ymax, fabs(r[i]));
                const double d = fabs((double)r[i] - h1[i]);
                err = d > err || d != d ? d : err;
            }
        }
        const double wbest = fmin(wgt[0], wgt[1]);
        printf("%-24s %9.3f %9.1f %9.3f %9.1f %9.3f %9.3f %9.1f %9.2e %9.3f %9.3f\n", s.name, kq, fl / kq / 1e9, gen,
               gen ? fl / gen / 1e9 : 0.0, wgt[0], wgt[1], fl / wbest / 1e9, err / ymax, wgt[2], wgt[3]);
    }
    printf("warpgroup GEMM bytes: %s\n", bad_bytes ? "MISMATCH" : "every variant and 5 rows the same");
    return bad_bytes ? 1 : 0;
}
