/* mmh.cu — workbench for the small-batch route's next matvec design (#19): Q4_K on f16 tensor
 * cores with exact integer weights and x as two f16 pieces, one fold per 256-block. Nothing here is
 * used by the engine. Results: bench/kernels/NOTES.md, "mmh".
 *
 * Why: the multi-row kernels of src/cuda/mmqd*.cuh take x as exact 8-bit digits of a 24-bit fixed
 * point per 32-group, so every (weight row, x row, sub-block) sum leaves the tensor core as an
 * integer that CUDA cores convert, scale by that sub-block's scale and the group's power of two,
 * and fold: ~800 issue slots per (tile, block) at 4 rows, which is what bounds a 16-row pass
 * (5.4x a decode step against the goal of 1.6x). Here the sub-block scale goes into the weight
 * instead: sc·q (≤ 63·15 = 945) is an integer f16 holds exactly, so the tensor core can sum a
 * whole block, and x goes in as f16 pieces, not integers.
 *
 * Numerics. Per x row and block a power of two s with max|x|/s < 2^14; v = x/s (exact), hi =
 * f16(v), lo = f16(v − hi): v = hi + lo to within 2^-22 relative for every element within ~17
 * binades of the block's largest (the 24-bit fixed point of the digits keeps 24 bits of the
 * largest only). A = sc·q is made from the nibble exactly: (q | 0x6400) is the f16 1024 + q, and
 * one HFMA2 (1024 + q)·sc − 1024·sc has the exact result ≤ 945, so its one rounding is none. Each
 * product A·hi, A·lo is exact in f32 (11 × 11 bits); the tensor core sums them in f32. The min
 * term Σ_j m_j·Σx_j over the block's 8 sub-blocks is one more product, m16n8k8, against the
 * sub-block sums of v as hi/lo pairs. Per (weight row, x row, block), once:
 *     y += s · (d · (C_hi + C_lo) − dmin · (M_hi + M_lo))        (explicit roundings, fixed order)
 * A row's bits depend on the blocks its warp takes (KW, fixed per matrix), never on how many x
 * rows share the pass or where in the mma's columns it sits — the check below tests that.
 *
 * mma m16n8k16 (f16 in, f32 accumulate): lane (g, t) holds A rows g, g+8 at k 2t, 2t+1 (a0, a1)
 * and 2t+8, 2t+9 (a2, a3), B column g at k 2t, 2t+1 (b0) and 2t+8, 2t+9 (b1), C rows g, g+8 at
 * columns 2t, 2t+1. Column 2r' + h of a column group is x row 4·cg + r', piece h (hi, lo), so lane
 * t ends with x row 4cg + t's hi and lo sums of weight rows g and g+8: the fold needs no shuffle.
 * Step s of a block (0..15) is positions 16s..16s+15 (sub-block s/2), k in order.
 *
 * Weights, repacked (mmh_repack): units of (16-row tile, block), MMH_UNIT = 2368 bytes (the
 * GGUF 2304 + 2.8%):
 *   [0, 2048)    qs: [u 0..3][lane][4 words], word ss = step 4u + ss of lane (g, t): nibble of a_i's
 *                first k at bits 4i, its second at 16 + 4i (a_i = (w >> 4i) & 0x000F000F | 0x6400…)
 *   [2048, 2176) per row pair g: the 8 sub-block scales of row g, then of row g + 8 (bytes)
 *   [2176, 2304) per lane (g, t): m of rows g, g+8 at sub-blocks 2t, 2t+1 (the k8 mma's A, bytes)
 *   [2304, 2368) per row pair g: d_g, d_g8, dmin_g, dmin_g8 (f16)
 * x, per row and block, MMH_XBLK = 1088 bytes: [step pair k][h][t][2 steps][4 halves] (lane (g, t)'s
 * B fragments of piece h = g & 1 for steps 2k, 2k+1: 16 bytes, so one load instruction of a warp
 * touches one 128-byte line — with the 128 bytes of a lane contiguous instead, each touched eight
 * and L1 ran at 91% with DRAM at 22%: ncu), then [h][t] the f16 pair of Σv over sub-blocks 2t, 2t+1,
 * then s (f32).
 *
 * Launch: a CTA of 8 warps = (8 / KW) tile groups × KW warps splitting the blocks (warp kw takes
 * blocks kw, kw + KW, …); each warp does TW tiles and CG column groups (4·CG x rows). KW warps'
 * partial sums are added in smem in kw order.
 *   usage: kbench_mmh [reps]   (exit 1 if a check fails) */
#include "kbench_q4k.cuh"

#define MMH_UNIT 2368u
#define MMH_XBLK 1088u

