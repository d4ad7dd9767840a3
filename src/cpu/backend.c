/* backend.c — the fast CPU engine: muser_backend_cpu(), its per-session state and its
 * implementation of the forward.h operations.
 *
 * State (cpu_state) is sized once at device creation, twice: the small-batch route's for a step
 * of up to MUSER_STEP_MAX_ROWS rows, the prefill route's for a chunk of `pass_rows` rows
 * (min(max_batch, CPU_PASS_ROWS)); a call with more tokens runs several chunks, and a chunk run
 * in parts keeps its rows in its state while steps run on the other. Nothing is allocated per
 * token. Routes:
 *   decode (n == 1): every matrix is a matvec straight over the packed blocks (kernels.h), rows
 *                    handed out to the threads in shrinking (guided) blocks;
 *   batch  (n > 1):  every matrix is a GEMM: the threads take panels of 16 weight rows, unpack
 *                    each panel to f32 once and run it against all rows of the pass.
 * Per-row work (norms, tails, RoPE, gates) runs on the caller for one row and across the threads
 * for many. Each output element is computed by one thread with a fixed summation order, so the
 * results do not depend on the thread count or on how a call is split into passes.
 *
 * Failure: positions are checked before anything runs; K/V are staged and committed only after
 * a pass's logits were found finite; a call of several passes saves the ring rows and metadata
 * its earlier passes overwrite and puts them back if a later pass fails. */
#include "cpu/kernels.h"
#include "cpu/pool.h"
#include "forward.h"
#include "quant.h"
#include "session.h"
#include "tp.h"
#include "util.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define CPU_PASS_ROWS 128u /* rows per batch pass: bounds activation memory */
/* Below these sizes a job runs on the caller alone: handing it to another core (cache lines
 * travel, a worker may have to be woken) costs more than the job (a few microseconds). In
 * weight x activation-row products of a matrix group, multiply-adds of an attention call, and
 * elements of a per-row op. */
#define CPU_PAR_MIN_WEIGHTS (1u << 15)
#define CPU_PAR_MIN_ATTN (1u << 16)
#define CPU_PAR_MIN_ELEMS (1u << 14)
/* A decode thread's smallest grab of matrix rows (~9 KB of Q4_K at K 2048, ~1.3 us): how far
 * apart the threads may finish a matvec. */
#define CPU_MV_MIN_ROWS 8u

typedef struct cpu_thread_scratch {
    float *tmp;    /* [CPU_PANEL][kmax] unpacked weight rows */
    float *panel;  /* [kmax][CPU_PANEL] the same, transposed */
    float *scores; /* [group][n_ctx] attention probabilities */
    float *o;      /* [group][D] attention accumulators */
} cpu_thread_scratch;

/* A session on the CPU: its cache, and the undo copy a call of several passes saves. */
typedef struct cpu_seq {
    muser_kv kv;
    kv_undo undo;                 /* the cache before a call of several passes (kv.h) */
} cpu_seq;

/* The device: threads, kernels and one pass's workspace, shared by its sessions. */
typedef struct cpu_state {
    const muser_model *m;
    muser_tp_comm *tp;            /* tensor parallel: this rank's reduce (NULL: one rank) */
    uint32_t tp_rank;
    float *tp_logits;             /* [MUSER_STEP_MAX_ROWS][its vocabulary rows] the LM head's part */
    muser_kv **pass_kv;           /* [pass_rows] the caches of the pass in flight (fwd_rows.seq) */
    cpu_pool *pool;
    bool owns_pool;               /* the device's step state owns it; its prefill state shares it */
    struct cpu_state *pf;         /* the step state's: the prefill route's own pass state */
    cpu_kernels kn;
    uint32_t pass_rows, n_threads;
    uint64_t n_ctx;
    uint32_t E, F, H, HKV, D, QD, KVD, V, group, kmax;

    float *buf[FWD_BUF_COUNT];    /* [pass_rows][width] */
    uint32_t width[FWD_BUF_COUNT];
    uint16_t *stage_k, *stage_v;  /* [n_layer][pass_rows][KVD] f16: this pass's K/V */
    float *rope_cos, *rope_sin;   /* [pass_rows][D/2] */
    double *inv_freq;             /* [D/2] theta^(-2i/D) */
    cpu_xsums *xs;                /* [pass_rows] decode rows' inputs: sums [kmax/16], [kmax/32], xp [kmax] */
    float *xpack;                 /* [pass_rows * kmax] a batch GEMM's input in pack_x's groups */
    cpu_thread_scratch *ts;       /* [n_threads] */
    float *logits;                /* [pass_rows][V] the logits of a pass nobody reads (NaN check) */
    float *out_logits;            /* where lm_head writes this pass: logits or the caller's */
    float *commit_k, *commit_v;   /* [KVD] f32 rows for kv_plane_append */
    uint64_t *pos;                /* [pass_rows] */
    uint32_t *seq, *first;        /* [pass_rows] fwd_rows.seq / .first of a step */
} cpu_state;

static float *row_of(cpu_state *st, fwd_buf b, uint32_t i)
{
    return st->buf[b] + (uint64_t)i * st->width[b];
}

static const float *norm_w(const muser_tensor *t)
{
    return t ? (const float *)t->data : NULL;
}

/* ---- per-row jobs: run inline for one row, across the pool for many ---- */

typedef struct row_job {
    cpu_state *st;
    const fwd_rows *r;
    void (*fn)(struct row_job *j, uint32_t i);
    atomic_uint_fast64_t next;
    /* op arguments */
    fwd_buf src, dst;
    const float *w, *w2;
    float eps, eps2;
    uint32_t layer;
    bool rope, neox, entry_norm;
} row_job;

static void row_job_main(void *arg, uint32_t t, uint32_t nt)
{
    (void)t;
    (void)nt;
    row_job *j = arg;
    uint64_t lo, hi;
    while (cpu_pool_grab(&j->next, j->r->n, 1, &lo, &hi))
        for (uint64_t i = lo; i < hi; i++)
            j->fn(j, (uint32_t)i);
}

