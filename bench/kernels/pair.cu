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
 * make the bytes independent of the kernel shape, so any difference is a defect. */
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
    printf("row bytes, 16 rows against each alone: %u of %u rows differ; %u non-finite outputs\n", bad, NX, nonfinite);
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
    return bad || nonfinite ? 1 : 0;
}
