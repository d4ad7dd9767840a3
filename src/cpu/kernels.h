/* kernels.h — the CPU engine's hot loops: quantized row dots (decode), weight-panel unpacking and
 * the f32 GEMM micro-kernel (batch), f16 K/V dots, vector exp. Each has an AVX2/FMA/F16C version
 * (compiled with target attributes, picked at run time) and a plain scalar one.
 *
 * Decode kernels never dequantize a row to memory: they run straight over the packed blocks and
 * take per-16 / per-32 sums of x, computed once per input vector (cpu_xsums), so the constant
 * parts of a block (the Q4_K `dmin*m` term, the Q6_K `-32`) cost a scalar FMA per sub-block, not
 * a vector op per weight. Activations stay f32 everywhere; nothing is quantized on the way in.
 *
 * Batch kernels unpack a panel of CPU_PANEL weight rows to f32 ONCE, transposed to [K][CPU_PANEL]
 * so the micro-kernel can broadcast one activation and FMA it against 16 output rows at a time,
 * then reuse that panel for every activation row of the chunk. K-quant panels are unpacked one
 * 256-element block column at a time through a small buffer that stays in L1 (16 rows x 1 KB),
 * not whole rows: 16 whole rows K floats apart map to the same L1 sets, and the transpose of
 * such a buffer cost twice the dequantization itself. */
#ifndef MUSER_CPU_KERNELS_H
#define MUSER_CPU_KERNELS_H

#include "model.h"

#define CPU_PANEL 16 /* weight rows per GEMM panel (two AVX2 vectors of outputs) */
#define CPU_MR 6     /* activation rows per micro-kernel call */

/* What the decode dots need of an input vector x, computed once per vector and shared by every
 * row of every matrix that reads it:
 *   s16, s32: sums of x over every 16 / 32 consecutive elements, [K/16] and [K/32];
 *   xp:       x in the lanes' order, [K]: xp[32c + 8t + i] = x[32c + 4i + t] * 2^-8t.
 * xp lets the AVX2 Q4_K / Q6_K dots take quants from a plain 32-byte load: dword lane i holds
 * bytes 4i..4i+3, and masking byte t in place yields q * 2^8t, an exact integer, whose 2^8t
 * the 2^-8t cancels exactly in the product (power-of-two scalings are exact in binary floating
 * point, barring underflow below 2^-102, far under anything that reaches a logit). */
typedef struct cpu_xsums {
    float *s16;
    float *s32;
    float *xp;
    uint8_t *xd; /* the VNNI level's integer digits of x and their scales: CPU_XD_BYTES(K) bytes */
} cpu_xsums;

/* bytes of cpu_xsums.xd per 256 elements of x (4 vectors x 3 digit planes x 64 in the dots'
 * group-lane order, 16 scales: kernels.c), and for an input of n elements */
#define CPU_XD_BLOCK 832u
#define CPU_XD_BYTES(n) (((uint64_t)(n) / 256u + 1u) * CPU_XD_BLOCK)

