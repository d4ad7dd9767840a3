/* pfgemm.cu — the prefill route's K-quant GEMM (src/cuda/prefill.cu: pf_gemm_kq, the warpgroup
 * GEMM) on Glimmer's per-layer shapes at a 512-row chunk, beside its contenders: the mma.sync
 * K-quant GEMM it replaced (below: two f16 products of exact integer weights, a fold per block or
 * 16-group) and the general path (unpack + three f16 products, pf_gemm). Random bytes in the
 * tensor-core layouts (speed does not depend on their values); the product kernels are compiled into
 * this workbench from the tree's source.
 *   kbench_pfgemm [rows]     (default 512) prints ms and TFLOP/s per shape, one product counted
 *                            (2·n·M·K), median of 9 launches after a warm-up; the contenders
 *                            measured so far are in NOTES.md ("The prefill GEMM").
 * The warpgroup GEMM runs as the product calls it (K split per wg_nsplit) and unsplit at 64 and
 * 128 x rows a CTA, and two variants that leave work out (one product of its three; no f32
 * weights) to show what binds it. Checks: its error against the mma.sync kernel (max |Δy| /
 * max |y|); the unsplit variants' bytes the same; the product's bytes the same with 5 rows in the
 * call as with n. Exit 1 on a mismatch. */
#include "cuda/prefill.cu"
#include "kbench.cuh"

#include <vector>

/* ---- the mma.sync K-quant GEMM (the product's until the warpgroup GEMM) ----------------------------
 * The weights are the mma's A operand (16 rows a tile), made in registers from the unit's bytes as
 * exact f16 integers, and x is the B operand as the f16 pair (xh, xl), so a product is two
 * tensor-core products, not three:
 *   Q4_K: A = sc·q (≤ 63·15, exact), the sum over a block's 256 positions in f32 on the tensor
 *         cores, then per (row, block) acc += d·S − dmin·Σ_j m_j·xs_j, the min term one m16n8k8
 *         product of 64·m (exact) against the pair of xs = 2^−6·Σ_{sub-block} x;
 *   Q6_K: A = q − 32 (exact); per 16-group acc += (d·sc)·S (d·sc exact in f32).
 * CTA tile KQ_TW weight rows × KQ_TX x rows, k in slices of 64, a KQ_STAGES cp.async pipeline;
 * 8 warps as 4 (weight rows) × 2 (x rows), each 32 × 32: 2 × 4 mma tiles, two CTAs per SM. */
typedef pf_kq_args kq_mma_args;

#define KQ_TW 128
#define KQ_TX 64
#define KQ_BK 64
#define KQ_STAGES 4
#define KQ_LDX (KQ_BK + 8) /* halves per x row in shared memory: 144 bytes, conflict-free ldmatrix */
#define KQ_X_BYTES (KQ_TX * KQ_LDX * 2)
#define KQ_STAGE_BYTES (2 * KQ_X_BYTES + (KQ_TW / 16) * KQ_WU + 2 * KQ_TX * 16)
#define KQ_SMEM ((size_t)KQ_STAGES * KQ_STAGE_BYTES + 2 * (KQ_TW / 16) * KQ_HU)

