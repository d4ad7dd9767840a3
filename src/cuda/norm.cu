/* norm.cu — the row-wide ops of the decode route: embedding + entry norm, the fused tails, SiLU·up
 * (when gate and up differ in type and cannot pair), argmax, and the bench's streaming read.
 *
 * Tail (muse, SPEC §1): h += rmsnorm(y, w_post, 1e-8); a = rmsnorm(h, w_next, 1e-5). One cluster
 * of blocks; the rounding points are the unfused ones: h is written as f32 and the second norm
 * reads those f32 values. Reductions accumulate in f64 (cheap here: E values). */
#include "cuda/ops.cuh"
#include "draw.h"

#include <string.h>

#include <cooperative_groups.h>

/* The tail runs on a cluster of blocks (one per SM) sharing the two sums of squares
 * through distributed shared memory: a single block spent ~8.5 us per tail on load latency and
 * 32-warp reductions (ncu, H200), 104 tails a token. Block r owns the 32-aligned slice
 * [r·S, (r+1)·S) of E, each thread at most PER elements of it in registers; every global read
 * is issued up front (the norm weights come from DRAM each token: 16 GB of matrices went through
 * L2 since). The cluster sums the per-block partials in rank order, so every block gets the same
 * bits and a replay is bit-identical. */
#define TAIL_CL 8
#define TAIL_T 256
/* The route's tails on 16 blocks of 512 threads (a non-portable cluster size: where the device
 * cannot place it, cu_tail_wide_ok says no and they stay on 8 of 256): one element per thread at
 * E = 6656, so every load is in flight at once and each partial sum is one square; 2.5% faster per
 * token than 8 × 256 on the H200 (16 × 256 and 16 × 416 +2.0%, 16 × 128 −0.3%, 8 × 128 −2%,
 * 4 × 256 −3.6%; bench/kernels/NOTES.md). */
#define TAIL_CL_WIDE 16
#define TAIL_T_WIDE 512
/* E <= 8192 (checked at context creation): each thread at most PER = 8192 / (blocks · threads) */

/* s[0] + … + s[n − 1] in index order, or (tree) pairwise over N >= n slots (the missing ones 0):
 * log2 N dependent adds instead of n */
__device__ __forceinline__ double sum_serial(const double *s, int n)
{
    double t = 0;
    for (int i = 0; i < n; i++) t += s[i];
    return t;
}
template <int N>
__device__ __forceinline__ double sum_tree(const double *s, int n)
{
    double t[N];
#pragma unroll
    for (int i = 0; i < N; i++) t[i] = i < n ? s[i] : 0.0;
#pragma unroll
    for (int lv = 1; lv < N; lv *= 2) /* level lv: t[i] += t[i + lv] for i a multiple of 2·lv */
#pragma unroll
        for (int i = 0; i + lv < N; i += 2 * lv) t[i] += t[i + lv];
    return t[0];
}

/* Sum of v over the cluster, one barrier: each block's partial is pushed into slots[rank] of every
 * block (distributed shared memory stores), one cluster barrier makes them visible, and each block
 * adds its own CL slots in rank order (so every block gets the same bits); with tree, the warps'
 * partials (at most 16: T <= 512) and the slots are added pairwise instead, in a fixed order too.
 * slots and sh are used once per kernel: nothing is overwritten, so no second barrier; a block may
 * leave after its last barrier, since every store into its shared memory precedes that barrier. */
template <int CL>
__device__ static double cluster_sum(double v, double *sh, double *slots, int tree)
{
    namespace cg = cooperative_groups;
    cg::cluster_group cl = cg::this_cluster();
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xFFFFFFFFu, v, o);
    const int w = threadIdx.x >> 5, lane = threadIdx.x & 31;
    if (lane == 0) sh[w] = v;
    __syncthreads();
    if (threadIdx.x < CL) { /* thread r stores this block's partial into block r */
        const double b = tree ? sum_tree<16>(sh, (int)(blockDim.x >> 5)) : sum_serial(sh, (int)(blockDim.x >> 5));
        *cl.map_shared_rank(slots + cl.block_rank(), threadIdx.x) = b;
    }
    cl.sync();
    return tree ? sum_tree<CL>(slots, CL) : sum_serial(slots, CL);
}

/* EMB: the embedding entry instead (cu_embed_norm): y = row *d_token of emb, h = 0 before, the
 * post weights ones (the entry norm is weightless): h = rmsnorm(y) (or y without the entry norm).
 * CL blocks of T threads, one cluster (its dimension given at launch: tail_cfg), each thread at
 * most PER elements.
 * The tails add the block and cluster partials pairwise and take each scale as the f64
 * rsqrt(Σ·inv_e + eps), inv_e = 1/E divided once on the host (+0.3-0.4% per token against serial
 * sums and 1/sqrt(Σ/E + eps)). The embedding entry keeps the serial sums and 1/sqrt: its bits
 * are those every earlier release gave (the two forms differ in the last f32 bit of a scale
 * where the f64 value sits within a few ulps of a rounding boundary), and it runs once a token. */
