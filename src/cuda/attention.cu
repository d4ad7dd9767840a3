/* attention.cu — decode attention: QK-norm + RoPE + KV store, flash-decoding over the f16 planes,
 * and the split combine with the sigmoid output gate.
 *
 * Planes (SPEC §3, kv.h): SWA ring token-major [capacity][HKV·D], physical row of logical p =
 * (origin_physical + p − origin_logical) mod capacity; FULL head-major [HKV][capacity][D]. The
 * positions attended are the stored ones, [pos+1−len, pos] (a ring holds at most W rows, so this is
 * exactly pos−W < j ≤ pos). Metadata comes from device memory (cu_step), so the grid is fixed and
 * one graph serves every position: each KV head's range is cut into n_split chunks (multiples of
 * 32), blocks past the end exit.
 *
 * attention block = 4 warps for one (split, KV head); all G = H/HKV query heads of that KV head
 * share every K/V row read (GQA 16:1 on Glimmer). Per 32 positions a warp does: scores lane-per-
 * position (a K row per lane, q from shared memory), online softmax per head, then P·V lane-per-
 * dimension (coalesced V rows). The 4 warps merge in shared memory; the block writes (m, l, acc)
 * per query head; the combine kernel merges splits and applies sigmoid(gate). The combine is
 * launched as a programmatic dependent of the split kernel (PDL), so its launch overlaps it.
 *
 * Two split kernels write those same partials: k_attn_split_tc (GQA 16:1, D 128: tensor cores,
 * f32-faithful hi/lo operands, cp.async pipelines, at most 64 splits — see its comment) and
 * k_attn_split (v1, above: every geometry). The route asks for tc (cu_attn_geom.impl) and gets it
 * where the geometry allows, v1 elsewhere; the test entry points can ask for either. bench/kernels/attention.cu times both; tests/test_cuda_attn.c checks
 * both against an f64 reference. */
#include "cuda/ops.cuh"
#include "cuda/tc.cuh"

#include <cuda_fp16.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#define ATT_WARPS 4

/* Programmatic dependent launch between the split kernel and the combine: the split kernel lets
 * the combine's grid launch as soon as its own blocks are placed, and the combine waits for the
 * split grid's completion (and its memory) before it reads a partial. Every combine block waits,
 * so the combine never completes before the split kernel (the next kernels rely on that order).
 * Both are no-ops in a kernel launched without the attribute (cu_pdl_trigger, cu_pdl_wait). */

/* RoPE pair i of a D-wide head at position pos: sine and cosine of pos·theta^(−2i/D), in f64 (at
 * pos 131072 an f32 angle is off by ~0.01 rad). k_qk_rope_store and the fused split kernel both use
 * att_rope_inv (the split kernel through the table cu_rope_inv_table fills with it), so their
 * rotations are the same bits. */
__device__ __forceinline__ double att_rope_inv(float theta, uint32_t i, uint32_t D)
{
    return pow((double)theta, -2.0 * (double)i / (double)D);
}
__device__ __forceinline__ void att_rope_sincos(uint64_t pos, float theta, uint32_t i, uint32_t D, double *s, double *c)
{
    sincos((double)pos * att_rope_inv(theta, i, D), s, c);
}
/* The same angles from a table of att_rope_inv (cu_rope_inv_table): the same bits without the f64
 * pow on the kernel's critical path. */
__device__ __forceinline__ void att_rope_sincos_tab(uint64_t pos, double inv, double *s, double *c)
{
    sincos((double)pos * inv, s, c);
}
static __global__ void k_rope_inv_table(double *t, float theta, uint32_t D)
{
    const uint32_t i = threadIdx.x;
    if (i < D / 2) t[i] = att_rope_inv(theta, i, D);
}
int cu_rope_inv_table(double *t, float theta, uint32_t D)
{
    if (D / 2 > 1024 || D % 2) return -1;
    k_rope_inv_table<<<1, D / 2>>>(t, theta, D);
    return cudaDeviceSynchronize() == cudaSuccess ? 0 : -1;
}

/* A stored position p lies in [origin_logical, origin_logical + len) and origin_physical <
 * capacity, so the ring row needs one conditional subtraction, not a 64-bit modulo (which
 * costs ~100 instructions per K and V row). */
__device__ __forceinline__ uint64_t att_row(const cu_plane_meta &m, bool ring, uint64_t p)
{
    if (!ring) return p;
    const uint64_t r = m.origin_physical + (p - m.origin_logical);
    return r >= m.capacity ? r - m.capacity : r;
}
__device__ __forceinline__ size_t att_off(bool ring, uint32_t hkv, uint32_t D, uint64_t cap, uint32_t h, uint64_t r)
{
    return ring ? (size_t)r * hkv * D + (size_t)h * D : ((size_t)h * cap + r) * D;
}

/* One block per head (H query heads, then HKV key heads); the K block also stores V. */
__global__ void k_qk_rope_store(float *qkv, const float *vsrc, const float *q_norm, const float *k_norm, float eps, int rope,
                                int neox, float theta, const cu_step *step, const cu_plane_meta *meta,
                                uint16_t *kp, uint16_t *vp, uint32_t H, uint32_t HKV, uint32_t D, int ring,
                                const cu_rows R, int kv_only)
{
    CU_TL_SCOPE(TL_ROPE);
    extern __shared__ float xs[];
    __shared__ double sh[32];
    const uint32_t b = blockIdx.x + (kv_only ? H : 0), row = blockIdx.y; /* head, pass row */
    if (row) {
        qkv += (size_t)row * R.x_stride;
        vsrc += (size_t)row * R.x_stride;
        step = cu_row_step(step, R, row);
        meta = cu_row_meta(meta, R, row);
    }
    if (R.kp) {
        kp = (uint16_t *)R.kp[row];
        vp = (uint16_t *)R.vp[row];
    }
    const bool is_q = b < H;
    float *x = is_q ? qkv + (size_t)b * D : qkv + (size_t)H * D + (size_t)(b - H) * D;
    const float *w = is_q ? q_norm : k_norm;
    const uint64_t pos = step->pos; /* the token's step copy precedes every kernel of the token */
    /* the f64 angle of this thread's first pair depends on nothing a kernel writes (pos comes with
     * the token's step copy): its sine and cosine are computed before the wait for the projections
     * (launched as a programmatic dependent, cu_pdl_cfg) */
    double s0 = 0.0, c0 = 1.0;
    if (rope && threadIdx.x < D / 2) att_rope_sincos(pos, theta, threadIdx.x, D, &s0, &c0);
    cu_pdl_wait();
    for (uint32_t d = threadIdx.x; d < D; d += blockDim.x) xs[d] = x[d];
    __syncthreads();
    if (w) {
        double ss = 0;
        for (uint32_t d = threadIdx.x; d < D; d += blockDim.x) ss += (double)xs[d] * xs[d];
        for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xFFFFFFFFu, ss, o);
        if ((threadIdx.x & 31) == 0) sh[threadIdx.x >> 5] = ss;
        __syncthreads();
        double t = 0;
        for (uint32_t i = 0; i < (blockDim.x + 31) / 32; i++) t += sh[i];
        const float r = (float)(1.0 / sqrt(t / D + eps));
        __syncthreads();
        for (uint32_t d = threadIdx.x; d < D; d += blockDim.x) xs[d] = xs[d] * r * w[d];
        __syncthreads();
    }
    if (rope) {
        for (uint32_t i = threadIdx.x; i < D / 2; i += blockDim.x) {
            double s = s0, c = c0;
            if (i != threadIdx.x) att_rope_sincos(pos, theta, i, D, &s, &c);
            const uint32_t i0 = neox ? i : 2 * i, i1 = neox ? i + D / 2 : 2 * i + 1;
            const float x0 = xs[i0], x1 = xs[i1];
            xs[i0] = (float)(x0 * c - x1 * s);
            xs[i1] = (float)(x0 * s + x1 * c);
        }
        __syncthreads();
    }
    if (is_q) {
        for (uint32_t d = threadIdx.x; d < D; d += blockDim.x) x[d] = xs[d];
        return;
    }
    const uint32_t h = b - H;
    const float *v = vsrc + (size_t)h * D;
    size_t off;
    if (R.sk) { /* a staged pass: the row's stage row (token-major) */
        kp = R.sk + (size_t)row * HKV * D;
        vp = R.sv + (size_t)row * HKV * D;
        off = (size_t)h * D;
    } else {
        const cu_plane_meta m = meta[0];
        off = att_off(ring, HKV, D, m.capacity, h, att_row(m, ring, pos));
    }
    for (uint32_t d = threadIdx.x; d < D; d += blockDim.x) {
        x[d] = xs[d];
        kp[off + d] = __half_as_ushort(__float2half_rn(xs[d]));
        vp[off + d] = __half_as_ushort(__float2half_rn(v[d]));
    }
}

void cu_qk_rope_store(cudaStream_t st, float *qkv, const float *v, const float *q_norm, const float *k_norm, float eps,
                      bool rope, bool neox, float theta, uint32_t rope_dim, const cu_step *step,
                      const cu_plane_meta *meta, uint16_t *k_plane, uint16_t *v_plane, const cu_attn_geom *g, bool pdl,
                      uint32_t n, const cu_rows *R, bool kv_only)
{
    (void)rope_dim;
    const uint32_t threads = g->head_dim < 32 ? 32 : (g->head_dim > 256 ? 256 : g->head_dim);
    const cu_rows rows = R ? *R : cu_rows{};
    cudaLaunchAttribute at[1];
    cudaLaunchConfig_t cfg =
        cu_pdl_cfg(dim3((kv_only ? 0 : g->n_head) + g->n_head_kv, n), dim3(threads), st, pdl, at);
    cfg.dynamicSmemBytes = g->head_dim * sizeof(float);
    cudaLaunchKernelEx(&cfg, k_qk_rope_store,
        qkv, v, q_norm, k_norm, eps, (int)rope, (int)neox, theta, step, meta, k_plane, v_plane, g->n_head, g->n_head_kv,
        g->head_dim, g->ring, rows, (int)kv_only);
}

