/* mmi.cu — workbench for the exact-integer-per-block matvec (#19; bench/kernels/NOTES.md, "mmh",
 * the redesign it points to). Nothing here is used by the engine.
 *
 * The question: can a one-row kernel and a 16-row kernel give bit-identical rows while each takes
 * its own fastest shape? They can if every value that depends on the summation order is an exact
 * integer, so that the only roundings are a fold per (weight row, x row, block) done in one fixed
 * order by both. Q4_K, w = d·sc_j·q − dmin·m_j per sub-block j of 32.
 *
 * Numerics. x per (row, block): a power of two s with |x|/s < 2^30, v = rint(x/s) (31 bits of the
 * block's largest), v = d0 + 2^8·d1 + 2^16·d2 + 2^24·d3 in balanced digits (|d_k| ≤ 128). The main
 * term per digit, T_k = Σ_j sc_j·Σ_{p∈j} q_p·d_k,p, is an exact int32 (|T_k| < 256·945·128 < 2^25):
 * one m16n8k32 (u8 nibbles × s8 digits, exact int32) per sub-block, then one IMAD by sc_j. The min
 * term M = Σ_j m_j·Σ_{p∈j} x̂_p (x̂ = v·s) goes through one m16n8k8 (f16 m against the f16 hi/lo of
 * the sub-block sums the x writer made once): not exact, but the same operands in the same
 * instruction give the same bits in any column (the mmh check showed it). Then, per (weight row,
 * x row, block), in f64: y += s·(d·Σ_k 2^8k·T_k − dmin·2^20·M) (the Σ exact: < 2^49), the blocks of
 * a warp in order, the KW warps in order, one rounding to f32 at the end.
 *
 * mma m16n8k32 (u8 × s8 → s32): lane (g, t) holds A rows g, g+8 at k 4t..4t+3 (a0, a1) and
 * 16+4t..+3 (a2, a3), B column g at k 4t..4t+3 (b0) and 16+4t..+3 (b1), C rows g, g+8 at columns
 * 2t, 2t+1. Column c of n-tile n is x row 2n + c/4, digit c%4: lane t ends with digits 2(t&1),
 * 2(t&1)+1 of x row 2n + t/2, and its partner t^1 with the other two.
 *
 * Weights, repacked (mmi_repack): units of (16-row tile, block), MMI_UNIT = 2368 bytes:
 *   [0, 2048)    [u 0..3][lane][4 words]: word 2j + r (r 0: row g, 1: row g+8) of lane (g, t), byte i
 *                = q at 32j + 4t + i (low nibble) and at 32j + 16 + 4t + i (high nibble)
 *   [2048, 2176) per row pair g: the 8 sub-block scales of row g, then of row g + 8
 *   [2176, 2304) per row pair g: the 8 mins of row g, then of row g + 8
 *   [2304, 2368) per row pair g: d_g, d_g8, dmin_g, dmin_g8 (f16)
 * x, per row and block, MMI_XBLK = 1072 bytes: [j][digit][t][b0 4 bytes, b1 4 bytes] (1024), then
 * [piece][t] the f16 pair of 2^-20·Σ v over sub-blocks 2t, 2t+1 (32), then s (f32), padding.
 *
 * Launch: a CTA of 8 warps = (8 / KW) tiles × KW warps splitting the blocks (warp kw takes blocks
 * kw, kw + KW, …); a warp does NT n-tiles (2·NT x rows). KW is the matrix's; NT only what fits.
 *
 * Contenders for the rows, each checked byte for byte against mmi_kernel of its KW (NOTES, "mmw"):
 * mmi_kernel<…, P2> (the sub-block scales inside the integer products: two u8 planes), mmw_kernel (those
 * planes as wgmma's A, x's digits as B from shared memory, the KW split over a cluster) and
 * mmw3_kernel (the weights staged through a cp.async ring, a persistent grid), mmw5_kernel<…, false> (mmw4: that ring
 * with a producer warp and mbarriers) and mmw5_kernel (its copies made by the bulk engine).
 *   usage: kbench_mmi [reps [filter]]   (exit 1 if a check fails; filter: the variants whose name holds it,
 *   beside the 16-row references) */
#include <cooperative_groups.h>

#include "cuda/tc.cuh"
#include "cuda/wgmma.cuh"
#include "mmi.cuh"

#define MMI_UNIT 2368u

/* ---- the weight repack: one thread per (tile, block, row pair g) ------------------------------ */
__global__ void mmi_repack(const uint8_t *raw, uint8_t *dst, uint32_t rows, uint32_t nb)
{
    uint32_t g;
    const uint8_t *rw[2];
    uint8_t *u;
    if (!kq_repack_item(raw, dst, rows, nb, 144, MMI_UNIT, g, rw, u)) return;
    for (uint32_t t = 0; t < 4; t++) {
        const uint32_t lane = 4 * g + t;
        for (uint32_t w = 0; w < 16; w++) {
            const uint32_t j = w >> 1, r = w & 1;
            uint32_t word = 0;
            for (uint32_t by = 0; by < 4; by++) {
                const uint32_t lo = kq4_q(rw[r], (int)(32 * j + 4 * t + by)), hi = kq4_q(rw[r], (int)(32 * j + 16 + 4 * t + by));
                word |= (lo | hi << 4) << (8 * by);
            }
            ((uint32_t *)u)[((w >> 2) * 32 + lane) * 4 + (w & 3)] = word;
        }
    }
    for (int r = 0; r < 2; r++)
        for (int j = 0; j < 8; j++) {
            int s, m;
            kq4_scale_min(rw[r] + 4, j, s, m);
            u[2048 + 16 * g + 8 * r + j] = (uint8_t)s;
            u[2176 + 16 * g + 8 * r + j] = (uint8_t)m;
        }
    uint16_t *dd = (uint16_t *)(u + 2304 + 8 * g);
    dd[0] = *(const uint16_t *)rw[0];
    dd[1] = *(const uint16_t *)rw[1];
    dd[2] = *(const uint16_t *)(rw[0] + 2);
    dd[3] = *(const uint16_t *)(rw[1] + 2);
}

/* the block's eight sub-blocks as the two planes sl·q and sh·q (sc = 8·sh + sl): pl[j][plane][a0..a3],
 * the m16n8k32 A fragments of sub-block j from the lane's unit words q and its row pair's scales sc */
__device__ __forceinline__ void mmi_planes(const uint4 (&q)[4], const uint4 sc, uint32_t (&pl)[8][2][4])
{
#pragma unroll
    for (int j = 0; j < 8; j++) {
        const uint4 &qq = q[j >> 1];
        const uint32_t w0 = (j & 1) ? qq.z : qq.x, w1 = (j & 1) ? qq.w : qq.y;
        const uint32_t a[4] = {w0 & 0x0F0F0F0Fu, w1 & 0x0F0F0F0Fu, (w0 >> 4) & 0x0F0F0F0Fu, (w1 >> 4) & 0x0F0F0F0Fu};
        const uint32_t s0 = ((j < 4 ? sc.x : sc.y) >> (8 * (j & 3))) & 0xFF;
        const uint32_t s8 = ((j < 4 ? sc.z : sc.w) >> (8 * (j & 3))) & 0xFF;
        const uint32_t l0 = s0 & 7, h0 = s0 >> 3, l8 = s8 & 7, h8 = s8 >> 3;
        pl[j][0][0] = a[0] * l0;
        pl[j][0][1] = a[1] * l8;
        pl[j][0][2] = a[2] * l0;
        pl[j][0][3] = a[3] * l8;
        pl[j][1][0] = a[0] * h0;
        pl[j][1][1] = a[1] * h8;
        pl[j][1][2] = a[2] * h0;
        pl[j][1][3] = a[3] * h8;
    }
}

/* The min term's products, one m16n8k8 per 4 x rows: A = m of rows g, g+8 at sub-blocks 2t, 2t+1
 * (from the row pair's mins mn), B = bm[k], x rows 4k + g/2's sums' pieces (lane (g, t)'s word) */
template <int NM>
__device__ __forceinline__ void mmi_min_mma(const uint4 mn, uint32_t t, const uint32_t (&bm)[NM], float (&Mv)[NM][4])
{
    const uint32_t mw0 = t < 2 ? mn.x : mn.y, mw8 = t < 2 ? mn.z : mn.w, sh = 2 * (t & 1);
    const uint32_t am0 = kq4_h2u(kq4_bytes_h2(mw0, (sh | (sh + 1) << 8) | 0x4040u));
    const uint32_t am1 = kq4_h2u(kq4_bytes_h2(mw8, (sh | (sh + 1) << 8) | 0x4040u));
#pragma unroll
    for (int k = 0; k < NM; k++) {
        Mv[k][0] = Mv[k][1] = Mv[k][2] = Mv[k][3] = 0.f;
        kq4_mma8(Mv[k], am0, am1, bm[k]);
    }
}

/* One block's fold for n-tile n (x row 2n + t/2): yacc += s·(d·T − dmin·2^20·M), in f64; dd: the row
 * pair's d and dmin pairs (f16), Mv: the min products (the x row's in lane 4g + x row % 4), sx: s */
template <int NM>
__device__ __forceinline__ void mmi_fold(double &yacc, double T, const float (&Mv)[NM][4], int n, uint32_t lane, uint2 dd,
                                         double sx)
{
    const uint32_t g = lane >> 2, t = lane & 3, hi = t & 1;
    const uint32_t xr = 2 * n + (t >> 1), src = 4 * g + (xr & 3);
    const float *mv = Mv[n >> 1];
    const float M0 = __fadd_rn(mv[0], mv[1]), M8 = __fadd_rn(mv[2], mv[3]);
    const float M0r = __shfl_sync(0xFFFFFFFFu, M0, src), M8r = __shfl_sync(0xFFFFFFFFu, M8, src);
    const float Mr = hi ? M8r : M0r;
    const double d = (double)__half2float(__ushort_as_half((unsigned short)(hi ? dd.x >> 16 : dd.x & 0xFFFF)));
    const double m = 0x1p20 * (double)__half2float(__ushort_as_half((unsigned short)(hi ? dd.y >> 16 : dd.y & 0xFFFF)));
    yacc = fma(sx, fma(d, T, -m * (double)Mr), yacc);
}