template <bool EMB, int CL = TAIL_CL, int T = TAIL_T, int PER = (8192 + CL * T - 1) / (CL * T)>
__global__ void __launch_bounds__(T)
    k_tail(const float *y, float *h, float *a, const float *w_post, float eps_post, const float *w_next,
           float eps_next, int sandwich, uint32_t E, cu_digits dg, int trigger, const mv_mat emb, const int32_t *d_token,
           double inv_e, uint32_t tok_stride)
{
    constexpr bool fast = !EMB;
    CU_TL_SCOPE(EMB ? TL_EMBED : TL_TAIL);
    if (trigger) cu_pdl_trigger(); /* the matvec after this tail may launch now (see cu_tail) */
    const uint32_t row = blockIdx.y; /* the pass row: its own vectors, the same arithmetic */
    if (row) {
        y = y ? y + (size_t)row * E : y;
        h += (size_t)row * E;
        a += (size_t)row * E;
        if (EMB) d_token += (size_t)row * tok_stride;
    }
    __shared__ double sh[2][32];
    __shared__ double slots[2][CL];
    __shared__ uint32_t bmax[8]; /* dg.qi: the largest |a| (f32 bits) of each of the slice's blocks */
    if (threadIdx.x < 8) bmax[threadIdx.x] = 0; /* (visible after the cluster sums' barriers) */
    /* the slice: a multiple of 32 (a warp a 32-group), of 256 where dg.qi wants whole blocks */
    static_assert(CL * T * PER >= 8192 && 8192 % (CL * 256) == 0, "a slice of whole blocks fits a CTA");
    const uint32_t S = dg.qi ? ((E + CL * 256 - 1) / (CL * 256)) * 256 : ((E + CL * 32 - 1) / (CL * 32)) * 32;
    const uint32_t lo = blockIdx.x * S, hi = lo + S < E ? lo + S : E;
    float yv[PER], hv[PER], wp[PER], wn[PER];
    /* the norm weights are constants: loaded before the wait for the matvec that writes y */
#pragma unroll
    for (int k = 0; k < PER; k++) {
        const uint32_t i = lo + threadIdx.x + k * T;
        const bool in = i < hi;
        wp[k] = EMB ? 1.f : in && sandwich ? w_post[i] : 0.f;
        wn[k] = in ? w_next[i] : 0.f;
    }
    cu_pdl_wait(); /* a no-op unless launched with programmatic stream serialization */
#pragma unroll
    for (int k = 0; k < PER; k++) {
        const uint32_t i = lo + threadIdx.x + k * T;
        const bool in = i < hi;
        if (EMB) {
            yv[k] = in ? mv_elem(emb, (uint32_t)*d_token, i) : 0.f;
            hv[k] = 0.f;
        } else {
            yv[k] = in ? y[i] : 0.f;
            hv[k] = in ? h[i] : 0.f;
        }
    }
    float r1 = 1.f;
    if (sandwich) {
        double ss = 0;
#pragma unroll
        for (int k = 0; k < PER; k++) ss += (double)yv[k] * yv[k];
        ss = cluster_sum<CL>(ss, sh[0], slots[0], fast);
        r1 = fast ? (float)rsqrt(fma(ss, inv_e, (double)eps_post)) : (float)(1.0 / sqrt(ss / E + eps_post));
    }
    double ss = 0;
#pragma unroll
    for (int k = 0; k < PER; k++) {
        const uint32_t i = lo + threadIdx.x + k * T;
        if (i < hi) {
            const float add = sandwich ? yv[k] * r1 * wp[k] : yv[k];
            hv[k] = hv[k] + add;
            h[i] = hv[k];
            ss += (double)hv[k] * hv[k];
        }
    }
    ss = cluster_sum<CL>(ss, sh[1], slots[1], fast);
    const float r2 = fast ? (float)rsqrt(fma(ss, inv_e, (double)eps_next)) : (float)(1.0 / sqrt(ss / E + eps_next));
#pragma unroll
    for (int k = 0; k < PER; k++) {
        const uint32_t i = lo + threadIdx.x + k * T;
        if (i < hi) {
            const float v = hv[k] * r2 * wn[k];
            a[i] = v;
            yv[k] = v;
            cu_digits_write(dg, v, i, row); /* lo, hi and E multiples of 32: whole warps */
        }
    }
    if (!dg.qi) return;
    /* the pair's layout: each block's largest |a| over its warps, then its 32-groups; a block lies
     * in one slice (S and E multiples of 256) */
    const uint32_t lane = threadIdx.x & 31;
#pragma unroll
    for (int k = 0; k < PER; k++) {
        const uint32_t e = threadIdx.x + k * T, mx = __reduce_max_sync(0xFFFFFFFFu, __float_as_uint(yv[k]) & 0x7FFFFFFFu);
        if (lane == 0 && lo + e < hi) atomicMax(&bmax[e / 256], mx);
    }
    __syncthreads();
#pragma unroll
    for (int k = 0; k < PER; k++) {
        const uint32_t e = threadIdx.x + k * T, i = lo + e;
        if (i < hi) { /* whole warps */
            float s, inv;
            mmi_scale(bmax[e / 256], s, inv);
            mmi_sub_write(yv[k], lane, (e / 32) % 8, s, inv, dg.qi + (size_t)row * dg.rs + (size_t)(i / 256) * MMI_XBLK);
        }
    }
}

