/* model.h — architectures and tensor binding.
 *
 * A muser_model is a read-only view of an mmap'ed GGUF: hyper-parameters read from metadata and
 * one muser_tensor per weight, every one checked for existence, dims and a supported type before
 * anything runs. Sessions share a model. Supported: `muse` (Muse Glimmer, SPEC §1), `llama`,
 * `qwen3` (llama + QK-norm). */
#ifndef MUSER_MODEL_H
#define MUSER_MODEL_H

#include "gguf.h"
#include "muser.h"

typedef enum { MUSER_ARCH_MUSE = 0, MUSER_ARCH_LLAMA = 1, MUSER_ARCH_QWEN3 = 2 } muser_arch;

typedef struct muser_hparams {
    muser_arch arch;
    uint32_t n_layer;      /* 52 for Glimmer */
    uint32_t n_embd;       /* E */
    uint32_t n_ff;         /* F */
    uint32_t n_head;       /* H query heads */
    uint32_t n_head_kv;    /* HKV */
    uint32_t head_dim;     /* D */
    uint32_t n_vocab;      /* V */
    uint32_t n_ctx_train;  /* context_length */
    float rms_eps;         /* pre-norm eps, 1e-5 */
    float post_norm_eps;   /* sandwich post-norm eps, 1e-8 (muse) */
    uint32_t swa_window;   /* W; 0 = no sliding window (llama) */
    uint32_t swa_pattern;  /* layer l is FULL iff l % pattern == pattern-1 (muse: 4) */
    float rope_theta;
    uint32_t rope_dim;     /* rotated dims per head (= D) */
    float logit_scale;     /* 1 when absent */
    float final_softcap;   /* 0 = none */
    float attn_scale;      /* 1/sqrt(D) */
    /* Architecture features, derived from arch. */
    bool entry_norm;       /* weightless rmsnorm after the embedding (muse) */
    bool sandwich;         /* post_attention_norm / post_ffw_norm (muse) */
    bool attn_gate;        /* sigmoid output gate (muse) */
    bool qk_norm;          /* muse, qwen3 */
} muser_hparams;

/* Set the fields that follow from arch and head_dim: the architecture features (entry norm,
 * sandwich post-norms, attention gate, QK-norm) and attn_scale = 1/sqrt(D). The one place they
 * are decided: model binding and synth both call it. */
void muser_hparams_derive(muser_hparams *hp);

/* Layer l uses sliding-window attention with RoPE (muse) — otherwise FULL/NoPE for muse,
 * FULL with RoPE for llama/qwen3. */
static inline bool muser_layer_is_swa(const muser_hparams *hp, uint32_t l)
{
    return hp->arch == MUSER_ARCH_MUSE && hp->swa_window > 0 && hp->swa_pattern > 0 &&
           (l % hp->swa_pattern) != hp->swa_pattern - 1;
}
/* Whether layer l applies RoPE to q and k. */
static inline bool muser_layer_has_rope(const muser_hparams *hp, uint32_t l)
{
    return hp->arch != MUSER_ARCH_MUSE || muser_layer_is_swa(hp, l);
}

/* A weight as a matrix of `rows` rows of `cols` contiguous elements (cols = ggml ne0).
 * Vectors (norms) have rows = 1. data points into the map. */
typedef struct muser_tensor {
    const void *data;
    uint32_t type;         /* ggml type */
    uint64_t cols;         /* ne0: input dimension */
    uint64_t rows;         /* ne1: output dimension */
    uint64_t row_bytes;
    const char *name;      /* points at the gguf tensor's name_z */
} muser_tensor;

typedef struct muser_layer {
    muser_tensor attn_norm;           /* [E] f32 */
    muser_tensor attn_q;              /* [E -> H*D] */
    muser_tensor attn_k;              /* [E -> HKV*D] */
    muser_tensor attn_v;              /* [E -> HKV*D] */
    muser_tensor attn_gate;           /* [E -> H*D] muse only */
    muser_tensor attn_q_norm;         /* [D] muse/qwen3 */
    muser_tensor attn_k_norm;         /* [D] muse/qwen3 */
    muser_tensor attn_output;         /* [H*D -> E] */
    muser_tensor post_attention_norm; /* [E] muse only */
    muser_tensor ffn_norm;            /* [E] */
    muser_tensor ffn_gate;            /* [E -> F] */
    muser_tensor ffn_up;              /* [E -> F] */
    muser_tensor ffn_down;            /* [F -> E] */
    muser_tensor post_ffw_norm;       /* [E] muse only */
} muser_layer;

typedef struct muser_model {
    gguf_file *gguf;       /* owned */
    muser_hparams hp;
    muser_tensor tok_embd; /* [E] x V rows */
    muser_tensor output_norm;
    muser_tensor output;   /* [E -> V]; == tok_embd when tied (llama without output.weight) */
    muser_layer *layers;   /* [n_layer] */
    uint64_t weight_bytes; /* sum of all tensor bytes */
} muser_model;

/* Open, map and bind. On error nothing is leaked and *out is NULL. */
int muser_model_load(muser_model **out, const char *path, muser_error *err);
/* Bind an already-open file; takes ownership of f on success only. */
int muser_model_bind(muser_model **out, gguf_file *f, muser_error *err);
void muser_model_free(muser_model *m);
/* Bind f's tensor `name` as a matrix [ne0 -> ne1] (ne1 0: a vector, which must be f32), checking
 * that it exists, its dims, a supported type and its byte size; the error names file and tensor. */
int muser_tensor_bind(const gguf_file *f, const char *name, uint64_t ne0, uint64_t ne1, muser_tensor *out,
                      muser_error *err);
const char *muser_arch_name(muser_arch a);

/* Row r of a matrix tensor, and dequantize it into dst[cols]. */
static inline const void *muser_tensor_row(const muser_tensor *t, uint64_t r)
{
    return (const uint8_t *)t->data + r * t->row_bytes;
}

#endif
