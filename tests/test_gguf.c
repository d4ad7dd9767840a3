/* test_gguf.c — the GGUF writer and reader against each other: every value type and several
 * tensor types round-trip through a file; key replacement, getters' type and range errors, the
 * writer's own refusals, gguf_open on missing/empty/odd files. The malformed-file set lives in
 * test_gguf_malformed.c. */
#include "check.h"
#include "gguf.h"

#include <math.h>
#include <stdint.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define GGML_F32 0
#define GGML_F16 1
#define GGML_Q8_0 8
#define GGML_Q4_K 12
#define GGML_Q6_K 14
#define GGML_BF16 30

typedef struct tdesc {
    const char *name;
    uint32_t type, n_dims;
    uint64_t ne[4];
    uint64_t nbytes;
} tdesc;

static const tdesc tensors[] = {
    {"token_embd.weight", GGML_F32, 2, {3, 2}, 24},
    {"blk.0.attn_q.weight", GGML_Q8_0, 2, {64, 3}, 2 * 34 * 3},
    {"blk.0.ffn_down.weight", GGML_Q4_K, 1, {256}, 144},
    {"blk.0.ffn_up.weight", GGML_Q6_K, 3, {512, 1, 2}, 2 * 210 * 2},
    {"output_norm.weight", GGML_F16, 1, {5}, 10},
    {"output.weight", GGML_BF16, 4, {2, 1, 1, 3}, 12},
};
#define N_TENSORS (sizeof tensors / sizeof tensors[0])

static uint8_t pattern(uint64_t t, uint64_t i)
{
    return (uint8_t)(t * 37 + i * 11 + (i >> 8));
}

static char path_a[256], path_b[256];