typedef void (*tail_fn)(const float *, float *, float *, const float *, float, const float *, float, int, uint32_t, cu_digits,
                        int, const mv_mat, const int32_t *, double, uint32_t);
/* A tail's launch: TAIL_CL blocks of TAIL_T threads, or (wide) TAIL_CL_WIDE of TAIL_T_WIDE, as one
 * cluster per pass row (n); pdl as cu_pdl_cfg. at: 2 attributes. */
static cudaLaunchConfig_t tail_cfg(bool wide, cudaStream_t st, bool pdl, cudaLaunchAttribute *at, uint32_t n = 1)
{
    const uint32_t cl = wide ? TAIL_CL_WIDE : TAIL_CL;
    cudaLaunchConfig_t cfg = cu_pdl_cfg(dim3(cl, n), dim3(wide ? TAIL_T_WIDE : TAIL_T), st, pdl, at);
    at[cfg.numAttrs].id = cudaLaunchAttributeClusterDimension;
    at[cfg.numAttrs].val.clusterDim.x = cl;
    at[cfg.numAttrs].val.clusterDim.y = 1;
    at[cfg.numAttrs].val.clusterDim.z = 1;
    cfg.numAttrs++;
    cfg.attrs = at;
    return cfg;
}

void cu_tail(cudaStream_t st, const float *y, float *h, float *a, const float *w_post, float eps_post,
             const float *w_next, float eps_next, bool sandwich, uint32_t E, cu_digits dg, bool trigger, bool wide,
             uint32_t n)
{
    /* E <= 8192 is checked at context creation. The blocks may start while the matvec before them
     * runs (it triggers at its start, and the tail is its programmatic dependent); they read only
     * the norm weights before griddepcontrol.wait, and write nothing before it. */
    const mv_mat none = {NULL, 0, 0, 0, NULL};
    const tail_fn k = wide ? k_tail<false, TAIL_CL_WIDE, TAIL_T_WIDE> : k_tail<false>;
    cudaLaunchAttribute at[2];
    cudaLaunchConfig_t cfg = tail_cfg(wide, st, true, at, n);
    cudaLaunchKernelEx(&cfg, k, y, h, a, w_post, eps_post, w_next, eps_next, (int)sandwich, E, dg, (int)trigger, none,
                       (const int32_t *)NULL, 1.0 / E, 0u);
}

bool cu_tail_wide_ok(void)
{
    const tail_fn k = k_tail<false, TAIL_CL_WIDE, TAIL_T_WIDE>;
    if (cudaFuncSetAttribute(k, cudaFuncAttributeNonPortableClusterSizeAllowed, 1) != cudaSuccess) {
        cudaGetLastError();
        return false;
    }
    cudaLaunchAttribute at[2];
    cudaLaunchConfig_t cfg = tail_cfg(true, 0, false, at);
    int n = 0;
    if (cudaOccupancyMaxActiveClusters(&n, k, &cfg) != cudaSuccess || n < 1) {
        cudaGetLastError();
        return false;
    }
    return true;
}

/* The embedding entry on the tail's cluster: h = rmsnorm(emb[token], ones, entry_eps) (or the row
 * itself without the entry norm), a = rmsnorm(h, w_norm, eps) and its digits. trigger: as cu_tail. */
void cu_embed_norm(cudaStream_t st, const mv_mat *emb, const int32_t *d_token, float *h, float *a,
                   const float *w_norm, float eps, bool entry_norm, float entry_eps, uint32_t E, cu_digits dg, bool trigger,
                   uint32_t n, const cu_rows *R)
{
    cudaLaunchAttribute at[2];
    cudaLaunchConfig_t cfg = tail_cfg(false, st, false, at, n);
    cudaLaunchKernelEx(&cfg, k_tail<true>, (const float *)NULL, h, a, (const float *)NULL, entry_eps, w_norm, eps,
                       (int)entry_norm, E, dg, (int)trigger, *emb, d_token, 1.0 / E,
                       R ? R->step_stride / (uint32_t)sizeof(int32_t) : 0u);
}

__global__ void k_silu_mul(const float *g, const float *u, float *out, uint32_t n)
{
    const uint32_t i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = g[i] / (1.f + expf(-g[i])) * u[i];
}

void cu_silu_mul(cudaStream_t st, const float *g, const float *u, float *out, uint32_t n)
{
    k_silu_mul<<<(n + 255) / 256, 256, 0, st>>>(g, u, out, n);
}

#define AM_BLOCKS 256
__global__ void k_argmax1(const float *x, uint32_t n, float *pv, int32_t *pi, int32_t *nonfinite)
{
    CU_TL_SCOPE(TL_ARGMAX);
    x += (size_t)blockIdx.y * n; /* the pass row */
    pv += blockIdx.y * AM_BLOCKS;
    pi += blockIdx.y * AM_BLOCKS;
    nonfinite += blockIdx.y;
    __shared__ float sv[256];
    __shared__ int32_t si[256];
    float best = -INFINITY;
    int32_t bi = 0x7FFFFFFF;
    int bad = 0;
    for (uint32_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
        const float v = x[i];
        if (!isfinite(v)) bad = 1;
        else if (v > best || (v == best && (int32_t)i < bi)) { best = v; bi = (int32_t)i; }
    }
    if (bad) atomicAdd(nonfinite, 1);
    sv[threadIdx.x] = best;
    si[threadIdx.x] = bi;
    __syncthreads();
    for (int s = 128; s > 0; s >>= 1) {
        if ((int)threadIdx.x < s) {
            const float ov = sv[threadIdx.x + s];
            const int32_t oi = si[threadIdx.x + s];
            if (ov > sv[threadIdx.x] || (ov == sv[threadIdx.x] && oi < si[threadIdx.x])) {
                sv[threadIdx.x] = ov;
                si[threadIdx.x] = oi;
            }
        }
        __syncthreads();
    }
    if (threadIdx.x == 0) { pv[blockIdx.x] = sv[0]; pi[blockIdx.x] = si[0]; }
}