/* A lane's words of one unit: its qs words, its row pair's scales and mins (bytes), d and dmin (f16) */
struct mmi_w {
    uint4 q[4], sc, mn;
    uint2 dd;
};
__device__ __forceinline__ void mmi_load(const uint8_t *unit, uint32_t lane, mmi_w &w)
{
    const uint32_t g = lane >> 2;
#pragma unroll
    for (int u = 0; u < 4; u++) w.q[u] = __ldg((const uint4 *)(unit + (u * 32 + lane) * 16));
    w.sc = __ldg((const uint4 *)(unit + 2048 + 16 * g));
    w.mn = __ldg((const uint4 *)(unit + 2176 + 16 * g));
    w.dd = __ldg((const uint2 *)(unit + 2304 + 8 * g));
}

/* The block's main term in mmi's IMAD form: per sub-block j one m16n8k32 (nibbles × the n-tile's
 * digits) per n-tile and one IMAD by the scale, acc[n] += sc_j·(q_j·x_j); xb[n] is the lane's B
 * column of n-tile n (SM: a copy in shared memory, else global) */
template <int NT, bool SM>
__device__ __forceinline__ void mmi_products(const uint4 (&q)[4], const uint4 sc, const uint8_t *const (&xb)[NT], int (&acc)[NT][4])
{
#pragma unroll
    for (int j = 0; j < 8; j++) {
        const uint4 &qq = q[j >> 1];
        const uint32_t w0 = (j & 1) ? qq.z : qq.x, w1 = (j & 1) ? qq.w : qq.y;
        const uint32_t a[4] = {w0 & 0x0F0F0F0Fu, w1 & 0x0F0F0F0Fu, (w0 >> 4) & 0x0F0F0F0Fu, (w1 >> 4) & 0x0F0F0F0Fu};
        const int s0 = (int)(((j < 4 ? sc.x : sc.y) >> (8 * (j & 3))) & 0xFF);
        const int s8 = (int)(((j < 4 ? sc.z : sc.w) >> (8 * (j & 3))) & 0xFF);
#pragma unroll
        for (int n = 0; n < NT; n++) {
            const uint2 bx = SM ? *(const uint2 *)(xb[n] + j * 128) : __ldg((const uint2 *)(xb[n] + j * 128));
            int c[4] = {0, 0, 0, 0};
            mmi_imma(c, a, bx.x, bx.y);
            acc[n][0] += s0 * c[0];
            acc[n][1] += s0 * c[1];
            acc[n][2] += s8 * c[2];
            acc[n][3] += s8 * c[3];
        }
    }
}

/* ---- the kernel ------------------------------------------------------------------------------- */
/* NW warps a CTA: NW / (KW·CG) tiles × CG column groups (of 2·NT x rows each, x row 2·NT·cg on)
 * × KW. Each lane folds one weight row: the lane of a pair with the low digits row g, its partner
 * (the high digits) row g + 8, each getting the other's digits for its row by one shuffle. */
template <int NT, int KW, int MINB, int CG = 1, int NW = 8, bool P2 = false>
__global__ void __launch_bounds__(32 * NW, MINB)
    mmi_kernel(const uint8_t *__restrict__ W, uint32_t nb, const uint8_t *__restrict__ xq, uint32_t nx, float *__restrict__ y,
               uint32_t rows)
{
    static_assert(NW % (KW * CG) == 0, "NW = tiles · CG · KW");
    constexpr int TG = NW / (KW * CG), NM = (2 * NT + 3) / 4; /* min n-tiles: 4 x rows (hi, lo) each */
    __shared__ double red[KW > 1 ? KW - 1 : 1][TG * CG][NT][32];
    const uint32_t warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3, hi = t & 1;
    const uint32_t kw = warp % KW, cg = (warp / KW) % CG, tg = warp / (KW * CG), tile = blockIdx.x * TG + tg;
    const uint32_t x0 = 2 * NT * cg; /* this warp's first x row */
    const bool live = tile * 16 < rows && x0 < nx;
    double yacc[NT];
#pragma unroll
    for (int n = 0; n < NT; n++) yacc[n] = 0.0;
    for (uint32_t b = kw; live && b < nb; b += KW) {
        mmi_w U;
        mmi_load(W + ((size_t)tile * nb + b) * MMI_UNIT, lane, U);
        const uint4(&q)[4] = U.q;
        const uint4 sc = U.sc, mn = U.mn;
        const uint2 dd = U.dd;
        /* this lane's B column: x row 2n + g/4, digit g%4 */
        const uint8_t *xb[NT];
#pragma unroll
        for (int n = 0; n < NT; n++)
            xb[n] = xq + ((size_t)min(x0 + 2 * n + (g >> 2), nx - 1) * nb + b) * MMI_XBLK + ((g & 3) * 4 + t) * 8;
        int acc[NT][4];
#pragma unroll
        for (int n = 0; n < NT; n++) acc[n][0] = acc[n][1] = acc[n][2] = acc[n][3] = 0;
        if (P2) {
            /* the two planes: the block's products without an IMAD per n-tile and sub-block */
            uint32_t pl[8][2][4];
            mmi_planes(q, sc, pl);
#pragma unroll
            for (int n = 0; n < NT; n++) {
                uint2 bx[8];
#pragma unroll
                for (int j = 0; j < 8; j++) bx[j] = __ldg((const uint2 *)(xb[n] + j * 128));
                int cl[4] = {0, 0, 0, 0}, ch[4] = {0, 0, 0, 0};
#pragma unroll
                for (int j = 0; j < 8; j++) {
                    mmi_imma(cl, pl[j][0], bx[j].x, bx[j].y);
                    mmi_imma(ch, pl[j][1], bx[j].x, bx[j].y);
                }
#pragma unroll
                for (int e = 0; e < 4; e++) acc[n][e] = 8 * ch[e] + cl[e];
            }
        }
        if (!P2) mmi_products<NT, false>(q, sc, xb, acc);
        /* the min term (x rows x0 + 4k + g/2), then the fold: this lane's two digits, exact, and the
         * partner's two; the min of x row xr sits in lane (g, xr % 4) of min tile n / 2 */
        uint32_t bm[NM];
#pragma unroll
        for (int k = 0; k < NM; k++)
            bm[k] = __ldg((const uint32_t *)(xq + ((size_t)min(x0 + 4 * k + (g >> 1), nx - 1) * nb + b) * MMI_XBLK + 1024 +
                                             ((g & 1) * 4 + t) * 4));
        float Mv[NM][4];
        mmi_min_mma<NM>(mn, t, bm, Mv);
#pragma unroll
        for (int n = 0; n < NT; n++) {
            const uint32_t xr = x0 + 2 * n + (t >> 1);
            const double sx = (double)__ldg((const float *)(xq + ((size_t)min(xr, nx - 1) * nb + b) * MMI_XBLK + 1056));
            mmi_fold<NM>(yacc[n], mmi_pair_T(acc[n], hi), Mv, n, lane, dd, sx);
        }
    }
    if (!mmi_kw_sum<KW, NT, TG * CG>(red, kw, tg * CG + cg, lane, yacc) || !live) return;
    mmi_store<NT>(y + (size_t)x0 * rows, yacc, nx - min(x0, nx), rows, tile, lane);
}

/* ---- mmw: the same sums on warpgroup products (wgmma), for several x rows ------------------------
 * mmi_kernel<…, P2>'s two planes sl·q and sh·q as wgmma's A (u8, in registers: each warp its 16 rows, the
 * m16n8k32 A fragments mmi builds), x's digits as B (s8) from shared memory, one CTA of MMW_NWG
 * warpgroups = 4·MMW_NWG tiles, and KW CTAs of a cluster (blockIdx.z) splitting the blocks as
 * mmi_kernel's KW warps do (CTA kw: blocks kw, kw + KW, …), their f64 sums added in kw order
 * through distributed shared memory: the same integers, the same fold, the same order, so the
 * same bytes as mmi_kernel of that KW. x here is in columns: per (row, block) [digit][256 k] (1024
 * bytes: column n = 4·row + digit of B, K contiguous), then mmi's sums and s (mmw_cols makes it
 * from mmi's layout). Per block: x for NX rows through a 3-stage cp.async ring (two 128-k slices
 * of N rows × 128 bytes, 128-byte swizzled); the 16 products (8 sub-blocks × 2 planes) one
 * group; the fold after wgmma.wait_group 0. */
#define MMW_NWG 2
#define MMW_STAGES 3
__global__ void mmw_cols(const uint8_t *src, uint8_t *dst, uint32_t nblk)
{
    const uint32_t i = blockIdx.x; /* one (row, block) per CTA of 256 threads */
    if (i >= nblk) return;
    const uint8_t *s = src + (size_t)i * MMI_XBLK;
    uint8_t *d = dst + (size_t)i * MMI_XBLK;
    for (uint32_t o = threadIdx.x; o < 1024; o += blockDim.x) {
        /* mmi: ((j·4 + c)·4 + t)·8 + half·4 + by holds digit c at k = 32j + 16·half + 4t + by */
        const uint32_t by = o & 3, half = (o >> 2) & 1, t = (o >> 3) & 3, c = (o >> 5) & 3, j = o >> 7;
        d[c * 256 + 32 * j + 16 * half + 4 * t + by] = s[o];
    }
    for (uint32_t o = 1024 + threadIdx.x; o < MMI_XBLK; o += blockDim.x) d[o] = s[o];
}

/* s32 D (64 × N) += u8 A (64 × 32, registers, m16n8k32's A layout per warp) · s8 B (N × 32 in shared
 * memory, K-major, 128-byte swizzle); acc 0: D = A·B */