static void run_rows(row_job *j)
{
    atomic_init(&j->next, 0);
    if ((uint64_t)j->r->n * j->st->E < CPU_PAR_MIN_ELEMS)
        row_job_main(j, 0, 1);
    else
        cpu_pool_run(j->st->pool, row_job_main, j);
}

/* ---- embed, rmsnorm, tail, gate, swiglu ---- */

static void embed_row(row_job *j, uint32_t i)
{
    cpu_state *st = j->st;
    const muser_tensor *t = &st->m->tok_embd;
    float *h = row_of(st, FWD_H, i);
    /* The token was range-checked by the session; the type was checked at bind. */
    st->kn.dequant_row(t->type, muser_tensor_row(t, (uint64_t)j->r->tokens[i]), h, st->E);
    if (j->entry_norm)
        cpu_rms_row(h, NULL, j->eps, h, st->E);
}

static void op_embed(void *be, const fwd_rows *r, bool entry_norm, float eps)
{
    row_job j = {.st = be, .r = r, .fn = embed_row, .entry_norm = entry_norm, .eps = eps};
    run_rows(&j);
}

static void norm_row(row_job *j, uint32_t i)
{
    cpu_state *st = j->st;
    cpu_rms_row(row_of(st, j->src, i), j->w, j->eps, row_of(st, j->dst, i), st->width[j->src]);
}

static void op_rmsnorm(void *be, const fwd_rows *r, fwd_buf src, const muser_tensor *w, float eps,
                       fwd_buf dst)
{
    row_job j = {.st = be, .r = r, .fn = norm_row, .src = src, .dst = dst, .w = norm_w(w),
                 .eps = eps};
    run_rows(&j);
}

static void tail_row(row_job *j, uint32_t i)
{
    cpu_state *st = j->st;
    float *h = row_of(st, FWD_H, i), *sub = row_of(st, FWD_SUB, i);
    const uint64_t E = st->E;
    if (j->w) {
        double ss = 0.0;
        for (uint64_t k = 0; k < E; k++)
            ss += (double)sub[k] * sub[k];
        const float inv = (float)(1.0 / sqrt(ss / (double)E + j->eps));
        for (uint64_t k = 0; k < E; k++)
            h[k] += sub[k] * inv * j->w[k]; /* the post-normed value rounds to f32, then adds */
    } else {
        for (uint64_t k = 0; k < E; k++)
            h[k] += sub[k];
    }
    cpu_rms_row(h, j->w2, j->eps2, row_of(st, j->dst, i), E);
}

static void op_tail(void *be, const fwd_rows *r, const muser_tensor *w_post, float eps_post,
                    const muser_tensor *w_next, float eps_next, fwd_buf dst)
{
    row_job j = {.st = be, .r = r, .fn = tail_row, .w = norm_w(w_post), .eps = eps_post,
                 .w2 = norm_w(w_next), .eps2 = eps_next, .dst = dst};
    run_rows(&j);
}

static void gate_row(row_job *j, uint32_t i)
{
    cpu_state *st = j->st;
    st->kn.sigmoid_gate(row_of(st, FWD_O, i), row_of(st, FWD_G, i), st->QD);
}

static void op_gate(void *be, const fwd_rows *r)
{
    row_job j = {.st = be, .r = r, .fn = gate_row};
    run_rows(&j);
}

static void swiglu_row(row_job *j, uint32_t i)
{
    cpu_state *st = j->st;
    st->kn.swiglu(row_of(st, FWD_FG, i), row_of(st, FWD_FU, i), st->F);
}

static void op_swiglu(void *be, const fwd_rows *r)
{
    row_job j = {.st = be, .r = r, .fn = swiglu_row};
    run_rows(&j);
}

/* ---- QK-norm + RoPE + staging ---- */

static void rope_head(float *x, const float *c, const float *s, uint32_t D, bool neox)
{
    for (uint32_t i = 0; i < D / 2; i++) {
        const uint32_t i0 = neox ? i : 2 * i, i1 = neox ? i + D / 2 : 2 * i + 1;
        const float x0 = x[i0], x1 = x[i1];
        x[i0] = x0 * c[i] - x1 * s[i];
        x[i1] = x0 * s[i] + x1 * c[i];
    }
}

static void stage_row(row_job *j, uint32_t i)
{
    cpu_state *st = j->st;
    const uint32_t D = st->D;
    float *q = row_of(st, FWD_Q, i), *k = row_of(st, FWD_K, i), *v = row_of(st, FWD_V, i);
    const float *c = st->rope_cos + (uint64_t)i * (D / 2), *s = st->rope_sin + (uint64_t)i * (D / 2);
    for (uint32_t h = 0; h < st->H; h++) {
        if (j->w)
            cpu_rms_row(q + h * D, j->w, j->eps, q + h * D, D);
        if (j->rope)
            rope_head(q + h * D, c, s, D, j->neox);
    }
    for (uint32_t h = 0; h < st->HKV; h++) {
        if (j->w2)
            cpu_rms_row(k + h * D, j->w2, j->eps, k + h * D, D);
        if (j->rope)
            rope_head(k + h * D, c, s, D, j->neox);
    }
    const uint64_t off = ((uint64_t)j->layer * st->pass_rows + i) * st->KVD;
    st->kn.f32_to_f16(k, st->stage_k + off, st->KVD);
    st->kn.f32_to_f16(v, st->stage_v + off, st->KVD);
}

static void op_attn_stage(void *be, const fwd_rows *r, uint32_t l, const muser_tensor *q_norm,
                          const muser_tensor *k_norm, float eps, bool rope, bool neox)
{
    row_job j = {.st = be, .r = r, .fn = stage_row, .w = norm_w(q_norm), .w2 = norm_w(k_norm),
                 .eps = eps, .layer = l, .rope = rope, .neox = neox};
    run_rows(&j);
}

/* ---- attention ---- */

typedef struct attn_job {
    cpu_state *st;
    const fwd_rows *r;
    uint32_t layer, window;
    float scale;
    atomic_uint_fast64_t next;
} attn_job;

/* K (or V) of kv head g at logical position j: stored plane rows below p0, staged rows from p0
 * on. `phys` walks the ring (or the FULL plane) without a division per position. */
