/* cpu/dflash.c — the DFlash drafter's forward pass on the CPU (dflash.h), f32, written plainly
 * over the CPU engine's kernels (kernels.h): every matrix is dot_rows over the block's rows (each
 * weight block unpacked once for all of them), norms sum squares in f64 like the engine's, the
 * attention is a plain softmax per head. The matrices' weight rows are split over a thread pool
 * of its own (one thread per online CPU: the target's pool is idle while the drafter runs); each
 * output is one thread's dot_rows, so the bits do not depend on the thread count.
 *
 * State, sized at creation: the context keys and values of every drafter layer, f32, normed and
 * rotated ([n_layer][n_ctx][HKV*D]), and one block's activations. Nothing is allocated per round. */
#include "cpu/kernels.h"
#include "cpu/pool.h"
#include "dflash.h"
#include "util.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define ROWS MUSER_DFLASH_MAX_BLOCK /* rows of one matrix call: a block, or a slice of context */

typedef struct cpu_dflash {
    cpu_kernels kn;
    cpu_pool *pool;
    uint32_t E, F, H, HKV, D, QD, KVD, B, M, V, group;
    float *ctx_k, *ctx_v;        /* [n_layer][n_ctx][KVD] the context's keys (normed, rotated), values */
    float *x;                    /* [ROWS][E] the block's residual stream */
    float *a;                    /* [ROWS][E] a pre-norm's output; the context's u rows */
    float *q, *o;                /* [ROWS][QD] queries, attention outputs */
    float *k, *v;                /* [ROWS][KVD] the block's keys / values (or a context slice's) */
    float *sub;                  /* [ROWS][E] o_proj / ffn_down output, fc output of the context */
    float *fg, *fu;              /* [ROWS][F] ffn gate (then silu(gate)*up), up */
    float *scores;               /* [n_ctx + ROWS] one head's attention weights */
    double *inv_freq;            /* [D/2] theta^(-2i/D) */
    cpu_xsums xs[ROWS];          /* the inputs' sums of one matrix call, kmax each */
} cpu_dflash;

/* per-head rmsnorm with w [D], then RoPE (NORM pairs) at pos */
static void head_norm_rope(const cpu_dflash *c, float *x, uint32_t heads, const muser_tensor *w, float eps,
                           uint64_t pos)
{
    const uint32_t D = c->D;
    for (uint32_t h = 0; h < heads; h++) {
        float *xh = x + (uint64_t)h * D;
        cpu_rms_row(xh, w->data, eps, xh, D);
        for (uint32_t i = 0; i < D / 2; i++) {
            const double ang = (double)pos * c->inv_freq[i];
            const float cs = (float)cos(ang), sn = (float)sin(ang);
            const float x0 = xh[2 * i], x1 = xh[2 * i + 1];
            xh[2 * i] = x0 * cs - x1 * sn;
            xh[2 * i + 1] = x0 * sn + x1 * cs;
        }
    }
}

typedef struct mm_job {
    const cpu_dflash *c;
    const muser_tensor *w;
    const float *x;
    uint64_t ldx, ldy;
    uint32_t m;
    float *y;
    atomic_uint_fast64_t next;
} mm_job;

static void mm_run(void *arg, uint32_t thread, uint32_t n_threads)
{
    (void)thread;
    (void)n_threads;
    mm_job *j = arg;
    uint64_t lo, hi;
    while (cpu_pool_grab(&j->next, j->w->rows, 16, &lo, &hi))
        for (uint64_t r = lo; r < hi; r++)
            j->c->kn.dot_rows(j->w->type, muser_tensor_row(j->w, r), j->x, j->ldx, j->c->xs, j->m, j->w->cols,
                              j->y + r, j->ldy);
}

/* y[i][r] = w_r · x[i] for m input rows (stride ldx) whose sums are in c->xs; weight rows in
 * blocks of 16 over the pool */
static void matmul(cpu_dflash *c, const muser_tensor *w, const float *x, uint64_t ldx, uint32_t m, float *y,
                   uint64_t ldy)
{
    mm_job j = {.c = c, .w = w, .x = x, .ldx = ldx, .ldy = ldy, .m = m, .y = y};
    atomic_init(&j.next, 0);
    cpu_pool_run(c->pool, mm_run, &j);
}

