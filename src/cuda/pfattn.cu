/* pfattn.cu — the prefill route's attention on tensor cores (design, numerics and invariance:
 * pfattn.cuh), and its check against pf_attention for tests (cuda_backend.h). */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "cuda/cuda_backend.h"
#include "cuda/pfattn.cuh"
#include "cuda/prefill.cuh"
#include "cuda/tc.cuh"

#define PFA_G 16                                  /* query heads per KV head: the mma's M */
#define PFA_D 128
#define PFA_KT 32                                 /* positions per key tile, aligned at multiples of 32 */
#define PFA_STAGES 4
#define PFA_QT_MAX 8                              /* rows (warps) per CTA */
#define PFA_TILE_BYTES (PFA_KT * PFA_D * 2)       /* one K or V tile: 8 KiB */
#define PFA_STAGE_BYTES (2 * PFA_TILE_BYTES)
#define PFA_SMEM (PFA_STAGES * PFA_STAGE_BYTES)   /* 64 KiB: 2 CTAs of 4 warps per SM, or 1 of 8 */
#define PFA_P_SCALE 32768.f                       /* 2^15 */
/* Chunks of at least this many rows take 8 rows per CTA; shorter ones 4, so a 128-row chunk of
 * Glimmer still has 64 CTAs. */
#define PFA_QT8_ROWS 256


/* A row's first key (pf_attention's rule). */
__device__ __forceinline__ uint64_t pfa_lo(uint64_t pos, uint32_t window)
{
    return window && pos + 1 > window ? pos + 1 - window : 0;
}

/* Where the CTA's keys come from: positions from p0 on are staged rows, the earlier ones the plane. */
struct pfa_src {
    const uint16_t *sk, *sv, *kp, *vp;
    cu_plane_meta m;
    uint64_t p0;
    uint64_t lo, hi;  /* the CTA's union of rows' ranges: positions outside it are zero-filled */
    uint64_t r_lo;    /* ring: the physical row of position lo */
    uint32_t KD, g;   /* halves per token row (HKV·D), the KV head */
};

/* Start the copy of key tile t (positions 32t .. 32t+31) into the stage at stage_u: thread c of
 * the CTA copies 16-byte chunk c % 16 of row c / 16 (and of the rows blockDim.x / 16 further), so
 * a warp instruction reads two whole 256-byte rows, K and V alike. */
template <bool RING>
__device__ __forceinline__ void pfa_issue(uint32_t stage_u, uint64_t t, const pfa_src &S)
{
    for (uint32_t c = threadIdx.x; c < PFA_KT * 16; c += blockDim.x) {
        const uint32_t row = c >> 4, ch = c & 15;
        const uint64_t p = t * PFA_KT + row;
        const bool valid = p >= S.lo && p <= S.hi;
        bool staged = true;
        size_t off = 0;
        if (valid) {
            if (p >= S.p0) {
                off = (size_t)(p - S.p0) * S.KD + (size_t)S.g * PFA_D + ch * 8;
            } else {
                staged = false;
                if (RING) {
                    /* consistent metadata: p − lo < len ≤ capacity, one subtraction; the modulo only
                     * keeps an inconsistent plane's reads inside it */
                    uint64_t r = S.r_lo + (p - S.lo);
                    if (r >= S.m.capacity) {
                        r -= S.m.capacity;
                        if (r >= S.m.capacity) r %= S.m.capacity;
                    }
                    off = (size_t)r * S.KD + (size_t)S.g * PFA_D + ch * 8;
                } else {
                    off = ((size_t)S.g * S.m.capacity + p) * PFA_D + ch * 8;
                }
            }
        }
        const uint32_t so = row * 256 + ((ch ^ (row & 7)) << 4);
        tc_cp16(stage_u + so, (staged ? S.sk : S.kp) + off, valid);
        tc_cp16(stage_u + PFA_TILE_BYTES + so, (staged ? S.sv : S.vp) + off, valid);
    }
}

