/* timeline.cuh — a per-CTA timeline of one decode token inside the graph (measurement builds only).
 *
 * Built with -DMUSER_CUDA_TIMELINE (cmake -DMUSER_CUDA_TIMELINE=ON); the default build compiles
 * every macro here to nothing. Each instrumented kernel opens CU_TL_SCOPE(tag) first: thread 0
 * takes a record slot (one atomic, so slots are in CTA start order, and the CTAs of one launch are
 * contiguous: a programmatic dependent starts only after every CTA of its primary has started) and
 * reads %globaltimer; the first return from griddepcontrol.wait stamps the wait; the last warp to
 * leave stamps the end. `muser bench` with MUSER_CUDA_TIMELINE=FILE writes one token's records
 * (after the timed tokens) to FILE.ctxN; scripts/timeline.py turns them into per-family costs,
 * launch gaps and per-CTA spread. The instrumented build is slower (a barrier and an atomic per CTA):
 * read it for where time goes, not for tok/s. */
#ifndef MUSER_CUDA_TIMELINE_CUH
#define MUSER_CUDA_TIMELINE_CUH

#include <stdint.h>

enum {
    TL_EMBED = 1, TL_MMQ, TL_MMQ_PAIR, TL_MMQ_PREP, TL_MMQ6, TL_MMQ6_PREP, TL_ROPE, TL_ATT_SPLIT, TL_ATT_SPLIT_TC,
    TL_ATT_COMBINE, TL_TAIL, TL_ARGMAX, TL_MVQ, TL_MVQ_PREP
};

typedef struct cu_tl_rec {
    uint16_t tag, smid;
    uint32_t cta, grid, pad;
    uint64_t t0;     /* CTA start (%globaltimer, ns) */
    uint32_t dw, d1; /* wait returned / last warp left, ns after t0 (dw 0: no wait) */
} cu_tl_rec;

typedef struct cu_tl_buf {
    uint32_t n, cap;
    cu_tl_rec rec[1];
} cu_tl_buf;

#ifdef MUSER_CUDA_TIMELINE
/* one per translation unit (no separable compilation): each .cu binds its own copy */
static __device__ cu_tl_buf *g_tl;

struct cu_tl_sh {
    unsigned long long t0, tw, t1;
    uint32_t idx, done;
};
__device__ __forceinline__ unsigned long long cu_tl_now()
{
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}
__device__ __forceinline__ cu_tl_sh &cu_tl_shared()
{
    __shared__ cu_tl_sh s;
    return s;
}
struct cu_tl_scope {
    uint16_t tag;
    __device__ explicit cu_tl_scope(uint16_t t) : tag(t)
    {
        cu_tl_sh &s = cu_tl_shared();
        if (threadIdx.x == 0) {
            s.t0 = cu_tl_now();
            s.tw = s.t1 = 0;
            s.done = 0;
            cu_tl_buf *b = g_tl;
            s.idx = b ? atomicAdd(&b->n, 1u) : 0xFFFFFFFFu;
        }
        __syncthreads();
    }
    __device__ ~cu_tl_scope()
    {
        if ((threadIdx.x & 31) != 0) return;
        cu_tl_sh &s = cu_tl_shared();
        atomicMax(&s.t1, cu_tl_now());
        __threadfence_block();
        const uint32_t nw = (blockDim.x * blockDim.y * blockDim.z + 31) / 32;
        if (atomicAdd(&s.done, 1u) != nw - 1) return;
        cu_tl_buf *b = g_tl;
        if (!b || s.idx >= b->cap) return;
        cu_tl_rec r;
        uint32_t sm;
        asm volatile("mov.u32 %0, %%smid;" : "=r"(sm));
        r.tag = tag;
        r.smid = (uint16_t)sm;
        r.cta = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
        r.grid = gridDim.x * gridDim.y * gridDim.z;
        r.pad = 0;
        r.t0 = s.t0;
        r.dw = s.tw ? (uint32_t)(s.tw - s.t0) : 0u;
        r.d1 = (uint32_t)(atomicMax(&s.t1, 0ull) - s.t0);
        b->rec[s.idx] = r;
    }
};
#define CU_TL_SCOPE(tag) cu_tl_scope cu_tl_scope_(tag)
/* after griddepcontrol.wait: the first warp back stamps the wait */
#define CU_TL_WAITED()                                                          \
    do {                                                                        \
        if ((threadIdx.x & 31) == 0) atomicCAS(&cu_tl_shared().tw, 0ull, cu_tl_now()); \
    } while (0)
#define CU_TL_BIND_FN(name)                                                     \
    void name(void *p)                                                          \
    {                                                                           \
        cu_tl_buf *b = (cu_tl_buf *)p;                                          \
        cudaMemcpyToSymbol(g_tl, &b, sizeof b);                                 \
    }
#else
#define CU_TL_SCOPE(tag) ((void)0)
#define CU_TL_WAITED() ((void)0)
#define CU_TL_BIND_FN(name) \
    void name(void *p) { (void)p; }
#endif

#endif
