/* mmi6.cu — the exact-integer-per-block matvec (mmi.cu) for Q6_K: Glimmer's ffn_down, attn_v and
 * the LM head. Nothing here is used by the engine.
 *
 * Q6_K: w = d·sc_j·(q − 32) per 16-group j (int8 sc, q 6 bits). x as in mmi.cu (mmi.cuh): a 31-bit
 * fixed point per (row, block) in four balanced int8 digits. A holds 4·(q − 32) as s8, which is the
 * 6-bit two's complement v = q ^ 0x20 in a byte's top six bits: no sign extension, the 4 leaves in
 * the fold. Per 16-group one m16n8k16 (s8 × s8, exact int32) and one signed IMAD by sc into the
 * block's int32 per digit (|Σ| ≤ 256·128·128·128 < 2^31); then, per (weight row, x row, block), in
 * f64: y += s·(d/4)·Σ_k 2^8k·T_k (the sum exact: |Σ w·v| < 256·2^14·2^30 = 2^52), the blocks of a
 * warp and the KW warps in a fixed order, one rounding to f32. No min term.
 *
 * mma m16n8k16 (s8): lane (g, t) holds A rows g, g+8 at k 4t..4t+3 (a0, a1), B column g at k
 * 4t..4t+3 (b0: group j's half of mmi's b0 / b1 for its sub-block), C as m16n8k32's.
 *
 * Weights, repacked (mmi6_repack): units of (16-row tile, block), MMI6_UNIT = 3360 bytes (the GGUF's):
 *   [0, 2048)    [u 0..3][lane][4 words]: word j (group j) of lane (g, t), byte i: the low nibble of v
 *                at 16j + 4t + i of row g (bits 0-3) and of row g + 8 (bits 4-7)
 *   [2048, 3072) [u 0..1][lane][4 words]: word m (groups 2m, 2m+1), byte i: v's top two bits of row g,
 *                group 2m (bits 6-7), row g + 8, 2m (4-5), row g, 2m + 1 (2-3), row g + 8, 2m + 1 (0-1)
 *   [3072, 3328) per row pair g: the 16 int8 scales of row g, then of row g + 8
 *   [3328, 3360) per row pair g: d_g, d_g8 (f16)
 *   usage: kbench_mmi6 [reps]   (exit 1 if a check fails) */
#include "cuda/mmqd6.cuh"

#include "mmi.cuh"

#define MMI6_UNIT 3360u

/* the 6-bit q at position p of a raw Q6_K block (210 bytes: ql, qh, scales, d) */
__device__ __forceinline__ uint32_t kq6_q(const uint8_t *blk, int p)
{
    const int n = p >> 7, pp = p & 127, c = pp >> 5, l = pp & 31;
    const uint8_t qlb = blk[64 * n + l + 32 * (c & 1)];
    const uint32_t lo = (c >> 1) ? qlb >> 4 : qlb & 15u;
    return lo | ((uint32_t)(blk[128 + 32 * n + l] >> (2 * c)) & 3u) << 4;
}

/* one thread per (tile, block, row pair g) */
__global__ void mmi6_repack(const uint8_t *raw, uint8_t *dst, uint32_t rows, uint32_t nb)
{
    uint32_t g;
    const uint8_t *rw[2];
    uint8_t *u;
    if (!kq_repack_item(raw, dst, rows, nb, 210, MMI6_UNIT, g, rw, u)) return;
    for (uint32_t t = 0; t < 4; t++) {
        const uint32_t lane = 4 * g + t;
        uint32_t hw[8] = {0, 0, 0, 0, 0, 0, 0, 0};
        for (uint32_t j = 0; j < 16; j++) {
            uint32_t word = 0;
            for (uint32_t by = 0; by < 4; by++) {
                const uint32_t v0 = kq6_q(rw[0], (int)(16 * j + 4 * t + by)) ^ 0x20u;
                const uint32_t v8 = kq6_q(rw[1], (int)(16 * j + 4 * t + by)) ^ 0x20u;
                word |= ((v0 & 15u) | (v8 & 15u) << 4) << (8 * by);
                const uint32_t sh = (j & 1) ? 0 : 4; /* group 2m: bits 6-7 and 4-5; 2m + 1: 2-3 and 0-1 */
                hw[j >> 1] |= (((v0 >> 4) << 2 | (v8 >> 4)) << sh) << (8 * by);
            }
            ((uint32_t *)u)[((j >> 2) * 32 + lane) * 4 + (j & 3)] = word;
        }
        for (uint32_t m = 0; m < 8; m++) ((uint32_t *)(u + 2048))[((m >> 2) * 32 + lane) * 4 + (m & 3)] = hw[m];
    }
    for (int r = 0; r < 2; r++)
        for (int j = 0; j < 16; j++) u[3072 + 32 * g + 16 * r + j] = rw[r][192 + j];
    uint16_t *dd = (uint16_t *)(u + 3328 + 4 * g);
    dd[0] = *(const uint16_t *)(rw[0] + 208);
    dd[1] = *(const uint16_t *)(rw[1] + 208);
}

