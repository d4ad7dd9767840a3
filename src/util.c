/* util.c — errors, f16/bf16 conversion, timing, aligned allocation, progress bars, SHA-256,
 * strict number parsing. */
#include "util.h"

#include <errno.h>
#include <math.h>
#include <openssl/evp.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

int muser_errorf(muser_error *err, muser_status code, const char *fmt, ...)
{
    if (err) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err->msg, sizeof err->msg, fmt, ap);
        va_end(ap);
        err->code = code;
    }
    return code;
}

const char *muser_status_name(muser_status code)
{
    switch (code) {
    case MUSER_OK: return "ok";
    case MUSER_E_IO: return "io error";
    case MUSER_E_FORMAT: return "format error";
    case MUSER_E_UNSUPPORTED: return "unsupported";
    case MUSER_E_SHAPE: return "shape error";
    case MUSER_E_NOMEM: return "out of memory";
    case MUSER_E_ARG: return "bad argument";
    case MUSER_E_CACHE_DISCONTINUITY: return "CacheDiscontinuity";
    case MUSER_E_CONTEXT_FULL: return "context full";
    case MUSER_E_NUMERIC: return "non-finite logits";
    case MUSER_E_BACKEND: return "backend error";
    case MUSER_E_TOKENIZE: return "tokenizer error";
    case MUSER_E_INTERRUPTED: return "interrupted";
    case MUSER_E_CANCELLED: return "cancelled";
    case MUSER_E_NO_ROOM: return "no room";
    }
    return "unknown error";
}

/* ---- half precision ---- */
static inline uint32_t f32_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}
static inline float bits_f32(uint32_t u)
{
    float f;
    memcpy(&f, &u, 4);
    return f;
}

uint16_t muser_f32_to_f16(float f)
{
    uint32_t x = f32_bits(f);
    uint32_t sign = (x >> 16) & 0x8000u;
    uint32_t ax = x & 0x7fffffffu;
    if (ax >= 0x7f800000u) /* Inf or NaN (keep a quiet NaN) */
        return (uint16_t)(sign | 0x7c00u | (ax > 0x7f800000u ? 0x200u | ((ax >> 13) & 0x3ffu) : 0));
    if (ax >= 0x477ff000u) /* rounds to >= 65520: overflow to Inf */
        return (uint16_t)(sign | 0x7c00u);
    if (ax < 0x38800000u) { /* below the smallest normal half: subnormal or zero */
        /* value = ax as float; half subnormal unit is 2^-24 */
        float a = bits_f32(ax);
        float scaled = a * 16777216.0f; /* exact: multiply by 2^24 */
        /* round half to even on an integer in [0, 1024] */
        float r = nearbyintf(scaled);
        return (uint16_t)(sign | (uint32_t)r);
    }
    uint32_t mant = ax & 0x7fffffu;
    uint32_t exp = (ax >> 23) - 127 + 15;
    uint32_t h = (exp << 10) | (mant >> 13);
    uint32_t rem = mant & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (h & 1u)))
        h++; /* carry into the exponent is correct */
    return (uint16_t)(sign | h);
}

float muser_f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu;
    uint32_t mant = h & 0x3ffu;
    if (exp == 0) {
        float v = (float)mant * (1.0f / 16777216.0f);
        return sign ? -v : v;
    }
    if (exp == 31)
        return bits_f32(sign | 0x7f800000u | (mant << 13));
    return bits_f32(sign | ((exp - 15 + 127) << 23) | (mant << 13));
}

uint16_t muser_f32_to_bf16(float f)
{
    uint32_t x = f32_bits(f);
    if ((x & 0x7fffffffu) > 0x7f800000u)
        return (uint16_t)((x >> 16) | 0x40u); /* quiet NaN */
    x += 0x7fffu + ((x >> 16) & 1u);
    return (uint16_t)(x >> 16);
}

float muser_bf16_to_f32(uint16_t h) { return bits_f32((uint32_t)h << 16); }

double muser_now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Two passes: the maximum, then its first index. With AVX2 eight lanes at a time (the maximum of
 * NaN-free values is the same in any grouping, and the first index is found by compares in order),
 * else plain loops. */
