/* kbench.cuh — the scaffolding the CUDA kernel workbenches in bench/kernels/ share (header-only:
 * each workbench is one translation unit, so everything here is static or a template):
 *   CK()                      the CUDA error check (print file:line and the call, exit 1)
 *   kb_hash32, kb_urand       the hash-based device draws; kb_q4k_word / kb_q6k_word one 16-bit
 *                             word of raw GGUF Q4_K / Q6_K blocks (random bits, sane f16 scales);
 *                             kb_fill_q4k / kb_fill_q6k / kb_fill_x the fills built on them
 *   kb_read_bw, kb_read_ceiling   the streaming-read ceiling (4 GiB, median of 10) each run measures
 *   kb_now, kb_ld_acquire      %globaltimer; an acquire load of a flag (device)
 *   kb_event_ms, kb_median, kb_median_ms, kb_median_ms2, kb_time_launches   event timing: one
 *                             call, medians, bursts of 8 launches on rotating copies
 *   kb_device, kb_n_copy      device 0's line; how many rotating copies pass L2
 *   kb_qmat ...               the Q4_K / Q6_K test matrix of mma, mma6 and stream: rotating copies
 *                             in the layouts the workbench repacks into, the sampled rows' raw
 *                             bytes, their f64 reference (kb_reference), the error metrics
 *                             (kb_check) and the one-tile layout diagnosis (kb_diagnose)
 * and the C / C++ headers they all use. What a workbench measures (its kernels, launches, shapes,
 * checks and tables) stays in its own file. */
#ifndef MUSER_KBENCH_CUH
#define MUSER_KBENCH_CUH

#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <algorithm>
#include <vector>

extern "C" {
#include "quant.h"
}

#define CK(x)                                                                                    \
    do {                                                                                         \
        cudaError_t e_ = (x);                                                                    \
        if (e_ != cudaSuccess) {                                                                 \
            fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_));  \
            exit(1);                                                                             \
        }                                                                                        \
    } while (0)

/* ---- data -------------------------------------------------------------------------------------- */
static __device__ inline uint32_t kb_hash32(uint64_t i, uint32_t seed)
{
    uint64_t z = i * 0x9E3779B97F4A7C15ull + seed * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return (uint32_t)(z ^ (z >> 31));
}
static __device__ inline float kb_urand(uint64_t i, uint32_t seed) /* [-1, 1) */
{
    return (float)(kb_hash32(i, seed) >> 8) * (2.0f / 16777216.0f) - 1.0f;
}

/* Word i (bytes 2i, 2i+1) of raw Q4_K blocks (144 B): random qs and scale bytes, sane f16 d
 * (byte 0 of a block) and dmin (byte 2). */
static __device__ inline uint16_t kb_q4k_word(size_t i, uint32_t seed)
{
    uint16_t v = (uint16_t)kb_hash32(i, seed);
    const size_t o = (2 * i) % 144;
    if (o == 0) v = __half_as_ushort(__float2half(0.002f + 0.004f * fabsf(kb_urand(i, seed))));
    if (o == 2) v = __half_as_ushort(__float2half(0.001f + 0.002f * fabsf(kb_urand(i, seed))));
    return v;
}
/* Word i of raw Q6_K blocks (210 B): random ql, qh and scale bytes, a sane f16 d (byte 208). */
static __device__ inline uint16_t kb_q6k_word(size_t i, uint32_t seed)
{
    uint16_t v = (uint16_t)kb_hash32(i, seed);
    if ((2 * i) % 210 == 208) v = __half_as_ushort(__float2half(0.0005f + 0.001f * fabsf(kb_urand(i, seed))));
    return v;
}

