/* forward.h — the backend op interface: the muse / llama / qwen3 forward pass is written once
 * (src/forward.c, fwd_run) against these operations, and every fast backend implements them.
 *
 * A pass runs n rows (tokens at logical positions pos[0..n)) through the model. Activations live
 * in backend-owned buffers named by fwd_buf, each [n][width] f32 row-major; weights are passed
 * as the model's muser_tensor (a backend that keeps its own copy of the weights, e.g. on a GPU,
 * looks it up by the tensor). Nothing in an op's arguments is a host pointer to activations, so
 * a CUDA backend can record the same sequence into a graph.
 *
 * KV protocol: attn_stage computes the layer's K and V for the pass's rows and keeps them STAGED
 * (rounded to f16, exactly the bytes the cache would hold); attention reads the cache's stored
 * positions plus the staged rows, so the cache is untouched during the pass. kv_append_staged appends
 * every layer's staged rows only after the logits were checked, so a pass that fails (NaN
 * logits) leaves the cache as it was. This also solves the sliding-window ring: a pass longer
 * than the ring's free rows would otherwise overwrite rows its own earlier queries still need.
 *
 * The route (decode: the small-batch route, rows from any sequences, each row's arithmetic its
 * own; batch: GEMM-shaped, weights unpacked once per pass) is chosen by the caller and passed in
 * fwd_rows; results of both routes satisfy SPEC §4, and a backend keeps each route's arithmetic
 * independent of how rows are split into passes and across threads. Rows carry their sequence:
 * attention, staging and the commit act on that sequence's cache. */
#ifndef MUSER_FORWARD_H
#define MUSER_FORWARD_H

#include "model.h"

typedef enum fwd_buf {
    FWD_H,    /* [n][E]    the residual stream, f32; rewritten by each tail */
    FWD_X,    /* [n][E]    the normed input of the next matrix group (a pre-norm's output) */
    FWD_Q,    /* [n][H*D]  queries */
    FWD_K,    /* [n][HKV*D] keys (before staging) */
    FWD_V,    /* [n][HKV*D] values */
    FWD_G,    /* [n][H*D]  attention output gate, pre-sigmoid (muse) */
    FWD_O,    /* [n][H*D]  attention output */
    FWD_SUB,  /* [n][E]    a sublayer's output (o_proj or ffn_down), before its post-norm */
    FWD_FG,   /* [n][F]    ffn gate, then silu(gate) * up */
    FWD_FU,   /* [n][F]    ffn up */
    FWD_BUF_COUNT
} fwd_buf;

/* DECODE: the small-batch route (one row, or up to a pass's capacity of rows from any
 * sequences: packed decode, speculative verify); each row's arithmetic is independent of the
 * other rows of its pass (SPEC §4, row invariance). BATCH: the prefill route, GEMM-shaped, one
 * sequence's consecutive rows; its results meet the contract but may depend on the chunking. */
typedef enum fwd_route { FWD_ROUTE_DECODE = 0, FWD_ROUTE_BATCH = 1 } fwd_route;

/* The hidden-state tap: the residual stream after each listed layer, copied out per row (the
 * DFlash drafter of SPEC §5 reads it). */
typedef struct fwd_tap {
    uint32_t n_layers;
    const uint32_t *layers;  /* [n_layers] ascending layer ids */
    float *out;              /* [n rows][n_layers][E] f32 */
} fwd_tap;

typedef struct fwd_rows {
    uint32_t n;              /* rows in this pass (<= the backend's pass capacity) */
    const int32_t *tokens;   /* [n] */
    const uint64_t *pos;     /* [n] logical positions (consecutive within a sequence's rows) */
    const uint32_t *seq;     /* [n] the row's sequence, an index into the backend's table of the
                              * pass's sequences; NULL: every row is sequence 0 */
    const uint32_t *first;   /* [n] pass index of the first row of the row's sequence (a
                              * sequence's rows are one contiguous run); NULL: 0 */
    fwd_route route;
    const fwd_tap *tap;      /* NULL: no tap */
} fwd_rows;

static inline uint32_t fwd_seq(const fwd_rows *r, uint32_t i) { return r->seq ? r->seq[i] : 0; }
static inline uint32_t fwd_first(const fwd_rows *r, uint32_t i) { return r->first ? r->first[i] : 0; }

/* A matrix applied to one input buffer, writing one output buffer. */
typedef struct fwd_matmul {
    const muser_tensor *w;   /* [cols -> rows] */
    fwd_buf dst;
} fwd_matmul;

#define FWD_MAX_GROUP 4

