/* pfgemm.cu — the prefill route's K-quant GEMM (src/cuda/prefill.cu, pf_gemm_kq) on Glimmer's
 * per-layer shapes at a 512-row chunk, beside the general path (unpack + three f16 products,
 * pf_gemm) on the same shapes. Random bytes in the tensor-core layouts (speed does not depend on
 * their values); the product kernels are compiled into this workbench from the tree's source.
 *   kbench_pfgemm [rows]     (default 512) prints ms and TFLOP/s per shape, one product counted
 *                            (2·n·M·K), median of 9 launches after a warm-up; the contenders
 *                            measured so far are in NOTES.md ("The prefill GEMM"). */
#include "cuda/prefill.cu"
#include "kbench.cuh"

static __global__ void pfb_fill(uint8_t *p, size_t n, uint32_t seed, uint32_t unit, uint32_t hoff)
{
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        uint32_t v = kb_hash32(i, seed);
        /* f16 d fields of a unit's header: a small normal value, not NaN/Inf */
        if ((i % unit) >= hoff) v = (v & 0x03FFu) | 0x2000u;
        p[i] = (uint8_t)v;
    }
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
    printf("prefill GEMM, %u rows; TFLOP/s counts one product (2·n·M·K)\n", n);
    printf("%-24s %9s %9s %9s %9s\n", "shape", "kq ms", "kq TF/s", "gen ms", "gen TF/s");
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
        const double kq = kb_median_ms(10, 1, a, b, [&] { pf_gemm_kq(0, xh, xl, xsh, xsl, rs, n, &m, y, s.M, MV_OP_STORE, 1.f, 0.f); });
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
        printf("%-24s %9.3f %9.1f %9.3f %9.1f\n", s.name, kq, fl / kq / 1e9, gen, gen ? fl / gen / 1e9 : 0.0);
    }
    return 0;
}