static void sums(cpu_dflash *c, const float *x, uint64_t ldx, uint32_t m, uint64_t n)
{
    for (uint32_t i = 0; i < m; i++)
        c->kn.xsums(x + i * ldx, n, &c->xs[i]);
}

static void cpu_dflash_free(muser_dflash_run *r)
{
    cpu_dflash *c = r->state;
    if (!c)
        return;
    muser_free_aligned(c->ctx_k);
    muser_free_aligned(c->ctx_v);
    float *bufs[] = {c->x, c->a, c->q, c->o, c->k, c->v, c->sub, c->fg, c->fu, c->scores};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
        muser_free_aligned(bufs[i]);
    free(c->inv_freq);
    if (c->pool)
        cpu_pool_free(c->pool);
    for (int i = 0; i < ROWS; i++) {
        free(c->xs[i].s16);
        free(c->xs[i].s32);
        muser_free_aligned(c->xs[i].xp);
        muser_free_aligned(c->xs[i].xd);
    }
    free(c);
    r->state = NULL;
}

static int cpu_dflash_init(muser_dflash_run *r, muser_error *err)
{
    const muser_dflash_hparams *hp = &r->d->hp;
    cpu_dflash *c = calloc(1, sizeof *c);
    if (!c)
        return muser_errorf(err, MUSER_E_NOMEM, "dflash cpu: out of memory");
    r->state = c;
    cpu_kernels_init(&c->kn, false);
    c->E = hp->n_embd;
    c->F = hp->n_ff;
    c->H = hp->n_head;
    c->HKV = hp->n_head_kv;
    c->D = hp->head_dim;
    c->QD = c->H * c->D;
    c->KVD = c->HKV * c->D;
    c->B = hp->block_size;
    c->M = hp->n_tap;
    c->V = r->d->target->hp.n_vocab;
    c->group = c->H / c->HKV;
    uint64_t kmax = (uint64_t)c->M * c->E;
    if (c->QD > kmax) kmax = c->QD;
    if (c->F > kmax) kmax = c->F;
    const uint64_t plane = (uint64_t)hp->n_layer * r->n_ctx * c->KVD * sizeof(float);
    bool ok = (c->ctx_k = muser_alloc_aligned(plane)) && (c->ctx_v = muser_alloc_aligned(plane));
    ok = ok && (c->x = muser_alloc_aligned((uint64_t)ROWS * c->E * sizeof(float)));
    ok = ok && (c->a = muser_alloc_aligned((uint64_t)ROWS * c->E * sizeof(float)));
    ok = ok && (c->sub = muser_alloc_aligned((uint64_t)ROWS * c->E * sizeof(float)));
    ok = ok && (c->q = muser_alloc_aligned((uint64_t)ROWS * c->QD * sizeof(float)));
    ok = ok && (c->o = muser_alloc_aligned((uint64_t)ROWS * c->QD * sizeof(float)));
    ok = ok && (c->k = muser_alloc_aligned((uint64_t)ROWS * c->KVD * sizeof(float)));
    ok = ok && (c->v = muser_alloc_aligned((uint64_t)ROWS * c->KVD * sizeof(float)));
    ok = ok && (c->fg = muser_alloc_aligned((uint64_t)ROWS * c->F * sizeof(float)));
    ok = ok && (c->fu = muser_alloc_aligned((uint64_t)ROWS * c->F * sizeof(float)));
    ok = ok && (c->scores = muser_alloc_aligned((r->n_ctx + ROWS) * sizeof(float)));
    ok = ok && (c->inv_freq = calloc(c->D / 2, sizeof(double)));
    for (int i = 0; ok && i < ROWS; i++) {
        ok = (c->xs[i].s16 = calloc(kmax / 16 + 1, sizeof(float))) != NULL;
        ok = ok && (c->xs[i].s32 = calloc(kmax / 32 + 1, sizeof(float)));
        ok = ok && (c->xs[i].xp = muser_alloc_aligned((kmax + 32) * sizeof(float)));
        ok = ok && (c->xs[i].xd = muser_alloc_aligned(CPU_XD_BYTES(kmax)));
    }
    if (!ok) {
        cpu_dflash_free(r);
        return muser_errorf(err, MUSER_E_NOMEM, "dflash cpu: out of memory for a context of %llu",
                            (unsigned long long)r->n_ctx);
    }
    for (uint32_t i = 0; i < c->D / 2; i++)
        c->inv_freq[i] = pow((double)hp->rope_theta, -2.0 * (double)i / (double)c->D);
    const long online = sysconf(_SC_NPROCESSORS_ONLN);
    const int rc = cpu_pool_new(&c->pool, online > 0 ? (uint32_t)online : 1, err);
    if (rc) {
        cpu_dflash_free(r);
        return rc;
    }
    return MUSER_OK;
}

