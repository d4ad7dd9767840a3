/* mpp.cuh — the workbench's persistent gate·up pair on mmq's arithmetic (kbench_persist).
 *
 * It was the route's one-row gate·up pair until the pair moved to exact integers per block on a
 * grid (src/cuda/mmi.cuh, whose mmi_pair_persist keeps this kernel's CTA shape and walk); kept here
 * as the reference the persistent-layer experiments (persist.cu) are measured against. */
#ifndef MUSER_BENCH_MPP_CUH
#define MUSER_BENCH_MPP_CUH

#include "cuda/mmq.cuh"

/* ---- the gate·up pair, persistent ------------------------------------------------------------ */
/* MPP_CTAS_PER_SM CTAs per SM, each owning a contiguous range of whole tiles (kbench_stream's
 * "pair-units, whole tiles per CTA": 89% of the streaming read against 75% for the warp sets).
 * Items are (tile, block) in tile-major order; warp w of the CTA takes items u0 + w, u0 + w + 8, …,
 * each the gate and up units of one block through mmq_block<2> (x loaded once for both). A lane
 * adds each block's f32 result to an f64 sum per (tile, row); when its next item is in another
 * tile it stores the 4-lane f64 sums of the last one in shared memory; the epilogue sums the 8
 * warps per tile in warp order. The split of tiles over CTAs depends only on the tile count and
 * the grid, so replays are bit-identical. */
#define MPP_CTAS_PER_SM 2
/* A warp's sums of one tile (gate r = 0, up r = 1) into its 32 shared-memory slots, then zeroed. */
__device__ __forceinline__ void mpp_flush(double sum[2][2], double *dst, uint32_t lane)
{
#pragma unroll
    for (int r = 0; r < 2; r++) {
        mmq_rows_f64(sum[r][0], sum[r][1], dst + 16 * r, lane);
        sum[r][0] = sum[r][1] = 0;
    }
}
/* The persistent pair's end: per output (x row n < nx, tile t0 + tl, row) the gate and up sums of
 * the 8 warps added in warp order in f64 from red ([tiles][NX rows][8 warps][32]: gate rows 0-15,
 * up rows 16-31), then silu(g)·u on the f32 matvec results, as mmq_kernel; A.out moved to the
 * CTA's row group (mmq_group). mpp_body and mmqd.cuh's dense body share it. */
template <int NX>
__device__ __forceinline__ void mpp_epilogue(const mmq_args &A, const double *red, uint32_t t0, uint32_t t1, uint32_t nx)
{
    for (uint32_t i = threadIdx.x; i < (t1 - t0) * 16 * nx; i += blockDim.x) {
        const uint32_t n = i / ((t1 - t0) * 16), tl = i % ((t1 - t0) * 16) / 16, row16 = i % 16;
        double ys = 0, us = 0;
        for (int w = 0; w < 8; w++) {
            ys += red[((tl * NX + n) * 8 + w) * 32 + row16];
            us += red[((tl * NX + n) * 8 + w) * 32 + 16 + row16];
        }
        float y = (float)ys;
        const float uu = (float)us;
        y = y / (1.f + expf(-y)) * uu;
        A.out[(size_t)n * A.os + (size_t)(t0 + tl) * 16 + row16] = y;
    }
}
/* CTA cta of a grid of `grid`; mpp_red: [tiles of this CTA][NX rows][8 warps][32] doubles of shared
 * memory (gate rows 0-15, up rows 0-15); wait: as mmq_body's; grp: the row group (mmq_group). */
