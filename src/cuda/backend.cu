/* backend.cu — the CUDA decode backend: device context, weight upload, KV planes, the one-token
 * route recorded once as a CUDA graph, the session vtable (muser_backend_cuda) and the bench lane.
 *
 * The op sequence per token (SPEC §1), one kernel per box:
 *   embed+entry norm+attn_norm[0] -> per layer: [Q,K,V,gate matvec, one launch]
 *   -> [QK-norm + RoPE + KV store] -> [split attention] -> [combine + sigmoid gate]
 *   -> [o_proj] -> [tail 1: h += postnorm(y); f = ffn_norm(h)] -> [gate·up matvec + SiLU]
 *   -> [down] -> [tail 2: h += postnorm(y); a = next pre-norm (output_norm after the last layer)]
 *   -> [LM head matvec + scale + soft cap] -> [argmax] (+ logits copy when asked).
 * Why not src/forward.h's op interface: it did not exist when this was written, and the device
 * route must be enqueued once into a graph with every shape fixed and the position read from
 * device memory; this sequence is that recording (route_enqueue_n: one session's row, or a
 * multi-row pass over the device's row tables). Position and KV metadata live in device memory
 * (cu_step), refreshed by one host->device copy that is the graph's first node.
 *
 * Nothing is allocated per token: buffers, graph and pinned staging are made at init. */
#include <cuda_runtime.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

extern "C" {
#include "draw.h"
#include "session.h"
#include "quant.h"
#include "tp.h"
#include "util.h"
}
#include "cuda/cuda_backend.h"
#include "cuda/ops.cuh"
#include "cuda/prefill.cuh"
#include "cuda/pfattn.cuh"
#include "cuda/tpcomm.cuh"

#define CU_TRY(call, what)                                                                          \
    do {                                                                                            \
        cudaError_t e_ = (call);                                                                    \
        if (e_ != cudaSuccess)                                                                      \
            return muser_errorf(err, MUSER_E_BACKEND, "cuda: %s: %s", what, cudaGetErrorString(e_)); \
    } while (0)

#define CU_STAGE_BYTES ((size_t)64 << 20)

/* Device copy of one layer's weights. Vectors are f32. */
typedef struct cu_layer {
    mv_mat q, k, v, gate, o, ffn_gate, ffn_up, ffn_down;
    mv_mat qkg;                /* q | k | gate [| v] as one stacked Q4_KT matrix (data NULL: none) */
    bool qkg_v;                /* v is the stack's last part */
    float *attn_norm, *q_norm, *k_norm, *post_attn_norm, *ffn_norm, *post_ffw_norm;
} cu_layer;

/* One layer's KV plane of a session. */
typedef struct cu_plane {
    uint16_t *kp, *vp;         /* KV plane storage (f16), layout per kv.h */
    uint16_t *save_k, *save_v; /* ring rows saved at a checkpoint */
    cu_attn_geom geom;
} cu_plane;

/* The matvec input sites of a layer. Each has its own tensor-core digit buffers (xm, x6), so the
 * buffer a matvec reads was last read a whole layer earlier, across kernels that do not trigger early
 * (QK-norm/RoPE, attention, combine): no kernel still running when a matvec launches early can hold
 * its x in L1 (cu_ldx reads x non-coherently; see there). That is what lets the tails trigger early. */
enum { XS_STACK, XS_OPROJ, XS_GU, XS_DOWN, XS_N };

typedef struct cu_pf cu_pf;
static void pf_free(cu_pf *pf);

/* Rows of one multi-row pass of the small-batch route (a step with more runs as several passes). */
#define CU_ROWS_MAX 16u

/* A pass's draws (muser_draw, cu_draw): each row's uniform, temperature (0: no draw), top-p and min-p's
 * cut in, its token out */
typedef struct cu_draw_io {
    double u[CU_ROWS_MAX];
    float temp[CU_ROWS_MAX], top_p[CU_ROWS_MAX], cut[CU_ROWS_MAX];
    int32_t id[CU_ROWS_MAX];
} cu_draw_io;

typedef struct cu_ctx {
    const muser_model *m;
    int device, n_sm;
    cudaStream_t st;
    uint8_t *weights;          /* one allocation for every matrix and vector */
    size_t weights_bytes;
    uint64_t read_bytes;       /* weight bytes the route reads per token */
    cu_layer *layers;
    mv_mat emb, out;
    float *out_norm;
    uint64_t n_ctx;            /* the largest context a session may have (the attention partials' size) */
    /* activations, each [CU_ROWS_MAX][its width] (row r of a multi-row pass at + r·width; a
     * session's one-row graph uses row 0) */
    float *h, *a, *qkvg, *attn_o, *y, *ffn, *ffn_g, *ffn_u, *logits, *part_ml, *part_acc, *am_v;
    size_t n_part;             /* attention partial entries of one row */
    double *rope_inv;          /* head_dim/2 RoPE angle rates for the fused split kernel (NULL: it computes them) */
    int32_t *am_i, *d_token, *d_nonfinite; /* [CU_ROWS_MAX] argmax token and non-finite count per row */
    float *d_best;             /* [CU_ROWS_MAX] the argmax's logit (after d_nonfinite: one copy takes all three) */
    unsigned long long *d_topk_part, *d_topk; /* cu_topk's scratch and keys [CU_ROWS_MAX][CU_TOPK] */
    unsigned long long *h_topk; /* pinned [CU_ROWS_MAX][CU_TOPK] */
    cu_draw_io *h_draw, *d_draw; /* a pass's draws (h_draw pinned) */
    void *d_draw_scratch;       /* cu_draw's scratch */
    float *h_logits;           /* pinned [CU_ROWS_MAX][V] */
    float *step_logits;        /* [MUSER_STEP_MAX_ROWS][V] a step's rows, copied out when all succeeded */
    int32_t *h_flags;          /* pinned: a pass's (or one row's, r = 0) [r] row r's argmax, [CU_ROWS_MAX + r]
                                * its non-finite count, [2·CU_ROWS_MAX + r] the argmax's logit's bits */
    uint32_t rn;               /* rows of the pass being enqueued: 1 for a session's graph */
    uint32_t dig_rs;           /* bytes between the rows' matvec input digits (either layout) */
    /* the multi-row pass (rows_*: its tables; g_rows[n]: its graph for n rows, recorded at first use) */
    uint8_t *d_rows, *h_rows;  /* [CU_ROWS_MAX] cu_step blocks of row_bytes, then kp[n_layer][CU_ROWS_MAX], vp[…] */
    size_t row_bytes, rows_bytes;
    cu_attn_geom *rows_geom;   /* [n_layer] the geometry of every session the pass takes (rows_ok) */
    cu_ring_mask rows_ring;    /* which of those layers are rings (cu_stage_commit) */
    uint16_t *stage_k, *stage_v; /* [n_layer][CU_ROWS_MAX][HKV·D] the pass's staged K/V (cu_rows.sk) */
    uint64_t rows_n_ctx;       /* the context of those sessions (the device's) */
    cudaGraphExec_t g_rows[CU_ROWS_MAX + 1];
    /* the hidden-state tap (muser_tap): graphs that also copy the residual rows of tap_layers out
     * after their layers, recorded at first use for one layer list (tap_gen counts the lists) */
    float *d_tap, *h_tap;      /* [CU_ROWS_MAX][tap_nl][E] a tapped pass's rows (h_tap pinned) */
    uint32_t tap_layers[MUSER_TAP_MAX_LAYERS], tap_nl;
    uint64_t tap_gen;
    cudaGraphExec_t g_rows_tap[CU_ROWS_MAX + 1];
    uint64_t g_rows_tap_gen[CU_ROWS_MAX + 1];
    bool profile;              /* MUSER_CUDA_PROFILE set: each row count's first pass is profiled (profile_pass) */
    uint32_t rows_profiled;    /* bit n: a pass of n rows was */
    bool gate_up_paired;       /* gate and up in one launch writing silu(g)·u (both Q4_KT, or both general) */
    uint8_t *xm;               /* mmq_prep output of the current matvec input (the Q4_KT matrices) */
    uint8_t *x6;               /* mmq6_prep output of the current matvec input (the Q6_KT matrices) */
    uint8_t *xm_site[XS_N], *x6_site[XS_N]; /* xm and x6 per input site (set_site), in one allocation */
    /* the dense multi-row layouts of the current matvec input (xd: mmqd.cuh, Q4_KT; xd6: mmqd6.cuh,
     * Q6_KT), NULL where the site's matrices read the one-row layouts (set_site) */
    uint8_t *xd, *xd6;
    uint8_t *xd_site[XS_N], *xd6_site[XS_N]; /* per input site, in xm_site[0]'s allocation */
    int site;                  /* the matvec input site being enqueued (XS_*, set_site) */
    bool tail_trigger;         /* the tails (and the embedding entry) let the matvec after them launch at their
                                * start: only where every matvec input is a per-site digit buffer (tc_inputs_only) */
    bool prep_pdl;             /* the preps launch as programmatic dependents (the same condition) */
    bool tail_wide;            /* the tails on 16 blocks of 512 where the device places them, else 8 of 256 */
    uint32_t skip;             /* MUSER_CUDA_SKIP: op families left out of the route (timing only; the
                                * logits are then meaningless), a mask of 1 << SK_* */
    double upload_s;
    cu_pf *pf;                 /* the prefill route's workspace, made at the first prefill (pf_ws) */
    /* tensor parallel (tp.h): rank tp_rank of tp_n, its matrices that rank's shard; the partial sums
     * of o_proj and ffn_down are all-reduced and the LM head's vocabulary rows gathered, through
     * NCCL (nccl: ranks on GPUs of their own, recorded in the graphs) or through the host (tp: ranks
     * sharing one GPU, a test configuration; the pass then waits on the host mid-way: eager) */
    uint32_t tp_n, tp_rank;
    muser_tp_comm *tp;
    void *nccl;
    float *h_tp;               /* pinned staging of the host reduce, h_tp_cap floats */
    size_t h_tp_cap;
    bool eager;                /* no graphs: each pass enqueued as it runs (the host reduce) */
    cudaError_t tp_err;        /* the first collective that failed since the pass began (tp_failed) */
} cu_ctx;

/* A session on the device: its KV planes, their host metadata, its per-token device state and
 * the graph recorded over the device's weights and activations and this session's planes. */
typedef struct cu_seq {
    cu_ctx *c;
    cu_plane *pl;              /* [n_layer] */
    uint8_t *kv_mem;           /* every plane, one allocation, zero-filled */
    size_t kv_bytes;
    void *d_step;              /* cu_step + meta[n_layer] */
    void *h_step;              /* pinned mirror */
    size_t step_bytes;
    muser_kv kv;               /* host metadata (no storage) */
    kv_plane *meta_step;       /* [n_layer] plane metadata before the current token (decode_one undo) */
    kv_plane *meta_call;       /* [n_layer] before the current call (forward / step undo) */
    uint16_t *ring_undo;       /* a copy of every SWA ring (K then V, layer order), taken before a
                                * multi-row call that wraps a ring over stored rows */
    size_t ring_bytes;         /* bytes of all rings (= of ring_undo) */
    cudaGraphExec_t g_fwd, g_bench; /* g_bench: recorded by the bench lane only */
    cudaGraphExec_t g_tap;     /* g_fwd with the tap (cu_ctx.tap_layers of generation g_tap_gen) */
    uint64_t g_tap_gen;
    uint64_t n_ctx;
} cu_seq;

/* Op families MUSER_CUDA_SKIP can leave out, to time each one inside the graph by difference. */
enum { SK_QKVG, SK_ROPE, SK_ATTN, SK_OPROJ, SK_TAIL, SK_GU, SK_PREP, SK_DOWN, SK_HEAD, SK_N };
static const char *const sk_names[SK_N] = {"qkvg", "rope", "attn", "oproj", "tail", "gu", "prep", "down", "head"};
#define SKIP(c, f) (((c)->skip >> (f)) & 1u)

/* Blocks per KV head of a plane's attention (at least 64 positions each): more blocks keep more
 * K/V loads in flight on long FULL planes; the combine merges them with threads over splits. */
#define CU_ATT_MAX_SPLIT 256

static uint32_t mv_type_of(uint32_t ggml)
{
    switch (ggml) {
    case GGML_TYPE_F32: return MV_T_F32;
    case GGML_TYPE_F16: return MV_T_F16;
    case GGML_TYPE_BF16: return MV_T_BF16;
    case GGML_TYPE_Q8_0: return MV_T_Q8_0;
    case GGML_TYPE_Q4_K: return MV_T_Q4_K;
    case GGML_TYPE_Q6_K: return MV_T_Q6_K;
    default: return 0xFFFFFFFFu;
    }
}

/* ---- upload ---------------------------------------------------------------------------------- */
typedef struct uploader {
    cu_ctx *c;
    uint8_t *pinned[2];
    uint8_t *dev_stage[2];
    cudaEvent_t done[2];
    int cur;
    size_t off;                /* next free byte in c->weights */
    muser_progress prog;
    uint64_t sent;
} uploader;

static size_t align256(size_t x) { return (x + 255) & ~(size_t)255; }

/* The pinned double buffer (up_close frees whatever up_open made, also after a failure). */
static int up_open(uploader *u, cu_ctx *c, muser_error *err)
{
    memset(u, 0, sizeof *u);
    u->c = c;
    for (int i = 0; i < 2; i++) {
        CU_TRY(cudaMallocHost((void **)&u->pinned[i], CU_STAGE_BYTES), "pinned staging");
        CU_TRY(cudaMalloc((void **)&u->dev_stage[i], CU_STAGE_BYTES), "device staging");
        CU_TRY(cudaEventCreate(&u->done[i]), "event");
        CU_TRY(cudaEventRecord(u->done[i], c->st), "event");
    }
    return MUSER_OK;
}

static void up_close(uploader *u)
{
    for (int i = 0; i < 2; i++) {
        if (u->pinned[i]) cudaFreeHost(u->pinned[i]);
        if (u->dev_stage[i]) cudaFree(u->dev_stage[i]);
        if (u->done[i]) cudaEventDestroy(u->done[i]);
    }
    memset(u, 0, sizeof *u);
}

/* Copy n bytes at src (host) to dst (device) through the pinned double buffer; repack `type`
 * blocks when dst is a repacked layout (rows [r0..) of a matrix of total_blk blocks). */
static int up_chunk(uploader *u, const uint8_t *src, size_t n, uint8_t *dst, uint32_t type, size_t first_blk,
                    size_t total_blk, uint32_t nb, muser_error *err)
{
    const int i = u->cur;
    u->cur ^= 1;
    CU_TRY(cudaEventSynchronize(u->done[i]), "upload wait");
    memcpy(u->pinned[i], src, n);
    if (mv_repacked(type)) {
        CU_TRY(cudaMemcpyAsync(u->dev_stage[i], u->pinned[i], n, cudaMemcpyHostToDevice, u->c->st), "upload copy");
        const size_t nblk = n / mv_block_bytes(type);
        const unsigned g = (unsigned)((nblk + 255) / 256);
        if (type == MV_T_Q6_K) mv_repack_q6k<<<g, 256, 0, u->c->st>>>(u->dev_stage[i], dst, nblk, first_blk, total_blk);
        else if (type == MV_T_Q8_0) mv_repack_q80<<<g, 256, 0, u->c->st>>>(u->dev_stage[i], dst, nblk, first_blk, total_blk);
        else if (type == MV_T_Q4_KT) { /* whole 16-row tiles: a thread per (tile, block, row pair) */
            const uint32_t rows = (uint32_t)(nblk / nb);
            mmq_repack_q4k<<<(unsigned)((nblk / 2 + 255) / 256), 256, 0, u->c->st>>>(u->dev_stage[i], dst, rows, nb,
                                                                                    first_blk / nb / 16);
        } else if (type == MV_T_Q6_KT) {
            const uint32_t rows = (uint32_t)(nblk / nb);
            mmq6_repack_q6k<<<(unsigned)((nblk / 2 + 255) / 256), 256, 0, u->c->st>>>(u->dev_stage[i], dst, rows, nb,
                                                                                     first_blk / nb / 16);
        }
        CU_TRY(cudaGetLastError(), "repack");
    } else {
        CU_TRY(cudaMemcpyAsync(dst, u->pinned[i], n, cudaMemcpyHostToDevice, u->c->st), "upload copy");
    }
    CU_TRY(cudaEventRecord(u->done[i], u->c->st), "upload event");
    u->sent += n;
    muser_progress_update(&u->prog, u->sent);
    return MUSER_OK;
}

/* tc: give a Q4_K or Q6_K matrix the tensor-core layout where its shape allows (whole 16-row
 * tiles); the general path's layout otherwise, and for the embedding, whose rows are read one
 * element at a time (mv_elem). */
static int up_matrix(uploader *u, const muser_tensor *t, mv_mat *out, bool tc, muser_error *err)
{
    uint32_t type = mv_type_of(t->type);
    if (tc && type == MV_T_Q4_K && mmq_shape_ok((uint32_t)t->rows, (uint32_t)t->cols)) type = MV_T_Q4_KT;
    if (tc && type == MV_T_Q6_K && mmq6_shape_ok((uint32_t)t->rows, (uint32_t)t->cols)) type = MV_T_Q6_KT;
    if (type == 0xFFFFFFFFu)
        return muser_errorf(err, MUSER_E_UNSUPPORTED, "cuda: tensor %s: type %u has no CUDA matvec", t->name, t->type);
    const uint32_t blk_elems = mv_block_elems(type);
    if (t->cols % blk_elems != 0 || t->rows > 0xFFFFFFFFu)
        return muser_errorf(err, MUSER_E_UNSUPPORTED, "cuda: tensor %s: %llu columns (the CUDA matvec needs a multiple of %u)",
                            t->name, (unsigned long long)t->cols, blk_elems);
    const size_t bytes = (size_t)t->row_bytes * t->rows;
    out->type = type;
    out->rows = (uint32_t)t->rows;
    out->cols = (uint32_t)t->cols;
    out->data = u->c->weights + u->off;
    u->off = align256(u->off + bytes);
    size_t rows_per = CU_STAGE_BYTES / t->row_bytes > 0 ? CU_STAGE_BYTES / t->row_bytes : 1;
    if (type == MV_T_Q4_KT || type == MV_T_Q6_KT) rows_per = rows_per / 16 * 16; /* whole tiles (CU_STAGE_BYTES holds ≥ 16 rows) */
    const size_t blk_per_row = t->row_bytes / (mv_repacked(type) ? mv_block_bytes(type) : 1);
    for (size_t r = 0; r < t->rows; r += rows_per) {
        const size_t nr = r + rows_per <= t->rows ? rows_per : t->rows - r;
        const uint8_t *src = (const uint8_t *)t->data + r * t->row_bytes;
        uint8_t *dst = mv_repacked(type) ? (uint8_t *)out->data : (uint8_t *)out->data + r * t->row_bytes;
        int rc = up_chunk(u, src, nr * t->row_bytes, dst, type, r * blk_per_row, (size_t)t->rows * blk_per_row,
                          (uint32_t)(t->cols / 256), err);
        if (rc) return rc;
    }
    return MUSER_OK;
}

/* The rows' exponent bytes of a Q4_KT matrix the gate·up pair reads (mmi.cuh), after its units in
 * the stream's order: 256-aligned room for them follows the matrix (tensor_dev_bytes). */
static int up_rexp(uploader *u, mv_mat *m, muser_error *err)
{
    if (m->type != MV_T_Q4_KT) return MUSER_OK;
    uint8_t *e = u->c->weights + u->off;
    u->off = align256(u->off + m->rows);
    mmi_rexp_kernel<<<(m->rows + 255) / 256, 256, 0, u->c->st>>>(m->data, m->rows, m->cols / 256, e);
    CU_TRY(cudaGetLastError(), "row exponents");
    m->rexp = e;
    return MUSER_OK;
}

/* A vector (norm weights) as f32, any stored type. */
static int up_vector(uploader *u, const muser_tensor *t, float **out, muser_error *err)
{
    *out = NULL;
    if (!t->data) return MUSER_OK;
    const uint64_t n = t->cols * t->rows;
    float *tmp = (float *)malloc(n * sizeof(float));
    if (!tmp) return muser_errorf(err, MUSER_E_NOMEM, "cuda: out of memory for %s", t->name);
    int rc = quant_dequantize_row(t->type, t->data, tmp, n);
    if (rc) {
        free(tmp);
        return muser_errorf(err, (muser_status)rc, "cuda: cannot read vector %s", t->name);
    }
    *out = (float *)(u->c->weights + u->off);
    u->off = align256(u->off + n * sizeof(float));
    rc = up_chunk(u, (const uint8_t *)tmp, n * sizeof(float), (uint8_t *)*out, MV_T_F32, 0, 0, 0, err);
    free(tmp);
    return rc;
}

static size_t tensor_dev_bytes(const muser_tensor *t)
{
    if (!t->data) return 0;
    if (t->rows == 1 || t->cols == t->rows * t->cols) /* vectors become f32 */
        return align256(t->cols * t->rows * sizeof(float));
    return align256((size_t)t->row_bytes * t->rows);
}

/* q, k, gate (and v when it too is Q4_KT) as one matrix over their consecutive tiles; the
 * outputs land in the same order in c->qkvg (q | k | gate | v). */
static void stack_qkg(cu_layer *D, bool gate)
{
    memset(&D->qkg, 0, sizeof D->qkg);
    D->qkg_v = false;
    const mv_mat *parts[4] = {&D->q, &D->k, gate ? &D->gate : &D->v, gate ? &D->v : NULL};
    mv_mat s = D->q;
    if (s.type != MV_T_Q4_KT) return;
    int n = 1;
    for (int i = 1; i < 4 && parts[i]; i++) {
        const mv_mat *m = parts[i];
        const uint8_t *end = s.data + (size_t)s.rows * (s.cols / 256) * mv_block_bytes(MV_T_Q4_KT);
        if (m->type != MV_T_Q4_KT || m->cols != s.cols || m->data != end) break;
        s.rows += m->rows;
        n++;
    }
    if (n < 2 || (gate && n < 3)) return; /* q and k (and gate) at least: else separate launches */
    D->qkg = s;
    D->qkg_v = n == (gate ? 4 : 3);
}