typedef struct kv_cursor {
    const uint16_t *base;   /* plane storage */
    uint64_t phys, cap;     /* physical row of the current position, capacity */
    bool ring;
    uint32_t KVD, D, g;
} kv_cursor;

static inline const uint16_t *kv_cursor_at(const kv_cursor *c)
{
    return c->ring ? c->base + c->phys * c->KVD + (uint64_t)c->g * c->D
                   : c->base + ((uint64_t)c->g * c->cap + c->phys) * c->D;
}

static inline void kv_cursor_next(kv_cursor *c)
{
    if (++c->phys == c->cap && c->ring)
        c->phys = 0;
}

static void attend_item(attn_job *j, uint32_t t, uint64_t item)
{
    cpu_state *st = j->st;
    const fwd_rows *r = j->r;
    const cpu_kernels *kn = &st->kn;
    const uint32_t i = (uint32_t)(item / st->HKV), g = (uint32_t)(item % st->HKV);
    const uint32_t D = st->D, G = st->group, KVD = st->KVD;
    const kv_plane *pl = &st->pass_kv[fwd_seq(r, i)]->planes[j->layer];
    /* this row's sequence: its first row of the pass (pass index i0) is at position p0, so
     * position p0 + k of it is staged at pass row i0 + k */
    const uint32_t i0 = fwd_first(r, i);
    const uint64_t p = r->pos[i], p0 = r->pos[i0];
    uint64_t lo = 0;
    if (j->window && p + 1 > j->window)
        lo = p + 1 - j->window;
    const uint64_t first = kv_plane_first_pos(pl);
    if (lo < first && lo < p0) /* cannot happen on a consistent cache; never read outside it */
        lo = first < p0 ? first : p0;
    const uint64_t span = p - lo + 1, n_stored = lo < p0 ? p0 - lo : 0;
    const float *q = row_of(st, FWD_Q, i) + (uint64_t)g * G * D;
    float *sc = st->ts[t].scores, *o = st->ts[t].o;
    const uint16_t *sk = st->stage_k + (uint64_t)j->layer * st->pass_rows * KVD;
    const uint16_t *sv = st->stage_v + (uint64_t)j->layer * st->pass_rows * KVD;

    /* scores, [G][span] */
    kv_cursor ck = {.base = pl->k, .cap = pl->capacity, .ring = pl->ring, .KVD = KVD, .D = D, .g = g};
    ck.phys = n_stored ? (pl->ring ? kv_plane_row(pl, lo) : lo) : 0;
    for (uint64_t x = 0; x < span; x++) {
        const uint16_t *kp;
        if (x < n_stored) {
            kp = kv_cursor_at(&ck);
            kv_cursor_next(&ck);
        } else {
            kp = sk + (i0 + lo + x - p0) * KVD + (uint64_t)g * D;
        }
        for (uint32_t h = 0; h < G; h++)
            sc[h * span + x] = kn->dot_f16(q + h * D, kp, D) * j->scale;
    }
    for (uint32_t h = 0; h < G; h++) {
        float *s = sc + h * span, mx = -INFINITY;
        for (uint64_t x = 0; x < span; x++)
            mx = s[x] > mx ? s[x] : mx;
        for (uint64_t x = 0; x < span; x++)
            s[x] -= mx;
        const float inv = 1.0f / kn->exp_sum(s, span);
        for (uint64_t x = 0; x < span; x++)
            s[x] *= inv;
    }
    /* o = sum_j p_j v_j */
    memset(o, 0, (uint64_t)G * D * sizeof(float));
    kv_cursor cv = ck;
    cv.base = pl->v;
    cv.phys = n_stored ? (pl->ring ? kv_plane_row(pl, lo) : lo) : 0;
    for (uint64_t x = 0; x < span; x++) {
        const uint16_t *vp;
        if (x < n_stored) {
            vp = kv_cursor_at(&cv);
            kv_cursor_next(&cv);
        } else {
            vp = sv + (i0 + lo + x - p0) * KVD + (uint64_t)g * D;
        }
        for (uint32_t h = 0; h < G; h++)
            kn->axpy_f16(o + h * D, sc[h * span + x], vp, D);
    }
    memcpy(row_of(st, FWD_O, i) + (uint64_t)g * G * D, o, (uint64_t)G * D * sizeof(float));
}

static void attn_main(void *arg, uint32_t t, uint32_t nt)
{
    (void)nt;
    attn_job *j = arg;
    const uint64_t total = (uint64_t)j->r->n * j->st->HKV;
    uint64_t lo, hi;
    while (cpu_pool_grab(&j->next, total, 1, &lo, &hi))
        for (uint64_t it = lo; it < hi; it++)
            attend_item(j, t, it);
}

static void op_attention(void *be, const fwd_rows *r, uint32_t l, uint32_t window, float scale)
{
    cpu_state *st = be;
    attn_job j = {.st = st, .r = r, .layer = l, .window = window, .scale = scale};
    atomic_init(&j.next, 0);
    uint64_t span = r->pos[r->n - 1] + 1;
    if (window && span > window)
        span = window;
    if ((uint64_t)r->n * st->QD * span < CPU_PAR_MIN_ATTN)
        attn_main(&j, 0, 1);
    else
        cpu_pool_run(st->pool, attn_main, &j);
}

/* ---- matrices ---- */

typedef struct mm_job {
    cpu_state *st;
    uint32_t n_mm, m;               /* matrices, activation rows */
    const muser_tensor *w[FWD_MAX_GROUP];
    float *dst[FWD_MAX_GROUP];
    uint64_t ldd[FWD_MAX_GROUP];
    uint64_t start[FWD_MAX_GROUP + 1]; /* cumulative rows (decode) or panels (batch) */
    const float *x;
    uint64_t ldx;
    uint64_t cols, block, share; /* decode: the smallest block of rows, 1/share of those left */
    atomic_uint_fast64_t next;
} mm_job;

/* The small-batch route's matrices: each weight row against every activation row of the pass
 * (kernels.h dot_rows: bit for bit one dot_row per input). */