/* Block (layer l, pass row r): row r's staged K and V of layer l into its plane at its position,
 * by its own metadata (after its append); nothing when any row of the pass has a non-finite logit. */
__global__ void k_stage_commit(const cu_step *step, uint32_t step_stride, const uint16_t *const *kp,
                               const uint16_t *const *vp, const uint16_t *sk, const uint16_t *sv,
                               const int32_t *d_nonfinite, uint32_t n, uint32_t rows_max, const cu_ring_mask ring,
                               uint32_t HKV, uint32_t D)
{
    const uint32_t l = blockIdx.x, r = blockIdx.y;
    for (uint32_t i = 0; i < n; i++)
        if (d_nonfinite[i]) return; /* fail closed: the planes stay as they were */
    const cu_step *s = (const cu_step *)((const uint8_t *)step + (size_t)r * step_stride);
    const cu_plane_meta m = ((const cu_plane_meta *)(s + 1))[l];
    const bool rg = ring.bits[l >> 6] >> (l & 63) & 1;
    const uint64_t pr = att_row(m, rg, s->pos);
    const size_t kvd = (size_t)HKV * D, src = ((size_t)l * rows_max + r) * kvd;
    uint16_t *k = (uint16_t *)kp[(size_t)l * rows_max + r], *v = (uint16_t *)vp[(size_t)l * rows_max + r];
    for (uint32_t i = threadIdx.x; i < kvd; i += blockDim.x) {
        const uint32_t h = i / D, d = i % D;
        const size_t off = att_off(rg, HKV, D, m.capacity, h, pr) + d;
        k[off] = sk[src + i];
        v[off] = sv[src + i];
    }
}

void cu_stage_commit(cudaStream_t st, const cu_step *step, uint32_t step_stride, const uint16_t *const *kp,
                     const uint16_t *const *vp, const uint16_t *sk, const uint16_t *sv, const int32_t *d_nonfinite,
                     uint32_t n, uint32_t rows_max, uint32_t n_layer, const cu_ring_mask *ring, uint32_t HKV, uint32_t D)
{
    k_stage_commit<<<dim3(n_layer, n), 128, 0, st>>>(step, step_stride, kp, vp, sk, sv, d_nonfinite, n, rows_max, *ring,
                                                    HKV, D);
}

__global__ void k_copy_segments(const cu_copy_list L)
{
    const uint16_t *src = L.seg[blockIdx.x].src;
    uint16_t *dst = L.seg[blockIdx.x].dst;
    for (uint64_t i = threadIdx.x; i < L.seg[blockIdx.x].elems; i += blockDim.x) dst[i] = src[i];
}

void cu_copy_segments(cudaStream_t st, const cu_copy_list *L)
{
    if (L->n) k_copy_segments<<<L->n, 256, 0, st>>>(*L);
}

/* Positions per split: ceil(len / n_split) rounded up to a multiple of `align` (a power of two,
 * at least 32: v1 uses 32, tc TC_ALIGN). The split kernel and the combine compute it from the same
 * device-side len, so they agree on which splits are used: s·chunk < len. */
__device__ __forceinline__ uint64_t att_chunk(uint64_t len, uint32_t n_split, uint32_t align)
{
    return (((len + n_split - 1) / n_split) + align - 1) & ~(uint64_t)(align - 1);
}

/* Range of block `split` of n_split over the stored positions. */
__device__ __forceinline__ void att_range(uint64_t pos, uint64_t len, uint32_t n_split, uint32_t align,
                                          uint32_t split, uint64_t *b, uint64_t *e)
{
    const uint64_t first = pos + 1 - len;
    const uint64_t chunk = att_chunk(len, n_split, align);
    *b = first + (uint64_t)split * chunk;
    *e = *b + chunk;
    if (*e > pos + 1) *e = pos + 1;
}

/* Where a row's K and V come from: its planes, and in a staged pass (cu_rows.sk) its run's staged
 * rows for the positions from s0 on (the rows of its session in this pass, its own included). */
struct att_kv {
    const uint16_t *kp, *vp; /* the planes */
    const uint16_t *sk, *sv; /* the run's first staged row */
    uint64_t s0;             /* its position; UINT64_MAX: nothing staged */
};

/* Offset of position j's K (and V) row of head h from A.kp (or, staged, A.sk); *staged says which. */
__device__ __forceinline__ size_t att_kv_off(const att_kv &A, bool ring, uint32_t HKV, uint32_t D,
                                             const cu_plane_meta &m, uint32_t h, uint64_t j, bool *staged)
{
    *staged = j >= A.s0;
    return *staged ? (size_t)(j - A.s0) * HKV * D + (size_t)h * D : att_off(ring, HKV, D, m.capacity, h, att_row(m, ring, j));
}
__device__ __forceinline__ const uint16_t *att_k_at(const att_kv &A, bool ring, uint32_t HKV, uint32_t D,
                                                    const cu_plane_meta &m, uint32_t h, uint64_t j)
{
    bool st;
    const size_t o = att_kv_off(A, ring, HKV, D, m, h, j, &st);
    return (st ? A.sk : A.kp) + o;
}
__device__ __forceinline__ const uint16_t *att_v_at(const att_kv &A, bool ring, uint32_t HKV, uint32_t D,
                                                    const cu_plane_meta &m, uint32_t h, uint64_t j)
{
    bool st;
    const size_t o = att_kv_off(A, ring, HKV, D, m, h, j, &st);
    return (st ? A.sv : A.vp) + o;
}

/* A split kernel's arguments moved to pass row `row` (cu_rows): its q, step, plane metadata,
 * partials (D floats an entry) and, from the tables, its K and V planes; *A its K/V sources. Row 0
 * of a one-row pass keeps them all. */
__device__ __forceinline__ void att_split_row(const cu_rows &R, uint32_t row, uint32_t HKV, uint32_t D, const float *&q,
                                              const cu_step *&step, const cu_plane_meta *&meta, const uint16_t *&kp,
                                              const uint16_t *&vp, float *&part_ml, float *&part_acc, att_kv *A)
{
    if (row) {
        q += (size_t)row * R.x_stride;
        step = cu_row_step(step, R, row);
        meta = cu_row_meta(meta, R, row);
        part_ml += (size_t)row * R.part_stride * 2;
        part_acc += (size_t)row * R.part_stride * D;
    }
    if (R.kp) {
        kp = R.kp[row];
        vp = R.vp[row];
    }
    A->kp = kp;
    A->vp = vp;
    A->s0 = UINT64_MAX;
    A->sk = A->sv = NULL;
    if (R.sk) {
        A->s0 = step->stage_pos;
        A->sk = R.sk + (size_t)step->stage_row * HKV * D;
        A->sv = R.sv + (size_t)step->stage_row * HKV * D;
    }
}

