/* model.c — architectures and tensor binding: turn an open GGUF into a muser_model.
 *
 * Two steps, both strict, so nothing downstream ever meets a surprise:
 *   1. hparams_read: the hyper-parameters from `<arch>.*` metadata (SPEC §1 table for `muse`,
 *      the usual llama.cpp keys for `llama` / `qwen3`), every value range-checked;
 *   2. bind: every tensor the architecture needs, checked for existence, exact dims
 *      (ne0 = input dimension, ne1 = output dimension), a type muser computes with (norms F32)
 *      and a byte size that matches.
 * Errors name the file and the key or tensor at fault. Tensor data is never copied: a
 * muser_tensor points into the map owned by the gguf_file. */
#include "model.h"

#include "quant.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Bounds that catch garbage metadata long before an allocation would (no real model is near). */
#define MODEL_MAX_LAYERS 4096u
#define MODEL_MAX_DIM (1u << 20)       /* E, F, H*D */
#define MODEL_MAX_HEADS 4096u
#define MODEL_MAX_HEAD_DIM 4096u
#define MODEL_MAX_VOCAB (1u << 24)

/* muse files may omit attention.post_norm_epsilon; SPEC §1 fixes it at 1e-8. */
#define MUSE_DEFAULT_POST_NORM_EPS 1e-8f
#define MUSE_DEFAULT_SWA_PATTERN 4u
#define LLAMA_DEFAULT_ROPE_THETA 10000.0f

void muser_hparams_derive(muser_hparams *hp)
{
    const bool muse = hp->arch == MUSER_ARCH_MUSE;
    hp->entry_norm = hp->sandwich = hp->attn_gate = muse;
    hp->qk_norm = muse || hp->arch == MUSER_ARCH_QWEN3;
    hp->attn_scale = hp->head_dim ? 1.0f / sqrtf((float)hp->head_dim) : 0.0f;
}

const char *muser_arch_name(muser_arch a)
{
    switch (a) {
    case MUSER_ARCH_MUSE: return "muse";
    case MUSER_ARCH_LLAMA: return "llama";
    case MUSER_ARCH_QWEN3: return "qwen3";
    }
    return "unknown";
}

/* ---- hyper-parameters ---- */

/* "<arch>.<suffix>" into buf. */
static const char *arch_key(char *buf, size_t n, muser_arch a, const char *suffix)
{
    snprintf(buf, n, "%s.%s", muser_arch_name(a), suffix);
    return buf;
}

static int get_u32_req(const gguf_file *f, muser_arch a, const char *suffix, uint32_t *out,
                       muser_error *err)
{
    char key[128];
    return gguf_get_u32(f, arch_key(key, sizeof key, a, suffix), out, err);
}

/* Optional u32: absent -> *present = false and *out untouched; present but malformed -> error. */
static int get_u32_opt(const gguf_file *f, muser_arch a, const char *suffix, uint32_t *out,
                       bool *present, muser_error *err)
{
    char key[128];
    arch_key(key, sizeof key, a, suffix);
    *present = gguf_find_kv(f, key) != NULL;
    return *present ? gguf_get_u32(f, key, out, err) : MUSER_OK;
}

static int get_f32_opt(const gguf_file *f, muser_arch a, const char *suffix, float *out,
                       bool *present, muser_error *err)
{
    char key[128];
    arch_key(key, sizeof key, a, suffix);
    *present = gguf_find_kv(f, key) != NULL;
    return *present ? gguf_get_f32(f, key, out, err) : MUSER_OK;
}

/* Report a range violation of `<arch>.<suffix>` = value. */
static int hparam_error(muser_error *err, const gguf_file *f, muser_arch a, const char *suffix,
                        double value, const char *why)
{
    char key[128];
    return muser_errorf(err, MUSER_E_FORMAT, "%s: %s = %g: %s", f->path,
                        arch_key(key, sizeof key, a, suffix), value, why);
}

static int read_arch(const gguf_file *f, muser_arch *out, muser_error *err)
{
    gguf_str s;
    int rc = gguf_get_str(f, "general.architecture", &s, err);
    if (rc)
        return rc;
    if (gguf_str_eq(s, "muse"))
        *out = MUSER_ARCH_MUSE;
    else if (gguf_str_eq(s, "llama"))
        *out = MUSER_ARCH_LLAMA;
    else if (gguf_str_eq(s, "qwen3"))
        *out = MUSER_ARCH_QWEN3;
    else if (gguf_str_eq(s, "dflash"))
        return muser_errorf(err, MUSER_E_UNSUPPORTED,
                            "%s: a DFlash drafter (general.architecture 'dflash'), not a model: it drafts "
                            "for its target (muser run --draft-dflash)",
                            f->path);
    else
        return muser_errorf(err, MUSER_E_UNSUPPORTED,
                            "%s: general.architecture = '%.*s': unsupported (muse, llama, qwen3)",
                            f->path, (int)(s.len > 64 ? 64 : s.len), s.ptr);
    return MUSER_OK;
}