static void matvec_main(void *arg, uint32_t t, uint32_t nt)
{
    (void)t;
    (void)nt;
    mm_job *j = arg;
    const cpu_kernels *kn = &j->st->kn;
    uint64_t lo, hi;
    while (cpu_pool_grab_guided(&j->next, j->start[j->n_mm], j->block, j->share, &lo, &hi)) {
        uint32_t a = 0;
        for (uint64_t g = lo; g < hi;) {
            while (g >= j->start[a + 1])
                a++;
            const muser_tensor *w = j->w[a];
            const uint64_t row = g - j->start[a];
            if (kn->dot_tile && j->m > 1) { /* several inputs: the run of rows in this matrix, tiled */
                const uint64_t end = hi < j->start[a + 1] ? hi : j->start[a + 1];
                kn->dot_tile(w->type, muser_tensor_row(w, row), w->row_bytes, (uint32_t)(end - g), j->x, j->ldx,
                             j->st->xs, j->m, j->cols, j->dst[a] + row, j->ldd[a]);
                g = end;
                continue;
            }
            kn->dot_rows(w->type, muser_tensor_row(w, row), j->x, j->ldx, j->st->xs, j->m, j->cols,
                         j->dst[a] + row, j->ldd[a]);
            g++;
        }
    }
}

static void gemm_main(void *arg, uint32_t t, uint32_t nt)
{
    (void)nt;
    mm_job *j = arg;
    cpu_state *st = j->st;
    const cpu_kernels *kn = &st->kn;
    float *tmp = st->ts[t].tmp, *panel = st->ts[t].panel;
    const uint64_t K = j->cols;
    uint64_t lo, hi;
    while (cpu_pool_grab(&j->next, j->start[j->n_mm], 1, &lo, &hi)) {
        uint32_t a = 0;
        while (lo >= j->start[a + 1])
            a++;
        const muser_tensor *w = j->w[a];
        const uint64_t r0 = (lo - j->start[a]) * CPU_PANEL;
        const uint32_t nc = (uint32_t)(w->rows - r0 < CPU_PANEL ? w->rows - r0 : CPU_PANEL);
        /* the type and shape were checked when the model was bound */
        (void)kn->unpack_panel(w->type, muser_tensor_row(w, r0), w->row_bytes, nc, K, tmp, panel);
        kn->gemm_panel(j->x, j->m, panel, K, j->dst[a] + r0, j->ldd[a], nc);
    }
}

/* out rows of each matrix for m activation rows at x (row stride ldx). */
static void run_matmul(cpu_state *st, fwd_route route, const float *x, uint64_t ldx, uint32_t m,
                       const muser_tensor *const *w, float *const *dst, const uint64_t *ldd,
                       uint32_t n_mm)
{
    mm_job j = {.st = st, .n_mm = n_mm, .m = m, .x = x, .ldx = ldx, .cols = w[0]->cols};
    j.start[0] = 0;
    for (uint32_t a = 0; a < n_mm; a++) {
        j.w[a] = w[a];
        j.dst[a] = dst[a];
        j.ldd[a] = ldd[a];
        const uint64_t units =
            route == FWD_ROUTE_DECODE ? w[a]->rows : (w[a]->rows + CPU_PANEL - 1) / CPU_PANEL;
        j.start[a + 1] = j.start[a] + units;
    }
    atomic_init(&j.next, 0);
    uint64_t weights = 0;
    for (uint32_t a = 0; a < n_mm; a++)
        weights += w[a]->rows * w[a]->cols;
    const bool alone = weights * m < CPU_PAR_MIN_WEIGHTS;
    if (route == FWD_ROUTE_DECODE) {
        for (uint32_t i = 0; i < m; i++)
            st->kn.xsums(x + i * ldx, j.cols, &st->xs[i]);
        /* guided: a thread takes 1/(2 nt) of the rows left, at least CPU_MV_MIN_ROWS */
        j.block = CPU_MV_MIN_ROWS;
        j.share = 2 * (uint64_t)cpu_pool_threads(st->pool);
        if (alone)
            matvec_main(&j, 0, 1);
        else
            cpu_pool_run(st->pool, matvec_main, &j);
    } else {
        st->kn.pack_x(x, ldx, m, j.cols, st->xpack);
        j.x = st->xpack;
        if (alone)
            gemm_main(&j, 0, 1);
        else
            cpu_pool_run(st->pool, gemm_main, &j);
    }
}

static void op_matmul(void *be, const fwd_rows *r, fwd_buf src, const fwd_matmul *mm, uint32_t n_mm)
{
    cpu_state *st = be;
    const muser_tensor *w[FWD_MAX_GROUP];
    float *dst[FWD_MAX_GROUP];
    uint64_t ldd[FWD_MAX_GROUP];
    for (uint32_t a = 0; a < n_mm; a++) {
        w[a] = mm[a].w;
        dst[a] = st->buf[mm[a].dst];
        ldd[a] = st->width[mm[a].dst];
    }
    run_matmul(st, r->route, st->buf[src], st->width[src], r->n, w, dst, ldd, n_mm);
}

static int op_lm_head(void *be, const fwd_rows *r, fwd_buf src, const muser_tensor *w, float scale,
                      float cap, bool all_rows, muser_error *err)
{
    cpu_state *st = be;
    const uint64_t V = st->V;
    if (!all_rows && r->seq && r->seq[r->n - 1] > 0) /* several sequences (never on a TP rank): each one's last row */
        for (uint32_t i = 0; i < r->n; i++)
            if (i + 1 == r->n || r->seq[i + 1] != r->seq[i]) {
                float *out = st->out_logits + (uint64_t)r->seq[i] * V;
                run_matmul(st, r->route, row_of(st, src, i), st->width[src], 1, &w, &out, &V, 1);
                if (!st->kn.logit_finish(out, V, scale, cap))
                    return muser_errorf(err, MUSER_E_NUMERIC,
                                        "cpu: non-finite logit at position %llu (fail closed: the "
                                        "session did not advance)",
                                        (unsigned long long)r->pos[i]);
            }
    if (!all_rows && r->seq && r->seq[r->n - 1] > 0)
        return MUSER_OK;
    const uint32_t first = all_rows ? 0 : r->n - 1, m = r->n - first;
    float *out = st->out_logits;
    if (st->tp && w->rows != V) {
        /* tensor parallel: this rank's vocabulary rows, gathered into whole rows on every rank
         * (before the cap and the check, so every rank decides alike) */
        const uint64_t per = w->rows;
        for (uint32_t i0 = 0; i0 < m; i0 += MUSER_STEP_MAX_ROWS) {
            const uint32_t mi = m - i0 < MUSER_STEP_MAX_ROWS ? m - i0 : MUSER_STEP_MAX_ROWS;
            float *part = st->tp_logits;
            run_matmul(st, r->route, row_of(st, src, first + i0), st->width[src], mi, &w, &part, &per, 1);
            muser_tp_gather(st->tp, st->tp_rank, part, mi, per, out + (uint64_t)i0 * V);
        }
    } else
        run_matmul(st, r->route, row_of(st, src, first), st->width[src], m, &w, &out, &V, 1);
    for (uint32_t i = 0; i < m; i++)
        if (!st->kn.logit_finish(out + (uint64_t)i * V, V, scale, cap))
            return muser_errorf(err, MUSER_E_NUMERIC,
                                "cpu: non-finite logit at position %llu (fail closed: the "
                                "session did not advance)",
                                (unsigned long long)r->pos[first + i]);
    return MUSER_OK;
}

