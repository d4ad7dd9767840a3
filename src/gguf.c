/* gguf.c — the GGUF v2/v3 reader (mmap, zero-copy, every field validated before use) and the
 * streaming writer.
 *
 * File shape (all little-endian):
 *   "GGUF" u32 version  u64 n_tensors  u64 n_kv
 *   n_kv x   { str key, u32 value_type, value }         str = u64 len + bytes (no NUL)
 *   n_tensors x { str name, u32 n_dims, n_dims x u64 ne, u32 ggml_type, u64 offset }
 *   zero padding to general.alignment (default 32)
 *   data section: tensor i's bytes at data_offset + offset_i
 *
 * The reader trusts nothing: a cursor refuses to step past the end, every count is checked
 * against the bytes left before anything is sized from it, and every size computation is
 * overflow-checked. Errors read "<file>: byte <offset>: <what was wrong>". */
#include "gguf.h"

#include "util.h"

#include <errno.h>
#include <fcntl.h>
#include <float.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#define GGUF_MAGIC "GGUF"
#define GGUF_MAX_NAME 127         /* tensor names: name_z has 128 bytes */
#define GGUF_MAX_KEY 65535        /* no real key comes close; keeps messages printable */
#define GGUF_MAX_ARRAY_DEPTH 8    /* arrays of arrays of ... */
#define GGUF_MIN_KV_BYTES 14      /* key len 8 + 1 key byte + type 4 + smallest value 1 */
#define GGUF_MIN_TENSOR_BYTES 33  /* name len 8 + 1 + n_dims 4 + one ne 8 + type 4 + offset 8 */

/* ---- ggml block sizes (a private copy: muser_gguf does not link muser_quant) ---- */

typedef struct ggml_block {
    uint32_t elems; /* 0: unknown / removed id */
    uint32_t bytes;
} ggml_block;

static const ggml_block ggml_blocks[] = {
    [0] = {1, 4},      /* F32 */
    [1] = {1, 2},      /* F16 */
    [2] = {32, 18},    /* Q4_0 */
    [3] = {32, 20},    /* Q4_1 */
    [6] = {32, 22},    /* Q5_0 */
    [7] = {32, 24},    /* Q5_1 */
    [8] = {32, 34},    /* Q8_0 */
    [9] = {32, 36},    /* Q8_1 */
    [10] = {256, 84},  /* Q2_K */
    [11] = {256, 110}, /* Q3_K */
    [12] = {256, 144}, /* Q4_K */
    [13] = {256, 176}, /* Q5_K */
    [14] = {256, 210}, /* Q6_K */
    [15] = {256, 292}, /* Q8_K */
    [16] = {256, 66},  /* IQ2_XXS */
    [17] = {256, 74},  /* IQ2_XS */
    [18] = {256, 98},  /* IQ3_XXS */
    [19] = {256, 50},  /* IQ1_S */
    [20] = {32, 18},   /* IQ4_NL */
    [21] = {256, 110}, /* IQ3_S */
    [22] = {256, 82},  /* IQ2_S */
    [23] = {256, 136}, /* IQ4_XS */
    [24] = {1, 1},     /* I8 */
    [25] = {1, 2},     /* I16 */
    [26] = {1, 4},     /* I32 */
    [27] = {1, 8},     /* I64 */
    [28] = {1, 8},     /* F64 */
    [29] = {256, 56},  /* IQ1_M */
    [30] = {1, 2},     /* BF16 */
    [34] = {256, 54},  /* TQ1_0 */
    [35] = {256, 66},  /* TQ2_0 */
    [39] = {32, 17},   /* MXFP4 */
};

static const ggml_block *ggml_block_of(uint32_t type)
{
    if (type >= sizeof ggml_blocks / sizeof ggml_blocks[0] || ggml_blocks[type].elems == 0)
        return NULL;
    return &ggml_blocks[type];
}

/* Bytes of a tensor of the given type and dims; false if ne0 is not a whole number of blocks,
 * a dim is 0, or the size overflows (element count must also fit ggml's int64). */
static bool ggml_tensor_bytes(uint32_t type, uint32_t n_dims, const uint64_t *ne, uint64_t *out)
{
    const ggml_block *b = ggml_block_of(type);
    if (!b || n_dims == 0 || n_dims > GGUF_MAX_DIMS || ne[0] % b->elems)
        return false;
    uint64_t nel = 1, bytes;
    if (__builtin_mul_overflow(ne[0] / b->elems, (uint64_t)b->bytes, &bytes))
        return false;
    for (uint32_t d = 0; d < n_dims; d++) {
        if (ne[d] == 0 || ne[d] > INT64_MAX || __builtin_mul_overflow(nel, ne[d], &nel))
            return false;
        if (d > 0 && __builtin_mul_overflow(bytes, ne[d], &bytes))
            return false;
    }
    if (nel > INT64_MAX)
        return false;
    *out = bytes;
    return true;
}

/* ---- value types ---- */

static const char *const value_type_names[GGUF_TYPE_COUNT] = {
    "uint8", "int8", "uint16", "int16", "uint32", "int32", "float32",
    "bool", "string", "array", "uint64", "int64", "float64",
};

const char *gguf_type_name(uint32_t value_type)
{
    return value_type < GGUF_TYPE_COUNT ? value_type_names[value_type] : "unknown";
}

/* Bytes of a fixed-size value; 0 for STRING, ARRAY and unknown types. */
static uint64_t value_type_size(uint32_t t)
{
    switch (t) {
    case GGUF_TYPE_UINT8: case GGUF_TYPE_INT8: case GGUF_TYPE_BOOL: return 1;
    case GGUF_TYPE_UINT16: case GGUF_TYPE_INT16: return 2;
    case GGUF_TYPE_UINT32: case GGUF_TYPE_INT32: case GGUF_TYPE_FLOAT32: return 4;
    case GGUF_TYPE_UINT64: case GGUF_TYPE_INT64: case GGUF_TYPE_FLOAT64: return 8;
    default: return 0;
    }
}

static bool value_type_is_signed(uint32_t t)
{
    return t == GGUF_TYPE_INT8 || t == GGUF_TYPE_INT16 || t == GGUF_TYPE_INT32 ||
           t == GGUF_TYPE_INT64;
}

static bool value_type_is_int(uint32_t t)
{
    return value_type_is_signed(t) || t == GGUF_TYPE_UINT8 || t == GGUF_TYPE_UINT16 ||
           t == GGUF_TYPE_UINT32 || t == GGUF_TYPE_UINT64;
}

static uint64_t le_u64(const uint8_t *p, unsigned n)
{
    uint64_t v = 0;
    for (unsigned i = 0; i < n; i++)
        v |= (uint64_t)p[i] << (8 * i);
    return v;
}

/* ---- strings ---- */

bool gguf_str_eq(gguf_str s, const char *c)
{
    size_t n = strlen(c);
    return s.len == n && (n == 0 || memcmp(s.ptr, c, n) == 0);
}

static int str_cmp(gguf_str a, gguf_str b)
{
    uint64_t n = a.len < b.len ? a.len : b.len;
    int c = n ? memcmp(a.ptr, b.ptr, n) : 0;
    if (c)
        return c;
    return a.len < b.len ? -1 : a.len > b.len;
}

