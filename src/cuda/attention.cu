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
 * per query head; the combine kernel merges splits and applies sigmoid(gate). */
#include "cuda/ops.cuh"

#include <math.h>

#define ATT_WARPS 4

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
__global__ void k_qk_rope_store(float *qkv, const float *q_norm, const float *k_norm, float eps, int rope,
                                int neox, float theta, const cu_step *step, const cu_plane_meta *meta,
                                uint16_t *kp, uint16_t *vp, uint32_t H, uint32_t HKV, uint32_t D, int ring)
{
    extern __shared__ float xs[];
    __shared__ double sh[32];
    const uint32_t b = blockIdx.x;
    const bool is_q = b < H;
    float *x = is_q ? qkv + (size_t)b * D : qkv + (size_t)H * D + (size_t)(b - H) * D;
    const float *w = is_q ? q_norm : k_norm;
    const uint64_t pos = step->pos;
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
            /* angle in f64: at pos 131072 an f32 angle is off by ~0.01 rad */
            const double ang = (double)pos * pow((double)theta, -2.0 * (double)i / (double)D);
            double s, c;
            sincos(ang, &s, &c);
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
    const cu_plane_meta m = meta[0];
    const uint64_t r = att_row(m, ring, pos);
    const float *v = qkv + (size_t)(H + HKV) * D + (size_t)h * D;
    const size_t off = att_off(ring, HKV, D, m.capacity, h, r);
    for (uint32_t d = threadIdx.x; d < D; d += blockDim.x) {
        x[d] = xs[d];
        kp[off + d] = __half_as_ushort(__float2half_rn(xs[d]));
        vp[off + d] = __half_as_ushort(__float2half_rn(v[d]));
    }
}

void cu_qk_rope_store(cudaStream_t st, float *qkv, const float *q_norm, const float *k_norm, float eps,
                      bool rope, bool neox, float theta, uint32_t rope_dim, const cu_step *step,
                      const cu_plane_meta *meta, uint16_t *k_plane, uint16_t *v_plane, const cu_attn_geom *g)
{
    (void)rope_dim;
    const uint32_t threads = g->head_dim < 32 ? 32 : (g->head_dim > 256 ? 256 : g->head_dim);
    k_qk_rope_store<<<g->n_head + g->n_head_kv, threads, g->head_dim * sizeof(float), st>>>(
        qkv, q_norm, k_norm, eps, rope, neox, theta, step, meta, k_plane, v_plane, g->n_head, g->n_head_kv,
        g->head_dim, g->ring);
}

/* Positions per split: ceil(len / n_split) rounded up to a multiple of 32. */
__device__ __forceinline__ uint64_t att_chunk(uint64_t len, uint32_t n_split)
{
    return (((len + n_split - 1) / n_split) + 31) & ~(uint64_t)31;
}

/* Range of block `split` of n_split over the stored positions. */
__device__ __forceinline__ void att_range(uint64_t pos, uint64_t len, uint32_t n_split, uint32_t split,
                                          uint64_t *b, uint64_t *e)
{
    const uint64_t first = pos + 1 - len;
    const uint64_t chunk = att_chunk(len, n_split);
    *b = first + (uint64_t)split * chunk;
    *e = *b + chunk;
    if (*e > pos + 1) *e = pos + 1;
}

/* G query heads per KV head, D = 32·DPL. */
template <int G, int DPL>
__global__ void __launch_bounds__(ATT_WARPS * 32) k_attn_split(const float *q, const cu_step *step,
                                                             const cu_plane_meta *meta, const uint16_t *kp,
                                                             const uint16_t *vp, float *part_ml, float *part_acc,
                                                             uint32_t HKV, int ring, uint32_t n_split, float scale,
                                                             uint32_t GT)
{
    constexpr int D = 32 * DPL;
    __shared__ float qs[G][D];
    __shared__ float ps[ATT_WARPS][G][32];
    __shared__ float mg[2][G][D];
    __shared__ float mml[ATT_WARPS][G][2];
    const uint32_t split = blockIdx.x, h = blockIdx.y;
    const int w = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const cu_plane_meta m = meta[0];
    const uint64_t pos = step->pos;
    uint64_t b, e;
    att_range(pos, m.len, n_split, split, &b, &e);
    if (b >= e) return; /* the combine skips it too */
    /* q of the G heads: every load issued before the first is used (a plain strided loop waited
     * one L2 latency per element) */
    {
        constexpr int N4 = G * D / 4, T = ATT_WARPS * 32;
        const float4 *q4 = (const float4 *)(q + ((size_t)h * GT + (size_t)blockIdx.z * G) * D);
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
            const uint16_t *kr = kp + att_off(ring, HKV, D, m.capacity, h, att_row(m, ring, j));
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
                const uint16_t *vr = vp + att_off(ring, HKV, D, m.capacity, h, att_row(m, ring, j0 + jj)) + lane * DPL;
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
        const size_t base = ((size_t)h * n_split + split) * GT + (size_t)blockIdx.z * G;
        for (int g = 0; g < G; g++) {
            float lt = 0.f;
            for (int i = 0; i < ATT_WARPS; i++)
                if (mml[i][g][0] != -INFINITY) lt += mml[i][g][1] * __expf(mml[i][g][0] - bm[g]);
            for (int k = 0; k < DPL; k++) part_acc[(base + g) * D + lane * DPL + k] = acc[g][k] + mg[0][g][lane * DPL + k];
            if (lane == 0) { part_ml[(base + g) * 2] = bm[g]; part_ml[(base + g) * 2 + 1] = lt; }
        }
    }
}