/* ---- the weight repack ------------------------------------------------------------------------ */
/* one thread per (tile, block, row pair g): lanes 4g..4g+3 of the unit, and pair g's header */
__global__ void mmh_repack(const uint8_t *raw, uint8_t *dst, uint32_t rows, uint32_t nb)
{
    uint32_t g;
    const uint8_t *rw[2];
    uint8_t *u;
    if (!kq_repack_item(raw, dst, rows, nb, 144, MMH_UNIT, g, rw, u)) return;
    const uint8_t *r0 = rw[0], *r8 = rw[1];
    for (uint32_t t = 0; t < 4; t++) {
        const uint32_t lane = 4 * g + t;
        for (int s = 0; s < 16; s++) {
            uint32_t w = 0;
            for (int a = 0; a < 4; a++) {
                const uint8_t *rb = (a & 1) ? r8 : r0;
                const int k = (a < 2 ? 2 * (int)t : 2 * (int)t + 8);
                w |= (uint32_t)kq4_q(rb, 16 * s + k) << (4 * a);
                w |= (uint32_t)kq4_q(rb, 16 * s + k + 1) << (16 + 4 * a);
            }
            ((uint32_t *)u)[((s >> 2) * 32 + lane) * 4 + (s & 3)] = w;
        }
        int sc, m0, m1, m2, m3;
        kq4_scale_min(r0 + 4, 2 * t, sc, m0);
        kq4_scale_min(r0 + 4, 2 * t + 1, sc, m1);
        kq4_scale_min(r8 + 4, 2 * t, sc, m2);
        kq4_scale_min(r8 + 4, 2 * t + 1, sc, m3);
        uint8_t *mn = u + 2176 + 4 * lane;
        mn[0] = (uint8_t)m0;
        mn[1] = (uint8_t)m1;
        mn[2] = (uint8_t)m2;
        mn[3] = (uint8_t)m3;
    }
    for (int j = 0; j < 8; j++) {
        int sc, m;
        kq4_scale_min(r0 + 4, j, sc, m);
        u[2048 + 16 * g + j] = (uint8_t)sc;
        kq4_scale_min(r8 + 4, j, sc, m);
        u[2048 + 16 * g + 8 + j] = (uint8_t)sc;
    }
    uint16_t *dd = (uint16_t *)(u + 2304 + 8 * g);
    dd[0] = *(const uint16_t *)r0;
    dd[1] = *(const uint16_t *)r8;
    dd[2] = *(const uint16_t *)(r0 + 2);
    dd[3] = *(const uint16_t *)(r8 + 2);
}

/* ---- the x writer: one warp per (row, block) --------------------------------------------------- */
__global__ void mmh_prep(const float *x, uint32_t K, uint32_t nx, uint8_t *xq)
{
    const uint32_t warp = (blockIdx.x * blockDim.x + threadIdx.x) >> 5, lane = threadIdx.x & 31, nb = K / 256;
    if (warp >= nx * nb) return;
    const uint32_t r = warp / nb, b = warp % nb;
    const float *xb = x + (size_t)r * K + 256 * b;
    float v[8], mx = 0.f;
#pragma unroll
    for (int i = 0; i < 8; i++) {
        v[i] = xb[32 * i + lane]; /* sub-block i, position lane */
        mx = fmaxf(mx, fabsf(v[i]));
        if (v[i] != v[i]) mx = v[i];
    }
#pragma unroll
    for (int o = 16; o; o >>= 1) {
        const float u = __shfl_xor_sync(0xFFFFFFFFu, mx, o);
        mx = (u != u || u > mx) ? u : mx;
    }
    /* s: a power of two with mx/s < 2^14 (1 for an all-zero block; NaN/Inf make s NaN) */
    float s = 1.f;
    if (!(mx <= 3.4e38f)) {
        s = __int_as_float(0x7FC00000);
    } else if (mx > 0.f) {
        int e;
        frexpf(mx, &e); /* mx < 2^e */
        s = ldexpf(1.f, e - 14);
    }
    uint8_t *o = xq + ((size_t)r * nb + b) * MMH_XBLK;
    __half *hp = (__half *)o;
#pragma unroll
    for (int i = 0; i < 8; i++) {
        const float w = v[i] / s;
        const __half hi = __float2half_rn(w), lo = __float2half_rn(w - __half2float(hi));
        /* position p = 32i + lane = 16 step + k: k = 2t + e (+8 for b1) */
        const uint32_t p = 32 * i + lane, st = p >> 4, k = p & 15, t = (k & 7) >> 1, e = k & 1, half = k >> 3;
        const uint32_t idx = (st >> 1) * 64 + t * 8 + (st & 1) * 4 + half * 2 + e; /* in halves; piece h at +32h */
        hp[idx] = hi;
        hp[idx + 32] = lo;
        float sum = w;
#pragma unroll
        for (int q = 16; q; q >>= 1) sum += __shfl_xor_sync(0xFFFFFFFFu, sum, q);
        if (lane == 0) kq4_sum_pieces(o + 1024, i, sum * 0.03125f); /* Σv / 32 (< 2^14, exact scaling): the fold multiplies dmin by 32 */
    }
    if (lane == 0) *(float *)(o + 1056) = s;
}

/* ---- the kernel ------------------------------------------------------------------------------- */
__device__ __forceinline__ void mma16(float c[4], const uint32_t a[4], uint32_t b0, uint32_t b1)
{
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
template <int TW>
__device__ __forceinline__ void mmh_load_units(const uint8_t *__restrict__ W, uint32_t nb, uint32_t tile0, uint32_t b, uint32_t lane,
                                               uint4 q[TW][4], uint4 sc[TW], uint32_t mn[TW], uint2 dd[TW])
{
#pragma unroll
    for (int i = 0; i < TW; i++) {
        const uint8_t *unit = W + ((size_t)(tile0 + i) * nb + b) * MMH_UNIT;
#pragma unroll
        for (int u = 0; u < 4; u++) q[i][u] = __ldg((const uint4 *)(unit + (u * 32 + lane) * 16));
        sc[i] = __ldg((const uint4 *)(unit + 2048 + 16 * (lane >> 2)));
        mn[i] = __ldg((const uint32_t *)(unit + 2176 + 4 * lane));
        dd[i] = __ldg((const uint2 *)(unit + 2304 + 8 * (lane >> 2)));
    }
}

/* SMX: x through shared memory. The TG warps of one kw take the same block at the same time, so
 * they copy its 16 rows' B fragments (16 KB) into shared memory once (cp.async, two buffers: the
 * next block's copy runs while this one is used) instead of each reading them through L1. Needs
 * every tile group live (the grid exact) and 64 KB of dynamic shared memory at KW 2. */
__device__ __forceinline__ void mmh_cp16(void *smem, const void *g)
{
    const uint32_t a = (uint32_t)__cvta_generic_to_shared(smem);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(a), "l"(g));
}
/* one warp copies the units of its TW tiles at block b (if b < nb and the warp is live) and commits
 * one cp.async group either way, so the groups count blocks */
