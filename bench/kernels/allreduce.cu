/* allreduce.cu — what a tensor-parallel token's all-reduces cost (docs/tp.md): the product's own
 * collective (cu_tp_all_reduce: NCCL through src/cuda/tpcomm.cu) on every GPU of the host, f32 sums
 * of E = 6,656 floats (one decode row: 26 KB) and of 16 and 64 rows.
 *
 * Per size, two figures, medians of 5 rounds:
 *   eager   µs per all-reduce, 200 launched back to back on each rank's stream;
 *   graph   µs per all-reduce inside a CUDA graph of 104 (a Glimmer token's two a layer), replayed
 *           20 times: the number a token pays in the route.
 * A token at TP = 2 saves ~2.7 ms of weight reading (16.2 GB at 4.5 TB/s, halved); 104 reduces
 * must cost well under that. NCCL's protocol is NCCL_PROTO's (unset: NCCL's choice; LL and LL128
 * are its low-latency ones): run once per value. Needs two or more GPUs; prints SKIP otherwise.
 *
 *   NCCL_PROTO=LL build-cuda/bench/kbench_allreduce */
#include <pthread.h>

#include "kbench.cuh"
extern "C" {
#include "tp.h"
#include "util.h"
}
#include "cuda/cuda_backend.h"
#include "cuda/tpcomm.cuh"

enum { E = 6656, TOKEN_REDUCES = 104, EAGER = 200, REPLAYS = 20, ROUNDS = 5 };

struct rank_arg {
    int r, n;
    void *comm;
    size_t count;
    bool graph;
    pthread_barrier_t *bar;
    double us; /* out: µs per all-reduce, median of the rounds */
};

static void *rank_main(void *p)
{
    rank_arg *a = (rank_arg *)p;
    CK(cudaSetDevice(a->r));
    float *buf;
    cudaStream_t st;
    CK(cudaMalloc((void **)&buf, a->count * sizeof(float)));
    CK(cudaMemset(buf, 0, a->count * sizeof(float)));
    CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    cudaGraphExec_t ge = NULL;
    if (a->graph) {
        cudaGraph_t g;
        CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
        for (int i = 0; i < TOKEN_REDUCES; i++) CK(cu_tp_all_reduce(a->comm, buf, a->count, st));
        CK(cudaStreamEndCapture(st, &g));
        CK(cudaGraphInstantiate(&ge, g, 0));
        CK(cudaGraphDestroy(g));
    }
    std::vector<float> t;
    for (int round = -1; round < ROUNDS; round++) { /* round −1: warm-up */
        pthread_barrier_wait(a->bar);
        const double t0 = muser_now_s();
        if (a->graph) {
            for (int i = 0; i < REPLAYS; i++) CK(cudaGraphLaunch(ge, st));
        } else {
            for (int i = 0; i < EAGER; i++) CK(cu_tp_all_reduce(a->comm, buf, a->count, st));
        }
        CK(cudaStreamSynchronize(st));
        const double per = a->graph ? (double)REPLAYS * TOKEN_REDUCES : (double)EAGER;
        if (round >= 0) t.push_back((float)((muser_now_s() - t0) / per * 1e6));
    }
    a->us = kb_median(t);
    if (ge) cudaGraphExecDestroy(ge);
    cudaStreamDestroy(st);
    cudaFree(buf);
    return NULL;
}

int main(void)
{
    const int n = muser_cuda_device_count();
    if (n < 2) {
        printf("SKIP: kbench_allreduce needs two or more GPUs (%d here)\n", n);
        return 0;
    }
    void *comm[MUSER_TP_MAX];
    const uint32_t ranks = n > (int)MUSER_TP_MAX ? MUSER_TP_MAX : (uint32_t)n;
    muser_error err;
    memset(&err, 0, sizeof err);
    if (muser_cuda_tp_comms_new(0, ranks, comm, &err)) {
        fprintf(stderr, "kbench_allreduce: %s\n", err.msg);
        return 1;
    }
    const char *proto = getenv("NCCL_PROTO");
    printf("all-reduce of f32 sums over %u GPUs, NCCL_PROTO=%s (µs per all-reduce, median of %d rounds)\n", ranks,
           proto ? proto : "(NCCL's choice)", ROUNDS);
    printf("%-10s %10s %12s %12s %16s\n", "rows", "bytes", "eager", "graph", "a token's 104");
    const int rows[] = {1, 16, 64};
    for (int k = 0; k < 3; k++) {
        double us[2];
        for (int graph = 0; graph < 2; graph++) {
            pthread_barrier_t bar;
            pthread_barrier_init(&bar, NULL, ranks);
            rank_arg a[MUSER_TP_MAX];
            pthread_t th[MUSER_TP_MAX];
            for (uint32_t r = 0; r < ranks; r++) {
                a[r] = rank_arg{(int)r, (int)ranks, comm[r], (size_t)rows[k] * E, graph == 1, &bar, 0};
                pthread_create(&th[r], NULL, rank_main, &a[r]);
            }
            double worst = 0;
            for (uint32_t r = 0; r < ranks; r++) {
                pthread_join(th[r], NULL);
                worst = std::max(worst, a[r].us);
            }
            pthread_barrier_destroy(&bar);
            us[graph] = worst;
        }
        printf("%-10d %10zu %12.2f %12.2f %13.3f ms\n", rows[k], (size_t)rows[k] * E * sizeof(float), us[0], us[1],
               us[1] * TOKEN_REDUCES / 1e3);
    }
    for (uint32_t r = 0; r < ranks; r++) muser_cuda_tp_comm_free(comm[r]);
    return 0;
}