template <int N> __device__ __forceinline__ void mmw_mma(int *d, const uint32_t a[4], uint64_t desc, int acc);
template <> __device__ __forceinline__ void mmw_mma<8>(int *d, const uint32_t a[4], uint64_t desc, int acc)
{
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %9, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n8k32.s32.u8.s8 {%0,%1,%2,%3}, {%4,%5,%6,%7}, %8, p;\n}\n"
                 : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "r"(acc)
                 : "memory");
}
template <> __device__ __forceinline__ void mmw_mma<16>(int *d, const uint32_t a[4], uint64_t desc, int acc)
{
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %13, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n16k32.s32.u8.s8 {%0,%1,%2,%3,%4,%5,%6,%7}, {%8,%9,%10,%11}, %12, p;\n}\n"
                 : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3]), "+r"(d[4]), "+r"(d[5]), "+r"(d[6]), "+r"(d[7])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "r"(acc)
                 : "memory");
}
template <> __device__ __forceinline__ void mmw_mma<32>(int *d, const uint32_t a[4], uint64_t desc, int acc)
{
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %21, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n32k32.s32.u8.s8 {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15}, {%16,%17,%18,%19}, %20, p;\n}\n"
                 : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3]), "+r"(d[4]), "+r"(d[5]), "+r"(d[6]), "+r"(d[7]), "+r"(d[8]), "+r"(d[9]), "+r"(d[10]), "+r"(d[11]), "+r"(d[12]), "+r"(d[13]), "+r"(d[14]), "+r"(d[15])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "r"(acc)
                 : "memory");
}
template <> __device__ __forceinline__ void mmw_mma<64>(int *d, const uint32_t a[4], uint64_t desc, int acc)
{
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n64k32.s32.u8.s8 {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31}, {%32,%33,%34,%35}, %36, p;\n}\n"
                 : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3]), "+r"(d[4]), "+r"(d[5]), "+r"(d[6]), "+r"(d[7]), "+r"(d[8]), "+r"(d[9]), "+r"(d[10]), "+r"(d[11]), "+r"(d[12]), "+r"(d[13]), "+r"(d[14]), "+r"(d[15]), "+r"(d[16]), "+r"(d[17]), "+r"(d[18]), "+r"(d[19]), "+r"(d[20]), "+r"(d[21]), "+r"(d[22]), "+r"(d[23]), "+r"(d[24]), "+r"(d[25]), "+r"(d[26]), "+r"(d[27]), "+r"(d[28]), "+r"(d[29]), "+r"(d[30]), "+r"(d[31])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "r"(acc)
                 : "memory");
}

__device__ __forceinline__ void mmw_cp16(uint32_t dst, const void *src)
{
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(dst), "l"(src));
}

/* the block's 16 products (8 sub-blocks × the planes sl, sh) as one group: B is the stage at shared
 * address st, two 128-k slices `slice` bytes apart */
template <int N>
__device__ __forceinline__ void mmw_products(int (&cl)[N / 2], int (&ch)[N / 2], const uint32_t (&pl)[8][2][4], uint32_t st,
                                             uint32_t slice)
{
    wg_fence();
#pragma unroll
    for (int j = 0; j < 8; j++) {
        const uint64_t desc = wg_desc_sw128(st + (j >> 2) * slice + 32 * (j & 3));
        mmw_mma<N>(cl, pl[j][0], desc, j);
        mmw_mma<N>(ch, pl[j][1], desc, j);
    }
    wg_commit();
}

/* A block's fold from the wgmma accumulators (T_k = 8·C_sh + C_sl per n-tile) into yacc */
template <int N, int NM>
__device__ __forceinline__ void mmw_fold(double (&yacc)[N / 8], const int (&cl)[N / 2], const int (&ch)[N / 2],
                                         const float (&Mv)[NM][4], uint32_t lane, uint2 dd, const double (&sx)[N / 8])
{
#pragma unroll
    for (int n = 0; n < N / 8; n++) {
        int a[4];
#pragma unroll
        for (int e = 0; e < 4; e++) a[e] = 8 * ch[4 * n + e] + cl[4 * n + e];
        mmi_fold<NM>(yacc[n], mmi_pair_T(a, lane & 1), Mv, n, lane, dd, sx[n]);
    }
}

/* An item's piece kw of this lane's sums into part[kw][x row][row] (mmw3, mmw4) */
template <int NT>
__device__ __forceinline__ void mmw_part_put(double *part, const double (&yacc)[NT], uint32_t kw, uint32_t nx, uint32_t rows,
                                             uint32_t tile, uint32_t lane)
{
    const uint32_t g = lane >> 2, t = lane & 3;
#pragma unroll
    for (int n = 0; n < NT; n++) {
        const uint32_t xr = 2 * n + (t >> 1);
        if (xr < nx) part[((size_t)kw * nx + xr) * rows + tile * 16 + g + 8 * (t & 1)] = yacc[n];
    }
}
/* rows r0 .. r0 + nr of y: the KW pieces added in kw order, rounded once; thread i of n */
template <int KW>
__device__ __forceinline__ void mmw_part_sum(const double *part, float *y, uint32_t r0, uint32_t nr, uint32_t nx,
                                             uint32_t rows, uint32_t i0, uint32_t n)
{
    for (uint32_t i = i0; i < nr * nx; i += n) {
        const uint32_t xr = i / nr, row = r0 + i % nr;
        double v = __ldcg(part + (size_t)xr * rows + row);
#pragma unroll
        for (int z = 1; z < KW; z++) v += __ldcg(part + ((size_t)z * nx + xr) * rows + row);
        y[(size_t)xr * rows + row] = (float)v;
    }
}

/* 16-byte piece c (of 4·NX·16) of block b's x for NX rows (row past nx: row nx − 1): its offset in
 * the stage's image (column n = 4·row + digit, its 256 k as two 128-byte-swizzled slices) and its
 * source in the column layout */
template <int NX>
__device__ __forceinline__ uint32_t mmw_x_piece(uint32_t c, const uint8_t *xc, uint32_t b, uint32_t nb, uint32_t nx,
                                                const uint8_t *&src)
{
    const uint32_t n = c >> 4, h = (c >> 3) & 1, q = c & 7, r = min(n >> 2, nx - 1);
    src = xc + ((size_t)r * nb + b) * MMI_XBLK + (n & 3) * 256 + 128 * h + 16 * q;
    return h * (4 * NX * 128) + n * 128 + ((q ^ (n & 7)) << 4);
}

/* block b's x into a stage at shared address st, pieces i0, i0 + step, … */
template <int NX>
__device__ __forceinline__ void mmw_load_x(uint32_t st, const uint8_t *xc, uint32_t b, uint32_t nb, uint32_t nx,
                                           uint32_t i0 = threadIdx.x, uint32_t step = blockDim.x)
{
    for (uint32_t c = i0; c < 4 * NX * 16; c += step) {
        const uint8_t *src;
        const uint32_t o = mmw_x_piece<NX>(c, xc, b, nb, nx, src);
        mmw_cp16(st + o, src);
    }
}

/* block b's units of tiles tg0 … tg0 + nu − 1 (past the matrix's end: its last tile) and x's 48 bytes
 * of sums and s per row for NX rows into shared addresses su and ss, pieces i0, i0 + step, … */
template <int NX>
__device__ __forceinline__ void mmw_load_units_sums(uint32_t su, uint32_t ss, const uint8_t *W, const uint8_t *xc, uint32_t tg0,
                                                    uint32_t nu, uint32_t ntile, uint32_t b, uint32_t nb, uint32_t nx,
                                                    uint32_t i0 = threadIdx.x, uint32_t step = blockDim.x)
{
    for (uint32_t k = i0; k < nu * (MMI_UNIT / 16); k += step) {
        const uint32_t u = k / (MMI_UNIT / 16), o = k % (MMI_UNIT / 16), tl = min(tg0 + u, ntile - 1);
        mmw_cp16(su + u * MMI_UNIT + 16 * o, W + ((size_t)tl * nb + b) * MMI_UNIT + 16 * o);
    }
    for (uint32_t k = i0; k < NX * 3; k += step) {
        const uint32_t r = k / 3, o = k % 3;
        mmw_cp16(ss + 48 * r + 16 * o, xc + ((size_t)min(r, nx - 1) * nb + b) * MMI_XBLK + 1024 + 16 * o);
    }
}