__global__ void k_argmax2(const float *pv, const int32_t *pi, int32_t *token, float *best)
{
    CU_TL_SCOPE(TL_ARGMAX);
    pv += blockIdx.x * AM_BLOCKS; /* the pass row */
    pi += blockIdx.x * AM_BLOCKS;
    token += blockIdx.x;
    best += blockIdx.x;
    __shared__ float sv[AM_BLOCKS];
    __shared__ int32_t si[AM_BLOCKS];
    sv[threadIdx.x] = pv[threadIdx.x];
    si[threadIdx.x] = pi[threadIdx.x];
    __syncthreads();
    for (int s = AM_BLOCKS / 2; s > 0; s >>= 1) {
        if ((int)threadIdx.x < s) {
            const float ov = sv[threadIdx.x + s];
            const int32_t oi = si[threadIdx.x + s];
            if (ov > sv[threadIdx.x] || (ov == sv[threadIdx.x] && oi < si[threadIdx.x])) {
                sv[threadIdx.x] = ov;
                si[threadIdx.x] = oi;
            }
        }
        __syncthreads();
    }
    if (threadIdx.x == 0) {
        *token = si[0] == 0x7FFFFFFF ? 0 : si[0];
        *best = sv[0];
    }
}

void cu_argmax(cudaStream_t st, const float *logits, uint32_t n, float *part_v, int32_t *part_i,
               int32_t *d_token, int32_t *d_nonfinite, float *d_best, uint32_t rows)
{
    cudaMemsetAsync(d_nonfinite, 0, rows * sizeof(int32_t), st);
    k_argmax1<<<dim3(AM_BLOCKS, rows), 256, 0, st>>>(logits, n, part_v, part_i, d_nonfinite);
    k_argmax2<<<rows, AM_BLOCKS, 0, st>>>(part_v, part_i, d_token, d_best);
}

/* ---- the best CU_TOPK logits of each row, exactly: a sampler with top-k <= CU_TOPK needs no more ----
 * Keys order (value, then the lower id) as unsigned 64-bit integers: the value's bits made
 * monotone (-0 taken as +0, so they tie as they compare) above the id's complement. Stage 1: block b
 * of a row sorts its slice's keys in shared memory (bitonic, descending) and writes its best CU_TOPK;
 * stage 2: one block per row sorts the TOPK_BLOCKS × CU_TOPK keys the same way and writes the first
 * CU_TOPK. Sorting networks compare the same pairs whatever the data: the result is the exact top. */
#define TOPK_BLOCKS 64
#define TOPK_SLICE 4096 /* keys one block sorts: a slice of ceil(V / TOPK_BLOCKS) <= 4096 logits */

__device__ __forceinline__ unsigned long long topk_key(float v, uint32_t id)
{
    uint32_t u = __float_as_uint(v == 0.0f ? 0.0f : v);
    u = (u & 0x80000000u) ? ~u : (u | 0x80000000u);
    return ((unsigned long long)u << 32) | (0xFFFFFFFFu - id);
}

/* descending bitonic sort of n (a power of two) keys in shared memory by the block's threads */
__device__ void topk_sort(unsigned long long *k, uint32_t n)
{
    for (uint32_t size = 2; size <= n; size <<= 1)
        for (uint32_t stride = size >> 1; stride > 0; stride >>= 1) {
            __syncthreads();
            for (uint32_t t = threadIdx.x; t < n / 2; t += blockDim.x) {
                const uint32_t i = 2 * stride * (t / stride) + t % stride, j = i + stride;
                const bool down = (i & size) == 0; /* this run descending */
                const unsigned long long a = k[i], b = k[j];
                if ((a < b) == down) { k[i] = b; k[j] = a; }
            }
        }
    __syncthreads();
}

__global__ void k_topk1(const float *x, uint32_t n, unsigned long long *part)
{
    extern __shared__ unsigned long long sk[];
    x += (size_t)blockIdx.y * n;
    part += ((size_t)blockIdx.y * TOPK_BLOCKS + blockIdx.x) * CU_TOPK;
    const uint32_t slice = (n + TOPK_BLOCKS - 1) / TOPK_BLOCKS, i0 = blockIdx.x * slice;
    for (uint32_t t = threadIdx.x; t < TOPK_SLICE; t += blockDim.x) {
        const uint32_t i = i0 + t;
        sk[t] = t < slice && i < n ? topk_key(x[i], i) : 0ull; /* 0 ranks below every real key */
    }
    topk_sort(sk, TOPK_SLICE);
    for (uint32_t t = threadIdx.x; t < CU_TOPK; t += blockDim.x) part[t] = sk[t];
}

