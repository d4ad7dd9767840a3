/* test_gguf_bytes.c — the GGUF reader on hand-built bytes: every scalar type and nested arrays
 * (read, then copied through the writer byte for byte), one malformed file per check the reader
 * makes (each must fail with its own message naming the byte offset), every truncation of a
 * valid file, and single-byte corruptions at every offset. Buffers are malloc'ed at their exact
 * size so ASan sees any read past the end. */
#include "check.h"
#include "gguf.h"

#include <string.h>
#include <unistd.h>

/* ---- a byte builder ---- */

typedef struct bb {
    uint8_t *p;
    size_t n, cap;
} bb;

static void put(bb *b, const void *src, size_t n)
{
    if (b->n + n > b->cap) {
        b->cap = (b->n + n) * 2 + 64;
        b->p = realloc(b->p, b->cap);
        if (!b->p)
            abort();
    }
    if (n)
        memcpy(b->p + b->n, src, n);
    b->n += n;
}

static void put_uint(bb *b, uint64_t v, unsigned n)
{
    uint8_t x[8];
    for (unsigned i = 0; i < n; i++)
        x[i] = (uint8_t)(v >> (8 * i));
    put(b, x, n);
}
static void u8_(bb *b, uint64_t v) { put_uint(b, v, 1); }
static void u32_(bb *b, uint64_t v) { put_uint(b, v, 4); }
static void u64_(bb *b, uint64_t v) { put_uint(b, v, 8); }
static void str_(bb *b, const char *s)
{
    u64_(b, strlen(s));
    put(b, s, strlen(s));
}
static void zeros(bb *b, size_t n)
{
    while (n--)
        u8_(b, 0);
}
static void pad_to(bb *b, size_t a)
{
    while (b->n % a)
        u8_(b, 0);
}
static void hdr(bb *b, uint32_t version, uint64_t n_tensors, uint64_t n_kv)
{
    b->n = 0;
    put(b, "GGUF", 4);
    u32_(b, version);
    u64_(b, n_tensors);
    u64_(b, n_kv);
}
static void kv_u32(bb *b, const char *key, uint32_t v)
{
    str_(b, key);
    u32_(b, GGUF_TYPE_UINT32);
    u32_(b, v);
}
static void tinfo(bb *b, const char *name, uint32_t n_dims, const uint64_t *ne, uint32_t type,
                  uint64_t offset)
{
    str_(b, name);
    u32_(b, n_dims);
    for (uint32_t d = 0; d < n_dims; d++)
        u64_(b, ne[d]);
    u32_(b, type);
    u64_(b, offset);
}

/* Open b's bytes from an exact-size heap copy; on success the copy lives as f->map until
 * close_bytes. */
static int open_bytes(const bb *b, const char *label, gguf_file **f, muser_error *err)
{
    uint8_t *copy = malloc(b->n ? b->n : 1);
    if (b->n)
        memcpy(copy, b->p, b->n);
    int rc = gguf_open_memory(f, copy, b->n, label, err);
    if (rc != 0)
        free(copy);
    return rc;
}

static void close_bytes(gguf_file *f)
{
    if (!f)
        return;
    void *map = (void *)f->map;
    gguf_close(f);
    free(map);
}

/* Expect the bytes in b to be rejected with code, a message naming byte `at` (or any byte when
 * at < 0) and containing `what`. */
static void expect_fail(const char *name, const bb *b, int code, long long at, const char *what)
{
    muser_error err = {0};
    gguf_file *f = NULL;
    int rc = open_bytes(b, name, &f, &err);
    char prefix[128];
    if (at >= 0)
        snprintf(prefix, sizeof prefix, "%s: byte %lld: ", name, at);
    else
        snprintf(prefix, sizeof prefix, "%s: byte ", name);
    CHECKF(rc == code && f == NULL, "%s: rc %d (want %d), msg '%s'", name, rc, code,
           rc ? err.msg : "");
    CHECKF(rc != 0 && strncmp(err.msg, prefix, strlen(prefix)) == 0 && strstr(err.msg, what),
           "%s: message '%s' (want prefix '%s' and '%s')", name, err.msg, prefix, what);
    close_bytes(f);
}