template <int NX, int KW, int MINB>
__global__ void __cluster_dims__(1, 1, KW) __launch_bounds__(128 * MMW_NWG, MINB)
    mmw_kernel(const uint8_t *__restrict__ W, uint32_t nb, const uint8_t *__restrict__ xc, uint32_t nx, float *__restrict__ y,
               uint32_t rows)
{
    constexpr int N = 4 * NX, NT = NX / 2, NM = (NX + 3) / 4;
    constexpr uint32_t SLICE = N * 128, STAGE = 2 * SLICE;
    extern __shared__ uint8_t mmw_raw[];
    uint8_t *sm = mmw_raw + ((1024u - ((uint32_t)__cvta_generic_to_shared(mmw_raw) & 1023u)) & 1023u);
    const uint32_t sbase = (uint32_t)__cvta_generic_to_shared(sm);
    const uint32_t wid = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const uint32_t kw = blockIdx.z, ntile = rows / 16, tile0 = blockIdx.x * (4 * MMW_NWG) + wid;
    const bool live = tile0 < ntile;
    const uint32_t tile = live ? tile0 : ntile - 1; /* a warp past the end computes a copy, stores nothing */
    const uint32_t nbk = (nb - kw + KW - 1) / KW;
    auto load = [&](uint32_t i) { mmw_load_x<NX>(sbase + (i % MMW_STAGES) * STAGE, xc, kw + KW * i, nb, nx); };
    if (nbk > 0) load(0);
    asm volatile("cp.async.commit_group;\n" ::);
    if (nbk > 1) load(1);
    asm volatile("cp.async.commit_group;\n" ::);
    double yacc[NT];
#pragma unroll
    for (int n = 0; n < NT; n++) yacc[n] = 0.0;
    for (uint32_t i = 0; i < nbk; i++) {
        const uint32_t b = kw + KW * i;
        mmi_w U;
        mmi_load(W + ((size_t)tile * nb + b) * MMI_UNIT, lane, U);
        const uint4(&q)[4] = U.q;
        const uint4 sc = U.sc, mn = U.mn;
        const uint2 dd = U.dd;
        asm volatile("cp.async.wait_group 1;\n" ::);
        asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
        __syncthreads();
        if (i + 2 < nbk) load(i + 2);
        asm volatile("cp.async.commit_group;\n" ::);
        uint32_t pl[8][2][4];
        mmi_planes(q, sc, pl);
        int cl[N / 2], ch[N / 2];
        mmw_products<N>(cl, ch, pl, sbase + (i % MMW_STAGES) * STAGE, SLICE);
        /* the min term and the scales while the products run */
        uint32_t bm[NM];
#pragma unroll
        for (int k = 0; k < NM; k++)
            bm[k] = __ldg((const uint32_t *)(xc + ((size_t)min(4 * k + (g >> 1), nx - 1) * nb + b) * MMI_XBLK + 1024 +
                                             ((g & 1) * 4 + t) * 4));
        float Mv[NM][4];
        mmi_min_mma<NM>(mn, t, bm, Mv);
        double sxv[NT];
#pragma unroll
        for (int n = 0; n < NT; n++)
            sxv[n] = (double)__ldg((const float *)(xc + ((size_t)min(2 * n + (t >> 1), nx - 1) * nb + b) * MMI_XBLK + 1056));
        wg_wait<0>();
        mmw_fold<N, NM>(yacc, cl, ch, Mv, lane, dd, sxv);
    }
    asm volatile("cp.async.wait_group 0;\n" ::);
    __syncthreads();
    /* the cluster's sums in kw order, through CTA 0's reads of the others' shared memory */
    namespace cg = cooperative_groups;
    cg::cluster_group cl = cg::this_cluster();
    double *part = (double *)sm; /* [warp][n][lane] */
    if (KW > 1) {
#pragma unroll
        for (int n = 0; n < NT; n++) part[(wid * NT + n) * 32 + lane] = yacc[n];
        cl.sync();
        if (kw == 0)
#pragma unroll
            for (int k = 1; k < KW; k++) {
                const double *rp = cl.map_shared_rank(part, k);
#pragma unroll
                for (int n = 0; n < NT; n++) yacc[n] += rp[(wid * NT + n) * 32 + lane];
            }
        cl.sync();
        if (kw != 0) return;
    }
    if (live) mmi_store<NT>(y, yacc, nx, rows, tile, lane);
}
/* mmw3's x bytes a stage: two 128-k slices of N = 4·NX columns × 128 bytes */
template <int NX> __host__ __device__ constexpr uint32_t mmw3_xbytes() { return 2u * (4 * NX) * 128; }
template <int NX, int NWG> __host__ __device__ constexpr uint32_t mmw3_stage()
{
    return (mmw3_xbytes<NX>() + 4 * NWG * MMI_UNIT + NX * 48 + 1023) & ~1023u;
}
/* the stages that fit 227 KB over the CTAs an SM takes (NWG 1: two), at most 5 */
template <int NX, int NWG> __host__ __device__ constexpr uint32_t mmw3_nst()
{
    return ((227u * 1024) / (NWG == 1 ? 2 : 1) - 1024) / mmw3_stage<NX, NWG>() < 5
               ? ((227u * 1024) / (NWG == 1 ? 2 : 1) - 1024) / mmw3_stage<NX, NWG>()
               : 5;
}
template <int NX, int NWG> constexpr size_t mmw3_smem() { return (size_t)mmw3_nst<NX, NWG>() * mmw3_stage<NX, NWG>() + 1024; }
/* mmw3: the weights staged too, on a persistent grid. The block's units of the CTA's 4·NWG tiles
 * and x's columns for NX rows (and its sums and s) go through an S-stage cp.async ring, S − 2
 * blocks ahead (a block's stage stays intact while the block after it runs, for its fold); a warp
 * builds its planes from shared memory, issues the block's 16 products into one of two
 * accumulator sets and folds the block before it from the other set while they run (the min
 * term's mma.sync goes before the products: one while a group is in flight makes the compiler
 * wait for the group). One CTA an SM (NWG 1: two). The work is (tile group of 4·NWG tiles, kw)
 * items, item k·grid + blockIdx.x to CTA blockIdx.x; the ring runs on across items, so a CTA fills
 * its pipeline once. An item's f64 sums go to part[kw][x row][row]; the CTA whose item is a
 * group's last to arrive (a counter per group, reset by it) adds the KW pieces in kw order and
 * rounds once: the order of mmi_kernel's KW warps, so the same bytes. */
struct mmw3_args {
    const uint8_t *W, *xc;
    uint32_t nb, nx, rows;
    float *y;
    double *part;   /* [KW][nx][rows] */
    uint32_t *cnt;  /* [groups], zero between launches */
};
template <int NX, int KW, int NWG = MMW_NWG>
__global__ void __launch_bounds__(128 * NWG, NWG == 1 ? 2 : 1) mmw3_kernel(const mmw3_args A)
{
    constexpr int N = 4 * NX, NT = NX / 2, NM = (NX + 3) / 4;
    constexpr uint32_t S = mmw3_nst<NX, NWG>();
    constexpr uint32_t SLICE = N * 128, XB = mmw3_xbytes<NX>(), STG = mmw3_stage<NX, NWG>(), UB = XB,
                       SB = XB + 4 * NWG * MMI_UNIT;
    extern __shared__ uint8_t mmw_raw[];
    uint8_t *sm = mmw_raw + ((1024u - ((uint32_t)__cvta_generic_to_shared(mmw_raw) & 1023u)) & 1023u);
    __shared__ uint32_t last_flag;
    const uint32_t sbase = (uint32_t)__cvta_generic_to_shared(sm);
    const uint32_t wid = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const uint32_t nb = A.nb, nx = A.nx, rows = A.rows, ntile = rows / 16, TPG = 4 * NWG;
    const uint32_t ngroup = (ntile + TPG - 1) / TPG, nitem = ngroup * KW;
    /* a cursor over this CTA's (item, block) steps */
    struct cur {
        uint32_t item, j;
    };
    auto nblk = [&](uint32_t item) { return (nb - item % KW + KW - 1) / KW; };
    auto advance = [&](cur &c) {
        if (++c.j >= nblk(c.item)) c.j = 0, c.item += gridDim.x;
    };
    auto load = [&](const cur &c, uint32_t slot) {
        if (c.item >= nitem) return;
        const uint32_t grp = c.item / KW, b = c.item % KW + KW * c.j, st = sbase + (slot % S) * STG, tg0 = grp * TPG;
        mmw_load_x<NX>(st, A.xc, b, nb, nx);
        mmw_load_units_sums<NX>(st + UB, st + SB, A.W, A.xc, tg0, TPG, ntile, b, nb, nx);
    };
    cur lc = {blockIdx.x, 0}; /* the load cursor, S − 2 steps ahead */
#pragma unroll
    for (uint32_t s = 0; s < S - 2; s++) {
        load(lc, s);
        advance(lc);
        asm volatile("cp.async.commit_group;\n" ::);
    }
    double yacc[NT];
#pragma unroll
    for (int n = 0; n < NT; n++) yacc[n] = 0.0;
    int acc[2][2][N / 2];
    /* the min term of block `slot` (one m16n8k8 per 4 x rows), made before its products are issued:
     * an mma.sync while a group is in flight makes the compiler wait for the group */
    auto minterm = [&](uint32_t slot, float (&Mv)[NM][4]) {
        const uint8_t *stp = sm + (slot % S) * STG, *unit = stp + UB + wid * MMI_UNIT;
        uint32_t bm[NM];
#pragma unroll
        for (int k = 0; k < NM; k++)
            bm[k] = *(const uint32_t *)(stp + SB + 48 * min(4 * k + (g >> 1), nx - 1) + ((g & 1) * 4 + t) * 4);
        mmi_min_mma<NM>(*(const uint4 *)(unit + 2176 + 16 * g), t, bm, Mv);
    };
    float Mset[2][NM][4];
    auto fold = [&](uint32_t slot, const int (&cl)[N / 2], const int (&ch)[N / 2], const float (&Mv)[NM][4]) {
        const uint8_t *stp = sm + (slot % S) * STG, *unit = stp + UB + wid * MMI_UNIT;
        double sx[NT];
#pragma unroll
        for (int n = 0; n < NT; n++) sx[n] = (double)*(const float *)(stp + SB + 48 * min(2 * n + (t >> 1), nx - 1) + 32);
        mmw_fold<N, NM>(yacc, cl, ch, Mv, lane, *(const uint2 *)(unit + 2304 + 8 * g), sx);
    };
    auto issue = [&](uint32_t slot, int (&cl)[N / 2], int (&ch)[N / 2], float (&Mv)[NM][4]) {
        asm volatile("cp.async.wait_group %0;\n" ::"n"(S - 3));
        asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
        __syncthreads();
        load(lc, slot + S - 2);
        advance(lc);
        asm volatile("cp.async.commit_group;\n" ::);
        const uint8_t *unit = sm + (slot % S) * STG + UB + wid * MMI_UNIT;
        uint4 q[4];
#pragma unroll
        for (int u = 0; u < 4; u++) q[u] = *(const uint4 *)(unit + (u * 32 + lane) * 16);
        const uint4 sc = *(const uint4 *)(unit + 2048 + 16 * g);
        uint32_t pl[8][2][4];
        mmi_planes(q, sc, pl);
        minterm(slot, Mv);
        mmw_products<N>(cl, ch, pl, sbase + (slot % S) * STG, SLICE);
    };
    /* an item's end: its sums to part; the group's last item adds the pieces in kw order */
    auto finish = [&](uint32_t item) {
        const uint32_t grp = item / KW, kw = item % KW, tile = grp * TPG + wid;
        if (KW == 1) {
            if (tile < ntile) mmi_store<NT>(A.y, yacc, nx, rows, tile, lane);
        } else {
            if (tile < ntile) mmw_part_put<NT>(A.part, yacc, kw, nx, rows, tile, lane);
            __threadfence();
            __syncthreads();
            if (threadIdx.x == 0) last_flag = atomicAdd(A.cnt + grp, 1u) == KW - 1;
            __syncthreads();
            if (last_flag) {
                __threadfence();
                const uint32_t r0 = grp * TPG * 16;
                mmw_part_sum<KW>(A.part, A.y, r0, min(TPG * 16, rows - r0), nx, rows, threadIdx.x, blockDim.x);
                if (threadIdx.x == 0) A.cnt[grp] = 0;
            }
        }
#pragma unroll
        for (int n = 0; n < NT; n++) yacc[n] = 0.0;
    };
    cur cc = {blockIdx.x, 0}; /* the compute cursor */
    uint32_t slot = 0;
    bool have_prev = false;
    cur pc = cc;
    /* steps in pairs, so each accumulator set is a compile-time name */
    while (cc.item < nitem) {
        issue(slot, acc[0][0], acc[0][1], Mset[0]);
        if (have_prev) {
            fold(slot - 1, acc[1][0], acc[1][1], Mset[1]);
            if (pc.j + 1 == nblk(pc.item)) finish(pc.item);
        }
        wg_wait<0>();
        pc = cc;
        have_prev = true;
        advance(cc);
        slot++;
        if (cc.item >= nitem) break;
        issue(slot, acc[1][0], acc[1][1], Mset[1]);
        fold(slot - 1, acc[0][0], acc[0][1], Mset[0]);
        if (pc.j + 1 == nblk(pc.item)) finish(pc.item);
        wg_wait<0>();
        pc = cc;
        advance(cc);
        slot++;
    }
    if (have_prev) {
        if (slot % 2) fold(slot - 1, acc[0][0], acc[0][1], Mset[0]);
        else fold(slot - 1, acc[1][0], acc[1][1], Mset[1]);
        finish(pc.item);
    }
    asm volatile("cp.async.wait_group 0;\n" ::);
}

