/* tpcomm.cuh — the GPU ranks' collectives (tpcomm.cu: NCCL through dlopen), enqueued on a stream and
 * so recordable in a CUDA graph. comm is the rank's ncclComm_t (muser_cuda_tp_comms_new). */
#ifndef MUSER_CUDA_TPCOMM_CUH
#define MUSER_CUDA_TPCOMM_CUH

#include <cuda_runtime.h>
#include <stddef.h>
#include <stdint.h>

/* buf[0..count) = its sum over the ranks (f32) */
cudaError_t cu_tp_all_reduce(void *comm, float *buf, size_t count, cudaStream_t st);
/* rows rows of full (row i at full + i·stride), each rank's part of a row its per floats at
 * rank·per: afterwards every rank's rows hold every rank's parts */
cudaError_t cu_tp_all_gather_rows(void *comm, float *full, uint32_t rows, size_t per, size_t stride, uint32_t rank,
                                  cudaStream_t st);

#endif
