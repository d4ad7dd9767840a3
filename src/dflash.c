/* dflash.c — the DFlash drafter's file format (docs/dflash.md): hyper-parameters from `dflash.*`
 * metadata, the target check, tensor binding, and the run dispatch to a backend.
 *
 * The target check comes first, so a drafter made for another model is refused for that reason
 * and not for a dim it happens to disagree on: the vocabulary, the target's layer count and width,
 * then the fingerprint (muser_dflash_fingerprint). A drafter reads one target's hidden states; with
 * any other it would draft noise, which costs speed, never correctness, so this is a usability
 * check, and it is strict because noise would be silent. */
#include "dflash.h"

#include "quant.h"
#include "util.h"

#include <math.h>
#include <openssl/evp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define DFLASH_MAX_LAYERS 64u
#define DFLASH_MAX_DIM (1u << 20)
#define DFLASH_MAX_HEADS 1024u
#define DFLASH_MAX_HEAD_DIM 1024u
#define DFLASH_FP_EDGE 4096u /* fingerprint bytes taken from each end of a tensor's data */

/* ---- the target fingerprint ---- */

static void put_le(EVP_MD_CTX *md, uint64_t v, int bytes)
{
    uint8_t b[8];
    for (int i = 0; i < bytes; i++)
        b[i] = (uint8_t)(v >> (8 * i));
    EVP_DigestUpdate(md, b, (size_t)bytes);
}

int muser_dflash_fingerprint(const muser_model *target, char hex[65], muser_error *err)
{
    const gguf_file *f = target->gguf;
    EVP_MD_CTX *md = EVP_MD_CTX_new();
    if (!md || EVP_DigestInit_ex(md, EVP_sha256(), NULL) != 1) {
        EVP_MD_CTX_free(md);
        return muser_errorf(err, MUSER_E_NOMEM, "dflash: cannot start a SHA-256");
    }
    static const uint8_t zero = 0;
    for (uint64_t i = 0; i < f->n_tensors; i++) {
        const gguf_tensor *t = &f->tensors[i];
        EVP_DigestUpdate(md, t->name.ptr, t->name.len);
        EVP_DigestUpdate(md, &zero, 1);
        put_le(md, t->type, 4);
        put_le(md, t->n_dims, 4);
        for (uint32_t d = 0; d < t->n_dims; d++)
            put_le(md, t->ne[d], 8);
        put_le(md, t->nbytes, 8);
        const uint8_t *p = t->data;
        if (t->nbytes <= 2 * DFLASH_FP_EDGE) {
            EVP_DigestUpdate(md, p, t->nbytes);
        } else {
            EVP_DigestUpdate(md, p, DFLASH_FP_EDGE);
            EVP_DigestUpdate(md, p + t->nbytes - DFLASH_FP_EDGE, DFLASH_FP_EDGE);
        }
    }
    unsigned char d[32];
    unsigned int len = 0;
    EVP_DigestFinal_ex(md, d, &len);
    EVP_MD_CTX_free(md);
    for (int i = 0; i < 32; i++)
        snprintf(hex + 2 * i, 3, "%02x", d[i]);
    return MUSER_OK;
}

/* ---- hyper-parameters ---- */

static int get_dim(const gguf_file *f, const char *key, uint32_t lo, uint32_t hi, uint32_t *out, muser_error *err)
{
    int rc = gguf_get_u32(f, key, out, err);
    if (rc)
        return rc;
    if (*out < lo || *out > hi)
        return muser_errorf(err, MUSER_E_FORMAT, "%s: %s = %u is out of range (%u..%u)", f->path, key, *out, lo,
                            hi);
    return MUSER_OK;
}

static int get_pos_f32(const gguf_file *f, const char *key, float *out, muser_error *err)
{
    int rc = gguf_get_f32(f, key, out, err);
    if (rc)
        return rc;
    if (!(*out > 0.0f) || !isfinite(*out))
        return muser_errorf(err, MUSER_E_FORMAT, "%s: %s = %g must be positive and finite", f->path, key,
                            (double)*out);
    return MUSER_OK;
}

