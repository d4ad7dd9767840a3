/* prefill.cuh — the prefill route's kernels (prefill.cu): src/forward.h's operations over a chunk
 * of one sequence's consecutive rows, with the matrices on tensor cores.
 *
 * Numerics (SPEC §4 forbids lossy activation storage): x is scaled per row by a power of two and
 * split into an f16 pair, x ≈ (xh + xl)·2^-e, 22 significant bits. Every matrix runs as three f16
 * products 2^-e·(xh·wh + xh·wl + xl·wh) with f32 accumulation (the dropped xl·wl is below 2^-22 of
 * a product), w ≈ wh + wl its f16 pair: Q4_K and Q6_K matrices in their tensor-core layouts
 * (pf_gemm_kq) made whole in f32 in registers from the units as they are, scaled by a power of two
 * per weight row and split there, on Hopper's warpgroup products; every other format unpacked into
 * a scratch pair (pf_gemm).
 * Every output's sum runs over k in the same order whatever the chunk holds, and attention walks
 * a row's keys in tiles that start at that row's first key, so a row's bytes do not depend on how
 * the prompt was cut into chunks (the prefill route's invariance, SPEC §4).
 * Reductions of the norms accumulate in f64; RoPE angles are f64; K/V are staged as the f16
 * bytes the cache will hold and stored after the pass's logits were checked. */
#ifndef MUSER_CUDA_PREFILL_CUH
#define MUSER_CUDA_PREFILL_CUH

#include <cuda_fp16.h>

#include "cuda/ops.cuh"

/* Rows of one GEMM tile (the chunk's rows) and of its weight tile. */
#define PF_TM 128
#define PF_TN 128

/* Whether the prefill GEMM takes a matrix of this shape: K a multiple of 32. */
static inline bool pf_shape_ok(uint32_t K) { return K % 32 == 0 && K > 0; }

/* Rows r0 .. r0+nr of w (any device layout: the tensor-core tiles, the general path's planes, the
 * float formats) as f16 pairs: wh = f16(w), wl = f16(w − wh), [nr][cols] each. */
void pf_unpack_w(cudaStream_t st, const mv_mat *w, uint32_t r0, uint32_t nr, __half *wh, __half *wl);
/* Rows of x [n][K] (row stride ldx) scaled by a power of two per row so that max|x| < 2^15, split
 * into f16 pairs [n][K]; rs[i] the inverse scale (NaN for a row holding Inf or NaN: fail closed). */
void pf_split_x(cudaStream_t st, const float *x, uint64_t ldx, uint32_t n, uint32_t K, __half *xh, __half *xl,
                float *rs);
/* y[i][j] (row stride ldy) = op(rs[i]·(xh·wh + xh·wl + xl·wh)[i][j]) for i < n, j < M; op:
 * MV_OP_STORE, or MV_OP_SOFTCAP (y·scale, then cap·tanh(y/cap) when cap > 0). */
void pf_gemm(cudaStream_t st, const __half *xh, const __half *xl, const float *rs, uint32_t n, const __half *wh,
             const __half *wl, uint32_t M, uint32_t K, float *y, uint64_t ldy, uint32_t op, float scale, float cap);

/* Whether the K-quant GEMM takes w: the tensor-core layouts MV_T_Q4_KT and MV_T_Q6_KT. */
bool pf_kq_ok(const mv_mat *w);
/* Rows of x [n][K] as pf_split_x does, written in the k order of w's format (q6: Q6_KT, else
 * Q4_KT), and for Q4_KT the sub-block sums xs = 2^-6·Σ x·2^e per 32 positions as f16 pairs
 * xsh, xsl [n][K/32]. */
void pf_split_kq(cudaStream_t st, const float *x, uint64_t ldx, uint32_t n, uint32_t K, bool q6, __half *xh, __half *xl,
                 __half *xsh, __half *xsl, float *rs);
/* Bytes of the partial sums pf_gemm_kq may need for calls of up to `rows` rows (a K split in
 * pieces when the grid would leave SMs idle; NULL part: no split). */
