/* make_seeds.c — writes the GGUF fuzz seeds (fuzz/corpus/gguf/) with the real writer, plus a
 * few hand-broken variants, so the fuzzer starts from every region of the format: a tiny
 * model-shaped file (muse.* hyper-parameters, tokenizer arrays, tensors of seven ggml types), a
 * 64-byte-aligned file, a metadata-only file, nested arrays, and broken copies.
 * Usage: make_seeds DIR   (scripts/fuzz.sh --seeds runs it). The tiny model is also what
 * tests/cli_inspect.sh inspects. */
#include "gguf.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *dir;

static int die(const char *what, muser_error *err)
{
    fprintf(stderr, "make_seeds: %s: %s\n", what, err ? err->msg : "failed");
    exit(1);
}

static void path_of(char *out, size_t n, const char *name)
{
    snprintf(out, n, "%s/%s", dir, name);
}

/* Stream bytes i*7+t for every declared tensor. */
static void fill_tensors(gguf_writer *w, const uint64_t *sizes, int n, muser_error *err)
{
    for (int t = 0; t < n; t++) {
        uint8_t buf[1024];
        for (uint64_t i = 0; i < sizes[t]; i++)
            buf[i] = (uint8_t)(i * 7 + (uint64_t)t);
        if (gguf_writer_tensor_data(w, buf, sizes[t], err))
            die("tensor data", err);
    }
}

static void write_tiny_muse(const char *name)
{
    muser_error err;
    char path[512];
    path_of(path, sizeof path, name);
    gguf_writer *w = gguf_writer_new(0);
    gguf_writer_set_str(w, "general.architecture", "muse");
    gguf_writer_set_str(w, "general.name", "Muse Glimmer tiny seed");
    gguf_writer_set_u32(w, "muse.block_count", 1);
    gguf_writer_set_u32(w, "muse.context_length", 256);
    gguf_writer_set_u32(w, "muse.embedding_length", 8);
    gguf_writer_set_u32(w, "muse.feed_forward_length", 16);
    gguf_writer_set_u32(w, "muse.attention.head_count", 2);
    gguf_writer_set_u32(w, "muse.attention.head_count_kv", 1);
    gguf_writer_set_f32(w, "muse.attention.layer_norm_rms_epsilon", 1e-5f);
    gguf_writer_set_f32(w, "muse.rope.freq_base", 500000.0f);
    gguf_writer_set_bool(w, "muse.use_parallel_residual", false);
    int32_t pattern[4] = {1, 1, 1, 0};
    gguf_writer_set_arr(w, "muse.attention.sliding_window_pattern_mask", GGUF_TYPE_INT32,
                        pattern, 4);
    gguf_writer_set_str(w, "tokenizer.ggml.model", "gpt2");
    gguf_writer_set_str(w, "tokenizer.ggml.pre", "default");
    const char *tokens[8] = {"<s>", "</s>", "a", "b", "ab", "\xc4\xa0", "\xc4\xa0\x61", "c"};
    gguf_writer_set_arr_str(w, "tokenizer.ggml.tokens", tokens, NULL, 8);
    int32_t types[8] = {3, 3, 1, 1, 1, 1, 1, 1};
    gguf_writer_set_arr(w, "tokenizer.ggml.token_type", GGUF_TYPE_INT32, types, 8);
    const char *merges[2] = {"a b", "\xc4\xa0 a"};
    gguf_writer_set_arr_str(w, "tokenizer.ggml.merges", merges, NULL, 2);
    gguf_writer_set_u32(w, "tokenizer.ggml.bos_token_id", 0);
    gguf_writer_set_u32(w, "tokenizer.ggml.eos_token_id", 1);
    gguf_writer_set_u64(w, "general.file_type", 15);

    struct { const char *name; uint32_t type, nd; uint64_t ne[4]; uint64_t bytes; } t[] = {
        {"token_embd.weight", 0, 2, {8, 8}, 256},        /* F32 */
        {"blk.0.attn_norm.weight", 0, 1, {8}, 32},
        {"blk.0.attn_q.weight", 8, 2, {32, 2}, 68},      /* Q8_0 */
        {"blk.0.attn_k.weight", 1, 2, {8, 4}, 64},       /* F16 */
        {"blk.0.attn_v.weight", 30, 2, {8, 4}, 64},      /* BF16 */
        {"blk.0.ffn_up.weight", 12, 2, {256, 2}, 288},   /* Q4_K */
        {"blk.0.ffn_down.weight", 14, 1, {256}, 210},    /* Q6_K */
        {"output_norm.weight", 0, 1, {8}, 32},
        {"output.weight", 2, 2, {32, 1}, 18},            /* Q4_0 */
    };
    int n = (int)(sizeof t / sizeof t[0]);
    uint64_t sizes[16];
    for (int i = 0; i < n; i++) {
        if (gguf_writer_add_tensor(w, t[i].name, t[i].type, t[i].nd, t[i].ne, &err))
            die(t[i].name, &err);
        sizes[i] = t[i].bytes;
    }
    if (gguf_writer_begin(w, path, &err))
        die("begin", &err);
    fill_tensors(w, sizes, n, &err);
    if (gguf_writer_finish(w, &err))
        die("finish", &err);
    gguf_writer_free(w);
}

