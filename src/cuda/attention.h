/* attention.h — a C entry point into attention.cu's split attention + combine, for tests.
 *
 * muser_cuda_attn_run() uploads host K/V planes (SPEC §3 layouts: ring token-major
 * [capacity][HKV·D], FULL head-major [HKV][capacity][D], f16 bits), q [H·D] and an optional gate
 * [H·D], runs exactly the decode route's cu_attention() with the chosen kernel (CU_ATTN_TC or
 * CU_ATTN_V1) and n_split blocks per KV head, and downloads out [H·D]. It allocates and frees per
 * call: for checks, not for the per-token path. Built only with CUDA (MUSER_HAVE_CUDA). */
#ifndef MUSER_CUDA_ATTENTION_H
#define MUSER_CUDA_ATTENTION_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* cu_attn_geom.impl: which split kernel. TC runs GQA 16:1 with head_dim 128 on tensor cores; any
 * other geometry falls back to V1 (CUDA cores, every supported geometry). */
#define CU_ATTN_V1 0
#define CU_ATTN_TC 1

typedef struct muser_cuda_attn_case {
    uint32_t n_head, n_head_kv, head_dim;
    int ring;                     /* 1: SWA ring plane, 0: FULL plane */
    uint32_t n_split;             /* blocks per KV head (the backend uses min(256, capacity / 64));
                                   * at most 256; tc uses at most 64 (ring: 32) of them */
    float scale;                  /* 1/sqrt(D) */
    uint64_t pos;                 /* position of the current token (the last stored one) */
    uint64_t origin_logical, origin_physical, len, capacity; /* plane metadata after the append */
    const uint16_t *k_plane, *v_plane; /* host, capacity·HKV·D f16 each */
    const float *q;               /* [H·D] */
    const float *gate;            /* [H·D] or NULL */
} muser_cuda_attn_case;

/* 0 ok; 77 no CUDA device; -1 on a CUDA error or a geometry the kernels refuse (msg says which). */
int muser_cuda_attn_run(const muser_cuda_attn_case *c, int impl, float *out, char *msg, size_t msg_len);

/* The QK-norm/RoPE/store folded into the tc split kernel against the separate kernel: c->q is the
 * raw q, k_row and v_row the raw k and v rows of position c->pos ([HKV·D] each), q_norm / k_norm
 * ([D], NULL: none), rope (theta) as the route has them. Runs both routes on copies of the planes;
 * *max_out: max |out_fused − out_separate| over [H·D]; *kv_equal: 1 when both left the K and V
 * planes bit-identical. Return codes as muser_cuda_attn_run (-1 also when tc cannot fuse). */
int muser_cuda_attn_fuse_check(const muser_cuda_attn_case *c, const float *k_row, const float *v_row,
                               const float *q_norm, const float *k_norm, float eps, int rope, float theta,
                               double *max_out, int *kv_equal, char *msg, size_t msg_len);

#ifdef __cplusplus
}
#endif

#endif