/* n_vocab: `<arch>.vocab_size`, else the tokenizer's token count, else token_embd's rows. */
static int read_vocab(const gguf_file *f, muser_arch a, uint32_t *out, muser_error *err)
{
    bool present;
    int rc = get_u32_opt(f, a, "vocab_size", out, &present, err);
    if (rc || present)
        return rc;
    const gguf_kv *tok = gguf_find_kv(f, "tokenizer.ggml.tokens");
    if (tok && tok->type == GGUF_TYPE_ARRAY) {
        if (tok->arr_n > MODEL_MAX_VOCAB)
            return muser_errorf(err, MUSER_E_FORMAT, "%s: tokenizer.ggml.tokens: %llu tokens",
                                f->path, (unsigned long long)tok->arr_n);
        *out = (uint32_t)tok->arr_n;
        return MUSER_OK;
    }
    const gguf_tensor *te = gguf_find_tensor(f, "token_embd.weight");
    if (te && te->ne[1] <= MODEL_MAX_VOCAB) {
        *out = (uint32_t)te->ne[1];
        return MUSER_OK;
    }
    char key[128];
    return muser_errorf(err, MUSER_E_SHAPE,
                        "%s: missing key %s (and no tokenizer.ggml.tokens or token_embd.weight)",
                        f->path, arch_key(key, sizeof key, a, "vocab_size"));
}

static bool finite_pos(float x) { return isfinite(x) && x > 0.0f; }