/* G query heads per KV head, D = 32·DPL. */
template <int G, int DPL>
__global__ void __launch_bounds__(ATT_WARPS * 32) k_attn_split(const float *q, const cu_step *step,
                                                             const cu_plane_meta *meta, const uint16_t *kp,
                                                             const uint16_t *vp, float *part_ml, float *part_acc,
                                                             uint32_t HKV, int ring, uint32_t n_split, float scale,
                                                             uint32_t GT, const cu_rows R)
{
    CU_TL_SCOPE(TL_ATT_SPLIT);
    constexpr int D = 32 * DPL;
    /* blockIdx.z = pass row · (GT / G) + this block's head group */
    const uint32_t zg = blockIdx.z % (GT / G), row = blockIdx.z / (GT / G);
    att_kv A;
    att_split_row(R, row, HKV, D, q, step, meta, kp, vp, part_ml, part_acc, &A);
    __shared__ float qs[G][D];
    __shared__ float ps[ATT_WARPS][G][32];
    __shared__ float mg[2][G][D];
    __shared__ float mml[ATT_WARPS][G][2];
    const uint32_t split = blockIdx.x, h = blockIdx.y;
    const int w = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const cu_plane_meta m = meta[0];
    const uint64_t pos = step->pos;
    uint64_t b, e;
    cu_pdl_trigger(); /* the combine may launch now; it waits for this grid's partials */
    att_range(pos, m.len, n_split, 32, split, &b, &e);
    if (b >= e) return; /* the combine skips it too */
    /* q of the G heads: every load issued before the first is used (a plain strided loop waited
     * one L2 latency per element) */
    {
        constexpr int N4 = G * D / 4, T = ATT_WARPS * 32;
        const float4 *q4 = (const float4 *)(q + ((size_t)h * GT + (size_t)zg * G) * D);
        float4 *qs4 = (float4 *)&qs[0][0];
        float4 t[(N4 + T - 1) / T];
#pragma unroll
        for (int k = 0; k < (N4 + T - 1) / T; k++) {
            const int i = (int)threadIdx.x + k * T;
            if (i < N4) t[k] = __ldg(q4 + i);
        }
#pragma unroll
        for (int k = 0; k < (N4 + T - 1) / T; k++) {
            const int i = (int)threadIdx.x + k * T;
            if (i < N4) qs4[i] = t[k];
        }
    }
    __syncthreads();

    float mx[G], l[G], acc[G][DPL];
#pragma unroll
    for (int g = 0; g < G; g++) {
        mx[g] = -INFINITY;
        l[g] = 0.f;
#pragma unroll
        for (int k = 0; k < DPL; k++) acc[g][k] = 0.f;
    }
    for (uint64_t j0 = b + 32 * (uint64_t)w; j0 < e; j0 += 32 * ATT_WARPS) {
        const uint64_t j = j0 + lane;
        const bool valid = j < e;
        float s[G];
#pragma unroll
        for (int g = 0; g < G; g++) s[g] = 0.f;
        if (valid) {
            const uint16_t *kr = att_k_at(A, ring, HKV, D, m, h, j);
#pragma unroll
            for (int d0 = 0; d0 < D; d0 += 8) {
                const uint4 kv = __ldg((const uint4 *)(kr + d0));
                const uint32_t kw[4] = {kv.x, kv.y, kv.z, kv.w};
                float kf[8];
#pragma unroll
                for (int t = 0; t < 4; t++) {
                    const float2 f = __half22float2(*(const __half2 *)&kw[t]);
                    kf[2 * t] = f.x;
                    kf[2 * t + 1] = f.y;
                }
#pragma unroll
                for (int g = 0; g < G; g++) {
                    const float4 qa = *(const float4 *)&qs[g][d0], qb = *(const float4 *)&qs[g][d0 + 4];
                    s[g] = fmaf(kf[0], qa.x, fmaf(kf[1], qa.y, fmaf(kf[2], qa.z, fmaf(kf[3], qa.w, s[g]))));
                    s[g] = fmaf(kf[4], qb.x, fmaf(kf[5], qb.y, fmaf(kf[6], qb.z, fmaf(kf[7], qb.w, s[g]))));
                }
            }
        }
#pragma unroll
        for (int g = 0; g < G; g++) {
            const float sv = valid ? s[g] * scale : -INFINITY;
            float cm = sv;
            for (int o = 16; o > 0; o >>= 1) cm = fmaxf(cm, __shfl_xor_sync(0xFFFFFFFFu, cm, o));
            const float mn = fmaxf(mx[g], cm);
            const float corr = __expf(mx[g] - mn);
            const float p = valid ? __expf(sv - mn) : 0.f;
            float ps_sum = p;
            for (int o = 16; o > 0; o >>= 1) ps_sum += __shfl_xor_sync(0xFFFFFFFFu, ps_sum, o);
            l[g] = l[g] * corr + ps_sum;
            mx[g] = mn;
#pragma unroll
            for (int k = 0; k < DPL; k++) acc[g][k] *= corr;
            ps[w][g][lane] = p;
        }
        __syncwarp();
        const int n = (int)((e - j0) < 32 ? (e - j0) : 32);
        /* V rows 8 at a time: the 8 loads are issued before the first use (one memory latency
         * per 8 rows instead of per row). */
        for (int j8 = 0; j8 < n; j8 += 8) {
            float vf[8][DPL];
#pragma unroll
            for (int u = 0; u < 8; u++) {
                const int jj = j8 + u < n ? j8 + u : n - 1;
                const uint16_t *vr = att_v_at(A, ring, HKV, D, m, h, j0 + jj) + lane * DPL;
                if (DPL == 4) {
                    const uint2 vv = __ldg((const uint2 *)vr);
                    const float2 f0 = __half22float2(*(const __half2 *)&vv.x), f1 = __half22float2(*(const __half2 *)&vv.y);
                    vf[u][0] = f0.x; vf[u][DPL > 1 ? 1 : 0] = f0.y; vf[u][DPL > 2 ? 2 : 0] = f1.x; vf[u][DPL > 3 ? 3 : 0] = f1.y;
                } else if (DPL == 2) {
                    const uint32_t vv = __ldg((const unsigned int *)vr);
                    const float2 f0 = __half22float2(*(const __half2 *)&vv);
                    vf[u][0] = f0.x; vf[u][DPL > 1 ? 1 : 0] = f0.y;
                } else {
#pragma unroll
                    for (int k = 0; k < DPL; k++) vf[u][k] = __half2float(__ushort_as_half(vr[k]));
                }
            }
#pragma unroll
            for (int u = 0; u < 8; u++) {
                if (j8 + u >= n) break;
#pragma unroll
                for (int g = 0; g < G; g++) {
                    const float p = ps[w][g][j8 + u];
#pragma unroll
                    for (int k = 0; k < DPL; k++) acc[g][k] = fmaf(p, vf[u][k], acc[g][k]);
                }
            }
        }
        __syncwarp();
    }
    /* merge the 4 warps: each warp's state rescaled to the block max */
    if (lane == 0)
        for (int g = 0; g < G; g++) { mml[w][g][0] = mx[g]; mml[w][g][1] = l[g]; }
    __syncthreads();
    float bm[G];
#pragma unroll
    for (int g = 0; g < G; g++) {
        float t = -INFINITY;
        for (int i = 0; i < ATT_WARPS; i++) t = fmaxf(t, mml[i][g][0]);
        bm[g] = t;
    }
#pragma unroll
    for (int g = 0; g < G; g++) {
        const float f = mx[g] == -INFINITY ? 0.f : __expf(mx[g] - bm[g]);
#pragma unroll
        for (int k = 0; k < DPL; k++) acc[g][k] *= f;
    }
    /* warps 2,3 -> smem; 0,1 add; 1 -> smem; 0 adds */
    if (w >= 2)
        for (int g = 0; g < G; g++)
            for (int k = 0; k < DPL; k++) mg[w - 2][g][lane * DPL + k] = acc[g][k];
    __syncthreads();
    if (w < 2)
        for (int g = 0; g < G; g++)
            for (int k = 0; k < DPL; k++) acc[g][k] += mg[w][g][lane * DPL + k];
    __syncthreads();
    if (w == 1)
        for (int g = 0; g < G; g++)
            for (int k = 0; k < DPL; k++) mg[0][g][lane * DPL + k] = acc[g][k];
    __syncthreads();
    if (w == 0) {
        const size_t base = ((size_t)h * n_split + split) * GT + (size_t)zg * G;
        for (int g = 0; g < G; g++) {
            float lt = 0.f;
            for (int i = 0; i < ATT_WARPS; i++)
                if (mml[i][g][0] != -INFINITY) lt += mml[i][g][1] * __expf(mml[i][g][0] - bm[g]);
            for (int k = 0; k < DPL; k++) part_acc[(base + g) * D + lane * DPL + k] = acc[g][k] + mg[0][g][lane * DPL + k];
            if (lane == 0) { part_ml[(base + g) * 2] = bm[g]; part_ml[(base + g) * 2 + 1] = lt; }
        }
    }
}

/* ---- the combine -----------------------------------------------------------------------------
 *
 * Merges the used splits of each query head, divides by the softmax sum, applies sigmoid(gate),
 * and writes out (and the tensor-core digits of out for o_proj). Block = (query head, 32 dimensions), 8 warps:
 * warp w takes splits w, w + 8, w + 16, … and lane = dimension, so each load is one coalesced 128 B
 * row piece, and a warp's 16 loads of a batch are all issued before the first is used (the
 * serial walk over 128 splits of the old combine waited one L2 latency per 8 splits: ~37 µs cold at
 * 131072). Before the sums, the 256 threads read one split's (m, l) each: M = max m over the used
 * splits, f_s = exp(m_s − M) into shared memory, den = Σ f_s·l_s. Every reduction has a fixed
 * shape (xor shuffles, then the warps in index order), so the result does not depend on timing:
 * graph replays stay bit-identical. NaN/Inf in a used split's m, l or acc reaches out as in the
 * serial form (fmaxf skips a NaN m, whose f is then NaN); unused splits are never read. */
#define CMB_WARPS 8
#define CMB_R 16          /* splits per warp per batch: 8 × 16 = 128 (tc: at most 64) in one batch */
#define CMB_MAX_SPLIT 256 /* one (m, l) per thread; cu_attention refuses more splits */

__global__ void __launch_bounds__(CMB_WARPS * 32) k_attn_combine(const float *part_ml, const float *part_acc,
                                                                const cu_plane_meta *meta, const float *gate,
                                                                float *out, uint32_t G, uint32_t D, uint32_t n_split,
                                                                uint32_t align, cu_digits dg, const cu_rows R)
{
    CU_TL_SCOPE(TL_ATT_COMBINE);
    const uint32_t row = blockIdx.z; /* the pass row */
    if (row) {
        part_ml += (size_t)row * R.part_stride * 2;
        part_acc += (size_t)row * R.part_stride * D;
        meta = cu_row_meta(meta, R, row);
        gate = gate ? gate + (size_t)row * R.x_stride : gate;
        out += (size_t)row * R.o_stride;
    }
    __shared__ float fs[CMB_MAX_SPLIT];
    __shared__ float wred[2][CMB_WARPS];
    __shared__ float wnum[CMB_WARPS][32];
    const uint32_t hq = blockIdx.x, h = hq / G, g = hq % G, t = threadIdx.x;
    const uint32_t w = t >> 5, lane = t & 31, d = blockIdx.y * 32 + lane;
    const uint64_t len = meta[0].len, chunk = att_chunk(len, n_split, align);
    /* the splits with positions: s·chunk < len (the split kernel's blocks past them exited) */
    const uint32_t used = (uint32_t)((len + chunk - 1) / chunk);
    const size_t i0 = (size_t)h * n_split * G + g; /* partial index of (h, split 0, g); split s adds s·G */
    /* the gate was written by the projections, which finished before the split kernel launched:
     * loaded before the wait for the partials (one L2 latency off the end of the chain) */
    const float gv = gate ? gate[(size_t)hq * D + d] : 0.f;
    cu_pdl_wait();
    float a[CMB_R];
#pragma unroll
    for (int r = 0; r < CMB_R; r++) {
        const uint32_t s = w + CMB_WARPS * r;
        a[r] = s < used ? part_acc[(i0 + (size_t)s * G) * D + d] : 0.f;
    }
    const float ms = t < used ? part_ml[(i0 + (size_t)t * G) * 2] : -INFINITY;
    const float ls = t < used ? part_ml[(i0 + (size_t)t * G) * 2 + 1] : 0.f;
    float M = ms;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) M = fmaxf(M, __shfl_xor_sync(0xFFFFFFFFu, M, o));
    if (lane == 0) wred[0][w] = M;
    __syncthreads();
    M = wred[0][0];