static void expect_ok(const char *name, const bb *b)
{
    muser_error err = {0};
    gguf_file *f = NULL;
    CHECKF(open_bytes(b, name, &f, &err) == 0, "%s: %s", name, err.msg);
    close_bytes(f);
}

/* A valid file: 3 kv pairs, tensors F32[4] at 0 and Q8_0[32] at 32, 30 bytes of trailing
 * padding. data_end is where the last tensor's bytes end. */
static size_t make_valid(bb *b, uint32_t version)
{
    hdr(b, version, 2, 3);
    str_(b, "general.architecture");
    u32_(b, GGUF_TYPE_STRING);
    str_(b, "muse");
    kv_u32(b, "muse.block_count", 2);
    str_(b, "tokenizer.ggml.tokens");
    u32_(b, GGUF_TYPE_ARRAY);
    u32_(b, GGUF_TYPE_STRING);
    u64_(b, 3);
    str_(b, "a");
    str_(b, "");
    str_(b, "bcd");
    tinfo(b, "w.f32", 1, (uint64_t[]){4}, 0, 0);
    tinfo(b, "w.q8", 2, (uint64_t[]){32, 1}, 8, 32);
    pad_to(b, 32);
    for (int i = 0; i < 16; i++)
        u8_(b, (uint64_t)i);
    zeros(b, 16);
    for (int i = 0; i < 34; i++)
        u8_(b, (uint64_t)(100 + i));
    size_t end = b->n;
    zeros(b, 30);
    return end;
}

/* Touch everything a consumer could touch. */
static void walk(const gguf_file *f)
{
    volatile unsigned sink = 0;
    muser_error err;
    for (uint64_t i = 0; i < f->n_kv; i++) {
        const gguf_kv *kv = &f->kv[i];
        for (uint64_t j = 0; j < kv->key.len; j++)
            sink += (unsigned char)kv->key.ptr[j];
        if (kv->type == GGUF_TYPE_STRING && kv->str.len)
            sink += (unsigned char)kv->str.ptr[kv->str.len - 1];
        if (kv->type == GGUF_TYPE_ARRAY && kv->arr_type == GGUF_TYPE_STRING)
            for (uint64_t j = 0; j < kv->arr_n; j++) {
                gguf_str s = gguf_arr_str(kv, j);
                if (s.len)
                    sink += (unsigned char)s.ptr[0] + (unsigned char)s.ptr[s.len - 1];
            }
    }
    for (uint64_t i = 0; i < f->n_tensors; i++) {
        const gguf_tensor *t = &f->tensors[i];
        const uint8_t *d = t->data;
        sink += d[0] + d[t->nbytes - 1];
        sink += gguf_find_tensor(f, t->name_z) != NULL;
    }
    uint32_t u;
    sink += (unsigned)gguf_get_u32(f, "muse.block_count", &u, &err);
    (void)sink;
}

