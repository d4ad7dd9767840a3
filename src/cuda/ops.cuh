/* ops.cuh — the CUDA decode route's non-matvec operations, as kernels + launch helpers.
 *
 * One file per family: norm.cu (embedding + entry norm, the dual-eps fused tails, argmax),
 * attention.cu (QK-norm + RoPE + KV store, flash-decoding split attention, split combine with the
 * sigmoid gate). The matvecs: mmq.cuh (Q4_K) and mmq6.cuh (Q6_K) on tensor cores, matvec.cuh the
 * general path for every other format and shape. Every kernel reads the token position
 * and the KV plane metadata from device memory (cu_step), so one recorded graph serves every
 * token. */
#ifndef MUSER_CUDA_OPS_CUH
#define MUSER_CUDA_OPS_CUH

#include <cuda_runtime.h>
#include <stdint.h>

#include "cuda/attention.h" /* CU_ATTN_*, the C entry point for tests */
#include "cuda/launch.cuh"
#include "cuda/matvec.cuh"
#include "cuda/mmq.cuh"
#include "cuda/mmq6.cuh"
#include "cuda/mmqd.cuh"
#include "cuda/mmqd6.cuh"
#include "cuda/mmi.cuh"

/* KV plane metadata as the kernels see it (SPEC §3; mirrors kv_plane after this token's append). */
typedef struct cu_plane_meta {
    uint64_t origin_logical, origin_physical, len, capacity;
} cu_plane_meta;

/* Per-token device state, uploaded by one copy before each replay. meta[] follows. */
typedef struct cu_step {
    uint64_t pos;
    int32_t token;   /* the token of this step (the bench lane writes it from argmax instead) */
    uint32_t n_layer;
    /* A multi-row pass (cu_rows.sk set): the first position of this row's run (the rows of its
     * session in the pass) and that run's first pass row. Positions from stage_pos on are read
     * from the pass's staged rows (stage row stage_row + (p − stage_pos)), the rest from the plane. */
    uint64_t stage_pos;
    uint32_t stage_row, pad;
} cu_step;

static inline cu_plane_meta *cu_step_meta(cu_step *s) { return (cu_plane_meta *)(s + 1); }

/* Attention geometry of one layer. */
typedef struct cu_attn_geom {
    uint32_t n_head, n_head_kv, head_dim;
    bool ring;             /* SWA ring (token-major) or FULL plane (head-major) */
    uint32_t n_split;      /* blocks per KV head */
    float scale;
    int impl;              /* CU_ATTN_TC (the route: tc where the geometry allows, else v1) or CU_ATTN_V1 */
} cu_attn_geom;

/* Split-attention kernels: CU_ATTN_TC / CU_ATTN_V1 in cuda/attention.h. */

/* The matvec input digits a kernel writes as it produces x, each layout nullable: the Q4_K
 * tensor-core layout (mmq_prep_warp), the Q6_K one (mmq6_prep_warp), the dense multi-row ones
 * (mmqd_prep_warp, mmqd6_prep_warp); whichever the matrices reading x next take, so they need no
 * prep launch. */
typedef struct cu_digits {
    uint8_t *q4, *q6;
    uint32_t rs;     /* bytes between the rows' digits in a multi-row pass (every layout) */
    uint8_t *qd;     /* the dense multi-row Q4_K layout (mmqd.cuh), or NULL */
    uint8_t *qd6 = NULL; /* the dense multi-row Q6_K layout (mmqd6.cuh), or NULL */
    /* the exact-integer layout of the Q4_K gate·up pair (mmi.cuh), or NULL: one power of two per
     * 256-block, so only a writer that sees whole blocks takes it (the tails, cu_tail) */
    uint8_t *qi = NULL;
} cu_digits;

/* One 32-group's digits: all 32 lanes of a warp call it, lane l with v = x[p], p = 32g + l
 * (the layouts need x's length a multiple of 256); row: the pass row. */
