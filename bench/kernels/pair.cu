/* pair.cu — kbench_pair: the route's gate·up pair (src/cuda/mmi.cuh, mmi_pair_launch, the kernels
 * the decode and multi-row passes run) alone on Glimmer's shape, 2 × 19968 × 6656 Q4_K, so its
 * kernels can be changed and timed without a whole pass. kbench_mmi's contenders (bench/kernels/
 * mmi.cu) are the same arithmetic in other shapes; run both on one lease to compare.
 *
 *   kbench_pair [REPS]
 *
 * Per row count (1, 2, 3, 4, 8, 16): µs per launch (kb_time_launches: bursts of 8 on rotating
 * copies, the queue kept full as in the graph) and the weights' read at that time against the
 * streaming read. Then every row of the 16-row launch against its bytes alone (nx 1): the grid sums
 * make the bytes independent of the kernel shape, so any difference is a defect.
 *
 * Contenders for the multi-row kernel (mmi_pair_rows<NT, KW, MINB, NU> in other shapes than the
 * route picks) at 4, 8 and 16 rows, each timed beside the route's launch and its output compared
 * byte for byte with the route's at that row count. */
#include "cuda/mmi.cuh"

#include "kbench_q4k.cuh"

int main(int argc, char **argv)
{
    const int reps = argc > 1 ? atoi(argv[1]) : 9;
    const cudaDeviceProp prop = kb_device();
    const int n_sm = prop.multiProcessorCount;
    const double read_gbs = kb_read_ceiling(n_sm, kb_fill_q4k);
    const uint32_t rows = 19968, cols = 6656, nb = cols / 256, NX = 16;
    const size_t wbytes = (size_t)rows * nb * 144; /* one matrix as GGUF stores it */
    const int ncopy = kb_n_copy(2 * wbytes, 8);
    kb_qmat G, U;
    kb_make_qmat(G, GGML_TYPE_Q4_K, rows, cols, ncopy, 11, NULL, mmq_repack_q4k);
    kb_make_qmat(U, GGML_TYPE_Q4_K, rows, cols, ncopy, 211, NULL, mmq_repack_q4k);
    std::vector<uint8_t *> eg(ncopy), eu(ncopy);
    for (int k = 0; k < ncopy; k++) {
        CK(cudaMalloc(&eg[k], rows));
        CK(cudaMalloc(&eu[k], rows));
        mmi_rexp_kernel<<<(rows + 255) / 256, 256>>>(G.mm[k], rows, nb, eg[k]);
        mmi_rexp_kernel<<<(rows + 255) / 256, 256>>>(U.mm[k], rows, nb, eu[k]);
    }
    const std::vector<float> hx = kq4_x_rows(NX, cols);
    const uint32_t xs = (uint32_t)mmi_x_bytes(cols);
    float *dx, *y16, *y1;
    uint8_t *xm;
    CK(cudaMalloc(&dx, hx.size() * sizeof(float)));
    CK(cudaMalloc(&xm, (size_t)NX * xs));
    CK(cudaMalloc(&y16, (size_t)NX * rows * sizeof(float)));
    CK(cudaMalloc(&y1, (size_t)rows * sizeof(float)));
    CK(cudaMemcpy(dx, hx.data(), hx.size() * sizeof(float), cudaMemcpyHostToDevice));
    mmi_prep_launch(0, dx, xm, cols, false, NX, cols, xs);
    CK(cudaDeviceSynchronize());
    printf("gate·up pair, 2 × %u × %u Q4_K (%.1f MB of weights a launch), %d copies\n", rows, cols, 2 * wbytes / 1e6, ncopy);
    printf("%-6s %10s %10s %8s\n", "rows", "us", "GB/s", "of read");
    auto args = [&](int k, const uint8_t *x, uint32_t nx, float *out) {
        mmi_args A;
        memset(&A, 0, sizeof A);
        A.a = G.mm[k];
        A.b = U.mm[k];
        A.ea = eg[k];
        A.eb = eu[k];
        A.rows = rows;
        A.K = cols;
        A.x = x;
        A.xs = xs;
        A.nx = nx;
        A.out = out;
        A.os = rows;
        return A;
    };
    const uint32_t counts[] = {1, 2, 3, 4, 8, 16};
    for (uint32_t nx : counts) {
        const float ms = kb_time_launches([&](int k) { mmi_pair_launch(args(k, xm, nx, y16), n_sm, 0, false); }, ncopy, reps);
        const double gbs = 2 * wbytes / (ms * 1e-3) / 1e9;
        printf("%-6u %10.1f %10.1f %7.1f%%\n", nx, ms * 1e3, gbs, 100 * gbs / read_gbs);
    }
    /* the contenders: every row's bytes against the route's launch of the same rows */
    struct contender {
        const char *name;
        uint32_t nx;
        void (*launch)(const mmi_args &, cudaStream_t, bool);
    };
#define MMI_C(NX, NT, KW, MB, NU) {"NT " #NT " KW " #KW " " #MB "/SM NU " #NU, NX, mmi_rows_launch<NT, KW, MB, NU>}
    const contender cs[] = {MMI_C(4, 1, 4, 3, 1),  MMI_C(4, 2, 2, 2, 1),  MMI_C(4, 1, 2, 3, 1),  MMI_C(4, 2, 4, 2, 2),
                            MMI_C(8, 4, 2, 2, 1),  MMI_C(8, 2, 2, 2, 2),  MMI_C(8, 2, 2, 2, 1),  MMI_C(8, 2, 4, 2, 1),
                            MMI_C(16, 8, 2, 1, 1), MMI_C(16, 4, 1, 2, 1), MMI_C(16, 4, 4, 2, 1), MMI_C(16, 2, 2, 2, 2),
                            MMI_C(16, 2, 4, 2, 2), MMI_C(16, 4, 2, 1, 2), MMI_C(16, 2, 2, 3, 1), MMI_C(16, 2, 4, 3, 1)};
#undef MMI_C
    float *yr, *yc;
    CK(cudaMalloc(&yr, (size_t)NX * rows * sizeof(float)));
    CK(cudaMalloc(&yc, (size_t)NX * rows * sizeof(float)));
    std::vector<float> hr((size_t)NX * rows), hc((size_t)NX * rows);
    printf("\ncontenders (the route's launch at the same rows timed beside each)\n");
    printf("%-6s %-24s %10s %10s %8s %s\n", "rows", "kernel", "us", "route us", "ratio", "bytes");
    uint32_t cbad = 0;
    for (const contender &c : cs) {
        const float ms_c = kb_time_launches([&](int k) { c.launch(args(k, xm, c.nx, y16), 0, false); }, ncopy, reps);
        const float ms_r = kb_time_launches([&](int k) { mmi_pair_launch(args(k, xm, c.nx, y16), n_sm, 0, false); }, ncopy, reps);
        mmi_pair_launch(args(0, xm, c.nx, yr), n_sm, 0, false);
        c.launch(args(0, xm, c.nx, yc), 0, false);
        CK(cudaMemcpy(hr.data(), yr, (size_t)c.nx * rows * sizeof(float), cudaMemcpyDeviceToHost));
        CK(cudaMemcpy(hc.data(), yc, (size_t)c.nx * rows * sizeof(float), cudaMemcpyDeviceToHost));
        const bool same = !memcmp(hr.data(), hc.data(), (size_t)c.nx * rows * sizeof(float));
        cbad += !same;
        printf("%-6u %-24s %10.1f %10.1f %8.3f %s\n", c.nx, c.name, ms_c * 1e3, ms_r * 1e3, ms_c / ms_r, same ? "same" : "DIFFER");
    }
    CK(cudaFree(yr));
    CK(cudaFree(yc));
    /* row invariance: each row of a 16-row launch against the same row alone */
    mmi_pair_launch(args(0, xm, NX, y16), n_sm, 0, false);
    std::vector<float> h16((size_t)NX * rows), h1(rows);
    CK(cudaMemcpy(h16.data(), y16, h16.size() * sizeof(float), cudaMemcpyDeviceToHost));
    uint32_t bad = 0, nonfinite = 0;
    for (uint32_t r = 0; r < NX; r++) {
        mmi_pair_launch(args(0, xm + (size_t)r * xs, 1, y1), n_sm, 0, false);
        CK(cudaMemcpy(h1.data(), y1, rows * sizeof(float), cudaMemcpyDeviceToHost));
        if (memcmp(h1.data(), h16.data() + (size_t)r * rows, rows * sizeof(float))) bad++;
        for (uint32_t i = 0; i < rows; i++) nonfinite += !isfinite(h1[i]);
    }
    CK(cudaGetLastError());
    printf("row bytes, 16 rows against each alone: %u of %u rows differ; %u non-finite outputs; %u contenders differ\n", bad, NX,
           nonfinite, cbad);
    for (int k = 0; k < ncopy; k++) {
        CK(cudaFree(eg[k]));
        CK(cudaFree(eu[k]));
    }
    kb_free_qmat(G);
    kb_free_qmat(U);
    CK(cudaFree(dx));
    CK(cudaFree(xm));
    CK(cudaFree(y16));
    CK(cudaFree(y1));
    return bad || nonfinite || cbad ? 1 : 0;
}