/* A printable, bounded rendering of an untrusted name for error messages. */
static const char *str_show(gguf_str s, char buf[72])
{
    size_t o = 0;
    for (uint64_t i = 0; i < s.len && o < 60; i++) {
        unsigned char ch = (unsigned char)s.ptr[i];
        buf[o++] = (ch >= 0x20 && ch < 0x7f) ? (char)ch : '?';
    }
    if (s.len > 60) {
        memcpy(buf + o, "...", 3);
        o += 3;
    }
    buf[o] = 0;
    return buf;
}

/* ---- the reader's cursor ---- */

typedef struct cursor {
    const uint8_t *base;
    uint64_t size;
    uint64_t pos;
    const char *label;
    muser_error *err;
} cursor;

static uint64_t cur_left(const cursor *c)
{
    return c->size - c->pos;
}

#define FAIL_AT(c, at, code, fmt, ...)                                                         \
    muser_errorf((c)->err, (code), "%s: byte %" PRIu64 ": " fmt, (c)->label, (uint64_t)(at),   \
                 __VA_ARGS__)

static int cur_need(cursor *c, uint64_t n, const char *what)
{
    if (n > cur_left(c))
        return FAIL_AT(c, c->pos, MUSER_E_FORMAT,
                       "truncated %s (needs %" PRIu64 " bytes, %" PRIu64 " left)", what, n,
                       cur_left(c));
    return MUSER_OK;
}

static int cur_uint(cursor *c, unsigned n, uint64_t *v, const char *what)
{
    int rc = cur_need(c, n, what);
    if (rc)
        return rc;
    *v = le_u64(c->base + c->pos, n);
    c->pos += n;
    return MUSER_OK;
}

static int cur_u32(cursor *c, uint32_t *v, const char *what)
{
    uint64_t x = 0;
    int rc = cur_uint(c, 4, &x, what);
    *v = (uint32_t)x;
    return rc;
}

static int cur_u64(cursor *c, uint64_t *v, const char *what)
{
    return cur_uint(c, 8, v, what);
}

static int cur_str(cursor *c, gguf_str *s, const char *what)
{
    uint64_t at = c->pos, len;
    int rc = cur_u64(c, &len, what);
    if (rc)
        return rc;
    if (len > cur_left(c))
        return FAIL_AT(c, at, MUSER_E_FORMAT,
                       "%s length %" PRIu64 " is larger than the %" PRIu64 " bytes left", what,
                       len, cur_left(c));
    s->ptr = (const char *)c->base + c->pos;
    s->len = len;
    c->pos += len;
    return MUSER_OK;
}

/* Check n fixed-size elements of type t at the cursor and step over them. */
static int cur_fixed_array(cursor *c, uint64_t at, uint32_t t, uint64_t n, const char *key)
{
    uint64_t sz = value_type_size(t);
    if (n > cur_left(c) / sz)
        return FAIL_AT(c, at, MUSER_E_FORMAT,
                       "key '%s': array of %" PRIu64 " %s is larger than the %" PRIu64
                       " bytes left",
                       key, n, gguf_type_name(t), cur_left(c));
    if (t == GGUF_TYPE_BOOL)
        for (uint64_t i = 0; i < n; i++)
            if (c->base[c->pos + i] > 1)
                return FAIL_AT(c, c->pos + i, MUSER_E_FORMAT,
                               "key '%s': bool array element %" PRIu64 " is %u (not 0 or 1)",
                               key, i, c->base[c->pos + i]);
    c->pos += n * sz;
    return MUSER_OK;
}

/* Parse one array body (u32 element type, u64 n, elements). kv == NULL for a nested array,
 * which is validated and skipped without recording anything. */
static int parse_array(cursor *c, gguf_kv *kv, const char *key, int depth)
{
    uint64_t at = c->pos, n;
    uint32_t et;
    int rc = cur_u32(c, &et, "array element type");
    if (!rc)
        rc = cur_u64(c, &n, "array length");
    if (rc)
        return rc;
    if (et >= GGUF_TYPE_COUNT)
        return FAIL_AT(c, at, MUSER_E_FORMAT, "key '%s': unknown array element type %" PRIu32,
                       key, et);
    const uint8_t *data = c->base + c->pos;
    uint64_t start = c->pos;
    if (kv) {
        kv->arr_type = et;
        kv->arr_n = n;
        kv->arr_data = data;
    }
    if (et == GGUF_TYPE_STRING) {
        if (n > cur_left(c) / 8)
            return FAIL_AT(c, at, MUSER_E_FORMAT,
                           "key '%s': array of %" PRIu64 " strings is larger than the %" PRIu64
                           " bytes left",
                           key, n, cur_left(c));
        if (kv && n) {
            kv->arr_str_off = malloc(n * sizeof(uint64_t));
            if (!kv->arr_str_off)
                return muser_errorf(c->err, MUSER_E_NOMEM, "%s: key '%s': out of memory",
                                    c->label, key);
        }
        for (uint64_t i = 0; i < n; i++) {
            gguf_str s;
            if (kv)
                kv->arr_str_off[i] = c->pos - start;
            if ((rc = cur_str(c, &s, "array string")))
                return rc;
        }
        return MUSER_OK;
    }
    if (et == GGUF_TYPE_ARRAY) {
        if (depth >= GGUF_MAX_ARRAY_DEPTH)
            return FAIL_AT(c, at, MUSER_E_FORMAT, "key '%s': arrays nested deeper than %d",
                           key, GGUF_MAX_ARRAY_DEPTH);
        if (n > cur_left(c) / 12) /* each inner array has at least a 12-byte header */
            return FAIL_AT(c, at, MUSER_E_FORMAT,
                           "key '%s': array of %" PRIu64 " arrays is larger than the %" PRIu64
                           " bytes left",
                           key, n, cur_left(c));
        for (uint64_t i = 0; i < n; i++)
            if ((rc = parse_array(c, NULL, key, depth + 1)))
                return rc;
        return MUSER_OK;
    }
    return cur_fixed_array(c, at, et, n, key);
}

