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
 *   usage: kbench_mmi [reps]   (exit 1 if a check fails) */
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

/* ---- the kernel ------------------------------------------------------------------------------- */
/* NW warps a CTA: NW / (KW·CG) tiles × CG column groups (of 2·NT x rows each, x row 2·NT·cg on)
 * × KW. Each lane folds one weight row: the lane of a pair with the low digits row g, its partner
 * (the high digits) row g + 8, each getting the other's digits for its row by one shuffle. */
template <int NT, int KW, int MINB, int CG = 1, int NW = 8>
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
        const uint8_t *unit = W + ((size_t)tile * nb + b) * MMI_UNIT;
        uint4 q[4];
#pragma unroll
        for (int u = 0; u < 4; u++) q[u] = __ldg((const uint4 *)(unit + (u * 32 + lane) * 16));
        const uint4 sc = __ldg((const uint4 *)(unit + 2048 + 16 * g)), mn = __ldg((const uint4 *)(unit + 2176 + 16 * g));
        const uint2 dd = __ldg((const uint2 *)(unit + 2304 + 8 * g));
        /* this lane's B column: x row 2n + g/4, digit g%4 */
        const uint8_t *xb[NT];
#pragma unroll
        for (int n = 0; n < NT; n++)
            xb[n] = xq + ((size_t)min(x0 + 2 * n + (g >> 2), nx - 1) * nb + b) * MMI_XBLK + ((g & 3) * 4 + t) * 8;
        int acc[NT][4];
#pragma unroll
        for (int n = 0; n < NT; n++) acc[n][0] = acc[n][1] = acc[n][2] = acc[n][3] = 0;
#pragma unroll
        for (int j = 0; j < 8; j++) {
            const uint4 &qq = q[j >> 1];
            const uint32_t w0 = (j & 1) ? qq.z : qq.x, w1 = (j & 1) ? qq.w : qq.y;
            const uint32_t a[4] = {w0 & 0x0F0F0F0Fu, w1 & 0x0F0F0F0Fu, (w0 >> 4) & 0x0F0F0F0Fu, (w1 >> 4) & 0x0F0F0F0Fu};
            const int s0 = (int)(((j < 4 ? sc.x : sc.y) >> (8 * (j & 3))) & 0xFF);
            const int s8 = (int)(((j < 4 ? sc.z : sc.w) >> (8 * (j & 3))) & 0xFF);
#pragma unroll
            for (int n = 0; n < NT; n++) {
                const uint2 bx = __ldg((const uint2 *)(xb[n] + j * 128));
                int c[4] = {0, 0, 0, 0};
                mmi_imma(c, a, bx.x, bx.y);
                acc[n][0] += s0 * c[0];
                acc[n][1] += s0 * c[1];
                acc[n][2] += s8 * c[2];
                acc[n][3] += s8 * c[3];
            }
        }
        /* the min term: A = m of rows g, g+8 at sub-blocks 2t, 2t+1 (f16), B = the sums' pieces */
        const uint32_t mw0 = t < 2 ? mn.x : mn.y, mw8 = t < 2 ? mn.z : mn.w, sh = 2 * (t & 1);
        const uint32_t am0 = kq4_h2u(kq4_bytes_h2(mw0, (sh | (sh + 1) << 8) | 0x4040u));
        const uint32_t am1 = kq4_h2u(kq4_bytes_h2(mw8, (sh | (sh + 1) << 8) | 0x4040u));
        float Mv[NM][4];
#pragma unroll
        for (int k = 0; k < NM; k++) {
            const uint32_t xr = min(x0 + 4 * k + (g >> 1), nx - 1);
            const uint32_t bm = __ldg((const uint32_t *)(xq + ((size_t)xr * nb + b) * MMI_XBLK + 1024 + ((g & 1) * 4 + t) * 4));
            Mv[k][0] = Mv[k][1] = Mv[k][2] = Mv[k][3] = 0.f;
            kq4_mma8(Mv[k], am0, am1, bm);
        }
        const double d0 = (double)__half2float(__ushort_as_half((unsigned short)(dd.x & 0xFFFF))),
                     d8 = (double)__half2float(__ushort_as_half((unsigned short)(dd.x >> 16))),
                     m0 = 0x1p20 * (double)__half2float(__ushort_as_half((unsigned short)(dd.y & 0xFFFF))),
                     m8 = 0x1p20 * (double)__half2float(__ushort_as_half((unsigned short)(dd.y >> 16)));
