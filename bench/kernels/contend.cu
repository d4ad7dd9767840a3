/* contend.cu — workbench for two research questions behind filling DRAM's idle time in a decode
 * token (the tails, attention and the preps leave DRAM idle; bench/kernels/NOTES.md):
 *
 * Part 1: while DRAM streams at a given rate, how much slower is a latency chain beside it?
 * One launch: two chain blocks and a streaming grid (2 blocks of 256 threads per SM, all resident).
 * The streamers read a 2 GiB buffer (16-byte ld.global.nc, four 512-byte warp loads in flight per
 * warp, then __nanosleep(S) to set the rate) until the chain is done. The chain starts once every
 * streamer has started, spins 20 us so the stream is in its steady state, then runs H dependent
 * hops and raises the done flag:
 *   l2      one thread chases a random cycle of 256 lines (32 KB) with ld.global.cg and an L2
 *           evict_last policy: every hop an L2 hit (what a tail's loads of y and h, or the
 *           combine's partials, are)
 *   flag    block 0 stores i (st.release.gpu) and spins (ld.acquire.gpu) until block 1, which spun
 *           until it saw i, answers with i: ns per round trip, two one-way hand-offs (what a grid
 *           barrier or a producer/consumer flag is made of)
 *   dram    one thread chases a random cycle over 1 GiB (evict_first; a new start each launch): every
 *           hop a DRAM miss (a matrix's first bytes, the ramp)
 * Per point: the stream's rate over the launch (bytes / (last exit - first start)), f = that rate /
 * the streaming read the same run measures, ns per hop, k = ns / the unloaded ns, and
 *   net = f·k - (k - 1)
 * the DRAM floor time gained per us of chain: during a chain of length L the stream does f·k·L of
 * floor work and the chain ends (k-1)·L later. net <= 0 at every rate would mean streaming beside a
 * latency chain cannot pay, whatever buffer it fills; net > 0 names the rates at which it could.
 *
 * Part 2: does a warm read leave the bytes in L2 for the engine's weight loads (ld.global.nc), and
 * how much faster is a 16 MB read from there? Each case first flushes L2 with 256 MB of nc reads and
 * 256 MB of cg reads, then (maybe) warm-reads the 16 MB with nc or cg loads (and maybe 48 MB of other
 * nc reads), then times an nc read of the 16 MB inside the kernel (first block start .. last block
 * end); one cold case times a cg read instead.
 *   usage: kbench_contend [reps]  (median of reps launches per point) */
#include "kbench.cuh"

#define CT_BLOCK 256
#define CT_L2_LINES 256

struct ct_args {
    const uint4 *stream;
    size_t n16;                  /* stream buffer size, 16-byte units */
    const uint32_t *l2;          /* CT_L2_LINES lines of 32 words; word 0 of a line: next line's word index */
    const uint32_t *dram;        /* same over the DRAM cycle */
    uint32_t start;              /* word index the chase starts at (the dram chase: a new one per rep) */
    uint32_t mode;               /* 0 l2, 1 flag, 2 dram */
    uint32_t hops;
    uint32_t sleep_ns;           /* throttle; UINT32_MAX: streamers exit at once (unloaded) */
    uint32_t n_stream_blocks;
    uint32_t *flags;             /* [0] streamers started, [1] done, [2] ping, [3] pong */
    unsigned long long *acc;     /* [0] stream bytes, [1] first start, [2] last exit, [3] chain ns */
    uint32_t *sink;
};