__global__ void k_topk2(const unsigned long long *part, unsigned long long *out)
{
    extern __shared__ unsigned long long sk[];
    part += (size_t)blockIdx.x * TOPK_BLOCKS * CU_TOPK;
    out += (size_t)blockIdx.x * CU_TOPK;
    for (uint32_t t = threadIdx.x; t < TOPK_BLOCKS * CU_TOPK; t += blockDim.x) sk[t] = part[t];
    topk_sort(sk, TOPK_BLOCKS * CU_TOPK);
    for (uint32_t t = threadIdx.x; t < CU_TOPK; t += blockDim.x) out[t] = sk[t];
}

size_t cu_topk_part_bytes(uint32_t rows) { return (size_t)rows * TOPK_BLOCKS * CU_TOPK * sizeof(unsigned long long); }

cudaError_t cu_topk(cudaStream_t st, const float *logits, uint32_t n, unsigned long long *part, unsigned long long *out,
                    uint32_t rows)
{
    if ((n + TOPK_BLOCKS - 1) / TOPK_BLOCKS > TOPK_SLICE) return cudaErrorInvalidValue;
    /* both under the 48 KiB every device grants without an attribute (nothing to raise per call) */
    static_assert(TOPK_SLICE * 8 <= 48 * 1024 && TOPK_BLOCKS * CU_TOPK * 8 <= 48 * 1024, "cu_topk's shared memory");
    k_topk1<<<dim3(TOPK_BLOCKS, rows), 1024, TOPK_SLICE * 8, st>>>(logits, n, part);
    k_topk2<<<rows, 1024, TOPK_BLOCKS * CU_TOPK * 8, st>>>(part, out);
    return cudaGetLastError();
}

/* a key back to its logit and id */
void cu_topk_decode(unsigned long long key, float *v, int32_t *id)
{
    uint32_t u = (uint32_t)(key >> 32);
    u = (u & 0x80000000u) ? (u & 0x7FFFFFFFu) : ~u;
    memcpy(v, &u, sizeof *v);
    *id = (int32_t)(0xFFFFFFFFu - (uint32_t)key);
}

/* ---- a token drawn where the logits are: the host sampler's whole-row draw, bit for bit ----------
 * sampler.c without top-k or penalties: x_i = (l_i − max) / T, w_i = muser_weight_of(x_i) (draw.h: the
 * same IEEE steps), a candidate kept by min-p (x_i ≥ cut = logf(min_p)) and top-p (draw.h: the exact
 * per-exponent sums, the walks from the top, the boundary bucket ranked; `topp_*` below), the others
 * weighing 0; block b's weight the eight lanes of its MUSER_DRAW_BLOCK ids (lane j the ids j, j + 8, …
 * in f64 in order, the lanes then in order); the blocks' running sum in order (the host's mass and its
 * walk take the same adds); the first block whose running sum passes u·mass, and in it the first id
 * whose running sum does (where rounding leaves u past the steps: the last id with weight).
 *
 * top-p, a grid over each row's ids at every stage: (1) each id's weight into its exponent's sums
 * (z's: every candidate; the mass's: min-p's), exact in any order, so the atomic adds' order does not
 * matter; (2) the chosen exponent's ids into its 128 buckets (exact again); (3) the boundary bucket's
 * ids gathered; each block repeats the walks that choose the exponent and the bucket itself (a
 * thread's few hundred adds in a fixed order: the same answer everywhere). (4) A CTA per row sorts the
 * bucket (weight, then the lower id: a bitonic network over unique keys), scans its exact running sum
 * in parallel and takes the first id where the walk's sum reaches need: the last one kept (lv, li). A
 * boundary bucket of more than TOPP_CAP ids (a flat row) is left to the host: the row's id stays −1
 * and its logits come back. Then the draw: a thread per block of ids; a CTA per row, the running sum
 * by one thread (the order is the host's), the search by all. */
#define DRAW_MAX_BLOCKS (CU_DRAW_MAX_N / MUSER_DRAW_BLOCK)
#define TOPP_CAP 16384u
#define TOPP_GRID 96u /* CTAs per row of stages 1-3 */
enum { TOPP_ALL = 0, TOPP_CUT = 1, TOPP_HOST = 2 };

/* A row's top-p state and sums (the scratch after the blocks' sums) */
typedef struct topp_row {
    double ez[MUSER_DRAW_EXPS], em[MUSER_DRAW_EXPS], bs[MUSER_DRAW_SUBS];
    uint32_t cnt;      /* the boundary bucket's ids gathered */
    float lv;
    int32_t li, mode;
} topp_row;

__device__ __forceinline__ float draw_x(float l, float mx, float T) { return __fdiv_rn(__fsub_rn(l, mx), T); }

/* candidate i's weight in the draw: 0 unless min-p and top-p keep it */
__device__ __forceinline__ float draw_v(float l, uint32_t i, float mx, float T, float cut, const topp_row *tr)
{
    const float x = draw_x(l, mx, T), w = muser_weight_of(x);
    if (!(x >= cut)) return 0.0f;
    if (tr->mode == TOPP_CUT && !muser_topp_keeps(w, (int32_t)i, tr->lv, tr->li)) return 0.0f;
    return w;
}

