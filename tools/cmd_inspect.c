/* cmd_inspect.c — `muser inspect FILE [--json]`: describe a GGUF without loading the model.
 *
 * Sections: general (version, alignment, architecture, name), hyper-parameters (every
 * `<arch>.*` key), tokenizer summary (model, pre, token and merge counts, BOS/EOS), other
 * metadata, the tensor table (name, type, dims, bytes), totals per type and the grand total.
 * --json prints the same as one JSON object. Only the reader (gguf.c) touches the file, so a
 * corrupt file is a one-line error naming the byte offset, and nothing is read twice. */
#include "cli.h"
#include "gguf.h"
#include "quant.h"

#include <cjson/cJSON.h>
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

static const char *const usage_text =
    "usage: muser inspect [FILE | -m FILE] [--json]\n"
    "\n"
    "Describe a GGUF file: format version and alignment, architecture and name, every\n"
    "<arch>.* hyper-parameter, a tokenizer summary, other metadata, the tensor table\n"
    "(name, type, dims, bytes), totals per tensor type and the grand total.\n"
    "Without FILE: $MUSER_MODEL, else the default model.\n"
    "\n"
    "options:\n"
    "  -m, --model FILE  the GGUF to describe (same as the positional FILE)\n"
    "  --json            print one JSON object instead of text\n"
    "  -h, --help        this help\n"
    "\n"
    "exit status: 0 ok, 1 missing or corrupt file, 2 bad arguments\n";

/* ---- small helpers ---- */

static const char *type_name(uint32_t type, char buf[16])
{
    const quant_type_info *qi = quant_info(type);
    if (qi)
        return qi->name;
    snprintf(buf, 16, "type%" PRIu32, type);
    return buf;
}

static bool has_prefix(gguf_str s, const char *prefix)
{
    size_t n = strlen(prefix);
    return s.len >= n && memcmp(s.ptr, prefix, n) == 0;
}

/* The shortest %g text that reads back as the same value (f32 values as floats, so 1e-5f
 * prints as 1e-05, not 9.99999974737875e-06). */
static const char *fmt_real(double v, bool is_f32, char buf[40])
{
    for (int p = is_f32 ? 6 : 15; p <= (is_f32 ? 9 : 17); p++) {
        snprintf(buf, 40, "%.*g", p, v);
        if (is_f32 ? strtof(buf, NULL) == (float)v : strtod(buf, NULL) == v)
            break;
    }
    return buf;
}

/* Append printf output to a bounded buffer. */
typedef struct sbuf {
    char *p;
    size_t cap, n;
} sbuf;

__attribute__((format(printf, 2, 3))) static void sb_printf(sbuf *b, const char *fmt, ...)
{
    if (b->n + 1 >= b->cap)
        return;
    va_list ap;
    va_start(ap, fmt);
    int k = vsnprintf(b->p + b->n, b->cap - b->n, fmt, ap);
    va_end(ap);
    if (k > 0)
        b->n = b->n + (size_t)k < b->cap ? b->n + (size_t)k : b->cap - 1;
}

/* A quoted, escaped string, cut at max bytes. */
static void sb_str(sbuf *b, gguf_str s, uint64_t max)
{
    sb_printf(b, "\"");
    for (uint64_t i = 0; i < s.len && i < max; i++) {
        unsigned char c = (unsigned char)s.ptr[i];
        if (c == '"' || c == '\\')
            sb_printf(b, "\\%c", c);
        else if (c == '\n')
            sb_printf(b, "\\n");
        else if (c < 0x20 || c == 0x7f)
            sb_printf(b, "\\x%02x", c);
        else
            sb_printf(b, "%c", c);
    }
    sb_printf(b, s.len > max ? "\"..." : "\"");
}

