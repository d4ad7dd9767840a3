/* pfattn.cuh — the prefill route's attention on tensor cores (pfattn.cu): pf_attention's
 * operation (prefill.cuh) for GQA 16:1 with head_dim 128 (Glimmer), out [n][H·D] = softmax(q·Kᵀ·
 * scale)·V per row i at position pos = p0 + i over keys lo .. pos (lo: pos + 1 − window for a
 * window layer once pos + 1 > window, else 0), keys below p0 from the plane (ring token-major or
 * FULL head-major, metadata as before the chunk), the rest from the chunk's staged f16 rows.
 *
 * Design. A CTA per (tile of QT consecutive rows, KV head), QT = 8 (4 for chunks under 256 rows,
 * so a short chunk still fills the GPU); warp w takes row i0 + w, its 16 query heads the M = 16 of
 * mma.sync m16n8k16, and the CTA's warps share every K/V tile: the K/V read per row is divided by
 * QT. Key tiles are 32 positions aligned at multiples of 32 from position 0; the CTA streams the
 * tiles that intersect the union of its rows' ranges (the first row's lo .. the last row's pos)
 * through a 4-stage cp.async pipeline (K and V tile 32 rows × 256 B each, 16-byte chunks
 * XOR-swizzled by row so ldmatrix is conflict-free: 64 KiB of shared memory), one __syncthreads a
 * tile. A warp computes only the tiles that intersect its own [lo, pos], in increasing order; on
 * every other tile it does nothing but the shared loads and the barrier. Per tile: S[16 heads][32
 * positions] = Q·Kᵀ (K rows by ldmatrix are the B fragments), the online softmax on the C
 * fragments (quad shuffles), O += P·V (V by ldmatrix.trans), the C layout of S reused as the A
 * layout of P — k_attn_split_tc's fragment code (attention.cu) on a 32-position tile. Q's hi/lo
 * fragments (64 registers) and O (64) stay in registers for the whole walk; no merge, no combine:
 * a warp owns its row's 16 heads from the first key to the last and stores them.
 *
 * Numerics (SPEC §4, k_attn_split_tc's): K and V are f16 (the cache format), exact as mma inputs;
 * q and p are f32 and go in as hi = f16(x) + lo = f16(x − hi), two mmas (22 significant bits), q
 * first scaled per head by the power of two 2^e that puts max|q| in [2^14, 2^15), undone exactly
 * on the scores before the f32 scale; p ∈ [0, 1] goes in as p·2^15 and O is multiplied back by
 * 2^−15 exactly; f32 accumulation; l sums the f32 p. Q·K_hi and Q·K_lo accumulate in two f32
 * chains per 8 positions (ILP) added once per tile.
 *
 * Chunk invariance (SPEC §4, the prefill route's): a row's arithmetic is a function of its own
 * position only. Its tiles are fixed by position (aligned, [lo/32, pos/32]) and walked in order,
 * positions outside [lo, pos] in its first and last tile are masked to score −inf (a select, not
 * arithmetic on what was loaded there), so p = 0 exactly and their V contribute exact zeros; staged
 * and plane keys are the same bytes. Which rows share the CTA, QT, n and p0 change only which
 * masked positions hold real keys and which zeros (outside the CTA's union, cp.async zero-fills):
 * not a bit of the row. Every reduction (the quad shuffles, l, O's mma chains) has a fixed order.
 * A fully masked tile cannot occur (a row walks only tiles that intersect its range), and the
 * running max is guarded anyway (m = −inf subtracts 0, so p and the correction are 0, never NaN).
 * A NaN or Inf in a masked position's V inside the CTA's union would reach the row (0·NaN); such a
 * key lies in another row's range of the same chunk, whose output it makes non-finite anyway.
 * Rows past n compute nothing and store nothing (their warps only help load). */
#ifndef MUSER_CUDA_PFATTN_CUH
#define MUSER_CUDA_PFATTN_CUH

#include "cuda/ops.cuh"

/* pf_attention's operation and arguments on tensor cores: -1 without launching when the geometry
 * is not GQA 16:1 with head_dim 128 or a pointer is not 16-byte aligned (pf_attention runs those),
 * else 0 after launching (0 also for n = 0: nothing to do). */
int pf_attention_tc(cudaStream_t st, const float *q, const uint16_t *sk, const uint16_t *sv, const uint16_t *kp,
                    const uint16_t *vp, const cu_plane_meta *meta, bool ring, uint64_t p0, uint32_t n, uint32_t window,
                    float scale, uint32_t H, uint32_t HKV, uint32_t D, float *out);
/* The same with qt rows per CTA (4 or 8; 0: pf_attention_tc's choice), for the check and timing:
 * a row's bytes do not depend on qt. */
int pf_attention_tc_qt(cudaStream_t st, const float *q, const uint16_t *sk, const uint16_t *sv, const uint16_t *kp,
                       const uint16_t *vp, const cu_plane_meta *meta, bool ring, uint64_t p0, uint32_t n,
                       uint32_t window, float scale, uint32_t H, uint32_t HKV, uint32_t D, float *out, uint32_t qt);

#endif