static int upload_weights(cu_ctx *c, muser_error *err)
{
    const muser_model *m = c->m;
    const muser_hparams *hp = &m->hp;
    /* the LM head has its own copy even where the file ties it to the embedding: the head takes
     * the tensor-core layout, the embedding the general one */
    size_t total = tensor_dev_bytes(&m->tok_embd) + tensor_dev_bytes(&m->output_norm) + tensor_dev_bytes(&m->output);
    for (uint32_t l = 0; l < hp->n_layer; l++) {
        const muser_layer *L = &m->layers[l];
        const muser_tensor *ts[] = {&L->attn_norm, &L->attn_q, &L->attn_k, &L->attn_v, &L->attn_gate,
                                    &L->attn_q_norm, &L->attn_k_norm, &L->attn_output, &L->post_attention_norm,
                                    &L->ffn_norm, &L->ffn_gate, &L->ffn_up, &L->ffn_down, &L->post_ffw_norm};
        for (size_t i = 0; i < sizeof ts / sizeof ts[0]; i++) total += tensor_dev_bytes(ts[i]);
        total += align256(L->ffn_gate.rows) + align256(L->ffn_up.rows); /* up_rexp */
    }
    c->weights_bytes = total;
    CU_TRY(cudaMalloc((void **)&c->weights, total), "weights allocation");
    uploader u;
    int rc = up_open(&u, c, err);
    if (rc) {
        up_close(&u);
        return rc;
    }
    const double t0 = muser_now_s();
    muser_progress_begin(&u.prog, "cuda upload", total);
    rc = up_matrix(&u, &m->tok_embd, &c->emb, false, err);
    if (!rc) rc = up_vector(&u, &m->output_norm, &c->out_norm, err);
    if (!rc) rc = up_matrix(&u, &m->output, &c->out, true, err);
    c->read_bytes = (uint64_t)m->output.row_bytes * m->output.rows + m->output_norm.cols * 4;
    for (uint32_t l = 0; !rc && l < hp->n_layer; l++) {
        const muser_layer *L = &m->layers[l];
        cu_layer *D = &c->layers[l];
        if (!rc) rc = up_vector(&u, &L->attn_norm, &D->attn_norm, err);
        /* q, k, gate, v in this order: the Q4_KT ones lie back to back (whole 16-row tiles are
         * multiples of 256 bytes), one stacked matrix for one launch (stack_qkg) */
        if (!rc) rc = up_matrix(&u, &L->attn_q, &D->q, true, err);
        if (!rc) rc = up_matrix(&u, &L->attn_k, &D->k, true, err);
        if (!rc && hp->attn_gate) rc = up_matrix(&u, &L->attn_gate, &D->gate, true, err);
        if (!rc) rc = up_matrix(&u, &L->attn_v, &D->v, true, err);
        if (!rc) stack_qkg(D, hp->attn_gate);
        if (!rc && hp->qk_norm) rc = up_vector(&u, &L->attn_q_norm, &D->q_norm, err);
        if (!rc && hp->qk_norm) rc = up_vector(&u, &L->attn_k_norm, &D->k_norm, err);
        if (!rc) rc = up_matrix(&u, &L->attn_output, &D->o, true, err);
        if (!rc && hp->sandwich) rc = up_vector(&u, &L->post_attention_norm, &D->post_attn_norm, err);
        if (!rc) rc = up_vector(&u, &L->ffn_norm, &D->ffn_norm, err);
        if (!rc) rc = up_matrix(&u, &L->ffn_gate, &D->ffn_gate, true, err);
        if (!rc) rc = up_rexp(&u, &D->ffn_gate, err);
        if (!rc) rc = up_matrix(&u, &L->ffn_up, &D->ffn_up, true, err);
        if (!rc) rc = up_rexp(&u, &D->ffn_up, err);
        if (!rc) rc = up_matrix(&u, &L->ffn_down, &D->ffn_down, true, err);
        if (!rc && hp->sandwich) rc = up_vector(&u, &L->post_ffw_norm, &D->post_ffw_norm, err);
        const muser_tensor *ts[] = {&L->attn_norm, &L->attn_q, &L->attn_k, &L->attn_v, &L->attn_gate,
                                    &L->attn_q_norm, &L->attn_k_norm, &L->attn_output, &L->post_attention_norm,
                                    &L->ffn_norm, &L->ffn_gate, &L->ffn_up, &L->ffn_down, &L->post_ffw_norm};
        for (size_t i = 0; i < sizeof ts / sizeof ts[0]; i++)
            if (ts[i]->data) c->read_bytes += (uint64_t)ts[i]->row_bytes * ts[i]->rows;
    }
    cudaError_t e = cudaStreamSynchronize(c->st);
    muser_progress_finish(&u.prog);
    up_close(&u);
    if (!rc && e != cudaSuccess) rc = muser_errorf(err, MUSER_E_BACKEND, "cuda: upload: %s", cudaGetErrorString(e));
    c->upload_s = muser_now_s() - t0;
    return rc;
}

/* ---- the route ------------------------------------------------------------------------------- */
/* Profiling: events between op families of one non-graph token. */
enum { PF_EMBED, PF_QKVG, PF_ROPE, PF_ATTN, PF_OPROJ, PF_TAIL, PF_FFN_UP, PF_DOWN, PF_HEAD, PF_N };
static const char *pf_name[PF_N] = {"embed+norm", "qkvg matvec", "qk-norm/rope/store", "attention+combine",
                                    "o_proj matvec", "tails", "gate/up+silu", "down matvec", "lm head+argmax"};
typedef struct profiler {
    cudaEvent_t ev[1024];
    int fam[1024];
    int n;
} profiler;

static void pf_mark(profiler *p, cudaStream_t st, int fam)
{
    if (!p || p->n >= 1024) return;
    cudaEventRecord(p->ev[p->n], st);
    p->fam[p->n++] = fam;
}

/* One segment of a matvec launch. */
/* os: floats between the rows' outputs in a multi-row pass */
static void seg_set(mv_launch *L, const mv_mat *a, float *out, uint32_t op, uint32_t R, uint32_t os = 0)
{
    mv_seg *s = &L->seg[L->n_seg++];
    memset(s, 0, sizeof *s);
    s->a = *a;
    s->out = out;
    s->op = op;
    s->os = os;
    s->warp_begin = L->n_warps;
    L->n_warps += (a->rows + R - 1) / R;
}

/* The calling thread's current device is c's (a rank's thread, or a caller that made contexts on
 * several GPUs). */
static void bind_dev(const cu_ctx *c)
{
    int cur = -1;
    if (cudaGetDevice(&cur) != cudaSuccess || cur != c->device) cudaSetDevice(c->device);
}

/* The host reduce's staging: at least n floats (grown only between passes of the eager mode). */
static cudaError_t tp_host(cu_ctx *c, size_t n)
{
    if (c->h_tp_cap >= n) return cudaSuccess;
    cudaError_t e = cudaStreamSynchronize(c->st);
    if (!e && c->h_tp) e = cudaFreeHost(c->h_tp);
    c->h_tp = NULL;
    c->h_tp_cap = 0;
    if (!e) e = cudaMallocHost((void **)&c->h_tp, n * sizeof(float));
    if (!e) c->h_tp_cap = n;
    return e;
}

/* A collective's result, kept (the first failure) for the pass to report: the passes enqueue or
 * capture their collectives without a way to fail at that point. */
static void tp_note(cu_ctx *c, cudaError_t e)
{
    if (e && !c->tp_err) c->tp_err = e;
}

/* The failure tp_note kept since the last call (cleared), or success. */
static cudaError_t tp_failed(cu_ctx *c)
{
    const cudaError_t e = c->tp_err;
    c->tp_err = cudaSuccess;
    return e;
}

/* Tensor parallel: buf[0..count) = its sum over the ranks (o_proj's and ffn_down's partial sums).
 * The host reduce joins the other ranks even when its copy failed (passing no buffer: then every
 * rank's reduce fails, and none waits forever or reads a garbage sum). */
static void tp_reduce(cu_ctx *c, cudaStream_t st, float *buf, size_t count)
{
    if (c->tp_n < 2) return;
    if (c->nccl) {
        tp_note(c, cu_tp_all_reduce(c->nccl, buf, count, st));
        return;
    }
    cudaError_t e = tp_host(c, count);
    if (!e) e = cudaMemcpyAsync(c->h_tp, buf, count * sizeof(float), cudaMemcpyDeviceToHost, st);
    if (!e) e = cudaStreamSynchronize(st);
    if (!muser_tp_reduce(c->tp, c->tp_rank, e ? NULL : c->h_tp, count) && !e) e = cudaErrorUnknown; /* a peer's */
    if (!e) e = cudaMemcpyAsync(buf, c->h_tp, count * sizeof(float), cudaMemcpyHostToDevice, st);
    tp_note(c, e);
}

/* Tensor parallel: the LM head's rows rows of full (row i at full + i·stride), of which this rank
 * wrote its per logits at tp_rank·per, become whole on every rank. */
static cudaError_t tp_gather(cu_ctx *c, cudaStream_t st, float *full, uint32_t rows, size_t per, size_t stride)
{
    if (c->tp_n < 2) return cudaSuccess;
    if (c->nccl) {
        const cudaError_t e = cu_tp_all_gather_rows(c->nccl, full, rows, per, stride, c->tp_rank, st);
        tp_note(c, e);
        return e;
    }
    const size_t part = (size_t)rows * per, whole = part * c->tp_n;
    cudaError_t e = tp_host(c, part + whole);
    float *h_part = c->h_tp, *h_full = c->h_tp + part;
    if (!e)
        e = cudaMemcpy2DAsync(h_part, per * sizeof(float), full + (size_t)c->tp_rank * per, stride * sizeof(float),
                              per * sizeof(float), rows, cudaMemcpyDeviceToHost, st);
    if (!e) e = cudaStreamSynchronize(st);
    if (!muser_tp_gather(c->tp, c->tp_rank, e ? NULL : h_part, rows, per, h_full) && !e) /* [rows][tp_n·per] */
        e = cudaErrorUnknown; /* a peer's */
    if (!e)
        e = cudaMemcpy2DAsync(full, stride * sizeof(float), h_full, per * c->tp_n * sizeof(float),
                              per * c->tp_n * sizeof(float), rows, cudaMemcpyHostToDevice, st);
    tp_note(c, e);
    return e;
}

/* The tensor-core digit layouts of the current matvec input that its producer already wrote. */
#define DIG_XM 1u /* Q4_KT's, in c->xm */
#define DIG_X6 2u /* Q6_KT's, in c->x6 */
#define DIG_XD 4u /* the dense multi-row Q4_KT layout, in c->xd */
#define DIG_XD6 8u /* the dense multi-row Q6_KT layout, in c->xd6 */
#define DIG_XI 16u /* the gate·up pair's exact-integer layout (mmi.cuh), in c->xm */

/* x's digits for the c->rn rows of the pass (row r's x at + r·xst floats), one launch */
template <typename WR>
static void prep_rows(cu_ctx *c, cudaStream_t st, const float *x, uint8_t *buf, uint32_t K, uint32_t xst)
{
    mmq_prep_launch_t<WR>(st, x, buf, K, c->prep_pdl, c->rn, xst, c->dig_rs);
}

/* One matvec launch over the c->rn rows of the pass (row r's x at + r·xst floats, its outputs at
 * + r·seg.os): a Q6_KT or Q4_KT launch per segment on the tensor cores, every row in it (after a
 * prep of x into their digit layout unless `ready` says the producer of x wrote it: DIG_* bits),
 * else the general path (matvec.cuh) over all segments at once, a launch per row. */
static void mv_go(cu_ctx *c, cudaStream_t st, const mv_launch *L, const float *x, uint32_t ready, uint32_t xst = 0)
{
    const uint32_t t = L->seg[0].a.type;
    if (t == MV_T_Q6_KT) {
        /* several rows: the dense kernel (mmqd6.cuh) on their digits in its layout */
        const uint32_t K = L->seg[0].a.cols;
        const bool dense = c->rn > 1 && c->xd6;
        if (dense && !(ready & DIG_XD6) && !SKIP(c, SK_PREP)) prep_rows<mmqd6_prep>(c, st, x, c->xd6, K, xst);
        if (!dense && !(ready & DIG_X6) && !SKIP(c, SK_PREP)) prep_rows<mmq_prep_q6>(c, st, x, c->x6, K, xst);
        for (uint32_t i = 0; i < L->n_seg; i++) {
            const mv_seg *g = &L->seg[i];
            mmq6_args A;
            memset(&A, 0, sizeof A);
            A.a = g->a.data;
            A.rows = g->a.rows;
            A.K = K;
            A.x = dense ? c->xd6 : c->x6;
            A.out = g->out;
            A.op = g->op;
            A.scale = g->scale;
            A.cap = g->cap;
            A.nx = c->rn;
            A.xs = c->dig_rs;
            A.os = g->os;
            if (dense && c->site == XS_DOWN) mmqd6_launch_down(A, st, true);
            else if (dense) mmqd6_launch_auto(A, st, true);
            else if (c->site == XS_DOWN) mmq6_launch_down(A, st, true);
            else mmq6_launch_auto(A, st, true);
        }
        return;
    }
    if (t == MV_T_Q4_KT && L->seg[0].op == MV_OP_SILU_MUL) {
        /* gate·up (a launch of its own, its rows' exponent bytes made at upload: up_rexp): exact
         * integers per block summed on a grid, a kernel shape per row count (mmi.cuh) */
        const mv_seg *g = &L->seg[0];
        const uint32_t K = g->a.cols;
        if (!(ready & DIG_XI) && !SKIP(c, SK_PREP)) mmi_prep_launch(st, x, c->xm, K, c->prep_pdl, c->rn, xst, c->dig_rs);
        mmi_args A;
        memset(&A, 0, sizeof A);
        A.a = g->a.data;
        A.b = g->b.data;
        A.ea = g->a.rexp;
        A.eb = g->b.rexp;
        A.rows = g->a.rows;
        A.K = K;
        A.x = c->xm;
        A.xs = c->dig_rs;
        A.nx = c->rn;
        A.out = g->out;
        A.os = g->os;
        mmi_pair_launch(A, c->n_sm, st, true);
        return;
    }
    if (t == MV_T_Q4_KT) {
        /* one matrix a segment: one row on mmq.cuh's kernels, several on the dense ones (mmqd.cuh),
         * each on x's digits in its layout */
        const uint32_t K = L->seg[0].a.cols;
        const bool dense = c->rn > 1 && c->xd;
        if (dense && !(ready & DIG_XD) && !SKIP(c, SK_PREP)) prep_rows<mmqd_prep>(c, st, x, c->xd, K, xst);
        if (!dense && !(ready & DIG_XM) && !SKIP(c, SK_PREP)) prep_rows<mmq_prep_q4>(c, st, x, c->xm, K, xst);
        for (uint32_t i = 0; i < L->n_seg; i++) {
            const mv_seg *g = &L->seg[i];
            mmq_args A;
            memset(&A, 0, sizeof A);
            A.a = g->a.data;
            A.rows = g->a.rows;
            A.K = K;
            A.x = dense ? c->xd : c->xm;
            A.out = g->out;
            A.op = g->op;
            A.scale = g->scale;
            A.cap = g->cap;
            A.nx = c->rn;
            A.xs = c->dig_rs;
            A.os = g->os;
            if (dense) mmqd_launch_auto(A, st, true);
            else mmq_launch_auto(A, false, st, true, c->n_sm);
        }
        return;
    }
    for (uint32_t r = 0; r < c->rn; r++) {
        mv_launch R = *L;
        for (uint32_t i = 0; i < R.n_seg; i++) R.seg[i].out += (size_t)r * R.seg[i].os;
        mv_launch_typed(st, R, x + (size_t)r * xst);
    }
}

/* matvec of several matrices over the same x; consecutive same-type matrices share one launch.
 * ready: DIG_* bits as in mv_go; os, xst: the rows' strides (mv_go). */
static void mv_group(cu_ctx *c, cudaStream_t st, const mv_mat *const *mats, float *const *outs, int n, const float *x,
                     uint32_t ready, uint32_t os = 0, uint32_t xst = 0)
{
    mv_launch L;
    memset(&L, 0, sizeof L);
    for (int i = 0; i < n; i++) {
        if (L.n_seg && (L.n_seg == MV_MAX_SEG || L.seg[0].a.type != mats[i]->type)) {
            mv_go(c, st, &L, x, ready, xst);
            memset(&L, 0, sizeof L);
        }
        seg_set(&L, mats[i], outs[i], MV_OP_STORE, (uint32_t)mv_rows_per_warp(mats[i]->type), os);
    }
    if (L.n_seg) mv_go(c, st, &L, x, ready, xst);
}

/* The digits a producer writes for one matrix of `type` that reads its output next. */
static cu_digits digits_for(const cu_ctx *c, uint32_t type)
{
    cu_digits d = {NULL, NULL, c->dig_rs, NULL};
    if (type == MV_T_Q4_KT && c->xd) d.qd = c->xd; /* a multi-row pass: the dense layout */
    else if (type == MV_T_Q4_KT) d.q4 = c->xm;
    else if (type == MV_T_Q6_KT && c->xd6) d.qd6 = c->xd6; /* a multi-row pass: the dense layout */
    else if (type == MV_T_Q6_KT) d.q6 = c->x6;
    return d;
}

/* Both producers' digits: what either consumer reads. */
static cu_digits digits_or(cu_digits a, cu_digits b)
{
    if (!a.q4) a.q4 = b.q4;
    if (!a.q6) a.q6 = b.q6;
    if (!a.qd) a.qd = b.qd;
    if (!a.qd6) a.qd6 = b.qd6;
    return a;
}
/* The tensor-core layouts (DIG_*) a producer writing d leaves ready. */
static uint32_t digits_ready(cu_digits d)
{
    return (d.q4 ? DIG_XM : 0u) | (d.q6 ? DIG_X6 : 0u) | (d.qd ? DIG_XD : 0u) | (d.qd6 ? DIG_XD6 : 0u) |
           (d.qi ? DIG_XI : 0u);
}

/* The digits the producer of layer l's attention-projection input must write: the Q4_K layout for
 * the stacked launch, and v's when v is outside the stack; none when the projections are not
 * stacked (each launch preps its own); l == n_layer: the head's. */
static cu_digits qkvg_digits(const cu_ctx *c, uint32_t l)
{
    const cu_layer *L = l < c->m->hp.n_layer ? &c->layers[l] : NULL;
    if (!L) return digits_for(c, c->out.type);
    cu_digits d = {NULL, NULL, c->dig_rs, NULL};
    if (!L->qkg.data) return d;
    d = digits_for(c, MV_T_Q4_KT); /* the stack's */
    return L->qkg_v ? d : digits_or(d, digits_for(c, L->v.type));
}

static bool tc_type(uint32_t t) { return t == MV_T_Q4_KT || t == MV_T_Q6_KT; }

/* Whether every matrix of the route reads a per-site tensor-core digit layout: the stacked attention
 * projections (v outside the stack too), o_proj, gate, up, down and the head are Q4_KT or Q6_KT. */
static bool tc_inputs_only(const cu_ctx *c)
{
    if (!tc_type(c->out.type)) return false;
    for (uint32_t l = 0; l < c->m->hp.n_layer; l++) {
        const cu_layer *L = &c->layers[l];
        if (!L->qkg.data || L->qkg.type != MV_T_Q4_KT || (!L->qkg_v && !tc_type(L->v.type))) return false;
        if (!tc_type(L->o.type) || !tc_type(L->ffn_gate.type) || !tc_type(L->ffn_up.type) || !tc_type(L->ffn_down.type))
            return false;
    }
    return true;
}

/* The digit buffers the producer and the matvec of input site s (XS_*) use. */
static void set_site(cu_ctx *c, int s)
{
    c->site = s;
    c->xm = c->xm_site[s];
    c->x6 = c->x6_site[s];
    /* every Q4_KT and Q6_KT matrix of a multi-row pass reads the dense layouts (mmqd.cuh, mmqd6.cuh) */
    c->xd = c->rn > 1 ? c->xd_site[s] : NULL;
    c->xd6 = c->rn > 1 ? c->xd6_site[s] : NULL;
}

/* Floats between the rows of the qkvg buffer (q | k | gate | v) in a multi-row pass. */
static uint32_t qkvg_width(const muser_hparams *hp)
{
    return 2 * hp->n_head * hp->head_dim + 2 * hp->n_head_kv * hp->head_dim;
}

/* The attention projections of layer L over c->a: the stack on the tensor cores in one launch (with
 * a Q6_KT v beside it in the same grid where both digit layouts are ready), v apart where it is not
 * in the stack; or, unstacked, one launch per run of same-type matrices. */
static void enqueue_qkvg(cu_ctx *c, cudaStream_t st, const cu_layer *L, cu_digits dg, float *q, float *k, float *g,
                         float *v)
{
    const muser_hparams *hp = &c->m->hp;
    const uint32_t QW = qkvg_width(hp), E = hp->n_embd;
    if (!L->qkg.data) {
        const mv_mat *mats[4] = {&L->q, &L->k, &L->v, &L->gate};
        float *outs[4] = {q, k, v, g};
        mv_group(c, st, mats, outs, hp->attn_gate ? 4 : 3, c->a, 0, QW, E);
        return;
    }
    const uint32_t both = c->rn > 1 ? DIG_XD | DIG_XD6 : DIG_XM | DIG_X6; /* the layouts they read (mv_go) */
    const bool with_v = !L->qkg_v && L->qkg.type == MV_T_Q4_KT && L->v.type == MV_T_Q6_KT &&
                        (digits_ready(dg) & both) == both;
    if (with_v) {
        mmq_args S;
        memset(&S, 0, sizeof S);
        S.a = L->qkg.data;
        S.rows = L->qkg.rows;
        S.K = L->qkg.cols;
        S.x = c->rn > 1 ? c->xd : c->xm;
        S.out = q;
        S.nx = c->rn;
        S.xs = c->dig_rs;
        S.os = QW;
        mmq6_args V;
        memset(&V, 0, sizeof V);
        V.a = L->v.data;
        V.rows = L->v.rows;
        V.K = L->v.cols;
        V.x = c->rn > 1 ? c->xd6 : c->x6;
        V.out = v;
        V.op = MV_OP_STORE;
        V.scale = 1.f;
        V.nx = c->rn;
        V.xs = c->dig_rs;
        V.os = QW;
        if (c->rn > 1) mmqd_stack_v_launch(S, V, st, true);
        else mmq_stack_v_launch(S, V, st, true);
        return;
    }
    mv_launch sl;
    memset(&sl, 0, sizeof sl);
    seg_set(&sl, &L->qkg, q, MV_OP_STORE, 1, QW);
    mv_go(c, st, &sl, c->a, digits_ready(dg), E);
    if (!L->qkg_v) {
        const mv_mat *vm[1] = {&L->v};
        float *vo[1] = {v};
        mv_group(c, st, vm, vo, 1, c->a, digits_ready(dg), QW, E);
    }
}

