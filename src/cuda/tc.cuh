/* tc.cuh — the tensor-core building blocks the attention kernels share (attention.cu's decode
 * split kernel, pfattn.cu's prefill kernel): cp.async into shared memory, ldmatrix, the f16
 * mma.sync m16n8k16 with f32 accumulation, and the f16 hi + lo split of an f32 pair. */
#ifndef MUSER_CUDA_TC_CUH
#define MUSER_CUDA_TC_CUH

#include <cuda_fp16.h>
#include <stdint.h>

__device__ __forceinline__ void tc_cp16(uint32_t dst, const void *src, bool valid)
{
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(valid ? 16 : 0)
                 : "memory");
}
__device__ __forceinline__ void tc_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void tc_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory"); }

__device__ __forceinline__ void tc_ldm(uint32_t a, uint32_t &r0, uint32_t &r1, uint32_t &r2, uint32_t &r3)
{
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3) : "r"(a) : "memory");
}
__device__ __forceinline__ void tc_ldm_t(uint32_t a, uint32_t &r0, uint32_t &r1, uint32_t &r2, uint32_t &r3)
{
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3) : "r"(a) : "memory");
}
/* d += a · b, m16n8k16, f16 inputs, f32 accumulator */
__device__ __forceinline__ void tc_mma(float *d, const uint32_t *a, uint32_t b0, uint32_t b1)
{
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
/* (x0, x1) -> f16x2 hi and lo with hi + lo = x to 22 bits (x − hi is exact in f32) */
__device__ __forceinline__ void tc_split(float x0, float x1, uint32_t &hi, uint32_t &lo)
{
    const __half2 h = __floats2half2_rn(x0, x1);
    const float2 hf = __half22float2(h);
    const __half2 l = __floats2half2_rn(x0 - hf.x, x1 - hf.y);
    hi = *(const uint32_t *)&h;
    lo = *(const uint32_t *)&l;
}
__device__ __forceinline__ float tc_pow2(int e) { return __int_as_float((127 + e) << 23); } /* e in [-126, 127] */

/* One ldmatrix.x4 (transposed when T) at shared address addr gives the B fragments of two n8
 * tiles; d0 and d1 += (ahi + alo)·B, the hi product first. */
template <bool T>
__device__ __forceinline__ void tc_ldm_mma2(uint32_t addr, const uint32_t *ahi, const uint32_t *alo, float *d0, float *d1)
{
    uint32_t b0, b1, b2, b3;
    if (T) tc_ldm_t(addr, b0, b1, b2, b3);
    else tc_ldm(addr, b0, b1, b2, b3);
    tc_mma(d0, ahi, b0, b1);
    tc_mma(d0, alo, b0, b1);
    tc_mma(d1, ahi, b2, b3);
    tc_mma(d1, alo, b2, b3);
}

#endif