__device__ __forceinline__ uint4 ct_ld_stream(const uint4 *p)
{
    uint4 v;
    asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
    return v;
}
__device__ __forceinline__ uint32_t ct_ld_chain(const uint32_t *p, uint64_t pol)
{
    uint32_t v;
    asm volatile("ld.global.cg.L2::cache_hint.u32 %0, [%1], %2;" : "=r"(v) : "l"(p), "l"(pol) : "memory");
    return v;
}
__device__ __forceinline__ void ct_st_release(uint32_t *p, uint32_t v)
{
    asm volatile("st.release.gpu.global.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}

__device__ static void ct_chain(const ct_args &a)
{
    const bool lead = blockIdx.x == 0;
    if (threadIdx.x != 0) return;
    while (kb_ld_acquire(&a.flags[0]) < a.n_stream_blocks) {}
    const uint64_t w0 = kb_now();
    while (kb_now() - w0 < 20000) {}
    uint64_t pol; /* l2: keep the cycle in L2; dram: let each hop's line go */
    if (a.mode == 2) asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(pol));
    else asm volatile("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;" : "=l"(pol));
    uint32_t x = a.mode == 2 ? a.start : 0;
    const uint64_t t0 = kb_now();
    if (a.mode == 1) {
        for (uint32_t i = 1; i <= a.hops; i++) {
            if (lead) {
                ct_st_release(&a.flags[2], i);
                while (kb_ld_acquire(&a.flags[3]) != i) {}
            } else {
                while (kb_ld_acquire(&a.flags[2]) != i) {}
                ct_st_release(&a.flags[3], i);
            }
        }
    } else if (lead) {
        const uint32_t *c = a.mode == 0 ? a.l2 : a.dram;
        for (uint32_t i = 0; i < a.hops; i++) x = ct_ld_chain(c + x, pol);
    }
    const uint64_t t1 = kb_now();
    if (lead) {
        a.acc[3] = t1 - t0;
        if (x == 0xFFFFFFFFu) a.sink[1] = x;
        atomicExch(&a.flags[1], 1u);
    }
}

__device__ static void ct_streamer(const ct_args &a)
{
    const uint32_t lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const uint32_t sb = blockIdx.x - 2;
    if (threadIdx.x == 0) {
        atomicMin(&a.acc[1], (unsigned long long)kb_now());
        atomicAdd(&a.flags[0], 1u);
    }
    if (a.sleep_ns == 0xFFFFFFFFu) return;
    const size_t nw = (size_t)a.n_stream_blocks * (CT_BLOCK / 32);
    const size_t gw = (size_t)sb * (CT_BLOCK / 32) + warp;
    const size_t units = a.n16 / 32; /* 512-byte warp loads */
    uint32_t v = 0;
    unsigned long long n = 0;
    for (size_t it = 0;; it++) {
        uint4 r[4];
#pragma unroll
        for (int u = 0; u < 4; u++) r[u] = ct_ld_stream(a.stream + (((it * nw + gw) * 4 + u) % units) * 32 + lane);
#pragma unroll
        for (int u = 0; u < 4; u++) v ^= r[u].x ^ r[u].y ^ r[u].z ^ r[u].w;
        n += 4 * 512;
        if (a.sleep_ns) __nanosleep(a.sleep_ns);
        if ((it & 7) == 7 && *(volatile uint32_t *)&a.flags[1]) break;
    }
    if (v == 0x9E3779B9u) a.sink[0] = v;
    if (lane == 0) atomicAdd(&a.acc[0], n);
    __syncthreads();
    if (threadIdx.x == 0) atomicMax(&a.acc[2], (unsigned long long)kb_now());
}

__global__ void __launch_bounds__(CT_BLOCK) ct_kernel(ct_args a)
{
    if (blockIdx.x < 2) ct_chain(a);
    else ct_streamer(a);
}

/* Part 2: does a warm read leave the bytes in L2, and how much faster is a read from there? One
 * grid-stride read of n16 16-byte units (nc = ld.global.nc.L1::no_allocate, else ld.global.cg),
 * timed inside the kernel (first block start .. last block end, %globaltimer) */
__global__ void __launch_bounds__(256) ct_read(const uint4 *p, size_t n16, int nc, unsigned long long *t, uint32_t *sink)
{
    __shared__ unsigned long long t0;
    if (threadIdx.x == 0) t0 = kb_now();
    __syncthreads();
    uint32_t v = 0;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n16; i += (size_t)gridDim.x * blockDim.x) {
        uint4 q;
        if (nc) q = ct_ld_stream(p + i);
        else asm volatile("ld.global.cg.v4.u32 {%0, %1, %2, %3}, [%4];" : "=r"(q.x), "=r"(q.y), "=r"(q.z), "=r"(q.w) : "l"(p + i));
        v ^= q.x ^ q.y ^ q.z ^ q.w;
    }
    if (v == 0x9E3779B9u) sink[2] = v;
    __syncthreads();
    if (threadIdx.x == 0) {
        atomicMin(&t[0], t0);
        atomicMax(&t[1], (unsigned long long)kb_now());
    }
}