/* n bytes of raw Q4_K / Q6_K blocks (grid-stride over the words); x[i] = kb_urand(i, seed) */
static __global__ void kb_fill_q4k(uint8_t *p, size_t n, uint32_t seed)
{
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n / 2; i += (size_t)gridDim.x * blockDim.x)
        ((uint16_t *)p)[i] = kb_q4k_word(i, seed);
}
static __global__ void kb_fill_q6k(uint8_t *p, size_t n, uint32_t seed)
{
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n / 2; i += (size_t)gridDim.x * blockDim.x)
        ((uint16_t *)p)[i] = kb_q6k_word(i, seed);
}
static __global__ void kb_fill_x(float *x, uint32_t n, uint32_t seed)
{
    const uint32_t i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] = kb_urand(i, seed);
}
typedef void (*kb_fill_fn)(uint8_t *p, size_t n, uint32_t seed);

/* ---- device clocks and flags ------------------------------------------------------------------- */
static __device__ __forceinline__ uint64_t kb_now() /* %globaltimer, ns */
{
    uint64_t t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}
static __device__ __forceinline__ uint32_t kb_ld_acquire(const uint32_t *p)
{
    uint32_t v;
    asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
}

/* ---- timing ------------------------------------------------------------------------------------ */
/* ms between events a and b recorded on st around fn() */
template <class F>
static float kb_event_ms(cudaEvent_t a, cudaEvent_t b, F &&fn, cudaStream_t st = 0)
{
    CK(cudaEventRecord(a, st));
    fn();
    CK(cudaEventRecord(b, st));
    CK(cudaEventSynchronize(b));
    float ms;
    CK(cudaEventElapsedTime(&ms, a, b));
    return ms;
}
/* t sorted in place, its element size / 2 */
static inline float kb_median(std::vector<float> &t)
{
    std::sort(t.begin(), t.end());
    return t[t.size() / 2];
}
/* n calls of fn, each between the events; the median of all but the first skip (ms) */
template <class F>
static float kb_median_ms(int n, int skip, cudaEvent_t a, cudaEvent_t b, F &&fn, cudaStream_t st = 0)
{
    std::vector<float> t;
    for (int i = 0; i < n; i++) {
        const float ms = kb_event_ms(a, b, fn, st);
        if (i >= skip) t.push_back(ms);
    }
    return kb_median(t);
}
/* as kb_median_ms for two calls timed alternately (fa, fb, fa, fb, ...): their medians, ms */
template <class FA, class FB>
static void kb_median_ms2(int n, int skip, cudaEvent_t a, cudaEvent_t b, FA &&fa, FB &&fb, float *ma, float *mb)
{
    std::vector<float> ta, tb;
    for (int i = 0; i < n; i++) {
        const float msa = kb_event_ms(a, b, fa);
        if (i >= skip) ta.push_back(msa);
        const float msb = kb_event_ms(a, b, fb);
        if (i >= skip) tb.push_back(msb);
    }
    *ma = kb_median(ta);
    *mb = kb_median(tb);
}

/* Per-launch time of f(copy), ms: 2 warm-up launches, then reps bursts of 8 back-to-back launches
 * on rotating copies ((i·8 + k) % ncopy) between two events, the median burst / 8 — the queue kept
 * full as inside the decode graph (a lone launch bracketed by events adds ~5 us of launch latency,
 * which hides everything at the small shapes). single_ms (not NULL): then reps lone launches (copy
 * (i + 1) % ncopy) between two events, launch and ramp included, the median. */
template <class F>
static float kb_time_launches(F &&f, int ncopy, int reps, float *single_ms = NULL)
{
    cudaEvent_t a, b;
    CK(cudaEventCreate(&a));
    CK(cudaEventCreate(&b));
    const int burst = 8;
    for (int i = 0; i < 2; i++) f(i % ncopy);
    std::vector<float> t, t1;
    for (int i = 0; i < reps; i++) {
        const float ms = kb_event_ms(a, b, [&] {
            for (int k = 0; k < burst; k++) f((i * burst + k) % ncopy);
        });
        t.push_back(ms / burst);
    }
    if (single_ms)
        for (int i = 0; i < reps; i++) t1.push_back(kb_event_ms(a, b, [&] { f((i + 1) % ncopy); }));
    CK(cudaGetLastError());
    CK(cudaEventDestroy(a));
    CK(cudaEventDestroy(b));
    if (single_ms) *single_ms = kb_median(t1);
    return kb_median(t);
}

