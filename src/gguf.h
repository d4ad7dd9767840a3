/* gguf.h — GGUF v2/v3 reader (mmap, zero-copy, every field validated) and streaming writer.
 *
 * Reader: gguf_open maps the file read-only. Keys, strings and tensor data point into the map;
 * nothing is copied. Every count, length, offset and size is checked against the bytes left
 * before use, and an error names the file, the byte offset and what was wrong.
 *
 * Writer: declare metadata and tensor infos, then gguf_writer_begin writes the header, and the
 * tensors' bytes are streamed in declaration order with gguf_writer_tensor_data (so a 16 GB model
 * never has to sit in memory). */
#ifndef MUSER_GGUF_H
#define MUSER_GGUF_H

#include "muser.h"

#define GGUF_MAX_DIMS 4
#define GGUF_DEFAULT_ALIGNMENT 32

/* Metadata value types (GGUF spec numbering). */
enum gguf_value_type {
    GGUF_TYPE_UINT8 = 0,
    GGUF_TYPE_INT8 = 1,
    GGUF_TYPE_UINT16 = 2,
    GGUF_TYPE_INT16 = 3,
    GGUF_TYPE_UINT32 = 4,
    GGUF_TYPE_INT32 = 5,
    GGUF_TYPE_FLOAT32 = 6,
    GGUF_TYPE_BOOL = 7,
    GGUF_TYPE_STRING = 8,
    GGUF_TYPE_ARRAY = 9,
    GGUF_TYPE_UINT64 = 10,
    GGUF_TYPE_INT64 = 11,
    GGUF_TYPE_FLOAT64 = 12,
    GGUF_TYPE_COUNT = 13,
};

/* A string inside the map: not NUL-terminated. */
typedef struct gguf_str {
    const char *ptr;
    uint64_t len;
} gguf_str;

typedef struct gguf_kv {
    gguf_str key;
    uint32_t type;          /* enum gguf_value_type */
    uint64_t offset;        /* byte offset of the key in the file, for error messages */
    union {                 /* scalars: integers widened, floats as double, bool as 0/1 */
        uint64_t u;
        int64_t i;
        double f;
    } v;
    gguf_str str;           /* type == STRING */
    uint32_t arr_type;      /* type == ARRAY: element type (may itself be ARRAY: nested) */
    uint64_t arr_n;         /* number of elements */
    const uint8_t *arr_data;/* first element's bytes in the map */
    uint64_t *arr_str_off;  /* arr_type == STRING: offset of element i's length prefix from
                               arr_data (owned by the reader); NULL otherwise */
} gguf_kv;

typedef struct gguf_tensor {
    gguf_str name;
    char name_z[128];       /* NUL-terminated copy of name (names are limited to 127 bytes) */
    uint32_t n_dims;
    uint64_t ne[GGUF_MAX_DIMS]; /* ne[0] is the contiguous dimension; unused dims are 1 */
    uint32_t type;          /* ggml type id (quant.h) */
    uint64_t offset;        /* relative to the data section */
    uint64_t nbytes;
    const void *data;       /* in the map */
} gguf_tensor;

typedef struct gguf_file {
    char path[256];         /* for messages ("<memory>" for gguf_open_memory) */
    const uint8_t *map;
    uint64_t size;
    bool owns_map;          /* munmap on close */
    uint32_t version;
    uint64_t alignment;
    uint64_t data_offset;   /* start of the tensor data section */
    uint64_t n_kv;
    gguf_kv *kv;
    uint64_t n_tensors;
    gguf_tensor *tensors;
} gguf_file;

int gguf_open(gguf_file **out, const char *path, muser_error *err);
/* Parse a buffer the caller keeps alive (fuzzing, tests). */
int gguf_open_memory(gguf_file **out, const void *data, size_t size, const char *label,
                     muser_error *err);
void gguf_close(gguf_file *f);

const gguf_kv *gguf_find_kv(const gguf_file *f, const char *key);
const gguf_tensor *gguf_find_tensor(const gguf_file *f, const char *name);
const char *gguf_type_name(uint32_t value_type);

/* Typed getters: MUSER_E_FORMAT naming the key when present with the wrong type or out of range;
 * MUSER_E_SHAPE ("missing key") when absent. Integer getters accept any integer type whose value
 * fits; float getters accept FLOAT32/FLOAT64. */
int gguf_get_u32(const gguf_file *f, const char *key, uint32_t *out, muser_error *err);
int gguf_get_u64(const gguf_file *f, const char *key, uint64_t *out, muser_error *err);
int gguf_get_f32(const gguf_file *f, const char *key, float *out, muser_error *err);
int gguf_get_bool(const gguf_file *f, const char *key, bool *out, muser_error *err);
int gguf_get_str(const gguf_file *f, const char *key, gguf_str *out, muser_error *err);
/* Array of elem_type (checked): n and a pointer to the raw little-endian elements. */
int gguf_get_arr(const gguf_file *f, const char *key, uint32_t elem_type, uint64_t *n,
                 const void **data, muser_error *err);
/* Element i of a string array (kv->arr_type == STRING, i < arr_n). */
gguf_str gguf_arr_str(const gguf_kv *kv, uint64_t i);
/* Compare a gguf_str with a C string. */
bool gguf_str_eq(gguf_str s, const char *c);

/* ---- writer ---- */
typedef struct gguf_writer gguf_writer;

gguf_writer *gguf_writer_new(uint32_t alignment); /* 0 = default 32 */
void gguf_writer_free(gguf_writer *w);
/* Metadata, in insertion order; values are copied. Re-setting a key replaces it. */
int gguf_writer_set_u32(gguf_writer *w, const char *key, uint32_t v);
int gguf_writer_set_i32(gguf_writer *w, const char *key, int32_t v);
int gguf_writer_set_u64(gguf_writer *w, const char *key, uint64_t v);
int gguf_writer_set_f32(gguf_writer *w, const char *key, float v);
int gguf_writer_set_bool(gguf_writer *w, const char *key, bool v);
int gguf_writer_set_str(gguf_writer *w, const char *key, const char *v);
/* Array of fixed-size elements (elem_type not STRING/ARRAY). */
int gguf_writer_set_arr(gguf_writer *w, const char *key, uint32_t elem_type, const void *data,
                        uint64_t n);
int gguf_writer_set_arr_str(gguf_writer *w, const char *key, const char *const *strs,
                            const uint64_t *lens /* NULL: strlen */, uint64_t n);
/* Copy one key-value pair from a reader (used by quantize). */
int gguf_writer_copy_kv(gguf_writer *w, const gguf_kv *kv);
/* Declare a tensor; its bytes (quant row size x rows) come later, in declaration order. */
int gguf_writer_add_tensor(gguf_writer *w, const char *name, uint32_t type, uint32_t n_dims,
                           const uint64_t *ne, muser_error *err);
/* Open path and write header, metadata and tensor infos. */
int gguf_writer_begin(gguf_writer *w, const char *path, muser_error *err);
/* Bytes of the next declared tensor (may be called several times per tensor; the writer pads
 * to alignment once a tensor's declared size is complete). */
int gguf_writer_tensor_data(gguf_writer *w, const void *data, uint64_t nbytes, muser_error *err);
/* Check every tensor was written in full; flush and close. */
int gguf_writer_finish(gguf_writer *w, muser_error *err);

#endif
