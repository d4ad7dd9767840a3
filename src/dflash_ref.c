/* dflash_ref.c — the DFlash drafter's oracle (dflash.h), the judge of its CPU forward pass: the
 * definition in dflash.h read literally, slow and dumb on purpose, in the manner of reference.c.
 *
 *   - every activation is an f64 vector; every dot product, norm and softmax sums in f64;
 *   - weights are dequantized one row at a time (quant_dequantize_row, f32) and each element is
 *     widened to f64 before it is multiplied; the tapped target features (f32) are widened too;
 *   - the context keys and values are kept in f64 (nothing is narrowed on the way);
 *   - logits are computed in f64 and rounded to f32 once, at the end.
 * One thread, one row at a time. Nothing is allocated per round. */
#include "dflash.h"
#include "quant.h"
#include "reference.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

typedef struct ref_dflash {
    uint32_t E, F, H, HKV, D, QD, KVD, B, M, V, group;
    double *ctx_k, *ctx_v;   /* [n_layer][n_ctx][KVD] */
    double *x;               /* [B][E] residual */
    double *a;               /* [B][E] normed input */
    double *q, *o;           /* [B][QD] */
    double *k, *v;           /* [B][KVD] */
    double *tmp;             /* [max width] a matrix output, or the widened features */
    double *fg, *fu;         /* [F] */
    double *scores;          /* [n_ctx + B] */
    float *row;              /* [max cols] a dequantized weight row */
} ref_dflash;

/* y = W·x in f64: each row dequantized, widened, one sequential sum */
static int matvec(ref_dflash *s, const muser_tensor *w, const double *x, double *y)
{
    for (uint64_t r = 0; r < w->rows; r++) {
        int rc = quant_dequantize_row(w->type, muser_tensor_row(w, r), s->row, w->cols);
        if (rc)
            return rc;
        double acc = 0.0;
        for (uint64_t i = 0; i < w->cols; i++)
            acc += (double)s->row[i] * x[i];
        y[r] = acc;
    }
    return MUSER_OK;
}

static void head_norm_rope(double *x, uint32_t heads, uint32_t D, const muser_tensor *w, double eps, uint64_t pos,
                           double theta)
{
    for (uint32_t h = 0; h < heads; h++) {
        oracle_rmsnorm(x + (uint64_t)h * D, x + (uint64_t)h * D, w->data, D, eps);
        oracle_rope_head(x + (uint64_t)h * D, D, pos, theta, false);
    }
}

static void ref_free(muser_dflash_run *r)
{
    ref_dflash *s = r->state;
    if (!s)
        return;
    free(s->ctx_k);
    free(s->ctx_v);
    free(s->x);
    free(s->a);
    free(s->q);
    free(s->o);
    free(s->k);
    free(s->v);
    free(s->tmp);
    free(s->fg);
    free(s->fu);
    free(s->scores);
    free(s->row);
    free(s);
    r->state = NULL;
}

static int ref_init(muser_dflash_run *r, muser_error *err)
{
    const muser_dflash_hparams *hp = &r->d->hp;
    const muser_model *t = r->d->target;
    ref_dflash *s = calloc(1, sizeof *s);
    if (!s)
        return muser_errorf(err, MUSER_E_NOMEM, "dflash oracle: out of memory");
    r->state = s;
    s->E = hp->n_embd;
    s->F = hp->n_ff;
    s->H = hp->n_head;
    s->HKV = hp->n_head_kv;
    s->D = hp->head_dim;
    s->QD = s->H * s->D;
    s->KVD = s->HKV * s->D;
    s->B = hp->block_size;
    s->M = hp->n_tap;
    s->V = t->hp.n_vocab;
    s->group = s->H / s->HKV;
    uint64_t wide = (uint64_t)s->M * s->E;
    if (s->QD > wide) wide = s->QD;
    if (s->F > wide) wide = s->F;
    if (s->V > wide) wide = s->V;
    const uint64_t plane = (uint64_t)hp->n_layer * r->n_ctx * s->KVD;
    s->ctx_k = malloc(plane * sizeof(double));
    s->ctx_v = malloc(plane * sizeof(double));
    s->x = malloc((uint64_t)s->B * s->E * sizeof(double));
    s->a = malloc((uint64_t)s->B * s->E * sizeof(double));
    s->q = malloc((uint64_t)s->B * s->QD * sizeof(double));
    s->o = malloc((uint64_t)s->B * s->QD * sizeof(double));
    s->k = malloc((uint64_t)s->B * s->KVD * sizeof(double));
    s->v = malloc((uint64_t)s->B * s->KVD * sizeof(double));
    s->tmp = malloc(wide * sizeof(double));
    s->fg = malloc((uint64_t)s->F * sizeof(double));
    s->fu = malloc((uint64_t)s->F * sizeof(double));
    s->scores = malloc((r->n_ctx + s->B) * sizeof(double));
    s->row = malloc(wide * sizeof(float));
    if (!s->ctx_k || !s->ctx_v || !s->x || !s->a || !s->q || !s->o || !s->k || !s->v || !s->tmp || !s->fg ||
        !s->fu || !s->scores || !s->row) {
        ref_free(r);
        return muser_errorf(err, MUSER_E_NOMEM, "dflash oracle: out of memory for a context of %llu",
                            (unsigned long long)r->n_ctx);
    }
    return MUSER_OK;
}

