/* cuda/dflash.cu — the DFlash drafter's forward pass on the GPU (dflash.h's MUSER_DFLASH_CUDA),
 * beside a target that decodes there: the same ops as src/cpu/dflash.c, in f32. The drafter is a
 * few layers of the target's width, so it is written for simplicity, not for the last microsecond:
 * every matrix (the drafter's, and the target's LM head it shares) is dequantized to f32 once at
 * creation and multiplied by cuBLAS SGEMM (pedantic math: no TF32), always over ROWS input rows
 * (the unused ones padding), since cuBLAS picks its kernel by shape: so a row's bits do not depend
 * on how many rows a call has, how a context was sliced, or how many logits rows were asked; norms, q/k norms with RoPE,
 * the block's attention over the cached context and itself, SwiGLU and the logits' scale and soft
 * cap are small kernels here, and the drafts' argmax. Each of the two calls is one CUDA graph,
 * recorded at creation: a block (t0's embedding and the block's position up, the layers, the LM head,
 * the argmax, the drafts and the rows' non-finite flags back) and a context slice of up to ROWS positions
 * (its tapped rows up, fc, every layer's keys and values into the planes). What changes between
 * replays is read from pinned host staging the graph copies up first (`df_params`), so a replay is
 * one launch: a round's dozens of small kernels would otherwise cost more than the target's step on
 * a small target. A context call returns once its slice is queued (muser_dflash_run_async): the
 * round loop hands it the verified rows while the host runs the acceptance.
 * Drafts only decide how fast speculation goes, never what it emits (spec.h), and the forward
 * stays within SPEC §4's contract of the f64 oracle (test_dflash).
 *
 * State, sized at creation: the context's keys and values of every layer ([n_layer][n_ctx][KVD],
 * normed and rotated), one block's activations and the f32 matrices. Nothing is allocated per
 * round. */
extern "C" {
#include "dflash.h"
#include "quant.h"
}

#include "cuda/ops.cuh"

#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#define ROWS MUSER_DFLASH_MAX_BLOCK /* rows of one block, or of one slice of context */
#define MUSER_DFLASH_MAX_HEAD_DIM 256

typedef struct cu_dflash_layer {
    float *attn_norm, *q, *k, *v, *q_norm, *k_norm, *o, *ffn_norm, *gate, *up, *down;
} cu_dflash_layer;

/* what a replay reads that the recording does not fix: the block's position (the number of held
 * positions) or a context slice's first position and rows */
typedef struct df_params {
    uint64_t pos;
    uint32_t m;
    uint32_t pad;
} df_params;

/* pinned host staging of a context slice: the parameters, then [ROWS][M·E] tapped rows */
typedef struct df_ctx_stage {
    df_params prm;
    float feats[];
} df_ctx_stage;

typedef struct cu_dflash {
    cudaStream_t st;
    cublasHandle_t blas;
    void *blas_ws;             /* cuBLAS's workspace, fixed before recording */
    cudaGraphExec_t g_block, g_ctx;
    cudaEvent_t ctx_done;      /* the last context replay: its staging is free again */
    df_params *prm_block, *prm_ctx;  /* on the device */
    df_params *h_prm_block;    /* pinned, beside h_x0 */
    df_ctx_stage *h_ctx;       /* pinned */
    int32_t *tok;              /* [ROWS] the drafts' argmax, on the device */
    float *am_v, *best;        /* cu_argmax's partials [ROWS][256] (am_i beside them) and logits [ROWS] */
    int32_t *am_i;
    int32_t *h_out;            /* pinned [2·ROWS]: the drafts, then the rows' non-finite flags */
    uint32_t E, F, H, HKV, D, QD, KVD, B, M, V;
    float *fc, *hidden_norm, *mask_embd, *output_norm, *head; /* f32 matrices [out][in], vectors */
    cu_dflash_layer *layers;
    float *ctx_k, *ctx_v;      /* [n_layer][n_ctx][KVD] */
    float *feats;              /* [ROWS][M·E] a context slice's tapped rows */
    float *x, *a, *sub;        /* [ROWS][E] the residual stream, a norm's output, o_proj / down / fc out */
    float *q, *o;              /* [ROWS][QD] */
    float *k, *v;              /* [ROWS][KVD] */
    float *fg, *fu;            /* [ROWS][F] */
    float *logits;             /* [ROWS][V] */
    float *scores;             /* [ROWS][H][n_ctx + ROWS] the attention weights */
    int32_t *bad;              /* [ROWS] non-zero where a logits row holds NaN or Inf (cu_argmax) */
    float *h_x0;               /* pinned [E]: t0's embedding on its way up */
    double *inv_freq;          /* [D/2] theta^(-2i/D), on the device */
    void **allocs;             /* every device allocation, freed together */
    uint32_t n_allocs;
} cu_dflash;