static void write_align64(void)
{
    muser_error err;
    char path[512];
    path_of(path, sizeof path, "align64.gguf");
    gguf_writer *w = gguf_writer_new(64);
    gguf_writer_set_str(w, "general.architecture", "llama");
    gguf_writer_set_u32(w, "llama.block_count", 2);
    double f64 = 0.25;
    gguf_writer_set_arr(w, "x.f64", GGUF_TYPE_FLOAT64, &f64, 1);
    uint64_t ne_a[2] = {4, 3}, ne_b[1] = {5};
    if (gguf_writer_add_tensor(w, "a", 0, 2, ne_a, &err) ||
        gguf_writer_add_tensor(w, "b", 1, 1, ne_b, &err))
        die("add", &err);
    if (gguf_writer_begin(w, path, &err))
        die("begin", &err);
    fill_tensors(w, (uint64_t[]){48, 10}, 2, &err);
    if (gguf_writer_finish(w, &err))
        die("finish", &err);
    gguf_writer_free(w);
}

static void write_meta_only(void)
{
    muser_error err;
    char path[512];
    path_of(path, sizeof path, "meta_only.gguf");
    gguf_writer *w = gguf_writer_new(0);
    gguf_writer_set_str(w, "general.architecture", "qwen3");
    gguf_writer_set_i32(w, "x.i32", -7);
    gguf_writer_set_bool(w, "x.bool", true);
    uint16_t u16[3] = {1, 2, 3};
    gguf_writer_set_arr(w, "x.u16", GGUF_TYPE_UINT16, u16, 3);
    if (gguf_writer_begin(w, path, &err) || gguf_writer_finish(w, &err))
        die("meta_only", &err);
    gguf_writer_free(w);
}

static void write_bytes(const char *name, const void *p, size_t n)
{
    char path[512];
    path_of(path, sizeof path, name);
    FILE *fp = fopen(path, "wb");
    if (!fp || fwrite(p, 1, n, fp) != n || fclose(fp))
        die(name, NULL);
}

static uint8_t *read_all(const char *name, size_t *n)
{
    char path[512];
    path_of(path, sizeof path, name);
    FILE *fp = fopen(path, "rb");
    if (!fp)
        die(name, NULL);
    fseek(fp, 0, SEEK_END);
    *n = (size_t)ftell(fp);
    fseek(fp, 0, SEEK_SET);
    uint8_t *p = malloc(*n);
    if (!p || fread(p, 1, *n, fp) != *n)
        die(name, NULL);
    fclose(fp);
    return p;
}

/* A metadata-only file with nested arrays: [[1,2],[3]] of u32 and [["x"],[]] of strings. */
static void write_nested(void)
{
    static const uint8_t b[] = {
        'G', 'G', 'U', 'F', 3, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2, 0, 0, 0, 0, 0, 0, 0,
        /* "n.u32" ARRAY of 2 ARRAY */
        5, 0, 0, 0, 0, 0, 0, 0, 'n', '.', 'u', '3', '2', 9, 0, 0, 0, 9, 0, 0, 0,
        2, 0, 0, 0, 0, 0, 0, 0,
        4, 0, 0, 0, 2, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 2, 0, 0, 0,
        4, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 3, 0, 0, 0,
        /* "n.str" ARRAY of 2 ARRAY */
        5, 0, 0, 0, 0, 0, 0, 0, 'n', '.', 's', 't', 'r', 9, 0, 0, 0, 9, 0, 0, 0,
        2, 0, 0, 0, 0, 0, 0, 0,
        8, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 'x',
        8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
    };
    write_bytes("nested.gguf", b, sizeof b);
}

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: make_seeds DIR\n");
        return 2;
    }
    dir = argv[1];
    write_tiny_muse("tiny_muse.gguf");
    write_align64();
    write_meta_only();
    write_nested();

    size_t n;
    uint8_t *p = read_all("tiny_muse.gguf", &n);
    p[4] = 2; /* the same file as GGUF v2 (identical layout) */
    write_bytes("tiny_muse_v2.gguf", p, n);
    p[4] = 1;
    write_bytes("broken_v1.gguf", p, n);
    p[4] = 3;
    write_bytes("broken_truncated.gguf", p, n / 2);
    p[0] = 'g';
    write_bytes("broken_magic.gguf", p, 64);
    free(p);
    return 0;
}