static int op_kv_append_staged(void *be, const fwd_rows *r, muser_error *err)
{
    cpu_state *st = be;
    for (uint32_t l = 0; l < st->m->hp.n_layer; l++)
        for (uint32_t i = 0; i < r->n; i++) {
            const uint64_t off = ((uint64_t)l * st->pass_rows + i) * st->KVD;
            st->kn.f16_to_f32(st->stage_k + off, st->commit_k, st->KVD);
            st->kn.f16_to_f32(st->stage_v + off, st->commit_v, st->KVD);
            int rc = kv_plane_append(&st->pass_kv[fwd_seq(r, i)]->planes[l], r->pos[i], st->commit_k,
                                     st->commit_v, err);
            if (rc)
                return rc;
        }
    return MUSER_OK;
}

static void op_tap(void *be, const fwd_rows *r, uint32_t slot)
{
    cpu_state *st = be;
    const fwd_tap *tp = r->tap;
    for (uint32_t i = 0; i < r->n; i++)
        memcpy(tp->out + ((uint64_t)i * tp->n_layers + slot) * st->E, row_of(st, FWD_H, i),
               (uint64_t)st->E * sizeof(float));
}

static void op_reduce(void *be, const fwd_rows *r, fwd_buf buf)
{
    cpu_state *st = be;
    if (st->tp)
        muser_tp_reduce(st->tp, st->tp_rank, st->buf[buf], (size_t)r->n * st->width[buf]);
}

static const fwd_ops cpu_ops = {
    .embed = op_embed,
    .rmsnorm = op_rmsnorm,
    .matmul = op_matmul,
    .attn_stage = op_attn_stage,
    .attention = op_attention,
    .gate = op_gate,
    .swiglu = op_swiglu,
    .tail = op_tail,
    .lm_head = op_lm_head,
    .kv_append_staged = op_kv_append_staged,
    .tap = op_tap,
    .reduce = op_reduce,
};

/* ---- the vtable ---- */

/* A pass state's buffers (and the pool, when it owns it), then the state. */
static void state_free(cpu_state *st)
{
    if (!st)
        return;
    if (st->owns_pool)
        cpu_pool_free(st->pool);
    for (int b = 0; b < FWD_BUF_COUNT; b++)
        muser_free_aligned(st->buf[b]);
    muser_free_aligned(st->stage_k);
    muser_free_aligned(st->stage_v);
    free(st->rope_cos);
    free(st->rope_sin);
    free(st->inv_freq);
    for (uint32_t i = 0; st->xs && i < st->pass_rows; i++) {
        free(st->xs[i].s16);
        free(st->xs[i].s32);
        muser_free_aligned(st->xs[i].xp);
        muser_free_aligned(st->xs[i].xd);
    }
    free(st->xs);
    muser_free_aligned(st->xpack);
    for (uint32_t t = 0; st->ts && t < st->n_threads; t++) {
        muser_free_aligned(st->ts[t].tmp);
        muser_free_aligned(st->ts[t].panel);
        muser_free_aligned(st->ts[t].scores);
        muser_free_aligned(st->ts[t].o);
    }
    free(st->ts);
    free(st->logits);
    free(st->tp_logits);
    free(st->commit_k);
    free(st->commit_v);
    free(st->pos);
    free(st->seq);
    free(st->first);
    free(st->pass_kv);
    free(st);
}

static void cpu_dev_free(muser_device *d)
{
    cpu_state *st = d->be_state;
    if (!st)
        return;
    state_free(st->pf);
    state_free(st);
    d->be_state = NULL;
}

/* st's buffers for passes of st->pass_rows rows, logit_rows of them with logits in scratch (its
 * dimensions, kernels and pool set). */
