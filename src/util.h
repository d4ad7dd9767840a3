/* util.h — small shared helpers: f16/bf16 conversion, timing, progress bars, aligned allocation,
 * SHA-256 of a buffer (OpenSSL). Nothing here knows about models. */
#ifndef MUSER_UTIL_H
#define MUSER_UTIL_H

#include "muser.h"

#include <stdio.h>

/* IEEE half and bfloat16 conversions, round-to-nearest-even, NaN/Inf preserved. */
uint16_t muser_f32_to_f16(float f);
float muser_f16_to_f32(uint16_t h);
uint16_t muser_f32_to_bf16(float f);
float muser_bf16_to_f32(uint16_t h);

double muser_now_s(void); /* monotonic seconds */

/* The index of the largest of x[0..n) (n >= 1, no NaN), the lowest such index on ties (-0 and +0
 * tie): greedy decoding's token, the same rule as the GPU's argmax kernel. */
int32_t muser_argmax(const float *x, uint32_t n);
/* Whether the row passes (muser_argmax, the sampler's scans) take their AVX2 form: the CPU has
 * AVX2 and MUSER_SIMD is not "0" (which the tests set to check the plain loops give the same). */
bool muser_rows_avx2(void);

/* 64-byte aligned, zero-filled allocation; free with muser_free_aligned. NULL on failure. */
void *muser_alloc_aligned(size_t bytes);
void muser_free_aligned(void *p);

/* Progress bar on stderr (only when stderr is a terminal, or MUSER_PROGRESS=1):
 * "label [=====>    ]  42% 1.2/2.9 GB". Call update with done <= total; finish prints newline. */
typedef struct muser_progress {
    const char *label;
    uint64_t total;
    double t0, last;
    bool enabled;
    int last_pct;
} muser_progress;
void muser_progress_begin(muser_progress *p, const char *label, uint64_t total);
void muser_progress_update(muser_progress *p, uint64_t done);
void muser_progress_finish(muser_progress *p);

/* SHA-256 of bytes as 64 lowercase hex chars + NUL. */
void muser_sha256_hex(const void *data, size_t n, char out[65]);

/* Parse helpers for the CLI: strict, whole-string. Return false on garbage or overflow. */
bool muser_parse_u64(const char *s, uint64_t *out);
bool muser_parse_i64(const char *s, int64_t *out);
bool muser_parse_f64(const char *s, double *out);

#endif