static int ref_context(muser_dflash_run *r, uint64_t pos0, const float *feats, uint32_t n, muser_error *err)
{
    ref_dflash *s = r->state;
    const muser_dflash *d = r->d;
    const uint64_t ME = (uint64_t)s->M * s->E;
    for (uint32_t j = 0; j < n; j++) {
        const uint64_t pos = pos0 + j;
        for (uint64_t i = 0; i < ME; i++)
            s->tmp[i] = (double)feats[j * ME + i];
        double *u = s->a, *fcu = s->x; /* scratch rows */
        int rc = matvec(s, &d->fc, s->tmp, fcu);
        if (rc)
            return muser_errorf(err, rc, "dflash oracle: fc.weight");
        oracle_rmsnorm(u, fcu, d->hidden_norm.data, s->E, d->hp.rms_eps);
        for (uint32_t l = 0; l < d->hp.n_layer; l++) {
            const muser_dflash_layer *L = &d->layers[l];
            double *k = s->ctx_k + ((uint64_t)l * r->n_ctx + pos) * s->KVD;
            double *v = s->ctx_v + ((uint64_t)l * r->n_ctx + pos) * s->KVD;
            if ((rc = matvec(s, &L->attn_k, u, k)) || (rc = matvec(s, &L->attn_v, u, v)))
                return muser_errorf(err, rc, "dflash oracle: layer %u", l);
            head_norm_rope(k, s->HKV, s->D, &L->attn_k_norm, d->hp.rms_eps, pos, d->hp.rope_theta);
        }
    }
    return MUSER_OK;
}