static int parse_kv(cursor *c, gguf_kv *kv)
{
    char show[72];
    kv->offset = c->pos;
    int rc = cur_str(c, &kv->key, "key");
    if (rc)
        return rc;
    if (kv->key.len == 0)
        return FAIL_AT(c, kv->offset, MUSER_E_FORMAT, "%s", "empty key");
    if (kv->key.len > GGUF_MAX_KEY)
        return FAIL_AT(c, kv->offset, MUSER_E_FORMAT, "key of %" PRIu64 " bytes (limit %d)",
                       kv->key.len, GGUF_MAX_KEY);
    const char *key = str_show(kv->key, show);
    uint64_t at = c->pos;
    if ((rc = cur_u32(c, &kv->type, "value type")))
        return rc;
    uint64_t x = 0;
    switch (kv->type) {
    case GGUF_TYPE_UINT8: case GGUF_TYPE_UINT16: case GGUF_TYPE_UINT32: case GGUF_TYPE_UINT64:
        if ((rc = cur_uint(c, (unsigned)value_type_size(kv->type), &kv->v.u, "value")))
            return rc;
        return MUSER_OK;
    case GGUF_TYPE_INT8: case GGUF_TYPE_INT16: case GGUF_TYPE_INT32: case GGUF_TYPE_INT64: {
        unsigned n = (unsigned)value_type_size(kv->type);
        if ((rc = cur_uint(c, n, &x, "value")))
            return rc;
        if (n < 8 && (x >> (8 * n - 1)) & 1) /* sign-extend */
            x |= ~(uint64_t)0 << (8 * n);
        memcpy(&kv->v.i, &x, 8);
        return MUSER_OK;
    }
    case GGUF_TYPE_FLOAT32: {
        if ((rc = cur_uint(c, 4, &x, "value")))
            return rc;
        uint32_t b = (uint32_t)x;
        float f;
        memcpy(&f, &b, 4);
        kv->v.f = f;
        return MUSER_OK;
    }
    case GGUF_TYPE_FLOAT64:
        if ((rc = cur_uint(c, 8, &x, "value")))
            return rc;
        memcpy(&kv->v.f, &x, 8);
        return MUSER_OK;
    case GGUF_TYPE_BOOL:
        if ((rc = cur_uint(c, 1, &kv->v.u, "value")))
            return rc;
        if (kv->v.u > 1)
            return FAIL_AT(c, c->pos - 1, MUSER_E_FORMAT, "key '%s': bool value %" PRIu64
                           " is not 0 or 1", key, kv->v.u);
        return MUSER_OK;
    case GGUF_TYPE_STRING:
        return cur_str(c, &kv->str, "string value");
    case GGUF_TYPE_ARRAY:
        return parse_array(c, kv, key, 1);
    default:
        return FAIL_AT(c, at, MUSER_E_FORMAT, "key '%s': unknown value type %" PRIu32, key,
                       kv->type);
    }
}

static int parse_tensor_info(cursor *c, uint64_t alignment, gguf_tensor *t)
{
    char show[72];
    uint64_t at = c->pos;
    int rc = cur_str(c, &t->name, "tensor name");
    if (rc)
        return rc;
    if (t->name.len == 0)
        return FAIL_AT(c, at, MUSER_E_FORMAT, "%s", "empty tensor name");
    const char *name = str_show(t->name, show);
    if (t->name.len > GGUF_MAX_NAME)
        return FAIL_AT(c, at, MUSER_E_FORMAT,
                       "tensor name '%s' is %" PRIu64 " bytes (limit %d)", name, t->name.len,
                       GGUF_MAX_NAME);
    if (memchr(t->name.ptr, 0, t->name.len))
        return FAIL_AT(c, at, MUSER_E_FORMAT, "tensor name '%s' contains a NUL byte", name);
    memcpy(t->name_z, t->name.ptr, t->name.len);
    t->name_z[t->name.len] = 0;

    uint64_t dims_at = c->pos;
    if ((rc = cur_u32(c, &t->n_dims, "tensor n_dims")))
        return rc;
    if (t->n_dims == 0 || t->n_dims > GGUF_MAX_DIMS)
        return FAIL_AT(c, dims_at, MUSER_E_FORMAT,
                       "tensor '%s' has %" PRIu32 " dimensions (must be 1 to %d)", name,
                       t->n_dims, GGUF_MAX_DIMS);
    for (uint32_t d = 0; d < GGUF_MAX_DIMS; d++)
        t->ne[d] = 1;
    for (uint32_t d = 0; d < t->n_dims; d++) {
        uint64_t ne_at = c->pos;
        if ((rc = cur_u64(c, &t->ne[d], "tensor dimension")))
            return rc;
        if (t->ne[d] == 0 || t->ne[d] > INT64_MAX)
            return FAIL_AT(c, ne_at, MUSER_E_FORMAT, "tensor '%s': ne[%" PRIu32 "] = %" PRIu64
                           " (must be 1 to 2^63-1)", name, d, t->ne[d]);
    }
    uint64_t type_at = c->pos;
    if ((rc = cur_u32(c, &t->type, "tensor type")))
        return rc;
    const ggml_block *b = ggml_block_of(t->type);
    if (!b)
        return FAIL_AT(c, type_at, MUSER_E_UNSUPPORTED, "tensor '%s': unknown ggml type id %"
                       PRIu32, name, t->type);
    if (t->ne[0] % b->elems)
        return FAIL_AT(c, dims_at, MUSER_E_FORMAT, "tensor '%s': ne[0] = %" PRIu64
                       " is not a multiple of the block size %" PRIu32 " of ggml type %" PRIu32,
                       name, t->ne[0], b->elems, t->type);
    if (!ggml_tensor_bytes(t->type, t->n_dims, t->ne, &t->nbytes))
        return FAIL_AT(c, dims_at, MUSER_E_FORMAT,
                       "tensor '%s': element count or byte size overflows", name);
    uint64_t off_at = c->pos;
    if ((rc = cur_u64(c, &t->offset, "tensor offset")))
        return rc;
    if (t->offset % alignment)
        return FAIL_AT(c, off_at, MUSER_E_FORMAT, "tensor '%s': offset %" PRIu64
                       " is not a multiple of the alignment %" PRIu64, name, t->offset,
                       alignment);
    return MUSER_OK;
}

/* qsort helpers: sort pointers, not the arrays themselves, so the file order is kept. */
static int cmp_kv_key(const void *a, const void *b)
{
    const gguf_kv *x = *(const gguf_kv *const *)a, *y = *(const gguf_kv *const *)b;
    int c = str_cmp(x->key, y->key);
    return c ? c : (x->offset > y->offset) - (x->offset < y->offset);
}

static int cmp_tensor_name(const void *a, const void *b)
{
    const gguf_tensor *x = *(const gguf_tensor *const *)a, *y = *(const gguf_tensor *const *)b;
    int c = str_cmp(x->name, y->name);
    return c ? c : (x < y ? -1 : x > y);
}

static int cmp_tensor_offset(const void *a, const void *b)
{
    const gguf_tensor *x = *(const gguf_tensor *const *)a, *y = *(const gguf_tensor *const *)b;
    if (x->offset != y->offset)
        return x->offset < y->offset ? -1 : 1;
    return x < y ? -1 : x > y;
}

/* Grow *arr (of elem bytes) so it holds at least need elements; new space zeroed. */
static int grow(void **arr, uint64_t *cap, uint64_t need, size_t elem)
{
    if (need <= *cap)
        return MUSER_OK;
    uint64_t ncap = *cap ? *cap * 2 : 16;
    if (ncap < need)
        ncap = need;
    if (ncap > SIZE_MAX / elem)
        return MUSER_E_NOMEM;
    void *p = realloc(*arr, ncap * elem);
    if (!p)
        return MUSER_E_NOMEM;
    memset((char *)p + *cap * elem, 0, (ncap - *cap) * elem);
    *arr = p;
    *cap = ncap;
    return MUSER_OK;
}