template <int TW>
__device__ __forceinline__ void mmh_copy_units(uint8_t *dst, const uint8_t *__restrict__ W, uint32_t nb, uint32_t tile0, uint32_t b,
                                               uint32_t lane, bool live)
{
    if (live && b < nb)
#pragma unroll
        for (int i = 0; i < TW; i++) {
            const uint8_t *unit = W + ((size_t)(tile0 + i) * nb + b) * MMH_UNIT;
#pragma unroll
            for (uint32_t c = lane; c < MMH_UNIT / 16; c += 32) mmh_cp16(dst + (size_t)i * MMH_UNIT + 16 * c, unit + 16 * c);
        }
    asm volatile("cp.async.commit_group;");
}
template <int TG>
__device__ __forceinline__ void mmh_stage(uint4 *dst, const uint8_t *xq, uint32_t nb, uint32_t b, uint32_t nx, uint32_t gi)
{
#pragma unroll
    for (int k = 0; k < 1024 / (TG * 32); k++) {
        const uint32_t q = gi + k * TG * 32, r = q >> 6, o = q & 63;
        mmh_cp16(dst + q, xq + ((size_t)min(r, nx - 1) * nb + b) * MMH_XBLK + 16 * o);
    }
    asm volatile("cp.async.commit_group;");
}

/* PF: the next block's units loaded one block ahead (more registers); without it the units are
 * loaded at the top of their block and occupancy (MINB CTAs per SM) hides the latency instead */
/* NS: the odd nibbles (bits 4-7 of a half) used in place, as 1024 + 16q, against sc/16 and −64·sc:
 * the FMA's one rounding still gives q·sc exactly, and one shift in two is saved; and 0x64006400 in
 * a register, so each A register is one LOP3 (and its HFMA2) */
/* ST: each warp copies its units ST − 1 blocks ahead into its own ST shared-memory stages
 * (cp.async, no registers held), and reads them from there */