/* ---- kernels ---- */

/* 1 / rms of x[0..n) + eps, the sum of squares in f64 like the CPU's, by the block (part: blockDim
 * doubles of shared memory; blockDim a power of two) */
__device__ float df_inv_rms(const float *x, uint32_t n, float eps, double *part)
{
    double s = 0;
    for (uint32_t i = threadIdx.x; i < n; i += blockDim.x) s += (double)x[i] * x[i];
    part[threadIdx.x] = s;
    __syncthreads();
    for (uint32_t k = blockDim.x / 2; k > 0; k >>= 1) {
        if (threadIdx.x < k) part[threadIdx.x] += part[threadIdx.x + k];
        __syncthreads();
    }
    const float r = (float)(1.0 / sqrt(part[0] / n + (double)eps));
    __syncthreads();
    return r;
}

/* y = rmsnorm(x, w, eps) per row of n */
__global__ void k_df_rms(const float *x, const float *w, float eps, float *y, uint32_t n)
{
    x += (size_t)blockIdx.x * n;
    y += (size_t)blockIdx.x * n;
    __shared__ double part[256];
    const float r = df_inv_rms(x, n, eps, part);
    for (uint32_t i = threadIdx.x; i < n; i += blockDim.x) y[i] = x[i] * r * w[i];
}

/* per (row, head): rmsnorm over D with w, then RoPE (NORM pairs) at prm->pos + row; x [rows][heads·D] */
__global__ void k_df_head_norm_rope(float *x, uint32_t heads, uint32_t D, const float *w, float eps,
                                    const double *inv_freq, const df_params *prm)
{
    const uint64_t pos0 = prm->pos;
    const uint32_t row = blockIdx.x / heads, h = blockIdx.x % heads;
    float *xh = x + ((size_t)row * heads + h) * D;
    __shared__ double part[128];
    const float r = df_inv_rms(xh, D, eps, part);
    for (uint32_t i = threadIdx.x; i < D / 2; i += blockDim.x) {
        const double ang = (double)(pos0 + row) * inv_freq[i];
        const float cs = (float)cos(ang), sn = (float)sin(ang);
        const float x0 = xh[2 * i] * r * w[2 * i], x1 = xh[2 * i + 1] * r * w[2 * i + 1];
        xh[2 * i] = x0 * cs - x1 * sn;
        xh[2 * i + 1] = x0 * sn + x1 * cs;
    }
}

/* one (block row, head) per block: softmax over the context's p keys, then the block's B, without a
 * causal mask; o = Σ w_j v_j. scores: [rows][H][p + B] scratch */