static int parse_file(gguf_file *f, muser_error *err)
{
    cursor c = {f->map, f->size, 0, f->path, err};
    cursor *cp = &c;
    char show[72];
    int rc;

    if (f->size == 0)
        return FAIL_AT(cp, 0, MUSER_E_FORMAT, "%s", "empty file (not a GGUF)");
    if (f->size < 4 || memcmp(f->map, GGUF_MAGIC, 4) != 0)
        return FAIL_AT(cp, 0, MUSER_E_FORMAT, "%s", "bad magic (not a GGUF file)");
    c.pos = 4;
    if ((rc = cur_u32(cp, &f->version, "header version")))
        return rc;
    if (f->version == 1)
        return FAIL_AT(cp, 4, MUSER_E_UNSUPPORTED, "%s",
                       "unsupported GGUF version 1 (only v2 and v3 are read; re-convert the model)");
    if (f->version != 2 && f->version != 3) {
        if ((f->version & 0xffff) == 0 && f->version != 0)
            return FAIL_AT(cp, 4, MUSER_E_UNSUPPORTED,
                           "unsupported GGUF version %" PRIu32 " (a big-endian file?)",
                           f->version);
        return FAIL_AT(cp, 4, MUSER_E_UNSUPPORTED,
                       "unsupported GGUF version %" PRIu32 " (only v2 and v3 are read)",
                       f->version);
    }
    uint64_t n_tensors, n_kv;
    if ((rc = cur_u64(cp, &n_tensors, "header tensor count")) ||
        (rc = cur_u64(cp, &n_kv, "header key-value count")))
        return rc;
    if (n_kv > cur_left(cp) / GGUF_MIN_KV_BYTES)
        return FAIL_AT(cp, 16, MUSER_E_FORMAT,
                       "key-value count %" PRIu64 " cannot fit in the %" PRIu64 " bytes left",
                       n_kv, cur_left(cp));
    if (n_tensors > (cur_left(cp) - n_kv * GGUF_MIN_KV_BYTES) / GGUF_MIN_TENSOR_BYTES)
        return FAIL_AT(cp, 8, MUSER_E_FORMAT,
                       "tensor count %" PRIu64 " cannot fit in the %" PRIu64 " bytes left",
                       n_tensors, cur_left(cp));

    /* Key-value pairs. Arrays grow as pairs are actually parsed, so a lying count costs
     * nothing beyond the bytes really present. */
    uint64_t cap = 0;
    for (uint64_t i = 0; i < n_kv; i++) {
        if (grow((void **)&f->kv, &cap, i + 1, sizeof(gguf_kv)))
            return muser_errorf(err, MUSER_E_NOMEM, "%s: out of memory", f->path);
        f->n_kv = i + 1; /* counted before parsing so close() frees a partial array list */
        if ((rc = parse_kv(cp, &f->kv[i])))
            return rc;
    }
    if (n_kv > 1) {
        const gguf_kv **idx = malloc(n_kv * sizeof *idx);
        if (!idx)
            return muser_errorf(err, MUSER_E_NOMEM, "%s: out of memory", f->path);
        for (uint64_t i = 0; i < n_kv; i++)
            idx[i] = &f->kv[i];
        qsort(idx, n_kv, sizeof *idx, cmp_kv_key);
        for (uint64_t i = 1; i < n_kv; i++)
            if (str_cmp(idx[i - 1]->key, idx[i]->key) == 0) {
                rc = FAIL_AT(cp, idx[i]->offset, MUSER_E_FORMAT, "duplicate key '%s'",
                             str_show(idx[i]->key, show));
                break;
            }
        free(idx);
        if (rc)
            return rc;
    }

    f->alignment = GGUF_DEFAULT_ALIGNMENT;
    const gguf_kv *al = gguf_find_kv(f, "general.alignment");
    if (al) {
        if (al->type != GGUF_TYPE_UINT32)
            return FAIL_AT(cp, al->offset, MUSER_E_FORMAT,
                           "general.alignment has type %s (must be uint32)",
                           gguf_type_name(al->type));
        if (al->v.u == 0 || (al->v.u & (al->v.u - 1)))
            return FAIL_AT(cp, al->offset, MUSER_E_FORMAT,
                           "general.alignment %" PRIu64 " is not a nonzero power of two",
                           al->v.u);
        f->alignment = al->v.u;
    }

    /* Tensor infos. */
    cap = 0;
    for (uint64_t i = 0; i < n_tensors; i++) {
        if (grow((void **)&f->tensors, &cap, i + 1, sizeof(gguf_tensor)))
            return muser_errorf(err, MUSER_E_NOMEM, "%s: out of memory", f->path);
        f->n_tensors = i + 1;
        if ((rc = parse_tensor_info(cp, f->alignment, &f->tensors[i])))
            return rc;
    }

    /* Data section: starts at the next multiple of the alignment. A file without tensors may
     * end before the padding. */
    if (c.pos > UINT64_MAX - (f->alignment - 1))
        return FAIL_AT(cp, c.pos, MUSER_E_FORMAT, "%s", "alignment padding overflows");
    f->data_offset = (c.pos + f->alignment - 1) & ~(f->alignment - 1);
    if (n_tensors == 0)
        return MUSER_OK;
    if (f->data_offset > f->size)
        return FAIL_AT(cp, c.pos, MUSER_E_FORMAT,
                       "truncated: data section would start at byte %" PRIu64
                       " past the end of the file",
                       f->data_offset);

    const gguf_tensor **idx = malloc(n_tensors * sizeof *idx);
    if (!idx)
        return muser_errorf(err, MUSER_E_NOMEM, "%s: out of memory", f->path);
    uint64_t data_bytes = f->size - f->data_offset, total = 0;
    for (uint64_t i = 0; i < n_tensors; i++) {
        gguf_tensor *t = &f->tensors[i];
        idx[i] = t;
        if (t->offset > data_bytes || t->nbytes > data_bytes - t->offset) {
            rc = FAIL_AT(cp, f->data_offset + (t->offset < data_bytes ? t->offset : data_bytes),
                         MUSER_E_FORMAT,
                         "tensor '%s' (%" PRIu64 " bytes at data offset %" PRIu64
                         ") extends past the end of the file (%" PRIu64 " bytes)",
                         str_show(t->name, show), t->nbytes, t->offset, f->size);
            goto out;
        }
        if (__builtin_add_overflow(total, t->nbytes, &total)) {
            rc = FAIL_AT(cp, f->data_offset + t->offset, MUSER_E_FORMAT,
                         "sum of tensor sizes overflows at tensor '%s'",
                         str_show(t->name, show));
            goto out;
        }
        t->data = f->map + f->data_offset + t->offset;
    }
    qsort(idx, n_tensors, sizeof *idx, cmp_tensor_name);
    for (uint64_t i = 1; i < n_tensors; i++)
        if (str_cmp(idx[i - 1]->name, idx[i]->name) == 0) {
            rc = FAIL_AT(cp, f->data_offset + idx[i]->offset, MUSER_E_FORMAT,
                         "duplicate tensor name '%s'", str_show(idx[i]->name, show));
            goto out;
        }
    qsort(idx, n_tensors, sizeof *idx, cmp_tensor_offset);
    for (uint64_t i = 1; i < n_tensors; i++) {
        const gguf_tensor *a = idx[i - 1], *b = idx[i];
        if (b->offset - a->offset < a->nbytes) {
            char show2[72];
            rc = FAIL_AT(cp, f->data_offset + b->offset, MUSER_E_FORMAT,
                         "tensor '%s' (data offset %" PRIu64 ") overlaps tensor '%s' (data offset %"
                         PRIu64 ", %" PRIu64 " bytes)",
                         str_show(b->name, show), b->offset, str_show(a->name, show2),
                         a->offset, a->nbytes);
            goto out;
        }
    }
out:
    free(idx);
    return rc;
}