#pragma unroll
    for (int i = 1; i < CMB_WARPS; i++) M = fmaxf(M, wred[0][i]);
    const float f = t < used ? __expf(ms - M) : 0.f;
    fs[t] = f;
    float den = f * ls;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) den += __shfl_xor_sync(0xFFFFFFFFu, den, o);
    if (lane == 0) wred[1][w] = den;
    __syncthreads();
    den = wred[1][0];
#pragma unroll
    for (int i = 1; i < CMB_WARPS; i++) den += wred[1][i];
    float num = 0.f;
#pragma unroll
    for (int r = 0; r < CMB_R; r++) {
        const uint32_t s = w + CMB_WARPS * r;
        if (s < used) num = fmaf(fs[s], a[r], num);
    }
    for (uint32_t s0 = CMB_WARPS * CMB_R; s0 < used; s0 += CMB_WARPS * CMB_R) { /* > 128 splits (v1) */
#pragma unroll
        for (int r = 0; r < CMB_R; r++) {
            const uint32_t s = s0 + w + CMB_WARPS * r;
            a[r] = s < used ? part_acc[(i0 + (size_t)s * G) * D + d] : 0.f;
        }
#pragma unroll
        for (int r = 0; r < CMB_R; r++) {
            const uint32_t s = s0 + w + CMB_WARPS * r;
            if (s < used) num = fmaf(fs[s], a[r], num);
        }
    }
    wnum[w][lane] = num;
    __syncthreads();
    if (w != 0) return;
    num = wnum[0][lane];
#pragma unroll
    for (int i = 1; i < CMB_WARPS; i++) num += wnum[i][lane];
    float o = num / den;
    if (gate) o = o * (1.f / (1.f + expf(-gv)));
    out[(size_t)hq * D + d] = o;
    cu_digits_write(dg, o, hq * D + d, row); /* one whole warp over 32 consecutive elements */
}

/* The combine for n_split splits per KV head cut at `align`; pdl: launched as a programmatic
 * dependent of the split kernel (see cu_pdl_trigger). */
static int launch_combine(cudaStream_t st, const float *pml, const float *pacc, const cu_plane_meta *meta,
                          const float *gate, float *out, const cu_attn_geom *g, uint32_t n_split, uint32_t align,
                          bool pdl, cu_digits dg, uint32_t n, const cu_rows &R)
{
    if (n_split > CMB_MAX_SPLIT || g->head_dim % 32) return -1;
    cudaLaunchConfig_t cfg = {};
    cudaLaunchAttribute at[1];
    cfg.gridDim = dim3(g->n_head, g->head_dim / 32, n);
    cfg.blockDim = dim3(CMB_WARPS * 32);
    cfg.stream = st;
    at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    at[0].val.programmaticStreamSerializationAllowed = 1;
    cfg.attrs = at;
    cfg.numAttrs = pdl ? 1 : 0;
    return cudaLaunchKernelEx(&cfg, k_attn_combine, pml, pacc, meta, gate, out, g->n_head / g->n_head_kv,
                              g->head_dim, n_split, align, dg, R) == cudaSuccess ? 0 : -1;
}

/* ---- tc: the split kernel on tensor cores (GQA 16:1, D = 128) ---------------------------------
 *
 * The 16 query heads of a KV head are the M = 16 of mma.sync m16n8k16 (f16 × f16 → f32). A block
 * (4 warps) still owns one (split, KV head) and writes the same partials as k_attn_split; each warp
 * walks its own 16-position tiles (tile t of the split goes to warp t mod 4) through a private
 * 3-stage cp.async pipeline in shared memory (K and V tile = 16 rows × 256 B each, 16-byte chunks
 * XOR-swizzled by row so ldmatrix is conflict-free), so two tiles per warp are in flight while it
 * computes one. Per tile: S[16 heads][16 pos] = Q·Kᵀ (K rows by ldmatrix are the B fragments),
 * online softmax per head on the C fragment (quad shuffles), then O += P·V (V by ldmatrix.trans),
 * the C fragment of S reused as the A fragment of P. The warps merge in shared memory at the end.
 *
 * Numerics (SPEC §4: no lossy activation storage): K and V are f16 already, exact as mma inputs.
 * q and p are f32, and each goes in as hi = f16(x) plus lo = f16(x − hi), two mmas into one f32
 * accumulator: hi + lo keeps 22 significant bits. q is first scaled per head by 2^e so that its
 * largest element lies in [2^14, 2^15) (no f16 overflow, lo stays normal for every element within
 * 2^-8 of the largest); the scores undo it exactly (a power-of-two multiply) before the f32 scale.
 * p ∈ [0, 1] goes in as p·2^15 (the same reason; subnormal f16 would cut small p to 2^-24
 * absolute) and the accumulator is multiplied back by 2^-15 at the end, exactly; l sums the f32 p.
 * Masked positions (past the split's end) are zero-filled by cp.async and get score −inf; a NaN or
 * Inf in q, K or V reaches l or the accumulator as NaN/Inf as in k_attn_split. */
#define TC_G 16
#define TC_D 128
#define TC_TILE 16
#define TC_STAGES 3                                                /* the route's; the workbench times 2 and 4 */
#define TC_WARPS 4
#define TC_TILE_BYTES (TC_TILE * TC_D * 2)                          /* one K or V tile: 4 KiB */
#define TC_SMEM(S) (TC_WARPS * (S) * 2 * TC_TILE_BYTES)            /* 3 stages: 96 KiB, 2 blocks per SM */
/* At most 64 splits per KV head on FULL planes: 2 KV heads × 64 = 128 blocks, one per SM on 132
 * SMs. 128 splits (256 blocks, one wave at 2 per SM) was the first choice; with the parallel combine
 * 64 is faster at every length from 2048 up (H200, kbench_attention: 131072 39.5 vs 42.5 µs per
 * call in a graph, 32768 14.2 vs 16.6, 2048 7.9 vs 10.2) and equal below; 32 loses at 32768+. */
#define TC_MAX_SPLIT 64
/* Ring planes (W = 2048; the backend gives them 32 splits): at most this many splits (16 and 8
 * were slower at a full window: 8.8 and 10.4 against 7.9 µs per call). */
#define TC_RING_SPLIT 32
/* Positions per split are a multiple of TC_ALIGN: with 64 each of the 4 warps has a whole 16-row
 * tile in every used split (at 32, two warps idle), and short planes use half the splits. */
#define TC_ALIGN 64
/* The combine launched as a programmatic dependent of the split kernel (cu_pdl_trigger). */
#define ATT_PDL true
#define TC_P_SCALE 32768.f                                         /* 2^15 */

/* Start the copy of warp-local tile i (positions j0 .. j0+15) into its stage. Lane l copies
 * 16-byte chunk l % 16 of rows 2k + l / 16, k = 0..7: each instruction reads two whole rows. */
template <bool RING>
__device__ __forceinline__ void tc_issue(uint32_t stage_u, uint64_t j0, uint64_t e, const cu_plane_meta &m,
                                         uint32_t HKV, uint32_t h, const att_kv &A, int lane)
{
    const int ch = lane & 15;
#pragma unroll
    for (int k = 0; k < 8; k++) {
        const int row = 2 * k + (lane >> 4);
        const uint64_t j = j0 + row;
        const bool valid = j < e;
        bool staged = false;
        const size_t off = valid ? att_kv_off(A, RING, HKV, TC_D, m, h, j, &staged) + ch * 8 : 0;
        const uint32_t so = row * 256 + ((ch ^ (row & 7)) << 4);
        tc_cp16(stage_u + so, (staged ? A.sk : A.kp) + off, valid);
        tc_cp16(stage_u + TC_TILE_BYTES + so, (staged ? A.sv : A.vp) + off, valid);
    }
}

/* Extra dynamic shared memory of a fused call (cu_attn_fuse): the 16 heads' normed, rotated q. */
#define TC_QS_BYTES (TC_G * TC_D * 4)