__global__ void k_df_attend(const float *q, const float *ck, const float *cv, const float *bk, const float *bv, float *o,
                            float *scores, const df_params *prm, uint32_t B, uint32_t H, uint32_t group, uint32_t D,
                            uint32_t KVD, float scale)
{
    const uint64_t p = prm->pos;
    const uint32_t i = blockIdx.x / H, h = blockIdx.x % H, hk = h / group;
    const uint64_t n = p + B;
    const float *qh = q + ((size_t)i * H + h) * D;
    float *sc = scores + (size_t)blockIdx.x * n;
    __shared__ float red[256];
    float mx = -INFINITY;
    for (uint64_t j = threadIdx.x; j < n; j += blockDim.x) {
        const float *kj = j < p ? ck + j * KVD + (size_t)hk * D : bk + (j - p) * KVD + (size_t)hk * D;
        float dot = 0.0f;
        for (uint32_t e = 0; e < D; e++) dot += qh[e] * kj[e];
        sc[j] = dot * scale;
        mx = fmaxf(mx, sc[j]);
    }
    red[threadIdx.x] = mx;
    __syncthreads();
    for (uint32_t k = blockDim.x / 2; k > 0; k >>= 1) {
        if (threadIdx.x < k) red[threadIdx.x] = fmaxf(red[threadIdx.x], red[threadIdx.x + k]);
        __syncthreads();
    }
    mx = red[0];
    __syncthreads();
    float sum = 0.0f;
    for (uint64_t j = threadIdx.x; j < n; j += blockDim.x) {
        sc[j] = expf(sc[j] - mx);
        sum += sc[j];
    }
    red[threadIdx.x] = sum;
    __syncthreads();
    for (uint32_t k = blockDim.x / 2; k > 0; k >>= 1) {
        if (threadIdx.x < k) red[threadIdx.x] += red[threadIdx.x + k];
        __syncthreads();
    }
    const float inv = 1.0f / red[0];
    for (uint32_t e = threadIdx.x; e < D; e += blockDim.x) {
        float acc = 0.0f;
        for (uint64_t j = 0; j < n; j++) {
            const float *vj = j < p ? cv + j * KVD + (size_t)hk * D : bv + (j - p) * KVD + (size_t)hk * D;
            acc += sc[j] * inv * vj[e];
        }
        o[((size_t)i * H + h) * D + e] = acc;
    }
}

__global__ void k_df_add(float *x, const float *y, size_t n)
{
    const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] += y[i];
}

__global__ void k_df_swiglu(float *g, const float *u, size_t n)
{
    const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) g[i] = g[i] / (1.0f + expf(-g[i])) * u[i];
}

/* rows 1.. of the block are the mask vector */
__global__ void k_df_mask_rows(float *x, const float *mask, uint32_t E, uint32_t B)
{
    const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < (size_t)(B - 1) * E) x[E + i] = mask[i % E];
}

/* logits · scale, then cap·tanh(x/cap) when cap > 0 */
__global__ void k_df_logit_finish(float *z, size_t n, float scale, float cap)
{
    const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    float v = z[i] * scale;
    if (cap > 0.0f) v = cap * tanhf(v / cap);
    z[i] = v;
}

/* rows 0..prm->m of k and v into a layer's context planes at positions prm->pos.. */
__global__ void k_df_store(float *ck, float *cv, const float *k, const float *v, const df_params *prm, uint32_t KVD)
{
    const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (size_t)prm->m * KVD) return;
    ck[prm->pos * KVD + i] = k[i];
    cv[prm->pos * KVD + i] = v[i];
}

/* ---- host ---- */

static unsigned grid(size_t n) { return (unsigned)((n + 255) / 256); }

static cudaError_t dev_alloc(cu_dflash *c, void *p, size_t bytes)
{
    void **pp = (void **)p;
    cudaError_t e = cudaMalloc(pp, bytes ? bytes : 16);
    if (!e) c->allocs[c->n_allocs++] = *pp;
    return e;
}

/* t (any format quant.c reads, [rows][cols]) as f32 on the device */
static int upload(cu_dflash *c, const muser_tensor *t, float **out, muser_error *err)
{
    const size_t n = (size_t)t->rows * t->cols;
    float *h = (float *)malloc(n * sizeof(float));
    if (!h) return muser_errorf(err, MUSER_E_NOMEM, "dflash cuda: out of memory for %s", t->name);
    for (uint64_t r = 0; r < t->rows; r++) {
        const int rc = quant_dequantize_row(t->type, muser_tensor_row(t, r), h + r * t->cols, t->cols);
        if (rc) {
            free(h);
            return muser_errorf(err, (muser_status)rc, "dflash cuda: cannot read %s", t->name);
        }
    }
    cudaError_t e = dev_alloc(c, out, n * sizeof(float));
    if (!e) e = cudaMemcpy(*out, h, n * sizeof(float), cudaMemcpyHostToDevice);
    free(h);
    if (e) return muser_errorf(err, MUSER_E_NOMEM, "dflash cuda: %s: %s", t->name, cudaGetErrorString(e));
    return MUSER_OK;
}

/* y[i][0..out) = W · x[i] for the ROWS rows of x and y (whatever a caller uses of them): W [out][in]
 * row-major; one shape per matrix, one cuBLAS kernel */
