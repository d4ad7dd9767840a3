/* fuzz_gguf.c — libFuzzer entry for the GGUF reader: parse the input with gguf_open_memory and,
 * when it is accepted, touch everything a consumer could (every key through lookup and every
 * getter, every string-array element, the first and last byte of every tensor) and copy every
 * pair through the writer. Any read outside the input is an ASan report; a broken invariant
 * (lookup finding another entry, tensor bytes outside the buffer, an error message without the
 * "<label>: " prefix) aborts. Built by scripts/fuzz.sh. */
#include "gguf.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static volatile unsigned sink;

static void fail(const char *what)
{
    fprintf(stderr, "fuzz_gguf: invariant broken: %s\n", what);
    abort();
}

static void walk_kv(const gguf_file *f, const gguf_kv *kv, gguf_writer *w)
{
    char key[256];
    muser_error err;
    if (kv->key.len == 0)
        fail("empty key accepted");
    if (kv->key.len < sizeof key && !memchr(kv->key.ptr, 0, kv->key.len)) {
        memcpy(key, kv->key.ptr, kv->key.len);
        key[kv->key.len] = 0;
        if (gguf_find_kv(f, key) != kv)
            fail("gguf_find_kv returned another pair (duplicate key accepted?)");
        uint32_t u32;
        uint64_t u64, n;
        float f32;
        bool b;
        gguf_str s;
        const void *p;
        sink += (unsigned)gguf_get_u32(f, key, &u32, &err);
        sink += (unsigned)gguf_get_u64(f, key, &u64, &err);
        sink += (unsigned)gguf_get_f32(f, key, &f32, &err);
        sink += (unsigned)gguf_get_bool(f, key, &b, &err);
        if (gguf_get_str(f, key, &s, &err) == 0 && s.len)
            sink += (unsigned char)s.ptr[0] + (unsigned char)s.ptr[s.len - 1];
        if (kv->type == GGUF_TYPE_ARRAY &&
            gguf_get_arr(f, key, kv->arr_type, &n, &p, &err) == 0 && n != kv->arr_n)
            fail("gguf_get_arr count");
        if (gguf_writer_copy_kv(w, kv) != 0)
            fail("gguf_writer_copy_kv refused an accepted pair");
    }
    sink += (unsigned)strlen(gguf_type_name(kv->type));
    if (kv->type == GGUF_TYPE_ARRAY && kv->arr_type == GGUF_TYPE_STRING)
        for (uint64_t i = 0; i < kv->arr_n; i++) {
            gguf_str s = gguf_arr_str(kv, i);
            if (s.len)
                sink += (unsigned char)s.ptr[0] + (unsigned char)s.ptr[s.len - 1];
        }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    gguf_file *f = NULL;
    muser_error err = {0};
    if (gguf_open_memory(&f, data, size, "fuzz", &err) != 0) {
        if (f != NULL || strncmp(err.msg, "fuzz: ", 6) != 0)
            fail("error without the label prefix, or a file returned on error");
        return 0;
    }
    gguf_writer *w = gguf_writer_new(0);
    for (uint64_t i = 0; i < f->n_kv; i++)
        walk_kv(f, &f->kv[i], w);
    gguf_writer_free(w);
    for (uint64_t i = 0; i < f->n_tensors; i++) {
        const gguf_tensor *t = &f->tensors[i];
        const uint8_t *d = t->data;
        if (t->nbytes == 0 || d < data || d + t->nbytes > data + size)
            fail("tensor bytes outside the input");
        sink += d[0] + d[t->nbytes - 1];
        if (gguf_find_tensor(f, t->name_z) != t)
            fail("gguf_find_tensor returned another tensor");
    }
    gguf_close(f);
    return 0;
}