static int open_common(gguf_file **out, gguf_file *f, muser_error *err)
{
    int rc = parse_file(f, err);
    if (rc) {
        gguf_close(f);
        *out = NULL;
        return rc;
    }
    *out = f;
    return MUSER_OK;
}

int gguf_open_memory(gguf_file **out, const void *data, size_t size, const char *label,
                     muser_error *err)
{
    *out = NULL;
    if (!data && size)
        return muser_errorf(err, MUSER_E_ARG, "gguf_open_memory: NULL buffer");
    gguf_file *f = calloc(1, sizeof *f);
    if (!f)
        return muser_errorf(err, MUSER_E_NOMEM, "gguf: out of memory");
    snprintf(f->path, sizeof f->path, "%s", label ? label : "<memory>");
    f->map = data;
    f->size = size;
    return open_common(out, f, err);
}

int gguf_open(gguf_file **out, const char *path, muser_error *err)
{
    *out = NULL;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return muser_errorf(err, MUSER_E_IO, "%s: cannot open: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0) {
        int e = errno;
        close(fd);
        return muser_errorf(err, MUSER_E_IO, "%s: cannot stat: %s", path, strerror(e));
    }
    if (!S_ISREG(st.st_mode)) {
        close(fd);
        return muser_errorf(err, MUSER_E_IO, "%s: not a regular file", path);
    }
    if (st.st_size == 0) {
        close(fd);
        return muser_errorf(err, MUSER_E_FORMAT, "%s: byte 0: empty file (not a GGUF)", path);
    }
    void *map = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
    int e = errno;
    close(fd); /* the mapping keeps the file alive */
    if (map == MAP_FAILED)
        return muser_errorf(err, MUSER_E_IO, "%s: cannot mmap %lld bytes: %s", path,
                            (long long)st.st_size, strerror(e));
    gguf_file *f = calloc(1, sizeof *f);
    if (!f) {
        munmap(map, (size_t)st.st_size);
        return muser_errorf(err, MUSER_E_NOMEM, "%s: out of memory", path);
    }
    snprintf(f->path, sizeof f->path, "%s", path);
    f->map = map;
    f->size = (uint64_t)st.st_size;
    f->owns_map = true;
    return open_common(out, f, err);
}

void gguf_close(gguf_file *f)
{
    if (!f)
        return;
    for (uint64_t i = 0; i < f->n_kv; i++)
        free(f->kv[i].arr_str_off);
    free(f->kv);
    free(f->tensors);
    if (f->owns_map && f->map)
        munmap((void *)f->map, f->size);
    free(f);
}

/* ---- lookups and getters ---- */

const gguf_kv *gguf_find_kv(const gguf_file *f, const char *key)
{
    for (uint64_t i = 0; i < f->n_kv; i++)
        if (gguf_str_eq(f->kv[i].key, key))
            return &f->kv[i];
    return NULL;
}

const gguf_tensor *gguf_find_tensor(const gguf_file *f, const char *name)
{
    for (uint64_t i = 0; i < f->n_tensors; i++)
        if (strcmp(f->tensors[i].name_z, name) == 0)
            return &f->tensors[i];
    return NULL;
}

static const gguf_kv *need_kv(const gguf_file *f, const char *key, muser_error *err)
{
    const gguf_kv *kv = gguf_find_kv(f, key);
    if (!kv)
        muser_errorf(err, MUSER_E_SHAPE, "%s: missing key '%s'", f->path, key);
    return kv;
}

static int wrong_type(const gguf_file *f, const gguf_kv *kv, const char *key, const char *want,
                      muser_error *err)
{
    return muser_errorf(err, MUSER_E_FORMAT, "%s: byte %" PRIu64 ": key '%s' has type %s, want %s",
                        f->path, kv->offset, key, gguf_type_name(kv->type), want);
}

/* Integer value of kv within [0, max]. */
static int get_uint(const gguf_file *f, const char *key, uint64_t max, uint64_t *out,
                    muser_error *err)
{
    const gguf_kv *kv = need_kv(f, key, err);
    if (!kv)
        return MUSER_E_SHAPE;
    if (!value_type_is_int(kv->type))
        return wrong_type(f, kv, key, "an integer", err);
    if (value_type_is_signed(kv->type) ? (kv->v.i < 0 || (uint64_t)kv->v.i > max) : kv->v.u > max) {
        if (value_type_is_signed(kv->type))
            return muser_errorf(err, MUSER_E_FORMAT, "%s: key '%s' = %" PRId64 " is out of range",
                                f->path, key, kv->v.i);
        return muser_errorf(err, MUSER_E_FORMAT, "%s: key '%s' = %" PRIu64 " is out of range",
                            f->path, key, kv->v.u);
    }
    *out = kv->v.u;
    return MUSER_OK;
}

int gguf_get_u32(const gguf_file *f, const char *key, uint32_t *out, muser_error *err)
{
    uint64_t v;
    int rc = get_uint(f, key, UINT32_MAX, &v, err);
    if (!rc)
        *out = (uint32_t)v;
    return rc;
}

int gguf_get_u64(const gguf_file *f, const char *key, uint64_t *out, muser_error *err)
{
    return get_uint(f, key, UINT64_MAX, out, err);
}

int gguf_get_f32(const gguf_file *f, const char *key, float *out, muser_error *err)
{
    const gguf_kv *kv = need_kv(f, key, err);
    if (!kv)
        return MUSER_E_SHAPE;
    if (kv->type != GGUF_TYPE_FLOAT32 && kv->type != GGUF_TYPE_FLOAT64)
        return wrong_type(f, kv, key, "float32 or float64", err);
    double d = kv->v.f;
    if (isfinite(d) && fabs(d) > FLT_MAX)
        return muser_errorf(err, MUSER_E_FORMAT, "%s: key '%s' = %g is out of float range",
                                f->path, key, d);
    *out = (float)d;
    return MUSER_OK;
}

int gguf_get_bool(const gguf_file *f, const char *key, bool *out, muser_error *err)
{
    const gguf_kv *kv = need_kv(f, key, err);
    if (!kv)
        return MUSER_E_SHAPE;
    if (kv->type != GGUF_TYPE_BOOL)
        return wrong_type(f, kv, key, "bool", err);
    *out = kv->v.u != 0;
    return MUSER_OK;
}

int gguf_get_str(const gguf_file *f, const char *key, gguf_str *out, muser_error *err)
{
    const gguf_kv *kv = need_kv(f, key, err);
    if (!kv)
        return MUSER_E_SHAPE;
    if (kv->type != GGUF_TYPE_STRING)
        return wrong_type(f, kv, key, "string", err);
    *out = kv->str;
    return MUSER_OK;
}