/* a random cycle over n lines of 32 words, as word indices in word 0 of each line */
static std::vector<uint32_t> ct_cycle(uint32_t n, uint32_t seed)
{
    std::vector<uint32_t> perm(n);
    for (uint32_t i = 0; i < n; i++) perm[i] = i;
    uint64_t s = seed * 0x9E3779B97F4A7C15ull + 1;
    for (uint32_t i = n - 1; i > 0; i--) {
        s ^= s << 13, s ^= s >> 7, s ^= s << 17;
        std::swap(perm[i], perm[(uint32_t)(s % (i + 1))]);
    }
    std::vector<uint32_t> w((size_t)n * 32, 0);
    for (uint32_t i = 0; i < n; i++) w[(size_t)perm[i] * 32] = perm[(i + 1) % n] * 32;
    return w;
}

int main(int argc, char **argv)
{
    const int reps = argc > 1 ? atoi(argv[1]) : 5;
    const cudaDeviceProp prop = kb_device();
    const int n_sm = prop.multiProcessorCount;
    const double read_gbs = kb_read_ceiling(n_sm, kb_fill_q4k);

    const size_t stream_bytes = (size_t)2 << 30, dram_lines = ((size_t)1 << 30) / 128;
    uint4 *stream;
    uint32_t *l2, *dram, *flags, *sink;
    unsigned long long *acc;
    CK(cudaMalloc(&stream, stream_bytes));
    kb_fill_q4k<<<2048, 256>>>((uint8_t *)stream, stream_bytes, 7);
    const std::vector<uint32_t> l2h = ct_cycle(CT_L2_LINES, 1), drh = ct_cycle((uint32_t)dram_lines, 2);
    CK(cudaMalloc(&l2, l2h.size() * 4));
    CK(cudaMalloc(&dram, drh.size() * 4));
    CK(cudaMemcpy(l2, l2h.data(), l2h.size() * 4, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(dram, drh.data(), drh.size() * 4, cudaMemcpyHostToDevice));
    CK(cudaMalloc(&flags, 16));
    CK(cudaMalloc(&acc, 32));
    CK(cudaMalloc(&sink, 8));
    CK(cudaDeviceSynchronize());

    const uint32_t nsb = 2 * (uint32_t)n_sm;
    const char *mode_name[3] = {"l2", "flag", "dram"};
    const uint32_t hops[3] = {4000, 4000, 2000};
    const uint32_t sleeps[] = {0xFFFFFFFFu, 0, 100, 200, 400, 800, 1600, 3200, 6400};
    printf("kbench_contend: %s, %d SMs, streaming read %.0f GB/s, %u streaming blocks of %d, median of %d\n",
           prop.name, n_sm, read_gbs, nsb, CT_BLOCK, reps);
    printf("| chain | sleep ns | stream GB/s | f | ns/hop | k | net |\n|---|---|---|---|---|---|---|\n");
    for (int m = 0; m < 3; m++) {
        double ns0 = 0;
        for (const uint32_t s : sleeps) {
            std::vector<float> gbs, ns;
            for (int r = 0; r < reps; r++) {
                CK(cudaMemset(flags, 0, 16));
                const unsigned long long init[4] = {0, ~0ull, 0, 0};
                CK(cudaMemcpy(acc, init, 32, cudaMemcpyHostToDevice));
                const uint32_t start = (uint32_t)(((uint64_t)(r + 1) * 2654435761u % dram_lines) * 32);
                ct_args a = {stream, stream_bytes / 16, l2, dram, start, (uint32_t)m, hops[m], s, nsb, flags, acc, sink};
                ct_kernel<<<nsb + 2, CT_BLOCK>>>(a);
                CK(cudaGetLastError());
                CK(cudaDeviceSynchronize());
                unsigned long long h[4];
                CK(cudaMemcpy(h, acc, 32, cudaMemcpyDeviceToHost));
                ns.push_back((float)h[3] / hops[m]);
                gbs.push_back(s == 0xFFFFFFFFu || h[2] <= h[1] ? 0.0f : (float)((double)h[0] / (double)(h[2] - h[1])));
            }
            const double g = kb_median(gbs), n = kb_median(ns);
            if (s == 0xFFFFFFFFu) ns0 = n;
            const double f = g / read_gbs, k = n / ns0;
            char sl[16];
            if (s == 0xFFFFFFFFu) snprintf(sl, sizeof sl, "no stream");
            else snprintf(sl, sizeof sl, "%u", s);
            printf("| %s | %s | %.0f | %.2f | %.0f | %.2f | %+.2f |\n", mode_name[m], sl, g, f, n, k, f * k - (k - 1));
        }
    }
    /* part 2: a 16 MB "matrix" read cold (after a 256 MB flush), after a warm read of it (nc or cg
     * loads, as the warm kernels issue them), and hot (read twice) */
    {
        const size_t mb = (size_t)16 << 20, fb = (size_t)256 << 20;
        const uint4 *m = stream, *fl = stream + ((size_t)1 << 30) / 16; /* both inside the 2 GiB buffer */
        auto timed = [&](const uint4 *p, size_t bytes, int nc) {
            const unsigned long long init[2] = {~0ull, 0};
            CK(cudaMemcpy(acc, init, 16, cudaMemcpyHostToDevice));
            ct_read<<<2 * n_sm, 256>>>(p, bytes / 16, nc, acc, sink);
            CK(cudaGetLastError());
            CK(cudaDeviceSynchronize());
            unsigned long long h[2];
            CK(cudaMemcpy(h, acc, 16, cudaMemcpyDeviceToHost));
            return (float)(h[1] - h[0]) / 1e3f;
        };
        /* each case: the warm read before the timed one (none, nc or cg), 48 MB of other nc reads
         * between them or not, and the timed read's loads */
        struct {
            const char *name;
            int warm; /* -1 none, 1 nc, 0 cg */
            bool other;
            int nc;
        } cases[6] = {{"cold, nc read (the engine's loads)", -1, false, 1},
                      {"cold, cg read", -1, false, 0},
                      {"nc read after a warm read by nc loads", 1, false, 1},
                      {"nc read after a warm read by cg loads", 0, false, 1},
                      {"nc read after a warm read by nc loads, then 48 MB of other nc reads", 1, true, 1},
                      {"nc read after a warm read by cg loads, then 48 MB of other nc reads", 0, true, 1}};
        printf("\n16 MB read on %d blocks of 256, us from the first block's start to the last's end (median of %d)\n",
               2 * n_sm, reps);
        printf("| case | us | GB/s |\n|---|---|---|\n");
        for (const auto &c : cases) {
            std::vector<float> t;
            for (int r = 0; r < reps; r++) {
                timed(fl, fb, 1);           /* flush: nc reads */
                timed(fl + fb / 16, fb, 0); /* and cg reads (cg lines outlive nc flushes) */
                if (c.warm >= 0) timed(m, mb, c.warm);
                if (c.other) timed(fl + 2 * fb / 16, (size_t)48 << 20, 1);
                t.push_back(timed(m, mb, c.nc));
            }
            const float us = kb_median(t);
            printf("| %s | %.2f | %.0f |\n", c.name, us, (double)mb / (us * 1e3));
        }
    }
    CK(cudaFree(stream));
    CK(cudaFree(l2));
    CK(cudaFree(dram));
    CK(cudaFree(flags));
    CK(cudaFree(acc));
    CK(cudaFree(sink));
    return 0;
}
