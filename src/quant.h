/* quant.h — the block formats muser reads and writes: F32, F16, BF16, Q8_0, Q4_K, Q6_K, in the
 * public ggml bit layouts.
 *
 *   Q8_0: 34-byte blocks of 32: f16 d, 32 x int8.                       w = d*q
 *   Q4_K: 144-byte blocks of 256: f16 d, f16 dmin, 12 bytes of 6-bit packed (scale, min) for 8
 *         sub-blocks of 32, 128 bytes of 4-bit quants.                  w = d*sc*q - dmin*m
 *   Q6_K: 210-byte blocks of 256: 128 bytes low 4 bits, 64 bytes high 2 bits, 16 int8 scales
 *         (one per 16), f16 d.                                          w = d*sc*(q-32)
 *
 * Every format has: dequantize a row, quantize a row (searching scales to minimise squared
 * error), and a dot product of a row with an f32 vector. Dots have a scalar reference and an
 * AVX2/FMA path chosen at run time (quant_simd_enable). */
#ifndef MUSER_QUANT_H
#define MUSER_QUANT_H

#include "muser.h"

/* ggml type ids (as stored in GGUF tensor infos). */
enum ggml_type {
    GGML_TYPE_F32 = 0,
    GGML_TYPE_F16 = 1,
    GGML_TYPE_Q4_0 = 2,
    GGML_TYPE_Q4_1 = 3,
    GGML_TYPE_Q5_0 = 6,
    GGML_TYPE_Q5_1 = 7,
    GGML_TYPE_Q8_0 = 8,
    GGML_TYPE_Q8_1 = 9,
    GGML_TYPE_Q2_K = 10,
    GGML_TYPE_Q3_K = 11,
    GGML_TYPE_Q4_K = 12,
    GGML_TYPE_Q5_K = 13,
    GGML_TYPE_Q6_K = 14,
    GGML_TYPE_Q8_K = 15,
    GGML_TYPE_BF16 = 30,
    GGML_TYPE_COUNT = 40,
};

#define QK_K 256
#define QK8_0 32
#define Q4_K_BLOCK_BYTES 144
#define Q6_K_BLOCK_BYTES 210
#define Q8_0_BLOCK_BYTES 34

typedef struct quant_type_info {
    const char *name;       /* "q4_k", "f32", ... */
    uint32_t block_elems;   /* 1 for F32/F16/BF16 */
    uint32_t block_bytes;
    bool supported;         /* muser can compute with it */
} quant_type_info;

/* NULL for an unknown type id; known-but-unsupported types have supported == false (their
 * sizes are still right, so inspect can describe any GGUF). */
const quant_type_info *quant_info(uint32_t type);
/* Parse "q4_k", "Q4_K", "f16", ... ; returns -1 if unknown. */
int quant_type_from_name(const char *name);
/* Bytes for n elements; 0 if n is not a multiple of the block or the type is unknown. */
uint64_t quant_row_bytes(uint32_t type, uint64_t n);

/* n must be a multiple of the type's block. Return MUSER_E_ARG / MUSER_E_UNSUPPORTED otherwise. */
int quant_dequantize_row(uint32_t type, const void *src, float *dst, uint64_t n);
int quant_quantize_row(uint32_t type, const float *src, void *dst, uint64_t n);

/* Dot of a quantized row with f32 x (n elements). Uses AVX2/FMA when enabled and available. */
float quant_dot(uint32_t type, const void *row, const float *x, uint64_t n);
/* The plain scalar path (the reference for the SIMD one). */
float quant_dot_scalar(uint32_t type, const void *row, const float *x, uint64_t n);
/* f64 dequantize-then-dot: the test oracle. */
double quant_dot_f64(uint32_t type, const void *row, const float *x, uint64_t n);

/* f32 dot product, AVX2 when enabled. */
float quant_dot_f32(const float *a, const float *b, uint64_t n);

/* Run-time SIMD selection: on by default when the CPU has AVX2+FMA; MUSER_SIMD=0 disables. */
bool quant_simd_available(void);
void quant_simd_enable(bool on);
const char *quant_simd_name(void); /* "avx2" or "scalar" */

#endif