/* positions [pos0, pos0 + n): u = rmsnorm(fc · feats, hidden_norm), then every layer's K (normed,
 * rotated) and V, in slices of ROWS rows */
static int cpu_dflash_context(muser_dflash_run *r, uint64_t pos0, const float *feats, uint32_t n, muser_error *err)
{
    (void)err;
    cpu_dflash *c = r->state;
    const muser_dflash *d = r->d;
    const uint64_t ME = (uint64_t)c->M * c->E;
    for (uint32_t s = 0; s < n; s += ROWS) {
        const uint32_t m = n - s < ROWS ? n - s : ROWS;
        const float *f = feats + s * ME;
        sums(c, f, ME, m, ME);
        matmul(c, &d->fc, f, ME, m, c->sub, c->E);
        for (uint32_t i = 0; i < m; i++)
            cpu_rms_row(c->sub + (uint64_t)i * c->E, d->hidden_norm.data, d->hp.rms_eps, c->a + (uint64_t)i * c->E, c->E);
        sums(c, c->a, c->E, m, c->E);
        for (uint32_t l = 0; l < d->hp.n_layer; l++) {
            const muser_dflash_layer *L = &d->layers[l];
            matmul(c, &L->attn_k, c->a, c->E, m, c->k, c->KVD);
            matmul(c, &L->attn_v, c->a, c->E, m, c->v, c->KVD);
            for (uint32_t i = 0; i < m; i++) {
                const uint64_t pos = pos0 + s + i, at = ((uint64_t)l * r->n_ctx + pos) * c->KVD;
                head_norm_rope(c, c->k + (uint64_t)i * c->KVD, c->HKV, &L->attn_k_norm, d->hp.rms_eps, pos);
                memcpy(c->ctx_k + at, c->k + (uint64_t)i * c->KVD, c->KVD * sizeof(float));
                memcpy(c->ctx_v + at, c->v + (uint64_t)i * c->KVD, c->KVD * sizeof(float));
            }
        }
    }
    return MUSER_OK;
}

/* query row i, head h of layer l: softmax over the context's p keys then the block's B keys */
static void attend(cpu_dflash *c, const muser_dflash_run *r, uint32_t l, uint64_t p, uint32_t i, uint32_t h)
{
    const uint32_t D = c->D, hk = h / c->group;
    const float *q = c->q + (uint64_t)i * c->QD + (uint64_t)h * D;
    const float scale = r->d->hp.attn_scale;
    const float *ck = c->ctx_k + (uint64_t)l * r->n_ctx * c->KVD + (uint64_t)hk * D;
    const float *cv = c->ctx_v + (uint64_t)l * r->n_ctx * c->KVD + (uint64_t)hk * D;
    const uint64_t n = p + c->B;
    float max = -INFINITY;
    for (uint64_t j = 0; j < n; j++) {
        const float *kj = j < p ? ck + j * c->KVD : c->k + (j - p) * c->KVD + (uint64_t)hk * D;
        float dot = 0.0f;
        for (uint32_t e = 0; e < D; e++)
            dot += q[e] * kj[e];
        c->scores[j] = dot * scale;
        if (c->scores[j] > max)
            max = c->scores[j];
    }
    float sum = 0.0f;
    for (uint64_t j = 0; j < n; j++) {
        c->scores[j] = expf(c->scores[j] - max);
        sum += c->scores[j];
    }
    float *o = c->o + (uint64_t)i * c->QD + (uint64_t)h * D;
    memset(o, 0, D * sizeof(float));
    for (uint64_t j = 0; j < n; j++) {
        const float *vj = j < p ? cv + j * c->KVD : c->v + (j - p) * c->KVD + (uint64_t)hk * D;
        const float w = c->scores[j] / sum;
        for (uint32_t e = 0; e < D; e++)
            o[e] += w * vj[e];
    }
}