/* Element i of a fixed-size array as text. */
static void sb_elem(sbuf *b, uint32_t t, const uint8_t *p)
{
    uint64_t u = 0;
    int64_t i = 0;
    char r[40];
    switch (t) {
    case GGUF_TYPE_UINT8: sb_printf(b, "%u", p[0]); return;
    case GGUF_TYPE_INT8: sb_printf(b, "%d", (int8_t)p[0]); return;
    case GGUF_TYPE_BOOL: sb_printf(b, "%s", p[0] ? "true" : "false"); return;
    case GGUF_TYPE_UINT16: { uint16_t v; memcpy(&v, p, 2); sb_printf(b, "%u", v); return; }
    case GGUF_TYPE_INT16: { int16_t v; memcpy(&v, p, 2); sb_printf(b, "%d", v); return; }
    case GGUF_TYPE_UINT32: { uint32_t v; memcpy(&v, p, 4); sb_printf(b, "%" PRIu32, v); return; }
    case GGUF_TYPE_INT32: { int32_t v; memcpy(&v, p, 4); sb_printf(b, "%" PRId32, v); return; }
    case GGUF_TYPE_FLOAT32: { float v; memcpy(&v, p, 4); sb_printf(b, "%s", fmt_real(v, true, r)); return; }
    case GGUF_TYPE_UINT64: memcpy(&u, p, 8); sb_printf(b, "%" PRIu64, u); return;
    case GGUF_TYPE_INT64: memcpy(&i, p, 8); sb_printf(b, "%" PRId64, i); return;
    case GGUF_TYPE_FLOAT64: { double v; memcpy(&v, p, 8); sb_printf(b, "%s", fmt_real(v, false, r)); return; }
    default: sb_printf(b, "?"); return;
    }
}

static uint64_t elem_size(uint32_t t)
{
    switch (t) {
    case GGUF_TYPE_UINT8: case GGUF_TYPE_INT8: case GGUF_TYPE_BOOL: return 1;
    case GGUF_TYPE_UINT16: case GGUF_TYPE_INT16: return 2;
    case GGUF_TYPE_UINT32: case GGUF_TYPE_INT32: case GGUF_TYPE_FLOAT32: return 4;
    case GGUF_TYPE_UINT64: case GGUF_TYPE_INT64: case GGUF_TYPE_FLOAT64: return 8;
    default: return 0;
    }
}

/* One value as text; arrays show their first max_elems elements. */
static void sb_value(sbuf *b, const gguf_kv *kv, uint64_t max_elems)
{
    char r[40];
    switch (kv->type) {
    case GGUF_TYPE_UINT8: case GGUF_TYPE_UINT16: case GGUF_TYPE_UINT32: case GGUF_TYPE_UINT64:
        sb_printf(b, "%" PRIu64, kv->v.u);
        return;
    case GGUF_TYPE_INT8: case GGUF_TYPE_INT16: case GGUF_TYPE_INT32: case GGUF_TYPE_INT64:
        sb_printf(b, "%" PRId64, kv->v.i);
        return;
    case GGUF_TYPE_FLOAT32: sb_printf(b, "%s", fmt_real(kv->v.f, true, r)); return;
    case GGUF_TYPE_FLOAT64: sb_printf(b, "%s", fmt_real(kv->v.f, false, r)); return;
    case GGUF_TYPE_BOOL: sb_printf(b, "%s", kv->v.u ? "true" : "false"); return;
    case GGUF_TYPE_STRING: sb_str(b, kv->str, 80); return;
    case GGUF_TYPE_ARRAY: {
        uint64_t n = kv->arr_n, show = n < max_elems ? n : max_elems;
        uint64_t es = elem_size(kv->arr_type);
        if (kv->arr_type == GGUF_TYPE_ARRAY) {
            sb_printf(b, "[...]");
        } else {
            sb_printf(b, "[");
            for (uint64_t i = 0; i < show; i++) {
                if (i)
                    sb_printf(b, ", ");
                if (kv->arr_type == GGUF_TYPE_STRING)
                    sb_str(b, gguf_arr_str(kv, i), 24);
                else
                    sb_elem(b, kv->arr_type, kv->arr_data + i * es);
            }
            sb_printf(b, "%s]", show < n ? ", ..." : "");
        }
        sb_printf(b, "  (%" PRIu64 " x %s)", n, gguf_type_name(kv->arr_type));
        return;
    }
    default: sb_printf(b, "?"); return;
    }
}