static int gemm(cu_dflash *c, const float *W, uint32_t out, uint32_t in, const float *x, float *y)
{
    const float one = 1.0f, zero = 0.0f;
    return cublasSgemm(c->blas, CUBLAS_OP_T, CUBLAS_OP_N, (int)out, ROWS, (int)in, &one, W, (int)in, x, (int)in, &zero,
                       y, (int)out) != CUBLAS_STATUS_SUCCESS;
}

static void cu_dflash_free(muser_dflash_run *r)
{
    cu_dflash *c = (cu_dflash *)r->state;
    if (!c) return;
    if (c->st) cudaStreamSynchronize(c->st);
    if (c->g_block) cudaGraphExecDestroy(c->g_block);
    if (c->g_ctx) cudaGraphExecDestroy(c->g_ctx);
    if (c->ctx_done) cudaEventDestroy(c->ctx_done);
    for (uint32_t i = 0; i < c->n_allocs; i++) cudaFree(c->allocs[i]);
    if (c->h_x0) cudaFreeHost(c->h_x0);
    if (c->h_prm_block) cudaFreeHost(c->h_prm_block);
    if (c->h_ctx) cudaFreeHost(c->h_ctx);
    if (c->h_out) cudaFreeHost(c->h_out);
    if (c->blas) cublasDestroy(c->blas);
    if (c->st) cudaStreamDestroy(c->st);
    free(c->allocs);
    free(c->layers);
    free(c);
    r->state = NULL;
}

static int cuda_fail(cudaError_t e, const char *what, muser_error *err)
{
    return muser_errorf(err, MUSER_E_BACKEND, "dflash cuda: %s: %s", what, cudaGetErrorString(e));
}

/* The context slice as recorded: the staging up, u = rmsnorm(fc · feats, hidden_norm), then every
 * layer's K (normed, rotated at pos..) and V, rows 0..m stored into the planes. All ROWS rows are
 * computed (the rest are padding the GEMMs run anyway), so a row's bits do not depend on m. */
static int record_context(muser_dflash_run *r, cu_dflash *c)
{
    const muser_dflash *d = r->d;
    const size_t ME = (size_t)c->M * c->E;
    if (cudaMemcpyAsync(c->prm_ctx, &c->h_ctx->prm, sizeof(df_params), cudaMemcpyHostToDevice, c->st) ||
        cudaMemcpyAsync(c->feats, c->h_ctx->feats, ROWS * ME * sizeof(float), cudaMemcpyHostToDevice, c->st) ||
        gemm(c, c->fc, c->E, (uint32_t)ME, c->feats, c->sub))
        return 1;
    k_df_rms<<<ROWS, 256, 0, c->st>>>(c->sub, c->hidden_norm, d->hp.rms_eps, c->a, c->E);
    for (uint32_t l = 0; l < d->hp.n_layer; l++) {
        const cu_dflash_layer *G = &c->layers[l];
        if (gemm(c, G->k, c->KVD, c->E, c->a, c->k) || gemm(c, G->v, c->KVD, c->E, c->a, c->v)) return 1;
        k_df_head_norm_rope<<<ROWS * c->HKV, 128, 0, c->st>>>(c->k, c->HKV, c->D, G->k_norm, d->hp.rms_eps, c->inv_freq,
                                                             c->prm_ctx);
        k_df_store<<<grid((size_t)ROWS * c->KVD), 256, 0, c->st>>>(c->ctx_k + (size_t)l * r->n_ctx * c->KVD,
                                                                  c->ctx_v + (size_t)l * r->n_ctx * c->KVD, c->k, c->v,
                                                                  c->prm_ctx, c->KVD);
    }
    return 0;
}

/* The block as recorded: t0's embedding and the position up, the mask rows, the layers, the final
 * norm and the LM head for rows 1..B-1, the logits' scale and cap, each row's argmax and non-finite
 * flag (cu_argmax, the decode route's), and the drafts and flags back to h_out.
 * The logits stay on the device. */