static int hparams_read(const gguf_file *f, muser_hparams *hp, muser_error *err)
{
    memset(hp, 0, sizeof *hp);
    int rc = read_arch(f, &hp->arch, err);
    if (rc)
        return rc;
    const muser_arch a = hp->arch;
    bool present;

    if ((rc = get_u32_req(f, a, "block_count", &hp->n_layer, err)) ||
        (rc = get_u32_req(f, a, "embedding_length", &hp->n_embd, err)) ||
        (rc = get_u32_req(f, a, "feed_forward_length", &hp->n_ff, err)) ||
        (rc = get_u32_req(f, a, "attention.head_count", &hp->n_head, err)) ||
        (rc = get_u32_req(f, a, "context_length", &hp->n_ctx_train, err)))
        return rc;
    if (hp->n_layer == 0 || hp->n_layer > MODEL_MAX_LAYERS)
        return hparam_error(err, f, a, "block_count", hp->n_layer, "must be in 1..4096");
    if (hp->n_embd == 0 || hp->n_embd > MODEL_MAX_DIM)
        return hparam_error(err, f, a, "embedding_length", hp->n_embd, "must be in 1..2^20");
    if (hp->n_ff == 0 || hp->n_ff > MODEL_MAX_DIM)
        return hparam_error(err, f, a, "feed_forward_length", hp->n_ff, "must be in 1..2^20");
    if (hp->n_head == 0 || hp->n_head > MODEL_MAX_HEADS)
        return hparam_error(err, f, a, "attention.head_count", hp->n_head, "must be in 1..4096");
    if (hp->n_ctx_train == 0)
        return hparam_error(err, f, a, "context_length", 0, "must be positive");

    hp->n_head_kv = hp->n_head; /* absent: plain multi-head attention */
    if ((rc = get_u32_opt(f, a, "attention.head_count_kv", &hp->n_head_kv, &present, err)))
        return rc;
    if (hp->n_head_kv == 0 || hp->n_head % hp->n_head_kv != 0)
        return hparam_error(err, f, a, "attention.head_count_kv", hp->n_head_kv,
                            "must be positive and divide attention.head_count");

    /* D: key_length when present, else E/H. */
    if ((rc = get_u32_opt(f, a, "attention.key_length", &hp->head_dim, &present, err)))
        return rc;
    if (!present) {
        if (hp->n_embd % hp->n_head != 0)
            return hparam_error(err, f, a, "embedding_length", hp->n_embd,
                                "not a multiple of attention.head_count and no "
                                "attention.key_length given");
        hp->head_dim = hp->n_embd / hp->n_head;
    }
    if (hp->head_dim == 0 || hp->head_dim % 2 != 0 || hp->head_dim > MODEL_MAX_HEAD_DIM)
        return hparam_error(err, f, a, "attention.key_length", hp->head_dim,
                            "head dim must be even and in 2..4096");
    if ((uint64_t)hp->n_head * hp->head_dim > MODEL_MAX_DIM)
        return hparam_error(err, f, a, "attention.key_length", hp->head_dim,
                            "head_count x key_length exceeds 2^20");
    uint32_t v_len;
    if ((rc = get_u32_opt(f, a, "attention.value_length", &v_len, &present, err)))
        return rc;
    if (present && v_len != hp->head_dim)
        return hparam_error(err, f, a, "attention.value_length", v_len,
                            "must equal the key length (head dim)");

    if ((rc = read_vocab(f, a, &hp->n_vocab, err)))
        return rc;
    if (hp->n_vocab == 0 || hp->n_vocab > MODEL_MAX_VOCAB)
        return hparam_error(err, f, a, "vocab_size", hp->n_vocab, "must be in 1..2^24");

    char key[128];
    if ((rc = gguf_get_f32(f, arch_key(key, sizeof key, a, "attention.layer_norm_rms_epsilon"),
                           &hp->rms_eps, err)))
        return rc;
    if (!finite_pos(hp->rms_eps) || hp->rms_eps > 1.0f)
        return hparam_error(err, f, a, "attention.layer_norm_rms_epsilon", hp->rms_eps,
                            "must be in (0, 1]");

    /* RoPE: muse states theta explicitly (SPEC §1); llama-family files default to 10000. */
    hp->rope_theta = LLAMA_DEFAULT_ROPE_THETA;
    if (a == MUSER_ARCH_MUSE)
        rc = gguf_get_f32(f, arch_key(key, sizeof key, a, "rope.freq_base"), &hp->rope_theta,
                          err);
    else
        rc = get_f32_opt(f, a, "rope.freq_base", &hp->rope_theta, &present, err);
    if (rc)
        return rc;
    if (!finite_pos(hp->rope_theta))
        return hparam_error(err, f, a, "rope.freq_base", hp->rope_theta, "must be positive");
    hp->rope_dim = hp->head_dim;
    if ((rc = get_u32_opt(f, a, "rope.dimension_count", &hp->rope_dim, &present, err)))
        return rc;
    if (hp->rope_dim != hp->head_dim)
        return hparam_error(err, f, a, "rope.dimension_count", hp->rope_dim,
                            "partial rotary embedding is not supported (must equal head dim)");

    hp->logit_scale = 1.0f;
    if ((rc = get_f32_opt(f, a, "logit_scale", &hp->logit_scale, &present, err)))
        return rc;
    if (!finite_pos(hp->logit_scale))
        return hparam_error(err, f, a, "logit_scale", hp->logit_scale, "must be positive");
    hp->final_softcap = 0.0f;
    if ((rc = get_f32_opt(f, a, "final_logit_softcapping", &hp->final_softcap, &present, err)))
        return rc;
    if (!isfinite(hp->final_softcap) || hp->final_softcap < 0.0f)
        return hparam_error(err, f, a, "final_logit_softcapping", hp->final_softcap,
                            "must be >= 0 (0 = none)");

    muser_hparams_derive(hp);
    hp->post_norm_eps = 0.0f;
    if (a == MUSER_ARCH_MUSE) {
        if ((rc = get_u32_req(f, a, "attention.sliding_window", &hp->swa_window, err)))
            return rc;
        /* Every session sizes a ring of W rows per SWA layer: a window wider than the
         * context is meaningless, and a hostile one (2^32-1) would ask for gigabytes. */
        if (hp->swa_window == 0 || hp->swa_window > hp->n_ctx_train)
            return hparam_error(err, f, a, "attention.sliding_window", hp->swa_window,
                                "must be in 1..context_length");
        hp->swa_pattern = MUSE_DEFAULT_SWA_PATTERN;
        if ((rc = get_u32_opt(f, a, "attention.sliding_window_pattern", &hp->swa_pattern,
                              &present, err)))
            return rc;
        if (hp->swa_pattern == 0 || hp->swa_pattern > MODEL_MAX_LAYERS)
            return hparam_error(err, f, a, "attention.sliding_window_pattern", hp->swa_pattern,
                                "must be in 1..4096 (1 = every layer FULL)");
        hp->post_norm_eps = MUSE_DEFAULT_POST_NORM_EPS;
        if ((rc = get_f32_opt(f, a, "attention.post_norm_epsilon", &hp->post_norm_eps, &present,
                              err)))
            return rc;
        if (!finite_pos(hp->post_norm_eps) || hp->post_norm_eps > 1.0f)
            return hparam_error(err, f, a, "attention.post_norm_epsilon", hp->post_norm_eps,
                                "must be in (0, 1]");
    }
    return MUSER_OK;
}