/* Layer l's K and V plane tables of the multi-row pass (device addresses: [CU_ROWS_MAX] each). */
static const uint16_t *const *rows_kp(const cu_ctx *c, uint32_t l)
{
    return (const uint16_t *const *)(c->d_rows + CU_ROWS_MAX * c->row_bytes) + (size_t)l * CU_ROWS_MAX;
}
static const uint16_t *const *rows_vp(const cu_ctx *c, uint32_t l)
{
    return rows_kp(c, c->m->hp.n_layer) + (size_t)l * CU_ROWS_MAX;
}

/* The decode route, enqueued on c->st (to be recorded as a graph): one session's token (sq, n = 1),
 * or a multi-row pass of n rows (sq NULL), each row a token of its own session at its own
 * position, read from the device's row tables (c->d_rows: each row's cu_step and plane metadata,
 * each layer's K/V plane per row), every kernel taking all n rows at once (the matvecs read each
 * weight once for all of them). A row's arithmetic is the one-row route's: its bits are those of
 * decoding it alone (docs/routes.md says how that is kept). */
static int route_enqueue_n(cu_ctx *c, cu_seq *sq, uint32_t n, bool bench_token, bool tapped, profiler *pf)
{
    const muser_hparams *hp = &c->m->hp;
    cudaStream_t st = c->st;
    const uint32_t E = hp->n_embd, H = hp->n_head, HKV = hp->n_head_kv, D = hp->head_dim, F = hp->n_ff;
    const uint32_t QW = qkvg_width(hp), QD = H * D, V = hp->n_vocab;
    cu_step *dstep = sq ? (cu_step *)sq->d_step : (cu_step *)c->d_rows;
    const cu_plane_meta *dmeta = (const cu_plane_meta *)(dstep + 1);
    cu_rows R;
    memset(&R, 0, sizeof R);
    if (!sq) {
        R.step_stride = (uint32_t)c->row_bytes;
        R.x_stride = QW;
        R.o_stride = QD;
        R.part_stride = (uint32_t)c->n_part;
    }
    c->rn = n;
    if (!sq)
        cudaMemcpyAsync(c->d_rows, c->h_rows, c->rows_bytes, cudaMemcpyHostToDevice, st);
    else if (!bench_token)
        cudaMemcpyAsync(sq->d_step, sq->h_step, sq->step_bytes, cudaMemcpyHostToDevice, st);
    else /* position and metadata only: the token is the previous step's argmax */
        cudaMemcpyAsync(&dstep->pos, &((cu_step *)sq->h_step)->pos, sizeof(uint64_t), cudaMemcpyHostToDevice, st);
    if (sq && bench_token) {
        cudaMemcpyAsync((uint8_t *)sq->d_step + sizeof(cu_step), (uint8_t *)sq->h_step + sizeof(cu_step),
                        sq->step_bytes - sizeof(cu_step), cudaMemcpyHostToDevice, st);
        cudaMemcpyAsync(&dstep->token, c->d_token, sizeof(int32_t), cudaMemcpyDeviceToDevice, st);
    }
    pf_mark(pf, st, PF_EMBED);
    set_site(c, XS_STACK);
    cu_digits dg = qkvg_digits(c, 0); /* the digits the next attention projections (or the head) read */
    cu_embed_norm(st, &c->emb, &dstep->token, c->h, c->a, c->layers[0].attn_norm, hp->rms_eps, hp->entry_norm,
                  hp->rms_eps, E, dg, c->tail_trigger, n, &R);
    /* c->qkvg = q | k | gate | v (the stack's order) */
    float *q = c->qkvg, *k = q + (size_t)H * D, *g = k + (size_t)HKV * D;
    float *v = hp->attn_gate ? g + (size_t)H * D : g;
    for (uint32_t l = 0; l < hp->n_layer; l++) {
        cu_layer *L = &c->layers[l];
        const cu_attn_geom *geom = sq ? &sq->pl[l].geom : &c->rows_geom[l];
        uint16_t *kp = sq ? sq->pl[l].kp : NULL, *vp = sq ? sq->pl[l].vp : NULL;
        if (!sq) { /* a multi-row pass: K/V staged, stored by cu_stage_commit after the logits */
            R.kp = rows_kp(c, l);
            R.vp = rows_vp(c, l);
            R.sk = c->stage_k + (size_t)l * CU_ROWS_MAX * HKV * D;
            R.sv = c->stage_v + (size_t)l * CU_ROWS_MAX * HKV * D;
        }
        pf_mark(pf, st, PF_QKVG);
        if (!SKIP(c, SK_QKVG)) enqueue_qkvg(c, st, L, dg, q, k, g, v);
        pf_mark(pf, st, PF_ROPE);
        /* QK-norm/RoPE/store inside the split attention kernel where it can (cu_attn_fusable) */
        const bool fuse = !SKIP(c, SK_ROPE) && hp->arch != MUSER_ARCH_QWEN3 && cu_attn_fusable(geom);
        cu_attn_fuse Fu;
        memset(&Fu, 0, sizeof Fu);
        Fu.k = k;
        Fu.v = v;
        Fu.q_norm = L->q_norm;
        Fu.k_norm = L->k_norm;
        Fu.eps = hp->rms_eps;
        Fu.rope = muser_layer_has_rope(hp, l);
        Fu.theta = hp->rope_theta;
        Fu.kw = kp;
        Fu.vw = vp;
        Fu.inv_freq = c->rope_inv;
        /* fused in a multi-row pass: the split kernel norms and rotates q; K and V are staged first
         * (the same bytes as the fused store) so that a run's later rows read its earlier ones */
        if (!SKIP(c, SK_ROPE) && (!fuse || R.sk))
            cu_qk_rope_store(st, c->qkvg, v, L->q_norm, L->k_norm, hp->rms_eps, muser_layer_has_rope(hp, l),
                             hp->arch == MUSER_ARCH_QWEN3, hp->rope_theta, hp->rope_dim, dstep, dmeta + l, kp, vp, geom,
                             true, n, &R, fuse);
        pf_mark(pf, st, PF_ATTN);
        /* the combine writes o_proj's digits, in the layout o_proj's matvec reads */
        set_site(c, XS_OPROJ);
        const cu_digits od = digits_for(c, L->o.type);
        if (!SKIP(c, SK_ATTN) && cu_attention(st, q, dstep, dmeta + l, kp, vp, c->part_ml, c->part_acc,
                                              hp->attn_gate ? g : NULL, c->attn_o, geom, od, fuse ? &Fu : NULL, n, &R))
            return -1;
        pf_mark(pf, st, PF_OPROJ);
        const mv_mat *om[1] = {&L->o};
        float *oo[1] = {c->y};
        if (!SKIP(c, SK_OPROJ)) mv_group(c, st, om, oo, 1, c->attn_o, digits_ready(od), E, QD);
        tp_reduce(c, st, c->y, (size_t)n * E);
        pf_mark(pf, st, PF_TAIL);
        /* this tail writes gate·up's digits, in the layouts gate and up read */
        set_site(c, XS_GU);
        cu_digits gd = {NULL, NULL, c->dig_rs, NULL};
        if (c->gate_up_paired && L->ffn_gate.type == MV_T_Q4_KT) gd.qi = c->xm; /* the pair's (mmi.cuh, as mv_go picks it) */
        else gd = digits_or(digits_for(c, L->ffn_gate.type), digits_for(c, L->ffn_up.type));
        if (!SKIP(c, SK_TAIL))
            cu_tail(st, c->y, c->h, c->a, L->post_attn_norm, hp->post_norm_eps, L->ffn_norm, hp->rms_eps, hp->sandwich,
                    E, gd, c->tail_trigger, c->tail_wide, n);
        pf_mark(pf, st, PF_FFN_UP);
        if (SKIP(c, SK_GU)) {
        } else if (c->gate_up_paired) {
            mv_launch ml;
            memset(&ml, 0, sizeof ml);
            seg_set(&ml, &L->ffn_gate, c->ffn, MV_OP_SILU_MUL, 1, F);
            ml.seg[0].b = L->ffn_up;
            mv_go(c, st, &ml, c->a, digits_ready(gd), E);
        } else {
            const mv_mat *gm[2] = {&L->ffn_gate, &L->ffn_up};
            float *go[2] = {c->ffn_g, c->ffn_u};
            mv_group(c, st, gm, go, 2, c->a, digits_ready(gd), F, E);
            cu_silu_mul(st, c->ffn_g, c->ffn_u, c->ffn, n * F); /* the rows are contiguous */
        }
        pf_mark(pf, st, PF_DOWN);
        set_site(c, XS_DOWN);
        const mv_mat *dm[1] = {&L->ffn_down};
        float *dout[1] = {c->y};
        if (!SKIP(c, SK_DOWN)) mv_group(c, st, dm, dout, 1, c->ffn, 0, E, F);
        tp_reduce(c, st, c->y, (size_t)n * E);
        pf_mark(pf, st, PF_TAIL);
        const bool last = l + 1 == hp->n_layer;
        set_site(c, XS_STACK);
        dg = qkvg_digits(c, l + 1);
        if (!SKIP(c, SK_TAIL))
            cu_tail(st, c->y, c->h, c->a, L->post_ffw_norm, hp->post_norm_eps,
                    last ? c->out_norm : c->layers[l + 1].attn_norm, hp->rms_eps, hp->sandwich, E, dg, c->tail_trigger,
                    c->tail_wide, n);
        for (uint32_t j = 0; tapped && j < c->tap_nl; j++) /* the residual after layer l: row r to [r][j] */
            if (c->tap_layers[j] == l) cu_rows_copy(st, c->h, E, c->d_tap + (size_t)j * E, (size_t)c->tap_nl * E, E, n);
    }
    pf_mark(pf, st, PF_HEAD);
    mv_launch hl;
    memset(&hl, 0, sizeof hl);
    /* a rank's head is its vocabulary rows: its part of each row, gathered into whole rows */
    seg_set(&hl, &c->out, c->logits + (size_t)c->tp_rank * c->out.rows, MV_OP_SOFTCAP,
            (uint32_t)mv_rows_per_warp(c->out.type), V);
    hl.seg[0].scale = hp->logit_scale;
    hl.seg[0].cap = hp->final_softcap;
    if (!SKIP(c, SK_HEAD)) mv_go(c, st, &hl, c->a, digits_ready(dg), E); /* dg: the last tail's, qkvg_digits(n_layer) */
    tp_gather(c, st, c->logits, n, c->out.rows, V);
    cu_argmax(st, c->logits, V, c->am_v, c->am_i, c->d_token, c->d_nonfinite, c->d_best, n);
    if (!sq) /* the staged K/V into the planes, unless a row's logits are non-finite */
        cu_stage_commit(st, dstep, R.step_stride, rows_kp(c, 0), rows_vp(c, 0), c->stage_k, c->stage_v, c->d_nonfinite, n,
                        CU_ROWS_MAX, hp->n_layer, &c->rows_ring, HKV, D);
    /* every row's argmax, non-finite count and best logit (adjacent) */
    cudaMemcpyAsync(c->h_flags, c->d_token, 3 * CU_ROWS_MAX * sizeof(int32_t), cudaMemcpyDeviceToHost, st);
    pf_mark(pf, st, PF_N);
    c->rn = 1;
    return 0;
}

/* The graph of route_enqueue_n(c, sq, n, …) */
static int record_graph_n(cu_ctx *c, cu_seq *sq, uint32_t n, bool bench_token, bool tapped, cudaGraphExec_t *out,
                          muser_error *err)
{
    cudaGraph_t g;
    *out = NULL;
    if (c->eager) return MUSER_OK; /* enqueued at each pass instead (pass_launch) */
    CU_TRY(cudaStreamBeginCapture(c->st, cudaStreamCaptureModeThreadLocal), "graph capture begin");
    const int rc = route_enqueue_n(c, sq, n, bench_token, tapped, NULL);
    c->rn = 1;
    cudaError_t e = cudaStreamEndCapture(c->st, &g);
    const cudaError_t te = tp_failed(c);
    if (rc) {
        if (e == cudaSuccess) cudaGraphDestroy(g);
        return muser_errorf(err, MUSER_E_UNSUPPORTED, "cuda: attention with head_dim %u and %u:%u heads is not built",
                            c->m->hp.head_dim, c->m->hp.n_head, c->m->hp.n_head_kv);
    }
    if (te && e == cudaSuccess) cudaGraphDestroy(g);
    CU_TRY(te, "tensor parallel: a collective in the graph capture");
    CU_TRY(e, "graph capture");
    e = cudaGraphInstantiate(out, g, 0);
    cudaGraphDestroy(g);
    CU_TRY(e, "graph instantiate");
    return MUSER_OK;
}

/* A pass of n rows (sq: one session's row; NULL: the multi-row pass): its graph g, or in the eager
 * mode the route enqueued now. */
static cudaError_t pass_launch(cu_ctx *c, cu_seq *sq, uint32_t n, bool tapped, cudaGraphExec_t g)
{
    if (!c->eager) return cudaGraphLaunch(g, c->st);
    const int rc = route_enqueue_n(c, sq, n, false, tapped, NULL);
    const cudaError_t te = tp_failed(c); /* (a collective's failure, cleared either way) */
    if (rc) return cudaErrorNotSupported;
    return te ? te : cudaGetLastError();
}

static int record_graph(cu_ctx *c, cu_seq *sq, bool bench_token, cudaGraphExec_t *out, muser_error *err)
{
    return record_graph_n(c, sq, 1, bench_token, false, out, err);
}

/* ---- context --------------------------------------------------------------------------------- */
/* A comma list of names[0..n) into *mask (1 << index); -1 at an unknown name. */
static int name_mask(const char *s, const char *const *names, int n, uint32_t *mask)
{
    for (const char *p = s; *p;) {
        const size_t len = strcspn(p, ",");
        int f = 0;
        while (f < n && !(strlen(names[f]) == len && !strncmp(p, names[f], len))) f++;
        if (f == n) return -1;
        *mask |= 1u << f;
        p += len + (p[len] == ',');
    }
    return 0;
}

static void ctx_free(cu_ctx *c)
{
    if (!c) return;
    bind_dev(c);
    if (c->h_tp) cudaFreeHost(c->h_tp);
    void *dev[] = {c->weights, c->h, c->part_ml, c->part_acc, c->xm_site[0], c->rope_inv, c->d_rows, c->stage_k};
    for (size_t i = 0; i < sizeof dev / sizeof dev[0]; i++) cudaFree(dev[i]);
    for (uint32_t n = 0; n <= CU_ROWS_MAX; n++) {
        if (c->g_rows[n]) cudaGraphExecDestroy(c->g_rows[n]);
        if (c->g_rows_tap[n]) cudaGraphExecDestroy(c->g_rows_tap[n]);
    }
    if (c->d_tap) cudaFree(c->d_tap);
    if (c->h_tap) cudaFreeHost(c->h_tap);
    if (c->h_logits) cudaFreeHost(c->h_logits);
    if (c->h_flags) cudaFreeHost(c->h_flags);
    if (c->h_topk) cudaFreeHost(c->h_topk);
    if (c->h_draw) cudaFreeHost(c->h_draw);
    if (c->d_draw) cudaFree(c->d_draw);
    if (c->d_draw_scratch) cudaFree(c->d_draw_scratch);
    if (c->d_topk_part) cudaFree(c->d_topk_part);
    if (c->h_rows) cudaFreeHost(c->h_rows);
    free(c->rows_geom);
    if (c->st) cudaStreamDestroy(c->st);
    pf_free(c->pf);
    free(c->step_logits);
    free(c->layers);
    free(c);
}

static void seq_free(cu_seq *sq)
{
    if (!sq) return;
    if (sq->g_fwd) cudaGraphExecDestroy(sq->g_fwd);
    if (sq->g_bench) cudaGraphExecDestroy(sq->g_bench);
    if (sq->g_tap) cudaGraphExecDestroy(sq->g_tap);
    cudaFree(sq->kv_mem);
    cudaFree(sq->d_step);
    cudaFree(sq->ring_undo);
    if (sq->h_step) cudaFreeHost(sq->h_step);
    kv_free(&sq->kv);
    free(sq->meta_step);
    free(sq->meta_call);
    free(sq->pl);
    free(sq);
}

/* Blocks per KV head of a plane of `capacity` rows (at least 64 positions each). */
static uint32_t split_for(uint64_t capacity)
{
    const uint64_t want = (capacity + 63) / 64;
    return (uint32_t)(want < 1 ? 1 : (want > CU_ATT_MAX_SPLIT ? CU_ATT_MAX_SPLIT : want));
}