__device__ __forceinline__ void mbar_init(uint32_t a, uint32_t n)
{
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(a), "r"(n));
}
__device__ __forceinline__ void mbar_wait(uint32_t a, uint32_t parity)
{
    asm volatile("{\n.reg .pred p;\nW: mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n@!p bra W;\n}\n" ::"r"(a),
                 "r"(parity)
                 : "memory");
}
__device__ __forceinline__ void mbar_arrive(uint32_t a)
{
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(a) : "memory");
}
__device__ __forceinline__ void mbar_cp_arrive(uint32_t a)
{
    asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(a) : "memory");
}

/* mmw4 (BULK false): the staged ring with the warps specialized. One producer warp fills the stages by
 * cp.async, each lane's copies completing on the stage's `full` mbarrier
 * (cp.async.mbarrier.arrive.noinc); the consumer warpgroups never meet at a CTA barrier: each waits
 * on `full`, makes its planes, issues its products, arrives on the stage's `empty` barrier once they
 * are done and folds, so one warpgroup's fold runs while another's products do. An item's pieces
 * are added by the last of its KW arrivals per (group, warpgroup), as in mmw3.
 * mmw5 (BULK): the copies made by the bulk engine. One lane of the producer warp issues, per stage,
 * eight cp.async.bulk of the group's 2368-byte units and one of x's block, the whole stage completing
 * on `full` as bytes (mbarrier expect_tx / complete_tx). x comes pre-laid for it (mmw_swz): per block
 * [slice][column][128 bytes, 16-byte chunk q at q ^ (column & 7)] for NX rows, then each row's 48
 * bytes of sums and s — the shared tile's image, so one copy lands it. */
template <int NX> __host__ __device__ constexpr uint32_t mmw5_xblk() { return mmw3_xbytes<NX>() + NX * 48; }
/* x rows (column layout, mmw_cols) → mmw5's image for NX rows; row r ≥ nx takes row nx − 1 */
template <int NX>
__global__ void mmw_swz(const uint8_t *xc, uint8_t *dst, uint32_t nb, uint32_t nx)
{
    const uint32_t b = blockIdx.x;
    uint8_t *d = dst + (size_t)b * mmw5_xblk<NX>();
    for (uint32_t c = threadIdx.x; c < 4 * NX * 16; c += blockDim.x) {
        const uint8_t *src;
        uint8_t *o = d + mmw_x_piece<NX>(c, xc, b, nb, nx, src);
        for (int i = 0; i < 16; i++) o[i] = src[i];
    }
    for (uint32_t c = threadIdx.x; c < NX * 48; c += blockDim.x) {
        const uint32_t r = c / 48, o = c % 48;
        d[mmw3_xbytes<NX>() + c] = xc[((size_t)min(r, nx - 1) * nb + b) * MMI_XBLK + 1024 + o];
    }
}
__device__ __forceinline__ void mbar_expect_tx(uint32_t a, uint32_t bytes)
{
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(a), "r"(bytes) : "memory");
}
__device__ __forceinline__ void bulk_g2s(uint32_t dst, const void *src, uint32_t bytes, uint32_t bar)
{
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(dst),
                 "l"(src), "r"(bytes), "r"(bar)
                 : "memory");
}