#if defined(__x86_64__)
#include <immintrin.h>
__attribute__((target("avx2"))) static int32_t argmax_avx2(const float *x, uint32_t n)
{
    __m256 m0 = _mm256_set1_ps(x[0]), m1 = m0;
    uint32_t i = 0;
    for (; i + 16 <= n; i += 16) {
        m0 = _mm256_max_ps(m0, _mm256_loadu_ps(x + i));
        m1 = _mm256_max_ps(m1, _mm256_loadu_ps(x + i + 8));
    }
    float lanes[8];
    _mm256_storeu_ps(lanes, _mm256_max_ps(m0, m1));
    float m = lanes[0];
    for (int k = 1; k < 8; k++) m = lanes[k] > m ? lanes[k] : m;
    for (; i < n; i++) m = x[i] > m ? x[i] : m;
    const __m256 vm = _mm256_set1_ps(m);
    for (i = 0; i + 8 <= n; i += 8) {
        const int hit = _mm256_movemask_ps(_mm256_cmp_ps(_mm256_loadu_ps(x + i), vm, _CMP_EQ_OQ));
        if (hit) return (int32_t)(i + (uint32_t)__builtin_ctz((unsigned)hit));
    }
    while (x[i] != m) i++;
    return (int32_t)i;
}
#endif

bool muser_rows_avx2(void)
{
#if defined(__x86_64__)
    const char *env = getenv("MUSER_SIMD");
    return __builtin_cpu_supports("avx2") && !(env && !strcmp(env, "0"));
#else
    return false;
#endif
}

int32_t muser_argmax(const float *restrict x, uint32_t n)
{
#if defined(__x86_64__)
    if (muser_rows_avx2()) return argmax_avx2(x, n);
#endif
    float m = x[0];
    for (uint32_t i = 1; i < n; i++) m = x[i] > m ? x[i] : m;
    uint32_t at = 0;
    while (x[at] != m) at++;
    return (int32_t)at;
}

void *muser_alloc_aligned(size_t bytes)
{
    void *p = NULL;
    if (bytes == 0)
        bytes = 64;
    size_t rounded = (bytes + 63) & ~(size_t)63;
    if (rounded < bytes || posix_memalign(&p, 64, rounded) != 0)
        return NULL;
    memset(p, 0, rounded);
    return p;
}

void muser_free_aligned(void *p) { free(p); }

/* ---- progress ---- */
void muser_progress_begin(muser_progress *p, const char *label, uint64_t total)
{
    const char *env = getenv("MUSER_PROGRESS");
    p->label = label;
    p->total = total ? total : 1;
    p->t0 = p->last = muser_now_s();
    p->enabled = env ? env[0] == '1' : isatty(2);
    p->last_pct = -1;
}

static void fmt_bytes(char *buf, size_t n, double v)
{
    if (v >= 1e9)
        snprintf(buf, n, "%.2f GB", v / 1e9);
    else if (v >= 1e6)
        snprintf(buf, n, "%.1f MB", v / 1e6);
    else
        snprintf(buf, n, "%.0f kB", v / 1e3);
}

void muser_progress_update(muser_progress *p, uint64_t done)
{
    if (!p->enabled)
        return;
    double now = muser_now_s();
    int pct = (int)(100.0 * (double)done / (double)p->total);
    if (pct > 100)
        pct = 100;
    if (pct == p->last_pct && now - p->last < 0.5)
        return;
    p->last_pct = pct;
    p->last = now;
    char bar[31];
    int fill = pct * 30 / 100;
    for (int i = 0; i < 30; i++)
        bar[i] = i < fill ? '=' : (i == fill ? '>' : ' ');
    bar[30] = 0;
    char a[32], b[32];
    fmt_bytes(a, sizeof a, (double)done);
    fmt_bytes(b, sizeof b, (double)p->total);
    fprintf(stderr, "\r%s [%s] %3d%% %s/%s %.1fs", p->label, bar, pct, a, b, now - p->t0);
    fflush(stderr);
}

void muser_progress_finish(muser_progress *p)
{
    if (!p->enabled)
        return;
    p->last_pct = -1;
    muser_progress_update(p, p->total);
    fputc('\n', stderr);
}

void muser_sha256_hex(const void *data, size_t n, char out[65])
{
    unsigned char md[32];
    unsigned int len = 0;
    EVP_Digest(data, n, md, &len, EVP_sha256(), NULL);
    for (int i = 0; i < 32; i++)
        snprintf(out + 2 * i, 3, "%02x", md[i]);
    out[64] = 0;
}

bool muser_parse_u64(const char *s, uint64_t *out)
{
    if (!s || *s < '0' || *s > '9') /* strtoull would accept " -1" as 2^64-1 */
        return false;
    errno = 0;
    char *end;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno || *end)
        return false;
    *out = v;
    return true;
}

bool muser_parse_i64(const char *s, int64_t *out)
{
    if (!s || !*s)
        return false;
    errno = 0;
    char *end;
    long long v = strtoll(s, &end, 10);
    if (errno || *end)
        return false;
    *out = v;
    return true;
}

bool muser_parse_f64(const char *s, double *out)
{
    if (!s || !*s)
        return false;
    errno = 0;
    char *end;
    double v = strtod(s, &end);
    if (errno || *end || !isfinite(v))
        return false;
    *out = v;
    return true;
}