/* One block per query head: merge the used splits, divide, gate. */
__global__ void k_attn_combine(const float *part_ml, const float *part_acc, const cu_step *step,
                               const cu_plane_meta *meta, const float *gate, float *out, uint32_t G, uint32_t D,
                               uint32_t n_split, uint8_t *xq)
{
    __shared__ float wmax[32];
    const uint32_t hq = blockIdx.x, h = hq / G, g = hq % G;
    const uint64_t len = meta[0].len, chunk = att_chunk(len, n_split);
    /* the splits with positions: s·chunk < len (the split kernel's blocks past them exited) */
    const uint32_t used = (uint32_t)((len + chunk - 1) / chunk);
    /* max over the used splits' running maxima, threads over splits, then the block */
    float M = -INFINITY;
    for (uint32_t s = threadIdx.x; s < used; s += blockDim.x) M = fmaxf(M, part_ml[(((size_t)h * n_split + s) * G + g) * 2]);
    for (int o = 16; o > 0; o >>= 1) M = fmaxf(M, __shfl_xor_sync(0xFFFFFFFFu, M, o));
    if ((threadIdx.x & 31) == 0) wmax[threadIdx.x >> 5] = M;
    __syncthreads();
    M = wmax[0];
    for (uint32_t i = 1; i < blockDim.x / 32; i++) M = fmaxf(M, wmax[i]);
    for (uint32_t d = threadIdx.x; d < D; d += blockDim.x) {
        float num = 0.f, den = 0.f;
#pragma unroll 8
        for (uint32_t s = 0; s < used; s++) {
            const size_t i = ((size_t)h * n_split + s) * G + g;
            const float f = __expf(part_ml[i * 2] - M);
            den += f * part_ml[i * 2 + 1];
            num += f * part_acc[i * D + d];
        }
        float o = num / den;
        if (gate) {
            const float gv = gate[(size_t)hq * D + d];
            o = o * (1.f / (1.f + expf(-gv)));
        }
        out[(size_t)hq * D + d] = o;
        if (xq) mvq_prep_warp(o, hq * D + d, xq); /* D % 32 == 0: whole warps */
    }
}

/* G query heads per block; a KV head's GT = H/HKV query heads take GT/G blocks (grid.z) that
 * each read the K/V rows. GQA 16:1 runs as 2 × 8: a block holding all 16 heads' running state
 * needed 249 registers (2 blocks, 8 warps per SM) and its long FULL planes ran ~10× under the KV
 * bandwidth; reading each row twice (the second mostly from L2) costs less than that. */
template <int G, int DPL>
static void launch_split(cudaStream_t st, const float *q, const cu_step *step, const cu_plane_meta *meta,
                         const uint16_t *kp, const uint16_t *vp, float *pml, float *pacc, const cu_attn_geom *g)
{
    const uint32_t GT = g->n_head / g->n_head_kv;
    dim3 grid(g->n_split, g->n_head_kv, GT / G);
    k_attn_split<G, DPL><<<grid, ATT_WARPS * 32, 0, st>>>(q, step, meta, kp, vp, pml, pacc, g->n_head_kv, g->ring,
                                                          g->n_split, g->scale, GT);
}

template <int DPL>
static int launch_by_g(cudaStream_t st, const float *q, const cu_step *step, const cu_plane_meta *meta,
                       const uint16_t *kp, const uint16_t *vp, float *pml, float *pacc, const cu_attn_geom *g)
{
    switch (g->n_head / g->n_head_kv) {
    case 1: launch_split<1, DPL>(st, q, step, meta, kp, vp, pml, pacc, g); return 0;
    case 2: launch_split<2, DPL>(st, q, step, meta, kp, vp, pml, pacc, g); return 0;
    case 4: launch_split<4, DPL>(st, q, step, meta, kp, vp, pml, pacc, g); return 0;
    case 8: launch_split<8, DPL>(st, q, step, meta, kp, vp, pml, pacc, g); return 0;
    case 16: launch_split<8, DPL>(st, q, step, meta, kp, vp, pml, pacc, g); return 0;
    default: return -1;
    }
}

int cu_attention(cudaStream_t st, const float *q, const cu_step *step, const cu_plane_meta *meta,
                 const uint16_t *k_plane, const uint16_t *v_plane, float *part_ml, float *part_acc,
                 const float *gate, float *out, const cu_attn_geom *g, uint8_t *xq)
{
    int rc;
    switch (g->head_dim) {
    case 32: rc = launch_by_g<1>(st, q, step, meta, k_plane, v_plane, part_ml, part_acc, g); break;
    case 64: rc = launch_by_g<2>(st, q, step, meta, k_plane, v_plane, part_ml, part_acc, g); break;
    case 128: rc = launch_by_g<4>(st, q, step, meta, k_plane, v_plane, part_ml, part_acc, g); break;
    default: rc = -1;
    }
    if (rc) return rc;
    const uint32_t G = g->n_head / g->n_head_kv;
    k_attn_combine<<<g->n_head, g->head_dim, 0, st>>>(part_ml, part_acc, step, meta, gate, out, G, g->head_dim,
                                                       g->n_split, xq);
    return 0;
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