static int state_alloc(cpu_state *st, uint32_t logit_rows, muser_error *err)
{
    const muser_hparams *hp = &st->m->hp;
    const uint32_t nt = (uint32_t)cpu_pool_threads(st->pool);
    const uint32_t widths[FWD_BUF_COUNT] = {
        [FWD_H] = st->E,  [FWD_X] = st->E,    [FWD_Q] = st->QD,   [FWD_K] = st->KVD,
        [FWD_V] = st->KVD, [FWD_G] = st->QD,  [FWD_O] = st->QD,   [FWD_SUB] = st->E,
        [FWD_FG] = st->F, [FWD_FU] = st->F,
    };
    const uint64_t R = st->pass_rows;
    bool ok = true;
    for (int b = 0; b < FWD_BUF_COUNT; b++) {
        st->width[b] = widths[b];
        ok &= (st->buf[b] = muser_alloc_aligned(R * widths[b] * sizeof(float))) != NULL;
    }
    const uint64_t stage = (uint64_t)hp->n_layer * R * st->KVD * sizeof(uint16_t);
    ok &= (st->stage_k = muser_alloc_aligned(stage)) != NULL;
    ok &= (st->stage_v = muser_alloc_aligned(stage)) != NULL;
    ok &= (st->rope_cos = calloc(R * (st->D / 2 + 1), sizeof(float))) != NULL;
    ok &= (st->rope_sin = calloc(R * (st->D / 2 + 1), sizeof(float))) != NULL;
    ok &= (st->inv_freq = calloc(st->D / 2 + 1, sizeof(double))) != NULL;
    ok &= (st->xs = calloc(R, sizeof *st->xs)) != NULL;
    for (uint64_t i = 0; ok && i < R; i++) {
        ok &= (st->xs[i].s16 = calloc(st->kmax / 16 + 1, sizeof(float))) != NULL;
        ok &= (st->xs[i].s32 = calloc(st->kmax / 32 + 1, sizeof(float))) != NULL;
        ok &= (st->xs[i].xp = muser_alloc_aligned(((uint64_t)st->kmax + 32) * sizeof(float))) != NULL;
        ok &= (st->xs[i].xd = muser_alloc_aligned(CPU_XD_BYTES(st->kmax))) != NULL;
    }
    ok &= (st->xpack = muser_alloc_aligned((uint64_t)st->pass_rows * st->kmax * sizeof(float))) !=
          NULL;
    ok &= (st->logits = calloc((uint64_t)logit_rows * st->V, sizeof(float))) != NULL;
    if (st->tp)
        ok &= (st->tp_logits = calloc((uint64_t)MUSER_STEP_MAX_ROWS * st->m->output.rows, sizeof(float))) != NULL;
    ok &= (st->commit_k = calloc(st->KVD, sizeof(float))) != NULL;
    ok &= (st->commit_v = calloc(st->KVD, sizeof(float))) != NULL;
    ok &= (st->pos = calloc(R, sizeof(uint64_t))) != NULL;
    ok &= (st->seq = calloc(R, sizeof(uint32_t))) != NULL;
    ok &= (st->first = calloc(R, sizeof(uint32_t))) != NULL;
    ok &= (st->pass_kv = calloc(R, sizeof *st->pass_kv)) != NULL;
    ok &= (st->ts = calloc(nt, sizeof *st->ts)) != NULL;
    st->n_threads = st->ts ? nt : 0;
    for (uint32_t t = 0; ok && t < nt; t++) {
        cpu_thread_scratch *ts = &st->ts[t];
        ok &= (ts->tmp = muser_alloc_aligned((uint64_t)CPU_PANEL * st->kmax * sizeof(float))) != NULL;
        ok &= (ts->panel = muser_alloc_aligned((uint64_t)CPU_PANEL * st->kmax * sizeof(float))) != NULL;
        ok &= (ts->scores = muser_alloc_aligned((uint64_t)st->group * st->n_ctx * sizeof(float))) != NULL;
        ok &= (ts->o = muser_alloc_aligned((uint64_t)st->group * st->D * sizeof(float))) != NULL;
    }
    if (!ok)
        return muser_errorf(err, MUSER_E_NOMEM,
                            "cpu: out of memory for a pass of %u rows (E %u, F %u, context %llu)",
                            st->pass_rows, st->E, st->F, (unsigned long long)st->n_ctx);
    for (uint32_t i = 0; i < st->D / 2; i++)
        st->inv_freq[i] = pow((double)hp->rope_theta, -2.0 * (double)i / (double)st->D);
    return MUSER_OK;
}

static int cpu_dev_init(muser_device *d, muser_error *err)
{
    const muser_model *m = d->model;
    const muser_hparams *hp = &m->hp;
    cpu_state *st = calloc(1, sizeof *st);
    if (!st)
        return muser_errorf(err, MUSER_E_NOMEM, "cpu: out of memory for the device state");
    d->be_state = st;
    st->m = m;
    st->tp = d->opts.tp;
    st->tp_rank = d->opts.tp_rank;
    st->n_ctx = d->opts.n_ctx;
    st->E = hp->n_embd;
    st->F = hp->n_ff;
    st->H = hp->n_head;
    st->HKV = hp->n_head_kv;
    st->D = hp->head_dim;
    st->QD = st->H * st->D;
    st->KVD = st->HKV * st->D;
    st->V = hp->n_vocab;
    st->group = st->H / st->HKV;
    st->kmax = st->E > st->F ? st->E : st->F;
    if (st->QD > st->kmax)
        st->kmax = st->QD;
    cpu_kernels_init(&st->kn, false);
    /* what a verify block of n rows costs: the multi-input dot unpacks each weight block once for
     * up to 4 rows, so rows go in groups of 4. At the AVX-512 level a group costs ~2 decode steps
     * (`muser bench --verify 2,3,4,5,8,12,16`, the default model and the small preset, 2 threads:
     * 1.35 / 1.65 / 1.88 / 2.59 / 4.0 / 6.3 / 8.0) and a later group's first row ~0.7; at AVX2 a
     * group ~2.5. At the VNNI levels (avx512vnni, avxvnni) the integer dot's work is per input, not shared, so a group of
     * 4 costs ~3 (Zen 4, small preset: 2.89 / 6.37 / 12.99 steps for 4 / 8 / 16 rows). Rows inside a
     * group in between, linearly. */
    const double g4 = !st->kn.simd                            ? 4.0
                      : strstr(st->kn.level, "vnni")        ? 3.0
                      : !strcmp(st->kn.level, "avx512")     ? 2.0
                                                            : 2.5;
    for (uint32_t n = 1; n <= KV_MAX_SPEC_ROWS; n++) {
        const uint32_t full = (n - 1) / 4, rest = n - 4 * full; /* rest in 1..4 */
        const double first = full ? 0.7 : 1.0;                  /* the group's first row */
        d->pass_cost[n] = full * g4 + first + (g4 - first) * (rest - 1) / 3.0;
    }

    uint32_t nt = d->opts.n_threads;
    if (nt == 0) {
        long online = sysconf(_SC_NPROCESSORS_ONLN);
        nt = online > 0 ? (uint32_t)online : 1;
    }
    int rc = cpu_pool_new(&st->pool, nt, err);
    if (rc)
        goto fail;
    st->owns_pool = true;
    /* Two pass states on one pool: the small-batch route's (a step of up to MUSER_STEP_MAX_ROWS
     * rows) and the prefill route's (a chunk of max_batch rows, at most CPU_PASS_ROWS), so that
     * steps can run between the parts of a chunk (muser_session_prefill_begin). */
    st->pass_rows = MUSER_STEP_MAX_ROWS;
    cpu_state *pf = malloc(sizeof *pf);
    if (!pf) {
        rc = muser_errorf(err, MUSER_E_NOMEM, "cpu: out of memory for the device state");
        goto fail;
    }
    *pf = *st; /* the dimensions, kernels and pool; no buffers yet */
    pf->owns_pool = false;
    pf->pass_rows = d->opts.max_batch && d->opts.max_batch < CPU_PASS_ROWS ? d->opts.max_batch : CPU_PASS_ROWS;
    st->pf = pf;
    if ((rc = state_alloc(st, MUSER_STEP_MAX_ROWS, err)) || (rc = state_alloc(pf, MUSER_PREFILL_MAX_SEQS, err)))
        goto fail;
    d->max_rows = MUSER_STEP_MAX_ROWS;
    d->part_rows = st->tp ? 0 : pf->pass_rows; /* a tensor-parallel rank runs its chunks whole (tp.c) */
    return MUSER_OK;
fail:
    cpu_dev_free(d);
    return rc;
}

