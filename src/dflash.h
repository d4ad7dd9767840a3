/* dflash.h — the DFlash block drafter (SPEC §5; docs/dflash.md): its GGUF binding, the check that
 * it was trained for the target at hand, and its forward pass on three backends (the CPU engine,
 * the GPU beside a target there, and the f64 oracle).
 *
 * A DFlash drafter is a few decoder layers of the target's width that read the target's hidden
 * states. For every position j of the sequence the target's residual after each of the drafter's
 * target layers is concatenated, projected back to the width and normed:
 *     u_j = rmsnorm(fc · [h_l1(j); ...; h_lm(j)], hidden_norm, eps)                  [E]
 * and in every drafter layer u_j contributes a key and a value (per-head k-norm, RoPE at j),
 * computed once and kept across rounds. A round drafts one block of B rows at positions p..p+B-1
 * (p: the position of the last verified token t0): row 0 is the target's embedding of t0, rows
 * 1..B-1 the drafter's mask vector. Each layer (pre-norm, per-head q/k norms, RoPE, SwiGLU, plain
 * residual adds) takes queries from the block only and attends, without a causal mask, over the
 * context keys of positions < p followed by the block's own keys. The drafter's final norm feeds
 * the target's LM head (its logit scale and soft cap too), and the argmax of rows 1..B-1 are the
 * B-1 drafts. The target's embedding and LM head are shared, not copied into the drafter's file. */
#ifndef MUSER_DFLASH_H
#define MUSER_DFLASH_H

#include "model.h"

#define MUSER_DFLASH_ARCH "dflash"
#define MUSER_DFLASH_MAX_TAP 8     /* target layers a drafter reads at most */
#define MUSER_DFLASH_MAX_BLOCK 16  /* a block is at most a verify block (KV_MAX_SPEC_ROWS) */

typedef struct muser_dflash_hparams {
    uint32_t n_layer;          /* drafter layers */
    uint32_t n_embd;           /* E, the target's */
    uint32_t n_ff;             /* F */
    uint32_t n_head, n_head_kv, head_dim;
    uint32_t block_size;       /* B, 2..16: the row of t0 plus B-1 mask rows */
    uint32_t n_tap;            /* target layers read, 1..8 */
    uint32_t tap_layers[MUSER_DFLASH_MAX_TAP]; /* ascending target layer ids */
    float rms_eps;
    float rope_theta;          /* NORM pairing (x[2i], x[2i+1]) on every layer */
    float attn_scale;          /* 1/sqrt(D) */
    /* the target it was trained for */
    uint32_t target_vocab, target_n_layer;
    char target_fingerprint[65];
} muser_dflash_hparams;

typedef struct muser_dflash_layer {
    muser_tensor attn_norm;    /* [E] f32 */
    muser_tensor attn_q;       /* [E -> H*D] */
    muser_tensor attn_k;       /* [E -> HKV*D] */
    muser_tensor attn_v;       /* [E -> HKV*D] */
    muser_tensor attn_q_norm;  /* [D] f32 */
    muser_tensor attn_k_norm;  /* [D] f32 */
    muser_tensor attn_output;  /* [H*D -> E] */
    muser_tensor ffn_norm;     /* [E] f32 */
    muser_tensor ffn_gate;     /* [E -> F] */
    muser_tensor ffn_up;       /* [E -> F] */
    muser_tensor ffn_down;     /* [F -> E] */
} muser_dflash_layer;

typedef struct muser_dflash {
    gguf_file *gguf;           /* owned */
    muser_dflash_hparams hp;
    const muser_model *target; /* borrowed: its token_embd and LM head; must outlive the drafter */
    muser_tensor fc;           /* [n_tap*E -> E] */
    muser_tensor hidden_norm;  /* [E] f32 */
    muser_tensor mask_embd;    /* [E] f32: rows 1..B-1 of a block */
    muser_dflash_layer *layers;/* [n_layer] */
    muser_tensor output_norm;  /* [E] f32 */
} muser_dflash;

/* The target identity a drafter records (docs/dflash.md): SHA-256, as 64 hex digits, over the
 * target GGUF's tensor directory in file order (name, type, dims, size) and, per tensor, its first
 * and last 4096 data bytes (all of them when it has at most 8192). */
int muser_dflash_fingerprint(const muser_model *target, char hex[65], muser_error *err);

/* Open, map and bind a drafter for target. Refused, naming the file and what mismatched, when it
 * is not a DFlash drafter, was trained for another target (vocabulary, layer count, width,
 * fingerprint), or any key or tensor is missing, malformed or out of range. On error nothing is
 * leaked and *out is NULL. */