template <typename Wait = mmq_pdl_wait, int NX = 1>
__device__ __forceinline__ void mpp_body(const mmq_args &A0, uint32_t cta, uint32_t grid, double *mpp_red, Wait wait = Wait(),
                                         uint32_t grp = 0)
{
    cu_pdl_trigger();
    mmq_args A = A0;
    const uint32_t nx = mmq_group<mmq_args, NX>(A, grp);
    const uint32_t wid = threadIdx.x >> 5, lane = threadIdx.x & 31, nb = A.K / 256, ntile = A.rows / 16;
    const uint32_t t0 = (uint32_t)((uint64_t)cta * ntile / grid);
    const uint32_t t1 = (uint32_t)((uint64_t)(cta + 1) * ntile / grid);
    const uint32_t u1 = t1 * nb;
    uint32_t u = t0 * nb + wid;
    mmq_w W[2]; /* the first item's weights are in flight while the sums are zeroed */
    if (u < u1) {
        mmq_load(A.a + (size_t)u * MMQ_UNIT, lane, W[0]);
        mmq_load(A.b + (size_t)u * MMQ_UNIT, lane, W[1]);
    }
    for (uint32_t i = threadIdx.x; i < (t1 - t0) * 256 * NX; i += blockDim.x) mpp_red[i] = 0;
    __syncthreads();
    uint32_t key = 0xFFFFFFFFu;
    double sum[NX][2][2];
#pragma unroll
    for (int n = 0; n < NX; n++) sum[n][0][0] = sum[n][0][1] = sum[n][1][0] = sum[n][1][1] = 0;
    wait();
    for (; u < u1; u += 8) {
        const uint32_t tile = u / nb, b = u - tile * nb;
        if (tile != key) {
            if (key != 0xFFFFFFFFu)
#pragma unroll
                for (int n = 0; n < NX; n++) mpp_flush(sum[n], mpp_red + (((key - t0) * NX + n) * 8 + wid) * 32, lane);
            key = tile;
        }
        float acc[NX][2][2];
#pragma unroll
        for (int n = 0; n < NX; n++) acc[n][0][0] = acc[n][0][1] = acc[n][1][0] = acc[n][1][1] = 0.f;
        mmq_block_rows<2, NX>(W, A.x + (size_t)b * MMQ_XBLK, A.xs, nx, lane, acc);
#pragma unroll
        for (int n = 0; n < NX; n++)
#pragma unroll
            for (int r = 0; r < 2; r++)
#pragma unroll
                for (int h = 0; h < 2; h++) sum[n][r][h] += (double)acc[n][r][h];
        if (u + 8 < u1) { /* the next item's weights, in flight through the next turn's flush */
            mmq_load(A.a + (size_t)(u + 8) * MMQ_UNIT, lane, W[0]);
            mmq_load(A.b + (size_t)(u + 8) * MMQ_UNIT, lane, W[1]);
        }
    }
    if (key != 0xFFFFFFFFu)
#pragma unroll
        for (int n = 0; n < NX; n++) mpp_flush(sum[n], mpp_red + (((key - t0) * NX + n) * 8 + wid) * 32, lane);
    __syncthreads();
    mpp_epilogue<NX>(A, mpp_red, t0, t1, nx);
}
/* grid: the tile split's CTA count (n_sm · MPP_CTAS_PER_SM), the same for every row count, so a
 * row's sums run over the same blocks in every pass; the launch has grid · ng blocks (mmq_cta). */
template <int NX>
static __global__ void __launch_bounds__(256, NX >= 2 ? 1 : MPP_CTAS_PER_SM) mmq_pair_persist(const mmq_args A, uint32_t grid)
{
    CU_TL_SCOPE(TL_MMQ_PAIR);
    extern __shared__ double mpp_red[];
    mpp_body<mmq_pdl_wait, NX>(A, mmq_cta(A.ng), grid, mpp_red, mmq_pdl_wait(), mmq_grp(A.ng));
}

/* false (nothing launched) when a CTA's tiles would need more shared memory than a block gets */
static inline bool mmq_pair_persist_launch(const mmq_args &A0, int n_sm, cudaStream_t st, bool pdl)
{
    const uint32_t ntile = A0.rows / 16, grid = (uint32_t)n_sm * MPP_CTAS_PER_SM, NXL = mmq_nx_of(A0.nx);
    const uint32_t most = (ntile + grid - 1) / grid; /* tiles of the largest CTA range */
    const size_t smem = (size_t)most * 256 * NXL * sizeof(double);
    if (smem > (NXL == 1 ? 48 : 112) * 1024) return false;
    mmq_args A = A0;
    A.ng = (A.nx <= 1 ? 1 : A.nx + NXL - 1) / NXL;
    cudaLaunchAttribute at[1];
    cudaLaunchConfig_t cfg = cu_pdl_cfg(dim3(grid * A.ng), dim3(256), st, pdl, at);
    cfg.dynamicSmemBytes = smem;
    if (NXL == 1) cudaLaunchKernelEx(&cfg, mmq_pair_persist<1>, A, grid);
    else if (NXL == 2) {
        cudaFuncSetAttribute(mmq_pair_persist<2>, cudaFuncAttributeMaxDynamicSharedMemorySize, 112 * 1024);
        cudaLaunchKernelEx(&cfg, mmq_pair_persist<2>, A, grid);
    } else {
        cudaFuncSetAttribute(mmq_pair_persist<4>, cudaFuncAttributeMaxDynamicSharedMemorySize, 112 * 1024);
        cudaLaunchKernelEx(&cfg, mmq_pair_persist<4>, A, grid);
    }
    return true;
}

#endif