/* Write a file with every value type the writer has a setter for and the tensors above. */
static void write_file(const char *path, uint32_t alignment, muser_error *err)
{
    gguf_writer *w = gguf_writer_new(alignment);
    CHECK(w != NULL);
    if (!w)
        return;
    CHECK(gguf_writer_set_str(w, "general.architecture", "muse") == 0);
    CHECK(gguf_writer_set_u32(w, "muse.block_count", 7) == 0);
    CHECK(gguf_writer_set_i32(w, "test.i32", -123456) == 0);
    CHECK(gguf_writer_set_u64(w, "test.u64", UINT64_C(0xfedcba9876543210)) == 0);
    CHECK(gguf_writer_set_f32(w, "test.f32", 1e-5f) == 0);
    CHECK(gguf_writer_set_bool(w, "test.bool", true) == 0);
    CHECK(gguf_writer_set_str(w, "test.empty", "") == 0);
    CHECK(gguf_writer_set_u32(w, "test.replaced", 1) == 0);
    uint8_t u8s[] = {0, 1, 255};
    int8_t i8s[] = {-128, 0, 127};
    uint16_t u16s[] = {0, 65535};
    int16_t i16s[] = {-32768, 32767};
    uint32_t u32s[] = {1, 2, 3, 4};
    int32_t i32s[] = {INT32_MIN, -1, INT32_MAX};
    float f32s[] = {0.5f, -2.25f, 1e30f};
    uint8_t bools[] = {1, 0, 1};
    uint64_t u64s[] = {UINT64_MAX, 0};
    int64_t i64s[] = {INT64_MIN, INT64_MAX};
    double f64s[] = {3.141592653589793, -1e300};
    CHECK(gguf_writer_set_arr(w, "arr.u8", GGUF_TYPE_UINT8, u8s, 3) == 0);
    CHECK(gguf_writer_set_arr(w, "arr.i8", GGUF_TYPE_INT8, i8s, 3) == 0);
    CHECK(gguf_writer_set_arr(w, "arr.u16", GGUF_TYPE_UINT16, u16s, 2) == 0);
    CHECK(gguf_writer_set_arr(w, "arr.i16", GGUF_TYPE_INT16, i16s, 2) == 0);
    CHECK(gguf_writer_set_arr(w, "arr.u32", GGUF_TYPE_UINT32, u32s, 4) == 0);
    CHECK(gguf_writer_set_arr(w, "arr.i32", GGUF_TYPE_INT32, i32s, 3) == 0);
    CHECK(gguf_writer_set_arr(w, "arr.f32", GGUF_TYPE_FLOAT32, f32s, 3) == 0);
    CHECK(gguf_writer_set_arr(w, "arr.bool", GGUF_TYPE_BOOL, bools, 3) == 0);
    CHECK(gguf_writer_set_arr(w, "arr.u64", GGUF_TYPE_UINT64, u64s, 2) == 0);
    CHECK(gguf_writer_set_arr(w, "arr.i64", GGUF_TYPE_INT64, i64s, 2) == 0);
    CHECK(gguf_writer_set_arr(w, "arr.f64", GGUF_TYPE_FLOAT64, f64s, 2) == 0);
    CHECK(gguf_writer_set_arr(w, "arr.empty", GGUF_TYPE_UINT32, NULL, 0) == 0);
    const char *strs[] = {"hello", "", "a\0b", "\xc4\xa0world"};
    uint64_t lens[] = {5, 0, 3, 7};
    CHECK(gguf_writer_set_arr_str(w, "arr.str", strs, lens, 4) == 0);
    const char *strs2[] = {"x", "yz"};
    CHECK(gguf_writer_set_arr_str(w, "arr.str_strlen", strs2, NULL, 2) == 0);
    CHECK(gguf_writer_set_u32(w, "test.replaced", 2) == 0); /* replaces in place */
    /* refusals */
    CHECK(gguf_writer_set_u32(w, "", 1) == MUSER_E_ARG);
    CHECK(gguf_writer_set_arr(w, "bad", GGUF_TYPE_STRING, strs, 1) == MUSER_E_ARG);
    CHECK(gguf_writer_set_arr(w, "bad", GGUF_TYPE_BOOL, (uint8_t[]){2}, 1) == MUSER_E_ARG);
    CHECK(gguf_writer_set_u64(w, "general.alignment", 64) == MUSER_E_ARG); /* must be u32 */
    CHECK(gguf_writer_set_u32(w, "general.alignment", 48) == MUSER_E_ARG);

    for (size_t t = 0; t < N_TENSORS; t++)
        CHECK_OK(gguf_writer_add_tensor(w, tensors[t].name, tensors[t].type, tensors[t].n_dims,
                                        tensors[t].ne, err), err);
    CHECK(gguf_writer_add_tensor(w, "token_embd.weight", GGML_F32, 1, (uint64_t[]){1}, err) ==
          MUSER_E_ARG);
    CHECK(gguf_writer_add_tensor(w, "q", GGML_Q4_K, 1, (uint64_t[]){100}, err) == MUSER_E_ARG);
    CHECK(gguf_writer_add_tensor(w, "z", GGML_F32, 2, (uint64_t[]){4, 0}, err) == MUSER_E_ARG);
    CHECK(gguf_writer_add_tensor(w, "u", 4, 1, (uint64_t[]){4}, err) == MUSER_E_ARG);
    CHECK(gguf_writer_add_tensor(w, "d", GGML_F32, 5, (uint64_t[]){1, 1, 1, 1, 1}, err) ==
          MUSER_E_ARG);

    CHECK_OK(gguf_writer_begin(w, path, err), err);
    CHECK(gguf_writer_set_u32(w, "late", 1) == MUSER_E_ARG);
    /* Stream each tensor in uneven chunks. */
    for (size_t t = 0; t < N_TENSORS; t++) {
        uint8_t buf[2048];
        for (uint64_t i = 0; i < tensors[t].nbytes; i++)
            buf[i] = pattern(t, i);
        uint64_t done = 0, chunk = 7;
        while (done < tensors[t].nbytes) {
            uint64_t n = tensors[t].nbytes - done < chunk ? tensors[t].nbytes - done : chunk;
            CHECK_OK(gguf_writer_tensor_data(w, buf + done, n, err), err);
            done += n;
            chunk = chunk * 3 + 1;
        }
    }
    CHECK(gguf_writer_tensor_data(w, "x", 1, err) == MUSER_E_ARG); /* past the last tensor */
    CHECK_OK(gguf_writer_finish(w, err), err);
    gguf_writer_free(w);
}

static void check_arr(const gguf_file *f, const char *key, uint32_t type, const void *want,
                      uint64_t n, size_t elem)
{
    muser_error err = {0};
    uint64_t got_n = 0;
    const void *data = NULL;
    CHECK_OK(gguf_get_arr(f, key, type, &got_n, &data, &err), &err);
    CHECKF(got_n == n && data && memcmp(data, want, n * elem) == 0, "array %s", key);
}