int muser_dflash_load(muser_dflash **out, const char *path, const muser_model *target, muser_error *err);
/* Bind an open file; takes ownership of f on success only. */
int muser_dflash_bind(muser_dflash **out, gguf_file *f, const muser_model *target, muser_error *err);
void muser_dflash_free(muser_dflash *d);

/* ---- running it ----
 * A run is one sequence's drafter state: the context keys and values of positions [0, held) and
 * one block's workspace, sized at creation (n_ctx positions); nothing is allocated per round. Three
 * kinds: MUSER_DFLASH_CPU (f32, the CPU engine's kernels), MUSER_DFLASH_CUDA (f32 on the GPU:
 * src/cuda/dflash.cu; MUSER_E_UNSUPPORTED in a build without CUDA) and MUSER_DFLASH_ORACLE (f64,
 * dumb on purpose, the judge of SPEC §4). */
typedef enum { MUSER_DFLASH_CPU = 0, MUSER_DFLASH_ORACLE = 1, MUSER_DFLASH_CUDA = 2 } muser_dflash_kind;

typedef struct muser_dflash_run muser_dflash_run;

int muser_dflash_run_new(muser_dflash_run **out, const muser_dflash *d, muser_dflash_kind kind, uint64_t n_ctx,
                         muser_error *err);
void muser_dflash_run_free(muser_dflash_run *r);
/* Context positions held: [0, held). */
uint64_t muser_dflash_run_held(const muser_dflash_run *r);
/* Forget positions >= pos0 (pos0 <= held), then take n positions from pos0 on: feats [n][n_tap][E],
 * the target's tapped residuals (muser_tap's layout). Refused, changing nothing, past the context
 * or with pos0 > held. */
int muser_dflash_run_context(muser_dflash_run *r, uint64_t pos0, const float *feats, uint32_t n,
                             muser_error *err);
/* One block after the held context, t0 at position held: logits [n_out][V] of rows 1..n_out
 * (1 <= n_out <= B-1; the target LM head's, scale and soft cap applied). The whole block runs
 * through the layers whatever n_out (its rows attend to each other); only the LM head is spared
 * for rows past n_out, so a row's logits do not depend on n_out. MUSER_E_NUMERIC when one is not
 * finite; MUSER_E_CONTEXT_FULL when the block would pass the context. */
int muser_dflash_run_block(muser_dflash_run *r, int32_t t0, uint32_t n_out, float *logits, muser_error *err);
/* The same block's drafts: the argmax of each of rows 1..n_out (the first of equal maxima), exactly
 * the argmax of muser_dflash_run_block's logits, without bringing the logits back where the backend
 * can take it on the device. The same refusals and errors. */
int muser_dflash_run_draft(muser_dflash_run *r, int32_t t0, uint32_t n_out, int32_t *tokens, muser_error *err);
/* Whether muser_dflash_run_context returns before its work is done (the GPU's: it is queued behind
 * nothing the host waits for, and the next block waits for it). A caller can then hand it rows early,
 * while the host does other work, and cut them back later (a context call with n = 0). */
bool muser_dflash_run_async(const muser_dflash_run *r);

/* Backend entry points (src/cpu/dflash.c, src/cuda/dflash.cu, src/dflash_ref.c); muser_dflash_run_*
 * dispatch to them. */
typedef struct muser_dflash_impl {
    int (*init)(muser_dflash_run *r, muser_error *err);
    void (*free)(muser_dflash_run *r);
    /* take positions [pos0, pos0 + n) (dflash.c checked them: pos0 <= held, within the context) */
    int (*context)(muser_dflash_run *r, uint64_t pos0, const float *feats, uint32_t n, muser_error *err);
    int (*block)(muser_dflash_run *r, int32_t t0, uint32_t n_out, float *logits, muser_error *err);
    /* the argmax of rows 1..n_out on the backend (NULL: dflash.c takes it of block's logits) */
    int (*draft)(muser_dflash_run *r, int32_t t0, uint32_t n_out, int32_t *tokens, muser_error *err);
    bool async;      /* context returns before its work is done (muser_dflash_run_async) */
} muser_dflash_impl;

struct muser_dflash_run {
    const muser_dflash *d;
    const muser_dflash_impl *impl;
    uint64_t n_ctx;
    uint64_t held;
    void *state;
    float *scratch;  /* [B-1][V] block logits for muser_dflash_run_draft where the backend has no draft */
};

const muser_dflash_impl *muser_dflash_impl_cpu(void);
const muser_dflash_impl *muser_dflash_impl_oracle(void);
#ifdef MUSER_HAVE_CUDA
const muser_dflash_impl *muser_dflash_impl_cuda(void);
#endif

#endif