/* The walks (one thread): need, and whether top-p cuts (the mass reaches need); the exponent e and,
 * when the buckets are summed (subs), the bucket b; *above the weight ranked before them */
__device__ bool topp_walks(const topp_row *tr, float top_p, bool subs, double *need, int *e, int *b, double *above)
{
    *need = __dmul_rn((double)top_p, muser_topp_total(tr->ez, MUSER_DRAW_EXPS));
    *above = 0.0;
    if (!(muser_topp_total(tr->em, MUSER_DRAW_EXPS) >= *need)) return false;
    *e = muser_topp_walk(tr->em, MUSER_DRAW_EXPS, *need, above);
    if (*e < 0) return false;
    if (subs) *b = *e << 7 | muser_topp_walk(tr->bs, MUSER_DRAW_SUBS, *need, above);
    return true;
}

__global__ void k_topp_sums(const float *x, uint32_t n, const float *best, const float *temp, const float *top_p,
                            const float *cut, topp_row *tp)
{
    __shared__ double ez[MUSER_DRAW_EXPS], em[MUSER_DRAW_EXPS];
    const uint32_t r = blockIdx.y;
    const float T = temp[r];
    if (!(T > 0.0f) || !(top_p[r] < 1.0f)) return;
    for (uint32_t k = threadIdx.x; k < MUSER_DRAW_EXPS; k += blockDim.x) ez[k] = em[k] = 0.0;
    __syncthreads();
    const float mx = best[r], c = cut[r];
    x += (size_t)r * n;
    for (uint32_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
        const float xi = draw_x(x[i], mx, T), w = muser_weight_of(xi);
        if (!(w > 0.0f)) continue;
        const uint32_t e = muser_w_exp(w);
        atomicAdd(&ez[e], (double)w); /* exact: the order does not matter (draw.h) */
        if (xi >= c) atomicAdd(&em[e], (double)w);
    }
    __syncthreads();
    for (uint32_t k = threadIdx.x; k < MUSER_DRAW_EXPS; k += blockDim.x) {
        if (ez[k] != 0.0) atomicAdd(&tp[r].ez[k], ez[k]);
        if (em[k] != 0.0) atomicAdd(&tp[r].em[k], em[k]);
    }
}

/* Stage 2 (gather false): the chosen exponent's ids into its buckets; stage 3 (gather true): the
 * boundary bucket's ids into the row's key list */
__global__ void k_topp_pass(const float *x, uint32_t n, const float *best, const float *temp, const float *top_p,
                            const float *cut, topp_row *tp, unsigned long long *keys, bool gather)
{
    __shared__ double bs[MUSER_DRAW_SUBS];
    __shared__ int sel, go;
    const uint32_t r = blockIdx.y;
    const float T = temp[r];
    if (!(T > 0.0f) || !(top_p[r] < 1.0f)) return;
    topp_row *tr = &tp[r];
    if (threadIdx.x == 0) {
        double need, above;
        int e = -1, b = -1;
        go = topp_walks(tr, top_p[r], gather, &need, &e, &b, &above);
        sel = gather ? b : e;
    }
    for (uint32_t k = threadIdx.x; k < MUSER_DRAW_SUBS; k += blockDim.x) bs[k] = 0.0;
    __syncthreads();
    if (!go) return;
    const float mx = best[r], c = cut[r];
    const uint32_t want = (uint32_t)sel;
    x += (size_t)r * n;
    for (uint32_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
        const float xi = draw_x(x[i], mx, T), w = muser_weight_of(xi);
        if (!(w > 0.0f) || !(xi >= c)) continue;
        if (!gather && muser_w_exp(w) == want) atomicAdd(&bs[muser_w_sub(w)], (double)w);
        if (gather && (muser_w_bits(w) >> 16) == want) {
            const uint32_t at = atomicAdd(&tr->cnt, 1u);
            if (at < TOPP_CAP) keys[(size_t)r * TOPP_CAP + at] = (unsigned long long)muser_w_bits(w) << 32 | (0xFFFFFFFFu - i);
        }
    }
    if (gather) return;
    __syncthreads();
    for (uint32_t k = threadIdx.x; k < MUSER_DRAW_SUBS; k += blockDim.x)
        if (bs[k] != 0.0) atomicAdd(&tr->bs[k], bs[k]);
}