__device__ __forceinline__ void cu_digits_write(const cu_digits d, float v, uint32_t p, uint32_t row = 0)
{
    if (d.q4) mmq_prep_warp(v, p, d.q4 + (size_t)row * d.rs);
    if (d.q6) mmq6_prep_warp(v, p, d.q6 + (size_t)row * d.rs);
    if (d.qd) mmqd_prep_warp(v, p, d.qd + (size_t)row * d.rs);
    if (d.qd6) mmqd6_prep_warp(v, p, d.qd6 + (size_t)row * d.rs);
}

/* The rows of a multi-row pass as a per-row kernel sees them (the small-batch route, docs/cuda.md):
 * row r is blockIdx.y (blockIdx.z in attention); its cu_step block (and the plane metadata after
 * it) at step + r·step_stride bytes; its activations at the call's row strides; layer l's K and V
 * planes at kp[r], vp[r]. A one-row pass: every field 0 or NULL (row 0, the call's own planes). */
typedef struct cu_rows {
    uint32_t step_stride;                  /* bytes between the rows' cu_step blocks */
    uint32_t x_stride, o_stride;           /* floats between rows: the kernel's input (q·k·gate·v for
                                            * attention; y, h and a for the tails) and output */
    uint32_t part_stride;                  /* attention partials (entries) between rows */
    const uint16_t *const *kp, *const *vp; /* [rows] this layer's planes; NULL: the call's */
    /* The pass's staged K and V of this layer, [rows][HKV·D] f16 each, row r's at + r·HKV·D; NULL:
     * K/V go straight into the planes (the one-row pass). Staged, a pass writes no plane until
     * cu_stage_commit, so rows of one session attend over the plane as it was plus the run's
     * staged rows (cu_step.stage_pos), and ring rows the run overwrites are still read. */
    uint16_t *sk, *sv;
} cu_rows;

__host__ __device__ __forceinline__ const cu_step *cu_row_step(const cu_step *s, const cu_rows &R, uint32_t r)
{
    return (const cu_step *)((const uint8_t *)s + (size_t)r * R.step_stride);
}
__host__ __device__ __forceinline__ const cu_plane_meta *cu_row_meta(const cu_plane_meta *m, const cu_rows &R, uint32_t r)
{
    return (const cu_plane_meta *)((const uint8_t *)m + (size_t)r * R.step_stride);
}

/* norm.cu */
/* dg: also write the output as matvec input digits (cu_digits); E % 32 == 0. trigger: as cu_tail */
/* rows: n pass rows (row r's token at d_token + r·R.step_stride bytes, its h and a at + r·E) */
void cu_embed_norm(cudaStream_t st, const mv_mat *emb, const int32_t *d_token, float *h, float *a,
                   const float *w_norm, float eps, bool entry_norm, float entry_eps, uint32_t E, cu_digits dg,
                   bool trigger, uint32_t n = 1, const cu_rows *R = NULL);
/* h += rmsnorm(y, w_post, eps_post) (sandwich; else h += y), a = rmsnorm(h, w_next, eps_next).
 * Launched as a programmatic dependent of the matvec before it. dg: also write a as matvec input
 * digits (cu_digits). trigger: let the next kernel launch at this one's start; only when that
 * kernel's x (dg) is a buffer no kernel that may still run reads (backend.cu, XS_*). wide: 16
 * blocks of 512 threads instead of 8 of 256 (only where cu_tail_wide_ok). */
void cu_tail(cudaStream_t st, const float *y, float *h, float *a, const float *w_post, float eps_post,
             const float *w_next, float eps_next, bool sandwich, uint32_t E, cu_digits dg, bool trigger, bool wide,
             uint32_t n = 1); /* n pass rows, row r's y, h and a at + r·E */
/* Whether the device places the tails' wide cluster (16 blocks of 512: cu_tail's wide) */
bool cu_tail_wide_ok(void);
void cu_silu_mul(cudaStream_t st, const float *g, const float *u, float *out, uint32_t n);
/* argmax over logits -> *d_token (the next token: the bench lane's, a greedy caller's), its logit
 * *d_best, and *d_nonfinite = #non-finite; rows > 1: row r's logits at + r·n, its partials at
 * + r·256, its token, logit and count at d_token[r], d_best[r], d_nonfinite[r] */