static int ctx_new(cu_ctx **out, const muser_model *m, uint64_t n_ctx, int device, muser_error *err)
{
    *out = NULL;
    const muser_hparams *hp = &m->hp;
    int n_dev = 0;
    if (cudaGetDeviceCount(&n_dev) != cudaSuccess || n_dev == 0)
        return muser_errorf(err, MUSER_E_BACKEND, "cuda: no CUDA device");
    if (device < 0 || device >= n_dev)
        return muser_errorf(err, MUSER_E_ARG, "cuda: device %d does not exist (%d present)", device, n_dev);
    CU_TRY(cudaSetDevice(device), "set device");
    if (hp->head_dim != 32 && hp->head_dim != 64 && hp->head_dim != 128)
        return muser_errorf(err, MUSER_E_UNSUPPORTED, "cuda: head_dim %u (built for 32, 64, 128)", hp->head_dim);
    const uint32_t G = hp->n_head / hp->n_head_kv;
    if (G != 1 && G != 2 && G != 4 && G != 8 && G != 16)
        return muser_errorf(err, MUSER_E_UNSUPPORTED, "cuda: %u query heads per KV head (built for 1,2,4,8,16)", G);
    if (hp->n_embd > 8192)
        return muser_errorf(err, MUSER_E_UNSUPPORTED, "cuda: hidden width %u (the fused tails hold at most 8192)", hp->n_embd);
    if (hp->n_embd % 8 || hp->n_ff % 8)
        return muser_errorf(err, MUSER_E_UNSUPPORTED, "cuda: widths must be multiples of 8");
    cu_ctx *c = (cu_ctx *)calloc(1, sizeof *c);
    if (!c) return muser_errorf(err, MUSER_E_NOMEM, "cuda: out of memory");
    c->m = m;
    c->device = device;
    c->n_ctx = n_ctx;
    cudaDeviceGetAttribute(&c->n_sm, cudaDevAttrMultiProcessorCount, device);
    c->layers = (cu_layer *)calloc(hp->n_layer, sizeof *c->layers);
    int rc = MUSER_OK;
#define FAIL(call)                   \
    do {                             \
        if ((rc = (call)) != 0) {    \
            ctx_free(c);             \
            return rc;               \
        }                            \
    } while (0)
    if (!c->layers) FAIL(muser_errorf(err, MUSER_E_NOMEM, "cuda: out of memory"));
    {
        c->tail_wide = cu_tail_wide_ok();
        const char *pe = getenv("MUSER_CUDA_PROFILE");
        c->profile = pe && *pe && strcmp(pe, "0");
        const char *sk = getenv("MUSER_CUDA_SKIP");
        if (sk && name_mask(sk, sk_names, SK_N, &c->skip))
            FAIL(muser_errorf(err, MUSER_E_ARG, "MUSER_CUDA_SKIP=%s: expected a comma list of qkvg, rope, attn, "
                                                "oproj, tail, gu, prep, down, head", sk));
        if (c->skip) fprintf(stderr, "muser: MUSER_CUDA_SKIP=%s: those ops are left out; timing only, the logits are wrong\n", sk);
    }
    cudaError_t e = cudaStreamCreateWithFlags(&c->st, cudaStreamNonBlocking);
    if (e) FAIL(muser_errorf(err, MUSER_E_BACKEND, "cuda: stream: %s", cudaGetErrorString(e)));
    FAIL(upload_weights(c, err));
    /* the attention partials, for the most splits a plane of the device's context takes */
    const uint32_t max_split = split_for(n_ctx > hp->swa_window ? n_ctx : hp->swa_window);
    /* activations, one allocation */
    const size_t E = hp->n_embd, F = hp->n_ff, V = hp->n_vocab, QD = (size_t)hp->n_head * hp->head_dim,
                 KD = (size_t)hp->n_head_kv * hp->head_dim;
    const size_t n_part = (size_t)hp->n_head_kv * max_split * G;
    const size_t NR = CU_ROWS_MAX;
    c->rn = 1;
    c->n_part = n_part;
    const size_t fl = NR * (2 * E + (2 * QD + 2 * KD) + QD + E + 3 * F + V + 256);
    e = cudaMalloc((void **)&c->h, fl * sizeof(float) + NR * 259 * sizeof(int32_t));
    if (e) FAIL(muser_errorf(err, MUSER_E_NOMEM, "cuda: activations: %s", cudaGetErrorString(e)));
    c->a = c->h + NR * E;                      /* [E] normed input of the next matvec */
    c->qkvg = c->a + NR * E;                   /* q [H·D] | k [HKV·D] | gate [H·D] | v [HKV·D] */
    c->attn_o = c->qkvg + NR * (2 * QD + 2 * KD); /* [H·D] gated attention output */
    c->y = c->attn_o + NR * QD;                /* [E] o_proj / down output */
    c->ffn = c->y + NR * E;                    /* [F] silu(g)·u */
    c->ffn_g = c->ffn + NR * F;
    c->ffn_u = c->ffn_g + NR * F;
    c->logits = c->ffn_u + NR * F;             /* [V] */
    c->am_v = c->logits + NR * V;              /* [256] argmax partials */
    c->am_i = (int32_t *)(c->am_v + NR * 256);
    c->d_token = c->am_i + NR * 256;
    c->d_nonfinite = c->d_token + NR;
    c->d_best = (float *)(c->d_nonfinite + NR);
    {
        const size_t kmax = E > QD ? (E > F ? E : F) : (QD > F ? QD : F);
        const size_t xmb = (mmq_x_bytes((uint32_t)kmax + 255) + 255) / 256 * 256;
        const size_t x6b = (mmq6_x_bytes((uint32_t)kmax + 255) + 255) / 256 * 256;
        const size_t rs = xmb > x6b ? xmb : x6b; /* one row of any layout (mmqd's is smaller) */
        c->dig_rs = (uint32_t)rs;
        /* per site the four layouts: xm, x6, xd (mmqd), xd6 (mmqd6), each NR rows of rs */
        e = cudaMalloc((void **)&c->xm_site[0], XS_N * 4 * NR * rs);
        for (int s = 0; !e && s < XS_N; s++) {
            c->xm_site[s] = c->xm_site[0] + s * NR * rs;
            c->x6_site[s] = c->xm_site[0] + (XS_N + s) * NR * rs;
            c->xd_site[s] = c->xm_site[0] + (2 * XS_N + s) * NR * rs;
            c->xd6_site[s] = c->xm_site[0] + (3 * XS_N + s) * NR * rs;
        }
        c->xm = c->xm_site[0];
        c->x6 = c->x6_site[0];
        if (e) FAIL(muser_errorf(err, MUSER_E_NOMEM, "cuda: matvec input digits: %s", cudaGetErrorString(e)));
    }
    e = cudaMalloc((void **)&c->part_ml, NR * n_part * 2 * sizeof(float));
    if (!e) e = cudaMalloc((void **)&c->part_acc, NR * n_part * hp->head_dim * sizeof(float));
    if (e) FAIL(muser_errorf(err, MUSER_E_NOMEM, "cuda: attention partials: %s", cudaGetErrorString(e)));
    e = cudaMalloc((void **)&c->rope_inv, hp->head_dim / 2 * sizeof(double));
    if (e) FAIL(muser_errorf(err, MUSER_E_NOMEM, "cuda: RoPE table: %s", cudaGetErrorString(e)));
    if (cu_rope_inv_table(c->rope_inv, hp->rope_theta, hp->head_dim))
        FAIL(muser_errorf(err, MUSER_E_BACKEND, "cuda: RoPE table for head_dim %u", hp->head_dim));
    e = cudaSuccess;
    if (!e) e = cudaMallocHost((void **)&c->h_logits, NR * V * sizeof(float));
    if (!e) e = cudaMallocHost((void **)&c->h_flags, 3 * NR * sizeof(int32_t));
    if (!e) e = cudaMalloc((void **)&c->d_topk_part, cu_topk_part_bytes(NR) + NR * CU_TOPK * sizeof(unsigned long long));
    if (!e) c->d_topk = c->d_topk_part + cu_topk_part_bytes(NR) / sizeof(unsigned long long);
    if (!e) e = cudaMallocHost((void **)&c->h_topk, NR * CU_TOPK * sizeof(unsigned long long));
    if (!e) e = cudaMallocHost((void **)&c->h_draw, sizeof(cu_draw_io));
    if (!e) e = cudaMalloc((void **)&c->d_draw, sizeof(cu_draw_io));
    if (!e && V <= CU_DRAW_MAX_N) e = cudaMalloc(&c->d_draw_scratch, cu_draw_scratch_bytes(NR));
    if (!e) e = cudaMalloc((void **)&c->d_tap, NR * MUSER_TAP_MAX_LAYERS * E * sizeof(float));
    if (!e) e = cudaMallocHost((void **)&c->h_tap, NR * MUSER_TAP_MAX_LAYERS * E * sizeof(float));
    /* the multi-row pass's tables: a row's step block 16-byte aligned */
    c->row_bytes = (sizeof(cu_step) + hp->n_layer * sizeof(cu_plane_meta) + 15) / 16 * 16;
    c->rows_bytes = NR * c->row_bytes + 2 * (size_t)hp->n_layer * NR * sizeof(uint16_t *);
    if (!e) e = cudaMalloc((void **)&c->d_rows, c->rows_bytes);
    if (!e) e = cudaMalloc((void **)&c->stage_k, 2 * hp->n_layer * NR * KD * sizeof(uint16_t));
    if (!e) c->stage_v = c->stage_k + hp->n_layer * NR * KD;
    if (!e) e = cudaMallocHost((void **)&c->h_rows, c->rows_bytes);
    if (e) FAIL(muser_errorf(err, MUSER_E_NOMEM, "cuda: step buffers: %s", cudaGetErrorString(e)));
    memset(c->h_rows, 0, c->rows_bytes);
    cudaMemsetAsync(c->d_token, 0, 3 * NR * sizeof(int32_t), c->st);
    c->gate_up_paired = c->layers[0].ffn_gate.type == c->layers[0].ffn_up.type;
    for (uint32_t l = 1; l < hp->n_layer; l++)
        if (c->layers[l].ffn_gate.type != c->layers[l].ffn_up.type) c->gate_up_paired = false;
    for (uint32_t l = 0; l < hp->n_layer; l++) /* mmq6 has no SiLU pair: gate, up, then cu_silu_mul */
        if (c->layers[l].ffn_gate.type == MV_T_Q6_KT) c->gate_up_paired = false;
    /* early triggers (tails, embedding entry) and dependent preps only where every matvec input is
     * a per-site tensor-core digit buffer: what makes an early launch safe (see cu_ldx) */
    c->tail_trigger = c->prep_pdl = tc_inputs_only(c);
    e = cudaStreamSynchronize(c->st);
    if (e) FAIL(muser_errorf(err, MUSER_E_BACKEND, "cuda: init: %s", cudaGetErrorString(e)));
#undef FAIL
    *out = c;
    return MUSER_OK;
}

/* A session of context n_ctx on c: its planes (zero-filled), metadata, step buffers and graph. */
static int seq_new(cu_seq **out, cu_ctx *c, uint64_t n_ctx, muser_error *err)
{
    *out = NULL;
    const muser_hparams *hp = &c->m->hp;
    cu_seq *sq = (cu_seq *)calloc(1, sizeof *sq);
    if (!sq) return muser_errorf(err, MUSER_E_NOMEM, "cuda: out of memory");
    sq->c = c;
    sq->pl = (cu_plane *)calloc(hp->n_layer, sizeof *sq->pl);
    sq->meta_step = (kv_plane *)calloc(hp->n_layer, sizeof(kv_plane));
    sq->meta_call = (kv_plane *)calloc(hp->n_layer, sizeof(kv_plane));
    int rc = MUSER_OK;
#define FAIL(call)                   \
    do {                             \
        if ((rc = (call)) != 0) {    \
            seq_free(sq);            \
            return rc;               \
        }                            \
    } while (0)
    if (!sq->pl || !sq->meta_step || !sq->meta_call) FAIL(muser_errorf(err, MUSER_E_NOMEM, "cuda: out of memory"));
    FAIL(kv_init(&sq->kv, hp, n_ctx, false, err));
    const size_t re2 = (size_t)hp->n_head_kv * hp->head_dim * 2; /* bytes of one row */
    for (uint32_t l = 0; l < hp->n_layer; l++) {
        const kv_plane *pl = &sq->kv.planes[l];
        sq->kv_bytes += 2 * align256(pl->capacity * re2);
        if (pl->ring) sq->kv_bytes += 2 * align256((size_t)KV_MAX_SPEC_ROWS * re2);
        cu_attn_geom *g = &sq->pl[l].geom;
        g->n_head = hp->n_head;
        g->n_head_kv = hp->n_head_kv;
        g->head_dim = hp->head_dim;
        g->ring = pl->ring;
        g->scale = hp->attn_scale;
        g->impl = CU_ATTN_TC; /* where the geometry allows; v1 elsewhere (att_plan_for) */
        g->n_split = split_for(pl->capacity);
        if (pl->ring) sq->ring_bytes += 2 * pl->capacity * re2;
    }
    cudaError_t e = cudaSuccess;
    if (sq->ring_bytes) {
        e = cudaMalloc((void **)&sq->ring_undo, sq->ring_bytes);
        if (e) FAIL(muser_errorf(err, MUSER_E_NOMEM, "cuda: ring undo copy (%zu bytes): %s", sq->ring_bytes, cudaGetErrorString(e)));
    }
    e = cudaMalloc((void **)&sq->kv_mem, sq->kv_bytes);
    if (e) FAIL(muser_errorf(err, MUSER_E_NOMEM, "cuda: KV planes (%zu bytes): %s", sq->kv_bytes, cudaGetErrorString(e)));
    e = cudaMemsetAsync(sq->kv_mem, 0, sq->kv_bytes, c->st);
    size_t off = 0;
    for (uint32_t l = 0; l < hp->n_layer; l++) {
        const kv_plane *pl = &sq->kv.planes[l];
        const size_t pb = align256(pl->capacity * re2);
        sq->pl[l].kp = (uint16_t *)(sq->kv_mem + off);
        sq->pl[l].vp = (uint16_t *)(sq->kv_mem + off + pb);
        off += 2 * pb;
        if (pl->ring) {
            const size_t sb = align256((size_t)KV_MAX_SPEC_ROWS * re2);
            sq->pl[l].save_k = (uint16_t *)(sq->kv_mem + off);
            sq->pl[l].save_v = (uint16_t *)(sq->kv_mem + off + sb);
            off += 2 * sb;
        }
    }
    sq->step_bytes = sizeof(cu_step) + hp->n_layer * sizeof(cu_plane_meta);
    if (!e) e = cudaMalloc(&sq->d_step, sq->step_bytes);
    if (!e) e = cudaMallocHost(&sq->h_step, sq->step_bytes);
    if (e) FAIL(muser_errorf(err, MUSER_E_NOMEM, "cuda: session buffers: %s", cudaGetErrorString(e)));
    memset(sq->h_step, 0, sq->step_bytes);
    sq->n_ctx = n_ctx;
    /* the multi-row pass takes sessions of the device's context */
    if (!c->rows_geom && n_ctx == c->n_ctx && hp->n_layer <= CU_MAX_LAYERS) {
        c->rows_geom = (cu_attn_geom *)malloc(hp->n_layer * sizeof(cu_attn_geom));
        if (!c->rows_geom) FAIL(muser_errorf(err, MUSER_E_NOMEM, "cuda: out of memory"));
        memset(&c->rows_ring, 0, sizeof c->rows_ring);
        for (uint32_t l = 0; l < hp->n_layer; l++) {
            c->rows_geom[l] = sq->pl[l].geom;
            if (sq->pl[l].geom.ring) c->rows_ring.bits[l >> 6] |= 1ull << (l & 63);
        }
        c->rows_n_ctx = n_ctx;
    }
    /* A rank on NCCL records it at its first token instead (decode_one), where every rank's thread
     * captures at once: NCCL connects its ring at the first collective, inside the capture, and
     * waits there for the other ranks, whose sessions open after this one returns. */
    if (!c->nccl) FAIL(record_graph(c, sq, false, &sq->g_fwd, err));
    e = cudaStreamSynchronize(c->st);
    if (e) FAIL(muser_errorf(err, MUSER_E_BACKEND, "cuda: session init: %s", cudaGetErrorString(e)));
#undef FAIL
    *out = sq;
    return MUSER_OK;
}

/* Fill the pinned step from the host metadata (after this token's append). */
/* Write sq's step block for its token at pos into s (pinned memory; after this token's append). */
static void step_write(const cu_seq *sq, cu_step *s, uint64_t pos, int32_t token)
{
    s->pos = pos;
    s->token = token;
    s->n_layer = sq->kv.n_layer;
    s->stage_pos = UINT64_MAX; /* a multi-row pass sets its rows' runs (rows_pass) */
    s->stage_row = 0;
    cu_plane_meta *m = cu_step_meta(s);
    for (uint32_t l = 0; l < sq->kv.n_layer; l++) {
        const kv_plane *pl = &sq->kv.planes[l];
        m[l].origin_logical = pl->origin_logical;
        m[l].origin_physical = pl->origin_physical;
        m[l].len = pl->len;
        m[l].capacity = pl->capacity;
    }
}

static void step_fill(cu_seq *sq, uint64_t pos, int32_t token) { step_write(sq, (cu_step *)sq->h_step, pos, token); }

static int profile_pass(cu_ctx *c, cu_seq *sq, uint32_t n, const char *what, muser_error *err);

/* Whether a session can take a row of a multi-row pass: its planes have the geometry the pass's
 * graphs were recorded with (the device's context). */
static bool rows_ok(const cu_ctx *c, const cu_seq *sq) { return c->rows_geom && sq->n_ctx == c->rows_n_ctx; }

/* Whether pass row i's token can be drawn on the device (h_draw set by draw_set). */
static bool draws(const cu_ctx *c, uint32_t i) { return c->h_draw->temp[i] > 0.0f; }

/* The pass's draws into h_draw (dr [n] by pass row, NULL entries: none; dr NULL: none): whether any
 * row draws on the device (not where the vocabulary is past cu_draw's reach: those rows come back). */
static bool draw_set(cu_ctx *c, const muser_draw *const *dr, uint32_t n)
{
    bool any = false;
    for (uint32_t i = 0; i < n; i++) {
        const muser_draw *w = dr && c->d_draw_scratch ? dr[i] : NULL;
        c->h_draw->temp[i] = w ? w->temperature : 0.0f;
        c->h_draw->top_p[i] = w ? w->top_p : 1.0f;
        c->h_draw->cut[i] = muser_min_p_cut(w ? w->min_p : 0.0f); /* the host sampler's cut */
        c->h_draw->u[i] = w ? w->u : 0.0;
        c->h_draw->id[i] = -1;
        any |= w != NULL;
    }
    return any;
}

/* Pass row i's draw done on the device, or its logits (copied back, or fetched now) into dst for the
 * caller's: *id the token or −1. */
static cudaError_t draw_out(cu_ctx *c, uint32_t i, bool copied, float *dst, int32_t *id)
{
    const size_t V = c->m->hp.n_vocab;
    *id = draws(c, i) ? c->h_draw->id[i] : -1;
    if (*id >= 0 || !dst) return cudaSuccess;
    if (copied) {
        memcpy(dst, c->h_logits + i * V, V * sizeof(float));
        return cudaSuccess;
    }
    return cudaMemcpy(dst, c->logits + i * V, V * sizeof(float), cudaMemcpyDeviceToHost);
}

/* After a pass's graph (n rows) is launched: the logit rows' copy back when wanted, for more than
 * one best logit per row the top-k kernels (outside the graph: only a sampler that wants them pays)
 * and their keys' copy, and the rows' draws (draw_set) and their tokens' copy; then the wait. */
static cudaError_t pass_finish(cu_ctx *c, uint32_t n, bool want_logits, const muser_top *top, bool tapped, bool drawn)
{
    const size_t V = c->m->hp.n_vocab;
    cudaError_t e = cudaSuccess;
    if (drawn) {
        e = cudaMemcpyAsync(c->d_draw, c->h_draw, offsetof(cu_draw_io, id), cudaMemcpyHostToDevice, c->st);
        bool topp = false;
        for (uint32_t i = 0; i < n; i++) topp |= draws(c, i) && c->h_draw->top_p[i] < 1.0f;
        const cu_draw_par par = {c->d_draw->temp, c->d_draw->top_p, c->d_draw->cut, c->d_draw->u, topp};
        if (!e) e = cu_draw(c->st, c->logits, (uint32_t)V, c->d_best, par, c->d_draw->id, c->d_draw_scratch, n);
        if (!e) e = cudaMemcpyAsync(c->h_draw->id, c->d_draw->id, n * sizeof(int32_t), cudaMemcpyDeviceToHost, c->st);
    }
    if (!e && tapped)
        e = cudaMemcpyAsync(c->h_tap, c->d_tap, (size_t)n * c->tap_nl * c->m->hp.n_embd * sizeof(float),
                            cudaMemcpyDeviceToHost, c->st);
    if (!e && want_logits) e = cudaMemcpyAsync(c->h_logits, c->logits, n * V * sizeof(float), cudaMemcpyDeviceToHost, c->st);
    if (!e && top && top->k > 1) e = cu_topk(c->st, c->logits, (uint32_t)V, c->d_topk_part, c->d_topk, n);
    if (!e && top && top->k > 1)
        e = cudaMemcpyAsync(c->h_topk, c->d_topk, n * CU_TOPK * sizeof(unsigned long long), cudaMemcpyDeviceToHost, c->st);
    if (!e) e = cudaStreamSynchronize(c->st);
    return e;
}

/* The tapped graphs' layer list becomes tap's; when it changes, their generation moves on and each is
 * recorded again at its next use. */
static void tap_use(cu_ctx *c, const muser_tap *tap)
{
    if (tap->n_layers == c->tap_nl && !memcmp(tap->layers, c->tap_layers, tap->n_layers * sizeof *tap->layers)) return;
    memcpy(c->tap_layers, tap->layers, tap->n_layers * sizeof *tap->layers);
    c->tap_nl = tap->n_layers;
    c->tap_gen++;
}

/* The graph to launch: g, or with the tap its tapped twin *gt (recorded now if it is of another
 * generation). */
static int graph_for(cu_ctx *c, cu_seq *sq, uint32_t n, const muser_tap *tap, cudaGraphExec_t g, cudaGraphExec_t *gt,
                     uint64_t *gen, cudaGraphExec_t *out, muser_error *err)
{
    if (!tap) {
        *out = g;
        return MUSER_OK;
    }
    tap_use(c, tap);
    if (!*gt || *gen != c->tap_gen) {
        if (*gt) cudaGraphExecDestroy(*gt);
        *gt = NULL;
        const int rc = record_graph_n(c, sq, n, false, true, gt, err);
        if (rc) return rc;
        *gen = c->tap_gen;
    }
    *out = *gt;
    return MUSER_OK;
}

/* Pass row i's tapped rows into tap->out's row r (pass_finish ran). */
static void tap_out(const cu_ctx *c, const muser_tap *tap, uint32_t i, uint32_t r)
{
    const size_t w = (size_t)tap->n_layers * c->m->hp.n_embd;
    memcpy(tap->out + r * w, c->h_tap + i * w, w * sizeof(float));
}

/* Pass row i's best logits into top's row r (pass_finish ran). */
static void top_out(const cu_ctx *c, const muser_top *top, uint32_t i, uint32_t r)
{
    int32_t *id = top->id + (size_t)r * top->k;
    float *v = top->v ? top->v + (size_t)r * top->k : NULL;
    if (top->k == 1) { /* the graph's argmax */
        id[0] = c->h_flags[i];
        if (v) memcpy(v, &c->h_flags[2 * CU_ROWS_MAX + i], sizeof *v);
        return;
    }
    for (uint32_t j = 0; j < top->k; j++) {
        float x;
        cu_topk_decode(c->h_topk[(size_t)i * CU_TOPK + j], &x, &id[j]);
        if (v) v[j] = x;
    }
}

/* One multi-row pass: row i is token tok[i] of session sqs[i] at position pos[i] (n >= 2 rows, each
 * session rows_ok; a session's rows one run in position order from its next position), row
 * step_row[i] of the caller's step; its logits, where dst[step_row[i]] is non-NULL, or where
 * draw[step_row[i]] is (draw may be NULL) its token drawn on the device into drawn[step_row[i]] (−1 and
 * the row into dst where it was not). K/V are staged and
 * stored after the logits were checked (cu_stage_commit): a failing pass leaves every plane as it
 * was. The sessions' metadata take the appends (the caller restores them on failure: be_step). */
static int rows_pass(cu_ctx *c, cu_seq *const *sqs, const int32_t *tok, const uint64_t *pos, const uint32_t *step_row,
                     uint32_t n, float *const *dst, muser_draw *const *draw, int32_t *drawn, const muser_top *top,
                     const muser_tap *tap, muser_error *err)
{
    const muser_draw *dr[CU_ROWS_MAX];
    for (uint32_t i = 0; i < n; i++) dr[i] = draw ? draw[step_row[i]] : NULL;
    const bool drawing = draw_set(c, dr, n);
    bool want = false; /* any row's logits wanted: dst[step_row[i]], unless the device draws its token */
    for (uint32_t i = 0; dst && i < n; i++) want |= dst[step_row[i]] != NULL && !draws(c, i);
    const uint32_t nl = c->m->hp.n_layer;
    if (!c->g_rows[n]) {
        const int rc = record_graph_n(c, NULL, n, false, false, &c->g_rows[n], err);
        if (rc) return rc;
    }
    uint16_t **kt = (uint16_t **)(c->h_rows + CU_ROWS_MAX * c->row_bytes), **vt = kt + (size_t)nl * CU_ROWS_MAX;
    for (uint32_t i = 0; i < n; i++) {
        cu_seq *sq = sqs[i];
        for (uint32_t l = 0; l < nl; l++) {
            const int rc = kv_plane_append(&sq->kv.planes[l], pos[i], NULL, NULL, err);
            if (rc) return rc;
            kt[(size_t)l * CU_ROWS_MAX + i] = sq->pl[l].kp;
            vt[(size_t)l * CU_ROWS_MAX + i] = sq->pl[l].vp;
        }
        cu_step *st = (cu_step *)(c->h_rows + i * c->row_bytes);
        step_write(sq, st, pos[i], tok[i]);
        if (i > 0 && sqs[i - 1] == sq) { /* the run goes on: its first row's stage */
            const cu_step *prev = (const cu_step *)(c->h_rows + (i - 1) * c->row_bytes);
            st->stage_pos = prev->stage_pos;
            st->stage_row = prev->stage_row;
        } else {
            st->stage_pos = pos[i];
            st->stage_row = i;
        }
    }
    if (c->profile && !(c->rows_profiled >> n & 1)) { /* MUSER_CUDA_PROFILE: once per row count, before the replay */
        c->rows_profiled |= 1u << n;
        char what[64];
        snprintf(what, sizeof what, "a pass of %u rows", n);
        const int rc = profile_pass(c, NULL, n, what, err);
        if (rc) return rc;
    }
    const size_t V = c->m->hp.n_vocab;
    cudaGraphExec_t g;
    const int rg = graph_for(c, NULL, n, tap, c->g_rows[n], &c->g_rows_tap[n], &c->g_rows_tap_gen[n], &g, err);
    if (rg) return rg;
    cudaError_t e = pass_launch(c, NULL, n, tap != NULL, g);
    if (!e) e = pass_finish(c, n, want, top, tap != NULL, drawing);
    if (e) return muser_errorf(err, MUSER_E_BACKEND, "cuda: a pass of %u rows: %s", n, cudaGetErrorString(e));
    for (uint32_t i = 0; i < n; i++)
        if (c->h_flags[CU_ROWS_MAX + i] != 0)
            return muser_errorf(err, MUSER_E_NUMERIC, "cuda: non-finite logits in step row %u (position %llu; fail closed)",
                                step_row[i], (unsigned long long)pos[i]);
    for (uint32_t i = 0; i < n; i++) {
        float *to = dst ? dst[step_row[i]] : NULL;
        if (dr[i]) {
            e = draw_out(c, i, want, to, &drawn[step_row[i]]);
            if (e) return muser_errorf(err, MUSER_E_BACKEND, "cuda: a pass's row copy: %s", cudaGetErrorString(e));
        } else if (want && to) {
            memcpy(to, c->h_logits + i * V, V * sizeof(float));
        }
    }
    for (uint32_t i = 0; top && i < n; i++) top_out(c, top, i, step_row[i]);
    for (uint32_t i = 0; tap && i < n; i++) tap_out(c, tap, i, step_row[i]);
    return MUSER_OK;
}