template <bool RING, int STAGES>
__global__ void __launch_bounds__(TC_WARPS * 32, 2) k_attn_split_tc(const float *q, const cu_step *step,
                                                                    const cu_plane_meta *meta, const uint16_t *kp,
                                                                    const uint16_t *vp, float *part_ml,
                                                                    float *part_acc, uint32_t HKV, uint32_t n_split,
                                                                    uint32_t align, float scale, cu_attn_fuse F,
                                                                    const cu_rows R)
{
    CU_TL_SCOPE(TL_ATT_SPLIT_TC);
    extern __shared__ __align__(128) uint8_t tc_smem[];
    __shared__ int qexp[TC_G];
    __shared__ float wml[TC_WARPS][TC_G][2];
    __shared__ double rsin[TC_D / 2], rcos[TC_D / 2], ksum[TC_WARPS];
    const uint32_t split = blockIdx.x, h = blockIdx.y, row = blockIdx.z; /* row: the pass row */
    att_kv A;
    att_split_row(R, row, HKV, TC_D, q, step, meta, kp, vp, part_ml, part_acc, &A);
    /* fused and not staged: this row's k and v, stored into its planes by this kernel (staged:
     * cu_qk_rope_store(kv_only) put them in the stage; this kernel norms and rotates q only) */
    const bool store = F.k && !R.sk;
    if (row && F.k) {
        F.k += (size_t)row * R.x_stride;
        F.v += (size_t)row * R.x_stride;
    }
    if (R.kp) {
        F.kw = (uint16_t *)kp;
        F.vw = (uint16_t *)vp;
    }
    const int w = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const cu_plane_meta m = meta[0];
    const uint64_t pos = step->pos;
    uint64_t b, e;
    cu_pdl_trigger(); /* the combine may launch now; it waits for this grid's partials */
    /* q's loads (and, fused, this token's k and v row) go out with the metadata's, before anything
     * waits for pos: the RoPE angles below need it, and their f64 sincos then overlaps the loads */
    const float *qh = q + (size_t)h * TC_G * TC_D;
    const int qhd = threadIdx.x >> 3, qsub = threadIdx.x & 7; /* 8 threads per head, 16 elements each */
    float4 qv[4];
#pragma unroll
    for (int i = 0; i < 4; i++) qv[i] = __ldg((const float4 *)(qh + qhd * TC_D + qsub * 16) + i);
    const float kx0 = store ? F.k[(size_t)h * TC_D + threadIdx.x] : 0.f; /* thread d of the row (TC_WARPS·32 = TC_D) */
    const float vx0 = store ? F.v[(size_t)h * TC_D + threadIdx.x] : 0.f;
    const double inv = F.k && F.rope && threadIdx.x < TC_D / 2 ? F.inv_freq[threadIdx.x] : 0.0;
    att_range(pos, m.len, n_split, align, split, &b, &e);
    if (b >= e) return; /* the combine skips it too */
    if (F.k && F.rope && threadIdx.x < TC_D / 2) /* fused: pair i = threadIdx.x, angle in f64 as k_qk_rope_store */
        att_rope_sincos_tab(pos, inv, &rsin[threadIdx.x], &rcos[threadIdx.x]);
    const float *qsrc = qh; /* where the Q fragments are read: q as given, or (fused) the normed, rotated copy */
    if (F.k) {
        /* QK-norm + RoPE + KV store (k_qk_rope_store's arithmetic), folded in: every block norms and
         * rotates its 16 q heads; the block whose range holds pos also stores this token's k and v
         * row, before any of its tiles (which read that row) is issued */
        float x[16];
#pragma unroll
        for (int i = 0; i < 4; i++) {
            x[4 * i] = qv[i].x;
            x[4 * i + 1] = qv[i].y;
            x[4 * i + 2] = qv[i].z;
            x[4 * i + 3] = qv[i].w;
        }
        if (F.q_norm) { /* the head's 8 threads: Σx² in f64 */
            double ss = 0;
#pragma unroll
            for (int j = 0; j < 16; j++) ss += (double)x[j] * x[j];
            ss += __shfl_xor_sync(0xFFFFFFFFu, ss, 1);
            ss += __shfl_xor_sync(0xFFFFFFFFu, ss, 2);
            ss += __shfl_xor_sync(0xFFFFFFFFu, ss, 4);
            const float r = (float)(1.0 / sqrt(ss / TC_D + F.eps));
#pragma unroll
            for (int j = 0; j < 16; j++) x[j] = x[j] * r * F.q_norm[qsub * 16 + j];
        }
        const bool has_pos = store && pos >= b && pos < e;
        float kx = 0.f, vx = 0.f;
        if (has_pos) { /* thread d = threadIdx.x of this token's k and v row */
            kx = kx0;
            vx = vx0;
            if (F.k_norm) { /* k_qk_rope_store's order: warp butterfly, then the warps in order */
                double ss = (double)kx * kx;
                for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xFFFFFFFFu, ss, o);
                if (lane == 0) ksum[w] = ss;
            }
        }
        __syncthreads(); /* rsin/rcos, ksum */
        if (F.rope) {
#pragma unroll
            for (int j = 0; j < 8; j++) {
                const double s = rsin[qsub * 8 + j], c = rcos[qsub * 8 + j];
                const float x0 = x[2 * j], x1 = x[2 * j + 1];
                x[2 * j] = (float)(x0 * c - x1 * s);
                x[2 * j + 1] = (float)(x0 * s + x1 * c);
            }
        }
        float *qs = (float *)(tc_smem + TC_SMEM(STAGES));
#pragma unroll
        for (int i = 0; i < 4; i++) {
            qv[i] = make_float4(x[4 * i], x[4 * i + 1], x[4 * i + 2], x[4 * i + 3]);
            *(float4 *)(qs + qhd * TC_D + qsub * 16 + 4 * i) = qv[i];
        }
        qsrc = qs;
        if (has_pos) {
            const uint32_t d = threadIdx.x;
            if (F.k_norm) {
                double t = 0;
                for (int i = 0; i < TC_WARPS; i++) t += ksum[i];
                const float r = (float)(1.0 / sqrt(t / TC_D + F.eps));
                kx = kx * r * F.k_norm[d];
            }
            if (F.rope) { /* pair (d & ~1, d | 1) */
                const float other = __shfl_xor_sync(0xFFFFFFFFu, kx, 1);
                const double s = rsin[d >> 1], c = rcos[d >> 1];
                kx = d & 1 ? (float)(other * s + kx * c) : (float)(kx * c - other * s);
            }
            const size_t off = att_off(RING, HKV, TC_D, m.capacity, h, att_row(m, RING, pos));
            F.kw[off + d] = __half_as_ushort(__float2half_rn(kx));
            F.vw[off + d] = __half_as_ushort(__float2half_rn(vx));
            __syncthreads(); /* the row is stored before a tile holding it is copied */
        }
    }

    /* the warp's first tiles go out before anything else */
    const uint32_t n_tiles = (uint32_t)((e - b + TC_TILE - 1) / TC_TILE);
    const uint32_t my_tiles = n_tiles > (uint32_t)w ? (n_tiles - w + TC_WARPS - 1) / TC_WARPS : 0;
    const uint32_t wsm = (uint32_t)__cvta_generic_to_shared(tc_smem) + w * (STAGES * 2 * TC_TILE_BYTES);
#pragma unroll
    for (uint32_t i = 0; i < STAGES - 1; i++) {
        if (i < my_tiles)
            tc_issue<RING>(wsm + i * 2 * TC_TILE_BYTES, b + (uint64_t)(w + TC_WARPS * i) * TC_TILE, e, m, HKV, h, A,
                           lane);
        tc_commit();
    }

    /* per-head power of two: 8 threads per head find max|q| */
    {
        const int hd = qhd, sub = qsub;
        float mx = 0.f;
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const float4 v = qv[i];
            mx = fmaxf(mx, fmaxf(fmaxf(fabsf(v.x), fabsf(v.y)), fmaxf(fabsf(v.z), fabsf(v.w))));
        }
        mx = fmaxf(mx, __shfl_xor_sync(0xFFFFFFFFu, mx, 1));
        mx = fmaxf(mx, __shfl_xor_sync(0xFFFFFFFFu, mx, 2));
        mx = fmaxf(mx, __shfl_xor_sync(0xFFFFFFFFu, mx, 4));
        if (sub == 0) {
            int ex = 0;
            if (mx > 0.f && mx <= 3.402823466e38f) { /* 0, Inf: no scaling (Inf still makes NaN) */
                frexpf(mx, &ex);                    /* mx = f·2^ex, f in [0.5, 1) */
                ex = 15 - ex;
                ex = ex > 126 ? 126 : ex;
            }
            qexp[hd] = ex;
        }
    }
    __syncthreads();

    /* Q as A fragments: rows gr, gr+8 (heads), columns 16kk + 2qc (+1, +8, +9) */
    const int gr = lane >> 2, qc = lane & 3;
    uint32_t qhi[8][4], qlo[8][4];
    float undo[2];
    {
        const float s0 = tc_pow2(qexp[gr]), s1 = tc_pow2(qexp[gr + 8]);
        undo[0] = tc_pow2(-qexp[gr]);
        undo[1] = tc_pow2(-qexp[gr + 8]);
#pragma unroll
        for (int kk = 0; kk < 8; kk++) {
            const float2 x00 = *(const float2 *)(qsrc + gr * TC_D + 16 * kk + 2 * qc);
            const float2 x10 = *(const float2 *)(qsrc + (gr + 8) * TC_D + 16 * kk + 2 * qc);
            const float2 x01 = *(const float2 *)(qsrc + gr * TC_D + 16 * kk + 8 + 2 * qc);
            const float2 x11 = *(const float2 *)(qsrc + (gr + 8) * TC_D + 16 * kk + 8 + 2 * qc);
            tc_split(x00.x * s0, x00.y * s0, qhi[kk][0], qlo[kk][0]);
            tc_split(x10.x * s1, x10.y * s1, qhi[kk][1], qlo[kk][1]);
            tc_split(x01.x * s0, x01.y * s0, qhi[kk][2], qlo[kk][2]);
            tc_split(x11.x * s1, x11.y * s1, qhi[kk][3], qlo[kk][3]);
        }
    }

    float o[16][4], mrun[2] = {-INFINITY, -INFINITY}, lrun[2] = {0.f, 0.f};