/* ---- tensor binding ---- */

/* Bind `name` with expected ne0 x ne1 (ne1 == 0: a vector [ne0], which must be F32). */
int muser_tensor_bind(const gguf_file *f, const char *name, uint64_t ne0, uint64_t ne1,
                      muser_tensor *out, muser_error *err)
{
    const gguf_tensor *t = gguf_find_tensor(f, name);
    if (!t)
        return muser_errorf(err, MUSER_E_SHAPE, "%s: %s: missing tensor", f->path, name);
    const bool vec = ne1 == 0;
    const uint64_t want1 = vec ? 1 : ne1;
    bool dims_ok = t->ne[0] == ne0 && t->ne[1] == want1 && t->ne[2] == 1 && t->ne[3] == 1 &&
                   t->n_dims >= 1 && t->n_dims <= (vec ? 1u : 2u);
    if (!dims_ok) {
        char got[96], want[64];
        int n = snprintf(got, sizeof got, "[%llu", (unsigned long long)t->ne[0]);
        for (uint32_t d = 1; d < t->n_dims && d < GGUF_MAX_DIMS && n > 0 && n < (int)sizeof got;
             d++)
            n += snprintf(got + n, sizeof got - (size_t)n, ", %llu",
                          (unsigned long long)t->ne[d]);
        if (n > 0 && n < (int)sizeof got)
            snprintf(got + n, sizeof got - (size_t)n, "]");
        if (vec)
            snprintf(want, sizeof want, "[%llu]", (unsigned long long)ne0);
        else
            snprintf(want, sizeof want, "[%llu, %llu]", (unsigned long long)ne0,
                     (unsigned long long)ne1);
        return muser_errorf(err, MUSER_E_SHAPE, "%s: %s: dims %s, expected %s", f->path, name,
                            got, want);
    }
    const quant_type_info *qi = quant_info(t->type);
    if (!qi)
        return muser_errorf(err, MUSER_E_UNSUPPORTED, "%s: %s: unknown ggml type %u", f->path,
                            name, t->type);
    if (!qi->supported)
        return muser_errorf(err, MUSER_E_UNSUPPORTED,
                            "%s: %s: type %s is not supported (f32, f16, bf16, q8_0, q4_k, q6_k)",
                            f->path, name, qi->name);
    if (vec && t->type != GGML_TYPE_F32)
        return muser_errorf(err, MUSER_E_UNSUPPORTED, "%s: %s: norm weight is %s, must be f32",
                            f->path, name, qi->name);
    if (ne0 % qi->block_elems != 0)
        return muser_errorf(err, MUSER_E_SHAPE,
                            "%s: %s: row of %llu elements is not a multiple of the %s block (%u)",
                            f->path, name, (unsigned long long)ne0, qi->name, qi->block_elems);
    uint64_t row_bytes = quant_row_bytes(t->type, ne0);
    if (row_bytes == 0 || t->nbytes != row_bytes * want1 || !t->data)
        return muser_errorf(err, MUSER_E_FORMAT,
                            "%s: %s: %llu bytes of data, expected %llu (%llu rows of %llu)",
                            f->path, name, (unsigned long long)t->nbytes,
                            (unsigned long long)(row_bytes * want1), (unsigned long long)want1,
                            (unsigned long long)row_bytes);
    out->data = t->data;
    out->type = t->type;
    out->cols = ne0;
    out->rows = want1;
    out->row_bytes = row_bytes;
    out->name = t->name_z;
    return MUSER_OK;
}

static uint64_t tensor_bytes(const muser_tensor *t) { return t->data ? t->row_bytes * t->rows : 0; }