/* ---- the streaming-read ceiling ---------------------------------------------------------------- */
/* grid-stride 16-byte loads, XOR-sunk */
static __global__ void kb_read_bw(const uint4 *p, size_t n, uint32_t *sink)
{
    uint32_t acc = 0;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        const uint4 v = __ldg(p + i);
        acc ^= v.x ^ v.y ^ v.z ^ v.w;
    }
    if (acc == 0x12345678u) sink[0] = acc;
}
/* GB/s: 4 GiB filled by fill<<<2048, 256>>>(seed 1), read 12 times by read(p, n16) (n16 16-byte
 * words), the median of the last 10; printed as "streaming read: ... (4 GiB, median of 10)" + tail */
template <class Read>
static double kb_read_ceiling(kb_fill_fn fill, Read &&read, const char *tail)
{
    const size_t bw_bytes = (size_t)4 << 30;
    uint4 *big;
    CK(cudaMalloc(&big, bw_bytes));
    fill<<<2048, 256>>>((uint8_t *)big, bw_bytes, 1);
    cudaEvent_t a, b;
    CK(cudaEventCreate(&a));
    CK(cudaEventCreate(&b));
    const float ms = kb_median_ms(12, 2, a, b, [&] { read(big, bw_bytes / 16); });
    const double read_gbs = bw_bytes / (ms * 1e-3) / 1e9;
    printf("streaming read: %.1f GB/s (4 GiB, median of 10)%s\n", read_gbs, tail);
    CK(cudaEventDestroy(a));
    CK(cudaEventDestroy(b));
    CK(cudaFree(big));
    return read_gbs;
}
/* the same read by kb_read_bw on n_sm · 8 blocks of 512 */
static inline double kb_read_ceiling(int n_sm, kb_fill_fn fill)
{
    uint32_t *sink;
    CK(cudaMalloc(&sink, 4));
    const double gbs = kb_read_ceiling(
        fill, [&](const uint4 *p, size_t n16) { kb_read_bw<<<n_sm * 8, 512>>>(p, n16, sink); }, "");
    CK(cudaFree(sink));
    return gbs;
}

/* ---- runs -------------------------------------------------------------------------------------- */
/* device 0, printed as "device: NAME, N SMs, L2 M MB" */
static inline cudaDeviceProp kb_device(void)
{
    cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, 0));
    printf("device: %s, %d SMs, L2 %d MB\n", prop.name, prop.multiProcessorCount, prop.l2CacheSize >> 20);
    return prop;
}
/* rotating copies of a matrix of bytes: enough for 400 MB (past L2), 2 to most */
static inline int kb_n_copy(size_t bytes, size_t most)
{
    return (int)std::min<size_t>(most, std::max<size_t>(2, (size_t)(400u << 20) / bytes + 1));
}

/* ---- the Q4_K / Q6_K test matrix and its reference --------------------------------------------- */
/* The rows a check samples: n spread by a multiplicative hash, then row 0 and the last; their raw
 * bytes (row stride rb, from the device matrix raw) copied to host_raw. */
static inline void kb_sample_rows(const uint8_t *raw, uint32_t rows, size_t rb, uint32_t n, std::vector<uint32_t> &sample,
                                  std::vector<uint8_t> &host_raw)
{
    sample.clear();
    for (uint32_t i = 0; i < n && i < rows; i++) sample.push_back((uint32_t)(((uint64_t)i * 2654435761u) % rows));
    sample.push_back(0);
    sample.push_back(rows - 1);
    host_raw.resize(rb * sample.size());
    for (size_t i = 0; i < sample.size(); i++)
        CK(cudaMemcpy(host_raw.data() + i * rb, raw + (size_t)sample[i] * rb, rb, cudaMemcpyDeviceToHost));
}
/* Σ w·x in f64, in order */
static inline double kb_dot_f64(const float *w, const float *x, uint32_t n)
{
    double s = 0;
    for (uint32_t c = 0; c < n; c++) s += (double)w[c] * x[c];
    return s;
}