typedef struct fwd_ops {
    /* FWD_H = token_embd[tokens]; then the weightless entry norm with eps when entry_norm. */
    void (*embed)(void *be, const fwd_rows *r, bool entry_norm, float eps);
    /* dst = rmsnorm(src, w, eps) per row. */
    void (*rmsnorm)(void *be, const fwd_rows *r, fwd_buf src, const muser_tensor *w, float eps,
                    fwd_buf dst);
    /* For each of n_mm matrices sharing the input src: mm[i].dst = src · mm[i].w^T. This is the
     * attention projection group (Q, K, V, gate) and the FFN pair (gate, up); also a single
     * matrix (o_proj, ffn_down). */
    void (*matmul)(void *be, const fwd_rows *r, fwd_buf src, const fwd_matmul *mm, uint32_t n_mm);
    /* Layer l: per-head rmsnorm of FWD_Q / FWD_K with q_norm / k_norm (when non-NULL), RoPE at
     * pos[] when rope (neox: pairs (i, i+D/2), else (2i, 2i+1)), then stage K and V. */
    void (*attn_stage)(void *be, const fwd_rows *r, uint32_t l, const muser_tensor *q_norm,
                       const muser_tensor *k_norm, float eps, bool rope, bool neox);
    /* Layer l: FWD_O = softmax(Q·K^T·scale over allowed positions)·V, over stored positions
     * plus the staged rows. window > 0: positions pos-window < j <= pos; 0: all j <= pos. */
    void (*attention)(void *be, const fwd_rows *r, uint32_t l, uint32_t window, float scale);
    /* FWD_O *= sigmoid(FWD_G). */
    void (*gate)(void *be, const fwd_rows *r);
    /* FWD_FG = silu(FWD_FG) * FWD_FU. */
    void (*swiglu)(void *be, const fwd_rows *r);
    /* The fused tail (SPEC §1), keeping the unfused rounding points:
     *   FWD_H += w_post ? rmsnorm(FWD_SUB, w_post, eps_post) : FWD_SUB   (stored f32)
     *   dst    = rmsnorm(FWD_H, w_next, eps_next)                          (from that f32) */
    void (*tail)(void *be, const fwd_rows *r, const muser_tensor *w_post, float eps_post,
                 const muser_tensor *w_next, float eps_next, fwd_buf dst);
    /* logits = cap·tanh((src·W^T)·scale/cap) (cap 0: no cap), for every row when all_rows, else
     * for the last row only; written to the backend's logits buffer. MUSER_E_NUMERIC (nothing
     * else changed) when a logit is not finite. */
    int (*lm_head)(void *be, const fwd_rows *r, fwd_buf src, const muser_tensor *w, float scale,
                   float cap, bool all_rows, muser_error *err);
    /* Append every layer's staged K/V rows to the cache (positions were validated up front). */
    int (*kv_append_staged)(void *be, const fwd_rows *r, muser_error *err);
    /* r->tap->out[i][slot] = FWD_H of row i (called after the tapped layer's last tail). */
    void (*tap)(void *be, const fwd_rows *r, uint32_t slot);
    /* Tensor parallel (tp.h): buf's n rows = their sum over the ranks, in rank order (after o_proj
     * and ffn_down, whose products are partial sums on a rank's shard). NULL: one rank. */
    void (*reduce)(void *be, const fwd_rows *r, fwd_buf buf);
} fwd_ops;

/* The forward pass of SPEC §1 (muse) and its llama / qwen3 variants over ops. want_logits:
 * 0 = none wanted (a prefill pass whose logits nobody reads: the last row is still computed into
 * the backend's scratch, because it is the non-finite check), 1 = last row, 2 = every row. On
 * success the pass's K/V are committed; on error (non-finite logits included) nothing is. */
int fwd_run(const fwd_ops *ops, void *be, const muser_model *m, const fwd_rows *r,
            int want_logits, muser_error *err);
/* fwd_run in parts: layers [l0, l1) of the pass, the embedding first when l0 is 0, the LM head and
 * the commit last when l1 is n_layer. Calls over [0, a), [a, b), ... [z, n_layer) with the same
 * rows are fwd_run exactly (the ops between layers carry nothing but the backend's buffers), so
 * a backend that keeps its pass's buffers between the calls may run other passes in between
 * (session.h: muser_session_prefill_begin). */
int fwd_run_layers(const fwd_ops *ops, void *be, const muser_model *m, const fwd_rows *r, uint32_t l0,
                   uint32_t l1, int want_logits, muser_error *err);

#endif