size_t pf_kq_part_bytes(uint32_t rows);
/* y[i][j] = op(x·w^T) for i < n, j < w->rows from pf_split_kq's x (its format w's), w read in its
 * tensor-core layout (numerics: prefill.cu, "the warpgroup GEMM"); part: pf_kq_part_bytes of
 * scratch. */
void pf_gemm_kq(cudaStream_t st, const __half *xh, const __half *xl, const __half *xsh, const __half *xsl,
                const float *rs, uint32_t n, const mv_mat *w, float *y, uint64_t ldy, uint32_t op, float scale, float cap,
                float *part);
/* Whether b lies right after a in device memory in the same K-quant layout and width, so that
 * both are one stacked matrix (the attention projections are uploaded so). */
bool pf_kq_adjacent(const mv_mat *a, const mv_mat *b);
/* pf_gemm_kq over nw (≤ 4) matrices w[0..nw) of which each lies right after the one before
 * (pf_kq_adjacent), as one launch: matrix i's outputs into y[i], row stride ldy[i]. */
void pf_gemm_kq_n(cudaStream_t st, const __half *xh, const __half *xl, const __half *xsh, const __half *xsl,
                  const float *rs, uint32_t n, const mv_mat *w, uint32_t nw, float *const *y, const uint64_t *ldy,
                  uint32_t op, float scale, float cap, float *part);
/* h[i] = emb[tokens[i]] (then the weightless entry norm) for i < n; tokens in device memory. */
void pf_embed(cudaStream_t st, const mv_mat *emb, const int32_t *tokens, uint32_t n, float *h, uint32_t E,
              bool entry_norm, float eps);
/* dst = rmsnorm(src, w, eps) per row (w NULL: weightless); rows of width E. */
void pf_rmsnorm(cudaStream_t st, const float *src, const float *w, float eps, float *dst, uint32_t n, uint32_t E);
/* h += w_post ? rmsnorm(sub, w_post, eps_post) : sub; dst = rmsnorm(h, w_next, eps_next); per row. */
void pf_tail(cudaStream_t st, const float *sub, float *h, const float *w_post, float eps_post, const float *w_next,
             float eps_next, float *dst, uint32_t n, uint32_t E);
/* Per row i (position p0 + i): QK-norm (when the weights are non-NULL) and RoPE (when rope) of
 * q [n][H·D] in place and of k, then k and v [n][HKV·D] rounded to f16 into sk, sv. */
void pf_stage(cudaStream_t st, float *q, const float *k, const float *v, const float *q_norm, const float *k_norm,
              float eps, bool rope, bool neox, const double *inv_freq, uint64_t p0, uint32_t n, uint32_t H,
              uint32_t HKV, uint32_t D, uint16_t *sk, uint16_t *sv);
/* out [n][H·D] = softmax(q·Kᵀ·scale)·V per row i at position p0 + i over keys lo .. p0 + i (lo:
 * the window's first, or 0), positions below p0 read from the plane (metadata as before the
 * pass), the rest from the staged rows sk, sv [n][HKV·D]. */
int pf_attention(cudaStream_t st, const float *q, const uint16_t *sk, const uint16_t *sv, const uint16_t *kp,
                 const uint16_t *vp, const cu_plane_meta *meta, bool ring, uint64_t p0, uint32_t n, uint32_t window,
                 float scale, uint32_t H, uint32_t HKV, uint32_t D, float *out);
/* o *= sigmoid(g); g = silu(g)·u; over n elements. */
void pf_gate(cudaStream_t st, float *o, const float *g, uint64_t n);
void pf_swiglu(cudaStream_t st, float *g, const float *u, uint64_t n);
/* The staged rows [n][HKV·D] of positions p0 .. p0+n−1 into a plane whose metadata (after their
 * append) is meta; of a ring, only the rows it keeps. */
void pf_store(cudaStream_t st, const uint16_t *sk, const uint16_t *sv, uint16_t *kp, uint16_t *vp,
              const cu_plane_meta *meta, bool ring, uint64_t p0, uint32_t n, uint32_t HKV, uint32_t D);
/* The number of non-finite values among y[0 .. n) into *d_count (device), added. */
void pf_count_nonfinite(cudaStream_t st, const float *y, uint64_t n, int32_t *d_count);

#endif