/* NW warps a CTA: NW / KW tiles × KW warps splitting the blocks; a warp NT n-tiles (2·NT x rows);
 * the lane pair holding a row's four digits splits the fold (row g, row g + 8), as mmi_kernel */
template <int NT, int KW, int MINB, int NW = 8>
__global__ void __launch_bounds__(32 * NW, MINB)
    mmi6_kernel(const uint8_t *__restrict__ W, uint32_t nb, const uint8_t *__restrict__ xq, uint32_t nx,
                float *__restrict__ y, uint32_t rows)
{
    static_assert(NW % KW == 0, "NW = tiles · KW");
    constexpr int TG = NW / KW;
    __shared__ double red[KW > 1 ? KW - 1 : 1][TG][NT][32];
    const uint32_t warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3, hi = t & 1;
    const uint32_t kw = warp % KW, tg = warp / KW, tile = blockIdx.x * TG + tg;
    const bool live = tile * 16 < rows;
    double yacc[NT];
#pragma unroll
    for (int n = 0; n < NT; n++) yacc[n] = 0.0;
    for (uint32_t b = kw; live && b < nb; b += KW) {
        const uint8_t *unit = W + ((size_t)tile * nb + b) * MMI6_UNIT;
        uint4 q[4], h[2];
#pragma unroll
        for (int u = 0; u < 4; u++) q[u] = __ldg((const uint4 *)(unit + (u * 32 + lane) * 16));
#pragma unroll
        for (int u = 0; u < 2; u++) h[u] = __ldg((const uint4 *)(unit + 2048 + (u * 32 + lane) * 16));
        const uint4 s0 = __ldg((const uint4 *)(unit + 3072 + 32 * g)), s8 = __ldg((const uint4 *)(unit + 3072 + 32 * g + 16));
        const uint32_t dd = __ldg((const uint32_t *)(unit + 3328 + 4 * g));
        const uint8_t *xb[NT];
#pragma unroll
        for (int n = 0; n < NT; n++)
            xb[n] = xq + ((size_t)min(2 * n + (g >> 2), nx - 1) * nb + b) * MMI_XBLK + ((g & 3) * 4 + t) * 8;
        int acc[NT][4];
#pragma unroll
        for (int n = 0; n < NT; n++) acc[n][0] = acc[n][1] = acc[n][2] = acc[n][3] = 0;
#pragma unroll
        for (int j = 0; j < 16; j++) {
            const uint32_t qw = ((const uint32_t *)&q[j >> 2])[j & 3], hw = ((const uint32_t *)&h[j >> 3])[(j >> 1) & 3];
            const uint32_t e = j & 1; /* the v of rows g, g+8 in each byte's top six bits: 4·(q − 32) */
            const uint32_t a0 = ((qw << 2) & 0x3C3C3C3Cu) | ((e ? hw << 4 : hw) & 0xC0C0C0C0u);
            const uint32_t a1 = ((qw >> 2) & 0x3C3C3C3Cu) | ((e ? hw << 6 : hw << 2) & 0xC0C0C0C0u);
            const uint32_t sw0 = ((const uint32_t *)&s0)[j >> 2], sw8 = ((const uint32_t *)&s8)[j >> 2];
            const int c0 = (int)(int8_t)(sw0 >> (8 * (j & 3))), c8 = (int)(int8_t)(sw8 >> (8 * (j & 3)));
#pragma unroll
            for (int n = 0; n < NT; n++) {
                const uint32_t bx = __ldg((const uint32_t *)(xb[n] + (j >> 1) * 128 + (j & 1) * 4));
                int c[4] = {0, 0, 0, 0};
                mmi_imma16(c, a0, a1, bx);
                acc[n][0] += c0 * c[0];
                acc[n][1] += c0 * c[1];
                acc[n][2] += c8 * c[2];
                acc[n][3] += c8 * c[3];
            }
        }
        const double d0 = 0.25 * (double)__half2float(__ushort_as_half((unsigned short)(dd & 0xFFFF))),
                     d8 = 0.25 * (double)__half2float(__ushort_as_half((unsigned short)(dd >> 16)));
#pragma unroll
        for (int n = 0; n < NT; n++) {
            const double T = mmi_pair_T(acc[n], hi);
            const uint32_t xr = 2 * n + (t >> 1);
            const double sx = (double)__ldg((const float *)(xq + ((size_t)min(xr, nx - 1) * nb + b) * MMI_XBLK + 1056));
            yacc[n] = fma(sx, (hi ? d8 : d0) * T, yacc[n]);
        }
    }
    if (!mmi_kw_sum<KW, NT, NW / KW>(red, kw, tg, lane, yacc) || !live) return;
    mmi_store<NT>(y, yacc, nx, rows, tile, lane);
}