/* ---- JSON ---- */

static cJSON *json_u64(uint64_t v)
{
    if (v <= (UINT64_C(1) << 53))
        return cJSON_CreateNumber((double)v);
    char buf[24];
    snprintf(buf, sizeof buf, "%" PRIu64, v); /* exact: doubles would round */
    return cJSON_CreateRaw(buf);
}

static cJSON *json_i64(int64_t v)
{
    if (v >= -(INT64_C(1) << 53) && v <= (INT64_C(1) << 53))
        return cJSON_CreateNumber((double)v);
    char buf[24];
    snprintf(buf, sizeof buf, "%" PRId64, v);
    return cJSON_CreateRaw(buf);
}

static cJSON *json_double(double d, bool is_f32)
{
    /* JSON has no NaN/Inf: write them as strings */
    if (isnan(d))
        return cJSON_CreateString("nan");
    if (isinf(d))
        return cJSON_CreateString(d > 0 ? "inf" : "-inf");
    char buf[40];
    return cJSON_CreateRaw(fmt_real(d, is_f32, buf));
}

/* cJSON strings are NUL-terminated: copy (a NUL inside the value ends it there). */
static cJSON *json_str(gguf_str s)
{
    char *z = malloc(s.len + 1);
    if (!z)
        return cJSON_CreateNull();
    memcpy(z, s.ptr, s.len);
    z[s.len] = 0;
    cJSON *j = cJSON_CreateString(z);
    free(z);
    return j;
}

static cJSON *json_elem(uint32_t t, const uint8_t *p)
{
    switch (t) {
    case GGUF_TYPE_UINT8: return cJSON_CreateNumber(p[0]);
    case GGUF_TYPE_INT8: return cJSON_CreateNumber((int8_t)p[0]);
    case GGUF_TYPE_BOOL: return cJSON_CreateBool(p[0] != 0);
    case GGUF_TYPE_UINT16: { uint16_t v; memcpy(&v, p, 2); return cJSON_CreateNumber(v); }
    case GGUF_TYPE_INT16: { int16_t v; memcpy(&v, p, 2); return cJSON_CreateNumber(v); }
    case GGUF_TYPE_UINT32: { uint32_t v; memcpy(&v, p, 4); return cJSON_CreateNumber(v); }
    case GGUF_TYPE_INT32: { int32_t v; memcpy(&v, p, 4); return cJSON_CreateNumber(v); }
    case GGUF_TYPE_FLOAT32: { float v; memcpy(&v, p, 4); return json_double(v, true); }
    case GGUF_TYPE_UINT64: { uint64_t v; memcpy(&v, p, 8); return json_u64(v); }
    case GGUF_TYPE_INT64: { int64_t v; memcpy(&v, p, 8); return json_i64(v); }
    case GGUF_TYPE_FLOAT64: { double v; memcpy(&v, p, 8); return json_double(v, false); }
    default: return cJSON_CreateNull();
    }
}

/* A value as JSON. Arrays longer than max_elems (tokenizer vocabularies) become a summary
 * object {"array": elem_type, "n": N} rather than megabytes of output. */