static void cpu_free(muser_session *s)
{
    cpu_seq *q = s->be_state;
    if (!q)
        return;
    kv_undo_free(&q->undo);
    kv_free(&q->kv);
    free(q);
    s->be_state = NULL;
}

static int cpu_init(muser_session *s, muser_error *err)
{
    cpu_seq *q = calloc(1, sizeof *q);
    if (!q)
        return muser_errorf(err, MUSER_E_NOMEM, "cpu: out of memory for the session state");
    s->be_state = q;
    int rc = kv_init(&q->kv, &s->model->hp, s->opts.n_ctx, true, err);
    if (!rc && kv_undo_init(&q->undo, &q->kv, NULL) != MUSER_OK)
        rc = muser_errorf(err, MUSER_E_NOMEM, "cpu: out of memory for a context of %llu",
                          (unsigned long long)s->opts.n_ctx);
    if (rc)
        cpu_free(s);
    return rc;
}

/* The cache must accept exactly p0 next on every layer (a backend that was used wrongly). */
static int check_next(const muser_kv *kv, uint64_t p0, muser_error *err)
{
    for (uint32_t l = 0; l < kv->n_layer; l++)
        if (kv->planes[l].next_pos != p0)
            return muser_errorf(err, MUSER_E_CACHE_DISCONTINUITY,
                                "cpu: forward at position %llu, but layer %u's cache accepts "
                                "only position %llu",
                                (unsigned long long)p0, l,
                                (unsigned long long)kv->planes[l].next_pos);
    return MUSER_OK;
}

static void set_rope(cpu_state *st, uint32_t n)
{
    const uint32_t half = st->D / 2;
    for (uint32_t i = 0; i < n; i++)
        for (uint32_t k = 0; k < half; k++) {
            const double a = (double)st->pos[i] * st->inv_freq[k];
            st->rope_cos[(uint64_t)i * half + k] = (float)cos(a);
            st->rope_sin[(uint64_t)i * half + k] = (float)sin(a);
        }
}

/* The prefill route: chunks of max_batch rows of one session (tap: each chunk's rows of it), on
 * the device's prefill pass state. */
static int cpu_forward_tap(muser_session *s, const int32_t *tokens, uint32_t n, float *logits,
                           bool all_logits, const muser_tap *tap, muser_error *err)
{
    cpu_state *st = ((cpu_state *)s->dev->be_state)->pf;
    cpu_seq *q = s->be_state;
    const uint64_t p0 = s->n_past;
    int rc = check_next(&q->kv, p0, err);
    if (rc)
        return rc;
    if (p0 + n > s->opts.n_ctx)
        return muser_errorf(err, MUSER_E_CONTEXT_FULL,
                            "cpu: %llu tokens held + %u new exceed the context of %llu",
                            (unsigned long long)p0, n, (unsigned long long)s->opts.n_ctx);
    const fwd_route route = FWD_ROUTE_BATCH; /* one row too: muser_session_prefill's chunk tail */
    const uint32_t chunk = s->opts.max_batch < st->pass_rows ? s->opts.max_batch : st->pass_rows;
    const bool several = n > chunk;
    st->pass_kv[0] = &q->kv;
    if (several)
        kv_undo_save(&q->undo, &q->kv, n);
    for (uint32_t off = 0; off < n; off += chunk) {
        const uint32_t c = n - off < chunk ? n - off : chunk;
        for (uint32_t i = 0; i < c; i++)
            st->pos[i] = p0 + off + i;
        set_rope(st, c);
        fwd_tap chunk_tap;
        if (tap) {
            chunk_tap = *tap;
            chunk_tap.out = tap->out + (uint64_t)off * tap->n_layers * st->E;
        }
        const fwd_rows rows = {.n = c, .tokens = tokens + off, .pos = st->pos, .route = route,
                               .tap = tap ? &chunk_tap : NULL};
        int want = 0;
        if (logits && all_logits)
            want = 2;
        else if (logits && off + c == n)
            want = 1;
        st->out_logits = all_logits && logits ? logits + (uint64_t)off * st->V : st->logits;
        rc = fwd_run(&cpu_ops, st, st->m, &rows, want, err);
        if (rc) {
            if (several && off > 0)
                kv_undo_restore(&q->undo, &q->kv);
            return rc;
        }
    }
    if (logits && !all_logits)
        memcpy(logits, st->logits, (uint64_t)st->V * sizeof(float));
    return MUSER_OK;
}

static int cpu_forward(muser_session *s, const int32_t *tokens, uint32_t n, float *logits,
                       bool all_logits, muser_error *err)
{
    return cpu_forward_tap(s, tokens, n, logits, all_logits, NULL, err);
}

/* The pass's table of sessions (st->pass_kv), fwd_rows.seq / .first and the positions of rows of
 * several sessions, each one run at its n_past (session.c checked them); the number of sessions. */