static int record_block(muser_dflash_run *r, cu_dflash *c)
{
    const muser_dflash *d = r->d;
    const muser_model *t = d->target;
    const uint32_t B = c->B, E = c->E;
    const float eps = d->hp.rms_eps;
    if (cudaMemcpyAsync(c->prm_block, c->h_prm_block, sizeof(df_params), cudaMemcpyHostToDevice, c->st) ||
        cudaMemcpyAsync(c->x, c->h_x0, E * sizeof(float), cudaMemcpyHostToDevice, c->st))
        return 1;
    k_df_mask_rows<<<grid((size_t)(B - 1) * E), 256, 0, c->st>>>(c->x, c->mask_embd, E, B);
    for (uint32_t l = 0; l < d->hp.n_layer; l++) {
        const cu_dflash_layer *G = &c->layers[l];
        k_df_rms<<<B, 256, 0, c->st>>>(c->x, G->attn_norm, eps, c->a, E);
        if (gemm(c, G->q, c->QD, E, c->a, c->q) || gemm(c, G->k, c->KVD, E, c->a, c->k) ||
            gemm(c, G->v, c->KVD, E, c->a, c->v))
            return 1;
        k_df_head_norm_rope<<<B * c->H, 128, 0, c->st>>>(c->q, c->H, c->D, G->q_norm, eps, c->inv_freq, c->prm_block);
        k_df_head_norm_rope<<<B * c->HKV, 128, 0, c->st>>>(c->k, c->HKV, c->D, G->k_norm, eps, c->inv_freq, c->prm_block);
        k_df_attend<<<B * c->H, 256, 0, c->st>>>(c->q, c->ctx_k + (size_t)l * r->n_ctx * c->KVD,
                                                c->ctx_v + (size_t)l * r->n_ctx * c->KVD, c->k, c->v, c->o, c->scores,
                                                c->prm_block, B, c->H, c->H / c->HKV, c->D, c->KVD, d->hp.attn_scale);
        if (gemm(c, G->o, E, c->QD, c->o, c->sub)) return 1;
        k_df_add<<<grid((size_t)B * E), 256, 0, c->st>>>(c->x, c->sub, (size_t)B * E);
        k_df_rms<<<B, 256, 0, c->st>>>(c->x, G->ffn_norm, eps, c->a, E);
        if (gemm(c, G->gate, c->F, E, c->a, c->fg) || gemm(c, G->up, c->F, E, c->a, c->fu)) return 1;
        k_df_swiglu<<<grid((size_t)B * c->F), 256, 0, c->st>>>(c->fg, c->fu, (size_t)B * c->F);
        if (gemm(c, G->down, E, c->F, c->fg, c->sub)) return 1;
        k_df_add<<<grid((size_t)B * E), 256, 0, c->st>>>(c->x, c->sub, (size_t)B * E);
    }
    /* rows 1..B-1: the drafter's final norm, then the target's LM head */
    k_df_rms<<<B - 1, 256, 0, c->st>>>(c->x + E, c->output_norm, eps, c->a, E);
    if (gemm(c, c->head, c->V, E, c->a, c->logits)) return 1;
    k_df_logit_finish<<<grid((size_t)(B - 1) * c->V), 256, 0, c->st>>>(c->logits, (size_t)(B - 1) * c->V,
                                                                       t->hp.logit_scale, t->hp.final_softcap);
    cu_argmax(c->st, c->logits, c->V, c->am_v, c->am_i, c->tok, c->bad, c->best, B - 1);
    return cudaMemcpyAsync(c->h_out, c->tok, ROWS * sizeof(int32_t), cudaMemcpyDeviceToHost, c->st) ||
           cudaMemcpyAsync(c->h_out + ROWS, c->bad, ROWS * sizeof(int32_t), cudaMemcpyDeviceToHost, c->st);
}

/* capture what rec enqueues on c's stream as one executable graph */
static int record(muser_dflash_run *r, cu_dflash *c, int (*rec)(muser_dflash_run *, cu_dflash *), cudaGraphExec_t *out,
                  const char *what, muser_error *err)
{
    cudaGraph_t g = NULL;
    cudaError_t e = cudaStreamBeginCapture(c->st, cudaStreamCaptureModeThreadLocal);
    if (e) return cuda_fail(e, what, err);
    const int bad = rec(r, c);
    e = cudaStreamEndCapture(c->st, &g);
    if (!e && bad) e = cudaErrorStreamCaptureInvalidated;
    if (!e) e = cudaGraphInstantiate(out, g, 0);
    if (g) cudaGraphDestroy(g);
    return e ? cuda_fail(e, what, err) : MUSER_OK;
}