static void every_value_type(void)
{
    bb b = {0};
    hdr(&b, 3, 0, 16);
    str_(&b, "t.u8"), u32_(&b, GGUF_TYPE_UINT8), u8_(&b, 255);
    str_(&b, "t.i8"), u32_(&b, GGUF_TYPE_INT8), u8_(&b, 0xfb); /* -5 */
    str_(&b, "t.u16"), u32_(&b, GGUF_TYPE_UINT16), put_uint(&b, 65535, 2);
    str_(&b, "t.i16"), u32_(&b, GGUF_TYPE_INT16), put_uint(&b, (uint16_t)-300, 2);
    kv_u32(&b, "t.u32", 4000000000u);
    str_(&b, "t.i32"), u32_(&b, GGUF_TYPE_INT32), u32_(&b, 7);
    str_(&b, "t.f32"), u32_(&b, GGUF_TYPE_FLOAT32), u32_(&b, 0x3fc00000); /* 1.5 */
    str_(&b, "t.bool"), u32_(&b, GGUF_TYPE_BOOL), u8_(&b, 0);
    str_(&b, "t.str"), u32_(&b, GGUF_TYPE_STRING), str_(&b, "glimmer");
    str_(&b, "t.u64"), u32_(&b, GGUF_TYPE_UINT64), u64_(&b, UINT64_MAX);
    str_(&b, "t.i64"), u32_(&b, GGUF_TYPE_INT64), u64_(&b, (uint64_t)INT64_MIN);
    str_(&b, "t.f64"), u32_(&b, GGUF_TYPE_FLOAT64), u64_(&b, 0x400921fb54442d18ull); /* pi */
    /* [[1, 2], [3]] */
    str_(&b, "t.nested"), u32_(&b, GGUF_TYPE_ARRAY), u32_(&b, GGUF_TYPE_ARRAY), u64_(&b, 2);
    u32_(&b, GGUF_TYPE_UINT32), u64_(&b, 2), u32_(&b, 1), u32_(&b, 2);
    u32_(&b, GGUF_TYPE_UINT32), u64_(&b, 1), u32_(&b, 3);
    /* [["x", "yy"], []] */
    str_(&b, "t.nested_str"), u32_(&b, GGUF_TYPE_ARRAY), u32_(&b, GGUF_TYPE_ARRAY), u64_(&b, 2);
    u32_(&b, GGUF_TYPE_STRING), u64_(&b, 2), str_(&b, "x"), str_(&b, "yy");
    u32_(&b, GGUF_TYPE_STRING), u64_(&b, 0);
    /* [[[true]]] */
    str_(&b, "t.deep"), u32_(&b, GGUF_TYPE_ARRAY), u32_(&b, GGUF_TYPE_ARRAY), u64_(&b, 1);
    u32_(&b, GGUF_TYPE_ARRAY), u64_(&b, 1), u32_(&b, GGUF_TYPE_BOOL), u64_(&b, 1), u8_(&b, 1);
    str_(&b, "t.f64big"), u32_(&b, GGUF_TYPE_FLOAT64), u64_(&b, 0x7fefffffffffffffull);
    size_t kv_end = b.n;

    muser_error err = {0};
    gguf_file *f = NULL;
    CHECK_OK(open_bytes(&b, "types", &f, &err), &err);
    if (f) {
        uint32_t u32;
        uint64_t u64;
        float f32;
        bool bo = true;
        gguf_str s;
        CHECK(gguf_get_u32(f, "t.u8", &u32, &err) == 0 && u32 == 255);
        CHECK(gguf_find_kv(f, "t.i8")->v.i == -5);
        CHECK(gguf_get_u32(f, "t.i8", &u32, &err) == MUSER_E_FORMAT); /* negative */
        CHECK(gguf_get_u32(f, "t.u16", &u32, &err) == 0 && u32 == 65535);
        CHECK(gguf_find_kv(f, "t.i16")->v.i == -300);
        CHECK(gguf_get_u32(f, "t.u32", &u32, &err) == 0 && u32 == 4000000000u);
        CHECK(gguf_get_u32(f, "t.i32", &u32, &err) == 0 && u32 == 7);
        CHECK(gguf_get_f32(f, "t.f32", &f32, &err) == 0 && f32 == 1.5f);
        CHECK(gguf_get_bool(f, "t.bool", &bo, &err) == 0 && !bo);
        CHECK(gguf_get_str(f, "t.str", &s, &err) == 0 && gguf_str_eq(s, "glimmer"));
        CHECK(gguf_get_u64(f, "t.u64", &u64, &err) == 0 && u64 == UINT64_MAX);
        CHECK(gguf_get_u32(f, "t.u64", &u32, &err) == MUSER_E_FORMAT);
        CHECK(gguf_find_kv(f, "t.i64")->v.i == INT64_MIN);
        CHECK(gguf_get_u64(f, "t.i64", &u64, &err) == MUSER_E_FORMAT);
        CHECK(gguf_get_f32(f, "t.f64", &f32, &err) == 0 && f32 == 3.14159265f);
        CHECK(gguf_get_f32(f, "t.f64big", &f32, &err) == MUSER_E_FORMAT);
        CHECK(strstr(err.msg, "out of float range") != NULL);
        const gguf_kv *kv = gguf_find_kv(f, "t.nested");
        CHECK(kv && kv->arr_type == GGUF_TYPE_ARRAY && kv->arr_n == 2 && !kv->arr_str_off);
        kv = gguf_find_kv(f, "t.nested_str");
        CHECK(kv && kv->arr_type == GGUF_TYPE_ARRAY && kv->arr_n == 2);
        CHECK(f->n_tensors == 0 && f->alignment == 32);

        /* copy every pair through the writer: the metadata bytes must come back identical */
        char path[64];
        snprintf(path, sizeof path, "test_gguf_bytes_%d.gguf", (int)getpid());
        gguf_writer *w = gguf_writer_new(0);
        for (uint64_t i = 0; i < f->n_kv; i++)
            CHECKF(gguf_writer_copy_kv(w, &f->kv[i]) == 0, "copy kv %llu", (unsigned long long)i);
        CHECK_OK(gguf_writer_begin(w, path, &err), &err);
        CHECK_OK(gguf_writer_finish(w, &err), &err);
        gguf_writer_free(w);
        gguf_file *g = NULL;
        CHECK_OK(gguf_open(&g, path, &err), &err);
        CHECK(g && g->size >= kv_end && memcmp(g->map + 24, b.p + 24, kv_end - 24) == 0);
        gguf_close(g);
        unlink(path);
    }
    close_bytes(f);
    free(b.p);
}