/* stage i (block i/4, slice i%4) into buffer sm; at slice 0 the block's headers into hb */
template <bool Q6>
__device__ __forceinline__ void pf_kq_load(const kq_mma_args &A, uint8_t *sm, uint8_t *hb, uint32_t m0, uint32_t n0,
                                           uint32_t i)
{
    const uint32_t nb = A.K / 256, b = i / 4, s = i % 4, k0 = 64 * i;
    __half *xh = (__half *)sm, *xl = (__half *)(sm + KQ_X_BYTES);
    uint8_t *ws = sm + 2 * KQ_X_BYTES, *xs = ws + (KQ_TW / 16) * KQ_WU;
    for (uint32_t c = threadIdx.x; c < KQ_TX * 8; c += blockDim.x) {
        const uint32_t r = c / 8, q = c % 8, row = m0 + r;
        const bool ok = row < A.n;
        const size_t off = (size_t)(ok ? row : 0) * A.K + k0 + 8 * q;
        pf_cp16(xh + r * KQ_LDX + 8 * q, A.xh + off, ok);
        pf_cp16(xl + r * KQ_LDX + 8 * q, A.xl + off, ok);
    }
    const uint32_t unit_bytes = Q6 ? MMQ6_UNIT : MMQ_UNIT;
    if (!Q6) {
        for (uint32_t c = threadIdx.x; c < (KQ_TW / 16) * 32; c += blockDim.x) {
            const uint32_t u = c / 32, L = c % 32, tile = n0 / 16 + u;
            const bool ok = 16 * tile < A.M;
            const uint8_t *src = A.w + ((size_t)(ok ? tile : 0) * nb + b) * unit_bytes + 512 * s + 16 * L;
            pf_cp16(ws + u * KQ_WU + 16 * L, src, ok);
        }
    } else {
        for (uint32_t c = threadIdx.x; c < (KQ_TW / 16) * 96; c += blockDim.x) {
            const uint32_t u = c / 96, j = (c % 96) / 32, L = c % 32, tile = n0 / 16 + u;
            const bool ok = 16 * tile < A.M;
            const uint8_t *src = A.w + ((size_t)(ok ? tile : 0) * nb + b) * unit_bytes + 512 * (2 * j + s / 2) + 16 * L +
                                 8 * (s % 2);
            pf_cp8(ws + u * KQ_WU + 256 * j + 8 * L, src, ok);
        }
    }
    if (s == 0) {
        const uint32_t hbytes = Q6 ? 288 : 256, hoff = Q6 ? MMQ6_SC : 2048;
        for (uint32_t c = threadIdx.x; c < (KQ_TW / 16) * (hbytes / 16); c += blockDim.x) {
            const uint32_t u = c / (hbytes / 16), q = c % (hbytes / 16), tile = n0 / 16 + u;
            const bool ok = 16 * tile < A.M;
            pf_cp16(hb + u * KQ_HU + 16 * q, A.w + ((size_t)(ok ? tile : 0) * nb + b) * unit_bytes + hoff + 16 * q, ok);
        }
    }
    if (!Q6 && s == 3) {
        for (uint32_t c = threadIdx.x; c < 2 * KQ_TX; c += blockDim.x) {
            const uint32_t r = c / 2, row = m0 + r;
            const bool ok = row < A.n;
            const __half *src = (c & 1 ? A.xsl : A.xsh) + (size_t)(ok ? row : 0) * (A.K / 32) + 8 * b;
            pf_cp16(xs + (c & 1) * KQ_TX * 16 + 16 * r, src, ok);
        }
    }
}