static int ref_block(muser_dflash_run *r, int32_t t0, uint32_t n_out, float *logits, muser_error *err)
{
    ref_dflash *s = r->state;
    const muser_dflash *d = r->d;
    const muser_model *t = d->target;
    const uint32_t B = s->B, E = s->E, D = s->D;
    const double eps = d->hp.rms_eps, theta = d->hp.rope_theta;
    const uint64_t p = r->held;
    int rc = quant_dequantize_row(t->tok_embd.type, muser_tensor_row(&t->tok_embd, (uint64_t)t0), s->row, E);
    if (rc)
        return muser_errorf(err, rc, "dflash oracle: token %d's embedding", t0);
    for (uint32_t e = 0; e < E; e++)
        s->x[e] = (double)s->row[e];
    for (uint32_t i = 1; i < B; i++)
        for (uint32_t e = 0; e < E; e++)
            s->x[(uint64_t)i * E + e] = (double)((const float *)d->mask_embd.data)[e];
    for (uint32_t l = 0; l < d->hp.n_layer; l++) {
        const muser_dflash_layer *L = &d->layers[l];
        for (uint32_t i = 0; i < B; i++) {
            double *a = s->a + (uint64_t)i * E;
            oracle_rmsnorm(a, s->x + (uint64_t)i * E, L->attn_norm.data, E, eps);
            double *q = s->q + (uint64_t)i * s->QD, *k = s->k + (uint64_t)i * s->KVD, *v = s->v + (uint64_t)i * s->KVD;
            if ((rc = matvec(s, &L->attn_q, a, q)) || (rc = matvec(s, &L->attn_k, a, k)) ||
                (rc = matvec(s, &L->attn_v, a, v)))
                return muser_errorf(err, rc, "dflash oracle: layer %u", l);
            head_norm_rope(q, s->H, D, &L->attn_q_norm, eps, p + i, theta);
            head_norm_rope(k, s->HKV, D, &L->attn_k_norm, eps, p + i, theta);
        }
        /* every block row attends over the context (positions < p) and the whole block */
        const double scale = 1.0 / sqrt((double)D);
        const uint64_t n = p + B;
        for (uint32_t i = 0; i < B; i++)
            for (uint32_t h = 0; h < s->H; h++) {
                const uint32_t hk = h / s->group;
                const double *q = s->q + (uint64_t)i * s->QD + (uint64_t)h * D;
                double max = -INFINITY;
                for (uint64_t j = 0; j < n; j++) {
                    const double *kj = j < p ? s->ctx_k + ((uint64_t)l * r->n_ctx + j) * s->KVD + (uint64_t)hk * D
                                             : s->k + (j - p) * s->KVD + (uint64_t)hk * D;
                    double dot = 0.0;
                    for (uint32_t e = 0; e < D; e++)
                        dot += q[e] * kj[e];
                    s->scores[j] = dot * scale;
                    if (s->scores[j] > max)
                        max = s->scores[j];
                }
                double sum = 0.0;
                for (uint64_t j = 0; j < n; j++) {
                    s->scores[j] = exp(s->scores[j] - max);
                    sum += s->scores[j];
                }
                double *o = s->o + (uint64_t)i * s->QD + (uint64_t)h * D;
                for (uint32_t e = 0; e < D; e++)
                    o[e] = 0.0;
                for (uint64_t j = 0; j < n; j++) {
                    const double *vj = j < p ? s->ctx_v + ((uint64_t)l * r->n_ctx + j) * s->KVD + (uint64_t)hk * D
                                             : s->v + (j - p) * s->KVD + (uint64_t)hk * D;
                    const double w = s->scores[j] / sum;
                    for (uint32_t e = 0; e < D; e++)
                        o[e] += w * vj[e];
                }
            }
        for (uint32_t i = 0; i < B; i++) {
            double *x = s->x + (uint64_t)i * E, *a = s->a + (uint64_t)i * E;
            if ((rc = matvec(s, &L->attn_output, s->o + (uint64_t)i * s->QD, s->tmp)))
                return muser_errorf(err, rc, "dflash oracle: layer %u", l);
            for (uint32_t e = 0; e < E; e++)
                x[e] += s->tmp[e];
            oracle_rmsnorm(a, x, L->ffn_norm.data, E, eps);
            if ((rc = matvec(s, &L->ffn_gate, a, s->fg)) || (rc = matvec(s, &L->ffn_up, a, s->fu)))
                return muser_errorf(err, rc, "dflash oracle: layer %u", l);
            for (uint32_t f = 0; f < s->F; f++)
                s->fg[f] = s->fg[f] / (1.0 + exp(-s->fg[f])) * s->fu[f];
            if ((rc = matvec(s, &L->ffn_down, s->fg, s->tmp)))
                return muser_errorf(err, rc, "dflash oracle: layer %u", l);
            for (uint32_t e = 0; e < E; e++)
                x[e] += s->tmp[e];
        }
    }
    const double scale = t->hp.logit_scale, cap = t->hp.final_softcap;
    for (uint32_t i = 1; i <= n_out; i++) {
        oracle_rmsnorm(s->a, s->x + (uint64_t)i * E, d->output_norm.data, E, eps);
        if ((rc = matvec(s, &t->output, s->a, s->tmp)))
            return muser_errorf(err, rc, "dflash oracle: the LM head");
        float *out = logits + (uint64_t)(i - 1) * s->V;
        for (uint32_t c = 0; c < s->V; c++) {
            const double z = s->tmp[c] * scale;
            out[c] = (float)(cap > 0.0 ? cap * tanh(z / cap) : z);
            if (!isfinite(out[c]))
                return muser_errorf(err, MUSER_E_NUMERIC, "dflash oracle: the logits of block row %u hold NaN or Inf",
                                    i);
        }
    }
    return MUSER_OK;
}

static const muser_dflash_impl oracle_impl = {
    .init = ref_init,
    .free = ref_free,
    .context = ref_context,
    .block = ref_block,
};

const muser_dflash_impl *muser_dflash_impl_oracle(void)
{
    return &oracle_impl;
}