static void malformed(void)
{
    bb b = {0};
    const int FMT = MUSER_E_FORMAT, UNS = MUSER_E_UNSUPPORTED;

    b.n = 0;
    expect_fail("empty", &b, FMT, 0, "empty file");
    make_valid(&b, 3);
    b.p[3] = 'X';
    expect_fail("magic", &b, FMT, 0, "bad magic");
    make_valid(&b, 1);
    expect_fail("v1", &b, UNS, 4, "unsupported GGUF version 1");
    make_valid(&b, 4);
    expect_fail("v4", &b, UNS, 4, "unsupported GGUF version 4");
    make_valid(&b, 0x03000000);
    expect_fail("bigendian", &b, UNS, 4, "big-endian");
    hdr(&b, 3, 0, 0);
    b.n = 10;
    expect_fail("short_header", &b, FMT, 8, "truncated header tensor count");
    hdr(&b, 3, 0, 1000);
    zeros(&b, 100);
    expect_fail("n_kv", &b, FMT, 16, "key-value count 1000 cannot fit");
    hdr(&b, 3, 1000, 0);
    zeros(&b, 100);
    expect_fail("n_tensors", &b, FMT, 8, "tensor count 1000 cannot fit");
    hdr(&b, 3, 0, UINT64_MAX);
    zeros(&b, 100);
    expect_fail("n_kv_max", &b, FMT, 16, "cannot fit");

    /* strings */
    hdr(&b, 3, 0, 1);
    u64_(&b, 1000);
    put(&b, "abcdefghij", 10);
    expect_fail("key_len", &b, FMT, 24, "key length 1000 is larger than the 10 bytes left");
    hdr(&b, 3, 0, 1);
    u64_(&b, UINT64_MAX);
    zeros(&b, 10);
    expect_fail("key_len_max", &b, FMT, 24, "larger than the 10 bytes left");
    hdr(&b, 3, 0, 1);
    str_(&b, "k"), u32_(&b, GGUF_TYPE_STRING), u8_(&b, 5);
    expect_fail("str_prefix", &b, FMT, 37, "truncated string value");
    hdr(&b, 3, 0, 1);
    str_(&b, "k"), u32_(&b, GGUF_TYPE_STRING), u64_(&b, 100), put(&b, "x", 1);
    expect_fail("str_len", &b, FMT, 37, "string value length 100 is larger than the 1 bytes left");
    hdr(&b, 3, 0, 1);
    u64_(&b, 0), u32_(&b, GGUF_TYPE_UINT32), u32_(&b, 1);
    expect_fail("empty_key", &b, FMT, 24, "empty key");
    hdr(&b, 3, 0, 3);
    kv_u32(&b, "a", 1), kv_u32(&b, "b", 2);
    size_t at = b.n;
    kv_u32(&b, "a", 3);
    expect_fail("dup_key", &b, FMT, (long long)at, "duplicate key 'a'");

    /* values */
    hdr(&b, 3, 0, 1);
    str_(&b, "k"), u32_(&b, 13), u32_(&b, 0);
    expect_fail("value_type", &b, FMT, 33, "key 'k': unknown value type 13");
    hdr(&b, 3, 0, 1);
    str_(&b, "k"), u32_(&b, GGUF_TYPE_BOOL), u8_(&b, 2);
    expect_fail("bool", &b, FMT, 37, "bool value 2 is not 0 or 1");
    hdr(&b, 3, 0, 1);
    str_(&b, "k"), u32_(&b, GGUF_TYPE_UINT64), u32_(&b, 0), u8_(&b, 0);
    expect_fail("u64_short", &b, FMT, 37, "truncated value");
    hdr(&b, 3, 0, 1);
    str_(&b, "k"), u32_(&b, GGUF_TYPE_ARRAY), u32_(&b, 77), u64_(&b, 0);
    expect_fail("arr_type", &b, FMT, 37, "unknown array element type 77");
    hdr(&b, 3, 0, 1);
    str_(&b, "k"), u32_(&b, GGUF_TYPE_ARRAY), u32_(&b, GGUF_TYPE_UINT32), u64_(&b, 1000);
    zeros(&b, 8);
    expect_fail("arr_len", &b, FMT, 37, "array of 1000 uint32 is larger than the 8 bytes left");
    hdr(&b, 3, 0, 1);
    str_(&b, "k"), u32_(&b, GGUF_TYPE_ARRAY), u32_(&b, GGUF_TYPE_UINT64),
        u64_(&b, UINT64_MAX / 4);
    zeros(&b, 8);
    expect_fail("arr_len_wrap", &b, FMT, 37, "is larger than the 8 bytes left");
    hdr(&b, 3, 0, 1);
    str_(&b, "k"), u32_(&b, GGUF_TYPE_ARRAY), u32_(&b, GGUF_TYPE_BOOL), u64_(&b, 3);
    u8_(&b, 1), u8_(&b, 0), u8_(&b, 5);
    expect_fail("bool_arr", &b, FMT, 51, "bool array element 2 is 5");
    hdr(&b, 3, 0, 1);
    str_(&b, "k"), u32_(&b, GGUF_TYPE_ARRAY), u32_(&b, GGUF_TYPE_STRING), u64_(&b, 5);
    zeros(&b, 16);
    expect_fail("arr_str_n", &b, FMT, 37, "array of 5 strings is larger than the 16 bytes left");
    hdr(&b, 3, 0, 1);
    str_(&b, "k"), u32_(&b, GGUF_TYPE_ARRAY), u32_(&b, GGUF_TYPE_STRING), u64_(&b, 2);
    str_(&b, "ab"), u64_(&b, 99), put(&b, "cd", 2);
    expect_fail("arr_str_len", &b, FMT, 59, "array string length 99 is larger than the 2 bytes");
    hdr(&b, 3, 0, 1);
    str_(&b, "k"), u32_(&b, GGUF_TYPE_ARRAY);
    for (int d = 0; d < 9; d++)
        u32_(&b, GGUF_TYPE_ARRAY), u64_(&b, 1);
    u32_(&b, GGUF_TYPE_UINT8), u64_(&b, 0);
    expect_fail("nest_depth", &b, FMT, 37 + 12 * 7, "arrays nested deeper than 8");
    b.n = 37;
    for (int d = 0; d < 7; d++) /* 8 levels: allowed */
        u32_(&b, GGUF_TYPE_ARRAY), u64_(&b, 1);
    u32_(&b, GGUF_TYPE_UINT8), u64_(&b, 1), u8_(&b, 9);
    expect_ok("nest_depth_ok", &b);
    hdr(&b, 3, 0, 1);
    str_(&b, "k"), u32_(&b, GGUF_TYPE_ARRAY), u32_(&b, GGUF_TYPE_ARRAY), u64_(&b, 3);
    zeros(&b, 24);
    expect_fail("nest_n", &b, FMT, 37, "array of 3 arrays is larger than the 24 bytes left");
    hdr(&b, 3, 0, 1);
    str_(&b, "k"), u32_(&b, GGUF_TYPE_ARRAY), u32_(&b, GGUF_TYPE_ARRAY), u64_(&b, 1);
    u32_(&b, GGUF_TYPE_UINT32), u64_(&b, 3), u32_(&b, 1);
    zeros(&b, 4);
    expect_fail("nest_inner", &b, FMT, 49, "array of 3 uint32 is larger than the 8 bytes left");

    /* alignment */
    hdr(&b, 3, 0, 1);
    str_(&b, "general.alignment"), u32_(&b, GGUF_TYPE_UINT64), u64_(&b, 64);
    expect_fail("align_type", &b, FMT, 24, "general.alignment has type uint64 (must be uint32)");
    hdr(&b, 3, 0, 1);
    kv_u32(&b, "general.alignment", 0);
    expect_fail("align_0", &b, FMT, 24, "general.alignment 0 is not a nonzero power of two");
    hdr(&b, 3, 0, 1);
    kv_u32(&b, "general.alignment", 48);
    expect_fail("align_48", &b, FMT, 24, "general.alignment 48 is not a nonzero power of two");
    hdr(&b, 3, 1, 1);
    kv_u32(&b, "general.alignment", 1u << 31);
    tinfo(&b, "w", 1, (uint64_t[]){4}, 0, 0);
    expect_fail("align_big", &b, FMT, -1, "data section would start at byte 2147483648");

    /* tensor infos: header, one kv, then the info under test */
#define T1(label, name, nd, ne, type, off)   \
    hdr(&b, 3, 1, 1);                        \
    kv_u32(&b, "x", 1);                      \
    at = b.n;                                \
    tinfo(&b, name, nd, ne, type, off);      \
    pad_to(&b, 32);                          \
    zeros(&b, 256)
    size_t dims_at;
    T1("dims0", "w", 0, (uint64_t[]){0}, 0, 0);
    dims_at = at + 8 + 1;
    expect_fail("dims0", &b, FMT, (long long)dims_at, "tensor 'w' has 0 dimensions");
    T1("dims5", "w", 5, ((uint64_t[]){1, 1, 1, 1, 1}), 0, 0);
    expect_fail("dims5", &b, FMT, (long long)dims_at, "tensor 'w' has 5 dimensions");
    T1("ne0", "w", 2, ((uint64_t[]){4, 0}), 0, 0);
    expect_fail("ne_zero", &b, FMT, (long long)(dims_at + 4 + 8), "ne[1] = 0");
    T1("nebig", "w", 1, ((uint64_t[]){UINT64_MAX}), 0, 0);
    expect_fail("ne_big", &b, FMT, (long long)(dims_at + 4), "ne[0] = 18446744073709551615");
    T1("nel", "w", 2, ((uint64_t[]){1ull << 32, 1ull << 32}), 0, 0);
    expect_fail("nelem_overflow", &b, FMT, (long long)dims_at, "overflows");
    T1("bytes", "w", 1, ((uint64_t[]){1ull << 62}), 0, 0);
    expect_fail("bytes_overflow", &b, FMT, (long long)dims_at, "overflows");
    T1("bytes4", "w", 4, ((uint64_t[]){1ull << 20, 1ull << 20, 1ull << 20, 1ull << 3}), 30, 0);
    expect_fail("bytes_overflow_4d", &b, FMT, (long long)dims_at, "overflows");
    T1("block", "w", 1, ((uint64_t[]){100}), 12, 0);
    expect_fail("block", &b, FMT, (long long)dims_at,
                "ne[0] = 100 is not a multiple of the block size 256");
    T1("type", "w", 1, ((uint64_t[]){4}), 4, 0);
    expect_fail("type_removed", &b, UNS, (long long)(dims_at + 12), "unknown ggml type id 4");
    T1("type", "w", 1, ((uint64_t[]){4}), 99, 0);
    expect_fail("type_99", &b, UNS, (long long)(dims_at + 12), "unknown ggml type id 99");
    T1("off", "w", 1, ((uint64_t[]){4}), 0, 4);
    expect_fail("offset_align", &b, FMT, (long long)(dims_at + 16),
                "offset 4 is not a multiple of the alignment 32");
    T1("past", "w", 1, ((uint64_t[]){128}), 0, 0);
    expect_fail("past_end", &b, FMT, -1, "(512 bytes at data offset 0) extends past the end");
    T1("past2", "w", 1, ((uint64_t[]){4}), 0, 1ull << 63);
    expect_fail("offset_huge", &b, FMT, -1, "extends past the end");
    char long_name[129];
    memset(long_name, 'n', 128);
    long_name[128] = 0;
    T1("long", long_name, 1, ((uint64_t[]){4}), 0, 0);
    expect_fail("name_long", &b, FMT, (long long)at, "is 128 bytes (limit 127)");
    T1("empty", "", 1, ((uint64_t[]){4}), 0, 0);
    expect_fail("name_empty", &b, FMT, (long long)at, "empty tensor name");
    T1("nul", "ab", 1, ((uint64_t[]){4}), 0, 0);
    b.p[at + 9] = 0;
    expect_fail("name_nul", &b, FMT, (long long)at, "contains a NUL byte");
    T1("short", "wwwwwwwwwwwwwwwwwwww", 2, ((uint64_t[]){4, 4}), 0, 0);
    b.n = at + 8 + 20 + 4 + 5; /* inside ne[0]; long name so the tensor count looks plausible */
    expect_fail("info_truncated", &b, FMT, (long long)(at + 8 + 20 + 4),
                "truncated tensor dimension");
    /* data section start past the end: info ends unaligned and the file ends there */
    T1("nodata", "w", 1, ((uint64_t[]){4}), 0, 0);
    b.n = at + 8 + 1 + 4 + 8 + 4 + 8;
    expect_fail("no_data", &b, FMT, (long long)b.n, "data section would start");
#undef T1

    /* two tensors */
    hdr(&b, 3, 2, 0);
    tinfo(&b, "a", 1, (uint64_t[]){16}, 0, 0);
    tinfo(&b, "b", 1, (uint64_t[]){8}, 0, 32);
    pad_to(&b, 32);
    size_t data = b.n;
    zeros(&b, 128);
    expect_fail("overlap", &b, FMT, (long long)(data + 32),
                "tensor 'b' (data offset 32) overlaps tensor 'a' (data offset 0, 64 bytes)");
    hdr(&b, 3, 2, 0);
    tinfo(&b, "b", 1, (uint64_t[]){8}, 0, 32);
    tinfo(&b, "a", 1, (uint64_t[]){16}, 0, 0); /* declared out of order: still caught */
    pad_to(&b, 32);
    zeros(&b, 128);
    expect_fail("overlap_unsorted", &b, FMT, -1, "overlaps tensor 'a'");
    hdr(&b, 3, 2, 0);
    tinfo(&b, "a", 1, (uint64_t[]){4}, 0, 0);
    tinfo(&b, "a", 1, (uint64_t[]){4}, 0, 32);
    pad_to(&b, 32);
    zeros(&b, 64);
    expect_fail("dup_tensor", &b, FMT, -1, "duplicate tensor name 'a'");
    hdr(&b, 3, 2, 0);
    tinfo(&b, "a", 1, (uint64_t[]){4}, 0, 32);
    tinfo(&b, "b", 1, (uint64_t[]){4}, 0, 0); /* reversed order, no overlap: fine */
    pad_to(&b, 32);
    zeros(&b, 64);
    expect_ok("reversed_ok", &b);

    /* accepted variants */
    make_valid(&b, 2);
    expect_ok("v2", &b);
    hdr(&b, 3, 0, 1);
    kv_u32(&b, "k", 1); /* no tensors, no padding */
    expect_ok("no_tensors_unpadded", &b);
    hdr(&b, 3, 0, 0);
    expect_ok("header_only", &b);
    free(b.p);
}