static int cu_dflash_init(muser_dflash_run *r, muser_error *err)
{
    const muser_dflash *d = r->d;
    const muser_dflash_hparams *hp = &d->hp;
    const muser_model *t = d->target;
    cu_dflash *c = (cu_dflash *)calloc(1, sizeof *c);
    if (!c) return muser_errorf(err, MUSER_E_NOMEM, "dflash cuda: out of memory");
    r->state = c;
    c->E = hp->n_embd;
    c->F = hp->n_ff;
    c->H = hp->n_head;
    c->HKV = hp->n_head_kv;
    c->D = hp->head_dim;
    c->QD = c->H * c->D;
    c->KVD = c->HKV * c->D;
    c->B = hp->block_size;
    c->M = hp->n_tap;
    c->V = t->hp.n_vocab;
    c->allocs = (void **)calloc(40 + 16 * (size_t)hp->n_layer, sizeof(void *));
    c->layers = (cu_dflash_layer *)calloc(hp->n_layer, sizeof *c->layers);
    if (!c->allocs || !c->layers) {
        cu_dflash_free(r);
        return muser_errorf(err, MUSER_E_NOMEM, "dflash cuda: out of memory");
    }
    int dev_count = 0;
    if (cudaGetDeviceCount(&dev_count) != cudaSuccess || dev_count == 0) {
        cu_dflash_free(r);
        return muser_errorf(err, MUSER_E_BACKEND, "dflash cuda: no CUDA device");
    }
    /* cuBLAS gets its workspace before anything is recorded, so no replay allocates */
    const size_t ws = 32u << 20;
    cudaError_t e = cudaStreamCreateWithFlags(&c->st, cudaStreamNonBlocking);
    if (!e) e = dev_alloc(c, &c->blas_ws, ws);
    if (!e && (cublasCreate(&c->blas) != CUBLAS_STATUS_SUCCESS || cublasSetStream(c->blas, c->st) != CUBLAS_STATUS_SUCCESS ||
               cublasSetWorkspace(c->blas, c->blas_ws, ws) != CUBLAS_STATUS_SUCCESS ||
               cublasSetMathMode(c->blas, CUBLAS_PEDANTIC_MATH) != CUBLAS_STATUS_SUCCESS))
        e = cudaErrorUnknown;
    if (!e) e = cudaEventCreateWithFlags(&c->ctx_done, cudaEventDisableTiming);
    if (e) {
        cu_dflash_free(r);
        return muser_errorf(err, MUSER_E_BACKEND, "dflash cuda: stream, event or cuBLAS: %s", cudaGetErrorString(e));
    }
    int rc = upload(c, &d->fc, &c->fc, err);
    if (!rc) rc = upload(c, &d->hidden_norm, &c->hidden_norm, err);
    if (!rc) rc = upload(c, &d->mask_embd, &c->mask_embd, err);
    if (!rc) rc = upload(c, &d->output_norm, &c->output_norm, err);
    if (!rc) rc = upload(c, &t->output, &c->head, err);
    for (uint32_t l = 0; !rc && l < hp->n_layer; l++) {
        const muser_dflash_layer *L = &d->layers[l];
        cu_dflash_layer *G = &c->layers[l];
        const muser_tensor *src[] = {&L->attn_norm, &L->attn_q,   &L->attn_k,  &L->attn_v,   &L->attn_q_norm, &L->attn_k_norm,
                                     &L->attn_output, &L->ffn_norm, &L->ffn_gate, &L->ffn_up, &L->ffn_down};
        float **dst[] = {&G->attn_norm, &G->q, &G->k, &G->v, &G->q_norm, &G->k_norm, &G->o, &G->ffn_norm, &G->gate, &G->up, &G->down};
        for (size_t i = 0; !rc && i < sizeof src / sizeof src[0]; i++) rc = upload(c, src[i], dst[i], err);
    }
    if (rc) {
        cu_dflash_free(r);
        return rc;
    }
    const size_t plane = (size_t)hp->n_layer * r->n_ctx * c->KVD * sizeof(float);
    const size_t ctx_rows = r->n_ctx + ROWS;
    const size_t ME = (size_t)c->M * c->E;
    const size_t stage = sizeof(df_ctx_stage) + ROWS * ME * sizeof(float);
    e = dev_alloc(c, &c->ctx_k, plane);
    if (!e) e = dev_alloc(c, &c->ctx_v, plane);
    if (!e) e = dev_alloc(c, &c->feats, ROWS * ME * sizeof(float));
    if (!e) e = dev_alloc(c, &c->x, (size_t)ROWS * c->E * sizeof(float));
    if (!e) e = dev_alloc(c, &c->a, (size_t)ROWS * c->E * sizeof(float));
    if (!e) e = dev_alloc(c, &c->sub, (size_t)ROWS * c->E * sizeof(float));
    if (!e) e = dev_alloc(c, &c->q, (size_t)ROWS * c->QD * sizeof(float));
    if (!e) e = dev_alloc(c, &c->o, (size_t)ROWS * c->QD * sizeof(float));
    if (!e) e = dev_alloc(c, &c->k, (size_t)ROWS * c->KVD * sizeof(float));
    if (!e) e = dev_alloc(c, &c->v, (size_t)ROWS * c->KVD * sizeof(float));
    if (!e) e = dev_alloc(c, &c->fg, (size_t)ROWS * c->F * sizeof(float));
    if (!e) e = dev_alloc(c, &c->fu, (size_t)ROWS * c->F * sizeof(float));
    if (!e) e = dev_alloc(c, &c->logits, (size_t)ROWS * c->V * sizeof(float));
    if (!e) e = dev_alloc(c, &c->scores, (size_t)ROWS * c->H * ctx_rows * sizeof(float));
    if (!e) e = dev_alloc(c, &c->bad, ROWS * sizeof(int32_t));
    if (!e) e = dev_alloc(c, &c->tok, ROWS * sizeof(int32_t));
    if (!e) e = dev_alloc(c, &c->am_v, (size_t)ROWS * 256 * sizeof(float));
    if (!e) e = dev_alloc(c, &c->am_i, (size_t)ROWS * 256 * sizeof(int32_t));
    if (!e) e = dev_alloc(c, &c->best, ROWS * sizeof(float));
    if (!e) e = dev_alloc(c, &c->prm_block, sizeof(df_params));
    if (!e) e = dev_alloc(c, &c->prm_ctx, sizeof(df_params));
    if (!e) e = cudaMallocHost((void **)&c->h_x0, c->E * sizeof(float));
    if (!e) e = cudaMallocHost((void **)&c->h_prm_block, sizeof(df_params));
    if (!e) e = cudaMallocHost((void **)&c->h_ctx, stage);
    if (!e) e = cudaMallocHost((void **)&c->h_out, 2 * ROWS * sizeof(int32_t));
    /* the buffers the padding rows read start zero, so they stay finite */
    if (!e) e = cudaMemsetAsync(c->x, 0, (size_t)ROWS * c->E * sizeof(float), c->st);
    if (!e) e = cudaMemsetAsync(c->fg, 0, (size_t)ROWS * c->F * sizeof(float), c->st);
    if (!e) e = cudaMemsetAsync(c->o, 0, (size_t)ROWS * c->QD * sizeof(float), c->st);
    if (!e) e = cudaMemsetAsync(c->a, 0, (size_t)ROWS * c->E * sizeof(float), c->st);
    if (e) {
        cu_dflash_free(r);
        return muser_errorf(err, MUSER_E_NOMEM, "dflash cuda: a context of %llu positions: %s",
                            (unsigned long long)r->n_ctx, cudaGetErrorString(e));
    }
    memset(c->h_ctx, 0, stage);
    double inv[MUSER_DFLASH_MAX_HEAD_DIM / 2];
    if (c->D > MUSER_DFLASH_MAX_HEAD_DIM) {
        cu_dflash_free(r);
        return muser_errorf(err, MUSER_E_UNSUPPORTED, "dflash cuda: head_dim %u (at most %u)", c->D, MUSER_DFLASH_MAX_HEAD_DIM);
    }
    for (uint32_t i = 0; i < c->D / 2; i++) inv[i] = pow((double)hp->rope_theta, -2.0 * (double)i / (double)c->D);
    e = dev_alloc(c, &c->inv_freq, c->D / 2 * sizeof(double));
    if (!e) e = cudaMemcpy(c->inv_freq, inv, c->D / 2 * sizeof(double), cudaMemcpyHostToDevice);
    if (!e) e = cudaStreamSynchronize(c->st);
    if (e) {
        cu_dflash_free(r);
        return muser_errorf(err, MUSER_E_NOMEM, "dflash cuda: the RoPE table: %s", cudaGetErrorString(e));
    }
    rc = record(r, c, record_context, &c->g_ctx, "recording the context graph", err);
    if (!rc) rc = record(r, c, record_block, &c->g_block, "recording the block graph", err);
    if (rc) cu_dflash_free(r);
    return rc;
}