#pragma unroll
    for (int dt = 0; dt < 16; dt++) o[dt][0] = o[dt][1] = o[dt][2] = o[dt][3] = 0.f;
    const int lm = lane >> 3, lr = lane & 7; /* ldmatrix: which 8×8 matrix this lane addresses, which row */
    for (uint32_t i = 0; i < my_tiles; i++) {
        if (i + STAGES - 1 < my_tiles)
            tc_issue<RING>(wsm + ((i + STAGES - 1) % STAGES) * 2 * TC_TILE_BYTES,
                           b + (uint64_t)(w + TC_WARPS * (i + STAGES - 1)) * TC_TILE, e, m, HKV, h, A, lane);
        tc_commit();
        tc_wait<STAGES - 1>();
        __syncwarp();
        const uint32_t ks = wsm + (i % STAGES) * 2 * TC_TILE_BYTES, vs = ks + TC_TILE_BYTES;
        const uint64_t j0 = b + (uint64_t)(w + TC_WARPS * i) * TC_TILE;

        /* S = Q·Kᵀ: sc[nt] holds positions 8nt + 2qc (+1) of heads gr (c 0,1) and gr+8 (c 2,3) */
        float sc[2][4] = {{0.f, 0.f, 0.f, 0.f}, {0.f, 0.f, 0.f, 0.f}};
#pragma unroll
        for (int kk = 0; kk < 8; kk++) {
            const int row = (lm >> 1) * 8 + lr, ch = 2 * kk + (lm & 1);
            tc_ldm_mma2<false>(ks + row * 256 + ((ch ^ lr) << 4), qhi[kk], qlo[kk], sc[0], sc[1]);
        }
        /* scores (exact 2^-e undo, then the f32 scale), mask, online softmax per head */
#pragma unroll
        for (int nt = 0; nt < 2; nt++)
#pragma unroll
            for (int c = 0; c < 4; c++) {
                const uint64_t j = j0 + 8 * nt + 2 * qc + (c & 1);
                sc[nt][c] = j < e ? (sc[nt][c] * undo[c >> 1]) * scale : -INFINITY;
            }
#pragma unroll
        for (int r = 0; r < 2; r++) {
            float mx = fmaxf(fmaxf(sc[0][2 * r], sc[0][2 * r + 1]), fmaxf(sc[1][2 * r], sc[1][2 * r + 1]));
            mx = fmaxf(mx, __shfl_xor_sync(0xFFFFFFFFu, mx, 1));
            mx = fmaxf(mx, __shfl_xor_sync(0xFFFFFFFFu, mx, 2));
            const float mn = fmaxf(mrun[r], mx);
            const float corr = __expf(mrun[r] - mn);
            mrun[r] = mn;
            float ps = 0.f;
#pragma unroll
            for (int nt = 0; nt < 2; nt++)
#pragma unroll
                for (int c = 2 * r; c < 2 * r + 2; c++) {
                    sc[nt][c] = __expf(sc[nt][c] - mn);
                    ps += sc[nt][c];
                }
            lrun[r] = lrun[r] * corr + ps;
#pragma unroll
            for (int dt = 0; dt < 16; dt++) {
                o[dt][2 * r] *= corr;
                o[dt][2 * r + 1] *= corr;
            }
        }
        /* P (×2^15) as hi/lo A fragments: the C layout of S is the A layout of P */
        uint32_t ph[4], pl[4];
        tc_split(sc[0][0] * TC_P_SCALE, sc[0][1] * TC_P_SCALE, ph[0], pl[0]);
        tc_split(sc[0][2] * TC_P_SCALE, sc[0][3] * TC_P_SCALE, ph[1], pl[1]);
        tc_split(sc[1][0] * TC_P_SCALE, sc[1][1] * TC_P_SCALE, ph[2], pl[2]);
        tc_split(sc[1][2] * TC_P_SCALE, sc[1][3] * TC_P_SCALE, ph[3], pl[3]);
        /* O += P·V: ldmatrix.trans of V rows gives B fragments of dims 16nn .. 16nn+15 */
#pragma unroll
        for (int nn = 0; nn < 8; nn++) {
            const int row = (lm & 1) * 8 + lr, ch = 2 * nn + (lm >> 1);
            tc_ldm_mma2<true>(vs + row * 256 + ((ch ^ lr) << 4), ph, pl, o[2 * nn], o[2 * nn + 1]);
        }
        __syncwarp();
    }
    tc_wait<0>();
#pragma unroll
    for (int r = 0; r < 2; r++) {
        lrun[r] += __shfl_xor_sync(0xFFFFFFFFu, lrun[r], 1);
        lrun[r] += __shfl_xor_sync(0xFFFFFFFFu, lrun[r], 2);
    }
    __syncthreads(); /* every warp is done with its stages: they become the merge buffer */
    float *mg = (float *)tc_smem; /* [TC_WARPS][TC_G][TC_D] = 32 KiB */
    if (qc == 0) {
        wml[w][gr][0] = mrun[0];
        wml[w][gr][1] = lrun[0];
        wml[w][gr + 8][0] = mrun[1];
        wml[w][gr + 8][1] = lrun[1];
    }
    constexpr float unscale = 1.f / TC_P_SCALE;
#pragma unroll
    for (int dt = 0; dt < 16; dt++) {
        *(float2 *)&mg[(w * TC_G + gr) * TC_D + 8 * dt + 2 * qc] = make_float2(o[dt][0] * unscale, o[dt][1] * unscale);
        *(float2 *)&mg[(w * TC_G + gr + 8) * TC_D + 8 * dt + 2 * qc] =
            make_float2(o[dt][2] * unscale, o[dt][3] * unscale);
    }
    __syncthreads();
    /* thread: head hd, dims d0 .. d0+15; each warp's state rescaled to the block max (a warp with
     * no positions has m = −inf, l = 0, acc = 0 and weighs 0; 0·NaN stays NaN) */
    const int hd = threadIdx.x >> 3, d0 = (threadIdx.x & 7) * 16;
    float M = -INFINITY;
#pragma unroll
    for (int wi = 0; wi < TC_WARPS; wi++) M = fmaxf(M, wml[wi][hd][0]);
    float f[TC_WARPS], L = 0.f;
#pragma unroll
    for (int wi = 0; wi < TC_WARPS; wi++) {
        f[wi] = wml[wi][hd][0] == -INFINITY ? 0.f : __expf(wml[wi][hd][0] - M);
        L += f[wi] * wml[wi][hd][1];
    }
    const size_t base = ((size_t)h * n_split + split) * TC_G + hd;
#pragma unroll
    for (int d = 0; d < 16; d += 4) {
        float4 a = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
        for (int wi = 0; wi < TC_WARPS; wi++) {
            const float4 v = *(const float4 *)&mg[(wi * TC_G + hd) * TC_D + d0 + d];
            a.x = fmaf(f[wi], v.x, a.x);
            a.y = fmaf(f[wi], v.y, a.y);
            a.z = fmaf(f[wi], v.z, a.z);
            a.w = fmaf(f[wi], v.w, a.w);
        }
        *(float4 *)&part_acc[base * TC_D + d0 + d] = a;
    }
    if ((threadIdx.x & 7) == 0) {
        part_ml[base * 2] = M;
        part_ml[base * 2 + 1] = L;
    }
}

template <bool RING, int STAGES>
static int launch_tc(cudaStream_t st, const float *q, const cu_step *step, const cu_plane_meta *meta,
                     const uint16_t *kp, const uint16_t *vp, float *pml, float *pacc, const cu_attn_geom *g,
                     uint32_t align, const cu_attn_fuse &F, uint32_t n, const cu_rows &R)
{
    /* host-side attributes, legal while a stream is being captured into a graph; the carveout
     * asks for the shared-memory split that holds two blocks (96 KiB of stages, + 8 KiB fused) */
    if (cudaFuncSetAttribute(k_attn_split_tc<RING, STAGES>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                             TC_SMEM(STAGES) + TC_QS_BYTES) ||
        cudaFuncSetAttribute(k_attn_split_tc<RING, STAGES>, cudaFuncAttributePreferredSharedMemoryCarveout,
                             cudaSharedmemCarveoutMaxShared))
        return -1;
    /* a plain launch, fused or not: the combine (its programmatic dependent) reads the gate before
     * its wait, so the projections must have finished when this kernel launches (as a programmatic
     * dependent of the projections the gate was read stale: Glimmer logits off by 0.5) */
    const size_t smem = TC_SMEM(STAGES) + (F.k ? TC_QS_BYTES : 0);
    k_attn_split_tc<RING, STAGES><<<dim3(g->n_split, g->n_head_kv, n), TC_WARPS * 32, smem, st>>>(
        q, step, meta, kp, vp, pml, pacc, g->n_head_kv, g->n_split, align, g->scale, F, R);
    return 0;
}

template <int STAGES>
static int launch_split_tc(cudaStream_t st, const float *q, const cu_step *step, const cu_plane_meta *meta,
                           const uint16_t *kp, const uint16_t *vp, float *pml, float *pacc, const cu_attn_geom *g,
                           uint32_t align, const cu_attn_fuse &F, uint32_t n = 1, const cu_rows &R = cu_rows{})
{
    return g->ring ? launch_tc<true, STAGES>(st, q, step, meta, kp, vp, pml, pacc, g, align, F, n, R)
                   : launch_tc<false, STAGES>(st, q, step, meta, kp, vp, pml, pacc, g, align, F, n, R);
}

/* G query heads per block; a KV head's GT = H/HKV query heads take GT/G blocks (grid.z) that
 * each read the K/V rows. GQA 16:1 runs as 2 × 8: a block holding all 16 heads' running state
 * needed 249 registers (2 blocks, 8 warps per SM) and its long FULL planes ran ~10× under the KV
 * bandwidth; reading each row twice (the second mostly from L2) costs less than that. */