/* grid (ceil(n / qt), HKV), qt = blockDim.x / 32 warps; H = 16·HKV, D = 128. */
template <bool RING>
__global__ void __launch_bounds__(PFA_QT_MAX * 32, 1)
    pf_attn_tc_kernel(const float *__restrict__ q, const uint16_t *__restrict__ sk, const uint16_t *__restrict__ sv,
                      const uint16_t *__restrict__ kp, const uint16_t *__restrict__ vp, cu_plane_meta meta,
                      uint64_t p0, uint32_t n, uint32_t window, float scale, uint32_t HKV, float *__restrict__ out)
{
    extern __shared__ __align__(128) uint8_t pfa_smem[];
    const uint32_t qt = blockDim.x >> 5, w = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const uint32_t g = blockIdx.y, i0 = blockIdx.x * qt;
    const uint32_t nr = n - i0 < qt ? n - i0 : qt; /* rows of this CTA below n */
    const size_t QD = (size_t)HKV * PFA_G * PFA_D;

    pfa_src S;
    S.sk = sk;
    S.sv = sv;
    S.kp = kp ? kp : sk; /* p0 = 0: no plane read; any valid address for the zero-fills */
    S.vp = vp ? vp : sv;
    S.m = meta;
    S.p0 = p0;
    S.lo = pfa_lo(p0 + i0, window);
    S.hi = p0 + i0 + nr - 1;
    S.r_lo = RING && S.lo < p0 && meta.capacity ? (meta.origin_physical + (S.lo - meta.origin_logical)) % meta.capacity
                                                : 0;
    S.KD = HKV * PFA_D;
    S.g = g;
    const uint64_t t_first = S.lo / PFA_KT;
    const uint32_t n_tiles = (uint32_t)(S.hi / PFA_KT - t_first + 1);
    const uint32_t smem_u = (uint32_t)__cvta_generic_to_shared(pfa_smem);

    /* the first tiles go out before anything else */
#pragma unroll
    for (uint32_t s = 0; s < PFA_STAGES - 1; s++) {
        if (s < n_tiles) pfa_issue<RING>(smem_u + s * PFA_STAGE_BYTES, t_first + s, S);
        tc_commit();
    }

    /* this warp's row: position pos, keys lo .. pos, tiles t_lo .. t_hi */
    const bool active = w < nr;
    const uint64_t pos = p0 + i0 + w, lo = pfa_lo(pos, window);
    const uint64_t t_lo = lo / PFA_KT, t_hi = pos / PFA_KT;
    const int gr = lane >> 2, qc = lane & 3;

    /* Q as A fragments: rows gr, gr+8 (heads), columns 16kk + 2qc (+1, +8, +9); each head scaled
     * by the power of two that puts its max|q| in [2^14, 2^15) (the quad holds the head's 128 dims) */
    uint32_t qhi[8][4], qlo[8][4];
    float undo[2] = {1.f, 1.f};
    if (active) {
        const float *qh = q + (size_t)(i0 + w) * QD + (size_t)g * PFA_G * PFA_D;
        float2 x[8][4];
#pragma unroll
        for (int kk = 0; kk < 8; kk++) {
            x[kk][0] = __ldg((const float2 *)(qh + gr * PFA_D + 16 * kk + 2 * qc));
            x[kk][1] = __ldg((const float2 *)(qh + (gr + 8) * PFA_D + 16 * kk + 2 * qc));
            x[kk][2] = __ldg((const float2 *)(qh + gr * PFA_D + 16 * kk + 8 + 2 * qc));
            x[kk][3] = __ldg((const float2 *)(qh + (gr + 8) * PFA_D + 16 * kk + 8 + 2 * qc));
        }
        float sc2[2];
#pragma unroll
        for (int r = 0; r < 2; r++) {
            float mx = 0.f;
#pragma unroll
            for (int kk = 0; kk < 8; kk++)
                mx = fmaxf(mx, fmaxf(fmaxf(fabsf(x[kk][r].x), fabsf(x[kk][r].y)),
                                     fmaxf(fabsf(x[kk][r + 2].x), fabsf(x[kk][r + 2].y))));
            mx = fmaxf(mx, __shfl_xor_sync(0xFFFFFFFFu, mx, 1));
            mx = fmaxf(mx, __shfl_xor_sync(0xFFFFFFFFu, mx, 2));
            int ex = 0;
            if (mx > 0.f && mx <= 3.402823466e38f) { /* 0, Inf, NaN: no scaling (Inf still makes NaN) */
                frexpf(mx, &ex);                    /* mx = f·2^ex, f in [0.5, 1) */
                ex = 15 - ex;
                ex = ex > 126 ? 126 : ex;
            }
            sc2[r] = tc_pow2(ex);
            undo[r] = tc_pow2(-ex);
        }
#pragma unroll
        for (int kk = 0; kk < 8; kk++)
#pragma unroll
            for (int a = 0; a < 4; a++) {
                const float s = sc2[a & 1];
                tc_split(x[kk][a].x * s, x[kk][a].y * s, qhi[kk][a], qlo[kk][a]);
            }
    } else {
#pragma unroll
        for (int kk = 0; kk < 8; kk++)
#pragma unroll
            for (int a = 0; a < 4; a++) qhi[kk][a] = qlo[kk][a] = 0u;
    }

    float o[16][4], mrun[2] = {-INFINITY, -INFINITY}, lrun[2] = {0.f, 0.f};
#pragma unroll
    for (int dt = 0; dt < 16; dt++) o[dt][0] = o[dt][1] = o[dt][2] = o[dt][3] = 0.f;
    const int lm = lane >> 3, lr = lane & 7; /* ldmatrix: which 8×8 matrix this lane addresses, which row */

    for (uint32_t it = 0; it < n_tiles; it++) {
        tc_wait<PFA_STAGES - 2>(); /* this thread's copies of tile it are done */
        __syncthreads();            /* everyone's are; and every warp is done with tile it − 1's stage */
        if (it + PFA_STAGES - 1 < n_tiles)
            pfa_issue<RING>(smem_u + ((it + PFA_STAGES - 1) % PFA_STAGES) * PFA_STAGE_BYTES,
                            t_first + it + PFA_STAGES - 1, S);
        tc_commit();
        const uint64_t t = t_first + it;
        if (!active || t < t_lo || t > t_hi) continue; /* warp-uniform: no arithmetic on this tile */
        const uint32_t ks = smem_u + (it % PFA_STAGES) * PFA_STAGE_BYTES, vs = ks + PFA_TILE_BYTES;
        const uint64_t j0 = t * PFA_KT;
        /* the row's positions in this tile: offsets mlo .. mhi */
        const int mlo = lo > j0 ? (int)(lo - j0) : 0;
        const int mhi = pos - j0 < PFA_KT - 1 ? (int)(pos - j0) : PFA_KT - 1;

        /* S = Q·Kᵀ: sh[nt] + sl[nt] hold positions 8nt + 2qc (+1) of heads gr (c 0,1) and gr+8 (c 2,3) */
        float sh[4][4], sl[4][4];
#pragma unroll
        for (int nt = 0; nt < 4; nt++)
#pragma unroll
            for (int c = 0; c < 4; c++) sh[nt][c] = sl[nt][c] = 0.f;
#pragma unroll
        for (int kk = 0; kk < 8; kk++)
#pragma unroll
            for (int hf = 0; hf < 2; hf++) {
                const int row = 16 * hf + (lm >> 1) * 8 + lr, ch = 2 * kk + (lm & 1);
                uint32_t b0, b1, b2, b3;
                tc_ldm(ks + row * 256 + ((ch ^ lr) << 4), b0, b1, b2, b3);
                tc_mma(sh[2 * hf], qhi[kk], b0, b1);
                tc_mma(sl[2 * hf], qlo[kk], b0, b1);
                tc_mma(sh[2 * hf + 1], qhi[kk], b2, b3);
                tc_mma(sl[2 * hf + 1], qlo[kk], b2, b3);
            }
        /* scores (exact 2^-e undo, then the f32 scale), the mask, the online softmax per head */
        float sc[4][4];
#pragma unroll
        for (int nt = 0; nt < 4; nt++)
#pragma unroll
            for (int c = 0; c < 4; c++) {
                const int j = 8 * nt + 2 * qc + (c & 1);
                const float s = ((sh[nt][c] + sl[nt][c]) * undo[c >> 1]) * scale;
                sc[nt][c] = j >= mlo && j <= mhi ? s : -INFINITY;
            }
        float corr[2];
#pragma unroll
        for (int r = 0; r < 2; r++) {
            float mx = -INFINITY;
#pragma unroll
            for (int nt = 0; nt < 4; nt++) mx = fmaxf(mx, fmaxf(sc[nt][2 * r], sc[nt][2 * r + 1]));
            mx = fmaxf(mx, __shfl_xor_sync(0xFFFFFFFFu, mx, 1));
            mx = fmaxf(mx, __shfl_xor_sync(0xFFFFFFFFu, mx, 2));
            const float mn = fmaxf(mrun[r], mx);
            const float mb = mn == -INFINITY ? 0.f : mn; /* nothing seen yet: p and corr are 0, not NaN */
            corr[r] = __expf(mrun[r] - mb);
            mrun[r] = mn;
            float ps = 0.f;
#pragma unroll
            for (int nt = 0; nt < 4; nt++)
#pragma unroll
                for (int c = 2 * r; c < 2 * r + 2; c++) {
                    sc[nt][c] = __expf(sc[nt][c] - mb);
                    ps += sc[nt][c];
                }
            lrun[r] = lrun[r] * corr[r] + ps;
        }
        /* P (×2^15) as hi/lo A fragments, k-step ks = positions 16ks .. 16ks+15: the C layout of S
         * is the A layout of P */
        uint32_t ph[2][4], pl[2][4];
#pragma unroll
        for (int k2 = 0; k2 < 2; k2++) {
            tc_split(sc[2 * k2][0] * PFA_P_SCALE, sc[2 * k2][1] * PFA_P_SCALE, ph[k2][0], pl[k2][0]);
            tc_split(sc[2 * k2][2] * PFA_P_SCALE, sc[2 * k2][3] * PFA_P_SCALE, ph[k2][1], pl[k2][1]);
            tc_split(sc[2 * k2 + 1][0] * PFA_P_SCALE, sc[2 * k2 + 1][1] * PFA_P_SCALE, ph[k2][2], pl[k2][2]);
            tc_split(sc[2 * k2 + 1][2] * PFA_P_SCALE, sc[2 * k2 + 1][3] * PFA_P_SCALE, ph[k2][3], pl[k2][3]);
        }
        /* O = O·corr + P·V: ldmatrix.trans of V rows gives B fragments of dims 16nn .. 16nn+15. The
         * tile's P·V is summed on the tensor cores from zero and added to O by an f32 FMA: a
         * tensor-core accumulator carried over thousands of keys drifts (its additions do not
         * round to nearest: 1.5e-5 at 5,000 keys, against 1.9e-6 for the plain kernel). */
#pragma unroll
        for (int nn = 0; nn < 8; nn++) {
            float pv[2][4] = {{0.f, 0.f, 0.f, 0.f}, {0.f, 0.f, 0.f, 0.f}};
#pragma unroll
            for (int k2 = 0; k2 < 2; k2++) {
                const int row = 16 * k2 + (lm & 1) * 8 + lr, ch = 2 * nn + (lm >> 1);
                tc_ldm_mma2<true>(vs + row * 256 + ((ch ^ lr) << 4), ph[k2], pl[k2], pv[0], pv[1]);
            }
#pragma unroll
            for (int h = 0; h < 2; h++)
#pragma unroll
                for (int c = 0; c < 4; c++) o[2 * nn + h][c] = fmaf(o[2 * nn + h][c], corr[c >> 1], pv[h][c]);
        }
    }
    tc_wait<0>(); /* only empty groups remain; nothing may be in flight at exit */
    if (!active) return;
#pragma unroll
    for (int r = 0; r < 2; r++) {
        lrun[r] += __shfl_xor_sync(0xFFFFFFFFu, lrun[r], 1);
        lrun[r] += __shfl_xor_sync(0xFFFFFFFFu, lrun[r], 2);
    }
    constexpr float unscale = 1.f / PFA_P_SCALE;
    float *orow = out + (size_t)(i0 + w) * QD + (size_t)g * PFA_G * PFA_D;
#pragma unroll
    for (int dt = 0; dt < 16; dt++) {
        *(float2 *)(orow + gr * PFA_D + 8 * dt + 2 * qc) =
            make_float2(o[dt][0] * unscale / lrun[0], o[dt][1] * unscale / lrun[0]);
        *(float2 *)(orow + (gr + 8) * PFA_D + 8 * dt + 2 * qc) =
            make_float2(o[dt][2] * unscale / lrun[1], o[dt][3] * unscale / lrun[1]);
    }
}

