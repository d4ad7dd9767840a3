/* cuda_backend.h — the CUDA backend's extra entry points beyond the session vtable
 * (muser_backend_cuda() in session.h): the decode benchmark lane used by `muser bench --backend
 * cuda`. Plain C; exists only in builds with CUDA (MUSER_HAVE_CUDA). */
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

#ifdef __cplusplus
}
#endif

#endif