/* One token at pos through the session's graph; logits (if non-NULL: the only time the row is copied
 * back, unless dr, non-NULL, has its token drawn on the device into *drawn: −1 and the row into
 * logits where it was not) and the best logits (top, if non-NULL, its row r) out. */
static int decode_one(cu_seq *sq, int32_t token, uint64_t pos, float *logits, const muser_draw *dr, int32_t *drawn,
                      const muser_top *top, uint32_t r, const muser_tap *tap, muser_error *err)
{
    cu_ctx *c = sq->c;
    const bool drawing = draw_set(c, &dr, 1);
    kv_plane *saved_meta = sq->meta_step;
    const uint32_t nl = sq->kv.n_layer;
    memcpy(saved_meta, sq->kv.planes, nl * sizeof(kv_plane));
    for (uint32_t l = 0; l < nl; l++) {
        int rc = kv_plane_append(&sq->kv.planes[l], pos, NULL, NULL, err);
        if (rc) {
            memcpy(sq->kv.planes, saved_meta, nl * sizeof(kv_plane));
            return rc;
        }
    }
    step_fill(sq, pos, token);
    const size_t V = c->m->hp.n_vocab;
    cudaGraphExec_t g;
    int rg = sq->g_fwd || c->eager ? MUSER_OK : record_graph(c, sq, false, &sq->g_fwd, err);
    if (!rg) rg = graph_for(c, sq, 1, tap, sq->g_fwd, &sq->g_tap, &sq->g_tap_gen, &g, err);
    if (rg) {
        memcpy(sq->kv.planes, saved_meta, nl * sizeof(kv_plane));
        return rg;
    }
    cudaError_t e = pass_launch(c, sq, 1, tap != NULL, g);
    const bool want = logits && !draws(c, 0);
    if (!e) e = pass_finish(c, 1, want, top, tap != NULL, drawing);
    if (e) {
        memcpy(sq->kv.planes, saved_meta, nl * sizeof(kv_plane));
        return muser_errorf(err, MUSER_E_BACKEND, "cuda: decode at position %llu: %s", (unsigned long long)pos,
                            cudaGetErrorString(e));
    }
    if (c->h_flags[CU_ROWS_MAX] != 0) {
        memcpy(sq->kv.planes, saved_meta, nl * sizeof(kv_plane));
        return muser_errorf(err, MUSER_E_NUMERIC, "cuda: non-finite logits at position %llu (fail closed)",
                            (unsigned long long)pos);
    }
    if (dr) {
        e = draw_out(c, 0, want, logits, drawn);
        if (e) return muser_errorf(err, MUSER_E_BACKEND, "cuda: a row copy: %s", cudaGetErrorString(e));
    } else if (logits) {
        memcpy(logits, c->h_logits, V * sizeof(float));
    }
    if (top) top_out(c, top, 0, r);
    if (tap) tap_out(c, tap, 0, r);
    return MUSER_OK;
}

/* ---- the prefill route ---------------------------------------------------------------------------
 * src/forward.c's op sequence over a chunk of one session's consecutive rows (fwd_run with these
 * ops), each op a few kernels of prefill.cu on the context's stream; no graph (the kernels are
 * large). The matrices run as f16-pair GEMMs on tensor cores (prefill.cuh says why that keeps
 * SPEC §4), the last row's logits through the decode route's LM head (all rows': the GEMM). */
#define PF_ROWS_MAX 512u

struct cu_pf {
    uint32_t rows;                    /* chunk capacity */
    float *buf[FWD_BUF_COUNT];        /* [rows][width] */
    uint32_t width[FWD_BUF_COUNT];
    __half *xh, *xl;                  /* [rows][kmax] a matrix input's f16 pair */
    __half *xsh, *xsl;                /* [rows][kmax/32] its Q4_K sub-block sums (pf_split_kq) */
    float *part;                      /* the K-quant GEMM's partial sums (pf_kq_part_bytes) */
    float *rs;                        /* [rows] its inverse row scales */
    __half *wh, *wl;                  /* [wcap] a general-path matrix's (or LM-head slab's) f16 pair */
    size_t wcap;                      /* elements of each (0: every matrix takes the K-quant GEMM) */
    uint16_t *sk, *sv;                /* [n_layer][rows][KVD] the pass's staged K/V */
    int32_t *tok;                     /* [rows] */
    int32_t *d_bad;                   /* non-finite logits of the pass */
    float *logits;                    /* [rows][V] every row's logits (made when first wanted) */
    void *mem;                        /* one allocation for all but logits */
    /* the pass in flight: its sessions' runs of rows (one, or several for a chunk in parts), kept
     * between the parts of a chunk */
    uint64_t pos[PF_ROWS_MAX];        /* each row's position */
    uint32_t n_seg;
    struct {
        cu_seq *sq;
        uint32_t row0, n;             /* its rows of the pass */
    } seg[MUSER_PREFILL_MAX_SEQS];
    float *seg_logits;                /* [MUSER_PREFILL_MAX_SEQS][V] the runs' last rows (made when first wanted) */
    float *out;                       /* host: the logits the caller wants (NULL: none) */
    /* MUSER_CUDA_PROFILE=1: seconds per op family (each op synchronised), printed per call */
    bool prof;
    double prof_s[16];
};

/* The prefill route's op families, for MUSER_CUDA_PROFILE. */
enum { PFP_EMBED, PFP_NORM, PFP_SPLIT, PFP_UNPACK, PFP_GEMM, PFP_STAGE, PFP_ATTN, PFP_ELEM, PFP_HEAD, PFP_STORE, PFP_N };
static const char *const pfp_name[PFP_N] = {"embed", "norms+tails", "x split", "w unpack", "gemm", "qk-norm/rope/stage",
                                            "attention", "gate+swiglu", "lm head", "kv store"};
/* Run stmt; under MUSER_CUDA_PROFILE, wait for it and add its time to family f. */
#define PF_T(pf, f, stmt)                                    \
    do {                                                     \
        const double t0_ = (pf)->prof ? muser_now_s() : 0;  \
        stmt;                                                \
        if ((pf)->prof) {                                    \
            cudaStreamSynchronize(c->st);                    \
            (pf)->prof_s[f] += muser_now_s() - t0_;          \
        }                                                    \
    } while (0)

static void pf_free(cu_pf *pf)
{
    if (!pf) return;
    cudaFree(pf->mem);
    cudaFree(pf->logits);
    cudaFree(pf->seg_logits);
    free(pf);
}

/* The workspace for chunks of up to `rows` rows, made once per device. */
static int pf_ws(cu_ctx *c, uint32_t rows, muser_error *err)
{
    if (c->pf && c->pf->rows >= rows) return MUSER_OK;
    pf_free(c->pf);
    c->pf = NULL;
    const muser_hparams *hp = &c->m->hp;
    cu_pf *pf = (cu_pf *)calloc(1, sizeof *pf);
    if (!pf) return muser_errorf(err, MUSER_E_NOMEM, "cuda: out of memory");
    const uint32_t E = hp->n_embd, F = hp->n_ff, QD = hp->n_head * hp->head_dim, KD = hp->n_head_kv * hp->head_dim;
    const uint32_t w[FWD_BUF_COUNT] = {[FWD_H] = E, [FWD_X] = E, [FWD_Q] = QD, [FWD_K] = KD, [FWD_V] = KD,
                                       [FWD_G] = QD, [FWD_O] = QD, [FWD_SUB] = E, [FWD_FG] = F, [FWD_FU] = F};
    size_t wcap = 0;
    for (uint32_t l = 0; l < hp->n_layer; l++) {
        const cu_layer *L = &c->layers[l];
        const mv_mat *ms[] = {&L->q, &L->k, &L->v, &L->gate, &L->o, &L->ffn_gate, &L->ffn_up, &L->ffn_down};
        for (const mv_mat *mm : ms)
            if (!pf_kq_ok(mm) && (size_t)mm->rows * mm->cols > wcap) wcap = (size_t)mm->rows * mm->cols;
    }
    /* at least one GEMM tile of LM-head rows */
    if (!pf_kq_ok(&c->out) && (size_t)PF_TN * E > wcap) wcap = (size_t)PF_TN * E;
    const uint32_t kmax = E > QD ? (E > F ? E : F) : (QD > F ? QD : F);
    size_t off = 0, at[FWD_BUF_COUNT + 8];
    int k = 0;
    for (int b = 0; b < FWD_BUF_COUNT; b++) at[k++] = off, off = align256(off + (size_t)rows * w[b] * sizeof(float));
    const size_t o_xh = off; off = align256(off + (size_t)rows * kmax * 2);
    const size_t o_xl = off; off = align256(off + (size_t)rows * kmax * 2);
    const size_t o_xsh = off; off = align256(off + (size_t)rows * (kmax / 32) * 2);
    const size_t o_xsl = off; off = align256(off + (size_t)rows * (kmax / 32) * 2);
    const size_t o_part = off; off = align256(off + pf_kq_part_bytes(rows));
    const size_t o_rs = off; off = align256(off + (size_t)rows * 4);
    const size_t o_wh = off; off = align256(off + wcap * 2);
    const size_t o_wl = off; off = align256(off + wcap * 2);
    const size_t stage = (size_t)hp->n_layer * rows * KD * 2;
    const size_t o_sk = off; off = align256(off + stage);
    const size_t o_sv = off; off = align256(off + stage);
    const size_t o_tok = off; off = align256(off + (size_t)rows * 4);
    const size_t o_bad = off; off = align256(off + 4);
    cudaError_t e = cudaMalloc(&pf->mem, off);
    if (e) {
        free(pf);
        return muser_errorf(err, MUSER_E_NOMEM, "cuda: prefill workspace (%.1f MB for chunks of %u rows): %s", off / 1e6,
                            rows, cudaGetErrorString(e));
    }
    uint8_t *base = (uint8_t *)pf->mem;
    for (int b = 0; b < FWD_BUF_COUNT; b++) pf->buf[b] = (float *)(base + at[b]), pf->width[b] = w[b];
    pf->xh = (__half *)(base + o_xh);
    pf->xl = (__half *)(base + o_xl);
    pf->xsh = (__half *)(base + o_xsh);
    pf->xsl = (__half *)(base + o_xsl);
    pf->part = (float *)(base + o_part);
    pf->rs = (float *)(base + o_rs);
    pf->wh = (__half *)(base + o_wh);
    pf->wl = (__half *)(base + o_wl);
    pf->wcap = wcap;
    pf->sk = (uint16_t *)(base + o_sk);
    pf->sv = (uint16_t *)(base + o_sv);
    pf->tok = (int32_t *)(base + o_tok);
    pf->d_bad = (int32_t *)(base + o_bad);
    pf->rows = rows;
    const char *pp = getenv("MUSER_CUDA_PROFILE");
    pf->prof = pp && pp[0] == '1';
    c->pf = pf;
    fprintf(stderr, "cuda: prefill workspace %.1f MB for chunks of %u rows (kept with the device)\n", off / 1e6, rows);
    return MUSER_OK;
}

/* The device copies of a model tensor: a matrix, or a vector (norm weights; NULL for NULL). */
static const mv_mat *pf_mat(const cu_ctx *c, const muser_tensor *t)
{
    const muser_model *m = c->m;
    if (t == &m->output) return &c->out;
    for (uint32_t l = 0; l < m->hp.n_layer; l++) {
        const muser_layer *L = &m->layers[l];
        const cu_layer *D = &c->layers[l];
        if (t == &L->attn_q) return &D->q;
        if (t == &L->attn_k) return &D->k;
        if (t == &L->attn_v) return &D->v;
        if (t == &L->attn_gate) return &D->gate;
        if (t == &L->attn_output) return &D->o;
        if (t == &L->ffn_gate) return &D->ffn_gate;
        if (t == &L->ffn_up) return &D->ffn_up;
        if (t == &L->ffn_down) return &D->ffn_down;
    }
    return NULL;
}

static const float *pf_vec(const cu_ctx *c, const muser_tensor *t)
{
    const muser_model *m = c->m;
    if (!t || !t->data) return NULL;
    if (t == &m->output_norm) return c->out_norm;
    for (uint32_t l = 0; l < m->hp.n_layer; l++) {
        const muser_layer *L = &m->layers[l];
        const cu_layer *D = &c->layers[l];
        if (t == &L->attn_norm) return D->attn_norm;
        if (t == &L->attn_q_norm) return D->q_norm;
        if (t == &L->attn_k_norm) return D->k_norm;
        if (t == &L->post_attention_norm) return D->post_attn_norm;
        if (t == &L->ffn_norm) return D->ffn_norm;
        if (t == &L->post_ffw_norm) return D->post_ffw_norm;
    }
    return NULL;
}

static cu_plane_meta pf_meta(const kv_plane *pl)
{
    cu_plane_meta m;
    m.origin_logical = pl->origin_logical;
    m.origin_physical = pl->origin_physical;
    m.len = pl->len;
    m.capacity = pl->capacity;
    return m;
}

static void pfo_embed(void *be, const fwd_rows *r, bool entry_norm, float eps)
{
    cu_ctx *c = (cu_ctx *)be;
    cudaMemcpyAsync(c->pf->tok, r->tokens, r->n * sizeof(int32_t), cudaMemcpyHostToDevice, c->st);
    PF_T(c->pf, PFP_EMBED, pf_embed(c->st, &c->emb, c->pf->tok, r->n, c->pf->buf[FWD_H], c->m->hp.n_embd, entry_norm, eps));
}

static void pfo_rmsnorm(void *be, const fwd_rows *r, fwd_buf src, const muser_tensor *w, float eps, fwd_buf dst)
{
    cu_ctx *c = (cu_ctx *)be;
    PF_T(c->pf, PFP_NORM, pf_rmsnorm(c->st, c->pf->buf[src], pf_vec(c, w), eps, c->pf->buf[dst], r->n, c->pf->width[src]));
}

/* The x pair a matrix reads: kinds 0 (general path), 1 (Q4_KT order), 2 (Q6_KT order). */
static int pf_x_kind(const mv_mat *mat) { return !pf_kq_ok(mat) ? 0 : mat->type == MV_T_Q6_KT ? 2 : 1; }

/* Split rows of x for mat unless *have (the kind split last in this op; -1: none) is its kind. */
static void pf_split_for(cu_ctx *c, const mv_mat *mat, const float *x, uint64_t ldx, uint32_t n, int *have)
{
    cu_pf *pf = c->pf;
    const int kind = pf_x_kind(mat);
    if (kind == *have) return;
    if (kind == 0) PF_T(pf, PFP_SPLIT, pf_split_x(c->st, x, ldx, n, mat->cols, pf->xh, pf->xl, pf->rs));
    else PF_T(pf, PFP_SPLIT, pf_split_kq(c->st, x, ldx, n, mat->cols, kind == 2, pf->xh, pf->xl, pf->xsh, pf->xsl, pf->rs));
    *have = kind;
}

/* y (row stride ldy) = x · mat^T for n rows (x split for it: pf_split_for). A K-quant matrix in
 * its tensor-core layout: one GEMM reading it as it is. Otherwise the matrix unpacked in slabs of
 * whole GEMM tiles that fit the workspace, each slab's GEMM as soon as it is unpacked. */
static void pf_matmul(cu_ctx *c, const mv_mat *mat, uint32_t n, float *y, uint64_t ldy, uint32_t op, float scale,
                      float cap)
{
    cu_pf *pf = c->pf;
    if (pf_kq_ok(mat)) {
        PF_T(pf, PFP_GEMM, pf_gemm_kq(c->st, pf->xh, pf->xl, pf->xsh, pf->xsl, pf->rs, n, mat, y, ldy, op, scale, cap, pf->part));
        return;
    }
    uint32_t slab = (uint32_t)(pf->wcap / mat->cols);
    if (slab >= mat->rows) slab = mat->rows;
    else slab = slab / PF_TN * PF_TN;
    for (uint32_t r0 = 0; r0 < mat->rows; r0 += slab) {
        const uint32_t nr = mat->rows - r0 < slab ? mat->rows - r0 : slab;
        PF_T(pf, PFP_UNPACK, pf_unpack_w(c->st, mat, r0, nr, pf->wh, pf->wl));
        PF_T(pf, PFP_GEMM, pf_gemm(c->st, pf->xh, pf->xl, pf->rs, n, pf->wh, pf->wl, nr, mat->cols, y + r0, ldy, op, scale, cap));
    }
}

static void pfo_matmul(void *be, const fwd_rows *r, fwd_buf src, const fwd_matmul *mm, uint32_t n_mm)
{
    cu_ctx *c = (cu_ctx *)be;
    cu_pf *pf = c->pf;
    /* matrices that lie back to back (the stacked q, k, gate) run as one launch */
    int have = -1;
    bool done[8] = {false};
    for (uint32_t i = 0; i < n_mm && i < 8; i++) {
        if (done[i]) continue;
        const mv_mat *mat = pf_mat(c, mm[i].w);
        pf_split_for(c, mat, pf->buf[src], pf->width[src], r->n, &have);
        mv_mat ws[4] = {*mat};
        float *ys[4] = {pf->buf[mm[i].dst]};
        uint64_t lds[4] = {pf->width[mm[i].dst]};
        uint32_t nw = 1;
        for (bool more = pf_kq_ok(mat); more && nw < 4;) {
            more = false;
            for (uint32_t j = i + 1; j < n_mm && j < 8; j++)
                if (!done[j] && pf_kq_adjacent(&ws[nw - 1], pf_mat(c, mm[j].w))) {
                    done[j] = more = true;
                    ws[nw] = *pf_mat(c, mm[j].w);
                    ys[nw] = pf->buf[mm[j].dst];
                    lds[nw++] = pf->width[mm[j].dst];
                    break;
                }
        }
        if (nw > 1)
            PF_T(pf, PFP_GEMM, pf_gemm_kq_n(c->st, pf->xh, pf->xl, pf->xsh, pf->xsl, pf->rs, r->n, ws, nw, ys, lds,
                                            MV_OP_STORE, 1.f, 0.f, pf->part));
        else
            pf_matmul(c, mat, r->n, ys[0], lds[0], MV_OP_STORE, 1.f, 0.f);
    }
}

static void pfo_attn_stage(void *be, const fwd_rows *r, uint32_t l, const muser_tensor *q_norm,
                           const muser_tensor *k_norm, float eps, bool rope, bool neox)
{
    cu_ctx *c = (cu_ctx *)be;
    cu_pf *pf = c->pf;
    const muser_hparams *hp = &c->m->hp;
    const size_t QD = (size_t)hp->n_head * hp->head_dim, KD = (size_t)hp->n_head_kv * hp->head_dim;
    const size_t st = (size_t)l * pf->rows * KD;
    for (uint32_t g = 0; g < pf->n_seg; g++) { /* each run at its own positions */
        const size_t i0 = pf->seg[g].row0;
        PF_T(pf, PFP_STAGE, pf_stage(c->st, pf->buf[FWD_Q] + i0 * QD, pf->buf[FWD_K] + i0 * KD, pf->buf[FWD_V] + i0 * KD,
                                     pf_vec(c, q_norm), pf_vec(c, k_norm), eps, rope, neox, c->rope_inv, r->pos[i0],
                                     pf->seg[g].n, hp->n_head, hp->n_head_kv, hp->head_dim, pf->sk + st + i0 * KD,
                                     pf->sv + st + i0 * KD));
    }
}

static void pfo_attention(void *be, const fwd_rows *r, uint32_t l, uint32_t window, float scale)
{
    cu_ctx *c = (cu_ctx *)be;
    cu_pf *pf = c->pf;
    const muser_hparams *hp = &c->m->hp;
    const size_t QD = (size_t)hp->n_head * hp->head_dim, KD = (size_t)hp->n_head_kv * hp->head_dim;
    const size_t st = (size_t)l * pf->rows * KD;
    for (uint32_t g = 0; g < pf->n_seg; g++) { /* each run over its own session's plane and staged rows */
        const cu_seq *sq = pf->seg[g].sq;
        const kv_plane *pl = &sq->kv.planes[l];
        const cu_plane_meta meta = pf_meta(pl);
        const size_t i0 = pf->seg[g].row0;
        const float *q = pf->buf[FWD_Q] + i0 * QD;
        const uint16_t *sk = pf->sk + st + i0 * KD, *sv = pf->sv + st + i0 * KD;
        float *o = pf->buf[FWD_O] + i0 * QD;
        /* the tensor-core kernel where it takes the geometry (pfattn.cuh), else the plain one */
        PF_T(pf, PFP_ATTN, {
            if (pf_attention_tc(c->st, q, sk, sv, sq->pl[l].kp, sq->pl[l].vp, &meta, pl->ring, r->pos[i0], pf->seg[g].n,
                                window, scale, hp->n_head, hp->n_head_kv, hp->head_dim, o))
                pf_attention(c->st, q, sk, sv, sq->pl[l].kp, sq->pl[l].vp, &meta, pl->ring, r->pos[i0], pf->seg[g].n,
                             window, scale, hp->n_head, hp->n_head_kv, hp->head_dim, o);
        });
    }
}