template <int NX, int KW, int NWG = 2, bool BULK = true>
__global__ void __launch_bounds__(128 * NWG + 32, 1) mmw5_kernel(const mmw3_args A)
{
    constexpr int N = 4 * NX, NT = NX / 2, NM = (NX + 3) / 4;
    constexpr uint32_t S = mmw3_nst<NX, NWG>();
    constexpr uint32_t SLICE = N * 128, XB = mmw3_xbytes<NX>(), STG = mmw3_stage<NX, NWG>(), UB = XB + NX * 48,
                       SB = XB, XBLK = mmw5_xblk<NX>();
    static_assert(UB + 4 * NWG * MMI_UNIT <= STG, "a stage holds x, the sums and the units");
    extern __shared__ uint8_t mmw_raw[];
    uint8_t *sm = mmw_raw + ((1024u - ((uint32_t)__cvta_generic_to_shared(mmw_raw) & 1023u)) & 1023u);
    __shared__ __align__(8) uint64_t bars[2 * S];
    __shared__ uint32_t last_flag[NWG];
    const uint32_t sbase = (uint32_t)__cvta_generic_to_shared(sm), bbase = (uint32_t)__cvta_generic_to_shared(bars);
    const uint32_t lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const uint32_t nb = A.nb, nx = A.nx, rows = A.rows, ntile = rows / 16, TPG = 4 * NWG;
    const uint32_t ngroup = (ntile + TPG - 1) / TPG, nitem = ngroup * KW;
    auto full = [&](uint32_t s) { return bbase + 8 * s; };
    auto empty = [&](uint32_t s) { return bbase + 8 * (S + s); };
    if (threadIdx.x == 0) {
        for (uint32_t s = 0; s < S; s++) {
            mbar_init(full(s), BULK ? 1 : 32); /* the copying lanes, each when its copies land (mmw4) */
            mbar_init(empty(s), 4 * NWG);
        }
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
    __syncthreads();
    struct cur {
        uint32_t item, j;
    };
    auto nblk = [&](uint32_t item) { return (nb - item % KW + KW - 1) / KW; };
    auto advance = [&](cur &c) {
        if (++c.j >= nblk(c.item)) c.j = 0, c.item += gridDim.x;
    };
    if (threadIdx.x >= 128 * NWG) { /* the producer: one lane (BULK), or the warp's 16-byte copies (mmw4) */
        if (BULK && threadIdx.x != 128 * NWG) return;
        const uint32_t lane_p = threadIdx.x - 128 * NWG;
        uint32_t k = 0;
        for (cur c = {blockIdx.x, 0}; c.item < nitem; advance(c), k++) {
            const uint32_t slot = k % S;
            mbar_wait(empty(slot), ((k / S) & 1) ^ 1);
            const uint32_t grp = c.item / KW, b = c.item % KW + KW * c.j, st = sbase + slot * STG, tg0 = grp * TPG;
            const uint32_t nu = min(TPG, ntile - tg0);
            if constexpr (BULK) {
                mbar_expect_tx(full(slot), XBLK + nu * MMI_UNIT);
                bulk_g2s(st, A.xc + (size_t)b * XBLK, XBLK, full(slot));
                for (uint32_t u = 0; u < nu; u++)
                    bulk_g2s(st + UB + u * MMI_UNIT, A.W + ((size_t)(tg0 + u) * nb + b) * MMI_UNIT, MMI_UNIT, full(slot));
            } else {
                mmw_load_x<NX>(st, A.xc, b, nb, nx, lane_p, 32);
                mmw_load_units_sums<NX>(st + UB, st + SB, A.W, A.xc, tg0, nu, ntile, b, nb, nx, lane_p, 32);
                mbar_cp_arrive(full(slot));
            }
        }
        if (!BULK) asm volatile("cp.async.wait_all;\n" ::);
        return;
    }
    const uint32_t wid = threadIdx.x >> 5, wg = wid >> 2;
    double yacc[NT];
#pragma unroll
    for (int n = 0; n < NT; n++) yacc[n] = 0.0;
    int cl[N / 2], ch[N / 2];
    uint32_t k = 0;
    for (cur c = {blockIdx.x, 0}; c.item < nitem; advance(c), k++) {
        const uint32_t slot = k % S, grp = c.item / KW, tile = grp * TPG + wid;
        /* a warp past the matrix's end reads its group's last unit (copied) and stores nothing */
        const uint32_t wu = min(wid, ntile - 1 - grp * TPG);
        mbar_wait(full(slot), (k / S) & 1);
        const uint8_t *stp = sm + slot * STG, *unit = stp + UB + wu * MMI_UNIT;
        uint4 q[4];
#pragma unroll
        for (int u = 0; u < 4; u++) q[u] = *(const uint4 *)(unit + (u * 32 + lane) * 16);
        uint32_t pl[8][2][4];
        mmi_planes(q, *(const uint4 *)(unit + 2048 + 16 * g), pl);
        float Mv[NM][4];
        {
            uint32_t bm[NM];
#pragma unroll
            for (int kk = 0; kk < NM; kk++)
                bm[kk] = *(const uint32_t *)(stp + SB + 48 * (4 * kk + (g >> 1)) + ((g & 1) * 4 + t) * 4);
            mmi_min_mma<NM>(*(const uint4 *)(unit + 2176 + 16 * g), t, bm, Mv);
        }
        mmw_products<N>(cl, ch, pl, sbase + slot * STG, SLICE);
        const uint2 dd = *(const uint2 *)(unit + 2304 + 8 * g);
        double sxv[NT];
#pragma unroll
        for (int n = 0; n < NT; n++) sxv[n] = (double)*(const float *)(stp + SB + 48 * (2 * n + (t >> 1)) + 32);
        wg_wait<0>();
        __syncwarp();
        if (lane == 0) mbar_arrive(empty(slot));
        mmw_fold<N, NM>(yacc, cl, ch, Mv, lane, dd, sxv);
        if (c.j + 1 < nblk(c.item)) continue;
        const uint32_t kw = c.item % KW;
        if (KW == 1) {
            if (tile < ntile) mmi_store<NT>(A.y, yacc, nx, rows, tile, lane);
        } else {
            if (tile < ntile) mmw_part_put<NT>(A.part, yacc, kw, nx, rows, tile, lane);
            __threadfence();
            asm volatile("bar.sync %0, 128;\n" ::"r"(1 + wg));
            if ((threadIdx.x & 127) == 0) last_flag[wg] = atomicAdd(A.cnt + NWG * grp + wg, 1u) == KW - 1;
            asm volatile("bar.sync %0, 128;\n" ::"r"(1 + wg));
            if (last_flag[wg]) {
                __threadfence();
                const uint32_t r0 = (grp * TPG + 4 * wg) * 16;
                mmw_part_sum<KW>(A.part, A.y, r0, r0 < rows ? min(64u, rows - r0) : 0, nx, rows, threadIdx.x & 127, 128);
                if ((threadIdx.x & 127) == 0) A.cnt[NWG * grp + wg] = 0;
            }
        }
#pragma unroll
        for (int n = 0; n < NT; n++) yacc[n] = 0.0;
    }
}

template <int NX> constexpr size_t mmw_smem() { return (size_t)MMW_STAGES * 2 * (4 * NX) * 128 + 1024; }

/* ---- mmi_sx: mmi_kernel's arithmetic with each block's x (and units) staged in shared memory ----
 * The 16-row mmi_kernel waits on latency, not on a pipe (NOTES, "mmi"): 8 warps an SM (248
 * registers), each x fragment an L2 load issued just before its product, each block's units a
 * DRAM load with nothing ahead of it. Here the TG warps that walk the same blocks (one kw, TG =
 * 8 / KW tiles) copy the x rows of a later block (nx × 1072 bytes) into a shared stage by cp.async
 * while they compute this one: XS stages, XS − 1 blocks ahead, one named barrier a block per kw
 * group. WST: each warp stages its own unit (2368 bytes) the same way; else its next unit is loaded
 * into registers a block ahead. The products, the fold, the kw order and the store are
 * mmi_kernel's, so a row has mmi_kernel's bytes for its KW.
 * Measured (H100, 2026-12-07, NOTES "x staged"): slower than mmi_kernel at the same KW (16 rows: the
 * gate·up shape 177.8–182.1 µs against 161.7), so the wait was not x's L2 latency. */
template <int NT, int KW, int XS = 2, bool WST = true>
constexpr size_t mmi_sx_smem() { return (size_t)XS * (KW * 2 * NT * MMI_XBLK + (WST ? 8 * MMI_UNIT : 0)); }

template <int NT, int KW, int MINB, int XS = 2, bool WST = true>
__global__ void __launch_bounds__(256, MINB)
    mmi_sx_kernel(const uint8_t *__restrict__ W, uint32_t nb, const uint8_t *__restrict__ xq, uint32_t nx, float *__restrict__ y,
                  uint32_t rows)
{
    static_assert(XS == 2 || XS == 3, "two or three stages");
    constexpr int TG = 8 / KW, NM = (2 * NT + 3) / 4, NXM = 2 * NT;
    constexpr uint32_t XST = NXM * MMI_XBLK; /* one group's x stage */
    constexpr uint32_t XB = XS * KW * XST;   /* x stages: [kw][stage] */
    __shared__ double red[KW > 1 ? KW - 1 : 1][TG][NT][32];
    extern __shared__ __align__(16) uint8_t sx_raw[];
    const uint32_t warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3, hi = t & 1;
    const uint32_t kw = warp % KW, tg = warp / KW, ntile = rows / 16, tile0 = blockIdx.x * TG + tg;
    const bool live = tile0 < ntile;
    const uint32_t tile = live ? tile0 : ntile - 1; /* past the end: a copy of the last tile, nothing stored */
    const uint32_t nxe = min(nx, (uint32_t)NXM), gl = tg * 32 + lane; /* this lane's index in its kw group */
    uint8_t *xs0 = sx_raw + (size_t)kw * XS * XST, *ws0 = sx_raw + XB + (size_t)warp * XS * MMI_UNIT;
    const uint32_t xs_a = (uint32_t)__cvta_generic_to_shared(xs0), ws_a = (uint32_t)__cvta_generic_to_shared(ws0);
    const uint8_t *wt = W + (size_t)tile * nb * MMI_UNIT;
    /* block b's copies into stage st (b ≥ nb: none), then one commit group */
    auto issue = [&](uint32_t b, uint32_t st) {
        if (b < nb) {
            for (uint32_t c = gl; c < nxe * (MMI_XBLK / 16); c += TG * 32) {
                const uint32_t r = c / (MMI_XBLK / 16), o = 16 * (c % (MMI_XBLK / 16));
                mmw_cp16(xs_a + st * XST + r * MMI_XBLK + o, xq + ((size_t)r * nb + b) * MMI_XBLK + o);
            }
            if (WST)
                for (uint32_t c = lane; c < MMI_UNIT / 16; c += 32)
                    mmw_cp16(ws_a + st * MMI_UNIT + 16 * c, wt + (size_t)b * MMI_UNIT + 16 * c);
        }
        tc_commit();
    };
    double yacc[NT];
#pragma unroll
    for (int n = 0; n < NT; n++) yacc[n] = 0.0;
    mmi_w U;
    if (!WST && kw < nb) mmi_load(wt + (size_t)kw * MMI_UNIT, lane, U);
    issue(kw, 0);
    if (XS == 3) issue(kw + KW, 1);
    for (uint32_t b = kw, i = 0; b < nb; b += KW, i++) {
        tc_wait<XS - 2>();
        if (TG > 1) asm volatile("bar.sync %0, %1;\n" ::"r"(1 + kw), "r"(TG * 32) : "memory");
        else __syncwarp();
        issue(b + (XS - 1) * KW, (i + XS - 1) % XS);
        const uint32_t st = i % XS;
        const uint8_t *xsb = xs0 + st * XST;
        if (WST) {
            const uint8_t *unit = ws0 + st * MMI_UNIT;
#pragma unroll
            for (int u = 0; u < 4; u++) U.q[u] = *(const uint4 *)(unit + (u * 32 + lane) * 16);
            U.sc = *(const uint4 *)(unit + 2048 + 16 * g);
            U.mn = *(const uint4 *)(unit + 2176 + 16 * g);
            U.dd = *(const uint2 *)(unit + 2304 + 8 * g);
        }
        const mmi_w C = U;
        if (!WST && b + KW < nb) mmi_load(wt + (size_t)(b + KW) * MMI_UNIT, lane, U); /* the next unit, in flight */
        const uint8_t *xb[NT];
#pragma unroll
        for (int n = 0; n < NT; n++) xb[n] = xsb + min(2 * (uint32_t)n + (g >> 2), nxe - 1) * MMI_XBLK + ((g & 3) * 4 + t) * 8;
        int acc[NT][4];
#pragma unroll
        for (int n = 0; n < NT; n++) acc[n][0] = acc[n][1] = acc[n][2] = acc[n][3] = 0;
        mmi_products<NT, true>(C.q, C.sc, xb, acc);
        uint32_t bm[NM];
#pragma unroll
        for (int k = 0; k < NM; k++)
            bm[k] = *(const uint32_t *)(xsb + min(4 * (uint32_t)k + (g >> 1), nxe - 1) * MMI_XBLK + 1024 + ((g & 1) * 4 + t) * 4);
        float Mv[NM][4];
        mmi_min_mma<NM>(C.mn, t, bm, Mv);
#pragma unroll
        for (int n = 0; n < NT; n++) {
            const uint32_t xr = 2 * n + (t >> 1);
            const double sxv = (double)*(const float *)(xsb + min(xr, nxe - 1) * MMI_XBLK + 1056);
            mmi_fold<NM>(yacc[n], mmi_pair_T(acc[n], hi), Mv, n, lane, C.dd, sxv);
        }
    }
    if (!mmi_kw_sum<KW, NT, TG>(red, kw, tg, lane, yacc) || !live) return;
    mmi_store<NT>(y, yacc, nx, rows, tile, lane);
}

/* ---- mmqd_sx: the engine's multi-row kernel for one matrix (mmqd_body: KW 8, a quad of x rows per
 * NQ) with each warp's next block of x copied into shared memory by cp.async while it computes this
 * one (two stages a warp, no barrier: a warp reads only its own copies), and its next unit loaded
 * into registers a block ahead. mmqd_block's arithmetic in mmqd_body's order, so the engine's bytes.
 * Measured (H100, 2026-12-07): the same bytes, 10–16% slower than mmqd_body at 4–16 rows (the one
 * staging that paid was the old gate·up pair's, mpd_body, since replaced by mmi.cuh's pair). */

/* One warp: block b's x of rows 0 .. nx − 1 (x + r·xs, mmqd's layout) copied by cp.async to the shared
 * address dst, rows MMQD_XBLK apart (the caller commits the group) */
__device__ __forceinline__ void mmqd_stage_x(uint32_t dst, const uint8_t *x, uint32_t xs, uint32_t b, uint32_t nx, uint32_t lane)
{
    constexpr uint32_t CH = MMQD_XBLK / 16;
    for (uint32_t c = lane; c < nx * CH; c += 32) {
        const uint32_t r = c / CH, o = 16 * (c % CH);
        tc_cp16(dst + r * MMQD_XBLK + o, x + (size_t)r * xs + (size_t)b * MMQD_XBLK + o, true);
    }
}

template <int NQ> constexpr size_t mmqd_sx_smem() { return (size_t)2 * 8 * 4 * NQ * MMQD_XBLK; }

template <int NQ, int MINB>
__global__ void __launch_bounds__(256, MINB) mmqd_sx_kernel(const mmq_args A0)
{
    constexpr int KW = 8, NX = 4 * NQ;
    constexpr uint32_t XST = NX * MMQD_XBLK;
    __shared__ double red[NX][8][16];
    extern __shared__ __align__(16) uint8_t dx_raw[];
    mmq_args A = A0;
    const uint32_t cta = mmq_cta(A.ng), nx = mmq_group<mmq_args, NX>(A, mmq_grp(A.ng));
    const uint32_t wid = threadIdx.x >> 5, lane = threadIdx.x & 31, kw = wid, nb = A.K / 256, ntile = A.rows / 16;
    const uint32_t tile = min(cta, ntile - 1);
    const uint8_t *unit = A.a + ((size_t)tile * nb + kw) * MMQ_UNIT;
    uint8_t *xs0 = dx_raw + (size_t)wid * 2 * XST;
    const uint32_t xs_a = (uint32_t)__cvta_generic_to_shared(xs0);
    auto issue = [&](uint32_t b, uint32_t st) {
        if (b < nb) mmqd_stage_x(xs_a + st * XST, A.x, A.xs, b, nx, lane);
        tc_commit();
    };
    float acc[NQ][1][4][2];
#pragma unroll
    for (int Q = 0; Q < NQ; Q++)
#pragma unroll
        for (int k = 0; k < 4; k++) acc[Q][0][k][0] = acc[Q][0][k][1] = 0.f;
    mmqd_w W[1];
    if (kw < nb) mmqd_load(unit, lane, W[0]);
    issue(kw, 0);
    for (uint32_t b = kw, i = 0; b < nb; b += KW, i++) {
        tc_wait<0>();
        __syncwarp();
        issue(b + KW, (i + 1) & 1);
        const bool more = b + KW < nb;
        mmqd_w N[1];
        if (more) mmqd_load(unit + (size_t)KW * MMQ_UNIT, lane, N[0]);
        mmqd_block<NQ, 1, true>(W, xs0 + (i & 1) * XST, MMQD_XBLK, nx, lane, acc);
        if (more) W[0] = N[0];
        unit += (size_t)KW * MMQ_UNIT;
    }
    mmqd_end<KW, NQ>(acc, red, A, nx, cta);
}

/* The engine's multi-row kernel (kq4_engine) against mmqd_sx_kernel at 4, 8 and 16 rows: the same
 * bytes, and the time of each. Returns the failed checks. */
static int mmqd_sx_check_time(const kb_qmat &ref, uint32_t rows, uint32_t cols, const mmi_bufs &B, int ncopy, int reps)
{
    CK(cudaFuncSetAttribute(mmqd_sx_kernel<1, 2>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)mmqd_sx_smem<1>()));
    CK(cudaFuncSetAttribute(mmqd_sx_kernel<2, 1>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)mmqd_sx_smem<2>()));
    auto sx = [&](int copy, uint32_t n, float *yy, int nq) {
        mmq_args A = kq4_args(ref.mm[copy], rows, cols, B.xed, n, yy);
        A.ng = (n + 4 * nq - 1) / (4 * nq);
        const uint32_t grid = rows / 16 * A.ng;
        if (nq == 1) mmqd_sx_kernel<1, 2><<<grid, 256, mmqd_sx_smem<1>()>>>(A);
        else mmqd_sx_kernel<2, 1><<<grid, 256, mmqd_sx_smem<2>()>>>(A);
    };
    int fails = 0;
    std::vector<float> he((size_t)16 * rows), hs((size_t)16 * rows);
    const uint32_t nxs[3] = {4, 8, 16};
    for (uint32_t n : nxs)
        for (int nq = 1; nq <= 2; nq++) {
            kq4_engine(ref.mm[0], rows, cols, B.xe1, B.xed, n, B.y);
            CK(cudaDeviceSynchronize());
            CK(cudaMemcpy(he.data(), B.y, (size_t)n * rows * 4, cudaMemcpyDeviceToHost));
            CK(cudaMemset(B.y, 0xFF, (size_t)n * rows * 4));
            sx(0, n, B.y, nq);
            CK(cudaGetLastError());
            CK(cudaDeviceSynchronize());
            CK(cudaMemcpy(hs.data(), B.y, (size_t)n * rows * 4, cudaMemcpyDeviceToHost));
            const bool same = !memcmp(he.data(), hs.data(), (size_t)n * rows * 4);
            if (!same) fails++;
            const float me = kb_time_launches([&](int c) { kq4_engine(ref.mm[c], rows, cols, B.xe1, B.xed, n, B.y); }, ncopy, reps);
            const float ms = kb_time_launches([&](int c) { sx(c, n, B.y, nq); }, ncopy, reps);
            printf("  engine x staged (mmqd_sx, %d quad%s a CTA) %2u rows: %8.1f us against the engine's %8.1f; bytes %s\n", nq,
                   nq > 1 ? "s" : "", n, ms * 1e3, me * 1e3, same ? "the same" : "DIFFER");
        }
    return fails;
}