/* Stage 4: a CTA per row sorts the bucket and finds the last id kept */
__global__ void __launch_bounds__(1024) k_topp_cut(const float *temp, const float *top_p, topp_row *tp,
                                                   const unsigned long long *keys)
{
    extern __shared__ unsigned long long key[]; /* [TOPP_CAP] the boundary bucket's (weight, ~id) */
    __shared__ double seg[1024], above, need;
    __shared__ int go;
    __shared__ uint32_t first;
    const uint32_t r = blockIdx.x, tid = threadIdx.x, nt = blockDim.x;
    if (!(temp[r] > 0.0f)) return;
    topp_row *tr = &tp[r];
    if (!(top_p[r] < 1.0f)) {
        if (tid == 0) tr->mode = TOPP_ALL;
        return;
    }
    const uint32_t cnt = tr->cnt;
    if (tid == 0) {
        double nd, a;
        int e, b;
        go = topp_walks(tr, top_p[r], true, &nd, &e, &b, &a);
        need = nd;
        above = a;
        first = cnt;
        tr->mode = !go ? TOPP_ALL : cnt > TOPP_CAP || cnt == 0 ? TOPP_HOST : TOPP_CUT;
    }
    __syncthreads();
    if (!go || cnt > TOPP_CAP || cnt == 0) return;
    uint32_t p2 = 1;
    while (p2 < cnt) p2 <<= 1;
    for (uint32_t k = tid; k < p2; k += nt) key[k] = k < cnt ? keys[(size_t)r * TOPP_CAP + k] : 0; /* 0: sorts last */
    __syncthreads();
    for (uint32_t size = 2; size <= p2; size <<= 1) /* bitonic, descending */
        for (uint32_t stride = size >> 1; stride; stride >>= 1) {
            for (uint32_t k = tid; k < p2 / 2; k += nt) {
                const uint32_t lo = 2 * k - (k & (stride - 1)), hi = lo + stride;
                const bool desc = !(lo & size);
                const unsigned long long a = key[lo], bb = key[hi];
                if ((a < bb) == desc) {
                    key[lo] = bb;
                    key[hi] = a;
                }
            }
            __syncthreads();
        }
    /* the running sum, exact (one exponent's weights): thread t's segment summed, the segments'
     * sums scanned, then each segment walked from its start */
    const uint32_t per = (cnt + nt - 1) / nt, j0 = min(tid * per, cnt), j1 = min(j0 + per, cnt);
    double own = 0.0;
    for (uint32_t j = j0; j < j1; j++) own += (double)__uint_as_float((uint32_t)(key[j] >> 32));
    seg[tid] = own;
    __syncthreads();
    for (uint32_t d = 1; d < nt; d <<= 1) { /* inclusive scan of the segments' sums */
        const double add = tid >= d ? seg[tid - d] : 0.0;
        __syncthreads();
        seg[tid] += add;
        __syncthreads();
    }
    double cum = seg[tid] - own; /* exact: what the segments before this one hold */
    for (uint32_t j = j0; j < j1; j++) {
        cum += (double)__uint_as_float((uint32_t)(key[j] >> 32));
        if (__dadd_rn(above, cum) >= need) {
            atomicMin(&first, j);
            break;
        }
    }
    __syncthreads();
    if (tid) return;
    const uint32_t last = first < cnt ? first : cnt - 1;
    tr->lv = __uint_as_float((uint32_t)(key[last] >> 32));
    tr->li = (int32_t)(0xFFFFFFFFu - (uint32_t)key[last]);
}