static void pfo_gate(void *be, const fwd_rows *r)
{
    cu_ctx *c = (cu_ctx *)be;
    PF_T(c->pf, PFP_ELEM, pf_gate(c->st, c->pf->buf[FWD_O], c->pf->buf[FWD_G], (uint64_t)r->n * c->pf->width[FWD_O]));
}

static void pfo_swiglu(void *be, const fwd_rows *r)
{
    cu_ctx *c = (cu_ctx *)be;
    PF_T(c->pf, PFP_ELEM, pf_swiglu(c->st, c->pf->buf[FWD_FG], c->pf->buf[FWD_FU], (uint64_t)r->n * c->pf->width[FWD_FG]));
}

static void pfo_tail(void *be, const fwd_rows *r, const muser_tensor *w_post, float eps_post, const muser_tensor *w_next,
                     float eps_next, fwd_buf dst)
{
    cu_ctx *c = (cu_ctx *)be;
    cu_pf *pf = c->pf;
    PF_T(pf, PFP_NORM, pf_tail(c->st, pf->buf[FWD_SUB], pf->buf[FWD_H], pf_vec(c, w_post), eps_post, pf_vec(c, w_next),
                               eps_next, pf->buf[dst], r->n, c->m->hp.n_embd));
}

/* The last row of each run: the decode route's LM head (its digits prepared from that row). Every
 * row (one run): the GEMM over slabs of the head. Then the non-finite count over what was
 * computed, and only then the copy to the caller. */
static int pfo_lm_head(void *be, const fwd_rows *r, fwd_buf src, const muser_tensor *w, float scale, float cap,
                       bool all_rows, muser_error *err)
{
    cu_ctx *c = (cu_ctx *)be;
    cu_pf *pf = c->pf;
    const uint32_t V = c->m->hp.n_vocab, E = c->m->hp.n_embd;
    const mv_mat *head = pf_mat(c, w);
    const size_t part = (size_t)c->tp_rank * head->rows; /* a rank's vocabulary rows (tensor parallel) */
    cudaMemsetAsync(pf->d_bad, 0, sizeof(int32_t), c->st);
    const float *y;
    uint64_t ny = V;
    if (all_rows) {
        if (!pf->logits)
            CU_TRY(cudaMalloc((void **)&pf->logits, (size_t)pf->rows * V * sizeof(float)), "prefill logits");
        int have = -1;
        pf_split_for(c, head, pf->buf[src], E, r->n, &have);
        pf_matmul(c, head, r->n, pf->logits + part, V, MV_OP_SOFTCAP, scale, cap);
        CU_TRY(tp_gather(c, c->st, pf->logits, r->n, head->rows, V), "tensor parallel: the logits' gather");
        y = pf->logits;
        ny = (uint64_t)r->n * V;
    } else {
        float *out = c->logits;
        if (pf->n_seg > 1) {
            if (!pf->seg_logits)
                CU_TRY(cudaMalloc((void **)&pf->seg_logits, (size_t)MUSER_PREFILL_MAX_SEQS * V * sizeof(float)),
                       "prefill logits");
            out = pf->seg_logits;
            ny = (uint64_t)pf->n_seg * V;
        }
        for (uint32_t g = 0; g < pf->n_seg; g++) {
            set_site(c, XS_STACK);
            mv_launch hl;
            memset(&hl, 0, sizeof hl);
            seg_set(&hl, head, out + (size_t)g * V + part, MV_OP_SOFTCAP, (uint32_t)mv_rows_per_warp(head->type));
            hl.seg[0].scale = scale;
            hl.seg[0].cap = cap;
            const size_t last = pf->seg[g].row0 + pf->seg[g].n - 1;
            PF_T(pf, PFP_HEAD, mv_go(c, c->st, &hl, pf->buf[src] + last * E, 0));
        }
        CU_TRY(tp_gather(c, c->st, out, pf->n_seg, head->rows, V), "tensor parallel: the logits' gather");
        y = out;
    }
    pf_count_nonfinite(c->st, y, ny, pf->d_bad);
    CU_TRY(cudaMemcpyAsync(c->h_flags + 1, pf->d_bad, sizeof(int32_t), cudaMemcpyDeviceToHost, c->st), "prefill check");
    CU_TRY(cudaStreamSynchronize(c->st), "prefill");
    CU_TRY(cudaGetLastError(), "prefill launch");
    const int32_t bad = c->h_flags[1];
    if (bad)
        return muser_errorf(err, MUSER_E_NUMERIC, "cuda: %d non-finite logits in the prefill of positions %llu..%llu "
                            "(fail closed)", bad, (unsigned long long)r->pos[0], (unsigned long long)r->pos[r->n - 1]);
    if (pf->out) /* [n][V] (one run), or each run's last row's [V] */
        CU_TRY(cudaMemcpy(pf->out, y, ny * sizeof(float), cudaMemcpyDeviceToHost), "prefill logits copy");
    return MUSER_OK;
}

/* Every layer's staged rows into the planes, after the host metadata took the appends. */
static int pfo_kv_append_staged(void *be, const fwd_rows *r, muser_error *err)
{
    cu_ctx *c = (cu_ctx *)be;
    cu_pf *pf = c->pf;
    const muser_hparams *hp = &c->m->hp;
    const size_t KD = (size_t)hp->n_head_kv * hp->head_dim;
    for (uint32_t g = 0; g < pf->n_seg; g++) {
        cu_seq *sq = pf->seg[g].sq;
        const uint32_t i0 = pf->seg[g].row0, n = pf->seg[g].n;
        for (uint32_t l = 0; l < hp->n_layer; l++) {
            kv_plane *pl = &sq->kv.planes[l];
            for (uint32_t i = i0; i < i0 + n; i++) {
                const int rc = kv_plane_append(pl, r->pos[i], NULL, NULL, err);
                if (rc) return rc; /* positions were checked up front: cannot happen */
            }
            const cu_plane_meta meta = pf_meta(pl);
            const size_t st = (size_t)l * pf->rows * KD + i0 * KD;
            PF_T(pf, PFP_STORE, pf_store(c->st, pf->sk + st, pf->sv + st, sq->pl[l].kp, sq->pl[l].vp, &meta, pl->ring,
                                         r->pos[i0], n, hp->n_head_kv, hp->head_dim));
        }
    }
    CU_TRY(cudaStreamSynchronize(c->st), "prefill KV store");
    CU_TRY(cudaGetLastError(), "prefill KV store");
    return MUSER_OK;
}

/* Tensor parallel: buf's rows = their sum over the ranks (one rank: nothing) */
static void pfo_reduce(void *be, const fwd_rows *r, fwd_buf buf)
{
    cu_ctx *c = (cu_ctx *)be;
    tp_reduce(c, c->st, c->pf->buf[buf], (size_t)r->n * c->pf->width[buf]);
}

/* r->tap->out[i][slot] = FWD_H row i */
static void pfo_tap(void *be, const fwd_rows *r, uint32_t slot)
{
    cu_ctx *c = (cu_ctx *)be;
    const uint32_t E = c->m->hp.n_embd;
    cudaMemcpy2DAsync(r->tap->out + (size_t)slot * E, (size_t)r->tap->n_layers * E * sizeof(float), c->pf->buf[FWD_H],
                      (size_t)E * sizeof(float), (size_t)E * sizeof(float), r->n, cudaMemcpyDeviceToHost, c->st);
}

static const fwd_ops pf_ops = {pfo_embed, pfo_rmsnorm,  pfo_matmul, pfo_attn_stage, pfo_attention, pfo_gate,
                               pfo_swiglu, pfo_tail, pfo_lm_head, pfo_kv_append_staged, pfo_tap, pfo_reduce};

/* Whether the prefill route takes this model: every matrix's columns a whole number of GEMM steps. */
static bool pf_model_ok(const cu_ctx *c)
{
    const muser_hparams *hp = &c->m->hp;
    return pf_shape_ok(hp->n_embd) && pf_shape_ok(hp->n_head * hp->head_dim) && pf_shape_ok(hp->n_ff) &&
           hp->head_dim % 32 == 0 && hp->head_dim <= 128;
}

/* Layers [l0, l1) of the pass of m rows whose runs pf->seg hold (fwd_run_layers; pf->pos set by
 * the part that starts it); out: the logits the caller wants ([m][V] of one run, each run's last
 * row's [V], or NULL). */
static int pf_chunk(cu_ctx *c, const int32_t *tokens, uint32_t m, uint32_t l0, uint32_t l1, float *out, bool all_logits,
                    const muser_tap *tap, muser_error *err)
{
    cu_pf *pf = c->pf;
    fwd_rows r;
    memset(&r, 0, sizeof r);
    r.n = m;
    r.tokens = tokens;
    r.pos = pf->pos;
    r.route = FWD_ROUTE_BATCH;
    r.tap = tap;
    pf->out = out;
    const int rc = fwd_run_layers(&pf_ops, c, c->m, &r, l0, l1, all_logits ? 2 : out ? 1 : 0, err);
    const cudaError_t te = tp_failed(c); /* (cleared either way) */
    if (!rc && te)
        return muser_errorf(err, MUSER_E_BACKEND, "cuda: tensor parallel: a collective of the prefill: %s",
                            cudaGetErrorString(te));
    return rc;
}

/* The pass is m rows of one session from position p0. */
static void pf_one_run(cu_pf *pf, cu_seq *sq, uint32_t m, uint64_t p0)
{
    pf->n_seg = 1;
    pf->seg[0].sq = sq;
    pf->seg[0].row0 = 0;
    pf->seg[0].n = m;
    for (uint32_t i = 0; i < m; i++) pf->pos[i] = p0 + i;
}

/* MUSER_CUDA_PROFILE: the time per op family since the last print, then zeroed. */
static void pf_prof_print(cu_pf *pf, uint32_t n, uint64_t p0)
{
    double total = 0;
    for (int f = 0; f < PFP_N; f++) total += pf->prof_s[f];
    fprintf(stderr, "muser: prefill profile, %u rows from position %llu (each op synchronised): %.1f ms\n", n,
            (unsigned long long)p0, total * 1e3);
    for (int f = 0; f < PFP_N; f++) {
        if (pf->prof_s[f] > 0)
            fprintf(stderr, "  %-20s %9.2f ms  %5.1f%%\n", pfp_name[f], pf->prof_s[f] * 1e3, 100 * pf->prof_s[f] / total);
        pf->prof_s[f] = 0;
    }
}

/* the rows of one prefill chunk on this device: max_batch, at most the workspace's PF_ROWS_MAX */
static uint32_t pf_chunk_rows(uint32_t max_batch)
{
    return max_batch && max_batch < PF_ROWS_MAX ? max_batch : PF_ROWS_MAX;
}

/* tokens[0..n) at position p0 of sq in chunks of the workspace's rows; logits as be_forward's.
 * The caller restores the session on failure. */
static int pf_forward(cu_seq *sq, const int32_t *tokens, uint32_t n, uint64_t p0, float *logits, bool all_logits,
                      uint32_t max_batch, const muser_tap *tap, muser_error *err)
{
    cu_ctx *c = sq->c;
    const uint32_t chunk = pf_chunk_rows(max_batch);
    int rc = pf_ws(c, chunk, err);
    if (rc) return rc;
    cu_pf *pf = c->pf;
    const uint64_t V = c->m->hp.n_vocab;
    for (uint32_t c0 = 0; c0 < n; c0 += chunk) {
        const uint32_t m = n - c0 < chunk ? n - c0 : chunk;
        muser_tap chunk_tap; /* the tap's rows of this chunk */
        if (tap) {
            chunk_tap = *tap;
            chunk_tap.out = tap->out + (size_t)c0 * tap->n_layers * c->m->hp.n_embd;
        }
        const bool last = c0 + m == n;
        float *out = !logits ? NULL : all_logits ? logits + (size_t)c0 * V : last ? logits : NULL;
        pf_one_run(pf, sq, m, p0 + c0);
        rc = pf_chunk(c, tokens + c0, m, 0, c->m->hp.n_layer, out, all_logits, tap ? &chunk_tap : NULL, err);
        if (rc) return rc;
    }
    if (pf->prof) pf_prof_print(pf, n, p0);
    return MUSER_OK;
}

/* ---- session vtable -------------------------------------------------------------------------- */
static void be_dev_free(muser_device *d);
static int be_dev_init(muser_device *d, muser_error *err)
{
    cu_ctx *c = NULL;
    int rc = ctx_new(&c, d->model, d->opts.n_ctx, d->opts.device, err);
    if (rc) return rc;
    d->be_state = c;
    if (d->opts.tp) { /* a rank of a split (tp.c): its reduce; the host's makes the passes eager */
        c->tp = d->opts.tp;
        c->tp_n = muser_tp_comm_ranks(d->opts.tp);
        c->tp_rank = d->opts.tp_rank;
        c->nccl = d->opts.tp_nccl;
        c->eager = c->tp_n > 1 && !c->nccl;
    }
    d->max_rows = MUSER_STEP_MAX_ROWS;
    d->prefill_rows = pf_model_ok(c) ? PF_TM : 0; /* below one GEMM tile a call costs as much as a tile */
    /* chunks in parts: the prefill route's (a tensor-parallel rank runs its chunks whole, tp.c) */
    d->part_rows = pf_model_ok(c) && c->tp_n < 2 ? pf_chunk_rows(d->opts.max_batch) : 0;
    /* a verify block of n rows in decode steps: one multi-row pass, as measured on the synthesized
     * Glimmer (H200, `muser bench --verify`: 1.54 / 1.76 / 2.91 / 5.39 at 2 / 4 / 8 / 16 rows),
     * linear between those points */
    {
        static const double at[5][2] = {{1, 1.0}, {2, 1.54}, {4, 1.76}, {8, 2.91}, {16, 5.39}};
        for (uint32_t n = 1; n <= KV_MAX_SPEC_ROWS; n++)
            for (int i = 0; i < 4; i++)
                if (n >= at[i][0] && n <= at[i + 1][0])
                    d->pass_cost[n] = at[i][1] + (at[i + 1][1] - at[i][1]) * (n - at[i][0]) / (at[i + 1][0] - at[i][0]);
    }
    c->step_logits = (float *)malloc((size_t)MUSER_STEP_MAX_ROWS * d->model->hp.n_vocab * sizeof(float));
    if (!c->step_logits) {
        be_dev_free(d);
        return muser_errorf(err, MUSER_E_NOMEM, "cuda: out of memory for a step's logits");
    }
    return MUSER_OK;
}

static void be_dev_free(muser_device *d)
{
    ctx_free((cu_ctx *)d->be_state);
    d->be_state = NULL;
}

static int be_init(muser_session *s, muser_error *err)
{
    bind_dev((cu_ctx *)s->dev->be_state);
    cu_seq *sq = NULL;
    int rc = seq_new(&sq, (cu_ctx *)s->dev->be_state, s->opts.n_ctx, err);
    if (rc) return rc;
    s->be_state = sq;
    return MUSER_OK;
}

static void be_free(muser_session *s)
{
    if (s->be_state) bind_dev(((const cu_seq *)s->be_state)->c);
    seq_free((cu_seq *)s->be_state);
    s->be_state = NULL;
}

/* Copy every SWA ring to ring_undo (to_undo) or back. Device-to-device, on the stream. */
static cudaError_t rings_copy(cu_seq *sq, bool to_undo)
{
    cu_ctx *c = sq->c;
    const size_t re = (size_t)c->m->hp.n_head_kv * c->m->hp.head_dim;
    size_t off = 0;
    for (uint32_t l = 0; l < sq->kv.n_layer; l++) {
        const kv_plane *pl = &sq->kv.planes[l];
        if (!pl->ring) continue;
        const size_t n = pl->capacity * re; /* f16 elements of one plane */
        uint16_t *k = sq->ring_undo + off, *v = sq->ring_undo + off + n;
        cudaError_t e = cudaMemcpyAsync(to_undo ? k : sq->pl[l].kp, to_undo ? sq->pl[l].kp : k, n * 2,
                                        cudaMemcpyDeviceToDevice, c->st);
        if (!e) e = cudaMemcpyAsync(to_undo ? v : sq->pl[l].vp, to_undo ? sq->pl[l].vp : v, n * 2,
                                    cudaMemcpyDeviceToDevice, c->st);
        if (e) return e;
        off += 2 * n;
    }
    return cudaSuccess;
}

/* Before a call of n rows of one session: its metadata, and (when the rows wrap a ring over rows
 * a retry's window still reads, and the call may store some rows before it fails: stores) a copy
 * of its rings. Returns whether the rings were copied. */
static int seq_save(cu_seq *sq, uint32_t n, bool stores, bool *wraps, muser_error *err)
{
    memcpy(sq->meta_call, sq->kv.planes, sq->kv.n_layer * sizeof(kv_plane));
    *wraps = false;
    for (uint32_t l = 0; stores && n > 1 && l < sq->kv.n_layer; l++)
        *wraps |= sq->kv.planes[l].ring && sq->kv.planes[l].len + n > sq->kv.planes[l].capacity;
    if (*wraps) CU_TRY(rings_copy(sq, true), "ring undo copy");
    return MUSER_OK;
}

/* After a failed call: the metadata and rings seq_save kept. A single row needs no ring copy: the
 * ring row it overwrote is outside the window of a retry at its position. */
static int seq_restore(cu_seq *sq, bool wraps, muser_error *err)
{
    memcpy(sq->kv.planes, sq->meta_call, sq->kv.n_layer * sizeof(kv_plane));
    if (wraps && (rings_copy(sq, false) != cudaSuccess || cudaStreamSynchronize(sq->c->st) != cudaSuccess)) {
        char first[sizeof err->msg];
        snprintf(first, sizeof first, "%s", err ? err->msg : "forward failed");
        return muser_errorf(err, MUSER_E_BACKEND, "cuda: %s; and the ring restore failed too: reset the session", first);
    }
    return MUSER_OK;
}

/* n > 1: the prefill route (pf_forward), or the decode graph row by row for a model it does not take. */
/* The prefill route; with a tap (muser_tap: the residual rows of its layers, in the order the CPU
 * taps them, fwd_run's) only where this model takes it. */
static int be_forward_tap(muser_session *s, const int32_t *tokens, uint32_t n, float *logits, bool all_logits,
                          const muser_tap *tap, muser_error *err)
{
    bind_dev(((const cu_seq *)s->be_state)->c);
    cu_seq *sq = (cu_seq *)s->be_state;
    const uint64_t V = s->model->hp.n_vocab;
    /* A call is all or nothing: if row i fails, rows 0..i-1 must not stay appended either, or
     * every later call would meet a cache that is ahead of n_past (CacheDiscontinuity), and ring
     * rows they overwrote must come back. (FULL-plane rows past n_past are never read.) */
    bool wraps = false;
    int rc = seq_save(sq, n, true, &wraps, err);
    if (rc) return rc;
    if (tap && !pf_model_ok(sq->c)) {
        const int r2 = seq_restore(sq, wraps, err);
        return r2 ? r2 : muser_errorf(err, MUSER_E_UNSUPPORTED,
                                      "cuda: this model's matrices do not fit the prefill route, which the tap needs");
    }
    if (pf_model_ok(sq->c)) {
        rc = pf_forward(sq, tokens, n, s->n_past, logits, all_logits, s->opts.max_batch, tap, err);
        if (rc) {
            const int r2 = seq_restore(sq, wraps, err);
            return r2 ? r2 : rc;
        }
        return MUSER_OK;
    }
    for (uint32_t i = 0; i < n; i++) {
        float *out = NULL;
        if (logits && (all_logits || i + 1 == n)) out = all_logits ? logits + (size_t)i * V : logits;
        rc = decode_one(sq, tokens[i], s->n_past + i, out, NULL, NULL, NULL, 0, NULL, err);
        if (rc) {
            const int r2 = seq_restore(sq, wraps, err);
            return r2 ? r2 : rc;
        }
    }
    return MUSER_OK;
}

static int be_forward(muser_session *s, const int32_t *tokens, uint32_t n, float *logits, bool all_logits,
                      muser_error *err)
{
    return be_forward_tap(s, tokens, n, logits, all_logits, NULL, err);
}

/* Layers [l0, l1) of one chunk of rows of several sessions (session.c: n ≤ part_rows, each
 * session's rows one run, the parts in order, nothing else on those sessions or the workspace in
 * between). The first part lays out the runs; only the last stores into the caches, so it alone
 * saves and, on failure, restores the sessions; each part ends synchronised, so the steps between
 * parts (the decode graphs on the same stream) start after it. */
static int be_forward_part(muser_device *d, const muser_step_rows *rows, uint32_t l0, uint32_t l1, float *logits,
                           muser_error *err)
{
    bind_dev((cu_ctx *)d->be_state);
    cu_ctx *c = (cu_ctx *)d->be_state;
    int rc = l0 == 0 ? pf_ws(c, pf_chunk_rows(d->opts.max_batch), err) : MUSER_OK;
    if (rc) return rc;
    cu_pf *pf = c->pf;
    if (l0 == 0) {
        pf->n_seg = 0;
        for (uint32_t i = 0; i < rows->n; i++) {
            if (i == 0 || rows->seq[i] != rows->seq[i - 1]) {
                pf->seg[pf->n_seg].sq = (cu_seq *)rows->seq[i]->be_state;
                pf->seg[pf->n_seg].row0 = i;
                pf->seg[pf->n_seg++].n = 0;
            }
            pf->pos[i] = rows->seq[i]->n_past + pf->seg[pf->n_seg - 1].n++;
        }
    }
    const bool last = l1 == c->m->hp.n_layer;
    bool wraps[MUSER_PREFILL_MAX_SEQS] = {false};
    for (uint32_t g = 0; last && g < pf->n_seg; g++)
        if ((rc = seq_save(pf->seg[g].sq, pf->seg[g].n, true, &wraps[g], err))) return rc;
    rc = pf_chunk(c, rows->tokens, rows->n, l0, l1, logits, false, NULL, err);
    if (!rc && !last) {
        CU_TRY(cudaStreamSynchronize(c->st), "prefill part");
        CU_TRY(cudaGetLastError(), "prefill part");
    }
    if (rc && last) {
        int r2 = MUSER_OK;
        for (uint32_t g = 0; g < pf->n_seg; g++) {
            const int r3 = seq_restore(pf->seg[g].sq, wraps[g], err);
            if (!r2) r2 = r3;
        }
        return r2 ? r2 : rc;
    }
    if (!rc && last && pf->prof) pf_prof_print(pf, rows->n, pf->pos[0]);
    return rc;
}

