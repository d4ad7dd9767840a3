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
 * error), and a dot product of a row with an f32 vector. The dots here are the references:
 * quant_dot is plain scalar f32 (the CPU engine's scalar kernel table runs it), quant_dot_f64 the
 * test oracle. The engine's fast dots are its kernels (src/cpu/kernels.h). */
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
    GGML_TYPE_IQ2_XXS = 16,
    GGML_TYPE_IQ2_XS = 17,
    GGML_TYPE_IQ3_XXS = 18,
    GGML_TYPE_IQ1_S = 19,
    GGML_TYPE_IQ4_NL = 20,
    GGML_TYPE_IQ3_S = 21,
    GGML_TYPE_IQ2_S = 22,
    GGML_TYPE_IQ4_XS = 23,
    GGML_TYPE_I8 = 24,
    GGML_TYPE_I16 = 25,
    GGML_TYPE_I32 = 26,
    GGML_TYPE_I64 = 27,
    GGML_TYPE_F64 = 28,
    GGML_TYPE_IQ1_M = 29,
    GGML_TYPE_BF16 = 30,
    GGML_TYPE_TQ1_0 = 34,
    GGML_TYPE_TQ2_0 = 35,
    GGML_TYPE_MXFP4 = 39,
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

/* Dot of a quantized row with f32 x (n elements), accumulated in f32 in plain scalar code.
 * Both dots return NaN for an unsupported type or an n that is not a multiple of the block. */
float quant_dot(uint32_t type, const void *row, const float *x, uint64_t n);
/* f64 dequantize-then-dot: the test oracle. */
double quant_dot_f64(uint32_t type, const void *row, const float *x, uint64_t n);

/* ---- the release mix (docs/quant.md) ----
 * Type for a tensor under the release mix: Q6_K for output.weight, and for blk.N.ffn_down.weight
 * and blk.N.attn_v.weight when layer N is one of the "more bits" layers
 *     N < n/8  ||  N >= 7n/8  ||  (N - n/8) % 3 == 2        (n = n_layer, integer division)
 * default_type (normally Q4_K) for every other 2-D weight. Callers still apply
 * quant_fallback_type for rows that do not fit the block. */
uint32_t quant_mix_type(const char *tensor_name, uint32_t n_layer, uint32_t default_type);
/* type itself when ne0 is a multiple of its block; else Q8_0 when ne0 % 32 == 0; else F16. */
uint32_t quant_fallback_type(uint32_t type, uint64_t ne0);

#endif