template <bool Q6>
static __global__ void __launch_bounds__(2 * KQ_TW, 2) pf_kq_kernel(const kq_mma_args A)
{
    extern __shared__ __align__(16) uint8_t kq_sm[];
    uint8_t *hbuf = kq_sm + KQ_STAGES * KQ_STAGE_BYTES;
    const uint32_t wid = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const uint32_t wm = wid % (KQ_TW / 32), wn = wid / (KQ_TW / 32); /* the warp's 32 weight rows (units 2wm, 2wm+1), 32 x rows */
    const uint32_t m0 = blockIdx.x * KQ_TX, n0 = blockIdx.y * KQ_TW;
    const uint32_t NS = A.K / 64;
    float acc[2][4][4], tmp[2][4][4];
#pragma unroll
    for (int i = 0; i < 2; i++)
#pragma unroll
        for (int j = 0; j < 4; j++)
#pragma unroll
            for (int k = 0; k < 4; k++) acc[i][j][k] = tmp[i][j][k] = 0.f;
#define KQ_STAGE_AT(i) (kq_sm + ((i) % KQ_STAGES) * KQ_STAGE_BYTES)
#define KQ_HB_AT(i) (hbuf + (((i) / 4) % 2) * (KQ_TW / 16) * KQ_HU)
#pragma unroll
    for (uint32_t s = 0; s < KQ_STAGES - 1; s++) {
        if (s < NS) pf_kq_load<Q6>(A, KQ_STAGE_AT(s), KQ_HB_AT(s), m0, n0, s);
        asm volatile("cp.async.commit_group;\n" ::);
    }
    for (uint32_t i = 0; i < NS; i++) {
        asm volatile("cp.async.wait_group %0;\n" ::"n"(KQ_STAGES - 2));
        __syncthreads();
        const uint32_t nk = i + KQ_STAGES - 1;
        if (nk < NS) pf_kq_load<Q6>(A, KQ_STAGE_AT(nk), KQ_HB_AT(nk), m0, n0, nk);
        asm volatile("cp.async.commit_group;\n" ::);
        const uint8_t *sm = KQ_STAGE_AT(i);
        const __half *xh = (const __half *)sm, *xl = (const __half *)(sm + KQ_X_BYTES);
        const uint8_t *ws = sm + 2 * KQ_X_BYTES, *xs = ws + (KQ_TW / 16) * KQ_WU;
        const uint8_t *hb = KQ_HB_AT(i);
        const uint32_t s = i % 4;
#pragma unroll
        for (uint32_t step = 0; step < 4; step++) {
            uint32_t bh[2][4], bl[2][4];
#pragma unroll
            for (int p = 0; p < 2; p++) {
                const uint32_t r = wn * 32 + p * 16 + (lane & 7) + ((lane >> 4) << 3), c = step * 16 + ((lane >> 3) & 1) * 8;
                pf_ldsm_x4(bh[p], xh + r * KQ_LDX + c);
                pf_ldsm_x4(bl[p], xl + r * KQ_LDX + c);
            }
            uint32_t a[2][4];
            float f[2][2]; /* Q6_K: d·sc of rows g and g + 8 */
#pragma unroll
            for (int mt = 0; mt < 2; mt++) {
                const uint32_t u = 2 * wm + mt;
                pf_kq_frag<Q6>(ws, hb, u, s, step, lane, a[mt]);
                if (Q6) {
                    const uint8_t *hd = hb + u * KQ_HU;
                    const uint32_t c = 2 * s + (step >> 1), hh = step & 1;
                    const uint32_t dw = *(const uint32_t *)(hd + 256 + 4 * g);
                    const uint8_t *scp = hd + 32 * g + 16 * hh + 2 * c;
                    f[mt][0] = __half2float(__ushort_as_half((unsigned short)(dw & 0xFFFFu))) * (float)(int8_t)scp[0];
                    f[mt][1] = __half2float(__ushort_as_half((unsigned short)(dw >> 16))) * (float)(int8_t)scp[1];
                }
            }
            if (!Q6) {
                /* the x-hi products of every tile, then the x-lo ones: no product waits on the one before */
#pragma unroll
                for (int lo = 0; lo < 2; lo++)
#pragma unroll
                    for (int mt = 0; mt < 2; mt++)
#pragma unroll
                        for (int nt = 0; nt < 4; nt++) {
                            const uint32_t(*bb)[4] = lo ? bl : bh;
                            pf_mma(tmp[mt][nt], a[mt], bb[nt / 2][2 * (nt % 2)], bb[nt / 2][2 * (nt % 2) + 1]);
                        }
            } else {
                float c4[2][4][4];
#pragma unroll
                for (int mt = 0; mt < 2; mt++)
#pragma unroll
                    for (int nt = 0; nt < 4; nt++) {
#pragma unroll
                        for (int k = 0; k < 4; k++) c4[mt][nt][k] = 0.f;
                        pf_mma(c4[mt][nt], a[mt], bh[nt / 2][2 * (nt % 2)], bh[nt / 2][2 * (nt % 2) + 1]);
                    }
#pragma unroll
                for (int mt = 0; mt < 2; mt++)
#pragma unroll
                    for (int nt = 0; nt < 4; nt++) {
                        pf_mma(c4[mt][nt], a[mt], bl[nt / 2][2 * (nt % 2)], bl[nt / 2][2 * (nt % 2) + 1]);
                        float *ac = acc[mt][nt];
                        ac[0] = fmaf(f[mt][0], c4[mt][nt][0], ac[0]);
                        ac[1] = fmaf(f[mt][0], c4[mt][nt][1], ac[1]);
                        ac[2] = fmaf(f[mt][1], c4[mt][nt][2], ac[2]);
                        ac[3] = fmaf(f[mt][1], c4[mt][nt][3], ac[3]);
                    }
            }
        }
        if (!Q6 && s == 3) {
            /* the block's end: acc += d·S − dmin·(64·m · xs) per row */
            uint32_t xb[2][4];
            {
                const uint32_t r = wn * 32 + lane;
                uint32_t sh;
                sh = (uint32_t)__cvta_generic_to_shared(xs + 16 * r);
                asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                             : "=r"(xb[0][0]), "=r"(xb[0][1]), "=r"(xb[0][2]), "=r"(xb[0][3])
                             : "r"(sh));
                sh = (uint32_t)__cvta_generic_to_shared(xs + KQ_TX * 16 + 16 * r);
                asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                             : "=r"(xb[1][0]), "=r"(xb[1][1]), "=r"(xb[1][2]), "=r"(xb[1][3])
                             : "r"(sh));
            }
#pragma unroll
            for (int mt = 0; mt < 2; mt++) {
                const uint8_t *hd = hb + (2 * wm + mt) * KQ_HU + 32 * g;
                const uint32_t G = t >> 1, te = t & 1, to = 2 + (t & 1);
                /* 64·m of sub-blocks 2t, 2t + 1 for rows g (item G) and g + 8 (item 2 + G) */
                const uint32_t am0 = pf_pack_h2(64.f * (float)pf_q4_mn(hd, te, G), 64.f * (float)pf_q4_mn(hd, to, G));
                const uint32_t am1 = pf_pack_h2(64.f * (float)pf_q4_mn(hd, te, 2 + G), 64.f * (float)pf_q4_mn(hd, to, 2 + G));
                const uint32_t dw = *(const uint32_t *)hd, mw = *(const uint32_t *)(hd + 4);
                const float d0 = __half2float(__ushort_as_half((unsigned short)(dw & 0xFFFFu))),
                            d1 = __half2float(__ushort_as_half((unsigned short)(dw >> 16)));
                const float m0f = __half2float(__ushort_as_half((unsigned short)(mw & 0xFFFFu))),
                            m1f = __half2float(__ushort_as_half((unsigned short)(mw >> 16)));
#pragma unroll
                for (int nt = 0; nt < 4; nt++)
                    pf_q4_fold_tile(acc[mt][nt], tmp[mt][nt], am0, am1, xb[0][nt], xb[1][nt], d0, d1, m0f, m1f);
            }
        }
    }
    asm volatile("cp.async.wait_group 0;\n" ::);
