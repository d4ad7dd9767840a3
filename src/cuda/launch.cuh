/* launch.cuh — what every kernel of the decode route shares: the programmatic dependent launch
 * (PDL), the non-coherent load of a matvec's prepared x, and the weight loads that bypass L1.
 *
 * PDL: a kernel launched with programmatic stream serialization may start while the kernel before
 * it still runs. Everything before cu_pdl_wait() reads only weights, which no kernel writes;
 * everything after it may read the predecessor's output. A kernel lets its own dependent start
 * early with cu_pdl_trigger(). The matvecs, their preps, the tails and the embedding entry all do
 * this; where a kernel may trigger early is decided in backend.cu (the per-site digit buffers). */
#ifndef MUSER_CUDA_LAUNCH_CUH
#define MUSER_CUDA_LAUNCH_CUH

#include <cuda_runtime.h>
#include <stdint.h>

#include "cuda/timeline.cuh"

__device__ __forceinline__ void cu_pdl_wait()
{
    asm volatile("griddepcontrol.wait;" ::: "memory");
    CU_TL_WAITED();
}
__device__ __forceinline__ void cu_pdl_trigger() { asm volatile("griddepcontrol.launch_dependents;" ::: "memory"); }

/* A launch configuration of grid × block on st, with programmatic stream serialization when pdl.
 * at: storage for the attribute. A kernel launched this way must call cu_pdl_wait before it reads
 * what its predecessor writes, or writes what its predecessor reads. */
static inline cudaLaunchConfig_t cu_pdl_cfg(dim3 grid, dim3 block, cudaStream_t st, bool pdl, cudaLaunchAttribute *at)
{
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = grid;
    cfg.blockDim = block;
    cfg.stream = st;
    at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    at[0].val.programmaticStreamSerializationAllowed = 1;
    cfg.attrs = at;
    cfg.numAttrs = pdl ? 1 : 0;
    return cfg;
}

/* A matvec's load of its prepared x, which the kernel before it wrote: the non-coherent path
 * (__ldg), 1.6% faster per token than a plain load (H200, interleaved). The invariant that makes it
 * safe: no kernel that may still be running when the matvec launches reads the matvec's x buffer.
 * Otherwise such a kernel, on the same SM, can pull the buffer's old contents into L1 through this
 * path after the matvec's launch, and a load after griddepcontrol.wait hits that stale line
 * (measured: bench/kernels/NOTES.md, "PDL breaks v7"). It holds when the producer of x does not
 * trigger early (every kernel older than it has finished at the matvec's launch), or when, as in
 * the route (backend.cu, XS_*), each input site has its own buffer whose previous reader ran a
 * whole layer earlier, behind kernels that never trigger early. */
template <typename T>
__device__ __forceinline__ T cu_ldx(const void *p)
{
    return __ldg((const T *)p);
}

/* Weights are read once: keep them out of L1 (x lives there). */
__device__ __forceinline__ uint4 cu_ldw(const void *p)
{
    uint4 v;
    asm("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
    return v;
}
__device__ __forceinline__ uint32_t cu_ldw32(const void *p)
{
    uint32_t v;
    asm("ld.global.nc.L1::no_allocate.u32 %0, [%1];" : "=r"(v) : "l"(p));
    return v;
}
/* Word i (0..3) of v. */
__device__ __forceinline__ uint32_t cu_word(const uint4 &v, int i) { return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w; }

#endif