template <int G, int DPL>
static void launch_split(cudaStream_t st, const float *q, const cu_step *step, const cu_plane_meta *meta,
                         const uint16_t *kp, const uint16_t *vp, float *pml, float *pacc, const cu_attn_geom *g,
                         uint32_t n, const cu_rows &R)
{
    const uint32_t GT = g->n_head / g->n_head_kv;
    dim3 grid(g->n_split, g->n_head_kv, GT / G * n);
    k_attn_split<G, DPL><<<grid, ATT_WARPS * 32, 0, st>>>(q, step, meta, kp, vp, pml, pacc, g->n_head_kv, g->ring,
                                                          g->n_split, g->scale, GT, R);
}

template <int DPL>
static int launch_by_g(cudaStream_t st, const float *q, const cu_step *step, const cu_plane_meta *meta,
                       const uint16_t *kp, const uint16_t *vp, float *pml, float *pacc, const cu_attn_geom *g,
                       uint32_t n, const cu_rows &R)
{
    switch (g->n_head / g->n_head_kv) {
    case 1: launch_split<1, DPL>(st, q, step, meta, kp, vp, pml, pacc, g, n, R); return 0;
    case 2: launch_split<2, DPL>(st, q, step, meta, kp, vp, pml, pacc, g, n, R); return 0;
    case 4: launch_split<4, DPL>(st, q, step, meta, kp, vp, pml, pacc, g, n, R); return 0;
    case 8: launch_split<8, DPL>(st, q, step, meta, kp, vp, pml, pacc, g, n, R); return 0;
    case 16: launch_split<8, DPL>(st, q, step, meta, kp, vp, pml, pacc, g, n, R); return 0;
    default: return -1;
    }
}

/* How one call is cut: cu_attention takes att_plan_for(g); the workbench times other plans. */
struct att_plan {
    bool tc;          /* k_attn_split_tc, else k_attn_split (v1) */
    uint32_t n_split; /* blocks per KV head, at most g->n_split (the partials are sized for that) */
    uint32_t align;   /* positions per split: a multiple of this (v1: 32) */
    bool pdl;         /* the combine as a programmatic dependent of the split kernel */
};

static att_plan att_plan_for(const cu_attn_geom *g)
{
    att_plan p;
    p.tc = g->impl == CU_ATTN_TC && g->n_head == TC_G * g->n_head_kv && g->head_dim == TC_D;
    p.n_split = g->n_split;
    p.align = 32;
    p.pdl = ATT_PDL;
    if (p.tc) {
        const uint32_t cap = g->ring ? TC_RING_SPLIT : TC_MAX_SPLIT;
        if (p.n_split > cap) p.n_split = cap;
        p.align = TC_ALIGN;
    }
    return p;
}

/* parts: 1 the split kernel, 2 the combine, 3 both (the route). fuse: QK-norm + RoPE + KV store in
 * the split kernel (tc only; NULL: q and the cache row are ready). */
static int att_run(cudaStream_t st, const float *q, const cu_step *step, const cu_plane_meta *meta,
                   const uint16_t *k_plane, const uint16_t *v_plane, float *part_ml, float *part_acc,
                   const float *gate, float *out, const cu_attn_geom *g0, const att_plan &p, cu_digits dg, int parts,
                   const cu_attn_fuse *fuse = NULL, uint32_t n = 1, const cu_rows *Rp = NULL)
{
    const cu_rows R = Rp ? *Rp : cu_rows{};
    cu_attn_fuse F;
    memset(&F, 0, sizeof F);
    if (fuse) {
        if (!p.tc) return -1;
        F = *fuse;
    }
    cu_attn_geom g = *g0;
    g.n_split = p.n_split;
    if (!g.n_split || g.n_split > g0->n_split || g.n_split > CMB_MAX_SPLIT || p.align < 32 || (p.align & (p.align - 1)))
        return -1;
    int rc = 0;
    if (parts & 1) {
        if (p.tc)
            rc = launch_split_tc<TC_STAGES>(st, q, step, meta, k_plane, v_plane, part_ml, part_acc, &g, p.align, F, n, R);
        else if (p.align != 32) rc = -1;
        else switch (g.head_dim) {
        case 32: rc = launch_by_g<1>(st, q, step, meta, k_plane, v_plane, part_ml, part_acc, &g, n, R); break;
        case 64: rc = launch_by_g<2>(st, q, step, meta, k_plane, v_plane, part_ml, part_acc, &g, n, R); break;
        case 128: rc = launch_by_g<4>(st, q, step, meta, k_plane, v_plane, part_ml, part_acc, &g, n, R); break;
        default: rc = -1;
        }
    }
    if (!rc && (parts & 2))
        rc = launch_combine(st, part_ml, part_acc, meta, gate, out, &g, g.n_split, p.align, p.pdl, dg, n, R);
    return rc;
}

int cu_attention(cudaStream_t st, const float *q, const cu_step *step, const cu_plane_meta *meta,
                 const uint16_t *k_plane, const uint16_t *v_plane, float *part_ml, float *part_acc,
                 const float *gate, float *out, const cu_attn_geom *g, cu_digits dg, const cu_attn_fuse *fuse,
                 uint32_t n, const cu_rows *R)
{
    return att_run(st, q, step, meta, k_plane, v_plane, part_ml, part_acc, gate, out, g, att_plan_for(g), dg, 3, fuse, n,
                   R);
}

bool cu_attn_fusable(const cu_attn_geom *g) { return att_plan_for(g).tc; }

/* The test entry points' error path: a failing CUDA call records what failed and jumps to done. */
#define TRY(x, w)                                \
    do {                                         \
        what = (w);                              \
        if ((e = (x)) != cudaSuccess) goto done; \
    } while (0)

/* A test case's geometry and its token's step + plane metadata, as the route would upload them. */
static cu_attn_geom case_geom(const muser_cuda_attn_case *c, int impl)
{
    cu_attn_geom g;
    memset(&g, 0, sizeof g);
    g.n_head = c->n_head;
    g.n_head_kv = c->n_head_kv;
    g.head_dim = c->head_dim;
    g.ring = c->ring != 0;
    g.n_split = c->n_split;
    g.scale = c->scale;
    g.impl = impl;
    return g;
}
typedef struct case_step {
    cu_step s;
    cu_plane_meta m;
} case_step;
static case_step case_step_of(const muser_cuda_attn_case *c)
{
    case_step hs;
    memset(&hs, 0, sizeof hs);
    hs.s.pos = c->pos;
    hs.s.n_layer = 1;
    hs.m.origin_logical = c->origin_logical;
    hs.m.origin_physical = c->origin_physical;
    hs.m.len = c->len;
    hs.m.capacity = c->capacity;
    return hs;
}

int muser_cuda_attn_run(const muser_cuda_attn_case *c, int impl, float *out, char *msg, size_t msg_len)
{
    int n_dev = 0;
    if (cudaGetDeviceCount(&n_dev) != cudaSuccess || n_dev < 1) {
        cudaGetLastError();
        snprintf(msg, msg_len, "no CUDA device");
        return 77;
    }
    const size_t H = c->n_head, HKV = c->n_head_kv, D = c->head_dim;
    const size_t G = HKV ? H / HKV : 0;
    const size_t plane = (size_t)c->capacity * HKV * D;
    float *dq = NULL, *dgate = NULL, *dout = NULL, *pml = NULL, *pacc = NULL;
    uint16_t *dk = NULL, *dv = NULL;
    void *dstep = NULL;
    cudaStream_t st = NULL;
    const cu_attn_geom g = case_geom(c, impl);
    const case_step hs = case_step_of(c);
    cudaError_t e = cudaSuccess;
    int rc = -1;
    const char *what = "alloc";
    if (!H || !HKV || H % HKV || !c->n_split || !c->len || c->len > c->capacity || c->pos + 1 < c->len) {
        snprintf(msg, msg_len, "bad case");
        return -1;
    }
    TRY(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking), "stream");
    TRY(cudaMalloc((void **)&dq, H * D * sizeof(float)), "alloc q");
    TRY(cudaMalloc((void **)&dout, H * D * sizeof(float)), "alloc out");
    TRY(cudaMalloc((void **)&dk, plane * 2), "alloc K");
    TRY(cudaMalloc((void **)&dv, plane * 2), "alloc V");
    TRY(cudaMalloc((void **)&pml, HKV * c->n_split * G * 2 * sizeof(float)), "alloc partials");
    TRY(cudaMalloc((void **)&pacc, HKV * c->n_split * G * D * sizeof(float)), "alloc partials");
    TRY(cudaMalloc(&dstep, sizeof hs), "alloc step");
    if (c->gate) {
        TRY(cudaMalloc((void **)&dgate, H * D * sizeof(float)), "alloc gate");
        TRY(cudaMemcpy(dgate, c->gate, H * D * sizeof(float), cudaMemcpyHostToDevice), "upload gate");
    }
    TRY(cudaMemcpy(dq, c->q, H * D * sizeof(float), cudaMemcpyHostToDevice), "upload q");
    TRY(cudaMemcpy(dk, c->k_plane, plane * 2, cudaMemcpyHostToDevice), "upload K");
    TRY(cudaMemcpy(dv, c->v_plane, plane * 2, cudaMemcpyHostToDevice), "upload V");
    TRY(cudaMemcpy(dstep, &hs, sizeof hs, cudaMemcpyHostToDevice), "upload step");
    /* poison: an output or partial the kernels fail to write shows up as NaN */
    TRY(cudaMemset(dout, 0xFF, H * D * sizeof(float)), "poison");
    TRY(cudaMemset(pacc, 0xFF, HKV * c->n_split * G * D * sizeof(float)), "poison");
    if (cu_attention(st, dq, (const cu_step *)dstep, (const cu_plane_meta *)((cu_step *)dstep + 1), dk, dv, pml, pacc,
                     dgate, dout, &g, cu_digits{NULL, NULL, 0, NULL}, NULL)) {
        snprintf(msg, msg_len, "cu_attention refused the geometry (H %zu, HKV %zu, D %zu)", H, HKV, D);
        goto done_quiet;
    }
    TRY(cudaGetLastError(), "launch");
    TRY(cudaStreamSynchronize(st), "run");
    TRY(cudaMemcpy(out, dout, H * D * sizeof(float), cudaMemcpyDeviceToHost), "download");
    rc = 0;
