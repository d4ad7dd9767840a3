/* cuda_backend.h — the CUDA backend's extra entry points beyond the session vtable
 * (muser_backend_cuda() in session.h): the decode benchmark lane used by `muser bench --backend
 * cuda`, and one matvec through the route's dispatch for tests. Plain C; exists only in builds
 * with CUDA (MUSER_HAVE_CUDA). */
#ifndef MUSER_CUDA_BACKEND_H
#define MUSER_CUDA_BACKEND_H

#include "model.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct muser_cuda_bench_row {
    uint64_t ctx;            /* tokens already in the cache when timing starts */
    uint32_t gen;            /* tokens timed */
    double ms_per_token;
    double tok_per_s;
    double bytes_per_token;  /* weights read + KV read, averaged over the timed tokens */
    double gbs;              /* bytes_per_token / time */
    double pct_of_read;      /* gbs / the streaming-read figure measured in the same run */
} muser_cuda_bench_row;

typedef struct muser_cuda_bench_result {
    char device[128];
    char route[96];          /* the route's shapes where the device decides them (the tails' cluster) */
    double read_gbs;         /* streaming-read kernel over 4 GiB, median of 10 */
    double upload_s;         /* weights to the device */
    uint64_t weight_bytes;   /* bytes of weights read per token */
} muser_cuda_bench_result;

/* Greedy decode with the argmax lane (no logits readback), recorded once as a graph, at each
 * depth in ctxs (the cache is filled with random f16 rows up to that depth). rows[n_ctx]. With
 * MUSER_PHASE_PROFILE=1 also prints per-op-family time of one token (events, no graph) to
 * stderr. */
int muser_cuda_bench(const muser_model *m, int device, const uint64_t *ctxs, uint32_t n_ctx, uint32_t gen,
                     muser_cuda_bench_result *res, muser_cuda_bench_row *rows, muser_error *err);

/* Tensor parallelism on GPUs (tp.h; tpcomm.cu): the CUDA devices present (0 without a driver or a
 * device), and one NCCL communicator per rank, rank r on device first + r (first + n ≤ the devices
 * present, n ≤ MUSER_TP_MAX; NCCL is loaded at the first call), freed each with
 * muser_cuda_tp_comm_free. */
int muser_cuda_device_count(void);
int muser_cuda_tp_comms_new(int first, uint32_t n, void **comms, muser_error *err);
void muser_cuda_tp_comm_free(void *comm);

/* One matvec y = W·x (rows × cols, W in GGUF bytes of ggml_type) through the route's dispatch, for
 * tests: uploaded as the route would (tc: the tensor-core layout where the format and shape allow
 * it, else the general path's), with the LM head's epilogue when softcap (y·scale, then
 * cap·tanh(y/cap) when cap > 0). *layout (may be NULL): the device layout it took (MV_T_*: 116
 * Q4_K tiles, 117 Q6_K tiles, else the ggml type). Allocates and frees per call. */
int muser_cuda_matvec_check(uint32_t ggml_type, uint32_t rows, uint32_t cols, const void *w, const float *x, int tc,
                            int softcap, float scale, float cap, float *y, uint32_t *layout, muser_error *err);

/* The gate·up pair through the route's dispatch, for tests: gate and up (Q4_K GGUF bytes, rows ×
 * cols, rows a multiple of 16, cols of 256) against n x rows (x[n][cols]) in one launch, y[n][rows] =
 * silu(gate·x)·(up·x); n_sm > 0 stands in for the device's SM count (the persistent grid's size). */
int muser_cuda_pair_check(uint32_t rows, uint32_t cols, const void *wg, const void *wu, uint32_t n, const float *x, int n_sm,
                          float *y, muser_error *err);

/* The prefill route's matrix product y[n][rows] = x[n][cols] · Wᵀ (prefill.cuh: W unpacked from
 * the tensor-core layout where the format and shape take it, x split per row, three f16 products
 * on tensor cores), for tests; *layout as muser_cuda_matvec_check's. cols a multiple of 32. */
int muser_cuda_gemm_check(uint32_t ggml_type, uint32_t rows, uint32_t cols, const void *w, uint32_t n, const float *x,
                          float *y, uint32_t *layout, muser_error *err);

/* The device's exact top CU_TOPK (64) of each of rows rows of n logits (cu_topk: what a top-k
 * sampler's step hands back), for tests: v and id [rows][64], best first. n <= 262,144. */
int muser_cuda_topk_check(const float *logits, uint32_t n, uint32_t rows, float *v, int32_t *id, muser_error *err);
/* The device's draw (cu_draw: what a pass hands back for a muser_draw row) of each of rows (1..16)
 * rows of n logits with temp[r] > 0, top_p[r], min_p[r] and uniform u[r] (temp[r] = 0: no draw, id[r]
 * −1; a row the device leaves to the host: −1 too), for tests; the host sampler's
 * muser_sampler_sample_u is what it must equal. The rows must be finite. */
int muser_cuda_draw_check(const float *logits, uint32_t n, uint32_t rows, const float *temp, const float *top_p,
                          const float *min_p, const double *u, int32_t *id, muser_error *err);

/* One chunk of the prefill route's attention (prefill.cuh's pf_attention, and pfattn.cuh's
 * pf_attention_tc on tensor cores), for tests: rows p0 .. p0+n−1 over a plane (SPEC §3 layouts,
 * metadata as before the chunk) and the chunk's staged rows. */
typedef struct muser_cuda_pfattn_case {
    uint32_t n_head, n_head_kv, head_dim;
    int ring;                          /* 1: SWA ring (token-major), 0: FULL plane (head-major) */
    uint32_t window;                   /* keys pos+1−window .. pos once pos+1 > window; 0: none */
    float scale;
    uint64_t p0;                       /* the chunk's first position */
    uint32_t n;                        /* its rows */
    uint64_t origin_logical, origin_physical, len, capacity; /* the plane's metadata */
    const uint16_t *k_plane, *v_plane; /* f16 bits, capacity·HKV·D each */
    const uint16_t *k_stage, *v_stage; /* f16 bits, [n][HKV·D]: positions p0 .. p0+n−1 */
    const float *q;                    /* [n][H·D] */
    uint32_t qt;                       /* pf_attention_tc's rows per CTA: 4 or 8, 0 its own choice */
} muser_cuda_pfattn_case;

/* Runs pf_attention into out_plain and pf_attention_tc into out_tc ([n][H·D] each; either NULL:
 * not run), each on an output poisoned with NaN. 0 ok; 1 when pf_attention_tc refused the
 * geometry (out_tc untouched); 77 without a CUDA device; else a MUSER_E_* code with err filled.
 * Allocates and frees per call. */
int muser_cuda_pfattn_check(const muser_cuda_pfattn_case *c, float *out_plain, float *out_tc, muser_error *err);

#ifdef __cplusplus
}
#endif

#endif