/* Every prefix of a valid file shorter than the end of its last tensor must fail cleanly; the
 * rest (only trailing padding missing) must open. */
static void truncations(void)
{
    bb b = {0};
    size_t end = make_valid(&b, 3);
    int fails = 0, oks = 0;
    for (size_t n = 0; n <= b.n; n++) {
        bb t = {b.p, n, n};
        muser_error err = {0};
        gguf_file *f = NULL;
        int rc = open_bytes(&t, "trunc", &f, &err);
        if (n < end) {
            CHECKF(rc == MUSER_E_FORMAT && f == NULL && strncmp(err.msg, "trunc: byte ", 12) == 0,
                   "prefix %zu: rc %d msg '%s'", n, rc, err.msg);
            fails += rc != 0;
        } else {
            CHECKF(rc == 0, "prefix %zu: %s", n, err.msg);
            oks += rc == 0;
            if (f)
                walk(f);
        }
        close_bytes(f);
    }
    CHECK(fails == (int)end && oks == (int)(b.n - end + 1));
    free(b.p);
}

/* Change each byte to a few values: never a crash; bytes inside tensor data are opaque so
 * those files must still open. */
static void corruptions(void)
{
    bb b = {0};
    make_valid(&b, 3);
    muser_error err = {0};
    gguf_file *f = NULL;
    CHECK_OK(open_bytes(&b, "base", &f, &err), &err);
    uint64_t data_offset = f ? f->data_offset : 0;
    close_bytes(f);
    int opened = 0, rejected = 0;
    for (size_t i = 0; i < b.n; i++) {
        uint8_t orig = b.p[i];
        const uint8_t vals[] = {0x00, 0xff, 0x80, 0x7f, (uint8_t)(orig ^ 1), (uint8_t)(orig + 1),
                                (uint8_t)(orig - 1), 0x20};
        for (size_t v = 0; v < sizeof vals; v++) {
            if (vals[v] == orig)
                continue;
            b.p[i] = vals[v];
            f = NULL;
            int rc = open_bytes(&b, "flip", &f, &err);
            if (rc == 0) {
                walk(f);
                opened++;
            } else {
                CHECKF(strncmp(err.msg, "flip: byte ", 11) == 0, "byte %zu: '%s'", i, err.msg);
                rejected++;
            }
            if (i >= data_offset)
                CHECKF(rc == 0, "flip in data at byte %zu rejected: %s", i, err.msg);
            close_bytes(f);
        }
        b.p[i] = orig;
    }
    CHECK(opened > 0 && rejected > 0);
    free(b.p);
}

int main(void)
{
    every_value_type();
    malformed();
    truncations();
    corruptions();
    return check_report("test_gguf_bytes");
}