static void read_and_check(const char *path, uint32_t alignment)
{
    muser_error err = {0};
    gguf_file *f = NULL;
    CHECK_OK(gguf_open(&f, path, &err), &err);
    if (!f)
        return;
    CHECK(f->version == 3);
    CHECK(f->alignment == alignment);
    CHECK(f->data_offset % alignment == 0);
    CHECK(f->owns_map);
    CHECK(f->n_kv == 22u + (alignment != 32));
    CHECK(f->n_tensors == N_TENSORS);

    gguf_str s;
    CHECK_OK(gguf_get_str(f, "general.architecture", &s, &err), &err);
    CHECK(gguf_str_eq(s, "muse"));
    /* the string points into the map: zero copy */
    CHECK((const uint8_t *)s.ptr > f->map && (const uint8_t *)s.ptr < f->map + f->size);
    uint32_t u32 = 0;
    CHECK_OK(gguf_get_u32(f, "muse.block_count", &u32, &err), &err);
    CHECK(u32 == 7);
    CHECK_OK(gguf_get_u32(f, "test.replaced", &u32, &err), &err);
    CHECK(u32 == 2);
    /* replaced keys keep their first position */
    CHECK(gguf_str_eq(f->kv[(alignment != 32) + 7].key, "test.replaced"));
    const gguf_kv *kv = gguf_find_kv(f, "test.i32");
    CHECK(kv && kv->type == GGUF_TYPE_INT32 && kv->v.i == -123456);
    uint64_t u64 = 0;
    CHECK_OK(gguf_get_u64(f, "test.u64", &u64, &err), &err);
    CHECK(u64 == UINT64_C(0xfedcba9876543210));
    float f32 = 0;
    CHECK_OK(gguf_get_f32(f, "test.f32", &f32, &err), &err);
    CHECK(f32 == 1e-5f);
    bool b = false;
    CHECK_OK(gguf_get_bool(f, "test.bool", &b, &err), &err);
    CHECK(b);
    CHECK_OK(gguf_get_str(f, "test.empty", &s, &err), &err);
    CHECK(s.len == 0 && gguf_str_eq(s, ""));

    /* getters: wrong type, missing key, out of range */
    CHECK(gguf_get_u32(f, "test.u64", &u32, &err) == MUSER_E_FORMAT);
    CHECK(strstr(err.msg, "test.u64") && strstr(err.msg, "out of range"));
    CHECK(gguf_get_u32(f, "test.i32", &u32, &err) == MUSER_E_FORMAT); /* negative */
    CHECK(gguf_get_u64(f, "muse.block_count", &u64, &err) == 0 && u64 == 7);
    CHECK(gguf_get_u32(f, "general.architecture", &u32, &err) == MUSER_E_FORMAT);
    CHECK(strstr(err.msg, "general.architecture") && strstr(err.msg, "string"));
    CHECK(gguf_get_u32(f, "no.such.key", &u32, &err) == MUSER_E_SHAPE);
    CHECK(strstr(err.msg, "missing key 'no.such.key'") != NULL);
    CHECK(gguf_get_f32(f, "muse.block_count", &f32, &err) == MUSER_E_FORMAT);
    CHECK(gguf_get_f32(f, "arr.f64", &f32, &err) == MUSER_E_FORMAT);
    CHECK(gguf_get_bool(f, "test.u64", &b, &err) == MUSER_E_FORMAT);
    CHECK(gguf_get_str(f, "test.bool", &s, &err) == MUSER_E_FORMAT);
    uint64_t n;
    const void *data;
    CHECK(gguf_get_arr(f, "arr.u8", GGUF_TYPE_INT8, &n, &data, &err) == MUSER_E_FORMAT);
    CHECK(strstr(err.msg, "array of uint8") != NULL);
    CHECK(gguf_get_arr(f, "test.u64", GGUF_TYPE_UINT64, &n, &data, &err) == MUSER_E_FORMAT);

    check_arr(f, "arr.u8", GGUF_TYPE_UINT8, (uint8_t[]){0, 1, 255}, 3, 1);
    check_arr(f, "arr.i8", GGUF_TYPE_INT8, (int8_t[]){-128, 0, 127}, 3, 1);
    check_arr(f, "arr.u16", GGUF_TYPE_UINT16, (uint16_t[]){0, 65535}, 2, 2);
    check_arr(f, "arr.i16", GGUF_TYPE_INT16, (int16_t[]){-32768, 32767}, 2, 2);
    check_arr(f, "arr.u32", GGUF_TYPE_UINT32, (uint32_t[]){1, 2, 3, 4}, 4, 4);
    check_arr(f, "arr.i32", GGUF_TYPE_INT32, (int32_t[]){INT32_MIN, -1, INT32_MAX}, 3, 4);
    check_arr(f, "arr.f32", GGUF_TYPE_FLOAT32, (float[]){0.5f, -2.25f, 1e30f}, 3, 4);
    check_arr(f, "arr.bool", GGUF_TYPE_BOOL, (uint8_t[]){1, 0, 1}, 3, 1);
    check_arr(f, "arr.u64", GGUF_TYPE_UINT64, (uint64_t[]){UINT64_MAX, 0}, 2, 8);
    check_arr(f, "arr.i64", GGUF_TYPE_INT64, (int64_t[]){INT64_MIN, INT64_MAX}, 2, 8);
    check_arr(f, "arr.f64", GGUF_TYPE_FLOAT64, (double[]){3.141592653589793, -1e300}, 2, 8);
    CHECK(gguf_get_arr(f, "arr.empty", GGUF_TYPE_UINT32, &n, &data, &err) == 0 && n == 0);

    kv = gguf_find_kv(f, "arr.str");
    CHECK(kv && kv->type == GGUF_TYPE_ARRAY && kv->arr_type == GGUF_TYPE_STRING &&
          kv->arr_n == 4 && kv->arr_str_off);
    if (kv && kv->arr_n == 4) {
        gguf_str e0 = gguf_arr_str(kv, 0), e1 = gguf_arr_str(kv, 1), e2 = gguf_arr_str(kv, 2),
                 e3 = gguf_arr_str(kv, 3), e4 = gguf_arr_str(kv, 4);
        CHECK(gguf_str_eq(e0, "hello"));
        CHECK(e1.len == 0);
        CHECK(e2.len == 3 && memcmp(e2.ptr, "a\0b", 3) == 0);
        CHECK(gguf_str_eq(e3, "\xc4\xa0world"));
        CHECK(e4.ptr == NULL && e4.len == 0); /* out of range */
    }
    kv = gguf_find_kv(f, "arr.str_strlen");
    CHECK(kv && gguf_str_eq(gguf_arr_str(kv, 1), "yz"));
    CHECK(gguf_arr_str(gguf_find_kv(f, "arr.u8"), 0).ptr == NULL); /* not a string array */

    uint64_t prev_end = 0;
    for (size_t t = 0; t < N_TENSORS; t++) {
        const gguf_tensor *ti = gguf_find_tensor(f, tensors[t].name);
        CHECKF(ti != NULL, "tensor %s", tensors[t].name);
        if (!ti)
            continue;
        CHECK(ti == &f->tensors[t]); /* declaration order kept */
        CHECK(ti->type == tensors[t].type && ti->n_dims == tensors[t].n_dims);
        for (uint32_t d = 0; d < 4; d++)
            CHECK(ti->ne[d] == (d < tensors[t].n_dims ? tensors[t].ne[d] : 1));
        CHECK(ti->nbytes == tensors[t].nbytes);
        CHECK(ti->offset % alignment == 0 && ti->offset >= prev_end);
        prev_end = ti->offset + ti->nbytes;
        CHECK((const uint8_t *)ti->data == f->map + f->data_offset + ti->offset);
        CHECK((uintptr_t)ti->data % alignment == 0);
        int bad = 0;
        for (uint64_t i = 0; i < ti->nbytes; i++)
            bad += ((const uint8_t *)ti->data)[i] != pattern(t, i);
        CHECKF(bad == 0, "tensor %s: %d bytes differ", tensors[t].name, bad);
    }
    CHECK(gguf_find_tensor(f, "nope") == NULL);
    CHECK(f->data_offset + prev_end <= f->size);

    /* copy every kv into a new writer and compare the files' metadata byte for byte */
    gguf_writer *w = gguf_writer_new(0);
    for (uint64_t i = 0; i < f->n_kv; i++)
        CHECK(gguf_writer_copy_kv(w, &f->kv[i]) == 0);
    CHECK_OK(gguf_writer_begin(w, path_b, &err), &err);
    CHECK_OK(gguf_writer_finish(w, &err), &err);
    gguf_writer_free(w);
    gguf_file *g = NULL;
    CHECK_OK(gguf_open(&g, path_b, &err), &err);
    if (g && f->n_tensors) {
        /* kv pairs follow the 24-byte header and end where the first tensor info starts */
        uint64_t kv_end = (uint64_t)((const uint8_t *)f->tensors[0].name.ptr - 8 - f->map);
        CHECK(g->n_kv == f->n_kv && g->n_tensors == 0 && g->alignment == alignment);
        CHECK(g->size >= kv_end && memcmp(g->map + 24, f->map + 24, kv_end - 24) == 0);
        CHECK(g->data_offset == ((kv_end + alignment - 1) & ~(uint64_t)(alignment - 1)));
        CHECK(g->size == g->data_offset); /* the writer pads even without tensors */
    }
    gguf_close(g);
    gguf_close(f);
}