template <int CG, int TW, int KW, bool SMX = false, bool PF = true, int MINB = 2, int NW = 8, bool NS = false, int ST = 0>
__global__ void __launch_bounds__(32 * NW, MINB)
    mmh_kernel(const uint8_t *__restrict__ W, uint32_t nb, const uint8_t *__restrict__ xq, uint32_t nx, float *__restrict__ y,
               uint32_t rows)
{
    static_assert(NW % KW == 0 && (!SMX || NW == 8), "NW warps: NW / KW tile groups; smem x at 8 warps");
    static_assert(!ST || (!SMX && !PF), "stages replace the register prefetch");
    constexpr int STN = ST ? ST : 1;
    constexpr int TG = NW / KW;
    extern __shared__ uint4 xsm[]; /* SMX: [kw][2][16 rows][64] */
    __shared__ float red[KW > 1 ? KW - 1 : 1][TG][TW][CG][2][32];
    const uint32_t warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const uint32_t kw = warp % KW, tg = warp / KW;
    const uint32_t tile0 = (blockIdx.x * TG + tg) * TW;
    /* 0x64006400 (f16 1024 twice) in a register: with it as an immediate beside the nibble mask,
     * (w & mask) | 0x64006400 took two LOP3 (one immediate each); nb < 2^31, so this is the constant */
    const uint32_t magic = 0x64006400u | (nb >> 31);
    float acc[TW][CG][2];
#pragma unroll
    for (int i = 0; i < TW; i++)
#pragma unroll
        for (int c = 0; c < CG; c++) acc[i][c][0] = acc[i][c][1] = 0.f;
    const bool live = tile0 * 16 < rows;
    /* the next block's units, loaded one block ahead */
    uint4 nq[TW][4], nsc[TW];
    uint32_t nmn[TW];
    uint2 ndd[TW];
    if (PF && live && kw < nb) mmh_load_units<TW>(W, nb, tile0, kw, lane, nq, nsc, nmn, ndd);
    const uint32_t gi = tg * 32 + lane;
    if (SMX && kw < nb) mmh_stage<TG>(xsm + (size_t)kw * 2 * 1024, xq, nb, kw, nx, gi);
    uint8_t *wst = (uint8_t *)xsm + (size_t)warp * STN * TW * MMH_UNIT; /* ST: this warp's stages */
    if (ST)
#pragma unroll
        for (int k = 0; k < ST - 1; k++) mmh_copy_units<TW>(wst + (size_t)k * TW * MMH_UNIT, W, nb, tile0, kw + k * KW, lane, live);
    uint32_t it = 0;
    for (uint32_t b = kw; live && b < nb; b += KW, it++) {
        const uint4 *xs = xsm + ((size_t)kw * 2 + (it & 1)) * 1024;
        if (SMX) {
            if (b + KW < nb) {
                mmh_stage<TG>(xsm + ((size_t)kw * 2 + ((it + 1) & 1)) * 1024, xq, nb, b + KW, nx, gi);
                asm volatile("cp.async.wait_group 1;" ::: "memory");
            } else {
                asm volatile("cp.async.wait_group 0;" ::: "memory");
            }
            asm volatile("bar.sync %0, %1;" ::"r"(1 + kw), "r"(TG * 32) : "memory");
        }
        /* x: this lane's B column (row 4c + g/2, piece g & 1) and its own fold row 4c + t */
        const uint8_t *xb[CG];
        float sx[CG];
        uint32_t bm[CG];
#pragma unroll
        for (int c = 0; c < CG; c++) {
            const uint32_t rb = min(4 * c + (g >> 1), nx - 1), ro = min(4 * c + t, nx - 1);
            const uint8_t *base = xq + ((size_t)rb * nb + b) * MMH_XBLK;
            xb[c] = base + ((g & 1) * 4 + t) * 16;
            bm[c] = __ldg((const uint32_t *)(base + 1024 + ((g & 1) * 4 + t) * 4));
            sx[c] = __ldg((const float *)(xq + ((size_t)ro * nb + b) * MMH_XBLK + 1056));
        }
        uint4 scw[TW], q4[TW][4];
        uint32_t mnw[TW];
        uint2 ddw[TW];
        const uint8_t *st = wst + (size_t)(it % STN) * TW * MMH_UNIT; /* ST: this block's stage */
        if (ST) {
            mmh_copy_units<TW>(wst + (size_t)((it + STN - 1) % STN) * TW * MMH_UNIT, W, nb, tile0, b + (STN - 1) * KW, lane, true);
            asm volatile("cp.async.wait_group %0;" ::"n"(STN - 1) : "memory");
            __syncwarp();
#pragma unroll
            for (int i = 0; i < TW; i++) {
                const uint8_t *unit = st + (size_t)i * MMH_UNIT;
#pragma unroll
                for (int u = 0; ST < 3 && u < 4; u++) q4[i][u] = *(const uint4 *)(unit + (u * 32 + lane) * 16);
                scw[i] = *(const uint4 *)(unit + 2048 + 16 * (lane >> 2));
                mnw[i] = *(const uint32_t *)(unit + 2176 + 4 * lane);
                ddw[i] = *(const uint2 *)(unit + 2304 + 8 * (lane >> 2));
            }
        } else if (!PF) {
            mmh_load_units<TW>(W, nb, tile0, b, lane, q4, scw, mnw, ddw);
        }
#pragma unroll
        for (int i = 0; PF && i < TW; i++) {
            scw[i] = nsc[i];
            mnw[i] = nmn[i];
            ddw[i] = ndd[i];
#pragma unroll
            for (int u = 0; u < 4; u++) q4[i][u] = nq[i][u];
        }
        if (PF && b + KW < nb) mmh_load_units<TW>(W, nb, tile0, b + KW, lane, nq, nsc, nmn, ndd);
        constexpr bool XALL = CG == 1 && !SMX && PF; /* x's 8 loads issued together */
        uint4 xall[XALL ? 8 : 1];
        if (XALL)
#pragma unroll
            for (int k = 0; k < 8; k++) xall[k] = __ldg((const uint4 *)(xb[0] + 128 * k));
        float C[TW][CG][4];
#pragma unroll
        for (int i = 0; i < TW; i++)
#pragma unroll
            for (int c = 0; c < CG; c++) C[i][c][0] = C[i][c][1] = C[i][c][2] = C[i][c][3] = 0.f;
#pragma unroll
        for (int u = 0; u < 4; u++) {
            uint4 xv[CG][2]; /* steps 4u..4u+3: (b0, b1) pairs */
#pragma unroll
            for (int c = 0; c < CG; c++) {
                if (SMX) {
                    const uint4 *xr = xs + min(4 * c + (g >> 1), nx - 1) * 64 + (g & 1) * 4 + t;
                    xv[c][0] = xr[16 * u];
                    xv[c][1] = xr[16 * u + 8];
                } else {
                    xv[c][0] = XALL ? xall[2 * u] : __ldg((const uint4 *)(xb[c] + 256 * u));
                    xv[c][1] = XALL ? xall[2 * u + 1] : __ldg((const uint4 *)(xb[c] + 256 * u + 128));
                }
            }
#pragma unroll
            for (int i = 0; i < TW; i++) {
                /* ST ≥ 3: each step quad's words read from the stage where they are used (fewer registers) */
                const uint4 qv = ST >= 3 ? *(const uint4 *)(st + (size_t)i * MMH_UNIT + (u * 32 + lane) * 16) : q4[i][u];
                const uint32_t qw[4] = {qv.x, qv.y, qv.z, qv.w};
#pragma unroll
                for (int ss = 0; ss < 4; ss++) {
                    const int s = 4 * u + ss, j = s >> 1;
                    const uint32_t w0 = j < 4 ? scw[i].x : scw[i].y, w8 = j < 4 ? scw[i].z : scw[i].w;
                    /* NS: the byte 0x64 from magic (bytes 1, 3), so the selector can be the immediate */
                    const uint32_t sel = NS ? (uint32_t)(j & 3) | 0x5050u | ((uint32_t)(j & 3) << 8)
                                            : (uint32_t)(j & 3) | 0x4040u | ((uint32_t)(j & 3) << 8);
                    const __half2 s0 = NS ? __hsub2(kq4_u2h(__byte_perm(w0, magic, sel)), kq4_u2h(0x64006400u)) : kq4_bytes_h2(w0, sel);
                    const __half2 s8 = NS ? __hsub2(kq4_u2h(__byte_perm(w8, magic, sel)), kq4_u2h(0x64006400u)) : kq4_bytes_h2(w8, sel);
                    const __half2 n0 = __hmul2(s0, kq4_u2h(0xE400E400u)), n8 = __hmul2(s8, kq4_u2h(0xE400E400u)); /* −1024 */
                    const uint32_t w = qw[ss];
                    uint32_t a[4];
                    if (NS) {
                        const __half2 s8h = __hmul2(s8, kq4_u2h(0x2C002C00u)), n8h = __hmul2(s8, kq4_u2h(0xD400D400u)); /* 1/16, −64 */
                        const uint32_t w8 = w >> 8;
                        a[0] = kq4_h2u(__hfma2(kq4_u2h((w & 0x000F000Fu) | magic), s0, n0));
                        a[1] = kq4_h2u(__hfma2(kq4_u2h((w & 0x00F000F0u) | magic), s8h, n8h));
                        a[2] = kq4_h2u(__hfma2(kq4_u2h((w8 & 0x000F000Fu) | magic), s0, n0));
                        a[3] = kq4_h2u(__hfma2(kq4_u2h((w8 & 0x00F000F0u) | magic), s8h, n8h));
                    } else {
                        a[0] = kq4_h2u(__hfma2(kq4_u2h((w & 0x000F000Fu) | 0x64006400u), s0, n0));
                        a[1] = kq4_h2u(__hfma2(kq4_u2h(((w >> 4) & 0x000F000Fu) | 0x64006400u), s8, n8));
                        a[2] = kq4_h2u(__hfma2(kq4_u2h(((w >> 8) & 0x000F000Fu) | 0x64006400u), s0, n0));
                        a[3] = kq4_h2u(__hfma2(kq4_u2h(((w >> 12) & 0x000F000Fu) | 0x64006400u), s8, n8));
                    }
#pragma unroll
                    for (int c = 0; c < CG; c++) {
                        const uint4 &xx = xv[c][ss >> 1];
                        const uint32_t b0 = (ss & 1) ? xx.z : xx.x, b1 = (ss & 1) ? xx.w : xx.y;
                        mma16(C[i][c], a, b0, b1);
                    }
                }
            }
        }
        /* the min term and the fold */
#pragma unroll
        for (int i = 0; i < TW; i++) {
            const uint32_t am0 = kq4_h2u(kq4_bytes_h2(mnw[i], 0x4140u)), am1 = kq4_h2u(kq4_bytes_h2(mnw[i], 0x4342u));
            const float d0 = __half2float(kq4_u2h(ddw[i].x).x), d8 = __half2float(kq4_u2h(ddw[i].x).y);
            const float m0 = 32.f * __half2float(kq4_u2h(ddw[i].y).x), m8 = 32.f * __half2float(kq4_u2h(ddw[i].y).y);
#pragma unroll
            for (int c = 0; c < CG; c++) {
                float M[4] = {0.f, 0.f, 0.f, 0.f};
                kq4_mma8(M, am0, am1, bm[c]);
                const float v0 = __fsub_rn(__fmul_rn(d0, __fadd_rn(C[i][c][0], C[i][c][1])),
                                           __fmul_rn(m0, __fadd_rn(M[0], M[1])));
                const float v8 = __fsub_rn(__fmul_rn(d8, __fadd_rn(C[i][c][2], C[i][c][3])),
                                           __fmul_rn(m8, __fadd_rn(M[2], M[3])));
                acc[i][c][0] = __fmaf_rn(sx[c], v0, acc[i][c][0]);
                acc[i][c][1] = __fmaf_rn(sx[c], v8, acc[i][c][1]);
            }
        }
        if (SMX) asm volatile("bar.sync %0, %1;" ::"r"(1 + kw), "r"(TG * 32) : "memory"); /* before it is refilled */
        if (ST) __syncwarp(); /* every lane has read the stage the next copy refills */
    }
    if (KW > 1) {
        if (kw > 0) {
#pragma unroll
            for (int i = 0; i < TW; i++)
#pragma unroll
                for (int c = 0; c < CG; c++) {
                    red[kw - 1][tg][i][c][0][lane] = acc[i][c][0];
                    red[kw - 1][tg][i][c][1][lane] = acc[i][c][1];
                }
        }
        __syncthreads();
        if (kw > 0) return;
#pragma unroll
        for (int k = 0; k < KW - 1; k++)
#pragma unroll
            for (int i = 0; i < TW; i++)
#pragma unroll
                for (int c = 0; c < CG; c++) {
                    acc[i][c][0] = __fadd_rn(acc[i][c][0], red[k][tg][i][c][0][lane]);
                    acc[i][c][1] = __fadd_rn(acc[i][c][1], red[k][tg][i][c][1][lane]);
                }
    }
    if (!live) return;
#pragma unroll
    for (int i = 0; i < TW; i++)
#pragma unroll
        for (int c = 0; c < CG; c++) {
            const uint32_t r = 4 * c + t, row = (tile0 + i) * 16 + g;
            if (r < nx) {
                y[(size_t)r * rows + row] = acc[i][c][0];
                y[(size_t)r * rows + row + 8] = acc[i][c][1];
            }
        }
}