static cJSON *json_value(const gguf_kv *kv, uint64_t max_elems)
{
    switch (kv->type) {
    case GGUF_TYPE_UINT8: case GGUF_TYPE_UINT16: case GGUF_TYPE_UINT32: case GGUF_TYPE_UINT64:
        return json_u64(kv->v.u);
    case GGUF_TYPE_INT8: case GGUF_TYPE_INT16: case GGUF_TYPE_INT32: case GGUF_TYPE_INT64:
        return json_i64(kv->v.i);
    case GGUF_TYPE_FLOAT32: return json_double(kv->v.f, true);
    case GGUF_TYPE_FLOAT64: return json_double(kv->v.f, false);
    case GGUF_TYPE_BOOL: return cJSON_CreateBool(kv->v.u != 0);
    case GGUF_TYPE_STRING: return json_str(kv->str);
    case GGUF_TYPE_ARRAY:
        if (kv->arr_n <= max_elems && kv->arr_type != GGUF_TYPE_ARRAY) {
            cJSON *a = cJSON_CreateArray();
            uint64_t es = elem_size(kv->arr_type);
            for (uint64_t i = 0; i < kv->arr_n; i++)
                cJSON_AddItemToArray(a, kv->arr_type == GGUF_TYPE_STRING
                                            ? json_str(gguf_arr_str(kv, i))
                                            : json_elem(kv->arr_type, kv->arr_data + i * es));
            return a;
        } else {
            cJSON *o = cJSON_CreateObject();
            cJSON_AddStringToObject(o, "array", gguf_type_name(kv->arr_type));
            cJSON_AddItemToObject(o, "n", json_u64(kv->arr_n));
            return o;
        }
    default: return cJSON_CreateNull();
    }
}

static void json_add_kv(cJSON *obj, const gguf_kv *kv, uint64_t max_elems)
{
    char *key = malloc(kv->key.len + 1);
    if (!key)
        return;
    memcpy(key, kv->key.ptr, kv->key.len);
    key[kv->key.len] = 0;
    cJSON_AddItemToObject(obj, key, json_value(kv, max_elems));
    free(key);
}

/* ---- the report ---- */

typedef struct type_total {
    uint64_t tensors, bytes, elements;
} type_total;

typedef struct tok_summary {
    const gguf_kv *model, *pre, *tokens, *merges, *bos, *eos;
} tok_summary;

static bool is_int_kv(const gguf_kv *kv)
{
    return kv && kv->type != GGUF_TYPE_FLOAT32 && kv->type != GGUF_TYPE_FLOAT64 &&
           kv->type != GGUF_TYPE_BOOL && kv->type != GGUF_TYPE_STRING &&
           kv->type != GGUF_TYPE_ARRAY && kv->type < GGUF_TYPE_COUNT;
}

static uint64_t tensor_elements(const gguf_tensor *t)
{
    return t->ne[0] * t->ne[1] * t->ne[2] * t->ne[3]; /* the reader bounds this by INT64_MAX */
}

static const char *human_bytes(uint64_t n, char buf[32])
{
    const char *units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    double v = (double)n;
    int u = 0;
    while (v >= 1024 && u < 4) {
        v /= 1024;
        u++;
    }
    if (u == 0)
        snprintf(buf, 32, "%" PRIu64 " B", n);
    else
        snprintf(buf, 32, "%.2f %s", v, units[u]);
    return buf;
}

/* Keys shown in the general, hyper-parameter or tokenizer sections; the rest is "other". */
static bool shown_elsewhere(const gguf_kv *kv, const char *prefix, const gguf_kv *akv,
                            const gguf_kv *nkv, const tok_summary *ts)
{
    return (prefix[0] && has_prefix(kv->key, prefix)) || kv == akv || kv == nkv ||
           kv == ts->model || kv == ts->pre || kv == ts->tokens || kv == ts->merges ||
           kv == ts->bos || kv == ts->eos;
}

/* The token text of id kv (a u32/i32 value) from the tokens array, for the text report. */
static gguf_str token_text(const tok_summary *ts, const gguf_kv *id)
{
    gguf_str none = {NULL, 0};
    if (!ts->tokens || !is_int_kv(id) || ts->tokens->type != GGUF_TYPE_ARRAY ||
        ts->tokens->arr_type != GGUF_TYPE_STRING || id->v.u >= ts->tokens->arr_n)
        return none;
    return gguf_arr_str(ts->tokens, id->v.u);
}