done:
    if (e != cudaSuccess) snprintf(msg, msg_len, "cuda: %s: %s", what, cudaGetErrorString(e));
done_quiet:
    cudaFree(dq);
    cudaFree(dgate);
    cudaFree(dout);
    cudaFree(dk);
    cudaFree(dv);
    cudaFree(pml);
    cudaFree(pacc);
    cudaFree(dstep);
    if (st) cudaStreamDestroy(st);
    return rc;
}

__global__ void k_fill_random(uint16_t *p, uint64_t n, uint32_t seed)
{
    for (uint64_t i = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (uint64_t)gridDim.x * blockDim.x) {
        uint64_t z = i * 0x9E3779B97F4A7C15ull + seed;
        z = (z ^ (z >> 31)) * 0xBF58476D1CE4E5B9ull;
        z ^= z >> 29;
        p[i] = __half_as_ushort(__float2half((float)(z & 0xFFFF) / 32768.f - 1.f));
    }
}

void cu_fill_plane_random(cudaStream_t st, uint16_t *p, uint64_t n_elems, uint32_t seed)
{
    k_fill_random<<<4096, 256, 0, st>>>(p, n_elems, seed);
}

int muser_cuda_attn_fuse_check(const muser_cuda_attn_case *c, const float *k_row, const float *v_row,
                               const float *q_norm, const float *k_norm, float eps, int rope, float theta,
                               double *max_out, int *kv_equal, char *msg, size_t msg_len)
{
    int n_dev = 0;
    if (cudaGetDeviceCount(&n_dev) != cudaSuccess || n_dev < 1) {
        cudaGetLastError();
        snprintf(msg, msg_len, "no CUDA device");
        return 77;
    }
    const size_t H = c->n_head, HKV = c->n_head_kv, D = c->head_dim, QD = H * D, KD = HKV * D;
    const size_t plane = (size_t)c->capacity * KD, G = HKV ? H / HKV : 0;
    const cu_attn_geom g = case_geom(c, CU_ATTN_TC);
    if (!G || H % HKV || !c->len || c->len > c->capacity || c->pos + 1 < c->len || !cu_attn_fusable(&g)) {
        snprintf(msg, msg_len, "bad case or not a tc geometry");
        return -1;
    }
    const case_step hs = case_step_of(c);
    /* one allocation: qkv (q | k) and v of the separate route, q k v of the fused one, norms, gate,
     * outputs, partials; K and V planes per route */
    const size_t nf = (QD + KD) + KD + (QD + 2 * KD) + 2 * D + QD + 2 * QD + HKV * c->n_split * G * (2 + D);
    float *f = NULL;
    uint16_t *pl = NULL;
    void *dstep = NULL;
    double *rinv = NULL; /* the fused route takes the engine's RoPE table: its K rows must match the pow ones */
    cudaStream_t st = NULL;
    cudaError_t e = cudaSuccess;
    int rc = -1;
    const char *what = "alloc";
    uint16_t *hk[2] = {NULL, NULL}, *hv[2] = {NULL, NULL};
    float *ho[2] = {NULL, NULL};
    TRY(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking), "stream");
    TRY(cudaMalloc((void **)&f, nf * sizeof(float)), "alloc");
    TRY(cudaMalloc((void **)&pl, 4 * plane * 2), "alloc planes");
    TRY(cudaMalloc(&dstep, sizeof hs), "alloc step");
    TRY(cudaMalloc((void **)&rinv, D / 2 * sizeof(double)), "alloc RoPE table");
    if (cu_rope_inv_table(rinv, theta, (uint32_t)D)) {
        what = "RoPE table";
        e = cudaGetLastError();
        goto done;
    }
    {
        float *qkv = f, *vs = qkv + QD + KD, *q2 = vs + KD, *k2 = q2 + QD, *v2 = k2 + KD, *qn = v2 + KD, *kn = qn + D;
        float *gate = kn + D, *out[2] = {gate + QD, gate + 2 * QD}, *pml = gate + 3 * QD;
        float *pacc = pml + HKV * c->n_split * G * 2;
        uint16_t *kp[2] = {pl, pl + 2 * plane}, *vp[2] = {pl + plane, pl + 3 * plane};
        TRY(cudaMemcpy(qkv, c->q, QD * 4, cudaMemcpyHostToDevice), "upload");
        TRY(cudaMemcpy(qkv + QD, k_row, KD * 4, cudaMemcpyHostToDevice), "upload");
        TRY(cudaMemcpy(vs, v_row, KD * 4, cudaMemcpyHostToDevice), "upload");
        TRY(cudaMemcpy(q2, c->q, QD * 4, cudaMemcpyHostToDevice), "upload");
        TRY(cudaMemcpy(k2, k_row, KD * 4, cudaMemcpyHostToDevice), "upload");
        TRY(cudaMemcpy(v2, v_row, KD * 4, cudaMemcpyHostToDevice), "upload");
        if (q_norm) TRY(cudaMemcpy(qn, q_norm, D * 4, cudaMemcpyHostToDevice), "upload");
        if (k_norm) TRY(cudaMemcpy(kn, k_norm, D * 4, cudaMemcpyHostToDevice), "upload");
        if (c->gate) TRY(cudaMemcpy(gate, c->gate, QD * 4, cudaMemcpyHostToDevice), "upload");
        for (int r = 0; r < 2; r++) {
            TRY(cudaMemcpy(kp[r], c->k_plane, plane * 2, cudaMemcpyHostToDevice), "upload K");
            TRY(cudaMemcpy(vp[r], c->v_plane, plane * 2, cudaMemcpyHostToDevice), "upload V");
        }
        TRY(cudaMemcpy(dstep, &hs, sizeof hs, cudaMemcpyHostToDevice), "upload step");
        const cu_step *sp = (const cu_step *)dstep;
        const cu_plane_meta *mp = (const cu_plane_meta *)((cu_step *)dstep + 1);
        const cu_digits none = {NULL, NULL, 0, NULL};
        cu_qk_rope_store(st, qkv, vs, q_norm ? qn : NULL, k_norm ? kn : NULL, eps, rope != 0, false, theta, (uint32_t)D, sp,
                         mp, kp[0], vp[0], &g, false);
        if (cu_attention(st, qkv, sp, mp, kp[0], vp[0], pml, pacc, c->gate ? gate : NULL, out[0], &g, none, NULL))
            goto refused;
        cu_attn_fuse F;
        memset(&F, 0, sizeof F);
        F.k = k2;
        F.v = v2;
        F.q_norm = q_norm ? qn : NULL;
        F.k_norm = k_norm ? kn : NULL;
        F.eps = eps;
        F.rope = rope;
        F.theta = theta;
        F.kw = kp[1];
        F.vw = vp[1];
        F.inv_freq = rinv;
        if (cu_attention(st, q2, sp, mp, kp[1], vp[1], pml, pacc, c->gate ? gate : NULL, out[1], &g, none, &F))
            goto refused;
        TRY(cudaGetLastError(), "launch");
        TRY(cudaStreamSynchronize(st), "run");
        for (int r = 0; r < 2; r++) {
            hk[r] = (uint16_t *)malloc(plane * 2);
            hv[r] = (uint16_t *)malloc(plane * 2);
            ho[r] = (float *)malloc(QD * 4);
            if (!hk[r] || !hv[r] || !ho[r]) {
                snprintf(msg, msg_len, "out of memory");
                goto done_quiet;
            }
            TRY(cudaMemcpy(hk[r], kp[r], plane * 2, cudaMemcpyDeviceToHost), "download");
            TRY(cudaMemcpy(hv[r], vp[r], plane * 2, cudaMemcpyDeviceToHost), "download");
            TRY(cudaMemcpy(ho[r], out[r], QD * 4, cudaMemcpyDeviceToHost), "download");
        }
        double mx = 0;
        for (size_t i = 0; i < QD; i++) {
            const double d = fabs((double)ho[1][i] - (double)ho[0][i]);
            mx = d > mx || d != d ? d : mx;
        }
        *max_out = mx;
        *kv_equal = !memcmp(hk[0], hk[1], plane * 2) && !memcmp(hv[0], hv[1], plane * 2);
        rc = 0;
        goto done;
    }
refused:
    snprintf(msg, msg_len, "cu_attention refused the case");
    goto done_quiet;
done:
    if (e != cudaSuccess) snprintf(msg, msg_len, "cuda: %s: %s", what, cudaGetErrorString(e));
done_quiet:
    for (int r = 0; r < 2; r++) {
        free(hk[r]);
        free(hv[r]);
        free(ho[r]);
    }
    cudaFree(f);
    cudaFree(pl);
    cudaFree(dstep);
    cudaFree(rinv);
    if (st) cudaStreamDestroy(st);
    return rc;
}
#undef TRY

CU_TL_BIND_FN(cu_tl_bind_attention)