/* ---- workbench -------------------------------------------------------------------------------- */
struct mat {
    uint32_t rows, cols;
    std::vector<uint8_t *> unit, kt; /* this layout; the engine's Q4_KT units (the baseline) */
    kb_qmat ref; /* the sampled raw rows, for kb_reference / kb_check */
};
static void make_mat(mat &m, uint32_t rows, uint32_t cols, int n_copy, uint32_t seed)
{
    m.rows = rows;
    m.cols = cols;
    m.ref.gtype = GGML_TYPE_Q4_K;
    m.ref.rows = rows;
    m.ref.cols = cols;
    const uint32_t nb = cols / 256;
    const size_t rb = (size_t)nb * 144;
    m.ref.bytes = rb * rows;
    uint8_t *raw;
    CK(cudaMalloc(&raw, m.ref.bytes));
    for (int k = 0; k < n_copy; k++) {
        kb_fill_q4k<<<2048, 256>>>(raw, m.ref.bytes, seed + k);
        CK(cudaGetLastError());
        if (k == 0) kb_sample_rows(raw, rows, rb, 1024, m.ref.sample, m.ref.host_raw);
        uint8_t *u;
        CK(cudaMalloc(&u, (size_t)rows / 16 * nb * MMH_UNIT));
        const size_t nt = (size_t)rows / 16 * nb * 8;
        mmh_repack<<<(unsigned)((nt + 255) / 256), 256>>>(raw, u, rows, nb);
        CK(cudaGetLastError());
        m.unit.push_back(u);
        uint8_t *kt;
        CK(cudaMalloc(&kt, m.ref.bytes));
        mmq_repack_q4k<<<(unsigned)((nt + 255) / 256), 256>>>(raw, kt, rows, nb, 0);
        CK(cudaGetLastError());
        m.kt.push_back(kt);
    }
    CK(cudaDeviceSynchronize());
    CK(cudaFree(raw));
}