int pf_attention_tc_qt(cudaStream_t st, const float *q, const uint16_t *sk, const uint16_t *sv, const uint16_t *kp,
                       const uint16_t *vp, const cu_plane_meta *meta, bool ring, uint64_t p0, uint32_t n,
                       uint32_t window, float scale, uint32_t H, uint32_t HKV, uint32_t D, float *out, uint32_t qt)
{
    if (D != PFA_D || HKV == 0 || H != PFA_G * HKV || HKV > 65535) return -1;
    if (((uintptr_t)sk | (uintptr_t)sv | (uintptr_t)kp | (uintptr_t)vp) & 15) return -1;
    if (((uintptr_t)q | (uintptr_t)out) & 7) return -1;
    if (qt == 0) qt = n >= PFA_QT8_ROWS ? 8 : 4;
    if (qt != 4 && qt != 8) return -1;
    if (n == 0) return 0;
    void (*k)(const float *, const uint16_t *, const uint16_t *, const uint16_t *, const uint16_t *, cu_plane_meta,
              uint64_t, uint32_t, uint32_t, float, uint32_t, float *) =
        ring ? pf_attn_tc_kernel<true> : pf_attn_tc_kernel<false>;
    /* 64 KiB of stages: above the default 48 KiB; the carveout asks for the split that holds two */
    if (cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, PFA_SMEM) ||
        cudaFuncSetAttribute(k, cudaFuncAttributePreferredSharedMemoryCarveout, cudaSharedmemCarveoutMaxShared))
        return -1;
    k<<<dim3((n + qt - 1) / qt, HKV), qt * 32, PFA_SMEM, st>>>(q, sk, sv, kp, vp, *meta, p0, n, window, scale, HKV, out);
    return 0;
}