/* The target checks: the file must say which target it was trained for, and it must be this one. */
static int read_target(const gguf_file *f, const muser_model *t, muser_dflash_hparams *hp, muser_error *err)
{
    int rc = gguf_get_u32(f, "dflash.target.vocab_size", &hp->target_vocab, err);
    if (!rc && hp->target_vocab != t->hp.n_vocab)
        rc = muser_errorf(err, MUSER_E_ARG,
                          "%s: this DFlash drafter was trained for a target with a vocabulary of %u tokens; the "
                          "target has %u (a drafter works only with the target it was trained for)",
                          f->path, hp->target_vocab, t->hp.n_vocab);
    if (!rc)
        rc = gguf_get_u32(f, "dflash.target.block_count", &hp->target_n_layer, err);
    if (!rc && hp->target_n_layer != t->hp.n_layer)
        rc = muser_errorf(err, MUSER_E_ARG,
                          "%s: this DFlash drafter was trained for a target of %u layers; the target has %u",
                          f->path, hp->target_n_layer, t->hp.n_layer);
    if (!rc)
        rc = gguf_get_u32(f, "dflash.embedding_length", &hp->n_embd, err);
    if (!rc && hp->n_embd != t->hp.n_embd)
        rc = muser_errorf(err, MUSER_E_ARG,
                          "%s: this DFlash drafter has width %u; the target's is %u (a drafter has its target's "
                          "width)",
                          f->path, hp->n_embd, t->hp.n_embd);
    gguf_str fp;
    if (!rc)
        rc = gguf_get_str(f, "dflash.target.fingerprint", &fp, err);
    if (!rc && fp.len != 64)
        rc = muser_errorf(err, MUSER_E_FORMAT, "%s: dflash.target.fingerprint is %llu characters, not 64 hex digits",
                          f->path, (unsigned long long)fp.len);
    if (rc)
        return rc;
    memcpy(hp->target_fingerprint, fp.ptr, 64);
    hp->target_fingerprint[64] = 0;
    char have[65];
    if ((rc = muser_dflash_fingerprint(t, have, err)))
        return rc;
    if (strcmp(have, hp->target_fingerprint))
        return muser_errorf(err, MUSER_E_ARG,
                            "%s: this DFlash drafter was trained for the target with fingerprint %.16s..., but the "
                            "target (%s) has %.16s...: same shape, other weights (a drafter reads one target's "
                            "hidden states)",
                            f->path, hp->target_fingerprint, t->gguf->path, have);
    return MUSER_OK;
}