static void writer_errors(void)
{
    muser_error err = {0};
    CHECK(gguf_writer_new(24) == NULL); /* not a power of two */
    gguf_writer *w = gguf_writer_new(0);
    CHECK_OK(gguf_writer_add_tensor(w, "a", GGML_F32, 1, (uint64_t[]){4}, &err), &err);
    CHECK_OK(gguf_writer_add_tensor(w, "b", GGML_F32, 1, (uint64_t[]){2}, &err), &err);
    /* alignment cannot change once offsets were laid out */
    CHECK(gguf_writer_set_u32(w, "general.alignment", 64) == MUSER_E_ARG);
    CHECK(gguf_writer_set_u32(w, "general.alignment", 32) == 0);
    CHECK(gguf_writer_tensor_data(w, "x", 1, &err) == MUSER_E_ARG); /* before begin */
    CHECK_OK(gguf_writer_begin(w, path_a, &err), &err);
    float four[4] = {1, 2, 3, 4};
    CHECK(gguf_writer_tensor_data(w, four, 20, &err) == MUSER_E_ARG); /* more than 'a' holds */
    CHECK(strstr(err.msg, "'a'") != NULL);
    CHECK_OK(gguf_writer_tensor_data(w, four, 16, &err), &err);
    CHECK(gguf_writer_finish(w, &err) == MUSER_E_ARG); /* 'b' missing */
    CHECK(strstr(err.msg, "'b'") && strstr(err.msg, "0 of 8"));
    gguf_writer_free(w);
    CHECK(access(path_a, F_OK) != 0); /* the partial file is removed */

    w = gguf_writer_new(0);
    CHECK(gguf_writer_begin(w, "/nonexistent-dir/x.gguf", &err) == MUSER_E_IO);
    CHECK(strstr(err.msg, "/nonexistent-dir/x.gguf") != NULL);
    gguf_writer_free(w);
}