struct kb_qmat {
    uint32_t gtype; /* GGML_TYPE_Q4_K or GGML_TYPE_Q6_K */
    uint32_t rows, cols;
    size_t bytes;                  /* one copy */
    std::vector<uint8_t *> v7, mm; /* rotating copies: mvq's layout (v7), the tensor-core units */
    std::vector<uint8_t> host_raw; /* the sampled rows, raw GGUF */
    std::vector<uint32_t> sample;
};
static inline size_t kb_block_bytes(uint32_t gtype) { return gtype == GGML_TYPE_Q6_K ? 210 : 144; }
/* mvq_repack_q4k / mvq_repack_q6k (by blocks); mmq_repack_q4k / mmq6_repack_q6k (by 16-row tiles) */
typedef void (*kb_repack7_fn)(const uint8_t *src, uint8_t *dst, size_t n_blk, size_t first_blk, size_t total_blk);
typedef void (*kb_repackmm_fn)(const uint8_t *src, uint8_t *dst, uint32_t rows, uint32_t nb, size_t first_tile);

/* n_copy copies: copy k raw GGUF drawn with seed + k, repacked by rp7 into v7 (NULL: no v7 copies)
 * and by rpmm into mm; 1024 (+2) rows of copy 0 sampled. */
static inline void kb_make_qmat(kb_qmat &m, uint32_t gtype, uint32_t rows, uint32_t cols, int n_copy, uint32_t seed,
                                kb_repack7_fn rp7, kb_repackmm_fn rpmm)
{
    m.gtype = gtype;
    m.rows = rows;
    m.cols = cols;
    const uint32_t nb = cols / 256;
    const size_t rb = (size_t)nb * kb_block_bytes(gtype), nblk = (size_t)rows * nb;
    m.bytes = rb * rows;
    uint8_t *raw;
    CK(cudaMalloc(&raw, m.bytes));
    for (int k = 0; k < n_copy; k++) {
        if (gtype == GGML_TYPE_Q6_K) kb_fill_q6k<<<2048, 256>>>(raw, m.bytes, seed + k);
        else kb_fill_q4k<<<2048, 256>>>(raw, m.bytes, seed + k);
        CK(cudaGetLastError());
        if (k == 0) kb_sample_rows(raw, rows, rb, 1024, m.sample, m.host_raw);
        uint8_t *d7 = NULL, *dm;
        if (rp7) CK(cudaMalloc(&d7, m.bytes));
        CK(cudaMalloc(&dm, m.bytes));
        if (rp7) rp7<<<(unsigned)((nblk + 255) / 256), 256>>>(raw, d7, nblk, 0, nblk);
        const size_t nt = (size_t)rows / 16 * nb * 8;
        rpmm<<<(unsigned)((nt + 255) / 256), 256>>>(raw, dm, rows, nb, 0);
        CK(cudaGetLastError());
        if (rp7) m.v7.push_back(d7);
        m.mm.push_back(dm);
    }
    CK(cudaDeviceSynchronize());
    CK(cudaFree(raw));
}
static inline void kb_free_qmat(kb_qmat &m)
{
    for (uint8_t *p : m.v7) CK(cudaFree(p));
    for (uint8_t *p : m.mm) CK(cudaFree(p));
    m.v7.clear();
    m.mm.clear();
}

/* f64 references of the sampled rows: quant.c's f32 dequantized weights × x, summed in f64. */
static inline std::vector<double> kb_reference(const kb_qmat &m, const float *hx)
{
    const size_t rb = (size_t)m.cols / 256 * kb_block_bytes(m.gtype);
    std::vector<float> w(m.cols);
    std::vector<double> ref(m.sample.size());
    for (size_t i = 0; i < m.sample.size(); i++) {
        if (quant_dequantize_row(m.gtype, m.host_raw.data() + i * rb, w.data(), m.cols) != 0) {
            fprintf(stderr, "quant_dequantize_row failed\n");
            exit(1);
        }
        ref[i] = kb_dot_f64(w.data(), hx, m.cols);
    }
    return ref;
}