__global__ void k_draw_blocks(const float *x, uint32_t n, const float *best, const float *temp, const float *cut,
                              const topp_row *tp, double *bsum)
{
    const uint32_t r = blockIdx.y, b = blockIdx.x * blockDim.x + threadIdx.x, nb = (n + MUSER_DRAW_BLOCK - 1) / MUSER_DRAW_BLOCK;
    const float T = temp[r];
    if (!(T > 0.0f) || b >= nb || tp[r].mode == TOPP_HOST) return;
    x += (size_t)r * n;
    const float mx = best[r], c = cut[r];
    double lane[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    const uint32_t i0 = b * MUSER_DRAW_BLOCK, i1 = min(i0 + MUSER_DRAW_BLOCK, n);
    for (uint32_t i = i0; i < i1; i++) lane[i % 8] = __dadd_rn(lane[i % 8], (double)draw_v(x[i], i, mx, T, c, &tp[r]));
    double t = 0.0;
#pragma unroll
    for (int j = 0; j < 8; j++) t = __dadd_rn(t, lane[j]);
    bsum[(size_t)r * DRAW_MAX_BLOCKS + b] = t;
}

__global__ void k_draw_walk(const float *x, uint32_t n, const float *best, const float *temp, const float *cut,
                            const topp_row *tp, const double *u, int32_t *id, const double *bsum)
{
    extern __shared__ double inc[]; /* [nb] the blocks' running sums */
    __shared__ uint32_t first;
    const uint32_t r = blockIdx.x, nb = (n + MUSER_DRAW_BLOCK - 1) / MUSER_DRAW_BLOCK;
    const float T = temp[r];
    if (!(T > 0.0f)) return;
    if (tp[r].mode == TOPP_HOST) { /* the host draws it from the row */
        if (threadIdx.x == 0) id[r] = -1;
        return;
    }
    x += (size_t)r * n;
    bsum += (size_t)r * DRAW_MAX_BLOCKS;
    for (uint32_t b = threadIdx.x; b < nb; b += blockDim.x) inc[b] = bsum[b];
    if (threadIdx.x == 0) first = nb;
    __syncthreads();
    if (threadIdx.x == 0) {
        double acc = 0.0;
        for (uint32_t b = 0; b < nb; b++) inc[b] = acc = __dadd_rn(acc, inc[b]);
    }
    __syncthreads();
    const double uu = __dmul_rn(u[r], inc[nb - 1]);
    for (uint32_t b = threadIdx.x; b < nb; b += blockDim.x)
        if (uu < inc[b]) {
            atomicMin(&first, b);
            break; /* (the running sums only grow: this thread's later blocks pass too) */
        }
    __syncthreads();
    if (threadIdx.x) return;
    const float mx = best[r], c = cut[r];
    uint32_t b = first;
    if (b < nb) {
        double acc = b ? inc[b - 1] : 0.0;
        const uint32_t i0 = b * MUSER_DRAW_BLOCK, i1 = min(i0 + MUSER_DRAW_BLOCK, n);
        for (uint32_t i = i0; i < i1; i++) {
            acc = __dadd_rn(acc, (double)draw_v(x[i], i, mx, T, c, &tp[r]));
            if (uu < acc) {
                id[r] = (int32_t)i;
                return;
            }
        }
    } else { /* rounding can leave u just past the last step: the last block with weight */
        b = nb;
        while (b > 1 && !(bsum[b - 1] > 0.0)) b--;
        b--;
    }
    /* where the walk falls short: the block's last id with weight (sampler.c's last_weighed) */
    const uint32_t i0 = b * MUSER_DRAW_BLOCK, i1 = min(i0 + MUSER_DRAW_BLOCK, n);
    for (uint32_t i = i1; i-- > i0;)
        if (draw_v(x[i], i, mx, T, c, &tp[r]) > 0.0f) {
            id[r] = (int32_t)i;
            return;
        }
    id[r] = (int32_t)i0;
}

size_t cu_draw_scratch_bytes(uint32_t rows)
{
    return (size_t)rows * (DRAW_MAX_BLOCKS * sizeof(double) + sizeof(topp_row) + TOPP_CAP * sizeof(unsigned long long));
}

cudaError_t cu_draw(cudaStream_t st, const float *logits, uint32_t n, const float *best, const cu_draw_par &p,
                    int32_t *id, void *scratch, uint32_t rows)
{
    if (n == 0 || n > CU_DRAW_MAX_N) return cudaErrorInvalidValue;
    double *bsum = (double *)scratch;
    unsigned long long *keys = (unsigned long long *)(bsum + (size_t)rows * DRAW_MAX_BLOCKS);
    topp_row *tp = (topp_row *)(keys + (size_t)rows * TOPP_CAP);
    const uint32_t nb = (n + MUSER_DRAW_BLOCK - 1) / MUSER_DRAW_BLOCK;
    cudaError_t e = cudaMemsetAsync(tp, 0, rows * sizeof(topp_row), st); /* (mode TOPP_ALL) */
    if (!e && p.topp)
        e = cudaFuncSetAttribute(k_topp_cut, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                 TOPP_CAP * sizeof(unsigned long long));
    if (e) return e;
    if (p.topp) {
        k_topp_sums<<<dim3(TOPP_GRID, rows), 256, 0, st>>>(logits, n, best, p.temp, p.top_p, p.cut, tp);
        k_topp_pass<<<dim3(TOPP_GRID, rows), 256, 0, st>>>(logits, n, best, p.temp, p.top_p, p.cut, tp, keys, false);
        k_topp_pass<<<dim3(TOPP_GRID, rows), 256, 0, st>>>(logits, n, best, p.temp, p.top_p, p.cut, tp, keys, true);
        k_topp_cut<<<rows, 1024, TOPP_CAP * sizeof(unsigned long long), st>>>(p.temp, p.top_p, tp, keys);
    }
    k_draw_blocks<<<dim3((nb + 127) / 128, rows), 128, 0, st>>>(logits, n, best, p.temp, p.cut, tp, bsum);
    k_draw_walk<<<rows, 256, nb * sizeof(double), st>>>(logits, n, best, p.temp, p.cut, tp, p.u, id, bsum);
    return cudaGetLastError();
}

/* dst[r·dst_stride + i] = src[r·src_stride + i] for i < width, r < rows: the tap's rows out */
__global__ void k_rows_copy(const float *src, uint32_t src_stride, float *dst, size_t dst_stride, uint32_t width)
{
    const uint32_t i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < width) dst[blockIdx.y * dst_stride + i] = src[(size_t)blockIdx.y * src_stride + i];
}

void cu_rows_copy(cudaStream_t st, const float *src, uint32_t src_stride, float *dst, size_t dst_stride, uint32_t width,
                  uint32_t rows)
{
    k_rows_copy<<<dim3((width + 255) / 256, rows), 256, 0, st>>>(src, src_stride, dst, dst_stride, width);
}

__global__ void k_read_stream(const uint4 *p, uint64_t n, uint32_t *sink)
{
    uint32_t acc = 0;
    for (uint64_t i = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (uint64_t)gridDim.x * blockDim.x) {
        const uint4 v = __ldg(p + i);
        acc ^= v.x ^ v.y ^ v.z ^ v.w;
    }
    if (acc == 0x9E3779B9u) *sink = acc; /* keeps the loads alive */
}

void cu_read_stream(cudaStream_t st, const void *p, uint64_t bytes, uint32_t *sink, int n_sm)
{
    k_read_stream<<<n_sm * 8, 512, 0, st>>>((const uint4 *)p, bytes / 16, sink);
}

CU_TL_BIND_FN(cu_tl_bind_norm)
