/* tpcomm.cu — the collectives of tensor parallelism on GPUs (tp.h, tpcomm.cuh): NCCL, loaded when a
 * split over several GPUs first asks for it.
 *
 * NCCL is opened with dlopen (libnccl.so.2) rather than linked: every other use of muser (one GPU,
 * the CPU, the tests) then starts on machines that lack the library, and a split that needs it fails
 * with the loader's message instead of the whole binary failing to start. The header (nccl.h, from
 * the CUDA toolkit) gives the types; without it at build time the GPU split is not built and says so.
 *
 * Exactness: an all-reduce of two ranks is one f32 addition per element, the same bytes whichever
 * rank adds (addition is commutative), so TP = 2 is deterministic whatever algorithm NCCL picks. Past
 * two ranks NCCL's ring or tree orders the additions by its topology; tpcomm pins NCCL_ALGO=Ring and
 * one channel's order is then fixed per communicator, run to run (docs/tp.md). */
#include <cuda_runtime.h>
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

extern "C" {
#include "tp.h"
#include "util.h"
}
#include "cuda/cuda_backend.h"
#include "cuda/tpcomm.cuh"

extern "C" int muser_cuda_device_count(void)
{
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
        cudaGetLastError(); /* no driver or no device: none */
        return 0;
    }
    return n;
}

#ifdef MUSER_HAVE_NCCL_H
#include <nccl.h>

/* The entry points muser calls, from the library opened once. */
static struct {
    bool tried, ok;
    char why[200];
    ncclResult_t (*init_all)(ncclComm_t *, int, const int *);
    ncclResult_t (*destroy)(ncclComm_t);
    ncclResult_t (*all_reduce)(const void *, void *, size_t, ncclDataType_t, ncclRedOp_t, ncclComm_t, cudaStream_t);
    ncclResult_t (*all_gather)(const void *, void *, size_t, ncclDataType_t, ncclComm_t, cudaStream_t);
    ncclResult_t (*group_start)(void);
    ncclResult_t (*group_end)(void);
    const char *(*error_string)(ncclResult_t);
} nc;

static bool nccl_open(void)
{
    if (nc.tried) return nc.ok;
    nc.tried = true;
    void *h = dlopen("libnccl.so.2", RTLD_NOW | RTLD_LOCAL);
    if (!h) h = dlopen("libnccl.so", RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        snprintf(nc.why, sizeof nc.why, "%s", dlerror());
        return false;
    }
    const char *missing = NULL; /* the first entry point libnccl lacks */
#define SYM(field, name) \
    if (!(*(void **)&nc.field = dlsym(h, name)) && !missing) missing = name
    SYM(init_all, "ncclCommInitAll");
    SYM(destroy, "ncclCommDestroy");
    SYM(all_reduce, "ncclAllReduce");
    SYM(all_gather, "ncclAllGather");
    SYM(group_start, "ncclGroupStart");
    SYM(group_end, "ncclGroupEnd");
    SYM(error_string, "ncclGetErrorString");
#undef SYM
    if (missing) {
        snprintf(nc.why, sizeof nc.why, "libnccl has no %s (muser needs NCCL 2.x)", missing);
        dlclose(h);
        return false;
    }
    nc.ok = true;
    return true;
}

extern "C" int muser_cuda_tp_comms_new(int first, uint32_t n, void **comms, muser_error *err)
{
    if (!nccl_open())
        return muser_errorf(err, MUSER_E_BACKEND, "tensor parallel over %u GPUs needs NCCL: %s", n, nc.why);
    /* a fixed reduction order for more than two ranks; NVLink multicast stays off (docs/tp.md) */
    setenv("NCCL_ALGO", "Ring", 0);
    setenv("NCCL_NVLS_ENABLE", "0", 0);
    int dev[MUSER_TP_MAX];
    for (uint32_t r = 0; r < n; r++) dev[r] = first + (int)r;
    ncclComm_t c[MUSER_TP_MAX];
    const ncclResult_t e = nc.init_all(c, (int)n, dev);
    if (e != ncclSuccess)
        return muser_errorf(err, MUSER_E_BACKEND, "tensor parallel: NCCL communicators on GPUs %d..%d: %s", first,
                            first + (int)n - 1, nc.error_string(e));
    for (uint32_t r = 0; r < n; r++) comms[r] = c[r];
    return MUSER_OK;
}

extern "C" void muser_cuda_tp_comm_free(void *comm)
{
    if (comm && nc.ok) nc.destroy((ncclComm_t)comm);
}

cudaError_t cu_tp_all_reduce(void *comm, float *buf, size_t count, cudaStream_t st)
{
    return nc.all_reduce(buf, buf, count, ncclFloat32, ncclSum, (ncclComm_t)comm, st) == ncclSuccess
               ? cudaSuccess
               : cudaErrorUnknown;
}

cudaError_t cu_tp_all_gather_rows(void *comm, float *full, uint32_t rows, size_t per, size_t stride, uint32_t rank,
                                  cudaStream_t st)
{
    if (nc.group_start() != ncclSuccess) return cudaErrorUnknown;
    bool ok = true;
    for (uint32_t i = 0; i < rows; i++) /* in place: rank r's part of row i is full + i·stride + r·per */
        ok &= nc.all_gather(full + i * stride + rank * per, full + i * stride, per, ncclFloat32, (ncclComm_t)comm, st) ==
              ncclSuccess;
    ok &= nc.group_end() == ncclSuccess;
    return ok ? cudaSuccess : cudaErrorUnknown;
}

#else /* built without nccl.h */

extern "C" int muser_cuda_tp_comms_new(int first, uint32_t n, void **comms, muser_error *err)
{
    (void)first;
    (void)comms;
    return muser_errorf(err, MUSER_E_UNSUPPORTED,
                        "tensor parallel over %u GPUs: this muser was built without NCCL's header (nccl.h)", n);
}

extern "C" void muser_cuda_tp_comm_free(void *comm) { (void)comm; }

cudaError_t cu_tp_all_reduce(void *, float *, size_t, cudaStream_t) { return cudaErrorNotSupported; }

cudaError_t cu_tp_all_gather_rows(void *, float *, uint32_t, size_t, size_t, uint32_t, cudaStream_t)
{
    return cudaErrorNotSupported;
}

#endif