void cu_argmax(cudaStream_t st, const float *logits, uint32_t n, float *part_v, int32_t *part_i,
               int32_t *d_token, int32_t *d_nonfinite, float *d_best, uint32_t rows = 1);
/* The best CU_TOPK logits of each of rows rows of n (n <= 64·4096), best first (value, then the
 * lower id; -0 ties +0), as keys into out [rows][CU_TOPK] (cu_topk_decode); part: scratch of
 * cu_topk_part_bytes(rows). The rows must hold no NaN. */
/* dst[r·dst_stride + i] = src[r·src_stride + i], i < width, r < rows (a plain launch: whatever was
 * launched before it has finished when it reads) */
void cu_rows_copy(cudaStream_t st, const float *src, uint32_t src_stride, float *dst, size_t dst_stride, uint32_t width,
                  uint32_t rows);
#define CU_TOPK 64
size_t cu_topk_part_bytes(uint32_t rows);
cudaError_t cu_topk(cudaStream_t st, const float *logits, uint32_t n, unsigned long long *part, unsigned long long *out,
                    uint32_t rows);
void cu_topk_decode(unsigned long long key, float *v, int32_t *id);
/* Each of rows rows of n logits with temp[r] > 0: its token drawn from softmax(l / temp[r]) truncated
 * by top-p and min-p, with the uniform u[r], as the host sampler draws it (sampler.c, draw.h: the same
 * bits), into id[r] (rows with temp[r] = 0 are skipped; a row whose top-p boundary is too wide a tie
 * for the device gets −1: its logits are the host's to draw from); best [rows] each row's largest
 * logit (cu_argmax's); scratch of cu_draw_scratch_bytes(rows). n ≤ CU_DRAW_MAX_N; the rows must be
 * finite. Per row (device arrays [rows]): */
typedef struct cu_draw_par {
    const float *temp;   /* > 0, or 0: no draw */
    const float *top_p;  /* (0, 1]; 1: none */
    const float *cut;    /* logf(min_p) as the host computes it; −inf: none */
    const double *u;     /* [0, 1) */
    bool topp;           /* (host) whether any row's top-p is below 1: else top-p's kernels are not launched */
} cu_draw_par;
#define CU_DRAW_MAX_N (4096u * 64u)
size_t cu_draw_scratch_bytes(uint32_t rows);
cudaError_t cu_draw(cudaStream_t st, const float *logits, uint32_t n, const float *best, const cu_draw_par &p,
                    int32_t *id, void *scratch, uint32_t rows);

/* attention.cu */
/* qkv: q then k (normed and rotated in place); v: the values stored beside k. pdl: launched as a
 * programmatic dependent of the projections (it waits before its first read of qkv) */
/* R->sk set: K and V go to the pass row's stage row instead of the plane; kv_only: the K heads
 * only (q is normed and rotated by the fused split kernel) */
void cu_qk_rope_store(cudaStream_t st, float *qkv, const float *v, const float *q_norm, const float *k_norm, float eps,
                      bool rope, bool neox, float theta, uint32_t rope_dim, const cu_step *step,
                      const cu_plane_meta *meta, uint16_t *k_plane, uint16_t *v_plane, const cu_attn_geom *g, bool pdl,
                      uint32_t n = 1, const cu_rows *R = NULL, bool kv_only = false); /* n pass rows: cu_rows (x_stride: qkv's) */
/* Device-to-device copies of f16 runs in one launch (the checkpoint's and rollback's ring rows:
 * one kernel instead of a copy call per row and layer). */