int gguf_get_arr(const gguf_file *f, const char *key, uint32_t elem_type, uint64_t *n,
                 const void **data, muser_error *err)
{
    const gguf_kv *kv = need_kv(f, key, err);
    if (!kv)
        return MUSER_E_SHAPE;
    if (kv->type != GGUF_TYPE_ARRAY || kv->arr_type != elem_type) {
        char want[40];
        snprintf(want, sizeof want, "array of %s", gguf_type_name(elem_type));
        if (kv->type == GGUF_TYPE_ARRAY)
            return muser_errorf(err, MUSER_E_FORMAT,
                                "%s: byte %" PRIu64 ": key '%s' is an array of %s, want %s",
                                f->path, kv->offset, key, gguf_type_name(kv->arr_type), want);
        return wrong_type(f, kv, key, want, err);
    }
    *n = kv->arr_n;
    *data = kv->arr_data;
    return MUSER_OK;
}

gguf_str gguf_arr_str(const gguf_kv *kv, uint64_t i)
{
    gguf_str s = {NULL, 0};
    if (kv->type != GGUF_TYPE_ARRAY || kv->arr_type != GGUF_TYPE_STRING || i >= kv->arr_n ||
        !kv->arr_str_off)
        return s;
    const uint8_t *p = kv->arr_data + kv->arr_str_off[i];
    s.len = le_u64(p, 8);
    s.ptr = (const char *)p + 8;
    return s;
}

/* ---- writer ---- */

typedef struct wkv {
    char *key;
    uint32_t type;
    uint8_t *val; /* the value's serialized bytes (what follows the type in the file) */
    uint64_t nval;
} wkv;

typedef struct wtensor {
    char name[GGUF_MAX_NAME + 1];
    uint32_t type, n_dims;
    uint64_t ne[GGUF_MAX_DIMS];
    uint64_t offset, nbytes;
} wtensor;

struct gguf_writer {
    uint32_t alignment;
    wkv *kv;
    uint64_t n_kv, cap_kv;
    wtensor *t;
    uint64_t n_t, cap_t;
    uint64_t data_size;  /* running, aligned end of the data section */
    /* streaming state */
    FILE *fp;
    char *path;
    uint64_t cur;        /* tensor being written */
    uint64_t cur_done;   /* bytes of it written */
    uint64_t written;    /* bytes in the file so far */
    bool begun, failed;
};

static int w_set(gguf_writer *w, const char *key, uint32_t type, const void *val, uint64_t n);

gguf_writer *gguf_writer_new(uint32_t alignment)
{
    if (alignment == 0)
        alignment = GGUF_DEFAULT_ALIGNMENT;
    if (alignment & (alignment - 1))
        return NULL;
    gguf_writer *w = calloc(1, sizeof *w);
    if (!w)
        return NULL;
    w->alignment = alignment;
    if (alignment != GGUF_DEFAULT_ALIGNMENT) {
        uint8_t v[4] = {(uint8_t)alignment, (uint8_t)(alignment >> 8), (uint8_t)(alignment >> 16),
                        (uint8_t)(alignment >> 24)};
        if (w_set(w, "general.alignment", GGUF_TYPE_UINT32, v, 4)) {
            free(w);
            return NULL;
        }
    }
    return w;
}

void gguf_writer_free(gguf_writer *w)
{
    if (!w)
        return;
    if (w->fp) { /* never finished: do not leave a half-written file behind */
        fclose(w->fp);
        if (w->path)
            unlink(w->path);
    }
    for (uint64_t i = 0; i < w->n_kv; i++) {
        free(w->kv[i].key);
        free(w->kv[i].val);
    }
    free(w->kv);
    free(w->t);
    free(w->path);
    free(w);
}