struct kb_errs {
    double max, l2; /* max |y − r| / max |r|, relative L2; both -1 if any output is NaN/Inf or unwritten */
};
/* hy (all m.rows outputs must be finite) against the sampled rows' references r, taken as they
 * are, or as silu(r)·up (ref_up: the gate·up pair), or as cap·tanh(scale·r / cap) (the soft cap). */
static inline kb_errs kb_check(const kb_qmat &m, const std::vector<double> &ref, const std::vector<float> &hy,
                               const std::vector<double> *ref_up, bool cap = false, float scale = 0.f, float capv = 0.f)
{
    for (uint32_t i = 0; i < m.rows; i++)
        if (!isfinite(hy[i])) return {-1, -1};
    double num = 0, den = 0, mx = 0, mr = 0;
    for (size_t i = 0; i < m.sample.size(); i++) {
        double r = ref[i];
        if (ref_up) r = r / (1 + exp(-r)) * (*ref_up)[i];
        if (cap) r = capv * tanh(r * scale / capv);
        const double e = hy[m.sample[i]] - r;
        num += e * e;
        den += r * r;
        mx = fmax(mx, fabs(e));
        mr = fmax(mr, fabs(r));
    }
    return {mx / (mr > 0 ? mr : 1), sqrt(num / (den > 0 ? den : 1))};
}

/* One 16-row tile of one block (m: 16 × 256), x nonzero in one group of width columns at a time
 * (group -1: everywhere): per group a line "  what G:" with, for run[0] and run[1] (name[k]), the
 * error of rows 0-7 | 8-15 against the f64 reference, max |Δ| / max |ref| (max_err) or relative
 * L2. prep() prepares the device x (written here) for the kernels; y takes the 16 outputs.
 * Localizes a layout mistake in one device run. */
template <class Prep>
static void kb_diagnose(const kb_qmat &m, float *x, float *y, int width, const char *what, bool max_err, Prep &&prep,
                        void (*const run[2])(int), const char *const name[2])
{
    std::vector<float> hx(256), hy(16);
    for (int grp = -1; grp < 256 / width; grp++) {
        for (int i = 0; i < 256; i++) {
            const uint32_t h = (uint32_t)(i * 2654435761u + 12345u * (grp + 2));
            hx[i] = (grp < 0 || i / width == grp) ? (float)((int)(h >> 8) % 2001 - 1000) / 1000.f : 0.f;
        }
        CK(cudaMemcpy(x, hx.data(), 256 * 4, cudaMemcpyHostToDevice));
        prep();
        const std::vector<double> ref = kb_reference(m, hx.data());
        printf("  %s %2d:", what, grp);
        for (int k = 0; k < 2; k++) {
            CK(cudaMemset(y, 0xFF, 16 * 4));
            run[k](0);
            CK(cudaDeviceSynchronize());
            CK(cudaMemcpy(hy.data(), y, 16 * 4, cudaMemcpyDeviceToHost));
            double n[2] = {0, 0}, d[2] = {0, 0};
            for (size_t i = 0; i < m.sample.size(); i++) {
                const int hf = m.sample[i] >= 8;
                const double e = hy[m.sample[i]] - ref[i];
                if (max_err) {
                    n[hf] = fmax(n[hf], fabs(e));
                    d[hf] = fmax(d[hf], fabs(ref[i]));
                } else {
                    n[hf] += e * e;
                    d[hf] += ref[i] * ref[i];
                }
            }
            if (max_err) printf("  %s %.1e | %.1e", name[k], n[0] / (d[0] + 1e-300), n[1] / (d[1] + 1e-300));
            else printf("  %s %.1e | %.1e", name[k], sqrt(n[0] / (d[0] + 1e-300)), sqrt(n[1] / (d[1] + 1e-300)));
        }
        printf("\n");
    }
}

#endif