/* Run the rows gathered for one pass (be_step): one row through its session's own graph, more as a
 * multi-row pass; row prow[i]'s logits into dst[prow[i]] and its best logits at top's row prow[i]
 * (each when non-NULL). */
static int step_flush(cu_ctx *c, cu_seq *const *ps, const int32_t *pt, const uint64_t *pp, const uint32_t *prow,
                      uint32_t np, float *const *dst, muser_draw *const *draw, int32_t *drawn, const muser_top *top,
                      const muser_tap *tap, muser_error *err)
{
    if (np == 1)
        return decode_one(ps[0], pt[0], pp[0], dst[prow[0]], draw ? draw[prow[0]] : NULL, &drawn[prow[0]], top, prow[0],
                          tap, err);
    return rows_pass(c, ps, pt, pp, prow, np, dst, draw, drawn, top, tap, err);
}

/* The small-batch route. A step's rows go in order as multi-row passes of up to CU_ROWS_MAX rows
 * (rows_pass: every kernel takes all the rows, the weights read once; a session's run of rows,
 * verify's block, attends over its staged rows), a pass of one row through the session's own
 * graph, and the rows of a session whose planes have another geometry each through its graph.
 * Every row's bits are those of decoding it alone (row invariance). All or nothing over every
 * session of the step: when the step is one pass, a failure stored nothing; else rings a failed
 * call may have overwritten are restored from a copy (seq_save). The logit rows are copied back
 * only when asked for, each into its own destination (muser_row_dst): straight when the step is
 * one pass (it writes them only on success), else through step_logits. */
static int be_step(muser_device *d, const muser_step_rows *rows, float *logits, muser_error *err)
{
    bind_dev((cu_ctx *)d->be_state);
    const uint64_t V = d->model->hp.n_vocab;
    const muser_tap *tap = rows->tap; /* its rows go straight out (the engine stages them) */
    cu_ctx *c = (cu_ctx *)d->be_state;
    bool one_pass = rows->n > 1 && rows->n <= CU_ROWS_MAX;
    for (uint32_t i = 0; i < rows->n; i++) one_pass &= rows_ok(c, (cu_seq *)rows->seq[i]->be_state);
    const bool direct = rows->n == 1 || one_pass;
    /* each row's destination: the caller's (rows->out, or its contiguous logits), or, when the
     * step is not one pass, step_logits first (copied out only on success) */
    float *want[MUSER_STEP_MAX_ROWS], *dst[MUSER_STEP_MAX_ROWS];
    for (uint32_t i = 0; i < rows->n; i++) {
        want[i] = muser_row_dst(rows, logits, i, V);
        dst[i] = want[i] && !direct ? c->step_logits + (size_t)i * V : want[i];
    }
    /* the best logits: straight out when the step is one pass, else staged here */
    float top_v[MUSER_STEP_MAX_ROWS * MUSER_TOP_MAX];
    int32_t top_id[MUSER_STEP_MAX_ROWS * MUSER_TOP_MAX];
    const muser_top staged = {.k = rows->top ? rows->top->k : 0, .v = top_v, .id = top_id};
    const muser_top *top = rows->top && !direct ? &staged : rows->top;
    int32_t drawn[MUSER_STEP_MAX_ROWS]; /* the rows' tokens drawn on the device (−1: not), set on success */
    for (uint32_t i = 0; i < rows->n; i++) drawn[i] = -1;
    bool wraps[MUSER_STEP_MAX_ROWS];
    uint32_t first[MUSER_STEP_MAX_ROWS + 1], nrun = 0; /* run r: rows first[r] .. first[r + 1] − 1 */
    int rc = MUSER_OK;
    for (uint32_t i = 0; i < rows->n;) {
        uint32_t k = i;
        while (k < rows->n && rows->seq[k] == rows->seq[i]) k++;
        rc = seq_save((cu_seq *)rows->seq[i]->be_state, k - i, !one_pass, &wraps[nrun], err);
        if (rc) break;
        first[nrun++] = i;
        i = k;
    }
    first[nrun] = rows->n;
    cu_seq *ps[CU_ROWS_MAX];
    int32_t pt[CU_ROWS_MAX];
    uint64_t pp[CU_ROWS_MAX];
    uint32_t prow[CU_ROWS_MAX], np = 0;
    for (uint32_t r = 0; !rc && r < nrun; r++) {
        cu_seq *sq = (cu_seq *)rows->seq[first[r]]->be_state;
        for (uint32_t row = first[r]; !rc && row < first[r + 1]; row++) {
            const uint64_t pos = rows->seq[row]->n_past + (row - first[r]);
            if (!rows_ok(c, sq)) {
                rc = decode_one(sq, rows->tokens[row], pos, dst[row], rows->draw ? rows->draw[row] : NULL, &drawn[row],
                                top, row, tap, err);
                continue;
            }
            ps[np] = sq;
            pt[np] = rows->tokens[row];
            pp[np] = pos;
            prow[np++] = row;
            if (np == CU_ROWS_MAX) {
                rc = step_flush(c, ps, pt, pp, prow, np, dst, rows->draw, drawn, top, tap, err);
                np = 0;
            }
        }
    }
    if (!rc && np) rc = step_flush(c, ps, pt, pp, prow, np, dst, rows->draw, drawn, top, tap, err);
    if (rc) {
        for (uint32_t r = 0; r < nrun; r++) {
            const int r2 = seq_restore((cu_seq *)rows->seq[first[r]]->be_state, wraps[r], err);
            if (r2) return r2;
        }
        return rc;
    }
    for (uint32_t i = 0; !direct && i < rows->n; i++)
        if (want[i] && drawn[i] < 0) memcpy(want[i], dst[i], V * sizeof(float));
    for (uint32_t i = 0; rows->draw && i < rows->n; i++)
        if (rows->draw[i]) rows->draw[i]->id = drawn[i];
    if (top == &staged) {
        memcpy(rows->top->id, top_id, (size_t)rows->n * staged.k * sizeof *top_id);
        if (rows->top->v) memcpy(rows->top->v, top_v, (size_t)rows->n * staged.k * sizeof *top_v);
    }
    return MUSER_OK;
}

/* Copies of ring rows i0 .. i1 − 1 counted from physical row r0 (wrapping at cap), rows of re
 * elements, between a plane and its save buffer (row i of the run at save + i·re), into L; full
 * lists are launched on st as they fill. */
static void ring_rows_copy(cudaStream_t st, cu_copy_list *L, uint16_t *plane, uint16_t *save, uint64_t r0, uint64_t i0,
                           uint64_t i1, uint64_t cap, size_t re, bool to_plane)
{
    while (i0 < i1) {
        const uint64_t r = (r0 + i0) % cap, run = i1 - i0 < cap - r ? i1 - i0 : cap - r; /* up to the ring's end */
        if (L->n == CU_COPY_MAX) {
            cu_copy_segments(st, L);
            L->n = 0;
        }
        uint16_t *p = plane + r * re, *q = save + i0 * re;
        L->seg[L->n].src = to_plane ? q : p;
        L->seg[L->n].dst = to_plane ? p : q;
        L->seg[L->n++].elems = run * re;
        i0 += run;
    }
}

/* Before a verify block: every ring's rows the block's appends will land on (at most
 * KV_MAX_SPEC_ROWS) into its save buffers, in one launch; stream-ordered before the block. */
static int be_checkpoint(muser_session *s, muser_error *err)
{
    bind_dev(((const cu_seq *)s->be_state)->c);
    cu_seq *sq = (cu_seq *)s->be_state;
    cu_ctx *c = sq->c;
    const size_t re = (size_t)s->model->hp.n_head_kv * s->model->hp.head_dim;
    cu_copy_list L;
    L.n = 0;
    for (uint32_t l = 0; l < sq->kv.n_layer; l++) {
        const kv_plane *pl = &sq->kv.planes[l];
        if (!pl->ring) continue;
        const uint64_t n = pl->capacity < KV_MAX_SPEC_ROWS ? pl->capacity : KV_MAX_SPEC_ROWS;
        const uint64_t r0 = (pl->origin_physical + pl->len) % pl->capacity;
        ring_rows_copy(c->st, &L, sq->pl[l].kp, sq->pl[l].save_k, r0, 0, n, pl->capacity, re, false);
        ring_rows_copy(c->st, &L, sq->pl[l].vp, sq->pl[l].save_v, r0, 0, n, pl->capacity, re, false);
    }
    cu_copy_segments(c->st, &L);
    CU_TRY(cudaGetLastError(), "checkpoint");
    return kv_checkpoint(&sq->kv, err);
}

/* Rewind to n_keep positions: the metadata (kv_rollback) and the rejected rows the block wrote
 * over ring rows back from the save buffers, in one launch. */
static int be_rollback(muser_session *s, uint64_t n_keep, muser_error *err)
{
    bind_dev(((const cu_seq *)s->be_state)->c);
    cu_seq *sq = (cu_seq *)s->be_state;
    cu_ctx *c = sq->c;
    if (!sq->kv.has_checkpoint) return muser_errorf(err, MUSER_E_ARG, "KV rollback without a checkpoint");
    const size_t re = (size_t)s->model->hp.n_head_kv * s->model->hp.head_dim;
    kv_plane *before = sq->meta_call;
    const uint32_t nl = sq->kv.n_layer;
    memcpy(before, sq->kv.planes, nl * sizeof(kv_plane));
    int rc = kv_rollback(&sq->kv, n_keep, err);
    if (rc) return rc;
    cu_copy_list L;
    L.n = 0;
    for (uint32_t l = 0; l < nl; l++) {
        const kv_plane *m = &sq->kv.ckpt[l].meta;
        if (!m->ring) continue;
        const uint64_t accepted = n_keep - m->next_pos, written = before[l].next_pos - m->next_pos;
        const uint64_t n = m->capacity < KV_MAX_SPEC_ROWS ? m->capacity : KV_MAX_SPEC_ROWS;
        const uint64_t r0 = (m->origin_physical + m->len) % m->capacity, end = written < n ? written : n;
        ring_rows_copy(c->st, &L, sq->pl[l].kp, sq->pl[l].save_k, r0, accepted, end, m->capacity, re, true);
        ring_rows_copy(c->st, &L, sq->pl[l].vp, sq->pl[l].save_v, r0, accepted, end, m->capacity, re, true);
    }
    cu_copy_segments(c->st, &L);
    CU_TRY(cudaStreamSynchronize(c->st), "rollback");
    return MUSER_OK;
}

static void be_commit(muser_session *s)
{
    kv_commit(&((cu_seq *)s->be_state)->kv);
}

static void be_reset(muser_session *s)
{
    bind_dev(((const cu_seq *)s->be_state)->c);
    cu_seq *sq = (cu_seq *)s->be_state;
    kv_reset(&sq->kv);
    cudaMemsetAsync(sq->kv_mem, 0, sq->kv_bytes, sq->c->st);
    cudaStreamSynchronize(sq->c->st);
}

static int be_kv_export(const muser_session *s, uint32_t l, kv_plane *meta, uint16_t *k, uint16_t *v, muser_error *err)
{
    bind_dev(((const cu_seq *)s->be_state)->c);
    const cu_seq *sq = (const cu_seq *)s->be_state;
    const kv_plane *pl = &sq->kv.planes[l];
    *meta = *pl;
    const size_t n = pl->capacity * pl->n_head_kv * pl->head_dim * sizeof(uint16_t);
    CU_TRY(cudaMemcpy(k, sq->pl[l].kp, n, cudaMemcpyDeviceToHost), "KV export");
    CU_TRY(cudaMemcpy(v, sq->pl[l].vp, n, cudaMemcpyDeviceToHost), "KV export");
    return MUSER_OK;
}

static int be_kv_copy(muser_session *dst, const muser_session *src, muser_error *err)
{
    bind_dev(((cu_seq *)dst->be_state)->c);
    cu_seq *d = (cu_seq *)dst->be_state;
    const cu_seq *s = (const cu_seq *)src->be_state;
    if (d->kv_bytes != s->kv_bytes) return muser_errorf(err, MUSER_E_ARG, "cuda: KV copy between caches of two sizes");
    CU_TRY(cudaMemcpyAsync(d->kv_mem, s->kv_mem, s->kv_bytes, cudaMemcpyDeviceToDevice, d->c->st), "KV copy");
    CU_TRY(cudaStreamSynchronize(d->c->st), "KV copy");
    for (uint32_t l = 0; l < d->kv.n_layer; l++) d->kv.planes[l] = s->kv.planes[l]; /* metadata (no host storage) */
    d->kv.has_checkpoint = false;
    return MUSER_OK;
}

/* Rows [pos0, pos0 + n) of a plane between its device storage (kv.h's layout) and a token-major
 * host buffer [n][HKV*D] (remote prefill), on the device's stream, then synchronized. */
static cudaError_t plane_rows_copy(const cu_seq *sq, const kv_plane *pl, uint16_t *dev, uint16_t *host, uint64_t pos0,
                                   uint32_t n, bool to_dev)
{
    const size_t re = (size_t)pl->n_head_kv * pl->head_dim, D = pl->head_dim;
    const cudaMemcpyKind kind = to_dev ? cudaMemcpyHostToDevice : cudaMemcpyDeviceToHost;
    cudaStream_t st = sq->c->st;
    cudaError_t e = cudaSuccess;
    if (!pl->ring) { /* head-major: each head's rows are contiguous on the device, strided on the host */
        for (uint32_t h = 0; h < pl->n_head_kv && !e; h++) {
            uint16_t *d = dev + ((size_t)h * pl->capacity + pos0) * D, *x = host + h * D;
            e = to_dev ? cudaMemcpy2DAsync(d, D * 2, x, re * 2, D * 2, n, kind, st)
                       : cudaMemcpy2DAsync(x, re * 2, d, D * 2, D * 2, n, kind, st);
        }
    } else { /* token-major: runs of physical rows up to the ring's end */
        for (uint32_t i = 0; i < n && !e;) {
            const uint64_t r = kv_plane_row(pl, pos0 + i);
            const uint64_t run = pl->capacity - r < n - i ? pl->capacity - r : n - i;
            uint16_t *d = dev + r * re, *x = host + (size_t)i * re;
            e = to_dev ? cudaMemcpyAsync(d, x, run * re * 2, kind, st) : cudaMemcpyAsync(x, d, run * re * 2, kind, st);
            i += (uint32_t)run;
        }
    }
    return e ? e : cudaStreamSynchronize(st);
}

static int be_kv_rows(const muser_session *s, uint32_t l, uint64_t pos0, uint32_t n, uint16_t *k, uint16_t *v,
                      muser_error *err)
{
    bind_dev(((const cu_seq *)s->be_state)->c);
    const cu_seq *sq = (const cu_seq *)s->be_state;
    const kv_plane *pl = &sq->kv.planes[l];
    CU_TRY(plane_rows_copy(sq, pl, sq->pl[l].kp, k, pos0, n, false), "KV rows");
    CU_TRY(plane_rows_copy(sq, pl, sq->pl[l].vp, v, pos0, n, false), "KV rows");
    return MUSER_OK;
}

static int be_kv_import(muser_session *s, uint32_t l, const kv_plane *meta, uint64_t pos0, uint32_t n,
                        const uint16_t *k, const uint16_t *v, muser_error *err)
{
    bind_dev(((const cu_seq *)s->be_state)->c);
    cu_seq *sq = (cu_seq *)s->be_state;
    kv_plane *pl = &sq->kv.planes[l];
    *pl = *meta; /* host metadata; the device planes are sq->pl */
    pl->k = pl->v = NULL;
    sq->kv.has_checkpoint = false;
    if (!n) return MUSER_OK;
    CU_TRY(plane_rows_copy(sq, pl, sq->pl[l].kp, (uint16_t *)k, pos0, n, true), "KV import");
    CU_TRY(plane_rows_copy(sq, pl, sq->pl[l].vp, (uint16_t *)v, pos0, n, true), "KV import");
    return MUSER_OK;
}

static const muser_backend cuda_backend = {
    "cuda", be_dev_init, be_dev_free, be_init,     be_free,  be_forward,  be_step,
    be_checkpoint, be_rollback, be_commit, be_reset, be_kv_export, be_kv_copy, be_kv_rows, be_kv_import,
    be_forward_tap, be_forward_part,
};

extern "C" const muser_backend *muser_backend_cuda(void)
{
    return &cuda_backend;
}

/* ---- bench lane ------------------------------------------------------------------------------ */
CU_TL_BIND_FN(cu_tl_bind_backend)

/* MUSER_CUDA_TIMELINE builds: point every translation unit's kernels at buf (NULL: off). */
static void tl_bind(void *buf)
{
    cu_tl_bind_backend(buf);
    cu_tl_bind_norm(buf);
    cu_tl_bind_attention(buf);
}

/* The records of the token just run, to path.ctxN (timeline.cuh; scripts/timeline.py reads it). */
static int tl_write(cu_tl_buf *d_buf, const char *path, uint64_t depth, muser_error *err)
{
    uint32_t hdr[2];
    CU_TRY(cudaMemcpy(hdr, d_buf, sizeof hdr, cudaMemcpyDeviceToHost), "timeline");
    const uint32_t n = hdr[0] < hdr[1] ? hdr[0] : hdr[1];
    cu_tl_rec *r = (cu_tl_rec *)malloc((size_t)n * sizeof *r + 1);
    if (!r) return muser_errorf(err, MUSER_E_NOMEM, "timeline: out of memory");
    cudaError_t e = cudaMemcpy(r, d_buf->rec, (size_t)n * sizeof *r, cudaMemcpyDeviceToHost);
    char name[1024];
    snprintf(name, sizeof name, "%s.ctx%llu", path, (unsigned long long)depth);
    FILE *f = e ? NULL : fopen(name, "wb");
    const bool ok = f && fwrite(r, sizeof *r, n, f) == n;
    if (f) fclose(f);
    free(r);
    CU_TRY(e, "timeline");
    if (!ok) return muser_errorf(err, MUSER_E_IO, "timeline: cannot write %s", name);
    fprintf(stderr, "timeline: %u CTA records (of %u) -> %s\n", n, hdr[0], name);
    return MUSER_OK;
}

/* Time each op family of one pass (route_enqueue_n of sq, or of the device's n rows as the row
 * tables hold them), run twice outside a graph (the first warms), with events between the
 * families; printed to stderr under `what`. */
static int profile_pass(cu_ctx *c, cu_seq *sq, uint32_t n, const char *what, muser_error *err)
{
    profiler *pf = (profiler *)calloc(1, sizeof *pf);
    if (!pf) return muser_errorf(err, MUSER_E_NOMEM, "profile: out of memory");
    for (int i = 0; i < 1024; i++) cudaEventCreate(&pf->ev[i]);
    route_enqueue_n(c, sq, n, false, false, pf); /* warm */
    cudaStreamSynchronize(c->st);
    pf->n = 0;
    route_enqueue_n(c, sq, n, false, false, pf);
    cudaError_t e = cudaStreamSynchronize(c->st);
    double fam_ms[PF_N] = {0}, total = 0;
    for (int i = 0; i + 1 < pf->n; i++) {
        float ms = 0;
        cudaEventElapsedTime(&ms, pf->ev[i], pf->ev[i + 1]);
        if (pf->fam[i] < PF_N) fam_ms[pf->fam[i]] += ms;
        total += ms;
    }
    fprintf(stderr, "phase profile (%s, no graph): total %.3f ms\n", what, total);
    for (int f = 0; f < PF_N; f++)
        fprintf(stderr, "  %-20s %8.3f ms  %5.1f%%\n", pf_name[f], fam_ms[f], 100 * fam_ms[f] / total);
    for (int i = 0; i < 1024; i++) cudaEventDestroy(pf->ev[i]);
    free(pf);
    CU_TRY(e, "profile");
    return MUSER_OK;
}

static int phase_profile(cu_ctx *c, cu_seq *sq, uint64_t pos, muser_error *err)
{
    step_fill(sq, pos, 1);
    char what[64];
    snprintf(what, sizeof what, "one token at position %llu", (unsigned long long)pos);
    return profile_pass(c, sq, 1, what, err);
}

