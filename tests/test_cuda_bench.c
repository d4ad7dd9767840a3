/* test_cuda_bench.c — the CUDA decode bench lane (muser_cuda_bench) on a synthesized tiny model:
 * every depth gives a positive rate, the bytes per token grow with the cache depth, and the
 * streaming-read figure is measured. SKIP (77) without CUDA or a GPU.
 *
 * With MUSER_CUDA_BENCH_MODEL=PATH it benchmarks that model instead and prints the table
 * (MUSER_CUDA_BENCH_CTX="0,4096,32768,131072", MUSER_CUDA_BENCH_GEN=128): the device lane
 * until `muser bench --backend cuda` calls the same function. */
#include "check.h"
#include "session.h"
#include "synth.h"

#ifdef MUSER_HAVE_CUDA
#include "cuda/cuda_backend.h"
#endif

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

int main(void)
{
#ifndef MUSER_HAVE_CUDA
    printf("SKIP: no CUDA device (built without CUDA)\n");
    return 77;
#else
    muser_error err = {0};
    muser_model *m = NULL;
    const char *path = getenv("MUSER_CUDA_BENCH_MODEL");
    char tmp[256];
    if (!path) {
        snprintf(tmp, sizeof tmp, "test_cuda_bench_%d.gguf", (int)getpid());
        muser_synth_opts so;
        muser_synth_opts_default(&so);
        so.n_threads = 2;
        CHECK_OK(muser_synth_write(&so, tmp, NULL, &err), &err);
        CHECK_OK(muser_model_load(&m, tmp, &err), &err);
        unlink(tmp);
    } else {
        CHECK_OK(muser_model_load(&m, path, &err), &err);
    }
    if (!m) return 1;
    uint64_t ctxs[8] = {0, 100, 400};
    uint32_t n_ctx = 3, gen = 16;
    if (path) {
        const char *cs = getenv("MUSER_CUDA_BENCH_CTX");
        n_ctx = 0;
        char buf[256];
        snprintf(buf, sizeof buf, "%s", cs ? cs : "0,4096,32768,131072");
        for (char *t = strtok(buf, ","); t && n_ctx < 8; t = strtok(NULL, ",")) ctxs[n_ctx++] = strtoull(t, NULL, 10);
        const char *gs = getenv("MUSER_CUDA_BENCH_GEN");
        gen = gs ? (uint32_t)atoi(gs) : 128;
    }
    muser_cuda_bench_result res;
    muser_cuda_bench_row rows[8];
    const int rc = muser_cuda_bench(m, 0, ctxs, n_ctx, gen, &res, rows, &err);
    if (rc == MUSER_E_BACKEND && strstr(err.msg, "no CUDA device")) {
        printf("SKIP: no CUDA device\n");
        muser_model_free(m);
        return 77;
    }
    CHECK_OK(rc, &err);
    if (!rc) {
        printf("device %s, streaming read %.1f GB/s, upload %.1f s, weights read per token %.3f GB\n", res.device,
               res.read_gbs, res.upload_s, res.weight_bytes / 1e9);
        printf("%8s %6s %10s %9s %12s %9s %7s\n", "ctx", "gen", "ms/token", "tok/s", "MB/token", "GB/s", "%read");
        for (uint32_t i = 0; i < n_ctx; i++)
            printf("%8llu %6u %10.3f %9.1f %12.1f %9.1f %6.1f%%\n", (unsigned long long)rows[i].ctx, rows[i].gen,
                   rows[i].ms_per_token, rows[i].tok_per_s, rows[i].bytes_per_token / 1e6, rows[i].gbs, rows[i].pct_of_read);
        CHECK(res.read_gbs > 0);
        for (uint32_t i = 0; i < n_ctx; i++) CHECK(rows[i].tok_per_s > 0 && rows[i].gbs > 0);
        if (!path) CHECK(rows[2].bytes_per_token > rows[0].bytes_per_token);
    }
    muser_model_free(m);
    return check_failures ? 1 : 0;
#endif
}