typedef void (*kern_fn)(const uint8_t *, uint32_t, const uint8_t *, uint32_t, float *, uint32_t);
struct variant {
    const char *name;
    int cg, tw, kw;
    kern_fn fn;
    bool smx;
    int nw; /* warps per CTA (0: 8) */
    int st; /* shared-memory stages of units per warp (0: none) */
};
#define V(CG, TW, KW) {#CG "x4 rows, TW " #TW ", KW " #KW, CG, TW, KW, mmh_kernel<CG, TW, KW>, false}
#define VS(CG, TW, KW) {#CG "x4 rows, TW " #TW ", KW " #KW ", smem x", CG, TW, KW, mmh_kernel<CG, TW, KW, true>, true}
#define VP(CG, TW, KW, MB)                                                                                               \
    {#CG "x4, TW " #TW ", KW " #KW ", no pf, " #MB "/SM", CG, TW, KW, mmh_kernel<CG, TW, KW, false, false, MB>, false}
#define VN(CG, TW, KW, MB, NW)                                                                                           \
    {#CG "x4, TW " #TW ", KW " #KW ", no pf, " #MB "/SM, " #NW " warps", CG, TW, KW, mmh_kernel<CG, TW, KW, false, false, MB, NW>, \
     false, NW}
#define VNS(CG, TW, KW, MB, NW)                                                                                          \
    {#CG "x4, TW " #TW ", KW " #KW ", no pf, " #MB "/SM, " #NW " warps, ns", CG, TW, KW,                                   \
     mmh_kernel<CG, TW, KW, false, false, MB, NW, true>, false, NW}
#define VST(CG, TW, KW, MB, NW, ST)                                                                                      \
    {#CG "x4, TW " #TW ", KW " #KW ", " #MB "/SM, " #NW " warps, ns, " #ST " stages", CG, TW, KW,                          \
     mmh_kernel<CG, TW, KW, false, false, MB, NW, true, ST>, false, NW, ST}
#define VSP(CG, TW, KW, MB)                                                                                              \
    {#CG "x4, TW " #TW ", KW " #KW ", smem, no pf, " #MB "/SM", CG, TW, KW, mmh_kernel<CG, TW, KW, true, false, MB>, true}

static void launch(const variant &v, const mat &m, int copy, const uint8_t *xq, uint32_t nx, float *y)
{
    const int nw = v.nw ? v.nw : 8;
    const uint32_t tiles = m.rows / 16, per = (uint32_t)(nw / v.kw * v.tw);
    const size_t smem = v.smx ? (size_t)v.kw * 2 * 1024 * 16 : (size_t)nw * v.st * v.tw * MMH_UNIT;
    if (smem) {
        static std::vector<kern_fn> set; /* the kernels whose shared-memory limit is raised */
        if (std::find(set.begin(), set.end(), v.fn) == set.end()) {
            CK(cudaFuncSetAttribute(v.fn, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
            set.push_back(v.fn);
        }
    }
    v.fn<<<(tiles + per - 1) / per, 32 * nw, smem>>>(m.unit[copy], m.cols / 256, xq, nx, y, m.rows);
}

/* the largest max |Δy| / max |y| of rows 0..refs.size() of y ([row][m.rows]) against their f64
 * references (1e30 where a row holds a non-finite output) */
static double worst_rel(const mat &m, const std::vector<std::vector<double>> &refs, const std::vector<float> &y)
{
    double worst = 0;
    for (size_t r = 0; r < refs.size(); r++) {
        const std::vector<float> hy(y.begin() + r * m.rows, y.begin() + (r + 1) * m.rows);
        const kb_errs e = kb_check(m.ref, refs[r], hy, NULL);
        worst = e.max < 0 ? 1e30 : std::max(worst, e.max);
        if (e.max < 0) break;
    }
    return worst;
}

int main(int argc, char **argv)
{
    const int reps = argc > 1 ? atoi(argv[1]) : 9;
    const cudaDeviceProp prop = kb_device();
    const double ceil_gbs = kb_read_ceiling(prop.multiProcessorCount, kb_fill_q4k);
    int fails = 0;
    for (int sh = 0; sh < 4; sh++) {
        const uint32_t rows = kq4_shapes[sh][0], cols = kq4_shapes[sh][1], nb = cols / 256;
        const size_t bytes = (size_t)rows / 16 * nb * MMH_UNIT;
        const int ncopy = kb_n_copy(bytes, 8);
        mat m;
        make_mat(m, rows, cols, ncopy, 11 + sh);
        const uint32_t NX = 16;
        float *x, *y, *y1;
        uint8_t *xq, *xq1;
        CK(cudaMalloc(&x, (size_t)NX * cols * 4));
        CK(cudaMalloc(&y, (size_t)NX * rows * 4));
        CK(cudaMalloc(&y1, (size_t)rows * 4));
        CK(cudaMalloc(&xq, (size_t)NX * nb * MMH_XBLK));
        CK(cudaMalloc(&xq1, (size_t)nb * MMH_XBLK));
        const std::vector<float> hx = kq4_x_rows(NX, cols);
        CK(cudaMemcpy(x, hx.data(), hx.size() * 4, cudaMemcpyHostToDevice));
        mmh_prep<<<(NX * nb * 32 + 255) / 256, 256>>>(x, cols, NX, xq);
        CK(cudaGetLastError());
        uint8_t *xe1, *xed;
        CK(cudaMalloc(&xe1, mmq_x_bytes(cols)));
        CK(cudaMalloc(&xed, NX * mmqd_x_bytes(cols)));
        mmq_prep_launch(0, x, xe1, cols);
        mmq_prep_launch_t<mmqd_prep>(0, x, xed, cols, false, NX, cols, (uint32_t)mmqd_x_bytes(cols));
        CK(cudaGetLastError());
        /* KW 2 everywhere (26 and 78 blocks: 13 / 39 a warp): a row's bits depend on KW */
        const variant vars[] = {V(1, 1, 2), V(1, 2, 2), V(2, 1, 2), V(4, 1, 2), VS(1, 1, 2), VS(2, 1, 2), VS(4, 1, 2),
                                /* other splits of the blocks, timed only (other bits) */
                                V(1, 1, 4), V(1, 1, 8), V(4, 1, 4), V(4, 1, 8),
                                /* no prefetch, more CTAs per SM */
                                VP(1, 1, 4, 3), VP(1, 1, 4, 4), VP(1, 1, 8, 3), VP(1, 1, 8, 4), VP(4, 1, 8, 2),
                                VSP(4, 1, 2, 2), VP(4, 2, 8, 2),
                                /* the blocks split evenly: 26 = 2·13, 78 = 6·13 = 3·26 */
                                VN(1, 1, 13, 2, 13), VN(1, 1, 26, 1, 26), VN(1, 1, 16, 2, 16),
                                VN(4, 1, 13, 1, 13), VN(4, 2, 13, 1, 13), VN(4, 1, 16, 1, 16),
                                /* the odd nibbles in place */
                                VNS(1, 1, 8, 4, 8), VNS(1, 1, 16, 2, 16), VNS(4, 1, 8, 2, 8),
                                /* the units through per-warp shared-memory stages */
                                VST(1, 1, 8, 4, 8, 2), VST(1, 1, 8, 3, 8, 3), VST(1, 1, 8, 2, 8, 4), VST(1, 1, 16, 2, 16, 2),
                                VST(1, 1, 16, 1, 16, 4), VST(4, 1, 8, 2, 8, 2), VST(4, 1, 8, 2, 8, 3), VST(4, 2, 8, 2, 8, 3),
                                VST(4, 2, 8, 1, 8, 3), VST(4, 2, 8, 1, 8, 2)};
        printf("\n%u x %u Q4_K (%.1f MB repacked, %d copies)\n", rows, cols, bytes / 1e6, ncopy);
        /* correctness: R = 16 against f64 per row; every row bit-identical to it alone (R = 1) and
         * in every variant */
        std::vector<float> h16((size_t)NX * rows), h1(rows), hv((size_t)NX * rows);
        launch(vars[3], m, 0, xq, NX, y); /* 4x4 rows, KW 2 */
        CK(cudaDeviceSynchronize());
        CK(cudaMemcpy(h16.data(), y, h16.size() * 4, cudaMemcpyDeviceToHost));
        std::vector<std::vector<double>> refs;
        for (uint32_t r = 0; r < NX; r++) refs.push_back(kb_reference(m.ref, hx.data() + (size_t)r * cols));
        const double worst = worst_rel(m, refs, h16);
        kq4_engine(m.kt[0], rows, cols, xe1, xed, NX, y);
        CK(cudaDeviceSynchronize());
        CK(cudaMemcpy(hv.data(), y, hv.size() * 4, cudaMemcpyDeviceToHost));
        const double worst_e = worst_rel(m, refs, hv);
        {
            size_t bad = 0;
            for (float v : h16) bad += !isfinite(v);
            if (bad) printf("  %zu of %zu outputs not finite; row 0: %g %g %g, the engine's %g %g %g\n", bad, h16.size(),
                            h16[0], h16[1], h16[8], hv[0], hv[1], hv[8]);
        }
        printf("  vs f64: max |dy| / max |y| %.2e over 16 rows (x scaled 2^-8 .. 2^7, one 300x outlier a row); the "
               "engine's mmqd %.2e\n", worst, worst_e);
        if (!(worst < 1e-6)) {
            printf("  FAIL: error above 1e-6\n");
            fails++;
        }
        int mism = 0;
        for (uint32_t r = 0; r < NX; r++) {
            CK(cudaMemcpy(xq1, xq + (size_t)r * nb * MMH_XBLK, (size_t)nb * MMH_XBLK, cudaMemcpyDeviceToDevice));
            for (int vi = 0; vi < 2; vi++) {
                CK(cudaMemset(y1, 0xFF, rows * 4));
                launch(vars[vi], m, 0, xq1, 1, y1);
                CK(cudaDeviceSynchronize());
                CK(cudaMemcpy(h1.data(), y1, rows * 4, cudaMemcpyDeviceToHost));
                mism += memcmp(h1.data(), h16.data() + (size_t)r * rows, rows * 4) != 0;
            }
        }
        for (size_t vi = 1; vi < sizeof vars / sizeof vars[0]; vi++) {
            if (vars[vi].kw != 2) continue;
            const uint32_t n = std::min(NX, 4u * vars[vi].cg);
            CK(cudaMemset(y, 0xFF, (size_t)NX * rows * 4));
            launch(vars[vi], m, 0, xq, n, y);
            CK(cudaDeviceSynchronize());
            CK(cudaMemcpy(hv.data(), y, (size_t)n * rows * 4, cudaMemcpyDeviceToHost));
            if (memcmp(hv.data(), h16.data(), (size_t)n * rows * 4)) {
                printf("  %s, %u rows: not the bytes of 4x4 rows, KW 2\n", vars[vi].name, n);
                mism++;
            }
        }
        /* every variant of another KW: against f64 at its most rows, and its first and last row alone */
        int others = 0;
        for (size_t vi = 1; vi < sizeof vars / sizeof vars[0]; vi++) {
            if (vars[vi].kw == 2) continue;
            others++;
            const uint32_t n = std::min(NX, 4u * vars[vi].cg);
            CK(cudaMemset(y, 0xFF, (size_t)NX * rows * 4));
            launch(vars[vi], m, 0, xq, n, y);
            CK(cudaDeviceSynchronize());
            CK(cudaMemcpy(hv.data(), y, (size_t)n * rows * 4, cudaMemcpyDeviceToHost));
            const std::vector<std::vector<double>> rn(refs.begin(), refs.begin() + n);
            const double e = worst_rel(m, rn, hv);
            if (!(e < 1e-6)) {
                printf("  %s: FAIL, max |dy| / max |y| %.2e\n", vars[vi].name, e);
                fails++;
            }
            for (uint32_t r : {0u, n - 1}) {
                CK(cudaMemcpy(xq1, xq + (size_t)r * nb * MMH_XBLK, (size_t)nb * MMH_XBLK, cudaMemcpyDeviceToDevice));
                CK(cudaMemset(y1, 0xFF, rows * 4));
                launch(vars[vi], m, 0, xq1, 1, y1);
                CK(cudaDeviceSynchronize());
                CK(cudaMemcpy(h1.data(), y1, rows * 4, cudaMemcpyDeviceToHost));
                if (memcmp(h1.data(), hv.data() + (size_t)r * rows, rows * 4)) {
                    printf("  %s: row %u alone is not its bytes among %u rows\n", vars[vi].name, r, n);
                    mism++;
                }
            }
        }
        printf("  row invariance: %d mismatches (each row alone in 2 variants; 4, 8, 16 rows together in 3; the %d "
               "variants of other KW: rows alone and together, and against f64)\n", mism, others);
        if (mism) fails++;
        /* speed */
        printf("  %-26s %6s %9s %8s %7s\n", "variant", "rows", "us", "GB/s", "% read");
        float t1 = 0;
        {
            const uint32_t nxs[4] = {1, 4, 8, 16};
            float e1 = 0;
            for (int k = 0; k < 4; k++) {
                const uint32_t n = nxs[k];
                const float ms = kb_time_launches([&](int c) { kq4_engine(m.kt[c], rows, cols, xe1, xed, n, y); }, ncopy, reps);
                if (n == 1) e1 = ms;
                printf("  %-26s %6u %9.1f %8.1f %6.1f%%   %.2fx its 1-row time\n", "engine (mmq / mmqd)", n, ms * 1e3,
                       m.ref.bytes / (ms * 1e-3) / 1e9, 100 * m.ref.bytes / (ms * 1e-3) / 1e9 / ceil_gbs, ms / e1);
            }
        }
        for (size_t vi = 0; vi < sizeof vars / sizeof vars[0]; vi++) {
            const variant &v = vars[vi];
            const uint32_t nxs[4] = {1, 4, 8, 16};
            for (int k = 0; k < 4; k++) {
                const uint32_t n = nxs[k];
                if (n > 4u * v.cg || (v.cg > 1 && n <= 4u * (v.cg / 2))) continue;
                const float ms = kb_time_launches([&](int c) { launch(v, m, c, xq, n, y); }, ncopy, reps);
                if (vi == 0 && n == 1) t1 = ms;
                printf("  %-26s %6u %9.1f %8.1f %6.1f%%   %.2fx the 1-row time\n", v.name, n, ms * 1e3, bytes / (ms * 1e-3) / 1e9,
                       100 * bytes / (ms * 1e-3) / 1e9 / ceil_gbs, ms / t1);
            }
        }
        for (uint8_t *p : m.unit) CK(cudaFree(p));
        for (uint8_t *p : m.kt) CK(cudaFree(p));
        CK(cudaFree(xe1));
        CK(cudaFree(xed));
        CK(cudaFree(x));
        CK(cudaFree(y));
        CK(cudaFree(y1));
        CK(cudaFree(xq));
        CK(cudaFree(xq1));
    }
    printf("kbench_mmh: %s\n", fails ? "FAIL" : "ok");
    return fails ? 1 : 0;
}