/* positions [pos0, pos0 + n), ROWS at a time through the context graph; returns once the last
 * slice is queued (a slice waits only for the staging the previous one copied up) */
static int cu_dflash_context(muser_dflash_run *r, uint64_t pos0, const float *feats, uint32_t n, muser_error *err)
{
    cu_dflash *c = (cu_dflash *)r->state;
    const size_t ME = (size_t)c->M * c->E;
    for (uint32_t s = 0; s < n; s += ROWS) {
        const uint32_t m = n - s < ROWS ? n - s : ROWS;
        cudaError_t e = cudaEventSynchronize(c->ctx_done);
        if (e) return cuda_fail(e, "context", err);
        c->h_ctx->prm.pos = pos0 + s;
        c->h_ctx->prm.m = m;
        memcpy(c->h_ctx->feats, feats + s * ME, m * ME * sizeof(float));
        e = cudaGraphLaunch(c->g_ctx, c->st);
        if (!e) e = cudaEventRecord(c->ctx_done, c->st);
        if (e) return cuda_fail(e, "context", err);
    }
    return MUSER_OK;
}

/* one replay of the block graph at t0; the drafts and the non-finite flags are in h_out after */
static int run_block(muser_dflash_run *r, int32_t t0, uint32_t n_out, muser_error *err)
{
    cu_dflash *c = (cu_dflash *)r->state;
    const muser_model *t = r->d->target;
    /* the last replay was waited for, so its staging is free */
    int rc = quant_dequantize_row(t->tok_embd.type, muser_tensor_row(&t->tok_embd, (uint64_t)t0), c->h_x0, c->E);
    if (rc) return muser_errorf(err, (muser_status)rc, "dflash cuda: cannot read token %d's embedding", t0);
    c->h_prm_block->pos = r->held;
    cudaError_t e = cudaGraphLaunch(c->g_block, c->st);
    if (!e) e = cudaStreamSynchronize(c->st);
    if (e) return cuda_fail(e, "block", err);
    for (uint32_t i = 0; i < n_out; i++)
        if (c->h_out[ROWS + i])
            return muser_errorf(err, MUSER_E_NUMERIC, "dflash cuda: the logits of block row %u hold NaN or Inf", i + 1);
    return MUSER_OK;
}

static int cu_dflash_block(muser_dflash_run *r, int32_t t0, uint32_t n_out, float *logits, muser_error *err)
{
    cu_dflash *c = (cu_dflash *)r->state;
    int rc = run_block(r, t0, n_out, err);
    if (rc) return rc;
    const cudaError_t e = cudaMemcpy(logits, c->logits, (size_t)n_out * c->V * sizeof(float), cudaMemcpyDeviceToHost);
    return e ? cuda_fail(e, "block logits", err) : MUSER_OK;
}

static int cu_dflash_draft(muser_dflash_run *r, int32_t t0, uint32_t n_out, int32_t *tokens, muser_error *err)
{
    cu_dflash *c = (cu_dflash *)r->state;
    const int rc = run_block(r, t0, n_out, err);
    if (!rc) memcpy(tokens, c->h_out, n_out * sizeof(int32_t));
    return rc;
}

static const muser_dflash_impl cuda_impl = {
    cu_dflash_init, cu_dflash_free, cu_dflash_context, cu_dflash_block, cu_dflash_draft, true,
};

extern "C" const muser_dflash_impl *muser_dflash_impl_cuda(void)
{
    return &cuda_impl;
}