/* ---- workbench -------------------------------------------------------------------------------- */
typedef void (*mmi6_fn)(const uint8_t *, uint32_t, const uint8_t *, uint32_t, float *, uint32_t);
struct mmi6_variant {
    const char *name;
    int nt, kw, nw;
    mmi6_fn fn;
};
#define V6(NT, KW, MB, NW) {#NT " n-tiles (" #NT "x2 rows), KW " #KW ", " #MB "/SM", NT, KW, NW, mmi6_kernel<NT, KW, MB, NW>}

int main(int argc, char **argv)
{
    const int reps = argc > 1 ? atoi(argv[1]) : 9;
    const cudaDeviceProp prop = kb_device();
    const double ceil_gbs = kb_read_ceiling(prop.multiProcessorCount, kb_fill_q6k);
    int fails = 0;
    /* ffn_down (KW 4 in the engine's one-row launch), attn_v (16 tiles), and q's shape as Q6_K */
    const uint32_t shapes[3][2] = {{6656, 19968}, {256, 6656}, {4096, 6656}};
    for (int sh = 0; sh < 3; sh++) {
        const uint32_t rows = shapes[sh][0], cols = shapes[sh][1], nb = cols / 256;
        const size_t ubytes = (size_t)rows / 16 * nb * MMI6_UNIT;
        const int ncopy = kb_n_copy(ubytes, 8);
        const bool down = sh == 0;
        kb_qmat ref; /* the sampled raw rows for the f64 reference, and the engine's Q6_KT copies */
        kb_make_qmat(ref, GGML_TYPE_Q6_K, rows, cols, ncopy, 31 + sh, NULL, mmq6_repack_q6k);
        const std::vector<uint8_t *> units = mmi_units(kb_fill_q6k, mmi6_repack, ref.bytes, rows, nb, ubytes, ncopy, 31 + sh);
        mmi_bufs B = mmi_bufs_new(rows, cols, mmq6_x_bytes(cols), 16 * mmqd6_x_bytes(cols));
        mmq6_prep_launch(0, B.x, B.xe1, cols);
        mmq_prep_launch_t<mmqd6_prep>(0, B.x, B.xed, cols, false, 16, cols, (uint32_t)mmqd6_x_bytes(cols));
        CK(cudaGetLastError());
        /* KW 4 (ffn_down's 78 blocks: the engine's one-row split there) and 8 */
        const mmi6_variant vars[] = {V6(8, 4, 1, 8), V6(1, 4, 4, 8), V6(2, 4, 3, 8), V6(4, 4, 2, 8), V6(8, 4, 2, 8),
                                     V6(8, 8, 1, 8), V6(1, 8, 4, 8), V6(1, 8, 3, 8), V6(8, 8, 2, 8)};
        auto launch = [&](const mmi6_variant &v, int copy, const uint8_t *xx, uint32_t n, float *yy) {
            const uint32_t per = (uint32_t)(v.nw / v.kw);
            v.fn<<<(rows / 16 + per - 1) / per, 32 * v.nw>>>(units[copy], nb, xx, n, yy, rows);
        };
        auto engine = [&](int copy, uint32_t n, float *yy) {
            mmq6_args A;
            memset(&A, 0, sizeof A);
            A.a = ref.mm[copy];
            A.rows = rows;
            A.K = cols;
            A.out = yy;
            A.op = MV_OP_STORE;
            if (n <= 1) {
                A.x = B.xe1;
                if (down) mmq6_launch_down(A, 0, false);
                else mmq6_launch_auto(A, 0, false);
            } else {
                A.x = B.xed;
                A.nx = n;
                A.xs = (uint32_t)mmqd6_x_bytes(cols);
                A.os = rows;
                if (down) mmqd6_launch_down(A, 0, false);
                else mmqd6_launch_auto(A, 0, false);
            }
        };
        printf("\n%u x %u Q6_K (%.1f MB, %d copies)\n", rows, cols, ubytes / 1e6, ncopy);
        std::vector<mmi_vinfo> info;
        for (const auto &v : vars) info.push_back({v.name, 2u * v.nt, v.kw});
        fails += mmi_check_and_time(ref, rows, cols, ubytes, ncopy, reps, ceil_gbs, info, B, "engine (mmq6 / mmqd6)",
                                    [&](int i, int copy, const uint8_t *xx, uint32_t n, float *yy) { launch(vars[i], copy, xx, n, yy); },
                                    engine);
        for (uint8_t *p : units) CK(cudaFree(p));
        kb_free_qmat(ref);
        mmi_bufs_free(B);
    }
    printf("kbench_mmi6: %s\n", fails ? "FAIL" : "ok");
    return fails ? 1 : 0;
}