static void put_le(uint8_t *p, uint64_t v, unsigned n)
{
    for (unsigned i = 0; i < n; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

/* Set or replace key with already-serialized value bytes (copied). */
static int w_set(gguf_writer *w, const char *key, uint32_t type, const void *val, uint64_t n)
{
    if (!w || !key || !key[0] || strlen(key) > GGUF_MAX_KEY || w->begun)
        return MUSER_E_ARG;
    if (!strcmp(key, "general.alignment")) {
        if (type != GGUF_TYPE_UINT32 || n != 4)
            return MUSER_E_ARG;
        uint32_t a = (uint32_t)le_u64(val, 4);
        if (a == 0 || (a & (a - 1)))
            return MUSER_E_ARG;
        if (w->n_t && a != w->alignment) /* declared offsets were computed with the old one */
            return MUSER_E_ARG;
        w->alignment = a;
    }
    uint8_t *copy = malloc(n ? n : 1);
    if (!copy)
        return MUSER_E_NOMEM;
    if (n)
        memcpy(copy, val, n);
    for (uint64_t i = 0; i < w->n_kv; i++)
        if (!strcmp(w->kv[i].key, key)) {
            free(w->kv[i].val);
            w->kv[i].type = type;
            w->kv[i].val = copy;
            w->kv[i].nval = n;
            return MUSER_OK;
        }
    char *k = strdup(key);
    if (!k || grow((void **)&w->kv, &w->cap_kv, w->n_kv + 1, sizeof(wkv))) {
        free(k);
        free(copy);
        return MUSER_E_NOMEM;
    }
    w->kv[w->n_kv++] = (wkv){k, type, copy, n};
    return MUSER_OK;
}

int gguf_writer_set_u32(gguf_writer *w, const char *key, uint32_t v)
{
    uint8_t b[4];
    put_le(b, v, 4);
    return w_set(w, key, GGUF_TYPE_UINT32, b, 4);
}

int gguf_writer_set_i32(gguf_writer *w, const char *key, int32_t v)
{
    uint8_t b[4];
    put_le(b, (uint32_t)v, 4);
    return w_set(w, key, GGUF_TYPE_INT32, b, 4);
}

int gguf_writer_set_u64(gguf_writer *w, const char *key, uint64_t v)
{
    uint8_t b[8];
    put_le(b, v, 8);
    return w_set(w, key, GGUF_TYPE_UINT64, b, 8);
}

int gguf_writer_set_f32(gguf_writer *w, const char *key, float v)
{
    uint32_t u;
    memcpy(&u, &v, 4);
    uint8_t b[4];
    put_le(b, u, 4);
    return w_set(w, key, GGUF_TYPE_FLOAT32, b, 4);
}

int gguf_writer_set_bool(gguf_writer *w, const char *key, bool v)
{
    uint8_t b = v ? 1 : 0;
    return w_set(w, key, GGUF_TYPE_BOOL, &b, 1);
}

int gguf_writer_set_str(gguf_writer *w, const char *key, const char *v)
{
    if (!v)
        return MUSER_E_ARG;
    size_t n = strlen(v);
    uint8_t *b = malloc(8 + n);
    if (!b)
        return MUSER_E_NOMEM;
    put_le(b, n, 8);
    memcpy(b + 8, v, n);
    int rc = w_set(w, key, GGUF_TYPE_STRING, b, 8 + n);
    free(b);
    return rc;
}

/* Serialize an array header + body bytes into one buffer and set it. */
static int w_set_array(gguf_writer *w, const char *key, uint32_t elem_type, uint64_t n,
                       const void *body, uint64_t nbody)
{
    if (nbody > SIZE_MAX - 12)
        return MUSER_E_NOMEM;
    uint8_t *b = malloc(12 + nbody);
    if (!b)
        return MUSER_E_NOMEM;
    put_le(b, elem_type, 4);
    put_le(b + 4, n, 8);
    if (nbody)
        memcpy(b + 12, body, nbody);
    int rc = w_set(w, key, GGUF_TYPE_ARRAY, b, 12 + nbody);
    free(b);
    return rc;
}

int gguf_writer_set_arr(gguf_writer *w, const char *key, uint32_t elem_type, const void *data,
                        uint64_t n)
{
    uint64_t sz = value_type_size(elem_type);
    if (!sz || (n && !data) || n > UINT64_MAX / sz)
        return MUSER_E_ARG;
    if (elem_type == GGUF_TYPE_BOOL)
        for (uint64_t i = 0; i < n; i++)
            if (((const uint8_t *)data)[i] > 1)
                return MUSER_E_ARG;
    return w_set_array(w, key, elem_type, n, data, n * sz);
}

int gguf_writer_set_arr_str(gguf_writer *w, const char *key, const char *const *strs,
                            const uint64_t *lens, uint64_t n)
{
    if (n && !strs)
        return MUSER_E_ARG;
    uint64_t total = 0;
    for (uint64_t i = 0; i < n; i++) {
        uint64_t len = lens ? lens[i] : (strs[i] ? strlen(strs[i]) : 0);
        if ((!strs[i] && len) || __builtin_add_overflow(total, 8 + len, &total))
            return MUSER_E_ARG;
    }
    if (total > SIZE_MAX)
        return MUSER_E_NOMEM;
    uint8_t *b = malloc(total ? total : 1);
    if (!b)
        return MUSER_E_NOMEM;
    uint64_t o = 0;
    for (uint64_t i = 0; i < n; i++) {
        uint64_t len = lens ? lens[i] : (strs[i] ? strlen(strs[i]) : 0);
        put_le(b + o, len, 8);
        if (len)
            memcpy(b + o + 8, strs[i], len);
        o += 8 + len;
    }
    int rc = w_set_array(w, key, GGUF_TYPE_STRING, n, b, total);
    free(b);
    return rc;
}

/* Bytes spanned by n elements of type et starting at p (already validated by the reader). */
static uint64_t array_body_bytes(uint32_t et, const uint8_t *p, uint64_t n, int depth)
{
    uint64_t sz = value_type_size(et);
    if (sz)
        return n * sz;
    uint64_t o = 0;
    for (uint64_t i = 0; i < n; i++) {
        if (et == GGUF_TYPE_STRING) {
            o += 8 + le_u64(p + o, 8);
        } else { /* ARRAY */
            if (depth >= GGUF_MAX_ARRAY_DEPTH)
                return UINT64_MAX;
            uint32_t inner = (uint32_t)le_u64(p + o, 4);
            uint64_t m = le_u64(p + o + 4, 8);
            uint64_t b = array_body_bytes(inner, p + o + 12, m, depth + 1);
            if (b == UINT64_MAX)
                return b;
            o += 12 + b;
        }
    }
    return o;
}

int gguf_writer_copy_kv(gguf_writer *w, const gguf_kv *kv)
{
    if (!kv || !kv->key.len || kv->key.len > GGUF_MAX_KEY)
        return MUSER_E_ARG;
    char key[GGUF_MAX_KEY + 1];
    memcpy(key, kv->key.ptr, kv->key.len);
    key[kv->key.len] = 0;
    if (strlen(key) != kv->key.len)
        return MUSER_E_ARG; /* embedded NUL: cannot be named through this API */
    uint8_t b[8];
    switch (kv->type) {
    case GGUF_TYPE_UINT8: case GGUF_TYPE_INT8: case GGUF_TYPE_UINT16: case GGUF_TYPE_INT16:
    case GGUF_TYPE_UINT32: case GGUF_TYPE_INT32: case GGUF_TYPE_UINT64: case GGUF_TYPE_INT64:
    case GGUF_TYPE_BOOL: {
        unsigned n = (unsigned)value_type_size(kv->type);
        put_le(b, kv->v.u, n); /* two's complement: low bytes of the widened value */
        return w_set(w, key, kv->type, b, n);
    }
    case GGUF_TYPE_FLOAT32: {
        float f = (float)kv->v.f;
        uint32_t u;
        memcpy(&u, &f, 4);
        put_le(b, u, 4);
        return w_set(w, key, kv->type, b, 4);
    }
    case GGUF_TYPE_FLOAT64: {
        uint64_t u;
        memcpy(&u, &kv->v.f, 8);
        put_le(b, u, 8);
        return w_set(w, key, kv->type, b, 8);
    }
    case GGUF_TYPE_STRING: {
        if (kv->str.len > SIZE_MAX - 8)
            return MUSER_E_NOMEM;
        uint8_t *s = malloc(8 + kv->str.len);
        if (!s)
            return MUSER_E_NOMEM;
        put_le(s, kv->str.len, 8);
        if (kv->str.len)
            memcpy(s + 8, kv->str.ptr, kv->str.len);
        int rc = w_set(w, key, kv->type, s, 8 + kv->str.len);
        free(s);
        return rc;
    }
    case GGUF_TYPE_ARRAY: {
        if (kv->arr_type >= GGUF_TYPE_COUNT || (kv->arr_n && !kv->arr_data))
            return MUSER_E_ARG;
        uint64_t nb = array_body_bytes(kv->arr_type, kv->arr_data, kv->arr_n, 1);
        if (nb == UINT64_MAX)
            return MUSER_E_ARG;
        return w_set_array(w, key, kv->arr_type, kv->arr_n, kv->arr_data, nb);
    }
    default:
        return MUSER_E_ARG;
    }
}

int gguf_writer_add_tensor(gguf_writer *w, const char *name, uint32_t type, uint32_t n_dims,
                           const uint64_t *ne, muser_error *err)
{
    if (!w || !name || !ne)
        return muser_errorf(err, MUSER_E_ARG, "gguf writer: NULL argument");
    if (w->begun)
        return muser_errorf(err, MUSER_E_ARG, "gguf writer: tensor '%s' added after begin", name);
    size_t len = strlen(name);
    if (len == 0 || len > GGUF_MAX_NAME)
        return muser_errorf(err, MUSER_E_ARG, "gguf writer: tensor name '%.40s' must be 1 to %d bytes",
                            name, GGUF_MAX_NAME);
    for (uint64_t i = 0; i < w->n_t; i++)
        if (!strcmp(w->t[i].name, name))
            return muser_errorf(err, MUSER_E_ARG, "gguf writer: duplicate tensor '%s'", name);
    if (n_dims == 0 || n_dims > GGUF_MAX_DIMS)
        return muser_errorf(err, MUSER_E_ARG, "gguf writer: tensor '%s' has %u dims (1 to %d)",
                            name, n_dims, GGUF_MAX_DIMS);
    const ggml_block *b = ggml_block_of(type);
    if (!b)
        return muser_errorf(err, MUSER_E_ARG, "gguf writer: tensor '%s': unknown ggml type %u",
                            name, type);
    wtensor t = {0};
    memcpy(t.name, name, len + 1);
    t.type = type;
    t.n_dims = n_dims;
    for (uint32_t d = 0; d < GGUF_MAX_DIMS; d++)
        t.ne[d] = d < n_dims ? ne[d] : 1;
    if (!ggml_tensor_bytes(type, n_dims, t.ne, &t.nbytes))
        return muser_errorf(err, MUSER_E_ARG,
                            "gguf writer: tensor '%s': a dim is 0, ne[0]=%" PRIu64
                            " is not a multiple of the block size %u, or the size overflows",
                            name, t.ne[0], b->elems);
    t.offset = w->data_size;
    uint64_t end;
    if (__builtin_add_overflow(t.offset, t.nbytes, &end) ||
        __builtin_add_overflow(end, (uint64_t)w->alignment - 1, &end))
        return muser_errorf(err, MUSER_E_ARG, "gguf writer: data section overflows at '%s'", name);
    if (grow((void **)&w->t, &w->cap_t, w->n_t + 1, sizeof(wtensor)))
        return muser_errorf(err, MUSER_E_NOMEM, "gguf writer: out of memory");
    w->t[w->n_t++] = t;
    w->data_size = end & ~((uint64_t)w->alignment - 1);
    return MUSER_OK;
}

static int w_write(gguf_writer *w, const void *p, uint64_t n, muser_error *err)
{
    if (n && fwrite(p, 1, n, w->fp) != n) {
        w->failed = true;
        return muser_errorf(err, MUSER_E_IO, "%s: write failed at byte %" PRIu64 ": %s", w->path,
                            w->written, strerror(errno));
    }
    w->written += n;
    return MUSER_OK;
}

static int w_u(gguf_writer *w, uint64_t v, unsigned n, muser_error *err)
{
    uint8_t b[8];
    put_le(b, v, n);
    return w_write(w, b, n, err);
}

static int w_pad(gguf_writer *w, muser_error *err)
{
    static const uint8_t zeros[256];
    uint64_t pad = (w->alignment - w->written % w->alignment) % w->alignment;
    while (pad) {
        uint64_t n = pad < sizeof zeros ? pad : sizeof zeros;
        int rc = w_write(w, zeros, n, err);
        if (rc)
            return rc;
        pad -= n;
    }
    return MUSER_OK;
}

/* After the current tensor is complete: pad and move on. */
static int w_next_tensor(gguf_writer *w, muser_error *err)
{
    while (w->cur < w->n_t && w->cur_done == w->t[w->cur].nbytes) {
        int rc = w_pad(w, err);
        if (rc)
            return rc;
        w->cur++;
        w->cur_done = 0;
    }
    return MUSER_OK;
}

int gguf_writer_begin(gguf_writer *w, const char *path, muser_error *err)
{
    if (!w || !path)
        return muser_errorf(err, MUSER_E_ARG, "gguf writer: NULL argument");
    if (w->begun)
        return muser_errorf(err, MUSER_E_ARG, "%s: gguf writer already begun", path);
    w->path = strdup(path);
    if (!w->path)
        return muser_errorf(err, MUSER_E_NOMEM, "gguf writer: out of memory");
    w->fp = fopen(path, "wb");
    if (!w->fp)
        return muser_errorf(err, MUSER_E_IO, "%s: cannot create: %s", path, strerror(errno));
    setvbuf(w->fp, NULL, _IOFBF, 1 << 20);
    w->begun = true;
    int rc = w_write(w, GGUF_MAGIC, 4, err);
    if (!rc) rc = w_u(w, 3, 4, err);
    if (!rc) rc = w_u(w, w->n_t, 8, err);
    if (!rc) rc = w_u(w, w->n_kv, 8, err);
    for (uint64_t i = 0; !rc && i < w->n_kv; i++) {
        uint64_t klen = strlen(w->kv[i].key);
        rc = w_u(w, klen, 8, err);
        if (!rc) rc = w_write(w, w->kv[i].key, klen, err);
        if (!rc) rc = w_u(w, w->kv[i].type, 4, err);
        if (!rc) rc = w_write(w, w->kv[i].val, w->kv[i].nval, err);
    }
    for (uint64_t i = 0; !rc && i < w->n_t; i++) {
        const wtensor *t = &w->t[i];
        uint64_t nlen = strlen(t->name);
        rc = w_u(w, nlen, 8, err);
        if (!rc) rc = w_write(w, t->name, nlen, err);
        if (!rc) rc = w_u(w, t->n_dims, 4, err);
        for (uint32_t d = 0; !rc && d < t->n_dims; d++)
            rc = w_u(w, t->ne[d], 8, err);
        if (!rc) rc = w_u(w, t->type, 4, err);
        if (!rc) rc = w_u(w, t->offset, 8, err);
    }
    if (!rc) rc = w_pad(w, err);
    w->cur = 0;
    w->cur_done = 0;
    if (!rc) rc = w_next_tensor(w, err);
    return rc;
}

int gguf_writer_tensor_data(gguf_writer *w, const void *data, uint64_t nbytes, muser_error *err)
{
    if (!w || !w->begun || !w->fp || w->failed)
        return muser_errorf(err, MUSER_E_ARG, "gguf writer: tensor data before begin or after an error");
    if (w->cur >= w->n_t)
        return muser_errorf(err, MUSER_E_ARG, "%s: %" PRIu64 " bytes of tensor data after the last tensor",
                            w->path, nbytes);
    const wtensor *t = &w->t[w->cur];
    if (nbytes > t->nbytes - w->cur_done)
        return muser_errorf(err, MUSER_E_ARG,
                            "%s: tensor '%s': %" PRIu64 " bytes given, only %" PRIu64 " remain",
                            w->path, t->name, nbytes, t->nbytes - w->cur_done);
    int rc = w_write(w, data, nbytes, err);
    if (rc)
        return rc;
    w->cur_done += nbytes;
    return w_next_tensor(w, err);
}

int gguf_writer_finish(gguf_writer *w, muser_error *err)
{
    if (!w || !w->begun || !w->fp)
        return muser_errorf(err, MUSER_E_ARG, "gguf writer: finish before begin");
    int rc = MUSER_OK;
    if (w->failed)
        rc = muser_errorf(err, MUSER_E_IO, "%s: an earlier write failed", w->path);
    else if (w->cur < w->n_t)
        rc = muser_errorf(err, MUSER_E_ARG,
                          "%s: tensor '%s' has %" PRIu64 " of %" PRIu64 " bytes (and %" PRIu64
                          " tensors after it are missing)",
                          w->path, w->t[w->cur].name, w->cur_done, w->t[w->cur].nbytes,
                          w->n_t - w->cur - 1);
    if (rc) /* leave fp open: gguf_writer_free removes the partial file */
        return rc;
    int e1 = fflush(w->fp), en = errno;
    int e2 = fclose(w->fp);
    if (e2 && !e1)
        en = errno;
    w->fp = NULL;
    if (e1 || e2) {
        unlink(w->path);
        return muser_errorf(err, MUSER_E_IO, "%s: flush/close failed: %s", w->path, strerror(en));
    }
    return MUSER_OK;
}