static int inspect(const char *path, bool json)
{
    muser_error err = {0};
    gguf_file *f = NULL;
    if (gguf_open(&f, path, &err) != 0) {
        fprintf(stderr, "muser inspect: %s\n", err.msg);
        return 1;
    }
    gguf_str arch = {NULL, 0}, name = {NULL, 0};
    const gguf_kv *akv = gguf_find_kv(f, "general.architecture");
    const gguf_kv *nkv = gguf_find_kv(f, "general.name");
    if (akv && akv->type == GGUF_TYPE_STRING)
        arch = akv->str;
    if (nkv && nkv->type == GGUF_TYPE_STRING)
        name = nkv->str;
    /* "<arch>." prefix; an architecture name with a NUL cannot prefix anything */
    char prefix[160] = "";
    if (arch.len && arch.len < sizeof prefix - 1 && !memchr(arch.ptr, 0, arch.len)) {
        memcpy(prefix, arch.ptr, arch.len);
        prefix[arch.len] = '.';
        prefix[arch.len + 1] = 0;
    }
    tok_summary ts = {
        gguf_find_kv(f, "tokenizer.ggml.model"),  gguf_find_kv(f, "tokenizer.ggml.pre"),
        gguf_find_kv(f, "tokenizer.ggml.tokens"), gguf_find_kv(f, "tokenizer.ggml.merges"),
        gguf_find_kv(f, "tokenizer.ggml.bos_token_id"),
        gguf_find_kv(f, "tokenizer.ggml.eos_token_id"),
    };
    type_total by_type[GGML_TYPE_COUNT + 1]; /* last slot: ids quant.h does not know */
    memset(by_type, 0, sizeof by_type);
    type_total all = {0};
    for (uint64_t i = 0; i < f->n_tensors; i++) {
        const gguf_tensor *t = &f->tensors[i];
        type_total *tt = &by_type[t->type < GGML_TYPE_COUNT ? t->type : GGML_TYPE_COUNT];
        uint64_t el = tensor_elements(t);
        tt->tensors++, tt->bytes += t->nbytes, tt->elements += el;
        all.tensors++, all.bytes += t->nbytes, all.elements += el;
    }
    char tb[16], hb[32];

    if (json) {
        cJSON *root = cJSON_CreateObject();
        cJSON_AddStringToObject(root, "file", path);
        cJSON_AddItemToObject(root, "size", json_u64(f->size));
        cJSON_AddNumberToObject(root, "version", f->version);
        cJSON_AddItemToObject(root, "alignment", json_u64(f->alignment));
        cJSON_AddItemToObject(root, "data_offset", json_u64(f->data_offset));
        cJSON_AddItemToObject(root, "architecture", arch.ptr ? json_str(arch) : cJSON_CreateNull());
        cJSON_AddItemToObject(root, "name", name.ptr ? json_str(name) : cJSON_CreateNull());
        cJSON_AddItemToObject(root, "n_kv", json_u64(f->n_kv));
        cJSON *hp = cJSON_AddObjectToObject(root, "hyperparameters");
        cJSON *other = cJSON_CreateObject();
        for (uint64_t i = 0; i < f->n_kv; i++) {
            const gguf_kv *kv = &f->kv[i];
            if (prefix[0] && has_prefix(kv->key, prefix))
                json_add_kv(hp, kv, 4096);
            else if (!shown_elsewhere(kv, prefix, akv, nkv, &ts))
                json_add_kv(other, kv, 64);
        }
        cJSON *tok = cJSON_AddObjectToObject(root, "tokenizer");
        cJSON_AddItemToObject(tok, "model", ts.model ? json_value(ts.model, 0) : cJSON_CreateNull());
        cJSON_AddItemToObject(tok, "pre", ts.pre ? json_value(ts.pre, 0) : cJSON_CreateNull());
        cJSON_AddItemToObject(tok, "n_tokens", ts.tokens && ts.tokens->type == GGUF_TYPE_ARRAY
                                                   ? json_u64(ts.tokens->arr_n) : cJSON_CreateNull());
        cJSON_AddItemToObject(tok, "n_merges", ts.merges && ts.merges->type == GGUF_TYPE_ARRAY
                                                   ? json_u64(ts.merges->arr_n) : cJSON_CreateNull());
        cJSON_AddItemToObject(tok, "bos_token_id", ts.bos ? json_value(ts.bos, 0) : cJSON_CreateNull());
        cJSON_AddItemToObject(tok, "eos_token_id", ts.eos ? json_value(ts.eos, 0) : cJSON_CreateNull());
        cJSON_AddItemToObject(root, "metadata", other);
        cJSON *tens = cJSON_AddArrayToObject(root, "tensors");
        for (uint64_t i = 0; i < f->n_tensors; i++) {
            const gguf_tensor *t = &f->tensors[i];
            cJSON *o = cJSON_CreateObject();
            cJSON_AddStringToObject(o, "name", t->name_z);
            cJSON_AddStringToObject(o, "type", type_name(t->type, tb));
            cJSON *dims = cJSON_AddArrayToObject(o, "dims");
            for (uint32_t d = 0; d < t->n_dims; d++)
                cJSON_AddItemToArray(dims, json_u64(t->ne[d]));
            cJSON_AddItemToObject(o, "bytes", json_u64(t->nbytes));
            cJSON_AddItemToObject(o, "offset", json_u64(t->offset));
            cJSON_AddItemToArray(tens, o);
        }
        cJSON *tot = cJSON_AddObjectToObject(root, "totals_by_type");
        for (uint32_t ty = 0; ty <= GGML_TYPE_COUNT; ty++) {
            if (!by_type[ty].tensors)
                continue;
            cJSON *o = cJSON_AddObjectToObject(tot, ty < GGML_TYPE_COUNT ? type_name(ty, tb) : "other");
            cJSON_AddItemToObject(o, "tensors", json_u64(by_type[ty].tensors));
            cJSON_AddItemToObject(o, "bytes", json_u64(by_type[ty].bytes));
            cJSON_AddItemToObject(o, "elements", json_u64(by_type[ty].elements));
        }
        cJSON *g = cJSON_AddObjectToObject(root, "total");
        cJSON_AddItemToObject(g, "tensors", json_u64(all.tensors));
        cJSON_AddItemToObject(g, "bytes", json_u64(all.bytes));
        cJSON_AddItemToObject(g, "elements", json_u64(all.elements));
        char *s = cJSON_Print(root);
        if (s)
            printf("%s\n", s);
        free(s);
        cJSON_Delete(root);
        gguf_close(f);
        return s ? 0 : 1;
    }

    char line[1024];
    sbuf b = {line, sizeof line, 0};
    printf("file:          %s (%s)\n", path, human_bytes(f->size, hb));
    printf("GGUF version:  %" PRIu32 "\n", f->version);
    printf("alignment:     %" PRIu64 "\n", f->alignment);
    printf("data offset:   %" PRIu64 "\n", f->data_offset);
    b.n = 0;
    if (arch.ptr)
        sb_str(&b, arch, 80);
    printf("architecture:  %s\n", arch.ptr ? line : "(none)");
    b.n = 0;
    if (name.ptr)
        sb_str(&b, name, 120);
    printf("name:          %s\n", name.ptr ? line : "(none)");
    printf("metadata:      %" PRIu64 " keys\n", f->n_kv);

    printf("\nhyper-parameters (%s*):\n", prefix[0] ? prefix : "<arch>.");
    int n_hp = 0;
    for (uint64_t i = 0; i < f->n_kv; i++) {
        const gguf_kv *kv = &f->kv[i];
        if (!prefix[0] || !has_prefix(kv->key, prefix))
            continue;
        b.n = 0;
        sb_value(&b, kv, 16);
        printf("  %-48.*s %s\n", (int)(kv->key.len < 200 ? kv->key.len : 200), kv->key.ptr, line);
        n_hp++;
    }
    if (!n_hp)
        printf("  (none)\n");

    printf("\ntokenizer:\n");
    if (!ts.model && !ts.tokens) {
        printf("  (none)\n");
    } else {
        const gguf_kv *rows[2] = {ts.model, ts.pre};
        const char *labels[2] = {"model", "pre"};
        for (int r = 0; r < 2; r++) {
            b.n = 0;
            if (rows[r])
                sb_value(&b, rows[r], 4);
            printf("  %-8s %s\n", labels[r], rows[r] ? line : "(none)");
        }
        if (ts.tokens && ts.tokens->type == GGUF_TYPE_ARRAY)
            printf("  %-8s %" PRIu64 "\n", "tokens", ts.tokens->arr_n);
        else
            printf("  %-8s (none)\n", "tokens");
        if (ts.merges && ts.merges->type == GGUF_TYPE_ARRAY)
            printf("  %-8s %" PRIu64 "\n", "merges", ts.merges->arr_n);
        else
            printf("  %-8s (none)\n", "merges");
        const gguf_kv *ids[2] = {ts.bos, ts.eos};
        const char *idl[2] = {"bos", "eos"};
        for (int r = 0; r < 2; r++) {
            b.n = 0;
            if (ids[r]) {
                sb_value(&b, ids[r], 4);
                gguf_str tt = token_text(&ts, ids[r]);
                if (tt.ptr) {
                    sb_printf(&b, "  ");
                    sb_str(&b, tt, 40);
                }
            }
            printf("  %-8s %s\n", idl[r], ids[r] ? line : "(none)");
        }
    }

    printf("\nother metadata:\n");
    int n_other = 0;
    for (uint64_t i = 0; i < f->n_kv; i++) {
        const gguf_kv *kv = &f->kv[i];
        if (shown_elsewhere(kv, prefix, akv, nkv, &ts))
            continue;
        b.n = 0;
        sb_value(&b, kv, 8);
        printf("  %-48.*s %s\n", (int)(kv->key.len < 200 ? kv->key.len : 200), kv->key.ptr, line);
        n_other++;
    }
    if (!n_other)
        printf("  (none)\n");

    printf("\ntensors (%" PRIu64 "):\n", f->n_tensors);
    printf("  %-40s %-8s %-28s %14s\n", "name", "type", "dims", "bytes");
    for (uint64_t i = 0; i < f->n_tensors; i++) {
        const gguf_tensor *t = &f->tensors[i];
        char dims[96];
        sbuf d = {dims, sizeof dims, 0};
        sb_printf(&d, "[");
        for (uint32_t k = 0; k < t->n_dims; k++)
            sb_printf(&d, "%s%" PRIu64, k ? ", " : "", t->ne[k]);
        sb_printf(&d, "]");
        printf("  %-40s %-8s %-28s %14" PRIu64 "\n", t->name_z, type_name(t->type, tb), dims,
               t->nbytes);
    }

    printf("\ntotals by type:\n");
    for (uint32_t ty = 0; ty <= GGML_TYPE_COUNT; ty++) {
        const type_total *tt = &by_type[ty];
        if (!tt->tensors)
            continue;
        printf("  %-8s %6" PRIu64 " tensors %16" PRIu64 " bytes (%s) %16" PRIu64 " elements\n",
               ty < GGML_TYPE_COUNT ? type_name(ty, tb) : "other", tt->tensors, tt->bytes,
               human_bytes(tt->bytes, hb), tt->elements);
    }
    printf("total:   %" PRIu64 " tensors, %" PRIu64 " bytes (%s), %" PRIu64 " elements\n",
           all.tensors, all.bytes, human_bytes(all.bytes, hb), all.elements);
    gguf_close(f);
    return 0;
}

int cmd_inspect(int argc, char **argv)
{
    const char *path = NULL;
    bool json = false;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            fputs(usage_text, stdout);
            return 0;
        } else if (!strcmp(a, "--json")) {
            json = true;
        } else if (!strcmp(a, "-m") || !strcmp(a, "--model")) {
            if (i + 1 >= argc)
                return cli_usage_error("inspect", "%s needs a file", a);
            if (path)
                return cli_usage_error("inspect", "more than one file given");
            path = argv[++i];
        } else if (a[0] == '-' && a[1]) {
            return cli_usage_error("inspect", "unknown option '%s'", a);
        } else {
            if (path)
                return cli_usage_error("inspect", "more than one file given ('%s')", a);
            path = a;
        }
    }
    if (!path)
        path = cli_default_model();
    return inspect(path, json);
}