/* ---- workbench -------------------------------------------------------------------------------- */
typedef void (*mmi_fn)(const uint8_t *, uint32_t, const uint8_t *, uint32_t, float *, uint32_t);
struct mmi_variant {
    const char *name;
    int nt, kw;
    mmi_fn fn;
    int cg, nw;  /* column groups across warps, warps a CTA */
    size_t smem; /* mmw_kernel's dynamic shared memory (its x in columns); 0: mmi's kernels */
    void (*k3)(const mmw3_args); /* mmw3_kernel (persistent): fn unused */
    int nwg;                     /* its warpgroups a CTA */
    void (*swz)(const uint8_t *, uint8_t *, uint32_t, uint32_t); /* mmw5: its x image (mmw_swz) */
    size_t dsm; /* mmi_sx_kernel's dynamic shared memory (its stages); 0: the others */
};
#define VI(NT, KW, MB) {#NT " n-tiles (" #NT "x2 rows), KW " #KW ", " #MB "/SM", NT, KW, mmi_kernel<NT, KW, MB>, 1, 8}
#define VIC(NT, KW, MB, CG, NW)                                                                                          \
    {#NT " n-tiles x " #CG " warps, KW " #KW ", " #MB "/SM", NT, KW, mmi_kernel<NT, KW, MB, CG, NW>, CG, NW}
#define V2(NT, KW, MB, NW) {"2 planes, " #NT " n-tiles, KW " #KW ", " #MB "/SM", NT, KW, mmi_kernel<NT, KW, MB, 1, NW, true>, 1, NW}
#define VW(NX, KW, MB) {"wgmma, " #NX " rows, KW " #KW ", " #MB "/SM", NX / 2, KW, mmw_kernel<NX, KW, MB>, 1, 8, mmw_smem<NX>()}
#define VW3(NX, KW) {"wgmma persistent, " #NX " rows, KW " #KW, NX / 2, KW, NULL, 1, 8, mmw3_smem<NX, MMW_NWG>(), mmw3_kernel<NX, KW>, MMW_NWG}
#define VW4(NX, KW) {"wgmma specialized, " #NX " rows, KW " #KW, NX / 2, KW, NULL, 1, 8, mmw3_smem<NX, 2>(), mmw5_kernel<NX, KW, 2, false>, -2}
#define VW5(NX, KW) VW5W(NX, KW, 2)
#define VW5W(NX, KW, W)                                                                                                  \
    {"wgmma bulk copies, " #W " WGs, " #NX " rows, KW " #KW, NX / 2, KW, NULL, 1, 8, mmw3_smem<NX, W>(), mmw5_kernel<NX, KW, W>, \
     -(W), mmw_swz<NX>}
#define VSX(NT, KW, MB) VSXS(NT, KW, MB, 2, true, "x, units staged")
#define VSXS(NT, KW, MB, XS, WST, WHAT)                                                                                  \
    {WHAT " (" #XS " stages), " #NT " n-tiles, KW " #KW ", " #MB "/SM", NT, KW, mmi_sx_kernel<NT, KW, MB, XS, WST>, 1, 8, 0, \
     NULL, 0, NULL, mmi_sx_smem<NT, KW, XS, WST>()}
#define VW31(NX, KW) {"wgmma persistent 1 WG x2, " #NX " rows, KW " #KW, NX / 2, KW, NULL, 1, 8, mmw3_smem<NX, 1>(), mmw3_kernel<NX, KW, 1>, 1}

int main(int argc, char **argv)
{
    const int reps = argc > 1 ? atoi(argv[1]) : 9;
    const cudaDeviceProp prop = kb_device();
    const double ceil_gbs = kb_read_ceiling(prop.multiProcessorCount, kb_fill_q4k);
    int fails = 0;
    /* Glimmer's Q4_K shapes, and ffn_gate + ffn_up as one matrix of 39936 rows: the engine runs that
     * pair as one fused launch (2.17 ms a pass at one row, 41.7 µs a layer: compare with that, not
     * with this bench's single-matrix engine line) */
    const uint32_t shapes[5][2] = {{kq4_shapes[0][0], kq4_shapes[0][1]}, {kq4_shapes[1][0], kq4_shapes[1][1]},
                                   {kq4_shapes[2][0], kq4_shapes[2][1]}, {kq4_shapes[3][0], kq4_shapes[3][1]}, {39936, 6656}};
    for (int sh = 0; sh < 5; sh++) {
        const uint32_t rows = shapes[sh][0], cols = shapes[sh][1], nb = cols / 256;
        const size_t ubytes = (size_t)rows / 16 * nb * MMI_UNIT;
        const int ncopy = kb_n_copy(ubytes, 8);
        kb_qmat ref; /* the raw rows sampled for the f64 reference, and the engine's Q4_KT copies */
        kb_make_qmat(ref, GGML_TYPE_Q4_K, rows, cols, ncopy, 21 + sh, NULL, mmq_repack_q4k);
        const std::vector<uint8_t *> units = mmi_units(kb_fill_q4k, mmi_repack, ref.bytes, rows, nb, ubytes, ncopy, 21 + sh);
        mmi_bufs B = mmi_bufs_new(rows, cols, mmq_x_bytes(cols), 16 * mmqd_x_bytes(cols));
        mmq_prep_launch(0, B.x, B.xe1, cols);
        mmq_prep_launch_t<mmqd_prep>(0, B.x, B.xed, cols, false, 16, cols, (uint32_t)mmqd_x_bytes(cols));
        CK(cudaGetLastError());
        /* a row's bits depend on KW (the matrix's), never on the kernel: every KW has its 16-row reference */
        const mmi_variant vars_all[] = {VI(8, 8, 1),         VI(1, 8, 4), VI(1, 8, 3), VI(2, 8, 3), VI(4, 8, 2), VI(8, 8, 2),
                                    VIC(4, 8, 1, 2, 16), VIC(2, 8, 1, 4, 32), VIC(2, 8, 2, 2, 16),
                                    /* other block splits (other bits, each checked against its own 16-row kernel) */
                                    VIC(8, 16, 1, 1, 16), VIC(1, 16, 2, 1, 16), VIC(2, 16, 2, 1, 16), VIC(8, 4, 1, 1, 8),
                                    VIC(1, 4, 4, 1, 8), VIC(1, 4, 3, 1, 8),
                                    /* the two-plane kernels (mmi_kernel<…, true>) */
                                    V2(8, 8, 1, 8), V2(8, 8, 2, 8), V2(4, 8, 2, 8), V2(2, 8, 2, 8), V2(2, 8, 3, 8),
                                    V2(8, 16, 1, 16), V2(8, 4, 1, 8), V2(8, 4, 2, 8),
                                    /* the warpgroup kernels (mmw_kernel) */
                                    VW(16, 4, 1), VW(16, 8, 1), VW(16, 4, 2), VW(8, 4, 2), VW(4, 4, 2), VW(4, 4, 3),
                                    VW(2, 4, 2), VW(16, 2, 1), VW(16, 1, 1),
                                    VW3(16, 4), VW3(16, 8), VW3(16, 2), VW3(16, 1), VW3(8, 4), VW3(4, 4), VW3(4, 8), VW3(2, 4),
                                    VW31(16, 4), VW31(16, 2), VW31(16, 8), VW31(8, 4), VW31(4, 4), VW31(4, 2), VW31(2, 4),
                                    VW4(16, 4), VW4(16, 2), VW4(16, 1), VW4(16, 8), VW4(8, 4), VW4(4, 4), VW4(2, 4), VW4(2, 2),
                                    VW5(16, 4), VW5(16, 2), VW5(16, 1), VW5(16, 8), VW5(8, 4), VW5(4, 4), VW5(2, 4), VW5(2, 2),
                                    VW5W(16, 2, 3), VW5W(8, 2, 3), VW5W(4, 4, 4), VW5W(2, 4, 4),
                                    /* x and units staged in shared memory (mmi_sx_kernel) */
                                    VSX(8, 4, 1), VSX(4, 4, 2), VSX(8, 2, 1), VSX(8, 2, 2), VSX(2, 4, 2),
                                    VSXS(8, 4, 1, 3, false, "x staged"), VSXS(8, 4, 1, 2, false, "x staged"),
                                    VSXS(4, 4, 2, 2, false, "x staged"), VSXS(8, 2, 1, 3, true, "x, units staged"),
                                    /* KW 2 unstaged: the staged KW 2 rows' reference (is their gain the split's?) */
                                    VIC(8, 2, 1, 1, 8)};
        /* kbench_mmi REPS FILTER: only the variants whose name holds FILTER, and the plain 16-row mmi
         * kernels (each block split's reference) */
        std::vector<mmi_variant> vars;
        for (const auto &v : vars_all)
            if (argc < 3 || strstr(v.name, argv[2]) || (!v.smem && !v.dsm && !strncmp(v.name, "8 n-tiles", 9)))
                vars.push_back(v);
        for (const auto &v : vars) {
            if (v.dsm) CK(cudaFuncSetAttribute(v.fn, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)v.dsm));
            if (v.k3) CK(cudaFuncSetAttribute(v.k3, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)v.smem));
            else if (v.smem) CK(cudaFuncSetAttribute(v.fn, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)v.smem));
        }
        double *part3;
        uint32_t *cnt3;
        CK(cudaMalloc(&part3, (size_t)8 * 16 * rows * sizeof(double)));
        CK(cudaMalloc(&cnt3, (size_t)(rows / 16 + 2) * sizeof(uint32_t)));
        CK(cudaMemset(cnt3, 0, (size_t)(rows / 16 + 2) * sizeof(uint32_t)));
        uint8_t *xc, *xc1; /* the x rows in mmw's column layout */
        CK(cudaMalloc(&xc, (size_t)16 * nb * MMI_XBLK));
        CK(cudaMalloc(&xc1, (size_t)nb * MMI_XBLK));
        mmw_cols<<<16 * nb, 256>>>(B.xq, xc, 16 * nb);
        CK(cudaGetLastError());
        /* mmw5's x images of the 16 rows' first NX (NX = 2, 4, 8, 16), and a scratch one for a row alone */
        uint8_t *xs[5] = {NULL, NULL, NULL, NULL, NULL}, *xs1;
        const size_t xs_bytes[5] = {0, (size_t)nb * mmw5_xblk<2>(), (size_t)nb * mmw5_xblk<4>(), (size_t)nb * mmw5_xblk<8>(),
                                    (size_t)nb * mmw5_xblk<16>()};
        {
            void (*swz[5])(const uint8_t *, uint8_t *, uint32_t, uint32_t) = {NULL, mmw_swz<2>, mmw_swz<4>, mmw_swz<8>,
                                                                            mmw_swz<16>};
            for (int i = 1; i < 5; i++) {
                CK(cudaMalloc(&xs[i], xs_bytes[i]));
                swz[i]<<<nb, 256>>>(xc, xs[i], nb, 16);
            }
            CK(cudaMalloc(&xs1, xs_bytes[4]));
            CK(cudaGetLastError());
        }
        auto xs_of = [&](uint32_t nxk) { return xs[nxk == 2 ? 1 : nxk == 4 ? 2 : nxk == 8 ? 3 : 4]; };
        auto launch = [&](const mmi_variant &v, int copy, const uint8_t *xx, uint32_t n, float *yy) {
            if (v.dsm) {
                const uint32_t per = (uint32_t)(8 / v.kw);
                v.fn<<<(rows / 16 + per - 1) / per, 256, v.dsm>>>(units[copy], nb, xx, n, yy, rows);
                return;
            }
            if (v.smem) {
                const uint8_t *xw = xc;
                if (xx != B.xq) { /* a row alone: its columns first (untimed: only the checks pass other rows) */
                    mmw_cols<<<nb, 256>>>(xx, xc1, nb);
                    xw = xc1;
                }
                const dim3 grid((rows / 16 + 4 * MMW_NWG - 1) / (4 * MMW_NWG), 1, v.kw);
                if (v.swz) { /* mmw5: x as its image for the kernel's rows */
                    const uint32_t nxk = 2 * (uint32_t)v.nt;
                    if (xx == B.xq) xw = xs_of(nxk);
                    else {
                        v.swz<<<nb, 256>>>(xc1, xs1, nb, n);
                        xw = xs1;
                    }
                }
                if (v.k3) {
                    const mmw3_args a3 = {units[copy], xw, nb, n, rows, yy, part3, cnt3};
                    const uint32_t nwg = v.nwg < 0 ? -v.nwg : v.nwg; /* < 0: mmw4 (a producer warp more) */
                    const uint32_t items = (rows / 16 + 4 * nwg - 1) / (4 * nwg) * v.kw;
                    const uint32_t per_sm = nwg == 1 ? 2 : 1;
                    v.k3<<<std::min<uint32_t>(items, per_sm * (uint32_t)prop.multiProcessorCount),
                           v.nwg < 0 ? 128 * nwg + 32 : 128 * nwg, v.smem>>>(a3);
                    return;
                }
                v.fn<<<grid, 128 * MMW_NWG, v.smem>>>(units[copy], nb, xw, n, yy, rows);
                return;
            }
            const uint32_t per = (uint32_t)(v.nw / (v.kw * v.cg));
            v.fn<<<(rows / 16 + per - 1) / per, 32 * v.nw>>>(units[copy], nb, xx, n, yy, rows);
        };
        auto engine = [&](int copy, uint32_t n, float *yy) { kq4_engine(ref.mm[copy], rows, cols, B.xe1, B.xed, n, yy); };
        printf("\n%u x %u Q4_K (%.1f MB as these units, %d copies)\n", rows, cols, ubytes / 1e6, ncopy);
        std::vector<mmi_vinfo> info;
        for (const auto &v : vars) info.push_back({v.name, 2u * v.nt * v.cg, v.kw});
        fails += mmi_check_and_time(ref, rows, cols, ubytes, ncopy, reps, ceil_gbs, info, B, "engine (mmq / mmqd)",
                                    [&](int i, int copy, const uint8_t *xx, uint32_t n, float *yy) { launch(vars[i], copy, xx, n, yy); },
                                    engine);
        fails += mmqd_sx_check_time(ref, rows, cols, B, ncopy, reps);
        for (uint8_t *p : units) CK(cudaFree(p));
        CK(cudaFree(xc));
        CK(cudaFree(xc1));
        CK(cudaFree(part3));
        CK(cudaFree(cnt3));
        for (int i = 1; i < 5; i++) CK(cudaFree(xs[i]));
        CK(cudaFree(xs1));
        kb_free_qmat(ref);
        mmi_bufs_free(B);
    }
    printf("kbench_mmi: %s\n", fails ? "FAIL" : "ok");
    return fails ? 1 : 0;
}