static void open_errors(void)
{
    muser_error err = {0};
    gguf_file *f = (gguf_file *)1;
    CHECK(gguf_open(&f, "/nonexistent/model.gguf", &err) == MUSER_E_IO && f == NULL);
    CHECK(strstr(err.msg, "/nonexistent/model.gguf") != NULL);
    CHECK(gguf_open(&f, ".", &err) == MUSER_E_IO);
    FILE *fp = fopen(path_a, "wb");
    CHECK(fp != NULL);
    if (fp)
        fclose(fp);
    CHECK(gguf_open(&f, path_a, &err) == MUSER_E_FORMAT);
    CHECK(strstr(err.msg, "empty file") != NULL);
    fp = fopen(path_a, "wb");
    if (fp) {
        fputs("GGML this is not it", fp);
        fclose(fp);
    }
    CHECK(gguf_open(&f, path_a, &err) == MUSER_E_FORMAT);
    CHECK(strstr(err.msg, path_a) && strstr(err.msg, "byte 0: bad magic"));
    unlink(path_a);
}

int main(void)
{
    snprintf(path_a, sizeof path_a, "test_gguf_a_%d.gguf", (int)getpid());
    snprintf(path_b, sizeof path_b, "test_gguf_b_%d.gguf", (int)getpid());
    muser_error err = {0};
    write_file(path_a, 0, &err);
    read_and_check(path_a, 32);
    write_file(path_a, 64, &err);
    read_and_check(path_a, 64);
    write_file(path_a, 4096, &err);
    read_and_check(path_a, 4096);
    unlink(path_a);
    unlink(path_b);
    writer_errors();
    open_errors();
    CHECK(strcmp(gguf_type_name(GGUF_TYPE_FLOAT64), "float64") == 0);
    CHECK(strcmp(gguf_type_name(99), "unknown") == 0);
    return check_report("test_gguf");
}