typedef struct cpu_kernels {
    bool simd;         /* AVX2+FMA+F16C */
    const char *level; /* "scalar", "avx2", "avx512" (the AVX2 table with AVX-512's GEMM and K-quant dots),
                        * "avx512vnni" (avx512 with the Q4_K / Q6_K decode dots on integer digits of x), or
                        * "avxvnni" (the AVX2 table with those digit dots at 256 bits: avx512vnni's bits) */
    /* sums and lane order of x (n a multiple of 32, or else only whole groups are filled) */
    void (*xsums)(const float *x, uint64_t n, cpu_xsums *out);
    /* Dot of one weight row (type, n elements) with f32 x; xs are x's sums (Q4_K / Q6_K use
     * them). The scalar table's is quant_dot itself; the AVX2 one sends a type it has no kernel
     * for to quant_dot (NaN: muser computes with no other). */
    float (*dot_row)(uint32_t type, const void *row, const float *x, const cpu_xsums *xs,
                     uint64_t n);
    /* The small-batch route's matvec: out[i·ldo] = dot_row(type, row, x + i·ldx, xs + i, n) for
     * i < m, bit for bit, whatever m (the K-quants unpack each weight block once for up to 4
     * inputs). */
    void (*dot_rows)(uint32_t type, const void *row, const float *x, uint64_t ldx, const cpu_xsums *xs,
                     uint32_t m, uint64_t n, float *out, uint64_t ldo);
    /* dot_rows over nr consecutive weight rows (row_bytes apart): out[i·ldo + r] for input i and
     * row r, each dot_rows's bits; the rows taken in tiles, K-chunk by K-chunk, so several inputs'
     * x stays in L1 (NULL where the level has none: dot_rows row by row) */
    void (*dot_tile)(uint32_t type, const uint8_t *rows, uint64_t row_bytes, uint32_t nr, const float *x, uint64_t ldx,
                     const cpu_xsums *xs, uint32_t m, uint64_t n, float *out, uint64_t ldo);
    /* Dequantize one row to f32 (n elements). Returns 0 or a muser_status. */
    int (*dequant_row)(uint32_t type, const void *row, float *dst, uint64_t n);
    /* Weight rows row0, row0 + row_bytes, ... (nc <= CPU_PANEL of them, K elements each) ->
     * panel [K][CPU_PANEL] f32, columns nc.. zero. tmp is scratch of CPU_PANEL * K floats.
     * Values equal dequant_row's. Returns 0 or a muser_status. */
    int (*unpack_panel)(uint32_t type, const uint8_t *row0, uint64_t row_bytes, uint32_t nc,
                        uint64_t K, float *tmp, float *panel);
    /* m activation rows X (row stride ldx, K elements) -> Xp [m * K], packed in the row groups
     * gemm_panel takes them in: a group of r rows starting at row i is stored at Xp + i*K as
     * [K][r], so the micro-kernel reads one contiguous stream instead of r rows K floats apart.
     * One row packs to itself. Done once per matrix group and shared by every panel. */
    void (*pack_x)(const float *X, uint64_t ldx, uint64_t m, uint64_t K, float *Xp);
    /* C[i*ldc + 0..nc) = sum_k X[i][k] * panel[k][0..nc), i < m (any m), from Xp = pack_x of the
     * m rows. nc <= CPU_PANEL. */
    void (*gemm_panel)(const float *Xp, uint64_t m, const float *panel, uint64_t K, float *C,
                       uint64_t ldc, uint32_t nc);
    /* dot of f32 q with n f16 values */
    float (*dot_f16)(const float *q, const uint16_t *k, uint32_t n);
    /* o[0..n) += p * f16 v */
    void (*axpy_f16)(float *o, float p, const uint16_t *v, uint32_t n);
    /* f16 -> f32 / f32 -> f16 (round to nearest even) of n values */
    void (*f16_to_f32)(const uint16_t *src, float *dst, uint32_t n);
    void (*f32_to_f16)(const float *src, uint16_t *dst, uint32_t n);
    /* x[i] = exp(x[i]) in place; returns the sum */
    float (*exp_sum)(float *x, uint64_t n);
    /* g[i] = silu(g[i]) * u[i] */
    void (*swiglu)(float *g, const float *u, uint64_t n);
    /* o[i] *= sigmoid(g[i]) */
    void (*sigmoid_gate)(float *o, const float *g, uint64_t n);
    /* y[i] = cap*tanh(y[i]*scale/cap) (cap > 0) or y[i]*scale; returns false on non-finite */
    bool (*logit_finish)(float *y, uint64_t n, float scale, float cap);
} cpu_kernels;

/* The kernel table: AVX2 when the CPU has AVX2+FMA+F16C and MUSER_SIMD is not "0", unless
 * force_scalar; with AVX-512F+DQ also its GEMM micro-kernel and Q4_K / Q6_K decode dots (the same
 * bits at twice the width; their xsums keep xp in a 512-bit order) unless MUSER_SIMD is "avx2";
 * with AVX-512 VNNI also the Q4_K and Q6_K decode dots on integer digits of x unless MUSER_SIMD is
 * "avx512". With AVX-VNNI and no AVX-512F+DQ (or MUSER_SIMD "avxvnni") the AVX2 table with those
 * digit dots at 256 bits. */
void cpu_kernels_init(cpu_kernels *k, bool force_scalar);

/* dst = x / sqrt(mean(x^2) + eps) * w (w NULL: weightless), the sum of squares in f64: the CPU
 * engine's one rmsnorm row (the model's passes and the DFlash drafter's). dst may alias x. */
void cpu_rms_row(const float *x, const float *w, float eps, float *dst, uint64_t n);

#endif