#pragma unroll
    for (int mt = 0; mt < 2; mt++) {
        /* the 16 weight rows of this tile lie in one segment (each a multiple of 16 rows) */
        const uint32_t c0 = n0 + wm * 32 + mt * 16;
        if (c0 >= A.M) continue;
        uint32_t sg = 0, sb = 0;
        while (c0 >= A.seg_end[sg]) sb = A.seg_end[sg++];
#pragma unroll
        for (int nt = 0; nt < 4; nt++)
#pragma unroll
            for (int e = 0; e < 2; e++) {
                const uint32_t row = m0 + wn * 32 + nt * 8 + 2 * t + e;
                if (row >= A.n) continue;
                const float rs = A.rs[row];
                float *yr = A.y[sg] + (size_t)row * A.ldy[sg] - sb;
#pragma unroll
                for (int hlf = 0; hlf < 2; hlf++) {
                    const uint32_t col = c0 + g + 8 * hlf;
                    float v = acc[mt][nt][2 * hlf + e] * rs;
                    if (A.op == MV_OP_SOFTCAP) {
                        v = v * A.scale;
                        if (A.cap > 0.f) v = A.cap * tanhf(v / A.cap);
                    }
                    yr[col] = v;
                }
            }
    }
#undef KQ_STAGE_AT
#undef KQ_HB_AT
}

static void pf_gemm_kq_mma_n(cudaStream_t st, const __half *xh, const __half *xl, const __half *xsh,
                             const __half *xsl, const float *rs, uint32_t n, const mv_mat *w, uint32_t nw,
                             float *const *y, const uint64_t *ldy, uint32_t op, float scale, float cap)
{
    static bool attr = false; /* the dynamic shared memory limit, raised once per process */
    if (!attr) {
        cudaFuncSetAttribute(pf_kq_kernel<false>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)KQ_SMEM);
        cudaFuncSetAttribute(pf_kq_kernel<true>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)KQ_SMEM);
        attr = true;
    }
    const kq_mma_args A = wg_args(xh, xl, xsh, xsl, rs, n, w, nw, y, ldy, op, scale, cap, NULL);
    const dim3 grid((n + KQ_TX - 1) / KQ_TX, (A.M + KQ_TW - 1) / KQ_TW);
    if (w[0].type == MV_T_Q6_KT) pf_kq_kernel<true><<<grid, 2 * KQ_TW, KQ_SMEM, st>>>(A);
    else pf_kq_kernel<false><<<grid, 2 * KQ_TW, KQ_SMEM, st>>>(A);
}

static void pf_gemm_kq_mma(cudaStream_t st, const __half *xh, const __half *xl, const __half *xsh, const __half *xsl,
                           const float *rs, uint32_t n, const mv_mat *w, float *y, uint64_t ldy)
{
    pf_gemm_kq_mma_n(st, xh, xl, xsh, xsl, rs, n, w, 1, &y, &ldy, MV_OP_STORE, 1.f, 0.f);
}