#pragma unroll
        for (int n = 0; n < NT; n++) {
            /* this lane's two digits, exact; the partner's two; x row xr = 2n + t/2 */
            const double p0 = (double)acc[n][0] + 256.0 * (double)acc[n][1];
            const double p8 = (double)acc[n][2] + 256.0 * (double)acc[n][3];
            /* the low-digit lane folds row g and gives row g + 8's low digits to its partner */
            const double mine = hi ? p8 : p0, other = __shfl_xor_sync(0xFFFFFFFFu, hi ? p0 : p8, 1);
            const double T = hi ? other + 65536.0 * mine : mine + 65536.0 * other;
            /* the min of x row xr is in lane (g, xr % 4) of min tile n / 2 */
            const uint32_t xr = x0 + 2 * n + (t >> 1), src = 4 * g + (xr & 3);
            const float *mv = Mv[n >> 1];
            const float M0 = __fadd_rn(mv[0], mv[1]), M8 = __fadd_rn(mv[2], mv[3]);
            const float M0r = __shfl_sync(0xFFFFFFFFu, M0, src), M8r = __shfl_sync(0xFFFFFFFFu, M8, src);
            const float Mr = hi ? M8r : M0r;
            const double sx = (double)__ldg((const float *)(xq + ((size_t)min(xr, nx - 1) * nb + b) * MMI_XBLK + 1056));
            yacc[n] = fma(sx, fma(hi ? d8 : d0, T, -(hi ? m8 : m0) * (double)Mr), yacc[n]);
        }
    }
    if (KW > 1) {
        if (kw > 0)
#pragma unroll
            for (int n = 0; n < NT; n++) red[kw - 1][tg * CG + cg][n][lane] = yacc[n];
        __syncthreads();
        if (kw > 0) return;
#pragma unroll
        for (int k = 0; k < KW - 1; k++)
#pragma unroll
            for (int n = 0; n < NT; n++) yacc[n] += red[k][tg * CG + cg][n][lane];
    }
    if (!live) return;
#pragma unroll
    for (int n = 0; n < NT; n++) {
        const uint32_t xr = x0 + 2 * n + (t >> 1), row = tile * 16 + g + 8 * hi;
        if (xr < nx) y[(size_t)xr * rows + row] = (float)yacc[n];
    }
}

/* ---- workbench -------------------------------------------------------------------------------- */
typedef void (*mmi_fn)(const uint8_t *, uint32_t, const uint8_t *, uint32_t, float *, uint32_t);
struct mmi_variant {
    const char *name;
    int nt, kw;
    mmi_fn fn;
    int cg, nw; /* column groups across warps, warps a CTA */
};
#define VI(NT, KW, MB) {#NT " n-tiles (" #NT "x2 rows), KW " #KW ", " #MB "/SM", NT, KW, mmi_kernel<NT, KW, MB>, 1, 8}
#define VIC(NT, KW, MB, CG, NW)                                                                                          \
    {#NT " n-tiles x " #CG " warps, KW " #KW ", " #MB "/SM", NT, KW, mmi_kernel<NT, KW, MB, CG, NW>, CG, NW}

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
        const mmi_variant vars[] = {VI(8, 8, 1),         VI(1, 8, 4), VI(1, 8, 3), VI(2, 8, 3), VI(4, 8, 2), VI(8, 8, 2),
                                    VIC(4, 8, 1, 2, 16), VIC(2, 8, 1, 4, 32), VIC(2, 8, 2, 2, 16),
                                    /* other block splits (other bits, each checked against its own 16-row kernel) */
                                    VIC(8, 16, 1, 1, 16), VIC(1, 16, 2, 1, 16), VIC(2, 16, 2, 1, 16), VIC(8, 4, 1, 1, 8),
                                    VIC(1, 4, 4, 1, 8), VIC(1, 4, 3, 1, 8)};
        auto launch = [&](const mmi_variant &v, int copy, const uint8_t *xx, uint32_t n, float *yy) {
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
        for (uint8_t *p : units) CK(cudaFree(p));
        kb_free_qmat(ref);
        mmi_bufs_free(B);
    }
    printf("kbench_mmi: %s\n", fails ? "FAIL" : "ok");
    return fails ? 1 : 0;
}