static int read_hparams(const gguf_file *f, const muser_model *t, muser_dflash_hparams *hp, muser_error *err)
{
    memset(hp, 0, sizeof *hp);
    gguf_str arch;
    int rc = gguf_get_str(f, "general.architecture", &arch, err);
    if (rc)
        return rc;
    if (!gguf_str_eq(arch, MUSER_DFLASH_ARCH))
        return muser_errorf(err, MUSER_E_UNSUPPORTED,
                            "%s: general.architecture is '%.*s', not '" MUSER_DFLASH_ARCH "': not a DFlash drafter",
                            f->path, (int)(arch.len > 64 ? 64 : arch.len), arch.ptr);
    if ((rc = read_target(f, t, hp, err)))
        return rc;
    if ((rc = get_dim(f, "dflash.block_count", 1, DFLASH_MAX_LAYERS, &hp->n_layer, err)) ||
        (rc = get_dim(f, "dflash.feed_forward_length", 1, DFLASH_MAX_DIM, &hp->n_ff, err)) ||
        (rc = get_dim(f, "dflash.attention.head_count", 1, DFLASH_MAX_HEADS, &hp->n_head, err)) ||
        (rc = get_dim(f, "dflash.attention.head_count_kv", 1, DFLASH_MAX_HEADS, &hp->n_head_kv, err)) ||
        (rc = get_dim(f, "dflash.attention.key_length", 2, DFLASH_MAX_HEAD_DIM, &hp->head_dim, err)) ||
        (rc = get_dim(f, "dflash.block_size", 2, MUSER_DFLASH_MAX_BLOCK, &hp->block_size, err)) ||
        (rc = get_pos_f32(f, "dflash.attention.layer_norm_rms_epsilon", &hp->rms_eps, err)) ||
        (rc = get_pos_f32(f, "dflash.rope.freq_base", &hp->rope_theta, err)))
        return rc;
    if (hp->n_head % hp->n_head_kv)
        return muser_errorf(err, MUSER_E_FORMAT, "%s: %u query heads are not a multiple of %u KV heads", f->path,
                            hp->n_head, hp->n_head_kv);
    if (hp->head_dim % 2)
        return muser_errorf(err, MUSER_E_FORMAT, "%s: head dim %u is odd (RoPE rotates pairs)", f->path,
                            hp->head_dim);
    if ((uint64_t)hp->n_head * hp->head_dim > DFLASH_MAX_DIM)
        return muser_errorf(err, MUSER_E_FORMAT, "%s: %u heads of %u are too wide", f->path, hp->n_head,
                            hp->head_dim);
    uint64_t n;
    const void *data;
    const gguf_kv *kv = gguf_find_kv(f, "dflash.target_layers");
    const uint32_t et = kv && kv->type == GGUF_TYPE_ARRAY && kv->arr_type == GGUF_TYPE_INT32 ? GGUF_TYPE_INT32
                                                                                             : GGUF_TYPE_UINT32;
    if ((rc = gguf_get_arr(f, "dflash.target_layers", et, &n, &data, err)))
        return rc;
    if (n < 1 || n > MUSER_DFLASH_MAX_TAP)
        return muser_errorf(err, MUSER_E_FORMAT, "%s: dflash.target_layers has %llu entries (1..%d)", f->path,
                            (unsigned long long)n, MUSER_DFLASH_MAX_TAP);
    hp->n_tap = (uint32_t)n;
    for (uint32_t i = 0; i < hp->n_tap; i++) {
        uint32_t v;
        memcpy(&v, (const uint8_t *)data + 4 * i, 4); /* little-endian, as GGUF is */
        if ((et == GGUF_TYPE_INT32 && (int32_t)v < 0) || v >= t->hp.n_layer || (i > 0 && v <= hp->tap_layers[i - 1]))
            return muser_errorf(err, MUSER_E_FORMAT,
                                "%s: dflash.target_layers[%u] = %d: target layers must ascend within 0..%u", f->path,
                                i, (int32_t)v, t->hp.n_layer - 1);
        hp->tap_layers[i] = v;
    }
    hp->attn_scale = (float)(1.0 / sqrt((double)hp->head_dim));
    return MUSER_OK;
}

/* ---- binding ---- */