/* random unit bytes whose f16 d (and Q4_K dmin) fields are small normal numbers */
static __global__ void pfb_fill(uint8_t *p, size_t n, uint32_t seed, uint32_t unit, bool q6)
{
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        uint32_t v = kb_hash32(i, seed);
        const uint32_t o = (uint32_t)(i % unit);
        const bool f16_hi = q6 ? o >= MMQ6_D && (o & 1) : o >= 2048 && (o - 2048) % 32 < 8 && (o & 1);
        if (f16_hi) v = 0x10u | (v & 0x0Fu); /* exponent 2^-11 .. 2^-8 */
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
    printf("kq: the mma.sync kernel; gen: the general path; wg: the warpgroup GEMM as called (S pieces of K; Q4_K the exact\n"
           "variant), its error against kq, then the three-product kernel unsplit: its error, at 64 and 128 x rows, one\n"
           "product of three, no f32 weights; and Q4_K's exact variant unsplit: 4 and 2 warpgroups x 64 x rows, 2 x 128 (ms)\n");
    printf("%-24s %8s %7s %8s %7s %3s %8s %7s %8s %8s %8s %8s %8s %8s %8s %8s %8s\n", "shape", "kq ms", "TF/s", "gen ms", "TF/s",
           "S", "wg ms", "TF/s", "err", "err 3p", "3p 64", "3p 128", "1prod", "nosplit", "x4x64", "x2x64", "x2x128");
    float *y2, *y3, *part;
    CK(cudaMalloc(&y2, (size_t)n * Mmax * 4));
    CK(cudaMalloc(&y3, (size_t)n * Mmax * 4));
    CK(cudaMalloc(&part, pf_kq_part_bytes(n)));
    int bad_bytes = 0;
    for (const shape &s : shapes) {
        const uint32_t unit = s.q6 ? MMQ6_UNIT : MMQ_UNIT;
        pfb_fill<<<1024, 256>>>(w, (size_t)s.M / 16 * (s.K / 256) * unit, 11u, unit, s.q6);
        mv_mat m;
        m.data = w;
        m.type = s.q6 ? MV_T_Q6_KT : MV_T_Q4_KT;
        m.rows = s.M;
        m.cols = s.K;
        cudaEvent_t a, b;
        CK(cudaEventCreate(&a));
        CK(cudaEventCreate(&b));
        /* the mma.sync kernel on its own x (with the Q4_K sub-block sums) */
        pf_split_kernel<<<n, PF_ROW_T>>>(x, s.K, s.K, s.q6 ? 2 : 1, xh, xl, xsh, xsl, rs);
        const double kq = kb_median_ms(10, 1, a, b, [&] { pf_gemm_kq_mma(0, xh, xl, xsh, xsl, rs, n, &m, y, s.M); });
        CK(cudaDeviceSynchronize());
        std::vector<float> ref((size_t)n * s.M);
        CK(cudaMemcpy(ref.data(), y, ref.size() * 4, cudaMemcpyDeviceToHost));
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
        /* the warpgroup GEMM: as the product calls it; unsplit at 64 and 128 x rows a CTA (their bytes
         * compared); the 128 variant leaving work out (times only) */
        pf_split_kq(0, x, s.K, n, s.K, s.q6, xh, xl, xsh, xsl, rs);
        const uint64_t ldy = s.M;
        const double prod = kb_median_ms(10, 1, a, b, [&] {
            pf_gemm_kq(0, xh, xl, xsh, xsl, rs, n, &m, y2, ldy, MV_OP_STORE, 1.f, 0.f, part);
        });
        const uint32_t S = pf_kq_nsplit(m.type, s.M, s.K);
        CK(cudaDeviceSynchronize());
        CK(cudaGetLastError());
        std::vector<float> hp((size_t)n * s.M), h64((size_t)n * s.M), h128((size_t)n * s.M);
        CK(cudaMemcpy(hp.data(), y2, hp.size() * 4, cudaMemcpyDeviceToHost));
        const pf_kq_args W1 = wg_args(xh, xl, xsh, xsl, rs, n, &m, 1, &y3, &ldy, MV_OP_STORE, 1.f, 0.f, NULL);
        double wgt[7] = {0, 0, 0, 0, 0, 0, 0};
        wgt[0] = kb_median_ms(10, 1, a, b, [&] { s.q6 ? wg_launch<true, 64>(0, W1) : wg_launch<false, 64>(0, W1); });
        CK(cudaDeviceSynchronize());
        CK(cudaMemcpy(h64.data(), y3, h64.size() * 4, cudaMemcpyDeviceToHost));
        wgt[1] = kb_median_ms(10, 1, a, b, [&] { s.q6 ? wg_launch<true, 128>(0, W1) : wg_launch<false, 128>(0, W1); });
        CK(cudaDeviceSynchronize());
        CK(cudaGetLastError());
        CK(cudaMemcpy(h128.data(), y3, h128.size() * 4, cudaMemcpyDeviceToHost));
        if (memcmp(h64.data(), h128.data(), h64.size() * 4)) bad_bytes++, printf("  MISMATCH unsplit 64 vs 128\n");
        wgt[2] = kb_median_ms(10, 1, a, b, [&] { s.q6 ? wg_launch<true, 128, 1>(0, W1) : wg_launch<false, 128, 1>(0, W1); });
        wgt[3] = kb_median_ms(10, 1, a, b, [&] { s.q6 ? wg_launch<true, 128, 2>(0, W1) : wg_launch<false, 128, 2>(0, W1); });
        if (!s.q6) { /* the exact variant unsplit: 4 warpgroups a CTA, and 2 (two CTAs an SM), the same bytes */
            wgt[4] = kb_median_ms(10, 1, a, b, [&] { wgx_launch<4, 64>(0, W1); });
            CK(cudaDeviceSynchronize());
            CK(cudaMemcpy(h64.data(), y3, h64.size() * 4, cudaMemcpyDeviceToHost));
            wgt[5] = kb_median_ms(10, 1, a, b, [&] { wgx_launch<2, 64>(0, W1); });
            CK(cudaDeviceSynchronize());
            CK(cudaMemcpy(h128.data(), y3, h128.size() * 4, cudaMemcpyDeviceToHost));
            if (memcmp(h64.data(), h128.data(), h64.size() * 4)) bad_bytes++, printf("  MISMATCH exact 4 vs 2 warpgroups\n");
            wgt[6] = kb_median_ms(10, 1, a, b, [&] { wgx_launch<2, 128>(0, W1); });
            CK(cudaDeviceSynchronize());
            CK(cudaMemcpy(h128.data(), y3, h128.size() * 4, cudaMemcpyDeviceToHost));
            if (memcmp(h64.data(), h128.data(), h64.size() * 4)) bad_bytes++, printf("  MISMATCH exact 64 vs 128 x rows\n");
        }
        CK(cudaGetLastError());
        /* the product's bytes with 5 rows in the call */
        {
            const uint32_t n5 = n < 5 ? n : 5;
            CK(cudaMemset(y3, 0xFF, (size_t)n * s.M * 4));
            pf_gemm_kq(0, xh, xl, xsh, xsl, rs, n5, &m, y3, ldy, MV_OP_STORE, 1.f, 0.f, part);
            std::vector<float> t((size_t)n5 * s.M);
            CK(cudaMemcpy(t.data(), y3, t.size() * 4, cudaMemcpyDeviceToHost));
            if (memcmp(t.data(), hp.data(), t.size() * 4)) bad_bytes++, printf("  MISMATCH 5 rows vs %u\n", n);
        }
        double err = 0, err1 = 0, ymax = 0;
        for (size_t i = 0; i < ref.size(); i++) {
            ymax = fmax(ymax, fabs(ref[i]));
            const double d = fabs((double)ref[i] - hp[i]), d1 = fabs((double)ref[i] - h128[i]);
            err = d > err || d != d ? d : err;
            err1 = d1 > err1 || d1 != d1 ? d1 : err1;
        }
        printf("%-24s %8.3f %7.1f %8.3f %7.1f %3u %8.3f %7.1f %8.2e %8.2e %8.3f %8.3f %8.3f %8.3f %8.3f %8.3f %8.3f\n", s.name,
               kq, fl / kq / 1e9, gen, gen ? fl / gen / 1e9 : 0.0, S, prod, fl / prod / 1e9, err / ymax, err1 / ymax, wgt[0],
               wgt[1], wgt[2], wgt[3], wgt[4], wgt[5], wgt[6]);
    }
    printf("warpgroup GEMM bytes: %s\n", bad_bytes ? "MISMATCH" : "64 = 128 x rows a CTA; 5 rows in the call = n");
    return bad_bytes ? 1 : 0;
}