static int cpu_dflash_block(muser_dflash_run *r, int32_t t0, uint32_t n_out, float *logits, muser_error *err)
{
    cpu_dflash *c = r->state;
    const muser_dflash *d = r->d;
    const muser_model *t = d->target;
    const uint32_t B = c->B, E = c->E;
    const float eps = d->hp.rms_eps;
    const uint64_t p = r->held;
    int rc = c->kn.dequant_row(t->tok_embd.type, muser_tensor_row(&t->tok_embd, (uint64_t)t0), c->x, E);
    if (rc)
        return muser_errorf(err, rc, "dflash cpu: cannot read token %d's embedding", t0);
    for (uint32_t i = 1; i < B; i++)
        memcpy(c->x + (uint64_t)i * E, d->mask_embd.data, E * sizeof(float));
    for (uint32_t l = 0; l < d->hp.n_layer; l++) {
        const muser_dflash_layer *L = &d->layers[l];
        /* attention: queries, keys and values of the block; the context's keys are cached */
        for (uint32_t i = 0; i < B; i++)
            cpu_rms_row(c->x + (uint64_t)i * E, L->attn_norm.data, eps, c->a + (uint64_t)i * E, E);
        sums(c, c->a, E, B, E);
        matmul(c, &L->attn_q, c->a, E, B, c->q, c->QD);
        matmul(c, &L->attn_k, c->a, E, B, c->k, c->KVD);
        matmul(c, &L->attn_v, c->a, E, B, c->v, c->KVD);
        for (uint32_t i = 0; i < B; i++) {
            head_norm_rope(c, c->q + (uint64_t)i * c->QD, c->H, &L->attn_q_norm, eps, p + i);
            head_norm_rope(c, c->k + (uint64_t)i * c->KVD, c->HKV, &L->attn_k_norm, eps, p + i);
        }
        for (uint32_t i = 0; i < B; i++)
            for (uint32_t h = 0; h < c->H; h++)
                attend(c, r, l, p, i, h);
        sums(c, c->o, c->QD, B, c->QD);
        matmul(c, &L->attn_output, c->o, c->QD, B, c->sub, E);
        for (uint64_t e = 0; e < (uint64_t)B * E; e++)
            c->x[e] += c->sub[e];
        /* SwiGLU */
        for (uint32_t i = 0; i < B; i++)
            cpu_rms_row(c->x + (uint64_t)i * E, L->ffn_norm.data, eps, c->a + (uint64_t)i * E, E);
        sums(c, c->a, E, B, E);
        matmul(c, &L->ffn_gate, c->a, E, B, c->fg, c->F);
        matmul(c, &L->ffn_up, c->a, E, B, c->fu, c->F);
        for (uint32_t i = 0; i < B; i++)
            c->kn.swiglu(c->fg + (uint64_t)i * c->F, c->fu + (uint64_t)i * c->F, c->F);
        sums(c, c->fg, c->F, B, c->F);
        matmul(c, &L->ffn_down, c->fg, c->F, B, c->sub, E);
        for (uint64_t e = 0; e < (uint64_t)B * E; e++)
            c->x[e] += c->sub[e];
    }
    /* rows 1..n_out: the drafter's final norm, then the target's LM head */
    for (uint32_t i = 1; i <= n_out; i++)
        cpu_rms_row(c->x + (uint64_t)i * E, d->output_norm.data, eps, c->a + (uint64_t)(i - 1) * E, E);
    sums(c, c->a, E, n_out, E);
    matmul(c, &t->output, c->a, E, n_out, logits, c->V);
    for (uint32_t i = 0; i < n_out; i++)
        if (!c->kn.logit_finish(logits + (uint64_t)i * c->V, c->V, t->hp.logit_scale, t->hp.final_softcap))
            return muser_errorf(err, MUSER_E_NUMERIC, "dflash cpu: the logits of block row %u hold NaN or Inf", i + 1);
    return MUSER_OK;
}

static const muser_dflash_impl cpu_impl = {
    .init = cpu_dflash_init,
    .free = cpu_dflash_free,
    .context = cpu_dflash_context,
    .block = cpu_dflash_block,
};

const muser_dflash_impl *muser_dflash_impl_cpu(void)
{
    return &cpu_impl;
}