static int bind_layer(const gguf_file *f, const muser_dflash_hparams *hp, uint32_t l, muser_dflash_layer *L,
                      muser_error *err)
{
    const uint64_t E = hp->n_embd, QD = (uint64_t)hp->n_head * hp->head_dim,
                   KVD = (uint64_t)hp->n_head_kv * hp->head_dim;
    char name[96];
    int rc;
#define BIND(field, ne0, ne1)                                                                      \
    do {                                                                                           \
        snprintf(name, sizeof name, "blk.%u." #field ".weight", l);                                \
        if ((rc = muser_tensor_bind(f, name, (ne0), (ne1), &L->field, err)))                       \
            return rc;                                                                             \
    } while (0)
    BIND(attn_norm, E, 0);
    BIND(attn_q, E, QD);
    BIND(attn_k, E, KVD);
    BIND(attn_v, E, KVD);
    BIND(attn_q_norm, hp->head_dim, 0);
    BIND(attn_k_norm, hp->head_dim, 0);
    BIND(attn_output, QD, E);
    BIND(ffn_norm, E, 0);
    BIND(ffn_gate, E, hp->n_ff);
    BIND(ffn_up, E, hp->n_ff);
    BIND(ffn_down, hp->n_ff, E);
#undef BIND
    return MUSER_OK;
}

int muser_dflash_bind(muser_dflash **out, gguf_file *f, const muser_model *target, muser_error *err)
{
    if (!out || !f || !target)
        return muser_errorf(err, MUSER_E_ARG, "muser_dflash_bind: NULL argument");
    *out = NULL;
    muser_dflash *d = calloc(1, sizeof *d);
    if (!d)
        return muser_errorf(err, MUSER_E_NOMEM, "dflash: out of memory");
    int rc = read_hparams(f, target, &d->hp, err);
    const uint64_t E = d->hp.n_embd;
    if (!rc && !(d->layers = calloc(d->hp.n_layer, sizeof *d->layers)))
        rc = muser_errorf(err, MUSER_E_NOMEM, "dflash: out of memory");
    if (!rc)
        rc = muser_tensor_bind(f, "fc.weight", (uint64_t)d->hp.n_tap * E, E, &d->fc, err);
    if (!rc)
        rc = muser_tensor_bind(f, "hidden_norm.weight", E, 0, &d->hidden_norm, err);
    if (!rc)
        rc = muser_tensor_bind(f, "mask_embd.weight", E, 0, &d->mask_embd, err);
    if (!rc)
        rc = muser_tensor_bind(f, "output_norm.weight", E, 0, &d->output_norm, err);
    for (uint32_t l = 0; !rc && l < d->hp.n_layer; l++)
        rc = bind_layer(f, &d->hp, l, &d->layers[l], err);
    if (rc) {
        free(d->layers);
        free(d);
        return rc;
    }
    d->gguf = f;
    d->target = target;
    *out = d;
    return MUSER_OK;
}

int muser_dflash_load(muser_dflash **out, const char *path, const muser_model *target, muser_error *err)
{
    if (!out || !path || !target)
        return muser_errorf(err, MUSER_E_ARG, "muser_dflash_load: NULL argument");
    *out = NULL;
    gguf_file *f = NULL;
    int rc = gguf_open(&f, path, err);
    if (rc)
        return rc;
    rc = muser_dflash_bind(out, f, target, err);
    if (rc)
        gguf_close(f);
    return rc;
}

void muser_dflash_free(muser_dflash *d)
{
    if (!d)
        return;
    gguf_close(d->gguf);
    free(d->layers);
    free(d);
}

/* ---- runs ---- */

int muser_dflash_run_new(muser_dflash_run **out, const muser_dflash *d, muser_dflash_kind kind, uint64_t n_ctx,
                         muser_error *err)
{
    if (!out || !d)
        return muser_errorf(err, MUSER_E_ARG, "muser_dflash_run_new: NULL argument");
    *out = NULL;
    if (n_ctx == 0 || n_ctx > (1ull << 32))
        return muser_errorf(err, MUSER_E_ARG, "dflash: a context of %llu positions", (unsigned long long)n_ctx);
    const muser_dflash_impl *impl = kind == MUSER_DFLASH_CPU      ? muser_dflash_impl_cpu()
                                    : kind == MUSER_DFLASH_ORACLE ? muser_dflash_impl_oracle()
                                                                  : NULL;
#ifdef MUSER_HAVE_CUDA
    if (kind == MUSER_DFLASH_CUDA)
        impl = muser_dflash_impl_cuda();
#else
    if (kind == MUSER_DFLASH_CUDA)
        return muser_errorf(err, MUSER_E_UNSUPPORTED, "dflash: this build has no CUDA backend");
#endif
    if (!impl)
        return muser_errorf(err, MUSER_E_ARG, "dflash: unknown backend %d", (int)kind);
    muser_dflash_run *r = calloc(1, sizeof *r);
    if (!r)
        return muser_errorf(err, MUSER_E_NOMEM, "dflash: out of memory");
    r->d = d;
    r->impl = impl;
    r->n_ctx = n_ctx;
    int rc = impl->init(r, err);
    if (rc) {
        free(r);
        return rc;
    }
    if (!impl->draft &&
        !(r->scratch = malloc((size_t)(d->hp.block_size - 1) * d->target->hp.n_vocab * sizeof(float)))) {
        muser_dflash_run_free(r);
        return muser_errorf(err, MUSER_E_NOMEM, "dflash: out of memory for a block's logits");
    }
    *out = r;
    return MUSER_OK;
}

void muser_dflash_run_free(muser_dflash_run *r)
{
    if (!r)
        return;
    r->impl->free(r);
    free(r->scratch);
    free(r);
}

uint64_t muser_dflash_run_held(const muser_dflash_run *r)
{
    return r->held;
}

int muser_dflash_run_context(muser_dflash_run *r, uint64_t pos0, const float *feats, uint32_t n, muser_error *err)
{
    if (!r || (n && !feats))
        return muser_errorf(err, MUSER_E_ARG, "muser_dflash_run_context: NULL argument");
    if (pos0 > r->held)
        return muser_errorf(err, MUSER_E_CACHE_DISCONTINUITY,
                            "dflash: context from position %llu, but only %llu positions are held",
                            (unsigned long long)pos0, (unsigned long long)r->held);
    if (pos0 + n > r->n_ctx)
        return muser_errorf(err, MUSER_E_CONTEXT_FULL, "dflash: positions %llu..%llu pass the context of %llu",
                            (unsigned long long)pos0, (unsigned long long)(pos0 + n), (unsigned long long)r->n_ctx);
    int rc = n ? r->impl->context(r, pos0, feats, n, err) : MUSER_OK;
    if (!rc)
        r->held = pos0 + n; /* rows past it are forgotten, overwritten when taken again */
    return rc;
}

/* the refusals muser_dflash_run_block and muser_dflash_run_draft share */
static int block_args(const muser_dflash_run *r, int32_t t0, uint32_t n_out, muser_error *err)
{
    if (t0 < 0 || (uint32_t)t0 >= r->d->target->hp.n_vocab)
        return muser_errorf(err, MUSER_E_ARG, "dflash: token %d is not in [0, %u)", t0, r->d->target->hp.n_vocab);
    if (n_out < 1 || n_out >= r->d->hp.block_size)
        return muser_errorf(err, MUSER_E_ARG, "dflash: %u rows of logits asked of a block of %u (1..%u)", n_out,
                            r->d->hp.block_size, r->d->hp.block_size - 1);
    if (r->held + r->d->hp.block_size > r->n_ctx)
        return muser_errorf(err, MUSER_E_CONTEXT_FULL, "dflash: a block of %u at position %llu passes the context of %llu",
                            r->d->hp.block_size, (unsigned long long)r->held, (unsigned long long)r->n_ctx);
    return MUSER_OK;
}

int muser_dflash_run_block(muser_dflash_run *r, int32_t t0, uint32_t n_out, float *logits, muser_error *err)
{
    if (!r || !logits)
        return muser_errorf(err, MUSER_E_ARG, "muser_dflash_run_block: NULL argument");
    const int rc = block_args(r, t0, n_out, err);
    return rc ? rc : r->impl->block(r, t0, n_out, logits, err);
}

int muser_dflash_run_draft(muser_dflash_run *r, int32_t t0, uint32_t n_out, int32_t *tokens, muser_error *err)
{
    if (!r || !tokens)
        return muser_errorf(err, MUSER_E_ARG, "muser_dflash_run_draft: NULL argument");
    int rc = block_args(r, t0, n_out, err);
    if (rc)
        return rc;
    if (r->impl->draft)
        return r->impl->draft(r, t0, n_out, tokens, err);
    if ((rc = r->impl->block(r, t0, n_out, r->scratch, err)))
        return rc;
    const uint32_t V = r->d->target->hp.n_vocab;
    for (uint32_t i = 0; i < n_out; i++) /* finite rows: block refused any other */
        tokens[i] = muser_argmax(r->scratch + (uint64_t)i * V, V);
    return MUSER_OK;
}

bool muser_dflash_run_async(const muser_dflash_run *r)
{
    return r && r->impl->async;
}