#define CU_COPY_MAX 128
typedef struct cu_copy_list {
    uint32_t n;
    struct {
        const uint16_t *src;
        uint16_t *dst;
        uint64_t elems;
    } seg[CU_COPY_MAX];
} cu_copy_list;
void cu_copy_segments(cudaStream_t st, const cu_copy_list *L);
/* Layers' ring flags for cu_stage_commit (bit l: layer l's plane is a ring). */
#define CU_MAX_LAYERS 256
typedef struct cu_ring_mask {
    uint64_t bits[CU_MAX_LAYERS / 64];
} cu_ring_mask;
/* After a staged pass of n rows: every layer's staged K/V rows into the rows' planes (row r's at
 * its position by its own metadata), unless a row's logits held a non-finite value (d_nonfinite
 * [n]): then nothing is stored and the planes are as before the pass (fail closed). Tables as
 * route_enqueue_n's: row r's cu_step at step + r·step_stride bytes, layer l's metadata at meta + l
 * of it, its planes at kp[l·rows_max + r], the stage of layer l at sk + l·rows_max·HKV·D. */
void cu_stage_commit(cudaStream_t st, const cu_step *step, uint32_t step_stride, const uint16_t *const *kp,
                     const uint16_t *const *vp, const uint16_t *sk, const uint16_t *sv, const int32_t *d_nonfinite,
                     uint32_t n, uint32_t rows_max, uint32_t n_layer, const cu_ring_mask *ring, uint32_t HKV, uint32_t D);
/* QK-norm + RoPE + KV store folded into the tc split kernel (cu_attention's fuse; the arithmetic of
 * cu_qk_rope_store with non-NeoX pairs): q is this token's raw q, k and v its raw k and v rows. */
typedef struct cu_attn_fuse {
    const float *k, *v;              /* [HKV·D] each; k NULL: nothing fused */
    const float *q_norm, *k_norm;    /* NULL: no QK-norm */
    float eps;
    int rope;                        /* rotate pairs (2i, 2i+1) by pos·theta^(−2i/D) */
    float theta;
    uint16_t *kw, *vw;               /* the K and V planes, written at pos (not in a staged pass:
                                      * cu_qk_rope_store(kv_only) staged them) */
    const double *inv_freq;          /* NULL, or the D/2 angle rates (cu_rope_inv_table): the same bits */
} cu_attn_fuse;
/* dg: also write out as matvec input digits (cu_digits); head_dim % 32 == 0. fuse: NULL, or the
 * QK-norm/RoPE/store of this token done inside the split kernel (only where cu_attn_fusable) */
int cu_attention(cudaStream_t st, const float *q, const cu_step *step, const cu_plane_meta *meta,
                 const uint16_t *k_plane, const uint16_t *v_plane, float *part_ml, float *part_acc,
                 const float *gate, float *out, const cu_attn_geom *g, cu_digits dg, const cu_attn_fuse *fuse,
                 uint32_t n = 1, const cu_rows *R = NULL); /* n pass rows: cu_rows (q, k, v, gate at x_stride) */
/* t[i] = theta^(−2i/D) in f64 for i < D/2, as the RoPE kernels compute it (device memory t;
 * synchronous); 0 or -1 */
int cu_rope_inv_table(double *t, float theta, uint32_t D);
/* Whether cu_attention can take a fuse for this geometry (the tc split kernel: GQA 16:1, D 128). */
bool cu_attn_fusable(const cu_attn_geom *g);
/* Fill rows [0, n) of a plane with random f16 (benchmarks at depth; never zeros). */
void cu_fill_plane_random(cudaStream_t st, uint16_t *p, uint64_t n_elems, uint32_t seed);
/* Streaming-read kernel: bytes/time is the read ceiling the bench reports against. */
void cu_read_stream(cudaStream_t st, const void *p, uint64_t bytes, uint32_t *sink, int n_sm);

/* timeline.cuh: point each translation unit's kernels at a cu_tl_buf (device memory), or NULL;
 * no-ops unless built with MUSER_CUDA_TIMELINE */
void cu_tl_bind_norm(void *buf);
void cu_tl_bind_attention(void *buf);

#endif
