/* kbench_q4k.cuh — what the Q4_K multi-row workbenches (mmh.cu, mmi.cu) share: raw GGUF Q4_K
 * block accessors for their repacks, the f16 helpers, the x rows they test with, and the engine's
 * kernels as the baseline beside theirs. */
#ifndef MUSER_KBENCH_Q4K_CUH
#define MUSER_KBENCH_Q4K_CUH

#include "cuda/mmqd.cuh"

#include "kbench.cuh"

/* A repack thread's item (one thread per (16-row tile, block, row pair g)): g, the raw blocks of
 * rows g and g + 8 (blk_bytes each) and the unit it writes; false past the matrix's end */
__device__ __forceinline__ bool kq_repack_item(const uint8_t *raw, uint8_t *dst, uint32_t rows, uint32_t nb,
                                               uint32_t blk_bytes, uint32_t unit_bytes, uint32_t &g, const uint8_t *rw[2],
                                               uint8_t *&u)
{
    const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (size_t)rows / 16 * nb * 8) return false;
    g = (uint32_t)(i & 7);
    const uint32_t b = (uint32_t)((i >> 3) % nb), T = (uint32_t)((i >> 3) / nb);
    rw[0] = raw + ((size_t)(16 * T + g) * nb + b) * blk_bytes;
    rw[1] = raw + ((size_t)(16 * T + g + 8) * nb + b) * blk_bytes;
    u = dst + ((size_t)T * nb + b) * unit_bytes;
    return true;
}

/* sub-block j's 6-bit scale s and min m from a raw Q4_K block's 12 scale bytes sc */
__device__ __forceinline__ void kq4_scale_min(const uint8_t *sc, int j, int &s, int &m)
{
    if (j < 4) {
        s = sc[j] & 63;
        m = sc[j + 4] & 63;
    } else {
        s = (sc[j + 4] & 0xF) | ((sc[j - 4] >> 6) << 4);
        m = (sc[j + 4] >> 4) | ((sc[j] >> 6) << 4);
    }
}
/* the 4-bit q at position p of a raw Q4_K block (144 bytes) */
__device__ __forceinline__ uint32_t kq4_q(const uint8_t *blk, int p)
{
    const int c = p >> 6, l = p & 63;
    const uint8_t byte = blk[16 + 32 * c + (l & 31)];
    return l < 32 ? byte & 15 : byte >> 4;
}

__device__ __forceinline__ uint32_t kq4_h2u(__half2 h) { return *(uint32_t *)&h; }
__device__ __forceinline__ __half2 kq4_u2h(uint32_t u) { return *(__half2 *)&u; }
/* bytes b0, b1 of w (selector nibbles) as the f16 pair (w.b0, w.b1), exactly */
__device__ __forceinline__ __half2 kq4_bytes_h2(uint32_t w, uint32_t sel)
{
    return __hsub2(kq4_u2h(__byte_perm(w, 0x64646464u, sel)), kq4_u2h(0x64006400u));
}
/* sub-block i's sum f as two f16 pieces (hi, f − hi) into the min term's B layout at dst:
 * [piece][t][2 halves], sub-blocks 2t, 2t+1 a pair */
__device__ __forceinline__ void kq4_sum_pieces(uint8_t *dst, int i, float f)
{
    const __half hi = __float2half_rn(f), lo = __float2half_rn(f - __half2float(hi));
    __half *sp = (__half *)dst;
    sp[(0 * 4 + (i >> 1)) * 2 + (i & 1)] = hi;
    sp[(1 * 4 + (i >> 1)) * 2 + (i & 1)] = lo;
}
/* mma m16n8k8, f16 in, f32 accumulate */
__device__ __forceinline__ void kq4_mma8(float c[4], uint32_t a0, uint32_t a1, uint32_t b0)
{
    asm volatile("mma.sync.aligned.m16n8k8.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5}, {%6}, {%0,%1,%2,%3};"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a0), "r"(a1), "r"(b0));
}

/* Glimmer's Q4_K shapes (rows × cols): ffn_gate (26 blocks a row), ffn_down's shape as Q4_K,
 * attn_output (16 blocks) and attn_q */
static const uint32_t kq4_shapes[4][2] = {{19968, 6656}, {6656, 19968}, {6656, 4096}, {4096, 6656}};

/* nx rows of cols: uniform [-1, 1) with one 300x outlier per row, row r scaled by 2^(r - 8) */
static inline std::vector<float> kq4_x_rows(uint32_t nx, uint32_t cols)
{
    std::vector<float> hx((size_t)nx * cols);
    for (uint32_t r = 0; r < nx; r++)
        for (uint32_t c = 0; c < cols; c++) {
            const uint32_t h = (uint32_t)((r * 7919u + c) * 2654435761u);
            float v = (float)((int)(h >> 8) % 200001 - 100000) / 100000.f;
            if (c == (r * 997u) % cols) v *= 300.f;
            hx[(size_t)r * cols + c] = ldexpf(v, (int)r - 8);
        }
    return hx;
}

/* The engine's arguments for y = kt·x on a Q4_KT matrix kt: one row (nx ≤ 1) x in mmq's layout, more
 * rows x in mmqd's (nx rows, mmqd_x_bytes(cols) apart), outputs rows apart */
static inline mmq_args kq4_args(const uint8_t *kt, uint32_t rows, uint32_t cols, const uint8_t *x, uint32_t nx, float *y)
{
    mmq_args A;
    memset(&A, 0, sizeof A);
    A.a = kt;
    A.rows = rows;
    A.K = cols;
    A.out = y;
    A.op = MV_OP_STORE;
    A.x = x;
    if (nx > 1) {
        A.nx = nx;
        A.xs = (uint32_t)mmqd_x_bytes(cols);
        A.os = rows;
    }
    return A;
}

/* the engine's kernels on a Q4_KT matrix kt: one row mmq_launch_auto (x xe1 in mmq's layout), more
 * rows mmqd_launch_auto (xed in mmqd's) */
static inline void kq4_engine(const uint8_t *kt, uint32_t rows, uint32_t cols, const uint8_t *xe1, const uint8_t *xed,
                              uint32_t nx, float *y)
{
    const mmq_args A = kq4_args(kt, rows, cols, nx <= 1 ? xe1 : xed, nx, y);
    if (nx <= 1) mmq_launch_auto(A, false, 0, false, 132);
    else mmqd_launch_auto(A, 0, false);
}

#endif