static int bind_layer(const gguf_file *f, const muser_hparams *hp, uint32_t l, muser_layer *L,
                      muser_error *err)
{
    const uint64_t E = hp->n_embd, F = hp->n_ff, D = hp->head_dim;
    const uint64_t QD = (uint64_t)hp->n_head * D, KVD = (uint64_t)hp->n_head_kv * D;
    char name[128];
    int rc;
#define BIND(field, suffix, ne0, ne1)                                                          \
    do {                                                                                       \
        snprintf(name, sizeof name, "blk.%u." suffix ".weight", l);                           \
        if ((rc = muser_tensor_bind(f, name, (ne0), (ne1), &L->field, err)))                         \
            return rc;                                                                         \
    } while (0)
    BIND(attn_norm, "attn_norm", E, 0);
    BIND(attn_q, "attn_q", E, QD);
    BIND(attn_k, "attn_k", E, KVD);
    BIND(attn_v, "attn_v", E, KVD);
    if (hp->attn_gate)
        BIND(attn_gate, "attn_gate", E, QD);
    if (hp->qk_norm) {
        BIND(attn_q_norm, "attn_q_norm", D, 0);
        BIND(attn_k_norm, "attn_k_norm", D, 0);
    }
    BIND(attn_output, "attn_output", QD, E);
    if (hp->sandwich)
        BIND(post_attention_norm, "post_attention_norm", E, 0);
    BIND(ffn_norm, "ffn_norm", E, 0);
    BIND(ffn_gate, "ffn_gate", E, F);
    BIND(ffn_up, "ffn_up", E, F);
    BIND(ffn_down, "ffn_down", F, E);
    if (hp->sandwich)
        BIND(post_ffw_norm, "post_ffw_norm", E, 0);
#undef BIND
    return MUSER_OK;
}

static uint64_t layer_bytes(const muser_layer *L)
{
    const muser_tensor *all[] = {&L->attn_norm,   &L->attn_q,      &L->attn_k,
                                 &L->attn_v,      &L->attn_gate,   &L->attn_q_norm,
                                 &L->attn_k_norm, &L->attn_output, &L->post_attention_norm,
                                 &L->ffn_norm,    &L->ffn_gate,    &L->ffn_up,
                                 &L->ffn_down,    &L->post_ffw_norm};
    uint64_t sum = 0;
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        sum += tensor_bytes(all[i]);
    return sum;
}

int muser_model_bind(muser_model **out, gguf_file *f, muser_error *err)
{
    if (!out || !f)
        return muser_errorf(err, MUSER_E_ARG, "muser_model_bind: NULL argument");
    *out = NULL;
    muser_model *m = calloc(1, sizeof *m);
    if (!m)
        return muser_errorf(err, MUSER_E_NOMEM, "%s: out of memory for the model", f->path);
    int rc = hparams_read(f, &m->hp, err);
    if (rc)
        goto fail;
    const muser_hparams *hp = &m->hp;
    m->layers = calloc(hp->n_layer, sizeof *m->layers);
    if (!m->layers) {
        rc = muser_errorf(err, MUSER_E_NOMEM, "%s: out of memory for %u layers", f->path,
                          hp->n_layer);
        goto fail;
    }
    if ((rc = muser_tensor_bind(f, "token_embd.weight", hp->n_embd, hp->n_vocab, &m->tok_embd, err)) ||
        (rc = muser_tensor_bind(f, "output_norm.weight", hp->n_embd, 0, &m->output_norm, err)))
        goto fail;
    /* output.weight is required for muse (SPEC §1); llama/qwen3 files may tie it to the
     * embedding by leaving it out. */
    if (hp->arch == MUSER_ARCH_MUSE || gguf_find_tensor(f, "output.weight")) {
        if ((rc = muser_tensor_bind(f, "output.weight", hp->n_embd, hp->n_vocab, &m->output, err)))
            goto fail;
    } else {
        m->output = m->tok_embd;
    }
    for (uint32_t l = 0; l < hp->n_layer; l++)
        if ((rc = bind_layer(f, hp, l, &m->layers[l], err)))
            goto fail;

    m->weight_bytes = tensor_bytes(&m->tok_embd) + tensor_bytes(&m->output_norm);
    if (m->output.data != m->tok_embd.data)
        m->weight_bytes += tensor_bytes(&m->output);
    for (uint32_t l = 0; l < hp->n_layer; l++)
        m->weight_bytes += layer_bytes(&m->layers[l]);
    m->gguf = f;
    *out = m;
    return MUSER_OK;
fail:
    free(m->layers);
    free(m);
    return rc;
}

int muser_model_load(muser_model **out, const char *path, muser_error *err)
{
    if (!out || !path)
        return muser_errorf(err, MUSER_E_ARG, "muser_model_load: NULL argument");
    *out = NULL;
    gguf_file *f = NULL;
    int rc = gguf_open(&f, path, err);
    if (rc)
        return rc;
    rc = muser_model_bind(out, f, err);
    if (rc)
        gguf_close(f);
    return rc;
}

void muser_model_free(muser_model *m)
{
    if (!m)
        return;
    gguf_close(m->gguf);
    free(m->layers);
    free(m);
}