extern "C" int muser_cuda_bench(const muser_model *m, int device, const uint64_t *ctxs, uint32_t n_ctx, uint32_t gen,
                                muser_cuda_bench_result *res, muser_cuda_bench_row *rows, muser_error *err)
{
    uint64_t max_ctx = 1;
    for (uint32_t i = 0; i < n_ctx; i++)
        if (ctxs[i] + gen + 1 > max_ctx) max_ctx = ctxs[i] + gen + 1;
    if (max_ctx > m->hp.n_ctx_train) max_ctx = m->hp.n_ctx_train;
    memset(res, 0, sizeof *res);
    cu_ctx *c = NULL;
    int rc = ctx_new(&c, m, max_ctx, device, err);
    if (rc) return rc;
    cu_seq *sq = NULL;
    rc = seq_new(&sq, c, max_ctx, err);
    if (!rc) rc = record_graph(c, sq, true, &sq->g_bench, err);
    if (rc) {
        seq_free(sq);
        ctx_free(c);
        return rc;
    }
    cudaDeviceProp prop;
    cudaGetDeviceProperties(&prop, device);
    snprintf(res->device, sizeof res->device, "%.127s", prop.name);
    res->upload_s = c->upload_s;
    res->weight_bytes = c->read_bytes;
    snprintf(res->route, sizeof res->route, "tails %s", c->tail_wide ? "16x512" : "8x256");
    /* the read ceiling, in this run */
    {
        const size_t bytes = (size_t)4 << 30;
        void *buf = NULL;
        uint32_t *sink = NULL;
        cudaEvent_t a, b;
        if (cudaMalloc(&buf, bytes + 256) == cudaSuccess) {
            sink = (uint32_t *)((uint8_t *)buf + bytes);
            cu_fill_plane_random(c->st, (uint16_t *)buf, bytes / 2, 7);
            cudaEventCreate(&a);
            cudaEventCreate(&b);
            float t[12];
            for (int i = 0; i < 12; i++) {
                cudaEventRecord(a, c->st);
                cu_read_stream(c->st, buf, bytes, sink, c->n_sm);
                cudaEventRecord(b, c->st);
                cudaEventSynchronize(b);
                cudaEventElapsedTime(&t[i], a, b);
            }
            float s[10];
            memcpy(s, t + 2, sizeof s);
            for (int i = 0; i < 10; i++)
                for (int j = i + 1; j < 10; j++)
                    if (s[j] < s[i]) { float x = s[i]; s[i] = s[j]; s[j] = x; }
            res->read_gbs = bytes / (s[5] * 1e-3) / 1e9;
            cudaEventDestroy(a);
            cudaEventDestroy(b);
            cudaFree(buf);
        }
    }
    const muser_hparams *hp = &m->hp;
    /* MUSER_CUDA_TIMELINE=FILE (timeline builds): the last timed token of each depth is recorded */
    const char *tl_path = getenv("MUSER_CUDA_TIMELINE");
    cu_tl_buf *tl_buf = NULL;
    const uint32_t tl_cap = 1u << 20;
#ifdef MUSER_CUDA_TIMELINE
    if (tl_path && *tl_path && cudaMalloc(&tl_buf, sizeof(cu_tl_buf) + (size_t)tl_cap * sizeof(cu_tl_rec)) != cudaSuccess)
        tl_buf = NULL;
    if (tl_buf) cudaMemset(tl_buf, 0, sizeof(cu_tl_buf) + (size_t)tl_cap * sizeof(cu_tl_rec));
#else
    (void)tl_cap;
    if (tl_path && *tl_path) fprintf(stderr, "muser bench: MUSER_CUDA_TIMELINE needs a build with -DMUSER_CUDA_TIMELINE=ON\n");
#endif
    cudaEvent_t a, b;
    cudaEventCreate(&a);
    cudaEventCreate(&b);
    for (uint32_t ci = 0; ci < n_ctx && !rc; ci++) {
        uint64_t depth = ctxs[ci];
        if (depth + gen + 1 > max_ctx) depth = max_ctx > gen + 1 ? max_ctx - gen - 1 : 0;
        /* the cache as if `depth` tokens were decoded: metadata advanced, rows random f16 */
        kv_reset(&sq->kv);
        for (uint32_t l = 0; l < hp->n_layer; l++) {
            kv_plane *pl = &sq->kv.planes[l];
            for (uint64_t p = 0; p < depth; p++) kv_plane_append(pl, p, NULL, NULL, err);
            cu_fill_plane_random(c->st, sq->pl[l].kp, pl->capacity * hp->n_head_kv * hp->head_dim, 11 + l);
            cu_fill_plane_random(c->st, sq->pl[l].vp, pl->capacity * hp->n_head_kv * hp->head_dim, 111 + l);
        }
        cudaMemsetAsync(c->d_token, 0, sizeof(int32_t), c->st);
        double kv_read = 0;
        /* warm-up token, then gen timed tokens; host metadata advanced between launches */
        for (uint32_t t = 0; t <= gen && !rc; t++) {
            const uint64_t pos = depth + t;
            for (uint32_t l = 0; l < hp->n_layer; l++) kv_plane_append(&sq->kv.planes[l], pos, NULL, NULL, err);
            step_fill(sq, pos, 0);
            if (t == 1) cudaEventRecord(a, c->st);
            if (tl_buf && t == gen) {
                const uint32_t hdr[2] = {0, tl_cap};
                cudaMemcpy(tl_buf, hdr, sizeof hdr, cudaMemcpyHostToDevice);
                tl_bind(tl_buf);
            }
            if (t >= 1)
                for (uint32_t l = 0; l < hp->n_layer; l++)
                    kv_read += (double)sq->kv.planes[l].len * hp->n_head_kv * hp->head_dim * 2 * 2;
            cudaError_t e = cudaGraphLaunch(sq->g_bench, c->st);
            /* the pinned step is read when the copy node runs: wait before refilling it */
            if (!e) e = cudaStreamSynchronize(c->st);
            if (e) rc = muser_errorf(err, MUSER_E_BACKEND, "cuda bench: %s", cudaGetErrorString(e));
        }
        cudaEventRecord(b, c->st);
        cudaEventSynchronize(b);
        if (tl_buf) {
            tl_bind(NULL);
            if (!rc) rc = tl_write(tl_buf, tl_path, depth, err);
        }
        float ms = 0;
        cudaEventElapsedTime(&ms, a, b);
        muser_cuda_bench_row *r = &rows[ci];
        r->ctx = depth;
        r->gen = gen;
        r->ms_per_token = ms / gen;
        r->tok_per_s = 1000.0 / r->ms_per_token;
        r->bytes_per_token = (double)c->read_bytes + kv_read / gen;
        r->gbs = r->bytes_per_token / (r->ms_per_token * 1e-3) / 1e9;
        r->pct_of_read = res->read_gbs > 0 ? 100.0 * r->gbs / res->read_gbs : 0;
        const char *pp = getenv("MUSER_CUDA_PROFILE");
        if (!rc && pp && pp[0] == '1') rc = phase_profile(c, sq, depth + gen, err);
    }
    cudaEventDestroy(a);
    cudaEventDestroy(b);
    cudaFree(tl_buf);
    seq_free(sq);
    ctx_free(c);
    return rc;
}

/* ---- one matvec, for tests ------------------------------------------------------------------- */
/* The device and a bare context for a check (device 0, its SM count), or an error. */
static int check_ctx_new(cu_ctx **out, muser_error *err)
{
    *out = NULL;
    int n_dev = 0;
    if (cudaGetDeviceCount(&n_dev) != cudaSuccess || n_dev == 0) return muser_errorf(err, MUSER_E_BACKEND, "cuda: no CUDA device");
    CU_TRY(cudaSetDevice(0), "set device");
    cu_ctx *c = (cu_ctx *)calloc(1, sizeof *c);
    if (!c) return muser_errorf(err, MUSER_E_NOMEM, "cuda: out of memory");
    cudaDeviceGetAttribute(&c->n_sm, cudaDevAttrMultiProcessorCount, 0);
    c->rn = 1; /* one row: the checks run the one-row launches */
    *out = c;
    return MUSER_OK;
}

/* A check's matrix: rows × cols GGUF bytes of ggml_type at w. */
static muser_tensor check_tensor(uint32_t ggml_type, uint32_t rows, uint32_t cols, const void *w)
{
    muser_tensor t;
    memset(&t, 0, sizeof t);
    t.data = w;
    t.type = ggml_type;
    t.rows = rows;
    t.cols = cols;
    t.row_bytes = quant_row_bytes(ggml_type, cols);
    t.name = "check";
    return t;
}
/* A check's launch through the route's dispatch: x (nx floats) in, y (ny floats, NaN first so an
 * unwritten output shows) out, the rows xst floats apart. */
static int check_mv_run(cu_ctx *c, const mv_launch *L, const float *x, float *dx, size_t nx, float *dy, float *y, size_t ny,
                        uint32_t xst, const char *what, muser_error *err)
{
    cudaError_t e = cudaMemcpyAsync(dx, x, nx * sizeof(float), cudaMemcpyHostToDevice, c->st);
    if (!e) e = cudaMemsetAsync(dy, 0xFF, ny * sizeof(float), c->st);
    if (!e) {
        mv_go(c, c->st, L, dx, 0, xst);
        e = cudaGetLastError();
    }
    if (!e) e = cudaMemcpyAsync(y, dy, ny * sizeof(float), cudaMemcpyDeviceToHost, c->st);
    if (!e) e = cudaStreamSynchronize(c->st);
    return e ? muser_errorf(err, MUSER_E_BACKEND, "cuda: %s check: %s", what, cudaGetErrorString(e)) : MUSER_OK;
}

/* A matvec or pair check's teardown: its uploader, x and y, the digit buffer, the weights, the context */
static void check_mv_free(cu_ctx *c, uploader *u, float *dx, float *dy)
{
    up_close(u);
    cudaFree(dx);
    cudaFree(dy);
    cudaFree(c->xm_site[0]);
    cudaFree(c->weights);
    if (c->st) cudaStreamDestroy(c->st);
    free(c);
}

extern "C" int muser_cuda_matvec_check(uint32_t ggml_type, uint32_t rows, uint32_t cols, const void *w, const float *x,
                                       int tc, int softcap, float scale, float cap, float *y, uint32_t *layout,
                                       muser_error *err)
{
    cu_ctx *c = NULL;
    const int rc0 = check_ctx_new(&c, err);
    if (rc0) return rc0;
    const muser_tensor t = check_tensor(ggml_type, rows, cols, w);
    float *dx = NULL, *dy = NULL;
    uploader u;
    memset(&u, 0, sizeof u);
    mv_mat mat;
    memset(&mat, 0, sizeof mat);
    int rc = MUSER_OK;
    cudaError_t e = cudaStreamCreateWithFlags(&c->st, cudaStreamNonBlocking);
    if (!e) e = cudaMalloc((void **)&c->weights, align256((size_t)t.row_bytes * rows));
    if (!e) e = cudaMalloc((void **)&c->xm_site[0], XS_N * (mmq_x_bytes(cols) + mmq6_x_bytes(cols)) + 512);
    if (!e) e = cudaMalloc((void **)&dx, (size_t)cols * sizeof(float));
    if (!e) e = cudaMalloc((void **)&dy, (size_t)rows * sizeof(float));
    if (e) rc = muser_errorf(err, MUSER_E_BACKEND, "cuda: matvec check: %s", cudaGetErrorString(e));
    if (!rc) {
        for (int s = 0; s < XS_N; s++) {
            c->xm_site[s] = c->xm_site[0];
            c->x6_site[s] = c->xm_site[0] + align256(mmq_x_bytes(cols));
        }
        set_site(c, XS_STACK);
        rc = up_open(&u, c, err);
    }
    if (!rc) rc = up_matrix(&u, &t, &mat, tc != 0, err);
    if (!rc) {
        if (layout) *layout = mat.type;
        mv_launch L;
        memset(&L, 0, sizeof L);
        seg_set(&L, &mat, dy, softcap ? MV_OP_SOFTCAP : MV_OP_STORE, (uint32_t)mv_rows_per_warp(mat.type));
        L.seg[0].scale = scale;
        L.seg[0].cap = cap;
        rc = check_mv_run(c, &L, x, dx, cols, dy, y, rows, 0, "matvec", err);
    }
    check_mv_free(c, &u, dx, dy);
    return rc;
}

/* ---- the gate·up pair, for tests --------------------------------------------------------------- */
extern "C" int muser_cuda_pair_check(uint32_t rows, uint32_t cols, const void *wg, const void *wu, uint32_t n, const float *x,
                                     int n_sm, float *y, muser_error *err)
{
    if (n == 0 || n > CU_ROWS_MAX || cols % 256 || rows % 16 || rows == 0)
        return muser_errorf(err, MUSER_E_ARG, "cuda: pair check: %u rows of %u x %u", n, rows, cols);
    cu_ctx *c = NULL;
    const int rc0 = check_ctx_new(&c, err);
    if (rc0) return rc0;
    if (n_sm > 0) c->n_sm = n_sm;
    c->rn = n;
    const muser_tensor tg = check_tensor(12, rows, cols, wg), tu = check_tensor(12, rows, cols, wu);
    float *dx = NULL, *dy = NULL;
    uploader u;
    memset(&u, 0, sizeof u);
    mv_mat mg, mu;
    memset(&mg, 0, sizeof mg);
    memset(&mu, 0, sizeof mu);
    int rc = MUSER_OK;
    const size_t wb = align256((size_t)tg.row_bytes * rows) + align256(rows);
    c->dig_rs = (uint32_t)align256(mmi_x_bytes(cols));
    cudaError_t e = cudaStreamCreateWithFlags(&c->st, cudaStreamNonBlocking);
    if (!e) e = cudaMalloc((void **)&c->weights, 2 * wb);
    if (!e) e = cudaMalloc((void **)&c->xm_site[0], (size_t)n * c->dig_rs);
    if (!e) e = cudaMalloc((void **)&dx, (size_t)n * cols * sizeof(float));
    if (!e) e = cudaMalloc((void **)&dy, (size_t)n * rows * sizeof(float));
    if (e) rc = muser_errorf(err, MUSER_E_BACKEND, "cuda: pair check: %s", cudaGetErrorString(e));
    if (!rc) {
        for (int s = 0; s < XS_N; s++) c->xm_site[s] = c->xm_site[0];
        set_site(c, XS_GU);
        rc = up_open(&u, c, err);
    }
    if (!rc) rc = up_matrix(&u, &tg, &mg, true, err);
    if (!rc) rc = up_rexp(&u, &mg, err);
    if (!rc) rc = up_matrix(&u, &tu, &mu, true, err);
    if (!rc) rc = up_rexp(&u, &mu, err);
    if (!rc && !(mg.rexp && mu.rexp)) rc = muser_errorf(err, MUSER_E_BACKEND, "cuda: pair check: not the tensor-core layout");
    if (!rc) {
        mv_launch L;
        memset(&L, 0, sizeof L);
        seg_set(&L, &mg, dy, MV_OP_SILU_MUL, 1, rows);
        L.seg[0].b = mu;
        rc = check_mv_run(c, &L, x, dx, (size_t)n * cols, dy, y, (size_t)n * rows, cols, "pair", err);
    }
    check_mv_free(c, &u, dx, dy);
    return rc;
}

/* ---- the prefill GEMM, for tests ------------------------------------------------------------- */
extern "C" int muser_cuda_gemm_check(uint32_t ggml_type, uint32_t rows, uint32_t cols, const void *w, uint32_t n,
                                     const float *x, float *y, uint32_t *layout, muser_error *err)
{
    cu_ctx *c = NULL;
    const int rc0 = check_ctx_new(&c, err);
    if (rc0) return rc0;
    if (!pf_shape_ok(cols)) {
        free(c);
        return muser_errorf(err, MUSER_E_ARG, "cuda: gemm check: %u columns (a multiple of 32)", cols);
    }
    const muser_tensor t = check_tensor(ggml_type, rows, cols, w);
    float *dx = NULL, *dy = NULL, *rs = NULL, *part = NULL;
    __half *xh = NULL, *xl = NULL, *wh = NULL, *wl = NULL, *xsh = NULL, *xsl = NULL;
    uploader u;
    memset(&u, 0, sizeof u);
    mv_mat mat;
    memset(&mat, 0, sizeof mat);
    int rc = MUSER_OK;
    const size_t nx = (size_t)n * cols, nw = (size_t)rows * cols;
    cudaError_t e = cudaStreamCreateWithFlags(&c->st, cudaStreamNonBlocking);
    if (!e) e = cudaMalloc((void **)&c->weights, align256((size_t)t.row_bytes * rows));
    if (!e) e = cudaMalloc((void **)&dx, nx * sizeof(float));
    if (!e) e = cudaMalloc((void **)&dy, (size_t)n * rows * sizeof(float));
    if (!e) e = cudaMalloc((void **)&rs, n * sizeof(float));
    if (!e) e = cudaMalloc((void **)&xh, nx * 2);
    if (!e) e = cudaMalloc((void **)&xl, nx * 2);
    if (!e) e = cudaMalloc((void **)&wh, nw * 2);
    if (!e) e = cudaMalloc((void **)&wl, nw * 2);
    if (!e) e = cudaMalloc((void **)&xsh, nx / 32 * 2 + 16);
    if (!e) e = cudaMalloc((void **)&xsl, nx / 32 * 2 + 16);
    if (!e) e = cudaMalloc((void **)&part, pf_kq_part_bytes(n));
    if (e) rc = muser_errorf(err, MUSER_E_BACKEND, "cuda: gemm check: %s", cudaGetErrorString(e));
    if (!rc) rc = up_open(&u, c, err);
    if (!rc) rc = up_matrix(&u, &t, &mat, true, err);
    if (!rc) {
        if (layout) *layout = mat.type;
        e = cudaMemcpyAsync(dx, x, nx * sizeof(float), cudaMemcpyHostToDevice, c->st);
        if (!e) e = cudaMemsetAsync(dy, 0xFF, (size_t)n * rows * sizeof(float), c->st); /* NaN: unwritten shows */
        if (!e) {
            if (pf_kq_ok(&mat)) { /* the route's own choice (pf_matmul) */
                pf_split_kq(c->st, dx, cols, n, cols, mat.type == MV_T_Q6_KT, xh, xl, xsh, xsl, rs);
                pf_gemm_kq(c->st, xh, xl, xsh, xsl, rs, n, &mat, dy, rows, MV_OP_STORE, 1.f, 0.f, part);
            } else {
                pf_split_x(c->st, dx, cols, n, cols, xh, xl, rs);
                pf_unpack_w(c->st, &mat, 0, rows, wh, wl);
                pf_gemm(c->st, xh, xl, rs, n, wh, wl, rows, cols, dy, rows, MV_OP_STORE, 1.f, 0.f);
            }
            e = cudaGetLastError();
        }
        if (!e) e = cudaMemcpyAsync(y, dy, (size_t)n * rows * sizeof(float), cudaMemcpyDeviceToHost, c->st);
        if (!e) e = cudaStreamSynchronize(c->st);
        if (e) rc = muser_errorf(err, MUSER_E_BACKEND, "cuda: gemm check: %s", cudaGetErrorString(e));
    }
    up_close(&u);
    void *bufs[] = {dx, dy, rs, xh, xl, wh, wl, xsh, xsl, part, c->weights};
    for (void *p : bufs) cudaFree(p);
    if (c->st) cudaStreamDestroy(c->st);
    free(c);
    return rc;
}

extern "C" int muser_cuda_draw_check(const float *logits, uint32_t n, uint32_t rows, const float *temp,
                                     const float *top_p, const float *min_p, const double *u, int32_t *id,
                                     muser_error *err)
{
    if (rows == 0 || rows > CU_ROWS_MAX || n == 0 || n > CU_DRAW_MAX_N)
        return muser_errorf(err, MUSER_E_ARG, "cuda: draw check: %u rows of %u (1..%u of 1..%u)", rows, n, CU_ROWS_MAX,
                            CU_DRAW_MAX_N);
    float *dl = NULL, *pv = NULL, *best = NULL, *dpar = NULL;
    int32_t *pi = NULL, *tok = NULL, *bad = NULL, *did = NULL;
    double *du = NULL;
    void *scratch = NULL;
    float hpar[3 * CU_ROWS_MAX];
    for (uint32_t r = 0; r < rows; r++) {
        hpar[r] = temp[r];
        hpar[CU_ROWS_MAX + r] = top_p[r];
        hpar[2 * CU_ROWS_MAX + r] = muser_min_p_cut(min_p[r]);
    }
    cudaError_t e = cudaMalloc((void **)&dl, (size_t)rows * n * sizeof(float));
    if (!e) e = cudaMalloc((void **)&pv, (size_t)rows * 256 * sizeof(float));
    if (!e) e = cudaMalloc((void **)&pi, (size_t)rows * 256 * sizeof(int32_t));
    if (!e) e = cudaMalloc((void **)&tok, rows * 3 * sizeof(int32_t));
    if (!e) bad = tok + rows, best = (float *)(tok + 2 * rows);
    if (!e) e = cudaMalloc((void **)&dpar, sizeof hpar);
    if (!e) e = cudaMalloc((void **)&du, rows * sizeof(double));
    if (!e) e = cudaMalloc((void **)&did, rows * sizeof(int32_t));
    if (!e) e = cudaMalloc(&scratch, cu_draw_scratch_bytes(rows));
    if (!e) e = cudaMemcpy(dl, logits, (size_t)rows * n * sizeof(float), cudaMemcpyHostToDevice);
    if (!e) e = cudaMemcpy(dpar, hpar, sizeof hpar, cudaMemcpyHostToDevice);
    if (!e) e = cudaMemcpy(du, u, rows * sizeof(double), cudaMemcpyHostToDevice);
    if (!e) e = cudaMemset(did, 0xFF, rows * sizeof(int32_t)); /* −1: rows without a draw */
    if (!e) {
        cu_argmax(0, dl, n, pv, pi, tok, bad, best, rows); /* the row's largest logit, as a pass has it */
        bool topp = false;
        for (uint32_t r = 0; r < rows; r++) topp |= temp[r] > 0.0f && top_p[r] < 1.0f;
        const cu_draw_par par = {dpar, dpar + CU_ROWS_MAX, dpar + 2 * CU_ROWS_MAX, du, topp};
        e = cu_draw(0, dl, n, best, par, did, scratch, rows);
    }
    if (!e) e = cudaMemcpy(id, did, rows * sizeof(int32_t), cudaMemcpyDeviceToHost);
    cudaFree(dl);
    cudaFree(pv);
    cudaFree(pi);
    cudaFree(tok);
    cudaFree(dpar);
    cudaFree(du);
    cudaFree(did);
    cudaFree(scratch);
    return e ? muser_errorf(err, MUSER_E_BACKEND, "cuda: draw check: %s", cudaGetErrorString(e)) : MUSER_OK;
}

extern "C" int muser_cuda_topk_check(const float *logits, uint32_t n, uint32_t rows, float *v, int32_t *id,
                                     muser_error *err)
{
    float *dl = NULL;
    unsigned long long *part = NULL, *keys = NULL;
    unsigned long long *hk = (unsigned long long *)malloc((size_t)rows * CU_TOPK * sizeof *hk);
    cudaError_t e = hk ? cudaMalloc((void **)&dl, (size_t)rows * n * sizeof(float)) : cudaErrorMemoryAllocation;
    if (!e) e = cudaMalloc((void **)&part, cu_topk_part_bytes(rows));
    if (!e) e = cudaMalloc((void **)&keys, (size_t)rows * CU_TOPK * sizeof *keys);
    if (!e) e = cudaMemcpy(dl, logits, (size_t)rows * n * sizeof(float), cudaMemcpyHostToDevice);
    if (!e) e = cu_topk(0, dl, n, part, keys, rows);
    if (!e) e = cudaMemcpy(hk, keys, (size_t)rows * CU_TOPK * sizeof *keys, cudaMemcpyDeviceToHost);
    for (size_t i = 0; !e && i < (size_t)rows * CU_TOPK; i++) cu_topk_decode(hk[i], &v[i], &id[i]);
    cudaFree(dl);
    cudaFree(part);
    cudaFree(keys);
    free(hk);
    return e ? muser_errorf(err, MUSER_E_BACKEND, "cuda: top-k check: %s", cudaGetErrorString(e)) : MUSER_OK;
}