static uint32_t set_runs(cpu_state *st, const muser_step_rows *rows, int *rc, muser_error *err)
{
    uint32_t n_seq = 0;
    *rc = MUSER_OK;
    for (uint32_t i = 0; i < rows->n; i++) {
        if (i == 0 || rows->seq[i] != rows->seq[i - 1]) {
            cpu_seq *q = rows->seq[i]->be_state;
            if ((*rc = check_next(&q->kv, rows->seq[i]->n_past, err)))
                return 0;
            st->pass_kv[n_seq++] = &q->kv;
            st->first[i] = i;
        } else {
            st->first[i] = st->first[i - 1];
        }
        st->seq[i] = n_seq - 1;
        st->pos[i] = rows->seq[i]->n_past + (i - st->first[i]);
    }
    return n_seq;
}

/* Layers [l0, l1) of one chunk (rows of several sessions) on the prefill pass state, which keeps
 * the chunk's rows between the parts (steps run on the other state); the positions, sessions and
 * rotations are set by the first part. The last part's logits: each session's last row. */
static int cpu_forward_part(muser_device *d, const muser_step_rows *rows, uint32_t l0, uint32_t l1, float *logits,
                            muser_error *err)
{
    cpu_state *st = ((cpu_state *)d->be_state)->pf;
    uint32_t n_seq = 0;
    int rc = MUSER_OK;
    if (l0 == 0) {
        n_seq = set_runs(st, rows, &rc, err);
        if (rc)
            return rc;
        set_rope(st, rows->n);
    }
    st->out_logits = st->logits;
    const fwd_rows r = {.n = rows->n, .tokens = rows->tokens, .pos = st->pos, .seq = st->seq, .first = st->first,
                        .route = FWD_ROUTE_BATCH};
    rc = fwd_run_layers(&cpu_ops, st, st->m, &r, l0, l1, logits ? 1 : 0, err);
    if (!rc && logits && l1 == st->m->hp.n_layer) {
        n_seq = st->seq[rows->n - 1] + 1;
        memcpy(logits, st->logits, (uint64_t)n_seq * st->V * sizeof(float));
    }
    return rc;
}

/* The small-batch route: one pass over rows of any sessions (session.c checked the runs). */
static int cpu_step(muser_device *d, const muser_step_rows *rows, float *logits, muser_error *err)
{
    cpu_state *st = d->be_state;
    const uint32_t n = rows->n;
    int rc = MUSER_OK;
    set_runs(st, rows, &rc, err);
    if (rc)
        return rc;
    set_rope(st, n);
    const fwd_rows r = {.n = n, .tokens = rows->tokens, .pos = st->pos, .seq = st->seq,
                        .first = st->first, .route = FWD_ROUTE_DECODE, .tap = rows->tap};
    /* every row's logits are computed and checked (a step's rows are all read), into scratch:
     * the caller's buffer is written only when the pass succeeded */
    st->out_logits = st->logits;
    rc = fwd_run(&cpu_ops, st, st->m, &r, 2, err);
    for (uint32_t i = 0; !rc && i < n; i++) {
        float *dst = muser_row_dst(rows, logits, i, st->V);
        if (dst)
            memcpy(dst, st->logits + (uint64_t)i * st->V, (uint64_t)st->V * sizeof(float));
    }
    if (!rc && rows->top)
        muser_top_rows(rows->top, st->logits, n, st->V);
    return rc;
}

static int cpu_checkpoint(muser_session *s, muser_error *err)
{
    cpu_seq *q = s->be_state;
    return kv_checkpoint(&q->kv, err);
}

static int cpu_rollback(muser_session *s, uint64_t n_keep, muser_error *err)
{
    cpu_seq *q = s->be_state;
    return kv_rollback(&q->kv, n_keep, err);
}

static void cpu_commit(muser_session *s)
{
    cpu_seq *q = s->be_state;
    kv_commit(&q->kv);
}

static void cpu_reset(muser_session *s)
{
    cpu_seq *q = s->be_state;
    kv_reset(&q->kv);
}

static int cpu_kv_export(const muser_session *s, uint32_t l, kv_plane *meta, uint16_t *k, uint16_t *v,
                         muser_error *err)
{
    (void)err;
    const kv_plane *pl = &((const cpu_seq *)s->be_state)->kv.planes[l];
    *meta = *pl;
    const uint64_t n = pl->capacity * pl->n_head_kv * pl->head_dim;
    memcpy(k, pl->k, n * sizeof(uint16_t));
    memcpy(v, pl->v, n * sizeof(uint16_t));
    return MUSER_OK;
}

static int cpu_kv_copy(muser_session *dst, const muser_session *src, muser_error *err)
{
    (void)err;
    kv_copy(&((cpu_seq *)dst->be_state)->kv, &((const cpu_seq *)src->be_state)->kv);
    return MUSER_OK;
}

static int cpu_kv_rows(const muser_session *s, uint32_t l, uint64_t pos0, uint32_t n, uint16_t *k,
                        uint16_t *v, muser_error *err)
{
    (void)err;
    kv_plane_read_rows(&((const cpu_seq *)s->be_state)->kv.planes[l], pos0, n, k, v);
    return MUSER_OK;
}

static int cpu_kv_import(muser_session *s, uint32_t l, const kv_plane *meta, uint64_t pos0, uint32_t n,
                          const uint16_t *k, const uint16_t *v, muser_error *err)
{
    (void)err;
    muser_kv *kv = &((cpu_seq *)s->be_state)->kv;
    kv_plane_import(&kv->planes[l], meta, pos0, n, k, v);
    kv->has_checkpoint = false;
    return MUSER_OK;
}

static const muser_backend cpu_backend = {
    .name = "cpu",
    .dev_init = cpu_dev_init,
    .dev_free = cpu_dev_free,
    .init = cpu_init,
    .free = cpu_free,
    .forward = cpu_forward,
    .step = cpu_step,
    .checkpoint = cpu_checkpoint,
    .rollback = cpu_rollback,
    .commit = cpu_commit,
    .reset = cpu_reset,
    .kv_export = cpu_kv_export,
    .kv_copy = cpu_kv_copy,
    .kv_rows = cpu_kv_rows,
    .kv_import = cpu_kv_import,
    .forward_tap = cpu_forward_tap,
    .forward_part = cpu_forward_part,
};

const muser_backend *muser_backend_cpu(void)
{
    return &cpu_backend;
}