int pf_attention_tc(cudaStream_t st, const float *q, const uint16_t *sk, const uint16_t *sv, const uint16_t *kp,
                    const uint16_t *vp, const cu_plane_meta *meta, bool ring, uint64_t p0, uint32_t n, uint32_t window,
                    float scale, uint32_t H, uint32_t HKV, uint32_t D, float *out)
{
    return pf_attention_tc_qt(st, q, sk, sv, kp, vp, meta, ring, p0, n, window, scale, H, HKV, D, out, 0);
}

/* ---- the check (cuda_backend.h) --------------------------------------------------------------- */
extern "C" int muser_cuda_pfattn_check(const muser_cuda_pfattn_case *c, float *out_plain, float *out_tc,
                                       muser_error *err)
{
    int n_dev = 0;
    if (cudaGetDeviceCount(&n_dev) != cudaSuccess || n_dev < 1) {
        cudaGetLastError();
        muser_errorf(err, MUSER_E_BACKEND, "cuda: no CUDA device");
        return 77;
    }
    const size_t H = c->n_head, HKV = c->n_head_kv, D = c->head_dim, n = c->n;
    if (!n || !HKV || !H || H % HKV || !D || !c->capacity || !c->k_plane || !c->v_plane || !c->k_stage ||
        !c->v_stage || !c->q)
        return muser_errorf(err, MUSER_E_ARG, "cuda: pfattn check: bad case");
    const size_t QD = H * D, KD = HKV * D, plane = (size_t)c->capacity * KD;
    cu_plane_meta meta;
    meta.origin_logical = c->origin_logical;
    meta.origin_physical = c->origin_physical;
    meta.len = c->len;
    meta.capacity = c->capacity;
    float *dq = NULL, *dout = NULL;
    uint16_t *dsk = NULL, *dsv = NULL, *dkp = NULL, *dvp = NULL;
    cudaStream_t st = NULL;
    int rc = MUSER_OK;
    const char *what = "alloc";
    cudaError_t e = cudaSetDevice(0);
    if (!e) e = cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking);
    if (!e) e = cudaMalloc((void **)&dq, n * QD * sizeof(float));
    if (!e) e = cudaMalloc((void **)&dout, n * QD * sizeof(float));
    if (!e) e = cudaMalloc((void **)&dsk, n * KD * 2);
    if (!e) e = cudaMalloc((void **)&dsv, n * KD * 2);
    if (!e) e = cudaMalloc((void **)&dkp, plane * 2);
    if (!e) e = cudaMalloc((void **)&dvp, plane * 2);
    if (!e) what = "upload";
    if (!e) e = cudaMemcpy(dq, c->q, n * QD * sizeof(float), cudaMemcpyHostToDevice);
    if (!e) e = cudaMemcpy(dsk, c->k_stage, n * KD * 2, cudaMemcpyHostToDevice);
    if (!e) e = cudaMemcpy(dsv, c->v_stage, n * KD * 2, cudaMemcpyHostToDevice);
    if (!e) e = cudaMemcpy(dkp, c->k_plane, plane * 2, cudaMemcpyHostToDevice);
    if (!e) e = cudaMemcpy(dvp, c->v_plane, plane * 2, cudaMemcpyHostToDevice);
    /* each kernel on an output poisoned with NaN: a value it fails to write shows */
    if (!e && out_plain) {
        what = "pf_attention";
        e = cudaMemsetAsync(dout, 0xFF, n * QD * sizeof(float), st);
        if (!e && pf_attention(st, dq, dsk, dsv, dkp, dvp, &meta, c->ring != 0, c->p0, (uint32_t)n, c->window, c->scale,
                               (uint32_t)H, (uint32_t)HKV, (uint32_t)D, dout)) {
            rc = muser_errorf(err, MUSER_E_ARG, "cuda: pfattn check: pf_attention refused the geometry");
            goto done;
        }
        if (!e) e = cudaGetLastError();
        if (!e) e = cudaStreamSynchronize(st);
        if (!e) e = cudaMemcpy(out_plain, dout, n * QD * sizeof(float), cudaMemcpyDeviceToHost);
    }
    if (!e && out_tc) {
        what = "pf_attention_tc";
        e = cudaMemsetAsync(dout, 0xFF, n * QD * sizeof(float), st);
        if (!e && pf_attention_tc_qt(st, dq, dsk, dsv, dkp, dvp, &meta, c->ring != 0, c->p0, (uint32_t)n, c->window,
                                     c->scale, (uint32_t)H, (uint32_t)HKV, (uint32_t)D, dout, c->qt)) {
            cudaGetLastError();
            rc = 1; /* refused: the geometry is the plain kernel's */
            goto done;
        }
        if (!e) e = cudaGetLastError();
        if (!e) e = cudaStreamSynchronize(st);
        if (!e) e = cudaMemcpy(out_tc, dout, n * QD * sizeof(float), cudaMemcpyDeviceToHost);
    }
    if (e) rc = muser_errorf(err, MUSER_E_BACKEND, "cuda: pfattn check: %s: %s", what, cudaGetErrorString(e));
done:
    cudaFree(dq);
    cudaFree(dout);
    cudaFree(dsk);
    cudaFree(dsv);
    cudaFree(dkp);
    cudaFree(dvp);
    if (st) cudaStreamDestroy(st);
    return rc;
}
